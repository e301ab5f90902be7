"""Recommendation files under <root>/<site>/<system>/, all written atomically:

- <scope slug>.env          sourceable: `export NAME='value'` / `unset NAME`, evidence in comments
- modulefiles/commcamp/<system>_<scope slug>.lua   Lmod modulefile (`module load commcamp/<system>_<slug>`:
  the system in the name, so the modules of two systems in one MODULEPATH do not collide)
- nccl_tuner_<partition>_<library>-<version>_<transport>.conf   tuner-plugin rows of the scopes of one
  partition, library version and transport (every op and node count: the rows name them; tuner_config_name)
- <scope slug>.coll_tuned_rules   Open MPI scopes with per-size changes: coll_tuned dynamic rules
- <scope slug>.mpich_coll.json    MPICH scopes with per-size changes: collective selection JSON
- recommendations.yaml      machine-readable: every scope's values, gain, CI, trials, date, versions

Every value is validated against the knob catalog (and the character whitelist) right before it
is written; a bad value raises before any file changes. A scope's files are published together
(write_files): a failure before the renames (a directory that cannot be made, a full disk) changes none.
A job gets what the trials ran: the .env, the modulefile and `recommend` also unset the knobs the trials ran
without (`cleared`). A rule file or tuner config no scope points at any more is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import tempfile
import textwrap
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from campaigns.model.yamlio import YamlDocument, YamlModelError
from tuners import rule_files
from tuners.catalog import (RUNS_OVER, KnobCatalog, Library, UnsafeValueError, check_env_name, check_safe_value,
                            with_aliases)
from tuners.per_size import format_config, parse_config
from tuners.recommendation import Gain, HeldOut, Recommendation, RecommendationFile
from tuners.scope import StudyScope

RECOMMENDATIONS_FILE = "recommendations.yaml"
MODULE_FAMILY = "commcamp"
PLUGIN_ENV = ("NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE")
TUNER_CONFIG_STEM = "nccl_tuner"  # tuner_config_name
RULE_FILE_SUFFIX = {"openmpi": ".coll_tuned_rules", "mpich": ".mpich_coll.json"}  # rule_file, per library
_COMMENT_CHARS = re.compile(r"[^ -~]")  # printable ASCII only: no newline can end a comment early
_COMMENT_MAX = 200  # NCCL's example plugin reads 256-byte lines; a longer comment would spill


def new_file_mode() -> int:
    """The mode open() gives a new file here: 0666 less this process's umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_target(path: Path) -> Path:
    """The file a write to `path` replaces: `path` itself, or, where it is a symbolic link, the file the link leads
    to (written atomically in that file's directory; the link stays a link). OSError naming `path` when that exists
    and is not a regular file (a directory, a device such as /dev/full, a FIFO, a socket): never replaced by one;
    nor is an SQLite database or its -wal/-shm/-journal file (`report -o commcamp.db` replaced the results store)."""
    try:
        target = path.resolve() if path.is_symlink() else path
    except (RuntimeError, OSError):  # a symlink loop (RuntimeError up to Python 3.12)
        raise OSError(errno.ELOOP, "is a symbolic link that leads nowhere (a loop)", str(path)) from None
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if target.exists() and not target.is_file():
        raise OSError(errno.EINVAL, "exists and is not a regular file (a device, FIFO or socket): it is not "
                                    "replaced by one", str(path))
    database = next((candidate for candidate in (target, *(target.with_name(target.name.removesuffix(suffix))
                                                          for suffix in SQLITE_COMPANIONS
                                                          if target.name.endswith(suffix) and target.name != suffix))
                     if _is_sqlite(candidate)), None)
    if database is not None:  # a results or study store: an export or report over it lost every run
        what = "is an SQLite database" if database == target else f"belongs to the SQLite database {database.name}"
        raise OSError(errno.EEXIST, f"{what} (a results or study store): it is not replaced", str(path))
    return target


SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def _is_sqlite(path: Path) -> bool:
    if not path.is_file():  # a FIFO would block the read
        return False
    try:
        with path.open("rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:  # none there (or unreadable: the write says so)
        return False


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename over the target, fsync the directory. If
    anything fails before the rename, the previous file is untouched and the temp file removed. A symbolic
    link is followed (its file is replaced, the link kept); anything but a regular file is refused (write_target)."""
    write_files({path: text})


def write_files(texts: Mapping[Path, str]) -> None:
    """Every file or none: every directory, then every temp file (beside its target, fsynced), then the
    renames, then the directories fsynced. A failure before the renames leaves every target as it was
    and removes the temp files written. Targets as write_target: a symlink's file, never a special file."""
    texts = {write_target(Path(path)): text for path, text in texts.items()}
    for path in texts:
        path.parent.mkdir(parents=True, exist_ok=True)
    temps: dict[Path, str] = {}
    try:
        for path, text in texts.items():
            fd, temps[path] = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temps[path], new_file_mode())  # mkstemp's is 0600
        for path, temp_name in temps.items():
            os.replace(temp_name, path)
    except BaseException:
        for temp_name in temps.values():  # those renamed already are gone
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp_name)
        raise
    for parent in dict.fromkeys(path.parent for path in texts):
        directory = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def comment(text: str) -> str:
    return _COMMENT_CHARS.sub("?", text)[:_COMMENT_MAX]


def comment_lines(text: str) -> list[str]:
    """`text` as comment lines of at most _COMMENT_MAX characters, continued (indented), never cut."""
    return textwrap.wrap(_COMMENT_CHARS.sub("?", text), _COMMENT_MAX, subsequent_indent="  ")


def system_dir(root: Path, site: str, system: str) -> Path:
    return Path(root) / check_safe_value(site, "site") / check_safe_value(system, "system")


def tuner_config_name(scope: StudyScope) -> str:
    """The tuner-plugin config `scope`'s jobs read: shared by the scopes of its partition, library version and
    transport (a row names its collective, node and rank counts, so one job of several ops finds each op's
    rows), never with another partition's or version's, whose rows were not measured for these jobs."""
    return f"{TUNER_CONFIG_STEM}_{scope.partition}_{scope.library}-{scope.library_version}_{scope.transport}.conf"


@dataclass(frozen=True)
class PublishedFiles:
    env_file: Path
    modulefile: Path
    module_name: str
    tuner_config: Path | None
    recommendations: Path
    # the entry of the scope this publish replaced, described (its sizes, decision and date), or None: a tune of
    # other sizes or another baseline replaces what jobs were given
    replaced: str | None = None

    def to_json(self) -> dict[str, str | None]:
        """The paths as strings; a file not written (no tuner config) as None, never "None"."""
        return {k: None if v is None else str(v) for k, v in dataclasses.asdict(self).items()}


def verdict(decision: str, gain: Gain | None, closest: Gain | None, held_out: HeldOut | None = None,
            deployed: bool = True) -> str:
    """A decision with its evidence: the gain and the held-out gain, the closest candidate, or none tested."""
    if gain is not None:
        return f"{decision}: {gain.describe()}" + ("" if held_out is None else f"; {held_out.describe(deployed)}")
    if closest is not None:
        return f"{decision}; closest candidate: {closest.describe()}"
    return f"{decision} (no candidate tested)"


def evidence_lines(rec: Recommendation) -> list[str]:
    ev = rec.evidence
    lines = [
        f"scope: {rec.describe_scope()}",
        f"decision: {verdict(rec.decision, rec.gain, rec.closest, rec.held_out)}",
        *([] if rec.measured_with() is None else [rec.measured_with()]),
        *([] if rec.deployed is None else [rec.deployed.describe()]),
        f"test: {ev.test}",
    ]
    if ev.family_size is not None:
        lines.append(
            f"multiple testing: Holm over all {ev.family_size} tests of the finalization ({ev.family}); "
            f"P(any false change of the environment, overall or in a size bucket) <= alpha={ev.alpha}"
        )
    lines += [
        f"thresholds: Holm-adjusted p < {ev.alpha}, minimum effect {ev.min_effect:.0%} median speed-up, "
        f"{ev.confidence:.0%} CI lower bound > 0",
        f"trials: {ev.trials_counted} ({ev.trials_complete} complete, {ev.trials_failed} failed); "
        f"re-measurement rounds used {ev.rounds_used}/{ev.rounds_run}"
        + ("" if ev.allocations is None else f" in {ev.allocations} batch allocation(s)") + f"; study {ev.study}",
        f"date: {rec.date}; versions: " + ", ".join(f"{k}={v}" for k, v in sorted(rec.versions.items())),
    ]
    for size in rec.per_size:
        lines.append(
            f"size {size.bucket} [{size.min_bytes}, {size.max_bytes}] ({size.metric}): "
            + verdict(size.decision, size.gain, size.closest, size.held_out, deployed=size.env == rec.env)
        )
    lines.extend(f"note: {note}" for note in [*ev.notes, *rec.plugin_notes])
    lines.extend(per_size_lines(rec))
    return [part for line in lines for part in comment_lines(line)]


