/* Per-rank watchdog thread: if a step makes no progress for --timeout seconds, rank 0 writes an
 * error record (reason "timeout") naming the step, every rank reports on stderr, and the process
 * exits with CB_EXIT_TIMEOUT so the launcher tears the job down. The clock runs from start to stop,
 * between steps too: a rank whose peer died waits in MPI, and must still end. A crash (fatal signal)
 * is reported on stderr with the rank and host before the process dies of it. */
#ifndef COMMBENCH_WATCHDOG_H
#define COMMBENCH_WATCHDOG_H

#include "commbench.h"

int cb_watchdog_start(const struct cb_ctx *ctx, double timeout_s);
/* Starts the clock for one step; plan and inst may be NULL (they are copied). */
void cb_watchdog_arm(const char *phase, const char *op, const char *transport, const struct cb_plan *plan,
                     const struct cb_instance *inst);
/* Ends a step: the clock restarts for the collectives between steps. */
void cb_watchdog_step_done(void);
void cb_watchdog_stop(void);

#endif
