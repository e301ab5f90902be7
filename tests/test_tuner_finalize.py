"""Finalization statistics: interleaved paired re-measurement, Wilcoxon against the minimum effect, Holm
over every test of a finalization, CI; the per-size plugin rows that follow; the GPU A/A rounds re-judged."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import pytest
from scipy.stats import rankdata
from fixtures_tuner import TWO_BUCKETS, make_scope

from campaigns.formats.packs import read_pack
from campaigns.model.site import load_site
from tuners.bench_finalize import DriftingEvaluator, accepted_by_rule, measured_noise, realistic_evaluator
from tuners.evaluation import (
    Evaluation,
    FailureKind,
    SizeBucket,
    bucket_times_us,
    buckets_for_sizes,
    overall_time_us,
)
from tuners.finalize import (
    OVERALL,
    Candidate,
    Comparison,
    FinalReport,
    Thresholds,
    Decision,
    decide_paired,
    decisions_tested,
    family_size,
    finalize,
    holm,
    look_levels,
    look_rounds,
    median_ci,
    min_rounds,
    nominal_levels,
    planned_rounds,
    planned_runs,
    rounds_needed,
    signed_rank_p,
)
from tuners.recommendation import build_recommendation
from tuners.space import build_space
from tuners.writers import env_file_text

SIZES = (64, 1024, 1 << 20, 1 << 26)
FIVE_SIZES = (8192, 262144, 2097152, 16777216, 67108864)  # the GPU demo's sizes, one bucket each
FIVE_BUCKETS = buckets_for_sizes(FIVE_SIZES, 1)
BASELINE = {"NCCL_PROTO": "Simple"}
FASTER = {"NCCL_PROTO": "LL128"}
OTHER = {"NCCL_PROTO": "LL"}
REPO = Path(__file__).resolve().parents[1]


def run(speedups: Mapping[str, float], seed: int, noise: float = 0.03, candidates=(FASTER, OTHER), **kwargs):
    evaluator = DriftingEvaluator(SIZES, speedups, noise, seed)
    report = finalize(evaluator, BASELINE, [Candidate(c) for c in candidates], TWO_BUCKETS, seed=seed, **kwargs)
    return report, evaluator


def test_a_a_over_twenty_seeds_and_five_buckets_changes_nothing() -> None:
    """Identical settings, noise 2-5 % per run, slow drift, 3 % of runs 1.3x slower: no change anywhere,
    in 20 finalizations x (overall + 5 buckets) x 2 candidates; and futility stops them early (with a
    fixed budget, `look_every` >= `rounds`, every one runs all 40 rounds)."""
    overall_changes = bucket_changes = rounds = 0
    for seed in range(20):
        candidates = [Candidate(FASTER), Candidate(OTHER)]
        report = finalize(realistic_evaluator({}, seed), BASELINE, candidates, FIVE_BUCKETS, seed=seed)
        assert report.family_size == 12 and report.rounds_run <= report.max_rounds == Thresholds().rounds
        overall_changes += report.overall.change
        bucket_changes += sum(d.change for d in report.buckets.values())
        rounds += report.rounds_run
    assert (overall_changes, bucket_changes) == (0, 0)
    assert rounds / 20 <= 20  # half the maximum at most, on average


def test_holm_runs_over_the_whole_family() -> None:
    report = finalize(realistic_evaluator({}, 3), BASELINE, [Candidate(FASTER), Candidate(OTHER)], FIVE_BUCKETS)
    comparisons = [c for d in report.decisions for c in d.comparisons]
    assert len(comparisons) == report.family_size == 12 and all(c.tested for c in comparisons)
    assert "Holm step-down over all 12 tests of the finalization (2 candidate(s) x (overall + 5 size buckets))" in (
        report.test
    )
    # p_adjusted = p x alpha / the level the test faced, >= p x 12 / 0.01 x 0.01 at any look: Holm's first
    # step (alpha / 12) is the loosest level a test faces before any other passed.
    assert all(c.p_adjusted >= min(1.0, 12 * c.p_value) * 0.999 for c in comparisons)
    # Keep-defaults decisions still name the candidate nearest to acceptance, with its corrected p.
    closest = report.buckets["2MiB-2MiB"].closest
    assert closest is not None and closest.p_adjusted == min(
        c.p_adjusted for c in report.buckets["2MiB-2MiB"].comparisons if c.p_adjusted is not None
    )


PLUGIN_FAST = {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL128", "NCCL_MAX_CTAS": "16"}
PLUGIN_SAME = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL", "NCCL_MAX_CTAS": "8"}


@pytest.mark.parametrize("seed", range(5))
def test_a_ten_percent_gain_in_one_bucket_changes_that_bucket_and_its_plugin_row_only(seed: int) -> None:
    # The default budget (power: python -m tuners.bench_finalize).
    evaluator = DriftingEvaluator(FIVE_SIZES, {"LL128": {2097152: 0.10}}, 0.03, seed, trend=0.002)
    report = finalize(evaluator, {}, [Candidate(PLUGIN_FAST), Candidate(PLUGIN_SAME)], FIVE_BUCKETS, seed=seed)
    assert report.family_size == 12
    assert {name: d.verdict for name, d in report.buckets.items()} == {
        b.name: "change" if b.name == "2MiB-2MiB" else "keep-defaults" for b in FIVE_BUCKETS
    }
    # Only NCCL_PROTO acts in these runs: ablation drops the two inert knobs the winner carried.
    two_mib = report.buckets["2MiB-2MiB"]
    assert two_mib.winner is not None and two_mib.winner.candidate.env == PLUGIN_FAST
    assert two_mib.env == {"NCCL_PROTO": "LL128"}
    assert {a.knob: a.kept for a in two_mib.ablation} == {"NCCL_ALGO": False, "NCCL_MAX_CTAS": False,
                                                           "NCCL_PROTO": True}
    # Overall the gain is 1.10 ** (1/5) - 1 = 1.9 %: below the minimum effect, keep the defaults.
    assert report.overall.verdict == "keep-defaults"
    assert "minimum effect" in report.overall.comparisons[0].reason
    rec = build_recommendation(make_scope(), report, FIVE_BUCKETS, optuna.create_study(), {"nccl": "2.28.3"})
    assert rec.decision == "keep-defaults" and rec.env == {}
    assert rec.plugin_rules == []  # per-size rows come from the per-size stage only (tests/test_per_size.py)
    assert [s.decision for s in rec.per_size].count("change") == 1
    assert rec.evidence.family_size == 12 and rec.closest is not None and rec.gain is None
    text = env_file_text(rec, rec.env, rec.unset)
    assert "# multiple testing: Holm over all 12 tests of the finalization" in text
    two_mib = next(line for line in text.splitlines() if line.startswith("# size 2MiB-2MiB"))
    assert ": change: +" in two_mib and "Holm-adjusted" in two_mib
    assert all(len(line) <= 202 for line in text.splitlines())


@pytest.mark.parametrize("seed", range(3))
def test_a_change_faster_overall_but_slower_at_small_sizes_is_refused(seed: int) -> None:
    # What the 2x H200 socket path showed (results/reference/h200x2-aa-global/): a process-wide setting
    # +80 % at large sizes, -15 % at small ones: the geometric mean over the buckets says +24 %, and it
    # would win over OTHER's +8 % everywhere; the small sizes would lose. OTHER wins instead.
    speedups = {"LL128": {64: -0.15, 1024: -0.15, 1 << 20: 0.8, 1 << 26: 0.8}, "LL": 0.08}
    report, _ = run(speedups, seed)
    refused = report.overall.comparisons[0]
    assert not refused.accepted and "slower in bucket small" in refused.reason, refused.reason
    assert report.overall.verdict == "change" and report.overall.winner is not None
    assert report.overall.winner.candidate.env == OTHER
    assert any("slower in bucket" in note for note in report.notes)
    alone, _ = run(speedups, seed, candidates=(FASTER,))
    assert alone.overall.verdict == "keep-defaults"
    unguarded, _ = run(speedups, seed, thresholds=Thresholds(never_slower=False))
    assert unguarded.overall.winner is not None and unguarded.overall.winner.candidate.env == FASTER


@pytest.mark.parametrize("seed", range(5))
def test_a_real_ten_percent_gain_with_three_percent_noise_is_a_change(seed: int) -> None:
    report, evaluator = run({"LL128": 0.10}, seed)
    assert report.overall.verdict == "change" and report.overall.env == FASTER
    winner = report.overall.winner
    assert winner is not None and winner.gain is not None and winner.ci_low is not None and winner.ci_high is not None
    assert 0.06 < winner.gain < 0.14 and 0 < winner.ci_low <= winner.gain <= winner.ci_high
    assert winner.p_adjusted is not None and winner.p_adjusted < 0.01
    assert report.buckets["large"].verdict == "change"
    other = report.overall.comparisons[1]
    assert not other.accepted and "minimum effect" in other.reason
    # Interleaved: each round before the first look measures the baseline and both candidates once, in
    # varying order.
    rounds = [evaluator.order[i : i + 3] for i in range(0, 3 * report.looks[0], 3)]
    assert all(sorted(r) == ["LL", "LL128", "Simple"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1


def test_a_one_percent_gain_is_below_the_minimum_effect() -> None:
    for seed in range(5):
        report, _ = run({"LL128": 0.01}, seed)
        assert report.overall.verdict == "keep-defaults"
        assert "below the minimum effect 3%" in report.overall.comparisons[0].reason


def test_may_corrupt_candidate_needs_a_validated_rerun() -> None:
    def needs(baseline: Mapping[str, str], env: Mapping[str, str]) -> tuple[str, ...]:
        return ("NCCL_PROTO",) if env.get("NCCL_PROTO") == "LL128" else ()

    inner = DriftingEvaluator(SIZES, {"LL128": 0.2}, 0.02, 0)

    def corrupting(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        evaluation = inner(env, validate=validate)
        if validate:
            return Evaluation.failed(FailureKind.INVALID, "commbench --check: 17 wrong elements at 64 MiB")
        return evaluation

    report = finalize(corrupting, BASELINE, [Candidate(FASTER)], TWO_BUCKETS, needs_validation=needs)
    assert report.overall.verdict == "keep-defaults"
    reason = report.overall.comparisons[0].reason
    assert "validated re-run (NCCL_PROTO: may-hang/may-corrupt, changed from the baseline) failed" in reason
    assert "wrong elements" in report.overall.comparisons[0].reason
    report = finalize(
        DriftingEvaluator(SIZES, {"LL128": 0.2}, 0.02, 0), BASELINE, [Candidate(FASTER)], TWO_BUCKETS,
        needs_validation=needs,
    )
    assert report.overall.verdict == "change"


def test_dropping_the_alps_ll128_pin_needs_validated_runs_over_every_size() -> None:
    """Alps' site defaults pin NCCL_PROTO=^LL128 (LL128 over Slingshot with GPUDirect may corrupt
    data). A candidate that leaves NCCL_PROTO unset (the library-defaults seed, as GPU demo 2
    recommended) re-enables LL128: it must be validated like one that sets it. Before the fix only
    knobs a candidate SET were validated, and this candidate was accepted as a 20 % gain."""
    catalog = load_site("alps").knob_catalog()
    space = build_space(catalog, {"nccl": "2.28.3"}, knobs=["NCCL_PROTO", "NCCL_CROSS_NIC"],
                        op="allreduce", transport="ccl")
    baseline = space.env_from_values({name: catalog[name].default for name in space.knob_names})
    assert baseline == {"NCCL_PROTO": "^LL128", "NCCL_CROSS_NIC": "1"}
    dropped = space.env_from_values(dict.fromkeys(space.knob_names))  # every knob unset
    altered = {**baseline, "NCCL_PROTO": "LL"}
    safe_only = {"NCCL_PROTO": "^LL128", "NCCL_CROSS_NIC": "0"}  # NCCL_CROSS_NIC is safe
    assert space.unsafe_changes(baseline, dropped) == ("NCCL_PROTO",)
    assert space.unsafe_changes(baseline, altered) == ("NCCL_PROTO",)
    assert space.unsafe_changes(baseline, safe_only) == ()
    assert space.unsafe_changes(baseline, baseline) == ()
    inner = DriftingEvaluator(SIZES, {"unset": 0.2, "LL": 0.2}, 0.02, 0)
    validated_runs: list[Mapping[str, str]] = []

    def ll128_corrupts(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        if validate:
            validated_runs.append(dict(env))
            if "NCCL_PROTO" not in env:
                return Evaluation.failed(FailureKind.INVALID, "commbench --check: 3 wrong elements at 64 MiB")
        return inner(env, validate=validate)

    candidates = [Candidate(dropped), Candidate(altered)]
    report = finalize(ll128_corrupts, baseline, candidates, TWO_BUCKETS, needs_validation=space.unsafe_changes)
    assert validated_runs == [dropped, altered]
    reasons = [c.reason for c in report.overall.comparisons]
    assert "validated re-run (NCCL_PROTO: may-hang/may-corrupt" in reasons[0] and "wrong elements" in reasons[0]
    assert report.overall.env == altered  # validated over every size, then measured faster
    # A validated run that misses a bucket's sizes does not count as validated over every size.
    def small_sizes_only(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        evaluation = inner(env, validate=validate)
        return Evaluation({s: t for s, t in evaluation.times_us.items() if s < 1 << 20}, validated=validate) \
            if validate else evaluation

    report = finalize(small_sizes_only, baseline, [Candidate(altered)], TWO_BUCKETS,
                      needs_validation=space.unsafe_changes)
    assert report.overall.verdict == "keep-defaults"
    assert "did not cover every size: no measured size falls into bucket large" in report.overall.comparisons[0].reason


def test_a_validated_run_must_cover_every_requested_size() -> None:
    """A validated run that misses one size of a bucket whose other sizes it measured does not clear a
    may-corrupt change (data can go wrong at one size only: a protocol is chosen per size); before, one size
    per bucket was enough, and this 20 % candidate became a change."""
    def needs(baseline: Mapping[str, str], env: Mapping[str, str]) -> tuple[str, ...]:
        return ("NCCL_PROTO",) if env.get("NCCL_PROTO") == "LL128" else ()

    inner = DriftingEvaluator(SIZES, {"LL128": 0.2}, 0.02, 0)

    def no_1k(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        evaluation = inner(env, validate=validate)
        return Evaluation({s: t for s, t in evaluation.times_us.items() if s != 1024}, validated=validate) \
            if validate else evaluation

    report = finalize(no_1k, BASELINE, [Candidate(FASTER)], buckets_for_sizes(SIZES), needs_validation=needs)
    assert report.overall.verdict == "keep-defaults"
    assert report.overall.comparisons[0].reason.endswith("did not cover every size: requested size(s) 1KiB not "
                                                         "measured")


def test_failures_during_remeasurement() -> None:
    # The candidate's fifth run times out: it is rejected, whatever its speed.
    inner = DriftingEvaluator(SIZES, {"LL128": 0.2}, 0.02, 3)

    def flaky(env, *, validate=False):
        if env == FASTER and inner.order.count("LL128") == 4:
            return Evaluation.failed(FailureKind.TIMEOUT, "watchdog: iteration exceeded 10 s")
        return inner(env, validate=validate)

    report = finalize(flaky, BASELINE, [Candidate(FASTER)], TWO_BUCKETS)
    assert report.overall.verdict == "keep-defaults"
    assert "failed in re-measurement round 5: timeout" in report.overall.comparisons[0].reason
    assert not any(c.tested for d in report.decisions for c in d.comparisons)  # nothing left to test
    # A baseline that fails in two rounds loses those rounds, not the decision.
    steady = DriftingEvaluator(SIZES, {"LL128": 0.2}, 0.02, 4)
    baseline_calls = []

    def baseline_flaky(env, *, validate=False):
        if env == BASELINE:
            baseline_calls.append(1)
            if len(baseline_calls) in (2, 7):
                return Evaluation.failed(FailureKind.FAILED, "srun: node failure")
        return steady(env, validate=validate)

    report = finalize(baseline_flaky, BASELINE, [Candidate(FASTER)], TWO_BUCKETS, thresholds=Thresholds(rounds=12))
    assert report.rounds_used == 10 and report.overall.verdict == "change"
    assert sum("baseline failed" in note for note in report.notes) == 2


def test_a_candidate_that_fails_after_a_look_accepted_it_is_not_deployed() -> None:
    """LL128 is 30 % faster at the large sizes, 4 % at the small ones: the overall test is accepted at round 20,
    the small bucket's runs on, and in round 25 LL128 hangs. A candidate that fails in any round is rejected;
    before, the overall acceptance of round 20 stood and the setting that hung was deployed."""
    for seed in range(3):
        inner = DriftingEvaluator(SIZES, {"LL128": {64: 0.04, 1024: 0.04, 1 << 20: 0.3, 1 << 26: 0.3}}, 0.02, seed)

        runs: list[str] = []

        def hangs_once(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
            runs.append(env["NCCL_PROTO"])
            if env == FASTER and runs.count("LL128") == 25:  # its 25th run only: the held-out rounds pass
                return Evaluation.failed(FailureKind.TIMEOUT, "hung: watchdog")
            return inner(env, validate=validate)

        report = finalize(hangs_once, BASELINE, [Candidate(FASTER)], TWO_BUCKETS, seed=seed)
        assert report.rounds_run >= 25 and report.overall.comparisons[0].rounds == 20, seed
        assert report.overall.verdict == "keep-defaults" and report.overall.env == BASELINE, seed
        assert report.overall.comparisons[0].reason == ("accepted at a look, then failed in re-measurement round 25: "
                                                        "timeout: hung: watchdog")
        assert all(d.verdict == "keep-defaults" for d in report.buckets.values()), seed


def test_a_gain_exactly_at_the_minimum_effect_is_no_change_whatever_the_rounding() -> None:
    """Times without noise, the candidate exactly 3 % faster (the minimum effect): H0 holds (the gain is the margin),
    so no change. log(101 / (101 / 1.03)) - log1p(0.03) is 3e-16, not 0: every round counted above the margin
    and the change was accepted at p = 2**-20 (103 vs 100 rounded the other way and was refused)."""
    for baseline_us, candidate_us in ((101.0, 101.0 / 1.03), (103.0, 100.0)):
        def evaluate(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
            return Evaluation(times_us={8: [candidate_us if env == FASTER else baseline_us]}, validated=validate)

        report = finalize(evaluate, BASELINE, [Candidate(FASTER)], buckets_for_sizes((8,), 1), seed=0)
        assert not report.overall.change, (baseline_us, report.overall.closest)


def test_simplest_statistically_equal_candidate_wins() -> None:
    bigger = {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}
    evaluator = DriftingEvaluator(SIZES, {"LL128": 0.2}, 0.02, 5)  # BUFFSIZE does nothing: both 20 % faster
    report = finalize(evaluator, BASELINE, [Candidate(bigger), Candidate(FASTER)], TWO_BUCKETS)
    assert all(c.accepted for c in report.overall.comparisons)
    assert report.overall.env == FASTER


def test_one_bucket_is_one_decision() -> None:
    everything = (SizeBucket("all", 0, 1 << 30),)
    evaluator = DriftingEvaluator(SIZES, {"LL128": 0.2}, 0.02, 6)
    report = finalize(evaluator, BASELINE, [Candidate(FASTER), Candidate(OTHER)], everything)
    assert report.family_size == 2 and report.max_rounds == 40 and report.rounds_run < 40  # 20 %: stops early
    assert report.buckets["all"].env == report.overall.env == FASTER
    assert [c.decision for c in report.buckets["all"].comparisons] == ["all", "all"]
    assert [c.p_adjusted for c in report.buckets["all"].comparisons] == [
        c.p_adjusted for c in report.overall.comparisons
    ]


def test_holm_and_round_count() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([]) == []
    assert min_rounds(1, 0.01) == 7  # 2**-7 = 0.0078 < 0.01 <= 2**-6
    assert min_rounds(6, 0.01) == 10 and min_rounds(6, 0.05) == 7  # 6 * 2**-10 < 0.01; 6 * 2**-7 < 0.05
    assert min_rounds(1, 1 / 16) == 5  # strictly below alpha: 2**-4 is not
    assert rounds_needed(1, 0.01) == 9 and rounds_needed(6, 0.05) == 9
    assert family_size(2, 1) == 2 and family_size(2, 5) == 12
    many = [FASTER] + [{"NCCL_PROTO": p} for p in ("LL", "^LL", "^LL128")] * 10
    report, _ = run({"LL128": 0.1}, 0, candidates=many, thresholds=Thresholds(rounds=10))
    assert report.max_rounds == rounds_needed(family_size(31, 2), 0.01) == 16
    assert report.notes[0].startswith("rounds raised from 10 to 16: Holm over 93 tests (31 candidate(s) x (overall + 2")


# ------------------------------------------------------------------ the GPU run's A/A rounds, re-judged
GPU_AA = REPO / "results" / "tuning" / "gpu-h200x4" / "aa"
NOT_KNOBS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_TESTS_DIR", "NCCL_VERSION")


def gpu_aa_rounds() -> dict[int, tuple[dict, list[dict[int, dict[str, float]]]]]:
    """Per A/A tune of the committed 4x H200 run: (tune summary, its finalization rounds as bucket
    times: -1 = baseline, 0 = the candidate), from the raw runs (packed: aa/runs.jsonl). A slot's runs are consecutive: per tune
    its trials, a validation run (--check) if the candidate needed one, then the rounds."""
    summary = json.loads((GPU_AA / "summary.json").read_text())
    runs: dict[str, list[tuple[dict[str, str], bool, dict[int, float]]]] = {}
    for run in sorted(read_pack(GPU_AA / "runs.jsonl"), key=lambda entry: entry.id):
        records = [json.loads(line) for line in run.text("/commbench.jsonl").splitlines() if line]
        env = records[0]["env"]
        knobs = {k: v for k, v in env.items() if k.startswith("NCCL_") and k not in NOT_KNOBS}
        medians = {r["bytes"]: float(np.median(r["samples_us"])) for r in records}
        runs.setdefault(env["CUDA_VISIBLE_DEVICES"], []).append(
            (knobs, "--check" in run.text("/command.txt"), medians)
        )
    tunes = {}
    for tune in summary["tunes"]:
        pending = runs[tune["slot"]["CUDA_VISIBLE_DEVICES"]]
        fin = tune["finalization"]
        assert [knobs for knobs, _, _ in pending[: len(tune["trials"])]] == [t["env"] for t in tune["trials"]]
        del pending[: len(tune["trials"])]
        if pending[0][1]:
            del pending[0]
        baseline, candidate = tune["trials"][0]["env"], fin["candidates"][0]
        rounds = []
        for _ in range(fin["rounds_used"]):
            pair = {knobs == candidate: medians for knobs, _, medians in pending[:2]}
            assert {knobs == baseline for knobs, _, _ in pending[:2]} == {True, False}
            del pending[:2]
            rounds.append({-1: bucket_times_us(pair[False], FIVE_BUCKETS),
                           0: bucket_times_us(pair[True], FIVE_BUCKETS)})
        tunes[tune["tune"]] = (tune, rounds)
    return tunes


def decide_at_one_look(baseline_env: Mapping[str, str], candidates: Sequence[Candidate],
                       buckets: Sequence[SizeBucket], rounds_data: Sequence[Mapping[int, Mapping[str, float]]],
                       thresholds: Thresholds) -> tuple[Decision, dict[str, Decision], int]:
    """The decisions from measured rounds (per setting, -1 the baseline: bucket -> time) by finalize's tests
    at one look: (overall, per bucket, family size), every test in one Holm correction. Finalize's
    group-sequential rule would need more rounds than the committed A/A ran."""
    assert decisions_tested(len(buckets)) > 1
    names = [OVERALL, *(b.name for b in buckets)]

    def series(index: int, decision: str) -> np.ndarray:
        if decision == OVERALL:
            return np.asarray([overall_time_us(measured[index]) for measured in rounds_data])
        return np.asarray([measured[index][decision] for measured in rounds_data])

    log_ratios = {name: {i: np.log(series(-1, name)) - np.log(series(i, name)) for i in range(len(candidates))}
                  for name in names}
    judged, family = decide_paired(baseline_env, {name: candidates for name in names}, log_ratios,
                                   {name: {} for name in names}, thresholds)
    return judged[OVERALL], {b.name: judged[b.name] for b in buckets}, family


def test_gpu_aa_rounds_rejudged_keep_every_default() -> None:
    """The committed A/A (5 tunes, 7 rounds each, alpha 0.05 as in gpu-demo.yaml): per-bucket changes at
    2 MiB in tunes 3 and 4. Re-judged from the same rounds: no change anywhere now. The family-wide
    Holm alone would have kept tune 4's (7 of 7 rounds faster: p = 2**-7, 6 tests x 2**-7 = 0.047 < 0.05):
    the effect is consistent but not shown to exceed the minimum effect."""
    thresholds = Thresholds(alpha=0.05, min_effect=0.03, rounds=5)
    per_bucket_changes = {}
    for number, (tune, rounds) in gpu_aa_rounds().items():
        baseline = tune["trials"][0]["env"]
        candidates = [Candidate(tune["finalization"]["candidates"][0])]
        overall, buckets, family = decide_at_one_look(baseline, candidates, FIVE_BUCKETS, rounds, thresholds)
        # The reconstruction is the run's own: the same gains as its summary.
        for entry in tune["finalization"]["per_size"]:
            if entry["gain"] is not None:
                assert buckets[entry["bucket"]].comparisons[0].gain == pytest.approx(entry["gain"], rel=1e-9)
        assert family == 6 and not overall.change and not any(d.change for d in buckets.values())
        report = FinalReport(baseline, overall, buckets, thresholds, 7, len(rounds), family, "", "")
        per_bucket_changes[number] = sorted(c.decision for c in accepted_by_rule(report)["family-zero"])
    assert per_bucket_changes == {0: [], 1: [], 2: [], 3: [], 4: ["2MiB-2MiB"]}
    two_mib = gpu_aa_rounds()[4][1]
    assert all(r[-1]["2MiB-2MiB"] > r[0]["2MiB-2MiB"] for r in two_mib)  # the candidate faster in every round
    assert OVERALL not in per_bucket_changes[4]


def test_holm_adjusted_p_is_the_running_maximum_and_a_seed_gives_one_result() -> None:
    """One look (a fixed budget of 10 rounds) and 3 tests (overall + 2 buckets) that all have p = 2**-10:
    Holm's adjusted p is 3 x 2**-10 for each, not 1, 2 and 3 x 2**-10 in whatever order a set of equal p
    values came out (that order followed Python's hash seed, and so did the bootstrap intervals after it)."""
    report, _ = run({"LL128": 0.3}, 0, noise=0.02, candidates=(FASTER,),
                    thresholds=Thresholds(alpha=0.05, rounds=10, look_every=10))
    tests = [report.overall.winner, *(d.winner for d in report.buckets.values())]
    assert all(c is not None and c.p_value == 2.0 ** -10 for c in tests)
    assert [c.p_adjusted for c in tests if c is not None] == pytest.approx([3 * 2.0 ** -10] * 3)
    script = ("import sys; sys.path[:0] = ['tests', '.']; import test_tuner_finalize as t; "
              "print(repr(t.run({'LL128': 0.2, 'LL': 0.2}, 1, noise=0.02)[0]))")
    outputs = {subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONHASHSEED": seed},
                              capture_output=True, text=True, check=True).stdout for seed in ("1", "2", "3")}
    assert len(outputs) == 1


