/* commbench: communication benchmark for CPUs and GPUs (see --help). */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "comm.h"
#include "commbench.h"
#include "driver.h"
#include "mpit.h"
#include "record.h"
#include "watchdog.h"

/* Before MPI_Init only the launcher tells which process is rank 0; print messages once. */
static int launcher_rank_zero(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID",
                                       "MV2_COMM_WORLD_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v)
            return strcmp(v, "0") == 0;
    }
    return 1;
}

static int available(const struct cb_transport *t)
{
    return (t->backends & cb_backend_bit()) != 0;
}

static void print_ops_of(const struct cb_transport *t, FILE *out)
{
    const char *sep = "";
    for (int i = 0; cb_ops[i]; i++)
        if ((t->caps & cb_ops[i]->needs) == cb_ops[i]->needs) {
            fprintf(out, "%s%s", sep, cb_ops[i]->name);
            sep = ",";
        }
}

static void print_list(void)
{
    printf("backend %s\n", cb_backend->name);
    for (int i = 0; cb_transports[i]; i++)
        if (available(cb_transports[i])) {
            printf("transport %s ops ", cb_transports[i]->name);
            print_ops_of(cb_transports[i], stdout);
            if (cb_transports[i]->not_built)
                printf(" not-built %s", cb_transports[i]->not_built);
            printf("\n");
        }
}

