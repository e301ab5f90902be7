"""Who made a run slow, from the run itself (commbench schema 2's per-rank attribution).

commbench records each rank's own per-iteration times, summarised per rank (`per_rank.median_us`), and
each rank's host (`hostnames`). A node whose link or host degrades makes its own ranks slower than they
were; but ranks differ by role too (an algorithm gives some ranks more steps: on the local cluster's clean
runs one node's ranks held 76-100 % of the slowest-rank time, night after night), so a run is compared
with a healthy run of the same series (same op, size, ranks and nodes, its baseline): per node, the growth
of its ranks' median time over the baseline's. The node whose growth stands out (>= LEAD times every
other node's, and >= LEAD itself) is the suspect. A slow link slows both of its ends: in a sendrecv ring
the sender into a throttled node waits as the receiver does, by as much as its TCP buffers leave it
(recorded: x4-x18 for the sender, x25-x31 for the receiver), so two nodes that stand out together are
the suspects too, most grown first; a pair test with a node that did not slow down decides between them.
Otherwise the run says 'ambiguous' and health falls back to pair tests between all nodes. In a
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
    ranked: list[NodeGrowth]  # most grown first
    leaders: list[str]  # the one or two nodes that stand out, most grown first; empty when none does
    reason: str

    @property
    def clear(self) -> bool:
        return len(self.leaders) == 1

    @property
    def top(self) -> str | None:
        return self.leaders[0] if self.clear else None


# At most the two ends of one slow link stand out together; more than that is not one node's story.
MAX_LEADERS = 2


def _key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return (record["op"], record["transport"], record["bytes"], record.get("direction"), tuple(record["hostnames"]))


def _per_rank(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], list[float]]:
    return {_key(r): r["per_rank"]["median_us"] for r in records
            if r.get("kind") == "result" and r.get("valid", True) and "per_rank" in r}


def node_times(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], dict[str, float]]:
    """Per result record (its key: op, transport, bytes, direction, the hosts in rank order), each node's own
    time: the median of its ranks' per-rank medians (us). What health's fail-slow rule compares."""
    times: dict[tuple[Any, ...], dict[str, float]] = {}
    for key, medians in _per_rank(records).items():
        by_host: dict[str, list[float]] = defaultdict(list)
        for host, median in zip(key[-1], medians, strict=True):
            by_host[host].append(median)
        times[key] = {host: statistics.median(values) for host, values in by_host.items()}
    return times


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
        return Suspects([], [], "no per-rank data to compare with a baseline run of the same series on "
                                ">= 2 nodes (commbench schema 2 records on both nights)")
    ranked = sorted((NodeGrowth(node, statistics.median(values)) for node, values in ratios.items()),
                    key=lambda g: (-g.growth, g.node))
    summary = ", ".join(f"{g.node} x{g.growth:.2f}" for g in ranked)
    for count in range(1, min(MAX_LEADERS, len(ranked) - 1) + 1):
        last, rest = ranked[count - 1], ranked[count]
        if last.growth >= lead and last.growth >= lead * rest.growth:
            leaders = [g.node for g in ranked[:count]]
            if count == 1:
                return Suspects(ranked, leaders, f"{last.node}'s ranks slowed down {last.growth:.2f}x against the "
                                                 f"baseline, >= {lead:g}x any other node ({summary})")
            return Suspects(ranked, leaders, f"{' and '.join(f'{n}' for n in leaders)}'s ranks slowed down >= "
                                             f"{lead:g}x more than the others ({summary}): the two ends of one slow "
                                             f"path; a pair test with a node that did not slow down decides")
    return Suspects(ranked, [], f"ambiguous: no node slowed down >= {lead:g}x more than the others ({summary})")
