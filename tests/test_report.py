"""`commcamp report` end to end: real commbench records (cpu backend, Open MPI and MPICH) ingested into a
store, an HTML report written, and the report loaded in a real headless Chromium: every plot drawn, no
console message at all, nothing fetched from the network, a screenshot taken."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures_bench import CommbenchBuild, run_commbench
from fixtures_cli import commcamp_output


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MAX_REPORT_BYTES = 5 * 2**20


def chromium(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def report_db(commbench_builds: dict[str, CommbenchBuild], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store with real records: every op of the report's sections, three tagged 'nights'."""
    directory = tmp_path_factory.mktemp("report")
    db = f"sqlite:///{directory / 'results.db'}"
    for mpi, ranks in (("openmpi", 4), ("mpich", 2)):
        out = directory / f"{mpi}.jsonl"
        done = run_commbench(commbench_builds[mpi], ranks, [
            "--op", "pingpong,allreduce,pairmatrix", "--sizes", "8,1024,65536", "--warmup", "1", "--iters", "20",
            "--output", str(out)], env={"UCX_TLS": "self,sm"})
        assert done.returncode == 0, done.stdout + done.stderr
        for night in ("2026-11-19", "2026-11-20", "2026-11-21"):
            code, output = commcamp_output("results", "ingest", out, "--site", "localslurm", "--system", "localslurm",
                                           "--partition", "debug", "--environ", mpi, "--campaign", "nightly",
                                           "--run-key", f"nightly/{mpi}@{night}", "--param", f"tag={night}", "--db", db,
                                           "--allow-duplicate")  # the same records as three nights
            assert code == 0, output
    # The same Open MPI run as if measured at a second site, and as a tuning trial with a knob set: neither
    # may be pooled with the nightly runs (timestamps moved so that each is a record set of its own).
    records = [json.loads(line) for line in (directory / "openmpi.jsonl").read_text().splitlines()]
    for name, env, args in (
            ("other-site", {}, ["--site", "local", "--system", "local", "--partition", "cpu", "--campaign", "smoke"]),
            ("trial", {"OMPI_MCA_btl_tcp_sndbuf": "4096"},
             ["--site", "localslurm", "--system", "localslurm", "--partition", "debug", "--campaign", "tune"])):
        moved = directory / f"{name}.jsonl"
        moved.write_text("".join(json.dumps({**r, "timestamp": r["timestamp"].replace("Z", "").rsplit(".", 1)[0]
                                             + f".{len(name):06d}Z", "env": {**r["env"], **env}}) + "\n"
                                 for r in records))
        code, output = commcamp_output("results", "ingest", moved, *args, "--environ", "openmpi",
                                       "--run-key", name, "--db", db)
        assert code == 0, output
    return db


VERDICT = {"campaign": "nightly", "site": "localslurm", "system": "localslurm", "tag": "2026-11-21",
           "status": "degraded", "exit_code": 1, "nodes": {"n1": {"status": "ok", "evidence": []},
                                                          "n3": {"status": "degraded", "evidence": ["pair n1+n3"]}},
           "metrics": [{"status": "degraded", "environ": "openmpi", "op": "pingpong", "num_nodes": 2,
                        "run_key": "nightly/openmpi@2026-11-21", "hosts": ["n1", "n3"],
                        "metric": "small_latency", "bytes": 8, "value": 12.5, "unit": "us",
                        "evidence": ["<script>not markup</script>"]}],
           "isolation": {"culprit_nodes": ["n3"], "culprit_links": [], "note": "",
                         "pairs": [{"nodes": ["n1", "n3"], "status": "degraded"}]}}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian package chromium, make system-deps)")
