#!/usr/bin/env python3
"""Compares nccl-tests busbw across the cases of gpu-plugin-check.sh and checks each case.

Standard library only (the GPU machine's python has none of commcamp's dependencies).
Usage: compare_busbw.py OUTDIR   (reads OUTDIR/cases.tsv and the raw outputs it names)
Writes OUTDIR/comparison.csv (one row per case and size) and OUTDIR/comparison.txt (printed too).
Exit status 1 if a case crashed, timed out, printed no results, reported wrong elements, or did not
load (or unexpectedly loaded) the commcamp plugin.
"""

from __future__ import annotations

import csv
import io
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# nccl-tests 2.x data row: size count type redop root, then time algbw busbw #wrong for out-of-place
# and again for in-place (src/util.cu writeBenchmarkLinePreamble/writeBenchmarkLineBody).
ROW_FIELDS = 13
PLUGIN_LOADED = re.compile(r"TUNER/Plugin: Using (\S+) \((v\d+)\)")
RULES_LOADED = re.compile(r"TUNER/commcamp: (\d+) rules from .* \((\d+) bad lines skipped\)")
NCCL_LIBRARY = re.compile(r"nccl-library=(\d+)")


@dataclass
class Row:
    size: int
    time_oop_us: float
    busbw_oop: float
    wrong_oop: int | None
    busbw_ip: float
    wrong_ip: int | None


@dataclass
class Case:
    name: str
    exit_status: int
    config: str | None
    description: str
    rows: list[Row] = field(default_factory=list)
    plugin: str | None = None  # e.g. "commcamp (v5)"
    nccl_library: str | None = None  # NCCL_VERSION_CODE of the library nccl-tests ran with
    rules_loaded: int | None = None
    bad_lines: int | None = None
    rules_applied: int = 0
    rules_not_applicable: int = 0
    problems: list[str] = field(default_factory=list)


def parse_wrong(text: str) -> int | None:
    return None if text == "N/A" else int(float(text))


def parse_rows(text: str) -> list[Row]:
    rows = []
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) < ROW_FIELDS or line.lstrip().startswith("#") or not tokens[0].isdigit():
            continue
        try:
            rows.append(Row(int(tokens[0]), float(tokens[5]), float(tokens[7]), parse_wrong(tokens[8]),
                            float(tokens[11]), parse_wrong(tokens[12])))
        except ValueError:
            continue  # a log line that happens to start with a number
    return rows


