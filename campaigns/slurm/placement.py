"""Where a campaign's multi-node jobs are placed (spec `placements`; characterize campaigns sweep them), and
how far apart their ranks really were (campaigns/slurm/topology.py).

The network topology is Slurm's own (`scontrol show topology`, topology/tree): leaf switches (level 0)
hold nodes, higher switches hold switches. A group is the subtree under one child of a top switch (a
dragonfly group); a two-level tree (leaves under one top switch) is one group.

Placements of a multi-node test case (spec `placements`):
  any               Slurm chooses
  same-switch       every node under one leaf switch (`--nodelist`: the first leaf switch with enough nodes;
                    not `--switches=1`, which Slurm gives up after its wait and runs anywhere)
  different-switch  nodes spread round-robin over leaf switches of one group (`--nodelist`), at least two
  different-group   nodes spread over groups (`--nodelist`), at least two groups
  each-switch       one run under every leaf switch that has enough nodes (`--nodelist`, the switch's first
                    nodes): node sets that share no node, so a night that degrades several of them is
                    fabric-wide (campaigns/kinds/health.py) and one that degrades one names its switch
Every `--nodelist` is chosen from the nodes of the case's Slurm partition (its `access` options'
`--partition`, else its name) that are in service now (`sinfo -p P -N`: not down, drained, ...), so that no
job waits for a node that will not take it. A placement the topology and those nodes cannot give (one leaf
switch only, too few nodes in service under one switch) is a PlacementError: the test case is reported as
not runnable at once (no job submitted), nothing is stored for it.

Network distance labels, from the hosts a run's records name: intra-node, same-switch,
different-switch, different-group (or `unknown` without topology data). A placed run whose ranks spanned
another distance than its placement asked for is no pass (`placement_mismatch`).
"""
from __future__ import annotations

import itertools
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from campaigns.model.spec import SLURM_SCHEDULERS, Campaign, TestCase
from campaigns.slurm.nodes import in_service
from campaigns.slurm.snapshot import reservation_of, slurm_partition
from campaigns.slurm.topology import PlacementError, Topology, expand_hostlist, slurm_topology

# The network distance each placement asks for (campaigns/slurm/topology.py DISTANCES).
REQUESTED_DISTANCE = {"same-switch": "same-switch", "each-switch": "same-switch",
                      "different-switch": "different-switch", "different-group": "different-group"}


def parse_partition_nodes(text: str, reserved_ok: bool = False) -> frozenset[str]:
    """`sinfo -p P -N -h -o '%N|%t'` -> the nodes of the partition that take new jobs now (reserved ones only with
    `reserved_ok`: the jobs name a reservation)."""
    nodes = set()
    for line in text.splitlines():
        node, _, state = line.strip().partition("|")
        if node and in_service(state, reserved_ok):
            nodes.add(node)
    return frozenset(nodes)


