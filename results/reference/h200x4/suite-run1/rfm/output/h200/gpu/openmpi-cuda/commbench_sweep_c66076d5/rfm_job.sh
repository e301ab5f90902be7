#!/bin/bash
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export CUDACXX=/usr/local/cuda/bin/nvcc
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 2 /tmp/suite/rfm/stage/h200/gpu/openmpi-cuda/commbench_build_d2e85b19/build/commbench --op pingpong --transport ccl --min-bytes 8 --max-bytes 134217728 --step-factor 8 --warmup 2 --iters 10 --batch 1 --timeout 120 --check --output commbench.jsonl
