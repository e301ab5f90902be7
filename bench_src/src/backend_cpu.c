/* cpu backend: every space is ordinary host memory. */
#include <stdlib.h>
#include <string.h>

#include "commbench.h"

static int cpu_init(int local_rank, int device_override)
{
    (void)local_rank;
    (void)device_override;
    return CB_OK;
}

static void cpu_finalize(void) {}

static void *cpu_alloc(enum cb_space space, size_t bytes)
{
    (void)space;
    /* 64-byte alignment like device allocations; never 0 bytes. */
    void *p = NULL;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) {
        cb_errorf("cannot allocate %zu bytes of host memory", bytes);
        return NULL;
    }
    return p;
}

static void cpu_release(enum cb_space space, void *ptr)
{
    (void)space;
    free(ptr);
}

static int cpu_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return CB_OK;
}

static int cpu_memset(enum cb_space space, void *dst, int byte, size_t bytes)
{
    (void)space;
    memset(dst, byte, bytes);
    return CB_OK;
}

static int cpu_fill(enum cb_space space, float *dst, const struct cb_pattern *p)
{
    (void)space;
    cb_pattern_fill_host(dst, p);
    return CB_OK;
}

static int cpu_count_wrong(enum cb_space space, const float *buf, const struct cb_pattern *p, uint64_t *wrong)
{
    (void)space;
    *wrong = cb_pattern_count_wrong_host(buf, p);
    return CB_OK;
}

static int cpu_versions(struct cb_kv *out, int max)
{
    (void)out;
    (void)max;
    return 0;
}

static const struct cb_backend cpu_backend = {
    .name = "cpu",
    .init = cpu_init,
    .finalize = cpu_finalize,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .copy = cpu_copy,
    .memset = cpu_memset,
    .fill = cpu_fill,
    .count_wrong = cpu_count_wrong,
    .describe = NULL,
    .versions = cpu_versions,
};

const struct cb_backend *const cb_backend = &cpu_backend;

unsigned cb_backend_bit(void)
{
    return CB_ON_CPU;
}
