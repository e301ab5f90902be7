"""The commcamp results store (SQLAlchemy; SQLite by default, any SQLAlchemy URL; alembic-versioned)."""
from campaigns.store.errors import StoreError, StoreUnavailable
from campaigns.store.store import (URL_ENV, MeasurementFilter, RunFilter, RunInfo, RunRow, Store, default_url,
                                   display_url, make_workspace, on_network_filesystem, open_store, records_digest,
                                   workspace_url)

__all__ = ["URL_ENV", "MeasurementFilter", "RunFilter", "RunInfo", "RunRow", "Store", "StoreError",
           "StoreUnavailable", "default_url", "display_url", "make_workspace", "on_network_filesystem", "open_store",
           "records_digest", "workspace_url"]
