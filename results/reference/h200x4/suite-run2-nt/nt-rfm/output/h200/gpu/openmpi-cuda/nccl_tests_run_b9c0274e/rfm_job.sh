#!/bin/bash
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export CUDACXX=/usr/local/cuda/bin/nvcc
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 4 /work/main/third_party/nccl-tests/build/all_gather_perf -b 8 -e 128M -f 8 -w 5 -n 20 -g 1 -c 1
