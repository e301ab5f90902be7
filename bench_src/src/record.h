/* Records: the JSON Lines file (schema bench_src/schema/commbench-record.schema.json) and the
 * human table on stdout. Only rank 0 emits; emission is thread-safe (the watchdog emits too). */
#ifndef COMMBENCH_RECORD_H
#define COMMBENCH_RECORD_H

#include <stdint.h>

#include "commbench.h"
#include "stats.h"

struct cb_result {
    const char *op, *transport;
    const struct cb_plan *plan;
    const struct cb_instance *inst;
    const double *samples_us;
    int iters, warmup, batch;
    struct cb_stats stats;
    double latency_us, goodput_gbs, algbw_gbs, busbw_gbs, busbw_factor;
    double aggregate_gbs; /* bidirectional only */
    int check;
    uint64_t wrong;
    int rounds;                  /* selection sweep: interleaved rounds (samples_us = rounds x iters), else 0 */
    const double *round_medians; /* selection sweep: median of each round's samples */
    const struct cb_rank_attribution *attribution; /* who was slow per iteration, per rank; NULL: none */
};

/* The selection a sweep's records are about (--selections). */
struct cb_selection_record {
    const struct cb_selection *sel;
    int available;      /* 0: the library refused the forced choice */
    const char *reason; /* why unavailable, why mechanism is "process", or why stopped early; NULL */
    const struct cb_kv *reported; /* what the library reported it used (the transport's reported) */
    int nreported;
    int stopped_after; /* > 0: the sweep stopped it after this many rounds (--stop-slower) */
};

/* Whether an environment variable belongs in a record's "env": tuning prefixes, minus the
 * per-process and per-job variables launchers set. */
int cb_env_keep(const char *name);

/* UTC ISO 8601 with milliseconds, e.g. 2026-11-21T14:50:03.125Z. */
void cb_timestamp(char *buf, size_t len);

/* How many ranks use the GPU of each rank, into per_rank[nranks] (one GPU: the same host and UUID,
 * or the same host and PCI bus id where the UUID is empty); returns the largest count. */
int cb_ranks_per_device(int nranks, const char (*hosts)[CB_HOST_MAX], const struct cb_device_info *devices,
                        int *per_rank);

/* Rank 0, first thing after MPI_Init: the fields shared by every record that need no backend (hosts,
 * MPI library, env), so that a timeout during start-up is a record too. Until then nothing is emitted. */
void cb_record_start(const struct cb_ctx *ctx, const char *mpi_library);
/* Rank 0, after the backend's init: devices (one per rank, or NULL) and versions; records before it
 * have neither. */
void cb_record_setup(const struct cb_device_info *devices, const struct cb_kv *versions, int nversions);
/* Opens (appends to) the JSON Lines file; CB_ERROR + cb_errorf on failure. NULL: none. */
int cb_output_open(const char *path);
/* Closes the JSON Lines file and flushes the table on stdout. CB_ERROR + cb_errorf naming what failed
 * when a record or a table line was lost (a failed write, close or flush), else CB_OK. Every such
 * failure has been said on stderr once, when it was found (here, for a failed close or final flush). */
int cb_output_close(void);

/* Records emitted from now on carry this "selection" (NULL: none, the default). */
void cb_record_selection(const struct cb_selection_record *sel);

void cb_emit_result(const struct cb_result *r);
/* plan and inst may be NULL. */
void cb_emit_error(const char *op, const char *transport, const struct cb_plan *plan, const struct cb_instance *inst,
                   enum cb_reason reason, const char *message);

#endif
