"""Where commcamp's shipped files are, and where it writes: the one module that computes locations.

Shipped (read-only): commbench's and the tuner plugin's sources (bench_src/), the ReFrame checks
(reframe_checks/), the example site configurations and the knob catalog (site_configs/), the Spack repo
and environments (spack_env/), the record schema (bench_src/schema/). They live at the top of the
repository; `campaigns/_data/` holds one symlink to each, so the same relative paths work in a checkout
(the links resolve to the folders themselves) and in a wheel (setuptools follows the links when it
builds one, so the installed package holds real copies under campaigns/_data/).

Written (the workspace, which the site owns): the results database, run directories, health verdicts,
recommendations, reports and commbench/plugin builds. `$COMMCAMP_HOME` (also set by `commcamp
--workspace DIR`) names it; without it, a checkout writes to its own results/ (and builds to build/), as
`make demo` and the tests always did, and an installed commcamp to `$XDG_DATA_HOME/commcamp`
(~/.local/share/commcamp): never into the install tree.

Sites are found on a search path: the directories in `$COMMCAMP_SITE_PATH` (colon-separated, first
match wins), then the shipped examples, so a site keeps its site.yaml in its own repository.

Importing this module has no side effects and needs only the standard library (the tuner library and
the ReFrame checks' environment variable use it too).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_SHIPPED = PACKAGE_DIR / "_data"

BENCH_SRC = (_SHIPPED / "bench_src").resolve()
PLUGIN_SRC = BENCH_SRC / "nccl_tuner"
RECORD_SCHEMA = BENCH_SRC / "schema" / "commbench-record.schema.json"
VOCABULARY = BENCH_SRC / "schema" / "vocabulary.json"  # commbench's ops, transports, metrics
CHECKS_DIR = (_SHIPPED / "reframe_checks").resolve()
SITE_CONFIGS_DIR = (_SHIPPED / "site_configs").resolve()  # the shipped example sites (and reframe_site.py)
KNOBS_DIR = SITE_CONFIGS_DIR / "knobs"
KNOB_CATALOG = KNOBS_DIR / "catalog.yaml"
SPACK_ENV_DIR = (_SHIPPED / "spack_env").resolve()
MIGRATIONS_DIR = PACKAGE_DIR / "migrations"
# The root the shipped folders hang off: the checkout, or campaigns/_data of an installed package.
DATA_ROOT = BENCH_SRC.parent
# The git checkout commcamp runs from, or None for an installed package.
CHECKOUT: Path | None = DATA_ROOT if DATA_ROOT == PACKAGE_DIR.parent else None

HOME_ENV = "COMMCAMP_HOME"
SITE_PATH_ENV = "COMMCAMP_SITE_PATH"
# Set by commcamp for the ReFrame it starts: the checks and reframe_site.py find the shipped folders
# under it (a site's own ReFrame without commcamp falls back to the checkout layout).
DATA_ENV = "COMMCAMP_DATA"


def workspace() -> Path:
    """Where commcamp writes (see the module docstring); not created here."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser().resolve()
    if CHECKOUT is not None:
        return CHECKOUT / "results"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share").expanduser() / "commcamp"


def runs_dir() -> Path:
    return workspace() / "runs"


def health_dir() -> Path:
    return workspace() / "health"


def reports_dir() -> Path:
    return workspace() / "reports"


def recommendations_dir() -> Path:
    return workspace() / "recommendations"


def database_path() -> Path:
    return workspace() / "commcamp.db"


def build_dir() -> Path:
    """Where `commcamp bench build` and `commcamp plugin build` build: the checkout's build/ (what `make
    bench` builds) unless a workspace is named, else the workspace's build/."""
    if CHECKOUT is not None and not os.environ.get(HOME_ENV):
        return CHECKOUT / "build"
    return workspace() / "build"


def commbench_build_dir() -> Path:
    """`commcamp bench build`'s (and `make bench`'s) build root: <variant>/commbench below it."""
    return build_dir() / "bench"


def plugin_build_dir() -> Path:
    """`commcamp plugin build`'s CMake build directory (PLUGIN_LIBRARY in it)."""
    return build_dir() / "nccl_tuner-release"


PLUGIN_LIBRARY = "libnccl-tuner-commcamp.so"  # what bench_src/nccl_tuner's CMake project builds


def site_path_dirs() -> list[Path]:
    """The directories of $COMMCAMP_SITE_PATH, in order (searched before the shipped examples)."""
    return [Path(p).expanduser() for p in os.environ.get(SITE_PATH_ENV, "").split(os.pathsep) if p]


def reframe_executable() -> Path:
    """The `reframe` of this Python environment (pip installs it beside the interpreter), else the one on
    PATH (Spack installs ReFrame as a package of its own)."""
    beside = Path(sys.executable).with_name("reframe")
    found = shutil.which("reframe")
    return beside if beside.is_file() or found is None else Path(found)


def probe_writable(directory: Path) -> None:
    """Raise OSError unless files can be created in `directory` or, where it does not exist yet, in the
    nearest directory above it (where it would be made); creates nothing that stays."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    tempfile.TemporaryFile(dir=existing).close()


def subprocess_env() -> dict[str, str]:
    """What a ReFrame started by commcamp needs to find the shipped folders and the workspace."""
    return {DATA_ENV: str(DATA_ROOT), HOME_ENV: str(workspace())}
