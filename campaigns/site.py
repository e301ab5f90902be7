"""Site data: `site_configs/<site>/site.yaml`, validated with pydantic.

A site is what ReFrame calls a configuration: systems, each with partitions, plus the programming
environments (MPI stacks) those partitions offer. site.yaml holds the DATA; the site's ReFrame
configuration (`site_configs/<site>/reframe_config.py`, via `site_configs/reframe_site.py`) reads the
same file with plain PyYAML and hands each partition's `commbench` block, node size and references to
the checks as partition `extras`. This module is the strict reading of that file: commcamp validates
every site it touches with it, so a typo in site.yaml is an error here, not a silently ignored key.

Importing this module has no side effects. The schema is versioned (`schema_version`) and every model
forbids unknown keys; richer sites (GPUs and NICs per node, link bandwidths, knob catalogs, topology)
extend `NodeSpec`, `Partition` and `Site` with new optional fields.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from campaigns.yamlio import YamlDocument, YamlModelError

SITE_CONFIGS_DIR = Path(__file__).resolve().parents[1] / "site_configs"
SITE_FILE = "site.yaml"
REFRAME_CONFIG_FILE = "reframe_config.py"

# What commbench's ReFrame check can measure and report (reframe_checks/commbench.py).
COMMBENCH_OPS = ("pingpong", "allreduce", "alltoall")
COMMBENCH_METRICS = ("small_latency", "large_goodput", "large_busbw")

Name = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$", max_length=64)]
EnvVarName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class SiteError(ValueError):
    """A site that does not exist or whose site.yaml is invalid."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSpec(_Model):
    """What one node of a partition offers a job."""

    cores: int | None = Field(default=None, ge=1, description="CPU cores per node; null = not recorded")
    gpus: int = Field(default=0, ge=0, description="GPUs per node (0 on CPU partitions)")


class Reference(_Model):
    """Expected value of one commbench performance metric; the check applies the first entry that
    matches the test case (op, node count, environment, message size).

    Thresholds are ReFrame's: fractions of `value`, lower in [-1, 0], upper >= 0, null = unbounded.
    """

    op: Literal[COMMBENCH_OPS]  # type: ignore[valid-type]
    metric: Literal[COMMBENCH_METRICS]  # type: ignore[valid-type]
    bytes: int = Field(ge=0, description="message size the metric is taken at")
    nodes: int | None = Field(default=None, ge=1, description="null = any node count")
    environ: Name | None = Field(default=None, description="null = any environment")
    value: float = Field(gt=0)
    lower: float | None = Field(default=None, ge=-1, le=0)
    upper: float | None = Field(default=None, ge=0)
    note: str = Field(default="", description="where the value comes from")

    @model_validator(mode="after")
    def _bounded(self) -> Reference:
        if self.lower is None and self.upper is None:
            raise ValueError("a reference needs a lower or an upper threshold (else it cannot fail)")
        return self


class CommbenchPartition(_Model):
    """How commbench is built and run on a partition."""

    backend: Literal["cpu", "cuda", "hip"]
    tasks_per_node: int = Field(ge=1, description="ranks per node for collectives (pingpong uses 2 ranks)")
    references: list[Reference] = []


class Partition(_Model):
    name: Name
    description: str = ""
    scheduler: str = Field(min_length=1, description="ReFrame scheduler backend: local, slurm, squeue, ...")
    launcher: str = Field(min_length=1, description="ReFrame launcher: srun, mpirun, mpiexec-from-env, ...")
    access: list[str] = Field(default=[], description="scheduler options every job gets, e.g. --partition=debug")
    max_jobs: int = Field(default=1, ge=1)
    nodes: int = Field(ge=1, description="most nodes one job may use")
    node: NodeSpec = NodeSpec()
    environments: list[Name] = Field(min_length=1)
    env_vars: dict[EnvVarName, str] = {}
    commbench: CommbenchPartition | None = None

    @field_validator("environments")
    @classmethod
    def _unique_environments(cls, names: list[str]) -> list[str]:
        _require_unique(names, "environment")
        return names


