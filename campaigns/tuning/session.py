"""A tuning session: prepare (spec checked, executor, search space, evaluator), trials (tuners.study),
finalization, the per-size stage, publishing, and the summary with provenance."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from campaigns import paths
from campaigns.locks import keep_in_use
from campaigns.tuning.executors import (READ_LOG_ENV, SWEEP_ENV, CommbenchEvaluator, Executor, LauncherExecutor,
                                        ReframeExecutor, RunOutcome, inherited_settings, library_version,
                                        new_directory, output_tail, strip_knobs, user_parameter_file_problem)
from campaigns.tuning.spec import (TuningSpec, check_partition_size, environment_mpi, site_catalog, site_env,
                                   site_partition)
from tuners.catalog import KnobCatalog, Library
from tuners.evaluation import Evaluation, EvaluationAborted, SizeBucket, buckets_for_sizes
from tuners.finalize import Candidate, FinalReport, check_deployed, finalize, fit_budget, planned_runs
from tuners import rule_files
from tuners.per_size import (PerSizeResult, SweepError, TunerConfigError, decide_per_size, format_config,
                             load_sweep, rounds_for)
from tuners.recommendation import (Recommendation, build_recommendation, with_deployed_check, with_notes,
                                   with_per_size)
from tuners.scope import StudyScope
from tuners.space import SearchSpace, SpaceError, build_space, check_knob_names
from tuners.study import (SCREEN_SEED, StorageUnavailable, Tuner, check_reachable, finalization_candidates,
                          open_storage, setup_digest)
from tuners.writers import (PLUGIN_ENV, RECOMMENDATIONS_FILE, RULE_FILE_SUFFIX, PublishedFiles, cleared_names,
                            config_comments, env_file_text, job_cleared, load_recommendations, publish, rule_file,
                            system_dir, tuner_config_name, write_atomic)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------- the workflow
@dataclasses.dataclass
class TuningSetup:
    spec: TuningSpec
    catalog: KnobCatalog
    knob_files: list[str]
    space: SearchSpace
    scope: StudyScope
    buckets: tuple[SizeBucket, ...]
    evaluator: CommbenchEvaluator
    versions: dict[str, str]
    study_name: str
    # the knobs and per-size variables every trial ran without (stripped, and not set by the site): a job unsets them
    cleared: tuple[str, ...] = ()
    measured_as: dict[str, Any] | None = None  # measurement_setup: a study named by hand holds trials measured alike
    inherited: dict[str, str] = dataclasses.field(default_factory=dict)  # inherited_settings: in every trial
    # knobs this environment set, which no trial has (strip_knobs) and the published files unset: said at the start
    stripped: dict[str, str] = dataclasses.field(default_factory=dict)


def make_executor(spec: TuningSpec, base_env: Mapping[str, str],
                  inherited: Mapping[str, str] | None = None) -> Executor:
    """The spec's executor; `inherited` (inherited_settings, all in `base_env`) the ReFrame executor writes into
    each job's script too."""
    runs_dir = Path(spec.runs_dir)
    if spec.executor == "reframe":
        return ReframeExecutor(spec.site, spec.system, spec.environ, spec.nodes, spec.tasks_per_node, runs_dir,
                               base_env, queue_wait_s=spec.queue_wait_s, inherited=inherited)
    assert spec.launcher is not None
    commbench = spec.commbench or paths.commbench_build_dir() / f"cpu-{spec.environ}" / "commbench"
    return LauncherExecutor(spec.launcher, Path(commbench), runs_dir, base_env)


def store_ingester(url: str, scope_label: str, spec: TuningSpec) -> Any:
    """Each run goes into the results store as a run of campaign `tune` (status pass/fail, its valid
    records); the trial keeps the run's id."""
    from campaigns.store import RunInfo, StoreError, open_store

    def ingest(env: Mapping[str, str], outcome: RunOutcome, evaluation: Evaluation) -> list[str]:
        system, _, partition = spec.system.partition(":")
        info = RunInfo(run_key=f"tune/{scope_label}/{uuid.uuid4().hex}", campaign="tune", site=spec.site,
                       system=system, partition=partition, environ=spec.environ, check_name="commbench_run",
                       parameters={"op": spec.op, "sizes": list(spec.sizes), "env": dict(env),
                                   "transport": spec.transport, "batch": spec.batch, "iters": spec.iters},
                       num_nodes=spec.nodes, num_tasks=spec.ranks,
                       status="pass" if evaluation.ok else "fail",
                       reason=None if evaluation.ok else f"{evaluation.failure}: {evaluation.reason}"[:2000])
        try:
            with open_store(url) as store:
                return [f"run:{store.ingest(info, outcome.records, validated=True)}"]  # parse_record_lines checked them
        except StoreError as exc:  # not the setting's fault: the study stops and measures it again later
            raise EvaluationAborted(f"cannot store the run ({exc}); its records stay in {outcome.directory}") from exc

    return ingest


def executor_label(spec: TuningSpec) -> str:
    """What runs the trials, as a study tells it apart: `reframe`, or the launcher's program (srun, mpirun)."""
    return "reframe" if spec.executor == "reframe" else Path((spec.launcher or ["launcher"])[0]).name


