"""The table of campaign kinds (campaigns/kinds/table.py): one entry per kind a spec may name, and each
kind's after_run() gives `commcamp run`'s exit code. The kinds' real runs: test_campaign_run.py (run),
test_health_localslurm.py (health), test_campaign_localslurm.py (characterize)."""
from __future__ import annotations

from pathlib import Path

from campaigns.cli.console import make_console
from campaigns.exit_codes import ExitCode
from campaigns.kinds.table import KINDS, FinishedRun
from campaigns.model.spec import CAMPAIGN_KINDS, load_campaign
from campaigns.reframe.runner import CampaignResult, CaseResult

REPO = Path(__file__).resolve().parents[1]


def test_every_spec_kind_has_an_entry() -> None:
    assert tuple(KINDS) == CAMPAIGN_KINDS
    assert KINDS["health"].default_tag() is not None and KINDS["run"].default_tag() is None


def _finished(statuses: list[str], store_error: str | None = None) -> FinishedRun:
    campaign = load_campaign(REPO / "campaigns" / "smoke.yaml")
    cases = campaign.cases()[:len(statuses)]
    results = [CaseResult(case, status, store_error=store_error) for case, status in zip(cases, statuses)]
    console = make_console(stderr=True)
    return FinishedRun(campaign, CampaignResult(None, "sqlite://", results), None, None,  # type: ignore[arg-type]
                       console, console, REPO, None, None)  # type: ignore[arg-type]


def test_run_kind_exit_code_says_whether_every_case_passed_and_was_stored() -> None:
    after_run = KINDS["run"].after_run
    assert after_run(_finished(["pass", "stored"])) is ExitCode.OK
    assert after_run(_finished(["pass", "fail"])) is ExitCode.FAILED
    assert after_run(_finished(["pass"], store_error="database is locked")) is ExitCode.FAILED