static void print_help(const char *prog)
{
    printf("commbench %s (backend %s): communication benchmark, one MPI process per CPU core or GPU.\n\n", CB_VERSION,
           cb_backend->name);
    printf("usage: mpirun -np N %s [options]\n\n", prog);
    printf("Selection\n"
           "  --op LIST            comma-separated ops (default: every op the transport implements)\n"
           "  --transport LIST     comma-separated transports (default: every transport of this backend)\n"
           "  --list               print the transports of this build and their ops, then exit\n"
           "  --list-cvars [PREFIX] print the MPI library's MPI_T control variables (names starting with\n"
           "                       PREFIX) as JSON Lines, as MPI_T has them before MPI_Init: name, type,\n"
           "                       scope, bound, enum (value/name items or null), value (current; null when\n"
           "                       unreadable)\n"
           "Selection sweep (collective ops allreduce, allgather, alltoall, bcast, reduce_scatter)\n"
           "  --selections all|LIST  per size, time the library's own choice (\"own\") and every forced\n"
           "                       selection it offers (or the named ones), interleaved round by round\n"
           "                       (own, A, B, ..., own, A, B, ...), each round --warmup + --iters samples,\n"
           "                       validated; one record per size and selection. mpi: MPI_T control\n"
           "                       variables (Open MPI coll_tuned_<coll>_algorithm, needs\n"
           "                       OMPI_MCA_coll_tuned_use_dynamic_rules=1, a fresh communicator per\n"
           "                       selection; MPICH MPIR_CVAR_<COLL>_INTRA_ALGORITHM, values from MPI_T's\n"
           "                       enumeration); ccl: commcamp's tuner plugin (algorithm/protocol[/channels])\n"
           "  --rounds R           interleaved rounds of a selection sweep (default 5)\n"
           "  --stop-slower F      a selection that took >= F times own's time (F >= 1) in K - 1 or all of\n"
           "                       the even-indexed rounds 0, 2, ..., 2K-2 runs no rounds after them: its\n"
           "                       record has 2K-1 rounds and selection.stopped_after (default: every round)\n"
           "  --stop-after K       the even rounds that judge --stop-slower, K >= 3 (default 4; needs\n"
           "                       --rounds >= 2K)\n"
           "Sizes (bytes; suffixes K, M, G, T are powers of 1024; at most 1T; float32 elements)\n"
           "  --min-bytes S        smallest size (default 8)\n"
           "  --max-bytes S        largest size (default 4M)\n"
           "  --step-factor F      multiply the size by integer F in [2,1024] (default 2)\n"
           "  --sizes S,S,...      explicit sizes instead of min/max/factor\n"
           "  Sizes follow nccl-tests: pingpong/p2p/sendrecv = bytes per message (sendrecv: each rank's);\n"
           "  allreduce/bcast = buffer; alltoall/allgather = receive buffer per rank; reduce_scatter =\n"
           "  send buffer per rank; h2d/d2h = bytes copied. Sizes are rounded down to whole elements\n"
           "  (and whole chunks per rank); the record keeps requested_bytes and the bytes moved. mpi and\n"
           "  staging take at most 2^31-1 elements per call: a larger size is refused up front (exit 2)\n"
           "  where --transport names them; otherwise it is an unsupported record of theirs (exit 4), never\n"
           "  allocated, and the other sizes and transports run.\n"
           "Iterations\n"
           "  --warmup N           untimed samples first, of --batch operations each (default 5)\n"
           "  --iters N            timed samples, N >= 1 (default 20)\n"
           "  --batch B            operations per sample, back to back with one completion wait at the\n"
           "                       end; the sample is the elapsed time / B (default 1, at most %d).\n"
           "                       1 = per-operation latency including completion (seed 001's method);\n"
           "                       B > 1 = nccl-tests' throughput method (-n B: B launches, one stream\n"
           "                       sync). Only ccl queues a batch on the stream; the other transports\n"
           "                       complete every operation, so B > 1 only drops the barrier between them.\n"
           "Validation\n"
           "  --check / --no-check verify every received element after the timed loop and after one\n"
           "                       extra iteration with fresh data (default --check)\n"
           "Placement\n"
           "  --peer R             ping-pong partner of rank 0 (default: the last rank, another node under\n"
           "                       block placement)\n"
           "  --device N           GPU index to use (default: node-local rank modulo visible GPUs)\n"
           "  --assume-gpu-aware-mpi  transport mpi on GPU memory without asking the MPI library\n"
           "Robustness and output\n"
           "  --timeout SECONDS    watchdog per step (setup, one size of one op, the exchange between\n"
           "                       steps): on expiry rank 0 writes an error record (reason \"timeout\")\n"
           "                       and all ranks exit with code 3, also a rank whose peer died (default 300)\n"
           "  --output FILE        append JSON Lines records to FILE (rank 0), one per op, transport,\n"
           "                       size and pair/direction/host memory; schema_version %d. A failed write\n"
           "                       (full disk, a pipe or FIFO whose reader left) cuts the file back to its\n"
           "                       last whole record, writes no more and ends the run with exit 4\n"
           "  --inject corrupt|hang|crash|fail  TEST ONLY, for proving the checks work: 'corrupt' makes the\n"
           "                       receiving rank of a pair (else the last rank) overwrite one received\n"
           "                       element before each check (valid=false, exit 1); 'hang' makes the last\n"
           "                       rank stop in the first timed iteration\n"
           "                       (the watchdog fires, exit 3); 'crash' makes rank 0 die of SIGSEGV after\n"
           "                       its records, while the others wait in MPI (their watchdog fires, exit 3);\n"
           "                       'fail' makes the last rank's operation fail in the first timed iteration\n"
           "                       (an error record naming it, exit 4; the other measurements go on).\n"
           "                       Never use for measurements.\n"
           "  --version            commbench's version, backend and record schema; then the first line of\n"
           "                       the linked MPI's MPI_Get_library_version (\"mpi_library ...\")\n"
           "  --help\n\n",
           CB_MAX_BATCH, CB_SCHEMA_VERSION);
    printf("Timing and definitions\n"
           "  Every sample is timed with MPI_Wtime on each rank from just after a barrier (not timed) to\n"
           "  the completion of its --batch operations on that rank (GPU: stream completion; ccl: the\n"
           "  operations are queued, then the stream is polled once), divided by the batch size. The\n"
           "  recorded sample is the maximum over ranks. Statistics: min, median, mean, p95 (linear\n"
           "  interpolation), max, sample standard deviation, in microseconds (us).\n"
           "  pingpong: sample = round trip / 2 (one-way time). Bandwidths in GB/s (1e9 bytes/s):\n"
           "  goodput = algbw = bytes / median time; busbw = algbw * factor (allreduce 2(n-1)/n;\n"
           "  alltoall, allgather, reduce_scatter (n-1)/n; others 1). Bidirectional (pingpong_bi,\n"
           "  pairmatrix bi): goodput is per direction, aggregate_gbs = 2 * goodput.\n\n"
           "Exit codes\n"
           "  0 success; 1 validation failed (wrong data); 2 bad arguments (also a name twice in a list,\n"
           "  an option where a value belongs, a size a transport named in --transport cannot take);\n"
           "  3 timeout (watchdog, also during start-up); 4 runtime error or unsupported op/transport/size\n"
           "  (see the error records), or records that could not be written to --output, or a failed write\n"
           "  to commbench's own standard output (a full disk, a pipe whose reader left). 1 outranks 4.\n"
           "  Under a launcher (mpirun, mpiexec, srun) standard output is a pipe to the launcher, which\n"
           "  writes it on: a failure there is the launcher's, commbench does not see it (Open MPI's mpirun\n"
           "  then exits 0). For results that must arrive, use --output.\n\n");
    printf("Transports of this build (backend %s)\n", cb_backend->name);
    for (int i = 0; cb_transports[i]; i++)
        if (available(cb_transports[i])) {
            printf("  %-11s %s\n              ops: ", cb_transports[i]->name, cb_transports[i]->summary);
            print_ops_of(cb_transports[i], stdout);
            printf("\n");
        }
    printf("Ops\n");
    for (int i = 0; cb_ops[i]; i++)
        printf("  %-15s %s\n", cb_ops[i]->name, cb_ops[i]->summary);
}

