"""Fixtures of the tuner tests (tests/test_tuner*.py); the test modules import what they use."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tuners.catalog import KnobCatalog
from tuners.evaluation import Evaluation, FailureKind, SizeBucket
from tuners.scope import StudyScope


@pytest.fixture(scope="session")
def catalog() -> KnobCatalog:
    return KnobCatalog.load()


PG_URL_ENV = "COMMCAMP_TEST_PG_URL"  # a PostgreSQL server URL (role may CREATE DATABASE); else a private one


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server URL: $COMMCAMP_TEST_PG_URL, or a throwaway cluster of Debian's
    PostgreSQL started in a temp dir on a Unix socket only (run as user postgres when root)."""
    if os.environ.get(PG_URL_ENV):
        yield os.environ[PG_URL_ENV]
        return
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries not installed (Debian package postgresql)")
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    directory = Path(tempfile.mkdtemp(prefix="commcamp-pg-"))
    if run_as:
        shutil.chown(directory, "postgres", "postgres")
    data, port = directory / "data", 54000 + os.getpid() % 1000
    subprocess.run(
        [*run_as, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    options = f"-k {directory} -p {port} -c listen_addresses= -c fsync=off"
    subprocess.run(
        [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(directory / "log"), "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@/postgres?host={directory}&port={port}"
    finally:
        subprocess.run(
            [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh database on the server, dropped afterwards."""
    import sqlalchemy

    name = f"tuner_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sqlalchemy.make_url(postgres_server).set(database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    """A fresh Optuna SQLite database. On tmpfs when there is one: SQLite fsyncs every commit and
    a study commits several times per trial, which on this machine's disk is most of a test's time."""
    shm = Path("/dev/shm")
    directory = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path
    yield f"sqlite:///{directory / 'optuna.db'}"
    if directory != tmp_path:
        shutil.rmtree(directory, ignore_errors=True)


def make_scope(**fields: object) -> StudyScope:
    values: dict[str, object] = dict(
        site="testsite",
        system="gpusys",
        partition="gpu",
        library="nccl",
        library_version="2.28.3",
        op="allreduce",
        transport="ccl",
        nodes=2,
        gpus_per_node=4,
    )
    values.update(fields)
    return StudyScope.model_validate(values)


class ScriptedEvaluator:
    """Delegates to `inner`, except on the listed call numbers (1-based), where it fails as told:
    a FailureKind, or an exception instance to raise."""

    def __init__(self, inner, script: Mapping[int, FailureKind | BaseException]) -> None:
        self.inner = inner
        self.script = dict(script)
        self.calls = 0
        self.envs: list[dict[str, str]] = []

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        self.calls += 1
        self.envs.append(dict(env))
        action = self.script.get(self.calls)
        if isinstance(action, BaseException):
            raise action
        if isinstance(action, FailureKind):
            return Evaluation.failed(action, f"scripted {action.value} on call {self.calls}")
        return self.inner(env, validate=validate)


TWO_BUCKETS = (SizeBucket("small", 8, 4096), SizeBucket("large", 4097, 1 << 30))
