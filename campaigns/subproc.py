"""Child processes that do not outlive commcamp.

A commcamp killed with SIGKILL (OOM killer, `kill -9`, a lost login session) cannot clean up: its ReFrame
or srun child would run on, submitting and running jobs whose results nobody stores, beside the resumed
campaign. `die_with_this_process()` gives a Popen preexec_fn that asks Linux to send the child SIGTERM
when its parent dies; ReFrame and srun answer SIGTERM by cancelling their jobs. ReFrame stopped so does not stop
a build its local scheduler started (a session of its own): `stop_processes_in` ends what still works in its
prefix.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_this_process() -> Callable[[], None] | None:
    """preexec_fn for Popen: the child gets SIGTERM when the calling thread's process dies (Linux only;
    None elsewhere). Call it in the thread that starts the child: Linux ties the signal to that thread."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def preexec() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will send the signal
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def stop_processes_in(directory: Path, grace_s: float = 2.0) -> list[int]:
    """SIGTERM, then after `grace_s` SIGKILL, to every process of this user whose working directory is under
    `directory` (Linux /proc): what a stopped ReFrame left running there (its local build jobs compiled on for
    seconds after commcamp had exited). The pids signalled."""
    inside = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cwd = os.readlink(entry / "cwd") if entry.name.isdigit() and int(entry.name) != os.getpid() else ""
        except OSError:  # gone meanwhile, another user's, or a zombie
            continue
        if cwd == inside or cwd.startswith(inside + "/"):
            found.append(int(entry.name))
    _signal(found, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = found
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    _signal(alive, signal.SIGKILL)
    return found


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # gone meanwhile
            continue


def _running(pid: int) -> bool:
    """Alive and not a zombie (dead, waiting for its parent to read its status)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
