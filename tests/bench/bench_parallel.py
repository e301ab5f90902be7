"""Parallel speedup of tuning on the local Slurm cluster: the same number of independent trials run by one
tuning worker (serially, on one node) and by K workers on K nodes (`commcamp tune --workers K`, each worker a
1-node Slurm job, all on one PostgreSQL study).

    .venv/bin/python tests/bench/bench_parallel.py [--trials 12] [--workers 1,2,3] [--kinds wait,tiny,cpu]
                                                   [--output results/reliability/parallel.json]

Speedup(K) = span(1 worker) / span(K workers), where a span runs from the first trial's start to the last
trial's end (Optuna's trial timestamps; worker start-up is outside it). Target: >= 0.8 K.

This machine has 2 cores for all its "nodes", so what parallel trials can gain depends on what a trial spends
its time on; three kinds of trial, each 1 node x 2 ranks (Open MPI, shared memory inside the node):
  wait   commbench, tiny, after 2 s in which the node's CPUs are idle (a wrapper sleeps): stands for a trial
         whose time goes to a device or the network, as on a real cluster where every node has its own CPUs
  tiny   commbench allreduce 8 B x 5 iterations: the trial is srun plus MPI start-up, all CPU work
  cpu    commbench allreduce 4 MiB x 300 iterations: both ranks busy for seconds
Only `wait` can show what K nodes give; `tiny` and `cpu` show the ceiling of 2 shared cores (<= 2x, and no
gain when one trial already keeps both cores busy).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from common import REPO, slurm_cluster_env, write_result

COMMBENCH = REPO / "build" / "bench" / "cpu-openmpi" / "commbench"
KINDS: dict[str, dict[str, Any]] = {
    "wait": {"sizes": [8], "iters": 5, "sleep_s": 2},
    "tiny": {"sizes": [8], "iters": 5, "sleep_s": 0},
    "cpu": {"sizes": [4194304], "iters": 300, "sleep_s": 0},
}


def run_study(kind: str, workers: int, trials: int, url: str, work: Path, env: dict[str, str]) -> dict[str, Any]:
    import optuna

    from campaigns.store import open_store
    from tuners.study import is_counted

    wrapper = work / "commbench"
    wrapper.write_text(f"#!/bin/sh\nsleep {KINDS[kind]['sleep_s']}\nexec {COMMBENCH} \"$@\"\n")
    wrapper.chmod(0o755)
    spec = work / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "site": "localslurm", "system": "localslurm:debug", "environ": "openmpi", "library": "openmpi",
        "library_version": "4.1.4", "op": "allreduce", "nodes": 1, "tasks_per_node": 2,
        "sizes": KINDS[kind]["sizes"], "sizes_per_bucket": 1, "iters": KINDS[kind]["iters"], "warmup": 1,
        "knobs": ["OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf"], "trials": trials, "heartbeat_s": 10,
        "executor": "launcher", "launcher": ["srun"], "commbench": str(wrapper), "db": url, "publish_dir": None,
        "runs_dir": str(work / "runs")}))
    done = subprocess.run([str(Path(sys.executable).with_name("commcamp")), "tune", str(spec), "--workers",
                           str(workers), "--no-finalize"], env={**env, "COLUMNS": "200"}, cwd=REPO,
                          capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} x {workers}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(url)]
    counted = [t for t in optuna.load_study(study_name=name, storage=url).trials if is_counted(t)]
    starts = [t.datetime_start.timestamp() for t in counted]
    ends = [t.datetime_complete.timestamp() for t in counted]
    with open_store(url) as store:
        hosts = sorted({host for hostnames in store.measurements()["hostnames"] for host in hostnames})
    return {"kind": kind, "workers": workers, "trials": len(counted),
            "failed": sum(t.state.name != "COMPLETE" for t in counted), "span_s": round(max(ends) - min(starts), 3),
            "trial_s_median": round(sorted(e - s for s, e in zip(starts, ends))[len(counted) // 2], 3),
            "hosts": hosts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--workers", default="1,2,3")
    parser.add_argument("--kinds", default="wait,tiny,cpu")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    from campaigns.store.pgserver import new_database, throwaway_server
    from fixtures_pg import socket_url  # the nodes reach PostgreSQL through its unix socket

    results = []
    with slurm_cluster_env() as env, throwaway_server() as server:
        for kind in args.kinds.split(","):
            for workers in map(int, args.workers.split(",")):
                with tempfile.TemporaryDirectory(prefix=f"parallel-{kind}-{workers}-") as work:
                    result = run_study(kind, workers, args.trials, socket_url(new_database(server)), Path(work), env)
                serial = next((r for r in results if r["kind"] == kind and r["workers"] == 1), result)
                result["speedup"] = round(serial["span_s"] / result["span_s"], 3)
                result["target"] = 0.8 * workers
                results.append(result)
                print(f"{kind:5} workers {workers}: {result['trials']} trials in {result['span_s']:7.2f} s "
                      f"(trial {result['trial_s_median']:.2f} s) speedup {result['speedup']:.2f} "
                      f"(target {result['target']:.1f}) hosts {','.join(result['hosts'])}", flush=True)
    if args.output:
        write_result(args.output, sys.argv, {"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