def test_report_renders_in_chromium(report_db: str, tmp_path: Path) -> None:
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps(VERDICT))
    report = tmp_path / "report.html"
    code, output = commcamp_output("report", "--db", report_db, "--site", "localslurm", "--output", report,
                                   "--verdict", verdict, "--nominal", "test link=5", "--title", "Report test")
    assert code == 0, output
    text = report.read_text()
    assert report.stat().st_size < MAX_REPORT_BYTES
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|https?://cdn", text)  # nothing from the network
    figures = text.count("class='figure'")
    for heading in ("Goodput vs message size", "GPU / rank pairs", "Per-iteration time distributions", "Nightly trends",
                    "Health summary"):
        assert f"<h2>{heading}</h2>" in text
    assert "&lt;script&gt;not markup" in text  # verdict text is escaped
    assert "Nominal link bandwidths dashed: test link 5 GB/s" in text

    dom = chromium("--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-3000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    drawn = re.search(r'data-plots="(\d+)"', dom.stdout)
    assert drawn is not None and int(drawn.group(1)) == figures >= 10, dom.stdout[:2000]
    assert dom.stdout.count('class="main-svg"') >= figures  # plotly drew SVG for each

    shot = tmp_path / "report.png"
    taken = chromium(f"--screenshot={shot}", "--window-size=1400,2400", report.as_uri())
    assert taken.returncode == 0 and shot.stat().st_size > 50_000, taken.stderr[-3000:]


def figures(text: str) -> list[dict[str, Any]]:
    return [json.loads(spec) for spec in re.findall(r"<script type='application/json' class='figure'>(.*?)</script>",
                                                     text)]


def test_report_groups_what_changes_the_number_and_says_what_each_curve_is(report_db: str, tmp_path: Path) -> None:
    """issue 11 item 8: no median pools two MPIs, two sites or tuning trials (left out unless asked); each
    legend names environment and library, each plot what its curves share; CPU pairs are ranks, not
    GPUs; MPICH's version text is one short label; trends on a log axis; placement and hosts in the
    health table."""
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps(VERDICT))
    report = tmp_path / "report.html"
    code, output = commcamp_output("report", "--db", report_db, "--output", report, "--verdict", verdict)
    assert code == 0, output
    text = report.read_text()
    (goodput,) = [f for f in figures(text) if f["layout"]["title"]["text"].startswith("pingpong: goodput")]
    names = sorted(trace["name"] for trace in goodput["data"] if trace.get("mode") == "lines+markers")
    # one curve per site x environment (the MPIs differ in ranks too); the tuning trial is left out
    assert names == ["local, local:cpu, openmpi, Open MPI v4.1.4, 4 ranks",
                     "localslurm, localslurm:debug, mpich, MPICH 4.0.2, 2 ranks",
                     "localslurm, localslurm:debug, openmpi, Open MPI v4.1.4, 4 ranks"], names
    assert "mpi; 1 node(s); placement any; per-op timing" in goodput["layout"]["title"]["text"]
    assert "1 tuning-trial runs (campaign tune) left out" in text and "4096" not in json.dumps(goodput)
    heatmaps = [f for f in figures(text) if f["data"] and f["data"][0]["type"] == "heatmap"]
    assert heatmaps and all(set(f["data"][0]["x"]) <= {f"rank {r}" for r in range(4)} for f in heatmaps)
    assert "GPU 0" not in text and "MPICH Version" not in text and "\\n\\t" not in text
    assert "<td>MPICH 4.0.2</td>" in text
    trends = [f for f in figures(text) if f["layout"]["xaxis"].get("title", {}).get("text") == "night"]
    assert trends and all(f["layout"]["yaxis"]["type"] == "log" for f in trends)
    assert "<th>placement</th><th>hosts</th>" in text and "<td>any</td><td>n1 n3</td>" in text

    code, output = commcamp_output("report", "--db", report_db, "--output", report, "--include-tuning",
                                   "--op", "pingpong")
    assert code == 0, output
    (goodput,) = [f for f in figures(report.read_text()) if f["layout"]["title"]["text"].startswith("pingpong")
                  and "goodput" in f["layout"]["title"]["text"]]
    trial = [t["name"] for t in goodput["data"] if "OMPI_MCA_btl_tcp_sndbuf=4096" in t.get("name", "")]
    assert len(trial) == 1 and "left out" not in report.read_text()


