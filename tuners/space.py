"""Search space: knobs chosen from a catalog, turned into Optuna parameters and back into an env.

Encoding (define-by-run, so Optuna's group decomposition sees the conditional structure):
- categorical / bool knob NAME: categorical parameter NAME over its choices plus "unset";
- int / pow2 knob that may stay unset: categorical NAME:set over ("unset", "set"), and only when
  "set" the number: NAME (int, optionally log-scaled, or over `search_values`) or NAME:log2 (pow2);
- int / pow2 knob that may not stay unset: only the number parameter.
Forbidden and pinned knobs never enter a space; pinned values are added to every environment. A knob whose `requires`
the site pins otherwise never enters one either (every trial would run the pin's configuration), and a knob the catalog
marks `searched_by_default: false` only when a tune names it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import optuna

from tuners.catalog import UNSET, Knob, KnobCatalog, KnobType, Library, OrderConstraint, Safety

SET = "set"
_UNFIXED = object()  # SearchSpace.suggest: no `fixed_when` entry applies


class SpaceError(ValueError):
    """A knob cannot be searched here; the message says which and why."""


@dataclass(frozen=True)
class KnobDimension:
    """One searchable knob, its domain already cut down to the library versions in use."""

    knob: Knob
    choices: tuple[str, ...] | None = None  # categorical/bool: values searched (UNSET included if allowed)

    @property
    def name(self) -> str:
        return self.knob.name

    @property
    def numeric(self) -> bool:
        return self.knob.type in (KnobType.INT, KnobType.POW2)

    def suggest(self, trial: optuna.Trial, cap: int | None = None, *, floor: int | None = None,
                unset_conflict: str | None = None) -> str | None:
        """The knob's value for this trial, or None for unset; a numeric value at most `cap` and at least `floor`
        (cross-knob constraints given the other knobs). With no value of the domain between them it stays unset,
        or, if it may not (or leaving it unset breaks a constraint too: `unset_conflict` says why), SpaceError. A
        knob searched over `search_values` keeps its one distribution (Optuna cannot change a categorical's
        choices): a drawn value outside the limits is SpaceError (the trial is not launched)."""
        knob = self.knob
        if not self.numeric:
            assert self.choices is not None
            value = trial.suggest_categorical(knob.name, self.choices)
            return None if value == UNSET else str(value)
        assert knob.low is not None and knob.high is not None
        high = knob.high if cap is None else min(knob.high, cap)
        low = knob.low if floor is None else max(knob.low, floor)
        if knob.type is KnobType.POW2:
            low = 2 ** math.ceil(math.log2(low))
        elif knob.search_values is None:
            low += -(low - knob.low) % knob.step  # up to the step grid
        fits = [v for v in knob.search_values if low <= v <= high] if knob.search_values is not None else low <= high
        if not fits:
            if knob.allow_unset and unset_conflict is None:
                return None
            limits = f"at most {cap}" if floor is None else f"at least {floor}" if cap is None else \
                f"between {floor} and {cap}"
            raise SpaceError(f"{knob.name}: no value {f'from its low {knob.low} ' if floor is None else ''}fits the "
                             f"catalog's constraints beside the other knobs' values ({limits})"
                             + (f"; unset: {unset_conflict}" if knob.allow_unset and unset_conflict else ""))
        if knob.allow_unset and trial.suggest_categorical(f"{knob.name}:{SET}", (UNSET, SET)) == UNSET:
            if unset_conflict is not None:
                raise SpaceError(f"{knob.name} unset: {unset_conflict}")
            return None
        if knob.type is KnobType.POW2:
            exponent = trial.suggest_int(f"{knob.name}:log2", int(math.log2(low)), int(math.log2(high)))
            return str(2**exponent)
        if knob.search_values is not None:
            value = trial.suggest_categorical(knob.name, knob.search_values)
            if not low <= value <= high:
                raise SpaceError(f"{knob.name}={value} breaks the catalog's constraints beside the other knobs' "
                                 f"values (it must be between {low} and {high})")
            return str(value)
        high -= (high - knob.low) % knob.step
        return str(trial.suggest_int(knob.name, low, high, step=knob.step, log=knob.log))

    def ladder(self) -> list[str | None]:
        """The values a one-knob-at-a-time search tries (None = unset): every choice; a power-of-two knob's every
        power of two; an int knob's searched values, else its bounds and the powers of two between them."""
        knob = self.knob
        if not self.numeric:
            assert self.choices is not None
            return [None if c == UNSET else c for c in self.choices]
        assert knob.low is not None and knob.high is not None
        unset: list[str | None] = [None] if knob.allow_unset else []
        if knob.type is KnobType.POW2:
            values = [2**e for e in range(int(math.log2(knob.low)), int(math.log2(knob.high)) + 1)]
        elif knob.search_values is not None:
            values = list(knob.search_values)
        else:
            values = sorted({knob.low, knob.high, *(2**e for e in range(64) if knob.low < 2**e < knob.high)})
        return unset + [str(v) for v in values]

    def params_for(self, value: str | None) -> dict[str, Any]:
        """The Optuna parameters that reproduce `value` (None = unset)."""
        knob = self.knob
        if not self.numeric:
            assert self.choices is not None
            param = UNSET if value is None else value
            if param not in self.choices:
                raise SpaceError(f"{knob.name}={param} is not a choice of this search space {list(self.choices)}")
            return {knob.name: param}
        if value is None:
            if not knob.allow_unset:
                raise SpaceError(f"{knob.name} cannot be unset in this search space")
            return {f"{knob.name}:{SET}": UNSET}
        knob.check_value(value)
        params: dict[str, Any] = {f"{knob.name}:{SET}": SET} if knob.allow_unset else {}
        if knob.type is KnobType.POW2:
            params[f"{knob.name}:log2"] = int(math.log2(int(value)))
        elif knob.search_values is not None:
            if int(value) not in knob.search_values:
                raise SpaceError(f"{knob.name}={value} is not one of the searched values {list(knob.search_values)}")
            params[knob.name] = int(value)
        else:
            params[knob.name] = int(value)
        return params


