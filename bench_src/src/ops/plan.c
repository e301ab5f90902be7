#include "plan.h"

#include <string.h>

void cb_plan_whole(const struct cb_ctx *ctx, size_t requested_bytes, struct cb_plan *plan)
{
    (void)ctx;
    size_t count = requested_bytes / sizeof(float);
    *plan = (struct cb_plan){.requested_bytes = requested_bytes,
                             .bytes = count * sizeof(float),
                             .arg_count = count,
                             .send_count = count,
                             .recv_count = count};
}

void cb_plan_chunked(const struct cb_ctx *ctx, size_t requested_bytes, int send_chunks, int recv_chunks,
                     struct cb_plan *plan)
{
    size_t n = (size_t)ctx->nranks;
    size_t chunk = requested_bytes / sizeof(float) / n;
    *plan = (struct cb_plan){.requested_bytes = requested_bytes,
                             .bytes = chunk * n * sizeof(float),
                             .arg_count = chunk,
                             .send_count = chunk * (size_t)send_chunks,
                             .recv_count = chunk * (size_t)recv_chunks};
}

void cb_data_send_expect(const struct cb_ctx *ctx, const struct cb_plan *plan, uint32_t seed, struct cb_data *data,
                         uint64_t seg_len, int nseg, int src, uint64_t base)
{
    memset(data, 0, sizeof *data);
    data->fill_send = 1;
    cb_pattern_init(&data->send_input, plan->send_count, 1, ctx->rank, 0, seed, ctx->nranks);
    data->check = 1;
    cb_pattern_init(&data->expect, seg_len, nseg, src, base, seed, ctx->nranks);
}
