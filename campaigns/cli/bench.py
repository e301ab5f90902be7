"""`commcamp bench build|path`: commbench built from the sources shipped with commcamp (bench_src/).

The build is bench_src/Makefile's (`make -C bench_src BUILD_DIR=...`, what `make bench` runs in a checkout):
one CMake build directory per variant under the workspace's builds (campaigns.paths.commbench_build_dir),
never inside the sources, so an installed commcamp builds from a read-only install tree. The ReFrame
checks build their own copy in each stage directory; these builds serve `commcamp tune`/`pretune`'s
launcher executor and users who run commbench by hand.

GPU architectures: `--cuda-archs` / `--hip-archs` (or $CUDA_ARCHS / $HIP_ARCHS), else with `--site` the
site's `commbench.cmake_options` of its partitions of that backend (-DCOMMBENCH_CUDA_ARCHS=..., and the
other -D options too), else the Makefile's defaults (90; gfx90a;gfx942). The Makefile configures a build
directory again whenever its configure command changes, so a rebuild with other architectures is one.
"""
from __future__ import annotations

import os
import re
import shlex
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
# GPU variant -> (its Makefile variable, the CMake cache variable it sets, the Makefile's default)
ARCHS = {"cuda": ("CUDA_ARCHS", "COMMBENCH_CUDA_ARCHS", "90"),
         "hip": ("HIP_ARCHS", "COMMBENCH_HIP_ARCHS", "gfx90a;gfx942")}
# What a compiler says of a GPU architecture it does not know (hipcc/clang, nvcc)
ARCH_REJECTED = re.compile(r"invalid target id|unsupported gpu architecture|unsupported cuda gpu architecture|"
                           r"invalid offload arch", re.IGNORECASE)

bench_app = typer.Typer(help="commbench (bench_src/, shipped with commcamp): build it, locate it.",
                        no_args_is_help=True)
VariantsArg = Annotated[Optional[list[str]], typer.Argument(
    metavar="[VARIANT]...", help=f"of {', '.join(VARIANTS)} [default: {' '.join(DEFAULT_VARIANTS)}]")]
BuildDirOpt = Annotated[Optional[Path], typer.Option(
    help="build root: VARIANT/commbench below it [default: <workspace builds>/bench]")]
CudaArchsOpt = Annotated[Optional[str], typer.Option(
    "--cuda-archs", envvar="CUDA_ARCHS", show_envvar=False,
    help="cuda: CUDA architectures, e.g. 80 or 80,90 ($CUDA_ARCHS) [default: the site's with --site, else 90]")]
HipArchsOpt = Annotated[Optional[str], typer.Option(
    "--hip-archs", envvar="HIP_ARCHS", show_envvar=False,
    help="hip: AMD GPU targets, e.g. gfx90a or gfx90a,gfx942 ($HIP_ARCHS) [default: the site's with --site, else "
         "gfx90a;gfx942]")]
SiteOpt = Annotated[Optional[str], typer.Option(
    help="build with this site's commbench cmake_options (GPU architectures, ...) of its partitions of each "
         "variant's backend")]


# The CMake projects commcamp ships (bench_src/CMakeLists.txt, bench_src/nccl_tuner/CMakeLists.txt) and the file
# bench_src/Makefile writes into each build directory it configured: what tells a build directory commcamp made.
COMMCAMP_PROJECTS = frozenset({"commbench", "commcamp_nccl_tuner"})
CONFIGURE_MARKER = "commbench-configure.cmd"


class ForeignBuildDir(Exception):
    """A build directory holding something commcamp did not make: never emptied."""


def _cache_entry(cache: str, name: str) -> str | None:
    match = re.search(rf"^{name}:[A-Z]+=(.*)$", cache, re.MULTILINE)
    return None if match is None else match.group(1).strip()


