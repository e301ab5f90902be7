"""Options and error handling shared by the commcamp commands that read the results store
(campaigns/cli/results.py, campaigns/cli/report.py): --db, the measurement filters, dates, and the
one-line error exit."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns.exit_codes import ExitCode

if TYPE_CHECKING:  # the store (SQLAlchemy) loads when a command runs: `commcamp --help` stays fast
    from campaigns.store import MeasurementFilter

def not_empty(value: str | None) -> str | None:
    """An option given as "" (a script's unset variable: `--site "$SITE"`) is refused: left out, it would have its
    default (the spec's site, the default database)."""
    if value is not None and not value.strip():
        raise typer.BadParameter("is empty: give a value, or leave the option out for its default")
    return value


DbOption = Annotated[Optional[str], typer.Option(
    "--db", callback=not_empty,
    help="SQLAlchemy URL of the results database [default: $COMMCAMP_DB_URL, else results/commcamp.db]")]


def parse_when(text: str | None, option: str) -> date | datetime | None:
    """YYYY-MM-DD (that whole day) or an ISO 8601 date-time; without an offset it is local time. A date whose day
    cannot be placed in local time (0001-01-01 east of UTC, 9999-12-31: its end is after the calendar's) is
    refused, naming `option`."""
    if text is None:
        return None
    try:
        when = date.fromisoformat(text) if len(text) == 10 else datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a date (2026-01-31) or ISO date-time",
                                 param_hint=option) from None
    start = when if isinstance(when, datetime) else datetime.combine(when, time())
    try:  # what the store computes of it (campaigns.store.store._day_bounds): that day's bounds in local time
        start.astimezone()
        (start + timedelta(days=1)).astimezone()
    except (ValueError, OverflowError, OSError):
        raise typer.BadParameter(f"{text!r} is outside the dates that can be compared (years 1 to 9999, in local "
                                 "time): give a date a measurement can have", param_hint=option) from None
    return when


# Filter options shared by the measurement commands; with_measurement_filters adds them to a command.
MEASUREMENT_FILTER_OPTIONS: dict[str, Any] = {
    "campaign": Annotated[Optional[list[str]], typer.Option(help="campaign name (repeatable)")],
    "site": Annotated[Optional[list[str]], typer.Option(help="site (repeatable)")],
    "system": Annotated[Optional[list[str]], typer.Option(help="system (repeatable)")],
    "partition": Annotated[Optional[list[str]], typer.Option(help="partition (repeatable)")],
    "op": Annotated[Optional[list[str]], typer.Option(help="operation, e.g. allreduce (repeatable)")],
    "transport": Annotated[Optional[list[str]], typer.Option(help="transport, e.g. mpi or ccl (NCCL/RCCL) (repeatable)")],
    "backend": Annotated[Optional[list[str]], typer.Option(help="cpu, cuda or hip (repeatable)")],
    "run_id": Annotated[Optional[list[int]], typer.Option(min=1, max=2**63 - 1, help="run id (repeatable)")],
    "size": Annotated[Optional[str], typer.Option(help="exact message size, e.g. 1MiB")],
    "min_size": Annotated[Optional[str], typer.Option(help="smallest message size")],
    "max_size": Annotated[Optional[str], typer.Option(help="largest message size")],
    "since": Annotated[Optional[str], typer.Option(help="measured on or after (YYYY-MM-DD or ISO date-time)")],
    "until": Annotated[Optional[str], typer.Option(help="measured on or before (YYYY-MM-DD or ISO date-time)")],
    "valid": Annotated[Optional[bool], typer.Option("--valid/--invalid", help="only valid / only invalid")],
}


def _measurement_filter(options: dict[str, Any]) -> MeasurementFilter:
    from campaigns.model.records import MAX_MESSAGE_BYTES  # the record contract's limit, as tune and recommend's
    from campaigns.model.sizes import parse_size  # pydantic: loaded when a command runs
    from campaigns.store import MeasurementFilter

    def size(name: str) -> int | None:
        text = options[name]
        if text is None:
            return None
        try:
            size = parse_size(text)
            if size > MAX_MESSAGE_BYTES:  # no record has it (and the database's integers end at 2**63)
                raise ValueError(f"{text!r} is {size} B, above 1 TiB, the largest size commbench measures")
            return size
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--" + name.replace("_", "-")) from None

    lists = {name: options[name] or None
             for name in ("campaign", "site", "system", "partition", "op", "transport", "backend", "run_id")}
    return MeasurementFilter(**lists, bytes=size("size"), min_bytes=size("min_size"), max_bytes=size("max_size"),
                             since=parse_when(options["since"], "--since"),
                             until=parse_when(options["until"], "--until"), valid=options["valid"])


def with_measurement_filters(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` the filter options; it receives them as one MeasurementFilter `filters`."""
    own = [p.replace(annotation=eval(p.annotation, command.__globals__)) if isinstance(p.annotation, str) else p
           for p in inspect.signature(command).parameters.values() if p.name != "filters"]  # the store loads later
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
             for name, annotation in MEASUREMENT_FILTER_OPTIONS.items()]

    @functools.wraps(command)
    def with_filters(**options: Any) -> None:
        filter_options = {name: options.pop(name) for name in MEASUREMENT_FILTER_OPTIONS}
        command(filters=_measurement_filter(filter_options), **options)

    with_filters.__signature__ = inspect.Signature(own + added)  # type: ignore[attr-defined]
    with_filters.__annotations__ = {p.name: p.annotation for p in own + added}
    return with_filters


@contextmanager
def expected_errors() -> Iterator[None]:
    """Bad input (ValueError: a file that is not what its format says or cannot be read, an unknown site,
    filters that select nothing) and a database that cannot be opened end the command with a one-line message
    and exit status 2, as for every commcamp command (README, "Exit codes"); database trouble on the way and
    an OSError the command did not turn into such a message (a file that cannot be written) with 1."""
    from campaigns.store import StoreError, StoreUnavailable

    try:
        yield
    except (StoreUnavailable, ValueError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(ExitCode.USAGE) from None
    except (StoreError, OSError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(ExitCode.FAILED) from None