def launcher_options(spec: TuningSpec) -> list[str]:
    """The launcher's options that say how the tune's runs are launched: none for srun as completed_launcher makes
    it from the scope and the site (outside an allocation and inside one alike: tune and pretune, its workers),
    a user's own otherwise (`srun --cpu-bind=none`, `mpirun --mca btl self,tcp`)."""
    from campaigns.tuning.workers import slurm_launcher

    if spec.executor != "launcher" or not spec.launcher:
        return []
    options = list(spec.launcher[1:])
    if Path(spec.launcher[0]).name == "srun" and site_partition(spec) is not None and (
            not options or options in (slurm_launcher(spec, inside)[1:] for inside in (True, False))):
        return []
    return options


def study_name(spec: TuningSpec, scope: StudyScope, knob_files: Sequence[str], space: SearchSpace,
               inherited: Mapping[str, str]) -> str:
    """`spec.study`, else the scope's name + executor + measurement_digest: trials of another executor, another
    knob setup, another measurement or launch go to a study of their own (a study named by hand is checked
    against the digest: tuners.study.Tuner's measured_as)."""
    if spec.study is not None:
        return spec.study
    return f"{scope.study_name}/{executor_label(spec)}-{measurement_digest(spec, knob_files, space, inherited)}"


def measurement_digest(spec: TuningSpec, knob_files: Sequence[str], space: SearchSpace,
                       inherited: Mapping[str, str]) -> str:
    return setup_digest(measurement_setup(spec, knob_files, space, inherited))


def measurement_setup(spec: TuningSpec, knob_files: Sequence[str], space: SearchSpace,
                      inherited: Mapping[str, str]) -> dict[str, Any]:
    """The knobs asked for, the knob files' content, the searched domains, the ranks per node, what a
    run measures (sizes, sizes per bucket, batch, iterations, warm-up, programming environment) and how it is
    launched (launcher_options; the site's setup of the partition and environment: site_setup, as a campaign's
    run key). Scopes published before they named ranks per node did not; the stored study checks the buckets'
    ranges, not their sizes; batch > 1 turns a latency into a throughput; `--mca btl self,tcp` or a site's new
    UCX_TLS measures another path, and so do the library settings inherited from the caller's environment
    (inherited_settings) and another commbench binary; a catalog whose domains changed cannot be resumed (Optuna)."""
    from campaigns.model.site import load_site
    from campaigns.model.spec import site_setup

    found = site_partition(spec)
    setup = {"knobs": spec.knobs, "unverifiable_knobs": sorted(spec.unverifiable_knobs),
             "tasks_per_node": spec.tasks_per_node, "sizes": sorted(set(spec.sizes)),
             "sizes_per_bucket": spec.sizes_per_bucket, "batch": spec.batch, "iters": spec.iters,
             "warmup": spec.warmup, "environ": spec.environ,
             "knob_files": [Path(path).read_text(errors="replace") for path in knob_files],
             "executor": executor_label(spec),
             "domains": space.domains()}
    if options := launcher_options(spec):
        setup["launcher_options"] = options
    if spec.executor == "launcher" and spec.commbench is not None:  # another binary (another MPI's) is another study
        setup["commbench"] = str(spec.commbench)
    if inherited:
        setup["inherited"] = dict(inherited)
    if found is not None:
        setup["site_setup"] = site_setup(load_site(spec.site), found[0], spec.environ)
    return setup


def check_spec(spec: TuningSpec, *, inside_allocation: bool = False, launcher_runs_here: bool = True
               ) -> tuple[KnobCatalog, list[str]]:
    """What can be checked before anything is submitted: the site, partition and environment, the nodes and
    GPUs per node the partition has (unless `inside_allocation`: pretune's allocation decides), the knob
    files, the knobs asked for (whatever the library version), the executor and the study database
    (reached, not another program's SQLite file; nothing created but the workspace when it is the workspace's
    database, as `run` does).
    Returns the site's catalog and the knob files used; ValueError (StorageUnavailable for the database)
    naming the problem."""
    from campaigns.store import StoreError, make_workspace  # lazily: the store pulls in alembic
    from campaigns.store.store import foreign_database_problem, foreign_sqlite_tables

    catalog, files = site_catalog(spec)
    if spec.knobs:
        try:
            check_knob_names(catalog, Library(spec.library), spec.knobs, op=spec.op, transport=spec.transport)
        except SpaceError as exc:
            raise ValueError(f"knobs: {exc}") from None
    unknown = [name for name in spec.unverifiable_knobs if name not in catalog]
    if unknown:  # a typo would leave the knob meant under the read-log check
        raise ValueError(f"unverifiable_knobs: {', '.join(unknown)} not in the knob catalog {catalog.source}")
    if spec.plugin_library is not None and not spec.plugin_library.is_file():  # found at the end of a tune otherwise
        raise ValueError(f"plugin_library: {spec.plugin_library} does not exist (build it: commcamp plugin build)")
    site_env(spec, {})
    if not inside_allocation:
        check_partition_size(spec)
    if spec.executor == "launcher":
        make_executor(spec, {})
        program = spec.launcher[0] if spec.launcher else ""
        # the launches inherit this process's PATH; `tune --workers` with a version given never runs this launcher
        if launcher_runs_here and shutil.which(program) is None:
            raise ValueError(f"launcher: {program!r} is not an executable program here (not on PATH or not "
                             "executable)")
        started = launcher_ranks(spec.launcher or [])
        if started is not None and started != spec.ranks:  # every trial would stop at its first run (the dry run said ok)
            raise ValueError(f"launcher: {shlex.join(spec.launcher or [])} starts {started} rank(s), the scope's job "
                             f"has {spec.ranks} (nodes {spec.nodes} x tasks_per_node {spec.tasks_per_node})")
    url = spec.storage_url()
    with contextlib.suppress(StoreError):  # a workspace that cannot be made: check_reachable says why
        make_workspace(url)
    check_reachable(url)
    if foreign := foreign_sqlite_tables(url):  # Optuna would add its tables to it
        raise StorageUnavailable(f"study storage {foreign_database_problem(url, foreign)}")
    if spec.publish_dir is not None:  # publishing reads it after every trial and finalization: a broken one stops here
        published = system_dir(Path(spec.publish_dir), spec.site, spec.system.partition(":")[0]) / RECOMMENDATIONS_FILE
        if published.is_file():
            load_recommendations(published)
    return catalog, files


