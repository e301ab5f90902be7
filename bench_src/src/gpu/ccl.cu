/* ccl: NCCL (cuda backend) or RCCL (hip backend). Primitives only issue their operation on the
 * backend's stream (alltoall and point-to-point as grouped send/recv, like nccl-tests); complete()
 * waits the way nccl-tests does: poll the stream and the communicator's asynchronous error. The
 * driver calls complete() after every batch of operations (--batch; 1 = after each one). Without
 * the library at build time the transport exists but reports itself unsupported. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define CCL_CAPS                                                                                                       \
    (CB_CAP_P2P | CB_CAP_ALLREDUCE | CB_CAP_ALLTOALL | CB_CAP_ALLGATHER | CB_CAP_REDUCE_SCATTER | CB_CAP_BCAST)
#if defined(COMMBENCH_HIP)
#define CCL_NAME "RCCL"
#else
#define CCL_NAME "NCCL"
#endif

#if COMMBENCH_HAVE_CCL
#if defined(COMMBENCH_HIP)
#include <rccl.h>
#else
#include <nccl.h>
#endif

#include "../../nccl_tuner/commcamp_tuner_control.h"

struct ccl_state {
    const struct cb_ctx *ctx;
    ncclComm_t comm;
    float *send, *recv;
    int *every_rank; /* 0 .. nranks-1, the peers of alltoall (allocated once, not per operation) */
    struct commcamp_tuner_control tuner; /* --selections: commcamp's plugin as NCCL loaded it */
    int forced;                          /* a forced selection is in effect */
};

static int ccl_ok(ncclResult_t r, const char *what)
{
    if (r == ncclSuccess)
        return CB_OK;
    cb_errorf("%s: %s", what, ncclGetErrorString(r));
    return CB_ERROR;
}

static int still_running(ncclResult_t r)
{
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 21400
    return r == ncclInProgress;
#else
    (void)r;
    return 0;
#endif
}

/* sched_yield, as nccl-tests does, leaves the core to NCCL's proxy thread while the GPU works. */
static int ccl_complete(void *state)
{
    struct ccl_state *st = (struct ccl_state *)state;
    for (;;) {
        gpu_error e = GPU(StreamQuery)(cb_gpu_stream());
        if (e == GPU(Success))
            return CB_OK;
        if (e != GPU(ErrorNotReady))
            return cb_gpu_ok(e, CCL_NAME " stream");
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(st->comm, &async) == ncclSuccess && async != ncclSuccess && !still_running(async))
            return ccl_ok(async, CCL_NAME " asynchronous error");
        sched_yield();
    }
}

static int ccl_open(const struct cb_ctx *ctx, void **state)
{
    /* ncclCommInitRank answers only "invalid usage" when two ranks share a GPU; say why first. */
    int sharing = cb_max_ranks_per_gpu(ctx);
    if (sharing > 1) {
        cb_errorf(CCL_NAME " needs one GPU per rank, and here up to %d ranks share one GPU (the records' "
                  "gpu_sharing)",
                  sharing);
        return CB_UNSUPPORTED;
    }
    struct ccl_state *st = (struct ccl_state *)calloc(1, sizeof *st);
    char msg[CB_TEXT_MAX] = "";
    ncclUniqueId id;
    if (!st) {
        cb_errorf("out of memory");
        return CB_ERROR;
    }
    st->ctx = ctx;
    st->every_rank = (int *)malloc((size_t)ctx->nranks * sizeof *st->every_rank);
    if (!st->every_rank) {
        cb_errorf("out of memory");
        free(st);
        return CB_ERROR;
    }
    for (int r = 0; r < ctx->nranks; r++)
        st->every_rank[r] = r;
    int rc = ctx->rank == 0 ? ccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId") : CB_OK;
    if (rc)
        snprintf(msg, sizeof msg, "%s", cb_last_error());
    if (cb_agree(rc, msg, sizeof msg) != CB_OK || cb_bcast(&id, sizeof id, 0) != CB_OK) {
        cb_errorf("%s", msg);
        rc = CB_ERROR;
    }
    if (!rc)
        rc = ccl_ok(ncclCommInitRank(&st->comm, ctx->nranks, id, ctx->rank), "ncclCommInitRank");
    if (rc) {
        free(st->every_rank);
        free(st);
        return CB_ERROR;
    }
    *state = st;
    return CB_OK;
}

