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

/* Who made each iteration slow (the run that saw a slowdown names its suspects, issue: health at
 * scale). From every rank's local time of every iteration, all[rank * iters + i]:
 * max_us[i] is the recorded time (max over ranks, as MPI_MAX gives), slowest_rank[i] its rank,
 * excess_us[i] how far it was above the median rank of that iteration; per rank: the median and p95
 * of its local times and in how many iterations it was the slowest. Arrays allocated by the caller:
 * iters for the per-iteration ones, nranks for the per-rank ones. */
struct cb_rank_attribution {
    int nranks, iters;
    double *max_us, *excess_us;
    int *slowest_rank;
    double *rank_median_us, *rank_p95_us;
    int *slowest_count;
};
void cb_rank_attribution_compute(const double *all, struct cb_rank_attribution *out);

/* GB/s (1e9 bytes/s) for bytes moved in time_us; 0 when time_us is not positive. */
double cb_gbps(double bytes, double time_us);

#endif
