"""Campaign specs and site data: what a valid spec becomes, and that a bad one is refused with the file,
line, field and problem named, exit code 2, and nothing written (no results DB, no run directory)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from campaigns.cli.app import app
from campaigns.reframe.runner import plan_invocations
from campaigns.model.site import SiteError, available_sites, load_site
from campaigns.model.spec import CAMPAIGN_KINDS, SpecError, load_campaign
from campaigns.model.vocabulary import REFERENCE_CHECKS
from campaigns.store import open_store

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "campaigns" / "smoke.yaml"
SMOKE_SLURM = REPO / "campaigns" / "smoke-localslurm.yaml"

VALID_SPEC = """\
name: t
site: local
node_counts: [1]
checks:
  - check: commbench_run
    ops: [pingpong, allreduce]
    max_bytes: 1024
"""

# Three nodes: a pair op (pingpong) has no test case there.
SLURM_THREE_NODES = VALID_SPEC.replace("site: local", "site: localslurm").replace("node_counts: [1]", "node_counts: [3]")


def write_spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def test_shipped_sites_validate() -> None:
    assert {"local", "localslurm"} <= set(available_sites())
    for name in available_sites():
        site = load_site(name)
        assert site.reframe_config.is_file()
    local = load_site("local").system("local").partition("cpu")
    assert (local.nodes, local.node.gpus, local.commbench.backend) == (1, 0, "cpu")
    assert load_site("localslurm").system("localslurm").partition("debug").scheduler == "slurm"


def test_unknown_site() -> None:
    with pytest.raises(SiteError, match="unknown site 'mars'; known sites: .*local"):
        load_site("mars")


def test_smoke_specs_resolve() -> None:
    local = load_campaign(SMOKE)
    cases = local.cases()
    assert {(c.op, c.environ, c.num_nodes, c.num_tasks) for c in cases} == {
        (op, env, 1, 2) for op in ("pingpong", "allreduce", "alltoall") for env in ("openmpi", "mpich")}
    assert {c.partition for c in cases} == {"cpu"}

    slurm = load_campaign(SMOKE_SLURM).cases()
    assert len(slurm) == 12
    # pingpong: 2 ranks (1 per node on 2 nodes); collectives: 2 ranks per node
    assert {(c.op, c.num_nodes): c.num_tasks for c in slurm} == {
        ("pingpong", 1): 2, ("pingpong", 2): 2, ("allreduce", 1): 2, ("allreduce", 2): 4,
        ("alltoall", 1): 2, ("alltoall", 2): 4}

    moved = load_campaign(SMOKE, site_override="localslurm").cases()
    assert {(c.site, c.system, c.partition) for c in moved} == {("localslurm", "localslurm", "debug")}


def test_run_keys_identify_parameters(tmp_path: Path) -> None:
    base = {c.run_key for c in load_campaign(write_spec(tmp_path, VALID_SPEC)).cases()}
    assert len(base) == 4  # 2 ops x 2 environments
    again = {c.run_key for c in load_campaign(write_spec(tmp_path, VALID_SPEC)).cases()}
    assert again == base
    written_1k = VALID_SPEC.replace("max_bytes: 1024", "max_bytes: 1K")  # the same size, the same cases
    assert {c.run_key for c in load_campaign(write_spec(tmp_path, written_1k)).cases()} == base
    for change in ("    iters: 7\n", "    env: {UCX_TLS: '^cuda_ipc'}\n", "    tasks_per_node: 1\n"):
        changed = {c.run_key for c in load_campaign(write_spec(tmp_path, VALID_SPEC + change)).cases()}
        if "tasks_per_node" in change:  # pingpong always runs 2 ranks: only the allreduce keys change
            assert len(changed & base) == 2
        else:
            assert not changed & base, change


def test_run_keys_name_the_sites_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stored before the site changed what its jobs run with is not the case's: `run` skipped every case
    with a passed run under its key ("Nothing to run") after an environment's variables, a partition's modules,
    commbench's build options or the site's knob defaults changed, and reported the old measurements. Those
    change the run key (not the series: health judges the night against the same history); what only describes
    or judges (descriptions, references) does not, nor another benchmark's build (a reference suite's), nor a knob
    default only another MPI reads (an Open MPI default had re-keyed, and so re-run, every MPICH case)."""
    from fixtures_sites import site_data, write_site

    def keys(name: str, edit: Callable[[dict[str, Any]], None]) -> set[str]:
        def renamed(data: dict[str, Any]) -> None:
            data["name"] = name
            edit(data)

        write_site(tmp_path / "sites" / name, site_data("local", renamed))
        spec = write_spec(tmp_path, VALID_SPEC.replace("site: local", f"site: {name}"))
        cases = load_campaign(spec).cases()
        assert all(c.run_key.startswith(c.series_key) for c in cases)
        return {c.run_key.removeprefix(f"t/{name}/") for c in cases}

    def partition(data: dict[str, Any]) -> dict[str, Any]:
        return data["systems"][0]["partitions"][0]

    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(tmp_path / "sites"))
    base = keys("base", lambda data: None)
    assert len(base) == 4
    same = {"described": lambda data: partition(data).update(description="another text"),
            "referenced": lambda data: partition(data)["commbench"].update(references=[
                {"op": "allreduce", "metric": "small_latency", "bytes": 8, "value": 5, "upper": 1.0}]),
            # a reference suite's build is its checks' (an OSU change re-ran every commbench case)
            "osu-offered": lambda data: partition(data).update(reference_benchmarks={"osu": {
                "package": "osu-micro-benchmarks", "dir_variable": "OSU_DIR", "node_counts": [1]}})}
    changed = {"variables": lambda data: data["environments"][0]["env_vars"].update(UCX_TLS="tcp"),
               "modules": lambda data: partition(data).update(modules=["openmpi/5"]),
               "build": lambda data: partition(data)["commbench"].update(cmake_options=["-DCOMMBENCH_WERROR=OFF"]),
               "openmpi-knob": lambda data: data.setdefault("knobs", {}).update(
                   defaults={"OMPI_MCA_btl_tcp_sndbuf": "65536"}),
               "mpich-knob": lambda data: data.setdefault("knobs", {}).update(
                   pinned={"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "recursive_doubling"}),
               "ucx-knob": lambda data: data.setdefault("knobs", {}).update(defaults={"UCX_TLS": "^cuda_ipc"})}
    for name, edit in same.items():
        assert keys(name, edit) == base, name
    # the cases of the environment whose variables, or whose MPI's knobs, changed; a UCX knob: both MPIs' cases
    environment_of = {"variables": "openmpi", "openmpi-knob": "openmpi", "mpich-knob": "mpich"}
    for name, edit in changed.items():
        different = keys(name, edit) - base
        assert len(different) == (2 if name in environment_of else 4), name
        assert all(f"/{environment_of.get(name, '')}" in key for key in different), (name, different)


def test_invocations_select_exactly_the_pending_cases(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, VALID_SPEC + "    env: {UCX_TLS: 'tcp,sm,cuda_copy,cuda_ipc', NCCL_PROTO: '^LL128'}\n")
    campaign = load_campaign(spec)
    cases = campaign.cases()
    everything = plan_invocations(cases)
    assert len(everything) == 1 and set(everything[0].cases) == set(cases)
    command = everything[0].command(tmp_path / "runs" / "t-20261123T000000Z" / "rfm-1")
    assert command[command.index("-p") + 1] == "^(mpich|openmpi)$"
    # JSON (the values hold ',' and ':'), as they are: the check validates and shell-quotes them
    assert "commbench_run.env_vars=" + json.dumps({"UCX_TLS": "tcp,sm,cuda_copy,cuda_ipc", "NCCL_PROTO": "^LL128"}) \
        in command
    # one continuous perflog in the workspace (README), not one per invocation nor beside any --runs-dir
    from campaigns import paths
    assert command[command.index("--perflogdir") + 1] == str(paths.workspace() / "reframe" / "perflogs")
    assert "commbench_run.max_bytes=1024" in command
    assert "--skip-performance-check" not in command
    unjudged = load_campaign(write_spec(tmp_path, "check_performance: false\n" + VALID_SPEC))
    assert "--skip-performance-check" in plan_invocations(unjudged.cases())[0].command(tmp_path / "rfm-2")

    # pingpong is stored for mpich only: pingpong runs on openmpi alone, allreduce on both
    pending = [c for c in cases if not (c.op == "pingpong" and c.environ == "mpich")]
    split = {inv.environments: {c.op for c in inv.cases} for inv in plan_invocations(pending)}
    assert split == {("mpich", "openmpi"): {"allreduce"}, ("openmpi",): {"pingpong"}}


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param(VALID_SPEC.replace("    max_bytes: 1024", "    itres: 10"),
                 ["spec.yaml:7: checks[0].itres: unknown field"], id="unknown-field"),
    pytest.param(VALID_SPEC.replace("    max_bytes: 1024", "    iters: many"),
                 ["spec.yaml:7: checks[0].iters: Input should be a valid integer", "'many'"], id="wrong-type"),
    pytest.param(VALID_SPEC.replace("site: local", "site: mars"),
                 ["spec.yaml:2: site", "unknown site 'mars'"], id="unknown-site"),
    pytest.param(VALID_SPEC.replace("node_counts: [1]", "node_counts: [1, 2]"),
                 ["spec.yaml:3: node_counts[1]: 2 nodes requested, but partition local:cpu of site 'local' has 1"],
                 id="too-many-nodes"),
    pytest.param(VALID_SPEC.replace("node_counts: [1]", "node_counts: [1, 5]"),
                 ["node_counts[1]: Input should be 1, 2, 3, 4, 8"], id="node-count-not-offered"),
    pytest.param(VALID_SPEC + "environments: [openmpi, intelmpi]\n",
                 ["spec.yaml:8: environments[1]: 'intelmpi' is not an environment of local:local"],
                 id="unknown-environment"),
    pytest.param(VALID_SPEC.replace("site: local", "site: local\nsystem: local:gpu"),
                 ["spec.yaml:3: system: system 'local' of site 'local' has no partition 'gpu'"], id="unknown-partition"),
    pytest.param(VALID_SPEC.replace("max_bytes: 1024", "max_bytes: 1KB"),
                 ["spec.yaml:7: checks[0].max_bytes:", "'1KB' is ambiguous"], id="ambiguous-size"),
    pytest.param(VALID_SPEC + "    min_bytes: 4096\n", ["checks[0]: max_bytes (1024) is below min_bytes (4096)"],
                 id="empty-size-range"),
    pytest.param(VALID_SPEC.replace("name: t", "name: t\nname: u"), ["spec.yaml:2: malformed YAML: duplicate key 'name'"],
                 id="duplicate-key"),
    pytest.param(VALID_SPEC.replace("ops: [pingpong, allreduce]", "ops: [pingpong, allreduce"),
                 ["spec.yaml:", "malformed YAML"], id="malformed-yaml"),
    pytest.param("- just\n- a list\n", ["expected a mapping at the top level"], id="not-a-mapping"),
    pytest.param(VALID_SPEC.replace("node_counts: [1]\n", ""), ["give node_counts or max_nodes"],
                 id="missing-node-counts"),
    pytest.param(VALID_SPEC.replace("name: t\n", ""), ["name: required field is missing"], id="missing-field"),
    pytest.param(VALID_SPEC.replace("check: commbench_run", "check: commbench_walk"),
                 ["spec.yaml:5: checks[0].check: Input should be 'commbench_run'"], id="unknown-check"),
    pytest.param(VALID_SPEC + "kind: health\nhealth: {degraded_z: 5, failed_z: 4}\n",
                 ["failed_z / failed_change must not be below degraded_z / degraded_change"], id="health-order"),
    pytest.param(VALID_SPEC + "kind: health\nhealth: {history_nights: 2, min_history: 3}\n",
                 ["spec.yaml:", "history_nights 2 is below the 3 nights that history is judged on"],
                 id="health-window-below-min-history"),
    pytest.param(VALID_SPEC + "placements: [same-switch]\n", ["placements: placements other than 'any' need Slurm"],
                 id="placement-without-slurm"),
    pytest.param(VALID_SPEC + "health: {history_nights: 3}\n", ["'health' settings need kind: health"],
                 id="health-settings-on-a-run"),
    pytest.param(VALID_SPEC + "kind: nightly\n",  # the kinds: CAMPAIGN_KINDS, whatever they are
                 [f"kind: Input should be {', '.join(map(repr, CAMPAIGN_KINDS[:-1]))} or {CAMPAIGN_KINDS[-1]!r}"],
                 id="unknown-kind"),
    pytest.param(VALID_SPEC.replace("node_counts: [1]", "max_nodes: 4"),
                 ["max_nodes: 4 nodes requested, but partition local:cpu of site 'local' has 1"], id="max-nodes"),
    pytest.param(SLURM_THREE_NODES,
                 ["spec.yaml:6: checks[0].ops[0]: pingpong has no test case: a pair op runs 2 ranks, on 1 or 2 nodes "
                  "only; the campaign's node counts are [3]"], id="pair-op-on-no-node-count-it-runs-on"),
    pytest.param(SLURM_THREE_NODES.replace("ops: [pingpong, allreduce]", "ops: [pingpong]") + "kind: health\n",
                 ["checks[0].ops[0]: pingpong has no test case"], id="health-campaign-of-no-test-case"),
    pytest.param(VALID_SPEC.replace("    max_bytes: 1024", "    transports: [mpi, ccl]"),
                 ["checks[0].transports[1]: transport 'ccl' is not offered by partition local:cpu of site 'local' (it has: mpi)"],
                 id="transport-not-offered"),
    pytest.param(VALID_SPEC.replace("    max_bytes: 1024", "    transports: [mpi, mpi]"),
                 ["spec.yaml:7: checks[0].transports: repeated values ['mpi']"], id="repeated-transport"),
    pytest.param(VALID_SPEC.replace("    max_bytes: 1024", "    env: {OMPI_MCA_btl_tcp_sndbuf: '1000'}"),
                 ["checks[0].env: OMPI_MCA_btl_tcp_sndbuf: 1000 is outside [4096, 16777216]"],
                 id="knob-outside-its-domain"),
    pytest.param(VALID_SPEC + "  - check: osu_run\n    benchmarks: [osu_latency, osu_lat]\n",
                 ["spec.yaml:9: checks[1].benchmarks: 'osu_lat' is not a benchmark of osu_run (it has: "
                  f"{', '.join(REFERENCE_CHECKS['osu_run'].benchmarks)})"],  # the vocabulary's, whatever they are
                 id="unknown-benchmark"),
    pytest.param(VALID_SPEC + "  - check: osu_run\n    benchmarks: [osu_latency]\n    ops: [pingpong]\n",
                 ["spec.yaml:10: checks[1].ops: unknown field"], id="commbench-field-on-a-reference-check"),
    pytest.param(VALID_SPEC + "  - check: nccl_tests_run\n    benchmarks: [all_reduce_perf]\n",
                 ["spec.yaml:8: checks[1].check: nccl_tests_run runs the site's nccl_tests binaries, but partition(s) "
                  "local:cpu of site 'local' have no reference_benchmarks.nccl_tests in site.yaml"],
                 id="suite-not-offered"),
    pytest.param(VALID_SPEC + "references:\n  - {benchmark: osu_latency, metric: large_busbw, bytes: 8, value: 1.0,"
                              " upper: 1.0}\n",
                 ["spec.yaml:9: references[0]: metric 'large_busbw' is not reported by osu_latency (it has: "
                  "small_latency)"], id="benchmark-reference-of-a-metric-it-does-not-report"),
    pytest.param(VALID_SPEC + "  - check: commbench_run\n    ops: [allreduce]\n    max_bytes: 1024\n",
                 ["spec.yaml:8: checks[1]: runs a test case checks[0] runs too (commbench_run allreduce on 1 node(s)"],
                 id="one-test-case-twice"),
])
def test_bad_spec_is_refused_and_nothing_is_written(tmp_path: Path, text: str, expected: list[str]) -> None:
    spec = write_spec(tmp_path, text)
    with pytest.raises(SpecError) as raised:
        load_campaign(spec)
    for fragment in expected:
        assert fragment in str(raised.value)

    # Through the CLI: an existing database is left byte for byte as it was, a missing one is not created.
    existing = tmp_path / "existing.db"
    open_store(f"sqlite:///{existing}").close()
    digest = hashlib.sha256(existing.read_bytes()).hexdigest()
    missing = tmp_path / "missing.db"
    for db in (existing, missing):
        result = CliRunner().invoke(app, ["run", str(spec), "--db", f"sqlite:///{db}",
                                          "--runs-dir", str(tmp_path / "runs")])
        assert result.exit_code == 2, result.stdout + result.stderr
        assert "invalid campaign spec" in result.stderr
        for fragment in expected:
            assert fragment in result.stderr
    assert hashlib.sha256(existing.read_bytes()).hexdigest() == digest
    assert not missing.exists()
    assert not (tmp_path / "runs").exists()


