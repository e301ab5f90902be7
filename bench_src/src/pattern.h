/* Validation data shared by host and device code.
 *
 * Element idx of rank r's input holds value(r, idx, seed) = (13*idx + 7*seed + 101*r) mod 251,
 * a small integer: sums over up to 66,000 ranks stay exact in float32, and the rank term makes
 * data from the wrong rank detectable. A cb_pattern describes a whole buffer as segments of
 * seg_len elements; segment s holds source rank src(s)'s values from index base on, or the sum
 * over all ranks. Received buffers are pre-filled with 0xff bytes (a NaN) so untouched
 * elements never compare equal. */
#ifndef COMMBENCH_PATTERN_H
#define COMMBENCH_PATTERN_H

#include <stdint.h>

/* Inline helpers for host and device code; "unused" because nvcc's host pass with clang as host
 * compiler flags static inline functions a translation unit does not call. */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define CB_HOSTDEV __host__ __device__ __attribute__((unused))
#else
#define CB_HOSTDEV __attribute__((unused))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CB_PATTERN_PERIOD 251u
#define CB_SRC_SEGMENT (-1) /* segment s holds rank s's values */
#define CB_SRC_SUM (-2)     /* every element is the sum over all ranks */

struct cb_pattern {
    uint64_t seg_len; /* elements per segment */
    int32_t nseg;     /* number of segments */
    int32_t src;      /* >= 0: that rank; CB_SRC_SEGMENT or CB_SRC_SUM */
    uint64_t base;    /* index in the source rank's input of a segment's first element */
    uint32_t seed;
    int32_t nranks;
    /* CB_SRC_SUM: rank_sum[k] = sum over ranks r of (k + 101*r) mod 251 (cb_pattern_init fills it) */
    float rank_sum[CB_PATTERN_PERIOD];
};

static inline CB_HOSTDEV uint32_t cb_pattern_key(uint64_t idx, uint32_t seed)
{
    return (uint32_t)((13u * (idx % CB_PATTERN_PERIOD) + 7u * (uint64_t)(seed % CB_PATTERN_PERIOD)) %
                      CB_PATTERN_PERIOD);
}

static inline CB_HOSTDEV float cb_pattern_value(int32_t rank, uint64_t idx, uint32_t seed)
{
    return (float)((cb_pattern_key(idx, seed) + 101u * ((uint32_t)rank % CB_PATTERN_PERIOD)) % CB_PATTERN_PERIOD);
}

static inline CB_HOSTDEV uint64_t cb_pattern_count(const struct cb_pattern *p)
{
    return p->seg_len * (uint64_t)p->nseg;
}

/* Expected value of element i of a buffer described by p. */
static inline CB_HOSTDEV float cb_pattern_at(const struct cb_pattern *p, uint64_t i)
{
    uint64_t seg = i / p->seg_len;
    uint64_t idx = p->base + (i - seg * p->seg_len);
    if (p->src == CB_SRC_SUM)
        return p->rank_sum[cb_pattern_key(idx, p->seed)];
    return cb_pattern_value(p->src == CB_SRC_SEGMENT ? (int32_t)seg : p->src, idx, p->seed);
}

/* Sets every field; the rank sums are only filled for src == CB_SRC_SUM. */
void cb_pattern_init(struct cb_pattern *p, uint64_t seg_len, int32_t nseg, int32_t src, uint64_t base, uint32_t seed,
                     int32_t nranks);

/* Host implementations (used by the cpu backend and for host memory by the GPU backends). */
void cb_pattern_fill_host(float *dst, const struct cb_pattern *p);
uint64_t cb_pattern_count_wrong_host(const float *buf, const struct cb_pattern *p);

#ifdef __cplusplus
}
#endif

#endif
