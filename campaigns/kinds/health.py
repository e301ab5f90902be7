"""Nightly health checks: run a `kind: health` campaign under tonight's run tag, judge every metric, name
the node or link behind a degraded multi-node test, and write a verdict.

Metrics of a run: its check's performance variables, defined once in campaigns/model/vocabulary.py
(small_latency: latency_us at the smallest size that moves data, lower is better; large_goodput and
large_busbw: GB/s at the largest size, higher is better); a reference check's run (nccl_tests_run,
osu_run) those its benchmark reports (large_bandwidth, large_latency too), against the references of
that benchmark. Each is judged

- against its reference (the campaign's `references`, then the site's; ReFrame's thresholds): outside
  the bounds is `failed`;
- against what the site's links can give (site.yaml `links`, multi-node runs): a latency above
  implausible_latency_factor x links.nic_latency, or a bandwidth above implausible_bandwidth_factor x
  the node's NICs, is `failed`, with or without history;
- against its own history: the same series (run key without the tag) on the last `history_nights`
  nights; with median m and robust spread s = max(1.4826 MAD, min_spread |m|, and for 2-4 nights the
  range / d2(n): robust_spread), a value worse than m by z = |x - m| / s >= degraded_z (failed_z) AND by
  a relative change >= degraded_change (failed_change) is `degraded` (`failed`); the evidence says what
  was compared. Fewer than `min_history` nights: not judged on history. A bad night does not become
  the baseline: the earlier nights are judged oldest first, each against the kept nights before it, by
  the same rules (a night with fewer than min_history of those, against the other nights of the window),
  and those called degraded or failed are left out (the evidence lists them; kept_nights). Kept in,
  one contended night among three made the range floor so wide that a 98 % bandwidth drop read ok.
- A metric with neither a reference nor enough history is `not_judged` (its own status, counted in the
  summary, exit code 3 when nothing is worse): an unjudged value is not a healthy one.

A run that failed (commbench error, data validation, Slurm job failure) is `failed` with its reason.

Isolation (health.isolate): the hosts of degraded/failed multi-node runs are suspects. Pingpong between
two nodes (Slurm --nodelist) is run first over a ring of all nodes involved, then between each remaining
suspect and a node a good pair cleared. A pair is bad when its metrics are degraded/failed as above
(reference and the history of earlier pair tests) or when it is `peer_factor` times worse than the best
pair measured (which judges the pairs within peer_factor of the best, when it sets one apart). A good pair clears
its nodes only when it judged a metric of the kind that was bad in the run. A suspect
that is bad with a cleared partner is a culprit node; a bad pair of two cleared nodes is a culprit link. First,
though, the degraded run's own per-rank times may name the suspect(s) (campaigns/kinds/attribution.py): a pair
test of each with a node that did not slow down confirms or clears it, and the other nodes of the runs a culprit
explains (every bad run they were in holds it) are not blamed: `explained`, node status ok with that evidence.

Fail-slow (find_slow_nodes): a node can stay inside its reference, degrade no multi-node metric, and still
be slowing down. commbench's schema 2 records every rank's median time; a node's time in a record is the
median over its ranks (attribution.node_times). Per (node, record: the series, op, transport, size,
direction and the hosts in rank order, so the node keeps its role) with >= min_history earlier nights, the
node is `degraded: slow` (node verdict reason "slow", a row of its own in the table) when BOTH
(a) its time is worse than its own history: judge() against the median and robust spread of its earlier
    nights, >= degraded_z spreads and >= degraded_change worse; and
(b) its time over the median of its peers' times in the same record tonight (>= MIN_PEERS other nodes) is
    above 1 (it is slower than its peers), >= degraded_change above that ratio's geometric mean on its
    earlier nights, and above them by a one-sided prediction t-test on logarithms (ratio_test): t = (log r -
    mean) / (s sqrt(1 + 1/n)) on n - 1 degrees of freedom (n earlier nights, mean and s of their log ratios,
    s at least log(1 + min_spread)), p <= slow_alpha / m.
(b) is what a whole-night shift (load, a switch, a library update) cannot pass: it moves every node alike,
so every ratio stays; (a) keeps a node whose peers got faster (its ratio rises, its time does not) from
being called slow; the ratio's own history absorbs a role that is always slower. "Above 1":
a slow node's peers change roles too (alltoall at 64 KiB, one node's link throttled: the node that waited
100 us against its peers' 20-26 ms on clean nights waited 1.9 ms, a ratio 20x its history but still 11x
faster than its peers); a node faster than its peers is not called slow, even one that slowed. A node the
other rules already call degraded or failed keeps that verdict. The evidence: its time, its history's
median and spread, its peers' times, the ratio and that ratio's history with t and p.
False alarms: m = the (node, record) pairs judged that night (Bonferroni; slow_alpha 0.05). With log ratios
that vary from night to night as independent normal values, t follows Student's t on n - 1 degrees of freedom
exactly (the spread floor only lowers it), so a healthy pair passes (b) alone with probability <= slow_alpha /
m and a healthy night raises a false alarm with probability <= slow_alpha. Simulated
(tests/bench/bench_fail_slow.py, results/reliability/fail_slow_error_rates.json): at most 2.0 % of healthy
nights name somebody with normal noise; the rule before (z from the normal quantile against the robust spread
of the earlier nights, which is itself uncertain over a few nights: fail_slow_error_rates_before.json) 15 % at
3 % noise and 98 % at 10 % (100 nodes x 4 records, 14 nights). Timing noise has heavier tails than a normal
one; the AND of (a) and (b) and the >= 10 % (degraded_change) on both do not hold the bound then: with log-t3
noise (sd 3 %) 68 % of such nights named somebody. Power grows with the history: the log ratio must exceed its
mean by the t quantile x sqrt(1 + 1/n) of its standard deviations: for 3 nodes x 2 sizes 46.8 with 2 nights,
8.8 with 3, 2.8 with 14; for 2,000 nodes x 4 records 7.1 with 14 nights (and >= 10 %). So two nights name
almost nothing (a throttled node's ratio 4.4 against 1.06 and 0.80 on the recorded nights: p 0.05), and a 10 %
drift needs a long history of quiet ratios. Two-node runs cannot say which end slowed: they are not judged.

Exit status of `commcamp run` for a health campaign (EXIT_CODES): 0 healthy, 3 not judged (nothing bad,
some metric had nothing to compare with), 4 degraded, 5 failed; distinct from commcamp's 1 (a case
could not be stored) and 2 (bad usage, database unusable). The verdict JSON (written atomically) holds
every metric with its evidence, the per-node verdicts and the isolation's pair tests.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from scipy.stats import t as student_t

from campaigns import paths
from campaigns.slurm.placement import Placer
from campaigns.reframe.runner import CampaignResult, new_run_dir, run_cases
from campaigns.model.site import Reference
from campaigns.model.spec import (PAIR_RANKS, SLURM_SCHEDULERS, Campaign, CommbenchCheckSpec, HealthSettings, TestCase,
                                  in_series, site_setup, without_setup)
from campaigns.kinds.attribution import LEAD, Suspects, node_times, rank_suspects
from campaigns.slurm.snapshot import SlurmSnapshot, fabric_wide, slurm_partition, take_snapshot
from campaigns.store import RunRow, Store
from campaigns.model.references import find_reference, measured, run_metrics
from campaigns.model.vocabulary import METRICS, reported_metrics
from campaigns.exit_codes import ExitCode
from tuners.writers import write_atomic

STATUSES = ("ok", "not_judged", "degraded", "failed")  # in order of severity
BAD = ("degraded", "failed")
# Distinct from commcamp's 1 (a case could not be stored) and 2 (bad usage, database unusable): cli.py.
# The size up to which a message's time is its latency (the plausibility bound of small_latency without a
# nominal NIC bandwidth to add the transfer time).
SMALL_MESSAGE_BYTES = 4096
EXIT_CODES = {"ok": ExitCode.OK, "not_judged": ExitCode.NOT_JUDGED, "degraded": ExitCode.DEGRADED,
              "failed": ExitCode.UNHEALTHY}
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x 1.4826 = its standard deviation


def worst(statuses: Iterable[str]) -> str:
    """The most severe status; of nothing, `not_judged`: nothing judged is never ok."""
    return max(statuses, key=STATUSES.index, default="not_judged")


@dataclass
class Judgement:
    status: str
    evidence: list[str]
    reference: dict[str, Any] | None = None
    history: dict[str, Any] | None = None


@dataclass(frozen=True)
class Ceiling:
    """The largest value of a metric the site's hardware can plausibly give, and where it comes from."""

    value: float
    what: str


