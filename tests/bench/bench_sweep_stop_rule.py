"""The per-size sweep's stop rule (commbench --stop-slower F --stop-after K) replayed on the committed sweeps,
which ran every selection every round: what it would have stopped, what that saves, and whether any per-size
decision changes.

    .venv/bin/python tests/bench/bench_sweep_stop_rule.py [--rules 2:4,1.5:4,3:4,2:3,2:6] [--top 3]
        [--output results/bench/sweep_stop_rule.json]

Per committed sweep file (SWEEPS) and op: `tuners.per_size.stops_early` on the recorded round medians (the rule
as commbench runs it), then `decide_per_size` on the whole sweep and on the sweep without the stopped selections
(the default finalize thresholds, `--top` candidates per size). A decision changed = a size whose candidates or
winner differ. Saved = the stopped selections' timed time in the rounds after round 2K-2 (round median x samples
per round x batch), against the whole sweep's timed time (warm-up, checks and barriers, which stopping saves too,
are not counted). The shipped rule (PerSizeSpec.stop_slower / stop_after, the first of --rules) must change no
decision here.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from common import REPO, write_result

from tuners.per_size import OWN, Sweep, decide_per_size, load_sweep, stops_early

SWEEPS = (
    "results/tuning/per-size-localslurm/openmpi/sweep.jsonl",
    "results/tuning/per-size-localslurm/mpich/sweep.jsonl",
    "results/tuning/per-size-localslurm/segments/sweep.jsonl",
    "results/tuning/deployed-check-localslurm/2026-11-27-code-92d3497/per_size_sweep.jsonl",
    "results/tuning/deployed-check-localslurm/2026-11-27-code-546a1ca/per_size_sweep.jsonl",
    "results/reference/h200x2-per-size/2026-11-23/rate/sweep.jsonl",
    "results/reference/h200x2-per-size/2026-11-23/nvlink/sweep.jsonl.gz",
    "results/reference/h200x2-per-size/2026-11-23/socket/sweep.jsonl.gz",
    "results/reference/h200x2-stop-rule/2026-11-27/sweep-off-133108.jsonl.gz",  # the sweeps run without the rule
    "results/reference/h200x2-stop-rule/2026-11-27/sweep-off-133403.jsonl.gz",
)


def timed_us(record: dict[str, Any], rounds: slice) -> float:
    """Timed time of `rounds` of a sweep record: round median x samples per round x operations per sample."""
    per_round = int(record["iters"]) // int(record["rounds"])
    return sum(record["round_medians"][rounds]) * per_round * int(record.get("batch", 1))


def without(sweep: Sweep, stopped: dict[int, list[str]]) -> Sweep:
    rounds = {size: {name: t for name, t in by_name.items() if name not in stopped.get(size, ())}
              for size, by_name in sweep.rounds.items()}
    return Sweep(sweep.op, sweep.library, sweep.ranks, sweep.nodes, sweep.selections, rounds, stopped)


def replay(records: list[dict[str, Any]], factor: float, after: int, top: int) -> dict[str, Any]:
    sweep = load_sweep(records)
    results = {(int(r["bytes"]), r["selection"]["name"]): r for r in records
               if r.get("kind") == "result" and "selection" in r and r.get("valid", True)}
    stopped = {size: [name for name, t in by_name.items() if name != OWN and stops_early(by_name[OWN], t, factor, after)]
               for size, by_name in sweep.rounds.items()}
    stopped = {size: names for size, names in stopped.items() if names}
    full, cut = decide_per_size(sweep, top=top), decide_per_size(without(sweep, stopped), top=top)
    changed = [{"bytes": a.bytes, "candidates": [a.candidates, b.candidates], "winner": [a.winner, b.winner]}
               for a, b in zip(full.sizes, cut.sizes) if (a.candidates, a.winner) != (b.candidates, b.winner)]
    total = sum(timed_us(r, slice(None)) for key, r in results.items() if key[0] in sweep.rounds)
    saved = sum(timed_us(results[(size, name)], slice(2 * after - 1, None))
                for size, names in stopped.items() for name in names)
    return {"selections": sum(len(by_name) - 1 for by_name in sweep.rounds.values()),
            "stopped": sum(map(len, stopped.values())),
            "stopped_by_size": {str(size): names for size, names in stopped.items()},
            "timed_s": round(total / 1e6, 1), "saved_s": round(saved / 1e6, 1),
            "saved_fraction": round(saved / total, 3) if total else 0.0,
            "winners": {str(d.bytes): d.winner for d in full.sizes}, "decisions_changed": changed}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default="2:4,1.5:4,3:4,2:3,2:6",
                        help="FACTOR:ROUNDS pairs; the first is the shipped rule")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--output", type=Path, default=REPO / "results/bench/sweep_stop_rule.json")
    args = parser.parse_args(argv)
    rules = [(float(f), int(k)) for f, k in (item.split(":") for item in args.rules.split(","))]
    sweeps = []
    for path in SWEEPS:
        data = (REPO / path).read_bytes()
        text = (gzip.decompress(data) if path.endswith(".gz") else data).decode()
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        for op in sorted({r["op"] for r in records if "selection" in r}):
            ours = [r for r in records if r["op"] == op]
            sweeps.append({"file": path, "op": op, "rounds": max(int(r.get("rounds", 0)) for r in ours),
                           "rules": {f"{f:g}:{k}": replay(ours, f, k, args.top) for f, k in rules}})
            print(f"{path} {op}: " + "; ".join(f"{rule} stopped {r['stopped']}/{r['selections']} saved "
                                                f"{r['saved_fraction']:.0%} changed {len(r['decisions_changed'])}"
                                                for rule, r in sweeps[-1]["rules"].items()))
    totals = {}
    for f, k in rules:
        rule = f"{f:g}:{k}"
        runs = [s["rules"][rule] for s in sweeps]
        totals[rule] = {"stopped": sum(r["stopped"] for r in runs), "selections": sum(r["selections"] for r in runs),
                        "saved_s": round(sum(r["saved_s"] for r in runs), 1),
                        "timed_s": round(sum(r["timed_s"] for r in runs), 1),
                        "decisions_changed": sum(len(r["decisions_changed"]) for r in runs)}
    write_result(args.output, ["tests/bench/bench_sweep_stop_rule.py", *argv],
                 {"what": "the per-size sweep's stop rule replayed on committed sweeps (FACTOR:ROUNDS)",
                  "shipped_rule": f"{rules[0][0]:g}:{rules[0][1]}", "top": args.top, "totals": totals,
                  "sweeps": sweeps})
    shipped = totals[f"{rules[0][0]:g}:{rules[0][1]}"]
    print(f"shipped rule: {shipped}")
    return 1 if shipped["decisions_changed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
