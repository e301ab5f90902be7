"""`commcamp tune`, `commcamp pretune`, `commcamp recommend` (and the hidden `tune-worker`).

    commcamp tune SPEC.yaml [--trials N] [--workers N --db postgresql+psycopg://...]
    commcamp tune --site localslurm --system localslurm:debug --library openmpi --op allreduce \\
        --nodes 2 --tasks-per-node 1 --sizes 64K,1M --knobs OMPI_MCA_btl_tcp_sndbuf,OMPI_MCA_btl_tcp_rcvbuf
    commcamp pretune --budget 10m --site localslurm ... --env-file tuned.env     (inside salloc/sbatch)
    commcamp recommend --site S --system X --op allreduce --nodes 8 --size 64M

Exit codes: 0 done; 1 a run or the study failed; 2 bad spec or usage; 3 (recommend) nothing measured
for that context.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns import paths
from campaigns.cli.console import make_console
from campaigns.cli.outputs import NOT_STDOUT, check_outputs
from campaigns.exit_codes import ExitCode

if TYPE_CHECKING:  # the tuner (Optuna, SQLAlchemy) loads when a command runs: `commcamp --help` stays fast
    from campaigns.tuning.session import TuningOutcome, TuningSetup
    from campaigns.tuning.spec import TuningSpec

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


def parse_duration(text: str) -> float:
    """tune's and pretune's --budget: '10m' -> 600.0; plain numbers are seconds; more than 0."""
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 90s, 10m, 1h)", param_hint="--budget")
    seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if seconds <= 0:
        raise typer.BadParameter(f"{text!r} must be more than 0 s", param_hint="--budget")
    return seconds


def _fail(console: Console, message: str, code: int = ExitCode.USAGE) -> typer.Exit:
    console.print(f"[bold red]{escape(message)}[/]", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def _setup_errors(console: Console, spec: Path | None = None, options: Mapping[str, Any] | None = None
                  ) -> Iterator[None]:
    """A spec, site, knob or database problem found while setting up, before any trial: one message, exit 2.
    A problem of a field the spec file sets (not an option given with it) names the file's line."""
    from tuners.evaluation import EvaluationAborted
    from tuners.study import StorageUnavailable

    try:
        yield
    except StorageUnavailable as exc:
        raise _fail(console, f"cannot use the {exc}") from None
    except (ValueError, EvaluationAborted) as exc:
        raise _fail(console, _at_spec_line(str(exc), spec, options or {})) from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (campaigns.cli.app.main)
        raise _fail(console, "interrupted before any trial ran: nothing was stored", ExitCode.INTERRUPTED) from None


def _at_spec_line(message: str, spec: Path | None, options: Mapping[str, Any]) -> str:
    """`FIELD: why` as `SPEC:LINE: FIELD: why` where the spec file sets FIELD and no option replaced it (checks
    after the file was read, e.g. knob names against the site's catalog, know no line)."""
    from campaigns.model.yamlio import YamlDocument, YamlModelError

    field = message.split(":", 1)[0]
    if spec is None or not field.isidentifier() or options.get(field) is not None:
        return message
    try:
        document = YamlDocument(spec)
    except YamlModelError:
        return message
    if not isinstance(document.data, dict) or field not in document.data:
        return message
    return document.with_line(f"{document.source}: {message}")


@contextmanager
def _study_errors(console: Console, url: str, outputs: Sequence[Path | None] = (),
                  resume: str = "run the same command again to resume") -> Iterator[None]:
    """The study's database unreachable at the start (exit 2) or lost on the way, files that cannot be
    written (exit 1; `outputs`: where the command writes, named when the error does not say which file),
    and Ctrl-C or SIGTERM (exit 130; `resume`: what a re-run does): one clear message instead of a
    traceback. What Optuna committed stays committed."""
    from sqlalchemy.exc import SQLAlchemyError

    from campaigns.tuning.workers import WorkersFailed
    from tuners.study import StorageUnavailable, storage_problem

    previous_hook = threading.excepthook

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        cause = _stopping_cause(args.exc_value)
        if cause is None:  # Optuna's heartbeat thread ends when the database is gone: one line, no traceback
            previous_hook(args)
            return
        name = args.thread.name if args.thread else "a thread"
        console.print(f"[yellow]{escape(name)} stopped: {escape(str(storage_problem(url, cause)))}[/]",
                      highlight=False, soft_wrap=True)

    threading.excepthook = thread_hook
    interrupted = (f"interrupted: every finished trial is stored and a running one is queued again; {resume}")
    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (campaigns.cli.app.main); the Tuner re-queued a running trial
        raise _fail(console, interrupted, ExitCode.INTERRUPTED) from None
    except StorageUnavailable as exc:
        raise _fail(console, f"cannot use the {exc}") from None
    except ValueError as exc:  # the stored study was set up differently (knobs, buckets, baseline)
        raise _fail(console, str(exc)) from None
    except WorkersFailed as exc:  # tune --workers: sbatch refused one, a worker overran, squeue stopped answering
        raise _fail(console, f"{exc}. Every finished trial is stored; run the same command again to resume.",
                    ExitCode.FAILED) from None
    except TimeoutError as exc:  # an OSError, but no file's: a wait that ran out
        raise _fail(console, f"timed out: {exc}. Every finished trial is stored; run the same command again to "
                             "resume.", ExitCode.FAILED) from None
    except OSError as exc:
        where = exc.filename or " or ".join(str(path) for path in outputs if path is not None) or "a file"
        raise _fail(console, f"cannot write {where}: {exc.strerror or exc}; files written earlier are unchanged",
                    ExitCode.FAILED) from None
    except Exception as exc:
        if _caused_by(exc, KeyboardInterrupt):  # Optuna 5 hides one that hit its tell behind an UnboundLocalError
            raise _fail(console, interrupted, ExitCode.INTERRUPTED) from None
        cause = _stopping_cause(exc)
        if cause is None:
            raise
        # A database error or an aborted evaluation (a runs directory that filled up, a store that refused a run)
        if isinstance(cause, SQLAlchemyError):
            reason, when = storage_problem(url, cause), "once the database answers"
        else:
            reason, when = cause, "once that is mended"
        raise _fail(console, f"study stopped: {reason}. Every finished trial is stored; run the same command "
                             f"again {when} (a trial that was running is queued again).", ExitCode.FAILED) from None
    finally:
        threading.excepthook = previous_hook


