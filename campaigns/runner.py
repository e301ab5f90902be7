"""Run a campaign: ReFrame as a subprocess, then its run report and commbench's records into the store.

For the test cases of a campaign that the store does not hold yet (all of them with `force`), the
runner starts the `reframe` of this Python environment with the site's configuration
(site_configs/<site>/reframe_config.py) and reframe_checks/, selecting test cases with `-n`
(op and node count), `-p` (environments) and `--system`, and setting the check's variables with
`-S`. Each invocation gets its own prefix under the run directory (results/runs/<campaign>-<UTC
time>/rfm-<n>/: stage, output, perflogs, report.json, reframe.out, ReFrame's debug log), and its
output streams to the terminal while it runs.

Afterwards every test case becomes one run in the store, whatever its outcome: status `pass` or
`fail` (with ReFrame's failure phase and reason), or `error` when ReFrame never ran it; with it go the
records of its commbench.jsonl that are valid (a failed run keeps those it produced). A run key
(campaigns.spec.TestCase.run_key) names each test case; passed runs are skipped on the next run.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from campaigns.records import RecordError, parse_records
from campaigns.spec import Campaign, TestCase
from campaigns.store import RunInfo, Store

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECKS_DIR = REPO_ROOT / "reframe_checks"
DEFAULT_RUNS_DIR = REPO_ROOT / "results" / "runs"
RECORDS_FILE = "commbench.jsonl"
REPORT_FILE = "report.json"
REFRAME_LOG = "reframe.out"

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # ReFrame colours failed performance values even with --nocolor
# "[       OK ] ( 3/14) commbench_run %op=pingpong %num_nodes=1 /b72462f8 @local:cpu+openmpi"
_RESULT_LINE = re.compile(r"^\[\s*(OK|FAIL|SKIP|ABORT|XFAIL|XPASS)\s*\] \(\s*(\d+)/(\d+)\) (.*)$")
_RESULT_STYLE = {"OK": "green", "FAIL": "bold red", "SKIP": "yellow", "ABORT": "bold red",
                 "XFAIL": "yellow", "XPASS": "red"}


@dataclass
class CaseResult:
    """What became of one test case. status: pass, fail, error (ReFrame did not run it to the end), or
    stored (a passed run with this key is already in the store, so it was not run again)."""

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


@dataclass
class CampaignResult:
    run_dir: Path | None
    db_url: str
    results: list[CaseResult]

    @property
    def all_passed(self) -> bool:
        return all(r.status in ("pass", "stored") for r in self.results)


@dataclass(frozen=True)
class Invocation:
    """One `reframe` run: test cases of one check entry on one partition that share environments."""

    check_index: int
    partition: str
    environments: tuple[str, ...]
    cases: tuple[TestCase, ...]

    def command(self, campaign: Campaign, prefix: Path) -> list[str]:
        reframe = Path(sys.executable).with_name("reframe")
        check = campaign.spec.checks[self.check_index]
        cmd = [str(reframe), "-C", str(campaign.site.reframe_config), "-c", str(CHECKS_DIR / "commbench.py"),
               "--system", f"{campaign.system.name}:{self.partition}",
               "-p", "^(" + "|".join(re.escape(env) for env in self.environments) + ")$"]
        for name in sorted({case.reframe_name for case in self.cases}):
            cmd += ["-n", name]
        for name, value in check.variables().items():
            cmd += ["-S", f"{check.check}.{name}={_reframe_value(value)}"]
        if check.tasks_per_node is not None:
            cmd += ["-S", f"{check.check}.num_tasks_per_node={check.tasks_per_node}"]
        if check.env:
            cmd += ["-S", env_vars_setting(check.check, check.env)]
        cmd += ["--prefix", str(prefix), "--report-file", str(prefix / REPORT_FILE), "--nocolor", "-r"]
        return cmd


def env_vars_setting(check: str, env: dict[str, str]) -> str:
    """`-S` argument that sets a check's env_vars to exactly `env`: JSON, since values may hold the ','
    and ':' of ReFrame's short dict syntax, and shell-quoted, since ReFrame writes `export NAME=VALUE`."""
    return f"{check}.env_vars=" + json.dumps({name: shlex.quote(value) for name, value in env.items()})


