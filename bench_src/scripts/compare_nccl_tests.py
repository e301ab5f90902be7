#!/usr/bin/env python3
"""Report of compare-nccl-tests.sh: nccl-tests against commbench on the same machine, plus the D2D
targets. Standard library only: the GPU machine's python3 has none of the project's packages.

usage:
  compare_nccl_tests.py plan      the commbench ops and their nccl-tests binaries, one pair a line
  compare_nccl_tests.py OUTDIR    reads OUTDIR/raw/nt-<op>-r<k>.txt, OUTDIR/records/cb-<op>-r<k>.jsonl,
                                  OUTDIR/records/peer-<transport>.jsonl, OUTDIR/runs.tsv,
                                  OUTDIR/commands.txt; writes OUTDIR/comparison.csv and
                                  OUTDIR/comparison.md (atomically) and prints the markdown
exit status: 0 every target met, 1 a target missed or a measurement missing, 2 unreadable input
"""
from __future__ import annotations

import csv
import io
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

try:  # the one nccl-tests parser (standard library only, like this script)
    from campaigns.formats import nccl_tests
except ImportError:  # run from a checkout without commcamp installed (the GPU machine)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from campaigns.formats import nccl_tests

# commbench op -> nccl-tests binary; the same semantics and size convention (see commbench --help)
OPS = {
    "allreduce": "all_reduce_perf",
    "alltoall": "alltoall_perf",
    "sendrecv": "sendrecv_perf",
    "allgather": "all_gather_perf",
}
BUSBW_RATIO_MIN = 0.98
BUSBW_FROM_BYTES = 64 << 20
TIME_RATIO_MAX = 1.05
SMALL_SIZES = (16, 32, 64)
MIB = 1 << 20


@dataclass(frozen=True)
class PeerTarget:
    """An absolute bandwidth target of a peer-mapped transport at the D2D size."""

    transport: str
    op: str
    metric: str  # goodput_gbs (one way) or aggregate_gbs (both ways)
    minimum_gbs: float
    label: str


PEER_TARGETS = (
    PeerTarget("d2d", "pingpong", "goodput_gbs", 385.0, "D2D copy engine, one way"),
    PeerTarget("d2d", "pingpong_bi", "aggregate_gbs", 760.0, "D2D copy engine, both ways"),
    PeerTarget("d2d-kernel", "pingpong", "goodput_gbs", 360.0, "d2d-kernel, one way"),
)


class InputError(Exception):
    """A file that is missing, unreadable or not what the script writes."""


