"""campaigns.store: round trip, filters, all-or-nothing ingest, duplicate keys, schema versioning, reachability."""
from __future__ import annotations

import multiprocessing
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import pandas
import pytest
import sqlalchemy
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fixtures_store import commbench_record, error_record, run_info, sqlite_only

from campaigns.model.records import RecordError
from campaigns.store import Store, StoreError, default_url, open_store, records_digest
from campaigns.store.migrate import VERSION_TABLE, current_revision, head_revision
from campaigns.store.models import Base

Counts = Callable[[], dict[str, int]]


def test_round_trip(store: Store) -> None:
    records = [commbench_record(op="allreduce", size=size, seed=size, iters=16) for size in (8, 4096, 1 << 20)]
    records.append(commbench_record(op="pingpong", transport="mpi-p2p", pair={"src": 0, "dst": 3},
                                    direction="bi", host_memory="pinned", future_field={"added": "later"}))
    records.append(error_record())
    started = datetime(2026, 3, 1, 11, 59, tzinfo=UTC)
    run = run_info(started_at=started, finished_at=datetime(2026, 3, 1, 12, 6, tzinfo=UTC), job_id="4711")
    run_id = store.ingest(run, records)

    [stored_run] = store.runs()
    assert stored_run.id == run_id
    assert (stored_run.run_key, stored_run.campaign, stored_run.site, stored_run.system, stored_run.partition,
            stored_run.environ, stored_run.check_name, stored_run.parameters, stored_run.num_nodes,
            stored_run.num_tasks, stored_run.status, stored_run.job_id, stored_run.started_at) == (
        run.run_key, run.campaign, run.site, run.system, run.partition, run.environ, run.check_name,
        run.parameters, run.num_nodes, run.num_tasks, run.status, run.job_id, started)
    assert stored_run.num_measurements == len(records)
    assert stored_run.username and stored_run.submit_host == socket.gethostname()
    assert stored_run.created_at.tzinfo is UTC

    frame = store.measurements()
    assert len(frame) == len(records)
    for row, record in zip(frame.to_dict("records"), records, strict=True):
        assert row["run_id"] == run_id and row["site"] == run.site and row["run_key"] == run.run_key
        for name in ("kind", "op", "transport", "backend", "valid", "ranks", "nodes", "hostnames", "mpi_library",
                     "env", "commbench_version", "error", "reason"):
            assert row[name] == record[name] if record[name] is not None else pandas.isna(row[name]), name
        assert row["timestamp"] == datetime.fromisoformat(record["timestamp"])
        if record["kind"] == "result":
            for name in ("bytes", "count", "iters", "warmup", "latency_us", "goodput_gbs", "busbw_gbs", "check"):
                assert row[name] == record[name], name
            assert {name: row[name] for name in record["stats"]} == record["stats"]
            assert store.samples(row["measurement_id"]) == record["samples_us"]
        else:
            assert store.samples(row["measurement_id"]) == []
    pingpong = frame[frame.op == "pingpong"].iloc[0]
    assert (pingpong.pair_src, pingpong.pair_dst, pingpong.direction, pingpong.host_memory) == (0, 3, "bi", "pinned")
    assert pingpong.extra == {"future_field": {"added": "later"}}

    arrays = store.sample_arrays(op="allreduce")
    assert sorted(arrays) == sorted(frame[frame.op == "allreduce"].measurement_id)
    for measurement_id, samples in arrays.items():
        assert samples.dtype == np.dtype("<f8")
        assert np.median(samples) == frame.set_index("measurement_id").loc[measurement_id, "median_us"]


def test_samples_of_unknown_measurement(store: Store) -> None:
    with pytest.raises(StoreError, match="no measurement 99"):
        store.samples(99)


