"""The one-GPU recipe without a GPU: the records its device runs committed (results/reference/single-gpu)
carry what they must (shared-GPU fields, GPU-aware MPI's refused collectives), the summary script judges
them, and ucx-cuda.sh refuses what is not a CUDA-built UCX with a clear message."""
from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from campaigns.formats.packs import pack_files
from campaigns.model.records import load_records

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "results" / "reference" / "single-gpu" / "2026-11-23"
COLLECTIVES = {"allreduce", "alltoall", "allgather", "reduce_scatter", "bcast"}


def records(run: str, case: str) -> list[dict[str, Any]]:
    return load_records(RUNS / run / "records" / f"{case}.jsonl")


def pingpong_median(run: str, case: str, size: int) -> float:
    [record] = [r for r in records(run, case) if r["kind"] == "result" and r["op"] == "pingpong"
                and r["bytes"] == size]
    return float(record["stats"]["median_us"])


@pytest.mark.parametrize("run", ["run1", "run2", "run3"])
def test_records_say_ranks_share_the_gpu_and_whether_mps_is_on(run: str) -> None:
    for case, mps in [("np2-d2d-nomps", False), ("np2-d2d-mps", True), ("np2-staging-nomps", False),
                      ("np2-staging-mps", True)]:
        for record in records(run, case):
            assert record["gpu_sharing"] == {"max_ranks_per_gpu": 2, "mps": mps}
            assert [d["ranks_on_device"] for d in record["devices"]] == [2, 2]
            assert len({d["uuid"] for d in record["devices"]}) == 1
            assert record["devices"][0]["uuid"].startswith("GPU-")
        log = pack_files(RUNS / run / "logs.jsonl")[f"logs/{case}.log"]
        assert log.startswith(f"# NOTE: up to 2 ranks share one GPU (MPS {'on' if mps else 'off'})")
    [copies] = {json.dumps(r["gpu_sharing"]) for r in records(run, "np1-memcpy")}
    assert json.loads(copies) == {"max_ranks_per_gpu": 1, "mps": False}


@pytest.mark.parametrize("run", ["run1", "run2", "run3"])
def test_time_slicing_not_the_link_sets_the_small_message_time(run: str) -> None:
    """The claim PROVENANCE.md makes, from the records: without MPS two ranks on one GPU pay more than
    100 us per 8-byte message, with MPS less than 20 us, host-memory MPI less than 1 us."""
    for transport in ("d2d", "d2d-kernel", "staging"):
        assert pingpong_median(run, f"np2-{transport}-nomps", 8) > 100
        assert pingpong_median(run, f"np2-{transport}-mps", 8) < 20
    assert pingpong_median(run, "np2-host-mpi", 8) < 1


@pytest.mark.parametrize("run", ["run2", "run3"])
def test_gpu_aware_mpi_runs_point_to_point_and_refuses_collectives(run: str) -> None:
    for case in ("np2-mpi-ucx-cuda-nomps", "np2-mpi-ucx-cuda-mps"):
        found = records(run, case)
        results = [r for r in found if r["kind"] == "result"]
        assert {r["op"] for r in results} == {"pingpong", "pingpong_bi", "sendrecv", "pairmatrix"}
        assert all(r["valid"] and r["check"] and r["wrong_elements"] == 0 for r in results)
        assert all(r["env"]["OMPI_MCA_pml"] == "ucx" and "UCX_MODULE_DIR" in r["env"] for r in found)
        errors = [r for r in found if r["kind"] == "error"]
        assert {r["op"] for r in errors} == COLLECTIVES
        for error in errors:
            assert error["reason"] == "unsupported"
            assert "own query says it is not GPU-aware" in error["error"]
            assert "--assume-gpu-aware-mpi covers point-to-point only" in error["error"]
    [system] = {r["reason"] for r in records(run, "np2-mpi-system")}
    assert system == "unsupported"


def test_ccl_says_why_it_cannot_share_a_gpu() -> None:
    run1 = records("run1", "np2-ccl-nomps")  # before: NCCL's bare answer
    assert {r["reason"] for r in run1} == {"runtime"} and "invalid usage" in run1[0]["error"]
    for record in [r for run in ("run2", "run3") for case in ("np2-ccl-nomps", "np2-ccl-mps")
                   for r in records(run, case)]:
        assert record["reason"] == "unsupported"
        assert "NCCL needs one GPU per rank, and here up to 2 ranks share one GPU" in record["error"]


def test_summary_judges_the_committed_run() -> None:
    done = subprocess.run(["python3", "bench_src/scripts/acceptance_summary.py", str(RUNS / "run3")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "14 of 14 cases as expected" in done.stdout
    assert "np2-d2d-mps" in done.stdout and "[2 ranks/GPU, MPS on]" in done.stdout
    done = subprocess.run(["python3", "bench_src/scripts/acceptance_summary.py", str(RUNS / "run1")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "11 of 13 cases as expected" in done.stdout


def ucx_cuda(source: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", '. bench_src/scripts/ucx-cuda.sh "$1" "$2"; echo "rc=$?"', "x",
                           str(source), str(tmp_path / "unpacked")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_ucx_cuda_refuses_what_is_not_a_ucx_wheel(tmp_path: Path) -> None:
    done = ucx_cuda(tmp_path / "missing.whl", tmp_path)
    assert "rc=1" in done.stdout and "is neither a libucx-cu* wheel nor a folder" in done.stderr
    wheel = tmp_path / "libucx_cu13-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("libucx/__init__.py", "")
    done = ucx_cuda(wheel, tmp_path)
    assert "rc=1" in done.stdout and "holds no libucx/lib/libucp.so.0" in done.stderr
    (tmp_path / "broken.whl").write_text("not a zip")
    done = ucx_cuda(tmp_path / "broken.whl", tmp_path)
    assert "rc=1" in done.stdout and "cannot unpack" in done.stderr