def check_build_dir(build_dir: Path, option: str = "--build-dir") -> None:
    """ForeignBuildDir naming `option` unless `build_dir` is new, empty or a build directory commcamp made (its CMake
    cache names one of commcamp's projects, or bench_src/Makefile's marker is in it): a directory commcamp would
    configure, and may empty (forget_other_sources_build, bench_src/Makefile on a changed configure command), must be
    its own, never a user's build of another project or their files."""
    if not os.path.lexists(build_dir):
        return
    if not build_dir.is_dir():
        raise ForeignBuildDir(f"{option} {build_dir}: not a directory")
    try:
        if next(build_dir.iterdir(), None) is None:
            return
        cache = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except FileNotFoundError:
        raise ForeignBuildDir(f"{option} {build_dir}: holds files but no CMake build commcamp made: commcamp builds "
                              "only in a new or empty directory or one of its own builds; choose another") from None
    except OSError as exc:
        raise ForeignBuildDir(f"{option} {build_dir}: cannot read it ({exc.strerror or exc})") from None
    project = _cache_entry(cache, "CMAKE_PROJECT_NAME")
    if project not in COMMCAMP_PROJECTS and not (build_dir / CONFIGURE_MARKER).is_file():
        home = _cache_entry(cache, "CMAKE_HOME_DIRECTORY")
        raise ForeignBuildDir(
            f"{option} {build_dir}: a CMake build of another project ({project or 'unnamed'}, sources "
            f"{home or 'unknown'}), not one commcamp made: commcamp empties only its own build directories; choose "
            "another (a new or empty one)")


def forget_other_sources_build(build_dir: Path, source: Path, option: str = "--build-dir") -> None:
    """Remove a CMake build directory configured from another source tree, to configure it again from `source`: an
    earlier install at another prefix (Spack's hashed prefixes, /opt/commcamp/0.1 -> 0.2) sharing the workspace
    would otherwise be rebuilt from its own sources, or fail for good once they are gone. Only a build directory
    commcamp made goes: anything else raises ForeignBuildDir (check_build_dir) and nothing is removed."""
    check_build_dir(build_dir, option)
    try:
        cache = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return  # new, or empty
    home = _cache_entry(cache, "CMAKE_HOME_DIRECTORY")
    if home is not None and Path(home).resolve() != source.resolve():
        for entry in build_dir.iterdir():  # its contents: a symlinked build directory stays where it points
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def binary(variant: str, build_dir: Path | None = None) -> Path:
    return (build_dir or paths.commbench_build_dir()) / variant / "commbench"


def _variants(names: list[str] | None) -> list[str]:
    unknown = [n for n in names or [] if n not in VARIANTS]
    if unknown:
        Console(stderr=True).print(f"[bold red]unknown variant(s) {', '.join(map(escape, unknown))}[/]; "
                                   f"known: {', '.join(VARIANTS)}")
        raise typer.Exit(ExitCode.USAGE)
    return list(names or DEFAULT_VARIANTS)


def _usage(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]{escape(message)}[/]", highlight=False, soft_wrap=True)
    return typer.Exit(ExitCode.USAGE)


def _archs(option: str, value: str) -> str:
    """`80,90` or `80;90` -> `80;90` (CMake list syntax); a value that is not a list of names is refused."""
    archs = [a for a in re.split(r"[,;\s]+", value) if a]
    if not archs or not all(re.fullmatch(r"[A-Za-z0-9_.:+-]+", a) for a in archs):
        raise _usage(f"{option} {value!r}: give architectures separated by commas, e.g. 80,90 or gfx90a,gfx942")
    return ";".join(archs)


def site_cmake_options(site_name: str, backend: str) -> list[str]:
    """The `commbench.cmake_options` of site `site_name`'s partitions of `backend` (one set: they must agree)."""
    from campaigns.model.site import SiteError, load_site

    try:
        site = load_site(site_name)
    except SiteError as exc:
        raise _usage(str(exc)) from None
    found = {tuple(p.commbench.cmake_options): f"{s.name}:{p.name}" for s in site.systems for p in s.partitions
             if p.commbench and p.commbench.backend == backend}
    if not found:
        raise _usage(f"site {site_name!r} has no partition with commbench backend {backend}: leave --site out, "
                     "or build its backend's variant")
    if len(found) > 1:
        raise _usage(f"site {site_name!r}: its {backend} partitions build with different cmake_options "
                     f"({'; '.join(f'{where}: {list(opts)}' for opts, where in found.items())}): give --cuda-archs "
                     "/ --hip-archs (and CMAKE_ARGS) instead of --site")
    return list(next(iter(found)))