class System(_Model):
    name: Name
    description: str = ""
    hostnames: list[str] = Field(min_length=1, description="regular expressions for the login/run hosts")
    modules_system: str = "nomod"
    partitions: list[Partition] = Field(min_length=1)

    @field_validator("hostnames")
    @classmethod
    def _regexes(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return patterns

    @field_validator("partitions")
    @classmethod
    def _unique_partitions(cls, partitions: list[Partition]) -> list[Partition]:
        _require_unique([p.name for p in partitions], "partition")
        return partitions

    def partition(self, name: str) -> Partition:
        return _by_name(self.partitions, name)


class Environment(_Model):
    """A ReFrame programming environment: compilers plus what the launch needs."""

    name: Name
    description: str = ""
    mpi: Literal["openmpi", "mpich", "cray-mpich", "intel-mpi", "other"]
    cc: str = Field(min_length=1)
    cxx: str = ""
    ftn: str = ""
    nvcc: str = ""
    modules: list[str] = []
    env_vars: dict[EnvVarName, str] = {}
    features: list[Name] = Field(default=["mpi"], description="ReFrame features; checks select on them")


class Site(_Model):
    schema_version: Literal[1]
    name: Name
    description: str = ""
    systems: list[System] = Field(min_length=1)
    environments: list[Environment] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Site:
        _require_unique([s.name for s in self.systems], "system")
        _require_unique([e.name for e in self.environments], "environment")
        known = {e.name for e in self.environments}
        for system in self.systems:
            for partition in system.partitions:
                unknown = [name for name in partition.environments if name not in known]
                if unknown:
                    raise ValueError(f"partition {system.name}:{partition.name} lists environments "
                                     f"{unknown} that are not defined under 'environments'")
                for ref in partition.commbench.references if partition.commbench else []:
                    if ref.environ is not None and ref.environ not in partition.environments:
                        raise ValueError(f"a reference of {system.name}:{partition.name} names environment "
                                         f"{ref.environ!r}, which the partition does not offer")
                    if ref.nodes is not None and ref.nodes > partition.nodes:
                        raise ValueError(f"a reference of {system.name}:{partition.name} is for {ref.nodes} "
                                         f"nodes; the partition has {partition.nodes}")
        return self

    def system(self, name: str) -> System:
        return _by_name(self.systems, name)

    def environment(self, name: str) -> Environment:
        return _by_name(self.environments, name)

    @property
    def directory(self) -> Path:
        return SITE_CONFIGS_DIR / self.name

    @property
    def reframe_config(self) -> Path:
        return self.directory / REFRAME_CONFIG_FILE


NamedT = TypeVar("NamedT", Partition, System, Environment)


def _by_name(items: list[NamedT], name: str) -> NamedT:
    """The item called `name`; KeyError if there is none."""
    for item in items:
        if item.name == name:
            return item
    raise KeyError(name)


def _require_unique(names: list[str], what: str) -> None:
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{what} names must be unique; repeated: {duplicates}")


def available_sites() -> list[str]:
    """Names of the sites under site_configs/ (a directory with a site.yaml)."""
    return sorted(p.parent.name for p in SITE_CONFIGS_DIR.glob(f"*/{SITE_FILE}"))


def site_file(name: str) -> Path:
    path = SITE_CONFIGS_DIR / name / SITE_FILE
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name) or not path.is_file():
        raise SiteError(f"unknown site {name!r}; known sites: {', '.join(available_sites()) or 'none'}")
    return path


def load_site(name: str) -> Site:
    """The validated site.yaml of site `name`; SiteError names the file, line and field of each problem."""
    path = site_file(name)
    try:
        document = YamlDocument(path)
        site = document.validate(Site)
    except YamlModelError as exc:
        raise SiteError(str(exc)) from None
    if site.name != name:
        raise SiteError(document.problem(("name",), f"is {site.name!r} but the site directory is {name!r}"))
    if not site.reframe_config.is_file():
        raise SiteError(f"site {name!r} has no ReFrame configuration {site.reframe_config}")
    return site
