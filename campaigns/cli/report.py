"""`commcamp report`: the HTML report of stored results (campaigns/report/html.py). campaigns/cli/app.py mounts it
with register(app)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, Union

import typer
from rich.console import Console
from rich.markup import escape

from campaigns.cli.options import DbOption, expected_errors, with_measurement_filters
from campaigns.cli.outputs import NOT_STDOUT, check_outputs

if TYPE_CHECKING:  # loaded when a report is written: `commcamp --help` stays fast
    from campaigns.report.html import Nominal
    from campaigns.store import MeasurementFilter


def _parse_nominal(texts: list[str]) -> list[Nominal]:
    import math

    from campaigns.report.html import Nominal

    nominal = []
    for text in texts:
        label, sep, number = text.partition("=")
        label = label.strip()
        try:
            gbs = float(number)
        except ValueError:
            gbs = math.nan
        if not sep or not label or not math.isfinite(gbs) or gbs <= 0:
            why = ("the bandwidth must be a number of GB/s above 0" if sep and label
                   else "give a label, then = and the bandwidth")
            raise typer.BadParameter(f"{text!r} is not LABEL=GBPS ({why}; e.g. 'NVLink 4 x18=450' or 'x=1e-3')",
                                     param_hint="--nominal")
        nominal.append(Nominal(label, gbs))
    return nominal


def _verdict_model() -> type[Any]:
    """What the report reads of a health verdict (campaigns/report/html.py health_section, slow_nodes_table,
    build_report), as a pydantic model: other fields are kept, those it reads must have their type."""
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field, field_validator

    Status = Annotated[str, Field(pattern=r"^[A-Za-z_-]+$")]  # a CSS class in the report

    class Part(BaseModel):
        model_config = ConfigDict(extra="allow", strict=True)

    class Metric(Part):
        status: Status
        environ: str
        op: str
        num_nodes: int
        run_key: Optional[str] = None
        hosts: Optional[list[str]] = None
        metric: str
        bytes: Optional[int]
        value: Optional[float]
        unit: str
        evidence: list[str]

    class Node(Part):
        status: Status
        reason: Optional[str] = None
        evidence: list[str]

    class History(Part):  # empty ({}: no history), or median/spread/nights; the ratio's also mean/log_sd/t/p
        median: float
        spread: float
        nights: int

    class RatioHistory(Part):
        mean: float
        log_sd: float
        nights: int
        t: float
        p: float

    Empty = Annotated[dict[str, Any], Field(max_length=0)]

    class SlowNode(Part):
        node: str
        op: str
        bytes: int
        value_us: float
        history: Union[History, Empty]
        peers_us: dict[str, float]
        peer_ratio: float
        ratio_history: Union[History, Empty, dict[str, Any]]
        evidence: list[str]

        @field_validator("ratio_history", mode="before")
        @classmethod
        def _ratio(cls, value: Any) -> Any:  # with log_sd: the ratio's t-test; without: judged like a time
            if isinstance(value, dict) and "log_sd" in value:
                RatioHistory.model_validate(value)
                return value
            return value if value == {} else History.model_validate(value)

    class Pair(Part):
        nodes: list[str]
        status: str

    class Isolation(Part):
        culprit_nodes: list[str]
        culprit_links: list[Annotated[list[str], Field(min_length=2, max_length=2)]]
        pairs: list[Pair]
        path: str = "pairs"
        extra_jobs: Optional[int] = None
        attribution: str = ""
        note: str = ""

    class Verdict(Part):
        campaign: str
        tag: Union[str, int]
        status: Literal["ok", "not_judged", "degraded", "failed"]
        metrics: list[Metric]
        nodes: dict[str, Node]
        slow_nodes: Optional[list[SlowNode]] = None
        isolation: Optional[Isolation] = None

    return Verdict


def _load_verdicts(paths: list[Path]) -> list[dict[str, Any]]:
    """The health verdicts (JSON objects) of --verdict; ValueError naming the file and what in it is wrong."""
    from pydantic import ValidationError

    model = _verdict_model()
    verdicts = []
    for path in paths:
        try:
            verdict = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--verdict {path}: cannot read the health verdict: {exc}") from exc
        if not isinstance(verdict, dict) or not {"campaign", "status", "metrics", "nodes"} <= verdict.keys():
            raise ValueError(f"--verdict {path} is not a commcamp health verdict (a JSON object with campaign, status, "
                             "metrics and nodes)")
        try:
            model.model_validate(verdict)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
            more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
            raise ValueError(f"--verdict {path} is not a commcamp health verdict: {problems}{more}") from None
        verdicts.append(verdict)
    return verdicts


@with_measurement_filters
def report(filters: MeasurementFilter,
           output: Annotated[Path, typer.Option("--output", "-o", help=(
               f"HTML file to write (replaced atomically, in an existing directory; {NOT_STDOUT})"))],
           title: Annotated[str, typer.Option(help="heading of the report")] = "commcamp report",
           nominal: Annotated[Optional[list[str]], typer.Option(
               help="nominal link bandwidth LABEL=GB/s drawn dashed on every plot (repeatable); each partition's "
                    "own (site data) on the plots of its curves too")] = None,
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
        check_outputs({"-o/--output": output}, {})  # before the work: as `results export` (its directory must exist)
        verdicts = _load_verdicts(verdict or [])
        with open_store(db, create=False) as store:
            # each partition's own (the report draws those of the partitions its curves ran on), of the sites
            # named, else of every site stored (`--campaign X` alone said no nominal bandwidth was known)
            sites = [filters.site] if isinstance(filters.site, str) else filters.site or sorted(
                {run.site for run in store.runs()})
            for site in sites:
                links += site_nominal(site, [filters.system] if isinstance(filters.system, str) else filters.system,
                                      [filters.partition] if isinstance(filters.partition, str) else filters.partition)
            text = build_report(store, title=title, nominal=links, verdicts=verdicts, include_tuning=include_tuning,
                                **vars(filters))
        write_atomic(output, text)
    Console().print(f"wrote {escape(str(output))} ({output.stat().st_size / 2**20:.1f} MiB)")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
