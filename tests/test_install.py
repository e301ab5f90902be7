"""commcamp installed from a wheel, as a site deploys it: a fresh venv outside the checkout, the install tree and
the checkout read-only (a read-only bind mount in a private mount namespace, which binds root too), an empty
working directory, a site kept in a directory of its own ($COMMCAMP_SITE_PATH) and a workspace
($COMMCAMP_HOME). Scaffolding, listing and checking a site, building commbench from the shipped sources and
running the smoke campaign must work and write nothing but the workspace (and the site directory that
`site new` is asked to write to).

The venv reuses the test venv's dependencies through a .pth line (not its editable commcamp: .pth files in a
directory added that way are not processed), so only commcamp itself comes from the wheel.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What the wheel is built from (campaigns/_data links to the folders beside it).
SOURCES = ("pyproject.toml", "README.md", "campaigns", "tuners", "bench_src", "reframe_checks", "site_configs",
           "spack_env")

pytestmark = [pytest.mark.slow,  # a wheel, a commbench build, the smoke campaign: 200 s on 2 loaded cores
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                 reason="read-only bind mounts need root and unshare")]


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def _readonly(paths: list[Path], argv: list[str]) -> list[str]:
    """argv run in a private mount namespace where `paths` are read-only."""
    mounts = " && ".join(f"mount --bind {q} {q} && mount -o remount,bind,ro {q}"
                         for q in map(shlex.quote, map(str, paths)))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh", *argv]


def test_wheel_install_runs_and_writes_only_to_the_workspace(tmp_path: Path) -> None:
    timings: dict[str, float] = {}

    def timed(step: str, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        start = time.monotonic()
        result = subprocess.run(argv, capture_output=True, text=True, check=False,  # type: ignore[call-overload]
                                **kwargs)
        timings[step] = round(time.monotonic() - start, 1)
        assert result.returncode == 0, \
            f"{step}: exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result

    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "spack.lock",
                                                          ".spack-env"))
        else:
            shutil.copy2(REPO / name, source / name)
    timed("pip wheel", [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "wheels"),
                        str(source)])
    (wheel,) = (tmp_path / "wheels").glob("commcamp-*.whl")

    venv = tmp_path / "venv"
    timed("venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)])
    timed("pip install", [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--no-deps", str(wheel)])
    purelib = Path(subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "test-venv-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    reframe = venv / "bin" / "reframe"  # what installing reframe-hpc into the venv would have put there
    reframe.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom reframe.frontend.cli import main\n"
                       "sys.exit(main())\n")
    reframe.chmod(0o755)

    workspace, sites, home, cwd = (tmp_path / d for d in ("workspace", "sites", "home", "cwd"))
    for directory in (sites, home, cwd):
        directory.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("COMMCAMP_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(COMMCAMP_HOME=str(workspace), COMMCAMP_SITE_PATH=str(sites), HOME=str(home), COLUMNS="200",
               PATH=os.pathsep.join([str(venv / "bin"), *(p for p in env["PATH"].split(os.pathsep)
                                                         if not p.startswith(str(REPO)))]))

    def commcamp(step: str, *args: str) -> str:
        argv = _readonly([venv, REPO], [str(venv / "bin" / "commcamp"), *args])
        return timed(step, argv, env=env, cwd=cwd, timeout=300).stdout

    shipped = purelib / "campaigns" / "_data"
    assert all((shipped / d).is_dir() and not (shipped / d).is_symlink() for d in SOURCES[4:]), "not in the wheel"
    assert commcamp("site new", "site", "new", "mysite", "--from", "local").strip() == str(sites / "mysite")
    listing = commcamp("site list", "site", "list")
    assert "mysite" in listing and "generic-slurm" in listing  # the search path, then the shipped examples
    assert commcamp("site check", "site", "check", "mysite").strip() == "site mysite: ok"
    built = Path(commcamp("bench build", "bench", "build", "cpu-openmpi").strip())
    assert built == workspace / "build" / "bench" / "cpu-openmpi" / "commbench" and os.access(built, os.X_OK)
    output = commcamp("run smoke", "run", str(purelib / "campaigns" / "smoke.yaml"), "--site", "mysite")
    assert f"Results: sqlite:///{workspace}/commcamp.db" in output

    assert _files(cwd) == [] and _files(home) == []
    assert _files(sites) == ["mysite", "mysite/env.sh", "mysite/reframe_config.py", "mysite/site.yaml"]
    written = _files(workspace)
    assert "commcamp.db" in written and any(p.startswith("runs/smoke-") for p in written)
    print("timings (s):", timings)