def _two_sites(store: Store) -> None:
    store.ingest(run_info("a", site="site-a", campaign="nightly"), [
        commbench_record(op="allreduce", size=1024, timestamp="2026-03-01T12:00:00Z"),
        commbench_record(op="allreduce", size=1 << 20, timestamp="2026-03-01T12:01:00Z"),
        commbench_record(op="pingpong", size=8, timestamp="2026-03-01T12:02:00Z", valid=False, wrong_elements=3)])
    store.ingest(run_info("b", site="site-b", system="other", partition="gpu", status="fail"), [
        commbench_record(op="allreduce", transport="nccl", backend="cuda", size=1024,
                         timestamp="2026-03-05T08:00:00Z"),
        error_record(timestamp="2026-03-05T08:10:00Z")])


@pytest.mark.parametrize(("filters", "expected"), [
    ({}, 5),
    ({"site": "site-a"}, 3),
    ({"site": ["site-a", "site-b"]}, 5),
    ({"system": "other", "partition": "gpu"}, 2),
    ({"campaign": "nightly"}, 3),
    ({"op": "allreduce"}, 3),
    ({"op": "allreduce", "transport": "nccl"}, 1),
    ({"backend": "cuda"}, 1),
    ({"bytes": 1024}, 2),
    ({"min_bytes": 1024, "max_bytes": 1 << 19}, 2),
    ({"min_bytes": 1 << 20}, 2),  # the 1 MiB allreduce and the 1 MiB alltoall error record
    ({"valid": True}, 3),
    ({"valid": False}, 2),
    ({"since": date(2026, 3, 5)}, 2),
    ({"until": date(2026, 3, 1)}, 3),
    ({"since": datetime(2026, 3, 1, 12, 1, tzinfo=UTC), "until": datetime(2026, 3, 1, 12, 2, tzinfo=UTC)}, 2),
    ({"run_id": 2}, 2),
    ({"site": "nowhere"}, 0),
])
def test_measurement_filters(store: Store, filters: dict[str, object], expected: int) -> None:
    _two_sites(store)
    frame = store.measurements(**filters)
    assert len(frame) == expected
    assert len(store.sample_arrays(**filters)) == int((frame.kind == "result").sum())


