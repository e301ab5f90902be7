"""Child processes that do not outlive commcamp.

A commcamp killed with SIGKILL (OOM killer, `kill -9`, a lost login session) cannot clean up: its ReFrame
or srun child would run on, submitting and running jobs whose results nobody stores, beside the resumed
campaign. `die_with_this_process()` gives a Popen preexec_fn that asks Linux to send the child SIGTERM
when its parent dies; ReFrame and srun answer SIGTERM by cancelling their jobs.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

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
