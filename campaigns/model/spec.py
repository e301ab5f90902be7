"""Campaign specs: which ReFrame checks to run where, validated before anything runs.

A spec is a YAML file (campaigns/smoke.yaml is the example):

    name: smoke                      # campaign name; part of every run key
    description: ...
    site: local                      # a directory under site_configs/
    system: local:cpu                # optional: system or system:partition (default: the site's
                                     # only system, every partition of it that runs commbench)
    environments: [openmpi, mpich]   # optional (default: every environment of the partition)
    node_counts: [1]                 # each must fit the partition (site.yaml `nodes`)
    checks:
      - check: commbench_run         # the ReFrame test (reframe_checks/commbench_run.py)
        ops: [pingpong, allreduce, alltoall]
        min_bytes: 8                 # or `sizes: [8, 1K, 64K]` (K, M, G: powers of 1024)
        max_bytes: 65536
        step_factor: 8
        warmup: 2
        iters: 10
        timeout_s: 60                # commbench's watchdog: the longest one step may take
        time_limit_s: 120            # the job's time limit (Slurm rounds up to minutes)
        tasks_per_node: 2            # collectives; default from the site (pingpong: 2 ranks)
        env: {UCX_TLS: "tcp,self"}   # extra environment of the runs (knobs)
        extra_args: [--peer, "1"]    # more commbench options (no commas)
        transports: [mpi]            # commbench --transport values; one test case each (default mpi)
      - check: osu_run               # or nccl_tests_run: the site's binaries (reframe_checks/reference_benchmarks.py)
        benchmarks: [osu_latency, osu_allreduce]   # its `benchmark` parameter's values (vocabulary.json)
        time_limit_s: 300            # also tasks_per_node, env and extra_args (after the site's `args`)

Reference checks (`nccl_tests_run`, `osu_run`; their benchmarks and the metrics each reports: the
`reference_checks` of bench_src/schema/vocabulary.json) run where a partition offers the suite (site.yaml
`reference_benchmarks.nccl_tests` / `.osu`): one test case per benchmark, node count and environment, on
the campaign's node counts that the suite lists (`node_counts`); pair benchmarks (osu_latency, osu_bw) on
1 or 2 nodes only. Their output is stored as records like commbench's (the run names the check and the
`benchmark`) and judged alike, against the references of its benchmark (site.yaml
`reference_benchmarks.<suite>.references`, or `references` here with `benchmark:` instead of `op:`).

Campaign kinds (`kind`, default `run`):

- `characterize`: the full sweep of a system. `max_nodes: 8` stands for node_counts 1, 2, 4, 8, and
  `placements` (Slurm partitions) places multi-node jobs: `any`, `same-switch` (a --nodelist under one leaf
  switch), `each-switch`
  (one run under every leaf switch that has enough nodes, a --nodelist each: node sets that share no node),
  `different-switch` / `different-group` (a --nodelist spread over leaf switches / top-level groups of
  the live Slurm topology). Every run is labelled with the network distance its ranks actually spanned.
  `commcamp run` writes the HTML report afterwards (campaigns/report/html.py).
- `health`: the nightly check (campaigns/kinds/health.py). Each night's runs have their own run keys (the run
  tag, by default the UTC date); each metric is judged against its reference (`references` here, then
  the site's) and against the same metric of earlier nights; multi-node failures are isolated to a node
  or link with pairwise tests. Settings under `health:` (HealthSettings below).

`references` (all kinds) use site.yaml's reference formats (commbench's with `op`, a reference benchmark's
with `benchmark`) and take precedence over the site's.

`load_campaign` reads and validates it (every model forbids unknown keys) and checks it against the
site; any problem raises SpecError naming the file, line, field path and what is wrong.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator

from campaigns.model.site import (COMMBENCH_OPS, BenchReference, EnvVarName, Environment, Name, Partition, Reference,
                                  Site, SiteError, System, load_site)
from campaigns.model.records import MAX_MESSAGE_BYTES
from campaigns.model.sizes import ByteCount
from campaigns.model.vocabulary import (BENCHMARK_PARAMETER, MATRIX_OPS, PAIR_OPS,  # pair: on 1 or 2 nodes
                                        REFERENCE_CHECKS, SINGLE_NODE_TRANSPORTS, TRANSPORT_OPS)
from campaigns.model.yamlio import Loc, YamlDocument, YamlModel, YamlModelError
from tuners.catalog import CatalogError, KnobCatalog, Library, UnsafeValueError, check_safe_value

# The node counts reframe_checks/commbench_run.py is parameterized with (its `num_nodes`).
COMMBENCH_NODE_COUNTS = (1, 2, 3, 4, 8, 16, 32, 64, 128)
PAIR_RANKS = 2
SLURM_SCHEDULERS = ("slurm", "squeue")
PLACEMENTS = ("any", "same-switch", "different-switch", "different-group", "each-switch")
CAMPAIGN_KINDS = ("run", "characterize", "health")
TransportName = Annotated[str, Field(pattern=r"^[a-z0-9-]+$", max_length=32)]
MessageSize = Annotated[ByteCount, Field(le=MAX_MESSAGE_BYTES)]


# The programming environments the checks campaigns run accept: their ReFrame valid_prog_environs, read from
# here by reframe_checks/lib/commbench_tests.py and reframe_checks/reference_benchmarks.py. +mpi also matches an
# environment's `mpi` extra (every site environment has one); environments with the feature gpu_aware_mpi exist
# for commbench_gpu_aware_mpi alone.
CAMPAIGN_ENVIRONS = "+mpi -gpu_aware_mpi"


def campaign_runs_in(environment: Environment) -> bool:
    """Whether CAMPAIGN_ENVIRONS selects `environment`, as ReFrame matches features: every `+` one and no `-` one
    among its features or extras (site_configs/reframe_site.py: extras {mpi: ...})."""
    have = {*environment.features, "mpi"}
    words = CAMPAIGN_ENVIRONS.split()
    return (all(w[1:] in have for w in words if w.startswith("+"))
            and not any(w[1:] in have for w in words if w.startswith("-")))


class SpecError(ValueError):
    """A campaign spec that cannot be used; the message names every problem."""


def _unique(values: list[Any]) -> list[Any]:
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"repeated values {repeated}")
    return values


# ReFrame's list syntax for -S splits on ','; the words land unquoted on the job script's command line.
ExtraArg = Annotated[str, Field(pattern=r"^[^,]+$")]


class _CheckSpec(YamlModel):
    """What every check of a campaign takes: its job's time limit, ranks per node, knobs and options."""

    time_limit_s: int = Field(default=600, ge=1)
    tasks_per_node: int | None = Field(default=None, ge=1)
    env: dict[EnvVarName, str] = {}
    extra_args: list[ExtraArg] = []

    @field_validator("env")
    @classmethod
    def _safe_env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():  # what the tuner allows in a knob value: nothing a shell interprets
            check_safe_value(value, name)
        return env

    @field_validator("extra_args")
    @classmethod
    def _safe_args(cls, args: list[str]) -> list[str]:
        for arg in args:
            check_safe_value(arg, "extra_args")
        return args


