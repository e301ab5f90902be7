"""Measured knob landscape on the local Slurm cluster: commbench allreduce between 2 nodes (1 rank each)
for a random design of configurations of the tuner's search space, each measured several times in
interleaved passes, failures recorded as they happen. The raw material of replay landscapes for the
sampler benchmark (issue 14): per configuration the per-size median time of every launch, so run-level
noise (launch to launch) and failure rates are as measured, never modelled.

    .venv/bin/python tests/bench/sweep_cpu_landscape.py [--library openmpi|mpich] [--configs 30] [--repeats 4]
                                                        [--budget-s 420] [--seed 0]
                                                        [--output results/landscapes/localslurm_LIBRARY.json]

Design: configuration 0 is the library's defaults (every searched knob unset), then `--configs` - 1
distinct configurations drawn uniformly from the search space (tuners.space, Optuna's RandomSampler,
`--seed`). Pass p measures every configuration once, in a freshly shuffled order, so that drift hits all
alike; passes repeat until `--repeats` or the time budget (no run starts after `--budget-s`). Searched
knobs: Open MPI OMPI_MCA_btl_tcp_sndbuf, OMPI_MCA_btl_tcp_rcvbuf, OMPI_MCA_coll_tuned_allreduce_algorithm;
MPICH MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM. Sizes 64 KiB, 1 MiB and 8 MiB, 10 iterations after 2 warm-up.

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

import numpy as np
from common import REPO, slurm_cluster_env, write_result

KNOBS = {"openmpi": ["OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf", "OMPI_MCA_coll_tuned_allreduce_algorithm"],
         "mpich": ["MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"]}
SIZES = [65536, 1048576, 8388608]


def spec_document(library: str, work: Path) -> dict[str, Any]:
    return {"site": "localslurm", "system": "localslurm:debug", "environ": library, "library": library,
            "op": "allreduce", "nodes": 2, "tasks_per_node": 1, "sizes": SIZES, "sizes_per_bucket": 1,
            "iters": 10, "warmup": 2, "bench_timeout_s": 60, "time_limit_s": 120, "knobs": KNOBS[library],
            "executor": "launcher", "launcher": ["srun"], "db": f"sqlite:///{work / 'study.db'}",
            "publish_dir": None, "runs_dir": str(work / "runs")}


def design(space: Any, count: int, seed: int) -> list[dict[str, str]]:
    """The library defaults, then distinct random configurations of the space."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    envs = [space.env_from_values(dict.fromkeys(space.knob_names))]
    attempts = 0
    while len(envs) < count and attempts < 50 * count:
        attempts += 1
        trial = study.ask()
        env = space.suggest(trial)
        study.tell(trial, 0.0)
        if env not in envs:
            envs.append(env)
    return envs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", choices=sorted(KNOBS), default="openmpi")
    parser.add_argument("--configs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=420.0, help="no run starts after this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv[1:])
    output = args.output or REPO / "results" / "landscapes" / f"localslurm_{args.library}.json"

    from campaigns.tuning import TuningSpec, prepare, slurm_launcher

    started = time.monotonic()
    rng = np.random.default_rng(args.seed)
    with slurm_cluster_env() as env, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(env)  # srun and sinfo of the executor find this cluster
        document = spec_document(args.library, Path(scratch))
        # srun -N 2 -n 2 with the site's MPI plugin (a bare srun would start one singleton rank)
        document["launcher"] = slurm_launcher(TuningSpec.model_validate(document), inside_allocation=False)
        setup = prepare(TuningSpec.model_validate(document), environ=env, ingest=False)
        configs = design(setup.space, args.configs, args.seed)
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
        "what": "measured allreduce landscape on the local Slurm cluster (2 nodes x 1 rank): per configuration "
                "and launch the per-size median time (us) or the failure; configuration 0 = library defaults",
        "library": args.library, "library_version": setup.versions.get(args.library), "knobs": KNOBS[args.library],
        "sizes": SIZES, "spec": setup.spec.model_dump(mode="json"), "seed": args.seed, "passes": passes,
        "runs": sum(map(len, runs)), "failures": sum("failure" in r for rs in runs for r in rs),
        "seconds": round(time.monotonic() - started, 1), "configs": measured})
    print(f"{len(configs)} configurations, {sum(map(len, runs))} runs -> {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