def make_variables(name: str, archs: str | None, site_name: str | None) -> list[str]:
    """bench_src/Makefile's variables for variant `name`: its GPU architectures (an option, else the site's
    -DCOMMBENCH_*_ARCHS) and CMAKE_ARGS ($CMAKE_ARGS, then the site's other cmake_options)."""
    cmake_args = [os.environ["CMAKE_ARGS"]] if os.environ.get("CMAKE_ARGS") else []
    if site_name is not None:
        backend = "cpu" if name.startswith("cpu-") else name
        for option in site_cmake_options(site_name, backend):
            match = re.fullmatch(r"-D(COMMBENCH_(?:CUDA|HIP)_ARCHS)(?::[A-Z]+)?=(.*)", option)
            if match is not None and name in ARCHS and match.group(1) == ARCHS[name][1]:
                archs = archs or _archs(f"site {site_name}'s {match.group(1)}", match.group(2))
            elif match is None:
                cmake_args.append(shlex.quote(option))
    variables = [f"{ARCHS[name][0]}={archs}"] if archs and name in ARCHS else []
    return variables + ([f"CMAKE_ARGS={' '.join(cmake_args)}"] if cmake_args else [])


@bench_app.command()
def build(variants: VariantsArg = None, build_dir: BuildDirOpt = None,
          jobs: Annotated[int, typer.Option(min=1, help="parallel compile jobs")] = 2,
          cuda_archs: CudaArchsOpt = None, hip_archs: HipArchsOpt = None, site: SiteOpt = None) -> None:
    """Build commbench (Release) from the shipped sources; print each binary's path. A build directory is
    configured again when its architectures or CMake arguments change."""
    names = _variants(variants)
    given = {"cuda": cuda_archs and _archs("--cuda-archs", cuda_archs),
             "hip": hip_archs and _archs("--hip-archs", hip_archs)}
    # an environment variable may be set for other builds; an option names a variant it applies to
    for variant, option in (("cuda", "--cuda-archs"), ("hip", "--hip-archs")):
        value = cuda_archs if variant == "cuda" else hip_archs
        if value and variant not in names and value != os.environ.get(ARCHS[variant][0]):
            raise _usage(f"{option} applies to the {variant} variant: commcamp bench build {variant} {option} {value}")
    root = (build_dir or paths.commbench_build_dir()).resolve()
    if root.exists() and not root.is_dir():
        raise _usage(f"--build-dir {root}: not a directory")
    missing = [tool for tool in ("make", "cmake") if shutil.which(tool) is None]
    if missing:
        Console(stderr=True).print(f"[bold red]not installed:[/] {', '.join(missing)} (Debian packages make, cmake)")
        raise typer.Exit(ExitCode.FAILED)
    plan = [(name, make_variables(name, given.get(name), site)) for name in names]
    try:
        for name, _ in plan:  # every variant's directory before any build: a foreign one stops the command here
            check_build_dir(root / name, "--build-dir" if build_dir is not None else "the build directory")
        for name, _ in plan:
            forget_other_sources_build(root / name, paths.BENCH_SRC)
    except ForeignBuildDir as exc:
        raise _usage(str(exc)) from None
    for name, variables in plan:
        cmd = ["make", "--no-print-directory", "-C", str(paths.BENCH_SRC), f"BUILD_DIR={root}", f"JOBS={jobs}",
               *variables, name]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        if result.returncode != 0:
            output = result.stdout[-3000:] + result.stderr[-3000:]
            hint = ""
            # bench_src/Makefile's defaults are Debian's names; modules, Spack and RHEL call the wrapper mpicc
            if "Could NOT find MPI" in output:
                hint = ("\nThe MPI compiler wrappers come from the environment: OPENMPI_CC (default mpicc.openmpi), "
                        "MPICH_CC (mpicc.mpich), MPICC (mpicc, the GPU builds); e.g. OPENMPI_CC=mpicc commcamp bench "
                        "build cpu-openmpi")
            elif name in ARCHS and ARCH_REJECTED.search(output):
                option, default = f"--{name}-archs", ARCHS[name][2]
                hint = (f"\nThis compiler rejects one of the GPU architectures: choose them with {option} (or "
                        f"${ARCHS[name][0]}; default {default}) or take the site's with --site SITE, e.g. "
                        + ("commcamp bench build hip --hip-archs gfx90a (Debian 12's hipcc 5.2 rejects gfx942)"
                           if name == "hip" else "commcamp bench build cuda --cuda-archs 80"))
            Console(stderr=True).print(f"[bold red]commbench build failed[/] ({escape(shlex.join(cmd))}: exit "
                                       f"{result.returncode})\n{escape(output)}{escape(hint)}", highlight=False,
                                       soft_wrap=True)
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