class CommbenchCheckSpec(_CheckSpec):
    """Runs of reframe_checks/commbench_run.py's `commbench_run`: one test case per op, node count and
    environment. The fields become its variables (`-S commbench_run.NAME=VALUE`)."""

    check: Literal["commbench_run"]
    ops: list[Literal[COMMBENCH_OPS]] = Field(min_length=1)  # type: ignore[valid-type]
    min_bytes: MessageSize = 8
    max_bytes: MessageSize = 1 << 20
    step_factor: int = Field(default=4, ge=2)
    sizes: list[MessageSize] | None = Field(default=None, min_length=1)
    warmup: int = Field(default=5, ge=0)
    iters: int = Field(default=50, ge=1)
    timeout_s: int = Field(default=120, ge=1)
    check_data: bool = True
    transports: list[TransportName] = Field(default=["mpi"], min_length=1)

    @field_validator("ops", "sizes", "transports")
    @classmethod
    def _no_repeats(cls, values: list[Any] | None) -> list[Any] | None:
        return values if values is None else _unique(values)

    @model_validator(mode="after")
    def _size_range(self) -> CommbenchCheckSpec:
        if self.max_bytes < self.min_bytes:
            raise ValueError(f"max_bytes ({self.max_bytes}) is below min_bytes ({self.min_bytes})")
        return self

    def variables(self, transport: str) -> dict[str, Any]:
        """The check's variables for one transport, as ReFrame gets them (`-S commbench_run.NAME=VALUE`)."""
        values: dict[str, Any] = {"warmup": self.warmup, "iters": self.iters, "bench_timeout": self.timeout_s,
                                  "time_limit": f"{self.time_limit_s}s",
                                  "check_data": self.check_data, "transport": transport}
        if self.extra_args:
            values["extra_args"] = list(self.extra_args)
        if self.sizes:
            values["sizes"] = list(self.sizes)
        else:
            values.update(min_bytes=self.min_bytes, max_bytes=self.max_bytes, step_factor=self.step_factor)
        return values


