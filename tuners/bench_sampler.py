"""Sampler benchmark on MEASURED replay landscapes (tuners/landscape.py; issue 14).

For each landscape (results/bench/landscapes/*.json), search strategy and seed: a search of `--trials` trials
in which every trial is answered with one measured launch of the nearest measured point (noise, heavy tails
and failures as measured). Every strategy searches the space `commcamp tune` searched for the measured scope: the
catalog of the site that the landscape's tune spec names, with that spec's knob override files (e.g. socket threads
and sockets per thread 1-8, NCCL_ALGO Ring or Tree), then the scenario's site defaults; a landscape file without a
`spec` names its tune's tool spec and phase in SCENARIOS (spec_from); each categorical knob narrowed to the values the
landscape measured (ReplayLandscape.measured_catalog: a value no point measured could only be answered by another
value's point, ties to the library defaults; numeric values between measured ones keep the nearest-neighbour fill).
Trial 0 of every strategy is the site defaults (what the tool always measures first). Strategies:

- shipped: the real `Tuner` with the search settings `commcamp tune` ships: of campaigns.tuning.spec.TuningSpec's
  defaults only sampler, n_startup_trials, screen_trials (the one-knob screen of tuners/screen.py) and
  seed_library_defaults (the library defaults as trial 1); the scope, catalog and objective are the measured
  tune's spec, as above and below, not TuningSpec's defaults (sizes_per_bucket 2); the scenarios are a site
  without documented settings (a site catalog's `documented` settings are never enqueued) and, but for
  cpu-openmpi-3node-warm, without published winners to warm-start from); the Tuner's seed is the benchmark
  seed's stream: each benchmark seed is one draw of the screen's order, as `tune` draws it for each new study
  (TuningSpec.seed None; shipped_settings refuses a fixed default, whose one order would be what ships);
- tpe, gp, random: the real `Tuner` with that sampler, the same start-up trials, NO screen and NO seed (like
  shipped, none launches a setting it measured before);
- sobol: optuna's QMCSampler (scrambled Sobol; the conditional parameters of unset-able numeric knobs fall
  back to its independent random sampler), with the Tuner's repeat rule: a configuration it measured before is
  not launched again and does not count;
- coordinate: one knob at a time from the site defaults (knob and value order shuffled per seed; every value
  of a knob, then keep the best observed; repeat), int knobs without listed values on a power-of-two ladder; once
  converged (a pass measures nothing new) it restarts from a random unmeasured configuration, so that it spends the
  budget as the others do (before, it stopped after 19-23 of 30 trials and a seed that had not reached 95 % scored
  as never).

Every strategy draws on its own stream per seed (stream_seed: sampler, screen, order and replayed launches), so that
no two strategies share random numbers.

The random reference: random sampling with the random cells' settings on a stream of its own (REFERENCE), over
--reference-seeds seeds (REFERENCE_SEEDS), once per group of the run's scenarios on which random searches alike
(reference_group: the same landscape file, site defaults and tune spec; random takes no warm start). Issue 14's target
and the tests below judge shipped against it, not against the random cell's --seeds seeds: a median over 50 seeds
is noisy (cpu-openmpi-3node-warm: 29 over 50 seeds, 23 over 2,000).

Shipped vs random, per landscape: one-sided Mann-Whitney U test that the shipped configuration needs fewer trials
to 95 % than random sampling (shipped's per-seed values vs the random reference's, each test saying how many seeds of
which; a search that never got there = budget + 1, a tie at the worst rank), Holm over the landscapes of the run at
FAMILY_ALPHA; once counting every trial and once for the search alone (the `unseeded` counting on both sides, its own
Holm family: a win of the library-defaults seed or a warm start is not the search's); beside each the test's power
against the target effect (random's per-seed values halved, resampled), so a 'not shown' says whether the benchmark
could have shown it. And shipped's median over random's with a 95 % percentile-bootstrap interval (each side's seeds
resampled on their own, BOOTSTRAP_REPLICATES times): the target asks for <= 0.5, so an interval on one side of 0.5
says the verdict is not an accident of the seeds run, and one across it says they cannot tell.

Objective (the study's, and what a point's quality is measured in): the measured tune spec's, its sizes in buckets of
its sizes_per_bucket (every committed landscape's tune used 1).

Metric: the trial (1-based) at which the search first MEASURED (successfully) a configuration whose TRUE
quality (landscape best median / the configuration's median, not the noisy sample) is >= 95 %; a search
that never did counts as budget + 1. `unseeded` is the same counting only trials that are neither trial 0
(site defaults) nor seeded (library defaults, documented, warm start) nor answered by a replay point a seeded trial
already measured (where the landscape is sparse, a change the seed's point answers), so the seed's contribution shows
separately. Also: the true quality of the
incumbent (best observed) at the end.

    python -m tuners.bench_sampler [--seeds 50] [--trials 30] [--reference-seeds 1000] [--landscapes ...]
                                   [--samplers ...] [--out results/bench/sampler_benchmark.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import platform
import subprocess
import time
import warnings
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState
from scipy.stats import mannwhitneyu

from tuners.catalog import KnobCatalog, Library, UnsafeValueError
from tuners.evaluation import Evaluation, buckets_for_sizes, bucket_times_us, overall_time_us
from tuners.finalize import holm
from tuners.landscape import LandscapeError, ReplayLandscape
from tuners.scope import StudyScope
from tuners.space import SearchSpace, SpaceError, build_space
from tuners.study import ENV, MAX_REPEATS, RANDOM_DRAWS, ROLE, Tuner, is_counted, same_configuration
from tuners.writers import write_atomic

TARGET_QUALITY = 0.95
# Also counted: on the fully measured Open MPI grid the points next to the best were within one or two standard
# errors of its median, and its first "best" regressed when its fastest points were measured again
# (results/bench/landscapes/localslurm_openmpi_wide.json, `confirmations`): whether a point clears 95 % is partly
# launch noise, so 90 % is reported beside it.
SECOND_QUALITY = 0.90
FAMILY_ALPHA = 0.05  # shipped vs random, Holm over the landscapes of one run
POWER_REPLICATES = 1000
BOOTSTRAP_REPLICATES = 2000
SEEDS_PER_TASK = 5
# Random sampling ignores the seeded trials and warm starts, so its distribution on a landscape (under one catalog and
# site defaults) is cheap to estimate well: the target is judged against its median over this many seeds (the random
# reference, REFERENCE), not over the 50 of the strategy table (on cpu-openmpi-3node-warm: 29 over 50, 23 over 2,000)
REFERENCE_SEEDS = 1000
REFERENCE_SEEDS_PER_TASK = 50
REFERENCE = "random-reference"  # its stream's name (stream_seed), apart from the random cells'
LANDSCAPE_DIR = Path("results/bench/landscapes")
STRATEGIES = ("shipped", "random", "sobol", "coordinate", "tpe", "gp")
class Scenario(NamedTuple):
    stem: str  # the landscape file's
    site_defaults: Mapping[str, str] | None = None  # trial 0; None = the file's own
    # a related scope's landscape (same system and library, another node count): its best point is the shipped
    # search's warm start (tuners/study.py WARM_START), as `commcamp tune` enqueues a published winner
    warm_from: str | None = None
    held_out: str = ""  # what the landscape was not used to choose (tuners/screen.py's design), if anything
    # For a landscape file without `spec` (written before landscapes recorded the tune they measured): the tool
    # spec file and phase that ran that tune (campaigns/tools/tuning_demo.py: its `common` fields, then the phase's)
    spec_from: tuple[str, str] | None = None


_FIRST_ROUND = ("measured after the screen's first round was designed; seeds 0-19 of cpu-openmpi-3node (with and "
                "without the warm start) chose its second round")
_ROUNDS = "measured after the screen's design, both rounds, was fixed"
# KnobCatalog.effective_env (NCCL's code and its own log: results/bench/landscapes/h200x2_nccl_socket_resolution.txt)
_SEEN = "; seen before the catalog's one-configuration rule (unset_equals, inert_unless_set) was added"
_RULE = "measured after the screen's design and the catalog's one-configuration rule were fixed"
SCENARIOS: dict[str, Scenario] = {
    "cpu-openmpi": Scenario("localslurm_openmpi"),
    "cpu-openmpi-bad-site-default": Scenario("localslurm_openmpi", {"OMPI_MCA_btl_tcp_sndbuf": "4096",
                                                                     "OMPI_MCA_btl_tcp_rcvbuf": "4096"}),
    "cpu-openmpi-grid48": Scenario("localslurm_openmpi_grid48"),
    "h200-nvlink-demo2": Scenario("h200_nvlink_demo2", spec_from=("tools/tuning/gpu-demo.yaml", "demo2")),
    "h200-socket-demo3": Scenario("h200_socket_demo3", spec_from=("tools/tuning/gpu-demo.yaml", "demo3")),
    "h200x2-socket-256": Scenario("h200x2_socket_256", spec_from=("tools/tuning/gpu-socket-x2.yaml", "socket256-1")),
    "h200x2-socket-grid": Scenario("h200x2_socket_grid"),
    "cpu-openmpi-wide": Scenario("localslurm_openmpi_wide"),
    "cpu-mpich": Scenario("localslurm_mpich"),
    "h200x4-socket-demo3-grid": Scenario("h200x4_socket_demo3_grid", held_out=_FIRST_ROUND + _SEEN),
    "cpu-openmpi-3node": Scenario("localslurm_openmpi_3node", held_out=_FIRST_ROUND),
    "cpu-openmpi-3node-warm": Scenario("localslurm_openmpi_3node", warm_from="localslurm_openmpi",
                                       held_out=_FIRST_ROUND),
    # the 100-point grid of cpu-openmpi measured again 3 days later
    "cpu-openmpi-remeasured": Scenario("localslurm_openmpi_remeasured", held_out=_ROUNDS),
    # every value of the search's ladder measured (1372 points): no trial is answered by a neighbouring point
    "cpu-openmpi-fine": Scenario("localslurm_openmpi_fine", held_out=_RULE),
    "h200x4-nvlink-grid": Scenario("h200x4_nvlink_grid", held_out=_ROUNDS),
    # the 140-point grid of h200x2-socket-grid measured again on another 2x H200 machine, 5 hours later
    "h200x2-socket-grid-remeasured": Scenario("h200x2_socket_grid_remeasured", held_out=_ROUNDS + _SEEN),
    # the same grid a third time, on a 2x H200 machine lent 2.5 hours after the second (NIC virtio, as the others)
    "h200x2-socket-grid-third": Scenario("h200x2_socket_grid_third", held_out=_RULE),
    # a fourth time, on a 2x H200 machine lent 2026-11-26 11:41 (3 hours after the third)
    "h200x2-socket-grid-fourth": Scenario("h200x2_socket_grid_fourth", held_out=_RULE),
    # a fifth time, on a 2x H200 machine lent 2026-11-26 15:15 (asked for 2x H100, given 2x H200)
    "h200x2-socket-grid-fifth": Scenario("h200x2_socket_grid_fifth", held_out=_RULE),
    # a sixth time, on a 2x H200 machine lent 2026-11-27 11:30 (asked for 2x H100, given 2x H200): the scope as one
    # host of 2 GPUs (the tool config's 2 nodes of the one-node h200 site were refused since d8a432a), 324 launches
    "h200x2-socket-grid-sixth": Scenario("h200x2_socket_grid_sixth", held_out=_RULE),
    # demo2's planted site (site_configs/knobs/planted/nccl-ctas2-ll.yaml) on the full grid
    "h200x4-nvlink-grid-planted": Scenario("h200x4_nvlink_grid", {"NCCL_MAX_CTAS": "2", "NCCL_PROTO": "LL"},
                                           held_out=_ROUNDS),
}


@dataclass(frozen=True)
class Trial:
    env: Mapping[str, str]
    observed_us: float | None  # None: the replayed launch failed
    seeded: bool  # trial 0 (site defaults) or an enqueued seed


def shipped_settings() -> dict[str, Any]:
    """What `commcamp tune` ships (one home: TuningSpec's defaults)."""
    from campaigns.tuning.spec import TuningSpec

    fields = TuningSpec.model_fields
    if fields["seed"].default is not None:
        raise ValueError(f"TuningSpec.seed defaults to {fields['seed'].default}: every study then screens in that one "
                         "order, and the benchmark's per-seed draws are not what ships")
    return {name: fields[name].default
            for name in ("sampler", "n_startup_trials", "screen_trials", "seed_library_defaults")}


# The fields of a landscape's tune spec that decide what the benchmark replays: the scope's site and knob override
# files (the catalog: domains, pins, defaults) and its sizes and sizes per bucket (the objective); its executor and
# launcher only so that the spec validates (transport ccl runs on the launcher executor).
SPEC_SCOPE = ("site", "system", "library", "op", "transport", "sizes", "sizes_per_bucket", "knob_overrides",
              "executor", "launcher")


def tune_spec(name: str, document: Mapping[str, Any], path: Path) -> tuple[Any, str]:
    """The spec of the tune the scenario's landscape measured (campaigns.tuning.spec.TuningSpec, its SPEC_SCOPE
    fields; knob override files relative to the checkout), and where it was read: the landscape's `spec`, or the
    tool spec and phase its Scenario names (spec_from). LandscapeError when there is none or it cannot be rebuilt
    here (a site or an override file that no longer exists)."""
    from campaigns import paths
    from campaigns.model.yamlio import YamlDocument, YamlModelError
    from campaigns.tuning.spec import TuningSpec

    spec_from = SCENARIOS[name].spec_from
    if "spec" in document:
        fields, source = document["spec"], f"{path} `spec`"
    elif spec_from is not None:
        file, phase = spec_from
        source = f"{file} phase {phase}"
        try:
            config = YamlDocument(paths.DATA_ROOT / file).data or {}
            fields = {**config.get("common", {}), **config["phases"][phase].get("spec", {})}
        except (YamlModelError, KeyError, TypeError, AttributeError) as exc:
            raise LandscapeError(f"benchmark scenario {name}: {path} has no `spec`, and its tune's spec {source} "
                                 f"cannot be read ({type(exc).__name__}: {exc})") from exc
    else:
        raise LandscapeError(f"benchmark scenario {name}: {path} has no `spec` (the tune it measured) and the "
                             "scenario names none (Scenario.spec_from)")
    scope = {key: fields[key] for key in SPEC_SCOPE if key in fields}
    if sorted(fields.get("sizes", [])) != sorted(document["sizes"]) or fields.get("knobs", document["knobs"]) != \
            document["knobs"]:
        raise LandscapeError(f"benchmark scenario {name}: the tune spec {source} is not the one {path} measured "
                             f"(sizes {fields.get('sizes')}, knobs {fields.get('knobs')}; the landscape's "
                             f"{document['sizes']}, {document['knobs']})")
    overrides = [Path(file) for file in scope.get("knob_overrides", [])]
    missing = [str(file) for file in overrides if not (paths.DATA_ROOT / file).is_file()]
    if missing:
        raise LandscapeError(f"benchmark scenario {name}: the knob override file(s) {', '.join(missing)} named by "
                             f"{source} no longer exist(s): the measured tune's catalog cannot be rebuilt")
    try:
        return TuningSpec.model_validate({**scope, "knob_overrides": [paths.DATA_ROOT / f for f in overrides]}), source
    except ValueError as exc:
        raise LandscapeError(f"benchmark scenario {name}: the tune spec {source} cannot be rebuilt here: "
                             f"{exc}") from exc


def scenario_catalog(name: str, document: Mapping[str, Any], path: Path) -> tuple[KnobCatalog, Any, str]:
    """The catalog `commcamp tune` searched for the measured scope (the spec's site catalog and knob override files,
    campaigns.tuning.spec.site_catalog) with the scenario's site defaults (trial 0) on top; also the spec and where
    it was read. The site's documented settings stay in the catalog but are never enqueued (run_tuner)."""
    from campaigns.tuning.spec import site_catalog

    spec, source = tune_spec(name, document, path)
    try:
        catalog, _ = site_catalog(spec)
    except ValueError as exc:  # an unknown site, a site.yaml or override file with problems
        raise LandscapeError(f"benchmark scenario {name}: the catalog of the tune spec {source} (site "
                             f"{spec.site!r}) cannot be rebuilt here: {exc}") from exc
    scenario = SCENARIOS[name]
    defaults = document.get("site_defaults", {}) if scenario.site_defaults is None else scenario.site_defaults
    if defaults:
        catalog = catalog.for_site({"defaults": dict(defaults)}, f"benchmark scenario {name}")
    return catalog, spec, source


def landscape_of(path: Path, name: str, space: SearchSpace | None = None) -> tuple[ReplayLandscape, dict[str, Any]]:
    """The landscape file `path` replayed under scenario `name`'s catalog (or `space`), its objective the measured
    tune's (its spec's sizes in buckets of its sizes per bucket). Without `space`, the catalog's categorical knobs
    are narrowed to the values the file measured (ReplayLandscape.measured_catalog), so that no strategy asks for a
    value the replay could answer only with another value's point."""
    document = json.loads(path.read_text())
    catalog, spec, _ = scenario_catalog(name, document, path)
    buckets = buckets_for_sizes(document["sizes"], spec.sizes_per_bucket)
    if space is not None:
        return ReplayLandscape.load(path, space, buckets), document
    versions = {Library(document["library"]): document["library_version"]}
    full = ReplayLandscape.load(path, build_space(catalog, versions, knobs=document["knobs"]), buckets)
    try:
        space = build_space(full.measured_catalog(catalog), versions, knobs=document["knobs"])
    except SpaceError as exc:  # a categorical knob measured at one value only
        raise LandscapeError(f"benchmark scenario {name}: {path} measured too few values: {exc}") from exc
    return ReplayLandscape(full.name, space, full.measured, buckets), document


def unnarrowed(path: Path, name: str, document: Mapping[str, Any] | None = None) -> ReplayLandscape:
    """The landscape file `path` under scenario `name`'s catalog as the tune searched it, before landscape_of narrows
    its categorical knobs to the measured values: what the measured tune's space held that the file did not measure
    (ReplayLandscape.unmeasured_choices)."""
    document = json.loads(path.read_text()) if document is None else document
    catalog, spec, _ = scenario_catalog(name, document, path)
    space = build_space(catalog, {Library(document["library"]): document["library_version"]}, knobs=document["knobs"])
    return ReplayLandscape.load(path, space, buckets_for_sizes(document["sizes"], spec.sizes_per_bucket))


def load_scenario(name: str, directory: Path) -> tuple[ReplayLandscape, dict[str, Any]]:
    return landscape_of(directory / f"{SCENARIOS[name].stem}.json", name)


def warm_starts(name: str, landscape: ReplayLandscape, directory: Path) -> list[tuple[Mapping[str, str], str]]:
    """The scenario's warm start: the best point of the related scope's landscape (none without one), under the
    related tune's objective."""
    related = SCENARIOS[name].warm_from
    if related is None:
        return []
    path = directory / f"{related}.json"
    winner, _ = landscape_of(path, name, landscape.space)
    return [(winner.best_env, f"the best point of {path}")]


def replay_objective_us(evaluation: Evaluation, landscape: ReplayLandscape) -> float | None:
    """The study objective of a replayed launch (None: it failed)."""
    if not evaluation.ok:
        return None
    return overall_time_us(bucket_times_us(evaluation.median_us(), landscape.buckets))


def run_tuner(landscape: ReplayLandscape, document: Mapping[str, Any], settings: Mapping[str, Any], seed: int,
              trials: int, warm: Sequence[tuple[Mapping[str, str], str]] = ()) -> list[Trial]:
    """The real Tuner with `settings` (shipped_settings()'s keys) and the warm starts `warm` on the landscape."""
    scope = StudyScope(site="replay", system=landscape.name.replace("_", "-"), library=Library(document["library"]),
                       library_version=document["library_version"], op="allreduce", transport="replay", nodes=2,
                       gpus_per_node=1)
    tuner = Tuner(scope, landscape.space, landscape.evaluator(seed), optuna.storages.InMemoryStorage(),
                  landscape.buckets, n_trials=trials, sampler=str(settings["sampler"]), seed=seed,
                  n_startup_trials=settings["n_startup_trials"], screen_trials=settings["screen_trials"],
                  seed_envs=[{}] if settings["seed_library_defaults"] else [], warm_starts=warm)  # no documented
    study = tuner.run()
    counted = sorted((t for t in study.get_trials(deepcopy=False) if is_counted(t)), key=lambda t: t.number)
    return [Trial(t.user_attrs[ENV], t.values[0] if t.state is TrialState.COMPLETE else None,
                  bool(t.user_attrs.get(ROLE))) for t in counted]


def run_sobol(landscape: ReplayLandscape, seed: int, trials: int) -> list[Trial]:
    """Scrambled Sobol with the Tuner's repeat rule (tuners/study.py): a proposal of a configuration it measured
    before (tuners.study.same_configuration) is told the earlier result, is not launched and does not count, and the
    next point is drawn (Sobol's points are already spread, so it needs no switch to random draws); after MAX_REPEATS +
    RANDOM_DRAWS repeats in a row the search ends."""
    space = landscape.space
    evaluate = landscape.evaluator(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        study = optuna.create_study(sampler=optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed,
                                                                       warn_independent_sampling=False))
    baseline = space.catalog.default_env(space.knob_names)
    study.enqueue_trial(space.params_for_env(baseline))
    history: list[Trial] = []
    repeats = 0
    while len(history) < trials and repeats < MAX_REPEATS + RANDOM_DRAWS:
        trial = study.ask()
        env = space.suggest(trial)
        earlier = next((t for t in history if same_configuration(space, env, [t.env])), None)
        if earlier is not None:
            repeats += 1
            study.tell(trial, earlier.observed_us,
                       state=TrialState.COMPLETE if earlier.observed_us is not None else TrialState.FAIL)
            continue
        repeats = 0
        observed = replay_objective_us(evaluate(env), landscape)
        study.tell(trial, observed, state=TrialState.COMPLETE if observed is not None else TrialState.FAIL)
        history.append(Trial(env, observed, not history))
    return history


RESTART_DRAWS = 1000  # coordinate descent: random draws for an unmeasured restart point before it gives up


def run_coordinate(landscape: ReplayLandscape, seed: int, trials: int) -> list[Trial]:
    """Coordinate descent from the site defaults (see the module's docstring); once converged (a whole pass over
    the knobs measures nothing new) it restarts from a random configuration it has not measured (each knob's ladder
    value drawn uniformly), so that it spends the whole budget as the other strategies do; it ends short only where
    RESTART_DRAWS draws find no unmeasured configuration."""
    space = landscape.space
    evaluate = landscape.evaluator(seed)
    rng = np.random.default_rng(seed)
    baseline = space.catalog.default_env(space.knob_names)
    current: dict[str, str | None] = {name: baseline.get(name) for name in space.knob_names}
    history: list[Trial] = []
    seen: dict[tuple[tuple[str, str], ...], float | None] = {}  # per configuration: a respelling is not measured

    def key_of(values: Mapping[str, str | None]) -> tuple[tuple[str, str], ...] | None:
        try:
            return landscape.configuration(space.env_from_values(values))
        except UnsafeValueError:
            return None  # breaks a catalog constraint (e.g. socket threads x sockets <= 64)

    def measure(values: Mapping[str, str | None]) -> float:
        env = space.env_from_values(values)
        observed = replay_objective_us(evaluate(env), landscape)
        history.append(Trial(env, observed, not history))
        seen[landscape.configuration(env)] = observed
        return math.inf if observed is None else observed

    best = measure(current)
    while len(history) < trials:
        before = len(history)
        for index in rng.permutation(len(space.dimensions)):
            dimension = space.dimensions[int(index)]
            values = dimension.ladder()
            for value_index in rng.permutation(len(values)):
                if len(history) >= trials:
                    return history
                candidate = {**current, dimension.name: values[int(value_index)]}
                if (key := key_of(candidate)) is None:
                    continue
                observed = seen[key] if key in seen else measure(candidate)
                if observed is not None and observed < best:
                    best, current = observed, candidate
        if len(history) == before:  # every neighbour measured: converged; restart from an unmeasured random point
            for _ in range(RESTART_DRAWS):
                candidate = {d.name: (ladder := d.ladder())[int(rng.integers(len(ladder)))] for d in space.dimensions}
                if (key := key_of(candidate)) is not None and key not in seen:
                    break
            else:
                break  # no unmeasured configuration found: the search ends short of its budget
            best, current = measure(candidate), candidate
    return history


@dataclass(frozen=True)
class Outcome:
    hit: int | None
    hit_unseeded: int | None
    hit_second: int | None  # trials to SECOND_QUALITY
    final_quality: float
    cpu_s: float


def score(landscape: ReplayLandscape, history: list[Trial], cpu_s: float) -> Outcome:
    """The history's Outcome. An unseeded trial that the replay answers with a point a seeded trial already measured
    (on a sparse landscape a one-knob change of the seeded library defaults is answered by the library defaults' own
    point) is no unseeded hit: the quality is the seed's, not what the search found."""
    hit = hit_unseeded = hit_second = None
    incumbent, incumbent_quality = math.inf, 0.0
    seeded_points: set[int] = set()  # replay points measured by seeded trials so far (failed launches too)
    for number, trial in enumerate(history, start=1):
        point = landscape.point_of(trial.env)
        answered_by_seed = not trial.seeded and point in seeded_points
        if trial.seeded:
            seeded_points.add(point)
        if trial.observed_us is None:
            continue
        quality = landscape.quality(trial.env)
        if trial.observed_us < incumbent:
            incumbent, incumbent_quality = trial.observed_us, quality
        if quality >= SECOND_QUALITY:
            hit_second = hit_second or number
        if quality >= TARGET_QUALITY:
            hit = hit or number
            if not trial.seeded and not answered_by_seed:
                hit_unseeded = hit_unseeded or number
    return Outcome(hit, hit_unseeded, hit_second, incumbent_quality, cpu_s / max(len(history), 1))


def stream_seed(strategy: str, scenario: str, seed: int) -> int:
    """The seed of `strategy`'s own stream on `scenario` for benchmark seed `seed` (its sampler, screen, order and
    replayed launches): no two strategies draw the same numbers (TPE's and GP's start-up samplers are
    RandomSampler(seed), so with one seed their first trials were random's, and the per-seed values of the strategies
    correlated), nor one strategy on two scenarios (with one stream per seed for every scenario, the shipped search's
    per-seed values were identical on the five socket grids: one draw of the search, not five)."""
    return int(np.random.SeedSequence([seed, zlib.crc32(strategy.encode()), zlib.crc32(scenario.encode())])
               .generate_state(1)[0])


def reference_group(scenario: str) -> str:
    """The first scenario (in SCENARIOS' order) on which random sampling searches as on `scenario`: the same landscape
    file, site defaults and tune spec (random takes no warm start; held_out is a label). The random reference
    (REFERENCE) is run once per such group, under this name."""

    def alike(s: Scenario) -> tuple[Any, ...]:
        return s.stem, None if s.site_defaults is None else sorted(s.site_defaults.items()), s.spec_from

    return next(name for name, other in SCENARIOS.items() if alike(other) == alike(SCENARIOS[scenario]))


def search(scenario: str, landscape: ReplayLandscape, document: Mapping[str, Any], strategy: str, seed: int,
           trials: int, warm: Sequence[tuple[Mapping[str, str], str]] = ()) -> list[Trial]:
    """One search of `strategy` (STRATEGIES, or REFERENCE: random sampling on the stream of `scenario`'s
    reference_group) on `scenario`'s landscape for benchmark seed `seed`, on its own stream (stream_seed); `warm`: the
    shipped search's warm starts."""
    shipped = shipped_settings()
    if strategy == REFERENCE:
        return run_tuner(landscape, document, {**shipped, "sampler": "random", "screen_trials": 0,
                                               "seed_library_defaults": False},
                         stream_seed(REFERENCE, reference_group(scenario), seed), trials)
    stream = stream_seed(strategy, scenario, seed)
    if strategy == "shipped":
        return run_tuner(landscape, document, shipped, stream, trials, warm)
    if strategy == "sobol":
        return run_sobol(landscape, stream, trials)
    if strategy == "coordinate":
        return run_coordinate(landscape, stream, trials)
    return run_tuner(landscape, document, {**shipped, "sampler": strategy, "screen_trials": 0,
                                           "seed_library_defaults": False}, stream, trials)


def run_seeds(directory: Path, scenario: str, strategy: str, seeds: range, trials: int) -> list[Outcome] | str:
    """The outcomes of one strategy on one landscape for `seeds` (a reason string when the strategy cannot run)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    landscape, document = load_scenario(scenario, directory)
    warm = warm_starts(scenario, landscape, directory)
    if strategy == "gp" and importlib.util.find_spec("torch") is None:
        return "optuna's GPSampler needs torch, which is not installed"
    outcomes = []
    for seed in seeds:
        started = time.process_time()
        history = search(scenario, landscape, document, strategy, seed, trials, warm)
        outcomes.append(score(landscape, history, time.process_time() - started))
    return outcomes


def _stats(values: list[int | None], trials: int) -> dict[str, float | int]:
    censored = np.array([v if v is not None else trials + 1 for v in values], dtype=float)
    return {"reached": sum(v is not None for v in values), "median": float(np.median(censored)),
            "q1": float(np.percentile(censored, 25)), "q3": float(np.percentile(censored, 75))}


def summarize(outcomes: list[Outcome], trials: int) -> dict[str, Any]:
    finals = np.array([o.final_quality for o in outcomes])
    return {"seeds": len(outcomes), "trials_to_95pct": _stats([o.hit for o in outcomes], trials),
            "trials_to_95pct_per_seed": [o.hit if o.hit is not None else trials + 1 for o in outcomes],
            "trials_to_95pct_unseeded": _stats([o.hit_unseeded for o in outcomes], trials),
            "trials_to_95pct_unseeded_per_seed": [o.hit_unseeded if o.hit_unseeded is not None else trials + 1
                                                  for o in outcomes],
            "trials_to_90pct": _stats([o.hit_second for o in outcomes], trials),
            "final_quality_mean": round(float(finals.mean()), 4), "final_quality_min": round(float(finals.min()), 4),
            "cpu_ms_per_trial": round(1e3 * float(np.mean([o.cpu_s for o in outcomes])), 2)}


def describe(scenario: str, directory: Path) -> dict[str, Any]:
    from campaigns import paths

    landscape, document = load_scenario(scenario, directory)
    baseline = landscape.space.catalog.default_env(landscape.space.knob_names)
    qualities = landscape.best_us / landscape.true_us
    runs = [r for p in landscape.points for r in p.runs]
    site_quality = landscape.quality(baseline)
    warm = warm_starts(scenario, landscape, directory)
    spec, source = tune_spec(scenario, document, directory / f"{SCENARIOS[scenario].stem}.json")
    return {"file": str(directory / f"{SCENARIOS[scenario].stem}.json"), "what": document.get("what"),
            "tune_spec": {"from": source, "site": spec.site, "system": spec.system,
                          "knob_overrides": [os.path.relpath(f, paths.DATA_ROOT) for f in spec.knob_overrides],
                          "sizes": spec.sizes, "sizes_per_bucket": spec.sizes_per_bucket},
            "held_out": SCENARIOS[scenario].held_out,
            # what the tune's space held that the file never measured: left out of every strategy's space (landscape_of)
            "unmeasured_choices": {name: list(values) for name, values in unnarrowed(
                directory / f"{SCENARIOS[scenario].stem}.json", scenario, document).unmeasured_choices().items()},
            "random_reference": reference_group(scenario),
            **({"warm_start": {"env": dict(warm[0][0]), "from": warm[0][1],
                               "quality": round(landscape.quality(warm[0][0]), 4)}} if warm else {}),
            "measured": "full grid" if "grid" in document else
            "the points searches visited, not a grid (between them the replay is nearest-neighbour fill)",
            "points": len(landscape.points), "measured_settings": len(landscape.measured), "launches": len(runs),
            **({"spelling_spread": {"same_setting": round(spread[0], 4), "two_spellings": round(spread[1], 4)}}
               if (spread := landscape.spelling_spread()) else {}),
            "failed_launches": sum(r.medians_us is None for r in runs),
            "best_true_objective_us": round(landscape.best_us, 3),
            "best_env": landscape.best_env,
            "points_within_95pct": int((qualities >= TARGET_QUALITY).sum()),
            "points_within_90pct": int((qualities >= SECOND_QUALITY).sum()),
            "points_straddling_95pct": landscape.straddling(TARGET_QUALITY), "site_defaults": baseline,
            "site_defaults_quality": round(site_quality, 4),
            "one_knob_random_order": dict(zip(("changes", "within_95pct", "median"),
                                              landscape.one_knob_random_order(baseline, TARGET_QUALITY))),
            "library_defaults_quality": round(landscape.quality({}), 4),
            # trial 1 of every search is the site defaults: below 95 % no search's median can be under 2
            "lowest_possible_median": 1 if site_quality >= TARGET_QUALITY else 2}


@dataclass(frozen=True)
class TargetOutcome:
    """Issue 14's target for one landscape: the shipped configuration's median trials to 95 % at most half of
    random's and at most 15 (a search that never got there counts as budget + 1); random's median over the seeds of
    `random_seeds` (the random reference where the run has one)."""

    shipped: float
    unseeded: float  # the shipped search's median counting only unseeded trials
    random: float
    trials: int
    random_seeds: int | None = None

    def meets(self, median: float) -> bool:
        return median <= 15 and median <= self.random / 2 and median <= self.trials

    @property
    def met(self) -> bool:
        return self.meets(self.shipped)

    @property
    def by_seed(self) -> bool:
        """Met only thanks to the seeded trials (site defaults, library defaults, documented, warm starts)."""
        return self.met and not self.meets(self.unseeded)

    def unattainable(self, lowest_possible: int) -> bool:
        """No search can meet it: half of random's is below the landscape's lowest possible median."""
        return self.random / 2 < lowest_possible


def random_baseline(document: Mapping[str, Any], scenario: str) -> Mapping[str, Any] | None:
    """What random's side of the target and the tests is on `scenario`: the random reference of its group
    (REFERENCE_SEEDS seeds; the landscape's `random_reference`) where the run has one, else the strategy table's random
    cell (None without either)."""
    group = document["landscapes"].get(scenario, {}).get("random_reference")
    reference = document.get("random_reference", {}).get(group)
    if reference is not None and "trials_to_95pct" in reference:
        return reference
    cell = document["results"].get(scenario, {}).get("random", {})
    return cell if "trials_to_95pct" in cell else None


def target_outcome(cells: Mapping[str, Any], trials: int, random: Mapping[str, Any] | None = None
                   ) -> TargetOutcome | None:
    """Against `random` (random_baseline's), else the cells' random cell; None without the shipped and random cells."""
    random = cells.get("random", {}) if random is None else random
    if "trials_to_95pct" not in cells.get("shipped", {}) or "trials_to_95pct" not in random:
        return None
    shipped = cells["shipped"]["trials_to_95pct"]["median"]
    return TargetOutcome(shipped, cells["shipped"].get("trials_to_95pct_unseeded", {}).get("median", shipped),
                         random["trials_to_95pct"]["median"], trials, random.get("seeds"))


def target_verdict(cells: Mapping[str, Any], trials: int, lowest_possible: int = 1,
                   random: Mapping[str, Any] | None = None) -> str:
    """The target's verdict for one landscape as a sentence (TargetOutcome)."""
    outcome = target_outcome(cells, trials, random)
    if outcome is None:
        return "Target: not judged (needs the shipped and random cells)."
    defaults = "below 95 %, so every median is >= 2" if lowest_possible == 2 else "within 95 %: every median is 1"
    unattainable = (f"; no search can meet it here: half of random's is {outcome.random / 2:g} and trial 1, the site "
                    f"defaults, is {defaults}" if outcome.unattainable(lowest_possible) else "")
    by = " by the seeded trials, not by the search" if outcome.by_seed else ""
    over = f" over {outcome.random_seeds} seeds" if outcome.random_seeds is not None else ""
    return (f"Target (median trials to 95 % <= half of random's and <= 15): **{'met' if outcome.met else 'not met'}**"
            f"{by} (shipped {outcome.shipped:g}, unseeded {outcome.unseeded:g}, random {outcome.random:g}{over}; "
            f"{trials + 1:g} = never within {trials} trials{unattainable}).")


def fewer_p(a: np.ndarray, b: np.ndarray) -> float:
    """One-sided Mann-Whitney U p-value that `a` holds smaller values than `b` (1 when every value is the same)."""
    if np.all(a == a[0]) and np.all(b == a[0]):
        return 1.0
    return float(mannwhitneyu(a, b, alternative="less").pvalue)


# The two families of shipped vs random: every trial counted, and the search alone (the `unseeded` counting on both
# sides: on demo 2 and the planted NVLink grid the shipped search's wins are its library-defaults seed's)
FAMILIES = {"all trials": "trials_to_95pct_per_seed", "search alone": "trials_to_95pct_unseeded_per_seed"}


def shipped_vs_random(results: Mapping[str, Mapping[str, Any]], trials: int, seed: int = 0,
                      random: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Per landscape: one-sided Mann-Whitney U p-value (shipped needs fewer trials to 95 % than random), Holm over
    the landscapes, and the power at the Holm-strictest level (alpha / landscapes) against the target effect:
    random's per-seed trials halved (rounded up) vs random's, both resampled with replacement; random's per-seed values
    those of `random`[landscape] (the random reference, random_baseline) where given, else of the random cell. Once
    counting every trial, once the search alone (FAMILIES: `unseeded` per seed on both sides), each its own Holm
    family."""
    rng = np.random.default_rng(seed)
    random = random or {}
    baselines = {name: random.get(name, c.get("random", {})) for name, c in results.items()}
    tests: dict[str, dict[str, Any]] = {}
    for family, key in FAMILIES.items():
        cells = {name: (c["shipped"][key], baselines[name][key]) for name, c in results.items()
                 if key in c.get("shipped", {}) and key in baselines[name]}
        p_values, power = {}, {}
        strict = FAMILY_ALPHA / max(len(cells), 1)
        for name, (shipped_values, random_values) in cells.items():
            shipped, others = np.array(shipped_values, dtype=float), np.array(random_values, dtype=float)
            p_values[name] = fewer_p(shipped, others)
            halved = np.ceil(others / 2)
            power[name] = sum(fewer_p(rng.choice(halved, len(shipped)), rng.choice(others, len(others))) <= strict
                              for _ in range(POWER_REPLICATES)) / POWER_REPLICATES
        adjusted = dict(zip(p_values, holm(list(p_values.values())), strict=True))
        for name, (shipped_values, random_values) in cells.items():
            tests.setdefault(name, {})[family] = {
                "p": round(p_values[name], 6), "p_holm": round(adjusted[name], 6),
                "fewer_than_random": adjusted[name] <= FAMILY_ALPHA, "power_at_half": power[name],
                "shipped_seeds": len(shipped_values), "random_seeds": len(random_values),
                "random_from": "the random reference" if name in random else "the random cell",
                **median_ratio(shipped_values, random_values)}
    return {"test": "one-sided Mann-Whitney U, trials to 95 % per seed (never = budget + 1), shipped < random; "
                    "'search alone': the unseeded trials to 95 % per seed of both",
            "random": f"random's per-seed values from the random reference ({REFERENCE}: its own stream; the "
                      "document's random_reference, per group of scenarios) where the run has one, else the random "
                      "cell's (per landscape: random_from, random_seeds)",
            "family": "each of 'all trials' and 'search alone' over the landscapes of this run, Holm",
            "alpha": FAMILY_ALPHA,
            "power_against": "random's per-seed trials halved (the target), at alpha / landscapes",
            "median_ratio": f"shipped's median / random's, 95 % percentile bootstrap ({BOOTSTRAP_REPLICATES} "
                            "resamples of each side's seeds)",
            "landscapes": {name: {**families["all trials"], "search_alone": families.get("search alone")}
                           for name, families in tests.items() if "all trials" in families}}


def median_ratio(shipped: Sequence[int], random: Sequence[int], seed: int = 0) -> dict[str, Any]:
    """Shipped's median trials to 95 % over random's, and its 95 % percentile-bootstrap interval."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(shipped, dtype=float), np.asarray(random, dtype=float)
    ratios = (np.median(rng.choice(a, (BOOTSTRAP_REPLICATES, len(a))), axis=1)
              / np.median(rng.choice(b, (BOOTSTRAP_REPLICATES, len(b))), axis=1))
    low, high = np.percentile(ratios, [2.5, 97.5])
    return {"median_ratio": round(float(np.median(a) / np.median(b)), 4),
            "median_ratio_ci95": [round(float(low), 4), round(float(high), 4)]}


def verdict_word(document: Mapping[str, Any], scenario: str) -> str:
    """The target's verdict on `scenario` in a word or three (the summary table's)."""
    info, cells = document["landscapes"][scenario], document["results"][scenario]
    outcome = target_outcome(cells, document["trials"], random_baseline(document, scenario))
    return ("not judged" if outcome is None else "met by the seed" if outcome.by_seed else "met" if outcome.met
            else "unattainable" if outcome.unattainable(info.get("lowest_possible_median", 1)) else "not met")


def headline(document: Mapping[str, Any]) -> str:
    """The run in one sentence: on how many landscapes the target is met (by the search, by the seed), and on how
    many shipped is shown to need fewer trials than random (every trial counted; the search alone)."""
    words = [verdict_word(document, scenario) for scenario in document["landscapes"]]
    tests = document.get("shipped_vs_random", {}).get("landscapes", {})
    shown = sum(t["fewer_than_random"] for t in tests.values())
    alone = sum(bool(t.get("search_alone") and t["search_alone"]["fewer_than_random"]) for t in tests.values())
    return (f"Target met on {words.count('met') + words.count('met by the seed')} of {len(words)} landscapes "
            f"({words.count('met')} by the search, {words.count('met by the seed')} by the seeded trials alone; "
            f"{words.count('unattainable')} out of any search's reach); fewer trials than random shown on {shown} of "
            f"{len(tests)} counting every trial, on {alone} of {len(tests)} for the search alone (unseeded trials).")


def summary_table(document: Mapping[str, Any]) -> list[str]:
    """One line per landscape: median trials to 95 % of each strategy, random's reference median, and the target's
    verdict."""
    strategies = [s for s in STRATEGIES if any(s in cells for cells in document["results"].values())]
    tests = document.get("shipped_vs_random", {}).get("landscapes", {})
    lines = ["| landscape | measured | held out | " + " | ".join(strategies) + " | random, reference seeds "
             "| shipped unseeded | one-knob changes, random order (exact) | target | shipped / random (95 % CI) "
             "| fewer than random shown: all trials / search alone |",
             "|---|---|---|" + "---|" * (len(strategies) + 6)]
    for scenario, info in document["landscapes"].items():
        cells = document["results"][scenario]
        medians = [f"{cells[s]['trials_to_95pct']['median']:g}" if "trials_to_95pct" in cells.get(s, {}) else "-"
                   for s in strategies]
        group = document.get("random_reference", {}).get(info.get("random_reference"), {})
        reference_median = (f"{group['trials_to_95pct']['median']:g} ({group['seeds']})" if "trials_to_95pct" in group
                            else "-")
        unseeded = cells.get("shipped", {}).get("trials_to_95pct_unseeded", {}).get("median")
        measured = "grid" if info.get("measured") == "full grid" else "visited"
        one_knob = info.get("one_knob_random_order")
        reference = "-" if one_knob is None else "never" if one_knob["median"] is None else f"{one_knob['median']:g}"
        test = tests.get(scenario)
        shown = "-" if test is None else "/".join(
            "-" if t is None else "yes" if t["fewer_than_random"] else "no" for t in (test, test.get("search_alone")))
        lines.append(f"| {scenario} | {measured} {info['points']} | "
                     f"{'yes' if info.get('held_out') else 'no'} | " + " | ".join(medians) +
                     f" | {reference_median} | {'-' if unseeded is None else f'{unseeded:g}'} | {reference} "
                     f"| {verdict_word(document, scenario)} | {ratio_text(test)} | {shown} |")
    return lines


def one_knob_text(reference: Mapping[str, Any]) -> str:
    """ReplayLandscape.one_knob_random_order in words."""
    found = (f"needs a median of {reference['median']} trials (exact)" if reference["median"] is not None
             else "never reaches 95 %")
    return (f"Measuring the site defaults and then their {reference['changes']} one-knob changes ("
            f"{reference['within_95pct']} within 95 %) in a uniformly random order, knowing nothing, {found}.")


def ratio_text(test: Mapping[str, Any] | None) -> str:
    if test is None or "median_ratio" not in test:
        return "-"
    low, high = test["median_ratio_ci95"]
    return f"{test['median_ratio']:.2f} ({low:.2f}-{high:.2f})"


def markdown(document: Mapping[str, Any]) -> str:
    lines = [f"# Sampler benchmark on measured replay landscapes ({document['date']}, commit {document['commit']})",
             "", f"{document['seeds']} seeds x {document['trials']} trials per cell; trials to a configuration within "
             "95 % (and 90 %) of the landscape's best (true median), median [IQR], reached/seeds; budget + 1 when never. "
             "`unseeded` counts only trials that are neither the site defaults (trial 1 as counted here) nor seeded, "
             "nor answered by the replay with a point a seeded trial measured. Random's side of the target and of "
             "the tests is the random reference where the run has one (`random, reference`: random sampling on a "
             "stream of its own, over more seeds, one per group of scenarios on which random searches alike), not the "
             "strategy table's random cell. Each landscape's categorical knobs are searched over the values it "
             "measured only (every strategy alike); numeric values it did not measure are answered by the nearest "
             "measured point. "
             f"Shipped = {document['shipped']} (TuningSpec's defaults of the search, the screen's order a draw per "
             "seed as tune draws one per study; each landscape's scope, catalog and objective - sizes, sizes per "
             "bucket - are its measured tune spec's). "
             f"Written by `{document['command']}`.", "", headline(document), "", *summary_table(document), ""]
    for scenario, info in document["landscapes"].items():
        settings = info.get("measured_settings", info["points"])
        spread = info.get("spelling_spread")
        pooled = (f" ({settings} measured settings; those the library runs as one configuration pooled"
                  + (f": median |ln ratio| of two launches {spread['two_spellings']} across two spellings of one, "
                     f"{spread['same_setting']} within one setting" if spread else "") + ")"
                  if settings != info["points"] else "")
        lines += [f"## {scenario}", "", f"{info.get('measured', 'measured')}: {info['points']} points{pooled}, "
                  f"{info['launches']} launches "
                  f"({info['failed_launches']} failed); {info['points_within_95pct']} point(s) within 95 % of the best "
                  f"({info['best_env'] or 'library defaults'}), {info.get('points_within_90pct', '?')} within 90 %, "
                  f"{info.get('points_straddling_95pct', '?')} with launches on both sides of the 95 % line (which of "
                  "them count as within 95 % is launch noise); "
                  f"quality of the site defaults {info['site_defaults_quality']}, "
                  f"of the library defaults {info['library_defaults_quality']}."
                  + (f" Searched and scored as its tune ({info['tune_spec']['from']}): site {info['tune_spec']['site']}"
                     f", knob overrides {', '.join(info['tune_spec']['knob_overrides']) or 'none'}, sizes per bucket "
                     f"{info['tune_spec']['sizes_per_bucket']}." if "tune_spec" in info else "")
                  + (f" {one_knob_text(info['one_knob_random_order'])}" if "one_knob_random_order" in info else "")
                  + (f" Shipped is warm-started (as `commcamp tune` enqueues a related scope's published winner) with "
                     f"{info['warm_start']['env']}, {info['warm_start']['from']}, quality here "
                     f"{info['warm_start']['quality']}; it counts as seeded." if "warm_start" in info else "")
                  + (f" Categorical values of the tune's space never measured here, left out of every strategy's "
                     f"space: {'; '.join(k + ' ' + ', '.join(v) for k, v in info['unmeasured_choices'].items())}."
                     if info.get("unmeasured_choices") else "")
                  + (f" **Held out**: {info['held_out']}." if info.get("held_out") else ""), "",
                  "| strategy | trials to 95 % | reached | unseeded | reached | trials to 90 % | reached "
                  "| final quality mean (min) |",
                  "|---|---|---|---|---|---|---|---|"]
        cells = document["results"][scenario]
        random = random_baseline(document, scenario)
        rows = {**cells, **({f"random, reference ({random['seeds']} seeds)": random}
                            if random is not None and random is not cells.get("random") else {})}
        for strategy, cell in rows.items():
            if "skipped" in cell:
                lines.append(f"| {strategy} | skipped: {cell['skipped']} | | | | | | |")
                continue
            a, b, c = cell["trials_to_95pct"], cell["trials_to_95pct_unseeded"], cell["trials_to_90pct"]
            lines.append(f"| {strategy} | {a['median']:g} [{a['q1']:g}-{a['q3']:g}] | {a['reached']}/{cell['seeds']} | "
                         f"{b['median']:g} [{b['q1']:g}-{b['q3']:g}] | {b['reached']}/{cell['seeds']} | "
                         f"{c['median']:g} [{c['q1']:g}-{c['q3']:g}] | {c['reached']}/{cell['seeds']} | "
                         f"{cell['final_quality_mean']} ({cell['final_quality_min']}) |")
        lines += ["", target_verdict(cells, document["trials"], info.get("lowest_possible_median", 1), random)]
        test = document.get("shipped_vs_random", {}).get("landscapes", {}).get(scenario)
        if test is not None:
            family = len(document["shipped_vs_random"]["landscapes"])
            for what, t in (("", test), (", the search alone (unseeded trials on both sides)",
                                         test.get("search_alone"))):
                if t is None:
                    continue
                seeds = (f"shipped's {t['shipped_seeds']} seeds vs {t['random_seeds']} of {t['random_from']}"
                         if "random_seeds" in t else "per-seed values")
                lines.append(f"Shipped vs random{what}: one-sided Mann-Whitney U, {seeds}, Holm over {family} "
                             f"landscapes, alpha {document['shipped_vs_random']['alpha']}: p = {t['p']:.3g}, Holm "
                             f"{t['p_holm']:.3g}: fewer trials than random "
                             f"**{'shown' if t['fewer_than_random'] else 'not shown'}**; power against half of "
                             f"random's trials {t['power_at_half']:.2f}"
                             + (f"; median ratio {ratio_text(t)}." if what else "."))
            if "median_ratio" in test:
                low, high = test["median_ratio_ci95"]
                side = ("above 0.5: more than half of random's trials, beyond the seeds' noise" if low > 0.5
                        else "at most 0.5: half of random's trials or fewer, beyond the seeds' noise" if high <= 0.5
                        else "across 0.5: these seeds cannot tell whether shipped needs half of random's trials")
                lines.append(f"Shipped's median / random's (95 % bootstrap interval): {ratio_text(test)}: {side}.")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--samplers", default=",".join(STRATEGIES))
    parser.add_argument("--landscapes", default=",".join(SCENARIOS))
    parser.add_argument("--landscape-dir", type=Path, default=LANDSCAPE_DIR)
    parser.add_argument("--reference-seeds", type=int, default=REFERENCE_SEEDS,
                        help="seeds of the random reference the target and the tests judge against (0: none, the "
                             "random cell's seeds instead)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/bench/sampler_benchmark.json"))
    args = parser.parse_args()
    scenarios, strategies = args.landscapes.split(","), args.samplers.split(",")
    for name in scenarios:
        if name not in SCENARIOS:
            parser.error(f"--landscapes: unknown landscape {name!r} (known: {', '.join(SCENARIOS)})")
    for name in strategies:
        if name not in STRATEGIES:
            parser.error(f"--samplers: unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    document: dict[str, Any] = {
        "what": "sampler benchmark on measured replay landscapes (tuners/landscape.py)", "date":
        datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit, "host": platform.node(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "command": "python -m tuners.bench_sampler " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "optuna": optuna.__version__, "python": platform.python_version(), "seeds": args.seeds,
        "trials": args.trials, "target_quality": TARGET_QUALITY, "shipped": {k: str(v) for k, v in
                                                                           shipped_settings().items()},
        "landscapes": {name: describe(name, args.landscape_dir) for name in scenarios}, "results": {}}
    cells = list(itertools.product(scenarios, strategies))
    # the random reference, once per group of the run's scenarios on which random searches alike (reference_group)
    groups = list(dict.fromkeys(reference_group(name) for name in scenarios)) \
        if args.reference_seeds > 0 and {"shipped", "random"} & set(strategies) else []

    def chunked(seeds: int, size: int) -> list[range]:
        return [range(start, min(start + size, seeds)) for start in range(0, seeds, size)]

    # Each cell's seeds in chunks, so that the slow cells (GP) spread over every worker.
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {cell: [pool.submit(run_seeds, args.landscape_dir, *cell, chunk, args.trials)
                          for chunk in chunked(args.seeds, SEEDS_PER_TASK)] for cell in cells}
        references = {group: [pool.submit(run_seeds, args.landscape_dir, group, REFERENCE, chunk, args.trials)
                              for chunk in chunked(args.reference_seeds, REFERENCE_SEEDS_PER_TASK)] for group in groups}
        for (scenario, strategy), parts in futures.items():
            done = [part.result() for part in parts]
            skipped = next((reason for reason in done if isinstance(reason, str)), None)
            result = {"skipped": skipped} if skipped is not None else summarize(
                [outcome for part in done if not isinstance(part, str) for outcome in part], args.trials)
            document["results"].setdefault(scenario, {})[strategy] = result
            print(f"{scenario}/{strategy}: {json.dumps(result)}", flush=True)
        document["random_reference"] = {}
        for group, parts in references.items():
            outcomes = [outcome for part in parts for outcome in part.result()]
            document["random_reference"][group] = {
                "what": f"random sampling (the random cells' settings) on its own stream ({REFERENCE}, named by the "
                        "group's first scenario), seeds 0 on",
                "scenarios": [name for name in scenarios if reference_group(name) == group],
                **summarize(outcomes, args.trials)}
            print(f"{group}/{REFERENCE}: median {document['random_reference'][group]['trials_to_95pct']['median']:g} "
                  f"over {len(outcomes)} seeds", flush=True)
    baselines = {name: document["random_reference"][reference_group(name)] for name in scenarios if groups}
    document["shipped_vs_random"] = shipped_vs_random(document["results"], args.trials, random=baselines)
    write_atomic(args.out, json.dumps(document, indent=1) + "\n")
    write_atomic(args.out.with_suffix(".md"), markdown(document) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
