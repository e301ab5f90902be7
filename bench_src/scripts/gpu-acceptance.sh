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

. "$(dirname "$0")/common.sh"
cb_open_outdir acceptance.log "$@"
NPS=${NPS:-"4 2"}
SIZES=${SIZES:-8,64,512,4K,32K,256K,2M,16M,128M,1G}
PAIR_SIZES=${PAIR_SIZES:-8,1M,256M}
# the D2D targets are stated at 1 GiB; one more size costs the peer-mapped pair matrices ~1 s each
PEER_PAIR_SIZES=${PEER_PAIR_SIZES:-$PAIR_SIZES,1G}
ITERS=${ITERS:-10}
WARMUP=${WARMUP:-2}
CASE_LIMIT_S=${CASE_LIMIT_S:-600}

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

cb_close_outdir acceptance.tar.gz
