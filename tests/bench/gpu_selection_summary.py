"""Per (path, op, size): NCCL's own choice against the fastest forced selection of a commbench selection
sweep (`--transport ccl --selections all`, records gzipped as committed under results/reference/
h200x2-selection-sweep/). Descriptive only: the fastest of ~20-40 available selections is picked from the
same samples it is reported on, so `best/own` is biased low (no held-out rounds, no test); the per-size
stage (tuners/per_size.py) is what decides.

    .venv/bin/python tests/bench/gpu_selection_summary.py results/reference/h200x2-selection-sweep/2026-11-23
"""
from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path


def summary(directory: Path) -> list[str]:
    lines = ["path    op              bytes    own_us    best_us  best selection          best/own  available/forced"]
    for path in sorted(directory.glob("records/*.jsonl.gz")):
        medians: dict[tuple[int, str], float] = {}
        forced: dict[int, set[str]] = defaultdict(set)
        available: dict[int, set[str]] = defaultdict(set)
        op = ""
        with gzip.open(path, "rt", encoding="utf-8") as stream:
            for record in map(json.loads, filter(str.strip, stream)):
                selection = record.get("selection")
                if selection is None:
                    continue
                op, size, name = record["op"], record["requested_bytes"], selection["name"]
                if name != "own":
                    forced[size].add(name)
                if record["kind"] == "result" and record.get("valid", True) and selection.get("available", True):
                    medians[size, name] = record["stats"]["median_us"]
                    if name != "own":
                        available[size].add(name)
        for size in sorted(forced):
            candidates = {name: medians[size, name] for name in available[size]}
            if (size, "own") not in medians or not candidates:
                continue
            own, best = medians[size, "own"], min(candidates, key=candidates.__getitem__)
            lines.append(f"{path.name.split('-')[0]:7} {op:14} {size:>10} {own:9.2f} {candidates[best]:10.2f}  "
                         f"{best:22} {candidates[best] / own:8.3f}  {len(available[size]):4}/{len(forced[size])}")
    return lines


if __name__ == "__main__":
    print("\n".join(summary(Path(sys.argv[1]))))
