"""The results store: runs, their commbench measurements and packed per-iteration samples, in any
SQLAlchemy database (SQLite by default). Written to be portable SQL (PostgreSQL is the other target)."""
from __future__ import annotations

import dataclasses
import functools
import getpass
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from time import monotonic, sleep
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import ColumnElement, Select, create_engine, delete, event, exists, func, insert, select
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError, SQLAlchemyError

from campaigns import paths
from campaigns.model.records import validate_record
from campaigns.store.errors import StoreError, StoreUnavailable
from campaigns.store.migrate import upgrade_to_head
from campaigns.store.models import RUN_STATUSES, Measurement, Run, Sample

if TYPE_CHECKING:
    import pandas

URL_ENV = "COMMCAMP_DB_URL"
CONNECT_TIMEOUT_S = 5
SQLITE_LOCK_WAIT_S = 60  # a writer waits this long for another one (a large ingest) before giving up
SAMPLE_DTYPE = np.dtype("<f8")

# Record fields stored under the same name in `measurements`; stats, pair, samples_us and
# timestamp are mapped explicitly, and any field the schema adds later lands in `extra`.
_DIRECT_FIELDS = ("schema_version", "kind", "op", "transport", "backend", "bytes", "count", "dtype", "iters",
                  "warmup", "latency_us", "goodput_gbs", "algbw_gbs", "busbw_gbs", "busbw_factor", "valid",
                  "check", "wrong_elements", "error", "reason", "ranks", "nodes", "hostnames", "mpi_library",
                  "env", "versions", "devices", "direction", "host_memory", "commbench_version")
_STAT_FIELDS = ("min_us", "median_us", "mean_us", "p95_us", "max_us", "stdev_us")
_MAPPED_FIELDS = frozenset(_DIRECT_FIELDS) | {"stats", "pair", "samples_us", "timestamp"}


def workspace_url() -> str:
    """SQLite at <workspace>/commcamp.db (campaigns.paths)."""
    return f"sqlite:///{paths.database_path()}"


def default_url() -> str:
    """$COMMCAMP_DB_URL when set, else workspace_url()."""
    return os.environ.get(URL_ENV) or workspace_url()


def make_workspace(url: str) -> None:
    """Create the workspace when `url` is its database (workspace_url()): commcamp makes its own workspace on
    first use; a database named elsewhere must be in a directory that exists."""
    if url == workspace_url():
        try:
            paths.workspace().mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the workspace {paths.workspace()}: {exc.strerror or exc}") from None


@dataclass
class RunInfo:
    run_key: str
    campaign: str
    site: str
    system: str
    partition: str
    environ: str
    check_name: str
    parameters: dict[str, Any]
    num_nodes: int
    num_tasks: int
    status: str
    reason: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    job_id: str | None = None
    # Filled in from the calling process when None.
    username: str | None = None
    submit_host: str | None = None
    commcamp_commit: str | None = None

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"run status {self.status!r} is not one of {', '.join(RUN_STATUSES)}")
        if not self.run_key:
            raise ValueError("run_key is empty")


@dataclass(kw_only=True)
class RunRow(RunInfo):
    """A stored run: its RunInfo (user, host and commit filled in) and what the store added."""

    id: int
    created_at: datetime
    num_measurements: int
    records_digest: str | None = None


Match = str | int | Collection[str] | Collection[int] | None


def _matches(column: Any, value: Match) -> ColumnElement[bool] | None:
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return column == value
    return column.in_(list(value))


def no_measurements_message(url: str, filters: dict[str, Any]) -> str:
    """What the commands that read measurements (`results list`, `results export`, `report`) say, exit 2, when
    their filters (MeasurementFilter fields) select nothing."""
    given = {name: value for name, value in filters.items() if value not in (None, [], ())}
    return (f"no measurements in {url} match the filters"
            + (f" {json.dumps(given, default=str)}" if given else " (the database holds none)"))


def _day_bounds(since: date | datetime | None, until: date | datetime | None, column: Any
                ) -> list[ColumnElement[bool] | None]:
    """since/until are inclusive; a date means that whole day, naive values are local time."""
    def start_of(day: date) -> datetime:
        return datetime.combine(day, time()).astimezone()

    conditions: list[ColumnElement[bool] | None] = []
    if since is not None:
        conditions.append(column >= (since if isinstance(since, datetime) else start_of(since)))
    if until is not None:
        if isinstance(until, datetime):
            conditions.append(column <= until)
        else:
            conditions.append(column < start_of(until + timedelta(days=1)))
    return conditions


