"""Health at 2,000 nodes with per-rank attribution (commbench schema 2): what naming a suspect from the run
that saw a slowdown costs, next to pairwise bisection (results/reliability/SCALING.md).

    .venv/bin/python tests/bench/bench_attribution_scale.py [--nodes 16,128,1024,2000] [--ranks-per-node 4]
                                                            [--output results/reliability/attribution_scale.json]

Per node count: one night's run and its baseline as commbench writes them (two sizes, 20 timed iterations,
every rank's per-iteration times drawn lognormal, one node's ranks 3x slower tonight), stored in SQLite
through Store.ingest as the runner stores them; measured: the record's JSON size with and without the
per-rank fields, the database bytes per run, campaigns.kinds.attribution.rank_suspects's time, whether it names
the slowed node, and the Slurm jobs each path costs (attribution: one confirmation pair job; bisection:
ceil(log2 nodes) rounds of pair jobs, each waiting in the queue). Nothing runs on Slurm.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import REPO, write_result

ITERS = 20
SIZES = (8, 1 << 20)


def record(rng: np.random.Generator, nodes: int, per_node: int, size: int, slow_node: int | None) -> dict[str, Any]:
    """A schema 2 result record of nodes x per_node ranks, as commbench writes it."""
    ranks = nodes * per_node
    base = 5 + size / 1e4
    times = rng.lognormal(np.log(base), 0.1, size=(ranks, ITERS))
    if slow_node is not None:
        times[slow_node * per_node:(slow_node + 1) * per_node] *= 3.0
    slowest = times.argmax(axis=0)
    samples = times.max(axis=0)
    median = float(np.median(samples))
    hosts = [f"nid{n:06d}" for n in range(nodes) for _ in range(per_node)]
    return {"schema_version": 2, "kind": "result", "commbench_version": "0.1.0", "timestamp": "2026-11-23T02:30:00Z",
            "backend": "cuda", "op": "sendrecv", "transport": "ccl", "bytes": size, "count": size // 4,
            "dtype": "float32", "iters": ITERS, "warmup": 2, "batch": 1, "samples_us": samples.tolist(),
            "stats": {"min_us": float(samples.min()), "median_us": median, "mean_us": float(samples.mean()),
                      "p95_us": float(np.percentile(samples, 95)), "max_us": float(samples.max()),
                      "stdev_us": float(samples.std(ddof=1))},
            "latency_us": median, "goodput_gbs": size / median / 1e3, "algbw_gbs": size / median / 1e3,
            "busbw_gbs": size / median / 1e3, "busbw_factor": 1.0, "valid": True, "check": True,
            "wrong_elements": 0, "error": None, "reason": None, "ranks": ranks, "nodes": nodes, "hostnames": hosts,
            "mpi_library": "bench", "devices": None, "versions": {}, "env": {},
            "slowest_rank": slowest.tolist(),
            "slowest_excess_us": (samples - np.median(times, axis=0)).tolist(),
            "per_rank": {"median_us": np.median(times, axis=1).tolist(),
                         "p95_us": np.percentile(times, 95, axis=1).tolist(),
                         "slowest_iterations": np.bincount(slowest, minlength=ranks).tolist()}}


def one_scale(nodes: int, per_node: int, rng: np.random.Generator, workdir: Path) -> dict[str, Any]:
    from campaigns.kinds.attribution import rank_suspects
    from campaigns.store import RunInfo, open_store

    slow = int(rng.integers(nodes))
    tonight = [record(rng, nodes, per_node, size, slow) for size in SIZES]
    baseline = [record(rng, nodes, per_node, size, None) for size in SIZES]
    v2_bytes = len(json.dumps(tonight[-1]))
    v1 = {k: v for k, v in tonight[-1].items() if k not in ("slowest_rank", "slowest_excess_us", "per_rank")}
    start = time.perf_counter()
    suspects = rank_suspects(tonight, baseline)
    judge_s = time.perf_counter() - start
    sizes = {}
    for label, records in (("v1", [dict(v1, schema_version=1)]), ("v2", tonight[-1:])):
        db = workdir / f"{label}-{nodes}.db"
        with open_store(f"sqlite:///{db}") as store:
            for night in range(5):
                store.ingest(RunInfo(run_key=f"night{night}", campaign="health", site="s", system="s", partition="p",
                                     environ="e", check_name="commbench_run", parameters={}, num_nodes=nodes,
                                     num_tasks=nodes * per_node, status="pass", reason=None, started_at=None,
                                     finished_at=None, job_id=None), records)
        sizes[label] = db.stat().st_size / 5
    return {"nodes": nodes, "ranks": nodes * per_node, "record_json_bytes_v1": len(json.dumps(v1)),
            "record_json_bytes_v2": v2_bytes, "db_bytes_per_run_v1": round(sizes["v1"]),
            "db_bytes_per_run_v2": round(sizes["v2"]), "rank_suspects_s": round(judge_s, 4),
            "named": suspects.top, "slowed_node": f"nid{slow:06d}", "correct": suspects.top == f"nid{slow:06d}",
            "extra_jobs_attribution": 1, "extra_job_rounds_bisection": math.ceil(math.log2(nodes))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="16,128,1024,2000")
    parser.add_argument("--ranks-per-node", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=REPO / "results" / "reliability" / "attribution_scale.json")
    args = parser.parse_args(argv[1:])
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one_scale(int(n), args.ranks_per_node, rng, Path(tmp)) for n in args.nodes.split(",")]
    for row in rows:
        print(json.dumps(row))
    write_result(args.output, argv, {"iters": ITERS, "sizes": list(SIZES), "ranks_per_node": args.ranks_per_node,
                                     "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
