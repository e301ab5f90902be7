"""The per-size stage: per message size, the library's own choice against its forced selections.

Input: one selection sweep (commbench --selections all --rounds R), run under the environment the
Optuna stage chose: per (size, selection) the per-round medians, the same round index paired
across the selections of one size (they ran interleaved in one process).

1. Split the rounds: even-indexed rounds (0, 2, 4, ...) SELECT, odd-indexed rounds CONFIRM.
   Alternating, not first half / second half, so slow drift hits both halves alike.
2. Per size, rank the available forced selections by their median per-round speed-up over the
   library's own choice in the selection rounds; the best `top` that are faster there are the
   candidates of that size (none faster: nothing tested, keep the library's choice). A selection the
   sweep stopped early (commbench --stop-slower F --stop-after K: at least F times own's time in K - 1 or
   all of the selection rounds 0, 2, ..., 2K-2; the confirmation rounds play no part) is no candidate: it
   saves the sweep's costliest cells, and replayed on the committed sweeps (results/bench/sweep_stop_rule.json)
   the shipped rule changes no size's candidates.
3. On the confirmation rounds only, each (size, candidate) is tested with finalize's rule
   (finalize.decide_paired: one-sided exact Wilcoxon on the paired per-round log ratios minus
   log(1 + min_effect), order-statistic CI of the median, ONE Holm correction over every test of every
   size). A size's winner is, of its accepted candidates, the one the selection rounds ranked first. The gains
   reported are those of the confirmation rounds, which neither picked the candidates nor chose among them, but
   decided that the size changes: a gain just past the test reads high (300 simulated sweeps of a true 6 % gain:
   7.4 % on average where accepted), so they are labelled so; the deployed-set check measures what is deployed
   on rounds of its own (session.deployed_check: `deployed` in recommendations.yaml).
4. Neighbouring measured sizes with the same winner merge into a range [first, last measured
   size]; sizes without a significant winner keep the library's choice. Ranges cover measured
   sizes only: between two ranges, and outside the measured span, the library decides.

The NCCL/RCCL tuner-plugin rows (TunerRule) are one of the per-library outputs (tuners/rule_files.py
writes the others). Row format (NCCL's example tuner plugin and commcamp's plugin in
bench_src/nccl_tuner): `collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,
numPipeOps,regBuff`, first matching row wins, -1 = wildcard; channels are always explicit (NCCL's
example plugin sets one channel before matching: shared/notes/field-knowledge.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict
from pydantic.dataclasses import dataclass

from tuners.finalize import Candidate, Thresholds, decide_paired, rounds_needed

PLUGIN_COLLECTIVES = {
    "allreduce": "allreduce",
    "allgather": "allgather",
    "reduce_scatter": "reducescatter",
    "bcast": "broadcast",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
PLUGIN_ALGORITHMS = {
    "Ring": "ring",
    "Tree": "tree",
    "CollnetDirect": "collnet_direct",
    "CollnetChain": "collnet_chain",
    "NVLS": "nvls",
    "NVLSTree": "nvls_tree",
    "PAT": "pat",
}
PLUGIN_PROTOCOLS = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}
CHANNEL_KNOBS = ("NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS")
MAX_CHANNELS = 64  # CC_NCCL_MAX_CHANNELS of the commcamp plugin
FIELDS = (
    "collective",
    "min_bytes",
    "max_bytes",
    "algorithm",
    "protocol",
    "channels",
    "nNodes",
    "nRanks",
    "numPipeOps",
    "regBuff",
)


class TunerConfigError(ValueError):
    pass


@dataclass(frozen=True)
class TunerRule:
    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    n_nodes: int
    n_ranks: int
    num_pipe_ops: int = -1
    reg_buff: int = -1

    def __post_init__(self) -> None:
        if self.collective not in PLUGIN_COLLECTIVES.values():
            raise TunerConfigError(f"collective {self.collective!r} is not one the plugin knows")
        if self.algorithm not in PLUGIN_ALGORITHMS.values():
            raise TunerConfigError(f"algorithm {self.algorithm!r} is not one the plugin knows")
        if self.protocol not in PLUGIN_PROTOCOLS.values():
            raise TunerConfigError(f"protocol {self.protocol!r} is not one the plugin knows")
        if not 0 <= self.min_bytes <= self.max_bytes:
            raise TunerConfigError(f"byte range [{self.min_bytes}, {self.max_bytes}] is empty or negative")
        if not 1 <= self.channels <= MAX_CHANNELS:
            raise TunerConfigError(f"channels {self.channels} outside 1..{MAX_CHANNELS} (always explicit)")
        for name, value in (("nNodes", self.n_nodes), ("nRanks", self.n_ranks), ("numPipeOps", self.num_pipe_ops)):
            if value != -1 and value < 1:
                raise TunerConfigError(f"{name} {value} must be -1 or >= 1")
        if self.reg_buff not in (-1, 0, 1):
            raise TunerConfigError(f"regBuff {self.reg_buff} must be -1, 0 or 1")

    def line(self) -> str:
        return ",".join(
            str(v)
            for v in (
                self.collective,
                self.min_bytes,
                self.max_bytes,
                self.algorithm,
                self.protocol,
                self.channels,
                self.n_nodes,
                self.n_ranks,
                self.num_pipe_ops,
                self.reg_buff,
            )
        )

    @classmethod
    def parse(cls, line: str) -> TunerRule:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(FIELDS):
            raise TunerConfigError(f"{line!r}: expected {len(FIELDS)} fields ({','.join(FIELDS)})")
        try:
            numbers = [int(f) for f in (fields[1], fields[2], *fields[5:])]
        except ValueError as exc:
            raise TunerConfigError(f"{line!r}: {exc}") from exc
        min_bytes, max_bytes, channels, n_nodes, n_ranks, pipe_ops, reg_buff = numbers
        return cls(
            fields[0], min_bytes, max_bytes, fields[3], fields[4], channels, n_nodes, n_ranks, pipe_ops, reg_buff
        )


def format_config(groups: Sequence[tuple[Sequence[str], Sequence[TunerRule]]]) -> str:
    """Config text: per group its comment lines, then its rows. The header is a comment so that
    plugins that do not skip a header line never read it as a rule."""
    lines = ["# " + ",".join(FIELDS)]
    for comments, rules in groups:
        lines.extend(f"# {comment}" for comment in comments)
        lines.extend(rule.line() for rule in rules)
    return "\n".join(lines) + "\n"


def parse_config(text: str) -> list[TunerRule]:
    return [TunerRule.parse(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]


OWN = "own"  # the library's own choice: the baseline of every size
Mechanism = Literal["mpi_t", "plugin", "process"]


class SweepError(ValueError):
    pass


class Selection(BaseModel):
    """One selection of the sweep, as its record says (commbench --selections)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    mechanism: Mechanism
    cvar: str | None = None
    value: int | None = None
    segsize: int | None = None  # Open MPI: written to <cvar>_segmentsize with value
    algorithm: int | None = None  # NCCL tuner plugin: NCCL_ALGO_* index, protocol NCCL_PROTO_*, channel count
    protocol: int | None = None
    channels: int | None = None
    reported: dict[str, int | str] | None = None  # what the library reported it used (last round)
    available: bool = True
    reason: str | None = None
    stopped_after: int | None = None  # the sweep stopped it after these rounds: far slower than own (--stop-slower)

    @property
    def deployable(self) -> bool:
        """Whether a rule can carry it: a tuner-plugin row always names algorithm, protocol and channel count,
        so a plugin selection without a channel count ("ring/ll", NCCL choosing the channels) is measured
        for comparison but never a candidate."""
        return self.mechanism != "plugin" or self.name.count("/") == 2


