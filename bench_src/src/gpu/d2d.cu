/* d2d: copy engine (cudaMemcpyAsync / hipMemcpyAsync) into peers' IPC-mapped buffers, one stream
 * per destination so copies to different peers run concurrently. */
#include <stdlib.h>

#include "peer.h"

static int ce_init(struct cb_peer_state *st)
{
    int n = st->ctx->nranks;
    gpu_stream *streams = (gpu_stream *)calloc((size_t)n, sizeof *streams);
    if (!streams) {
        cb_errorf("out of memory");
        return CB_ERROR;
    }
    st->engine_data = streams;
    for (int p = 0; p < n; p++)
        if (cb_gpu_ok(GPU(StreamCreateWithFlags)(&streams[p], GPU(StreamNonBlocking)), "creating a copy stream"))
            return CB_ERROR;
    return CB_OK;
}

static void ce_fini(struct cb_peer_state *st)
{
    gpu_stream *streams = (gpu_stream *)st->engine_data;
    for (int p = 0; streams && p < st->ctx->nranks; p++)
        if (streams[p])
            GPU(StreamDestroy)(streams[p]);
    free(streams);
}

static int ce_push(struct cb_peer_state *st, const struct cb_push *push)
{
    gpu_stream *streams = (gpu_stream *)st->engine_data;
    int n = st->ctx->nranks, rc = CB_OK;
    for (int j = 0; !rc && j < push->njobs; j++) {
        int p = (push->peer0 + j) % n;
        rc = cb_gpu_ok(GPU(MemcpyAsync)(st->peer_recv[p] + push->dst_offset, push->src + p * push->src_stride,
                                        push->count * sizeof(float), GPU(MemcpyDefault), streams[p]),
                       "peer copy");
    }
    for (int j = 0; j < push->njobs; j++) {
        int sync = cb_gpu_sync(streams[(push->peer0 + j) % n]);
        rc = rc ? rc : sync;
    }
    return rc;
}

#if CB_HOST_PASS
static const struct cb_peer_engine copy_engine = {ce_init, ce_fini, ce_push, NULL};

static int d2d_open(const struct cb_ctx *ctx, void **state)
{
    return cb_peer_open(ctx, &copy_engine, state);
}

const struct cb_transport cb_transport_d2d =
    CB_PEER_TRANSPORT("d2d", "copy-engine copies into peers' IPC-mapped buffers (one node); no reductions",
                      CB_CAP_P2P | CB_CAP_ALLTOALL | CB_CAP_ALLGATHER | CB_CAP_BCAST, d2d_open);
#endif
