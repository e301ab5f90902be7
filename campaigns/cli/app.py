"""`commcamp`: run benchmark campaigns through ReFrame and query the results store.

Exit codes: campaigns.exit_codes.ExitCode (the README's table): 0 everything passed, 1 a test case failed
(or could not be stored), 2 bad spec or usage, or a results database that cannot be opened (every command),
130 interrupted (Ctrl-C or SIGTERM; what finished is stored); health campaigns 0 healthy, 3 not judged,
4 degraded, 5 failed.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns import paths
from campaigns.cli import bench, knobs, plugin, report, results, site, tune
from campaigns.cli.console import make_console
from campaigns.cli.options import not_empty
from campaigns.cli.outputs import check_outputs
from campaigns.exit_codes import ExitCode

if TYPE_CHECKING:  # the modules behind the commands load when a command runs: `commcamp --help` stays fast
    from campaigns.reframe.runner import CampaignResult
    from campaigns.model.spec import Campaign
    from campaigns.store import Store


app = typer.Typer(
    help="commcamp: benchmark campaigns for HPC interconnects. Runs commbench through ReFrame on a site "
         "(site_configs/<site>/ on $COMMCAMP_SITE_PATH, then the shipped examples), stores every result in the "
         "workspace (--workspace; SQLite by default: <workspace>/commcamp.db), and queries them "
         "(`commcamp results ...`; `commcamp paths` shows where things are).",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _stored_nothing_yet(url: str) -> bool:
    """A SQLite URL whose file does not exist: nothing is stored (and a dry run must not create it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return False
    return parsed.get_backend_name() == "sqlite" and bool(parsed.database) and not Path(parsed.database).exists()


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _print_summary(console: Console, campaign: Campaign, result: CampaignResult) -> None:
    from rich import box
    from rich.table import Table

    from campaigns.slurm.nodes import nodes_out_of_service
    from campaigns.model.spec import SLURM_SCHEDULERS

    targets = sorted({f"{r.case.system}:{r.case.partition}" for r in result.results})
    table = Table(title=f"{campaign.name} on {campaign.site.name} ({', '.join(targets)})", title_justify="left",
                  caption="lat: latency (us) at the smallest size; goodput (osu_bw: its bandwidth), busbw (GB/s) "
                          "at the largest; recs: records stored",
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    columns = (["partition"] if len(targets) > 1 else []) + ["env", "op", "nodes", "ranks", "lat",
                                                              "goodput", "busbw", "recs", "result"]
    for column in columns:
        text = column in ("partition", "env", "op", "result")
        table.add_column(column, justify="left" if text else "right", no_wrap=True)
    style = {"pass": "green", "stored": "cyan", "fail": "bold red", "error": "bold red", "unplaceable": "yellow"}
    for item in result.results:
        case = item.case
        # ReFrame's figures of a case none of whose records was stored (its files gone, a failed run) are no result
        perf = {name: value for name, (value, _) in item.perf.items()} if item.num_records or item.status == "pass" \
            else {}
        row = ([f"{case.system}:{case.partition}"] if len(targets) > 1 else []) + [
            case.environ, case.op, str(case.num_nodes), str(case.num_tasks), _fmt(perf.get("small_latency")),
            _fmt(perf.get("large_goodput", perf.get("large_bandwidth"))), _fmt(perf.get("large_busbw")),
            str(item.num_records) if item.status != "stored" else "-", f"[{style[item.status]}]{item.status}[/]"]
        table.add_row(*row)
    console.print(table)
    for item in result.results:
        if item.status in ("fail", "error", "unplaceable"):
            console.print(f"[bold red]{item.status}[/] {escape(item.case.run_key)}: {escape(item.reason or '')}",
                          soft_wrap=True)
    for item in result.unstored:
        console.print(f"[bold red]not stored[/] {escape(item.case.run_key)}: {escape(item.store_error or '')}",
                      soft_wrap=True)
    if any(p.scheduler in SLURM_SCHEDULERS for p in campaign.partitions):
        for node in nodes_out_of_service({n for item in result.results for n in item.job_nodes}):
            console.print(f"[bold red]node out of service[/] {escape(node)}: jobs of this campaign ran there",
                          soft_wrap=True)


def _print_plan(console: Console, campaign: Campaign, store: Store | None, tag: str | None, runs_dir: Path) -> None:
    """The test cases and ReFrame invocations a run would make; `store` None: as if nothing were stored (--force,
    a store that holds nothing yet)."""
    from rich.table import Table

    from campaigns.slurm.placement import planned_job_options
    from campaigns.reframe.runner import plan_invocations

    cases = campaign.cases(tag)
    stored = {c.run_key for c in cases if store is not None and store.has_run(c.run_key)}
    table = Table(title=f"Campaign {campaign.name}: {len(cases)} test case(s)", title_justify="left")
    for column in ("run key", "op", "transport", "nodes", "tasks", "placement", "env", "action"):
        table.add_column(column)
    for case in cases:
        action = "skip (stored)" if case.run_key in stored else "run"
        if case.placement == "each-switch" and case.num_nodes > 1:
            # one run per leaf switch, each under a key of its own nodes: which switches are placed is the
            # topology's and the nodes' states at run time (a dry run asks Slurm nothing)
            ending = case.run_key.removeprefix(case.series_key)  # [@tag][~setup]: a tagged key ends in ~setup too
            per_switch = [] if store is None else [
                run for run in store.runs(run_key_prefix=f"{case.series_key}/", status="pass")
                if run.run_key.endswith(ending) and "@" not in run.run_key.removesuffix(ending)]
            action = (f"run per leaf switch ({len({run.run_key for run in per_switch})} switch(es) stored: "
                      "skipped)" if per_switch else "run per leaf switch")
        table.add_row(case.run_key, case.op, case.transport, str(case.num_nodes), str(case.num_tasks),
                      case.placement, case.environ, action)
    console.print(table)
    pending = [c for c in cases if c.run_key not in stored]
    for number, invocation in enumerate(plan_invocations(pending, planned_job_options), start=1):
        prefix = runs_dir / f"{campaign.name}-<time>" / f"rfm-{number}"
        console.print(f"[bold]reframe invocation {number}:[/]", escape(shlex.join(invocation.command(prefix))),
                      soft_wrap=True)


def _kind_outputs(ctx: typer.Context) -> dict[str, Path]:
    """The campaign kinds' output options given to `run`, by name in the order `run` declares them. Each kind's
    `output_option` (campaigns/kinds/table.py KINDS) is a parameter of `run` of that name: a new kind needs its
    KINDS entry and that parameter, nothing else here (tests/test_campaign_kinds.py)."""
    from campaigns.kinds.table import KINDS

    names = {kind.output_option for kind in KINDS.values() if kind.output_option}
    declared = [param.name for param in ctx.command.params]
    if lacking := sorted(names - set(declared)):
        raise RuntimeError(f"campaigns/kinds/table.py KINDS names output option(s) {lacking} that `commcamp run` "
                           "lacks: add each as a parameter of run() in campaigns/cli/app.py")
    return {name: ctx.params[name] for name in declared if name in names and ctx.params[name] is not None}


@app.command()
def run(
    ctx: typer.Context,
    spec: Annotated[Path, typer.Argument(help="campaign spec (YAML), e.g. campaigns/smoke.yaml")],
    site: Annotated[Optional[str], typer.Option(
        callback=not_empty, help="run on this site instead of the spec's (a directory under site_configs/)")] = None,
    db: Annotated[Optional[str], typer.Option(
        callback=not_empty,
        help="SQLAlchemy URL of the results database [default: $COMMCAMP_DB_URL, else <workspace>/commcamp.db]",
    )] = None,
    force: Annotated[bool, typer.Option("--force", help="run test cases again although passed runs are stored")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="validate the spec and show the test cases and ReFrame commands; run and write nothing")] = False,
    runs_dir: Annotated[Optional[Path], typer.Option(
        help="where run directories (ReFrame stage, output, report) go [default: <workspace>/runs]")] = None,
    tag: Annotated[Optional[str], typer.Option(
        help="run tag, part of every run key (health: the night; default there: today's UTC date)")] = None,
    # The kinds' output options, one per output_option of KINDS (campaigns/kinds/table.py), named alike; run()
    # reads them through _kind_outputs(ctx) only.
    verdict: Annotated[Optional[Path], typer.Option(
        help="health: the verdict JSON file [default: <workspace>/health/<campaign>-<tag>.json; "
             "<campaign>-<tag>@<site>@<system>.json where that holds another site's night]")] = None,
    report: Annotated[Optional[Path], typer.Option(
        help="characterize: the HTML report [default: <workspace>/reports/<campaign>.html]")] = None,
) -> None:
    """Run a campaign: every test case of the spec that the store does not hold as passed (all with --force).
    Health campaigns then judge the night and write a verdict; characterize campaigns write a report."""
    from campaigns.model.spec import SpecError, load_campaign

    console, errors = make_console(), make_console(stderr=True)
    # Absolute: ReFrame runs with its prefix as the working directory, where a relative path would land deeper.
    runs_option = "--runs-dir" if runs_dir is not None else "the workspace's runs directory (--runs-dir names another)"
    runs_dir = (runs_dir or paths.runs_dir()).resolve()
    try:
        campaign = load_campaign(spec, site)
    except SpecError as exc:
        errors.print(f"[bold red]invalid campaign spec[/]\n{escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE) from None
    # after the spec: the runner and the store (pandas, SQLAlchemy: most of a second) load for a valid one only
    from campaigns.kinds.table import KINDS, FinishedRun
    from campaigns.locks import Busy, campaign_lock
    from campaigns.model.site import backend_problems
    from campaigns.reframe.runner import run_campaign
    from campaigns.slurm.nodes import preflight
    from campaigns.slurm.placement import placer_for
    from campaigns.slurm.topology import PlacementError
    from campaigns.store import StoreError, default_url, open_store
    from campaigns.store.store import check_persistent
    from tuners.writers import write_target

    produced = KINDS[campaign.spec.kind].output_option
    outputs = _kind_outputs(ctx)  # --verdict, --report, ...: each kind's output_option (KINDS)
    if unused := [f"--{name}" for name in outputs if name != produced]:
        errors.print(f"[bold red]{', '.join(unused)}:[/] a {campaign.spec.kind} campaign writes no "
                     f"{' or '.join(u.lstrip('-') for u in unused)}"
                     + (f" (it writes --{produced})" if produced else ""), soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE)
    if tag is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", tag):
        errors.print(f"[bold red]--tag {escape(tag)!r}:[/] use letters, digits and . _ - (at most 64)")
        raise typer.Exit(ExitCode.USAGE)
    try:  # written after every case ran (their directories made): a path that cannot take it stops here
        for name, path in outputs.items():  # a directory, a device (/dev/full), a FIFO: never replaced by a file
            try:
                write_target(path)
            except OSError as exc:
                raise ValueError(f"--{name} {path}: {exc.strerror}") from None
        check_outputs({}, {f"--{name}": path.parent for name, path in outputs.items()})
    except ValueError as exc:
        errors.print(f"[bold red]{escape(str(exc))}[/]", soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE) from None
    kind = KINDS[campaign.spec.kind]
    tag = tag if tag is not None else kind.default_tag()
    if problems := backend_problems(campaign.site):  # a scheduler or launcher typo: every job would fail
        errors.print(f"[bold red]site {campaign.site.name}:[/]\n" + escape("\n".join(problems)), highlight=False,
                     soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE)
    if not dry_run and (problems := preflight(campaign)):
        errors.print(f"[bold red]site {campaign.site.name} cannot run jobs from here[/]\n" +
                     escape("\n".join(problems)) + f"\n(how to set it up: {campaign.site.directory / 'site.yaml'})",
                     highlight=False, soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE)
    url = db or default_url()
    try:
        check_persistent(url)  # in memory: every case's result lost when the command ends
    except StoreError as exc:
        errors.print(f"[bold red]cannot use the results store:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE) from None
    try:  # before the store is opened (and maybe created): a runs directory we cannot write stops here (a dry
        # run too: it shows where the run would write); creates nothing
        paths.probe_writable(runs_dir)
    except OSError as exc:
        errors.print(f"[bold red]{escape(runs_option)}: cannot write run directories under {escape(str(runs_dir))}:[/] "
                     f"{escape(exc.strerror or str(exc))}", soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE) from None
    if dry_run and (force or _stored_nothing_yet(url)):
        if not force:  # a mistyped --db reads the same: say which database holds nothing
            console.print(f"no results database at {escape(url)} yet: nothing is stored, every case would run",
                          soft_wrap=True)
        _print_plan(console, campaign, None, tag=tag, runs_dir=runs_dir)
        return
    placer = None
    if not dry_run:
        try:
            placer = placer_for(campaign)
        except PlacementError as exc:
            errors.print(f"[bold red]placements need the network topology:[/] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(ExitCode.USAGE) from None
    try:  # a dry run only reads: it neither creates nor upgrades the database
        store = open_store(url, create=not dry_run)
    except StoreError as exc:
        errors.print(f"[bold red]cannot use the results store:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE) from None
    with store:
        if dry_run:
            _print_plan(console, campaign, store, tag=tag, runs_dir=runs_dir)
            return
        assert placer is not None
        try:  # the kind's own stage (health's isolation pairs) runs cases too: under the same lock
            with campaign_lock(runs_dir, f"{campaign.name}@{campaign.site.name}@{campaign.system.name}",
                               warn=lambda text: errors.print(f"[yellow]{escape(text)}[/]", soft_wrap=True)):
                result = run_campaign(campaign, store, force=force, console=console, runs_dir=runs_dir, tag=tag,
                                      placer=placer)
                _print_summary(console, campaign, result)
                console.print(f"Results: {escape(result.db_url)}")
                if result.run_dir is not None:
                    console.print(f"Run directory: {result.run_dir}")
                output = outputs.get(kind.output_option or "")
                code = kind.after_run(FinishedRun(campaign, result, store, tag, console, errors, runs_dir, placer,
                                                  output))
        except StoreError as exc:
            errors.print(f"[bold red]results store:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(ExitCode.FAILED) from None
        except Busy as exc:  # nothing ran: this run failed, the spec is fine (a nightly wrapper's overlap too)
            errors.print(f"[bold red]{escape(str(exc))}[/]", highlight=False, soft_wrap=True)
            raise typer.Exit(ExitCode.FAILED) from None
        except KeyboardInterrupt:
            errors.print("[bold red]interrupted[/]: every test case that finished is stored; run the same command "
                         "again to continue (stored passes are skipped)")
            raise typer.Exit(ExitCode.INTERRUPTED) from None
    if code != ExitCode.OK:
        raise typer.Exit(code)


@app.callback()
def workspace_option(
    workspace: Annotated[Optional[str], typer.Option(
        metavar="PATH",
        help="where results, runs, verdicts, recommendations, reports and builds go [default: $COMMCAMP_HOME; "
             "in a checkout its results/, else $XDG_DATA_HOME/commcamp]")] = None,
) -> None:
    """commcamp: benchmark campaigns for HPC interconnects."""
    if workspace is not None:  # through the environment, so that ReFrame and Slurm workers get it too
        if not workspace.strip():  # Path("") is the current directory: results would land wherever one stands
            raise typer.BadParameter("is empty: give a directory (`.` for the current one)", param_hint="--workspace")
        where = Path(workspace).expanduser().resolve()
        if where.exists() and not where.is_dir():
            raise typer.BadParameter(f"{where} is not a directory", param_hint="--workspace")
        os.environ[paths.HOME_ENV] = str(where)
    for directory in paths.site_path_dirs():  # a mistyped one: a shipped example of the same name runs instead
        if not directory.is_dir():
            print(f"warning: ${paths.SITE_PATH_ENV} names {directory}, which is not a directory: no site is found "
                  "there (`commcamp site new` makes the first one)", file=sys.stderr)


@app.command("paths")
def show_paths(
    env: Annotated[bool, typer.Option("--env", help="as shell exports (what a site's env.sh evaluates)")] = False,
) -> None:
    """Where commcamp reads its shipped files and sites from, and where it writes."""
    if env:
        for name, value in paths.subprocess_env().items():
            print(f"export {name}={shlex.quote(value)}")
        return
    from sqlalchemy.exc import ArgumentError

    from campaigns.model.site import site_search_path
    from campaigns.store import URL_ENV, default_url, display_url

    try:
        database = display_url(default_url())
    except ArgumentError:
        database = f"{default_url()!r}, not a database URL"
    database += f" (${URL_ENV})" if os.environ.get(URL_ENV) else ""
    print(f"workspace: {paths.workspace()}\nresults database: {database}\nbuilds: {paths.build_dir()}\n"
          f"shipped files: {paths.DATA_ROOT}\nsite search path: {os.pathsep.join(str(p) for p in site_search_path())}")


results.register(app)
report.register(app)
bench.register(app)
tune.register(app)
plugin.register(app)
site.register(app)
knobs.register(app)


def main() -> None:
    # SIGTERM (Slurm's time limit, scancel, kill) stops commcamp as Ctrl-C does: children stopped, what
    # finished stored, a running trial queued again, one line said, exit 130 (INTERRUPTED).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        app()
    except OSError as exc:
        # a write no command expected: its standard output on a full disk (`recommend ... > /dev/full`) printed a
        # traceback
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EPIPE):
            raise
        with contextlib.suppress(OSError):
            print(f"commcamp: a write failed: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(ExitCode.FAILED)
