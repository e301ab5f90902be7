#!/usr/bin/env bash
# commbench on a machine with ONE GPU: the cuda build from a clean tree, host<->device copies, the
# transports with 2 ranks sharing the GPU (without and, where nvidia-cuda-mps-control exists, with
# MPS), a plain host-memory MPI baseline between the same 2 ranks (cpu backend), and GPU-aware MPI
# through a CUDA-built UCX from PyPI (ucx-cuda.sh) when UCX_CUDA names its wheel or folder.
#
# usage (from the repository root, on the GPU machine):
#   [UCX_CUDA=.whl/libucx_cu13-*.whl] bench_src/scripts/single-gpu.sh OUTDIR
# environment: MPIRUN, MPICC, CUDA_ARCHS (as gpu-acceptance.sh), SIZES (shared-GPU cases), MPI_SIZES
#   (GPU-aware MPI), HOSTCOPY_SIZES, ITERS, WARMUP, CASE_LIMIT_S, MPS (0: skip the MPS pass).
# Two ranks on one GPU without MPS time-slice the GPU between their processes: small-message times
# then measure the GPU's context switches, not a link; commbench's records say so (gpu_sharing,
# devices[].mps, devices[].ranks_on_device) and so does its table ("# NOTE: ... share one GPU").
# The MPS daemon runs with pipe and log folders under OUTDIR and is stopped before the script ends.
# Writes what gpu-acceptance.sh writes (summary.txt, cases.tsv, records/, logs/) plus
# single-gpu.tar.gz; exit status 0 when every case ended as expected.
set -u -o pipefail

. "$(dirname "$0")/common.sh"
cb_open_outdir single-gpu.log "$@"
SIZES=${SIZES:-8,4K,32K,1M,64M}
MPI_SIZES=${MPI_SIZES:-8,4K,32K,1M,64M,256M}
HOSTCOPY_SIZES=${HOSTCOPY_SIZES:-8,64,512,4K,32K,256K,2M,16M,128M,1G}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
CASE_LIMIT_S=${CASE_LIMIT_S:-240}
COMMON=(--iters "$ITERS" --warmup "$WARMUP" --timeout 120)
SHARED_TRANSPORTS=(staging d2d d2d-kernel ccl)

echo "== commbench on one GPU"
cb_environment
nvidia-smi --query-gpu=index,uuid,compute_mode,mig.mode.current --format=csv || true

echo "== build (cuda backend, warnings are errors; cpu backend for the host-memory baseline)"
cb_build_cuda "$OUT" "$OUT/logs/build.log" || exit 1
CUDA_BIN=$CB_BIN
echo "-Werror build: $CB_WERROR_BUILD" >"$OUT/logs/build-status.txt"
make -C bench_src cpu-openmpi BUILD_DIR="$OUT/build" OPENMPI_CC="${MPICC:-mpicc}" JOBS="${JOBS:-8}" >>"$OUT/logs/build.log" 2>&1 ||
    { tail -20 "$OUT/logs/build.log"; echo "cpu build FAILED"; exit 1; }
CPU_BIN=$OUT/build/cpu-openmpi/commbench
"$CUDA_BIN" --version
"$CUDA_BIN" --list | tee "$OUT/logs/list.txt"

# shared_gpu_cases TAG: every op of every peer transport with 2 ranks on the one GPU
shared_gpu_cases() {
    local tag=$1 transport
    for transport in "${SHARED_TRANSPORTS[@]}"; do
        # NCCL needs one GPU per rank: ccl answers 'unsupported' (exit 4) when ranks share one
        run_case "np2-${transport}-${tag}" 0,4 2 -- --transport "$transport" --sizes "$SIZES" "${COMMON[@]}"
    done
}

