"""The tuning spec (`commcamp tune SPEC.yaml` or its options): scope, knobs, budget, finalization, the
per-size stage, outputs; and what the spec's site says (its partition, environment variables, knob
overrides)."""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from campaigns import paths
from campaigns.model.sizes import check_measurable, parse_size
from campaigns.model.yamlio import YamlModel
from campaigns.tuning.executors import BenchRequest
from tuners.catalog import CatalogError, KnobCatalog, Library
from tuners.finalize import Thresholds
from tuners.study import SamplerName


# ------------------------------------------------------------------------------------------- the spec


class FinalizeSpec(YamlModel):
    """Finalization (tuners/finalize.py): re-measure the best candidates interleaved with the baseline."""

    enabled: bool = True
    candidates: int = Field(default=2, ge=1, le=6, description="k best distinct settings re-measured")
    max_candidates: int | None = Field(default=None, ge=1, description=(
        "cap on all candidates: the k best, then each size bucket's best, then the simplified best"))
    alpha: float = Field(default=0.01, gt=0, lt=0.5, description=(
        "family-wise: Holm over all tests of a finalization (candidates x (overall + each size bucket))"))
    min_effect: float = Field(default=0.03, ge=0, le=1, description="smallest speed-up a change needs (1: 2x)")
    rounds: int = Field(default=Thresholds().rounds, ge=2, description=(
        "maximum of the group-sequential phase (tuners/finalize.py); raised to what the family needs"))

    never_slower: bool = Field(default=True, description=(
        "refuse a global winner that is slower than the site's defaults in any size bucket (the environment is "
        "process-wide); off only when per-size rules deployed with it restore those sizes"))

    @model_validator(mode="after")
    def _cap(self) -> FinalizeSpec:
        if self.max_candidates is not None and self.max_candidates < self.candidates:
            raise ValueError(f"max_candidates ({self.max_candidates}) is below candidates ({self.candidates}): the "
                             "cap on all candidates would cut the k best")
        return self

    def thresholds(self) -> Thresholds:
        return Thresholds(alpha=self.alpha, min_effect=self.min_effect, rounds=self.rounds,
                          never_slower=self.never_slower)


class PerSizeSpec(YamlModel):
    """The per-size stage (tuners/per_size.py) after finalization, under the recommended environment."""

    enabled: bool = False
    top: int = Field(default=3, ge=1, description="candidates per size, picked on the sweep's even rounds")
    rounds: int = Field(default=0, ge=0, description="sweep rounds; 0: the fewest with which a change is possible")
    time_limit_s: int = Field(default=600, ge=10, description="the sweep run's hard limit")
    stop_slower: float = Field(default=2.0, description="a selection that took at least this many times the "
                               "library's own choice's time in all but at most one of the sweep's first stop_after "
                               "even-indexed (selection) rounds runs no further rounds (no candidate); 0: every "
                               "selection runs every round")
    stop_after: int = Field(default=4, ge=3, le=5000, description="the even rounds that judge stop_slower (0, 2, ..., "
                            "2 x stop_after - 2); a sweep of fewer than 2 x stop_after rounds stops nothing")

    @field_validator("stop_slower")
    @classmethod
    def _stop_factor(cls, value: float) -> float:
        if value != 0 and not 1 <= value <= 1e6:
            raise ValueError(f"{value} is neither 0 (off) nor a factor in [1, 1e6]")
        return value


