"""campaigns.formats: one parser per foreign format, tested on real outputs, and `results ingest --format`.

Test data: nccl-tests 2.19.6 text printed on 4x H200 (results/reference/h200x4/run1/nt-outputs/, committed
with its provenance) and OSU 7.0 outputs printed here (tests/data/osu/PROVENANCE.md).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

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
    assert (record["busbw_gbs"], record["latency_us"]) == (83.87, 18.75)
    [plain] = foreign.parse("nccl-tests-json", _nccl_tests_json(per_iter=False), source="t.json", timestamp=STAMP)
    assert plain["samples_us"] == [18.75] and plain["source"]["iterations_averaged"] == 3
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
    if quantity == "bandwidth":  # MB/s (10^6 B/s) -> time per message and GB/s
        first = run.rows[-1]
        assert records[-1]["goodput_gbs"] == pytest.approx(first.value / 1e3)
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
    nt = frame[frame.op == "sendrecv"]
    assert len(nt) == 30 and set(nt.transport) == {"ccl"} and set(nt.commbench_version) == {"none"}
    assert nt[nt.bytes == 8].latency_us.item() == 12.59
    latency = frame[frame.op == "pingpong"]
    assert latency[latency.bytes == 1].latency_us.item() == 47.46 and set(latency.transport) == {"mpi"}
    code, out, err = commcamp("results", "export", "--db", url, "--op", "pingpong", "--format", "csv",
                              "-o", tmp_path / "x.csv")
    assert code == 0, out + err


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