def test_report_bad_input(tmp_path: Path, report_db: str) -> None:
    code, output = commcamp_output("report", "--db", report_db, "--op", "nosuchop", "--output", tmp_path / "r.html")
    assert code == 2 and "--op: 'nosuchop' is not an op" in output and not (tmp_path / "r.html").exists()
    code, output = commcamp_output("report", "--db", report_db, "--op", "bcast", "--output", tmp_path / "r.html")
    assert code == 2 and "no measurements" in output and not (tmp_path / "r.html").exists()
    bad = tmp_path / "verdict.json"
    bad.write_text("{}")
    code, output = commcamp_output("report", "--db", report_db, "--output", tmp_path / "r.html", "--verdict", bad)
    assert code == 2 and "is not a commcamp health verdict" in output
    code, output = commcamp_output("report", "--db", report_db, "--output", tmp_path / "r.html", "--nominal", "x")
    assert code == 2 and "is not LABEL=GBPS" in output


def test_health_section_shows_a_slow_node_with_its_evidence_and_the_isolation_path() -> None:
    from campaigns.report.html import health_section

    slow = {"node": "c6n3", "series_key": "nightly/openmpi", "op": "sendrecv", "bytes": 65536, "value_us": 463.0,
            "peers_us": {"c6n1": 101.0, "c6n2": 111.0}, "history": {"nights": 2, "median": 22.5, "spread": 7.5},
            "peer_ratio": 4.36, "ratio_history": {"nights": 2, "mean": 0.92, "log_sd": 0.2, "t": 6.26, "p": 0.0504,
                                                  "change": 3.73},
            "evidence": ["its ranks' median time 463 us"]}
    verdict = {**VERDICT, "nodes": {"c6n3": {"status": "degraded", "reason": "slow", "evidence": ["fail-slow"]}},
               "slow_nodes": [slow],
               "isolation": {**VERDICT["isolation"], "path": "attribution", "extra_jobs": 1,
                             "attribution": "c6n3 grew x24.98"}}
    text = health_section([verdict], {})
    assert "degraded: slow" in text and "4.36x" in text and "median 22.5, spread 7.5 over 2 night(s)" in text
    assert "c6n1 101, c6n2 111" in text and "geometric mean 0.92, log sd 0.2 over 2 night(s); t 6.26, p 0.05" in text
    # A verdict written before the ratio's t-test kept the ratio's history as median and spread.
    older = {**slow, "ratio_history": {"nights": 2, "median": 0.98, "spread": 0.05}}
    assert "median 0.98, spread 0.05 over 2 night(s)" in health_section([{**verdict, "slow_nodes": [older]}], {})
    assert "confirmed by pair test(s), 1 extra job(s) (c6n3 grew x24.98)" in text
    plain = health_section([VERDICT], {})  # a verdict without slow nodes or a path: the pair-test path
    assert "degraded: slow" not in plain and "pair tests between the nodes involved" in plain


def test_a_campaign_report_shows_its_own_site_only(tmp_path: Path) -> None:
    """The characterize report of a campaign run with --site on two sites showed both sites' runs (it selected
    the campaign's name only) under the title of one."""
    from campaigns.model.spec import load_campaign
    from campaigns.report.html import write_campaign_report
    from campaigns.store import open_store
    from fixtures_store import commbench_record, run_info

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as store:
        for site, seed in (("local", 1), ("localslurm", 2)):
            store.ingest(run_info(f"tinychar/{site}/{site}/openmpi/commbench_run/allreduce/n1", campaign="tinychar",
                                  site=site, system=site, partition="cpu", environ="openmpi", num_nodes=1),
                         [commbench_record(seed=seed)])
    spec = tmp_path / "tinychar.yaml"
    spec.write_text("name: tinychar\nkind: characterize\nsite: local\nnode_counts: [1]\n"
                    "checks:\n  - check: commbench_run\n    ops: [allreduce]\n    max_bytes: 1024\n")
    report = tmp_path / "tinychar.html"
    with open_store(url) as store:
        write_campaign_report(store, load_campaign(spec), report)
    text = report.read_text()
    assert "tinychar on local:local" in text and "localslurm" not in text


