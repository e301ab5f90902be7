"""What a health night says when a case could not run, and how pair tests isolate a culprit (found by a review of
campaigns/kinds/health.py, each reproduced before the fix): an unplaceable case left out (HEALTH OK), pair tests
that judged nothing clearing every node of a failed run, a partner "that did not slow down" that was the culprit,
and one switch's history taking another node set's runs; two sites' nights in one verdict file, an exit code the
summary did not explain. Pair runs are stored records, as isolation stores them."""
from __future__ import annotations

import copy
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fixtures_store import commbench_record
from test_attribution import _load as recorded
from rich.console import Console

from campaigns.kinds.health import HealthCheck, Verdict
from campaigns.model.spec import Campaign, TestCase, load_campaign
from campaigns.reframe.runner import CampaignResult, CaseResult
from campaigns.slurm.placement import Placer
from campaigns.store import RunInfo, Store, open_store

HOSTS = ("c6n1", "c6n2", "c6n3")


def ingest(store: Store, case: TestCase, tag: str, records: list[dict[str, Any]], day: int,
           hosts: tuple[str, ...] = HOSTS, status: str = "pass") -> None:
    store.ingest(RunInfo(run_key=case.run_key, campaign=case.campaign, site=case.site, system=case.system,
                         partition=case.partition, environ=case.environ, check_name=case.check,
                         parameters={**case.parameters, "tag": tag, "hosts": list(hosts)}, num_nodes=case.num_nodes,
                         num_tasks=case.num_tasks, status=status, reason=None if status == "pass" else "timeout",
                         started_at=datetime(2026, 3, 1, 2, 30, tzinfo=UTC) + timedelta(days=day)),
                 records, new_attempt=True, validated=True)


def campaign_of(tmp_path: Path, spec: str) -> Campaign:
    (tmp_path / "h.yaml").write_text("name: h\nkind: health\nsite: localslurm\nsystem: localslurm:debug\n"
                                     "environments: [openmpi]\n" + spec)
    return load_campaign(tmp_path / "h.yaml")


def evaluate(campaign: Campaign, store: Store, tag: str, tmp_path: Path, results: list[CaseResult]) -> Verdict:
    check = HealthCheck(campaign, store, tag, console=Console(quiet=True), runs_dir=tmp_path, placer=Placer())
    return check.evaluate(CampaignResult(None, store.url, results))


