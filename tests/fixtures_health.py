"""Simulated nights for health's fail-slow rule: what tests/test_attribution.py and tests/bench/bench_fail_slow.py
judge (one noise model for both)."""
from __future__ import annotations

import numpy as np

from campaigns.kinds.health import NodeTimes

SIZES = (8, 1024, 65536, 1 << 20)  # one record per size
SLOWED_NODE = "n0000"


def simulated_night(rng: np.random.Generator, nodes: int, sd: float, noise: str = "normal",
                    slowed: float = 0.0) -> NodeTimes:
    """Per record every node's time around 100 us, independent per node, record and night: x (1 + sd x a normal
    value), or (noise "t3") x exp(sd x Student's t on 3 degrees of freedom / sqrt(3)): multiplicative, so a time
    stays positive however heavy the tail. SLOWED_NODE's times x (1 + slowed)."""
    names = [f"n{i:04d}" for i in range(nodes)]
    night: NodeTimes = {}
    for size in SIZES:
        if noise == "normal":
            values = 100.0 * (1 + sd * rng.standard_normal(nodes))
        else:
            values = 100.0 * np.exp(sd * rng.standard_t(3, nodes) / np.sqrt(3.0))
        values[0] *= 1 + slowed
        night[("series", "alltoall", "mpi", size, "", tuple(names))] = dict(zip(names, values.tolist()))
    return night
