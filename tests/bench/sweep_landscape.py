"""Measured knob landscape: commbench allreduce between 2 (or 3) processes over the FULL GRID of a few knob values
(the library defaults, i.e. every knob unset, included), each grid point measured `--repeats` times in
interleaved passes (every pass a fresh random order, so that drift hits all alike), failures recorded as they
happen. The raw material of the replay landscapes of the sampler benchmark (tuners/landscape.py,
tuners/bench_sampler.py; issue 14): per grid point the per-size median time of every launch, so run-level noise
(launch to launch) and failure rates are as measured, never modelled.

    .venv/bin/python tests/bench/sweep_landscape.py [--grid openmpi|openmpi-3node|openmpi-wide|...]
                                                    [--repeats 3] [--budget-s 420] [--seed 0] [--commbench BIN]
                                                    [--output results/bench/landscapes/localslurm_GRID.json]
    ... --extend [--more-passes N] [--confirm-top N --confirm-repeats R]   add launches to --output's landscape

Grids (GRIDS below; None = unset). On the local Slurm cluster (2 nodes x 1 rank, `openmpi-3node` 3; without a
running cluster in the environment, SLURM_CONF, the script starts one, fixtures_slurm, 3 nodes), sizes 64 KiB,
1 MiB and 4 MiB, 5 iterations after 1 warm-up (4 KiB socket buffers make large messages ~25x slower: the sweep must
stay short):
`openmpi`: OMPI_MCA_btl_tcp_sndbuf x OMPI_MCA_btl_tcp_rcvbuf (unset = the kernel's autotuning, and every 16x of
the catalog's 4 KiB .. 16 MiB) x OMPI_MCA_coll_tuned_allreduce_algorithm (unset = coll/tuned's fixed rules, and
three of its algorithms): 5 x 5 x 4 = 100 points (one launch took ~1 s on the 2-core machine: 3 passes ~5
minutes; `openmpi-3node`: the same over 3 nodes). `openmpi-wide`: the same knobs, buffers every 4x and all six
algorithms: 8 x 8 x 7 = 448 points. `openmpi-fine`: every value the search tries (KnobDimension.ladder: buffers unset
and every power of two 4 KiB .. 16 MiB, every algorithm), so the replay answers no trial with a neighbouring point:
14 x 14 x 7 = 1372 points (3 passes ~35 minutes).
`mpich` (Debian's 4.0.2 is ch4:ucx): MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM, 5 points. (The committed 30-point landscape
crossed it with MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE, which MPICH 4.0.2's blocking allreduce does not read: the
catalog offers it for no op since 3825817, and a tune naming it is refused.)
On the GPU machine (`nccl-socket`, with --commbench, the CUDA build): the socket path of
tools/tuning/gpu-socket-x2.yaml (its launcher, sizes 1/16/256 MiB, iterations and pinned P2P/SHM off), NCCL's
socket threading x NCCL_BUFFSIZE within the planted domain (1..8 threads and sockets): 7 x 5 x 4 = 140 points;
`nccl-socket-demo3`: the same points on the launch of tools/tuning/gpu-demo.yaml's demo3 (sizes 1/16/64 MiB);
`nccl-nvlink`: NCCL_ALGO x NCCL_PROTO x NCCL_MAX_CTAS over NVLink on gpu-demo.yaml's 4-GPU launch, 48 points.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from common import REPO, provenance, slurm_cluster_env, write_result

_BUFFERS = [None, "4096", "65536", "1048576", "16777216"]  # unset = the kernel's autotuning; every 16x of the catalog
_BUFFERS_4X = [None, *(str(4**e) for e in range(6, 13))]  # unset and 4 KiB .. 16 MiB, every 4x
_BUFFERS_2X = [None, *(str(2**e) for e in range(12, 25))]  # unset and 4 KiB .. 16 MiB, every 2x (the catalog's pow2)
_ALGORITHMS = [None, "basic_linear", "nonoverlapping", "recursive_doubling", "ring", "segmented_ring", "rabenseifner"]
LOCAL_SLURM = "localslurm"


class Grid(NamedTuple):
    library: str
    knobs: dict[str, list[str | None]]
    where: str  # LOCAL_SLURM, or the tuning-demo config whose `common` spec (+ `#phase`'s spec) is the launch
    nodes: int = 2  # LOCAL_SLURM: nodes x 1 rank


# "openmpi" is the grid of the 2026-11-23 landscapes (kept so that they can be re-made).
_OPENMPI = {"OMPI_MCA_btl_tcp_sndbuf": _BUFFERS, "OMPI_MCA_btl_tcp_rcvbuf": _BUFFERS,
            "OMPI_MCA_coll_tuned_allreduce_algorithm": [None, "recursive_doubling", "ring", "rabenseifner"]}
# NCCL's socket transport between 2 processes of one host: unset threads/sockets = NCCL's auto (no helper thread, 1
# socket per thread, on a NIC that is not AWS's or GCP's: so sockets unset and 1 are one configuration, and so is every
# socket count without threads; the catalog's unset_equals / inert_unless_set), unset buffer = 4 MiB; every product
# threads x sockets <= 64 (NCCL's cap)
_NCCL_SOCKET = {"NCCL_SOCKET_NTHREADS": [None, "1", "2", "3", "4", "6", "8"],
                "NCCL_NSOCKS_PERTHREAD": [None, "1", "2", "4", "8"],
                "NCCL_BUFFSIZE": [None, "1048576", "16777216", "67108864"]}
GRIDS: dict[str, Grid] = {
    "openmpi": Grid("openmpi", _OPENMPI, LOCAL_SLURM),
    # the same grid over 3 nodes: a scope related to the 2-node one (another node count)
    "openmpi-3node": Grid("openmpi", _OPENMPI, LOCAL_SLURM, nodes=3),
    # every algorithm the catalog offers, socket buffers every 4x: 8 x 8 x 7 = 448 points
    "openmpi-wide": Grid("openmpi", {"OMPI_MCA_btl_tcp_sndbuf": _BUFFERS_4X, "OMPI_MCA_btl_tcp_rcvbuf": _BUFFERS_4X,
                                     "OMPI_MCA_coll_tuned_allreduce_algorithm": _ALGORITHMS}, LOCAL_SLURM),
    # every value of the search's ladder: 14 x 14 x 7 = 1372 points
    "openmpi-fine": Grid("openmpi", {"OMPI_MCA_btl_tcp_sndbuf": _BUFFERS_2X, "OMPI_MCA_btl_tcp_rcvbuf": _BUFFERS_2X,
                                     "OMPI_MCA_coll_tuned_allreduce_algorithm": _ALGORITHMS}, LOCAL_SLURM),
    "mpich": Grid("mpich", {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": [None, "nb", "smp", "recursive_doubling",
                                                                    "reduce_scatter_allgather"]}, LOCAL_SLURM),
    "nccl-socket": Grid("nccl", _NCCL_SOCKET, "tools/tuning/gpu-socket-x2.yaml"),
    # the same knobs on the launch of the 4x H200 socket demo (demo3: sizes 1/16/64 MiB), whose committed trials
    # are a 4-point replay (results/bench/landscapes/h200_socket_demo3.json)
    "nccl-socket-demo3": Grid("nccl", _NCCL_SOCKET, "tools/tuning/gpu-demo.yaml#demo3"),
    # NVLink between the 4 GPUs of the demo machine (gpu-demo.yaml's common launch: sizes 8 KiB .. 64 MiB; the site
    # allows Ring and Tree for allreduce): algorithm x protocol x CTA cap, 3 x 4 x 4 = 48 points
    "nccl-nvlink": Grid("nccl", {"NCCL_ALGO": [None, "Ring", "Tree"], "NCCL_PROTO": [None, "LL", "LL128", "Simple"],
                                 "NCCL_MAX_CTAS": [None, "2", "8", "32"]}, "tools/tuning/gpu-demo.yaml"),
}
LOCAL_SLURM_SIZES = [65536, 1048576, 4194304]


def spec_document(grid_name: str, work: Path, commbench: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The TuningSpec fields of the grid's launches and the extra environment of every launch."""
    library, grid, where, nodes = GRIDS[grid_name]
    local = {"db": f"sqlite:///{work / 'study.db'}", "publish_dir": None, "runs_dir": str(work / "runs"),
             "knobs": list(grid), **({"commbench": str(commbench.resolve())} if commbench else {})}
    if where == LOCAL_SLURM:
        return {"site": "localslurm", "system": "localslurm:debug", "environ": library, "library": library,
                "op": "allreduce", "nodes": nodes, "tasks_per_node": 1, "sizes": LOCAL_SLURM_SIZES,
                "sizes_per_bucket": 1, "iters": 5, "warmup": 1, "bench_timeout_s": 60, "time_limit_s": 120,
                "executor": "launcher", "launcher": ["srun"], **local}, {}
    from campaigns.model.yamlio import load_yaml_model
    from campaigns.tools.tuning_demo import DemoConfig

    path, _, phase = where.partition("#")
    config = load_yaml_model(REPO / path, DemoConfig)
    if phase and phase not in config.phases:
        raise SystemExit(f"{path}: no phase {phase!r} (grid {grid_name})")
    return {**config.common, **(config.phases[phase].spec if phase else {}), **local}, dict(config.environment)


