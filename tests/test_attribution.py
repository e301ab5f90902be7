"""Per-rank attribution: commbench's schema 2 fields (a real 3-rank run) and campaigns.kinds.attribution's
suspect rule on runs recorded on the local cluster with one node's link throttled
(tests/data/attribution/PROVENANCE.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_bench import CommbenchBuild, run_commbench

from campaigns.kinds.attribution import rank_suspects
from campaigns.model.records import validate_record

DATA = Path(__file__).resolve().parent / "data" / "attribution"
LARGE = 1 << 20


def _load(name: str, size: int | None = None) -> list[dict]:
    records = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if size is None or abs(r["bytes"] - size) < 8]


def test_commbench_records_every_ranks_share(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    done = run_commbench(commbench_builds["openmpi"], 3, ["--op", "sendrecv", "--transport", "mpi", "--sizes", "8,64K",
                                                          "--iters", "12", "--warmup", "1", "--output", str(out)])
    assert done.returncode == 0, done.stderr
    for number, line in enumerate(out.read_text().splitlines(), 1):
        record = validate_record(json.loads(line), f"r.jsonl:{number}")
        assert record["schema_version"] == 2
        assert len(record["slowest_rank"]) == record["iters"] == 12 and len(record["per_rank"]["median_us"]) == 3
        # the recorded sample is the slowest rank's own time: at least every rank's median
        assert record["stats"]["median_us"] >= min(record["per_rank"]["median_us"])
        assert sum(record["per_rank"]["slowest_iterations"]) == 12
        assert all(excess >= 0 for excess in record["slowest_excess_us"])


@pytest.mark.parametrize("night, baseline", [("throttled-c6n3", "clean"), ("throttled2-c6n3", "clean2"),
                                             ("throttled2-c6n3", "clean"), ("throttled-c6n3", "clean2")])
def test_the_throttled_node_is_named_from_one_sendrecv_run(night: str, baseline: str) -> None:
    suspects = rank_suspects(_load(f"{night}-sendrecv", LARGE), _load(f"{baseline}-sendrecv", LARGE))
    assert suspects.clear and suspects.top == "c6n3", suspects.reason


@pytest.mark.parametrize("op", ["alltoall", "allreduce", "sendrecv"])
def test_two_clean_nights_name_nobody(op: str) -> None:
    for size in (65536, LARGE):
        suspects = rank_suspects(_load(f"clean2-{op}", size), _load(f"clean-{op}", size))
        assert not suspects.leaders and suspects.top is None, suspects.reason


def _night(hosts: list[str], medians: list[float]) -> list[dict]:
    return [{"kind": "result", "op": "sendrecv", "transport": "mpi", "bytes": LARGE, "hostnames": hosts,
             "per_rank": {"median_us": medians}}]


def test_both_ends_of_a_slow_link_are_suspects_most_grown_first() -> None:
    """The growths a fresh-clone CI run printed (c9n3's veth throttled): its sender c9n2 waited x18.29,
    the receiver c9n3 x24.98, c9n1 x1.19. Neither end leads by 2x; both stand out from c9n1."""
    hosts = ["c9n1", "c9n2", "c9n3"]
    suspects = rank_suspects(_night(hosts, [1190.0, 18290.0, 24980.0]), _night(hosts, [1000.0] * 3))
    assert suspects.leaders == ["c9n3", "c9n2"] and not suspects.clear and suspects.top is None
    assert "c9n3 and c9n2's ranks slowed down" in suspects.reason
    # three nodes slowed alike: no leaders; one node slowed: it alone
    assert not rank_suspects(_night(hosts, [12000.0, 18290.0, 24980.0]), _night(hosts, [1000.0] * 3)).leaders
    assert rank_suspects(_night(hosts, [1190.0, 1500.0, 24980.0]), _night(hosts, [1000.0] * 3)).leaders == ["c9n3"]


def test_a_synchronised_collective_is_ambiguous_not_wrong() -> None:
    """allreduce: every rank waits for the slow one, so the growth spreads over all nodes."""
    for night, baseline in (("throttled-c6n3", "clean"), ("throttled2-c6n3", "clean2")):
        suspects = rank_suspects(_load(f"{night}-allreduce", LARGE), _load(f"{baseline}-allreduce", LARGE))
        assert not suspects.leaders and "ambiguous" in suspects.reason


def test_without_a_baseline_nothing_is_claimed() -> None:
    suspects = rank_suspects(_load("throttled-c6n3-sendrecv"), [])
    assert not suspects.clear and "baseline" in suspects.reason
