"""campaigns.formats: one parser per foreign format, tested on real outputs, and `results ingest --format`.

Test data: nccl-tests 2.19.6 text printed on 4x H200 (results/reference/h200x4/run1/nt-outputs/, committed
with its provenance) and OSU 7.0 outputs printed here (tests/data/osu/PROVENANCE.md).
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from fixtures_cli import commcamp

from campaigns.formats import foreign, nccl_tests, osu
from campaigns.formats.packs import pack_files
from campaigns.model.records import validate_record
from campaigns.store import open_store

REPO = Path(__file__).resolve().parents[1]
NT_OUTPUTS = REPO / "results" / "reference" / "h200x4" / "run1" / "nt-outputs"
OSU_DATA = Path(__file__).resolve().parent / "data" / "osu"
STAMP = datetime(2026, 11, 23, tzinfo=timezone.utc)


def test_nccl_tests_text_rows_hosts_and_header() -> None:
    run = nccl_tests.parse_text((NT_OUTPUTS / "all_reduce.txt").read_text())
    assert (run.op, run.version, run.nccl_version, run.warmup, run.iters) == ("allreduce", "2.19.6", "22803", 5, 20)
    assert run.hosts == ["vm"] * 4 and run.devices[0].endswith("NVIDIA H200")
    assert [row.size for row in run.rows][:3] == [8, 16, 32] and run.rows[-1].size == 4294967296
    last = run.rows[-1]
    # "4294967296 1073741824 float sum -1  17778.2  241.59  362.38  0  17755.2  241.90  362.85  0"
    assert (last.out_of_place.time_us, last.out_of_place.busbw_gbs, last.in_place.time_us) == (17778.2, 362.38, 17755.2)
    alltoall = nccl_tests.parse_text((NT_OUTPUTS / "alltoall.txt").read_text())
    assert alltoall.op == "alltoall" and alltoall.rows[0].in_place.wrong is None  # "N/A": not checked


def test_nccl_tests_text_refuses_a_broken_row_and_foreign_text() -> None:
    text = (NT_OUTPUTS / "sendrecv.txt").read_text()
    broken = text.replace("  12.59  ", "  12.x9  ", 1)
    with pytest.raises(nccl_tests.NcclTestsError, match=r":\d+: not an nccl-tests row"):
        nccl_tests.parse_text(broken, "sendrecv.txt")
    with pytest.raises(nccl_tests.NcclTestsError, match="no nccl-tests result rows"):
        nccl_tests.parse_text((OSU_DATA / "osu_latency.txt").read_text())


def _nccl_tests_json(per_iter: bool) -> str:
    """An nccl-tests -J document shaped as src/util.cu (JSON_FILE_VERSION 3) writes it, with the values
    of the committed all_reduce.txt's 1 MiB row."""
    result = {"size": 1048576, "count": 262144, "type": "float", "redop": "sum", "root": "    -1",
              "out_of_place": {"time": 18.75, "alg_bw": 55.91, "bus_bw": 83.87, "nwrong": 0.0},
              "in_place": {"time": 18.39, "alg_bw": 57.01, "bus_bw": 85.51, "nwrong": 0.0},
              "actual_iterations": 3, "experiment_name": ""}
    if per_iter:
        result["out_of_place_per_iter"] = {"skipped_iterations": 0, "min_us": 18.0, "max_us": 20.0,
                                           "times_us": [18.0, 18.25, 20.0],
                                           "per_process_max_times_us": [[18.0, 18.1, 20.0], [17.0, 18.25, 12.0]]}
    return json.dumps({"version": 3, "args": ["./build/all_reduce_perf", "-b", "1M", "-e", "1M"], "env": [],
                       "nccl_version": 22803, "config": {"iterations": 3, "warmup_iters": 1},
                       "devices": [{"rank": 1, "hostname": "n2", "device": 0, "device_hex": "0x1",
                                    "device_info": "H200"},
                                   {"rank": 0, "hostname": "n1", "device": 0, "device_hex": "0x1",
                                    "device_info": "H200"}],
                       "results": [result]})


def test_nccl_tests_json_keeps_per_iteration_and_per_process_times() -> None:
    [record] = foreign.parse("nccl-tests-json", _nccl_tests_json(per_iter=True), source="t.json", timestamp=STAMP)
    validate_record(record, "t.json")
    assert (record["op"], record["hostnames"], record["nodes"], record["bytes"]) == ("allreduce", ["n1", "n2"], 2, 1048576)
    assert record["samples_us"] == [18.0, 18.25, 20.0] and record["iters"] == 3
    assert record["source"]["per_process_us"][1] == [17.0, 18.25, 12.0]
    # the schema's numbers from the samples (median 18.25 us, 2 ranks: factor 1); nccl-tests' own under reported
    assert record["latency_us"] == record["stats"]["median_us"] == 18.25 and record["batch"] == 1
    assert record["busbw_gbs"] == pytest.approx(1048576 / 18.25 / 1e3 * 1.0)
    assert record["source"]["reported"] == {"time_us": 18.75, "algbw_gbs": 55.91, "busbw_gbs": 83.87}
    [plain] = foreign.parse("nccl-tests-json", _nccl_tests_json(per_iter=False), source="t.json", timestamp=STAMP)
    assert plain["samples_us"] == [18.75] and plain["source"]["iterations_averaged"] == 3
    assert (plain["iters"], plain["batch"], plain["latency_us"]) == (1, 3, 18.75)  # one sample of 3 ops back to back
    with pytest.raises(nccl_tests.NcclTestsError, match="version 2 is not nccl-tests JSON version 3"):
        nccl_tests.parse_json(json.dumps({"version": 2}))


