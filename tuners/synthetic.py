"""SYNTHETIC knob landscape: a UNIT-TEST FIXTURE ONLY (plumbing of the tuner tests). Not a measurement
and not evidence for any sampler. Issue 14's review: it is separable (a product of one factor per knob,
so a joint model has nothing to gain), models NCCL_PROTO=^LL128 as faster than NCCL's defaults (on the
H200 the defaults were the best setting measured), has 1-3 % noise per sample where real socket runs
vary ~10 % run to run, and no failures.

Its shape follows the knob effects measured on the H200 machine (shared/notes/gpu-device.md,
allreduce, 4 GPUs): channels 1/4/8 -> 25/98/189 GB/s of 341, NTHREADS=64 -> 161, PROTO LL/LL128/
Simple -> 149/316/340 at 256 MiB but LL ahead at small sizes, Tree -> 234, BUFFSIZE 16 MiB ~ no
change, IGNORE_CPU_AFFINITY no change; and on the Socket "network" path between two processes
defaults of ~3.3 GB/s with more than 2.5x available from socket threading. The numbers below are
interpolations of those anchors, with multiplicative log-normal noise (1-3 %) on every sample.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tuners.catalog import UNSET, KnobCatalog, KnobType, Library
from tuners.evaluation import Evaluation, SizeBucket, bucket_times_us, overall_time_us
from tuners.space import KnobDimension, SearchSpace, build_space

SYNTHETIC_KNOBS = (
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MAX_CTAS",
    "NCCL_BUFFSIZE",
    "NCCL_NTHREADS",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_IGNORE_CPU_AFFINITY",
)
SYNTHETIC_SIZES = tuple(2**e for e in range(3, 31, 3))  # 8 B .. 1 GiB

# Bandwidth factors (x default) read off gpu-device.md, interpolated in log2 of the knob value.
_CHANNEL_POINTS = ((1, 25 / 341), (4, 98 / 341), (8, 189 / 341), (16, 0.85), (32, 1.0), (64, 1.0))
_NTHREADS_FACTOR = {64: 161 / 341, 128: 0.8, 256: 0.97, 512: 1.0}
_BUFFSIZE_NVLINK = ((2**16, 0.55), (2**18, 0.8), (2**20, 0.93), (2**22, 1.0), (2**24, 335 / 341), (2**27, 0.96))
_BUFFSIZE_SOCKET = ((2**16, 0.6), (2**18, 0.8), (2**20, 0.92), (2**22, 1.0), (2**24, 1.12), (2**27, 1.08))
_PROTO_BW = {"LL": 149 / 340, "LL128": 316 / 340, "Simple": 1.0}
_PROTO_LATENCY = {"LL": 0.55, "LL128": 0.75, "Simple": 1.25}


def _interp_log2(value: float, points: tuple[tuple[int, float], ...]) -> float:
    xs = np.log2([p[0] for p in points])
    return float(np.interp(np.log2(value), xs, [p[1] for p in points]))


@dataclass(frozen=True)
class Scenario:
    name: str
    peak_gbs: float  # bus bandwidth with the library defaults at large sizes
    latency_us: float
    socket: bool  # the Socket network path: socket threading matters, channels saturate early
    site_defaults: Mapping[str, str]  # planted site defaults (trial 0)


SCENARIOS = {
    # NVLink node, defaults near-best, a site default that throttles channels and forces LL.
    "nvlink-bad-default": Scenario(
        "nvlink-bad-default", 341.0, 24.0, False, {"NCCL_MAX_CTAS": "4", "NCCL_PROTO": "LL"}
    ),
    # Socket path: library defaults far from best (socket threads), plus a too-small buffer.
    "socket-path": Scenario("socket-path", 3.3, 60.0, True, {"NCCL_BUFFSIZE": "65536"}),
}


def true_time_us(scenario: Scenario, env: Mapping[str, str], size: int) -> float:
    """Noise-free time of one allreduce of `size` bytes under `env` (synthetic)."""
    proto = env.get("NCCL_PROTO")
    algo = env.get("NCCL_ALGO")
    bw = scenario.peak_gbs
    if "NCCL_MAX_CTAS" in env:
        channels = int(env["NCCL_MAX_CTAS"])
        bw *= (0.7 if channels == 1 else 1.0) if scenario.socket else _interp_log2(channels, _CHANNEL_POINTS)
    if "NCCL_NTHREADS" in env:
        bw *= _NTHREADS_FACTOR[int(env["NCCL_NTHREADS"])] ** (0.3 if scenario.socket else 1.0)
    if "NCCL_BUFFSIZE" in env:
        bw *= _interp_log2(int(env["NCCL_BUFFSIZE"]), _BUFFSIZE_SOCKET if scenario.socket else _BUFFSIZE_NVLINK)
    if scenario.socket:
        sockets = min(64, int(env.get("NCCL_SOCKET_NTHREADS", "1")) * int(env.get("NCCL_NSOCKS_PERTHREAD", "1")))
        bw *= min(2.7, 1 + 1.7 * np.log2(sockets) / 3) * (0.9 if sockets > 32 else 1.0)
    latency = scenario.latency_us
    if proto in _PROTO_BW:
        bw *= _PROTO_BW[proto]
        latency *= _PROTO_LATENCY[proto]
    elif proto == "^LL128":
        latency *= _PROTO_LATENCY["LL"]
    if algo == "Tree":
        bw *= 234 / 337
        latency *= 0.8
    return latency + size / (bw * 1e3)  # GB/s = 1e3 bytes/us


class SyntheticEvaluator:
    """Evaluator over the synthetic landscape: `samples` noisy samples per size (SYNTHETIC)."""

    def __init__(self, scenario: Scenario, *, noise: float = 0.02, samples: int = 5, seed: int = 0) -> None:
        self.scenario = scenario
        self.noise = noise
        self.samples = samples
        self.rng = np.random.default_rng(seed)
        self.calls = 0

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        self.calls += 1
        times = {
            size: (true_time_us(self.scenario, env, size) * self.rng.lognormal(0.0, self.noise, self.samples)).tolist()
            for size in SYNTHETIC_SIZES
        }
        return Evaluation(times_us=times, validated=validate)


def synthetic_space(catalog: KnobCatalog | None = None, scenario: Scenario | None = None) -> SearchSpace:
    """The benchmark's search space: NCCL 2.28.3 knobs (categorical, int, pow2, bool) with the
    scenario's planted site defaults."""
    base = catalog if catalog is not None else KnobCatalog.load()
    if scenario is not None:
        overrides = {"defaults": dict(scenario.site_defaults), "restrict": {"NCCL_ALGO": {"choices": ["Ring", "Tree"]}}}
        base = base.for_site(overrides, f"synthetic scenario {scenario.name}")
    return build_space(base, {Library.NCCL: "2.28.3"}, knobs=SYNTHETIC_KNOBS)


