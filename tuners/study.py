"""The tuning study: an Optuna study per scope, stored in an RDB, driven by an evaluator.

- Trial 0 is the site's defaults (enqueued when the study is created), followed by any seed
  environments the caller names (e.g. the library's own defaults, every knob unset).
- Failed, hung and invalid evaluations are FAIL trials with `outcome` and `fail_reason` user attrs;
  the study goes on. A proposal the catalog's constraints refuse is not launched and does not count: a PRUNED
  trial (`rejected`), a repeat of an identical refused proposal marked `repeat_of` (Tuner._rejected).
- A searched knob the library did not read (Evaluation.unread) leaves the search, kept at the baseline's value; one
  whose reading depends on other searched knobs' values (the catalog's `read_depends_on`) only beside the values they
  had in that trial (dropped_in_context).
- A setting the study has already measured (counted, complete or failed), or another spelling of it (the same
  KnobCatalog.effective_env: e.g. NCCL_BUFFSIZE=4194304, NCCL's default), is not launched again: the
  trial takes the earlier result (`repeat_of`), does not count, and the sampler proposes again.
  Finalization re-measures candidates on its own; in the search a repeat is a launch spent on what is
  known (6 of 30 launches on the replayed Open MPI grid in tests/test_tuner_study.py before this rule).
  A setting another worker is measuring (a RUNNING trial of a lower number) is a repeat the same way.
  After MAX_REPEATS repeats in a row the proposals are drawn at random from the space (a converged sampler keeps
  proposing its best); after RANDOM_DRAWS more, all repeats, the space is taken as measured and the search ends
  with the budget unspent. A repeat is never launched: a setting that hung or failed is not tried again.
- Budget: trials with an `outcome` (measured or failed by the evaluator) count; `run()` stops when
  they reach `n_trials` (also across restarts and across workers sharing the storage) or when its
  own wall-time budget is spent. While the rest of the budget is other workers' running trials, a
  worker with heartbeats waits: they count, or a dead worker's trial goes stale and is run here.
  Before its launch each trial checks that fewer than `n_trials` trials numbered below it are waiting,
  running or counted (else it is skipped, uncounted): trials are numbered in the order they are made,
  so across workers no more than `n_trials` count.
- A worker killed mid-trial leaves a RUNNING trial. With heartbeats on, the next worker fails it
  (it never counts) and re-queues its parameters (`retry_of`), up to `max_retry` times, after which
  one counted FAIL records "worker lost" (queued as well, so that it passes the budget check like any
  trial). Ctrl-C re-queues the interrupted trial the same way. The re-queued trial keeps its role
  (defaults, seeded, ...), where it comes from and its screen step. So no measurement is lost and
  none is counted twice.
- A live worker whose trial another worker failed as stale (its heartbeat silent past the grace period: a
  suspended job, a database out of reach) drops that trial's result (Optuna refuses it) and goes on; the
  re-queued copy measures the setting.
- Parallel workers: call `run()` in several processes on the same PostgreSQL URL. SQLite is for
  one process at a time (Optuna's documentation: concurrent writers lock it).
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import math
import os
import re
import secrets
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuners.catalog import UnsafeValueError
from tuners.evaluation import (
    Evaluation,
    EvaluationAborted,
    Evaluator,
    FailureKind,
    SizeBucket,
    bucket_times_us,
    overall_time_us,
)
from tuners.scope import StudyScope
from tuners.screen import SCREEN_ATTR, OneKnobScreen
from tuners.space import SearchSpace, SpaceError

logger = logging.getLogger(__name__)

# Trial user attributes
ENV = "env"
OUTCOME = "outcome"  # "complete" or a FailureKind value; present = the trial counts toward the budget
FAIL_REASON = "fail_reason"
BUCKET_US = "bucket_us"
SIZE_US = "size_us"
RECORD_IDS = "record_ids"
ROLE = "role"  # "defaults" for trial 0, SEEDED, DOCUMENTED or WARM_START for the trials enqueued after it
SEEDED = "seeded"
DOCUMENTED = "documented"  # a setting the site documents (DOCUMENTED_FROM: where), enqueued after the seeds
DOCUMENTED_FROM = "documented_from"
WARM_START = "warm_start"  # the winner of a related scope (WARM_START_FROM: which), enqueued after the seeds
WARM_START_FROM = "warm_start_from"
RETRY_OF = "retry_of"  # trial numbers this one re-runs (worker lost or interrupted)
KEPT_ON_RETRY = (ROLE, DOCUMENTED_FROM, WARM_START_FROM)  # what a re-queued trial keeps of the trial it re-runs
REPEAT_OF = "repeat_of"  # the counted trial that already measured this trial's setting (it is not launched again)
MAX_REPEATS = 20  # repeats in a row before the proposals are drawn at random
RANDOM_DRAWS = 100  # random draws, all repeats, after which the space is taken as measured (one unmeasured setting of
# 30 is missed by 100 draws with probability (29/30)^100 = 3 %)
# Study user attributes DROPPED_KNOB + name: why that knob left the search (the library did not read it in that
# trial); later trials keep it at the baseline's value, so the budget is not spent on a knob that changes nothing,
# and a starting point (seed, documented, warm start) that changes it is skipped rather than measured as another
# setting. One attribute per knob: two workers that drop different knobs at once write different rows (one
# dictionary attribute, read and written back by each, lost one of them).
DROPPED_KNOB = "dropped_knob:"
LEGACY_DROPPED_KNOBS = "dropped_knobs"  # the one dictionary of studies made before
# Study user attributes DROPPED_KNOB_WHEN + name + ":" + JSON context: a knob whose reading depends on other knobs'
# values (the catalog's `read_depends_on`, e.g. NCCL's socket knobs on NCCL_P2P_DISABLE and NCCL_SHM_DISABLE) that the
# library did not read in a trial leaves the search only where the knobs of that relation that the space searches have
# the values they had in that trial (the context; a knob not set counting as the library's own value): elsewhere it is
# read and still searched. One attribute per knob and context, as above.
DROPPED_KNOB_WHEN = "dropped_knob_when:"
REJECTED = "rejected"  # trial user attribute: the proposal broke the catalog's constraints and was not launched
SCREEN_SEED = "screen_seed"  # study user attribute: the seed of the one-knob screen's order (the study's seed)
COMPLETE = "complete"
LOST = "lost"
CONNECT_TIMEOUT_S = 10  # a PostgreSQL server that does not answer (firewalled, down host)


class SamplerName(enum.StrEnum):
    TPE = "tpe"
    GP = "gp"
    RANDOM = "random"


# TPE after the one-knob screen (tuners/screen.py; TuningSpec.screen_trials) is what `commcamp tune` ships:
# results/bench/sampler_benchmark.md (2026-11-27 13:23 UTC), 21 scenarios on measured landscapes, 50 seeds x 30 trials:
# trials to 95 % of the best on the 2x H200 socket-path grid 6 vs random 17 (TPE alone 13, GP 12.5), on the held-out
# 4x H200 one 4.5 vs 19.5 (TPE alone 16, GP 19.5), a third, fourth and fifth 2x H200 one 5, 5, 6.5 vs 18.5, 16.5, 13
# (GP 13.5, 13, 11.5), on the 448-point Open MPI grid 14 vs 26 (TPE alone 13, GP 17.5), on the held-out every-value
# Open MPI grid 19 vs 31 (TPE alone 15, GP 31), on the held-out 3-node Open MPI grid 19.5 vs 28 (TPE alone 17, GP
# 29.5); fewer trials than random shown on 13 of 21, best or tied of six strategies on 15 of 21, the target met on 8
# of 21 (TPE alone meets it on 2, where the shipped search does not). GP needs torch (not a site dependency).
DEFAULT_SAMPLER = SamplerName.TPE


def make_sampler(name: SamplerName | str, seed: int | None, n_startup_trials: int = 8) -> optuna.samplers.BaseSampler:
    """TPE is multivariate with group decomposition (knobs that may stay unset make conditional
    parameters) and constant liar (parallel workers do not all propose the same point)."""
    name = SamplerName(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        if name is SamplerName.TPE:
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=n_startup_trials
            )
        if name is SamplerName.GP:
            return optuna.samplers.GPSampler(
                seed=seed, n_startup_trials=n_startup_trials, warn_independent_sampling=False
            )
        return optuna.samplers.RandomSampler(seed=seed)


class _RequeueLostTrial:
    """Heartbeat-stale trial callback: re-queue the lost trial's parameters, or after `max_retry`
    losses one counted FAIL so that a setting that kills workers cannot loop forever. That FAIL is
    queued too (outcome "lost"), and recorded without a launch by the worker that pops it, after
    the budget check: added as a counted FAIL here, it took a place in the budget past every check
    (a trial made since the lost one failed as stale counted beside it, one more than the budget). It keeps
    the lost trial's `env`, so that the setting is a repeat of that failure and never launched again."""

    def __init__(self, max_retry: int) -> None:
        self.max_retry = max_retry

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        history = _history(trial)
        if len(history) > self.max_retry:
            reason = f"worker lost {len(history)} times while evaluating (trials {history})"
            measured = {ENV: trial.user_attrs[ENV]} if ENV in trial.user_attrs else {}
            _add_again(study, trial, TrialState.WAITING, {OUTCOME: LOST, FAIL_REASON: reason, **measured})
        else:
            _add_again(study, trial, TrialState.WAITING)


