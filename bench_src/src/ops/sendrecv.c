/* sendrecv: nccl-tests' sendrecv_perf -- a ring shift: every rank sends its buffer to rank + 1 and
 * receives rank - 1's at the same time (all pairs at once, unlike pingpong's one pair). */
#include "plan.h"

static int next(const struct cb_ctx *ctx)
{
    return (ctx->rank + 1) % ctx->nranks;
}

static int previous(const struct cb_ctx *ctx)
{
    return (ctx->rank + ctx->nranks - 1) % ctx->nranks;
}

static void data(const struct cb_ctx *ctx, const struct cb_plan *plan, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *d)
{
    (void)inst;
    cb_data_send_expect(ctx, plan, seed, d, plan->recv_count, 1, previous(ctx), 0);
}

static int run(const struct cb_exec *e)
{
    return e->transport->exchange(e->state, next(e->ctx), previous(e->ctx), e->plan->arg_count);
}

const struct cb_op cb_op_sendrecv = {
    .name = "sendrecv",
    .summary = "ring shift: every rank sends to rank+1 and receives from rank-1 at once (nccl-tests sendrecv); "
               "bytes = per-rank message; busbw factor 1",
    .needs = CB_CAP_P2P,
    .busbw = CB_BUSBW_ONE,
    .plan = cb_plan_whole,
    .data = data,
    .run = run,
};
