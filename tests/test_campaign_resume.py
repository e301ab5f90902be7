"""Campaigns lose nothing: each test case is stored as soon as ReFrame reports it, an interrupted campaign
keeps what finished and the next run does only the rest; an unreachable database stops the campaign
before anything runs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from campaigns.store import open_store

COMMCAMP = Path(sys.executable).with_name("commcamp")

SPEC = """\
name: resume
site: local
environments: [openmpi]
node_counts: [1]
checks:
  - check: commbench_run
    ops: [pingpong, allreduce, alltoall]
    sizes: [8, 1024]
    warmup: 1
    iters: 4
    timeout_s: 30
"""


def test_interrupted_campaign_keeps_finished_cases_and_resumes(tmp_path: Path) -> None:
    spec = tmp_path / "resume.yaml"
    spec.write_text(SPEC)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    cmd = [str(COMMCAMP), "run", str(spec), "--db", db, "--runs-dir", str(tmp_path / "runs")]
    # Ctrl-C as at a terminal, also when this test runs as a background job (SIGINT then starts ignored,
    # and commcamp, like any program, keeps it so).
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "COLUMNS": "200"},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if " OK " in line and "commbench_run" in line:  # the first run test finished: interrupt now
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.stdout.read()
        code = proc.wait(timeout=120)
    output = "".join(seen) + rest
    assert code == 130, output
    assert "interrupted" in output
    with open_store(db) as store:
        stored = store.runs()
        frame = store.measurements()
    assert 1 <= len(stored) < 3, output  # what finished is there, the rest is not
    assert all(run.status == "pass" for run in stored), [(r.run_key, r.status, r.reason) for r in stored]
    assert len(frame) == 2 * len(stored)  # both sizes of every stored case: nothing half-written

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False,
                           env={**os.environ, "COLUMNS": "200"})
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"Running {3 - len(stored)} of 3 test case(s)" in again.stdout
    with open_store(db) as store:
        assert sorted(run.parameters["op"] for run in store.runs()) == ["allreduce", "alltoall", "pingpong"]


def test_unreachable_database_stops_before_running(tmp_path: Path) -> None:
    spec = tmp_path / "resume.yaml"
    spec.write_text(SPEC)
    started = time.monotonic()
    result = subprocess.run([str(COMMCAMP), "run", str(spec), "--db", "postgresql+psycopg://u@127.0.0.1:1/x",
                             "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 2
    assert "cannot use the results store" in result.stderr and "Connection refused" in result.stderr
    assert not (tmp_path / "runs").exists()
    assert time.monotonic() - started < 60


def _working_in(path: Path) -> list[str]:
    """Live processes (not zombies) whose working directory is under `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and os.readlink(entry / "cwd").startswith(str(path))
                    and (entry / "stat").read_text().split(")")[-1].split()[0] != "Z"):
                found.append(f"{entry.name}: {(entry / 'cmdline').read_text().replace(chr(0), ' ')}")
        except OSError:
            continue
    return found


def test_a_campaign_interrupted_while_it_builds_leaves_no_build_running(tmp_path: Path) -> None:
    """Ctrl-C while ReFrame built commbench: commcamp exited, and the builds ReFrame's local scheduler had started
    (sessions of their own) compiled on into the run directory."""
    spec = tmp_path / "resume.yaml"
    spec.write_text(SPEC)
    runs = tmp_path / "runs"
    cmd = [str(COMMCAMP), "run", str(spec), "--db", f"sqlite:///{tmp_path / 'results.db'}", "--runs-dir", str(runs)]
    # Ctrl-C at a terminal: SIGINT to the foreground process group, commcamp and ReFrame (a process group of its own
    # here, as a terminal's job has)
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
        deadline = time.monotonic() + 120
        while not any("cc1" in p for p in _working_in(runs)):  # compiling
            assert proc.poll() is None and time.monotonic() < deadline, "no build seen"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    assert _working_in(runs) == []
