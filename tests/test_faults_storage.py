"""Storage faults, for real: the results/study database lost in the middle of a campaign and of a tuning
study (PostgreSQL refusing connections: `ALLOW_CONNECTIONS false` + every backend terminated), and at the
start of a study; recovery is running the same command again once the database answers. Nothing is
written half, nothing is lost, nothing is counted twice.

Related tests elsewhere: tests/test_campaign_resume.py (a campaign whose database is unreachable at the
start stops before running anything; Ctrl-C and resume), tests/test_store.py (ingest is one transaction).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import yaml

from campaigns.store import open_store
from tuners.study import RECORD_IDS, RETRY_OF, is_counted

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[1]
COMMCAMP = Path(sys.executable).with_name("commcamp")
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1", "COLUMNS": "200"}
STUDY = "local/local:cpu/openmpi-4.1.4/allreduce/mpi/all/n1/g1"


@contextmanager
def database_refusing(url: str) -> Iterator[None]:
    """The database refuses every connection (as during maintenance or after a failover) until the block ends."""
    name = sqlalchemy.make_url(url).database
    admin = sqlalchemy.create_engine(sqlalchemy.make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        connection.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
        try:
            yield
        finally:
            connection.exec_driver_sql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
    admin.dispose()


def wait_for(predicate, what: str, proc: subprocess.Popen[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"{what}: the command ended first ({proc.returncode})"
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


CAMPAIGN = """\
name: dbloss
site: local
environments: [openmpi]
node_counts: [1]
checks:
  - check: commbench_run
    ops: [pingpong, allreduce]
    sizes: [8, 1024]
    warmup: 1
    iters: 4
    timeout_s: 30
