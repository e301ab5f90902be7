"""The knob catalog checked against an installed MPI's control variables (MPI_T cvars).

Input: the JSON Lines `commbench --list-cvars` prints (bench_src/src/mpit.c: name, type, scope, bound,
enum_from, enum [{value, name}] or null, value). A catalog knob maps to a cvar by name: Open MPI's MCA
variable NAME is read from OMPI_MCA_NAME, MPICH's cvar MPIR_CVAR_NAME from the variable of the same
name. Findings per knob of the library:

- missing: the catalog says the knob applies to this version, the library has no such variable;
- stale: the catalog says the knob (or one of its values) does not exist in this version, the
  library has it;
- domain: a categorical choice the library does not list, a bool the library does not take as a
  boolean (an integer variable without values counts only where it is 0 or 1 when unset: MPICH types every
  cvar int or char), an int/pow2 knob the library does not type as an integer, or one whose unset value lies
  outside the knob's [low, high] without the catalog saying so (its `unset` text begins with that value, e.g.
  btl_tcp_sndbuf's "0: the kernel's socket buffer autotuning");
- unset: the catalog's unset_equals is not the value the library holds when the variable is unset
  (the search would take that setting for the library's own and never measure it);
- note (not a failure): library values the catalog does not search (besides the default that
  equals unset), and the library's value when the variable is unset.

Knobs whose variable the library does not expose through MPI_T (e.g. Cray MPICH's MPICH_* names)
cannot be checked this way and are listed as such.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuners.catalog import MPICH_ALIAS_PREFIXES, MPICH_CVAR_PREFIX, Knob, KnobCatalog, KnobType, Library, parse_version

CVAR_PREFIX = {Library.OPENMPI: "OMPI_MCA_", Library.MPICH: MPICH_CVAR_PREFIX}
# Every environment name the library reads its control variables from: Open MPI OMPI_MCA_<var> (component
# selections such as OMPI_MCA_btl included); MPICH 4.0.2 MPIR_CVAR_<NAME> and its aliases (catalog.env_names).
ENV_PREFIXES = {Library.OPENMPI: ("OMPI_MCA_",), Library.MPICH: (MPICH_CVAR_PREFIX, *MPICH_ALIAS_PREFIXES)}
# Set for the listing: Open MPI also reads its MCA parameter files ($HOME/.openmpi/mca-params.conf,
# <sysconfdir>/openmpi-mca-params.conf: mca_base_param_files), which would show a user's or the system's setting as
# the library's unset value. /dev/null reads as an empty file (Open MPI 4.1.4: the listing then shows
# mca_base_param_files=/dev/null and coll_tuned_use_dynamic_rules false with a HOME whose file sets it true).
# The admin's override file (mca_base_override_param_file, constant scope) cannot be turned off this way.
LISTING_ENV = {Library.OPENMPI: {"OMPI_MCA_mca_base_param_files": "/dev/null"}, Library.MPICH: {}}
INTEGER_TYPES = frozenset({"int", "unsigned", "unsigned_long", "unsigned_long_long", "count"})
BOOL_NAMES = frozenset({"false", "true"})


class CvarListError(ValueError):
    """The cvar listing is not the JSON Lines commbench --list-cvars prints; the message says where."""


@dataclass(frozen=True)
class Cvar:
    name: str
    type: str
    value: Any
    enum: tuple[str, ...] | None  # item names, in the library's order
    enum_values: tuple[int, ...] = ()  # the items' integer values, same order


@dataclass(frozen=True)
class KnobFinding:
    knob: str
    kind: str  # "missing", "stale", "domain", "unset", "note", "unchecked"
    message: str

    @property
    def failure(self) -> bool:
        return self.kind in ("missing", "stale", "domain", "unset")


@dataclass(frozen=True)
class CheckReport:
    library: Library
    version: str
    checked: tuple[str, ...]  # knobs compared with a cvar
    findings: tuple[KnobFinding, ...] = field(default_factory=tuple)

    @property
    def failures(self) -> tuple[KnobFinding, ...]:
        return tuple(f for f in self.findings if f.failure)


def parse_cvars(lines: Iterable[str], source: str) -> dict[str, Cvar]:
    """The cvars of a `commbench --list-cvars` listing, by name."""
    cvars: dict[str, Cvar] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            enum = entry["enum"]
            cvar = Cvar(str(entry["name"]), str(entry["type"]), entry.get("value"),
                        None if enum is None else tuple(str(item["name"]) for item in enum),
                        () if enum is None else tuple(int(item["value"]) for item in enum))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CvarListError(f"{source}: line {number}: not a cvar record ({exc}): {line.strip()[:120]}") from None
        cvars[cvar.name] = cvar
    if not cvars:
        raise CvarListError(f"{source}: no control variables listed")
    return cvars


def cvar_name(library: Library, knob: str) -> str | None:
    """The MPI_T name of a knob's variable, or None when the name has no cvar form for this library."""
    prefix = CVAR_PREFIX[library]
    if not knob.startswith(prefix):
        return None
    return knob.removeprefix(prefix) if library is Library.OPENMPI else knob


