"""The tuning study on real Optuna with SQLite storage: defaults first, failures recorded, resume,
lost workers, several workers on one study.

PostgreSQL remains for the campaigns side: N worker *processes* on one PostgreSQL study (SQLite
allows one writer process; here the workers are threads sharing one SQLite file).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from fixtures_tuner import ScriptedEvaluator, make_scope, sqlite_url  # noqa: F401  (fixtures)

from tuners.evaluation import FailureKind, buckets_for_sizes
from tuners.study import (
    BUCKET_US,
    ENV,
    FAIL_REASON,
    OUTCOME,
    RETRY_OF,
    ROLE,
    Tuner,
    finalization_candidates,
    is_counted,
    open_storage,
    study_progress,
)
from tuners.synthetic import (
    SCENARIOS,
    SYNTHETIC_SIZES,
    SyntheticEvaluator,
    optimum_env,
    synthetic_space,
    true_objective_us,
)

SCENARIO = SCENARIOS["nvlink-bad-default"]
BUCKETS = buckets_for_sizes(SYNTHETIC_SIZES)
REPO = Path(__file__).resolve().parent.parent


def make_tuner(url: str, evaluator, n_trials: int, seed: int = 0, **kwargs) -> Tuner:
    return Tuner(
        make_scope(),
        synthetic_space(scenario=SCENARIO),
        evaluator,
        url,
        BUCKETS,
        n_trials=n_trials,
        seed=seed,
        **kwargs,
    )


def counted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if is_counted(t)]


def test_trial_zero_is_the_site_defaults_and_the_bad_default_is_recovered(sqlite_url: str) -> None:
    tuner = make_tuner(sqlite_url, SyntheticEvaluator(SCENARIO, seed=1), n_trials=30, seed=3)
    study = tuner.run()
    first = study.trials[0]
    assert first.user_attrs[ROLE] == "defaults"
    assert first.user_attrs[ENV] == {"NCCL_MAX_CTAS": "4", "NCCL_PROTO": "LL"} == tuner.baseline_env
    assert set(first.user_attrs[BUCKET_US]) == {b.name for b in BUCKETS}
    progress = study_progress(study)
    assert (progress.counted, progress.complete) == (30, 30)
    space = tuner.space
    best_env = study.best_trial.user_attrs[ENV]
    optimum = true_objective_us(SCENARIO, optimum_env(SCENARIO, space, BUCKETS), BUCKETS)
    defaults = true_objective_us(SCENARIO, tuner.baseline_env, BUCKETS)
    best = true_objective_us(SCENARIO, best_env, BUCKETS)
    # The planted defaults reach 42 % of the optimum; after 30 trials the best is near the optimum.
    assert defaults / best > 2.0 and optimum / best > 0.85, best_env
    candidates = finalization_candidates(study, space, BUCKETS)
    assert candidates and all(env != tuner.baseline_env for _, env in candidates)
    assert len({tuple(sorted(env.items())) for _, env in candidates}) == len(candidates)


def test_failed_hung_and_invalid_trials_are_recorded_and_the_study_goes_on(sqlite_url: str) -> None:
    evaluator = ScriptedEvaluator(
        SyntheticEvaluator(SCENARIO),
        {
            2: FailureKind.TIMEOUT,
            3: FailureKind.INVALID,
            4: RuntimeError("srun: error: node lost"),
            5: FailureKind.FAILED,
        },
    )
    study = make_tuner(sqlite_url, evaluator, n_trials=8).run()
    trials = counted(study)
    assert len(trials) == 8 and evaluator.calls == 8
    outcomes = [(t.state, t.user_attrs[OUTCOME]) for t in trials]
    assert outcomes[1:5] == [
        (optuna.trial.TrialState.FAIL, kind) for kind in ("timeout", "invalid", "failed", "failed")
    ]
    assert trials[1].user_attrs[FAIL_REASON] == "scripted timeout on call 2"
    assert "RuntimeError: srun: error: node lost" in trials[3].user_attrs[FAIL_REASON]
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in trials[5:])
    progress = study_progress(study)
    assert (progress.complete, progress.failed) == (4, 4)


def test_evaluation_missing_a_bucket_is_invalid(sqlite_url: str) -> None:
    inner = SyntheticEvaluator(SCENARIO)

    def small_sizes_only(env, *, validate=False):
        evaluation = inner(env, validate=validate)
        return type(evaluation)(times_us={s: v for s, v in evaluation.times_us.items() if s < 4096})

    study = make_tuner(sqlite_url, small_sizes_only, n_trials=2).run()
    assert [t.user_attrs[OUTCOME] for t in counted(study)] == ["invalid", "invalid"]
    assert "no measured size falls into bucket" in counted(study)[0].user_attrs[FAIL_REASON]


def test_resume_counts_completed_trials_toward_the_budget(sqlite_url: str) -> None:
    first = make_tuner(sqlite_url, SyntheticEvaluator(SCENARIO), n_trials=5).run()
    assert len(counted(first)) == 5
    evaluator = SyntheticEvaluator(SCENARIO, seed=9)
    resumed = make_tuner(sqlite_url, evaluator, n_trials=12).run()
    trials = counted(resumed)
    assert len(trials) == 12 and evaluator.calls == 7
    assert sorted(t.number for t in trials) == list(range(12))
    assert sum(t.user_attrs.get(ROLE) == "defaults" for t in resumed.trials) == 1
    again = SyntheticEvaluator(SCENARIO)
    make_tuner(sqlite_url, again, n_trials=12).run()
    assert again.calls == 0
    with pytest.raises(ValueError, match="exists with different baseline_env"):
        Tuner(make_scope(), synthetic_space(), again, sqlite_url, BUCKETS, n_trials=12).run()


def test_interrupted_trial_is_queued_again(sqlite_url: str) -> None:
    evaluator = ScriptedEvaluator(SyntheticEvaluator(SCENARIO), {3: KeyboardInterrupt()})
    with pytest.raises(KeyboardInterrupt):
        make_tuner(sqlite_url, evaluator, n_trials=6).run()
    interrupted_env = evaluator.envs[2]
    resumed = ScriptedEvaluator(SyntheticEvaluator(SCENARIO), {})
    study = make_tuner(sqlite_url, resumed, n_trials=6).run()
    trials = counted(study)
    assert len(trials) == 6
    assert resumed.envs[0] == interrupted_env  # the re-queued trial runs first
    assert [t.user_attrs.get(RETRY_OF) for t in trials if RETRY_OF in t.user_attrs] == [[2]]


WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    from fixtures_tuner import make_scope
    from tuners.evaluation import buckets_for_sizes
    from tuners.study import Tuner, open_storage
    from tuners.synthetic import SCENARIOS, SYNTHETIC_SIZES, SyntheticEvaluator, synthetic_space

    scenario = SCENARIOS["nvlink-bad-default"]
    inner = SyntheticEvaluator(scenario, seed={seed})
    def evaluate(env, *, validate=False):
        if inner.calls == {die_after}:
            print("ENV", sorted(env.items()), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-trial
        time.sleep({sleep})  # a benchmark run takes time: workers overlap
        return inner(env, validate=validate)
    storage = open_storage({url!r}, heartbeat_interval=1, grace_period=2)
    Tuner(make_scope(), synthetic_space(scenario=scenario), evaluate, storage,
          buckets_for_sizes(SYNTHETIC_SIZES), n_trials={n_trials}, seed={seed}).run()
    """
)


