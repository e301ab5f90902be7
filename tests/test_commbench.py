"""commbench cpu backend under real Open MPI and MPICH launchers: record contract, validation,
watchdog, argument errors. Small sizes and few iterations keep it fast on two cores."""
from __future__ import annotations

import datetime
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fixtures_bench import MPIS, CommbenchBuild, launch_env, mpi_launch, read_records, run_commbench

# 100 bytes is not a whole number of float32 chunks at 3 or 4 ranks: tests the rounding.
SIZES = [100, 4096]
ITERS = 3
COLLECTIVE_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}
# A planted variable with characters JSON must escape (quote, backslash, control, newline).
TRICKY_ENV = {"NCCL_COMMCAMP_TEST": 'a"b\\c\x01\nd', "OMPI_MCA_commcamp_test": "x"}


def expected_bytes(op: str, requested: int, nranks: int) -> int:
    """nccl-tests convention: whole float32 elements, chunked ops in whole chunks per rank."""
    elements = requested // 4
    if op in ("alltoall", "allgather", "reduce_scatter"):
        elements = elements // nranks * nranks
    return elements * 4


def pairs_on_one_node(nranks: int) -> int:
    return nranks * (nranks - 1) // 2


def check_result_record(record: dict[str, Any], nranks: int, batch: int = 1) -> None:
    """Internal consistency of one result record."""
    assert record["kind"] == "result" and record["valid"] is True and record["check"] is True
    assert record["wrong_elements"] == 0 and record["error"] is None and record["reason"] is None
    assert len(record["samples_us"]) == ITERS == record["iters"]
    assert record["batch"] == batch
    stats = record["stats"]
    samples = sorted(record["samples_us"])
    assert stats["min_us"] == pytest.approx(samples[0]) and stats["max_us"] == pytest.approx(samples[-1])
    assert stats["median_us"] == pytest.approx(samples[1])
    assert stats["min_us"] <= stats["median_us"] <= stats["p95_us"] <= stats["max_us"]
    assert record["latency_us"] == pytest.approx(stats["median_us"])
    assert record["bytes"] == expected_bytes(record["op"], record["requested_bytes"], nranks)
    assert record["count"] * 4 == record["bytes"]
    # bandwidths from the median time: GB/s = bytes / (us * 1e3)
    algbw = record["bytes"] / (stats["median_us"] * 1e3)
    assert record["algbw_gbs"] == pytest.approx(algbw, rel=1e-6)
    assert record["goodput_gbs"] == pytest.approx(algbw, rel=1e-6)
    factor = COLLECTIVE_FACTOR.get(record["op"], lambda n: 1.0)(nranks)
    assert record["busbw_factor"] == pytest.approx(factor)
    assert record["busbw_gbs"] == pytest.approx(algbw * factor, rel=1e-6)
    if record.get("direction") == "bi":
        assert record["aggregate_gbs"] == pytest.approx(2 * algbw, rel=1e-6)
    assert datetime.datetime.fromisoformat(record["timestamp"]).tzinfo is not None


