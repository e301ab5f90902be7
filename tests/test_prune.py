"""`commcamp results prune` (issue 11 item 10): retention for results/runs. A dry run by default; with
--yes the run directories outside --keep-days/--keep-last go, except those a stored run or a health
verdict still points to (kept and named, unless --include-referenced); ReFrame's own prefix stays."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from fixtures_cli import commcamp_output
from fixtures_store import commbench_record, run_info

from campaigns.store import open_store

DAY = 86400


def make_run_dir(runs: Path, name: str, age_days: float) -> Path:
    directory = runs / name
    (directory / "rfm-1" / "output").mkdir(parents=True)
    (directory / "rfm-1" / "output" / "commbench.jsonl").write_text("{}\n" * 100)
    (directory / "rfm-1" / "reframe.out").write_text("ok\n")
    stamp = time.time() - age_days * DAY
    for written in (*directory.rglob("*"), directory):
        os.utime(written, (stamp, stamp))
    return directory


def test_a_campaign_s_run_directory_is_in_use_while_its_cases_run(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    import campaigns.reframe.runner as runner
    from campaigns.locks import is_in_use
    from campaigns.model.spec import load_campaign

    seen = []

    def run_cases(pending, store, *, console, run_dir, placer):  # noqa: ANN001, ANN202
        seen.append(is_in_use(run_dir))
        return [runner.CaseResult(case, "pass") for case in pending]

    monkeypatch.setattr(runner, "run_cases", run_cases)
    campaign = load_campaign(Path(__file__).resolve().parents[1] / "campaigns" / "smoke.yaml")
    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        result = runner.run_campaign(campaign, store, force=True, console=Console(file=None), runs_dir=tmp_path)
    assert seen and seen[0] is not None and f"pid {os.getpid()}" in seen[0]
    assert result.run_dir is not None and is_in_use(result.run_dir) is None  # released when the cases are done


def test_prune_keeps_a_directory_being_written_and_dates_one_by_its_newest_file(tmp_path: Path) -> None:
    """A campaign running for hours writes deep inside its run directory, whose own time stays its start: prune
    called it old by that time and deleted it under the running campaign (every case then failed, its files gone).
    A directory a process writes (campaigns.locks.in_use) is kept, whatever the options; one whose newest file is
    recent is recent."""
    from campaigns.locks import in_use

    runs = tmp_path / "runs"
    running = make_run_dir(runs, "smoke-20261101T000000Z", 30)
    writing = make_run_dir(runs, "smoke-20261102T000000Z", 30)
    (writing / "rfm-1" / "output" / "commbench.jsonl").write_text("{}\n")  # written now
    gone = make_run_dir(runs, "smoke-20261103T000000Z", 30)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    open_store(db).close()
    with in_use(running):  # made when the campaign began (30 days ago here)
        os.utime(running, (time.time() - 30 * DAY,) * 2)
        code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--keep-days", "7", "--yes",
                                       "--include-referenced", "--db", db)
    assert code == 0, output
    assert f"keep {running} (" in output and f"being written (pid {os.getpid()} since" in output
    assert running.is_dir() and writing.is_dir() and not gone.exists(), output


def test_prune_keeps_what_is_recent_or_referenced_and_deletes_only_with_yes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old_plain = make_run_dir(runs, "smoke-20261101T000000Z", 22)
    old_failed = make_run_dir(runs, "smoke-20261102T000000Z", 21)
    old_night = make_run_dir(runs, "health-20261103T000000Z", 20)
    recent = make_run_dir(runs, "smoke-20261122T000000Z", 1)
    newest = make_run_dir(runs, "smoke-20261123T000000Z", 0.1)
    (runs / "reframe" / "stage").mkdir(parents=True)  # plain reframe's prefix: never a run directory
    os.utime(runs / "reframe", (time.time() - 100 * DAY,) * 2)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    with open_store(db) as store:
        store.ingest(run_info(status="fail", reason=f"ReFrame result fail; see {old_failed}/rfm-1/reframe.out"),
                     [commbench_record()])
    (tmp_path / "health").mkdir()
    (tmp_path / "health" / "night.json").write_text(json.dumps({"run_dirs": [str(old_night)]}))

    code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--db", db)
    assert code == 2 and "--keep-days N and/or --keep-last N" in output

    code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--keep-days", "7", "--db", db)
    assert code == 0, output
    assert f"would delete {old_plain} (last written" in output
    assert f"keep {old_failed} (" in output and "still referenced by stored run 1" in output
    assert f"keep {old_night} (" in output and "health verdict" in output
    assert "would delete 1 of 5 run directories (2 files" in output and "add --yes" in output
    assert all(d.is_dir() for d in (old_plain, old_failed, old_night, recent, newest, runs / "reframe"))

    code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--keep-last", "4", "--keep-days", "7",
                                   "--yes", "--db", db)
    assert code == 0, output
    assert "deleted 1 of 5 run directories" in output
    assert not old_plain.exists() and old_failed.is_dir() and old_night.is_dir()

    code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--keep-last", "1", "--yes",
                                   "--include-referenced", "--db", db)
    assert code == 0, output
    assert f"delete {old_failed} (" in output and "although referenced by stored run 1" in output
    assert sorted(p.name for p in runs.iterdir()) == ["reframe", newest.name]


def test_prune_keeps_what_a_verdict_in_the_workspace_points_to_from_another_runs_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --runs-dir X` writes its verdict into the workspace's health/, not beside X: prune looked only beside
    --runs-dir and deleted the night's run directory its verdict still lists."""
    runs = tmp_path / "scratch" / "runs"
    old_night = make_run_dir(runs, "health-20261101T000000Z", 30)
    workspace = tmp_path / "home"
    (workspace / "health").mkdir(parents=True)
    (workspace / "health" / "nightly-n1.json").write_text(json.dumps({"run_dirs": [str(old_night)]}))
    # a night run again: its verdict keeps the first attempt's, whose run directory stays named
    first_try = make_run_dir(runs, "health-20261102T000000Z", 30)
    (workspace / "health" / "nightly-n2.json").write_text(json.dumps({"run_dirs": [], "earlier_verdicts": [
        {"run_dirs": [str(first_try)]}]}))
    db = f"sqlite:///{tmp_path / 'results.db'}"
    open_store(db).close()
    monkeypatch.setenv("COMMCAMP_HOME", str(workspace))
    code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--keep-days", "7", "--db", db)
    assert code == 0 and f"keep {old_night} (" in output and "health verdict" in output, output
    assert f"keep {first_try} (" in output and "nightly-n2.json" in output, output


