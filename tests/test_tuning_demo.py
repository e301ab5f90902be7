"""Tuning demonstrations on this machine: CI demonstration 1 (a planted bad Open MPI default on the local
Slurm cluster, recovered through ReFrame runs; results/tuning/ci-localslurm/) and the plumbing of the GPU
demonstration script (tools/tuning/gpu-demo.sh --cpu)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures_slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
COMMCAMP = Path(sys.executable).with_name("commcamp")
CI_SPEC = REPO / "results" / "tuning" / "ci-localslurm" / "spec.yaml"
PLANTED = {"OMPI_MCA_btl_tcp_sndbuf": "4096", "OMPI_MCA_btl_tcp_rcvbuf": "4096"}


@pytest.mark.slurm
@pytest.mark.slow
def test_ci_demo_recovers_a_planted_bad_default_on_localslurm(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    result = subprocess.run(
        [str(COMMCAMP), "tune", str(CI_SPEC), "--db", f"sqlite:///{tmp_path / 'study.db'}", "--runs-dir",
         str(tmp_path / "runs"), "--publish-dir", str(tmp_path / "rec"), "--summary", str(summary)],
        cwd=REPO, env={**slurm_cluster.env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=900,
        check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(summary.read_text())
    assert data["baseline_env"] == PLANTED
    trials = data["trials"]
    assert [t["outcome"] for t in trials] == ["complete"] * 3
    assert trials[0]["role"] == "defaults" and trials[1]["env"] == {}  # trial 1: the library's own defaults
    rec = data["recommendation"]
    assert rec["decision"] == "change", result.stdout[-3000:]
    assert rec["gain"]["median"] > 1.0  # more than 2x: the planted buffers cost far more than noise
    # Each ReFrame run is a Slurm job of its own: the finalization's rounds ran in many allocations.
    assert rec["evidence"]["allocations"] >= 2
    assert {name: rec["env"].get(name) for name in PLANTED} != PLANTED  # at least one planted buffer goes
    one_mib = next(s for s in rec["per_size"] if s["bucket"] == "1MiB-1MiB")
    assert one_mib["decision"] == "change"
    # Every run went through ReFrame on Slurm, on two nodes.
    reports = list((tmp_path / "runs").glob("reframe-*/rfm-*/report.json"))
    assert len(reports) >= 3 + 2 * 6
    records = [json.loads(line) for path in (tmp_path / "runs").glob("reframe-*/rfm-*/**/commbench.jsonl")
               for line in path.read_text().splitlines() if line.strip()]
    assert records and all(len(set(r["hostnames"])) == 2 for r in records)
    env_file = (tmp_path / "rec" / "localslurm" / "localslurm").glob("*.env")
    text = next(env_file).read_text()
    assert "unset OMPI_MCA_btl_tcp_sndbuf" in text or "export OMPI_MCA_btl_tcp_sndbuf=" in text


def test_gpu_demo_script_plumbing_on_cpu(tmp_path: Path) -> None:
    """gpu-demo.sh --cpu: every phase kind runs, prints its time, and the bundle holds each phase's summary."""
    out = tmp_path / "demo"
    result = subprocess.run(
        ["tools/tuning/gpu-demo.sh", "--cpu", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**{k: v for k, v in __import__("os").environ.items() if k != "NCCL_TESTS_DIR"},
             "PYTHON": sys.executable, "DEMO_TOTAL_S": "150", "DEMO_PHASES": "build probe-nvlink demo3 aa"},
        check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    for phase in ("build", "probe-nvlink", "demo3", "aa"):
        assert f"== {phase}: exit status 0 after" in result.stdout
    phases = (out / "phases.tsv").read_text().splitlines()
    assert phases[0] == "phase\tstatus\telapsed_s\tbudget_s" and len(phases) == 5
    listing = subprocess.run(["tar", "tzf", str(out / "gpu-demo.tar.gz")], capture_output=True, text=True,
                             check=True).stdout.split()
    for name in ("./probe-nvlink/probe.json", "./demo3/summary.json", "./aa/summary.json", "./environment.txt"):
        assert name in listing
    assert not any(name.startswith("./build/") for name in listing)
    aa = json.loads((out / "aa" / "summary.json").read_text())
    assert aa["tunes_requested"] == 2 and aa["tunes_finalized"] + len(aa["tunes"]) >= 2
    demo3 = json.loads((out / "demo3" / "summary.json").read_text())
    assert demo3["baseline_env"] == PLANTED and demo3["trials"]
    probe = json.loads((out / "probe-nvlink" / "probe.json").read_text())
    assert probe["library_version"] and probe["not_reported"] == []


@pytest.mark.parametrize("config_file", ["gpu-demo.yaml", "gpu-socket-x2.yaml", "gpu-demo-cpu.yaml"])
def test_every_phase_of_the_tool_configs_fits_its_sites_partition(tmp_path: Path, config_file: str) -> None:
    """A tune checks its scope against the site's partition (nodes, GPUs per node) since d8a432a; the socket-path
    phases asked for 2 nodes of the one-host h200 site and every GPU run of them stopped there (the sampler
    benchmark's socket grid on 2x H200, 2026-11-27). Each phase's spec passes the check tune makes."""
    import yaml

    from campaigns.tools.tuning_demo import Context, DemoConfig
    from campaigns.tuning.spec import check_partition_size

    config = DemoConfig.model_validate(yaml.safe_load((REPO / "tools/tuning" / config_file).read_text()))
    for name, phase in config.phases.items():
        spec = Context(config, name, phase, tmp_path, 0.0).spec()
        check_partition_size(spec)
        # one GPU per rank (commbench takes the node-local rank modulo the visible GPUs), the launcher starts them all
        assert spec.tasks_per_node <= spec.gpus_per_node or spec.transport == "mpi", name
        if spec.launcher and "-np" in spec.launcher:
            assert int(spec.launcher[spec.launcher.index("-np") + 1]) == spec.ranks, name


def test_gpu_demo_config_builds_every_phase_with_multicast_pinned_off(tmp_path: Path) -> None:
    """What can be checked of the GPU run here: every phase of gpu-demo.yaml gives a valid spec and search
    space on the h200 site, NCCL_NVLS_ENABLE is never searched and is 0 in every trial's environment."""
    import yaml

    from campaigns.tuning.spec import site_catalog
    from campaigns.tools.tuning_demo import Context, DemoConfig
    from tuners.space import build_space

    config = DemoConfig.model_validate(yaml.safe_load((REPO / "tools/tuning/gpu-demo.yaml").read_text()))
    assert set(config.phases) == {"probe-nvlink", "probe-socket", "demo2", "demo3", "aa"}
    for name, phase in config.phases.items():
        spec = Context(config, name, phase, tmp_path, 0.0).spec()
        catalog, _ = site_catalog(spec)
        assert catalog.pinned["NCCL_NVLS_ENABLE"] == "0"
        if phase.kind == "probe":
            assert catalog.validate_env(phase.env)
            continue
        space = build_space(catalog, {"nccl": "2.28.3"}, knobs=spec.knobs, op=spec.op, transport=spec.transport)
        assert "NCCL_NVLS_ENABLE" not in space.knob_names
        defaults = space.env_from_values({k: catalog[k].default for k in space.knob_names})
        assert defaults["NCCL_NVLS_ENABLE"] == "0"
        if name == "demo2":
            assert {k: defaults[k] for k in ("NCCL_MAX_CTAS", "NCCL_PROTO")} == {"NCCL_MAX_CTAS": "2",
                                                                                 "NCCL_PROTO": "LL"}
            assert space.dimensions[0].choices == ("Ring", "Tree", "unset")  # PAT has no allreduce
        if name == "demo3":
            assert (defaults["NCCL_P2P_DISABLE"], defaults["NCCL_SHM_DISABLE"]) == ("1", "1")
            assert space.knob_names == ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_BUFFSIZE")
