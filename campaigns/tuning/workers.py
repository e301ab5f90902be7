"""Tuning on Slurm: srun as the launcher inside or outside an allocation, and `commcamp tune --workers`'s
sbatch workers on one shared study."""
from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from campaigns.tuning.spec import TuningSpec, site_partition
from tuners.writers import write_atomic


def slurm_launcher(spec: TuningSpec, inside_allocation: bool) -> list[str]:
    """srun for the spec's MPI (the site environment's SLURM_MPI_TYPE). Inside an allocation srun uses
    it; outside it makes one with the site partition's access options. A rank that dies (a segfault
    before commbench's watchdog runs, in MPI_Init) ends the run at once (--kill-on-bad-exit): otherwise
    the other ranks wait in MPI for it until the run's time limit."""
    found = site_partition(spec)
    if found is None:
        raise ValueError(f"site {spec.site!r} has no site.yaml: cannot tell how to launch with srun there")
    partition, env = found
    cmd = ["srun", f"--mpi={env.get('SLURM_MPI_TYPE', 'none')}", "-N", str(spec.nodes), "-n", str(spec.ranks),
           "--kill-on-bad-exit=1"]
    return cmd if inside_allocation else [*cmd, *partition.access]


def completed_launcher(spec: TuningSpec, inside_allocation: bool) -> TuningSpec:
    """`launcher: [srun]` (or [/path/to/srun]) alone starts one task on one node outside an allocation (a 3-node
    scope measured 1 rank on the local cluster), so for a site with a site.yaml it becomes the srun slurm_launcher
    builds for the scope (the site's MPI plugin, -N nodes -n ranks, the partition's access options outside an
    allocation), the program as given. Any other launcher, or one for a site of knob files only, is used as given."""
    if (spec.executor != "launcher" or spec.launcher is None or len(spec.launcher) != 1
            or Path(spec.launcher[0]).name != "srun" or site_partition(spec) is None):
        return spec
    return spec.model_copy(update={"launcher": [spec.launcher[0], *slurm_launcher(spec, inside_allocation)[1:]]})


def worker_spec(spec: TuningSpec) -> TuningSpec:
    """The spec a Slurm worker runs: launcher executor with srun in its own allocation, no finalization."""
    return spec.model_copy(update={"executor": "launcher", "launcher": slurm_launcher(spec, True),
                                   "finalize": spec.finalize.model_copy(update={"enabled": False}),
                                   "publish_dir": None})


def submit_workers(spec: TuningSpec, workers: int, directory: Path, env: Mapping[str, str]) -> list[int]:
    """N sbatch jobs, each a tuning worker on the same study (PostgreSQL storage)."""
    directory.mkdir(parents=True, exist_ok=True)
    spec_path = directory / "worker-spec.json"
    write_atomic(spec_path, worker_spec(spec).model_dump_json(indent=2))
    found = site_partition(spec)
    access = [] if found is None else list(found[0].access)
    limit_min = max(1, int((spec.budget_s or spec.time_limit_s * (spec.trials or 1)) // 60) + 2)
    ids = []
    for number in range(workers):
        command = shlex.join([str(Path(sys.executable).with_name("commcamp")), "tune-worker", str(spec_path)])
        sbatch = ["sbatch", "--parsable", "-N", str(spec.nodes), f"--ntasks-per-node={spec.tasks_per_node}",
                  "-t", str(limit_min), "-J", f"commcamp-tune-{number}", "-o", str(directory / "worker-%j.out"),
                  *access, "--wrap", f"cd {shlex.quote(str(directory))} && exec {command}"]
        out = subprocess.run(sbatch, capture_output=True, text=True, env=dict(env), timeout=60, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
        ids.append(int(out.stdout.strip().split(";")[0]))
    return ids


def wait_for_jobs(job_ids: Sequence[int], env: Mapping[str, str], timeout_s: float) -> None:
    """Until the jobs left the queue; interrupted (Ctrl-C, SIGTERM), they are cancelled first: scancel's
    SIGTERM stops each worker as it stops commcamp (its running trial queued again), none runs on alone."""
    try:
        _wait_for_jobs(job_ids, env, timeout_s)
    except KeyboardInterrupt:
        subprocess.run(["scancel", *map(str, job_ids)], capture_output=True, env=dict(env), timeout=60, check=False)
        raise


def _wait_for_jobs(job_ids: Sequence[int], env: Mapping[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(map(str, job_ids))], capture_output=True,
                             text=True, env=dict(env), timeout=30, check=False)
        if out.returncode == 0 and not out.stdout.strip():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"tuning workers {list(job_ids)} still queued or running after {timeout_s:.0f} s")
        time.sleep(1)
