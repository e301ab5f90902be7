"""Orchestration overhead per tuning trial on the local Slurm cluster: what a trial costs beyond commbench's
own run time, for each way the tuner runs commbench there.

    .venv/bin/python tests/bench/bench_overhead.py [--trials 20] [--paths srun,salloc,reframe] [--nodes 2]
                                                   [--output results/reliability/overhead.json]

Paths (the real tuner, in this process: campaigns.tuning.session.prepare + make_tuner(...).run() on a SQLite study):
  srun     launcher executor, `srun` making an allocation per trial (commcamp tune on a Slurm site)
  salloc   launcher executor inside one allocation: srun starts a job step per trial (commcamp pretune, and
           each of `commcamp tune --workers N`), this script re-run under `salloc`
  reframe  ReFrame executor: one `reframe` run per trial, the commbench check as a Slurm batch job (sbatch,
           state polling through the sacct shim)
commbench is tiny (allreduce, 8 B, 5 iterations), so nearly all of a trial is orchestration.

Measured per trial:
  cadence    time between the ends of consecutive trials (Optuna's datetime_complete): everything a trial costs
  executor   time the evaluator spent in the executor (CommbenchEvaluator.durations_s)
  commbench  commbench's own run time: srun/salloc, a wrapper around the binary takes the time per rank
             (first start to last end); reframe, the job script's prerun/postrun take the time around the
             srun step (so it includes the step launch, ~0.1 s)
  overhead   cadence - commbench (the target: <= 2 s)
The first trial is left out of the medians (imports, study creation, ReFrame's build). The ReFrame path also
takes ReFrame's start-up apart (5 runs of `reframe ... -l` with the same selection: imports, loading and
instantiating the checks, and within that ReFrame's own deprecation warnings, which walk the stack).

Without a running cluster in the environment (SLURM_CONF) the script starts one (fixtures_slurm), 3 nodes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, slurm_cluster_env, write_result

COMMBENCH = REPO / "build" / "bench" / "cpu-openmpi" / "commbench"
TIMING_WRAPPER = """#!/bin/sh
start=$(date +%s.%N)
{commbench} "$@"
code=$?
echo "$start $(date +%s.%N)" > "cbtime.${{SLURM_PROCID:-0}}"
exit $code
"""


def spec_document(path: str, trials: int, nodes: int, work: Path) -> dict[str, Any]:
    return {"site": "localslurm", "system": "localslurm:debug", "environ": "openmpi", "library": "openmpi",
            "library_version": "4.1.4", "op": "allreduce", "nodes": nodes, "tasks_per_node": 2 // nodes,
            "sizes": [8], "sizes_per_bucket": 1, "iters": 5, "warmup": 1,
            "knobs": ["OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf"], "trials": trials,
            "executor": "reframe" if path == "reframe" else "launcher", "launcher": None if path == "reframe" else
            ["srun"], "db": f"sqlite:///{work / 'study.db'}", "publish_dir": None, "finalize": {"enabled": False},
            "runs_dir": str(work / "runs")}


REFRAME_SPANS: list[tuple[float, float]] = []  # (start, end) of each reframe process


def reframe_times_its_step() -> None:
    """The ReFrame path: the job script prints the time around its srun step (prerun/postrun commands), and
    each reframe process's start and end are noted."""
    from campaigns.reframe import runner
    from campaigns.tuning import executors

    command = runner.Invocation.command

    def timed(self: runner.Invocation, campaign: Any, prefix: Path) -> list[str]:
        cmd = command(self, campaign, prefix)
        return [*cmd[:-1], "-S", "commbench_run.prerun_cmds=echo CB_T0 $(date +%s.%N)",
                "-S", "commbench_run.postrun_cmds=echo CB_T1 $(date +%s.%N)", cmd[-1]]

    runner.Invocation.command = timed  # type: ignore[method-assign]
    run = subprocess.run

    def noted(*args: Any, **kwargs: Any) -> Any:
        started = time.time()
        try:
            return run(*args, **kwargs)
        finally:
            if "reframe" in str(args[0][0]):
                REFRAME_SPANS.append((started, time.time()))

    executors.subprocess.run = noted  # type: ignore[attr-defined]


