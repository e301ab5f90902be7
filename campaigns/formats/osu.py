"""OSU micro-benchmark text output: a title line "# OSU MPI Latency Test v7.0" ("# OSU MPI-CUDA ...",
"# OSU NCCL ...": the library and the buffers' accelerator, then the benchmark), a column line "# Size  Latency (us)",
"# Size  Avg Latency(us)  Min Latency(us)  Max Latency(us)  Iterations" (-f), with "Validation" (-c) and
"P50 Tail Lat(us)" ... (-z) columns where asked for, then one row per size; OSU >= 7.1 names the datatype above
the column line ("# Datatype: MPI_CHAR.", once per datatype of -T).

The benchmark is its exact title, one of BENCHMARKS (commcamp stores what its ops mean: the point-to-point
latency and bandwidth tests and the blocking collectives of commbench's vocabulary); any other title (Reduce,
Gather, Scatter, Barrier, the v-variants, the non-blocking collectives, one-sided MPI_Put/MPI_Get, Multiple
Bandwidth / Message Rate, ...) is refused, naming it. Each row is read by the column line's names; a column this
parser does not know is refused, naming it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# Exact title (without "OSU <library>[-<accelerator>] " and the version) -> (commbench-style op name, what the
# value is). OSU's own names where commbench has no such op (osu_bw streams a window of messages: it is not
# commbench's pingpong goodput).
BENCHMARKS = {
    "Latency Test": ("pingpong", "latency"),
    "Bandwidth Test": ("osu_bw", "bandwidth"),
    "Bi-Directional Bandwidth Test": ("osu_bibw", "bandwidth"),
    "Allreduce Latency Test": ("allreduce", "latency"),
    "All-to-All Personalized Exchange Latency Test": ("alltoall", "latency"),
    "Allgather Latency Test": ("allgather", "latency"),
    "Reduce_scatter Latency Test": ("reduce_scatter", "latency"),
    "Broadcast Latency Test": ("bcast", "latency"),
}
_BY_TITLE = {title.lower(): found for title, found in BENCHMARKS.items()}
# Ops whose OSU size is what one rank sends to each peer (alltoall) or contributes (allgather): the record's
# bytes, the whole receive buffer of a rank (the schema's convention, commbench's and nccl-tests'), is size x ranks.
PER_RANK_SIZE_OPS = ("alltoall", "allgather")
_TITLE = re.compile(r"^#\s*OSU\s+(.*?)\s+v?(\d[\w.\-]*)\s*$", re.IGNORECASE)
# "MPI", "MPI-CUDA", "MPI-CUDA MANAGED", "NCCL", "RCCL", "XCCL-ROCM", ... then the benchmark
_LIBRARY = re.compile(r"^(MPI|NCCL|RCCL|XCCL|HCCL)(-(?:CUDA MANAGED|CUDA|ROCM|OPENACC|MANAGED))?\s+(.+)$",
                      re.IGNORECASE)
_CCL = ("nccl", "rccl", "xccl", "hccl")

# The column names OSU prints (c/util/osu_util*.c), longest first where one is the start of another.
_VALUE, _MIN, _MAX, _ITERATIONS, _VALIDATION, _TAIL = "value", "min", "max", "iterations", "validation", "tail"
_COLUMNS = (
    (re.compile(r"Size"), "size"),
    (re.compile(r"Avg Latency\s*\(us\)"), _VALUE),
    (re.compile(r"Latency\s*\(us\)"), _VALUE),
    (re.compile(r"Bandwidth\s*\(MB/s\)"), _VALUE),
    (re.compile(r"Min Latency\s*\(us\)"), _MIN),
    (re.compile(r"Max Latency\s*\(us\)"), _MAX),
    (re.compile(r"Iterations"), _ITERATIONS),
    (re.compile(r"Validation"), _VALIDATION),
    (re.compile(r"(P\d+) Tail (?:Lat\s*\(us\)|BW\s*\(MB/s\))"), _TAIL),
)


class OsuError(ValueError):
    """The input is not OSU output (the message says where)."""


@dataclass(frozen=True)
class Row:
    size: int
    value: float  # latency_us (average over ranks for collectives) or bandwidth_mbs (10^6 B/s)
    min_us: float | None = None  # -f (full) collectives
    max_us: float | None = None
    iterations: int | None = None
    passed: bool | None = None  # -c: the Validation column (Pass / Fail); None: not validated
    tail: tuple[tuple[str, float], ...] = ()  # -z: ("p99", value) in the value's unit
    dtype: str | None = None  # the "# Datatype: MPI_CHAR." line above it (OSU >= 7.1; -T runs several in turn)


@dataclass
class Run:
    title: str = ""  # "MPI Latency Test"
    version: str = ""  # "7.0"
    op: str = ""  # commbench-style name (see BENCHMARKS)
    quantity: str = ""  # "latency" (us) or "bandwidth" (MB/s)
    ccl: bool = False  # an osu_xccl_* / NCCL / RCCL variant: the collective library, not MPI, moved the data
    library: str = ""  # the title's library: "mpi", "nccl", "rccl", ...
    accelerator: str = ""  # where the buffers are, from the title: "cuda", "rocm", ... ("": host memory)
    columns: list[tuple[str, str]] = field(default_factory=list)  # (kind, name as printed) of the column line
    rows: list[Row] = field(default_factory=list)


def benchmark_of(title: str) -> tuple[str, str]:
    """'MPI Allreduce Latency Test' -> ('allreduce', 'latency'); an OsuError for a title that is not exactly one
    of BENCHMARKS."""
    match = _LIBRARY.match(title.strip())
    found = _BY_TITLE.get(" ".join(match.group(3).split()).lower()) if match else None
    if found is None:
        known = ", ".join(f"'{name}'" for name in BENCHMARKS)
        raise OsuError(f"{title!r} is not an OSU benchmark commcamp reads (OSU <library> followed by one of: "
                       f"{known})")
    return found


def _columns(line: str, where: str) -> list[tuple[str, str]]:
    """The column line's columns, in order: (kind, the name as printed)."""
    rest = line.lstrip("#").strip()
    columns: list[tuple[str, str]] = []
    while rest:
        for pattern, kind in _COLUMNS:
            if match := pattern.match(rest):
                columns.append((kind if kind != _TAIL else f"{_TAIL}:{match.group(1).lower()}", match.group(0)))
                rest = rest[match.end():].lstrip()
                break
        else:
            raise OsuError(f"{where}: column {rest!r} of {line.strip()!r} is not one commcamp reads")
    kinds = [kind for kind, _ in columns]
    if kinds[:1] != ["size"] or kinds.count(_VALUE) != 1 or len(set(kinds)) != len(kinds):
        raise OsuError(f"{where}: {line.strip()!r} is not an OSU column line commcamp reads (Size, then one latency "
                       "or bandwidth column)")
    return columns