@dataclass(frozen=True)
class Sweep:
    """A selection sweep of one op: per size, per selection name, the per-round medians (us)."""

    op: str
    library: str
    ranks: int
    nodes: int
    selections: Mapping[str, Selection]
    rounds: Mapping[int, Mapping[str, tuple[float, ...]]]  # size -> selection name -> per-round medians
    stopped: Mapping[int, Sequence[str]]  # size -> the selections the sweep stopped early there (no candidates)

    @property
    def sizes(self) -> list[int]:
        return sorted(self.rounds)


def load_sweep(records: Sequence[Mapping[str, Any]]) -> Sweep:
    """The sweep in result records (already schema-validated by campaigns.model.records). Every swept size needs
    the library's own choice and the same number of rounds for all its available selections, except those the
    sweep stopped early (commbench --stop-slower: at least that many times own's time in all but one of the
    selection rounds it judges), which are no candidates there."""
    results = [r for r in records if r.get("kind", "result") == "result" and "selection" in r]
    if not results:
        raise SweepError("no selection-sweep records (result records with a 'selection')")
    first = results[0]
    op, library, ranks, nodes = first["op"], first.get("mpi_library") or "", int(first["ranks"]), int(first["nodes"])
    selections: dict[str, Selection] = {}
    rounds: dict[int, dict[str, tuple[float, ...]]] = {}
    stopped: dict[int, list[str]] = {}
    for record in results:
        where = f"record op={record.get('op')} bytes={record.get('bytes')}"
        if (record["op"], int(record["ranks"]), int(record["nodes"])) != (op, ranks, nodes):
            raise SweepError(f"{where}: mixes sweeps (expected op={op}, ranks={ranks}, nodes={nodes})")
        selection = Selection.model_validate(record["selection"])
        # stopped_after and its reason belong to one size, not to the selection; so may unavailability (MPICH:
        # an algorithm whose restriction only some sizes break, rule_files.mpich_restrict_sweep): the selection
        # kept is its first available one
        kept = (selection.model_copy(update={"stopped_after": None, "reason": None}) if selection.stopped_after
                else selection)
        known = selections.setdefault(selection.name, kept)
        if selection.available and not known.available:
            known = selections[selection.name] = kept
        if (known.mechanism, known.cvar, known.value, known.segsize, known.algorithm, known.protocol,
                known.channels) != (selection.mechanism, selection.cvar, selection.value, selection.segsize,
                                    selection.algorithm, selection.protocol, selection.channels):
            raise SweepError(f"{where}: selection {selection.name!r} is not the same selection as before")
        if not selection.available or not record.get("valid", True):
            continue
        if selection.stopped_after:
            stopped.setdefault(int(record["bytes"]), []).append(selection.name)
            continue
        medians = tuple(float(t) for t in record.get("round_medians") or ())
        if not medians or min(medians) <= 0 or not all(np.isfinite(medians)):
            raise SweepError(f"{where} selection {selection.name!r}: round_medians must be positive numbers")
        rounds.setdefault(int(record["bytes"]), {})[selection.name] = medians
    # A swept size without a valid record (wrong data, an error record) is no gap between neighbouring sizes: merged
    # over, their rule would force a selection there that was never validated at it (or corrupted data there).
    for size in {int(r["bytes"]) for r in records if "selection" in r and r.get("bytes")} - set(rounds):
        rounds[size] = {}
    for size, by_name in rounds.items():
        if OWN not in by_name:
            raise SweepError(f"size {size}: no valid measurement of the library's own choice ({OWN!r})")
        lengths = {len(m) for m in by_name.values()}
        if len(lengths) != 1:
            raise SweepError(f"size {size}: selections have different round counts {sorted(lengths)}: not paired")
    return Sweep(op, library, ranks, nodes, selections, rounds, stopped)