static void ccl_close(void *state)
{
    struct ccl_state *st = (struct ccl_state *)state;
    if (st->tuner.lib) {
        st->tuner.force(-1, 0, 0);
        commcamp_tuner_control_release(&st->tuner);
    }
    ncclCommDestroy(st->comm);
    free(st->every_rank);
    free(st);
}

static int ccl_attach(void *state, const struct cb_bufs *bufs)
{
    struct ccl_state *st = (struct ccl_state *)state;
    if (bufs->send_space != CB_DEVICE || bufs->recv_space != CB_DEVICE) {
        cb_errorf("ccl needs device buffers");
        return CB_ERROR;
    }
    st->send = (float *)bufs->send;
    st->recv = (float *)bufs->recv;
    return CB_OK;
}

static void ccl_detach(void *state)
{
    struct ccl_state *st = (struct ccl_state *)state;
    st->send = st->recv = NULL;
}

/* Queues one operation on the stream; empty operations are skipped (as nccl-tests does). */
template <typename Issue> static int issue(void *state, size_t count, const char *what, Issue call)
{
    struct ccl_state *st = (struct ccl_state *)state;
    if (count == 0)
        return CB_OK;
    return ccl_ok(call(st), what);
}

static int ccl_send(void *state, int peer, size_t count)
{
    return issue(state, count, "ncclSend", [&](struct ccl_state *st) {
        return ncclSend(st->send, count, ncclFloat, peer, st->comm, cb_gpu_stream());
    });
}

static int ccl_recv(void *state, int peer, size_t count)
{
    return issue(state, count, "ncclRecv", [&](struct ccl_state *st) {
        return ncclRecv(st->recv, count, ncclFloat, peer, st->comm, cb_gpu_stream());
    });
}

/* One group of n transfers: transfer i sends send[i * stride:][:count] to to[i] and receives
 * recv[i * stride:][:count] from from[i]. */
static ncclResult_t grouped(struct ccl_state *st, const int *to, const int *from, int n, size_t count, size_t stride)
{
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < n; i++) {
        size_t at = (size_t)i * stride;
        r = ncclSend(st->send + at, count, ncclFloat, to[i], st->comm, cb_gpu_stream());
        if (r == ncclSuccess)
            r = ncclRecv(st->recv + at, count, ncclFloat, from[i], st->comm, cb_gpu_stream());
    }
    ncclResult_t ended = ncclGroupEnd();
    return r != ncclSuccess ? r : ended;
}

static int ccl_exchange(void *state, int to, int from, size_t count)
{
    return issue(state, count, "grouped ncclSend/ncclRecv",
                 [&](struct ccl_state *st) { return grouped(st, &to, &from, 1, count, 0); });
}

static int ccl_alltoall(void *state, size_t count)
{
    return issue(state, count, "grouped ncclSend/ncclRecv (alltoall)", [&](struct ccl_state *st) {
        return grouped(st, st->every_rank, st->every_rank, st->ctx->nranks, count, count);
    });
}

static int ccl_allreduce(void *state, size_t count)
{
    return issue(state, count, "ncclAllReduce", [&](struct ccl_state *st) {
        return ncclAllReduce(st->send, st->recv, count, ncclFloat, ncclSum, st->comm, cb_gpu_stream());
    });
}

static int ccl_allgather(void *state, size_t count)
{
    return issue(state, count, "ncclAllGather", [&](struct ccl_state *st) {
        return ncclAllGather(st->send, st->recv, count, ncclFloat, st->comm, cb_gpu_stream());
    });
}

static int ccl_reduce_scatter(void *state, size_t count)
{
    return issue(state, count, "ncclReduceScatter", [&](struct ccl_state *st) {
        return ncclReduceScatter(st->send, st->recv, count, ncclFloat, ncclSum, st->comm, cb_gpu_stream());
    });
}