@dataclass(frozen=True)
class SearchSpace:
    catalog: KnobCatalog
    dimensions: tuple[KnobDimension, ...]
    pinned: Mapping[str, str] = field(default_factory=dict)

    @property
    def knob_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dimensions)

    @cached_property
    def launch_context(self) -> dict[str, str]:
        """What every launch of this space sets besides a trial's env: the site's defaults and pins of the knobs
        outside the space (the tune's executor adds them)."""
        return {k: v for k, v in self.catalog.default_env().items() if k not in self.knob_names}

    def effective_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """KnobCatalog.effective_env of `env` as it runs: beside the launch context (a site's NCCL_SOCKET_NTHREADS=4
        outside the space makes a searched NCCL_NSOCKS_PERTHREAD act), which stays in the result (`env` setting a
        context knob to its unset_equals runs otherwise than leaving it to the context's value)."""
        context = {k: v for k, v in self.launch_context.items() if k not in env}
        return self.catalog.effective_env({**context, **env})

    def requires(self, name: str) -> Mapping[str, str]:
        """The companions knob `name` sets with it (Knob.requires; none for a variable outside the catalog)."""
        return self.catalog[name].requires if name in self.catalog else {}

    @property
    def changeable(self) -> tuple[str, ...]:
        """Names two environments of this space can differ in: the searched knobs and the companions they require
        (env_from_values sets those with them; pinned values are in every environment). Finalization's ablation
        measures a winner without each one it changes: what its plan (finalize.planned_runs) counts."""
        names = dict.fromkeys([*self.knob_names, *(n for d in self.dimensions for n in d.knob.requires)])
        return tuple(name for name in names if name not in self.pinned)

    def domains(self) -> list[list[object]]:
        """Each searched knob's domain, in JSON's terms: a study stored with other domains cannot be resumed
        (Optuna refuses a changed distribution)."""
        return [[d.name, None if d.choices is None else list(d.choices), d.knob.low, d.knob.high, d.knob.allow_unset,
                 None if d.knob.search_values is None else list(d.knob.search_values)] for d in self.dimensions]

    def suggest(self, trial: optuna.Trial, fixed: Mapping[str, str | None] | None = None,
                fixed_when: Sequence[tuple[str, str | None, Mapping[str, str | None]]] = ()) -> dict[str, str]:
        """Samples every knob in order and returns the validated environment of the trial. A knob in a
        catalog constraint (e.g. socket threads x sockets per thread <= 64) gets its range cut to what the
        other factors leave: pinned and `fixed` values, the values sampled before it, and the low of each
        factor still to be sampled (so that one keeps a value that fits). A knob in `fixed` is not
        sampled: it takes that value (None = unset), e.g. one the library showed it does not read. `fixed_when`:
        (knob, value, context) fixes the knob to that value where the knobs of `context` have its values (matches):
        those are decided first (e.g. a socket knob NCCL did not read beside P2P on, fixed there only)."""
        site = self.catalog.default_env()  # a factor outside the space runs at the site's default (or pin), or unset
        values: dict[str, str | None] = {
            name: site.get(name)
            for constraint in self.catalog.constraints for name in constraint.names if name not in self.knob_names
        }
        values.update(fixed or {})
        catalog = self.catalog
        dimensions = {d.name: d for d in self.dimensions}
        deciding: set[str] = set()

        def decide(dimension: KnobDimension) -> None:
            name = dimension.name
            if name in values or name in deciding:
                return
            deciding.add(name)
            contexts = [(value, context) for knob, value, context in fixed_when if knob == name]
            for other in (other for _, context in contexts for other in context):
                if other in dimensions:
                    decide(dimensions[other])
            fixed_here = next((value for value, context in contexts
                               if all(n in values for n in context) and self.matches(context, values)), _UNFIXED)
            if fixed_here is not _UNFIXED:
                values[name] = fixed_here
            else:
                values[name] = dimension.suggest(trial, catalog.cap(name, values), floor=catalog.floor(name, values),
                                                 unset_conflict=catalog.unset_conflict(name, values))

        for dimension in self.dimensions:
            decide(dimension)
        return self.env_from_values({name: values[name] for name in self.knob_names})

    def matches(self, context: Mapping[str, str | None], values: Mapping[str, str | None]) -> bool:
        """Whether `values` (knob -> value, None or absent = not set) give each knob of `context` its value there, a
        knob not set counting as the library's own value (KnobCatalog.library_value)."""
        library_value = self.catalog.library_value
        return all(library_value(name, values.get(name)) == library_value(name, want) for name, want in context.items())

    def env_from_values(self, values: Mapping[str, str | None]) -> dict[str, str]:
        """Knob values (None = unset) -> environment with required companions and pinned values. Validated with the
        searched knobs left unset counting as the library's own value (they are unset in the launch), the knobs
        outside the space as the site's defaults (which the launch sets)."""
        env: dict[str, str] = {}
        for name, value in values.items():
            if value is None:
                continue
            env[name] = value
            env.update(self.catalog[name].requires)
        env.update(self.pinned)
        return self.catalog.validate_env(env, searched=self.knob_names)

    def params_for_env(self, env: Mapping[str, str]) -> dict[str, Any]:
        """The Optuna parameters of a trial that applies `env` (knobs missing from env = unset)."""
        searched = set(self.knob_names)
        companions = {n for d in self.dimensions for n in d.knob.requires}
        extra = set(env) - searched - set(self.pinned) - companions
        if extra:
            raise SpaceError(f"{sorted(extra)} are not knobs of this search space {list(self.knob_names)}")
        params: dict[str, Any] = {}
        for dimension in self.dimensions:
            params.update(dimension.params_for(env.get(dimension.name)))
        return params

    def unsafe_changes(self, baseline_env: Mapping[str, str], env: Mapping[str, str]) -> tuple[str, ...]:
        """Knobs that env sets, removes or alters relative to baseline_env (dropping a site default
        such as Alps' NCCL_PROTO=^LL128 included) whose safety class is may-hang or above, or that are
        not in the catalog: a candidate changing any of them is accepted only after validated runs."""
        changed = sorted(name for name in set(baseline_env) | set(env) if baseline_env.get(name) != env.get(name))
        return tuple(
            name
            for name in changed
            if name not in self.catalog or self.catalog[name].safety.rank >= Safety.MAY_HANG.rank
        )


