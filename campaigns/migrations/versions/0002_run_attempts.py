"""Runs are attempts: a run key may have several runs (a forced re-run adds one, never deletes a passed
run), and each run keeps the SHA-256 of its records so that ingesting the same records twice is detected.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 15:00:00

"""
import contextlib
from typing import Iterator, Sequence, Union

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


@contextlib.contextmanager
def _ids_never_reused(table: str) -> Iterator[None]:
    """SQLite rebuilds the table (batch mode): AUTOINCREMENT is kept (table_kwargs), and so is the highest id ever
    given, which the rebuilt table would otherwise restart from its largest id left (a deleted run's id given
    again)."""
    bind = op.get_bind()
    if bind.dialect.name != 'sqlite':
        yield
        return
    given = bind.exec_driver_sql("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).scalar()
    yield
    if given is not None:
        bind.exec_driver_sql("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (given, table))
        bind.exec_driver_sql("INSERT INTO sqlite_sequence (name, seq) SELECT ?, ? WHERE NOT EXISTS "
                             "(SELECT 1 FROM sqlite_sequence WHERE name = ?)", (table, given, table))


def upgrade() -> None:
    """Upgrade schema."""
    with _ids_never_reused('runs'), \
            op.batch_alter_table('runs', schema=None, table_kwargs={'sqlite_autoincrement': True}) as batch_op:
        batch_op.add_column(sa.Column('records_digest', sa.String(length=64), nullable=True))
        batch_op.drop_constraint(batch_op.f('uq_runs_run_key'), type_='unique')
        batch_op.create_index(batch_op.f('ix_runs_run_key'), ['run_key'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_records_digest'), ['records_digest'], unique=False)


def downgrade() -> None:
    """Downgrade schema (fails where a run key has several runs)."""
    with _ids_never_reused('runs'), \
            op.batch_alter_table('runs', schema=None, table_kwargs={'sqlite_autoincrement': True}) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_records_digest'))
        batch_op.drop_index(batch_op.f('ix_runs_run_key'))
        batch_op.create_unique_constraint(batch_op.f('uq_runs_run_key'), ['run_key'])
        batch_op.drop_column('records_digest')
