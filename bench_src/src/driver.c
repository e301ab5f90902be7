/* The measurement driver: transports x ops x instances x sizes.
 *
 * Per measurement: fill inputs, warm up, then time every sample with MPI_Wtime from just after a
 * barrier to the completion of --batch operations (GPU stream completion included; transports with
 * a complete() hook queue the batch and wait once at its end). Sample = elapsed / batch; the
 * recorded sample i is the maximum over ranks. Validation checks the output of the timed loop,
 * then refills with a new seed and checks one more untimed operation. */
#include "driver.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "record.h"
#include "stats.h"
#include "watchdog.h"

struct run {
    const struct cb_ctx *ctx;
    const struct cb_args *args;
    int saw_wrong, saw_error;
    int injected; /* --inject hang, fail: in the first timed loop only */
};

static const float corrupt_value = -7.0f;

/* ---- Validation seeds ----
 * Every fill gets its own seed, a hash of what it is for: op, size, instance (pair, direction, host
 * memory), selection and round of a sweep, and whether it is the timed loop's or the extra check's. A
 * step that did nothing must not pass on data left from another one: with one seed for everything (1
 * timed, 2 extra), a transport's bounce buffer holding the previous size's or the previous
 * selection's result held exactly what this one expected (a sum over ranks does not depend on the
 * size, and every cell of a sweep round was filled alike). The inputs are the same on every rank, so
 * every rank expects what the others sent; it costs a few multiplications per fill. */
static uint32_t seed_add(uint32_t h, uint64_t v)
{
    h = cb_pattern_mix(h ^ (uint32_t)v);
    return cb_pattern_mix(h + 0x9e3779b9u + (uint32_t)(v >> 32));
}

static uint32_t seed_add_name(uint32_t h, const char *name)
{
    uint32_t fnv = 2166136261u; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)name; c && *c; c++)
        fnv = (fnv ^ *c) * 16777619u;
    return seed_add(h, fnv);
}

static uint32_t validation_seed(const struct cb_op *op, const struct cb_plan *plan, const struct cb_instance *inst,
                                const struct cb_selection *sel, int round, int extra)
{
    uint32_t h = seed_add_name(0x636f6d6du, op->name);
    h = seed_add(h, plan->requested_bytes);
    h = seed_add(h, ((uint64_t)(uint32_t)inst->src << 32) | (uint32_t)inst->dst);
    h = seed_add(h, ((uint64_t)(uint32_t)inst->dir << 32) | (uint32_t)inst->host_memory);
    h = seed_add_name(h, sel ? sel->name : "");
    h = seed_add(h, ((uint64_t)(uint32_t)round << 1) | (uint64_t)(extra != 0));
    return h;
}

/* The rank that misbehaves under --inject: the last one, the default ping-pong peer. */
static int inject_rank(const struct cb_ctx *ctx)
{
    return ctx->nranks - 1;
}

/* The rank whose received data --inject corrupt overwrites: a pair's receiver (--peer, a matrix pair: the
 * last rank may take no part), else the last one. */
static int corrupt_rank(const struct cb_ctx *ctx, const struct cb_instance *inst)
{
    return inst->dst >= 0 ? inst->dst : inject_rank(ctx);
}

static void error_record(struct run *run, const char *op, const char *transport, const struct cb_plan *plan,
                         const struct cb_instance *inst, int status, const char *msg)
{
    run->saw_error = 1;
    if (run->ctx->rank == 0)
        cb_emit_error(op, transport, plan, inst, status == CB_UNSUPPORTED ? CB_REASON_UNSUPPORTED : CB_REASON_RUNTIME,
                      msg);
}

static int prepare(struct run *run, const struct cb_op *op, const struct cb_plan *plan, const struct cb_instance *inst,
                   const struct cb_bufs *bufs, uint32_t seed, struct cb_data *d)
{
    const struct cb_backend *b = run->ctx->backend;
    int rc = CB_OK;
    op->data(run->ctx, plan, inst, seed, d);
    if (run->args->check && d->check && !d->fill_recv)
        rc = b->memset(bufs->recv_space, bufs->recv, 0xff, plan->recv_count * sizeof(float));
    if (!rc && d->fill_send)
        rc = b->fill(bufs->send_space, bufs->send, &d->send_input);
    if (!rc && d->fill_recv)
        rc = b->fill(bufs->recv_space, bufs->recv, &d->recv_input);
    return rc;
}

static int verify(struct run *run, const struct cb_instance *inst, const struct cb_data *d, const struct cb_bufs *bufs,
                  uint64_t *wrong)
{
    const struct cb_backend *b = run->ctx->backend;
    uint64_t w = 0;
    if (!d->check)
        return CB_OK;
    if (run->args->inject == CB_INJECT_CORRUPT && run->ctx->rank == corrupt_rank(run->ctx, inst) &&
        cb_pattern_count(&d->expect) > 0) {
        int rc = b->copy(bufs->recv, &corrupt_value, sizeof corrupt_value);
        if (rc)
            return rc;
    }
    int rc = b->count_wrong(bufs->recv_space, bufs->recv, &d->expect, &w);
    *wrong += w;
    return rc;
}

