"""The one exception the results store raises for database trouble."""


class StoreError(Exception):
    """The results database is unreachable, has a newer schema, refuses a write or holds bad data."""
