"""What a re-run keeps, for real on the local Slurm cluster: `commcamp run --force` adds a run to a test
case and never loses a stored passing one, and a failed case's reason (what commbench said) is in the
printed summary."""
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
