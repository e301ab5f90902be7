"""Finalization: decide, from fresh interleaved measurements, whether any candidate beats the baseline.

Procedure (the same words go into every output, see `TEST_DESCRIPTION`):
1. Candidates whose environment sets a may-corrupt knob get one run with data validation on; a
   run that fails or does not validate rejects the candidate.
2. `rounds` rounds; in each, the baseline and every remaining candidate run once, in a freshly
   shuffled order (interleaving A B A B..., so drift hits all settings alike). A candidate that
   fails in any round is rejected; a round whose baseline failed is dropped.
3. Per candidate and per decision (overall, and each size bucket): paired per-round log ratios
   d = log(t_baseline / t_candidate). One-sided Wilcoxon signed-rank test (H1: d > 0); p values
   Holm-corrected over the candidates of that decision. Gain = median over rounds of
   exp(d) - 1 (speed-up; equals the goodput gain); percentile bootstrap confidence interval.
4. A candidate is accepted if Holm-adjusted p < alpha AND gain >= min_effect AND the CI's lower
   bound > 0. None accepted = keep defaults. Otherwise the winner is, among the accepted candidates
   whose gain reaches the CI lower bound of the largest gain, the one changing the fewest variables.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from tuners.evaluation import Evaluator, SizeBucket, bucket_times_us, overall_time_us

OVERALL = "overall"


@dataclass(frozen=True)
class Thresholds:
    alpha: float = 0.01  # family-wise error rate per decision (Holm over its candidates)
    min_effect: float = 0.03  # minimum median speed-up (3 %) worth a change
    confidence: float = 0.95  # two-sided bootstrap CI level; its lower bound must exceed 0
    rounds: int = 10  # raised automatically when too few rounds could reach alpha
    n_resamples: int = 9999

    def describe(self) -> str:
        return (
            f"alpha={self.alpha} (Holm over candidates), minimum effect {self.min_effect:.0%} median gain, "
            f"{self.confidence:.0%} bootstrap CI lower bound > 0"
        )


TEST_DESCRIPTION = (
    "one-sided Wilcoxon signed-rank test on paired per-round log time ratios, baseline and candidates "
    "interleaved in shuffled order each round; gain = median per-round speed-up with percentile bootstrap CI"
)


def rounds_needed(n_candidates: int, alpha: float) -> int:
    """The exact one-sided Wilcoxon p value of n rounds is at least 2**-n; with Holm the first
    candidate must reach alpha / n_candidates. Two rounds of margin allow one sign flip."""
    return math.ceil(math.log2(max(n_candidates, 1) / alpha)) + 2


@dataclass(frozen=True)
class Candidate:
    env: Mapping[str, str]
    trial_number: int | None = None


@dataclass(frozen=True)
class Comparison:
    candidate: Candidate
    decision: str  # OVERALL or a bucket name
    accepted: bool
    reason: str
    rounds: int = 0
    gain: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None
    ratios: tuple[float, ...] = ()  # per-round speed-ups, the evidence behind gain and CI


@dataclass(frozen=True)
class Decision:
    name: str
    env: Mapping[str, str]  # the winner's environment, or the baseline's
    winner: Comparison | None
    comparisons: tuple[Comparison, ...]

    @property
    def change(self) -> bool:
        return self.winner is not None

    @property
    def verdict(self) -> str:
        return "change" if self.change else "keep-defaults"


@dataclass(frozen=True)
class FinalReport:
    baseline_env: Mapping[str, str]
    overall: Decision
    buckets: Mapping[str, Decision]
    thresholds: Thresholds
    rounds_run: int
    rounds_used: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    test: str = TEST_DESCRIPTION


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p values (same order as given)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def _paired_statistics(
    log_ratios: np.ndarray, thresholds: Thresholds, rng: np.random.Generator
) -> tuple[float, float, float, float]:
    """(p value, gain, ci_low, ci_high) of per-round log ratios (positive = candidate faster)."""
    ratios = np.exp(log_ratios)
    gain = float(np.median(ratios) - 1)
    if np.all(log_ratios == 0):
        return 1.0, gain, gain, gain
    p_value = float(stats.wilcoxon(log_ratios, alternative="greater").pvalue)
    if np.ptp(ratios) == 0:
        return p_value, gain, gain, gain
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        interval = stats.bootstrap(
            (ratios,),
            np.median,
            confidence_level=thresholds.confidence,
            n_resamples=thresholds.n_resamples,
            method="percentile",
            rng=rng,
        ).confidence_interval
    return p_value, gain, float(interval.low - 1), float(interval.high - 1)


def _decide(
    name: str,
    baseline_env: Mapping[str, str],
    candidates: Sequence[Candidate],
    rejected: Mapping[int, str],
    baseline_times: Sequence[float],
    candidate_times: Mapping[int, Sequence[float]],
    thresholds: Thresholds,
    rng: np.random.Generator,
) -> Decision:
    comparisons: dict[int, Comparison] = {
        i: Comparison(candidates[i], name, False, reason) for i, reason in rejected.items()
    }
    tested = [i for i in range(len(candidates)) if i not in rejected]
    measured = {}
    for i in tested:
        log_ratios = np.log(np.asarray(baseline_times)) - np.log(np.asarray(candidate_times[i]))
        measured[i] = (log_ratios, *_paired_statistics(log_ratios, thresholds, rng))
    adjusted = dict(zip(tested, holm([measured[i][1] for i in tested]), strict=True))
    for i in tested:
        log_ratios, p_value, gain, ci_low, ci_high = measured[i]
        failed = []
        if adjusted[i] >= thresholds.alpha:
            failed.append(f"not significant (Holm p={adjusted[i]:.3g} >= {thresholds.alpha})")
        if gain < thresholds.min_effect:
            failed.append(f"gain {gain:+.1%} below the minimum effect {thresholds.min_effect:.0%}")
        if ci_low <= 0:
            failed.append(f"CI lower bound {ci_low:+.1%} <= 0")
        comparisons[i] = Comparison(
            candidates[i],
            name,
            not failed,
            "; ".join(failed) or "significant and above the minimum effect",
            len(log_ratios),
            gain,
            ci_low,
            ci_high,
            p_value,
            adjusted[i],
            tuple(float(r) for r in np.exp(log_ratios)),
        )
    ordered = tuple(comparisons[i] for i in range(len(candidates)))
    accepted = [c for c in ordered if c.accepted]
    best = max(accepted, key=lambda c: c.gain or 0.0, default=None)
    if best is None:
        return Decision(name, dict(baseline_env), None, ordered)
    # Fewer changed variables is a better recommendation when the gain is statistically the same.
    assert best.ci_low is not None
    contenders = [c for c in accepted if (c.gain or 0.0) >= best.ci_low]
    winner = min(contenders, key=lambda c: (changed_knobs(baseline_env, c.candidate.env), -(c.gain or 0.0)))
    return Decision(name, dict(winner.candidate.env), winner, ordered)


def changed_knobs(baseline_env: Mapping[str, str], env: Mapping[str, str]) -> int:
    return sum(1 for name in set(baseline_env) | set(env) if baseline_env.get(name) != env.get(name))


def finalize(
    evaluator: Evaluator,
    baseline_env: Mapping[str, str],
    candidates: Sequence[Candidate],
    buckets: Sequence[SizeBucket],
    *,
    thresholds: Thresholds = Thresholds(),
    needs_validation: Callable[[Mapping[str, str]], Sequence[str]] = lambda env: (),
    seed: int = 0,
    min_rounds_used: int | None = None,
) -> FinalReport:
    """Re-measures baseline and candidates interleaved and returns the decisions. `needs_validation`
    names the may-corrupt knobs an environment sets (SearchSpace.may_corrupt_knobs)."""
    rng = np.random.default_rng(seed)
    notes: list[str] = []
    rejected: dict[int, str] = {}
    for i, candidate in enumerate(candidates):
        risky = needs_validation(candidate.env)
        if not risky:
            continue
        check = evaluator(candidate.env, validate=True)
        if not check.ok:
            rejected[i] = (
                f"validated re-run ({', '.join(risky)} may corrupt data) failed: {check.failure}: {check.reason}"
            )
        elif not check.validated:
            rejected[i] = f"validated re-run ({', '.join(risky)} may corrupt data) did not validate the data"
    rounds = max(thresholds.rounds, rounds_needed(len(candidates), thresholds.alpha))
    if rounds > thresholds.rounds:
        notes.append(
            f"rounds raised from {thresholds.rounds} to {rounds} so that {len(candidates)} candidates can reach alpha"
        )
    # Per round: each setting's per-bucket times (index -1 = baseline), None = failed.
    rounds_data: list[dict[int, dict[str, float]]] = []
    for round_index in range(rounds):
        active = [-1] + [i for i in range(len(candidates)) if i not in rejected]
        if len(active) == 1:
            notes.append("no candidate left to compare with the baseline: keep defaults")
            break
        measured: dict[int, dict[str, float]] = {}
        for index in rng.permutation(active):
            env = baseline_env if index == -1 else candidates[index].env
            evaluation = evaluator(env, validate=False)
            if not evaluation.ok:
                if index == -1:
                    notes.append(
                        f"round {round_index + 1}: baseline failed "
                        f"({evaluation.failure}: {evaluation.reason}); round dropped"
                    )
                else:
                    rejected[int(index)] = (
                        f"failed in re-measurement round {round_index + 1}: {evaluation.failure}: {evaluation.reason}"
                    )
                continue
            measured[int(index)] = bucket_times_us(evaluation.median_us(), buckets)
        if -1 in measured:
            rounds_data.append(measured)
    required = min_rounds_used if min_rounds_used is not None else rounds_needed(1, thresholds.alpha)
    if len(rounds_data) < required and len(rejected) < len(candidates):
        notes.append(f"only {len(rounds_data)} rounds had a working baseline (need {required}): keep defaults")
        for i in range(len(candidates)):
            rejected.setdefault(i, "too few rounds with a working baseline")

    def series(index: int, decision: str) -> list[float]:
        values = []
        for measured in rounds_data:
            times = measured[index]
            values.append(overall_time_us(times) if decision == OVERALL else times[decision])
        return values

    def decide(decision: str) -> Decision:
        candidate_times = {i: series(i, decision) for i in range(len(candidates)) if i not in rejected}
        baseline = series(-1, decision) if rounds_data else []
        return _decide(decision, baseline_env, candidates, rejected, baseline, candidate_times, thresholds, rng)

    return FinalReport(
        baseline_env=dict(baseline_env),
        overall=decide(OVERALL),
        buckets={bucket.name: decide(bucket.name) for bucket in buckets},
        thresholds=thresholds,
        rounds_run=rounds,
        rounds_used=len(rounds_data),
        notes=tuple(notes),
    )