def reframe_breakdown(runs: Path) -> dict[str, list[float]]:
    """Per reframe run: start-up (process start to session start: imports, configuration, loading and
    instantiating the checks), the session (job submission, the job, state polling, sanity, performance),
    the job's srun step (commbench with its launch) and the exit (report, cleanup)."""
    parts: dict[str, list[float]] = {"startup": [], "session": [], "step": [], "exit": [], "run_dir_kib": []}
    prefixes = sorted(runs.glob("reframe-*/rfm-*"), key=lambda p: int(p.name.split("-")[1]))
    for prefix, (start, end) in zip(prefixes, REFRAME_SPANS, strict=True):
        session = json.loads((prefix / "report.json").read_text())["session_info"]
        parts["startup"].append(session["time_start_unix"] - start)
        parts["session"].append(session["time_elapsed"])
        parts["exit"].append(end - session["time_end_unix"])
        # what one test case leaves on disk (the first run also keeps its build for the others)
        parts["run_dir_kib"].append(sum(f.stat().st_size for f in prefix.rglob("*") if f.is_file()) / 1024)
    parts["step"] = commbench_seconds("reframe", runs)
    return parts


# ReFrame's start-up, taken apart: `reframe ... -l` (load the configuration and the checks, select the test
# case, no run) with its imports, its check loading and ReFrame's deprecation warnings timed.
STARTUP_PROBE = """
import atexit, json, sys, time
started = time.perf_counter()
import reframe.core.variables as variables
import reframe.frontend.loader as loader
spent = {"deprecation_s": 0.0, "deprecation_calls": 0}
warn = variables.user_deprecation_warning
def timed_warn(*args, **kwargs):
    t = time.perf_counter(); warn(*args, **kwargs)
    spent["deprecation_s"] += time.perf_counter() - t; spent["deprecation_calls"] += 1
variables.user_deprecation_warning = timed_warn
load_all = loader.RegressionCheckLoader.load_all
def timed_load_all(self, *args, **kwargs):
    t = time.perf_counter(); checks = load_all(self, *args, **kwargs)
    spent["load_checks_s"] = time.perf_counter() - t; spent["test_instances"] = len(checks); return checks
loader.RegressionCheckLoader.load_all = timed_load_all
spent["import_s"] = time.perf_counter() - started
atexit.register(lambda: print("STARTUP " + json.dumps({**spent, "total_s": time.perf_counter() - started}),
                              file=sys.stderr))
sys.argv = ["reframe"] + sys.argv[1:]
from reframe.frontend.cli import main
main()
"""


def reframe_startup(repeats: int, work: Path) -> dict[str, float]:
    """Medians over `repeats` runs of STARTUP_PROBE with the ReFrame path's selection (see above)."""
    from campaigns.model.spec import load_campaign

    spec = work / "campaign.yaml"
    spec.write_text(json.dumps({"name": "probe", "site": "localslurm", "system": "localslurm:debug",
                                "environments": ["openmpi"], "node_counts": [2],
                                "checks": [{"check": "commbench_run", "ops": ["allreduce"]}]}))
    from campaigns.reframe.runner import plan_invocations

    campaign = load_campaign(spec)
    (invocation,) = plan_invocations(campaign.cases())
    cmd = [a for a in invocation.command(work / "probe") if a != "-r"] + ["-l"]
    probes = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", STARTUP_PROBE, *cmd[1:]], capture_output=True, text=True,
                              check=True, cwd=REPO)
        probes.append(json.loads(done.stderr.split("STARTUP ", 1)[1]))
    return {name: statistics.median(p[name] for p in probes) for name in probes[0]}


def commbench_seconds(path: str, runs: Path) -> list[float]:
    """commbench's own time per run, in run order."""
    times = []
    if path == "reframe":
        for prefix in sorted(runs.glob("reframe-*/rfm-*"), key=lambda p: int(p.name.split("-")[1])):
            (out,) = prefix.glob("output/**/commbench_run_*/rfm_job.out") or prefix.glob("stage/**/rfm_job.out")
            marks = dict(line.split()[:2] for line in out.read_text().splitlines() if line.startswith("CB_T"))
            times.append(float(marks["CB_T1"]) - float(marks["CB_T0"]))
        return times
    for run in sorted(runs.glob("run-*"), key=lambda p: (p / "command.txt").stat().st_mtime_ns):
        spans = [tuple(map(float, f.read_text().split())) for f in run.glob("cbtime.*")]
        times.append(max(end for _, end in spans) - min(start for start, _ in spans))
    return times