def _history(trial: FrozenTrial) -> list[int]:
    return [*trial.user_attrs.get(RETRY_OF, []), trial.number]


def _add_again(study: optuna.Study, trial: FrozenTrial, state: TrialState,
               user_attrs: Mapping[str, Any] | None = None) -> None:
    """A new trial with `trial`'s parameters (`retry_of`): WAITING to run again, or a finished FAIL. It keeps what
    the trial is (its role and where it comes from, its screen step), so that a re-run defaults trial is still the
    defaults and a re-run screened trial is the screen's step, not a new one."""
    kept = {name: trial.user_attrs[name] for name in KEPT_ON_RETRY if name in trial.user_attrs}
    step = trial.system_attrs.get(SCREEN_ATTR)
    study.add_trial(
        optuna.trial.create_trial(
            state=state,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs={**kept, RETRY_OF: _history(trial), **(user_attrs or {})},
            system_attrs={} if step is None else {SCREEN_ATTR: step},
        )
    )


class StorageUnavailable(RuntimeError):
    """The study's database cannot be reached or used; the message names it (password hidden) and why."""


def storage_problem(url: str, exc: BaseException) -> StorageUnavailable:
    """A StorageUnavailable for a database error on `url`: the driver's own words, no traceback."""
    try:
        shown = sqlalchemy.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        shown = "(unparsable URL)"
    reason = getattr(exc, "orig", None) or exc
    return StorageUnavailable(f"study storage {shown}: {str(reason).strip()}")