# How mpirun/mpiexec and srun are told how many ranks to start: -np 4, -n 4, -n4, --np 4, --ntasks=4, ...; Open MPI's
# mpirun also takes -c 4 (srun's -c is CPUs per task)
_RANKS_OPTION = re.compile(r"(?:-np|-n|--np|--n|--ntasks)(?:=|$)|-n(?=\d)")
_MPIRUN_RANKS_OPTION = re.compile(r"(?:-np|-n|-c|--np|--n|--ntasks)(?:=|$)|-[nc](?=\d)")
_MPIRUN = re.compile(r"(?:mpirun|mpiexec|orterun|prterun)(?:[.-].*)?")


def launcher_ranks(launcher: Sequence[str]) -> int | None:
    """The ranks a launcher command starts where it says so (mpirun -np N / -c N, srun -n N / --ntasks=N); None
    otherwise (a wrapper script, srun of an allocation's tasks)."""
    option = _MPIRUN_RANKS_OPTION if launcher and _MPIRUN.fullmatch(Path(launcher[0]).name) else _RANKS_OPTION
    for i, word in enumerate(launcher[1:], start=1):
        found = option.match(word)
        if found is None:
            continue
        value = word[found.end():] or (launcher[i + 1] if i + 1 < len(launcher) else "")
        return int(value) if value.isdigit() else None
    return None


def prepare(spec: TuningSpec, *, environ: Mapping[str, str] | None = None, ingest: bool = True,
            inside_allocation: bool = False, launcher_runs_here: bool = True) -> TuningSetup:
    """Everything a study needs, checked before any trial runs (check_spec first). Without
    `library_version` one probe run with the site's defaults at the smallest size reads it from
    commbench's records."""
    catalog, files = check_spec(spec, inside_allocation=inside_allocation, launcher_runs_here=launcher_runs_here)
    library = Library(spec.library)
    environ = os.environ if environ is None else environ
    stripped = strip_knobs(environ, catalog, library)
    launch_env = site_env(spec, stripped)
    base_env = {**stripped, **launch_env}
    # whatever the library tuned: UCX or NCCL under Open MPI's mpirun read the file too
    if (library is Library.OPENMPI or environment_mpi(spec) == "openmpi") and (
            problem := user_parameter_file_problem(catalog, base_env)):
        raise ValueError(problem)
    inherited = inherited_settings(stripped, catalog, library, launch_env)
    executor = make_executor(spec, base_env, inherited)
    request = spec.request()
    version = spec.library_version
    if version is None:
        probe = executor.run({**catalog.default_env(), **READ_LOG_ENV.get(library, {})},
                             dataclasses.replace(request, sizes=request.sizes[:1], iters=1, warmup=0), False)
        version = library_version(probe.records, library)
        if version is None:
            where = f"; its files: {probe.directory}" if probe.directory is not None else ""
            raise ValueError(f"cannot tell the {library} version from the probe run "
                             f"({outcome_summary(probe)}{where}); give library_version")
    space = build_space(catalog, {library: version}, knobs=spec.knobs, op=spec.op, transport=spec.transport)
    system, _, partition = spec.system.partition(":")
    scope = StudyScope(site=spec.site, system=system, partition=partition, library=library,
                       library_version=version, op=spec.op, transport=spec.transport, nodes=spec.nodes,
                       gpus_per_node=spec.gpus_per_node, tasks_per_node=spec.tasks_per_node)
    buckets = buckets_for_sizes(spec.sizes, spec.sizes_per_bucket)
    # The site's defaults of knobs this tune does not search run in every trial, as in the site's jobs (a
    # tune of NCCL_BUFFSIZE alone on Alps keeps its NCCL_PROTO=^LL128 pin).
    executor = make_executor(spec, {**base_env, **space.launch_context}, inherited)
    ingester = store_ingester(spec.storage_url(), scope.slug, spec) if ingest else None
    evaluator = CommbenchEvaluator(executor, request, library, catalog,
                                   exempt=frozenset(spec.unverifiable_knobs), ingest=ingester, version=version,
                                   launch_context=space.launch_context)
    versions = {library.value: version, "commcamp": _git_commit()}
    cleared = tuple(cleared_names(catalog, {*launch_env, *catalog.default_env()}, library))
    return TuningSetup(spec, catalog, files, space, scope, buckets, evaluator, versions,
                       study_name(spec, scope, files, space, inherited), cleared,
                       measurement_setup(spec, files, space, inherited), inherited,
                       # the caller's values no trial has and the published files unset (not those the site sets
                       # again, nor the knobs searched)
                       {name: value for name, value in sorted(environ.items())
                        if name not in stripped and name in cleared and name not in space.knob_names})


def outcome_summary(outcome: RunOutcome) -> str:
    return (f"exit {outcome.exit_code}, {len(outcome.records)} records"
            + (f", {outcome.failure}" if outcome.failure else "") + f"; output ends: {output_tail(outcome.output)}")


