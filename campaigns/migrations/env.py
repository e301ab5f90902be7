"""Alembic environment of the results store. It runs only on a connection handed over by
campaigns.store.migrate (open_store upgrades on open), inside that connection's transaction."""
from alembic import context

from campaigns.store.migrate import VERSION_TABLE
from campaigns.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run the store migrations through campaigns.store.migrate.alembic_config(connection)")
# Batch mode lets later revisions ALTER tables on SQLite too (it rebuilds the table).
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                  version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
