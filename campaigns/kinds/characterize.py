"""Characterization campaigns: where multi-node jobs are placed, and how far apart their ranks really were.

The network topology is Slurm's own (`scontrol show topology`, topology/tree): leaf switches (level 0)
hold nodes, higher switches hold switches. A group is the subtree under one child of a top switch (a
dragonfly group); a two-level tree (leaves under one top switch) is one group.

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
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from campaigns.model.spec import SLURM_SCHEDULERS, Campaign, TestCase

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


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm host list syntax -> names: 'n[1-3,7],login01' -> n1 n2 n3 n7 login01 (zero padding kept;
    several bracket groups in one name multiply out)."""
    names: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", hostlist):
        parts = re.split(r"\[([^\]]*)\]", item)
        choices: list[list[str]] = []
        for index, part in enumerate(parts):
            if index % 2 == 0:
                choices.append([part])
                continue
            expanded = []
            for piece in part.split(","):
                low, _, high = piece.partition("-")
                if not low.isdigit() or (high and not high.isdigit()):
                    raise PlacementError(f"cannot read the Slurm host list {hostlist!r}")
                width = len(low)
                expanded += [str(n).zfill(width) for n in range(int(low), int(high or low) + 1)]
            choices.append(expanded)
        names += ["".join(combo) for combo in itertools.product(*choices)]
    return names


def parse_topology(text: str) -> Topology:
    """`scontrol show topology` output -> Topology."""
    switches = [_fields(line) for line in text.splitlines() if line.startswith("SwitchName=")]
    if not switches:
        raise PlacementError("Slurm has no network topology (TopologyPlugin=topology/tree and topology.conf)")
    children = {s["SwitchName"]: expand_hostlist(s["Switches"]) for s in switches if s.get("Switches")}
    # Slurm lists every node below a higher switch too (Nodes=); the leaves are the level-0 switches.
    leaves = {s["SwitchName"]: expand_hostlist(s["Nodes"]) for s in switches
              if s.get("Nodes") and s.get("Level", "0" if not s.get("Switches") else "1") == "0"}
    parent = {child: name for name, kids in children.items() for child in kids}
    tops = [name for name in {s["SwitchName"] for s in switches} if name not in parent]

    def group(leaf: str) -> str:
        # The ancestor just below a top switch (a dragonfly group switch); where leaves hang directly off
        # the top switch (two levels) there are no groups but the whole tree: the top switch.
        if leaf not in parent or parent[leaf] in tops:
            return parent.get(leaf, leaf)
        switch = leaf
        while parent[switch] not in tops:
            switch = parent[switch]
        return switch

    leaf_of = {node: leaf for leaf, nodes in leaves.items() for node in nodes}
    return Topology(leaf_of=leaf_of, group_of={node: group(leaf) for node, leaf in leaf_of.items()})


def slurm_topology(env: Mapping[str, str] | None = None) -> Topology:
    out = subprocess.run(["scontrol", "show", "topology"], capture_output=True, text=True, timeout=30,
                         check=False, env=dict(env) if env is not None else None)
    if out.returncode != 0:
        raise PlacementError(f"scontrol show topology exited {out.returncode}: {(out.stderr or out.stdout).strip()}")
    return parse_topology(out.stdout)


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


def planned_job_options(case: TestCase) -> tuple[str, ...]:
    """The Slurm options a case will get, without reading the topology (for --dry-run)."""
    if case.nodelist:
        return (f"--nodelist={','.join(case.nodelist)}",)
    if case.placement == "any" or case.num_nodes == 1:
        return ()
    if case.placement == "same-switch":
        return ("--switches=1",)
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