def start_worker(
    url: str, *, seed: int = 0, die_after: int = -1, sleep: float = 0.0, n_trials: int = 6
) -> subprocess.Popen:
    code = WORKER.format(
        tests=str(REPO / "tests"), url=url, seed=seed, die_after=die_after, sleep=sleep, n_trials=n_trials
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def assert_rerun_of_lost_trial(study: optuna.Study, killed_stdout: str) -> None:
    lost = [t for t in study.trials if t.state is optuna.trial.TrialState.FAIL and not is_counted(t)]
    reruns = [t for t in counted(study) if RETRY_OF in t.user_attrs]
    assert len(lost) == 1 and len(reruns) == 1
    assert reruns[0].user_attrs[RETRY_OF] == [lost[0].number] and reruns[0].params == lost[0].params
    assert f"ENV {sorted(reruns[0].user_attrs[ENV].items())}" in killed_stdout


def test_trial_of_a_killed_worker_is_failed_and_rerun_once(sqlite_url: str) -> None:
    worker = start_worker(sqlite_url, die_after=3)
    stdout, stderr = worker.communicate(timeout=120)
    assert worker.returncode == -signal.SIGKILL, stderr
    storage = open_storage(sqlite_url, heartbeat_interval=1, grace_period=2)
    study = optuna.load_study(study_name=make_scope().study_name, storage=storage)
    assert [t.state for t in study.trials].count(optuna.trial.TrialState.RUNNING) == 1
    time.sleep(3)  # past the grace period: the RUNNING trial is stale
    evaluator = ScriptedEvaluator(SyntheticEvaluator(SCENARIO), {})
    study = make_tuner(storage, evaluator, n_trials=6).run()
    assert len(counted(study)) == 6 and evaluator.calls == 3
    assert_rerun_of_lost_trial(study, stdout)


def test_workers_in_turn_on_sqlite_share_the_budget(sqlite_url: str) -> None:
    """SQLite takes one process at a time, so its workers take turns; the first stops at its own
    wall-time budget, the second finishes the study's trial budget."""

    def slow(inner):
        def evaluate(env, *, validate=False):
            time.sleep(0.2)
            return inner(env, validate=validate)

        return evaluate

    first, second = SyntheticEvaluator(SCENARIO, seed=1), SyntheticEvaluator(SCENARIO, seed=2)
    make_tuner(sqlite_url, slow(first), n_trials=10, seed=1, timeout_s=0.5).run()
    make_tuner(sqlite_url, second, n_trials=10, seed=2).run()
    study = optuna.load_study(study_name=make_scope().study_name, storage=sqlite_url)
    assert 1 <= first.calls < 10 and first.calls + second.calls == 10
    assert sorted(t.number for t in counted(study)) == list(range(10))


@pytest.mark.postgres
def test_parallel_workers_on_postgresql_with_one_killed(postgres_url: str) -> None:
    n_trials = 12
    make_tuner(postgres_url, SyntheticEvaluator(SCENARIO), n_trials=n_trials).load_study()
    workers = [
        start_worker(postgres_url, seed=w, sleep=0.3, n_trials=n_trials, die_after=2 if w == 2 else -1)
        for w in range(3)
    ]
    outputs = [w.communicate(timeout=300) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, -signal.SIGKILL], [o[1][-2000:] for o in outputs]
    time.sleep(3)  # the killed worker's trial goes stale
    resumed = start_worker(postgres_url, seed=7, n_trials=n_trials)
    assert resumed.wait(timeout=300) == 0, resumed.communicate()[1][-2000:]
    study = optuna.load_study(study_name=make_scope().study_name, storage=postgres_url)
    trials = counted(study)
    assert len(trials) == n_trials and len({t.number for t in trials}) == n_trials
    assert sum(t.user_attrs.get(ROLE) == "defaults" for t in study.trials) == 1
    assert_rerun_of_lost_trial(study, outputs[2][0])
