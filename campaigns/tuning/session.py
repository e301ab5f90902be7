"""Tuning campaigns: commbench runs as the tuner's evaluator (tuners/README.md, "The evaluator contract").

A trial is one commbench sweep of the study's message sizes with the trial's knob environment applied,
run by an executor:

- `ReframeExecutor`: through the campaign runner (reframe_checks/commbench_run.py on a site's partition:
  `local`, or Slurm on `localslurm`), one ReFrame invocation per trial, knobs via the check's env_vars.
- `LauncherExecutor`: commbench started directly by a launcher command: `mpirun -np 4` on the GPU machine,
  `srun` inside an allocation (commcamp pretune, Slurm tuning workers) or making its own.

Whatever the executor, the environment of a run is the caller's environment WITHOUT any catalog knob
(an inherited NCCL_PROTO must not leak into a trial that leaves it unset), plus the trial's knobs, plus
the library's read-log switch: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV makes NCCL print every NCCL_*
variable it took ("NCCL_PROTO set by environment to LL"), OMPI_MCA_mpi_show_mca_params=enviro makes
Open MPI print every MCA parameter it took from the environment. A knob the library did not read is not
credited: the trial is INVALID with the names in its reason (a typo, a name this version does not know,
or a code path this run does not take). Libraries without such a log (MPICH, UCX, ...) are recorded as
unverified in the trial, never silently as read.

Outcomes: the run hung (commbench's watchdog, exit 3, or the executor's hard time limit) = TIMEOUT;
wrong data (exit 1, a record with valid=false) or an unread knob = INVALID; anything else that is not a
clean run = FAILED, with the reason from the records or the launcher's output.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from campaigns import paths
from campaigns.model.records import MAX_MESSAGE_BYTES, parse_record_lines
from campaigns.model.sizes import parse_size
from campaigns.subproc import die_with_this_process
from tuners.catalog import KnobCatalog, Library
from tuners.evaluation import Evaluation, EvaluationAborted, FailureKind, SizeBucket, buckets_for_sizes
from tuners.finalize import Candidate, FinalReport, Thresholds, finalize, planned_rounds
from tuners.per_size import PerSizeResult, decide_per_size, load_sweep, rounds_for
from tuners.recommendation import Recommendation, build_recommendation, with_per_size
from tuners.scope import StudyScope
from tuners.space import SearchSpace, SpaceError, build_space, check_knob_names
from tuners.study import SamplerName, Tuner, check_reachable, finalization_candidates, open_storage
from tuners.writers import PublishedFiles, env_file_text, publish, write_atomic

RECORDS_FILE = "commbench.jsonl"
OUTPUT_FILE = "output.txt"

# How each library says which variables it took from the environment (None: it does not say).
READ_LOG_ENV: dict[Library, dict[str, str]] = {
    Library.NCCL: {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV"},
    Library.RCCL: {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV"},
    Library.OPENMPI: {"OMPI_MCA_mpi_show_mca_params": "enviro"},
}
# NCCL: "NCCL_NVLS_ENABLE set by environment to 0." (params) / "NCCL_PROTO set by environment to LL".
_NCCL_READ = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to (\S*)")
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
    """The caller's environment without any catalog knob or read-log switch."""
    switches = set(READ_LOG_ENV.get(library, {}))
    return {k: v for k, v in environ.items() if k not in catalog and k not in switches}


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

    def selection_args(self) -> list[str]:
        return ["--selections", "all", "--rounds", str(self.selection_rounds)] if self.selection_rounds else []

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


class Executor(Protocol):
    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome: ...


def _read_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    if not path.is_file():
        return [], []
    return parse_record_lines(path.read_text(encoding="utf-8", errors="replace"), path.name)


