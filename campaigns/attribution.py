"""Who made a run slow, from the run itself (commbench schema 2's per-rank attribution).

commbench records each rank's own per-iteration times, summarised per rank (`per_rank.median_us`), and
each rank's host (`hostnames`). A node whose link or host degrades makes its own ranks slower than they
were; but ranks differ by role too (an algorithm gives some ranks more steps: on the local cluster's clean
runs one node's ranks held 76-100 % of the slowest-rank time, night after night), so a run is compared
with a healthy run of the same series (same op, size, ranks and nodes, its baseline): per node, the growth
of its ranks' median time over the baseline's. The node whose growth stands out (>= LEAD times every
other node's) is the suspect; otherwise the run says 'ambiguous' and health falls back to bisection. In a
synchronised collective every rank waits for the slow one, so growth spreads over all nodes and the answer
is usually 'ambiguous' there; point-to-point exchanges (sendrecv, pingpong) name the node.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The suspect's growth must be at least LEAD times the next node's (tests/test_attribution.py: runs with
# one node's link throttled vs clean runs, recorded on the local cluster).
LEAD = 2.0


@dataclass(frozen=True)
class NodeGrowth:
    node: str
    growth: float  # median over (record, rank on this node) of tonight's median_us / the baseline's


@dataclass(frozen=True)
class Suspects:
    ranked: list[NodeGrowth]  # most suspect first
    clear: bool
    reason: str

    @property
    def top(self) -> str | None:
        return self.ranked[0].node if self.clear else None


def _key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return (record["op"], record["transport"], record["bytes"], record.get("direction"), tuple(record["hostnames"]))


def _per_rank(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], list[float]]:
    return {_key(r): r["per_rank"]["median_us"] for r in records
            if r.get("kind") == "result" and r.get("valid", True) and "per_rank" in r}


def rank_suspects(records: Iterable[Mapping[str, Any]], baseline: Iterable[Mapping[str, Any]], *,
                  lead: float = LEAD) -> Suspects:
    """Rank the nodes of a run by how much their ranks slowed down against the baseline run."""
    tonight, before = _per_rank(records), _per_rank(baseline)
    ratios: dict[str, list[float]] = defaultdict(list)
    for key, medians in tonight.items():
        reference = before.get(key)
        if reference is None:
            continue
        for host, now, then in zip(key[-1], medians, reference, strict=True):
            if then > 0:
                ratios[host].append(now / then)
    if len(ratios) < 2:
        return Suspects([], False, "no per-rank data to compare with a baseline run of the same series on "
                                   ">= 2 nodes (commbench schema 2 records on both nights)")
    ranked = sorted((NodeGrowth(node, statistics.median(values)) for node, values in ratios.items()),
                    key=lambda g: (-g.growth, g.node))
    summary = ", ".join(f"{g.node} x{g.growth:.2f}" for g in ranked)
    first, second = ranked[0], ranked[1]
    if first.growth >= lead * second.growth:
        return Suspects(ranked, True, f"{first.node}'s ranks slowed down {first.growth:.2f}x against the baseline, "
                                      f">= {lead:g}x any other node ({summary})")
    return Suspects(ranked, False, f"ambiguous: no node slowed down >= {lead:g}x more than the others ({summary})")