/* The MPI library is the one commbench links, not the one a tool on PATH belongs to (a Spack MPI can differ);
 * MPI_Get_library_version may be called before MPI_Init. */
static void print_version(void)
{
    char library[MPI_MAX_LIBRARY_VERSION_STRING];
    cb_mpi_library(library, sizeof library);
    library[strcspn(library, "\n")] = '\0';
    printf("commbench %s backend %s schema %d\n", CB_VERSION, cb_backend->name, CB_SCHEMA_VERSION);
    printf("mpi_library %s\n", library);
}

/* A write to a pipe or FIFO whose reader has gone (`--output` a FIFO, `commbench --list | head -c1`) must fail
 * with EPIPE, to be reported and exit 4 naming the file, not kill the process with SIGPIPE (exit 141, a
 * launcher's "signal 13"). A handler that does nothing rather than SIG_IGN: an ignored signal stays ignored
 * across exec, a caught one does not, so processes the MPI library starts (Open MPI's singleton orted) keep
 * the default. MPI libraries handle EPIPE on their sockets themselves (PMIx and UCX ignore SIGPIPE too). */
static void sigpipe_noop(int sig)
{
    (void)sig;
}

static void catch_sigpipe(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = sigpipe_noop;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGPIPE, &action, NULL);
}

/* What was printed must have arrived (a full disk, a pipe whose reader is gone): otherwise exit 4 (1 outranks
 * it), saying why. write_errno: the errno of a write already seen to fail, else 0 (an fwrite larger than the
 * buffer fails on its own; the final flush then has nothing left to fail with). */
static int stdout_status(int code, int write_errno)
{
    int flushed = fflush(stdout) == 0, flush_errno = flushed ? 0 : errno;
    int why = write_errno ? write_errno : flush_errno;
    if (flushed && !ferror(stdout) && !write_errno)
        return code;
    fprintf(stderr, "commbench: writing to standard output failed%s%s\n", why ? ": " : "", why ? strerror(why) : "");
    return code == CB_EXIT_OK ? CB_EXIT_RUNTIME : code;
}

static int usage_error(const char *msg)
{
    if (launcher_rank_zero())
        fprintf(stderr, "commbench: %s\n", msg);
    return CB_EXIT_USAGE;
}

/* Op and transport names exist in this build. */
static int check_names(const struct cb_args *args, char *err, size_t len)
{
    for (int i = 0; i < args->nops; i++)
        if (!cb_find_op(args->ops[i])) {
            int n = snprintf(err, len, "--op: unknown op '%s' (known:", args->ops[i]);
            for (int k = 0; cb_ops[k] && n > 0 && (size_t)n < len; k++)
                n += snprintf(err + n, len - (size_t)n, " %s", cb_ops[k]->name);
            if (n > 0 && (size_t)n < len)
                snprintf(err + n, len - (size_t)n, ")");
            return -1;
        }
    for (int i = 0; args->selections && i < args->nops; i++)
        if (!cb_op_has_selections(cb_find_op(args->ops[i]))) {
            snprintf(err, len,
                     "--selections: op '%s' has none (only allreduce, allgather, alltoall, bcast, reduce_scatter)",
                     args->ops[i]);
            return -1;
        }
    for (int i = 0; i < args->ntransports; i++)
        if (!cb_find_transport(args->transports[i])) {
            int n = snprintf(err, len,
                             "--transport: '%s' is not a transport of the %s backend (available:", args->transports[i],
                             cb_backend->name);
            for (int k = 0; cb_transports[k] && n > 0 && (size_t)n < len; k++)
                if (available(cb_transports[k]))
                    n += snprintf(err + n, len - (size_t)n, " %s", cb_transports[k]->name);
            if (n > 0 && (size_t)n < len)
                snprintf(err + n, len - (size_t)n, ")");
            return -1;
        }
    return 0;
}

