"""Static checks of the Spack side, without Spack (it cannot be installed on the machines that run CI):

* `check_environment_file(path)`: a spack.yaml is well-formed YAML (no duplicate keys) and uses only
  keys of Spack's environment schema, for the sections commcamp's environments use (packages and their
  externals, concretizer, view, repos, develop, specs); other sections are checked by name only.
* `read_recipe(path)`: what a package.py declares (class, bases, variants, dependencies, the CMake
  cache variables its cmake_args define), read with `ast`, nothing imported.
* `check_python_recipe(recipe, pyproject)`: py-commcamp's dependencies are pyproject.toml's pins, one
  for one, under Spack's names; and which of them Spack's builtin repository lacks (SPACK_BUILTIN).
* the specs of an environment (`specs`, externals, `develop`, a package's `variants`/`require`) name only
  variants their package has, where the checker knows the package: the recipes of the package repositories
  the environment names (read with `ast`) and the builtin packages commcamp's environments use
  (SPACK_BUILTIN_VARIANTS, transcribed from spack/spack-packages); an external of a compiler package
  (llvm-amdgpu) names its compilers (`extra_attributes: compilers`), or Spack cannot build with it.
* `commbench_environment(manifest, sources)`: a commbench-only environment made from a site's, for the
  ReFrame build fixture (reframe_checks/lib/commbench_tests.py) to write into its stage directory.

The key lists below are transcribed from Spack's JSON schemas in spack/spack, lib/spack/spack/schema
(read through the project's public-code index; "Copyright Spack Project Developers" versions, i.e.
Spack v1.x):
  env.py         the `spack:` section = every section of merged.py + `specs`, `include_concrete`
  merged.py      sections: bootstrap cdash compilers concretizer config container ci definitions
                 develop env_vars include mirrors modules packages repos toolchains upstreams view
  packages.py    `all` and per-package keys, external entries (additionalProperties: False)
  concretizer.py (commit 060b0cac53c79742b41ab8f8ef295c3737cb3dd4) concretizer keys
  view.py        (commit 0f37fb1e2a79217865fc3aa2a8ae3bad17759273) view: bool, path or named views
  repos.py       list of paths, or name -> path | {git, branch, commit, tag, destination, paths}
  develop.py     name -> {spec (required), path}
  spec_list.py   a spec list entry: a string, or {matrix, exclude}
Only key names and the shapes above are vendored; no Spack code is.
"""
from __future__ import annotations

import ast
import os
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from campaigns.model.yamlio import YamlDocument, YamlModelError

SPACK_SECTIONS = frozenset({
    "bootstrap", "cdash", "compilers", "concretizer", "config", "container", "ci", "definitions", "develop",
    "env_vars", "include", "mirrors", "modules", "packages", "repos", "toolchains", "upstreams", "view",
    "specs", "include_concrete"})
PACKAGE_KEYS = frozenset({"require", "prefer", "conflict", "version", "buildable", "permissions",
                          "package_attributes", "variants", "externals"})
ALL_PACKAGES_KEYS = frozenset({"require", "prefer", "conflict", "target", "compiler", "buildable", "permissions",
                               "package_attributes", "providers", "variants"})
EXTERNAL_KEYS = frozenset({"spec", "prefix", "modules", "id", "extra_attributes", "dependencies"})
CONCRETIZER_KEYS = frozenset({"reuse", "enable_node_namespace", "targets", "unify", "splice", "duplicates",
                              "static_analysis", "timeout", "error_on_timeout", "os_compatible"})
VIEW_KEYS = frozenset({"root", "link", "link_type", "select", "exclude", "projections"})
REPO_GIT_KEYS = frozenset({"git", "branch", "commit", "tag", "destination", "paths"})
DEVELOP_KEYS = frozenset({"spec", "path"})
SPEC_MATRIX_KEYS = frozenset({"matrix", "exclude"})

