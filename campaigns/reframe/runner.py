"""Run a campaign: ReFrame as a subprocess, then its run report and commbench's records into the store.

For the test cases of a campaign that the store does not hold yet (all of them with `force`), the
runner starts the `reframe` of this Python environment with the site's configuration
(site_configs/<site>/reframe_config.py) and the check's file of reframe_checks/ (CHECK_FILES:
commbench_run.py, or reference_benchmarks.py for the reference checks nccl_tests_run and osu_run),
selecting test cases with `-n` (op, a reference check's benchmark, and node count), `-p`
(environments) and `--system`, and setting the check's variables with `-S`. Each invocation gets its
own prefix under the run directory (<workspace>/runs/<campaign>-<UTC time>/rfm-<n>/: stage, output,
perflogs, report.json, reframe.out, ReFrame's debug log), and its output streams to the terminal while
it runs.

Every test case becomes one run in the store, whatever its outcome: status `pass` or `fail` (with
ReFrame's failure phase and reason), or `error` when ReFrame never ran it; with it go the records of its
commbench.jsonl that are valid (a failed run keeps those it produced). The reference checks write their
benchmark's output there as commbench-schema records (campaigns.formats.foreign), stored alike under
the check's name. A test case is stored as soon as
ReFrame prints its result line (its records are then in ReFrame's output or stage directory), so an
interrupted campaign keeps every case that finished; when the invocation ends, its run report adds the
job id, times and ReFrame's exact failure reason (the run is replaced in one transaction). A run key
(campaigns.model.spec.TestCase.run_key) names each test case; passed runs are skipped on the next run, and a
forced re-run is stored as another run of the key beside them (a passed run is never deleted). A failed
case's reason starts with its first failure (first_failure: a crashed rank, commbench's error record).

Placements (characterize campaigns) and pair tests (health isolation) become Slurm options through
ReFrame's `-J` (campaigns.slurm.placement.Placer); test cases that need different options go into
different invocations. The network distance the ranks spanned is stored with each run's parameters.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from campaigns import paths
from campaigns.locks import in_use
from campaigns.slurm.placement import Placer, placement_mismatch
from campaigns.slurm.topology import PlacementError, Topology
from campaigns.model.references import PERFORMANCE_FAILURE
from campaigns.model.records import parse_record_lines
from campaigns.model.site import NAME_PATTERN
from campaigns.model.spec import Campaign, TestCase
from campaigns.model.vocabulary import BENCHMARK_PARAMETER, REFERENCE_CHECKS
from campaigns.store import RunInfo, Store, StoreError
from campaigns.subproc import die_with_this_process, stop_processes_in

RECORDS_FILE = "commbench.jsonl"
REPORT_FILE = "report.json"
REFRAME_LOG = "reframe.out"
# The file of each check a campaign runs (reframe_checks/): `-c` loads only that one.
CHECK_FILES = {"commbench_run": "commbench_run.py", **dict.fromkeys(REFERENCE_CHECKS, "reference_benchmarks.py")}

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # ReFrame colours failed performance values even with --nocolor
# "[       OK ] ( 3/14) commbench_run %op=pingpong %num_nodes=1 /b72462f8 @local:cpu+openmpi"; a reference
# check's first parameter is its benchmark: "osu_run %benchmark=osu_latency %num_nodes=1 /..."; a SKIP line ends
# with its reason in brackets ("... @local:cpu+openmpi [transport memcpy has no op pingpong]"), which ReFrame's
# run report does not keep
_RESULT_LINE = re.compile(r"^\[\s*(OK|FAIL|SKIP|ABORT|XFAIL|XPASS)\s*\] \(\s*(\d+)/(\d+)\) (.*)$")
_TEST_NAME = re.compile(rf"^(?P<check>\w+) %(?:op|{BENCHMARK_PARAMETER})=(?P<op>\w+) %num_nodes=(?P<nodes>\d+) "
                        r"/(?P<hash>[0-9a-f]+) @(?P<system>[\w-]+):(?P<partition>[\w-]+)\+(?P<environ>[\w-]+)"
                        r"(?: \[(?P<skip_reason>.*)\])?$")
_RESULT_STYLE = {"OK": "green", "FAIL": "bold red", "SKIP": "yellow", "ABORT": "bold red",
                 "XFAIL": "yellow", "XPASS": "red"}


@dataclass
class CaseResult:
    """What became of one test case. status: pass, fail, error (ReFrame did not run it to the end),
    stored (a passed run with this key is already in the store, so it was not run again), or unplaceable
    (the topology cannot give its placement; nothing stored). `store_error`: the store refused it."""

    case: TestCase
    status: str
    reason: str | None = None
    perf: dict[str, tuple[float, str]] = field(default_factory=dict)
    num_records: int = 0
    num_tasks: int | None = None
    job_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    directory: Path | None = None
    hosts: tuple[str, ...] = ()
    store_error: str | None = None
    job_nodes: tuple[str, ...] = ()  # the nodes Slurm gave its job (from ReFrame's report)
    run_id: int | None = None  # its run in the store, once stored


@dataclass
class CampaignResult:
    run_dir: Path | None
    db_url: str
    results: list[CaseResult]

    @property
    def all_passed(self) -> bool:
        return all(r.status in ("pass", "stored") and r.store_error is None for r in self.results)

    @property
    def unstored(self) -> list[CaseResult]:
        return [r for r in self.results if r.store_error is not None]


@dataclass(frozen=True)
class Invocation:
    """One `reframe` run: test cases on one partition that differ only in op, node count and environment
    (plan_invocations groups them so); the command comes from the cases alone."""

    partition: str
    environments: tuple[str, ...]
    cases: tuple[TestCase, ...]
    job_options: tuple[str, ...] = ()

    def command(self, prefix: Path) -> list[str]:
        reframe = paths.reframe_executable()
        case = self.cases[0]  # one invocation: one check, one set of variables, env and settings
        if case.reframe_config is None:
            raise ValueError(f"test case {case.run_key} has no site ReFrame configuration")
        cmd = [str(reframe), "-C", str(case.reframe_config),
               "-c", str(paths.CHECKS_DIR / CHECK_FILES[case.check]),
               "--system", f"{case.system}:{self.partition}",
               "-p", "^(" + "|".join(re.escape(env) for env in self.environments) + ")$"]
        for name in sorted({c.reframe_name for c in self.cases}):
            cmd += ["-n", name]
        for name, value in case.variables:
            cmd += ["-S", f"{case.check}.{name}={_reframe_value(value)}"]
        # `--job-option=` form: argparse would take a bare `-J --nodelist=...` value for an option
        cmd += [f"--job-option={option}" for option in self.job_options]
        if case.tasks_per_node_setting is not None:
            cmd += ["-S", f"{case.check}.num_tasks_per_node={case.tasks_per_node_setting}"]
        if case.env:
            cmd += ["-S", env_vars_setting(case.check, dict(case.env))]
        if case.references:
            cmd += ["-S", f"{case.check}.campaign_references={case.references}"]
        if not case.check_performance:
            cmd += ["--skip-performance-check"]
        # One continuous perflog per system in the workspace (<workspace>/reframe/perflogs, README "Where
        # results go"), where plain `reframe` writes too, whatever the runs directory.
        cmd += ["--prefix", str(prefix), "--perflogdir", str(paths.workspace() / "reframe" / "perflogs"),
                "--report-file", str(prefix / REPORT_FILE), "--nocolor", "-r"]
        return cmd


def env_vars_setting(check: str, env: dict[str, str]) -> str:
    """`-S` argument that sets a check's env_vars to exactly `env`: JSON, since values may hold the ','
    and ':' of ReFrame's short dict syntax (the check validates and shell-quotes them)."""
    return f"{check}.env_vars=" + json.dumps(env)


