"""commbench's output under failure: a watchdog timeout during start-up, a JSON Lines file that cannot be
written (a full device, a full disk), standard output that cannot be written. Records must never be lost
silently: the run exits 4 naming the file, and the file never ends in half a line."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest

from fixtures_bench import MPIS, CommbenchBuild, launch_env, mpi_launch, read_records, run_commbench


@pytest.mark.parametrize("mpi", MPIS)
def test_timeout_during_start_up_exits_3(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path, mpi: str) -> None:
    """Opening a FIFO nobody reads blocks rank 0 before the record fields exist: the watchdog's timeout
    path dereferenced them (rank 0 died of SIGSEGV, exit 11) instead of ending the job with exit 3."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    done = run_commbench(commbench_builds[mpi], 2, ["--op", "allreduce", "--sizes", "8", "--timeout", "2",
                                                    "--output", str(fifo)], timeout=30)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "crashed with signal" not in done.stderr
    assert "TIMEOUT: no progress for 2 s during start-up" in done.stderr
    assert time.monotonic() - started < 12


def test_unwritable_output_fails_the_run(commbench_builds: dict[str, CommbenchBuild]) -> None:
    done = run_commbench(commbench_builds["openmpi"], 2, ["--op", "allreduce", "--sizes", "8,16", "--iters", "2",
                                                          "--output", "/dev/full"])
    assert done.returncode == 4, done.stdout + done.stderr
    # said at the first lost record and at the end, naming the file
    assert "writing --output /dev/full failed: No space left on device" in done.stderr
    assert "records are missing there" in done.stderr
    assert done.stdout.count("  allreduce") == 2  # the table still has every measurement


def can_mount_tmpfs() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("mount") is not None


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and unshare to mount a small tmpfs")
def test_full_disk_leaves_whole_records_only(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path
) -> None:
    """An 8 KiB tmpfs (in a private mount namespace) fills during the third record: the partial write
    is cut back, so the file holds whole, valid records and ends with a newline (it ended mid-line)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    output = disk / "out.jsonl"
    build = commbench_builds["mpich"]
    command = " ".join([*mpi_launch(build.mpi, 2), str(build.binary), "--op", "allreduce", "--sizes",
                        "8,16,32,64,128", "--iters", "1", "--warmup", "0", "--output", str(output)])
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=8k tmpfs {disk} && {command}; rc=$?; "
                                      f"cp {output} {tmp_path / 'kept.jsonl'}; exit $rc"],
        capture_output=True, text=True, timeout=60, env=launch_env(), check=False,
    )
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"writing --output {output} failed: No space left on device" in done.stderr
    kept = tmp_path / "kept.jsonl"
    text = kept.read_bytes()
    assert text.endswith(b"\n") and 0 < len(text) < 8192
    records = read_records(kept)
    assert 0 < len(records) < 5
    for record in records:
        record_validator.validate(record)
    assert done.stdout.count("  allreduce") == 5


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["--list"], ["--list-cvars", "MPIR_CVAR_BCAST"],
                                  ["--op", "allreduce", "--sizes", "8", "--iters", "1"]])
def test_unwritable_stdout_fails(commbench_builds: dict[str, CommbenchBuild], args: list[str]) -> None:
    """Output to stdout that does not arrive (here a one-process job without a launcher, so stdout is
    /dev/full itself) is an error, exit 4, said on stderr."""
    with open("/dev/full", "w", encoding="utf-8") as full:
        done = subprocess.run([str(commbench_builds["mpich"].binary), *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60, env=launch_env(), check=False)
    assert done.returncode == 4, done.stderr
    assert "standard output failed" in done.stderr
