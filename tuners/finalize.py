"""Finalization: decide, from fresh interleaved measurements, whether any candidate beats the baseline.

Procedure (`FinalReport.test` says it in every output, with this finalization's numbers):
1. Candidates whose environment sets, removes or alters a may-hang or may-corrupt knob relative to
   the baseline (dropping a site default included: `needs_validation(baseline, env)`, i.e.
   SearchSpace.unsafe_changes) get one run with data validation on; a run that fails, does not
   validate, or lacks a size of any bucket rejects the candidate.
2. `rounds` rounds; in each, the baseline and every remaining candidate run once, in a freshly
   shuffled order (interleaving A B A B..., so drift hits all settings alike). A candidate that
   fails in any round is rejected; a round whose baseline failed is dropped.
3. Per candidate and per decision (overall, and each size bucket): paired per-round log ratios
   d = log(t_baseline / t_candidate). Gain = median over rounds of exp(d) - 1 (speed-up; equals
   the goodput gain), with a percentile bootstrap confidence interval. The test asks whether the
   gain EXCEEDS the minimum effect, not merely zero: one-sided exact Wilcoxon signed-rank test of
   d - log(1 + min_effect) (H0: the median speed-up is at most min_effect; superiority by a
   margin). A candidate that is truly no faster than the baseline then passes only if noise fakes
   more than the minimum effect in nearly every round, so A/A false changes are far rarer than
   alpha; the price is power close to the minimum effect (`python -m tuners.bench_finalize`
   measures both): raise `rounds` to resolve gains near the minimum effect.
4. The family: every "change" of one finalization is a recommendation (the global environment,
   and each size bucket's winner, which becomes a tuner-plugin row), so the p values of ALL its
   tests, F = candidates tested x decisions, are Holm-corrected together: the probability that a
   finalization recommends any change whose true median speed-up is at most the minimum effect is
   at most alpha, whatever the number of buckets and whatever the dependence between the tests.
   With one bucket the bucket's series is the overall one: one decision, counted once.
5. A candidate is accepted for a decision if its Holm-adjusted p < alpha AND gain >= min_effect
   AND the CI's lower bound > 0. None accepted = keep defaults. Otherwise the winner is, among the
   accepted candidates whose gain reaches the CI lower bound of the largest gain, the one changing
   the fewest variables.

Rounds: with n rounds the smallest p value the exact one-sided test can give is 2**-n (every round
in the candidate's favour), and Holm's first step needs F * p < alpha, so no change at all is
possible unless n >= min_rounds(F, alpha), the smallest n with 2**-n < alpha / F. rounds_needed
adds ROUNDS_MARGIN = 2 rounds: then F * 3 * 2**-n < alpha too, i.e. a candidate still passes when
the round with the smallest or the second smallest |d - log(1 + min_effect)| goes the other way
(p = 2 or 3 * 2**-n).
E.g. alpha 0.01: F = 1 -> 7 + 2 = 9 rounds; 1 candidate and 5 buckets (F = 6) -> 10 + 2 = 12;
alpha 0.05 and F = 6 -> 7 + 2 = 9.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tuners.evaluation import Evaluator, SizeBucket, bucket_times_us, overall_time_us

OVERALL = "overall"
ROUNDS_MARGIN = 2  # rounds planned beyond the fewest that can give a change (module docstring)


@dataclass(frozen=True)
class Thresholds:
    alpha: float = 0.01  # family-wise error rate of one finalization (Holm over all its tests)
    min_effect: float = 0.03  # minimum median speed-up (3 %) worth a change
    confidence: float = 0.95  # two-sided bootstrap CI level; its lower bound must exceed 0
    rounds: int = 10  # raised automatically when too few rounds could reach alpha
    n_resamples: int = 9999


def decisions_tested(n_buckets: int) -> int:
    """Decisions with a test of their own: overall plus each bucket; a single bucket IS the overall."""
    return 1 if n_buckets <= 1 else 1 + n_buckets


def family_size(n_candidates: int, n_buckets: int) -> int:
    return n_candidates * decisions_tested(n_buckets)


def min_rounds(family: int, alpha: float) -> int:
    """Fewest rounds whose smallest attainable p value, 2**-n, passes Holm's first step (F * p < alpha)."""
    rounds = 1
    while max(family, 1) * 2.0**-rounds >= alpha:
        rounds += 1
    return rounds


