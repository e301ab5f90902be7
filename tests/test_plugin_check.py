"""gpu-plugin-check.sh (bench_src/nccl_tuner/scripts) here, against a stand-in for nccl-tests that
drives the real plugin: interleaved rounds, per-size noise bands and verdicts, case expectations."""

from __future__ import annotations

import csv
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from campaigns.formats.packs import unpack

REPO = Path(__file__).resolve().parents[1]
GPU_SCRIPT = REPO / "bench_src" / "nccl_tuner" / "scripts" / "gpu-plugin-check.sh"

STUB = r'''#!PYTHON
"""Stand-in for nccl-tests' all_reduce_perf on this GPU-less machine. Like NCCL 2.28 with 4 GPUs in
one process it loads NCCL_TUNER_PLUGIN's ncclTunerPlugin_v5, creates 4 contexts, calls getCollInfo
for each size with a contiguous cost table (NVLS rows disabled, as NCCL_NVLS_ENABLE=0 does) and logs
the plugin's messages to NCCL_DEBUG_FILE. Its times are a MODEL, not measurements: 10 us + size at
300 GB/s, scaled by 32 / channels when the plugin forces a channel count, times (1 + STUB_JITTER * u)
with u uniform in [-1, 1] per run and size (seeded by the number of earlier runs, so that a test's
noise is the same every time), and STUB_SLOW (x) for sizes >= STUB_SLOW_FROM."""
import ctypes as c
import os
import random
import sys

pid = os.getpid()
earlier_runs = open(os.environ["STUB_LOG"]).read().count("\n") if os.path.exists(os.environ["STUB_LOG"]) else 0
rng = random.Random(earlier_runs)
with open(os.environ["STUB_LOG"], "a") as record:
    record.write(" ".join([f"plugin={os.environ.get('NCCL_TUNER_PLUGIN', 'unset')}",
                           f"config={os.environ.get('NCCL_TUNER_CONFIG_FILE', 'unset')}",
                           f"nvls={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}",
                           f"torch={os.environ.get('TORCH_SYMM_MEM_DISABLE_MULTICAST', 'unset')}",
                           f"nvshmem={os.environ.get('NVSHMEM_DISABLE_NVLS', 'unset')}",
                           f"buffsize={os.environ.get('NCCL_BUFFSIZE', 'unset')}", "args=" + " ".join(sys.argv[1:])]) + "\n")
debug = open(os.environ["NCCL_DEBUG_FILE"].replace("%h", "stubhost").replace("%p", str(pid)), "w")
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
args = sys.argv[1:]
scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
low, high, factor = (int(v[:-1]) * scale[v[-1]] if v[-1] in scale else int(v)
                     for v in (args[args.index(flag) + 1] for flag in ("-b", "-e", "-f")))
jitter = float(os.environ.get("STUB_JITTER", "0.01"))
print("# nccl-tests stand-in")
size = low
while size <= high:
    channels = c.c_int(0)
    for context in contexts:
        table = (c.c_float * 21)(*[-1.0 if 4 <= i // 3 <= 5 else 1.0 for i in range(21)])
        channels = c.c_int(0)
        assert get_coll_info(context, 4, size, 1, table, 7, 3, 0, c.byref(channels)) == 0
    time_us = (10 + size / 300e3) * (32 / channels.value if channels.value > 0 else 1.0)
    if size >= int(os.environ.get("STUB_SLOW_FROM", str(1 << 62))):
        time_us *= float(os.environ.get("STUB_SLOW", "1"))
    time_us *= 1 + jitter * rng.uniform(-1, 1)
    busbw = size / time_us / 1e3 * 1.5
    wrong = int(os.environ.get("STUB_WRONG", "0"))
    print(f"{size:12d}  {size // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}  {time_us:7.2f}  {'1.00':>6}  "
          f"{busbw:6.2f}  {0:6d}  {time_us:7.2f}  {'1.00':>6}  {busbw:6.2f}  {wrong:6d}")
    size *= factor
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "CASE5_", "STUB_"))}
    env.update(NCCL_TESTS_DIR=str(nccl_tests), STUB_LOG=str(outdir.parent / "stub.log"),
               SWEEP="-b 1M -e 1G -f 4 -w 1 -n 2 -c 1", **extra_env)
    return subprocess.run([str(GPU_SCRIPT), str(outdir)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def verdicts(outdir: Path) -> dict[str, dict[int, str]]:
    found: dict[str, dict[int, str]] = {}
    with open(outdir / "comparison.csv", newline="") as stream:
        for row in csv.DictReader(stream):
            if row["verdict"]:
                found.setdefault(row["case"], {})[int(row["size_bytes"])] = row["verdict"]
    return found


def test_interleaved_rounds_noise_bands_and_case_expectations(stub_nccl_tests: Path, tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    global_env = tmp_path / "global.env"
    global_env.write_text("# best global settings\nNCCL_BUFFSIZE=8388608\n")
    tuner_config = tmp_path / "tuned.csv"
    tuner_config.write_text("allreduce,0,-1,ring,simple,-1,-1,-1\n")
    result = run_gpu_script(stub_nccl_tests, outdir, ROUNDS="3", CASE5_TUNER_CONFIG=str(tuner_config),
                            CASE5_GLOBAL_ENV=str(global_env))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESULT: all cases ok" in result.stdout

    calls = (tmp_path / "stub.log").read_text().splitlines()
    assert len(calls) == 6 * 3  # six cases, three rounds
    for call in calls:
        assert "nvls=0 torch=1 nvshmem=1" in call and "-b 1M -e 1G -f 4" in call
    plugin = outdir / "build" / "libnccl-tuner-commcamp.so"
    # Interleaved: each round runs every case once, the order rotated by one per round.
    first = [call.split()[0] for call in calls[:6]]
    second = [call.split()[0] for call in calls[6:12]]
    assert first[0] == "plugin=none" and second[-1] == "plugin=none" and first[1:] == second[:-1]
    # Case 5a = the tuner's config on top of the global env; case 5b = the global env alone.
    case5 = [c for c in calls if "case5-tuner" in c]
    assert len(case5) == 3 and all("buffsize=8388608" in c and f"plugin={plugin}" in c for c in case5)
    assert sum("buffsize=8388608" in c and c.startswith("plugin=none") for c in calls) == 3

    found = verdicts(outdir)
    assert set(found["2-empty-config"].values()) == {"="}
    # The stand-in models what 4 channels do: slower from 128 MiB up, untouched below.
    assert {s: v for s, v in found["3-channels4"].items() if s >= 128 << 20} == {256 << 20: "-", 1 << 30: "-"}
    assert {v for s, v in found["3-channels4"].items() if s < 128 << 20} == {"="}
    table = (outdir / "comparison.txt").read_text()
    assert "5a-tuner-config:" in table and "(reference: 5b-global-env)" in table
    assert "verdicts vs 1-baseline: 4 equal, 0 faster, 2 slower" in table  # case 3
    assert "'rule applied' log lines" in table


def test_a_case_slower_beyond_noise_is_a_problem(stub_nccl_tests: Path, tmp_path: Path) -> None:
    """The tuner's config must never be slower than its reference beyond noise: a rule forcing 24 channels
    from 256 MiB makes the stand-in 33% slower there."""
    outdir = tmp_path / "out"
    tuner_config = tmp_path / "tuned.csv"
    tuner_config.write_text("allreduce,268435456,-1,ring,simple,24,-1,-1\n")  # 24 of 32 channels: 33% slower
    result = run_gpu_script(stub_nccl_tests, outdir, ROUNDS="2", CASE5_TUNER_CONFIG=str(tuner_config))
    assert result.returncode == 1
    assert "RESULT: FAILED: 5a-tuner-config" in result.stdout
    assert "slower than 1-baseline beyond noise at 256 MiB, 1 GiB" in result.stdout
    assert verdicts(outdir)["5a-tuner-config"][1 << 30] == "-"


def test_noise_wider_than_an_effect_is_equal(stub_nccl_tests: Path, tmp_path: Path) -> None:
    """20% jitter per run: the band says how wide the noise is, and a case without effect stays equal."""
    outdir = tmp_path / "out"
    result = run_gpu_script(stub_nccl_tests, outdir, ROUNDS="3", STUB_JITTER="0.2")
    table = (outdir / "comparison.txt").read_text()
    assert "widest noise band" in table
    bands = [float(row["noise_band"]) for row in csv.DictReader(open(outdir / "comparison.csv"))
             if row["case"] == "2-empty-config" and row["noise_band"]]
    assert max(bands) > 0.05
    assert set(verdicts(outdir)["2-empty-config"].values()) == {"="}
    assert result.returncode == 0, result.stdout


def test_crashes_and_wrong_results_fail(stub_nccl_tests: Path, tmp_path: Path) -> None:
    result = run_gpu_script(stub_nccl_tests, tmp_path / "crash", ROUNDS="1", STUB_EXIT="139", STUB_WRONG="3")
    assert result.returncode == 1
    assert "RESULT: FAILED: 1-baseline, 2-empty-config, 3-channels4, 4-matching" in result.stdout
    assert "round 1: exit status 139 (a crash if > 128)" in result.stdout
    assert "18 wrong elements" in result.stdout  # 3 in-place wrong elements x 6 sizes
    assert "NOTE: one round only: the noise band is the floor (3%)" in result.stdout


def test_deadline_stops_between_rounds(stub_nccl_tests: Path, tmp_path: Path) -> None:
    import time

    outdir = tmp_path / "out"
    result = run_gpu_script(stub_nccl_tests, outdir, ROUNDS="5", PLUGIN_DEADLINE=str(int(time.time()) - 1))
    assert "deadline: stopping after 1 of 5 rounds" in result.stdout
    assert len((tmp_path / "stub.log").read_text().splitlines()) == 4


@pytest.mark.parametrize("setting", ["NCCL_NVLS_ENABLE=1", "NCCL_TUNER_PLUGIN=x", "CUDA_VISIBLE_DEVICES=0"])
def test_refuses_bad_global_env_before_any_run(stub_nccl_tests: Path, tmp_path: Path, setting: str) -> None:
    global_env = tmp_path / "global.env"
    global_env.write_text(setting + "\n")
    result = run_gpu_script(stub_nccl_tests, tmp_path / "out", CASE5_GLOBAL_ENV=str(global_env))
    assert result.returncode == 2
    assert setting in result.stderr
    assert not (tmp_path / "stub.log").exists()


def test_refuses_non_empty_output_dir_and_bad_rounds(stub_nccl_tests: Path, tmp_path: Path) -> None:
    outdir = tmp_path / "used"
    outdir.mkdir()
    (outdir / "keep.txt").write_text("earlier results\n")
    result = run_gpu_script(stub_nccl_tests, outdir)
    assert result.returncode == 2 and "is not empty" in result.stderr
    assert (outdir / "keep.txt").read_text() == "earlier results\n"
    result = run_gpu_script(stub_nccl_tests, tmp_path / "fresh", ROUNDS="zero")
    assert result.returncode == 2 and "ROUNDS=zero" in result.stderr


COMPARE = REPO / "bench_src" / "nccl_tuner" / "scripts" / "compare_busbw.py"
GPU_RUN = REPO / "results" / "tuning" / "gpu-h200x4" / "plugin" / "check"


def nccl_tests_output(times_us: dict[int, float]) -> str:
    rows = [f"{size:12d} {size // 4:12d} float sum -1 {t:8.2f} 0.00 0.00 0 {t:8.2f} 0.00 0.00 0"
            for size, t in times_us.items()]
    return "# nccl-tests version 2.19.6 nccl-headers=22803 nccl-library=22803\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize(("sizes", "slow_index", "judged"), [
    ((8, 32, 128), 0, False),  # the sweep's first size: reported, not judged
    ((8, 32, 128), 1, True),
    ((8,), 0, True),  # nothing else to judge: the only size counts
])
def test_the_first_size_of_a_sweep_is_reported_but_not_judged(
        tmp_path: Path, sizes: tuple[int, ...], slow_index: int, judged: bool) -> None:
    """The baseline 40% slower at one size in every round (apart from case 2's times, beyond the noise
    band): a problem unless it is the first size of a sweep with more than one size."""
    manifest = []
    for round_ in (1, 2, 3):
        for case, config in (("1-baseline", "-"), ("2-empty-config", "empty.csv")):
            slow = 1.4 if case == "1-baseline" else 1.0
            times = {s: (26.0 + round_ / 10) * (slow if i == slow_index else 1.0) for i, s in enumerate(sizes)}
            (tmp_path / f"{case}.r{round_}.out").write_text(nccl_tests_output(times))
            if config != "-":
                (tmp_path / f"{case}.r{round_}.nccl-debug.h.1.log").write_text(
                    "h:1:1 [0] NCCL INFO TUNER/Plugin: Using commcamp (v5)\n"
                    "h:1:1 [0] NCCL INFO TUNER/commcamp: 0 rules from empty.csv (0 bad lines skipped)\n")
            manifest.append(f"{case}\t{round_}\t0\t{config}\t{case}")
    (tmp_path / "cases.tsv").write_text("\n".join(manifest) + "\n")
    result = subprocess.run([sys.executable, str(COMPARE), str(tmp_path)], capture_output=True, text=True,
                            timeout=60)
    slow_size = sizes[slow_index]
    rows = [r for r in csv.DictReader(open(tmp_path / "comparison.csv"))
            if r["case"] == "2-empty-config" and int(r["size_bytes"]) == slow_size]
    assert {(r["verdict"], r["judged"]) for r in rows} == {("+", "1" if judged else "0")}
    if judged:
        assert result.returncode == 1, result.stdout
        assert f"PROBLEMS: empty config differs from no plugin beyond noise at {slow_size} B" in result.stdout
        assert "not judged" not in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert "first size 8 B: faster 1.40x [3%], reported, not judged (warm-up-affected)" in result.stdout
        assert "the sweep's first size (8 B) follows nccl-tests' warm-up" in result.stdout
        assert "RESULT: all cases ok" in result.stdout


def test_gpu_run_reevaluated_is_what_the_code_says(tmp_path: Path) -> None:
    """The committed plugin check of the 4x H200 run (results/tuning/gpu-h200x4): its original verdict
    failed case 3 at 8 B only; the committed re-evaluation is this code's output on the same raw files."""
    assert "PROBLEMS: sizes below 128 MiB changed beyond noise: 8 B" in (GPU_RUN / "comparison.txt").read_text()
    copy = tmp_path / "check"
    copy.mkdir()
    (copy / "cases.tsv").write_bytes((GPU_RUN / "cases.tsv").read_bytes())
    unpack(GPU_RUN / "rounds.jsonl", copy)  # the rounds' outputs and NCCL debug logs, byte for byte
    result = subprocess.run([sys.executable, str(COMPARE), str(copy)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    assert result.stdout == (GPU_RUN / "comparison-reevaluated.txt").read_text()
    assert (copy / "comparison.csv").read_text() == (GPU_RUN / "comparison-reevaluated.csv").read_text()
    assert "first size 8 B: faster 1.41x [34%], reported, not judged" in result.stdout
    assert "128 MiB                615.15       616.97 1.00[3]=      2061.75 0.30[3]-" in result.stdout
