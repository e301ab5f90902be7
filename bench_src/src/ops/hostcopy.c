/* h2d, d2h: copies between host memory (pinned and pageable) and this rank's device. Every rank
 * copies at the same time (each to its own GPU); the recorded time is the slowest rank's. */
#include "plan.h"

static int instances(int host_is_source, struct cb_instance *out, int max)
{
    static const enum cb_space kinds[2] = {CB_HOST_PINNED, CB_HOST_PAGEABLE};
    for (int i = 0; out && i < 2 && i < max; i++)
        out[i] = (struct cb_instance){.src = -1,
                                      .dst = -1,
                                      .dir = CB_DIR_NONE,
                                      .send_space = host_is_source ? kinds[i] : CB_DEVICE,
                                      .recv_space = host_is_source ? CB_DEVICE : kinds[i],
                                      .host_memory = (int)kinds[i]};
    return 2;
}

static int h2d_instances(const struct cb_ctx *ctx, struct cb_instance *out, int max)
{
    (void)ctx;
    return instances(1, out, max);
}

static int d2h_instances(const struct cb_ctx *ctx, struct cb_instance *out, int max)
{
    (void)ctx;
    return instances(0, out, max);
}

static void data(const struct cb_ctx *ctx, const struct cb_plan *p, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *d)
{
    (void)inst;
    cb_data_send_expect(ctx, p, seed, d, p->recv_count, 1, ctx->rank, 0);
}

static int run(const struct cb_exec *e)
{
    return e->transport->copy(e->state, e->plan->arg_count);
}

const struct cb_op cb_op_h2d = {
    .name = "h2d",
    .summary = "host -> own device copy, pinned and pageable host memory (all ranks at once)",
    .needs = CB_CAP_COPY,
    .busbw = CB_BUSBW_ONE,
    .instances = h2d_instances,
    .plan = cb_plan_whole,
    .data = data,
    .run = run,
};

const struct cb_op cb_op_d2h = {
    .name = "d2h",
    .summary = "own device -> host copy, pinned and pageable host memory (all ranks at once)",
    .needs = CB_CAP_COPY,
    .busbw = CB_BUSBW_ONE,
    .instances = d2h_instances,
    .plan = cb_plan_whole,
    .data = data,
    .run = run,
};