def test_dates_and_naive_times_are_local(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: 2026-03-01T12:00Z is 02:00 on 2 March there
    time.tzset()
    try:
        _two_sites(store)
        assert len(store.measurements(until=date(2026, 3, 1))) == 0
        assert len(store.measurements(until=date(2026, 3, 2))) == 3
        assert len(store.measurements(since=date(2026, 3, 5))) == 2
        assert len(store.measurements(since=datetime(2026, 3, 5, 22, 5))) == 1  # 08:05Z
    finally:
        monkeypatch.undo()
        time.tzset()


def test_run_filters(store: Store) -> None:
    _two_sites(store)
    assert [run.run_key for run in store.runs(status="pass")] == ["a"]
    assert [run.run_key for run in store.runs(site="site-b")] == ["b"]
    assert [run.num_measurements for run in store.runs()] == [3, 2]
    assert store.runs(campaign="nope") == []
    with pytest.raises(TypeError, match="colour"):
        store.runs(colour="red")


def test_run_key_lookups(store: Store) -> None:
    """By key and by key prefix (the health check's series lookups): LIKE's wildcards in a key are literal,
    and a prefix is case-sensitive on every backend (SQLite's LIKE is not)."""
    keys = ["h/s/2n/ab_c@n1", "h/s/2n/ab_c/x+y@n1", "h/s/2n/abXc@n1", "h/s/2n/ab%c@n1", "h/s/4n/ab_c@n1",
            "h/s/2n/AB_C@n1"]
    for key in keys:
        store.ingest(run_info(key), [commbench_record()], validated=True)
    assert [run.run_key for run in store.runs(run_key="h/s/2n/ab_c@n1")] == ["h/s/2n/ab_c@n1"]
    assert [run.run_key for run in store.runs(run_key_prefix="h/s/2n/ab_c")] == keys[:2]
    assert [run.run_key for run in store.runs(run_key_prefix="h/s/2n/ab%")] == ["h/s/2n/ab%c@n1"]
    assert store.runs(run_key_prefix="h/s/8n") == []


def test_has_run_only_for_passed_runs(store: Store) -> None:
    _two_sites(store)
    assert store.has_run("a")
    assert not store.has_run("b")  # stored, but failed: a campaign re-runs it
    assert not store.has_run("c")


def test_duplicate_run_key(store: Store, table_counts: Counts) -> None:
    first = store.ingest(run_info("k"), [commbench_record(seed=1), commbench_record(seed=2)])
    before = table_counts()
    with pytest.raises(StoreError, match="run 'k' is already stored"):
        store.ingest(run_info("k"), [commbench_record(seed=3)])
    assert table_counts() == before
    second = store.ingest(run_info("k", status="fail", reason="rerun"), [commbench_record(seed=3)], replace=True)
    assert second != first
    [run] = store.runs()
    assert (run.id, run.status, run.reason, run.num_measurements) == (second, "fail", "rerun", 1)
    assert table_counts() == {"runs": 1, "measurements": 1, "samples": 1}  # old rows deleted, not orphaned


def test_a_new_attempt_never_deletes_a_passed_run(store: Store) -> None:
    passed = store.ingest(run_info("k"), [commbench_record(seed=1)])
    failed = store.ingest(run_info("k", status="fail", reason="cannot allocate"), [], new_attempt=True)
    assert [(r.id, r.status) for r in store.runs()] == [(passed, "pass"), (failed, "fail")]
    assert store.has_run("k")
    # A further attempt replaces the failed one only; the same attempt stored again replaces itself.
    early = store.ingest(run_info("k"), [commbench_record(seed=2)], new_attempt=True)
    final = store.ingest(run_info("k"), [commbench_record(seed=2)], new_attempt=True, replaces_run=early)
    assert [(r.id, r.status) for r in store.runs()] == [(passed, "pass"), (final, "pass")]
    # The records' digest finds the same records stored under another key.
    [run] = store.runs(records_digest=records_digest([commbench_record(seed=1)]))
    assert run.id == passed


@pytest.mark.parametrize("bad", [
    commbench_record(bytes="1024"),
    {key: value for key, value in commbench_record().items() if key != "stats"},
    commbench_record(iters=2, samples_us=[1.0, 2.0, -1.0]),
])
def test_ingest_refuses_a_bad_record_and_stores_nothing(store: Store, table_counts: Counts,
                                                        bad: dict[str, object]) -> None:
    store.ingest(run_info("earlier"), [commbench_record()])
    before = table_counts()
    with pytest.raises(RecordError, match=r"record 2 of run 'k'"):
        store.ingest(run_info("k"), [commbench_record(seed=1), commbench_record(seed=2), bad])
    assert table_counts() == before


_REFUSE_SEVEN_SAMPLES = {  # a trigger that fails the samples INSERT of a measurement with 7 samples
    "sqlite": ["CREATE TRIGGER refuse_seven BEFORE INSERT ON samples WHEN NEW.count = 7 "
               "BEGIN SELECT RAISE(ABORT, 'disk says no'); END"],
    "postgresql": ["CREATE FUNCTION refuse_seven() RETURNS trigger AS $$ BEGIN IF NEW.count = 7 THEN "
                   "RAISE EXCEPTION 'disk says no'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
                   "CREATE TRIGGER refuse_seven BEFORE INSERT ON samples FOR EACH ROW EXECUTE FUNCTION refuse_seven()"],
}


def _refuse_seven_samples(store: Store) -> None:
    with store.engine.begin() as connection:
        for statement in _REFUSE_SEVEN_SAMPLES[store.engine.dialect.name]:
            connection.exec_driver_sql(statement)


def test_database_failure_mid_ingest_rolls_everything_back(store: Store, table_counts: Counts) -> None:
    store.ingest(run_info("earlier"), [commbench_record()])
    before = table_counts()
    _refuse_seven_samples(store)  # a real failure of the last INSERT of the transaction
    with pytest.raises(StoreError, match="disk says no"):
        store.ingest(run_info("k"), [commbench_record(iters=8), error_record(), commbench_record(iters=7)])
    assert table_counts() == before
    assert not store.has_run("k")


def test_replace_that_fails_keeps_the_old_run(store: Store, table_counts: Counts) -> None:
    store.ingest(run_info("k"), [commbench_record()])
    before = table_counts()
    _refuse_seven_samples(store)
    with pytest.raises(StoreError):
        store.ingest(run_info("k"), [commbench_record(iters=7)], replace=True)
    assert table_counts() == before
    assert store.has_run("k")


def test_run_without_records(store: Store) -> None:
    run_id = store.ingest(run_info("k", status="error", reason="job did not start"), [])
    assert store.runs()[0].id == run_id and store.runs()[0].num_measurements == 0
    assert store.measurements().empty and list(store.measurements().columns)[:3] == ["measurement_id", "run_id",
                                                                                     "run_key"]


def test_fresh_database_is_at_head(store: Store) -> None:
    with store.engine.connect() as connection:
        assert current_revision(connection) == head_revision()


@sqlite_only
def test_sqlite_uses_wal_and_foreign_keys(store: Store) -> None:
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_sqlite_on_a_network_filesystem_keeps_its_rollback_journal(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """WAL needs every process on one host (its index is shared memory): a results database on NFS or Lustre, which
    jobs on several nodes write (pretune in every job), stays in SQLite's rollback-journal mode."""
    from campaigns.store import on_network_filesystem
    from campaigns.store.store import filesystem_type

    mounts = ("/dev/vda1 / ext4 rw 0 0\nserver:/export /scratch nfs4 rw 0 0\n"
              "lfs@o2ib:/fs /scratch/lustre lustre rw 0 0\n/dev/vdb /scratch\\040local ext4 rw 0 0\n")
    assert filesystem_type(Path("/scratch/me/db"), mounts) == "nfs4"
    assert filesystem_type(Path("/scratch/lustre/me"), mounts) == "lustre"
    assert filesystem_type(Path("/scratchy/db"), mounts) == "ext4"
    assert filesystem_type(Path("/scratch local/db"), mounts) == "ext4"
    url = f"sqlite:///{tmp_path / 'results.db'}"
    assert on_network_filesystem(url) is None and on_network_filesystem("postgresql://h/db") is None
    monkeypatch.setattr("campaigns.store.store.filesystem_type", lambda path, mounts=None: "nfs4")
    assert on_network_filesystem(url) == "nfs4"
    with open_store(url).engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"


def test_models_match_migrations(store: Store) -> None:
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        assert compare_metadata(context, Base.metadata) == []


def _open_and_ingest(url: str, writer: int) -> None:
    with open_store(url) as store:
        for run in range(3):
            store.ingest(run_info(f"writer{writer}/run{run}"), [commbench_record(seed=n, iters=50) for n in range(10)])


def test_concurrent_writers_on_a_fresh_database(store_url: str) -> None:
    # Campaign jobs finishing together: all create/upgrade the schema at once, then write at once.
    with multiprocessing.get_context("fork").Pool(3) as pool:
        pool.starmap(_open_and_ingest, [(store_url, writer) for writer in range(3)])
    with open_store(store_url) as store:
        assert len(store.runs()) == 9 and len(store.measurements()) == 90


def test_opening_waits_for_a_writer_of_a_fresh_database_instead_of_failing_at_once(tmp_path: Path) -> None:
    # SQLite answers "database is locked" at once, busy timeout or not, when a connection switches a
    # rollback-journal database to WAL while another holds its write lock: the concurrent-writers test above
    # failed so 5 times in 300 before open_store retried it.
    path = tmp_path / "results.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE studies (x)")  # as tune's Optuna storage would (another program's file is refused)
    writer.execute("CREATE TABLE version_info (x)")
    commit = threading.Timer(0.3, writer.execute, ("COMMIT",))
    commit.start()
    started = time.monotonic()
    try:
        with open_store(f"sqlite:///{path}") as store:
            assert store.runs() == []
    finally:
        commit.join()
        writer.close()
    assert time.monotonic() - started >= 0.25


def test_reopen_keeps_data(store_url: str) -> None:
    with open_store(store_url) as store:
        store.ingest(run_info("k"), [commbench_record()])
    with open_store(store_url) as store:
        assert store.has_run("k")


@pytest.mark.parametrize("create", [True, False], ids=["writing", "read-only"])
def test_newer_schema_is_refused(store_url: str, create: bool) -> None:
    open_store(store_url).close()
    engine = sqlalchemy.create_engine(store_url)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE store_alembic_version SET version_num = '9999_from_the_future'")
    engine.dispose()
    with pytest.raises(StoreError, match="schema revision '9999_from_the_future', newer than this commcamp"):
        open_store(store_url, create=create)


def test_missing_directory_is_unreachable(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"/no/such is not a directory"):
        open_store(f"sqlite:///{tmp_path}/no/such/results.db")


def test_unwritable_directory_is_unreachable() -> None:
    # /proc takes no new files, not even from root (a chmod'ed directory would not stop root)
    with pytest.raises(StoreError, match=r"cannot open results database sqlite:////proc/commcamp-results\.db: "
                                         r"unable to open database file"):
        open_store("sqlite:////proc/commcamp-results.db")


def test_file_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "results.db").write_text("not SQLite at all, just text " * 100)
    with pytest.raises(StoreError, match="file is not a database"):
        open_store(f"sqlite:///{tmp_path}/results.db")


