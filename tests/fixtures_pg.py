"""One PostgreSQL server for the whole test session, shared by the store, campaign and tuner tests.

`postgres_server` (session scope) yields a server URL: $COMMCAMP_TEST_PG_URL when set (a role that may
CREATE DATABASE), else a throwaway server (campaigns/store/pgserver.py: initdb in a temp dir as user
`postgres`, 127.0.0.1, a free port), stopped and deleted at the end. `postgres_url` gives each test a
database of its own, dropped afterwards. Where no PostgreSQL is installed the tests that need it are
skipped, unless COMMCAMP_REQUIRE_POSTGRES=1 (CI), which makes that a failure.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import sqlalchemy

from campaigns.store.pgserver import drop_database, new_database, server_binaries, throwaway_server

PG_URL_ENV = "COMMCAMP_TEST_PG_URL"
REQUIRE_ENV = "COMMCAMP_REQUIRE_POSTGRES"

__all__ = ["drop_database", "new_database", "postgres_server", "postgres_url"]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    if os.environ.get(PG_URL_ENV):
        yield os.environ[PG_URL_ENV]
        return
    if server_binaries() is None:
        reason = "PostgreSQL server binaries not installed (Debian package postgresql)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    with throwaway_server() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the session's server, dropped afterwards."""
    url = new_database(postgres_server)
    try:
        yield url
    finally:
        drop_database(url)


def socket_url(url: str) -> str:
    """The same database through PostgreSQL's unix socket: jobs on the cluster's nodes (own network
    namespaces) cannot reach the server's 127.0.0.1, but they share its filesystem."""
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as connection:
        directory = connection.exec_driver_sql("SHOW unix_socket_directories").scalar_one().split(",")[0]
        port = connection.exec_driver_sql("SHOW port").scalar_one()
    engine.dispose()
    parsed = sqlalchemy.make_url(url)
    return f"{parsed.drivername}://{parsed.username}@/{parsed.database}?host={directory}&port={port}"