def test_the_third_test_passes_only_through_holms_step_down() -> None:
    """One look of 10 rounds, 3 tests (overall + 2 buckets) of one candidate: twice the speed in the small
    bucket (p = 2**-10 there and overall); in the large one the log ratios minus the 3 % margin are 0.01,
    0.02, .., 0.10 with the 8th negative, so its signed-rank p is 25 / 1024 = 0.0244: above alpha / 3 =
    0.0167 (Bonferroni, or a step-down that does not step), below alpha = 0.05, Holm's level after two
    rejections. Every round is exact: no noise decides it."""
    margins = [0.01 * (r + 1) * (-1 if r == 7 else 1) for r in range(10)]
    runs = {"baseline": 0, "candidate": 0}

    def evaluate(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        if not env:
            runs["baseline"] += 1
            return Evaluation({64: [100.0], 1 << 20: [100.0]})
        r = runs["candidate"] % 10
        runs["candidate"] += 1
        return Evaluation({64: [50.0], 1 << 20: [100.0 / (1.03 * np.exp(margins[r]))]})

    report = finalize(evaluate, {}, [Candidate(FASTER)], TWO_BUCKETS, seed=0,
                      thresholds=Thresholds(alpha=0.05, rounds=10, look_every=10))
    large = report.buckets["large"].winner
    assert report.rounds_run == 10 and large is not None and large.p_value == pytest.approx(25 / 1024)
    assert report.overall.change and report.buckets["small"].change and report.buckets["large"].change
    assert large.p_adjusted == pytest.approx(25 / 1024)  # the last step: alpha / level = 1


def test_the_median_interval_covers_at_least_its_level() -> None:
    """Order statistics: 6 rounds give [min, max] (96.9 %), 10 rounds [x(2), x(9)] (97.9 %), and over
    4,000 samples of 6-12 skewed (log-normal) ratios the 95 % interval holds the true median at least 95 %
    of the time; the percentile bootstrap it replaced held it 93.3 / 91.6 / 95.0 / 93.6 % of the time at
    6 / 8 / 10 / 12 rounds."""
    values = np.arange(1.0, 11.0)
    assert median_ci(values[:6], 0.95) == (1.0, 6.0) and median_ci(values, 0.95) == (2.0, 9.0)
    rng = np.random.default_rng(0)
    for n in (6, 8, 10, 12):
        samples = rng.lognormal(0.0, 0.5, (1000, n))  # true median 1
        covered = [low <= 1.0 <= high for low, high in (median_ci(s, 0.95) for s in samples)]
        assert np.mean(covered) >= 0.95, n


def test_a_candidate_that_stalls_is_refused_when_its_stalls_show() -> None:
    """5 % faster in 90 % of its runs, 2x slower in 10 % (4.8 % longer in mean time): the signed-rank test and
    the median take it for a gain. Refused when it took longer than the defaults summed over the rounds: 4
    of these 20 finalizations still deploy it (runs whose few stalls happened not to show), 8 without the
    check."""
    deployed = {True: 0, False: 0}
    refused = 0
    for check in (True, False):
        for seed in range(20):
            evaluate = DriftingEvaluator((64, 1 << 20), {"LL128": 0.05}, 0.02, seed, stalls={"LL128": (0.1, 2.0)})
            report = finalize(evaluate, BASELINE, [Candidate(FASTER)], TWO_BUCKETS, seed=seed,
                              thresholds=Thresholds(total_time_check=check))
            deployed[check] += report.overall.change
            refused += any("slower in total" in note for note in report.notes)
    assert deployed[True] <= 5 and refused >= 3 and deployed[False] >= deployed[True] + 3, deployed


def test_no_candidate_runs_no_round() -> None:
    """Nothing to compare (a tune whose only measured setting is the defaults): no baseline-only rounds."""
    calls: list[Mapping[str, str]] = []

    def evaluate(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        calls.append(env)
        return Evaluation({64: [1.0]})

    report = finalize(evaluate, {}, [], TWO_BUCKETS, thresholds=Thresholds(rounds=5))
    assert calls == [] and report.rounds_run == 0 and not report.overall.change
    assert not any("Holm over 0 tests" in note for note in report.notes), report.notes


# ------------------------------------------------- group-sequential looks, ablation, held-out gains
def test_nominal_levels_spend_alpha_over_the_looks() -> None:
    """Brownian motion under H0, 8 equally spaced looks: the O'Brien-Fleming levels reject at some look
    with probability alpha; alpha at every look would reject far more often, alpha / 8 (Bonferroni) far
    less, so a wrong spending fails the bounds."""
    fractions = tuple(k / 8 for k in range(1, 9))
    levels = nominal_levels(fractions, 0.05)
    assert nominal_levels((1.0,), 0.05) == pytest.approx((0.05,))
    assert list(levels) == sorted(levels) and levels[0] < 1e-6 and 0.035 < levels[-1] < 0.05
    rng = np.random.default_rng(0)
    paths = np.cumsum(rng.standard_normal((200_000, 8)), axis=1) / np.sqrt(np.arange(1, 9))  # Z at each look
    from scipy import stats

    p = stats.norm.sf(paths)
    assert 0.047 < np.mean((p < np.array(levels)).any(axis=1)) < 0.053
    assert np.mean((p < 0.05).any(axis=1)) > 0.15
    assert np.mean((p < 0.05 / 8).any(axis=1)) < 0.035


def _exact_crossing_ratio(levels_of, family: int, draws: int, seed: int = 0,
                          tilt: float = 0.68) -> tuple[float, float]:
    """P(the exact one-sided signed-rank test of one true H0 passes at some look) / (alpha / family) under the
    default design (alpha 0.01, 40 rounds, a look every 5, looks before min_rounds skipped, as finalize does),
    the levels `levels_of(fractions, alpha / family)`, and its standard error. Under H0 (independent values
    symmetric about the margin, continuous) the signs are fair coins independent of the magnitudes' order,
    whatever the noise: signs drawn + with probability `tilt` and reweighted (importance sampling: the
    crossings are ~1e-3 events), magnitudes uniform."""
    from tuners.finalize import _signed_rank_null

    t = Thresholds()
    looks = look_rounds(t, t.rounds)
    levels = levels_of(tuple(n / t.rounds for n in looks), t.alpha / family)
    critical = {}
    for n, level in zip(looks, levels, strict=True):
        at_least = 1 - np.concatenate([[0.0], _signed_rank_null(n)[:-1]])  # P(W+ >= w)
        passing = np.nonzero(at_least < level)[0]
        if n >= min_rounds(family, t.alpha) and len(passing):
            critical[n] = passing[0]
    rng = np.random.default_rng(seed)
    positive = rng.random((draws, t.rounds)) < tilt
    order = rng.random((draws, t.rounds))
    crossed = np.zeros(draws, bool)
    for n, w in critical.items():
        ranks = order[:, :n].argsort(axis=1).argsort(axis=1) + 1
        crossed |= (ranks * positive[:, :n]).sum(axis=1) >= w
    k = positive.sum(axis=1)
    weight = crossed * np.exp(k * np.log(0.5 / tilt) + (t.rounds - k) * np.log(0.5 / (1 - tilt)))
    design = t.alpha / family
    return float(weight.mean() / design), float(weight.std() / np.sqrt(draws) / design)


def test_the_exact_signed_rank_test_keeps_its_share_of_alpha_over_the_looks() -> None:
    """Brownian motion's levels (nominal_levels) applied to the exact signed-rank p values, re-ranked at each
    look: one true H0 of a family of 12 (2 candidates x (overall + 5 buckets)) passed at some look with
    1.024 x alpha / 12 (1e6 draws, sd 0.4 %; plain simulation 2 x 2e7: 1.021, 1.019): with all 12 at the
    margin the family's bound is 1.02 x alpha. look_levels, at 0.95 x alpha / m with two or more looks,
    keeps it below: 0.94. One look is the exact test at alpha / m itself."""
    unspent, se = _exact_crossing_ratio(nominal_levels, 12, 300_000)
    assert unspent > 1.0 + se, (unspent, se)  # what look_levels corrects (1.037 +- 0.012 with this seed)
    ratio, se = _exact_crossing_ratio(look_levels, 12, 300_000)  # 0.950 +- 0.011
    assert ratio + 3 * se < 1.0, (ratio, se)
    ratio, se = _exact_crossing_ratio(look_levels, 1, 300_000, tilt=0.65)  # 0.954 +- 0.007
    assert ratio + 3 * se < 1.0, (ratio, se)
    assert look_levels((1.0,), 0.01) == nominal_levels((1.0,), 0.01) == pytest.approx((0.01,))


def test_a_strong_effect_stops_early_and_a_fixed_budget_does_not() -> None:
    report, _ = run({"LL128": 0.2}, 1, noise=0.02)
    assert report.overall.env == FASTER and report.looks == (5, 10, 15, 20, 25, 30, 35, 40)
    assert report.rounds_run <= 20 and any(note.startswith(f"stopped after {report.rounds_run} of at most 40")
                                           for note in report.notes)
    # ... but not at the first look it may take (10 rounds: 3 tests need 2**-n < 0.01 / 3): O'Brien-Fleming
    # spends almost nothing there; the full level at every look (no spending) stops at 10.
    assert report.rounds_run >= 15
    fixed, _ = run({"LL128": 0.2}, 1, noise=0.02, thresholds=Thresholds(look_every=40))
    assert fixed.overall.env == FASTER and fixed.looks == (40,) and fixed.rounds_run == 40


def _knob_evaluator(seed: int, speedups: Mapping[str, float], socket_threads_act: bool = False):
    """Runs whose speed depends on two knobs: NCCL_PROTO=LL128 ("P") and NCCL_BUFFSIZE=8388608 ("B");
    NCCL_SOCKET_NTHREADS=15 ("S") does nothing unless `socket_threads_act`. Records every call."""
    inner = DriftingEvaluator(SIZES, speedups, 0.02, seed)
    calls: list[tuple[dict[str, str], Evaluation]] = []

    def evaluate(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        label = ("P" if env.get("NCCL_PROTO") == "LL128" else "") + ("B" if env.get("NCCL_BUFFSIZE") == "8388608" else "")
        label += "S" if socket_threads_act and env.get("NCCL_SOCKET_NTHREADS") == "15" else ""
        evaluation = inner({"NCCL_PROTO": label or "none"}, validate=validate)
        calls.append((dict(env), evaluation))
        return evaluation

    return evaluate, calls


THREE_KNOBS = {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608", "NCCL_SOCKET_NTHREADS": "15"}


def test_ablation_drops_an_inert_knob_and_keeps_those_that_act() -> None:
    """The winner sets three knobs; two give 10 % each, NCCL_SOCKET_NTHREADS=15 nothing (as the synthetic
    NVLink recommendation carried it). Deployed: the two that act, every time; the inert one goes unless
    its removal "loses" by chance (one-sided p < 0.05: seed 0 of these 10, p 0.02). Without ablation the
    inert one rides along."""
    speedups = {"P": 0.1, "B": 0.1, "PB": 0.21}
    inert_dropped = 0
    for seed in range(10):
        evaluate, _ = _knob_evaluator(seed, speedups)
        report = finalize(evaluate, {}, [Candidate(THREE_KNOBS)], TWO_BUCKETS, seed=seed)
        assert report.overall.winner is not None and report.overall.winner.candidate.env == THREE_KNOBS
        kept = {a.knob: a.kept for a in report.overall.ablation}
        assert kept["NCCL_BUFFSIZE"] and kept["NCCL_PROTO"], seed
        if not kept["NCCL_SOCKET_NTHREADS"]:
            inert_dropped += 1
            assert report.overall.env == {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}
            assert any("ablation dropped NCCL_SOCKET_NTHREADS" in note for note in report.notes)
    assert inert_dropped >= 8
    evaluate, _ = _knob_evaluator(1, speedups)
    without = finalize(evaluate, {}, [Candidate(THREE_KNOBS)], TWO_BUCKETS, seed=1,
                       thresholds=Thresholds(ablation_rounds=0))
    assert without.overall.env == THREE_KNOBS


def test_ablation_keeps_knobs_that_stand_in_for_each_other() -> None:
    """Two knobs that stand in for each other (each alone +10 %, both +10 %) and an inert one: no single
    removal loses, so the tested winner is deployed whole. The rule before kept only the knob whose removal
    happened to lose most and deployed the inert NCCL_SOCKET_NTHREADS=15 alone in 4 of these 10 seeds (as
    they were shuffled when it was replaced)."""
    for seed in range(10):
        evaluate, _ = _knob_evaluator(seed, {"P": 0.1, "B": 0.1, "PB": 0.1})
        report = finalize(evaluate, {}, [Candidate(THREE_KNOBS)], TWO_BUCKETS, seed=seed)
        deployed = report.overall.env
        assert "NCCL_PROTO" in deployed or "NCCL_BUFFSIZE" in deployed, (seed, deployed, report.notes)
        assert report.overall.holdout is not None and report.overall.holdout.gain > 0.05, seed


def test_a_reduced_set_that_loses_beside_the_winner_is_not_deployed() -> None:
    """LL128 gives 10 %; the buffer size and the socket threads 5 %, each alone or both (they stand in for
    each other). Removing either of those two alone loses nothing, but the set without both (LL128 alone,
    never measured in the ablation rounds) loses 5 %: the confirmation rounds beside the winner refuse it.
    Without them, LL128 alone was deployed in 4 of these 5 seeds (as they were shuffled then)."""
    speedups = {"P": 0.1, "B": 0.05, "S": 0.05, "BS": 0.05, "PB": 0.155, "PS": 0.155, "PBS": 0.155}
    refused = 0
    for seed in range(5):
        evaluate, _ = _knob_evaluator(seed, speedups, socket_threads_act=True)
        report = finalize(evaluate, {}, [Candidate(THREE_KNOBS)], TWO_BUCKETS, seed=seed)
        assert report.overall.env != FASTER, (seed, report.notes)
        refused += any("without them all together the set loses" in a.reason for a in report.overall.ablation)
    assert refused >= 3


def test_ablation_keeps_a_knob_without_which_a_size_is_slower_than_the_defaults() -> None:
    """LL128 gives 25 % above 64 B and loses 10 % at 64 B; the buffer size wins those 10 % back at 64 B and
    costs as much at 64 MiB: the winner (both) is as fast as LL128 alone overall, and no size is slower than
    the defaults. Removing the buffer size does not lose overall, but leaves 64 B 10 % slower than the
    defaults, which the overall winner must not be: the buffer size is kept. Before, LL128 alone was
    deployed in each of these seeds (its 64 B loss hidden behind a held-out overall gain of +17 %)."""
    sizes = buckets_for_sizes(SIZES, 1)
    speedups = {"P": {s: -0.10 if s == 64 else 0.25 for s in SIZES},
                "B": {64: 0.10, 1 << 26: -0.10},
                "PB": {s: 0.0 if s == 64 else 0.125 if s == 1 << 26 else 0.25 for s in SIZES}}
    winner = {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}
    for seed in range(5):
        evaluate, _ = _knob_evaluator(seed, speedups)
        report = finalize(evaluate, {}, [Candidate(winner)], sizes, seed=seed)
        assert report.overall.winner is not None and report.overall.env == winner, (seed, report.notes)
        kept = next(a for a in report.overall.ablation if a.knob == "NCCL_BUFFSIZE")
        assert kept.kept and "without it bucket 64B-64B" in kept.reason and "is slower" in kept.reason, kept.reason


def test_ablation_removes_a_knob_with_the_companion_it_requires() -> None:
    """Open MPI's winner: the TCP send buffer (+10 %) and a forced allreduce algorithm (nothing) with the
    use_dynamic_rules=1 it requires (catalog `requires`). The companion is no decision of its own: the algorithm
    goes with it, so no deployed set holds use_dynamic_rules=1 without an algorithm (a no-op: the catalog's
    inert_unless_any_set). Ablated apart, launch noise kept it alone beside the buffer (seen in a tune; seed 0
    here)."""
    rules, algorithm, sndbuf = ("OMPI_MCA_coll_tuned_use_dynamic_rules", "OMPI_MCA_coll_tuned_allreduce_algorithm",
                                "OMPI_MCA_btl_tcp_sndbuf")
    space = build_space(load_site("local").knob_catalog(), {"openmpi": "4.1.4"}, op="allreduce", transport="mpi",
                        knobs=[algorithm, sndbuf])
    winner = {rules: "1", algorithm: "ring", sndbuf: "65536"}
    for seed in range(6):
        inner = DriftingEvaluator(SIZES, {"B": 0.1}, 0.03, seed)
        launched: list[dict[str, str]] = []

        def evaluate(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
            launched.append(dict(env))
            return inner({"NCCL_PROTO": "B" if sndbuf in env else "none"}, validate=validate)

        report = finalize(evaluate, {}, [Candidate(winner)], TWO_BUCKETS, seed=seed,
                          effective_env=space.effective_env, requires=space.requires)
        assert {a.knob for a in report.overall.ablation} == {algorithm, sndbuf}, seed
        assert not any((rules in env) != (algorithm in env) for env in launched), seed
        assert report.overall.env in (winner, {sndbuf: "65536"}), (seed, report.overall.env, report.notes)


def test_a_companion_two_knobs_require_goes_only_with_the_last() -> None:
    from tuners.finalize import _without

    rules = {"R": "1"}
    requires = {"A": rules, "B": rules}.get
    env = {"A": "ring", "B": "bruck", "R": "1", "S": "4"}
    assert _without(env, {}, "A", lambda k: requires(k) or {}) == {"B": "bruck", "R": "1", "S": "4"}
    assert _without({"A": "ring", "R": "1"}, {}, "A", lambda k: requires(k) or {}) == {}
    assert _without({"A": "ring", "R": "1"}, {"R": "1"}, "A", lambda k: requires(k) or {}) == {"R": "1"}  # baseline's


def test_a_winner_that_fails_in_an_ablation_or_confirmation_round_is_withdrawn() -> None:
    """The winner (LL128 + an inert buffer size, +15 %) hangs once after the sequential phase: in an ablation
    round, or (three knobs, two inert) in a confirmation round beside the reduced set. A candidate that fails in
    any round is rejected, as in the held-out rounds (withdrawn, keep defaults); before, it was deployed whole."""
    two_knobs = {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}
    for winner, phase in ((two_knobs, "ablation"), (THREE_KNOBS, "confirmation")):
        evaluate, calls = _knob_evaluator(2, {"P": 0.15, "PB": 0.15})
        unbounded = finalize(evaluate, {}, [Candidate(winner)], TWO_BUCKETS, seed=2)
        assert unbounded.overall.env == {"NCCL_PROTO": "LL128"}, unbounded.notes  # the inert knobs dropped
        sequential = unbounded.rounds_run * 2
        ablation = Thresholds().ablation_rounds * (1 + len(winner))
        hang_at = sequential + (3 if phase == "ablation" else ablation + 3)  # a run in that phase's first rounds
        evaluate, calls = _knob_evaluator(2, {"P": 0.15, "PB": 0.15})
        runs: list[dict[str, str]] = []

        def hangs_once(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
            runs.append(dict(env))
            if env == winner and len(runs) >= hang_at and not any("hung" in str(e.reason) for _, e in calls):
                calls.append((dict(env), Evaluation.failed(FailureKind.TIMEOUT, "hung: watchdog")))
                return calls[-1][1]
            return evaluate(env, validate=validate)

        report = finalize(hangs_once, {}, [Candidate(winner)], TWO_BUCKETS, seed=2)
        assert sum("hung" in str(e.reason) for _, e in calls) == 1 and report.rounds_run == unbounded.rounds_run
        assert report.overall.verdict == "keep-defaults" and report.overall.env == {}, (phase, report.notes)
        assert any(f"the winner failed in a{'n' if phase == 'ablation' else ''} {phase} round (timeout: hung: "
                   "watchdog): withdrawn, keep defaults" in n
                   for n in report.notes), (phase, report.notes)


def test_a_reduced_set_with_an_unsafe_change_is_deployed_only_after_its_own_validated_run() -> None:
    """The winner NCCL_PROTO=Simple (may-corrupt) + NCCL_BUFFSIZE=8 MiB (may-hang, inert here) is validated;
    ablation drops the buffer size. NCCL_PROTO=Simple alone was never validated (another combination): it runs
    once with validation and is deployed only if that passes, else the validated winner is deployed whole.
    Before, the reduced set was deployed unvalidated."""
    space = build_space(load_site("local").knob_catalog(), {"nccl": "2.28.3"},
                        knobs=["NCCL_PROTO", "NCCL_BUFFSIZE"], op="allreduce", transport="ccl")
    winner = {"NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "8388608"}
    alone = {"NCCL_PROTO": "Simple"}
    one = (SizeBucket("all", 0, 1 << 30),)

    def finalize_with(alone_corrupts: bool) -> tuple[FinalReport, list[dict[str, str]]]:
        rng = np.random.default_rng(0)
        validated: list[dict[str, str]] = []

        def evaluate(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
            if validate:
                validated.append(dict(env))
                if alone_corrupts and dict(env) == alone:
                    return Evaluation.failed(FailureKind.INVALID, "data validation failed (8 B: 3 wrong)")
            t = 5.0 if env.get("NCCL_PROTO") == "Simple" else 10.0
            return Evaluation(times_us={8: list(t * rng.lognormal(0, 0.02, 5))}, validated=validate)

        report = finalize(evaluate, {}, [Candidate(winner, 1)], one, needs_validation=space.unsafe_changes)
        assert [a.knob for a in report.overall.ablation if "removal does not lose" in a.reason] == ["NCCL_BUFFSIZE"]
        return report, validated

    report, validated = finalize_with(alone_corrupts=False)
    assert report.overall.env == alone and validated == [winner, alone]
    assert any("reduced set (NCCL_PROTO=Simple) passed a validated run of its own" in n for n in report.notes)
    report, validated = finalize_with(alone_corrupts=True)
    assert report.overall.env == winner and validated == [winner, alone]
    assert all(a.kept for a in report.overall.ablation)
    # the evidence says what the ablation found, though it kept every knob (a user found it recorded nowhere)
    (note,) = [n for n in report.notes if ": ablation, the winner without each knob: " in n]
    assert "NCCL_BUFFSIZE dropped (" in note and "NCCL_PROTO kept (" in note and "without it, one-sided p=" in note
    assert any("reduced set (NCCL_PROTO=Simple) is not deployed" in n and "3 wrong" in n
               and "the winner, validated, is deployed whole" in n for n in report.notes)
    assert report.overall.holdout is not None  # the held-out rounds measure the winner deployed
    # its interval's level, said with it: 1 - 2 P(Binomial(n, 1/2) < k) (6 rounds at 95 %: [min, max], 96.9 %)
    from tuners.finalize import median_ci_coverage

    assert report.overall.holdout.coverage == median_ci_coverage(report.overall.holdout.rounds, 0.95)
    assert median_ci_coverage(6, 0.95) == 1 - 2 * 0.5 ** 6 and median_ci_coverage(5, 0.95) == 1 - 2 * 0.5 ** 5


def test_a_reduced_set_that_finalization_refused_is_not_deployed() -> None:
    """finalization_candidates hands finalize the best trial and its simplified best (the same less some knobs).
    When the simplified set is refused - its validated run gave wrong data, it hung in a round, it was slower than
    the defaults in a size bucket - and the superset wins, ablation drops the superset's knob that looks inert and
    lands on the refused set: before, it was deployed (after one more validated run that passed, for the first;
    not even that for the others). A refused candidate is never what ablation deploys: the winner whole."""
    space = build_space(load_site("local").knob_catalog(), {"nccl": "2.28.3"},
                        knobs=["NCCL_PROTO", "NCCL_BUFFSIZE"], op="allreduce", transport="ccl")
    one = (SizeBucket("all", 0, 1 << 30),)
    # wrong data in the simplified set's validated run (intermittent: a later validated run would pass)
    best, simplified = {"NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "8388608"}, {"NCCL_PROTO": "Simple"}
    rng, validated = np.random.default_rng(0), []

    def corrupts_once(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        if validate:
            validated.append(dict(env))
            if dict(env) == simplified and validated.count(simplified) == 1:
                return Evaluation.failed(FailureKind.INVALID, "data validation failed (8 B: 3 wrong)")
        t = 5.0 if env.get("NCCL_PROTO") == "Simple" else 10.0
        return Evaluation(times_us={8: list(t * rng.lognormal(0, 0.02, 5))}, validated=validate)

    report = finalize(corrupts_once, {}, [Candidate(best, 1), Candidate(simplified, 2)], one,
                      needs_validation=space.unsafe_changes)
    assert report.overall.env == best and validated == [best, simplified], report.notes
    assert any("the reduced set is a candidate this finalization refused (trial 2: validated re-run" in a.reason
               for a in report.overall.ablation)
    # the reduced set keeps a knob that changes nothing without the one ablation dropped: the refused configuration
    sockets = build_space(load_site("local").knob_catalog(), {"nccl": "2.28.3"}, op="allreduce", transport="ccl",
                          knobs=["NCCL_PROTO", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"])
    best = {"NCCL_PROTO": "Simple", "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}
    validated.clear()

    def sockets_corrupt(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        if validate:
            validated.append(dict(env))
            if dict(env) == simplified:
                return Evaluation.failed(FailureKind.INVALID, "data validation failed (8 B: 3 wrong)")
        t = 5.0 if env.get("NCCL_PROTO") == "Simple" else 10.0
        slower = "NCCL_SOCKET_NTHREADS" in env and "NCCL_NSOCKS_PERTHREAD" not in env  # threads of one socket each
        return Evaluation(times_us={8: list(t * (1.3 if slower else 1.0) * rng.lognormal(0, 0.02, 5))},
                          validated=validate)

    report = finalize(sockets_corrupt, {}, [Candidate(best, 1), Candidate(simplified, 2)], one,
                      needs_validation=sockets.unsafe_changes, effective_env=sockets.catalog.effective_env, seed=0)
    assert report.overall.env == best, report.notes
    # the simplified set hangs in its first round
    best, simplified = {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}, {"NCCL_PROTO": "LL128"}
    evaluate, calls = _knob_evaluator(3, {"P": 0.15, "PB": 0.15})

    def hangs_once(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        if dict(env) == simplified and not any("hung" in str(e.reason) for _, e in calls):
            calls.append((dict(env), Evaluation.failed(FailureKind.TIMEOUT, "hung: watchdog")))
            return calls[-1][1]
        return evaluate(env, validate=validate)

    report = finalize(hangs_once, {}, [Candidate(best), Candidate(simplified)], TWO_BUCKETS, seed=0)
    assert report.overall.comparisons[1].reason.startswith("failed in re-measurement round 1: timeout: hung")
    assert report.overall.env == best, report.notes
    # the simplified set is 5 % slower at the smallest size (the buffer size gives that back), 20 % faster above
    inner = DriftingEvaluator(SIZES, {"P": {SIZES[0]: -0.05, **{s: 0.2 for s in SIZES[1:]}}, "PB": 0.2}, 0.02, 0)

    def sized(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        label = ("P" if env.get("NCCL_PROTO") == "LL128" else "") + ("B" if "NCCL_BUFFSIZE" in env else "")
        return inner({"NCCL_PROTO": label or "none"}, validate=validate)

    three = buckets_for_sizes(SIZES, 1)
    refused_as_slower = 0
    for seed in range(4):
        report = finalize(sized, {}, [Candidate(best), Candidate(simplified)], three, seed=seed)
        refused = "slower in bucket" in report.overall.comparisons[1].reason
        refused_as_slower += refused
        assert report.overall.env != simplified, (seed, report.notes)
    assert refused_as_slower >= 2


def test_a_winner_that_failed_in_ablation_rounds_cut_short_by_the_deadline_is_withdrawn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline passes after the first ablation round, in which the winner hung: the rounds that ran still
    withdraw it (as a completed ablation does); before, 'no ablation: the time budget ran out' deployed it whole."""
    import tuners.finalize as finalize_module

    winner = {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}
    evaluate, calls = _knob_evaluator(1, {"P": 0.15, "PB": 0.15})
    unbounded = finalize(evaluate, {}, [Candidate(winner)], TWO_BUCKETS, seed=0)
    sequential = unbounded.rounds_run * 2
    runs = [0]

    class RunClock:  # time.monotonic as finalize sees it: one second per run
        @staticmethod
        def monotonic() -> float:
            return float(runs[0])

    monkeypatch.setattr(finalize_module, "time", RunClock)
    evaluate, calls = _knob_evaluator(1, {"P": 0.15, "PB": 0.15})

    def hangs_after_the_sequential_phase(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        runs[0] += 1
        if dict(env) == winner and runs[0] > sequential:
            return Evaluation.failed(FailureKind.TIMEOUT, "hung: watchdog")
        return evaluate(env, validate=validate)

    report = finalize(hangs_after_the_sequential_phase, {}, [Candidate(winner)], TWO_BUCKETS, seed=0,
                      deadline=sequential + 3)
    assert report.rounds_run == unbounded.rounds_run and runs[0] < sequential + 3 * (1 + len(winner))
    assert report.overall.verdict == "keep-defaults" and report.overall.env == {}, report.notes
    assert any("no ablation: the time budget ran out" in n and "but one that failed" in n for n in report.notes)
    assert any("the winner failed in an ablation round (timeout: hung: watchdog): withdrawn" in n
               for n in report.notes)


def test_a_run_missing_a_size_or_a_bucket_is_a_failed_run_not_a_crash() -> None:
    """A finalization run that lacks a bucket (or one size of one) fails that setting in that round, as any
    failed run: a candidate is rejected, the baseline's round dropped. Before, finalize raised ValueError
    after every trial had run."""
    hand = (SizeBucket("small", 1, 64), SizeBucket("large", 65, 4096))

    def candidate_lacks_large(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        return Evaluation(times_us={8: [1.0]} if env else {8: [1.0], 4096: [10.0]})

    report = finalize(candidate_lacks_large, {}, [Candidate({"NCCL_CROSS_NIC": "0"}, 1)], hand)
    assert report.overall.verdict == "keep-defaults"
    assert report.overall.comparisons[0].reason == (
        "failed in re-measurement round 1: invalid: no measured size falls into bucket large [65, 4096]")
    steady = DriftingEvaluator(SIZES, {"LL128": 0.2}, 0.02, 4)
    baseline_calls = []

    def baseline_lacks_1k(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        evaluation = steady(env, validate=validate)
        if env == BASELINE:
            baseline_calls.append(1)
            if len(baseline_calls) in (2, 7):
                return Evaluation({s: t for s, t in evaluation.times_us.items() if s != 1024})
        return evaluation

    report = finalize(baseline_lacks_1k, BASELINE, [Candidate(FASTER)], buckets_for_sizes(SIZES),
                      thresholds=Thresholds(rounds=12))
    assert report.rounds_used == 10 and report.overall.verdict == "change"
    assert sum("baseline failed (invalid: requested size(s) 1KiB not measured)" in n for n in report.notes) == 2


def test_the_reported_gain_comes_from_rounds_after_the_choice() -> None:
    """The held-out gain is computed from the last rounds only (baseline and the deployed set), none of
    which chose the winner; the recommendation and the .env file report it."""
    evaluate, calls = _knob_evaluator(4, {"P": 0.15})
    report = finalize(evaluate, {}, [Candidate(FASTER), Candidate(OTHER)], TWO_BUCKETS, seed=4)
    held = report.overall.holdout
    assert report.overall.env == FASTER and held is not None and held.rounds == Thresholds().holdout_rounds == 6
    tail = calls[-2 * held.rounds:]
    assert sorted(env.get("NCCL_PROTO", "default") for env, _ in tail) == ["LL128"] * 6 + ["default"] * 6
    by_round = [{env.get("NCCL_PROTO", "default"): e for env, e in tail[i:i + 2]} for i in range(0, len(tail), 2)]
    expected = [overall_time_us(bucket_times_us(r["default"].median_us(), TWO_BUCKETS))
                / overall_time_us(bucket_times_us(r["LL128"].median_us(), TWO_BUCKETS)) for r in by_round]
    assert held.ratios == pytest.approx(expected)
    assert held.gain == pytest.approx(np.median(expected) - 1)
    assert not set(held.ratios) & set(report.overall.winner.ratios)
    rec = build_recommendation(make_scope(), report, TWO_BUCKETS, optuna.create_study(), {"nccl": "2.28.3"})
    assert rec.held_out is not None and rec.held_out.median == held.gain
    assert "held out: +" in env_file_text(rec, rec.env, rec.unset)
    evaluate, _ = _knob_evaluator(4, {"P": 0.15})
    assert finalize(evaluate, {}, [Candidate(FASTER)], TWO_BUCKETS, seed=4,
                    thresholds=Thresholds(holdout_rounds=0)).overall.holdout is None


def test_defaults_failing_in_every_held_out_round_are_said_in_a_note() -> None:
    """The defaults fail in all 6 held-out rounds: no held-out gain, and a note says the gain shown is the one from
    the rounds that chose the winner. Before, nothing said so."""
    evaluate, _ = _knob_evaluator(4, {"P": 0.15})
    unbounded = finalize(evaluate, {}, [Candidate(FASTER)], TWO_BUCKETS, seed=4)
    holdout_from = unbounded.evaluations - 2 * Thresholds().holdout_rounds
    evaluate, calls = _knob_evaluator(4, {"P": 0.15})

    def defaults_fail_late(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        if len(calls) >= holdout_from and not env:
            calls.append((dict(env), Evaluation.failed(FailureKind.FAILED, "node down")))
            return calls[-1][1]
        return evaluate(env, validate=validate)

    report = finalize(defaults_fail_late, {}, [Candidate(FASTER)], TWO_BUCKETS, seed=4)
    assert report.overall.env == FASTER and report.overall.holdout is None
    assert "the defaults failed in all 6 held-out rounds (failed: node down): the gain is the one from the rounds " \
           "that chose the winner" in report.notes


def test_a_deployed_set_slower_in_the_held_out_rounds_is_withdrawn() -> None:
    """The winner is 15 % faster in the rounds that choose it, then (drift, a state it leaves behind) 13 % slower
    than the defaults in every held-out round: withdrawn, keep the defaults, a note says why. Before, the
    held-out rounds only reported the gain: the set was published with "held out: -13 %". Slower in one bucket
    only, the overall decision stands (6 rounds cannot judge buckets without false withdrawals: docstring)."""
    evaluate, _ = _knob_evaluator(4, {"P": 0.15})
    unbounded = finalize(evaluate, {}, [Candidate(FASTER)], TWO_BUCKETS, seed=4)
    assert unbounded.overall.env == FASTER and unbounded.overall.holdout is not None
    holdout_from = unbounded.evaluations - 2 * Thresholds().holdout_rounds
    large = TWO_BUCKETS[-1]

    for slower_sizes, withdrawn in ((lambda size: True, True),
                                    (lambda size: large.min_bytes <= size <= large.max_bytes, False),
                                    (lambda size: False, False)):
        evaluate, calls = _knob_evaluator(4, {"P": 0.15})

        def drifts_later(env: Mapping[str, str], *, validate: bool = False,
                         slower_sizes=slower_sizes) -> Evaluation:  # type: ignore[no-untyped-def]
            late = len(calls) >= holdout_from
            evaluation = evaluate(env, validate=validate)
            if late and env == FASTER:  # the candidate's times of that bucket: x1.15 / 0.87 of the defaults' pace
                return Evaluation({size: [t * (1.15 / 0.87 if slower_sizes(size) else 1.0) for t in times]
                                   for size, times in evaluation.times_us.items()})
            return evaluation

        report = finalize(drifts_later, {}, [Candidate(FASTER)], TWO_BUCKETS, seed=4)
        if withdrawn:
            assert report.overall.verdict == "keep-defaults" and report.overall.env == {}
            assert any(n.startswith("overall: the deployed set was slower than the defaults in the held-out rounds "
                                    "(overall: -") and n.endswith("withdrawn, keep defaults")
                       for n in report.notes), report.notes
        else:
            assert report.overall.env == FASTER and report.overall.holdout is not None


def test_a_held_out_round_the_defaults_failed_in_does_not_switch_the_slower_check_off() -> None:
    """The defaults failed in one held-out round (a launch that could not bind, seen in a user's tune): the check
    asked for 6 compared rounds, got 5, and published a set 2x slower there, without a note. The rounds the defaults
    ran in judge it, and a note says one failed."""
    evaluate, _ = _knob_evaluator(4, {"P": 0.15})
    unbounded = finalize(evaluate, {}, [Candidate(FASTER)], TWO_BUCKETS, seed=4)
    holdout_from = unbounded.evaluations - 2 * Thresholds().holdout_rounds
    evaluate, calls = _knob_evaluator(4, {"P": 0.15})
    failed = []

    def slower_later_and_a_default_fails(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        if len(calls) >= holdout_from and not env and not failed:
            failed.append(len(calls))
            calls.append((dict(env), Evaluation.failed(FailureKind.FAILED, "bind failed")))
            return calls[-1][1]
        evaluation = evaluate(env, validate=validate)
        if len(calls) > holdout_from and env == FASTER:
            return Evaluation({size: [t * 2 for t in times] for size, times in evaluation.times_us.items()})
        return evaluation

    report = finalize(slower_later_and_a_default_fails, {}, [Candidate(FASTER)], TWO_BUCKETS, seed=4)
    assert failed and report.overall.verdict == "keep-defaults" and report.overall.env == {}, report.notes
    assert "the defaults failed in 1 of 6 held-out rounds (failed: bind failed): the gains and the slower-check come " \
           "from the other 5" in report.notes
    assert any(n.startswith("overall: the deployed set was slower than the defaults in the held-out rounds (overall: "
                            "-") and "over 5 rounds" in n for n in report.notes), report.notes


def test_the_signed_rank_p_is_exact_with_tied_values() -> None:
    """Equal per-round ratios (a coarse timer, a run repeated from a cache) tie their ranks: the p value is the
    share of the 2**n sign patterns of the midranks at least as extreme, counted here by brute force. Before, ties
    took the normal approximation: 8 equal gains gave 0.0023 for an exact 1/256, under the 2**-n that min_rounds
    counts on."""
    rng = np.random.default_rng(7)
    samples = [np.full(8, 0.05), np.full(7, -0.02), np.array([0.1, 0.1, -0.1, 0.2, 0.2, 0.2, 0.3, -0.3, 0.05])]
    samples += [rng.choice([-0.2, -0.1, 0.1, 0.2, 0.3], size=int(rng.integers(3, 13))) for _ in range(30)]
    for x in samples:
        ranks = rankdata(np.abs(x))
        w = ranks[x > 0].sum()
        sums = [sum(r for r, positive in zip(ranks, signs) if positive)
                for signs in itertools.product((False, True), repeat=len(x))]
        expected = (np.mean([s >= w - 1e-9 for s in sums]), np.mean([s <= w + 1e-9 for s in sums]))
        assert signed_rank_p(x) == pytest.approx(expected, abs=1e-12), x
    assert signed_rank_p(np.full(8, 0.05))[0] == pytest.approx(2.0**-8)


def test_the_benchmarks_noise_is_the_committed_measurement() -> None:
    """bench_finalize's noise scales come from the packed 4x H200 A/A launches: the same numbers its
    committed result recorded (the merge that packed the run folders had left it reading a folder that
    was gone)."""
    recorded = json.loads((REPO / "results" / "bench" / "finalize_error_rates.json").read_text())["measured_noise"]
    measured = measured_noise().as_json()
    assert measured["launches"] == 85 and measured["source"].endswith("aa/runs.jsonl")
    assert {k: v for k, v in measured.items() if k != "source"} == {k: v for k, v in recorded.items() if k != "source"}



def test_bench_finalize_candidates_finalizes_that_many_distinct_candidates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--candidates K: finalize gets K distinct candidates, LL128 (the one that may be faster) first, and the
    document records them; the default stays the committed results' two."""
    import tuners.bench_finalize as bench

    seen: list[list[dict[str, str]]] = []
    real = bench.finalize

    def spy(evaluate, baseline, candidates, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append([dict(c.env) for c in candidates])
        return real(evaluate, baseline, candidates, *args, **kwargs)

    monkeypatch.setattr(bench, "finalize", spy)
    out = tmp_path / "k3.json"
    assert bench.main(["--candidates", "3", "--finalizations", "2", "--gains", "0", "--noise", "gaussian",
                       "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["candidates"] == 3 and document["family_size"] == 3 * 6
    assert len(seen) == 2 and all(envs == document["candidate_envs"] for envs in seen)
    assert seen[0][0] == {"NCCL_PROTO": "LL128"} and len({json.dumps(env, sort_keys=True) for env in seen[0]}) == 3
    assert bench.candidate_envs() == [dict(env) for env in bench.CANDIDATES]


def test_bench_finalize_all_at_margin_puts_every_candidate_at_the_minimum_effect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The boundary scenario sets LL128 at the margin and the others at 0 (half the family's H0s at equality);
    all-at-margin sets every candidate there, with --candidates K too: every test's H0 at equality, every
    acceptance a false change. Both are in the default run, side by side."""
    import tuners.bench_finalize as bench

    buckets = buckets_for_sizes(bench.SIZES, 1)
    for k in (2, 8):
        evaluate = bench.DriftingEvaluator(bench.SIZES, bench._true_gains(bench.ALL_AT_MARGIN, 0.03, 5, "x")[0],
                                           0.0, 0, walk=0.0)
        base = evaluate(bench.BASELINE).median_us()
        for env in bench.candidate_envs(k):
            assert all(base[s] / t == pytest.approx(1.03) for s, t in evaluate(env).median_us().items())
    _, true_gain = bench._true_gains(bench.ALL_AT_MARGIN, 0.03, 5, "x")
    _, boundary_gain = bench._true_gains(bench.BOUNDARY, 0.03, 5, "x")
    comparisons = [Comparison(Candidate(env), name, True, "") for env in bench.candidate_envs(8)
                   for name in (OVERALL, *(b.name for b in buckets))]
    assert all(true_gain(c) == 0.03 for c in comparisons)
    assert sum(boundary_gain(c) == 0.03 for c in comparisons) == 6
    result = bench.run_scenario(bench.ALL_AT_MARGIN, 2, Thresholds(), "gaussian", bench.measured_noise())
    assert result["scenario"] == bench.ALL_AT_MARGIN and result["gain_in_2MiB_bucket"] == 0.03
    planned: list[object] = []
    monkeypatch.setattr(bench, "run_scenario", lambda gain, *args: planned.append(gain) or {})
    assert bench.main(["--finalizations", "1", "--noise", "gaussian", "--out", str(tmp_path / "d.json")]) == 0
    assert planned[:2] == [bench.BOUNDARY, bench.ALL_AT_MARGIN]

def test_planned_runs_bound_what_finalization_runs_with_ablation_and_held_out_rounds() -> None:
    """Budgets (finalize_study, the tuning demo) size finalization with planned_runs: it must cover the
    ablation and held-out rounds, which the rounds x (candidates + 1) it replaced left out."""
    evaluate, calls = _knob_evaluator(0, {"P": 0.1, "B": 0.1, "PB": 0.21})
    thresholds = Thresholds(look_every=40)  # every round of the maximum: the most runs there can be
    report = finalize(evaluate, {}, [Candidate(THREE_KNOBS)], TWO_BUCKETS, seed=0, thresholds=thresholds)
    assert report.overall.ablation and report.overall.holdout is not None
    main_rounds = planned_rounds(thresholds, 1, len(TWO_BUCKETS)) * 2
    assert main_rounds < len(calls) <= planned_runs(thresholds, 1, len(TWO_BUCKETS), n_knobs=3)
    # With validated runs too: the candidate's (it changes NCCL_PROTO, "unsafe" here) and, when ablation drops
    # the two inert knobs, the reduced set's (NCCL_PROTO alone), beside every round of every phase.
    one = (SizeBucket("all", 0, 1 << 30),)
    evaluate, calls = _knob_evaluator(0, {"P": 0.1, "PB": 0.1})  # NCCL_BUFFSIZE inert too
    report = finalize(evaluate, {}, [Candidate(THREE_KNOBS)], one, seed=0, thresholds=thresholds,
                      needs_validation=lambda baseline, env: ("NCCL_PROTO",) if "NCCL_PROTO" in env else ())
    assert report.overall.env == FASTER and report.overall.holdout is not None
    assert sum(e == FASTER for e, _ in calls) == 8 + 1 + 6  # confirmation rounds, its validated run, held out
    assert len(calls) == planned_runs(thresholds, 1, len(one), n_knobs=3)


def _per_size(small: float, large: float) -> dict[int, float]:
    """A speed-up of `small` at 64 B and 1 KiB (TWO_BUCKETS' small), `large` at 1 MiB and 64 MiB."""
    return {64: small, 1024: small, 1 << 20: large, 1 << 26: large}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("scenario", "candidates", "buckets", "n_knobs", "look_every"), [
    # NCCL_PROTO acts at the small sizes only, NCCL_BUFFSIZE at the large ones, the socket threads nowhere: the
    # small bucket deploys NCCL_PROTO alone, the large one NCCL_BUFFSIZE alone (each reduced set confirmed beside
    # the winner), the overall decision both (without either, a bucket is slower).
    ("one winner, three deployed sets", [THREE_KNOBS], TWO_BUCKETS, 3, 40),
    ("one winner, four buckets", [{"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}], buckets_for_sizes(SIZES, 1),
     2, 40),
    ("two candidates, sequential", [THREE_KNOBS, {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "8388608"}],
     buckets_for_sizes(SIZES, 1), 3, 5),
])
def test_planned_runs_bounds_finalizations_whose_decisions_deploy_different_sets(
        scenario: str, candidates: list[dict[str, str]], buckets: Sequence[SizeBucket], n_knobs: int, look_every: int,
        seed: int) -> None:
    """planned_runs is the plan `commcamp tune` prints ("at most N runs") and what fit_budget fits into a budget:
    no finalization may take more. Here the overall and per-bucket decisions of one winner keep other knobs, so
    the held-out rounds measure more deployed sets than there are candidates, and the confirmation rounds and
    validated runs more reduced sets than one per winner. Before, the bound counted n_candidates + 1 held-out
    settings and 2 x n_candidates confirmed ones: the first scenario took 163 runs against 144, the second
    130 against 122."""
    speedups = {"P": _per_size(0.1, 0.0), "B": _per_size(0.0, 0.1), "PB": _per_size(0.1, 0.1)}
    evaluate, calls = _knob_evaluator(seed, speedups)
    thresholds = Thresholds(look_every=look_every)
    report = finalize(evaluate, {}, [Candidate(c) for c in candidates], buckets, seed=seed, thresholds=thresholds,
                      needs_validation=lambda baseline, env: ("NCCL_PROTO",) if "NCCL_PROTO" in env else ())
    deployed = {tuple(sorted(d.env)) for d in report.decisions if d.change}
    assert len(deployed) >= 2, (scenario, report.notes)  # the decisions deploy different sets
    assert report.evaluations == len(calls) <= planned_runs(thresholds, len(candidates), len(buckets), n_knobs), (
        scenario, deployed)


def test_the_report_counts_every_run_and_the_allocations_they_ran_in() -> None:
    """`evaluations` is every evaluator call (validation, rounds, ablation, held-out) and `allocations` the
    distinct batch allocations the runs reported (a run without one, e.g. outside Slurm, adds none)."""
    evaluate, calls = _knob_evaluator(0, {"P": 0.1, "B": 0.1, "PB": 0.21})

    def in_jobs(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        evaluation = evaluate(env, validate=validate)
        job = len(calls) % 3  # two allocations, and every third run reports none
        return evaluation if job == 0 else replace(evaluation, allocation=f"{100 + job}")

    report = finalize(in_jobs, {}, [Candidate(THREE_KNOBS)], TWO_BUCKETS, seed=0)
    assert report.overall.ablation and report.overall.holdout is not None  # every phase ran
    assert report.evaluations == len(calls)
    assert report.allocations == ("101", "102")


class RunClock:
    """A clock that advances one unit per run of the evaluator it wraps: finalization's deadline in runs."""

    def __init__(self, evaluator) -> None:
        self.evaluator = evaluator
        self.runs = 0

    def monotonic(self) -> float:
        return float(self.runs)

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        self.runs += 1
        return self.evaluator(env, validate=validate)


@pytest.mark.parametrize("deadline_runs", [0, 21, 66])
def test_no_round_starts_after_the_deadline(monkeypatch: pytest.MonkeyPatch, deadline_runs: int) -> None:
    """pretune's budget is a deadline. Without one this seed accepts LL128 (1.3x) at the look after round 20
    (60 runs) and runs 6 held-out rounds (72 runs). With the deadline after 0 or 21 runs, the looks it cuts off
    end their tests undecided: keep defaults, and no run after it; after 66 runs the look at round 20 stands
    and the held-out rounds stop after 3. Before, finalization ran its plan to the end whatever the time (a
    pretune of 80 s wrote its env file after 103 s under load)."""
    import tuners.finalize as finalize_module

    speedups = {"LL128": 1.3, "LL": 1.0}
    unbounded, _ = run(speedups, seed=0)
    assert (unbounded.rounds_run, unbounded.evaluations, unbounded.overall.change) == (20, 72, True)
    clock = RunClock(DriftingEvaluator(SIZES, speedups, 0.03, 0))
    monkeypatch.setattr(finalize_module, "time", clock)  # the deadline in runs, not seconds
    report = finalize(clock, BASELINE, [Candidate(FASTER), Candidate(OTHER)], TWO_BUCKETS, seed=0,
                      deadline=deadline_runs)
    assert report.evaluations == deadline_runs
    if deadline_runs < 60:
        assert not report.overall.change and report.rounds_run == deadline_runs // 3
        assert all(c.reason.startswith("undecided: the time budget ran out") for c in report.overall.comparisons)
        assert report.notes[0].startswith(f"the time budget ran out after {deadline_runs // 3} of at most 40 rounds")
        assert report.cut_off  # no look made: an untested decision, not published (TuningSession.finalize)
    else:
        assert report.overall.env == FASTER and report.overall.winner == unbounded.overall.winner
        assert report.overall.holdout is not None and report.overall.holdout.rounds == 3
        assert "the time budget ran out after 3 of 6 held-out rounds" in report.notes and not report.cut_off


def test_finalize_study_shuffles_its_rounds_with_the_studys_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """commcamp tune's finalization (finalize_study) draws its rounds' order from the study's seed (drawn once per
    study unless --seed; SCREEN_SEED), not from finalize's fixed default 0: with 0, every tune everywhere ran the
    same order sequence, while bench_finalize (a seed per finalization) and bench_tuner_aa (a seed per tune)
    measured finalizations whose orders differ."""
    from types import SimpleNamespace

    import campaigns.tuning.session as session
    from campaigns.tuning.spec import FinalizeSpec
    from tuners.study import SCREEN_SEED

    monkeypatch.setattr(session, "finalization_candidates",
                        lambda *args, **kwargs: [(1, dict(FASTER)), (2, dict(OTHER))])
    monkeypatch.setattr(session, "build_recommendation", lambda *args, **kwargs: None)

    def order(study_seed: int | None, spec_seed: int | None = None) -> list[str]:
        evaluator = DriftingEvaluator(FIVE_SIZES, {}, 0.02, seed=0)
        setup = SimpleNamespace(spec=SimpleNamespace(finalize=FinalizeSpec(), seed=spec_seed), evaluator=evaluator,
                                buckets=FIVE_BUCKETS, scope=None, versions={}, cleared=(),
                                space=SimpleNamespace(knob_names=["NCCL_PROTO"], changeable=["NCCL_PROTO"],
                                                      unsafe_changes=lambda b, e: (), effective_env=dict,
                                                      requires=lambda knob: {}))
        study = SimpleNamespace(user_attrs={} if study_seed is None else {SCREEN_SEED: study_seed})
        session.finalize_study(setup, study, BASELINE)
        return evaluator.order

    def finalize_order(seed: int) -> list[str]:
        evaluator = DriftingEvaluator(FIVE_SIZES, {}, 0.02, seed=0)
        finalize(evaluator, BASELINE, [Candidate(FASTER, 1), Candidate(OTHER, 2)], FIVE_BUCKETS,
                 thresholds=FinalizeSpec().thresholds(), seed=seed)
        return evaluator.order

    assert order(7) == finalize_order(7) and order(8) == finalize_order(8)
    assert order(7) != order(8)
    assert order(None, spec_seed=9) == finalize_order(9)  # a study older than SCREEN_SEED: the spec's --seed
    assert order(None) != order(None)  # neither: a fresh draw per finalization


def test_finalize_studys_plan_counts_the_companions_a_knob_requires(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Open MPI algorithm knob requires coll_tuned_use_dynamic_rules=1: a tune of the algorithm alone searches
    one knob, but its candidates change two. The plan (the "at most N runs" commcamp tune prints, and what
    fit_budget fits into a budget) counts both; before, it counted the searched knob only and said 93 runs for a
    finalization that took 106 (ablation measured the winner without each; the companion is no decision of its
    own now, so one decision: no ablation)."""
    from types import SimpleNamespace

    import campaigns.tuning.session as session
    from campaigns.tuning.spec import FinalizeSpec

    space = build_space(load_site("local").knob_catalog(), {"openmpi": "4.1.4"},
                        knobs=["OMPI_MCA_coll_tuned_allreduce_algorithm"], op="allreduce", transport="mpi")
    ring = space.env_from_values({"OMPI_MCA_coll_tuned_allreduce_algorithm": "ring"})
    assert space.knob_names == ("OMPI_MCA_coll_tuned_allreduce_algorithm",) and len(ring) == 2
    monkeypatch.setattr(session, "finalization_candidates", lambda *args, **kwargs: [(1, dict(ring))])
    monkeypatch.setattr(session, "build_recommendation", lambda *args, **kwargs: None)
    sizes = (8, 65536)
    rng = np.random.default_rng(2)

    class Evaluator:
        run_done = None

        def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
            t = 10.0 / 1.06 if env == ring else 10.0  # the algorithm acts only with dynamic rules on
            return Evaluation(times_us={s: list(t * rng.lognormal(0, 0.03, 1)) for s in sizes}, validated=validate)

    setup = SimpleNamespace(spec=SimpleNamespace(finalize=FinalizeSpec(), seed=2), evaluator=Evaluator(),
                            buckets=buckets_for_sizes(sizes, 1), scope=None, versions={}, cleared=(), space=space)
    logs: list[str] = []
    report, _ = session.finalize_study(setup, SimpleNamespace(user_attrs={}), {}, log=logs.append)
    assert report.overall.env == ring and report.overall.ablation == ()
    planned = int(logs[0].split("at most ")[1].split()[0])
    assert report.evaluations <= planned, (report.evaluations, logs[0])


def test_bench_tuner_aa_reports_the_closest_test_of_every_decision() -> None:
    """The A/A benchmark counts a false change in any decision (overall or a size bucket), so the closest
    comparison it records per tune (the margin to a false change, quoted in the README) must be the smallest
    Holm-adjusted p over all of them, not the overall decision's alone."""
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "tests" / "bench"))
    import bench_tuner_aa

    def setup() -> SimpleNamespace:  # identical environments, noise of the shared VM's scale (30 %)
        return SimpleNamespace(
            evaluator=DriftingEvaluator(FIVE_SIZES, {}, 0.3, seed=3), buckets=FIVE_BUCKETS, catalog={},
            spec=SimpleNamespace(finalize=SimpleNamespace(thresholds=Thresholds)),
            space=SimpleNamespace(knob_names=(), env_from_values=lambda values: dict(BASELINE),
                                  unsafe_changes=lambda baseline, env: ()))

    closer_in_a_bucket = 0
    for tune in range(2):
        outcome = bench_tuner_aa.run_tune(setup(), tune, 2)
        report = finalize(setup().evaluator, BASELINE, [Candidate(dict(BASELINE), i + 1) for i in range(2)],
                          FIVE_BUCKETS, seed=tune)  # the same finalization again (same seeds)
        tested = [c for d in report.decisions for c in d.comparisons if c.tested]
        smallest = min(c.p_adjusted for c in tested if c.p_adjusted is not None)
        assert outcome["closest"]["p_adjusted"] == smallest
        closer_in_a_bucket += smallest < min(c.p_adjusted for c in report.overall.comparisons if c.tested)
    assert closer_in_a_bucket  # the case the overall decision's closest comparison missed


def test_a_deployed_set_no_round_compared_is_refused() -> None:
    """check_deployed: the deployed set (environment + per-size rules) +25 % is kept; when the defaults fail in
    every round, nothing compared the two and untested rules are not deployed (before: kept, no reason given)."""
    from tuners.finalize import check_deployed

    evaluate, _ = _knob_evaluator(3, {"P": 0.25})
    deployed = {"NCCL_PROTO": "LL128"}
    kept = check_deployed(evaluate, {}, deployed, TWO_BUCKETS, Thresholds(), seed=1)
    assert kept.refused is None and kept.rounds == Thresholds().holdout_rounds and kept.overall.gain > 0.1

    def defaults_fail(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        return Evaluation.failed(FailureKind.FAILED, "exit 1") if env == {} else evaluate(env, validate=validate)

    refused = check_deployed(defaults_fail, {}, deployed, TWO_BUCKETS, Thresholds(), seed=1)
    assert refused.rounds == 0 and refused.overall is None
    assert refused.refused == f"not compared: the defaults failed in all {Thresholds().holdout_rounds} rounds"


@pytest.mark.parametrize("environment_fails", [False, True])
def test_a_deployed_set_that_fails_its_validated_run_blames_the_environment_only_if_it_fails_alone(
        environment_fails: bool) -> None:
    """check_deployed: the set (environment + rules) gives wrong data in its validated run; the environment alone
    then runs validated too: the environment is named only when it fails as well."""
    from tuners.finalize import check_deployed

    evaluate, _ = _knob_evaluator(3, {"B": 0.25})
    environment = {"NCCL_BUFFSIZE": "8388608"}

    def wrong_data(env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        if validate and ("RULES" in env or environment_fails):
            return Evaluation.failed(FailureKind.INVALID, "data validation failed")
        return evaluate(env, validate=validate)

    check = check_deployed(wrong_data, {}, {**environment, "RULES": "file"}, TWO_BUCKETS, Thresholds(), seed=1,
                           environment=environment)
    assert check.rounds == 0 and "data validation failed" in check.refused
    assert (check.environment_refused is not None) == environment_fails
