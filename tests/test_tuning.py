"""The tuner's campaign side on this machine: commbench (cpu backend, Open MPI) as the evaluator through
the launcher and ReFrame executors, its verdicts (timeout, invalid data, unread knob, failed launch),
`commcamp tune` end to end with publishing, and `commcamp recommend` on what it published."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
import yaml

from campaigns.locks import is_in_use
from campaigns.tuning.executors import (BenchRequest, CommbenchEvaluator, LauncherExecutor, ReframeExecutor,
                                        RunOutcome, knobs_read, strip_knobs)
from campaigns.tuning.session import launcher_ranks
from fixtures_cli import commcamp_output
from fixtures_tuner import make_scope
from tuners.catalog import KnobCatalog, Library
from tuners.evaluation import Evaluation, EvaluationAborted, FailureKind, buckets_for_sizes
from tuners.finalize import Thresholds, fit_budget, planned_runs
from tuners.space import build_space
from tuners.study import OUTCOME, Tuner, dropped_knobs, is_counted

REPO = Path(__file__).resolve().parents[1]
COMMBENCH = REPO / "build" / "bench" / "cpu-openmpi" / "commbench"
MPIRUN = ["mpirun.openmpi", "-np", "2", "--bind-to", "none"]
PLANTED = REPO / "site_configs" / "knobs" / "planted" / "tcp-buffers.yaml"
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}
REQUEST = BenchRequest("allreduce", "mpi", (1024, 65536), warmup=1, iters=3, bench_timeout_s=20, time_limit_s=60)


@pytest.fixture(scope="module")
def catalog() -> KnobCatalog:
    return KnobCatalog.load()


def evaluator(tmp_path: Path, catalog: KnobCatalog, commbench: Path = COMMBENCH,
              request: BenchRequest = REQUEST) -> CommbenchEvaluator:
    base = strip_knobs({**os.environ, **OMPI_ENV}, catalog, Library.OPENMPI)
    return CommbenchEvaluator(LauncherExecutor(MPIRUN, commbench, tmp_path, base), request, Library.OPENMPI,
                              catalog)


def wrapper(tmp_path: Path, body: str, name: str = "commbench-wrapper") -> Path:
    """A 'commbench' that runs the real one with extra options (its --inject test hooks) or misbehaves; or,
    named otherwise, another program (a launcher) doing `body`."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


PRETUNE = ("pretune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--library-version",
           "4.1.4", "--op", "allreduce", "--sizes", "64K", "--knobs", "OMPI_MCA_btl_tcp_sndbuf")


def allocation(tmp_path: Path, srun_body: str) -> dict[str, str]:
    """The environment of a one-node Slurm allocation (2 tasks) whose srun is a script doing `srun_body`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper(bin_dir, srun_body, "srun")
    return {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "2",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_read_logs_of_nccl_and_open_mpi() -> None:
    # NCCL 2.28.3 as it printed on the H200 machine (NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING)
    nccl = ("vm:6715:6869 [2] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.\n"
            "vm:6715:6869 [2] NCCL INFO NCCL_PROTO set by environment to LL\n")
    assert knobs_read(Library.NCCL, nccl) == {"NCCL_NVLS_ENABLE": "0", "NCCL_PROTO": "LL"}
    ompi = "[c3n1:17542] btl_tcp_sndbuf=65536 (environment)\n[vm:1] coll_tuned_use_dynamic_rules=true (environment)\n"
    assert knobs_read(Library.OPENMPI, ompi) == {"OMPI_MCA_btl_tcp_sndbuf": "65536",
                                                 "OMPI_MCA_coll_tuned_use_dynamic_rules": "true"}
    assert knobs_read(Library.MPICH, "anything") is None


def test_a_run_measures_every_size_and_credits_only_read_knobs(tmp_path: Path, catalog: KnobCatalog,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # An inherited knob must not leak into a trial that leaves it unset.
    monkeypatch.setenv("OMPI_MCA_btl_tcp_rcvbuf", "4096")
    evaluate = evaluator(tmp_path, catalog)
    good = evaluate({"OMPI_MCA_btl_tcp_sndbuf": "65536"})
    assert good.ok, good.reason
    assert sorted(good.times_us) == [1024, 65536] and all(len(s) == 3 for s in good.times_us.values())
    record = json.loads((next(tmp_path.glob("run-*")) / "commbench.jsonl").read_text().splitlines()[0])
    assert record["env"]["OMPI_MCA_btl_tcp_sndbuf"] == "65536" and "OMPI_MCA_btl_tcp_rcvbuf" not in record["env"]
    validated = evaluate({}, validate=True)
    assert validated.ok and validated.validated
    # A knob Open MPI does not know is never credited.
    fake = KnobCatalog.from_document({"schema_version": 1, "knobs": {"OMPI_MCA_coll_tuned_no_such_param": {
        "libraries": ["openmpi"], "type": "bool", "safety": "safe", "description": "misspelt on purpose",
        "unset": "-", "source": "-"}}},
        "test catalog")
    unread = evaluator(tmp_path, fake)({"OMPI_MCA_coll_tuned_no_such_param": "1"})
    assert unread.failure is FailureKind.INVALID
    assert "did not report reading OMPI_MCA_coll_tuned_no_such_param" in unread.reason
    assert unread.unread == ("OMPI_MCA_coll_tuned_no_such_param",)  # the tuner drops it from the search
    exempt = evaluator(tmp_path, fake)
    exempt.exempt = frozenset({"OMPI_MCA_coll_tuned_no_such_param"})
    assert exempt({"OMPI_MCA_coll_tuned_no_such_param": "1"}).ok


def test_an_inherited_read_log_file_does_not_make_every_knob_unread(tmp_path: Path, catalog: KnobCatalog,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """OMPI_MCA_mpi_show_mca_params_file in the caller's environment sends Open MPI's read log to that file, none of
    it to the output: before, the knob the trial set read as unread, the trial was invalid and the tuner took the
    knob out of the search. The variables that divert a read log are set empty, whatever the caller's (NCCL_DEBUG_FILE
    alike: the test below), and an mca-params.conf naming a file is outranked by the empty variable."""
    diverted = tmp_path / "mca_params.txt"
    monkeypatch.setenv("OMPI_MCA_mpi_show_mca_params_file", str(diverted))
    result = evaluator(tmp_path, catalog)({"OMPI_MCA_btl_tcp_sndbuf": "65536"})
    assert result.ok and result.unread == (), result.reason
    assert not diverted.exists()
    # A site's or the user's mca-params.conf naming such a file diverted the log alike
    monkeypatch.delenv("OMPI_MCA_mpi_show_mca_params_file")
    (tmp_path / ".openmpi").mkdir()
    (tmp_path / ".openmpi" / "mca-params.conf").write_text(f"mpi_show_mca_params_file = {diverted}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    result = evaluator(tmp_path, catalog)({"OMPI_MCA_btl_tcp_sndbuf": "65536"})
    assert result.ok and result.unread == (), result.reason
    assert not diverted.exists()
    assert strip_knobs({"NCCL_DEBUG_FILE": "/scratch/nccl.%h.%p", "HOME": "/h"}, catalog, Library.NCCL) == {
        "HOME": "/h"}
    # the last tune's module loaded: its per-size rules would run in every trial, the defaults' too
    published = {"NCCL_TUNER_PLUGIN": "/p.so", "OMPI_MCA_coll_tuned_dynamic_rules_filename": "/r",
                 "MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE": "/j"}
    assert strip_knobs({**published, "HOME": "/h"}, catalog, Library.OPENMPI) == {  # NCCL's and MPICH's rules stay:
        "HOME": "/h", "NCCL_TUNER_PLUGIN": "/p.so", "MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE": "/j"}  # no Open MPI run
    # the knobs of the libraries an MPI runs over go too; NCCL's stay (a job's GPU settings)
    assert strip_knobs({"UCX_TLS": "tcp", "FI_CXI_RX_MATCH_MODE": "hybrid", "NCCL_IB_HCA": "mlx5_0"}, catalog,
                       Library.MPICH) == {"NCCL_IB_HCA": "mlx5_0"}
    # MPICH reads a control variable under its MPICH_ and MPIR_PARAM_ aliases too (MPI_T on MPICH 4.0.2): an
    # inherited alias ran in every trial, the defaults' too, and the old rules file with it
    aliases = {"MPICH_ALLREDUCE_INTRA_ALGORITHM": "recursive_doubling",
               "MPIR_PARAM_COLL_SELECTION_TUNING_JSON_FILE": "/old/rules.json"}
    assert strip_knobs({**aliases, "HOME": "/h"}, catalog, Library.MPICH) == {"HOME": "/h"}


def test_an_nccl_conf_naming_a_debug_file_does_not_make_every_knob_unread(tmp_path: Path, catalog: KnobCatalog) -> None:
    """An nccl.conf (/etc/nccl.conf, ~/.nccl.conf, NCCL_CONF_FILE) naming NCCL_DEBUG_FILE took all of NCCL's read log
    into that file: every knob a trial set read as unread. Measured with NCCL 2.28.3 on the GPU machine
    (results/reference/single-gpu/nccl-read-log-2026-11-27: 0 lines in the output with such a file, 1 with
    NCCL_DEBUG_FILE empty in the environment). Here a 'commbench' that logs as NCCL does in those runs: conf values
    only where the environment lacks the variable, an empty file name = the output."""
    conf, diverted = tmp_path / "nccl.conf", tmp_path / "diverted.log"
    conf.write_text(f"NCCL_DEBUG_FILE={diverted}\n")
    nccl_like = wrapper(tmp_path, f"""file=${{NCCL_DEBUG_FILE-$(sed -n 's/^NCCL_DEBUG_FILE=//p' "$NCCL_CONF_FILE")}}
env | sed -n '/^NCCL_DEBUG/d; s/^\\(NCCL_[A-Z0-9_]*\\)=\\(.*\\)/vm:1:2 [0] NCCL INFO \\1 set by environment to \\2./p' \\
  >> "${{file:-/dev/stdout}}"
exec {COMMBENCH} "$@"
""")
    base = strip_knobs({**os.environ, **OMPI_ENV, "NCCL_CONF_FILE": str(conf)}, catalog, Library.NCCL)
    nccl = CommbenchEvaluator(LauncherExecutor(MPIRUN, nccl_like, tmp_path, base), REQUEST, Library.NCCL, catalog)
    result = nccl({"NCCL_MAX_NCHANNELS": "4"})
    assert result.ok and result.unread == (), result.reason
    assert not diverted.exists()


class NcclReadLog:
    """An executor whose run measures 10 us at every size and prints NCCL's read log of the knobs set, but for those
    in `unread` (a code path that does not read them: NCCL_IB_SL on a run without InfiniBand)."""

    def __init__(self, unread: set[str]) -> None:
        self.unread = unread

    def run(self, env, request: BenchRequest, validate: bool) -> RunOutcome:
        log = "".join(f"vm:1:2 [0] NCCL INFO {name} set by environment to {value}\n" for name, value in env.items()
                      if name not in self.unread)
        return RunOutcome([{"kind": "result", "op": request.op, "bytes": size, "valid": True, "samples_us": [10.0]}
                           for size in request.sizes], log, 0)


def test_a_site_default_the_library_does_not_read_fails_no_trial(catalog: KnobCatalog) -> None:
    """Leonardo's default NCCL_IB_SL=1 on a path where NCCL never reads it: the baseline runs it too, so it is inert,
    not invalid; it leaves the search and every trial, trial 0 first, is measured (before, every trial was invalid
    and the whole budget burnt). A change of it that the library does not read is still not credited."""
    leonardo = catalog.for_site({"defaults": {"NCCL_IB_SL": "1"}})
    sizes = (8, 1024)
    evaluate = CommbenchEvaluator(NcclReadLog({"NCCL_IB_SL"}), BenchRequest("allreduce", "ccl", sizes), Library.NCCL,
                                  leonardo)
    at_default = evaluate({"NCCL_IB_SL": "1", "NCCL_PROTO": "LL"})
    assert at_default.ok and at_default.unread == ("NCCL_IB_SL",)
    changed = evaluate({"NCCL_IB_SL": "2"})
    assert changed.failure is FailureKind.INVALID and "did not report reading NCCL_IB_SL" in changed.reason
    space = build_space(leonardo, {Library.NCCL: "2.28.3"}, knobs=["NCCL_IB_SL", "NCCL_BUFFSIZE"], op="allreduce",
                        transport="ccl")
    study = Tuner(make_scope(), space, evaluate, optuna.storages.InMemoryStorage(), buckets_for_sizes(sizes),
                  n_trials=6, seed=0).run()
    assert [t.user_attrs[OUTCOME] for t in study.trials if is_counted(t)] == ["complete"] * 6
    assert dropped_knobs(study) == {"NCCL_IB_SL": "not read by the library in trial 0"}


def test_hang_corruption_crash_and_hard_limit_are_failed_trials(tmp_path: Path, catalog: KnobCatalog) -> None:
    hang = evaluator(tmp_path, catalog, wrapper(tmp_path, f'exec {COMMBENCH} "$@" --inject hang'),
                     BenchRequest("allreduce", "mpi", (1024,), iters=3, bench_timeout_s=2, time_limit_s=60))({})
    assert hang.failure is FailureKind.TIMEOUT and "hung" in hang.reason
    corrupt = evaluator(tmp_path, catalog, wrapper(tmp_path, f'exec {COMMBENCH} "$@" --inject corrupt'))({},
                                                                                                  validate=True)
    assert corrupt.failure is FailureKind.INVALID and "data validation failed" in corrupt.reason
    crash = evaluator(tmp_path, catalog, wrapper(tmp_path, "echo 'segfault here' >&2; exit 139"))({})
    assert crash.failure is FailureKind.FAILED and "segfault here" in crash.reason
    stuck = evaluator(tmp_path, catalog, wrapper(tmp_path, "sleep 60"),
                      BenchRequest("allreduce", "mpi", (1024,), time_limit_s=2))({})
    assert stuck.failure is FailureKind.TIMEOUT and "hard time limit of 2 s" in stuck.reason


def test_a_launcher_that_fails_is_blamed_not_the_data(tmp_path: Path, catalog: KnobCatalog) -> None:
    """Exit 1 is commbench's wrong-data code only with its valid=false records: trials run with --no-check,
    and srun exits 1 when it cannot start (the trial's reason used to say "data validation failed")."""
    srun = wrapper(tmp_path, "echo 'srun: fatal: Could not establish a configuration source' >&2; exit 1")
    base = strip_knobs({**os.environ, **OMPI_ENV}, catalog, Library.OPENMPI)
    launch = CommbenchEvaluator(LauncherExecutor([str(srun)], COMMBENCH, tmp_path, base), REQUEST, Library.OPENMPI,
                                catalog)({})
    assert launch.failure is FailureKind.FAILED
    assert launch.reason.startswith("the launch failed (exit 1): srun: fatal: Could not establish a configuration "
                                    "source (run directory "), launch.reason
    # commbench ran (its records file is there) and something after it exited 1: no wrong data either.
    after = evaluator(tmp_path, catalog, wrapper(tmp_path, f'{COMMBENCH} "$@"; exit 1'))({})
    assert after.failure is FailureKind.FAILED and after.reason.startswith("commbench exited with code 1"), after.reason


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_tune_stopped_by_a_signal_says_so_in_one_line_and_requeues_the_trial(tmp_path: Path, sig: int) -> None:
    """SIGTERM (Slurm's time limit) as Ctrl-C: the launch stopped, the running trial failed uncounted and
    queued again, one line, exit 130 (SIGTERM was exit 143, no message, the trial left RUNNING). A failed
    trial is commcamp's one line, not Optuna's warning with a traceback (nor one for Ctrl-C)."""
    count, pid = tmp_path / "launches", tmp_path / "pid"
    launcher = wrapper(tmp_path, f"""n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}
if [ "$n" = 0 ]; then echo 'srun: fatal: Could not establish a configuration source' >&2; exit 1; fi
echo $$ > {pid}.new && mv {pid}.new {pid}
exec sleep 300""")
    db = f"sqlite:///{tmp_path / 'study.db'}"
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({
        "site": "local", "system": "local:cpu", "library": "openmpi", "library_version": "4.1.4",
        "op": "allreduce", "nodes": 1, "tasks_per_node": 2, "sizes": ["64K"], "knobs": ["OMPI_MCA_btl_tcp_sndbuf"],
        "trials": 3, "executor": "launcher", "launcher": [str(launcher)], "commbench": str(COMMBENCH), "db": db,
        "runs_dir": str(tmp_path / "runs"), "seed": 0}))  # seed: trial 1 not a repeat of the failed defaults
    cmd = [str(Path(sys.executable).with_name("commcamp")), "tune", str(spec), "--no-finalize", "--no-publish"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "COLUMNS": "300"},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
        deadline = time.monotonic() + 60
        while not pid.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(sig)  # trial 1's launch is running
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert output.strip().splitlines()[-1] == ("interrupted: every finished trial is stored and a running one is "
                                               "queued again; run the same command again to resume"), output
    assert ("trial 0 failed: the launch failed (exit 1): srun: fatal: Could not establish a configuration source"
            in output)
    assert "Traceback" not in output and "_TrialFailed" not in output and "KeyboardInterrupt" not in output, output
    with pytest.raises(ProcessLookupError):  # the launch (a session of its own) was stopped
        os.kill(int(pid.read_text()), 0)
    (name,) = optuna.get_all_study_names(db)
    trials = optuna.load_study(study_name=name, storage=db).trials
    assert [(t.number, t.state.name, t.user_attrs.get("outcome"), t.user_attrs.get("retry_of")) for t in trials] == [
        (0, "FAIL", "failed", None), (1, "FAIL", None, None), (2, "WAITING", None, [1])]