def _new_directory(parent: Path, label: str) -> Path:
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
        if not os.access(commbench, os.X_OK):
            raise ValueError(f"commbench binary {commbench} does not exist or is not executable")
        self.launcher = list(launcher)
        self.commbench = Path(commbench)
        self.runs_dir = runs_dir
        self.base_env = dict(base_env)

    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome:
        directory = _new_directory(self.runs_dir, "run")
        records_path = directory / RECORDS_FILE
        cmd = [*self.launcher, str(self.commbench), *request.commbench_args(validate, records_path)]
        (directory / "command.txt").write_text(
            " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + " " + shlex.join(cmd) + "\n")
        timed_out = False
        with open(directory / OUTPUT_FILE, "w+", encoding="utf-8", errors="replace") as log:
            try:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**self.base_env, **env},
                                        cwd=directory, start_new_session=True, preexec_fn=die_with_this_process())
            except OSError as exc:
                return RunOutcome([], "", None, failure=f"cannot start {shlex.join(self.launcher)}: {exc}",
                                  directory=directory)
            try:
                code: int | None = proc.wait(timeout=request.time_limit_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                code = None
            log.seek(0)
            output = log.read()
        records, problems = _read_records(records_path)
        failure = f"{len(problems)} invalid record line(s), first: {problems[0]}" if problems else None
        if timed_out:
            failure = f"killed at the hard time limit of {request.time_limit_s} s"
        return RunOutcome(records, output, code, timed_out, failure, directory)


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
                 runs_dir: Path, base_env: Mapping[str, str]) -> None:
        from campaigns.model.spec import SpecError, load_campaign  # ReFrame path only: keeps the GPU driver light

        if nodes not in (1, 2):
            raise ValueError(f"the ReFrame commbench check runs on 1 or 2 nodes, not {nodes}")
        self.runs_dir = runs_dir
        self.base_env = dict(base_env)
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

    def campaign_for(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> Any:
        from campaigns.model.spec import Campaign

        check = self.campaign.spec.checks[0]
        extra = (["--batch", str(request.batch)] if request.batch > 1 else []) + request.selection_args()
        check = check.model_copy(update={
            "ops": [request.op], "sizes": list(request.sizes), "warmup": request.warmup, "iters": request.iters,
            "timeout_s": request.bench_timeout_s, "time_limit_s": request.time_limit_s, "check_data": validate,
            "transports": [request.transport], "env": dict(env), "extra_args": extra})
        spec = self.campaign.spec.model_copy(update={"checks": [check]})
        campaign: Campaign = dataclasses.replace(self.campaign, spec=spec)
        return campaign

    def run(self, env: Mapping[str, str], request: BenchRequest, validate: bool) -> RunOutcome:
        from campaigns.reframe.runner import REFRAME_LOG, REPORT_FILE, case_outcome, plan_invocations, report_testcases

        if self.directory is None:
            self.directory = _new_directory(self.runs_dir, "reframe")
            (self.directory / "campaign.yaml").write_text(self.spec_text)
            self.campaign = dataclasses.replace(self.campaign, path=self.directory / "campaign.yaml")
        self.count += 1
        campaign = self.campaign_for(env, request, validate)
        (case,) = campaign.cases()
        (invocation,) = plan_invocations([case])
        prefix = self.directory / f"rfm-{self.count}"
        prefix.mkdir()
        cmd = invocation.command(campaign, prefix)
        # The first run keeps its build (stage files); later runs restore it instead of building again.
        extra = ["--restore-session", str(self.built)] if self.built else ["--keep-stage-files"]
        with open(prefix / REFRAME_LOG, "w", encoding="utf-8") as log:
            try:
                rc = subprocess.run([*cmd[:-1], *extra, cmd[-1]], stdout=log, stderr=subprocess.STDOUT,
                                    cwd=prefix, env={**self.base_env, **paths.subprocess_env(), "TMPDIR": str(prefix)},
                                    timeout=request.time_limit_s + 120, check=False,
                                    preexec_fn=die_with_this_process()).returncode
            except subprocess.TimeoutExpired:
                return RunOutcome([], "", None, True, "ReFrame did not finish within the time limit + 120 s",
                                  prefix)
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
class CommbenchEvaluator:
    """The tuner's evaluator: one commbench run per call through `executor`, judged as the module
    docstring says. `exempt` knobs are not held to the read-log check (recorded as unverified)."""

    def __init__(self, executor: Executor, request: BenchRequest, library: Library, catalog: KnobCatalog,
                 *, exempt: frozenset[str] = frozenset(), ingest: Any = None) -> None:
        self.executor = executor
        self.request = request
        self.library = library
        self.catalog = catalog
        self.exempt = exempt
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
        tail = _tail(outcome.output)
        where = f" (run directory {outcome.directory})" if outcome.directory else ""
        if outcome.timed_out or outcome.exit_code == 3 or any(r.get("reason") == "timeout" for r in errors):
            detail = outcome.failure or next((r["error"] for r in errors), "commbench's watchdog fired (exit 3)")
            return Evaluation.failed(FailureKind.TIMEOUT, f"hung: {detail}{where}")
        wrong = [f"{r['bytes']} B: {r.get('wrong_elements')} wrong" for r in results if not r["valid"]]
        if outcome.exit_code == 1 or wrong:
            return Evaluation.failed(FailureKind.INVALID,
                                     f"data validation failed ({'; '.join(wrong) or 'exit code 1'}){where}")
        if errors:
            first = errors[0]
            return Evaluation.failed(FailureKind.FAILED,
                                     f"commbench error record ({first.get('reason')}): {first.get('error')}{where}")
        if outcome.failure or outcome.exit_code != 0:
            reason = outcome.failure or f"exit code {outcome.exit_code}"
            return Evaluation.failed(FailureKind.FAILED, f"{reason}{where}; output ends: {tail}")
        unread = self.unread(env, outcome.output)
        if unread:
            return Evaluation.failed(
                FailureKind.INVALID,
                f"{self.library} did not report reading {', '.join(unread)} (read log "
                f"{' '.join(f'{k}={v}' for k, v in READ_LOG_ENV[self.library].items())}): a name this version "
                f"does not know, or a code path this run does not take; not credited{where}")
        times = {int(r.get("requested_bytes", r["bytes"])): r["samples_us"] for r in results
                 if r["bytes"] > 0 and min(r["samples_us"], default=0) > 0}
        if not times:
            return Evaluation.failed(FailureKind.FAILED, f"no result records for op {self.request.op}{where}")
        checked = bool(results) and all(r.get("check") and r["valid"] for r in results)
        return Evaluation(times_us=times, validated=validate and checked)


def _tail(text: str, limit: int = 1200) -> str:
    """The end of a run's output for a failure reason (launchers add a box of their own after the
    program's last words: keep enough lines to include those, drop the box's rules)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip().strip("-")][-15:]
    return " | ".join(lines)[-limit:] or "(no output)"


# ------------------------------------------------------------------------------------------- the spec
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FinalizeSpec(_Model):
    """Finalization (tuners/finalize.py): re-measure the best candidates interleaved with the baseline."""

    enabled: bool = True
    candidates: int = Field(default=2, ge=1, le=6, description="k best distinct settings re-measured")
    max_candidates: int | None = Field(default=None, ge=1, description=(
        "cap on all candidates: the k best, then each size bucket's best, then the simplified best"))
    alpha: float = Field(default=0.01, gt=0, lt=0.5, description=(
        "family-wise: Holm over all tests of a finalization (candidates x (overall + each size bucket))"))
    min_effect: float = Field(default=0.03, ge=0)
    rounds: int = Field(default=10, ge=2, description="at least; raised to what the family needs")

    def thresholds(self) -> Thresholds:
        return Thresholds(alpha=self.alpha, min_effect=self.min_effect, rounds=self.rounds)


class PerSizeSpec(_Model):
    """The per-size stage (tuners/per_size.py) after finalization, under the recommended environment."""

    enabled: bool = False
    top: int = Field(default=3, ge=1, description="candidates per size, picked on the sweep's even rounds")
    rounds: int = Field(default=0, ge=0, description="sweep rounds; 0: the fewest with which a change is possible")
    time_limit_s: int = Field(default=600, ge=10, description="the sweep run's hard limit")


class TuningSpec(_Model):
    """One tuning study: where and what commbench measures, which knobs, the budget, the outputs.
    YAML (`commcamp tune SPEC.yaml`) or CLI options (`commcamp tune --site ... --op ...`)."""

    site: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
    system: str = Field(description="system:partition, or a system of one partition (ReFrame executor: a "
                                    "partition of the site)")
    environ: str = Field(default="openmpi", description="programming environment (ReFrame) / MPI of the binary")
    library: Library
    library_version: str | None = Field(default=None, description="None: read from a probe run's records")
    op: str
    transport: Literal["mpi", "ccl"] = "mpi"
    nodes: int = Field(default=1, ge=1)
    tasks_per_node: int = Field(default=2, ge=1)
    gpus_per_node: int = Field(default=1, ge=1, description="the scope's GPUs per node (1 on CPU partitions)")
    sizes: list[int] = Field(min_length=1)
    sizes_per_bucket: int = Field(default=2, ge=1)
    warmup: int = Field(default=2, ge=0)
    iters: int = Field(default=10, ge=1)
    batch: int = Field(default=1, ge=1)
    bench_timeout_s: int = Field(default=60, ge=1)
    time_limit_s: int = Field(default=300, ge=10)
    knobs: list[str] | None = Field(default=None, description="None: every catalog knob that applies")
    knob_overrides: list[Path] = Field(default=[], description="more knob override files (defaults, pins)")
    unverifiable_knobs: list[str] = Field(default=[], description="knobs exempt from the read-log check")
    trials: int | None = Field(default=20, ge=1)
    budget_s: float | None = Field(default=None, gt=0, description="wall-time budget of the trial phase")
    sampler: SamplerName = SamplerName.TPE
    seed: int | None = 0
    n_startup_trials: int = Field(default=4, ge=1)
    seed_library_defaults: bool = Field(default=True, description="trial 1 = every searched knob unset")
    executor: Literal["reframe", "launcher"] = "reframe"
    launcher: list[str] | None = Field(default=None, description="launcher executor: command before commbench")
    commbench: Path | None = Field(default=None, description="launcher executor: the binary")
    db: str | None = Field(default=None, description="Optuna storage URL (default: the results database)")
    study: str | None = Field(default=None, min_length=1, description=(
        "study name (default: the scope's name + the executor and a digest of the knobs and knob files)"))
    heartbeat_s: int = Field(default=60, ge=1, description="a worker's trial is lost after 2 heartbeats of silence")
    finalize: FinalizeSpec = FinalizeSpec()
    per_size: PerSizeSpec = PerSizeSpec()
    publish_dir: Path | None = Field(default_factory=paths.recommendations_dir, description="None: do not publish")
    plugin_library: Path | None = None
    runs_dir: Path = Field(default_factory=paths.runs_dir)

    @field_validator("sizes", mode="before")
    @classmethod
    def _sizes(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list):
            return value
        sizes = sorted({parse_size(v) for v in value})
        outside = [size for size in sizes if not 1 <= size <= MAX_MESSAGE_BYTES]
        if outside:
            raise ValueError(f"sizes {outside} outside 1 B .. 1 TiB (what commbench measures)")
        return sizes

    @model_validator(mode="before")
    @classmethod
    def _partition(cls, data: Any) -> Any:
        """`system` without `:partition` names the system's only partition (the site's site.yaml)."""
        if isinstance(data, dict) and isinstance(data.get("system"), str) and ":" not in data["system"] \
                and isinstance(data.get("site"), str):
            return {**data, "system": only_partition(data["site"], data["system"])}
        return data

    @field_validator("op")
    @classmethod
    def _op(cls, value: str) -> str:
        from campaigns.model.site import ALL_OPS

        if value not in ALL_OPS:
            raise ValueError(f"{value!r} is not a commbench op (one of: {', '.join(ALL_OPS)})")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TuningSpec:
        if ":" not in self.system:
            raise ValueError(f"system {self.system!r} must be system:partition (or a system of site.yaml with "
                         "one partition)")
        if self.trials is None and self.budget_s is None:
            raise ValueError("give a budget: trials and/or budget_s")
        if self.executor == "reframe" and self.transport != "mpi":
            raise ValueError("the ReFrame commbench check runs transport mpi; use the launcher executor for ccl")
        if self.executor == "launcher" and self.launcher is None:
            raise ValueError("the launcher executor needs `launcher` (e.g. [mpirun, -np, '4'])")
        return self

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    def request(self) -> BenchRequest:
        return BenchRequest(self.op, self.transport, tuple(self.sizes), self.warmup, self.iters, self.batch,
                            self.bench_timeout_s, self.time_limit_s)

    def storage_url(self) -> str:
        from campaigns.store import default_url  # lazily: the store pulls in alembic

        return self.db or default_url()


def load_spec(path: Path, **overrides: Any) -> TuningSpec:
    from campaigns.model.yamlio import YamlDocument, YamlModelError

    try:
        document = YamlDocument(Path(path))
        spec = document.validate(TuningSpec)
    except YamlModelError as exc:
        raise ValueError(str(exc)) from None
    return spec.model_copy(update={k: v for k, v in overrides.items() if v is not None}) if overrides else spec


def site_catalog(spec: TuningSpec) -> tuple[KnobCatalog, list[str]]:
    """The base catalog with the site's knob overrides (the `knobs:` of its site.yaml, or
    site_configs/knobs/<site>.yaml for a site without one) and the spec's override files applied in
    order; also the files used."""
    site = _site(spec)
    catalog = KnobCatalog.load() if site is None else site.knob_catalog()
    files = [str(site.directory / "site.yaml")] if site is not None and site.knobs else []
    extra = [p for p in [paths.KNOBS_DIR / f"{spec.site}.yaml"] if site is None and p.is_file()]
    for path in [*extra, *(Path(p) for p in spec.knob_overrides)]:
        try:
            overrides = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{path}: cannot read knob overrides: {exc}") from exc
        catalog = catalog.for_site(overrides, str(path))
        files.append(str(path))
    return catalog, files


def library_version(records: Sequence[Mapping[str, Any]], library: Library) -> str | None:
    """The version a run's records name for `library` (NCCL/RCCL from `versions`, MPIs from
    `mpi_library`)."""
    for record in records:
        versions = record.get("versions") or {}
        if library in (Library.NCCL, Library.RCCL) and versions.get(library.value):
            return str(versions[library.value])
        text = record.get("mpi_library") or ""
        if library is Library.OPENMPI and "Open MPI" in text:
            match = re.search(r"v(\d+\.\d+\.\d+)", text)
            return match.group(1) if match else None
        if library is Library.MPICH and "MPICH" in text:
            match = re.search(r"Version:\s*(\d+\.\d+(?:\.\d+)?)", text)
            return match.group(1) if match else None
    return None


# --------------------------------------------------------------------------------------- the workflow
@dataclasses.dataclass
class TuningSetup:
    spec: TuningSpec
    catalog: KnobCatalog
    knob_files: list[str]
    space: SearchSpace
    scope: StudyScope
    buckets: tuple[SizeBucket, ...]
    evaluator: CommbenchEvaluator
    versions: dict[str, str]
    study_name: str


def make_executor(spec: TuningSpec, base_env: Mapping[str, str]) -> Executor:
    runs_dir = Path(spec.runs_dir)
    if spec.executor == "reframe":
        return ReframeExecutor(spec.site, spec.system, spec.environ, spec.nodes, spec.tasks_per_node, runs_dir,
                               base_env)
    assert spec.launcher is not None
    commbench = spec.commbench or paths.commbench_build_dir() / f"cpu-{spec.environ}" / "commbench"
    return LauncherExecutor(spec.launcher, Path(commbench), runs_dir, base_env)


def store_ingester(url: str, scope_label: str, spec: TuningSpec) -> Any:
    """Each run goes into the results store as a run of campaign `tune` (status pass/fail, its valid
    records); the trial keeps the run's id."""
    from campaigns.store import RunInfo, StoreError, open_store

    def ingest(env: Mapping[str, str], outcome: RunOutcome, evaluation: Evaluation) -> list[str]:
        system, _, partition = spec.system.partition(":")
        info = RunInfo(run_key=f"tune/{scope_label}/{uuid.uuid4().hex}", campaign="tune", site=spec.site,
                       system=system, partition=partition, environ=spec.environ, check_name="commbench_run",
                       parameters={"op": spec.op, "sizes": list(spec.sizes), "env": dict(env),
                                   "transport": spec.transport, "batch": spec.batch, "iters": spec.iters},
                       num_nodes=spec.nodes, num_tasks=spec.ranks,
                       status="pass" if evaluation.ok else "fail",
                       reason=None if evaluation.ok else f"{evaluation.failure}: {evaluation.reason}"[:2000])
        try:
            with open_store(url) as store:
                return [f"run:{store.ingest(info, outcome.records, validated=True)}"]  # parse_record_lines checked them
        except StoreError as exc:  # not the setting's fault: the study stops and measures it again later
            raise EvaluationAborted(f"cannot store the run ({exc}); its records stay in {outcome.directory}") from exc

    return ingest


