"""Characterization campaigns: where multi-node jobs are placed, and how far apart their ranks really were.

The network topology is Slurm's own (`scontrol show topology`, topology/tree): leaf switches hold nodes,
higher switches hold switches. A group is a subtree under a top-level switch's children (the dragonfly
group, or on a two-level tree the leaf itself is under the one top switch, so there is one group).

Placements of a multi-node test case (spec `placements`):
  any               Slurm chooses
  same-switch       every node under one leaf switch (`--switches=1`)
  different-switch  nodes spread round-robin over leaf switches (`--nodelist`), at least two switches
  different-group   nodes spread over groups (`--nodelist`), at least two groups
A placement the topology cannot give (one leaf switch only, too few nodes under one switch) is a
PlacementError: the test case is reported as not runnable, nothing is stored for it.

Network distance labels, from the hosts a run's records name: intra-node, same-switch,
different-switch, different-group (or `unknown` without topology data).
"""
from __future__ import annotations

import itertools
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from campaigns.spec import SLURM_SCHEDULERS, Campaign, TestCase

DISTANCES = ("intra-node", "same-switch", "different-switch", "different-group")


class PlacementError(RuntimeError):
    """A placement that this system's topology cannot give, or a topology that cannot be read."""


@dataclass(frozen=True)
class Topology:
    """Leaf switch and group of each node (Slurm topology/tree)."""

    leaf_of: Mapping[str, str]
    group_of: Mapping[str, str]

    def distance(self, hosts: Sequence[str]) -> str:
        distinct = sorted(set(hosts))
        if len(distinct) <= 1:
            return "intra-node"
        if any(host not in self.leaf_of for host in distinct):
            return "unknown"
        if len({self.leaf_of[h] for h in distinct}) == 1:
            return "same-switch"
        if len({self.group_of[h] for h in distinct}) == 1:
            return "different-switch"
        return "different-group"

    def nodes_under(self, mapping: Mapping[str, str]) -> dict[str, list[str]]:
        grouped: dict[str, list[str]] = {}
        for node, owner in sorted(mapping.items()):
            grouped.setdefault(owner, []).append(node)
        return grouped


def _fields(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def _expand(hostlist: str, env: Mapping[str, str] | None) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True,
                         timeout=30, check=False, env=dict(env) if env is not None else None)
    if out.returncode != 0:
        raise PlacementError(f"scontrol show hostnames {hostlist} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout.split()


def parse_topology(text: str, env: Mapping[str, str] | None = None) -> Topology:
    """`scontrol show topology` output -> Topology (host lists expanded with `scontrol show hostnames`)."""
    switches = [_fields(line) for line in text.splitlines() if line.startswith("SwitchName=")]
    if not switches:
        raise PlacementError("Slurm has no network topology (TopologyPlugin=topology/tree and topology.conf)")
    children = {s["SwitchName"]: _expand(s["Switches"], env) for s in switches if s.get("Switches")}
    leaves = {s["SwitchName"]: _expand(s["Nodes"], env) for s in switches if s.get("Nodes")}
    parent = {child: name for name, kids in children.items() for child in kids}
    tops = [name for name in {s["SwitchName"] for s in switches} if name not in parent]

    def group(switch: str) -> str:
        # the ancestor just below a top switch; a switch with no parent is its own group
        while switch in parent and parent[switch] not in tops:
            switch = parent[switch]
        return switch

    leaf_of = {node: leaf for leaf, nodes in leaves.items() for node in nodes}
    return Topology(leaf_of=leaf_of, group_of={node: group(leaf) for node, leaf in leaf_of.items()})


def slurm_topology(env: Mapping[str, str] | None = None) -> Topology:
    out = subprocess.run(["scontrol", "show", "topology"], capture_output=True, text=True, timeout=30,
                         check=False, env=dict(env) if env is not None else None)
    if out.returncode != 0:
        raise PlacementError(f"scontrol show topology exited {out.returncode}: {(out.stderr or out.stdout).strip()}")
    return parse_topology(out.stdout, env)


def _spread(buckets: list[list[str]], count: int, what: str) -> list[str]:
    """`count` nodes taken round-robin from the buckets (switches or groups); at least two buckets."""
    if len(buckets) < 2:
        raise PlacementError(f"the topology has {len(buckets)} {what}; the placement needs two")
    chosen = [node for node in itertools.chain.from_iterable(itertools.zip_longest(*buckets)) if node]
    if count > len(chosen):
        raise PlacementError(f"{count} nodes asked for, the topology has {len(chosen)}")
    return chosen[:count]


@dataclass
class Placer:
    """Slurm job options (ReFrame `-J`) that place each test case; reads the topology when first needed."""

    topology: Topology | None = None
    env: Mapping[str, str] | None = None

    def load_topology(self) -> Topology:
        if self.topology is None:
            self.topology = slurm_topology(self.env)
        return self.topology

    def job_options(self, case: TestCase) -> tuple[str, ...]:
        if case.nodelist:
            return (f"--nodelist={','.join(case.nodelist)}",)
        if case.placement == "any" or case.num_nodes == 1:
            return ()
        topology = self.load_topology()
        if case.placement == "same-switch":
            largest = max(len(nodes) for nodes in topology.nodes_under(topology.leaf_of).values())
            if case.num_nodes > largest:
                raise PlacementError(f"no leaf switch has {case.num_nodes} nodes (at most {largest})")
            return ("--switches=1",)
        mapping = topology.leaf_of if case.placement == "different-switch" else topology.group_of
        what = "leaf switches" if case.placement == "different-switch" else "groups"
        nodes = _spread(list(topology.nodes_under(mapping).values()), case.num_nodes, what)
        return (f"--nodelist={','.join(nodes)}",)


def placer_for(campaign: Campaign, env: Mapping[str, str] | None = None) -> Placer:
    """A Placer with the Slurm topology loaded where the campaign runs on Slurm, so that every multi-node
    run gets its network distance. PlacementError only when the campaign's placements need a topology."""
    if not any(p.scheduler in SLURM_SCHEDULERS for p in campaign.partitions):
        return Placer(env=env)
    try:
        return Placer(slurm_topology(env), env)
    except PlacementError:
        if any(p != "any" for p in campaign.spec.placements):
            raise
        return Placer(env=env)