# Tippett's d2(n): the expected range of n normal values in standard deviations (range / d2 estimates sigma).
RANGE_D2 = {2: 1.128, 3: 1.693, 4: 2.059}


def robust_spread(history: list[float], median: float, min_spread: float) -> tuple[float, str]:
    """The spread a new value is compared with, and how it was found: 1.4826 x MAD, at least min_spread x the
    median, and for a tiny history (<= 4 nights) at least range / d2(n). The MAD of 3 values is the smaller
    of the two deviations from the median, so one noisy night of three is not seen at all (an idle cluster
    was called degraded at 39% below such a median); the range sees every night."""
    mad_sigma = MAD_TO_SIGMA * statistics.median(abs(v - median) for v in history)
    floor = min_spread * abs(median)
    parts = [(mad_sigma, f"1.4826 MAD {mad_sigma:.3g}"), (floor, f"{min_spread:.0%} of the median {floor:.3g}")]
    if len(history) in RANGE_D2:
        by_range = (max(history) - min(history)) / RANGE_D2[len(history)]
        parts.append((by_range, f"range/{RANGE_D2[len(history)]} {by_range:.3g} (tiny history)"))
    spread, how = max(parts)
    return spread, f"largest of {', '.join(text for _, text in parts)}: {how.split(' ')[0]}"


def judge(value: float, higher_is_better: bool, reference: Reference | None, history: list[float],
          settings: HealthSettings, ceiling: Ceiling | None = None) -> Judgement:
    """One metric value against its reference, the site's plausible range and its history (oldest night
    first), leaving out the earlier nights the same rules call degraded or failed against the nights kept
    before them (see the module docstring). Neither a reference nor enough history: `not_judged`."""
    flags = kept_nights(history, higher_is_better, reference, settings, ceiling)
    kept = [night for night, keep in zip(history, flags) if keep]
    left_out = [night for night, keep in zip(history, flags) if not keep]
    judgement = _judge_once(value, higher_is_better, reference, kept, settings, ceiling)
    if left_out:
        judgement.evidence.append(f"left out of the history: {len(left_out)} of {len(history)} earlier nights "
                                   f"({', '.join(f'{v:.4g}' for v in left_out)}), degraded or failed against "
                                   f"their reference or the nights kept before them (the first nights: the others)")
        if judgement.history is not None:
            judgement.history["left_out"] = left_out
    return judgement


def kept_nights(history: list[float], higher_is_better: bool, reference: Reference | None,
                settings: HealthSettings, ceiling: Ceiling | None = None) -> list[bool]:
    """Which earlier nights (oldest first) a baseline keeps: each judged by the same rules against the nights kept
    before it (left out when degraded or failed); a night with too few of those (the first min_history) against
    all the other nights of the window (with 2 of them already), left out only when failed there (>= failed_z
    spreads and >= failed_change), so that a contended night among the first ones is left out too (kept, it
    made a 98 % drop read ok) while a noisy healthy one (10 % off) stays."""
    screening = settings.model_copy(update={"min_history": 2})

    def apart(night: float, against: list[float], early: bool) -> bool:
        if early:
            return _judge_once(night, higher_is_better, reference, against, screening, ceiling).status == "failed"
        return _judge_once(night, higher_is_better, reference, against, settings, ceiling).status in BAD
    return _screened(history, settings, apart)


def _screened(history: list[float], settings: HealthSettings,
              apart: Callable[[float, list[float], bool], bool]) -> list[bool]:
    """Which earlier nights (oldest first) a baseline keeps: a night is left out when `apart` says so against the
    nights kept before it, or (`early`: fewer than min_history of those) against all the other nights of the
    window. The one screening loop of kept_nights and kept_ratios."""
    kept: list[float] = []
    flags = []
    for i, night in enumerate(history):
        early = len(kept) < max(settings.min_history, 2)
        keep = not apart(night, history[:i] + history[i + 1:] if early else kept, early)
        flags.append(keep)
        if keep:
            kept.append(night)
    return flags


def _judge_once(value: float, higher_is_better: bool, reference: Reference | None, history: list[float],
                settings: HealthSettings, ceiling: Ceiling | None) -> Judgement:
    """judge() against a history taken as it is. A reference judges only with a bound on the side that is worse (a
    bandwidth's lower, a latency's upper): one bound only on the better side passes every degraded value."""
    worse_bound = None if reference is None else reference.lower if higher_is_better else reference.upper
    status, evidence, judged = "ok", [], worse_bound is not None
    ref_info = None
    if reference is not None:
        low = reference.value * (1 + reference.lower) if reference.lower is not None else None
        high = reference.value * (1 + reference.upper) if reference.upper is not None else None
        ref_info = {"value": reference.value, "lower": reference.lower, "upper": reference.upper,
                    "low_bound": low, "high_bound": high, "note": reference.note}
        if low is not None and value < low:
            status = "failed"
            evidence.append(f"{value:.4g} below the reference bound {low:.4g} (reference {reference.value:.4g})")
        elif high is not None and value > high:
            status = "failed"
            evidence.append(f"{value:.4g} above the reference bound {high:.4g} (reference {reference.value:.4g})")
    if ceiling is not None and value > ceiling.value:
        status = "failed"
        evidence.append(f"{value:.4g} is not plausible on this site: above {ceiling.value:.4g}, {ceiling.what}")
    hist_info = None
    nights = len(history)
    if nights >= max(settings.min_history, 2):  # a spread needs two values
        judged = True
        median = statistics.median(history)
        spread, spread_how = robust_spread(history, median, settings.min_spread)
        worse_by = (median - value) if higher_is_better else (value - median)
        z = worse_by / spread if spread > 0 else (float("inf") if worse_by > 0 else 0.0)
        change = worse_by / abs(median) if median else 0.0
        hist_info = {"nights": nights, "median": median, "spread": spread, "z": z, "change": change}
        verdict = ("failed" if z >= settings.failed_z and change >= settings.failed_change
                   else "degraded" if z >= settings.degraded_z and change >= settings.degraded_change else "ok")
        word = "worse" if worse_by > 0 else "better"
        evidence.append(f"{value:.4g} is {abs(change):.0%} {word} than the median {median:.4g} of {nights} earlier "
                        f"nights, {z:.1f} robust sigma (sigma: {spread_how}); degraded needs >= "
                        f"{settings.degraded_z:g} sigma and >= {settings.degraded_change:.0%} worse, failed >= "
                        f"{settings.failed_z:g} sigma and >= {settings.failed_change:.0%}")
        status = worst([status, verdict])
    else:
        evidence.append(f"history of {nights} night(s) is below min_history {max(settings.min_history, 2)}: "
                        f"not judged on history")
    if not judged and status == "ok":
        status = "not_judged"
        evidence.append("no reference and too little history: nothing to judge the value against" if reference is None
                        else f"the reference has no {'lower' if higher_is_better else 'upper'} bound (the side on "
                             "which the value is worse) and the history is too short: nothing to judge it against")
    return Judgement(status, evidence, ref_info, hist_info)