def read_records(path: Path) -> list[dict[str, Any]]:
    """commbench JSON Lines records of one file."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(record, dict) or record.get("kind") not in ("result", "error"):
            raise InputError(f"{path}:{number}: not a commbench record")
        records.append(record)
    return records


@dataclass
class Row:
    """One requested size of one op: the repeats of both tools."""

    op: str
    requested: int
    nt: list[nccl_tests.Row] = field(default_factory=list)  # out-of-place results used
    cb: list[dict[str, Any]] = field(default_factory=list)

    @property
    def nt_results(self) -> list[nccl_tests.Placement]:
        return [r.out_of_place for r in self.nt if r.out_of_place]

    @property
    def nt_bytes(self) -> int | None:
        return self.nt[0].size if self.nt else None

    @property
    def cb_bytes(self) -> int | None:
        return self.cb[0]["bytes"] if self.cb else None

    @property
    def same_bytes(self) -> bool:
        return bool(self.nt and self.cb) and self.nt_bytes == self.cb_bytes

    @property
    def moves_data(self) -> bool:
        return self.same_bytes and (self.nt_bytes or 0) > 0

    def nt_time(self) -> float | None:
        return _mean([r.time_us for r in self.nt_results])

    def cb_time(self) -> float | None:
        return _mean([r["latency_us"] for r in self.cb])

    def nt_busbw(self) -> float | None:
        return _mean([r.busbw_gbs for r in self.nt_results])

    def cb_busbw(self) -> float | None:
        return _mean([r["busbw_gbs"] for r in self.cb])

    def time_ratio(self) -> float | None:
        return _ratio(self.cb_time(), self.nt_time()) if self.moves_data else None

    def busbw_ratio(self) -> float | None:
        """cb busbw / nt busbw, from the times: the same bytes and factor, and nccl-tests prints busbw
        with two decimals only (0.00 at small sizes)."""
        return _ratio(self.nt_time(), self.cb_time()) if self.moves_data else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def spread_pct(values: list[float]) -> float | None:
    """(max - min) / mean of the repeats, in percent."""
    if len(values) < 2 or not statistics.fmean(values):
        return None
    return 100.0 * (max(values) - min(values)) / statistics.fmean(values)


@dataclass
class OpResult:
    """Everything measured for one op."""

    op: str
    rows: list[Row]
    problems: list[str]
    nt_runs: list[nccl_tests.Run]


def load_op(out: Path, op: str) -> OpResult:
    """Both tools' repeats of op, aligned by requested size (nccl-tests row i is the i-th size of
    the series; its size column is the bytes it moved, which commbench's 'bytes' must equal)."""
    problems: list[str] = []
    nt_runs: list[nccl_tests.Run] = []
    cb_runs: list[list[dict[str, Any]]] = []
    for path in sorted((out / "raw").glob(f"nt-{op}-r*.txt")):
        try:
            nt_runs.append(nccl_tests.parse_text(path.read_text(encoding="utf-8", errors="replace"), path.name))
        except nccl_tests.NcclTestsError as exc:
            problems.append(str(exc))
    for path in sorted((out / "records").glob(f"cb-{op}-r*.jsonl")):
        records = read_records(path)
        errors = [r for r in records if r["kind"] == "error"]
        problems += [f"{path.name}: error record ({r.get('reason')}): {r.get('error')}" for r in errors]
        problems += [f"{path.name}: {r['bytes']} B not valid ({r.get('wrong_elements')} wrong elements)"
                     for r in records if r["kind"] == "result" and not r["valid"]]
        cb_runs.append([r for r in records if r["kind"] == "result" and r["op"] == op])
    for index, run in enumerate(nt_runs, 1):
        wrong = [row.size for row in run.rows if row.out_of_place and row.out_of_place.wrong]
        if wrong:
            problems.append(f"nccl-tests repeat {index}: wrong elements at {wrong} B")
    if not nt_runs:
        problems.append("no nccl-tests output")
    if not any(cb_runs):
        problems.append("no commbench results")

    requested = sorted({r["requested_bytes"] for run in cb_runs for r in run})
    if not requested and nt_runs:  # still show what nccl-tests measured
        requested = [row.size for row in nt_runs[0].rows]
    rows = [Row(op, size) for size in requested]
    for run in cb_runs:
        by_size = {r["requested_bytes"]: r for r in run}
        for row in rows:
            if row.requested in by_size:
                row.cb.append(by_size[row.requested])
    for index, run in enumerate(nt_runs, 1):
        if len(run.rows) != len(rows) and any(cb_runs):
            problems.append(f"nccl-tests repeat {index} has {len(run.rows)} sizes, commbench {len(rows)}")
        for row, nt_row in zip(rows, run.rows):
            row.nt.append(nt_row)
    return OpResult(op, rows, problems, nt_runs)


