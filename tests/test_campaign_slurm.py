"""`commcamp run` on the local multi-node Slurm cluster: every op with Open MPI (srun --mpi=pmix) and
MPICH (srun --mpi=pmi2, UCX over TCP) on 1 and 2 nodes, stored with the hosts each rank ran on."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from campaigns.store import open_store
from fixtures_slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
COMMCAMP = Path(sys.executable).with_name("commcamp")


@pytest.mark.slurm
def test_smoke_campaign_on_localslurm_one_and_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    result = subprocess.run(
        [str(COMMCAMP), "run", str(REPO / "campaigns" / "smoke-localslurm.yaml"), "--db", f"sqlite:///{db}",
         "--runs-dir", str(tmp_path / "runs")],
        env={**slurm_cluster.env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    with open_store(f"sqlite:///{db}") as store:
        runs = store.runs()
        frame = store.measurements()
    assert {(r.status, r.environ, r.parameters["op"], r.num_nodes) for r in runs} == {
        ("pass", env, op, nodes) for env in ("openmpi", "mpich") for op in ("pingpong", "allreduce", "alltoall")
        for nodes in (1, 2)}
    assert frame["valid"].all()
    nodes_of_run = {r.run_key: r.num_nodes for r in runs}
    for run_key, hostnames, ranks in zip(frame["run_key"], frame["hostnames"], frame["ranks"], strict=True):
        hosts = set(hostnames)
        assert len(hosts) == nodes_of_run[run_key], (run_key, hostnames)
        assert hosts <= set(slurm_cluster.nodes)
        assert len(hostnames) == ranks
    two_node = frame[frame["run_key"].map(nodes_of_run) == 2]
    assert set(two_node["op"]) == {"pingpong", "allreduce", "alltoall"}
    assert set(two_node["environ"]) == {"openmpi", "mpich"}
