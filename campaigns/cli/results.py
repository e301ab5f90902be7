"""`commcamp results ...`: list, export and ingest what the results store holds.
campaigns/cli/app.py mounts it with register(app)."""
from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns.cli.options import DbOption, expected_errors, parse_when, with_measurement_filters
from campaigns.cli.console import make_console
from campaigns.cli.outputs import NOT_STDOUT, check_outputs
from campaigns.cli.prune import prune

if TYPE_CHECKING:  # the store (SQLAlchemy, pandas, numpy) loads when a command runs: `commcamp --help` stays fast
    import numpy as np
    import pandas

    from campaigns.store import MeasurementFilter, RunInfo, RunRow, Store


def _console(*, stderr: bool = False) -> Console:
    # Built per use, not at import, so it sizes itself to the terminal (or $COLUMNS) of this call; full
    # width when not on a terminal (campaigns/cli/console.py).
    return make_console(stderr=stderr)


MAX_COUNT = 2**31 - 1  # the store's INTEGER columns (PostgreSQL's integer is 32-bit)
LimitOption = Annotated[int, typer.Option(min=0, help="rows to show at most; 0 shows all")]


def human_size(size: float | None) -> str:
    if size is None or size != size:  # None or NaN: an error record without a size
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


class ListFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


FormatOption = Annotated[ListFormat, typer.Option(
    "--format", help="table (rich), json (a list of objects) or csv (a header line, then one line per row)")]


def _print_table(title: str, columns: list[str], rows: list[list[Any]], total: int,
                 list_format: ListFormat = ListFormat.table) -> None:
    """The rows as a table (each value text), JSON or CSV (values as given: numbers stay numbers)."""
    if list_format is ListFormat.table:
        from rich.table import Table

        table = Table(*columns, title=escape(title))
        for row in rows:
            table.add_row(*map(escape, row))  # values are data, not rich markup
        _console().print(table)
    elif list_format is ListFormat.json:
        print(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], indent=1))
    else:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerows([columns, *rows])
    if len(rows) < total:
        _console(stderr=list_format is not ListFormat.table).print(
            f"showing {len(rows)} of {total} (newest first); use --limit 0 or narrower filters to see the rest")


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


class RunStatus(str, Enum):
    passed = "pass"
    failed = "fail"
    error = "error"


def list_runs(db: DbOption = None,
              campaign: Annotated[Optional[str], typer.Option(help="campaign name")] = None,
              site: Annotated[Optional[str], typer.Option()] = None,
              system: Annotated[Optional[str], typer.Option()] = None,
              partition: Annotated[Optional[str], typer.Option()] = None,
              status: Annotated[Optional[RunStatus], typer.Option()] = None,
              since: Annotated[Optional[str], typer.Option(help="started on or after (YYYY-MM-DD or ISO)")] = None,
              until: Annotated[Optional[str], typer.Option(help="started on or before (YYYY-MM-DD or ISO)")] = None,
              limit: LimitOption = 100, list_format: FormatOption = ListFormat.table) -> None:
    """List stored runs, newest first."""
    from campaigns.store import RunFilter, open_store

    run_filter = RunFilter(campaign=campaign, site=site, system=system, partition=partition,
                           status=status.value if status else None,
                           since=parse_when(since, "--since"), until=parse_when(until, "--until"))
    with expected_errors(), open_store(db, create=False) as store:
        runs = store.runs(**vars(run_filter))[::-1]
        names = {name: getattr(run_filter, name) for name in ("campaign", "site", "system", "partition")
                 if getattr(run_filter, name) is not None}
        if not runs and names and not store.runs(**names):  # a mistyped --campaign read as "nothing ran"; no
            # failed run since yesterday is an answer
            raise ValueError(f"no runs in {store.url} have {json.dumps(names)}: a name no run was stored under")
    table = list_format is ListFormat.table  # json and csv: numbers as numbers, the status and its reason apart
    rows = [[str(run.id) if table else run.id, run.campaign, run.site, f"{run.system}:{run.partition}", run.environ,
             run.check_name, str(run.num_nodes) if table else run.num_nodes,
             *([run.status if run.reason is None else f"{run.status} ({run.reason})"] if table
               else [run.status, run.reason]),
             str(run.num_measurements) if table else run.num_measurements,
             (run.started_at or run.created_at).strftime("%Y-%m-%d %H:%M"), run.run_key]
            for run in (runs[:limit] if limit else runs)]
    _print_table(f"runs in {store.url}", ["id", "campaign", "site", "system:partition", "environ", "check", "nodes",
                                          *(["status"] if table else ["status", "reason"]), "measurements",
                                          "started (UTC)", "run key"], rows, len(runs), list_format)