@dataclass
class Verdict:
    """One target: what was required, what was measured, whether it was met."""

    target: str
    subject: str
    measured: str
    passed: bool | None  # None: not applicable / informative
    note: str = ""


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def op_verdicts(result: OpResult) -> list[Verdict]:
    """busbw >= 0.98x at >= 64 MiB; time <= 1.05x at 8 B; the same at 16-64 B."""
    verdicts = []
    large = [row for row in result.rows if row.moves_data and row.nt_bytes and row.nt_bytes >= BUSBW_FROM_BYTES]
    if large:
        worst = min(large, key=lambda row: row.busbw_ratio() or 0.0)
        ratio = worst.busbw_ratio() or 0.0
        verdicts.append(Verdict(f"busbw >= {BUSBW_RATIO_MIN}x nccl-tests at >= 64 MiB", result.op,
                                f"min {ratio:.3f} at {human(worst.requested)}", ratio >= BUSBW_RATIO_MIN,
                                f"{len(large)} sizes, mean of the repeats"))
    else:
        verdicts.append(Verdict(f"busbw >= {BUSBW_RATIO_MIN}x nccl-tests at >= 64 MiB", result.op, "no data", False))
    first = next((row for row in result.rows if row.requested == 8), None)
    if first is None or not first.same_bytes:
        verdicts.append(Verdict(f"time <= {TIME_RATIO_MAX}x nccl-tests at 8 B", result.op, "no data", False))
    elif not first.moves_data:
        verdicts.append(Verdict(f"time <= {TIME_RATIO_MAX}x nccl-tests at 8 B", result.op, "n/a", None,
                                "8 B is 0 bytes per rank at this rank count: nothing moves"))
    else:
        ratio = first.time_ratio() or 0.0
        verdicts.append(Verdict(f"time <= {TIME_RATIO_MAX}x nccl-tests at 8 B", result.op,
                                f"{ratio:.3f} (cb {_fmt(first.cb_time())} us, nt {_fmt(first.nt_time())} us)",
                                ratio <= TIME_RATIO_MAX,
                                "nccl-tests' first size carries a warm-up effect (its time is inflated)"))
    small = [row for row in result.rows if row.requested in SMALL_SIZES and row.moves_data]
    if small:
        worst = max(small, key=lambda row: row.time_ratio() or 0.0)
        ratio = worst.time_ratio() or 0.0
        verdicts.append(Verdict(f"time <= {TIME_RATIO_MAX}x nccl-tests at 16-64 B", result.op,
                                f"max {ratio:.3f} at {human(worst.requested)}", ratio <= TIME_RATIO_MAX,
                                f"sizes {', '.join(human(row.requested) for row in small)}"))
    else:
        verdicts.append(Verdict(f"time <= {TIME_RATIO_MAX}x nccl-tests at 16-64 B", result.op, "n/a", None,
                                "no size in 16-64 B moves the same non-zero bytes in both tools"))
    return verdicts


def _best_gbs(record: dict[str, Any], metric: str) -> float:
    """The metric from the fastest sample instead of the median."""
    one_way = record["bytes"] / (record["stats"]["min_us"] * 1e3)
    return 2 * one_way if metric == "aggregate_gbs" else one_way


def peer_verdicts(out: Path, problems: list[str]) -> tuple[list[Verdict], list[list[str]]]:
    """The D2D targets (on pingpong / pingpong_bi: rank 0 and the last rank) and every pair of the
    pair matrix as information."""
    verdicts, pair_rows = [], []
    records: dict[str, list[dict[str, Any]]] = {}
    for transport in sorted({t.transport for t in PEER_TARGETS}):
        path = out / "records" / f"peer-{transport}.jsonl"
        records[transport] = read_records(path) if path.exists() else []
        if not path.exists():
            problems.append(f"{path.name} is missing")
        problems += [f"{path.name}: error record ({r.get('reason')}): {r.get('error')}"
                     for r in records[transport] if r["kind"] == "error"]
        problems += [f"{path.name}: {r['op']} not valid" for r in records[transport]
                     if r["kind"] == "result" and not r["valid"]]
    for target in PEER_TARGETS:
        found = [r for r in records[target.transport] if r["kind"] == "result" and r["op"] == target.op]
        if not found:
            verdicts.append(Verdict(f"{target.label} >= {target.minimum_gbs:.0f} GB/s", target.transport, "no data",
                                    False))
            continue
        record = max(found, key=lambda r: r["bytes"])
        value = record[target.metric]
        verdicts.append(Verdict(
            f"{target.label} >= {target.minimum_gbs:.0f} GB/s at {human(record['bytes'])}",
            f"{target.transport} {target.op} {record['pair']['src']}<->{record['pair']['dst']}",
            f"median {value:.1f} GB/s, best {_best_gbs(record, target.metric):.1f} GB/s "
            f"({record['iters']} samples)", value >= target.minimum_gbs))
        direction = "bi" if target.metric == "aggregate_gbs" else "uni"
        pairs = [r for r in records[target.transport] if r["kind"] == "result" and r["op"] == "pairmatrix"
                 and r.get("direction") == direction and r["bytes"] == record["bytes"]]
        if pairs:
            values = sorted(r[target.metric] for r in pairs)
            worst = min(pairs, key=lambda r: r[target.metric])
            pair_rows.append([target.transport, f"{direction} ({target.metric})", human(record["bytes"]),
                              str(len(pairs)), f"{values[0]:.1f} ({worst['pair']['src']}<->{worst['pair']['dst']})",
                              f"{statistics.median(values):.1f}", f"{values[-1]:.1f}", f"{target.minimum_gbs:.0f}"])
    return verdicts, pair_rows