def _values(array: Any) -> list[float]:
    """A figure's data array: a list, or plotly's typed array ({"dtype", "bdata": base64})."""
    if isinstance(array, dict):
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def _report_of(tmp_path: Path, records_by_run: dict[str, list[dict[str, Any]]]) -> str:
    """build_report of runs of one site, system and environment, each holding the given records."""
    from campaigns.report.html import build_report
    from campaigns.store import open_store
    from fixtures_store import run_info

    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        for key, records in records_by_run.items():
            store.ingest(run_info(key), records)
        return build_report(store, title="t", nominal=[], verdicts=[])


def test_other_benchmarks_records_are_never_pooled_with_commbench_s(tmp_path: Path) -> None:
    """nccl-tests or OSU records ingested from their output (`source.benchmark`) measure another way: the report
    pooled them with commbench's into one median curve when every other dimension agreed. A curve per
    benchmark now, its legend naming it."""
    from fixtures_store import commbench_record

    sizes = (1024, 65536)
    ours = [commbench_record(size=size, seed=size) for size in sizes]
    theirs = [commbench_record(size=size, seed=size + 1, goodput_gbs=100.0 + size,
                               source={"benchmark": "nccl-tests", "format": "nccl-tests"}) for size in sizes]
    text = _report_of(tmp_path, {"commbench": ours, "nccl-tests": theirs})
    (goodput,) = [f for f in figures(text) if f["layout"]["title"]["text"].startswith("allreduce: goodput")]
    curves = {trace["name"]: _values(trace["y"]) for trace in goodput["data"] if trace.get("mode") == "lines+markers"}
    assert sorted(curves) == ["commbench, gnu, Open MPI v4.1.4", "nccl-tests, gnu, Open MPI v4.1.4"], curves
    assert curves["nccl-tests, gnu, Open MPI v4.1.4"] == pytest.approx([100.0 + size for size in sizes])
    assert "runs of one benchmark, site" in text


def test_the_distributions_show_valid_measurements_only(tmp_path: Path) -> None:
    """The goodput plots used valid measurements only, the distribution section every one: an invalid run's
    samples (wrong data) widened the violins and the p95/p99 table."""
    from fixtures_store import commbench_record

    valid = [commbench_record(size=1024, seed=1)]
    wrong = [commbench_record(size=1024, seed=2, valid=False, wrong_elements=3, reason="validation",
                              samples_us=[1e6] * 8)]
    text = _report_of(tmp_path, {"valid": valid, "wrong": wrong})
    (violins,) = [f for f in figures(text) if "per-iteration times" in f["layout"]["title"]["text"]]
    assert max(max(_values(trace["y"])) for trace in violins["data"]) < 1e3
    assert "1e+06" not in text and "<td>8</td>" in text  # the valid run's 8 samples, not 16


def _curves(text: str, title_start: str) -> dict[str, list[float]]:
    (plot,) = [f for f in figures(text) if f["layout"]["title"]["text"].startswith(title_start)]
    return {trace["name"]: _values(trace["y"]) for trace in plot["data"] if trace.get("mode") == "lines+markers"}


SELECTION = {"mechanism": "mpi_t", "cvar": "coll_tuned_allreduce_algorithm", "value": 4, "available": True,
             "reason": None}