@with_measurement_filters
def list_measurements(filters: MeasurementFilter, db: DbOption = None, limit: LimitOption = 100,
                      list_format: FormatOption = ListFormat.table) -> None:
    """List stored measurements (one per commbench record), newest run first."""
    from campaigns.formats.foreign import check_filter_names
    from campaigns.store import open_store

    with expected_errors():
        check_filter_names(**vars(filters))  # an op, transport or backend no record can have
        with open_store(db, create=False) as store:
            frame = _selected(store, filters)
    frame = frame.sort_values("run_id", ascending=False, kind="stable")
    table = list_format is ListFormat.table  # human-rounded; json and csv: raw bytes, full-precision floats
    rows = [[str(row.measurement_id) if table else int(row.measurement_id), row.site, row.system, row.op,
             row.transport, variant(row),
             human_size(row.bytes) if table else _raw(row.bytes, int),
             _fmt(row.median_us, ".2f") if table else _raw(row.median_us, float),
             _fmt(row.goodput_gbs, ".3f") if table else _raw(row.goodput_gbs, float),
             _fmt(row.busbw_gbs, ".3f") if table else _raw(row.busbw_gbs, float),
             "yes" if row.valid else f"no ({row.reason if isinstance(row.reason, str) else 'validation'})",
             row.timestamp.strftime("%Y-%m-%d %H:%M")]
            for row in (frame.head(limit) if limit else frame).itertuples(index=False)]
    _print_table(f"measurements in {store.url}", ["id", "site", "system", "op", "transport", "variant", "size",
                                                  "median us", "goodput GB/s", "busbw GB/s", "valid", "date (UTC)"],
                 rows, len(frame), list_format)


def _raw(value: Any, kind: type) -> Any:
    """A number as itself (None for a missing one: NULL, NaN), for json and csv."""
    return None if value is None or value != value else kind(value)


def variant(row: Any) -> str:
    """What tells apart measurements of one op, transport and size in one run: host memory (h2d/d2h), direction,
    the pair of ranks (pairmatrix) and the algorithm a selection sweep selected; "-" for none of them."""
    extra = row.extra if isinstance(row.extra, dict) else {}
    selection = extra.get("selection") if isinstance(extra.get("selection"), dict) else {}
    parts = [row.host_memory if isinstance(row.host_memory, str) else "",
             row.direction if isinstance(row.direction, str) else "",
             f"{int(row.pair_src)}->{int(row.pair_dst)}" if _raw(row.pair_src, int) is not None
             and _raw(row.pair_dst, int) is not None else "",
             f"selection {selection['name']}" if selection.get("name") else ""]
    return " ".join(part for part in parts if part) or "-"


def _selected(store: Store, filters: MeasurementFilter) -> pandas.DataFrame:
    """The measurements `filters` select; ValueError (exit 2, as `report`) for filters that select nothing: an
    empty table or a header-only file read as 'nothing was measured' where a filter was mistyped."""
    from campaigns.store.store import no_measurements_message

    frame = store.measurements(**vars(filters))
    if frame.empty:
        raise ValueError(no_measurements_message(store.url, vars(filters)))
    return frame