@functools.cache
def _checkout_at_start() -> tuple[str, int]:
    """The checkout's commit and number of changed files when this process first asked (prepare(), at the start):
    the code it runs. A tune that takes hours can outlive an update of its checkout; read at the end, its summary
    named the new commit (a real tune on the local cluster recorded 546a1ca for code of 92d3497)."""
    if paths.CHECKOUT is None:
        return "unknown", 0
    git = ["git", "-C", str(paths.CHECKOUT)]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                                check=False).stdout.strip()
        changed = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, timeout=20,
                                 check=False).stdout.count("\n")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", 0
    return commit or "unknown", changed


def _git_commit() -> str:
    return _checkout_at_start()[0]


def make_tuner(setup: TuningSetup, *, storage: Any = None, progress: bool = False,
               timeout_s: float | None = None, n_trials: int | None = None,
               seed_envs: Sequence[Mapping[str, str]] = ()) -> Tuner:
    """The Tuner of the setup's study; `timeout_s` / `n_trials` replace the spec's budget; `seed_envs`
    are enqueued after the defaults (and the library defaults) when the study is created."""
    spec = setup.spec
    seeds = [*([{}] if spec.seed_library_defaults else []), *seed_envs]
    warm = warm_start_envs(spec.publish_dir, setup.scope, setup.space) if spec.warm_start else []
    documented = documented_envs(setup.catalog, setup.space) if spec.documented_seeds else []
    return Tuner(setup.scope, setup.space, setup.evaluator,
                 storage if storage is not None else open_storage(
                     spec.storage_url(), heartbeat_interval=spec.heartbeat_s, grace_period=2 * spec.heartbeat_s),
                 setup.buckets,
                 n_trials=n_trials if n_trials is not None else spec.trials,
                 timeout_s=timeout_s if timeout_s is not None else spec.budget_s,
                 sampler=spec.sampler, seed=spec.seed, n_startup_trials=spec.n_startup_trials,
                 screen_trials=spec.screen_trials,
                 seed_envs=seeds, documented=documented, warm_starts=warm, progress=progress,
                 study_name=setup.study_name, measured_as=setup.measured_as)


def documented_envs(catalog: KnobCatalog, space: SearchSpace) -> list[tuple[dict[str, str], str]]:
    """The site's documented settings (site.yaml knobs.documented) this space can measure: each on top of the
    site defaults, with its source. One that names a knob the space does not search, or a value the space
    does not offer, is about another scope and is left out."""
    found = []
    for setting in catalog.documented:
        if not set(setting.env) <= set(space.knob_names):
            continue
        env = {**catalog.default_env(space.knob_names), **setting.env}
        try:
            space.params_for_env({k: v for k, v in env.items() if k in space.knob_names})
        except ValueError:
            continue
        found.append((env, setting.source))
    return found


def warm_start_envs(publish_dir: Path | None, scope: StudyScope, space: SearchSpace) -> list[tuple[dict[str, str], str]]:
    """Winners published in `publish_dir` for the same site, system:partition, library, op, transport and GPUs
    per node, at any node count and library version (a related scope: its winner is a good first guess, and is
    measured here like any trial; at this node count it is what is deployed now, from an earlier tune, maybe of
    other sizes: the scope does not name its sizes), restricted to the searched knobs; with the scope each came
    from. A winner is what its .env does to the site's jobs: its `env` set and its `unset` removed on top of the
    site defaults (a knob the related tune did not search ran there at the site default). A winner whose values
    this space does not offer is left out, and so is one measured beside another baseline (warm_start_mismatch), with a
    warning saying why."""
    if publish_dir is None:
        return []
    path = system_dir(publish_dir, scope.site, scope.system) / RECOMMENDATIONS_FILE
    if not path.exists():
        return []
    same = ("partition", "library", "op", "transport", "gpus_per_node")
    found = []
    for rec in load_recommendations(path).recommendations:
        if rec.decision != "change" or any(getattr(rec.scope, field) != getattr(scope, field) for field in same):
            continue
        mismatch = warm_start_mismatch(rec, space)
        if mismatch is not None:
            logger.warning("warm start from %s skipped: %s: cut to this tune's knobs it would be a setting never "
                           "measured", rec.describe_scope(), mismatch)
            continue
        on_site = {k: v for k, v in space.catalog.default_env(space.knob_names).items() if k not in rec.unset}
        env = {k: v for k, v in {**on_site, **rec.env}.items() if k in space.knob_names}
        try:
            space.params_for_env(env)
        except ValueError:
            continue
        found.append((env, rec.describe_scope()))
    return found


