"""`commcamp run` end to end on site "local": ReFrame builds and runs commbench with Open MPI and MPICH,
the runner stores every test case, skips stored passes, and records failures with their records."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from campaigns.reframe.runner import case_outcome, plan_invocations, report_testcases
from campaigns.model.spec import load_campaign
from campaigns.store import open_store
from fixtures_cli import commcamp

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "campaigns" / "smoke.yaml"
OPS = ("pingpong", "allreduce", "alltoall")
ENVIRONS = ("openmpi", "mpich")


def test_smoke_campaign_on_local(tmp_path: Path) -> None:
    db, runs = tmp_path / "results.db", tmp_path / "runs"
    code, out, err = commcamp("run", str(SMOKE), "--db", f"sqlite:///{db}", "--runs-dir", str(runs),
                              env={"COMMCAMP_HOME": str(tmp_path)})  # the perflogs' workspace
    assert code == 0, out + err
    assert f"Results: sqlite:///{db}" in out
    (run_dir,) = (p for p in runs.iterdir() if p.is_dir())  # beside the campaign's lock file
    assert f"Run directory: {run_dir}" in out

    with open_store(f"sqlite:///{db}") as store:
        stored = store.runs()
        assert {(r.status, r.environ, r.parameters["op"], r.num_nodes, r.num_tasks) for r in stored} == {
            ("pass", env, op, 1, 2) for op in OPS for env in ENVIRONS}
        frame = store.measurements()
    # smoke.yaml: 8 B .. 64 KiB by factor 8 = 5 sizes per op and environment, every one valid
    assert len(frame) == len(OPS) * len(ENVIRONS) * 5
    assert frame["valid"].all()
    by_case = frame.groupby(["op", "environ"]).size()
    assert len(by_case) == len(OPS) * len(ENVIRONS) and (by_case == 5).all()
    for ranks, hosts in zip(frame["ranks"], frame["hostnames"], strict=True):
        assert ranks == 2 and len(set(hosts)) == 1

    # What ReFrame left behind: the run report and, in one perflog per system in the workspace
    # (not one per invocation), lines that carry the node count, tasks, GPUs per node, the result, the
    # message size of each performance variable and value/unit/reference per performance variable.
    assert (run_dir / "rfm-1" / "report.json").is_file()
    assert not (run_dir / "rfm-1" / "perflogs").exists()
    perflog = (tmp_path / "reframe" / "perflogs" / "local" / "cpu" / "commbench_run.log").read_text().splitlines()
    header = perflog[0].split("|")
    for column in ("result", "num_nodes", "num_tasks", "num_gpus_per_node", "small_latency_value",
                   "small_latency_unit", "small_latency_ref", "large_busbw_value", "large_busbw_result"):
        assert column in header
    row = dict(zip(header, perflog[1].split("|"), strict=True))
    assert (row["result"], row["num_nodes"], row["num_tasks"], row["num_gpus_per_node"]) == ("pass", "1", "2", "0")
    assert row["small_latency_unit"] == "us" and float(row["small_latency_value"]) > 0
    assert row["small_latency_ref"] == "None" and row["metric_bytes"].startswith("small_latency=8,")
    assert len(perflog) == 1 + len(OPS) * len(ENVIRONS)  # every invocation's cases in the one file

    # Everything passed and is stored: a second run has nothing to do and starts no ReFrame.
    code, out, err = commcamp("run", str(SMOKE), "--db", f"sqlite:///{db}", "--runs-dir", str(runs),
                              env={"COMMCAMP_HOME": str(tmp_path)})  # the perflogs' workspace
    assert code == 0, out + err
    assert "Nothing to run" in out
    assert len([p for p in runs.iterdir() if p.is_dir()]) == 1


def test_a_relative_runs_dir_stores_passing_cases_as_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ReFrame runs with the invocation's prefix as its working directory: a relative --runs-dir put its
    report one level deeper, and every passing case was stored as FAIL with no measurements."""
    monkeypatch.chdir(tmp_path)
    Path("tiny.yaml").write_text(
        "name: tiny\nsite: local\nenvironments: [openmpi]\nnode_counts: [1]\n"
        "checks:\n  - check: commbench_run\n    ops: [pingpong]\n    min_bytes: 8\n    max_bytes: 64\n"
        "    step_factor: 8\n    warmup: 1\n    iters: 3\n    timeout_s: 30\n    time_limit_s: 60\n")
    code, out, err = commcamp("run", "tiny.yaml", "--db", "sqlite:///results.db", "--runs-dir", "relruns")
    assert code == 0, out + err
    (run_dir,) = (p for p in (tmp_path / "relruns").iterdir() if p.is_dir())
    assert f"Run directory: {run_dir}" in out and (run_dir / "rfm-1" / "report.json").is_file()
    with open_store(f"sqlite:///{tmp_path / 'results.db'}") as store:
        (run,) = store.runs()
        assert (run.status, run.num_measurements) == ("pass", 2), run.reason  # 8 and 64 bytes


