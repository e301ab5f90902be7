"""Summary of a tuner-plugin side-by-side run (issue 16 item 4): per op and size, the median over rounds of
each setting's time (commbench's per-record median, us) and each setting's per-round speed-up over NCCL's
defaults (t_defaults / t_setting in the same round: median [min, max] over rounds). Settings are the files
DIR/<setting>.r<round>.jsonl, or the same files in DIR/runs.pack.jsonl (campaigns.formats.packs); a
setting whose runs crashed has no records for the sizes after the crash.

    .venv/bin/python tests/bench/plugin_side_by_side.py DIR [--reference defaults] > DIR/summary.txt
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from campaigns.formats.packs import pack_files  # noqa: E402
from campaigns.model.records import parse_record_lines  # noqa: E402

RUN = re.compile(r"^(?P<setting>.+)\.r(?P<round>\d+)\.jsonl$")


def load(directory: Path) -> dict[str, dict[int, dict[tuple[str, int], float]]]:
    """setting -> round -> (op, bytes) -> median us of the valid result records."""
    times: dict[str, dict[int, dict[tuple[str, int], float]]] = defaultdict(dict)
    pack = directory / "runs.pack.jsonl"
    files = pack_files(pack) if pack.exists() else {p.name: p.read_text() for p in directory.iterdir() if p.is_file()}
    for name, text in sorted(files.items()):
        match = RUN.match(name)
        if not match:
            continue
        records, problems = parse_record_lines(text, name)
        if problems:
            raise SystemExit(f"{directory}/{name}: {problems[:2]}")
        times[match["setting"]][int(match["round"])] = {
            (r["op"], r["bytes"]): r["stats"]["median_us"] for r in records if r["kind"] == "result" and r["valid"]}
    return times


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--reference", default="defaults")
    args = parser.parse_args(argv)
    times = load(args.directory)
    if args.reference not in times:
        raise SystemExit(f"{args.directory}: no {args.reference}.r<N>.jsonl runs")
    reference = times[args.reference]
    keys = sorted({key for run in reference.values() for key in run})
    settings = [s for s in sorted(times) if s != args.reference]
    print(f"{'op':>14} {'bytes':>9} {args.reference + ' us':>12} " + " ".join(f"{s:>34}" for s in settings))
    for key in keys:
        base = [run[key] for run in reference.values() if key in run]
        cells = []
        for setting in settings:
            ratios = [reference[r][key] / run[key] for r, run in times[setting].items()
                      if key in run and r in reference and key in reference[r]]
            cells.append("no record (crashed before)" if not ratios else
                         f"x{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] n={len(ratios)}")
        print(f"{key[0]:>14} {key[1]:>9} {statistics.median(base):12.2f} " + " ".join(f"{c:>34}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
