"""Runs are attempts: a run key may have several runs (a forced re-run adds one, never deletes a passed
run), and each run keeps the SHA-256 of its records so that ingesting the same records twice is detected.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 15:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    # SQLite rebuilds the table: keep AUTOINCREMENT (ids never reused after a delete).
    with op.batch_alter_table('runs', schema=None, table_kwargs={'sqlite_autoincrement': True}) as batch_op:
        batch_op.add_column(sa.Column('records_digest', sa.String(length=64), nullable=True))
        batch_op.drop_constraint(batch_op.f('uq_runs_run_key'), type_='unique')
        batch_op.create_index(batch_op.f('ix_runs_run_key'), ['run_key'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_records_digest'), ['records_digest'], unique=False)


def downgrade() -> None:
    """Downgrade schema (fails where a run key has several runs)."""
    with op.batch_alter_table('runs', schema=None, table_kwargs={'sqlite_autoincrement': True}) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_records_digest'))
        batch_op.drop_index(batch_op.f('ix_runs_run_key'))
        batch_op.create_unique_constraint(batch_op.f('uq_runs_run_key'), ['run_key'])
        batch_op.drop_column('records_digest')
