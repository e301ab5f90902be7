"""Finalization: decide, from fresh interleaved measurements, whether any candidate beats the baseline.

Procedure (`FinalReport.test` says it in every output, with this finalization's numbers):
1. Candidates whose environment sets, removes or alters a may-hang or may-corrupt knob relative to
   the baseline (dropping a site default included: `needs_validation(baseline, env)`, i.e.
   SearchSpace.unsafe_changes) get one run with data validation on; a run that fails, does not
   validate, or lacks any requested size (SizeBucket.sizes; a bucket given as a range only: any size
   of it) rejects the candidate. Every set deployed with such a change has had a run of its own that
   passed this check (5).
2. Group-sequential rounds: in each round the baseline and every candidate with an open test run
   once, in a freshly shuffled order (interleaving, so drift hits all settings alike). A candidate that
   fails in any round is rejected; a round whose baseline failed is dropped. A run that lacks a
   requested size (or a whole bucket) is a failed run of its setting, in every phase. The phase looks
   at the data after every `look_every` rounds and stops at `rounds` (the maximum) or when every
   decision is settled.
3. The tests: per candidate and per decision (overall, and each size bucket), paired per-round log
   ratios d = log(t_baseline / t_candidate); gain = median over rounds of exp(d) - 1 (speed-up), with
   an order-statistic CI of the median (`median_ci`: distribution-free); one-sided Wilcoxon signed-rank test of d - log(1 + min_effect)
   (superiority by a margin; exact up to 50 rounds without ties). Its H0 is that d is symmetric about
   log(1 + min_effect): it tests the pseudo-median (Hodges-Lehmann) speed-up, which is the median when
   the per-round ratios are symmetric. A skewed candidate, e.g. one a little faster in most runs and
   much slower in a few, can pass with its median at the margin: the total-time check below sees it.
4. Alpha spending and multiplicity together: the family is every test of the finalization, F =
   candidates x decisions (one bucket: one decision). At look k, Holm's step-down runs over the open
   tests in order of p: with m = F - (tests accepted so far), a test passes when its p is below the
   Lan-DeMets O'Brien-Fleming nominal level of look k for a one-sided test at alpha / m
   (`nominal_levels`), and m drops by one for the next. This is the graphical group-sequential Holm
   procedure (Maurer & Bretz 2013): each hypothesis is tested by a group-sequential test at its current
   Holm level, and a rejection passes its level on; P(any false change) <= alpha, whatever the number
   of buckets and the dependence between tests (the levels come from the normal approximation of the
   signed-rank statistic: `python -m tuners.bench_finalize` measures the error rates). Those levels are
   Brownian motion's; the exact signed-rank p values, re-ranked at each look, cross them a little more often
   than designed (null simulations of the default design, 40 rounds, a look every 5: +1.6 % at alpha/1,
   +2.4 % at alpha/12, relative), so with two or more looks they are computed at EXACT_TEST_SPENDING =
   0.95 x alpha / m (`look_levels`): 0.94-0.95 x alpha / m then; one look (a fixed budget) keeps alpha / m,
   the exact test's own level.
   Futility (non-binding, so it cannot raise the error rate): before the last look a test stops when
   its gain is below the minimum effect at the one-sided level `futility` (Wilcoxon, "less").
   A decision closes when a candidate is accepted for it (accepted: p below its level, gain >=
   min_effect and the CI's lower bound > 0; the winner is, among its accepted candidates whose gain
   reaches the CI lower bound of the largest, the one changing the fewest variables) or when all its
   tests stopped. `Comparison.p_adjusted` = p x alpha / (the level it was compared with), raised to
   the largest of the tests accepted before it at that look (Holm's running maximum; with one look it is
   Holm's adjusted p), < alpha iff it passed.
   An overall winner must not be slower than the baseline in any size bucket: one whose bucket speed-up
   has a CI wholly below 0 (same rounds) is refused with the bucket named, and the next
   accepted candidate, if any, wins (refusing a change cannot raise the false-change rate). Nor may any
   winner take longer than the baseline summed over the rounds (a candidate that stalls now and then:
   the test and the median do not see it, a job does).
5. Ablation: a winner that changes two or more knobs runs `ablation_rounds` more rounds beside the winner
   without each of its knobs (the baseline's value, or unset; a knob goes with the companions it `requires` that
   no other knob of the winner requires, which are no decision of their own: Open MPI's use_dynamic_rules beside
   a forced algorithm); a knob whose removal does not slow the
   decision's time significantly (one-sided Wilcoxon at `ablation_alpha`) is dropped: what is deployed is the
   smallest set that keeps the gain. The overall winner keeps also a knob without which a size bucket is
   slower than the winner (its CI wholly below 0, as in 4): that no bucket is slower than the baseline was
   shown for the winner, not for a set without the knob. Two checks keep that set one that was measured: when
   no single removal loses, the knobs may stand in for each other (each alone as good as both), so the winner
   is deployed whole; when two or more knobs would go, the reduced set runs `ablation_rounds` more rounds
   beside the winner and is deployed only if it does not lose there either, nor (overall) in any bucket (else
   the winner, whole). A reduced set that still makes an unsafe change (1) gets a validated run of its own:
   the winner's covered another combination of knobs (NCCL_PROTO=Simple was validated with a larger
   NCCL_BUFFSIZE, not alone). It is deployed only if that run passes; else the winner, validated, is deployed
   whole. A reduced set that is a candidate this finalization refused (it failed its validated run or a
   round, or, overall, was slower in a bucket or in total) is not deployed either: the winner whole. A winner
   that fails in an ablation or confirmation round is withdrawn (keep defaults), as in 2 and 6, also where the
   deadline cut those rounds short. The family's guarantee is the tested winner's; ablation is a screening
   rule beside it, and the held-out rounds measure what it deploys.
6. Held-out rounds: `holdout_rounds` more rounds of the baseline and every deployed set, after the
   choice: the gain each decision reports (`Decision.holdout`), from rounds not used to choose it. A
   deployed set that fails in them is withdrawn.
7. A deadline (pretune's time budget): no round starts after it. Open tests whose next look it cuts off
   end undecided (keep defaults for them: stopping a test without rejecting its H0 cannot raise the
   false-change rate); looks already made stand. Ablation cut off deploys each winner whole; held-out
   rounds cut off report the gain from the rounds they ran (none: from the rounds that chose the winner,
   said in a note). Validated runs (1, 5) are never skipped.
After the per-size stage (tuners/per_size.py), `check_deployed` measures what is deployed, the environment
with its per-size rules, against the baseline the same way: one validated run, then `holdout_rounds` rounds
(6); refused (the rules withdrawn) when it fails, gives wrong data or is slower in a bucket as in 4. The
environment alone runs in the same rounds: refused alike too, it is withdrawn with the rules (keep defaults).

Rounds: with n rounds the smallest p value the exact one-sided test can give is 2**-n (every round
in the candidate's favour), and Holm's first step needs F * p < alpha, so no change at all is
possible unless n >= min_rounds(F, alpha), the smallest n with 2**-n < alpha / F; the maximum
`rounds` is raised to rounds_needed = that + ROUNDS_MARGIN = 2 rounds: then F * 3 * 2**-n < alpha
too, and looks before min_rounds are skipped. E.g. alpha 0.01: F = 1 -> 7 + 2 = 9 rounds; 1
candidate and 5 buckets (F = 6) -> 10 + 2 = 12; alpha 0.05 and F = 6 -> 7 + 2 = 9.
Power and expected rounds of the defaults: `python -m tuners.bench_finalize` (README).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from tuners.evaluation import (
    Evaluation,
    Evaluator,
    FailureKind,
    MissingSizes,
    SizeBucket,
    bucket_times_us,
    overall_time_us,
)

OVERALL = "overall"
ROUNDS_MARGIN = 2  # rounds planned beyond the fewest that can give a change (module docstring)
EXACT_TEST_SPENDING = 0.95  # group-sequential levels at this share of alpha / m: the exact signed-rank p values
# cross Brownian motion's levels up to 2.4 % more often than designed (module docstring, 4; look_levels)


@dataclass(frozen=True)
class Thresholds:
    alpha: float = 0.01  # family-wise error rate of one finalization (Holm over all its tests)
    min_effect: float = 0.03  # minimum median speed-up (3 %) worth a change
    confidence: float = 0.95  # two-sided CI level of the median speed-up; its lower bound must exceed 0
    rounds: int = 40  # maximum rounds of the sequential phase; raised when too few could reach alpha
    look_every: int = 5  # rounds between looks (alpha spent by O'Brien-Fleming); >= rounds: fixed budget
    futility: float = 0.5  # before the last look, a test whose gain is below the minimum effect at this
    # one-sided level stops (0.5: its signed-rank statistic lies below the null mean)
    ablation_rounds: int = 8  # rounds measuring a multi-knob winner without each of its knobs
    ablation_alpha: float = 0.05  # a knob is kept when removing it loses at this one-sided level
    holdout_rounds: int = 6  # rounds, after the choice, that measure the deployed set's gain
    never_slower: bool = True  # refuse a global winner slower than the baseline in any bucket (step 3);
    # off only where per-size rules deployed with the environment restore those sizes
    total_time_check: bool = True  # refuse a winner slower than the baseline summed over the rounds; off only
    # to measure what it buys (bench_finalize --no-total-time-check)


def decisions_tested(n_buckets: int) -> int:
    """Decisions with a test of their own: overall plus each bucket; a single bucket IS the overall."""
    return 1 if n_buckets <= 1 else 1 + n_buckets


def family_size(n_candidates: int, n_buckets: int) -> int:
    return n_candidates * decisions_tested(n_buckets)


@lru_cache(maxsize=512)
def nominal_levels(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """Group-sequential one-sided nominal p levels, one per look at information fractions `fractions`
    (rounds so far / maximum rounds, increasing, the last 1), from the Lan-DeMets O'Brien-Fleming
    spending function a(t) = 2 - 2 Phi(z_{alpha/2} / sqrt(t)) (a(1) = alpha): look k rejects when the
    standardized statistic Z_k >= c_k, with P(Z_j < c_j for j < k, Z_k >= c_k) = a(t_k) - a(t_{k-1})
    under H0, Z being Brownian motion in the information (Z_k ~ N(0, 1), corr(Z_j, Z_k) =
    sqrt(t_j / t_k)); the level of look k is 1 - Phi(c_k). The crossing probabilities are integrated
    numerically on a grid (no Monte Carlo error). One look = the fixed design: (alpha,)."""
    from scipy import optimize, special, stats

    grid = np.linspace(-10.0, 10.0, 801)  # the Brownian motion S(t) = Z sqrt(t), sd <= 1
    weight = np.full(grid.size, grid[1] - grid[0])
    weight[[0, -1]] /= 2
    spent = [2 - 2 * stats.norm.cdf(stats.norm.isf(alpha / 2) / np.sqrt(t)) for t in fractions]
    density = None  # sub-density of S at the previous look on the paths not yet stopped
    previous_t = 0.0
    levels = []
    for k, t in enumerate(fractions):
        step = np.sqrt(t - previous_t)
        increment = spent[k] - (spent[k - 1] if k else 0.0)

        def crossing(bound: float, step: float = step) -> float:
            if density is None:
                return float(special.ndtr(-bound / step))
            return float(np.sum(weight * density * special.ndtr((grid - bound) / step)))

        if increment <= 1e-15:
            bound = np.inf
        else:
            bound = optimize.brentq(lambda b: crossing(b) - increment, -20.0, 20.0, xtol=1e-10)
        levels.append(float(stats.norm.sf(bound / np.sqrt(t))))
        kept = grid < bound
        if density is None:
            density = stats.norm.pdf(grid / step) / step * kept
        else:
            kernel = np.exp(-0.5 * ((grid[:, None] - grid[None, :]) / step) ** 2) / (step * np.sqrt(2 * np.pi))
            density = (kernel @ (weight * density)) * kept
        previous_t = t
    return tuple(levels)


def look_levels(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """The nominal p levels a test at `alpha` is compared with at looks `fractions`: nominal_levels at
    EXACT_TEST_SPENDING x alpha when there are two or more looks. The levels are Brownian motion's; the exact
    signed-rank statistic, re-ranked at each look, is less correlated across looks and lighter-tailed than
    that, and crossed them more often than designed in null simulations (default design, 40 rounds, a look
    every 5: 1.016 x alpha at alpha 0.01, 1.024 x alpha at 0.01 / 12, importance-sampled, sd 0.4 %; with
    0.95 x alpha: 0.946 and 0.940 x alpha). One look is the exact test at alpha itself."""
    return nominal_levels(fractions, alpha if len(fractions) <= 1 else EXACT_TEST_SPENDING * alpha)


def look_rounds(thresholds: Thresholds, max_rounds: int) -> tuple[int, ...]:
    """Usable rounds after which the sequential phase looks: every `look_every`, and at `max_rounds`."""
    step = max(1, thresholds.look_every)
    return tuple(sorted({*range(step, max_rounds, step), max_rounds}))


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


def planned_runs(thresholds: Thresholds, n_candidates: int, n_buckets: int, n_knobs: int) -> int:
    """The most runs a finalization of `n_candidates` candidates over `n_buckets` buckets can take, each
    candidate changing at most `n_knobs` knobs from the baseline: what budgets size it with (fit_budget, the
    plan `commcamp tune` prints). Every phase (module docstring) at its worst, with D = decisions_tested
    decisions and at most W = min(D, n_candidates) distinct winners (one per decision that changes):
    - validated runs: one per candidate (1) and one per distinct reduced set deployed (5): a decision deploys
      one set, a winner less a non-empty proper subset of its knobs: at most min(D, W x (2**n_knobs - 2));
    - the sequential rounds: planned_rounds, each of the baseline and every candidate (2);
    - ablation (5, where a winner can change two or more knobs and ablation_rounds > 0): ablation_rounds of
      every winner and of it without each of its knobs: W x (1 + n_knobs) settings;
    - confirmation (where a winner can change three or more knobs, so that ablation can drop two and keep
      one): ablation_rounds of every winner and every decision's reduced set, W + min(D, W x (2**n_knobs -
      n_knobs - 2)) settings. The decisions of one winner can each keep other knobs (the overall decision,
      guarded by every bucket, keeps more than a bucket where one knob acts): up to D reduced sets, not one;
    - held-out rounds: holdout_rounds of the baseline and every distinct deployed set, one per decision that
      changes: at most W without ablation (the winners), min(D, W x (2**n_knobs - 1)) with it (a winner less
      any proper subset of its knobs). The overall and per-bucket decisions can deploy D distinct sets, more
      than the n_candidates + 1 settings of a round."""
    decisions = decisions_tested(n_buckets)
    winners = min(decisions, n_candidates)
    ablates = n_knobs >= 2 and thresholds.ablation_rounds > 0
    rounds = planned_rounds(thresholds, n_candidates, n_buckets) * (n_candidates + 1)
    reduced = min(decisions, winners * (2**n_knobs - 2)) if ablates else 0
    ablation = thresholds.ablation_rounds * winners * (1 + n_knobs) if ablates else 0
    confirmed = winners + min(decisions, winners * (2**n_knobs - n_knobs - 2)) if ablates and n_knobs >= 3 else 0
    deployed = min(decisions, winners * (2**n_knobs - 1)) if ablates else winners
    return (n_candidates + reduced + rounds + ablation + thresholds.ablation_rounds * confirmed
            + thresholds.holdout_rounds * (1 + deployed))


def fit_budget(thresholds: Thresholds, found: int, n_buckets: int, n_knobs: int,
               max_evaluations: int | None) -> tuple[int, Thresholds]:
    """How many of the `found` candidates finalization re-measures within `max_evaluations` runs, and with
    which thresholds: fewer candidates first; when not even one fits, one with a lower sequential maximum,
    down to the fewest rounds that can give a change (rounds_needed), since the group-sequential rule holds
    alpha at any maximum. (0, thresholds) when nothing fits: a decision would be untested."""
    if max_evaluations is None:
        return found, thresholds
    for keep in range(found, 0, -1):
        if planned_runs(thresholds, keep, n_buckets, n_knobs) <= max_evaluations:
            return keep, thresholds
    floor = rounds_needed(family_size(1, n_buckets), thresholds.alpha)
    for rounds in range(thresholds.rounds - 1, floor - 1, -1) if found else ():
        lowered = replace(thresholds, rounds=rounds)
        if planned_runs(lowered, 1, n_buckets, n_knobs) <= max_evaluations:
            return 1, lowered
    return 0, thresholds


def describe_family(n_candidates: int, n_buckets: int) -> str:
    decisions = "overall" if n_buckets <= 1 else f"(overall + {n_buckets} size buckets)"
    return f"{n_candidates} candidate(s) x {decisions}"


def describe_test(thresholds: Thresholds, n_candidates: int, n_buckets: int) -> str:
    """What the decisions mean, with this finalization's family and round arithmetic."""
    family = family_size(n_candidates, n_buckets)
    return (
        "one-sided Wilcoxon signed-rank test on paired per-round log time ratios minus "
        f"log(1+{thresholds.min_effect:g}) (H0: symmetric about it, i.e. pseudo-median speed-up <= the minimum "
        "effect), baseline and candidates "
        f"interleaved in shuffled order each round; group-sequential: a look every {thresholds.look_every} rounds, "
        f"at most {planned_rounds(thresholds, n_candidates, n_buckets)} rounds, O'Brien-Fleming alpha spending "
        f"inside a Holm step-down over all {family} tests of the finalization "
        f"({describe_family(n_candidates, n_buckets)}), so that P(any false change of the environment, overall "
        "or in a size bucket) <= "
        f"alpha={thresholds.alpha}; a test stops as futile when its gain is below the minimum effect at one-sided "
        f"p < {thresholds.futility}; accepted if Holm-adjusted p < alpha, median per-round speed-up >= "
        f"{thresholds.min_effect:.0%} and the {thresholds.confidence:.0%} order-statistic CI's lower bound "
        f"> 0; a change needs >= {min_rounds(family, thresholds.alpha)} rounds (smallest p = 2**-n < "
        f"alpha/{family}); a multi-knob winner loses the knobs whose removal does not slow it at one-sided "
        f"p < {thresholds.ablation_alpha} ({thresholds.ablation_rounds} rounds); the reported gain comes from "
        f"{thresholds.holdout_rounds} held-out rounds after the choice"
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
class Ablation:
    """One knob of a multi-knob winner, measured without it (the baseline's value or unset)."""

    knob: str
    loss: float | None  # median per-round slow-down without the knob (+0.05 = 5 % slower)
    p_value: float | None  # one-sided Wilcoxon, H0: no slow-down without it
    kept: bool
    reason: str


@dataclass(frozen=True)
class Holdout:
    """The deployed set vs the baseline on rounds run after it was chosen (not used to choose it)."""

    gain: float  # median per-round speed-up
    ci_low: float
    ci_high: float
    rounds: int
    ratios: tuple[float, ...]
    coverage: float | None = None  # the interval's (median_ci_coverage)


@dataclass(frozen=True)
class Decision:
    name: str
    env: Mapping[str, str]  # what is deployed: the winner less the knobs ablation dropped, or the baseline
    winner: Comparison | None
    comparisons: tuple[Comparison, ...]
    ablation: tuple[Ablation, ...] = ()  # the winner's knobs, when it changed two or more
    holdout: Holdout | None = None  # the deployed set's gain on held-out rounds

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
    rounds_run: int  # rounds of the sequential phase run (it may stop before max_rounds)
    rounds_used: int  # of those, rounds whose baseline worked
    family_size: int  # tests Holm-corrected together: candidates tested x decisions tested
    family: str  # what they are, in words
    test: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    max_rounds: int = 0  # the sequential phase's maximum
    looks: tuple[int, ...] = ()  # rounds after which it looked
    evaluations: int = 0  # evaluator calls of the whole finalization (validation, rounds, ablation, held-out)
    allocations: tuple[str, ...] = ()  # the batch allocations (Slurm job ids) its runs ran in, where known
    cut_off: bool = False  # the deadline came before the first look: no test was made, nothing was decided

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


@lru_cache(maxsize=128)
def _signed_rank_null(n: int) -> np.ndarray:
    """P(W+ <= w), w = 0 .. n(n+1)/2, of the signed-rank statistic of n untied non-zero values under H0
    (each sign + or - with probability 1/2, independently): the exact distribution."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    return np.cumsum(counts) / 2.0**n


def _tied_signed_rank_p(ranks: np.ndarray, w: float) -> tuple[float, float]:
    """Exact P(W >= w), P(W <= w) of the signed-rank sum over midranks, each sign equally likely under H0: the
    counts of every sum of a subset of the ranks, doubled to integers (a midrank is a whole or half number)."""
    doubled = np.rint(2 * ranks).astype(int)
    counts = np.zeros(int(doubled.sum()) + 1)
    counts[0] = 1.0
    for rank in doubled:
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    observed, total = int(round(2 * w)), counts.sum()
    return float(counts[observed:].sum() / total), float(counts[:observed + 1].sum() / total)


def signed_rank_p(x: np.ndarray) -> tuple[float, float]:
    """One-sided Wilcoxon signed-rank p values (greater, less) of H0: x symmetric about 0 (zeros dropped;
    exact up to 50 values, with tied values too: every sign pattern of the midranks; beyond that the normal
    approximation with tie correction), ~100x faster than scipy.stats.wilcoxon (the sequential looks and
    bench_finalize call it thousands of times). The approximation with ties was anti-conservative for few
    rounds (8 equal values: 0.0023 for an exact 1/256), below the 2**-n that min_rounds counts on."""
    x = np.round(np.asarray(x, dtype=float), 12)  # log-ratio rounding (101 / (101 / 1.03) vs log1p(0.03): 3e-16)
    x = x[x != 0]  # is a zero and a tie, not a difference: no timer resolves 1e-12
    n = len(x)
    if n == 0:
        return 1.0, 1.0
    from scipy import stats  # 0.7-1.7 s to import: every commcamp command would pay it at start

    magnitudes = np.abs(x)
    untied = len(np.unique(magnitudes)) == n
    if untied:  # ranks without rankdata's overhead (a third of a finalization's time)
        ranks = np.empty(n)
        ranks[np.argsort(magnitudes)] = np.arange(1, n + 1)
    else:
        ranks = stats.rankdata(magnitudes)
    w = float(ranks[x > 0].sum())
    if n <= 50 and untied:
        cdf = _signed_rank_null(n)
        below = int(round(w))
        return float(1.0 - (cdf[below - 1] if below > 0 else 0.0)), float(cdf[below])
    if n <= 50:
        return _tied_signed_rank_p(ranks, w)
    mean = n * (n + 1) / 4
    _, ties = np.unique(ranks, return_counts=True)
    sd = np.sqrt(n * (n + 1) * (2 * n + 1) / 24 - float((ties**3 - ties).sum()) / 48)
    if sd == 0:
        return 1.0, 1.0
    return float(stats.norm.sf((w - mean) / sd)), float(stats.norm.cdf((w - mean) / sd))


def median_ci(ratios: np.ndarray, confidence: float) -> tuple[float, float]:
    """Distribution-free interval of the median from order statistics: [x(k), x(n+1-k)] with the largest
    k such that P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2, so its coverage is at least `confidence`
    for any continuous distribution (the percentile bootstrap it replaced covered 91.6-95.0 % at 95 %
    with 6-12 log-normal rounds). Too few values for that (at 95 %: n < 6) give [min, max], whose coverage is
    1 - 2**(1 - n)."""
    ordered = np.sort(np.asarray(ratios, dtype=float))
    n = len(ordered)
    k = _order_statistic(n, confidence)
    return float(ordered[k - 1]), float(ordered[n - k])


def _order_statistic(n: int, confidence: float) -> int:
    """median_ci's k for n values."""
    from scipy import stats  # a slow import: commands that never finalize do not pay it

    return max(1, int(np.sum(stats.binom.cdf(np.arange(n), n, 0.5) <= (1 - confidence) / 2)))


def median_ci_coverage(n: int, confidence: float) -> float:
    """The coverage median_ci's interval of n values has for any continuous distribution: 1 - 2 P(Binomial(n, 1/2)
    < k) (6 rounds at 95 %: [min, max], 96.9 %; 5 rounds: 93.8 %, below what was asked)."""
    from scipy import stats

    return float(1 - 2 * stats.binom.cdf(_order_statistic(n, confidence) - 1, n, 0.5))


def _paired_statistics(log_ratios: np.ndarray, thresholds: Thresholds, interval: bool = True) -> _Measured:
    """Statistics of per-round log ratios (positive = candidate faster); p tests H0: the log ratios are
    symmetric about log(1 + min_effect) (module docstring, 3). `interval=False` skips the interval
    (ci_low = ci_high = gain)."""
    ratios = np.exp(log_ratios)
    gain = float(np.median(ratios) - 1)
    above_margin = np.round(log_ratios - np.log1p(thresholds.min_effect), 12)  # as signed_rank_p rounds
    if np.all(above_margin == 0):
        return _Measured(log_ratios, 1.0, gain, gain, gain)
    p_value = signed_rank_p(above_margin)[0]
    if not interval:
        return _Measured(log_ratios, p_value, gain, gain, gain)
    low, high = median_ci(ratios, thresholds.confidence)
    return _Measured(log_ratios, p_value, gain, low - 1, high - 1)


def _comparison(candidate: Candidate, name: str, m: _Measured, p_adjusted: float, thresholds: Thresholds,
                stopped: str = "") -> Comparison:
    """The comparison of one test: accepted iff p_adjusted < alpha, gain >= min_effect, CI low > 0."""
    failed = [stopped] if stopped else []
    if p_adjusted >= thresholds.alpha:
        failed.append(f"not significantly above the minimum effect (Holm p={p_adjusted:.3g} >= {thresholds.alpha})")
    if m.gain < thresholds.min_effect:
        failed.append(f"gain {m.gain:+.1%} below the minimum effect {thresholds.min_effect:.0%}")
    if m.ci_low <= 0:
        failed.append(f"CI lower bound {m.ci_low:+.1%} <= 0")
    return Comparison(
        candidate,
        name,
        not failed,
        "; ".join(failed) or "significant and above the minimum effect",
        len(m.log_ratios),
        m.gain,
        m.ci_low,
        m.ci_high,
        m.p_value,
        p_adjusted,
        tuple(float(r) for r in np.exp(m.log_ratios)),
    )


def _choose(name: str, baseline_env: Mapping[str, str], ordered: tuple[Comparison, ...]) -> Decision:
    """The decision from its comparisons: among the accepted candidates whose gain reaches the CI
    lower bound of the largest gain, the one changing the fewest variables; none = the baseline."""
    accepted = [c for c in ordered if c.accepted]
    best = max(accepted, key=lambda c: c.gain or 0.0, default=None)
    if best is None:
        return Decision(name, dict(baseline_env), None, ordered)
    # Fewer changed variables is a better recommendation when the gain is statistically the same.
    assert best.ci_low is not None
    contenders = [c for c in accepted if (c.gain or 0.0) >= best.ci_low]
    winner = min(contenders, key=lambda c: (changed_knobs(baseline_env, c.candidate.env), -(c.gain or 0.0)))
    return Decision(name, dict(winner.candidate.env), winner, ordered)


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
        comparisons[i] = _comparison(candidates[i], name, m, adjusted[i], thresholds)
    return _choose(name, baseline_env, tuple(comparisons[i] for i in range(len(candidates))))


def changed_knobs(baseline_env: Mapping[str, str], env: Mapping[str, str]) -> int:
    return sum(1 for name in set(baseline_env) | set(env) if baseline_env.get(name) != env.get(name))


def decide_paired(
    baseline_env: Mapping[str, str],
    candidates: Mapping[str, Sequence[Candidate]],
    log_ratios: Mapping[str, Mapping[int, np.ndarray]],
    rejected: Mapping[str, Mapping[int, str]],
    thresholds: Thresholds,
) -> tuple[dict[str, Decision], int]:
    """One decision per name from paired per-round log ratios log(t_baseline / t_candidate) of the
    candidates `log_ratios[name]` holds (positive = candidate faster); candidates[name][i] not in it
    must be in rejected[name]. Every test of every decision shares one Holm correction; returns the
    decisions and the family size."""
    measured = {
        (name, i): _paired_statistics(series, thresholds)
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


Measured = dict[int, dict[str, float]]  # one round: per setting key, bucket -> time (us)


def _run_round(
    evaluator: Evaluator,
    envs: Mapping[int, Mapping[str, str]],
    buckets: Sequence[SizeBucket],
    rng: np.random.Generator,
) -> tuple[Measured, dict[int, str]]:
    """One run of every setting in `envs`, in a freshly shuffled order: (bucket times of those that
    worked, failure of those that did not)."""
    measured: Measured = {}
    failures: dict[int, str] = {}
    for key in rng.permutation(list(envs)):
        evaluation = evaluator(envs[int(key)], validate=False)
        if evaluation.ok:
            try:
                measured[int(key)] = bucket_times_us(evaluation.median_us(), buckets)
                continue
            except MissingSizes as exc:  # scored on fewer sizes it would compare unlike: a failed run
                evaluation = Evaluation.failed(FailureKind.INVALID, str(exc))
        failures[int(key)] = f"{evaluation.failure}: {evaluation.reason}"
    return measured, failures


def _series(rounds: Sequence[Measured], key: int, decision: str) -> np.ndarray:
    if decision == OVERALL:
        return np.asarray([overall_time_us(r[key]) for r in rounds])
    return np.asarray([r[key][decision] for r in rounds])


def _log_ratios(rounds: Sequence[Measured], slower: int, faster: int, decision: str) -> np.ndarray:
    """Per round log(t_slower / t_faster) over the rounds that measured both (positive: `faster` is)."""
    both = [r for r in rounds if slower in r and faster in r]
    return np.log(_series(both, slower, decision)) - np.log(_series(both, faster, decision))


@dataclass
class _Sequential:
    """The group-sequential phase's state (see finalize)."""

    names: list[str]
    tested: list[int]
    thresholds: Thresholds
    looks: tuple[int, ...]
    max_rounds: int
    open_tests: set[tuple[str, int]] = field(default_factory=set)
    done: dict[tuple[str, int], Comparison] = field(default_factory=dict)
    open_decisions: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.open_tests = {(name, i) for name in self.names for i in self.tested}
        self.open_decisions = set(self.names)
        self.family = len(self.open_tests)
        self._close_decisions_without_tests()  # no candidate to test: no round runs

    @property
    def measuring(self) -> set[int]:
        return {i for name, i in self.open_tests}

    def reject(self, i: int) -> None:
        """Candidate i failed: its open tests leave the family's open set (never accepted)."""
        self.open_tests = {(name, j) for name, j in self.open_tests if j != i}
        self._close_decisions_without_tests()

    def _close_decisions_without_tests(self) -> None:
        self.open_decisions = {name for name, _ in self.open_tests} & self.open_decisions

    def look(self, k: int, rounds: Sequence[Measured], candidates: Sequence[Candidate]) -> None:
        """Look k: Holm step-down over the open tests at the O'Brien-Fleming levels of alpha / m
        (look_levels; m = tests not yet accepted), then futility, then decisions with an accepted test close."""
        t = self.thresholds
        final = k == len(self.looks) - 1
        fractions = tuple(n / self.max_rounds for n in self.looks)
        measured = {key: _paired_statistics(_log_ratios(rounds, -1, key[1], key[0]), t, interval=False)
                    for key in self.open_tests}
        accepted_count = sum(c.accepted for c in self.done.values())
        remaining = self.family - accepted_count
        # Holm's adjusted p: p x alpha / level, never below that of a test before it in the step-down (as
        # Holm's running maximum); ties in p broken by the test's name, so a seed gives one result.
        floor = 0.0
        for key in sorted(self.open_tests, key=lambda key: (measured[key].p_value, key)):
            level = look_levels(fractions, t.alpha / remaining)[k]
            if measured[key].p_value >= level:
                break
            full = _paired_statistics(measured[key].log_ratios, t)
            if full.gain >= t.min_effect and full.ci_low > 0:
                floor = max(floor, full.p_value * t.alpha / level)
                self.done[key] = _comparison(candidates[key[1]], key[0], full, floor, t)
                self.open_tests.discard(key)
                remaining -= 1
        closing = {name for name, _ in self.done if name in self.open_decisions
                   and any(c.accepted for (n, _), c in self.done.items() if n == name)}
        for key in sorted(self.open_tests):
            name, i = key
            less = signed_rank_p(measured[key].log_ratios - np.log1p(t.min_effect))[1]
            futile = not final and less < t.futility
            if not (final or futile or name in closing):
                continue
            level = look_levels(fractions, t.alpha / remaining)[k]
            adjusted = max(floor, min(1.0, measured[key].p_value * t.alpha / level) if level > 0 else 1.0)
            stopped = (f"stopped at round {len(rounds)}: gain below the minimum effect (one-sided p={less:.3g} "
                       f"< {t.futility})") if futile else ""
            full = _paired_statistics(measured[key].log_ratios, t)
            self.done[key] = replace(_comparison(candidates[i], name, full, adjusted, t, stopped), accepted=False)
            self.open_tests.discard(key)
        self.open_decisions -= closing
        self._close_decisions_without_tests()


@dataclass(frozen=True)
class _Ablated:
    env: Mapping[str, str]
    ablation: tuple[Ablation, ...]


def _ablate(winner_env: Mapping[str, str], baseline_env: Mapping[str, str], name: str,
            rounds: Sequence[Measured], keys: Mapping[str, int], winner_key: int,
            failures: Mapping[int, str], thresholds: Thresholds, guarded: Sequence[SizeBucket],
            requires: Callable[[str], Mapping[str, str]]) -> _Ablated:
    """Knobs of a multi-knob winner whose removal does not lose significantly (one-sided Wilcoxon of
    log(t_without / t_winner) > 0 at ablation_alpha) are dropped, unless without it a `guarded` bucket is
    slower than the winner beyond noise (_slower_bucket); when none is kept, none is dropped (the knobs may
    stand in for each other: which one carries the gain is not known)."""
    results = []
    for knob, key in keys.items():
        if key in failures:
            results.append(Ablation(knob, None, None, True, f"without it the run failed ({failures[key]})"))
            continue
        loss = _log_ratios(rounds, key, winner_key, name)
        p = signed_rank_p(loss)[0]
        slower = _slower_bucket(rounds, winner_key, key, guarded, thresholds.confidence)
        if p < thresholds.ablation_alpha:
            kept, reason = True, "removal loses significantly"
        elif slower is not None:
            kept, reason = True, f"removal does not lose significantly, but without it bucket {slower} is slower"
        else:
            kept, reason = False, "removal does not lose significantly"
        results.append(Ablation(knob, float(np.expm1(np.median(loss))), p, kept, reason))
    if not any(a.kept for a in results):
        results = [replace(a, kept=True, reason=a.reason + "; kept: no single removal loses, so the knobs may stand "
                           "in for each other and the tested set is deployed whole") for a in results]
    env = dict(winner_env)
    for a in results:
        if not a.kept:
            env = _without(env, baseline_env, a.knob, requires)
    return _Ablated(env, tuple(results))


def _keep_whole(ablated: _Ablated, winner_env: Mapping[str, str], why: str) -> _Ablated:
    """The ablation's reduced set refused: every knob of the winner kept, saying why."""
    return _Ablated(dict(winner_env), tuple(a if a.kept else replace(a, kept=True, reason=f"{a.reason}; kept: {why}")
                                            for a in ablated.ablation))


def _without(env: Mapping[str, str], baseline_env: Mapping[str, str], knob: str,
             requires: Callable[[str], Mapping[str, str]]) -> dict[str, str]:
    """`env` with `knob`, and the companions it requires that no other knob of `env` requires, as the baseline has
    them (its value, or unset)."""
    others = {c: v for k in env if k != knob for c, v in requires(k).items()}
    gone = [knob, *(c for c, v in requires(knob).items() if env.get(c) == v and others.get(c) != v)]
    reverted = {k: v for k, v in env.items() if k not in gone}
    reverted.update({k: baseline_env[k] for k in gone if k in baseline_env})
    return reverted


class _Runs:
    """The evaluator as finalization calls it: counts the runs and the batch allocations they ran in."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.calls = 0
        self.allocations: set[str] = set()

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        self.calls += 1
        evaluation = self.evaluator(env, validate=validate)
        if evaluation.allocation is not None:
            self.allocations.add(evaluation.allocation)
        return evaluation


def finalize(
    evaluator: Evaluator,
    baseline_env: Mapping[str, str],
    candidates: Sequence[Candidate],
    buckets: Sequence[SizeBucket],
    *,
    thresholds: Thresholds = Thresholds(),
    needs_validation: Callable[[Mapping[str, str], Mapping[str, str]], Sequence[str]] = lambda baseline, env: (),
    effective_env: Callable[[Mapping[str, str]], Mapping[str, str]] = dict,
    requires: Callable[[str], Mapping[str, str]] = lambda knob: {},
    seed: int = 0,
    deadline: float | None = None,
) -> FinalReport:
    """Re-measures baseline and candidates interleaved and returns the decisions (module docstring):
    validation, the group-sequential phase, ablation of multi-knob winners, held-out rounds of what
    is deployed. `needs_validation` (baseline env, candidate env) names the unsafe knobs a candidate
    changes (SearchSpace.unsafe_changes). `effective_env` (SearchSpace.effective_env) tells which environments run
    the same configuration: a reduced set that runs a refused candidate's is refused too, and ablation measures
    removals that run alike as one. `requires` (knob -> the companions it sets, Knob.requires) keeps a knob's
    companions out of ablation's decisions (5). `deadline`
    (time.monotonic()): no round starts after it (7)."""
    rng = np.random.default_rng(seed)
    out_of_time = _Deadline(deadline)
    notes: list[str] = []
    rejected: dict[int, str] = {}
    failed_in_round: set[int] = set()  # refused also where a look accepted them before the failure
    evaluator = runs = _Runs(evaluator)
    for i, candidate in enumerate(candidates):
        risky = needs_validation(baseline_env, candidate.env)
        failed = _validation_failure(evaluator, candidate.env, risky, buckets) if risky else None
        if failed:
            rejected[i] = failed
    validation_failed = set(rejected)
    tested = [i for i in range(len(candidates)) if i not in rejected]
    planned_family = family_size(len(tested), len(buckets))
    max_rounds = planned_rounds(thresholds, len(tested), len(buckets))
    if tested and max_rounds > thresholds.rounds:  # with nothing to test no round runs
        notes.append(
            f"rounds raised from {thresholds.rounds} to {max_rounds}: Holm over {planned_family} tests "
            f"({describe_family(len(tested), len(buckets))}) needs 2**-n < alpha/{planned_family} "
            f"(n >= {min_rounds(planned_family, thresholds.alpha)}), plus {ROUNDS_MARGIN} rounds of margin"
        )
    names = [OVERALL] + ([b.name for b in buckets] if decisions_tested(len(buckets)) > 1 else [])
    looks = look_rounds(thresholds, max_rounds)
    state = _Sequential(names, tested, thresholds, looks, max_rounds)
    rounds_data: list[Measured] = []
    rounds_run = 0
    looked = cut_off = False
    if not tested and candidates:
        notes.append("no candidate left to compare with the baseline: keep defaults")
    for k, look_at in enumerate(looks):
        while rounds_run < look_at and state.open_decisions and not out_of_time():
            rounds_run += 1
            envs = {-1: baseline_env, **{i: candidates[i].env for i in sorted(state.measuring)}}
            measured, failures = _run_round(evaluator, envs, buckets, rng)
            for i, reason in failures.items():
                if i == -1:
                    notes.append(f"round {rounds_run}: baseline failed ({reason}); round dropped")
                else:
                    rejected[i] = f"failed in re-measurement round {rounds_run}: {reason}"
                    failed_in_round.add(i)
                    state.reject(i)
            if -1 in measured:
                rounds_data.append(measured)
        if not state.open_decisions:
            break
        if rounds_run < look_at:  # the deadline came before this look: its tests end undecided
            notes.append(f"the time budget ran out after {rounds_run} of at most {max_rounds} rounds, before the "
                         f"look at round {look_at}: the decisions still open keep the defaults")
            for i in sorted(state.measuring):
                rejected.setdefault(i, f"undecided: the time budget ran out after {rounds_run} rounds")
                state.reject(i)
            cut_off = not looked
            break
        if len(rounds_data) < min_rounds(planned_family, thresholds.alpha) and k < len(looks) - 1:
            continue  # no test can pass yet; futility waits too (too few rounds to say anything)
        if k == len(looks) - 1 and len(rounds_data) < min_rounds(planned_family, thresholds.alpha):
            notes.append(f"only {len(rounds_data)} rounds had a working baseline "
                         f"(need {min_rounds(planned_family, thresholds.alpha)}): keep defaults")
            for i in tested:
                rejected.setdefault(i, "too few rounds with a working baseline")
                state.reject(i)
            break
        state.look(k, rounds_data, candidates)
        looked = True
    decisions: dict[str, Decision] = {}
    # per decision, the candidates refused (env_key -> why): a reduced set that is one of them is not deployed (5)
    refused: dict[str, dict[tuple[tuple[str, str], ...], str]] = {}

    def env_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        return _env_key(effective_env(env))

    for name in names:
        refused[name] = {env_key(candidates[i].env): f"{_label(candidates[i], i)}: {rejected[i]}"
                         for i in sorted(validation_failed | failed_in_round)}
        ordered = tuple(
            state.done[name, i] if (name, i) in state.done else Comparison(candidates[i], name, False, rejected[i])
            for i in range(len(candidates))
        )
        # Accepted at a look while its other tests ran on, then failed (a hang, wrong data): not deployed either.
        # The look's rejection stands in Holm's step-down; refusing a change cannot raise the false-change rate.
        ordered = tuple(replace(c, accepted=False, reason=f"accepted at a look, then {rejected[i]}")
                        if c.accepted and i in failed_in_round else c for i, c in enumerate(ordered))
        accepted_at_looks = [c.accepted for c in ordered]
        if name == OVERALL and len(buckets) > 1 and thresholds.never_slower:
            ordered = tuple(_unless_slower_somewhere(c, i, rounds_data, buckets, thresholds, notes)
                            for i, c in enumerate(ordered))
        if thresholds.total_time_check:
            ordered = tuple(_unless_slower_in_total(c, i, rounds_data, notes) for i, c in enumerate(ordered))
        for i, (before, after) in enumerate(zip(accepted_at_looks, ordered)):
            if before and not after.accepted and i not in failed_in_round:
                refused[name].setdefault(env_key(candidates[i].env), f"{_label(candidates[i], i)}: {after.reason}")
        decisions[name] = _choose(name, baseline_env, ordered)
    if tested and rounds_run < max_rounds and not out_of_time.passed:
        notes.append(f"stopped after {rounds_run} of at most {max_rounds} rounds: every decision settled "
                     f"(looks after {', '.join(map(str, looks))} rounds)")
    decisions = _ablation_phase(evaluator, baseline_env, decisions, buckets, thresholds, rng, notes, out_of_time,
                                refused, env_key, requires)
    decisions = _validated_reductions(evaluator, baseline_env, decisions, buckets, needs_validation, notes)
    decisions = _holdout_phase(evaluator, baseline_env, decisions, buckets, thresholds, rng, notes, out_of_time)
    overall = decisions[OVERALL]
    if len(names) == 1:  # one bucket: its decision is the overall one under the bucket's name
        per_bucket = {
            b.name: replace(
                overall,
                name=b.name,
                winner=None if overall.winner is None else replace(overall.winner, decision=b.name),
                comparisons=tuple(replace(c, decision=b.name) for c in overall.comparisons),
            )
            for b in buckets
        }
    else:
        per_bucket = {b.name: decisions[b.name] for b in buckets}
    family = state.family
    return FinalReport(
        baseline_env=dict(baseline_env),
        overall=overall,
        buckets=per_bucket,
        thresholds=thresholds,
        rounds_run=rounds_run,
        rounds_used=len(rounds_data),
        family_size=family,
        family=describe_family(len(tested), len(buckets)),
        test=describe_test(thresholds, len(tested), len(buckets)),
        notes=tuple(notes),
        max_rounds=max_rounds,
        looks=looks,
        evaluations=runs.calls,
        allocations=tuple(sorted(runs.allocations)),
        cut_off=cut_off,
    )


def _slower_bucket(rounds: Sequence[Measured], reference: int, other: int, buckets: Sequence[SizeBucket],
                   confidence: float) -> str | None:
    """The first bucket in which `other` is slower than `reference` beyond noise (the CI of its median per-round
    speed-up over `reference` wholly below 0), as "name: median [CI] over n rounds"; None when there is none."""
    for bucket in buckets:
        ratios = np.exp(_log_ratios(rounds, reference, other, bucket.name))
        if len(ratios) < 2:
            continue
        low, high = median_ci(ratios, confidence)
        if high < 1.0:
            return (f"{bucket.name}: {float(np.median(ratios)) - 1:+.1%} [{low - 1:+.1%}, {high - 1:+.1%}] over "
                    f"{len(ratios)} rounds")
    return None


def _label(candidate: Candidate, index: int) -> str:
    return f"trial {candidate.trial_number}" if candidate.trial_number is not None else f"candidate {index + 1}"


def _unless_slower_somewhere(comparison: Comparison, index: int, rounds: Sequence[Measured],
                             buckets: Sequence[SizeBucket], thresholds: Thresholds,
                             notes: list[str]) -> Comparison:
    """An accepted overall comparison, refused when its candidate is slower than the baseline in some size
    bucket beyond noise (the CI of the bucket's median per-round speed-up wholly below 0): an
    environment is process-wide, so a faster geometric mean must not hide a size it makes slower."""
    if not comparison.accepted:
        return comparison
    slower = _slower_bucket(rounds, -1, index, buckets, thresholds.confidence)
    if slower is None:
        return comparison
    reason = (f"faster overall ({(comparison.gain or 0.0):+.1%}) but slower in bucket {slower}; a change must not be "
              "slower than the defaults at any size")
    notes.append(f"{_label(comparison.candidate, index)}: {reason}")
    return replace(comparison, accepted=False, reason=reason)


def _unless_slower_in_total(comparison: Comparison, index: int, rounds: Sequence[Measured],
                            notes: list[str]) -> Comparison:
    """An accepted comparison, refused when its candidate took longer than the baseline summed over the rounds:
    the signed-rank test and the median see a setting a little faster in most runs and much slower in a few
    (a stall) as a gain, a job pays its total time."""
    if not comparison.accepted:
        return comparison
    both = [r for r in rounds if -1 in r and index in r]
    baseline, candidate = (float(np.sum(_series(both, key, comparison.decision))) for key in (-1, index))
    if candidate <= baseline:
        return comparison
    reason = (f"faster in most rounds (median {(comparison.gain or 0.0):+.1%}) but slower in total over the "
              f"{len(both)} rounds ({candidate / baseline - 1:+.1%} time): a setting that stalls now and then "
              "costs more than it gains")
    notes.append(f"{comparison.decision}: {_label(comparison.candidate, index)}: {reason}")
    return replace(comparison, accepted=False, reason=reason)


class _Deadline:
    """Whether the deadline (time.monotonic(); None: none) has passed; `passed` remembers that it did."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.passed = False

    def __call__(self) -> bool:
        self.passed = self.passed or (self.deadline is not None and time.monotonic() >= self.deadline)
        return self.passed


def _ablation_rounds(evaluator: Evaluator, envs: Sequence[Mapping[str, str]], buckets: Sequence[SizeBucket],
                     thresholds: Thresholds, rng: np.random.Generator,
                     out_of_time: _Deadline) -> tuple[list[Measured], dict[int, str], bool]:
    """`ablation_rounds` shuffled rounds of `envs` (keys: their indexes), the first failure of each, and whether
    the deadline cut them off (the failures of the rounds that ran stand)."""
    rounds: list[Measured] = []
    failures: dict[int, str] = {}
    for _ in range(thresholds.ablation_rounds):
        if out_of_time():
            return rounds, failures, True
        measured, failed = _run_round(evaluator, dict(enumerate(envs)), buckets, rng)
        rounds.append(measured)
        for key, reason in failed.items():
            failures.setdefault(key, reason)
    return rounds, failures, False


def _env_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(env.items()))


def _ablation_phase(evaluator: Evaluator, baseline_env: Mapping[str, str], decisions: dict[str, Decision],
                    buckets: Sequence[SizeBucket], thresholds: Thresholds, rng: np.random.Generator,
                    notes: list[str], out_of_time: _Deadline,
                    refused: Mapping[str, Mapping[tuple[tuple[str, str], ...], str]],
                    env_key: Callable[[Mapping[str, str]], tuple[tuple[str, str], ...]],
                    requires: Callable[[str], Mapping[str, str]]) -> dict[str, Decision]:
    """`ablation_rounds` rounds of each multi-knob winner and the winner without each of its knobs,
    shuffled; then, where two or more knobs would go, as many rounds of the winner and the reduced set.
    Each decision deploys its winner less the knobs whose removal does not lose (module docstring, 5); the
    overall decision's, where no bucket may be slower than the defaults (never_slower), neither in any bucket:
    that check was the tested winner's. `refused` (decision -> env_key -> why): the candidates this
    finalization refused for that decision; a reduced set that runs one of them (the same env_key) is not
    deployed."""

    def decided(env: Mapping[str, str]) -> list[str]:  # the knobs a winner changes, less companions it requires
        changed = {k for k in set(baseline_env) | set(env) if baseline_env.get(k) != env.get(k)}
        companions = {c for k in changed if k in env for c, v in requires(k).items() if c != k and env.get(c) == v}
        return sorted(changed - companions)

    multi = {name: d for name, d in decisions.items() if d.winner is not None and len(decided(d.env)) >= 2}
    if not multi or thresholds.ablation_rounds <= 0:
        return decisions
    envs: list[dict[str, str]] = []
    configurations: list[tuple[tuple[str, str], ...]] = []

    def key_of(env: Mapping[str, str]) -> int:  # one series per configuration (env_key): removals that run alike
        if env_key(env) not in configurations:
            configurations.append(env_key(env))
            envs.append(dict(env))
        return configurations.index(env_key(env))

    plan = {name: (key_of(d.env), {k: key_of(_without(d.env, baseline_env, k, requires)) for k in decided(d.env)})
            for name, d in multi.items()}
    rounds, failures, cut_off = _ablation_rounds(evaluator, envs, buckets, thresholds, rng, out_of_time)

    def guarded(name: str) -> Sequence[SizeBucket]:
        return buckets if name == OVERALL and thresholds.never_slower and len(buckets) > 1 else ()

    ablated: dict[str, _Ablated] = {}
    withdrawn: dict[str, str] = {}  # decision -> the phase and failure of its winner: not deployed (as in 2 and 6)
    for name, (winner_key, keys) in plan.items():
        if winner_key in failures:
            withdrawn[name] = f"an ablation round ({failures[winner_key]})"
        elif not cut_off:
            ablated[name] = _ablate(decisions[name].env, baseline_env, name, rounds, keys, winner_key, failures,
                                    thresholds, guarded(name), requires)
    if cut_off:
        notes.append("no ablation: the time budget ran out; each winner is deployed whole"
                     + (" (but one that failed in the ablation rounds that ran)" if withdrawn else ""))
    for name, a in ablated.items():
        why = refused[name].get(env_key(a.env)) if dict(a.env) != dict(decisions[name].env) else None
        if why is not None:
            ablated[name] = _keep_whole(a, decisions[name].env, f"the reduced set is a candidate this finalization "
                                                                f"refused ({why})")
    # A set less two or more knobs was not measured: it runs beside the winner before it may be deployed.
    unmeasured = {name: a for name, a in ablated.items() if sum(not x.kept for x in a.ablation) >= 2}
    if unmeasured:
        pairs: list[dict[str, str]] = []
        for name, a in unmeasured.items():
            pairs += [dict(decisions[name].env), dict(a.env)]
        pairs = [env for i, env in enumerate(pairs) if env not in pairs[:i]]
        confirm, failed, confirm_cut_off = _ablation_rounds(evaluator, pairs, buckets, thresholds, rng, out_of_time)
        for name, a in unmeasured.items():
            winner_key, reduced_key = pairs.index(dict(decisions[name].env)), pairs.index(dict(a.env))
            winner_env = decisions[name].env
            if winner_key in failed:
                withdrawn[name] = f"a confirmation round ({failed[winner_key]})"
                del ablated[name]
                continue
            if confirm_cut_off:
                ablated[name] = _keep_whole(a, winner_env, "the time budget ran out before the reduced set's rounds")
                continue
            if reduced_key in failed:
                ablated[name] = _keep_whole(a, winner_env, f"a confirmation round failed ({failed[reduced_key]})")
                continue
            loss = _log_ratios(confirm, reduced_key, winner_key, name)
            p = signed_rank_p(loss)[0]
            what = f"{float(np.expm1(np.median(loss))):+.1%}, one-sided p={p:.3g}, {len(loss)} rounds beside the winner"
            slower = _slower_bucket(confirm, winner_key, reduced_key, guarded(name), thresholds.confidence)
            if p < thresholds.ablation_alpha:
                ablated[name] = _keep_whole(a, winner_env, f"without them all together the set loses ({what})")
            elif slower is not None:
                ablated[name] = _keep_whole(a, winner_env, f"without them all together bucket {slower} is slower")
            else:
                notes.append(f"{name}: the reduced set does not lose beside the winner either ({what})")
    result = dict(decisions)
    for name, a in ablated.items():
        # what each knob's removal did, kept or not: the published evidence said nothing of an ablation that kept all
        notes.append(f"{name}: ablation, the winner without each knob: " + "; ".join(
            f"{x.knob} {'kept' if x.kept else 'dropped'}"
            + (f" ({x.loss:+.1%} without it, one-sided p={x.p_value:.3g})" if x.loss is not None and x.p_value
               is not None else "") + f": {x.reason}" for x in a.ablation))
        dropped = [x.knob for x in a.ablation if not x.kept]
        if dropped:
            notes.append(f"{name}: ablation dropped {', '.join(dropped)} (removal does not lose at one-sided "
                         f"p < {thresholds.ablation_alpha}, {thresholds.ablation_rounds} rounds); the gain above is "
                         "the tested set's, the held-out rounds measure what is deployed")
        result[name] = replace(decisions[name], env=dict(a.env), ablation=a.ablation)
    for name, where in withdrawn.items():
        notes.append(f"{name}: the winner failed in {where}: withdrawn, keep defaults")
        result[name] = replace(decisions[name], env=dict(baseline_env), winner=None, ablation=())
    return result


def _validation_failure(evaluator: Evaluator, env: Mapping[str, str], risky: Sequence[str],
                        buckets: Sequence[SizeBucket], of: str | None = None) -> str | None:
    """Why a validated run of `env`, which makes the unsafe changes `risky` (or is the setting `of` names),
    does not clear it (None: it does). It must work, validate the data and measure every requested size: data
    can go wrong at one size only (a protocol is chosen per size), so each size's record must be there and valid."""
    check = evaluator(env, validate=True)
    what = (f"validated run of {of}" if of is not None
            else f"validated re-run ({', '.join(risky)}: may-hang/may-corrupt, changed from the baseline)")
    if not check.ok:
        return f"{what} failed: {check.failure}: {check.reason}"
    if not check.validated:
        return f"{what} did not validate the data"
    try:
        bucket_times_us(check.median_us(), buckets)
    except MissingSizes as exc:
        return f"{what} did not cover every size: {exc}"
    return None


def _validated_reductions(evaluator: Evaluator, baseline_env: Mapping[str, str], decisions: dict[str, Decision],
                          buckets: Sequence[SizeBucket],
                          needs_validation: Callable[[Mapping[str, str], Mapping[str, str]], Sequence[str]],
                          notes: list[str]) -> dict[str, Decision]:
    """A set ablation reduced that still makes an unsafe change runs once with validation (each distinct set
    once); it is deployed only if that passes, else its winner (validated in step 1) whole (module
    docstring, 5)."""
    result = dict(decisions)
    verdicts: dict[tuple[tuple[str, str], ...], str | None] = {}
    for name, d in decisions.items():
        if d.winner is None or dict(d.env) == dict(d.winner.candidate.env):
            continue
        risky = needs_validation(baseline_env, d.env)
        if not risky:
            continue
        key = _env_key(d.env)
        if key not in verdicts:
            verdicts[key] = _validation_failure(evaluator, d.env, risky, buckets)
        failed = verdicts[key]
        deployed = " ".join(f"{k}={v}" for k, v in sorted(d.env.items()))
        if failed is None:
            notes.append(f"{name}: the reduced set ({deployed}) passed a validated run of its own")
            continue
        notes.append(f"{name}: the reduced set ({deployed}) is not deployed: its own {failed}; the winner, "
                     "validated, is deployed whole")
        whole = _keep_whole(_Ablated(d.env, d.ablation), d.winner.candidate.env, "the reduced set failed validation")
        result[name] = replace(d, env=dict(whole.env), ablation=whole.ablation)
    return result


def holdout_rounds(evaluator: Evaluator, baseline_env: Mapping[str, str], envs: Sequence[Mapping[str, str]],
                   buckets: Sequence[SizeBucket], thresholds: Thresholds, rng: np.random.Generator,
                   out_of_time: Callable[[], bool] = lambda: False) -> tuple[list[Measured], dict[int, str], int]:
    """`holdout_rounds` rounds of the baseline (key -1) and `envs` (keys: their indexes), shuffled: the rounds
    whose baseline worked, the first failure of each setting, and how many rounds started (`out_of_time` stops
    them)."""
    rounds: list[Measured] = []
    failures: dict[int, str] = {}
    started = 0
    for _ in range(thresholds.holdout_rounds):
        if out_of_time():
            break
        started += 1
        measured, failed = _run_round(evaluator, {-1: baseline_env, **dict(enumerate(envs))}, buckets, rng)
        for key, reason in failed.items():
            failures.setdefault(key, reason)
        if -1 in measured:
            rounds.append(measured)
    return rounds, failures, started


def holdout_of(rounds: Sequence[Measured], key: int, decision: str, confidence: float,
               reference: int = -1) -> Holdout | None:
    """Setting `key`'s median per-round speed-up over `reference` (the baseline, key -1) in `decision` (OVERALL or
    a bucket's name), with its order-statistic CI; None when no round measured both."""
    log_ratios = _log_ratios(rounds, reference, key, decision)
    if len(log_ratios) == 0:
        return None
    ratios = np.exp(log_ratios)
    low, high = median_ci(ratios, confidence)
    return Holdout(float(np.median(ratios) - 1), low - 1, high - 1, len(ratios), tuple(float(r) for r in ratios),
                   median_ci_coverage(len(ratios), confidence))


def _holdout_phase(evaluator: Evaluator, baseline_env: Mapping[str, str], decisions: dict[str, Decision],
                   buckets: Sequence[SizeBucket], thresholds: Thresholds, rng: np.random.Generator,
                   notes: list[str], out_of_time: _Deadline) -> dict[str, Decision]:
    """`holdout_rounds` rounds of the baseline and every deployed set, shuffled, after the choice: the
    gain each decision reports. A deployed set that fails in them, or is slower than the baseline in all of them
    in its decision's own scope (the CI of its median per-round speed-up wholly below 0, every planned round run;
    a round the defaults failed in does not count, and a note says so), is withdrawn (keep defaults): the rounds
    that chose it could not see drift or a state it leaves behind. Not
    per size bucket for the overall decision: with 6 rounds the interval is [min, max], all 6 slower by chance is
    1/64 per neutral bucket, and over 3 neutral buckets a real winner was withdrawn in 4.8 % of simulated
    finalizations (the sequential rounds' never_slower check judges the buckets on many more rounds)."""
    changed = {name: d for name, d in decisions.items() if d.change}
    if not changed or thresholds.holdout_rounds <= 0:
        return decisions
    envs: list[dict[str, str]] = []
    for d in changed.values():
        if dict(d.env) not in envs:
            envs.append(dict(d.env))
    rounds, failures, started = holdout_rounds(evaluator, baseline_env, envs, buckets, thresholds, rng, out_of_time)
    if started < thresholds.holdout_rounds:
        notes.append(f"the time budget ran out after {started} of {thresholds.holdout_rounds} held-out rounds"
                     + ("" if rounds else ": the gain is the one from the rounds that chose the winner"))
    if started and not rounds:
        notes.append(f"the defaults failed in all {started} held-out rounds ({failures[-1]}): the gain is the one from "
                     "the rounds that chose the winner")
    elif len(rounds) < started:  # judged on the rounds the defaults ran in (one failure had switched the check off)
        notes.append(f"the defaults failed in {started - len(rounds)} of {started} held-out rounds ({failures[-1]}): "
                     f"the gains and the slower-check come from the other {len(rounds)}")
    result = dict(decisions)
    for name, d in changed.items():
        key = envs.index(dict(d.env))
        holdout = None if key in failures else holdout_of(rounds, key, name, thresholds.confidence)
        if key in failures:
            withdrawn = f"failed in a held-out round ({failures[key]})"
        elif holdout is not None and started >= thresholds.holdout_rounds and holdout.rounds >= 2 \
                and holdout.ci_high < 0:
            withdrawn = (f"was slower than the defaults in the held-out rounds ({name}: {holdout.gain:+.1%} "
                         f"[{holdout.ci_low:+.1%}, {holdout.ci_high:+.1%}] over {holdout.rounds} rounds)")
        else:
            withdrawn = None
        if withdrawn is not None:
            notes.append(f"{name}: the deployed set {withdrawn}: withdrawn, keep defaults")
            result[name] = replace(d, env=dict(baseline_env), winner=None, ablation=())
        elif holdout is not None:
            result[name] = replace(d, holdout=holdout)
    return result


@dataclass(frozen=True)
class DeployedCheck:
    """What is deployed (the environment with its per-size rules) against the baseline, on rounds of its own."""

    overall: Holdout | None
    buckets: Mapping[str, Holdout]
    rounds: int  # rounds whose baseline worked
    refused: str | None  # why it may not be deployed: it failed, gave wrong data or is slower in a bucket
    # The environment alone, measured beside it: why it would be refused on these rounds (it failed in one, or is
    # slower in a bucket); None when it would not or was not measured (the environment is the baseline's). With the
    # set refused too, the environment, not only the rules, is to blame.
    environment_refused: str | None = None
    # The rules' own effect per bucket: the set's speed-up over the environment alone in the same rounds (over the
    # baseline when the environment is the baseline's); near 0 where a rule claimed a gain, the library ignored it.
    rules_effect: Mapping[str, Holdout] = field(default_factory=dict)


def check_deployed(evaluator: Evaluator, baseline_env: Mapping[str, str], deployed_env: Mapping[str, str],
                   buckets: Sequence[SizeBucket], thresholds: Thresholds, seed: int = 0,
                   environment: Mapping[str, str] | None = None) -> DeployedCheck:
    """The deployed set's validated run (data checked at every size), then `holdout_rounds` interleaved rounds
    beside the baseline: its gain overall and per bucket. Refused when a run fails or gives wrong data, when a
    bucket is slower than the baseline beyond noise (its CI wholly below 0, as in step 4), or when no round
    compared them (the baseline failed in every one). `environment`, the deployed set without its rules (None: the
    baseline's), runs in the same rounds and is judged alike (validated too when the set's validated run fails):
    whether the rules alone are to blame (finalization measured the environment on other rounds). Rounds the
    baseline failed in blame neither."""
    failed = _validation_failure(evaluator, deployed_env, [], buckets, "the deployed set")
    if failed:
        alone = None if environment is None else _validation_failure(evaluator, environment, [], buckets,
                                                                     "the environment alone")
        return DeployedCheck(None, {}, 0, failed, alone)
    envs = [deployed_env, *([] if environment is None else [environment])]
    rounds, failures, _ = holdout_rounds(evaluator, baseline_env, envs, buckets, thresholds,
                                         np.random.default_rng(seed))
    per_bucket = {b.name: h for b in buckets if (h := holdout_of(rounds, 0, b.name, thresholds.confidence))}
    reference = -1 if environment is None else 1
    effect = {b.name: h for b in buckets if (h := holdout_of(rounds, 0, b.name, thresholds.confidence, reference))}
    refused = _deployed_refusal(rounds, failures, 0, buckets, thresholds)
    if refused is None and not rounds:  # untested rules are not deployed, whatever failed
        refused = f"not compared: the defaults failed in all {thresholds.holdout_rounds} rounds"
    alone = None if environment is None else _deployed_refusal(rounds, failures, 1, buckets, thresholds)
    return DeployedCheck(holdout_of(rounds, 0, OVERALL, thresholds.confidence), per_bucket, len(rounds), refused,
                         alone, effect)


def _deployed_refusal(rounds: Sequence[Measured], failures: Mapping[int, str], key: int,
                      buckets: Sequence[SizeBucket], thresholds: Thresholds) -> str | None:
    """Why setting `key` of the deployed-set rounds failed there (in a round, or slower in a bucket than the
    baseline); None when it did not."""
    if key in failures:
        return f"failed in a round ({failures[key]})"
    slower = _slower_bucket(rounds, -1, key, buckets, thresholds.confidence)
    return None if slower is None else f"slower in bucket {slower}"