@pytest.mark.postgres
def test_an_interrupted_tune_cancels_its_slurm_workers(tmp_path: Path, postgres_url: str) -> None:
    """`tune --workers 2` stopped (SIGTERM) while its workers run: it cancels their jobs (they would run on,
    alone, to their time limit) and says so. sbatch, squeue and scancel are stand-ins here: the real ones on
    the local cluster are tests/test_pretune.py's."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    wrapper(bin_dir, f'n=$(cat {calls}.sbatch 2>/dev/null || echo 0); echo $((n+1)) > {calls}.sbatch; '
                     'echo $((101+n))', "sbatch")
    wrapper(bin_dir, f'[ -e {calls}.scancel ] || printf "101\\n102\\n"', "squeue")
    wrapper(bin_dir, f'echo "$@" > {calls}.scancel', "scancel")
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({
        "site": "local", "system": "local:cpu", "library": "openmpi", "library_version": "4.1.4",
        "op": "allreduce", "nodes": 1, "tasks_per_node": 2, "sizes": ["64K"], "knobs": ["OMPI_MCA_btl_tcp_sndbuf"],
        "trials": 3, "executor": "launcher", "launcher": ["true"], "commbench": str(COMMBENCH), "db": postgres_url,
        "runs_dir": str(tmp_path / "runs")}))
    cmd = [str(Path(sys.executable).with_name("commcamp")), "tune", str(spec), "--workers", "2", "--no-finalize",
           "--no-publish"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "COLUMNS": "300", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
                          ) as proc:
        deadline = time.monotonic() + 60
        while (Path(f"{calls}.sbatch").read_text().strip() if Path(f"{calls}.sbatch").exists() else "") != "2":
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        time.sleep(1)  # past the message, waiting for the jobs
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert Path(f"{calls}.scancel").read_text().split() == ["101", "102"], output
    assert output.strip().splitlines()[-1].endswith("(its Slurm workers were cancelled)"), output


def test_reframe_executor_runs_a_trial_through_the_campaign_runner(tmp_path: Path, catalog: KnobCatalog) -> None:
    inherited = {"OMPI_MCA_btl_base_warn_component_unused": "0"}
    base = strip_knobs({**os.environ, **inherited}, catalog, Library.OPENMPI)
    executor = ReframeExecutor("local", "local:cpu", "openmpi", 1, 2, tmp_path, base, inherited=inherited)
    evaluate = CommbenchEvaluator(executor, REQUEST, Library.OPENMPI, catalog)
    result = evaluate({"OMPI_MCA_btl_tcp_sndbuf": "8192"})
    assert result.ok, result.reason
    assert sorted(result.times_us) == [1024, 65536]
    script = next(tmp_path.glob("reframe-*/rfm-1/**/rfm_job.sh"))
    assert "export OMPI_MCA_btl_tcp_sndbuf=8192" in script.read_text()
    assert "export OMPI_MCA_mpi_show_mca_params=enviro" in script.read_text()
    # the settings the tune inherits are the job's own: a partition's `--export=NONE` would run it without them
    assert "export OMPI_MCA_btl_base_warn_component_unused=0" in script.read_text()
    # later trials restore the first one's build from it: `results prune` keeps it while this tune runs
    assert f"pid {os.getpid()}" in (is_in_use(next(tmp_path.glob("reframe-*"))) or "not in use")


def test_a_trial_s_run_directory_is_in_use_while_it_runs(tmp_path: Path) -> None:
    """`results prune --keep-days 0` during a tune deleted the directory a trial was writing: the launch's records
    and output went with it. The trial's run directory is marked in use while it runs, and released after."""
    seen = tmp_path / "seen"
    probe = (f"from campaigns.locks import is_in_use; from pathlib import Path; "
             f"Path({str(seen)!r}).write_text(str(is_in_use(Path.cwd())))")
    launcher = wrapper(tmp_path, f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)}", name="launcher")
    runs = tmp_path / "runs"
    outcome = LauncherExecutor([str(launcher)], wrapper(tmp_path, "exit 0"), runs, dict(os.environ)).run({}, REQUEST,
                                                                                                         False)
    assert outcome.directory is not None and outcome.directory.parent == runs
    assert seen.read_text().startswith(f"pid {os.getpid()} since"), outcome.output
    assert is_in_use(outcome.directory) is None


def processes_under(path: Path) -> list[str]:
    """Live processes whose working directory is under `path` (pid and command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "cwd").startswith(str(path)):
                found.append(f"{entry.name}: {(entry / 'cmdline').read_text().replace(chr(0), ' ')}")
        except OSError:  # gone meanwhile, or a zombie
            continue
    return found


def test_an_interrupted_reframe_trial_leaves_no_process(tmp_path: Path, catalog: KnobCatalog) -> None:
    """Ctrl-C or SIGTERM mid-trial: ReFrame gets SIGTERM, on which it cancels its job (subprocess.run gave it
    SIGKILL, and its job ran on: a Slurm job until its time limit)."""
    base = strip_knobs({**os.environ, **OMPI_ENV}, catalog, Library.OPENMPI)
    executor = ReframeExecutor("local", "local:cpu", "openmpi", 1, 2, tmp_path, base)
    long = BenchRequest("allreduce", "mpi", (1 << 20,), iters=10**6, bench_timeout_s=120, time_limit_s=120)

    def interrupt_when_measuring() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("--iters 1000000" in p for p in processes_under(tmp_path)):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    # Python keeps SIGINT ignored when it starts ignored (a job started with & by a shell without job control)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_when_measuring, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            executor.run({}, long, False)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 10
    while processes_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(tmp_path) == []


def test_a_reframe_trial_past_its_queue_wait_stops_the_tune_without_charging_the_setting(
        tmp_path: Path, catalog: KnobCatalog) -> None:
    """ReFrame's own limit counts the job's wait in the queue and the build: past it (was: the run's limit + 120 s,
    a busy queue's ordinary wait) the trial read "hung" and its setting was never launched again. A hang is what
    commbench's watchdog or the job's time limit reports; past the queue wait the tune stops, the setting not
    charged, and no process is left."""
    from tuners.evaluation import EvaluationAborted

    base = strip_knobs({**os.environ, **OMPI_ENV}, catalog, Library.OPENMPI)
    executor = ReframeExecutor("local", "local:cpu", "openmpi", 1, 2, tmp_path, base, queue_wait_s=0)
    long = BenchRequest("allreduce", "mpi", (1 << 20,), iters=10**6, bench_timeout_s=120, time_limit_s=3)
    with pytest.raises(EvaluationAborted, match=r"ReFrame did not finish within the run's time limit \(3 s\) \+ "
                                                r"queue_wait_s \(0 s\).*not charged to the setting"):
        executor.run({}, long, False)
    deadline = time.monotonic() + 10
    while processes_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(tmp_path) == []


def test_paths_typed_relative_to_the_working_directory_reach_the_launch(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """--commbench, --runs-dir and a launcher script typed relative to where commcamp starts: the launch runs in
    its run directory, where they meant nothing before (every trial failed: 'could not access or execute')."""
    monkeypatch.chdir(tmp_path)
    wrapper(tmp_path, f'exec {" ".join(MPIRUN)} "$@"', "launch.sh")
    code, out = commcamp_output(
        "tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--library-version", "4.1.4",
        "--op", "allreduce", "--sizes", "64K", "--executor", "launcher", "--launcher", "./launch.sh",
        "--commbench", os.path.relpath(COMMBENCH, tmp_path), "--runs-dir", "runs", "--db", "sqlite:///study.db",
        "--knobs", "OMPI_MCA_btl_tcp_sndbuf", "--trials", "2", "--no-finalize", "--no-publish", env=OMPI_ENV)
    assert code == 0 and "trials: 2 counted (2 complete, 0 failed)" in out, out
    assert len(list((tmp_path / "runs").glob("run-*/commbench.jsonl"))) == 2


def test_a_failed_version_probe_names_its_run_directory(tmp_path: Path) -> None:
    """A launcher that cannot run commbench (a mistyped option) fails the probe that reads the library's version:
    the tune stops before any trial, and says where the probe's output is (its run directory was left unnamed)."""
    launcher = wrapper(tmp_path, 'echo "mpirun: Error: unknown option --bind-to nonee" >&2; exit 1', name="launch.sh")
    code, out = commcamp_output(
        "tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--op", "allreduce", "--sizes",
        "64K", "--executor", "launcher", "--launcher", str(launcher), "--commbench", COMMBENCH, "--runs-dir",
        tmp_path / "runs", "--db", f"sqlite:///{tmp_path / 'study.db'}", "--knobs", "OMPI_MCA_btl_tcp_sndbuf",
        "--trials", "1", "--no-finalize", "--no-publish", env=OMPI_ENV)
    (probe,) = (tmp_path / "runs").glob("run-*")
    flat = " ".join(out.split())
    assert code == 2 and "cannot tell the openmpi version from the probe run (exit 1, 0 records" in flat, out
    assert f"unknown option --bind-to nonee; its files: {probe}); give library_version" in flat, out


def test_a_worker_s_spec_names_the_paths_typed_relative_to_the_tune(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A Slurm worker starts in its own directory and a ReFrame trial under its prefix: the spec carries the paths
    typed relative to where `tune` started as absolute ones (before, the worker spec kept 'cb' and 'runs', and every
    worker stopped: 'commbench binary cb does not exist')."""
    from campaigns.tuning.spec import TuningSpec
    from campaigns.tuning.workers import worker_spec

    monkeypatch.chdir(tmp_path)
    spec = TuningSpec(site="localslurm", system="localslurm:debug", library="openmpi", op="allreduce", sizes=[65536],
                      trials=2, executor="launcher", launcher=["./launch.sh", "-n", "2"], commbench=Path("cb"),
                      runs_dir=Path("runs"), publish_dir=Path("rec"), knob_overrides=[Path("knobs.yaml")])
    written = json.loads(worker_spec(spec).model_dump_json())
    assert (written["commbench"], written["runs_dir"], written["knob_overrides"]) == (
        str(tmp_path / "cb"), str(tmp_path / "runs"), [str(tmp_path / "knobs.yaml")])
    assert spec.launcher == [str(tmp_path / "launch.sh"), "-n", "2"] and spec.publish_dir == tmp_path / "rec"


def test_each_new_study_draws_its_screen_order_unless_a_seed_is_given(tmp_path: Path) -> None:
    """The sampler benchmark's per-seed figures are draws of the screen's order: so is what `tune` ships. Before,
    every study of one knob space screened in one order (seed 0): on three Open MPI grids a median of 16-27 trials
    to 95 % where the benchmark's draws need 6."""
    def screen_seed(db: str, *seed: str) -> str:
        code, out = commcamp_output(
            "tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--library-version", "4.1.4",
            "--op", "allreduce", "--sizes", "64K", "--executor", "launcher", "--launcher", " ".join(MPIRUN),
            "--commbench", COMMBENCH, "--runs-dir", tmp_path / "runs", "--db", f"sqlite:///{tmp_path / db}",
            "--knobs", "OMPI_MCA_btl_tcp_sndbuf", "--trials", "1", "--no-finalize", "--no-publish", *seed,
            env=OMPI_ENV)
        found = re.search(r"screen order: seed (\d+) \(the study's", out)
        assert code == 0 and found, out
        return found.group(1)

    assert screen_seed("a.db") != screen_seed("b.db")
    assert screen_seed("c.db", "--seed", "7") == "7"


def test_a_study_stopped_by_its_runs_directory_does_not_blame_the_database() -> None:
    """An evaluation aborted by a runs directory that filled up mid-study stops the study (exit 1); the remedy
    named is the cause's, not 'once the database answers'."""
    from rich.console import Console
    import typer

    from campaigns.cli.tune import _study_errors

    console = Console(record=True, width=300)
    with pytest.raises(typer.Exit) as stopped, _study_errors(console, "sqlite:///study.db"):
        raise EvaluationAborted("cannot create a run directory under /runs: No space left on device")
    assert stopped.value.exit_code == 1
    assert console.export_text().strip() == (
        "study stopped: cannot create a run directory under /runs: No space left on device. Every finished trial is "
        "stored; run the same command again once that is mended (a trial that was running is queued again).")


def test_ctrl_c_hidden_by_optuna_is_an_interrupt() -> None:
    """Ctrl-C while Optuna stores a trial's state reaches tune as an UnboundLocalError (Optuna 5's _run_trial)
    whose context is the KeyboardInterrupt: a traceback and exit 1 before, the interrupt's one line and 130 now."""
    from rich.console import Console
    import typer

    from campaigns.cli.tune import _study_errors

    console = Console(record=True, width=300)
    with pytest.raises(typer.Exit) as stopped, _study_errors(console, "sqlite:///study.db"):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise UnboundLocalError("cannot access local variable 'updated_state'")
    assert stopped.value.exit_code == 130
    assert console.export_text().startswith("interrupted: every finished trial is stored")


def test_a_bare_srun_launcher_becomes_the_scopes_srun(tmp_path: Path) -> None:
    """`launcher: [srun]` for a 3-node scope started 1 rank on 1 node (the run was then refused, below): it becomes
    the srun of the site's MPI plugin with the scope's nodes and ranks, and the partition's options outside an
    allocation. A launcher with arguments is used as given."""
    from campaigns.tuning.spec import TuningSpec
    from campaigns.tuning.workers import completed_launcher

    fields = {"site": "localslurm", "system": "localslurm:debug", "library": "openmpi", "op": "allreduce", "nodes": 3,
              "tasks_per_node": 1, "sizes": ["64K"], "executor": "launcher", "launcher": ["srun"],
              "db": f"sqlite:///{tmp_path / 'study.db'}"}
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump(fields))
    code, out = commcamp_output("tune", str(spec), "--dry-run", env={"SLURM_JOB_ID": ""})
    assert code == 0 and "launcher: srun --mpi=pmix -N 3 -n 3 --kill-on-bad-exit=1 --export=ALL --partition=debug" in out, out
    code, out = commcamp_output("tune", str(spec), "--dry-run", env={"SLURM_JOB_ID": "7"})
    assert code == 0 and "launcher: srun --mpi=pmix -N 3 -n 3 --kill-on-bad-exit=1 --export=ALL\n" in out, out
    # With the library's version given the dry run describes the study (no probe run): the launcher too.
    spec.write_text(yaml.safe_dump(fields | {"library_version": "4.1.4"}))
    code, out = commcamp_output("tune", str(spec), "--dry-run", env={"SLURM_JOB_ID": ""})
    assert code == 0 and "launcher: srun --mpi=pmix -N 3 -n 3 --kill-on-bad-exit=1 --export=ALL --partition=debug" in out, out
    given = TuningSpec.model_validate(fields | {"launcher": ["srun", "-N", "3"]})
    assert completed_launcher(given, False) == given
    path = completed_launcher(given.model_copy(update={"launcher": ["/opt/slurm/bin/srun"]}), True).launcher
    assert path == ["/opt/slurm/bin/srun", "--mpi=pmix", "-N", "3", "-n", "3", "--kill-on-bad-exit=1", "--export=ALL"]


def test_a_launcher_that_starts_another_job_than_the_scope_s_stops_the_tune(tmp_path: Path) -> None:
    """A 2-rank scope launched with `mpirun -np 1` (or, before completed_launcher, `srun` alone for a 3-node scope:
    1 rank on 1 node, seen on the local cluster) measured another job in every trial and finalization round, and
    published it under the scope; the first run now stops the tune, naming the remedy."""
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({
        "site": "local", "system": "local:cpu", "library": "openmpi", "op": "allreduce", "nodes": 1,
        "tasks_per_node": 2, "sizes": ["64K"], "iters": 3, "warmup": 1, "library_version": "4.1.4",
        "knobs": ["OMPI_MCA_btl_tcp_sndbuf"], "trials": 3, "executor": "launcher",
        "launcher": ["mpirun.openmpi", "-np", "1"], "db": f"sqlite:///{tmp_path / 'study.db'}",
        "publish_dir": str(tmp_path / "rec"), "runs_dir": str(tmp_path / "runs")}))
    for dry in (("--dry-run",), ()):  # what the launcher says it starts is checked before anything runs
        code, out = commcamp_output("tune", str(spec), *dry, env=OMPI_ENV)
        assert code == 2 and "launcher: mpirun.openmpi -np 1 starts 1 rank(s), the scope's job has 2 (nodes 1 x " \
            "tasks_per_node 2)" in " ".join(out.split()), out
        assert not (tmp_path / "runs").exists()
    # a wrapper says nothing of its ranks: the first run's records do
    data = yaml.safe_load(spec.read_text())
    launch = wrapper(tmp_path, 'exec mpirun.openmpi -np 1 "$@"', "launch.sh")
    spec.write_text(yaml.safe_dump({**data, "launcher": [str(launch)]}))
    code, out = commcamp_output("tune", str(spec), env=OMPI_ENV)
    assert code != 0 and "the launcher started 1 rank(s), the scope's job has 2 (nodes x tasks_per_node): give a " \
        "launcher that starts them (e.g. srun -N NODES -n 2, mpirun -np 2)" in " ".join(out.split()), out
    assert not (tmp_path / "rec").exists()
    # a library version given that is not the one commbench runs with: tuned and published for 4.1.5 before
    data = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**data, "launcher": ["mpirun.openmpi", "-np", "2"], "library_version": "4.1.5"}))
    code, out = commcamp_output("tune", str(spec), env=OMPI_ENV)
    assert code == 1 and "library_version 4.1.5: commbench's records name openmpi 4.1.4, the library it ran with; " \
        "give that version, or none (a probe run reads it)" in " ".join(out.split()), out
    assert not (tmp_path / "rec").exists()


