"""The vocabulary contract (bench_src/schema/vocabulary.json through campaigns/model/vocabulary.py): commbench's
C tables agree with it, and a metric is one number wherever it is taken (ReFrame's perflog, health)."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pandas
import pytest
from fixtures_bench import CommbenchBuild, run_commbench

from campaigns.kinds import health
from campaigns.model import site, vocabulary

REPO = Path(__file__).resolve().parents[1]
BUILDS = REPO / "build" / "bench"


def _listed(binary: Path) -> tuple[str, dict[str, set[str]]]:
    text = subprocess.run([str(binary), "--list"], capture_output=True, text=True, check=True, timeout=30).stdout
    backend = re.search(r"^backend (\S+)", text, re.MULTILINE)
    assert backend, text
    return backend.group(1), {m["name"]: set(m["ops"].split(","))
                              for m in re.finditer(r"^transport (?P<name>\S+) ops (?P<ops>\S+)", text, re.MULTILINE)}


def test_commbench_tables_match_the_vocabulary() -> None:
    """Every backend built here (cpu always; cuda/hip when tests/test_commbench_gpu_build.py built them):
    the transports it lists are exactly the vocabulary's for that backend, each with the same ops."""
    binaries = sorted(p for p in BUILDS.glob("*/commbench") if p.is_file() and os.access(p, os.X_OK))
    assert any("cpu" in p.parent.name for p in binaries), f"no CPU build under {BUILDS} (make bench)"
    for binary in binaries:
        backend, transports = _listed(binary)
        expected = {name for name, backends in vocabulary.TRANSPORT_BACKENDS.items() if backend in backends}
        assert set(transports) == expected, binary
        for name, ops in transports.items():
            assert ops == set(vocabulary.TRANSPORT_OPS[name]), (binary, name)
            assert ops <= set(vocabulary.OPS)


def test_campaigns_use_the_vocabulary() -> None:
    assert set(site.TRANSPORTS) == set(vocabulary.TRANSPORTS)
    assert set(site.ALL_OPS) == set(vocabulary.OPS)
    assert set(site.COMMBENCH_METRICS) == set(vocabulary.SWEEP_METRICS) <= set(vocabulary.METRICS)


# Sweep ops (vocabulary kind p2p or collective) a campaign may not ask commbench_run for, each with why. Empty:
# campaigns offer every one (pairmatrix and the copies have their own checks and metrics: Reference._bounded).
NOT_CAMPAIGN_OPS: dict[str, str] = {}


def test_every_sweep_op_is_a_campaign_op() -> None:
    """An op added to the vocabulary (kind p2p or collective) is one campaigns can run: in COMMBENCH_OPS
    (campaigns/model/site.py: what a spec's `ops` accepts), which tests/test_reframe_checks.py holds equal to
    CAMPAIGN_OPS (reframe_checks/lib/commbench_tests.py: commbench_run's `op` parameter), unless NOT_CAMPAIGN_OPS
    says why not. Left out of both, nothing failed: campaigns silently could not run the new op."""
    sweep_ops = [op for op in vocabulary.OPS if vocabulary.op_kind(op) in ("p2p", "collective")]
    missing = [op for op in sweep_ops if op not in site.COMMBENCH_OPS and op not in NOT_CAMPAIGN_OPS]
    assert not missing, (f"{missing}: add to COMMBENCH_OPS (campaigns/model/site.py) and CAMPAIGN_OPS "
                         "(reframe_checks/lib/commbench_tests.py), or to NOT_CAMPAIGN_OPS here with the reason")
    assert not set(NOT_CAMPAIGN_OPS) & set(site.COMMBENCH_OPS)
    assert set(NOT_CAMPAIGN_OPS) <= set(sweep_ops)
    assert set(site.COMMBENCH_OPS) <= set(vocabulary.OPS)


def test_small_latency_is_one_number_for_reframe_and_health(commbench_builds: dict[str, CommbenchBuild],
                                                             tmp_path: Path) -> None:
    """A real 3-rank alltoall whose smallest size moves nothing per rank (8 B / 3 ranks of 4-byte floats:
    commbench reports bytes=0 there)."""
    out = tmp_path / "a.jsonl"
    done = run_commbench(commbench_builds["openmpi"], 3, ["--op", "alltoall", "--transport", "mpi", "--sizes",
                                                          "8,64,4K", "--iters", "20", "--warmup", "2", "--output",
                                                          str(out)])
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert min(r["bytes"] for r in records) == 0, [r["bytes"] for r in records]  # the case this guards
    value, size = vocabulary.metric_value("small_latency", records)
    assert size > 0 and value == next(r["latency_us"] for r in records if r["bytes"] == size)
    health_values = health.run_metrics(pandas.DataFrame(records))
    assert health_values[("small_latency", size)] == value
    assert ("small_latency", 0) not in health_values


@pytest.mark.parametrize("case, matches", [
    ({"op": "allreduce", "bytes": 8, "nodes": 2, "ranks": 2, "environ": "openmpi", "transport": "mpi"}, True),
    ({"op": "allreduce", "bytes": 8, "nodes": 4, "ranks": 4, "environ": "openmpi", "transport": "mpi"}, False),
    ({"op": "allreduce", "bytes": 16, "nodes": 2, "ranks": 2, "environ": "openmpi", "transport": "mpi"}, False),
    ({"op": "alltoall", "bytes": 8, "nodes": 2, "ranks": 2, "environ": "mpich", "transport": "mpi"}, False)])
def test_one_reference_rule_for_checks_and_health(case: dict, matches: bool) -> None:
    reference = site.Reference(op="allreduce", metric="small_latency", bytes=8, nodes=2, value=10.0, upper=0.5)
    assert vocabulary.reference_matches(reference.model_dump(), "small_latency", case) is matches
    assert not vocabulary.reference_matches(reference.model_dump(), "large_busbw", case)

    class Case:
        check = "commbench_run"
        op, num_nodes, num_tasks, environ, transport = (case["op"], case["nodes"], case["ranks"], case["environ"],
                                                        case["transport"])
    assert (health.find_reference([reference], Case, "small_latency", case["bytes"]) is reference) is matches


@pytest.mark.parametrize("output, benchmark, expected", [
    ("osu_latency.txt", "osu_latency", {("small_latency", 1): 47.46}),
    ("osu_bw.txt", "osu_bw", {("large_bandwidth", 65536): 97.25 / 1000}),  # MB/s -> GB/s
    ("osu_allreduce.txt", "osu_allreduce", {("small_latency", 4): 0.31, ("large_latency", 65536): 25.69})])
def test_reference_benchmark_metrics_are_the_vocabularys(output: str, benchmark: str, expected: dict) -> None:
    """A reference check's metrics are taken from the records it writes (campaigns.formats.foreign) by the
    vocabulary's definitions, as commbench's are: what its perflog says (reframe_checks/reference_benchmarks.py:
    sweep_metric) is what health and the report judge, and only the metrics its benchmark reports."""
    from datetime import datetime, timezone

    from campaigns.formats import foreign

    records = foreign.parse("osu", (REPO / "tests" / "data" / "osu" / output).read_text(), source=benchmark,
                            timestamp=datetime.now(timezone.utc), hostnames=["n1", "n2"])
    taken = health.run_metrics(pandas.DataFrame(records), vocabulary.reported_metrics("osu_run", benchmark))
    assert taken == pytest.approx(expected)
    assert set(vocabulary.BENCHMARK_METRICS[benchmark]) <= set(vocabulary.METRICS)