def _stopping_cause(exc: BaseException | None) -> BaseException | None:
    """The database error or aborted evaluation behind `exc`, if any. Optuna 5.0 can hide a database error
    that hit its own bookkeeping behind an UnboundLocalError (optuna/study/_optimize.py, _run_trial)."""
    from sqlalchemy.exc import SQLAlchemyError

    from tuners.evaluation import EvaluationAborted

    return _caused_by(exc, (SQLAlchemyError, EvaluationAborted))


def _caused_by(exc: BaseException | None,
               kinds: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of `kinds` in the chain of `exc` (itself, its cause or context, ...), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kinds):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


# Options shared by tune and pretune: None = keep the spec's value (or the model default).
SpecOpt = Annotated[Optional[Path], typer.Argument(help="tuning spec (YAML); options override its fields")]
SiteOpt = Annotated[Optional[str], typer.Option(
    help="site: <site>/site.yaml in a directory of $COMMCAMP_SITE_PATH, else site_configs/<site>/")]
SystemOpt = Annotated[Optional[str], typer.Option(help="system:partition, or a system of one partition")]
EnvironOpt = Annotated[Optional[str], typer.Option(help="programming environment / MPI (openmpi, mpich)")]
LibraryOpt = Annotated[Optional[str], typer.Option(help="library whose knobs are tuned: nccl, openmpi, mpich, ...")]
LibVersionOpt = Annotated[Optional[str], typer.Option(help="its version (default: read from a probe run)")]
OpOpt = Annotated[Optional[str], typer.Option(help="commbench op, e.g. allreduce")]
TransportOpt = Annotated[Optional[str], typer.Option(help="commbench transport of the tune: mpi or ccl")]
NodesOpt = Annotated[Optional[int], typer.Option(help="node count of the scope")]
TpnOpt = Annotated[Optional[int], typer.Option(help="ranks per node")]
GpusOpt = Annotated[Optional[int], typer.Option(help="GPUs per node of the scope")]
SizesOpt = Annotated[Optional[str], typer.Option(help="message sizes, e.g. 64K,1M,4M")]
KnobsOpt = Annotated[Optional[str], typer.Option(help="comma-separated knobs to search (default: all that apply)")]
OverridesOpt = Annotated[Optional[list[Path]], typer.Option(
    "--knob-overrides", help="knob override file (the knobs: sections: defaults, pinned, forbidden, restrict, "
    "documented, unset_equals, inert_unless_set); repeatable")]
TrialsOpt = Annotated[Optional[int], typer.Option(help="trial budget (trials counted across workers/restarts)")]
SamplerOpt = Annotated[Optional[str], typer.Option(help="tpe (default), gp or random")]
SeedOpt = Annotated[Optional[int], typer.Option(min=0, max=2**32 - 1, help=(
    "seed of the search: the screen's order and the sampler, 0 .. 2**32-1 (default: the order drawn for each new "
    "study, printed)"))]
ExecutorOpt = Annotated[Optional[str], typer.Option(help="reframe (campaign executor) or launcher")]
LauncherOpt = Annotated[Optional[str], typer.Option(help="launcher executor command, e.g. 'mpirun -np 4'")]
CommbenchOpt = Annotated[Optional[Path], typer.Option(help="launcher executor: commbench binary")]
DbOpt = Annotated[Optional[str], typer.Option(
    help="Optuna storage URL (default: the results database; tune --workers needs PostgreSQL)")]
