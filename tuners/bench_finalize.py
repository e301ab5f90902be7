"""Error rates, power and rounds of the finalization (tuners/finalize.py) on SYNTHETIC runs whose
noise is MEASURED.

Each scenario finalizes `--finalizations` times (own seed each) with the default thresholds (group-
sequential: looks every 5 rounds, at most 40, O'Brien-Fleming spending inside Holm, futility; ablation;
held-out rounds): a baseline and `--candidates` K candidates (default 2) over five one-size buckets (8 KiB
.. 64 MiB, the GPU demo's sizes): NCCL_PROTO=LL128, the one that may be faster, and K-1 never faster
(`candidate_envs`: NCCL_PROTO=LL, then LL with NCCL_MIN_NCHANNELS 2, 4, 8, ...: distinct settings, so the
Holm family is K x (overall + 5 buckets); the shipped defaults hand finalize up to 8 for five buckets).
Per run and size the time is divided by the setting's true speed-up and multiplied by a common slow drift
(1 % log-normal random walk + 0.2 % steady trend per run: ASSUMED, not measured) and by per-launch
noise of one of three shapes (`--noise`), whose scales are MEASURED (`measured_noise`: the committed 4x
H200 A/A run, results/tuning/gpu-h200x4/aa/runs.jsonl, launches of one environment on one GPU pair
grouped, log(median time) per size around the group's median; recorded in the output):

- gaussian: log-normal, per size the measured standard deviation;
- heavy: Student t with 3 degrees of freedom on the log scale, scaled to the same standard deviation;
- bimodal: log-normal with the measured robust (MAD) standard deviation per size, and with the measured
  rate a whole launch is slow by the measured factor (launches whose mean over sizes lies > 3 robust sd
  above their group's median: the slow mode).

Scenarios (`--gains`; the candidate NCCL_PROTO=LL128, the others never faster but in all-at-margin): A/A
(gain 0: no candidate faster anywhere); `boundary`: the candidate exactly `min_effect` (3 %) faster at
every size, overall and in every bucket (H0 holds with equality: every acceptance is a false change;
the rate must stay <= alpha), the other candidates never faster (their H0s hold with room: 6 of
the K x 6 at equality); `all-at-margin`: every candidate exactly `min_effect` faster at every size (all
K x 6 H0s at equality: the family's worst case); `stall`: the candidate 5 % faster at every size but 2x
slower in 10 % of its runs (4.8 % longer in mean time: every acceptance is a false change); and G (e.g. 0.05 0.1 0.2): the
candidate G faster in the 2 MiB bucket only (overall, over the five buckets: (1+G)^(1/5)-1). It counts finalizations with a false change (a
candidate accepted for a decision where its true speed-up is at most the minimum effect), with the
Clopper-Pearson 95 % interval (and one-sided 95 % upper bound), and where there is an effect above it,
finalizations that found it (accepted in the 2 MiB bucket: the power), their mean gain at selection and
on the held-out rounds; and the rounds of the sequential phase (mean, quartiles) and evaluator calls.

    python -m tuners.bench_finalize --finalizations 1000 --workers 2 --out results/bench/finalize_error_rates.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np
import scipy
from scipy import stats

from tuners.evaluation import Evaluation, buckets_for_sizes
from tuners.finalize import OVERALL, Candidate, Comparison, FinalReport, Thresholds, family_size, finalize, holm

SIZES = (8192, 262144, 2097152, 16777216, 67108864)
EFFECT_SIZE = 2097152
BASELINE = {"NCCL_PROTO": "Simple"}
CANDIDATES = ({"NCCL_PROTO": "LL128"}, {"NCCL_PROTO": "LL"})
NOISE_MODELS = ("lognormal", "heavy", "bimodal")  # realistic_evaluator's (assumed 2-5 % noise: unit tests)
NOISE_SHAPES = ("gaussian", "heavy", "bimodal")  # measured_evaluator's (measured scales: the benchmark)
BOUNDARY = "boundary"
ALL_AT_MARGIN = "all-at-margin"
STALL = "stall"
STALL_GAIN, STALL_RATE, STALL_FACTOR = 0.05, 0.1, 2.0  # 5 % faster, but 2x slower in 10 % of its runs
WORDS = (BOUNDARY, ALL_AT_MARGIN, STALL)


def candidate_envs(k: int = len(CANDIDATES)) -> list[dict[str, str]]:
    """k distinct candidates: CANDIDATES[0] (the one that may be faster), NCCL_PROTO=LL, then LL with
    NCCL_MIN_NCHANNELS 2, 4, 8, ... (never faster: the evaluator's speed-ups go by NCCL_PROTO)."""
    if k < 1:
        raise ValueError(f"{k} candidates: at least 1")
    extra = [{**CANDIDATES[1], "NCCL_MIN_NCHANNELS": str(2**i)} for i in range(1, k - 1)]
    return [dict(env) for env in CANDIDATES][:k] + extra


class DriftingEvaluator:
    """SYNTHETIC runs: per size a time (5 us + size / 20 GB/s) divided by the setting's true speed-up
    at that size (`speedups[NCCL_PROTO value]`: one number for every size, or per size), times a
    common slow drift that interleaving must cancel (a log-normal random walk of `walk` per run and a
    steady `trend` per run), times independent log-normal noise per run and size; with probability
    `outlier_rate` a whole run is `outlier_factor` slower (a noisy neighbour); `stalls[label]` = (rate,
    factor): that setting's own runs are `factor` slower with probability `rate` (a setting that stalls)."""

    def __init__(
        self,
        sizes: Sequence[int],
        speedups: Mapping[str, float | Mapping[int, float]],
        noise: float | Mapping[int, float],
        seed: int,
        *,
        walk: float = 0.01,
        trend: float = 0.0,
        outlier_rate: float = 0.0,
        outlier_factor: float = 1.3,
        heavy_tails: bool = False,
        stalls: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        self.sizes = tuple(sizes)
        self.speedups = dict(speedups)
        self.noise = noise
        self.walk = walk
        self.trend = trend
        self.outlier_rate = outlier_rate
        self.outlier_factor = outlier_factor
        self.heavy_tails = heavy_tails
        self.stalls = dict(stalls or {})
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
        rate, factor = self.stalls.get(label, (0.0, 1.0))
        slow *= factor if rate and self.rng.random() < rate else 1.0
        common = self.drift * slow
        times = {
            size: [(5.0 + size / 2e4) / self.speedup(label, size) * common
                   * np.exp((self.noise[size] if isinstance(self.noise, Mapping) else self.noise) * self._unit_noise())]
            for size in self.sizes
        }
        return Evaluation(times_us=times, validated=validate)

    def _unit_noise(self) -> float:
        """Standard deviation 1 on the log scale: normal, or Student t(3) / sqrt(3) (heavy tails)."""
        return float(self.rng.standard_t(3) / np.sqrt(3.0)) if self.heavy_tails else float(self.rng.standard_normal())


def realistic_evaluator(
    speedups: Mapping[str, float | Mapping[int, float]], seed: int, noise_model: str = "lognormal"
) -> DriftingEvaluator:
    """The module docstring's noise model `noise_model`, noise level drawn from the seed."""
    if noise_model not in NOISE_MODELS:
        raise ValueError(f"noise model {noise_model!r} is not one of {NOISE_MODELS}")
    noise = float(np.random.default_rng(seed + 10**6).uniform(0.02, 0.05))
    bimodal = noise_model == "bimodal"
    return DriftingEvaluator(SIZES, speedups, noise, seed, walk=0.01, trend=0.002,
                             outlier_rate=0.3 if bimodal else 0.03, outlier_factor=1.15 if bimodal else 1.3,
                             heavy_tails=noise_model == "heavy")


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


def clopper_pearson(count: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact two-sided binomial confidence interval of count / n."""
    tail = (1 - confidence) / 2
    low = 0.0 if count == 0 else float(stats.beta.ppf(tail, count, n - count + 1))
    high = 1.0 if count == n else float(stats.beta.ppf(1 - tail, count + 1, n - count))
    return low, high


def _true_gains(gain: float | str, min_effect: float, n_buckets: int, effect_bucket: str):
    """(speedups for the evaluator, true gain of a comparison) of a scenario; the stall scenario's true gain
    is the candidate's in mean time (a job pays the total), so any acceptance of it is a false change."""
    if gain == STALL:
        mean_time = ((1 - STALL_RATE) + STALL_RATE * STALL_FACTOR) / (1 + STALL_GAIN)

        def stalling(comparison: Comparison) -> float:
            return 1 / mean_time - 1 if comparison.candidate.env == CANDIDATES[0] else 0.0

        return {CANDIDATES[0]["NCCL_PROTO"]: STALL_GAIN}, stalling
    if gain == ALL_AT_MARGIN:  # the evaluator's speed-ups go by NCCL_PROTO: LL covers every other candidate
        return {env["NCCL_PROTO"]: min_effect for env in CANDIDATES}, lambda comparison: min_effect
    if gain == BOUNDARY:
        speedups = {CANDIDATES[0]["NCCL_PROTO"]: min_effect}

        def boundary(comparison: Comparison) -> float:
            return min_effect if comparison.candidate.env == CANDIDATES[0] else 0.0

        return speedups, boundary
    assert isinstance(gain, float)
    speedups = {CANDIDATES[0]["NCCL_PROTO"]: {EFFECT_SIZE: gain}} if gain else {}

    def one_bucket(comparison: Comparison) -> float:
        if comparison.candidate.env != CANDIDATES[0]:
            return 0.0
        if comparison.decision == effect_bucket:
            return gain
        return (1 + gain) ** (1 / n_buckets) - 1 if comparison.decision == OVERALL else 0.0

    return speedups, one_bucket


AA_RUNS = Path(__file__).resolve().parents[1] / "results" / "tuning" / "gpu-h200x4" / "aa" / "runs.jsonl"
NOT_KNOBS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_TESTS_DIR", "NCCL_VERSION")


@dataclass(frozen=True)
class MeasuredNoise:
    """Launch-to-launch noise of repeated launches of one environment, from commbench records."""

    source: str
    launches: int
    groups: int  # environments (per GPU pair) launched 3 or more times
    sd: Mapping[int, float]  # per size: standard deviation of log(median time) around the group's median
    robust_sd: Mapping[int, float]  # per size: 1.4826 x median absolute deviation of the same
    slow_rate: float  # share of launches whose mean over sizes is > 3 robust sd above the group's median
    slow_factor: float  # their median slow-down

    def as_json(self) -> dict[str, object]:
        return {**{k: v for k, v in self.__dict__.items() if k not in ("sd", "robust_sd")},
                "sd": {str(k): round(v, 5) for k, v in self.sd.items()},
                "robust_sd": {str(k): round(v, 5) for k, v in self.robust_sd.items()}}


def measured_noise(runs_pack: Path = AA_RUNS) -> MeasuredNoise:
    """The noise of the committed 4x H200 A/A run (results/tuning/gpu-h200x4/aa/runs.jsonl: one pack entry
    per launch with its commbench.jsonl): launches grouped by GPU pair and NCCL_* knobs; groups of 3+."""
    from campaigns.formats.packs import read_pack  # the evidence packs' one reader (a benchmark-only import)

    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[dict[int, float]]] = {}
    for launch in sorted(read_pack(runs_pack), key=lambda entry: entry.id):
        records = [json.loads(line) for line in launch.text("/commbench.jsonl").splitlines() if line]
        results = [r for r in records if r.get("kind") == "result"]
        env = results[0]["env"]
        knobs = tuple(sorted((k, v) for k, v in env.items() if k.startswith("NCCL_") and k not in NOT_KNOBS))
        groups.setdefault((env.get("CUDA_VISIBLE_DEVICES", ""), knobs), []).append(
            {int(r["bytes"]): float(np.median(r["samples_us"])) for r in results})
    repeated = [runs for runs in groups.values() if len(runs) >= 3]
    sizes = sorted(repeated[0][0])
    residuals = np.concatenate([np.log([[run[s] for s in sizes] for run in runs])
                                - np.median(np.log([[run[s] for s in sizes] for run in runs]), axis=0)
                                for runs in repeated])
    per_launch = residuals.mean(axis=1)
    spread = 1.4826 * float(np.median(np.abs(per_launch)))
    slow = per_launch[per_launch > 3 * spread]
    return MeasuredNoise(
        source=str(runs_pack.relative_to(runs_pack.parents[4])) if len(runs_pack.parents) > 4 else str(runs_pack),
        launches=len(residuals),
        groups=len(repeated),
        sd={s: float(residuals[:, j].std(ddof=1)) for j, s in enumerate(sizes)},
        robust_sd={s: float(1.4826 * np.median(np.abs(residuals[:, j]))) for j, s in enumerate(sizes)},
        slow_rate=len(slow) / len(per_launch),
        slow_factor=float(np.exp(np.median(slow))) if len(slow) else 1.0,
    )


def measured_evaluator(speedups: Mapping[str, float | Mapping[int, float]], seed: int, shape: str,
                       noise: MeasuredNoise, stalls: Mapping[str, tuple[float, float]] | None = None
                       ) -> DriftingEvaluator:
    """Per-launch noise of the measured scales, in one of three shapes (module docstring)."""
    if shape not in NOISE_SHAPES:
        raise ValueError(f"noise shape {shape!r} is not one of {NOISE_SHAPES}")
    if shape == "bimodal":
        return DriftingEvaluator(SIZES, speedups, noise.robust_sd, seed, walk=0.01, trend=0.002,
                                 outlier_rate=noise.slow_rate, outlier_factor=noise.slow_factor, stalls=stalls)
    return DriftingEvaluator(SIZES, speedups, noise.sd, seed, walk=0.01, trend=0.002, heavy_tails=shape == "heavy",
                             stalls=stalls)


def _one_finalization(seed: int, gain: float | str, shape: str, noise: MeasuredNoise,
                      thresholds: Thresholds, candidates: int = len(CANDIDATES)) -> dict[str, object]:
    buckets = buckets_for_sizes(SIZES, 1)
    effect_bucket = next(b.name for b in buckets if b.contains(EFFECT_SIZE))
    speedups, true_gain = _true_gains(gain, thresholds.min_effect, len(buckets), effect_bucket)
    stalls = {CANDIDATES[0]["NCCL_PROTO"]: (STALL_RATE, STALL_FACTOR)} if gain == STALL else None
    report = finalize(measured_evaluator(speedups, seed, shape, noise, stalls), BASELINE,
                      [Candidate(env) for env in candidate_envs(candidates)], buckets, thresholds=thresholds,
                      seed=seed)
    accepted = [d.winner for d in report.decisions if d.winner is not None]
    effect = report.buckets[effect_bucket]
    found = effect.winner is not None and true_gain(effect.winner) > thresholds.min_effect
    return {
        "rounds": report.rounds_run,
        "evaluations": report.evaluations,
        "false": any(true_gain(c) <= thresholds.min_effect for c in accepted),
        "found": found,
        "selection_gain": effect.winner.gain if found and effect.winner else None,
        "holdout_gain": effect.holdout.gain if found and effect.holdout else None,
    }


def run_scenario(gain: float | str, finalizations: int, thresholds: Thresholds, shape: str, noise: MeasuredNoise,
                 workers: int = 1, candidates: int = len(CANDIDATES)) -> dict[str, object]:
    """Counts over `finalizations` seeds (0 .. finalizations-1) of one scenario and noise shape."""
    one = partial(_one_finalization, gain=gain, shape=shape, noise=noise, thresholds=thresholds,
                  candidates=candidates)
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            outcomes = list(pool.map(one, range(finalizations), chunksize=8))
    else:
        outcomes = [one(seed) for seed in range(finalizations)]
    rounds = np.array([o["rounds"] for o in outcomes], dtype=float)
    false_changes = sum(bool(o["false"]) for o in outcomes)
    low, high = clopper_pearson(false_changes, finalizations)
    result: dict[str, object] = {
        "scenario": (gain if gain in (BOUNDARY, ALL_AT_MARGIN) else f"{STALL}: +{STALL_GAIN:g} but "
                     f"x{STALL_FACTOR:g} in {STALL_RATE:.0%} of its runs" if gain == STALL
                     else f"one bucket +{gain:g}" if gain else "A/A"),
        "gain_in_2MiB_bucket": (thresholds.min_effect if gain in (BOUNDARY, ALL_AT_MARGIN)
                                else STALL_GAIN if gain == STALL else gain),
        "noise": shape,
        "finalizations": finalizations,
        "rounds_mean": round(float(rounds.mean()), 2),
        "rounds_quartiles": [float(q) for q in np.quantile(rounds, [0.25, 0.5, 0.75])],
        "evaluations_mean": round(float(np.mean([o["evaluations"] for o in outcomes])), 2),
        "finalizations_with_a_false_change": false_changes,
        "false_change_rate_ci95": [low, high],
        "false_change_rate_upper95_one_sided": clopper_pearson(false_changes, finalizations, 0.90)[1],
    }
    if gain not in WORDS and gain:
        found = [o for o in outcomes if o["found"]]
        result["finalizations_that_found_the_effect"] = len(found)
        result["power_ci95"] = list(clopper_pearson(len(found), finalizations))
        held = [o for o in found if o["holdout_gain"] is not None]
        if held:
            result["found_mean_gain_at_selection"] = round(float(np.mean([o["selection_gain"] for o in held])), 4)
            result["found_mean_gain_held_out"] = round(float(np.mean([o["holdout_gain"] for o in held])), 4)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finalizations", type=int, default=1000, help="per scenario, noise shape and alpha")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.01])
    parser.add_argument("--gains", nargs="+", default=[BOUNDARY, ALL_AT_MARGIN, "0.10", "0.20", "0.05", "0", STALL],
                        help=f"0 (A/A), {BOUNDARY} (one candidate exactly the minimum effect everywhere), "
                        f"{ALL_AT_MARGIN} (every candidate so), {STALL} (faster in most runs, slower in mean time) "
                        "or a gain in the 2 MiB bucket")
    parser.add_argument("--noise", nargs="+", default=list(NOISE_SHAPES), choices=NOISE_SHAPES)
    parser.add_argument("--candidates", type=int, default=len(CANDIDATES),
                        help="candidates per finalization: LL128 (may be faster) and K-1 never faster")
    parser.add_argument("--rounds", type=int, default=Thresholds().rounds, help="the sequential phase's maximum")
    parser.add_argument("--look-every", type=int, default=Thresholds().look_every,
                        help=">= --rounds: one look, a fixed budget")
    parser.add_argument("--futility", type=float, default=Thresholds().futility)
    parser.add_argument("--no-total-time-check", dest="total_time_check", action="store_false",
                        help="finalize without the total-time check, to measure what it buys (the stall scenario)")
    parser.add_argument("--workers", type=int, default=1, help="processes")
    parser.add_argument("--commit", default="", help="the commit measured (recorded as given)")
    parser.add_argument("--out", type=Path, help="the JSON document (default: printed)")
    args = parser.parse_args(argv)
    gains: list[float | str] = []
    for gain in args.gains:
        if gain in WORDS:
            gains.append(gain)
            continue
        try:
            gains.append(float(gain))
        except ValueError:
            parser.error(f"--gains: {gain!r} is neither a number nor one of {', '.join(WORDS)}")
    if args.candidates < 1:
        parser.error("--candidates: at least 1")
    noise = measured_noise()
    started = time.time()
    results: list[dict[str, object]] = []
    planned = [(alpha, gain, shape) for alpha in args.alphas for gain in gains for shape in args.noise]
    for alpha, gain, shape in planned:
        thresholds = Thresholds(alpha=alpha, rounds=args.rounds, look_every=args.look_every,
                                futility=args.futility, total_time_check=args.total_time_check)
        result = {"alpha": alpha, "min_effect": thresholds.min_effect,
                  **run_scenario(gain, args.finalizations, thresholds, shape, noise, args.workers, args.candidates)}
        print(json.dumps(result), file=sys.stderr, flush=True)
        results.append(result)
        # Written after every scenario: a run stopped early keeps what it finished, and says so.
        _write(args, argv, noise, results, len(planned), started)
    return 0


def _write(args: argparse.Namespace, argv: list[str] | None, noise: MeasuredNoise,
           results: list[dict[str, object]], planned: int, started: float) -> None:
    document = {
        "what": " ".join((__doc__ or "").split("    python -m")[0].split()),
        "command": "python -m tuners.bench_finalize " + " ".join(argv if argv is not None else sys.argv[1:]),
        "thresholds": {k: v for k, v in Thresholds(rounds=args.rounds, look_every=args.look_every,
                                                   futility=args.futility,
                                                   total_time_check=args.total_time_check).__dict__.items()
                       if k != "alpha"},
        "candidates": args.candidates,
        "candidate_envs": candidate_envs(args.candidates),
        "family_size": family_size(args.candidates, len(SIZES)),
        "measured_noise": noise.as_json(),
        "assumed": "common drift: log-normal random walk 1 % per run + 0.2 % steady trend per run (not measured)",
        "scenarios_done": f"{len(results)} of {planned}",
        "results": results,
        "seconds": round(time.time() - started, 1),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})",
        "commit": args.commit,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
    }
    text = json.dumps(document, indent=2) + "\n"
    if args.out:
        from tuners.writers import write_atomic  # imports the catalog's dependencies: only when writing

        write_atomic(args.out, text)
    elif len(results) == planned:
        print(text, end="")


if __name__ == "__main__":
    raise SystemExit(main())
