"""campaigns/schedules/nightly-health.sh, what cron, scrontab and the systemd timer start: its run tag (the
night), its lock against an overlapping start, the workspace (commcamp's own, from `commcamp paths --env`), its log
and the commcamp of an installation it belongs to; the shipped schedule examples. `COMMCAMP` stands in for
commcamp: these are the wrapper's own rules, not a campaign's (tests/test_health_localslurm.py runs health
campaigns for real, tests/test_install.py the wrapper of an installed commcamp)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

REPO = Path(__file__).resolve().parents[1]
SCHEDULES = REPO / "campaigns" / "schedules"
WRAPPER = SCHEDULES / "nightly-health.sh"
SPEC = "campaigns/health-localslurm.yaml"


def _stand_in(tmp_path: Path, seconds: float, name: str = "commcamp", status: int = 4) -> Path:
    """A `commcamp` that records the arguments and workspace of its runs and takes `seconds`; `paths --env` says
    the workspace like commcamp does ($COMMCAMP_HOME, else its default: here tmp_path/default-workspace)."""
    script = tmp_path / name
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"""#!/bin/sh
if [ "$1" = paths ] && [ "$2" = --env ]; then
    echo "export COMMCAMP_DATA={REPO} COMMCAMP_HOME=${{COMMCAMP_HOME:-{tmp_path / 'default-workspace'}}}"; exit 0
fi
echo "$@" >> {tmp_path / 'calls'}
echo "$COMMCAMP_HOME" >> {tmp_path / 'homes'}
echo "the one-screen summary"
sleep {seconds}
exit {status}
""")
    script.chmod(0o755)
    return script


def _lock(workspace: Path, spec: Path) -> Path:
    """The wrapper's lock of `spec` (realpath, one per spec file) in `workspace`."""
    digest = hashlib.sha256(f"{spec}\n".encode()).hexdigest()[:16]  # realpath -m SPEC | sha256sum
    return workspace / "health" / f".nightly-{digest}.lock"