class SizeDecision(BaseModel):
    """What the per-size stage decided for one measured size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bytes: int
    winner: str | None  # a selection name; None = keep the library's choice
    candidates: list[str]  # picked on the selection rounds, tested on the confirmation rounds
    stopped: list[str] = []  # stopped early by the sweep (far slower than the library's choice): no candidates
    gain: float | None = None  # the winner's (or the closest candidate's) median speed-up, confirmation rounds
    ci_low: float | None = None
    ci_high: float | None = None
    p_adjusted: float | None = None
    reason: str


class SizeRange(BaseModel):
    """Neighbouring measured sizes with the same winner: [min_bytes, max_bytes] (inclusive)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_bytes: int
    max_bytes: int
    selection: Selection | None  # None: the library's own choice
    gains: list[float]  # per measured size of the range (confirmation rounds); empty when kept


class PerSizeResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    op: str
    library: str
    ranks: int
    nodes: int
    rounds: int
    selection_rounds: int
    confirmation_rounds: int
    family_size: int
    test: str
    sizes: list[SizeDecision]
    ranges: list[SizeRange]
    stop_slower: float = 0  # the sweep's stop rule (commbench --stop-slower F --stop-after K); 0: none
    stop_after: int = 0

    def at(self, size: int) -> SizeRange | None:
        """The range holding `size` (None: outside every range, the library decides)."""
        return next((r for r in self.ranges if r.min_bytes <= size <= r.max_bytes), None)


