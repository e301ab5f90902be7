"""Where a campaign's multi-node jobs are placed (spec `placements`; characterize campaigns sweep them), and
how far apart their ranks really were (campaigns/slurm/topology.py).

The network topology is Slurm's own (`scontrol show topology`, topology/tree): leaf switches (level 0)
hold nodes, higher switches hold switches. A group is the subtree under one child of a top switch (a
dragonfly group); a two-level tree (leaves under one top switch) is one group.

Placements of a multi-node test case (spec `placements`):
  any               Slurm chooses
  same-switch       every node under one leaf switch (`--switches=1`)
  different-switch  nodes spread round-robin over leaf switches (`--nodelist`), at least two switches
  different-group   nodes spread over groups (`--nodelist`), at least two groups
  each-switch       one run under every leaf switch that has enough nodes (`--nodelist`, the switch's first
                    nodes): node sets that share no node, so a night that degrades several of them is
                    fabric-wide (campaigns/kinds/health.py) and one that degrades one names its switch
A placement the topology cannot give (one leaf switch only, too few nodes under one switch) is a
PlacementError: the test case is reported as not runnable, nothing is stored for it.

Network distance labels, from the hosts a run's records name: intra-node, same-switch,
different-switch, different-group (or `unknown` without topology data).
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, replace

from campaigns.model.spec import SLURM_SCHEDULERS, Campaign, TestCase
from campaigns.slurm.topology import PlacementError, Topology, slurm_topology


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

    def expand(self, case: TestCase) -> list[TestCase]:
        """The runs of a case: an `each-switch` case becomes one case per leaf switch with enough nodes (its
        first nodes as the nodelist); any other case is itself. PlacementError when no switch has enough."""
        if case.placement != "each-switch" or case.nodelist or case.num_nodes == 1:
            return [case]
        under = self.load_topology().nodes_under(self.load_topology().leaf_of)
        runs = [replace(case, nodelist=tuple(nodes[:case.num_nodes]))
                for _, nodes in sorted(under.items()) if len(nodes) >= case.num_nodes]
        if not runs:
            raise PlacementError(f"no leaf switch has {case.num_nodes} nodes "
                                 f"(at most {max(map(len, under.values()), default=0)})")
        return runs

    def job_options(self, case: TestCase) -> tuple[str, ...]:
        if case.nodelist:
            return (f"--nodelist={','.join(case.nodelist)}",)
        if case.placement == "any" or case.num_nodes == 1:
            return ()
        if case.placement == "each-switch":
            self.expand(case)  # PlacementError if no switch can hold it
            raise PlacementError("an each-switch case runs as its per-switch cases (Placer.expand)")
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


def planned_job_options(case: TestCase) -> tuple[str, ...]:
    """The Slurm options a case will get, without reading the topology (for --dry-run)."""
    if case.nodelist:
        return (f"--nodelist={','.join(case.nodelist)}",)
    if case.placement == "any" or case.num_nodes == 1:
        return ()
    if case.placement == "same-switch":
        return ("--switches=1",)
    if case.placement == "each-switch":
        return (f"--nodelist=<{case.num_nodes} nodes under one leaf switch; one run per switch>",)
    return (f"--nodelist=<{case.num_nodes} nodes spread over "
            f"{'leaf switches' if case.placement == 'different-switch' else 'groups'}>",)


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
