/* cuda and hip backends: device memory, pinned and pageable host memory, one non-blocking
 * stream per process; validation data is generated and checked by kernels on the device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

static int device = -1;
static gpu_stream stream;
static unsigned long long *wrong_counter; /* device memory, one counter */

static const unsigned kThreads = 256;

int cb_gpu_ok(gpu_error err, const char *what)
{
    if (err == GPU(Success))
        return CB_OK;
    cb_errorf("%s: %s", what, GPU(GetErrorString)(err));
    return CB_ERROR;
}

gpu_stream cb_gpu_stream(void)
{
    return stream;
}

int cb_gpu_sync(gpu_stream s)
{
    return cb_gpu_ok(GPU(StreamSynchronize)(s), "stream synchronize");
}

unsigned cb_gpu_blocks(uint64_t count, unsigned threads, unsigned max_blocks)
{
    uint64_t blocks = (count + threads - 1) / threads;
    return blocks == 0 ? 1u : blocks > max_blocks ? max_blocks : (unsigned)blocks;
}

__global__ void fill_kernel(float *dst, struct cb_pattern p)
{
    uint64_t n = cb_pattern_count(&p);
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
        dst[i] = cb_pattern_at(&p, i);
}

__global__ void count_wrong_kernel(const float *buf, struct cb_pattern p, unsigned long long *wrong)
{
    uint64_t n = cb_pattern_count(&p);
    unsigned long long mine = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
        mine += !(buf[i] == cb_pattern_at(&p, i));
    if (mine)
        atomicAdd(wrong, mine);
}

static int gpu_init(int local_rank, int device_override)
{
    int count = 0;
    if (cb_gpu_ok(GPU(GetDeviceCount)(&count), "counting GPUs"))
        return CB_ERROR;
    if (count == 0) {
        cb_errorf("no GPU is visible to this process");
        return CB_ERROR;
    }
    if (device_override >= count) {
        cb_errorf("--device %d: only %d GPU(s) visible", device_override, count);
        return CB_ERROR;
    }
    device = device_override >= 0 ? device_override : local_rank % count;
    if (cb_gpu_ok(GPU(SetDevice)(device), "selecting the GPU") ||
        cb_gpu_ok(GPU(StreamCreateWithFlags)(&stream, GPU(StreamNonBlocking)), "creating a stream") ||
        cb_gpu_ok(GPU(Malloc)((void **)&wrong_counter, sizeof *wrong_counter), "allocating a counter"))
        return CB_ERROR;
    return CB_OK;
}

static void gpu_finalize(void)
{
    GPU(Free)(wrong_counter);
    GPU(StreamDestroy)(stream);
}

static void *gpu_alloc(enum cb_space space, size_t bytes)
{
    void *p = NULL;
    gpu_error err = GPU(Success);
    switch (space) {
    case CB_DEVICE: err = GPU(Malloc)(&p, bytes); break;
    case CB_HOST_PINNED: err = GPU_MALLOC_HOST(&p, bytes); break;
    case CB_HOST_PAGEABLE:
        if (posix_memalign(&p, 64, bytes) != 0)
            p = NULL;
        break;
    }
    if (err != GPU(Success) || !p) {
        static const char *const kinds[] = {"device", "pinned host", "pageable host"};
        cb_errorf("cannot allocate %zu bytes of %s memory%s%s", bytes, kinds[space], err != GPU(Success) ? ": " : "",
                  err != GPU(Success) ? GPU(GetErrorString)(err) : "");
        return NULL;
    }
    return p;
}

static void gpu_release(enum cb_space space, void *ptr)
{
    switch (space) {
    case CB_DEVICE: GPU(Free)(ptr); break;
    case CB_HOST_PINNED: GPU_FREE_HOST(ptr); break;
    case CB_HOST_PAGEABLE: free(ptr); break;
    }
}

static int gpu_copy(void *dst, const void *src, size_t bytes)
{
    if (cb_gpu_ok(GPU(MemcpyAsync)(dst, src, bytes, GPU(MemcpyDefault), stream), "copy"))
        return CB_ERROR;
    return cb_gpu_sync(stream);
}

static int gpu_memset(enum cb_space space, void *dst, int byte, size_t bytes)
{
    if (space != CB_DEVICE) {
        memset(dst, byte, bytes);
        return CB_OK;
    }
    if (cb_gpu_ok(GPU(MemsetAsync)(dst, byte, bytes, stream), "memset"))
        return CB_ERROR;
    return cb_gpu_sync(stream);
}