def warm_start_mismatch(rec: Recommendation, space: SearchSpace) -> str | None:
    """Why a related scope's winner did not run beside this tune's baseline, or None: its baseline (its tune's site
    defaults of the knobs it searched, pins and their companions: Recommendation.baseline_env) sets a knob otherwise
    than this tune's launches do (the site's defaults and pins), or lacks one of this tune's pins; or the winner sets
    or unsets a knob this space does not search (nor a companion of one) otherwise than this tune's baseline. Such a
    winner cut to the searched knobs is not what was measured: the socket-path tune's winner, with NCCL_P2P_DISABLE=1
    and NCCL_SHM_DISABLE=1 in its baseline, was enqueued under its name on the NVLink path."""
    catalog = space.catalog
    defaults = catalog.default_env()
    here = {**{k: v for name in defaults for k, v in catalog[name].requires.items()}, **defaults}

    def shown(value: str | None) -> str:
        return "unset" if value is None else value

    problems = [f"{name}={shown(rec.baseline_env.get(name))} in its baseline, {shown(here.get(name))} here"
                for name in sorted({*rec.baseline_env, *catalog.pinned})
                if rec.baseline_env.get(name) != here.get(name)]
    inside = set(space.changeable)
    problems += [f"it sets {name}={value}, outside this tune's knobs ({shown(here.get(name))} here)"
                 for name, value in sorted(rec.env.items())
                 if name not in inside and here.get(name) != value and rec.baseline_env.get(name) != value]
    problems += [f"it unsets {name}, outside this tune's knobs ({here[name]} here)"
                 for name in sorted(rec.unset) if name not in inside and name in here]
    return "; ".join(problems) or None


@dataclasses.dataclass
class TuningOutcome:
    study: Any
    baseline_env: dict[str, str]
    report: FinalReport | None = None
    recommendation: Recommendation | None = None
    published: PublishedFiles | None = None
    untested: str | None = None  # why finalization could decide nothing (then nothing is published)
    per_size_failed: str | None = None  # why the per-size stage gave no result (then nothing is published)


NO_TRIAL_COMPLETED = "no trial completed (see the trials' fail_reason)"


class UntestedDecision(RuntimeError):
    """No decision can be made on what was measured: no trial completed, the baseline failed in every
    finalization round, or the time left re-measures no candidate."""