def test_pinned_and_pageable_and_each_selection_are_curves_of_their_own(tmp_path: Path) -> None:
    """h2d from pinned (52.47 GB/s) and pageable (7.88) host memory at 1 GiB plotted as one median (30.17), and a
    selection sweep's algorithms as one curve: host memory, direction and the selection are part of a curve's
    identity (goodput, distributions)."""
    from fixtures_store import commbench_record

    def copy(size: int, seed: int, **fields: Any) -> dict[str, Any]:
        return commbench_record(op="h2d", transport="memcpy", size=size, seed=seed, **fields)

    h2d = [copy(1 << 30, 1, host_memory="pinned", goodput_gbs=52.47),
           copy(1 << 30, 2, host_memory="pageable", goodput_gbs=7.88)]
    sweep = [commbench_record(size=size, seed=size + k, goodput_gbs=gbs,
                              selection={**SELECTION, "name": name, "value": k})
             for size in (1024, 65536) for k, (name, gbs) in enumerate((("own", 1.0), ("ring", 3.0)))]
    text = _report_of(tmp_path, {"h2d": h2d, "sweep": sweep})
    assert _curves(text, "h2d: goodput") == {"gnu, Open MPI v4.1.4, pageable host memory": pytest.approx([7.88]),
                                             "gnu, Open MPI v4.1.4, pinned host memory": pytest.approx([52.47])}
    assert _curves(text, "allreduce: goodput") == {
        "gnu, Open MPI v4.1.4, selection own": pytest.approx([1.0, 1.0]),
        "gnu, Open MPI v4.1.4, selection ring": pytest.approx([3.0, 3.0])}
    (violins,) = [f for f in figures(text) if f["layout"]["title"]["text"].startswith("allreduce: per-iteration")]
    assert sorted({t["name"].split(":")[0] for t in violins["data"]}) == [
        "gnu, Open MPI v4.1.4, selection own", "gnu, Open MPI v4.1.4, selection ring"]
    assert "host memory, direction and selection" in text


def test_backend_datatype_and_collective_library_version_are_curves_of_their_own(tmp_path: Path) -> None:
    """A review pooled, with the subtitle saying they agreed: OSU with host and with CUDA buffers (both stored as
    backend cpu), nccl-tests' half/float/double rows of -d all, NCCL 2.18.5 and 2.28.3 runs."""
    from fixtures_store import commbench_record

    def record(size: int, seed: int, gbs: float, **fields: Any) -> dict[str, Any]:
        return commbench_record(size=size, seed=seed, goodput_gbs=gbs, **fields)

    text = _report_of(tmp_path, {
        "host": [record(1024, 1, 1.0)], "cuda": [record(1024, 2, 3.0, backend="cuda")],
        "float": [record(1024, 3, 5.0, dtype="float")], "double": [record(1024, 4, 7.0, dtype="double")],
        "old": [record(1024, 5, 9.0, versions={"nccl": "2.18.5"})],
        "new": [record(1024, 6, 11.0, versions={"nccl": "2.28.3"})]})
    curves = _curves(text, "allreduce: goodput")
    assert sorted(value for values in curves.values() for value in values) == pytest.approx(
        [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]), curves
    assert any("cuda backend" in name for name in curves) and any("double" in name for name in curves)
    assert any("NCCL 2.28.3" in name for name in curves), curves


def _nights(store: Any, statuses: dict[str, tuple[str, str | None]], site: str = "site-a",
            partition: str = "cpu") -> None:
    """One tagged nightly allreduce run per night, the last night 10x slower."""
    from fixtures_store import commbench_record, run_info

    for k, (night, (status, reason)) in enumerate(statuses.items()):
        slower = 10.0 if k == len(statuses) - 1 else 1.0
        records = [commbench_record(size=size, timestamp=f"{night}T01:00:00Z", samples_us=[
            x * slower for x in commbench_record(size=size, seed=10 * k + size)["samples_us"]]) for size in (8, 65536)]
        store.ingest(run_info(f"nightly/{site}/{partition}/allreduce@{night}", campaign="nightly", site=site,
                              system="local", partition=partition, environ="openmpi", check_name="commbench_run",
                              parameters={"op": "allreduce", "tag": night}, status=status, reason=reason), records)


