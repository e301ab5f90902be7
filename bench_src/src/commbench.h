/* commbench core interfaces: backends (memory and device), transports (how bytes move) and
 * operations (what is measured). An operation only calls transport primitives, a transport only
 * calls the backend and the MPI helpers below, so adding either changes no other op or transport:
 * its file, its line in tables.c, its extern (an op's in tables.c, a transport's at the end of this
 * file) and its source in the build (CMakeLists.txt add_executable; GPU: cmake/gpu.cmake). An op
 * that needs a primitive no transport has yet also needs a CB_CAP_* bit, a struct cb_transport
 * member and that primitive in each transport that offers it (ARCHITECTURE.md, "Where to add"). */
#ifndef COMMBENCH_H
#define COMMBENCH_H

#include <stddef.h>
#include <stdint.h>

#include "pattern.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CB_VERSION "0.1.0"
#define CB_SCHEMA_VERSION 2 /* 2: + slowest_rank, slowest_excess_us, per_rank */
#define CB_HOST_MAX 256
#define CB_TEXT_MAX 512

/* Process exit codes (documented in --help). */
enum cb_exit {
    CB_EXIT_OK = 0,
    CB_EXIT_VALIDATION = 1,
    CB_EXIT_USAGE = 2,
    CB_EXIT_TIMEOUT = 3,
    CB_EXIT_RUNTIME = 4,
};

/* Outcome of a setup step; ordered by severity so ranks can agree with a MAX reduction. */
enum cb_status { CB_OK = 0, CB_UNSUPPORTED = 1, CB_ERROR = 2 };

/* Why a measurement produced an error record (schema field "reason"). */
enum cb_reason { CB_REASON_TIMEOUT, CB_REASON_UNSUPPORTED, CB_REASON_VALIDATION, CB_REASON_RUNTIME };

enum cb_space { CB_DEVICE, CB_HOST_PINNED, CB_HOST_PAGEABLE };

/* Last error message of this thread's failing call (set with cb_errorf, read by the driver). */
void cb_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *cb_last_error(void);

struct cb_device_info {
    int index;
    int mps; /* 1: this process's work goes through MPS, 0: it does not, -1: unknown */
    char name[256];
    char pci_bus_id[32];
    char uuid[48]; /* "GPU-..." as nvidia-smi prints it, or "" where the runtime gives none */
};

struct cb_kv {
    char key[32];
    char value[64];
};

#define CB_MAX_VERSIONS 8

struct cb_backend {
    const char *name; /* "cpu", "cuda" or "hip" */
    /* Selects device_override, or the node-local rank modulo the visible devices when it is < 0. */
    int (*init)(int local_rank, int device_override);
    void (*finalize)(void);
    void *(*alloc)(enum cb_space space, size_t bytes); /* NULL + cb_errorf on failure */
    void (*release)(enum cb_space space, void *ptr);
    /* Synchronous copy between any two spaces. */
    int (*copy)(void *dst, const void *src, size_t bytes);
    int (*memset)(enum cb_space space, void *dst, int byte, size_t bytes);
    int (*fill)(enum cb_space space, float *dst, const struct cb_pattern *p);
    int (*count_wrong)(enum cb_space space, const float *buf, const struct cb_pattern *p, uint64_t *wrong);
    void (*describe)(struct cb_device_info *out); /* NULL: no devices */
    int (*versions)(struct cb_kv *out, int max);  /* runtime/driver/collective library versions */
};

/* What each process knows about the job. */
struct cb_ctx {
    int rank, nranks;
    int local_rank, local_size; /* within this rank's node (MPI_COMM_TYPE_SHARED) */
    int nnodes;
    int *node_of;               /* node index of every rank */
    char (*hosts)[CB_HOST_MAX]; /* processor name of every rank */
    const struct cb_backend *backend;
    const struct cb_args *args;
};

/* MPI helpers on MPI_COMM_WORLD for transports and GPU code (which do not include mpi.h). */
int cb_barrier(void);
/* A barrier that also agrees: 1 when every rank's *status is CB_OK. A failure on one rank then stops every rank at
 * the same point: a rank leaving alone meets the others' next collective with another one (a hang, or MPI
 * matching a barrier with an allreduce). A failed barrier becomes this rank's *status. */
