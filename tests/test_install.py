"""commcamp installed from a wheel, as a site deploys it: a fresh venv outside the checkout, the install tree and
the checkout read-only (a read-only bind mount in a private mount namespace, which binds root too), an empty
working directory, a site kept in a directory of its own ($COMMCAMP_SITE_PATH) and a workspace
($COMMCAMP_HOME). Scaffolding, listing and checking a site, building commbench from the shipped sources and
running the smoke campaign must work and write nothing but the workspace (and the site directory that
`site new` is asked to write to). A small tune (the launcher executor, mpirun on this machine, commbench from
the workspace's build) publishes into the workspace and `recommend` reads it back; the nightly health campaign
runs on the local Slurm cluster from the same install. The wheel carries the license; the shipped env.sh and the
nightly health wrapper of the install use the workspace, never the install tree.

The venv reuses the test venv's dependencies through a .pth line (not its editable commcamp: .pth files in a
directory added that way are not processed), so only commcamp itself comes from the wheel.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from fixtures_slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
# What the wheel is built from (campaigns/_data links to the folders beside it).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "campaigns", "tuners", "bench_src", "reframe_checks",
           "site_configs", "spack_env")
SHIPPED = SOURCES[5:]  # the folders campaigns/_data links to

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


class Installed:
    """commcamp from a wheel in a fresh venv, run with the install tree and the checkout read-only."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.timings: dict[str, float] = {}
        source = tmp_path / "source"
        source.mkdir()
        for name in SOURCES:
            if (REPO / name).is_dir():
                shutil.copytree(REPO / name, source / name, symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "spack.lock",
                                                              ".spack-env"))
            else:
                shutil.copy2(REPO / name, source / name)
        self.timed("pip wheel", [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                                 str(tmp_path / "wheels"), str(source)])
        (wheel,) = (tmp_path / "wheels").glob("commcamp-*.whl")
        self.wheel = wheel
        self.venv = venv = tmp_path / "venv"
        self.timed("venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)])
        self.timed("pip install", [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                                   "-q", "--no-deps", str(wheel)])
        self.purelib = Path(subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True).stdout.strip())
        (self.purelib / "test-venv-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
        reframe = venv / "bin" / "reframe"  # what installing reframe-hpc into the venv would have put there
        reframe.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom reframe.frontend.cli import main\n"
                           "sys.exit(main())\n")
        reframe.chmod(0o755)
        self.workspace, self.sites, self.home, self.cwd = (tmp_path / d for d in ("workspace", "sites", "home", "cwd"))
        for directory in (self.sites, self.home, self.cwd):
            directory.mkdir()

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if not k.startswith("COMMCAMP_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env.update(COMMCAMP_HOME=str(self.workspace), COMMCAMP_SITE_PATH=str(self.sites), HOME=str(self.home),
                   COLUMNS="200", PATH=os.pathsep.join([str(self.venv / "bin"), *(
                       p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(REPO)))]))
        return env

    def timed(self, step: str, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        start = time.monotonic()
        result = subprocess.run(argv, capture_output=True, text=True, check=False,  # type: ignore[call-overload]
                                **kwargs)
        self.timings[step] = round(time.monotonic() - start, 1)
        assert result.returncode == 0, \
            f"{step}: exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result

    def commcamp(self, step: str, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> str:
        argv = _readonly([self.venv, REPO], [str(self.venv / "bin" / "commcamp"), *args])
        return self.timed(step, argv, env=self.env(env or dict(os.environ)), cwd=self.cwd, timeout=timeout).stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return Installed(tmp_path_factory.mktemp("install"))


def test_wheel_install_runs_and_writes_only_to_the_workspace(installed: Installed) -> None:
    commcamp, workspace, sites = installed.commcamp, installed.workspace, installed.sites
    shipped = installed.purelib / "campaigns" / "_data"
    assert all((shipped / d).is_dir() and not (shipped / d).is_symlink() for d in SHIPPED), "not in the wheel"
    # The tuner's data files (MPICH's selection tree, which every MPICH per-size rule file is made from).
    data = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tuners" / "data").iterdir())
    assert data and all((installed.purelib / name).is_file() for name in data), "tuners/data not in the wheel"
    assert commcamp("site new", "site", "new", "mysite", "--from", "local").strip() == str(sites / "mysite")
    listing = commcamp("site list", "site", "list")
    assert "mysite" in listing and "generic-slurm" in listing  # the search path, then the shipped examples
    assert commcamp("site check", "site", "check", "mysite").strip() == "site mysite: ok"
    built = Path(commcamp("bench build", "bench", "build", "cpu-openmpi").strip())
    assert built == workspace / "build" / "bench" / "cpu-openmpi" / "commbench" and os.access(built, os.X_OK)
    output = commcamp("run smoke", "run", str(installed.purelib / "campaigns" / "smoke.yaml"), "--site", "mysite")
    assert f"Results: sqlite:///{workspace}/commcamp.db" in output

    # A small tune of the site kept outside the install: its study, records and recommendations go to the
    # workspace; recommend finds them there.
    spec = installed.tmp_path / "tune.yaml"
    spec.write_text(yaml.safe_dump({
        "site": "mysite", "system": "local:cpu", "library": "openmpi", "op": "allreduce", "nodes": 1,
        "tasks_per_node": 2, "sizes": ["64K"], "sizes_per_bucket": 1, "iters": 5, "warmup": 1,
        "knobs": ["OMPI_MCA_btl_tcp_sndbuf"], "trials": 2, "executor": "launcher",
        "launcher": ["mpirun.openmpi", "-np", "2", "--bind-to", "none"], "commbench": str(built),
        "finalize": {"candidates": 1, "rounds": 2}}))
    mpi_env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl": "self,tcp"}
    tuned = commcamp("tune", "tune", str(spec), env=mpi_env, timeout=600)
    assert "trials: 2 counted" in tuned and "decision: " in tuned, tuned
    published = next(workspace.rglob("recommendations.yaml"))
    recommended = commcamp("recommend", "recommend", "--site", "mysite", "--system", "local:cpu", "--op", "allreduce",
                           "--nodes", "1")
    assert "mysite" in recommended and "nodes" in recommended, recommended
    assert yaml.safe_load(published.read_text())["recommendations"]

    assert _files(installed.cwd) == [] and _files(installed.home) == []
    assert _files(sites) == ["mysite", "mysite/env.sh", "mysite/reframe_config.py", "mysite/site.yaml"]
    written = _files(workspace)
    assert "commcamp.db" in written and any(p.startswith("runs/smoke-") for p in written)
    print("timings (s):", installed.timings)


def test_the_wheel_carries_the_license(installed: Installed) -> None:
    """pyproject.toml's license (SPDX BSD-3-Clause) and its text: LICENSE in the wheel's .dist-info/licenses/
    (setuptools' license-files), named in its metadata, and installed."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        dist_info = next(n.split("/")[0] for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        assert wheel.read(f"{dist_info}/licenses/LICENSE").decode() == (REPO / "LICENSE").read_text()
        metadata = wheel.read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in metadata and "License-File: LICENSE" in metadata, metadata[:2000]
    assert "Copyright (c) 2026, the commcamp developers" in (REPO / "LICENSE").read_text()
    assert (installed.purelib / dist_info / "licenses" / "LICENSE").is_file()


def test_installed_env_sh_and_nightly_wrapper_write_to_the_workspace(installed: Installed) -> None:
    """From the read-only install, as cron runs it (no commcamp on PATH): a shipped site's env.sh puts ReFrame's results
    database in commcamp's default workspace ($XDG_DATA_HOME/commcamp, not site-packages/campaigns/_data/results), and
    the nightly health wrapper runs the install's own commcamp, asks it for the workspace and makes its log directory
    there (the cron example's redirection into a missing results/health/ failed before anything ran)."""
    shipped = installed.purelib / "campaigns"
    env = {k: v for k, v in installed.env(dict(os.environ)).items() if k not in ("COMMCAMP_HOME", "RFM_SQLITE_DB_FILE")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(installed.venv / "bin"))
    shown = installed.timed("env.sh", _readonly([installed.venv, REPO], [
        "bash", "-c", f'. {shipped / "_data" / "site_configs" / "local" / "env.sh"} && echo "$RFM_SQLITE_DB_FILE"']),
        env=env, cwd=installed.cwd, timeout=60)
    assert shown.stdout.strip() == str(installed.home / ".local" / "share" / "commcamp" / "reframe" / "results.db")
    env.update(COMMCAMP_HOME=str(installed.workspace), COMMCAMP_HEALTH_LOG="nightly-wheel.log")
    spec = "campaigns/no-such-health.yaml"
    done = subprocess.run(_readonly([installed.venv, REPO], [str(shipped / "schedules" / "nightly-health.sh"), spec]),
                          env=env, cwd=installed.cwd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr  # commcamp's: the spec does not exist
    log = installed.workspace / "health" / "nightly-wheel.log"
    assert f"exit 2 (spec/site/database unusable); log {log}" in done.stderr, done.stdout + done.stderr
    assert spec in log.read_text() and "exit 2 (spec/site/database unusable)" in log.read_text()
    assert _files(installed.cwd) == [] and _files(installed.home) == []


@pytest.mark.slurm
def test_wheel_install_runs_the_nightly_health_campaign_on_the_cluster(installed: Installed,
                                                                       slurm_cluster: SlurmCluster) -> None:
    """The shipped health campaign of the shipped localslurm site, from the install, verdict in the workspace."""
    verdict = installed.workspace / "verdict-wheel.json"
    # The checkout's code read-only; its .lab/ holds the test cluster's state, which Slurm's tools write.
    argv = _readonly([installed.venv, *(REPO / name for name in SOURCES if (REPO / name).is_dir())], [
        str(installed.venv / "bin" / "commcamp"), "run", str(installed.purelib / "campaigns" / "health-localslurm.yaml"),
        "--tag", "wheel-night", "--verdict", str(verdict)])
    env = installed.env(slurm_cluster.env)
    # the cluster's sacct shim, as the install ships it (the checkout's copy is off the PATH)
    shim = installed.purelib / "campaigns" / "_data" / "site_configs" / "localslurm" / "cluster" / "bin"
    env["PATH"] = os.pathsep.join([str(shim), env["PATH"]])
    result = subprocess.run(argv, env=env, cwd=installed.cwd, capture_output=True, text=True, timeout=600,
                            check=False)
    output = result.stdout + result.stderr
    # A first night without history: judged against the site's references where it has them, else not judged;
    # never a usage or storage error.
    assert result.returncode in (0, 3, 4, 5), output[-4000:]
    assert json.loads(verdict.read_text())["exit_code"] == result.returncode, output[-4000:]
    assert f"Results: sqlite:///{installed.workspace}/commcamp.db" in output, output[-4000:]
    assert _files(installed.cwd) == [] and _files(installed.home) == []
