"""`commcamp knobs check`: the knob catalog against the MPI_T control variables of Debian's Open MPI
4.1.4 and MPICH 4.0.2 (commbench --list-cvars), and a catalog with known faults."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from fixtures_bench import CommbenchBuild, commbench_builds  # noqa: F401  (fixture)
from fixtures_cli import commcamp

VERSIONS = {"openmpi": "4.1.4", "mpich": "4.0.2"}


@pytest.mark.parametrize("library", ["openmpi", "mpich"])
def test_the_catalog_matches_the_installed_mpi(commbench_builds: dict[str, CommbenchBuild], library: str) -> None:
    code, stdout, stderr = commcamp("knobs", "check", "--library", library,
                                    "--commbench", commbench_builds[library].binary, "--notes")
    assert code == 0, stdout + stderr
    summary = stdout.strip().splitlines()[-1]
    assert summary.startswith(f"{library} {VERSIONS[library]}: ") and summary.endswith(", 0 problem(s)")
    compared = int(summary.split(": ")[1].split()[0])
    assert compared >= 5  # the collective algorithm knobs at least
    assert "unset = " in stdout  # the library's own value when the variable is not set


KNOB = {"type": "categorical", "ops": ["allreduce"], "transports": ["mpi"], "safety": "safe",
        "description": "-", "unset": "-", "source": "-"}


def test_missing_stale_and_wrong_domains_are_reported(commbench_builds: dict[str, CommbenchBuild],
                                                      tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"schema_version": 1, "knobs": {
        "OMPI_MCA_coll_tuned_allreduce_algorithm": {**KNOB, "libraries": ["openmpi"],
                                                     "choices": ["ring", "no_such_algorithm"]},
        "OMPI_MCA_coll_tuned_no_such_param": {**KNOB, "libraries": ["openmpi"], "type": "bool"},
        "OMPI_MCA_coll_tuned_bcast_algorithm": {**KNOB, "libraries": ["openmpi"], "type": "int", "low": 0,
                                                 "high": 9},
        "OMPI_MCA_btl_tcp_sndbuf": {**KNOB, "libraries": ["openmpi"], "type": "pow2", "low": 4096,
                                     "high": 65536, "versions": {"openmpi": "<4.0"}, "unset": "0: kernel"},
    }}))
    code, stdout, _ = commcamp("knobs", "check", "--library", "openmpi", "--catalog", catalog,
                               "--commbench", commbench_builds["openmpi"].binary)
    assert code == 1
    assert "domain: OMPI_MCA_coll_tuned_allreduce_algorithm: choices ['no_such_algorithm'] are not values" in stdout
    assert "missing: OMPI_MCA_coll_tuned_no_such_param: openmpi 4.1.4 has no control variable" in stdout
    assert "domain: OMPI_MCA_coll_tuned_bcast_algorithm: int in the catalog, coll_tuned_bcast_algorithm is int " \
           "with values ['ignore', 'basic_linear'" in stdout
    assert "stale: OMPI_MCA_btl_tcp_sndbuf: the catalog's versions openmpi <4.0 exclude openmpi 4.1.4" in stdout
    assert stdout.strip().endswith("4 problem(s)")


def test_a_listing_that_is_not_cvars_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "commbench"
    fake.write_text("#!/bin/sh\necho '{\"name\": \"x\"}'\n")
    fake.chmod(0o755)
    code, stdout, stderr = commcamp("knobs", "check", "--library", "mpich", "--commbench", fake,
                                    "--library-version", "4.0.2")
    assert code == 2
    assert "--list-cvars: line 1: not a cvar record" in stderr
    code, _, stderr = commcamp("knobs", "check", "--library", "nccl")
    assert code == 2 and "--library must be openmpi or mpich" in stderr


@pytest.mark.parametrize(("library", "other"), [("mpich", "openmpi"), ("openmpi", "mpich")])
def test_a_commbench_of_another_mpi_is_refused(commbench_builds: dict[str, CommbenchBuild], library: str,
                                               other: str) -> None:
    """Another MPI's control variables would report every knob of the catalog as missing (the trial's six false
    `missing: MPIR_CVAR_...` lines and exit 1): the listing's names tell which MPI the binary is linked against."""
    binary = commbench_builds[other].binary
    code, stdout, stderr = commcamp("knobs", "check", "--library", library, "--commbench", binary,
                                    "--library-version", VERSIONS[library])
    assert code == 2 and stdout == "", stdout
    assert f"{binary} --list-cvars: these are {other}'s control variables, not {library}'s: the binary is " \
           f"linked against {other}" in " ".join(stderr.split())
    code, stdout, stderr = commcamp("knobs", "check", "--library", library, "--commbench", binary)
    assert code == 2 and stdout == "", stdout
    assert f"{binary} links {'Open MPI' if other == 'openmpi' else 'MPICH'}" in stderr
    assert f"not {library}: build it against {library}" in " ".join(stderr.split())


