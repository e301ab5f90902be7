#include "peer.h"

#include <stdlib.h>
#include <string.h>

int cb_peer_open(const struct cb_ctx *ctx, const struct cb_peer_engine *engine, void **state)
{
    if (ctx->nnodes != 1) {
        cb_errorf("peer-mapped transports need every rank on one node (this job spans %d nodes)", ctx->nnodes);
        return CB_UNSUPPORTED;
    }
    struct cb_peer_state *st = (struct cb_peer_state *)calloc(1, sizeof *st);
    size_t n = (size_t)ctx->nranks;
    if (st) {
        st->peer_send = (float **)calloc(n, sizeof(float *));
        st->peer_recv = (float **)calloc(n, sizeof(float *));
    }
    if (!st || !st->peer_send || !st->peer_recv) {
        cb_errorf("out of memory");
        cb_peer_close(st);
        return CB_ERROR;
    }
    st->ctx = ctx;
    st->engine = engine;
    if (cb_gpu_ok(GPU(Malloc)((void **)&st->peer_send_dev, n * sizeof(float *)), "peer table") ||
        cb_gpu_ok(GPU(Malloc)((void **)&st->peer_recv_dev, n * sizeof(float *)), "peer table") ||
        (engine->init && engine->init(st))) {
        cb_peer_close(st);
        return CB_ERROR;
    }
    *state = st;
    return CB_OK;
}

void cb_peer_close(void *state)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    if (!st)
        return;
    if (st->engine && st->engine->fini)
        st->engine->fini(st);
    GPU(Free)(st->peer_send_dev);
    GPU(Free)(st->peer_recv_dev);
    free(st->peer_send);
    free(st->peer_recv);
    free(st);
}

struct handles {
    GPU(IpcMemHandle_t) send, recv;
};

static void unmap(struct cb_peer_state *st)
{
    for (int r = 0; r < st->ctx->nranks; r++) {
        if (r == st->ctx->rank)
            continue;
        if (st->peer_send[r])
            GPU(IpcCloseMemHandle)(st->peer_send[r]);
        if (st->peer_recv[r])
            GPU(IpcCloseMemHandle)(st->peer_recv[r]);
        st->peer_send[r] = st->peer_recv[r] = NULL;
    }
}

int cb_peer_attach(void *state, const struct cb_bufs *bufs)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    const struct cb_ctx *ctx = st->ctx;
    if (bufs->send_space != CB_DEVICE || bufs->recv_space != CB_DEVICE) {
        cb_errorf("peer-mapped transports need device buffers");
        return CB_ERROR;
    }
    st->send = (float *)bufs->send;
    st->recv = (float *)bufs->recv;
    struct handles mine, *all = (struct handles *)calloc((size_t)ctx->nranks, sizeof *all);
    if (!all)
        abort(); /* a few bytes per rank: nothing sensible is left to do */
    memset(&mine, 0, sizeof mine);
    int rc = cb_gpu_ok(GPU(IpcGetMemHandle)(&mine.send, st->send), "IPC handle of the send buffer");
    if (!rc)
        rc = cb_gpu_ok(GPU(IpcGetMemHandle)(&mine.recv, st->recv), "IPC handle of the receive buffer");
    /* Every rank takes part in the exchange, even after a local failure, so nobody waits forever. */
    int exchanged = cb_allgather(&mine, all, sizeof mine);
    rc = rc ? rc : exchanged;
    for (int r = 0; !rc && r < ctx->nranks; r++) {
        if (r == ctx->rank) {
            st->peer_send[r] = st->send;
            st->peer_recv[r] = st->recv;
            continue;
        }
        rc = cb_gpu_ok(GPU(IpcOpenMemHandle)((void **)&st->peer_send[r], all[r].send, GPU(IpcMemLazyEnablePeerAccess)),
                       "opening a peer's send buffer (IPC)");
        if (!rc)
            rc = cb_gpu_ok(
                GPU(IpcOpenMemHandle)((void **)&st->peer_recv[r], all[r].recv, GPU(IpcMemLazyEnablePeerAccess)),
                "opening a peer's receive buffer (IPC)");
    }
    free(all);
    /* On the backend's stream, where the kernels that read the tables run: a blocking copy goes through the
     * legacy default stream, which a cudaStreamNonBlocking stream does not wait for, so a kernel still
     * running from before (or queued after) could see a half-written table. Then wait for the copies: the
     * host tables are pageable, and the next kernel must find them in place. */
    size_t table = (size_t)ctx->nranks * sizeof(float *);
    gpu_stream stream = cb_gpu_stream();
    if (!rc)
        rc = cb_gpu_ok(GPU(MemcpyAsync)(st->peer_send_dev, st->peer_send, table, GPU(MemcpyHostToDevice), stream),
                       "peer table");
    if (!rc)
        rc = cb_gpu_ok(GPU(MemcpyAsync)(st->peer_recv_dev, st->peer_recv, table, GPU(MemcpyHostToDevice), stream),
                       "peer table");
    if (!rc)
        rc = cb_gpu_sync(stream);
    if (rc)
        unmap(st);
    st->mapped = !rc;
    return rc;
}

