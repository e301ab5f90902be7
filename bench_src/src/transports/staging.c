/* staging: the baseline of seed 001 -- copy device data to pinned host bounce buffers, run the
 * MPI primitive on host memory, copy the result back. Store and forward, no pipelining. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mpi.h"

struct staging {
    const struct cb_ctx *ctx;
    struct cb_mpi_bufs host; /* pinned bounce buffers, driven by the mpi transport */
    void *send, *recv;       /* device buffers */
    size_t send_bytes, recv_bytes;
};

static int staging_open(const struct cb_ctx *ctx, void **state)
{
    struct staging *st = calloc(1, sizeof *st);
    if (!st) {
        cb_errorf("out of memory");
        return CB_ERROR;
    }
    st->ctx = ctx;
    st->host.comm = MPI_COMM_WORLD;
    *state = st;
    return CB_OK;
}

static void staging_close(void *state)
{
    free(state);
}

static void staging_detach(void *state)
{
    struct staging *st = state;
    const struct cb_backend *b = st->ctx->backend;
    if (st->host.send)
        b->release(CB_HOST_PINNED, st->host.send);
    if (st->host.recv)
        b->release(CB_HOST_PINNED, st->host.recv);
    st->host.send = st->host.recv = NULL;
}

static int staging_attach(void *state, const struct cb_bufs *bufs)
{
    struct staging *st = state;
    const struct cb_backend *b = st->ctx->backend;
    st->send = bufs->send;
    st->recv = bufs->recv;
    st->send_bytes = bufs->send_bytes;
    st->recv_bytes = bufs->recv_bytes;
    st->host.send = b->alloc(CB_HOST_PINNED, bufs->send_bytes);
    st->host.recv = st->host.send ? b->alloc(CB_HOST_PINNED, bufs->recv_bytes) : NULL;
    return st->host.recv ? CB_OK : CB_ERROR;
}

/* device send -> host, then the MPI step, then host recv -> device (either copy may be empty). */
static int staged(struct staging *st, size_t in, int (*step)(void *, size_t), size_t arg, size_t out)
{
    const struct cb_backend *b = st->ctx->backend;
    int rc = in ? b->copy(st->host.send, st->send, in * sizeof(float)) : CB_OK;
    if (!rc)
        rc = step(&st->host, arg);
    if (!rc && out)
        rc = b->copy(st->recv, st->host.recv, out * sizeof(float));
    return rc;
}

static int staging_send(void *state, int peer, size_t count)
{
    struct staging *st = state;
    const struct cb_backend *b = st->ctx->backend;
    int rc = b->copy(st->host.send, st->send, count * sizeof(float));
    return rc ? rc : cb_transport_mpi.send(&st->host, peer, count);
}

static int staging_recv(void *state, int peer, size_t count)
{
    struct staging *st = state;
    const struct cb_backend *b = st->ctx->backend;
    int rc = cb_transport_mpi.recv(&st->host, peer, count);
    return rc ? rc : b->copy(st->recv, st->host.recv, count * sizeof(float));
}

static int staging_exchange(void *state, int to, int from, size_t count)
{
    struct staging *st = state;
    const struct cb_backend *b = st->ctx->backend;
    int rc = b->copy(st->host.send, st->send, count * sizeof(float));
    if (!rc)
        rc = cb_transport_mpi.exchange(&st->host, to, from, count);
    return rc ? rc : b->copy(st->recv, st->host.recv, count * sizeof(float));
}

static int staging_allreduce(void *state, size_t count)
{
    return staged(state, count, cb_transport_mpi.allreduce, count, count);
}

static int staging_alltoall(void *state, size_t count)
{
    size_t n = (size_t)((struct staging *)state)->ctx->nranks;
    return staged(state, n * count, cb_transport_mpi.alltoall, count, n * count);
}

static int staging_allgather(void *state, size_t count)
{
    size_t n = (size_t)((struct staging *)state)->ctx->nranks;
    return staged(state, count, cb_transport_mpi.allgather, count, n * count);
}

static int staging_reduce_scatter(void *state, size_t count)
{
    size_t n = (size_t)((struct staging *)state)->ctx->nranks;
    return staged(state, n * count, cb_transport_mpi.reduce_scatter, count, count);
}

static int staging_bcast(void *state, size_t count, int root)
{
    struct staging *st = state;
    const struct cb_backend *b = st->ctx->backend;
    int is_root = st->ctx->rank == root;
    /* in place: the root's data lives in its receive buffer */
    int rc = is_root ? b->copy(st->host.recv, st->recv, count * sizeof(float)) : CB_OK;
    if (!rc)
        rc = cb_transport_mpi.bcast(&st->host, count, root);
    if (!rc && !is_root)
        rc = b->copy(st->recv, st->host.recv, count * sizeof(float));
    return rc;
}

const struct cb_transport cb_transport_staging = {
    .name = "staging",
    .summary = "device -> pinned host copy, MPI on host memory, host -> device copy (no pipelining)",
    .backends = CB_ON_CUDA | CB_ON_HIP,
    .caps = CB_CAP_P2P | CB_CAP_ALLREDUCE | CB_CAP_ALLTOALL | CB_CAP_ALLGATHER | CB_CAP_REDUCE_SCATTER | CB_CAP_BCAST,
    .max_count = INT_MAX, /* the mpi transport's primitives move the staged bytes */
    .open = staging_open,
    .close = staging_close,
    .attach = staging_attach,
    .detach = staging_detach,
    .send = staging_send,
    .recv = staging_recv,
    .exchange = staging_exchange,
    .allreduce = staging_allreduce,
    .alltoall = staging_alltoall,
    .allgather = staging_allgather,
    .reduce_scatter = staging_reduce_scatter,
    .bcast = staging_bcast,
};
