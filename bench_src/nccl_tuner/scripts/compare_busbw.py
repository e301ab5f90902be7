#!/usr/bin/env python3
"""Compares the cases of gpu-plugin-check.sh per size against a noise band, and checks each case.

Standard library only (the GPU machine's python has none of commcamp's dependencies).
Usage: compare_busbw.py OUTDIR   (reads OUTDIR/cases.tsv and the raw outputs it names)
Writes OUTDIR/comparison.csv (one row per case, round and size) and OUTDIR/comparison.txt (printed too).

Per case and size: the median over rounds of nccl-tests' out-of-place time, and the speed ratio
against the case's reference (case 5a: case 5b if it ran, else case 1; every other case: case 1) =
reference median time / case median time. Noise band = the largest of NOISE_FLOOR (default 0.03) and the
relative ranges (max - min) / median of the two cases' times at that size over the rounds. Verdict: `+`
faster or `-` slower when the ratio is outside the band AND the two cases' times do not overlap (every
time of one below every time of the other), else `=` equal within noise. With one round the band is
the floor only.

The sweep's first size is reported with its verdict but never counts as a problem: it is the first
timed measurement of every nccl-tests run and comes straight after the warm-up of the largest sizes
(nccl-tests 2.19 TimeTest warms up every size from -b to -e, doubling, then times from -b up). On the
4x H200 machine one baseline run's 8 B out-of-place time was 37.23 us against 25.32 us in-place at the
same size; it became the baseline's median over 3 rounds and made a case "faster" at 8 B
(results/tuning/gpu-h200x4/RESULTS.md). With one size only, that size is judged.

Exit status 1 if a run crashed, timed out, printed no results, reported wrong elements, did not load
(or unexpectedly loaded) the commcamp plugin, or a case broke its expectation: 2 (empty config) equal at
every size; 3 (4 channels >= 128 MiB) slower at every size >= 128 MiB and equal below; 5a never slower.
"""

from __future__ import annotations

import csv
import io
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

try:  # the one nccl-tests parser (standard library only, like this script)
    from campaigns.formats import nccl_tests
except ImportError:  # run from a checkout without commcamp installed (the GPU machine)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from campaigns.formats import nccl_tests

PLUGIN_LOADED = re.compile(r"TUNER/Plugin: Using (\S+) \((v\d+)\)")
RULES_LOADED = re.compile(r"TUNER/commcamp: (\d+) rules from .* \((\d+) bad lines skipped\)")
NCCL_LIBRARY = re.compile(r"nccl-library=(\d+)")
CASE3_FROM = 128 << 20  # case 3's rule: 4 channels from 128 MiB up
NOISE_FLOOR = float(os.environ.get("NOISE_FLOOR", "0.03"))


@dataclass
class Run:
    """One run of one case in one round."""

    case: str
    round: int
    exit_status: int
    config: str | None
    description: str
    rows: list[nccl_tests.Row] = field(default_factory=list)
    plugin: str | None = None  # e.g. "commcamp (v5)"
    nccl_library: str | None = None
    rules_loaded: int | None = None
    bad_lines: int | None = None
    rules_applied: int = 0
    rules_not_applicable: int = 0


@dataclass
class Case:
    name: str
    description: str
    config: str | None
    runs: list[Run] = field(default_factory=list)
    reference: str | None = None
    verdicts: dict[int, tuple[float, float, str]] = field(default_factory=dict)  # size -> (ratio, band, verdict)
    warmup_size: int | None = None  # the sweep's first size: verdict reported, not judged
    problems: list[str] = field(default_factory=list)

    def times(self) -> dict[int, list[float]]:
        by_size: dict[int, list[float]] = {}
        for run in self.runs:
            for row in run.rows:
                by_size.setdefault(row.size, []).append(row.out_of_place.time_us)
        return by_size


def parse_rows(text: str) -> list[nccl_tests.Row]:
    """The size table of one nccl-tests output; [] when it has none (a crash: check_runs says so)."""
    try:
        return [row for row in nccl_tests.parse_text(text).rows if row.out_of_place and row.in_place]
    except nccl_tests.NcclTestsError:
        return []