class ExportFormat(str, Enum):
    csv = "csv"
    parquet = "parquet"


@with_measurement_filters
def export(filters: MeasurementFilter,
           output: Annotated[Path, typer.Option("--output", "-o", help=(
               f"file to write (replaced atomically, in an existing directory; {NOT_STDOUT})"))],
           export_format: Annotated[Optional[ExportFormat], typer.Option(
               "--format", help="csv or parquet [default: from the output suffix]")] = None,
           samples: Annotated[bool, typer.Option(
               "--samples", help="one row per timed iteration (measurement_id, iteration, time_us and the "
                                 "measurement's identity) instead of one per measurement")] = False,
           db: DbOption = None) -> None:
    """Export measurements (or their per-iteration samples) as CSV or Parquet; JSON-valued columns are
    written as JSON text."""
    from sqlalchemy import JSON, Integer

    from campaigns.formats.foreign import check_filter_names
    from campaigns.store import open_store
    from campaigns.store.models import Measurement
    from tuners.writers import new_file_mode, write_target

    if export_format is None:
        try:
            export_format = ExportFormat(output.suffix.lstrip(".").lower())
        except ValueError:
            raise typer.BadParameter(f"cannot tell the format from {output.name!r}; give --format csv|parquet",
                                     param_hint="--format") from None
    with expected_errors():
        check_outputs({"-o/--output": output}, {})  # before the work: a file it cannot write stops here
        check_filter_names(**vars(filters))
        with open_store(db, create=False) as store:
            frame = _selected(store, filters)
            if samples:
                frame = _sample_rows(frame, store.sample_arrays(**vars(filters)))
        for column in Measurement.__table__.columns:
            if isinstance(column.type, JSON) and column.key in frame:
                frame[column.key] = [json.dumps(value, sort_keys=True) if value is not None else None
                                     for value in frame[column.key]]
        # An integer column with a NULL (an error record's bytes, count) became float (8.0) in pandas: nullable
        # integers keep 8 as 8 and NULL as an empty field (CSV) or null (Parquet).
        integers = [c.key for c in Measurement.__table__.columns if isinstance(c.type, Integer) and c.key != "id"]
        for key in ["measurement_id", "run_id", "iteration", "batch", *integers]:
            if key in frame:
                frame[key] = frame[key].astype("Int64")
        output = output.absolute()
        target = write_target(output)  # a symlink's file (the link stays), never a device or FIFO
        fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        try:
            if export_format is ExportFormat.csv:
                frame.to_csv(temp_name, index=False)
            else:
                frame.to_parquet(temp_name, index=False)
            os.chmod(temp_name, new_file_mode())  # mkstemp's is 0600
            os.replace(temp_name, target)
        except BaseException:
            os.unlink(temp_name)
            raise
    what = "samples" if samples else "measurements"
    _console().print(f"exported {len(frame)} {what} to {output} ({export_format.value})", markup=False)


# Everything that tells one measurement's samples from another's (and from an invalid one's): a row of samples
# without them pools what the report keeps apart (pinned and pageable, uni and bi, pairs, batch, selections).
_SAMPLE_IDENTITY = ["measurement_id", "run_id", "campaign", "site", "system", "partition", "environ", "check_name",
                    "kind", "valid", "backend", "op", "transport", "bytes", "ranks", "nodes", "host_memory",
                    "direction", "pair_src", "pair_dst", "batch", "selection", "timestamp"]


