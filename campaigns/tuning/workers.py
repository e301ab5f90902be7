"""Tuning on Slurm: srun as the launcher inside or outside an allocation, and `commcamp tune --workers`'s
sbatch workers on one shared study."""
from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from campaigns.locks import keep_in_use
from campaigns.tuning.spec import TuningSpec, site_partition
from tuners.writers import write_atomic

POLL_S = 20.0  # how often `tune --workers` asks squeue about its workers
GRACE_S = 600.0  # past a worker's time limit (Slurm's OverTimeLimit, KillWait, the end of its job) before giving up
SQUEUE_PATIENCE_S = 600.0  # squeue failing (slurmctld restarting, busy) this long in a row stops the wait
# A job that left slurmctld's memory (MinJobAge after its end) is unknown: `squeue -j ID` says so and fails.
_UNKNOWN_JOB = "Invalid job id"
# Pending reasons Slurm keeps until someone changes the job or the system (squeue(1) JOB REASON CODES): a job
# pending for one of them never starts by itself
_NEVER_STARTS = frozenset({"PartitionTimeLimit", "PartitionNodeLimit", "QOSMaxWallDurationPerJobLimit",
                           "QOSMaxNodePerJobLimit", "QOSMaxCpuPerJobLimit", "BadConstraints",
                           "DependencyNeverSatisfied", "InvalidAccount", "InvalidQOS",
                           "AssocMaxWallDurationPerJobLimit", "AssocMaxNodesPerJobLimit"})
# States whose time does not count against the job's time limit: waiting, requeued, its nodes still booting
_NOT_STARTED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"})


class WorkersFailed(Exception):
    """`tune --workers` could not submit its workers or see them to their end; the message says why and what
    became of the jobs submitted (cancelled, or which to cancel by hand)."""


def slurm_launcher(spec: TuningSpec, inside_allocation: bool) -> list[str]:
    """srun for the spec's MPI (the site environment's SLURM_MPI_TYPE). Inside an allocation srun uses
    it; outside it makes one with the site partition's access options. A rank that dies (a segfault
    before commbench's watchdog runs, in MPI_Init) ends the run at once (--kill-on-bad-exit): otherwise
    the other ranks wait in MPI for it until the run's time limit. --export=ALL: the ranks get the trial's
    environment (its knobs), which srun would otherwise leave to SLURM_EXPORT_ENV, inherited from the caller
    (NONE inside a job submitted with `sbatch --export=NONE`: no knob would reach the ranks)."""
    found = site_partition(spec)
    if found is None:
        raise ValueError(f"site {spec.site!r} has no site.yaml: cannot tell how to launch with srun there")
    partition, env = found
    cmd = ["srun", f"--mpi={env.get('SLURM_MPI_TYPE', 'none')}", "-N", str(spec.nodes), "-n", str(spec.ranks),
           "--kill-on-bad-exit=1", "--export=ALL"]
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


