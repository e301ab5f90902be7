"""Spack side, checked without Spack (it cannot be installed here; spack_env/README.md): every
environment uses only keys of Spack's environment schema (spack_env/spack_check.py, key lists
transcribed from spack/spack's lib/spack/spack/schema) and names what it needs; the checker catches
what it must; the commbench recipe is valid Python whose variants and CMake defines match
bench_src's CMake options."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from campaigns.model.site import available_sites, load_site

REPO = Path(__file__).resolve().parents[1]
SPACK_ENV = REPO / "spack_env"
RECIPE = SPACK_ENV / "repos" / "spack_repo" / "commcamp" / "packages" / "commbench" / "package.py"
sys.path.insert(0, str(SPACK_ENV))
from spack_check import (PY_COMMCAMP_RECIPE, check_environment_file, check_manifest,  # noqa: E402
                         check_python_recipe, read_recipe)

MANIFESTS = sorted(SPACK_ENV.glob("*/spack.yaml"))


def test_every_site_has_a_spack_environment() -> None:
    assert {m.parent.name for m in MANIFESTS} == set(available_sites())


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.parent.name)
def test_environment_uses_only_spack_schema_keys_and_names_what_it_needs(manifest: Path) -> None:
    assert check_environment_file(manifest) == []
    spack = yaml.safe_load(manifest.read_text())["spack"]
    packages = {spec.split()[0] for spec in spack["specs"]}
    assert "commbench" in packages and "osu-micro-benchmarks" in packages and "py-commcamp" in packages
    assert (manifest.parent / spack["develop"]["py-commcamp"]["path"] / "pyproject.toml").is_file()
    assert spack["develop"]["py-commcamp"]["spec"] == "py-commcamp@=0.1.0"
    site = load_site(manifest.parent.name)
    gpu = {p.commbench.backend for s in site.systems for p in s.partitions if p.commbench} - {"cpu"}
    if gpu == {"cuda"}:
        assert "nccl-tests" in packages
    elif gpu == {"hip"}:
        assert "rccl-tests" in packages
    # repos and develop paths resolve from the environment directory to this repository
    repo = spack["repos"]["commcamp"].replace("$env", str(manifest.parent))
    assert (Path(repo) / "repo.yaml").is_file() and (Path(repo) / "packages" / "commbench" / "package.py").is_file()
    develop = manifest.parent / spack["develop"]["commbench"]["path"]
    assert (develop / "CMakeLists.txt").is_file()
    assert spack["develop"]["commbench"]["spec"] == "commbench@=0.1.0"
    # every external says what it is
    for name, settings in spack.get("packages", {}).items():
        for external in settings.get("externals", []):
            assert external["spec"].startswith(name), (name, external)


def test_sites_that_build_with_spack_install_commbench_from_their_environment() -> None:
    for name in available_sites():
        for system in load_site(name).systems:
            for part in system.partitions:
                if part.commbench and part.commbench.build == "spack":
                    manifest = REPO / part.commbench.spack_env / "spack.yaml"
                    specs = yaml.safe_load(manifest.read_text())["spack"]["specs"]
                    wanted = part.commbench.spack_spec.split()
                    assert any(set(wanted) <= set(spec.split()) for spec in specs), (name, wanted, specs)


@pytest.mark.parametrize("text, where", [
    ("spack:\n  specz: [commbench]\n", "spack.specz"),
    ("spack:\n  packages:\n    openmpi:\n      extrenals: []\n", "spack.packages.openmpi.extrenals"),
    ("spack:\n  packages:\n    openmpi:\n      externals:\n        - prefix: /usr\n",
     "spack.packages.openmpi.externals[0].spec"),
    ("spack:\n  packages:\n    openmpi:\n      externals:\n        - {spec: openmpi, path: /usr}\n",
     "spack.packages.openmpi.externals[0].path"),
    ("spack:\n  packages:\n    all:\n      externals: []\n", "spack.packages.all.externals"),
    ("spack:\n  concretizer:\n    unify: sometimes\n", "spack.concretizer.unify"),
    ("spack:\n  concretizer:\n    reuse_all: true\n", "spack.concretizer.reuse_all"),
    ("spack:\n  view:\n    default: {link: all}\n", "spack.view.default.root"),
    ("spack:\n  develop:\n    commbench: {path: ../../bench_src}\n", "spack.develop.commbench.spec"),
    ("spack:\n  repos:\n    mine: {url: https://example.org/repo.git}\n", "spack.repos.mine.url"),
    ("spack:\n  specs:\n    - {matrix: [[a]], excludes: [b]}\n", "spack.specs[0].excludes"),
    ("packages: {}\n", "(document)"),
])
def test_checker_rejects_what_spack_rejects(tmp_path: Path, text: str, where: str) -> None:
    manifest = tmp_path / "spack.yaml"
    manifest.write_text(text)
    problems = check_environment_file(manifest)
    assert problems and problems[0].startswith(f"{manifest}: {where}: "), problems


def test_checker_rejects_malformed_yaml_and_duplicate_keys(tmp_path: Path) -> None:
    manifest = tmp_path / "spack.yaml"
    manifest.write_text("spack:\n  view: false\n  view: true\n")
    (problem,) = check_environment_file(manifest)
    assert "malformed YAML" in problem and "duplicate key 'view'" in problem
    manifest.write_text("spack: [\n")
    assert "malformed YAML" in check_environment_file(manifest)[0]
    assert check_manifest({"spack": {"view": True, "concretizer": {"unify": "when_possible"}}}) == []


def cmake_cache_options() -> dict[str, set[str]]:
    """COMMBENCH_* cache variables of bench_src's CMake files, with their STRINGS values (or ON/OFF)."""
    text = "".join((REPO / "bench_src" / name).read_text() for name in ("CMakeLists.txt", "cmake/gpu.cmake"))
    options: dict[str, set[str]] = {}
    for name in re.findall(r"^\s*set\((COMMBENCH_\w+) .* CACHE ", text, re.MULTILINE):
        options[name] = set()
    for name in re.findall(r"^\s*option\((COMMBENCH_\w+) ", text, re.MULTILINE):
        options[name] = {"ON", "OFF"}
    for name, values in re.findall(r"set_property\(CACHE (COMMBENCH_\w+) PROPERTY STRINGS ([^)]*)\)", text):
        options[name] = set(values.split())
    return options


