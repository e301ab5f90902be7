"""A recommendation: what to set for one scope, and the evidence behind it (recommendations.yaml)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import optuna
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuners.catalog import check_env_name, check_safe_value
from tuners.evaluation import SizeBucket, format_bytes
from tuners.finalize import Comparison, Decision, DeployedCheck, FinalReport, Holdout
from tuners.per_size import PerSizeResult, SizeRange, SweepError, TunerRule, plugin_rows
from tuners.scope import StudyScope
from tuners.study import study_progress

Verdict = Literal["change", "keep-defaults"]


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
    return {check_env_name(name): check_safe_value(value, name) for name, value in env.items()}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Gain(_Model):
    """Median per-round speed-up of a candidate over the baseline (0.12 = +12 %); p_adjusted is Holm
    over the finalization's whole family of tests (Evidence.family_size)."""

    median: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    p_adjusted: float
    rounds: int
    ratios: list[float]

    @classmethod
    def of(cls, comparison: Comparison, confidence: float) -> Gain:
        assert comparison.gain is not None and comparison.ci_low is not None and comparison.ci_high is not None
        assert comparison.p_value is not None and comparison.p_adjusted is not None
        return cls(
            median=comparison.gain,
            ci_low=comparison.ci_low,
            ci_high=comparison.ci_high,
            confidence=confidence,
            p_value=comparison.p_value,
            p_adjusted=comparison.p_adjusted,
            rounds=comparison.rounds,
            ratios=list(comparison.ratios),
        )

    def describe(self) -> str:
        return (
            f"{self.median:+.1%} median speed-up ({self.confidence:.0%} CI {self.ci_low:+.1%} .. {self.ci_high:+.1%}), "
            f"Wilcoxon p={self.p_value:.3g}, Holm-adjusted {self.p_adjusted:.3g}, {self.rounds} paired rounds"
        )


class HeldOut(_Model):
    """The deployed set's median per-round speed-up over the baseline on held-out rounds: run after the
    choice, not used to make it (finalize.Holdout)."""

    median: float
    ci_low: float
    ci_high: float
    rounds: int
    ratios: list[float]
    coverage: float | None = None  # the interval's, whatever the distribution (None: published before it was said)

    @classmethod
    def of(cls, h: Holdout | None) -> HeldOut | None:
        return None if h is None else cls(median=h.gain, ci_low=h.ci_low, ci_high=h.ci_high, rounds=h.rounds,
                                          ratios=list(h.ratios), coverage=h.coverage)

    def describe(self, deployed: bool = True) -> str:
        """`deployed` False: a size bucket's own winner, which the scope's one environment does not deploy."""
        what = "what is deployed" if deployed else "this bucket's own winner (not deployed)"
        level = "" if self.coverage is None else f"{self.coverage:.1%} "
        return (f"held out: {self.median:+.1%} median speed-up of {what} ({level}CI {self.ci_low:+.1%} .. "
                f"{self.ci_high:+.1%}), {self.rounds} rounds after the choice")

    def short(self) -> str:
        return f"{self.median:+.1%} [{self.ci_low:+.1%}, {self.ci_high:+.1%}]"


class DeployedGain(_Model):
    """The deployed set (the environment with its per-size rules) vs the site's defaults, on rounds run after
    the per-size stage (finalize.check_deployed): what a job gets from everything published together."""

    overall: HeldOut | None
    buckets: dict[str, HeldOut]
    rounds: int
    withdrawn: str | None = None  # why the per-size rules were withdrawn
    # why the environment, measured alone in the same rounds, would be refused there; with `withdrawn` it went too
    # (keep the defaults), without it the set was deployed as measured (a note says so)
    environment_withdrawn: str | None = None
    # the buckets a rule covers: the set's speed-up over the environment alone in the same rounds (the rules' own
    # effect; near 0 where the per-size stage found a gain, the library did not apply the rule file)
    rules_effect: dict[str, HeldOut] = Field(default_factory=dict)

    def describe(self) -> str:
        gains = "; ".join([*([f"overall {self.overall.short()}"] if self.overall else []),
                           *(f"{name} {h.short()}" for name, h in self.buckets.items())])
        effect = ", ".join(f"{name} {h.short()}" for name, h in self.rules_effect.items())
        return (f"deployed set (environment + per-size rules) vs the site's defaults, {self.rounds} rounds: "
                f"{gains or 'no round compared them'}"
                + (f"; the rules alone (the set vs the environment alone): {effect}" if effect else "")
                + ("" if self.withdrawn is None else f"; per-size rules withdrawn: {self.withdrawn}")
                + ("" if self.environment_withdrawn is None
                   else f"; the environment alone{' withdrawn too' if self.withdrawn else ''}: "
                        f"{self.environment_withdrawn}"))


