"""Knob catalog: the environment variables a tuner may touch, their domains and safety classes.

Every value that leaves this package (a trial's environment, an `.env` file, a modulefile, a tuner
plugin config) goes through `check_safe_value` and, for catalog knobs, `Knob.validate`: a strict
character whitelist first, then the knob's domain. Nothing else can reach a job script.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from campaigns.model.yamlio import YamlDocument, YamlModelError, typos_first
from campaigns.paths import KNOB_CATALOG as DEFAULT_CATALOG_PATH  # the catalog ships with commcamp
from campaigns.paths import VOCABULARY as VOCABULARY_PATH  # commbench's ops and transports

# Letters, digits and the punctuation real knob values need (UCX_TLS lists, NCCL_PROTO=^LL128,
# paths). Everything a shell or Lua could interpret ($ ` ; | & quotes whitespace newlines
# parentheses backslash < > * ? ! { } ~ #) is outside it.
SAFE_VALUE_PATTERN = re.compile(r"[A-Za-z0-9_.,:^/+=-]+")
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNSET = "unset"  # search-space choice meaning "leave the variable out": the library decides


class CatalogError(ValueError):
    """A catalog or site override file is malformed; the message names the file and the key."""


class UnsafeValueError(ValueError):
    """A value is outside the character whitelist or outside a knob's domain."""


def check_safe_value(value: object, what: str) -> str:
    if not isinstance(value, str) or not SAFE_VALUE_PATTERN.fullmatch(value):
        raise UnsafeValueError(
            f"{what}: value {value!r} is not allowed: only letters, digits and _ . , : ^ / + = - "
            "may appear (no shell metacharacters, quotes, whitespace or newlines)"
        )
    return value


def check_env_name(name: object) -> str:
    if not isinstance(name, str) or not ENV_NAME_PATTERN.fullmatch(name):
        raise UnsafeValueError(f"{name!r} is not a valid environment variable name")
    return name


class Library(enum.StrEnum):
    NCCL = "nccl"
    RCCL = "rccl"
    HSA = "hsa"
    CRAY_MPICH = "cray-mpich"
    MPICH = "mpich"
    OPENMPI = "openmpi"
    UCX = "ucx"
    LIBFABRIC_CXI = "libfabric-cxi"
    LIBFABRIC = "libfabric"  # core libfabric (every provider), e.g. FI_MR_CACHE_MONITOR
    AWS_OFI_NCCL = "aws-ofi-nccl"


# The libraries whose knobs can change a run of each tuned library: its own and those it runs over (transports,
# network providers, ROCm's HSA under GPU-aware MPI and RCCL). A tune's trials run without these knobs and its env
# files unset them; another library's (an MPI job's NCCL settings, an NCCL job's Open MPI ones) stay. A library
# not named here: every library's.
RUNS_OVER: dict[Library, frozenset[Library]] = {
    Library.NCCL: frozenset({Library.NCCL, Library.AWS_OFI_NCCL, Library.LIBFABRIC, Library.LIBFABRIC_CXI}),
    Library.RCCL: frozenset({Library.RCCL, Library.HSA, Library.AWS_OFI_NCCL, Library.LIBFABRIC,
                             Library.LIBFABRIC_CXI}),
    Library.OPENMPI: frozenset({Library.OPENMPI, Library.UCX, Library.LIBFABRIC, Library.LIBFABRIC_CXI, Library.HSA}),
    Library.MPICH: frozenset({Library.MPICH, Library.UCX, Library.LIBFABRIC, Library.LIBFABRIC_CXI, Library.HSA}),
    Library.CRAY_MPICH: frozenset({Library.CRAY_MPICH, Library.MPICH, Library.UCX, Library.LIBFABRIC,  # -ucx build
                                   Library.LIBFABRIC_CXI, Library.HSA}),
}


# MPICH reads each control variable MPIR_CVAR_<NAME> also as MPIR_PARAM_<NAME> and MPICH_<NAME> (MPICH 4.0.2:
# `strings libmpich.so.12`; its generated mpir_cvars.c reads MPICH_, then MPIR_PARAM_, then MPIR_CVAR_, the last set
# winning: MPI_T showed MPIR_CVAR_ winning over MPICH_). A tune strips and an env file unsets every spelling
# (env_names): an inherited alias would run beside the knob.
MPICH_CVAR_PREFIX = "MPIR_CVAR_"
MPICH_ALIAS_PREFIXES = ("MPIR_PARAM_", "MPICH_")  # after MPIR_CVAR_, in the order MPICH lets them win


def env_names(name: str) -> tuple[str, ...]:
    """Every environment name a library reads variable `name` from: the name, and an MPICH control variable's
    aliases, the one that wins where several are set first."""
    if name.startswith(MPICH_CVAR_PREFIX):
        return (name, *(prefix + name.removeprefix(MPICH_CVAR_PREFIX) for prefix in MPICH_ALIAS_PREFIXES))
    return (name,)