def measure(path: str, trials: int, nodes: int, work: Path) -> dict[str, Any]:
    from campaigns.tuning.spec import TuningSpec
    from campaigns.tuning.session import make_tuner, prepare
    from campaigns.tuning.workers import slurm_launcher
    from tuners.study import is_counted

    document = spec_document(path, trials, nodes, work)
    if path != "reframe":
        wrapper = work / "commbench"
        wrapper.write_text(TIMING_WRAPPER.format(commbench=COMMBENCH))
        wrapper.chmod(0o755)
        document["commbench"] = str(wrapper)
        document["launcher"] = slurm_launcher(TuningSpec.model_validate(document), inside_allocation=path == "salloc")
    else:
        reframe_times_its_step()
    setup = prepare(TuningSpec.model_validate(document))
    started = time.monotonic()
    study = make_tuner(setup).run()
    wall = time.monotonic() - started
    done = sorted((t for t in study.trials if is_counted(t)), key=lambda t: t.datetime_complete)
    failed = [t.user_attrs.get("fail_reason") for t in done if t.state.name != "COMPLETE"]
    ends = [t.datetime_complete.timestamp() for t in done]
    cadence = [b - a for a, b in zip(ends, ends[1:])]
    executor = setup.evaluator.durations_s
    commbench = commbench_seconds(path, work / "runs")
    steady = slice(1, None)  # trial 0 pays for imports, study creation and (ReFrame) the build
    overhead = [c - b for c, b in zip(cadence, commbench[steady])]
    result = {"path": path, "trials": len(done), "failed": failed, "wall_s": round(wall, 3),
              "launcher": document.get("launcher"),
              "median_s": {"cadence": statistics.median(cadence), "executor": statistics.median(executor[steady]),
                           "commbench": statistics.median(commbench[steady]), "overhead": statistics.median(overhead)},
              "max_overhead_s": max(overhead),
              "per_trial_s": {"cadence": cadence, "executor": executor, "commbench": commbench}}
    if path == "reframe":
        parts = reframe_breakdown(work / "runs")
        result["reframe_median_s"] = {name: statistics.median(values[steady]) for name, values in parts.items()}
        result["per_trial_s"]["reframe"] = parts
        result["reframe_startup_median"] = reframe_startup(5, work)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--paths", default="srun,salloc,reframe")
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=2)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--inner", help=argparse.SUPPRESS)  # one path, run here (salloc: inside the allocation)
    args = parser.parse_args()
    if args.inner:
        with tempfile.TemporaryDirectory(prefix=f"overhead-{args.inner}-") as work:
            print(json.dumps(measure(args.inner, args.trials, args.nodes, Path(work))))
        return 0
    results = []
    with slurm_cluster_env() as env:
        for path in args.paths.split(","):
            inner = [sys.executable, __file__, "--inner", path, "--trials", str(args.trials), "--nodes", str(args.nodes)]
            if path == "salloc":
                inner = ["salloc", "-N", str(args.nodes), f"--ntasks-per-node={2 // args.nodes}", "-p",
                         env.get("LOCALSLURM_PARTITION", "debug"), *inner]
            done = subprocess.run(inner, env=env, capture_output=True, text=True, timeout=3600, check=False, cwd=REPO)
            if done.returncode != 0:
                raise SystemExit(f"{path}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{'path':8} {'trials':>6} {'cadence':>8} {'executor':>9} {'commbench':>10} {'overhead':>9}  (median s)")
    for r in results:
        m = r["median_s"]
        print(f"{r['path']:8} {r['trials']:6d} {m['cadence']:8.3f} {m['executor']:9.3f} {m['commbench']:10.3f} "
              f"{m['overhead']:9.3f}")
        if "reframe_median_s" in r:
            print("         reframe (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in r["reframe_median_s"].items()))
            print("         reframe start-up, `reframe -l` (median): " + ", ".join(
                f"{k} {v:.3f}" for k, v in r["reframe_startup_median"].items()))
    if args.output:
        write_result(args.output, sys.argv, {"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