# The builtin Spack package of each commcamp dependency, with the newest version its package.py declares
# (None: the package exists, its versions were not read). Read on 2026-11-23 from spack/spack-packages,
# repos/spack_repo/builtin/packages/<name with _ for ->/package.py, through the public-code index.
SPACK_BUILTIN = {
    "reframe": "4.10.0", "py-optuna": "4.8.0", "py-sqlalchemy": "2.0.43", "py-alembic": "1.16.5",
    "py-pydantic": "2.12.4", "py-jsonschema": "4.25.1", "py-rich": "13.9.4", "py-typer": "0.20.1",
    "py-plotly": "6.3.1", "py-setuptools": "82.0.1", "py-psycopg2": "2.9.10", "py-pyyaml": None,
    "py-pandas": None, "py-pyarrow": None, "py-scipy": None, "py-packaging": None, "py-numpy": None,
    "gmake": None, "cmake": None, "python": None,
}
PY_COMMCAMP_RECIPE = "repos/spack_repo/commcamp/packages/py_commcamp/package.py"
# PyPI names whose Spack package is not py-<name>; psycopg (3) has none in builtin, the recipe uses
# psycopg2 (a variant) instead.
SPACK_NAMES = {"reframe-hpc": "reframe", "psycopg": "py-psycopg2"}
# Recipe dependencies that are not pyproject dependencies: the interpreter, the build backend, what
# commcamp imports directly but pins through others (numpy), and the tools its build commands run.
RECIPE_ONLY = frozenset({"python", "py-setuptools", "py-numpy", "cmake", "gmake"})


def check_environment_file(path: Path) -> list[str]:
    """Every problem of a spack.yaml, as `FILE: key.path: message`; empty when it passes. The variants of
    its specs are checked against the builtin packages of SPACK_BUILTIN_VARIANTS and the recipes of the
    package repositories its `repos:` names (relative to the environment directory, `$env` expanded)."""
    try:
        data = YamlDocument(Path(path)).data  # duplicate keys refused, as Spack's loader does
    except YamlModelError as exc:
        return exc.problems
    repos = repo_paths(data, Path(path).parent) if isinstance(data, dict) else []
    return [f"{path}: {where}: {message}" for where, message in check_manifest(data, known_packages(repos))]


def check_manifest(data: Any, known: dict[str, KnownPackage] | None = None) -> list[tuple[str, str]]:
    """(key path, message) for every problem of a parsed spack.yaml; `known`: the packages whose variants are
    checked (default: known_packages(), the builtin ones of SPACK_BUILTIN_VARIANTS)."""
    if not isinstance(data, dict) or set(data) != {"spack"}:
        return [("(document)", "a Spack environment manifest has exactly one top-level key, 'spack'")]
    spack = data["spack"]
    if not isinstance(spack, dict):
        return [("spack", "must be a mapping")]
    problems = [(f"spack.{key}", "not a section of Spack's environment schema") for key in spack
                if key not in SPACK_SECTIONS]
    checks = {"packages": _packages, "concretizer": _concretizer, "view": _view, "repos": _repos,
              "develop": _develop, "specs": _specs}
    for section, check in checks.items():
        if section in spack:
            problems += list(check(f"spack.{section}", spack[section]))
    return problems + list(_variants(spack, known_packages() if known is None else known))


def _unknown(where: str, mapping: Any, allowed: frozenset[str]) -> Iterator[tuple[str, str]]:
    if not isinstance(mapping, dict):
        yield where, "must be a mapping"
        return
    for key in mapping:
        if key not in allowed:
            yield f"{where}.{key}", f"unknown key (allowed: {', '.join(sorted(allowed))})"


def _packages(where: str, packages: Any) -> Iterator[tuple[str, str]]:
    if not isinstance(packages, dict):
        yield where, "must be a mapping"
        return
    for name, settings in packages.items():
        here = f"{where}.{name}"
        yield from _unknown(here, settings, ALL_PACKAGES_KEYS if name == "all" else PACKAGE_KEYS)
        if not isinstance(settings, dict) or name == "all":
            continue
        if "buildable" in settings and not isinstance(settings["buildable"], bool):
            yield f"{here}.buildable", "must be true or false"
        externals = settings.get("externals", [])
        if not isinstance(externals, list):
            yield f"{here}.externals", "must be a list"
            continue
        for index, external in enumerate(externals):
            yield from _unknown(f"{here}.externals[{index}]", external, EXTERNAL_KEYS)
            if isinstance(external, dict) and not isinstance(external.get("spec"), str):
                yield f"{here}.externals[{index}].spec", "required (a spec string)"