@pytest.mark.parametrize("name, op, quantity, rows", [
    ("osu_latency", "pingpong", "latency", 17), ("osu_bw", "osu_bw", "bandwidth", 17),
    ("osu_bibw", "osu_bibw", "bandwidth", 17), ("osu_allreduce", "allreduce", "latency", 15),
    ("osu_alltoall", "alltoall", "latency", 17), ("osu_allreduce-full", "allreduce", "latency", 15)])
def test_osu_outputs(name: str, op: str, quantity: str, rows: int) -> None:
    run = osu.parse_text((OSU_DATA / f"{name}.txt").read_text())
    assert (run.op, run.quantity, run.version, len(run.rows), run.ccl) == (op, quantity, "7.0-lrbison2", rows, False)
    records = foreign.osu_records(run, hostnames=["a", "b"], timestamp=STAMP)
    for record in records:
        validate_record(record, name)
    if quantity == "bandwidth":  # MB/s (10^6 B/s) -> time per message and GB/s (osu_bibw's: both directions)
        first = run.rows[-1]
        assert records[-1]["goodput_gbs"] == pytest.approx(first.value / (2 if op == "osu_bibw" else 1) / 1e3)
    if name.endswith("-full"):
        assert records[0]["source"]["iterations_averaged"] == 1000


def test_osu_refuses_what_it_cannot_read() -> None:
    with pytest.raises(osu.OsuError, match="a result row before the '# OSU ... Test' title line"):
        osu.parse_text("1 2.0\n")
    with pytest.raises(osu.OsuError, match="no '# OSU ... Test' title line"):
        osu.parse_text("# hello\n")
    with pytest.raises(osu.OsuError, match="is not an OSU benchmark commcamp reads"):
        osu.parse_text("# OSU MPI_Put Window Test v7.0\n8 1.0\n")
    with pytest.raises(osu.OsuError, match="runs on 2 ranks; 3 hosts given"):
        foreign.osu_records(osu.parse_text((OSU_DATA / "osu_latency.txt").read_text()), hostnames=["a", "b", "c"],
                            timestamp=STAMP)


def test_busbw_factor_is_the_one_commbench_records_carry() -> None:
    """commbench's C tables and this definition must agree: records commbench wrote (tests/data) carry
    busbw_factor; every one of them must equal foreign.busbw_factor(op, ranks)."""
    reference = REPO / "results" / "reference" / "h200x4"
    texts = [path.read_text() for path in reference.glob("run1/commbench-ccl/*.jsonl")]
    texts += [text for path in reference.glob("suite-run*/rfm.jsonl")  # ReFrame's output folders, packed
              for name, text in pack_files(path).items() if name.endswith("/commbench.jsonl")]
    committed = [json.loads(line) for text in texts for line in text.splitlines() if line.strip()]
    checked = [r for r in committed if r.get("kind") == "result" and "busbw_factor" in r]
    assert len({r["op"] for r in checked}) >= 3
    for record in checked:
        assert record["busbw_factor"] == pytest.approx(foreign.busbw_factor(record["op"], record["ranks"])), record["op"]


