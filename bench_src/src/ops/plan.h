/* Message size conventions shared by the ops (nccl-tests): float32 elements, sizes rounded down. */
#ifndef COMMBENCH_OPS_PLAN_H
#define COMMBENCH_OPS_PLAN_H

#include "../commbench.h"

/* The whole buffer is the message: count = bytes / 4 (pingpong, allreduce, bcast, h2d). */
void cb_plan_whole(const struct cb_ctx *ctx, size_t requested_bytes, struct cb_plan *plan);
/* bytes is the total over nranks chunks of (requested / 4) / nranks elements; the primitive
 * gets the chunk; send and receive buffers span send_chunks and recv_chunks chunks. */
void cb_plan_chunked(const struct cb_ctx *ctx, size_t requested_bytes, int send_chunks, int recv_chunks,
                     struct cb_plan *plan);

/* The common data layout: the send buffer holds this rank's values, and afterwards the receive
 * buffer must hold nseg segments of seg_len elements from src starting at base (see pattern.h). */
void cb_data_send_expect(const struct cb_ctx *ctx, const struct cb_plan *plan, uint32_t seed, struct cb_data *data,
                         uint64_t seg_len, int nseg, int src, uint64_t base);

#endif
