"""commcamp's NCCL/RCCL tuner plugin (bench_src/nccl_tuner): build, C harness (plain and ASan/UBSan),
libFuzzer run on the config parser (the GPU-machine check script: tests/test_plugin_check.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "bench_src" / "nccl_tuner"
BUILD = REPO / "build" / "nccl_tuner"
EXPORTED = {f"ncclTunerPlugin_v{v}" for v in range(2, 8)} | {"commcampTunerForce", "commcampTunerStats", "commcampTunerScope"}


def run(cmd: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]


def run_ok(cmd: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = run(cmd, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def tuner_build() -> Path:
    """Configures (clang, for libFuzzer) and builds every tuner target into build/nccl_tuner."""
    clang = shutil.which("clang")
    assert clang, "clang is missing: run `make system-deps` (Makefile APT_PACKAGES lists clang)"
    cache = BUILD / "CMakeCache.txt"
    configured = re.search(r"^CMAKE_C_COMPILER:\w+=(.*)$", cache.read_text(), re.M) if cache.exists() else None
    if configured and Path(configured.group(1)).resolve() != Path(clang).resolve():
        shutil.rmtree(BUILD)  # configured earlier with another compiler
    run_ok(["cmake", "-S", SOURCE, "-B", BUILD, "-DCMAKE_C_COMPILER=clang", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"])
    run_ok(["cmake", "--build", BUILD, "-j2"])
    return BUILD


def test_plugin_exports_exactly_the_versioned_tuner_structs(tuner_build: Path) -> None:
    symbols = run_ok(["nm", "-D", "--defined-only", tuner_build / "libnccl-tuner-commcamp.so"]).stdout
    assert {line.split()[-1] for line in symbols.splitlines()} == EXPORTED
    libs = run_ok(["ldd", tuner_build / "libnccl-tuner-commcamp.so"]).stdout
    assert "nccl" not in libs and "cuda" not in libs and "amdhip" not in libs


def test_harness_passes_plain_and_under_asan_ubsan(tuner_build: Path) -> None:
    ctest = run_ok(["ctest", "--output-on-failure", "-R", "tuner_harness"], cwd=tuner_build)
    assert "tuner_harness_asan" in ctest.stdout, "sanitizer flavour was not built"
    # Check counts come from the harness itself, not from ctest.
    for harness, plugin in (("tuner_harness", "libnccl-tuner-commcamp.so"),
                            ("tuner_harness_asan", "libnccl-tuner-commcamp-asan.so")):
        output = run_ok([tuner_build / harness, tuner_build / plugin],
                        env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1"}).stdout
        match = re.search(r"all (\d+) checks passed", output)
        assert match and int(match.group(1)) > 20000, output


def test_fuzzer_on_config_parser_runs_clean(tuner_build: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(SOURCE / "tests" / "corpus", corpus)
    result = run([tuner_build / "tuner_config_fuzz", "-max_total_time=10", "-max_len=4096",
                  "-print_final_stats=1", corpus], timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    executed = re.search(r"stat::number_of_executed_units:\s*(\d+)", result.stderr)
    assert executed, result.stderr[-2000:]
    print(f"libFuzzer executed {executed.group(1)} inputs on the config parser")
    assert int(executed.group(1)) > 10000
