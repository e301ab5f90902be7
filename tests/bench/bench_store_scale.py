"""How the results store and the nightly health check behave as nights accumulate: the numbers behind
results/reliability/SCALING.md.

    .venv/bin/python tests/bench/bench_store_scale.py [--nights 20] [--runs-per-night 500] [--backends sqlite,postgresql]
                                                      [--output results/reliability/store_scale.json]

Per backend (SQLite file; a throwaway PostgreSQL server), night after night: `runs-per-night` runs are stored
as the campaign runner stores them (one transaction per run with its records, Store.ingest), each run two
commbench records (8 B and 32 KiB, 20 timed iterations: what campaigns/health-localslurm.yaml measures per
test case). Four of each night's runs are the real test cases of that health campaign (their run keys); the
others stand for the night's other tests, keyed like the health check's pair tests. After
every few nights the health check's own code is timed: campaigns.kinds.health.HealthCheck loading the campaign's
runs, and judging the 4 test cases against their history (14 nights).

Measured: ingest time per run, database bytes per run, HealthCheck start-up and judging time, against the
number of stored runs. Nothing runs on Slurm; the records are generated (lognormal samples, statistics
computed from them as commbench does).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from common import REPO, write_result

SIZES = (8, 32768)
ITERS = 20


def records_for(rng: Any, op: str) -> list[dict[str, Any]]:
    from fixtures_store import commbench_record

    return [commbench_record(op=op, size=size, iters=ITERS, seed=int(rng.integers(1 << 30)),
                             timestamp="2026-11-21T02:30:00Z") for size in SIZES]


def database_bytes(url: str, engine: Any) -> int:
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    with engine.connect() as connection:
        return int(connection.exec_driver_sql("SELECT pg_database_size(current_database())").scalar_one())


def measure(url: str, nights: int, per_night: int, every: int) -> list[dict[str, Any]]:
    import numpy as np
    from rich.console import Console

    from campaigns.slurm.placement import Placer
    from campaigns.kinds.health import HealthCheck
    from campaigns.model.spec import load_campaign
    from campaigns.store import RunInfo, open_store

    campaign = load_campaign(REPO / "campaigns" / "health-localslurm.yaml")
    rng = np.random.default_rng(1)
    points = []
    with open_store(url) as store, tempfile.TemporaryDirectory() as runs_dir:
        for night in range(1, nights + 1):
            tag = f"2026-10-{night:02d}" if night <= 31 else f"night-{night:04d}"
            cases = campaign.cases(tag)
            runs = [(case.run_key, case.op, case.parameters | {"tag": tag, "hosts": ["n1", "n2"]}) for case in cases]
            # keyed like the health check's pair tests: <...>/2n/pair/<digest>/<node>+<node>@<night>
            pair_prefix = cases[0].series_key.rsplit("/", 1)[0] + "/pair"
            runs += [(f"{pair_prefix}/{i:016x}/n{i}+n{i + 1}@{tag}", "pingpong",
                      {"tag": tag, "hosts": [f"n{i}", f"n{i + 1}"]}) for i in range(per_night - len(cases))]
            started = time.perf_counter()
            for run_key, op, parameters in runs:
                store.ingest(RunInfo(run_key=run_key, campaign=campaign.name, site=campaign.site.name,
                                     system=campaign.system.name, partition="debug", environ="openmpi",
                                     check_name="commbench_run", parameters=parameters, num_nodes=2, num_tasks=2,
                                     status="pass", username="bench", submit_host="bench", commcamp_commit="bench"),
                             records_for(rng, op), validated=True)
            ingest_s = time.perf_counter() - started
            if night % every and night != nights:
                continue
            started = time.perf_counter()
            check = HealthCheck(campaign, store, tag, console=Console(quiet=True), runs_dir=Path(runs_dir),
                                placer=Placer())
            load_s = time.perf_counter() - started
            started = time.perf_counter()
            verdicts = [v for case in cases for v in check.judge_case(case)]
            judge_s = time.perf_counter() - started
            assert verdicts and all(v.history for v in verdicts if night > 3), "history not found"
            point = {"night": night, "runs": night * per_night, "measurements": night * per_night * len(SIZES),
                     "ingest_s_per_run": ingest_s / per_night, "db_bytes": database_bytes(url, store.engine),
                     "health_load_s": load_s, "health_judge_s": judge_s, "cases_judged": len(cases)}
            point["db_bytes_per_run"] = point["db_bytes"] / point["runs"]
            points.append(point)
            print(f"  night {night:3d}: {point['runs']:7d} runs, ingest {1e3 * point['ingest_s_per_run']:.2f} ms/run, "
                  f"{point['db_bytes'] / 2**20:7.1f} MiB ({point['db_bytes_per_run']:.0f} B/run), health check: "
                  f"load {load_s:.2f} s, judge {len(cases)} cases {judge_s:.2f} s", flush=True)
    return points


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nights", type=int, default=20)
    parser.add_argument("--runs-per-night", type=int, default=500)
    parser.add_argument("--every", type=int, default=5, help="time the health check every this many nights")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    from campaigns.store.pgserver import new_database, throwaway_server

    results = {}
    with ExitStack() as stack:
        for backend in args.backends.split(","):
            print(backend, flush=True)
            if backend == "sqlite":
                url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/scale.db"
            else:
                url = new_database(stack.enter_context(throwaway_server()))
            points = measure(url, args.nights, args.runs_per_night, args.every)
            first, last = points[0], points[-1]
            results[backend] = {
                "points": points,
                "ingest_ms_per_run_median": 1e3 * statistics.median(p["ingest_s_per_run"] for p in points),
                # growth per stored run, without the empty database's own size
                "db_bytes_per_run_marginal": (last["db_bytes"] - first["db_bytes"]) / (last["runs"] - first["runs"])}
            print(f"  {backend}: ingest {results[backend]['ingest_ms_per_run_median']:.2f} ms/run (median), "
                  f"{results[backend]['db_bytes_per_run_marginal']:.0f} B per further run", flush=True)
    if args.output:
        write_result(args.output, sys.argv, {"runs_per_night": args.runs_per_night, "records_per_run": len(SIZES),
                                             "iters": ITERS, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