static int ccl_bcast(void *state, size_t count, int root)
{
    return issue(state, count, "ncclBroadcast", [&](struct ccl_state *st) {
        return ncclBroadcast(st->recv, st->recv, count, ncclFloat, root, st->comm, cb_gpu_stream());
    });
}

/* ---- Selection sweep through commcamp's tuner plugin (commcamp_tuner_control.h) ---- */

/* Channel counts swept for every (algorithm, protocol) besides NCCL's own count. */
static const int swept_channels[] = {1, 2, 4, 8, 16, 32};

/* Every algorithm x protocol x (NCCL's channels, swept_channels), own first: NCCL disables what
 * does not apply to a call (collective, topology, size), which the sweep records as unavailable. */
static int ccl_selections(void *state, const struct cb_op *op, struct cb_selection *out, int max)
{
    struct ccl_state *st = (struct ccl_state *)state;
    static const char *const algorithms[] = COMMCAMP_TUNER_ALGORITHM_NAMES;
    static const char *const protocols[] = COMMCAMP_TUNER_PROTOCOL_NAMES;
    const int nalgo = (int)(sizeof algorithms / sizeof algorithms[0]), nproto = (int)(sizeof protocols / sizeof protocols[0]);
    const int nchan = (int)(sizeof swept_channels / sizeof swept_channels[0]);
    char why[CB_TEXT_MAX];
    if (op->needs == CB_CAP_ALLTOALL) {
        cb_errorf(CCL_NAME "'s alltoall is grouped send/recv: no algorithm or protocol to select");
        return 0;
    }
    if (!st->tuner.lib && commcamp_tuner_control_find(getenv("NCCL_TUNER_PLUGIN"), &st->tuner, why, sizeof why)) {
        cb_errorf("%s; set NCCL_TUNER_PLUGIN to commcamp's libnccl-tuner-commcamp.so", why);
        return 0;
    }
    int n = 0;
    memset(&out[n], 0, sizeof out[n]);
    snprintf(out[n].name, sizeof out[n].name, "own");
    out[n].mechanism = CB_MECH_PLUGIN;
    out[n].value = out[n].segsize = out[n].algorithm = out[n].protocol = out[n].channels = -1;
    n++;
    for (int a = 0; a < nalgo; a++)
        for (int p = 0; p < nproto; p++)
            for (int c = -1; c < nchan && n < max; c++, n++) {
                struct cb_selection *sel = &out[n];
                memset(sel, 0, sizeof *sel);
                sel->mechanism = CB_MECH_PLUGIN;
                sel->value = sel->segsize = -1;
                sel->algorithm = a;
                sel->protocol = p;
                sel->channels = c < 0 ? -1 : swept_channels[c];
                if (c < 0)
                    snprintf(sel->name, sizeof sel->name, "%s/%s", algorithms[a], protocols[p]);
                else
                    snprintf(sel->name, sizeof sel->name, "%s/%s/%d", algorithms[a], protocols[p], sel->channels);
            }
    return n;
}

static int ccl_select(void *state, const struct cb_op *op, const struct cb_selection *sel)
{
    struct ccl_state *st = (struct ccl_state *)state;
    (void)op;
    if (!st->tuner.lib)
        return CB_OK;
    st->forced = sel && sel->algorithm >= 0;
    if (st->tuner.force(st->forced ? sel->algorithm : -1, st->forced ? sel->protocol : 0,
                        st->forced ? sel->channels : 0) != 0) {
        cb_errorf("commcampTunerForce refused %s", sel->name);
        return CB_ERROR;
    }
    return CB_OK;
}

/* The plugin counts every call it was asked about since select. */
static int ccl_refused(void *state)
{
    struct ccl_state *st = (struct ccl_state *)state;
    unsigned long long applied = 0, unavailable = 0;
    if (!st->forced)
        return CB_OK;
    st->tuner.stats(&applied, &unavailable);
    if (unavailable > 0) {
        cb_errorf(CCL_NAME " had the forced choice disabled for %llu of %llu calls (they ran " CCL_NAME "'s own)",
                  unavailable, applied + unavailable);
        return CB_UNSUPPORTED;
    }
    if (applied == 0) {
        cb_errorf(CCL_NAME " never asked the tuner plugin about these calls");
        return CB_UNSUPPORTED;
    }
    return CB_OK;
}

