"""`commcamp bench build|path`: commbench built from the sources shipped with commcamp (bench_src/).

The build is bench_src/Makefile's (`make -C bench_src BUILD_DIR=...`, what `make bench` runs in a checkout):
one CMake build directory per variant under the workspace's builds (campaigns.paths.commbench_build_dir),
never inside the sources, so an installed commcamp builds from a read-only install tree. The ReFrame
checks build their own copy in each stage directory; these builds serve `commcamp tune`/`pretune`'s
launcher executor and users who run commbench by hand.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns import paths
from campaigns.exit_codes import ExitCode

VARIANTS = ("cpu-openmpi", "cpu-mpich", "cuda", "hip")  # the targets of bench_src/Makefile
DEFAULT_VARIANTS = ("cpu-openmpi", "cpu-mpich")  # bench_src/Makefile's `all`

bench_app = typer.Typer(help="commbench (bench_src/, shipped with commcamp): build it, locate it.",
                        no_args_is_help=True)
VariantsArg = Annotated[Optional[list[str]], typer.Argument(
    metavar="[VARIANT]...", help=f"of {', '.join(VARIANTS)} [default: {' '.join(DEFAULT_VARIANTS)}]")]
BuildDirOpt = Annotated[Optional[Path], typer.Option(
    help="build root: VARIANT/commbench below it [default: <workspace builds>/bench]")]


def forget_other_sources_build(build_dir: Path, source: Path) -> None:
    """Remove a CMake build directory configured from another source tree, to configure it again from `source`: an
    earlier install at another prefix (Spack's hashed prefixes, /opt/commcamp/0.1 -> 0.2) sharing the workspace
    would otherwise be rebuilt from its own sources, or fail for good once they are gone."""
    try:
        cache = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return
    match = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache, re.MULTILINE)
    if match is not None and Path(match.group(1)).resolve() != source.resolve():
        shutil.rmtree(build_dir)


def binary(variant: str, build_dir: Path | None = None) -> Path:
    return (build_dir or paths.commbench_build_dir()) / variant / "commbench"


def _variants(names: list[str] | None) -> list[str]:
    unknown = [n for n in names or [] if n not in VARIANTS]
    if unknown:
        Console(stderr=True).print(f"[bold red]unknown variant(s) {', '.join(map(escape, unknown))}[/]; "
                                   f"known: {', '.join(VARIANTS)}")
        raise typer.Exit(ExitCode.USAGE)
    return list(names or DEFAULT_VARIANTS)


@bench_app.command()
def build(variants: VariantsArg = None, build_dir: BuildDirOpt = None,
          jobs: Annotated[int, typer.Option(min=1, help="parallel compile jobs")] = 2) -> None:
    """Build commbench (Release) from the shipped sources; print each binary's path."""
    names = _variants(variants)
    root = (build_dir or paths.commbench_build_dir()).resolve()
    missing = [tool for tool in ("make", "cmake") if shutil.which(tool) is None]
    if missing:
        Console(stderr=True).print(f"[bold red]not installed:[/] {', '.join(missing)} (Debian packages make, cmake)")
        raise typer.Exit(ExitCode.FAILED)
    for name in names:
        forget_other_sources_build(root / name, paths.BENCH_SRC)
    cmd = ["make", "--no-print-directory", "-C", str(paths.BENCH_SRC), f"BUILD_DIR={root}", f"JOBS={jobs}", *names]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        output = result.stdout[-3000:] + result.stderr[-3000:]
        # bench_src/Makefile's defaults are Debian's names; modules, Spack and RHEL call the wrapper mpicc
        hint = ("\nThe MPI compiler wrappers come from the environment: OPENMPI_CC (default mpicc.openmpi), MPICH_CC "
                "(mpicc.mpich), MPICC (mpicc, the GPU builds); e.g. OPENMPI_CC=mpicc commcamp bench build cpu-openmpi"
                if "Could NOT find MPI" in output else "")
        Console(stderr=True).print(f"[bold red]commbench build failed[/] ({escape(' '.join(cmd))}: exit "
                                   f"{result.returncode})\n{escape(output)}{escape(hint)}", highlight=False)
        raise typer.Exit(ExitCode.FAILED)
    for name in names:
        print(binary(name, root))


@bench_app.command("path")
def path(variant: Annotated[str, typer.Argument(help=f"of {', '.join(VARIANTS)}")] = "cpu-openmpi",
         build_dir: BuildDirOpt = None) -> None:
    """Print a built commbench's absolute path (exit 1 if it is not built: `commcamp bench build`)."""
    (name,) = _variants([variant])
    found = binary(name, build_dir)
    if not found.is_file():
        Console(stderr=True).print(f"[bold red]no commbench at {escape(str(found))}[/]: run `commcamp bench build "
                                   f"{name}`", highlight=False, soft_wrap=True)
        raise typer.Exit(ExitCode.FAILED)
    print(found.resolve())


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