def _reframe_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


JobOptions = Callable[[TestCase], tuple[str, ...]]


def plan_invocations(cases: list[TestCase], job_options: JobOptions = lambda case: ()) -> list[Invocation]:
    """Group test cases into as few ReFrame runs as the selection options allow: `-p` and `-n` select
    a product (environments x names), so test cases whose names want different environment sets go
    into separate invocations; so does anything else the command takes from a case (check, site
    configuration, partition, variables such as the transport, env, settings) and Slurm job options
    (placements). Cases of different placements never share an invocation, even where their job options
    agree (same-switch and one each-switch run on the same nodes): ReFrame would run the one test it
    selects once, and both cases would be stored from that one job."""
    def group_of(case: TestCase) -> tuple[str, tuple[str, ...]]:
        launch = (case.check, str(case.reframe_config), case.system, case.partition, case.variables, case.env,
                  case.tasks_per_node_setting, case.check_performance, case.placement, case.nodelist,
                  case.references)
        return json.dumps(launch), job_options(case)

    by_name: dict[tuple[tuple[str, tuple[str, ...]], str], set[str]] = defaultdict(set)
    for case in cases:
        by_name[group_of(case), case.reframe_name].add(case.environ)
    groups: dict[tuple[tuple[str, tuple[str, ...]], tuple[str, ...]], set[str]] = defaultdict(set)
    for (group, name), environs in by_name.items():
        groups[group, tuple(sorted(environs))].add(name)
    invocations = []
    for (group, environs), names in groups.items():
        members = tuple(c for c in cases if group_of(c) == group and c.environ in environs and c.reframe_name in names)
        invocations.append(Invocation(members[0].partition, environs, members, job_options=group[1]))
    return invocations


