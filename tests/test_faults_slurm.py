"""Fault injection on the real local Slurm cluster (real slurmctld/slurmd, ReFrame, Open MPI over TCP):

- a commbench run that hangs is ended at its limit (commbench's watchdog in a campaign; the watchdog and the
  executor's hard limit in a study on Slurm), and one whose rank 0 crashes is ended at once, each recorded as
  failed with the reason, and the rest goes on;
- a node dies mid-campaign (its slurmd and its job processes, killed by PID): its job is stored as failed
  naming the node, the node is reported out of service, the other cases run elsewhere, and after the node
  is back a re-run does only what failed;
- the campaign or tuning process is SIGKILLed mid-run: its ReFrame / srun child goes with it (no orphan keeps
  running jobs), and a restart resumes: every case or trial exactly once, nothing lost;
- 4 tuning workers (Slurm jobs) on one PostgreSQL study: every trial accounted for, none twice.

Related: tests/test_campaign_localslurm.py (a job cancelled mid-campaign), tests/test_pretune.py (2 workers,
one killed), tests/test_faults_storage.py (the database lost mid-run).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml

from campaigns.store import open_store
from campaigns.tuning.spec import TuningSpec
from campaigns.tuning.workers import slurm_launcher
from fixtures_slurm import SlurmCluster, process_alive
from fixtures_pg import socket_url
from tuners.study import ENV, OUTCOME, RECORD_IDS, REPEAT_OF, RETRY_OF, is_counted

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
COMMCAMP = Path(sys.executable).with_name("commcamp")
COMMBENCH = REPO / "build" / "bench" / "cpu-openmpi" / "commbench"
STUDY = "localslurm/localslurm:debug/openmpi-4.1.4/allreduce/mpi/all/n1/g1"


def commcamp(cluster: SlurmCluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(COMMCAMP), *args], env={**cluster.env, "COLUMNS": "200"}, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def start_commcamp(cluster: SlurmCluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(COMMCAMP), *args], env={**cluster.env, "COLUMNS": "200"}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until(predicate: Callable[[], object], what: str, proc: subprocess.Popen[str] | None = None,
               timeout: float = 120) -> object:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the command ended first ({proc.returncode}):\n{proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)
    return value


def running_jobs(cluster: SlurmCluster) -> list[tuple[str, list[str]]]:
    """(job id, nodes) of every running job."""
    out = cluster.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %N"], check=False).stdout
    jobs = []
    for line in out.splitlines():
        job, nodelist = line.split()
        jobs.append((job, cluster.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()))
    return jobs


def no_job_left(cluster: SlurmCluster) -> bool:
    return not cluster.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip()


def processes_using(path: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            continue
    return [pid for pid in found if process_alive(pid)]


# ------------------------------------------------------------------------------------------------- hangs
HANG_CAMPAIGN = """\
name: hang
site: localslurm
system: localslurm:debug
environments: [openmpi]
node_counts: [2]
check_performance: false
checks:
  - check: commbench_run
    ops: [allreduce]
    sizes: [1024]
    warmup: 1
    iters: 4
    timeout_s: 3
    time_limit_s: 60
    extra_args: [--inject, hang]
  - check: commbench_run
    ops: [alltoall]
    sizes: [8, 1024]
    warmup: 1
    iters: 4
    timeout_s: 30
    time_limit_s: 60
"""


def test_hanging_run_fails_at_its_limit_and_the_campaign_goes_on(slurm_cluster: SlurmCluster,
                                                                 tmp_path: Path) -> None:
    spec = tmp_path / "hang.yaml"
    spec.write_text(HANG_CAMPAIGN)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    started = time.monotonic()
    result = commcamp(slurm_cluster, "run", str(spec), "--db", db, "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 1, result.stdout + result.stderr
    with open_store(db) as store:
        runs = {r.parameters["op"]: r for r in store.runs()}
    hung, other = runs["allreduce"], runs["alltoall"]
    assert hung.status == "fail" and "commbench exited with code 3 (timeout)" in (hung.reason or ""), hung.reason
    assert hung.job_id and f"(job {hung.job_id} on " in (hung.reason or "")
    assert other.status == "pass" and other.num_measurements == 2
    # commbench's watchdog (3 s) ended it, not the job's 60 s limit
    assert time.monotonic() - started < 120 and no_job_left(slurm_cluster)


def misbehaving_commbench(tmp_path: Path) -> Path:
    """commbench, except that the first trial's run hangs where its watchdog sees it (--inject hang), the
    second trial's where nothing inside notices (only the executor's hard limit ends it), and in the third
    rank 0 segfaults before MPI_Init, so that rank 1 waits there for it (what pretune once met). Each run
    has its own directory beside the earlier ones: their number says which trial this is."""
    wrapper = tmp_path / "commbench"
    wrapper.write_text(f"""#!/bin/sh
