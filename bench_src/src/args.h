/* Command line parsing; no MPI, no backend: unit-tested on its own. */
#ifndef COMMBENCH_ARGS_H
#define COMMBENCH_ARGS_H

#include <stddef.h>
#include <stdint.h>

#define CB_MAX_SIZES 256
#define CB_MAX_NAMES 256 /* a --selections list may name every forced selection (NCCL: 147) */
#define CB_MAX_BYTES (1ull << 40) /* 1 TiB: anything larger is a typo */
#define CB_MAX_ITERS 1000000
#define CB_MAX_BATCH 100000
#define CB_MAX_TIMEOUT_S 604800.0 /* one week */
#define CB_MAX_ROUNDS 10000
#define CB_MAX_STOP_SLOWER 1e6

enum cb_action { CB_ACT_RUN, CB_ACT_HELP, CB_ACT_VERSION, CB_ACT_LIST, CB_ACT_LIST_CVARS };
enum cb_inject { CB_INJECT_NONE, CB_INJECT_CORRUPT, CB_INJECT_HANG, CB_INJECT_CRASH, CB_INJECT_FAIL };

struct cb_args {
    enum cb_action action;
    const char *ops[CB_MAX_NAMES]; /* empty: every op the transport supports */
    int nops;
    const char *transports[CB_MAX_NAMES]; /* empty: every transport of the backend */
    int ntransports;
    uint64_t sizes[CB_MAX_SIZES];
    int nsizes;
    int warmup, iters;
    int batch; /* operations per timed sample, one completion wait at the end */
    int check;
    int peer;   /* -1: the last rank */
    int device; /* -1: node-local rank modulo visible devices */
    double timeout_s;
    const char *output; /* NULL: no JSON Lines file */
    enum cb_inject inject;
    int assume_gpu_aware_mpi;
    /* --selections: 0 = off; all = every forced selection the library offers; else the names */
    int selections, selections_all;
    const char *selection_names[CB_MAX_NAMES];
    int nselection_names;
    int rounds;                   /* interleaved rounds of a selection sweep */
    double stop_slower;           /* --stop-slower F: 0 = off; else a selection F x slower than own stops */
    int stop_after;               /* ... judged on the even rounds 0, 2, ..., 2 x stop_after - 2 */
    const char *list_cvars_prefix; /* --list-cvars [PREFIX]; NULL: every variable */
    char name_store[4096]; /* backing store of ops/transports */
};

/* Returns 0, or -1 with a message naming the bad argument in err. Pointers in args point into
 * argv or args->name_store. */
int cb_args_parse(int argc, char **argv, struct cb_args *args, char *err, size_t errlen);

/* "8", "64K", "1M", "2G", "1T" (powers of 1024). Returns 0 or -1 (not a size, zero, or > CB_MAX_BYTES). */
int cb_parse_size(const char *text, uint64_t *bytes);

/* min, min*factor, ... <= max. Returns the count, or -1 when more than max_sizes would result. */
int cb_size_series(uint64_t min, uint64_t max, uint64_t factor, uint64_t *out, int max_sizes);

#endif
