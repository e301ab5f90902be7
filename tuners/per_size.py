"""Per-size winners -> NCCL tuner-plugin config rows.

Row format (NCCL's example tuner plugin and commcamp's plugin in bench_src/nccl_tuner):
`collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff`,
first matching row wins, -1 = wildcard. Channels are always explicit: NCCL's example plugin sets
one channel before matching (shared/notes/field-knowledge.md). A bucket gets a row only if its
finalization winner forces one algorithm, one protocol and a channel count that the global
environment (applied to every size) does not disable; adjacent buckets with the same choice are
merged. Ranges cover measured sizes only (no extrapolation beyond them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic.dataclasses import dataclass

from tuners.evaluation import SizeBucket

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


def plugin_choice(env: Mapping[str, str]) -> tuple[str, str, int] | str:
    """(algorithm, protocol, channels) a plugin row can express for `env`, or why it cannot."""
    algorithm = PLUGIN_ALGORITHMS.get(env.get("NCCL_ALGO", ""))
    protocol = PLUGIN_PROTOCOLS.get(env.get("NCCL_PROTO", ""))
    channel_knob = next((k for k in CHANNEL_KNOBS if k in env), None)
    if algorithm is None or protocol is None or channel_knob is None:
        return (
            "the winner does not force one algorithm, one protocol and a channel count "
            f"(NCCL_ALGO={env.get('NCCL_ALGO', 'unset')}, NCCL_PROTO={env.get('NCCL_PROTO', 'unset')}, "
            f"channels {'unset' if channel_knob is None else env[channel_knob]})"
        )
    return algorithm, protocol, int(env[channel_knob])


def masked_by(global_env: Mapping[str, str], algorithm: str, protocol: str, channels: int) -> str | None:
    """Why the global environment would make NCCL ignore a row's choice (NCCL_ALGO/NCCL_PROTO
    remove the other algorithms/protocols from the cost table; CTA limits clamp channels), or None."""
    for knob, names, wanted in (
        ("NCCL_ALGO", PLUGIN_ALGORITHMS, algorithm),
        ("NCCL_PROTO", PLUGIN_PROTOCOLS, protocol),
    ):
        value = global_env.get(knob)
        if value is None:
            continue
        excluded = value.startswith("^")
        named = names.get(value.removeprefix("^"))
        if (named == wanted) == excluded:
            return f"the global {knob}={value} disables {wanted}"
    low = int(global_env.get("NCCL_MIN_CTAS", global_env.get("NCCL_MIN_NCHANNELS", "1")))
    high = int(global_env.get("NCCL_MAX_CTAS", global_env.get("NCCL_MAX_NCHANNELS", str(MAX_CHANNELS))))
    if not low <= channels <= high:
        return f"the global channel limits [{low}, {high}] exclude {channels} channels"
    return None


def plugin_rules(
    op: str,
    winners: Sequence[tuple[SizeBucket, Mapping[str, str] | None]],
    n_nodes: int,
    n_ranks: int,
    global_env: Mapping[str, str],
) -> tuple[list[TunerRule], list[str]]:
    """Rows for the buckets (ascending) whose winner (None = keep defaults) the plugin can express
    on top of `global_env`; notes say why other buckets got none."""
    collective = PLUGIN_COLLECTIVES.get(op)
    if collective is None:
        return [], [f"op {op} has no tuner-plugin collective (only {sorted(set(PLUGIN_COLLECTIVES.values()))})"]
    rules: list[TunerRule] = []
    notes = []
    for bucket, env in winners:
        if env is None:
            notes.append(f"{bucket.name}: keep defaults (no significant winner), no row")
            continue
        choice = plugin_choice(env)
        if isinstance(choice, str):
            notes.append(f"{bucket.name}: {choice}, no row")
            continue
        algorithm, protocol, channels = choice
        masked = masked_by(global_env, algorithm, protocol, channels)
        if masked is not None:
            notes.append(f"{bucket.name}: {masked}, no row")
            continue
        previous = rules[-1] if rules else None
        if (
            previous is not None
            and previous.max_bytes + 1 == bucket.min_bytes
            and (previous.algorithm, previous.protocol, previous.channels) == choice
        ):
            rules[-1] = TunerRule(
                collective, previous.min_bytes, bucket.max_bytes, algorithm, protocol, channels, n_nodes, n_ranks
            )
        else:
            rules.append(
                TunerRule(
                    collective, bucket.min_bytes, bucket.max_bytes, algorithm, protocol, channels, n_nodes, n_ranks
                )
            )
    return rules, notes


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
