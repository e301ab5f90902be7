"""The commcamp results store (SQLAlchemy; SQLite by default, any SQLAlchemy URL; alembic-versioned)."""
from campaigns.store.errors import StoreError, StoreUnavailable
from campaigns.store.store import (DEFAULT_URL, URL_ENV, MeasurementFilter, RunFilter, RunInfo, RunRow, Store,
                                   default_url, open_store, records_digest)

__all__ = ["DEFAULT_URL", "URL_ENV", "MeasurementFilter", "RunFilter", "RunInfo", "RunRow", "Store", "StoreError",
           "StoreUnavailable", "default_url", "open_store", "records_digest"]
