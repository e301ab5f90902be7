"""What commcamp asks Slurm about its nodes before and after a campaign: whether the site's Slurm answers
from this host (preflight), and which nodes take no new jobs now."""
from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Collection
from pathlib import Path


from campaigns.model.spec import Campaign


# What ReFrame's Slurm backends need from this host, probed before anything runs.
_SLURM_PROBES = {
    "slurm": [(["sinfo", "-h", "-o", "%P"], "Slurm's controller is not reachable"),
              (["sacct", "-n", "-X", "-j", "1", "-o", "jobid"],
               "ReFrame's slurm scheduler polls sacct, which fails here")],
    "squeue": [(["sinfo", "-h", "-o", "%P"], "Slurm's controller is not reachable")],
}


def missing_slurm_conf() -> str | None:
    """'SLURM_CONF=... does not exist' when it names a file that is not there (Slurm's commands then retry it for a
    minute before they fail); None otherwise."""
    conf = os.environ.get("SLURM_CONF")
    return f"SLURM_CONF={conf} does not exist" if conf and not Path(conf).is_file() else None


def preflight(campaign: Campaign) -> list[str]:
    """Problems that would make every job of the campaign fail, e.g. a Slurm site used without its
    environment (for localslurm: eval "$(site_configs/localslurm/cluster/cluster.sh env)")."""
    problems = _modules_problems(campaign.system.modules_system)
    schedulers = sorted({p.scheduler for p in campaign.partitions} & set(_SLURM_PROBES))
    if schedulers and (missing := missing_slurm_conf()) is not None:
        return [*problems, f"{missing} (Slurm's commands would retry it for a minute)"]
    for scheduler in schedulers:
        for cmd, what in _SLURM_PROBES[scheduler]:
            try:
                probe = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                problems.append(f"{what}: {shlex.join(cmd)}: {exc}")
                continue
            if probe.returncode != 0:
                output = (probe.stderr or probe.stdout).strip()
                problems.append(f"{what}: {shlex.join(cmd)} exited {probe.returncode}: {output}")
    return problems


def _modules_problems(name: str) -> list[str]:
    """The system's modules_system as ReFrame finds it here: without it every case was an error whose reason
    ("could not find a sane Lmod installation") only reframe.out held."""
    from reframe.core.exceptions import ConfigError
    from reframe.core.modules import ModulesSystem

    try:
        ModulesSystem.create(name)
    except ConfigError as exc:
        return [f"modules_system {name}: ReFrame: {exc}"]
    return []


# sinfo's short states of a node that takes no new jobs (a trailing * means "not responding"): an invalid
# registration (inval: Slurm 22.05 shows it for a drained node too), future, planned and blocked nodes among them.
_OUT_OF_SERVICE = ("down", "drain", "drng", "fail", "failg", "maint", "boot", "unk", "pow_dn", "npc", "inval",
                   "futr", "plnd", "block")


def in_service(state: str, reserved_ok: bool = True) -> bool:
    """Whether a node in sinfo's short state `state` (%t) takes new jobs; with `reserved_ok` False, not one in a
    reservation (resv, or a trailing $: a maintenance one) either: a job that names none would pend there."""
    base = state.rstrip("*~#!%$@^-")
    return not (base in _OUT_OF_SERVICE or state.endswith("*")
                or (not reserved_ok and (base == "resv" or state.endswith("$"))))


def nodes_out_of_service(nodes: Collection[str]) -> list[str]:
    """Those of `nodes` that Slurm runs no new jobs on now, each as 'NODE: STATE (REASON)'; [] when all are in
    service or Slurm cannot be asked."""
    if not nodes:
        return []
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", ",".join(sorted(nodes)), "-o", "%N|%t|%E"],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    found: dict[str, str] = {}
    for line in out.stdout.splitlines():
        node, state, reason = (line.split("|", 2) + ["", ""])[:3]
        if not in_service(state):
            found[node] = f"{node}: {state}" + (f" ({reason})" if reason and reason != "none" else "")
    return [found[node] for node in sorted(found)]