@pytest.mark.parametrize("library", ["openmpi", "mpich"])
def test_the_version_is_the_linked_librarys_not_the_tool_on_path(commbench_builds: dict[str, CommbenchBuild],
                                                                  tmp_path: Path, library: str) -> None:
    """ompi_info / mpichversion on PATH can belong to another MPI than the one commbench links (a Spack MPI
    beside the system's): the catalog's version ranges are judged against the linked one."""
    for tool in ("ompi_info", "mpichversion"):
        fake = tmp_path / tool
        fake.write_text("#!/bin/sh\necho 'Open MPI: 9.9.9'\necho 'MPICH Version:\t9.9.9'\n")
        fake.chmod(0o755)
    code, stdout, stderr = commcamp("knobs", "check", "--library", library,
                                    "--commbench", commbench_builds[library].binary,
                                    env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert code == 0, stdout + stderr
    assert stdout.strip().splitlines()[-1].startswith(f"{library} {VERSIONS[library]}: ")


def test_the_default_commbench_is_the_workspace_build(commbench_builds: dict[str, CommbenchBuild],
                                                      tmp_path: Path) -> None:
    """Where `commcamp bench build` and tune put commbench (campaigns.paths), not the checkout's build/."""
    workspace = {"COMMCAMP_HOME": str(tmp_path)}
    default = tmp_path / "build" / "bench" / "cpu-openmpi" / "commbench"
    code, _, stderr = commcamp("knobs", "check", "--library", "openmpi", env=workspace)
    assert code == 2 and f"no commbench at {default}: build it (commcamp bench build cpu-openmpi)" in \
        " ".join(stderr.split())
    default.parent.mkdir(parents=True)
    default.symlink_to(commbench_builds["openmpi"].binary)
    code, stdout, stderr = commcamp("knobs", "check", "--library", "openmpi", "--library-version", "4.1.4",
                                    env=workspace)
    assert code == 0 and stdout.strip().endswith(", 0 problem(s)"), stdout + stderr


@pytest.mark.parametrize(("library", "environment", "unset_note"), [
    # a single-node setting that leaves the tcp BTL unopened, one without coll/tuned, a sourced trial env
    ("openmpi", {"OMPI_MCA_btl": "self,vader", "OMPI_MCA_coll": "^tuned",
                 "OMPI_MCA_coll_tuned_allreduce_algorithm": "ring"},
     "unset = coll_tuned_allreduce_algorithm=ignore in the library"),
    # MPICH reads MPICH_NAME as well as MPIR_CVAR_NAME
    ("mpich", {"MPICH_ALLREDUCE_SHORT_MSG_SIZE": "4096", "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "smp"},
     "unset = MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE=2048 in the library"),
])
def test_the_callers_control_variables_do_not_reach_the_listing(commbench_builds: dict[str, CommbenchBuild],
                                                                library: str, environment: dict[str, str],
                                                                unset_note: str) -> None:
    """The listing is the library's own: variables of the caller's environment (component selections, a
    sourced .env file) made knobs of unloaded components 'missing' and showed the caller's value as the
    library's unset value."""
    code, stdout, stderr = commcamp("knobs", "check", "--library", library, "--commbench",
                                    commbench_builds[library].binary, "--library-version", VERSIONS[library],
                                    "--notes", env=environment)
    assert code == 0 and stdout.strip().endswith(", 0 problem(s)"), stdout + stderr
    assert unset_note in stdout
    assert "library values not searched: ['auto']" not in stdout and "['ignore']" not in stdout


@pytest.mark.parametrize(("library", "knobs", "expected"), [
    ("openmpi", {
        "OMPI_MCA_coll_tuned_use_dynamic_rules": {**KNOB, "libraries": ["openmpi"], "type": "bool",
                                                  "unset_equals": "1"},
        "OMPI_MCA_coll_tuned_allreduce_algorithm": {**KNOB, "libraries": ["openmpi"], "choices": ["ring", "ignore"],
                                                    "unset_equals": "ring"},
        "OMPI_MCA_btl_tcp_sndbuf": {**KNOB, "libraries": ["openmpi"], "type": "int", "low": 0, "high": 65536,
                                     "unset_equals": "4096"},
        "OMPI_MCA_btl_tcp_rcvbuf": {**KNOB, "libraries": ["openmpi"], "type": "int", "low": 0, "high": 65536,
                                     "unset_equals": "0"},  # right: no finding
    }, ["unset: OMPI_MCA_coll_tuned_use_dynamic_rules: unset_equals 1 in the catalog, but "
        "coll_tuned_use_dynamic_rules is 0 when unset",
        "unset: OMPI_MCA_coll_tuned_allreduce_algorithm: unset_equals ring in the catalog, but "
        "coll_tuned_allreduce_algorithm is ignore when unset",
        "unset: OMPI_MCA_btl_tcp_sndbuf: unset_equals 4096 in the catalog, but btl_tcp_sndbuf is 0 when unset"]),
    ("mpich", {
        "MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE": {**KNOB, "libraries": ["mpich"], "type": "pow2", "low": 256,
                                               "high": 65536, "unset_equals": "4096"},
    }, ["unset: MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE: unset_equals 4096 in the catalog, but "
        "MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE is 2048 when unset"]),
])
def test_an_unset_equals_the_library_does_not_hold_is_reported(commbench_builds: dict[str, CommbenchBuild],
                                                               tmp_path: Path, library: str,
                                                               knobs: dict[str, dict[str, object]],
                                                               expected: list[str]) -> None:
    """unset_equals makes the search treat setting that value as leaving the variable unset (never measured
    twice): a value the library does not hold when unset was reported as consistent."""
    assert_problems(commbench_builds, tmp_path, library, knobs, "unset: ", expected)


def assert_problems(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path, library: str,
                    knobs: dict[str, dict[str, object]], kind: str, expected: list[str]) -> None:
    """`knobs check` of a catalog of `knobs` against the real library: exit 1, exactly the `expected` lines of
    `kind` ("unset: ", "domain: ") and as many problems."""
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"schema_version": 1, "knobs": knobs}))
    code, stdout, stderr = commcamp("knobs", "check", "--library", library, "--catalog", catalog, "--commbench",
                                    commbench_builds[library].binary, "--library-version", VERSIONS[library])
    assert code == 1, stdout + stderr
    assert sorted(line for line in stdout.splitlines() if line.startswith(kind)) == sorted(expected)
    assert stdout.strip().endswith(f", {len(expected)} problem(s)")