def executor_label(spec: TuningSpec) -> str:
    """What runs the trials, as a study tells it apart: `reframe`, or the launcher's program (srun, mpirun)."""
    return "reframe" if spec.executor == "reframe" else Path((spec.launcher or ["launcher"])[0]).name


def study_name(spec: TuningSpec, scope: StudyScope, knob_files: Sequence[str]) -> str:
    """`spec.study`, else the scope's name + executor + a digest of the knobs asked for and the knob
    files' content: trials of another executor or another knob setup go to a study of their own."""
    if spec.study is not None:
        return spec.study
    setup = {"knobs": spec.knobs, "unverifiable_knobs": sorted(spec.unverifiable_knobs),
             "knob_files": [Path(path).read_text(errors="replace") for path in knob_files],
             "executor": executor_label(spec)}
    digest = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:10]
    return f"{scope.study_name}/{executor_label(spec)}-{digest}"


def check_spec(spec: TuningSpec) -> tuple[KnobCatalog, list[str]]:
    """What can be checked before anything is submitted: the site, partition and environment, the knob
    files, the knobs asked for (whatever the library version), the executor and the study database
    (reached, nothing created). Returns the site's catalog and the knob files used; ValueError
    (StorageUnavailable for the database) naming the problem."""
    catalog, files = site_catalog(spec)
    if spec.knobs:
        try:
            check_knob_names(catalog, Library(spec.library), spec.knobs, op=spec.op, transport=spec.transport)
        except SpaceError as exc:
            raise ValueError(f"knobs: {exc}") from None
    site_env(spec)
    if spec.executor == "launcher":
        make_executor(spec, {})
    check_reachable(spec.storage_url())
    return catalog, files