/* Device of every rank at rank 0 (NULL elsewhere or without devices). */
static struct cb_device_info *gather_devices(const struct cb_ctx *ctx)
{
    if (!ctx->backend->describe)
        return NULL;
    struct cb_device_info mine;
    memset(&mine, 0, sizeof mine);
    ctx->backend->describe(&mine);
    struct cb_device_info *all = ctx->rank == 0 ? calloc((size_t)ctx->nranks, sizeof *all) : NULL;
    if (ctx->rank == 0 && !all)
        abort();
    cb_gather_to_root(&mine, all, sizeof mine);
    return all;
}

/* Records lost to a failed write fail the run; rank 0 knows (and has said so on stderr, once, when the
 * write failed), every rank exits with the same code. */
static int close_output(const struct cb_ctx *ctx, int code)
{
    char msg[CB_TEXT_MAX] = "";
    int rc = ctx->rank == 0 ? cb_output_close() : CB_OK;
    if (rc)
        snprintf(msg, sizeof msg, "%s", cb_last_error());
    if (cb_agree(rc, msg, sizeof msg) == CB_OK)
        return code;
    return code == CB_EXIT_OK ? CB_EXIT_RUNTIME : code; /* wrong data outranks it, as it outranks errors */
}

static int run(struct cb_ctx *ctx)
{
    const struct cb_args *args = ctx->args;
    char msg[CB_TEXT_MAX] = "";

    if (args->peer >= ctx->nranks) {
        if (ctx->rank == 0)
            fprintf(stderr, "commbench: --peer: rank %d does not exist (%d ranks)\n", args->peer, ctx->nranks);
        return CB_EXIT_USAGE;
    }
    char library[MPI_MAX_LIBRARY_VERSION_STRING];
    cb_mpi_library(library, sizeof library);
    if (ctx->rank == 0) /* before anything that can hang (opening a FIFO): a start-up timeout is a record too */
        cb_record_start(ctx, library);
    int rc = ctx->rank == 0 ? cb_output_open(args->output) : CB_OK;
    if (rc)
        snprintf(msg, sizeof msg, "%s", cb_last_error());
    if (cb_agree(rc, msg, sizeof msg) != CB_OK) {
        if (ctx->rank == 0)
            fprintf(stderr, "commbench: %s\n", msg);
        return CB_EXIT_USAGE;
    }

    rc = ctx->backend->init(ctx->local_rank, args->device);
    snprintf(msg, sizeof msg, "%s", rc ? cb_last_error() : "");
    int status = cb_agree(rc, msg, sizeof msg);
    struct cb_device_info *devices = status == CB_OK ? gather_devices(ctx) : NULL;
    struct cb_kv versions[CB_MAX_VERSIONS];
    int nversions = status == CB_OK ? ctx->backend->versions(versions, CB_MAX_VERSIONS) : 0;
    if (ctx->rank == 0)
        cb_record_setup(devices, versions, nversions);
    free(devices);
    if (status != CB_OK) {
        if (ctx->rank == 0) {
            fprintf(stderr, "commbench: backend %s: %s\n", ctx->backend->name, msg);
            cb_emit_error("setup", "none", NULL, NULL,
                          status == CB_UNSUPPORTED ? CB_REASON_UNSUPPORTED : CB_REASON_RUNTIME, msg);
        }
        return close_output(ctx, CB_EXIT_RUNTIME);
    }
    int code = cb_run_all(ctx);
    ctx->backend->finalize();
    return close_output(ctx, code);
}

/* --list-cvars lists before MPI_Init: MPI_T_init_thread registers every component's variables (Open MPI 4.1.4
 * lists ompi_info's whole set, coll_tuned's included), and MPI_Init deregisters those of the components it
 * closes (a one-process job closes btl/vader: btl_vader_* are gone after it), which would then read as
 * missing. Rank 0 prints the listing, or why it could not be made, after MPI_Init. */
static char *cvar_listing;
static size_t cvar_listing_len;
static char cvar_listing_error[CB_TEXT_MAX];