def _ran_at(run: RunRow) -> datetime:
    """When a run ran: its start, else when it was stored (an ingested run may have no start)."""
    when = run.started_at or run.created_at
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _record_dicts(frame: pandas.DataFrame) -> list[dict[str, Any]]:
    """Stored records with the fields attribution reads (schema 2's land in `extra`)."""
    return [{**(row.get("extra") or {}), **{k: row[k] for k in ("kind", "op", "transport", "bytes", "direction",
                                                                 "hostnames", "valid")}}
            for row in frame.to_dict("records")]


# (series key, record key: op, transport, bytes, direction, hosts in rank order) -> node -> its ranks' median
# time in us (campaigns.kinds.attribution.node_times), for one night.
NodeTimes = dict[tuple[Any, ...], dict[str, float]]
# A node needs two peers: with one, the two ends of a pair see the same exchange and neither stands apart.
MIN_PEERS = 2


@dataclass
class SlowNode:
    """Fail-slow: a node slower than its own history AND than its peers of the same night (module docstring)."""

    node: str
    series_key: str
    op: str
    bytes: int
    value_us: float  # its ranks' median time tonight
    peers_us: dict[str, float]  # the other nodes of the same record tonight
    history: dict[str, Any]  # its own time on earlier nights: nights, median, spread, z, change (judge())
    peer_ratio: float  # value_us / the median of peers_us
    ratio_history: dict[str, Any]  # the same ratio on earlier nights: ratio_test()
    evidence: list[str]


def peer_ratios(times: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Per node of one record: its time over the median of its peers' times, and that median (nodes with
    MIN_PEERS peers, a positive time and a positive median). One sort per record: the peers of the node at
    sorted position i are the sorted values without position i (a median per node: 20 s at 2,000 nodes)."""
    if len(times) <= MIN_PEERS:
        return {}
    ordered = sorted(times.values())
    position = {node: i for i, node in enumerate(sorted(times, key=times.__getitem__))}
    half, odd = divmod(len(ordered) - 1, 2)  # the peers' middle rank(s)

    def peer(rank: int, i: int) -> float:
        return ordered[rank + (rank >= i)]
    ratios = {}
    for node, i in position.items():
        centre = peer(half, i) if odd else (peer(half - 1, i) + peer(half, i)) / 2
        if centre > 0 and times[node] > 0:
            ratios[node] = (times[node] / centre, centre)
    return ratios


def find_slow_nodes(tonight: NodeTimes, earlier: list[NodeTimes], settings: HealthSettings) -> list[SlowNode]:
    """The fail-slow rule (module docstring): per (node, record) with >= min_history earlier nights, its time
    judged against its own history (judge()) AND its time over its peers' median tested against that ratio's
    history (ratio_test(), Bonferroni over every (node, record) judged tonight)."""
    candidates = []
    for key, times in tonight.items():
        ratios_tonight = peer_ratios(times)
        past = [night[key] for night in earlier if key in night]
        ratios_past = [peer_ratios(t) for t in past]
        for node, value in times.items():
            own = [t[node] for t in past if node in t]
            ratios = [r[node][0] for r in ratios_past if node in r]
            if node in ratios_tonight and min(len(own), len(ratios)) >= max(settings.min_history, 2):
                candidates.append((key, node, value, ratios_tonight[node], own, ratios))
    if not candidates:
        return []
    level = settings.slow_alpha / len(candidates)
    slow = []
    for key, node, value, (ratio, centre), own, ratios in candidates:
        apart = ratio_test(ratio, kept_ratios(ratios, settings, level), settings.min_spread)
        if ratio <= 1 or apart["p"] > level or apart["change"] < settings.degraded_change:
            continue
        drift = judge(value, False, None, own, settings)
        if drift.status not in BAD:
            continue
        series_key, op, _transport, size, *_ = key
        peers = {host: v for host, v in tonight[key].items() if host != node}
        slow.append(SlowNode(node, series_key, op, size, value, peers, drift.history or {}, ratio, apart, [
            f"{op}@{size}: its ranks' median time {drift.evidence[0]}",
            f"{ratio:.3g}x the median {centre:.4g} us of its peers tonight "
            f"({', '.join(f'{h} {v:.4g}' for h, v in sorted(peers.items()))}); that ratio is {apart['change']:.0%} "
            f"above its geometric mean {apart['mean']:.4g} over {apart['nights']} earlier nights (log sd "
            f"{apart['log_sd']:.3g}): t {apart['t']:.3g} on {apart['nights'] - 1} df, one-sided p {apart['p']:.2g}",
            f"p <= {level:.2g}: slow_alpha {settings.slow_alpha:g} over {len(candidates)} (node, record) pairs "
            f"judged tonight (Bonferroni)"]))
    return slow


def kept_ratios(history: list[float], settings: HealthSettings, level: float) -> list[float]:
    """A node's peer ratios of earlier nights (oldest first) without the nights it stood apart on as tonight's
    rule names a node (above 1, by >= degraded_change and ratio_test's p <= `level`, tonight's Bonferroni level),
    against the nights kept before it, or for the first min_history nights against the others: kept, a node slow
    two nights running was not named the second night (its slow night had become its baseline). At slow_alpha
    instead of `level` the screening trimmed healthy baselines' high tail: false alarms on 5-24 % of healthy
    nights at 5-10 % noise instead of <= slow_alpha."""
    def apart(ratio: float, against: list[float], _early: bool) -> bool:
        if len(against) < 2 or ratio <= 1:
            return False
        test = ratio_test(ratio, against, settings.min_spread)
        return test["p"] <= level and test["change"] >= settings.degraded_change
    return [ratio for ratio, keep in zip(history, _screened(history, settings, apart)) if keep]


def ratio_test(ratio: float, history: list[float], min_spread: float) -> dict[str, Any]:
    """How far above its earlier nights a positive ratio lies: a one-sided prediction t-test on logarithms.
    For log ratios that vary as independent normal values, t = (log r - mean) / (s sqrt(1 + 1/n)) follows
    Student's t on n - 1 degrees of freedom (n >= 2 nights, mean and s of their logs); s is at least
    log(1 + min_spread), which can only lower t."""
    logs = [math.log(r) for r in history]
    nights, mean = len(logs), statistics.fmean(logs)
    log_sd = max(statistics.stdev(logs), math.log1p(min_spread))
    above = math.log(ratio) - mean
    t = above / (log_sd * math.sqrt(1 + 1 / nights)) if log_sd > 0 else math.copysign(math.inf, above)
    return {"nights": nights, "mean": math.exp(mean), "log_sd": log_sd, "t": t,
            "p": float(student_t.sf(t, nights - 1)), "change": ratio / math.exp(mean) - 1}


@dataclass
class MetricVerdict:
    run_key: str
    series_key: str
    op: str
    environ: str
    transport: str
    num_nodes: int
    hosts: list[str]
    metric: str
    bytes: int | None
    value: float | None
    unit: str
    status: str
    evidence: list[str]
    reference: dict[str, Any] | None = None
    history: dict[str, Any] | None = None


@dataclass
class PairTest:
    nodes: tuple[str, str]
    run_key: str
    status: str
    evidence: list[str]
    values: dict[str, float] = field(default_factory=dict)
    judged: list[str] = field(default_factory=list)  # the metrics a reference or history judged

    def clears(self, metrics: set[str]) -> bool:
        """Whether it clears its nodes of a bad run whose bad `metrics` these are: healthy, and one of their kinds (a
        latency, a bandwidth: an OSU check's large_latency is the pingpong's small_latency's kind) judged here; a run
        that failed outright (`run`), anything judged. A pair test judged by nothing, or only on a latency beside a
        bandwidth that failed, cleared every node of a failed run, reported ok."""
        judged = {_kind(name) for name in self.judged}
        return self.status not in BAD and bool(judged) and ("run" in metrics or bool(judged & set(map(_kind, metrics))))


def _kind(metric: str) -> str:
    """What a metric measures, by its unit: a time (latency) or a rate (bandwidth); `run` for a run's own outcome."""
    return METRICS[metric].unit if metric in METRICS else metric


@dataclass
class Isolation:
    suspects: list[str]
    pairs: list[PairTest] = field(default_factory=list)
    culprit_nodes: list[str] = field(default_factory=list)
    culprit_links: list[tuple[str, str]] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    # Attribution path: nodes whose every bad run also holds the confirmed culprit, which slowed >= 2x more
    # than they did: the culprit explains their runs, so they are not blamed (nor pair-tested).
    explained: list[str] = field(default_factory=list)
    note: str = ""
    # How the culprit was looked for: "attribution" (the degraded run's per-rank times named a suspect and
    # one pair test confirmed it) or "pairs" (pair tests between every node involved); the pair jobs it cost.
    path: str = "pairs"
    attribution: str = ""
    extra_jobs: int = 0


@dataclass
class Verdict:
    campaign: str
    site: str
    system: str
    tag: str
    status: str
    metrics: list[MetricVerdict]
    nodes: dict[str, dict[str, Any]]
    isolation: Isolation | None
    db: str
    run_dirs: list[str]
    # "node" (a culprit node or link explains what degraded), "fabric-wide" (degraded metrics on node sets
    # that share no node: not one node's fault) or "" (nothing degraded on several nodes)
    scope: str = ""
    slurm: SlurmSnapshot | None = None  # the partition's jobs and node states when judging, right after the cases ran
    slow_nodes: list[SlowNode] = field(default_factory=list)  # fail-slow, reported as `degraded: slow`
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    # the spec's references that judged no metric tonight (another size, op or node count than any run measured)
    unmatched_references: list[dict[str, Any]] = field(default_factory=list)
    # the verdicts written before for the same campaign and night (a re-run, --force), oldest first, each whole
    # but its own earlier_verdicts: a re-run night replaces none of them, nor do their run directories go unnamed
    earlier_verdicts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return int(EXIT_CODES[self.status])

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "exit_code": self.exit_code}