def test_a_component_closed_by_a_one_process_init_is_not_missing(commbench_builds: dict[str, CommbenchBuild],
                                                                 tmp_path: Path) -> None:
    """Open MPI deregisters the variables of components MPI_Init closes (a singleton closes btl/vader: no local
    peer); `ompi_info --param btl vader --level 9` lists btl_vader_single_copy_mechanism, 1:"cma", 4:"emulated",
    3:"none". A listing made after MPI_Init reported it missing."""
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"schema_version": 1, "knobs": {
        "OMPI_MCA_btl_vader_single_copy_mechanism": {**KNOB, "libraries": ["openmpi"],
                                                     "choices": ["cma", "emulated", "none"]}}}))
    code, stdout, stderr = commcamp("knobs", "check", "--library", "openmpi", "--catalog", catalog, "--commbench",
                                    commbench_builds["openmpi"].binary, "--library-version", "4.1.4", "--notes")
    assert code == 0, stdout + stderr
    assert "unset = btl_vader_single_copy_mechanism=cma in the library" in stdout
    assert stdout.strip().endswith("1 catalog knob(s) compared with MPI_T, 0 problem(s)")


def test_open_mpi_s_parameter_files_do_not_reach_the_listing(commbench_builds: dict[str, CommbenchBuild],
                                                              tmp_path: Path) -> None:
    """Open MPI reads $HOME/.openmpi/mca-params.conf and the system's openmpi-mca-params.conf besides OMPI_MCA_*: a
    user's file setting coll_tuned_use_dynamic_rules = 1 made the catalog's (right) unset_equals 0 a failure, exit 1;
    a file could as well hide a wrong unset_equals. The listing runs with OMPI_MCA_mca_base_param_files=/dev/null."""
    (tmp_path / ".openmpi").mkdir()
    (tmp_path / ".openmpi" / "mca-params.conf").write_text("coll_tuned_use_dynamic_rules = 1\n"
                                                           "coll_tuned_allreduce_algorithm = ring\n")
    code, stdout, stderr = commcamp("knobs", "check", "--library", "openmpi", "--commbench",
                                    commbench_builds["openmpi"].binary, "--library-version", "4.1.4", "--notes",
                                    env={"HOME": str(tmp_path)})
    assert code == 0 and stdout.strip().endswith(", 0 problem(s)"), stdout + stderr
    assert "unset = coll_tuned_use_dynamic_rules=false in the library" in stdout
    assert "unset = coll_tuned_allreduce_algorithm=ignore in the library" in stdout


