"""The exceptions the results store raises for database trouble."""


class StoreError(Exception):
    """The results database is unreachable, has a newer schema, refuses a write or holds bad data."""


class StoreUnavailable(StoreError):
    """The results database cannot be opened: unreachable, not a database, or a newer schema."""