def _trend(text: str, metric: str) -> dict[str, Any]:
    (plot,) = [f for f in figures(text) if f"{metric} @" in f["layout"]["title"]["text"]]
    return plot


def test_the_trend_shows_the_nights_health_judges_with_the_one_predicate(tmp_path: Path) -> None:
    """The trend kept passed runs only, while health also judges a run that failed only ReFrame's performance
    check: the degraded night was the one left out. One predicate (campaigns.model.references.measured) for both;
    a run that failed otherwise (wrong data, a crash) is still left out."""
    from campaigns.model.references import measured
    from campaigns.report.html import build_report
    from campaigns.store import open_store

    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        _nights(store, {"2026-11-19": ("pass", None), "2026-11-20": ("fail", "sanity: wrong data"),
                        "2026-11-21": ("pass", None),
                        "2026-11-22": ("fail", "performance: reference(s) not met: small_latency=49.9 us")})
        runs = store.runs()
        text = build_report(store, title="t", nominal=[], verdicts=[])
    assert [measured(run) for run in runs] == [True, False, True, True]
    plot = _trend(text, "small_latency")
    assert plot["data"][0]["x"] == ["2026-11-19", "2026-11-21", "2026-11-22"]
    assert _values(plot["data"][0]["y"])[-1] > 10 * _values(plot["data"][0]["y"])[0] / 2
    assert "failed its performance check" in plot["layout"]["title"]["text"]


@pytest.fixture
def twopart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Site `twopart`: system local with partitions fast (NIC 400 GB/s, allreduce small_latency reference 500 us)
    and cpu (NIC 25 GB/s, reference 5 us), on COMMCAMP_SITE_PATH."""
    import yaml

    shipped = Path(__file__).resolve().parents[1] / "site_configs" / "local"
    site = yaml.safe_load((shipped / "site.yaml").read_text())
    (cpu,) = site["systems"][0]["partitions"]
    partitions = []
    for name, nic, latency in (("fast", 400, 500.0), ("cpu", 25, 5.0)):
        partition = json.loads(json.dumps(cpu))
        partition.update(name=name, links={"nic": {"gbs": nic, "source": "test"}})
        partition["commbench"]["references"] = [{"op": "allreduce", "metric": "small_latency", "bytes": 8,
                                                 "value": latency, "upper": 0.5, "note": f"{name} ref"}]
        partitions.append(partition)
    site.update(name="twopart")
    site["systems"][0]["partitions"] = partitions
    directory = tmp_path / "sites" / "twopart"
    directory.mkdir(parents=True)
    (directory / "site.yaml").write_text(yaml.safe_dump(site))
    shutil.copy(shipped / "reframe_config.py", directory / "reframe_config.py")
    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(tmp_path / "sites"))
    return "twopart"


def _band(plot: dict[str, Any]) -> tuple[float, float]:
    (band,) = [shape for shape in plot["layout"]["shapes"] if shape["type"] == "rect"]
    return band["y0"], band["y1"]


def test_the_trend_band_is_the_reference_of_the_runs_own_partition(tmp_path: Path, twopart: str) -> None:
    """Every partition's references were flattened into one list, and the first that matched op, metric and size
    was drawn: partition cpu (reference 5 us) got fast's band 250-750 around 500. Each run's own partition now;
    a characterize campaign's own references first (as health)."""
    from campaigns.model.spec import load_campaign
    from campaigns.report.html import build_report, write_campaign_report
    from campaigns.store import open_store

    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        _nights(store, {"2026-11-19": ("pass", None), "2026-11-20": ("pass", None)}, site=twopart)
        text = build_report(store, title="t", nominal=[], verdicts=[])
        low, high = _band(_trend(text, "small_latency"))
        assert high == pytest.approx(7.5) and low < 5, (low, high)  # cpu's 5 us + 50 %, not fast's 750

        spec = tmp_path / "nightly.yaml"
        spec.write_text("name: nightly\nkind: characterize\nsite: twopart\nnode_counts: [1]\n"
                        "references:\n  - {op: allreduce, metric: small_latency, bytes: 8, value: 40.0, upper: 0.25}\n"
                        "checks:\n  - check: commbench_run\n    ops: [allreduce]\n    max_bytes: 1024\n")
        report = tmp_path / "nightly.html"
        write_campaign_report(store, load_campaign(spec), report)
    low, high = _band(_trend(report.read_text(), "small_latency"))
    assert high == pytest.approx(50.0), (low, high)  # the campaign's own 40 us + 25 %


