"""compare-nccl-tests.sh and its report helper, without a GPU: the parser against the real
outputs of run 1 (results/reference/h200x4/run1), the report's numbers against values read off
those files, bad input, and the script's plumbing end to end with the real cpu commbench under
real Open MPI and an nccl-tests stand-in that replays run 1's recorded output."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from campaigns.formats import nccl_tests

from fixtures_bench import BENCH_SRC, REPO, CommbenchBuild, launch_env

SCRIPTS = BENCH_SRC / "scripts"
RUN1 = REPO / "results" / "reference" / "h200x4" / "run1"
NT_FILES = {"allreduce": "all_reduce.txt", "alltoall": "alltoall.txt", "sendrecv": "sendrecv.txt",
            "allgather": "all_gather.txt"}


def load_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_nccl_tests", SCRIPTS / "compare_nccl_tests.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


helper = load_helper()


def test_the_comparison_reads_nccl_tests_through_the_one_parser() -> None:
    """The script has no nccl-tests parser of its own (campaigns.formats.nccl_tests, tested in
    test_formats.py, also for these outputs)."""
    assert helper.nccl_tests is nccl_tests and not hasattr(helper, "parse_nccl_tests")
    runs = {op: nccl_tests.parse_text((RUN1 / "nt-outputs" / name).read_text()) for op, name in NT_FILES.items()}
    for run in runs.values():
        assert (run.version, run.nccl_version) == ("2.19.6", "22803")
        assert "warmup iters: 5 iters: 20" in run.params
        assert len(run.devices) == 4 and all("NVIDIA H200" in d for d in run.devices)
        assert len(run.rows) == 30 and run.rows[-1].size == 4 << 30
        assert all(row.out_of_place.wrong == 0 for row in run.rows)
    # alltoall's first three sizes move nothing at 4 ranks: nccl-tests prints size 0
    assert [row.size for row in runs["alltoall"].rows[:4]] == [0, 0, 0, 64]
    assert runs["sendrecv"].rows[-1].out_of_place.busbw_gbs == 365.10
    text = (RUN1 / "nt-outputs" / "all_reduce.txt").read_text()
    noisy = "vm:5108:5108 [0] NCCL INFO Bootstrap: using eth0\n" + text
    assert len(nccl_tests.parse_text(noisy).rows) == 30


def run1_outdir(tmp_path: Path) -> Path:
    """A compare-script output directory holding run 1's files (one repeat, no commbench sendrecv)."""
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    (out / "records").mkdir()
    for op, name in NT_FILES.items():
        shutil.copy(RUN1 / "nt-outputs" / name, out / "raw" / f"nt-{op}-r1.txt")
        if op != "sendrecv":
            shutil.copy(RUN1 / "commbench-ccl" / f"cb-{op}.jsonl", out / "records" / f"cb-{op}-r1.jsonl")
    with tarfile.open(RUN1 / "acceptance" / "acceptance.tar.gz") as bundle:
        for transport in ("d2d", "d2d-kernel"):
            member = bundle.extractfile(f"records/np4-{transport}.jsonl")
            assert member is not None
            (out / "records" / f"peer-{transport}.jsonl").write_bytes(member.read())
    (out / "runs.tsv").write_text("nt-allreduce-r1\t0\t6.1\n")
    (out / "commands.txt").write_text("15:25:37 nt-allreduce-r1: mpirun -np 4 all_reduce_perf -g 1\n")
    return out


def test_report_of_run1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run1_outdir(tmp_path)
    assert helper.main(["compare_nccl_tests.py", str(out)]) == 1  # run 1 misses the busbw targets
    markdown = (out / "comparison.md").read_text()
    assert markdown == capsys.readouterr().out
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert len(rows) == 4 * 30 and rows[0].keys() == set(helper.CSV_COLUMNS)
    by_key = {(row["op"], int(row["requested_bytes"])): row for row in rows}
    # ratios = nccl-tests time / commbench median time, read off the two files by hand
    assert float(by_key["allreduce", 64 << 20]["busbw_ratio"]) == pytest.approx(322.62 / 342.21966, abs=1e-4)
    assert float(by_key["alltoall", 256 << 20]["busbw_ratio"]) == pytest.approx(0.894, abs=5e-4)
    assert float(by_key["allgather", 64 << 20]["busbw_ratio"]) == pytest.approx(0.949, abs=5e-4)
    assert float(by_key["allreduce", 8]["time_ratio"]) == pytest.approx(19.223 / 23.58, abs=1e-4)
    # sizes where the tools move different bytes get no ratio
    assert by_key["alltoall", 16]["nt_bytes"] == "0" and by_key["alltoall", 16]["cb_bytes"] == "16"
    assert by_key["alltoall", 16]["time_ratio"] == "-"
    assert by_key["sendrecv", 8]["nt_time_us"] == "12.590" and by_key["sendrecv", 8]["cb_time_us"] == "-"
    assert "| busbw >= 0.98x nccl-tests at >= 64 MiB | allreduce | min 0.943 at 64 MiB | **FAIL**" in markdown
    assert "| time <= 1.05x nccl-tests at 8 B | allreduce | 0.815" in markdown and "warm-up effect" in markdown
    assert "| time <= 1.05x nccl-tests at 8 B | alltoall | n/a | n/a |" in markdown
    assert "median 395.1 GB/s" in markdown and "median 776.7 GB/s" in markdown and "median 365.1 GB/s" in markdown
    assert "sendrecv: no commbench results" in markdown
    assert "mpirun -np 4 all_reduce_perf" in markdown


