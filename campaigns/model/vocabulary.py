"""commbench's vocabulary (bench_src/schema/vocabulary.json): ops, transports and metric definitions, and
the reference checks (nccl-tests, OSU): their benchmarks and the metrics each reports.

The one home of these facts for everything in Python: the ReFrame checks (reframe_checks/lib), campaigns,
health and the tuner. tests/test_vocabulary.py holds commbench's C tables (`commbench --list`) to the same
file, so a metric such as small_latency is the same number in a ReFrame perflog and in a health verdict by
construction. Standard library only (the checks import it inside ReFrame).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from campaigns.paths import VOCABULARY as VOCABULARY_PATH


@dataclass(frozen=True)
class Metric:
    name: str
    field: str  # the record field it is read from
    at: str  # "smallest_moving" (smallest size with bytes > 0, else the smallest) or "largest"
    unit: str
    higher_is_better: bool


def _load() -> dict[str, Any]:
    try:
        return json.loads(VOCABULARY_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot load commbench's vocabulary {VOCABULARY_PATH}: {exc}") from exc


_DOCUMENT = _load()
OPS: tuple[str, ...] = tuple(_DOCUMENT["ops"])
TRANSPORTS: tuple[str, ...] = tuple(_DOCUMENT["transports"])
TRANSPORT_OPS: dict[str, tuple[str, ...]] = {name: tuple(t["ops"]) for name, t in _DOCUMENT["transports"].items()}
TRANSPORT_BACKENDS: dict[str, tuple[str, ...]] = {name: tuple(t["backends"])
                                                  for name, t in _DOCUMENT["transports"].items()}
SINGLE_NODE_TRANSPORTS = tuple(name for name, t in _DOCUMENT["transports"].items() if t["single_node"])
PEER_TRANSPORTS = tuple(name for name, ops in TRANSPORT_OPS.items() if "pingpong" in ops)
PAIR_OPS = tuple(name for name, op in _DOCUMENT["ops"].items() if op["pair"])  # rank 0 and one peer: 2 ranks
P2P_OPS = tuple(name for name, op in _DOCUMENT["ops"].items() if op["kind"] == "p2p")
COLLECTIVE_OPS = tuple(name for name, op in _DOCUMENT["ops"].items() if op["kind"] == "collective")
MATRIX_OPS = tuple(name for name, op in _DOCUMENT["ops"].items() if op["kind"] == "matrix")  # a record per pair
COPY_OPS = tuple(name for name, op in _DOCUMENT["ops"].items() if op["kind"] == "copy")
METRICS: dict[str, Metric] = {name: Metric(name, m["field"], m["at"], m["unit"], m["higher_is_better"])
                              for name, m in _DOCUMENT["metrics"].items()}
# What commbench's sweeps report (commbench_run, the suite's sweeps); pair matrix and copies have their own.
SWEEP_METRICS: tuple[str, ...] = tuple(_DOCUMENT["sweep_metrics"])


@dataclass(frozen=True)
class ReferenceCheck:
    """A ReFrame check of reframe_checks/reference_benchmarks.py: a third-party benchmark the site provides."""

    name: str  # the check (nccl_tests_run, osu_run)
    suite: str  # its site.yaml reference_benchmarks key and ReFrame feature
    transport: str  # what its records say moved the data
    benchmarks: dict[str, tuple[str, ...]]  # its `benchmark` parameter's values -> the metrics each reports
    pair: tuple[str, ...]  # benchmarks of rank 0 and one peer: 2 ranks, so on 1 or 2 nodes only


# The reference checks' ReFrame parameter that names the benchmark (commbench_run's is `op`).
BENCHMARK_PARAMETER = "benchmark"
REFERENCE_CHECKS: dict[str, ReferenceCheck] = {
    name: ReferenceCheck(name, c["suite"], c["transport"],
                         {bench: tuple(b["metrics"]) for bench, b in c["benchmarks"].items()},
                         tuple(bench for bench, b in c["benchmarks"].items() if b.get("pair")))
    for name, c in _DOCUMENT["reference_checks"].items()}
BENCHMARK_METRICS: dict[str, tuple[str, ...]] = {bench: metrics for check in REFERENCE_CHECKS.values()
                                                 for bench, metrics in check.benchmarks.items()}


def reported_metrics(check: str, op: str) -> tuple[str, ...]:
    """The metrics a run of `check` reports for `op` (a reference check's: its benchmark): a reference
    benchmark's own, else commbench's sweep metrics."""
    return REFERENCE_CHECKS[check].benchmarks.get(op, ()) if check in REFERENCE_CHECKS else SWEEP_METRICS


def op_kind(op: str) -> str:
    """'p2p', 'collective', 'matrix' or 'copy'."""
    return _DOCUMENT["ops"][op]["kind"]


def metric_size(metric: str, sizes: Iterable[int]) -> int | None:
    """The message size `metric` is taken at among the sizes a run measured (None if it measured none)."""
    measured = set(sizes)
    if not measured:
        return None
    if METRICS[metric].at == "largest":
        return max(measured)
    return min({size for size in measured if size > 0} or measured)


def metric_value(metric: str, records: Iterable[Mapping[str, Any]]) -> tuple[float, int] | None:
    """(value, size) of `metric` from one run's valid result records of one op, or None."""
    results = [r for r in records if r.get("kind", "result") == "result" and r.get("valid", True)]
    size = metric_size(metric, (int(r["bytes"]) for r in results))
    field = METRICS[metric].field
    for record in results:
        if record["bytes"] == size and record.get(field) is not None:
            return float(record[field]), size
    return None


def reference_matches(reference: Mapping[str, Any], metric: str, case: Mapping[str, Any]) -> bool:
    """Whether a site reference (site.yaml, as a mapping) applies to `metric` of a test case: its metric
    is `metric` and every key it sets (op, bytes, nodes, ranks, environ, transport, benchmark, ...) equals
    the case's; a key the reference leaves out or sets to null matches anything. The one matching rule of
    the ReFrame checks and of health."""
    if reference.get("metric") != metric:
        return False
    return all(reference.get(key) in (None, value) for key, value in case.items())
