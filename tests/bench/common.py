"""What the benchmark scripts of tests/bench/ share: the cluster to run on, and writing a result with its provenance."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
LOAD_AT_START = [round(x, 2) for x in os.getloadavg()]  # the scripts import this module first
# The code that ran is the checkout's at the start: a commit made while a long run goes on is not it.
COMMIT_AT_START = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, check=False).stdout.strip()


@contextlib.contextmanager
def slurm_cluster_env() -> Iterator[dict[str, str]]:
    """The environment of the running cluster (SLURM_CONF set and sinfo answers), or of a new 3-node one that
    is stopped again at the end (tests/fixtures_slurm.py)."""
    if os.environ.get("SLURM_CONF") and subprocess.run(["sinfo", "-h"], capture_output=True,
                                                       timeout=20).returncode == 0:
        yield dict(os.environ)
        return
    from fixtures_slurm import local_slurm_cluster

    with local_slurm_cluster(nnodes=3) as cluster:
        yield cluster.env


def provenance(argv: list[str]) -> dict[str, Any]:
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(), "cpus": os.cpu_count(),
            "command": " ".join([str(Path(argv[0]).relative_to(REPO)) if Path(argv[0]).is_absolute() else argv[0],
                                 *argv[1:]]),
            "commit": COMMIT_AT_START, "load_avg_at_start": LOAD_AT_START,
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}


def write_result(path: Path, argv: list[str], fields: dict[str, Any]) -> None:
    """The benchmark's result with its provenance, as JSON, written atomically."""
    from tuners.writers import write_atomic

    write_atomic(path, json.dumps({**provenance(argv), **fields}, indent=1) + "\n")