def test_postgresql_on_a_closed_port_fails_fast() -> None:
    with socket.socket() as probe:  # a port nobody listens on: bind, read the number, close
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(StoreError, match=rf"cannot open results database postgresql\+psycopg://commcamp:\*\*\*@"
                                         rf"127\.0\.0\.1:{port}/results: .*refused"):
        open_store(f"postgresql+psycopg://commcamp:secret@127.0.0.1:{port}/results")
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(("url", "message"), [
    ("not a url", "invalid database URL"),
    ("nosuchdb://host/db", "cannot use results database"),
])
def test_unusable_url(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        open_store(url)


def test_default_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a checkout the database is its results/commcamp.db; a workspace ($COMMCAMP_HOME) moves it; the
    URL variable wins over both."""
    monkeypatch.delenv("COMMCAMP_DB_URL", raising=False)
    monkeypatch.delenv("COMMCAMP_HOME", raising=False)
    repo = Path(__file__).resolve().parents[1]
    assert default_url() == f"sqlite:///{repo}/results/commcamp.db"
    monkeypatch.setenv("COMMCAMP_HOME", "/srv/commcamp")
    assert default_url() == "sqlite:////srv/commcamp/commcamp.db"
    monkeypatch.setenv("COMMCAMP_DB_URL", "sqlite:////elsewhere.db")
    assert default_url() == "sqlite:////elsewhere.db"


def test_store_and_optuna_share_one_database(tmp_path: Path) -> None:
    """The tuner keeps its Optuna study in the results database: both schemas must coexist, in either order."""
    from tuners.study import open_storage

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    open_store(url).close()
    open_storage(url, heartbeat_interval=None).get_all_studies()
    store = open_store(url)
    assert store.runs() == []
    store.close()


def _revisions_oldest_first() -> list[tuple[str, str | None]]:
    """(revision, the revision it upgrades from) of every store migration, oldest first."""
    from campaigns.store.migrate import _script

    return [(rev.revision, rev.down_revision) for rev in reversed(list(_script().walk_revisions()))]


def _rows_per_table(connection: sqlalchemy.Connection) -> dict[str, list[tuple[object, ...]]]:
    return {table: sorted(tuple(row) for row in connection.exec_driver_sql(
        f"SELECT {columns} FROM {table}").all())
        for table, columns in (("runs", "id, run_key, status"), ("measurements", "id, run_id, seq, op, bytes"),
                               ("samples", "measurement_id, count, data"))}


@pytest.mark.parametrize("revision", [rev for rev, down in _revisions_oldest_first() if down is not None])
def test_every_migration_keeps_every_run_measurement_and_sample(store_url: str, revision: str) -> None:
    """A database at the revision before `revision` holding runs, measurements and samples (two runs, three
    measurements, samples packed as the store packs them) keeps every row through open_store's upgrade, which
    runs `revision` and every later one. 0001 -> 0002 on SQLite emptied measurements and samples: batch mode rebuilt
    `runs` (DROP TABLE) with foreign keys on, and ON DELETE CASCADE deleted their rows."""
    from alembic import command

    from campaigns.store.migrate import alembic_config
    from campaigns.store.store import pack_samples

    down = dict(_revisions_oldest_first())[revision]
    engine = sqlalchemy.create_engine(store_url)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), down)
        tables = {name: sqlalchemy.Table(name, sqlalchemy.MetaData(), autoload_with=connection)
                  for name in ("runs", "measurements", "samples")}
        for run_id in (1, 2, 3):
            connection.execute(tables["runs"].insert(), {
                "id": run_id, "run_key": f"k{run_id}", "campaign": "c", "site": "s", "system": "sys",
                "partition": "p", "environ": "e", "check_name": "chk", "parameters": {}, "num_nodes": 1,
                "num_tasks": 2, "status": "pass", "created_at": datetime(2026, 1, 1)})
        connection.execute(tables["runs"].delete().where(tables["runs"].c.id == 3))  # its id is never given again
        for measurement_id, run_id in ((1, 1), (2, 1), (3, 2)):
            connection.execute(tables["measurements"].insert(), {
                "id": measurement_id, "run_id": run_id, "seq": measurement_id, "schema_version": 1, "kind": "result",
                "op": "allreduce", "transport": "mpi", "backend": "cpu", "bytes": 8 * measurement_id, "valid": True,
                "ranks": 2, "nodes": 1, "hostnames": ["n1", "n1"], "mpi_library": "", "env": {},
                "commbench_version": "x", "timestamp": datetime(2026, 1, 1)})
            connection.execute(tables["samples"].insert(), {
                "measurement_id": measurement_id, "count": 3, "data": pack_samples([1.0, 2.0, float(measurement_id)])})
        before = _rows_per_table(connection)
    engine.dispose()
    with open_store(store_url) as store:  # upgraded through `revision` to head, as commcamp does
        with store.engine.connect() as connection:
            assert _rows_per_table(connection) == before
            assert current_revision(connection) == head_revision()
        assert store.samples(3) == [1.0, 2.0, 3.0]
        if store_url.startswith("sqlite"):  # enforced again once migrated: deleting a run deletes its children
            with store.engine.begin() as connection:
                assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
                connection.exec_driver_sql("DELETE FROM runs WHERE id = 1")
            assert len(store.measurements()) == 1
            # the highest id given is kept: a rebuilt table went on from the largest id left (2), run 3 again
            assert store.ingest(run_info("new"), [commbench_record()]) == 4


@sqlite_only
def test_a_migration_that_would_leave_dangling_rows_is_refused_and_rolled_back(store_url: str) -> None:
    """PRAGMA foreign_key_check after the upgrade: a measurement of a run that does not exist (possible in a
    0001 database written with foreign keys off) fails the migration, naming it; the database stays at 0001."""
    from alembic import command

    from campaigns.store.migrate import alembic_config

    engine = sqlalchemy.create_engine(store_url)  # no commcamp hooks: foreign keys off
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0001")
        connection.exec_driver_sql(
            "INSERT INTO measurements (run_id, seq, schema_version, kind, op, transport, backend, valid, ranks, nodes, "
            "hostnames, mpi_library, env, commbench_version, timestamp) VALUES (42, 0, 1, 'result', 'allreduce', "
            "'mpi', 'cpu', 1, 2, 1, '[]', '', '{}', 'x', '2026-01-01 00:00:00')")
    with pytest.raises(StoreError, match=r"1 row\(s\) pointing at rows that do not exist \(measurements row 1 -> "
                                         r"runs\); nothing was changed"):
        open_store(store_url)
    with engine.connect() as connection:
        assert current_revision(connection) == "0001"
        assert connection.exec_driver_sql("SELECT count(*) FROM measurements").scalar() == 1
    engine.dispose()


def _tables(url: str) -> set[str]:
    engine = sqlalchemy.create_engine(url)
    try:
        return set(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_read_only_open_refuses_a_database_that_is_not_a_store_and_writes_nothing(store_url: str) -> None:
    """open_store(create=False), the commands that only read, migrated whatever database it was given: commcamp's
    tables landed in another program's database (ReFrame's results.db), or in an empty file. It refuses one without
    store_alembic_version and creates nothing; a store then opens read-only as it is."""
    engine = sqlalchemy.create_engine(store_url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE sessions (uuid TEXT PRIMARY KEY)")
    engine.dispose()
    with pytest.raises(StoreError, match=r"is not a commcamp results store \(it has no store_alembic_version table"):
        open_store(store_url, create=False)
    assert _tables(store_url) == {"sessions"}
    if store_url.startswith("sqlite"):  # one program's file: a command that writes refuses it too
        with pytest.raises(StoreError, match=r"is another program's SQLite database \(tables sessions; no commcamp"):
            open_store(store_url)
        assert _tables(store_url) == {"sessions"}
        return
    open_store(store_url).close()  # a server's database is the site's to share: the store is made beside
    with open_store(store_url, create=False) as store:
        assert store.runs() == []


@sqlite_only
def test_an_early_commcamp_store_is_named_as_such(store_url: str) -> None:
    """A store made before the store kept its revision in store_alembic_version (alembic_version, runs,
    measurements, samples) is not 'another program's' database: the refusal says what it is."""
    engine = sqlalchemy.create_engine(store_url)
    with engine.begin() as connection:
        for table in ("alembic_version", "runs", "measurements", "samples"):
            connection.exec_driver_sql(f"CREATE TABLE {table} (x)")
    engine.dispose()
    with pytest.raises(StoreError, match="is a results store of an early commcamp .* which this one cannot upgrade"):
        open_store(store_url)