def check_reachable(url: str) -> None:
    """StorageUnavailable unless the study database can be used, creating nothing: a SQLite file (or
    the directory it would be made in) must be writable, a server must answer within CONNECT_TIMEOUT_S."""
    try:
        parsed = sqlalchemy.make_url(url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise storage_problem(url, exc) from None
    if parsed.get_backend_name() == "sqlite":
        if not parsed.database:  # sqlite:/// (or an in-memory sqlite://): no file to keep the study in
            raise storage_problem(url, OSError("the URL names no database file (sqlite:///PATH)"))
        path = Path(parsed.database)
        where = path if path.exists() else path.parent
        if not where.exists() or not os.access(where, os.W_OK):
            raise storage_problem(url, OSError(f"{where} does not exist or is not writable"))
        return
    try:
        engine = sqlalchemy.create_engine(url, **_engine_kwargs(url))
        with engine.connect():
            pass
        engine.dispose()
    except (sqlalchemy.exc.SQLAlchemyError, ImportError) as exc:
        raise storage_problem(url, exc) from None


def _engine_kwargs(url: str) -> dict[str, Any]:
    return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}} if url.startswith("postgresql") else {}


def open_storage(
    url: str, *, heartbeat_interval: int | None = 60, grace_period: int | None = None, max_retry: int = 2
) -> RDBStorage:
    """RDB storage (sqlite:///path for one process, postgresql+psycopg://... for parallel workers)
    with heartbeats, so a trial of a killed worker is detected and re-queued. Optuna keeps its
    schema revision in the table `alembic_version`; another user of the same database must keep
    its revision elsewhere (alembic's version_table option). StorageUnavailable when the database
    cannot be reached (a PostgreSQL server that does not answer is given up after CONNECT_TIMEOUT_S)."""
    engine_kwargs = _engine_kwargs(url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        try:
            return RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=_RequeueLostTrial(max_retry) if heartbeat_interval else None,
            )
        except sqlalchemy.exc.SQLAlchemyError as exc:
            raise storage_problem(url, exc) from exc
        except RuntimeError as exc:
            if "compatible with the table schema" not in str(exc):
                raise
            raise RuntimeError(
                f"{exc} -- Optuna read a foreign revision from the table alembic_version of this database: "
                "another schema (e.g. the results store) must keep its alembic revision in its own version_table"
            ) from exc


class _TrialFailed(Exception):
    """Raised inside the objective so that Optuna records FAIL (caught through optimize(catch=...))."""


class _ReportedFailures(logging.Filter):
    """On Optuna's optimize logger: drops its warnings (with a traceback) about a trial that stopped for a
    reason commcamp reports in one line itself: a failed evaluation (this module's "trial N failed: ..."),
    Ctrl-C/SIGTERM or an aborted evaluation (the caller's message). Any other error keeps Optuna's warning."""

    _FAILED = re.compile(r"Trial (\d+) failed with ")  # "... with parameters: ..." then "... with value None."
    REPORTED = (_TrialFailed, KeyboardInterrupt, EvaluationAborted)

    def __init__(self) -> None:
        super().__init__()
        self.dropped: set[str] = set()  # trial numbers whose first warning was dropped: drop the second too

    def filter(self, record: logging.LogRecord) -> bool:
        match = self._FAILED.match(record.getMessage())
        if match is None:
            return True
        if record.exc_info is None:
            return match.group(1) not in self.dropped
        if isinstance(record.exc_info[1], self.REPORTED):
            self.dropped.add(match.group(1))
            return False
        return True


def is_counted(trial: FrozenTrial) -> bool:
    """A finished measurement of the budget. Not a FAIL whose outcome says complete: its result was being stored
    when the process stopped (Ctrl-C during Optuna's tell), the heartbeat failed it as lost and re-queued it; counted,
    it was a failed trial and its setting a repeat of it, never measured again."""
    outcome = trial.user_attrs.get(OUTCOME)
    return outcome is not None and (trial.state is TrialState.COMPLETE
                                    or (trial.state is TrialState.FAIL and outcome != COMPLETE))


@dataclass(frozen=True)
class StudyProgress:
    counted: int
    complete: int
    failed: int
    best_value_us: float | None
    defaults_value_us: float | None

    @property
    def best_speedup(self) -> float | None:
        if self.best_value_us is None or self.defaults_value_us is None:
            return None
        return self.defaults_value_us / self.best_value_us


def study_progress(study: optuna.Study) -> StudyProgress:
    trials = study.get_trials(deepcopy=False)
    counted = [t for t in trials if is_counted(t)]
    complete = [t for t in counted if t.state is TrialState.COMPLETE]
    best = min((t.value for t in complete if t.value is not None), default=None)
    defaults = next((t.value for t in complete if t.user_attrs.get(ROLE) == "defaults"), None)
    return StudyProgress(len(counted), len(complete), len(counted) - len(complete), best, defaults)


MEASURED_SETUP = "measured_setup"  # the launch and measurement setup a study's trials measured (Tuner's measured_as)


def setup_digest(setup: Mapping[str, Any]) -> str:
    """A short digest of a launch and measurement setup: a study's name holds it, the study keeps it."""
    return hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:10]


def _setup_differences(stored: Mapping[str, Any] | None, given: Mapping[str, Any]) -> str:
    """What differs between a study's measurement setup and this process's, each part shown short."""
    if stored is None:  # a study created before it kept its setup: the digest alone
        return "its launch or measurement setup: launcher options, sizes, iterations, the site's setup"

    def text(value: Any) -> str:
        return json.dumps(value, sort_keys=True) if value is not None else "none"

    def difference(key: str) -> str:
        before, now = text(stored.get(key)), text(given.get(key))
        if max(len(before), len(now)) > 120:  # a knob file's content, the searched domains: only that they differ
            return f"{key} differs ({len(before)} and {len(now)} characters)"
        return f"{key}: {before} in the study, {now} here"

    return "; ".join(difference(key) for key in sorted({*stored, *given}) if stored.get(key) != given.get(key))