"""


def test_database_lost_mid_campaign_then_resumed(tmp_path: Path, postgres_url: str) -> None:
    spec = tmp_path / "dbloss.yaml"
    spec.write_text(CAMPAIGN)
    cmd = [str(COMMCAMP), "run", str(spec), "--db", postgres_url, "--runs-dir", str(tmp_path / "runs")]
    output = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "COLUMNS": "200"}) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if " OK " in line and "commbench_run" in line:  # stored before shown: now take the database away
                break
        with database_refusing(postgres_url):
            output.append(proc.stdout.read())
            code = proc.wait(timeout=300)
    text = "".join(output)
    assert code == 1, text
    assert "1 test case(s) could not be stored" in text and "not currently accepting connections" in text
    assert "stored when it finished, but its job id and times could not be added" in text
    runs_dir = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert len(list(runs_dir.glob("rfm-1/output/**/commbench.jsonl"))) == 2  # measured: kept on disk
    with open_store(postgres_url) as store:
        stored = store.runs()
        frame = store.measurements()
    assert len(stored) == 1 and stored[0].status == "pass"  # the case stored before the loss, whole
    assert len(frame) == 2

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False,
                           env={**os.environ, "COLUMNS": "200"})
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Running 1 of 2 test case(s)" in again.stdout
    with open_store(postgres_url) as store:
        stored = store.runs()
        frame = store.measurements()
    assert sorted(r.parameters["op"] for r in stored) == ["allreduce", "pingpong"]
    assert len(frame) == 2 * 2 and frame.groupby("run_id").size().eq(2).all()  # no case twice, none half


def tune_spec(tmp_path: Path, db: str, trials: int) -> Path:
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({
        "site": "local", "system": "local:cpu", "library": "openmpi", "library_version": "4.1.4",
        "op": "allreduce", "nodes": 1, "tasks_per_node": 2, "sizes": [1024, 65536], "sizes_per_bucket": 1,
        "iters": 3, "warmup": 1, "knobs": ["OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf"],
        "trials": trials, "heartbeat_s": 1, "executor": "launcher",
        "launcher": ["mpirun.openmpi", "-np", "2", "--bind-to", "none"], "db": db, "publish_dir": None,
        "finalize": {"enabled": False}, "runs_dir": str(tmp_path / "runs"), "study": STUDY}))
    return spec


def test_study_database_unreachable_at_start(tmp_path: Path) -> None:
    spec = tune_spec(tmp_path, "postgresql+psycopg://tuner:secret@127.0.0.1:1/study", 3)
    result = subprocess.run([str(COMMCAMP), "tune", str(spec)], capture_output=True, text=True, timeout=120,
                            check=False, env={**os.environ, **OMPI_ENV})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot use the study storage postgresql+psycopg://tuner:***@127.0.0.1:1/study" in result.stderr
    assert "Connection refused" in result.stderr and "Traceback" not in result.stderr
    assert "secret" not in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()  # no trial ran


def test_database_lost_mid_study_then_resumed(tmp_path: Path, postgres_url: str) -> None:
    trials = 8
    spec = tune_spec(tmp_path, postgres_url, trials)
    cmd = [str(COMMCAMP), "tune", str(spec)]
    env = {**os.environ, **OMPI_ENV}
    storage = optuna.storages.RDBStorage(postgres_url)

    def mid_trial() -> bool:  # some trials counted, one running
        try:
            found = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
        except KeyError:
            return False
        return sum(map(is_counted, found)) >= 2 and any(t.state.name == "RUNNING" for t in found)

    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        wait_for(mid_trial, "a trial running after two counted", proc)
        storage.engine.dispose()
        with database_refusing(postgres_url):
            output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, output
    # PostgreSQL's words depend on when the loss meets the connection: refused, or cut in its middle
    assert "study stopped: " in output and ("not currently accepting connections" in output
                                            or "terminating connection due to administrator command" in output), output
    assert "run the same command again" in output and "Traceback" not in output

    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    study = optuna.load_study(study_name=STUDY, storage=postgres_url)
    counted = [t for t in study.trials if is_counted(t)]
    assert len(counted) == trials and all(t.state.name == "COMPLETE" for t in counted)
    # The trial the loss interrupted never counts; its setting was measured again (retry_of).
    assert [t for t in study.trials if not is_counted(t)] and any(RETRY_OF in t.user_attrs for t in study.trials)
    ids = [i for t in counted for i in t.user_attrs[RECORD_IDS]]
    with open_store(postgres_url) as store:
        stored = {f"run:{run.id}" for run in store.runs()}
    assert len(ids) == len(set(ids)) == trials and set(ids) <= stored  # one stored run per counted trial
    assert len(stored) <= trials + 1  # at most the interrupted trial's run besides them


@contextmanager
def small_tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A real filesystem of `size` at `path` (tmpfs; needs root), unmounted afterwards."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def fill(directory: Path) -> None:
    """Write until the filesystem says it is full."""
    with open(directory / "ballast", "wb") as ballast:
        try:
            while True:
                ballast.write(b"\0" * 65536)
                ballast.flush()
                os.fsync(ballast.fileno())
        except OSError as exc:
            assert exc.errno == 28, exc  # ENOSPC


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_read_only_workspace_can_be_queried(tmp_path: Path) -> None:
    """A site's results on a read-only mount (or a workspace this user cannot write): a database in WAL mode is
    read through its -shm file, which no closed database leaves behind and none can be made there; every query
    failed with "unable to open database file". It is read as it stands; a command that writes still fails."""
    from fixtures_cli import commcamp_output
    from fixtures_store import commbench_record, run_info, write_jsonl

    with small_tmpfs(tmp_path / "workspace") as workspace:
        db = f"sqlite:///{workspace / 'commcamp.db'}"
        with open_store(db) as store:
            store.ingest(run_info(), [commbench_record()])
        assert sorted(p.name for p in workspace.iterdir()) == ["commcamp.db"]  # WAL, checkpointed at close
        old_run = workspace / "runs" / "smoke-20260101T020000Z"
        old_run.mkdir(parents=True)
        (old_run / ".in-use").write_text("")
        os.utime(old_run / ".in-use", (1e9, 1e9))
        subprocess.run(["mount", "-o", "remount,ro", str(workspace)], check=True)
        # prune said "delete ...", then "[Errno 30] Read-only file system: '.in-use'", exit 1
        code, output = commcamp_output("results", "prune", "--runs-dir", workspace / "runs", "--keep-days", "0",
                                       "--db", db, "--yes")
        assert code == 2 and f"{workspace / 'runs'} is not writable: nothing can be deleted there" in " ".join(
            output.split()) and "Errno" not in output, output
        assert old_run.is_dir()
        code, output = commcamp_output("results", "runs", "--db", db)
        assert code == 0 and "smoke/site-a/sys:cpu/gnu/AllreduceCheck/n2" in output, output
        code, output = commcamp_output("report", "--db", db, "-o", tmp_path / "report.html")
        assert code == 0 and (tmp_path / "report.html").is_file(), output
        records = write_jsonl(tmp_path / "more.jsonl", [commbench_record(size=2048)])
        code, output = commcamp_output("results", "ingest", records, "--site", "local", "--system", "local", "--db", db)
        assert code == 2 and "Traceback" not in output, output
        assert f"unable to open database file: this command writes to it, and {workspace} is not writable" in output
        # a rollback journal left by a writer that died mid-transaction: only a writer can roll it back, and read
        # as it stands the database shows the half-done change (a DELETE read as "0 measurements")
        subprocess.run(["mount", "-o", "remount,rw", str(workspace)], check=True)
        (workspace / "commcamp.db-journal").write_bytes(b"\0" * 512)
        subprocess.run(["mount", "-o", "remount,ro", str(workspace)], check=True)
        code, output = commcamp_output("results", "runs", "--db", db)
        assert code == 2 and "unable to open database file" in output, output


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_full_or_read_only_results_directory_keeps_the_published_files(tmp_path: Path) -> None:
    """Recommendation files are published into a 1 MiB filesystem; then it is full (the publish after the
    trials fails, exit 1), then read-only (refused before any run: --publish-dir takes no file, exit 2): each
    message names the problem, and the published files stay as they were."""
    with small_tmpfs(tmp_path / "results") as results:
        spec = tune_spec(tmp_path, f"sqlite:///{tmp_path / 'study.db'}", 2)
        document = yaml.safe_load(spec.read_text())
        document.update(publish_dir=str(results / "recommendations"),
                        finalize={"candidates": 1, "max_candidates": 1, "alpha": 0.4, "rounds": 2})
        spec.write_text(yaml.safe_dump(document))
        cmd = [str(COMMCAMP), "tune", str(spec)]
        env = {**os.environ, **OMPI_ENV}
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        published = snapshot(results / "recommendations")
        assert any(name.endswith("recommendations.yaml") for name in published)

        fill(results)
        full = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
        assert full.returncode == 1, full.stdout + full.stderr
        assert "No space left on device" in full.stderr and "files written earlier are unchanged" in full.stderr
        assert str(results / "recommendations") in full.stderr and "Traceback" not in full.stderr
        assert snapshot(results / "recommendations") == published  # intact, and no temp file left behind

        (results / "ballast").unlink()
        subprocess.run(["mount", "-o", "remount,ro", str(results)], check=True)
        read_only = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
        assert read_only.returncode == 2, read_only.stdout + read_only.stderr
        assert "--publish-dir" in read_only.stderr and "Read-only file system" in read_only.stderr
        assert "Traceback" not in read_only.stderr and "trials:" not in read_only.stdout  # nothing ran
        assert snapshot(results / "recommendations") == published