def split_rounds(n_rounds: int) -> tuple[list[int], list[int]]:
    """(selection rounds, confirmation rounds): even and odd round indices."""
    return list(range(0, n_rounds, 2)), list(range(1, n_rounds, 2))


def stops_early(own: Sequence[float], times: Sequence[float], factor: float, after: int) -> bool:
    """commbench's --stop-slower rule (bench_src/src/driver.c, stop_slow_selections) on recorded round medians, to
    replay it on sweeps run without it: in all but at most one of the even-indexed rounds 0, 2, ..., 2 x after - 2
    the selection took at least `factor` times own's time. It runs once those rounds are done, before round
    2 x after - 1: a sweep with fewer rounds than 2 x after never stops."""
    if len(own) < 2 * after:
        return False
    slower = sum(times[r] >= factor * own[r] for r in range(0, 2 * after, 2))
    return slower >= after - 1


def rounds_for(n_sizes: int, top: int, alpha: float) -> int:
    """Sweep rounds needed so that a change is possible at all: the confirmation half must reach
    finalize.rounds_needed of the largest family (every size with `top` candidates: min_rounds + margin)."""
    return 2 * rounds_needed(n_sizes * top, alpha)


def _log_ratios(baseline: Sequence[float], other: Sequence[float], rounds: Sequence[int]) -> np.ndarray:
    return np.log(np.asarray([baseline[i] for i in rounds])) - np.log(np.asarray([other[i] for i in rounds]))


