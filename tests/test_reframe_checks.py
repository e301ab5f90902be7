"""The ReFrame side on its own: site configurations built from site.yaml, the commbench check with
references from partition extras, perflogs, and the documented plain `reframe ... -r` commands."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from campaigns.site import available_sites, load_site
from fixtures_slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
REFRAME = Path(sys.executable).with_name("reframe")
SITE_CONFIGS = REPO / "site_configs"


def reframe(config: Path, *args: str, prefix: Path, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`reframe -C config -c reframe_checks ARGS` with stage/output/perflogs/report under `prefix`."""
    cmd = [str(REFRAME), "-C", str(config), "-c", str(REPO / "reframe_checks"), "--prefix", str(prefix),
           "--report-file", str(prefix / "report.json"), "--nocolor", *args]
    # TMPDIR: ReFrame's debug log (rfm-*.log) goes there.
    return subprocess.run(cmd, env={**(env or os.environ), "TMPDIR": str(prefix.parent)}, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, check=False)


def perflog_rows(path: Path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    header = lines[0].split("|")
    return [dict(zip(header, line.split("|"), strict=True)) for line in lines[1:]]


def reframe_site_module() -> Any:
    sys.path.insert(0, str(SITE_CONFIGS))
    try:
        import reframe_site
    finally:
        sys.path.remove(str(SITE_CONFIGS))
    return reframe_site


def test_reframe_configs_carry_site_data_as_extras() -> None:
    reframe_site = reframe_site_module()
    for name in available_sites():
        site = load_site(name)
        config = reframe_site.site_configuration(site.directory / "site.yaml")
        (system,) = config["systems"]
        assert system["name"] == site.systems[0].name
        for part, model in zip(system["partitions"], site.systems[0].partitions, strict=True):
            assert part["extras"]["nodes"] == model.nodes
            assert part["extras"]["gpus_per_node"] == model.node.gpus
            assert part["extras"]["commbench"]["backend"] == model.commbench.backend
            assert part["extras"]["commbench"]["references"] == [
                ref.model_dump(exclude_defaults=True) | {"op": ref.op, "metric": ref.metric}
                for ref in model.commbench.references]
            assert "commbench" in part["features"]
        assert {env["name"] for env in config["environments"]} == {env.name for env in site.environments}
        assert config["general"][0]["report_file"].endswith("run-report-{sessionid}.json")


def test_local_lists_every_op_and_node_count(tmp_path: Path) -> None:
    result = reframe(SITE_CONFIGS / "local" / "reframe_config.py", "-l", prefix=tmp_path / "rfm")
    assert result.returncode == 0, result.stdout + result.stderr
    for op in ("pingpong", "allreduce", "alltoall"):
        for nodes in (1, 2):
            assert f"commbench_run %op={op} %num_nodes={nodes}" in result.stdout


def test_references_from_extras_fail_and_perflog_says_so(tmp_path: Path) -> None:
    """A site whose pingpong latency reference cannot be met: ReFrame fails the test case in its
    performance stage, and the perflog line carries value, unit, reference, thresholds and results."""
    site = yaml.safe_load((SITE_CONFIGS / "local" / "site.yaml").read_text())
    site["systems"][0]["partitions"][0]["commbench"]["references"] = [
        {"op": "pingpong", "metric": "small_latency", "bytes": 8, "value": 0.001, "upper": 0.5},
        {"op": "pingpong", "metric": "large_goodput", "bytes": 64, "nodes": 1, "environ": "openmpi",
         "value": 1e-6, "lower": -0.5},
    ]
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "site.yaml").write_text(yaml.safe_dump(site))
    (site_dir / "reframe_config.py").write_text(
        f"import sys\nsys.path.insert(0, {str(SITE_CONFIGS)!r})\n"
        "from pathlib import Path\nfrom reframe_site import site_configuration as build\n"
        "site_configuration = build(Path(__file__).with_name('site.yaml'))\n")
    prefix = tmp_path / "rfm"
    result = reframe(site_dir / "reframe_config.py", "-n", "pingpong%num_nodes=1", "-p", "openmpi",
                     "-S", "commbench_run.sizes=8,64", "-S", "commbench_run.iters=5", "-r", prefix=prefix)
    assert result.returncode == 1, result.stdout + result.stderr
    (row,) = perflog_rows(prefix / "perflogs" / "local" / "cpu" / "commbench_run.log")
    assert (row["result"], row["num_nodes"], row["num_tasks"], row["num_gpus_per_node"]) == ("fail", "1", "2", "0")
    assert (row["small_latency_ref"], row["small_latency_upper_thres"], row["small_latency_result"]) == (
        "0.001", "0.5", "fail")
    assert (row["large_goodput_ref"], row["large_goodput_lower_thres"], row["large_goodput_result"]) == (
        "1e-06", "-0.5", "pass")
    report = json.loads((prefix / "report.json").read_text())
    (case,) = [tc for tc in report["runs"][0]["testcases"] if not tc["fixture"]]
    assert case["fail_phase"] == "performance"


@pytest.mark.slurm
def test_plain_reframe_on_localslurm_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The documented site command; -S only shrinks the sizes and iterations to keep the test fast."""
    prefix = tmp_path / "rfm"
    result = reframe(SITE_CONFIGS / "localslurm" / "reframe_config.py", "-S", "commbench_run.max_bytes=65536",
                     "-S", "commbench_run.iters=10", "-S", "commbench_run.time_limit=1m", "-r",
                     prefix=prefix, env=slurm_cluster.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASSED" in result.stdout
    report = json.loads((prefix / "report.json").read_text())
    runs = [tc for tc in report["runs"][0]["testcases"] if not tc["fixture"]]
    assert len(runs) == 12 and {tc["result"] for tc in runs} == {"pass"}
    for tc in runs:
        assert len(tc["job_nodelist"]) == tc["num_nodes"]
        assert set(tc["job_nodelist"]) <= set(slurm_cluster.nodes)
