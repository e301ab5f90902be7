"""Tuning demonstrations, one phase per call, with a deadline: what tools/tuning/gpu-demo.sh runs.

    python3 -m campaigns.tools.tuning_demo CONFIG.yaml --phase NAME --out DIR [--until UNIX_TIME]

CONFIG (tools/tuning/gpu-demo.yaml on the GPU machine, tools/tuning/gpu-demo-cpu.yaml for the same
plumbing on a CPU machine) has `common` TuningSpec fields, an `environment` for every launch, and named
phases of four kinds:

- probe: one run with `env` set and the library's read log on; which knobs the library reported reading
  (probe.json). Later phases naming it in `exempt_from` do not hold the knobs it did NOT report to the
  read-log check (they are recorded as unverified), and take the library version it read.
- samplers: the planted-default demonstration. The tuner (TPE, trial 0 = the site defaults, trial 1 =
  the library defaults) and plain random search (trial 0 = the site defaults) on the same space, their
  trials interleaved (tuner, random, tuner, ...) in one run, plus `references` runs of the library
  defaults. Best known = the best objective anything measured; trials-to-target = the first counted trial
  whose objective reaches `target` of it. Then the tuner's study is finalized and published (with the
  tuner-plugin config, and the files the plugin check's case 5 needs: case5/tuner.conf, global.env).
- aa: `tunes` independent tunes (own storage, own seed) with nothing planted, run in parallel on
  `slots` (extra environment per slot, e.g. CUDA_VISIBLE_DEVICES); counts tunes whose recommendation
  changes anything, globally or for one size bucket (a tuner-plugin row is a recommendation too).
- tune: one tune, finalized and published (the socket-path demonstration).

Every phase stops starting new work when the deadline (--until) is near, caps finalization to the time
left, and writes DIR/<phase>/summary.json and summary.txt.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from campaigns.model.yamlio import YamlModelError, load_yaml_model
from campaigns.tuning.executors import READ_LOG_ENV, knobs_read, library_version, strip_knobs
from campaigns.tuning.session import TuningSession, TuningSetup, make_executor, make_tuner, prepare
from campaigns.tuning.spec import TuningSpec, site_catalog
from tuners.catalog import Library
from tuners.evaluation import bucket_times_us, overall_time_us
from tuners.finalize import planned_runs
from tuners.study import BUCKET_US, ENV, FAIL_REASON, OUTCOME, ROLE, Tuner, is_counted, study_progress
from tuners.writers import write_atomic

# Margin kept before the deadline for writing results (and the shell's tarball).
SAFETY_S = 8.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Phase(_Model):
    kind: Literal["probe", "samplers", "aa", "tune"]
    spec: dict[str, Any] = {}
    env: dict[str, str] = {}  # probe: the variables set
    exempt_from: list[str] = []
    trials: int = Field(default=15, ge=1)  # samplers: the tuner's trials
    random_trials: int = Field(default=30, ge=1)  # samplers: random search's trials
    references: int = Field(default=3, ge=0)  # samplers: library-default runs
    target: float = Field(default=0.95, gt=0, le=1)
    tunes: int = Field(default=5, ge=1)  # aa
    slots: list[dict[str, str]] = [{}]  # aa: extra environment of each parallel slot
    publish: bool = True


class DemoConfig(_Model):
    common: dict[str, Any]
    environment: dict[str, str] = {}
    phases: dict[str, Phase]


@dataclasses.dataclass
class Context:
    config: DemoConfig
    name: str
    phase: Phase
    out: Path  # the demo's output root
    until: float  # unix time
    started: float = dataclasses.field(default_factory=time.time)

    @property
    def directory(self) -> Path:
        return self.out / self.name

    def left(self) -> float:
        return self.until - time.time() - SAFETY_S

    def environ(self, slot: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **self.config.environment, **(slot or {})}

    def spec(self, **fields: Any) -> TuningSpec:
        values = {**self.config.common, **self.phase.spec}
        probes = [json.loads((self.out / name / "probe.json").read_text()) for name in self.phase.exempt_from
                  if (self.out / name / "probe.json").is_file()]
        if probes:
            values.setdefault("library_version", probes[0].get("library_version"))
            values["unverifiable_knobs"] = sorted({*values.get("unverifiable_knobs", []),
                                                   *(k for p in probes for k in p["not_reported"])})
        values.update(runs_dir=self.directory / "runs", publish_dir=self.out / "recommendations"
                      if self.phase.publish else None, **fields)
        return TuningSpec.model_validate(values)

    def say(self, text: str) -> None:
        print(f"[{self.name} +{time.time() - self.started:5.0f}s] {text}", flush=True)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def objective_of(evaluation: Any, setup: TuningSetup) -> float | None:
    if not evaluation.ok:
        return None
    return overall_time_us(bucket_times_us(evaluation.median_us(), setup.buckets))


def trial_rows(study: Any) -> list[dict[str, Any]]:
    rows = []
    for trial in study.get_trials(deepcopy=False):
        if not is_counted(trial):
            continue
        rows.append({"number": trial.number, "role": trial.user_attrs.get(ROLE, ""),
                     "outcome": trial.user_attrs[OUTCOME], "objective_us": trial.value,
                     "bucket_us": trial.user_attrs.get(BUCKET_US), "env": trial.user_attrs.get(ENV),
                     "fail_reason": trial.user_attrs.get(FAIL_REASON, "")})
    return rows


def trials_to_target(rows: list[dict[str, Any]], threshold_us: float) -> int | None:
    """1-based count of counted trials (failed ones included) until the first that reaches the threshold."""
    for index, row in enumerate(rows, start=1):
        if row["objective_us"] is not None and row["objective_us"] <= threshold_us:
            return index
    return None


def busbw_gbs(op: str, ranks: int, size: int, time_us: float) -> float:
    factor = 2 * (ranks - 1) / ranks if op == "allreduce" else (ranks - 1) / ranks if op in (
        "alltoall", "allgather", "reduce_scatter") else 1.0
    return size / (time_us * 1e-6) / 1e9 * factor


def reserve_runs(setup: TuningSetup) -> int:
    """Runs to keep for finalizing one candidate: its rounds (for its family: overall + each bucket),
    each baseline + candidate, and its ablation and held-out rounds."""
    return planned_runs(setup.spec.finalize.thresholds(), 1, len(setup.buckets), len(setup.space.changeable))


def per_run_s(setup: TuningSetup, default: float) -> float:
    durations = setup.evaluator.durations_s[-5:]
    return sum(durations) / len(durations) if durations else default


def run_trials(ctx: Context, setup: TuningSetup, n_trials: int) -> Tuner:
    """Trials one at a time up to `n_trials`, stopping early so that finalizing one candidate still fits."""
    tuner = make_tuner(setup, n_trials=1)
    for index in range(1, n_trials + 1):
        if index > 1 and ctx.left() < per_run_s(setup, 5.0) * (reserve_runs(setup) + 1):
            ctx.say(f"deadline near: {index - 1} trials, the rest of the time is for finalization")
            break
        tuner = make_tuner(setup, n_trials=index)
        tuner.run()
    return tuner


def finalize_within(ctx: Context, session: TuningSession) -> dict[str, Any]:
    """Finalize with as many candidates as the time left allows (none: keep defaults, said so)."""
    setup = session.setup
    per_run = per_run_s(setup, 10.0)
    budget = int(max(0.0, ctx.left()) // per_run)
    if reserve_runs(setup) > budget:
        return {"finalized": False, "reason": f"{budget} runs of ~{per_run:.1f} s left before the deadline; "
                                              "too few for one candidate's rounds"}
    rec = session.finalize(max_evaluations=budget)
    published = session.publish()
    assert session.outcome is not None and session.outcome.report is not None
    report = session.outcome.report
    return {"finalized": True, "report": report, "recommendation": rec, "published": published,
            "decision": rec.decision, "gain": None if rec.gain is None else rec.gain.model_dump(),
            "env": rec.env, "unset": rec.unset,
            "per_size": [{"bucket": s.bucket, "decision": s.decision, "metric": s.metric, "env": s.env,
                          "gain": None if s.gain is None else s.gain.median,
                          "p_adjusted": next((g.p_adjusted for g in (s.gain, s.closest) if g is not None), None)}
                         for s in rec.per_size],
            "plugin_rules": [r.line() for r in rec.plugin_rules], "plugin_notes": rec.plugin_notes,
            "notes": list(rec.evidence.notes), "rounds_used": report.rounds_used, "family_size": report.family_size,
            "candidates": [c.candidate.env for c in report.overall.comparisons],
            "files": None if published is None else {k: str(v) for k, v in dataclasses.asdict(published).items()}}


def public(result: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("report", "recommendation", "published")}


# ---------------------------------------------------------------------------------------------- phases
def phase_probe(ctx: Context) -> dict[str, Any]:
    spec = ctx.spec()
    catalog, _ = site_catalog(spec)
    library = Library(spec.library)
    executor = make_executor(spec, strip_knobs(ctx.environ(), catalog, library))
    env = {**catalog.validate_env(ctx.phase.env), **catalog.pinned}
    outcome = executor.run({**env, **READ_LOG_ENV.get(library, {})}, spec.request(), False)
    read = knobs_read(library, outcome.output) or {}
    not_reported = sorted(name for name in env if name not in read)
    result = {"env": env, "reported": read, "not_reported": not_reported, "exit_code": outcome.exit_code,
              "records": len(outcome.records), "library_version": library_version(outcome.records, library),
              "failure": outcome.failure, "directory": str(outcome.directory)}
    write_json(ctx.directory / "probe.json", result)
    return result


def phase_samplers(ctx: Context) -> dict[str, Any]:
    phase = ctx.phase
    tpe = prepare(ctx.spec(sampler="tpe", db=f"sqlite:///{ctx.directory / 'tuner.db'}"), environ=ctx.environ(),
                  ingest=False)
    rnd = prepare(ctx.spec(sampler="random", db=f"sqlite:///{ctx.directory / 'random.db'}",
                           seed_library_defaults=False), environ=ctx.environ(), ingest=False)
    library_defaults = tpe.space.env_from_values({name: None for name in tpe.space.knob_names})
    references: list[float | None] = []
    ctx.say(f"space {', '.join(tpe.space.knob_names)}; planted defaults "
            f"{tpe.catalog.default_env(tpe.space.knob_names)}")
    tuner = random_ = None
    for index in range(1, max(phase.trials, phase.random_trials) + 1):
        if index > 1 and ctx.left() < per_run_s(tpe, 5.0) * (reserve_runs(tpe) + 3):
            ctx.say(f"deadline near: stopping the trials at round {index}, the rest is for finalization")
            break
        if index <= phase.trials:
            tuner = make_tuner(tpe, n_trials=index)
            tuner.run()
        if index <= phase.random_trials:
            random_ = make_tuner(rnd, n_trials=index)
            random_.run()
        if index <= phase.references:
            references.append(objective_of(tpe.evaluator(library_defaults), tpe))
    assert tuner is not None and random_ is not None
    session = TuningSession(tpe, log=None)
    tuner_study, random_study = session.collect(tuner).study, random_.load_study()
    rows = {"tuner": trial_rows(tuner_study), "random": trial_rows(random_study)}
    measured = [r["objective_us"] for rs in rows.values() for r in rs if r["objective_us"] is not None]
    measured += [r for r in references if r is not None]
    best_us = min(measured)
    threshold = best_us / phase.target
    reached = {name: trials_to_target(rs, threshold) for name, rs in rows.items()}
    ctx.say(f"best known objective {best_us:.4g} us; trials to {phase.target:.0%}: {reached}")
    fin = finalize_within(ctx, session)
    case5 = ctx.directory / "case5"
    case5.mkdir(exist_ok=True)
    if fin["finalized"]:
        rules = fin["plugin_rules"]
        write_atomic(case5 / "tuner.conf", "# per-size rows of the tuner's recommendation (none: no bucket "
                                           "winner expressible as a plugin row)\n" + "".join(f"{r}\n" for r in rules))
        global_env = {k: v for k, v in fin["env"].items() if k.startswith("NCCL_") and k != "NCCL_NVLS_ENABLE"}
        write_atomic(case5 / "global.env", "# the tuner's best global settings (NCCL_* only)\n"
                     + "".join(f"{k}={v}\n" for k, v in global_env.items()))
    tpe_reached, rnd_reached = reached["tuner"], reached["random"]
    random_count = len(rows["random"])
    within = tpe_reached is not None and tpe_reached <= phase.trials
    half = tpe_reached is not None and (
        (rnd_reached is not None and 2 * tpe_reached <= rnd_reached)
        or (rnd_reached is None and 2 * tpe_reached <= random_count))
    largest = max(tpe.spec.sizes)
    return {"best_known_objective_us": best_us, "threshold_us": threshold, "target": phase.target,
            "trials_to_target": reached, "trials_run": {k: len(v) for k, v in rows.items()},
            "criterion_within_trials": within, "criterion_half_of_random": half,
            "criteria_note": "reached = objective (geometric mean over size buckets of the median time) within "
                             "1/target of the best objective measured in this run; random not reaching it in "
                             f"{random_count} trials counts as needing more than {random_count}",
            "references_us": references, "library_defaults_env": library_defaults,
            "planted_defaults": tuner.baseline_env, "space": list(tpe.space.knob_names),
            "largest_size_busbw_gbs": {
                name: [None if r["bucket_us"] is None else round(busbw_gbs(
                    tpe.spec.op, tpe.spec.ranks, largest, r["bucket_us"][tpe.buckets[-1].name]), 2) for r in rs]
                for name, rs in rows.items()},
            "trials": rows, "finalization": public(fin)}


def _one_aa_tune(ctx: Context, number: int, slot: Mapping[str, str]) -> dict[str, Any]:
    setup = prepare(ctx.spec(db=f"sqlite:///{ctx.directory / f'tune-{number}.db'}", seed=number),
                    environ=ctx.environ(slot), ingest=False)
    session = TuningSession(setup, log=None)
    study = session.collect(run_trials(ctx, setup, setup.spec.trials or 1)).study
    fin = finalize_within(ctx, session)
    ctx.say(f"A/A tune {number} ({slot}): {fin.get('decision', fin.get('reason'))}")
    return {"tune": number, "slot": slot, "trials": trial_rows(study), "finalization": public(fin),
            "progress": dataclasses.asdict(study_progress(study))}


def phase_aa(ctx: Context) -> dict[str, Any]:
    phase = ctx.phase
    results: list[dict[str, Any]] = []
    slots = phase.slots or [{}]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots)) as pool:
        pending = list(range(phase.tunes))
        running: dict[concurrent.futures.Future[dict[str, Any]], dict[str, str]] = {}
        free = list(slots)
        started_at: list[float] = []
        while pending or running:
            durations = [r["elapsed_s"] for r in results]
            estimate = max(durations) if durations else 0.0
            while pending and free and ctx.left() > max(estimate, 30.0):
                slot = free.pop(0)
                number = pending.pop(0)
                started_at.append(time.time())
                future = pool.submit(_timed, _one_aa_tune, ctx, number, slot)
                running[future] = slot
            if not running:
                break
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                free.append(running.pop(future))
                results.append(future.result())
    finalized = [r for r in results if r["finalization"]["finalized"]]
    bucket_changes = {r["tune"]: [s["bucket"] for s in r["finalization"]["per_size"] if s["decision"] == "change"]
                      for r in finalized}
    # A per-size change is a recommendation too (a tuner-plugin row): it counts like a global one.
    changes = [r["tune"] for r in finalized
               if r["finalization"]["decision"] == "change" or bucket_changes[r["tune"]]]
    return {"tunes_requested": phase.tunes, "tunes_finalized": len(finalized), "false_changes": len(changes),
            "change_tunes": changes, "bucket_changes": bucket_changes, "tunes": sorted(results, key=lambda r: r["tune"])}


def _timed(function: Any, *args: Any) -> dict[str, Any]:
    started = time.time()
    result = function(*args)
    result["elapsed_s"] = round(time.time() - started, 1)
    return result


def phase_tune(ctx: Context) -> dict[str, Any]:
    setup = prepare(ctx.spec(db=f"sqlite:///{ctx.directory / 'study.db'}"), environ=ctx.environ(), ingest=False)
    ctx.say(f"space {', '.join(setup.space.knob_names)}; site defaults "
            f"{setup.catalog.default_env(setup.space.knob_names)}")
    session = TuningSession(setup, log=None)
    tuner = run_trials(ctx, setup, setup.spec.trials or 1)
    study = session.collect(tuner).study
    fin = finalize_within(ctx, session)
    rows = trial_rows(study)
    largest = max(setup.spec.sizes)
    last = setup.buckets[-1].name
    return {"trials": rows, "finalization": public(fin), "baseline_env": tuner.baseline_env,
            "space": list(setup.space.knob_names),
            "largest_size_busbw_gbs": [None if r["bucket_us"] is None else round(busbw_gbs(
                setup.spec.op, setup.spec.ranks, largest, r["bucket_us"][last]), 3) for r in rows]}


PHASES = {"probe": phase_probe, "samplers": phase_samplers, "aa": phase_aa, "tune": phase_tune}


def summary_text(name: str, phase: Phase, result: Mapping[str, Any]) -> str:
    lines = [f"phase {name} ({phase.kind}), {result['elapsed_s']} s"]
    if phase.kind == "probe":
        lines += [f"library version read: {result['library_version']}", f"reported: {result['reported']}",
                  f"NOT reported (exempt from the read check where named): {result['not_reported']}"]
    if phase.kind == "samplers":
        lines += [f"planted site defaults: {result['planted_defaults']}",
                  f"best known objective {result['best_known_objective_us']:.4g} us; "
                  f"trials to {result['target']:.0%} of it: {result['trials_to_target']} "
                  f"(trials run {result['trials_run']})",
                  f"criterion reach within {phase.trials} trials: {result['criterion_within_trials']}; "
                  f"in at most half of random's: {result['criterion_half_of_random']}",
                  f"busbw at the largest size per trial (GB/s): {result['largest_size_busbw_gbs']}"]
    if phase.kind == "aa":
        lines += [f"tunes finalized {result['tunes_finalized']} of {result['tunes_requested']}; "
                  f"false 'change' recommendations (global or per size): {result['false_changes']} "
                  f"{result['change_tunes']}",
                  f"per-bucket 'change' decisions: {result['bucket_changes']}"]
    if phase.kind == "tune":
        lines += [f"site defaults: {result['baseline_env']}",
                  f"busbw at the largest size per trial (GB/s): {result['largest_size_busbw_gbs']}"]
    fin = result.get("finalization")
    if fin:
        if fin["finalized"]:
            lines += [f"finalization: {fin['decision']} env={fin['env']} unset={fin['unset']} gain={fin['gain']}",
                      f"Holm family: {fin['family_size']} tests",
                      *(f"  {s['bucket']}: {s['decision']} gain={s['gain']} Holm p={s['p_adjusted']}"
                        for s in fin["per_size"]),
                      f"plugin rules: {fin['plugin_rules']}", *(f"note: {n}" for n in fin["notes"]),
                      *(f"plugin note: {n}" for n in fin["plugin_notes"])]
        else:
            lines.append(f"finalization skipped: {fin['reason']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--phase", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--until", type=float, default=math.inf, help="unix time by which the phase must end")
    parser.add_argument("--commbench", type=Path, help="the commbench binary (replaces common.commbench)")
    parser.add_argument("--plugin", type=Path, help="libnccl-tuner-commcamp.so for published recommendations")
    args = parser.parse_args(argv)
    try:
        config = load_yaml_model(args.config, DemoConfig)
    except YamlModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.commbench:
        config.common["commbench"] = str(args.commbench.resolve())
    if args.plugin:
        config.common["plugin_library"] = str(args.plugin.resolve())
    if args.phase not in config.phases:
        print(f"error: no phase {args.phase!r} in {args.config} (phases: {', '.join(config.phases)})",
              file=sys.stderr)
        return 2
    phase = config.phases[args.phase]
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the phase prints its own progress lines
    ctx = Context(config, args.phase, phase, args.out.resolve(), args.until)
    ctx.directory.mkdir(parents=True, exist_ok=True)
    ctx.say(f"start ({phase.kind}), {ctx.left():.0f} s before the deadline")
    result = PHASES[phase.kind](ctx)
    result["elapsed_s"] = round(time.time() - ctx.started, 1)
    write_json(ctx.directory / "summary.json", result)
    text = summary_text(args.phase, phase, result)
    write_atomic(ctx.directory / "summary.txt", text)
    print(text, end="", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