@dataclass(frozen=True)
class _WhereFilter:
    """Where a run ran: the filters runs and measurements share."""

    campaign: Match = None
    site: Match = None
    system: Match = None
    partition: Match = None
    environ: Match = None

    def _run_conditions(self, *more: str) -> list[ColumnElement[bool] | None]:
        names = ("campaign", "site", "system", "partition", "environ", *more)
        return [_matches(getattr(Run, name), getattr(self, name)) for name in names]


@dataclass(frozen=True)
class RunFilter(_WhereFilter):
    check_name: Match = None
    status: Match = None
    run_key: Match = None
    run_key_prefix: str | None = None
    records_digest: Match = None
    since: date | datetime | None = None  # on started_at, or created_at for runs without it
    until: date | datetime | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        conditions = self._run_conditions("check_name", "status", "run_key", "records_digest")
        if self.run_key_prefix is not None:  # LIKE narrows (SQLite's is case-insensitive), substr is exact
            prefix = self.run_key_prefix
            conditions += [Run.run_key.startswith(prefix, autoescape=True),
                           func.substr(Run.run_key, 1, len(prefix)) == prefix]
        conditions += _day_bounds(self.since, self.until, func.coalesce(Run.started_at, Run.created_at))
        return query.where(*(c for c in conditions if c is not None))


@dataclass(frozen=True)
class MeasurementFilter(_WhereFilter):
    run_id: Match = None
    op: Match = None
    transport: Match = None
    backend: Match = None
    bytes: Match = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    since: date | datetime | None = None  # on the record timestamp
    until: date | datetime | None = None
    valid: bool | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        conditions = self._run_conditions()
        conditions += [_matches(getattr(Measurement, name), getattr(self, name))
                       for name in ("run_id", "op", "transport", "backend", "bytes")]
        conditions += _day_bounds(self.since, self.until, Measurement.timestamp)
        if self.min_bytes is not None:
            conditions.append(Measurement.bytes >= self.min_bytes)
        if self.max_bytes is not None:
            conditions.append(Measurement.bytes <= self.max_bytes)
        if self.valid is not None:
            conditions.append(Measurement.valid == self.valid)
        return query.join(Run, Measurement.run_id == Run.id).where(*(c for c in conditions if c is not None))


def pack_samples(samples: list[float]) -> bytes:
    return np.asarray(samples, dtype=SAMPLE_DTYPE).tobytes()


def unpack_samples(data: bytes, count: int, measurement_id: int) -> np.ndarray:
    if len(data) != count * SAMPLE_DTYPE.itemsize:
        raise StoreError(f"samples of measurement {measurement_id} are corrupt: "
                         f"{len(data)} bytes for {count} float64 values")
    return np.frombuffer(data, dtype=SAMPLE_DTYPE)