def worker_time_limit_min(spec: TuningSpec) -> int:
    """Each worker job's -t (minutes): the budget, or every trial at its time limit, and 2 minutes to start
    and stop."""
    return max(1, int((spec.budget_s or spec.time_limit_s * (spec.trials or 1)) // 60) + 2)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def cancel_jobs(job_ids: Sequence[int], env: Mapping[str, str]) -> str:
    """scancel the jobs (SIGTERM: each worker stops as commcamp does, its running trial queued again); what
    became of them, for a message."""
    if not job_ids:
        return "no Slurm job was submitted"
    listed = ", ".join(map(str, job_ids))
    try:
        out = subprocess.run(["scancel", *map(str, job_ids)], capture_output=True, text=True, env=dict(env),
                             timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        problem = _one_line(str(exc))
    else:
        if out.returncode == 0:
            return f"Slurm jobs {listed} cancelled"
        problem = f"exit {out.returncode}: {_one_line(out.stderr or out.stdout)}"
    return (f"scancel of Slurm jobs {listed} failed ({problem}): cancel them yourself "
            f"(scancel {' '.join(map(str, job_ids))})")


def submit_workers(spec: TuningSpec, workers: int, directory: Path, env: Mapping[str, str]) -> list[int]:
    """N sbatch jobs, each a tuning worker on the same study (PostgreSQL storage), with the submitting
    environment (--export=ALL: the worker needs its COMMCAMP_* variables whatever SBATCH_EXPORT says). If
    one cannot be submitted, those submitted before it are cancelled: WorkersFailed says why (Ctrl-C or
    SIGTERM cancels them too, then goes on as KeyboardInterrupt)."""
    directory.mkdir(parents=True, exist_ok=True)
    keep_in_use(directory)  # the workers write their output into it while this process waits for them
    spec_path = directory / "worker-spec.json"
    write_atomic(spec_path, worker_spec(spec).model_dump_json(indent=2))
    found = site_partition(spec)
    access = [] if found is None else list(found[0].access)
    limit_min = worker_time_limit_min(spec)
    ids: list[int] = []
    command = shlex.join([str(Path(sys.executable).with_name("commcamp")), "tune-worker", str(spec_path)])
    try:
        for number in range(workers):
            sbatch = ["sbatch", "--parsable", "--export=ALL", "-N", str(spec.nodes),
                      f"--ntasks-per-node={spec.tasks_per_node}", "-t", str(limit_min), "-J",
                      f"commcamp-tune-{number}", "-o", str(directory / "worker-%j.out"), *access, "--wrap",
                      f"cd {shlex.quote(str(directory))} && exec {command}"]
            which = f"worker {number + 1} of {workers}"
            try:
                out = subprocess.run(sbatch, capture_output=True, text=True, env=dict(env), timeout=60, check=False)
            except subprocess.TimeoutExpired:
                raise WorkersFailed(f"sbatch of {which} did not answer within 60 s (it may have been submitted: "
                                    f"look for commcamp-tune-{number} in squeue)") from None
            except OSError as exc:
                raise WorkersFailed(f"sbatch of {which} could not run: {exc.strerror or exc}") from None
            if out.returncode != 0:
                raise WorkersFailed(f"sbatch of {which} failed (exit {out.returncode}): "
                                    f"{_one_line(out.stderr) or _one_line(out.stdout)}")
            lines = out.stdout.strip().splitlines()
            job = lines[-1].split(";")[0].strip() if lines else ""
            if not job.isdecimal():
                raise WorkersFailed(f"sbatch of {which} printed no job id: {_one_line(out.stdout + out.stderr)!r}")
            ids.append(int(job))
    except BaseException as exc:
        note = cancel_jobs(ids, env)
        if isinstance(exc, WorkersFailed):
            raise WorkersFailed(f"{exc}; {note}") from None
        raise
    return ids


def wait_for_jobs(job_ids: Sequence[int], env: Mapping[str, str], run_limit_s: float, *, poll_s: float | None = None,
                  squeue_patience_s: float | None = None, log: Callable[[str], None] | None = None) -> None:
    """Until the jobs left the queue, however long they wait in it (Slurm's own limits apply there);
    `run_limit_s` is how long each may stay once it started running (its -t and GRACE_S): past that,
    WorkersFailed. squeue is asked every `poll_s` s (POLL_S); `log` gets a line when the jobs' states change.
    On any way out but their end (Ctrl-C or SIGTERM, a job past its limit, squeue failing for
    `squeue_patience_s` s, SQUEUE_PATIENCE_S, in a row) the jobs are cancelled first: scancel's SIGTERM stops
    each worker as it stops commcamp (its running trial queued again), none runs on alone; WorkersFailed then
    names what became of them, KeyboardInterrupt goes on as it is."""
    try:
        _wait_for_jobs(job_ids, env, run_limit_s, POLL_S if poll_s is None else poll_s,
                       SQUEUE_PATIENCE_S if squeue_patience_s is None else squeue_patience_s, log)
    except BaseException as exc:
        note = cancel_jobs(job_ids, env)
        if isinstance(exc, KeyboardInterrupt):
            raise
        reason = str(exc) if isinstance(exc, WorkersFailed) else f"{type(exc).__name__}: {_one_line(str(exc))}"
        raise WorkersFailed(f"waiting for the tuning workers stopped: {reason}; {note}") from None


def queue_states(job_ids: Sequence[int], env: Mapping[str, str]) -> dict[int, tuple[str, str]] | str:
    """Each job still in Slurm's queue: (state, reason), e.g. ("PENDING", "Priority"); or why squeue failed."""
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T %r", f"--jobs={','.join(map(str, job_ids))}"],
                             capture_output=True, text=True, env=dict(env), timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return _one_line(str(exc))
    if out.returncode != 0:
        if _UNKNOWN_JOB in out.stderr:  # gone from slurmctld's memory: left the queue
            return {}
        return f"squeue exit {out.returncode}: {_one_line(out.stderr or out.stdout)}"
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split(None, 2)
        if parts and parts[0].isdecimal():
            states[int(parts[0])] = (parts[1] if len(parts) > 1 else "UNKNOWN", parts[2] if len(parts) > 2 else "")
    return states


def _wait_for_jobs(job_ids: Sequence[int], env: Mapping[str, str], run_limit_s: float, poll_s: float,
                   squeue_patience_s: float, log: Callable[[str], None] | None) -> None:
    started: dict[int, float] = {}  # when each job was first seen running
    failing_since: float | None = None
    shown = ""
    while True:
        states = queue_states(job_ids, env)
        now = time.monotonic()
        if isinstance(states, str):
            failing_since = now if failing_since is None else failing_since
            if now - failing_since >= squeue_patience_s:
                raise WorkersFailed(f"squeue failed for {now - failing_since:.0f} s ({states})")
        else:
            failing_since = None
            if not states:
                return
            stuck = sorted(f"{job} ({reason})" for job, (state, reason) in states.items()
                           if state == "PENDING" and reason.split(",")[0].strip() in _NEVER_STARTS)
            if stuck:
                raise WorkersFailed(f"Slurm jobs {', '.join(stuck)} pending for a reason that does not clear by "
                                    "itself (squeue(1), JOB REASON CODES: e.g. -t above the partition's MaxTime, "
                                    "a QOS limit): fix the partition or limits (budget, time_limit_s, trials)")
            for job, (state, _) in states.items():
                if state in _NOT_STARTED:  # requeued (a node failed): its time limit counts from its next start
                    started.pop(job, None)
                else:
                    started.setdefault(job, now)
            late = sorted(job for job in states if job in started and now - started[job] > run_limit_s)
            if late:
                raise WorkersFailed(f"Slurm jobs {', '.join(map(str, late))} still in the queue "
                                    f"{run_limit_s:.0f} s after they started running")
            summary = _describe_states(states)
            if log is not None and summary != shown:
                log(f"tuning workers: {summary}")
            shown = summary
        time.sleep(poll_s)


def _describe_states(states: Mapping[int, tuple[str, str]]) -> str:
    """'1 PENDING (Priority), 2 RUNNING'."""
    counts: dict[str, int] = {}
    reasons: dict[str, set[str]] = {}
    for state, reason in states.values():
        counts[state] = counts.get(state, 0) + 1
        if state == "PENDING" and reason and reason != "None":
            reasons.setdefault(state, set()).add(reason)
    return ", ".join(f"{count} {state}" + (f" ({', '.join(sorted(reasons[state]))})" if state in reasons else "")
                     for state, count in sorted(counts.items()))


def worker_logs(directory: Path) -> list[Path]:
    """The workers' output files (sbatch -o worker-%j.out)."""
    return sorted(directory.glob("worker-*.out"))


def idle_workers_problem(directory: Path, job_ids: Sequence[int]) -> str:
    """Why to say that no worker ran a trial: the logs to read and the last line of the first that has one
    (e.g. `commcamp: not found` where the compute nodes lack commcamp's installation)."""
    logs = worker_logs(directory)
    last = ""
    for path in logs:
        try:
            lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        if lines:
            last = f"; {path.name} ends: {_one_line(lines[-1])[:300]}"
            break
    where = f"{directory}/worker-*.out" if logs else f"{directory}/worker-*.out (none was written)"
    return (f"none of the {len(job_ids)} Slurm workers (jobs {', '.join(map(str, job_ids))}) ran a trial: "
            f"read their output, {where}{last}")


def worker_finished(directory: Path) -> bool:
    """Some worker came to its end normally (its log's `worker done:` line)."""
    for path in worker_logs(directory):
        try:
            if "worker done:" in path.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False