/* The plugin's counters since select: calls NCCL let the forced choice apply to, and calls where
 * NCCL had it disabled (what the library reports it used); and the node and rank counts NCCL gave
 * the communicator (a deployed rule must name NCCL's node count, not the host count). */
static int ccl_reported(void *state, struct cb_kv *out, int max)
{
    struct ccl_state *st = (struct ccl_state *)state;
    unsigned long long applied = 0, unavailable = 0, nodes = 0, ranks = 0;
    if (!st->tuner.lib || max < 2)
        return 0;
    st->tuner.stats(&applied, &unavailable);
    snprintf(out[0].key, sizeof out[0].key, "plugin_applied_calls");
    snprintf(out[0].value, sizeof out[0].value, "%llu", applied);
    snprintf(out[1].key, sizeof out[1].key, "plugin_unavailable_calls");
    snprintf(out[1].value, sizeof out[1].value, "%llu", unavailable);
    if (max < 4 || !st->tuner.scope || st->tuner.scope(&nodes, &ranks) != 0)
        return 2;
    snprintf(out[2].key, sizeof out[2].key, "nccl_nodes");
    snprintf(out[2].value, sizeof out[2].value, "%llu", nodes);
    snprintf(out[3].key, sizeof out[3].key, "nccl_ranks");
    snprintf(out[3].value, sizeof out[3].value, "%llu", ranks);
    return 4;
}

const char *cb_ccl_version(void)
{
    static char text[32];
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess)
        return NULL;
    /* 2.9 and later: major*10000 + minor*100 + patch; before: major*1000 + minor*100 + patch */
    if (v >= 10000)
        snprintf(text, sizeof text, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else
        snprintf(text, sizeof text, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
    return text;
}

#if CB_HOST_PASS
const struct cb_transport cb_transport_ccl = {
    .name = "ccl",
    .summary = CCL_NAME " point-to-point (grouped send/recv) and collectives on device buffers",
    .backends = CB_ON_CUDA | CB_ON_HIP,
    .caps = CCL_CAPS,
    .not_built = NULL,
    .max_count = 0, /* size_t counts */
    .open = ccl_open,
    .close = ccl_close,
    .attach = ccl_attach,
    .detach = ccl_detach,
    .send = ccl_send,
    .recv = ccl_recv,
    .exchange = ccl_exchange,
    .allreduce = ccl_allreduce,
    .alltoall = ccl_alltoall,
    .allgather = ccl_allgather,
    .reduce_scatter = ccl_reduce_scatter,
    .bcast = ccl_bcast,
    .copy = NULL,
    .complete = ccl_complete,
    .selections = ccl_selections,
    .select = ccl_select,
    .refused = ccl_refused,
    .reported = ccl_reported,
    .usable_caps = NULL,
};
#endif

#else /* !COMMBENCH_HAVE_CCL */

#define NOT_BUILT CCL_NAME " was not found when this commbench was built"

static int ccl_not_built(const struct cb_ctx *ctx, void **state)
{
    (void)ctx;
    (void)state;
    cb_errorf("transport ccl not built: %s", NOT_BUILT);
    return CB_UNSUPPORTED;
}

const char *cb_ccl_version(void)
{
    return NULL;
}

#if CB_HOST_PASS
const struct cb_transport cb_transport_ccl = {
    .name = "ccl",
    .summary = CCL_NAME " collectives -- NOT BUILT: the library was not found at build time",
    .backends = CB_ON_CUDA | CB_ON_HIP,
    .caps = CCL_CAPS,
    .not_built = NOT_BUILT,
    .max_count = 0,
    .open = ccl_not_built,
    .close = NULL,
    .attach = NULL,
    .detach = NULL,
    .send = NULL,
    .recv = NULL,
    .exchange = NULL,
    .allreduce = NULL,
    .alltoall = NULL,
    .allgather = NULL,
    .reduce_scatter = NULL,
    .bcast = NULL,
    .copy = NULL,
    .complete = NULL,
    .selections = NULL,
    .select = NULL,
    .refused = NULL,
    .reported = NULL,
    .usable_caps = NULL,
};
#endif

#endif
