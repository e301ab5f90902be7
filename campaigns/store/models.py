"""Tables of the results store. Change them only together with a new alembic revision
(campaigns/migrations/versions); tests/test_store.py checks that the two agree."""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, CheckConstraint, DateTime, Float, ForeignKey, Index,
                        Integer, LargeBinary, MetaData, String, Text, TypeDecorator)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RUN_STATUSES = ("pass", "fail", "error")


class UTCDateTime(TypeDecorator[datetime]):
    """Stored as naive UTC (portable: SQLite has no time zones), read back as aware UTC.
    A naive value on the way in is local time, as in datetime.astimezone()."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


# Python None is SQL NULL, not the JSON text 'null', so "IS NULL" filters work on every backend.
NullableJSON = JSON(none_as_null=True)


class Base(DeclarativeBase):
    # Deterministic constraint names, so later migrations can drop or alter them on every backend.
    metadata = MetaData(naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    })


class Run(Base):
    """One ReFrame test case execution, or one commbench run ingested by hand."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(f"status IN {RUN_STATUSES!r}", name="status"),
        Index("ix_runs_site_system_partition", "site", "system", "partition"),
        {"sqlite_autoincrement": True},  # ids are never reused after a delete, as on PostgreSQL
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_key: Mapped[str] = mapped_column(String(512), index=True)  # not unique: each attempt is a run
    campaign: Mapped[str] = mapped_column(String(200), index=True)
    site: Mapped[str] = mapped_column(String(200))
    system: Mapped[str] = mapped_column(String(200))
    partition: Mapped[str] = mapped_column(String(200))
    environ: Mapped[str] = mapped_column(String(200))
    check_name: Mapped[str] = mapped_column(String(200))
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON)
    num_nodes: Mapped[int] = mapped_column(Integer)
    num_tasks: Mapped[int] = mapped_column(Integer)
    username: Mapped[str | None] = mapped_column(String(200))
    submit_host: Mapped[str | None] = mapped_column(String(255))
    commcamp_commit: Mapped[str | None] = mapped_column(String(64))
    job_id: Mapped[str | None] = mapped_column(String(100))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(8))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    records_digest: Mapped[str | None] = mapped_column(String(64), index=True)  # SHA-256 of the records


class Measurement(Base):
    """One commbench record: the summary that queries hit. Names follow the record schema."""

    __tablename__ = "measurements"
    __table_args__ = (Index("ix_measurements_op_transport_bytes", "op", "transport", "bytes"),
                      {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)  # position of the record in its run's output
    schema_version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    op: Mapped[str] = mapped_column(String(64))
    transport: Mapped[str] = mapped_column(String(64), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    count: Mapped[int | None] = mapped_column(BigInteger)
    dtype: Mapped[str | None] = mapped_column(String(32))
    iters: Mapped[int | None] = mapped_column(Integer)
    warmup: Mapped[int | None] = mapped_column(Integer)
    min_us: Mapped[float | None] = mapped_column(Float)
    median_us: Mapped[float | None] = mapped_column(Float)
    mean_us: Mapped[float | None] = mapped_column(Float)
    p95_us: Mapped[float | None] = mapped_column(Float)
    max_us: Mapped[float | None] = mapped_column(Float)
    stdev_us: Mapped[float | None] = mapped_column(Float)
    latency_us: Mapped[float | None] = mapped_column(Float)
    goodput_gbs: Mapped[float | None] = mapped_column(Float)
    algbw_gbs: Mapped[float | None] = mapped_column(Float)
    busbw_gbs: Mapped[float | None] = mapped_column(Float)
    busbw_factor: Mapped[float | None] = mapped_column(Float)
    valid: Mapped[bool] = mapped_column(Boolean)
    check: Mapped[bool | None] = mapped_column(Boolean)
    wrong_elements: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(String(16))
    ranks: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[int] = mapped_column(Integer)
    hostnames: Mapped[list[str]] = mapped_column(JSON)
    mpi_library: Mapped[str] = mapped_column(Text)
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    versions: Mapped[dict[str, str] | None] = mapped_column(NullableJSON)
    devices: Mapped[list[dict[str, Any]] | None] = mapped_column(NullableJSON)
    pair_src: Mapped[int | None] = mapped_column(Integer)
    pair_dst: Mapped[int | None] = mapped_column(Integer)
    direction: Mapped[str | None] = mapped_column(String(8))
    host_memory: Mapped[str | None] = mapped_column(String(16))
    commbench_version: Mapped[str] = mapped_column(String(64))
    timestamp: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    extra: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)  # record fields without a column


class Sample(Base):
    """All per-iteration samples of one measurement: little-endian float64 microseconds, packed."""

    __tablename__ = "samples"

    measurement_id: Mapped[int] = mapped_column(ForeignKey("measurements.id", ondelete="CASCADE"),
                                                primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
