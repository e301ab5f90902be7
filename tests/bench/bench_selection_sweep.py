"""Selections evaluated per minute: every forced collective algorithm in ONE commbench process
(`--selections all`) against one process per selection (the algorithm forced through the environment,
as every tuner evaluation did before), same sizes, same iterations, same cluster.

    .venv/bin/python tests/bench/bench_selection_sweep.py [--mpis openmpi,mpich] [--nodes 2]
        [--sizes 8,1024,65536] [--rounds 2] [--iters 3] [--warmup 1] [--repeats 2]
        [--output results/bench/selection_sweep_rate.json]

Both paths run commbench (build/bench/cpu-<mpi>/commbench) with srun on the local Slurm cluster (a
3-node one is started when none is in the environment), one rank per node, the five collectives
(allreduce, allgather, alltoall, bcast, reduce_scatter) on the mpi transport:
  sweep    one srun: `--selections all --rounds R --iters I --warmup W`: per size, R interleaved rounds of
           W + I operations for every selection (own included)
  process  one srun per (op, selection) the sweep measured: `--iters R*I --warmup R*W`, the same operations
           per size and selection, the algorithm forced by OMPI_MCA_coll_tuned_<coll>_algorithm (Open MPI) or
           MPIR_CVAR_<COLL>_INTRA_ALGORITHM (MPICH) in the environment; "own" with neither
A selection evaluated = one (op, selection) measured at every size. Rate = selections / wall time of the
srun commands (launch, MPI start-up, measurement, exit), per minute; the sweep's median over --repeats runs.
Also recorded: the wall time of 3 runs that only start and stop (`--list-cvars`), the cost the sweep saves
per selection; the speedup cannot exceed (start-up + measurement) / (start-up / selections + measurement).
Target: sweep rate >= 20 x process rate. Every run must exit 0 with valid records.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, slurm_cluster_env, write_result

from campaigns.model.records import load_records

LAUNCH = {"openmpi": {"mpi": "pmix", "env": {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}},
          "mpich": {"mpi": "pmi2", "env": {"UCX_TLS": "tcp,self"}}}
OPS = "allreduce,allgather,alltoall,bcast,reduce_scatter"
TARGET = 20.0


def srun(env: dict[str, str], mpi: str, nodes: int, args: list[str], extra: dict[str, str]) -> float:
    """Runs commbench once under srun; returns the wall time in seconds."""
    cmd = ["srun", f"--mpi={LAUNCH[mpi]['mpi']}", "-N", str(nodes), "-n", str(nodes), "--kill-on-bad-exit=1",
           f"--partition={env.get('LOCALSLURM_PARTITION', 'debug')}",
           str(REPO / "build" / "bench" / f"cpu-{mpi}" / "commbench"), "--transport", "mpi", *args]
    start = time.monotonic()
    done = subprocess.run(cmd, env={**env, **LAUNCH[mpi]["env"], **extra}, capture_output=True, text=True,
                          timeout=300, check=False)
    wall = time.monotonic() - start
    print(f"{wall:7.2f} s  {' '.join(args[:6])} {' '.join(f'{k}={v}' for k, v in extra.items())}", file=sys.stderr,
          flush=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall


def results_of(path: Path) -> list[dict[str, Any]]:
    records = load_records(path)
    bad = [r for r in records if r["kind"] != "result" or not r["valid"]]
    if bad:
        raise SystemExit(f"{path}: {len(bad)} records are errors or invalid, e.g. {bad[0].get('error')}")
    return records


def forcing_env(mpi: str, selection: dict[str, Any]) -> dict[str, str]:
    """The environment that forces one selection in a process of its own."""
    if selection["name"] == "own":
        return {}
    if mpi == "mpich":
        return {selection["cvar"].upper(): selection["name"]}
    forced = {f"OMPI_MCA_{selection['cvar']}": str(selection["value"])}
    if selection.get("segsize") is not None:
        forced[f"OMPI_MCA_{selection['cvar']}_segmentsize"] = str(selection["segsize"])
    return forced


def measure(env: dict[str, str], mpi: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    common = ["--op", OPS, "--sizes", args.sizes]
    sweep_walls, selections, library = [], [], ""
    load_before = [round(x, 2) for x in os.getloadavg()]
    for repeat in range(args.repeats):
        output = work / f"{mpi}-sweep-{repeat}.jsonl"
        sweep_walls.append(srun(env, mpi, args.nodes, [*common, "--selections", "all", "--rounds", str(args.rounds),
                                                       "--iters", str(args.iters), "--warmup", str(args.warmup),
                                                       "--output", str(output)], {}))
        records = results_of(output)
        library = records[0]["mpi_library"]
        selections = list({(r["op"], r["selection"]["name"]): r["selection"] | {"op": r["op"]}
                           for r in records}.values())
    process_walls = []
    for selection in selections:
        output = work / f"{mpi}-process-{selection['op']}-{selection['name'].replace('/', '_')}.jsonl"
        process_walls.append(srun(env, mpi, args.nodes, [
            "--op", selection["op"], "--sizes", args.sizes, "--iters", str(args.rounds * args.iters),
            "--warmup", str(args.rounds * args.warmup), "--output", str(output)], forcing_env(mpi, selection)))
        results_of(output)
    # Start-up and exit alone (MPI_Init, MPI_T, MPI_Finalize, no measurement): what one process per
    # selection pays each time on top of the measurement.
    startup_walls = [srun(env, mpi, args.nodes, ["--list-cvars", "no_such_prefix"], {}) for _ in range(3)]
    sweep_s = statistics.median(sweep_walls)
    sweep_rate = 60.0 * len(selections) / sweep_s
    process_rate = 60.0 * len(selections) / sum(process_walls)
    return {"mpi": mpi, "mpi_library": library, "load_avg_before": load_before,
            "load_avg_after": [round(x, 2) for x in os.getloadavg()], "selections": len(selections), "sizes": [int(s) for s in args.sizes.split(",")],
            "sweep_wall_s": sweep_walls, "process_wall_s": process_walls,
            "sweep_selections_per_min": round(sweep_rate, 1), "process_selections_per_min": round(process_rate, 1),
            "speedup": round(sweep_rate / process_rate, 2), "process_median_wall_s": statistics.median(process_walls),
            "startup_wall_s": startup_walls, "sweep_s_per_selection": round(sweep_s / len(selections), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mpis", default="openmpi,mpich")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--sizes", default="8,1024,65536")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    results = []
    with slurm_cluster_env() as env, tempfile.TemporaryDirectory(prefix="selection-sweep-") as work:
        for mpi in args.mpis.split(","):
            results.append(measure(env, mpi, args, Path(work)))
    print(f"{'mpi':8} {'selections':>10} {'sweep/min':>10} {'process/min':>12} {'speedup':>8}  (target >= {TARGET}x)")
    for r in results:
        print(f"{r['mpi']:8} {r['selections']:10d} {r['sweep_selections_per_min']:10.1f} "
              f"{r['process_selections_per_min']:12.1f} {r['speedup']:8.2f}")
    if args.output:
        write_result(args.output, sys.argv, {
            "what": "collective selections evaluated per minute: one commbench process (--selections all) vs one "
                    "process per selection, srun on the local Slurm cluster (tests/bench/bench_selection_sweep.py)",
            "settings": {"nodes": args.nodes, "ranks": args.nodes, "ops": OPS.split(","), "rounds": args.rounds,
                         "iters": args.iters, "warmup": args.warmup, "repeats": args.repeats},
            "target_speedup": TARGET, "met": all(r["speedup"] >= TARGET for r in results), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