# GPU-aware MPI (ucx-cuda.sh): its variables go to the cases that use it, not to the others
UCX_ENV=()
if [ -n "${UCX_CUDA:-}" ]; then
    saved_ld_library_path=${LD_LIBRARY_PATH:-}
    # shellcheck source=bench_src/scripts/ucx-cuda.sh
    if . bench_src/scripts/ucx-cuda.sh "$UCX_CUDA" "$OUT/ucx-cuda"; then
        UCX_ENV=(LD_LIBRARY_PATH="$LD_LIBRARY_PATH" UCX_MODULE_DIR="$UCX_MODULE_DIR" OMPI_MCA_pml="$OMPI_MCA_pml"
            OMPI_MCA_pml_ucx_tls="$OMPI_MCA_pml_ucx_tls" OMPI_MCA_pml_ucx_devices="$OMPI_MCA_pml_ucx_devices")
        { "$UCX_CUDA_INFO" -v && "$UCX_CUDA_INFO" -d; } >"$OUT/logs/ucx-info.txt" 2>&1
    fi
    export LD_LIBRARY_PATH=$saved_ld_library_path
    unset UCX_MODULE_DIR OMPI_MCA_pml OMPI_MCA_pml_ucx_tls OMPI_MCA_pml_ucx_devices
fi

# gpu_aware_mpi_cases TAG: the mpi transport on device memory through UCX. Point-to-point moves
# device memory; the collectives come back 'unsupported' (Open MPI says it is not built with CUDA),
# so exit 4 with valid point-to-point results.
gpu_aware_mpi_cases() {
    local tag=$1
    if [ ${#UCX_ENV[@]} -eq 0 ]; then
        echo "GPU-aware MPI through UCX skipped: UCX_CUDA is not set or ucx-cuda.sh failed"
        return
    fi
    run_case "np2-mpi-ucx-cuda-${tag}" 4 2 "${UCX_ENV[@]}" -- --transport mpi --assume-gpu-aware-mpi \
        --sizes "$MPI_SIZES" "${COMMON[@]}"
}

echo "== host<->device copies (one rank)"
BIN=$CUDA_BIN
run_case "np1-memcpy" 0 1 -- --transport memcpy --sizes "$HOSTCOPY_SIZES" --iters 10 --warmup 2 --timeout 120

echo "== host-memory MPI between the same 2 ranks (cpu backend): the floor without a GPU in the path"
BIN=$CPU_BIN
run_case "np2-host-mpi" 0 2 -- --transport mpi --op pingpong,pingpong_bi,sendrecv --sizes "$SIZES" "${COMMON[@]}"

echo "== 2 ranks share the GPU, no MPS"
BIN=$CUDA_BIN
shared_gpu_cases nomps

MPS_CONTROL=$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null)
if [ "${MPS:-1}" = 0 ]; then
    echo "== MPS pass skipped (MPS=0)"
elif [ -z "$MPS_CONTROL" ]; then
    echo "== MPS pass skipped: nvidia-cuda-mps-control is not on this machine"
else
    echo "== 2 ranks share the GPU through MPS ($MPS_CONTROL)"
    export CUDA_MPS_PIPE_DIRECTORY=$OUT/mps/pipe CUDA_MPS_LOG_DIRECTORY=$OUT/mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if "$MPS_CONTROL" -d; then
        sleep 1
        shared_gpu_cases mps
        gpu_aware_mpi_cases mps
        echo get_server_list | "$MPS_CONTROL" | sed 's/^/MPS server: /'
        echo quit | "$MPS_CONTROL"
        sleep 2
        cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$OUT/logs/" 2>/dev/null
    else
        echo "nvidia-cuda-mps-control -d failed"
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

echo "== GPU-aware MPI"
BIN=$CUDA_BIN
# the system MPI as it is: its own query says 'not GPU-aware', so every op is 'unsupported' (exit 4)
run_case "np2-mpi-system" 4 2 -- --transport mpi --op pingpong,allreduce --sizes 8 "${COMMON[@]}"
gpu_aware_mpi_cases nomps
[ ${#UCX_ENV[@]} -gt 0 ] && run_case "np2-mpi-ucx-cuda-pairmatrix" 0 2 "${UCX_ENV[@]}" -- --transport mpi \
    --assume-gpu-aware-mpi --op pairmatrix --sizes 8,1M,256M "${COMMON[@]}"

cb_close_outdir single-gpu.tar.gz