@pytest.mark.parametrize(("launcher", "ranks"), [
    (["mpirun.openmpi", "--bind-to", "none", "-c", "3"], 3),  # Open MPI's -c: copies (mpirun -c 3 starts 3)
    (["/usr/bin/mpirun", "-c4"], 4), (["mpiexec.hydra", "-n", "2"], 2), (["mpirun", "--np=6"], 6),
    (["srun", "-c", "4", "-n", "2"], 2), (["srun", "--ntasks", "5"], 5),
    (["srun", "-c", "4"], None),  # srun's -c is CPUs per task: the allocation's tasks, unknown here
    (["./launch.sh", "-n", "2"], 2), (["./launch.sh", "-c", "2"], None)])
def test_launcher_ranks_reads_each_launcher_s_own_options(launcher: list[str], ranks: int | None) -> None:
    assert launcher_ranks(launcher) == ranks


def test_tune_publishes_and_recommend_never_extrapolates(tmp_path: Path) -> None:
    """The whole path on this machine (launcher executor, Open MPI over its TCP BTL so that the planted
    4 KiB socket buffers hurt), then the lookup of what was published."""
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({
        "site": "local", "system": "local:cpu", "library": "openmpi", "op": "allreduce", "nodes": 1,
        "tasks_per_node": 2, "sizes": ["64K", "1M"], "sizes_per_bucket": 1, "iters": 5, "warmup": 1,
        "knobs": ["OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf"], "knob_overrides": [str(PLANTED)],
        "trials": 3, "executor": "launcher", "launcher": MPIRUN, "db": f"sqlite:///{tmp_path / 'study.db'}",
        "finalize": {"candidates": 1, "alpha": 0.05, "rounds": 10}, "per_size": {"enabled": True, "top": 1, "rounds": 4},
        "publish_dir": str(tmp_path / "rec"),
        "runs_dir": str(tmp_path / "runs")}))
    env = {**OMPI_ENV, "OMPI_MCA_btl": "self,tcp"}
    code, out = commcamp_output("tune", str(spec), "--dry-run", env=env)
    assert code == 0, out
    assert "knobs asked for: OMPI_MCA_btl_tcp_sndbuf, OMPI_MCA_btl_tcp_rcvbuf" in out
    assert not (tmp_path / "study.db").exists() or "trials:" not in out
    code, out = commcamp_output("tune", str(spec), env=env)
    assert code == 0, out
    assert "trials: 3 counted" in out and "decision: " in out
    # Off a terminal (cron, sbatch, this pipe) progress comes as lines: one per counted trial, the
    # finalization's plan, then how far it is (issue 11 item 9: ~70 s used to pass without a line).
    assert re.search(r"^trials: 1 of 3 counted, \d+ s;", out, re.MULTILINE), out
    assert re.search(r"^finalization: \d+ candidate\(s\) and the defaults re-measured interleaved, at most \d+ runs",
                     out, re.MULTILINE) or "keep the defaults" in out, out
    published = yaml.safe_load((tmp_path / "rec" / "local" / "local" / "recommendations.yaml").read_text())
    (rec,) = published["recommendations"]
    assert rec["scope"]["nodes"] == 1 and rec["evidence"]["trials_counted"] == 3
    # The per-size stage swept every allreduce algorithm in one run under the recommended environment; 4
    # rounds keep this test short (2 confirmation rounds: no change possible, tests/test_per_size.py decides).
    per_size = rec["per_size_selection"]
    assert per_size["rounds"] == 4 and [s["bytes"] for s in per_size["sizes"]] == [65536, 1 << 20]
    assert all(s["winner"] is None for s in per_size["sizes"])
    # The lookup names the measured scope; another node count is refused, not extrapolated.
    code, out = commcamp_output("recommend", "--site", "local", "--system", "local", "--op", "allreduce",
                                "--nodes", "1", "--size", "1M", "--root", str(tmp_path / "rec"))
    assert code == 0, out
    assert "# measured scope: site=local system=local:cpu library=openmpi" in out and "bucket [65537, 1048576] B" in out
    assert "per-size selection for 1048576 B: " in out
    assert commcamp_output("recommend", "--site", "local", "--system", "local:cpu", "--op", "allreduce", "--nodes",
                           "1", "--size", "1M", "--root", str(tmp_path / "rec")) == (code, out)  # tune's form
    code, out = commcamp_output("recommend", "--site", "local", "--system", "local:cpu", "--partition", "gpu",
                                "--op", "allreduce", "--nodes", "1", "--root", str(tmp_path / "rec"))
    assert code == 2 and "name two partitions" in out
    code, out = commcamp_output("recommend", "--site", "local", "--system", "local", "--op", "allreduce",
                                "--nodes", "8", "--root", str(tmp_path / "rec"))
    assert code == 3
    assert "# NOT MEASURED: not measured for 8 nodes" in out and "export" not in out


def test_bad_specs_are_refused_with_the_reason(tmp_path: Path) -> None:
    code, out = commcamp_output("tune", "--site", "local", "--system", "nosuch", "--library", "openmpi", "--op",
                                "allreduce", "--sizes", "1M")
    assert code == 2 and "must be system:partition" in out
    # A system of one partition names it, as in `recommend --system`.
    code, out = commcamp_output("tune", "--site", "local", "--system", "local", "--library", "openmpi", "--op",
                                "allreduce", "--sizes", "1M", "--dry-run", "--db", f"sqlite:///{tmp_path}/x.db")
    assert code == 0 and "system=local:cpu" in out, out
    code, out = commcamp_output("tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--op",
                                "allreduce", "--sizes", "1M", "--knobs", "NCCL_NVLS_ENABLE", "--library-version",
                                "4.1.4", "--executor", "launcher", "--launcher", "mpirun", "--db",
                                f"sqlite:///{tmp_path}/x.db")
    assert code == 2 and "NCCL_NVLS_ENABLE cannot be searched" in out
    code, out = commcamp_output("tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--op",
                                "allreduce", "--sizes", "1M", "--workers", "2", "--db", f"sqlite:///{tmp_path}/x.db")
    assert code == 2 and "parallel workers need PostgreSQL" in out
    code, out = commcamp_output("pretune", "--budget", "1m", "--env-file", str(tmp_path / "x.env"), "--site", "local",
                                env={"SLURM_JOB_ID": ""})
    assert code == 2 and "inside a Slurm allocation" in out
    for name, value in (("SLURM_JOB_NUM_NODES", "abc"), ("SLURM_NTASKS", "0")):  # was a ValueError traceback
        code, out = commcamp_output("pretune", "--budget", "1m", "--env-file", str(tmp_path / "x.env"), "--site",
                                    "local", env={"SLURM_JOB_ID": "1", name: value})
        assert code == 2 and f"{name}='{value}' is not a positive whole number" in out, out
        assert len(out.strip().splitlines()) == 1 and not (tmp_path / "x.env").exists()
    # 3 tasks on 2 nodes: a scope of 2 x 1 was tuned (1 on 2 nodes: srun -N 2 -n 2, beyond the allocation)
    for tasks, layout in (("3", "2,1"), ("1", "1,0"), ("4", "3,1")):  # the last: a multiple, not the same per node
        code, out = commcamp_output("pretune", "--budget", "1m", "--env-file", str(tmp_path / "x.env"), "--site",
                                    "local", env={"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": tasks,
                                                  "SLURM_TASKS_PER_NODE": layout})
        assert code == 2 and (f"SLURM_NTASKS={tasks} on 2 nodes (SLURM_TASKS_PER_NODE={layout}): pretune tunes the "
                              "same tasks on every node") in out, out
    # without -n, Slurm's tasks per node count CPUs (16,8): pretune runs one task per node, no refusal
    code, out = commcamp_output("pretune", "--budget", "1m", "--env-file", str(tmp_path / "x.env"), "--site", "local",
                                env={"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "",
                                     "SLURM_TASKS_PER_NODE": "16,8"})
    assert code == 2 and "SLURM_NTASKS" not in out and "invalid tuning spec" in out, out
    # the summary would overwrite the env file the job sources
    code, out = commcamp_output("pretune", "--budget", "1m", "--env-file", str(tmp_path / "x.env"), "--summary",
                                str(tmp_path / "x.env"), "--site", "local", "--system", "local", "--library", "openmpi",
                                "--op", "allreduce", "--sizes", "1M", env={"SLURM_JOB_ID": "1"})
    assert code == 2 and f"--env-file and --summary name the same file {tmp_path / 'x.env'}" in out, out
    assert not (tmp_path / "x.env").exists()
    assert sys.executable  # the CLI ran in-process


SPEC_BASE = """site: local
system: local:cpu
library: openmpi
op: allreduce
sizes: [1M]
"""


@pytest.mark.parametrize(("extra", "problem"), [
    ("nodes: yes\n", "{spec}:6: nodes: expected a number, not true"),  # was 1 node
    ("trials: true\n", "{spec}:6: trials: expected a number, not true"),  # was 1 trial
    ("per_size: {stop_slower: yes}\n", "{spec}:6: per_size.stop_slower: expected a number, not true"),  # was 1.0
    ("knobs: []\n", "{spec}:6: knobs: an empty list searches no knob"),  # the dry run said "every catalog knob"
    ("trials: '5'\n", "{spec}:6: trials: expected a number, not the string '5'"),  # was 5, silently
    ("finalize: {candidates: 3, max_candidates: 1}\n", "{spec}:6: finalize: max_candidates (1) is below "
     "candidates (3)"),  # the cap cut the k best, unsaid
    ("finalize: {min_effect: 5}\n", "{spec}:6: finalize.min_effect: Input should be less than or equal to 1"),
    ("knobs: [OMPI_MCA_btl_tcp_sndbuf, OMPI_MCA_btl_tcp_sndbuf]\n", "{spec}:6: knobs: OMPI_MCA_btl_tcp_sndbuf named "
     "twice"),  # was found after the probe run
    ("unverifiable_knobs: [OMPI_MCA_btl_tcp_sndbuff]\n", "{spec}:6: unverifiable_knobs: OMPI_MCA_btl_tcp_sndbuff not in the "
     "knob catalog"),  # a typo left the knob meant under the read-log check
    ("executor: launcher\nlauncher: [no-such-launcher, -np, '2']\n", "{spec}:7: launcher: 'no-such-launcher' is not an "
     "executable program here"),  # the dry run printed it; a run probed, then failed every trial
    ("plugin_library: /no/such/libnccl-tuner.so\n", "{spec}:6: plugin_library: /no/such/libnccl-tuner.so does not exist"),
    ("knobs: [OMPI_MCA_btl_tcp_sndbuff]\n", "{spec}:6: knobs: OMPI_MCA_btl_tcp_sndbuff is not in the knob catalog"),
    ("knob_overrides: [no-such-dir/knobs.yaml]\n", "{spec}:6: knob_overrides: "),  # named the file alone
    ("", "{spec}:1: site: unknown site 'mars'"),  # SPEC_BASE's site replaced below
    ("knob_overrides: [{tmp}/comments.yaml]\n", "{tmp}/comments.yaml: the knob override file is empty"),
    ("knob_overrides: [{tmp}/empty.yaml]\n", "{tmp}/empty.yaml: the knob override file is empty"),
    ("knob_overrides: [{tmp}/typo.yaml]\n", "{tmp}/typo.yaml:2: knobs.defaults.OMPI_MCA_btl_tcp_sndbuff: not in "
     "the catalog"),
    ("knob_overrides: [{tmp}/yes.yaml]\n", "{tmp}/yes.yaml:2: knobs.defaults.OMPI_MCA_btl_tcp_sndbuf: YAML's true "
     "(true/yes/on, false/no/off) is no pow2 value"),  # read as 1 (NCCL_MAX_CTAS: yes ran 1 CTA)
])
def test_a_spec_s_mistakes_are_refused_before_anything_runs(tmp_path: Path, extra: str, problem: str) -> None:
    """Exit 2 with the file and line where the spec has them, in the dry run as in a run, before the probe run
    (nothing written: no run directory, no study database)."""
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "comments.yaml").write_text("# pins to come\n")
    (tmp_path / "typo.yaml").write_text("defaults:\n  OMPI_MCA_btl_tcp_sndbuff: 4096\n")
    (tmp_path / "yes.yaml").write_text("defaults:\n  OMPI_MCA_btl_tcp_sndbuf: yes\n")
    spec = tmp_path / "spec.yaml"
    base = SPEC_BASE if extra else SPEC_BASE.replace("site: local", "site: mars")
    spec.write_text(base + extra.replace("{tmp}", str(tmp_path)))
    where = ("--db", f"sqlite:///{tmp_path / 'study.db'}", "--runs-dir", tmp_path / "runs", "--library-version",
             "4.1.4")
    for dry in (("--dry-run",), ()):
        code, out = commcamp_output("tune", spec, *where, *dry)
        assert code == 2 and problem.format(spec=spec, tmp=tmp_path) in out, (dry, out)
        assert "Traceback" not in out and not (tmp_path / "runs").exists() and not (tmp_path / "study.db").exists()
    if extra == "knobs: [OMPI_MCA_btl_tcp_sndbuff]\n":  # an option given with the file is no line of it
        code, out = commcamp_output("tune", spec, *where, "--knobs", "OMPI_MCA_btl_tcp_sndbuff")
        assert code == 2 and out.startswith("knobs: OMPI_MCA_btl_tcp_sndbuff is not in the knob catalog"), out


