"""Turn a site's data file (site_configs/<site>/site.yaml) into a ReFrame configuration.

Each `site_configs/<site>/reframe_config.py` is `site_configuration_for(__file__)` (its site.yaml).
This module needs only ReFrame and PyYAML (both in any ReFrame install), so a site can point its own
ReFrame at the file (a site.yaml message size with units, `1MiB`, is read by commcamp's rule,
campaigns.model.sizes, imported only then). The strict validation of site.yaml lives in commcamp
(campaigns/model/site.py; `commcamp site check`), which refuses what this module would pass on wrong (a
number written as a string); here the data is only reshaped:

* each partition's check-relevant data goes into its ReFrame `extras`, which checks read as
  `self.current_partition.extras` (checks never hard-code site specifics): `nodes`, `cores_per_node`,
  `gpus_per_node`, `commbench` (the site.yaml block as it is: backend, build, transports, sizes,
  node counts, launcher/job options, references; but every message size in bytes: site.yaml may write
  `1MiB`, which commbench does not read), `reference_benchmarks` and `knob_defaults` (the site's
  `knobs.defaults`, applied under each check's env_vars);
* features say what a partition runs, so that checks select with `valid_systems` instead of skipping:
  `commbench`, `commbench_<transport>` per transport, `commbench_nodes_<n>` per suite node count, and
  `<benchmark>` / `<benchmark>_nodes_<n>` per reference benchmark (`nccl_tests`, `osu`);
* the site's pinned knobs (`knobs.pinned`) are added to every partition's env_vars: in every job;
* every environment gets the extras `mpi` (library family) and the features listed in site.yaml;
* stage, output and perflog directories default to runs/reframe/ of commcamp's workspace ($COMMCAMP_HOME;
  from a checkout without it: its results/) and the run report to runs/reframe/reports/ there (git-ignored
  in a checkout); `--prefix`/`--report-file` override;
* perflogs (filelog) go to one continuous file per system, partition and check under reframe/perflogs/
  of the workspace (git-ignored), whatever the `--prefix` (`--perflogdir` overrides; commcamp points it
  beside its runs directory), and carry what users miss in ReFrame's default ones: node count, tasks,
  GPUs per node, pass/fail, the transport, the message size each performance variable was taken at
  (`metric_bytes`), and per performance variable its value, unit, reference (None where no reference
  applies, not ReFrame's 0) and thresholds.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml
from reframe.core.backends import getlauncher, register_launcher
from reframe.core.exceptions import ConfigError
from reframe.core.launchers import JobLauncher

# commcamp sets both variables for the ReFrame it starts (campaigns/paths.py: the shipped folders and the
# workspace); a ReFrame started by hand finds the workspace as commcamp does where commcamp is importable (an
# installed one: never its install tree), else (a checkout's ReFrame without it) the checkout's results/.
DATA_ROOT = Path(os.environ.get("COMMCAMP_DATA") or Path(__file__).resolve().parents[1])


def _workspace() -> Path:
    if os.environ.get("COMMCAMP_HOME"):
        return Path(os.environ["COMMCAMP_HOME"]).expanduser()
    try:
        from campaigns import paths
    except ImportError:
        return DATA_ROOT / "results"
    return paths.workspace()


DEFAULT_PREFIX = _workspace() / "runs" / "reframe"
PERFLOG_DIR = _workspace() / "reframe" / "perflogs"

MPIEXEC_FROM_ENV = "mpiexec-from-env"
MPIEXEC_VARIABLE = "COMMCAMP_MPIEXEC"

PERFLOG_FORMAT = "|".join([
    "%(check_job_completion_time)s", "%(version)s", "%(check_display_name)s", "%(check_system)s",
    "%(check_partition)s", "%(check_environ)s", "%(check_result)s", "%(check_num_nodes)s",
    "%(check_num_tasks)s", "%(check_num_tasks_per_node)s", "%(check_num_gpus_per_node)s",
    "%(check_transport)s", "%(check_jobid)s", "%(check_job_nodelist)s", "%(check_metric_bytes)s",
    "%(check_perfvalues)s",
])
# One block per performance variable; the header names them <variable>_value, <variable>_unit, ...
PERFLOG_FORMAT_PERFVARS = "|".join([
    "%(check_perf_value)s", "%(check_perf_unit)s", "%(check_perf_ref)s", "%(check_perf_lower_thres)s",
    "%(check_perf_upper_thres)s", "%(check_perf_result)s",
]) + "|"


class MpiexecFromEnvLauncher(JobLauncher):
    """`"$COMMCAMP_MPIEXEC" -n <tasks>`: the programming environment names its MPI's launcher.

    A ReFrame partition has one launcher for all its environments, but on a plain machine each MPI
    must be started by its own mpiexec (Open MPI's `mpirun.openmpi`, MPICH's `mpiexec.mpich`; the
    `mpiexec` on PATH is whichever Debian's alternatives chose). Deferring the choice to a variable
    that each environment exports keeps one partition and leaves the MPI-specific settings in the
    environments, where they belong.
    """

    def command(self, job: Any) -> list[str]:
        return [f'"${{{MPIEXEC_VARIABLE}:?the programming environment must set {MPIEXEC_VARIABLE}}}"',
                "-n", str(job.num_tasks)]


def _register_launchers() -> None:
    # ReFrame may import a configuration file more than once in one process.
    try:
        getlauncher(MPIEXEC_FROM_ENV)
    except ConfigError:
        register_launcher(MPIEXEC_FROM_ENV)(MpiexecFromEnvLauncher)


def _pairs(mapping: dict[str, Any] | None) -> list[list[str]]:
    return [[name, _text(value)] for name, value in (mapping or {}).items()]


def _text(value: Any) -> str:
    """YAML gives ints and bools where environment variables hold strings."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _bytes(value: Any) -> int:
    """A message size of site.yaml in bytes. commbench reads digits with K, M, G or T only (not `8B` or `1MiB`,
    which site.yaml may say): a size with units is read by commcamp's one rule (campaigns.model.sizes, which `commcamp
    site check` validates it by), imported only then, so that a site whose sizes are numbers needs no commcamp."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        from campaigns.model.sizes import parse_size
    except ImportError:  # a checkout's ReFrame without commcamp installed: this checkout's (as the checks do)
        sys.path.append(str(Path(__file__).resolve().parents[1]))
        try:
            from campaigns.model.sizes import parse_size
        except ImportError as exc:
            raise ConfigError(f"message size {value!r}: units need commcamp's campaigns.model.sizes ({exc}); "
                              "write the size in bytes") from None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"message size: {exc} (`commcamp site check` says where)") from None


def _size_sets(sets: dict[str, Any] | None) -> dict[str, Any]:
    """commbench.sizes with every size in bytes: `{sizes: [...]}` or `{min_bytes, max_bytes, step_factor}`."""
    return {name: {key: [_bytes(size) for size in value] if key == "sizes" and isinstance(value, list)
                   else _bytes(value) if key in ("min_bytes", "max_bytes") and value is not None else value
                   for key, value in (size_set or {}).items()}
            for name, size_set in (sets or {}).items()}


def _references(references: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """site.yaml references with their `bytes` in bytes (`1MiB` there: the checks match a record's bytes)."""
    return [{**ref, "bytes": _bytes(ref["bytes"])} if "bytes" in ref else ref for ref in references or []]


def _features(part: dict[str, Any]) -> list[str]:
    features = []
    commbench = part.get("commbench")
    if commbench:
        features.append("commbench")
        features += [f"commbench_{transport}" for transport in commbench["transports"]]
        features += [f"commbench_nodes_{n}" for n in commbench["node_counts"]]
    for name, bench in (part.get("reference_benchmarks") or {}).items():
        features.append(name)
        features += [f"{name}_nodes_{n}" for n in bench["node_counts"]]
    return features


def _partition(part: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    node = part.get("node") or {}
    extras: dict[str, Any] = {
        "nodes": part["nodes"],
        "cores_per_node": node.get("cores"),
        "gpus_per_node": node.get("gpus", 0),
        "knob_defaults": {name: _text(value) for name, value in (knobs.get("defaults") or {}).items()
                          if value is not None},
        "knob_overrides": knobs,  # the checks validate env_vars against the catalog with these
        "reference_benchmarks": {name: {**bench, "references": _references(bench.get("references"))}
                                 for name, bench in (part.get("reference_benchmarks") or {}).items()},
    }
    if part.get("commbench"):
        extras["commbench"] = {**part["commbench"], "references": _references(part["commbench"].get("references")),
                               "sizes": _size_sets(part["commbench"].get("sizes"))}
    return {
        "name": part["name"],
        "descr": part.get("description", ""),
        "scheduler": part["scheduler"],
        "launcher": part["launcher"],
        "access": list(part.get("access", [])),
        "max_jobs": part.get("max_jobs", 1),
        "environs": list(part["environments"]),
        "modules": list(part.get("modules", [])),
        "env_vars": _pairs({**(part.get("env_vars") or {}), **(knobs.get("pinned") or {})}),
        "prepare_cmds": list(part.get("prepare_cmds", [])),
        "resources": [{"name": r["name"], "options": list(r.get("options", []))} for r in part.get("resources", [])],
        "features": _features(part),
        "extras": extras,
    }


def _environment(env: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": env["name"],
        "cc": env["cc"],
        "cxx": env.get("cxx", ""),
        "ftn": env.get("ftn", ""),
        "nvcc": env.get("nvcc", ""),
        "modules": list(env.get("modules", [])),
        "env_vars": _pairs(env.get("env_vars")),
        "features": list(env.get("features", ["mpi"])),
        "extras": {"mpi": env["mpi"]},
    }


def site_configuration_for(config_file: str) -> dict[str, Any]:
    """The configuration of the site whose reframe_config.py is `config_file` (its site.yaml is beside it)."""
    return site_configuration(Path(config_file).with_name("site.yaml"))


def site_configuration(site_yaml: str | os.PathLike[str]) -> dict[str, Any]:
    """The ReFrame `site_configuration` dictionary for one site.yaml."""
    _register_launchers()
    with open(site_yaml, encoding="utf-8") as stream:
        site = yaml.safe_load(stream)
    reports = DEFAULT_PREFIX / "reports"
    return {
        "systems": [
            {
                "name": system["name"],
                "descr": system.get("description", ""),
                "hostnames": list(system["hostnames"]),
                "modules_system": system.get("modules_system", "nomod"),
                "prefix": str(DEFAULT_PREFIX),
                "partitions": [_partition(part, site.get("knobs") or {}) for part in system["partitions"]],
            }
            for system in site["systems"]
        ],
        "environments": [_environment(env) for env in site["environments"]],
        "logging": [{
            "handlers": [
                {"type": "stream", "name": "stdout", "level": "info", "format": "%(message)s"},
                # Debug log: rfm-*.log in $TMPDIR (commcamp points TMPDIR into its run directory).
                {"type": "file", "level": "debug2",
                 "format": "[%(asctime)s] %(levelname)s: %(check_info)s: %(message)s"},
            ],
            "handlers_perflog": [{
                "type": "filelog",
                "basedir": str(PERFLOG_DIR),
                "prefix": "%(check_system)s/%(check_partition)s",
                "level": "info",
                "format": PERFLOG_FORMAT,
                "format_perfvars": PERFLOG_FORMAT_PERFVARS,
                "datefmt": "%FT%T%:z",
                "append": True,
            }],
        }],
        "general": [{
            "report_file": str(reports / "run-report-{sessionid}.json"),
            "check_search_path": [str(DATA_ROOT / "reframe_checks")],
        }],
    }
