"""Per-size demonstration (issue 13, item 5): sweep, decide, write the rule files, validate them.

    python3 -m campaigns.tools.per_size_demo --out DIR [--libraries openmpi,mpich] [--ops ...] [--sizes ...]
        [--nodes 3] [--rounds R] [--validation-rounds V] [--iters I] [--validation-iters J] [--budget-s S]
    python3 -m campaigns.tools.per_size_demo --out DIR --libraries nccl --launcher mpirun --ranks 2 \
        --commbench BUILD/cuda/commbench --plugin BUILD/tuner/libnccl-tuner-commcamp.so [--env K=V ...]

MPI libraries run where `srun` reaches a Slurm cluster (the local one: eval "$(site_configs/localslurm/
cluster/cluster.sh env)"), one rank per node, commbench's `mpi` transport. NCCL runs on one GPU machine
under `mpirun -np RANKS` (one GPU per rank), commbench's `ccl` transport, forced selections through
commcamp's tuner plugin; its rule file is the plugin's nccl_tuner.conf. Per library:
1. sweep: ONE commbench process per library, `--selections all --rounds R`: every op and size, the
   library's own choice and every forced selection, interleaved round by round (DIR/<lib>/sweep.jsonl);
2. per op, the per-size stage (tuners/per_size.py: candidates from the even rounds, decisions on the
   odd rounds, Holm over every size x candidate of the op) -> DIR/<lib>/decisions.json;
3. the library's rule file for all ops (tuners/rule_files.py) -> DIR/<lib>/rules.*;
4. validation: V rounds, each running the library's defaults and the deployed rule file (two
   processes, shuffled order per round); per op and size the median per-round speed-up of the rules
   over the defaults with its CI and the one-sided Wilcoxon test of finalize
   (decide_paired, min_effect 0 here: "is it faster at all", Holm over all op x size tests) ->
   DIR/<lib>/validation.json. A size where a rule is deployed and the CI lies wholly below 0 is
   reported as a regression.
DIR/summary.json and summary.txt hold the selection matrix, the decisions, the validation and the
provenance (command, date, commit, versions, hosts).
"""

from __future__ import annotations

import argparse
import dataclasses
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
from tuners.per_size import PerSizeResult, decide_per_size, format_config, load_sweep, plugin_rows, rounds_for
from tuners.writers import write_atomic

REPO = Path(__file__).resolve().parents[2]
OPS = ("allreduce", "alltoall", "allgather", "bcast", "reduce_scatter")
SIZES = (8, 64, 512, 4096, 32768, 262144, 2097152, 16777216)  # 8 B .. 16 MiB, factor 8
SRUN_MPI = {"openmpi": "pmix", "mpich": "pmi2"}
LIBRARIES = ("openmpi", "mpich", "nccl")
# MPICH across the netns "nodes" must use TCP, not shared memory (cluster.sh).
BASE_ENV: dict[str, dict[str, str]] = {"openmpi": {}, "mpich": {"UCX_TLS": "tcp,self"}, "nccl": {}}
# NVLink multicast can put a shared host's GPUs out of service: off in every NCCL process.
NCCL_NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclasses.dataclass(frozen=True)
class Launch:
    """How one library's commbench processes start: srun across Slurm nodes (MPI libraries) or mpirun on
    this machine (NCCL, one GPU per rank), and the environment every process of it gets."""

    library: str
    launcher: str  # "srun" | "mpirun"
    nodes: int
    ranks: int
    commbench: Path
    plugin: Path | None  # commcamp's NCCL tuner plugin (forced selections and the deployed rules)
    extra_env: Mapping[str, str]

    @property
    def transport(self) -> str:
        return "ccl" if self.library == "nccl" else "mpi"

    def base_env(self) -> dict[str, str]:
        env = {**BASE_ENV[self.library], **self.extra_env}
        return {**NCCL_NO_MULTICAST, **env} if self.library == "nccl" else env

    def sweep_env(self) -> dict[str, str]:
        if self.library == "nccl":
            return {**self.base_env(), "NCCL_TUNER_PLUGIN": str(self.plugin)}
        return {**self.base_env(), **SWEEP_ENV.get(self.library, {})}

    def argv(self, env: Mapping[str, str]) -> list[str]:
        if self.launcher == "srun":
            return ["srun", f"--mpi={SRUN_MPI[self.library]}", "-N", str(self.nodes), "-n", str(self.ranks),
                    "--kill-on-bad-exit=1", str(self.commbench)]
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        exported = [arg for key in sorted(env) for arg in ("-x", key)]
        return ["mpirun", *root, "-np", str(self.ranks), "--bind-to", "none", *exported, str(self.commbench)]