def test_a_size_given_twice_is_refused() -> None:
    """`sizes: [4096, 4K]` measured one size, silently: a campaign spec refuses repeated sizes, and so does a tune."""
    from campaigns.tuning.spec import TuningSpec

    with pytest.raises(ValueError, match=r"repeated sizes \[4096\] \(64K and 65536 are one size\)"):
        TuningSpec(site="local", system="local:cpu", library="openmpi", op="allreduce", sizes=[4096, "4K"])


def test_a_launcher_that_does_not_run_here_is_not_looked_up_here(tmp_path: Path) -> None:
    """`tune --workers N` with the library version given runs the spec's launcher nowhere here (the workers use
    srun, no probe runs): a launcher that only the compute nodes have is not refused on the login node."""
    from campaigns.tuning.session import check_spec
    from campaigns.tuning.spec import TuningSpec

    spec = TuningSpec(site="local", system="local:cpu", library="openmpi", library_version="4.1.4", op="allreduce",
                      sizes=["1M"], executor="launcher", launcher=["no-such-mpirun", "-np", "2"], commbench=COMMBENCH,
                      db=f"sqlite:///{tmp_path / 'study.db'}", runs_dir=tmp_path / "runs")
    with pytest.raises(ValueError, match="launcher: 'no-such-mpirun' is not an executable program here"):
        check_spec(spec)
    check_spec(spec, launcher_runs_here=False)


def test_a_broken_published_file_stops_the_tune_before_its_trials(tmp_path: Path) -> None:
    """Publishing reads the site's recommendations.yaml: a broken one failed the tune after every trial and the
    finalization (exit 2, 'nothing ran', no decision printed). The check before any trial names it."""
    from campaigns.tuning.session import check_spec
    from campaigns.tuning.spec import TuningSpec

    published = tmp_path / "rec" / "local" / "local" / "recommendations.yaml"
    published.parent.mkdir(parents=True)
    published.write_text("schema_version: 1\nrecommendations:\n  - decision: maybe\n")
    spec = TuningSpec(site="local", system="local:cpu", library="openmpi", library_version="4.1.4", op="allreduce",
                      sizes=["1M"], executor="launcher", launcher=["mpirun.openmpi", "-np", "2"], commbench=COMMBENCH,
                      db=f"sqlite:///{tmp_path / 'study.db'}", runs_dir=tmp_path / "runs", publish_dir=tmp_path / "rec")
    with pytest.raises(ValueError, match=f"{published}:1: not a valid recommendations file: site: required field"):
        check_spec(spec)
    check_spec(spec.model_copy(update={"publish_dir": None}))


def test_help_and_messages_name_what_the_user_typed(tmp_path: Path) -> None:
    """--budget 0 and an empty SQLite URL are named as given (not budget_s, not '.'); help texts show their
    defaults (not swallowed as rich markup) and say what pretune does: a study of its own, no publishing
    unless asked."""
    code, out = commcamp_output("pretune", "--budget", "0", "--env-file", str(tmp_path / "x.env"), "--site", "local",
                                env={"SLURM_JOB_ID": "1"})
    assert code == 2 and "--budget: '0' must be more than 0 s" in out and "budget_s" not in out, out
    code, out = commcamp_output("tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--op",
                                "allreduce", "--sizes", "1M", "--dry-run", "--db", "sqlite:///")
    assert code == 2 and "--db: sqlite:/// is an in-memory SQLite database" in out, out
    assert "recommendations root [default: <workspace>/recommendations]" in commcamp_output("recommend", "--help")[1]
    assert "[default: <workspace builds>/bench/cpu-LIBRARY/commbench" in commcamp_output("knobs", "check", "--help")[1]
    pretune_help = commcamp_output("pretune", "--help")[1]
    assert "trial budget of this pretune's own study (a new one each run)" in pretune_help
    assert "also publish to this recommendations root (default: only the env file)" in pretune_help
    assert "workers/restarts" not in pretune_help and "(<workspace>/recommendations)" not in pretune_help


def test_finalization_says_how_far_it_is_at_most_every_interval() -> None:
    from campaigns.tuning.session import _FinalizationLog

    lines: list[str] = []
    quiet = _FinalizationLog(3, lines.append, every_s=3600.0)
    for _ in range(3):
        quiet.run_done()
    assert lines == ["finalization: 3 of 3 planned runs, 0 s"]  # the interval never passed: the end only
    lines.clear()
    chatty = _FinalizationLog(3, lines.append, every_s=0.0)
    for _ in range(3):
        chatty.run_done()
    assert [line.split(",")[0] for line in lines] == [f"finalization: {n} of 3 planned runs" for n in (1, 2, 3)]


def test_pretune_checks_its_outputs_before_any_run(tmp_path: Path) -> None:
    """An env file or summary that cannot be written stops pretune before its budget is spent; no directory
    is made for the env file."""
    env = allocation(tmp_path, "exit 1")
    where = ("--db", f"sqlite:///{tmp_path / 'study.db'}", "--runs-dir", tmp_path / "runs", "--budget", "20s")
    missing = tmp_path / "nodir" / "tuned.env"
    code, out = commcamp_output(*PRETUNE, *where, "--env-file", missing, env=env)
    assert code == 2 and f"--env-file {missing}: directory {missing.parent} does not exist" in out, out
    code, out = commcamp_output(*PRETUNE, *where, "--env-file", tmp_path / "tuned.env", "--summary", "/proc/x/s.json",
                                env=env)
    assert code == 2 and "--summary /proc/x/s.json: directory /proc/x does not exist" in out, out
    assert not missing.parent.exists() and not (tmp_path / "runs").exists() and not (tmp_path / "tuned.env").exists()


def test_a_short_budget_lowers_the_rounds_before_it_gives_up() -> None:
    """Finalization within a budget of runs: fewer candidates first; then one with a lower sequential maximum
    (40 -> the fewest rounds that can give a change: 7 + 2 at alpha 0.01 with one test); below that, none. A
    user's 30 s pretune that 12 s finished had been refused: the plan assumed the 40-round worst case."""
    t = Thresholds()
    full = planned_runs(t, 1, 1, 2)
    assert fit_budget(t, 3, 1, 2, None) == (3, t) and fit_budget(t, 3, 1, 2, full) == (1, t)
    assert fit_budget(t, 3, 1, 2, planned_runs(t, 2, 1, 2)) == (2, t)
    keep, lowered = fit_budget(t, 3, 1, 2, full - 1)
    assert keep == 1 and lowered.rounds == 39
    fewest = planned_runs(replace(t, rounds=9), 1, 1, 2)
    assert fit_budget(t, 3, 1, 2, fewest) == (1, replace(t, rounds=9)) and fewest < full
    assert fit_budget(t, 3, 1, 2, fewest - 1) == (0, t) and fit_budget(t, 0, 1, 2, 5) == (0, t)


def test_a_tune_whose_baseline_never_ran_publishes_nothing(tmp_path: Path) -> None:
    """No trial completed, or the baseline failed in every finalization round: no decision was tested, so
    nothing is published (what the publish directory held stays byte for byte) and the tune exits 1."""
    rec = tmp_path / "rec"
    (rec / "local" / "local").mkdir(parents=True)
    (rec / "local" / "local" / "recommendations.yaml").write_text(  # as an earlier tune of other scopes left it
        "schema_version: 1\nsite: local\nsystem: local\nrecommendations: []\n")
    before = {path: path.read_bytes() for path in rec.rglob("*") if path.is_file()}
    common = ("tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--library-version", "4.1.4",
              "--op", "allreduce", "--sizes", "64K", "--executor", "launcher", "--commbench", COMMBENCH,
              "--db", f"sqlite:///{tmp_path / 'study.db'}", "--runs-dir", tmp_path / "runs", "--publish-dir", rec)
    failing = wrapper(tmp_path, "exit 1", "failing")  # every launch fails (a launcher not found is refused at once)
    code, out = commcamp_output(*common, "--trials", "2", "--launcher", f"{failing} -np 2")
    assert code == 1 and f"no trial completed (see the trials' fail_reason): nothing published (what {rec} holds " \
                         "is unchanged)" in out, out
    assert "finalization:" not in out and "decision:" not in out  # no round ran, no decision printed
    # The planted defaults (the baseline) fail in every launch, the trial's too; other settings run.
    launcher = wrapper(tmp_path, '[ "$OMPI_MCA_btl_tcp_sndbuf.$OMPI_MCA_btl_tcp_rcvbuf" = 4096.4096 ] && exit 3\n'
                                 f'exec {" ".join(MPIRUN)} "$@"', "launcher")
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({"knobs": ["OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf"],
                                    "knob_overrides": [str(PLANTED)], "iters": 5, "warmup": 1,
                                    "finalize": {"candidates": 1, "max_candidates": 1, "rounds": 5},
                                    "site": "local", "system": "local:cpu", "library": "openmpi", "op": "allreduce",
                                    "sizes": ["64K"]}))
    code, out = commcamp_output(*common, str(spec), "--trials", "3", "--launcher", str(launcher), "--study", "b")
    assert code == 1 and re.search(r"the baseline \(the site's defaults\) failed in all \d+ finalization rounds: no "
                                   r"candidate was compared with it: nothing published", out), out
    assert {path: path.read_bytes() for path in rec.rglob("*") if path.is_file()} == before


def test_a_per_size_stage_that_fails_after_the_trials_is_a_failed_tune_and_publishes_nothing(tmp_path: Path) -> None:
    """The trials and finalization ran, then the per-size sweep's records were unusable (here the library's
    own choice gave wrong data at every size: commbench marks it valid=false and exits 1, so no size has a
    baseline). That is a failed step after measurements, exit 1, not bad input (exit 2, "nothing ran"), and
    what an earlier tune of the same scope published stays byte for byte."""
    rec = tmp_path / "rec"
    common = ("tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--library-version", "4.1.4",
              "--op", "allreduce", "--sizes", "64K", "--executor", "launcher", "--commbench", COMMBENCH,
              "--db", f"sqlite:///{tmp_path / 'study.db'}", "--runs-dir", tmp_path / "runs", "--publish-dir", rec,
              "--knobs", "OMPI_MCA_btl_tcp_sndbuf")
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({"site": "local", "system": "local:cpu", "library": "openmpi", "op": "allreduce",
                                    "sizes": ["64K"], "iters": 3, "warmup": 1,
                                    "finalize": {"candidates": 1, "max_candidates": 1, "rounds": 5}}))
    code, out = commcamp_output(*common, str(spec), "--trials", "2", "--launcher", " ".join(MPIRUN), env=OMPI_ENV)
    assert code == 0 and "published: " in out, out
    before = {path: path.read_bytes() for path in rec.rglob("*") if path.is_file()}
    (tmp_path / "mark.py").write_text(
        "import json, sys\n"
        "path = sys.argv[sys.argv.index('--output') + 1]\n"
        "records = [json.loads(line) for line in open(path)]\n"
        "for r in records:\n"
        "    if r.get('selection', {}).get('name') == 'own': r['valid'] = False\n"
        "open(path, 'w').write(''.join(json.dumps(r) + '\\n' for r in records))\n")
    launcher = wrapper(tmp_path, f'{" ".join(MPIRUN)} "$@" || exit $?\n'
                                 f'case " $* " in *" --selections "*) {sys.executable} {tmp_path / "mark.py"} "$@"; '
                                 'exit 1;; esac', "launcher")
    spec.write_text(yaml.safe_dump({**yaml.safe_load(spec.read_text()), "per_size": {"enabled": True, "rounds": 4}}))
    code, out = commcamp_output(*common, str(spec), "--trials", "2", "--launcher", str(launcher),
                                "--summary", tmp_path / "summary.json", env=OMPI_ENV)
    assert code == 1, out
    assert "trials: 2 counted" in out and "decision: " in out, out  # what was measured is reported
    assert re.search(r"the per-size stage failed after the trials and finalization: size 65536: no valid "
                     rf"measurement of the library's own choice \('own'\): nothing published \(what {rec} holds "
                     r"is unchanged\)", out), out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["per_size_failed"].endswith("no valid measurement of the library's own choice ('own')")
    assert summary["files"] is None and summary["recommendation"]["per_size_selection"] is None
    assert {path: path.read_bytes() for path in rec.rglob("*") if path.is_file()} == before


def test_the_site_defaults_of_knobs_not_searched_run_in_every_launch(tmp_path: Path) -> None:
    """A tune of one knob keeps the site's defaults of the others, as the site's jobs run (Alps' may-corrupt
    NCCL_PROTO=^LL128 pin in a tune of NCCL_BUFFSIZE alone): here the planted 4 KiB receive buffer while only
    the send buffer is searched. Without it every launch ran with the library's receive buffer."""
    seen = tmp_path / "seen"
    launcher = wrapper(tmp_path, f'echo "${{OMPI_MCA_btl_tcp_rcvbuf-unset}}" >> {seen}\nexec {" ".join(MPIRUN)} "$@"',
                       "launcher")
    spec = tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({"knobs": ["OMPI_MCA_btl_tcp_sndbuf"], "knob_overrides": [str(PLANTED)],
                                    "iters": 3, "warmup": 1, "finalize": {"candidates": 1, "rounds": 5},
                                    "site": "local", "system": "local:cpu", "library": "openmpi", "op": "allreduce",
                                    "sizes": ["64K"]}))
    code, out = commcamp_output("tune", str(spec), "--library-version", "4.1.4", "--executor", "launcher",
                                "--commbench", COMMBENCH, "--launcher", str(launcher), "--trials", "2",
                                "--db", f"sqlite:///{tmp_path / 'study.db'}", "--runs-dir", tmp_path / "runs",
                                "--publish-dir", tmp_path / "rec", env={**OMPI_ENV, "OMPI_MCA_btl": "self,tcp"})
    assert code == 0, out
    launches = seen.read_text().split()
    assert len(launches) >= 2 and set(launches) == {"4096"}, launches
    # The .env unsets what every launch ran without, never the site's default that ran in all of them (the first
    # version unset Alps' NCCL_PROTO=^LL128 pin in a tune of NCCL_BUFFSIZE alone); pretune's file says the same.
    (env_file,) = (tmp_path / "rec").rglob("*.env")
    text = env_file.read_text()
    assert "unset OMPI_MCA_coll_tuned_allreduce_algorithm" in text and "OMPI_MCA_btl_tcp_rcvbuf" not in text, text
    # Every trial ran over the TCP BTL this environment chose (no knob): said where the tune starts and in what it
    # publishes (the files said nothing, and a job without it runs over shared memory, where the buffers do nothing)
    assert "inherited from this environment, in every trial (no knob; said in the published files): " \
           "OMPI_MCA_btl=self,tcp" in out, out
    assert "# measured with OMPI_MCA_btl=self,tcp from the tune's environment in every trial" in text, text
    code, out = commcamp_output("recommend", "--site", "local", "--system", "local:cpu", "--op", "allreduce", "--nodes",
                                "1", "--root", tmp_path / "rec")
    assert code == 0, out
    assert "\n# measured with OMPI_MCA_btl=self,tcp from the tune's environment in every trial" in out, out


