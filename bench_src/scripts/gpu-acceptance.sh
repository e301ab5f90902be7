#!/usr/bin/env bash
# GPU acceptance run of commbench's cuda backend: builds it, runs every op x transport under
# `mpirun -np 4` and `-np 2` with validation, plus planted-fault checks (corruption -> exit 1,
# hang -> exit 3) and NCCL forced onto its socket transport, then prints a compact summary.
#
# usage (from the repository root, on the GPU machine):
#   bench_src/scripts/gpu-acceptance.sh OUTDIR
# environment: MPIRUN (default mpirun), MPICC (default mpicc), CUDA_ARCHS (default 90),
#   NPS (default "4 2"), SIZES, PAIR_SIZES, PEER_PAIR_SIZES (d2d, d2d-kernel; default PAIR_SIZES
#   plus 1G), ITERS, WARMUP, CASE_LIMIT_S (per run, default 600).
# Writes OUTDIR/acceptance.log (everything), OUTDIR/summary.txt, OUTDIR/cases.tsv,
# OUTDIR/records/*.jsonl, OUTDIR/logs/*.log and OUTDIR/acceptance.tar.gz (records + logs +
# summary). Exit status: 0 when every case ended with its expected exit code, else 1.
set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
. "$(dirname "$0")/common.sh"
OUT=$(realpath -m "$1")
mkdir -p "$OUT/records" "$OUT/logs" || exit 2
: >"$OUT/cases.tsv"
exec > >(tee -a "$OUT/acceptance.log") 2>&1

MPIRUN=${MPIRUN:-mpirun}
NPS=${NPS:-"4 2"}
SIZES=${SIZES:-8,64,512,4K,32K,256K,2M,16M,128M,1G}
PAIR_SIZES=${PAIR_SIZES:-8,1M,256M}
# the D2D targets are stated at 1 GiB; one more size costs the peer-mapped pair matrices ~1 s each
PEER_PAIR_SIZES=${PEER_PAIR_SIZES:-$PAIR_SIZES,1G}
ITERS=${ITERS:-10}
WARMUP=${WARMUP:-2}
CASE_LIMIT_S=${CASE_LIMIT_S:-600}
STARTED=$(date +%s)

echo "== commbench GPU acceptance"
cb_environment

echo "== build (cuda backend, warnings are errors)"
cb_build_cuda "$OUT" "$OUT/logs/build.log" || exit 1
BIN=$CB_BIN
echo "-Werror build: $CB_WERROR_BUILD" >"$OUT/logs/build-status.txt"
"$BIN" --version
"$BIN" --list | tee "$OUT/logs/list.txt"

# ops of a transport from --list, minus the ones named after it
ops_of() {
    local transport=$1
    shift
    awk -v t="$transport" '$1 == "transport" && $2 == t {print $4}' "$OUT/logs/list.txt" | tr ',' '\n' |
        grep -v -x -F "$(printf '%s\n' "$@" none)" | paste -sd, -
}

# run_case NAME EXPECTED_CODES NP [VAR=VALUE...] -- commbench arguments...
# (VAR=VALUE pairs are set for this case only; local ranks inherit mpirun's environment)
run_case() {
    local name=$1 expected=$2 np=$3
    shift 3
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        envs+=("$1")
        shift
    done
    shift
    local start end rc secs
    start=$(date +%s%N)
    echo "-- $name (np $np, expect exit $expected): ${envs[*]} $*"
    env "${envs[@]}" timeout -k 20 "$CASE_LIMIT_S" "$MPIRUN" -np "$np" "$BIN" "$@" \
        --output "$OUT/records/$name.jsonl" >"$OUT/logs/$name.log" 2>&1
    rc=$?
    end=$(date +%s%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$np" "$expected" "$rc" "$secs" >>"$OUT/cases.tsv"
    echo "   exit $rc after $secs s; $(wc -l <"$OUT/records/$name.jsonl" 2>/dev/null || echo 0) records"
    case ",$expected," in
    *",$rc,"*) ;;
    *) echo "   UNEXPECTED exit code $rc; last lines of $OUT/logs/$name.log:"; tail -15 "$OUT/logs/$name.log" ;;
    esac
}

COMMON=(--iters "$ITERS" --warmup "$WARMUP" --timeout 300)
FIRST_NP=${NPS%% *}
for np in $NPS; do
    echo "== np $np"
    for transport in staging d2d d2d-kernel ccl; do
        run_case "np${np}-${transport}" 0 "$np" -- --transport "$transport" --op "$(ops_of "$transport" pairmatrix)" \
            --sizes "$SIZES" "${COMMON[@]}"
        pair_sizes=$PAIR_SIZES
        case $transport in d2d | d2d-kernel) pair_sizes=$PEER_PAIR_SIZES ;; esac
        run_case "np${np}-${transport}-pairmatrix" 0 "$np" -- --transport "$transport" --op pairmatrix \
            --sizes "$pair_sizes" "${COMMON[@]}"
    done
    # Open MPI without CUDA support must answer with 'unsupported' error records (exit 4).
    run_case "np${np}-mpi" 0,4 "$np" -- --transport mpi --sizes "$SIZES" "${COMMON[@]}"
    # Host copies are per rank: one pass with every GPU copying at once is enough (another is ~20 s).
    [ "$np" = "$FIRST_NP" ] && run_case "np${np}-memcpy" 0 "$np" -- --transport memcpy --sizes "$SIZES" "${COMMON[@]}"
done

echo "== NCCL over its socket transport (the one-host stand-in for a network), np $FIRST_NP"
run_case "np${FIRST_NP}-ccl-socket" 0 "$FIRST_NP" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 -- --transport ccl \
    --op allreduce,alltoall,pingpong --sizes 8,64K,16M,256M "${COMMON[@]}"

echo "== planted faults (test-only --inject): corruption must give exit 1, a hang exit 3 within the timeout"
run_case "fault-corrupt-d2d-kernel" 1 "$FIRST_NP" -- --transport d2d-kernel --op allreduce,alltoall,pingpong --sizes 4K,1M \
    --iters 3 --warmup 1 --inject corrupt
run_case "fault-corrupt-ccl" 1 "$FIRST_NP" -- --transport ccl --op allreduce,bcast --sizes 4K --iters 3 --warmup 1 \
    --inject corrupt
run_case "fault-hang-ccl" 3 "$FIRST_NP" -- --transport ccl --op allreduce --sizes 1M --iters 3 --warmup 1 --inject hang \
    --timeout 10
run_case "fault-hang-d2d" 3 2 -- --transport d2d --op pingpong --sizes 1M --iters 3 --warmup 1 --inject hang \
    --timeout 10

echo "== summary"
python3 - "$OUT" <<'PYEOF' | tee "$OUT/summary.txt"
import collections, json, pathlib, sys

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
PYEOF
status=$?
tar -C "$OUT" -czf "$OUT/acceptance.tar.gz" records logs cases.tsv summary.txt 2>/dev/null
echo "== done in $(($(date +%s) - STARTED)) s; results in $OUT (acceptance.tar.gz holds records, logs, summary)"
exit $status