def read_debug_logs(outdir: Path, case: Case) -> None:
    for log in sorted(outdir.glob(f"{case.name}.nccl-debug.*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if (match := PLUGIN_LOADED.search(line)) and case.plugin is None:
                case.plugin = f"{match.group(1)} ({match.group(2)})"
            if (match := RULES_LOADED.search(line)) and case.rules_loaded is None:
                case.rules_loaded, case.bad_lines = int(match.group(1)), int(match.group(2))
            if "TUNER/commcamp: rule " in line and " applied: " in line:
                case.rules_applied += 1
            if "but cannot apply" in line:
                case.rules_not_applicable += 1


def check(case: Case, expected_rows: int) -> None:
    if case.exit_status in (124, 137):
        case.problems.append("timed out")
    elif case.exit_status != 0:
        case.problems.append(f"exit status {case.exit_status} (a crash if > 128)")
    if not case.rows:
        case.problems.append("no result rows")
    elif len(case.rows) != expected_rows:
        case.problems.append(f"{len(case.rows)} result rows, other cases have {expected_rows}")
    wrong = sum((r.wrong_oop or 0) + (r.wrong_ip or 0) for r in case.rows)
    if wrong:
        case.problems.append(f"{wrong} wrong elements")
    uses_commcamp = case.plugin is not None and case.plugin.startswith("commcamp ")
    if case.config and not uses_commcamp:
        case.problems.append(f"commcamp plugin not loaded (found: {case.plugin or 'none'})")
    if not case.config and case.plugin is not None:
        case.problems.append(f"a tuner plugin was loaded: {case.plugin}")
    if case.bad_lines:
        case.problems.append(f"the plugin skipped {case.bad_lines} bad config lines")
    if case.rules_loaded and not case.rules_applied:
        case.problems.append(f"{case.rules_loaded} rules loaded but none applied")


def read_cases(outdir: Path) -> list[Case]:
    manifest = outdir / "cases.tsv"
    if not manifest.is_file():
        raise SystemExit(f"error: {manifest} not found (run gpu-plugin-check.sh first)")
    cases = []
    for number, line in enumerate(manifest.read_text().splitlines(), 1):
        parts = line.split("\t")
        if len(parts) != 4 or not parts[1].isdigit():
            raise SystemExit(f"error: {manifest} line {number} is not NAME<TAB>STATUS<TAB>CONFIG<TAB>DESCRIPTION")
        name, status, config, description = parts
        case = Case(name, int(status), None if config == "-" else config, description)
        out_file = outdir / f"{name}.out"
        if out_file.is_file():
            text = out_file.read_text(errors="replace")
            case.rows = parse_rows(text)
            if match := NCCL_LIBRARY.search(text):
                case.nccl_library = match.group(1)
        read_debug_logs(outdir, case)
        cases.append(case)
    if not cases:
        raise SystemExit(f"error: {manifest} lists no cases")
    return cases


def write_atomically(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, delete=False, newline="") as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


def comparison_csv(cases: list[Case]) -> str:
    lines: list[list[object]] = [["case", "size_bytes", "time_oop_us", "busbw_oop_gbps", "wrong_oop",
                                  "busbw_ip_gbps", "wrong_ip"]]
    for case in cases:
        for r in case.rows:
            lines.append([case.name, r.size, r.time_oop_us, r.busbw_oop, "" if r.wrong_oop is None else r.wrong_oop,
                          r.busbw_ip, "" if r.wrong_ip is None else r.wrong_ip])
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(lines)
    return buffer.getvalue()


def comparison_text(cases: list[Case]) -> str:
    baseline = {r.size: r.busbw_oop for r in cases[0].rows}
    sizes = sorted({r.size for case in cases for r in case.rows})
    width = max(16, *(len(c.name) + 2 for c in cases))
    out = [f"out-of-place busbw (GB/s); (x.xx) = ratio to {cases[0].name}", "",
           f"{'size (B)':>12}" + "".join(f"{c.name:>{width}}" for c in cases)]
    for size in sizes:
        cells = []
        for case in cases:
            value = next((r.busbw_oop for r in case.rows if r.size == size), None)
            base = baseline.get(size)
            cell = "-" if value is None else f"{value:.2f}"
            if value is not None and case is not cases[0] and base:
                cell += f" ({value / base:.2f})"
            cells.append(f"{cell:>{width}}")
        out.append(f"{size:>12}" + "".join(cells))
    out.append("")
    for case in cases:
        out.append(f"{case.name}: {case.description}")
        out.append(f"  exit status {case.exit_status}, {len(case.rows)} sizes, NCCL {case.nccl_library or '?'}, "
                   f"plugin {case.plugin or 'none'}"
                   + (f", {case.rules_loaded} rules loaded" if case.rules_loaded is not None else "")
                   + f", 'rule applied' log lines {case.rules_applied}"
                   + f", 'cannot apply' log lines {case.rules_not_applicable}")
        out.append("  " + ("PROBLEMS: " + "; ".join(case.problems) if case.problems else "ok"))
    failed = [c.name for c in cases if c.problems]
    out.append("")
    out.append(f"RESULT: {'FAILED: ' + ', '.join(failed) if failed else 'all cases ok'}")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    cases = read_cases(outdir)
    expected_rows = max(len(c.rows) for c in cases)
    for case in cases:
        check(case, expected_rows)
    text = comparison_text(cases)
    write_atomically(outdir / "comparison.csv", comparison_csv(cases))
    write_atomically(outdir / "comparison.txt", text)
    print(text, end="")
    return 1 if any(c.problems for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