int cb_barrier_all_ok(int *status);
int cb_allgather(const void *mine, void *all, size_t bytes_each);
int cb_bcast(void *buf, size_t bytes, int root);
int cb_notify_send(int peer);
int cb_notify_recv(int peer);
/* Empty message to `to` and from `from` at the same time (the same rank for a pairwise exchange). */
int cb_notify_exchange(int to, int from);
/* Collective: the most ranks that use one GPU (1 on backends without devices). */
int cb_max_ranks_per_gpu(const struct cb_ctx *ctx);
/* Every rank passes its status; all get the worst one and the message of the lowest rank with it. */
int cb_agree(int status, char *msg, size_t msglen);
/* MPI_Abort(MPI_COMM_WORLD, code); _exit(code) if that returns. Also called from the watchdog
 * thread: the one way to make every launcher end the whole job with this exit code. */
void cb_abort(int code) __attribute__((noreturn));

/* Buffers an operation registers with a transport (attach). */
struct cb_bufs {
    void *send, *recv;
    size_t send_bytes, recv_bytes;
    enum cb_space send_space, recv_space;
};

enum cb_cap {
    CB_CAP_P2P = 1u << 0, /* send, recv, exchange */
    CB_CAP_ALLREDUCE = 1u << 1,
    CB_CAP_ALLTOALL = 1u << 2,
    CB_CAP_ALLGATHER = 1u << 3,
    CB_CAP_REDUCE_SCATTER = 1u << 4,
    CB_CAP_BCAST = 1u << 5,
    CB_CAP_COPY = 1u << 6, /* local copy send -> recv (host <-> device) */
};

/* How a selection sweep (--selections) forces a choice: MPI_T control variables, commcamp's NCCL
 * tuner plugin, or not at run time (one process per selection, through the environment). */
enum cb_mechanism { CB_MECH_MPI_T, CB_MECH_PLUGIN, CB_MECH_PROCESS };

#define CB_MAX_SELECTIONS 256

/* One candidate of a selection sweep: the library's own choice ("own") or a forced one. */
struct cb_selection {
    char name[64]; /* "own", the library's name of the algorithm, or algorithm/protocol[/channels] */
    enum cb_mechanism mechanism;
    char cvar[128]; /* MPI_T variable written, "" for none */
    int value;      /* value written to cvar; -1 for none */
    int segsize;    /* Open MPI: bytes written to <cvar>_segmentsize with value; -1 for none */
    int algorithm, protocol, channels; /* plugin: NCCL's ids, channels -1 = NCCL's count; else -1 */
};

#define CB_MAX_REPORTED 4

enum cb_backend_bit { CB_ON_CPU = 1u << 0, CB_ON_CUDA = 1u << 1, CB_ON_HIP = 1u << 2 };

struct cb_op;

/* All counts are float32 elements. Every primitive returns CB_OK or CB_ERROR (+ cb_errorf), and
 * returns only when the data is in place (for GPUs: after stream completion) -- unless the
 * transport has `complete`: then a primitive may return once its work is queued in stream order,
 * and complete() waits for everything queued since the last call. The driver calls it after each
 * batch of operations (--batch), so a batch overlaps launching with device work like nccl-tests. */
struct cb_transport {
    const char *name;
    const char *summary;
    unsigned backends; /* CB_ON_* */
    unsigned caps;     /* CB_CAP_*: the primitives below that are set */
    const char *not_built; /* why the transport is only a stub in this build, or NULL */
    /* The largest count a primitive takes (mpi, staging: MPI's int); 0: no limit. The driver refuses
     * larger sizes up front (exit 2), before any buffer is allocated. */
    size_t max_count;
    /* Collective. CB_UNSUPPORTED (+ cb_errorf) when it cannot run here. */
    int (*open)(const struct cb_ctx *ctx, void **state);
    void (*close)(void *state);
    int (*attach)(void *state, const struct cb_bufs *bufs); /* collective */
    void (*detach)(void *state); /* collective; also after a failed attach */
    /* my send[0:count] -> peer's recv[0:count] */
    int (*send)(void *state, int peer, size_t count);
    int (*recv)(void *state, int peer, size_t count);
    /* my send[0:count] -> to's recv[0:count] and from's send[0:count] -> my recv[0:count] at the
     * same time (to == from: a pairwise exchange; to != from: one step of a ring shift) */
    int (*exchange)(void *state, int to, int from, size_t count);
    int (*allreduce)(void *state, size_t count); /* sum */
    int (*alltoall)(void *state, size_t count_per_peer);
    int (*allgather)(void *state, size_t count_per_rank);
    int (*reduce_scatter)(void *state, size_t count_per_rank); /* sum */
    int (*bcast)(void *state, size_t count, int root);         /* in place in recv */
    int (*copy)(void *state, size_t count);
    int (*complete)(void *state); /* NULL: every primitive completes before it returns */
    /* Selection sweep (--selections); NULL where the library has no run-time switch.
     * selections: fills up to max candidates for op, the library's own choice first, and returns
     * how many; 0 + cb_errorf(why) when the library has no run-time switch for op (then one
     * process per selection is the way), -1 + cb_errorf on error. select (collective): the following
     * calls run with sel; NULL: the library's own state again. refused (may be NULL): after the
     * calls since select, CB_UNSUPPORTED (+ cb_errorf why) when the library refused the forced
     * choice for any of them, else CB_OK. reported (may be NULL): what the library reports it used
     * for the calls since select (MPI_T values read back after the write, plugin call counters),
     * up to max key/value pairs; returns how many. */
    int (*selections)(void *state, const struct cb_op *op, struct cb_selection *out, int max);
    int (*select)(void *state, const struct cb_op *op, const struct cb_selection *sel);
    int (*refused)(void *state);
    int (*reported)(void *state, struct cb_kv *out, int max);
    /* After open, the same on every rank: the caps this run can use (NULL: all of caps); the
     * driver answers ops needing others with `unsupported` records that quote why. */
    unsigned (*usable_caps)(void *state, char *why, size_t len);
};

