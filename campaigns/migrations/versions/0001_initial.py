"""Initial schema: runs, measurements, samples (one packed float64 array per measurement).

DateTime columns hold naive UTC (campaigns.store.models.UTCDateTime).

Revision ID: 0001
Revises:
Create Date: 2026-11-21 14:53:41.878606

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = '0001'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_key', sa.String(length=512), nullable=False),
    sa.Column('campaign', sa.String(length=200), nullable=False),
    sa.Column('site', sa.String(length=200), nullable=False),
    sa.Column('system', sa.String(length=200), nullable=False),
    sa.Column('partition', sa.String(length=200), nullable=False),
    sa.Column('environ', sa.String(length=200), nullable=False),
    sa.Column('check_name', sa.String(length=200), nullable=False),
    sa.Column('parameters', sa.JSON(), nullable=False),
    sa.Column('num_nodes', sa.Integer(), nullable=False),
    sa.Column('num_tasks', sa.Integer(), nullable=False),
    sa.Column('username', sa.String(length=200), nullable=True),
    sa.Column('submit_host', sa.String(length=255), nullable=True),
    sa.Column('commcamp_commit', sa.String(length=64), nullable=True),
    sa.Column('job_id', sa.String(length=100), nullable=True),
    sa.Column('started_at', sa.DateTime(), nullable=True),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('status', sa.String(length=8), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.CheckConstraint("status IN ('pass', 'fail', 'error')", name=op.f('ck_runs_status')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('run_key', name=op.f('uq_runs_run_key')),
    sqlite_autoincrement=True
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_campaign'), ['campaign'], unique=False)
        batch_op.create_index('ix_runs_site_system_partition', ['site', 'system', 'partition'], unique=False)

    op.create_table('measurements',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('schema_version', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('op', sa.String(length=64), nullable=False),
    sa.Column('transport', sa.String(length=64), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=True),
    sa.Column('count', sa.BigInteger(), nullable=True),
    sa.Column('dtype', sa.String(length=32), nullable=True),
    sa.Column('iters', sa.Integer(), nullable=True),
    sa.Column('warmup', sa.Integer(), nullable=True),
    sa.Column('min_us', sa.Float(), nullable=True),
    sa.Column('median_us', sa.Float(), nullable=True),
    sa.Column('mean_us', sa.Float(), nullable=True),
    sa.Column('p95_us', sa.Float(), nullable=True),
    sa.Column('max_us', sa.Float(), nullable=True),
    sa.Column('stdev_us', sa.Float(), nullable=True),
    sa.Column('latency_us', sa.Float(), nullable=True),
    sa.Column('goodput_gbs', sa.Float(), nullable=True),
    sa.Column('algbw_gbs', sa.Float(), nullable=True),
    sa.Column('busbw_gbs', sa.Float(), nullable=True),
    sa.Column('busbw_factor', sa.Float(), nullable=True),
    sa.Column('valid', sa.Boolean(), nullable=False),
    sa.Column('check', sa.Boolean(), nullable=True),
    sa.Column('wrong_elements', sa.BigInteger(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('reason', sa.String(length=16), nullable=True),
    sa.Column('ranks', sa.Integer(), nullable=False),
    sa.Column('nodes', sa.Integer(), nullable=False),
    sa.Column('hostnames', sa.JSON(), nullable=False),
    sa.Column('mpi_library', sa.Text(), nullable=False),
    sa.Column('env', sa.JSON(), nullable=False),
    sa.Column('versions', sa.JSON(none_as_null=True), nullable=True),
    sa.Column('devices', sa.JSON(none_as_null=True), nullable=True),
    sa.Column('pair_src', sa.Integer(), nullable=True),
    sa.Column('pair_dst', sa.Integer(), nullable=True),
    sa.Column('direction', sa.String(length=8), nullable=True),
    sa.Column('host_memory', sa.String(length=16), nullable=True),
    sa.Column('commbench_version', sa.String(length=64), nullable=False),
    sa.Column('timestamp', sa.DateTime(), nullable=False),
    sa.Column('extra', sa.JSON(none_as_null=True), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_measurements_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_measurements')),
    sqlite_autoincrement=True
    )
    with op.batch_alter_table('measurements', schema=None) as batch_op:
        batch_op.create_index('ix_measurements_op_transport_bytes', ['op', 'transport', 'bytes'], unique=False)
        batch_op.create_index(batch_op.f('ix_measurements_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_measurements_timestamp'), ['timestamp'], unique=False)
        batch_op.create_index(batch_op.f('ix_measurements_transport'), ['transport'], unique=False)

    op.create_table('samples',
    sa.Column('measurement_id', sa.Integer(), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['measurement_id'], ['measurements.id'], name=op.f('fk_samples_measurement_id_measurements'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('measurement_id', name=op.f('pk_samples'))
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('samples')
    with op.batch_alter_table('measurements', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_measurements_transport'))
        batch_op.drop_index(batch_op.f('ix_measurements_timestamp'))
        batch_op.drop_index(batch_op.f('ix_measurements_run_id'))
        batch_op.drop_index('ix_measurements_op_transport_bytes')

    op.drop_table('measurements')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_site_system_partition')
        batch_op.drop_index(batch_op.f('ix_runs_campaign'))

    op.drop_table('runs')
