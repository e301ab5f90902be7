#include "comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "record.h"

#define CB_TAG_NOTIFY 0x7cb1

int cb_mpi_check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return CB_OK;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0, cls = MPI_ERR_OTHER;
    MPI_Error_string(rc, text, &len);
    MPI_Error_class(rc, &cls);
    cb_errorf("%s failed: %s", what, text);
    /* e.g. a forced algorithm that does not apply to this communicator (--selections) */
    return cls == MPI_ERR_UNSUPPORTED_OPERATION ? CB_UNSUPPORTED : CB_ERROR;
}

int cb_barrier(void)
{
    return cb_mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

int cb_barrier_all_ok(int *status)
{
    int worst = CB_OK, mine = *status;
    int rc = cb_mpi_check(MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    if (rc && !*status)
        *status = rc;
    return !rc && worst == CB_OK;
}

int cb_allgather(const void *mine, void *all, size_t bytes_each)
{
    if (bytes_each > INT_MAX) {
        cb_errorf("cb_allgather: %zu bytes is too large", bytes_each);
        return CB_ERROR;
    }
    return cb_mpi_check(MPI_Allgather(mine, (int)bytes_each, MPI_BYTE, all, (int)bytes_each, MPI_BYTE, MPI_COMM_WORLD),
                        "MPI_Allgather");
}

int cb_gather_to_root(const void *mine, void *all, size_t bytes_each)
{
    if (bytes_each > INT_MAX) {
        cb_errorf("cb_gather_to_root: %zu bytes is too large", bytes_each);
        return CB_ERROR;
    }
    return cb_mpi_check(MPI_Gather(mine, (int)bytes_each, MPI_BYTE, all, (int)bytes_each, MPI_BYTE, 0, MPI_COMM_WORLD),
                        "MPI_Gather");
}

int cb_bcast(void *buf, size_t bytes, int root)
{
    if (bytes > INT_MAX) {
        cb_errorf("cb_bcast: %zu bytes is too large", bytes);
        return CB_ERROR;
    }
    return cb_mpi_check(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
}

int cb_notify_send(int peer)
{
    return cb_mpi_check(MPI_Send(NULL, 0, MPI_BYTE, peer, CB_TAG_NOTIFY, MPI_COMM_WORLD), "MPI_Send(notify)");
}

int cb_notify_recv(int peer)
{
    return cb_mpi_check(MPI_Recv(NULL, 0, MPI_BYTE, peer, CB_TAG_NOTIFY, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                        "MPI_Recv(notify)");
}

int cb_notify_exchange(int to, int from)
{
    return cb_mpi_check(MPI_Sendrecv(NULL, 0, MPI_BYTE, to, CB_TAG_NOTIFY, NULL, 0, MPI_BYTE, from, CB_TAG_NOTIFY,
                                     MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                        "MPI_Sendrecv(notify)");
}

int cb_max_ranks_per_gpu(const struct cb_ctx *ctx)
{
    if (!ctx->backend->describe)
        return 1;
    struct cb_device_info mine;
    memset(&mine, 0, sizeof mine);
    ctx->backend->describe(&mine);
    struct cb_device_info *all = calloc((size_t)ctx->nranks, sizeof *all);
    int *per_rank = calloc((size_t)ctx->nranks, sizeof *per_rank);
    if (!all || !per_rank)
        abort();
    int most = 1;
    if (cb_allgather(&mine, all, sizeof mine) == CB_OK)
        most = cb_ranks_per_device(ctx->nranks, (const char (*)[CB_HOST_MAX])ctx->hosts, all, per_rank);
    free(all);
    free(per_rank);
    return most;
}

int cb_agree(int status, char *msg, size_t msglen)
{
    int worst = status, rank, nranks, reporter;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst == CB_OK)
        return CB_OK;
    int candidate = status == worst ? rank : nranks;
    MPI_Allreduce(&candidate, &reporter, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    char text[CB_TEXT_MAX];
    snprintf(text, sizeof text, "rank %d: %s", rank, msg);
    MPI_Bcast(text, (int)sizeof text, MPI_CHAR, reporter, MPI_COMM_WORLD);
    snprintf(msg, msglen, "%s", text);
    return worst;
}

void cb_abort(int code)
{
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

void cb_mpi_library(char *buf, size_t len)
{
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    if (MPI_Get_library_version(text, &n) != MPI_SUCCESS)
        n = 0;
    text[n < MPI_MAX_LIBRARY_VERSION_STRING ? n : MPI_MAX_LIBRARY_VERSION_STRING - 1] = '\0';
    snprintf(buf, len, "%s", text);
}

int cb_ctx_init(struct cb_ctx *ctx)
{
    MPI_Comm node;
    char name[MPI_MAX_PROCESSOR_NAME];
    char mine[CB_HOST_MAX] = {0};
    int len = 0;

    memset(ctx, 0, sizeof *ctx);
    MPI_Comm_rank(MPI_COMM_WORLD, &ctx->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ctx->nranks);
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
        cb_errorf("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
        return CB_ERROR;
    }
    MPI_Comm_rank(node, &ctx->local_rank);
    MPI_Comm_size(node, &ctx->local_size);
    MPI_Comm_free(&node);

    MPI_Get_processor_name(name, &len);
    snprintf(mine, sizeof mine, "%.*s", len, name);
    ctx->hosts = calloc((size_t)ctx->nranks, sizeof *ctx->hosts);
    ctx->node_of = calloc((size_t)ctx->nranks, sizeof *ctx->node_of);
    if (!ctx->hosts || !ctx->node_of) {
        cb_errorf("out of memory for %d ranks", ctx->nranks);
        return CB_ERROR;
    }
    MPI_Allgather(mine, CB_HOST_MAX, MPI_CHAR, ctx->hosts, CB_HOST_MAX, MPI_CHAR, MPI_COMM_WORLD);
    /* A node is a distinct host name, numbered in order of first appearance. */
    for (int r = 0; r < ctx->nranks; r++) {
        int first = 0;
        while (strcmp(ctx->hosts[first], ctx->hosts[r]) != 0)
            first++;
        ctx->node_of[r] = first == r ? ctx->nnodes++ : ctx->node_of[first];
    }
    return CB_OK;
}

void cb_ctx_free(struct cb_ctx *ctx)
{
    free(ctx->hosts);
    free(ctx->node_of);
    ctx->hosts = NULL;
    ctx->node_of = NULL;
}