def default_commbench(library: str) -> Path:
    return REPO / "build" / "bench" / f"cpu-{library}" / "commbench"


def run_commbench(launch: Launch, args: Sequence[str], output: Path, env: Mapping[str, str],
                  timeout: float) -> list[dict[str, Any]]:
    """One launch of commbench (every rank); its valid result records."""
    output.unlink(missing_ok=True)
    cmd = [*launch.argv(env), "--transport", launch.transport, "--output", str(output), *args]
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return read_results(output)


def read_results(path: Path) -> list[dict[str, Any]]:
    """The valid result records of a commbench JSON Lines file."""
    records, problems = parse_record_lines(path.read_text(), str(path))
    if problems:
        raise RuntimeError(f"{path}: {problems[:3]}")
    return [r for r in records if r["kind"] == "result"]


def sizes_arg(sizes: Sequence[int]) -> str:
    return ",".join(str(s) for s in sizes)


def write_rules(launch: Launch, results: Sequence[PerSizeResult], directory: Path,
                evidence: Sequence[str]) -> tuple[Path | None, dict[str, str]]:
    """The library's rule file and the environment that deploys it (None, {}: nothing to deploy)."""
    if not any(r.selection is not None for result in results for r in result.ranges):
        return None, {}
    library = launch.library
    if library == "nccl":
        path = directory / "nccl_tuner.conf"
        write_atomic(path, format_config([(evidence, [row for result in results for row in plugin_rows(result)])]))
        return path, {"NCCL_TUNER_PLUGIN": str(launch.plugin), "NCCL_TUNER_CONFIG_FILE": str(path.resolve())}
    if library == "openmpi":
        path = directory / "rules.coll_tuned"
        write_atomic(path, rule_files.ompi_rules_text(results, evidence))
        return path, {rule_files.OMPI_MCA[0]: "1", rule_files.OMPI_MCA[1]: str(path.resolve())}
    path = directory / "rules.mpich_coll.json"
    write_atomic(path, rule_files.mpich_json_text(results, evidence))
    return path, {rule_files.MPICH_JSON_ENV: str(path.resolve())}


def validate(launch: Launch, ops: Sequence[str], sizes: Sequence[int], rules_env: Mapping[str, str],
             rounds: int, iters: int, warmup: int, directory: Path, deadline: float,
             rng: np.random.Generator, global_env: Mapping[str, str] | None = None,
             deploy_global: bool = False) -> dict[str, Any]:
    """Defaults vs deployed rules, interleaved (step 4 of the module docstring); stops at `deadline`.
    With `global_env` (the best single environment for the scope) a third setting runs in every round and
    the rules are also compared with it (its own Holm family)."""
    args = ["--op", ",".join(ops), "--sizes", sizes_arg(sizes), "--iters", str(iters), "--warmup", str(warmup)]
    # What is deployed: the rules, on top of the global environment when the sweep ran under it.
    deployed = {**launch.base_env(), **(global_env or {} if deploy_global else {}), **rules_env}
    settings = {"defaults": launch.base_env(), "rules": deployed}
    if global_env:
        settings["global"] = {**launch.base_env(), **global_env}
    times: dict[str, list[dict[tuple[str, int], float]]] = {name: [] for name in settings}
    for round_index in range(rounds):
        if time.time() > deadline:
            break
        for name in rng.permutation(list(settings)):
            records = run_commbench(launch, args, directory / f"validation-{round_index}-{name}.jsonl",
                                    settings[name],
                                    timeout=max(60.0, deadline - time.time() + 60))
            times[name].append({(r["op"], r["bytes"]): r["stats"]["median_us"] for r in records})
    used = min(len(runs) for runs in times.values())
    result: dict[str, Any] = {
        "rounds": used, "env": settings,
        "test": "per op and size: paired per-round ratios t_reference / t_rules; median speed-up, 95 % order-"
                "statistic CI, one-sided exact Wilcoxon (faster at all: min_effect 0), Holm over all op x size tests"}
    result.update(compare_rules(times, "defaults", used))
    if "global" in times:
        result["against_global"] = compare_rules(times, "global", used)
    return result