def _failing_case(tmp_path: Path, name: str, check: str) -> str:
    """Run a one-case campaign on site local (`check`: the commbench_run check's fields) that fails, exit 1;
    the store's URL."""
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\nsite: local\nenvironments: [openmpi]\nnode_counts: [1]\n"
                    f"checks:\n  - check: commbench_run\n{check}")
    url = f"sqlite:///{tmp_path / 'results.db'}"
    code, out, err = commcamp("run", str(spec), "--db", url, "--runs-dir", str(tmp_path / "runs"))
    assert code == 1, out + err
    return url


def test_failed_case_is_stored_with_its_records_and_knobs_reach_the_run(tmp_path: Path) -> None:
    # commbench's own test hook corrupts received data: records with valid=false, exit code 1.
    url = _failing_case(tmp_path, "corrupt", "    ops: [allreduce]\n    sizes: [64, 4096]\n    iters: 3\n"
                        "    warmup: 1\n    timeout_s: 30\n    extra_args: [--inject, corrupt]\n"
                        "    env: {OMPI_COMMCAMP_PROBE: 'tcp,self:x^y/z+1'}\n")
    with open_store(url) as store:
        (run,) = store.runs()
        assert run.status == "fail"
        assert "commbench exited with code 1 (data validation failed)" in run.reason
        assert not store.has_run(run.run_key)  # a failed run is tried again next time
        frame = store.measurements()
    assert sorted(frame["bytes"]) == [64, 4096] and not frame["valid"].any()
    # The knob went through `-S env_vars=<JSON>` and the job script verbatim (commas, colon, caret, slash, plus;
    # whitespace and shell metacharacters are refused in the spec: tests/test_bad_input.py).
    assert all(env["OMPI_COMMCAMP_PROBE"] == "tcp,self:x^y/z+1" for env in frame["env"])
    for record in frame.to_dict("records"):
        assert record["wrong_elements"] > 0


def test_a_campaign_s_own_reference_judges_its_runs(tmp_path: Path) -> None:
    """A spec's `references` (before the site's) judged only health nights: a run or characterize case that missed
    one passed, exit 0. The check now takes them (-S campaign_references) and judges them first; a benchmark
    reference is not a commbench case's."""
    reference = ("references:\n  - {op: pingpong, metric: small_latency, bytes: 8, value: 0.0001, upper: 0.1}\n"
                 "  - {benchmark: osu_latency, metric: small_latency, bytes: 8, value: 1000, upper: 0.1}\n")
    spec = tmp_path / "ref.yaml"
    spec.write_text("name: ref\nsite: local\nenvironments: [openmpi]\nnode_counts: [1]\n" + reference +
                    "checks:\n  - check: commbench_run\n    ops: [pingpong]\n    sizes: [8]\n    iters: 3\n"
                    "    warmup: 1\n")
    (case,) = load_campaign(spec).cases()
    assert json.loads(case.references) == [{"op": "pingpong", "metric": "small_latency", "bytes": 8,
                                            "value": 0.0001, "upper": 0.1}]
    url = f"sqlite:///{tmp_path / 'results.db'}"
    code, out, err = commcamp("run", str(spec), "--db", url, "--runs-dir", str(tmp_path / "runs"))
    assert code == 1, out + err
    with open_store(url) as store:
        (run,) = store.runs()
    assert run.status == "fail" and "small_latency" in run.reason and "expected 0.0001" in run.reason, run.reason


def test_a_launch_that_fails_before_commbench_writes_is_not_called_wrong_data(tmp_path: Path) -> None:
    """Exit code 1 is commbench's "data validation failed", but also what Open MPI's start-up gives with an
    unknown BTL, before commbench writes a record: without a record of wrong data the reason says the launch
    failed. Before, a health night in that state read "data validation failed", exit 5."""
    url = _failing_case(tmp_path, "bogus", "    ops: [pingpong]\n    sizes: [64]\n    iters: 3\n    warmup: 1\n"
                        "    timeout_s: 30\n    env: {OMPI_MCA_btl: bogus}\n")
    with open_store(url) as store:
        (run,) = store.runs()
    assert run.status == "fail" and "data validation failed" not in run.reason, run.reason
    assert "exited with code 1 (no record reports wrong data: the launcher or MPI start-up failed" in run.reason
    # the reason names where the job's standard error is, and so `results prune` keeps that directory
    stage = Path(run.reason.rsplit("; files: ", 1)[1])
    assert stage.is_relative_to(tmp_path / "runs") and (stage / "rfm_job.err").is_file(), run.reason
    code, out, err = commcamp("results", "prune", "--runs-dir", str(tmp_path / "runs"), "--keep-days", "0",
                              "--db", url)
    assert code == 0 and f"still referenced by stored run {run.id} (" in out, out + err


