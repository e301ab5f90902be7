"""Site data: `site_configs/<site>/site.yaml`, validated with pydantic.

A site is what ReFrame calls a configuration: systems, each with partitions, plus the programming
environments (MPI stacks) those partitions offer. site.yaml holds the DATA; the site's ReFrame
configuration (`site_configs/<site>/reframe_config.py`, via `site_configs/reframe_site.py`) reads the
same file with plain PyYAML and hands each partition's `commbench` block, node size, reference
benchmarks, knob defaults and references to the checks as partition `extras`. This module is the
strict reading of that file: commcamp validates every site it touches with it, so a typo in site.yaml
is an error here, not a silently ignored key. `check_site` (behind `commcamp site check`) goes further:
the ReFrame configuration, the knob overrides against the catalog, env.sh and the Spack environment.

Facts about real machines carry `source` (where the value comes from) and `verified` (true only where
it was read on the machine itself); nothing here was measured unless a reference says so in its note.

Importing this module has no side effects. The schema is versioned (`schema_version`) and every model
forbids unknown keys.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import ConfigDict, Field, field_validator, model_validator

from campaigns.model import vocabulary
from campaigns import paths
from campaigns.paths import SITE_CONFIGS_DIR, SPACK_ENV_DIR
from campaigns.model.sizes import ByteCount, ReferenceBytes
from campaigns.model.yamlio import YamlDocument, YamlModel, YamlModelError, format_loc

SITE_FILE = "site.yaml"
REFRAME_CONFIG_FILE = "reframe_config.py"
ENV_FILE = "env.sh"

# Ops of the campaign check `commbench_run` (reframe_checks/commbench_run.py; campaigns/model/spec.py).
COMMBENCH_OPS = ("pingpong", "allreduce", "alltoall", "pingpong_bi", "allgather", "reduce_scatter", "bcast",
                 "sendrecv", "pairmatrix")
# Every commbench op and transport (campaigns/model/vocabulary.py, tested against commbench --list).
ALL_OPS = vocabulary.OPS
TRANSPORTS = vocabulary.TRANSPORTS
# The node counts the checks are parameterized with (reframe_checks: NODE_COUNTS; campaigns/model/spec.py).
NODE_COUNTS = (1, 2, 3, 4, 8, 16, 32, 64, 128)
# Metrics the checks report, by the ops they are taken for.
COMMBENCH_METRICS = vocabulary.SWEEP_METRICS
PAIRMATRIX_METRICS = ("worst_pair_latency", "worst_pair_goodput", "worst_pair_bi_goodput")
HOSTDEVICE_METRICS = ("small_latency", "pinned_goodput", "pageable_goodput")
ALL_METRICS = tuple(dict.fromkeys((*COMMBENCH_METRICS, *PAIRMATRIX_METRICS, *HOSTDEVICE_METRICS)))
# The site.yaml reference_benchmarks keys: the suites of the reference checks (nccl-tests, OSU); their
# benchmarks and every metric one of them reports.
REFERENCE_SUITES = tuple(check.suite for check in vocabulary.REFERENCE_CHECKS.values())
REFERENCE_BENCHMARKS = tuple(vocabulary.BENCHMARK_METRICS)
REFERENCE_METRICS = tuple(dict.fromkeys(m for metrics in vocabulary.BENCHMARK_METRICS.values() for m in metrics))
# Message-size sets of site.yaml `commbench.sizes` (which check uses which: site_configs/README.md).
SIZE_SETS = ("health", "small", "large", "matrix", "hostdevice")
# NVLink multicast (NVLS) can take a shared host's GPUs out of service (shared/notes/gpu-device.md):
# every partition whose GPUs can do it must switch it off in every library that would use it.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

NAME_PATTERN = r"[A-Za-z][A-Za-z0-9_-]*"  # sites, systems, partitions, environments
Name = Annotated[str, Field(pattern=rf"^{NAME_PATTERN}$", max_length=64)]
EnvVarName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Transport = Literal[TRANSPORTS]  # type: ignore[valid-type]
NodeCount = Literal[NODE_COUNTS]  # type: ignore[valid-type]


class SiteError(ValueError):
    """A site that does not exist or whose site.yaml is invalid."""


class _SiteModel(YamlModel):
    """Base of every site.yaml model: a number must be written as one. pydantic's lax mode would take `nodes: "3"`
    as 3 here while site_configs/reframe_site.py, which reads site.yaml with plain PyYAML, hands the checks the
    string "3" (a reference for nodes "2" never matching in ReFrame, a node count compared with a string). Strict
    mode refuses a string (and YAML's true, which YamlModel already names) where a number belongs; a message size
    (ByteCount) still takes its units, and reframe_site.py reads them by the same rule (campaigns.model.sizes)."""

    model_config = ConfigDict(strict=True)


class _Fact(_SiteModel):
    """A value about a real machine: where it comes from, and whether it was read on the machine."""

    source: str = Field(min_length=1, description="document, file or command the value comes from")
    verified: bool = Field(default=False, description="true only if checked on the real machine")


class NodeSpec(_SiteModel):
    """What one node of a partition offers a job."""

    cores: int | None = Field(default=None, ge=1, description="CPU cores per node; null = not recorded")
    gpus: int = Field(default=0, ge=0, description="GPUs (AMD: GCDs) per node, 0 on CPU partitions")
    gpu_model: str = ""
    numa_nodes: int | None = Field(default=None, ge=1)
    nics: int | None = Field(default=None, ge=0, description="high-speed network interfaces per node")
    nic_model: str = ""
    nvlink_multicast: bool = Field(default=False, description="the GPUs can use NVLink multicast (NVLS); "
                                                              "the partition must then switch it off")
    source: str = ""
    verified: bool = False


class Bandwidth(_Fact):
    """A nominal (datasheet) bandwidth per direction in GB/s (1e9 bytes/s): one value, or a range where
    it depends on the pair (e.g. LUMI's 1 to 4 Infinity Fabric links between two GCDs)."""

    gbs: float | None = Field(default=None, gt=0)
    min_gbs: float | None = Field(default=None, gt=0)
    max_gbs: float | None = Field(default=None, gt=0)
    note: str = ""

    @model_validator(mode="after")
    def _one_form(self) -> Bandwidth:
        ranged = self.min_gbs is not None and self.max_gbs is not None
        if (self.gbs is not None) == ranged or (not ranged and (self.min_gbs or self.max_gbs)):
            raise ValueError("give gbs, or min_gbs and max_gbs")
        if ranged and self.min_gbs > self.max_gbs:  # type: ignore[operator]
            raise ValueError(f"min_gbs {self.min_gbs} is above max_gbs {self.max_gbs}")
        return self


class Latency(_Fact):
    """A nominal small-message latency in microseconds, one way (as commbench's pingpong reports it)."""

    us: float = Field(gt=0)
    note: str = ""


class Links(_SiteModel):
    """Nominal bandwidths per direction, for "is my number right?": between two GPUs of a node, of one
    NIC (inter-node), and between the host and one GPU; the nominal inter-node latency. Health checks
    flag values no such link can give (campaigns.kinds.health)."""

    gpu_pair: Bandwidth | None = None
    nic: Bandwidth | None = None
    host_device: Bandwidth | None = None
    nic_latency: Latency | None = None


class LibraryVersion(_Fact):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._+-]*$")
    version: str = Field(min_length=1)


class Network(_Fact):
    """The fabric between nodes and how to tell where a node sits in it (health isolation, placement)."""

    fabric: str = Field(min_length=1)
    topology: str = Field(min_length=1)
    location: Literal["cray-xname", "slurm-topology", "single-host"]
    location_how: str = Field(min_length=1, description="how to read a node's network location")


class Resource(_SiteModel):
    """A ReFrame partition resource; `_rfm_gpu` carries the scheduler option for num_gpus_per_node."""

    name: str = Field(min_length=1)
    options: list[str] = []


class SizeSet(_SiteModel):
    """Message sizes in bytes: an explicit list, or min_bytes * step_factor^k up to max_bytes."""

    sizes: list[ByteCount] | None = Field(default=None, min_length=1)
    min_bytes: ByteCount | None = None
    max_bytes: ByteCount | None = None
    step_factor: int | None = Field(default=None, ge=2, le=1024)

    @model_validator(mode="after")
    def _one_form(self) -> SizeSet:
        ranged = (self.min_bytes, self.max_bytes, self.step_factor)
        if self.sizes is not None and any(v is not None for v in ranged):
            raise ValueError("give sizes, or min_bytes/max_bytes/step_factor, not both")
        if self.sizes is None and any(v is None for v in ranged):
            raise ValueError("give sizes, or all of min_bytes, max_bytes and step_factor")
        if self.sizes is None and self.max_bytes < self.min_bytes:  # type: ignore[operator]
            raise ValueError(f"max_bytes {self.max_bytes} is below min_bytes {self.min_bytes}")
        return self

    def values(self) -> list[int]:
        if self.sizes is not None:
            return list(self.sizes)
        assert self.min_bytes and self.max_bytes and self.step_factor
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= self.step_factor
        return sizes


class Reference(_SiteModel):
    """Expected value of one commbench performance metric; the checks apply the first entry that
    matches the test case (op, transport, node count, rank count, environment, message size).

    Thresholds are ReFrame's: fractions of `value`, lower in [-1, 0], upper >= 0, null = unbounded.
    """

    op: Literal[ALL_OPS]  # type: ignore[valid-type]
    metric: Literal[ALL_METRICS]  # type: ignore[valid-type]
    bytes: ReferenceBytes = Field(description="message size the metric is taken at (64K, 1MiB: the size rule)")
    transport: Transport | None = Field(default=None, description="null = any transport")
    nodes: int | None = Field(default=None, ge=1, description="null = any node count")
    ranks: int | None = Field(default=None, ge=1, description="null = any rank count")
    environ: Name | None = Field(default=None, description="null = any environment")
    value: float = Field(gt=0)
    lower: float | None = Field(default=None, ge=-1, le=0)
    upper: float | None = Field(default=None, ge=0)
    note: str = Field(default="", description="where the value comes from")

    @model_validator(mode="after")
    def _bounded(self) -> Reference:
        wanted = (PAIRMATRIX_METRICS if self.op == "pairmatrix" else
                  HOSTDEVICE_METRICS if self.op in ("h2d", "d2h") else COMMBENCH_METRICS)
        if self.metric not in wanted:
            raise ValueError(f"metric {self.metric!r} is not reported for op {self.op!r} (it has: {', '.join(wanted)})")
        _check_thresholds(self.metric, self.lower, self.upper)
        return self


class CommbenchPartition(_SiteModel):
    """How commbench is built and run on a partition."""

    backend: Literal["cpu", "cuda", "hip"]
    build: Literal["cmake", "spack"] = "cmake"
    cmake_options: list[str] = Field(default=[], description="extra -D options, e.g. -DCOMMBENCH_CUDA_ARCHS=90")
    build_jobs: int = Field(default=2, ge=1)
    spack_env: str = Field(default="", description="Spack environment directory (build: spack): absolute, "
                           "or relative to commcamp's shipped folders (e.g. spack_env/h200)")
    spack_spec: str = Field(default="", description="the commbench spec that environment installs (build: spack; "
                            "one MPI: the partition must have one environment)")
    tasks_per_node: int = Field(ge=1, description="ranks per node for collectives (pingpong uses 2 ranks)")
    transports: list[Transport] = Field(min_length=1)
    default_transport: Transport
    expect_unsupported: dict[Transport, str] = Field(
        default={}, description="transports commbench must report as unsupported here, with the reason")
    node_counts: list[NodeCount] = Field(min_length=1, description="node counts of the suite's checks")
    sizes: dict[Literal[SIZE_SETS], SizeSet]  # type: ignore[valid-type]
    launcher_options: list[str] = Field(default=[], description="e.g. LUMI's --cpu-bind=mask_cpu:... for GCDs")
    job_options: list[str] = Field(default=[], description="scheduler options of every commbench job")
    references: list[Reference] = []

    @model_validator(mode="after")
    def _consistent(self) -> CommbenchPartition:
        _require_unique(list(self.transports), "transport")
        _require_unique([str(n) for n in self.node_counts], "node count")
        # Each transport is built for the backends the vocabulary gives it (bench_src/schema/vocabulary.json).
        if wrong := [name for name in self.transports if self.backend not in vocabulary.TRANSPORT_BACKENDS[name]]:
            built = "; ".join(f"{name}: {', '.join(vocabulary.TRANSPORT_BACKENDS[name])}" for name in wrong)
            raise ValueError(f"transports {wrong} are not built for the {self.backend} backend (built for {built})")
        for name in self.expect_unsupported:
            if name not in self.transports:
                raise ValueError(f"expect_unsupported names {name!r}, which is not in transports")
        if self.default_transport not in self.transports or self.default_transport in self.expect_unsupported:
            raise ValueError(f"default_transport {self.default_transport!r} must be a supported transport")
        if self.build == "spack" and not (self.spack_env and self.spack_spec):
            raise ValueError("build: spack needs spack_env and spack_spec")
        needed = {"health", "small", "large", "matrix"} | ({"hostdevice"} if "memcpy" in self.transports else set())
        missing = sorted(needed - set(self.sizes))
        if missing:
            raise ValueError(f"sizes needs the size sets {missing}")
        for ref in self.references:
            if ref.transport is not None and (ref.transport not in self.transports
                                              or ref.transport in self.expect_unsupported):
                raise ValueError(f"a {ref.op} reference is for transport {ref.transport!r}, "
                                 f"which does not run here")
        return self


class BenchReference(_SiteModel):
    """Expected value of a third-party benchmark's metric (see reframe_checks/reference_benchmarks.py)."""

    benchmark: Literal[REFERENCE_BENCHMARKS] = Field(description="e.g. all_reduce_perf")  # type: ignore[valid-type]
    metric: Literal[REFERENCE_METRICS]  # type: ignore[valid-type]
    bytes: ReferenceBytes
    nodes: int | None = Field(default=None, ge=1)
    ranks: int | None = Field(default=None, ge=1)
    environ: Name | None = None
    value: float = Field(gt=0)
    lower: float | None = Field(default=None, ge=-1, le=0)
    upper: float | None = Field(default=None, ge=0)
    note: str = ""

    @model_validator(mode="after")
    def _bounded(self) -> BenchReference:
        wanted = vocabulary.BENCHMARK_METRICS[self.benchmark]
        if self.metric not in wanted:
            raise ValueError(f"metric {self.metric!r} is not reported by {self.benchmark} "
                             f"(it has: {', '.join(wanted)})")
        _check_thresholds(self.metric, self.lower, self.upper)
        return self


class ReferenceBenchmark(_SiteModel):
    """Where a partition gets nccl-tests / rccl-tests / OSU from, tried in this order: the directory
    in `dir_variable` (or `default_dir`, repository-relative), `modules`, the Spack spec."""

    package: Literal["nccl-tests", "rccl-tests", "osu-micro-benchmarks"]
    dir_variable: EnvVarName | None = None
    default_dir: str = ""
    modules: list[str] = []
    spack_spec: str = ""
    args: list[str] = Field(default=[], description="sizes and iterations for every benchmark")
    tasks_per_node: int | None = Field(default=None, ge=1, description="default: commbench's tasks_per_node")
    node_counts: list[NodeCount] = Field(min_length=1)
    references: list[BenchReference] = []
    source: str = ""
    verified: bool = False

    @model_validator(mode="after")
    def _locatable(self) -> ReferenceBenchmark:
        if not (self.dir_variable or self.default_dir or self.modules or self.spack_spec):
            raise ValueError("say where the binaries are: dir_variable, default_dir, modules or spack_spec")
        return self


class Partition(_SiteModel):
    name: Name
    description: str = ""
    scheduler: str = Field(min_length=1, description="ReFrame scheduler backend: local, slurm, squeue, ...")
    launcher: str = Field(min_length=1, description="ReFrame launcher: srun, mpirun, mpiexec-from-env, ...")
    access: list[str] = Field(default=[], description="scheduler options every job gets, e.g. --partition=debug")
    max_jobs: int = Field(default=1, ge=1)
    nodes: int = Field(ge=1, description="most nodes one job may use")
    node: NodeSpec = NodeSpec()
    environments: list[Name] = Field(min_length=1)
    modules: list[str] = []
    env_vars: dict[EnvVarName, str] = {}
    prepare_cmds: list[str] = []
    resources: list[Resource] = []
    links: Links | None = None
    libraries: list[LibraryVersion] = []
    commbench: CommbenchPartition | None = None
    reference_benchmarks: dict[Literal[REFERENCE_SUITES], ReferenceBenchmark] = {}  # type: ignore[valid-type]

    @field_validator("environments")
    @classmethod
    def _unique_environments(cls, names: list[str]) -> list[str]:
        _require_unique(names, "environment")
        return names

    @field_validator("access")
    @classmethod
    def _splittable(cls, options: list[str]) -> list[str]:
        for option in options:  # split into words as ReFrame (and the placement, the Slurm snapshot) read them
            try:
                shlex.split(option)
            except ValueError as exc:
                raise ValueError(f"{option!r} cannot be split into words as a shell would ({exc}): quote it in "
                                 "pairs, e.g. --comment='its mine'") from None
        return options

    @property
    def references(self) -> list[Reference | BenchReference]:
        """Every reference of the partition: commbench's, then each reference benchmark's."""
        return [*(self.commbench.references if self.commbench else []),
                *(ref for bench in self.reference_benchmarks.values() for ref in bench.references)]

    @model_validator(mode="after")
    def _consistent(self) -> Partition:
        if self.scheduler == "local" and self.nodes > 1:  # every multi-node case failed: "ranks ran on 1 host"
            raise ValueError(f"nodes {self.nodes}: ReFrame's local scheduler runs every job on this host; give "
                             "nodes: 1, or a batch scheduler (slurm, squeue, ...)")
        counts = list(self.commbench.node_counts) if self.commbench else []
        for bench in self.reference_benchmarks.values():
            counts += bench.node_counts
        too_many = sorted({n for n in counts if n > self.nodes})
        if too_many:
            raise ValueError(f"node counts {too_many} exceed the partition's {self.nodes} node(s)")
        expected = {"nccl_tests": ("nccl-tests", "rccl-tests"), "osu": ("osu-micro-benchmarks",)}
        checks = {check.suite: check for check in vocabulary.REFERENCE_CHECKS.values()}
        for key, bench in self.reference_benchmarks.items():
            if bench.package not in expected[key]:
                raise ValueError(f"reference_benchmarks.{key} cannot be package {bench.package!r}")
            for ref in bench.references:
                if ref.benchmark not in checks[key].benchmarks:
                    raise ValueError(f"reference_benchmarks.{key} has a reference for {ref.benchmark}, which is not "
                                     f"one of its benchmarks ({', '.join(checks[key].benchmarks)})")
        if len(self.environments) > 1:  # each environment is one MPI; a Spack spec is built against one MPI
            spack = [f"commbench build: spack (spack_spec {self.commbench.spack_spec!r})"] \
                if self.commbench and self.commbench.build == "spack" else []
            spack += [f"reference_benchmarks.{key} (spack_spec {bench.spack_spec!r})"
                      for key, bench in self.reference_benchmarks.items() if bench.spack_spec]
            if spack:
                raise ValueError(
                    f"partition {self.name!r}: {'; '.join(spack)}: one Spack spec builds for one MPI, but the "
                    f"partition has {len(self.environments)} environments ({', '.join(self.environments)}) and each "
                    f"would run that build with its own MPI; give the partition one environment (a partition per "
                    f"MPI), or do without Spack there (build: cmake; the binaries by dir_variable, default_dir or "
                    f"modules)")
        if self.node.nvlink_multicast:
            missing = {k: v for k, v in NVLINK_MULTICAST_OFF.items() if self.env_vars.get(k) != v}
            if missing:
                raise ValueError("the GPUs can use NVLink multicast, which can take a shared host's GPUs out "
                                 "of service: env_vars must set " +
                                 ", ".join(f"{k}={v}" for k, v in missing.items()))
        return self


class System(_SiteModel):
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


class Environment(_SiteModel):
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


class Site(_SiteModel):
    schema_version: Literal[1]
    name: Name
    description: str = ""
    network: Network | None = None
    knobs: dict[str, Any] = Field(
        default={}, description="overrides of the knob catalog (tuners.catalog.SiteKnobOverrides: defaults, "
                                "forbidden, pinned, restrict, documented); checked by `commcamp site check`")
    systems: list[System] = Field(min_length=1)
    environments: list[Environment] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Site:
        _require_unique([s.name for s in self.systems], "system")
        _require_unique([e.name for e in self.environments], "environment")
        known = {e.name for e in self.environments}
        for system in self.systems:
            for partition in system.partitions:
                where = f"{system.name}:{partition.name}"
                unknown = [name for name in partition.environments if name not in known]
                if unknown:
                    raise ValueError(f"partition {where} lists environments {unknown} that are not defined "
                                     f"under 'environments'")
                for ref in partition.references:
                    if ref.environ is not None and ref.environ not in partition.environments:
                        raise ValueError(f"a reference of {where} names environment {ref.environ!r}, which the "
                                         f"partition does not offer")
                    if ref.nodes is not None and ref.nodes > partition.nodes:
                        raise ValueError(f"a reference of {where} is for {ref.nodes} nodes; the partition has "
                                         f"{partition.nodes}")
        return self

    def system(self, name: str) -> System:
        return _by_name(self.systems, name)

    def environment(self, name: str) -> Environment:
        return _by_name(self.environments, name)

    @property
    def directory(self) -> Path:
        return site_file(self.name).parent

    @property
    def reframe_config(self) -> Path:
        return self.directory / REFRAME_CONFIG_FILE

    @property
    def env_file(self) -> Path:
        return self.directory / ENV_FILE

    def knob_catalog(self) -> Any:
        """The knob catalog (site_configs/knobs/catalog.yaml) with this site's `knobs:` applied
        (tuners.catalog.KnobCatalog); raises tuners.catalog.CatalogError naming the key."""
        from campaigns.model.yamlio import YamlDocument
        from tuners.catalog import CatalogError, KnobCatalog

        try:
            return KnobCatalog.load().for_site(self.knobs, str(self.directory / SITE_FILE))
        except CatalogError as exc:  # with the line of the key it names
            raise CatalogError(YamlDocument(self.directory / SITE_FILE).with_line(str(exc))) from None


NamedT = TypeVar("NamedT", Partition, System, Environment)


def _by_name(items: list[NamedT], name: str) -> NamedT:
    """The item called `name`; KeyError if there is none."""
    for item in items:
        if item.name == name:
            return item
    raise KeyError(name)


def _check_thresholds(metric: str, lower: float | None, upper: float | None) -> None:
    """A reference must be able to fail on the side that is worse (a bandwidth's lower, a latency's upper): bounded
    only on its better side it passes every degraded value and fails a faster system (health does not judge by
    it either)."""
    if lower is None and upper is None:
        raise ValueError("a reference needs a lower or an upper threshold (else it cannot fail)")
    # the pair matrix's and copies' metrics are not the vocabulary's: their latencies are lower when better
    higher_is_better = (vocabulary.METRICS[metric].higher_is_better if metric in vocabulary.METRICS
                        else not metric.endswith("latency"))
    if (lower if higher_is_better else upper) is None:
        worse, given = ("lower", "upper") if higher_is_better else ("upper", "lower")
        raise ValueError(f"{metric} is {'higher' if higher_is_better else 'lower'} when better: a reference with "
                         f"only a {given} threshold passes every degraded value; give its {worse} threshold")


def _require_unique(names: list[str], what: str) -> None:
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{what} names must be unique; repeated: {duplicates}")


def site_search_path() -> list[Path]:
    """Where sites are looked for, first match first: $COMMCAMP_SITE_PATH, then the shipped examples."""
    return [*paths.site_path_dirs(), SITE_CONFIGS_DIR]


def available_sites() -> list[str]:
    """Names of the sites on the search path: each directory whose name is a site name (NAME_PATTERN: not
    `mysite.bak`, which no command could name) and that holds a site.yaml file."""
    return sorted({p.parent.name for directory in site_search_path() for p in directory.glob(f"*/{SITE_FILE}")
                   if re.fullmatch(NAME_PATTERN, p.parent.name) and p.is_file()})


def find_site_file(name: str) -> Path | None:
    """The site.yaml of site `name`: the first on the search path; None if there is none."""
    if not re.fullmatch(NAME_PATTERN, name):
        return None
    return next((d / name / SITE_FILE for d in site_search_path() if (d / name / SITE_FILE).is_file()), None)


def site_file(name: str) -> Path:
    path = find_site_file(name)
    if path is None:
        raise SiteError(f"unknown site {name!r}; known sites: {', '.join(available_sites()) or 'none'} "
                        f"(searched {', '.join(map(str, site_search_path()))})")
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


def check_site(name: str) -> list[str]:
    """Every problem of a site's files, each as `FILE: key: message`; empty when the site is sound.

    site.yaml (schema and consistency), its ReFrame configuration (imports, validates against ReFrame's
    schema, every system:partition resolves), the knob overrides against the catalog, env.sh (exists,
    is valid bash, sets RFM_CONFIG_FILES) and, where a partition builds with Spack or the site has one,
    spack_env/<site>/spack.yaml (keys of Spack's environment schema)."""
    try:
        site = load_site(name)
    except SiteError as exc:
        return str(exc).splitlines()
    problems = _reframe_config_problems(site.reframe_config)
    if not problems:  # the configuration loaded: it registered the site's own launchers (reframe_site.py)
        problems += _unknown_backends(site)
    try:
        site.knob_catalog()
    except ValueError as exc:  # CatalogError is a ValueError; its message names the file and key
        problems.append(str(exc))
    problems += _env_file_problems(site.env_file)
    required = {paths.DATA_ROOT / p.commbench.spack_env for s in site.systems for p in s.partitions
                if p.commbench and p.commbench.build == "spack"}
    for env_dir in sorted(required | {SPACK_ENV_DIR / site.name}):
        manifest = env_dir / "spack.yaml"
        if manifest.is_file():
            problems += _spack_problems(manifest)
        elif env_dir in required:
            problems.append(f"{manifest}: missing (a partition of site {site.name!r} builds commbench with Spack)")
    return problems


# What a template (site_configs/generic-slurm) writes where a site must put its own value.
EDIT_MARK = re.compile(r"\bEDIT\b")


def edit_placeholders(site_yaml: Path) -> list[str]:
    """The values of a site.yaml that still say EDIT (a template's placeholders: `site new` copies them), each as
    `FILE:LINE: key: 'value'`. Not problems: a site made from the template is valid as made, but these values
    describe no real machine yet (`commcamp site check` warns about each). Empty for a file that cannot be read
    (check_site names that)."""
    import yaml

    try:
        document = YamlDocument(site_yaml)
    except YamlModelError:
        return []
    found: list[str] = []

    def walk(node: yaml.Node | None, loc: tuple[str | int, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(value, (*loc, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, (*loc, index))
        elif isinstance(node, yaml.ScalarNode) and EDIT_MARK.search(str(node.value)):
            found.append(f"{site_yaml}:{node.start_mark.line + 1}: {format_loc(loc)}: {node.value!r}")

    walk(document.root, ())
    return found


def _scaffold_site_yaml(text: str, name: str, template: str) -> str:
    """A template's site.yaml for site `name`: its leading comments (what the template is, how to copy it by hand)
    replaced by where the new site comes from, and its `name`."""
    lines = text.splitlines(keepends=True)
    head = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")), len(lines))
    header = (f"# Site {name!r}: made by `commcamp site new {name} --from {template}` (commcamp's\n"
              "# site_configs/README.md, \"A new site\"). Replace every value that says EDIT (`commcamp site check\n"
              f"# {name}` names each one left) or whose comment says EDIT, each fact with its source.\n")
    return header + re.sub(rf"^name:\s*{re.escape(template)}\s*$", f"name: {name}", "".join(lines[head:]), count=1,
                           flags=re.MULTILINE)


def _scaffold_reframe_config(text: str, name: str, template: str) -> str:
    """A template's reframe_config.py for site `name`: its docstring's first sentence (which says what the template
    site is) names the new site instead."""
    made = f"ReFrame configuration of site {name!r}, made from site {template!r} by `commcamp site new`."
    text, count = re.subn(rf"ReFrame configuration of site '{re.escape(template)}'[^\n]*?\.(?= Data: )", made, text,
                          count=1)
    return text if count else text.replace(f"site '{template}'", f"site '{name}'", 1)


def _scaffold_env_sh(text: str, target: Path, template: str) -> str:
    """A template's env.sh for the site made in `target`: comments naming the template's directory name the new
    one, and ENV_FILE_PATHS_LINE after the leading comments."""
    lines = [line.replace(f"site_configs/{template}/", f"{target}/") if line.lstrip().startswith("#") else line
             for line in text.splitlines(keepends=True)]
    return _with_paths_line("".join(lines))


# What a site kept outside commcamp's examples adds to its env.sh: plain `reframe` then finds reframe_site.py
# and the checks' shipped folders (COMMCAMP_DATA) and writes to the workspace (COMMCAMP_HOME).
ENV_FILE_PATHS_LINE = 'eval "$(commcamp paths --env)"  # COMMCAMP_DATA, COMMCAMP_HOME (`commcamp paths`)\n'


def _with_paths_line(env_sh: str) -> str:
    """A template's env.sh with ENV_FILE_PATHS_LINE after its leading comments: before the lines that read
    COMMCAMP_HOME (RFM_SQLITE_DB_FILE), which would otherwise put ReFrame's results beside the site directory."""
    lines = env_sh.splitlines(keepends=True)
    head = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")), len(lines))
    return "".join([*lines[:head], ENV_FILE_PATHS_LINE, *lines[head:]])


class SiteWriteError(SiteError):
    """`site new` could not write the new site (a full disk, an I/O error): nothing was left behind."""


def _template_texts(template: str) -> dict[str, str]:
    """The files of site `template` that `site new` copies, by name; SiteError naming --from and the file when one is
    missing, unreadable or not UTF-8 text."""
    source = site_file(template).parent
    texts = {}
    for name in (SITE_FILE, REFRAME_CONFIG_FILE, ENV_FILE):
        try:
            texts[name] = (source / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SiteError(f"--from {template}: {source / name} is missing (a site to start from has {SITE_FILE}, "
                            f"{REFRAME_CONFIG_FILE} and {ENV_FILE}); nothing written") from None
        except UnicodeDecodeError as exc:
            raise SiteError(f"--from {template}: {source / name} is not UTF-8 text (byte {exc.start}); nothing "
                            "written") from None
        except OSError as exc:
            raise SiteError(f"--from {template}: cannot read {source / name} ({exc.strerror or exc}); nothing "
                            "written") from None
    return texts


def new_site(name: str, template: str, parent: Path) -> Path:
    """Scaffold site `name` in parent/name from site `template` (site.yaml, reframe_config.py, env.sh), check
    it like `commcamp site check` and move it into place in one rename: SiteError (nothing written) if the
    name is bad, the target exists, the template is unknown or unreadable or the new site has problems;
    SiteWriteError (nothing left behind) when the files cannot be written (a full disk)."""
    import shutil
    import tempfile

    if not re.fullmatch(NAME_PATTERN, name) or len(name) > 64:
        raise SiteError(f"site name {name!r}: use a letter, then letters, digits, _ and - (at most 64)")
    texts = _template_texts(template)
    target = parent / name
    try:
        taken = target.exists()
        made = [d for d in (parent, *parent.parents) if not d.exists()]  # removed again when nothing is written
    except OSError as exc:  # a name too long, a path through a file
        raise SiteError(f"--dir {parent}: cannot create the site there: {exc.strerror or exc}") from None
    if taken:
        raise SiteError(f"{target} exists; choose another name or --dir")
    search = [d.resolve() for d in site_search_path()]
    earlier = search[:search.index(parent.resolve())] if parent.resolve() in search else []
    if hidden_by := next((d / name for d in earlier if (d / name / SITE_FILE).is_file()), None):
        raise SiteError(f"site {name!r} is {hidden_by}, which comes first on the site search path: the new site "
                        "would never be used; choose another name or --dir")
    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.", suffix=".new"))
        except OSError as exc:
            raise SiteError(f"--dir {parent}: cannot create the site there: {exc.strerror or exc}") from None
        try:
            draft = staging / name
            try:
                draft.mkdir()
                (draft / SITE_FILE).write_text(_scaffold_site_yaml(texts[SITE_FILE], name, template), encoding="utf-8")
                (draft / REFRAME_CONFIG_FILE).write_text(_scaffold_reframe_config(
                    texts[REFRAME_CONFIG_FILE], name, template), encoding="utf-8")
                (draft / ENV_FILE).write_text(_scaffold_env_sh(texts[ENV_FILE], target, template), encoding="utf-8")
            except OSError as exc:
                raise SiteWriteError(f"cannot write the new site in {parent}: {exc.strerror or exc}; nothing was "
                                     "left behind") from None
            with _environ(paths.SITE_PATH_ENV, os.pathsep.join([str(staging), *map(str, paths.site_path_dirs())])):
                problems = check_site(name)
            if problems:
                raise SiteError(f"site {name!r} made from {template!r} has problems (nothing written):\n"
                                + "\n".join(p.replace(str(staging), str(parent)) for p in problems))
            try:
                draft.rename(target)
            except OSError as exc:  # e.g. made meanwhile by someone else
                raise SiteWriteError(f"cannot move the new site to {target}: {exc.strerror or exc}; nothing was "
                                     "left behind") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        if not os.path.lexists(target):
            for directory in made:  # innermost first; a directory someone else filled meanwhile stays
                with contextlib.suppress(OSError):
                    directory.rmdir()
    return target


def _reframe_config_problems(path: Path) -> list[str]:
    # ReFrame is imported here only: the rest of this module must not need it.
    import jsonschema
    import reframe
    from reframe.core.config import load_config
    from reframe.core.exceptions import ConfigError

    try:
        raw = _loaded_module_config(path)
    except Exception as exc:  # the file is Python: anything can go wrong while importing it
        return [f"{path}: cannot load: {type(exc).__name__}: {exc}"]
    schema_file = Path(reframe.INSTALL_PREFIX) / "reframe" / "schemas" / "config.json"
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    problems = [f"{path}: {'.'.join(str(p) for p in error.absolute_path) or '(config)'}: {error.message}"
                for error in jsonschema.Draft7Validator(schema).iter_errors(raw)]
    if problems:
        return problems
    config = load_config()  # ReFrame's builtin configuration, then this site's on top
    config.update_config(raw, str(path))
    for system in raw["systems"]:
        for partition in system["partitions"]:
            fullname = f"{system['name']}:{partition['name']}"
            try:
                config.select_subconfig(fullname)
                config.validate()
            except ConfigError as exc:
                problems.append(f"{path}: systems.{fullname}: {exc}")
    return problems


def backend_problems(site: Site) -> list[str]:
    """Each partition's scheduler and launcher that ReFrame does not know, as `FILE:LINE: key: message` (a typo
    there passed `site check` and failed every job of a run, its reason only in reframe.out). Loads the site's
    ReFrame configuration, which registers the launchers of its own (reframe_site.py)."""
    try:
        _loaded_module_config(site.reframe_config)
    except Exception as exc:  # the file is Python: anything can go wrong while importing it
        return [f"{site.reframe_config}: cannot load: {type(exc).__name__}: {exc}"]
    return _unknown_backends(site)


def _unknown_backends(site: Site) -> list[str]:
    """backend_problems once the site's ReFrame configuration is loaded (check_site has loaded it)."""
    from reframe.core.backends import getlauncher, getscheduler
    from reframe.core.exceptions import ConfigError

    document = YamlDocument(site.directory / SITE_FILE)
    problems = []
    for i, system in enumerate(site.systems):
        for j, partition in enumerate(system.partitions):
            for field, backend in (("scheduler", getscheduler), ("launcher", getlauncher)):
                try:
                    backend(getattr(partition, field))
                except ConfigError as exc:
                    problems.append(document.problem(("systems", i, "partitions", j, field), f"ReFrame has {exc}"))
    return problems


def _loaded_module_config(path: Path) -> dict[str, Any]:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_commcamp_site_config_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # A site kept outside the shipped examples finds reframe_site.py through this (its reframe_config.py). What the
    # file does to the environment stays there (localslurm's sets SLURM_CONF and PATH for plain `reframe -C`): a
    # `run` that checked the site read a missing cluster's SLURM_CONF as the caller's.
    saved = dict(os.environ)
    try:
        with _environ(paths.DATA_ENV, os.environ.get(paths.DATA_ENV) or str(paths.DATA_ROOT)):
            spec.loader.exec_module(module)
    finally:  # only what it changed: never an empty environment, even for a moment
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        os.environ.update({name: value for name, value in saved.items() if os.environ.get(name) != value})
    return module.site_configuration  # type: ignore[no-any-return]


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """os.environ[name] = value for the block, then as it was."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def _env_file_problems(path: Path) -> list[str]:
    if not path.is_file():
        return [f"{path}: missing (it sets RFM_CONFIG_FILES so that plain `reframe` finds the configuration)"]
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    if syntax.returncode != 0:
        return [f"{path}: not valid bash: {syntax.stderr.strip()}"]
    if not re.search(r"^\s*export\s+RFM_CONFIG_FILES=", path.read_text(encoding="utf-8"), re.MULTILINE):
        return [f"{path}: does not export RFM_CONFIG_FILES"]
    return []


def _spack_problems(manifest: Path) -> list[str]:
    import importlib.util
    import sys

    name = "_commcamp_spack_check"
    checker = sys.modules.get(name)
    if checker is None:
        spec = importlib.util.spec_from_file_location(name, SPACK_ENV_DIR / "spack_check.py")
        assert spec is not None and spec.loader is not None
        checker = importlib.util.module_from_spec(spec)
        sys.modules[name] = checker  # its dataclasses look their module up there
        spec.loader.exec_module(checker)
    return list(checker.check_environment_file(manifest))
