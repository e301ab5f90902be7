"""Site configurations: `commcamp site check` on every site and on broken copies (errors by file, line
and key), every site's ReFrame configuration loading and listing the expected checks per
system:partition (remote sites: list only, the system named with --system), and
site_configs/h200/run-suite.sh here (dry run of the h200 suite; a real run against site local)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from campaigns.model import site as site_module
from campaigns.model import vocabulary
from campaigns.model.site import ALL_OPS, NVLINK_MULTICAST_OFF, TRANSPORTS, available_sites, check_site, load_site
from fixtures_cli import commcamp
from test_reframe_checks import REPO, SITE_CONFIGS, reframe, report_cases
from tuners.catalog import KnobCatalog

LMOD_CMD = Path("/usr/share/lmod/lmod/libexec/lmod")  # Debian's lmod (Makefile APT_PACKAGES)
VENV_BIN = REPO / ".venv" / "bin"


def test_knob_catalog_scopes_name_commbench_ops_and_transports() -> None:
    """A knob scoped to a misspelt op or transport would silently never be searched."""
    catalog = KnobCatalog.load()
    assert not [(knob.name, op) for knob in catalog for op in set(knob.ops) - {"*", *ALL_OPS}]
    assert not [(knob.name, name) for knob in catalog for name in set(knob.transports) - {"*", *TRANSPORTS}]
    point_to_point = {knob.name for knob in catalog if "sendrecv" in knob.ops and "pingpong" in knob.ops}
    assert {"NCCL_NCHANNELS_PER_NET_PEER", "NCCL_NCHANNELS_PER_PEER"} <= point_to_point


def test_every_site_passes_site_check() -> None:
    code, out, err = commcamp("site", "check", "--all")
    assert code == 0, out + err
    assert out.splitlines() == [f"site {name}: ok" for name in available_sites()]
    assert {"alps", "leonardo", "lumi", "generic-slurm", "local", "localslurm", "h200"} <= set(available_sites())


@pytest.fixture
def site_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """site_configs/ copied to tmp_path (without the Slurm cluster scripts), and campaigns.model.site using it."""
    copy = tmp_path / "site_configs"
    shutil.copytree(SITE_CONFIGS, copy, ignore=shutil.ignore_patterns("cluster", "knobs", "__pycache__"))
    monkeypatch.setattr(site_module, "SITE_CONFIGS_DIR", copy)
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


def test_checking_a_site_leaves_the_environment_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """localslurm's ReFrame configuration sets SLURM_CONF and PATH for a plain `reframe -C` without env.sh: loaded
    by `run`'s scheduler check, its SLURM_CONF (a cluster not started) stayed, and the Slurm preflight read it as the
    caller's."""
    import reframe  # noqa: F401  (importing it sets RFM_INSTALL_PREFIX, as it does for every ReFrame run)

    monkeypatch.delenv("SLURM_CONF", raising=False)
    before = dict(os.environ)
    check_site("localslurm")
    assert dict(os.environ) == before


def test_h200_without_nvlink_multicast_off_fails_the_check(site_copies: Path) -> None:
    site_yaml = site_copies / "h200" / "site.yaml"
    line = line_of(site_yaml, "env_vars:")
    edit(site_yaml, '          TORCH_SYMM_MEM_DISABLE_MULTICAST: "1"\n', "")
    (problem,) = check_site("h200")
    assert problem.startswith(f"{site_yaml}:")
    assert "systems[0].partitions[0]: the GPUs can use NVLink multicast" in problem
    assert "env_vars must set TORCH_SYMM_MEM_DISABLE_MULTICAST=1" in problem
    assert int(problem.split(":")[1]) < line  # the partition's line
    assert NVLINK_MULTICAST_OFF == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                    "NVSHMEM_DISABLE_NVLS": "1"}