class HealthCheck:
    """Judges tonight's runs of a health campaign (stored under `tag`) and isolates culprits."""

    def __init__(self, campaign: Campaign, store: Store, tag: str, *, console: Console, runs_dir: Path,
                 placer: Placer) -> None:
        self.campaign = campaign
        self.store = store
        self.tag = tag
        self.settings = campaign.spec.health_settings
        self.console = console
        self.runs_dir = runs_dir
        self.placer = placer
        self.run_dirs: list[Path] = []
        self.matched: set[int] = set()  # id() of the references that judged a metric tonight
        self._invocations = 0
        self._runs: dict[str, RunRow | None] = {}  # tonight's runs looked up so far, by run key

    # --- data ---------------------------------------------------------------------------------------
    # Runs are looked up by key and series in the database, never all read: a site's store grows by every
    # night's runs, and a scan of all of them per judged case made judging O(cases x stored runs).
    def _where(self) -> dict[str, str]:
        return {"campaign": self.campaign.name, "site": self.campaign.site.name, "system": self.campaign.system.name}

    def _refresh(self) -> None:
        self._runs.clear()

    def _run(self, run_key: str) -> RunRow | None:
        if run_key not in self._runs:
            found = self.store.runs(run_key=run_key, **self._where())
            self._runs[run_key] = found[-1] if found else None  # the latest attempt (runs: oldest first)
        return self._runs[run_key]

    def _earlier_runs(self, series_key: str, run_key: str) -> list[RunRow]:
        """The passed runs of a series on the last history_nights nights before tonight, oldest first: the latest
        attempt of each run key (--force or two overlapping starts stored two of a night), the nights ordered by
        when they ran, none that ran after tonight's run (`run_key`; re-judging an older night). By tag they
        sorted as text: a `--tag test` run sorted after every date and stayed in every later window."""
        tonight = self._run(run_key)
        # per run key less its site setup (a night's pair tests share the series; a night run again after site.yaml
        # changed is another key of the same test case): its latest attempt
        latest: dict[str, RunRow] = {}
        for run in self.store.runs(run_key_prefix=series_key, status="pass", **self._where()):  # oldest first
            if not in_series(run.run_key, series_key):  # n1+n2's prefix is n1+n20's too
                continue
            tag = run.parameters.get("tag")
            if tag not in (None, self.tag) and (tonight is None or _ran_at(run) < _ran_at(tonight)):
                latest[without_setup(run.run_key)] = run
        runs = sorted(latest.values(), key=_ran_at)
        ran = {run.parameters["tag"]: _ran_at(run) for run in runs}  # a night: when its last run ran
        nights = set(sorted(ran, key=ran.__getitem__)[-self.settings.history_nights:])
        return [run for run in runs if run.parameters["tag"] in nights]

    def _history_runs(self, case: TestCase) -> list[tuple[RunRow, dict[tuple[str, int], float]]]:
        """The earlier nights' runs of the case's series (_earlier_runs) with their metric values, oldest first."""
        runs = self._earlier_runs(case.series_key, case.run_key)
        if not runs:
            return []
        frame = self.store.measurements(run_id=[run.id for run in runs])
        by_run = {run_id: run_metrics(records, reported_metrics(case.check, case.op))
                  for run_id, records in frame.groupby("run_id")}
        return [(run, by_run.get(run.id, {})) for run in runs]

    def _history(self, case: TestCase) -> dict[tuple[str, int], list[float]]:
        """Metric values of the same series on the last history_nights earlier nights (passed runs)."""
        history: dict[tuple[str, int], list[float]] = {}
        for _run, values in self._history_runs(case):
            for key, value in values.items():
                history.setdefault(key, []).append(value)
        return history

    def judge_case(self, case: TestCase, store_error: str | None = None) -> list[MetricVerdict]:
        """`store_error`: the case ran tonight, but the store refused it (not judged: the network is not to
        blame; the command exits 1, README "Exit codes")."""
        run = self._run(case.run_key)
        base = dict(run_key=case.run_key, series_key=case.series_key, op=case.op, environ=case.environ,
                    transport=case.transport, num_nodes=case.num_nodes)
        if store_error is not None:
            return [MetricVerdict(**base, hosts=[], metric="run", bytes=None, value=None, unit="",
                                  status="not_judged", evidence=[f"ran, but could not be stored ({store_error}): "
                                                                 "its records stay in the run directory"])]
        if run is None:
            return [MetricVerdict(**base, hosts=[], metric="run", bytes=None, value=None, unit="", status="failed",
                                  evidence=["no run stored for tonight: the test case did not run"])]
        hosts = list(run.parameters.get("hosts", []))
        if not measured(run):
            return [MetricVerdict(**base, hosts=hosts, metric="run", bytes=None, value=None, unit="",
                                  status="failed", evidence=[f"run {run.status}: {run.reason}"])]
        values = run_metrics(self.store.measurements(run_id=run.id), reported_metrics(case.check, case.op))
        history = self._history(case)
        verdicts = []
        for (metric, size), value in sorted(values.items()):
            unit, higher = METRICS[metric].unit, METRICS[metric].higher_is_better
            reference = find_reference(self.campaign.references(case.partition), case, metric, size)
            self.matched.add(id(reference))
            judgement = judge(value, higher, reference, history.get((metric, size), []), self.settings,
                              self._ceiling(case, metric, size))
            verdicts.append(MetricVerdict(**base, hosts=hosts, metric=metric, bytes=size, value=value, unit=unit,
                                          status=judgement.status, evidence=judgement.evidence,
                                          reference=judgement.reference, history=judgement.history))
        return verdicts

    def _ceiling(self, case: TestCase, metric: str, size: int) -> Ceiling | None:
        """What a multi-node run can plausibly reach over the site's nominal links (site.yaml `links`): a
        time far above the nominal inter-node latency plus the message at the nominal NIC bandwidth, a
        bandwidth above what a node's NICs carry."""
        partition = next((p for p in self.campaign.partitions if p.name == case.partition), None)
        if partition is None or partition.links is None or case.num_nodes < 2:
            return None
        links = partition.links
        if metric == "small_latency" and links.nic_latency is not None:
            factor = self.settings.implausible_latency_factor
            per_nic = (links.nic.gbs or links.nic.max_gbs or 0.0) if links.nic is not None else 0.0
            if size > SMALL_MESSAGE_BYTES and not per_nic:
                return None  # a large message's time is not bounded by a latency alone
            transfer_us = size / (per_nic * 1e3) if per_nic else 0.0
            return Ceiling(factor * (links.nic_latency.us + transfer_us),
                           f"{factor:g} x (the nominal inter-node latency {links.nic_latency.us:g} us "
                           f"({links.nic_latency.source})" + (f" + {size} B at {per_nic:g} GB/s)" if per_nic else ")"))
        if METRICS[metric].higher_is_better and links.nic is not None:  # a bandwidth
            nics = partition.node.nics or 1
            per_nic = links.nic.gbs or links.nic.max_gbs or 0.0
            factor = self.settings.implausible_bandwidth_factor
            return Ceiling(factor * nics * per_nic, f"{factor:g} x the nominal bandwidth of a node's {nics} NIC(s) "
                                                    f"of {per_nic:g} GB/s ({links.nic.source})")
        return None

    # --- isolation ----------------------------------------------------------------------------------
    def _pair_case(self, template: TestCase, pair: tuple[str, str]) -> TestCase:
        """The commbench pingpong between two nodes (Slurm --nodelist), made from the degraded test's own
        case: same site, partition, transport, env and data check (a reference check's case: the partition's
        default transport, data checked); the isolation settings' sizes and limits."""
        iso = self.settings.isolation
        variables = dict(template.variables)
        partition = next(p for p in self.campaign.partitions if p.name == template.partition)
        if "transport" in variables:
            transport = template.transport
        else:
            assert partition.commbench is not None  # a campaign's partitions run commbench
            transport = partition.commbench.default_transport
        check = CommbenchCheckSpec(check="commbench_run", ops=["pingpong"], sizes=iso.sizes, warmup=iso.warmup,
                                   iters=iso.iters, timeout_s=iso.timeout_s, time_limit_s=iso.time_limit_s,
                                   transports=[transport], check_data=bool(variables.get("check_data", True)))
        environ = iso.environ or template.environ
        return dataclasses.replace(
            template, environ=environ, check=check.check, op="pingpong",
            num_nodes=PAIR_RANKS, tasks_per_node=1, variables=tuple(check.variables(transport).items()),
            placement="any", tag=self.tag, nodelist=pair, tasks_per_node_setting=None,
            setup=site_setup(self.campaign.site, partition, environ),
            references=self.campaign.own_references(check))  # a reference check's template has a benchmark's

    def _run_pairs(self, template: TestCase, pairs: list[tuple[str, str]]) -> None:
        cases = [self._pair_case(template, pair) for pair in pairs]
        cases = [c for c in cases if not self.store.has_run(c.run_key)]  # resumable within the night
        if not cases:
            return
        if not self.run_dirs:
            self.run_dirs.append(new_run_dir(self.campaign, self.runs_dir))
        self.console.print(f"Isolation: pingpong between {', '.join('+'.join(c.nodelist) for c in cases)}")
        run_cases(cases, self.store, console=self.console, run_dir=self.run_dirs[-1], placer=self.placer,
                  first_invocation=self._next_invocation())
        self._refresh()

    def _next_invocation(self) -> int:
        existing = [int(p.name.split("-")[1]) for p in self.run_dirs[-1].glob("rfm-*")]
        return max(existing, default=0) + 1

    def _judge_pairs(self, template: TestCase, pairs: list[tuple[str, str]]) -> list[PairTest]:
        tests = []
        for pair in pairs:
            case = self._pair_case(template, pair)
            verdicts = self.judge_case(case)
            tests.append(PairTest(pair, case.run_key, worst(v.status for v in verdicts),
                                  [f"{v.metric}: {e}" for v in verdicts for e in v.evidence if v.status in BAD],
                                  {f"{v.metric}@{v.bytes}": v.value for v in verdicts if v.value is not None},
                                  sorted({v.metric for v in verdicts if v.status != "not_judged"})))
        # Against each other: a pair peer_factor times worse than the best pair is bad whatever its history. Where
        # that sets a pair apart, the comparison has judged every pair of the metric (the others are within
        # peer_factor of the best); where it sets none apart, it judged nothing (all alike: healthy, or all bad).
        factor = self.settings.isolation.peer_factor
        for name in {name for test in tests for name in test.values}:
            higher = METRICS[name.split("@")[0]].higher_is_better
            measured = [t.values[name] for t in tests if name in t.values]
            best = max(measured) if higher else min(measured)
            apart = False
            for test in tests:
                value = test.values.get(name)
                if value is None or best <= 0:
                    continue
                ratio = best / value if higher else value / best
                if ratio >= factor:
                    apart = True
                    test.status = worst([test.status, "degraded"])
                    test.evidence.append(f"{name}: {value:.4g} is {ratio:.1f}x worse than the best pair ({best:.4g})")
            for test in tests if apart else []:
                if name in test.values:
                    test.judged = sorted({*test.judged, name.split("@")[0]})
                    if test.status == "not_judged":  # judged against the other pairs: within peer_factor of the best
                        test.status = "ok"
        return tests

    def _records(self, run: RunRow) -> list[dict[str, Any]]:
        """A stored run's records with the fields attribution reads (schema 2's land in `extra`)."""
        return _record_dicts(self.store.measurements(run_id=run.id))

    def _attribute(self, bad: list[MetricVerdict], cases: list[TestCase]) -> Suspects | None:
        """The suspect named by the degraded run itself, against the last healthy run of its series: the latest
        earlier night whose values of tonight's bad metrics a baseline keeps (kept_nights; the last passed run was
        often the first night of the same fault, and the second night's attribution then came out ambiguous)
        (campaigns/kinds/attribution.py); None when there is no such baseline."""
        worst_case = max(bad, key=lambda v: v.num_nodes)
        tonight = self._run(worst_case.run_key)
        case = next((c for c in cases if c.run_key == worst_case.run_key), None)
        if tonight is None or case is None:
            return None
        keys = {(v.metric, v.bytes) for v in bad if v.run_key == worst_case.run_key and v.bytes is not None}
        earlier = [(run, values) for run, values in self._history_runs(case) if keys <= values.keys()]
        healthy = [True] * len(earlier)
        for metric, size in keys:
            reference = find_reference(self.campaign.references(case.partition), case, metric, size)
            flags = kept_nights([values[metric, size] for _, values in earlier], METRICS[metric].higher_is_better,
                                reference, self.settings, self._ceiling(case, metric, size))
            healthy = [h and f for h, f in zip(healthy, flags)]
        baseline = next((run for (run, _), ok in zip(reversed(earlier), reversed(healthy)) if ok), None)
        if baseline is None:
            return None
        sizes = {size for _, size in keys}
        pick = [r for r in self._records(tonight) if r["bytes"] in sizes]
        base = [r for r in self._records(baseline) if r["bytes"] in sizes]
        return rank_suspects(pick, base)

    def _confirm(self, template: TestCase, suspect: str, attributed: Suspects, nodes: list[str],
                 good_multi_hosts: set[str], isolation: Isolation) -> PairTest:
        """One pair test between the suspect and a node that did not slow down (a leader or a node that slowed >= LEAD
        x could be the culprit itself, which would "confirm" an innocent suspect): one of a healthy multi-node run
        tonight, else the run's node that slowed least, else any other. The suspect is the culprit if it is bad."""
        slowed = {g.node for g in attributed.ranked if g.growth >= LEAD} | set(attributed.leaders) | {suspect}
        calm = [g.node for g in reversed(attributed.ranked) if g.node not in slowed]
        partners = (sorted(good_multi_hosts - slowed) or calm or [n for n in nodes if n not in slowed]
                    or [n for n in nodes if n != suspect])
        pair = (partners[0], suspect)
        self._run_pairs(template, [pair])
        [test] = self._judge_pairs(template, [pair])
        isolation.pairs.append(test)
        isolation.extra_jobs += 1
        return test

    def isolate(self, bad: list[MetricVerdict], good_multi_hosts: set[str], cases: list[TestCase]) -> Isolation:
        """`cases`: tonight's test cases as they ran (an each-switch case once per switch); `good_multi_hosts`: the
        nodes of tonight's multi-node runs judged healthy."""
        suspects = sorted({host for v in bad for host in v.hosts})
        bad_metrics = {v.metric for v in bad}
        isolation = Isolation(suspects=suspects)
        template_key = max(bad, key=lambda v: v.num_nodes).run_key
        template = next(c for c in cases if c.run_key == template_key)
        nodes = sorted(set(suspects) | good_multi_hosts)
        if len(nodes) < 2:
            isolation.note = "fewer than two nodes involved: nothing to isolate"
            return isolation
        attributed = self._attribute(bad, cases)
        if attributed is not None:
            isolation.attribution = attributed.reason
        # Every leader is pair-tested (two stand out together when a link slows both ends): the one bad with a
        # calm partner is the culprit, one ok with it is cleared, one not judged stays unresolved.
        confirmations = {leader: self._confirm(template, leader, attributed, nodes, good_multi_hosts, isolation)
                         for leader in (attributed.leaders if attributed is not None else [])}
        culprits = [leader for leader, test in confirmations.items() if test.status in BAD]
        if culprits:
            isolation.path = "attribution"
            isolation.culprit_nodes = culprits
            isolation.cleared = sorted({node for test in confirmations.values() if test.clears(bad_metrics)
                                        for node in test.nodes})
            isolation.explained = [s for s in suspects if s not in confirmations
                                   and all(set(culprits) & set(v.hosts) for v in bad if s in v.hosts)]
            isolation.unresolved = [s for s in suspects if s not in culprits and s not in isolation.cleared
                                    and s not in isolation.explained]
            return isolation
        if confirmations:
            outcome = ("were healthy" if all(t.clears(bad_metrics) for t in confirmations.values())
                       else f"could not judge {', '.join(sorted(bad_metrics))} (no reference or history at the "
                            "isolation sizes)")
            isolation.note = (f"the run named {' and '.join(confirmations)}, but the pair test(s) {outcome}: pair "
                              f"tests between every node follow")
        ring = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
        if len(nodes) % 2:
            ring.append((nodes[-1], nodes[0]))
        tested: list[tuple[str, str]] = ring[:self.settings.isolation.max_pairs]
        self._run_pairs(template, tested)
        results = self._judge_pairs(template, tested)
        isolation.extra_jobs += len(tested)
        cleared = {node for test in results if test.clears(bad_metrics) for node in test.nodes}
        remaining = [s for s in suspects if s not in cleared
                     and not any(s in t.nodes and (set(t.nodes) - {s}) <= cleared for t in results)]
        if remaining and cleared:
            partner = sorted(cleared - set(suspects)) or sorted(cleared)
            extra = [(partner[0], s) for s in remaining][:max(0, self.settings.isolation.max_pairs - len(tested))]
            self._run_pairs(template, extra)
            isolation.extra_jobs += len(extra)
            tested += extra
            results = self._judge_pairs(template, tested)
            cleared = {node for test in results if test.clears(bad_metrics) for node in test.nodes}
        isolation.pairs = [*isolation.pairs, *results]  # a refuted attribution's pair test first
        isolation.cleared = sorted(cleared)
        for test in results:
            if test.status not in BAD:
                continue
            a, b = test.nodes
            if a in cleared and b in cleared:
                isolation.culprit_links.append(test.nodes)
            for node, other in ((a, b), (b, a)):
                if other in cleared and node not in cleared and node not in isolation.culprit_nodes:
                    isolation.culprit_nodes.append(node)
        named = set(isolation.culprit_nodes) | cleared
        isolation.unresolved = [s for s in suspects if s not in named]
        if not cleared and not any(test.judged for test in results):
            isolation.note = ("no pair test could be judged (no reference or history at the isolation sizes): the "
                              "suspects stay unresolved")
        elif not cleared and all(test.status not in BAD for test in results):
            isolation.note = (f"no pair test judged what was bad ({', '.join(sorted(bad_metrics))}): no reference or "
                              "history for it at the isolation sizes; the suspects stay unresolved")
        elif not cleared:
            isolation.note = ("no pair of nodes tested healthy: a system-wide problem, or bad nodes on every "
                              "pair tested")
        elif not isolation.culprit_nodes and not isolation.culprit_links:
            isolation.note = "every pair test was healthy: the multi-node problem did not show between two nodes"
        return isolation

    # --- verdict ------------------------------------------------------------------------------------
    def evaluate(self, result: CampaignResult) -> Verdict:
        if result.run_dir is not None:
            self.run_dirs.append(result.run_dir)
        self._refresh()
        metrics: list[MetricVerdict] = []
        # An unplaceable case: the topology cannot give this placement tonight (a node drained or down), nothing was
        # measured: not judged, said so (left out, a night whose different-switch test never ran read HEALTH OK).
        cases = [item.case for item in result.results if item.status != "unplaceable"]
        unstored = {item.case.run_key: item.store_error for item in result.unstored}
        for case in cases:
            metrics += self.judge_case(case, unstored.get(case.run_key))
        metrics += [MetricVerdict(run_key=item.case.run_key, series_key=item.case.series_key, op=item.case.op,
                                  environ=item.case.environ, transport=item.case.transport,
                                  num_nodes=item.case.num_nodes, hosts=[], metric="run", bytes=None, value=None,
                                  unit="", status="not_judged",
                                  evidence=[f"not run tonight: {item.reason or 'unplaceable'}"])
                    for item in result.results if item.status == "unplaceable"]
        bad_multi = [m for m in metrics if m.status in BAD and m.num_nodes > 1]
        # known good (a pair test's partner): nothing bad and something judged; a run judged by nothing is no evidence
        good_runs = ({m.run_key for m in metrics if m.status != "not_judged"}
                     - {m.run_key for m in metrics if m.status in BAD})
        good_multi_hosts = {h for m in metrics if m.num_nodes > 1 and m.run_key in good_runs for h in m.hosts}
        snapshot = self._snapshot()
        scope = ""
        if bad_multi and fabric_wide([set(m.hosts) for m in {m.run_key: m for m in bad_multi}.values()]):
            scope, isolation = "fabric-wide", Isolation(suspects=[], note=(
                "degraded multi-node runs on node sets that share no node: no single node explains them "
                "(fabric-wide: contention or a switch); read them against the partition's load in `slurm`"))
        else:
            isolation = (self.isolate(bad_multi, good_multi_hosts, cases) if bad_multi and self.settings.isolate
                         else None)
            if isolation is not None and (isolation.culprit_nodes or isolation.culprit_links):
                scope = "node"
        nodes = self._node_verdicts(metrics, isolation)
        # Fail-slow only where nothing else blamed the node: a degraded or failed node is reported already.
        slow = [s for s in find_slow_nodes(*self._node_times(cases), self.settings)
                if nodes.get(s.node, {}).get("status") not in BAD]
        for s in slow:
            node = nodes.setdefault(s.node, {"status": "ok", "evidence": []})
            node.update(status="degraded", reason="slow")
            node["evidence"] += s.evidence
        return Verdict(campaign=self.campaign.name, site=self.campaign.site.name, system=self.campaign.system.name,
                       tag=self.tag, status=worst([*(m.status for m in metrics), *("degraded" for _ in slow)]),
                       metrics=metrics, nodes=nodes, isolation=isolation, db=self.store.url,
                       run_dirs=[str(d) for d in self.run_dirs], scope=scope, slurm=snapshot, slow_nodes=slow,
                       unmatched_references=[ref.model_dump(mode="json", exclude_none=True)
                                             for ref in self.campaign.spec.references if id(ref) not in self.matched])

    def _node_times(self, cases: list[TestCase]) -> tuple[NodeTimes, list[NodeTimes]]:
        """Tonight's and each earlier night's per-node times of the cases' series (oldest night first)."""
        tonight: NodeTimes = {}
        earlier: dict[str, NodeTimes] = {}
        ran: dict[str, datetime] = {}  # when each night ran (its latest run of any series)
        for case in cases:
            run = self._run(case.run_key)
            if run is None or not measured(run):
                continue
            tonight |= {(case.series_key, *key): times for key, times in node_times(self._records(run)).items()}
            runs = self._earlier_runs(case.series_key, case.run_key)
            if not runs:
                continue
            night_of = {r.id: r.parameters["tag"] for r in runs}
            for r in runs:
                ran[night_of[r.id]] = max(ran.get(night_of[r.id], _ran_at(r)), _ran_at(r))
            for run_id, records in self.store.measurements(run_id=list(night_of)).groupby("run_id"):
                for key, times in node_times(_record_dicts(records)).items():
                    earlier.setdefault(night_of[run_id], {})[(case.series_key, *key)] = times
        return tonight, [earlier[night] for night in sorted(earlier, key=ran.__getitem__)]

    def _snapshot(self) -> SlurmSnapshot | None:
        """The Slurm partition's jobs and node states now (Slurm partitions only)."""
        partitions = sorted({slurm_partition(p.access, p.name) for p in self.campaign.partitions
                             if p.scheduler in SLURM_SCHEDULERS})
        return take_snapshot(partitions[0]) if partitions else None

    @staticmethod
    def _node_verdicts(metrics: list[MetricVerdict], isolation: Isolation | None) -> dict[str, dict[str, Any]]:
        nodes: dict[str, dict[str, Any]] = {}
        # A node starts ok only when one of its metrics (or pair tests) was judged: unjudged is never ok.
        for metric in metrics:
            for host in metric.hosts:
                node = nodes.setdefault(host, {"status": "not_judged", "evidence": []})
                if metric.status != "not_judged":
                    node["status"] = "ok"
        for metric in metrics:
            if metric.status not in BAD or metric.num_nodes > 1:
                continue
            for host in metric.hosts:  # a single-node run names its node directly
                nodes[host]["status"] = worst([nodes[host]["status"], metric.status])
                nodes[host]["evidence"].append(f"{metric.op} on 1 node, {metric.metric}: {metric.status}")
        unisolated = [m for m in metrics if m.status in BAD and m.num_nodes > 1]
        if isolation is None:
            for metric in unisolated:
                for host in metric.hosts:
                    nodes[host]["status"] = worst([nodes[host]["status"], metric.status])
                    nodes[host]["evidence"].append(f"in {metric.op} on {metric.num_nodes} nodes ({metric.status}); "
                                                   f"not isolated")
            return nodes
        for test in isolation.pairs:
            for host in test.nodes:
                node = nodes.setdefault(host, {"status": "not_judged", "evidence": []})
                if node["status"] == "not_judged" and test.status != "not_judged":
                    node["status"] = "ok"
        for host in isolation.culprit_nodes:
            bad_pairs = [t for t in isolation.pairs if host in t.nodes and t.status in BAD]
            nodes[host]["status"] = worst([nodes[host]["status"], *(t.status for t in bad_pairs)])
            nodes[host]["evidence"] += [f"pair {'+'.join(t.nodes)} {t.status}: {'; '.join(t.evidence)}"
                                        for t in bad_pairs]
        for host in isolation.explained:
            nodes[host]["evidence"].append(f"in a bad multi-node test that {', '.join(isolation.culprit_nodes)} "
                                           "explains (its ranks slowed most; a pair test confirmed it); not pair-tested")
        status_of_suspects = worst(m.status for m in unisolated)
        for host in isolation.unresolved:
            nodes[host]["status"] = worst([nodes[host]["status"], status_of_suspects])
            nodes[host]["evidence"].append("in a bad multi-node test; the pair tests could not clear it")
        for a, b in isolation.culprit_links:
            for host in (a, b):
                nodes[host]["evidence"].append(f"link {a}<->{b} bad while both nodes are healthy with others")
        return nodes


