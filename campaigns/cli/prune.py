"""`commcamp results prune`: retention for the run directories under results/runs (ReFrame stage and
output trees, job scripts, commbench outputs of every campaign, health night and tuning trial), which
grow by megabytes per hour of use while what matters is in the results store.

A run directory is kept while it is among the newest `--keep-last` or younger than `--keep-days`; the
others go, only with `--yes` (without it, the command says what it would delete). A directory that the
results store (a run's reason names a file in it: a failed run's names its files) or a health verdict
(results/health/*.json, `run_dirs`, also of its `earlier_verdicts`) still points to is kept and named with what
points to it, unless `--include-referenced`; one a process is writing (campaigns.locks: a campaign or a tune
running now) is kept always. "Last written" is its newest file's time.
Only directories named as `commcamp run` and `commcamp tune` name them are run directories
(<campaign>-<UTC stamp>: campaigns.reframe.runner.RUN_DIR_NAME; run-, reframe-, deployed-, tune-workers-<stamp>:
campaigns.tuning.executors.TUNING_DIR_NAME); anything else there (ReFrame's own prefix results/runs/reframe, a
workspace's health/ when --runs-dir names the workspace by mistake) is left alone and named; a directory holding
none is refused."""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns import paths
from campaigns.cli.options import DbOption, expected_errors
from campaigns.locks import IN_USE, is_in_use

HEALTH_DIR = "health"  # beside the runs directory: campaigns.paths.health_dir(), health verdicts' default place
REFRAME_PREFIX = "reframe"  # site_configs/reframe_site.py DEFAULT_PREFIX: <runs directory>/reframe


@dataclass
class RunDirectory:
    path: Path
    modified: float
    files: int = 0
    size: int = 0
    referenced_by: list[str] = field(default_factory=list)

    @classmethod
    def measure(cls, path: Path) -> RunDirectory:
        """The directory's files, their size and when the last was written (a file written deep inside does not
        touch the directory's own time: a run writing for hours read as written at its start)."""
        entry = cls(path, path.stat().st_mtime)
        for item in path.rglob("*"):
            if item.is_file() and not item.is_symlink() and item.name != IN_USE:  # the marker: bookkeeping
                stat = item.stat()
                entry.files += 1
                entry.size += stat.st_size
                entry.modified = max(entry.modified, stat.st_mtime)
        return entry

    def describe(self) -> str:
        day = datetime.fromtimestamp(self.modified, UTC).strftime("%Y-%m-%d %H:%M")
        return f"{self.path} (last written {day} UTC, {self.files} files, {self.size / 2**20:.1f} MiB)"


def expired(directories: list[RunDirectory], keep_days: int | None, keep_last: int | None,
            now: float) -> list[RunDirectory]:
    """The directories outside both retention rules (newest first in, oldest first out)."""
    newest_first = sorted(directories, key=lambda d: d.modified, reverse=True)
    kept_last = set(id(d) for d in newest_first[:keep_last]) if keep_last is not None else set()
    return [d for d in reversed(newest_first) if id(d) not in kept_last
            and (keep_days is None or d.modified < now - keep_days * 86400)]


def mark_references(directories: list[RunDirectory], runs_dir: Path, db: str | None) -> None:
    """Who still points into each directory: stored runs whose reason names a path in it, and health
    verdicts that list it among their run directories."""
    if not directories:
        return
    prefixes = {str(d.path.resolve()): d for d in directories}

    def pointed_to(text: str) -> list[RunDirectory]:
        return [d for prefix, d in prefixes.items() if text == prefix or f"{prefix}/" in text]

    from campaigns.store import open_store

    with open_store(db, create=False) as store:  # only read: a mistyped --db is refused, never made (empty)
        for run in store.runs():
            for directory in pointed_to(run.reason or ""):
                directory.referenced_by.append(f"stored run {run.id} ({run.run_key}: {run.status})")
    # health verdicts go to the workspace's health/ (`run` writes them there whatever its --runs-dir), and to one
    # beside a runs directory that is not the workspace's
    places = sorted({paths.health_dir().resolve(), (runs_dir.parent / HEALTH_DIR).resolve()})
    for verdict in sorted(path for place in places for path in place.glob("*.json")):
        try:
            night = json.loads(verdict.read_text(encoding="utf-8"))
            run_dirs = [run_dir for one in [night, *(night.get("earlier_verdicts") or [])]
                        for run_dir in one.get("run_dirs") or []]
        except (OSError, ValueError, AttributeError, TypeError):
            continue  # not a verdict of ours
        for run_dir in run_dirs:
            for directory in pointed_to(str(Path(run_dir).resolve())):
                directory.referenced_by.append(f"health verdict {verdict}")


