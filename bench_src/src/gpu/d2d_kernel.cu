/* d2d-kernel: load/store kernels on peer-mapped buffers (seed 002's "implicit" transfers):
 * pushes store into the peers' receive buffers, reductions load every peer's send buffer
 * (one-shot: each rank reads all inputs and sums in rank order, so every rank gets the same bits). */
#include "peer.h"

static const unsigned kThreads = 256;
static const unsigned kMaxBlocks = 1024;

static __device__ bool aligned16(const void *a, const void *b)
{
    return (((uintptr_t)a | (uintptr_t)b) & 15u) == 0;
}

/* blockIdx.y = job; the x dimension strides over the elements (float4 when aligned). */
__global__ void push_kernel(float *const *peer_recv, const float *src, uint64_t src_stride, uint64_t dst_offset,
                            uint64_t count, int peer0, int nranks)
{
    int p = (peer0 + (int)blockIdx.y) % nranks;
    float *dst = peer_recv[p] + dst_offset;
    const float *from = src + p * src_stride;
    uint64_t start = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x, step = (uint64_t)gridDim.x * blockDim.x;
    uint64_t vectors = aligned16(dst, from) ? count / 4 : 0;
    for (uint64_t i = start; i < vectors; i += step)
        reinterpret_cast<float4 *>(dst)[i] = reinterpret_cast<const float4 *>(from)[i];
    for (uint64_t i = vectors * 4 + start; i < count; i += step)
        dst[i] = from[i];
}

__global__ void reduce_kernel(float *dst, const float *const *peer_send, uint64_t offset, uint64_t count, int nranks)
{
    uint64_t start = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x, step = (uint64_t)gridDim.x * blockDim.x;
    bool vector = aligned16(dst, peer_send[0] + offset);
    for (int p = 1; p < nranks; p++)
        vector = vector && aligned16(dst, peer_send[p] + offset);
    uint64_t vectors = vector ? count / 4 : 0;
    for (uint64_t i = start; i < vectors; i += step) {
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int p = 0; p < nranks; p++) {
            float4 v = reinterpret_cast<const float4 *>(peer_send[p] + offset)[i];
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
        }
        reinterpret_cast<float4 *>(dst)[i] = sum;
    }
    for (uint64_t i = vectors * 4 + start; i < count; i += step) {
        float sum = 0.f;
        for (int p = 0; p < nranks; p++)
            sum += peer_send[p][offset + i];
        dst[i] = sum;
    }
}

static int launched(const char *what)
{
    if (cb_gpu_ok(GPU(GetLastError)(), what))
        return CB_ERROR;
    return cb_gpu_sync(cb_gpu_stream());
}

static int kernel_push(struct cb_peer_state *st, const struct cb_push *push)
{
    dim3 grid(cb_gpu_blocks((push->count + 3) / 4, kThreads, kMaxBlocks), (unsigned)push->njobs);
    push_kernel<<<grid, kThreads, 0, cb_gpu_stream()>>>(st->peer_recv_dev, push->src, push->src_stride,
                                                        push->dst_offset, push->count, push->peer0, st->ctx->nranks);
    return launched("push kernel");
}

static int kernel_reduce(struct cb_peer_state *st, uint64_t offset, uint64_t count)
{
    reduce_kernel<<<cb_gpu_blocks((count + 3) / 4, kThreads, kMaxBlocks), kThreads, 0, cb_gpu_stream()>>>(
        st->recv, st->peer_send_dev, offset, count, st->ctx->nranks);
    return launched("reduce kernel");
}

#if CB_HOST_PASS
static const struct cb_peer_engine kernel_engine = {NULL, NULL, kernel_push, kernel_reduce};

static int d2d_kernel_open(const struct cb_ctx *ctx, void **state)
{
    return cb_peer_open(ctx, &kernel_engine, state);
}

const struct cb_transport cb_transport_d2d_kernel = CB_PEER_TRANSPORT(
    "d2d-kernel", "load/store kernels on peers' IPC-mapped buffers (one node); one-shot reductions",
    CB_CAP_P2P | CB_CAP_ALLREDUCE | CB_CAP_ALLTOALL | CB_CAP_ALLGATHER | CB_CAP_REDUCE_SCATTER | CB_CAP_BCAST,
    d2d_kernel_open);
#endif