class ReferenceCheckSpec(_CheckSpec):
    """Runs of reframe_checks/reference_benchmarks.py's `nccl_tests_run` or `osu_run`: the site's nccl-tests
    or OSU binaries (site.yaml `reference_benchmarks`), one test case per benchmark, node count and
    environment where a partition offers the suite on that many nodes. Their output is stored as records
    like commbench's, its metrics judged alike (vocabulary.json `reference_checks`). Sizes and iterations
    are the site's `args`; `extra_args` come after them."""

    check: Literal[tuple(REFERENCE_CHECKS)]  # type: ignore[valid-type]
    benchmarks: list[str] = Field(min_length=1)

    @field_validator("benchmarks")
    @classmethod
    def _known(cls, benchmarks: list[str], info: ValidationInfo) -> list[str]:
        check = info.data.get("check")  # absent when it is invalid: its own error says so
        if check in REFERENCE_CHECKS:
            offered = REFERENCE_CHECKS[check].benchmarks
            unknown = [name for name in benchmarks if name not in offered]
            if unknown:
                raise ValueError(f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not a "
                                 f"benchmark of {check} (it has: {', '.join(offered)})")
        return _unique(benchmarks)

    @property
    def suite(self) -> str:
        return REFERENCE_CHECKS[self.check].suite

    def variables(self) -> dict[str, Any]:
        """The check's variables, as ReFrame gets them (`-S CHECK.NAME=VALUE`)."""
        values: dict[str, Any] = {"time_limit": f"{self.time_limit_s}s"}
        if self.extra_args:
            values["extra_args"] = list(self.extra_args)
        return values


def _reference_kind(value: Any) -> str | None:
    """A reference benchmark's reference names its benchmark, commbench's its op; None: not a reference."""
    if isinstance(value, dict):
        return "benchmark-reference" if "benchmark" in value else "commbench-reference"
    if isinstance(value, (Reference, BenchReference)):
        return "benchmark-reference" if isinstance(value, BenchReference) else "commbench-reference"
    return None


CheckSpec = Annotated[CommbenchCheckSpec | ReferenceCheckSpec, Field(discriminator="check")]
# The tags are no keys of a reference: campaigns.model.yamlio drops them from the field paths of errors.
AnyReference = Annotated[
    Annotated[Reference, Tag("commbench-reference")] | Annotated[BenchReference, Tag("benchmark-reference")],
    Discriminator(_reference_kind, custom_error_type="reference_type", custom_error_message=(
        "a reference is a mapping with op, metric, bytes and value (commbench) or benchmark, metric, bytes "
        "and value (a reference benchmark)"))]


class IsolationSettings(YamlModel):
    """The pairwise tests that name the node or link behind a degraded multi-node test: pingpong between
    two nodes (Slurm --nodelist), judged like every health metric and against the other pairs."""

    environ: Name | None = Field(default=None, description="default: the campaign's first environment")
    sizes: list[MessageSize] = Field(default=[8, 65536], min_length=1)
    warmup: int = Field(default=2, ge=0)
    iters: int = Field(default=20, ge=1)
    timeout_s: int = Field(default=60, ge=1)
    time_limit_s: int = Field(default=120, ge=1)
    peer_factor: float = Field(default=3.0, gt=1, description="a pair this many times worse than the best "
                                                                "pair tested is bad, whatever its history")
    max_pairs: int = Field(default=16, ge=1, description="most pair tests one isolation runs")


class HealthSettings(YamlModel):
    """How a health campaign judges each metric: against its reference, and against the median of the last
    `history_nights` nights with a robust spread (1.4826 x MAD, at least `min_spread` x the median)."""

    history_nights: int = Field(default=14, ge=1)
    min_history: int = Field(default=3, ge=1, description="nights needed before history is judged")
    degraded_z: float = Field(default=3.0, gt=0)
    failed_z: float = Field(default=6.0, gt=0)
    degraded_change: float = Field(default=0.10, ge=0, description="relative change needed for degraded")
    failed_change: float = Field(default=0.50, ge=0, description="relative change needed for failed")
    min_spread: float = Field(default=0.02, ge=0)
    # Plausibility over the site's nominal links (site.yaml links), judged even without history.
    implausible_latency_factor: float = Field(default=100.0, gt=1, description=(
        "a multi-node latency above this many times links.nic_latency is failed"))
    implausible_bandwidth_factor: float = Field(default=1.25, ge=1, description=(
        "a multi-node bandwidth above this many times a node's NICs (links.nic x node.nics) is failed"))
    slow_alpha: float = Field(default=0.05, gt=0, lt=1, description=(
        "fail-slow: the false-alarm rate per night over every (node, record) judged "
        "(Bonferroni; campaigns/kinds/health.py)"))
    isolate: bool = True
    isolation: IsolationSettings = IsolationSettings()

    @model_validator(mode="after")
    def _ordered(self) -> HealthSettings:
        if self.failed_z < self.degraded_z or self.failed_change < self.degraded_change:
            raise ValueError("failed_z / failed_change must not be below degraded_z / degraded_change")
        if self.history_nights < max(self.min_history, 2):  # a spread needs two nights (kinds/health.py judge)
            raise ValueError(f"history_nights {self.history_nights} is below the {max(self.min_history, 2)} nights "
                             f"that history is judged on (min_history {self.min_history}, and a spread needs 2): "
                             "no night would ever be judged on its history")
        return self