class Tuner:
    """Runs (or resumes, or joins as one more worker) the study of one scope."""

    def __init__(
        self,
        scope: StudyScope,
        space: SearchSpace,
        evaluator: Evaluator,
        storage: str | optuna.storages.BaseStorage,
        buckets: Sequence[SizeBucket],
        *,
        n_trials: int | None = None,
        timeout_s: float | None = None,
        sampler: SamplerName | str = DEFAULT_SAMPLER,
        seed: int | None = None,
        n_startup_trials: int = 8,
        screen_trials: int = 0,
        baseline_env: Mapping[str, str] | None = None,
        seed_envs: Sequence[Mapping[str, str]] = (),
        documented: Sequence[tuple[Mapping[str, str], str]] = (),
        warm_starts: Sequence[tuple[Mapping[str, str], str]] = (),
        progress: bool = False,
        study_name: str | None = None,
        measured_as: Mapping[str, Any] | None = None,
    ) -> None:
        """`measured_as`: what the caller's trials measure beside the scope, knobs and buckets (its launch and
        measurement setup, kept with its setup_digest): a study stored with another is refused (a study named by
        hand, a worker whose job environment differs), naming what differs."""
        if n_trials is None and timeout_s is None:
            raise ValueError("give a budget: n_trials and/or timeout_s")
        if n_trials is not None and n_trials < 1:
            raise ValueError("n_trials must be >= 1")
        if not buckets:
            raise ValueError("at least one size bucket is needed")
        self.scope = scope
        self.study_name = study_name or scope.study_name
        self.measured_setup = None if measured_as is None else dict(measured_as)
        self.measured_as = None if measured_as is None else setup_digest(measured_as)
        self.space = space
        self.evaluator = evaluator
        self.storage = open_storage(storage) if isinstance(storage, str) else storage
        self.buckets = tuple(buckets)
        self.n_trials = n_trials
        self.timeout_s = timeout_s
        self.sampler_name = SamplerName(sampler)
        self.seed = seed
        self.n_startup_trials = n_startup_trials
        if screen_trials < 0:
            raise ValueError("screen_trials must be >= 0")
        self.screen_trials = screen_trials
        baseline = space.catalog.default_env(space.knob_names) if baseline_env is None else baseline_env
        space.params_for_env(baseline)  # rejects knobs outside the space and values outside it
        self.baseline_env = space.env_from_values({name: baseline.get(name) for name in space.knob_names})
        seeds = []
        for env in seed_envs:
            seed = self._feasible(env, "seed")
            if seed is not None and not same_configuration(space, seed, [self.baseline_env, *seeds]):
                seeds.append(seed)
        self.seed_envs = seeds
        self.documented = self._sourced(documented, seeds)
        self.warm_starts = self._sourced(warm_starts, [*seeds, *(env for env, _ in self.documented)])
        self.progress = progress
        self._repeats_in_a_row = 0
        self._random_sampler: optuna.samplers.BaseSampler | None = None
        self._trial_id: int | None = None  # the trial this worker runs (None until its objective starts)

    def _sourced(self, envs: Sequence[tuple[Mapping[str, str], str]], before: Sequence[Mapping[str, str]]
                 ) -> list[tuple[dict[str, str], str]]:
        """(env, where it comes from) in the space's form, leaving out the baseline, what `before` holds,
        repeats and what breaks a constraint."""
        kept: list[tuple[dict[str, str], str]] = []
        for env, source in envs:
            full = self._feasible(env, f"setting from {source}")
            if full is not None and not same_configuration(self.space, full,
                                                           [self.baseline_env, *before, *(k for k, _ in kept)]):
                kept.append((full, source))
        return kept

    def _feasible(self, env: Mapping[str, str], what: str) -> dict[str, str] | None:
        """`env` in the space's form, or None (said in a warning) where it breaks a catalog constraint: such a
        setting is not queued, the tune goes on without it."""
        self.space.params_for_env(env)
        try:
            return self.space.env_from_values({name: env.get(name) for name in self.space.knob_names})
        except UnsafeValueError as exc:
            logger.warning("%s: %s %s left out: %s", self.study_name, what, dict(env), exc)
            return None

    def load_study(self) -> optuna.Study:
        """Creates the study (enqueuing the defaults as trial 0) or loads it, checking that the
        stored study was set up with the same knobs and buckets."""
        try:
            offset = len(optuna.load_study(study_name=self.study_name, storage=self.storage).trials)
        except KeyError:
            offset = 0
        # A resumed study or another worker gets a fresh sampler seed, so that a seeded TPE does not replay its first
        # run (or propose what the other workers do).
        seed = None if self.seed is None else self.seed + offset
        study = optuna.create_study(
            study_name=self.study_name,
            storage=self.storage,
            direction="minimize",
            sampler=make_sampler(self.sampler_name, seed, self.n_startup_trials),
            load_if_exists=True,
        )
        setup = {
            "scope": self.scope.model_dump(mode="json"),
            "knobs": list(self.space.knob_names),
            "domains": self.space.domains(),
            "buckets": [[b.name, b.min_bytes, b.max_bytes] for b in self.buckets],
            "baseline_env": self.baseline_env,
            "objective": "geometric mean over size buckets of the bucket time (us); bucket time = "
            "geometric mean of the median times of its message sizes",
            **({} if self.measured_as is None else {"measured_as": self.measured_as,
                                                      MEASURED_SETUP: self.measured_setup}),
        }
        stored_as = study.user_attrs.get("measured_as")
        if self.measured_as is not None and stored_as is not None and stored_as != self.measured_as:
            raise ValueError(f"study {self.study_name} exists measured otherwise ("
                             f"{_setup_differences(study.user_attrs.get(MEASURED_SETUP), self.measured_setup or {})}; "
                             f"{stored_as} != {self.measured_as}); name another study (--study NAME)")
        if self.measured_as is not None and stored_as == self.measured_as and MEASURED_SETUP not in study.user_attrs:
            # a study created before setups were kept: a later refusal can name what differs
            study.set_user_attr(MEASURED_SETUP, self.measured_setup)
        for key in ("knobs", "buckets", "baseline_env"):
            if key in study.user_attrs and study.user_attrs[key] != setup[key]:
                raise ValueError(
                    f"study {self.study_name} exists with different {key} "
                    f"({study.user_attrs[key]} != {setup[key]}); name another study (--study NAME)"
                )
        # a study named by hand (--study) may be another scope's: its trials measured another layout or version
        stored_scope = study.user_attrs.get("scope", {})
        if differ := {key: (stored_scope[key], value) for key, value in setup["scope"].items()
                      if key in stored_scope and stored_scope[key] != value}:
            raise ValueError(f"study {self.study_name} exists for another scope ("
                             + ", ".join(f"{key} {old!r} != {new!r}" for key, (old, new) in differ.items())
                             + "); name another study (--study NAME)")
        if "domains" in study.user_attrs and study.user_attrs["domains"] != setup["domains"]:
            changed = [new[0] for old, new in zip(study.user_attrs["domains"], setup["domains"]) if old != new]
            raise ValueError(f"study {self.study_name} exists with different domains of {', '.join(changed)} (the "
                             "catalog or the site's knob files changed); name another study (--study NAME)")
        if not study.user_attrs.get("setup"):
            for key, value in setup.items():
                study.set_user_attr(key, value)
            if SCREEN_SEED not in study.user_attrs:
                study.set_user_attr(SCREEN_SEED, secrets.randbits(32) if self.seed is None else self.seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                study.enqueue_trial(
                    self.space.params_for_env(self.baseline_env), user_attrs={ROLE: "defaults"}, skip_if_exists=True
                )
                for env in self.seed_envs:
                    study.enqueue_trial(self.space.params_for_env(env), user_attrs={ROLE: SEEDED}, skip_if_exists=True)
                for env, source in self.documented:
                    study.enqueue_trial(self.space.params_for_env(env),
                                        user_attrs={ROLE: DOCUMENTED, DOCUMENTED_FROM: source}, skip_if_exists=True)
                for env, source in self.warm_starts:
                    study.enqueue_trial(self.space.params_for_env(env),
                                        user_attrs={ROLE: WARM_START, WARM_START_FROM: source}, skip_if_exists=True)
            # Marked set up only once every starting point is queued: a run that died before gets here again and
            # queues what is missing (skip_if_exists: not what is queued already).
            study.set_user_attr("setup", True)
        if self.screen_trials:
            # The screen's knob and value order comes from the study, not from this process: a resumed study or
            # another worker goes on with the order the screen began with (a study older than SCREEN_SEED: the seed).
            study.sampler = OneKnobScreen(study.sampler, self.space, self.screen_trials,
                                          study.user_attrs.get(SCREEN_SEED, self.seed), env_attr=ENV, role_attr=ROLE,
                                          dropped_knobs=dropped_knobs, dropped_in_context=dropped_in_context)
        return study

    def run(self) -> optuna.Study:
        study = self.load_study()
        sampler = study.sampler
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        with _ProgressDisplay(self.progress, self.n_trials, self.study_name) as display, _reported_failures():
            display.update(study_progress(study))
            while True:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ExperimentalWarning)
                    optuna.storages.fail_stale_trials(study)
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if self.n_trials is not None and self._budget_used(study) >= self.n_trials:
                    heartbeat = self._heartbeat_s()
                    if study_progress(study).counted >= self.n_trials or heartbeat is None:
                        break
                    # The rest of the budget is other workers' running trials: wait until they count, or
                    # until a dead worker's trial goes stale and comes back as a waiting trial to run here.
                    time.sleep(min(heartbeat, 5))
                    continue
                if self._repeats_in_a_row >= MAX_REPEATS + RANDOM_DRAWS:
                    logger.warning("%s: the last %d proposals (%d drawn at random) were settings already measured "
                                   "or refused by the catalog's constraints: the search ends with %d counted trials",
                                   self.study_name, self._repeats_in_a_row,
                                   RANDOM_DRAWS, study_progress(study).counted)
                    break
                study.sampler = sampler if self._repeats_in_a_row < MAX_REPEATS else self._random(study)
                self._trial_id = None
                try:
                    study.optimize(self._objective, n_trials=1, catch=(_TrialFailed,), gc_after_trial=False)
                except (ValueError, AssertionError):
                    if not self._taken_as_lost(study):
                        raise
                display.update(study_progress(study))
        return study

    def _taken_as_lost(self, study: optuna.Study) -> bool:
        """Whether the trial this worker was running was failed as lost by another worker (its heartbeat was
        silent for the grace period: a suspended job, a database out of reach), which re-queued it: Optuna then
        refuses this worker's result (ValueError "Cannot tell a FAIL trial", or its assertion after it). The
        result is dropped, the re-queued copy measures the setting, and this worker goes on."""
        if self._trial_id is None:
            return False
        trial = self.storage.get_trial(self._trial_id)
        requeued = any(trial.number in t.user_attrs.get(RETRY_OF, ()) for t in study.get_trials(deepcopy=False))
        if trial.state is not TrialState.FAIL or not requeued:  # an error of its own: not another worker's doing
            return False
        logger.warning("trial %d was taken as lost by another worker while it ran here (no heartbeat for the grace "
                       "period): its result is dropped, the re-queued copy measures it", trial.number)
        return True

    def _random(self, study: optuna.Study) -> optuna.samplers.BaseSampler:
        """The sampler after MAX_REPEATS repeats in a row: uniform over the space, seeded from the study's length."""
        if self._random_sampler is None:
            seed = None if self.seed is None else self.seed + len(study.trials)
            self._random_sampler = optuna.samplers.RandomSampler(seed=seed)
        return self._random_sampler

    def _heartbeat_s(self) -> int | None:
        """The storage's heartbeat interval; None without heartbeats (a dead worker's trial never goes stale)."""
        return self.storage.get_heartbeat_interval() if isinstance(self.storage, RDBStorage) else None

    def _budget_used(self, study: optuna.Study, before_number: int | None = None) -> int:
        """Counted trials plus trials other workers are running (they will count). With `before_number` (a trial's
        own check), only the trials numbered below it, and the waiting ones among them too: a trial re-queued just
        after this worker looked for a waiting one is numbered below this worker's new trial, and when another worker
        pops it, that worker's check cannot see the new trial. Trials are numbered in the order they are made, so a
        trial that counts was waiting, running or counted at the check of every later-numbered one, and no more than
        `n_trials` pass their checks and count."""
        states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
        if before_number is not None:
            states += (TrialState.WAITING,)
        return sum(
            1
            for t in study.get_trials(deepcopy=False, states=states)
            if (before_number is None or t.number < before_number) and (not t.state.is_finished() or is_counted(t))
        )

    @staticmethod
    def _requeue_and_stop(trial: optuna.Trial) -> NoReturn:
        """Queue the setting again so that a resumed run measures it, then re-raise what stopped the
        trial. If the storage itself is gone the trial stays RUNNING; its heartbeat goes stale and the
        next run re-queues it then."""
        _add_again(trial.study, trial.storage.get_trial(trial._trial_id), TrialState.WAITING)
        raise

    def _objective(self, trial: optuna.Trial) -> float:
        self._trial_id = trial._trial_id
        # Another worker may have filled the budget between our check and our ask.
        if self.n_trials is not None and self._budget_used(trial.study, before_number=trial.number) >= self.n_trials:
            trial.set_user_attr(FAIL_REASON, "skipped: budget already reached by other workers")
            raise optuna.TrialPruned()
        if trial.user_attrs.get(OUTCOME) == LOST:  # queued by _RequeueLostTrial: recorded, not launched
            logger.warning("trial %d %s", trial.number, trial.user_attrs[FAIL_REASON])
            raise _TrialFailed(trial.user_attrs[FAIL_REASON])
        dropped = dropped_knobs(trial.study)
        contextual = [(name, self.baseline_env.get(name), context, why)
                      for name, contexts in dropped_in_context(trial.study).items() if name not in dropped
                      for context, why in contexts]
        try:
            if ROLE in trial.user_attrs:
                # A starting point is measured as it was queued or not at all: with a knob that left the search put
                # back to the baseline's value it would be another setting under the seed's name.
                env = self.space.suggest(trial)
                why = {name: reason for name, reason in dropped.items() if env.get(name) != self.baseline_env.get(name)}
                why.update({name: reason for name, value, context, reason in contextual
                            if name not in why and env.get(name) != value and self.space.matches(context, env)})
                if why:
                    reason = (f"skipped: it changes {', '.join(why)} from the baseline, which left the search "
                              f"({'; '.join(why.values())})")
                    trial.set_user_attr(FAIL_REASON, reason)
                    logger.warning("trial %d (%s) %s", trial.number, trial.user_attrs[ROLE], reason)
                    raise _TrialFailed(reason)
            else:
                env = self.space.suggest(trial, fixed={name: self.baseline_env.get(name) for name in dropped},
                                         fixed_when=[(name, value, context) for name, value, context, _ in contextual])
        except (SpaceError, UnsafeValueError) as exc:  # e.g. a queued setting beside a knob fixed since it was queued
            self._rejected(trial, exc)
        trial.set_user_attr(ENV, env)
        earlier = self._measured_before(trial, env)
        if earlier is not None:
            return self._repeat(trial, earlier)
        self._repeats_in_a_row = 0
        try:
            evaluation = self.evaluator(env, validate=False)
        except EvaluationAborted:
            self._requeue_and_stop(trial)
        except Exception as exc:  # an evaluator bug or executor error is a failed trial, not a crash
            logger.exception("evaluator raised for trial %d", trial.number)
            evaluation = Evaluation.failed(FailureKind.FAILED, f"evaluator raised {type(exc).__name__}: {exc}")
        except BaseException:  # Ctrl-C
            self._requeue_and_stop(trial)
        if evaluation.record_ids:
            trial.set_user_attr(RECORD_IDS, list(evaluation.record_ids))
        if evaluation.ok:
            medians = evaluation.median_us()
            try:
                buckets = bucket_times_us(medians, self.buckets)
            except ValueError as exc:
                evaluation = Evaluation.failed(FailureKind.INVALID, str(exc), evaluation.record_ids)
        if evaluation.unread:
            self._drop_knobs(trial, evaluation.unread, env)
        if not evaluation.ok:
            assert evaluation.failure is not None
            trial.set_user_attr(OUTCOME, evaluation.failure.value)
            trial.set_user_attr(FAIL_REASON, evaluation.reason)
            logger.warning("trial %d %s: %s", trial.number, evaluation.failure, evaluation.reason)
            raise _TrialFailed(f"{evaluation.failure}: {evaluation.reason}")
        trial.set_user_attr(SIZE_US, {str(size): t for size, t in medians.items()})
        trial.set_user_attr(BUCKET_US, buckets)
        trial.set_user_attr(OUTCOME, COMPLETE)
        return overall_time_us(buckets)

    def _measured_before(self, trial: optuna.Trial, env: Mapping[str, str]) -> FrozenTrial | None:
        """The counted trial that already measured `env`, or the earlier trial another worker is measuring it in
        (None if none)."""
        states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
        measured = (t for t in trial.study.get_trials(deepcopy=False, states=states) if ENV in t.user_attrs and (
            is_counted(t) if t.state is not TrialState.RUNNING else t.number < trial.number))
        return next((t for t in measured if same_configuration(self.space, env, [t.user_attrs[ENV]])), None)

    def _repeat(self, trial: optuna.Trial, earlier: FrozenTrial) -> float:
        """An uncounted trial with the earlier result: the sampler sees the value again (or, for a failure or a
        setting still being measured, a FAIL it ignores), and no launch is spent."""
        self._repeats_in_a_row += 1
        trial.set_user_attr(REPEAT_OF, earlier.number)
        if earlier.state is TrialState.RUNNING:
            raise _TrialFailed(f"trial {earlier.number} is measuring this setting")
        if earlier.state is TrialState.FAIL:
            raise _TrialFailed(f"repeat of failed trial {earlier.number}")
        return float(earlier.values[0])

    def _rejected(self, trial: optuna.Trial, exc: Exception) -> NoReturn:
        """A proposal the catalog's constraints refuse (a value drawn outside what the other knobs allow, a queued
        setting beside a knob fixed since) is not launched and does not count: the trial is PRUNED without an
        `outcome` (TPE takes a pruned trial as worse than every complete one, and no longer favours it). Its
        parameters stay on it (REJECTED): an identical proposal later is marked a repeat of it (REPEAT_OF). A
        sampler's proposal refused counts toward the repeats in a row, so a sampler that only proposes refused
        settings turns to random draws and then ends, as one that only proposes measured ones. Before, it counted
        as an invalid trial without an environment: 12 of 30 trials of an aws-ofi-nccl tune, one refused proposal
        again and again."""
        reason = f"not launched: {exc}"
        trial.set_user_attr(FAIL_REASON, reason)
        trial.set_user_attr(REJECTED, True)
        params = trial.params
        earlier = next((t for t in trial.study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
                        if t.user_attrs.get(REJECTED) and t.number != trial.number and t.params == params), None)
        if earlier is not None:
            trial.set_user_attr(REPEAT_OF, earlier.number)
        if ROLE not in trial.user_attrs:
            self._repeats_in_a_row += 1
        if earlier is None:
            logger.warning("trial %d not launched: %s", trial.number, exc)
        raise optuna.TrialPruned(reason) from None

    def _drop_knobs(self, trial: optuna.Trial, unread: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        """Takes the searched knobs the library did not read out of the search for every later trial (the
        trial that showed it first keeps its name: another worker may have dropped some meanwhile). A knob whose
        reading depends on searched knobs (the catalog's `read_depends_on`) leaves it only beside their values in
        this trial's `env` (DROPPED_KNOB_WHEN)."""
        env = trial.user_attrs.get(ENV, {}) if env is None else env
        dropped = dropped_knobs(trial.study)
        in_context = dropped_in_context(trial.study)
        new, new_in_context = [], []
        for name in unread:
            if name not in self.space.knob_names or name in dropped:
                continue
            depends = [other for other in self.space.catalog[name].read_depends_on if other in self.space.knob_names]
            if not depends:
                new.append(name)
                continue
            context = {other: self.space.catalog.library_value(other, env.get(other)) for other in depends}
            if not any(self.space.matches(known, context) for known, _ in in_context.get(name, [])):
                new_in_context.append((name, context))
        if new:
            logger.warning("%s: %s leave the search (the library did not read them in trial %d)",
                           self.study_name, ", ".join(new), trial.number)
        for name in new:
            trial.study.set_user_attr(DROPPED_KNOB + name, f"not read by the library in trial {trial.number}")
        for name, context in new_in_context:
            where = ", ".join(f"{other}={'unset' if value is None else value}" for other, value in context.items())
            logger.warning("%s: %s leaves the search beside %s (the library did not read it in trial %d)",
                           self.study_name, name, where, trial.number)
            trial.study.set_user_attr(f"{DROPPED_KNOB_WHEN}{name}:{json.dumps(context, sort_keys=True)}",
                                      f"not read by the library beside {where} in trial {trial.number}")


@contextmanager
def _reported_failures() -> Iterator[None]:
    optimize_logger = logging.getLogger("optuna.study._optimize")
    reported = _ReportedFailures()
    optimize_logger.addFilter(reported)
    try:
        yield
    finally:
        optimize_logger.removeFilter(reported)


class _ProgressDisplay:
    """rich progress bar: counted trials of the budget and the best time so far vs the defaults."""

    def __init__(self, enabled: bool, total: int | None, name: str) -> None:
        self.enabled = enabled
        self.name = name
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[best]}"),
        )
        self.task = self.bar.add_task(name, total=total, best="")
        self.total = total
        self.lines = not self.bar.console.is_terminal  # a log (pipe, file, batch job): one line per trial
        self.counted: int | None = None
        self.started = time.monotonic()

    def __enter__(self) -> _ProgressDisplay:
        if self.enabled and not self.lines:
            # Optuna's per-trial INFO lines would tear the bar apart; the bar says the same.
            self.verbosity = optuna.logging.get_verbosity()
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and not self.lines:
            self.bar.stop()
            optuna.logging.set_verbosity(self.verbosity)

    def update(self, progress: StudyProgress) -> None:
        best = "no complete trial yet"
        if progress.best_value_us is not None:
            best = f"best {progress.best_value_us:.4g} us"
            if progress.best_speedup is not None:
                best += f" ({(progress.best_speedup - 1) * 100:+.1f}% vs defaults)"
        best += f"  failed {progress.failed}"
        self.bar.update(self.task, completed=progress.counted, best=best)
        if self.enabled and self.lines and progress.counted != self.counted:
            self.counted = progress.counted
            print(f"trials: {self._counted_of_total(progress.counted)}, {time.monotonic() - self.started:.0f} s; "
                  f"{best}", flush=True)

    def _counted_of_total(self, counted: int) -> str:
        if self.total is None:
            return f"{counted} counted"
        if counted > self.total:  # a study resumed with a smaller `trials` runs none (it said "6 of 3 counted")
            return f"{counted} counted (a budget of {self.total}: already spent)"
        return f"{counted} of {self.total} counted"


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_counted(t)]