class SizeRangeResult(_Model):
    bucket: str
    min_bytes: int
    max_bytes: int
    metric: Literal["latency", "goodput"]
    decision: Verdict
    env: dict[str, str]
    gain: Gain | None = None
    closest: Gain | None = None  # keep-defaults: the tested candidate nearest to acceptance
    held_out: HeldOut | None = None  # change: the gain on rounds not used to choose it

    _env_safe = field_validator("env")(_checked_env)

    @model_validator(mode="after")
    def _range(self) -> SizeRangeResult:
        if self.max_bytes < self.min_bytes:
            raise ValueError(f"max_bytes {self.max_bytes} below min_bytes {self.min_bytes}")
        return self


class Evidence(_Model):
    test: str
    alpha: float
    min_effect: float
    confidence: float
    rounds_run: int
    rounds_used: int
    notes: list[str]
    study: str
    trials_counted: int
    trials_complete: int
    trials_failed: int
    # Tests Holm-corrected together and what they are (None: written before the family-wide correction).
    family_size: int | None = None
    family: str | None = None
    # Distinct batch allocations (Slurm jobs) the finalization's runs ran in; None: not known (no Slurm).
    allocations: int | None = None


class Recommendation(_Model):
    scope: StudyScope
    decision: Verdict
    env: dict[str, str]  # export these (validated values)
    unset: list[str] = Field(default_factory=list)  # unset these (set by the site default, not by the winner)
    # unset these too: the knobs and per-size variables every trial ran without, the site setting none of them
    # (a value inherited from the job, a module or an earlier .env would run a configuration never measured)
    cleared: list[str] = Field(default_factory=list)
    baseline_env: dict[str, str]
    gain: Gain | None
    closest: Gain | None = None  # keep-defaults: the tested candidate nearest to acceptance
    held_out: HeldOut | None = None  # change: the gain on rounds not used to choose it
    per_size: list[SizeRangeResult]
    plugin_rules: list[TunerRule] = Field(default_factory=list)  # from per_size_selection (NCCL/RCCL)
    per_size_selection: PerSizeResult | None = None  # the per-size stage (tuners/per_size.py), if it ran
    rule_files: dict[str, str] = Field(default_factory=dict)  # library rule files written on publish: kind -> path
    plugin_notes: list[str] = Field(default_factory=list)
    plugin_env: dict[str, str] = Field(default_factory=dict)  # NCCL_TUNER_PLUGIN / _CONFIG_FILE, set on publish
    deployed: DeployedGain | None = None  # the environment + per-size rules vs the defaults (with_deployed_check)
    # variables of the library's stack that are no knob, in every trial as the tune's environment had them
    # (OMPI_MCA_btl=self,tcp): not set by the files, said beside them (measured_with)
    inherited: dict[str, str] = Field(default_factory=dict)
    evidence: Evidence
    date: str
    versions: dict[str, str]

    _env_safe = field_validator("env", "baseline_env", "plugin_env", "inherited")(_checked_env)

    def measured_with(self) -> str | None:
        """What every trial had from the tune's environment beyond these settings, as the files and recommend say it."""
        if not self.inherited:
            return None
        settings = " ".join(f"{name}={value}" for name, value in self.inherited.items())
        return (f"measured with {settings} from the tune's environment in every trial (no knob: not searched, not set "
                "by these files): a job without it was not measured")

    @field_validator("unset", "cleared")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        return [check_env_name(n) for n in names]

    @field_validator("versions")
    @classmethod
    def _versions(cls, versions: dict[str, str]) -> dict[str, str]:
        return {check_safe_value(k, "versions key"): check_safe_value(v, f"versions.{k}") for k, v in versions.items()}

    def describe_scope(self) -> str:
        """The scope, its sizes the range the buckets measured cover: "sizes=all" (one study scoring every
        bucket) read as every message size."""
        text = self.scope.describe()
        if self.scope.size_bucket != "all" or not self.per_size:
            return text
        low = min(r.min_bytes for r in self.per_size)
        high = max(r.max_bytes for r in self.per_size)
        return text.removesuffix("sizes=all") + f"sizes={format_bytes(low)}-{format_bytes(high)}"