def per_size_lines(rec: Recommendation) -> list[str]:
    """The per-size stage's evidence: its test and, per range, the selection and its gains."""
    result = rec.per_size_selection
    if result is None:
        return []
    lines = [
        f"per-size stage: {result.op} on {result.ranks} ranks / {result.nodes} nodes, {result.rounds} sweep rounds "
        f"({result.selection_rounds} select, {result.confirmation_rounds} confirm); {result.test}"
    ]
    for size_range in result.ranges:
        where = f"sizes [{size_range.min_bytes}, {size_range.max_bytes}] B"
        if size_range.selection is None:
            lines.append(f"{where}: keep the library's choice")
        else:
            gains = ", ".join(f"{g:+.1%}" for g in size_range.gains)
            lines.append(f"{where}: {size_range.selection.name} (median speed-up per size, confirmation rounds, "
                         f"which also decided it: {gains})")
    stopped = [f"{size.bytes} B: {', '.join(size.stopped)}" for size in result.sizes if size.stopped]
    if stopped:
        rule = (f"at least {result.stop_slower:g}x the library's choice's time in {result.stop_after - 1} or all of the "
                f"selection rounds 0, 2, ..., {2 * result.stop_after - 2}" if result.stop_after
                else "far slower than the library's choice in the selection rounds")
        lines.append(f"stopped early by the sweep ({rule}; no candidates): " + "; ".join(stopped))
    return lines


def config_comments(rec: Recommendation) -> list[str]:
    """The comment lines above a scope's rows in the tuner-plugin config."""
    return [comment(f"scope: {rec.describe_scope()}"),
            *(part for line in per_size_lines(rec) for part in comment_lines(line))]


def rule_file(directory: Path, rec: Recommendation) -> tuple[Path, str, dict[str, str]] | None:
    """(path, text, env lines pointing the library at it) of the scope's per-size rule file, or None
    (no per-size change, or a library whose per-size output is the tuner-plugin config)."""
    result = rec.per_size_selection
    if result is None or all(r.selection is None for r in result.ranges):
        return None
    evidence = evidence_lines(rec)
    if rec.scope.library == "openmpi":
        path = (directory / f"{rec.scope.slug}{RULE_FILE_SUFFIX['openmpi']}").resolve()
        return path, rule_files.ompi_rules_text([result], evidence), {
            rule_files.OMPI_MCA[0]: "1",
            rule_files.OMPI_MCA[1]: str(path),
        }
    if rec.scope.library == "mpich":
        path = (directory / f"{rec.scope.slug}{RULE_FILE_SUFFIX['mpich']}").resolve()
        return path, rule_files.mpich_json_text([result], evidence), {rule_files.MPICH_JSON_ENV: str(path)}
    return None


# what publish adds to a scope's environment for its per-size rules (plugin_env), per library: nothing else may
# stand there
PER_SIZE_ENV: dict[str, tuple[str, ...]] = {"nccl": PLUGIN_ENV, "rccl": PLUGIN_ENV, "openmpi": rule_files.OMPI_MCA,
                                            "mpich": (rule_files.MPICH_JSON_ENV,)}
PUBLISHED_ENV = frozenset(name for names in PER_SIZE_ENV.values() for name in names)


def published_env(library: Library) -> frozenset[str]:
    """The per-size variables that can change a run of `library` (its own and those of the libraries it runs over,
    catalog.RUNS_OVER)."""
    over = RUNS_OVER.get(library, frozenset(Library))
    return frozenset(name for lib, names in PER_SIZE_ENV.items() if Library(lib) in over for name in names)