@pytest.mark.parametrize(("library", "knobs", "expected"), [
    ("mpich", {
        # MPICH types every cvar int: a bool knob on one whose unset value is 2048 is no boolean
        "MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE": {**KNOB, "libraries": ["mpich"], "type": "bool"},
        "MPIR_CVAR_ENABLE_HCOLL": {**KNOB, "libraries": ["mpich"], "type": "bool"},  # 0 when unset: right
        # 2048 when unset lies below the domain, and the catalog does not say so
        "MPIR_CVAR_REDUCE_SHORT_MSG_SIZE": {**KNOB, "libraries": ["mpich"], "type": "pow2", "low": 4096,
                                            "high": 65536, "unset": "MPICH's default"},
    }, ["domain: MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE: bool in the catalog, MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE is int "
        "2048 when unset, not 0 or 1",
        "domain: MPIR_CVAR_REDUCE_SHORT_MSG_SIZE: MPIR_CVAR_REDUCE_SHORT_MSG_SIZE is 2048 when unset, outside the "
        "catalog's [4096, 65536], and the catalog's unset (\"MPICH's default\") does not begin with 2048: a wrong "
        "domain, or say it (\"2048: ...\")"]),
    ("openmpi", {
        "OMPI_MCA_btl_tcp_sndbuf": {**KNOB, "libraries": ["openmpi"], "type": "pow2", "low": 4096, "high": 65536,
                                     "unset": "the kernel's socket buffer autotuning"},
        # the catalog's way of saying the library's unset value is outside the searched domain: right
        "OMPI_MCA_btl_tcp_rcvbuf": {**KNOB, "libraries": ["openmpi"], "type": "pow2", "low": 4096, "high": 65536,
                                     "unset": "0: the kernel's socket buffer autotuning"},
    }, ["domain: OMPI_MCA_btl_tcp_sndbuf: btl_tcp_sndbuf is 0 when unset, outside the catalog's [4096, 65536], and "
        "the catalog's unset (\"the kernel's socket buffer autotuning\") does not begin with 0: a wrong domain, "
        "or say it (\"0: ...\")"]),
])
def test_a_domain_that_does_not_hold_the_library_s_unset_value_is_reported(
        commbench_builds: dict[str, CommbenchBuild], tmp_path: Path, library: str,
        knobs: dict[str, dict[str, object]], expected: list[str]) -> None:
    """A bool knob was accepted for any integer cvar without values, and an int knob's range was never compared with
    the library's unset value: a catalog whose domain the library does not take passed as consistent."""
    assert_problems(commbench_builds, tmp_path, library, knobs, "domain: ", expected)
