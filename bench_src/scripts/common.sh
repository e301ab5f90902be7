# Shared by the GPU-machine scripts (gpu-acceptance.sh, compare-nccl-tests.sh); sourced from the
# repository root.

# NVLink multicast can take a shared host's GPUs out of service: never let anything use it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [ ! -f bench_src/Makefile ]; then
    echo "$0: run this from the repository root (bench_src/Makefile not found)" >&2
    exit 2
fi

# What the machine is: GPUs, topology, compilers, MPI, NCCL (stdout).
cb_environment() {
    echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"
    echo "== git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed files"
    echo "== env: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
    nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv || echo "nvidia-smi failed"
    nvidia-smi topo -m || true
    command -v cmake && cmake --version | head -1
    command -v nvcc && nvcc --version | tail -2
    command -v "${MPIRUN:-mpirun}" && "${MPIRUN:-mpirun}" --version 2>&1 | head -2
    ls -l /usr/include/nccl.h /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null
    dpkg -l 2>/dev/null | awk '$2 ~ /nccl|openmpi|mpich|cuda-runtime|cuda-toolkit/ {print $1, $2, $3}'
}

# _cb_make LOG BUILD_DIR [CMAKE_ARGS]
_cb_make() {
    make -C bench_src cuda BUILD_DIR="$2" MPICC="${MPICC:-mpicc}" CUDA_ARCHS="${CUDA_ARCHS:-90}" JOBS="${JOBS:-8}" \
        CMAKE_ARGS="${3:-}" >>"$1" 2>&1
}

# cb_build_cuda OUT LOG: builds the cuda backend into OUT/build; if the -Werror build fails (a
# newer compiler's new warning must not cost the measurements) it says so loudly and builds
# OUT/build-nowerror without -Werror. Sets CB_BIN and CB_WERROR_BUILD (ok|FAILED); returns 1 when
# no binary could be built.
cb_build_cuda() {
    local out=$1 log=$2
    CB_WERROR_BUILD=ok
    CB_BIN="$out/build/cuda/commbench"
    if ! _cb_make "$log" "$out/build"; then
        CB_WERROR_BUILD=FAILED
        grep -E "warning:|error:" "$log" | head -20
        echo "WARNING: the -Werror build FAILED (log: $log); measuring a build without -Werror"
        if ! _cb_make "$log" "$out/build-nowerror" -DCOMMBENCH_WERROR=OFF; then
            tail -50 "$log"
            echo "BUILD FAILED (log: $log)"
            return 1
        fi
        CB_BIN="$out/build-nowerror/cuda/commbench"
    fi
    tail -3 "$log"
}

# cb_open_outdir LOGNAME OUTDIR (the script's own arguments): OUT=OUTDIR, absolute, with records/, logs/
# and an empty cases.tsv (what run_case writes); everything printed from here on also goes to
# OUT/LOGNAME. MPIRUN defaults to mpirun. A usage message and exit 2 unless there is one OUTDIR.
cb_open_outdir() {
    if [ $# -ne 2 ]; then
        echo "usage: $0 OUTDIR" >&2
        exit 2
    fi
    OUT=$(realpath -m "$2")
    mkdir -p "$OUT/records" "$OUT/logs" || exit 2
    : >"$OUT/cases.tsv"
    exec > >(tee -a "$OUT/$1") 2>&1
    MPIRUN=${MPIRUN:-mpirun}
    CB_STARTED=$(date +%s)
}

# cb_close_outdir BUNDLE: the summary of OUT's cases (acceptance_summary.py, into OUT/summary.txt), the
# records, logs and summary bundled into OUT/BUNDLE; exits with the summary's status.
cb_close_outdir() {
    echo "== summary"
    python3 bench_src/scripts/acceptance_summary.py "$OUT" | tee "$OUT/summary.txt"
    local status=$?
    tar -C "$OUT" -czf "$OUT/$1" records logs cases.tsv summary.txt 2>/dev/null
    echo "== done in $(($(date +%s) - CB_STARTED)) s; results in $OUT ($1 holds records, logs, summary)"
    exit $status
}

# run_case NAME EXPECTED_CODES NP [VAR=VALUE...] -- commbench arguments...: runs $BIN under
# $MPIRUN -np NP with a time limit of $CASE_LIMIT_S, records into $OUT/records/NAME.jsonl, output into
# $OUT/logs/NAME.log, one line per case into $OUT/cases.tsv (which acceptance_summary.py judges).
# VAR=VALUE pairs are set for this case only; local ranks inherit mpirun's environment.
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
