#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "record.h"

/* Other ranks give rank 0 this long to write its record before the launcher sees them exit. */
#define CB_WATCHDOG_GRACE_S 2

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake;
static pthread_t thread;
static int running, armed, stopping;
static struct timespec deadline;
static double timeout_s;
static const struct cb_ctx *wd_ctx;
static struct {
    char phase[64], op[64], transport[64];
    int has_plan, has_inst;
    struct cb_plan plan;
    struct cb_instance inst;
} step;

static void fire(void)
{
    char msg[CB_TEXT_MAX], size[64] = "";
    if (step.has_plan)
        snprintf(size, sizeof size, ", %zu bytes", step.plan.bytes);
    snprintf(msg, sizeof msg, "no progress for %g s during %s of op %s, transport %s%s (rank %d's watchdog)", timeout_s,
             step.phase, step.op, step.transport, size, wd_ctx->rank);
    if (wd_ctx->rank == 0)
        cb_emit_error(step.op, step.transport, step.has_plan ? &step.plan : NULL, step.has_inst ? &step.inst : NULL,
                      CB_REASON_TIMEOUT, msg);
    fprintf(stderr, "commbench: TIMEOUT: %s; exiting with code %d\n", msg, CB_EXIT_TIMEOUT);
    fflush(stderr);
    if (wd_ctx->rank == 0)
        cb_abort(CB_EXIT_TIMEOUT); /* the launcher then ends the job with this code */
    sleep(CB_WATCHDOG_GRACE_S);
    _exit(CB_EXIT_TIMEOUT);
}

static int passed(const struct timespec *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

static void *watch(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&lock);
    while (!stopping) {
        if (!armed) {
            pthread_cond_wait(&wake, &lock);
            continue;
        }
        int rc = pthread_cond_timedwait(&wake, &lock, &deadline);
        if (armed && !stopping && (rc == ETIMEDOUT || passed(&deadline))) {
            pthread_mutex_unlock(&lock); /* emitting takes the record lock, never this one */
            fire();
        }
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

int cb_watchdog_start(const struct cb_ctx *ctx, double seconds)
{
    pthread_condattr_t attr;
    wd_ctx = ctx;
    timeout_s = seconds;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&wake, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&thread, NULL, watch, NULL) != 0) {
        cb_errorf("cannot start the watchdog thread");
        return CB_ERROR;
    }
    running = 1;
    return CB_OK;
}

void cb_watchdog_arm(const char *phase, const char *op, const char *transport, const struct cb_plan *plan,
                     const struct cb_instance *inst)
{
    pthread_mutex_lock(&lock);
    snprintf(step.phase, sizeof step.phase, "%s", phase);
    snprintf(step.op, sizeof step.op, "%s", op);
    snprintf(step.transport, sizeof step.transport, "%s", transport);
    step.has_plan = plan != NULL;
    if (plan)
        step.plan = *plan;
    step.has_inst = inst != NULL;
    if (inst)
        step.inst = *inst;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double whole = (double)(long)timeout_s;
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    armed = 1;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&lock);
}

void cb_watchdog_disarm(void)
{
    pthread_mutex_lock(&lock);
    armed = 0;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&lock);
}

void cb_watchdog_stop(void)
{
    if (!running)
        return;
    pthread_mutex_lock(&lock);
    stopping = 1;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&lock);
    pthread_join(thread, NULL);
    running = 0;
}
