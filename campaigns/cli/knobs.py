"""`commcamp knobs check --library openmpi|mpich`: the knob catalog against the installed MPI.

Runs the library's commbench build (by default the workspace's, where `commcamp bench build` puts it) with
`--list-cvars` (one process: the MPI_T control variables with names, types and enum values;
bench_src/src/mpit.c) in an environment without the library's control variables (OMPI_MCA_*; MPIR_CVAR_*,
MPICH_*, MPIR_PARAM_*: a component selection or a sourced .env file would hide variables or show the
caller's value as the library's unset one) and without Open MPI's parameter files
(OMPI_MCA_mca_base_param_files=/dev/null: ~/.openmpi/mca-params.conf and the system's openmpi-mca-params.conf
would do the same; an admin's override file, which cannot be turned off, is named on stderr), reads the library
version from the same binary (`--version`:
the linked MPI's MPI_Get_library_version, not ompi_info's or mpichversion's on PATH, which can belong to
another MPI), and reports catalog knobs that are missing, stale or whose domain differs (tuners.knob_check).
Exit codes: 0 consistent, 1 problems found, 2 commbench could not be run or printed something else (another
MPI's control variables or version: a commbench linked against the other MPI).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns.cli import bench
from campaigns.exit_codes import ExitCode

LIBRARIES = ("openmpi", "mpich")  # the MPIs commbench is built against (bench variant cpu-LIBRARY)
TIMEOUT_S = 120


def _output(cmd: list[str], what: str, env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{what}: {exc.strerror or exc}" if isinstance(exc, OSError) else f"{what}: {exc}") from None
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return done.stdout


def linked_library_version(binary: Path, library: str, env: dict[str, str]) -> str:
    """The version of the MPI `binary` links, from its `--version` (the `mpi_library` line)."""
    from campaigns.model.records import mpi_library_version  # numpy, jsonschema: loaded when the command runs

    text = _output([str(binary), "--version"], f"{binary} --version", env)
    line = next((line.removeprefix("mpi_library ") for line in text.splitlines()
                 if line.startswith("mpi_library ")), None)
    if line is None:
        raise RuntimeError(f"{binary} --version names no MPI library (a commbench older than this commcamp: "
                           f"rebuild it, or give --library-version): {text.strip()[:200]}")
    version = mpi_library_version(line, library)
    if version is None:
        raise RuntimeError(f"{binary} links {line.strip()[:120]}, not {library}: build it against {library} "
                           f"(commcamp bench build cpu-{library}) or give --commbench")
    return version


def check(
    library: Annotated[str, typer.Option(help="the MPI whose control variables are listed: openmpi or mpich")],
    commbench: Annotated[Optional[Path], typer.Option(help="commbench built against that MPI "
                                                      "\\[default: <workspace builds>/bench/cpu-LIBRARY/commbench, "
                                                      "as `commcamp bench path`]")] = None,
    library_version_: Annotated[Optional[str], typer.Option("--library-version", help="instead of the version "
                                                            "of the MPI commbench links")] = None,
    catalog_path: Annotated[Optional[Path], typer.Option("--catalog", help="knob catalog file")] = None,
    notes: Annotated[bool, typer.Option(help="also print notes (values not searched, the library's unset values)")]
    = False,
) -> None:
    """Compare the knob catalog with the installed MPI's MPI_T control variables."""
    from tuners.catalog import CatalogError, KnobCatalog  # pydantic: loaded when the command runs
    from tuners.knob_check import CvarListError, check_catalog, format_report, library_environment, parse_cvars

    errors = Console(stderr=True)
    if library not in LIBRARIES:
        errors.print(f"--library must be openmpi or mpich, not {escape(library)}")
        raise typer.Exit(ExitCode.USAGE)
    binary = commbench or bench.binary(f"cpu-{library}")  # where `commcamp bench build` and tune put it
    if not binary.is_file():
        errors.print(f"[bold red]no commbench at {escape(str(binary))}: build it (commcamp bench build cpu-{library}) "
                     "or give --commbench[/]", soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE)
    try:
        catalog = KnobCatalog.load(catalog_path) if catalog_path else KnobCatalog.load()
        environment = library_environment(library, os.environ)
        version = library_version_ or linked_library_version(binary, library, environment)
        listing = _output([str(binary), "--list-cvars"], f"{binary} --list-cvars", environment)
        source = f"{binary} --list-cvars"
        cvars = parse_cvars(listing.splitlines(), source)
        report = check_catalog(catalog, library, version, cvars, source)
    except (RuntimeError, CvarListError, CatalogError, ValueError) as exc:
        errors.print(f"[bold red]{escape(str(exc))}[/]", soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE) from None
    override = cvars.get("mca_base_override_param_file")
    if override is not None and isinstance(override.value, str) and Path(override.value).is_file():
        errors.print(f"note: Open MPI's override file {escape(override.value)} exists: what it sets shows as the "
                     "library's unset value (mca_base_override_param_file cannot be turned off)", soft_wrap=True)
    out = Console(soft_wrap=True, highlight=False)
    for line in format_report(report, notes=notes):
        out.print(escape(line))
    if report.failures:
        raise typer.Exit(ExitCode.FAILED)


def register(app: typer.Typer) -> None:
    """Add the `knobs` command group to the commcamp CLI."""
    knobs = typer.Typer(help="The knob catalog: check it against an installed library.", no_args_is_help=True)
    knobs.command("check")(check)
    app.add_typer(knobs, name="knobs")
