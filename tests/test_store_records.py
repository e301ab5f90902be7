"""campaigns.model.records: every line of a commbench JSON Lines file checked against the record schema."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures_store import commbench_record, error_record, write_jsonl

from campaigns.model.records import RecordError, load_records


def test_valid_file_loads_every_record(tmp_path: Path) -> None:
    records = [commbench_record(size=size, seed=size) for size in (8, 1024, 1 << 20)] + [error_record()]
    assert load_records(write_jsonl(tmp_path / "out.jsonl", records)) == records


def test_empty_file_gives_no_records(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert load_records(empty) == []


def test_missing_file_is_a_record_error(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"missing\.jsonl: cannot read"):
        load_records(tmp_path / "missing.jsonl")


def test_truncated_last_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "out.jsonl", [commbench_record(), commbench_record(seed=1)])
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # a writer killed mid-line
    with pytest.raises(RecordError, match=r"out\.jsonl:2: not a complete JSON object") as caught:
        load_records(path)
    assert caught.value.where == f"{path}:2"


def test_non_json_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(commbench_record()) + "\nSegmentation fault (core dumped)\n")
    with pytest.raises(RecordError, match=r"out\.jsonl:2: not a complete JSON object"):
        load_records(path)


def _bad_record(**change: Any) -> dict[str, Any]:
    record = commbench_record()
    record.update(change)
    return record


def _without(name: str) -> dict[str, Any]:
    record = commbench_record()
    del record[name]
    return record


def _negative_extra_sample() -> dict[str, Any]:
    record = commbench_record(iters=4)
    record["samples_us"].append(-3.0)
    return record


def _short_stats() -> dict[str, Any]:
    record = commbench_record()
    del record["stats"]["p95_us"]
    return record


@pytest.mark.parametrize(("record", "field", "message"), [
    (_bad_record(bytes="1024"), "bytes", "is not of type 'integer'"),
    (_bad_record(valid="yes"), "valid", "is not of type 'boolean'"),
    (_bad_record(kind="warning"), "kind", "is not one of"),
    (_bad_record(schema_version=3), "schema_version", "is not one of"),
    (_bad_record(slowest_rank=[0, 1]), "slowest_rank", "2 entries for 8 iterations"),
    (_bad_record(slowest_rank=[5] * 8), "slowest_rank", "rank 5 of 4 ranks"),
    (_bad_record(per_rank={"median_us": [1.0], "p95_us": [1.0], "slowest_iterations": [8]}), "per_rank.median_us",
     "1 entries for 4 ranks"),
    (_without("samples_us"), "samples_us", "is a required property"),
    (_without("hostnames"), "hostnames", "is a required property"),
    (_short_stats(), "stats.p95_us", "is a required property"),
    (_negative_extra_sample(), "samples_us[4]", "not a finite number >= 0"),
    (_bad_record(samples_us=[1.0, 2.0, True, 4.0, 5.0, 6.0, 7.0, 8.0]), "samples_us[2]", "is not a number"),
    (_bad_record(samples_us=[1.0, "2"] + [3.0] * 6), "samples_us[1]", "is not a number"),
    (_bad_record(samples_us=[1.0] * 9), "samples_us", "9 samples for 8 iterations"),
    (_bad_record(hostnames=["n1"]), "hostnames", "1 hostnames for 4 ranks"),
    (_bad_record(timestamp="yesterday"), "timestamp", "not an ISO 8601 date-time"),
    (_bad_record(timestamp="2026-03-01T12:00:00"), "timestamp", "has no UTC offset"),
    (_bad_record(bytes=2**64), "bytes", "does not fit a 64-bit integer"),
    (_bad_record(gpu_sharing={"max_ranks_per_gpu": 5, "mps": None}), "gpu_sharing.max_ranks_per_gpu",
     "5 ranks on one GPU in a run of 4 ranks"),
    (_bad_record(gpu_sharing={"max_ranks_per_gpu": 2, "mps": "on"}), "gpu_sharing.mps", "is not of type"),
    (_bad_record(gpu_sharing={"max_ranks_per_gpu": 2}), "gpu_sharing.mps", "is a required property"),
    (error_record(valid=True), "valid", "was expected"),
    # commbench counts a node per distinct host name (src/comm.c); wrong data is never valid
    (_bad_record(hostnames=["n1", "n2", "n3", "n3"]), "nodes", "2 nodes for 3 distinct hostnames"),
    (_bad_record(nodes=1), "nodes", "1 nodes for 2 distinct hostnames"),
    (_bad_record(wrong_elements=3), "valid", "true with 3 wrong elements"),
    (error_record(reason="bogus"), "reason", "is not one of"),
    # numbers a record derives from its samples, forged (stored and reported as measured before)
    (_bad_record(goodput_gbs=999.0), "goodput_gbs", "where bytes / median time give"),
    (_bad_record(latency_us=100.0), "latency_us", "is not the median sample"),
    (_bad_record(stats={**commbench_record()["stats"], "median_us": 0.5 + commbench_record()["stats"]["min_us"]}),
     "stats.median_us", "where the samples give"),
    (_bad_record(busbw_gbs=5.0), "busbw_gbs", "where bytes / median time x the op's factor give"),
    (_bad_record(busbw_factor=100.0), "busbw_factor", "where allreduce on 4 ranks has 1.5"),
    (_bad_record(op="pingpong_bi", direction="bi", busbw_factor=1.0, busbw_gbs=commbench_record()["algbw_gbs"],
                 aggregate_gbs=100.0), "aggregate_gbs",
     "where both directions give"),
    (_bad_record(timestamp="2099-01-01T00:00:00Z"), "timestamp", "lies in the future"),
])
def test_schema_violation_names_line_and_field(tmp_path: Path, record: dict[str, Any], field: str,
                                               message: str) -> None:
    path = write_jsonl(tmp_path / "out.jsonl", [commbench_record(seed=1), record, commbench_record(seed=2)])
    with pytest.raises(RecordError) as caught:
        load_records(path)
    assert caught.value.where == f"{path}:2"
    assert caught.value.field == field
    assert message in str(caught.value)


def test_non_standard_json_constants_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(commbench_record()).replace('"latency_us": ', '"latency_us": NaN, "x": ', 1) + "\n")
    with pytest.raises(RecordError, match=r"out\.jsonl:1: .*NaN is not valid JSON"):
        load_records(path)


def test_infinite_sample_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    line = json.dumps(commbench_record(iters=2, samples_us=[1.0, 2.0]))
    path.write_text(line.replace('"samples_us": [1.0, 2.0]', '"samples_us": [1.0, 1e999]') + "\n")
    with pytest.raises(RecordError) as caught:
        load_records(path)
    assert caught.value.field == "samples_us[1]"


def test_blank_lines_are_skipped_and_line_numbers_kept(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(commbench_record()) + "\n\n" + json.dumps(_bad_record(op="All Reduce")) + "\n")
    with pytest.raises(RecordError, match=r"out\.jsonl:3: op: 'All Reduce' does not match"):
        load_records(path)
