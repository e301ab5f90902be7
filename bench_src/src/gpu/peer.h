/* Transports over peer-mapped device memory (d2d, d2d-kernel): every rank maps every other
 * rank's buffers through IPC handles at attach time, then data is pushed into the peers' receive
 * buffers (or reductions pull from the peers' send buffers). Completion: the pusher waits for its
 * own work, then tells the peer by an empty MPI message (point-to-point) or all ranks meet in a
 * barrier (collectives) -- both inside the timed region. An engine says how bytes move. */
#ifndef COMMBENCH_GPU_PEER_H
#define COMMBENCH_GPU_PEER_H

#include "gpu.h"

/* One push per job j < njobs: peer p = (peer0 + j) % nranks receives count elements from
 * src + p * src_stride at offset dst_offset of its receive buffer. */
struct cb_push {
    int peer0, njobs;
    const float *src;
    uint64_t src_stride, dst_offset, count;
};

struct cb_peer_state;

struct cb_peer_engine {
    int (*init)(struct cb_peer_state *st); /* may be NULL */
    void (*fini)(struct cb_peer_state *st);
    /* Returns once this rank's pushes are complete. */
    int (*push)(struct cb_peer_state *st, const struct cb_push *push);
    /* recv[i] = sum over ranks p of p's send[offset + i], i < count; NULL: not offered. */
    int (*reduce)(struct cb_peer_state *st, uint64_t offset, uint64_t count);
};

struct cb_peer_state {
    const struct cb_ctx *ctx;
    const struct cb_peer_engine *engine;
    void *engine_data;
    int mapped;
    float *send, *recv;                     /* own buffers */
    float **peer_send, **peer_recv;         /* every rank's buffers in this address space */
    float **peer_send_dev, **peer_recv_dev; /* the same tables in device memory, for kernels */
};

int cb_peer_open(const struct cb_ctx *ctx, const struct cb_peer_engine *engine, void **state);
void cb_peer_close(void *state);
int cb_peer_attach(void *state, const struct cb_bufs *bufs);
void cb_peer_detach(void *state);
int cb_peer_send(void *state, int peer, size_t count);
int cb_peer_recv(void *state, int peer, size_t count);
int cb_peer_exchange(void *state, int to, int from, size_t count);
int cb_peer_allreduce(void *state, size_t count);
int cb_peer_alltoall(void *state, size_t count);
int cb_peer_allgather(void *state, size_t count);
int cb_peer_reduce_scatter(void *state, size_t count);
int cb_peer_bcast(void *state, size_t count, int root);

/* Table entry of a peer-mapped transport; the reductions exist when caps names them. */
#define CB_PEER_TRANSPORT(tname, tsummary, tcaps, topen)                                                               \
    {                                                                                                                  \
        .name = tname, .summary = tsummary, .backends = CB_ON_CUDA | CB_ON_HIP, .caps = tcaps, .not_built = NULL,      \
        .max_count = 0, .open = topen, .close = cb_peer_close, .attach = cb_peer_attach, .detach = cb_peer_detach,     \
        .send = cb_peer_send, .recv = cb_peer_recv, .exchange = cb_peer_exchange,                                      \
        .allreduce = (tcaps)&CB_CAP_ALLREDUCE ? cb_peer_allreduce : NULL, .alltoall = cb_peer_alltoall,                \
        .allgather = cb_peer_allgather,                                                                                \
        .reduce_scatter = (tcaps)&CB_CAP_REDUCE_SCATTER ? cb_peer_reduce_scatter : NULL, .bcast = cb_peer_bcast,       \
        .copy = NULL, .complete = NULL, .selections = NULL, .select = NULL, .refused = NULL,                           \
        .reported = NULL, .usable_caps = NULL,                                                                         \
    }

#endif
