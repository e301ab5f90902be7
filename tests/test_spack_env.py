"""Spack side, checked without Spack (it cannot be installed here; spack_env/README.md): every
environment uses only keys of Spack's environment schema (spack_env/spack_check.py, key lists
transcribed from spack/spack's lib/spack/spack/schema) and only variants its packages have (the recipes
here, and the builtin packages the environments use, transcribed from spack/spack-packages) and names what
it needs; the checker catches what it must; the commbench recipe is valid Python whose variants and CMake
defines match bench_src's CMake options, and whose CMake minimum is bench_src's; the ReFrame build fixture
of a site that builds with Spack installs commbench alone from an environment in its stage directory."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures_sites import site_data, write_site

from campaigns.model.site import available_sites, load_site

REPO = Path(__file__).resolve().parents[1]
SPACK_ENV = REPO / "spack_env"
RECIPE = SPACK_ENV / "repos" / "spack_repo" / "commcamp" / "packages" / "commbench" / "package.py"
sys.path.insert(0, str(SPACK_ENV))
from spack_check import (PY_COMMCAMP_RECIPE, check_environment_file, check_manifest,  # noqa: E402
                         check_python_recipe, commbench_environment, known_packages, read_recipe, repo_paths,
                         spec_nodes)

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
    # nvcc compiles the host code of the .cu files with the C++ compiler: Spack gives a build one only on request
    assert recipe.conditions["cxx"] == ["+cuda"]


def test_cmake_minimum_is_one_version_everywhere() -> None:
    """bench_src's CMake projects (commbench and the tuner plugin beside it) and the recipes that build them
    (commbench; py-commcamp, whose `bench build`/`plugin build` run CMake) name one minimum CMake version, and the
    projects use nothing newer: the plugin asked for 3.21 (PROJECT_IS_TOP_LEVEL) while the rest said 3.18, so a
    CMake 3.20 that the recipes accepted failed to configure."""
    projects = sorted((REPO / "bench_src").rglob("CMakeLists.txt"))
    assert REPO / "bench_src" / "nccl_tuner" / "CMakeLists.txt" in projects
    minimums = {path.relative_to(REPO).as_posix(): re.search(r"cmake_minimum_required\(VERSION ([0-9.]+)\)",
                                                             path.read_text()).group(1) for path in projects}
    recipes = {name: [d for d in read_recipe(SPACK_ENV / "repos" / "spack_repo" / "commcamp" / "packages" / name /
                                             "package.py").dependencies if d.startswith("cmake@")]
               for name in ("commbench", "py_commcamp")}
    (minimum,) = set(minimums.values())
    assert recipes == {"commbench": [f"cmake@{minimum}:"], "py_commcamp": [f"cmake@{minimum}:"]}, (minimums, recipes)
    newer = {"PROJECT_IS_TOP_LEVEL": "3.21", "cmake_path(": "3.20", "CMAKE_CUDA_ARCHITECTURES all": "3.23"}
    for path in [*projects, *(REPO / "bench_src").rglob("*.cmake")]:
        for feature, since in newer.items():
            if tuple(map(int, since.split("."))) > tuple(map(int, minimum.split("."))):
                assert feature not in path.read_text(), f"{path}: {feature} needs CMake {since}"


def test_tuner_plugin_honours_commbench_werror(tmp_path: Path) -> None:
    """The recipe's ~werror (its default) and COMMBENCH_WERROR=OFF reach the tuner plugin built beside commbench
    (add_subdirectory(nccl_tuner)), and standalone; the project's own builds keep -Werror (the default ON)."""
    def plugin_flags(source: Path, build: str, *options: str) -> str:
        done = subprocess.run(["cmake", "-S", str(source), "-B", str(tmp_path / build),
                               "-DMPI_C_COMPILER=mpicc.openmpi", *options],
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        found = list((tmp_path / build).rglob("nccl-tuner-commcamp.dir/flags.make"))
        assert len(found) == 1, found
        return found[0].read_text()
    bench_src = REPO / "bench_src"
    assert "-Werror" in plugin_flags(bench_src, "on")
    assert "-Werror" not in plugin_flags(bench_src, "off", "-DCOMMBENCH_WERROR=OFF")
    assert "-Werror" not in plugin_flags(bench_src / "nccl_tuner", "plugin-off", "-DCOMMBENCH_WERROR=OFF",
                                         "-DCOMMCAMP_TUNER_TESTS=OFF")


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


KNOWN = known_packages([SPACK_ENV / "repos" / "spack_repo" / "commcamp"])


def test_the_checker_knows_every_package_the_environments_name() -> None:
    """Every package named in a spec, an external or a ^dependency of the shipped environments has its variants in
    the checker (a recipe here, or SPACK_BUILTIN_VARIANTS with its source), so no variant goes unchecked."""
    named = set()
    for manifest in MANIFESTS:
        spack = yaml.safe_load(manifest.read_text())["spack"]
        texts = [*spack["specs"], *(e["spec"] for s in spack["packages"].values() for e in s.get("externals", []))]
        named |= {node.name for text in texts for node in spec_nodes(text)}
        assert known_packages(repo_paths({"spack": spack}, manifest.parent)).keys() >= {"commbench", "py-commcamp"}
    assert named and named <= set(KNOWN), named - set(KNOWN)


@pytest.mark.parametrize("spec, variants", [
    ("commbench +cuda cuda_arch=90 +ccl ^openmpi fabrics=ucx", [("commbench", ["cuda", "cuda_arch", "ccl"]),
                                                                ("openmpi", ["fabrics"])]),
    ("rccl-tests+rocm amdgpu_target=gfx90a %cxx=llvm-amdgpu@6.0.3", [("rccl-tests", ["rocm", "amdgpu_target"]),
                                                                     ("llvm-amdgpu", [])]),
    ("builtin.openmpi@4.1.6 ~cuda cflags='-O2 -g' target=zen3", [("openmpi", ["cuda"])]),
    ("+cuda cuda_arch=80", [(None, ["cuda", "cuda_arch"])]),
    ("py-commcamp@=0.1.0 +postgresql", [("py-commcamp", ["postgresql"])]),
])
def test_spec_nodes_reads_packages_and_variants(spec: str, variants: list) -> None:
    assert [(node.name, node.variants) for node in spec_nodes(spec)] == variants


@pytest.mark.parametrize("text, where, message", [
    # LUMI's spec as it was: Spack's rccl-tests is a plain CMakePackage (variant mpi only)
    ("spack:\n  specs: [rccl-tests +rocm amdgpu_target=gfx90a]\n", "spack.specs[0]",
     "rccl-tests has no variant 'rocm'"),
    ("spack:\n  specs: [commbench +cuda +nccl]\n", "spack.specs[0]", "commbench has no variant 'nccl'"),
    ("spack:\n  specs: [osu-micro-benchmarks ^openmpi +ucx]\n", "spack.specs[0]", "openmpi has no variant 'ucx'"),
    ("spack:\n  packages:\n    nccl:\n      externals:\n        - {spec: nccl +cuda cuda_arc=90, prefix: /usr}\n",
     "spack.packages.nccl.externals[0].spec", "nccl has no variant 'cuda_arc'"),
    ("spack:\n  packages:\n    openmpi:\n      require: ['+cudaa']\n", "spack.packages.openmpi.require[0]",
     "openmpi has no variant 'cudaa'"),
    ("spack:\n  develop:\n    commbench: {spec: commbench@=0.1.0 +rocn, path: .}\n", "spack.develop.commbench.spec",
     "commbench has no variant 'rocn'"),
    # a compiler package's external without its compilers cannot serve %cxx=llvm-amdgpu nor hip-lang
    ("spack:\n  packages:\n    llvm-amdgpu:\n      externals:\n"
     "        - {spec: llvm-amdgpu@6.0.3, prefix: /opt/rocm}\n",
     "spack.packages.llvm-amdgpu.externals[0].extra_attributes.compilers", "llvm-amdgpu is a compiler package"),
])
def test_checker_rejects_a_variant_the_package_lacks(tmp_path: Path, text: str, where: str, message: str) -> None:
    """Where the checker knows the package (a recipe of the environment's repositories, or a builtin package of
    SPACK_BUILTIN_VARIANTS), a variant it lacks is a problem; a package it does not know is not judged."""
    (tmp_path / "env").mkdir()
    manifest = tmp_path / "env" / "spack.yaml"
    repo = SPACK_ENV / "repos" / "spack_repo" / "commcamp"
    manifest.write_text(text.replace("spack:\n", f"spack:\n  repos: [{repo}]\n", 1))
    problems = check_environment_file(manifest)
    assert problems and problems[0].startswith(f"{manifest}: {where}: {message}"), problems
    fine = ("spack:\n  specs: [rccl-tests +mpi, hdf5 +whatever, commbench +rocm amdgpu_target=gfx90a ~ccl +werror,"
            " osu-micro-benchmarks +rocm amdgpu_target=gfx90a +xccl ^cray-mpich +rocm]\n"
            "  packages:\n    all: {variants: [+anything]}\n    llvm-amdgpu:\n      externals:\n"
            "        - {spec: llvm-amdgpu@6.0.3, prefix: /opt/rocm/llvm, extra_attributes: {compilers: "
            "{c: /opt/rocm/llvm/bin/amdclang, cxx: /opt/rocm/llvm/bin/amdclang++}}}\n")
    manifest.write_text(fine.replace("spack:\n", f"spack:\n  repos: [{repo}]\n", 1))
    assert check_environment_file(manifest) == []


@pytest.mark.parametrize("site", ["alps", "lumi", "local"])
def test_commbench_environment_is_the_sites_for_commbench_alone(tmp_path: Path, site: str) -> None:
    """The Spack build's environment (ReFrame's build fixture writes it into its stage directory): the site's
    packages and concretizer, no specs (the build adds commbench's), commbench's develop entry at the stage's
    sources and nothing of py-commcamp (its `path: ../..` is the checkout, not an installed commcamp), the
    package repository by an absolute path; a manifest that passes the checker."""
    manifest = SPACK_ENV / site / "spack.yaml"
    spack = yaml.safe_load(manifest.read_text())["spack"]
    made = commbench_environment(manifest, "..")
    assert made["spack"]["specs"] == [] and made["spack"]["view"] is False
    assert made["spack"]["develop"] == {"commbench": {"spec": "commbench@=0.1.0", "path": ".."}}
    assert made["spack"]["packages"] == spack["packages"] and made["spack"]["concretizer"] == spack["concretizer"]
    (repo,) = made["spack"]["repos"].values()
    assert Path(repo).is_absolute() and Path(repo) == (SPACK_ENV / "repos" / "spack_repo" / "commcamp").resolve()
    written = tmp_path / "commbench-spack-env" / "spack.yaml"
    written.parent.mkdir()
    written.write_text(yaml.safe_dump(made))
    assert check_environment_file(written) == []
    assert not (manifest.parent / "spack.lock").exists()


def test_spack_build_installs_commbench_alone_from_an_environment_in_its_stage(tmp_path: Path) -> None:
    """`commbench.build: spack` (Alps): the build fixture installs the site's commbench spec, and nothing else of the
    site's environment (commcamp itself, nccl-tests, OSU), in an environment it writes into its stage directory from
    the site's (spack.lock and .spack-env/ land there, not in spack_env/<site>, which an installed commcamp holds in
    its read-only install tree); it links the installed commbench into the stage, which the runs execute (dry run:
    no Spack here)."""
    def edit(data: dict) -> None:
        data["systems"][0]["partitions"][0]["commbench"].update(build="spack", spack_env="spack_env/local",
                                                                spack_spec="commbench ^openmpi")
    prefix = tmp_path / "rfm"
    config = write_site(tmp_path / "site-local", site_data("local", edit))
    result = subprocess.run(
        [str(Path(sys.executable).with_name("reframe")), "-C", str(config), "-c", str(REPO / "reframe_checks"),
         "--prefix", str(prefix), "--report-file", str(prefix / "report.json"), "--nocolor", "--dry-run",
         "-n", "commbench_pairmatrix", "-p", "openmpi"],
        env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    build_dir = next((prefix / "stage").glob("local/cpu/openmpi/commbench_build_*"))
    build = (build_dir / "rfm_build.sh").read_text()
    assert "spack -e commbench-spack-env add commbench ^openmpi\n" in build, build
    assert "spack -e commbench-spack-env install --fail-fast -j 2\n" in build, build
    assert 'ln -sf "$(spack -e commbench-spack-env location -i commbench ^openmpi)/bin/commbench" commbench' in build
    assert str(SPACK_ENV) not in build, build
    made = yaml.safe_load((build_dir / "commbench-spack-env" / "spack.yaml").read_text())["spack"]
    assert made["specs"] == [] and set(made["develop"]) == {"commbench"}
    assert made["develop"]["commbench"]["path"] == ".."
    assert (build_dir / "commbench-spack-env" / ".." / "CMakeLists.txt").is_file()  # the stage's copy of bench_src
    assert made["packages"] == yaml.safe_load((SPACK_ENV / "local" / "spack.yaml").read_text())["spack"]["packages"]
    job = next((prefix / "stage").glob("local/cpu/openmpi/commbench_pairmatrix_*/rfm_job.sh")).read_text()
    assert f" {build_dir / 'commbench'} --op pairmatrix " in job