static int gpu_fill(enum cb_space space, float *dst, const struct cb_pattern *p)
{
    if (space != CB_DEVICE) {
        cb_pattern_fill_host(dst, p);
        return CB_OK;
    }
    fill_kernel<<<cb_gpu_blocks(cb_pattern_count(p), kThreads, 4096), kThreads, 0, stream>>>(dst, *p);
    if (cb_gpu_ok(GPU(GetLastError)(), "fill kernel launch"))
        return CB_ERROR;
    return cb_gpu_sync(stream);
}

static int gpu_count_wrong(enum cb_space space, const float *buf, const struct cb_pattern *p, uint64_t *wrong)
{
    if (space != CB_DEVICE) {
        *wrong = cb_pattern_count_wrong_host(buf, p);
        return CB_OK;
    }
    unsigned long long host = 0;
    if (cb_gpu_ok(GPU(MemsetAsync)(wrong_counter, 0, sizeof *wrong_counter, stream), "memset"))
        return CB_ERROR;
    count_wrong_kernel<<<cb_gpu_blocks(cb_pattern_count(p), kThreads, 4096), kThreads, 0, stream>>>(buf, *p,
                                                                                                    wrong_counter);
    if (cb_gpu_ok(GPU(GetLastError)(), "check kernel launch") ||
        cb_gpu_ok(GPU(MemcpyAsync)(&host, wrong_counter, sizeof host, GPU(MemcpyDefault), stream), "copy") ||
        cb_gpu_sync(stream))
        return CB_ERROR;
    *wrong = host;
    return CB_OK;
}

/* Whether this process's work on the device goes through MPS (CUDA >= 12.3 can tell). */
static int mps_client(void)
{
#if !defined(COMMBENCH_HIP) && CUDART_VERSION >= 12030
    int on = 0;
    if (cudaDeviceGetAttribute(&on, cudaDevAttrMpsEnabled, device) == cudaSuccess)
        return on != 0;
#endif
    return -1;
}

static void gpu_describe(struct cb_device_info *out)
{
    gpu_device_prop prop;
    out->index = device;
    out->mps = mps_client();
    if (GPU(GetDeviceProperties)(&prop, device) == GPU(Success)) {
        snprintf(out->name, sizeof out->name, "%s", prop.name);
#if !defined(COMMBENCH_HIP)
        const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
        snprintf(out->uuid, sizeof out->uuid,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
                 u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
#endif
    }
    if (GPU(DeviceGetPCIBusId)(out->pci_bus_id, (int)sizeof out->pci_bus_id, device) != GPU(Success))
        out->pci_bus_id[0] = '\0';
}

/* CUDA encodes 1000*major + 10*minor; HIP major*10^7 + minor*10^5 + patch. */
static void format_version(int v, char *out, size_t len)
{
#if defined(COMMBENCH_HIP)
    snprintf(out, len, "%d.%d.%d", v / 10000000, v / 100000 % 100, v % 100000);
#else
    snprintf(out, len, "%d.%d", v / 1000, v % 1000 / 10);
#endif
}

static int gpu_versions(struct cb_kv *out, int max)
{
    int n = 0, v = 0;
    if (n < max && GPU(RuntimeGetVersion)(&v) == GPU(Success)) {
        snprintf(out[n].key, sizeof out[n].key, "%s_runtime", CB_GPU_BACKEND);
        format_version(v, out[n].value, sizeof out[n].value);
        n++;
    }
    if (n < max && GPU(DriverGetVersion)(&v) == GPU(Success)) {
        snprintf(out[n].key, sizeof out[n].key, "%s_driver", CB_GPU_BACKEND);
        format_version(v, out[n].value, sizeof out[n].value);
        n++;
    }
    if (n < max && cb_ccl_version()) {
#if defined(COMMBENCH_HIP)
        snprintf(out[n].key, sizeof out[n].key, "rccl");
#else
        snprintf(out[n].key, sizeof out[n].key, "nccl");
#endif
        snprintf(out[n].value, sizeof out[n].value, "%s", cb_ccl_version());
        n++;
    }
    return n;
}

unsigned cb_backend_bit(void)
{
#if defined(COMMBENCH_HIP)
    return CB_ON_HIP;
#else
    return CB_ON_CUDA;
#endif
}

#if CB_HOST_PASS
static const struct cb_backend gpu_backend = {
    .name = CB_GPU_BACKEND,
    .init = gpu_init,
    .finalize = gpu_finalize,
    .alloc = gpu_alloc,
    .release = gpu_release,
    .copy = gpu_copy,
    .memset = gpu_memset,
    .fill = gpu_fill,
    .count_wrong = gpu_count_wrong,
    .describe = gpu_describe,
    .versions = gpu_versions,
};

const struct cb_backend *const cb_backend = &gpu_backend;
#endif
