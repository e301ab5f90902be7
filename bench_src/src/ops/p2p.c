#include "p2p.h"

#include <string.h>

#include "../args.h"

int cb_p2p_default_pair(const struct cb_ctx *ctx, enum cb_direction dir, struct cb_instance *out, int max)
{
    if (ctx->nranks < 2) {
        cb_errorf("needs at least 2 ranks");
        return 0;
    }
    if (out && max >= 1) {
        out[0] = (struct cb_instance){.src = 0,
                                      .dst = ctx->args->peer > 0 ? ctx->args->peer : ctx->nranks - 1,
                                      .dir = dir,
                                      .send_space = CB_DEVICE,
                                      .recv_space = CB_DEVICE,
                                      .host_memory = -1};
    }
    return 1;
}

void cb_p2p_data(const struct cb_ctx *ctx, const struct cb_plan *plan, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *data)
{
    memset(data, 0, sizeof *data);
    if (ctx->rank == inst->src || ctx->rank == inst->dst)
        cb_data_send_expect(ctx, plan, seed, data, plan->recv_count, 1, ctx->rank == inst->src ? inst->dst : inst->src,
                            0);
}

int cb_p2p_run(const struct cb_exec *e)
{
    const struct cb_transport *t = e->transport;
    int rank = e->ctx->rank, src = e->inst->src, dst = e->inst->dst;
    size_t n = e->plan->arg_count;
    if (rank != src && rank != dst)
        return CB_OK;
    int other = rank == src ? dst : src;
    if (e->inst->dir == CB_DIR_BI)
        return t->exchange(e->state, other, other, n);
    if (rank == src) {
        int rc = t->send(e->state, dst, n);
        return rc ? rc : t->recv(e->state, dst, n);
    }
    int rc = t->recv(e->state, src, n);
    return rc ? rc : t->send(e->state, src, n);
}
