"""How results/tuning/per-size-localslurm/ was made: start a private local Slurm cluster (3 nodes,
tests/fixtures_slurm.py's local_slurm_cluster: a free cluster id, stopped at the end), then run
campaigns.tools.per_size_demo with the given arguments in its environment. From the repository root:

    .venv/bin/python results/tuning/per-size-localslurm/run_on_local_cluster.py --out DIR --nodes 3 \\
        --ops allreduce,alltoall,allgather,bcast,reduce_scatter --sizes 8,65536,1048576 --top 1 --iters 1 \\
        --warmup 1 --validation-rounds 8 --budget-s 600
"""

import subprocess
import sys

sys.path.insert(0, "tests")
from fixtures_slurm import local_slurm_cluster  # noqa: E402

with local_slurm_cluster(nnodes=3) as cluster:
    print("cluster", cluster.cluster_id, flush=True)
    done = subprocess.run([sys.executable, "-m", "campaigns.tools.per_size_demo", *sys.argv[1:]], env=cluster.env, check=False)
    sys.exit(done.returncode)
