"""nccl-tests (and rccl-tests, same output) parsed from its text table or its JSON file.

Text: the header ("# nccl-tests version 2.19.6 ...", "# nThread 1 nGpus 1 ... iters: 20 ..."), the
"#  Rank  0 Group  0 Pid 5108 on vm device 0 [0000:00:06] NVIDIA H200" lines and one row per size:
size count type redop root | out-of-place time algbw busbw #wrong | in-place time algbw busbw #wrong
[| with -I each placement is followed by i_min i_max i_p99 i_cv%], and the closing lines "# Out of bounds values :
N OK" and "# Avg bus bandwidth : X" (`Run.complete`: an output without them was cut off). A row must have every
column of its table (a job killed mid-row leaves a short one: refused); with -S 1 (report_timestamps) each row
ends with the date and time it was printed. Other lines (NCCL or MPI messages) are skipped. Times of -C 1
(report_cputime: taken before the operations complete) are refused, in text and JSON.
JSON: nccl-tests >= 2.18 `-J FILE` (JSON_FILE_VERSION 3, src/util.cu): start_time (the local time of the host
that ran it, no offset), config (with the devices), results with out_of_place / in_place and, with `-I 1`,
*_per_iter (times_us and per_process_max_times_us, less their first skipped_iterations: -K), args (-a: how the
ranks' times make one); the file is valid JSON only once nccl-tests finished it.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

JSON_FILE_VERSION = 3

# nccl-tests binary -> commbench op name (the vocabulary the store, health and report use)
OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "alltoall": "alltoall", "sendrecv": "sendrecv",
       "broadcast": "bcast", "reduce_scatter": "reduce_scatter", "reduce": "reduce", "gather": "gather",
       "scatter": "scatter"}
# nccl-tests benchmarks whose printed size is not the bytes their bandwidth counts (src/hypercube.cu: count x (n-1)
# of a size of count x n; src/alltoallv.cu: the largest rank's share of a generated pattern): not read
UNREAD = {"hypercube": "its bandwidth counts size x (ranks - 1) / ranks bytes",
          "alltoallv": "its bandwidth counts the busiest rank's bytes of its pattern, not the size"}


class NcclTestsError(ValueError):
    """The input is not nccl-tests output (the message says where)."""


@dataclass(frozen=True)
class Placement:
    """Out-of-place or in-place result of one size."""

    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None  # None: not checked ("N/A")
    times_us: tuple[float, ...] = ()  # per iteration (JSON with -I): max over processes
    per_process_us: tuple[tuple[float, ...], ...] = ()  # per process, per iteration (JSON with -I)


@dataclass(frozen=True)
class Row:
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    out_of_place: Placement | None
    in_place: Placement | None


@dataclass
class Run:
    """One nccl-tests output: header facts, the ranks' hosts and devices, the rows in size order."""

    version: str = ""  # "2.19.6"
    library: str = "nccl"  # "rccl" for rccl-tests ("# rccl-tests version ... rccl-library=22707")
    nccl_version: str = ""  # "22803" (text: nccl-library) or the integer NCCL_VERSION_CODE (JSON)
    env: dict[str, str] = field(default_factory=dict)  # JSON: the environment nccl-tests ran with ("env")
    op: str = ""  # commbench's name, from the binary ("all_reduce_perf" -> "allreduce")
    iters: int | None = None
    warmup: int | None = None
    agg_iters: int = 1  # operations launched (in one group) per iteration: -m
    graph_launches: int = 0  # -G N: the iterations captured in a CUDA graph launched N times (0: no graph)
    time_over_ranks: str = "mean"  # -a: how the ranks' times make the printed one (JSON args; the text does not say)
    params: str = ""
    hosts: list[str] = field(default_factory=list)  # by rank
    devices: list[str] = field(default_factory=list)  # by rank, as printed
    rows: list[Row] = field(default_factory=list)
    per_iter: bool = False  # -I: the times of every iteration (JSON) / their summary columns (text)
    complete: bool = False  # the output reached nccl-tests' closing lines (text) or is a finished JSON file
    out_of_bounds: int | None = None  # "# Out of bounds values : N" (JSON: out_of_bounds.count)
    start_time: datetime | None = None  # JSON start_time (naive: the local time of the host that ran it)