def gpu_names() -> list[str]:
    """nvidia-smi's GPU names (empty without one): provenance of a GPU landscape."""
    try:
        listing = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30, check=False).stdout
    except OSError:
        return []
    return [line.strip() for line in listing.splitlines() if line.strip()]


def design(space: Any, grid: dict[str, list[str | None]]) -> list[dict[str, str]]:
    """Every grid point, the library defaults (every knob unset) first."""
    return [space.env_from_values(dict(zip(grid, values, strict=True)))
            for values in itertools.product(*grid.values())]


def launch_time_us(run: dict[str, Any], sizes: list[int]) -> float:
    """One launch's study objective (one size per bucket); a failed launch is infinitely slow."""
    from tuners.evaluation import bucket_times_us, buckets_for_sizes, overall_time_us

    if "median_us" not in run:
        return math.inf
    medians = {int(size): t for size, t in run["median_us"].items()}
    return overall_time_us(bucket_times_us(medians, buckets_for_sizes(sizes, 1)))


def top_points(runs: list[list[dict[str, Any]]], count: int, sizes: list[int]) -> list[int]:
    """The `count` points with the lowest median launch time."""
    medians = [float(np.median([launch_time_us(r, sizes) for r in rs])) if rs else math.inf for rs in runs]
    return [int(i) for i in np.argsort(medians)[:count]]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="openmpi")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--confirm-top", type=int, default=0,
                        help="then measure the N fastest points --confirm-repeats more times each")
    parser.add_argument("--confirm-repeats", type=int, default=10)
    parser.add_argument("--extend", action="store_true",
                        help="read --output's landscape and add --more-passes passes and the confirmation launches")
    parser.add_argument("--more-passes", type=int, default=0, help="with --extend: passes over the whole grid")
    parser.add_argument("--budget-s", type=float, default=420.0, help="no run starts after this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--commbench", type=Path, help="the commbench binary (default: the spec's)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv[1:])
    library, grid, where, nodes = GRIDS[args.grid]
    if args.more_passes and not args.extend:
        parser.error("--more-passes needs --extend (a new landscape takes --repeats)")
    output = args.output or REPO / "results" / "bench" / "landscapes" / f"{where}_{args.grid.replace('-', '_')}.json"
    if where != LOCAL_SLURM and args.output is None:
        parser.error(f"--grid {args.grid}: give --output (the file name says which machine measured it)")
    earlier = json.loads(output.read_text()) if args.extend else None
    if earlier is not None and earlier.get("grid_name", args.grid) != args.grid:
        parser.error(f"--extend: {output} holds grid {earlier.get('grid_name')!r}, not {args.grid!r}")

    from campaigns.tuning.spec import TuningSpec
    from campaigns.tuning.session import prepare
    from campaigns.tuning.workers import slurm_launcher

    started = time.monotonic()
    passes = 0 if earlier is None else earlier["passes"]
    rng = np.random.default_rng(args.seed + (1000 + passes if earlier is not None else 0))
    cluster = slurm_cluster_env() if where == LOCAL_SLURM else contextlib.nullcontext(dict(os.environ))
    with cluster as env, tempfile.TemporaryDirectory() as scratch:
        document, launch_env = spec_document(args.grid, Path(scratch), args.commbench)
        env = {**env, **launch_env}
        os.environ.update(env)  # srun and sinfo of the executor find the cluster
        if where == LOCAL_SLURM:  # srun -N n -n n with the site's MPI plugin (a bare srun starts one singleton rank)
            document["launcher"] = slurm_launcher(TuningSpec.model_validate(document), inside_allocation=False)
        setup = prepare(TuningSpec.model_validate(document), environ=env, ingest=False)
        sizes = list(setup.spec.sizes)
        configs = design(setup.space, grid)
        runs: list[list[dict[str, Any]]] = [[] for _ in configs]
        if earlier is not None:
            if [c["env"] for c in earlier["configs"]] != configs:
                parser.error(f"--extend: the points of {output} are not those of grid {args.grid}")
            runs = [c["runs"] for c in earlier["configs"]]

        def measure(indices: list[int], label: int | str) -> None:
            for index in rng.permutation(indices):
                if time.monotonic() - started > args.budget_s:
                    break
                begun = time.monotonic()
                evaluation = setup.evaluator(configs[index])
                run: dict[str, Any] = {"pass": label, "wall_s": round(time.monotonic() - begun, 3)}
                if evaluation.ok:
                    run["median_us"] = {str(size): t for size, t in evaluation.median_us().items()}
                else:
                    run["failure"] = str(evaluation.failure)
                    run["reason"] = evaluation.reason[:300]
                runs[int(index)].append(run)
            print(f"pass {label}: {sum(map(len, runs))} runs, {time.monotonic() - started:.0f} s", flush=True)

        for _ in range(args.repeats if earlier is None else args.more_passes):
            measure(list(range(len(configs))), passes)
            passes += 1
        confirmed = top_points(runs, args.confirm_top, sizes)
        for repeat in range(args.confirm_repeats if confirmed else 0):
            measure(confirmed, f"confirm-{repeat}")
    measured = [{"config": i, "env": config, "runs": runs[i]} for i, config in enumerate(configs)]
    confirmation = ({"top": args.confirm_top, "repeats": args.confirm_repeats, "points": confirmed,
                     "why": "the fastest points measured again so that the landscape's best and the points within "
                            "95 % of it are not a few lucky launches (winner's curse)"} if confirmed else None)
    machine = {"gpus": gpu_names()} if where != LOCAL_SLURM else {}
    fields = {
        "what": f"measured allreduce landscape ({where}: {setup.spec.nodes * setup.spec.tasks_per_node} "
                "processes), full grid: per grid point and launch the "
                "per-size median time (us) or the failure; configuration 0 = library defaults",
        **machine, "grid_name": args.grid, "library": library, "library_version": setup.versions.get(library),
        "knobs": list(grid), "grid": grid, "sizes": sizes, "spec": setup.spec.model_dump(mode="json"),
        "launch_environment": launch_env, "seed": args.seed, "passes": passes,
        "runs": sum(map(len, runs)), "failures": sum("failure" in r for rs in runs for r in rs),
        "seconds": round(time.monotonic() - started, 1), "confirmations": [confirmation] if confirmation else [],
        "configs": measured}
    if earlier is not None:  # the sweep's provenance stays; each extension adds its own
        added = {**(confirmation or {}), "more_passes": args.more_passes, **provenance(argv),
                 "seconds": round(time.monotonic() - started, 1)}
        fields = {**{k: v for k, v in earlier.items() if k not in fields}, **fields, "seconds": earlier["seconds"],
                  "confirmations": [*earlier.get("confirmations", []), added]}
        for key in ("date", "host", "cpus", "command", "commit", "seed", "load_avg_at_start", "load_avg_at_end"):
            fields[key] = earlier[key]
        from tuners.writers import write_atomic

        write_atomic(output, json.dumps(fields, indent=1) + "\n")
    else:
        write_result(output, argv, fields)
    print(f"{len(configs)} configurations, {sum(map(len, runs))} runs -> {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
