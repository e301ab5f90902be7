/* allgather: every rank's chunk ends up at chunk index rank on every rank. */
#include "plan.h"

static void plan(const struct cb_ctx *ctx, size_t requested_bytes, struct cb_plan *p)
{
    cb_plan_chunked(ctx, requested_bytes, 1, ctx->nranks, p);
}

static void data(const struct cb_ctx *ctx, const struct cb_plan *p, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *d)
{
    (void)inst;
    cb_data_send_expect(ctx, p, seed, d, p->arg_count, ctx->nranks, CB_SRC_SEGMENT, 0);
}

static int run(const struct cb_exec *e)
{
    return e->transport->allgather(e->state, e->plan->arg_count);
}

const struct cb_op cb_op_allgather = {
    .name = "allgather",
    .summary = "gather every rank's chunk on every rank; bytes = receive buffer; busbw factor (n-1)/n",
    .needs = CB_CAP_ALLGATHER,
    .busbw = CB_BUSBW_N_MINUS_1_OVER_N,
    .plan = plan,
    .data = data,
    .run = run,
};