def _concretizer(where: str, concretizer: Any) -> Iterator[tuple[str, str]]:
    yield from _unknown(where, concretizer, CONCRETIZER_KEYS)
    if isinstance(concretizer, dict) and concretizer.get("unify", True) not in (True, False, "when_possible"):
        yield f"{where}.unify", "must be true, false or when_possible"


def _view(where: str, view: Any) -> Iterator[tuple[str, str]]:
    if isinstance(view, (bool, str)):
        return
    yield from _named_entries(where, view, VIEW_KEYS, "root", "true/false, a path, or named views")


def _named_entries(where: str, mapping: Any, allowed: frozenset[str], required: str,
                   what: str) -> Iterator[tuple[str, str]]:
    """A mapping of names to entries with `allowed` keys, `required` among them."""
    if not isinstance(mapping, dict):
        yield where, f"must be {what}"
        return
    for name, entry in mapping.items():
        yield from _unknown(f"{where}.{name}", entry, allowed)
        if isinstance(entry, dict) and required not in entry:
            yield f"{where}.{name}.{required}", "required"


def _repos(where: str, repos: Any) -> Iterator[tuple[str, str]]:
    if isinstance(repos, list):
        for index, path in enumerate(repos):
            if not isinstance(path, str):
                yield f"{where}[{index}]", "must be a path"
        return
    if not isinstance(repos, dict):
        yield where, "must be a list of paths or a mapping of repository names"
        return
    for name, repo in repos.items():
        if not isinstance(repo, str):
            yield from _unknown(f"{where}.{name}", repo, REPO_GIT_KEYS)


def _develop(where: str, develop: Any) -> Iterator[tuple[str, str]]:
    yield from _named_entries(where, develop, DEVELOP_KEYS, "spec", "a mapping of package names")


def _specs(where: str, specs: Any) -> Iterator[tuple[str, str]]:
    if not isinstance(specs, list):
        yield where, "must be a list"
        return
    for index, spec in enumerate(specs):
        if not isinstance(spec, str):
            yield from _unknown(f"{where}[{index}]", spec, SPEC_MATRIX_KEYS)


@dataclass
class Recipe:
    """What a package.py declares, as written (read with ast)."""

    class_name: str
    bases: list[str]
    variants: dict[str, Any] = field(default_factory=dict)  # name -> default (None if not a literal)
    dependencies: list[str] = field(default_factory=list)
    conditions: dict[str, list[str | None]] = field(default_factory=dict)  # depends_on spec -> its when= (None)
    cmake_defines: set[str] = field(default_factory=set)  # first argument of self.define[_from_variant](...)
    variant_defines: dict[str, str] = field(default_factory=dict)  # define_from_variant: CMake name -> variant
    cmake_values: dict[str, set[str]] = field(default_factory=dict)  # self.define(name, "literal") values
    spec_variants: set[str] = field(default_factory=set)  # variants read in the methods: spec.variants["x"]


