#include "pattern.h"

#include <string.h>

void cb_pattern_init(struct cb_pattern *p, uint64_t seg_len, int32_t nseg, int32_t src, uint64_t base, uint32_t seed,
                     int32_t nranks)
{
    memset(p, 0, sizeof *p);
    p->seg_len = seg_len ? seg_len : 1;
    p->nseg = seg_len ? nseg : 0;
    p->src = src;
    p->base = base;
    p->seed = seed;
    p->nranks = nranks;
    if (src != CB_SRC_SUM)
        return;
    for (int32_t r = 0; r < nranks; r++)
        p->rank_key_sum += cb_pattern_rank_key(r);
}

void cb_pattern_fill_host(float *dst, const struct cb_pattern *p)
{
    uint64_t n = cb_pattern_count(p);
    for (uint64_t i = 0; i < n; i++)
        dst[i] = cb_pattern_at(p, i);
}

uint64_t cb_pattern_count_wrong_host(const float *buf, const struct cb_pattern *p)
{
    uint64_t n = cb_pattern_count(p), wrong = 0;
    for (uint64_t i = 0; i < n; i++)
        wrong += !(buf[i] == cb_pattern_at(p, i));
    return wrong;
}