class TuningSpec(YamlModel):
    """One tuning study: where and what commbench measures, which knobs, the budget, the outputs.
    YAML (`commcamp tune SPEC.yaml`) or CLI options (`commcamp tune --site ... --op ...`)."""

    site: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
    system: str = Field(description="system:partition, or a system of one partition (ReFrame executor: a "
                                    "partition of the site)")
    environ: str = Field(default="openmpi", description="programming environment (ReFrame) / MPI of the binary")
    library: Library
    library_version: str | None = Field(default=None, description="None: read from a probe run's records")
    op: str
    transport: Literal["mpi", "ccl"] = "mpi"
    nodes: int = Field(default=1, ge=1)
    tasks_per_node: int = Field(default=2, ge=1)
    gpus_per_node: int = Field(default=1, ge=1, description="the scope's GPUs per node (1 on CPU partitions)")
    sizes: list[int] = Field(min_length=1)
    sizes_per_bucket: int = Field(default=2, ge=1)
    warmup: int = Field(default=2, ge=0)
    iters: int = Field(default=10, ge=1)
    batch: int = Field(default=1, ge=1)
    bench_timeout_s: int = Field(default=60, ge=1)
    time_limit_s: int = Field(default=300, ge=10)
    queue_wait_s: int = Field(default=1800, ge=60, description=(
        "ReFrame executor: how long a trial's job may wait in the queue (and the first trial build commbench) "
        "beyond time_limit_s before the tune stops without charging the setting"))
    knobs: list[str] | None = Field(default=None, description="None: every catalog knob that applies")
    knob_overrides: list[Path] = Field(default=[], description="more knob override files (defaults, pins)")
    unverifiable_knobs: list[str] = Field(default=[], description="knobs exempt from the read-log check")
    trials: int | None = Field(default=20, ge=1)
    budget_s: float | None = Field(default=None, gt=0, description="wall-time budget of the trial phase")
    sampler: SamplerName = SamplerName.TPE
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1, description=(
        "seed of the search (the screen's order, the sampler); None: the screen's order drawn once for each new "
        "study and kept in it (study attribute screen_seed, printed), the sampler unseeded. A fixed default would "
        "give every site's study of one knob space the same order: the sampler benchmark's per-seed figures are "
        "draws of this; 0 .. 2**32 - 1, what numpy's seeding takes"))
    n_startup_trials: int = Field(default=4, ge=1)
    screen_trials: int = Field(default=16, ge=0, description=(
        "first proposals: single-knob changes of the best starting point, in later rounds of the fastest point "
        "of the earlier ones (tuners/screen.py); 0 = none"))
    seed_library_defaults: bool = Field(default=True, description="trial 1 = every searched knob unset")
    documented_seeds: bool = Field(default=True, description=(
        "measure the site's documented settings (site.yaml knobs.documented) after the seeds"))
    warm_start: bool = Field(default=True, description=(
        "enqueue the winners published for the same site, system, library, op, transport and GPUs per node "
        "at any node count, this one included (marked warm_start), after the seeds"))
    executor: Literal["reframe", "launcher"] = "reframe"
    launcher: list[str] | None = Field(default=None, description="launcher executor: command before commbench")
    commbench: Path | None = Field(default=None, description="launcher executor: the binary")
    db: str | None = Field(default=None, description="Optuna storage URL (default: the results database)")
    study: str | None = Field(default=None, min_length=1, description=(
        "study name (default: the scope's name + the executor and a digest of the knobs and knob files)"))
    heartbeat_s: int = Field(default=60, ge=1, description="a worker's trial is lost after 2 heartbeats of silence")
    finalize: FinalizeSpec = FinalizeSpec()
    per_size: PerSizeSpec = PerSizeSpec()
    publish_dir: Path | None = Field(default_factory=paths.recommendations_dir, description="None: do not publish")
    plugin_library: Path | None = None
    runs_dir: Path = Field(default_factory=paths.runs_dir)

    @field_validator("sizes", mode="before")
    @classmethod
    def _sizes(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list):
            return value
        parsed = [parse_size(v) for v in value]
        if repeated := sorted({size for size in parsed if parsed.count(size) > 1}):
            raise ValueError(f"repeated sizes {repeated} (64K and 65536 are one size)")
        sizes = sorted(parsed)
        check_measurable(sizes)
        return sizes

    @model_validator(mode="before")
    @classmethod
    def _partition(cls, data: Any) -> Any:
        """`system` without `:partition` names the system's only partition (the site's site.yaml)."""
        if isinstance(data, dict) and isinstance(data.get("system"), str) and ":" not in data["system"] \
                and isinstance(data.get("site"), str):
            return {**data, "system": only_partition(data["site"], data["system"])}
        return data

    @field_validator("knob_overrides", "commbench", "publish_dir", "plugin_library", "runs_dir")
    @classmethod
    def _absolute(cls, value: Any) -> Any:
        """Paths typed relative to where commcamp starts: the launch runs in its run directory, a Slurm worker in
        its own, ReFrame under its prefix, where a relative path meant something else (every trial failed)."""
        if isinstance(value, list):
            return [path.absolute() for path in value]
        return value.absolute() if isinstance(value, Path) else value

    @field_validator("launcher")
    @classmethod
    def _launcher_program(cls, value: list[str] | None) -> list[str] | None:
        """A launcher program given as a relative path (./srun-wrapper), as the paths above; one given by name is
        looked up on PATH as typed."""
        if value and "/" in value[0] and not value[0].startswith("/"):
            return [str(Path(value[0]).absolute()), *value[1:]]
        return value

    @field_validator("knobs", "unverifiable_knobs")
    @classmethod
    def _knob_list(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if value is None:
            return value
        if not value and info.field_name == "knobs":
            raise ValueError("an empty list searches no knob; leave `knobs` out to search every catalog knob "
                             "that applies")
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} named twice")
        return value

    @field_validator("op")
    @classmethod
    def _op(cls, value: str) -> str:
        from campaigns.model.site import ALL_OPS

        if value not in ALL_OPS:
            raise ValueError(f"{value!r} is not a commbench op (one of: {', '.join(ALL_OPS)})")
        return value

    @field_validator("system")
    @classmethod
    def _system_partition(cls, value: str) -> str:
        if ":" not in value:
            raise ValueError(f"{value!r} must be system:partition (or a system of site.yaml with one partition)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TuningSpec:
        if self.trials is None and self.budget_s is None:
            raise ValueError("give a budget: trials and/or budget_s")
        if self.executor == "reframe" and self.transport != "mpi":
            raise ValueError("the ReFrame commbench check runs transport mpi; use the launcher executor for ccl")
        if self.executor == "launcher" and self.launcher is None:
            raise ValueError("the launcher executor needs `launcher` (e.g. [mpirun, -np, '4'])")
        if not self.finalize.never_slower and not self.per_size.enabled:
            raise ValueError("finalize: never_slower: false lets an environment slower at some sizes through for "
                             "per-size rules to restore them: it needs the per-size stage (per_size: {enabled: true})")
        return self

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    def request(self) -> BenchRequest:
        return BenchRequest(self.op, self.transport, tuple(self.sizes), self.warmup, self.iters, self.batch,
                            self.bench_timeout_s, self.time_limit_s, ranks=self.ranks)

    def storage_url(self) -> str:
        from campaigns.store import default_url  # lazily: the store pulls in alembic

        return self.db or default_url()


def load_spec(path: Path, **overrides: Any) -> TuningSpec:
    from campaigns.model.yamlio import YamlDocument, YamlModelError

    try:
        document = YamlDocument(Path(path))
        spec = document.validate(TuningSpec)
    except YamlModelError as exc:
        raise ValueError(str(exc)) from None
    return spec.model_copy(update={k: v for k, v in overrides.items() if v is not None}) if overrides else spec


def site_catalog(spec: TuningSpec) -> tuple[KnobCatalog, list[str]]:
    """The site's catalog (site_knob_catalog) with the spec's override files applied in order; also the files
    used."""
    catalog, files = site_knob_catalog(spec.site)
    for path in (Path(p) for p in spec.knob_overrides):
        if not path.is_file():  # the spec's paths are absolute by now: a relative one was taken from the cwd
            raise ValueError(f"knob_overrides: {path} is not a file (a relative path is read from the directory "
                             "commcamp starts in)")
        catalog = _with_override_file(catalog, path, may_be_empty=False)
        files.append(str(path))
    return catalog, files


def site_knob_catalog(site_name: str, *, unknown_is_base: bool = False) -> tuple[KnobCatalog, list[str]]:
    """The base catalog with the site's knob overrides (the `knobs:` of its site.yaml, or
    site_configs/knobs/<site>.yaml for a site without one); also the files used. ValueError for an unknown site,
    unless `unknown_is_base` (recommend: a site known only by what it published): the base catalog."""
    from campaigns.model.site import find_site_file

    if unknown_is_base and find_site_file(site_name) is None and not (paths.KNOBS_DIR / f"{site_name}.yaml").is_file():
        return KnobCatalog.load(), []
    site = _site(site_name)
    if site is not None:
        try:
            catalog = site.knob_catalog()
        except CatalogError as exc:
            raise ValueError(str(exc)) from None
        return catalog, [str(site.directory / "site.yaml")] if site.knobs else []
    path = paths.KNOBS_DIR / f"{site_name}.yaml"
    return _with_override_file(KnobCatalog.load(), path, may_be_empty=True), [str(path)]


def _with_override_file(catalog: KnobCatalog, path: Path, *, may_be_empty: bool) -> KnobCatalog:
    """`catalog` with the knob override file `path`; `may_be_empty`: a site's own knob file of comments only ("no
    overrides yet") overrides nothing, where a file a spec names to override nothing is a mistake."""
    from campaigns.model.yamlio import YamlDocument

    # YamlModelError (a ValueError) names the file and line; duplicate keys are refused
    document = YamlDocument(path)
    if document.data is None and not may_be_empty:
        raise ValueError(f"{path}: the knob override file is empty (it holds the `knobs:` sections: defaults, "
                         "pinned, forbidden, restrict, documented, unset_equals, inert_unless_set)")
    try:
        return catalog.for_site(document.data if document.data is not None else {}, str(path))
    except CatalogError as exc:  # an override file is the `knobs:` mapping itself
        raise ValueError(document.with_line(str(exc), ("knobs",))) from None


# --------------------------------------------------------------------------------------- the spec's site
def _site(name: str) -> Any:
    """The site (campaigns.model.site.Site), or None for a site known only by its knob file
    (site_configs/knobs/<site>.yaml); ValueError for an unknown site or a site.yaml with problems."""
    from campaigns.model.site import SiteError, find_site_file, load_site

    if find_site_file(name) is None and (paths.KNOBS_DIR / f"{name}.yaml").is_file():
        return None
    try:
        return load_site(name)
    except SiteError as exc:  # an unknown site is the spec's `site:`; a broken site.yaml names its own file
        raise ValueError(f"site: {exc}" if find_site_file(name) is None else str(exc)) from None


def site_partition(spec: TuningSpec) -> tuple[Any, dict[str, str]] | None:
    """The spec's partition of its site.yaml and the variables the site sets for its jobs (partition
    and environment env_vars, e.g. SLURM_MPI_TYPE, UCX_TLS); None for a site without site.yaml.
    ValueError when the site has no such system, partition or environment there."""
    site = _site(spec.site)
    if site is None:
        return None
    system_name, _, partition_name = spec.system.partition(":")
    try:
        system = site.system(system_name)
        partition = system.partition(partition_name)
    except KeyError:
        systems = ", ".join(f"{s.name}:{p.name}" for s in site.systems for p in s.partitions)
        raise ValueError(f"system: site {site.name!r} has no system:partition {spec.system!r} (it has: "
                         f"{systems})") from None
    if spec.environ not in partition.environments:  # "FIELD: ..." names the spec file's line (cli.tune)
        raise ValueError(f"environ: {spec.environ!r} is not an environment of {spec.system} "
                         f"(it has: {', '.join(partition.environments)})")
    environment = site.environment(spec.environ)
    # an MPI tune in another MPI's environment measured that MPI (its trials "did not read" every knob) and
    # published the result under the tuned library's scope
    runs = _ENVIRONMENT_MPI.get(str(spec.library))
    if runs is not None and environment.mpi not in (*runs, "other"):
        ofs = [name for name in partition.environments if site.environment(name).mpi in runs]
        raise ValueError(f"environ: {spec.environ!r} is an environment of {environment.mpi}, not of library "
                         f"{spec.library} (its environments on {spec.system}: {', '.join(ofs) or 'none'})")
    return partition, {**partition.env_vars, **environment.env_vars}


def environment_mpi(spec: TuningSpec) -> str | None:
    """The site.yaml `mpi` of the spec's environment (the MPI every trial launches under); None without site.yaml."""
    site = _site(spec.site)
    return None if site is None else site.environment(spec.environ).mpi


# The site.yaml `mpi` of the environments an MPI library's tune runs in
_ENVIRONMENT_MPI = {"openmpi": ("openmpi",), "mpich": ("mpich", "cray-mpich"), "cray-mpich": ("cray-mpich",)}


def check_partition_size(spec: TuningSpec) -> None:
    """ValueError when the scope asks for more nodes or GPUs per node than the site's partition has, whatever
    the executor (a launcher command does not place ranks on nodes the site lacks; the published scope would
    claim them). Not for pretune: its allocation decides."""
    found = site_partition(spec)
    if found is None:
        return
    partition = found[0]
    where = f"partition {spec.system} of site {spec.site!r}"
    if spec.nodes > partition.nodes:
        raise ValueError(f"nodes: {spec.nodes} nodes requested, but {where} has {partition.nodes}")
    if spec.gpus_per_node > max(1, partition.node.gpus):  # 1 is the scope's value on CPU partitions
        raise ValueError(f"gpus_per_node: {spec.gpus_per_node} GPUs per node requested, but {where} has "
                         f"{partition.node.gpus}")


def only_partition(site_name: str, system_name: str) -> str:
    """system:partition for a system of one partition; `system_name` unchanged where the site or system
    is unknown (reported later, with what there is); ValueError when the system has several partitions."""
    from campaigns.model.site import SiteError, load_site

    try:
        system = load_site(site_name).system(system_name)
    except (SiteError, KeyError):
        return system_name
    if len(system.partitions) > 1:
        raise ValueError(f"system {system_name!r} of site {site_name!r} has partitions "
                         f"{', '.join(p.name for p in system.partitions)}: give system:partition")
    return f"{system_name}:{system.partitions[0].name}"


def site_env(spec: TuningSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """What the site environment exports for its jobs, minus commcamp's launcher selector, each value as the job
    script's shell makes it: ReFrame writes `export NAME=VALUE` lines, so quotes, $NAME, ${NAME:-default} and
    escapes mean what they mean to bash (evaluated by bash, against `environ` and the lines before). A launch
    without ReFrame gets no shell: NCCL_NET='"AWS Libfabric"' reached NCCL with its quotes, and
    LD_LIBRARY_PATH=$X/lib:$LD_LIBRARY_PATH replaced the caller's path. ValueError when bash refuses the lines."""
    found = site_partition(spec)
    items = {} if found is None else {k: v for k, v in found[1].items() if k != "COMMCAMP_MPIEXEC"}
    if not items:
        return {}
    # bash builtins only (no PATH needed): each value, NUL-terminated, in the order of the names
    script = "".join(f"export {name}={value}\n" for name, value in items.items()) + "".join(
        f"printf '%s\\0' \"${{{name}}}\"\n" for name in items)
    bash = shutil.which("bash") or "/bin/bash"
    try:
        out = subprocess.run([bash, "-c", script], env=dict(environ), capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"cannot evaluate the site's env_vars with {bash}: {exc}") from None
    values = out.stdout.split("\0")[:-1]
    if out.returncode != 0 or len(values) != len(items):
        raise ValueError(f"site {spec.site!r}: its env_vars for {spec.system} / {spec.environ} do not evaluate as a "
                         f"job script's export lines: {' '.join(out.stderr.split()) or f'exit {out.returncode}'}")
    return dict(zip(items, values, strict=True))
