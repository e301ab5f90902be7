/* memcpy: a rank's own host <-> device copies (h2d, d2h) through the backend's copy engine path
 * (cudaMemcpyAsync / hipMemcpyAsync + stream synchronisation). */
#include <stdlib.h>

#include "../commbench.h"

struct local_copy {
    const struct cb_ctx *ctx;
    void *send, *recv;
};

static int memcpy_open(const struct cb_ctx *ctx, void **state)
{
    struct local_copy *st = calloc(1, sizeof *st);
    if (!st) {
        cb_errorf("out of memory");
        return CB_ERROR;
    }
    st->ctx = ctx;
    *state = st;
    return CB_OK;
}

static void memcpy_close(void *state)
{
    free(state);
}

static int memcpy_attach(void *state, const struct cb_bufs *bufs)
{
    struct local_copy *st = state;
    st->send = bufs->send;
    st->recv = bufs->recv;
    return CB_OK;
}

static void memcpy_detach(void *state)
{
    struct local_copy *st = state;
    st->send = st->recv = NULL;
}

static int memcpy_copy(void *state, size_t count)
{
    struct local_copy *st = state;
    return st->ctx->backend->copy(st->recv, st->send, count * sizeof(float));
}

const struct cb_transport cb_transport_memcpy = {
    .name = "memcpy",
    .summary = "host <-> own device copies (copy engine), pinned and pageable host memory",
    .backends = CB_ON_CUDA | CB_ON_HIP,
    .caps = CB_CAP_COPY,
    .open = memcpy_open,
    .close = memcpy_close,
    .attach = memcpy_attach,
    .detach = memcpy_detach,
    .copy = memcpy_copy,
};