def _row(words: list[str], columns: list[tuple[str, str]], where: str, line: str, dtype: str | None) -> Row:
    if len(words) != len(columns):
        raise OsuError(f"{where}: {len(words)} values for the {len(columns)} columns "
                       f"({', '.join(name for _, name in columns)}): {line!r}")
    fields: dict[str, object] = {}
    tail: list[tuple[str, float]] = []
    try:
        for (kind, name), word in zip(columns, words, strict=True):
            if kind == "size":
                fields["size"] = int(word)
            elif kind == _VALIDATION:
                if word not in ("Pass", "Fail"):
                    raise ValueError(f"{name} {word!r} is not Pass or Fail")
                fields["passed"] = word == "Pass"
            elif kind == _ITERATIONS:
                fields["iterations"] = int(word)
            elif kind.startswith(_TAIL):
                tail.append((kind.split(":", 1)[1], float(word)))
            else:
                fields[{_VALUE: "value", _MIN: "min_us", _MAX: "max_us"}[kind]] = float(word)
    except ValueError as exc:
        raise OsuError(f"{where}: not an OSU result row: {line!r} ({exc})") from None
    return Row(**fields, tail=tuple(tail), dtype=dtype)  # type: ignore[arg-type]


_DATATYPE = re.compile(r"^#\s*Datatype:\s*(\w+)")


def parse_text(text: str, source: str = "OSU output") -> Run:
    run = Run()
    dtype: str | None = None
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
                library = _LIBRARY.match(run.title.strip())
                run.library = library.group(1).lower() if library is not None else ""
                run.ccl = run.library in _CCL
                run.accelerator = (library.group(2) or "").lstrip("-").lower() if library is not None else ""
            elif match := _DATATYPE.match(stripped):
                dtype = match.group(1)
            elif run.title and re.match(r"#\s*Size\b", stripped):
                run.columns = _columns(stripped, where)
            continue
        words = stripped.split()
        if not words[0].isdigit():
            continue  # an MPI or library message
        if not run.title:
            raise OsuError(f"{where}: a result row before the '# OSU ... Test' title line")
        if not run.columns:
            raise OsuError(f"{where}: a result row before the '# Size ...' column line")
        run.rows.append(_row(words, run.columns, where, stripped, dtype))
    if not run.title:
        raise OsuError(f"{source}: no '# OSU ... Test' title line")
    if not run.rows:
        raise OsuError(f"{source}: no result rows")
    return run
