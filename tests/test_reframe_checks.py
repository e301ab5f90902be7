"""The ReFrame side on its own: site configurations built from site.yaml, the commbench checks with
references from partition extras, knob defaults and env_vars overrides in every job, perflogs, the
reference-benchmark checks, and the documented plain `reframe` commands on local and localslurm."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from campaigns.model.site import COMMBENCH_OPS, NODE_COUNTS, available_sites, load_site
from campaigns.model.spec import COMMBENCH_NODE_COUNTS
from fixtures_sites import site_data, stand_in, write_site
from fixtures_slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
REFRAME = Path(sys.executable).with_name("reframe")
SITE_CONFIGS = REPO / "site_configs"
CHECKS = REPO / "reframe_checks"
DATA = REPO / "tests" / "data"
RECORDS = "commbench.jsonl"  # what the checks write and the campaign runner stores
NCCL_TESTS_OUTPUT = REPO / "results" / "reference" / "h200x4" / "run1" / "nt-outputs" / "all_reduce.txt"
# Small and fast: every commbench check of a run below takes these.
QUICK = ["-S", "iters=3", "-S", "warmup=1", "-S", "sizes=8,4096"]


def reframe(config: Path | None, *args: str, prefix: Path, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`reframe [-C config] -c reframe_checks ARGS` with stage/output/perflogs/report under `prefix`."""
    cmd = [str(REFRAME), *(["-C", str(config)] if config else []), "-c", str(CHECKS), "--prefix", str(prefix),
           "--perflogdir", str(prefix / "perflogs"), "--report-file", str(prefix / "report.json"), "--nocolor", *args]
    # TMPDIR: ReFrame's debug log (rfm-*.log) goes there.
    return subprocess.run(cmd, env={**(env or os.environ), "TMPDIR": str(prefix.parent)}, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, check=False)