def test_the_night_is_the_date_of_the_clock_the_schedule_fires_in(tmp_path: Path) -> None:
    """cron and scrontab fire at local time: 02:30 in Helsinki is 23:30 UTC the day before in summer and 00:30
    UTC in winter, so the UTC date gave two starts across the DST change one night (the second re-judged the
    first) and skipped one. The tag is the local date; the systemd unit sets TZ=UTC for its UTC timer."""
    # UTC+14 and UTC-11: at any hour one of them is on another date than UTC
    zones = ("Pacific/Kiritimati", "Pacific/Pago_Pago")
    for zone in zones:
        env = {**os.environ, "COMMCAMP": str(_stand_in(tmp_path, 0)), "TZ": zone,
               "COMMCAMP_HOME": str(tmp_path / "ws")}
        done = subprocess.run([str(WRAPPER), "campaigns/health-localslurm.yaml"], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 4, done.stdout + done.stderr  # commcamp's exit status, passed on
    nights = [datetime.now(ZoneInfo(zone)).date().isoformat() for zone in zones]  # the same minute: same dates
    assert (tmp_path / "calls").read_text().splitlines() == [f"run campaigns/health-localslurm.yaml --tag {night}"
                                                             for night in nights]
    assert "Environment=TZ=UTC" in (REPO / "campaigns" / "schedules" / "commcamp-health.service").read_text()


def test_a_start_while_the_last_night_still_runs_exits_1_and_runs_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "COMMCAMP": str(_stand_in(tmp_path, 5)), "COMMCAMP_HOME": str(tmp_path / "ws")}
    first = subprocess.Popen([str(WRAPPER), "campaigns/health-localslurm.yaml"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "calls").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run([str(WRAPPER), "campaigns/health-localslurm.yaml"], env=env, capture_output=True,
                                text=True, timeout=60, check=False)
        assert second.returncode == 1 and "is still running" in second.stderr, second.stdout + second.stderr
        assert len((tmp_path / "calls").read_text().splitlines()) == 1
        # another spec (another site's health.yaml) has a lock of its own
        other = tmp_path / "other" / "health-localslurm.yaml"
        other.parent.mkdir()
        other.write_text("")
        third = subprocess.run([str(WRAPPER), str(other)], env=env, capture_output=True, text=True, timeout=60,
                               check=False)
        assert third.returncode == 4, third.stdout + third.stderr
    finally:
        first.communicate(timeout=60)
    assert first.returncode == 4


def test_the_workspace_is_commcamps_own_not_the_install_tree(tmp_path: Path) -> None:
    """Without COMMCAMP_HOME the wrapper's lock (and log) go to the workspace `commcamp paths --env` names, where
    commcamp writes the verdict, and the run gets that workspace: before, the wrapper used <its directory>/../../
    results, which for an installed commcamp is inside site-packages (read-only, and not where the verdict goes)."""
    env = {k: v for k, v in os.environ.items() if k != "COMMCAMP_HOME"}
    env["COMMCAMP"] = str(_stand_in(tmp_path, 0))
    done = subprocess.run([str(WRAPPER), SPEC], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 4, done.stdout + done.stderr
    workspace = tmp_path / "default-workspace"
    assert _lock(workspace, REPO / SPEC).is_file()
    assert (tmp_path / "homes").read_text().split() == [str(workspace)]


def test_an_installed_wrapper_runs_the_commcamp_of_its_installation_and_logs_to_the_workspace(tmp_path: Path) -> None:
    """The wrapper as an installed commcamp ships it (<prefix>/lib/python3.X/site-packages/campaigns/schedules/) run
    as cron runs it: no commcamp on PATH, no COMMCAMP; it runs <prefix>/bin/commcamp. With COMMCAMP_HEALTH_LOG
    (relative: in <workspace>/health/, which does not exist yet on a fresh deployment; a cron line redirecting there
    failed before the wrapper ran) everything goes to the log, and a night that is not healthy says one line on
    stderr, which cron mails."""
    prefix = tmp_path / "opt-commcamp"
    schedules = prefix / "lib" / "python3.11" / "site-packages" / "campaigns" / "schedules"
    schedules.mkdir(parents=True)
    shutil.copy2(WRAPPER, schedules / WRAPPER.name)
    _stand_in(tmp_path, 0, name="opt-commcamp/bin/commcamp")
    workspace = tmp_path / "var-lib-commcamp"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COMMCAMP_HOME": str(workspace),
           "COMMCAMP_HEALTH_LOG": "cron.log"}
    done = subprocess.run([str(schedules / WRAPPER.name), SPEC], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stdout == ""
    log = workspace / "health" / "cron.log"
    assert done.stderr.startswith(f"commcamp nightly health: {SPEC}, night ") and f"exit 4 (degraded); log {log}" in \
        done.stderr, done.stderr
    assert "the one-screen summary" in log.read_text() and "exit 4 (degraded)" in log.read_text()
    assert (tmp_path / "calls").read_text().startswith(f"run {SPEC} --tag ")
    assert _lock(workspace, schedules.parents[1] / SPEC).is_file()


def test_schedule_examples_redirect_into_no_directory_that_may_not_exist() -> None:
    """cron opens a `>>DIR/file` redirection before the wrapper runs, and Slurm opens `--output=DIR/file` before the
    job starts: on a fresh deployment DIR (the workspace's health/) does not exist and the night never ran. The
    examples log through the wrapper (COMMCAMP_HEALTH_LOG), which makes the directory; systemd needs no
    WorkingDirectory (the wrapper changes to the directory it resolves specs in)."""
    cron = (SCHEDULES / "commcamp-health.cron").read_text()
    scrontab = (SCHEDULES / "health.scrontab").read_text()
    service = (SCHEDULES / "commcamp-health.service").read_text()
    for text in (cron, scrontab, service):
        commands = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert not any(">" in line for line in commands), commands
        assert "site-packages/campaigns/schedules/nightly-health.sh" in text  # where an installed commcamp has it
    assert "--output" not in "".join(line for line in scrontab.splitlines() if line.startswith("#SCRON"))
    assert "COMMCAMP_HEALTH_LOG=cron.log" in cron and "COMMCAMP_HEALTH_LOG=scron.log" in scrontab
    assert "WorkingDirectory" not in service and "Environment=COMMCAMP_HOME=" in service