def library_environment(library: Library | str, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the variables through which the library reads control variables, and with Open MPI's
    parameter files turned off (LISTING_ENV): the listing is then the library's own (every component opened, each
    variable at its unset value), not the caller's, the user's or the system's settings."""
    library = Library(library)
    prefixes = ENV_PREFIXES[library]
    return {**{name: value for name, value in environ.items() if not name.startswith(prefixes)},
            **LISTING_ENV[library]}


def listed_library(cvars: Mapping[str, Cvar]) -> Library | None:
    """The MPI whose cvars these are, by their names: MPICH names every cvar MPIR_CVAR_*, Open MPI names
    them after its MCA variables (never MPIR_CVAR_*); None for a mix of both."""
    mpich = sum(name.startswith(CVAR_PREFIX[Library.MPICH]) for name in cvars)
    return Library.MPICH if mpich == len(cvars) else Library.OPENMPI if mpich == 0 else None


def check_catalog(catalog: KnobCatalog, library: Library | str, version: str, cvars: Mapping[str, Cvar],
                  source: str = "the cvar listing") -> CheckReport:
    """Every catalog knob of `library` compared with the installed library's cvars (listed by `source`)."""
    library = Library(library)
    if library not in CVAR_PREFIX:
        raise ValueError(f"knobs check compares MPI_T control variables: library must be one of "
                         f"{', '.join(CVAR_PREFIX)}, not {library}")
    listed = listed_library(cvars)
    if listed not in (library, None):  # another MPI's cvars: every knob would read as missing
        raise CvarListError(f"{source}: these are {listed}'s control variables, not {library}'s: the binary is "
                            f"linked against {listed}; give a commbench built against {library}")
    parse_version(version)
    versions: dict[Library, str | None] = {library: version}
    findings: list[KnobFinding] = []
    checked = []
    for knob in catalog:
        if library not in knob.libraries:
            continue
        name = cvar_name(library, knob.name)
        if name is None:
            findings.append(KnobFinding(knob.name, "unchecked", f"not an MPI_T variable of {library}"))
            continue
        applies = knob.applies_to(versions) is None
        cvar = cvars.get(name)
        if cvar is None:
            if applies:
                findings.append(KnobFinding(knob.name, "missing",
                                            f"{library} {version} has no control variable {name}"))
            continue
        checked.append(knob.name)
        if not applies:
            versions_text = ", ".join(f"{lib.value} {spec}" for lib, spec in knob.versions.items())
            findings.append(KnobFinding(knob.name, "stale", f"the catalog's versions {versions_text} exclude "
                                        f"{library} {version}, which has {name}"))
        findings.extend(_domain_findings(knob, cvar, versions))
    return CheckReport(library, version, tuple(checked), tuple(findings))


