"""Schema versioning of the results store with alembic (revisions in campaigns/migrations/versions)."""
from __future__ import annotations

import functools

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from campaigns.paths import MIGRATIONS_DIR
from campaigns.store.errors import StoreError

_PG_MIGRATION_LOCK = 0x636F6D6D63616D70  # advisory lock key ("commcamp"), held until the transaction ends
# Optuna keeps its own alembic revision in `alembic_version` of the same database: ours must not share it.
VERSION_TABLE = "store_alembic_version"


def alembic_config(connection: Connection | None = None) -> Config:
    """A programmatic alembic configuration (no alembic.ini) whose env.py runs on `connection`."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@functools.cache
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    head = _script().get_current_head()
    if head is None:
        raise RuntimeError(f"no alembic revisions in {MIGRATIONS_DIR}")
    return head


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def upgrade_to_head(connection: Connection, display_url: str) -> None:
    """Upgrade inside the caller's transaction; refuse a revision this checkout does not know.
    Concurrent openers are serialised (SQLite: the caller's BEGIN IMMEDIATE; PostgreSQL: an advisory lock),
    so only the first one migrates and the others see the new revision. SQLite: the caller turns foreign keys
    off before its BEGIN (batch mode's table rebuild would otherwise cascade-delete the rebuilt table's children);
    PRAGMA foreign_key_check must then find nothing, else the upgrade fails and is rolled back."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
    current = current_revision(connection)
    if current is not None and current not in {rev.revision for rev in _script().walk_revisions()}:
        raise StoreError(f"results database {display_url} has schema revision {current!r}, newer than this "
                         f"commcamp knows (head {head_revision()!r}); update commcamp to use it")
    if current == head_revision():
        return
    sqlite = connection.dialect.name == "sqlite"
    if sqlite and connection.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # batch mode's DROP TABLE would delete the dropped table's children through ON DELETE CASCADE
        raise StoreError(f"results database {display_url}: SQLite migrations must run with foreign keys off "
                         "(campaigns.store.open_store does so)")
    command.upgrade(alembic_config(connection), "head")
    if sqlite:  # what a rebuilt table no longer matches; raising rolls the whole upgrade back
        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            shown = ", ".join(f"{row[0]} row {row[1]} -> {row[2]}" for row in broken[:5])
            raise StoreError(f"results database {display_url}: upgrading the schema from {current!r} to "
                             f"{head_revision()!r} would leave {len(broken)} row(s) pointing at rows that do not "
                             f"exist ({shown}); nothing was changed")
