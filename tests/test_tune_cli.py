"""`commcamp tune` on the local Slurm cluster, before and around the trials: what a dry run and bad input
submit and write (nothing), and which study a tune uses (one per knob setup and executor, or --study);
commcamp's listings where cron and sbatch read them (a pipe, not a terminal)."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from campaigns.model.spec import load_campaign
from campaigns.store import open_store
from fixtures_cli import commcamp_output
from fixtures_slurm import SlurmCluster
from fixtures_store import commbench_record, run_info

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
    base = "localslurm/localslurm:debug/openmpi-4.1.4/allreduce/mpi/all/n2/g1/t1/"
    assert names[0].startswith(base + "srun-") and names[1].startswith(base + "srun-")
    assert names[2].startswith(base + "reframe-") and names[3] == "mine"
    assert len(set(names)) == 4
    assert sorted(optuna.get_all_study_names(url)) == sorted(names)


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    """commcamp as cron or sbatch runs it: stdout a pipe, no $COLUMNS."""
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    return subprocess.run([str(COMMCAMP), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
                          check=False)


def test_output_off_a_terminal_is_full_width_newest_first_and_machine_readable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    keys = [f"nightly/localslurm/localslurm:debug/openmpi/commbench_run/allreduce/n2/placement-spread/{n:02d}"
            for n in range(7)]
    with open_store(url) as store:
        for number, key in enumerate(keys):  # records of their own: not the same measurement stored twice
            store.ingest(run_info(key), [commbench_record(size=1024 * (number + 1))])
    result = piped("results", "runs", "--db", url, "--limit", "5")
    assert result.returncode == 0, result.stderr
    shown = [key for line in result.stdout.splitlines() for key in keys if key in line]
    assert shown == keys[::-1][:5], result.stdout  # whole run keys (> 80 columns), newest first
    result = piped("results", "runs", "--db", url, "--limit", "5", "--format", "json")
    assert [run["run key"] for run in json.loads(result.stdout)] == keys[::-1][:5]
    assert "showing 5 of 7 (newest first)" in result.stderr
    result = piped("results", "list", "--db", url, "--limit", "0", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 7 and rows[0]["op"] == "allreduce" and int(rows[0]["id"]) > int(rows[-1]["id"])
    # The plan of a campaign names every run key whole.
    spec = REPO / "campaigns" / "health-localslurm.yaml"
    result = piped("run", str(spec), "--dry-run", "--tag", "2026-11-25", "--db", f"sqlite:///{tmp_path / 'none.db'}")
    assert result.returncode == 0, result.stderr
    cases = load_campaign(spec).cases("2026-11-25")
    assert cases and all(case.run_key in result.stdout for case in cases), result.stdout


def test_commcamp_starts_without_its_heavy_libraries() -> None:
    """`commcamp --help` (the CLI module) loads none of the libraries behind the commands: they cost ~2 s."""
    heavy = ("optuna", "sqlalchemy", "pandas", "numpy", "scipy", "reframe", "jsonschema", "pydantic")
    code = f"import sys, campaigns.cli.app; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_a_path_jobs_would_get_in_their_environment_is_checked_before_the_tune(tmp_path: Path) -> None:
    """Per-size rules put --publish-dir's and --runs-dir's files and the tuner plugin into a job's environment,
    where publish refuses a space or a shell character: after the whole tune. Now refused first, exit 2, naming
    the option and the character. Without the per-size stage no path reaches an environment: a space is fine."""
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({
        "site": "local", "system": "local:cpu", "library": "openmpi", "op": "allreduce", "nodes": 1,
        "tasks_per_node": 2, "sizes": ["64K"], "knobs": ["OMPI_MCA_btl_tcp_sndbuf"], "trials": 2,
        "executor": "launcher", "launcher": ["mpirun.openmpi", "-np", "2"], "db": f"sqlite:///{tmp_path / 's.db'}",
        "runs_dir": str(tmp_path / "runs"), "publish_dir": str(tmp_path / "rec"), "per_size": {"enabled": True}}))
    plugin = tmp_path / "my plugin.so"
    plugin.write_bytes(b"")
    for option, value, char in [("--publish-dir", tmp_path / "my rec", "a space"),
                                ("--runs-dir", tmp_path / "runs$x", "'$'"),
                                ("--plugin-library", plugin, "a space")]:
        code, out = commcamp_output("tune", str(spec), option, str(value), "--dry-run")
        assert code == 2, (option, out)
        assert f"{option} {value}: has {char}: jobs get this path in their environment" in out, out
        assert not (tmp_path / "runs").exists() and not (tmp_path / "runs$x").exists()
    # resolved: a link without a space to a directory with one is refused alike
    (tmp_path / "with space").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "with space")
    code, out = commcamp_output("tune", str(spec), "--publish-dir", str(tmp_path / "link"), "--dry-run")
    assert code == 2 and f"--publish-dir {tmp_path / 'with space'}: has a space" in out, out
    spec.write_text(spec.read_text().replace("enabled: true", "enabled: false"))
    code, out = commcamp_output("tune", str(spec), "--publish-dir", str(tmp_path / "my rec"), "--runs-dir",
                                str(tmp_path / "my runs"), "--dry-run")
    assert code == 0, out


def test_a_seed_a_resumed_study_does_not_use_is_said_so() -> None:
    """`--seed 7` on a study created with another seed printed the study's seed and nothing of the 7."""
    from campaigns.cli.tune import report_lines
    from campaigns.tuning.session import TuningOutcome
    from tuners.study import SCREEN_SEED

    study = optuna.create_study()
    study.set_user_attr(SCREEN_SEED, 1594849180)
    (said,) = [line for line in report_lines(TuningOutcome(study, {}), 7) if line.startswith("screen order")]
    assert said.endswith("; --seed 7 not used: it seeds a new study only"), said
    assert "not used" not in " ".join(report_lines(TuningOutcome(study, {}), 1594849180) + report_lines(
        TuningOutcome(study, {}), None))
