/* mpi: MPI point-to-point and collectives on the benchmark buffers (host memory on the cpu
 * backend, device memory on GPU backends when the MPI library is GPU-aware). */
#include "mpi.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

#include "../args.h"
#include "../comm.h"

#define CB_TAG_DATA 0x7cb0

static int fits(size_t count)
{
    if (count <= INT_MAX)
        return 1;
    cb_errorf("%zu elements exceed MPI's int count", count);
    return 0;
}

/* The mpi transport's own state: the buffers first (the primitives see a struct cb_mpi_bufs),
 * then why collectives cannot run on these buffers ("" when they can). */
struct mpi_state {
    struct cb_mpi_bufs bufs;
    char no_collectives[CB_TEXT_MAX];
};

/* 1: GPU-aware, 0: not, -1: this MPI cannot tell. */
static int gpu_aware(unsigned backend)
{
    if (backend == CB_ON_CUDA) {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
        return MPIX_Query_cuda_support() ? 1 : 0;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
        int ok = 0;
        return MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &ok) == MPI_SUCCESS ? ok != 0 : -1;
#endif
    }
    if (backend == CB_ON_HIP) {
#if defined(OMPI_HAVE_MPI_EXT_ROCM) && OMPI_HAVE_MPI_EXT_ROCM
        return MPIX_Query_rocm_support() ? 1 : 0;
#elif defined(MPIX_GPU_SUPPORT_HIP)
        int ok = 0;
        return MPIX_GPU_query_support(MPIX_GPU_SUPPORT_HIP, &ok) == MPI_SUCCESS ? ok != 0 : -1;
#endif
    }
    return -1;
}

static int mpi_open(const struct cb_ctx *ctx, void **state)
{
    unsigned backend = cb_backend_bit();
    int aware = backend == CB_ON_CPU ? 1 : gpu_aware(backend);
    if (!ctx->args->assume_gpu_aware_mpi) {
        if (aware == 0) {
            cb_errorf("the MPI library is not GPU-aware for %s memory (its own query says so); "
                      "use transport staging for host-staged MPI",
                      ctx->backend->name);
            return CB_UNSUPPORTED;
        }
        if (aware < 0) {
            cb_errorf("this MPI library cannot report whether it is GPU-aware for %s memory; pass "
                      "--assume-gpu-aware-mpi if it is",
                      ctx->backend->name);
            return CB_UNSUPPORTED;
        }
    }
    struct mpi_state *s = calloc(1, sizeof *s);
    if (!s) {
        cb_errorf("out of memory");
        return CB_ERROR;
    }
    /* The assumption covers what moves the bytes (e.g. a CUDA-built UCX under Open MPI's pml ucx);
     * a library that says it is not built for GPU memory still copies and reduces collective
     * buffers itself, on the host, which crashes on device pointers. */
    if (aware == 0)
        snprintf(s->no_collectives, sizeof s->no_collectives,
                 "the MPI library's own query says it is not GPU-aware for %s memory (Open MPI: not built "
                 "with it), so its collectives copy and reduce on the host and would crash on device "
                 "buffers; --assume-gpu-aware-mpi covers point-to-point only (e.g. a GPU-built UCX under "
                 "Open MPI's pml ucx moves device memory)",
                 ctx->backend->name);
    s->bufs.comm = MPI_COMM_WORLD;
    *state = s;
    return CB_OK;
}

static unsigned mpi_usable_caps(void *state, char *why, size_t len)
{
    const struct mpi_state *s = state;
    if (!s->no_collectives[0])
        return cb_transport_mpi.caps;
    snprintf(why, len, "%s", s->no_collectives);
    return CB_CAP_P2P;
}

static void mpi_close(void *state)
{
    cb_mpi_select(state, NULL, NULL);
    free(state);
}

static int mpi_attach(void *state, const struct cb_bufs *bufs)
{
    struct cb_mpi_bufs *b = state;
    b->send = bufs->send;
    b->recv = bufs->recv;
    return CB_OK;
}

static void mpi_detach(void *state)
{
    struct cb_mpi_bufs *b = state;
    b->send = b->recv = NULL;
}