def prepare(spec: TuningSpec, *, environ: Mapping[str, str] | None = None, ingest: bool = True) -> TuningSetup:
    """Everything a study needs, checked before any trial runs (check_spec first). Without
    `library_version` one probe run with the site's defaults at the smallest size reads it from
    commbench's records."""
    catalog, files = check_spec(spec)
    library = Library(spec.library)
    base_env = {**strip_knobs(os.environ if environ is None else environ, catalog, library), **site_env(spec)}
    executor = make_executor(spec, base_env)
    request = spec.request()
    version = spec.library_version
    if version is None:
        probe = executor.run({**catalog.default_env(), **READ_LOG_ENV.get(library, {})},
                             dataclasses.replace(request, sizes=request.sizes[:1], iters=1, warmup=0), False)
        version = library_version(probe.records, library)
        if version is None:
            raise ValueError(f"cannot tell the {library} version from the probe run "
                             f"({outcome_summary(probe)}); give library_version")
    space = build_space(catalog, {library: version}, knobs=spec.knobs, op=spec.op, transport=spec.transport)
    system, _, partition = spec.system.partition(":")
    scope = StudyScope(site=spec.site, system=system, partition=partition, library=library,
                       library_version=version, op=spec.op, transport=spec.transport, nodes=spec.nodes,
                       gpus_per_node=spec.gpus_per_node)
    buckets = buckets_for_sizes(spec.sizes, spec.sizes_per_bucket)
    ingester = store_ingester(spec.storage_url(), scope.slug, spec) if ingest else None
    evaluator = CommbenchEvaluator(executor, request, library, catalog,
                                   exempt=frozenset(spec.unverifiable_knobs), ingest=ingester)
    versions = {library.value: version, "commcamp": _git_commit()}
    return TuningSetup(spec, catalog, files, space, scope, buckets, evaluator, versions,
                       study_name(spec, scope, files))


