"""The evaluator protocol between the tuner and whatever runs the benchmark.

An evaluator runs one benchmark sweep (every message size at once) with an environment applied
and returns an `Evaluation`: per message size (bytes) the time samples in microseconds, or why
there are none. Goodput is bytes / time, so "higher median goodput" and "lower median time" rank
settings identically; the tuner works on median times and reports gains as speed-ups.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

LATENCY_BELOW_BYTES = 64 * 1024  # buckets up to this size are reported as latency, above as goodput


class FailureKind(enum.StrEnum):
    TIMEOUT = "timeout"  # hung: killed by the executor's or the benchmark's time limit
    INVALID = "invalid"  # ran, but data validation failed or the library rejected the setting
    FAILED = "failed"  # crashed, could not launch, or any other error


class EvaluationAborted(RuntimeError):
    """The evaluator could not run or record a trial for a reason that is not the setting's (e.g. its
    results database is unreachable): the tuner queues the setting again and stops, instead of
    charging a failure to the setting."""


@dataclass(frozen=True)
class Evaluation:
    """Result of one benchmark run. `times_us[bytes]` holds that size's samples (per iteration or
    per repeat; the tuner uses their median). `validated` is True only if data validation ran and
    every record passed."""

    times_us: Mapping[int, Sequence[float]] = field(default_factory=dict)
    failure: FailureKind | None = None
    reason: str = ""
    validated: bool = False
    record_ids: tuple[str, ...] = ()
    # knobs set that the library's read log did not show: on an INVALID run among them a change from the baseline,
    # on a complete one only knobs at the baseline's value (inert on this path)
    unread: tuple[str, ...] = ()
    allocation: str | None = None  # the batch allocation (Slurm job id) the run ran in, when known

    def __post_init__(self) -> None:
        if self.failure is None:
            if not self.times_us:
                raise ValueError("a successful Evaluation needs at least one message size")
            for size, samples in self.times_us.items():
                if size < 0 or not len(samples):
                    raise ValueError(f"size {size}: needs a non-negative size and at least one sample")
                if not all(math.isfinite(s) and s > 0 for s in samples):
                    raise ValueError(f"size {size}: samples must be finite positive times in microseconds")
        elif not self.reason:
            raise ValueError("a failed Evaluation needs a reason")

    @classmethod
    def failed(cls, kind: FailureKind, reason: str, record_ids: Sequence[str] = (),
               unread: Sequence[str] = ()) -> Evaluation:
        return cls(failure=kind, reason=reason, record_ids=tuple(record_ids), unread=tuple(unread))

    @property
    def ok(self) -> bool:
        return self.failure is None

    def median_us(self) -> dict[int, float]:
        # statistics.median: the same value as np.median, ~10x faster on short lists (bench_finalize)
        return {size: float(statistics.median(samples)) for size, samples in sorted(self.times_us.items())}


class Evaluator(Protocol):
    """Runs the benchmark with `env` added to the job environment. `validate=True` asks for a run
    with data validation on (commbench --check); the result's `validated` says whether it passed.
    Must not raise for a bad setting: a hang, crash or rejection is an `Evaluation.failed(...)`."""

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation: ...


class MissingSizes(ValueError):
    """A run did not measure every size it was asked for: it cannot be scored beside runs that did."""


@dataclass(frozen=True)
class SizeBucket:
    """A message-size range scored as one number: the geometric mean of its sizes' median times."""

    name: str
    min_bytes: int
    max_bytes: int
    # The sizes requested in the range (buckets_for_sizes): a run is scored only when it measured each of
    # them. Empty for a range given by hand: any measured size inside it counts.
    sizes: tuple[int, ...] = ()

    @property
    def metric(self) -> Literal["latency", "goodput"]:
        return "latency" if self.max_bytes <= LATENCY_BELOW_BYTES else "goodput"

    def contains(self, size: int) -> bool:
        return self.min_bytes <= size <= self.max_bytes


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def buckets_for_sizes(sizes: Sequence[int], sizes_per_bucket: int = 4) -> tuple[SizeBucket, ...]:
    """Groups the measured sizes (ascending) into contiguous buckets of `sizes_per_bucket` sizes,
    never mixing latency-sized and goodput-sized messages. Ranges cover exactly the measured span:
    a bucket starts one byte after the previous bucket's largest size."""
    ordered = sorted(set(sizes))
    if not ordered:
        raise ValueError("no message sizes")
    groups: list[list[int]] = []
    for size in ordered:
        small = size <= LATENCY_BELOW_BYTES
        if groups and len(groups[-1]) < sizes_per_bucket and (groups[-1][-1] <= LATENCY_BELOW_BYTES) == small:
            groups[-1].append(size)
        else:
            groups.append([size])
    buckets = []
    for index, group in enumerate(groups):
        low = group[0] if index == 0 else groups[index - 1][-1] + 1
        buckets.append(SizeBucket(f"{format_bytes(group[0])}-{format_bytes(group[-1])}", low, group[-1], tuple(group)))
    return tuple(buckets)


def bucket_times_us(medians: Mapping[int, float], buckets: Sequence[SizeBucket]) -> dict[str, float]:
    """Geometric mean of the median times of each bucket's requested sizes (of every measured size in
    its range when it names none). A requested size not measured, or a bucket with no measured size,
    raises MissingSizes: a run scored on fewer sizes would compare unlike with one scored on all (a
    missing large size reads as a faster run)."""
    missing = [size for bucket in buckets for size in bucket.sizes if size not in medians]
    if missing:
        raise MissingSizes(f"requested size(s) {', '.join(format_bytes(s) for s in missing)} not measured")
    scores = {}
    for bucket in buckets:
        inside = [t for size, t in medians.items() if (size in bucket.sizes if bucket.sizes else bucket.contains(size))]
        if not inside:
            raise MissingSizes(
                f"no measured size falls into bucket {bucket.name} [{bucket.min_bytes}, {bucket.max_bytes}]"
            )
        scores[bucket.name] = float(np.exp(np.mean(np.log(inside))))
    return scores


def overall_time_us(bucket_scores: Mapping[str, float]) -> float:
    """The study objective: geometric mean over buckets, so every bucket's relative change counts
    the same whatever its absolute time."""
    return float(np.exp(np.mean(np.log(list(bucket_scores.values())))))