def read_recipe(path: Path) -> Recipe:
    """The package class of a package.py; SyntaxError if it is not valid Python, ValueError if it
    defines no class."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    if not classes:
        raise ValueError(f"{path}: no package class")
    cls = classes[0]
    recipe = Recipe(cls.name, [ast.unparse(base) for base in cls.bases])
    for node in ast.walk(cls):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        first = node.args[0] if node.args else None
        literal = first.value if isinstance(first, ast.Constant) else None
        if name == "variant" and isinstance(literal, str):
            default = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
            recipe.variants[literal] = default.value if isinstance(default, ast.Constant) else None
        elif name == "depends_on" and isinstance(literal, str):
            recipe.dependencies.append(literal)
            when = next((kw.value for kw in node.keywords if kw.arg == "when"), None)
            recipe.conditions.setdefault(literal, []).append(
                when.value if isinstance(when, ast.Constant) and isinstance(when.value, str) else None)
        elif name in ("self.define", "self.define_from_variant") and isinstance(literal, str):
            recipe.cmake_defines.add(literal)
            second = node.args[1] if len(node.args) > 1 else None
            values = [second] if isinstance(second, ast.Constant) else (
                [second.body, second.orelse] if isinstance(second, ast.IfExp) else [])
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    if name == "self.define_from_variant":
                        recipe.variant_defines[literal] = value.value
                    else:
                        recipe.cmake_values.setdefault(literal, set()).add(value.value)
    for node in ast.walk(cls):
        if (isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("variants")
                and isinstance(node.slice, ast.Constant)):
            recipe.spec_variants.add(node.slice.value)
    return recipe


# ---- variants of the packages an environment's specs name -------------------------------------------------
# Read on 2026-11-27 from spack/spack-packages at commit 1e8cf059e35d55c4fe1142fed41785bedf6c7246 (committed
# 2026-07-01), repos/spack_repo/builtin/: every variant("NAME", ...) of a package's class (the directory is the
# package name with _ for -) and of the build-system base classes it derives from (build_systems/*.py; Package,
# MpichEnvironmentModifications, LlvmDetection and CompilerPackage declare none), read with ast. The
# build_system variant comes from the build_system() directive of every base; dev_path, patches and commit are
# Spack's own. Whether a variant exists only `when=` something is not recorded: names only.
BUILTIN_SOURCE = ("spack/spack-packages@1e8cf059e35d, repos/spack_repo/builtin/packages/{}/package.py")
COMMON_VARIANTS = frozenset({"build_system", "dev_path", "patches", "commit"})
# key=value keys of a spec that are not variants: architecture, compiler flags
NOT_VARIANTS = frozenset({"arch", "architecture", "platform", "os", "target", "namespace", "cflags", "cxxflags",
                          "fflags", "cppflags", "ldflags", "ldlibs"})
BASE_CLASS_VARIANTS: dict[str, frozenset[str]] = {
    "Package": frozenset(), "AutotoolsPackage": frozenset(), "MakefilePackage": frozenset(),
    "PythonPackage": frozenset(), "CompilerPackage": frozenset(), "MpichEnvironmentModifications": frozenset(),
    "LlvmDetection": frozenset(),
    "CMakePackage": frozenset({"build_type", "ipo", "generator"}),  # build_systems/cmake.py
    "CudaPackage": frozenset({"cuda", "cuda_arch"}),  # build_systems/cuda.py
    "ROCmPackage": frozenset({"rocm", "amdgpu_target"}),  # build_systems/rocm.py
}
# Builtin packages that commcamp's environments name (specs, externals, ^dependencies): bases, own variants.
SPACK_BUILTIN_VARIANTS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "openmpi": (("AutotoolsPackage", "CudaPackage", "ROCmPackage"), frozenset({
        "atomics", "cray-xpmem", "cxx", "cxx_exceptions", "debug", "fabrics", "fortran", "gpfs", "internal-hwloc",
        "internal-libevent", "internal-pmix", "ipv6", "java", "legacylaunchers", "lustre", "memchecker", "openshmem",
        "orterunprefix", "pmi", "romio", "romio-filesystem", "rsh", "schedulers", "sqlite3", "static",
        "thread_multiple", "two_level_namespace", "vt", "wrapper-rpath"})),
    "mpich": (("MpichEnvironmentModifications", "AutotoolsPackage", "CudaPackage", "ROCmPackage"), frozenset({
        "argobots", "datatype-engine", "device", "fortran", "hcoll", "hwloc", "hydra", "level_zero", "libxml2",
        "netmod", "pci", "pmi", "romio", "slurm", "vci", "verbs", "wrapperrpath", "xpmem"})),
    "cray-mpich": (("MpichEnvironmentModifications", "Package", "CudaPackage", "ROCmPackage"), frozenset({"wrappers"})),
    "cuda": (("Package",), frozenset({"allow-unsupported-compilers", "dev"})),
    "nccl": (("MakefilePackage", "CudaPackage"), frozenset({"cuda", "fabrics"})),
    "nccl-tests": (("MakefilePackage", "CudaPackage"), frozenset({"cuda", "mpi"})),
    "osu-micro-benchmarks": (("AutotoolsPackage", "CudaPackage", "ROCmPackage"),
                             frozenset({"graphing", "papi", "xccl"})),
    # a plain CMakePackage (no ROCmPackage: no +rocm, no amdgpu_target) that requires %cxx=llvm-amdgpu
    "rccl-tests": (("CMakePackage",), frozenset({"mpi"})),
    "rccl": (("CMakePackage",), frozenset({"amdgpu_target", "asan"})),
    "hip": (("CMakePackage",), frozenset({"asan", "cuda", "rocm"})),
    "hsa-rocr-dev": (("CMakePackage",), frozenset({"asan", "image", "shared"})),
    "llvm-amdgpu": (("CMakePackage", "LlvmDetection", "CompilerPackage"), frozenset({
        "generator", "link_llvm_dylib", "llvm_dylib", "rocm-device-libs"})),
}


@dataclass(frozen=True)
class KnownPackage:
    """A package whose variants the checker knows, and where they were read."""

    variants: frozenset[str]
    source: str
    compiler: bool = False  # a CompilerPackage: its externals must name their compilers


def known_packages(repos: Iterable[Path] = ()) -> dict[str, KnownPackage]:
    """SPACK_BUILTIN_VARIANTS, then the recipes of the package repositories `repos` (Spack >= 1.0 layout:
    <repo>/packages/<name with _>/package.py) whose base classes are all in BASE_CLASS_VARIANTS."""
    known = {name: KnownPackage(own.union(*(BASE_CLASS_VARIANTS[b] for b in bases)),
                                BUILTIN_SOURCE.format(name.replace("-", "_")), "CompilerPackage" in bases)
             for name, (bases, own) in SPACK_BUILTIN_VARIANTS.items()}
    for repo in repos:
        for path in sorted(Path(repo).glob("packages/*/package.py")):
            try:
                recipe = read_recipe(path)
            except (SyntaxError, ValueError, OSError):
                continue  # not this checker's to judge here
            if all(base in BASE_CLASS_VARIANTS for base in recipe.bases):
                known[path.parent.name.replace("_", "-")] = KnownPackage(
                    frozenset(recipe.variants).union(*(BASE_CLASS_VARIANTS[b] for b in recipe.bases)), str(path),
                    "CompilerPackage" in recipe.bases)
    return known


def repo_paths(data: dict[str, Any], env_dir: Path) -> list[Path]:
    """The local package repositories a manifest names, resolved as Spack does: `$env` is the environment
    directory, a relative path is relative to it."""
    repos = data.get("spack", {}).get("repos") if isinstance(data.get("spack"), dict) else None
    entries = repos if isinstance(repos, list) else list(repos.values()) if isinstance(repos, dict) else []
    return [env_dir / entry.replace("$env", str(env_dir)) for entry in entries if isinstance(entry, str)]


_SPEC_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<edge>\^|%%?)(?:\[[^]]*\])?                         # a dependency (^) or direct dependency (%), edge attributes
  | (?P<pair>[A-Za-z0-9_][A-Za-z0-9_.-]*(?:==|:=|=)(?:'[^']*'|"[^"]*"|[^\s'"^%]*))  # key=value, ==, :=
  | (?P<flag>(?:\+\+|~~|--|\+|~|-)[A-Za-z0-9_][A-Za-z0-9_.-]*)  # +variant, ~variant (doubled: propagated)
  | (?P<version>@[^\s^%+~]*)
  | (?P<hash>/\w+)
  | (?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]*)
""", re.VERBOSE)