def _sample_rows(measurements: pandas.DataFrame, samples: dict[int, np.ndarray]) -> pandas.DataFrame:
    """Long format: one row per sample, in iteration order, with its measurement's identity (batch and
    selection from the record's fields without a column: 1 and none when absent)."""
    import numpy as np

    extras = [extra if isinstance(extra, dict) else {} for extra in measurements["extra"]]
    measurements = measurements.assign(
        batch=[extra.get("batch", 1) for extra in extras],
        selection=[(extra.get("selection") or {}).get("name") if isinstance(extra.get("selection"), dict) else None
                   for extra in extras])
    ids = [mid for mid in measurements["measurement_id"] if mid in samples]
    counts = [len(samples[mid]) for mid in ids]
    identity = measurements.set_index("measurement_id").loc[ids].reset_index()[_SAMPLE_IDENTITY]
    frame = identity.loc[identity.index.repeat(counts)].reset_index(drop=True)
    frame["iteration"] = [i for count in counts for i in range(count)]
    frame["time_us"] = np.concatenate([samples[mid] for mid in ids]) if ids else np.array([], dtype=float)
    return frame


def _parameters(pairs: list[str]) -> dict[str, str]:
    parameters = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--param")
        parameters[key] = value
    return parameters


def _read_measurements(file: Path, fmt: str, hosts: list[str], mpi_library: str) -> list[dict[str, Any]]:
    """The records of `file`: commbench JSON Lines as they are, another benchmark's output through
    campaigns.formats (each of its rows a record naming that benchmark as its source)."""
    from campaigns.model.records import load_records, validate_record

    if fmt == "commbench":
        return load_records(file)
    from campaigns.formats import foreign  # deferred: only this command reads other benchmarks
    if fmt not in foreign.FORMATS:
        raise typer.BadParameter(f"{fmt!r} is not one of commbench, {', '.join(foreign.FORMATS)}",
                                 param_hint="--format")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: cannot read: {exc}") from exc
    stamp = datetime.fromtimestamp(file.stat().st_mtime, tz=timezone.utc)
    records = foreign.parse(fmt, text, source=str(file), timestamp=stamp, hostnames=hosts,
                            mpi_library=mpi_library)
    return [validate_record(record, f"{file} row {index}") for index, record in enumerate(records)]


# The check a campaign's runs of each foreign format are stored under (reframe_checks/reference_benchmarks.py)
FOREIGN_CHECKS = {"nccl-tests": "nccl_tests_run", "nccl-tests-json": "nccl_tests_run", "osu": "osu_run"}