def with_aliases(names: Iterable[str]) -> frozenset[str]:
    """`names` with every other spelling the libraries read them as (env_names)."""
    return frozenset(alias for name in names for alias in env_names(name))


class KnobType(enum.StrEnum):
    CATEGORICAL = "categorical"
    INT = "int"
    POW2 = "pow2"
    BOOL = "bool"


class Safety(enum.StrEnum):
    """What a bad value of the knob can do. Ordered: a space may cap the class it searches."""

    SAFE = "safe"
    MAY_HANG = "may-hang"
    MAY_CORRUPT = "may-corrupt"
    FORBIDDEN = "forbidden"

    @property
    def rank(self) -> int:
        return list(Safety).index(self)


def _as_value_strings(value: object) -> object:
    """YAML gives ints and bools for knob values; environment variables are strings."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return tuple(_as_value_strings(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_value_strings(v) for k, v in value.items()}
    return value


def _parse_specifier(spec: str, where: str) -> SpecifierSet:
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier as exc:
        raise ValueError(f"{where}: {spec!r} is not a version specifier (PEP 440, e.g. '>=2.17')") from exc


def parse_version(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion as exc:
        raise ValueError(f"library version {version!r} is not a version number") from exc


class Knob(BaseModel):
    """One environment variable. `default` is the site's default (trial 0); None = unset. `unset`
    says what the library does when the variable is not set; `source` where the domain, the safety
    class and that meaning come from (or that a source could not be found). `unset_equals`, `inert_unless_set`,
    `inert_unless_any_set` and `inert_when` say which settings run the same configuration
    (KnobCatalog.effective_env); `read_depends_on` which knobs decide whether the library reads it at all (the
    tuner's read-log rule, tuners/study.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    libraries: tuple[Library, ...] = Field(min_length=1)
    type: KnobType
    description: str = Field(min_length=1)
    unset: str = Field(min_length=1)
    source: str = Field(min_length=1)
    safety: Safety
    choices: tuple[str, ...] | None = None
    low: int | None = None
    high: int | None = None
    step: int = Field(default=1, ge=1)
    log: bool = False
    search_values: tuple[int, ...] | None = None  # int knobs: the points searched (domain stays low..high)
    default: str | None = None
    allow_unset: bool = True
    # False: only a tune that names the knob searches it (never worth searching on its own, e.g. NCCL_P2P_DISABLE)
    searched_by_default: bool = True
    versions: dict[Library, str] = Field(default_factory=dict)
    value_versions: dict[str, dict[Library, str]] = Field(default_factory=dict)
    ops: tuple[str, ...] = ("*",)
    transports: tuple[str, ...] = ("*",)
    requires: dict[str, str] = Field(default_factory=dict)
    # the value the library takes when the variable is unset: setting it runs the same configuration
    unset_equals: str | None = None
    # knobs without which this one has no effect: while one of them is unset, setting this one changes nothing
    inert_unless_set: tuple[str, ...] = ()
    # variables of which one must be set for this one to have an effect (Open MPI's use_dynamic_rules without a forced
    # algorithm or rules file); they may lie outside the catalog (a site's own forced algorithms count when set)
    inert_unless_any_set: tuple[str, ...] = ()
    # values of other knobs under which the library does not read this one (so setting it changes nothing): knob ->
    # values, a knob not set counting as its unset_equals (NCCL_P2P_LEVEL while NCCL_P2P_DISABLE=1)
    inert_when: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # knobs whose values decide, with the run's topology, whether the library reads this one at all (NCCL's socket
    # knobs are read only where its Socket transport carries traffic: on one host only with P2P and SHM off); the
    # tuner takes such a knob out of the search only beside the values these had where it was not read
    read_depends_on: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name_is_env_name(cls, name: str) -> str:
        return check_env_name(name)

    _value_strings = field_validator("default", "choices", "requires", "unset_equals", "inert_when", mode="before")(
        _as_value_strings)

    @model_validator(mode="after")
    def _domain_is_consistent(self) -> Knob:
        if self.type is KnobType.CATEGORICAL:
            if not self.choices:
                raise ValueError("categorical knob needs 'choices'")
            for choice in self.choices:
                check_safe_value(choice, f"{self.name} choice")
                if choice == UNSET:
                    raise ValueError(f"'{UNSET}' is reserved (it means: leave the variable out)")
            if len(set(self.choices)) != len(self.choices):
                raise ValueError("duplicate choices")
        elif self.choices is not None:
            raise ValueError(f"'choices' only applies to categorical knobs, not {self.type}")
        if self.type in (KnobType.INT, KnobType.POW2):
            if self.low is None or self.high is None or self.low > self.high:
                raise ValueError(f"{self.type} knob needs 'low' <= 'high'")
            if self.type is KnobType.POW2 and not (_is_pow2(self.low) and _is_pow2(self.high)):
                raise ValueError("pow2 knob needs powers of two for 'low' and 'high'")
            if self.log and self.low < 1:
                raise ValueError("'log' needs 'low' >= 1")
        elif self.low is not None or self.high is not None:
            raise ValueError(f"'low'/'high' only apply to int and pow2 knobs, not {self.type}")
        if self.search_values is not None:
            if self.type is not KnobType.INT or not self.search_values:
                raise ValueError("'search_values' applies to int knobs and must not be empty")
            for point in self.search_values:
                self.check_value(str(point))
        for lib, spec in self.versions.items():
            if lib not in self.libraries:
                raise ValueError(f"versions names library {lib}, which is not in 'libraries'")
            _parse_specifier(spec, f"versions.{lib}")
        for value, constraint in self.value_versions.items():
            self.check_value(value)
            for lib, spec in constraint.items():
                _parse_specifier(spec, f"value_versions.{value}.{lib}")
        for required_name, required_value in self.requires.items():
            check_env_name(required_name)
            check_safe_value(required_value, f"{self.name} requires {required_name}")
        if self.default is not None:
            self.check_value(self.default)
        if self.unset_equals is not None:
            self.check_value(self.unset_equals)
        for name in (*self.inert_unless_set, *self.inert_unless_any_set, *self.inert_when, *self.read_depends_on):
            check_env_name(name)
        if self.name in self.inert_unless_any_set:
            raise ValueError(f"inert_unless_any_set names {self.name} itself")
        for name, values in self.inert_when.items():
            if not values:
                raise ValueError(f"inert_when.{name}: give the values of {name} under which {self.name} is not read")
            for value in values:
                check_safe_value(value, f"{self.name} inert_when {name}")
        return self

    def check_value(self, value: object) -> str:
        """Returns the value if it is safe and inside the domain, else raises UnsafeValueError."""
        text = check_safe_value(value, self.name)
        if self.type is KnobType.CATEGORICAL:
            assert self.choices is not None
            if text not in self.choices:
                raise UnsafeValueError(f"{self.name}: {text!r} is not one of {list(self.choices)}")
        elif self.type is KnobType.BOOL:
            if text not in ("0", "1"):
                raise UnsafeValueError(f"{self.name}: {text!r} is not a boolean (0 or 1)")
        else:
            if not re.fullmatch(r"-?[0-9]+", text):
                raise UnsafeValueError(f"{self.name}: {text!r} is not an integer")
            number = int(text)
            assert self.low is not None and self.high is not None
            if not self.low <= number <= self.high:
                raise UnsafeValueError(f"{self.name}: {number} is outside [{self.low}, {self.high}]")
            if self.type is KnobType.POW2 and not _is_pow2(number):
                raise UnsafeValueError(f"{self.name}: {number} is not a power of two")
            if (number - self.low) % self.step:
                raise UnsafeValueError(f"{self.name}: {number} is not on the step {self.step} from {self.low}")
        return text

    def applies_to(self, versions: Mapping[Library, str | None]) -> str | None:
        """None if the knob is read by one of the given libraries at its version, else why not."""
        reasons = []
        for lib in self.libraries:
            if lib not in versions:
                continue
            spec = self.versions.get(lib)
            if spec is None:
                return None
            version = versions[lib]
            if version is None:
                reasons.append(f"{lib} version unknown (knob needs {spec})")
            elif parse_version(version) in SpecifierSet(spec):
                return None
            else:
                reasons.append(f"{lib} {version} does not match {spec}")
        if not reasons:
            return f"read by {', '.join(self.libraries)}, none of which is in use"
        return "; ".join(reasons)

    def choices_for(self, versions: Mapping[Library, str | None]) -> tuple[str, ...]:
        """Categorical choices that exist in the given library versions (value_versions)."""
        assert self.choices is not None
        return tuple(choice for choice in self.choices if self._value_exists(choice, versions))

    def _value_exists(self, value: str, versions: Mapping[Library, str | None]) -> bool:
        constraint = self.value_versions.get(value)
        if constraint is None:
            return True
        for lib, spec in constraint.items():
            version = versions.get(lib)
            if version is not None and parse_version(version) in SpecifierSet(spec):
                return True
        return False

    def affects(self, op: str | None, transport: str | None) -> bool:
        op_ok = op is None or "*" in self.ops or op in self.ops
        transport_ok = transport is None or "*" in self.transports or transport in self.transports
        return op_ok and transport_ok


def _is_pow2(number: int) -> bool:
    return number > 0 and number & (number - 1) == 0


class ProductConstraint(BaseModel):
    """The product of the named knobs' values, when all of them are set, is at most `at_most`
    (e.g. NCCL's socket threads x sockets per thread <= 64)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    product: tuple[str, ...] = Field(min_length=2)
    at_most: int = Field(ge=1)
    source: str = Field(min_length=1)

    @property
    def names(self) -> tuple[str, ...]:
        return self.product

    def violation(self, values: Mapping[str, str], unset: Mapping[str, str | None] | None = None) -> str | None:
        """Why `values` (name -> value, unset knobs absent) break the constraint, or None. `unset` (what an absent
        knob is) plays no part: the product is judged only when every factor is set."""
        if not all(name in values for name in self.product):
            return None
        product = math.prod(int(values[name]) for name in self.product)
        if product <= self.at_most:
            return None
        factors = " x ".join(f"{name}={values[name]}" for name in self.product)
        return f"{factors} = {product} exceeds {self.at_most} ({self.source})"

    def cap(self, name: str, values: Mapping[str, str | None], lows: Mapping[str, int]) -> int | None:
        """The largest value of `name` the constraint allows beside the other factors: their value in `values`
        (None = unset), else, not chosen yet, the smallest they can take (`lows`), so that each keeps a value that
        fits. None: no limit (`name` is not in the product, or another factor is unset)."""
        if name not in self.product:
            return None
        others = [values[other] if other in values else lows[other] for other in self.product if other != name]
        if any(value is None for value in others):
            return None
        return self.at_most // math.prod(int(value) for value in others if value is not None)


class OrderConstraint(BaseModel):
    """`ordered: [A, B]`: A <= B, a knob that is not set counting as what it then is (`unset`: the site's pin or
    default, else the library's own value, unset_equals; None = not known, and the constraint is not judged). E.g.
    aws-ofi-nccl's RDMA protocol refuses OFI_NCCL_EAGER_MAX_SIZE above OFI_NCCL_MIN_STRIPE_SIZE."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ordered: tuple[str, str]
    source: str = Field(min_length=1)

    @property
    def names(self) -> tuple[str, ...]:
        return self.ordered

    @staticmethod
    def _value(name: str, values: Mapping[str, str | None], unset: Mapping[str, str | None]) -> int | None:
        value = values.get(name)
        if value is None:
            value = unset.get(name)
        return None if value is None else int(value)

    def violation(self, values: Mapping[str, str | None], unset: Mapping[str, str | None] | None = None
                  ) -> str | None:
        """Why `values` (name -> value; absent or None: not set, then `unset[name]`) break A <= B, or None."""
        unset = unset or {}
        low_name, high_name = self.ordered
        low, high = self._value(low_name, values, unset), self._value(high_name, values, unset)
        if low is None or high is None or low <= high:
            return None

        def shown(name: str, value: int) -> str:
            return f"{name}={value}" + ("" if values.get(name) is not None else " (not set)")

        return f"{shown(low_name, low)} exceeds {shown(high_name, high)} ({self.source})"

    def cap(self, name: str, values: Mapping[str, str | None], unset: Mapping[str, str | None]) -> int | None:
        """A's largest value beside B's (set, or None = not set) in `values`; None where B is not chosen yet (it then
        takes A's value as its floor) or unknown, and for B."""
        low_name, high_name = self.ordered
        if name != low_name or high_name not in values:
            return None
        return self._value(high_name, values, unset)

    def floor(self, name: str, values: Mapping[str, str | None], unset: Mapping[str, str | None]) -> int | None:
        """B's smallest value beside A's in `values` (None where A is not chosen yet, or unknown), and None for A."""
        low_name, high_name = self.ordered
        if name != high_name or low_name not in values:
            return None
        return self._value(low_name, values, unset)

    def unset_conflict(self, name: str, values: Mapping[str, str | None], unset: Mapping[str, str | None]
                       ) -> str | None:
        """Why leaving `name` unset breaks the constraint beside the other knob's value in `values`, or None."""
        if name not in self.ordered:
            return None
        other = self.ordered[1] if name == self.ordered[0] else self.ordered[0]
        if other not in values:  # not chosen yet: it adapts to this one's value
            return None
        return self.violation({other: values[other]}, unset)


Constraint = ProductConstraint | OrderConstraint


class KnobRestriction(BaseModel):
    """A site may narrow a knob's domain (never widen it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    choices: tuple[str, ...] | None = None
    low: int | None = None
    high: int | None = None

    _value_strings = field_validator("choices", mode="before")(_as_value_strings)


class DocumentedSetting(BaseModel):
    """A setting the site's or a vendor's documentation recommends: the tuner measures it right after the
    defaults (a knob it does not name keeps the site default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: dict[str, str] = Field(min_length=1)
    source: str = Field(min_length=1, description="where it is documented")

    _value_strings = field_validator("env", mode="before")(_as_value_strings)


class SiteKnobOverrides(BaseModel):
    """The `knobs:` section of a site.yaml: site defaults (trial 0), extra forbidden knobs, values
    pinned in every trial and every recommendation, narrowed domains, and documented settings (seeds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: dict[str, str | None] = Field(default_factory=dict)
    forbidden: tuple[str, ...] = ()
    pinned: dict[str, str] = Field(default_factory=dict)
    restrict: dict[str, KnobRestriction] = Field(default_factory=dict)
    documented: tuple[DocumentedSetting, ...] = ()
    # where the library resolves "unset" otherwise on this site's platform (e.g. NCCL's socket threading on an AWS
    # NIC): the knob's unset_equals (null: none) and inert_unless_set, replacing the base catalog's
    unset_equals: dict[str, str | None] = Field(default_factory=dict)
    inert_unless_set: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    _value_strings = field_validator("defaults", "pinned", "unset_equals", mode="before")(_as_value_strings)


class KnobCatalog:
    """The knobs of one site: the base catalog with the site's overrides applied."""

    def __init__(
        self,
        knobs: Mapping[str, Knob],
        source: str,
        pinned: Mapping[str, str] | None = None,
        constraints: tuple[Constraint, ...] = (),
        documented: tuple[DocumentedSetting, ...] = (),
    ) -> None:
        self._knobs = dict(knobs)
        self.source = source
        self.pinned: dict[str, str] = dict(pinned or {})
        self.constraints = constraints
        self.documented = documented  # the site's documented settings, checked against this catalog

    @classmethod
    def load(cls, path: Path | str = DEFAULT_CATALOG_PATH) -> KnobCatalog:
        try:  # a duplicate knob would otherwise replace the first silently
            document = YamlDocument(Path(path))
        except YamlModelError as exc:
            raise CatalogError(str(exc)) from None
        try:
            return cls.from_document(document.data, document.source)
        except CatalogError as exc:
            raise CatalogError(document.with_line(str(exc))) from None

    @classmethod
    def from_document(cls, document: object, source: str) -> KnobCatalog:
        if not isinstance(document, dict) or not {"schema_version", "knobs"} <= set(document) <= {
            "schema_version", "knobs", "constraints"}:
            raise CatalogError(f"{source}: top level must have the keys 'schema_version' and 'knobs' "
                               "(and optionally 'constraints'), nothing else")
        if document["schema_version"] != 1:
            raise CatalogError(f"{source}: schema_version: {document['schema_version']!r} is not supported (1)")
        entries = document["knobs"]
        if not isinstance(entries, dict) or not entries:
            raise CatalogError(f"{source}: knobs: must be a non-empty mapping of variable name to knob")
        knobs = {}
        for name, fields in entries.items():
            if not isinstance(fields, dict):
                raise CatalogError(f"{source}: knobs.{name}: must be a mapping")
            knobs[name] = _build(Knob, {"name": name, **fields}, source, f"knobs.{name}")
        _check_vocabulary(knobs, source)
        entries = document.get("constraints") or []
        if not isinstance(entries, list):
            raise CatalogError(f"{source}: constraints: must be a list")
        constraints: list[Constraint] = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or ("product" in entry) == ("ordered" in entry):
                raise CatalogError(f"{source}: constraints[{i}]: needs 'product' (with 'at_most') or 'ordered', "
                                   "one of them")
            model: type[BaseModel] = ProductConstraint if "product" in entry else OrderConstraint
            constraints.append(_build(model, entry, source, f"constraints[{i}]"))
        for i, constraint in enumerate(constraints):
            product = isinstance(constraint, ProductConstraint)
            for name in constraint.names:
                if name not in knobs or knobs[name].type not in (KnobType.INT, KnobType.POW2) \
                        or product and knobs[name].search_values is not None:
                    kind = "product" if product else "ordered"
                    raise CatalogError(f"{source}: constraints[{i}].{kind}: {name} is not an int knob "
                                       + ("(without search_values) " if product else "") + "of the catalog")
        catalog = cls(knobs, source, constraints=tuple(constraints))
        catalog._check_references(source)
        return catalog

    def _check_references(self, source: str) -> None:
        """Every knob named by another knob's `requires`, `inert_unless_set`, `inert_when` or `read_depends_on` is in
        the catalog (with a value of its domain)."""
        for knob in self._knobs.values():
            for name, value in knob.requires.items():
                if name not in self._knobs:
                    raise CatalogError(f"{source}: knobs.{knob.name}.requires: {name} is not in the catalog")
                try:
                    self._knobs[name].check_value(value)
                except UnsafeValueError as exc:
                    raise CatalogError(f"{source}: knobs.{knob.name}.requires: {exc}") from exc
            for field in ("inert_unless_set", "inert_when", "read_depends_on"):
                for name in getattr(knob, field):
                    if name not in self._knobs or name == knob.name:
                        raise CatalogError(f"{source}: knobs.{knob.name}.{field}: {name} is not another knob "
                                           "of the catalog")
            for name, values in knob.inert_when.items():
                for value in values:
                    try:
                        self._knobs[name].check_value(value)
                    except UnsafeValueError as exc:
                        raise CatalogError(f"{source}: knobs.{knob.name}.inert_when: {exc}") from exc

    def for_site(self, overrides: Mapping[str, Any], source: str = "site overrides") -> KnobCatalog:
        """A copy with a site's `knobs:` section applied. Sites can forbid, pin, narrow and set
        defaults; they cannot un-forbid a knob the base catalog forbids."""
        if not isinstance(overrides, Mapping):  # e.g. an override file holding a list or a bare value
            raise CatalogError(f"{source}: knobs: expected a mapping of defaults, forbidden, pinned, restrict, "
                               "documented, unset_equals and inert_unless_set, "
                               f"not {type(overrides).__name__}")
        site = _build(SiteKnobOverrides, dict(overrides), source, "knobs")
        knobs = dict(self._knobs)
        for section in ("defaults", "pinned", "unset_equals"):  # YAML's true/yes reads as 1 once a string
            given = overrides.get(section)
            for name, value in given.items() if isinstance(given, Mapping) else ():
                if isinstance(value, bool) and name in knobs and knobs[name].type is not KnobType.BOOL:
                    raise CatalogError(f"{source}: knobs.{section}.{name}: YAML's {str(value).lower()} (true/yes/on, "
                                       f"false/no/off) is no {knobs[name].type.value} value: write the value")

        def knob_of(section: str, name: str) -> Knob:
            if name not in knobs:
                raise CatalogError(f"{source}: knobs.{section}.{name}: not in the catalog {self.source}")
            return knobs[name]

        for name, restriction in site.restrict.items():
            knob = knob_of("restrict", name)
            default = site.defaults.get(name, knob.default)
            knobs[name] = _narrow(knob, restriction, default, source)
        for name, value in site.defaults.items():
            knob = knob_of("defaults", name)
            update: dict[str, Any] = {"default": value}
            if value is not None:
                _validate_at(knob, value, source, f"knobs.defaults.{name}")
                if knob.search_values is not None and int(value) not in knob.search_values:
                    # trial 0 measures the site's default: the search offers it too, to compare and return to
                    update["search_values"] = tuple(sorted({*knob.search_values, int(value)}))
            knobs[name] = knob.model_copy(update=update)
        for name in site.forbidden:
            knobs[name] = knob_of("forbidden", name).model_copy(update={"safety": Safety.FORBIDDEN})
        for name, value in site.unset_equals.items():
            knob = knob_of("unset_equals", name)
            if value is not None:
                _validate_at(knob, value, source, f"knobs.unset_equals.{name}")
            knobs[name] = knob.model_copy(update={"unset_equals": value})
        for name, needed in site.inert_unless_set.items():
            knobs[name] = knob_of("inert_unless_set", name).model_copy(update={"inert_unless_set": needed})
        pinned = dict(self.pinned)
        for name, value in site.pinned.items():
            pinned[name] = _validate_at(knob_of("pinned", name), value, source, f"knobs.pinned.{name}")
        catalog = KnobCatalog(knobs, f"{self.source} + {source}", pinned, self.constraints)
        catalog._check_references(source)

        def keys(names: tuple[str, ...], section: str) -> str:
            """Where the site sets each name (pinned, else in `section`); the bare name where it does not."""
            sections = {name: "pinned" if name in site.pinned else section for name in names}
            return ", ".join(f"knobs.{sections[n]}.{n}" if n in getattr(site, sections[n]) else n for n in names)

        trial_zero = catalog.default_env()
        for constraint in self.constraints:
            if (broken := constraint.violation(trial_zero, catalog.unset_values(constraint.names))) is not None:
                raise CatalogError(f"{source}: {keys(constraint.names, 'defaults')}: {broken}")
            if isinstance(constraint, OrderConstraint):
                continue  # trial 0 fits (checked above): the space keeps to it (a knob left unset at worst)
            # the smallest values the factors take when set: above the limit, they can never be set together
            smallest = {name: pinned.get(name, str(knobs[name].low)) for name in constraint.product}
            if (broken := constraint.violation(smallest)) is not None:
                raise CatalogError(f"{source}: {keys(constraint.product, 'restrict')}: even their smallest values "
                                   f"break a constraint: {broken}")
        for i, setting in enumerate(site.documented):
            for name, value in setting.env.items():
                knob = knob_of(f"documented[{i}].env", name)
                if knob.safety is Safety.FORBIDDEN or name in pinned:
                    raise CatalogError(f"{source}: knobs.documented[{i}].env.{name}: forbidden or pinned at this "
                                       "site: a seed cannot set it")
                _validate_at(knob, value, source, f"knobs.documented[{i}].env.{name}")
            try:
                catalog.validate_env(setting.env)
            except UnsafeValueError as exc:
                raise CatalogError(f"{source}: knobs.documented[{i}].env: {exc}") from exc
        catalog.documented = (*self.documented, *site.documented)
        return catalog

    def __getitem__(self, name: str) -> Knob:
        try:
            return self._knobs[name]
        except KeyError:
            raise KeyError(f"{name} is not in the knob catalog {self.source}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._knobs

    def __iter__(self) -> Iterator[Knob]:
        return iter(self._knobs.values())

    def __len__(self) -> int:
        return len(self._knobs)

    def validate_env(self, env: Mapping[str, str], searched: Collection[str] = ()) -> dict[str, str]:
        """Every name must be a catalog knob, every value inside its domain, every constraint met (a knob `env` does
        not set counts as the site's pin or default, else the library's own value: an `ordered` constraint). A knob
        in `searched` that `env` does not set counts as the library's own value: a trial leaves a knob its tune
        searches truly unset (the site defaults a launch adds are those of the knobs the tune does not search)."""
        checked = {}
        for name, value in env.items():
            if name not in self._knobs:
                raise UnsafeValueError(f"{name} is not a knob of the catalog {self.source}")
            checked[name] = self._knobs[name].check_value(value)
        for constraint in self.constraints:
            broken = constraint.violation(checked, self.unset_values(constraint.names, site=True, searched=searched))
            if broken is not None:
                raise UnsafeValueError(broken)
        return checked

    def unset_values(self, names: tuple[str, ...] | list[str], *, site: bool = False,
                     searched: Collection[str] = ()) -> dict[str, str | None]:
        """What each named knob is when an environment does not set it: the library's own value (`unset_equals`;
        None = not known) or, with `site`, the site's pin or default first (an env on top of the site defaults), but
        for the knobs in `searched` (left unset by a trial of a tune that searches them): the library's value."""
        defaults = self.default_env(names) if site else {}
        return {name: self._knobs[name].unset_equals if name in searched and name not in self.pinned
                else defaults.get(name, self._knobs[name].unset_equals) for name in names}

    def library_value(self, name: str, value: str | None) -> str | None:
        """`value` of knob `name`, or for None (not set) the value the library then takes (`unset_equals`; None: not
        known): what `inert_when` and the tuner's contexts of an unread knob compare."""
        return value if value is not None else self._knobs[name].unset_equals

    def check_job_env(self, env: Mapping[str, object]) -> dict[str, str]:
        """The environment a user or a campaign gives a job (a ReFrame check's env_vars): catalog knobs
        inside their domain, not forbidden and not against a site pin; any other variable a valid name
        with a whitelisted value or empty (the tuner's read log sets OMPI_MCA_mpi_show_mca_params_file and
        NCCL_DEBUG_FILE empty)."""
        checked = {}
        for name, value in env.items():
            check_env_name(name)
            knob = self._knobs.get(name)
            if knob is None:
                checked[name] = "" if value == "" else check_safe_value(value, name)
                continue
            text = knob.check_value(value)
            pinned = self.pinned.get(name)
            if pinned is not None and text != pinned:
                raise UnsafeValueError(f"{name}: the site pins it to {pinned!r}, not {text!r}")
            if knob.safety is Safety.FORBIDDEN and pinned is None:
                raise UnsafeValueError(f"{name} is forbidden by the knob catalog {self.source}")
            checked[name] = text
        return checked

    def affecting(self, library: Library) -> frozenset[str]:
        """The knobs that can change a run of `library` (RUNS_OVER)."""
        over = RUNS_OVER.get(library, frozenset(Library))
        return frozenset(knob.name for knob in self._knobs.values() if over & set(knob.libraries))

    def effective_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` without the settings that leave the library's run unchanged, so that two environments with the same
        effective env are one configuration: a knob set to the value the library takes when it is unset
        (`unset_equals`), a knob that has no effect because a knob of its `inert_unless_set` is unset or none of its
        `inert_unless_any_set` is set, and one the library does not read beside another knob's value (`inert_when`; a
        knob `env` does not set counting as its unset_equals). Pinned values and variables outside the catalog stay."""

        def leaves_run_unchanged(name: str, kept: Mapping[str, str]) -> bool:
            knob = self._knobs.get(name)
            if knob is None or name in self.pinned:
                return False
            return (kept[name] == knob.unset_equals or any(other not in kept for other in knob.inert_unless_set)
                    or bool(knob.inert_unless_any_set) and not any(other in kept for other in knob.inert_unless_any_set)
                    or any(self.library_value(other, kept.get(other)) in values
                           for other, values in knob.inert_when.items()))

        effective = dict(env)
        while dropped := [name for name in effective if leaves_run_unchanged(name, effective)]:
            for name in dropped:  # repeated: a knob left out may make another inert
                del effective[name]
        return effective

    def cap(self, name: str, values: Mapping[str, str | None]) -> int | None:
        """The largest value of knob `name` that every constraint allows given the other knobs' values (None =
        unset); a factor absent from `values` is not chosen yet and counts at its low (ProductConstraint.cap); the
        lower knob of an `ordered` pair is capped at the other's value once that is known (OrderConstraint.cap)."""
        caps = [constraint.cap(name, values, self._lows(constraint)) if isinstance(constraint, ProductConstraint)
                else constraint.cap(name, values, self.unset_values(constraint.names))
                for constraint in self.constraints]
        return min((c for c in caps if c is not None), default=None)

    def floor(self, name: str, values: Mapping[str, str | None]) -> int | None:
        """The smallest value of knob `name` the `ordered` constraints allow beside the values chosen (None = unset)
        of the knobs they put below it; None: no lower limit."""
        floors = [constraint.floor(name, values, self.unset_values(constraint.names))
                  for constraint in self.constraints if isinstance(constraint, OrderConstraint)]
        return max((f for f in floors if f is not None), default=None)

    def unset_conflict(self, name: str, values: Mapping[str, str | None]) -> str | None:
        """Why leaving knob `name` unset (the library's own value) breaks an `ordered` constraint beside the values
        chosen so far, or None."""
        for constraint in self.constraints:
            if isinstance(constraint, OrderConstraint):
                conflict = constraint.unset_conflict(name, values, self.unset_values(constraint.names))
                if conflict is not None:
                    return conflict
        return None

    def _lows(self, constraint: ProductConstraint) -> dict[str, int]:
        return {name: low for name in constraint.product if (low := self._knobs[name].low) is not None}

    def default_env(self, names: Iterator[str] | list[str] | tuple[str, ...] | None = None) -> dict[str, str]:
        """The site's defaults (trial 0) for the given knobs (all if None), plus pinned values."""
        selected = self._knobs if names is None else {n: self[n] for n in names}
        env = {name: knob.default for name, knob in selected.items() if knob.default is not None}
        return {**env, **self.pinned}


def _build(model: type[BaseModel], data: dict[str, Any], source: str, where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = typos_first(exc)[0]
        key = ".".join([where, *(str(part) for part in first["loc"])])
        message = first["msg"].removeprefix("Value error, ")
        raise CatalogError(f"{source}: {key}: {message}") from exc
    except UnsafeValueError as exc:
        raise CatalogError(f"{source}: {where}: {exc}") from exc


@functools.cache
def _vocabulary() -> tuple[frozenset[str], frozenset[str]]:
    """commbench's ops and transports (bench_src/schema/vocabulary.json)."""
    try:
        document = json.loads(VOCABULARY_PATH.read_text(encoding="utf-8"))
        return frozenset(document["ops"]), frozenset(document["transports"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CatalogError(f"cannot read commbench's vocabulary {VOCABULARY_PATH}: {exc}") from None


def _check_vocabulary(knobs: Mapping[str, Knob], source: str) -> None:
    """A knob's ops and transports are commbench's names (or "*"): a typo would keep it out of every space."""
    ops, transports = _vocabulary()
    for knob in knobs.values():
        for field, names, known in (("ops", knob.ops, ops), ("transports", knob.transports, transports)):
            unknown = [name for name in names if name != "*" and name not in known]
            if unknown:
                raise CatalogError(f"{source}: knobs.{knob.name}.{field}: {unknown} are not commbench "
                                   f"{field} ({', '.join(sorted(known))}; {VOCABULARY_PATH})")


def _validate_at(knob: Knob, value: str, source: str, where: str) -> str:
    try:
        return knob.check_value(value)
    except UnsafeValueError as exc:
        raise CatalogError(f"{source}: {where}: {exc}") from exc


def _narrow(knob: Knob, restriction: KnobRestriction, default: str | None, source: str) -> Knob:
    where = f"knobs.restrict.{knob.name}"
    update: dict[str, Any] = {"default": default}
    if restriction.choices is not None:
        if knob.type is not KnobType.CATEGORICAL:
            raise CatalogError(f"{source}: {where}.choices: {knob.name} is not categorical")
        for choice in restriction.choices:
            _validate_at(knob, choice, source, f"{where}.choices")
        update["choices"] = restriction.choices
        update["value_versions"] = {
            value: spec for value, spec in knob.value_versions.items() if value in restriction.choices
        }
    for bound in ("low", "high"):
        value = getattr(restriction, bound)
        if value is None:
            continue
        if knob.type not in (KnobType.INT, KnobType.POW2):
            raise CatalogError(f"{source}: {where}.{bound}: {knob.name} is not an int knob")
        _validate_at(knob, str(value), source, f"{where}.{bound}")
        update[bound] = value
    if knob.search_values is not None:
        low, high = update.get("low", knob.low), update.get("high", knob.high)
        assert low is not None and high is not None  # search_values exist only on int knobs
        update["search_values"] = tuple(v for v in knob.search_values if low <= v <= high) or None
    narrowed = _build(Knob, {**knob.model_dump(), **update, "unset_equals": None}, source, where)
    if knob.unset_equals is None:
        return narrowed
    try:
        narrowed.check_value(knob.unset_equals)
    except UnsafeValueError:  # the narrowed domain leaves that value out: it can never be set here
        return narrowed
    return narrowed.model_copy(update={"unset_equals": knob.unset_equals})