def test_site_check_names_file_line_and_key_of_each_problem(site_copies: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site_yaml = site_copies / "h200" / "site.yaml"
    edit(site_yaml, "choices: [Ring, Tree, PAT]", "choices: [Ring, Tree, Chain]")
    (problem,) = check_site("h200")  # the line of the key (site check said the file alone)
    assert problem.startswith(f"{site_yaml}:{line_of(site_yaml, 'Chain]')}: knobs.restrict.NCCL_ALGO.choices: ")
    assert "'Chain' is not one of" in problem

    local_yaml = site_copies / "local" / "site.yaml"
    edit(local_yaml, "        max_jobs: 1\n", "        max_jobz: 1\n")
    (site_copies / "local" / "env.sh").unlink()
    problems = check_site("local")
    assert problems == [f"{local_yaml}:{line_of(local_yaml, 'max_jobz')}: systems[0].partitions[0].max_jobz: "
                        "unknown field"]
    edit(local_yaml, "        max_jobz: 1\n", "        max_jobs: 1\n")
    (problem,) = check_site("local")
    assert problem.startswith(f"{site_copies / 'local' / 'env.sh'}: missing")

    # a scheduler or launcher ReFrame does not know: the check said ok, and `run` stored every case as an error
    # whose reason (ReFrame's "no such scheduler") was only in reframe.out
    for text, typo, field in (("scheduler: local", "scheduler: lcoal", "scheduler"),
                              ("launcher: mpiexec-from-env", "launcher: mpiexecc", "launcher")):
        edit(local_yaml, text, typo)
        assert (f"{local_yaml}:{line_of(local_yaml, typo)}: systems[0].partitions[0].{field}: ReFrame has no such "
                f"{field}: '{typo.split()[1]}'") in check_site("local")  # beside env.sh missing (above)
        edit(local_yaml, typo, text)

    # an access option a shell cannot split (ReFrame, the placement and the Slurm snapshot split it): `run` died
    # in the placement with a traceback
    slurm_yaml = site_copies / "localslurm" / "site.yaml"
    edit(slurm_yaml, "access: ['--partition=debug']", "access: ['--partition=debug', \"--comment=it's mine\"]")
    (problem,) = check_site("localslurm")
    assert problem.startswith(f"{slurm_yaml}:{line_of(slurm_yaml, 'mine')}: systems[0].partitions[0].access: ")
    assert "\"--comment=it's mine\" cannot be split into words as a shell would (No closing quotation)" in problem
    edit(slurm_yaml, "access: ['--partition=debug', \"--comment=it's mine\"]", "access: ['--partition=debug']")

    config = site_copies / "localslurm" / "reframe_config.py"
    # the copies have no cluster/ (cluster.sh env gives the configuration its SLURM_CONF where none is set); loading
    # the configuration leaves the environment as it was, so no earlier load sets it for this one either
    monkeypatch.setenv("SLURM_CONF", "/dev/null")
    config.write_text(config.read_text() + "site_configuration['systems'][0]['partitions'][0]['max_jobs'] = 'many'\n")
    assert check_site("localslurm") == [f"{config}: systems.0.partitions.0.max_jobs: 'many' is not of type 'number'"]
    config.write_text("raise RuntimeError('broken on purpose')\n")
    (problem,) = check_site("localslurm")
    assert problem.startswith(f"{config}: cannot load: ") and "broken on purpose" in problem

    manifest = REPO / "spack_env" / "alps" / "spack.yaml"
    assert check_site("alps") == []
    alps_yaml = site_copies / "alps" / "site.yaml"
    edit(alps_yaml, "spack_env: spack_env/alps", "spack_env: spack_env/nowhere")
    assert check_site("alps") == [f"{REPO / 'spack_env' / 'nowhere' / 'spack.yaml'}: missing (a partition of site "
                                  "'alps' builds commbench with Spack)"]
    assert manifest.is_file()


def test_spack_on_a_partition_with_two_environments_fails_the_check(site_copies: Path) -> None:
    """One Spack spec builds for one MPI, but the build fixture and the reference checks run per environment:
    on local's two environments (openmpi, mpich) the mpich jobs would run `commbench ^openmpi` (or OSU built with
    Open MPI). site check refuses it, naming the partition and why; with one environment the site is sound."""
    local_yaml = site_copies / "local" / "site.yaml"
    edit(local_yaml, "          backend: cpu\n", "          backend: cpu\n          build: spack\n"
         "          spack_env: spack_env/local\n          spack_spec: commbench ^openmpi\n")
    (problem,) = check_site("local")
    assert problem.startswith(f"{local_yaml}:{line_of(local_yaml, '- name: cpu')}: systems[0].partitions[0]: ")
    assert ("partition 'cpu': commbench build: spack (spack_spec 'commbench ^openmpi'): one Spack spec builds for "
            "one MPI, but the partition has 2 environments (openmpi, mpich)") in problem
    edit(local_yaml, "environments: [openmpi, mpich]", "environments: [openmpi]")
    assert check_site("local") == []

    localslurm_yaml = site_copies / "localslurm" / "site.yaml"
    edit(localslurm_yaml, "        commbench:\n", "        reference_benchmarks:\n          osu: {package: "
         "osu-micro-benchmarks, spack_spec: osu-micro-benchmarks, node_counts: [2]}\n        commbench:\n")
    (problem,) = check_site("localslurm")
    assert (": systems[0].partitions[0]: partition 'debug': reference_benchmarks.osu (spack_spec "
            "'osu-micro-benchmarks'): one Spack spec builds for one MPI") in problem


def test_quoted_numbers_fail_the_check(site_copies: Path) -> None:
    """A number given as a string ("3") passed site check (pydantic's lax mode) and reached the ReFrame
    configuration as the string: the check listing crashed comparing it with a node count, and a reference for
    nodes "2" never matched in ReFrame (no reference: it could never fail) while health matched it."""
    localslurm_yaml = site_copies / "localslurm" / "site.yaml"
    edit(localslurm_yaml, "        nodes: 3\n", '        nodes: "3"\n')
    edit(localslurm_yaml, "          tasks_per_node: 2\n", '          tasks_per_node: "2"\n')
    edit(localslurm_yaml, "bytes: 8, nodes: 2,", 'bytes: 8, nodes: "2",')
    edit(localslurm_yaml, "node_counts: [1, 2, 3]", 'node_counts: [1, "2", 3]')
    def at(text: str) -> str:
        return f"{localslurm_yaml}:{line_of(localslurm_yaml, text)}: systems[0].partitions[0]."

    assert check_site("localslurm") == [
        at('nodes: "3"') + "nodes: Input should be a valid integer (got '3')",
        at('tasks_per_node: "2"') + "commbench.tasks_per_node: Input should be a valid integer (got '2')",
        at("node_counts:") + "commbench.node_counts[1]: Input should be 1, 2, 3, 4, 8, 16, 32, 64 or 128 (got '2')",
        at('nodes: "2"') + "commbench.references[0].nodes: Input should be a valid integer (got '2')"]
    # a size keeps its units (campaigns.model.sizes); YAML's true is still refused as a number
    edit(localslurm_yaml, '        nodes: "3"\n', "        nodes: 3\n")
    edit(localslurm_yaml, '          tasks_per_node: "2"\n', "          tasks_per_node: true\n")
    edit(localslurm_yaml, 'bytes: 8, nodes: "2",', "bytes: 8B, nodes: 2,")  # a reference's size too
    edit(localslurm_yaml, 'node_counts: [1, "2", 3]', "node_counts: [1, 2, 3]")
    edit(localslurm_yaml, "health: {min_bytes: 8, max_bytes: 1048576,", "health: {min_bytes: 8B, max_bytes: 1MiB,")
    (problem,) = check_site("localslurm")
    assert problem.endswith("systems[0].partitions[0].commbench.tasks_per_node: expected a number, not true")
    # the checks match a record's bytes: ReFrame's configuration has the reference's in bytes
    import reframe_site

    assert reframe_site._references([{"metric": "small_latency", "bytes": "1MiB"}, {"metric": "x"}]) == [
        {"metric": "small_latency", "bytes": 1048576}, {"metric": "x"}]


def test_partition_transports_are_those_built_for_its_backend(site_copies: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition's transports are the vocabulary's for its backend (TRANSPORT_BACKENDS): a GPU-only transport on a
    cpu partition and a CPU-only one on a GPU partition are refused, naming both. site.yaml had `backend: cpu` mean
    `transports: [mpi]` hard-coded, so a new CPU transport (in the vocabulary with backends [cpu]) could not be
    offered by any CPU site, while a GPU partition listing it passed the check and built a commbench without it."""
    local_yaml, h200_yaml = site_copies / "local" / "site.yaml", site_copies / "h200" / "site.yaml"
    edit(local_yaml, "transports: [mpi]", "transports: [mpi, ccl]")
    (problem,) = check_site("local")
    assert problem.startswith(f"{local_yaml}:") and "systems[0].partitions[0].commbench: " in problem
    assert "transports ['ccl'] are not built for the cpu backend (built for ccl: cuda, hip)" in problem
    # staging taken as a CPU-only transport, as a new one would be (its vocabulary entry: backends [cpu])
    monkeypatch.setitem(vocabulary.TRANSPORT_BACKENDS, "staging", ("cpu",))
    edit(local_yaml, "transports: [mpi, ccl]", "transports: [mpi, staging]")
    assert check_site("local") == []
    (problem,) = check_site("h200")
    assert problem.startswith(f"{h200_yaml}:") and "systems[0].partitions[0].commbench: " in problem
    assert "transports ['staging'] are not built for the cuda backend (built for staging: cpu)" in problem


def test_a_site_from_the_template_names_itself_and_site_check_names_its_edit_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`site new NAME --from generic-slurm` wrote the template's header into site.yaml ("Copy this directory to
    site_configs/<site>/", "what `commcamp site check generic-slurm` validates"), an env.sh saying to source
    site_configs/generic-slurm/env.sh and a reframe_config.py calling itself a template; and `site check` said
    only "ok" for the unedited copy. Now the files name the new site, and `site check` warns (stderr, exit code
    still 0) naming each site.yaml value that still says EDIT by file, line and key; a comment's EDIT is no value.
    `--all` says how many (the shipped template has them on purpose)."""
    code, out, err = commcamp("site", "new", "mysite", "--dir", tmp_path)
    assert code == 0, err
    site_dir = tmp_path / "mysite"
    site_yaml, env_sh, config = site_dir / "site.yaml", site_dir / "env.sh", site_dir / "reframe_config.py"
    assert f"value(s) of {site_yaml} still say EDIT" in err
    assert site_yaml.read_text().startswith("# Site 'mysite': made by `commcamp site new mysite --from generic-slurm`")
    assert "Copy this directory" not in site_yaml.read_text()
    assert f"`. {env_sh}`" in env_sh.read_text().splitlines()[0]
    assert config.read_text().startswith("\"\"\"ReFrame configuration of site 'mysite', made from site 'generic-slurm'")
    for path in (site_yaml, env_sh, config):  # the template is named only as where the site comes from
        assert not [line for line in path.read_text().splitlines()
                    if "generic-slurm" in line and "made" not in line and "site new" not in line], path
        assert "template for a new" not in path.read_text(), path

    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(tmp_path))
    code, out, err = commcamp("site", "check", "mysite")
    assert code == 0 and out.strip() == "site mysite: ok", out + err
    warned = [line.strip() for line in err.splitlines() if line.startswith(f"  {site_yaml}:")]
    assert f"{site_yaml}:{line_of(site_yaml, 'fabric:')}: network.fabric: 'EDIT: e.g. InfiniBand NDR, " \
           "Slingshot-11, 100 GbE'" in warned
    assert f"{site_yaml}:{line_of(site_yaml, 'libraries:') + 1}: systems[0].partitions[0].libraries[0].version: " \
           "'EDIT'" in warned
    assert f"site mysite: warning: {len(warned)} value(s) still say EDIT" in err
    assert not [line for line in warned if "systems[0].name" in line]  # `name: cluster  # EDIT`: a comment
    edit(site_yaml, '"EDIT: e.g. InfiniBand NDR, Slingshot-11, 100 GbE"', '"InfiniBand HDR"')
    code, out, err = commcamp("site", "check", "mysite")
    assert code == 0 and f"{len(warned) - 1} value(s) still say EDIT" in err and "network.fabric" not in err
    code, out, err = commcamp("site", "check", "--all")
    assert code == 0 and "site mysite: ok" in out, out + err
    assert f"site mysite: warning: {len(warned) - 1} value(s) still say EDIT" in err
    assert "network.topology" not in err  # --all: how many, each one with `site check mysite`


def test_site_cli_exit_codes(site_copies: Path) -> None:
    assert commcamp("site", "check", "mars")[0] == 2
    assert commcamp("site", "check")[0] == 2
    assert commcamp("site", "check", "local", "--all")[0] == 2
    edit(site_copies / "h200" / "site.yaml", "nodes: 1\n", "nodes: 0\n")
    code, out, err = commcamp("site", "check", "--all")
    assert code == 1
    assert "site h200: 1 problem(s)" in err and "systems[0].partitions[0].nodes" in err
    assert "site local: ok" in out
    assert commcamp("site", "show", "h200")[0] == 2
    code, out, _ = commcamp("site", "list")
    assert code == 0 and "invalid" in out


def test_site_show_gives_the_nominal_bandwidths() -> None:
    code, out, err = commcamp("site", "show", "h200")
    assert code == 0, out + err
    assert "GPU pair 478 (unverified), NIC -, host<->device 63 (unverified)" in out
    assert "nccl 2.28.3 (verified" in out and "commbench references: 47" in out
    code, out, err = commcamp("site", "show", "lumi")
    assert code == 0 and "GPU pair 50-200 (unverified)" in out


# Per site: --system to name, test names that must be listed, and names that must not be.
LISTINGS = {
    "local": ("local:cpu", ["commbench_sweep %op=allgather %transport=mpi %size_range=large %num_nodes=1",
                            "commbench_pairmatrix %transport=mpi %num_nodes=1",
                            "commbench_run %op=pingpong %num_nodes=1"],
              ["num_nodes=2", "nccl_tests_run", "osu_run", "commbench_hostdevice", "commbench_gpu_aware_mpi"]),
    "localslurm": ("localslurm:debug", ["commbench_sweep %op=allreduce %transport=mpi %size_range=health %num_nodes=3",
                                        "commbench_pairmatrix %transport=mpi %num_nodes=3",
                                        "commbench_run %op=alltoall %num_nodes=3"],
                   ["commbench_sweep %op=pingpong %transport=mpi %size_range=health %num_nodes=3", "num_nodes=4"]),
    "h200": ("h200:gpu", ["commbench_hostdevice %op=h2d", "nccl_tests_run %benchmark=all_reduce_perf %num_nodes=1",
                          "commbench_sweep %op=alltoall %transport=d2d %size_range=health %num_nodes=1",
                          "commbench_pairmatrix %transport=mpi %num_nodes=1",
                          "commbench_gpu_aware_mpi %op=pingpong", "commbench_gpu_aware_mpi %op=sendrecv"],
             ["num_nodes=2", "osu_run", "commbench_sweep %op=allreduce %transport=d2d "]),
    "alps": ("daint:normal", ["nccl_tests_run %benchmark=sendrecv_perf %num_nodes=2",
                              "osu_run %benchmark=osu_bw %num_nodes=2",
                              "commbench_sweep %op=allreduce %transport=ccl %size_range=health %num_nodes=2"],
             ["commbench_sweep %op=pingpong %transport=d2d %size_range=health %num_nodes=2"]),
    "leonardo": ("leonardo:booster", ["commbench_hostdevice %op=d2h", "commbench_run %op=bcast %num_nodes=16",
                                      "nccl_tests_run %benchmark=all_reduce_perf %num_nodes=2"],
                 ["commbench_sweep %op=allreduce %transport=ccl %size_range=health %num_nodes=3", "num_nodes=32"]),
    "lumi": ("lumi:standard-g", ["nccl_tests_run %benchmark=alltoall_perf %num_nodes=2",
                                 "commbench_pairmatrix %transport=d2d-kernel %num_nodes=1"],
             ["commbench_pairmatrix %transport=ccl %num_nodes=3"]),
    "generic-slurm": ("cluster:compute", ["osu_run %benchmark=osu_allreduce %num_nodes=2",
                                          "commbench_sweep %op=bcast %transport=mpi %size_range=small %num_nodes=2"],
                      ["commbench_hostdevice", "nccl_tests_run", "transport=ccl"]),
}


def test_every_site_has_a_listing_case() -> None:
    assert set(LISTINGS) == set(available_sites())


@pytest.mark.parametrize("site", sorted(LISTINGS))
def test_reframe_lists_the_suite_of_each_site(site: str, tmp_path: Path) -> None:
    system, expected, absent = LISTINGS[site]
    assert f"{system.split(':')[0]}" in [s.name for s in load_site(site).systems]
    env = dict(os.environ)
    if load_site(site).systems[0].modules_system == "lmod":
        if not LMOD_CMD.exists():
            pytest.skip(f"{site} uses Lmod and {LMOD_CMD} is not installed (make system-deps)")
        env["LMOD_CMD"] = str(LMOD_CMD)
    result = reframe(SITE_CONFIGS / site / "reframe_config.py", "--system", system, "-l", prefix=tmp_path / "rfm",
                     env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    listed = {line[2:].rsplit(" /", 1)[0] for line in result.stdout.splitlines() if line.startswith("- ")}
    for name in expected:
        assert name in listed, (name, sorted(listed))
    for fragment in absent:
        assert not [name for name in listed if fragment in name], fragment


def test_show_config_of_the_gpu_machine(tmp_path: Path) -> None:
    result = reframe(SITE_CONFIGS / "h200" / "reframe_config.py", "--show-config=systems/0/partitions/0/env_vars",
                     prefix=tmp_path / "rfm")
    assert result.returncode == 0, result.stdout + result.stderr
    env = dict(json.loads(result.stdout[result.stdout.index("["):result.stdout.rindex("]") + 1]))
    assert {k: env[k] for k in NVLINK_MULTICAST_OFF} == NVLINK_MULTICAST_OFF


def run_suite(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """site_configs/h200/run-suite.sh with this venv's python3 first in PATH (it imports reframe)."""
    full_env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", **(env or {})}
    full_env.pop("RFM_CONFIG_FILES", None)
    return subprocess.run([str(SITE_CONFIGS / "h200" / "run-suite.sh"), *args, str(out)], capture_output=True,
                          text=True, timeout=600, check=False, cwd=REPO, env=full_env)


def bundle_names(out: Path) -> list[str]:
    with tarfile.open(out / "suite.tar.gz") as bundle:
        return bundle.getnames()


def test_h200_suite_dry_run_writes_safe_job_scripts(tmp_path: Path) -> None:
    """The GPU machine's suite as job scripts (nothing runs): 22 health test cases, every job exports
    the NVLink-multicast switches and starts 4 ranks (2 for pingpong) with mpirun; nccl-tests, absent
    here, is skipped with its reason."""
    out = tmp_path / "out"
    result = run_suite(out, "--dry-run", env={"NCCL_TESTS_DIR": str(tmp_path / "no-nccl-tests")})
    assert result.returncode == 0, result.stdout + result.stderr
    cases = report_cases(out)
    assert len(cases) == 22
    skipped = [tc["display_name"] for tc in cases if tc["result"] == "skip"]
    assert skipped == ["nccl_tests_run %benchmark=all_reduce_perf %num_nodes=1"]
    assert "no executable all_reduce_perf in" in result.stdout
    scripts = list((out / "rfm" / "stage").glob("h200/gpu/openmpi-cuda/*/rfm_job.sh"))
    assert len(scripts) == 21
    for script in scripts:
        text = script.read_text()
        for name, value in NVLINK_MULTICAST_OFF.items():
            assert f"export {name}={value}\n" in text, script
        assert ("mpirun -np 2 " if "pingpong" in text.split("--op ")[1][:9] else "mpirun -np 4 ") in text, script
    build = next((out / "rfm" / "stage").glob("h200/gpu/openmpi-cuda/commbench_build_*/rfm_build.sh")).read_text()
    assert "-DCOMMBENCH_BACKEND=cuda" in build and "-DCOMMBENCH_CUDA_ARCHS=90" in build
    names = bundle_names(out)
    assert {"report.json", "machine.txt", "reframe.out"} <= set(names)
    assert not [n for n in names if "/build/" in n]


def test_h200_gpu_aware_mpi_jobs_use_the_ucx_environment(tmp_path: Path) -> None:
    """commbench_gpu_aware_mpi (tag gpu_aware_mpi) runs in h200's openmpi-ucx-cuda environment: its job
    scripts export the UCX recipe and pass --assume-gpu-aware-mpi; with no UCX folder it skips, saying why."""
    out = tmp_path / "skip"
    result = run_suite(out, "--dry-run", "--tags", "gpu_aware_mpi", env={"COMMCAMP_UCX_CUDA": str(tmp_path / "none")})
    assert result.returncode == 0, result.stdout + result.stderr
    cases = report_cases(out)
    assert sorted(tc["display_name"] for tc in cases) == [f"commbench_gpu_aware_mpi %op={op}"
                                                           for op in ("pingpong", "pingpong_bi", "sendrecv")]
    assert {tc["result"] for tc in cases} == {"skip"} and "UCX_MODULE_DIR" in result.stdout
    ucx = tmp_path / "ucx"
    (ucx / "libucx" / "lib" / "ucx").mkdir(parents=True)
    out = tmp_path / "run"
    result = run_suite(out, "--dry-run", "--tags", "gpu_aware_mpi", env={"COMMCAMP_UCX_CUDA": str(ucx)})
    assert result.returncode == 0, result.stdout + result.stderr
    scripts = sorted((out / "rfm" / "stage").glob("h200/gpu/openmpi-ucx-cuda/commbench_gpu_aware_mpi*/rfm_job.sh"))
    assert len(scripts) == 3
    for script in scripts:
        text = script.read_text()
        assert "export OMPI_MCA_pml=ucx\n" in text and "export OMPI_MCA_pml_ucx_tls=any\n" in text
        assert "export UCX_MODULE_DIR=$COMMCAMP_UCX_CUDA/libucx/lib/ucx\n" in text
        assert "--transport mpi" in text and "--assume-gpu-aware-mpi" in text


def test_run_suite_runs_a_site_and_bundles_the_results(tmp_path: Path) -> None:
    """The script's whole path on site local (no GPU here): ReFrame runs the health suite, the report,
    perflogs and every commbench.jsonl land in OUTDIR and in its bundle."""
    out = tmp_path / "out"
    result = run_suite(out, env={"COMMCAMP_SUITE_SITE": "local"})
    assert result.returncode == 0, result.stdout + result.stderr
    cases: list[dict[str, Any]] = report_cases(out)
    assert len(cases) == 8 and {tc["result"] for tc in cases} == {"pass"}
    names = bundle_names(out)
    assert "rfm/perflogs/local/cpu/commbench_sweep.log" in names
    assert len([n for n in names if n.endswith("/commbench.jsonl")]) == 8
    assert "reframe exit status 0" in (out / "reframe.out").read_text()


def test_a_local_scheduler_partition_of_several_nodes_is_refused(site_copies: Path) -> None:
    """`scheduler: local` with `nodes: 2` passed `site check`; every 2-node case then failed ("ranks ran on 1
    distinct hosts, expected 2")."""
    local_yaml = site_copies / "local" / "site.yaml"
    edit(local_yaml, "        nodes: 1\n", "        nodes: 2\n")
    (problem,) = check_site("local")
    assert problem.startswith(f"{local_yaml}:") and "nodes 2: ReFrame's local scheduler runs every job on this " \
        "host; give nodes: 1, or a batch scheduler" in problem, problem