def pair_runs(bad_node: str, factor: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Isolation's pair jobs, as stored records: every pair with `bad_node` `factor` x slower."""
    def run_pairs(self: HealthCheck, template: TestCase, pairs: list[tuple[str, str]]) -> None:
        for pair in pairs:
            case = self._pair_case(template, pair)
            slow = factor if bad_node in pair else 1.0
            records = [commbench_record(op="pingpong", size=size, iters=8, samples_us=[us * slow] * 8, ranks=2,
                                        nodes=2, hostnames=list(pair)) for size, us in ((8, 12.0), (65536, 400.0))]
            ingest(self.store, case, self.tag, records, day=9, hosts=pair)
        self._refresh()
    monkeypatch.setattr(HealthCheck, "_run_pairs", run_pairs)


TWO_PLACEMENTS = ("node_counts: [3]\nplacements: [any, different-switch]\nchecks: [{check: commbench_run, ops: "
                  "[sendrecv], sizes: [64K, 1M], tasks_per_node: 1}]\nhealth: {min_history: 2, isolate: false}\n")


def two_quiet_nights_of_any(campaign: Campaign, store: Store) -> None:
    """Nights n1, n2 and tonight's (n3) run of the `any` placement, all clean."""
    for day, (tag, name) in enumerate((("n1", "clean"), ("n2", "clean2"), ("n3", "clean"))):
        ingest(store, next(c for c in campaign.cases(tag) if c.placement == "any"), tag, recorded(f"{name}-sendrecv"),
               day)


def test_a_case_that_cannot_be_placed_tonight_is_not_judged(tmp_path: Path) -> None:
    """A node drained overnight: the different-switch test cannot be placed. It was left out of the verdict, and the
    night read HEALTH OK, exit 0."""
    campaign = campaign_of(tmp_path, TWO_PLACEMENTS)
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        two_quiet_nights_of_any(campaign, store)
        results = [CaseResult(c, "pass") if c.placement == "any" else
                   CaseResult(c, "unplaceable", "placement different-switch: no leaf switch has a node in service")
                   for c in campaign.cases("n3")]
        verdict = evaluate(campaign, store, "n3", tmp_path, results)
    assert (verdict.status, verdict.exit_code) == ("not_judged", 3)
    [unrun] = [m for m in verdict.metrics if m.metric == "run"]
    assert unrun.status == "not_judged" and "different-switch" in json.dumps(unrun.evidence)
    assert unrun.evidence == ["not run tonight: placement different-switch: no leaf switch has a node in service"]
    assert {m.status for m in verdict.metrics if m.metric != "run"} == {"ok"}


def throttled_night(tmp_path: Path, pair_factor: float, monkeypatch: pytest.MonkeyPatch) -> Verdict:
    """The recorded night of c6n3's throttled link after two clean ones (its sendrecv fails the bandwidth
    reference), isolated with every pair holding c6n3 `pair_factor` x slower."""
    campaign = campaign_of(tmp_path, "node_counts: [3]\nchecks: [{check: commbench_run, ops: [sendrecv], sizes: "
                                     "[64K, 1M], tasks_per_node: 1}]\nhealth: {min_history: 2}\nreferences:\n  - "
                                     "{op: sendrecv, metric: large_goodput, bytes: 1048576, nodes: 3, value: 0.05, "
                                     "lower: -0.9}\n")
    pair_runs("c6n3", pair_factor, monkeypatch)
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        for day, (tag, name) in enumerate((("n1", "clean"), ("n2", "clean2"), ("n3", "throttled-c6n3"))):
            [case] = campaign.cases(tag)
            ingest(store, case, tag, recorded(f"{name}-sendrecv"), day)
        [case] = campaign.cases("n3")
        return evaluate(campaign, store, "n3", tmp_path, [CaseResult(case, "pass")])


def test_pair_tests_that_cannot_judge_the_bad_metric_clear_no_node(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The throttled node's night fails its bandwidth reference; the pair tests measure 2.5x worse with it, below
    the peer factor, with no reference or history for their bandwidth (only latency, judged by the site's
    reference). They cleared every node: the failed run's nodes all 'ok', "every pair test was healthy"."""
    verdict = throttled_night(tmp_path, 2.5, monkeypatch)
    isolation = verdict.isolation
    assert verdict.status == "failed" and isolation is not None
    assert {m.metric for m in verdict.metrics if m.status == "failed"} == {"large_goodput"}
    assert all(test.judged == ["small_latency"] for test in isolation.pairs), isolation.pairs
    assert (isolation.cleared, isolation.culprit_nodes, isolation.unresolved) == ([], [], list(HOSTS))
    assert "no pair test judged what was bad (large_goodput)" in isolation.note
    assert {node: v["status"] for node, v in verdict.nodes.items()} == dict.fromkeys(HOSTS, "failed")


def test_pairs_set_apart_by_the_peer_factor_are_judged_against_each_other(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The same night with the throttled node's pairs 5x worse (beyond the peer factor 3): the comparison between
    pairs sets them apart, so it judged every pair of that bandwidth: the others clear their nodes and the node is
    named, with no reference or history at the isolation sizes (the fabric-wide health test's fourth night, on the
    real cluster, relies on it: its first pair tests have no history)."""
    verdict = throttled_night(tmp_path, 5, monkeypatch)
    isolation = verdict.isolation
    assert isolation is not None and isolation.culprit_nodes == ["c6n3"], isolation
    assert "c6n1" in isolation.cleared and "c6n2" in isolation.cleared
    [healthy] = [test for test in isolation.pairs if set(test.nodes) == {"c6n1", "c6n2"}]
    assert healthy.status == "ok" and "large_goodput" in healthy.judged, isolation.pairs
    # the culprit's status: its pairs' (degraded: 5x worse than the best pair)
    assert {node: v["status"] for node, v in verdict.nodes.items()} == {"c6n1": "ok", "c6n2": "ok",
                                                                         "c6n3": "degraded"}


def test_a_run_that_failed_outright_is_isolated_by_any_judged_pair(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node run that failed (no metric: `run`) is isolated by pair tests that judged anything: the healthy
    pair clears its nodes, the bad one names the third (the first fix cleared none: no pair judges `run`)."""
    campaign = campaign_of(tmp_path, "node_counts: [3]\nchecks: [{check: commbench_run, ops: [sendrecv], sizes: "
                                     "[64K, 1M], tasks_per_node: 1}]\nhealth: {min_history: 2}\n")
    pair_runs("c6n3", 200, monkeypatch)
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        [case] = campaign.cases("n1")
        ingest(store, case, "n1", [], 0, status="fail")
        verdict = evaluate(campaign, store, "n1", tmp_path, [CaseResult(case, "fail")])
    isolation = verdict.isolation
    assert [m.metric for m in verdict.metrics] == ["run"] and isolation is not None
    assert (isolation.cleared, isolation.culprit_nodes) == (["c6n1", "c6n2"], ["c6n3"]), isolation
    assert {node: v["status"] for node, v in verdict.nodes.items()} == {"c6n1": "ok", "c6n2": "ok", "c6n3": "failed"}


def test_the_pair_test_partner_is_a_node_that_did_not_slow_down(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes stand out (c6n2 x15, c6n1 x10; c6n1 is the culprit: every pair with it fails). c6n1 was also in
    tonight's pingpong, judged not bad, so it was taken as the partner "that did not slow down" for c6n2: the pair
    failed, c6n2 was blamed and c6n1 'explained', ok. The partner is c6n3 now, and each leader is tested."""
    campaign = campaign_of(tmp_path, "node_counts: [2, 3]\nchecks:\n  - {check: commbench_run, ops: [sendrecv], "
                                     "sizes: [64K, 1M], tasks_per_node: 1}\n  - {check: commbench_run, ops: "
                                     "[pingpong], sizes: [16, 65536]}\nhealth: {min_history: 2}\n")
    growth = {"c6n1": 10.0, "c6n2": 15.0, "c6n3": 1.0}
    tonight = []
    for record in map(copy.deepcopy, recorded("clean-sendrecv")):
        record["per_rank"]["median_us"] = [m * growth[h] for h, m in zip(record["hostnames"],
                                                                          record["per_rank"]["median_us"])]
        record["latency_us"] *= 15
        for bandwidth in ("goodput_gbs", "busbw_gbs", "algbw_gbs"):
            record[bandwidth] /= 15
        tonight.append(record)
    pair_runs("c6n1", 200, monkeypatch)
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        for day, tag in enumerate(("n1", "n2")):
            ingest(store, next(c for c in campaign.cases(tag) if c.num_nodes == 3), tag, recorded("clean-sendrecv"),
                   day)
        cases = campaign.cases("n3")
        sendrecv = next(c for c in cases if c.num_nodes == 3)
        pingpong = next(c for c in cases if c.op == "pingpong" and c.num_nodes == 2)
        ingest(store, sendrecv, "n3", tonight, 2)
        ingest(store, pingpong, "n3", [commbench_record(op="pingpong", size=size, iters=8, samples_us=[us] * 8,
                                                        ranks=2, nodes=2, hostnames=["c6n1", "c6n3"])
                                       for size, us in ((16, 12.0), (65536, 400.0))], 2, hosts=("c6n1", "c6n3"))
        verdict = evaluate(campaign, store, "n3", tmp_path, [CaseResult(sendrecv, "pass"),
                                                             CaseResult(pingpong, "pass")])
    isolation = verdict.isolation
    assert isolation is not None and isolation.path == "attribution"
    assert [test.nodes for test in isolation.pairs] == [("c6n3", "c6n2"), ("c6n3", "c6n1")]
    assert isolation.culprit_nodes == ["c6n1"] and verdict.nodes["c6n1"]["status"] == "failed"
    assert "c6n1" not in isolation.explained and "c6n2" not in isolation.explained


def test_one_switch_s_history_is_not_another_node_set_s(tmp_path: Path) -> None:
    """each-switch series keys end in their nodes: the series of n1+n2 took the runs of n1+n20 as its history."""
    campaign = campaign_of(tmp_path, "node_counts: [2]\nplacements: [each-switch]\nchecks: [{check: commbench_run, "
                                     "ops: [pingpong], sizes: [8, 64K]}]\n")

    def on(tag: str, nodes: tuple[str, str]) -> TestCase:
        [case] = campaign.cases(tag)
        return dataclasses.replace(case, nodelist=nodes)

    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        ingest(store, on("n1", ("n1", "n20")), "n1", [], 0, hosts=("n1", "n20"))
        ingest(store, on("n0", ("n1", "n2")), "n0", [], 0, hosts=("n1", "n2"))
        tonight = on("n2", ("n1", "n2"))
        ingest(store, tonight, "n2", [], 1, hosts=("n1", "n2"))
        check = HealthCheck(campaign, store, "n2", console=Console(quiet=True), runs_dir=tmp_path, placer=Placer())
        history = check._earlier_runs(tonight.series_key, tonight.run_key)
    assert [run.parameters["tag"] for run in history] == ["n0"]


def test_two_sites_nights_of_one_campaign_name_get_a_verdict_file_each(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One workspace, a campaign `nightly` on two sites: the second site's night went into the first's file, the
    first's verdict read as an earlier run of the same night (earlier_verdicts). Each keeps a file; a night run again
    on the same site still adds to its own file."""
    from campaigns.kinds.health import default_verdict_path, write_verdict

    monkeypatch.setenv("COMMCAMP_HOME", str(tmp_path))

    def night(site: str, status: str) -> Verdict:
        return Verdict(campaign="nightly", site=site, system="main", tag="2026-03-01", status=status, metrics=[],
                       nodes={}, isolation=None, db="sqlite://", run_dirs=[])

    first = default_verdict_path(night("alps", "ok"))
    assert first == tmp_path / "health" / "nightly-2026-03-01.json"
    write_verdict(night("alps", "ok"), first)
    second = default_verdict_path(night("lumi", "failed"))
    assert second == tmp_path / "health" / "nightly-2026-03-01@lumi@main.json"
    write_verdict(night("lumi", "failed"), second)
    again = default_verdict_path(night("alps", "degraded"))
    assert again == first
    write_verdict(night("alps", "degraded"), again)
    kept = json.loads(first.read_text())
    assert kept["status"] == "degraded" and [v["site"] for v in kept["earlier_verdicts"]] == ["alps"]
    assert json.loads(second.read_text())["earlier_verdicts"] == []


def test_a_night_with_a_case_not_stored_says_why_commcamp_exits_1(tmp_path: Path) -> None:
    """The store refused a case: commcamp exits 1 (README, "Exit codes") while the verdict and its summary give the
    night's own code, without a word on the difference."""
    import io

    from campaigns.kinds.table import KINDS, FinishedRun

    campaign = campaign_of(tmp_path, TWO_PLACEMENTS)
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        two_quiet_nights_of_any(campaign, store)
        results = [CaseResult(c, "pass") if c.placement == "any" else
                   CaseResult(c, "pass", store_error="database is locked") for c in campaign.cases("n3")]
        out = io.StringIO()
        console = Console(file=out, width=200)
        code = KINDS["health"].after_run(FinishedRun(campaign, CampaignResult(None, store.url, results), store, "n3",
                                                     console, console, tmp_path, Placer(), tmp_path / "v.json"))
    assert int(code) == 1 and json.loads((tmp_path / "v.json").read_text())["exit_code"] == 3
    assert "commcamp exits 1, not the night's 3: 1 case(s) ran but could not be stored (not judged)" in out.getvalue()


def test_a_pair_test_of_a_reference_check_s_run_takes_the_spec_s_commbench_references(tmp_path: Path) -> None:
    """A pair test is a commbench pingpong made from the degraded case: made from an nccl_tests_run case it kept
    that case's benchmark references, which ReFrame matched on the pingpong (a benchmark's all_reduce_perf 30 us
    small_latency judging it). It takes the spec's commbench references instead."""
    campaign = campaign_of(tmp_path, (
        "node_counts: [2]\nchecks: [{check: commbench_run, ops: [pingpong], sizes: [8, 64K]}]\n"
        "references:\n  - {benchmark: all_reduce_perf, metric: small_latency, bytes: 8, value: 30, upper: 0.2}\n"
        "  - {op: pingpong, metric: small_latency, bytes: 8, value: 12, upper: 1.0}\n"))
    (template,) = campaign.cases("n1")
    foreign = dataclasses.replace(template, check="nccl_tests_run", op="all_reduce_perf", variables=(),
                                  references='[{"benchmark":"all_reduce_perf"}]')
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        check = HealthCheck(campaign, store, "n1", console=Console(quiet=True), runs_dir=tmp_path, placer=Placer())
        pair = check._pair_case(foreign, ("c6n1", "c6n2"))
    assert (pair.check, pair.op) == ("commbench_run", "pingpong")
    assert json.loads(pair.references) == [{"op": "pingpong", "metric": "small_latency", "bytes": 8, "value": 12.0,
                                            "upper": 1.0}]
