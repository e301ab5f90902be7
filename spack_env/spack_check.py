"""Static checks of the Spack side, without Spack (it cannot be installed on the machines that run CI):

* `check_environment_file(path)`: a spack.yaml is well-formed YAML (no duplicate keys) and uses only
  keys of Spack's environment schema, for the sections commcamp's environments use (packages and their
  externals, concretizer, view, repos, develop, specs); other sections are checked by name only.
* `read_recipe(path)`: what a package.py declares (class, bases, variants, dependencies, the CMake
  cache variables its cmake_args define), read with `ast`, nothing imported.
* `check_python_recipe(recipe, pyproject)`: py-commcamp's dependencies are pyproject.toml's pins, one
  for one, under Spack's names; and which of them Spack's builtin repository lacks (SPACK_BUILTIN).

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
import re
import sys
import tomllib
from collections.abc import Iterator
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
    """Every problem of a spack.yaml, as `FILE: key.path: message`; empty when it passes."""
    try:
        data = YamlDocument(Path(path)).data  # duplicate keys refused, as Spack's loader does
    except YamlModelError as exc:
        return exc.problems
    return [f"{path}: {where}: {message}" for where, message in check_manifest(data)]


def check_manifest(data: Any) -> list[tuple[str, str]]:
    """(key path, message) for every problem of a parsed spack.yaml."""
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
    return problems


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
