"""Tuning campaigns: commbench runs as the tuner's evaluator (tuners/README.md, "The evaluator contract").

A trial is one commbench sweep of the study's message sizes with the trial's knob environment applied,
run by an executor:

- `ReframeExecutor`: through the campaign runner (reframe_checks/commbench_run.py on a site's partition:
  `local`, or Slurm on `localslurm`), one ReFrame invocation per trial, knobs via the check's env_vars.
- `LauncherExecutor`: commbench started directly by a launcher command: `mpirun -np 4` on the GPU machine,
  `srun` inside an allocation (commcamp pretune, Slurm tuning workers) or making its own.

Whatever the executor, the environment of a run is the caller's environment WITHOUT any catalog knob
(an inherited NCCL_PROTO must not leak into a trial that leaves it unset), plus the trial's knobs, plus the
library's read-log switches (READ_LOG_ENV; the caller's own values of them dropped): NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=ENV makes NCCL (and RCCL) print every NCCL_* (RCCL_*) variable it took ("NCCL_PROTO set by
environment to LL"), OMPI_MCA_mpi_show_mca_params=enviro makes Open MPI print every MCA parameter it took from the
environment. A knob the library did not read is not credited: the trial is INVALID with the names in its reason (a
typo, a name this version does not know, or a code path this run does not take). A knob at the site's default (or
pinned) value is what the baseline runs too: unread, it is inert on this run's path and does not make the run
invalid (it is named in the evaluation's `unread`, so the tuner takes it out of the search: where its reading depends
on other searched knobs, the catalog's `read_depends_on`, only beside their values). A knob the catalog says changes
nothing in this environment (KnobCatalog.effective_env: at its `unset_equals`, e.g. NCCL_P2P_DISABLE=0, which NCCL
logs only when it is 1; or not read beside another knob's value, `inert_when`, e.g. NCCL_P2P_LEVEL while
NCCL_P2P_DISABLE=1) is neither: the run is what the env says, read or not. Libraries without such a log (MPICH,
UCX, ...) are recorded as unverified in the trial, never silently as read.

Outcomes: the run hung (commbench's watchdog, exit 3, or the executor's hard time limit) = TIMEOUT;
wrong data (a validated record with valid=false: commbench then exits 1) or an unread knob = INVALID;
anything else that is not a clean run = FAILED, with the reason from the records or the launcher's
output. An exit code without such a record is not wrong data (trials run with --no-check): when commbench
never opened its records file the launch failed (launcher or MPI start-up), e.g. `srun: fatal: ...`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import yaml

from campaigns import paths
from campaigns.locks import in_use, keep_in_use
from campaigns.model.records import mpi_library_version, parse_record_lines
from campaigns.subproc import die_with_this_process, stop_processes_in
from tuners.catalog import KnobCatalog, Library, check_safe_value, with_aliases
from tuners.evaluation import Evaluation, EvaluationAborted, FailureKind
from tuners.writers import published_env

RECORDS_FILE = "commbench.jsonl"
OUTPUT_FILE = "output.txt"

# How each library says which variables it took from the environment (None: it does not say).
READ_LOG_ENV: dict[Library, dict[str, str]] = {
    # An empty file name sends each log to the run's output, where the evaluator reads it: a file named by an inherited
    # variable or in the library's config file would take all of it (every knob then reads as unread: invalid trials,
    # knobs out of the search). Config files never outrank the environment. NCCL 2.28.3 with an nccl.conf naming
    # NCCL_DEBUG_FILE: results/reference/single-gpu/nccl-read-log-2026-11-27; Open MPI 4.1.4 with an mca-params.conf
    # naming mpi_show_mca_params_file: checked here (tests/test_tuning.py).
    Library.NCCL: {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV", "NCCL_DEBUG_FILE": ""},
    Library.RCCL: {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV", "NCCL_DEBUG_FILE": ""},
    Library.OPENMPI: {"OMPI_MCA_mpi_show_mca_params": "enviro", "OMPI_MCA_mpi_show_mca_params_file": ""},
}
# NCCL: "NCCL_NVLS_ENABLE set by environment to 0." (params) / "NCCL_PROTO set by environment to LL". RCCL's own
# parameters (RCCL_PARAM, which prefixes RCCL_) log the same line with their RCCL_ name: "RCCL_MSCCL_ENABLE set by
# environment to 0." (before, only NCCL_ names were read: every RCCL_ knob a trial set made it invalid and left the
# search).
_NCCL_READ = re.compile(r"\b((?:NCCL|RCCL)_[A-Z0-9_]+) set by environment to (\S*)")
# Open MPI: "[node1:1234] btl_tcp_sndbuf=4096 (environment)".
_OMPI_READ = re.compile(r"^\[[^\]]*\] ([A-Za-z0-9_]+)=(.*) \(environment\)\s*$", re.MULTILINE)


def knobs_read(library: Library, output: str) -> dict[str, str] | None:
    """The variables the library reports it took, name -> value as printed; None if it has no such log."""
    if library in (Library.NCCL, Library.RCCL):
        return {name: value.rstrip(".") for name, value in _NCCL_READ.findall(output)}
    if library is Library.OPENMPI:
        return {f"OMPI_MCA_{name}": value for name, value in _OMPI_READ.findall(output)}
    return None


def strip_knobs(environ: Mapping[str, str], catalog: KnobCatalog, library: Library) -> dict[str, str]:
    """The caller's environment without any knob that can change a run of `library` (KnobCatalog.affecting), its
    read-log switch (READ_LOG_ENV) or a variable a published recommendation sets for such per-size rules (a loaded
    module of the last tune would run every trial, the defaults' too, under its rules), in every spelling the
    library reads (an MPICH control variable's MPICH_ and MPIR_PARAM_ aliases)."""
    gone = with_aliases(catalog.affecting(library) | READ_LOG_ENV.get(library, {}).keys() | published_env(library))
    return {k: v for k, v in environ.items() if k not in gone}


# How the variables of a library's stack begin, by its catalog knobs' names (Open MPI's OMPI_MCA_, not OMPI_ALLOW_...)
_FAMILY = re.compile(r"OMPI_MCA_|MPIR_CVAR_|MPIR_PARAM_|[A-Z0-9]+_")


def inherited_settings(stripped: Mapping[str, str], catalog: KnobCatalog, library: Library,
                       site: Mapping[str, str]) -> dict[str, str]:
    """What the caller's environment (`stripped`: less the knobs, strip_knobs) still sets for `library` or a layer it
    runs over (UCX_, FI_, ...: the families of its catalog knobs), beyond the site's environment (`site`): no knob,
    so kept, and in every trial. `OMPI_MCA_btl=self,tcp` made TCP buffer sizes matter (x38), and the published files
    said nothing of it: a job without it runs over shared memory, where they change nothing."""
    families = tuple({found.group(0) for name in with_aliases(catalog.affecting(library))
                      if (found := _FAMILY.match(name))})
    inherited = {name: value for name, value in sorted(stripped.items()) if name.startswith(families)
                 and name not in site}
    for name, value in inherited.items():  # written beside the published settings: a newline would be a command
        check_safe_value(value, f"{name} (in this environment, in every trial)")
    return inherited


def user_parameter_file_problem(catalog: KnobCatalog, environ: Mapping[str, str]) -> str | None:
    """Open MPI reads $HOME/.openmpi/mca-params.conf in every launch (unless OMPI_MCA_mca_base_param_files names the
    files): what it sets would shape every trial of a tune launched under Open MPI unseen (`btl = self,tcp` and
    4 KiB TCP buffers measured a path a job without the file never takes, and the published files said the trials
    unset them). None when there is none, else why the tune stops."""
    if "OMPI_MCA_mca_base_param_files" in environ:
        return None
    path = Path(environ.get("HOME") or Path.home()) / ".openmpi" / "mca-params.conf"
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    names = [line.split("=", 1)[0].strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not names:
        return None
    knobs = [name for name in names if f"OMPI_MCA_{name}" in catalog]
    others = [name for name in names if name not in knobs]
    return (f"{path} sets {', '.join(names)} for every Open MPI launch of this user: each trial would run with them, "
            "unseen, and a job without that file does not; move it away"
            + (f" ({', '.join(knobs)}: knobs, which a tune searches or takes from the site's knob defaults and pins)"
               if knobs else "")
            + (f"; {', '.join(others)} can be given in the environment (OMPI_MCA_<name>: the tune names them and says "
               "the result was measured with them)" if others else ""))


# What the per-size sweep needs besides the environment: Open MPI honours an algorithm forced through MPI_T
# only with dynamic rules on, which MPI_T cannot set (bench_src/README.md, "Selection sweep").
SWEEP_ENV: dict[str, dict[str, str]] = {Library.OPENMPI: {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}}


# ----------------------------------------------------------------------------------------------- runs
@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """What one trial measures: commbench's op, transport and sizes, and how long it may take."""

    op: str
    transport: str
    sizes: tuple[int, ...]
    warmup: int = 2
    iters: int = 10
    batch: int = 1
    bench_timeout_s: int = 60  # commbench's watchdog: the longest one step may take
    time_limit_s: int = 300  # the whole run's hard limit (the launcher is killed, the Slurm job ends)
    selection_rounds: int = 0  # > 0: the per-size stage's sweep (commbench --selections all --rounds N)
    stop_slower: float = 0  # > 0: the sweep stops a selection this many times slower than own (--stop-slower)
    stop_after: int = 4  # ... judged on the even rounds 0, 2, ..., 2 x stop_after - 2 (--stop-after)
    ranks: int | None = None  # the ranks the scope's job has (nodes x tasks per node); None: not checked

    @property
    def stops_selections(self) -> bool:
        """Whether the sweep runs the stop rule: a sweep shorter than 2 x stop_after rounds reaches no judgement
        (commbench refuses the rule there)."""
        return bool(self.selection_rounds and self.stop_slower and self.selection_rounds >= 2 * self.stop_after)

    def selection_args(self) -> list[str]:
        if not self.selection_rounds:
            return []
        stop = (["--stop-slower", repr(float(self.stop_slower)), "--stop-after", str(self.stop_after)]
                if self.stops_selections else [])
        return ["--selections", "all", "--rounds", str(self.selection_rounds), *stop]

    def commbench_args(self, validate: bool, output: Path) -> list[str]:
        return ["--op", self.op, "--transport", self.transport, "--sizes", ",".join(map(str, self.sizes)),
                "--warmup", str(self.warmup), "--iters", str(self.iters), "--batch", str(self.batch),
                "--timeout", str(self.bench_timeout_s), "--check" if validate else "--no-check",
                "--output", str(output), *self.selection_args()]


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What an executor saw of one commbench run."""

    records: list[dict[str, Any]]
    output: str  # launcher / job output: where the libraries' read logs are
    exit_code: int | None  # commbench's exit code; None when unknown
    timed_out: bool = False
    failure: str | None = None  # the executor's own reason (launch error, ReFrame failure)
    directory: Path | None = None
    launched: bool = True  # commbench got past MPI start-up: it opens its records file right after MPI_Init


class Executor(Protocol):
    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome: ...


def _read_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    if not path.is_file():
        return [], []
    return parse_record_lines(path.read_text(encoding="utf-8", errors="replace"), path.name)


# What new_directory (and `tune --workers`, tune-workers-<stamp>) names: `commcamp results prune` takes these as
# run directories beside the campaigns' (campaigns.reframe.runner.RUN_DIR_NAME).
TUNING_DIR_NAME = re.compile(r"[a-z][a-z-]*-\d{8}T\d{6}(-[0-9a-f]{6})?")


def new_directory(parent: Path, label: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = parent / f"{label}-{stamp}-{uuid.uuid4().hex[:6]}"
    try:
        path.mkdir(parents=True)
    except OSError as exc:  # a full or read-only runs directory is not the trial's setting's fault
        raise EvaluationAborted(f"cannot create a run directory under {parent}: {exc.strerror or exc}") from exc
    return path


class LauncherExecutor:
    """commbench under a launcher command (`mpirun -np 4`, `srun --mpi=pmix -N2 -n4`), in its own process
    group so that the hard time limit kills the whole launch."""

    def __init__(self, launcher: Sequence[str], commbench: Path, runs_dir: Path, base_env: Mapping[str, str]) -> None:
        if not launcher:
            raise ValueError("the launcher command is empty")
        if not Path(commbench).is_file() or not os.access(commbench, os.X_OK):  # a directory passes X_OK
            what = "is a directory" if Path(commbench).is_dir() else "does not exist or is not executable"
            raise ValueError(f"--commbench {commbench}: the commbench binary {what} (give the executable file)")
        self.launcher = list(launcher)
        self.commbench = Path(commbench)
        self.runs_dir = runs_dir
        self.base_env = dict(base_env)

    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome:
        directory = new_directory(self.runs_dir, "run")
        with in_use(directory):  # `results prune` keeps it while the run writes it
            return self._run_in(directory, env, request, validate)

    def _run_in(self, directory: Path, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome:
        records_path = directory / RECORDS_FILE
        cmd = [*self.launcher, str(self.commbench), *request.commbench_args(validate, records_path)]
        (directory / "command.txt").write_text(
            " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + " " + shlex.join(cmd) + "\n")
        with open(directory / OUTPUT_FILE, "w+", encoding="utf-8", errors="replace") as log:
            try:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**self.base_env, **env},
                                        cwd=directory, start_new_session=True, preexec_fn=die_with_this_process())
            except OSError as exc:
                return RunOutcome([], "", None, failure=f"cannot start {shlex.join(self.launcher)}: {exc}",
                                  directory=directory)
            code = _wait(proc, request.time_limit_s)
            timed_out = code is None
            log.seek(0)
            output = log.read()
        records, problems = _read_records(records_path)
        failure = f"{len(problems)} invalid record line(s), first: {problems[0]}" if problems else None
        if timed_out:
            failure = f"killed at the hard time limit of {request.time_limit_s} s"
        return RunOutcome(records, output, code, timed_out, failure, directory, launched=records_path.exists())


def _wait(proc: subprocess.Popen[Any], timeout_s: float) -> int | None:
    """The exit code of `proc` (started in a session of its own); None when it ran past `timeout_s`. Past
    it, or when commcamp is interrupted (Ctrl-C, SIGTERM), its process group is stopped before we go on."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return None
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


# commbench check sanity messages (reframe_checks/lib/commbench_tests.py) -> what happened.
_RFM_EXIT = re.compile(r"commbench exited with code (\d+)")


class ReframeExecutor:
    """One ReFrame invocation of the commbench check per run, on one partition and environment of a
    site, with the knobs as the check's env_vars (campaigns.reframe.runner builds the command and reads back
    the test case's outcome and records). commbench is built once: the first passing run keeps its
    stage files and later runs restore that build (ReFrame's --restore-session)."""

    def __init__(self, site: str, system: str, environ: str, nodes: int, tasks_per_node: int,
                 runs_dir: Path, base_env: Mapping[str, str], *, queue_wait_s: float = 1800,
                 inherited: Mapping[str, str] | None = None) -> None:
        from campaigns.model.spec import SpecError, load_campaign  # ReFrame path only: keeps the GPU driver light

        if nodes not in (1, 2):
            raise ValueError(f"the ReFrame commbench check runs on 1 or 2 nodes, not {nodes}")
        self.runs_dir = runs_dir
        self.base_env = dict(base_env)
        # inherited_settings go into the job script beside the knobs: a partition whose jobs start with
        # `--export=NONE` would run the trials without them, while the published files say measured with them
        self.inherited = dict(inherited or {})
        self.queue_wait_s = queue_wait_s
        self.spec_text = yaml.safe_dump({
            "name": "tune", "site": site, "system": system, "environments": [environ], "node_counts": [nodes],
            "checks": [{"check": "commbench_run", "ops": ["allreduce"], "tasks_per_node": tasks_per_node}]})
        with tempfile.TemporaryDirectory() as scratch:  # checked now; the run directory is made by the first run
            spec_path = Path(scratch) / "campaign.yaml"
            spec_path.write_text(self.spec_text)
            try:
                self.campaign = load_campaign(spec_path)
            except SpecError as exc:
                raise ValueError(str(exc)) from None
        self.directory: Path | None = None
        self.count = 0
        self.built: Path | None = None  # report of the run whose build later runs restore

    def case_for(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> Any:
        """The trial's test case: the site's case of this scope with the request's check variables and the
        knobs, beside the inherited settings, as its env."""
        from campaigns.model.spec import CommbenchCheckSpec

        (base,) = self.campaign.cases()
        extra = (["--batch", str(request.batch)] if request.batch > 1 else []) + request.selection_args()
        check = CommbenchCheckSpec(
            check=base.check, ops=[request.op], sizes=list(request.sizes), warmup=request.warmup,
            iters=request.iters, timeout_s=request.bench_timeout_s, time_limit_s=request.time_limit_s,
            check_data=validate, transports=[request.transport], extra_args=extra)
        return dataclasses.replace(base, op=request.op, variables=tuple(check.variables(request.transport).items()),
                                   env=tuple(sorted({**self.inherited, **env}.items())))

    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome:
        from campaigns.reframe.runner import REFRAME_LOG, REPORT_FILE, case_outcome, plan_invocations, report_testcases

        if self.directory is None:
            self.directory = new_directory(self.runs_dir, "reframe")
            keep_in_use(self.directory)  # later runs restore the first one's build from it
            (self.directory / "campaign.yaml").write_text(self.spec_text)
            self.campaign = dataclasses.replace(self.campaign, path=self.directory / "campaign.yaml")
        self.count += 1
        case = self.case_for(env, request, validate)
        (invocation,) = plan_invocations([case])
        prefix = self.directory / f"rfm-{self.count}"
        prefix.mkdir()
        cmd = invocation.command(prefix)
        # The first run keeps its build (stage files); later runs restore it instead of building again.
        extra = ["--restore-session", str(self.built)] if self.built else ["--keep-stage-files"]
        with open(prefix / REFRAME_LOG, "w", encoding="utf-8") as log:
            # A session of its own, stopped by SIGTERM first: ReFrame then cancels its job (a Slurm job would
            # run on after a SIGKILL), and a terminal's Ctrl-C does not reach it twice.
            proc = subprocess.Popen([*cmd[:-1], *extra, cmd[-1]], stdout=log, stderr=subprocess.STDOUT, cwd=prefix,
                                    env={**self.base_env, **paths.subprocess_env(), "TMPDIR": str(prefix)},
                                    start_new_session=True, preexec_fn=die_with_this_process())
            # A run that hangs ends at commbench's watchdog or the job's time limit, both in ReFrame's report. This
            # limit also counts the job's wait in the queue and the build: past it nothing says the setting hung.
            try:
                rc = _wait(proc, request.time_limit_s + self.queue_wait_s)
            finally:  # stopped or done: no build of its local scheduler (a session of its own) works on in the prefix
                stop_processes_in(prefix)
            if rc is None:
                raise EvaluationAborted(
                    f"ReFrame did not finish within the run's time limit ({request.time_limit_s} s) + queue_wait_s "
                    f"({self.queue_wait_s:.0f} s): its job waited in the queue or built that long, or ReFrame hung "
                    f"({prefix / REFRAME_LOG}); not charged to the setting")
        report = prefix / REPORT_FILE
        if self.built and "could not restore" in (prefix / REFRAME_LOG).read_text(errors="replace"):
            self.built = None  # the kept build is gone: build again
            return self.run(env, request, validate)
        result, records = case_outcome(case, report_testcases(report) if report.is_file() else [], rc, prefix)
        if self.built is None and result.status == "pass":
            self.built = report
        output = ""
        if result.directory is not None:
            output = "".join(p.read_text(errors="replace") for p in sorted(result.directory.glob("rfm_job.*"))
                             if p.suffix in (".out", ".err"))
        if result.status == "pass":
            return RunOutcome(records, output, 0, directory=result.directory)
        reason = result.reason or f"ReFrame status {result.status}"
        match = _RFM_EXIT.search(reason)
        exit_code = int(match.group(1)) if match else None
        timed_out = "hit its time limit" in reason or exit_code == 3
        return RunOutcome(records, output, exit_code, timed_out, reason, result.directory or prefix)


# ----------------------------------------------------------------------------------------- evaluator
def library_version(records: Sequence[Mapping[str, Any]], library: Library) -> str | None:
    """The version a run's records name for `library` (NCCL/RCCL from `versions`, MPIs from
    `mpi_library`)."""
    for record in records:
        versions = record.get("versions") or {}
        if library in (Library.NCCL, Library.RCCL) and versions.get(library.value):
            return str(versions[library.value])
        version = mpi_library_version(record.get("mpi_library") or "", library.value)
        if version is not None:
            return version
    return None


class CommbenchEvaluator:
    """The tuner's evaluator: one commbench run per call through `executor`, judged as the module
    docstring says. `exempt` knobs are not held to the read-log check (recorded as unverified). `version`: the
    scope's version of `library`; a run whose records name another stops the tune (None: not checked).
    `launch_context`: what the executor sets besides a trial's env (SearchSpace.launch_context), beside which the
    catalog judges which knobs leave the run unchanged."""

    def __init__(self, executor: Executor, request: BenchRequest, library: Library, catalog: KnobCatalog,
                 *, exempt: frozenset[str] = frozenset(), ingest: Any = None, version: str | None = None,
                 launch_context: Mapping[str, str] | None = None) -> None:
        self.executor = executor
        self.request = request
        self.library = library
        self.version = version
        self.catalog = catalog
        self.exempt = exempt
        self.launch_context = dict(launch_context or {})
        # What the baseline sets (site defaults, pinned values, their companions): such a knob unread changes nothing
        # against the baseline (e.g. Leonardo's NCCL_IB_SL=1 on a path without InfiniBand), so it fails no run.
        defaults = catalog.default_env()
        self.baseline = {**{k: v for name in defaults for k, v in catalog[name].requires.items()}, **defaults}
        self.ingest = ingest  # callable(env, outcome, evaluation) -> record ids, or None
        self.durations_s: list[float] = []
        self.run_done: Callable[[], None] | None = None  # called after each run (finalization's progress lines)

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        started = time.monotonic()
        outcome = self.executor.run({**env, **READ_LOG_ENV.get(self.library, {})}, self.request, validate)
        self.durations_s.append(time.monotonic() - started)
        if self.run_done is not None:
            self.run_done()
        evaluation = self.judge(env, outcome, validate)
        jobs = {r["slurm_job_id"] for r in outcome.records if r.get("slurm_job_id")}
        if len(jobs) == 1:
            evaluation = dataclasses.replace(evaluation, allocation=jobs.pop())
        if self.ingest is not None:
            ids = self.ingest(env, outcome, evaluation)
            evaluation = dataclasses.replace(evaluation, record_ids=tuple(ids))
        return evaluation

    def unread(self, env: Mapping[str, str], output: str) -> list[str] | None:
        """Knobs of this library set in env that its read log does not show; None = no read log."""
        read = knobs_read(self.library, output)
        if read is None:
            return None
        mine = [name for name in env if name in self.catalog and self.library in self.catalog[name].libraries]
        return [name for name in mine if name not in read and name not in self.exempt]

    def judge(self, env: Mapping[str, str], outcome: RunOutcome, validate: bool) -> Evaluation:
        results = [r for r in outcome.records if r["kind"] == "result" and r["op"] == self.request.op]
        errors = [r for r in outcome.records if r["kind"] == "error"]
        tail = output_tail(outcome.output)
        where = f" (run directory {outcome.directory})" if outcome.directory else ""
        ranks = {r["ranks"] for r in outcome.records if "ranks" in r}
        if self.request.ranks is not None and ranks - {self.request.ranks}:
            # Every run would measure another job than the scope's (a launcher without its -n / -np / -N): stop.
            # Nodes are not compared: one host may stand in for several (the GPU demos' emulated network path).
            raise EvaluationAborted(
                f"the launcher started {', '.join(map(str, sorted(ranks)))} rank(s), the scope's job has "
                f"{self.request.ranks} (nodes x tasks_per_node): give a launcher that starts them (e.g. srun -N "
                f"NODES -n {self.request.ranks}, mpirun -np {self.request.ranks}){where}")
        measured = library_version(outcome.records, self.library) if self.version is not None else None
        if measured is not None and measured != self.version:
            # the scope's version was given, not read: the recommendation would be published for another library
            raise EvaluationAborted(
                f"library_version {self.version}: commbench's records name {self.library} {measured}, the library "
                f"it ran with; give that version, or none (a probe run reads it){where}")
        if outcome.timed_out or outcome.exit_code == 3 or any(r.get("reason") == "timeout" for r in errors):
            detail = outcome.failure or next((r["error"] for r in errors), "commbench's watchdog fired (exit 3)")
            return Evaluation.failed(FailureKind.TIMEOUT, f"hung: {detail}{where}")
        # Wrong data is what commbench's validation reported, never an exit code alone (a launcher exits 1 too).
        wrong = [f"{r['bytes']} B: {r.get('wrong_elements')} wrong" for r in results if not r["valid"]]
        if wrong:
            return Evaluation.failed(FailureKind.INVALID, f"data validation failed ({'; '.join(wrong)}){where}")
        if errors:
            first = errors[0]
            return Evaluation.failed(FailureKind.FAILED,
                                     f"commbench error record ({first.get('reason')}): {first.get('error')}{where}")
        if outcome.failure:
            return Evaluation.failed(FailureKind.FAILED, f"{outcome.failure}{where}; output ends: {tail}")
        if not outcome.launched:
            lines = output_lines(outcome.output)
            more = f"; output ends: {tail}" if len(lines) > 1 else ""  # e.g. the box mpirun prints
            return Evaluation.failed(FailureKind.FAILED, f"the launch failed (exit {outcome.exit_code}): "
                                                         f"{lines[-1] if lines else '(no output)'}{where}{more}")
        if outcome.exit_code != 0:
            return Evaluation.failed(FailureKind.FAILED,
                                     f"commbench exited with code {outcome.exit_code}{where}; output ends: {tail}")
        # A knob the catalog says leaves this run unchanged (KnobCatalog.effective_env: set to its unset_equals, e.g.
        # NCCL_P2P_DISABLE=0, which NCCL's ncclGetLevel logs only when it is 1; or not read beside another knob's
        # value, inert_when / inert_unless_set) runs as the env says whether or not the log shows it: unread, it is
        # no reason to fail the run, nor to take the knob out of the search.
        context = {k: v for k, v in self.launch_context.items() if k not in env}
        runs = self.catalog.effective_env({**context, **env})
        unread = [name for name in self.unread(env, outcome.output) or [] if name in runs]
        changed = [name for name in unread if env[name] != self.baseline.get(name)]
        if changed:
            return Evaluation.failed(
                FailureKind.INVALID,
                f"{self.library} did not report reading {', '.join(changed)} (read log "
                f"{' '.join(f'{k}={v}' for k, v in READ_LOG_ENV[self.library].items())}): a name this version "
                f"does not know, or a code path this run does not take; not credited{where}", unread=unread)
        times = {int(r.get("requested_bytes", r["bytes"])): r["samples_us"] for r in results
                 if r["bytes"] > 0 and min(r["samples_us"], default=0) > 0}
        if not times:
            return Evaluation.failed(FailureKind.FAILED, f"no result records for op {self.request.op}{where}")
        checked = bool(results) and all(r.get("check") and r["valid"] for r in results)
        return Evaluation(times_us=times, validated=validate and checked, unread=tuple(unread))


def output_lines(text: str) -> list[str]:
    """A run's output without blank lines and without the rules of the boxes launchers print."""
    return [line.strip() for line in text.strip().splitlines() if line.strip().strip("-")]


def output_tail(text: str, limit: int = 1200) -> str:
    """The end of a run's output for a failure reason (launchers add a box of their own after the
    program's last words: keep enough lines to include those)."""
    return " | ".join(output_lines(text)[-15:])[-limit:] or "(no output)"