def _reframe_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def plan_invocations(cases: list[TestCase]) -> list[Invocation]:
    """Group test cases into as few ReFrame runs as the selection options allow: `-p` and `-n` select
    a product (environments x names), so test cases whose names want different environment sets go
    into separate invocations; so do different check entries (different variables) and partitions."""
    by_name: dict[tuple[int, str, str], set[str]] = defaultdict(set)
    for case in cases:
        by_name[case.check_index, case.partition, case.reframe_name].add(case.environ)
    groups: dict[tuple[int, str, tuple[str, ...]], set[str]] = defaultdict(set)
    for (index, partition, name), environs in by_name.items():
        groups[index, partition, tuple(sorted(environs))].add(name)
    return [Invocation(index, partition, environs,
                       tuple(c for c in cases if c.check_index == index and c.partition == partition
                             and c.environ in environs and c.reframe_name in names))
            for (index, partition, environs), names in groups.items()]


# What ReFrame's Slurm backends need from this host, probed before anything runs.
_SLURM_PROBES = {
    "slurm": [(["sinfo", "-h", "-o", "%P"], "Slurm's controller is not reachable"),
              (["sacct", "-n", "-X", "-j", "1", "-o", "jobid"],
               "ReFrame's slurm scheduler polls sacct, which fails here")],
    "squeue": [(["sinfo", "-h", "-o", "%P"], "Slurm's controller is not reachable")],
}


def preflight(campaign: Campaign) -> list[str]:
    """Problems that would make every job of the campaign fail, e.g. a Slurm site used without its
    environment (for localslurm: eval "$(site_configs/localslurm/cluster/cluster.sh env)")."""
    schedulers = sorted({p.scheduler for p in campaign.partitions} & set(_SLURM_PROBES))
    conf = os.environ.get("SLURM_CONF")
    if schedulers and conf and not Path(conf).is_file():
        return [f"SLURM_CONF={conf} does not exist (Slurm's commands would retry it for a minute)"]
    problems = []
    for scheduler in schedulers:
        for cmd, what in _SLURM_PROBES[scheduler]:
            try:
                probe = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                problems.append(f"{what}: {shlex.join(cmd)}: {exc}")
                continue
            if probe.returncode != 0:
                output = (probe.stderr or probe.stdout).strip()
                problems.append(f"{what}: {shlex.join(cmd)} exited {probe.returncode}: {output}")
    return problems


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


def stream_reframe(cmd: list[str], prefix: Path, console: Console) -> int:
    """Run ReFrame, keep its output in prefix/reframe.out, show test case results as they come."""
    prefix.mkdir(parents=True)
    # ReFrame writes its debug log (rfm-*.log) to $TMPDIR: keep it with the run.
    env = {**os.environ, "TMPDIR": str(prefix)}
    with (open(prefix / REFRAME_LOG, "w", encoding="utf-8") as log,
          subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                           env=env, cwd=REPO_ROOT) as proc,
          console.status("ReFrame: loading checks") as status):
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            text = _ANSI_ESCAPE.sub("", line.rstrip())
            match = _RESULT_LINE.match(text)
            if match:
                kind, done, total, name = match.groups()
                console.print(f"[{_RESULT_STYLE[kind]}]{kind:>5}[/] ({done}/{total}) {escape(name)}")
                status.update(f"ReFrame: {done}/{total} test cases done")
            elif text.startswith("P: "):
                console.print(f"        [dim]{escape(text[3:])}[/]")
            elif text.startswith("==> test failed"):
                console.print(f"        [red]{escape(text[4:])}[/]", soft_wrap=True)
            elif re.match(r"^\[\s*(PASSED|FAILED)\s*\]", text):
                console.print(escape(text))
        return proc.wait()


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
                and tc["environ"] == case.environ and tc.get("op") == case.op
                and tc.get("num_nodes") == case.num_nodes):
            return tc
    return None


def _valid_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Each line that is a valid record, and what is wrong with the others."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if line.strip():
            try:
                records += parse_records(line, f"{path.name} line {number}")
            except RecordError as exc:
                problems.append(str(exc))
    return records, problems


