/* reduce_scatter: rank r receives the sum over ranks of chunk r. */
#include "plan.h"

static void plan(const struct cb_ctx *ctx, size_t requested_bytes, struct cb_plan *p)
{
    cb_plan_chunked(ctx, requested_bytes, ctx->nranks, 1, p);
}

static void data(const struct cb_ctx *ctx, const struct cb_plan *p, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *d)
{
    (void)inst;
    cb_data_send_expect(ctx, p, seed, d, p->recv_count, 1, CB_SRC_SUM, (uint64_t)ctx->rank * p->arg_count);
}

static int run(const struct cb_exec *e)
{
    return e->transport->reduce_scatter(e->state, e->plan->arg_count);
}

const struct cb_op cb_op_reduce_scatter = {
    .name = "reduce_scatter",
    .summary = "sum, scattered in chunks; bytes = send buffer per rank; busbw factor (n-1)/n",
    .needs = CB_CAP_REDUCE_SCATTER,
    .busbw = CB_BUSBW_N_MINUS_1_OVER_N,
    .plan = plan,
    .data = data,
    .run = run,
};