class RecommendationFile(_Model):
    schema_version: Literal[1] = 1
    site: str
    system: str
    recommendations: list[Recommendation]

    @field_validator("recommendations")
    @classmethod
    def _one_per_scope(cls, recs: list[Recommendation]) -> list[Recommendation]:
        """publish replaces a scope's entry: two of one scope are a hand edit no lookup can choose between."""
        first: dict[StudyScope, int] = {}
        for i, rec in enumerate(recs):
            if rec.scope in first:
                raise ValueError(f"entries {first[rec.scope]} and {i} have the same scope ({rec.describe_scope()})")
            first[rec.scope] = i
        return recs


def build_recommendation(
    scope: StudyScope,
    report: FinalReport,
    buckets: Sequence[SizeBucket],
    study: optuna.Study,
    versions: Mapping[str, str],
    now: datetime.datetime | None = None,
    cleared: Sequence[str] = (),
) -> Recommendation:
    """Turns a finalization report into the published form. The global environment is the
    overall decision's, as measured; per-size choices come from the per-size stage
    (`with_per_size`), measured under that environment."""
    overall = report.overall
    env = dict(overall.env)
    progress = study_progress(study)
    return Recommendation(
        scope=scope,
        decision="change" if overall.change else "keep-defaults",
        env=env,
        unset=sorted(set(report.baseline_env) - set(env)),
        cleared=list(cleared),
        baseline_env=dict(report.baseline_env),
        gain=_gain(overall, report),
        closest=_closest(overall, report),
        held_out=HeldOut.of(overall.holdout),
        per_size=[
            SizeRangeResult(
                bucket=b.name,
                min_bytes=b.min_bytes,
                max_bytes=b.max_bytes,
                metric=b.metric,
                decision="change" if report.buckets[b.name].change else "keep-defaults",
                env=dict(report.buckets[b.name].env),
                gain=_gain(report.buckets[b.name], report),
                closest=_closest(report.buckets[b.name], report),
                held_out=HeldOut.of(report.buckets[b.name].holdout),
            )
            for b in buckets
        ],
        evidence=Evidence(
            test=report.test,
            alpha=report.thresholds.alpha,
            min_effect=report.thresholds.min_effect,
            confidence=report.thresholds.confidence,
            rounds_run=report.rounds_run,
            rounds_used=report.rounds_used,
            family_size=report.family_size,
            family=report.family,
            allocations=len(report.allocations) or None,
            notes=list(report.notes),
            study=study.study_name,
            trials_counted=progress.counted,
            trials_complete=progress.complete,
            trials_failed=progress.failed,
        ),
        date=(now or datetime.datetime.now(datetime.UTC)).isoformat(timespec="seconds"),
        versions=dict(versions),
    )


def _gain(decision: Decision, report: FinalReport) -> Gain | None:
    if decision.winner is None:
        return None
    return Gain.of(decision.winner, report.thresholds.confidence)


def _closest(decision: Decision, report: FinalReport) -> Gain | None:
    closest = decision.closest
    if decision.change or closest is None:
        return None
    return Gain.of(closest, report.thresholds.confidence)


def with_per_size(rec: Recommendation, result: PerSizeResult) -> Recommendation:
    """`rec` with the per-size stage's decisions (run under rec.env); NCCL/RCCL get plugin rows."""
    # The scope counts GPUs, not CPU ranks (scope.ranks is nodes x GPUs per node): op and nodes must match;
    # the rule files name the sweep's own rank count.
    if (result.op, result.nodes) != (rec.scope.op, rec.scope.nodes):
        raise SweepError(
            f"per-size sweep of {result.op} on {result.nodes} nodes does not belong to scope {rec.scope.describe()}"
        )
    rows = plugin_rows(result) if rec.scope.library in ("nccl", "rccl") else []
    return rec.model_copy(update={"per_size_selection": result, "plugin_rules": rows})