def test_recipe_variants_match_the_cmake_options() -> None:
    recipe = read_recipe(RECIPE)
    options = cmake_cache_options()
    assert set(options) == {"COMMBENCH_BACKEND", "COMMBENCH_CCL", "COMMBENCH_WERROR", "COMMBENCH_CUDA_ARCHS",
                            "COMMBENCH_HIP_ARCHS"}
    assert recipe.class_name == "Commbench"
    assert recipe.bases == ["CMakePackage", "CudaPackage", "ROCmPackage"]  # +cuda/cuda_arch, +rocm/amdgpu_target
    defined = {name for name in recipe.cmake_defines if name.startswith("COMMBENCH_")}
    assert defined == set(options), "the recipe must set every commbench CMake option and no other"
    for name, values in recipe.cmake_values.items():
        if name in options and options[name]:
            assert values <= options[name], (name, values, options[name])
    assert recipe.cmake_values["COMMBENCH_BACKEND"] == {"cpu", "cuda", "hip"}
    assert set(recipe.variant_defines.values()) <= set(recipe.variants)
    assert recipe.variants == {"ccl": True, "werror": False}
    assert recipe.spec_variants == {"cuda_arch", "amdgpu_target"}
    assert {"mpi", "nccl", "rccl", "hip"} <= set(recipe.dependencies)


def test_repo_yaml_names_the_repository() -> None:
    repo = yaml.safe_load((RECIPE.parents[2] / "repo.yaml").read_text())["repo"]
    assert repo["namespace"] == RECIPE.parents[2].name == "commcamp"
    assert re.fullmatch(r"v2\.\d+", repo["api"])


def test_py_commcamp_recipe_pins_what_pyproject_pins(tmp_path: Path) -> None:
    """The recipe's run dependencies are pyproject.toml's exact pins under Spack's names; a pin changed on
    one side only, or a dependency on one side only, is named."""
    recipe, pyproject = SPACK_ENV / PY_COMMCAMP_RECIPE, REPO / "pyproject.toml"
    problems, missing = check_python_recipe(recipe, pyproject)
    assert problems == []
    # What Spack's builtin repository lacks (read from spack/spack-packages; spack_check.SPACK_BUILTIN).
    assert "reframe@=4.10.4: Spack builtin's newest is 4.10.0" in missing
    assert "py-optuna@=5.0.0: Spack builtin's newest is 4.8.0" in missing
    changed = tmp_path / "pyproject.toml"
    changed.write_text(pyproject.read_text().replace('"optuna==5.0.0"', '"optuna==5.0.1"').replace(
        '"scipy==1.17.1",', '"scipy==1.17.1", "tabulate==0.9.0",'))
    problems, _ = check_python_recipe(recipe, changed)
    assert problems == [f"{recipe}: py-optuna@=5.0.0 but pyproject.toml pins 'optuna==5.0.1'",
                        f"{recipe}: no depends_on for pyproject.toml's 'tabulate==0.9.0' (py-tabulate)"]
    extra = tmp_path / "package.py"
    extra.write_text(recipe.read_text().replace('depends_on("py-numpy")', 'depends_on("py-numpy")\n        '
                                                'depends_on("py-requests")'))
    assert check_python_recipe(extra, pyproject)[0] == [f"{extra}: depends_on('py-requests') is not in pyproject.toml"]