static void hang_forever(struct run *run)
{
    fprintf(stderr, "commbench: rank %d stops participating (--inject hang)\n", run->ctx->rank);
    for (;;)
        pause();
}

/* Collective: 1 when every rank's rc is CB_OK; otherwise rank 0 records the first failure. */
static int all_ok(struct run *run, int rc, const char *op, const char *transport, const struct cb_plan *plan,
                  const struct cb_instance *inst)
{
    char msg[CB_TEXT_MAX];
    snprintf(msg, sizeof msg, "%s", rc ? cb_last_error() : "");
    int status = cb_agree(rc ? CB_ERROR : CB_OK, msg, sizeof msg);
    if (status != CB_OK)
        error_record(run, op, transport, plan, inst, status, msg);
    return status == CB_OK;
}

/* samples: iters x rounds (rounds 0: not a selection sweep, one block of iters). */
static void emit(struct run *run, const struct cb_op *op, const struct cb_transport *t, const struct cb_plan *plan,
                 const struct cb_instance *inst, const double *samples, uint64_t wrong, int rounds,
                 const double *round_medians, const struct cb_rank_attribution *attribution)
{
    struct cb_result r = {.op = op->name,
                          .transport = t->name,
                          .plan = plan,
                          .inst = inst,
                          .samples_us = samples,
                          .iters = run->args->iters * (rounds ? rounds : 1),
                          .rounds = rounds,
                          .round_medians = round_medians,
                          .attribution = attribution,
                          .warmup = run->args->warmup,
                          .batch = run->args->batch,
                          .check = run->args->check,
                          .wrong = wrong};
    cb_stats_compute(samples, (size_t)r.iters, &r.stats);
    r.latency_us = r.stats.median;
    r.goodput_gbs = cb_gbps((double)plan->bytes, r.stats.median);
    r.algbw_gbs = r.goodput_gbs;
    r.busbw_factor = cb_busbw_factor(op->busbw, run->ctx->nranks);
    r.busbw_gbs = r.algbw_gbs * r.busbw_factor;
    r.aggregate_gbs = 2.0 * r.goodput_gbs;
    cb_emit_result(&r);
}

/* n operations back to back, then one wait for all of them (a no-op where every primitive
 * completes on return). After a failed issue nothing is awaited: the error decides. */
static int run_batch(const struct cb_op *op, const struct cb_exec *exec, int n)
{
    int rc = CB_OK;
    for (int k = 0; !rc && k < n; k++)
        rc = op->run(exec);
    if (!rc && exec->transport->complete)
        rc = exec->transport->complete(exec->state);
    return rc;
}

/* Warmup + timed samples of --batch operations each; samples[i] = this rank's time per operation
 * in timed sample i. Only the operations and their completion are timed, not the barrier. `rc`: this rank's
 * status before the loop (a selection or fill that failed here). Each sample starts with an agreement
 * (cb_barrier_all_ok), then the barrier whose release starts it: a failure on any rank stops every rank
 * there. Returns this rank's status (the caller's agreement names the failing rank); *complete: whether
 * every sample ran on every rank. */
static int timed_loop(struct run *run, const struct cb_op *op, const struct cb_exec *exec, double *samples, int rc,
                      int *complete)
{
    const struct cb_args *args = run->args;
    const struct cb_ctx *ctx = run->ctx;
    double divisor = (exec->inst->dir == CB_DIR_UNI ? 2.0 : 1.0) * args->batch; /* ping-pong: one-way time */
    int n = args->warmup + args->iters, i = 0;
    for (; i < n; i++) {
        int inject = i == args->warmup && !run->injected && ctx->rank == inject_rank(ctx);
        if (inject && args->inject == CB_INJECT_HANG)
            hang_forever(run);
        if (!cb_barrier_all_ok(&rc))
            break;
        /* the sample starts at a barrier's release, as it always did: an allreduce releases the ranks at other
         * times (3 ranks: a node that slowed no longer stood 2x apart from its ring neighbours) */
        rc = cb_barrier();
        double t0 = MPI_Wtime();
        if (!rc)
            rc = run_batch(op, exec, args->batch);
        double t1 = MPI_Wtime();
        if (inject && args->inject == CB_INJECT_FAIL && !rc) { /* as a GPU or library error on one rank */
            cb_errorf("injected failure of this rank's operation (--inject fail)");
            rc = CB_ERROR;
        }
        if (i >= args->warmup)
            samples[i - args->warmup] = (t1 - t0) * 1e6 / divisor;
    }
    run->injected = 1;
    *complete = i == n && !rc;
    return rc;
}

/* Rank 0's room for every rank's samples and what they say about who was slow; NULL members on
 * other ranks. */
struct gathered {
    double *all; /* nranks x iters */
    struct cb_rank_attribution attribution;
};

