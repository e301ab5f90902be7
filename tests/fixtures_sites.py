"""Sites written for a test (a shipped site's site.yaml, edited) and stand-ins for the reference benchmarks
(nccl-tests and OSU cannot be installed here): scripts that print a committed real output on rank 0."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SITE_CONFIGS = REPO / "site_configs"
DATA = REPO / "tests" / "data"
NCCL_TESTS_OUTPUT = DATA / "nt-outputs" / "all_reduce_perf.txt"  # nccl-tests 2.19.6, one H100, 1 rank
OSU_LATENCY_OUTPUT = DATA / "osu" / "osu_latency.txt"  # OSU 7.0, 2 ranks


def write_site(directory: Path, data: dict[str, Any]) -> Path:
    """site.yaml from `data` in `directory` and a reframe_config.py that loads it; returns the latter."""
    directory.mkdir(parents=True)
    (directory / "site.yaml").write_text(yaml.safe_dump(data))
    (directory / "reframe_config.py").write_text(
        f"import sys\nsys.path.insert(0, {str(SITE_CONFIGS)!r})\n"
        "from reframe_site import site_configuration_for\nsite_configuration = site_configuration_for(__file__)\n")
    return directory / "reframe_config.py"


def site_data(source: str, edit: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """A shipped site's site.yaml as data, edited by `edit(data)`."""
    data = yaml.safe_load((SITE_CONFIGS / source / "site.yaml").read_text())
    if edit:
        edit(data)
    return data


def stand_in(directory: Path, binary: str, output: Path) -> Path:
    """An executable `binary` in `directory` that prints `output` on rank 0 (read when it runs) and exits 0."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / binary
    path.write_text(f'#!/bin/sh\n[ "${{OMPI_COMM_WORLD_RANK:-0}}" = 0 ] && cat {output}\nexit 0\n')
    path.chmod(0o755)
    return path


def reference_site(parent: Path, name: str, source: str, reference_benchmarks: dict[str, Any]) -> Path:
    """Site `name`: the shipped site `source` whose partitions offer `reference_benchmarks` (site.yaml's
    block), in parent/name; put `parent` on COMMCAMP_SITE_PATH to use it."""
    def edit(data: dict[str, Any]) -> None:
        data["name"] = name
        for system in data["systems"]:
            for partition in system["partitions"]:
                partition["reference_benchmarks"] = reference_benchmarks

    write_site(parent / name, site_data(source, edit))
    return parent
