/* bcast: rank 0's buffer to every rank, in place in the receive buffer. */
#include <string.h>

#include "plan.h"

#define ROOT 0

static void data(const struct cb_ctx *ctx, const struct cb_plan *p, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *d)
{
    (void)inst;
    memset(d, 0, sizeof *d);
    d->fill_recv = ctx->rank == ROOT;
    cb_pattern_init(&d->recv_input, p->recv_count, 1, ROOT, 0, seed, ctx->nranks);
    d->check = 1;
    cb_pattern_init(&d->expect, p->recv_count, 1, ROOT, 0, seed, ctx->nranks);
}

static int run(const struct cb_exec *e)
{
    return e->transport->bcast(e->state, e->plan->arg_count, ROOT);
}

const struct cb_op cb_op_bcast = {
    .name = "bcast",
    .summary = "rank 0's buffer to every rank (in place); busbw factor 1",
    .needs = CB_CAP_BCAST,
    .busbw = CB_BUSBW_ONE,
    .plan = cb_plan_whole,
    .data = data,
    .run = run,
};
