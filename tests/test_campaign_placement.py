"""The campaign run path's planning, decidable without running a job: where placed cases go (only in-service
nodes of the case's Slurm partition, same-switch under one leaf switch), a run that landed elsewhere is no
pass, one invocation per placement, skip reasons kept, perflogs in the workspace, specs that ask for what the
checks would skip or never select refused at load, `run` options a kind does not write refused."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from campaigns.cli.app import app
from campaigns.model.spec import SpecError, load_campaign
from campaigns.reframe.runner import (CaseResult, case_outcome, ingest_case, plan_invocations, stream_reframe)
from campaigns.slurm.placement import Placer, parse_partition_nodes, placement_mismatch
from campaigns.slurm.topology import PlacementError, Topology

REPO = Path(__file__).resolve().parents[1]

# Two groups; leaf1 n1-n3 and leaf2 n4-n5 in g1, leaf3 n6-n7 in g2.
LEAVES = {"n1": "leaf1", "n2": "leaf1", "n3": "leaf1", "n4": "leaf2", "n5": "leaf2", "n6": "leaf3", "n7": "leaf3"}
TOPOLOGY = Topology(leaf_of=LEAVES, group_of={n: "g2" if leaf == "leaf3" else "g1" for n, leaf in LEAVES.items()})
# sinfo -p debug -N -h -o '%N|%t': n1 drained, n4 down (not responding), n6 in the partition but mixed.
SINFO = "n1|drain\nn2|idle\nn3|alloc\nn4|down*\nn5|idle\nn6|mix\nn7|idle~\n"

SPEC = """\
name: placed
kind: characterize
site: localslurm
system: localslurm:debug
environments: [openmpi]
node_counts: [2]
placements: [PLACEMENTS]
checks:
  - check: commbench_run
    ops: [pingpong]
    sizes: [8, 1024]