def prune(keep_days: Annotated[Optional[int], typer.Option(
              min=0, help="keep run directories written within the last N days")] = None,
          keep_last: Annotated[Optional[int], typer.Option(
              min=1, help="keep the N most recently written run directories")] = None,
          yes: Annotated[bool, typer.Option("--yes", help="delete (without it: only say what would go)")] = False,
          include_referenced: Annotated[bool, typer.Option(
              "--include-referenced",
              help="delete directories the store or a health verdict still points to as well")] = False,
          runs_dir: Annotated[Optional[Path], typer.Option(
              help="where the run directories are [default: <workspace>/runs]")] = None,
          db: DbOption = None) -> None:
    """Delete old run directories (<workspace>/runs): those outside --keep-days and --keep-last; a dry run
    unless --yes. Directories the results store or a health verdict still points to are kept (and
    named) unless --include-referenced."""
    if keep_days is None and keep_last is None:
        raise typer.BadParameter("say what to keep: --keep-days N and/or --keep-last N", param_hint="--keep-days")
    console = Console()
    if runs_dir is None:
        runs_dir = paths.runs_dir()
        if not runs_dir.exists():  # a workspace where nothing ran yet
            console.print(f"no run directories: {escape(str(runs_dir))} does not exist")
            return
    if not runs_dir.is_dir():  # a mistyped --runs-dir would read as "nothing to prune"
        raise typer.BadParameter(f"{runs_dir}: " + ("not a directory" if runs_dir.exists() else "no such directory"),
                                 param_hint="--runs-dir")
    from campaigns.reframe.runner import RUN_DIR_NAME
    from campaigns.tuning.executors import TUNING_DIR_NAME

    with expected_errors():
        subdirectories = [p for p in sorted(runs_dir.iterdir()) if p.is_dir()]
    others = [p for p in subdirectories
              if p.is_symlink() or not (RUN_DIR_NAME.fullmatch(p.name) or TUNING_DIR_NAME.fullmatch(p.name))]
    # not a runs directory: deleting "old" ones would guess (ReFrame's own prefix alone is a runs directory's)
    if len(others) == len(subdirectories) and any(p.name != REFRAME_PREFIX for p in others):
        raise typer.BadParameter(
            f"{runs_dir} holds no commcamp run directories (<campaign>-<UTC stamp>, e.g. "
            f"smoke-20260101T020000Z), only {', '.join(p.name for p in others)}: is it the runs directory?",
            param_hint="--runs-dir")
    for other in others:
        console.print(f"skip {escape(str(other))}: not a commcamp run directory (<campaign>-<UTC stamp>)")
    with expected_errors():
        directories = [RunDirectory.measure(p) for p in subdirectories if p not in others]
        old = expired(directories, keep_days, keep_last, time.time())
        mark_references(old, runs_dir, db)
    writing = {id(d): holder for d in old if (holder := is_in_use(d.path)) is not None}
    for directory in old:
        if id(directory) in writing:  # a campaign running now: its cases would fail with their files gone
            console.print(f"keep {escape(directory.describe())}: being written ({writing[id(directory)]})")
    old = [d for d in old if id(d) not in writing]
    doomed = [d for d in old if include_referenced or not d.referenced_by]
    for directory in old:
        if directory.referenced_by and not include_referenced:
            console.print(f"keep {escape(directory.describe())}: still referenced by "
                          f"{escape('; '.join(directory.referenced_by))}")
    verb = "delete" if yes else "would delete"
    if yes and doomed and not os.access(runs_dir, os.W_OK):  # rmtree named a file inside, '.in-use', exit 1
        raise typer.BadParameter(f"{runs_dir} is not writable: nothing can be deleted there", param_hint="--runs-dir")
    for directory in doomed:
        also = f" although referenced by {'; '.join(directory.referenced_by)}" if directory.referenced_by else ""
        console.print(f"{verb} {escape(directory.describe())}{escape(also)}")
        if yes:
            with expected_errors():
                shutil.rmtree(directory.path)
    total = sum(d.size for d in doomed) / 2**20
    console.print(f"{'deleted' if yes else 'would delete'} {len(doomed)} of {len(directories)} run directories "
                  f"({sum(d.files for d in doomed)} files, {total:.1f} MiB)"
                  + ("" if yes or not doomed else "; add --yes to delete them"))
