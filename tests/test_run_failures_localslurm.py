"""Failed runs, for real on the local Slurm cluster: `commcamp run --force` adds a run to a test case and
never loses a stored passing one; a failed case's reason is its first failure (what commbench said, or
which rank crashed where), also in the printed summary; a rank whose peer crashed ends at its --timeout."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from campaigns.store import open_store
from fixtures_slurm import SlurmCluster

COMMCAMP = Path(sys.executable).with_name("commcamp")

# 2 ranks on one node, 256 MiB messages: commbench allocates > 1 GiB of buffers per rank, which a
# virtual memory limit of 700 MB (ulimit -v; Slurm propagates it to the job's tasks) refuses.
BIG = """\
name: big-test
site: localslurm
system: localslurm:debug
environments: [openmpi]
node_counts: [1]
check_performance: false
checks:
  - check: commbench_run
    ops: [pingpong]
    sizes: [268435456]
    warmup: 1
    iters: 2
    timeout_s: 60
    time_limit_s: 120
"""
MEMORY_LIMIT_KB = 700000


def commcamp_run(cluster: SlurmCluster, *args: str, limit_kb: int | None = None) -> subprocess.CompletedProcess[str]:
    command = shlex.join([str(COMMCAMP), "run", *args])
    if limit_kb is not None:
        command = f"ulimit -v {limit_kb} && exec {command}"
    return subprocess.run(["bash", "-c", command], env={**cluster.env, "COLUMNS": "200"}, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.slurm
def test_forced_rerun_that_fails_keeps_the_passing_run(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text(BIG)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    args = [str(spec), "--db", db, "--runs-dir", str(tmp_path / "runs")]
    first = commcamp_run(slurm_cluster, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    with open_store(db) as store:
        [passed] = store.runs()
        samples = store.measurements(run_id=passed.id)["iters"].sum()
    assert passed.status == "pass" and samples == 2
    # Its records file ingested by hand again is recognised (same records, another key) and skipped.
    [records] = (tmp_path / "runs").glob("*/rfm-1/output/localslurm/debug/openmpi/commbench_run_*/commbench.jsonl")
    again = subprocess.run([str(COMMCAMP), "results", "ingest", str(records), "--site", "localslurm", "--system",
                            "localslurm", "--db", db], capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0 and f"already stored as run {passed.id}" in again.stdout, again.stdout + again.stderr

    forced = commcamp_run(slurm_cluster, *args, "--force", limit_kb=MEMORY_LIMIT_KB)
    output = forced.stdout + forced.stderr
    assert forced.returncode == 1, output
    with open_store(db) as store:
        runs = store.runs()
        kept = store.measurements(run_id=passed.id)
    assert [(r.id, r.status) for r in runs][0] == (passed.id, "pass"), runs
    assert [r.status for r in runs] == ["pass", "fail"], runs
    assert runs[0].run_key == runs[1].run_key
    assert kept["iters"].sum() == samples  # the passing measurement is all still there
    # The summary says why, as commbench put it in its error record.
    failed_line = next(line for line in forced.stdout.splitlines() if line.startswith("fail "))
    assert "cannot allocate" in failed_line, output
    assert "cannot allocate" in (runs[1].reason or "")
    # The passing run still counts: a plain re-run has nothing to do.
    again = commcamp_run(slurm_cluster, *args)
    assert again.returncode == 0 and "Nothing to run" in again.stdout, again.stdout + again.stderr


# Rank 0 dies of SIGSEGV after writing its records (commbench --inject crash), while rank 1 waits for it
# in MPI (the final exchange of the exit code, between two watchdog steps).
CRASH = """\
name: crash-test
site: localslurm
system: localslurm:debug
environments: [openmpi]
node_counts: [2]
check_performance: false
checks:
  - check: commbench_run
    ops: [pingpong]
    sizes: [8]
    warmup: 1
    iters: 2
    timeout_s: 5
    time_limit_s: 120
    extra_args: [--inject, crash]
"""


@pytest.mark.slurm
def test_a_crash_is_stored_as_the_crash_and_its_peer_ends_at_its_timeout(slurm_cluster: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    spec = tmp_path / "crash.yaml"
    spec.write_text(CRASH)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    result = commcamp_run(slurm_cluster, str(spec), "--db", db, "--runs-dir", str(tmp_path / "runs"))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    with open_store(db) as store:
        [run] = store.runs()
    reason = run.reason or ""
    crashed_on = slurm_cluster.nodes[0]  # rank 0 of a 2-node job: the first node Slurm gave it
    assert run.status == "fail" and run.parameters.get("job_nodes", [crashed_on])[0] == crashed_on
    assert reason.startswith(f"rank 0 on {crashed_on}: crashed with signal 11 (Segmentation fault); "), reason
    assert "time limit" not in reason, reason
    # Rank 1 waited in MPI for the dead rank 0; its watchdog ended it after 5 s, not the job's 2-minute limit.
    assert run.started_at and run.finished_at and (run.finished_at - run.started_at).total_seconds() < 60
    err = next((tmp_path / "runs").glob("*/rfm-1/stage/localslurm/debug/openmpi/commbench_run_*/rfm_job.err"))
    assert "(rank 1's watchdog)" in err.read_text()


@pytest.mark.parametrize("srun_first", [True, False])
def test_the_first_failure_is_the_crash_whichever_stream_came_first(srun_first: bool) -> None:
    """commbench's crash line and srun's line for the same dead task reach the job's stderr in either
    order (two streams); the reason is the crash with its signal, not the peer's watchdog echo."""
    from campaigns.reframe.runner import first_failure

    srun = "srun: error: c1n1: task 0: Segmentation fault"
    crash = "commbench: rank 0 on c1n1: crashed with signal 11 (Segmentation fault)"
    echo = "commbench: rank 1 on c1n2: timeout: no progress for 5 s in measurement"
    lines = [srun, crash, echo] if srun_first else [crash, srun, echo]
    assert first_failure("\n".join(lines), []) == "rank 0 on c1n1: crashed with signal 11 (Segmentation fault)"
    assert first_failure("\n".join([srun, echo]), []) == "rank(s) 0 on c1n1: Segmentation fault"
    assert first_failure(echo, []) == echo.removeprefix("commbench: ")