"""


def _cases(tmp_path: Path, placements: str) -> list[Any]:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.replace("PLACEMENTS", placements))
    return load_campaign(path).cases()


def _placer(sinfo: str = SINFO) -> Placer:
    return Placer(TOPOLOGY, slurm_partitions={"debug": "debug"}, in_service={"debug": parse_partition_nodes(sinfo)})


def test_in_service_nodes_come_from_sinfo() -> None:
    assert parse_partition_nodes(SINFO) == {"n2", "n3", "n5", "n6", "n7"}
    # Slurm 22.05: a node whose registration is invalid (inval, also when drained), a reserved one (resv; $: a
    # maintenance reservation) were in service: placement put a same-switch pair there, and the job pended on
    # the reservation until the run's limit. A reserved node serves jobs that name a reservation.
    extra = "n8|inval\nn9|resv\nn10|idle$\nn11|futr\n"
    assert parse_partition_nodes(SINFO + extra) == {"n2", "n3", "n5", "n6", "n7"}
    assert parse_partition_nodes(SINFO + extra, reserved_ok=True) == {"n2", "n3", "n5", "n6", "n7", "n9", "n10"}


def test_the_slurm_partition_and_reservation_are_read_as_reframe_splits_the_access_options() -> None:
    """ReFrame takes `'-p gpu'` as one access entry (`#SBATCH -p gpu`); it was read as the partition ' gpu'
    (sinfo -p ' gpu': no node) and `'--partition gpu'` as none (the ReFrame partition's name)."""
    from campaigns.slurm.snapshot import reservation_of, slurm_partition

    for access in (["-p gpu"], ["--partition gpu"], ["--partition=gpu"], ["-p", "gpu"], ["-pgpu"],
                   ["--exclusive", "-p debug", "--partition=gpu"]):
        assert slurm_partition(access, "rfmpart") == "gpu", access
    assert slurm_partition(["--exclusive"], "normal") == "normal"
    assert reservation_of(["--reservation nightly"]) == reservation_of(["--reservation=nightly"]) == "nightly"
    assert reservation_of(["--reservation=a", "-p gpu", "--reservation b"]) == "b"
    assert reservation_of(["-p gpu", "--exclusive"]) is None


def test_placements_choose_in_service_nodes_and_same_switch_gets_a_nodelist(tmp_path: Path) -> None:
    cases = {c.placement: c for c in _cases(tmp_path, "same-switch, different-switch, different-group, each-switch")}
    placer = _placer()
    # same-switch: not --switches=1 (a preference Slurm drops): the first leaf with two nodes in service
    assert placer.job_options(cases["same-switch"]) == ("--nodelist=n2,n3",)
    # different-switch: two leaf switches of one group (n1, n4 out of service)
    assert placer.job_options(cases["different-switch"]) == ("--nodelist=n2,n5",)
    assert placer.job_options(cases["different-group"]) == ("--nodelist=n2,n6",)
    runs = placer.expand(cases["each-switch"])
    assert [r.nodelist for r in runs] == [("n2", "n3"), ("n6", "n7")]  # leaf2 has one node in service


def test_no_in_service_node_set_makes_the_case_unplaceable(tmp_path: Path) -> None:
    cases = {c.placement: c for c in _cases(tmp_path, "same-switch, different-switch, different-group, each-switch")}
    placer = _placer("n1|drain\nn2|idle\nn4|idle\nn6|down\nn7|maint\n")
    for placement in ("same-switch", "each-switch"):
        with pytest.raises(PlacementError, match="no leaf switch has 2 nodes in service in Slurm partition debug"):
            placer.job_options(cases[placement])
    with pytest.raises(PlacementError, match="1 groups in service in Slurm partition debug"):
        placer.job_options(cases["different-group"])
    assert placer.job_options(cases["different-switch"]) == ("--nodelist=n2,n4",)


def test_a_run_across_switches_is_no_same_switch_pass(tmp_path: Path) -> None:
    (case,) = _cases(tmp_path, "same-switch")
    assert placement_mismatch(case, ("n2", "n3"), TOPOLOGY) is None
    reason = placement_mismatch(case, ("n2", "n5"), TOPOLOGY)
    assert reason == "placement same-switch requested same-switch, but the ranks ran different-switch (on n2,n5)"
    any_case = dataclasses.replace(case, placement="any")
    assert placement_mismatch(any_case, ("n2", "n6"), TOPOLOGY) is None

    class Store:
        runs: list[Any] = []

        def ingest(self, run: Any, records: Any, **_: Any) -> int:
            self.runs.append(run)
            return 1

    store = Store()
    result = CaseResult(case, "pass", hosts=("n2", "n5"))
    ingest_case(store, result, [], TOPOLOGY)  # type: ignore[arg-type]
    assert (result.status, result.reason) == ("fail", reason)
    assert store.runs[0].status == "fail" and store.runs[0].parameters["network_distance"] == "different-switch"


def test_placements_on_the_same_nodes_get_a_job_each(tmp_path: Path) -> None:
    cases = _cases(tmp_path, "same-switch, each-switch")
    placer = _placer("n2|idle\nn3|idle\n")
    runs = [run for case in cases for run in placer.expand(case)]
    assert {placer.job_options(r) for r in runs} == {("--nodelist=n2,n3",)}  # the same nodes ...
    assert len(plan_invocations(runs, placer.job_options)) == 2  # ... but one invocation (job) each


def test_a_skip_reason_reaches_the_stored_outcome(tmp_path: Path) -> None:
    line = ("[     SKIP ] (2/2) commbench_run %op=pingpong %num_nodes=1 /b72462f8 @local:cpu+openmpi "
            "[transport memcpy has no op pingpong]")
    seen: list[tuple[str, dict[str, str]]] = []
    with open("/dev/null", "w") as quiet:
        rc = stream_reframe([sys.executable, "-c", f"print({line!r})"], tmp_path / "rfm", Console(file=quiet),
                            lambda kind, test: seen.append((kind, test)))
    assert rc == 0 and seen[0][0] == "SKIP" and seen[0][1]["skip_reason"] == "transport memcpy has no op pingpong"
    (case,) = _cases(tmp_path, "any")
    case = dataclasses.replace(case, num_nodes=1)
    report = [{"name": "commbench_run %op=pingpong %num_nodes=1", "partition": case.partition, "environ": case.environ,
               "op": "pingpong", "num_nodes": 1, "result": "skip", "fail_reason": None}]
    result, _ = case_outcome(case, report, 0, tmp_path, seen[0][1]["skip_reason"])
    assert (result.status, result.reason) == ("error", "ReFrame skipped it: transport memcpy has no op pingpong")


def test_perflogs_go_to_the_workspace_whatever_the_runs_directory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMCAMP_HOME", str(tmp_path / "ws"))
    (invocation,) = plan_invocations(_cases(tmp_path, "any"))
    command = invocation.command(tmp_path / "elsewhere" / "runs" / "x-20260101T000000Z" / "rfm-1")
    assert command[command.index("--perflogdir") + 1] == str(tmp_path / "ws" / "reframe" / "perflogs")


def _load(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_campaign(path)


def test_environments_the_checks_exclude_are_not_defaults_and_refused_by_name(tmp_path: Path) -> None:
    spec = "name: e\nsite: h200\nnode_counts: [1]\nchecks:\n  - check: commbench_run\n    ops: [allreduce]\n" \
           "    transports: [ccl]\n"
    assert _load(tmp_path, spec).environments == ("openmpi-cuda",)  # not openmpi-ucx-cuda (gpu_aware_mpi)
    with pytest.raises(SpecError, match=r"environments\[0\]: 'openmpi-ucx-cuda' \(features \['gpu_aware_mpi'\]\) "
                                        r"is not one the campaign checks run in: they select '\+mpi -gpu_aware_mpi'"):
        _load(tmp_path, spec.replace("node_counts", "environments: [openmpi-ucx-cuda]\nnode_counts"))
    shipped = load_campaign(REPO / "campaigns" / "characterize-h200.yaml")
    assert {c.environ for c in shipped.cases()} == {"openmpi-cuda"}


@pytest.mark.parametrize("site, nodes, ops, transports, expected", [
    ("h200", "[1]", "[pingpong]", "[memcpy]", r"checks\[0\]\.ops\[0\]: transport 'memcpy' has no op pingpong"),
    ("h200", "[1]", "[allreduce]", "[d2d]", r"transport 'd2d' has no op allreduce"),
    ("alps", "[2]", "[pingpong]", "[d2d-kernel]",
     r"checks\[0\]\.transports\[0\]: transport 'd2d-kernel' connects the ranks of one node only"),
    ("h200", "[1]", "[pingpong]", "[ccl, mpi]",
     r"checks\[0\]\.transports\[1\]: transport 'mpi' is listed under expect_unsupported"),
])
def test_transport_and_op_combinations_the_check_skips_are_refused(tmp_path: Path, site: str, nodes: str, ops: str,
                                                                  transports: str, expected: str) -> None:
    with pytest.raises(SpecError, match=expected):
        _load(tmp_path, f"name: t\nsite: {site}\nnode_counts: {nodes}\nchecks:\n  - check: commbench_run\n"
                        f"    ops: {ops}\n    transports: {transports}\n")


def test_an_expect_unsupported_default_transport_is_left_out(tmp_path: Path) -> None:
    # h200 lists mpi (the spec's default transport) under expect_unsupported: no case, said at load
    with pytest.raises(SpecError, match="pingpong has no test case: the default transport.*expect_unsupported"):
        _load(tmp_path, "name: t\nsite: h200\nnode_counts: [1]\nchecks:\n  - check: commbench_run\n"
                        "    ops: [pingpong]\n")


def test_run_refuses_an_output_option_its_kind_does_not_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMCAMP_HOME", str(tmp_path))  # --workspace sets it for the children: undone after the test
    result = CliRunner().invoke(app, ["--workspace", str(tmp_path), "run", str(REPO / "campaigns" / "smoke.yaml"),
                                      "--report", str(tmp_path / "r.html"), "--verdict", str(tmp_path / "v.json")])
    assert result.exit_code == 2, result.output
    assert "--verdict, --report: a run campaign writes no verdict or report" in result.output
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "runs").exists()


def test_a_dry_run_says_an_each_switch_case_runs_per_switch_and_what_is_stored(tmp_path: Path) -> None:
    """An each-switch case is stored once per leaf switch, under keys that name their nodes: the dry run compared
    the unexpanded case's key and listed it as 'run' after a full pass (the run itself: 'Nothing to run')."""
    from fixtures_store import commbench_record

    from campaigns.store import RunInfo, open_store

    (case,) = _cases(tmp_path, "each-switch")
    url = f"sqlite:///{tmp_path / 'results.db'}"
    ending = case.run_key.removeprefix(case.series_key)
    with open_store(url) as store:
        # two switches stored untagged, a third only by a tagged run (a health night's): not this plan's
        for nodes in ("n1+n2", "n4+n5", "n7+n8@2026-11-20"):
            store.ingest(RunInfo(run_key=f"{case.series_key}/{nodes}{ending}", campaign=case.campaign, site=case.site,
                                 system=case.system, partition=case.partition, environ=case.environ,
                                 check_name=case.check, parameters={}, num_nodes=2, num_tasks=2, status="pass"),
                         [commbench_record(seed=len(nodes) + ord(nodes[1]))])
    result = CliRunner().invoke(app, ["run", str(tmp_path / "spec.yaml"), "--dry-run", "--db", url, "--runs-dir",
                                      str(tmp_path / "runs")], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "run per leaf switch (2 switch(es) stored: skipped)" in result.output, result.output
