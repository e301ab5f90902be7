/* Statistics over per-iteration samples and nccl-tests bandwidth conventions. */
#ifndef COMMBENCH_STATS_H
#define COMMBENCH_STATS_H

#include <stddef.h>

#include "commbench.h"

struct cb_stats {
    double min, median, mean, p95, max, stdev;
};

/* n >= 1. median: mean of the two middle samples for even n; p95: linear interpolation between
 * the closest ranks (position 0.95*(n-1) in sorted order, numpy's default); stdev: sample
 * standard deviation (n-1 denominator), 0 for n == 1. */
void cb_stats_compute(const double *samples, size_t n, struct cb_stats *out);

/* nccl-tests busbw factor: allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n;
 * bcast, sendrecv 1. */
double cb_busbw_factor(enum cb_busbw kind, int nranks);

/* GB/s (1e9 bytes/s) for bytes moved in time_us; 0 when time_us is not positive. */
double cb_gbps(double bytes, double time_us);

#endif
