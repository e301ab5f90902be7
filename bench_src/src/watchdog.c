#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
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
static int running, stopping;
static struct timespec deadline;
static double timeout_s;
static const struct cb_ctx *wd_ctx;
static struct {
    char phase[64], op[64], transport[64];
    int has_plan, has_inst;
    struct cb_plan plan;
    struct cb_instance inst;
} step;

static void exit_timeout(int sig)
{
    (void)sig;
    _exit(CB_EXIT_TIMEOUT);
}

static void fire(void)
{
    char msg[CB_TEXT_MAX], size[64] = "";
    if (step.has_plan)
        snprintf(size, sizeof size, ", %zu bytes", step.plan.bytes);
    snprintf(msg, sizeof msg, "no progress for %g s during %s of op %s, transport %s%s (rank %d's watchdog)", timeout_s,
             step.phase, step.op, step.transport, size, wd_ctx->rank);
    fprintf(stderr, "commbench: TIMEOUT: %s; exiting with code %d\n", msg, CB_EXIT_TIMEOUT);
    fflush(stderr);
    if (wd_ctx->rank == 0) {
        /* MPI_Abort from this thread while the main thread is inside MPI may itself block, and so may the
         * record (the main thread can hold the record lock in a write to a FIFO nobody reads): exit anyway. */
        signal(SIGALRM, exit_timeout);
        alarm(2 * CB_WATCHDOG_GRACE_S);
        /* No record before the record fields exist (start-up, --list-cvars): cb_emit_error then writes none. */
        cb_emit_error(step.op, step.transport, step.has_plan ? &step.plan : NULL, step.has_inst ? &step.inst : NULL,
                      CB_REASON_TIMEOUT, msg);
        cb_abort(CB_EXIT_TIMEOUT); /* the launcher then ends the job with this code */
    }
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
        int rc = pthread_cond_timedwait(&wake, &lock, &deadline);
        if (!stopping && (rc == ETIMEDOUT || passed(&deadline))) {
            pthread_mutex_unlock(&lock); /* emitting takes the record lock, never this one */
            fire();
        }
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* A crash (a rank's own bug, or a library's) is said on stderr before the process dies of it, with the
 * rank and host: the first failure of a job, which the launcher alone would report without the rank. */
static char crash_line[CB_TEXT_MAX];
static size_t crash_prefix_len;
static const struct {
    int sig;
    const char *name;
} fatal_signals[] = {{SIGSEGV, "Segmentation fault"},
                     {SIGBUS, "Bus error"},
                     {SIGFPE, "Floating point exception"},
                     {SIGILL, "Illegal instruction"},
                     {SIGABRT, "Aborted"}};

static void report_crash(int sig) /* async-signal-safe: a preformatted line, write(2), the default action */
{
    size_t n = crash_prefix_len;
    char digits[12];
    int k = 0;
    for (int v = sig; k == 0 || v; v /= 10)
        digits[k++] = (char)('0' + v % 10);
    while (k && n < sizeof crash_line - 1)
        crash_line[n++] = digits[--k];
    const char *name = "";
    for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
        if (fatal_signals[i].sig == sig)
            name = fatal_signals[i].name;
    const char *tail[] = {" (", name, ")\n"};
    for (size_t i = 0; i < 3; i++)
        for (const char *c = tail[i]; *c && n < sizeof crash_line - 1; c++)
            crash_line[n++] = *c;
    ssize_t unused = write(STDERR_FILENO, crash_line, n);
    (void)unused;
    raise(sig); /* SA_RESETHAND: the default action now, so the launcher sees the signal */
}

static void install_crash_report(const struct cb_ctx *ctx)
{
    int n = snprintf(crash_line, sizeof crash_line, "commbench: rank %d on %s: crashed with signal ", ctx->rank,
                     ctx->hosts ? ctx->hosts[ctx->rank] : "?");
    crash_prefix_len = n > 0 && (size_t)n < sizeof crash_line ? (size_t)n : 0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = report_crash;
    action.sa_flags = (int)(SA_RESETHAND | SA_NODEFER);
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
        sigaction(fatal_signals[i].sig, &action, NULL);
}

static void set_step(const char *phase, const char *op, const char *transport, const struct cb_plan *plan,
                     const struct cb_instance *inst) /* with the lock held */
{
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
    pthread_cond_signal(&wake);
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
    install_crash_report(ctx);
    pthread_mutex_lock(&lock);
    set_step("start-up", "none", "none", NULL, NULL);
    pthread_mutex_unlock(&lock);
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
    set_step(phase, op, transport, plan, inst);
    pthread_mutex_unlock(&lock);
}

void cb_watchdog_step_done(void)
{
    pthread_mutex_lock(&lock);
    char op[sizeof step.op], transport[sizeof step.transport];
    snprintf(op, sizeof op, "%s", step.op);
    snprintf(transport, sizeof transport, "%s", step.transport);
    set_step("the exchange between steps", op, transport, NULL, NULL);
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
