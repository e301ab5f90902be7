"""Per-size demonstration (issue 13, item 5): sweep, decide, write the rule files, validate them.

    python3 -m campaigns.tools.per_size_demo --out DIR [--libraries openmpi,mpich] [--ops ...] [--sizes ...]
        [--nodes 3] [--rounds R] [--validation-rounds V] [--iters I] [--validation-iters J] [--budget-s S]

Runs where `srun` reaches a Slurm cluster (the local one: eval "$(site_configs/localslurm/cluster/
cluster.sh env)"). Per library, one rank per node:
1. sweep: ONE commbench process per library, `--selections all --rounds R`: every op and size, the
   library's own choice and every forced selection, interleaved round by round (DIR/<lib>/sweep.jsonl);
2. per op, the per-size stage (tuners/per_size.py: candidates from the even rounds, decisions on the
   odd rounds, Holm over every size x candidate of the op) -> DIR/<lib>/decisions.json;
3. the library's rule file for all ops (tuners/rule_files.py) -> DIR/<lib>/rules.*;
4. validation: V rounds, each running the library's defaults and the deployed rule file (two
   processes, shuffled order per round); per op and size the median per-round speed-up of the rules
   over the defaults with its bootstrap CI and the one-sided Wilcoxon test of finalize
   (decide_paired, min_effect 0 here: "is it faster at all", Holm over all op x size tests) ->
   DIR/<lib>/validation.json. A size where a rule is deployed and the CI lies wholly below 0 is
   reported as a regression.
DIR/summary.json and summary.txt hold the selection matrix, the decisions, the validation and the
provenance (command, date, commit, versions, hosts).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from campaigns.model.records import parse_record_lines
from campaigns.tuning.executors import SWEEP_ENV
from tuners import rule_files
from tuners.finalize import Candidate, Thresholds, decide_paired
from tuners.per_size import PerSizeResult, decide_per_size, load_sweep, rounds_for
from tuners.writers import write_atomic

REPO = Path(__file__).resolve().parents[2]
OPS = ("allreduce", "alltoall", "allgather", "bcast", "reduce_scatter")
SIZES = (8, 64, 512, 4096, 32768, 262144, 2097152, 16777216)  # 8 B .. 16 MiB, factor 8
SRUN_MPI = {"openmpi": "pmix", "mpich": "pmi2"}
# MPICH across the netns "nodes" must use TCP, not shared memory (cluster.sh).
BASE_ENV: dict[str, dict[str, str]] = {"openmpi": {}, "mpich": {"UCX_TLS": "tcp,self"}}


def commbench(library: str) -> Path:
    return REPO / "build" / "bench" / f"cpu-{library}" / "commbench"


def run_commbench(library: str, nodes: int, args: Sequence[str], output: Path, env: Mapping[str, str],
                  timeout: float) -> list[dict[str, Any]]:
    """One srun of commbench across `nodes` nodes, one rank each; its valid result records."""
    output.unlink(missing_ok=True)
    cmd = ["srun", f"--mpi={SRUN_MPI[library]}", "-N", str(nodes), "-n", str(nodes), "--kill-on-bad-exit=1",
           str(commbench(library)), "--transport", "mpi", "--output", str(output), *args]
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    records, problems = parse_record_lines(output.read_text(), str(output))
    if problems:
        raise RuntimeError(f"{output}: {problems[:3]}")
    return [r for r in records if r["kind"] == "result"]


def sizes_arg(sizes: Sequence[int]) -> str:
    return ",".join(str(s) for s in sizes)


def write_rules(library: str, results: Sequence[PerSizeResult], directory: Path,
                evidence: Sequence[str]) -> tuple[Path | None, dict[str, str]]:
    """The library's rule file and the environment that deploys it (None, {}: nothing to deploy)."""
    if not any(r.selection is not None for result in results for r in result.ranges):
        return None, {}
    if library == "openmpi":
        path = directory / "rules.coll_tuned"
        write_atomic(path, rule_files.ompi_rules_text(results, evidence))
        return path, {rule_files.OMPI_MCA[0]: "1", rule_files.OMPI_MCA[1]: str(path.resolve())}
    path = directory / "rules.mpich_coll.json"
    write_atomic(path, rule_files.mpich_json_text(results, evidence))
    return path, {rule_files.MPICH_JSON_ENV: str(path.resolve())}


