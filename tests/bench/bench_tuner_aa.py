"""A/A benchmark of the tuner's finalization on the local Slurm cluster: how often it recommends a change
when every candidate is the baseline itself.

    .venv/bin/python tests/bench/bench_tuner_aa.py [--tunes 30] [--candidates 2] [--library openmpi|mpich]
                                                   [--output results/bench/tuner_aa_localslurm.json]
    python3 tests/bench/bench_tuner_aa.py --spec tools/tuning/gpu-aa-x2.yaml --set commbench=PATH
                                          [--workers 6] [--until UNIX_TIME] --output OUT.json

With --spec the scope is that TuningSpec (e.g. a GPU pair through mpirun, issue 17 item 2): no Slurm cluster,
the spec's launcher as it is; --workers tunes run at once, each with its own runs (on a 2-GPU machine they
share the GPUs: their runs interleave baseline and candidate alike, so the contention is noise the rule must
absorb, not a difference between candidates); no tune starts when the longest tune so far would not end
before --until.

Each tune is one real finalization (tuners.finalize.finalize through campaigns.tuning.session.prepare: the launcher
executor, srun per run, commbench allreduce between 2 nodes, 1 rank each) of an unplanted scope: the
baseline is the site's defaults (localslurm pins nothing for these knobs) and every candidate's
environment is identical to it (distinct only by the trial number it carries). Whatever finalization
accepts is therefore a false change. Thresholds are the tuner's defaults (alpha 0.01, minimum effect 3 %,
Holm over candidates x (overall + each size bucket)); sizes 64 KiB and 1 MiB, one bucket each.

Reported: tunes, tunes with any change (overall or a bucket), that rate's Clopper-Pearson 95 % interval
(tuners.bench_finalize.clopper_pearson), the rounds each tune ran, and per tune the closest comparison of any
decision (smallest Holm-adjusted p, with its decision) so the margin to a false change is visible, finalization's
notes (failed runs: a baseline that failed drops its round, a candidate that failed is left untested) and the
untested candidates.
A tune that the cluster aborts (EvaluationAborted, an OS or subprocess error) is recorded as aborted, not
counted, and the next one starts. The result is rewritten after every tune ("complete": false until the last).

Without a running cluster in the environment (SLURM_CONF) the script starts one (fixtures_slurm), 3 nodes.
Cost: rounds x (candidates + 1) commbench runs per tune (12 x 3 = 36 with the defaults), about 1 s each
on the local cluster: 30 tunes take 20-30 minutes on an idle machine (44 min at load average 7-17 on 2 cores).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, slurm_cluster_env, write_result


def spec_document(library: str, work: Path) -> dict[str, Any]:
    return {"site": "localslurm", "system": "localslurm:debug", "environ": library, "library": library,
            "op": "allreduce", "nodes": 2, "tasks_per_node": 1, "sizes": [65536, 1048576], "sizes_per_bucket": 1,
            "iters": 20, "warmup": 2, "bench_timeout_s": 60, "time_limit_s": 120,
            "knobs": ["OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf"] if library == "openmpi"
            else ["MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"],
            "executor": "launcher", "launcher": ["srun"], "db": f"sqlite:///{work / 'study.db'}",
            "publish_dir": None, "runs_dir": str(work / "runs")}


def write_summary(args: argparse.Namespace, argv: list[str], setup: Any, tunes: list[dict[str, Any]],
                  load_at_start: list[float], started: float) -> str:
    """Writes the result so far (all tunes, finished or aborted) and returns its one-line summary."""
    from tuners.bench_finalize import clopper_pearson

    thresholds = setup.spec.finalize.thresholds()

    finished = [t for t in tunes if "aborted" not in t]
    false_changes = sum(bool(t["changes"]) for t in finished)
    interval = clopper_pearson(false_changes, len(finished)) if finished else None
    rounds = sorted({t["rounds_used"] for t in finished})
    write_result(args.output, argv, {
        "what": "A/A: finalizations whose candidates are the baseline environment itself, "
                + (f"scope {args.spec}" if args.spec else "on the local Slurm cluster")
                + "; every accepted change is a false change",
        "complete": len(tunes) == args.tunes, "workers": args.workers, "load_avg_at_start": load_at_start,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "library": args.library, "library_version": setup.versions.get(args.library), "spec": setup.spec.model_dump(
            mode="json"), "baseline_env": baseline_env(setup), "candidates_per_tune": args.candidates,
        "alpha": thresholds.alpha, "min_effect": thresholds.min_effect,
        "tunes": len(finished), "tunes_aborted": len(tunes) - len(finished), "tunes_with_a_false_change": false_changes,
        "false_change_rate_ci95": interval, "rounds_used_per_tune": rounds,
        "seconds": round(time.time() - started, 1), "per_tune": sorted(tunes, key=lambda t: t["tune"])})
    return (f"{false_changes} of {len(finished)} tunes recommended a change ({len(tunes) - len(finished)} aborted); "
            f"Clopper-Pearson 95 %: {interval}; rounds used per tune: {rounds}")


def run_tune(setup: Any, tune: int, candidates: int) -> dict[str, Any]:
    """One finalization of `candidates` copies of the baseline: its outcome, or why it was aborted."""
    from tuners.evaluation import EvaluationAborted
    from tuners.finalize import Candidate, finalize

    started = time.time()
    baseline = baseline_env(setup)
    copies = [Candidate(dict(baseline), trial_number=i + 1) for i in range(candidates)]
    try:
        report = finalize(setup.evaluator, baseline, copies, setup.buckets, thresholds=setup.spec.finalize.thresholds(),
                          needs_validation=setup.space.unsafe_changes, seed=tune)
    except (EvaluationAborted, OSError, subprocess.SubprocessError) as exc:
        # the cluster, not finalization, failed (a failed run inside finalize is a note, not this):
        # recorded as an aborted tune, not counted, and the benchmark goes on
        return {"tune": tune, "aborted": f"{type(exc).__name__}: {exc}"}
    # the closest test of ANY decision (a change in a size bucket is a false change too), not the overall one's
    tested = [c for d in report.decisions for c in d.comparisons if c.tested]
    closest = min(tested, key=lambda c: (c.p_adjusted, -(c.gain or 0.0)), default=None)
    return {"tune": tune, "rounds_run": report.rounds_run, "rounds_used": report.rounds_used,
            "changes": [d.name for d in report.decisions if d.change], "notes": list(report.notes),
            "untested": [f"trial {c.candidate.trial_number}: {c.reason}"
                         for c in report.overall.comparisons if not c.tested],
            "closest": None if closest is None else {
                "decision": closest.decision, "gain": closest.gain, "p_adjusted": closest.p_adjusted,
                "ratios": closest.ratios},
            "seconds": round(time.time() - started, 1)}


def baseline_env(setup: Any) -> dict[str, str]:
    return setup.space.env_from_values({n: setup.catalog[n].default for n in setup.space.knob_names})


def tune_all(args: argparse.Namespace, argv: list[str], document: dict[str, Any], env: dict[str, str],
             work: Path) -> str:
    """Runs the tunes, `args.workers` at a time (each worker its own setup and runs), rewriting the result
    after every tune so that a run cut short keeps what it measured ("complete": false)."""
    from campaigns.tuning.session import prepare
    from campaigns.tuning.spec import TuningSpec

    started = time.time()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    setups: list[Any] = []
    for worker in range(args.workers):  # the first one's probe run (if any) gives the others the library version
        setups.append(prepare(TuningSpec.model_validate({**document, "runs_dir": str(work / f"runs-{worker}")}),
                              environ=env, ingest=False))
        document = {**document, "library_version": setups[0].scope.library_version}
    tunes: list[dict[str, Any]] = []
    summary = "no tune ran"
    next_tune = args.first_tune
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as pool:
        running: dict[concurrent.futures.Future[dict[str, Any]], int] = {}
        free = list(range(args.workers))
        while next_tune < args.first_tune + args.tunes or running:
            longest = max((t.get("seconds", 0.0) for t in tunes), default=0.0)
            while (free and next_tune < args.first_tune + args.tunes
                   and (args.until is None or time.time() + longest < args.until)):
                worker = free.pop()
                running[pool.submit(run_tune, setups[worker], next_tune, args.candidates)] = worker
                next_tune += 1
            if not running:
                break
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                free.append(running.pop(future))
                result = future.result()
                tunes.append(result)
                print(f"tune {result['tune'] + 1}: " + (
                    f"aborted ({result['aborted']})" if "aborted" in result else
                    f"rounds {result['rounds_used']}, changes {result['changes'] or 'none'}"), flush=True)
                summary = write_summary(args, argv, setups[0], tunes, load_at_start, started)
    return summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tunes", type=int, default=30)
    parser.add_argument("--candidates", type=int, default=2, help="copies of the baseline per finalization")
    parser.add_argument("--library", choices=["openmpi", "mpich"], default="openmpi")
    parser.add_argument("--spec", type=Path, help="the scope as a TuningSpec YAML, run with its own launcher "
                                                  "(no Slurm cluster); --library is then the spec's")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="--spec: a field of the spec replaced (e.g. commbench=build/gpu/cuda/commbench)")
    parser.add_argument("--workers", type=int, default=1, help="tunes run at once")
    parser.add_argument("--first-tune", type=int, default=0, help="number (and seed) of the first tune: runs "
                                                                   "whose results are read together differ")
    parser.add_argument("--until", type=float, help="unix time after which no tune starts that would not end "
                                                    "before it (judged by the longest tune so far)")
    parser.add_argument("--output", type=Path, default=REPO / "results" / "bench" / "tuner_aa_localslurm.json")
    args = parser.parse_args(argv[1:])
    if args.workers < 1 or args.tunes < 1 or args.candidates < 1:
        parser.error("--workers, --tunes and --candidates must be at least 1")
    for item in args.set:
        if "=" not in item or not args.spec:
            parser.error(f"--set {item!r}: give FIELD=VALUE, and --spec")

    from campaigns.tuning.spec import load_spec
    from campaigns.tuning.workers import slurm_launcher
    from campaigns.tuning.spec import TuningSpec

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        if args.spec:
            try:
                spec = load_spec(args.spec)
                document = {**spec.model_dump(mode="json", exclude_unset=True),
                            **dict(item.split("=", 1) for item in args.set),
                            "db": f"sqlite:///{work / 'study.db'}", "publish_dir": None}
                TuningSpec.model_validate(document)
            except ValueError as exc:
                print(f"bench_tuner_aa: {args.spec}: {exc}", file=sys.stderr)
                return 2
            args.library = spec.library.value
            summary = tune_all(args, argv, document, dict(os.environ), work)
        else:
            with slurm_cluster_env() as env:
                os.environ.update(env)  # srun and sinfo of the executor find this cluster
                document = spec_document(args.library, work)
                # srun -N 2 -n 2 with the site's MPI plugin (a bare srun would start one singleton rank)
                document["launcher"] = slurm_launcher(TuningSpec.model_validate(document), inside_allocation=False)
                summary = tune_all(args, argv, document, env, work)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