def test_nominal_links_are_those_of_the_partitions_plotted(tmp_path: Path, twopart: str) -> None:
    """The nominal lines were keyed by label only (the last partition's NIC won: cpu's 25 GB/s on a plot of
    partition fast, whose NIC is 400) and `report --partition` was not passed on. Each partition's own, on the
    plots with a curve from it."""
    from campaigns.report.html import build_report, site_nominal
    from campaigns.store import open_store

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as store:
        _nights(store, {"2026-11-19": ("pass", None)}, site=twopart, partition="fast")
        text = build_report(store, title="t", nominal=site_nominal(twopart), verdicts=[])
    (goodput,) = [f for f in figures(text) if f["layout"]["title"]["text"].startswith("allreduce: goodput")]
    assert [a["text"] for a in goodput["layout"]["annotations"]] == ["NIC nominal 400 GB/s"]
    assert "Nominal link bandwidths dashed: NIC 400 GB/s" in text and "25 GB/s" not in text

    report = tmp_path / "r.html"
    code, output = commcamp_output("report", "--db", url, "--site", twopart, "--partition", "fast", "--output", report)
    assert code == 0, output
    assert "Nominal link bandwidths dashed: NIC 400 GB/s<" in report.read_text()
    assert "25 GB/s" not in report.read_text()
    # without --site (a campaign's report, `--campaign nightly`): the sites of what is stored (it said "No nominal
    # link bandwidth known" although site.yaml had one)
    code, output = commcamp_output("report", "--db", url, "--campaign", "nightly", "--output", report)
    assert code == 0, output
    assert "Nominal link bandwidths dashed: NIC 400 GB/s<" in report.read_text()


def test_a_selection_without_a_valid_result_writes_no_report(tmp_path: Path) -> None:
    """Only invalid measurements selected: every plot shows valid ones only, so the report was empty, exit 0.
    Refused, exit 2, as filters that select nothing. The header names every filter given (--min-size 0 too)."""
    from campaigns.store import open_store
    from fixtures_store import commbench_record, run_info

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as store:
        store.ingest(run_info("wrong", status="fail"), [commbench_record(size=1024, valid=False, wrong_elements=3,
                                                                         reason="validation")])
        store.ingest(run_info("right", campaign="other"), [commbench_record(size=1024, seed=5)])
    report = tmp_path / "r.html"
    code, output = commcamp_output("report", "--db", url, "--campaign", "smoke", "--output", report)
    assert code == 2 and "1 measurements match the filters, none valid" in output, output
    assert not report.exists()
    code, output = commcamp_output("report", "--db", url, "--min-size", "0", "--output", report)
    assert code == 0, output
    assert "&quot;min_bytes&quot;: 0" in report.read_text()