class _FinalizationLog:
    """Says how far finalization is (it has no progress bar): at the start, then at most every `every_s`."""

    def __init__(self, planned: int, log: Callable[[str], None], every_s: float = 10.0) -> None:
        self.planned, self.log, self.every_s = planned, log, every_s
        self.done = 0
        self.started = self.last = time.monotonic()

    def run_done(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last >= self.every_s or self.done == self.planned:
            self.last = now
            self.log(f"finalization: {self.done} of {self.planned} planned runs, {now - self.started:.0f} s")


def rounds_seed(setup: TuningSetup, study: Any) -> int:
    """The seed of interleaved rounds' order: the study's (drawn once per study unless --seed, printed with the
    screen order), so tunes do not all run finalize's one default order sequence (bench_finalize and
    bench_tuner_aa measure finalizations whose orders differ); a study older than SCREEN_SEED: the spec's seed,
    else a fresh draw."""
    seed = study.user_attrs.get(SCREEN_SEED, setup.spec.seed)
    return secrets.randbits(32) if seed is None else int(seed)


def finalize_study(setup: TuningSetup, study: Any, baseline_env: Mapping[str, str],
                   max_evaluations: int | None = None, deadline: float | None = None,
                   log: Callable[[str], None] | None = None) -> tuple[FinalReport, Recommendation]:
    """Re-measure the best candidates against the baseline (tuners.finalize) and build the
    recommendation. `max_evaluations` caps what finalization plans to run (fit_budget), `deadline`
    (time.monotonic()) when it stops starting rounds, whatever the plan (the runs may be slower than the
    trials were); `log` gets a progress line at the start and then at most every 10 s."""
    fin = setup.spec.finalize
    configured = fin.thresholds()
    found = finalization_candidates(study, setup.space, setup.buckets, k=fin.candidates)[:fin.max_candidates]
    knobs = len(setup.space.changeable)  # a candidate changes the companions of its knobs too
    keep, thresholds = fit_budget(configured, len(found), len(setup.buckets), knobs, max_evaluations)
    if keep == 0 < len(found):
        fewest = planned_runs(dataclasses.replace(configured, rounds=1), 1, len(setup.buckets), knobs)
        raise UntestedDecision(f"the time left ({max_evaluations} runs) re-measures none of the {len(found)} "
                               f"candidates (one takes up to {fewest} runs at the fewest rounds that can give a "
                               "change, with ablation and held-out rounds): a decision now would be untested "
                               "(give a larger budget)")
    candidates = [Candidate(env, number) for number, env in found[:keep]]
    if log is not None and candidates:
        planned = planned_runs(thresholds, keep, len(setup.buckets), knobs)
        log(f"finalization: {keep} candidate(s) and the defaults re-measured interleaved, at most {planned} runs")
        setup.evaluator.run_done = _FinalizationLog(planned, log).run_done
    report = finalize(setup.evaluator, baseline_env, candidates, setup.buckets, thresholds=thresholds,
                      needs_validation=setup.space.unsafe_changes,
                      effective_env=setup.space.effective_env, requires=setup.space.requires, deadline=deadline,
                      seed=rounds_seed(setup, study))
    if keep < len(found):
        report = dataclasses.replace(report, notes=(*report.notes, f"{len(found) - keep} of {len(found)} "
                                                                   "candidates left out to fit the time budget"))
    if thresholds.rounds < configured.rounds:
        report = dataclasses.replace(report, notes=(
            *report.notes, f"at most {thresholds.rounds} rounds instead of {configured.rounds} to fit the time budget "
                           "(alpha holds; less power for small gains: results/bench/finalize_max)"))
    setup.evaluator.run_done = None
    rec = build_recommendation(setup.scope, report, setup.buckets, study, setup.versions, cleared=setup.cleared)
    return report, rec


def per_size_not_applicable(setup: TuningSetup, rec: Recommendation) -> str | None:
    """Why the per-size stage can give no rule the scope's jobs would run (then it runs no sweep), or None. MPICH
    (tuners/rule_files.py): a layout whose node-aware composition never reads the selection file at the tuned comm
    size (several nodes, more than one rank per node), or an environment (the recommended one over what every run
    gets) that forces the op's algorithm, which MPICH then runs without reading the file."""
    if setup.scope.library != Library.MPICH:
        return None
    spec = setup.spec
    return (rule_files.mpich_layout_problem(spec.ranks, spec.nodes)
            or rule_files.mpich_forced_by_env(spec.op, {**getattr(setup.evaluator.executor, "base_env", {}),
                                                       **rec.env}))


def per_size_sweep(setup: TuningSetup, rec: Recommendation) -> tuple[PerSizeResult, list[str]]:
    """One selection sweep under the recommended environment, decided per size (tuners/per_size.py), and notes on
    what MPICH's selection file cannot hold: algorithms whose restrictions the sweep's layout or call breaks (no
    candidates: their forced runs ran MPICH's own choice, rule_files.mpich_restrict_sweep), ranges past INT_MAX."""
    spec = setup.spec
    thresholds = spec.finalize.thresholds()
    rounds = spec.per_size.rounds or rounds_for(len(spec.sizes), spec.per_size.top, thresholds.alpha)
    # commbench's watchdog step is one size with all its selections and rounds: it gets the whole limit.
    request = dataclasses.replace(setup.evaluator.request, selection_rounds=rounds,
                                  stop_slower=spec.per_size.stop_slower, stop_after=spec.per_size.stop_after,
                                  time_limit_s=spec.per_size.time_limit_s, bench_timeout_s=spec.per_size.time_limit_s)
    # Validated: a per-size rule forces an algorithm or protocol (may-corrupt, may-hang knobs' territory), so
    # every selection's data is checked. Exit 1 is wrong data in some selections: their records say
    # valid=false and load_sweep leaves them out, so a selection that corrupts data is never chosen.
    outcome = setup.evaluator.executor.run({**rec.env, **SWEEP_ENV.get(setup.scope.library, {})}, request, True)
    if outcome.failure or outcome.exit_code not in (0, 1) or (outcome.exit_code == 1 and not outcome.records):
        remedy = (f" ({rounds} rounds of every selection at {len(spec.sizes)} size(s) did not fit: give "
                  f"per_size.time_limit_s more than {spec.per_size.time_limit_s} s, or fewer per_size.rounds)"
                  if outcome.timed_out else "")
        raise EvaluationAborted(f"the per-size sweep failed{remedy}: {outcome_summary(outcome)}")
    records, notes = (rule_files.mpich_restrict_sweep(outcome.records) if setup.scope.library == Library.MPICH
                      else (outcome.records, []))
    result = decide_per_size(load_sweep(records), thresholds=thresholds, top=spec.per_size.top)
    if setup.scope.library == Library.MPICH:
        notes += rule_files.mpich_ranges(result)[1]
    if not request.stops_selections:
        return result, notes
    return result.model_copy(update={"stop_slower": request.stop_slower, "stop_after": request.stop_after}), notes



def deployed_rules(setup: TuningSetup, rec: Recommendation) -> dict[str, str] | None:
    """The per-size rules of `rec` as publish writes them (the rule file, or the tuner-plugin config), written into
    a run directory of this tune: the env lines that point the library at them; None when there is no rule."""
    result = rec.per_size_selection
    if result is None or all(r.selection is None for r in result.ranges):
        return None
    if rec.scope.library not in RULE_FILE_SUFFIX and not rec.plugin_rules:
        return None  # per-size choices that are comments only (not run here): no file, no empty run directory
    library = plugin_library(setup.spec, rec) if rec.plugin_rules else None
    if rec.plugin_rules and (library is None or not Path(library).is_file()):
        # NCCL ignores a tuner plugin it cannot load: the check would measure the environment alone
        raise TunerConfigError(f"the tuner plugin {library} does not exist: build it (commcamp plugin build) or "
                               "give --plugin-library")
    directory = new_directory(Path(setup.spec.runs_dir), "deployed")
    keep_in_use(directory)  # the deployed check's runs read the rules from it
    rules = rule_file(directory, rec)
    if rules is not None:
        write_atomic(rules[0], rules[1])
        return rules[2]
    assert library is not None
    config = (directory / tuner_config_name(rec.scope)).resolve()
    write_atomic(config, format_config([(config_comments(rec), rec.plugin_rules)]))
    return {PLUGIN_ENV[0]: library, PLUGIN_ENV[1]: str(config)}


def deployed_check(setup: TuningSetup, rec: Recommendation, baseline_env: Mapping[str, str], seed: int,
                   log: Callable[[str], None] | None = None) -> Recommendation:
    """What is deployed, the environment with the per-size rules, against the site's defaults
    (finalize.check_deployed): finalization measured the environment alone, the per-size stage the rules against
    the library's own choice under it. Refused there, the rules are withdrawn, and the environment with them when,
    measured alone in the same rounds, it is refused too (with_deployed_check)."""
    rules_env = deployed_rules(setup, rec)
    thresholds = setup.spec.finalize.thresholds()
    effective = setup.space.effective_env
    if rules_env is None:
        if thresholds.never_slower or effective(rec.env) == effective(baseline_env):
            return rec
        # never_slower off let finalization accept an environment slower at some size, for rules to restore that
        # size; none came: the environment alone is what is deployed, judged as a set with rules would be
        if log is not None:
            log(f"deployed environment (no per-size rule) vs the defaults: at most {1 + 2 * thresholds.holdout_rounds} "
                "runs")
        return with_deployed_check(rec, check_deployed(setup.evaluator, baseline_env, rec.env, setup.buckets,
                                                       thresholds, seed))
    # beside it in every round (unless the library runs it as the defaults): who is to blame if the set is refused
    environment = None if effective(rec.env) == effective(baseline_env) else rec.env
    settings = 2 if environment is None else 3  # per round, the defaults included; + 1 validated run first
    if log is not None:
        log(f"deployed set (environment + per-size rules) vs the defaults: at most "
            f"{1 + settings * thresholds.holdout_rounds} runs")
    check = check_deployed(setup.evaluator, baseline_env, {**rec.env, **rules_env}, setup.buckets, thresholds, seed,
                           environment)
    return with_deployed_check(rec, check)


def plugin_library(spec: TuningSpec, rec: Recommendation) -> str | None:
    """The tuner-plugin library the recommendation's plugin rows need (spec's, else the one built here)."""
    plugin = spec.plugin_library or (paths.plugin_build_dir() / paths.PLUGIN_LIBRARY if rec.plugin_rules else None)
    return None if plugin is None else str(Path(plugin).resolve())


def publish_recommendation(setup: TuningSetup, rec: Recommendation) -> PublishedFiles | None:
    spec = setup.spec
    if spec.publish_dir is None:
        return None
    return publish(Path(spec.publish_dir), rec, setup.catalog, plugin_library=plugin_library(spec, rec))


def print_progress(line: str) -> None:
    """A progress line that reaches a log file or pipe at once."""
    print(line, flush=True)


@dataclasses.dataclass
class TuningSession:
    """One tuning run: trials -> finalize (-> the per-size stage -> the deployed set vs the defaults) -> publish
    -> summary. `commcamp tune` (trials here or in Slurm workers), `pretune` and the demonstrations
    (campaigns/tools/tuning_demo.py) all go through it; they differ in who runs the trials and how many runs
    finalization may take."""

    setup: TuningSetup
    log: Callable[[str], None] | None = print_progress  # progress lines (None: quiet)
    outcome: TuningOutcome | None = None  # set by trials() or collect()

    def trials(self, tuner: Tuner | None = None) -> TuningOutcome:
        """The study's trials, run here (resumed if the study exists); `tuner` for another budget."""
        tuner = tuner or make_tuner(self.setup, progress=self.log is not None)
        study = tuner.run()
        self.outcome = TuningOutcome(study, dict(tuner.baseline_env))
        return self.outcome

    def collect(self, tuner: Tuner) -> TuningOutcome:
        """The study whose trials others ran (Slurm workers, a demonstration's own loop)."""
        self.outcome = TuningOutcome(tuner.load_study(), dict(tuner.baseline_env))
        return self.outcome

    def _trials_done(self) -> TuningOutcome:
        if self.outcome is None:
            raise RuntimeError("the session has no trials yet: trials() or collect() first")
        return self.outcome

    def finalize(self, max_evaluations: int | None = None, deadline: float | None = None) -> Recommendation:
        """finalize_study on the trials (`max_evaluations`, `deadline`: its budget). UntestedDecision when no
        trial completed (no round runs: the baseline failed as a trial too), when the baseline failed in every
        round, when `max_evaluations` re-measures no candidate, or when the deadline came before the first look."""
        from tuners.study import study_progress

        outcome = self._trials_done()
        if study_progress(outcome.study).complete == 0:
            raise UntestedDecision(NO_TRIAL_COMPLETED)
        outcome.report, recommendation = finalize_study(
            self.setup, outcome.study, outcome.baseline_env, max_evaluations=max_evaluations, deadline=deadline,
            log=self.log)
        if outcome.report.cut_off:
            raise UntestedDecision(f"the time budget ran out after {outcome.report.rounds_run} finalization rounds, "
                                   "before the first look: no candidate was tested against the defaults")
        if outcome.report.rounds_run and not outcome.report.rounds_used:
            raise UntestedDecision(f"the baseline (the site's defaults) failed in all {outcome.report.rounds_run} "
                                   "finalization rounds: no candidate was compared with it")
        if self.setup.inherited:  # said wherever the result is: .env, module, recommendations.yaml, recommend
            recommendation = recommendation.model_copy(update={"inherited": dict(self.setup.inherited)})
        outcome.recommendation = recommendation
        return recommendation

    def per_size(self) -> Recommendation:
        """The per-size stage under the recommended environment, merged into the recommendation, then what is
        deployed (environment + rules) against the site's defaults (deployed_check). Where the library would not
        run the rules (per_size_not_applicable; the layout the sweep's records name), no rule: a note says why."""
        outcome = self._trials_done()
        assert outcome.recommendation is not None, "finalize() first"
        rec = outcome.recommendation
        why_not = per_size_not_applicable(self.setup, rec)
        if why_not is not None:
            rec = with_notes(rec, [f"per-size stage not run, no per-size rules: {why_not}"])
        else:
            result, notes = per_size_sweep(self.setup, rec)
            # the layout the sweep ran on: the launcher's, which may not be the spec's
            ran_on = (rule_files.mpich_layout_problem(result.ranks, result.nodes)
                      if self.setup.scope.library == Library.MPICH else None)
            rec = (with_notes(rec, [f"per-size sweep left out, no per-size rules: {ran_on}"]) if ran_on is not None
                   else with_notes(with_per_size(rec, result), [f"per-size stage: {note}" for note in notes]))
        outcome.recommendation = deployed_check(self.setup, rec, outcome.baseline_env,
                                                rounds_seed(self.setup, outcome.study), self.log)
        return outcome.recommendation

    def publish(self) -> PublishedFiles | None:
        outcome = self._trials_done()
        assert outcome.recommendation is not None, "finalize() first"
        outcome.published = publish_recommendation(self.setup, outcome.recommendation)
        return outcome.published

    def finish(self) -> TuningOutcome:
        """What the spec asks for after the trials: finalization, the per-size stage (with the deployed set's
        comparison), publishing. An untested decision (outcome.untested says why) or a per-size sweep whose
        records give no result (outcome.per_size_failed) is not published: earlier files of the scope stay as
        they were."""
        outcome = self._trials_done()
        if self.setup.spec.finalize.enabled:
            try:
                self.finalize()
            except UntestedDecision as exc:
                outcome.untested = str(exc)
                return outcome
            if self.setup.spec.per_size.enabled:
                try:
                    self.per_size()
                except (SweepError, TunerConfigError) as exc:
                    outcome.per_size_failed = f"the per-size stage failed after the trials and finalization: {exc}"
                    return outcome
            self.publish()
        return outcome

    def summary(self, path: Path | None) -> None:
        """The JSON summary (spec, trials, evidence, files, provenance) at `path`, if one is asked for."""
        if path is not None:
            write_summary(path, self.setup, self._trials_done())


def _command_output(cmd: list[str]) -> str:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    first = (result.stdout or result.stderr).strip().splitlines()[:1]
    if result.returncode != 0 or not result.stdout.strip():  # an error is no version ("sinfo: error: ...")
        return f"unavailable: {' '.join(cmd)} exited {result.returncode}" + (f": {first[0]}" if first else "")
    return first[0]


def _slurm_version() -> str:
    from campaigns.slurm.nodes import missing_slurm_conf

    missing = missing_slurm_conf()  # sinfo would retry a missing configuration file for a minute
    return f"unavailable: {missing}" if missing is not None else _command_output(["sinfo", "--version"])


def provenance() -> dict[str, Any]:
    """Where and with what a tuning run ran: date, host, commit, tool versions."""
    import platform

    import optuna

    commit, changed = _checkout_at_start()
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
            "commit": commit, "changed_files": changed, "python": platform.python_version(),
            "optuna": optuna.__version__, "command": sys.argv,
            "reframe": _command_output([str(paths.reframe_executable()), "--version"]),
            "slurm": _slurm_version(),
            # the tool on PATH, which need not be the MPI commbench links (that one: the scope's library_version)
            "ompi_info_on_path": _command_output(["ompi_info", "--version"])}