case $(ls -d ../run-* | wc -l) in
    1) exec {COMMBENCH} "$@" --inject hang ;;
    2) exec sleep 600 ;;
    3) [ "$SLURM_PROCID" = 0 ] && kill -SEGV $$; exec {COMMBENCH} "$@" ;;
    *) exec {COMMBENCH} "$@" ;;
esac
""")
    wrapper.chmod(0o755)
    return wrapper


def tune_spec(tmp_path: Path, **fields: object) -> Path:
    """A study on localslurm whose trials are commbench under srun (the launcher commcamp makes for a Slurm
    site, each trial its own allocation)."""
    document = {
        "site": "localslurm", "system": "localslurm:debug", "environ": "openmpi", "library": "openmpi",
        "library_version": "4.1.4", "op": "allreduce", "nodes": 1, "tasks_per_node": 2, "sizes": [1024, 65536],
        "sizes_per_bucket": 1, "iters": 5, "warmup": 1,
        "knobs": ["OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf"], "heartbeat_s": 1,
        "executor": "launcher", "launcher": ["srun"], "db": f"sqlite:///{tmp_path / 'study.db'}",
        "publish_dir": None, "finalize": {"enabled": False}, "runs_dir": str(tmp_path / "runs"), "study": STUDY,
        **fields}
    document["launcher"] = slurm_launcher(TuningSpec.model_validate(document), inside_allocation=False)
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump(document))
    return spec


def test_hanging_trials_fail_at_their_limit_and_the_study_goes_on(slurm_cluster: SlurmCluster,
                                                                  tmp_path: Path) -> None:
    spec = tune_spec(tmp_path, trials=5, bench_timeout_s=3, time_limit_s=10,
                     commbench=str(misbehaving_commbench(tmp_path)))
    result = commcamp(slurm_cluster, "tune", str(spec), "--summary", str(tmp_path / "summary.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trials: 5 counted (2 complete, 3 failed)" in result.stdout
    trials = sorted((t for t in optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'study.db'}")
                     .trials if is_counted(t)), key=lambda t: t.number)
    watchdog, hard_limit = trials[0].user_attrs, trials[1].user_attrs
    assert (watchdog[OUTCOME], hard_limit[OUTCOME]) == ("timeout", "timeout")
    assert "no progress for 3 s" in watchdog["fail_reason"]  # commbench's watchdog
    assert "killed at the hard time limit of 10 s" in hard_limit["fail_reason"]  # the executor's limit
    crashed = trials[2].user_attrs
    assert crashed[OUTCOME] == "failed" and "task 0: Segmentation fault" in crashed["fail_reason"]
    durations = json.loads((tmp_path / "summary.json").read_text())["run_durations_s"]
    assert durations[2] < 8, durations  # srun ended the step when rank 0 died (--kill-on-bad-exit)
    assert [t.user_attrs[OUTCOME] for t in trials[3:]] == ["complete", "complete"]
    # the killed srun took its job step and allocation with it (an orphan would stay: localslurm's partition has no
    # time limit and InactiveLimit=0); a job may still be completing (CG) for a moment on a loaded machine
    wait_until(lambda: no_job_left(slurm_cluster), "every trial's Slurm job gone", timeout=30)


# ----------------------------------------------------------------------------------------- node failure
NODE_CAMPAIGN = """\
name: nodedeath
site: localslurm
system: localslurm:debug
environments: [openmpi]
node_counts: [2]
check_performance: false
checks:
  - check: commbench_run
    ops: [allreduce]
    sizes: [4194304]
    warmup: 1
    iters: 1000
    tasks_per_node: 1
    timeout_s: 60
    time_limit_s: 120
  - check: commbench_run
    ops: [alltoall]
    sizes: [8, 1024]
    warmup: 1
    iters: 4
    tasks_per_node: 1
    timeout_s: 30
    time_limit_s: 60