def build_space(
    catalog: KnobCatalog,
    libraries: Mapping[Library | str, str | None],
    *,
    knobs: Sequence[str] | None = None,
    op: str | None = None,
    transport: str | None = None,
    max_safety: Safety = Safety.MAY_CORRUPT,
) -> SearchSpace:
    """A space over the named knobs (or every knob that applies, when `knobs` is None).

    `libraries` maps each library in use to its version (None = unknown: knobs constrained to a
    version range are then left out). Naming a forbidden, pinned, inapplicable or unknown knob
    explicitly is an error; with `knobs=None` such knobs are skipped.
    """
    versions = {Library(lib): version for lib, version in libraries.items()}
    explicit = knobs is not None
    names = list(knobs) if knobs is not None else [k.name for k in catalog if k.searched_by_default]
    if explicit and len(set(names)) != len(names):
        raise SpaceError(f"knob named twice in {names}")
    dimensions = []
    for name in names:
        if name not in catalog:
            raise SpaceError(f"{name} is not in the knob catalog {catalog.source}")
        knob = catalog[name]
        reason = _exclusion_reason(knob, catalog, versions, op, transport, max_safety)
        if reason is not None:
            if explicit:
                raise SpaceError(f"{name} cannot be searched: {reason}")
            continue
        choices = None
        if knob.type is KnobType.CATEGORICAL:
            choices = knob.choices_for(versions)
        elif knob.type is KnobType.BOOL:
            choices = ("0", "1")
        if choices is not None:
            choices = (*choices, UNSET) if knob.allow_unset else choices
            if len(choices) < 2:
                if explicit:
                    raise SpaceError(f"{name} cannot be searched: fewer than two choices exist here")
                continue
        dimensions.append(KnobDimension(knob, choices))
    if not dimensions:
        raise SpaceError("the search space is empty: no catalog knob applies to these libraries/op/transport")
    # A knob of an `ordered` pair searched over search_values is drawn first: its choices cannot follow the other's
    # value (Optuna keeps a categorical's choices), the other's range can (every other knob keeps its place)
    ordered = {name for constraint in catalog.constraints if isinstance(constraint, OrderConstraint)
               for name in constraint.names}
    dimensions.sort(key=lambda d: not (d.name in ordered and d.knob.search_values is not None))
    return SearchSpace(catalog, tuple(dimensions), dict(catalog.pinned))