enum cb_direction { CB_DIR_NONE, CB_DIR_UNI, CB_DIR_BI };

/* One measured variant of an operation (a rank pair, a host memory kind). */
struct cb_instance {
    int src, dst; /* the pair, or -1 */
    enum cb_direction dir;
    enum cb_space send_space, recv_space;
    int host_memory; /* CB_HOST_PINNED / CB_HOST_PAGEABLE, or -1 */
};

/* Sizes of one measurement, nccl-tests convention (see the schema's "bytes"). */
struct cb_plan {
    size_t requested_bytes;
    size_t bytes;      /* reported size (record "count" = bytes / 4) */
    size_t arg_count;  /* elements passed to the primitive (per peer/rank for alltoall etc.) */
    size_t send_count; /* elements of this rank's send buffer used */
    size_t recv_count; /* elements of this rank's receive buffer used */
};

/* Data of one validated run, for this rank. */
struct cb_data {
    int fill_send, fill_recv; /* fill_recv: the input lives in recv (in-place bcast root) */
    struct cb_pattern send_input, recv_input;
    int check; /* recv must equal expect afterwards */
    struct cb_pattern expect;
};

struct cb_exec {
    const struct cb_ctx *ctx;
    const struct cb_transport *transport;
    void *state;
    const struct cb_plan *plan;
    const struct cb_instance *inst;
};

/* nccl-tests bus bandwidth factor of an operation. */
enum cb_busbw { CB_BUSBW_ONE, CB_BUSBW_ALLREDUCE, CB_BUSBW_N_MINUS_1_OVER_N };

struct cb_op {
    const char *name;
    const char *summary;
    unsigned needs; /* CB_CAP_* */
    enum cb_busbw busbw;
    /* Fills up to max instances (out may be NULL) and returns how many exist; NULL: one plain
     * instance with device buffers. */
    int (*instances)(const struct cb_ctx *ctx, struct cb_instance *out, int max);
    void (*plan)(const struct cb_ctx *ctx, size_t requested_bytes, struct cb_plan *plan);
    void (*data)(const struct cb_ctx *ctx, const struct cb_plan *plan, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *data);
    int (*run)(const struct cb_exec *exec); /* one iteration */
};

/* Transports (tables.c lists those of the build); a new one's extern goes here. */
extern const struct cb_transport cb_transport_mpi, cb_transport_staging, cb_transport_d2d, cb_transport_d2d_kernel,
    cb_transport_ccl, cb_transport_memcpy;

extern const struct cb_backend *const cb_backend;
extern const struct cb_op *const cb_ops[];
extern const struct cb_transport *const cb_transports[];
const struct cb_op *cb_find_op(const char *name);
/* The collectives a selection sweep covers: allreduce, allgather, alltoall, bcast, reduce_scatter. */
int cb_op_has_selections(const struct cb_op *op);
const struct cb_transport *cb_find_transport(const char *name);
/* CB_ON_* bit of the backend compiled in. */
unsigned cb_backend_bit(void);

#ifdef __cplusplus
}
#endif

#endif