def ingest(file: Annotated[Path, typer.Argument(help="benchmark output (commbench JSON Lines unless --format)")],
           site: Annotated[str, typer.Option(help="site the records were measured at")],
           system: Annotated[str, typer.Option(help="system (cluster) name, or system:partition")],
           partition: Annotated[Optional[str], typer.Option(
               help="[default: the system's partition, when it has one]")] = None,
           environ: Annotated[str, typer.Option(help="programming environment")] = "default",
           campaign: Annotated[str, typer.Option()] = "manual",
           check_name: Annotated[Optional[str], typer.Option(help=(
               "name of the check that ran it [default: commbench; nccl_tests_run, osu_run for their outputs, as "
               "a campaign's reference checks name their runs]"))] = None,
           run_key: Annotated[Optional[str], typer.Option(
               help="unique key of this run [default: manual:<sha256 of the file>]")] = None,
           param: Annotated[Optional[list[str]], typer.Option(help="run parameter KEY=VALUE (repeatable)")] = None,
           num_nodes: Annotated[Optional[int], typer.Option(
               min=1, max=MAX_COUNT, help="[default: largest 'nodes' of the records]")] = None,
           num_tasks: Annotated[Optional[int], typer.Option(
               min=1, max=MAX_COUNT, help="[default: largest 'ranks' of the records]")] = None,
           status: Annotated[Optional[RunStatus], typer.Option(
               help="[default: pass when every record is valid, else fail]")] = None,
           reason: Annotated[Optional[str], typer.Option(help="why the run failed")] = None,
           job_id: Annotated[Optional[str], typer.Option(help="Slurm job id")] = None,
           replace: Annotated[bool, typer.Option(help="replace a stored run with the same key")] = False,
           allow_duplicate: Annotated[bool, typer.Option(
               "--allow-duplicate", help="store records although the same records are stored (as test data)")] = False,
           fmt: Annotated[str, typer.Option("--format", help=(
               "commbench (JSON Lines), nccl-tests (its printed table), nccl-tests-json (-J file, "
               "per-iteration data with -I) or osu (an osu_* benchmark's printed output)"))] = "commbench",
           hosts: Annotated[Optional[str], typer.Option(help=(
               "comma-separated host of each rank, for outputs that do not name them (osu)"))] = None,
           mpi_library: Annotated[str, typer.Option(help="MPI library of a foreign output (osu, nccl-tests)")] = "",
           db: DbOption = None) -> None:
    """Store a benchmark output produced outside commcamp (a site's own commbench, nccl-tests or OSU run,
    a reference result): each measurement becomes a record the store, health and report read like
    commbench's own. The same records stored before (by `commcamp run` or an earlier ingest) are skipped,
    unless --allow-duplicate."""
    from campaigns.model.site import SiteError, load_site
    from campaigns.model.spec import CASE_KEY
    from campaigns.store import RunInfo, open_store, records_digest

    parameters = _parameters(param or [])
    if run_key is not None and not run_key.strip():
        raise typer.BadParameter("is empty: give a key, or leave --run-key out (manual:<sha256 of the file>)",
                                 param_hint="--run-key")
    with expected_errors():
        # what was measured first: a missing file or a mistyped --format is named as such, not as a site problem
        records = _read_measurements(file, fmt, [h for h in (hosts or "").split(",") if h], mpi_library)
        if ":" in system:  # system:partition, as tune and recommend take it
            system, _, named = system.partition(":")
            if partition is not None and partition != named:
                raise ValueError(f"--system names partition {named!r}, --partition {partition!r}: give one")
            partition = named
        try:
            found = load_site(site)
            partitions = [p.name for p in found.system(system).partitions]
        except SiteError as exc:
            raise ValueError(f"--site: {exc}") from None
        except KeyError:
            raise ValueError(f"--system: site {site!r} has no system {system!r} (it has: "
                             f"{', '.join(s.name for s in found.systems)})") from None
        if partition is None and len(partitions) != 1:
            raise ValueError(f"--partition: system {system!r} has several ({', '.join(partitions)}): say which")
        partition = partition or partitions[0]
        if partition not in partitions:  # health and reports key series on it: a made-up one joins none
            raise ValueError(f"--partition: system {system!r} of site {site!r} has no partition {partition!r} "
                             f"(it has: {', '.join(partitions)})")
        if not records:
            raise ValueError(f"{file} holds no commbench records")
        invalid = sum(not record["valid"] for record in records)
        if status is None:
            status = RunStatus.passed if invalid == 0 else RunStatus.failed
            if invalid and reason is None:
                reason = f"{invalid} of {len(records)} records not valid"
        for option, given, field in (("--num-nodes", num_nodes, "nodes"), ("--num-tasks", num_tasks, "ranks")):
            measured = max(record[field] for record in records)
            if given is not None and given != measured:  # the run would be stored as a scale it never ran at
                raise ValueError(f"{option} {given}: the records of {file} ran on {measured} {field}")
        stamps = [datetime.fromisoformat(record["timestamp"]) for record in records]
        digest = hashlib.sha256(file.read_bytes()).hexdigest()[:16]
        run = RunInfo(run_key=run_key if run_key is not None else f"manual:{digest}",
                      campaign=campaign, site=site, system=system, partition=partition, environ=environ,
                      check_name=check_name or FOREIGN_CHECKS.get(fmt, "commbench"), parameters=parameters,
                      num_nodes=num_nodes if num_nodes is not None else max(record["nodes"] for record in records),
                      num_tasks=num_tasks if num_tasks is not None else max(record["ranks"] for record in records),
                      status=status.value, reason=reason, started_at=min(stamps), finished_at=max(stamps),
                      job_id=job_id)
        if CASE_KEY.match(run.run_key):
            # a campaign's test case is `commcamp run`'s (again with --force): an ingest under its key had replaced
            # its passed runs (--replace), or, stored first, made the campaign skip the case as stored
            raise ValueError(f"--run-key {run.run_key!r} has the shape of a campaign's test case key "
                             "(campaign/site/system:partition/environ/check/...): `commcamp run` would take this file "
                             "for that case; an ingest takes another key (`commcamp run SPEC --force` measures a "
                             "case again)")
        with open_store(db) as store:
            same = [] if allow_duplicate else [stored for stored in store.runs(records_digest=records_digest(records))
                                               if not (replace and stored.run_key == run.run_key)]
            if not same and not allow_duplicate and run_key is None and not replace:
                # the key is the file's content: a copy (another modification time, which the timestamps of an
                # nccl-tests or OSU output are) is the same measurement, already stored - if described alike
                same = store.runs(run_key=run.run_key)
            if run_key is None and not replace and not allow_duplicate:  # an earlier ingest of this file
                ingested = [stored for stored in same if stored.run_key == run.run_key]
                # the check's default name is no description of the user's (an older commcamp gave foreign
                # outputs 'commbench'): given, it is compared
                differs = [option for stored in ingested
                           for option in _described_otherwise(store, stored, run, records)
                           if option != "--check-name" or check_name is not None]
                if differs:
                    raise ValueError(
                        f"{', '.join(sorted(set(differs)))}: {file} is stored as run {ingested[0].id} "
                        f"({ingested[0].run_key!r}) with other values of these; --replace stores it in that run's "
                        "place, --run-key KEY --allow-duplicate as another run beside it")
            if same:
                _console().print(f"skipped: the records of {file} are already stored as run {same[0].id} "
                                 f"({same[0].run_key!r}); --allow-duplicate stores them again", markup=False)
                return
            if run_key is not None and not replace and (taken := store.runs(run_key=run_key)):
                raise ValueError(f"--run-key {run_key!r}: run {taken[0].id} is stored under it; --replace stores "
                                 f"{file} in its place, another --run-key as another run")
            run_id = store.ingest(run, records, replace=replace, validated=True)
    _console().print(f"stored run {run_id} ({run.run_key!r}, {run.status}): {len(records)} measurements "
               f"from {file} in {store.url}", markup=False)


