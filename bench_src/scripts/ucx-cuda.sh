# GPU-aware MPI from a distribution's Open MPI that is not built with CUDA: run its UCX PML on a
# CUDA-built UCX from PyPI (the `libucx-cu13` / `libucx-cu12` wheel, which also bundles the CUDA
# runtime its modules need). Source it (bash), with the wheel or the folder it was unpacked into:
#
#   . bench_src/scripts/ucx-cuda.sh PATH/libucx_cu13-*.whl [UNPACK_DIR]   # or an unpacked folder
#
# Get the wheel where PyPI is reachable: `python3 -m pip download --no-deps -d .whl libucx-cu13`
# (cu12 for a CUDA 12 driver). It exports LD_LIBRARY_PATH (the wheel's libucp/libuct/libucs/libucm
# before the system UCX), UCX_MODULE_DIR (its cuda_copy/cuda_ipc/cma modules) and
# OMPI_MCA_pml=ucx, OMPI_MCA_pml_ucx_tls=any, OMPI_MCA_pml_ucx_devices=any (Open MPI 4.1 otherwise
# declines UCX on a host without a network device); mpirun passes them to local ranks. Then run
# `commbench --transport mpi --assume-gpu-aware-mpi`: point-to-point ops (pingpong, pingpong_bi,
# sendrecv, pairmatrix) move device memory through UCX; the collectives stay refused with
# `unsupported` records, because Open MPI's own collective code (not built with CUDA, as
# MPIX_Query_cuda_support() says) copies and reduces on the host and would crash.
# Returns 1 (and says why) when the wheel cannot be unpacked or its UCX has no CUDA transport.

cb_ucx_cuda() {
    local source=$1 dir=${2:-${TMPDIR:-/tmp}/ucx-cuda}
    if [ -f "$source" ]; then
        rm -rf "$dir" && mkdir -p "$dir" &&
            python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$source" "$dir" ||
            { echo "ucx-cuda.sh: cannot unpack $source into $dir" >&2; return 1; }
    elif [ -d "$source" ]; then
        dir=$source
    else
        echo "ucx-cuda.sh: $source is neither a libucx-cu* wheel nor a folder" >&2
        return 1
    fi
    local lib=$dir/libucx/lib
    if [ ! -e "$lib/libucp.so.0" ] || [ ! -d "$lib/ucx" ]; then
        echo "ucx-cuda.sh: $dir holds no libucx/lib/libucp.so.0 and libucx/lib/ucx (not a libucx wheel?)" >&2
        return 1
    fi
    # zipfile drops the execute bits and the symbolic links; the libraries only need to be readable
    chmod +x "$dir/libucx/bin/"* 2>/dev/null
    export LD_LIBRARY_PATH=$lib:$(echo "$dir"/libucx_cu*.libs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export UCX_MODULE_DIR=$lib/ucx
    export OMPI_MCA_pml=ucx OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any
    UCX_CUDA_INFO=$dir/libucx/bin/ucx_info
    if ! "$UCX_CUDA_INFO" -d 2>/dev/null | grep -q 'Transport: cuda_copy'; then
        echo "ucx-cuda.sh: the UCX of $dir lists no cuda_copy transport (no CUDA driver here, or a UCX without CUDA)" >&2
        return 1
    fi
    echo "ucx-cuda.sh: $("$UCX_CUDA_INFO" -v | head -1 | sed 's/^# *//'); transports:" \
        "$("$UCX_CUDA_INFO" -d | awk '/Transport:/ {print $3}' | sort -u | paste -sd, -)"
}

if [ $# -ge 1 ]; then
    cb_ucx_cuda "$@"
fi