@dataclass
class SpecNode:
    """One node of a spec string: its package (None: anonymous) and the variants it sets, by name."""

    name: str | None
    variants: list[str] = field(default_factory=list)


def spec_nodes(text: str) -> list[SpecNode]:
    """The nodes of a spec string ("commbench +cuda cuda_arch=90 ^openmpi fabrics=ucx", "%cxx=llvm-amdgpu"),
    read as far as variants go; what it cannot read is skipped."""
    nodes, edge, pos = [SpecNode(None)], False, 0
    while pos < len(text):
        match = _SPEC_TOKEN.match(text, pos)
        if match is None:
            pos += 1
            continue
        pos, kind, token = match.end(), match.lastgroup, match.group()
        if kind == "space":
            continue
        if kind == "edge":
            nodes.append(SpecNode(None))
            edge = True
            continue
        node = nodes[-1]
        if kind == "name":
            if node.name is None and not node.variants:
                node.name = token.rsplit(".", 1)[-1]  # a namespace-qualified name: builtin.openmpi
            else:
                nodes.append(SpecNode(token.rsplit(".", 1)[-1]))
        elif kind == "pair":
            key, value = re.split(r"==|:=|=", token, maxsplit=1)
            if edge and node.name is None and not node.variants:  # %cxx=llvm-amdgpu: the provider of a virtual
                node.name = re.split(r"[@+~\s]", value.strip("'\""), maxsplit=1)[0] or None
            elif key not in NOT_VARIANTS:
                node.variants.append(key)
        elif kind == "flag":
            node.variants.append(token.lstrip("+~-"))
        edge = False
    return [node for node in nodes if node.name is not None or node.variants]