def read_debug_logs(outdir: Path, run: Run) -> None:
    for log in sorted(outdir.glob(f"{run.case}.r{run.round}.nccl-debug.*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if (match := PLUGIN_LOADED.search(line)) and run.plugin is None:
                run.plugin = f"{match.group(1)} ({match.group(2)})"
            if (match := RULES_LOADED.search(line)) and run.rules_loaded is None:
                run.rules_loaded, run.bad_lines = int(match.group(1)), int(match.group(2))
            if "TUNER/commcamp: rule " in line and " applied: " in line:
                run.rules_applied += 1
            if "but cannot apply" in line:
                run.rules_not_applicable += 1


def read_cases(outdir: Path) -> list[Case]:
    manifest = outdir / "cases.tsv"
    if not manifest.is_file():
        raise SystemExit(f"error: {manifest} not found (run gpu-plugin-check.sh first)")
    cases: dict[str, Case] = {}
    for number, line in enumerate(manifest.read_text().splitlines(), 1):
        parts = line.split("\t")
        if len(parts) != 5 or not parts[1].isdigit() or not parts[2].isdigit():
            raise SystemExit(f"error: {manifest} line {number} is not NAME<TAB>ROUND<TAB>STATUS<TAB>CONFIG<TAB>"
                             "DESCRIPTION")
        name, round_, status, config, description = parts
        run = Run(name, int(round_), int(status), None if config == "-" else config, description)
        out_file = outdir / f"{name}.r{round_}.out"
        if out_file.is_file():
            text = out_file.read_text(errors="replace")
            run.rows = parse_rows(text)
            if match := NCCL_LIBRARY.search(text):
                run.nccl_library = match.group(1)
        read_debug_logs(outdir, run)
        cases.setdefault(name, Case(name, description, run.config)).runs.append(run)
    if not cases:
        raise SystemExit(f"error: {manifest} lists no cases")
    ordered = sorted(cases.values(), key=lambda c: c.name)
    baseline = ordered[0].name
    for case in ordered[1:]:
        case.reference = "5b-global-env" if case.name.startswith("5a") and "5b-global-env" in cases else baseline
    return ordered


def check_runs(case: Case, expected_rows: int) -> None:
    for run in case.runs:
        where = f"round {run.round}: "
        if run.exit_status in (124, 137):
            case.problems.append(where + "timed out")
        elif run.exit_status != 0:
            case.problems.append(where + f"exit status {run.exit_status} (a crash if > 128)")
        if not run.rows:
            case.problems.append(where + "no result rows")
        elif len(run.rows) != expected_rows:
            case.problems.append(where + f"{len(run.rows)} result rows, other runs have {expected_rows}")
        wrong = sum((r.out_of_place.wrong or 0) + (r.in_place.wrong or 0) for r in run.rows)
        if wrong:
            case.problems.append(where + f"{wrong} wrong elements")
        uses_commcamp = run.plugin is not None and run.plugin.startswith("commcamp ")
        if run.config and not uses_commcamp:
            case.problems.append(where + f"commcamp plugin not loaded (found: {run.plugin or 'none'})")
        if not run.config and run.plugin is not None:
            case.problems.append(where + f"a tuner plugin was loaded: {run.plugin}")
        if run.bad_lines:
            case.problems.append(where + f"the plugin skipped {run.bad_lines} bad config lines")
        if run.rules_loaded and not run.rules_applied:
            case.problems.append(where + f"{run.rules_loaded} rules loaded but none applied")


def relative_range(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


def judge(case: Case, reference: Case) -> None:
    mine, theirs = case.times(), reference.times()
    for size in sorted(set(mine) & set(theirs)):
        case_median, ref_median = statistics.median(mine[size]), statistics.median(theirs[size])
        if case_median <= 0 or ref_median <= 0:
            continue
        ratio = ref_median / case_median  # > 1: the case is faster
        band = max(NOISE_FLOOR, relative_range(mine[size]), relative_range(theirs[size]))
        apart = max(mine[size]) < min(theirs[size]) or min(mine[size]) > max(theirs[size])
        verdict = "=" if abs(ratio - 1) <= band or not apart else ("+" if ratio > 1 else "-")
        case.verdicts[size] = (ratio, band, verdict)
    if len(case.verdicts) > 1:
        case.warmup_size = min(case.verdicts)
    sizes = lambda wanted: [  # noqa: E731
        s for s, (_, _, v) in case.verdicts.items() if v in wanted and s != case.warmup_size]
    if case.name.startswith("2"):
        if off := sizes("+-"):
            case.problems.append(f"empty config differs from no plugin beyond noise at {fmt_sizes(off)}")
    elif case.name.startswith("3"):
        not_slower = [s for s in sizes("=+") if s >= CASE3_FROM]
        changed_below = [s for s in sizes("+-") if s < CASE3_FROM]
        if not_slower:
            case.problems.append(f"4 channels did not slow down {fmt_sizes(not_slower)} beyond noise")
        if changed_below:
            case.problems.append(f"sizes below 128 MiB changed beyond noise: {fmt_sizes(changed_below)}")
    elif case.name.startswith("5a"):
        if slower := sizes("-"):
            case.problems.append(f"slower than {reference.name} beyond noise at {fmt_sizes(slower)}")


def fmt_sizes(sizes: list[int]) -> str:
    return ", ".join(format_size(s) for s in sorted(sizes))


def format_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def write_atomically(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, delete=False, newline="") as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


def comparison_csv(cases: list[Case]) -> str:
    lines: list[list[object]] = [["case", "round", "size_bytes", "time_oop_us", "busbw_oop_gbps", "wrong_oop",
                                  "busbw_ip_gbps", "wrong_ip", "reference", "speed_ratio", "noise_band",
                                  "verdict", "judged"]]
    for case in cases:
        for run in case.runs:
            for r in run.rows:
                ratio, band, verdict = case.verdicts.get(r.size, (None, None, ""))
                oop, ip = r.out_of_place, r.in_place
                lines.append([case.name, run.round, r.size, oop.time_us, oop.busbw_gbs,
                              "" if oop.wrong is None else oop.wrong, ip.busbw_gbs,
                              "" if ip.wrong is None else ip.wrong, case.reference or "",
                              "" if ratio is None else f"{ratio:.4f}", "" if band is None else f"{band:.4f}",
                              verdict, "" if not verdict else int(r.size != case.warmup_size)])
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(lines)
    return buffer.getvalue()


VERDICT_WORDS = {"=": "equal", "+": "faster", "-": "slower"}


def warmup_note(cases: list[Case]) -> list[str]:
    first = sorted({format_size(c.warmup_size) for c in cases if c.warmup_size is not None})
    if not first:
        return []
    return [f"the sweep's first size ({', '.join(first)}) follows nccl-tests' warm-up and is its first timed "
            "measurement: its verdicts are shown but never count as PROBLEMS"]


def comparison_text(cases: list[Case]) -> str:
    sizes = sorted({size for case in cases for size in case.times()})
    rounds = max(len(case.runs) for case in cases)
    width = max(22, *(len(c.name) + 2 for c in cases))
    out = [f"median out-of-place time (us) over {rounds} interleaved round(s); for other cases also the speed "
           "ratio to the reference [noise band %] and verdict: = equal within noise, + faster, - slower",
           *warmup_note(cases), "", f"{'size':>9}" + "".join(f"{c.name:>{width}}" for c in cases)]
    for size in sizes:
        cells = []
        for case in cases:
            times = case.times().get(size)
            cell = "-" if not times else f"{statistics.median(times):.2f}"
            if size in case.verdicts:
                ratio, band, verdict = case.verdicts[size]
                cell += f" {ratio:.2f}[{band * 100:.0f}]{verdict}"
            cells.append(f"{cell:>{width}}")
        out.append(f"{format_size(size):>9}" + "".join(cells))
    out.append("")
    for case in cases:
        runs = case.runs
        out.append(f"{case.name}: {case.description}" + (f" (reference: {case.reference})" if case.reference else ""))
        plugins = sorted({r.plugin or "none" for r in runs})
        loaded = sorted({r.rules_loaded for r in runs if r.rules_loaded is not None})
        out.append(f"  {len(runs)} run(s), exit status {sorted({r.exit_status for r in runs})}, "
                   f"{sorted({len(r.rows) for r in runs})} sizes, NCCL {runs[0].nccl_library or '?'}, "
                   f"plugin {', '.join(plugins)}" + (f", {loaded} rules loaded" if loaded else "")
                   + f", 'rule applied' log lines {sum(r.rules_applied for r in runs)}"
                   + f", 'cannot apply' log lines {sum(r.rules_not_applicable for r in runs)}")
        if case.verdicts:
            counts = {v: sum(1 for _, _, x in case.verdicts.values() if x == v) for v in "=+-"}
            out.append(f"  verdicts vs {case.reference}: {counts['=']} equal, {counts['+']} faster, "
                       f"{counts['-']} slower; widest noise band "
                       f"{max(b for _, b, _ in case.verdicts.values()) * 100:.1f}%")
        if case.warmup_size is not None and (first := case.verdicts[case.warmup_size])[2] != "=":
            out.append(f"  first size {format_size(case.warmup_size)}: {VERDICT_WORDS[first[2]]} "
                       f"{first[0]:.2f}x [{first[1] * 100:.0f}%], reported, not judged (warm-up-affected)")
        out.append("  " + ("PROBLEMS: " + "; ".join(case.problems) if case.problems else "ok"))
    failed = [c.name for c in cases if c.problems]
    out.append("")
    if rounds < 2:
        out.append(f"NOTE: one round only: the noise band is the floor ({NOISE_FLOOR:.0%}), not measured")
    out.append(f"RESULT: {'FAILED: ' + ', '.join(failed) if failed else 'all cases ok'}")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    cases = read_cases(outdir)
    expected_rows = max(len(r.rows) for c in cases for r in c.runs)
    by_name = {c.name: c for c in cases}
    for case in cases:
        check_runs(case, expected_rows)
        if case.reference is not None:
            judge(case, by_name[case.reference])
    text = comparison_text(cases)
    write_atomically(outdir / "comparison.csv", comparison_csv(cases))
    write_atomically(outdir / "comparison.txt", text)
    print(text, end="")
    return 1 if any(c.problems for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
