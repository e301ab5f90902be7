"""What else the partition was doing while a health check measured it: a Slurm snapshot (jobs, nodes and
their states) kept in the verdict, so a degraded night can be read against the load it ran under."""
from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field

from campaigns.slurm.topology import expand_hostlist

SNAPSHOT_TIMEOUT_S = 20


@dataclass
class SlurmSnapshot:
    partition: str
    taken_at: str = ""  # squeue's clock is the controller's; this is ours (UTC ISO 8601)
    jobs: list[dict[str, object]] = field(default_factory=list)  # id, name, user, state, nodes
    nodes: dict[str, str] = field(default_factory=dict)  # node -> state (sinfo %T)
    problem: str = ""  # why the snapshot is missing or partial


def slurm_partition(access: list[str], name: str) -> str:
    """The Slurm partition a ReFrame partition submits to (`--partition=P`, `--partition P`, `-p P`, `-pP` in its
    access options, each entry split as ReFrame's filternodes splits it: `'-p gpu'` is one entry of two words),
    else its own name; the last one given wins, as in sbatch."""
    words = [word for option in access for word in shlex.split(option)]
    found = name
    for index, word in enumerate(words):
        if word.startswith("--partition="):
            found = word.split("=", 1)[1]
        elif word in ("-p", "--partition") and index + 1 < len(words):
            found = words[index + 1]
        elif word.startswith("-p") and not word.startswith("--") and len(word) > 2:
            found = word[2:]
    return found


def reservation_of(access: list[str]) -> str | None:
    """The reservation the access options send the jobs into (--reservation=R / --reservation R; the last one given
    wins, as in sbatch), else None."""
    words = [word for option in access for word in shlex.split(option)]
    found = None
    for index, word in enumerate(words):
        if word.startswith("--reservation="):
            found = word.split("=", 1)[1]
        elif word == "--reservation" and index + 1 < len(words):
            found = words[index + 1]
    return found


def take_snapshot(partition: str, *, exclude_jobs: set[str] | None = None) -> SlurmSnapshot:
    """squeue and sinfo of `partition` now; the health check's own jobs can be left out."""
    from datetime import UTC, datetime

    snapshot = SlurmSnapshot(partition, datetime.now(UTC).isoformat(timespec="seconds"))
    try:
        jobs = subprocess.run(["squeue", "-h", "-p", partition, "-o", "%i|%j|%u|%T|%N"], capture_output=True,
                              text=True, timeout=SNAPSHOT_TIMEOUT_S, check=True).stdout
        nodes = subprocess.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T"], capture_output=True, text=True,
                               timeout=SNAPSHOT_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        snapshot.problem = f"no Slurm snapshot: {exc}"
        return snapshot
    for line in jobs.splitlines():
        job_id, name, user, state, hostlist = (line.split("|") + [""] * 5)[:5]
        if job_id and job_id not in (exclude_jobs or set()):
            snapshot.jobs.append({"id": job_id, "name": name, "user": user, "state": state,
                                  "nodes": expand_hostlist(hostlist) if hostlist else []})
    for line in nodes.splitlines():
        node, _, state = line.partition("|")
        if node:
            snapshot.nodes[node] = state
    return snapshot


def fabric_wide(bad_host_sets: list[set[str]]) -> bool:
    """Several degraded multi-node metrics on node sets that share no node: no single node explains them,
    so the night is fabric-wide (contention, a switch) rather than one node's fault."""
    sets = [hosts for hosts in bad_host_sets if hosts]
    if len(sets) < 2:
        return False
    return all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
