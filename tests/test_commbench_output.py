"""commbench's output under failure: a watchdog timeout during start-up, a JSON Lines file that cannot be
written (a full device, a full disk), standard output that cannot be written. Records must never be lost
silently: the run exits 4 naming the file, and the file never ends in half a line."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
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
    # said once, at the first lost record, naming the file and why (it was said again at the end)
    assert done.stderr.count("writing --output /dev/full failed") == 1, done.stderr
    assert "writing --output /dev/full failed: No space left on device; no further records" in done.stderr
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


STDOUT_CASES = [["--help"], ["--version"], ["--list"], ["--list-cvars", "MPIR_CVAR_BCAST"],
                ["--op", "allreduce", "--sizes", "8,16", "--iters", "1"]]


@pytest.mark.parametrize("args", STDOUT_CASES)
def test_unwritable_stdout_fails(commbench_builds: dict[str, CommbenchBuild], args: list[str]) -> None:
    """Output to stdout that does not arrive (here a one-process job without a launcher, so stdout is
    /dev/full itself) is an error, exit 4, said once on stderr with the reason (the table's per-record
    flushes were not looked at: the last flush succeeded and the reason was lost)."""
    with open("/dev/full", "w", encoding="utf-8") as full:
        done = subprocess.run([str(commbench_builds["mpich"].binary), *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60, env=launch_env(), check=False)
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("standard output failed: No space left on device") == 1, done.stderr


@pytest.mark.parametrize("mpi", MPIS)
@pytest.mark.parametrize("args", [*STDOUT_CASES[:3], ["--list-cvars"], STDOUT_CASES[4]])
def test_stdout_pipe_without_reader_exits_4(commbench_builds: dict[str, CommbenchBuild], args: list[str],
                                            mpi: str) -> None:
    """`commbench --list | head -c0`: a pipe whose reader is gone (closed before the start here, so the
    first write fails for sure). SIGPIPE killed the process (signal 13, shell status 141); now the write
    fails with EPIPE: exit 4, said on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([str(commbench_builds[mpi].binary), *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=60, env=launch_env(), check=False)
    finally:
        os.close(write_end)
    assert done.returncode == 4, (done.returncode, done.stderr)
    assert "standard output failed: Broken pipe" in done.stderr


@pytest.mark.parametrize("mpi", MPIS)
def test_output_fifo_reader_gone_exits_4(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path,
                                         mpi: str) -> None:
    """--output a FIFO whose reader leaves after 100 bytes: the records (100 sizes, well over a pipe's
    64 KiB) cannot all go. Rank 0 died of SIGPIPE (mpirun: "exited on signal 13", exit 141); now the
    run ends with exit 4 naming the file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def read_a_little() -> None:
        with open(fifo, "rb") as reader:
            reader.read(100)

    reader = threading.Thread(target=read_a_little, daemon=True)
    reader.start()
    sizes = ",".join(str(4 * k) for k in range(1, 101))
    done = run_commbench(commbench_builds[mpi], 2, ["--op", "allreduce", "--sizes", sizes, "--iters", "1",
                                                    "--warmup", "0", "--timeout", "30", "--output", str(fifo)],
                         timeout=90)
    reader.join(timeout=10)
    assert done.returncode == 4, (done.returncode, done.stderr[-2000:])
    assert done.stderr.count(f"writing --output {fifo} failed: Broken pipe") == 1, done.stderr[-2000:]
    assert "signal 13" not in done.stderr and "Broken pipe)" not in done.stderr
    assert done.stdout.count("  allreduce") == 100  # the table still has every measurement
