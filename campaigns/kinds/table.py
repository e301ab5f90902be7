"""The campaign kinds (a spec's `kind`): what `commcamp run` does after a campaign's test cases ran.

Each kind is one `CampaignKind` in `KINDS`: its run tag when none is given, the `commcamp run` option
that names its output file (--verdict, --report), and `after_run()`, which gets the finished run and
returns the command's exit code (campaigns/exit_codes.py). How a spec turns into test cases is the
spec's business (campaigns/model/spec.py: CAMPAIGN_KINDS, the kind's settings model).
A new kind: both, and its output option (if any) as a parameter of `run` in campaigns/cli/app.py, named as
its output_option (app.py reads every output option through KINDS); its default output directory in
campaigns/paths.py.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from campaigns import paths
from campaigns.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from campaigns.slurm.placement import Placer
    from campaigns.model.spec import Campaign
    from campaigns.reframe.runner import CampaignResult
    from campaigns.store import Store


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """A campaign run whose test cases ran, for its kind to finish; `output` is the kind's output option
    (None: the kind's default place)."""

    campaign: Campaign
    result: CampaignResult
    store: Store
    tag: str | None
    console: Console
    errors: Console
    runs_dir: Path
    placer: Placer
    output: Path | None


def cases_outcome(run: FinishedRun) -> ExitCode:
    """FAILED when a test case failed or could not be stored (saying how many were not stored), else OK."""
    if run.result.unstored:
        run.errors.print(f"[bold red]{len(run.result.unstored)} test case(s) could not be stored[/] (see above); "
                         "their records stay in the run directory")
    return ExitCode.OK if run.result.all_passed else ExitCode.FAILED


def _judge_night(run: FinishedRun) -> ExitCode:
    """Health: judge the night, write the verdict, print its summary; the verdict's exit code."""
    from campaigns.kinds.health import HealthCheck, default_verdict_path, print_summary, write_verdict

    assert run.tag is not None
    night = HealthCheck(run.campaign, run.store, run.tag, console=run.console, runs_dir=run.runs_dir,
                        placer=run.placer).evaluate(run.result)
    path = run.output or default_verdict_path(night)
    write_verdict(night, path)
    print_summary(run.console, night, path)
    if run.result.unstored:  # a case not stored is a step that failed (1), whatever the rest of the night says
        code = cases_outcome(run)
        run.console.print(f"commcamp exits {int(code)}, not the night's {night.exit_code}: "
                          f"{len(run.result.unstored)} case(s) ran but could not be stored (not judged)")
        return code
    return ExitCode(night.exit_code)


def _write_report(run: FinishedRun) -> ExitCode:
    """Characterize: the campaign's HTML report, then the outcome of its cases. A campaign that stored nothing to
    show (no measurement, or none valid) gets no report: said, and the cases' outcome is the exit code."""
    from rich.markup import escape

    from campaigns.report.html import write_campaign_report

    path = run.output or paths.reports_dir() / f"{run.campaign.name}.html"
    try:
        write_campaign_report(run.store, run.campaign, path)
    except ValueError as exc:  # build_report: nothing stored that a report could show
        run.errors.print(f"[bold red]no report written[/]: nothing to show was stored ({escape(str(exc))})")
        return cases_outcome(run)
    run.console.print(f"Report: {path}")
    return cases_outcome(run)


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


@dataclasses.dataclass(frozen=True)
class CampaignKind:
    name: str
    after_run: Callable[[FinishedRun], ExitCode]
    # The `commcamp run` option naming the kind's output file: a parameter of run() of this name
    # (campaigns/cli/app.py), which hands its value to after_run() as FinishedRun.output.
    output_option: str | None = None
    default_tag: Callable[[], str | None] = lambda: None


# One entry per kind of campaign spec (CAMPAIGN_KINDS; tests/test_campaign_kinds.py holds them together).
KINDS: dict[str, CampaignKind] = {kind.name: kind for kind in (
    CampaignKind("run", cases_outcome),
    CampaignKind("characterize", _write_report, output_option="report"),
    CampaignKind("health", _judge_night, output_option="verdict", default_tag=_today),  # tag: the night
)}
