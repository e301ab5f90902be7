"""campaigns/schedules/nightly-health.sh, what cron, scrontab and the systemd timer start: its run tag (the
night) and its lock against an overlapping start. `COMMCAMP` stands in for commcamp: these are the wrapper's
own rules, not a campaign's (tests/test_health_localslurm.py runs health campaigns for real)."""
from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

REPO = Path(__file__).resolve().parents[1]
WRAPPER = REPO / "campaigns" / "schedules" / "nightly-health.sh"


def _stand_in(tmp_path: Path, seconds: float) -> Path:
    """A `commcamp` that records its arguments and takes `seconds`."""
    script = tmp_path / "commcamp"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\nsleep {seconds}\nexit 4\n")
    script.chmod(0o755)
    return script


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