def library_version(code: str) -> str:
    """NCCL's (RCCL's) version code as its version: 22803 -> 2.28.3 (from 2.9: major x 10000 + minor x 100 +
    patch; before: major x 1000 + minor x 100 + patch); "" when not a code."""
    if not code.isdigit():
        return ""
    number = int(code)
    major, rest = divmod(number, 10000 if number >= 20900 else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def op_of(program: str) -> str:
    """'./build/all_reduce_perf' or 'all_reduce_perf_mpi' -> 'allreduce'."""
    name = re.sub(r"_perf(_mpi)?$", "", os.path.basename(program))
    if name in UNREAD:
        raise NcclTestsError(f"{program!r}: commcamp does not read {name}_perf ({UNREAD[name]})")
    if name not in OPS:
        raise NcclTestsError(f"{program!r} is not an nccl-tests benchmark ({', '.join(sorted(OPS))})")
    return OPS[name]


_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(.*)$")
_VERSION = re.compile(r"^# ([nr]ccl)-tests version (\S+)(?:.*[nr]ccl-library=(\d+))?")
_TEST = re.compile(r"^# Collective test starting: (\S+)")
_ITERS = re.compile(r"warmup iters: (\d+) iters: (\d+)")
_AGG_ITERS = re.compile(r"agg iters: (\d+)")
_GRAPH = re.compile(r"graph: (\d+)")
_TABLE_HEADER = re.compile(r"^#\s+size\s+count\s+type\b")
_TIMESTAMP = (re.compile(r"\d{4}-\d\d-\d\d"), re.compile(r"\d\d:\d\d:\d\d"))  # -S 1: a row's last two words
# -a: how nccl-tests makes one time of the ranks' (Allreduce of the time in src/common.cu)
_AVERAGE = {"0": "rank 0", "1": "mean", "2": "min", "3": "max"}
CPUTIME = ("the times are CPU times (-C 1, --report_cputime: taken before the operations complete, the launch "
           "only): not a measurement of the operation; run nccl-tests without -C")
_OUT_OF_BOUNDS = re.compile(r"^# Out of bounds values\s*:\s*(\d+)")
_AVERAGE_BUSBW = re.compile(r"^# Avg bus bandwidth\s*:")
# Columns of a row: size count type redop root, then per placement time algbw busbw #wrong (with -I also
# i_min i_max i_p99 i_cv%); out-of-place is blank where nccl-tests measures in-place only (trace replay).
_ROW_HEAD, _PLACEMENT_COLUMNS, _PER_ITER_COLUMNS = 5, 4, 8


def _wrong(text: str | float | None, where: str) -> int | None:
    if text is None or text == "N/A":
        return None
    try:
        return int(float(text))
    except ValueError:
        raise NcclTestsError(f"{where}: #wrong {text!r} is not a number") from None


def parse_text(text: str, source: str = "nccl-tests output") -> Run:
    """Parse nccl-tests stdout; a row that looks like a table row but does not parse is an error."""
    run = Run()
    per_iter = timestamps = False
    row_width = 0  # the columns of the table's rows, once its first row is read
    hosts: dict[int, str] = {}
    devices: dict[int, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source}:{number}"
        if line.startswith("#"):
            if match := _VERSION.match(line):
                run.library, run.version, run.nccl_version = match.group(1), match.group(2), match.group(3) or ""
            elif match := _TEST.match(line):
                if run.op:  # every row would be stored under the last benchmark's op
                    raise NcclTestsError(f"{where}: a second nccl-tests run ({match.group(1)}) after the rows of "
                                         f"{run.op}: give one benchmark run per file")
                run.op = op_of(match.group(1))
            elif line.startswith("# Per-Iteration Report"):
                per_iter = True  # -I: each placement has four more columns
            elif line.startswith("# nThread"):
                run.params = line[2:].strip()
                if match := _ITERS.search(line):
                    run.warmup, run.iters = int(match.group(1)), int(match.group(2))
                if match := _AGG_ITERS.search(line):
                    run.agg_iters = int(match.group(1))
                if match := _GRAPH.search(line):
                    run.graph_launches = int(match.group(1))
            elif _TABLE_HEADER.match(line):
                if "cputime" in line.split():
                    raise NcclTestsError(f"{where}: {CPUTIME}")
                timestamps = "timestamp" in line.split()
            elif match := _RANK.match(line):
                rank = int(match.group(1))
                hosts[rank], devices[rank] = match.group(2), " ".join(match.group(3).split())
            elif match := _OUT_OF_BOUNDS.match(line):
                run.out_of_bounds, run.complete = int(match.group(1)), True
            elif _AVERAGE_BUSBW.match(line):
                run.complete = True
            continue
        words = line.split()
        if len(words) < 2 or not (words[0].isdigit() and words[1].isdigit()):
            continue
        if timestamps and len(words) > 2 and all(p.fullmatch(w) for p, w in zip(_TIMESTAMP, words[-2:])):
            words = words[:-2]  # -S 1: when the row was printed
        width = _PER_ITER_COLUMNS if per_iter else _PLACEMENT_COLUMNS
        # A killed job's last row is cut short; one cut right after its out-of-place columns looks like an
        # in-place-only row, which nccl-tests prints for a whole table or not at all: the table's first row decides.
        expected = [row_width] if row_width else [_ROW_HEAD + 2 * width, _ROW_HEAD + width]
        if len(words) not in expected:
            raise NcclTestsError(f"{where}: an incomplete nccl-tests row ({len(words)} columns, not "
                                 f"{' or, in-place only, '.join(map(str, expected))}; the output was cut off?): "
                                 f"{line.strip()!r}")
        row_width = len(words)
        groups = [words[start:start + _PLACEMENT_COLUMNS] for start in range(_ROW_HEAD, len(words), width)]
        try:
            root = int(words[4])
            placements = [Placement(float(t), float(a), float(b), _wrong(w, where)) for t, a, b, w in groups[:2]]
        except ValueError as exc:
            raise NcclTestsError(f"{where}: not an nccl-tests row: {line.strip()!r} ({exc})") from None
        # a row with one result is in-place only (nccl-tests leaves out-of-place blank in trace replay)
        out_of_place, in_place = (placements[0], placements[1]) if len(placements) == 2 else (None, placements[0])
        run.rows.append(Row(int(words[0]), int(words[1]), words[2], words[3], root, out_of_place, in_place))
    if not run.rows:
        raise NcclTestsError(f"{source}: no nccl-tests result rows")
    run.hosts = [hosts[rank] for rank in sorted(hosts)]
    run.devices = [devices[rank] for rank in sorted(devices)]
    run.per_iter = per_iter
    return run


def _start_time(text: object) -> datetime | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


def _placement(data: dict[str, Any] | None, per_iter: dict[str, Any] | None, where: str) -> Placement | None:
    """One placement's result; with -I its iterations' times, less the first `skipped_iterations` (-K: nccl-tests
    leaves them out of its own statistics, warm-up that -w did not cover)."""
    if data is None:
        return None
    if "cpu_time" in data:
        raise NcclTestsError(f"{where}: {CPUTIME}")
    try:
        skipped = int((per_iter or {}).get("skipped_iterations") or 0)
        return Placement(float(data["time"]), float(data["alg_bw"]), float(data["bus_bw"]),
                         _wrong(data.get("nwrong"), where),
                         tuple(float(t) for t in (per_iter or {}).get("times_us", ())[skipped:]),
                         tuple(tuple(float(t) for t in times[skipped:])
                               for times in (per_iter or {}).get("per_process_max_times_us", ())))
    except (KeyError, TypeError, ValueError) as exc:
        raise NcclTestsError(f"{where}: {exc!r} in {sorted(data)}") from None


def _option(args: list[str], short: str, long: str) -> str | None:
    """The value of an nccl-tests option in its command line (`-a 3`, `-a3`, `--average 3`, `--average=3`)."""
    for i, word in enumerate(args):
        if word in (short, long):
            return args[i + 1] if i + 1 < len(args) else None
        if word.startswith(long + "="):
            return word[len(long) + 1:]
        if word.startswith(short) and len(word) > len(short) and not word.startswith("--"):
            return word[len(short):]
    return None


def parse_json(text: str, source: str = "nccl-tests JSON") -> Run:
    """Parse an nccl-tests `-J` file (JSON_FILE_VERSION 3)."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise NcclTestsError(f"{source}: not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("version") != JSON_FILE_VERSION:
        found = document.get("version") if isinstance(document, dict) else type(document).__name__
        raise NcclTestsError(f"{source}: version {found!r} is not nccl-tests JSON version {JSON_FILE_VERSION}")
    args = document.get("args") or []
    config = document.get("config") or {}
    bounds = document.get("out_of_bounds")
    run = Run(op=op_of(args[0]) if args else "", nccl_version=str(document.get("nccl_version", "")),
              iters=config.get("iterations"), warmup=config.get("warmup_iters"),
              agg_iters=int(config.get("aggregated_iterations") or 1), params=" ".join(args[1:]),
              graph_launches=int(config.get("graph") or 0),
              env=dict(item.split("=", 1) for item in document.get("env") or [] if isinstance(item, str) and "=" in item),
              time_over_ranks=_AVERAGE.get(_option(args, "-a", "--average") or "1", "mean"),
              complete=True, start_time=_start_time(document.get("start_time")),
              out_of_bounds=bounds.get("count") if isinstance(bounds, dict) else None)
    devices = config.get("devices") or document.get("devices") or []  # 2.19 writes them under config
    for device in sorted(devices, key=lambda d: d.get("rank", 0)):
        run.hosts.append(str(device.get("hostname", "")))
        run.devices.append(f"{device.get('device')} [{device.get('device_hex', '')}] {device.get('device_info', '')}")
    for index, result in enumerate(document.get("results") or []):
        where = f"{source}: results[{index}]"
        try:
            run.rows.append(Row(int(result["size"]), int(result["count"]), str(result["type"]), str(result["redop"]),
                                int(str(result["root"]).strip()),
                                _placement(result.get("out_of_place"), result.get("out_of_place_per_iter"), where),
                                _placement(result.get("in_place"), result.get("in_place_per_iter"), where)))
        except (KeyError, TypeError, ValueError) as exc:
            raise NcclTestsError(f"{where}: {exc!r}") from None
    if not run.rows:
        raise NcclTestsError(f"{source}: no results")
    run.per_iter = any(placement is not None and placement.times_us
                       for row in run.rows for placement in (row.out_of_place, row.in_place))
    return run
