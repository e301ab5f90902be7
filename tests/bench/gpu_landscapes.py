"""Landscape files (the format of tests/bench/sweep_landscape.py, read by tuners/landscape.py) from committed GPU
tuning trials: on 4x H200 (results/tuning/gpu-h200x4) every trial of demo 2 (NVLink path, tuner and random
search, 26 trials) and of demo 3 (socket path, 5 trials); on 2x H200 (results/reference/h200x2-per-size) the
45 trials of the three socket-path tunes with 256 MiB among the sizes. Trials are grouped by configuration:
a configuration measured k times is a point with k launches. Nothing is measured here.

Limits, plainly: these are not grids but the points two searches happened to visit (demo 2: 21 distinct
configurations of a 5-knob space; demo 3: 4 of a 3-knob space), most measured once, so per-point noise is
mostly absent and a replay answers every other configuration with its nearest visited point. The three
extra reference runs of the NVLink defaults (`references_us`) have no per-size times and are left out.

    .venv/bin/python tests/bench/gpu_landscapes.py
"""
from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from common import REPO, write_result

from tuners.evaluation import buckets_for_sizes

X4 = "results/tuning/gpu-h200x4"
X2_SOCKET = "results/reference/h200x2-per-size/2026-11-23/socket-tune"
OUT = REPO / "results" / "bench" / "landscapes"
SOCKET_KNOBS = ["NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_BUFFSIZE"]
DEMOS = {  # landscape name: (summaries, sizes of its buckets, searched knobs, site defaults of the demo (trial 0))
    "h200_nvlink_demo2": ([f"{X4}/demo2/summary.json"], [8192, 262144, 2097152, 16777216, 67108864],
                          ["NCCL_ALGO", "NCCL_PROTO", "NCCL_MAX_CTAS", "NCCL_NTHREADS", "NCCL_BUFFSIZE"],
                          {"NCCL_MAX_CTAS": "2", "NCCL_PROTO": "LL"}),
    "h200_socket_demo3": ([f"{X4}/demo3/summary.json"], [1048576, 16777216, 67108864], SOCKET_KNOBS, {}),
    "h200x2_socket_256": ([f"{X2_SOCKET}/socket256-{k}/summary.json" for k in (1, 2, 3)],
                          [1048576, 16777216, 268435456], SOCKET_KNOBS, {}),
}


def trials_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    trials = summary["trials"]
    return [t for arm in trials.values() for t in arm] if isinstance(trials, dict) else list(trials)


def main(argv: list[str]) -> int:
    for name, (sources, sizes, knobs, site_defaults) in DEMOS.items():
        paths = [REPO / relative for relative in sources]
        size_of = {b.name: b.max_bytes for b in buckets_for_sizes(sizes, 1)}
        configs: list[dict[str, Any]] = []
        trials = [(path, trial) for path in paths for trial in trials_of(json.loads(path.read_text()))]
        for path, trial in trials:
            env = {k: v for k, v in sorted(trial["env"].items()) if k in knobs}
            if trial["outcome"] == "complete":
                run: dict[str, Any] = {"median_us": {str(size_of[b]): t for b, t in trial["bucket_us"].items()}}
            else:
                run = {"failure": "failed", "reason": trial["fail_reason"] or trial["outcome"]}
            run["source_trial"] = trial["number"]
            if len(paths) > 1:
                run["source"] = str(path.relative_to(REPO))
            match = next((c for c in configs if c["env"] == env), None)
            if match is None:
                configs.append({"config": len(configs), "env": env, "runs": [run]})
            else:
                match["runs"].append(run)
        write_result(OUT / f"{name}.json", argv, {
            "what": f"replay landscape from the committed trials of {', '.join(sources)} (NCCL 2.28.3): the points "
                    "searches visited, NOT a grid; most measured once (no per-point noise); see the script",
            "source": sources[0] if len(sources) == 1 else sources,
            "source_sha256": [hashlib.sha256(path.read_bytes()).hexdigest() for path in paths]
            if len(paths) > 1 else hashlib.sha256(paths[0].read_bytes()).hexdigest(),
            "library": "nccl", "library_version": "2.28.3", "knobs": knobs, "sizes": sizes,
            "site_defaults": site_defaults, "runs": sum(len(c["runs"]) for c in configs), "configs": configs})
        print(f"{name}: {len(configs)} points, {sum(len(c['runs']) for c in configs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