class CampaignSpec(YamlModel):
    name: Name
    kind: Literal[CAMPAIGN_KINDS] = "run"  # type: ignore[valid-type]
    description: str = ""
    site: Name
    system: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_-]*(:[A-Za-z][A-Za-z0-9_-]*)?$")
    environments: list[Name] | None = Field(default=None, min_length=1)
    node_counts: list[Literal[COMMBENCH_NODE_COUNTS]] | None = Field(  # type: ignore[valid-type]
        default=None, min_length=1)
    max_nodes: int | None = Field(default=None, ge=1, description="node_counts 1, 2, 4, ... up to this")
    placements: list[Literal[PLACEMENTS]] = Field(default=["any"], min_length=1)  # type: ignore[valid-type]
    references: list[AnyReference] = []
    # False: ReFrame's performance stage is skipped (values still stored). For campaigns that test the
    # pipeline on a host whose timings mean nothing (the local cluster's nodes share two cores).
    check_performance: bool = True
    health: HealthSettings | None = None
    checks: list[CheckSpec] = Field(min_length=1)

    @field_validator("environments", "node_counts", "placements")
    @classmethod
    def _no_repeats(cls, values: list[Any] | None) -> list[Any] | None:
        return values if values is None else _unique(values)

    @model_validator(mode="after")
    def _consistent(self) -> CampaignSpec:
        if (self.node_counts is None) == (self.max_nodes is None):
            raise ValueError("give node_counts or max_nodes (one of them)")
        if self.health is not None and self.kind != "health":
            raise ValueError(f"'health' settings need kind: health (this is kind {self.kind})")
        matrices = [f"checks[{i}].ops: {op}" for i, check in enumerate(self.checks)
                    if isinstance(check, CommbenchCheckSpec) for op in check.ops if op in MATRIX_OPS]
        if self.kind == "health" and matrices:  # its records are per pair: no value the night is judged on
            raise ValueError(f"{', '.join(matrices)}: a matrix op gives no metric a health night is judged on "
                             "(its case would be left out of the verdict unjudged): run it in a characterize campaign")
        return self

    @property
    def nodes(self) -> list[int]:
        if self.node_counts is not None:
            return list(self.node_counts)
        assert self.max_nodes is not None
        return [n for n in COMMBENCH_NODE_COUNTS if n & (n - 1) == 0 and n <= self.max_nodes]

    @property
    def health_settings(self) -> HealthSettings:
        return self.health or HealthSettings()


@dataclass(frozen=True)
class TestCase:
    """One ReFrame test case the campaign runs: a check with its variables on one partition and
    environment, one transport and placement; `run_key` identifies it in the results store. `op` is the
    value of the check's first parameter: commbench_run's op, a reference check's benchmark.

    `tag` (health: the night) and `nodelist` (isolation: the nodes of a pair test) are part of the run key but
    not of `series_key`, which names the same measurement across nights and pairs; an each-switch run's nodes
    (the switch it tests) are part of both: each switch has a history of its own. So is `setup` (site_setup:
    what site.yaml gives the case's runs) part of the run key only: a run stored before the site changed its
    modules, variables, build or knob defaults is not this case's (`run` measures it again), while health
    judges the night against the same series (a slower system after the change is what it must tell).

    A case is self-contained: everything its ReFrame invocation needs (the site's ReFrame configuration,
    every `-S` variable, the environment, the performance flag) is here, so campaigns, health's pair tests
    and the tuner's trials all produce cases and share one launch path (campaigns.reframe.runner)."""

    campaign: str
    site: str
    system: str
    partition: str
    environ: str
    check: str
    op: str
    num_nodes: int
    tasks_per_node: int
    variables: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...]  # in the spec's order (ReFrame's env_vars keep it); run keys sort it
    placement: str = "any"
    tag: str | None = None
    nodelist: tuple[str, ...] = ()
    reframe_config: Path | None = None  # the site's ReFrame configuration (reframe -C)
    tasks_per_node_setting: int | None = None  # -S num_tasks_per_node; None: the check decides (pair ops, partition)
    check_performance: bool = True  # False: --skip-performance-check
    setup: str = ""  # site_setup's digest of the site's setup of the partition and environment
    # the campaign spec's own references (JSON, -S campaign_references), judged in the check before the site's;
    # not part of the run key (health judges every night against them alike)
    references: str = ""

    @property
    def num_tasks(self) -> int:
        return self.num_nodes * self.tasks_per_node

    @property
    def op_parameter(self) -> str:
        """The check's ReFrame parameter that `op` is a value of."""
        return BENCHMARK_PARAMETER if self.check in REFERENCE_CHECKS else "op"

    @property
    def transport(self) -> str:
        """commbench's --transport; a reference check's: the one its records name."""
        if self.check in REFERENCE_CHECKS:
            return REFERENCE_CHECKS[self.check].transport
        return str(dict(self.variables)["transport"])

    @property
    def parameters(self) -> dict[str, Any]:
        parameters = {self.op_parameter: self.op, "num_nodes": self.num_nodes,
                      "num_tasks_per_node": self.tasks_per_node, **dict(self.variables), "env": dict(self.env)}
        if self.placement != "any":
            parameters["placement"] = self.placement
        return parameters

    @property
    def series_key(self) -> str:
        digest = hashlib.sha256(json.dumps(self.parameters, sort_keys=True).encode()).hexdigest()[:16]
        base = (case_key_prefix(self.campaign, self.site, self.system, self.partition, self.environ, self.check)
                + f"{self.op}/{self.transport}/{self.num_nodes}n/")
        if self.placement == "each-switch" and self.nodelist:  # each switch's nodes have a history of their own
            return f"{base}{digest}/{'+'.join(self.nodelist)}"
        # pair tests share one series whatever their nodes (judged against each other and earlier pairs)
        return f"{base}{'pair/' if self.nodelist else ''}{digest}"

    @property
    def run_key(self) -> str:
        pair = f"/{'+'.join(self.nodelist)}" if self.nodelist and self.placement != "each-switch" else ""
        return self.series_key + pair + (f"@{self.tag}" if self.tag else "") + (f"~{self.setup}" if self.setup else "")

    @property
    def reframe_name(self) -> str:
        """Anchored regex for ReFrame's `-n`: the test's display name without spaces."""
        return f"^{self.check}%{self.op_parameter}={self.op}%num_nodes={self.num_nodes}$"


