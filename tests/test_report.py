"""`commcamp report` end to end: real commbench records (cpu backend, Open MPI and MPICH) ingested into a
store, an HTML report written, and the report loaded in a real headless Chromium: every plot drawn, no
console message at all, nothing fetched from the network, a screenshot taken."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

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
    return db


VERDICT = {"campaign": "nightly", "site": "localslurm", "system": "localslurm", "tag": "2026-11-21",
           "status": "degraded", "exit_code": 1, "nodes": {"n1": {"status": "ok", "evidence": []},
                                                          "n3": {"status": "degraded", "evidence": ["pair n1+n3"]}},
           "metrics": [{"status": "degraded", "environ": "openmpi", "op": "pingpong", "num_nodes": 2,
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
    for heading in ("Goodput vs message size", "GPU pairs", "Per-iteration time distributions", "Nightly trends",
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


def test_report_bad_input(tmp_path: Path, report_db: str) -> None:
    code, output = commcamp_output("report", "--db", report_db, "--op", "nosuchop", "--output", tmp_path / "r.html")
    assert code == 1 and "no measurements" in output and not (tmp_path / "r.html").exists()
    bad = tmp_path / "verdict.json"
    bad.write_text("{}")
    code, output = commcamp_output("report", "--db", report_db, "--output", tmp_path / "r.html", "--verdict", bad)
    assert code == 1 and "is not a commcamp health verdict" in output
    code, output = commcamp_output("report", "--db", report_db, "--output", tmp_path / "r.html", "--nominal", "x")
    assert code == 2 and "is not LABEL=GBPS" in output
