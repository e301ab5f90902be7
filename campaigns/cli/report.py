"""`commcamp report`: the HTML report of stored results (campaigns/report/html.py). campaigns/cli/app.py mounts it
with register(app)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns.cli.options import DbOption, expected_errors, with_measurement_filters

if TYPE_CHECKING:  # loaded when a report is written: `commcamp --help` stays fast
    from campaigns.report.html import Nominal
    from campaigns.store import MeasurementFilter


def _parse_nominal(texts: list[str]) -> list[Nominal]:
    from campaigns.report.html import Nominal

    nominal = []
    for text in texts:
        match = re.fullmatch(r"\s*([^=]+?)\s*=\s*([0-9.]+(?:[eE][0-9]+)?)\s*", text)
        if match is None or float(match.group(2)) <= 0:
            raise typer.BadParameter(f"{text!r} is not LABEL=GBPS (e.g. 'NVLink 4 x18=450')", param_hint="--nominal")
        nominal.append(Nominal(match.group(1), float(match.group(2))))
    return nominal


def _load_verdicts(paths: list[Path]) -> list[dict[str, Any]]:
    verdicts = []
    for path in paths:
        try:
            verdict = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read health verdict {path}: {exc}") from exc
        if not isinstance(verdict, dict) or not {"campaign", "status", "metrics", "nodes"} <= verdict.keys():
            raise ValueError(f"{path} is not a commcamp health verdict")
        verdicts.append(verdict)
    return verdicts


@with_measurement_filters
def report(filters: MeasurementFilter,
           output: Annotated[Path, typer.Option("--output", "-o", help="HTML file to write (replaced atomically)")],
           title: Annotated[str, typer.Option(help="heading of the report")] = "commcamp report",
           nominal: Annotated[Optional[list[str]], typer.Option(
               help="nominal link bandwidth LABEL=GB/s drawn dashed on every plot (repeatable); with --site, each "
                    "partition's own (site data) on the plots of its curves too")] = None,
           verdict: Annotated[Optional[list[Path]], typer.Option(
               help="health verdict JSON for the summary table (repeatable)")] = None,
           include_tuning: Annotated[bool, typer.Option(
               "--include-tuning", help="also the tuning trials (campaign tune: settings under test)")] = False,
           db: DbOption = None) -> None:
    """Write a self-contained HTML report (plotly inline) of the measurements the filters select."""
    from campaigns.report.html import build_report, site_nominal
    from campaigns.store import open_store
    from tuners.writers import write_atomic

    links = _parse_nominal(nominal or [])
    with expected_errors():
        verdicts = _load_verdicts(verdict or [])
        for site in [filters.site] if isinstance(filters.site, str) else filters.site or []:
            # each partition's own (the report draws those of the partitions its curves ran on)
            links += site_nominal(site, [filters.system] if isinstance(filters.system, str) else filters.system,
                                  [filters.partition] if isinstance(filters.partition, str) else filters.partition)
        with open_store(db, create=False) as store:
            text = build_report(store, title=title, nominal=links, verdicts=verdicts, include_tuning=include_tuning,
                                **vars(filters))
        write_atomic(output, text)
    Console().print(f"wrote {escape(str(output))} ({output.stat().st_size / 2**20:.1f} MiB)")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