# A run directory's name: <campaign>-<UTC stamp>[-<attempt>] (new_run_dir); `commcamp results prune` deletes
# only directories so named, never whatever else a mistyped --runs-dir holds.
RUN_DIR_NAME = re.compile(rf"{NAME_PATTERN}-\d{{8}}T\d{{6}}Z(-\d+)?")


def new_run_dir(campaign: Campaign, runs_dir: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    runs_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 100):
        path = runs_dir / (f"{campaign.name}-{stamp}" + (f"-{attempt}" if attempt > 1 else ""))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a run directory under {runs_dir}")


ResultHandler = Callable[[str, dict[str, str]], None]


def stream_reframe(cmd: list[str], prefix: Path, console: Console,
                   on_result: ResultHandler | None = None) -> int:
    """Run ReFrame, keep its output in prefix/reframe.out, show test case results as they come, and
    hand each run test's result (OK, FAIL, ...) with its parsed name to `on_result` right away."""
    prefix.mkdir(parents=True)
    # ReFrame writes its debug log (rfm-*.log) to $TMPDIR: keep it with the run.
    env = {**os.environ, **paths.subprocess_env(), "TMPDIR": str(prefix)}
    with (open(prefix / REFRAME_LOG, "w", encoding="utf-8") as log,
          subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                           env=env, cwd=prefix, preexec_fn=die_with_this_process()) as proc,
          console.status("ReFrame: loading checks") as status):
        assert proc.stdout is not None
        try:
            _follow(proc, log, console, status, on_result)
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM) or a handler failed: ReFrame cancels its jobs on SIGTERM, not the builds
            # its local scheduler runs in sessions of their own: what still works in the prefix is stopped.
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            stop_processes_in(prefix)
            raise
        return proc.wait()