PublishOpt = Annotated[Optional[Path], typer.Option(help="recommendations root (<workspace>/recommendations)")]
PluginOpt = Annotated[Optional[Path], typer.Option(help="libnccl-tuner-commcamp.so for NCCL_TUNER_PLUGIN")]
RunsOpt = Annotated[Optional[Path], typer.Option(help="where run directories go")]
StudyOpt = Annotated[Optional[str], typer.Option(
    help="study name (default: the scope + executor + a digest of the knobs and knob files)")]


def build_spec(spec_path: Path | None, fields: dict[str, Any]) -> TuningSpec:
    """The spec file with the given fields replaced, or a spec from the fields alone; ValueError with
    every problem otherwise."""
    from pydantic import ValidationError

    from campaigns.tuning.spec import TuningSpec, load_spec

    given = {k: v for k, v in fields.items() if v is not None}
    for key in ("knobs", "launcher"):
        if isinstance(given.get(key), str):
            given[key] = [k for k in re.split(r"[,\s]+", given[key]) if k] if key == "knobs" \
                else shlex.split(given[key])
    try:
        if spec_path is not None:
            base = load_spec(spec_path).model_dump()
            return TuningSpec.model_validate({**base, **given})
        return TuningSpec.model_validate(given)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
                             for e in exc.errors())
        raise ValueError(f"invalid tuning spec: {problems}") from None


def _slurm_count(*names: str) -> int | None:
    """The first of the Slurm variables `names` that is set, as a count (None: none is set); ValueError
    naming the variable and its value when it is not a positive number."""
    for name in names:
        text = os.environ.get(name)
        if text:
            if not text.strip().isdecimal() or int(text) < 1:
                raise ValueError(f"{name}={text!r} is not a positive whole number (pretune takes the allocation's "
                                 "node and task counts from Slurm's variables)")
            return int(text)
    return None


def _fields(**kwargs: Any) -> dict[str, Any]:
    return kwargs


def _started_trials(study: Any) -> int:
    """Trials some process took up (all but those still queued): more after `tune --workers`' jobs ended if any
    of them ran one."""
    from optuna.trial import TrialState

    return sum(trial.state != TrialState.WAITING for trial in study.get_trials(deepcopy=False))


def check_database(spec: TuningSpec) -> None:
    """ValueError naming --db for a study database that would not outlive the command (in-memory SQLite): the
    trials, the study and the runs stored there would be lost, the answer printed as if they were kept."""
    from campaigns.store import StoreError
    from campaigns.store.store import check_persistent

    try:
        check_persistent(spec.storage_url())
    except StoreError as exc:
        raise ValueError(f"--db: {exc}") from None


def per_size_paths(spec: TuningSpec) -> dict[str, Path | None]:
    """The paths a tune with the per-size stage puts into its jobs' environment (none without it): its rule files or
    tuner config under --publish-dir (published) and --runs-dir (the deployed set's check), the tuner plugin
    (--plugin-library, else the one `commcamp plugin build` makes)."""
    if not spec.per_size.enabled:
        return {}
    plugin = Path(spec.plugin_library) if spec.plugin_library else (
        paths.plugin_build_dir() / paths.PLUGIN_LIBRARY if spec.library in ("nccl", "rccl") else None)
    return {"--publish-dir": Path(spec.publish_dir) if spec.publish_dir else None, "--runs-dir": Path(spec.runs_dir),
            "--plugin-library": plugin}


def pretune_refusals(spec: TuningSpec, spec_path: Path | None) -> None:
    """pretune runs trials, finalization, then the env file: no per-size stage and no check of the deployed set.
    A spec that asks for them would be applied by half: ValueError naming each such field (with the spec file's
    line)."""
    from campaigns.model.yamlio import YamlDocument, YamlModelError, format_loc

    problems: list[tuple[tuple[str, str], str]] = []
    if spec.per_size.enabled:
        problems.append((("per_size", "enabled"), "true asks for the per-size stage, which pretune does not run (nor "
                                                  "the deployed set's check after it): set it false here, or tune the "
                                                  "per-size rules with `commcamp tune`"))
    if not spec.finalize.never_slower:
        problems.append((("finalize", "never_slower"), "false lets an environment slower at some sizes through for "
                                                       "per-size rules to restore them, which pretune does not make: "
                                                       "set it true"))
    if not problems:
        return
    document = None
    if spec_path is not None:
        try:
            document = YamlDocument(spec_path)
        except YamlModelError:
            pass
    raise ValueError("; ".join(document.problem(loc, why) if document is not None else f"{format_loc(loc)}: {why}"
                               for loc, why in problems))


def launcher_lines(spec: TuningSpec) -> list[str]:
    """The launcher executor's command before commbench, as it runs (a bare srun completed)."""
    return [f"launcher: {shlex.join(spec.launcher)}"] if spec.executor == "launcher" and spec.launcher else []