def top_envs(study: optuna.Study, k: int, bucket: str | None = None) -> list[tuple[int, dict[str, str], float]]:
    """The k best distinct environments (trial number, env, time in us), overall or for one
    bucket, excluding the baseline environment."""
    baseline = study.user_attrs.get("baseline_env", {})

    def score(t: FrozenTrial) -> float:
        return float(t.user_attrs[BUCKET_US][bucket] if bucket is not None else t.values[0])

    seen: list[dict[str, str]] = [baseline]
    best = []
    for trial in sorted(complete_trials(study), key=score):
        env = trial.user_attrs[ENV]
        if env in seen or not math.isfinite(score(trial)):
            continue
        seen.append(env)
        best.append((trial.number, env, score(trial)))
        if len(best) == k:
            break
    return best


def best_envs_of_studies(
    storage: str | optuna.storages.BaseStorage, prefix: str, space: SearchSpace, k: int = 2
) -> list[dict[str, str]]:
    """The k best distinct settings of the stored study named `prefix` and of each study named `prefix`/...,
    newest study first, as far as `space` holds them (seeds for a new study). A study whose name merely
    begins with the same characters (`prefix`-other/...) is another setup's."""
    found: list[dict[str, str]] = []
    names = [name for name in optuna.get_all_study_names(storage) if name == prefix or name.startswith(f"{prefix}/")]
    for name in reversed(names):
        for _, env, _ in top_envs(optuna.load_study(study_name=name, storage=storage), k):
            try:
                space.params_for_env(env)
            except ValueError:  # a value this space no longer offers
                continue
            if env not in found:
                found.append(env)
    return found


