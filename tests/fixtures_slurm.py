"""The local multi-node Slurm cluster (site_configs/localslurm/cluster/cluster.sh) for tests.

`slurm_cluster` (session scope) starts a cluster on a cluster id that neither a developer's own cluster
(id 0 by default) nor a concurrent test session uses, yields a `SlurmCluster`, and stops the cluster at
the end, also when tests fail. Tests that use it are marked `@pytest.mark.slurm`.

Environment:
  COMMCAMP_SLURM_TEST_ID     use this cluster id (0-9) instead of the first free one of 9..1
  COMMCAMP_SLURM_TEST_NODES  number of nodes (2-4, default 3)
  COMMCAMP_REQUIRE_SLURM=1   fail instead of skipping where the machine cannot run the cluster (CI)

A test that breaks the cluster (kill_node, stop) must restore it (restart_node, start) before it ends.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO_ROOT / "site_configs" / "localslurm" / "cluster" / "cluster.sh"
# cluster.sh's registry of which lab holds which id; test sessions keep their id locks beside it.
REGISTRY_DIR = Path("/run/commcamp-slurm")
EX_ID_IN_USE = 75  # cluster.sh: the id is held by another lab's running cluster
TEST_ID_ENV = "COMMCAMP_SLURM_TEST_ID"
TEST_NODES_ENV = "COMMCAMP_SLURM_TEST_NODES"
REQUIRE_ENV = "COMMCAMP_REQUIRE_SLURM"
CANDIDATE_IDS = tuple(range(9, 0, -1))  # id 0 is a developer's default cluster
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")
REQUIRED_COMMANDS = ("ip", "nsenter", "unshare", "flock", "runuser", "ss", "munge", "slurmctld", "slurmd",
                     "srun", "sbatch", "sinfo")


class CommandFailed(RuntimeError):
    """A command run against the cluster exited non-zero; the message carries its output."""

    def __init__(self, cmd: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"{shlex.join(cmd)} exited {result.returncode}\n"
                         f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}")
        self.result = result


def unavailable_reason() -> str | None:
    """Why this machine cannot run the local cluster, or None if it can."""
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (network namespaces, daemons)"
    missing = [cmd for cmd in REQUIRED_COMMANDS if shutil.which(cmd) is None]
    if missing:
        return f"commands not found: {', '.join(missing)} (make system-deps)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"'ip netns' does not work here: {probe.stderr.strip()}"
    return None


def process_alive(pid: int, name: str | None = None) -> bool:
    """The process exists, is not a zombie (PID 1 reaps daemons slowly) and, if given, is `name`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and (name is None or comm == name)


def parse_exports(text: str) -> dict[str, str]:
    """`export KEY='value'` lines (cluster.sh env) -> {KEY: value}."""
    exports: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) != 2 or words[0] != "export" or "=" not in words[1]:
            raise ValueError(f"not an export line: {line!r}")
        key, value = words[1].split("=", 1)
        exports[key] = value
    return exports


@dataclass(frozen=True)
class JobEnd:
    """A finished job as the sacct shim (jobcomp/filetxt) reports it."""
    job_id: int
    state: str
    exit_code: int
    signal: int


