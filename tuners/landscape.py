"""Replay landscapes: the tuner's evaluator played back from MEASURED runs (issue 14), for benchmarking
samplers on what real machines did instead of on an invented model (tuners/synthetic.py).

A landscape file (written by tests/bench/sweep_landscape.py or tests/bench/gpu_landscapes.py) holds
measured points: a configuration (searched knobs only; none set = the library defaults) and every launch
measured at it, each either the per-size median times (us) or a failure. A categorical (or bool) knob's value
that no point measured is never answered: the space searched over a landscape holds only the measured values of each
such knob (ReplayLandscape.measured_catalog: the catalog narrowed to them, for every strategy alike), and a query with
another value is refused (UnmeasuredValueError). Before, such a value was answered by the nearest point with another
value, ties to the first in file order, i.e. the library defaults: on the 100-point Open MPI grid sndbuf 64 KiB with
the basic_linear algorithm (never measured there) replayed at quality 0.98, measured at 0.46 on the grid of every
value. Numeric knobs keep the nearest-neighbour fill: a sampled configuration is
answered by its nearest measured point (per knob: unset vs set or another category = 1, numeric values
|log2 a - log2 b| over the log2 width of the knob's domain, a numeric knob's unset being the value the library then
takes where the catalog names it (unset_equals: 8 MiB is one power of two from NCCL's unset 4 MiB buffer, not as far
as another category); ties to the first point in file order) with
ONE of that point's launches, drawn at random, so launch-to-launch noise, heavy tails and failures are as
measured. On a full grid the nearest point of a grid value is the point itself; between grid values
(a power of two the grid skipped) the landscape is flat up to the nearest measured neighbour.

A point's true objective is the median over its successful launches of the study objective (size buckets
as `buckets`); a point whose every launch failed has none (infinite time).

Measured spellings of one configuration (the same KnobCatalog.effective_env: NCCL_NSOCKS_PERTHREAD unset or 1
with socket threads set, any NCCL_NSOCKS_PERTHREAD without them) are one point with all their launches: the
library ran the same thing, so which spelling drew the luckier launches must not decide what is within 95 % of
the best (results/bench/landscapes/h200x2_nccl_socket_resolution.txt: NCCL's own log of what it ran).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuners.catalog import UNSET, CatalogError, KnobCatalog, KnobType, UnsafeValueError
from tuners.evaluation import Evaluation, FailureKind, SizeBucket, bucket_times_us, overall_time_us
from tuners.space import SearchSpace, SpaceError


class LandscapeError(ValueError):
    """A landscape file that cannot be replayed; the message names the file and what is wrong."""


class UnmeasuredValueError(LandscapeError):
    """A query with a categorical value the landscape never measured: no measured point can answer it."""


@dataclass(frozen=True)
class MeasuredRun:
    """One launch: per-size median times (us), or the failure it ended in."""

    medians_us: Mapping[int, float] | None
    failure: FailureKind | None = None
    reason: str = ""


@dataclass(frozen=True)
class MeasuredPoint:
    env: Mapping[str, str]  # searched knobs that are set; missing = unset
    runs: tuple[MeasuredRun, ...]


class ReplayLandscape:
    def __init__(self, name: str, space: SearchSpace, points: Sequence[MeasuredPoint],
                 buckets: Sequence[SizeBucket]) -> None:
        if not points:
            raise LandscapeError(f"landscape {name}: no measured points")
        self.name = name
        self.space = space
        self.measured = tuple(points)  # as measured: before the spellings of one configuration are pooled
        self.points = self._pooled(points)
        self.buckets = tuple(buckets)
        self.true_us = np.array([self._median_objective(p) for p in self.points])
        if not np.isfinite(self.true_us).any():
            raise LandscapeError(f"landscape {name}: every launch of every point failed")
        self.best_us = float(self.true_us.min())
        self._cache: dict[tuple[tuple[str, str], ...], int] = {}
        self.measured_choices = self._measured_choices()

    @classmethod
    def load(cls, path: Path, space: SearchSpace, buckets: Sequence[SizeBucket]) -> ReplayLandscape:
        try:
            document = json.loads(path.read_text())
            points = []
            for config in document["configs"]:
                env = {k: v for k, v in config["env"].items() if k in space.knob_names}
                runs = tuple(
                    MeasuredRun({int(s): float(t) for s, t in run["median_us"].items()}) if "median_us" in run
                    else MeasuredRun(None, FailureKind(run["failure"]), run.get("reason") or run["failure"])
                    for run in config["runs"])
                if runs:
                    points.append(MeasuredPoint(env, runs))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LandscapeError(f"{path}: not a landscape file ({type(exc).__name__}: {exc})") from exc
        return cls(path.stem, space, points, buckets)

    def _pooled(self, points: Sequence[MeasuredPoint]) -> tuple[MeasuredPoint, ...]:
        """One point per configuration (in the order of its first spelling) with the launches of all its spellings."""
        runs: dict[tuple[tuple[str, str], ...], list[MeasuredRun]] = {}
        for point in points:
            runs.setdefault(self.configuration(point.env), []).extend(point.runs)
        return tuple(MeasuredPoint(dict(key), tuple(launches)) for key, launches in runs.items())

    def configuration(self, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """The configuration env runs, over the searched knobs (KnobCatalog.effective_env), as a sortable key."""
        searched = {k: v for k, v in env.items() if k in self.space.knob_names}
        return tuple(sorted((k, v) for k, v in self.space.effective_env(searched).items() if k in searched))

    def spelling_spread(self) -> tuple[float, float] | None:
        """Median |ln(a/b)| over pairs of successful launches a, b of one measured setting, and over pairs from two
        spellings of one configuration; None where no configuration was measured in two spellings. Where the
        catalog's rule is right (the library runs the spellings alike) the two are alike."""
        groups: dict[tuple[tuple[str, str], ...], list[list[float]]] = {}
        for point in self.measured:
            times = [t for t in self._launch_times_us(point) if math.isfinite(t)]
            groups.setdefault(self.configuration(point.env), []).append(times)
        same = [abs(math.log(a / b)) for spellings in groups.values() for times in spellings
                for a, b in itertools.combinations(times, 2)]
        across = [abs(math.log(a / b)) for spellings in groups.values()
                  for one, other in itertools.combinations(spellings, 2) for a in one for b in other]
        if not same or not across:
            return None
        return float(np.median(same)), float(np.median(across))

    def _launch_times_us(self, point: MeasuredPoint) -> list[float]:
        """The study objective of each launch of `point` (a failed launch: infinite)."""
        return [overall_time_us(bucket_times_us(r.medians_us, self.buckets)) if r.medians_us is not None else math.inf
                for r in point.runs]

    def _median_objective(self, point: MeasuredPoint) -> float:
        values = [t for t in self._launch_times_us(point) if math.isfinite(t)]
        return float(np.median(values)) if values else math.inf

    def _measured_choices(self) -> dict[str, tuple[str, ...]]:
        """Per categorical or bool knob of the space: its choices (UNSET for unset) that a measured setting took, in
        the space's order; a choice equal to the knob's unset_equals counts as measured where unset was, and unset
        where that value was (the library runs them alike)."""
        choices = {}
        for dimension in self.space.dimensions:
            if dimension.numeric:
                continue
            assert dimension.choices is not None
            taken = {point.env.get(dimension.name, UNSET) for point in self.measured}
            alike = dimension.knob.unset_equals
            if alike is not None and taken & {alike, UNSET}:
                taken |= {alike, UNSET}
            choices[dimension.name] = tuple(choice for choice in dimension.choices if choice in taken)
        return choices

    def unmeasured_choices(self) -> dict[str, tuple[str, ...]]:
        """Per categorical or bool knob of the space with choices no measured setting took: those choices."""
        left = {}
        for dimension in self.space.dimensions:
            if not dimension.numeric:
                measured = self.measured_choices[dimension.name]
                if values := tuple(c for c in dimension.choices or () if c not in measured):
                    left[dimension.name] = values
        return left

    def measured_catalog(self, catalog: KnobCatalog) -> KnobCatalog:
        """`catalog` with each categorical knob of the space narrowed to the values this landscape measured (a site's
        `knobs.restrict`), so that a search over it never asks for a value no measured point can answer. Unset, or a
        bool value, never measured cannot be narrowed away: LandscapeError (such a landscape cannot be replayed)."""
        restrict = {}
        for name, values in self.unmeasured_choices().items():
            knob = catalog[name]
            if UNSET in values or knob.type is not KnobType.CATEGORICAL:
                raise LandscapeError(f"landscape {self.name}: {name} {', '.join(values)} never measured, and it cannot "
                                     "be left out of the search space (unset, or a bool value): not replayable")
            restrict[name] = {"choices": [c for c in self.measured_choices[name] if c != UNSET]}
        if not restrict:
            return catalog
        try:
            return catalog.for_site({"restrict": restrict}, f"the values landscape {self.name} measured")
        except CatalogError as exc:  # e.g. a site default no point measured: trial 0 could not be answered
            raise LandscapeError(f"landscape {self.name}: its measured values do not make a search space: {exc}"
                                 ) from exc

    def _distance(self, a: Mapping[str, str], b: Mapping[str, str]) -> float:
        total = 0.0
        for dimension in self.space.dimensions:
            knob = dimension.knob
            # unset_equals: the library's value when unset (the pooling rule already takes that value as unset)
            unset = knob.unset_equals if dimension.numeric else None
            x, y = a.get(dimension.name, unset), b.get(dimension.name, unset)
            if x == y:
                continue
            if x is None or y is None or not dimension.numeric:
                total += 1.0
            else:
                assert knob.low is not None and knob.high is not None
                width = max(math.log2(knob.high) - math.log2(max(knob.low, 1)), 1.0)
                total += abs(math.log2(max(int(x), 1)) - math.log2(max(int(y), 1))) / width
        return total

    @property
    def best_env(self) -> dict[str, str]:
        """The searched knobs set at the point with the best true objective (the first of equals)."""
        return dict(self.points[int(np.argmin(self.true_us))].env)

    def straddling(self, quality: float) -> int:
        """Points with a launch on each side of `quality` x the best (a failure is on the slow side): whether such a
        point counts as within it is decided by which launches were drawn, i.e. by launch noise."""
        line = self.best_us / quality
        return sum(min(times) <= line < max(times) for times in map(self._launch_times_us, self.points))

    def one_knob_changes(self, start: Mapping[str, str]) -> list[dict[str, str]]:
        """The configurations one ladder value of one knob away from `start` (KnobDimension.ladder), each once and
        start's own left out (spellings of one configuration are one), those the catalog's constraints reject too."""
        current = {name: start.get(name) for name in self.space.knob_names}
        seen = {self.configuration(start)}
        changes = []
        for dimension in self.space.dimensions:
            for value in dimension.ladder():
                try:
                    env = self.space.env_from_values({**current, dimension.name: value})
                except (UnsafeValueError, SpaceError):
                    continue
                if (key := self.configuration(env)) not in seen:
                    seen.add(key)
                    changes.append(env)
        return changes

    def one_knob_random_order(self, start: Mapping[str, str], quality: float) -> tuple[int, int, int | None]:
        """What a search knowing nothing needs when it measures `start` and then start's one-knob changes in a
        uniformly random order: (changes, changes within `quality` of the best, median trials until one within it
        is measured, start counted; None where no change is). Exact: with h hits among n changes the first hit
        comes after trial k + 1 with probability C(n - k, h) / C(n, h); the median is the first k where that is
        <= 1/2. A reference for what the landscape allows a prior-free one-knob screen, not a simulation."""
        changes = self.one_knob_changes(start)
        n, hits = len(changes), sum(self.quality(env) >= quality for env in changes)
        if self.quality(start) >= quality:
            return n, hits, 1
        if not hits:
            return n, 0, None
        return n, hits, 1 + next(k for k in range(1, n + 1) if math.comb(n - k, hits) <= math.comb(n, hits) / 2)

    def point_of(self, env: Mapping[str, str]) -> int:
        """Index of the measured point nearest to env (its searched knobs; others are ignored). UnmeasuredValueError
        where env sets a categorical or bool knob to a value (or leaves it unset where unset) no point measured: the
        nearest point would answer for a setting that was never run."""
        for name, measured in self.measured_choices.items():
            if (value := env.get(name, UNSET)) not in measured:
                raise UnmeasuredValueError(f"landscape {self.name}: {name}={value} was never measured (measured: "
                                           f"{', '.join(measured)}); search over ReplayLandscape.measured_catalog")
        key = self.configuration(env)
        if key not in self._cache:
            searched = dict(key)
            self._cache[key] = int(np.argmin([self._distance(searched, p.env) for p in self.points]))
        return self._cache[key]

    def quality(self, env: Mapping[str, str]) -> float:
        """Best true objective over env's true objective (1 = as good as the best point; 0 = always fails)."""
        return self.best_us / float(self.true_us[self.point_of(env)])

    def evaluator(self, seed: int) -> ReplayEvaluator:
        return ReplayEvaluator(self, np.random.default_rng(seed))


class ReplayEvaluator:
    """The tuner's Evaluator over a landscape: one measured launch of the nearest point, at random."""

    def __init__(self, landscape: ReplayLandscape, rng: np.random.Generator) -> None:
        self.landscape = landscape
        self.rng = rng
        self.calls = 0

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        self.calls += 1
        point = self.landscape.points[self.landscape.point_of(env)]
        run = point.runs[int(self.rng.integers(len(point.runs)))]
        if run.medians_us is None:
            assert run.failure is not None
            return Evaluation.failed(run.failure, f"replayed: {run.reason}")
        return Evaluation(times_us={size: [t] for size, t in run.medians_us.items()}, validated=validate)