def check_knob_names(
    catalog: KnobCatalog,
    library: Library,
    knobs: Sequence[str],
    *,
    op: str | None = None,
    transport: str | None = None,
    max_safety: Safety = Safety.MAY_CORRUPT,
) -> None:
    """SpaceError for a named knob that build_space would refuse whatever the library's version: checked
    before a probe run reads the version (a knob that needs another version is refused after it)."""
    for name in knobs:
        if name not in catalog:
            raise SpaceError(f"{name} is not in the knob catalog {catalog.source}")
        knob = catalog[name]
        reason = _exclusion_reason(knob, catalog, None, op, transport, max_safety)
        if reason is None and library not in knob.libraries:
            reason = f"it is read by {', '.join(knob.libraries)}, not by {library}"
        if reason is not None:
            raise SpaceError(f"{name} cannot be searched: {reason}")


def _exclusion_reason(
    knob: Knob,
    catalog: KnobCatalog,
    versions: Mapping[Library, str | None] | None,
    op: str | None,
    transport: str | None,
    max_safety: Safety,
) -> str | None:
    """Why `knob` cannot be searched here, or None; `versions` None: the version check is left out."""
    if knob.safety is Safety.FORBIDDEN:
        return "it is forbidden at this site"
    if knob.name in catalog.pinned:
        return f"it is pinned to {catalog.pinned[knob.name]} at this site"
    for required, value in knob.requires.items():
        pinned = catalog.pinned.get(required)
        if pinned is not None and pinned != value:
            return (f"it requires {required}={value}, which the site pins to {pinned} (knobs.pinned): every trial "
                    "would run the pinned configuration")
    if knob.safety.rank > max_safety.rank:
        return f"its safety class {knob.safety} is above the allowed {max_safety}"
    if not knob.affects(op, transport):
        return f"it does not affect op={op} transport={transport}"
    return None if versions is None else knob.applies_to(versions)