def case_key_prefix(campaign: str, site: str, system: str, partition: str, environ: str, check: str) -> str:
    """How every run key of a campaign's test case begins (TestCase.series_key)."""
    return f"{campaign}/{site}/{system}:{partition}/{environ}/{check}/"


# The shape of every TestCase.run_key: case_key_prefix, then op/transport/<N>n/, pair/ for a pair test, the
# parameters' 16-digit digest, then its nodes, @tag, ~setup or nothing.
CASE_KEY = re.compile(r"[^/]+/[^/]+/[^/:]+:[^/]+/[^/]+/[^/]+/[^/]+/[^/]+/\d+n/(pair/)?[0-9a-f]{16}(?:[/@~]|$)")


def in_series(run_key: str, series_key: str) -> bool:
    """Whether `run_key` is a run of the series `series_key` (TestCase.run_key: the series key, then a pair's nodes,
    @tag, ~setup or nothing): an each-switch series key ends in its nodes, n1+n2 a prefix of n1+n20's."""
    return run_key.startswith(series_key) and run_key[len(series_key):][:1] in ("", "/", "@", "~")


SETUP_DIGITS = 10  # hex digits of site_setup's digest
SETUP_SUFFIX = re.compile(rf"~[0-9a-f]{{{SETUP_DIGITS}}}$")  # TestCase.run_key's site_setup digest


def without_setup(run_key: str) -> str:
    """A run key less its site setup: one test case (a night's, a pair's) whatever site.yaml gave it."""
    return SETUP_SUFFIX.sub("", run_key)


@dataclass(frozen=True)
class Campaign:
    spec: CampaignSpec
    path: Path
    site: Site
    system: System
    partitions: tuple[Partition, ...]
    environments: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    def references(self, partition: str) -> list[Reference | BenchReference]:
        """The references a case on `partition` is judged against: the campaign's own first, then that partition's
        (first match wins; a reference matches no partition by itself, so another partition's is never one)."""
        return [*self.spec.references, *(ref for p in self.partitions if p.name == partition for ref in p.references)]

    def cases(self, tag: str | None = None) -> list[TestCase]:
        return [case for check in self.spec.checks for case in self.check_cases(check, tag)]

    def own_references(self, check: CommbenchCheckSpec | ReferenceCheckSpec) -> str:
        """TestCase.references of `check`'s cases: the spec's own references of its kind (a benchmark's are not a
        commbench case's; ReFrame's check judges them before the site's), as JSON."""
        kind = BenchReference if isinstance(check, ReferenceCheckSpec) else Reference
        own = [ref.model_dump(mode="json", exclude_none=True, exclude={"note"})
               for ref in self.spec.references if isinstance(ref, kind)]
        return json.dumps(own, separators=(",", ":")) if own else ""

    def check_cases(self, check: CommbenchCheckSpec | ReferenceCheckSpec, tag: str | None = None) -> list[TestCase]:
        """The test cases of one of the spec's checks."""
        references = self.own_references(check)
        cases = []
        for partition in self.partitions:
            for environ in self.environments:
                if environ not in partition.environments:
                    continue
                for op, nodes, per_node, variables in _runs(check, partition, self.spec.nodes):
                    # one node has nothing to place: a single case, whatever the placements
                    for placement in ["any"] if nodes == 1 else self.spec.placements:
                        cases.append(TestCase(
                            campaign=self.name, site=self.site.name, system=self.system.name,
                            partition=partition.name, environ=environ, check=check.check,
                            op=op, num_nodes=nodes, tasks_per_node=per_node,
                            variables=tuple(variables.items()),
                            env=tuple(check.env.items()), placement=placement, tag=tag,
                            reframe_config=self.site.reframe_config, tasks_per_node_setting=check.tasks_per_node,
                            check_performance=self.spec.check_performance,
                            setup=site_setup(self.site, partition, environ,
                                             check.suite if isinstance(check, ReferenceCheckSpec) else None),
                            references=references))
        return cases