def compare_rules(times: Mapping[str, Sequence[Mapping[tuple[str, int], float]]], reference: str,
                  used: int) -> dict[str, Any]:
    """The deployed rules against `reference` per op and size over the first `used` rounds."""
    keys = sorted(set(times[reference][0]) if used else set())
    log_ratios = {
        f"{op}/{size}": {0: np.log([times[reference][i][op, size] / times["rules"][i][op, size] for i in range(used)])}
        for op, size in keys
    }
    candidate = [Candidate({"rules": "deployed"})]
    decisions, family = decide_paired({}, {k: candidate for k in log_ratios}, log_ratios,
                                      {k: {} for k in log_ratios}, Thresholds(min_effect=0.0))
    rows = []
    for key, decision in decisions.items():
        comparison = decision.comparisons[0]
        rows.append({"op": key.split("/")[0], "bytes": int(key.split("/")[1]), "speedup": comparison.gain,
                     "ci_low": comparison.ci_low, "ci_high": comparison.ci_high, "p_holm": comparison.p_adjusted,
                     "ratios": list(comparison.ratios)})
    return {"reference": reference, "family_size": family, "sizes": rows}


def key_values(items: Sequence[str], where: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{where}: {item!r} is not KEY=VALUE")
        pairs.append((key, value))
    return pairs


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def summary_text(summary: Mapping[str, Any]) -> str:
    lines = [f"per-size demonstration {summary['date']} commit {summary['commit']} load average "
             f"{summary['load_avg_at_start']}", f"command: {summary['command']}"]
    for library, part in summary["libraries"].items():
        versions = " ".join(f"{k} {v}" for k, v in part.get("versions", {}).items())
        lines.append(f"== {library}: {part['mpi_library']} {versions} on {part['nodes']} nodes, "
                     f"{part.get('ranks', part['nodes'])} ranks {part['hosts']}")
        lines.append(f"sweep: {part['sweep_rounds']} rounds, {part['sweep_s']:.0f} s; rule file: {part['rule_file']}")
        for op, result in part["decisions"].items():
            lines.append(f"  {op}: {result['test_short']}")
            for size in result["sizes"]:
                gain = "" if size["gain"] is None else \
                    f" gain {size['gain']:+.1%} [{size['ci_low']:+.1%}, {size['ci_high']:+.1%}]"
                lines.append(f"    {size['bytes']:>9} B: {size['winner'] or 'keep the library choice'}"
                             f" (candidates {', '.join(size['candidates']) or 'none'}{gain})")
        validation = part.get("validation")
        comparisons = [validation, validation.get("against_global")] if validation else []
        for comparison in filter(None, comparisons):
            lines.append(f"  validation, {validation['rounds']} interleaved rounds ({comparison.get('reference', 'defaults')} "
                         "vs rules):")
            for row in comparison["sizes"]:
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
    parser.add_argument("--launcher", choices=("srun", "mpirun"), default="srun")
    parser.add_argument("--ranks", type=int, default=0, help="ranks (0: one per node)")
    parser.add_argument("--commbench", type=Path, help="commbench binary (default: the checkout's cpu-<library> build)")
    parser.add_argument("--plugin", type=Path, help="nccl: commcamp's tuner plugin (libnccl-tuner-commcamp.so)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="added to every process's environment (e.g. NCCL_P2P_DISABLE=1)")
    parser.add_argument("--selections", default="all", help="commbench --selections of the sweep")
    parser.add_argument("--sweep-from", type=Path,
                        help="take the sweep from DIR/<library>/sweep.jsonl of an earlier run instead of running it")
    parser.add_argument("--global-env", type=Path,
                        help="KEY=VALUE lines: the best single environment of the scope, validated as a third setting")
    parser.add_argument("--under-global", action="store_true",
                        help="sweep and deploy the rules under --global-env (deployed = that environment + the rules)")
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
    if args.under_global and not args.global_env:
        parser.error("--under-global needs --global-env")
    extra_env = dict(key_values(args.env, "--env"))
    global_env = dict(key_values(args.global_env.read_text().split(), str(args.global_env))) if args.global_env else None
    for library in args.libraries.split(","):
        if library not in LIBRARIES:
            parser.error(f"--libraries: {library!r} is not one of {', '.join(LIBRARIES)}")
        if library == "nccl" and (args.plugin is None or not args.plugin.is_file()):
            parser.error(f"--plugin: nccl needs commcamp's built tuner plugin (got {args.plugin})")
        nodes = args.nodes if args.launcher == "srun" else 1  # mpirun: this machine
        launch = Launch(library, args.launcher, nodes, args.ranks or nodes,
                        args.commbench or default_commbench(library), args.plugin, extra_env)
        directory = args.out / library
        directory.mkdir(parents=True, exist_ok=True)
        started = time.time()
        deadline = started + args.budget_s
        if args.sweep_from:
            records = read_results(args.sweep_from / library / "sweep.jsonl")
            rounds = len(records[0]["round_medians"])
        else:
            records = run_commbench(
                launch,
                ["--op", ",".join(ops), "--sizes", sizes_arg(sizes), "--selections", args.selections,
                 "--rounds", str(rounds), "--iters", str(args.iters), "--warmup", str(args.warmup)],
                directory / "sweep.jsonl", {**launch.sweep_env(), **(global_env if args.under_global else {})},
                timeout=max(60.0, deadline - time.time()))
        sweep_s = time.time() - started
        if library == "mpich":  # an algorithm whose restriction the layout breaks ran MPICH's own choice
            records = rule_files.mpich_restrict_sweep(records)[0]
        results = [decide_per_size(load_sweep([r for r in records if r["op"] == op]), thresholds=thresholds,
                                   top=args.top) for op in ops]
        decisions = {r.op: {**r.model_dump(mode="json"), "test_short": f"family {r.family_size} tests, "
                            f"{r.selection_rounds} selection + {r.confirmation_rounds} confirmation rounds"}
                     for r in results}
        write_atomic(directory / "decisions.json", json.dumps(decisions, indent=1) + "\n")
        evidence = [f"commcamp per-size demonstration {summary['date']} commit {summary['commit']}",
                    *(f"{r.op}: {r.test}" for r in results)]
        rule_file, rules_env = write_rules(launch, results, directory, evidence)
        part: dict[str, Any] = {
            "mpi_library": records[0]["mpi_library"].splitlines()[0], "nodes": nodes, "ranks": launch.ranks,
            "versions": records[0].get("versions", {}), "launch": {key: str(value) if isinstance(value, Path) else value
                       for key, value in dataclasses.asdict(launch).items()},
            "hosts": sorted(set(records[0]["hostnames"])),
            "sweep_rounds": rounds, "sweep_s": sweep_s, "rule_file": None if rule_file is None else str(rule_file),
            "rules_env": rules_env, "decisions": decisions,
            "selection_matrix": {f"{r['op']}/{r['bytes']}/{r['selection']['name']}": float(np.median(r["round_medians"]))
                                 for r in records},
        }
        if rule_file is not None:
            validation = validate(launch, ops, sizes, rules_env, args.validation_rounds,
                                  args.validation_iters or args.iters,
                                  args.warmup, directory, deadline, rng, global_env, args.under_global)
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