def cleared_names(catalog: KnobCatalog, launch_names: Collection[str], library: Library) -> list[str]:
    """What a job must unset to run what the trials of a `library` tune ran: every knob and per-size variable that
    can change its runs (the tune strips them from its own environment: executors.strip_knobs) that a launch did
    not set again (`launch_names`: the site's env_vars, its defaults and pins). A value a job inherits (its own
    export, a module, an earlier .env) would otherwise run a configuration never measured; another library's
    knobs (an MPI job's NCCL settings) stay. Every spelling the library reads is unset (an MPICH control variable's
    aliases: catalog.env_names). What the deployed set sets or unsets itself is taken out where it is written
    (job_cleared)."""
    return sorted(with_aliases(catalog.affecting(library) | published_env(library)) - set(launch_names))


def job_cleared(rec: Recommendation) -> list[str]:
    """`rec.cleared` less what the deployed set exports or unsets itself."""
    return [name for name in rec.cleared if name not in rec.env and name not in rec.plugin_env
            and name not in rec.unset]


def _validated(
    rec: Recommendation, catalog: KnobCatalog, plugin_env: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    env = catalog.validate_env(rec.env)
    # the site's pins always; a forbidden knob only where trial 0 did not run that value (a pin of the tune's own
    # knob files, which the site's catalog lacks)
    catalog.check_job_env({name: value for name, value in env.items()
                           if name in catalog.pinned or rec.baseline_env.get(name) != value})
    for name in rec.unset:  # a site default the winner does not set, never a pin
        if name not in catalog:
            raise UnsafeValueError(f"unset {name}: not a knob of the catalog {catalog.source}")
        if name in catalog.pinned:
            raise UnsafeValueError(f"unset {name}: the site pins it")
        if name not in rec.baseline_env:
            raise UnsafeValueError(f"unset {name}: not a setting of the site's defaults")
    clearable = with_aliases([*(knob.name for knob in catalog), *PUBLISHED_ENV])  # cleared_names' every spelling
    pinned = with_aliases(catalog.pinned)
    for name in rec.cleared:
        if name not in clearable:
            raise UnsafeValueError(f"unset {name}: not a knob of the catalog {catalog.source}")
        if name in pinned:
            raise UnsafeValueError(f"unset {name}: the site pins it")
    for name, value in plugin_env.items():
        if name not in PUBLISHED_ENV or env.get(name, value) != value:
            raise UnsafeValueError(f"{name}: not a variable of the per-size rules' ({', '.join(sorted(PUBLISHED_ENV))})"
                                   if name not in PUBLISHED_ENV else f"{name}: env and plugin_env set it differently")
        check_env_name(name)
        check_safe_value(value, name)
        if name in catalog:
            catalog.check_job_env({name: value})
        elif not value.startswith("/"):
            raise UnsafeValueError(f"{name}: {value!r} must be an absolute path")
    return {**env, **plugin_env}, list(rec.unset)


def check_published(path: Path, rec: Recommendation, catalog: KnobCatalog) -> None:
    """ValueError naming `path` and the problem when `rec`, read from it, is not what publish writes: its settings
    outside `catalog` (a hand edit: a variable that is no knob, a value outside a knob's domain, a forbidden knob),
    or its rule file, tuner config or tuner plugin missing, unreadable or not what the library reads (the job would
    run without the per-size rules: NCCL goes on without a plugin it cannot load, Open MPI without a rules file it
    cannot parse; MPICH aborts on a selection file it cannot)."""
    try:
        _validated(rec, catalog, rec.plugin_env)
    except UnsafeValueError as exc:
        raise ValueError(f"{path}: {rec.scope.slug}: published settings refused: {exc}") from None
    if rec.decision == "change" and rec.env == rec.baseline_env and not rec.unset:
        raise ValueError(f"{path}: {rec.scope.slug}: decision change, but its settings are the site's defaults it was "
                         "measured against (baseline_env): nothing a job would get differs from them")
    if rec.decision == "keep-defaults" and (rec.env != rec.baseline_env or rec.unset):
        # publish writes the defaults for it: other settings would be printed under "keep the defaults"
        differ = sorted({*rec.env, *rec.baseline_env} - {k for k in rec.env if rec.baseline_env.get(k) == rec.env[k]})
        raise ValueError(f"{path}: {rec.scope.slug}: decision keep-defaults, but its settings are not the site's "
                         f"defaults it was measured against (baseline_env): "
                         f"{', '.join(differ + [f'unset {name}' for name in rec.unset])}")
    plugin = rec.plugin_env.get(PLUGIN_ENV[0])
    if plugin is not None and not (Path(plugin).is_file() and os.access(plugin, os.R_OK)):
        raise ValueError(f"{path}: {rec.scope.slug}: its tuner plugin {plugin} cannot be read: build it (commcamp "
                         "plugin build) and publish the tune again")
    config = rec.plugin_env.get(PLUGIN_ENV[1])
    for file in [*rec.rule_files.values(), *([config] if config else [])]:
        try:
            text = Path(file).read_text(encoding="utf-8")
            if file == config:
                parse_config(text)
            elif file.endswith(RULE_FILE_SUFFIX["openmpi"]):  # Open MPI ignores a file it cannot read: no rules
                rule_files.parse_ompi_rules(text)
            elif file.endswith(RULE_FILE_SUFFIX["mpich"]):  # MPICH aborts in MPI_Init on one
                rule_files.check_mpich_tree(json.loads(rule_files.strip_c_comment(text)))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"{path}: {rec.scope.slug}: its per-size rules {file} cannot be used ("
                             f"{getattr(exc, 'strerror', None) or exc}): publish the tune again") from None