static void capture_cvars(const char *prefix)
{
    FILE *out = open_memstream(&cvar_listing, &cvar_listing_len);
    if (!out) {
        snprintf(cvar_listing_error, sizeof cvar_listing_error, "open_memstream failed");
        return;
    }
    if (cb_mpit_init() != CB_OK || cb_mpit_list_json(prefix, out) != CB_OK)
        snprintf(cvar_listing_error, sizeof cvar_listing_error, "%s", cb_last_error());
    fclose(out);
}

static int list_cvars(const struct cb_ctx *ctx)
{
    int code = CB_EXIT_OK;
    if (ctx->rank == 0 && cvar_listing_error[0]) {
        fprintf(stderr, "commbench: --list-cvars: %s\n", cvar_listing_error);
        code = CB_EXIT_RUNTIME;
    } else if (ctx->rank == 0) {
        int write_errno = 0;
        if (fwrite(cvar_listing, 1, cvar_listing_len, stdout) != cvar_listing_len)
            write_errno = errno ? errno : EIO;
        code = stdout_status(code, write_errno);
    }
    free(cvar_listing);
    cb_mpit_finalize();
    MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD); /* rank 0 printed: its verdict is every rank's */
    return code;
}

/* MPICH 4.0 over UCX can deadlock in MPI_Finalize (pmodels/mpich#6596, fixed in 4.2): a rank waits
 * for endpoint disconnects that its peers, already in the PMI barrier, never progress. Seen in about
 * a third of 2-node runs with UCX_TLS=tcp,self. Every record is written by then, so a rank whose
 * MPI_Finalize has not returned after this long exits with the code it would have returned. */
#define CB_FINALIZE_GRACE_S 10

static int exit_code;

static void *finalize_guard(void *unused)
{
    (void)unused;
    sleep(CB_FINALIZE_GRACE_S);
    fprintf(stderr, "commbench: MPI_Finalize did not return within %d s; exiting with code %d\n",
            CB_FINALIZE_GRACE_S, exit_code);
    fflush(stderr);
    _exit(exit_code);
}

int main(int argc, char **argv)
{
    static struct cb_args args;
    char err[CB_TEXT_MAX];
    catch_sigpipe(); /* first: --help and --list write to stdout too */
    if (cb_args_parse(argc, argv, &args, err, sizeof err) || check_names(&args, err, sizeof err))
        return usage_error(err);
    switch (args.action) {
    case CB_ACT_HELP:
        if (launcher_rank_zero())
            print_help(argv[0]);
        return stdout_status(CB_EXIT_OK, 0);
    case CB_ACT_VERSION:
        if (launcher_rank_zero())
            print_version();
        return stdout_status(CB_EXIT_OK, 0);
    case CB_ACT_LIST:
        if (launcher_rank_zero())
            print_list();
        return stdout_status(CB_EXIT_OK, 0);
    case CB_ACT_LIST_CVARS:
        capture_cvars(args.list_cvars_prefix);
        break;
    case CB_ACT_RUN: break;
    }

    MPI_Init(&argc, &argv);
    struct sigaction pipe_action;
    if (sigaction(SIGPIPE, NULL, &pipe_action) == 0 && pipe_action.sa_handler == SIG_DFL)
        catch_sigpipe(); /* in case MPI_Init put the default back */
    struct cb_ctx ctx;
    if (cb_ctx_init(&ctx) != CB_OK) {
        fprintf(stderr, "commbench: %s\n", cb_last_error());
        MPI_Abort(MPI_COMM_WORLD, CB_EXIT_RUNTIME);
    }
    ctx.backend = cb_backend;
    ctx.args = &args;
    if (cb_watchdog_start(&ctx, args.timeout_s) != CB_OK) {
        fprintf(stderr, "commbench: rank %d: %s\n", ctx.rank, cb_last_error());
        MPI_Abort(MPI_COMM_WORLD, CB_EXIT_RUNTIME);
    }
    int code = args.action == CB_ACT_LIST_CVARS ? list_cvars(&ctx) : run(&ctx);
    cb_watchdog_stop();
    cb_ctx_free(&ctx);
    exit_code = code;
    pthread_t guard;
    if (pthread_create(&guard, NULL, finalize_guard, NULL) == 0)
        pthread_detach(guard);
    MPI_Finalize();
    return code;
}
