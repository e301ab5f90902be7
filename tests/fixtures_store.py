"""Fixtures of the results store tests: schema-valid commbench records built in Python, a fresh SQLite store."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from campaigns.model.records import busbw_factor, sample_stats
from campaigns.store import RunInfo, Store, open_store
from fixtures_pg import drop_database, new_database


def commbench_record(*, op: str = "allreduce", transport: str = "mpi", size: int = 1024, iters: int = 8,
                     seed: int = 0, timestamp: str = "2026-03-01T12:00:00Z", samples_us: list[float] | None = None,
                     goodput_gbs: float | None = None, **fields: Any) -> dict[str, Any]:
    """A 'result' record as commbench writes it: `samples_us` or samples drawn from `seed` (scaled to the median
    that gives `goodput_gbs` where that is given), and every number commbench derives from them (stats, latency,
    goodput, busbw: campaigns.model.records, which refuses records whose numbers their samples do not give)."""
    samples = np.random.default_rng(seed).lognormal(mean=np.log(5 + size / 1e3), sigma=0.2, size=iters) \
        if samples_us is None else np.asarray(samples_us, dtype=float)
    if goodput_gbs is not None:
        samples = samples * (size / goodput_gbs / 1e3) / float(np.median(samples))
    stats = sample_stats(samples.tolist())
    median = stats["median_us"]
    algbw = size / median / 1e3  # bytes/us = MB/s; /1e3 -> GB/s
    ranks = 4
    factor = busbw_factor(op, ranks)
    record: dict[str, Any] = {
        "schema_version": 1, "kind": "result", "commbench_version": "0.1.0", "timestamp": timestamp,
        "backend": "cpu", "op": op, "transport": transport, "bytes": size, "count": size // 4,
        "dtype": "float32", "iters": iters, "warmup": 2, "samples_us": samples.tolist(),
        "stats": stats,
        "latency_us": median, "goodput_gbs": algbw, "algbw_gbs": algbw,
        "busbw_gbs": algbw * factor, "busbw_factor": factor,
        "valid": True, "check": True, "wrong_elements": 0, "error": None, "reason": None,
        "ranks": ranks, "nodes": 2, "hostnames": ["n1", "n1", "n2", "n2"],
        "mpi_library": "Open MPI v4.1.4", "env": {"OMPI_MCA_btl": "self,tcp"},
        "versions": {}, "devices": None,
    }
    record.update(fields)
    return record


def error_record(*, reason: str = "timeout", **fields: Any) -> dict[str, Any]:
    """An 'error' record: what commbench writes when it could not measure."""
    record = {
        "schema_version": 1, "kind": "error", "commbench_version": "0.1.0", "timestamp": "2026-03-01T12:05:00Z",
        "backend": "cpu", "op": "alltoall", "transport": "mpi", "bytes": 1 << 20, "valid": False,
        "error": "watchdog: iteration exceeded 10 s", "reason": reason,
        "ranks": 2, "nodes": 1, "hostnames": ["n1", "n1"], "mpi_library": "MPICH 4.0.2", "env": {},
    }
    record.update(fields)
    return record


def run_info(run_key: str = "smoke/site-a/sys:cpu/gnu/AllreduceCheck/n2", **fields: Any) -> RunInfo:
    values: dict[str, Any] = dict(
        run_key=run_key, campaign="smoke", site="site-a", system="sys", partition="cpu", environ="gnu",
        check_name="AllreduceCheck", parameters={"op": "allreduce", "sizes": [1024, 4096]},
        num_nodes=2, num_tasks=4, status="pass")
    values.update(fields)
    return RunInfo(**values)


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.fixture
def skip_unless_sqlite(request: pytest.FixtureRequest) -> None:
    if request.getfixturevalue("store_url").startswith("postgresql"):
        pytest.skip("SQLite-specific")


sqlite_only = pytest.mark.usefixtures("skip_unless_sqlite")


# Every store test runs twice: on a SQLite file and on a database of its own on the session's real
# PostgreSQL server (tests/fixtures_pg.py).
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.db'}"
        return
    url = new_database(request.getfixturevalue("postgres_server"))
    try:
        yield url
    finally:
        drop_database(url)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def table_counts(store: Store) -> Callable[[], dict[str, int]]:
    """Rows per table of the `store` fixture, to check that a failed write left nothing behind."""
    def counts() -> dict[str, int]:
        with store.engine.connect() as connection:
            return {table: connection.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()
                    for table in ("runs", "measurements", "samples")}
    return counts