def _domain_findings(knob: Knob, cvar: Cvar, versions: Mapping[Library, str | None]) -> list[KnobFinding]:
    found: list[KnobFinding] = []
    library_values = set(cvar.enum or ())
    if knob.type is KnobType.CATEGORICAL:
        assert knob.choices is not None
        if cvar.enum is None:
            found.append(KnobFinding(knob.name, "domain", f"categorical in the catalog, but {cvar.name} "
                                     f"({cvar.type}) lists no values"))
            return found
        offered = set(knob.choices_for(versions))
        unknown = [c for c in knob.choices if c in offered and c not in library_values]
        if unknown:
            found.append(KnobFinding(knob.name, "domain", f"choices {unknown} are not values of {cvar.name} "
                                     f"{list(cvar.enum)}"))
        excluded = [c for c in knob.choices if c not in offered and c in library_values]
        if excluded:
            found.append(KnobFinding(knob.name, "stale", f"value_versions exclude {excluded} from this version, "
                                     f"which lists them"))
        extra = [v for v in cvar.enum if v not in knob.choices and v != _unset_value(cvar)]
        if extra:
            found.append(KnobFinding(knob.name, "note", f"library values not searched: {extra}"))
    elif knob.type is KnobType.BOOL:
        integer = _integer(cvar.value)
        if not (cvar.type == "bool" or library_values == BOOL_NAMES or cvar.type in INTEGER_TYPES and not cvar.enum):
            found.append(KnobFinding(knob.name, "domain", f"bool in the catalog, {cvar.name} is {cvar.type} "
                                     f"{list(cvar.enum or ())}"))
        elif cvar.type in INTEGER_TYPES and not cvar.enum and integer not in (0, 1):
            # an integer variable is a boolean only where its own value is one: MPICH types every cvar int or char
            found.append(KnobFinding(knob.name, "domain", f"bool in the catalog, {cvar.name} is {cvar.type} "
                                     f"{_shown(cvar)} when unset, not 0 or 1"))
    elif cvar.type not in INTEGER_TYPES or cvar.enum:
        found.append(KnobFinding(knob.name, "domain", f"{knob.type} in the catalog, {cvar.name} is {cvar.type}"
                                 + (f" with values {list(cvar.enum)}" if cvar.enum else "")))
    elif knob.unset_equals is None and (outside := _unset_outside(knob, cvar)) is not None:
        found.append(KnobFinding(knob.name, "domain", outside))
    unset = _catalog_form(cvar)
    if knob.unset_equals is not None and unset is not None and knob.unset_equals != unset:
        found.append(KnobFinding(knob.name, "unset", f"unset_equals {knob.unset_equals} in the catalog, but "
                                 f"{cvar.name} is {unset} when unset"))
    found.append(KnobFinding(knob.name, "note", f"unset = {cvar.name}={_shown(cvar)} in the library; "
                             f"catalog: {knob.unset}"))
    return found


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _unset_outside(knob: Knob, cvar: Cvar) -> str | None:
    """Why the variable's unset value, outside the int knob's [low, high], is a problem: the catalog's `unset` does
    not begin with that value (as btl_tcp_sndbuf's "0: the kernel's ..." does, a value no search can set); None
    where it lies inside, could not be read, or the catalog says so."""
    value = _integer(cvar.value)
    assert knob.low is not None and knob.high is not None
    if value is None or knob.low <= value <= knob.high:
        return None
    stated = re.match(r"\s*(-?[0-9]+)(?![0-9])", knob.unset)
    if stated is not None and int(stated.group(1)) == value:
        return None
    return (f"{cvar.name} is {value} when unset, outside the catalog's [{knob.low}, {knob.high}], and the catalog's "
            f"unset ({knob.unset!r}) does not begin with {value}: a wrong domain, or say it (\"{value}: ...\")")


def _catalog_form(cvar: Cvar) -> str | None:
    """The variable's unset value as the catalog writes values (bool 0/1, an enum item's name, an integer's
    digits), or None where it could not be read."""
    if isinstance(cvar.value, bool):
        return str(int(cvar.value))
    name = _unset_value(cvar)
    if name is not None:
        return name
    return str(cvar.value) if isinstance(cvar.value, int) else None


def _unset_value(cvar: Cvar) -> str | None:
    """The enum item the variable holds when unset (its current value in a clean environment)."""
    if cvar.enum is None:
        return None
    if isinstance(cvar.value, str):
        return cvar.value
    if isinstance(cvar.value, int) and not isinstance(cvar.value, bool) and cvar.value in cvar.enum_values:
        return cvar.enum[cvar.enum_values.index(cvar.value)]
    return None


def _shown(cvar: Cvar) -> str:
    name = _unset_value(cvar)
    return name if name is not None else json.dumps(cvar.value)


def format_report(report: CheckReport, *, notes: bool = False) -> Sequence[str]:
    """One line per finding (failures first), then a summary line."""
    kinds = ("missing", "stale", "domain", "unset", "unchecked", *(("note",) if notes else ()))
    lines = [f"{f.kind}: {f.knob}: {f.message}" for kind in kinds for f in report.findings if f.kind == kind]
    lines.append(f"{report.library} {report.version}: {len(report.checked)} catalog knob(s) compared with MPI_T, "
                 f"{len(report.failures)} problem(s)")
    return lines
