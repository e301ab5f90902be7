/* One source for CUDA and HIP: GPU(Name) is cudaName or hipName; the few APIs whose names differ
 * get their own macros. Internal interface of the GPU backend for the GPU transports. */
#ifndef COMMBENCH_GPU_H
#define COMMBENCH_GPU_H

#include "../commbench.h"

#if defined(COMMBENCH_HIP)
#include <hip/hip_runtime.h>
#define GPU(name) hip##name
#define GPU_MALLOC_HOST(ptr, bytes) hipHostMalloc(ptr, bytes, 0)
#define GPU_FREE_HOST hipHostFree
typedef hipDeviceProp_t gpu_device_prop;
#define CB_GPU_BACKEND "hip"
#else
#include <cuda_runtime.h>
#define GPU(name) cuda##name
#define GPU_MALLOC_HOST(ptr, bytes) cudaMallocHost(ptr, bytes)
#define GPU_FREE_HOST cudaFreeHost
typedef cudaDeviceProp gpu_device_prop;
#define CB_GPU_BACKEND "cuda"
#endif

/* hip-clang also emits namespace-scope const objects in the device pass; tables of host function
 * pointers (backend, transports, engines) are therefore defined only when CB_HOST_PASS is 1. */
#if defined(__HIP_DEVICE_COMPILE__)
#define CB_HOST_PASS 0
/* the host functions those tables point to look unused in the device pass */
#pragma clang diagnostic ignored "-Wunused-function"
#else
#define CB_HOST_PASS 1
#endif

typedef GPU(Stream_t) gpu_stream;
typedef GPU(Error_t) gpu_error;

/* CB_OK, or CB_ERROR with cb_errorf("<what>: <runtime's message>"). */
int cb_gpu_ok(gpu_error err, const char *what);
/* The backend's stream (after init). */
gpu_stream cb_gpu_stream(void);
/* Waits for a stream; CB_OK or CB_ERROR. */
int cb_gpu_sync(gpu_stream stream);
/* Launch geometry for grid-stride loops over count items. */
unsigned cb_gpu_blocks(uint64_t count, unsigned threads, unsigned max_blocks);

/* Version of the collective library the ccl transport was built with, or NULL (ccl.cu). */
const char *cb_ccl_version(void);

#endif