def decide_per_size(
    sweep: Sweep, *, thresholds: Thresholds = Thresholds(), top: int = 3
) -> PerSizeResult:
    """Steps 1-4 of the module docstring."""
    n_rounds = len(next(iter(sweep.rounds[sweep.sizes[0]].values())))
    picking, confirming = split_rounds(n_rounds)
    candidates: dict[str, list[Candidate]] = {}
    log_ratios: dict[str, dict[int, np.ndarray]] = {}
    for size in sweep.sizes:
        measured = sweep.rounds[size]
        own = measured[OWN]
        if len(own) != n_rounds:
            raise SweepError(f"size {size}: {len(own)} rounds, other sizes {n_rounds}")
        scored = sorted(
            ((float(np.median(_log_ratios(own, times, picking))), name) for name, times in measured.items()
             if name != OWN and sweep.selections[name].deployable),
            reverse=True,
        )
        picked = [name for score, name in scored[:top] if score > 0]
        candidates[str(size)] = [Candidate({"selection": name}) for name in picked]
        log_ratios[str(size)] = {i: _log_ratios(own, measured[name], confirming) for i, name in enumerate(picked)}
    decisions, family = decide_paired(
        {"selection": OWN}, candidates, log_ratios, {name: {} for name in candidates}, thresholds
    )
    sizes = []
    for size in sweep.sizes:
        decision = decisions[str(size)]
        # Of the accepted candidates, the one the selection rounds ranked first: the largest gain on the
        # confirmation rounds (finalize's choice) would report, from the rounds that chose it, the largest of
        # several estimates, biased upwards.
        winner = next((c for c in decision.comparisons if c.accepted), None)
        shown = winner or decision.closest
        sizes.append(
            SizeDecision(
                bytes=size,
                winner=winner.candidate.env["selection"] if winner else None,
                candidates=[c.env["selection"] for c in candidates[str(size)]],
                stopped=list(sweep.stopped.get(size, ())),
                gain=None if shown is None else shown.gain,
                ci_low=None if shown is None else shown.ci_low,
                ci_high=None if shown is None else shown.ci_high,
                p_adjusted=None if shown is None else shown.p_adjusted,
                reason=(
                    "no selection faster than the library's own choice in the selection rounds"
                    if not candidates[str(size)]
                    else shown.reason if shown is not None else "not tested"
                ),
            )
        )
    return PerSizeResult(
        op=sweep.op,
        library=sweep.library,
        ranks=sweep.ranks,
        nodes=sweep.nodes,
        rounds=n_rounds,
        selection_rounds=len(picking),
        confirmation_rounds=len(confirming),
        family_size=family,
        test=(
            f"candidates: the best {top} selections per size by median speed-up over the library's own choice "
            f"in the {len(picking)} even-indexed rounds; decided on the {len(confirming)} odd-indexed rounds only: "
            "one-sided Wilcoxon signed-rank test on paired per-round log time ratios minus "
            f"log(1+{thresholds.min_effect:g}), Holm over all {family} tests (every size x its candidates), "
            f"alpha={thresholds.alpha} (a family of its own: with the environment's finalization, P(any false "
            f"change in the recommendation) <= {2 * thresholds.alpha:g}); accepted if Holm-adjusted p < alpha, median speed-up >= "
            f"{thresholds.min_effect:.0%} and the {thresholds.confidence:.0%} CI's lower bound > 0 (order statistics); "
            "a size's winner: of its accepted selections, the one the selection rounds ranked first"
        ),
        sizes=sizes,
        ranges=merge_ranges(sweep, sizes),
    )


def merge_ranges(sweep: Sweep, sizes: Sequence[SizeDecision]) -> list[SizeRange]:
    """Runs of neighbouring measured sizes with the same winner (step 4)."""
    ranges: list[SizeRange] = []
    for decision in sizes:
        selection = None if decision.winner is None else sweep.selections[decision.winner]
        gains = [] if selection is None or decision.gain is None else [decision.gain]
        previous = ranges[-1] if ranges else None
        if previous is not None and previous.selection == selection:
            ranges[-1] = previous.model_copy(update={"max_bytes": decision.bytes, "gains": previous.gains + gains})
        else:
            ranges.append(SizeRange(min_bytes=decision.bytes, max_bytes=decision.bytes, selection=selection, gains=gains))
    return ranges


def plugin_name(names: Mapping[str, str], name: str) -> str:
    """The plugin's spelling of an NCCL env name ("Ring") or of commbench's selection name ("ring")."""
    if name in names.values():
        return name
    return names[name]


def plugin_rows(result: PerSizeResult) -> list[TunerRule]:
    """Tuner-plugin rows for the ranges whose winner is a plugin selection ("Ring/Simple/8")."""
    collective = PLUGIN_COLLECTIVES.get(result.op)
    rows = []
    for size_range in result.ranges:
        selection = size_range.selection
        if selection is None or selection.mechanism != "plugin":
            continue
        if collective is None:
            raise TunerConfigError(f"op {result.op} has no tuner-plugin collective")
        try:
            algorithm, protocol, channels = selection.name.split("/")
            # NCCL's node count, which the rule must match, is not always the host count (socket transport
            # between processes of one host: one per process); commbench records it when the plugin tells.
            nodes = int((selection.reported or {}).get("nccl_nodes", result.nodes))
            row = TunerRule(
                collective, size_range.min_bytes, size_range.max_bytes, plugin_name(PLUGIN_ALGORITHMS, algorithm),
                plugin_name(PLUGIN_PROTOCOLS, protocol), int(channels), nodes, result.ranks,
            )
        except (ValueError, KeyError) as exc:
            raise TunerConfigError(f"plugin selection {selection.name!r} is not algorithm/protocol/channels: {exc}") from exc
        rows.append(row)
    return rows