def rounds_needed(family: int, alpha: float) -> int:
    """min_rounds plus ROUNDS_MARGIN (see the module docstring)."""
    return min_rounds(family, alpha) + ROUNDS_MARGIN


def planned_rounds(thresholds: Thresholds, n_candidates: int, n_buckets: int) -> int:
    """Rounds a finalization of `n_candidates` over `n_buckets` buckets runs: the configured count,
    raised to rounds_needed of its family."""
    return max(thresholds.rounds, rounds_needed(family_size(n_candidates, n_buckets), thresholds.alpha))


def describe_family(n_candidates: int, n_buckets: int) -> str:
    decisions = "overall" if n_buckets <= 1 else f"(overall + {n_buckets} size buckets)"
    return f"{n_candidates} candidate(s) x {decisions}"


def describe_test(thresholds: Thresholds, n_candidates: int, n_buckets: int) -> str:
    """What the decisions mean, with this finalization's family and round arithmetic."""
    family = family_size(n_candidates, n_buckets)
    return (
        "one-sided exact Wilcoxon signed-rank test on paired per-round log time ratios minus "
        f"log(1+{thresholds.min_effect:g}) (H0: median speed-up <= the minimum effect), baseline and candidates "
        "interleaved in shuffled order each round; Holm correction over all "
        f"{family} tests of the finalization ({describe_family(n_candidates, n_buckets)}), so that "
        f"P(any false change, global or per size) <= alpha={thresholds.alpha}; accepted if Holm-adjusted "
        f"p < alpha, median per-round speed-up >= {thresholds.min_effect:.0%} and the {thresholds.confidence:.0%} "
        f"percentile bootstrap CI's lower bound > 0; a change needs >= {min_rounds(family, thresholds.alpha)} "
        f"rounds (smallest p = 2**-n < alpha/{family}), {ROUNDS_MARGIN} more are planned as margin"
    )


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
    p_adjusted: float | None = None  # Holm over the whole family (FinalReport.family_size tests)
    ratios: tuple[float, ...] = ()  # per-round speed-ups, the evidence behind gain and CI

    @property
    def tested(self) -> bool:
        return self.p_adjusted is not None


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

    @property
    def closest(self) -> Comparison | None:
        """The tested candidate nearest to acceptance (smallest adjusted p, then largest gain): the
        evidence behind a keep-defaults verdict."""
        tested = [c for c in self.comparisons if c.tested]
        return min(tested, key=lambda c: (c.p_adjusted, -(c.gain or 0.0)), default=None)


@dataclass(frozen=True)
class FinalReport:
    baseline_env: Mapping[str, str]
    overall: Decision
    buckets: Mapping[str, Decision]
    thresholds: Thresholds
    rounds_run: int
    rounds_used: int
    family_size: int  # tests Holm-corrected together: candidates tested x decisions tested
    family: str  # what they are, in words
    test: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return (self.overall, *self.buckets.values())


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p values (same order as given)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class _Measured:
    log_ratios: np.ndarray
    p_value: float
    gain: float
    ci_low: float
    ci_high: float


