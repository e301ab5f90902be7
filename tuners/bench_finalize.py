"""Error rates of the finalization (tuners/finalize.py) on SYNTHETIC runs (not a measurement).

Each scenario finalizes `--finalizations` times (own seed each): a baseline and two candidates over
five one-size buckets (8 KiB .. 64 MiB, as in the GPU demo), with per-run noise drawn per finalization
between 2 % and 5 %, a slow common drift (1 % random walk + 0.2 % steady trend per run) and, in 3 %
of the runs, the whole run 1.3x slower. Scenarios: A/A (no candidate faster anywhere), and one
candidate truly 5 %, 10 % or 20 % faster in the 2 MiB bucket only (overall, the geometric mean over
the five buckets: 1 %, 1.9 %, 3.7 %). From the same runs it counts, per decision rule, finalizations
with a false change (a candidate accepted for a decision where its true speed-up is below the minimum
effect) and, where there is an effect, finalizations that found it (accepted in the 2 MiB bucket):

- per-decision: Holm over the candidates of each decision separately, H0: gain <= 0 (before)
- family-zero:  Holm over all tests of the finalization, H0: gain <= 0
- family-margin: Holm over all tests, H0: gain <= min_effect (what finalize decides now)

each with gain >= min_effect and the bootstrap CI's lower bound > 0.

    python -m tuners.bench_finalize --finalizations 300 --out results/bench/finalize_error_rates.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy import stats

from tuners.evaluation import Evaluation, buckets_for_sizes
from tuners.finalize import OVERALL, Candidate, Comparison, FinalReport, Thresholds, finalize, holm
from tuners.writers import write_atomic

SIZES = (8192, 262144, 2097152, 16777216, 67108864)
EFFECT_SIZE = 2097152
BASELINE = {"NCCL_PROTO": "Simple"}
CANDIDATES = ({"NCCL_PROTO": "LL128"}, {"NCCL_PROTO": "LL"})
RULES = ("per-decision", "family-zero", "family-margin")


class DriftingEvaluator:
    """SYNTHETIC runs: per size a time (5 us + size / 20 GB/s) divided by the setting's true speed-up
    at that size (`speedups[NCCL_PROTO value]`: one number for every size, or per size), times a
    common slow drift that interleaving must cancel (a log-normal random walk of `walk` per run and a
    steady `trend` per run), times independent log-normal noise per run and size; with probability
    `outlier_rate` a whole run is `outlier_factor` slower (a noisy neighbour)."""

    def __init__(
        self,
        sizes: Sequence[int],
        speedups: Mapping[str, float | Mapping[int, float]],
        noise: float,
        seed: int,
        *,
        walk: float = 0.01,
        trend: float = 0.0,
        outlier_rate: float = 0.0,
        outlier_factor: float = 1.3,
    ) -> None:
        self.sizes = tuple(sizes)
        self.speedups = dict(speedups)
        self.noise = noise
        self.walk = walk
        self.trend = trend
        self.outlier_rate = outlier_rate
        self.outlier_factor = outlier_factor
        self.rng = np.random.default_rng(seed)
        self.drift = 1.0
        self.order: list[str] = []

    def speedup(self, label: str, size: int) -> float:
        value = self.speedups.get(label, 0.0)
        return 1.0 + (value.get(size, 0.0) if isinstance(value, Mapping) else value)

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        label = env.get("NCCL_PROTO", "unset")
        self.order.append(label)
        self.drift *= (1.0 + self.trend) * self.rng.lognormal(0.0, self.walk)
        slow = self.outlier_factor if self.rng.random() < self.outlier_rate else 1.0
        common = self.drift * slow
        times = {
            size: [(5.0 + size / 2e4) / self.speedup(label, size) * common * self.rng.lognormal(0.0, self.noise)]
            for size in self.sizes
        }
        return Evaluation(times_us=times, validated=validate)


def realistic_evaluator(speedups: Mapping[str, float | Mapping[int, float]], seed: int) -> DriftingEvaluator:
    """The module docstring's noise model, noise level drawn from the seed."""
    noise = float(np.random.default_rng(seed + 10**6).uniform(0.02, 0.05))
    return DriftingEvaluator(SIZES, speedups, noise, seed, walk=0.01, trend=0.002, outlier_rate=0.03)


