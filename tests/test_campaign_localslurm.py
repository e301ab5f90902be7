"""Characterization and a Slurm job failure mid-campaign, for real on the local Slurm cluster
(nodes 1 and 2 on leaf switch leaf1, node 3 on leaf2)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from campaigns.store import open_store
from fixtures_slurm import SlurmCluster

COMMCAMP = Path(sys.executable).with_name("commcamp")

CHARACTERIZE = """\
name: char-test
kind: characterize
site: localslurm
system: localslurm:debug
environments: [openmpi]
max_nodes: 2
placements: [same-switch, different-switch]
checks:
  - check: commbench_run
    ops: [pingpong]
    sizes: [8, 1024]
    warmup: 1
    iters: 4
    timeout_s: 30
    time_limit_s: 60
"""


def commcamp(cluster: SlurmCluster, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(COMMCAMP), *args], env={**cluster.env, "COLUMNS": "200"}, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.mark.slurm
def test_characterize_places_jobs_and_labels_distances(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    spec = tmp_path / "char.yaml"
    spec.write_text(CHARACTERIZE)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    report = tmp_path / "char.html"
    result = commcamp(slurm_cluster, "run", str(spec), "--db", db, "--runs-dir", str(tmp_path / "runs"),
                      "--report", str(report))
    assert result.returncode == 0, result.stdout + result.stderr
    node1, node2, node3 = slurm_cluster.nodes[:3]
    with open_store(db) as store:
        runs = {(r.num_nodes, r.parameters.get("placement", "any")): r.parameters for r in store.runs()}
    assert set(runs) == {(1, "any"), (2, "same-switch"), (2, "different-switch")}
    assert runs[1, "any"]["network_distance"] == "intra-node"
    assert runs[2, "same-switch"]["network_distance"] == "same-switch"
    assert set(runs[2, "same-switch"]["hosts"]) == {node1, node2}  # the only leaf with two nodes
    assert runs[2, "different-switch"]["network_distance"] == "different-switch"
    assert set(runs[2, "different-switch"]["hosts"]) == {node1, node3}
    text = report.read_text()
    assert f"Report: {report}" in result.stdout
    # the legend names what differs between the curves (campaigns/report/html.py): here the placement
    assert "placement different-switch" in text and "placement same-switch" in text


SLOW_SPEC = """\
name: cancel-test
site: localslurm
system: localslurm:debug
environments: [openmpi]
node_counts: [2]
checks:
  - check: commbench_run
    ops: [pingpong, allreduce]
    sizes: [4194304]
    warmup: 2
    iters: 300
    tasks_per_node: 1
    timeout_s: 60
    time_limit_s: 120
"""


@pytest.mark.slurm
def test_job_cancelled_mid_campaign_is_stored_as_failed_and_rerun(slurm_cluster: SlurmCluster,
                                                                  tmp_path: Path) -> None:
    spec = tmp_path / "cancel.yaml"
    spec.write_text(SLOW_SPEC)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    args = ["run", str(spec), "--db", db, "--runs-dir", str(tmp_path / "runs")]
    with subprocess.Popen([str(COMMCAMP), *args], env={**slurm_cluster.env, "COLUMNS": "200"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        deadline = time.monotonic() + 240
        cancelled = None
        while cancelled is None and time.monotonic() < deadline and proc.poll() is None:
            running = slurm_cluster.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], check=False).stdout.split()
            if running:
                cancelled = running[0]
                slurm_cluster.run(["scancel", cancelled])
            time.sleep(0.2)
        output = proc.communicate(timeout=600)[0]
    assert cancelled is not None, output
    assert proc.returncode == 1, output
    with open_store(db) as store:
        runs = store.runs()
    assert sorted(r.status for r in runs) == ["fail", "pass"], output
    failed = next(r for r in runs if r.status == "fail")
    assert failed.job_id == cancelled and "CANCELLED" in (failed.reason or ""), failed.reason

    # Nothing lost: the next run repeats only the cancelled test case.
    again = commcamp(slurm_cluster, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Running 1 of 2 test case(s)" in again.stdout


@pytest.mark.slurm
def test_jobs_that_name_a_reservation_are_placed_on_its_nodes_alone(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition whose access options name a reservation places its jobs on that reservation's nodes (Slurm runs
    them there alone); before, every reserved and unreserved node counted, and a same-switch pair went to nodes
    outside the reservation (leaf1's two here, one of them not reserved)."""
    from fixtures_sites import site_data, write_site

    from campaigns.model.spec import load_campaign
    from campaigns.slurm.placement import placer_for
    from campaigns.slurm.topology import PlacementError

    def reserving(data: dict) -> None:
        data["name"] = "reserving"
        data["systems"][0]["partitions"][0]["access"] = ["--partition=debug", "--reservation=rsv-test"]

    write_site(tmp_path / "sites" / "reserving", site_data("localslurm", reserving))
    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(tmp_path / "sites"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(CHARACTERIZE.replace("kind: characterize\n", "").replace("site: localslurm", "site: reserving")
                    .replace("max_nodes: 2", "node_counts: [2]").replace("different-switch", "any"))
    node1, node2, node3 = slurm_cluster.nodes[:3]
    slurm_cluster.run(["scontrol", "create", "reservation", "ReservationName=rsv-test", f"Nodes={node2},{node3}",
                       "StartTime=now", "Duration=10", "Users=root"])
    try:
        campaign = load_campaign(spec)
        (same_switch,) = [case for case in campaign.cases() if case.placement == "same-switch"]
        placer = placer_for(campaign, slurm_cluster.env)
        assert placer.usable_nodes(same_switch) == {node2, node3}
        with pytest.raises(PlacementError, match="no leaf switch has 2 nodes in service in Slurm partition debug "
                                                 "and reservation rsv-test"):
            placer.job_options(same_switch)
    finally:
        slurm_cluster.run(["scontrol", "delete", "ReservationName=rsv-test"], check=False)