void cb_peer_detach(void *state)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    unmap(st);
    st->mapped = 0;
    /* Nobody frees a buffer a peer still has mapped. */
    cb_barrier();
}

/* This rank's pushes, complete on return. The peers are told afterwards (a notification or a
 * barrier), even after a failure: they are waiting for it. */
static int pushed(struct cb_peer_state *st, const struct cb_push *push)
{
    return push->njobs > 0 && push->count > 0 ? st->engine->push(st, push) : CB_OK;
}

static int first_failure(int rc, int later_rc)
{
    return rc ? rc : later_rc;
}

static int push_then_barrier(struct cb_peer_state *st, const struct cb_push *push)
{
    int rc = pushed(st, push);
    return first_failure(rc, cb_barrier());
}

static struct cb_push to_peer(const float *src, int peer, size_t count)
{
    struct cb_push p = {peer, 1, src, 0, 0, count};
    return p;
}

int cb_peer_send(void *state, int peer, size_t count)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    struct cb_push p = to_peer(st->send, peer, count);
    int rc = pushed(st, &p);
    return first_failure(rc, cb_notify_send(peer));
}

int cb_peer_recv(void *state, int peer, size_t count)
{
    (void)state;
    (void)count;
    return cb_notify_recv(peer);
}

int cb_peer_exchange(void *state, int to, int from, size_t count)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    struct cb_push p = to_peer(st->send, to, count);
    int rc = pushed(st, &p);
    return first_failure(rc, cb_notify_exchange(to, from));
}

int cb_peer_alltoall(void *state, size_t count)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    int rank = st->ctx->rank;
    struct cb_push p = {rank, st->ctx->nranks, st->send, count, (uint64_t)rank * count, count};
    return push_then_barrier(st, &p);
}

int cb_peer_allgather(void *state, size_t count)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    int rank = st->ctx->rank;
    struct cb_push p = {rank, st->ctx->nranks, st->send, 0, (uint64_t)rank * count, count};
    return push_then_barrier(st, &p);
}

int cb_peer_bcast(void *state, size_t count, int root)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    int n = st->ctx->nranks;
    struct cb_push p = {(root + 1) % n, st->ctx->rank == root ? n - 1 : 0, st->recv, 0, 0, count};
    return push_then_barrier(st, &p);
}

static int reduce_then_barrier(struct cb_peer_state *st, uint64_t offset, size_t count)
{
    int rc = count ? st->engine->reduce(st, offset, count) : CB_OK;
    return first_failure(rc, cb_barrier());
}

int cb_peer_allreduce(void *state, size_t count)
{
    return reduce_then_barrier((struct cb_peer_state *)state, 0, count);
}

int cb_peer_reduce_scatter(void *state, size_t count)
{
    struct cb_peer_state *st = (struct cb_peer_state *)state;
    return reduce_then_barrier(st, (uint64_t)st->ctx->rank * count, count);
}