def site_setup(site: Site, partition: Partition, environ: str, suite: str | None = None) -> str:
    """A digest of what site.yaml gives a test case's runs beside the campaign spec: the partition's scheduler
    access, launcher, modules, variables, preparation and resources, the programming environment, the site's knob
    defaults and pins (in every job), commbench's launch options (every check's jobs take them) and how the case's
    benchmark is built: commbench's build for a commbench check (`suite` None), that reference suite's block for
    one of its checks. Not what only judges or describes (references, descriptions, node counts of the checks), nor
    knob defaults and pins that only another MPI reads (an Open MPI default does not re-key MPICH's cases)."""
    commbench = partition.commbench
    environment = site.environment(environ)
    built = {"backend", "build", "cmake_options", "spack_env", "spack_spec"} if suite is None else set()
    benchmarks = partition.reference_benchmarks.get(suite) if suite is not None else None
    setup = {
        "partition": partition.model_dump(mode="json", include={"scheduler", "launcher", "access", "modules",
                                                                "env_vars", "prepare_cmds", "resources"}),
        "commbench": None if commbench is None else commbench.model_dump(
            mode="json", include={"launcher_options", "job_options", *built}),
        "reference_benchmark": None if benchmarks is None else benchmarks.model_dump(
            mode="json", exclude={"node_counts", "references", "source", "verified"}),
        "environment": environment.model_dump(mode="json", exclude={"description", "features"}),
        "knobs": {part: _read_by(environment.mpi, site.knobs.get(part)) for part in ("defaults", "pinned")},
    }
    return hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()[:SETUP_DIGITS]


# The catalog's MPI libraries each environment's `mpi` reads the knobs of (Cray MPICH and MPICH share MPICH's
# variables); intel-mpi and other: not known, every knob counts.
_MPI_LIBRARIES = {Library.OPENMPI, Library.MPICH, Library.CRAY_MPICH}
_MPI_READS = {"openmpi": {Library.OPENMPI}, "mpich": {Library.MPICH, Library.CRAY_MPICH},
              "cray-mpich": {Library.MPICH, Library.CRAY_MPICH}}


@functools.cache
def _catalog_libraries() -> dict[str, frozenset[Library]]:
    return {knob.name: frozenset(knob.libraries) for knob in KnobCatalog.load()}


def _read_by(mpi: str, knobs: dict[str, Any] | None) -> dict[str, Any] | None:
    """`knobs` (a site's knob defaults or pins) less those only MPI libraries other than `mpi` read; None for
    none (as a site without them)."""
    reads = _MPI_READS.get(mpi)
    if not knobs or reads is None:
        return knobs or None
    libraries = _catalog_libraries()

    def other_mpis_only(name: str) -> bool:
        read_by = libraries.get(name, frozenset())
        return bool(read_by) and read_by <= _MPI_LIBRARIES and not read_by & reads

    return {name: value for name, value in knobs.items() if not other_mpis_only(name)} or None


# One run of a check on a partition: its op (a reference check's benchmark), node count, tasks per node and
# the check's variables.
Run = tuple[str, int, int, dict[str, Any]]


def _runs(check: CommbenchCheckSpec | ReferenceCheckSpec, partition: Partition, node_counts: list[int]
          ) -> Iterator[Run]:
    """What `check` runs on `partition` at the campaign's node counts: commbench's ops on each of them,
    a reference check's benchmarks where the partition offers its suite on that many nodes (site.yaml
    reference_benchmarks.<suite>.node_counts); pair ops and benchmarks on 1 or 2 nodes only. Tasks per
    node as the check sets them."""
    assert partition.commbench is not None  # _resolve keeps only commbench partitions
    if isinstance(check, ReferenceCheckSpec):
        suite = partition.reference_benchmarks.get(check.suite)
        pair = REFERENCE_CHECKS[check.check].pair
        for benchmark, nodes in itertools.product(check.benchmarks, node_counts):
            if suite is None or nodes not in suite.node_counts or (benchmark in pair and nodes > PAIR_RANKS):
                continue
            # as reframe_checks/reference_benchmarks.py's set_layout
            per_node = (PAIR_RANKS // nodes if benchmark in pair
                        else check.tasks_per_node or suite.tasks_per_node or partition.commbench.tasks_per_node)
            yield benchmark, nodes, per_node, check.variables()
        return
    named = "transports" in check.model_fields_set
    for transport, op, nodes in itertools.product(check.transports, check.ops, node_counts):
        if op in PAIR_OPS and nodes > PAIR_RANKS:
            continue
        if not named and transport in partition.commbench.expect_unsupported:  # the default, not offered here
            continue
        per_node = PAIR_RANKS // nodes if op in PAIR_OPS else check.tasks_per_node or partition.commbench.tasks_per_node
        yield op, nodes, per_node, check.variables(transport)


