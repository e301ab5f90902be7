"""Sampler benchmark on the SYNTHETIC knob landscape of tuners/synthetic.py (not a measurement).

NOT EVIDENCE for choosing a sampler: that landscape is a unit-test fixture (see its docstring; issue
14). A benchmark on landscapes built from measured trials has not been written yet.

For each scenario, sampler and seed, runs the real `Tuner` (trial 0 = the planted site defaults)
for `--trials` trials with log-normal noise of 1-3 % (drawn per seed) on every sample, and records
after how many trials the incumbent (best *observed* trial) is within 95 % of the true optimum
(noise-free performance = 1 / objective time). Reports median and quartiles over seeds, how many
seeds got there within the budget, the final true quality, and the sampler's own time per trial.

    python -m tuners.bench_sampler --seeds 20 --trials 50 --out results/bench/sampler_benchmark.json

The GP sampler needs torch (not a project dependency); without it GP is reported as skipped.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna

from tuners.catalog import Library
from tuners.evaluation import buckets_for_sizes
from tuners.scope import StudyScope
from tuners.study import ENV, SamplerName, Tuner, complete_trials
from tuners.synthetic import (
    SCENARIOS,
    SYNTHETIC_SIZES,
    SyntheticEvaluator,
    optimum_env,
    synthetic_space,
    true_objective_us,
)

TARGET_QUALITY = 0.95


@dataclass(frozen=True)
class RunResult:
    reached_at: int | None  # first trial whose incumbent is within 95 % of the optimum
    final_quality: float
    defaults_quality: float
    noise: float
    cpu_s_per_trial: float


def run_one(scenario_name: str, sampler: SamplerName, seed: int, trials: int) -> RunResult:
    scenario = SCENARIOS[scenario_name]
    space = synthetic_space(scenario=scenario)
    buckets = buckets_for_sizes(SYNTHETIC_SIZES)
    optimum = true_objective_us(scenario, optimum_env(scenario, space, buckets), buckets)
    noise = float(np.random.default_rng(1000 + seed).uniform(0.01, 0.03))
    scope = StudyScope(
        site="synthetic",
        system=scenario_name,
        library=Library.NCCL,
        library_version="2.28.3",
        op="allreduce",
        transport="ccl",
        nodes=1,
        gpus_per_node=4,
    )
    tuner = Tuner(
        scope,
        space,
        SyntheticEvaluator(scenario, noise=noise, seed=seed),
        optuna.storages.InMemoryStorage(),
        buckets,
        n_trials=trials,
        sampler=sampler,
        seed=seed,
    )
    started = time.process_time()
    study = tuner.run()
    cpu_s = time.process_time() - started
    history = sorted(complete_trials(study), key=lambda t: t.number)
    incumbent_value = float("inf")
    incumbent_quality = 0.0
    reached_at = None
    qualities = []
    for index, trial in enumerate(history, start=1):
        if trial.values[0] < incumbent_value:
            incumbent_value = trial.values[0]
            incumbent_quality = optimum / true_objective_us(scenario, trial.user_attrs[ENV], buckets)
        qualities.append(incumbent_quality)
        if reached_at is None and incumbent_quality >= TARGET_QUALITY:
            reached_at = index
    return RunResult(reached_at, qualities[-1], qualities[0], noise, cpu_s / len(history))


def summarize(runs: list[RunResult], trials: int) -> dict[str, float | int]:
    # A seed that never got there counts as budget + 1, so the median is honest about misses.
    censored = np.array([r.reached_at if r.reached_at is not None else trials + 1 for r in runs], dtype=float)
    finals = np.array([r.final_quality for r in runs])
    return {
        "seeds": len(runs),
        "reached": sum(r.reached_at is not None for r in runs),
        "trials_to_95pct_median": float(np.median(censored)),
        "trials_to_95pct_q1": float(np.percentile(censored, 25)),
        "trials_to_95pct_q3": float(np.percentile(censored, 75)),
        "final_quality_mean": float(finals.mean()),
        "final_quality_min": float(finals.min()),
        "defaults_quality": runs[0].defaults_quality,
        "cpu_s_per_trial": float(np.mean([r.cpu_s_per_trial for r in runs])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--samplers", default="tpe,gp,random")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", type=Path, default=Path("results/bench/sampler_benchmark.json"))
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results: dict[str, dict[str, float | int | str]] = {}
    for scenario_name in args.scenarios.split(","):
        for sampler_name in args.samplers.split(","):
            sampler = SamplerName(sampler_name)
            key = f"{scenario_name}/{sampler}"
            if sampler is SamplerName.GP and importlib.util.find_spec("torch") is None:
                results[key] = {"skipped": "GPSampler needs torch, which is not installed"}
                print(f"{key}: skipped (no torch)", flush=True)
                continue
            runs = [run_one(scenario_name, sampler, seed, args.trials) for seed in range(args.seeds)]
            s = summarize(runs, args.trials)
            results[key] = dict(s)
            print(
                f"{key}: trials to 95% median {s['trials_to_95pct_median']:.0f} "
                f"(IQR {s['trials_to_95pct_q1']:.0f}-{s['trials_to_95pct_q3']:.0f}), "
                f"reached {s['reached']}/{s['seeds']}, "
                f"final quality mean {s['final_quality_mean']:.3f} min {s['final_quality_min']:.3f}, "
                f"defaults {s['defaults_quality']:.3f}, {s['cpu_s_per_trial'] * 1e3:.0f} ms CPU/trial",
                flush=True,
            )
    document = {
        "what": "SYNTHETIC landscape (tuners/synthetic.py), not a measurement",
        "target_quality": TARGET_QUALITY,
        "trials_budget": args.trials,
        "optuna": optuna.__version__,
        "torch": importlib.metadata.version("torch") if importlib.util.find_spec("torch") else None,
        "python": platform.python_version(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