def dropped_knobs(study: optuna.Study) -> dict[str, str]:
    """Knob -> why it left the search (DROPPED_KNOB)."""
    attrs = study.user_attrs
    return {**attrs.get(LEGACY_DROPPED_KNOBS, {}),
            **{key.removeprefix(DROPPED_KNOB): why for key, why in attrs.items() if key.startswith(DROPPED_KNOB)}}


def dropped_in_context(study: optuna.Study) -> dict[str, list[tuple[dict[str, str | None], str]]]:
    """Knob -> [(context, why)]: where (the values of the searched knobs its reading depends on) it left the search
    (DROPPED_KNOB_WHEN)."""
    found: dict[str, list[tuple[dict[str, str | None], str]]] = {}
    for key, why in study.user_attrs.items():
        if key.startswith(DROPPED_KNOB_WHEN):
            name, _, context = key.removeprefix(DROPPED_KNOB_WHEN).partition(":")
            found.setdefault(name, []).append((json.loads(context), why))
    return found


def finalization_candidates(
    study: optuna.Study, space: SearchSpace, buckets: Sequence[SizeBucket], k: int = 3, min_importance: float = 0.05
) -> list[tuple[int | None, dict[str, str]]]:
    """Distinct configurations worth re-measuring: the k best overall, the best of each bucket, and
    a simplified best: the baseline plus only the best trial's values of the knobs that explain at
    least `min_importance` of the objective's variance (Optuna's default importance evaluator), and of
    the other factors of their catalog constraints (the baseline's 16 socket threads beside the best's
    8 sockets per thread would break threads x sockets <= 64). A
    candidate leaves out the settings that change nothing (KnobCatalog.effective_env: e.g. sockets per
    thread without socket threads) unless the baseline sets them alike; one that runs the baseline's
    configuration is no candidate."""
    baseline = dict(study.user_attrs.get("baseline_env", {}))
    effective = space.effective_env
    chosen: list[tuple[int | None, dict[str, str]]] = []
    for bucket in (None, *(b.name for b in buckets)):
        for number, measured, _ in top_envs(study, k if bucket is None else 1, bucket):
            runs = effective(measured)
            env = {name: value for name, value in measured.items() if name in runs or baseline.get(name) == value}
            if not same_configuration(space, env, [baseline, *(other for _, other in chosen)]):
                chosen.append((number, env))
    if not chosen:
        return chosen
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "less than 2 trials" per regime: expected on small studies
            importances = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):  # too few complete trials to estimate importances
        return chosen
    weight: dict[str, float] = {}
    for param, importance in importances.items():
        knob = param.split(":")[0]
        weight[knob] = weight.get(knob, 0.0) + importance
    best_env = chosen[0][1]
    important = {name for name in space.knob_names if weight.get(name, 0.0) >= min_importance}
    # a constraint's factors come all from the best or all from the baseline: a mix may break it
    groups = [set(constraint.names) for constraint in space.catalog.constraints]
    while grown := {name for group in groups if important & group for name in group} - important:
        important |= grown
    simplified = space.env_from_values(
        {name: (best_env if name in important else baseline).get(name) for name in space.knob_names})
    if not same_configuration(space, simplified, [baseline, *(env for _, env in chosen)]):
        chosen.append((None, simplified))
    return chosen


def same_configuration(space: SearchSpace, env: Mapping[str, str], others: Sequence[Mapping[str, str]]) -> bool:
    """Whether one of `others` runs the same configuration as `env` (SearchSpace.effective_env)."""
    effective = space.effective_env
    return effective(env) in [effective(other) for other in others]