def _zero_null_p(comparison: Comparison) -> float:
    log_ratios = np.log(np.asarray(comparison.ratios))
    return 1.0 if np.all(log_ratios == 0) else float(stats.wilcoxon(log_ratios, alternative="greater").pvalue)


def accepted_by_rule(report: FinalReport) -> dict[str, list[Comparison]]:
    """Per rule, the comparisons it would accept, from one report's rounds (two or more buckets: with
    one, the bucket decision is a copy of the overall one)."""
    if len(report.buckets) < 2:
        raise ValueError("accepted_by_rule needs a report of two or more buckets")
    thresholds = report.thresholds
    tested = [c for d in report.decisions for c in d.comparisons if c.tested]
    zero = [_zero_null_p(c) for c in tested]
    family = holm(zero)
    per_decision: list[float] = [1.0] * len(tested)
    for name in {c.decision for c in tested}:
        indices = [i for i, c in enumerate(tested) if c.decision == name]
        for i, adjusted in zip(indices, holm([zero[i] for i in indices]), strict=True):
            per_decision[i] = adjusted

    def passes(c: Comparison, adjusted: float) -> bool:
        return adjusted < thresholds.alpha and (c.gain or 0.0) >= thresholds.min_effect and (c.ci_low or 0.0) > 0

    return {
        "per-decision": [c for c, a in zip(tested, per_decision, strict=True) if passes(c, a)],
        "family-zero": [c for c, a in zip(tested, family, strict=True) if passes(c, a)],
        "family-margin": [c for c in tested if c.accepted],
    }


def run_scenario(gain: float, finalizations: int, thresholds: Thresholds) -> dict[str, object]:
    buckets = buckets_for_sizes(SIZES, 1)
    effect_bucket = next(b.name for b in buckets if b.contains(EFFECT_SIZE))
    speedups = {CANDIDATES[0]["NCCL_PROTO"]: {EFFECT_SIZE: gain}} if gain else {}

    def true_gain(comparison: Comparison) -> float:
        if comparison.candidate.env != CANDIDATES[0]:
            return 0.0
        if comparison.decision == effect_bucket:
            return gain
        return (1 + gain) ** (1 / len(buckets)) - 1 if comparison.decision == OVERALL else 0.0

    false_changes = dict.fromkeys(RULES, 0)
    found = dict.fromkeys(RULES, 0)
    rounds = set()
    for seed in range(finalizations):
        report = finalize(
            realistic_evaluator(speedups, seed),
            BASELINE,
            [Candidate(env) for env in CANDIDATES],
            buckets,
            thresholds=thresholds,
            seed=seed,
        )
        rounds.add(report.rounds_run)
        for rule, accepted in accepted_by_rule(report).items():
            false_changes[rule] += any(true_gain(c) < thresholds.min_effect for c in accepted)
            found[rule] += any(c.decision == effect_bucket and true_gain(c) > 0 for c in accepted)
    result: dict[str, object] = {
        "gain_in_2MiB_bucket": gain,
        "finalizations": finalizations,
        "rounds": sorted(rounds),
        "family_size": len(CANDIDATES) * (1 + len(buckets)),
        "finalizations_with_a_false_change": false_changes,
    }
    if gain:
        result["finalizations_that_found_the_effect"] = found
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finalizations", type=int, default=300, help="per scenario and alpha")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.01, 0.05])
    parser.add_argument("--gains", type=float, nargs="+", default=[0.0, 0.05, 0.10, 0.20])
    parser.add_argument("--rounds", type=int, default=2, help="at least (finalize raises it to what the family needs)")
    parser.add_argument("--n-resamples", type=int, default=999, help="bootstrap resamples (finalize's default 9999)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    started = time.time()
    results = []
    for alpha in args.alphas:
        thresholds = Thresholds(alpha=alpha, rounds=args.rounds, n_resamples=args.n_resamples)
        for gain in args.gains:
            result = {"alpha": alpha, "min_effect": thresholds.min_effect,
                      **run_scenario(gain, args.finalizations, thresholds)}
            print(json.dumps(result), flush=True)
            results.append(result)
    document = {
        "what": " ".join(__doc__.split("    python -m")[0].split()),
        "command": "python -m tuners.bench_finalize " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rules": RULES,
        "n_resamples": args.n_resamples,
        "results": results,
        "seconds": round(time.time() - started, 1),
        "python": platform.python_version(),
    }
    if args.out:
        write_atomic(args.out, json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
