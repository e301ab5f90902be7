"""Measured knob landscape on the local Slurm cluster: commbench allreduce between 2 nodes (1 rank each)
over the FULL GRID of a few knob values (the library defaults, i.e. every knob unset, included), each grid
point measured `--repeats` times in interleaved passes (every pass a fresh random order, so that drift hits
all alike), failures recorded as they happen. The raw material of the replay landscapes of the sampler
benchmark (tuners/landscape.py, tuners/bench_sampler.py; issue 14): per grid point the per-size median time
of every launch, so run-level noise (launch to launch) and failure rates are as measured, never modelled.

    .venv/bin/python tests/bench/sweep_cpu_landscape.py [--library openmpi|mpich] [--repeats 3]
                                                        [--budget-s 420] [--seed 0]
                                                        [--output results/bench/landscapes/localslurm_LIBRARY.json]

Grid (GRID below; None = unset): Open MPI OMPI_MCA_btl_tcp_sndbuf x OMPI_MCA_btl_tcp_rcvbuf (unset = the
kernel's autotuning, and powers of two from the catalog's 4 KiB .. 16 MiB) x
OMPI_MCA_coll_tuned_allreduce_algorithm (unset = coll/tuned's fixed rules, and three of its algorithms):
5 x 5 x 4 = 100 points (one launch took ~1 s on the 2-core machine: 3 passes ~5 minutes);
MPICH MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM (unset and every choice). Sizes 64 KiB, 1 MiB and 4 MiB,
5 iterations after 1 warm-up (4 KiB socket buffers make large messages ~25x slower: the sweep must stay short).

Without a running cluster in the environment (SLURM_CONF) the script starts one (fixtures_slurm), 3 nodes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import itertools

import numpy as np
from common import REPO, slurm_cluster_env, write_result

_BUFFERS = [None, "4096", "65536", "1048576", "16777216"]  # unset = the kernel's autotuning; every 16x of the catalog
GRID: dict[str, dict[str, list[str | None]]] = {
    "openmpi": {"OMPI_MCA_btl_tcp_sndbuf": _BUFFERS, "OMPI_MCA_btl_tcp_rcvbuf": _BUFFERS,
                "OMPI_MCA_coll_tuned_allreduce_algorithm": [None, "recursive_doubling", "ring", "rabenseifner"]},
    "mpich": {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": [None, "nb", "smp", "recursive_doubling",
                                                       "reduce_scatter_allgather"]}}
KNOBS = {library: list(grid) for library, grid in GRID.items()}
SIZES = [65536, 1048576, 4194304]


def spec_document(library: str, work: Path) -> dict[str, Any]:
    return {"site": "localslurm", "system": "localslurm:debug", "environ": library, "library": library,
            "op": "allreduce", "nodes": 2, "tasks_per_node": 1, "sizes": SIZES, "sizes_per_bucket": 1,
            "iters": 5, "warmup": 1, "bench_timeout_s": 60, "time_limit_s": 120, "knobs": KNOBS[library],
            "executor": "launcher", "launcher": ["srun"], "db": f"sqlite:///{work / 'study.db'}",
            "publish_dir": None, "runs_dir": str(work / "runs")}


def design(space: Any, grid: dict[str, list[str | None]]) -> list[dict[str, str]]:
    """Every grid point, the library defaults (every knob unset) first."""
    return [space.env_from_values(dict(zip(grid, values, strict=True)))
            for values in itertools.product(*grid.values())]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", choices=sorted(KNOBS), default="openmpi")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=420.0, help="no run starts after this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv[1:])
    output = args.output or REPO / "results" / "bench" / "landscapes" / f"localslurm_{args.library}.json"

    from campaigns.tuning.spec import TuningSpec
    from campaigns.tuning.session import prepare
    from campaigns.tuning.workers import slurm_launcher

    started = time.monotonic()
    rng = np.random.default_rng(args.seed)
    with slurm_cluster_env() as env, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(env)  # srun and sinfo of the executor find this cluster
        document = spec_document(args.library, Path(scratch))
        # srun -N 2 -n 2 with the site's MPI plugin (a bare srun would start one singleton rank)
        document["launcher"] = slurm_launcher(TuningSpec.model_validate(document), inside_allocation=False)
        setup = prepare(TuningSpec.model_validate(document), environ=env, ingest=False)
        configs = design(setup.space, GRID[args.library])
        runs: list[list[dict[str, Any]]] = [[] for _ in configs]
        passes = 0
        for _ in range(args.repeats):
            if time.monotonic() - started > args.budget_s:
                break
            for index in rng.permutation(len(configs)):
                if time.monotonic() - started > args.budget_s:
                    break
                begun = time.monotonic()
                evaluation = setup.evaluator(configs[index])
                run: dict[str, Any] = {"pass": passes, "wall_s": round(time.monotonic() - begun, 3)}
                if evaluation.ok:
                    run["median_us"] = {str(size): t for size, t in evaluation.median_us().items()}
                else:
                    run["failure"] = str(evaluation.failure)
                    run["reason"] = evaluation.reason[:300]
                runs[int(index)].append(run)
            passes += 1
            print(f"pass {passes}: {sum(map(len, runs))} runs, {time.monotonic() - started:.0f} s", flush=True)
    measured = [{"config": i, "env": config, "runs": runs[i]} for i, config in enumerate(configs)]
    write_result(output, argv, {
        "what": "measured allreduce landscape on the local Slurm cluster (2 nodes x 1 rank), full grid: per grid "
                "point and launch the per-size median time (us) or the failure; configuration 0 = library defaults",
        "library": args.library, "library_version": setup.versions.get(args.library), "knobs": KNOBS[args.library], "grid": GRID[args.library],
        "sizes": SIZES, "spec": setup.spec.model_dump(mode="json"), "seed": args.seed, "passes": passes,
        "runs": sum(map(len, runs)), "failures": sum("failure" in r for rs in runs for r in rs),
        "seconds": round(time.monotonic() - started, 1), "configs": measured})
    print(f"{len(configs)} configurations, {sum(map(len, runs))} runs -> {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