def outcome_summary(outcome: RunOutcome) -> str:
    return (f"exit {outcome.exit_code}, {len(outcome.records)} records"
            + (f", {outcome.failure}" if outcome.failure else "") + f"; output ends: {_tail(outcome.output)}")


def _git_commit() -> str:
    try:
        out = "" if paths.CHECKOUT is None else subprocess.run(
            ["git", "-C", str(paths.CHECKOUT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            timeout=10, check=False).stdout.strip()
    except OSError:
        out = ""
    return out or "unknown"


def make_tuner(setup: TuningSetup, *, storage: Any = None, progress: bool = False,
               timeout_s: float | None = None, n_trials: int | None = None,
               seed_envs: Sequence[Mapping[str, str]] = ()) -> Tuner:
    """The Tuner of the setup's study; `timeout_s` / `n_trials` replace the spec's budget; `seed_envs`
    are enqueued after the defaults (and the library defaults) when the study is created."""
    spec = setup.spec
    seeds = [*([{}] if spec.seed_library_defaults else []), *seed_envs]
    return Tuner(setup.scope, setup.space, setup.evaluator,
                 storage if storage is not None else open_storage(
                     spec.storage_url(), heartbeat_interval=spec.heartbeat_s, grace_period=2 * spec.heartbeat_s),
                 setup.buckets,
                 n_trials=n_trials if n_trials is not None else spec.trials,
                 timeout_s=timeout_s if timeout_s is not None else spec.budget_s,
                 sampler=spec.sampler, seed=spec.seed, n_startup_trials=spec.n_startup_trials,
                 seed_envs=seeds, progress=progress, study_name=setup.study_name)


@dataclasses.dataclass
class TuningOutcome:
    study: Any
    baseline_env: dict[str, str]
    report: FinalReport | None = None
    recommendation: Recommendation | None = None
    published: PublishedFiles | None = None


class UntestedDecision(RuntimeError):
    """Finalization could re-measure no candidate within its budget: no decision can be made."""


class _FinalizationLog:
    """Says how far finalization is (it has no progress bar): at the start, then at most every `every_s`."""

    def __init__(self, planned: int, log: Callable[[str], None], every_s: float = 10.0) -> None:
        self.planned, self.log, self.every_s = planned, log, every_s
        self.done = 0
        self.started = self.last = time.monotonic()

    def run_done(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last >= self.every_s or self.done == self.planned:
            self.last = now
            self.log(f"finalization: {self.done} of {self.planned} planned runs, {now - self.started:.0f} s")


def finalize_study(setup: TuningSetup, study: Any, baseline_env: Mapping[str, str],
                   max_evaluations: int | None = None,
                   log: Callable[[str], None] | None = None) -> tuple[FinalReport, Recommendation]:
    """Re-measure the best candidates against the baseline (tuners.finalize) and build the
    recommendation. `max_evaluations` caps the candidates so that rounds x (candidates + 1) fits;
    `log` gets a progress line at the start and then at most every 10 s."""
    fin = setup.spec.finalize
    thresholds = fin.thresholds()
    found = finalization_candidates(study, setup.space, setup.buckets, k=fin.candidates)[:fin.max_candidates]
    keep = len(found)
    while max_evaluations is not None and keep > 0 and \
            planned_rounds(thresholds, keep, len(setup.buckets)) * (keep + 1) > max_evaluations:
        keep -= 1
    if keep == 0 < len(found):
        raise UntestedDecision(f"the time left ({max_evaluations} runs) re-measures none of the {len(found)} "
                               f"candidates ({planned_rounds(thresholds, 1, len(setup.buckets))} rounds x 2 runs "
                               "for one): a decision now would be untested")
    candidates = [Candidate(env, number) for number, env in found[:keep]]
    if log is not None and candidates:
        planned = planned_rounds(thresholds, keep, len(setup.buckets)) * (keep + 1)
        log(f"finalization: {keep} candidate(s) and the defaults re-measured interleaved, {planned} runs planned")
        setup.evaluator.run_done = _FinalizationLog(planned, log).run_done
    report = finalize(setup.evaluator, baseline_env, candidates, setup.buckets, thresholds=thresholds,
                      needs_validation=setup.space.unsafe_changes)
    if keep < len(found):
        report = dataclasses.replace(report, notes=(*report.notes, f"{len(found) - keep} of {len(found)} "
                                                                   "candidates left out to fit the time budget"))
    setup.evaluator.run_done = None
    rec = build_recommendation(setup.scope, report, setup.buckets, study, setup.versions)
    return report, rec


def per_size_stage(setup: TuningSetup, rec: Recommendation) -> PerSizeResult:
    """One selection sweep under the recommended environment, decided per size (tuners/per_size.py)."""
    spec = setup.spec
    thresholds = spec.finalize.thresholds()
    rounds = spec.per_size.rounds or rounds_for(len(spec.sizes), spec.per_size.top, thresholds.alpha)
    # commbench's watchdog step is one size with all its selections and rounds: it gets the whole limit.
    request = dataclasses.replace(setup.evaluator.request, selection_rounds=rounds,
                                  time_limit_s=spec.per_size.time_limit_s, bench_timeout_s=spec.per_size.time_limit_s)
    outcome = setup.evaluator.executor.run({**rec.env, **SWEEP_ENV.get(setup.scope.library, {})}, request, False)
    if outcome.failure or outcome.exit_code != 0:
        raise EvaluationAborted(f"the per-size sweep failed: {outcome_summary(outcome)}")
    return decide_per_size(load_sweep(outcome.records), thresholds=thresholds, top=spec.per_size.top)


def publish_recommendation(setup: TuningSetup, rec: Recommendation) -> PublishedFiles | None:
    spec = setup.spec
    if spec.publish_dir is None:
        return None
    plugin = spec.plugin_library or (paths.plugin_build_dir() / paths.PLUGIN_LIBRARY if rec.plugin_rules else None)
    return publish(Path(spec.publish_dir), rec, setup.catalog,
                   plugin_library=None if plugin is None else str(Path(plugin).resolve()))


def run_tuning(setup: TuningSetup, *, progress: bool = True) -> TuningOutcome:
    """The study (resumed if it exists), then finalization and publishing if the spec asks for them."""
    tuner = make_tuner(setup, progress=progress)
    study = tuner.run()
    outcome = TuningOutcome(study, dict(tuner.baseline_env))
    if setup.spec.finalize.enabled:
        outcome.report, outcome.recommendation = finalize_study(setup, study, tuner.baseline_env,
                                                                log=print_progress if progress else None)
        if setup.spec.per_size.enabled:
            outcome.recommendation = with_per_size(outcome.recommendation,
                                                   per_size_stage(setup, outcome.recommendation))
        outcome.published = publish_recommendation(setup, outcome.recommendation)
    return outcome


def print_progress(line: str) -> None:
    """A progress line that reaches a log file or pipe at once."""
    print(line, flush=True)


def _command_output(cmd: list[str]) -> str:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return (result.stdout or result.stderr).strip().splitlines()[0] if (result.stdout or result.stderr) else ""


def provenance() -> dict[str, Any]:
    """Where and with what a tuning run ran: date, host, commit, tool versions."""
    import platform

    import optuna

    dirty = 0 if paths.CHECKOUT is None else subprocess.run(
        ["git", "-C", str(paths.CHECKOUT), "status", "--porcelain"], capture_output=True, text=True, timeout=20,
        check=False).stdout.count("\n")
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
            "commit": _git_commit(), "changed_files": dirty, "python": platform.python_version(),
            "optuna": optuna.__version__, "command": sys.argv,
            "reframe": _command_output([str(paths.reframe_executable()), "--version"]),
            "slurm": _command_output(["sinfo", "--version"]),
            "open_mpi": _command_output(["ompi_info", "--version"])}


def outcome_summary_data(setup: TuningSetup, outcome: TuningOutcome) -> dict[str, Any]:
    """Everything a committed result needs: spec, scope, every counted trial, the finalization evidence,
    the files written, and the provenance."""
    from tuners.study import BUCKET_US, ENV, FAIL_REASON, OUTCOME, ROLE, is_counted, study_progress

    trials = [{"number": t.number, "role": t.user_attrs.get(ROLE, ""), "outcome": t.user_attrs[OUTCOME],
               "objective_us": t.value, "bucket_us": t.user_attrs.get(BUCKET_US), "env": t.user_attrs.get(ENV),
               "fail_reason": t.user_attrs.get(FAIL_REASON, ""), "record_ids": t.user_attrs.get("record_ids", [])}
              for t in outcome.study.get_trials(deepcopy=False) if is_counted(t)]
    rec = outcome.recommendation
    return {"spec": setup.spec.model_dump(mode="json"), "scope": setup.scope.model_dump(mode="json"),
            "study": setup.study_name, "knob_files": setup.knob_files,
            "baseline_env": outcome.baseline_env, "progress": dataclasses.asdict(study_progress(outcome.study)),
            "trials": trials, "run_durations_s": [round(d, 2) for d in setup.evaluator.durations_s],
            "recommendation": None if rec is None else rec.model_dump(mode="json"),
            "files": None if outcome.published is None else {
                k: str(v) for k, v in dataclasses.asdict(outcome.published).items()},
            "provenance": provenance()}


def write_summary(path: Path, setup: TuningSetup, outcome: TuningOutcome) -> None:
    write_atomic(path, json.dumps(outcome_summary_data(setup, outcome), indent=2, default=str) + "\n")


def recommendation_env_text(rec: Recommendation, catalog: KnobCatalog) -> str:
    """The sourceable env file of a recommendation (pretune's output), values validated again."""
    return env_file_text(rec, catalog.validate_env(rec.env), list(rec.unset))


def write_env_file(path: Path, rec: Recommendation, catalog: KnobCatalog) -> None:
    write_atomic(path, recommendation_env_text(rec, catalog))


# ------------------------------------------------------------------------------------ Slurm workers
def _site(spec: TuningSpec) -> Any:
    """The spec's site (campaigns.model.site.Site), or None for a site known only by its knob file
    (site_configs/knobs/<site>.yaml); ValueError for an unknown site or a site.yaml with problems."""
    from campaigns.model.site import SiteError, find_site_file, load_site

    if find_site_file(spec.site) is None and (paths.KNOBS_DIR / f"{spec.site}.yaml").is_file():
        return None
    try:
        return load_site(spec.site)
    except SiteError as exc:
        raise ValueError(str(exc)) from None


def _site_partition(spec: TuningSpec) -> tuple[Any, dict[str, str]] | None:
    """The spec's partition of its site.yaml and the variables the site sets for its jobs (partition
    and environment env_vars, e.g. SLURM_MPI_TYPE, UCX_TLS); None for a site without site.yaml.
    ValueError when the site has no such system, partition or environment there, or (Slurm) fewer nodes."""
    from campaigns.model.spec import SLURM_SCHEDULERS

    site = _site(spec)
    if site is None:
        return None
    system_name, _, partition_name = spec.system.partition(":")
    try:
        system = site.system(system_name)
        partition = system.partition(partition_name)
    except KeyError:
        systems = ", ".join(f"{s.name}:{p.name}" for s in site.systems for p in s.partitions)
        raise ValueError(f"site {site.name!r} has no system:partition {spec.system!r} (it has: {systems})") from None
    if spec.environ not in partition.environments:
        raise ValueError(f"environ {spec.environ!r} is not an environment of {spec.system} "
                         f"(it has: {', '.join(partition.environments)})")
    if partition.scheduler in SLURM_SCHEDULERS and spec.nodes > partition.nodes:
        raise ValueError(f"{spec.nodes} nodes requested, but partition {spec.system} of site {site.name!r} "
                         f"has {partition.nodes}")
    return partition, {**partition.env_vars, **site.environment(spec.environ).env_vars}


def only_partition(site_name: str, system_name: str) -> str:
    """system:partition for a system of one partition; `system_name` unchanged where the site or system
    is unknown (reported later, with what there is); ValueError when the system has several partitions."""
    from campaigns.model.site import SiteError, load_site

    try:
        system = load_site(site_name).system(system_name)
    except (SiteError, KeyError):
        return system_name
    if len(system.partitions) > 1:
        raise ValueError(f"system {system_name!r} of site {site_name!r} has partitions "
                         f"{', '.join(p.name for p in system.partitions)}: give system:partition")
    return f"{system_name}:{system.partitions[0].name}"


def site_env(spec: TuningSpec) -> dict[str, str]:
    """What the site environment exports for its jobs, minus commcamp's launcher selector."""
    found = _site_partition(spec)
    env = {} if found is None else dict(found[1])
    env.pop("COMMCAMP_MPIEXEC", None)
    return env


def slurm_launcher(spec: TuningSpec, inside_allocation: bool) -> list[str]:
    """srun for the spec's MPI (the site environment's SLURM_MPI_TYPE). Inside an allocation srun uses
    it; outside it makes one with the site partition's access options. A rank that dies (a segfault
    before commbench's watchdog runs, in MPI_Init) ends the run at once (--kill-on-bad-exit): otherwise
    the other ranks wait in MPI for it until the run's time limit."""
    found = _site_partition(spec)
    if found is None:
        raise ValueError(f"site {spec.site!r} has no site.yaml: cannot tell how to launch with srun there")
    partition, env = found
    cmd = ["srun", f"--mpi={env.get('SLURM_MPI_TYPE', 'none')}", "-N", str(spec.nodes), "-n", str(spec.ranks),
           "--kill-on-bad-exit=1"]
    return cmd if inside_allocation else [*cmd, *partition.access]


def worker_spec(spec: TuningSpec) -> TuningSpec:
    """The spec a Slurm worker runs: launcher executor with srun in its own allocation, no finalization."""
    return spec.model_copy(update={"executor": "launcher", "launcher": slurm_launcher(spec, True),
                                   "finalize": spec.finalize.model_copy(update={"enabled": False}),
                                   "publish_dir": None})


def submit_workers(spec: TuningSpec, workers: int, directory: Path, env: Mapping[str, str]) -> list[int]:
    """N sbatch jobs, each a tuning worker on the same study (PostgreSQL storage)."""
    directory.mkdir(parents=True, exist_ok=True)
    spec_path = directory / "worker-spec.json"
    write_atomic(spec_path, worker_spec(spec).model_dump_json(indent=2))
    found = _site_partition(spec)
    access = [] if found is None else list(found[0].access)
    limit_min = max(1, int((spec.budget_s or spec.time_limit_s * (spec.trials or 1)) // 60) + 2)
    ids = []
    for number in range(workers):
        command = shlex.join([str(Path(sys.executable).with_name("commcamp")), "tune-worker", str(spec_path)])
        sbatch = ["sbatch", "--parsable", "-N", str(spec.nodes), f"--ntasks-per-node={spec.tasks_per_node}",
                  "-t", str(limit_min), "-J", f"commcamp-tune-{number}", "-o", str(directory / "worker-%j.out"),
                  *access, "--wrap", f"cd {shlex.quote(str(directory))} && exec {command}"]
        out = subprocess.run(sbatch, capture_output=True, text=True, env=dict(env), timeout=60, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
        ids.append(int(out.stdout.strip().split(";")[0]))
    return ids


def wait_for_jobs(job_ids: Sequence[int], env: Mapping[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(map(str, job_ids))], capture_output=True,
                             text=True, env=dict(env), timeout=30, check=False)
        if out.returncode == 0 and not out.stdout.strip():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"tuning workers {list(job_ids)} still queued or running after {timeout_s:.0f} s")
        time.sleep(1)

