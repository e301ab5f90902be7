#ifndef COMMBENCH_DRIVER_H
#define COMMBENCH_DRIVER_H

#include "commbench.h"

/* Runs every selected transport x op x instance x size; returns the process exit code. */
int cb_run_all(const struct cb_ctx *ctx);

#endif