CSV_COLUMNS = ["op", "requested_bytes", "nt_bytes", "cb_bytes", "nt_time_us", "cb_time_us", "time_ratio",
               "nt_busbw_gbs", "cb_busbw_gbs", "busbw_ratio", "nt_time_spread_pct", "cb_time_spread_pct",
               "nt_time_us_repeats", "cb_time_us_repeats", "nt_busbw_gbs_repeats", "cb_busbw_gbs_repeats",
               "cb_batch", "cb_samples"]


def csv_rows(results: list[OpResult]) -> list[dict[str, str]]:
    def joined(values: list[float]) -> str:
        return " ".join(f"{v:g}" for v in values)

    rows = []
    for result in results:
        for row in result.rows:
            rows.append({
                "op": row.op, "requested_bytes": str(row.requested),
                "nt_bytes": _fmt(row.nt_bytes, "d"), "cb_bytes": _fmt(row.cb_bytes, "d"),
                "nt_time_us": _fmt(row.nt_time(), ".3f"), "cb_time_us": _fmt(row.cb_time(), ".3f"),
                "time_ratio": _fmt(row.time_ratio(), ".4f"),
                "nt_busbw_gbs": _fmt(row.nt_busbw(), ".3f"), "cb_busbw_gbs": _fmt(row.cb_busbw(), ".3f"),
                "busbw_ratio": _fmt(row.busbw_ratio(), ".4f"),
                "nt_time_spread_pct": _fmt(spread_pct([r.time_us for r in row.nt_results]), ".2f"),
                "cb_time_spread_pct": _fmt(spread_pct([r["latency_us"] for r in row.cb]), ".2f"),
                "nt_time_us_repeats": joined([r.time_us for r in row.nt_results]),
                "cb_time_us_repeats": joined([r["latency_us"] for r in row.cb]),
                "nt_busbw_gbs_repeats": joined([r.busbw_gbs for r in row.nt_results]),
                "cb_busbw_gbs_repeats": joined([r["busbw_gbs"] for r in row.cb]),
                "cb_batch": " ".join(sorted({str(r.get("batch", 1)) for r in row.cb})),
                "cb_samples": " ".join(sorted({str(r["iters"]) for r in row.cb})),
            })
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _mark(passed: bool | None) -> str:
    return {True: "PASS", False: "**FAIL**", None: "n/a"}[passed]


def _first_record(results: list[OpResult]) -> dict[str, Any] | None:
    return next((r for result in results for row in result.rows for r in row.cb), None)


