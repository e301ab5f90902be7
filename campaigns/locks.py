"""Advisory locks (flock) that say what a commcamp process is doing with a workspace while it does it.

- `campaign_lock`: one `commcamp run` of a campaign on a site's system per runs directory. Two at once ran every
  case twice, each beside the other (on one machine: latencies 10^4 x apart), and stored both.
- `in_use` / `keep_in_use` / `is_in_use`: a run directory being written (`results prune` keeps it: it deleted a
  running campaign's directory, and every case then failed with its files gone); `keep_in_use` for one a process
  writes into until it ends (a tune's ReFrame directory whose build later trials restore, its deployed rules).

flock is released when the process ends, however it ends: a lock file left by a killed process locks nothing.
It holds between processes of one host; on a network file system it holds across hosts only where the mount
passes flock on (NFS without `local_lock=flock`, Lustre with `-o flock`). A file system that refuses flock
(ENOLCK, ENOSYS) or a lock file this user cannot open: the run goes on unlocked, said by `warn`.
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

IN_USE = ".in-use"  # in a run directory, locked while a process writes it


class Busy(RuntimeError):
    """What the lock is for is being done by another process (the message names it and the lock file)."""


def _stamp(handle: TextIO) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "since": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")}))
    handle.flush()


def _holder(handle: TextIO) -> str:
    try:
        handle.seek(0)
        held = json.loads(handle.read() or "{}")
        return f"pid {held['pid']} since {held['since']}"
    except (ValueError, KeyError, OSError):
        return "a process"


@contextmanager
def campaign_lock(runs_dir: Path, name: str, warn: Callable[[str], None]) -> Iterator[None]:
    """Held while campaign `name` (campaign@site@system) runs with run directories under `runs_dir`; Busy when
    another process holds it."""
    path = runs_dir / f".{name}.lock"
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")
    except OSError as exc:
        warn(f"not locked: cannot open {path} ({exc.strerror or exc}): another run of {name} would not be seen")
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _stamp(handle)
        except BlockingIOError:
            raise Busy(f"{name} is running in another commcamp ({_holder(handle)}; lock {path}): two runs of it "
                       "would run and store every case twice, each measuring beside the other; wait for it") from None
        except OSError as exc:  # a file system without flock
            warn(f"not locked: {path}: {exc.strerror or exc}: another run of {name} would not be seen")
        yield


def _mark(directory: Path) -> TextIO:
    handle = open(directory / IN_USE, "w", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _stamp(handle)
    except OSError:  # no flock here: prune dates the directory by its newest file alone
        pass
    return handle


@contextmanager
def in_use(directory: Path) -> Iterator[None]:
    """Marks `directory` (made already) as being written while the block runs (is_in_use); unmarked where the file
    system refuses flock."""
    with _mark(directory):
        yield


_KEPT: list[TextIO] = []  # the lock files keep_in_use holds: open until this process ends


def keep_in_use(directory: Path) -> None:
    """Marks `directory` (made already) as being written until this process ends, however it ends."""
    _KEPT.append(_mark(directory))


def is_in_use(directory: Path) -> str | None:
    """Who is writing `directory` ("pid N since T"), or None when no process is (or none can be seen)."""
    try:
        handle = open(directory / IN_USE, encoding="utf-8")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(handle)
        except OSError:
            return None
        return None