def partition_nodes_in_service(partition: str, env: Mapping[str, str] | None = None,
                               reserved_ok: bool = False) -> frozenset[str]:
    """The nodes of Slurm partition `partition` in service now (parse_partition_nodes); PlacementError when Slurm
    cannot say."""
    try:
        out = subprocess.run(["sinfo", "-p", partition, "-N", "-h", "-o", "%N|%t"], capture_output=True, text=True,
                             timeout=30, check=False, env=dict(env) if env is not None else None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PlacementError(f"cannot ask Slurm which nodes of partition {partition} are in service: {exc}") from None
    if out.returncode != 0:
        raise PlacementError(f"sinfo -p {partition} exited {out.returncode}: {(out.stderr or out.stdout).strip()}")
    return parse_partition_nodes(out.stdout, reserved_ok)


def reservation_nodes(reservation: str, env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The nodes of Slurm reservation `reservation` (`scontrol show reservation R`: Nodes=): a job that names it
    runs on those alone; PlacementError when Slurm cannot say."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "reservation", reservation], capture_output=True, text=True,
                             timeout=30, check=False, env=dict(env) if env is not None else None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PlacementError(f"cannot ask Slurm for the nodes of reservation {reservation}: {exc}") from None
    fields = dict(word.split("=", 1) for word in out.stdout.split() if "=" in word)
    if out.returncode != 0 or fields.get("ReservationName") != reservation:
        raise PlacementError(f"scontrol show reservation {reservation} exited {out.returncode}: "
                             f"{(out.stderr or out.stdout).strip() or 'no such reservation'}")
    nodes = fields.get("Nodes", "")
    return frozenset(expand_hostlist(nodes)) if nodes and nodes != "(null)" else frozenset()


def placement_mismatch(case: TestCase, hosts: tuple[str, ...] | list[str], topology: Topology | None) -> str | None:
    """Why a placed multi-node run is no pass: its ranks spanned another network distance than its placement
    asks for (Slurm ran it elsewhere); None when they match or nothing was placed."""
    requested = REQUESTED_DISTANCE.get(case.placement)
    if requested is None or case.num_nodes == 1 or topology is None or not hosts:
        return None
    measured = topology.distance(hosts)
    if measured == requested:
        return None
    return (f"placement {case.placement} requested {requested}, but the ranks ran {measured} "
            f"(on {','.join(sorted(set(hosts)))})")


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
    # ReFrame partition -> the Slurm partition its jobs go to (placer_for: from its access options)
    slurm_partitions: Mapping[str, str] = field(default_factory=dict)
    # ReFrame partition -> its Slurm partition's nodes in service (read once per campaign; tests set it).
    # A partition in neither mapping: every node of the topology.
    in_service: dict[str, frozenset[str]] = field(default_factory=dict)
    # ReFrame partition -> the reservation its jobs name (--reservation in its access options): they run on its
    # nodes alone, reserved or not
    reserving: Mapping[str, str] = field(default_factory=dict)

    def load_topology(self) -> Topology:
        if self.topology is None:
            self.topology = slurm_topology(self.env)
        return self.topology

    def usable_nodes(self, case: TestCase) -> frozenset[str] | None:
        """The nodes a placement of `case` may use: its Slurm partition's nodes in service (None: any)."""
        if case.partition not in self.in_service:
            slurm = self.slurm_partitions.get(case.partition)
            if slurm is None:
                return None
            reservation = self.reserving.get(case.partition)
            nodes = partition_nodes_in_service(slurm, self.env, reserved_ok=reservation is not None)
            if reservation is not None:  # sbatch takes a comma-separated list: the job runs in one of them
                nodes &= frozenset().union(*(reservation_nodes(name, self.env) for name in reservation.split(",")))
            self.in_service[case.partition] = nodes
        return self.in_service[case.partition]

    def _where(self, case: TestCase) -> str:
        slurm = self.slurm_partitions.get(case.partition)
        reservation = self.reserving.get(case.partition)
        return f" in service in Slurm partition {slurm}" + (f" and reservation {reservation}" if reservation else "") \
            if slurm else (
            " in service" if case.partition in self.in_service else "")

    def _under(self, case: TestCase, mapping: Mapping[str, str]) -> dict[str, list[str]]:
        """Usable nodes of the topology under each switch or group of `mapping` (sorted; empty ones left out)."""
        usable = self.usable_nodes(case)
        under = {owner: [n for n in nodes if usable is None or n in usable]
                 for owner, nodes in self.load_topology().nodes_under(mapping).items()}
        return {owner: nodes for owner, nodes in sorted(under.items()) if nodes}

    def _switch_sets(self, case: TestCase) -> list[tuple[str, ...]]:
        """The first `num_nodes` usable nodes of every leaf switch that has enough; PlacementError if none."""
        under = self._under(case, self.load_topology().leaf_of)
        sets = [tuple(nodes[:case.num_nodes]) for nodes in under.values() if len(nodes) >= case.num_nodes]
        if not sets:
            raise PlacementError(f"no leaf switch has {case.num_nodes} nodes{self._where(case)} "
                                 f"(at most {max(map(len, under.values()), default=0)})")
        return sets

    def expand(self, case: TestCase) -> list[TestCase]:
        """The runs of a case: an `each-switch` case becomes one case per leaf switch with enough usable nodes
        (its first ones as the nodelist); any other case is itself. PlacementError when no switch has enough."""
        if case.placement != "each-switch" or case.nodelist or case.num_nodes == 1:
            return [case]
        return [replace(case, nodelist=nodes) for nodes in self._switch_sets(case)]

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
            return (f"--nodelist={','.join(self._switch_sets(case)[0])}",)
        if case.placement == "different-group":
            nodes = _spread(list(self._under(case, topology.group_of).values()), case.num_nodes,
                            f"groups{self._where(case)}")
            return (f"--nodelist={','.join(nodes)}",)
        # different-switch: leaf switches of one group (leaves in two groups would be different-group)
        leaves = self._under(case, topology.leaf_of)
        by_group: dict[str, list[list[str]]] = {}
        for nodes in leaves.values():
            by_group.setdefault(topology.group_of[nodes[0]], []).append(nodes)
        problems = []
        for _, buckets in sorted(by_group.items()):
            try:
                nodes = _spread(buckets, case.num_nodes, f"leaf switches{self._where(case)} in one group")
                return (f"--nodelist={','.join(nodes)}",)
            except PlacementError as exc:
                problems.append(str(exc))
        raise PlacementError(problems[0] if len(problems) == 1 else
                             f"no group has {case.num_nodes} nodes{self._where(case)} under two leaf switches"
                             if problems else f"the topology has no nodes{self._where(case)}")


def planned_job_options(case: TestCase) -> tuple[str, ...]:
    """The Slurm options a case will get, without reading the topology (for --dry-run)."""
    if case.nodelist:
        return (f"--nodelist={','.join(case.nodelist)}",)
    if case.placement == "any" or case.num_nodes == 1:
        return ()
    if case.placement == "same-switch":
        return (f"--nodelist=<{case.num_nodes} nodes in service under one leaf switch>",)
    if case.placement == "each-switch":
        return (f"--nodelist=<{case.num_nodes} nodes under one leaf switch; one run per switch>",)
    return (f"--nodelist=<{case.num_nodes} nodes spread over "
            f"{'leaf switches' if case.placement == 'different-switch' else 'groups'}>",)


def placer_for(campaign: Campaign, env: Mapping[str, str] | None = None) -> Placer:
    """A Placer with the Slurm topology loaded where the campaign runs on Slurm, so that every multi-node
    run gets its network distance. PlacementError only when the campaign's placements need a topology."""
    slurm = {p.name: slurm_partition(p.access, p.name) for p in campaign.partitions if p.scheduler in SLURM_SCHEDULERS}
    if not slurm:
        return Placer(env=env)
    reserving = {p.name: reservation for p in campaign.partitions if (reservation := reservation_of(p.access))}
    try:
        return Placer(slurm_topology(env), env, slurm, reserving=reserving)
    except PlacementError:
        if any(p != "any" for p in campaign.spec.placements):
            raise
        return Placer(env=env, slurm_partitions=slurm, reserving=reserving)
