"""The table of campaign kinds (campaigns/kinds/table.py): one entry per kind a spec may name, and each
kind's after_run() gives `commcamp run`'s exit code. The kinds' real runs: test_campaign_run.py (run),
test_health_localslurm.py (health), test_campaign_localslurm.py (characterize)."""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

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


def test_the_summary_shows_no_figures_of_a_case_that_stored_no_record() -> None:
    """A case that failed with no record stored (its run directory deleted under it) showed ReFrame's latency and
    goodput as if measured."""
    import io

    from rich.console import Console

    from campaigns.cli.app import _print_summary

    finished = _finished(["fail", "pass"])
    figures = {"small_latency": (0.166, "us"), "large_goodput": (2.37, "GB/s")}
    results = [dataclasses.replace(finished.result.results[0], perf=figures, num_records=0),
               dataclasses.replace(finished.result.results[1], perf=figures, num_records=12)]
    out = io.StringIO()
    _print_summary(Console(file=out, width=200), finished.campaign,
                   dataclasses.replace(finished.result, results=results))
    rows = [line for line in out.getvalue().splitlines() if " fail" in line or " pass" in line]
    assert "0.166" not in rows[0] and "2.37" not in rows[0] and "0.166" in rows[1], out.getvalue()


HEALTH_SPEC = ("name: tiny\nkind: health\nsite: local\nenvironments: [openmpi]\nnode_counts: [1]\n"
               "checks:\n  - check: commbench_run\n    ops: [pingpong]\n    min_bytes: 8\n    max_bytes: 64\n"
               "    step_factor: 8\n    warmup: 1\n    iters: 3\n    timeout_s: 30\n    time_limit_s: 60\n")


def test_a_kind_output_that_cannot_be_written_stops_the_run_before_any_case(tmp_path: Path) -> None:
    """--verdict or --report naming a directory, or a file where no directory can be made for it, failed with a
    traceback after every case ran, nothing written: now exit 2 naming the option, before anything runs or is
    created (the dry run too). A directory that does not exist yet is made when the file is written."""
    from fixtures_cli import commcamp

    spec = tmp_path / "tiny.yaml"
    spec.write_text(HEALTH_SPEC)
    characterize = tmp_path / "characterize.yaml"
    characterize.write_text(HEALTH_SPEC.replace("kind: health", "kind: characterize"))
    db, runs = tmp_path / "results.db", tmp_path / "runs"
    (tmp_path / "afile").write_text("x\n")
    under_a_file = tmp_path / "afile" / "v.json"
    for path, option, target, problem in (
            (spec, "--verdict", tmp_path, f"{tmp_path}: is a directory"),
            (spec, "--verdict", under_a_file, f"{under_a_file.parent}: not a directory"),
            (characterize, "--report", tmp_path, f"{tmp_path}: is a directory")):
        for dry_run in ([], ["--dry-run"]):
            code, out, err = commcamp("run", path, "--db", f"sqlite:///{db}", "--runs-dir", runs, option, target,
                                      *dry_run)
            assert code == ExitCode.USAGE and f"{option} {problem}" in err, out + err
            assert "Traceback" not in out + err
    assert not db.exists() and not runs.exists()
    later = tmp_path / "nightly" / "2026-11" / "v.json"  # made when the verdict is written
    code, out, err = commcamp("run", spec, "--db", f"sqlite:///{db}", "--runs-dir", runs, "--verdict", later,
                              "--dry-run")
    assert code == 0 and not later.parent.exists(), out + err


def test_a_campaign_running_in_another_commcamp_is_not_run_again_beside_it(tmp_path: Path) -> None:
    """Two `commcamp run`s of one campaign on one workspace both ran every case, each beside the other (MPICH
    latencies 10^4 x apart), and stored 12 runs for 6 keys. The second is refused (exit 2) before any case runs,
    naming the holder (the lock is released with its process: campaigns.locks)."""
    from fixtures_cli import commcamp

    from campaigns.locks import campaign_lock

    spec = tmp_path / "tiny.yaml"
    spec.write_text(HEALTH_SPEC)
    db, runs = tmp_path / "results.db", tmp_path / "runs"
    with campaign_lock(runs, "tiny@local@local", warn=pytest.fail):
        code, out, err = commcamp("run", spec, "--db", f"sqlite:///{db}", "--runs-dir", runs, "--tag", "n1")
    assert code == ExitCode.FAILED and "tiny@local@local is running in another commcamp (pid" in err, out + err
    assert [p.name for p in runs.iterdir()] == [".tiny@local@local.lock"]


def test_every_kind_output_option_is_a_run_option_that_reaches_its_kind(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind's output_option (KINDS) is an option of `commcamp run`, and what is given there reaches that kind's
    after_run() as FinishedRun.output; another kind's campaign refuses it and so does a directory (exit 2, before
    anything runs). campaigns/cli/app.py kept three hand-written maps of the options: a kind added to KINDS with its
    option on `run` but missing from one of them got its option silently ignored (the path not used, accepted on a
    campaign of another kind, a directory not refused)."""
    from campaigns.cli import app as app_module
    from campaigns.reframe import runner
    from fixtures_cli import commcamp

    options = {name: kind.output_option for name, kind in KINDS.items() if kind.output_option}
    assert options, "no kind has an output option"
    parameters = inspect.signature(app_module.run).parameters
    assert not [option for option in options.values() if option not in parameters], parameters
    received: dict[str, Path | None] = {}

    def receiving(name: str) -> Callable[[FinishedRun], ExitCode]:
        def after_run(run: FinishedRun) -> ExitCode:
            received[name] = run.output
            return ExitCode.OK
        return after_run

    for name, kind in KINDS.items():  # every kind's after_run only records what it was handed
        monkeypatch.setitem(KINDS, name, dataclasses.replace(kind, after_run=receiving(name)))
    monkeypatch.setattr(runner, "run_campaign", lambda *args, **kwargs: CampaignResult(None, "sqlite://", []))
    monkeypatch.setattr(app_module, "_print_summary", lambda *args: None)
    specs = {}
    for name in KINDS:
        specs[name] = tmp_path / f"{name}.yaml"
        specs[name].write_text(HEALTH_SPEC.replace("kind: health", f"kind: {name}"))
    common = ("--db", f"sqlite:///{tmp_path / 'results.db'}", "--runs-dir", tmp_path / "runs")
    for name, option in options.items():
        target = tmp_path / "out" / f"{name}.{option}"
        code, out, err = commcamp("run", specs[name], *common, f"--{option}", target)
        assert code == ExitCode.OK and received.pop(name) == target, out + err
        code, out, err = commcamp("run", specs[name], *common, f"--{option}", tmp_path, "--dry-run")
        assert code == ExitCode.USAGE and f"--{option} {tmp_path}: is a directory" in err, out + err
        for other in KINDS:
            if KINDS[other].output_option != option:
                code, out, err = commcamp("run", specs[other], *common, f"--{option}", target, "--dry-run")
                assert code == ExitCode.USAGE and f"--{option}:" in err and f"writes no {option}" in err, out + err
    for name in KINDS:  # without the option: the kind's default place (None)
        code, out, err = commcamp("run", specs[name], *common)
        assert code == ExitCode.OK and name in received and received.pop(name) is None, out + err