def with_notes(rec: Recommendation, notes: Sequence[str]) -> Recommendation:
    """`rec` with `notes` after its evidence's notes."""
    if not notes:
        return rec
    return rec.model_copy(update={"evidence": rec.evidence.model_copy(update={"notes": [*rec.evidence.notes, *notes]})})


def with_deployed_check(rec: Recommendation, check: DeployedCheck) -> Recommendation:
    """`rec` with the deployed set's comparison with the defaults; a set refused there loses its per-size rules
    (the environment, measured by finalization, stays), or, when the environment alone measured in the same rounds
    failed there as well, everything (keep the defaults, also in the buckets that chose that environment); a note
    says why."""
    buckets = {name: HeldOut.of(h) for name, h in check.buckets.items()}
    ranges = [] if rec.per_size_selection is None else [r for r in rec.per_size_selection.ranges if r.selection]
    ruled = {b.bucket for b in rec.per_size for r in ranges if r.min_bytes <= b.max_bytes and b.min_bytes <= r.max_bytes}
    effect = {name: HeldOut.of(h) for name, h in check.rules_effect.items() if name in ruled}
    deployed = DeployedGain(overall=HeldOut.of(check.overall), rounds=check.rounds, withdrawn=check.refused,
                            environment_withdrawn=check.environment_refused,
                            buckets={name: h for name, h in buckets.items() if h is not None},
                            rules_effect={name: h for name, h in effect.items() if h is not None})
    if check.refused is None:
        notes = rec.evidence.notes
        if check.environment_refused is not None:
            notes = [*notes, f"the environment alone in the rounds of the deployed-set check: "
                             f"{check.environment_refused}; the deployed set (with the per-size rules) was not: "
                             "deployed as measured"]
        return rec.model_copy(update={"deployed": deployed,
                                      "evidence": rec.evidence.model_copy(update={"notes": notes})})
    update: dict[str, Any] = {"deployed": deployed}
    if not ranges:  # no rule: the environment alone was checked (never_slower off, and no rule restores a size)
        note = (f"the environment ({_env_text(rec.env)}), accepted with never_slower off for per-size rules to "
                f"restore the sizes it slows, withdrawn, keep the defaults: no rule was found, and against the site's "
                f"defaults it was {check.refused}")
        update |= _keep_defaults(rec)
    elif check.environment_refused is None:
        update |= {"per_size_selection": None, "plugin_rules": []}
        note = (f"per-size rules ({_rules_text(ranges)}) withdrawn, the environment alone is deployed; the environment "
                f"with them against the site's defaults: {check.refused}")
    else:
        update |= {"per_size_selection": None, "plugin_rules": [], **_keep_defaults(rec)}
        found = "" if rec.gain is None else f" (finalization: {rec.gain.describe()})"
        note = (f"per-size rules ({_rules_text(ranges)}) and the environment ({_env_text(rec.env)}{found}) withdrawn, "
                f"keep the defaults: the environment with the rules against the site's defaults: {check.refused}; "
                f"the environment alone in the same rounds: {check.environment_refused}")
    notes = [*rec.evidence.notes, note]
    return rec.model_copy(update={**update, "evidence": rec.evidence.model_copy(update={"notes": notes})})


def _keep_defaults(rec: Recommendation) -> dict[str, Any]:
    """The fields that turn `rec` into keep-the-defaults, in the buckets that chose its environment too."""
    kept = {"decision": "keep-defaults", "env": dict(rec.baseline_env), "gain": None, "closest": None, "held_out": None}
    return {**kept, "unset": [], "per_size": [b.model_copy(update=kept) if b.env == rec.env else b
                                              for b in rec.per_size]}


def _rules_text(ranges: Sequence[SizeRange]) -> str:
    return ", ".join(f"[{r.min_bytes}, {r.max_bytes}] B {r.selection.name}" for r in ranges if r.selection)


def _env_text(env: Mapping[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in sorted(env.items())) or "the defaults"