def _resolve(spec: CampaignSpec, path: Path, site: Site,
             site_loc: Loc) -> tuple[Campaign | None, list[tuple[Loc, str]]]:
    system_name, _, partition_name = (spec.system or "").partition(":")
    if not system_name:
        if len(site.systems) > 1:
            names = ", ".join(s.name for s in site.systems)
            return None, [(("system",), f"site {site.name!r} has several systems ({names}); name one")]
        system_name = site.systems[0].name
    try:
        system = site.system(system_name)
    except KeyError:
        names = ", ".join(s.name for s in site.systems)
        return None, [(("system",), f"site {site.name!r} has no system {system_name!r} (it has: {names})")]
    if partition_name:
        try:
            partitions = [system.partition(partition_name)]
        except KeyError:
            names = ", ".join(p.name for p in system.partitions)
            return None, [(("system",), f"system {system.name!r} of site {site.name!r} has no partition "
                                        f"{partition_name!r} (it has: {names})")]
    else:
        partitions = list(system.partitions)
    problems: list[tuple[Loc, str]] = []
    missing = [p.name for p in partitions if p.commbench is None]
    if partition_name and missing:
        problems.append((("system",), f"partition {system.name}:{partition_name} has no commbench data in "
                                      f"site {site.name!r}"))
    partitions = [p for p in partitions if p.commbench is not None]
    if not partitions and not problems:
        problems.append((site_loc, f"no partition of {site.name}:{system.name} runs commbench"))
    offered = sorted({env for p in partitions for env in p.environments})
    excluded = {e.name for e in site.environments if not campaign_runs_in(e)}
    for index, env in enumerate(spec.environments or []):
        if env not in offered:
            problems.append((("environments", index), f"{env!r} is not an environment of "
                                                      f"{site.name}:{system.name} (it has: {', '.join(offered)})"))
        elif env in excluded:
            features = next(e.features for e in site.environments if e.name == env)
            problems.append((("environments", index),
                             f"{env!r} (features {features}) is not one the campaign checks run in: they select "
                             f"{CAMPAIGN_ENVIRONS!r} (valid_prog_environs)"))
    offered = [env for env in offered if env not in excluded]  # the default: those the checks accept
    for index, nodes in enumerate(spec.node_counts or []):
        for partition in partitions:
            if nodes > partition.nodes:
                problems.append((("node_counts", index),
                                 f"{nodes} nodes requested, but partition {system.name}:{partition.name} of site "
                                 f"{site.name!r} has {partition.nodes}"))
    for partition in partitions:
        if spec.max_nodes is not None and spec.max_nodes > partition.nodes:
            problems.append((("max_nodes",), f"{spec.max_nodes} nodes requested, but partition "
                                             f"{system.name}:{partition.name} of site {site.name!r} has "
                                             f"{partition.nodes}"))
        if spec.placements != ["any"] and partition.scheduler not in SLURM_SCHEDULERS:
            problems.append((("placements",), f"placements other than 'any' need Slurm; partition "
                                              f"{system.name}:{partition.name} uses {partition.scheduler!r}"))
    for index, check in enumerate(spec.checks):
        try:  # what the check would refuse in setup (reframe_checks/lib/commcamp_checks.py)
            site.knob_catalog().check_job_env(check.env)
        except (CatalogError, UnsafeValueError) as exc:
            problems.append((("checks", index, "env"), str(exc)))
        if isinstance(check, ReferenceCheckSpec):
            problems += _reference_problems(check, index, partitions, spec.nodes, system, site)
            continue
        if transport_problems := _transport_problems(check, index, partitions, spec.nodes, system, site):
            problems += transport_problems
            continue
        # an op that runs at none of the campaign's node counts would be dropped without a word (_runs)
        runs = {run[0] for partition in partitions for run in _runs(check, partition, spec.nodes)}
        problems += [(("checks", index, "ops", number),
                      f"{op} has no test case: a pair op runs {PAIR_RANKS} ranks, on 1 or {PAIR_RANKS} nodes only; "
                      f"the campaign's node counts are {spec.nodes}" if op in PAIR_OPS and min(spec.nodes) > PAIR_RANKS
                      else f"{op} has no test case: the default transport(s) {check.transports} are listed under "
                           f"expect_unsupported by every partition; name the transports")
                     for number, op in enumerate(check.ops) if partitions and op not in runs]  # else said above
    isolation_env = spec.health.isolation.environ if spec.health else None
    if isolation_env is not None and isolation_env not in (spec.environments or offered):
        problems.append((("health", "isolation", "environ"), f"{isolation_env!r} is not an environment of "
                                                             f"this campaign"))
    if problems:
        return None, problems
    campaign = Campaign(spec=spec, path=path, site=site, system=system, partitions=tuple(partitions),
                        environments=tuple(spec.environments or offered))
    problems = _repeated_cases(campaign)
    return (None, problems) if problems else (campaign, [])


