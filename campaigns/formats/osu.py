"""OSU micro-benchmark text output (osu_latency, osu_bw, osu_bibw, the blocking collectives and their
osu_xccl_* variants): a title line "# OSU MPI Latency Test v7.0", a column line "# Size  Latency (us)"
or "# Size  Avg Latency(us)  Min Latency(us)  Max Latency(us)  Iterations" (with -f), then one row per
size. The benchmark is read from the title; the value's unit from the column line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# Title words -> (commbench-style op name, what the value is). OSU's own names where commbench has no
# such op (osu_bw streams a window of messages: it is not commbench's pingpong goodput).
_BENCHMARKS = (
    ("bi-directional bandwidth", "osu_bibw", "bandwidth"),
    ("bandwidth", "osu_bw", "bandwidth"),
    ("allreduce", "allreduce", "latency"),
    ("all-to-all", "alltoall", "latency"),
    ("alltoall", "alltoall", "latency"),
    ("allgather", "allgather", "latency"),
    ("reduce_scatter", "reduce_scatter", "latency"),
    ("reduce-scatter", "reduce_scatter", "latency"),
    ("broadcast", "bcast", "latency"),
    ("bcast", "bcast", "latency"),
    ("latency", "pingpong", "latency"),
)
_TITLE = re.compile(r"^#\s*OSU\s+(.*?)\s+v?(\d[\w.\-]*)\s*$", re.IGNORECASE)


class OsuError(ValueError):
    """The input is not OSU output (the message says where)."""


@dataclass(frozen=True)
class Row:
    size: int
    value: float  # latency_us (average over ranks for collectives) or bandwidth_mbs (10^6 B/s)
    min_us: float | None = None  # -f (full) collectives
    max_us: float | None = None
    iterations: int | None = None


@dataclass
class Run:
    title: str = ""  # "MPI Latency Test"
    version: str = ""  # "7.0"
    op: str = ""  # commbench-style name (see _BENCHMARKS)
    quantity: str = ""  # "latency" (us) or "bandwidth" (MB/s)
    ccl: bool = False  # an osu_xccl_* / NCCL / RCCL variant: the collective library, not MPI, moved the data
    rows: list[Row] = field(default_factory=list)


def benchmark_of(title: str) -> tuple[str, str]:
    """'MPI Allreduce Latency Test' -> ('allreduce', 'latency')."""
    lowered = title.lower()
    for words, op, quantity in _BENCHMARKS:
        if words in lowered:
            return op, quantity
    raise OsuError(f"{title!r} is not an OSU benchmark commcamp reads (latency, bandwidth, bi-directional "
                   f"bandwidth, allreduce, alltoall, allgather, reduce_scatter, broadcast)")


def parse_text(text: str, source: str = "OSU output") -> Run:
    run = Run()
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source}:{number}"
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if match := _TITLE.match(stripped):
                if run.title:  # its rows would be stored as the first benchmark's
                    raise OsuError(f"{where}: a second OSU run ({match.group(1)!r}) after the rows of "
                                   f"{run.title!r}: give one benchmark run per file")
                run.title, run.version = match.group(1), match.group(2)
                run.op, run.quantity = benchmark_of(run.title)
                run.ccl = bool(re.search(r"\b(nccl|rccl|xccl|hccl)\b", run.title, re.IGNORECASE))
            continue
        words = stripped.split()
        if not words[0].isdigit():
            continue  # an MPI or library message
        if not run.title:
            raise OsuError(f"{where}: a result row before the '# OSU ... Test' title line")
        try:
            values = [float(word) for word in words[1:]]
        except ValueError:
            raise OsuError(f"{where}: not an OSU result row: {stripped!r}") from None
        if not values:
            raise OsuError(f"{where}: a size without a value: {stripped!r}")
        full = len(values) >= 4
        run.rows.append(Row(int(words[0]), values[0], values[1] if full else None, values[2] if full else None,
                            int(values[3]) if full else None))
    if not run.title:
        raise OsuError(f"{source}: no '# OSU ... Test' title line")
    if not run.rows:
        raise OsuError(f"{source}: no result rows")
    return run
