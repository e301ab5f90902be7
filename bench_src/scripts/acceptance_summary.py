"""Summary of a GPU run of commbench (gpu-acceptance.sh, single-gpu.sh): per case its exit code against
the expected ones and what its records show, then latency at the smallest and bandwidth at the
largest size per transport and op. Standard library only (it runs on the GPU machine's python3).

usage: python3 bench_src/scripts/acceptance_summary.py OUTDIR   (from the repository root)
Reads OUTDIR/cases.tsv, OUTDIR/records/NAME.jsonl, OUTDIR/logs/build-status.txt; exit status 0 when
every case is as expected and the -Werror build succeeded, else 1.
"""
import collections
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
required = set(json.loads(pathlib.Path("bench_src/schema/commbench-record.schema.json").read_text())["required"])
cases = [line.split("\t") for line in (out / "cases.tsv").read_text().splitlines() if line]
bad_cases = 0
print(f"{'case':34} {'np':>2} {'exit':>4} {'want':>5} {'secs':>6} {'results':>7} {'wrong':>5} {'errors':>6}  notes")
for name, np, expected, rc, secs in cases:
    path = out / "records" / f"{name}.jsonl"
    results = invalid = 0
    reasons = collections.Counter()
    problems = []
    records = []
    if path.exists():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                record = json.loads(line)
            except ValueError as exc:
                problems.append(f"line {n} is not JSON: {exc}")
                continue
            missing = required - record.keys()
            if missing:
                problems.append(f"line {n} lacks {sorted(missing)}")
            records.append(record)
            if record.get("kind") == "result":
                results += 1
                invalid += not record.get("valid", False)
                if len(record.get("samples_us", [])) != record.get("iters"):
                    problems.append(f"line {n}: samples != iters")
            else:
                reasons[record.get("reason")] += 1
    # what the records must show, beyond the exit code
    if name.startswith("fault-corrupt"):
        if not results or invalid != results:
            problems.append("planted corruption not reported as invalid results")
    elif name.startswith("fault-hang"):
        if reasons.get("timeout", 0) != 1:
            problems.append("no timeout record")
    elif rc == "0":
        if not results or invalid or reasons:
            problems.append("expected only valid results")
    elif rc == "4" and set(reasons) != {"unsupported"}:
        problems.append("exit 4 without only 'unsupported' records")
    ok = rc in expected.split(",") and not problems
    bad_cases += not ok
    notes = ", ".join(f"{k}:{v}" for k, v in reasons.items())
    sharing = next((r["gpu_sharing"] for r in records if r.get("gpu_sharing")), None)
    if sharing and sharing["max_ranks_per_gpu"] > 1:
        mps = {True: "on", False: "off"}.get(sharing["mps"], "unknown")
        notes += f" [{sharing['max_ranks_per_gpu']} ranks/GPU, MPS {mps}]"
    if problems:
        notes += " PROBLEMS: " + "; ".join(problems[:3])
    mark = "" if ok else "  <-- UNEXPECTED"
    print(f"{name:34} {np:>2} {rc:>4} {expected:>5} {float(secs):6.1f} {results:7d} {invalid:5d} "
          f"{sum(reasons.values()):6d}  {notes}{mark}")

print()
print("Per np/transport/op: latency at the smallest size, goodput and busbw at the largest (median; GB/s)")
print(f"{'np':>2} {'transport':10} {'op':14} {'small B':>8} {'lat us':>9} {'large B':>11} {'goodput':>8} {'busbw':>8}")
for name, np, expected, rc, secs in cases:
    if name.startswith("fault-"):
        continue
    path = out / "records" / f"{name}.jsonl"
    if not path.exists():
        continue
    groups = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") != "result":
            continue
        key = (record["transport"] + ("+socket" if "socket" in name else ""), record["op"],
               record.get("direction", ""), record.get("host_memory", ""))
        groups[key].append(record)
    for (transport, op, direction, memory), recs in groups.items():
        if op == "pairmatrix":
            continue
        recs.sort(key=lambda r: r["bytes"])
        small, large = recs[0], recs[-1]
        label = op + (f"/{memory}" if memory else "")
        print(f"{np:>2} {transport:10} {label:14} {small['bytes']:8d} {small['latency_us']:9.2f} "
              f"{large['bytes']:11d} {large['goodput_gbs']:8.2f} {large['busbw_gbs']:8.2f}")
    pairs = collections.defaultdict(dict)
    for (transport, op, direction, memory), recs in groups.items():
        if op != "pairmatrix":
            continue
        for r in recs:
            pairs[(transport, r["bytes"], direction)][(r["pair"]["src"], r["pair"]["dst"])] = r
    for (transport, size, direction), by_pair in sorted(pairs.items()):
        metric = "latency_us" if size <= 64 else ("aggregate_gbs" if direction == "bi" else "goodput_gbs")
        values = [r[metric] for r in by_pair.values()]
        print(f"{np:>2} {transport:10} pairmatrix/{direction:3} {size:>10} B: {metric} min {min(values):.2f} "
              f"max {max(values):.2f} over {len(values)} pairs")

print()
build_status = (out / "logs" / "build-status.txt").read_text().strip()
print(build_status + ("" if build_status.endswith("ok") else "  <-- the warnings are in logs/build.log"))
print(f"{len(cases) - bad_cases} of {len(cases)} cases as expected")
sys.exit(1 if bad_cases or not build_status.endswith("ok") else 0)