@functools.cache
def _commcamp_commit() -> str | None:
    if paths.CHECKOUT is None:
        return None  # an installed copy: nothing to record
    try:
        out = subprocess.run(["git", "-C", str(paths.CHECKOUT), "describe", "--always", "--dirty", "--abbrev=40"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # not a git checkout (an installed copy): nothing to record
    return out.stdout.strip() or None


def _current_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no $USER, e.g. in some containers
        return None


def records_digest(records: list[dict[str, Any]]) -> str:
    """SHA-256 of a run's records (canonical JSON): the same records ingested twice have the same digest."""
    return hashlib.sha256(json.dumps(records, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _run_row(run: RunInfo) -> dict[str, Any]:
    row = {field.name: getattr(run, field.name) for field in dataclasses.fields(RunInfo)}  # not a RunRow's extras
    row["username"] = run.username or _current_user()
    row["submit_host"] = run.submit_host or socket.gethostname()
    row["commcamp_commit"] = run.commcamp_commit or _commcamp_commit()
    row["created_at"] = datetime.now(UTC)
    return row


def _measurement_row(record: dict[str, Any], seq: int) -> dict[str, Any]:
    row = {name: record.get(name) for name in _DIRECT_FIELDS}
    stats = record.get("stats") or {}
    row.update({name: stats.get(name) for name in _STAT_FIELDS})
    pair = record.get("pair") or {}
    extra = {name: value for name, value in record.items() if name not in _MAPPED_FIELDS}
    row.update(seq=seq, pair_src=pair.get("src"), pair_dst=pair.get("dst"), extra=extra or None,
               timestamp=datetime.fromisoformat(record["timestamp"]))
    return row


def _sqlite_path(url: URL) -> Path | None:
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).expanduser().absolute()


# Filesystems shared between hosts: SQLite's WAL needs its shared memory on one host (sqlite.org/wal.html)
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs",
                                 "fuse.glusterfs", "fuse.sshfs", "fuse.ceph", "9p", "pvfs2", "orangefs", "wekafs",
                                 "fuse.weka", "afs", "panfs", "davfs"})


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem `path` lies on, from /proc/mounts (or `mounts`, its text): the longest mount
    point above it; None when that cannot be read."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    best, found = -1, None
    target = str(path.absolute())
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, found = len(point), fields[2]
    return found


def on_network_filesystem(url: str | URL) -> str | None:
    """The network filesystem type (nfs, lustre, ...) a SQLite database URL's file lies on; None otherwise."""
    parsed = make_url(url)
    path = _sqlite_path(parsed) if parsed.get_backend_name() == "sqlite" else None
    kind = None if path is None else filesystem_type(path.parent)
    return kind if kind in NETWORK_FILESYSTEMS else None


def _enable_wal(cursor: Any) -> None:
    """Switch the database to WAL (a no-op once it is). While another connection holds or is taking the write
    lock of a fresh (rollback-journal) database, e.g. a campaign job creating the schema or converting it too,
    SQLite answers "database is locked" at once instead of waiting (its busy timeout does not apply to a lock
    upgrade that could deadlock): retry that for as long as a writer waits."""
    deadline = monotonic() + SQLITE_LOCK_WAIT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or monotonic() > deadline:
                raise
            sleep(0.01)


def _install_sqlite_hooks(engine: Engine, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # sqlite3 would not BEGIN before DDL, so migrations would not be atomic; on_begin does it instead.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        if wal:
            _enable_wal(cursor)
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        # Writers take the write lock up front: two writers that both started as readers would
        # otherwise deadlock on the lock upgrade and one would fail with "database is locked".
        immediate = connection.get_execution_options().get("write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _connect_to_read(path: Path) -> sqlite3.Connection:
    """A connection of a command that only reads. A database in WAL mode is read through its -shm file, which the
    first reader makes when no writer has the database open; in a workspace this user cannot write (a site's shared
    results, a read-only mount) it cannot, and SQLite answers only "unable to open database file". No -wal file
    there (nor a -journal: a writer that died mid-transaction on a rollback journal, whose pages only a writer can
    roll back): no writer has the database open, and it is read as it stands (read-only, immutable)."""
    connection = sqlite3.connect(path, timeout=SQLITE_LOCK_WAIT_S)
    try:
        connection.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # the -shm file is opened by the first read
        return connection
    except sqlite3.OperationalError:
        connection.close()
        if Path(f"{path}-wal").exists() or Path(f"{path}-journal").exists() or os.access(path.parent, os.W_OK):
            raise
    return sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True, timeout=SQLITE_LOCK_WAIT_S)


def _create_engine(url: URL, display: str, *, read_only: bool = False) -> Engine:
    connect_args: dict[str, Any] = {}
    options: dict[str, Any] = {}
    backend = url.get_backend_name()
    if backend == "sqlite":
        connect_args["timeout"] = SQLITE_LOCK_WAIT_S
        path = _sqlite_path(url)
        if path is not None and not path.parent.is_dir():
            raise StoreError(f"cannot open results database {display}: {path.parent} is not a directory")
        if path is not None and read_only:
            options["creator"] = functools.partial(_connect_to_read, path)
    elif backend == "postgresql" and "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    try:
        engine = create_engine(url, connect_args=connect_args, **options)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise StoreError(f"cannot use results database {display}: {exc}") from exc
    if backend == "sqlite":  # on a network filesystem: SQLite's rollback journal (WAL needs one host); a read-only
        # open changes no database's journal mode (switching to WAL writes the file)
        _install_sqlite_hooks(engine, wal=not read_only and on_network_filesystem(url) is None)
    return engine


def _sqlite_foreign_keys(connection: Connection, on: bool) -> None:
    """Turn SQLite's foreign key enforcement on or off on this connection. The pragma is a no-op inside a
    transaction: it goes to the driver's connection directly, before SQLAlchemy's BEGIN (on_begin)."""
    connection.connection.driver_connection.execute(f"PRAGMA foreign_keys = {'ON' if on else 'OFF'}")


def _migrate(connection: Connection, display: str) -> None:
    """Bring the schema to head in one write transaction. On SQLite with foreign keys OFF: alembic's batch mode
    rebuilds a table (a copy, DROP TABLE, rename), and a DROP TABLE of `runs` with foreign keys on deletes every
    measurement and sample through ON DELETE CASCADE; upgrade_to_head checks the keys before it commits."""
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        _sqlite_foreign_keys(connection, False)
    try:
        with connection.execution_options(write=True).begin():
            upgrade_to_head(connection, display)
    finally:
        if sqlite and not connection.invalidated:  # back to the pool: every later transaction enforces them
            _sqlite_foreign_keys(connection, True)


def display_url(url: str | URL) -> str:
    """A database URL as shown to people: its password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def in_memory_sqlite(url: str | URL) -> bool:
    """Whether `url` is an in-memory SQLite database (`sqlite://`, `sqlite:///:memory:`, a `file:` URI with
    mode=memory): gone, with everything stored in it, when the command ends."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return False
    database = parsed.database or ""
    uri = database[len("file:"):] if database.startswith("file:") else None
    return (database in ("", ":memory:") or parsed.query.get("mode") == "memory"
            or (uri is not None and (uri.split("?", 1)[0] in ("", ":memory:") or "mode=memory" in uri)))


def check_persistent(url: str) -> None:
    """StoreError for a database URL whose data would not outlive the command (in-memory SQLite)."""
    try:
        memory = in_memory_sqlite(url)
    except ArgumentError:
        return  # open_store names a URL it cannot parse
    if memory:
        raise StoreError(f"{url} is an in-memory SQLite database: what is stored there is lost when the "
                         "command ends; give a file (--db sqlite:///path/commcamp.db) or a database server")


# Optuna's study storage: `tune` keeps its trials in the results store's database (its own tables beside ours)
OPTUNA_TABLES = frozenset({"studies", "version_info"})


def foreign_sqlite_tables(url: str) -> list[str]:
    """The tables of a SQLite file at `url` that make it another program's database (ReFrame's results.db, say):
    all of its tables when it has some and none marks it as commcamp's results store (store_alembic_version) or
    an Optuna study storage; empty otherwise (no file, an empty file, a server's database: the site's to share).
    Reads the file read-only and changes nothing; a file SQLite cannot read is left to the open that names why."""
    from campaigns.store.migrate import VERSION_TABLE

    try:
        parsed = make_url(url)
    except ArgumentError:
        return []
    if parsed.get_backend_name() != "sqlite" or in_memory_sqlite(parsed) or not parsed.database:
        return []
    path = Path(parsed.database)
    if not path.is_file() or path.stat().st_size == 0:
        return []
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                      if not name.startswith("sqlite_")}
        finally:
            connection.close()
    except sqlite3.Error:
        return []
    if not tables or VERSION_TABLE in tables or OPTUNA_TABLES <= tables:
        return []
    return sorted(tables)


def foreign_database_problem(url: str, tables: list[str]) -> str:
    if {"runs", "measurements", "samples"} <= set(tables):  # before the store kept its revision in its own table
        return (f"{display_url(url)} is a results store of an early commcamp (its schema revision in alembic_version, "
                "which Optuna's studies use too), which this one cannot upgrade: nothing was written to it; read it "
                "with the commcamp that made it, or give this one another file (--db sqlite:///PATH/commcamp.db)")
    shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    return (f"{display_url(url)} is another program's SQLite database (tables {shown}; no commcamp results store or "
            "Optuna study in it): nothing was written to it; give commcamp a file of its own "
            "(--db sqlite:///PATH/commcamp.db)")


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    """Open the results database at `url` (default: default_url()). With `create` (the commands that write):
    creating it if needed and bringing its schema to the newest revision. Without it (the commands that only
    read): nothing is created or changed; a SQLite file that does not exist, a database that is not a commcamp
    results store (no store_alembic_version table: another program's, an empty file) and a store at an older
    schema revision are refused: a mistyped --db would otherwise be made, empty, and its empty answer taken
    for the results, or commcamp's tables written into another program's database. A command that writes refuses
    another program's SQLite file too (foreign_sqlite_tables); it adds the store to an empty one or to Optuna's.
    StoreUnavailable when it cannot be used: unreachable, in memory (lost when the command ends), a newer
    schema, or the refusals above."""
    try:
        return _open_store(url, create)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        raise StoreUnavailable(str(exc)) from exc


WHERE_RESULTS_ARE = "another --db, or COMMCAMP_DB_URL / --workspace, names where the results are"


def _check_readable_schema(connection: Connection, display: str) -> None:
    """A read-only open: the database must be a commcamp results store at this commcamp's schema revision;
    StoreError otherwise. Reads only (no table is created, no revision changed)."""
    from sqlalchemy import inspect

    from campaigns.store.migrate import VERSION_TABLE, _script, current_revision, head_revision

    if not inspect(connection).has_table(VERSION_TABLE):
        raise StoreError(f"{display} is not a commcamp results store (it has no {VERSION_TABLE} table: another "
                         f"program's database, or an empty one): nothing was read or changed ({WHERE_RESULTS_ARE})")
    current, head = current_revision(connection), head_revision()
    if current == head:
        return
    if current is None or current not in {rev.revision for rev in _script().walk_revisions()}:
        known = "which this commcamp does not know" if current is None else "newer than this commcamp knows"
        raise StoreError(f"results database {display} has schema revision {current!r}, {known} (head {head!r}); "
                         "update commcamp to use it")
    raise StoreError(f"results database {display} has schema revision {current!r}, older than this commcamp's "
                     f"{head!r}; a command that only reads does not upgrade it: a command that writes to it (e.g. "
                     "`commcamp run`, `commcamp results ingest`) upgrades it in place, keeping every run")


def _open_store(url: str | None, create: bool) -> Store:
    if url is None:
        url = default_url()
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"invalid database URL {url!r}: {exc}") from exc
    display = display_url(parsed)
    check_persistent(url)
    if create and (foreign := foreign_sqlite_tables(url)):  # a read-only open refuses it below: no version table
        raise StoreError(foreign_database_problem(url, foreign))
    if not create and parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        raise StoreError(f"no results database at {parsed.database}: nothing is stored there ({WHERE_RESULTS_ARE})")
    if create:
        make_workspace(url)
    engine = _create_engine(parsed, display, read_only=not create)
    try:
        with engine.connect() as connection:
            if create:
                _migrate(connection, display)
            else:
                with connection.begin():
                    _check_readable_schema(connection, display)
    except (StoreError, SQLAlchemyError) as exc:
        engine.dispose()
        if isinstance(exc, StoreError):
            raise
        reason = exc.orig if isinstance(exc, DBAPIError) else exc
        path = _sqlite_path(parsed) if parsed.get_backend_name() == "sqlite" else None
        if create and path is not None and not os.access(path.parent, os.W_OK):  # SQLite says only "unable to open"
            reason = (f"{reason}: this command writes to it, and {path.parent} is not writable here (a command that "
                      "only reads, e.g. `commcamp results runs`, can read it)")
        raise StoreError(f"cannot open results database {display}: {reason}") from exc
    return Store(engine, display)