def true_objective_us(scenario: Scenario, env: Mapping[str, str], buckets: Sequence[SizeBucket]) -> float:
    """The study objective of `env` without noise."""
    medians = {size: true_time_us(scenario, env, size) for size in SYNTHETIC_SIZES}
    return overall_time_us(bucket_times_us(medians, buckets))


def optimum_env(scenario: Scenario, space: SearchSpace, buckets: Sequence[SizeBucket]) -> dict[str, str]:
    """Exact optimum of the landscape over `space`. The model is latency(algo, proto) + size / bw
    with bw a product of per-knob factors (the two socket knobs act through their product), so for
    each (algo, proto) the best bw comes from each factor's best value on its own."""
    options = {d.name: _values(d) for d in space.dimensions}
    probe = 1 << 30

    def best_value(*names: str) -> dict[str, str | None]:
        grid = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(options[n] for n in names))]
        return min(grid, key=lambda values: true_time_us(scenario, _env(values), probe))

    fixed: dict[str, str | None] = {}
    for names in (
        ("NCCL_MAX_CTAS",),
        ("NCCL_BUFFSIZE",),
        ("NCCL_NTHREADS",),
        ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"),
    ):
        fixed.update(best_value(*names))
    candidates = [
        space.env_from_values({**fixed, "NCCL_ALGO": algo, "NCCL_PROTO": proto})
        for algo in options["NCCL_ALGO"]
        for proto in options["NCCL_PROTO"]
    ]
    return min(candidates, key=lambda env: true_objective_us(scenario, env, buckets))


def _values(dimension: KnobDimension) -> list[str | None]:
    knob = dimension.knob
    if dimension.choices is not None:
        return [None if c == UNSET else c for c in dimension.choices]
    assert knob.low is not None and knob.high is not None
    if knob.type is KnobType.POW2:
        numbers = [2**e for e in range(knob.low.bit_length() - 1, knob.high.bit_length())]
    else:
        numbers = list(knob.search_values or range(knob.low, knob.high + 1, knob.step))
    return ([None] if knob.allow_unset else []) + [str(n) for n in numbers]


def _env(values: Mapping[str, str | None]) -> dict[str, str]:
    return {name: value for name, value in values.items() if value is not None}