"""


def node_pids(cluster: SlurmCluster, node: str) -> list[int]:
    """Every process in the node's network namespace."""
    return [int(p) for p in subprocess.run(["ip", "netns", "pids", cluster.netns[node]], capture_output=True,
                                           text=True, check=True).stdout.split()]


def commbench_running_on(cluster: SlurmCluster, node: str) -> bool:
    for pid in node_pids(cluster, node):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "commbench":
                return True
    return False


def crash_node(cluster: SlurmCluster, node: str) -> list[int]:
    """The node dies: SIGKILL to every process in its network namespace (slurmd, slurmstepd, commbench)."""
    pids = node_pids(cluster, node)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


def test_node_dies_mid_campaign(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(NODE_CAMPAIGN)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    args = ["run", str(spec), "--db", db, "--runs-dir", str(tmp_path / "runs")]
    proc = start_commcamp(slurm_cluster, *args)
    try:
        ((job, nodes),) = wait_until(lambda: running_jobs(slurm_cluster), "the allreduce job running", proc)
        dead = nodes[-1]
        # Mid-measurement, not during the step's launch (a failed launch ends the job FAILED, not NODE_FAIL).
        wait_until(lambda: commbench_running_on(slurm_cluster, dead), "commbench running on the node", proc)
        slurmd = slurm_cluster.daemon_pids()[f"slurmd-{dead}"]
        assert slurmd in crash_node(slurm_cluster, dead)
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        slurm_cluster.restart_node(dead)
    assert proc.returncode == 1, output
    with open_store(db) as store:
        runs = {r.parameters["op"]: r for r in store.runs()}
    failed, other = runs["allreduce"], runs["alltoall"]
    assert failed.status == "fail" and failed.job_id == job, failed.reason
    assert "NODE_FAIL" in (failed.reason or "") and dead in (failed.reason or "")
    assert failed.parameters["job_nodes"] == nodes
    assert other.status == "pass" and dead not in other.parameters["hosts"]  # placed on the live nodes
    assert f"node out of service {dead}: down*" in output

    again = commcamp(slurm_cluster, *args)  # the node is back: only the failed case runs again
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Running 1 of 2 test case(s)" in again.stdout and "node out of service" not in again.stdout
    with open_store(db) as store:
        runs = store.runs()
    assert sorted((r.parameters["op"], r.status, r.num_measurements) for r in runs) == [
        ("allreduce", "pass", 1), ("alltoall", "pass", 2)]


# ---------------------------------------------------------------------------------------------- SIGKILL
KILL_CAMPAIGN = """\
name: sigkill
site: localslurm
system: localslurm:debug
environments: [openmpi]
node_counts: [1]
check_performance: false
checks:
  - check: commbench_run
    ops: [allreduce, sendrecv]
    sizes: [1024, 65536]
    warmup: 1
    iters: 20
    timeout_s: 30
    time_limit_s: 60
"""


def test_sigkilled_campaign_leaves_no_orphan_and_resumes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    spec = tmp_path / "kill.yaml"
    spec.write_text(KILL_CAMPAIGN)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    runs_dir = tmp_path / "runs"
    args = ["run", str(spec), "--db", db, "--runs-dir", str(runs_dir)]
    proc = start_commcamp(slurm_cluster, *args)
    assert proc.stdout is not None
    for line in proc.stdout:
        if " OK " in line and "commbench_run" in line:
            proc.send_signal(signal.SIGKILL)
            break
    assert proc.wait(timeout=30) == -signal.SIGKILL
    # ReFrame got SIGTERM when its parent died: it cancelled its job and ended.
    wait_until(lambda: not processes_using(runs_dir), "ReFrame of the killed campaign gone", timeout=30)
    wait_until(lambda: no_job_left(slurm_cluster), "its Slurm job gone", timeout=30)
    with open_store(db) as store:
        first = store.runs()
    assert len(first) >= 1 and all(r.status == "pass" for r in first)  # the cases that finished, whole

    again = commcamp(slurm_cluster, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"Running {2 - len(first)} of 2 test case(s)" in again.stdout
    with open_store(db) as store:
        runs = store.runs()
        frame = store.measurements()
    assert sorted(r.parameters["op"] for r in runs) == ["allreduce", "sendrecv"]  # each once
    assert len(frame) == 2 * 2 and frame.groupby("run_id").size().eq(2).all()  # none lost, none half


def test_sigkilled_study_leaves_no_orphan_and_resumes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    trials = 6
    spec = tune_spec(tmp_path, trials=trials)
    url = f"sqlite:///{tmp_path / 'study.db'}"

    def mid_trial() -> bool:
        try:
            found = optuna.load_study(study_name=STUDY, storage=url).get_trials(deepcopy=False)
        except Exception:  # the study or its database file is not created yet
            return False
        return sum(map(is_counted, found)) >= 2 and any(t.state.name == "RUNNING" for t in found) and \
            bool(running_jobs(slurm_cluster))

    proc = start_commcamp(slurm_cluster, "tune", str(spec))
    wait_until(mid_trial, "a trial's srun running after two counted trials", proc)
    proc.kill()
    proc.communicate(timeout=30)
    wait_until(lambda: no_job_left(slurm_cluster), "the killed trial's srun and job gone", timeout=30)

    resumed = commcamp(slurm_cluster, "tune", str(spec))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    study = optuna.load_study(study_name=STUDY, storage=url)
    counted = [t for t in study.trials if is_counted(t)]
    lost = [t for t in study.trials if not is_counted(t) and REPEAT_OF not in t.user_attrs]  # repeats: no launch
    assert len(counted) == trials and len({t.number for t in counted}) == trials
    assert len(lost) == 1 and lost[0].state.name == "FAIL"  # the killed trial: stale, failed, never counted
    (retry,) = [t for t in study.trials if RETRY_OF in t.user_attrs]
    assert retry.user_attrs[RETRY_OF] == [lost[0].number] and retry.params == lost[0].params
    if not is_counted(retry):  # the setting was measured meanwhile: the re-queued trial took that result
        assert study.trials[retry.user_attrs[REPEAT_OF]].user_attrs[ENV] == retry.user_attrs[ENV]
    ids = [i for t in counted for i in t.user_attrs[RECORD_IDS]]
    with open_store(url) as store:
        stored = [f"run:{r.id}" for r in store.runs()]
    assert len(ids) == len(set(ids)) == trials and set(ids) <= set(stored)
    assert len(stored) - trials <= 1  # the killed trial's run, if it was stored before the kill


# ------------------------------------------------------------------------------------- parallel workers
@pytest.mark.postgres
def test_four_workers_on_one_postgresql_study(slurm_cluster: SlurmCluster, postgres_url: str,
                                              tmp_path: Path) -> None:
    trials, workers = 12, 4
    url = socket_url(postgres_url)  # the nodes' network namespaces reach PostgreSQL through its socket
    spec = tune_spec(tmp_path, trials=trials, tasks_per_node=1, heartbeat_s=2, db=url)
    result = commcamp(slurm_cluster, "tune", str(spec), "--workers", str(workers), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"submitted {workers} tuning workers" in result.stdout and f"trials: {trials} counted" in result.stdout
    study = optuna.load_study(study_name=STUDY, storage=url)
    counted = [t for t in study.trials if is_counted(t)]
    assert len(counted) == trials and len({t.number for t in counted}) == trials
    assert not [t for t in study.trials if t.state.name in ("RUNNING", "WAITING")]
    ids = [i for t in counted for i in t.user_attrs[RECORD_IDS]]
    with open_store(url) as store:
        stored = [f"run:{r.id}" for r in store.runs()]
    assert sorted(ids) == sorted(stored) and len(set(ids)) == trials  # one stored run per trial, none twice
    logs = [p.read_text() for p in tmp_path.glob("runs/tune-workers-*/worker-*.out")]
    ran = [int(log.split(" counted trials, ")[1].split(" run here")[0]) for log in logs]
    assert len(ran) == workers and sum(ran) == trials and min(ran) >= 1, logs  # every worker took a share
    # They ran side by side: some trials of different workers overlapped in time.
    spans = sorted((t.datetime_start, t.datetime_complete) for t in counted)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), spans