@dataclass
class SlurmCluster:
    """One local cluster: `env` is what subprocesses need (os.environ + the `cluster.sh env` exports)."""
    cluster_id: int
    nnodes: int
    lab: Path
    exports: dict[str, str]
    env: dict[str, str]

    @classmethod
    def for_id(cls, cluster_id: int, nnodes: int, lab: Path) -> SlurmCluster:
        cluster = cls(cluster_id, nnodes, lab, {}, {})
        cluster.exports = parse_exports(cluster.cluster_sh("env").stdout)
        cluster.env = {**os.environ, **cluster.exports}
        return cluster

    @property
    def nodes(self) -> list[str]:
        return self.exports["LOCALSLURM_NODES"].split()

    @property
    def partition(self) -> str:
        return self.exports["LOCALSLURM_PARTITION"]

    @property
    def veths(self) -> dict[str, str]:
        """Node name -> its veth in the root namespace (where tc netem goes)."""
        return dict(zip(self.nodes, self.exports["LOCALSLURM_VETHS"].split(), strict=True))

    @property
    def netns(self) -> dict[str, str]:
        return dict(zip(self.nodes, self.exports["LOCALSLURM_NETNS"].split(), strict=True))

    def cluster_sh(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(CLUSTER_SH), "--id", str(self.cluster_id), "--nodes", str(self.nnodes),
               "--lab", str(self.lab), *args]
        return self._run(cmd, os.environ, check=check, timeout=timeout)

    def start(self) -> subprocess.CompletedProcess[str]:
        return self.cluster_sh("start")

    def stop(self) -> subprocess.CompletedProcess[str]:
        return self.cluster_sh("stop")

    def kill_node(self, node: int | str) -> None:
        """SIGKILL that node's slurmd (its job steps live on)."""
        self.cluster_sh("kill-node", str(node))

    def restart_node(self, node: int | str) -> None:
        """Stop that node's slurmd if it runs, start it again, wait until the node responds."""
        self.cluster_sh("restart-node", str(node))

    def run(self, cmd: Sequence[str], *, timeout: float = 60, check: bool = True,
            extra_env: Mapping[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run a client command (srun, sbatch, sinfo, ...) with the cluster's environment."""
        return self._run(cmd, {**self.env, **(extra_env or {})}, check=check, timeout=timeout, cwd=cwd)

    @staticmethod
    def _run(cmd: Sequence[str], env: Mapping[str, str], *, check: bool, timeout: float,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(list(cmd), env=dict(env), cwd=cwd, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise CommandFailed(cmd, result)
        return result

    def node_states(self) -> dict[str, str]:
        """Node -> sinfo's short state (idle, mix, alloc, down*, ...)."""
        out = self.run(["sinfo", "-h", "-N", "-p", self.partition, "-o", "%N %t"]).stdout
        return dict(line.split() for line in out.splitlines())

    def wait_node_state(self, node: str, wanted: Collection[str], timeout: float = 60) -> str:
        """Poll until the node's sinfo state is one of `wanted`; return it."""
        deadline = time.monotonic() + timeout
        while (state := self.node_states()[node]) not in wanted:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node} is {state!r}, not one of {sorted(wanted)} after {timeout} s")
            time.sleep(0.2)
        return state

    def sbatch(self, *args: str) -> int:
        """Submit a batch job (sbatch arguments, e.g. "-N2", "--wrap", "cmd"); return its id."""
        out = self.run(["sbatch", "--parsable", *args]).stdout
        return int(out.strip().split(";")[0])

    def wait_job_end(self, job_id: int, timeout: float = 60) -> JobEnd:
        """Poll the sacct shim until the job's final record appears."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.run(["sacct", "-n", "-P", "-j", str(job_id), "-o", "jobid,state,exitcode"]).stdout
            for line in out.splitlines():
                jobid, state, exitcode = line.split("|")
                if jobid == str(job_id):
                    code, signal = exitcode.split(":")
                    return JobEnd(job_id, state, int(code), int(signal))
            if time.monotonic() > deadline:
                queue = self.run(["squeue", "-j", str(job_id)], check=False)
                raise TimeoutError(f"job {job_id} not finished after {timeout} s:\n{queue.stdout}{queue.stderr}")
            time.sleep(0.2)

    def daemon_pids(self) -> dict[str, int]:
        """Daemon -> PID from its PID file: munged, slurmctld, slurmd-<node>."""
        files = {"munged": self.lab / "munge" / "munged.pid", "slurmctld": self.lab / "run" / "slurmctld.pid"}
        files |= {f"slurmd-{node}": self.lab / "run" / f"slurmd-{node}.pid" for node in self.nodes}
        return {name: int(path.read_text()) for name, path in files.items() if path.exists()}

    def leftovers(self) -> list[str]:
        """Everything of this cluster that still exists: namespaces, links, live daemons."""
        found: list[str] = []
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        found += [f"netns {name}" for name in self.netns.values() if name in netns.split()]
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
        link_names = {line.split(": ")[1].split("@")[0] for line in links.splitlines()}
        ours = {*self.veths.values(), self.exports["LOCALSLURM_BRIDGE"]}
        found += [f"link {name}" for name in sorted(ours & link_names)]
        found += [f"{name} pid {pid}" for name, pid in self.daemon_pids().items()
                  if process_alive(pid, name.split("-")[0])]
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and _is_lab_daemon(proc, self.lab) and process_alive(int(proc.name)):
                found.append(f"process {proc.name} using {self.lab}")
        return found


def _is_lab_daemon(proc: Path, lab: Path) -> bool:
    try:
        comm = (proc / "comm").read_text().strip()
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return comm in DAEMONS and f"{lab}/" in cmdline


@contextlib.contextmanager
def _id_lock(cluster_id: int) -> Iterator[bool]:
    """Hold this session's claim on a cluster id; yields False if another test session holds it."""
    REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    with open(REGISTRY_DIR / f"pytest-c{cluster_id}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


@contextlib.contextmanager
def local_slurm_cluster(nnodes: int = 3, cluster_id: int | None = None) -> Iterator[SlurmCluster]:
    """Start a fresh cluster on `cluster_id` or the first free id of 9..1; stop it on exit, also on error."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    for candidate in CANDIDATE_IDS if cluster_id is None else (cluster_id,):
        with _id_lock(candidate) as locked:
            if not locked:
                continue
            cluster = SlurmCluster.for_id(candidate, nnodes, REPO_ROOT / ".lab" / "slurm" / f"pytest-c{candidate}")
            # Our lab: whatever runs there is left over from a session that died; start from nothing.
            if cluster.cluster_sh("stop", check=False).returncode == EX_ID_IN_USE:
                continue  # a cluster of another lab (a developer's) holds this id
            try:
                cluster.start()
                yield cluster
            finally:
                cluster.stop()
            return
    raise RuntimeError(f"no free cluster id among {CANDIDATE_IDS if cluster_id is None else (cluster_id,)}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = unavailable_reason()
    if reason:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    requested = os.environ.get(TEST_ID_ENV)
    with local_slurm_cluster(nnodes=int(os.environ.get(TEST_NODES_ENV, "3")),
                             cluster_id=int(requested) if requested else None) as cluster:
        yield cluster
