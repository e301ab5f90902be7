"""`commcamp tune` on the local Slurm cluster, before and around the trials: what a dry run and bad input
submit and write (nothing), and which study a tune uses (one per knob setup and executor, or --study)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from fixtures_slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
COMMCAMP = Path(sys.executable).with_name("commcamp")
COMMBENCH = REPO / "build" / "bench" / "cpu-openmpi" / "commbench"
SCOPE = ["--site", "localslurm", "--system", "localslurm:debug", "--environ", "openmpi", "--library", "openmpi",
         "--op", "allreduce", "--nodes", "2", "--tasks-per-node", "1", "--sizes", "64K"]


def tune(cluster: SlurmCluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return cluster.run([str(COMMCAMP), "tune", *args], timeout=timeout, check=False, cwd=REPO,
                       extra_env={"COLUMNS": "300"})


def next_job_id(cluster: SlurmCluster) -> int:
    return int(cluster.run(["sbatch", "--parsable", "-p", cluster.partition, "-o", "/dev/null", "--wrap", "true"])
               .stdout.strip().split(";")[0])


@pytest.mark.slurm
def test_dry_run_and_bad_input_submit_and_write_nothing(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    runs, db = tmp_path / "runs", tmp_path / "study.db"
    where = ["--runs-dir", str(runs), "--db", f"sqlite:///{db}", "--no-publish"]
    before = next_job_id(slurm_cluster)
    result = tune(slurm_cluster, *SCOPE, *where, "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    # No job between the two marker jobs (the library-version probe was one), no run directory, no database.
    assert next_job_id(slurm_cluster) == before + 1
    assert not runs.exists() and not db.exists()
    assert "version: read by a probe run when the study runs" in result.stdout
    bad = {"--db": ("postgresql+psycopg://nobody@127.0.0.1:9/nowhere", "study storage postgresql+psycopg://"
                    "nobody@127.0.0.1:9/nowhere"),
           "--knobs": ("NCCL_NVLS_ENABLE", "NCCL_NVLS_ENABLE cannot be searched"),
           "--op": ("allreduc", "'allreduc' is not a commbench op")}
    for option, (value, message) in bad.items():
        args = [*SCOPE, *where, option, value] if option != "--db" else [*SCOPE, "--runs-dir", str(runs), option,
                                                                         value]
        result = tune(slurm_cluster, *args)
        assert result.returncode == 2 and message in result.stderr, (option, result.stdout + result.stderr)
        assert not runs.exists(), f"{option} {value}: something ran before the check"
    assert next_job_id(slurm_cluster) == before + 2


@pytest.mark.slurm
def test_tunes_with_other_knobs_or_executor_get_their_own_study(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    common = [*SCOPE, "--library-version", "4.1.4", "--trials", "1", "--no-finalize", "--no-publish", "--db", url,
              "--runs-dir", str(tmp_path / "runs")]
    srun = ["--executor", "launcher", "--launcher", "srun --mpi=pmix -N 2 -n 2 -p debug", "--commbench",
            str(COMMBENCH)]
    names = []
    for extra in (["--knobs", "OMPI_MCA_btl_tcp_sndbuf", *srun], ["--knobs", "OMPI_MCA_btl_tcp_rcvbuf", *srun],
                  ["--knobs", "OMPI_MCA_btl_tcp_rcvbuf"],  # the ReFrame executor
                  ["--knobs", "OMPI_MCA_btl_tcp_sndbuf,OMPI_MCA_btl_tcp_rcvbuf", *srun, "--study", "mine"]):
        result = tune(slurm_cluster, *common, *extra, timeout=240)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        (line,) = [line for line in result.stdout.splitlines() if line.startswith("study: ")]
        names.append(line.removeprefix("study: "))
    base = "localslurm/localslurm:debug/openmpi-4.1.4/allreduce/mpi/all/n2/g1/"
    assert names[0].startswith(base + "srun-") and names[1].startswith(base + "srun-")
    assert names[2].startswith(base + "reframe-") and names[3] == "mine"
    assert len(set(names)) == 4
    assert sorted(optuna.get_all_study_names(url)) == sorted(names)