def outcome_summary_data(setup: TuningSetup, outcome: TuningOutcome) -> dict[str, Any]:
    """Everything a committed result needs: spec, scope, every counted trial, the finalization evidence,
    the files written, and the provenance."""
    from tuners.study import (BUCKET_US, DOCUMENTED_FROM, ENV, FAIL_REASON, OUTCOME, ROLE,
                              WARM_START_FROM, dropped_in_context, dropped_knobs, is_counted, study_progress)

    trials = [{"number": t.number, "role": t.user_attrs.get(ROLE, ""), "outcome": t.user_attrs[OUTCOME],
               "from": t.user_attrs.get(DOCUMENTED_FROM) or t.user_attrs.get(WARM_START_FROM),
               "objective_us": t.value, "bucket_us": t.user_attrs.get(BUCKET_US), "env": t.user_attrs.get(ENV),
               "fail_reason": t.user_attrs.get(FAIL_REASON, ""), "record_ids": t.user_attrs.get("record_ids", [])}
              for t in outcome.study.get_trials(deepcopy=False) if is_counted(t)]
    rec = outcome.recommendation
    return {"spec": setup.spec.model_dump(mode="json"), "scope": setup.scope.model_dump(mode="json"),
            "study": setup.study_name, "knob_files": setup.knob_files,
            "baseline_env": outcome.baseline_env, "progress": dataclasses.asdict(study_progress(outcome.study)),
            "knobs_left_the_search": dropped_knobs(outcome.study),
            "knobs_left_the_search_beside": {name: [{"beside": context, "why": why} for context, why in contexts]
                                             for name, contexts in dropped_in_context(outcome.study).items()},
            "trials": trials, "run_durations_s": [round(d, 2) for d in setup.evaluator.durations_s],
            # as published: `cleared` less what the deployed set exports or unsets itself (writers.job_cleared)
            "recommendation": None if rec is None else rec.model_copy(
                update={"cleared": job_cleared(rec)}).model_dump(mode="json"), "untested": outcome.untested,
            "per_size_failed": outcome.per_size_failed,
            "files": None if outcome.published is None else outcome.published.to_json(),
            "provenance": provenance()}


def write_summary(path: Path, setup: TuningSetup, outcome: TuningOutcome) -> None:
    write_atomic(path, json.dumps(outcome_summary_data(setup, outcome), indent=2, default=str) + "\n")


def recommendation_env_text(rec: Recommendation, catalog: KnobCatalog) -> str:
    """The sourceable env file of a recommendation (pretune's output), values validated again."""
    return env_file_text(rec, catalog.validate_env(rec.env), list(rec.unset))


def write_env_file(path: Path, rec: Recommendation, catalog: KnobCatalog) -> None:
    write_atomic(path, recommendation_env_text(rec, catalog))