CLEARED_COMMENT = "unset as in every trial (the knobs the site does not set): a value from elsewhere was never measured"


def env_file_text(rec: Recommendation, env: Mapping[str, str], unset: list[str]) -> str:
    lines = [
        "# commcamp recommendation; generated by tuners.writers, do not edit",
        *(f"# {c}" for c in evidence_lines(rec)),
    ]
    lines.extend(f"export {name}='{value}'" for name, value in env.items())
    lines.extend(f"unset {name}" for name in unset)
    if cleared := job_cleared(rec):
        lines.append(f"# {CLEARED_COMMENT}")
        lines.extend(f"unset {name}" for name in cleared)
    if rec.per_size_selection is not None and rec.scope.library in ("mpich", "cray-mpich"):
        lines.append("# The same per-size choices for MPICH-derived libraries, NOT run here (no Intel MPI or Cray MPICH):")
        lines.extend(f"#   {line}" for line in rule_files.intel_mpi_lines(rec.per_size_selection))
        lines.append(
            f"#   Cray MPICH (MPICH-based): {rule_files.MPICH_JSON_ENV} pointing at the MPICH file above, if its "
            "MPICH base reads it; check with MPICH_ENV_DISPLAY=1"
        )
    return "\n".join(lines) + "\n"


def modulefile_text(rec: Recommendation, env: Mapping[str, str], unset: list[str]) -> str:
    lines = [
        "-- commcamp recommendation; generated by tuners.writers, do not edit",
        *(f"-- {c}" for c in evidence_lines(rec)),
    ]
    lines.append(f'whatis("commcamp communication settings ({comment(rec.decision)}): {comment(rec.describe_scope())}")')
    # pushenv: unloading the module gives back what the job had before (setenv/unsetenv would leave it unset)
    lines.extend(f'pushenv("{name}", "{value}")' for name, value in env.items())
    lines.extend(f'pushenv("{name}", false)' for name in unset)
    if cleared := job_cleared(rec):
        lines.append(f"-- {CLEARED_COMMENT}")
        lines.extend(f'pushenv("{name}", false)' for name in cleared)
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def load_recommendations(path: Path) -> RecommendationFile:
    """ValueError in one line naming the file, the line of its first problem (duplicate keys are one; a key
    the schema does not have comes first: yamlio.typos_first) and what is wrong there, with how many problems there
    are."""
    try:
        return YamlDocument(path).validate(RecommendationFile)
    except YamlModelError as exc:
        line, _, problem = exc.problems[0].removeprefix(exc.source).partition(": ")
        more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        raise ValueError(f"{exc.source}{line}: not a valid recommendations file: {problem}{more}") from None