def default_verdict_path(verdict: Verdict) -> Path:
    """<workspace>/health/<campaign>-<night>.json; <campaign>-<night>@<site>@<system>.json when that file holds the
    night of a campaign of the same name on another site or system (the second's verdict read as a re-run of the
    first's night, burying it in earlier_verdicts)."""
    path = paths.health_dir() / f"{verdict.campaign}-{verdict.tag}.json"
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return path
    if isinstance(before, dict) and (before.get("site"), before.get("system")) != (verdict.site, verdict.system):
        return path.with_name(f"{path.stem}@{verdict.site}@{verdict.system}{path.suffix}")
    return path


def write_verdict(verdict: Verdict, path: Path) -> None:
    """The verdict to `path`, keeping the verdicts of the same campaign and night that `path` holds (in
    earlier_verdicts): a night run again adds its verdict to theirs."""
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None  # none yet, or not a verdict: replaced
    if isinstance(before, dict) and (before.get("campaign"), before.get("tag")) == (verdict.campaign, verdict.tag):
        earlier = before.pop("earlier_verdicts", None)
        verdict.earlier_verdicts = [*(earlier if isinstance(earlier, list) else []), before]
    write_atomic(path, json.dumps(verdict.to_json(), indent=2, default=str) + "\n")


_STYLE = {"ok": "green", "not_judged": "cyan", "degraded": "bold yellow", "failed": "bold red"}


