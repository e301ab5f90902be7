"""Look up the published settings for a job context. Never extrapolates: a node count, GPU count
or size that was not measured is said to be unmeasured, with the nearest measured scope named. Nor does it
choose between measured scopes (another partition, transport, library or library version): the job's
context names one, and the options that would are listed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuners.recommendation import Recommendation, SizeRangeResult
from tuners.catalog import KnobCatalog
from tuners.writers import (CLEARED_COMMENT, PLUGIN_ENV, RECOMMENDATIONS_FILE, check_published, job_cleared,
                             load_recommendations, system_dir, verdict)

# The scope fields a job context may name besides op and nodes, and recommend's option for each.
OPTIONS = {"partition": "--partition", "transport": "--transport", "library": "--library",
           "library_version": "--library-version", "gpus_per_node": "--gpus-per-node",
           "tasks_per_node": "--tasks-per-node"}


@dataclass(frozen=True)
class LookupResult:
    measured: bool
    message: str
    recommendation: Recommendation | None = None
    size_result: SizeRangeResult | None = None
    source: Path | None = None
    candidates: tuple[Recommendation, ...] = field(default_factory=tuple)

    @property
    def settings(self) -> dict[str, str]:
        if self.recommendation is None:
            return {}
        return {**self.recommendation.env, **self.recommendation.plugin_env}

    @property
    def unset(self) -> list[str]:
        return [] if self.recommendation is None else list(self.recommendation.unset)

    @property
    def cleared(self) -> list[str]:
        return [] if self.recommendation is None else job_cleared(self.recommendation)


def lookup(
    root: Path,
    site: str,
    system: str,
    *,
    op: str,
    nodes: int,
    gpus_per_node: int | None = None,
    tasks_per_node: int | None = None,
    partition: str | None = None,
    transport: str | None = None,
    library: str | None = None,
    library_version: str | None = None,
    size: int | None = None,
    catalog: KnobCatalog | None = None,
) -> LookupResult:
    """The published scope for the job context; ValueError when the file is invalid or, with `catalog` (the
    site's), when the scope it finds is not what publish writes (writers.check_published)."""
    path = system_dir(root, site, system) / RECOMMENDATIONS_FILE
    if not path.exists():
        return LookupResult(False, f"no recommendations published for {site}/{system} ({path} does not exist)")
    entries = load_recommendations(path).recommendations
    wanted = {
        "op": op,
        "partition": partition,
        "transport": transport,
        "library": library,
        "library_version": library_version,
        "gpus_per_node": gpus_per_node,
        "tasks_per_node": tasks_per_node,
    }
    matching = _matching(entries, wanted)
    context = ", ".join(f"{k}={v}" for k, v in wanted.items() if v is not None)
    if not matching:
        message = f"nothing measured for {context} on {site}/{system}"
        # what was published beside the job's context, where one option alone differs (none unless it was named)
        for name, option in (("library_version", "--library-version"), ("tasks_per_node", "--tasks-per-node"),
                             ("gpus_per_node", "--gpus-per-node")):
            published = [v for v in _values(_matching(entries, {**wanted, name: None}), name) if v != "None"]
            if wanted[name] is not None and published:
                message += f"; published: {option} {' or '.join(published)}"
        return LookupResult(False, message, source=path)
    exact = [r for r in matching if r.scope.nodes == nodes]
    if not exact:
        nearest = min(matching, key=lambda r: (abs(r.scope.nodes - nodes), r.scope.nodes))
        return LookupResult(
            False,
            f"not measured for {nodes} nodes ({context}); nearest measured scope: {nearest.describe_scope()} "
            "-- its settings are not applied to an unmeasured node count",
            source=path,
            candidates=(nearest,),
        )
    unnamed_note = ""
    others = [name for name in OPTIONS if name != "tasks_per_node" and len(_values(exact, name)) > 1]
    if (tasks_per_node is None and len(exact) > 1 and any(r.scope.tasks_per_node is None for r in exact)
            and not others):
        # A scope published before scopes named their ranks per node has none: no --tasks-per-node selects it, so
        # leaving the option out does (the scopes that name theirs are chosen by giving it), among scopes alike in
        # everything else (one of another library version is no older twin of it: say which, below).
        named = _values([r for r in exact if r.scope.tasks_per_node is not None], "tasks_per_node")
        exact = [r for r in exact if r.scope.tasks_per_node is None]
        if named:
            unnamed_note = (f"; a scope published without ranks per node, chosen as --tasks-per-node was not given "
                            f"(scopes of --tasks-per-node {' or '.join(named)} are published too: give it for one)")
    if len(exact) > 1:
        listed = "; ".join(r.describe_scope() for r in exact)
        which = "; ".join(f"{option} {' or '.join(values)}" for name, option in OPTIONS.items()
                          if len(values := _values(exact, name)) > 1)
        return LookupResult(
            False,
            f"{len(exact)} measured scopes match {context}, nodes={nodes}: {listed}. Say which: {which} (none is "
            "chosen for the job: each one's settings were measured in its own scope)",
            source=path,
            candidates=tuple(exact),
        )
    rec = exact[0]
    if catalog is not None:
        check_published(path, rec, catalog)
    message = (f"measured scope: {rec.describe_scope()} ({verdict(rec.decision, rec.gain, rec.closest, rec.held_out)})"
               + unnamed_note)
    if rec.deployed is not None:  # per-size rules, also beside keep-defaults: what the lines below deploy
        message += f"; {rec.deployed.describe()}"
    size_result = None
    if size is not None:
        size_result = next((s for s in rec.per_size if s.min_bytes <= size <= s.max_bytes), None)
        if size_result is None:  # the environment was chosen on other sizes: not applied to this one
            measured = ", ".join(f"[{s.min_bytes}, {s.max_bytes}]" for s in rec.per_size) or "none"
            return LookupResult(
                False,
                f"size {size} B was not measured for {rec.describe_scope()} (its size buckets: {measured} B) "
                "-- its settings, tuned on those sizes, are not applied to an unmeasured size",
                source=path,
                candidates=(rec,),
            )
        # The bucket's name spans the sizes measured in it; the range it covers is wider ("in the measured bucket"
        # read as if this size had been measured)
        message += (f"; size {size} B falls in the bucket [{size_result.min_bytes}, {size_result.max_bytes}] B, "
                    f"which the tune measured at {size_result.bucket}: {bucket_decision(rec, size_result)}")
        if rec.per_size_selection is not None:
            message += "; " + describe_selection(rec, size)
    return LookupResult(True, message, rec, size_result, path)


def bucket_decision(rec: Recommendation, bucket: SizeRangeResult) -> str:
    """The bucket's own decision, said as what it is beside the scope's environment, which is what a job gets: one
    environment serves every size of a process."""
    if bucket.decision == "change" and bucket.env != rec.env:
        # its winner as settings: what it sets, and the site defaults it leaves unset (it showed "()" for those)
        chosen = " ".join([*(f"{k}={v}" for k, v in sorted(bucket.env.items())),
                           *(f"unset {k}" for k in sorted(set(rec.baseline_env) - set(bucket.env)))])
        return (f"change for this bucket alone ({chosen}), not deployed: one environment serves every size, the "
                "lines below are the scope's")
    if bucket.decision == "keep-defaults" and rec.decision == "change":
        return ("keep-defaults for this bucket alone (no candidate shown faster here); the scope's environment below "
                "was not shown slower here")
    return bucket.decision


def _matching(entries: Sequence[Recommendation], wanted: Mapping[str, str | int | None]) -> list[Recommendation]:
    return [r for r in entries if all(v is None or getattr(r.scope, k) == v for k, v in wanted.items())]


def _values(recs: Sequence[Recommendation], name: str) -> list[str]:
    """The values of scope field `name` in `recs`, each once, in their order."""
    return list(dict.fromkeys(str(getattr(r.scope, name)) for r in recs))


def describe_selection(rec: Recommendation, size: int) -> str:
    """What the per-size stage chose for `size`, and where the rule file is."""
    result = rec.per_size_selection
    assert result is not None
    size_range = result.at(size)
    if size_range is None:
        return f"per-size selection: {size} B was not measured in the sweep ({result.op}): the library's choice"
    if size_range.selection is None:
        return (f"per-size selection for {size} B: the library's own choice (no significant gain in "
                f"[{size_range.min_bytes}, {size_range.max_bytes}] B)")
    gains = ", ".join(f"{g:+.1%}" for g in size_range.gains)
    files = "".join(f", rule file {path}" for path in rec.rule_files.values())
    if PLUGIN_ENV[1] in rec.plugin_env:
        files += f", tuner config {rec.plugin_env[PLUGIN_ENV[1]]}"
    selection = size_range.selection
    how = selection.mechanism if selection.cvar is None else f"{selection.mechanism} {selection.cvar}={selection.value}"
    return (f"per-size selection for {size} B: {selection.name} ({how}; range [{size_range.min_bytes}, "
            f"{size_range.max_bytes}] B, speed-up in the rounds that decided it {gains}{files})")


def format_lookup(result: LookupResult) -> str:
    """What `commcamp recommend` prints: the source and the shell lines to apply."""
    lines = [("# " if result.measured else "# NOT MEASURED: ") + result.message]
    if result.recommendation is not None and result.measured and result.recommendation.measured_with():
        lines.append(f"# {result.recommendation.measured_with()}")
    if result.source is not None:
        lines.append(f"# from {result.source}")
    lines.extend(f"export {name}='{value}'" for name, value in result.settings.items())
    lines.extend(f"unset {name}" for name in result.unset)
    if result.cleared:
        lines.append(f"# {CLEARED_COMMENT}")
        lines.extend(f"unset {name}" for name in result.cleared)
    return "\n".join(lines)