static int gathered_alloc(const struct cb_ctx *ctx, int iters, struct gathered *g)
{
    memset(g, 0, sizeof *g);
    g->attribution.nranks = ctx->nranks;
    g->attribution.iters = iters;
    if (ctx->rank != 0)
        return CB_OK;
    size_t n = (size_t)iters, ranks = (size_t)ctx->nranks;
    struct cb_rank_attribution *a = &g->attribution;
    g->all = malloc(ranks * n * sizeof *g->all);
    a->max_us = malloc(n * sizeof *a->max_us);
    a->excess_us = malloc(n * sizeof *a->excess_us);
    a->slowest_rank = malloc(n * sizeof *a->slowest_rank);
    a->rank_median_us = malloc(ranks * sizeof *a->rank_median_us);
    a->rank_p95_us = malloc(ranks * sizeof *a->rank_p95_us);
    a->slowest_count = malloc(ranks * sizeof *a->slowest_count);
    if (g->all && a->max_us && a->excess_us && a->slowest_rank && a->rank_median_us && a->rank_p95_us &&
        a->slowest_count)
        return CB_OK;
    cb_errorf("out of memory for %d ranks x %d samples", ctx->nranks, iters);
    return CB_ERROR;
}

static void gathered_free(struct gathered *g)
{
    struct cb_rank_attribution *a = &g->attribution;
    free(g->all);
    free(a->max_us);
    free(a->excess_us);
    free(a->slowest_rank);
    free(a->rank_median_us);
    free(a->rank_p95_us);
    free(a->slowest_count);
}

