"""Slurm's network topology (`scontrol show topology`, topology/tree): the leaf switch and group of each node, the
network distance between a run's hosts, and Slurm's host list syntax."""
from __future__ import annotations

import itertools
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