class Store:
    """A results database at the newest schema revision. `url` is for display: its password is hidden."""

    def __init__(self, engine: Engine, display_url: str) -> None:
        self.engine = engine
        self.url = display_url

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _transaction(self, *, write: bool = False) -> Iterator[Connection]:
        try:
            with self.engine.connect() as connection, connection.execution_options(write=write).begin():
                yield connection
        except IntegrityError as exc:
            raise StoreError(f"results database {self.url} refused the write: {exc.orig}") from exc
        except DBAPIError as exc:
            raise StoreError(f"results database {self.url}: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"results database {self.url}: {exc}") from exc

    def has_run(self, run_key: str) -> bool:
        """Whether a run with this key is stored with status 'pass' (a campaign can skip it)."""
        with self._transaction() as connection:
            return bool(connection.scalar(select(exists().where(Run.run_key == run_key, Run.status == "pass"))))

    def ingest(self, run: RunInfo, records: list[dict[str, Any]], *, replace: bool = False,
               new_attempt: bool = False, replaces_run: int | None = None, validated: bool = False) -> int:
        """Store a run with all its records and samples in one transaction, or nothing; the run id.
        An existing run_key is a StoreError unless `replace`, which deletes every run of the key first, or
        `new_attempt` (a campaign's run of the test case), which adds a run to the key and deletes only its
        runs that did not pass: a passed run is never lost to a later attempt. `replaces_run`: the id of a
        run to delete first (the same attempt stored earlier, e.g. as soon as it finished).
        `validated`: the records come from campaigns.model.records (load_records, parse_records), which checked
        each of them already; checking again would double the cost of a large ingest."""
        for index, record in enumerate(records if not validated else []):
            validate_record(record, f"record {index} of run {run.run_key!r}")
        run_row = _run_row(run)
        run_row["records_digest"] = records_digest(records) if records else None
        measurement_rows = [_measurement_row(record, seq) for seq, record in enumerate(records)]
        with self._transaction(write=True) as connection:
            if replaces_run is not None:
                connection.execute(delete(Run).where(Run.id == replaces_run))  # measurements, samples cascade
            existing = connection.scalar(select(Run.id).where(Run.run_key == run.run_key))
            if existing is not None:
                if not (replace or new_attempt):
                    raise StoreError(f"run {run.run_key!r} is already stored (id {existing}); "
                                     f"store it again only as a replacement (--replace)")
                doomed = Run.run_key == run.run_key
                connection.execute(delete(Run).where(doomed, Run.status != "pass") if new_attempt and not replace
                                   else delete(Run).where(doomed))
            run_id = connection.scalar(insert(Run).returning(Run.id), run_row)
            if not measurement_rows:
                return run_id
            for row in measurement_rows:
                row["run_id"] = run_id
            ids = connection.scalars(insert(Measurement).returning(Measurement.id, sort_by_parameter_order=True),
                                     measurement_rows).all()
            sample_rows = [{"measurement_id": measurement_id, "count": len(record["samples_us"]),
                            "data": pack_samples(record["samples_us"])}
                           for measurement_id, record in zip(ids, records, strict=True) if "samples_us" in record]
            if sample_rows:
                connection.execute(insert(Sample), sample_rows)
        return run_id

    def runs(self, **filters: Any) -> list[RunRow]:
        """Stored runs, oldest first; filters are the fields of RunFilter."""
        # A count per run through the run_id index: a join with counts of every run's measurements let
        # PostgreSQL, with statistics not yet updated after a night's ingest, pick a nested loop over all
        # runs x all counts (1.4 s instead of 0.08 s at 6000 runs; tests/bench/bench_store_scale.py).
        count = (select(func.count()).where(Measurement.run_id == Run.id)
                 .correlate(Run).scalar_subquery().label("num_measurements"))
        query = select(*Run.__table__.columns, count).order_by(Run.id)
        with self._transaction() as connection:
            rows = connection.execute(RunFilter(**filters).apply(query)).mappings().all()
        return [RunRow(**row) for row in rows]

    def measurements(self, **filters: Any) -> pandas.DataFrame:
        """One row per stored measurement with its run's identity (measurement_id, run_id, run_key,
        campaign, site, system, partition, environ, check_name, then the measurement columns);
        filters are the fields of MeasurementFilter."""
        import pandas  # deferred: pandas costs ~0.5 s to import and most commands never need it

        run_columns = [Run.run_key, Run.campaign, Run.site, Run.system, Run.partition, Run.environ, Run.check_name]
        measurement_columns = [column for column in Measurement.__table__.columns
                               if column.key not in ("id", "run_id")]
        query = select(Measurement.id.label("measurement_id"), Measurement.run_id, *run_columns,
                       *measurement_columns).order_by(Measurement.run_id, Measurement.seq)
        with self._transaction() as connection:
            result = connection.execute(MeasurementFilter(**filters).apply(query))
            return pandas.DataFrame.from_records([tuple(row) for row in result], columns=list(result.keys()))

    def samples(self, measurement_id: int) -> list[float]:
        """The per-iteration samples (us) of a measurement, in iteration order; [] for an error record."""
        with self._transaction() as connection:
            if connection.scalar(select(Measurement.id).where(Measurement.id == measurement_id)) is None:
                raise StoreError(f"no measurement {measurement_id} in {self.url}")
            row = connection.execute(select(Sample.count, Sample.data)
                                     .where(Sample.measurement_id == measurement_id)).first()
        return [] if row is None else unpack_samples(row.data, row.count, measurement_id).tolist()

    def sample_arrays(self, **filters: Any) -> dict[int, np.ndarray]:
        """Samples of every measurement matching MeasurementFilter fields, by measurement id, in one query."""
        query = select(Sample.measurement_id, Sample.count, Sample.data).join(
            Measurement, Sample.measurement_id == Measurement.id)
        with self._transaction() as connection:
            rows = connection.execute(MeasurementFilter(**filters).apply(query)).all()
        return {row.measurement_id: unpack_samples(row.data, row.count, row.measurement_id) for row in rows}