def test_report_rejects_broken_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run1_outdir(tmp_path)
    (out / "records" / "cb-alltoall-r1.jsonl").write_text('{"kind": "result"\n')
    assert helper.main(["compare_nccl_tests.py", str(out)]) == 2
    assert "cb-alltoall-r1.jsonl:1: not JSON" in capsys.readouterr().err
    assert not (out / "comparison.md").exists()
    assert helper.main(["compare_nccl_tests.py", str(tmp_path / "missing")]) == 2


def test_report_flags_invalid_results_and_failed_runs(tmp_path: Path) -> None:
    out = run1_outdir(tmp_path)
    path = out / "records" / "cb-allreduce-r1.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[3]["valid"], records[3]["wrong_elements"] = False, 7
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "runs.tsv").write_text("peer-d2d\t3\t10.2\n")
    assert helper.main(["compare_nccl_tests.py", str(out)]) == 1
    markdown = (out / "comparison.md").read_text()
    assert "cb-allreduce-r1.jsonl: 64 B not valid (7 wrong elements)" in markdown
    assert "run peer-d2d exited with 3 after 10.2 s" in markdown


REPLAY = '''#!{python}
"""nccl-tests stand-in: prints run 1's recorded output of {name} up to -e (rank 0 only)."""
import os, sys
if os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0":
    sys.exit(0)
args = sys.argv[1:]
units = {{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}}
text = args[args.index("-e") + 1]
max_bytes = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
size = 8
for line in open({recorded!r}):
    if line.startswith("#") or not line.strip():
        print(line, end="")
    elif size <= max_bytes:
        print(line, end="")
        size *= 2
'''


def test_script_plumbing_end_to_end(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    """Real mpirun and the real cpu commbench (transport mpi) through the whole script; nccl-tests
    replays recorded output; the D2D runs fail (the cpu build has no d2d transport) and must be
    reported, not hide the rest."""
    nt_dir = tmp_path / "nccl-tests" / "build"
    nt_dir.mkdir(parents=True)
    for op, binary in (line.split() for line in subprocess.run(
            [sys.executable, str(SCRIPTS / "compare_nccl_tests.py"), "plan"], capture_output=True, text=True,
            check=True).stdout.splitlines()):
        stand_in = nt_dir / binary
        stand_in.write_text(REPLAY.format(python=sys.executable, name=binary,
                                          recorded=str(RUN1 / "nt-outputs" / NT_FILES[op])))
        stand_in.chmod(0o755)
    launcher = tmp_path / "bin" / "mpirun"
    launcher.parent.mkdir()
    launcher.write_text('#!/bin/sh\nexec mpirun.openmpi --oversubscribe "$@"\n')
    launcher.chmod(0o755)
    out = tmp_path / "cmp"
    env = launch_env({"NCCL_TESTS_DIR": str(nt_dir.parent), "COMMBENCH": str(commbench_builds["openmpi"].binary),
                      "MPIRUN": str(launcher), "TRANSPORT": "mpi", "MAX_BYTES": "64K", "ITERS": "4",
                      "SAMPLES": "3", "D2D_SIZE": "64K", "D2D_ITERS": "2"})
    done = subprocess.run([str(SCRIPTS / "compare-nccl-tests.sh"), str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    runs = [line.split("\t") for line in (out / "runs.tsv").read_text().splitlines()]
    assert [name for name, _, _ in runs] == [f"{tool}-{op}-r{k}" for op in NT_FILES for k in (1, 2)
                                             for tool in ("nt", "cb")] + ["peer-d2d", "peer-d2d-kernel"]
    assert all(status == "0" for name, status, _ in runs if not name.startswith("peer-"))
    assert all(status == "2" for name, status, _ in runs if name.startswith("peer-"))
    commands = (out / "commands.txt").read_text()
    assert "-g 1 -b 8 -e 64K -f 2 -w 5 -n 4 -c 1" in commands
    assert "--transport mpi --op sendrecv --min-bytes 8 --max-bytes 64K --step-factor 2 --warmup 1 --iters 3 " \
           "--batch 4" in commands
    for op in NT_FILES:
        for k in (1, 2):
            records = [json.loads(line) for line in (out / "records" / f"cb-{op}-r{k}.jsonl").read_text().splitlines()]
            assert len(records) == 14 and all(r["valid"] and r["batch"] == 4 and r["iters"] == 3 for r in records)
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert len(rows) == 4 * 14
    assert all(len(row["nt_time_us_repeats"].split()) == 2 == len(row["cb_time_us_repeats"].split()) for row in rows)
    markdown = (out / "comparison.md").read_text()
    assert "run peer-d2d exited with 2" in markdown and "peer-d2d.jsonl is missing" in markdown
    with tarfile.open(out / "compare.tar.gz") as bundle:
        names = set(bundle.getnames())
    assert {"./comparison.md", "./comparison.csv", "./commands.txt", "./runs.tsv", "./environment.txt",
            "./raw/nt-sendrecv-r2.txt", "./records/cb-allgather-r1.jsonl"} <= names
    assert not any(name.startswith("./build") for name in names)


def test_script_refuses_missing_nccl_tests(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("NCCL_TESTS_DIR", None)
    done = subprocess.run([str(SCRIPTS / "compare-nccl-tests.sh"), str(tmp_path / "o")], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 2 and "set NCCL_TESTS_DIR" in done.stderr
    env["NCCL_TESTS_DIR"] = str(tmp_path)
    done = subprocess.run([str(SCRIPTS / "compare-nccl-tests.sh"), str(tmp_path / "o")], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 2 and "all_reduce_perf is not an executable" in done.stderr
    assert not (tmp_path / "o").exists()