@sqlite_only
def test_a_writing_open_adds_the_store_to_an_optuna_storage_and_an_empty_file(store_url: str) -> None:
    """`tune` keeps its Optuna study in the results store's database: a file holding only Optuna's tables (or
    nothing) is commcamp's to write."""
    from tuners.study import open_storage

    open_storage(store_url, heartbeat_interval=None).engine.dispose()
    assert {"studies", "version_info"} <= _tables(store_url)
    open_store(store_url).close()
    assert "store_alembic_version" in _tables(store_url)


@sqlite_only
def test_a_read_only_open_of_an_empty_file_changes_it_not(tmp_path: Path, store_url: str) -> None:
    path = Path(store_url.removeprefix("sqlite:///"))
    path.write_bytes(b"")
    with pytest.raises(StoreError, match="is not a commcamp results store"):
        open_store(store_url, create=False)
    assert path.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_read_only_open_of_an_older_store_says_how_to_upgrade_it(store_url: str) -> None:
    from alembic import command

    from campaigns.store.migrate import alembic_config

    engine = sqlalchemy.create_engine(store_url)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0001")
    with pytest.raises(StoreError, match=r"has schema revision '0001', older than this commcamp's '[^']+'; a command "
                                         r"that only reads does not upgrade it: a command that writes to it"):
        open_store(store_url, create=False)
    with engine.connect() as connection:
        assert current_revision(connection) == "0001"
    engine.dispose()
    open_store(store_url).close()  # the upgrade path: a command that writes
    open_store(store_url, create=False).close()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite://",
                                 "sqlite:///file::memory:?uri=true", "sqlite:///file:x?mode=memory&uri=true"])
@pytest.mark.parametrize("create", [True, False])
def test_an_in_memory_database_is_refused(url: str, create: bool) -> None:
    """`--db sqlite://` was taken: ingest said "stored run 1", and the run was gone when the command ended."""
    with pytest.raises(StoreError, match="is an in-memory SQLite database: what is stored there is lost"):
        open_store(url, create=create)
