"""commbench's vocabulary (bench_src/schema/vocabulary.json): ops, transports and metric definitions.

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