def test_ingest_nccl_tests_and_osu_store_first_class_measurements(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code, out, err = commcamp("results", "ingest", NT_OUTPUTS / "sendrecv.txt", "--format", "nccl-tests",
                              "--site", "h200", "--system", "h200", "--db", url)
    assert code == 0, out + err
    code, out, err = commcamp("results", "ingest", OSU_DATA / "osu_latency.txt", "--format", "osu",
                              "--hosts", "n1,n2", "--mpi-library", "Open MPI 4.1.4", "--site", "local",
                              "--system", "local", "--db", url)
    assert code == 0, out + err
    with open_store(url) as store:
        frame = store.measurements()
        runs = store.runs()
    assert sorted((run.num_tasks, run.num_nodes) for run in runs) == [(2, 2), (4, 1)]
    # the checks a campaign's runs of these outputs are stored under (`results runs` said "commbench")
    assert sorted(run.check_name for run in runs) == ["nccl_tests_run", "osu_run"]
    # a file an older commcamp stored under the old default name: the same file again is still skipped
    with open_store(url) as store, store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE runs SET check_name = 'commbench'")
    code, out, err = commcamp("results", "ingest", NT_OUTPUTS / "sendrecv.txt", "--format", "nccl-tests",
                              "--site", "h200", "--system", "h200", "--db", url)
    assert code == 0 and "skipped: the records of" in out, out + err
    with open_store(url) as store, store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE runs SET check_name = 'nccl_tests_run' WHERE num_tasks = 4")
        connection.exec_driver_sql("UPDATE runs SET check_name = 'osu_run' WHERE num_tasks = 2")
    nt = frame[frame.op == "sendrecv"]
    assert len(nt) == 30 and set(nt.transport) == {"ccl"} and set(nt.commbench_version) == {"none"}
    assert nt[nt.bytes == 8].latency_us.item() == 12.59
    latency = frame[frame.op == "pingpong"]
    assert latency[latency.bytes == 1].latency_us.item() == 47.46 and set(latency.transport) == {"mpi"}
    code, out, err = commcamp("results", "export", "--db", url, "--op", "pingpong", "--format", "csv",
                              "-o", tmp_path / "x.csv")
    assert code == 0, out + err
    # a copy of the same output (its modification time, which its records' timestamps are, another): skipped as
    # the same measurement (before: 'run manual:... is already stored', exit 1)
    copy = tmp_path / "sendrecv.txt"
    copy.write_text((NT_OUTPUTS / "sendrecv.txt").read_text())
    os.utime(copy, (1e9, 1e9))
    code, out, err = commcamp("results", "ingest", copy, "--format", "nccl-tests", "--site", "h200", "--system",
                              "h200", "--db", url)
    assert code == 0 and "skipped: the records of" in out and "already stored as run 1" in out, out + err
    # a copy described otherwise (the hosts and library corrected) is not that measurement: refused, naming the
    # options (before: "skipped", exit 0, and the store kept the old description); --replace corrects the run
    copy = tmp_path / "osu_latency.txt"
    copy.write_text((OSU_DATA / "osu_latency.txt").read_text())
    corrected = ("results", "ingest", copy, "--format", "osu", "--hosts", "n3,n4", "--mpi-library", "MPICH 4.0.2",
                 "--site", "local", "--system", "local", "--db", url)
    code, out, err = commcamp(*corrected)
    assert code == 2 and "--hosts, --mpi-library: " in out + err and "--replace stores it in" in out + err, out + err
    # the very file again (its records, timestamps too, the same) described otherwise: refused alike
    same_file = ("results", "ingest", OSU_DATA / "osu_latency.txt", "--format", "osu", "--hosts", "n1,n2",
                 "--mpi-library", "Open MPI 4.1.4", "--site", "local", "--system", "local", "--db", url)
    code, out, err = commcamp(*same_file, "--environ", "other")
    assert code == 2 and "--environ: " in out + err and "with other values of these" in out + err, out + err
    # the advice works as said (it named --run-key alone, which then skipped the file as stored)
    assert "--run-key KEY --allow-duplicate as another run beside it" in " ".join((out + err).split()), out + err
    code, out, err = commcamp(*same_file, "--environ", "other", "--run-key", "other-env", "--allow-duplicate")
    assert code == 0 and "stored run 3 ('other-env'" in out, out + err
    code, out, err = commcamp(*corrected, "--replace")
    assert code == 0, out + err
    with open_store(url) as store:
        latency, runs = store.measurements(op="pingpong"), store.runs()
    assert set(latency.mpi_library) == {"MPICH 4.0.2", "Open MPI 4.1.4"} and len(runs) == 3


def test_ingest_refuses_unknown_format_and_missing_hosts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code, out, err = commcamp("results", "ingest", OSU_DATA / "osu_latency.txt", "--format", "osux",
                              "--site", "local", "--system", "local", "--db", url)
    assert code == 2 and "'osux' is not one of commbench, nccl-tests, nccl-tests-json, osu" in out + err
    code, out, err = commcamp("results", "ingest", OSU_DATA / "osu_latency.txt", "--format", "osu",
                              "--site", "local", "--system", "local", "--db", url)
    assert code == 2 and "OSU output names no hosts" in out + err
    with open_store(url) as store:
        assert store.runs() == []  # nothing half-stored


NT_DATA = Path(__file__).resolve().parent / "data" / "nt-outputs"  # real -J/-I outputs, see PROVENANCE.md


def test_nccl_tests_json_and_per_iteration_text_of_a_real_run() -> None:
    """nccl-tests 2.19.6 on an H100 (tests/data/nt-outputs/PROVENANCE.md): the JSON (devices under
    config) and the -I text table (four more columns per placement) give the same rows."""
    with_iters = nccl_tests.parse_json((NT_DATA / "all_reduce_perf-I.json").read_text())
    text = nccl_tests.parse_text((NT_DATA / "all_reduce_perf-I.txt").read_text())
    assert (with_iters.op, with_iters.hosts, with_iters.iters, len(with_iters.rows)) == ("allreduce", ["vm"], 20, 12)
    assert [r.size for r in text.rows] == [r.size for r in with_iters.rows]
    for from_json, from_text in zip(with_iters.rows, text.rows, strict=True):
        assert len(from_json.out_of_place.times_us) == 20
        assert from_text.in_place.time_us == pytest.approx(from_json.in_place.time_us, abs=0.01, rel=0.01)
        assert from_text.out_of_place.wrong == 0 == from_json.out_of_place.wrong
    records = foreign.parse("nccl-tests-json", (NT_DATA / "sendrecv_perf-I.json").read_text(), source="s.json",
                            timestamp=STAMP)
    for record in records:
        validate_record(record, "s.json")
        assert record["iters"] == 20 and record["op"] == "sendrecv" and "iterations_averaged" not in record["source"]
    plain = foreign.parse("nccl-tests-json", (NT_DATA / "all_reduce_perf.json").read_text(), source="a.json",
                          timestamp=STAMP)
    assert all(r["iters"] == 1 and r["source"]["iterations_averaged"] == 20 for r in plain)


def test_ingest_refuses_a_file_of_two_benchmark_runs(tmp_path: Path) -> None:
    """Two outputs in one file (osu_latency then osu_bw; all_reduce_perf then all_gather_perf) were stored
    under one benchmark: the bandwidth rows as pingpong latency, the all_reduce rows as allgather. Refused,
    naming the file and line where the second run begins; nothing stored."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    latency = (OSU_DATA / "osu_latency.txt").read_text()
    osu_two = tmp_path / "osu-two.txt"
    osu_two.write_text(latency + (OSU_DATA / "osu_bw.txt").read_text())
    second_osu = len(latency.splitlines()) + 1
    with pytest.raises(osu.OsuError, match=f"^{osu_two}:{second_osu}: a second OSU run "):
        osu.parse_text(osu_two.read_text(), str(osu_two))
    code, out, err = commcamp("results", "ingest", osu_two, "--format", "osu", "--hosts", "n1,n2",
                              "--site", "local", "--system", "local", "--db", url)
    assert code == 2 and f"{osu_two}:{second_osu}: a second OSU run ('MPI Bandwidth Test') after the rows of " \
                         "'MPI Latency Test'" in out + err, out + err

    all_reduce = (NT_OUTPUTS / "all_reduce.txt").read_text()
    nt_two = tmp_path / "nt-two.txt"
    nt_two.write_text(all_reduce + (NT_OUTPUTS / "all_gather.txt").read_text())
    second_nt = len(all_reduce.splitlines()) + 2  # "# Collective test starting: all_gather_perf"
    code, out, err = commcamp("results", "ingest", nt_two, "--format", "nccl-tests", "--site", "h200",
                              "--system", "h200", "--db", url)
    assert code == 2 and f"{nt_two}:{second_nt}: a second nccl-tests run (all_gather_perf) after the rows of " \
                         "allreduce" in out + err, out + err
    with open_store(url) as store:
        assert store.runs() == []


# --- what the reviewer found (2026-11-27): each test fails on the parsers before that day's fixes ---------------

ALL_REDUCE_PERF = (NT_DATA / "all_reduce_perf.txt").read_text()  # 1 rank, 12 sizes, iters 20, agg iters 1


def test_nccl_tests_in_place_wrong_elements_make_the_record_invalid(tmp_path: Path) -> None:
    """'#wrong' of the in-place result > 0 was stored as valid (only out-of-place was read): now the record
    is invalid with both placements' counts, and `results ingest` stores the run as failed."""
    first = ("           8             2     float     sum      -1     7.14    0.00    0.00       0     0.50    0.02"
             "    0.00       0")
    assert first in ALL_REDUCE_PERF
    text = ALL_REDUCE_PERF.replace(first, first[:-1] + "3")
    records = foreign.parse("nccl-tests", text, source="ar.txt", timestamp=STAMP)
    for record in records:
        validate_record(record, "ar.txt")
    assert (records[0]["valid"], records[0]["check"], records[0]["wrong_elements"]) == (False, True, 3)
    assert records[0]["source"]["wrong"] == {"out_of_place": 0, "in_place": 3} and records[0]["reason"] == "validation"
    assert all(r["valid"] and r["wrong_elements"] == 0 for r in records[1:])
    out_wrong = ALL_REDUCE_PERF.replace(first, first.replace("0.00       0     0.50", "0.00       5     0.50"))
    assert foreign.parse("nccl-tests", out_wrong, source="ar.txt", timestamp=STAMP)[0]["wrong_elements"] == 5
    source = tmp_path / "ar.txt"
    source.write_text(text)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code, out, err = commcamp("results", "ingest", source, "--format", "nccl-tests", "--site", "h200",
                              "--system", "h200", "--db", url)
    assert code == 0, out + err
    with open_store(url) as store:
        [run] = store.runs()
    assert (run.status, run.reason) == ("fail", "1 of 12 records not valid")


@pytest.mark.parametrize("cut", ["in-place-columns", "after-out-of-place", "after-a-row"])
def test_a_truncated_nccl_tests_output_is_refused(tmp_path: Path, cut: str) -> None:
    """A job killed mid-run left its output cut off: the last row without its in-place columns (it was read as
    in-place only) or the closing lines missing (read as complete). `results ingest` refuses it, as it refuses a
    commbench file with a truncated line (exit 2, nothing stored), naming the row or the missing lines. The
    reviewer's inputs: /tmp/rev8/in/ar_trunc.txt, ar_trunc2.txt."""
    lines = ALL_REDUCE_PERF.splitlines()
    last_row = max(i for i, line in enumerate(lines) if line.strip().startswith("33554432"))
    if cut != "after-a-row":  # 11 columns; 9, as an in-place-only table has
        kept, columns = {"in-place-columns": (-20, 11), "after-out-of-place": (-30, 9)}[cut]
        text = "\n".join(lines[:last_row] + [lines[last_row][:kept]]) + "\n"
        message = f":{last_row + 1}: an incomplete nccl-tests row ({columns} columns, not 13;"
        with pytest.raises(nccl_tests.NcclTestsError, match=re.escape(message)):
            nccl_tests.parse_text(text, "ar.txt")
    else:
        text = "\n".join(lines[:last_row + 1]) + "\n"
        message = "the output ends before nccl-tests' closing lines ('# Out of bounds values : N OK', '# Avg bus"
        assert not nccl_tests.parse_text(text).complete and nccl_tests.parse_text(ALL_REDUCE_PERF).complete
        with pytest.raises(nccl_tests.NcclTestsError, match=re.escape(message)):
            foreign.parse("nccl-tests", text, source="ar.txt", timestamp=STAMP)
    source = tmp_path / "ar.txt"
    source.write_text(text)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code, out, err = commcamp("results", "ingest", source, "--format", "nccl-tests", "--site", "h200",
                              "--system", "h200", "--db", url)
    assert code == 2 and message in " ".join((out + err).split()), out + err
    with open_store(url) as store:
        assert store.runs() == []


def test_nccl_tests_time_is_a_sample_of_iters_operations_and_metrics_are_the_schemas() -> None:
    """nccl-tests prints elapsed / (iters x agg iters) of operations launched back to back: the schema's batch
    (operations per sample), not a per-operation latency; 'batch 1' pooled it with commbench's per-op timing.
    Its stats and metrics are commbench's definitions (campaigns.model.records): median, p95 linearly
    interpolated, sample stdev, busbw factor (n-1)/n for gather/scatter as nccl-tests'."""
    from campaigns.model.records import busbw_factor, sample_stats

    records = foreign.parse("nccl-tests", ALL_REDUCE_PERF, source="ar.txt", timestamp=STAMP)
    assert {(r["batch"], r["iters"], r["source"]["iterations_averaged"]) for r in records} == {(20, 1, 20)}
    agg = ALL_REDUCE_PERF.replace("agg iters: 1 ", "agg iters: 4 ")
    assert foreign.parse("nccl-tests", agg, source="ar.txt", timestamp=STAMP)[0]["batch"] == 80
    with_iters = foreign.parse("nccl-tests-json", (NT_DATA / "all_reduce_perf-I.json").read_text(), source="a.json",
                               timestamp=STAMP)
    for record in with_iters:
        samples = sorted(record["samples_us"])
        assert record["batch"] == 1 and record["iters"] == 20
        assert record["latency_us"] == record["stats"]["median_us"] == (samples[9] + samples[10]) / 2
        assert record["stats"]["p95_us"] == pytest.approx(samples[18] + 0.05 * (samples[19] - samples[18]))
        assert record["stats"]["stdev_us"] == pytest.approx(float(np.std(samples, ddof=1)))
        assert record["stats"] == sample_stats(record["samples_us"])
        assert record["goodput_gbs"] == pytest.approx(record["bytes"] / record["latency_us"] / 1e3)
    assert sample_stats([4.0]) == {"min_us": 4.0, "median_us": 4.0, "mean_us": 4.0, "p95_us": 4.0, "max_us": 4.0,
                                   "stdev_us": 0.0}
    assert busbw_factor("gather", 4) == busbw_factor("scatter", 4) == 0.75 and busbw_factor("bcast", 4) == 1.0
    assert foreign.busbw_factor is busbw_factor  # one definition


def test_nccl_tests_json_records_are_stamped_when_the_run_started() -> None:
    """The JSON's start_time (the local time of the host that ran it), not the file's modification time."""
    [record, *_] = foreign.parse("nccl-tests-json", (NT_DATA / "all_reduce_perf.json").read_text(), source="a.json",
                                 timestamp=STAMP)
    started = datetime(2026, 11, 23, 14, 51, 36).astimezone()
    assert datetime.fromisoformat(record["timestamp"]) == started


@pytest.mark.parametrize("title", [
    "MPI Reduce Latency Test", "MPI Gather Latency Test", "MPI Scatter Latency Test", "MPI Barrier Latency Test",
    "MPI_Put Latency Test", "MPI All-to-Allv Personalized Exchange Latency Test", "MPI Allgatherv Latency Test",
    "MPI Multiple Bandwidth / Message Rate Test", "MPI Non-blocking Allreduce Latency Test",
    "MPI_Get Bandwidth Test", "MPI Multi-threaded Latency Test"])
def test_osu_benchmarks_commcamp_does_not_read_are_refused_by_name(tmp_path: Path, title: str) -> None:
    """The benchmark was picked by a word of the title: Reduce, Gather, Scatter, Barrier and MPI_Put latency
    were read as pingpong, All-to-Allv as alltoall, Allgatherv as allgather, Multiple Bandwidth as osu_bw.
    Exact titles now; any other is refused naming it (exit 2 from `results ingest`, nothing stored)."""
    text = f"# OSU {title} v7.0\n# Size       Avg Latency(us)\n4                       1.76\n"
    with pytest.raises(osu.OsuError, match=re.escape(f"{title!r} is not an OSU benchmark commcamp reads")):
        osu.parse_text(text)
    source = tmp_path / "osu.txt"
    source.write_text(text)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code, out, err = commcamp("results", "ingest", source, "--format", "osu", "--hosts", "n1,n2", "--site", "local",
                              "--system", "local", "--db", url)
    assert code == 2 and f"{title!r} is not an OSU benchmark commcamp reads" in " ".join((out + err).split())


@pytest.mark.parametrize("title, op, ccl", [
    ("MPI Latency Test", "pingpong", False), ("MPI-CUDA Latency Test", "pingpong", False),
    ("MPI-CUDA Bandwidth Test", "osu_bw", False), ("NCCL Allreduce Latency Test", "allreduce", True),
    ("MPI-ROCM All-to-All Personalized Exchange Latency Test", "alltoall", False),
    ("NCCL-CUDA Reduce_scatter Latency Test", "reduce_scatter", True), ("MPI Broadcast Latency Test", "bcast", False)])
def test_osu_titles_commcamp_reads(title: str, op: str, ccl: bool) -> None:
    run = osu.parse_text(f"# OSU {title} v7.4\n# Size       Avg Latency(us)\n8     1.5\n")
    assert (run.op, run.ccl) == (op, ccl)


def test_osu_columns_are_read_by_the_column_line() -> None:
    """OSU 7's -z tail latencies and -c validation were read by position (P50 as min, P90 as max, P99 as the
    iteration count) or refused ('Pass'); the non-blocking collectives' columns too (refused by title now)."""
    tail = ("# OSU MPI Allreduce Latency Test v7.4\n# Datatype: MPI_CHAR.\n"
            "# Size       Avg Latency(us)    P50 Tail Lat(us)    P90 Tail Lat(us)    P99 Tail Lat(us)\n"
            "4                       1.50                1.40                1.90                2.70\n")
    [row] = osu.parse_text(tail).rows
    assert (row.value, row.min_us, row.max_us, row.iterations) == (1.5, None, None, None)
    assert row.tail == (("p50", 1.4), ("p90", 1.9), ("p99", 2.7))
    [record] = foreign.osu_records(osu.parse_text(tail), hostnames=["a", "b"], timestamp=STAMP)
    assert record["source"]["tail"] == {"p50": 1.4, "p90": 1.9, "p99": 2.7} and "min_us" not in record["source"]
    validated = ("# OSU MPI Latency Test v7.3\n# Size          Latency (us)        Validation\n"
                 "1                       0.20              Pass\n2                       0.21              Fail\n")
    records = foreign.osu_records(osu.parse_text(validated), hostnames=["a", "b"], timestamp=STAMP)
    for record in records:
        validate_record(record, "lat.txt")
    assert [(r["valid"], r["check"]) for r in records] == [(True, True), (False, True)]
    full = (OSU_DATA / "osu_allreduce-full.txt").read_text()
    first = osu.parse_text(full).rows[0]
    assert (first.value, first.min_us, first.max_us, first.iterations, first.passed) == (0.33, 0.30, 0.35, 1000, None)
    with pytest.raises(osu.OsuError, match=r"osu:2: column 'Transmit Size' of .* is not one commcamp reads"):
        osu.parse_text("# OSU MPI Latency Test v7.4\n# Size  Latency (us)  Transmit Size\n1 0.2 1\n", "osu")
    with pytest.raises(osu.OsuError, match=r"osu:3: 2 values for the 3 columns"):
        osu.parse_text("# OSU MPI Latency Test v7.4\n# Size  Latency (us)  Validation\n1 0.2\n", "osu")


def test_osu_alltoall_and_allgather_sizes_are_the_schemas_bytes() -> None:
    """OSU's alltoall size is what a rank sends to each peer, allgather's what each rank contributes; the
    schema's bytes for both is a rank's whole receive buffer (commbench's, nccl-tests'): size x ranks, so that
    sizes, goodput and busbw line up with commbench's records."""
    hosts = ["n1", "n1", "n2", "n2"]
    for name, title in (("alltoall", "All-to-All Personalized Exchange Latency Test"),
                        ("allgather", "Allgather Latency Test")):
        text = f"# OSU MPI {title} v7.0\n# Size       Avg Latency(us)\n1024                    10.00\n"
        [record] = foreign.parse("osu", text, source=name, timestamp=STAMP, hostnames=hosts)
        validate_record(record, name)
        assert (record["op"], record["bytes"], record["source"]["osu_size"]) == (name, 4096, 1024)
        assert record["goodput_gbs"] == pytest.approx(4096 / 10.0 / 1e3)
        assert record["busbw_gbs"] == pytest.approx(record["goodput_gbs"] * 3 / 4)
    [allreduce] = foreign.parse("osu", (OSU_DATA / "osu_allreduce.txt").read_text(), source="a", timestamp=STAMP,
                                hostnames=hosts)[:1]
    assert allreduce["bytes"] == 4 and "osu_size" not in allreduce["source"]  # a buffer size: as it is


def test_osu_bibw_goodput_is_one_direction_as_the_schemas_bidirectional_ops() -> None:
    """osu_bibw prints the bandwidth of both directions together: its records stored that total as goodput and
    half the real time per message. As commbench's pingpong_bi (the record schema): goodput per direction,
    aggregate_gbs both (2x), direction bi, the time of one message each way (2 x size / bandwidth)."""
    records = {}
    for name in ("osu_bw", "osu_bibw", "osu_latency"):
        run = osu.parse_text((OSU_DATA / f"{name}.txt").read_text())
        records[name] = (run, foreign.osu_records(run, hostnames=["a", "b"], timestamp=STAMP))
    run, bibw = records["osu_bibw"]
    for row, record in zip(run.rows, bibw, strict=True):
        validate_record(record, "osu_bibw")
        assert record["direction"] == "bi"
        assert record["latency_us"] == pytest.approx(2 * row.size / row.value)
        assert record["goodput_gbs"] == pytest.approx(row.value / 2 / 1e3)
        assert record["aggregate_gbs"] == pytest.approx(row.value / 1e3)
        assert record["source"]["reported"] == {"bandwidth_mbs": row.value}
    run, bw = records["osu_bw"]
    assert {r["direction"] for r in bw} == {"uni"} and all("aggregate_gbs" not in r for r in bw)
    assert bw[-1]["goodput_gbs"] == pytest.approx(run.rows[-1].value / 1e3)
    assert {r["direction"] for r in records["osu_latency"][1]} == {"uni"}  # as commbench's pingpong


def test_nccl_tests_options_that_change_what_a_time_is() -> None:
    """nccl-tests options a review found read wrong (src/common.cu, src/util.cu of 2.19): -C 1 prints CPU times taken
    before the operations complete (stored as the operation's time: 2.1 us, 15978 GB/s); -K N leaves the first N
    iterations out of nccl-tests' own statistics (they were the samples' median); -S 1 ends each row with a
    timestamp (refused as a cut-off row); -G N runs the captured iterations N times; -a says how the ranks' times
    make one (the record said "mean" whatever it was)."""
    header = "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time "
    assert header in ALL_REDUCE_PERF
    cputime = ALL_REDUCE_PERF.replace(header, header.replace(" time ", " cputime "))
    with pytest.raises(nccl_tests.NcclTestsError, match=r"ar.txt:\d+: the times are CPU times \(-C 1"):
        foreign.parse("nccl-tests", cputime, source="ar.txt", timestamp=STAMP)
    # -S 1: the header's timestamp column, each row's date and time
    rows = [line for line in ALL_REDUCE_PERF.splitlines() if line.strip()[:1].isdigit()]
    stamped = ALL_REDUCE_PERF.replace(header.rstrip(), header.rstrip() + "  timestamp")
    for row in rows:
        stamped = stamped.replace(row, row.rstrip() + "  2026-11-28 14:02:03")
    plain = foreign.parse("nccl-tests", ALL_REDUCE_PERF, source="ar.txt", timestamp=STAMP)
    assert foreign.parse("nccl-tests", stamped, source="ar.txt", timestamp=STAMP) == plain
    graph = ALL_REDUCE_PERF.replace("graph: 0 ", "graph: 4 ")
    assert {r["batch"] for r in foreign.parse("nccl-tests", graph, source="ar.txt", timestamp=STAMP)} == {80}
    document = json.loads((NT_DATA / "all_reduce_perf-I.json").read_text())
    first = document["results"][0]["out_of_place_per_iter"]
    first["skipped_iterations"], first["times_us"][:12] = 12, [1000.0] * 12
    document["args"] += ["-a", "3"]
    records = foreign.parse("nccl-tests-json", json.dumps(document), source="a.json", timestamp=STAMP)
    assert records[0]["iters"] == 8 and max(records[0]["samples_us"]) < 1000
    assert records[0]["samples_us"] == first["times_us"][12:]
    del document["results"][0]["out_of_place_per_iter"]
    records = foreign.parse("nccl-tests-json", json.dumps(document), source="a.json", timestamp=STAMP)
    assert records[0]["source"]["time_over_ranks"] == "max" and records[1]["iters"] == 20
    document["results"][0]["out_of_place"]["cpu_time"] = document["results"][0]["out_of_place"].pop("time")
    with pytest.raises(nccl_tests.NcclTestsError, match=r"a.json: results\[0\]: the times are CPU times"):
        foreign.parse("nccl-tests-json", json.dumps(document), source="a.json", timestamp=STAMP)


def test_foreign_records_say_backend_library_version_datatype_and_knobs() -> None:
    """What tells foreign runs apart in the store and the report (a review found them pooled): rccl-tests' records
    are of the hip backend and carry RCCL's version, nccl-tests' NCCL's; OSU's backend is where its title says the
    buffers are, its datatype line is each row's; the knobs the job ran with are the record's env."""
    rccl = ALL_REDUCE_PERF.replace("# nccl-tests version 2.19.6 nccl-headers=22803 nccl-library=22803",
                                   "# rccl-tests version 2.17.9-develop:4a65e8d rccl-headers=22707 rccl-library=22707")
    [first, *_] = foreign.parse("nccl-tests", rccl, source="ar.txt", timestamp=STAMP, env={"NCCL_ALGO": "Ring",
                                                                                            "PATH": "/usr/bin"})
    assert (first["backend"], first["versions"], first["source"]["version"]) == ("hip", {"rccl": "2.27.7"},
                                                                                  "2.17.9-develop:4a65e8d")
    assert first["env"] == {"NCCL_ALGO": "Ring"}
    [first, *_] = foreign.parse("nccl-tests", ALL_REDUCE_PERF, source="ar.txt", timestamp=STAMP)
    assert (first["backend"], first["versions"], first["env"]) == ("cuda", {"nccl": "2.28.3"}, {})
    document = json.loads((NT_DATA / "all_reduce_perf-I.json").read_text())
    document["env"] = ["NCCL_PROTO=Simple", "HOME=/root", "NCCL_DEBUG_FILE=x=y", "OMPI_COMM_WORLD_RANK=0",
                       "OMPI_MCA_ess_base_jobid=7"]
    [first, *_] = foreign.parse("nccl-tests-json", json.dumps(document), source="a.json", timestamp=STAMP)
    assert first["env"] == {"NCCL_DEBUG_FILE": "x=y", "NCCL_PROTO": "Simple"}  # not a launcher's per-job ones
    # commbench's own records keep the same variables: one list in C, one here, held equal
    record_c = (REPO / "bench_src" / "src" / "record.c").read_text()
    for name, python in (("env_prefixes", foreign.ENV_PREFIXES), ("env_launcher_prefixes",
                                                                   foreign.ENV_LAUNCHER_PREFIXES)):
        array = re.search(rf"{name}\[\] = \{{(.*?)\}};", record_c, re.S)
        assert array is not None and tuple(re.findall(r'"([^"]+)"', array.group(1))) == python, name
    latency = (OSU_DATA / "osu_latency.txt").read_text()
    for title, backend in (("# OSU MPI Latency Test", "cpu"), ("# OSU MPI-CUDA Latency Test", "cuda"),
                           ("# OSU MPI-ROCM Latency Test", "hip"), ("# OSU RCCL Latency Test", "hip"),
                           ("# OSU NCCL Latency Test", "cuda")):
        typed = latency.replace("# OSU MPI Latency Test", title).replace("# Size", "# Datatype: MPI_CHAR.\n# Size")
        records = foreign.parse("osu", typed, source="l.txt", timestamp=STAMP, hostnames=["n1", "n2"])
        assert {(r["backend"], r["dtype"]) for r in records} == {(backend, "MPI_CHAR")}, title
    with pytest.raises(osu.OsuError, match="buffers on 'hccl', no backend of commbench's"):
        foreign.parse("osu", latency.replace("# OSU MPI Latency", "# OSU HCCL Latency"), source="l.txt",
                      timestamp=STAMP, hostnames=["n1", "n2"])


def test_nccl_tests_benchmarks_whose_size_is_not_their_bytes_are_refused_by_name() -> None:
    """hypercube_perf's bandwidth counts size x (n-1)/n bytes (stored busbw 10.49 GB/s where nccl-tests printed
    5.24), alltoallv_perf's the busiest rank's share of its pattern."""
    for name in ("hypercube", "alltoallv"):
        text = ALL_REDUCE_PERF.replace("all_reduce_perf", f"{name}_perf")
        with pytest.raises(nccl_tests.NcclTestsError, match=f"commcamp does not read {name}_perf"):
            foreign.parse("nccl-tests", text, source="x.txt", timestamp=STAMP)
        foreign.check_filter_names(op=name)  # what an older commcamp stored stays selectable (`results list --op`)
