"""The local multi-node Slurm cluster: nodes, MPI across nodes, job states through the sacct shim, and
the start/stop life cycle of site_configs/localslurm/cluster/cluster.sh."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fixtures_slurm import CLUSTER_SH, SlurmCluster, local_slurm_cluster, process_alive

pytestmark = pytest.mark.slurm

# Passes a token around the ring, each rank adding its rank: rank 0 gets back 0+1+...+(size-1).
RING_C = r"""
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, len, token;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    printf("rank %d of %d on %s\n", rank, size, name);
    fflush(stdout);
    if (rank == 0) {
        token = 0;
        MPI_Send(&token, 1, MPI_INT, 1 % size, 0, MPI_COMM_WORLD);
        MPI_Recv(&token, 1, MPI_INT, size - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        printf("RING %s sum %d\n", token == size * (size - 1) / 2 ? "OK" : "WRONG", token);
    } else {
        MPI_Recv(&token, 1, MPI_INT, rank - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        token += rank;
        MPI_Send(&token, 1, MPI_INT, (rank + 1) % size, 0, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return 0;
}
"""


def test_all_nodes_idle_in_default_partition(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.node_states() == {node: "idle" for node in slurm_cluster.nodes}
    summary = slurm_cluster.run(["sinfo", "-h", "-o", "%P %a %D"]).stdout.split()
    assert summary == [f"{slurm_cluster.partition}*", "up", str(slurm_cluster.nnodes)]


def test_topology_has_two_leaf_switches(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run(["scontrol", "show", "topology"]).stdout
    switches = {line.split()[0].removeprefix("SwitchName="): line for line in out.splitlines()}
    assert set(switches) == {"leaf1", "leaf2", "top"}
    assert "Level=1" in switches["top"]
    if slurm_cluster.nnodes >= 3:  # leaf1 holds two nodes: --switches=1 must place a 2-node job there
        leaf1 = slurm_cluster.run(["scontrol", "show", "hostnames", switches["leaf1"].split("Nodes=")[1]])
        hosts = slurm_cluster.run(["srun", "-N2", "--switches=1", "hostname"]).stdout.split()
        assert sorted(hosts) == leaf1.stdout.split()


def test_srun_two_nodes_have_distinct_hostnames(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run(["srun", "-N2", "-n2", "hostname"]).stdout.split()
    assert len(out) == 2 and len(set(out)) == 2
    assert set(out) <= set(slurm_cluster.nodes)


@pytest.mark.parametrize(("mpicc", "srun_mpi", "extra_env", "attempts"), [
    ("mpicc.openmpi", "pmix", {}, 1),
    # Without UCX_TLS, UCX would move the data through shared memory between the "nodes".
    # MPICH 4.0.2 + UCX 1.13 over tcp hangs in MPI_Finalize in about 1 run of 10 here: a rank that
    # finished its UCX disconnect blocks in the PMI barrier while its peer's disconnect still waits
    # for it (fixed upstream by pmodels/mpich#6596). The hang comes after all output; retry it.
    ("mpicc.mpich", "pmi2", {"UCX_TLS": "tcp,self"}, 3),
], ids=["openmpi-pmix", "mpich-pmi2"])
def test_mpi_ring_across_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path, mpicc: str, srun_mpi: str,
                                   extra_env: dict[str, str], attempts: int) -> None:
    if shutil.which(mpicc) is None:
        pytest.fail(f"{mpicc} not found (make system-deps installs it)")
    (tmp_path / "ring.c").write_text(RING_C)
    subprocess.run([mpicc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", "ring", "ring.c"],
                   cwd=tmp_path, check=True)
    # timeout(1) sends srun SIGTERM first, so srun cancels the job step instead of leaving it behind.
    srun = ["timeout", "-k", "10", "20", "srun", f"--mpi={srun_mpi}", "-N2", "-n2", "./ring"]
    for _ in range(attempts):
        result = slurm_cluster.run(srun, cwd=tmp_path, extra_env=extra_env, check=False)
        if result.returncode != 124:
            break
    assert result.returncode == 0, f"srun exited {result.returncode}:\n{result.stdout}{result.stderr}"
    out = result.stdout
    ranks = sorted(line.split() for line in out.splitlines() if line.startswith("rank "))
    assert [r[:4] for r in ranks] == [["rank", "0", "of", "2"], ["rank", "1", "of", "2"]], out
    hosts = {r[5] for r in ranks}
    assert len(hosts) == 2 and hosts <= set(slurm_cluster.nodes), out
    assert "RING OK sum 1" in out


def test_sacct_shim_reports_state_and_exit_code(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    assert shutil.which("sacct", path=slurm_cluster.env["PATH"]) == str(CLUSTER_SH.parent / "bin" / "sacct")
    good = slurm_cluster.sbatch("-N2", "-o", str(tmp_path / "good.out"), "--wrap", "srun hostname")
    bad = slurm_cluster.sbatch("-o", "/dev/null", "--wrap", "exit 3")
    good_end, bad_end = slurm_cluster.wait_job_end(good), slurm_cluster.wait_job_end(bad)
    assert (good_end.state, good_end.exit_code, good_end.signal) == ("COMPLETED", 0, 0)
    assert (bad_end.state, bad_end.exit_code, bad_end.signal) == ("FAILED", 3, 0)
    assert len(set((tmp_path / "good.out").read_text().split())) == 2
    # The query ReFrame's slurm scheduler makes.
    out = slurm_cluster.run(["sacct", "-S", time.strftime("%Y-%m-%d"), "-P", "-j", f"{good},{bad}",
                             "-o", "jobid,state,exitcode,end,nodelist"]).stdout.splitlines()
    assert out[0] == "JobID|State|ExitCode|End|NodeList"
    assert {tuple(line.split("|")[:3]) for line in out[1:]} == {
        (str(good), "COMPLETED", "0:0"), (str(bad), "FAILED", "3:0")}


def test_two_small_jobs_share_one_node(slurm_cluster: SlurmCluster) -> None:
    node = slurm_cluster.nodes[0]
    jobs = [slurm_cluster.sbatch("-w", node, "-n1", "-o", "/dev/null", "--wrap", "sleep 30") for _ in range(2)]
    try:
        deadline = time.monotonic() + 15
        squeue = ["squeue", "-h", "-j", ",".join(map(str, jobs)), "-o", "%T %N"]
        while (states := slurm_cluster.run(squeue).stdout.splitlines()) != [f"RUNNING {node}"] * 2:
            assert time.monotonic() < deadline, f"not both running on {node}: {states}"
            time.sleep(0.2)
    finally:
        slurm_cluster.run(["scancel", *map(str, jobs)])
    assert {slurm_cluster.wait_job_end(job).state for job in jobs} == {"CANCELLED"}


def test_kill_node_and_restart_node(slurm_cluster: SlurmCluster) -> None:
    node = slurm_cluster.nodes[1]
    before = slurm_cluster.daemon_pids()
    try:
        slurm_cluster.kill_node(2)
        assert not process_alive(before[f"slurmd-{node}"])
        others = {name: pid for name, pid in before.items() if name != f"slurmd-{node}"}
        assert all(process_alive(pid, name.split("-")[0]) for name, pid in others.items())
        assert slurm_cluster.cluster_sh("status", check=False).returncode == 1  # partly up
    finally:
        slurm_cluster.restart_node(node)
    after = slurm_cluster.daemon_pids()
    assert after[f"slurmd-{node}"] != before[f"slurmd-{node}"]
    assert process_alive(after[f"slurmd-{node}"], "slurmd")
    assert slurm_cluster.node_states()[node] == "idle"
    assert slurm_cluster.run(["srun", "-w", node, "hostname"]).stdout.strip() == node


def test_start_twice_stop_twice_start_again(slurm_cluster: SlurmCluster) -> None:
    pids = slurm_cluster.daemon_pids()
    try:
        assert "already up" in slurm_cluster.start().stdout
        assert slurm_cluster.daemon_pids() == pids
        slurm_cluster.stop()
        assert slurm_cluster.leftovers() == []
        assert "not running" in slurm_cluster.stop().stdout
        assert slurm_cluster.cluster_sh("status", check=False).returncode == 3
    finally:
        slurm_cluster.start()
    assert slurm_cluster.node_states() == {node: "idle" for node in slurm_cluster.nodes}


def test_start_after_kill_9_of_every_daemon(slurm_cluster: SlurmCluster) -> None:
    pids = slurm_cluster.daemon_pids()
    for pid in pids.values():
        subprocess.run(["kill", "-KILL", str(pid)], check=True)
    assert slurm_cluster.cluster_sh("status", check=False).returncode == 1  # stale PID files, network
    assert "partly up" in slurm_cluster.start().stdout
    new_pids = slurm_cluster.daemon_pids()
    assert set(new_pids) == set(pids) and not set(new_pids.values()) & set(pids.values())
    assert slurm_cluster.node_states() == {node: "idle" for node in slurm_cluster.nodes}
    assert len(set(slurm_cluster.run(["srun", "-N2", "-n2", "hostname"]).stdout.split())) == 2


def test_teardown_leaves_nothing_even_on_failure(slurm_cluster: SlurmCluster) -> None:
    with pytest.raises(RuntimeError, match="test body failed"):
        with local_slurm_cluster(nnodes=2) as second:
            assert second.cluster_id != slurm_cluster.cluster_id
            assert second.node_states() == {node: "idle" for node in second.nodes}
            assert second.leftovers()  # sanity: the check sees a running cluster
            raise RuntimeError("test body failed")
    assert second.leftovers() == []
    assert slurm_cluster.node_states() == {node: "idle" for node in slurm_cluster.nodes}