def _spec_problems(where: str, text: Any, known: dict[str, KnownPackage],
                   default: str | None = None) -> Iterator[tuple[str, str]]:
    """A variant that its (known) package lacks; anonymous nodes are package `default`'s."""
    if not isinstance(text, str):
        return
    for node in spec_nodes(text):
        name = node.name or default
        package = known.get(name or "")
        if package is None:
            continue
        for variant in dict.fromkeys(node.variants):
            if variant not in package.variants and variant not in COMMON_VARIANTS:
                yield where, (f"{name} has no variant {variant!r} (its variants: "
                              f"{', '.join(sorted(package.variants))}; read from {package.source})")


def _variants(spack: dict[str, Any], known: dict[str, KnownPackage]) -> Iterator[tuple[str, str]]:
    specs = spack.get("specs")
    for index, spec in enumerate(specs if isinstance(specs, list) else []):
        yield from _spec_problems(f"spack.specs[{index}]", spec, known)
    develop = spack.get("develop")
    for name, entry in (develop.items() if isinstance(develop, dict) else []):
        if isinstance(entry, dict):
            yield from _spec_problems(f"spack.develop.{name}.spec", entry.get("spec"), known, name)
    packages = spack.get("packages")
    for name, settings in (packages.items() if isinstance(packages, dict) else []):
        if not isinstance(settings, dict) or name == "all":  # `all`: each package takes what it has
            continue
        for key in ("variants", "require", "prefer"):
            values = settings.get(key)
            for index, value in enumerate(values if isinstance(values, list) else [values]):
                here = f"spack.packages.{name}.{key}" + (f"[{index}]" if isinstance(values, list) else "")
                yield from _spec_problems(here, value, known, name)
        externals = settings.get("externals")
        for index, external in enumerate(externals if isinstance(externals, list) else []):
            if not isinstance(external, dict):
                continue
            here = f"spack.packages.{name}.externals[{index}]"
            yield from _spec_problems(f"{here}.spec", external.get("spec"), known, name)
            package = known.get(name)
            compilers = (external.get("extra_attributes") or {}).get("compilers") \
                if isinstance(external.get("extra_attributes") or {}, dict) else None
            if package is not None and package.compiler and not (
                    isinstance(compilers, dict) and any(compilers.get(lang) for lang in ("c", "cxx", "fortran"))):
                yield (f"{here}.extra_attributes.compilers",
                       f"{name} is a compiler package: its external names its compilers (extra_attributes: "
                       "{compilers: {c: PATH, cxx: PATH}}), else Spack cannot build with it")


# ---- the commbench-only environment of the ReFrame build fixture ---------------------------------------------
COMMBENCH = "commbench"


