"""`commcamp tune --workers`' Slurm side with stand-ins for sbatch, squeue and scancel (scripts on PATH): how long
it waits for its workers (their time in the queue is not counted against them), how often it asks squeue, that
every way out but their end cancels what it submitted, what it says when none of them ran a trial; the srun
that launches a trial's ranks. The real jobs on the local cluster: tests/test_pretune.py, tests/test_faults_slurm.py;
Ctrl-C and SIGTERM: tests/test_tuning.py (test_an_interrupted_tune_cancels_its_slurm_workers)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from rich.console import Console

from campaigns.cli.tune import _study_errors
from campaigns.tuning import workers
from campaigns.tuning.spec import TuningSpec
from campaigns.tuning.workers import WorkersFailed, slurm_launcher, submit_workers, wait_for_jobs, worker_spec
from fixtures_cli import commcamp_output

REPO = Path(__file__).resolve().parents[1]
COMMBENCH = REPO / "build" / "bench" / "cpu-openmpi" / "commbench"
QOS_REFUSAL = ("sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates "
               "accounting/QOS policy (job submit limit, user's size and/or time limits)")


def script(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def fake_slurm(tmp_path: Path, squeue: str = "", sbatch_fails_at: int = 0, worker_log: str = ""
               ) -> tuple[Path, dict[str, str]]:
    """sbatch answering job ids 101, 102, ... (refusing as a QOS limit does from call `sbatch_fails_at` on; writing
    `worker_log` into each job's -o file), squeue doing `squeue` (`$n`: its call count), scancel recording its
    arguments (squeue then finds no job). The directory of their records (sbatch.args, squeue.times,
    scancel.args) and the environment that puts them first on PATH."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(parents=True)
    calls.mkdir()
    (calls / "refusal").write_text(QOS_REFUSAL + "\n")
    script(bin_dir, "sbatch", f"""n=$(cat {calls}/sbatch.count 2>/dev/null || echo 0); n=$((n+1))
echo $n > {calls}/sbatch.count
echo "$@" >> {calls}/sbatch.args
if [ {sbatch_fails_at} -gt 0 ] && [ $n -ge {sbatch_fails_at} ]; then cat {calls}/refusal >&2; exit 1; fi
id=$((100+n))
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
[ -n '{worker_log}' ] && printf '%s\\n' '{worker_log}' > "$(echo "$out" | sed "s/%j/$id/")"
echo "$id"
""")
    script(bin_dir, "squeue", f"""n=$(cat {calls}/squeue.count 2>/dev/null || echo 0); n=$((n+1))
echo $n > {calls}/squeue.count
date +%s.%N >> {calls}/squeue.times
[ -e {calls}/scancel.args ] && exit 0
{squeue}""")
    script(bin_dir, "scancel", f'echo "$@" >> {calls}/scancel.args')
    return calls, {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def spec_fields(tmp_path: Path, db: str, **extra: Any) -> dict[str, Any]:
    return {"site": "local", "system": "local:cpu", "library": "openmpi", "library_version": "4.1.4",
            "op": "allreduce", "nodes": 1, "tasks_per_node": 2, "sizes": ["64K"],
            "knobs": ["OMPI_MCA_btl_tcp_sndbuf"], "trials": 3, "executor": "launcher", "launcher": ["true"],
            "commbench": str(COMMBENCH), "db": db, "runs_dir": str(tmp_path / "runs"), **extra}


def test_the_ranks_get_the_trials_environment_whatever_slurm_export_env_says(tmp_path: Path) -> None:
    """Inside a job submitted with `sbatch --export=NONE` srun inherits SLURM_EXPORT_ENV=NONE: without --export=ALL
    the trial's knobs never reached the ranks. Slurm 22.05's srun takes --export=ALL (srun(1))."""
    spec = TuningSpec.model_validate(spec_fields(tmp_path, "sqlite:///x.db"))
    for inside in (True, False):
        assert "--export=ALL" in slurm_launcher(spec, inside)
    assert worker_spec(spec).launcher == ["srun", "--mpi=none", "-N", "1", "-n", "2", "--kill-on-bad-exit=1",
                                          "--export=ALL"]
    # and the worker jobs get the submitting environment (COMMCAMP_* variables) whatever SBATCH_EXPORT says
    calls, env = fake_slurm(tmp_path)
    assert submit_workers(spec, 2, tmp_path / "w", env) == [101, 102]
    assert all(line.split()[:2] == ["--parsable", "--export=ALL"]
               for line in (calls / "sbatch.args").read_text().splitlines())
    written = json.loads((tmp_path / "w" / "worker-spec.json").read_text())
    assert "--export=ALL" in written["launcher"]


def test_a_worker_s_time_in_the_queue_is_not_counted_against_it(tmp_path: Path) -> None:
    """The wait ran from submission: (budget or 3600 s) + 600 s, while each worker asked -t budget/60 + 2 min (or
    time_limit_s x trials): with the defaults 70 minutes of waiting for workers of 102, queue time included. Now a
    worker's limit counts from when it is seen running; pending, however long, stops nothing."""
    calls, env = fake_slurm(tmp_path, squeue="""if [ $n -le 25 ]; then echo "101 PENDING Priority"
elif [ $n -le 28 ]; then echo "101 RUNNING None"; fi""")
    lines: list[str] = []
    started = time.monotonic()
    wait_for_jobs([101], env, run_limit_s=2.0, poll_s=0.1, log=lines.append)
    assert time.monotonic() - started > 2.0  # pending longer than the limit
    assert lines == ["tuning workers: 1 PENDING (Priority)", "tuning workers: 1 RUNNING"]
    assert not (calls / "scancel.args").exists()


def test_a_worker_past_its_limit_is_cancelled_and_said_so_in_one_line(tmp_path: Path) -> None:
    calls, env = fake_slurm(tmp_path, squeue="""if [ $n -le 2 ]; then echo "101 PENDING Priority"
echo "102 PENDING Priority"; else echo "101 RUNNING None"; echo "102 PENDING Resources"; fi""")
    with pytest.raises(WorkersFailed) as failed:
        wait_for_jobs([101, 102], env, run_limit_s=0.5, poll_s=0.1)
    assert str(failed.value) == ("waiting for the tuning workers stopped: Slurm jobs 101 still in the queue 0 s after "
                                 "they started running; Slurm jobs 101, 102 cancelled")
    assert (calls / "scancel.args").read_text().split() == ["101", "102"]


def test_a_worker_pending_for_a_reason_that_never_clears_is_cancelled(tmp_path: Path) -> None:
    """A worker whose -t is above the partition's MaxTime (EnforcePartLimits=NO) pends for PartitionTimeLimit for
    ever: the wait, which no longer limits pending time, waited for ever too."""
    calls, env = fake_slurm(tmp_path, squeue='echo "101 PENDING Priority"; echo "102 PENDING PartitionTimeLimit"')
    with pytest.raises(WorkersFailed, match=r"Slurm jobs 102 \(PartitionTimeLimit\) pending for a reason that does not "
                                            r"clear by itself .*; Slurm jobs 101, 102 cancelled"):
        wait_for_jobs([101, 102], env, run_limit_s=60, poll_s=0.1)
    assert (calls / "scancel.args").read_text().split() == ["101", "102"]


def test_squeue_is_asked_every_poll_interval_and_a_job_gone_from_slurm_s_memory_has_ended(tmp_path: Path) -> None:
    """squeue was asked every second (a load on slurmctld for an hours-long wait); POLL_S now, tests pass less.
    `squeue --jobs=ID` of a job slurmctld no longer knows (MinJobAge after its end) fails: that job has ended."""
    assert 15 <= workers.POLL_S <= 30
    calls, env = fake_slurm(tmp_path, squeue="""if [ $n -le 3 ]; then echo "101 RUNNING None"; else
echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; fi""")
    wait_for_jobs([101], env, run_limit_s=60, poll_s=0.3)
    times = [float(t) for t in (calls / "squeue.times").read_text().split()]
    assert len(times) == 4 and min(b - a for a, b in zip(times, times[1:])) >= 0.3
    assert not (calls / "scancel.args").exists()


def test_squeue_failing_or_hanging_ends_the_wait_after_a_while_and_cancels_the_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, env = fake_slurm(tmp_path, squeue='echo "squeue: error: Unable to contact slurm controller" >&2; exit 1')
    with pytest.raises(WorkersFailed) as failed:
        wait_for_jobs([101], env, run_limit_s=60, poll_s=0.1, squeue_patience_s=0.3)
    assert "squeue failed for" in str(failed.value) and "Unable to contact slurm controller" in str(failed.value)
    assert str(failed.value).endswith("; Slurm jobs 101 cancelled")
    assert (calls / "scancel.args").read_text().split() == ["101"]
    # squeue that does not answer within its 30 s (subprocess.TimeoutExpired) is a failure of squeue alike
    real_run = subprocess.run

    def hanging_squeue(cmd: list[str], **kwargs: Any) -> Any:
        if cmd[0] == "squeue":
            raise subprocess.TimeoutExpired(cmd, 30)
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(workers.subprocess, "run", hanging_squeue)
    (calls / "scancel.args").unlink()
    with pytest.raises(WorkersFailed, match="timed out after 30 seconds.*; Slurm jobs 102 cancelled$"):
        wait_for_jobs([102], env, run_limit_s=60, poll_s=0.1, squeue_patience_s=0.3)
    assert (calls / "scancel.args").read_text().split() == ["102"]


def test_an_sbatch_that_fails_or_hangs_partway_cancels_the_jobs_submitted_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = TuningSpec.model_validate(spec_fields(tmp_path, "sqlite:///x.db"))
    calls, env = fake_slurm(tmp_path, sbatch_fails_at=3)
    with pytest.raises(WorkersFailed) as failed:
        submit_workers(spec, 4, tmp_path / "w", env)
    assert str(failed.value) == ("sbatch of worker 3 of 4 failed (exit 1): sbatch: error: QOSMaxSubmitJobPerUserLimit "
                                 "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job "
                                 "submit limit, user's size and/or time limits); Slurm jobs 101, 102 cancelled")
    assert (calls / "scancel.args").read_text().split() == ["101", "102"]
    # sbatch that does not answer within its 60 s (subprocess.TimeoutExpired): the job may exist, the others go
    calls, env = fake_slurm(tmp_path / "hangs")
    real_run, sbatch_calls = subprocess.run, []

    def hanging_second_sbatch(cmd: list[str], **kwargs: Any) -> Any:
        if cmd[0] == "sbatch":
            sbatch_calls.append(cmd)
            if len(sbatch_calls) == 2:
                raise subprocess.TimeoutExpired(cmd, 60)
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(workers.subprocess, "run", hanging_second_sbatch)
    with pytest.raises(WorkersFailed) as failed:
        submit_workers(spec, 3, tmp_path / "w2", env)
    assert str(failed.value) == ("sbatch of worker 2 of 3 did not answer within 60 s (it may have been submitted: look "
                                 "for commcamp-tune-1 in squeue); Slurm jobs 101 cancelled")
    assert (calls / "scancel.args").read_text().split() == ["101"]


def test_a_workers_problem_is_not_a_file_that_cannot_be_written() -> None:
    """TimeoutError is an OSError: the wait's timeout read "cannot write <publish dir> or <summary>"."""
    for raised, said in [(TimeoutError("tuning workers [1, 2] still queued or running after 4200 s"),
                          "timed out: tuning workers [1, 2] still queued or running after 4200 s. Every finished "
                          "trial is stored; run the same command again to resume."),
                         (WorkersFailed("sbatch of worker 3 of 4 failed (exit 1): QOS; Slurm jobs 1, 2 cancelled"),
                          "sbatch of worker 3 of 4 failed (exit 1): QOS; Slurm jobs 1, 2 cancelled. Every finished "
                          "trial is stored; run the same command again to resume.")]:
        console = Console(record=True, width=300)
        with pytest.raises(typer.Exit) as stopped, _study_errors(console, "sqlite:///study.db",
                                                                 [Path("/pub"), Path("/sum.json")]):
            raise raised
        assert stopped.value.exit_code == 1
        assert console.export_text().strip() == said


@pytest.mark.postgres
def test_tune_whose_sbatch_fails_partway_cancels_the_others_and_says_why(tmp_path: Path, postgres_url: str) -> None:
    """A QOS submit limit on the 3rd of 4 workers escaped as a traceback and left jobs 1 and 2 queued."""
    calls, env = fake_slurm(tmp_path, sbatch_fails_at=3)
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump(spec_fields(tmp_path, postgres_url)))
    code, out = commcamp_output("tune", str(spec), "--workers", "4", "--no-finalize", "--no-publish",
                                env={"PATH": env["PATH"]})
    assert code == 1, out
    assert out.strip().splitlines()[-1] == (
        "sbatch of worker 3 of 4 failed (exit 1): sbatch: error: QOSMaxSubmitJobPerUserLimit sbatch: error: Batch job "
        "submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits); "
        "Slurm jobs 101, 102 cancelled. Every finished trial is stored; run the same command again to resume."), out
    assert (calls / "scancel.args").read_text().split() == ["101", "102"]


@pytest.mark.postgres
def test_tune_whose_workers_all_ended_without_a_trial_names_their_logs(
        tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that cannot start (commcamp not installed on the compute nodes) read as "no trial completed"; the
    wait tune gives them is their -t (once running) and Slurm's grace, never less."""
    first = 'if [ $n -le 1 ]; then printf "101 PENDING Priority\\n102 RUNNING None\\n"; fi'
    calls, env = fake_slurm(tmp_path, squeue=first,
                            worker_log="/bin/sh: 1: /opt/commcamp/bin/commcamp: not found")
    monkeypatch.setattr(workers, "POLL_S", 0.05)
    limits = []
    real_wait = workers.wait_for_jobs

    def wait(job_ids: list[int], env: Any, run_limit_s: float, **kwargs: Any) -> None:
        limits.append(run_limit_s)
        real_wait(job_ids, env, run_limit_s, **kwargs)

    monkeypatch.setattr(workers, "wait_for_jobs", wait)
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump(spec_fields(tmp_path, postgres_url, budget_s=3600)))
    code, out = commcamp_output("tune", str(spec), "--workers", "2", "--no-finalize", "--no-publish",
                                env={"PATH": env["PATH"]})
    (directory,) = (tmp_path / "runs").glob("tune-workers-*")
    assert code == 1, out
    assert out.strip().splitlines()[-1] == (
        f"none of the 2 Slurm workers (jobs 101, 102) ran a trial: read their output, {directory}/worker-*.out; "
        "worker-101.out ends: /bin/sh: 1: /opt/commcamp/bin/commcamp: not found"), out
    assert "tuning workers: 1 PENDING (Priority), 1 RUNNING" in out
    (limit,) = limits
    asked = [int(args[args.index("-t") + 1]) for args in map(str.split, (calls / "sbatch.args").read_text().splitlines())]
    assert asked == [62, 62] and limit >= 62 * 60 + 300, (asked, limit)
    assert not (calls / "scancel.args").exists()
