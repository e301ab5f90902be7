"""How results/tuning/per-size-localslurm/ was made: campaigns.tools.per_size_demo with the given arguments in the
environment of a local Slurm cluster (common.slurm_cluster_env: the running one, else a private 3-node one,
stopped at the end). From the repository root:

    .venv/bin/python tests/bench/per_size_localslurm.py --out DIR --nodes 3 \\
        --ops allreduce,alltoall,allgather,bcast,reduce_scatter --sizes 8,1024,65536,1048576,16777216 --top 1 \\
        --iters 1 --warmup 1 --validation-rounds 10 --validation-iters 3 --budget-s 1900

(Until 2026-11-23 this was results/tuning/per-size-localslurm/run_on_local_cluster.py, which always started
a private cluster.)
"""
from __future__ import annotations

import subprocess
import sys

from common import slurm_cluster_env


def main(argv: list[str]) -> int:
    with slurm_cluster_env() as env:
        return subprocess.run([sys.executable, "-m", "campaigns.tools.per_size_demo", *argv], env=env,
                              check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
