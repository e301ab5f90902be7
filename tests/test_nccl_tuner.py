"""commcamp's NCCL/RCCL tuner plugin (bench_src/nccl_tuner): build, C harness (plain and ASan/UBSan),
libFuzzer run on the config parser, and the plumbing of the GPU-machine check script."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "bench_src" / "nccl_tuner"
BUILD = REPO / "build" / "nccl_tuner"
GPU_SCRIPT = SOURCE / "scripts" / "gpu-plugin-check.sh"
EXPORTED = {f"ncclTunerPlugin_v{v}" for v in range(2, 7)}


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


# ---- gpu-plugin-check.sh, run here against a stand-in for nccl-tests (no GPU on this machine) ----

STUB = r'''#!PYTHON
"""Stand-in for nccl-tests' all_reduce_perf on this GPU-less machine. Like NCCL 2.28 with 4 GPUs in
one process it loads NCCL_TUNER_PLUGIN's ncclTunerPlugin_v5, creates 4 contexts, calls getCollInfo
for each size with a contiguous cost table (NVLS rows disabled, as NCCL_NVLS_ENABLE=0 does) and logs
the plugin's messages to NCCL_DEBUG_FILE. The rows use nccl-tests' text format with placeholder
numbers, not measurements."""
import ctypes as c
import os
import sys

pid = os.getpid()
with open(os.environ["STUB_LOG"], "a") as record:
    record.write(" ".join([f"plugin={os.environ.get('NCCL_TUNER_PLUGIN', 'unset')}",
                           f"config={os.environ.get('NCCL_TUNER_CONFIG_FILE', 'unset')}",
                           f"nvls={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}",
                           f"torch={os.environ.get('TORCH_SYMM_MEM_DISABLE_MULTICAST', 'unset')}",
                           f"nvshmem={os.environ.get('NVSHMEM_DISABLE_NVLS', 'unset')}",
                           f"buffsize={os.environ.get('NCCL_BUFFSIZE', 'unset')}", "args=" + " ".join(sys.argv[1:])]) + "\n")
debug = open(os.environ["NCCL_DEBUG_FILE"].replace("%h", "stubhost").replace("%p", str(pid)), "w")

# The plugin always calls the logger as (level, flags, file, line, "%s", message).
LOGGER = c.CFUNCTYPE(None, c.c_int, c.c_ulong, c.c_char_p, c.c_int, c.c_char_p, c.c_char_p)
logger = LOGGER(lambda level, flags, file, line, fmt, message:
                debug.write(f"stubhost:{pid}:{pid} [0] NCCL INFO {message.decode()}\n"))


class TunerV5(c.Structure):
    _fields_ = [("name", c.c_char_p), ("init", c.c_void_p), ("getCollInfo", c.c_void_p), ("finalize", c.c_void_p)]


contexts, get_coll_info = [], None
if os.environ.get("NCCL_TUNER_PLUGIN", "none") != "none":
    tuner = TunerV5.in_dll(c.CDLL(os.environ["NCCL_TUNER_PLUGIN"]), "ncclTunerPlugin_v5")
    debug.write(f"stubhost:{pid}:{pid} [0] NCCL INFO TUNER/Plugin: Using {tuner.name.decode()} (v5)\n")
    init = c.CFUNCTYPE(c.c_int, c.POINTER(c.c_void_p), c.c_uint64, c.c_size_t, c.c_size_t, LOGGER, c.c_void_p,
                       c.c_void_p)(tuner.init)
    get_coll_info = c.CFUNCTYPE(c.c_int, c.c_void_p, c.c_int, c.c_size_t, c.c_int, c.c_void_p, c.c_int, c.c_int,
                                c.c_int, c.POINTER(c.c_int))(tuner.getCollInfo)
    for gpu in range(4):
        contexts.append(c.c_void_p())
        assert init(c.byref(contexts[-1]), gpu, 4, 1, logger, None, None) == 0
print("# nccl-tests stand-in")
size = 8
while size <= 1 << 30:
    for context in contexts:
        table = (c.c_float * 21)(*[-1.0 if 4 <= i // 3 <= 5 else 1.0 for i in range(21)])
        channels = c.c_int(0)
        assert get_coll_info(context, 4, size, 1, table, 7, 3, 0, c.byref(channels)) == 0
    wrong = int(os.environ.get("STUB_WRONG", "0"))
    print(f"{size:12d}  {size // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}  {'1.0':>7}  {'1.00':>6}  {'1.50':>6}  "
          f"{0:6d}  {'1.0':>7}  {'1.00':>6}  {'1.50':>6}  {wrong:6d}")
    size *= 2
for context in contexts:
    c.CFUNCTYPE(c.c_int, c.c_void_p)(tuner.finalize)(context)
sys.exit(int(os.environ.get("STUB_EXIT", "0")))
'''


@pytest.fixture
def stub_nccl_tests(tmp_path: Path) -> Path:
    perf = tmp_path / "nccl-tests" / "build" / "all_reduce_perf"
    perf.parent.mkdir(parents=True)
    perf.write_text(STUB.replace("PYTHON", sys.executable, 1))
    perf.chmod(perf.stat().st_mode | stat.S_IXUSR)
    return perf.parents[1]


def run_gpu_script(nccl_tests: Path, outdir: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "CASE5_"))}
    env.update(NCCL_TESTS_DIR=str(nccl_tests), STUB_LOG=str(outdir.parent / "stub.log"), **extra_env)
    return run([GPU_SCRIPT, outdir], cwd=REPO, env=env, timeout=300)


def test_gpu_script_runs_all_cases_with_multicast_off(stub_nccl_tests: Path, tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    global_env = tmp_path / "global.env"
    global_env.write_text("# best global settings\nNCCL_BUFFSIZE=8388608\n")
    tuner_config = tmp_path / "tuned.csv"
    tuner_config.write_text("allreduce,0,-1,ring,simple,-1,-1,-1\n")
    result = run_gpu_script(stub_nccl_tests, outdir, CASE5_TUNER_CONFIG=str(tuner_config),
                            CASE5_GLOBAL_ENV=str(global_env))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESULT: all cases ok" in result.stdout

    calls = (tmp_path / "stub.log").read_text().splitlines()
    assert len(calls) == 6
    plugin = outdir / "build" / "libnccl-tuner-commcamp.so"
    assert plugin.is_file()
    for call in calls:
        assert "nvls=0 torch=1 nvshmem=1" in call
        assert "-b 8 -e 1G -f 2 -g 4" in call
    assert calls[0].startswith("plugin=none config=unset")
    assert calls[5].startswith("plugin=none config=unset") and "buffsize=8388608" in calls[5]
    for call, config in zip(calls[1:5], ["empty", "channels4", "matching", "case5-tuner"]):
        assert call.startswith(f"plugin={plugin} config={outdir / (config + '.csv.conf')}")
    assert (outdir / "case5-tuner.csv.conf").read_text() == tuner_config.read_text()

    table = (outdir / "comparison.txt").read_text()
    assert result.stdout.endswith(table)
    assert "1073741824" in table and "1.50 (1.00)" in table
    # The real plugin ran on the script's configs: 4 contexts x 4 sizes >= 128 MiB for case 3; every
    # size for case 4, whose first (NVLS) rule is disabled for every call.
    assert "0 rules loaded, 'rule applied' log lines 0," in table
    assert "1 rules loaded, 'rule applied' log lines 16, 'cannot apply' log lines 0" in table
    assert "4 rules loaded, 'rule applied' log lines 112, 'cannot apply' log lines 112" in table
    csv_rows = (outdir / "comparison.csv").read_text().splitlines()
    assert csv_rows[0] == "case,size_bytes,time_oop_us,busbw_oop_gbps,wrong_oop,busbw_ip_gbps,wrong_ip"
    assert len(csv_rows) == 1 + 6 * 28
    for name in ("environment.txt", "build.log", "cases.tsv", "1-baseline.out", "4-matching.err"):
        assert (outdir / name).is_file(), name


def test_gpu_script_reports_crashes_and_wrong_results(stub_nccl_tests: Path, tmp_path: Path) -> None:
    result = run_gpu_script(stub_nccl_tests, tmp_path / "crash", STUB_EXIT="139", STUB_WRONG="3")
    assert result.returncode == 1
    assert "RESULT: FAILED: 1-baseline, 2-empty-config, 3-channels4, 4-matching" in result.stdout
    assert "exit status 139 (a crash if > 128)" in result.stdout
    assert "84 wrong elements" in result.stdout  # the stand-in reports 3 in-place wrong elements x 28 sizes


@pytest.mark.parametrize("setting", ["NCCL_NVLS_ENABLE=1", "NCCL_TUNER_PLUGIN=x", "CUDA_VISIBLE_DEVICES=0"])
def test_gpu_script_refuses_bad_global_env_before_any_run(stub_nccl_tests: Path, tmp_path: Path,
                                                           setting: str) -> None:
    global_env = tmp_path / "global.env"
    global_env.write_text(setting + "\n")
    result = run_gpu_script(stub_nccl_tests, tmp_path / "out", CASE5_GLOBAL_ENV=str(global_env))
    assert result.returncode == 2
    assert setting in result.stderr
    assert not (tmp_path / "stub.log").exists()


def test_gpu_script_refuses_non_empty_output_dir(stub_nccl_tests: Path, tmp_path: Path) -> None:
    outdir = tmp_path / "used"
    outdir.mkdir()
    (outdir / "keep.txt").write_text("earlier results\n")
    result = run_gpu_script(stub_nccl_tests, outdir)
    assert result.returncode == 2 and "is not empty" in result.stderr
    assert (outdir / "keep.txt").read_text() == "earlier results\n"
