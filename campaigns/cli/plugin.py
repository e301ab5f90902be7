"""`commcamp plugin path|build|install`: the NCCL/RCCL tuner plugin of bench_src/nccl_tuner (shipped with commcamp).

The plugin (libnccl-tuner-commcamp.so) is what NCCL_TUNER_PLUGIN in a published recommendation points
at when the recommendation has per-size rules (nccl_tuner.conf, NCCL_TUNER_CONFIG_FILE). It is built
by the plugin's own CMake project (also a subdirectory of bench_src's), needs only a C compiler, and
`install` copies it to PREFIX/lib through CMake's install rule.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from campaigns import paths
from campaigns.cli.bench import ForeignBuildDir, forget_other_sources_build
from campaigns.exit_codes import ExitCode

PLUGIN_FILE = paths.PLUGIN_LIBRARY
TARGET = "nccl-tuner-commcamp"

plugin_app = typer.Typer(help="The NCCL tuner plugin (bench_src/nccl_tuner): locate, build, install.",
                         no_args_is_help=True)
BuildDirOpt = Annotated[Optional[Path], typer.Option(
    help="CMake build directory of the plugin [default: <workspace builds>/nccl_tuner-release]")]


def build_plugin(build_dir: Path) -> Path:
    """Configure (once) and build the plugin target; the .so's path. RuntimeError with CMake's output;
    ForeignBuildDir for a build directory commcamp did not make (campaigns.cli.bench.check_build_dir)."""
    if shutil.which("cmake") is None:
        raise RuntimeError("cmake is not installed (Debian package cmake)")
    forget_other_sources_build(build_dir, paths.PLUGIN_SRC)
    steps = [["cmake", "-S", str(paths.PLUGIN_SRC), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
              "-DCOMMCAMP_TUNER_TESTS=OFF"],
             ["cmake", "--build", str(build_dir), "--target", TARGET, "-j", "2"]]
    for cmd in steps:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-3000:]}"
                               f"{result.stderr[-3000:]}")
    return build_dir / PLUGIN_FILE


@plugin_app.command("path")
def path(build_dir: BuildDirOpt = None) -> None:
    """Print the built plugin's absolute path (exit 1 if it is not built: `commcamp plugin build`)."""
    plugin = (build_dir or paths.plugin_build_dir()) / PLUGIN_FILE
    if not plugin.is_file():
        Console(stderr=True).print(f"[bold red]no plugin at {escape(str(plugin))}[/]: run `commcamp plugin build`"
                                   f"{'' if build_dir is None else f' --build-dir {build_dir}'}",
                                   highlight=False, soft_wrap=True)
        raise typer.Exit(ExitCode.FAILED)
    print(plugin.resolve())


def _usage(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]{escape(message)}[/]", highlight=False, soft_wrap=True)
    return typer.Exit(ExitCode.USAGE)


@plugin_app.command()
def build(build_dir: BuildDirOpt = None) -> None:
    """Build the plugin (Release, no tests) from the shipped sources and print its path."""
    try:
        plugin = build_plugin(build_dir or paths.plugin_build_dir())
    except ForeignBuildDir as exc:
        raise _usage(str(exc)) from None
    except RuntimeError as exc:
        Console(stderr=True).print(f"[bold red]plugin build failed[/]\n{escape(str(exc))}", highlight=False)
        raise typer.Exit(ExitCode.FAILED) from None
    print(plugin.resolve())


@plugin_app.command()
def install(
    prefix: Annotated[Path, typer.Option(help="install prefix: the plugin goes to PREFIX/lib")],
    build_dir: BuildDirOpt = None,
) -> None:
    """Build (if needed) and install the plugin under PREFIX/lib; print the installed path, the value
    for NCCL_TUNER_PLUGIN."""
    errors = Console(stderr=True)
    build_dir = build_dir or paths.plugin_build_dir()
    prefix = prefix.resolve()
    # before the build: PREFIX and PREFIX/lib must be (or become) directories this process can write
    for directory in (prefix, prefix / "lib"):
        if directory.exists() and not directory.is_dir():
            raise _usage(f"--prefix {prefix}: {directory} is not a directory")
    try:
        paths.probe_writable(prefix / "lib")
    except OSError as exc:
        raise _usage(f"--prefix {prefix}: cannot create files there ({exc.strerror or exc})") from None
    try:
        build_plugin(build_dir)
    except ForeignBuildDir as exc:
        raise _usage(str(exc)) from None
    except RuntimeError as exc:
        errors.print(f"[bold red]plugin build failed[/]\n{escape(str(exc))}", highlight=False)
        raise typer.Exit(ExitCode.FAILED) from None
    result = subprocess.run(["cmake", "--install", str(build_dir), "--prefix", str(prefix)], capture_output=True,
                            text=True, timeout=120, check=False)
    installed = prefix / "lib" / PLUGIN_FILE
    if result.returncode != 0 or not installed.is_file():
        errors.print(f"[bold red]install into {escape(str(prefix))} failed[/] (exit {result.returncode})\n"
                     f"{escape(result.stdout + result.stderr)}", highlight=False)
        raise typer.Exit(ExitCode.FAILED)
    print(installed)


def register(app: typer.Typer) -> None:
    app.add_typer(plugin_app, name="plugin")