def test_prune_refuses_to_guess_when_the_store_cannot_say(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old = make_run_dir(runs, "smoke-20261101T000000Z", 30)
    code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--keep-days", "1", "--yes",
                                   "--db", f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")
    assert code == 2 and "no results database at" in output, output
    assert old.is_dir()


def test_prune_deletes_only_run_directories_and_refuses_a_directory_holding_none(tmp_path: Path) -> None:
    """--runs-dir pointed at the workspace (or a checkout's results/) once deleted its health/, reports/
    and runs/: only <campaign>-<UTC stamp> directories (the names `commcamp run` gives) are run directories."""
    workspace = tmp_path / "workspace"
    for name in ("health", "reports", "runs"):
        make_run_dir(workspace, name, 30)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    open_store(db).close()  # a store that holds nothing: no run points anywhere
    code, output = commcamp_output("results", "prune", "--runs-dir", workspace, "--keep-last", "1", "--yes",
                                   "--db", db)
    assert code == 2, output
    assert "holds no commcamp run directories" in output and "health, reports, runs" in output
    assert sorted(p.name for p in workspace.iterdir()) == ["health", "reports", "runs"]

    runs = tmp_path / "runs"
    make_run_dir(runs, "reframe", 50)  # ReFrame's own prefix (reframe_site.py): alone, nothing to prune, no refusal
    code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--keep-last", "1", "--yes", "--db", db)
    assert code == 0 and (runs / "reframe").is_dir(), output
    old = make_run_dir(runs, "smoke-20261101T000000Z", 30)
    retried = make_run_dir(runs, "smoke-20261101T000000Z-2", 29)
    trial = make_run_dir(runs, "run-20261101T000000-1a2b3c", 28)  # a tuning trial's (tuning.executors)
    workers = make_run_dir(runs, "tune-workers-20261101T000000", 27)
    newest = make_run_dir(runs, "health-localslurm-20261123T023000Z", 0.1)
    notes = make_run_dir(runs, "notes", 40)
    code, output = commcamp_output("results", "prune", "--runs-dir", runs, "--keep-last", "1", "--yes", "--db", db)
    assert code == 0, output
    assert f"skip {notes}: not a commcamp run directory" in output and (runs / "reframe").is_dir()
    assert "deleted 4 of 5 run directories" in output
    assert not any(d.exists() for d in (old, retried, trial, workers)) and newest.is_dir() and notes.is_dir()


def test_a_runs_dir_that_is_missing_or_a_file_is_refused_the_workspace_s_own_may_be_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--runs-dir` mistyped (no such directory) or naming a file said "no run directories", exit 0: refused, exit 2,
    naming it. A workspace where nothing ran yet (its runs/ not made) still has nothing to prune, exit 0."""
    (tmp_path / "file").write_text("x\n")
    for given, why in ((tmp_path / "nowhere", "no such directory"), (tmp_path / "file", "not a directory")):
        code, output = commcamp_output("results", "prune", "--keep-days", "1", "--runs-dir", given)
        assert code == 2 and "--runs-dir" in output and f"{given}: {why}" in output, output
    monkeypatch.setenv("COMMCAMP_HOME", str(tmp_path / "fresh"))
    code, output = commcamp_output("results", "prune", "--keep-days", "1")
    assert code == 0 and "no run directories" in output, output
    assert not (tmp_path / "fresh").exists()