def validate(library: str, nodes: int, ops: Sequence[str], sizes: Sequence[int], rules_env: Mapping[str, str],
             rounds: int, iters: int, warmup: int, directory: Path, deadline: float,
             rng: np.random.Generator) -> dict[str, Any]:
    """Defaults vs deployed rules, interleaved (step 4 of the module docstring); stops at `deadline`."""
    args = ["--op", ",".join(ops), "--sizes", sizes_arg(sizes), "--iters", str(iters), "--warmup", str(warmup)]
    settings = {"defaults": dict(BASE_ENV[library]), "rules": {**BASE_ENV[library], **rules_env}}
    times: dict[str, list[dict[tuple[str, int], float]]] = {"defaults": [], "rules": []}
    for round_index in range(rounds):
        if time.time() > deadline:
            break
        for name in rng.permutation(list(settings)):
            records = run_commbench(library, nodes, args, directory / f"validation-{round_index}-{name}.jsonl",
                                    settings[name],
                                    timeout=max(60.0, deadline - time.time() + 60))
            times[name].append({(r["op"], r["bytes"]): r["stats"]["median_us"] for r in records})
    used = min(len(times["defaults"]), len(times["rules"]))
    keys = sorted(set(times["defaults"][0]) if used else set())
    log_ratios = {
        f"{op}/{size}": {0: np.log([times["defaults"][i][op, size] / times["rules"][i][op, size] for i in range(used)])}
        for op, size in keys
    }
    candidate = [Candidate({"rules": "deployed"})]
    decisions, family = decide_paired({}, {k: candidate for k in log_ratios}, log_ratios,
                                      {k: {} for k in log_ratios}, Thresholds(min_effect=0.0), rng)
    rows = []
    for key, decision in decisions.items():
        comparison = decision.comparisons[0]
        rows.append({"op": key.split("/")[0], "bytes": int(key.split("/")[1]), "speedup": comparison.gain,
                     "ci_low": comparison.ci_low, "ci_high": comparison.ci_high, "p_holm": comparison.p_adjusted,
                     "ratios": list(comparison.ratios)})
    return {"rounds": used, "family_size": family, "env": {"defaults": settings["defaults"], "rules": settings["rules"]},
            "test": "per op and size: paired per-round ratios t_defaults / t_rules; median speed-up, 95 % percentile "
                    "bootstrap CI, one-sided exact Wilcoxon (faster at all: min_effect 0), Holm over all op x size tests",
            "sizes": rows}


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def summary_text(summary: Mapping[str, Any]) -> str:
    lines = [f"per-size demonstration {summary['date']} commit {summary['commit']} load average "
             f"{summary['load_avg_at_start']}", f"command: {summary['command']}"]
    for library, part in summary["libraries"].items():
        lines.append(f"== {library}: {part['mpi_library']} on {part['nodes']} nodes {part['hosts']}")
        lines.append(f"sweep: {part['sweep_rounds']} rounds, {part['sweep_s']:.0f} s; rule file: {part['rule_file']}")
        for op, result in part["decisions"].items():
            lines.append(f"  {op}: {result['test_short']}")
            for size in result["sizes"]:
                gain = "" if size["gain"] is None else \
                    f" gain {size['gain']:+.1%} [{size['ci_low']:+.1%}, {size['ci_high']:+.1%}]"
                lines.append(f"    {size['bytes']:>9} B: {size['winner'] or 'keep the library choice'}"
                             f" (candidates {', '.join(size['candidates']) or 'none'}{gain})")
        validation = part.get("validation")
        if validation:
            lines.append(f"  validation, {validation['rounds']} interleaved rounds (defaults vs rules):")
            for row in validation["sizes"]:
                flag = "  SLOWER" if row["ci_high"] is not None and row["ci_high"] < 0 else ""
                deployed = "rule" if row.get("deployed") else "    "
                lines.append(f"    {row['op']:>14} {row['bytes']:>9} B {deployed} speed-up {row['speedup']:+.1%} "
                             f"[{row['ci_low']:+.1%}, {row['ci_high']:+.1%}] Holm p={row['p_holm']:.3g}{flag}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--libraries", default="openmpi,mpich")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--sizes", default=sizes_arg(SIZES))
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--top", type=int, default=2, help="candidates per size from the selection rounds")
    parser.add_argument("--rounds", type=int, default=0, help="sweep rounds (0: the fewest that allow a change)")
    parser.add_argument("--validation-rounds", type=int, default=10)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--validation-iters", type=int, default=0, help="iterations per validation process (0: --iters)")
    parser.add_argument("--budget-s", type=float, default=600.0, help="per library")
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    thresholds = Thresholds()
    rounds = args.rounds or rounds_for(len(sizes), args.top, thresholds.alpha)
    rng = np.random.default_rng(0)
    summary: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "commit": git_commit(),
        "command": shlex.join([sys.executable, "-m", "campaigns.tools.per_size_demo", *(argv or sys.argv[1:])]),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "thresholds": {"alpha": thresholds.alpha, "min_effect": thresholds.min_effect, "top": args.top},
        "libraries": {},
    }
    for library in args.libraries.split(","):
        directory = args.out / library
        directory.mkdir(parents=True, exist_ok=True)
        started = time.time()
        deadline = started + args.budget_s
        records = run_commbench(
            library, args.nodes,
            ["--op", ",".join(ops), "--sizes", sizes_arg(sizes), "--selections", "all", "--rounds", str(rounds),
             "--iters", str(args.iters), "--warmup", str(args.warmup)],
            directory / "sweep.jsonl", {**BASE_ENV[library], **SWEEP_ENV.get(library, {})},
            timeout=max(60.0, deadline - time.time()))
        sweep_s = time.time() - started
        results = [decide_per_size(load_sweep([r for r in records if r["op"] == op]), thresholds=thresholds,
                                   top=args.top) for op in ops]
        decisions = {r.op: {**r.model_dump(mode="json"), "test_short": f"family {r.family_size} tests, "
                            f"{r.selection_rounds} selection + {r.confirmation_rounds} confirmation rounds"}
                     for r in results}
        write_atomic(directory / "decisions.json", json.dumps(decisions, indent=1) + "\n")
        evidence = [f"commcamp per-size demonstration {summary['date']} commit {summary['commit']}",
                    *(f"{r.op}: {r.test}" for r in results)]
        rule_file, rules_env = write_rules(library, results, directory, evidence)
        part: dict[str, Any] = {
            "mpi_library": records[0]["mpi_library"].splitlines()[0], "nodes": args.nodes,
            "hosts": sorted(set(records[0]["hostnames"])),
            "sweep_rounds": rounds, "sweep_s": sweep_s, "rule_file": None if rule_file is None else str(rule_file),
            "rules_env": rules_env, "decisions": decisions,
            "selection_matrix": {f"{r['op']}/{r['bytes']}/{r['selection']['name']}": float(np.median(r["round_medians"]))
                                 for r in records},
        }
        if rule_file is not None:
            validation = validate(library, args.nodes, ops, sizes, rules_env, args.validation_rounds,
                                  args.validation_iters or args.iters,
                                  args.warmup, directory, deadline, rng)
            by_op = {r.op: r for r in results}
            for row in validation["sizes"]:
                at = by_op[row["op"]].at(row["bytes"])
                row["deployed"] = at is not None and at.selection is not None
            part["validation"] = validation
            part["regressions"] = [row for row in validation["sizes"]
                                   if row["deployed"] and row["ci_high"] is not None and row["ci_high"] < 0]
        summary["libraries"][library] = part
    write_atomic(args.out / "summary.json", json.dumps(summary, indent=1) + "\n")
    text = summary_text(summary)
    write_atomic(args.out / "summary.txt", text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
