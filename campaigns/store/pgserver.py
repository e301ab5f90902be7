"""A throwaway PostgreSQL server for tests and benchmarks: Debian's PostgreSQL (/usr/lib/postgresql/<N>/bin),
a cluster made with initdb in a temp dir (as user `postgres` when run as root: PostgreSQL refuses to run as
root), listening on 127.0.0.1 on a free port, stopped and deleted on exit. Not for production data:
fsync is off."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def server_binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)


@contextmanager
def throwaway_server() -> Iterator[str]:
    """Start a private server; yield its URL (user postgres, database postgres)."""
    bin_dir = server_binaries()
    if bin_dir is None:
        raise PostgresUnavailable("PostgreSQL server binaries not installed (Debian package postgresql)")
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    directory = Path(tempfile.mkdtemp(prefix="commcamp-pg-"))
    if run_as:
        shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"
    pg_ctl = [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data)]
    try:
        made = _run([*run_as, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed: {made.stdout}{made.stderr}")
        for _attempt in range(3):  # another process may take the free port before the server binds it
            port = _free_port()
            options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {directory} -c fsync=off "
                       f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
            started = _run([*pg_ctl, "-o", options, "-l", str(directory / "log"), "-w", "start"])
            if started.returncode == 0:
                break
        else:
            log = (directory / "log").read_text(errors="replace") if (directory / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {started.stdout}{started.stderr}\n{log}")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        _run([*pg_ctl, "-m", "immediate", "stop"])
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
