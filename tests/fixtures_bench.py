"""commbench fixtures: build the cpu backend (Open MPI and MPICH) and run it under real launchers."""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH_SRC = REPO / "bench_src"
BENCH_BUILD = REPO / "build" / "bench"
RECORD_SCHEMA = BENCH_SRC / "schema" / "commbench-record.schema.json"
MPIS = ("openmpi", "mpich")


@dataclass(frozen=True)
class CommbenchBuild:
    """Paths of one cpu build of commbench."""

    mpi: str
    binary: Path
    unit: Path


def mpi_launch(mpi: str, nranks: int) -> list[str]:
    """Launcher prefix for `nranks` processes on this machine."""
    if mpi == "openmpi":
        return ["mpirun.openmpi", "--oversubscribe", "-np", str(nranks)]
    if mpi == "mpich":
        return ["mpiexec.mpich", "-n", str(nranks)]
    raise ValueError(f"unknown MPI {mpi!r}")


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for mpirun as root (tests run as root here), plus extra variables."""
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    env.update(extra or {})
    return env


def run_commbench(
    build: CommbenchBuild,
    nranks: int,
    args: list[str],
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs commbench under the build's own launcher and returns the finished process."""
    return subprocess.run(
        [*mpi_launch(build.mpi, nranks), str(build.binary), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=launch_env(env),
        check=False,
    )


def read_records(path: Path) -> list[dict[str, Any]]:
    """JSON Lines records of one output file (strict UTF-8, one object per line)."""
    text = path.read_bytes().decode("utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="session")
def record_validator() -> jsonschema.Draft202012Validator:
    """Validator for commbench records, with date-time format checking."""
    schema = json.loads(RECORD_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


@pytest.fixture(scope="session")
def commbench_builds() -> dict[str, CommbenchBuild]:
    """Builds (incrementally) both cpu backends via bench_src/Makefile; keyed by MPI name."""
    done = subprocess.run(
        ["make", "-C", str(BENCH_SRC), f"BUILD_DIR={BENCH_BUILD}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"building commbench failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    builds = {}
    for mpi in MPIS:
        directory = BENCH_BUILD / f"cpu-{mpi}"
        builds[mpi] = CommbenchBuild(mpi=mpi, binary=directory / "commbench", unit=directory / "commbench_unit")
    return builds