def _follow(proc: subprocess.Popen[str], log: Any, console: Console, status: Any,
            on_result: ResultHandler | None) -> None:
    """Copy ReFrame's output to the log, show what matters, report test case results."""
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        log.flush()
        text = _ANSI_ESCAPE.sub("", line.rstrip())
        match = _RESULT_LINE.match(text)
        if match:
            kind, done, total, name = match.groups()
            test = _TEST_NAME.match(name.strip())
            if test and on_result is not None:  # stored before it is shown
                on_result(kind, test.groupdict())
            console.print(f"[{_RESULT_STYLE[kind]}]{kind:>5}[/] ({done}/{total}) {escape(name)}")
            status.update(f"ReFrame: {done}/{total} test cases done")
        elif text.startswith("P: "):
            console.print(f"        [dim]{escape(text[3:])}[/]")
        elif text.startswith("==> test failed"):
            console.print(f"        [red]{escape(text[4:])}[/]", soft_wrap=True)
        elif re.match(r"^\[\s*(PASSED|FAILED)\s*\]", text):
            console.print(escape(text))


def report_testcases(report_path: Path) -> list[dict[str, Any]]:
    """The report's test cases; of a test case retried (--max-retries), the last try."""
    report = json.loads(report_path.read_text(encoding="utf-8"))
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for run in report["runs"]:
        for testcase in run["testcases"]:
            latest[testcase["name"], testcase["partition"], testcase["environ"]] = testcase
    return list(latest.values())


def _matching(case: TestCase, testcases: list[dict[str, Any]]) -> dict[str, Any] | None:
    for tc in testcases:
        if (tc["name"].split()[0] == case.check and not tc.get("fixture") and tc["partition"] == case.partition
                and tc["environ"] == case.environ and tc.get(case.op_parameter) == case.op
                and tc.get("num_nodes") == case.num_nodes):
            return tc
    return None