def _paired_statistics(log_ratios: np.ndarray, thresholds: Thresholds, rng: np.random.Generator) -> _Measured:
    """Statistics of per-round log ratios (positive = candidate faster); p tests H0: median speed-up
    <= min_effect."""
    ratios = np.exp(log_ratios)
    gain = float(np.median(ratios) - 1)
    from scipy import stats  # 0.7-1.7 s to import: every commcamp command would pay it at start

    above_margin = log_ratios - np.log1p(thresholds.min_effect)
    if np.all(above_margin == 0):
        return _Measured(log_ratios, 1.0, gain, gain, gain)
    p_value = float(stats.wilcoxon(above_margin, alternative="greater").pvalue)
    if np.ptp(ratios) == 0:
        return _Measured(log_ratios, p_value, gain, gain, gain)
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
    return _Measured(log_ratios, p_value, gain, float(interval.low - 1), float(interval.high - 1))


def _judge(
    name: str,
    baseline_env: Mapping[str, str],
    candidates: Sequence[Candidate],
    rejected: Mapping[int, str],
    measured: Mapping[int, _Measured],
    adjusted: Mapping[int, float],
    thresholds: Thresholds,
) -> Decision:
    comparisons: dict[int, Comparison] = {
        i: Comparison(candidates[i], name, False, reason) for i, reason in rejected.items()
    }
    for i, m in measured.items():
        failed = []
        if adjusted[i] >= thresholds.alpha:
            failed.append(
                f"not significantly above the minimum effect (Holm p={adjusted[i]:.3g} >= {thresholds.alpha})"
            )
        if m.gain < thresholds.min_effect:
            failed.append(f"gain {m.gain:+.1%} below the minimum effect {thresholds.min_effect:.0%}")
        if m.ci_low <= 0:
            failed.append(f"CI lower bound {m.ci_low:+.1%} <= 0")
        comparisons[i] = Comparison(
            candidates[i],
            name,
            not failed,
            "; ".join(failed) or "significant and above the minimum effect",
            len(m.log_ratios),
            m.gain,
            m.ci_low,
            m.ci_high,
            m.p_value,
            adjusted[i],
            tuple(float(r) for r in np.exp(m.log_ratios)),
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


def decide_paired(
    baseline_env: Mapping[str, str],
    candidates: Mapping[str, Sequence[Candidate]],
    log_ratios: Mapping[str, Mapping[int, np.ndarray]],
    rejected: Mapping[str, Mapping[int, str]],
    thresholds: Thresholds,
    rng: np.random.Generator,
) -> tuple[dict[str, Decision], int]:
    """One decision per name from paired per-round log ratios log(t_baseline / t_candidate) of the
    candidates `log_ratios[name]` holds (positive = candidate faster); candidates[name][i] not in it
    must be in rejected[name]. Every test of every decision shares one Holm correction; returns the
    decisions and the family size."""
    measured = {
        (name, i): _paired_statistics(series, thresholds, rng)
        for name, by_candidate in log_ratios.items()
        for i, series in by_candidate.items()
    }
    keys = list(measured)
    adjusted = dict(zip(keys, holm([measured[k].p_value for k in keys]), strict=True))
    judged = {
        name: _judge(
            name,
            baseline_env,
            candidates[name],
            rejected[name],
            {i: measured[name, i] for i in log_ratios[name]},
            {i: adjusted[name, i] for i in log_ratios[name]},
            thresholds,
        )
        for name in log_ratios
    }
    return judged, len(keys)


RoundTimes = Mapping[int, Mapping[str, float]]  # per setting (-1 = baseline, i = candidates[i]): bucket -> time


def decide(
    baseline_env: Mapping[str, str],
    candidates: Sequence[Candidate],
    buckets: Sequence[SizeBucket],
    rounds_data: Sequence[RoundTimes],
    rejected: Mapping[int, str],
    thresholds: Thresholds,
    rng: np.random.Generator,
) -> tuple[Decision, dict[str, Decision], int]:
    """The decisions from measured rounds (each holding the baseline and every candidate not in
    `rejected`): (overall, per bucket, family size). All tests share one Holm correction."""
    tested = [i for i in range(len(candidates)) if i not in rejected]
    names = [OVERALL] + ([b.name for b in buckets] if decisions_tested(len(buckets)) > 1 else [])

    def series(index: int, decision: str) -> np.ndarray:
        if decision == OVERALL:
            return np.asarray([overall_time_us(measured[index]) for measured in rounds_data])
        return np.asarray([measured[index][decision] for measured in rounds_data])

    log_ratios = {name: {i: np.log(series(-1, name)) - np.log(series(i, name)) for i in tested} for name in names}
    judged, family = decide_paired(baseline_env, {name: candidates for name in names}, log_ratios,
                                   {name: rejected for name in names}, thresholds, rng)
    overall = judged[OVERALL]
    if len(names) == 1:  # one bucket: its decision is the overall one under the bucket's name
        judged = {
            b.name: Decision(
                b.name,
                overall.env,
                None if overall.winner is None else replace(overall.winner, decision=b.name),
                tuple(replace(c, decision=b.name) for c in overall.comparisons),
            )
            for b in buckets
        }
    return overall, {b.name: judged[b.name] for b in buckets}, family


def finalize(
    evaluator: Evaluator,
    baseline_env: Mapping[str, str],
    candidates: Sequence[Candidate],
    buckets: Sequence[SizeBucket],
    *,
    thresholds: Thresholds = Thresholds(),
    needs_validation: Callable[[Mapping[str, str], Mapping[str, str]], Sequence[str]] = lambda baseline, env: (),
    seed: int = 0,
) -> FinalReport:
    """Re-measures baseline and candidates interleaved and returns the decisions. `needs_validation`
    (baseline env, candidate env) names the unsafe knobs a candidate changes (SearchSpace.unsafe_changes)."""
    rng = np.random.default_rng(seed)
    notes: list[str] = []
    rejected: dict[int, str] = {}
    for i, candidate in enumerate(candidates):
        risky = needs_validation(baseline_env, candidate.env)
        if not risky:
            continue
        check = evaluator(candidate.env, validate=True)
        what = f"validated re-run ({', '.join(risky)}: may-hang/may-corrupt, changed from the baseline)"
        unchecked = [b.name for b in buckets if check.ok and not any(b.contains(s) for s in check.times_us)]
        if not check.ok:
            rejected[i] = f"{what} failed: {check.failure}: {check.reason}"
        elif not check.validated:
            rejected[i] = f"{what} did not validate the data"
        elif unchecked:
            rejected[i] = f"{what} measured no size of bucket(s) {', '.join(unchecked)}"
    remaining = len(candidates) - len(rejected)
    planned_family = family_size(remaining, len(buckets))
    rounds = planned_rounds(thresholds, remaining, len(buckets))
    if rounds > thresholds.rounds:
        notes.append(
            f"rounds raised from {thresholds.rounds} to {rounds}: Holm over {planned_family} tests "
            f"({describe_family(remaining, len(buckets))}) needs 2**-n < alpha/{planned_family} "
            f"(n >= {min_rounds(planned_family, thresholds.alpha)}), plus {ROUNDS_MARGIN} rounds of margin"
        )
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
    required = min_rounds(planned_family, thresholds.alpha)
    if len(rounds_data) < required and len(rejected) < len(candidates):
        notes.append(f"only {len(rounds_data)} rounds had a working baseline (need {required}): keep defaults")
        for i in range(len(candidates)):
            rejected.setdefault(i, "too few rounds with a working baseline")
    overall, per_bucket, family = decide(baseline_env, candidates, buckets, rounds_data, rejected, thresholds, rng)
    tested = len(candidates) - len(rejected)
    return FinalReport(
        baseline_env=dict(baseline_env),
        overall=overall,
        buckets=per_bucket,
        thresholds=thresholds,
        rounds_run=rounds,
        rounds_used=len(rounds_data),
        family_size=family,
        family=describe_family(tested, len(buckets)),
        test=describe_test(thresholds, tested, len(buckets)),
        notes=tuple(notes),
    )