static void measure(struct run *run, const struct cb_transport *t, void *state, const struct cb_op *op,
                    const struct cb_instance *inst, const struct cb_bufs *bufs, size_t requested)
{
    const struct cb_ctx *ctx = run->ctx;
    const struct cb_args *args = run->args;
    struct cb_plan plan;
    struct cb_data data;
    struct gathered gathered;
    op->plan(ctx, requested, &plan);
    struct cb_exec exec = {.ctx = ctx, .transport = t, .state = state, .plan = &plan, .inst = inst};
    size_t n = (size_t)args->iters;
    double *samples = calloc(n, sizeof *samples);
    uint64_t wrong = 0, total_wrong = 0;
    int rc = gathered_alloc(ctx, args->iters, &gathered);
    if (!rc && !samples) {
        cb_errorf("out of memory for %d samples", args->iters);
        rc = CB_ERROR;
    }

    cb_watchdog_arm("measurement", op->name, t->name, &plan, inst);
    if (!rc)
        rc = prepare(run, op, &plan, inst, bufs, validation_seed(op, &plan, inst, NULL, 0, 0), &data);
    if (!all_ok(run, rc, op->name, t->name, &plan, inst))
        goto out;
    int complete;
    rc = timed_loop(run, op, &exec, samples, CB_OK, &complete);
    if (complete && args->check)
        rc = verify(run, inst, &data, bufs, &wrong);
    if (!all_ok(run, rc, op->name, t->name, &plan, inst))
        goto out;
    if (args->check) {
        rc = prepare(run, op, &plan, inst, bufs, validation_seed(op, &plan, inst, NULL, 0, 1), &data);
        if (cb_barrier_all_ok(&rc)) {
            rc = run_batch(op, &exec, 1);
            if (!rc)
                rc = verify(run, inst, &data, bufs, &wrong);
        }
        if (!all_ok(run, rc, op->name, t->name, &plan, inst))
            goto out;
    }
    /* Every rank's samples, not only their maximum: the record can then say which rank made each
     * iteration slow (after the timed loop, so it costs no measured time). */
    MPI_Gather(samples, args->iters, MPI_DOUBLE, gathered.all, args->iters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &total_wrong, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (ctx->rank == 0) {
        cb_rank_attribution_compute(gathered.all, &gathered.attribution);
        run->saw_wrong |= total_wrong != 0;
        emit(run, op, t, &plan, inst, gathered.attribution.max_us, total_wrong, 0, NULL, &gathered.attribution);
    }
out:
    cb_watchdog_step_done();
    free(samples);
    gathered_free(&gathered);
}

/* ---- Selection sweep (--selections): per size, every candidate in interleaved rounds. ---- */

struct sweep_cell {
    double *samples;        /* rank 0: rounds x iters, max over ranks */
    double *round_medians;  /* rank 0 */
    uint64_t wrong;         /* this rank's wrong elements, over all rounds and the extra check */
    int status;             /* CB_OK, or why the candidate dropped out (CB_UNSUPPORTED: refused) */
    struct cb_kv reported[CB_MAX_REPORTED]; /* what the library reported it used in the last round */
    int nreported;
    int stopped_after;      /* > 0: --stop-slower stopped it after this many rounds */
    int slower_rounds;      /* rank 0: its judged (even) rounds that took >= --stop-slower x own's time */
};

/* Selects sel (NULL: the library's own state again, and the candidates' resources released). */
static int select_candidate(const struct cb_transport *t, void *state, const struct cb_op *op,
                            const struct cb_selection *sel)
{
    if (!t->select || (sel && sel->mechanism == CB_MECH_PROCESS)) /* nothing to switch at run time */
        return CB_OK;
    return t->select(state, op, sel);
}

/* One (round, candidate) cell: select, fill, time, check. CB_UNSUPPORTED when the library refused
 * the forced choice for a call. */
static int sweep_round(struct run *run, const struct cb_op *op, const struct cb_exec *exec, const struct cb_selection *sel,
                       int round, const struct cb_bufs *bufs, double *samples, uint64_t *wrong)
{
    const struct cb_transport *t = exec->transport;
    struct cb_data data;
    int rc = select_candidate(t, exec->state, op, sel), complete;
    if (!rc)
        rc = prepare(run, op, exec->plan, exec->inst, bufs, validation_seed(op, exec->plan, exec->inst, sel, round, 0),
                     &data);
    /* a fill, or a selection past its own collective (Open MPI's communicator, made by every rank), that failed on
     * one rank stops every rank at the loop's first agreement */
    rc = timed_loop(run, op, exec, samples, rc, &complete);
    if (complete && run->args->check)
        rc = verify(run, exec->inst, &data, bufs, wrong);
    if (complete && !rc && t->refused)
        rc = t->refused(exec->state);
    return rc;
}

/* The extra check with fresh data, as measure() does, for one candidate. */
static int sweep_extra_check(struct run *run, const struct cb_op *op, const struct cb_exec *exec,
                             const struct cb_selection *sel, const struct cb_bufs *bufs, uint64_t *wrong)
{
    struct cb_data data;
    int rc = select_candidate(exec->transport, exec->state, op, sel);
    if (!rc)
        rc = prepare(run, op, exec->plan, exec->inst, bufs, validation_seed(op, exec->plan, exec->inst, sel, 0, 1),
                     &data);
    if (cb_barrier_all_ok(&rc)) {
        rc = run_batch(op, exec, 1);
        if (!rc)
            rc = verify(run, exec->inst, &data, bufs, wrong);
    }
    return rc;
}

/* Collective verdict on a cell; a failing candidate gets its error record and drops out. */
static int sweep_agree(struct run *run, const struct cb_op *op, const struct cb_exec *exec,
                       const struct cb_selection *sel, struct sweep_cell *cell, int rc)
{
    char msg[CB_TEXT_MAX];
    snprintf(msg, sizeof msg, "%s", rc ? cb_last_error() : "");
    int status = cb_agree(rc == CB_UNSUPPORTED ? CB_UNSUPPORTED : rc ? CB_ERROR : CB_OK, msg, sizeof msg);
    if (status == CB_OK)
        return CB_OK;
    struct cb_selection_record rec = {.sel = sel, .available = status != CB_UNSUPPORTED, .reason = msg};
    cb_record_selection(&rec);
    if (status == CB_UNSUPPORTED && run->ctx->rank == 0) /* a refused selection is data, not a failed run */
        cb_emit_error(op->name, exec->transport->name, exec->plan, exec->inst, CB_REASON_UNSUPPORTED, msg);
    else if (status != CB_UNSUPPORTED)
        error_record(run, op->name, exec->transport->name, exec->plan, exec->inst, status, msg);
    cb_record_selection(NULL);
    cell->status = status;
    return status;
}

/* --stop-slower F --stop-after K: once rounds 0 .. 2K-2 are done, a selection that took at least F times the
 * library's own choice's time (same round, so paired) in all but at most one of the K even-indexed rounds
 * 0, 2, ..., 2K-2 runs no further rounds. Only even rounds judge: a per-size stage picks its candidates on
 * them and confirms on the odd ones, which must play no part in which selections remain. One of the K may be
 * below F: a stall of own's (a 100x round happens on loaded TCP nodes) must not save a selection slower in
 * all others. Such selections are the sweep's costliest cells (Open MPI's segmented_ring with 8 KiB segments:
 * 5.7 s a call where own took 56 ms). Rank 0 holds the round medians and decides; every rank learns the verdict. */
static void stop_slow_selections(struct run *run, struct sweep_cell *cells, int n, int done)
{
    int stopped[CB_MAX_SELECTIONS] = {0};
    int judged = run->args->stop_after;
    for (int s = 1; run->ctx->rank == 0 && !cells[0].status && s < n; s++) {
        if (cells[s].status)
            continue;
        int slower = 0;
        for (int r = 0; r < 2 * judged; r += 2)
            slower += cells[s].round_medians[r] >= run->args->stop_slower * cells[0].round_medians[r];
        cells[s].slower_rounds = slower;
        stopped[s] = slower >= judged - 1;
    }
    MPI_Bcast(stopped, n, MPI_INT, 0, MPI_COMM_WORLD);
    for (int s = 1; s < n; s++)
        if (stopped[s])
            cells[s].stopped_after = done;
}

static void sweep_size(struct run *run, const struct cb_exec *exec, const struct cb_op *op, const struct cb_bufs *bufs,
                       const struct cb_selection *sels, int n, const char *process_reason)
{
    const struct cb_args *args = run->args;
    const struct cb_transport *t = exec->transport;
    int iters = args->iters, rounds = args->rounds, root = run->ctx->rank == 0;
    struct sweep_cell *cells = calloc((size_t)n, sizeof *cells);
    double *mine = calloc((size_t)iters, sizeof *mine);
    int rc = cells && mine ? CB_OK : CB_ERROR;
    for (int s = 0; !rc && root && s < n; s++) {
        cells[s].samples = calloc((size_t)iters * (size_t)rounds, sizeof(double));
        cells[s].round_medians = calloc((size_t)rounds, sizeof(double));
        rc = cells[s].samples && cells[s].round_medians ? CB_OK : CB_ERROR;
    }
    if (rc)
        cb_errorf("out of memory for %d selections x %d rounds x %d samples", n, rounds, iters);
    if (!all_ok(run, rc, op->name, t->name, exec->plan, exec->inst))
        goto out;
    for (int r = 0; r < rounds; r++) {
        if (args->stop_slower > 0 && r == 2 * args->stop_after - 1) /* rounds 0 .. 2K-2 done */
            stop_slow_selections(run, cells, n, r);
        for (int s = 0; s < n; s++) {
            if (cells[s].status || cells[s].stopped_after)
                continue;
            struct cb_selection_record current = {.sel = &sels[s], .available = 1, .reason = process_reason};
            cb_record_selection(&current); /* a watchdog timeout record names the selection */
            cb_watchdog_arm("selection sweep", op->name, t->name, exec->plan, exec->inst);
            rc = sweep_round(run, op, exec, &sels[s], r, bufs, mine, &cells[s].wrong);
            if (sweep_agree(run, op, exec, &sels[s], &cells[s], rc) == CB_OK) {
                double *block = root ? cells[s].samples + (size_t)r * (size_t)iters : NULL;
                MPI_Reduce(mine, block, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
                if (root) {
                    struct cb_stats st;
                    cb_stats_compute(block, (size_t)iters, &st);
                    cells[s].round_medians[r] = st.median;
                    if (t->reported)
                        cells[s].nreported = t->reported(exec->state, cells[s].reported, CB_MAX_REPORTED);
                }
            }
            cb_watchdog_step_done();
            cb_record_selection(NULL);
        }
    }
    for (int s = 0; s < n; s++) {
        if (cells[s].status)
            continue;
        cb_watchdog_arm("selection sweep check", op->name, t->name, exec->plan, exec->inst);
        if (args->check)
            sweep_agree(run, op, exec, &sels[s], &cells[s],
                        sweep_extra_check(run, op, exec, &sels[s], bufs, &cells[s].wrong));
        cb_watchdog_step_done();
        if (cells[s].status)
            continue;
        uint64_t total_wrong = 0;
        MPI_Reduce(&cells[s].wrong, &total_wrong, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
        if (root) {
            char stopped[CB_TEXT_MAX];
            if (cells[s].stopped_after)
                snprintf(stopped, sizeof stopped,
                         "stopped after %d rounds: in %d of the even-indexed rounds 0 .. %d it took at least %g "
                         "times the library's own choice's time (--stop-slower, --stop-after)",
                         cells[s].stopped_after, cells[s].slower_rounds, 2 * args->stop_after - 2, args->stop_slower);
            struct cb_selection_record rec = {.sel = &sels[s], .available = 1,
                                              .reason = cells[s].stopped_after ? stopped : process_reason,
                                              .reported = cells[s].reported, .nreported = cells[s].nreported,
                                              .stopped_after = cells[s].stopped_after};
            run->saw_wrong |= total_wrong != 0;
            cb_record_selection(&rec);
            emit(run, op, t, exec->plan, exec->inst, cells[s].samples, total_wrong,
                 cells[s].stopped_after ? cells[s].stopped_after : rounds, cells[s].round_medians, NULL);
            cb_record_selection(NULL);
        }
    }
out:
    for (int s = 0; cells && s < n; s++) {
        free(cells[s].samples);
        free(cells[s].round_medians);
    }
    free(cells);
    free(mine);
}

/* The candidates of op on t, own first, filtered by --selections LIST. Returns how many, or 0
 * after an error record. A library without a run-time switch gives "own" alone, mechanism
 * process, with the reason in process_reason. Kept candidates move to the front in the order
 * named; a name is looked for among those not kept yet, so one named twice (which cb_args_parse
 * refuses) is kept once and never moves a block backwards. */
static int sweep_candidates(struct run *run, const struct cb_transport *t, void *state, const struct cb_op *op,
                            struct cb_selection *sels, char *process_reason, size_t reason_len)
{
    const struct cb_args *args = run->args;
    char msg[CB_TEXT_MAX] = "";
    int n = 0;
    if (t->selections) {
        n = t->selections(state, op, sels, CB_MAX_SELECTIONS);
        if (n <= 0)
            snprintf(msg, sizeof msg, "%s", cb_last_error());
    } else {
        snprintf(msg, sizeof msg, "transport %s has no run-time selection", t->name);
    }
    int status = cb_agree(n < 0 ? CB_UNSUPPORTED : CB_OK, msg, sizeof msg);
    if (status != CB_OK) {
        error_record(run, op->name, t->name, NULL, NULL, status, msg);
        return 0;
    }
    process_reason[0] = '\0';
    if (n == 0) {
        memset(&sels[0], 0, sizeof sels[0]);
        snprintf(sels[0].name, sizeof sels[0].name, "own");
        sels[0].mechanism = CB_MECH_PROCESS;
        sels[0].value = sels[0].segsize = sels[0].algorithm = sels[0].protocol = sels[0].channels = -1;
        snprintf(process_reason, reason_len, "%s", msg);
        n = 1;
    }
    if (args->selections_all)
        return n;
    int kept = 1; /* own always */
    for (int k = 0; k < args->nselection_names; k++) {
        int found = strcmp(args->selection_names[k], "own") == 0;
        for (int s = 1; s < kept && !found; s++)
            found = strcmp(sels[s].name, args->selection_names[k]) == 0;
        for (int s = kept; s < n && !found; s++)
            if (strcmp(sels[s].name, args->selection_names[k]) == 0) {
                struct cb_selection keep = sels[s];
                memmove(&sels[kept + 1], &sels[kept], (size_t)(s - kept) * sizeof *sels);
                sels[kept++] = keep;
                found = 1;
            }
        if (!found) {
            int len = snprintf(msg, sizeof msg, "--selections: %s offers no selection '%s' for %s (known: own",
                               t->name, args->selection_names[k], op->name);
            for (int s = 1; s < n && len > 0 && (size_t)len < sizeof msg; s++)
                len += snprintf(msg + len, sizeof msg - (size_t)len, ", %s", sels[s].name);
            if (len > 0 && (size_t)len < sizeof msg)
                snprintf(msg + len, sizeof msg - (size_t)len, ")");
            error_record(run, op->name, t->name, NULL, NULL, CB_UNSUPPORTED, msg);
            return 0;
        }
    }
    return kept;
}

/* Whether t takes size's count per call for op (MPI counts are ints); if not, why, into why. */
static int size_fits(const struct run *run, const struct cb_transport *t, const struct cb_op *op, uint64_t size,
                     char *why, size_t len)
{
    struct cb_plan plan;
    op->plan(run->ctx, size, &plan);
    if (!t->max_count || plan.arg_count <= t->max_count)
        return 1;
    snprintf(why, len, "size %llu B: op %s passes %zu elements per call at %d ranks; transport %s takes at most %zu",
             (unsigned long long)size, op->name, plan.arg_count, run->ctx->nranks, t->name, t->max_count);
    return 0;
}

/* Largest send and receive buffers any size needs that t takes (the others are never allocated). */
static void max_plan(const struct run *run, const struct cb_transport *t, const struct cb_op *op, struct cb_plan *max)
{
    char why[CB_TEXT_MAX];
    memset(max, 0, sizeof *max);
    for (int s = 0; s < run->args->nsizes; s++) {
        struct cb_plan p;
        if (!size_fits(run, t, op, run->args->sizes[s], why, sizeof why))
            continue;
        op->plan(run->ctx, run->args->sizes[s], &p);
        if (p.send_count > max->send_count)
            max->send_count = p.send_count;
        if (p.recv_count > max->recv_count)
            max->recv_count = p.recv_count;
        if (p.requested_bytes > max->requested_bytes) {
            max->requested_bytes = p.requested_bytes;
            max->bytes = p.bytes;
        }
    }
}

static void release_buffers(struct run *run, const struct cb_transport *t, void *state, const struct cb_op *op,
                            struct cb_bufs *bufs, int attached)
{
    const struct cb_backend *b = run->ctx->backend;
    cb_watchdog_arm("buffer teardown", op->name, t->name, NULL, NULL);
    if (attached)
        t->detach(state);
    if (bufs->send)
        b->release(bufs->send_space, bufs->send);
    if (bufs->recv)
        b->release(bufs->recv_space, bufs->recv);
    memset(bufs, 0, sizeof *bufs);
    cb_watchdog_step_done();
}

/* Allocates and attaches buffers for inst; on failure every rank has released them. */
static int acquire_buffers(struct run *run, const struct cb_transport *t, void *state, const struct cb_op *op,
                           const struct cb_instance *inst, struct cb_bufs *bufs)
{
    const struct cb_backend *b = run->ctx->backend;
    struct cb_plan max;
    char msg[CB_TEXT_MAX] = "";
    max_plan(run, t, op, &max);
    bufs->send_space = inst->send_space;
    bufs->recv_space = inst->recv_space;
    bufs->send_bytes = (max.send_count ? max.send_count : 1) * sizeof(float);
    bufs->recv_bytes = (max.recv_count ? max.recv_count : 1) * sizeof(float);
    cb_watchdog_arm("buffer setup", op->name, t->name, &max, inst);
    bufs->send = b->alloc(bufs->send_space, bufs->send_bytes);
    bufs->recv = bufs->send ? b->alloc(bufs->recv_space, bufs->recv_bytes) : NULL;
    int rc = bufs->send && bufs->recv ? CB_OK : CB_ERROR;
    if (rc)
        snprintf(msg, sizeof msg, "%s", cb_last_error());
    int status = cb_agree(rc, msg, sizeof msg);
    int attached = 0;
    if (status == CB_OK) {
        rc = t->attach(state, bufs);
        attached = 1; /* detach is collective and undoes a partial attach too */
        if (rc)
            snprintf(msg, sizeof msg, "%s", cb_last_error());
        status = cb_agree(rc, msg, sizeof msg);
    }
    if (status != CB_OK) {
        error_record(run, op->name, t->name, &max, inst, status, msg);
        release_buffers(run, t, state, op, bufs, attached);
    }
    cb_watchdog_step_done();
    return status;
}

static void run_op(struct run *run, const struct cb_transport *t, void *state, const struct cb_op *op)
{
    const struct cb_ctx *ctx = run->ctx;
    /* Sizes t cannot take for op: an `unsupported` record each, and neither buffers nor runs (a transport
     * named in --transport refused them up front: sizes_fit). The same verdict on every rank. */
    int fitting = 0;
    unsigned char fits[CB_MAX_SIZES];
    for (int s = 0; s < run->args->nsizes; s++) {
        char why[CB_TEXT_MAX];
        fits[s] = (unsigned char)size_fits(run, t, op, run->args->sizes[s], why, sizeof why);
        fitting += fits[s];
        if (!fits[s]) {
            struct cb_plan plan;
            op->plan(ctx, run->args->sizes[s], &plan);
            error_record(run, op->name, t->name, &plan, NULL, CB_UNSUPPORTED, why);
        }
    }
    if (!fitting)
        return;
    struct cb_instance plain = {.src = -1, .dst = -1, .dir = CB_DIR_NONE, .host_memory = -1};
    struct cb_instance *insts = &plain;
    int n = 1;
    if (op->instances) {
        n = op->instances(ctx, NULL, 0);
        if (n == 0) {
            error_record(run, op->name, t->name, NULL, NULL, CB_UNSUPPORTED, cb_last_error());
            return;
        }
        insts = calloc((size_t)n, sizeof *insts);
        if (!insts) {
            error_record(run, op->name, t->name, NULL, NULL, CB_ERROR, "out of memory for instances");
            return;
        }
        op->instances(ctx, insts, n);
    }
    struct cb_selection *sels = NULL;
    char process_reason[CB_TEXT_MAX];
    int nsels = 0;
    if (run->args->selections) {
        sels = calloc(CB_MAX_SELECTIONS, sizeof *sels);
        nsels = sels ? sweep_candidates(run, t, state, op, sels, process_reason, sizeof process_reason) : 0;
        if (!nsels) {
            if (!sels)
                error_record(run, op->name, t->name, NULL, NULL, CB_ERROR, "out of memory for selections");
            n = 0;
        }
    }
    struct cb_bufs bufs = {0};
    int have = 0;
    for (int i = 0; i < n; i++) {
        /* Instances with the same memory spaces share buffers (and IPC registrations). */
        if (have && (bufs.send_space != insts[i].send_space || bufs.recv_space != insts[i].recv_space)) {
            release_buffers(run, t, state, op, &bufs, 1);
            have = 0;
        }
        if (!have && acquire_buffers(run, t, state, op, &insts[i], &bufs) != CB_OK)
            continue;
        have = 1;
        for (int s = 0; s < run->args->nsizes; s++) {
            if (!fits[s])
                continue;
            if (!sels) {
                measure(run, t, state, op, &insts[i], &bufs, run->args->sizes[s]);
                continue;
            }
            struct cb_plan plan;
            op->plan(ctx, run->args->sizes[s], &plan);
            struct cb_exec exec = {.ctx = ctx, .transport = t, .state = state, .plan = &plan, .inst = &insts[i]};
            sweep_size(run, &exec, op, &bufs, sels, nsels, process_reason[0] ? process_reason : NULL);
        }
    }
    if (sels && nsels && sels[0].mechanism != CB_MECH_PROCESS) /* the library's own state again */
        select_candidate(t, state, op, NULL);
    free(sels);
    if (have)
        release_buffers(run, t, state, op, &bufs, 1);
    if (insts != &plain)
        free(insts);
}

static int covers(const struct cb_transport *t, const struct cb_op *op)
{
    return (t->caps & op->needs) == op->needs;
}

/* The ops t runs: the asked ones it implements (without --transport the others are not an error), or
 * without --op every op it implements (in a sweep, those with selections). At most CB_MAX_NAMES:
 * --op names are distinct (cb_args_parse) and the table holds fewer ops. */
static int ops_of(const struct cb_args *args, const struct cb_transport *t, const struct cb_op **out)
{
    int n = 0;
    for (int i = 0; i < args->nops; i++)
        if (covers(t, cb_find_op(args->ops[i])))
            out[n++] = cb_find_op(args->ops[i]);
    for (int i = 0; !args->nops && cb_ops[i] && n < CB_MAX_NAMES; i++)
        if (covers(t, cb_ops[i]) && (!args->selections || cb_op_has_selections(cb_ops[i])))
            out[n++] = cb_ops[i];
    return n;
}

static void run_transport(struct run *run, const struct cb_transport *t)
{
    const struct cb_args *args = run->args;
    const struct cb_op *selected[CB_MAX_NAMES];
    for (int i = 0; args->ntransports && i < args->nops; i++) /* a transport asked by name answers for every op */
        if (!covers(t, cb_find_op(args->ops[i]))) {
            char msg[CB_TEXT_MAX];
            snprintf(msg, sizeof msg, "transport %s does not implement op %s", t->name, args->ops[i]);
            error_record(run, args->ops[i], t->name, NULL, NULL, CB_UNSUPPORTED, msg);
        }
    int n = ops_of(args, t, selected);
    if (!n)
        return;

    void *state = NULL;
    char msg[CB_TEXT_MAX] = "";
    cb_watchdog_arm("transport setup", selected[0]->name, t->name, NULL, NULL);
    int rc = t->open(run->ctx, &state);
    if (rc)
        snprintf(msg, sizeof msg, "%s", cb_last_error());
    int status = cb_agree(rc, msg, sizeof msg);
    cb_watchdog_step_done();
    if (status != CB_OK) {
        if (rc == CB_OK)
            t->close(state); /* opened here, failed elsewhere */
        for (int i = 0; i < n; i++)
            error_record(run, selected[i]->name, t->name, NULL, NULL, status, msg);
        return;
    }
    for (int i = 0; i < n; i++) {
        char why[CB_TEXT_MAX] = "";
        unsigned usable = t->usable_caps ? t->usable_caps(state, why, sizeof why) : t->caps;
        if ((usable & selected[i]->needs) == selected[i]->needs)
            run_op(run, t, state, selected[i]);
        else
            error_record(run, selected[i]->name, t->name, NULL, NULL, CB_UNSUPPORTED, why);
    }
    cb_watchdog_arm("transport teardown", selected[n - 1]->name, t->name, NULL, NULL);
    t->close(state);
    cb_watchdog_step_done();
}

/* A transport named in --transport must take every size: one it cannot (its count per call exceeds the
 * transport's, MPI counts are ints) is refused before any buffer is allocated and filled, as bad arguments
 * (found in the first warm-up it cost the largest buffers first). A transport not named runs the sizes it
 * takes; run_op answers the others with `unsupported` records (a GPU build's staging and mpi must not keep
 * ccl, d2d and d2d-kernel from an 8 GiB allreduce). */
static int sizes_fit(const struct run *run, const struct cb_transport *t)
{
    const struct cb_args *args = run->args;
    const struct cb_op *ops[CB_MAX_NAMES];
    int n = t->max_count ? ops_of(args, t, ops) : 0;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < args->nsizes; s++) {
            char why[CB_TEXT_MAX];
            if (size_fits(run, t, ops[i], args->sizes[s], why, sizeof why))
                continue;
            if (run->ctx->rank == 0)
                fprintf(stderr, "commbench: %s (give smaller sizes)\n", why);
            return 0;
        }
    return 1;
}

int cb_run_all(const struct cb_ctx *ctx)
{
    struct run run = {.ctx = ctx, .args = ctx->args};
    const struct cb_args *args = ctx->args;
    const struct cb_transport *transports[CB_MAX_NAMES]; /* --transport names are distinct; the table is shorter */
    int nt = 0;
    for (int i = 0; i < args->ntransports; i++)
        transports[nt++] = cb_find_transport(args->transports[i]);
    for (int i = 0; !args->ntransports && cb_transports[i] && nt < CB_MAX_NAMES; i++)
        if (cb_transports[i]->backends & cb_backend_bit())
            transports[nt++] = cb_transports[i];
    for (int i = 0; i < args->ntransports; i++) /* those named; the others answer with records (run_op) */
        if (!sizes_fit(&run, transports[i]))
            return CB_EXIT_USAGE; /* the same verdict on every rank: sizes and plans are alike */
    for (int i = 0; i < nt; i++)
        run_transport(&run, transports[i]);
    if (!args->ntransports) {
        for (int k = 0; k < args->nops; k++) { /* an op that no transport of this build implements */
            const struct cb_op *op = cb_find_op(args->ops[k]);
            int found = 0;
            for (int i = 0; cb_transports[i] && !found; i++)
                found = (cb_transports[i]->backends & cb_backend_bit()) && covers(cb_transports[i], op);
            if (!found) {
                char msg[CB_TEXT_MAX];
                snprintf(msg, sizeof msg, "no transport of the %s backend implements op %s", ctx->backend->name,
                         op->name);
                error_record(&run, op->name, "none", NULL, NULL, CB_UNSUPPORTED, msg);
            }
        }
    }
    /* Wrong data outranks errors; rank 0 knows both, every rank exits with its verdict. */
    int code = run.saw_wrong ? CB_EXIT_VALIDATION : run.saw_error ? CB_EXIT_RUNTIME : CB_EXIT_OK;
    if (args->inject == CB_INJECT_CRASH && ctx->rank == 0) {
        (void)cb_output_close(); /* its records are written; the others now wait for the verdict */
        raise(SIGSEGV);
    }
    MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return code;
}