def _valid_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Each line that is a valid record, and what is wrong with the others."""
    return parse_record_lines(path.read_text(encoding="utf-8", errors="replace"), path.name)


# How a job's tasks fail, in its stderr: srun's "srun: error: n1: task 0: Segmentation fault" (also
# "tasks 0-1: Exited with exit code 4"), and commbench's own "commbench: ..." lines (watchdog, crash).
_SRUN_TASK_FAILURE = re.compile(r"^srun: error: (?P<host>[^:\s]+): tasks? (?P<ranks>[\d,-]+): (?P<what>.+)$")
_COMMBENCH_LINE = re.compile(r"^commbench: (?P<what>.+)$")


def first_failure(job_stderr: str, records: list[dict[str, Any]]) -> str | None:
    """The first thing that went wrong in a failed job, in the order it happened: the first line of the
    job's stderr where a task died of a signal or commbench reported a failure (a crash, its watchdog),
    else commbench's first error record, else srun's first non-zero exit. A rank killed by a crash
    elsewhere, or one that waited for a dead peer until its watchdog fired, is a consequence, not the cause."""
    exits = []
    died: str | None = None  # srun's line for the first task that died of a signal
    for line in job_stderr.splitlines():
        task = _SRUN_TASK_FAILURE.match(line.strip())
        if task and task["what"].startswith("Exited with exit code"):
            exits.append(f"rank(s) {task['ranks']} on {task['host']}: {task['what'].lower()}")
        elif task:
            died = died or f"rank(s) {task['ranks']} on {task['host']}: {task['what']}"
        elif (own := _COMMBENCH_LINE.match(line.strip())) is not None:
            # commbench's own crash line says the same as srun's, with the signal's number: whichever of
            # the two streams reached the file first. Any other commbench line after a death is its echo.
            if "crashed with signal" in own["what"] or died is None:
                return own["what"]
    if died is not None:
        return died
    errors = [record for record in records if record["kind"] == "error"]
    if errors:
        return f"commbench {errors[0].get('reason')} error: {errors[0].get('error')}"
    return exits[0] if exits else None


def _timestamp(unix: float | None) -> datetime | None:
    return datetime.fromtimestamp(unix, UTC) if unix else None


def _failure(tc: dict[str, Any], testcases: list[dict[str, Any]], skip_reason: str | None = None) -> tuple[str, str]:
    """Status and reason of a test case that did not pass (`skip_reason`: from ReFrame's SKIP line)."""
    if tc["result"] == "fail":
        return "fail", f"{tc.get('fail_phase')}: {tc.get('fail_reason')}"
    if tc["result"] == "fail_deps":  # its build (fixture) failed
        failed = [f"{dep['display_name']} failed in {dep.get('fail_phase')}: {dep.get('fail_reason')} "
                  f"(see {dep.get('stagedir')})"
                  for dep in testcases if dep.get("fixture") and dep["result"] == "fail"
                  and [dep["unique_name"], f"{dep['system']}:{dep['partition']}", dep["environ"]]
                  in tc.get("dependencies_actual", [])]
        return "fail", "; ".join(failed) or "a dependency failed"
    if tc["result"] == "skip":
        return "error", f"ReFrame skipped it: {skip_reason or tc.get('fail_reason') or 'no reason given'}"
    return "error", f"ReFrame result {tc['result']}: {tc.get('fail_reason') or 'no reason given'}"


def case_outcome(case: TestCase, testcases: list[dict[str, Any]], reframe_rc: int,
                 prefix: Path, skip_reason: str | None = None) -> tuple[CaseResult, list[dict[str, Any]]]:
    """The result of one test case and the records to store with it (`skip_reason`: what ReFrame's SKIP line
    said, which its report does not keep)."""
    tc = _matching(case, testcases)
    if tc is None:
        reason = f"ReFrame (exit code {reframe_rc}) did not report this test case; see {prefix / REFRAME_LOG}"
        return CaseResult(case, "error", reason), []
    status, reason = ("pass", None) if tc["result"] == "pass" else _failure(tc, testcases, skip_reason)
    # A passed test case's files are in its output directory; a failed one's stay in its stage directory.
    where = tc.get("outputdir") if status == "pass" else tc.get("stagedir")
    directory = Path(where) if where else None
    records: list[dict[str, Any]] = []
    if directory is not None and (directory / RECORDS_FILE).is_file():
        records, problems = _valid_records(directory / RECORDS_FILE)
        if problems:
            note = f"{len(problems)} invalid record line(s) not stored, first: {problems[0]}"
            status, reason = ("fail", note) if status == "pass" else (status, f"{reason}; {note}")
    elif status == "pass":
        status, reason = "fail", f"no {RECORDS_FILE} in {directory}"
    # A run that failed only ReFrame's performance check ran well (its records valid): a line its job printed
    # (MPICH's MPI_Finalize warning) is no cause, and put first it hid that the run was measured (references).
    if status != "pass" and directory is not None and not (reason or "").startswith(PERFORMANCE_FAILURE):
        stderr = directory / (tc.get("job_stderr") or "rfm_job.err")
        cause = first_failure(stderr.read_text(errors="replace") if stderr.is_file() else "", records)
        if cause:
            reason = f"{cause}; {reason}"
    perf = {name.split(":")[-1]: (values[0], values[4]) for name, values in (tc.get("perfvalues") or {}).items()}
    job_nodes = tuple(tc.get("job_nodelist") or ())
    if status != "pass" and job_nodes:  # a failed job names where it ran: a node may be what failed
        reason = f"{reason} (job {tc.get('jobid')} on {','.join(job_nodes)})"
    if status != "pass" and directory is not None:  # its job's output and stderr: `results prune` keeps them
        reason = f"{reason}; files: {directory}"
    return CaseResult(case, status, reason, perf, len(records), num_tasks=tc.get("num_tasks"),
                      job_id=tc.get("jobid"), started_at=_timestamp(tc.get("job_submit_time")),
                      finished_at=_timestamp(tc.get("job_completion_time_unix")), directory=directory,
                      hosts=_hosts(records), job_nodes=job_nodes), records


def _hosts(records: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(sorted({host for record in records for host in record["hostnames"]}))


def early_outcome(case: TestCase, kind: str, test: dict[str, str],
                  prefix: Path) -> tuple[CaseResult, list[dict[str, Any]]]:
    """A test case's result from its live result line, before ReFrame's run report exists."""
    relative = Path(test["system"], test["partition"], test["environ"], f"{test['check']}_{test['hash']}")
    # ReFrame prints OK before its cleanup copies the files to the output directory and removes the stage
    # directory: look in the stage directory first, then in the output directory.
    records: list[dict[str, Any]] = []
    problems = [f"no {RECORDS_FILE} in {prefix / 'stage' / relative} or {prefix / 'output' / relative}"]
    for directory in (prefix / "stage" / relative, prefix / "output" / relative):
        try:
            records, problems = _valid_records(directory / RECORDS_FILE)
            break
        except FileNotFoundError:  # not there (yet), or removed by the cleanup while we looked
            continue
    if kind == "OK" and not problems:
        status, reason = "pass", None
    elif kind == "OK":
        status, reason = "fail", problems[0]
    elif kind == "SKIP":
        status, reason = "error", f"ReFrame skipped it: {test.get('skip_reason') or 'no reason given'}"
    else:
        status = "fail" if kind == "FAIL" else "error"
        reason = f"ReFrame result {kind}; the reason follows in its run report (see {prefix / REFRAME_LOG})"
    return CaseResult(case, status, reason, num_records=len(records), directory=directory,
                      hosts=_hosts(records)), records


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (main thread only): a test case being stored is
    stored whole, and the interrupt comes right after. Handlers that only note the signal, then the ones before
    and the signal again: blocking it in this thread held nothing back, the kernel handed it to another thread
    (BLAS's pool, rich's refresh) and Python raised KeyboardInterrupt here all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {number: signal.signal(number, lambda got, _frame: caught.append(got))
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        for number in dict.fromkeys(caught):
            signal.raise_signal(number)


def ingest_case(store: Store, result: CaseResult, records: list[dict[str, Any]],
                topology: Topology | None = None, replaces_run: int | None = None) -> None:
    """Store the run of one test case with its records as a new attempt of its run key (earlier attempts
    that passed are kept, failed ones dropped; `replaces_run`: this attempt stored earlier); a store
    failure is kept in result.store_error (the records stay in result.directory) so the campaign goes on.
    A placed run whose ranks spanned another network distance than its placement asks for is stored as
    failed (placement_mismatch), whatever ReFrame said."""
    case = result.case
    if result.status == "pass" and (mismatch := placement_mismatch(case, result.hosts, topology)):
        result.status, result.reason = "fail", mismatch
    parameters = case.parameters
    if case.nodelist:
        parameters["nodelist"] = list(case.nodelist)
    if result.hosts:
        parameters["hosts"] = list(result.hosts)
        if topology is not None:
            parameters["network_distance"] = topology.distance(result.hosts)
    if result.job_nodes:
        parameters["job_nodes"] = list(result.job_nodes)
    if case.tag:
        parameters["tag"] = case.tag
    run = RunInfo(run_key=case.run_key, campaign=case.campaign, site=case.site, system=case.system,
                  partition=case.partition, environ=case.environ, check_name=case.check, parameters=parameters,
                  num_nodes=case.num_nodes, num_tasks=result.num_tasks or case.num_tasks, status=result.status,
                  reason=result.reason, started_at=result.started_at, finished_at=result.finished_at,
                  job_id=result.job_id)
    try:
        with signals_deferred():
            result.run_id = store.ingest(run, records, new_attempt=True, replaces_run=replaces_run, validated=True)
        result.store_error = None
    except StoreError as exc:
        result.store_error = f"{exc} (its records stay in {result.directory})"


def _matching_case(cases: tuple[TestCase, ...], test: dict[str, str]) -> TestCase | None:
    for case in cases:
        if (case.check == test["check"] and case.op == test["op"] and case.num_nodes == int(test["nodes"])
                and case.partition == test["partition"] and case.environ == test["environ"]):
            return case
    return None


def run_cases(cases: list[TestCase], store: Store, *, console: Console, run_dir: Path,
              placer: Placer, first_invocation: int = 1) -> list[CaseResult]:
    """Run test cases through ReFrame (invocations numbered from `first_invocation` under run_dir),
    storing each as it completes; their results in the order given."""
    results: dict[str, CaseResult] = {}
    skip_reasons: dict[str, str] = {}  # ReFrame's SKIP lines say why; its report does not
    placeable = []
    for case in cases:
        try:
            placer.job_options(case)
            placeable.append(case)
        except PlacementError as exc:
            results[case.run_key] = CaseResult(case, "unplaceable", f"placement {case.placement}: {exc}")
    topology = placer.topology
    for number, invocation in enumerate(plan_invocations(placeable, placer.job_options), start=first_invocation):
        prefix = run_dir / f"rfm-{number}"

        def store_now(kind: str, test: dict[str, str], invocation: Invocation = invocation,
                      prefix: Path = prefix) -> None:
            case = _matching_case(invocation.cases, test)
            if case is not None:
                if test.get("skip_reason"):
                    skip_reasons[case.run_key] = test["skip_reason"]
                result, records = early_outcome(case, kind, test, prefix)
                ingest_case(store, result, records, topology)
                results[case.run_key] = result

        rc = stream_reframe(invocation.command(prefix), prefix, console, store_now)
        report = prefix / REPORT_FILE
        testcases = report_testcases(report) if report.is_file() else []
        for case in invocation.cases:
            if testcases or case.run_key not in results:
                early = results.get(case.run_key)
                stored_early = early is not None and early.store_error is None
                result, records = case_outcome(case, testcases, rc, prefix, skip_reasons.get(case.run_key))
                ingest_case(store, result, records, topology, replaces_run=early.run_id if early else None)
                if result.store_error and stored_early:  # its records are stored; only the report's details are not
                    console.print(f"[yellow]note[/] {escape(case.run_key)}: stored when it finished, but its job id "
                                  f"and times could not be added: {escape(result.store_error)}", soft_wrap=True)
                    result.store_error = None
                results[case.run_key] = result
    return [results[c.run_key] for c in cases]


def _runs_of(case: TestCase, placer: Placer) -> list[TestCase]:
    """The case's runs (an each-switch case: one per leaf switch); itself when it cannot be placed, which
    run_cases then reports as unplaceable."""
    try:
        return placer.expand(case)
    except PlacementError:
        return [case]


def run_campaign(campaign: Campaign, store: Store, *, force: bool, console: Console,
                 runs_dir: Path | None = None, tag: str | None = None,
                 placer: Placer | None = None) -> CampaignResult:
    """Every test case of the campaign that `store` holds no passed run of (all with `force`), in a new run
    directory under `runs_dir`, marked in use while its cases run (`results prune` keeps it). The caller holds the
    campaign's lock (locks.campaign_lock: `commcamp run`)."""
    placer = placer or Placer()
    cases = [run for case in campaign.cases(tag) for run in _runs_of(case, placer)]
    pending = [c for c in cases if force or not store.has_run(c.run_key)]
    results = {c.run_key: CaseResult(c, "stored", "a passed run with this key is stored")
               for c in cases if c not in pending}
    run_dir = None
    if not pending:
        console.print(f"Nothing to run: all {len(cases)} test case(s) have passed runs stored "
                      f"(--force runs them again).")
    else:
        run_dir = new_run_dir(campaign, runs_dir or paths.runs_dir())
        console.print(f"Running {len(pending)} of {len(cases)} test case(s) of campaign "
                      f"[bold]{escape(campaign.name)}[/] on site {campaign.site.name}, system "
                      f"{campaign.system.name}; run directory {run_dir}", soft_wrap=True)
        with in_use(run_dir):
            for result in run_cases(pending, store, console=console, run_dir=run_dir, placer=placer):
                results[result.case.run_key] = result
    return CampaignResult(run_dir, store.url, [results[c.run_key] for c in cases])