def test_library_settings_inherited_from_the_caller_are_named_and_name_the_study(catalog: KnobCatalog) -> None:
    """The tuned library's (and its layers') variables that are no knob stay in every trial: they are named, and a
    tune under others is another study (the same study resumed, mixing trials of two environments)."""
    from campaigns.tuning.executors import inherited_settings
    from campaigns.tuning.session import study_name
    from campaigns.tuning.spec import TuningSpec

    environ = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_sndbuf": "4096", "OMPI_ALLOW_RUN_AS_ROOT": "1",
               "UCX_NET_DEVICES": "lo", "NCCL_SOCKET_IFNAME": "lo", "PATH": "/usr/bin",
               "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    stripped = strip_knobs(environ, catalog, Library.OPENMPI)
    assert inherited_settings(stripped, catalog, Library.OPENMPI, {"OMPI_MCA_rmaps_base_oversubscribe": "1"}) == {
        "OMPI_MCA_btl": "self,tcp", "UCX_NET_DEVICES": "lo"}  # the site's own setting is its setup, not inherited
    assert inherited_settings(strip_knobs(environ, catalog, Library.NCCL), catalog, Library.NCCL, {}) == {
        "NCCL_SOCKET_IFNAME": "lo"}
    with pytest.raises(ValueError, match=r"OMPI_MCA_btl \(in this environment, in every trial\): value 'tcp\\nrm -rf'"):
        inherited_settings({"OMPI_MCA_btl": "tcp\nrm -rf"}, catalog, Library.OPENMPI, {})
    spec = TuningSpec(site="local", system="local:cpu", library="openmpi", op="allreduce", sizes=["64K"],
                      knobs=["OMPI_MCA_btl_tcp_sndbuf"])
    scope = make_scope(library="openmpi", library_version="4.1.4", transport="mpi", gpus_per_node=1)
    space = build_space(catalog, {Library.OPENMPI: "4.1.4"}, knobs=["OMPI_MCA_btl_tcp_sndbuf"])
    names = {study_name(spec, scope, [], space, inherited) for inherited in (
        {}, {"OMPI_MCA_btl": "self,tcp"}, {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"})}
    assert len(names) == 3
    # another commbench binary (an MPICH build given to an Open MPI tune) resumed the study and mixed its trials
    launched = spec.model_copy(update={"executor": "launcher", "launcher": ["mpirun.openmpi", "-np", "2"]})
    assert len({study_name(launched.model_copy(update={"commbench": Path(binary)}), scope, [], space, {})
                for binary in ("/opt/a/commbench", "/opt/b/commbench")}) == 2


def test_a_catalog_whose_domains_changed_gets_a_study_of_its_own() -> None:
    """Optuna cannot resume a study whose domain changed ("CategoricalDistribution does not support dynamic
    value space" at the first trial): a commcamp upgrade that changes a knob's choices, with the same knob
    names, must not reach the stored study. Its name's digest covers the searched domains."""
    from campaigns.tuning.session import study_name
    from campaigns.tuning.spec import TuningSpec

    spec = TuningSpec(site="local", system="local:cpu", library="nccl", op="allreduce", sizes=["64K"],
                      knobs=["NCCL_ALGO"])
    scope = make_scope(library="nccl", library_version="2.28.3")
    catalog = KnobCatalog.load()
    narrowed = catalog.for_site({"restrict": {"NCCL_ALGO": {"choices": ["Ring", "Tree"]}}}, "older catalog")
    names = [study_name(spec, scope, [], build_space(c, {Library.NCCL: "2.28.3"}, knobs=["NCCL_ALGO"]), {})
             for c in (catalog, narrowed, catalog)]
    assert names[0] == names[2] != names[1]


def test_another_rank_layout_or_size_set_gets_a_study_of_its_own() -> None:
    """A study's trials are comparable only if they measure the same thing. The scope names nodes and GPUs per node,
    not ranks per node (1 GPU per node on a CPU partition, whatever tasks_per_node), and the stored study checks the
    buckets' ranges, not their sizes: before, a tune with 4 ranks per node resumed the 2-rank study (its budget
    spent, its measurements taken as repeats), and sizes 8, 64, 1K shared the study of 8, 1K; so did batch 8 (a
    throughput where batch 1 measured a latency), other iterations, warm-up or environment."""
    from campaigns.tuning.session import study_name
    from campaigns.tuning.spec import TuningSpec

    scope = make_scope(library="openmpi", library_version="4.1.4", transport="mpi", gpus_per_node=1)
    space = build_space(KnobCatalog.load(), {Library.OPENMPI: "4.1.4"}, knobs=["OMPI_MCA_btl_tcp_sndbuf"])
    base = TuningSpec(site="local", system="local:cpu", library="openmpi", op="allreduce", sizes=[8, 1024],
                      sizes_per_bucket=3, knobs=["OMPI_MCA_btl_tcp_sndbuf"])
    measurements = [{"tasks_per_node": 4}, {"sizes": [8, 64, 1024]}, {"batch": 8}, {"iters": 200},
                    {"warmup": 20}, {"sizes_per_bucket": 1}]
    specs = [base, *(base.model_copy(update=change) for change in measurements),
             base.model_copy(update={"sizes": [1024, 8], "trials": 50})]
    ranges = [[(b.name, b.min_bytes, b.max_bytes) for b in buckets_for_sizes(spec.sizes, 3)] for spec in specs[:3]]
    assert ranges[0] == ranges[2]  # what the stored study checks
    names = [study_name(spec, scope, [], space, {}) for spec in specs]
    assert len(set(names[:-1])) == len(measurements) + 1 and names[-1] == names[0]
    # another environment (a UCX tune under Open MPI or MPICH; an MPI's own tune runs in its MPI's only)
    ucx = base.model_copy(update={"library": "ucx"})
    assert len({study_name(ucx.model_copy(update={"environ": environ}), scope, [], space, {})
                for environ in ("openmpi", "mpich")}) == 2


def test_another_launch_gets_a_study_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's own options and the site's setup of the partition and environment change what a run
    measures (`--mca btl self,tcp` or a site's new UCX_TLS: another path): before, the study was named by the
    launcher's program alone and site.yaml only where it had `knobs:`, and such trials joined the earlier study
    (TCP beside shared-memory times, the best one the other path's). srun's options as completed_launcher makes
    them from the scope and the site (outside and inside an allocation alike) name no other study; a user's own
    (--cpu-bind=none) do."""
    from fixtures_sites import site_data, write_site

    from campaigns.tuning.session import study_name
    from campaigns.tuning.spec import TuningSpec
    from campaigns.tuning.workers import slurm_launcher

    def env_vars(extra: dict[str, str]) -> Callable[[dict[str, Any]], None]:
        def edit(data: dict[str, Any]) -> None:
            data["name"] = "mysite"
            data["environments"][0]["env_vars"].update(extra)
        return edit

    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(tmp_path / "sites"))
    write_site(tmp_path / "sites" / "mysite", site_data("local", env_vars({})))
    scope = make_scope(site="mysite", library="openmpi", library_version="4.1.4", transport="mpi", gpus_per_node=1)
    space = build_space(KnobCatalog.load(), {Library.OPENMPI: "4.1.4"}, knobs=["OMPI_MCA_btl_tcp_sndbuf"])
    base = TuningSpec(site="mysite", system="local:cpu", library="openmpi", op="allreduce", sizes=[1024],
                      knobs=["OMPI_MCA_btl_tcp_sndbuf"], executor="launcher", launcher=["mpirun.openmpi", "-np", "2"])
    srun = base.model_copy(update={"launcher": ["srun"]})
    names = [study_name(spec, scope, [], space, {}) for spec in (
        base, base.model_copy(update={"launcher": ["mpirun.openmpi", "-np", "2", "--mca", "btl", "self,tcp"]}),
        srun, *(srun.model_copy(update={"launcher": slurm_launcher(srun, inside)}) for inside in (True, False)),
        srun.model_copy(update={"launcher": [*slurm_launcher(srun, True), "--cpu-bind=none"]}))]
    assert len(set(names[:2])) == 2 and names[2] == names[3] == names[4] != names[5]
    shutil.rmtree(tmp_path / "sites" / "mysite")
    write_site(tmp_path / "sites" / "mysite", site_data("local", env_vars({"OMPI_MCA_btl": "self,tcp"})))
    assert study_name(base, scope, [], space, {}) not in names


def test_the_per_size_sweep_is_validated_and_a_selection_with_wrong_data_is_never_chosen(tmp_path: Path) -> None:
    """A per-size rule forces an algorithm (for NCCL a protocol) over a range of sizes: the sweep runs with
    commbench's data check, and a selection whose data was wrong (commbench exits 1, its records say
    valid=false) is left out, not the stage failed. The launcher below marks every forced selection so, as
    commbench does for one that corrupts data: no size then has a candidate."""
    from types import SimpleNamespace

    from campaigns.tuning.session import per_size_sweep, prepare
    from campaigns.tuning.spec import TuningSpec

    marks = ("import json, sys\n"
             "path = sys.argv[sys.argv.index('--output') + 1]\n"
             "records = [json.loads(line) for line in open(path)]\n"
             "for r in records:\n"
             "    if r.get('selection', {}).get('name', 'own') != 'own': r['valid'] = False\n"
             "open(path, 'w').write(''.join(json.dumps(r) + '\\n' for r in records))\n")
    (tmp_path / "mark.py").write_text(marks)
    launcher = wrapper(tmp_path, f'echo "$@" > {tmp_path / "args"}\n{" ".join(MPIRUN)} "$@" || exit $?\n'
                                 f'{sys.executable} {tmp_path / "mark.py"} "$@"\nexit 1', "launcher")
    spec = TuningSpec(site="local", system="local:cpu", library="openmpi", library_version="4.1.4", op="allreduce",
                      sizes=["4K", "64K"], sizes_per_bucket=1, iters=2, warmup=1, executor="launcher",
                      launcher=[str(launcher)], commbench=COMMBENCH, per_size={"enabled": True, "rounds": 4},
                      db=f"sqlite:///{tmp_path / 'study.db'}", runs_dir=tmp_path / "runs", publish_dir=None)
    setup = prepare(spec, environ={**os.environ, **OMPI_ENV}, ingest=False)
    result, _ = per_size_sweep(setup, SimpleNamespace(env={}))  # the stage reads only the recommended env
    args = (tmp_path / "args").read_text().split()
    assert "--check" in args and "--stop-slower" not in args  # 4 rounds: too few for the stop rule to judge
    assert [size.candidates for size in result.sizes] == [[], []]


def test_the_sweeps_stop_rule_is_checked_and_reaches_commbench() -> None:
    """per_size.stop_slower / stop_after become commbench's --stop-slower / --stop-after (0: no stopping); a factor
    below 1 would stop selections faster than the library's choice, and fewer than 3 rounds leave no round for a
    stall of own's: both refused, naming the setting."""
    from pydantic import ValidationError

    from campaigns.tuning.spec import PerSizeSpec

    request = BenchRequest(op="allreduce", transport="mpi", sizes=(8,), selection_rounds=32)
    assert replace(request, stop_slower=1.5, stop_after=6).selection_args() == [
        "--selections", "all", "--rounds", "32", "--stop-slower", "1.5", "--stop-after", "6"]
    assert replace(request, stop_slower=2.0000001).selection_args()[5] == "2.0000001"  # not rounded to 2
    assert request.selection_args() == ["--selections", "all", "--rounds", "32"]
    # commbench refuses a rule it cannot reach (fewer than 2 x stop_after rounds): such a sweep runs without it
    assert "--stop-slower" in replace(request, selection_rounds=8, stop_slower=2.0).selection_args()
    assert "--stop-slower" not in replace(request, selection_rounds=7, stop_slower=2.0).selection_args()
    assert (PerSizeSpec().stop_slower, PerSizeSpec().stop_after) == (2.0, 4)
    with pytest.raises(ValidationError, match=r"stop_slower\n.*0.5 is neither 0 \(off\) nor a factor in \[1, 1e6\]"):
        PerSizeSpec(stop_slower=0.5)
    with pytest.raises(ValidationError, match="stop_after"):
        PerSizeSpec(stop_after=2)


def test_a_per_size_sweep_past_its_time_limit_names_the_settings_that_give_it_more(tmp_path: Path) -> None:
    """24 rounds of every allreduce selection at 1 and 16 MiB over the local 3-node cluster took more than the
    sweep's 600 s: the study stopped with the launcher's output tail only; now the message says what to change."""
    from types import SimpleNamespace

    from campaigns.tuning.executors import RunOutcome
    from campaigns.tuning.session import per_size_sweep, prepare
    from campaigns.tuning.spec import TuningSpec

    spec = TuningSpec(site="local", system="local:cpu", library="openmpi", library_version="4.1.4", op="allreduce",
                      sizes=["4K", "64K"], sizes_per_bucket=1, executor="launcher", launcher=MPIRUN,
                      commbench=COMMBENCH, per_size={"enabled": True, "rounds": 24, "time_limit_s": 600},
                      db=f"sqlite:///{tmp_path / 'study.db'}", runs_dir=tmp_path / "runs", publish_dir=None)
    setup = prepare(spec, environ={**os.environ, **OMPI_ENV}, ingest=False)
    setup.evaluator.executor = SimpleNamespace(run=lambda env, request, validate: RunOutcome(
        [], "killed", None, True, "killed at the hard time limit of 600 s"))
    with pytest.raises(EvaluationAborted, match=re.escape(
            "the per-size sweep failed (24 rounds of every selection at 2 size(s) did not fit: give "
            "per_size.time_limit_s more than 600 s, or fewer per_size.rounds): exit None, 0 records")):
        per_size_sweep(setup, SimpleNamespace(env={}))


class DeployedSetEvaluator:
    """A stand-in for the evaluator and its executor after finalization: the per-size sweep (alg4 +25 % over the
    library's choice at every size, 26 rounds) and the rounds of the defaults vs the deployed set, whose time per
    size is `factors` x the defaults' when the rule file is set (`env_factors` x when the recommended environment,
    SNDBUF, is set without it); `wrong_data`: its validated run gives wrong data."""

    def __init__(self, request: BenchRequest, factors: dict[int, float], wrong_data: bool = False,
                 env_factors: dict[int, float] | None = None) -> None:
        self.request, self.factors, self.wrong_data = request, factors, wrong_data
        self.env_factors = env_factors or dict.fromkeys(factors, 1.0)
        self.env_wrong_data = False  # the recommended environment alone gives wrong data in a validated run
        self.executor = self
        self.calls: list[tuple[dict[str, str], bool]] = []
        self.durations_s: list[float] = []  # the summary lists run durations
        self.rng = np.random.default_rng(3)

    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome:
        from test_per_size import SIZES, sweep_records

        return RunOutcome([{**r, "nodes": 1} for r in sweep_records({"alg4": {s: [1.25] for s in SIZES}}, 26)], "", 0)

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        self.calls.append((dict(env), validate))
        rules = "OMPI_MCA_coll_tuned_dynamic_rules_filename" in env
        if validate and (self.wrong_data if rules else self.env_wrong_data and SNDBUF in env):
            return Evaluation.failed(FailureKind.INVALID, "data validation failed (1048576 B: 3 wrong)")
        factors = self.factors if rules else self.env_factors if SNDBUF in env else dict.fromkeys(self.factors, 1.0)
        return Evaluation(times_us={size: [100.0 * factors[size] * float(np.exp(self.rng.normal(0, 0.01)))]
                                    for size in self.factors}, validated=validate)


SNDBUF = "OMPI_MCA_btl_tcp_sndbuf"


class PlantedSweep:
    """The real evaluator (commbench under mpirun: Open MPI 4.1.4 reads the rule file) whose per-size sweep claims
    that basic_linear (alg1) is 25 % faster than the library's choice at every size, as a sweep fooled by noise or
    drift might: everything after the sweep, the deployed set's validated run and rounds, is measured."""

    def __init__(self, real: CommbenchEvaluator) -> None:
        self.real, self.request, self.executor, self.durations_s = real, real.request, self, real.durations_s

    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome:
        from test_per_size import sweep_records

        records = sweep_records({"alg1": {s: [1.25] for s in request.sizes}}, 26, sizes=request.sizes)
        return RunOutcome([{**r, "nodes": 1, "ranks": 2} for r in records], "", 0)  # the rule file is per rank count

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        return self.real(env, validate=validate)


def deployed_set_session(tmp_path: Path, evaluator: DeployedSetEvaluator | None,
                         env: dict[str, str] | None = None, sizes: Sequence[str] = ("64K", "1M")) -> Any:
    """A session after finalization (recommendation: keep the defaults, or change to `env`) whose per-size stage
    gives one rule; `evaluator` None: PlantedSweep around the real one."""
    from campaigns.tuning.session import TuningOutcome, TuningSession, prepare
    from campaigns.tuning.spec import TuningSpec
    from test_tuner_writers import mpi_recommendation

    spec = TuningSpec(site="local", system="local:cpu", library="openmpi", library_version="4.1.4", op="allreduce",
                      sizes=list(sizes), sizes_per_bucket=1, iters=40, executor="launcher", launcher=MPIRUN,
                      commbench=COMMBENCH, per_size={"enabled": True, "top": 1}, seed=1,
                      db=f"sqlite:///{tmp_path / 'study.db'}", runs_dir=tmp_path / "runs",
                      publish_dir=tmp_path / "rec")
    setup = prepare(spec, environ={**os.environ, **OMPI_ENV}, ingest=False)
    if evaluator is None:
        setup = replace(setup, evaluator=PlantedSweep(setup.evaluator))
    else:
        evaluator.request = setup.evaluator.request
        setup = replace(setup, evaluator=evaluator)
    template = mpi_recommendation(nodes=1)
    rec = template.model_copy(update={
        "scope": setup.scope, "decision": "change" if env else "keep-defaults", "env": env or {},
        "gain": template.gain if env else None,
        "per_size": [template.per_size[0].model_copy(update={"bucket": b.name, "min_bytes": b.min_bytes,
                                                             "max_bytes": b.max_bytes}) for b in setup.buckets]})
    study = optuna.create_study(study_name="deployed")
    return TuningSession(setup, log=None, outcome=TuningOutcome(study, {}, recommendation=rec))


def test_the_deployed_set_is_measured_against_the_site_defaults(tmp_path: Path) -> None:
    """Finalization measured the environment against the defaults, the per-size stage its rules against the
    library's own choice under it: environment + rule file together, what a job gets, are measured against the
    site's defaults (issue 14 item 3), its first run validated, and the summary, report and .env say the gain."""
    from campaigns.cli.tune import report_lines

    evaluator = DeployedSetEvaluator(REQUEST, {65536: 0.8, 1 << 20: 0.8})
    session = deployed_set_session(tmp_path, evaluator)
    session.per_size()
    session.publish()
    session.summary(tmp_path / "summary.json")
    rec = json.loads((tmp_path / "summary.json").read_text())["recommendation"]
    # the summary's `cleared` is what is published: less what the deployed set exports (it listed a knob the set
    # exports under "unset these too")
    exported = session.outcome.recommendation
    session.outcome.recommendation = exported.model_copy(update={
        "env": {**exported.env, "OMPI_MCA_btl_tcp_sndbuf": "65536"}, "cleared": ["OMPI_MCA_btl_tcp_sndbuf", "X_Y"]})
    session.summary(tmp_path / "exported.json")
    assert json.loads((tmp_path / "exported.json").read_text())["recommendation"]["cleared"] == ["X_Y"]
    session.outcome.recommendation = exported
    deployed = rec["deployed"]
    assert deployed["rounds"] == 6 and deployed["withdrawn"] is None
    assert deployed["overall"]["median"] == pytest.approx(0.25, abs=0.03)
    assert set(deployed["buckets"]) == {"64KiB-64KiB", "1MiB-1MiB"}
    assert all(b["ci_low"] > 0.2 for b in deployed["buckets"].values())
    # the rules' own effect: the environment is the defaults', so the same comparison
    assert deployed["rules_effect"] == deployed["buckets"]
    assert rec["per_size_selection"]["ranges"][0]["selection"]["name"] == "alg4"
    # the first run of the deployed set validated, with the rule file written into this tune's runs
    (env, validated), *rounds = evaluator.calls
    rules = Path(env["OMPI_MCA_coll_tuned_dynamic_rules_filename"])
    assert validated and rules.parent.parent == tmp_path / "runs" and "alg4" in rules.read_text()
    assert env["OMPI_MCA_coll_tuned_use_dynamic_rules"] == "1"
    assert len(rounds) == 12 and sum("OMPI_MCA_coll_tuned_dynamic_rules_filename" in e for e, _ in rounds) == 6
    report = "\n".join(report_lines(session.outcome))
    assert "deployed set (environment + per-size rules) vs the site's defaults, 6 rounds: overall +2" in report
    assert "(deployed set +2" in report
    env_text = session.outcome.published.env_file.read_text()
    assert "# deployed set (environment + per-size rules) vs the site's defaults" in env_text
    assert "OMPI_MCA_coll_tuned_dynamic_rules_filename" in env_text


@pytest.mark.parametrize(("factors", "wrong_data", "why"), [
    ({65536: 0.8, 1 << 20: 1.2}, False, "slower in bucket 1MiB-1MiB: -1"),
    ({65536: 0.8, 1 << 20: 0.8}, True, "data validation failed (1048576 B: 3 wrong)"),
])
def test_a_deployed_set_slower_in_a_bucket_or_with_wrong_data_loses_its_rules(
        tmp_path: Path, factors: dict[int, float], wrong_data: bool, why: str) -> None:
    """The rules won against the library's own choice under the environment, yet the environment + rules are
    slower than the site's defaults at 1 MiB (or give wrong data): the rules are withdrawn, the environment alone
    is published, and a note says why."""
    session = deployed_set_session(tmp_path, DeployedSetEvaluator(REQUEST, factors, wrong_data))
    session.per_size()
    session.publish()
    session.summary(tmp_path / "summary.json")
    rec = json.loads((tmp_path / "summary.json").read_text())["recommendation"]
    assert why in rec["deployed"]["withdrawn"]
    assert rec["per_size_selection"] is None and rec["rule_files"] == {}
    (note,) = [n for n in rec["evidence"]["notes"] if "withdrawn" in n]
    assert note.startswith("per-size rules ([8, 1048576] B alg4) withdrawn, the environment alone is deployed; the "
                           "environment with them against the site's defaults: ")
    assert why in note
    published = session.outcome.published.env_file.parent
    assert "export OMPI_MCA_coll_tuned_dynamic_rules_filename" not in session.outcome.published.env_file.read_text()
    assert not list(published.glob("*.coll_tuned_rules"))


@pytest.mark.parametrize("never_slower", [True, False])
def test_an_environment_let_through_by_never_slower_off_is_checked_when_no_rule_restores_its_sizes(
        tmp_path: Path, never_slower: bool) -> None:
    """`finalize: {never_slower: false}` accepts an environment slower at some size for per-size rules to restore
    that size; when the stage finds no rule, nothing would: the environment alone is then checked against the
    defaults as a set with rules is (slower at 1 MiB here: withdrawn, keep the defaults). Before, it was published
    as it was. With never_slower on, finalization refused such a winner already: nothing more runs. The spec
    refuses never_slower off without the per-size stage."""
    from campaigns.tuning.session import deployed_check
    from campaigns.tuning.spec import TuningSpec

    evaluator = DeployedSetEvaluator(REQUEST, {65536: 0.8, 1 << 20: 0.8}, env_factors={65536: 0.8, 1 << 20: 1.2})
    session = deployed_set_session(tmp_path, evaluator, {SNDBUF: "65536"})
    spec = session.setup.spec
    setup = replace(session.setup, spec=spec.model_copy(update={
        "finalize": spec.finalize.model_copy(update={"never_slower": never_slower})}))
    before = session.outcome.recommendation
    assert before.per_size_selection is None and before.decision == "change"
    rec = deployed_check(setup, before, {}, 0)
    if never_slower:
        assert rec == before and evaluator.calls == []
        with pytest.raises(ValueError, match=r"never_slower: false .* needs the per-size stage"):
            TuningSpec(**{**spec.model_dump(), "finalize": {"never_slower": False}, "per_size": {"enabled": False}})
        return
    assert len(evaluator.calls) == 1 + 2 * 6  # one validated run, then 6 rounds of the defaults and the environment
    assert "slower in bucket 1MiB-1MiB" in rec.deployed.withdrawn
    assert rec.decision == "keep-defaults" and rec.env == {} and rec.gain is None
    assert rec.evidence.notes[-1].startswith(f"the environment ({SNDBUF}=65536), accepted with never_slower off for "
                                             "per-size rules to restore the sizes it slows, withdrawn, keep the "
                                             "defaults: no rule was found")


def test_the_real_library_s_slower_rule_file_is_withdrawn_by_the_deployed_check(tmp_path: Path) -> None:
    """The deployed-set check on the real library: the sweep (planted) put basic_linear at every size, Open MPI
    runs the rule file it writes (basic_linear took 1.4x own's time at 1 MiB and 2.4x at 4 MiB between 2 local
    ranks here, 2026-11-28; at 64 KiB, the sizes before, 1.0-1.6x), and the check withdraws the rules: nothing of
    them is published. Real runs only after the sweep. Its 6 rounds decide on the slowest and fastest round (the
    median's interval): one stalled round of the defaults on a loaded machine keeps the set, as the rule says (at
    64 KiB and 1 MiB a fresh-clone CI run kept it in all five sessions), so up to five sessions, each a new tune's
    check."""
    for attempt in range(5):
        (tmp_path / str(attempt)).mkdir()
        session = deployed_set_session(tmp_path / str(attempt), None, sizes=("1M", "4M"))
        session.per_size()
        session.publish()
        session.summary(tmp_path / str(attempt) / "summary.json")
        rec = json.loads((tmp_path / str(attempt) / "summary.json").read_text())["recommendation"]
        if rec["deployed"]["withdrawn"] is not None:
            break
        # kept: only where a round crossed (the set not slower in every round of each bucket)
        assert all(b["ci_high"] >= 0 for b in rec["deployed"]["buckets"].values()), rec["deployed"]
    assert rec["deployed"]["withdrawn"] is not None, rec["deployed"]
    assert "slower in bucket" in rec["deployed"]["withdrawn"], rec["deployed"]
    assert rec["per_size_selection"] is None and rec["decision"] == "keep-defaults"
    assert any(b["ci_high"] < 0 for b in rec["deployed"]["buckets"].values()), rec["deployed"]["buckets"]
    assert "export OMPI_MCA_coll_tuned_dynamic_rules_filename" not in session.outcome.published.env_file.read_text()

@pytest.mark.parametrize("environment_slower", [False, True])
def test_a_refused_deployed_set_blames_the_environment_only_when_it_is_refused_alone_too(
        tmp_path: Path, environment_slower: bool) -> None:
    """Finalization changed the send buffer; with the rule the set is slower than the defaults at 1 MiB. The
    environment alone runs in the same rounds: when it is fine there the rules alone are withdrawn; when it is slower
    at 1 MiB as well, it is withdrawn with them and the defaults are kept (before: the rules were blamed and the
    environment published, unmeasured in those rounds)."""
    env_factors = {65536: 0.8, 1 << 20: 1.2 if environment_slower else 0.8}
    evaluator = DeployedSetEvaluator(REQUEST, {65536: 0.8, 1 << 20: 1.2}, env_factors=env_factors)
    session = deployed_set_session(tmp_path, evaluator, {SNDBUF: "65536"})
    session.per_size()
    session.publish()
    session.summary(tmp_path / "summary.json")
    rec = json.loads((tmp_path / "summary.json").read_text())["recommendation"]
    # each round measured the defaults, the set and the environment alone
    rounds = [e for e, validated in evaluator.calls[1:] if not validated]
    assert len(rounds) == 18 and sum(e.get(SNDBUF) == "65536" and len(e) == 1 for e in rounds) == 6
    assert "slower in bucket 1MiB-1MiB" in rec["deployed"]["withdrawn"] and rec["per_size_selection"] is None
    env_text = session.outcome.published.env_file.read_text()
    # the rules' own effect, the set against the environment alone: none at 64 KiB, -33 % at 1 MiB
    effect = rec["deployed"]["rules_effect"]
    assert effect["64KiB-64KiB"]["median"] == pytest.approx(0.0, abs=0.03)
    assert effect["1MiB-1MiB"]["median"] == pytest.approx(0.8 / 1.2 - 1 if not environment_slower else 0.0, abs=0.03)
    if not environment_slower:
        assert rec["deployed"]["environment_withdrawn"] is None
        assert rec["decision"] == "change" and rec["env"] == {SNDBUF: "65536"}
        assert f"export {SNDBUF}='65536'" in env_text
        return
    assert "slower in bucket 1MiB-1MiB" in rec["deployed"]["environment_withdrawn"]
    assert rec["decision"] == "keep-defaults" and rec["env"] == {} and rec["gain"] is None
    assert rec["closest"] is None  # not a candidate "nearest to acceptance": it was accepted, then withdrawn
    (note,) = [n for n in rec["evidence"]["notes"] if "withdrawn" in n]
    assert note.startswith(f"per-size rules ([8, 1048576] B alg4) and the environment ({SNDBUF}=65536 (finalization: "
                           "+12.0% median speed-up")  # the withdrawn winner's gain, for the record
    assert "withdrawn, keep the defaults: " in note
    assert f"export {SNDBUF}" not in env_text and "export OMPI_MCA_coll_tuned_dynamic_rules_filename" not in env_text


def test_the_deployed_check_names_the_rules_effect_where_a_rule_applies_and_an_environment_failing_alone() -> None:
    """with_deployed_check: the rules' own effect is reported for the buckets a rule covers only (a rule for 1 MiB:
    not the 64 KiB bucket); a set that passes while the environment alone failed in a round is deployed as
    measured, with a note; a set refused when the defaults failed in every round loses its rules, not the
    environment (nothing compared them)."""
    from test_per_size import result_with
    from test_tuner_writers import mpi_recommendation
    from tuners.finalize import DeployedCheck, Holdout
    from tuners.recommendation import with_deployed_check, with_per_size

    template = mpi_recommendation(nodes=1)
    buckets = [template.per_size[0].model_copy(update={"bucket": name, "min_bytes": size, "max_bytes": size})
               for name, size in (("64KiB-64KiB", 65536), ("1MiB-1MiB", 1 << 20))]
    rec = with_per_size(template.model_copy(update={"scope": make_scope(nodes=1), "per_size": buckets}),
                        result_with(template.scope.op, "alg4", 4, 1 << 20, 1 << 20))
    gain = Holdout(0.2, 0.1, 0.3, 6, (1.2,) * 6)
    both = {"64KiB-64KiB": gain, "1MiB-1MiB": gain}
    passed = with_deployed_check(rec, DeployedCheck(gain, both, 6, None, "failed in a round (TIMEOUT: hung)", both))
    assert set(passed.deployed.rules_effect) == {"1MiB-1MiB"}
    assert passed.per_size_selection is not None and passed.decision == "change"
    assert passed.evidence.notes[-1] == ("the environment alone in the rounds of the deployed-set check: failed in a "
                                         "round (TIMEOUT: hung); the deployed set (with the per-size rules) was not: "
                                         "deployed as measured")
    assert "the environment alone: failed in a round" in passed.deployed.describe()
    not_compared = with_deployed_check(rec, DeployedCheck(None, {}, 0, "not compared: the defaults failed in all 6 "
                                                          "rounds", None))
    assert not_compared.per_size_selection is None and not_compared.env == rec.env


@pytest.mark.parametrize("environment_fails", [False, True])
def test_a_deployed_set_whose_validated_run_fails_blames_the_environment_only_if_it_fails_alone(
        tmp_path: Path, environment_fails: bool) -> None:
    """Through the session: the set (environment + rule file) gives wrong data in its validated run; the
    environment alone runs validated then too. Only when that fails as well is the environment withdrawn (keep the
    defaults, in the buckets that chose it too)."""
    evaluator = DeployedSetEvaluator(REQUEST, {65536: 0.8, 1 << 20: 0.8}, wrong_data=True)
    if environment_fails:
        evaluator.env_wrong_data = True
    session = deployed_set_session(tmp_path, evaluator, {SNDBUF: "65536"})
    session.outcome.recommendation = session.outcome.recommendation.model_copy(update={"per_size": [
        b.model_copy(update={"decision": "change", "env": {SNDBUF: "65536"}})
        for b in session.outcome.recommendation.per_size]})
    session.per_size()
    rec = session.outcome.recommendation
    assert "validated run of the deployed set" in rec.deployed.withdrawn and rec.per_size_selection is None
    assert [validated for _, validated in evaluator.calls] == [True, True]
    if not environment_fails:
        assert rec.decision == "change" and rec.deployed.environment_withdrawn is None
        return
    assert "validated run of the environment alone" in rec.deployed.environment_withdrawn
    assert rec.decision == "keep-defaults" and rec.env == {} and rec.gain is None and rec.closest is None
    assert all(b.decision == "keep-defaults" and b.env == {} for b in rec.per_size)
    assert "(finalization: +12.0% median speed-up" in rec.evidence.notes[-1]


def test_the_deployed_nccl_set_points_nccl_at_a_tuner_config_of_its_own(tmp_path: Path) -> None:
    """NCCL's per-size rules are tuner-plugin rows: the deployed set measured against the defaults reads them from
    a config written into the tune's runs, through the plugin library publish would name."""
    from types import SimpleNamespace

    from campaigns.tuning.session import deployed_rules
    from test_per_size import result_with
    from test_tuner_writers import mpi_recommendation
    from tuners.per_size import TunerConfigError, parse_config
    from tuners.recommendation import with_per_size

    rec = mpi_recommendation(nodes=1).model_copy(update={"scope": make_scope(nodes=1)})
    rec = with_per_size(rec, result_with("allreduce", "Ring/Simple/8", 0, 65536, 1 << 20, cvar="", mechanism="plugin"))
    setup = SimpleNamespace(spec=SimpleNamespace(runs_dir=tmp_path / "runs", plugin_library=tmp_path / "tuner.so"))
    # NCCL runs on without a tuner plugin it cannot load: the check would measure the environment alone
    with pytest.raises(TunerConfigError, match=f"the tuner plugin {tmp_path / 'tuner.so'} does not exist"):
        deployed_rules(setup, rec)
    assert not (tmp_path / "runs").exists()
    (tmp_path / "tuner.so").write_bytes(b"")
    env = deployed_rules(setup, rec)
    assert env is not None and env["NCCL_TUNER_PLUGIN"] == str(tmp_path / "tuner.so")
    config = Path(env["NCCL_TUNER_CONFIG_FILE"])
    assert config.parent.parent == tmp_path / "runs" and parse_config(config.read_text()) == rec.plugin_rules
    assert f"pid {os.getpid()}" in (is_in_use(config.parent) or "not in use")  # prune keeps it: the check reads it
    assert deployed_rules(setup, with_per_size(rec, result_with("allreduce", "x", 0, 64, 128).model_copy(
        update={"ranges": []}))) is None  # no rule: nothing written, nothing measured


def test_pretune_writes_no_env_file_when_every_trial_failed(tmp_path: Path) -> None:
    env_file = tmp_path / "tuned.env"
    code, out = commcamp_output(*PRETUNE, "--budget", "20s", "--trials", "3", "--db", f"sqlite:///{tmp_path / 's.db'}",
                                "--runs-dir", tmp_path / "runs", "--env-file", env_file,
                                env=allocation(tmp_path, "exit 1"))
    assert code == 1 and f"no trial completed (see the trials' fail_reason); {env_file} not written" in out, out
    assert not env_file.exists() and "wrote " not in out


def test_a_tune_s_provenance_names_the_commit_it_started_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary's provenance was read when the summary was written: a tune that outlived an update of its checkout
    named the new commit beside a recommendation whose versions named the old one (a real tune on the local cluster:
    546a1ca for code of 92d3497). Both now say the commit at the start."""
    from campaigns import paths
    from campaigns.tuning import session

    repo = tmp_path / "checkout"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "start")
    started = git("rev-parse", "--short", "HEAD")
    monkeypatch.setattr(paths, "CHECKOUT", repo)
    session._checkout_at_start.cache_clear()
    try:
        assert session._git_commit() == started  # prepare() asks first, for the recommendation's versions
        git("commit", "-q", "--allow-empty", "-m", "an update while the tune runs")
        (repo / "edited.py").write_text("")
        provenance = session.provenance()
        assert provenance["commit"] == started and provenance["changed_files"] == 0
    finally:
        session._checkout_at_start.cache_clear()


def test_site_variables_reach_a_launch_expanded_as_the_job_script_s_shell_does() -> None:
    """ReFrame writes a site's env_vars into a job script, whose shell expands $NAME; a launch without ReFrame got
    the text: LD_LIBRARY_PATH=$COMMCAMP_UCX_CUDA/libucx/lib:...:$LD_LIBRARY_PATH replaced the caller's path."""
    from campaigns.tuning.spec import TuningSpec, site_env

    spec = TuningSpec(site="h200", system="h200", environ="openmpi-ucx-cuda", library="nccl", op="allreduce",
                      transport="ccl", sizes=["1M"], executor="launcher", launcher=["mpirun"])
    env = site_env(spec, {"COMMCAMP_UCX_CUDA": "/opt/ucx", "LD_LIBRARY_PATH": "/usr/lib"})
    assert env["UCX_MODULE_DIR"] == "/opt/ucx/libucx/lib/ucx"
    assert env["LD_LIBRARY_PATH"] == "/opt/ucx/libucx/lib:/opt/ucx/libucx_cu13.libs:/usr/lib"
    assert site_env(spec, {})["LD_LIBRARY_PATH"] == "/libucx/lib:/libucx_cu13.libs:"  # unset: empty, as in sh
    # quotes, as the shell reads them: Alps' NCCL_NET '"AWS Libfabric"' reached NCCL with its quotes
    alps = TuningSpec(site="alps", system="daint:normal", environ="prgenv-gnu", library="nccl", op="allreduce",
                      transport="ccl", sizes=["1M"], executor="launcher", launcher=["srun"])
    assert site_env(alps, {})["NCCL_NET"] == "AWS Libfabric"


class MpichSweep:
    """A stand-in for the evaluator after finalization: its executor's sweep returns `records` (no run); the runs it
    is asked for are recorded. No deployed-set run is expected (no rule comes out)."""

    def __init__(self, request: BenchRequest, records: list[dict[str, Any]], base_env: dict[str, str]) -> None:
        self.request, self.records, self.base_env = request, records, base_env
        self.executor = self
        self.swept: list[dict[str, str]] = []
        self.durations_s: list[float] = []

    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome:
        self.swept.append(dict(env))
        return RunOutcome(self.records, "", 0)

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        raise AssertionError(f"no deployed-set run expected (no rule), asked for {dict(env)}")


MPICH_ALLREDUCE = "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"


@pytest.mark.parametrize(("nodes", "tasks_per_node", "env", "base_env", "swept", "note"), [
    # finding 1: ch4's node-aware composition never reads the file at the tuned comm size
    (2, 2, {}, {}, 0, "per-size stage not run, no per-size rules: MPICH on 2 nodes with more than one rank per "
                      "node (4 ranks): its ch4 device runs the collective as a node-aware composition"),
    # finding 2: the deployed environment forces the op's algorithm (the recommended one, or what every run gets)
    (1, 2, {MPICH_ALLREDUCE: "recursive_doubling"}, {}, 0,
     f"per-size stage not run, no per-size rules: the environment sets {MPICH_ALLREDUCE}=recursive_doubling"),
    (1, 2, {}, {MPICH_ALLREDUCE: "smp"}, 0,
     f"per-size stage not run, no per-size rules: the environment sets {MPICH_ALLREDUCE}=smp"),
    (1, 2, {MPICH_ALLREDUCE: "auto"}, {}, 1, None),  # auto is MPICH's own choice: the stage runs
    # finding 3: one rank per node keeps its rules, but smp (parent-comm) is no candidate there
    (2, 1, {}, {}, 1, "per-size stage: allreduce smp is no candidate at 8 B, 64 B, 1024 B, 65536 B, 1048576 B"),
])
def test_the_mpich_per_size_stage_gives_no_rule_mpich_would_not_run(
        tmp_path: Path, nodes: int, tasks_per_node: int, env: dict[str, str], base_env: dict[str, str], swept: int,
        note: str | None) -> None:
    """MPICH reads the per-size selection file only where it runs the MPIR-level selection on the tuned
    communicator and the op's algorithm is not forced (tuners/rule_files.py): elsewhere the stage runs no sweep and
    the recommendation (and the summary) say why; an algorithm whose restriction the sweep's layout breaks (smp on
    one rank per node) is no candidate, planted 30 % faster though."""
    from campaigns.tuning.session import TuningOutcome, TuningSession, prepare
    from campaigns.tuning.spec import TuningSpec
    from test_per_size import mpich_sweep_records
    from test_tuner_writers import mpi_recommendation

    spec = TuningSpec(site="local", system="local:cpu", environ="mpich", library="mpich", library_version="4.0.2",
                      op="allreduce", sizes=[8, 64, 1024, 65536, 1 << 20], nodes=nodes, tasks_per_node=tasks_per_node,
                      executor="launcher", launcher=["mpiexec.hydra", "-np", str(nodes * tasks_per_node)],
                      commbench=REPO / "build" / "bench" / "cpu-mpich" / "commbench", per_size={"enabled": True},
                      db=f"sqlite:///{tmp_path / 'study.db'}", runs_dir=tmp_path / "runs", publish_dir=None)
    setup = prepare(spec, environ=dict(os.environ), ingest=False, inside_allocation=True)
    # smp planted 30 % faster where it cannot run (one rank per node); elsewhere no selection is faster
    planted = {"smp": {s: [1.3 if nodes == nodes * tasks_per_node else 1.0] for s in (8, 64, 1024, 65536, 1 << 20)}}
    records = mpich_sweep_records(planted, ranks=nodes * tasks_per_node, nodes=nodes)
    sweep = MpichSweep(setup.evaluator.request, records, base_env)
    setup = replace(setup, evaluator=sweep)
    template = mpi_recommendation(nodes=nodes)
    rec = template.model_copy(update={
        "scope": setup.scope, "decision": "change" if env else "keep-defaults", "env": env,
        "gain": template.gain if env else None,
        "per_size": [template.per_size[0].model_copy(update={"bucket": b.name, "min_bytes": b.min_bytes,
                                                             "max_bytes": b.max_bytes}) for b in setup.buckets]})
    session = TuningSession(setup, log=None, outcome=TuningOutcome(optuna.create_study(), {}, recommendation=rec))
    after = session.per_size()
    assert len(sweep.swept) == swept
    ranges = [] if after.per_size_selection is None else after.per_size_selection.ranges
    assert all(r.selection is None for r in ranges)  # smp never wins; nothing else was planted
    assert (after.per_size_selection is None) == (swept == 0)
    notes = [n for n in after.evidence.notes if n not in rec.evidence.notes]
    assert notes == [] if note is None else (len(notes) == 1 and notes[0].startswith(note)), notes
    if swept == 0:
        session.summary(tmp_path / "summary.json")
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["recommendation"]["evidence"]["notes"][-1] == notes[0]
        assert summary["recommendation"]["per_size_selection"] is None


def test_an_mpich_sweep_on_another_layout_than_the_spec_s_gives_no_rules(tmp_path: Path) -> None:
    """The launcher decides the layout the sweep ran on (its records say it): 2 nodes with 2 ranks each where the
    spec said one per node gets no rules either, with a note."""
    from campaigns.tuning.session import TuningOutcome, TuningSession, prepare
    from campaigns.tuning.spec import TuningSpec
    from test_per_size import mpich_sweep_records
    from test_tuner_writers import mpi_recommendation

    spec = TuningSpec(site="local", system="local:cpu", environ="mpich", library="mpich", library_version="4.0.2",
                      op="allreduce", sizes=[8, 64, 1024, 65536, 1 << 20], nodes=2, tasks_per_node=1,
                      executor="launcher", launcher=["mpiexec.hydra"],  # its layout: what the records say
                      commbench=REPO / "build" / "bench" / "cpu-mpich" / "commbench", per_size={"enabled": True},
                      db=f"sqlite:///{tmp_path / 'study.db'}", runs_dir=tmp_path / "runs", publish_dir=None)
    setup = prepare(spec, environ=dict(os.environ), ingest=False, inside_allocation=True)
    planted = {"recursive_doubling": {s: [1.3] for s in (8, 64, 1024, 65536, 1 << 20)}}
    sweep = MpichSweep(setup.evaluator.request, mpich_sweep_records(planted, ranks=4, nodes=2), {})
    setup = replace(setup, evaluator=sweep)
    template = mpi_recommendation(nodes=2)
    rec = template.model_copy(update={"scope": setup.scope, "decision": "keep-defaults", "env": {}, "gain": None})
    session = TuningSession(setup, log=None, outcome=TuningOutcome(optuna.create_study(), {}, recommendation=rec))
    after = session.per_size()
    assert len(sweep.swept) == 1 and after.per_size_selection is None
    assert after.evidence.notes[-1].startswith("per-size sweep left out, no per-size rules: MPICH on 2 nodes with "
                                               "more than one rank per node (4 ranks)")


# ------------------------------------------------------------ read logs, warm starts, --commbench (review 9)
class GetLevelLog:
    """An executor that logs as NCCL 2.28's ncclGetLevel(&level, "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL") does
    (src/graph/paths.cc v2.28.3-1 lines 217-251): the disable variable only when it is 1, and then the level variable
    is never read; 50 us with P2P on (a level other than LOC), 100 us without (the reviewer's
    /tmp/rev9/exp/exp6_getlevel.py)."""

    def run(self, env, request: BenchRequest, validate: bool) -> RunOutcome:
        disabled = env.get("NCCL_P2P_DISABLE") == "1"
        log = "vm:1:2 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1\n" if disabled else ""
        if not disabled and "NCCL_P2P_LEVEL" in env:
            log += f"vm:1:2 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to {env['NCCL_P2P_LEVEL']}\n"
        fast = not disabled and env.get("NCCL_P2P_LEVEL") != "LOC"
        return RunOutcome([{"kind": "result", "op": request.op, "bytes": size, "valid": True,
                            "samples_us": [50.0 if fast else 100.0]} for size in request.sizes], log, 0)


def test_a_knob_the_library_logs_only_off_its_default_or_reads_only_beside_another_s_value_is_not_dropped(
        catalog: KnobCatalog) -> None:
    """NCCL_P2P_DISABLE=0 (its unset_equals) is read but not logged, and NCCL_P2P_LEVEL is not read beside
    NCCL_P2P_DISABLE=1 (catalog `inert_when`): neither is a reason to fail the run nor to take the knob out of the
    search. The site disables P2P by default; a tune of both knobs now finds P2P on (2x faster) in every seed. Before,
    P2P_DISABLE=0 was an invalid trial that dropped the knob, and one trial beside P2P disabled dropped P2P_LEVEL for
    every later trial: 4 of 6 seeds lost both and never measured the faster setting. A level NCCL does not read beside
    P2P on is still not credited."""
    site = catalog.for_site({"defaults": {"NCCL_P2P_DISABLE": 1}})
    sizes = (1024, 1 << 20)
    evaluate = CommbenchEvaluator(GetLevelLog(), BenchRequest("allreduce", "ccl", sizes), Library.NCCL, site)
    for env in ({"NCCL_P2P_DISABLE": "0"}, {"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}):
        result = evaluate(env)
        assert result.ok and result.unread == (), (env, result.reason)
    unread = CommbenchEvaluator(NcclReadLog({"NCCL_P2P_LEVEL"}), BenchRequest("allreduce", "ccl", sizes), Library.NCCL,
                                site)({"NCCL_P2P_LEVEL": "SYS"})
    assert unread.failure is FailureKind.INVALID and unread.unread == ("NCCL_P2P_LEVEL",)
    space = build_space(site, {Library.NCCL: "2.28.3"}, knobs=["NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL"], op="allreduce",
                        transport="ccl")
    for seed in range(6):
        study = Tuner(make_scope(), space, evaluate, optuna.storages.InMemoryStorage(), buckets_for_sizes(sizes),
                      n_trials=12, seed=seed, screen_trials=16).run()
        assert dropped_knobs(study) == {}, seed
        assert all(t.user_attrs[OUTCOME] == "complete" for t in study.trials if is_counted(t)), seed
        assert min(t.value for t in study.trials if is_counted(t)) == pytest.approx(50.0), seed
        # one configuration beside P2P disabled, seven beside P2P on: all measured, the search ends short of 12
        assert sum(is_counted(t) for t in study.trials) == 8, seed


def test_rccl_s_own_knobs_are_found_in_its_read_log(catalog: KnobCatalog) -> None:
    """RCCL_PARAM logs its knobs under their RCCL_ names ("RCCL_MSCCL_ENABLE set by environment to 0."): the read
    log is read for them too. Before, only NCCL_ names were: every RCCL_ knob a trial set made it invalid and left the
    search (the reviewer's /tmp/rev9/exp/exp1_rccl.py)."""
    output = ("host:1:1 [0] NCCL INFO RCCL_LL128_FORCE_ENABLE set by environment to 1.\n"
              "host:1:1 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 8388608.\n")
    assert knobs_read(Library.RCCL, output) == {"RCCL_LL128_FORCE_ENABLE": "1", "NCCL_BUFFSIZE": "8388608"}
    evaluate = CommbenchEvaluator(NcclReadLog(set()), BenchRequest("allreduce", "ccl", (1024,)), Library.RCCL, catalog)
    for env in ({"RCCL_LL128_FORCE_ENABLE": "1"}, {"RCCL_MSCCL_ENABLE": "0"}, {"RCCL_MSCCL_ENABLE": "1"}):
        result = evaluate(env)
        assert result.ok and result.unread == (), (env, result.reason)
    unread = CommbenchEvaluator(NcclReadLog({"RCCL_MSCCL_ENABLE"}), BenchRequest("allreduce", "ccl", (1024,)),
                                Library.RCCL, catalog)({"RCCL_MSCCL_ENABLE": "1"})
    assert unread.failure is FailureKind.INVALID and unread.unread == ("RCCL_MSCCL_ENABLE",)


def socket_tune_winner(nodes: int, env: Mapping[str, str], baseline_env: Mapping[str, str]) -> dict[str, Any]:
    """A published 'change' entry of the h200 site (as `commcamp tune` writes it), for the 2-GPU allreduce scope."""
    gain = {"median": 0.4, "ci_low": 0.2, "ci_high": 0.6, "confidence": 0.95, "p_value": 0.001, "p_adjusted": 0.003,
            "rounds": 10, "ratios": [1.4] * 10}
    return {"scope": make_scope(site="h200", system="h200", partition="gpu", nodes=nodes, gpus_per_node=1)
            .model_dump(mode="json"), "decision": "change", "env": dict(env), "unset": [],
            "baseline_env": dict(baseline_env), "gain": gain, "per_size": [],
            "evidence": {"test": "wilcoxon", "alpha": 0.05, "min_effect": 0.03, "confidence": 0.95, "rounds_run": 10,
                         "rounds_used": 10, "notes": [], "study": "s", "trials_counted": 15, "trials_complete": 15,
                         "trials_failed": 0},
            "date": "2026-11-26T13:46:05+00:00", "versions": {"nccl": "2.28.3"}}


def test_a_warm_start_measured_beside_another_baseline_is_skipped_saying_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The 2-node socket-path tune's winner ran with NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1 in its baseline (the
    planted socket-path knob file); this tune of the h200 site has P2P and SHM on. Cut to this tune's knobs it was
    enqueued as {SOCKET_NTHREADS 2, BUFFSIZE 8 MiB} under the winner's name, a setting it never measured (the
    reviewer's /tmp/rev9/exp/exp3_warm.py). It is skipped with a warning; so is a winner that sets a knob this tune
    does not search (NCCL_ALGO) to another value than this tune's baseline; one measured beside this tune's baseline
    (its pin NCCL_NVLS_ENABLE=0) is kept."""
    from campaigns.tuning.session import warm_start_envs
    from campaigns.tuning.spec import site_knob_catalog

    catalog, _ = site_knob_catalog("h200")
    assert catalog.pinned == {"NCCL_NVLS_ENABLE": "0"}
    pin, socket_path = {"NCCL_NVLS_ENABLE": "0"}, {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    winners = [
        socket_tune_winner(2, {"NCCL_SOCKET_NTHREADS": "2", "NCCL_BUFFSIZE": "8388608", **pin, **socket_path},
                           {**pin, **socket_path}),
        socket_tune_winner(3, {"NCCL_SOCKET_NTHREADS": "4", "NCCL_ALGO": "Ring", **pin}, pin),
        socket_tune_winner(8, {"NCCL_SOCKET_NTHREADS": "2", **pin}, pin),
    ]
    directory = tmp_path / "pub" / "h200" / "h200"
    directory.mkdir(parents=True)
    (directory / "recommendations.yaml").write_text(yaml.safe_dump(
        {"schema_version": 1, "site": "h200", "system": "h200", "recommendations": winners}))
    knobs = ["NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_BUFFSIZE", "NCCL_PROTO"]
    space = build_space(catalog, {Library.NCCL: "2.28.3"}, knobs=knobs, op="allreduce", transport="ccl")
    scope = make_scope(site="h200", system="h200", partition="gpu", nodes=4, gpus_per_node=1)
    with caplog.at_level("WARNING", logger="campaigns.tuning.session"):
        warm = warm_start_envs(tmp_path / "pub", scope, space)
    assert [env for env, _ in warm] == [{"NCCL_SOCKET_NTHREADS": "2"}]
    assert "nodes=2" in caplog.text and ("NCCL_P2P_DISABLE=1 in its baseline, unset here; NCCL_SHM_DISABLE=1 in its "
                                         "baseline, unset here") in caplog.text
    assert "nodes=3" in caplog.text and "it sets NCCL_ALGO=Ring, outside this tune's knobs (unset here)" in caplog.text
    assert "nodes=8" not in caplog.text


def test_commbench_must_be_an_executable_file(tmp_path: Path) -> None:
    """`--commbench <a directory>` passed the check (a directory is 'executable': os.access X_OK) and every trial
    failed to launch; it is refused at once, naming --commbench."""
    with pytest.raises(ValueError,
                       match=rf"--commbench {re.escape(str(tmp_path))}: the commbench binary is a directory"):
        LauncherExecutor(MPIRUN, tmp_path, tmp_path, {})
    with pytest.raises(ValueError, match="--commbench .*: the commbench binary does not exist or is not executable"):
        LauncherExecutor(MPIRUN, tmp_path / "missing", tmp_path, {})
    LauncherExecutor(MPIRUN, wrapper(tmp_path, "exit 0"), tmp_path, {})


def test_provenance_does_not_wait_on_a_missing_slurm_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SLURM_CONF naming a file that is gone (a cluster taken down, a stale module) makes `sinfo --version` retry
    for a minute: a tune's summary waited 20 s (the command's limit) for the Slurm version."""
    import time

    from campaigns.tuning.session import provenance

    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    started = time.monotonic()
    assert provenance()["slurm"] == "unavailable: SLURM_CONF=/nonexistent/slurm.conf does not exist"
    assert time.monotonic() - started < 10


def test_an_mpi_tune_in_another_mpi_s_environment_is_refused(tmp_path: Path) -> None:
    """`--library openmpi --environ mpich` ran every trial under MPICH ("did not report reading"), and with the
    version given published the result under Open MPI's scope, replacing its entry; without it the probe blamed
    the version. Refused before anything runs, naming the library's environments."""
    code, out = commcamp_output("tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi",
                                "--environ", "mpich", "--op", "allreduce", "--sizes", "64K", "--library-version",
                                "4.1.4", "--db", f"sqlite:///{tmp_path / 's.db'}", "--publish-dir", tmp_path / "rec",
                                "--runs-dir", tmp_path / "runs", "--dry-run")
    assert code == 2 and "environ: 'mpich' is an environment of mpich, not of library openmpi (its environments " \
        "on local:cpu: openmpi)" in " ".join(out.split()), out
    assert not (tmp_path / "runs").exists() and not (tmp_path / "rec").exists()
    code, out = commcamp_output("tune", "--site", "local", "--system", "local:cpu", "--library", "cray-mpich",
                                "--environ", "openmpi", "--op", "allreduce", "--sizes", "64K", "--library-version",
                                "8.1.0", "--db", f"sqlite:///{tmp_path / 's.db'}", "--dry-run")
    assert code == 2 and "not of library cray-mpich (its environments on local:cpu: none)" in " ".join(out.split())
    # in a spec file, the message names its line (as the spec's other fields' do)
    spec = tmp_path / "tune.yaml"
    spec.write_text("site: local\nsystem: local:cpu\nlibrary: openmpi\nenviron: mpich\nop: allreduce\n"
                    f"sizes: [64K]\nlibrary_version: 4.1.4\ndb: sqlite:///{tmp_path / 's.db'}\n")
    code, out = commcamp_output("tune", spec, "--dry-run")
    assert code == 2 and f"{spec}:4: environ: 'mpich' is an environment of mpich" in out, out


def test_an_open_mpi_parameter_file_in_home_stops_the_tune(tmp_path: Path) -> None:
    """$HOME/.openmpi/mca-params.conf (btl = self,tcp, 4 KiB TCP buffers) shaped every trial unseen: the tune said
    "library defaults", measured the TCP path, and published `unset` of the buffers for jobs without the file. It
    stops before any run, naming the file and what it sets; OMPI_MCA_mca_base_param_files (the files named) or
    no such file: the tune goes on."""
    home = tmp_path / "home"
    (home / ".openmpi").mkdir(parents=True)
    (home / ".openmpi" / "mca-params.conf").write_text("# mine\nbtl = self,tcp\nbtl_tcp_sndbuf = 4096\n")
    args = ("tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--op", "allreduce",
            "--sizes", "64K", "--library-version", "4.1.4", "--knobs", "OMPI_MCA_btl_tcp_sndbuf", "--db",
            f"sqlite:///{tmp_path / 's.db'}", "--runs-dir", tmp_path / "runs", "--dry-run")
    code, out = commcamp_output(*args, env={"HOME": str(home)})
    said = " ".join(out.split())
    assert code == 2 and f"{home}/.openmpi/mca-params.conf sets btl, btl_tcp_sndbuf for every Open MPI launch" \
        in said, out
    # the advice holds for what it names: a knob in the environment is stripped like any other, btl is inherited
    assert "(btl_tcp_sndbuf: knobs, which a tune searches or takes from the site's knob defaults and pins); btl " \
        "can be given in the environment (OMPI_MCA_<name>" in said, out
    # a tune of another library launched under Open MPI's mpirun reads the file as well
    ucx = [*args]
    ucx[ucx.index("openmpi")] = "ucx"
    ucx[ucx.index("4.1.4")] = "1.13"
    ucx[ucx.index("OMPI_MCA_btl_tcp_sndbuf")] = "UCX_TLS"
    code, out = commcamp_output(*ucx, "--environ", "openmpi", env={"HOME": str(home)})
    assert code == 2 and "mca-params.conf sets btl, btl_tcp_sndbuf" in " ".join(out.split()), out
    code, out = commcamp_output(*args, env={"HOME": str(home), "OMPI_MCA_mca_base_param_files": "/dev/null",
                                            "OMPI_MCA_btl_tcp_rcvbuf": "8192", "UCX_TLS": "tcp",
                                            "OMPI_MCA_btl_tcp_sndbuf": "4096", "OMPI_MCA_mpi_show_mca_params": "all"})
    assert code == 0, out
    # the knobs this environment set are said to be left out (a site module's UCX_TLS vanished without a word);
    # not the searched knob, nor what the launches set again (the read log's switch)
    (line,) = [line for line in " ".join(out.split()).split("knobs set in this environment, left out of every trial "
                                                           "(the published files unset them): ")[1:]]
    assert {"OMPI_MCA_btl_tcp_rcvbuf=8192", "UCX_TLS=tcp"} <= set(line.split()), out
    assert "OMPI_MCA_btl_tcp_sndbuf" not in line and "show_mca_params" not in line, out


def test_a_version_probe_that_fails_is_not_recorded_as_a_version() -> None:
    """`provenance.slurm` held "sinfo: error: resolve_ctls_from_dns_srv: ..." (its standard error taken as the
    version)."""
    from campaigns.tuning.session import _command_output

    assert _command_output(["sh", "-c", "echo 'sinfo: error: Unknown host' >&2; exit 1"]) == \
        "unavailable: sh -c echo 'sinfo: error: Unknown host' >&2; exit 1 exited 1: sinfo: error: Unknown host"
    assert _command_output(["sh", "-c", "echo slurm 22.05.8"]) == "slurm 22.05.8"