# what `results ingest` says of a run beside its file, by option: a stored run of the same file said otherwise is
# not the same measurement
_DESCRIBED_BY = {"campaign": "--campaign", "site": "--site", "system": "--system", "partition": "--partition",
                 "environ": "--environ", "check_name": "--check-name", "parameters": "--param",
                 "num_nodes": "--num-nodes", "num_tasks": "--num-tasks", "status": "--status", "reason": "--reason",
                 "job_id": "--job-id"}


def _described_otherwise(store: Store, stored: RunRow, run: RunInfo, records: list[dict[str, Any]]) -> list[str]:
    """The ingest options by which `run` (of `records`) describes the file otherwise than the stored run of it."""
    differs = [option for name, option in _DESCRIBED_BY.items() if getattr(stored, name) != getattr(run, name)]
    measured = store.measurements(run_id=stored.id)
    for column, option in (("hostnames", "--hosts"), ("mpi_library", "--mpi-library")):
        if sorted(map(json.dumps, measured[column])) != sorted(json.dumps(r.get(column)) for r in records):
            differs.append(option)
    return differs


def register(app: typer.Typer) -> None:
    """Add the `results` command group to the commcamp CLI."""
    results = typer.Typer(help="Query, export, ingest stored benchmark results; prune old run directories.",
                          no_args_is_help=True)
    results.command("runs")(list_runs)
    results.command("list")(list_measurements)
    results.command("export")(export)
    results.command("ingest")(ingest)
    results.command("prune")(prune)
    app.add_typer(results, name="results")
