/* pairmatrix: every pair of ranks on one node, one after the other, uni (ping-pong) and bi. */
#include "p2p.h"

static int instances(const struct cb_ctx *ctx, struct cb_instance *out, int max)
{
    int n = 0;
    for (int a = 0; a < ctx->nranks; a++)
        for (int b = a + 1; b < ctx->nranks; b++) {
            if (ctx->node_of[a] != ctx->node_of[b])
                continue;
            for (int d = 0; d < 2; d++, n++)
                if (out && n < max)
                    out[n] = (struct cb_instance){.src = a,
                                                  .dst = b,
                                                  .dir = d ? CB_DIR_BI : CB_DIR_UNI,
                                                  .send_space = CB_DEVICE,
                                                  .recv_space = CB_DEVICE,
                                                  .host_memory = -1};
        }
    if (!n)
        cb_errorf("no two ranks share a node");
    return n;
}

const struct cb_op cb_op_pairmatrix = {
    .name = "pairmatrix",
    .summary = "every rank pair within a node: ping-pong (uni) and simultaneous exchange (bi)",
    .needs = CB_CAP_P2P,
    .busbw = CB_BUSBW_ONE,
    .instances = instances,
    .plan = cb_plan_whole,
    .data = cb_p2p_data,
    .run = cb_p2p_run,
};
