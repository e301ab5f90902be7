"""Fail-slow's error rates (campaigns/kinds/health.py, find_slow_nodes): how often a healthy night names a
node, and how often a node that slowed is named, on simulated nights.

    .venv/bin/python tests/bench/bench_fail_slow.py [--nights 1000] [--power-nights 200]
                                                    [--output results/reliability/fail_slow_error_rates.json]

A night: tests/fixtures_health.simulated_night (4 records, every node's time around 100 us), with normal
noise of sd 3 % or 10 %, or log-t3 noise of sd 3 % (heavier tails than the rule assumes). History: the nights before tonight (3 or 14, the default history_nights).
False alarms: the share of healthy nights on which any node is named, with its Clopper-Pearson 95 % interval
(the rule's claim: <= slow_alpha 0.05 for normal noise). Power: one node's times tonight x (1 + drift), the
share of nights on which that node, and only it, is named. Default HealthSettings (min_history 3).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import REPO, write_result
from fixtures_health import SIZES, SLOWED_NODE, simulated_night
from scipy.stats import beta

from campaigns.kinds.health import find_slow_nodes
from campaigns.model.spec import HealthSettings

NOISES = {"normal 3 %": ("normal", 0.03), "normal 10 %": ("normal", 0.10), "t3 3 %": ("t3", 0.03)}


def clopper_pearson(hits: int, n: int) -> list[float]:
    low = beta.ppf(0.025, hits, n - hits + 1) if hits else 0.0
    high = beta.ppf(0.975, hits + 1, n - hits) if hits < n else 1.0
    return [round(float(low), 4), round(float(high), 4)]


def rate(rng: np.random.Generator, nodes: int, history: int, noise: tuple[str, float], nights: int,
         slowed: float = 0.0) -> dict[str, Any]:
    settings, hits, seconds = HealthSettings(), 0, 0.0
    kind, sd = noise
    for _ in range(nights):
        earlier = [simulated_night(rng, nodes, sd, kind) for _ in range(history)]
        tonight = simulated_night(rng, nodes, sd, kind, slowed)
        start = time.perf_counter()
        named = {s.node for s in find_slow_nodes(tonight, earlier, settings)}
        seconds += time.perf_counter() - start
        hits += named == {SLOWED_NODE} if slowed else bool(named)
    return {"nodes": nodes, "records": len(SIZES), "history_nights": history, "nights": nights, "hits": hits,
            "rate": round(hits / nights, 4), "ci95": clopper_pearson(hits, nights),
            "seconds_per_night": round(seconds / nights, 4)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nights", type=int, default=1000)
    parser.add_argument("--power-nights", type=int, default=200)
    parser.add_argument("--output", type=Path, default=REPO / "results" / "reliability" / "fail_slow_error_rates.json")
    args = parser.parse_args(argv[1:])
    rng = np.random.default_rng(20261126)
    false_alarms = []
    for nodes in (3, 100):
        for history in (3, 14):
            for name, noise in NOISES.items():
                row = {"noise": name, **rate(rng, nodes, history, noise, args.nights)}
                print("false alarms", row, flush=True)
                false_alarms.append(row)
    power = []
    for history in (3, 14):
        for drift in (0.1, 0.2, 0.5, 1.0):
            row = {"noise": "normal 3 %", "drift": drift,
                   **rate(rng, 100, history, NOISES["normal 3 %"], args.power_nights, drift)}
            print("power", row, flush=True)
            power.append(row)
    write_result(args.output, argv, {"slow_alpha": HealthSettings().slow_alpha, "false_alarms": false_alarms,
                                     "power": power})
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