def commbench_environment(manifest: Path, sources: str) -> dict[str, Any]:
    """A Spack environment for building commbench alone, made from a site's environment (`manifest`): its
    packages, externals, concretizer and other configuration as they are; no specs (the build adds the one it
    builds: `spack -e DIR add SPEC`); one develop entry, commbench's (the site's develop spec, else
    commbench@=0.1.0) with path `sources` (relative to the new environment's directory, where the build has
    a writable copy of bench_src: Spack builds a develop spec inside its source directory); local
    repositories and includes as absolute paths, resolved as Spack resolves them in the site's directory.
    Nothing of it is written to the site's directory (spack.lock, .spack-env/ go to where the new one is
    written), and the site's other develop entries (py-commcamp's `path: ../..`, which names the checkout and
    not an installed commcamp) are left out."""
    env_dir = Path(manifest).resolve().parent
    spack = dict(YamlDocument(Path(manifest)).data["spack"])
    spack["specs"] = []
    develop = spack.get("develop") if isinstance(spack.get("develop"), dict) else {}
    spec = (develop.get(COMMBENCH) or {}).get("spec", f"{COMMBENCH}@=0.1.0")
    spack["develop"] = {COMMBENCH: {"spec": spec, "path": sources}}
    spack["view"] = False

    def absolute(path: str) -> str:
        expanded = path.replace("$env", str(env_dir))
        return expanded if "$" in expanded else os.path.normpath(env_dir / expanded)
    repos = spack.get("repos")
    if isinstance(repos, list):
        spack["repos"] = [absolute(r) if isinstance(r, str) else r for r in repos]
    elif isinstance(repos, dict):
        spack["repos"] = {name: absolute(r) if isinstance(r, str) else r for name, r in repos.items()}
    if isinstance(spack.get("include"), list):
        spack["include"] = [absolute(i) if isinstance(i, str) and "://" not in i else i for i in spack["include"]]
    return {"spack": spack}


def _spec(text: str) -> tuple[str, str]:
    """"py-optuna@=5.0.0" -> ("py-optuna", "5.0.0"); version "" if none, ranges kept as written."""
    name, _, version = text.partition("@")
    return name, version.removeprefix("=")


def check_python_recipe(recipe_path: Path, pyproject_path: Path) -> tuple[list[str], list[str]]:
    """(problems, missing): problems where the recipe's run dependencies and pyproject.toml's pins differ;
    missing: what Spack's builtin repository lacks (a package, or the pinned version: newer than its newest)."""
    pins = tomllib.loads(Path(pyproject_path).read_text(encoding="utf-8"))["project"]["dependencies"]
    wanted = {}
    for pin in pins:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==([^;\s]+)", pin)
        if match is None:
            wanted[pin] = ("", "")
            continue
        name = match.group(1).lower()
        wanted[SPACK_NAMES.get(name, f"py-{name}")] = (pin, match.group(2))
    declared = dict(_spec(d) for d in read_recipe(recipe_path).dependencies)
    problems = [f"{recipe_path}: pyproject.toml's {pin or name!r} is not an exact pin (name==version)"
                for name, (pin, version) in wanted.items() if not version]
    for name, (pin, version) in wanted.items():
        if version and name not in declared:
            problems.append(f"{recipe_path}: no depends_on for pyproject.toml's {pin!r} ({name})")
        elif version and name != SPACK_NAMES["psycopg"] and declared[name] != version:
            problems.append(f"{recipe_path}: {name}@={declared[name]} but pyproject.toml pins {pin!r}")
    problems += [f"{recipe_path}: depends_on({name!r}) is not in pyproject.toml" for name in declared
                 if name not in wanted and name not in RECIPE_ONLY]
    missing = []
    for name, version in declared.items():
        if name not in SPACK_BUILTIN:
            missing.append(f"{name}: not a Spack builtin package")
            continue
        newest = SPACK_BUILTIN[name]
        if newest and version[:1].isdigit() and _version_key(version) > _version_key(newest):
            missing.append(f"{name}@={version}: Spack builtin's newest is {newest}")
        elif newest is None and version[:1].isdigit() and name.startswith("py-"):
            missing.append(f"{name}@={version}: the package is builtin; its versions were not read")
    return problems, missing


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def main(argv: list[str]) -> int:
    """`python spack_env/spack_check.py [spack.yaml ...]` (default: every spack_env/*/spack.yaml, and in a
    checkout the py-commcamp recipe against pyproject.toml)."""
    here = Path(__file__).resolve().parent
    paths = [Path(a) for a in argv] or sorted(here.glob("*/spack.yaml"))
    problems = [p for path in paths for p in check_environment_file(path)]
    pyproject = here.parent / "pyproject.toml"
    if not argv and pyproject.is_file():
        recipe_problems, missing = check_python_recipe(here / PY_COMMCAMP_RECIPE, pyproject)
        problems += recipe_problems
        print("py-commcamp's dependencies against Spack's builtin repository:\n  " + "\n  ".join(missing)
              if missing else "every py-commcamp dependency is in Spack's builtin repository")
    print("\n".join(problems) or f"{len(paths)} environment(s): ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