def perflog_rows(path: Path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    header = lines[0].split("|")
    return [dict(zip(header, line.split("|"), strict=True)) for line in lines[1:]]


def report_cases(prefix: Path) -> list[dict[str, Any]]:
    report = json.loads((prefix / "report.json").read_text())
    return [tc for run in report["runs"] for tc in run["testcases"] if not tc["fixture"]]


def load_file(path: Path, name: str) -> ModuleType:
    """Import a file as module `name` (a check file: ReFrame looks its classes up in sys.modules)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def copy_site(tmp_path: Path, name: str, edit: Any = None, source: str | None = None) -> Path:
    """A copy of site_configs/<source or name> (site.yaml edited by `edit(data)`) whose reframe_config.py
    loads it; returns the copy's reframe_config.py."""
    return write_site(tmp_path / f"site-{name}", site_data(source or name, edit))


def local_partition(data: dict[str, Any]) -> dict[str, Any]:
    return data["systems"][0]["partitions"][0]


def test_check_constants_agree_with_site_model_and_campaigns() -> None:
    lib = load_file(CHECKS / "lib" / "commcamp_checks.py", "commcamp_checks_under_test")
    campaign_check = load_file(CHECKS / "commbench_run.py", "commbench_run_under_test")
    assert tuple(lib.NODE_COUNTS) == NODE_COUNTS == COMMBENCH_NODE_COUNTS
    assert tuple(campaign_check.CAMPAIGN_OPS) == COMMBENCH_OPS


def test_reframe_configs_carry_site_data_as_extras_and_features() -> None:
    sys.path.insert(0, str(SITE_CONFIGS))
    try:
        import reframe_site
    finally:
        sys.path.remove(str(SITE_CONFIGS))
    for name in available_sites():
        site = load_site(name)
        config = reframe_site.site_configuration(site.directory / "site.yaml")
        for system, model in zip(config["systems"], site.systems, strict=True):
            assert system["name"] == model.name
            for part, part_model in zip(system["partitions"], model.partitions, strict=True):
                commbench = part_model.commbench
                assert commbench is not None
                assert part["extras"]["nodes"] == part_model.nodes
                assert part["extras"]["gpus_per_node"] == part_model.node.gpus
                assert part["extras"]["commbench"]["transports"] == commbench.transports
                assert {f"commbench_{t}" for t in commbench.transports} <= set(part["features"])
                assert {f"commbench_nodes_{n}" for n in commbench.node_counts} <= set(part["features"])
                assert set(part_model.reference_benchmarks) <= set(part["features"])
                env = dict(part["env_vars"])
                assert {k: str(v) for k, v in site.knobs.get("pinned", {}).items()}.items() <= env.items()
        assert config["general"][0]["report_file"].endswith("run-report-{sessionid}.json")


def test_message_sizes_with_units_reach_commbench_in_bytes(tmp_path: Path) -> None:
    """site.yaml sizes may carry units (`8B`, `64K`, `1MiB`: campaigns.model.sizes, which site check validates them
    by), but commbench reads neither `8B` nor `1MiB` (exit 2, bad arguments): the partition extras hand the checks
    the validated byte counts, and the job scripts pass those."""
    from campaigns.model.site import Site
    from campaigns.model.yamlio import YamlDocument

    def edit(data: dict[str, Any]) -> None:
        sizes = local_partition(data)["commbench"]["sizes"]
        sizes["health"] = {"min_bytes": "8B", "max_bytes": "1MiB", "step_factor": 4}
        sizes["matrix"] = {"sizes": [8, "64K", "1MiB"]}
    config = copy_site(tmp_path, "local", edit)
    site = YamlDocument(config.with_name("site.yaml")).validate(Site)
    sys.path.insert(0, str(SITE_CONFIGS))
    try:
        import reframe_site
    finally:
        sys.path.remove(str(SITE_CONFIGS))
    (part,) = reframe_site.site_configuration(config.with_name("site.yaml"))["systems"][0]["partitions"]
    model = site.systems[0].partitions[0].commbench
    assert model is not None
    assert part["extras"]["commbench"]["sizes"] == {
        name: size_set.model_dump(exclude_none=True) for name, size_set in model.sizes.items()}
    assert part["extras"]["commbench"]["sizes"]["health"] == {"min_bytes": 8, "max_bytes": 1048576, "step_factor": 4}

    prefix = tmp_path / "rfm"
    result = reframe(config, "--dry-run", "-n", "commbench_sweep%op=pingpong%transport=mpi%size_range=health", "-n",
                     "commbench_pairmatrix", "-p", "openmpi", prefix=prefix)
    assert result.returncode == 0, result.stdout + result.stderr
    scripts = {script.parent.name.rsplit("_", 1)[0]: script.read_text()
               for script in (prefix / "stage").glob("local/cpu/openmpi/*/rfm_job.sh")}
    assert " --min-bytes 8 --max-bytes 1048576 --step-factor 4 " in scripts["commbench_sweep"], scripts
    assert " --sizes 8,65536,1048576 " in scripts["commbench_pairmatrix"], scripts


def test_env_vars_and_knob_defaults_reach_every_job(tmp_path: Path) -> None:
    """`-S env_vars=<JSON>` reaches the job script of every check (commbench and reference benchmarks)
    over the site's knob defaults; knob_defaults=false leaves those out. Dry runs: scripts, no jobs."""
    def edit(data: dict[str, Any]) -> None:
        data["knobs"] = {"defaults": {"UCX_RNDV_THRESH": 8192, "UCX_TLS": "^cuda_ipc"}}
        local_partition(data)["reference_benchmarks"] = {"nccl_tests": {
            "package": "nccl-tests", "dir_variable": "NCCL_TESTS_DIR", "node_counts": [1]}}
    config = copy_site(tmp_path, "local", edit)
    stand_in = tmp_path / "nccl-tests"
    stand_in.mkdir()
    for binary in ("all_reduce_perf", "all_gather_perf", "alltoall_perf", "sendrecv_perf"):
        (stand_in / binary).write_text("#!/bin/sh\n")
        (stand_in / binary).chmod(0o755)
    env = {**os.environ, "NCCL_TESTS_DIR": str(stand_in)}
    prefix = tmp_path / "override"
    one_of_each = ["-n", "commbench_run%op=allreduce", "-n", "commbench_sweep%op=allreduce", "-n",
                   "commbench_pairmatrix", "-n", "nccl_tests_run%benchmark=all_reduce_perf", "-p", "openmpi"]
    result = reframe(config, "--dry-run", *one_of_each,
                     "-S", 'env_vars={"UCX_RNDV_THRESH":"16384","COMMCAMP_PROBE":"a,b:c"}', prefix=prefix, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    scripts = sorted((prefix / "stage").glob("local/cpu/*/*/rfm_job.sh"))
    checks = {script.parent.name.rsplit("_", 1)[0] for script in scripts}
    assert checks == {"commbench_run", "commbench_sweep", "commbench_pairmatrix", "nccl_tests_run"}
    for script in scripts:
        text = script.read_text()
        assert "export UCX_RNDV_THRESH=16384" in text and "export COMMCAMP_PROBE=a,b:c" in text, script
        assert "export UCX_TLS='^cuda_ipc'" in text, script  # the other default stays, shell-quoted
    prefix = tmp_path / "no-defaults"
    result = reframe(config, "--dry-run", *one_of_each, "-S", "knob_defaults=false", prefix=prefix, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    scripts = list((prefix / "stage").glob("local/cpu/*/*/rfm_job.sh"))
    assert scripts and not any("UCX_RNDV_THRESH" in script.read_text() for script in scripts)


def test_unsafe_variables_never_reach_a_job_script(tmp_path: Path) -> None:
    """issue 11 item 5, through the documented path (`. site_configs/local/env.sh; reframe ... --dry-run`):
    shell-active or out-of-domain env_vars, a forbidden knob and shell-active extra_args fail the test case
    in setup with a message naming the variable, and no job script holds them; a good value still reaches
    the script, shell-quoted."""
    def dry_run(name: str, *settings: str) -> tuple[subprocess.CompletedProcess[str], str]:
        prefix = tmp_path / name
        shell = " ".join(["cd", str(REPO), "&&", ".", str(SITE_CONFIGS / "local" / "env.sh"), "&&", "TMPDIR=" +
                          str(tmp_path), str(REFRAME), "-c", str(CHECKS), "-t", "health", "-n", "'sweep.*pingpong'",
                          "-p", "openmpi", "--prefix", str(prefix), "--nocolor", "--dry-run",
                          *(f"-S {setting!r}" for setting in settings)])
        result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=300, check=False,
                                env={k: v for k, v in os.environ.items() if k != "RFM_CONFIG_FILES"})
        scripts = "".join(p.read_text() for p in (prefix / "stage").glob("local/cpu/*/commbench_sweep_*/rfm_job.sh"))
        return result, scripts

    for setting, message in [
            ('env_vars={"OMPI_MCA_btl_tcp_sndbuf":"4; rm -rf /tmp/x","UCX_TLS":"$(id)"}',
             "env_vars: OMPI_MCA_btl_tcp_sndbuf: value '4; rm -rf /tmp/x' is not allowed"),
            ('env_vars={"MY_VARIABLE":"`id`"}', "env_vars: MY_VARIABLE: value '`id`' is not allowed"),
            ('env_vars={"OMPI_MCA_btl_tcp_sndbuf":"1000"}', "env_vars: OMPI_MCA_btl_tcp_sndbuf: 1000 is outside"),
            ('env_vars={"NCCL_NVLS_ENABLE":"1"}', "env_vars: NCCL_NVLS_ENABLE is forbidden by the knob catalog"),
            ("extra_args=--peer,1;id", "extra_args: value '1;id' is not allowed")]:
        result, scripts = dry_run("bad", setting)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "Failing phase: setup" in result.stdout and message in result.stdout, result.stdout
        assert "Traceback" not in result.stdout
        assert "rm -rf" not in scripts and "id`" not in scripts and "$(id)" not in scripts and "1;id" not in scripts
    result, scripts = dry_run("good", 'env_vars={"NCCL_PROTO":"^LL128","OMPI_MCA_btl_tcp_sndbuf":"65536"}',
                              "extra_args=--peer,1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "export NCCL_PROTO='^LL128'\n" in scripts and "export OMPI_MCA_btl_tcp_sndbuf=65536\n" in scripts
    assert re.search(r"/commbench --op pingpong --transport mpi .* --peer 1\n", scripts), scripts


def test_references_and_expected_unsupported_transports_judge_the_run(tmp_path: Path) -> None:
    """A reference the run cannot meet fails the test case in its performance stage (references for
    another transport or rank count do not apply), and the perflog line says so. A transport the site
    says must be unsupported (GPU-aware MPI on h200) fails when commbench measures it instead of
    answering `unsupported` with exit code 4."""
    def references(data: dict[str, Any]) -> None:
        local_partition(data)["commbench"]["references"] = [
            {"op": "pingpong", "metric": "small_latency", "bytes": 8, "ranks": 4, "value": 1e-6, "upper": 0.1},
            {"op": "pingpong", "metric": "small_latency", "bytes": 8, "transport": "mpi", "value": 0.001,
             "upper": 0.5},
            {"op": "pingpong", "metric": "large_goodput", "bytes": 4096, "nodes": 1, "environ": "openmpi",
             "value": 1e-6, "lower": -0.5},
        ]
    prefix = tmp_path / "rfm"
    result = reframe(copy_site(tmp_path, "local", references), "-n", "commbench_sweep%op=pingpong%transport=mpi"
                     "%size_range=health", "-p", "openmpi", *QUICK, "-r", prefix=prefix)
    assert result.returncode == 1, result.stdout + result.stderr
    (row,) = perflog_rows(prefix / "perflogs" / "local" / "cpu" / "commbench_sweep.log")
    assert (row["result"], row["num_nodes"], row["num_tasks"], row["num_gpus_per_node"], row["transport"]) == (
        "fail", "1", "2", "0", "mpi")
    assert (row["small_latency_ref"], row["small_latency_upper_thres"], row["small_latency_result"]) == (
        "0.001", "0.5", "fail")
    assert (row["large_goodput_ref"], row["large_goodput_lower_thres"], row["large_goodput_result"]) == (
        "1e-06", "-0.5", "pass")
    (case,) = report_cases(prefix)
    assert case["fail_phase"] == "performance"

    def unsupported(data: dict[str, Any]) -> None:
        local_partition(data)["commbench"]["expect_unsupported"] = {"mpi": "pretend the MPI cannot"}
    prefix = tmp_path / "rfm-unsupported"
    result = reframe(copy_site(tmp_path, "local-unsupported", unsupported, source="local"), "-n",
                     "commbench_pairmatrix", "-p", "openmpi", *QUICK, "-r", prefix=prefix)
    assert result.returncode == 1, result.stdout + result.stderr
    (case,) = report_cases(prefix)
    assert case["fail_phase"] == "sanity"
    assert "commbench exited with code 0" in case["fail_reason"] and "expected 4" in case["fail_reason"]


def test_reference_benchmarks_run_from_the_site_directory_or_skip_with_the_reason(tmp_path: Path) -> None:
    """nccl-tests found through NCCL_TESTS_DIR run under the site's launcher and are judged like commbench
    (stand-in: a script that prints the real 4-rank all_reduce_perf output of the H200 machine, rank 0
    only, since no GPU is here); OSU where the site's directory has no binaries is skipped, saying so."""
    binary = stand_in(tmp_path / "nccl-tests" / "build", "all_reduce_perf", NCCL_TESTS_OUTPUT)

    def edit(data: dict[str, Any]) -> None:
        local_partition(data)["reference_benchmarks"] = {
            "nccl_tests": {"package": "nccl-tests", "dir_variable": "NCCL_TESTS_DIR", "tasks_per_node": 4,
                           "node_counts": [1], "references": [
                               {"benchmark": "all_reduce_perf", "metric": "large_busbw", "bytes": 4294967296,
                                "value": 362, "lower": -0.1},
                               {"benchmark": "all_reduce_perf", "metric": "small_latency", "bytes": 8,
                                "value": 8.3, "upper": 0.5}]},
            "osu": {"package": "osu-micro-benchmarks", "default_dir": str(tmp_path / "no-osu"), "node_counts": [1]}}
    prefix = tmp_path / "rfm"
    result = reframe(copy_site(tmp_path, "local", edit), "-n", "nccl_tests_run%benchmark=all_reduce_perf", "-n",
                     "osu_run%benchmark=osu_latency", "-p", "openmpi", "-r", prefix=prefix,
                     env={**os.environ, "NCCL_TESTS_DIR": str(binary.parent.parent)})
    # 23.58 us at 8 B (nccl-tests' first-size warm-up) misses the 8.3 us reference by more than 50%
    assert result.returncode == 1, result.stdout + result.stderr
    cases = {tc["display_name"].split()[0]: tc for tc in report_cases(prefix)}
    assert cases["osu_run"]["result"] == "skip"
    # ReFrame's report has no skip reason; its output line has: [ SKIP ] ... [reason]
    assert re.search(r"SKIP .* osu_run .*\[osu-micro-benchmarks is not available on local:cpu: no executable "
                     rf"osu_latency in {re.escape(str(tmp_path / 'no-osu'))}\]", result.stdout), result.stdout
    nccl = cases["nccl_tests_run"]
    assert (nccl["result"], nccl["fail_phase"]) == ("fail", "performance")
    perf = {name.split(":")[-1]: values for name, values in nccl["perfvalues"].items()}
    # busbw from the size and time as commbench defines it; nccl-tests printed 362.38 (its rounding)
    assert perf["large_busbw"][0] == pytest.approx(362.38, abs=0.01) and perf["large_busbw"][1] == 362
    assert perf["small_latency"][:2] == [23.58, 8.3]
    job = next((prefix / "stage").glob("local/cpu/openmpi/nccl_tests_run_*/rfm_job.sh")).read_text()
    assert re.search(rf' -n 4 {re.escape(str(binary))} -g 1 -c 1\n', job), job



def test_reference_benchmarks_store_their_output_as_results_ingest_reads_it(tmp_path: Path) -> None:
    """nccl-tests and OSU checks write their output as the records `commcamp results ingest --format` makes
    of it (campaigns.formats.foreign), and `commcamp results ingest` stores that file. Stand-ins print
    committed real outputs (rank 0 only): nccl-tests 2.19.6 all_reduce_perf on one H100, OSU 7.0
    osu_latency on 2 ranks (tests/data/nt-outputs, tests/data/osu)."""
    from campaigns.formats import foreign
    from campaigns.cli.results import ingest  # `commcamp results ingest`, in this process
    from campaigns.store import open_store

    outputs = {"all_reduce_perf": DATA / "nt-outputs" / "all_reduce_perf.txt",
               "osu_latency": DATA / "osu" / "osu_latency.txt"}
    for binary, output in outputs.items():
        stand_in(tmp_path / binary.split("_")[0], binary, output)

    def edit(data: dict[str, Any]) -> None:
        local_partition(data)["reference_benchmarks"] = {
            "nccl_tests": {"package": "nccl-tests", "default_dir": str(tmp_path / "all"), "tasks_per_node": 1,
                           "node_counts": [1]},
            "osu": {"package": "osu-micro-benchmarks", "default_dir": str(tmp_path / "osu"), "node_counts": [1]}}
    prefix = tmp_path / "rfm"
    result = reframe(copy_site(tmp_path, "local", edit), "-n", "nccl_tests_run%benchmark=all_reduce_perf", "-n",
                     "osu_run%benchmark=osu_latency", "-p", "openmpi", "-r", prefix=prefix)
    assert result.returncode == 0, result.stdout + result.stderr
    db = f"sqlite:///{tmp_path / 'results'}"
    for check, binary, fmt in (("nccl_tests_run", "all_reduce_perf", "nccl-tests"), ("osu_run", "osu_latency", "osu")):
        [written] = prefix.glob(f"output/local/cpu/openmpi/{check}_*/{RECORDS}")
        records = [json.loads(line) for line in written.read_text().splitlines()]
        hosts = records[0]["hostnames"]
        assert len(hosts) == (1 if fmt == "nccl-tests" else 2) and len(set(hosts)) == 1
        expected = foreign.parse(fmt, outputs[binary].read_text(), source=binary, timestamp=datetime.now(timezone.utc),
                                 hostnames=hosts)
        assert [{**r, "timestamp": ""} for r in records] == [{**r, "timestamp": ""} for r in expected]
        assert {r["source"]["benchmark"] for r in records} == {fmt}
        # stored as they are, and as `results ingest --format` stores the benchmark's own output
        for name, file, options in (("check", written, {}), ("direct", outputs[binary], {"fmt": fmt,
                                                                                           "hosts": ",".join(hosts)})):
            ingest(file, site="local", system="local", check_name=binary, db=f"{db}-{name}", **options)
        with open_store(f"{db}-check") as check_store, open_store(f"{db}-direct") as direct_store:
            columns = ["op", "bytes", "latency_us", "busbw_gbs", "hostnames"]
            assert (check_store.measurements()[columns].to_dict("records")
                    == direct_store.measurements()[columns].to_dict("records"))


def test_reference_benchmarks_fail_sanity_on_a_failed_data_check_or_output_records_cannot_be_made_of(
        tmp_path: Path) -> None:
    """OSU's own data check (-c: a Fail in its Validation column) fails osu_run in sanity, as nccl-tests' wrong
    elements fail nccl_tests_run (its bandwidth would otherwise be taken at another size, silently); so does
    output the records cannot be made of (a 0.00 latency, which campaigns.formats.foreign refuses), also with
    --skip-performance-check (campaigns with check_performance: false), where no metric is taken."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "osu_bw.txt").write_text(
        "# OSU MPI Bandwidth Test v7.3\n# Size      Bandwidth (MB/s)        Validation\n# Datatype: MPI_CHAR.\n"
        "1                       0.50        Pass\n4096                  300.00        Pass\n"
        "1048576              9000.00        Fail\n")
    (outputs / "osu_latency.txt").write_text(
        "# OSU MPI Latency Test v7.3\n# Size          Latency (us)\n1                       0.00\n"
        "4096                    2.50\n")
    for binary in ("osu_bw", "osu_latency"):
        stand_in(tmp_path / "osu", binary, outputs / f"{binary}.txt")

    def edit(data: dict[str, Any]) -> None:
        local_partition(data)["reference_benchmarks"] = {
            "osu": {"package": "osu-micro-benchmarks", "default_dir": str(tmp_path / "osu"), "node_counts": [1]}}
    prefix = tmp_path / "rfm"
    result = reframe(copy_site(tmp_path, "local", edit), "-n", "osu_run%benchmark=osu_bw", "-n",
                     "osu_run%benchmark=osu_latency", "-p", "openmpi", "--skip-performance-check", "-r", prefix=prefix)
    assert result.returncode == 1, result.stdout + result.stderr
    cases = {tc["display_name"].split()[1]: tc for tc in report_cases(prefix)}
    assert {name: (tc["result"], tc["fail_phase"]) for name, tc in cases.items()} == {
        "%benchmark=osu_bw": ("fail", "sanity"), "%benchmark=osu_latency": ("fail", "sanity")}
    assert "1048576 B: osu_bw's data check failed" in cases["%benchmark=osu_bw"]["fail_reason"]
    assert "1: 0.0 is not a positive latency" in cases["%benchmark=osu_latency"]["fail_reason"]
    # what did parse is kept, its failed size marked invalid (as commbench's records of wrong data)
    [written] = prefix.glob(f"stage/local/cpu/openmpi/osu_run_*/{RECORDS}")
    assert [(r["bytes"], r["valid"]) for r in map(json.loads, written.read_text().splitlines())] == [
        (1, True), (4096, True), (1048576, False)]


@pytest.mark.slurm
def test_localslurm_suite_on_two_and_three_nodes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The health suite's multi-node cases on the local Slurm cluster (3 nodes): sweeps on 2 and 3 nodes
    (pingpong only on 2) and the pair matrix of every node, through the site's env.sh."""
    env = dict(slurm_cluster.env)
    env["RFM_CONFIG_FILES"] = str(SITE_CONFIGS / "localslurm" / "reframe_config.py")
    prefix = tmp_path / "rfm"
    # Performance is not what this test is about (the host is shared; references are tested above).
    result = reframe(None, "-t", "health", "-n", "%num_nodes=(2|3)", "-p", "openmpi", *QUICK,
                     "-S", "time_limit=2m", "--skip-performance-check", "-r", prefix=prefix, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    cases = report_cases(prefix)
    assert sorted(tc["display_name"] for tc in cases) == sorted(
        [f"commbench_pairmatrix %transport=mpi %num_nodes={n}" for n in (2, 3)] +
        [f"commbench_sweep %op={op} %transport=mpi %size_range=health %num_nodes={n}"
         for op, n in (("allreduce", 2), ("alltoall", 2), ("pingpong", 2), ("allreduce", 3), ("alltoall", 3))])
    for tc in cases:
        assert tc["result"] == "pass"
        assert len(tc["job_nodelist"]) == tc["num_nodes"] and set(tc["job_nodelist"]) <= set(slurm_cluster.nodes)
    records = [json.loads(line) for path in
               (prefix / "output").glob("localslurm/debug/openmpi/commbench_pairmatrix_*/commbench.jsonl")
               for line in path.open()]
    records = [r for r in records if r["ranks"] == 6]
    assert records and len(set(records[0]["hostnames"])) == 3
    # one pair per node (2 ranks each), never across nodes
    assert {(r["pair"]["src"], r["pair"]["dst"]) for r in records} == {(0, 1), (2, 3), (4, 5)}


@pytest.mark.slurm
def test_dash_c_form_runs_on_localslurm_without_env_file(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """README: `reframe -C site_configs/localslurm/reframe_config.py -c reframe_checks -r` works without
    env.sh (no SLURM_CONF, no sacct shim on PATH): the configuration takes them from `cluster.sh env`."""
    shim = str(SITE_CONFIGS / "localslurm" / "cluster" / "bin")
    env = {k: v for k, v in slurm_cluster.env.items() if k != "SLURM_CONF" and not k.startswith("RFM_")}
    env["PATH"] = ":".join(d for d in env["PATH"].split(":") if d != shim)
    prefix = tmp_path / "rfm"
    result = reframe(SITE_CONFIGS / "localslurm" / "reframe_config.py", "-n",
                     "commbench_sweep%op=pingpong%transport=mpi%size_range=health%num_nodes=2", "-p", "openmpi",
                     *QUICK, "-S", "time_limit=2m", "--skip-performance-check", "-r", prefix=prefix, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    (case,) = report_cases(prefix)
    assert case["result"] == "pass" and set(case["job_nodelist"]) <= set(slurm_cluster.nodes)


def test_env_file_makes_plain_reframe_find_the_configuration(tmp_path: Path) -> None:
    """`. site_configs/local/env.sh; reframe -c reframe_checks -l` (no -C): RFM_CONFIG_FILES does it."""
    shell = (f". {SITE_CONFIGS / 'local' / 'env.sh'} && TMPDIR={tmp_path} {REFRAME} -c {CHECKS} "
             f"--prefix {tmp_path / 'rfm'} -t health -l")
    result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=300, check=False,
                            cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "RFM_CONFIG_FILES"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "commbench_pairmatrix %transport=mpi %num_nodes=1" in result.stdout


def test_env_file_stores_sessions_in_the_workspace_and_perflogs_say_sizes_not_ref_0(tmp_path: Path) -> None:
    """issue 11 item 10: env.sh turns ReFrame's results storage on in the workspace (results/reframe/, not
    ~/.reframe), so --list-stored-sessions and --performance-compare work; the perflog goes to one
    continuous place whatever --prefix says, names the message size of each performance variable and
    has no reference 0 where none applies; no warning about the reference checks' num_nodes."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RFM_")}
    source = f"cd {tmp_path} && . {SITE_CONFIGS / 'local' / 'env.sh'} && "
    shown = subprocess.run(["bash", "-c", source + 'echo "$RFM_ENABLE_RESULTS_STORAGE $RFM_SQLITE_DB_FILE"'],
                           capture_output=True, text=True, check=True, env=base).stdout.split()
    assert shown == ["1", str(REPO / "results" / "reframe" / "results.db")]
    sys.path.insert(0, str(SITE_CONFIGS))
    try:
        import reframe_site
    finally:
        sys.path.remove(str(SITE_CONFIGS))
    (handler,) = reframe_site.site_configuration(SITE_CONFIGS / "local" / "site.yaml")["logging"][0]["handlers_perflog"]
    assert handler["basedir"] == str(REPO / "results" / "reframe" / "perflogs")  # absolute: not under --prefix

    env = {**base, "RFM_SQLITE_DB_FILE": str(tmp_path / "results.db"), "TMPDIR": str(tmp_path)}
    run = [str(REFRAME), "-c", str(CHECKS), "--nocolor", "-n",
           "commbench_sweep%op=pingpong%transport=mpi%size_range=health", "-p", "openmpi", "-S", "commbench_sweep.iters=3", "-S", "commbench_sweep.warmup=1",
           "-S", "commbench_sweep.sizes=8,4096", "--prefix", str(tmp_path / "rfm"),
           "--perflogdir", str(tmp_path / "perflogs"), "-r"]
    result = subprocess.run(["bash", "-c", source + shlex.join(run)], capture_output=True, text=True, timeout=300,
                            env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"results database:  [on] '{tmp_path / 'results.db'}'" in result.stdout
    assert "parameters are undefined" not in result.stdout + result.stderr
    (row,) = perflog_rows(tmp_path / "perflogs" / "local" / "cpu" / "commbench_sweep.log")
    assert row["metric_bytes"] == "small_latency=8,large_goodput=4096,large_busbw=4096"
    assert (row["small_latency_ref"], row["large_goodput_ref"]) == ("None", "None")

    def stored(*args: str) -> str:
        done = subprocess.run(["bash", "-c", source + shlex.join([str(REFRAME), "--nocolor", *args])],
                              capture_output=True, text=True, timeout=120, env=env, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout
    sessions = stored("--list-stored-sessions", "--table-format", "csv").strip().splitlines()
    assert sessions[-2] == "UUID,Start time,End time,Num runs,Num cases" and len(sessions[-1].split(",")) == 5
    uuid = sessions[-1].split(",")[0]
    compared = stored(f"--performance-compare={uuid}/{uuid}/mean:/", "--table-format", "csv")
    assert re.search(r"commbench_sweep .*,local:cpu\+openmpi,small_latency,us,[0-9.]+,[0-9.]+,0", compared), compared


def test_an_expected_nonzero_exit_is_not_a_failed_job() -> None:
    """ReFrame's local scheduler (and Slurm) report a job whose program exited non-zero as FAILURE/FAILED:
    when the check expects that exit code (an unsupported transport, exit 4) the job still ended normally;
    a job killed by its scheduler never did."""
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "reframe_checks"))
    from lib.commcamp_checks import assert_job_ended
    from reframe.core.exceptions import SanityError

    def job(state: str, exitcode: int) -> SimpleNamespace:
        return SimpleNamespace(job=SimpleNamespace(state=state, exitcode=exitcode), time_limit="1m")

    assert_job_ended(job("FAILURE", 4), "commbench", 4)
    assert_job_ended(job("COMPLETED", 0), "commbench", 0)
    for state, exitcode, expected in [("FAILURE", 4, 0), ("FAILURE", 1, 4), ("NODE_FAIL", 4, 4),
                                      ("FAILED", 0, 0), ("TIMEOUT", 0, 0), ("CANCELLED", 4, 4)]:
        with pytest.raises(SanityError):
            assert_job_ended(job(state, exitcode), "commbench", expected)


def test_reframe_site_started_by_hand_writes_to_commcamp_s_workspace_not_the_install_tree(tmp_path: Path) -> None:
    """A ReFrame started by hand on a shipped site of an installed commcamp (COMMCAMP_DATA the install tree, no
    COMMCAMP_HOME): its prefix and perflogs were <install tree>/results; now the workspace commcamp itself writes
    to (campaigns.paths)."""
    installed = tmp_path / "_data" / "site_configs"
    installed.mkdir(parents=True)
    shutil.copy(SITE_CONFIGS / "reframe_site.py", installed)
    env = {**{k: v for k, v in os.environ.items() if k != "COMMCAMP_HOME"}, "COMMCAMP_DATA": str(tmp_path / "_data"),
           "XDG_DATA_HOME": str(tmp_path / "xdg")}
    shown = subprocess.run([sys.executable, "-c", "import reframe_site, campaigns.paths as p; "
                            "print(reframe_site.DEFAULT_PREFIX, reframe_site.PERFLOG_DIR, p.workspace())"],
                           cwd=installed, env=env, capture_output=True, text=True, check=True).stdout.split()
    prefix, perflogs, workspace = map(Path, shown)
    assert (prefix, perflogs) == (workspace / "runs" / "reframe", workspace / "reframe" / "perflogs")
    assert tmp_path / "_data" not in prefix.parents