def _timestamp(unix: float | None) -> datetime | None:
    return datetime.fromtimestamp(unix, UTC) if unix else None


def _failure(tc: dict[str, Any], testcases: list[dict[str, Any]]) -> tuple[str, str]:
    """Status and reason of a test case that did not pass."""
    if tc["result"] == "fail":
        return "fail", f"{tc.get('fail_phase')}: {tc.get('fail_reason')}"
    if tc["result"] == "fail_deps":  # its build (fixture) failed
        failed = [f"{dep['display_name']} failed in {dep.get('fail_phase')}: {dep.get('fail_reason')} "
                  f"(see {dep.get('stagedir')})"
                  for dep in testcases if dep.get("fixture") and dep["result"] == "fail"
                  and [dep["unique_name"], f"{dep['system']}:{dep['partition']}", dep["environ"]]
                  in tc.get("dependencies_actual", [])]
        return "fail", "; ".join(failed) or "a dependency failed"
    return "error", f"ReFrame result {tc['result']}: {tc.get('fail_reason') or 'no reason given'}"


def case_outcome(case: TestCase, testcases: list[dict[str, Any]], reframe_rc: int,
             prefix: Path) -> tuple[CaseResult, list[dict[str, Any]]]:
    """The result of one test case and the records to store with it."""
    tc = _matching(case, testcases)
    if tc is None:
        reason = f"ReFrame (exit code {reframe_rc}) did not report this test case; see {prefix / REFRAME_LOG}"
        return CaseResult(case, "error", reason), []
    status, reason = ("pass", None) if tc["result"] == "pass" else _failure(tc, testcases)
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
    perf = {name.split(":")[-1]: (values[0], values[4]) for name, values in (tc.get("perfvalues") or {}).items()}
    return CaseResult(case, status, reason, perf, len(records), num_tasks=tc.get("num_tasks"),
                      job_id=tc.get("jobid"), started_at=_timestamp(tc.get("job_submit_time")),
                      finished_at=_timestamp(tc.get("job_completion_time_unix")), directory=directory), records


def ingest_case(store: Store, result: CaseResult, records: list[dict[str, Any]]) -> None:
    case = result.case
    store.ingest(RunInfo(
        run_key=case.run_key, campaign=case.campaign, site=case.site, system=case.system,
        partition=case.partition, environ=case.environ, check_name=case.check, parameters=case.parameters,
        num_nodes=case.num_nodes, num_tasks=result.num_tasks or case.num_tasks, status=result.status,
        reason=result.reason, started_at=result.started_at, finished_at=result.finished_at,
        job_id=result.job_id), records, replace=True)


def run_campaign(campaign: Campaign, store: Store, *, force: bool, console: Console,
                 runs_dir: Path = DEFAULT_RUNS_DIR) -> CampaignResult:
    cases = campaign.cases()
    pending = [c for c in cases if force or not store.has_run(c.run_key)]
    results = {c.run_key: CaseResult(c, "stored", "a passed run with this key is stored")
               for c in cases if c not in pending}
    run_dir = None
    if not pending:
        console.print(f"Nothing to run: all {len(cases)} test case(s) have passed runs stored "
                      f"(--force runs them again).")
    else:
        run_dir = new_run_dir(campaign, runs_dir)
        console.print(f"Running {len(pending)} of {len(cases)} test case(s) of campaign "
                      f"[bold]{escape(campaign.name)}[/] on site {campaign.site.name}, system "
                      f"{campaign.system.name}; run directory {run_dir}", soft_wrap=True)
        for number, invocation in enumerate(plan_invocations(pending), start=1):
            prefix = run_dir / f"rfm-{number}"
            cmd = invocation.command(campaign, prefix)
            rc = stream_reframe(cmd, prefix, console)
            report = prefix / REPORT_FILE
            testcases = report_testcases(report) if report.is_file() else []
            for case in invocation.cases:
                result, records = case_outcome(case, testcases, rc, prefix)
                ingest_case(store, result, records)
                results[case.run_key] = result
    return CampaignResult(run_dir, store.url, [results[c.run_key] for c in cases])
