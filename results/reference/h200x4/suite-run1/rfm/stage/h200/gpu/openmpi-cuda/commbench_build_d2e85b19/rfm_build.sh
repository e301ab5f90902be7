#!/bin/bash

_onerror()
{
    exitcode=$?
    echo "-reframe: command \`$BASH_COMMAND' failed (exit code: $exitcode)"
    exit $exitcode
}

trap _onerror ERR

export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export CUDACXX=/usr/local/cuda/bin/nvcc
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p build
cmake -DCMAKE_C_COMPILER="mpicc" -DCMAKE_CXX_COMPILER="mpicxx" -DCMAKE_CUDA_COMPILER="/usr/local/cuda/bin/nvcc" -DCOMMBENCH_BACKEND=cuda -DCMAKE_BUILD_TYPE=Release -DCOMMBENCH_CUDA_ARCHS=90 -S . -B build
cmake --build build -j 16