def describe(setup: TuningSetup) -> list[str]:
    space = ", ".join(setup.space.knob_names)
    return [f"scope: {setup.scope.describe()}",
            f"study: {setup.study_name}",
            f"knobs searched: {space}",
            f"knob files: {', '.join(setup.knob_files) or 'none'}; pinned: {setup.catalog.pinned or 'none'}",
            "size buckets: " + ", ".join(f"{b.name} ({b.metric})" for b in setup.buckets),
            f"site defaults (trial 0): {setup.catalog.default_env(setup.space.knob_names) or 'library defaults'}",
            *([f"inherited from this environment, in every trial (no knob; said in the published files): "
               f"{' '.join(f'{k}={v}' for k, v in setup.inherited.items())}"] if setup.inherited else []),
            *([f"knobs set in this environment, left out of every trial (the published files unset them): "
               f"{' '.join(f'{k}={v}' for k, v in setup.stripped.items())}"] if setup.stripped else []),
            *launcher_lines(setup.spec)]


def plan_lines(spec: TuningSpec, knob_files: Sequence[str]) -> list[str]:
    """What a dry run can tell before the probe run that reads the library's version."""
    from campaigns.tuning.session import executor_label
    from tuners.evaluation import format_bytes

    return [f"scope: site={spec.site} system={spec.system} library={spec.library} (version: read by a probe run "
            f"when the study runs; give --library-version to see the study and its search space) op={spec.op} "
            f"transport={spec.transport} nodes={spec.nodes} gpus_per_node={spec.gpus_per_node} "
            f"tasks_per_node={spec.tasks_per_node}",
            f"study: {spec.study or 'the scope + ' + executor_label(spec) + ' + a digest of the knob setup'}",
            f"knobs asked for: {', '.join(spec.knobs) if spec.knobs else 'every catalog knob that applies'}",
            f"knob files: {', '.join(knob_files) or 'none'}",
            f"sizes: {', '.join(format_bytes(size) for size in spec.sizes)}; budget: "
            + ", ".join(part for part in (f"{spec.trials} trials" if spec.trials else "",
                                          f"{spec.budget_s:.0f} s" if spec.budget_s else "") if part),
            *launcher_lines(spec)]


def report_lines(outcome: TuningOutcome, seed: int | None = None) -> list[str]:
    """What a tune says at its end; `seed` the one asked for (--seed), said unused where the study has its own."""
    from tuners.study import SCREEN_SEED, dropped_in_context, dropped_knobs, study_progress
    from tuners.writers import verdict

    progress = study_progress(outcome.study)
    lines = [f"trials: {progress.counted} counted ({progress.complete} complete, {progress.failed} failed)"]
    if SCREEN_SEED in outcome.study.user_attrs:
        own = outcome.study.user_attrs[SCREEN_SEED]
        lines.append(f"screen order: seed {own} (the study's; --seed with that value gives a new study the same "
                     "order)" + (f"; --seed {seed} not used: it seeds a new study only" if seed not in (None, own)
                                 else ""))
    lines.extend(f"left the search: {name} ({why})"
                 for name, why in dropped_knobs(outcome.study).items())
    lines.extend(f"left the search: {name} ({why})"  # beside some values of the knobs its reading depends on
                 for name, contexts in dropped_in_context(outcome.study).items() for _, why in contexts)
    if progress.best_speedup is not None:
        lines.append(f"best trial: {(progress.best_speedup - 1) * 100:+.1f}% vs the defaults (single measurement)")
    rec = outcome.recommendation
    if rec is None:
        return lines
    lines.append(f"decision: {verdict(rec.decision, rec.gain, rec.closest, rec.held_out)}")
    if rec.deployed is not None:
        lines.append(rec.deployed.describe())
    lines.append("export: " + (" ".join(f"{k}={v}" for k, v in rec.env.items()) or "(nothing)")
                 + ("; unset: " + " ".join(rec.unset) if rec.unset else ""))
    for size in rec.per_size:
        lines.append(f"  {size.bucket:>16} {size.metric:8} {size.decision}"
                     + (f" {size.gain.median:+.1%}" if size.gain else "")
                     + (f" (held out {size.held_out.median:+.1%})" if size.held_out else "")
                     + (f" (deployed set {rec.deployed.buckets[size.bucket].median:+.1%})"
                        if rec.deployed and not rec.deployed.withdrawn and size.bucket in rec.deployed.buckets else ""))
    lines.extend(f"note: {n}" for n in [*rec.evidence.notes, *rec.plugin_notes])
    if outcome.published is not None:
        lines.append(f"published: {outcome.published.recommendations} ({outcome.published.env_file.name}, "
                     f"module {outcome.published.module_name}"
                     + (f", {outcome.published.tuner_config}" if outcome.published.tuner_config else "") + ")")
        if outcome.published.replaced:
            lines.append(f"replaced the scope's earlier entry: {outcome.published.replaced}")
    return lines