def test_site_override_is_checked(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", str(SMOKE), "--site", "mars", "--db", f"sqlite:///{tmp_path}/x.db"])
    assert result.exit_code == 2
    assert "--site: unknown site 'mars'" in result.stderr
    spec = write_spec(tmp_path, VALID_SPEC.replace("site: local", "site: local\nsystem: local"))
    with pytest.raises(SpecError, match="site 'localslurm' has no system 'local'"):
        load_campaign(spec, site_override="localslurm")


def test_dry_run_shows_plan_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    result = CliRunner().invoke(app, ["run", str(SMOKE), "--dry-run", "--db", f"sqlite:///{db}",
                                      "--runs-dir", str(tmp_path / "runs")], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("smoke/local/local:cpu/") == 6
    assert "reframe invocation 1:" in result.stdout and "-p '^(mpich|openmpi)$'" in result.stdout
    assert f"no results database at sqlite:///{db} yet: nothing is stored" in result.stdout  # a mistyped --db too
    assert not db.exists() and not (tmp_path / "runs").exists()


def test_help_lists_commands() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command in ("run", "results"):
        assert command in result.stdout


NO_SYSTEM_SLURM = pytest.mark.skipif(Path("/etc/slurm/slurm.conf").exists(), reason="this host has a Slurm config")


@pytest.mark.parametrize(("slurm_conf", "expected"), [
    pytest.param("no-such-slurm.conf", "no-such-slurm.conf does not exist", id="missing-slurm-conf"),
    pytest.param(None, "Slurm's controller is not reachable: sinfo -h -o %P exited", id="no-slurm-conf",
                 marks=NO_SYSTEM_SLURM),
])
def test_slurm_site_without_its_environment_is_refused(tmp_path: Path, slurm_conf: str | None,
                                                       expected: str) -> None:
    """Without the cluster's environment the Slurm probes fail: nothing runs and nothing is written."""
    env = {name: value for name, value in os.environ.items() if name != "SLURM_CONF"}
    env["PATH"] = "/usr/bin:/bin"  # no sacct shim either
    if slurm_conf:
        env["SLURM_CONF"] = str(tmp_path / slurm_conf)
    result = subprocess.run(
        [str(Path(sys.executable).with_name("commcamp")), "run", str(SMOKE_SLURM), "--db", f"sqlite:///{tmp_path}/r.db",
         "--runs-dir", str(tmp_path / "runs")], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "site localslurm cannot run jobs from here" in result.stderr
    assert expected in result.stderr and "site_configs/localslurm/site.yaml" in result.stderr
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "runs").exists()


def test_the_reframe_command_comes_from_the_case_alone(tmp_path: Path) -> None:
    # A case carries every -S variable, its env, the site configuration and the performance flag: a case
    # changed after expansion (a tuner trial's knobs, a pair test) launches as changed, with no spec copy.
    import dataclasses

    campaign = load_campaign(write_spec(tmp_path, VALID_SPEC))
    case = campaign.cases()[0]
    assert case.reframe_config == campaign.site.reframe_config and case.check_performance
    trial = dataclasses.replace(case, env=(("OMPI_MCA_btl_tcp_sndbuf", "4096"),), tasks_per_node_setting=3,
                                check_performance=False)
    (invocation,) = plan_invocations([trial])
    command = invocation.command(tmp_path / "rfm-1")
    assert command[command.index("-C") + 1] == str(campaign.site.reframe_config)
    assert 'commbench_run.env_vars={"OMPI_MCA_btl_tcp_sndbuf": "4096"}' in command
    assert "commbench_run.num_tasks_per_node=3" in command and "--skip-performance-check" in command
    assert len(plan_invocations([case, trial])) == 2  # different launches never share an invocation


def test_reference_checks_expand_where_the_site_offers_their_suite(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One test case per benchmark, node count and environment where a partition offers the suite on that
    many nodes (pair benchmarks on 1 or 2 nodes, one rank per node on 2); the ReFrame command selects each by
    its `benchmark` parameter in reference_benchmarks.py; references are matched per benchmark."""
    from campaigns.model.references import find_reference
    from fixtures_sites import reference_site

    sites = reference_site(tmp_path / "sites", "refslurm", "localslurm", {
        "nccl_tests": {"package": "nccl-tests", "dir_variable": "NCCL_TESTS_DIR", "tasks_per_node": 4,
                       "node_counts": [1, 2]},
        "osu": {"package": "osu-micro-benchmarks", "dir_variable": "OSU_DIR", "node_counts": [2, 3], "references": [
            {"benchmark": "osu_allreduce", "metric": "large_latency", "bytes": 1048576, "value": 900, "upper": 1.0}]}})
    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(sites))
    spec = write_spec(tmp_path, (
        "name: refs\nsite: refslurm\nenvironments: [openmpi]\nnode_counts: [1, 2, 3]\n"
        "references:\n  - {benchmark: osu_allreduce, metric: small_latency, bytes: 8, value: 20, upper: 1.0}\n"
        "  - {op: allreduce, metric: small_latency, bytes: 8, value: 5, upper: 1.0}\n"
        "checks:\n  - check: commbench_run\n    ops: [allreduce]\n"
        "  - check: osu_run\n    benchmarks: [osu_latency, osu_allreduce]\n    time_limit_s: 300\n"
        "    extra_args: [-m, '8:1048576']\n    env: {UCX_TLS: '^cuda_ipc'}\n"
        "  - check: nccl_tests_run\n    benchmarks: [all_reduce_perf]\n"))
    campaign = load_campaign(spec)
    cases = campaign.cases()
    assert sorted((c.check, c.op, c.num_nodes, c.tasks_per_node) for c in cases) == sorted(
        [("commbench_run", "allreduce", n, 2) for n in (1, 2, 3)]
        + [("osu_run", "osu_latency", 2, 1), ("osu_run", "osu_allreduce", 2, 2), ("osu_run", "osu_allreduce", 3, 2)]
        + [("nccl_tests_run", "all_reduce_perf", n, 4) for n in (1, 2)])
    assert len({c.run_key for c in cases}) == len(cases)
    osu = next(c for c in cases if c.op == "osu_allreduce" and c.num_nodes == 2)
    assert osu.parameters["benchmark"] == "osu_allreduce" and "op" not in osu.parameters
    assert osu.transport == "mpi" and "/osu_run/osu_allreduce/mpi/2n/" in osu.run_key
    nccl = next(c for c in cases if c.check == "nccl_tests_run")
    assert nccl.transport == "ccl"

    invocations = plan_invocations(cases)
    assert len(invocations) == 3  # one per check: each loads its own file
    (command,) = [i.command(tmp_path / "rfm-1") for i in invocations if i.cases[0].check == "osu_run"]
    assert command[command.index("-c") + 1].endswith("reframe_checks/reference_benchmarks.py")
    names = [command[i + 1] for i, word in enumerate(command) if word == "-n"]
    assert names == ["^osu_run%benchmark=osu_allreduce%num_nodes=2$", "^osu_run%benchmark=osu_allreduce%num_nodes=3$",
                     "^osu_run%benchmark=osu_latency%num_nodes=2$"]
    assert {"osu_run.time_limit=300s", "osu_run.extra_args=-m,8:1048576",
            'osu_run.env_vars={"UCX_TLS": "^cuda_ipc"}'} <= set(command)

    # the campaign's references first, then the site's; a benchmark's never judge commbench, nor the reverse
    references = campaign.references(osu.partition)
    assert find_reference(references, osu, "small_latency", 8).value == 20
    assert find_reference(references, osu, "large_latency", 1048576).value == 900
    assert find_reference(references, nccl, "small_latency", 8) is None
    commbench = next(c for c in cases if c.check == "commbench_run" and c.num_nodes == 2)
    assert find_reference(references, commbench, "small_latency", 8).value == 5

    # a node count the suite does not offer for any benchmark: refused, naming the benchmark
    narrow = write_spec(tmp_path, spec.read_text().replace("node_counts: [1, 2, 3]", "node_counts: [3]"))
    with pytest.raises(SpecError) as raised:
        load_campaign(narrow)
    assert ("spec.yaml:12: checks[1].benchmarks[0]: osu_latency has no test case: site 'refslurm' runs osu on node "
            "counts localslurm:debug [2, 3] (reference_benchmarks.osu.node_counts), the campaign asks for [3]; "
            "osu_latency runs on 1 or 2 nodes only") in str(raised.value)
    assert "checks[2].benchmarks[0]: all_reduce_perf has no test case" in str(raised.value)

    # the shipped example: commbench's allreduce and nccl-tests' all_reduce_perf in one health campaign (h200)
    example = load_campaign(REPO / "campaigns" / "health-h200.yaml")
    assert sorted((c.check, c.op, c.num_tasks) for c in example.cases("night")) == [
        ("commbench_run", "allreduce", 4), ("nccl_tests_run", "all_reduce_perf", 4)]


def test_a_case_is_judged_by_its_own_partition_s_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A campaign over two partitions: each case gets the campaign's references, then its own partition's, never
    the other partition's (references do not name a partition: first match would win across partitions)."""
    import copy

    from campaigns.model.references import find_reference
    from fixtures_sites import site_data, write_site

    def two_partitions(data: dict[str, Any]) -> None:
        data["name"] = "twopart"
        (cpu,) = data["systems"][0]["partitions"]
        data["systems"][0]["partitions"] = []
        for name, latency in (("fast", 500.0), ("cpu", 5.0)):
            partition = copy.deepcopy(cpu)
            partition["name"] = name
            partition["commbench"]["references"] = [{"op": "allreduce", "metric": "small_latency", "bytes": 8,
                                                     "value": latency, "upper": 0.5}]
            data["systems"][0]["partitions"].append(partition)

    write_site(tmp_path / "sites" / "twopart", site_data("local", two_partitions))
    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(tmp_path / "sites"))
    campaign = load_campaign(write_spec(tmp_path, VALID_SPEC.replace("site: local", "site: twopart")))
    cases = {c.partition: c for c in campaign.cases() if c.op == "allreduce" and c.environ == "openmpi"}
    assert {p: find_reference(campaign.references(p), case, "small_latency", 8).value
            for p, case in cases.items()} == {"fast": 500.0, "cpu": 5.0}