def test_a_characterize_run_that_stored_nothing_says_so_without_a_traceback(tmp_path: Path) -> None:
    """A characterize campaign whose cases stored no measurement crashed writing its report (ValueError
    traceback, exit 1); it says no report was written and exits with its cases' outcome."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from campaigns.exit_codes import ExitCode
    from campaigns.kinds.table import KINDS, FinishedRun
    from campaigns.model.spec import load_campaign
    from campaigns.store import open_store

    spec = tmp_path / "tinychar.yaml"
    spec.write_text("name: tinychar\nkind: characterize\nsite: local\nnode_counts: [1]\n"
                    "checks:\n  - check: commbench_run\n    ops: [allreduce]\n    max_bytes: 1024\n")
    errors = io.StringIO()
    report = tmp_path / "tinychar.html"
    result: Any = SimpleNamespace(unstored=[], all_passed=False)  # what _write_report reads of a CampaignResult
    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        run = FinishedRun(campaign=load_campaign(spec), result=result, store=store, tag=None,
                          console=Console(file=io.StringIO()), errors=Console(file=errors, width=200),
                          runs_dir=tmp_path, placer=None, output=report)  # type: ignore[arg-type]
        assert KINDS["characterize"].after_run(run) is ExitCode.FAILED
    assert "no report written" in errors.getvalue() and "no measurements" in errors.getvalue()
    assert not report.exists()


def test_nominal_takes_any_positive_finite_number() -> None:
    """`--nominal x=1e-3` was refused by a pattern that took `1.2.3` (then a float() traceback)."""
    import typer

    from campaigns.cli.report import _parse_nominal

    parsed = _parse_nominal(["x=1e-3", " NVLink 4 x18 = 450 "])
    assert [(n.label, n.gbs) for n in parsed] == [("x", 0.001), ("NVLink 4 x18", 450.0)]
    for bad in ("x=1.2.3", "x=0", "x=-1", "x=inf", "x=nan", "=5", "x", "x="):
        with pytest.raises(typer.BadParameter, match="is not LABEL=GBPS"):
            _parse_nominal([bad])


def test_verdicts_are_checked_for_what_the_report_reads(tmp_path: Path) -> None:
    """_load_verdicts checked four keys: a verdict without `tag`, with nodes as a list or metrics of strings crashed
    the report later (KeyError, AttributeError, TypeError). Every field the report reads is checked (the file named);
    the verdicts health writes, fail-slow nodes and isolation included, are taken."""
    from campaigns.cli.report import _load_verdicts

    slow = {"node": "c6n3", "op": "sendrecv", "bytes": 65536, "value_us": 463.0, "peers_us": {"c6n1": 101.0},
            "history": {"nights": 2, "median": 22.5, "spread": 7.5}, "peer_ratio": 4.36,
            "ratio_history": {"nights": 2, "mean": 0.92, "log_sd": 0.2, "t": 6.26, "p": 0.05}, "evidence": []}
    good = [VERDICT, {**VERDICT, "slow_nodes": [slow, {**slow, "history": {}, "ratio_history": {}}],
                      "isolation": {**VERDICT["isolation"], "path": "attribution", "extra_jobs": 1}}]
    path = tmp_path / "v.json"
    for verdict in good:
        path.write_text(json.dumps(verdict))
        assert _load_verdicts([path]) == [verdict]
    for bad, message in (
            ({**VERDICT, "metrics": [{**VERDICT["metrics"][0], "value": "fast"}]}, "metrics.0.value: Input should be"),
            ({**VERDICT, "isolation": {**VERDICT["isolation"], "culprit_links": [["n1"]]}}, "culprit_links.0"),
            ({**VERDICT, "slow_nodes": [{**slow, "ratio_history": {"log_sd": 0.2}}]}, "slow_nodes.0.ratio_history"),
            ({**VERDICT, "status": "fine"}, "status: Input should be 'ok', 'not_judged', 'degraded' or 'failed'"),
            ({**VERDICT, "nodes": {"n1": {"status": "ok'><script>", "evidence": []}}}, "nodes.n1.status")):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=rf"--verdict {path} is not a commcamp health verdict: .*"
                                             rf"{re.escape(message)}"):
            _load_verdicts([path])