def print_summary(console: Console, verdict: Verdict, verdict_path: Path, max_rows: int = 12) -> None:
    """One screen: the overall verdict, the metrics that are not ok, the nodes, the isolation outcome."""
    counts = {s: sum(m.status == s for m in verdict.metrics) for s in STATUSES}
    console.print(f"[{_STYLE[verdict.status]}]HEALTH {verdict.status.replace('_', ' ').upper()}[/] "
                  f"{escape(verdict.campaign)} on {verdict.site}:{verdict.system}, night {verdict.tag}: "
                  f"{counts['ok']} ok, {counts['not_judged']} not judged, {counts['degraded']} degraded, "
                  f"{counts['failed']} failed metric(s)"
                  + (f", {len({s.node for s in verdict.slow_nodes})} slow node(s)" if verdict.slow_nodes else "")
                  + f"; exit code {verdict.exit_code}")
    bad = sorted((m for m in verdict.metrics if m.status != "ok"), key=lambda m: -STATUSES.index(m.status))
    rows = [(f"[{_STYLE[m.status]}]{m.status.replace('_', ' ')}[/]", m.environ, m.op, str(m.num_nodes),
             f"{m.metric}{'' if m.bytes is None else f'@{m.bytes}'}",
             "-" if m.value is None else f"{m.value:.4g} {m.unit}", escape("; ".join(m.evidence))) for m in bad]
    # fail-slow: the node in the nodes column, its own time as the value
    rows += [(f"[{_STYLE['degraded']}]degraded: slow[/]", "", s.op, escape(s.node), f"node time@{s.bytes}",
              f"{s.value_us:.4g} us", escape("; ".join(s.evidence))) for s in verdict.slow_nodes]
    if rows:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for column in ("status", "env", "op", "nodes", "metric", "value", "evidence"):
            table.add_column(column, overflow="fold")
        for row in rows[:max_rows]:
            table.add_row(*row)
        console.print(table)
        if len(rows) > max_rows:
            console.print(f"... and {len(rows) - max_rows} more in the verdict file")
    node_text = ", ".join(f"[{_STYLE[v['status']]}]{escape(n)} {v['status'].replace('_', ' ')}"
                          f"{': ' + v['reason'] if 'reason' in v else ''}[/]" for n, v in sorted(verdict.nodes.items()))
    console.print(f"nodes: {node_text or '-'}")
    if verdict.scope == "fabric-wide":
        console.print("[bold red]fabric-wide: degraded multi-node runs on node sets that share no node[/]")
    if verdict.slurm is not None:
        snap = verdict.slurm
        others = ", ".join(f"{job['id']} {job['name']} ({job['user']}, {job['state']}, {len(job['nodes'])} node(s))"
                           for job in snap.jobs)
        console.print(f"partition {snap.partition} at {snap.taken_at}: "
                      + escape(snap.problem or f"{len(snap.jobs)} job(s) {others or ''}".strip()))
    iso = verdict.isolation
    if iso is not None:
        pairs = ", ".join(f"{'+'.join(t.nodes)} {t.status}" for t in iso.pairs)
        console.print(f"isolation: pairs {pairs or '-'}")
        if iso.attribution:
            console.print(f"attribution: {escape(iso.attribution)}")
        how = ("named by the run's per-rank times, confirmed by one pair test" if iso.path == "attribution"
               else "pair tests between the nodes involved")
        console.print(f"isolation path: {how}; {iso.extra_jobs} extra pair job(s)")
        if iso.culprit_nodes:
            console.print(f"[bold red]culprit node(s): {', '.join(iso.culprit_nodes)}[/]")
        if iso.culprit_links:
            console.print(f"[bold red]culprit link(s): {', '.join(a + '<->' + b for a, b in iso.culprit_links)}[/]")
        if iso.note:
            console.print(f"isolation: {escape(iso.note)}")
    for ref in verdict.unmatched_references:
        console.print(f"[yellow]the spec's reference {escape(json.dumps(ref))} judged no metric tonight[/]: no run "
                      "measured its metric at that size, op and node count", soft_wrap=True)
    if verdict.earlier_verdicts:
        console.print("earlier verdicts of this night, kept in this one (earlier_verdicts): " + ", ".join(
            f"{escape(str(v.get('status')))} at {escape(str(v.get('created_at')))}" for v in verdict.earlier_verdicts))
    console.print(f"verdict: {verdict_path}")
