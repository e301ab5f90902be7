/* allreduce: float32 sum over all ranks, out of place. */
#include "plan.h"

static void data(const struct cb_ctx *ctx, const struct cb_plan *plan, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *d)
{
    (void)inst;
    cb_data_send_expect(ctx, plan, seed, d, plan->recv_count, 1, CB_SRC_SUM, 0);
}

static int run(const struct cb_exec *e)
{
    return e->transport->allreduce(e->state, e->plan->arg_count);
}

const struct cb_op cb_op_allreduce = {
    .name = "allreduce",
    .summary = "sum of every rank's buffer on every rank; busbw factor 2(n-1)/n",
    .needs = CB_CAP_ALLREDUCE,
    .busbw = CB_BUSBW_ALLREDUCE,
    .plan = cb_plan_whole,
    .data = data,
    .run = run,
};