def register(app: typer.Typer) -> None:
    @app.command()
    def tune(
        spec: SpecOpt = None, site: SiteOpt = None, system: SystemOpt = None, environ: EnvironOpt = None,
        library: LibraryOpt = None, library_version: LibVersionOpt = None, op: OpOpt = None,
        transport: TransportOpt = None, nodes: NodesOpt = None, tasks_per_node: TpnOpt = None,
        gpus_per_node: GpusOpt = None, sizes: SizesOpt = None, knobs: KnobsOpt = None,
        knob_overrides: OverridesOpt = None, trials: TrialsOpt = None,
        budget: Annotated[Optional[str], typer.Option(help="wall-time budget of the trials, e.g. 10m")] = None,
        sampler: SamplerOpt = None, seed: SeedOpt = None, executor: ExecutorOpt = None,
        launcher: LauncherOpt = None, commbench: CommbenchOpt = None, db: DbOpt = None,
        finalize: Annotated[Optional[bool], typer.Option(
            "--finalize/--no-finalize", help="re-measure the best candidates and decide (default on)")] = None,
        publish_dir: PublishOpt = None,
        no_publish: Annotated[bool, typer.Option("--no-publish", help=(
            "write no recommendation files (and take no warm start from those published)"))] = False,
        plugin_library: PluginOpt = None, runs_dir: RunsOpt = None, study: StudyOpt = None,
        workers: Annotated[int, typer.Option(
            min=0, help="run the trials in N Slurm jobs on one study (PostgreSQL); 0: here, in this process")] = 0,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="show scope, space and budget; run nothing")] = False,
        summary: Annotated[Optional[Path], typer.Option(
            help=f"write a JSON summary (trials, evidence, files, provenance) here ({NOT_STDOUT})")] = None,
    ) -> None:
        """Tune communication knobs for one scope: trials (commbench runs with the knobs applied), then
        finalization (interleaved re-measurement, Wilcoxon + Holm) and recommendation files."""
        from campaigns.tuning.session import (NO_TRIAL_COMPLETED, TuningSession, check_spec, make_tuner,
                                              measurement_setup, prepare, study_name)
        from campaigns.tuning.workers import (GRACE_S, completed_launcher, idle_workers_problem, submit_workers,
                                              wait_for_jobs, worker_finished, worker_spec, worker_time_limit_min)
        from tuners.study import study_progress

        console, errors = make_console(), make_console(stderr=True)
        fields = _fields(site=site, system=system, environ=environ, library=library,
                         library_version=library_version, op=op, transport=transport, nodes=nodes,
                         tasks_per_node=tasks_per_node, gpus_per_node=gpus_per_node, sizes=sizes, knobs=knobs,
                         knob_overrides=knob_overrides, trials=trials,
                         budget_s=parse_duration(budget) if budget else None, sampler=sampler, seed=seed,
                         executor=executor, launcher=launcher, commbench=commbench, db=db,
                         plugin_library=plugin_library, runs_dir=runs_dir, publish_dir=publish_dir, study=study)
        with _setup_errors(errors, spec, fields):
            spec_obj = build_spec(spec, fields)
            if finalize is not None:
                spec_obj = spec_obj.model_copy(update={"finalize": spec_obj.finalize.model_copy(
                    update={"enabled": finalize})})
            if no_publish:
                spec_obj = spec_obj.model_copy(update={"publish_dir": None})
            spec_obj = completed_launcher(spec_obj, inside_allocation=bool(os.environ.get("SLURM_JOB_ID")))
            check_database(spec_obj)
            check_outputs({"--summary": summary},
                          {"--publish-dir": spec_obj.publish_dir, "--runs-dir": spec_obj.runs_dir},
                          per_size_paths(spec_obj))
            if workers and spec_obj.storage_url().startswith("sqlite"):
                raise ValueError("parallel workers need PostgreSQL storage (--db postgresql+psycopg://...): "
                                 "SQLite takes one writer process at a time")
            # workers launch with srun: the spec's launcher runs here for the version's probe run and for what this
            # process does after the trials (finalization, the per-size sweep, the deployed-set check)
            runs_here = (not workers or spec_obj.library_version is None or spec_obj.finalize.enabled
                         or spec_obj.per_size.enabled)
            if dry_run and spec_obj.library_version is None:  # the version needs a probe run: not in a dry run
                _, knob_files = check_spec(spec_obj, launcher_runs_here=runs_here)
                for line in plan_lines(spec_obj, knob_files):
                    console.print(escape(line), highlight=False, soft_wrap=True)
                return
            setup = prepare(spec_obj, launcher_runs_here=runs_here)
            if workers:  # the workers run the trials (srun steps): the study is named, and measured, as theirs
                measured_as = measurement_setup(worker_spec(spec_obj), setup.knob_files, setup.space, setup.inherited)
                spec_obj = spec_obj.model_copy(update={"study": study_name(worker_spec(spec_obj), setup.scope,
                                                                           setup.knob_files, setup.space,
                                                                           setup.inherited)})
                setup = dataclasses.replace(setup, spec=spec_obj, study_name=spec_obj.study, measured_as=measured_as)
        for line in describe(setup):
            console.print(escape(line), highlight=False, soft_wrap=True)
        if dry_run:
            return
        resume = "run the same command again to resume" + (" (its Slurm workers were cancelled)" if workers else "")
        with _study_errors(errors, spec_obj.storage_url(), [spec_obj.publish_dir, summary], resume=resume):
            session = TuningSession(setup)
            if workers:
                tuner = make_tuner(setup)
                # created once (defaults + seeds enqueued) before the workers race for it
                started = _started_trials(tuner.load_study())
                directory = Path(spec_obj.runs_dir) / f"tune-workers-{time.strftime('%Y%m%dT%H%M%S')}"
                ids = submit_workers(spec_obj, workers, directory, os.environ)
                console.print(f"submitted {workers} tuning workers: Slurm jobs {', '.join(map(str, ids))} "
                              f"(output in {directory})")
                # However long they wait in the queue; each, once running, within its -t (and Slurm's grace)
                wait_for_jobs(ids, os.environ, run_limit_s=worker_time_limit_min(spec_obj) * 60 + GRACE_S,
                              log=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
                collected = session.collect(tuner)
                if _started_trials(collected.study) == started and not worker_finished(directory):
                    raise _fail(errors, idle_workers_problem(directory, ids), ExitCode.FAILED)
            else:
                session.trials()
            outcome = session.finish()
            session.summary(summary)
        for line in report_lines(outcome, spec_obj.seed):
            console.print(escape(line), highlight=False, soft_wrap=True)
        unpublished = outcome.untested or outcome.per_size_failed
        if unpublished is not None:
            kept = "" if spec_obj.publish_dir is None else f" (what {spec_obj.publish_dir} holds is unchanged)"
            raise _fail(errors, f"{unpublished}: nothing published{kept}", ExitCode.FAILED)
        if study_progress(outcome.study).complete == 0:
            raise _fail(errors, NO_TRIAL_COMPLETED, ExitCode.FAILED)

    @app.command("tune-worker", hidden=True)
    def tune_worker(spec: Annotated[Path, typer.Argument(help="worker spec (JSON) written by commcamp tune")]) -> None:
        """One tuning worker (a Slurm job of `commcamp tune --workers N`): trials until the study's budget is met."""
        from campaigns.tuning.spec import TuningSpec
        from campaigns.tuning.session import make_tuner, prepare
        from tuners.evaluation import EvaluationAborted
        from tuners.study import study_progress

        try:
            spec_obj = TuningSpec.model_validate_json(spec.read_text())
            setup = prepare(spec_obj)
        except (OSError, ValueError, EvaluationAborted) as exc:
            raise _fail(make_console(stderr=True), str(exc)) from None
        with _study_errors(make_console(stderr=True), spec_obj.storage_url()):
            study = make_tuner(setup).run()
        progress = study_progress(study)
        print(f"worker done: study {setup.study_name}: {progress.counted} counted trials, "
              f"{len(setup.evaluator.durations_s)} run here", flush=True)

    @app.command()
    def pretune(
        budget: Annotated[str, typer.Option(help="total wall time: trials, then finalization (e.g. 10m)")],
        env_file: Annotated[Path, typer.Option(help=f"sourceable file to write (export/unset lines; {NOT_STDOUT})")],
        spec: SpecOpt = None, site: SiteOpt = None, system: SystemOpt = None, environ: EnvironOpt = None,
        library: LibraryOpt = None, library_version: LibVersionOpt = None, op: OpOpt = None,
        transport: TransportOpt = None, gpus_per_node: GpusOpt = None, sizes: SizesOpt = None,
        knobs: KnobsOpt = None, knob_overrides: OverridesOpt = None,
        trials: Annotated[Optional[int], typer.Option(
            help="trial budget of this pretune's own study (a new one each run)")] = None,
        sampler: SamplerOpt = None, seed: SeedOpt = None, commbench: CommbenchOpt = None, db: DbOpt = None,
        publish_dir: Annotated[Optional[Path], typer.Option(
            help="also publish to this recommendations root (default: only the env file)")] = None,
        runs_dir: RunsOpt = None,
        study: Annotated[Optional[str], typer.Option(help=(
            "name stem of this run's study (default: the scope + srun + a digest of the knob setup); each "
            "pretune makes a study of its own, <stem>/job<SLURM_JOB_ID>-<UTC time>, seeded with the best "
            "settings of earlier studies of that stem"))] = None,
        trial_share: Annotated[float, typer.Option(help="share of the budget for trials (rest: finalization)")] = 0.5,
        summary: Annotated[Optional[Path], typer.Option(
            help=f"write a JSON summary (trials, evidence, files, provenance) here ({NOT_STDOUT})")] = None,
    ) -> None:
        """Autotune inside an existing Slurm allocation (salloc/sbatch) before the application runs: trials
        with srun in this allocation, finalization, then an env file for the job script to source."""
        from campaigns.tuning.session import TuningSession, UntestedDecision, make_tuner, prepare, write_env_file
        from campaigns.store import display_url, on_network_filesystem
        from campaigns.tuning.workers import slurm_launcher
        from tuners.study import best_envs_of_studies, open_storage, study_progress

        console, errors = make_console(), make_console(stderr=True)
        if not os.environ.get("SLURM_JOB_ID"):
            raise _fail(errors, "pretune runs inside a Slurm allocation (salloc or an sbatch script): "
                                "SLURM_JOB_ID is not set")
        total = parse_duration(budget)
        if not 0.1 <= trial_share <= 0.9:
            raise _fail(errors, f"--trial-share {trial_share} must be within 0.1 .. 0.9")
        with _setup_errors(errors):
            nodes = _slurm_count("SLURM_JOB_NUM_NODES", "SLURM_NNODES") or 1
            tasks = _slurm_count("SLURM_NTASKS") or nodes
            # Slurm's "2(x3)" or "3,1"; without -n (SLURM_NTASKS unset) it counts CPUs, and pretune runs 1 per node
            layout = os.environ.get("SLURM_TASKS_PER_NODE", "") if os.environ.get("SLURM_NTASKS") else ""
            per_node = {int(m.group(1)) for item in layout.split(",") if (m := re.fullmatch(r"(\d+)(\(x\d+\))?",
                                                                                            item.strip()))}
            if tasks % nodes or len(per_node) > 1:  # the scope is nodes x tasks per node: the job must be that
                raise ValueError(f"SLURM_NTASKS={tasks} on {nodes} nodes (SLURM_TASKS_PER_NODE={layout or 'unset'}): "
                                 "pretune tunes the same tasks on every node (give the allocation "
                                 "--ntasks-per-node)")
        fields = _fields(site=site, system=system, environ=environ, library=library,
                         library_version=library_version, op=op, transport=transport, nodes=nodes,
                         tasks_per_node=max(1, tasks // nodes), gpus_per_node=gpus_per_node, sizes=sizes,
                         knobs=knobs, knob_overrides=knob_overrides, trials=trials, budget_s=total * trial_share,
                         sampler=sampler, seed=seed, executor="launcher", launcher="srun", commbench=commbench,
                         db=db, runs_dir=runs_dir, publish_dir=publish_dir)
        started = time.monotonic()
        with _setup_errors(errors, spec, fields):
            spec_obj = build_spec(spec, fields)
            pretune_refusals(spec_obj, spec)
            check_database(spec_obj)
            # A run that hangs (a crashed rank can leave srun waiting) may cost at most a fifth of the budget.
            spec_obj = spec_obj.model_copy(update={"launcher": slurm_launcher(spec_obj, inside_allocation=True),
                                                   "publish_dir": publish_dir,
                                                   "time_limit_s": min(spec_obj.time_limit_s, max(30, int(total / 5)))})
            check_outputs({"--env-file": env_file, "--summary": summary},
                          {"--publish-dir": publish_dir, "--runs-dir": spec_obj.runs_dir}, per_size_paths(spec_obj))
            setup = prepare(spec_obj, inside_allocation=True)
            filesystem = on_network_filesystem(spec_obj.storage_url())
            if filesystem is not None:  # pretune runs in every job: many hosts may write the one file at once
                errors.print(f"warning: the study's database {escape(display_url(spec_obj.storage_url()))} is SQLite "
                             f"on {filesystem}, shared by the nodes of every job that runs pretune: SQLite's locks "
                             "there may fail (sqlite.org/faq.html#q5); give --db postgresql://... or a database on "
                             "node-local disk", highlight=False, soft_wrap=True)
            # This allocation's own study: earlier studies of the stem seed it, never stand in for it.
            stem = study or setup.study_name
            setup = dataclasses.replace(setup, study_name=f"{stem}/job{os.environ['SLURM_JOB_ID']}-"
                                                          f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
        for line in describe(setup):
            console.print(escape(line), highlight=False, soft_wrap=True)
        with _study_errors(errors, spec_obj.storage_url(), [env_file, spec_obj.publish_dir, summary],
                           resume=f"{env_file} not written; a re-run is seeded with this study's best settings"):
            storage = open_storage(spec_obj.storage_url(), heartbeat_interval=spec_obj.heartbeat_s,
                                   grace_period=2 * spec_obj.heartbeat_s)
            seeds = best_envs_of_studies(storage, stem, setup.space)
            if seeds:
                console.print(f"seeded with {len(seeds)} setting(s) of the earlier studies {escape(stem)} and "
                              f"{escape(stem)}/...",
                              highlight=False, soft_wrap=True)
            session = TuningSession(setup)
            outcome = session.trials(make_tuner(setup, storage=storage, progress=True,
                                                timeout_s=total * trial_share, seed_envs=seeds))
            durations = setup.evaluator.durations_s

            def untested(why: str) -> typer.Exit:  # the summary still tells what ran (as tune's does)
                outcome.untested = why
                session.summary(summary)
                return _fail(errors, f"{why}; {env_file} not written", ExitCode.FAILED)

            if not durations:
                raise untested(f"no trial ran in this allocation within {total * trial_share:.0f} s of trials")
            per_run = sum(durations) / len(durations)
            left = total - (time.monotonic() - started)
            try:
                recommendation = session.finalize(max_evaluations=max(0, int(left // per_run)), deadline=started + total)
            except UntestedDecision as exc:
                raise untested(str(exc)) from None
            assert outcome.report is not None
            # No round ran (no candidate; the defaults completed, or finalize() refuses): keeping the defaults
            # is backed by measurements only where other settings were tried here and failed.
            if outcome.report.rounds_used == 0 and study_progress(outcome.study).counted < 2:
                raise untested("only the defaults were measured in this allocation: a decision now would be "
                               "untested (give a larger --budget)")
            session.publish()
            write_env_file(env_file, recommendation, setup.catalog)
            session.summary(summary)
        for line in report_lines(outcome, spec_obj.seed):
            console.print(escape(line), highlight=False, soft_wrap=True)
        console.print(f"wrote {env_file} after {time.monotonic() - started:.0f} s of a {total:.0f} s budget "
                      f"(source it before the application's srun)")

    @app.command()
    def recommend(
        site: Annotated[str, typer.Option(help="site")],
        system: Annotated[str, typer.Option(help="system, or system:partition (as tune takes it)")],
        op: Annotated[str, typer.Option(help="commbench op, e.g. allreduce")],
        nodes: Annotated[int, typer.Option(help="node count of the job")],
        size: Annotated[Optional[str], typer.Option(help="message size, e.g. 64M")] = None,
        gpus_per_node: GpusOpt = None,
        tasks_per_node: Annotated[Optional[int], typer.Option(
            help="ranks per node of the job (needed when scopes of several are published)")] = None,
        partition: Annotated[Optional[str], typer.Option(help="partition")] = None,
        transport: Annotated[Optional[str], typer.Option(
            help="commbench transport of the published scope (mpi, ccl, ...)")] = None,
        library: LibraryOpt = None,
        library_version: Annotated[Optional[str], typer.Option(
            help="its version, as tune's --library-version (needed when several are published)")] = None,
        root: Annotated[Optional[Path], typer.Option(
            help="recommendations root \\[default: <workspace>/recommendations]")] = None,
    ) -> None:
        """Print the published settings for a job context and the measured scope they come from. A node
        count, GPU or rank count, size or library version that was not measured is said so; nothing is extrapolated,
        and of several matching scopes (e.g. two library versions) none is chosen: the options that pick one
        are listed."""
        from campaigns.tuning.lookup import check_query
        from campaigns.tuning.spec import site_knob_catalog
        from tuners.evaluation import format_bytes
        from tuners.recommend import bucket_decision, format_lookup, lookup

        errors = make_console(stderr=True)
        system, _, named = system.partition(":")
        if named and partition not in (None, named):
            raise _fail(errors, f"--system {system}:{named} and --partition {partition} name two partitions")
        partition = partition or named or None
        if root is not None and not root.is_dir():  # a typo would read as "nothing measured" (exit 3)
            raise _fail(errors, f"--root {root}: no such directory")
        root = root or paths.recommendations_dir()
        try:
            size_bytes = check_query(root, site, system, partition=partition, op=op, nodes=nodes,
                                     gpus_per_node=gpus_per_node, tasks_per_node=tasks_per_node, transport=transport,
                                     library=library, library_version=library_version, size=size)
            result = lookup(root, site, system, op=op, nodes=nodes, gpus_per_node=gpus_per_node,
                            tasks_per_node=tasks_per_node, partition=partition, transport=transport, library=library,
                            library_version=library_version, size=size_bytes,
                            catalog=site_knob_catalog(site, unknown_is_base=True)[0])
        except ValueError as exc:
            raise _fail(errors, str(exc)) from None
        print(format_lookup(result))
        if size_bytes is not None and result.size_result is not None and result.recommendation is not None:
            print(f"# size {format_bytes(size_bytes)}: bucket [{result.size_result.min_bytes}, "
                  f"{result.size_result.max_bytes}] B -> {bucket_decision(result.recommendation, result.size_result)}")
        if not result.measured:
            raise typer.Exit(ExitCode.NOT_JUDGED)
