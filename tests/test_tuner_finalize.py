"""Finalization statistics: interleaved paired re-measurement, Wilcoxon + Holm, minimum effect, CI."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from fixtures_tuner import TWO_BUCKETS

from tuners.evaluation import Evaluation, FailureKind
from tuners.finalize import Candidate, Thresholds, finalize, holm, rounds_needed

SIZES = (64, 1024, 1 << 20, 1 << 26)
BASELINE = {"NCCL_PROTO": "Simple"}
FASTER = {"NCCL_PROTO": "LL128"}
OTHER = {"NCCL_PROTO": "LL"}


class DriftingEvaluator:
    """Times with a per-setting true speed-up, a slow common drift (random walk, 1 % per call: what
    interleaving must cancel) and independent multiplicative noise per evaluation and size."""

    def __init__(self, speedups: Mapping[str, float], noise: float, seed: int) -> None:
        self.speedups = dict(speedups)
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.drift = 1.0
        self.order: list[str] = []

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        proto = env.get("NCCL_PROTO", "unset")
        self.order.append(proto)
        self.drift *= self.rng.lognormal(0.0, 0.01)
        speedup = 1.0 + self.speedups.get(proto, 0.0)
        times = {s: [(5.0 + s / 2e4) / speedup * self.drift * self.rng.lognormal(0.0, self.noise)] for s in SIZES}
        return Evaluation(times_us=times, validated=validate)


def run(speedups: Mapping[str, float], seed: int, noise: float = 0.03, candidates=(FASTER, OTHER), **kwargs):
    evaluator = DriftingEvaluator(speedups, noise, seed)
    report = finalize(evaluator, BASELINE, [Candidate(c) for c in candidates], TWO_BUCKETS, seed=seed, **kwargs)
    return report, evaluator


def test_a_a_keeps_the_defaults_in_every_seed() -> None:
    verdicts = [run({}, seed)[0].overall.verdict for seed in range(20)]
    assert verdicts == ["keep-defaults"] * 20


@pytest.mark.parametrize("seed", range(5))
def test_a_real_ten_percent_gain_with_three_percent_noise_is_a_change(seed: int) -> None:
    report, evaluator = run({"LL128": 0.10}, seed)
    assert report.overall.verdict == "change" and report.overall.env == FASTER
    winner = report.overall.winner
    assert winner is not None and winner.gain is not None and winner.ci_low is not None and winner.ci_high is not None
    assert 0.06 < winner.gain < 0.14 and 0 < winner.ci_low <= winner.gain <= winner.ci_high
    assert winner.p_adjusted is not None and winner.p_adjusted < 0.01
    assert report.buckets["large"].verdict == "change"
    other = report.overall.comparisons[1]
    assert not other.accepted and "minimum effect" in other.reason
    # Interleaved: each round measures the baseline and both candidates once, in varying order.
    rounds = [evaluator.order[i : i + 3] for i in range(0, len(evaluator.order), 3)]
    assert len(rounds) == report.rounds_run and all(sorted(r) == ["LL", "LL128", "Simple"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1


def test_a_one_percent_gain_is_below_the_minimum_effect() -> None:
    for seed in range(5):
        report, _ = run({"LL128": 0.01}, seed)
        assert report.overall.verdict == "keep-defaults"
        assert "below the minimum effect 3%" in report.overall.comparisons[0].reason


def test_may_corrupt_candidate_needs_a_validated_rerun() -> None:
    def needs(env: Mapping[str, str]) -> tuple[str, ...]:
        return ("NCCL_PROTO",) if env.get("NCCL_PROTO") == "LL128" else ()

    inner = DriftingEvaluator({"LL128": 0.2}, 0.02, 0)

    def corrupting(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        evaluation = inner(env, validate=validate)
        if validate:
            return Evaluation.failed(FailureKind.INVALID, "commbench --check: 17 wrong elements at 64 MiB")
        return evaluation

    report = finalize(corrupting, BASELINE, [Candidate(FASTER)], TWO_BUCKETS, needs_validation=needs)
    assert report.overall.verdict == "keep-defaults"
    assert "validated re-run (NCCL_PROTO may corrupt data) failed" in report.overall.comparisons[0].reason
    assert "wrong elements" in report.overall.comparisons[0].reason
    report = finalize(
        DriftingEvaluator({"LL128": 0.2}, 0.02, 0), BASELINE, [Candidate(FASTER)], TWO_BUCKETS, needs_validation=needs
    )
    assert report.overall.verdict == "change"


def test_failures_during_remeasurement() -> None:
    # The candidate's fifth run times out: it is rejected, whatever its speed.
    inner = DriftingEvaluator({"LL128": 0.2}, 0.02, 3)

    def flaky(env, *, validate=False):
        if env == FASTER and inner.order.count("LL128") == 4:
            return Evaluation.failed(FailureKind.TIMEOUT, "watchdog: iteration exceeded 10 s")
        return inner(env, validate=validate)

    report = finalize(flaky, BASELINE, [Candidate(FASTER)], TWO_BUCKETS)
    assert report.overall.verdict == "keep-defaults"
    assert "failed in re-measurement round 5: timeout" in report.overall.comparisons[0].reason
    # A baseline that fails in two rounds loses those rounds, not the decision.
    steady = DriftingEvaluator({"LL128": 0.2}, 0.02, 4)
    baseline_calls = []

    def baseline_flaky(env, *, validate=False):
        if env == BASELINE:
            baseline_calls.append(1)
            if len(baseline_calls) in (2, 7):
                return Evaluation.failed(FailureKind.FAILED, "srun: node failure")
        return steady(env, validate=validate)

    report = finalize(baseline_flaky, BASELINE, [Candidate(FASTER)], TWO_BUCKETS, thresholds=Thresholds(rounds=12))
    assert report.rounds_used == 10 and report.overall.verdict == "change"
    assert sum("baseline failed" in note for note in report.notes) == 2


def test_simplest_statistically_equal_candidate_wins() -> None:
    bigger = {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}
    evaluator = DriftingEvaluator({"LL128": 0.2}, 0.02, 5)  # BUFFSIZE does nothing: both 20 % faster
    report = finalize(evaluator, BASELINE, [Candidate(bigger), Candidate(FASTER)], TWO_BUCKETS)
    assert all(c.accepted for c in report.overall.comparisons)
    assert report.overall.env == FASTER


def test_holm_and_round_count() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([]) == []
    assert rounds_needed(1, 0.01) == 9  # 2**-7 < 0.01, plus two rounds of margin
    report, _ = run({"LL128": 0.1}, 0, candidates=[FASTER] + [{"NCCL_PROTO": p} for p in ("LL", "^LL", "^LL128")] * 10)
    assert report.rounds_run == rounds_needed(40, 0.01) > 10
    assert any("rounds raised" in note for note in report.notes)
