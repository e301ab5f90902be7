"""campaigns/tools/per_size_demo.py end to end on the local Slurm cluster, small: Open MPI and MPICH on 2
nodes, 2 ops, 2 sizes; the full run's results are under results/tuning/per-size-localslurm/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures_slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slurm
def test_small_per_size_demo_runs_end_to_end(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "campaigns.tools.per_size_demo", "--out", str(out), "--libraries", "openmpi,mpich",
         "--ops", "allreduce,reduce_scatter", "--sizes", "64,4096", "--nodes", "2", "--top", "1", "--warmup", "1",
         "--validation-rounds", "2", "--iters", "2", "--budget-s", "50"],
        cwd=REPO, env=slurm_cluster.env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for library, part in summary["libraries"].items():
        assert len(part["hosts"]) == 2, library  # one rank on each of two nodes
        assert part["sweep_rounds"] == 20  # 2 sizes x 1 candidate at alpha 0.01: 8 + 2 confirmation rounds
        sweep = [json.loads(line) for line in (out / library / "sweep.jsonl").read_text().splitlines()]
        assert {r["selection"]["name"] for r in sweep} > {"own"} and all(len(r["round_medians"]) == 20 for r in sweep)
        for op in ("allreduce", "reduce_scatter"):
            decided = part["decisions"][op]
            assert [s["bytes"] for s in decided["sizes"]] == sorted({r["bytes"] for r in sweep if r["op"] == op})
            assert decided["confirmation_rounds"] == 10 and "Holm over all" in decided["test"]
        if part["rule_file"] is None:  # nothing significant: nothing to deploy, nothing to validate
            assert all(s["winner"] is None for d in part["decisions"].values() for s in d["sizes"])
            assert "validation" not in part
        else:
            assert Path(part["rule_file"]).exists() and part["validation"]["rounds"] == 2
            assert len(part["validation"]["sizes"]) == 4
    assert "per-size demonstration" in (out / "summary.txt").read_text()
    assert len(summary["load_avg_at_start"]) == 3  # provenance: how loaded the machine was


def test_validation_deploys_the_rules_on_the_global_environment_under_mpirun(tmp_path: Path) -> None:
    # The deployed set is the global environment + the rules when the sweep ran under it (--under-global);
    # the global environment alone is the third setting. Real Open MPI, 2 ranks under mpirun on this machine.
    import time

    import numpy as np

    from campaigns.tools.per_size_demo import Launch, default_commbench, validate

    launch = Launch("openmpi", "mpirun", 1, 2, default_commbench("openmpi"), None, {"OMPI_MCA_btl": "self,tcp"})
    global_env = {"OMPI_MCA_btl_tcp_sndbuf": "131072"}
    rules = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "0"}
    result = validate(launch, ["allreduce"], [64], rules, 2, 1, 1, tmp_path, time.time() + 60,
                      np.random.default_rng(0), global_env, deploy_global=True)
    assert result["env"]["rules"] == {**launch.base_env(), **global_env, **rules}
    assert result["env"]["global"] == {**launch.base_env(), **global_env}
    assert result["rounds"] == 2 and result["against_global"]["reference"] == "global"
    assert [(row["op"], row["bytes"]) for row in result["sizes"]] == [("allreduce", 64)]
    alone = validate(launch, ["allreduce"], [64], rules, 1, 1, 1, tmp_path, time.time() + 60,
                     np.random.default_rng(0), global_env)
    assert alone["env"]["rules"] == {**launch.base_env(), **rules}