def test_build_failure_is_the_reason_of_the_run(tmp_path: Path) -> None:
    """ReFrame marks the run test `fail_deps` when its build fixture fails; the stored reason is the build's."""
    broken = tmp_path / "src"
    broken.mkdir()
    (broken / "CMakeLists.txt").write_text('project(broken C)\nmessage(FATAL_ERROR "broken on purpose")\n')
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: b\nsite: local\nenvironments: [openmpi]\nnode_counts: [1]\n"
                    "checks:\n  - check: commbench_run\n    ops: [pingpong]\n")
    campaign = load_campaign(spec)
    (case,) = campaign.cases()
    (invocation,) = plan_invocations([case])
    prefix = tmp_path / "rfm"
    cmd = invocation.command(prefix)
    cmd[-1:-1] = ["-S", f"commbench_build.sourcesdir={broken}"]
    rc = subprocess.run(cmd, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
                        timeout=300, check=False).returncode
    assert rc == 1
    result, records = case_outcome(case, report_testcases(prefix / "report.json"), rc, prefix)
    assert (result.status, records) == ("fail", [])
    assert "commbench_build ~local:cpu+openmpi failed in compile_wait: build error" in result.reason


def test_reference_checks_of_a_campaign_are_stored_like_commbench(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec with commbench_run, osu_run and nccl_tests_run: `commcamp run` runs all three through ReFrame and
    stores each as a run of its check (the benchmark in its parameters) with the records `commcamp results
    ingest --format` makes of the same output on the same hosts. Stand-ins print the committed real outputs
    on rank 0 (tests/data; nccl-tests and OSU are not installed here)."""
    from campaigns.cli.results import ingest  # `commcamp results ingest`, in this process
    from fixtures_sites import NCCL_TESTS_OUTPUT, OSU_LATENCY_OUTPUT, reference_site, stand_in

    stand_in(tmp_path / "nccl-tests", "all_reduce_perf", NCCL_TESTS_OUTPUT)
    stand_in(tmp_path / "osu", "osu_latency", OSU_LATENCY_OUTPUT)
    sites = reference_site(tmp_path / "sites", "refsite", "local", {
        "nccl_tests": {"package": "nccl-tests", "default_dir": str(tmp_path / "nccl-tests"), "tasks_per_node": 1,
                       "node_counts": [1]},
        "osu": {"package": "osu-micro-benchmarks", "default_dir": str(tmp_path / "osu"), "node_counts": [1]}})
    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(sites))
    spec = tmp_path / "mixed.yaml"
    spec.write_text("name: mixed\nsite: refsite\nenvironments: [openmpi]\nnode_counts: [1]\n"
                    "checks:\n  - check: commbench_run\n    ops: [pingpong]\n    sizes: [8, 4096]\n    iters: 3\n"
                    "    warmup: 1\n  - check: osu_run\n    benchmarks: [osu_latency]\n    time_limit_s: 120\n"
                    "  - check: nccl_tests_run\n    benchmarks: [all_reduce_perf]\n"
                    "    env: {NCCL_PROTO: ^LL128}\n")
    db = f"sqlite:///{tmp_path / 'results.db'}"
    code, out, err = commcamp("run", spec, "--db", db, "--runs-dir", tmp_path / "runs")
    assert code == 0, out + err

    with open_store(db) as store:
        runs = {run.check_name: run for run in store.runs()}
        frame = store.measurements()
    assert set(runs) == {"commbench_run", "osu_run", "nccl_tests_run"}
    assert all(run.status == "pass" for run in runs.values()), [(r.check_name, r.reason) for r in runs.values()]
    assert runs["commbench_run"].parameters["op"] == "pingpong"
    assert sorted(frame[frame["run_id"] == runs["commbench_run"].id]["bytes"]) == [8, 4096]
    columns = ["op", "bytes", "latency_us", "busbw_gbs", "hostnames"]
    for check, benchmark, fmt, output in (("osu_run", "osu_latency", "osu", OSU_LATENCY_OUTPUT),
                                          ("nccl_tests_run", "all_reduce_perf", "nccl-tests", NCCL_TESTS_OUTPUT)):
        run = runs[check]
        assert run.parameters["benchmark"] == benchmark and run.campaign == "mixed"
        stored = frame[frame["run_id"] == run.id]
        hosts = list(stored["hostnames"].iloc[0])
        assert len(hosts) == run.num_tasks == (2 if fmt == "osu" else 1)
        assert run.parameters["hosts"] == sorted(set(hosts))
        # the same output through `results ingest --format` (OSU prints no hosts: the job's, as the check names them)
        direct = f"{db}-{check}"
        ingest(output, site="refsite", system="local", check_name=benchmark, db=direct, fmt=fmt,
               hosts=",".join(hosts) if fmt == "osu" else None)
        with open_store(direct) as direct_store:
            expected = direct_store.measurements()[columns].to_dict("records")
        assert stored[columns].to_dict("records") == expected
        assert len(expected) == {"osu": 17, "nccl-tests": 12}[fmt]  # a record per size of the output
        # the knobs the job ran with are the records' (a report pooled runs of other settings as "knobs unset")
        assert {json.dumps(env) for env in stored["env"]} == {json.dumps(
            {"NCCL_PROTO": "^LL128"} if check == "nccl_tests_run" else {})}, stored["env"]


def test_a_run_that_failed_only_its_performance_check_stays_measured(tmp_path: Path) -> None:
    """A run that ran well and missed its reference is judged and plotted night by night (references.measured: its
    reason starts with the performance phase). A harmless line its job printed (MPICH 4.0's MPI_Finalize warning,
    exit 0) was put in front of that reason as the run's first failure, and the run counted as not measured."""
    from fixtures_store import commbench_record

    from campaigns.model.references import measured
    from campaigns.store import RunInfo

    case = next(c for c in load_campaign(SMOKE).cases() if c.environ == "mpich" and c.op == "pingpong")
    (tmp_path / "commbench.jsonl").write_text(json.dumps(commbench_record()) + "\n")
    (tmp_path / "rfm_job.err").write_text("commbench: MPI_Finalize did not return within 10 s; exiting with code 0\n")
    testcase = {"name": "commbench_run %op=pingpong %num_nodes=1", "partition": case.partition,
                "environ": "mpich", "op": "pingpong", "num_nodes": 1, "result": "fail", "fail_phase": "performance",
                "fail_reason": "failed to meet references: small_latency=30.1, expected 10.5 (l=-inf, u=99.0)",
                "stagedir": str(tmp_path), "job_stderr": "rfm_job.err", "perfvalues": {}}
    result, records = case_outcome(case, [testcase], 1, tmp_path)
    assert result.status == "fail" and len(records) == 1 and result.reason.startswith("performance: failed to meet")
    assert measured(RunInfo(run_key="k", campaign="c", site="s", system="x", partition="p", environ="mpich",
                            check_name="commbench_run", parameters={}, num_nodes=1, num_tasks=2, status="fail",
                            reason=result.reason))


def test_ctrl_c_while_a_case_is_stored_comes_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """signals_deferred blocked SIGINT in the main thread only; the kernel gave it to another thread (BLAS's pool,
    rich's refresh: there always is one) and Python raised KeyboardInterrupt inside the block, the case that had
    just finished rolled back. Now the interrupt comes once the case is stored."""
    import os
    import signal
    import threading
    import time

    import campaigns.store.store as store_module
    from fixtures_store import commbench_record

    from campaigns.reframe.runner import CaseResult, ingest_case

    waiting = threading.Event()
    helper = threading.Thread(target=waiting.wait, daemon=True)  # another thread the kernel may hand it to
    helper.start()
    case = next(c for c in load_campaign(SMOKE).cases() if c.environ == "mpich" and c.op == "pingpong")
    original = store_module._run_row

    def pressed_while_storing(run):  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        return original(run)

    monkeypatch.setattr(store_module, "_run_row", pressed_while_storing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as at a terminal
    try:
        with open_store(f"sqlite:///{tmp_path / 'results.db'}") as store:
            with pytest.raises(KeyboardInterrupt):
                ingest_case(store, CaseResult(case, "pass", hosts=("vm",)), [commbench_record()])
            assert len(store.runs(run_key=case.run_key)) == 1  # stored whole before the interrupt
    finally:
        signal.signal(signal.SIGINT, previous)
        waiting.set()
