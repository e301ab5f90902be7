/* Validation data shared by host and device code.
 *
 * Element idx of rank r's input holds value(r, idx, seed) = key(idx, seed) + rank_key(r): key is a
 * hash of idx and seed into [0, 128), rank_key a hash of the rank into [0, 128). Values are small
 * integers (at most 254), so sums over up to 66,000 ranks stay exact in float32 in any order
 * (254 x 66,052 < 2^24). Hashes, because linear terms let errors through: with the former
 * (13 idx + 7 seed + 101 r) mod 251, a chunk misplaced by 251 elements, or rank r + 251's data in
 * rank r's place, passed. Now data misplaced by any offset differs in about 127 of 128 elements, and
 * data from the wrong rank in every element unless the two ranks' keys coincide: never within one
 * aligned block of 128 ranks, for about 1 pair in 128 across blocks (not ranks 0 and 251). The sum over
 * ranks, nranks x key + the sum of rank_key, differs wherever key does for every rank count, so a
 * permuted allreduce result fails too. A cb_pattern describes a whole buffer as segments of seg_len
 * elements; segment s holds source rank src(s)'s values from index base on, or the sum over all
 * ranks. Received buffers are pre-filled with 0xff bytes (a NaN) so untouched elements never
 * compare equal. */
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

#define CB_PATTERN_KEYS 128u /* key and rank_key lie in [0, CB_PATTERN_KEYS) */
#define CB_SRC_SEGMENT (-1)  /* segment s holds rank s's values */
#define CB_SRC_SUM (-2)      /* every element is the sum over all ranks */

struct cb_pattern {
    uint64_t seg_len; /* elements per segment */
    int32_t nseg;     /* number of segments */
    int32_t src;      /* >= 0: that rank; CB_SRC_SEGMENT or CB_SRC_SUM */
    uint64_t base;    /* index in the source rank's input of a segment's first element */
    uint32_t seed;
    int32_t nranks;
    uint64_t rank_key_sum; /* CB_SRC_SUM: sum over ranks of rank_key (cb_pattern_init fills it) */
};

/* A bijective 32-bit mixer (Chris Wellons' lowbias32): every input bit flips about half the output bits. */
static inline CB_HOSTDEV uint32_t cb_pattern_mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static inline CB_HOSTDEV uint32_t cb_pattern_key(uint64_t idx, uint32_t seed)
{
    uint32_t high = cb_pattern_mix((uint32_t)(idx >> 32) + seed * 0x9e3779b9u);
    return cb_pattern_mix((uint32_t)idx ^ high) % CB_PATTERN_KEYS;
}

/* A bijection of the rank's 7 low bits (odd multipliers and xor-shifts: not linear), xor'ed with a
 * hash of its block of 128 ranks: the ranks of one block never share a key. */
static inline CB_HOSTDEV uint32_t cb_pattern_rank_key(int32_t rank)
{
    uint32_t r = (uint32_t)rank, low = r % CB_PATTERN_KEYS;
    low = (low * 0x5bu) % CB_PATTERN_KEYS;
    low ^= low >> 3;
    low = (low * 0x2du) % CB_PATTERN_KEYS;
    low ^= low >> 4;
    return low ^ (cb_pattern_mix(r / CB_PATTERN_KEYS) % CB_PATTERN_KEYS);
}

static inline CB_HOSTDEV float cb_pattern_value(int32_t rank, uint64_t idx, uint32_t seed)
{
    return (float)(cb_pattern_key(idx, seed) + cb_pattern_rank_key(rank));
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
    if (p->src == CB_SRC_SUM) /* an integer below 2^24: exact in float32 */
        return (float)((uint64_t)p->nranks * cb_pattern_key(idx, p->seed) + p->rank_key_sum);
    return cb_pattern_value(p->src == CB_SRC_SEGMENT ? (int32_t)seg : p->src, idx, p->seed);
}

/* Sets every field; rank_key_sum is only filled for src == CB_SRC_SUM. */
void cb_pattern_init(struct cb_pattern *p, uint64_t seg_len, int32_t nseg, int32_t src, uint64_t base, uint32_t seed,
                     int32_t nranks);

/* Host implementations (used by the cpu backend and for host memory by the GPU backends). */
void cb_pattern_fill_host(float *dst, const struct cb_pattern *p);
uint64_t cb_pattern_count_wrong_host(const float *buf, const struct cb_pattern *p);

#ifdef __cplusplus
}
#endif

#endif
