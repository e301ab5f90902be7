#!/usr/bin/env bash
# commbench against nccl-tests on one GPU machine, in one run: all_reduce, alltoall, sendrecv and
# all_gather of an existing nccl-tests build and commbench's ccl transport with the same sizes and
# the same launch pattern (nccl-tests -n N = commbench --batch N), interleaved per op and repeated
# (nt, cb, nt, cb, so the run-to-run spread is visible); then commbench's d2d and d2d-kernel
# point-to-point bandwidth at 1 GiB against the D2D targets. The report (comparison.md, .csv) comes
# from compare_nccl_tests.py (python3 standard library only).
#
# usage (from the repository root, on the GPU machine):
#   NCCL_TESTS_DIR=/path/to/nccl-tests bench_src/scripts/compare-nccl-tests.sh OUTDIR
# NCCL_TESTS_DIR: an existing nccl-tests build -- the directory holding all_reduce_perf etc., or its
#   parent with build/ (this script never builds nccl-tests).
# environment: COMMBENCH (a built cuda commbench; default: build one into OUTDIR/build), MPIRUN
#   (default mpirun), MPICC, CUDA_ARCHS, NP (default 4), MIN_BYTES (8), MAX_BYTES (4G), WARMUP
#   (nccl-tests -w, default 5), ITERS (nccl-tests -n = commbench --batch, default 20), SAMPLES
#   (commbench --iters: timed samples of ITERS operations each, default 10), REPEATS (default 2),
#   D2D_SIZE (default 1G), D2D_ITERS (default 30), TRANSPORT (commbench transport compared,
#   default ccl), RUN_LIMIT_S (per run, default 180).
# Writes OUTDIR/compare.log (everything), environment.txt, commands.txt (every command), runs.tsv
# (name, exit status, seconds), raw/ (tool outputs), records/ (commbench JSON Lines),
# comparison.csv, comparison.md, and OUTDIR/compare.tar.gz with all of it but the build.
# Exit status: 0 every target met, 1 a target missed or a run failed, 2 bad setup.
set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: NCCL_TESTS_DIR=DIR $0 OUTDIR" >&2
    exit 2
fi
. "$(dirname "$0")/common.sh"
HELPER="$(cd "$(dirname "$0")" && pwd)/compare_nccl_tests.py"

MPIRUN=${MPIRUN:-mpirun}
NP=${NP:-4}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-4G}
WARMUP=${WARMUP:-5}
ITERS=${ITERS:-20}
SAMPLES=${SAMPLES:-10}
REPEATS=${REPEATS:-2}
D2D_SIZE=${D2D_SIZE:-1G}
D2D_ITERS=${D2D_ITERS:-30}
TRANSPORT=${TRANSPORT:-ccl}
RUN_LIMIT_S=${RUN_LIMIT_S:-180}

# nccl-tests binaries of the ops the helper compares, checked before anything runs
if [ -z "${NCCL_TESTS_DIR:-}" ]; then
    echo "$0: set NCCL_TESTS_DIR to an nccl-tests build (the directory with all_reduce_perf, or its parent)" >&2
    exit 2
fi
NT_BIN=$(realpath -m "$NCCL_TESTS_DIR")
[ -d "$NT_BIN/build" ] && NT_BIN=$NT_BIN/build
PLAN=$(python3 "$HELPER" plan) || exit 2
while read -r op binary; do
    if [ ! -x "$NT_BIN/$binary" ]; then
        echo "$0: $NT_BIN/$binary is not an executable (NCCL_TESTS_DIR=$NCCL_TESTS_DIR)" >&2
        exit 2
    fi
done <<<"$PLAN"
if [ -n "${COMMBENCH:-}" ] && [ ! -x "$COMMBENCH" ]; then
    echo "$0: COMMBENCH=$COMMBENCH is not an executable" >&2
    exit 2
fi

OUT=$(realpath -m "$1")
mkdir -p "$OUT/raw" "$OUT/records" || exit 2
rm -f "$OUT"/raw/* "$OUT"/records/* "$OUT/comparison.md" "$OUT/comparison.csv"
: >"$OUT/commands.txt"
: >"$OUT/runs.tsv"
exec > >(tee "$OUT/compare.log") 2>&1
STARTED=$(date +%s)

# One bundle of everything but the build, however the script ends (the lead brings back few files).
bundle() {
    tar -czf "$OUT.tar.gz.tmp" -C "$OUT" --exclude=./build --exclude=./build-nowerror --exclude=./compare.tar.gz . \
        2>/dev/null
    mv "$OUT.tar.gz.tmp" "$OUT/compare.tar.gz"
}
trap bundle EXIT

echo "== commbench ($TRANSPORT) vs nccl-tests ($NT_BIN), np $NP, $MIN_BYTES..$MAX_BYTES, nccl-tests -w $WARMUP -n $ITERS, commbench --batch $ITERS --iters $SAMPLES, $REPEATS repeats"
cb_environment | tee "$OUT/environment.txt"

if [ -n "${COMMBENCH:-}" ]; then
    BIN=$COMMBENCH
else
    echo "== build (cuda backend, warnings are errors)"
    cb_build_cuda "$OUT" "$OUT/build.log" || exit 1
    BIN=$CB_BIN
    echo "-Werror build: $CB_WERROR_BUILD" | tee -a "$OUT/environment.txt"
fi
"$BIN" --version | tee -a "$OUT/environment.txt"

# run NAME LOG command...: runs under the time limit; logs the command, its exit status and time
run() {
    local name=$1 log=$2 start rc secs
    shift 2
    echo "$(date -u +%H:%M:%S) $name: $*" >>"$OUT/commands.txt"
    start=$(date +%s%N)
    timeout -k 20 "$RUN_LIMIT_S" "$@" </dev/null >"$log" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
    printf '%s\t%s\t%s\n' "$name" "$rc" "$secs" >>"$OUT/runs.tsv"
    echo "   $name: exit $rc after $secs s"
    [ "$rc" = 0 ] || tail -5 "$log"
}

while read -r op binary; do
    echo "== $op"
    for k in $(seq 1 "$REPEATS"); do
        run "nt-$op-r$k" "$OUT/raw/nt-$op-r$k.txt" "$MPIRUN" -np "$NP" "$NT_BIN/$binary" -g 1 -b "$MIN_BYTES" \
            -e "$MAX_BYTES" -f 2 -w "$WARMUP" -n "$ITERS" -c 1
        run "cb-$op-r$k" "$OUT/raw/cb-$op-r$k.txt" "$MPIRUN" -np "$NP" "$BIN" --transport "$TRANSPORT" --op "$op" \
            --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --step-factor 2 --warmup 1 --iters "$SAMPLES" \
            --batch "$ITERS" --timeout 120 --output "$OUT/records/cb-$op-r$k.jsonl"
    done
done <<<"$PLAN"

echo "== D2D targets at $D2D_SIZE (rank 0 <-> last rank, and every pair)"
for transport in d2d d2d-kernel; do
    run "peer-$transport" "$OUT/raw/peer-$transport.txt" "$MPIRUN" -np "$NP" "$BIN" --transport "$transport" \
        --op pingpong,pingpong_bi,pairmatrix --sizes "$D2D_SIZE" --iters "$D2D_ITERS" --warmup 3 --timeout 120 \
        --output "$OUT/records/peer-$transport.jsonl"
done

echo "== report"
python3 "$HELPER" "$OUT"
status=$?
echo "== done in $(($(date +%s) - STARTED)) s, exit $status; results in $OUT (compare.tar.gz: all but the build)"
exit $status
