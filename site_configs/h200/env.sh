# Source on the GPU machine: `. site_configs/h200/env.sh`, then `reframe -c reframe_checks -r`
# (or site_configs/h200/run-suite.sh OUTDIR, which sources this file itself).
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
. "${COMMCAMP_DATA:-$_commcamp_site/../..}/site_configs/reframe_results.sh"  # ReFrame's results database
# NVLink multicast can put the shared host's GPUs out of service: off for everything started from here
# (the ReFrame configuration also exports these in every job).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Everything runs as root there.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# nccl-tests for the reference check (site.yaml reference_benchmarks.nccl_tests); an existing build.
export NCCL_TESTS_DIR="${NCCL_TESTS_DIR:-$(cd "$_commcamp_site/../.." && pwd)/third_party/nccl-tests/build}"
# GPU-aware MPI (environment openmpi-ucx-cuda, check commbench_gpu_aware_mpi): COMMCAMP_UCX_CUDA names a
# libucx-cu13 wheel (python3 -m pip download --no-deps -d .whl libucx-cu13) or the folder it was unpacked
# into; a wheel is unpacked into third_party/ucx-cuda and checked (bench_src/scripts/ucx-cuda.sh, in a
# subshell: its OMPI_MCA_pml=ucx must not reach the other environments), then COMMCAMP_UCX_CUDA names that.
if [ -f "${COMMCAMP_UCX_CUDA:-}" ]; then
    _commcamp_ucx=$(cd "$_commcamp_site/../.." && pwd)/third_party/ucx-cuda
    if (. "$_commcamp_site/../../bench_src/scripts/ucx-cuda.sh" "$COMMCAMP_UCX_CUDA" "$_commcamp_ucx"); then
        export COMMCAMP_UCX_CUDA=$_commcamp_ucx
    else
        echo "env.sh: COMMCAMP_UCX_CUDA=$COMMCAMP_UCX_CUDA gives no CUDA-built UCX; commbench_gpu_aware_mpi will skip" >&2
    fi
    unset _commcamp_ucx
fi
unset _commcamp_site
