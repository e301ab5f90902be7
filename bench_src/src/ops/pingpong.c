/* pingpong: rank 0 sends to the peer, the peer sends back; time = round trip / 2.
 * pingpong_bi: rank 0 and the peer send to each other at the same time. */
#include "p2p.h"

static int uni_instances(const struct cb_ctx *ctx, struct cb_instance *out, int max)
{
    return cb_p2p_default_pair(ctx, CB_DIR_UNI, out, max);
}

static int bi_instances(const struct cb_ctx *ctx, struct cb_instance *out, int max)
{
    return cb_p2p_default_pair(ctx, CB_DIR_BI, out, max);
}

const struct cb_op cb_op_pingpong = {
    .name = "pingpong",
    .summary = "rank 0 <-> --peer ping-pong; latency = median one-way time (round trip / 2)",
    .needs = CB_CAP_P2P,
    .busbw = CB_BUSBW_ONE,
    .instances = uni_instances,
    .plan = cb_plan_whole,
    .data = cb_p2p_data,
    .run = cb_p2p_run,
};

const struct cb_op cb_op_pingpong_bi = {
    .name = "pingpong_bi",
    .summary = "rank 0 <-> --peer simultaneous exchange; goodput per direction, aggregate_gbs both",
    .needs = CB_CAP_P2P,
    .busbw = CB_BUSBW_ONE,
    .instances = bi_instances,
    .plan = cb_plan_whole,
    .data = cb_p2p_data,
    .run = cb_p2p_run,
};