def _repeated_cases(campaign: Campaign) -> list[tuple[Loc, str]]:
    """A check whose test case an earlier check already runs: one run key would name two measurements (the
    store keeps one, a resumed campaign skips the other)."""
    problems: list[tuple[Loc, str]] = []
    first_check: dict[str, int] = {}
    for index, check in enumerate(campaign.spec.checks):
        for case in campaign.check_cases(check):
            first = first_check.setdefault(case.run_key, index)
            if first != index:
                problems.append((("checks", index), f"runs a test case checks[{first}] runs too ({case.check} "
                                                    f"{case.op} on {case.num_nodes} node(s), {case.partition}, "
                                                    f"{case.environ}, transport {case.transport}, same settings): "
                                                    f"remove one or change a setting"))
                break
    return problems


def _transport_problems(check: CommbenchCheckSpec, index: int, partitions: list[Partition], nodes: list[int],
                        system: System, site: Site) -> list[tuple[Loc, str]]:
    """What commbench_run would skip (reframe_checks/lib/commbench_tests.py set_layout) or only see answered
    `unsupported`: a transport a partition does not offer, or lists under expect_unsupported (when named;
    the default transport is left out there, _runs), an op the transport lacks (vocabulary.json), a
    single-node transport on more than one node."""
    problems: list[tuple[Loc, str]] = []
    named = "transports" in check.model_fields_set
    for number, transport in enumerate(check.transports):
        loc: Loc = ("checks", index, "transports", number) if named else ("checks", index)
        for partition in partitions:
            assert partition.commbench is not None
            where = f"partition {system.name}:{partition.name} of site {site.name!r}"
            offered_transports = partition.commbench.transports or ["mpi"]
            if transport not in offered_transports:
                problems.append((loc, f"transport {transport!r} is not offered by {where} (it has: "
                                      f"{', '.join(offered_transports)})"))
            elif named and transport in partition.commbench.expect_unsupported:
                problems.append((loc, f"transport {transport!r} is listed under expect_unsupported by {where}: "
                                      f"{partition.commbench.expect_unsupported[transport]}"))
        if transport not in TRANSPORT_OPS:
            continue
        if transport in SINGLE_NODE_TRANSPORTS and any(n > 1 for n in nodes):
            problems.append((loc, f"transport {transport!r} connects the ranks of one node only; the campaign's node "
                                  f"counts are {nodes} (run it in a campaign of node_counts [1])"))
        for op_number, op in enumerate(check.ops):
            if op not in TRANSPORT_OPS[transport]:
                problems.append((("checks", index, "ops", op_number),
                                 f"transport {transport!r} has no op {op} (it has: "
                                 f"{', '.join(TRANSPORT_OPS[transport])})"))
    return problems


def _reference_problems(check: ReferenceCheckSpec, index: int, partitions: list[Partition], nodes: list[int],
                        system: System, site: Site) -> list[tuple[Loc, str]]:
    """A reference check whose suite no partition of the campaign offers, a benchmark of it that would
    run nowhere (no offered node count among the campaign's)."""
    suite = check.suite
    offering = [p for p in partitions if suite in p.reference_benchmarks]
    if not partitions:  # said already: no partition runs commbench
        return []
    if not offering:
        names = ", ".join(f"{system.name}:{p.name}" for p in partitions)
        return [(("checks", index, "check"), f"{check.check} runs the site's {suite} binaries, but partition(s) "
                                             f"{names} of site {site.name!r} have no reference_benchmarks.{suite} "
                                             f"in site.yaml")]
    runs = {run[0] for partition in offering for run in _runs(check, partition, nodes)}
    offered = "; ".join(f"{system.name}:{p.name} {p.reference_benchmarks[suite].node_counts}" for p in offering)
    pair = REFERENCE_CHECKS[check.check].pair
    return [(("checks", index, "benchmarks", number),
             f"{benchmark} has no test case: site {site.name!r} runs {suite} on node counts {offered} "
             f"(reference_benchmarks.{suite}.node_counts), the campaign asks for {nodes}"
             + (f"; {benchmark} runs on 1 or 2 nodes only" if benchmark in pair else ""))
            for number, benchmark in enumerate(check.benchmarks) if benchmark not in runs]


def load_campaign(path: Path, site_override: str | None = None) -> Campaign:
    """Read, validate and resolve a campaign spec; `site_override` replaces its `site`.

    Raises SpecError (every problem, each with file, line and field path). Reads only."""
    try:
        document = YamlDocument(Path(path))
        spec = document.validate(CampaignSpec)
    except YamlModelError as exc:
        raise SpecError(str(exc)) from None
    site_name = site_override or spec.site
    site_loc: Loc = () if site_override else ("site",)
    try:
        site = load_site(site_name)
    except SiteError as exc:
        where = "--site" if site_override else document.problem(site_loc, "").rstrip(": ")
        raise SpecError(f"{where}: {exc}") from None
    if site_override:
        spec = spec.model_copy(update={"site": site_override})
    campaign, problems = _resolve(spec, Path(path), site, site_loc)
    if campaign is None:
        raise SpecError(str(document.error(problems)))
    return campaign
