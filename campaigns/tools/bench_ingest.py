"""Benchmark of the results store: ingest 10^6 per-iteration samples from a commbench JSON Lines file and
summarise them again (median and p95 per measurement, from the stored samples).

Target: load + ingest + summarise <= 5 s on the 2-core development machine. The records are generated
(lognormal samples, stats computed from them as commbench does); generating and writing the file is not timed.

    .venv/bin/python -m campaigns.tools.bench_ingest [--measurements 1000] [--samples 1000]
    .venv/bin/python -m campaigns.tools.bench_ingest --postgres   # a throwaway local PostgreSQL server
    .venv/bin/python -m campaigns.tools.bench_ingest --db URL     # an existing (empty) database

Results: results/bench/store_ingest.json (SQLite), results/bench/store_ingest_postgresql.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from campaigns.model.records import load_records
from campaigns.store.pgserver import throwaway_server
from campaigns import paths
from campaigns.store.store import RunInfo, Store, open_store

TARGET_S = 5.0


def generate_records(measurements: int, samples: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    sizes = 2 ** (np.arange(measurements) % 24)
    times = rng.lognormal(mean=np.log(2.0 + sizes / 1e3)[:, None], sigma=0.25, size=(measurements, samples))
    medians = np.median(times, axis=1)
    p95 = np.percentile(times, 95, axis=1)
    stamp = datetime.now(UTC).isoformat()
    records = []
    for i in range(measurements):
        algbw = float(sizes[i] / medians[i] / 1e3)
        records.append({
            "schema_version": 1, "kind": "result", "commbench_version": "bench", "timestamp": stamp,
            "backend": "cpu", "op": "allreduce", "transport": "mpi", "bytes": int(sizes[i]),
            "count": int(sizes[i]) // 4, "dtype": "float32", "iters": samples, "warmup": 10,
            "samples_us": times[i].tolist(),
            "stats": {"min_us": float(times[i].min()), "median_us": float(medians[i]),
                      "mean_us": float(times[i].mean()), "p95_us": float(p95[i]), "max_us": float(times[i].max()),
                      "stdev_us": float(times[i].std())},
            "latency_us": float(medians[i]), "goodput_gbs": algbw, "algbw_gbs": algbw, "busbw_gbs": 1.5 * algbw,
            "busbw_factor": 1.5, "valid": True, "check": True, "wrong_elements": 0, "ranks": 4, "nodes": 2,
            "hostnames": ["n1", "n1", "n2", "n2"], "mpi_library": "bench", "env": {}})
    return records


def database_mib(store: Store) -> float:
    with store.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            size = connection.exec_driver_sql("SELECT pg_database_size(current_database())").scalar_one()
        else:
            size = Path(str(store.engine.url.database)).stat().st_size
    return round(size / 2**20, 1)


def run(measurements: int, samples: int, workdir: Path, url: str | None = None) -> dict[str, Any]:
    path = workdir / "bench.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for record in generate_records(measurements, samples):
            out.write(json.dumps(record) + "\n")
    store = open_store(url or f"sqlite:///{workdir / 'bench.db'}")
    try:
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        records = load_records(path)
        t1 = time.perf_counter()
        run = RunInfo(run_key=f"bench-{uuid.uuid4().hex[:12]}", campaign="bench", site="local", system="local",
                      partition="cpu", environ="bench", check_name="bench_ingest", parameters={}, num_nodes=2,
                      num_tasks=4, status="pass")
        run_id = store.ingest(run, records, validated=True)  # load_records validated every record
        t2 = time.perf_counter()
        summary = {measurement_id: (float(np.median(values)), float(np.percentile(values, 95)))
                   for measurement_id, values in store.sample_arrays(run_id=run_id).items()}
        t3 = time.perf_counter()
        cpu = time.process_time() - cpu0
        stored = store.measurements(run_id=run_id).set_index("measurement_id")
        backend, db_mib = store.engine.dialect.name, database_mib(store)
    finally:
        store.close()
    # The summary from the samples must reproduce the stats commbench wrote next to them.
    mismatches = sum(not np.isclose(summary[mid], (row.median_us, row.p95_us), rtol=1e-12).all()
                     for mid, row in stored.iterrows())
    total = t3 - t0
    return {
        "measurements": measurements, "samples_per_measurement": samples,
        "samples_total": measurements * samples, "jsonl_mib": round(path.stat().st_size / 2**20, 1),
        "backend": backend, "database": store.url, "db_mib": db_mib,
        "load_validate_s": round(t1 - t0, 3), "ingest_s": round(t2 - t1, 3), "summarise_s": round(t3 - t2, 3),
        "total_s": round(total, 3), "total_cpu_s": round(cpu, 3), "target_s": TARGET_S, "target_met": total <= TARGET_S,
        "summary_mismatches": mismatches, "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        # Other work on the machine stretches the wall times; the load average says how much there was.
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measurements", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--output", type=Path, help="JSON file the result is written to (atomically) [default: "
                        "results/bench/store_ingest.json, store_ingest_postgresql.json for PostgreSQL]")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", help="SQLAlchemy URL of an existing database [default: a temporary SQLite file]")
    where.add_argument("--postgres", action="store_true", help="start a throwaway PostgreSQL server on 127.0.0.1")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="commcamp-bench-") as workdir, ExitStack() as stack:
        url = stack.enter_context(throwaway_server()) if args.postgres else args.db
        result = run(args.measurements, args.samples, Path(workdir), url)
    if args.output is None:
        name = "store_ingest.json" if result["backend"] == "sqlite" else f"store_ingest_{result['backend']}.json"
        args.output = paths.workspace() / "bench" / name
    for key, value in result.items():
        print(f"{key:>24}: {value}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    temp = args.output.with_name(f".{args.output.name}.tmp")
    temp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    temp.replace(args.output)
    return 0 if result["target_met"] and result["summary_mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