def test_unit_program(commbench_builds: dict[str, CommbenchBuild]) -> None:
    for build in commbench_builds.values():
        done = subprocess.run([str(build.unit)], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert ", 0 failed" in done.stdout
    ctest = subprocess.run(["ctest", "--output-on-failure"], cwd=commbench_builds["mpich"].binary.parent,
                           capture_output=True, text=True, timeout=60, check=False)
    assert ctest.returncode == 0 and "100% tests passed" in ctest.stdout, ctest.stdout


def test_install_target(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    done = subprocess.run(["cmake", "--install", str(commbench_builds["openmpi"].binary.parent), "--prefix",
                           str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    installed = tmp_path / "bin" / "commbench"
    version = subprocess.run([str(installed), "--version"], capture_output=True, text=True, timeout=30, check=False)
    assert version.stdout.startswith("commbench 0.1.0 backend cpu")
    assert (tmp_path / "share" / "commbench" / "commbench-record.schema.json").exists()


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("mpi", MPIS)
def test_every_op_records_validate(
    commbench_builds: dict[str, CommbenchBuild],
    record_validator: jsonschema.Draft202012Validator,
    tmp_path: Path,
    mpi: str,
    nranks: int,
) -> None:
    output = tmp_path / "out.jsonl"
    sizes = ",".join(str(s) for s in SIZES)
    done = run_commbench(
        commbench_builds[mpi],
        nranks,
        ["--sizes", sizes, "--iters", str(ITERS), "--warmup", "0", "--output", str(output)],
        env=TRICKY_ENV,
    )
    assert done.returncode == 0, done.stderr
    records = read_records(output)
    for record in records:
        record_validator.validate(record)
        check_result_record(record, nranks)
        assert record["backend"] == "cpu" and record["transport"] == "mpi"
        assert record["ranks"] == nranks and record["nodes"] == 1 and len(record["hostnames"]) == nranks
        assert ("Open MPI" if mpi == "openmpi" else "MPICH") in record["mpi_library"]
        assert record["env"]["NCCL_COMMCAMP_TEST"] == TRICKY_ENV["NCCL_COMMCAMP_TEST"]
        assert record["env"]["OMPI_MCA_commcamp_test"] == "x"
        assert not any(k.startswith("OMPI_COMM_WORLD_") for k in record["env"])
        assert record["devices"] is None

    by_op: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_op.setdefault(record["op"], []).append(record)
    # the cpu build runs every op the mpi transport implements, h2d/d2h need a GPU backend
    assert set(by_op) == {"pingpong", "pingpong_bi", "allreduce", "alltoall", "allgather", "reduce_scatter",
                          "bcast", "pairmatrix", "sendrecv"}
    for op, recs in by_op.items():
        if op == "pairmatrix":
            assert len(recs) == len(SIZES) * pairs_on_one_node(nranks) * 2
            seen = {(r["pair"]["src"], r["pair"]["dst"], r["direction"], r["requested_bytes"]) for r in recs}
            assert len(seen) == len(recs)
        else:
            assert [r["requested_bytes"] for r in recs] == SIZES
    for record in by_op["pingpong"]:
        assert record["pair"] == {"src": 0, "dst": nranks - 1} and record["direction"] == "uni"
    assert {r["direction"] for r in by_op["pingpong_bi"]} == {"bi"}
    # the human table: one row per record
    rows = [line for line in done.stdout.splitlines() if line.startswith("  ")]
    assert len(rows) == len(records)


@pytest.mark.parametrize("mpi", MPIS)
def test_sendrecv_ring_and_batched_samples(
    commbench_builds: dict[str, CommbenchBuild],
    record_validator: jsonschema.Draft202012Validator,
    tmp_path: Path,
    mpi: str,
) -> None:
    """3 ranks: rank - 1 and rank + 1 differ, so only a ring shift validates; --batch is recorded
    and every sample is still one per timed sample (elapsed / batch)."""
    output = tmp_path / "out.jsonl"
    nranks, batch = 3, 4
    done = run_commbench(
        commbench_builds[mpi], nranks,
        ["--op", "sendrecv,pingpong,allreduce", "--sizes", ",".join(str(s) for s in SIZES), "--iters", str(ITERS),
         "--warmup", "1", "--batch", str(batch), "--output", str(output)],
    )
    assert done.returncode == 0, done.stderr
    records = read_records(output)
    assert [(r["op"], r["requested_bytes"]) for r in records] == [
        (op, size) for op in ("sendrecv", "pingpong", "allreduce") for size in SIZES]
    for record in records:
        record_validator.validate(record)
        check_result_record(record, nranks, batch)
    for record in records[: len(SIZES)]:
        assert "pair" not in record and "direction" not in record and record["busbw_factor"] == 1.0


def test_peer_override_and_append(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path
) -> None:
    output = tmp_path / "out.jsonl"
    build = commbench_builds["openmpi"]
    common = ["--op", "pingpong", "--iters", str(ITERS), "--warmup", "0", "--output", str(output)]
    first = run_commbench(build, 3, [*common, "--sizes", "8"])
    second = run_commbench(build, 3, [*common, "--min-bytes", "1K", "--max-bytes", "4K", "--peer", "1"])
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    records = read_records(output)
    for record in records:
        record_validator.validate(record)
    assert [(r["requested_bytes"], r["pair"]["dst"]) for r in records] == [(8, 2), (1024, 1), (2048, 1), (4096, 1)]


@pytest.mark.parametrize(("mpi", "nranks"), [("openmpi", 4), ("mpich", 2)])
def test_planted_corruption_is_detected(
    commbench_builds: dict[str, CommbenchBuild],
    record_validator: jsonschema.Draft202012Validator,
    tmp_path: Path,
    mpi: str,
    nranks: int,
) -> None:
    output = tmp_path / "out.jsonl"
    done = run_commbench(
        commbench_builds[mpi],
        nranks,
        ["--op", "pingpong,allreduce,alltoall,bcast,sendrecv", "--sizes", "256", "--iters", "2", "--warmup", "0",
         "--inject", "corrupt", "--output", str(output)],
    )
    assert done.returncode == 1, done.stderr
    records = read_records(output)
    assert [r["op"] for r in records] == ["pingpong", "allreduce", "alltoall", "bcast", "sendrecv"]
    for record in records:
        record_validator.validate(record)
        # one element overwritten before each of the two checks (timed loop, extra iteration)
        assert record["valid"] is False and record["wrong_elements"] == 2 and record["reason"] == "validation"
    assert "WRONG" in done.stdout


def test_planted_corruption_is_detected_where_the_last_rank_takes_no_part(
        commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    """--peer 1 of 3 ranks and the matrix pairs without the last rank: 'corrupt' overwrote data only on the last
    rank, which checked nothing there: valid records and exit 0 under a planted fault."""
    output = tmp_path / "out.jsonl"
    done = run_commbench(commbench_builds["openmpi"], 3, ["--op", "pingpong,pairmatrix", "--peer", "1", "--sizes",
                                                          "64", "--iters", "2", "--warmup", "0", "--inject",
                                                          "corrupt", "--output", str(output)])
    assert done.returncode == 1, done.stderr
    records = read_records(output)
    assert len(records) == 1 + 6 and all(r["valid"] is False and r["wrong_elements"] == 2 for r in records)


def test_no_check_skips_validation(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    done = run_commbench(
        commbench_builds["mpich"], 2,
        ["--op", "allreduce", "--sizes", "256", "--iters", "2", "--no-check", "--inject", "corrupt",
         "--output", str(output)],
    )
    assert done.returncode == 0, done.stderr
    [record] = read_records(output)
    assert record["check"] is False and record["valid"] is True and record["wrong_elements"] == 0


@pytest.mark.parametrize(("mpi", "ranks", "sweep"), [("openmpi", 2, False), ("mpich", 3, False), ("mpich", 3, True)])
def test_one_rank_s_failed_operation_is_an_error_record_and_the_run_goes_on(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path,
    mpi: str, ranks: int, sweep: bool,
) -> None:
    """A failure on one rank inside the timed loop (a GPU or library error there) made that rank leave the loop
    alone: the others' next barrier met its allreduce (Open MPI: MPI_ERR_TRUNCATE, exit 15, no record) or waited
    for the watchdog (a timeout record, exit 3, every later size and op lost). Every rank stops at the same
    sample now: an error record naming the rank, exit 4, the rest measured (a sweep: the other selections)."""
    output = tmp_path / "out.jsonl"
    args = ["--op", "allreduce", "--sizes", "1K", "--selections", "all", "--rounds", "2"] if sweep else [
        "--op", "allreduce,pingpong", "--sizes", "64,1K"]
    done = run_commbench(commbench_builds[mpi], ranks, [*args, "--iters", "3", "--warmup", "1", "--timeout", "20",
                                                        "--inject", "fail", "--output", str(output)], timeout=60)
    assert done.returncode == 4, done.stdout + done.stderr
    first, *rest = read_records(output)
    record_validator.validate(first)
    assert (first["kind"], first["reason"], first["bytes"]) == ("error", "runtime", 1024 if sweep else 64)
    assert first["error"] == f"rank {ranks - 1}: injected failure of this rank's operation (--inject fail)"
    assert rest and all(record["kind"] == "result" and record["valid"] for record in rest), rest
    assert len(rest) >= 3 if sweep else [(r["op"], r["bytes"]) for r in rest] == [
        ("allreduce", 1024), ("pingpong", 64), ("pingpong", 1024)]


@pytest.mark.parametrize(("mpi", "op"), [("openmpi", "allreduce"), ("mpich", "pingpong")])
def test_planted_hang_times_out(
    commbench_builds: dict[str, CommbenchBuild],
    record_validator: jsonschema.Draft202012Validator,
    tmp_path: Path,
    mpi: str,
    op: str,
) -> None:
    output = tmp_path / "out.jsonl"
    timeout = 2.0
    started = time.monotonic()
    done = run_commbench(
        commbench_builds[mpi], 4,
        ["--op", op, "--sizes", "1K", "--iters", "3", "--warmup", "1", "--inject", "hang",
         "--timeout", str(timeout), "--output", str(output)],
        timeout=30,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    # launcher start-up and tear-down on two oversubscribed cores: a few seconds of margin
    assert elapsed < timeout + 8, elapsed
    [record] = read_records(output)
    record_validator.validate(record)
    assert record["kind"] == "error" and record["reason"] == "timeout" and record["valid"] is False
    assert record["op"] == op and record["transport"] == "mpi" and record["bytes"] == 1024
    assert "no progress for 2 s" in record["error"] and f"op {op}" in record["error"]
    assert "TIMEOUT" in done.stderr and "stops participating" in done.stderr


def test_unsupported_op_is_an_error_record(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path
) -> None:
    # Without --transport, each transport runs the asked ops it implements; an op none implements is an
    # error record once (not one per transport: a GPU build measured h2d with memcpy, yet exited 4 with
    # "transport staging does not implement op h2d" for every other transport).
    output = tmp_path / "out.jsonl"
    done = run_commbench(
        commbench_builds["openmpi"], 2,
        ["--op", "h2d,pingpong", "--sizes", "64", "--iters", "2", "--output", str(output)],
    )
    assert done.returncode == 4, done.stderr
    records = read_records(output)
    for record in records:
        record_validator.validate(record)
    assert [(r["op"], r["transport"], r["kind"], r.get("reason")) for r in records] == [
        ("pingpong", "mpi", "result", None), ("h2d", "none", "error", "unsupported")]
    assert records[1]["error"] == "no transport of the cpu backend implements op h2d"
    # A transport asked for by name answers for every op asked.
    named = tmp_path / "named.jsonl"
    done = run_commbench(commbench_builds["openmpi"], 2, ["--op", "h2d,pingpong", "--transport", "mpi",
                                                          "--sizes", "64", "--iters", "2", "--output", str(named)])
    assert done.returncode == 4, done.stderr
    assert [(r["op"], r["kind"]) for r in read_records(named)] == [("h2d", "error"), ("pingpong", "result")]
    assert "transport mpi does not implement op h2d" in read_records(named)[0]["error"]
    # Ops that the transports implement: no error at all.
    done = run_commbench(commbench_builds["openmpi"], 2, ["--op", "pingpong", "--sizes", "64", "--iters", "2"])
    assert done.returncode == 0, done.stderr


def test_single_rank_pingpong_is_unsupported(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    done = run_commbench(commbench_builds["mpich"], 1,
                         ["--op", "pingpong,allreduce", "--sizes", "64", "--iters", "2", "--output", str(output)])
    assert done.returncode == 4, done.stderr
    records = read_records(output)
    assert records[0]["reason"] == "unsupported" and "at least 2 ranks" in records[0]["error"]
    assert records[1]["kind"] == "result" and records[1]["busbw_factor"] == 0.0


BAD_ARGUMENTS = [
    (["--iters", "0"], "--iters"),
    (["--iters", "-5"], "--iters"),
    (["--warmup", "x"], "--warmup"),
    (["--min-bytes", "0"], "--min-bytes"),
    (["--max-bytes", "lots"], "--max-bytes"),
    (["--max-bytes", "4096G"], "--max-bytes"),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "--max-bytes"),
    (["--sizes", "8,-1"], "--sizes"),
    (["--step-factor", "1"], "--step-factor"),
    (["--timeout", "0"], "--timeout"),
    (["--op", "allreduse"], "allreduse"),
    (["--transport", "nccl"], "nccl"),
    (["--inject", "boom"], "--inject"),
    (["--frobnicate"], "--frobnicate"),
    (["--iters"], "--iters"),
    (["--batch", "0"], "--batch"),
    (["--batch", "many"], "--batch"),
    # a name twice in a list; 70 --op names overflowed a 64-entry table (a crash, not a message)
    (["--op", "allreduce,bcast,allreduce"], "--op: 'allreduce' is named twice"),
    (["--op", ",".join(["allreduce"] * 70)], "--op: 'allreduce' is named twice"),
    (["--transport", "mpi,mpi"], "--transport: 'mpi' is named twice"),
    # an option where a value belongs: --output wrote to a file named "--no-check"
    (["--output", "--no-check"], "--output needs a value, not the option '--no-check'"),
    (["--op", "--sizes", "8"], "--op needs a value"),
    # checked whatever their position: --help and --version stopped the parse and exited 0
    (["--version", "--iters", "0"], "--iters"),
    (["--help", "--frobnicate"], "--frobnicate"),
    # 'all' inside a list was a selection named "all" (exit 4 at run time, after the launch)
    (["--selections", "all,ring"], "--selections: 'all' is every selection: give it alone"),
]


@pytest.mark.parametrize(("args", "named"), BAD_ARGUMENTS)
def test_bad_arguments_exit_2(commbench_builds: dict[str, CommbenchBuild], args: list[str], named: str) -> None:
    done = subprocess.run([str(commbench_builds["openmpi"].binary), *args], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("commbench: ") and named in done.stderr
    assert done.stdout == ""


def test_bad_arguments_under_launchers(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    for build in commbench_builds.values():
        done = run_commbench(build, 2, ["--iters", "zero"])
        assert done.returncode == 2
        assert done.stderr.count("--iters: 'zero'") == 1  # printed once, by rank 0
        peer = run_commbench(build, 2, ["--peer", "5", "--op", "pingpong"])
        assert peer.returncode == 2 and "--peer: rank 5 does not exist (2 ranks)" in peer.stderr
        output = run_commbench(build, 2, ["--output", str(tmp_path / "missing" / "x.jsonl")])
        assert output.returncode == 2 and "cannot open --output" in output.stderr


def test_help_version_list(commbench_builds: dict[str, CommbenchBuild]) -> None:
    binary = str(commbench_builds["mpich"].binary)
    helped = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30, check=False)
    assert helped.returncode == 0
    for flag in ("--op", "--transport", "--list", "--min-bytes", "--max-bytes", "--step-factor", "--sizes",
                 "--warmup", "--iters", "--batch", "nccl-tests' throughput method", "--check", "--no-check", "--peer", "--device", "--assume-gpu-aware-mpi",
                 "--timeout", "--output", "--inject", "--version", "--help", "TEST ONLY", "Exit codes",
                 "3 timeout", "GB/s", "busbw", "goodput", "round trip / 2",
                 # exit 4 for standard output holds for commbench's own; under a launcher it is the launcher's
                 "commbench's own standard output", "Under a launcher (mpirun, mpiexec, srun)", "use --output"):
        assert flag in helped.stdout, flag
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    assert version.returncode == 0 and version.stdout.startswith("commbench 0.1.0 backend cpu schema 2")
    listed = subprocess.run([binary, "--list"], capture_output=True, text=True, timeout=30, check=False)
    assert listed.stdout.splitlines() == [
        "backend cpu",
        "transport mpi ops pingpong,pingpong_bi,allreduce,alltoall,allgather,reduce_scatter,bcast,pairmatrix,sendrecv",
    ]


def test_env_filter_in_records(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    env = launch_env({"UCX_COMMCAMP_BAD_UTF8": "x\udcffy", "PLAIN_VAR": "1"})
    done = subprocess.run(
        ["mpiexec.mpich", "-n", "2", str(commbench_builds["mpich"].binary), "--op", "bcast", "--sizes", "8",
         "--iters", "1", "--output", str(output)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    [record] = read_records(output)
    # an invalid UTF-8 byte in a value becomes U+FFFD instead of breaking the JSON
    assert record["env"]["UCX_COMMCAMP_BAD_UTF8"] == "x\ufffdy"
    assert "PLAIN_VAR" not in record["env"] and "PMI_RANK" not in record["env"]


def limit_address_space() -> None:
    """In the child: 6 GiB of address space, so a 7 GiB buffer cannot be had whatever vm.overcommit_memory says."""
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def test_allocation_failure_is_an_error_record(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path
) -> None:
    output = tmp_path / "out.jsonl"
    build = commbench_builds["openmpi"]
    done = subprocess.run(
        [*mpi_launch(build.mpi, 2), str(build.binary), "--op", "allreduce,pingpong", "--sizes", "7G", "--iters", "1",
         "--output", str(output)],
        capture_output=True, text=True, timeout=60, env=launch_env(), preexec_fn=limit_address_space, check=False,
    )
    assert done.returncode == 4, done.stderr
    records = read_records(output)
    assert [r["op"] for r in records] == ["allreduce", "pingpong"]
    for record in records:
        record_validator.validate(record)
        assert record["reason"] == "runtime" and "cannot allocate 7516192768 bytes" in record["error"]
        assert record["bytes"] == 7 << 30


@pytest.mark.parametrize("mpi", MPIS)
def test_sizes_beyond_the_transports_count_exit_2(
    commbench_builds: dict[str, CommbenchBuild], tmp_path: Path, mpi: str
) -> None:
    """A count above MPI's int on a transport named in --transport is refused before anything runs or is
    allocated (it was an error record after the largest buffers had been allocated and filled, or allocation
    failed first: exit 4)."""
    output = tmp_path / "out.jsonl"
    started = time.monotonic()
    done = run_commbench(commbench_builds[mpi], 2, ["--op", "pingpong,allreduce", "--sizes", "8,1024G",
                                                    "--iters", "1", "--transport", "mpi", "--output", str(output)])
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("commbench: size 1099511627776 B: op pingpong passes 274877906944 elements per call at "
                             "2 ranks; transport mpi takes at most 2147483647") == 1  # said once, by rank 0
    assert output.read_text() == "" and time.monotonic() - started < 30


@pytest.mark.parametrize("mpi", MPIS)
def test_sizes_beyond_a_default_transports_count_are_unsupported_records(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path,
    mpi: str
) -> None:
    """Without --transport (the cpu build's default transports: mpi), a size a transport cannot take is an
    `unsupported` record of that transport and the other sizes run: refusing the whole run kept a GPU build's
    ccl, d2d and d2d-kernel from the 8 GiB that only staging and mpi cannot take. 1 TiB is never allocated:
    6 GiB of address space would fail that (a runtime record)."""
    output = tmp_path / "out.jsonl"
    build = commbench_builds[mpi]
    done = subprocess.run(
        [*mpi_launch(build.mpi, 2), str(build.binary), "--op", "pingpong,allreduce", "--sizes", "8,1024G,64",
         "--iters", "1", "--output", str(output)],
        capture_output=True, text=True, timeout=60, env=launch_env(), preexec_fn=limit_address_space, check=False,
    )
    assert done.returncode == 4, done.stdout + done.stderr
    records = read_records(output)
    for record in records:
        record_validator.validate(record)
    assert [(r["op"], r["requested_bytes"], r["kind"]) for r in records] == [
        ("pingpong", 1 << 40, "error"), ("pingpong", 8, "result"), ("pingpong", 64, "result"),
        ("allreduce", 1 << 40, "error"), ("allreduce", 8, "result"), ("allreduce", 64, "result")]
    for record in records:
        if record["kind"] == "error":
            assert record["reason"] == "unsupported" and record["transport"] == "mpi"
            assert record["bytes"] == 1 << 40 and "transport mpi takes at most 2147483647" in record["error"]
        else:
            assert record["valid"] is True