def markdown(out: Path, results: list[OpResult], verdicts: list[Verdict], pair_rows: list[list[str]],
             problems: list[str]) -> str:
    lines = ["# nccl-tests vs commbench on one machine", ""]
    record = _first_record(results)
    nt_run = next((run for result in results for run in result.nt_runs), None)
    lines.append("## Provenance")
    lines.append("")
    if record:
        devices = ", ".join(f"{d['name']} {d['pci_bus_id']}" for d in record.get("devices") or [])
        versions = ", ".join(f"{k} {v}" for k, v in (record.get("versions") or {}).items())
        lines += [f"- first commbench record: {record['timestamp']}, host(s) {', '.join(sorted(set(record['hostnames'])))}",
                  f"- {record['ranks']} ranks; devices: {devices or '-'}",
                  f"- commbench {record['commbench_version']}, backend {record['backend']}, transport "
                  f"{record['transport']}; {versions}",
                  f"- MPI: {record['mpi_library']}"]
    if nt_run:
        lines += [f"- nccl-tests version {nt_run.version} nccl-library={nt_run.nccl_version}",
                  f"- nccl-tests parameters: {nt_run.params}"]
    lines += ["- machine details (nvidia-smi, topology, packages): environment.txt; every command with its exit "
              "status and duration: commands.txt, runs.tsv", ""]
    lines += ["## Method", "",
              "nccl-tests `-w W -n N`: per size one untimed operation, then N operations launched back to back "
              "and one stream synchronisation; time = elapsed / N, averaged over ranks (out-of-place column "
              "used). commbench `--batch N --iters S --warmup 1`: per size 1 untimed sample, then S samples of "
              "N operations launched back to back with one stream poll each; sample = elapsed / N, maximum over "
              "ranks; the median sample is used. Each tool ran every op twice, interleaved (nt, cb, nt, cb); "
              "values below are the mean of the two repeats, spread = (max - min) / mean of the repeats' times.",
              ""]
    lines += ["## Targets", ""]
    lines += _table(["target", "subject", "measured", "verdict", "note"],
                    [[v.target, v.subject, v.measured, _mark(v.passed), v.note] for v in verdicts])
    lines.append("")
    if pair_rows:
        lines += ["Every pair (pair matrix, information; median per pair, GB/s):", ""]
        lines += _table(["transport", "direction", "size", "pairs", "worst pair", "median", "best pair",
                         "target"], pair_rows)
        lines.append("")
    if problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in problems] + [""]
    for result in results:
        lines += [f"## {result.op} ({OPS[result.op]})", ""]
        table = []
        for row in result.rows:
            size = human(row.requested)
            if not row.same_bytes:
                size += f" (bytes nt {_fmt(row.nt_bytes, 'd')}, cb {_fmt(row.cb_bytes, 'd')})"
            elif not row.moves_data:
                size += " (0 B moved)"
            table.append([size, _fmt(row.nt_time()), _fmt(row.cb_time()), _fmt(row.time_ratio(), ".3f"),
                          _fmt(row.nt_busbw()), _fmt(row.cb_busbw()), _fmt(row.busbw_ratio(), ".3f"),
                          _fmt(spread_pct([r.time_us for r in row.nt_results]), ".1f"),
                          _fmt(spread_pct([r["latency_us"] for r in row.cb]), ".1f")])
        lines += _table(["size", "nt us", "cb us", "time cb/nt", "nt busbw", "cb busbw", "busbw cb/nt",
                         "nt spread %", "cb spread %"], table)
        lines.append("")
    commands = out / "commands.txt"
    if commands.exists():
        lines += ["## Commands", "", "```", commands.read_text(encoding="utf-8", errors="replace").rstrip(), "```",
                  ""]
    return "\n".join(lines)


def write_atomically(path: Path, write: Callable[[io.TextIOBase], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def failed_runs(out: Path) -> list[str]:
    """Runs of the script that did not exit 0 (runs.tsv: name, exit status, seconds)."""
    path = out / "runs.tsv"
    if not path.exists():
        return ["runs.tsv is missing"]
    failed = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name, status, seconds = line.split("\t")
        if status != "0":
            failed.append(f"run {name} exited with {status} after {seconds} s")
    return failed


def report(out: Path) -> int:
    if not out.is_dir():
        raise InputError(f"{out} is not a directory")
    problems = failed_runs(out)
    results = [load_op(out, op) for op in OPS]
    verdicts = [v for result in results for v in op_verdicts(result)]
    for result in results:
        problems += [f"{result.op}: {p}" for p in result.problems]
    peer, pair_rows = peer_verdicts(out, problems)
    verdicts += peer
    text = markdown(out, results, verdicts, pair_rows, problems)

    def write_csv(handle: io.TextIOBase) -> None:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(results))

    write_atomically(out / "comparison.csv", write_csv)
    write_atomically(out / "comparison.md", lambda handle: handle.write(text + "\n"))
    print(text)
    met = all(v.passed is not False for v in verdicts) and not problems
    return 0 if met else 1


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "plan":
        for op, binary in OPS.items():
            print(op, binary)
        return 0
    try:
        return report(Path(argv[1]))
    except (InputError, OSError, KeyError, ValueError) as exc:
        print(f"compare_nccl_tests.py: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
