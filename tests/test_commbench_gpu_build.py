"""commbench's GPU backends compile and link here (no GPU needed) with warnings as errors, and the
binaries fail cleanly (an error record, exit 4) where no GPU is usable; `commcamp bench build cuda|hip` takes
the GPU architectures from its options or the site and configures again when they change."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from fixtures_bench import BENCH_BUILD, BENCH_SRC, launch_env, read_records
from fixtures_sites import site_data, write_site

CUDA_BIN = Path("/usr/local/cuda/bin")
NVCC = shutil.which("nvcc") or (str(CUDA_BIN / "nvcc") if (CUDA_BIN / "nvcc").exists() else None)
HIPCC = shutil.which("hipcc")
COMMCAMP = Path(sys.executable).with_name("commcamp")
ALL_TRANSPORTS = ["staging", "d2d", "d2d-kernel", "ccl", "mpi", "memcpy"]

pytestmark = pytest.mark.slow


def compiler_env(tmp_path: Path) -> dict[str, str]:
    """The environment with TMPDIR inside the test's folder: hipcc (clang's offload driver) leaves an empty
    directory per compiled file in TMPDIR, so runs of the suite would pile them up in /tmp."""
    scratch = tmp_path / "compiler-tmp"
    scratch.mkdir(exist_ok=True)
    return dict(os.environ, TMPDIR=str(scratch))


def make(target: str, tmp_path: Path, *variables: str) -> subprocess.CompletedProcess[str]:
    env = compiler_env(tmp_path)
    if NVCC:
        env["PATH"] = f"{Path(NVCC).parent}:{env['PATH']}"
    return subprocess.run(
        ["make", "-C", str(BENCH_SRC), target, f"BUILD_DIR={BENCH_BUILD}", "MPICC=mpicc.openmpi", *variables],
        capture_output=True, text=True, timeout=1200, env=env, check=False,
    )


def listed_transports(binary: Path) -> dict[str, str]:
    done = subprocess.run([str(binary), "--list"], capture_output=True, text=True, timeout=30, check=True)
    return {line.split()[1]: line for line in done.stdout.splitlines() if line.startswith("transport ")}


def run_without_gpu(binary: Path, tmp_path: Path, validator: jsonschema.Draft202012Validator) -> None:
    """Where no GPU is usable the run ends with exit 4 and a schema-valid error record."""
    output = tmp_path / "gpu.jsonl"
    done = subprocess.run(
        ["mpirun.openmpi", "--oversubscribe", "-np", "2", str(binary), "--transport", "staging", "--op", "pingpong",
         "--sizes", "64", "--iters", "2", "--output", str(output)],
        capture_output=True, text=True, timeout=120, env=launch_env(), check=False,
    )
    records = read_records(output)
    for record in records:
        validator.validate(record)
    if done.returncode == 0:  # a machine with a usable GPU
        assert records and all(r["valid"] for r in records)
        return
    assert done.returncode == 4, done.stdout + done.stderr
    [record] = records
    assert record["kind"] == "error" and record["reason"] == "runtime" and record["op"] == "setup"
    assert "GPU" in record["error"] or "driver" in record["error"]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed: the cuda backend cannot be compiled here")
def test_cuda_backend_builds(tmp_path: Path, record_validator: jsonschema.Draft202012Validator) -> None:
    done = make("cuda", tmp_path, "CUDA_ARCHS=90")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    flags = (BENCH_BUILD / "cuda" / "CMakeFiles" / "commbench.dir" / "flags.make").read_text()
    assert "--Werror=all-warnings" in flags and "-Xcompiler=-Wall,-Wextra,-Werror" in flags
    assert "arch=compute_90,code=[compute_90,sm_90]" in flags  # sm_90 code plus PTX
    binary = BENCH_BUILD / "cuda" / "commbench"
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=True)
    assert "backend cuda" in version.stdout
    transports = listed_transports(binary)
    assert list(transports) == ALL_TRANSPORTS
    assert "not-built" not in transports["ccl"], "NCCL was not found although it is installed here"
    assert "allreduce" not in transports["d2d"] and "allreduce" in transports["d2d-kernel"]
    assert transports["memcpy"].endswith("ops h2d,d2h")
    linked = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30, check=True).stdout
    assert "libnccl" in linked and "libcudart" in linked
    run_without_gpu(binary, tmp_path, record_validator)


def hipcc_accepts(arch: str, tmp_path: Path) -> bool:
    source = tmp_path / "probe.hip"
    source.write_text("#include <hip/hip_runtime.h>\n__global__ void k(float *a) { a[0] = 1.0f; }\n")
    done = subprocess.run([str(HIPCC), f"--offload-arch={arch}", "-c", str(source), "-o", str(tmp_path / "p.o")],
                          capture_output=True, text=True, timeout=120, env=compiler_env(tmp_path), check=False)
    return done.returncode == 0


@pytest.mark.skipif(HIPCC is None, reason="hipcc is not installed: the hip backend cannot be compiled here")
def test_hip_backend_builds(tmp_path: Path, record_validator: jsonschema.Draft202012Validator) -> None:
    # MI300 is gfx942; Debian's hipcc 5.2 (clang 15) predates it and accepts only gfx940 of that family.
    mi300 = "gfx942" if hipcc_accepts("gfx942", tmp_path) else "gfx940"
    if mi300 != "gfx942":
        print("hipcc rejects gfx942; building for gfx90a and gfx940 instead")
    done = make("hip", tmp_path, f"HIP_ARCHS=gfx90a;{mi300}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    flags = (BENCH_BUILD / "hip" / "CMakeFiles" / "commbench.dir" / "flags.make").read_text()
    assert "--offload-arch=gfx90a" in flags and "-Werror" in flags and "-x hip" in flags
    binary = BENCH_BUILD / "hip" / "commbench"
    transports = listed_transports(binary)
    assert list(transports) == ALL_TRANSPORTS
    rccl_found = "COMMBENCH_HAVE_CCL=1" in flags
    assert ("not-built" in transports["ccl"]) != rccl_found
    run_without_gpu(binary, tmp_path, record_validator)


NCCL_HEADER = next((p for p in (Path("/usr/local/include/nccl.h"), Path("/usr/include/nccl.h")) if p.exists()), None)


@pytest.mark.skipif(HIPCC is None or NCCL_HEADER is None,
                    reason="needs hipcc and an nccl.h to derive an RCCL-shaped header from (RCCL is not packaged)")
def test_hip_ccl_transport_compiles_against_the_rccl_api(tmp_path: Path) -> None:
    """RCCL is not installable here, so the HIP ccl code is compiled against NCCL's API with HIP
    stream types (RCCL's API is NCCL's); without this the HIP ccl path would never be compiled."""
    header = NCCL_HEADER.read_text()
    header = header.replace("#include <cuda_runtime.h>", "#include <hip/hip_runtime.h>")
    header = "\n".join(line for line in header.splitlines() if not line.startswith("#include <cuda_"))
    (tmp_path / "rccl").mkdir()
    (tmp_path / "rccl" / "rccl.h").write_text(header.replace("cudaStream_t", "hipStream_t"))
    done = subprocess.run(
        [str(HIPCC), "-x", "hip", "--offload-arch=gfx90a", "-std=c++20", "-Wall", "-Wextra", "-Werror",
         "-DCOMMBENCH_HIP=1", "-DCOMMBENCH_GPU=1", "-DCOMMBENCH_HAVE_CCL=1",
         "-D_POSIX_C_SOURCE=200809L", f"-I{tmp_path / 'rccl'}", f"-I{BENCH_SRC / 'src'}", "-c",
         str(BENCH_SRC / "src" / "gpu" / "ccl.cu"), "-o", str(tmp_path / "ccl.o")],
        capture_output=True, text=True, timeout=300, env=compiler_env(tmp_path), check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed: the cuda backend cannot be compiled here")
def test_gpu_scripts_build_step(tmp_path: Path) -> None:
    """The build step gpu-acceptance.sh and compare-nccl-tests.sh share (scripts/common.sh)."""
    env = {**compiler_env(tmp_path), "MPICC": "mpicc.openmpi", "JOBS": "2",
           "PATH": f"{Path(NVCC).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", '. bench_src/scripts/common.sh && cb_build_cuda "$1" "$1/build.log" && '
                       'echo "bin=$CB_BIN werror=$CB_WERROR_BUILD nvls=$NCCL_NVLS_ENABLE"', "build", str(tmp_path)],
        cwd=BENCH_SRC.parent, capture_output=True, text=True, timeout=1200, env=env, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    binary = tmp_path / "build" / "cuda" / "commbench"
    assert f"bin={binary} werror=ok nvls=0" in done.stdout
    assert listed_transports(binary)["ccl"].startswith(
        "transport ccl ops pingpong,pingpong_bi,allreduce,alltoall,allgather,reduce_scatter,bcast,pairmatrix,sendrecv")


def test_bench_build_takes_gpu_architectures_from_its_options_else_the_site(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    """bench_src/Makefile's variables for `commcamp bench build`: --cuda-archs/--hip-archs, else (--site) the site's
    -DCOMMBENCH_*_ARCHS of its partitions of that backend, else the Makefile's defaults (nothing passed); the site's
    other cmake_options go to CMAKE_ARGS after the environment's."""
    from campaigns.cli.bench import make_variables

    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    assert make_variables("cuda", None, "leonardo") == ["CUDA_ARCHS=80"]  # -DCOMMBENCH_CUDA_ARCHS=80 (A100)
    assert make_variables("hip", None, "lumi") == ["HIP_ARCHS=gfx90a"]
    assert make_variables("cuda", "70", "h200") == ["CUDA_ARCHS=70"]  # the option wins
    assert make_variables("cuda", None, None) == make_variables("cpu-openmpi", None, "local") == []

    def edit(data: dict) -> None:
        data["systems"][0]["partitions"][0]["commbench"]["cmake_options"] = ["-DCOMMBENCH_WERROR=OFF", "-DX=a b"]
    write_site(tmp_path / "local", site_data("local", edit))
    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(tmp_path))
    monkeypatch.setenv("CMAKE_ARGS", "-DY=1")
    assert make_variables("cpu-mpich", None, "local") == ["CMAKE_ARGS=-DY=1 -DCOMMBENCH_WERROR=OFF '-DX=a b'"]
    done = subprocess.run([str(COMMCAMP), "bench", "build", "cuda", "--site", "local", "--build-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "site 'local' has no partition with commbench backend cuda" in done.stderr
    done = subprocess.run([str(COMMCAMP), "bench", "build", "--cuda-archs", "80", "--build-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "--cuda-archs applies to the cuda variant" in done.stderr


@pytest.mark.skipif(HIPCC is None, reason="hipcc is not installed: the hip backend cannot be compiled here")
def test_bench_build_hip_names_a_rejected_architecture_and_builds_again_with_others(tmp_path: Path) -> None:
    """Debian 12's hipcc 5.2 rejects gfx942, one of the default HIP_ARCHS: the failed build says how to choose
    others, and the next build with --hip-archs configures the build directory again (the Makefile configured
    it once and kept the old architectures in the CMake cache)."""
    if hipcc_accepts("gfx942", tmp_path):
        pytest.skip("this hipcc accepts every default HIP architecture")
    env = {k: v for k, v in compiler_env(tmp_path).items() if k not in ("HIP_ARCHS", "CMAKE_ARGS")}
    env.update(MPICC="mpicc.openmpi", COLUMNS="200", COMMCAMP_HOME=str(tmp_path / "workspace"))
    build = tmp_path / "bench"

    def bench_build(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(COMMCAMP), "bench", "build", "hip", "--build-dir", str(build), *args],
                              capture_output=True, text=True, timeout=1200, env=env, check=False)
    failed = bench_build()
    assert failed.returncode == 1, failed.stdout + failed.stderr
    said = " ".join(failed.stderr.split())
    assert "invalid target ID 'gfx942'" in said and "commcamp bench build hip --hip-archs gfx90a" in said, said
    built = bench_build("--hip-archs", "gfx90a")
    assert built.returncode == 0, built.stdout + built.stderr[-3000:]
    assert built.stdout.strip() == str(build / "hip" / "commbench")
    flags = (build / "hip" / "CMakeFiles" / "commbench.dir" / "flags.make").read_text()
    assert "--offload-arch=gfx90a" in flags and "gfx942" not in flags
