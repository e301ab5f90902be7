"""One PostgreSQL server for the whole test session, shared by the store, campaign and tuner tests.

`postgres_server` (session scope) yields a server URL: $COMMCAMP_TEST_PG_URL when set (a role that may
CREATE DATABASE), else a throwaway cluster of Debian's PostgreSQL (/usr/lib/postgresql/<N>/bin) made with
initdb in a temp dir (as user `postgres` when we are root: PostgreSQL refuses to run as root), listening
on 127.0.0.1 on a free port, stopped and deleted at the end. `postgres_url` gives each test a database of
its own, dropped afterwards. Where no PostgreSQL is installed the tests that need it are skipped, unless
COMMCAMP_REQUIRE_POSTGRES=1 (CI), which makes that a failure.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

PG_URL_ENV = "COMMCAMP_TEST_PG_URL"
REQUIRE_ENV = "COMMCAMP_REQUIRE_POSTGRES"


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}{result.stderr}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    if os.environ.get(PG_URL_ENV):
        yield os.environ[PG_URL_ENV]
        return
    bin_dir = _pg_bin()
    if bin_dir is None:
        reason = "PostgreSQL server binaries not installed (Debian package postgresql)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    directory = Path(tempfile.mkdtemp(prefix="commcamp-pg-"))
    if run_as:
        shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"
    pg_ctl = [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data)]
    try:
        _run([*run_as, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        for _attempt in range(3):  # another process may take the free port before the server binds it
            port = _free_port()
            options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {directory} -c fsync=off "
                       f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
            started = subprocess.run([*pg_ctl, "-o", options, "-l", str(directory / "log"), "-w", "start"],
                                     capture_output=True, text=True, check=False, timeout=120)
            if started.returncode == 0:
                break
        else:
            log = (directory / "log").read_text(errors="replace") if (directory / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {started.stdout}{started.stderr}\n{log}")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True, check=False, timeout=60)
        shutil.rmtree(directory, ignore_errors=True)


def new_database(server_url: str, prefix: str = "commcamp_test") -> str:
    """Create an empty database on the server; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    return sqlalchemy.make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(url: str) -> None:
    parsed = sqlalchemy.make_url(url)
    admin = sqlalchemy.create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE "{parsed.database}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the session's server, dropped afterwards."""
    url = new_database(postgres_server)
    try:
        yield url
    finally:
        drop_database(url)