def replaces(scope: StudyScope, published: StudyScope) -> bool:
    """Whether publishing `scope` replaces the entry of `published`: the same scope, or the same but published
    before scopes named their ranks per node (its layout unknown: the newer tune's entry stands for it)."""
    if published.tasks_per_node is None:
        published = published.model_copy(update={"tasks_per_node": scope.tasks_per_node})
    return published == scope


def publish(
    root: Path, rec: Recommendation, catalog: KnobCatalog, *, plugin_library: str | None = None
) -> PublishedFiles:
    """Writes (or replaces) the files of `rec`'s scope and regenerates the system-wide files.
    `plugin_library` is the path of libnccl-tuner-commcamp.so; it is needed when the
    recommendation has plugin rows (the .env/modulefile then point NCCL at the config)."""
    directory = system_dir(root, rec.scope.site, rec.scope.system)
    config_path = directory / tuner_config_name(rec.scope)
    plugin_env: dict[str, str] = {}
    if rec.plugin_rules:
        if plugin_library is None:
            raise ValueError(
                "the recommendation has tuner-plugin rows: give plugin_library (libnccl-tuner-commcamp.so)"
            )
        plugin_env = {PLUGIN_ENV[0]: str(plugin_library), PLUGIN_ENV[1]: str(config_path.resolve())}
    rules = rule_file(directory, rec)
    if rules is not None:
        plugin_env.update(rules[2])
    written = {} if rules is None else {rec.scope.library: str(rules[0])}
    # A site default the winner unsets, or sets otherwise (coll_tuned_use_dynamic_rules=0), may be a line the rule
    # file needs (=1): the rule file's line, as the deployed-set check measured the set ({**env, **rules' env}).
    rec = rec.model_copy(update={"plugin_env": plugin_env, "rule_files": written,
                                 "env": {name: value for name, value in rec.env.items()
                                         if plugin_env.get(name, value) == value},
                                 "unset": [name for name in rec.unset if name not in plugin_env]})
    rec = rec.model_copy(update={"cleared": job_cleared(rec)})
    env, unset = _validated(rec, catalog, plugin_env)
    env_path = directory / f"{rec.scope.slug}.env"
    module_version = f"{rec.scope.system}_{rec.scope.slug}"
    module_path = directory / "modulefiles" / MODULE_FAMILY / f"{module_version}.lua"
    yaml_path = directory / RECOMMENDATIONS_FILE
    with _locked(directory):
        others, earlier = [], []
        if yaml_path.exists():
            for r in load_recommendations(yaml_path).recommendations:
                (earlier if replaces(rec.scope, r.scope) else others).append(r)
        everything = sorted([*others, rec], key=lambda r: r.scope.slug)
        texts = {} if rules is None else {rules[0]: rules[1]}
        texts[env_path] = env_file_text(rec, env, unset)
        texts[module_path] = modulefile_text(rec, env, unset)
        groups = [
            (config_comments(r), r.plugin_rules)
            # the scopes that point NCCL at this config (one published before its name said partition and version
            # points at nccl_tuner.conf, which holds its rows until it is published again)
            for r in everything if r.plugin_rules and Path(r.plugin_env.get(PLUGIN_ENV[1], "")).name == config_path.name
        ]
        if groups:
            texts[config_path] = format_config(groups)
        document = RecommendationFile(site=rec.scope.site, system=rec.scope.system, recommendations=everything)
        texts[yaml_path] = yaml.safe_dump(document.model_dump(mode="json"), sort_keys=False)
        # All or nothing: a scope's .env never disagrees with recommendations.yaml. A rule file or tuner config no
        # scope points at any more stays: a job queued with the earlier .env reads it (MPICH dies in MPI_Init on a
        # missing tuning file).
        write_files(texts)
    replaced = "; ".join(f"{r.describe_scope().rsplit(' ', 1)[-1]}, {r.decision}, published {r.date}" for r in earlier)
    return PublishedFiles(env_path, module_path, f"{MODULE_FAMILY}/{module_version}",
                          config_path if groups else None, yaml_path, replaced or None)