static int mpi_send(void *state, int peer, size_t count)
{
    struct cb_mpi_bufs *b = state;
    if (!fits(count))
        return CB_ERROR;
    return cb_mpi_check(MPI_Send(b->send, (int)count, MPI_FLOAT, peer, CB_TAG_DATA, b->comm), "MPI_Send");
}

static int mpi_recv(void *state, int peer, size_t count)
{
    struct cb_mpi_bufs *b = state;
    if (!fits(count))
        return CB_ERROR;
    return cb_mpi_check(MPI_Recv(b->recv, (int)count, MPI_FLOAT, peer, CB_TAG_DATA, b->comm, MPI_STATUS_IGNORE),
                        "MPI_Recv");
}

static int mpi_exchange(void *state, int to, int from, size_t count)
{
    struct cb_mpi_bufs *b = state;
    if (!fits(count))
        return CB_ERROR;
    return cb_mpi_check(MPI_Sendrecv(b->send, (int)count, MPI_FLOAT, to, CB_TAG_DATA, b->recv, (int)count, MPI_FLOAT,
                                     from, CB_TAG_DATA, b->comm, MPI_STATUS_IGNORE),
                        "MPI_Sendrecv");
}

static int mpi_allreduce(void *state, size_t count)
{
    struct cb_mpi_bufs *b = state;
    if (!fits(count))
        return CB_ERROR;
    return cb_mpi_check(MPI_Allreduce(b->send, b->recv, (int)count, MPI_FLOAT, MPI_SUM, b->comm),
                        "MPI_Allreduce");
}

static int mpi_alltoall(void *state, size_t count)
{
    struct cb_mpi_bufs *b = state;
    if (!fits(count))
        return CB_ERROR;
    return cb_mpi_check(MPI_Alltoall(b->send, (int)count, MPI_FLOAT, b->recv, (int)count, MPI_FLOAT, b->comm),
                        "MPI_Alltoall");
}

static int mpi_allgather(void *state, size_t count)
{
    struct cb_mpi_bufs *b = state;
    if (!fits(count))
        return CB_ERROR;
    return cb_mpi_check(MPI_Allgather(b->send, (int)count, MPI_FLOAT, b->recv, (int)count, MPI_FLOAT, b->comm),
                        "MPI_Allgather");
}

static int mpi_reduce_scatter(void *state, size_t count)
{
    struct cb_mpi_bufs *b = state;
    if (!fits(count))
        return CB_ERROR;
    return cb_mpi_check(MPI_Reduce_scatter_block(b->send, b->recv, (int)count, MPI_FLOAT, MPI_SUM, b->comm),
                        "MPI_Reduce_scatter_block");
}

static int mpi_bcast(void *state, size_t count, int root)
{
    struct cb_mpi_bufs *b = state;
    if (!fits(count))
        return CB_ERROR;
    return cb_mpi_check(MPI_Bcast(b->recv, (int)count, MPI_FLOAT, root, b->comm), "MPI_Bcast");
}

const struct cb_transport cb_transport_mpi = {
    .name = "mpi",
    .summary = "MPI point-to-point and collectives on the benchmark buffers (GPU-aware MPI on GPU backends)",
    .backends = CB_ON_CPU | CB_ON_CUDA | CB_ON_HIP,
    .caps = CB_CAP_P2P | CB_CAP_ALLREDUCE | CB_CAP_ALLTOALL | CB_CAP_ALLGATHER | CB_CAP_REDUCE_SCATTER | CB_CAP_BCAST,
    .max_count = INT_MAX, /* MPI counts are ints (MPI 4's _c variants are not used) */
    .open = mpi_open,
    .close = mpi_close,
    .attach = mpi_attach,
    .detach = mpi_detach,
    .send = mpi_send,
    .recv = mpi_recv,
    .exchange = mpi_exchange,
    .allreduce = mpi_allreduce,
    .alltoall = mpi_alltoall,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .bcast = mpi_bcast,
    .selections = cb_mpi_selections,
    .select = cb_mpi_select,
    .reported = cb_mpi_reported,
    .usable_caps = mpi_usable_caps,
};
