#include "stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void cb_stats_compute(const double *samples, size_t n, struct cb_stats *out)
{
    double *sorted = malloc(n * sizeof *sorted);
    double sum = 0.0;
    if (!sorted)
        abort();
    memcpy(sorted, samples, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, compare_double);
    for (size_t i = 0; i < n; i++)
        sum += sorted[i];
    out->min = sorted[0];
    out->max = sorted[n - 1];
    out->mean = sum / (double)n;
    out->median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    double pos = 0.95 * (double)(n - 1);
    size_t lo = (size_t)pos;
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    out->p95 = sorted[lo] + (pos - (double)lo) * (sorted[hi] - sorted[lo]);
    double squares = 0.0;
    for (size_t i = 0; i < n; i++)
        squares += (sorted[i] - out->mean) * (sorted[i] - out->mean);
    out->stdev = n > 1 ? sqrt(squares / (double)(n - 1)) : 0.0;
    free(sorted);
}

void cb_rank_attribution_compute(const double *all, struct cb_rank_attribution *out)
{
    int nranks = out->nranks, iters = out->iters;
    double *column = malloc((size_t)(nranks > iters ? nranks : iters) * sizeof *column);
    struct cb_stats stats;
    if (!column)
        abort();
    for (int r = 0; r < nranks; r++)
        out->slowest_count[r] = 0;
    for (int i = 0; i < iters; i++) {
        int slowest = 0;
        for (int r = 0; r < nranks; r++) {
            column[r] = all[(size_t)r * (size_t)iters + (size_t)i];
            if (column[r] > column[slowest])
                slowest = r; /* ties: the lowest rank, as MPI_MAXLOC */
        }
        cb_stats_compute(column, (size_t)nranks, &stats);
        out->max_us[i] = column[slowest];
        out->slowest_rank[i] = slowest;
        out->excess_us[i] = column[slowest] - stats.median;
        out->slowest_count[slowest]++;
    }
    for (int r = 0; r < nranks; r++) {
        cb_stats_compute(all + (size_t)r * (size_t)iters, (size_t)iters, &stats);
        out->rank_median_us[r] = stats.median;
        out->rank_p95_us[r] = stats.p95;
    }
    free(column);
}

double cb_busbw_factor(enum cb_busbw kind, int nranks)
{
    double n = (double)nranks;
    switch (kind) {
    case CB_BUSBW_ALLREDUCE: return 2.0 * (n - 1.0) / n;
    case CB_BUSBW_N_MINUS_1_OVER_N: return (n - 1.0) / n;
    case CB_BUSBW_ONE: break;
    }
    return 1.0;
}

double cb_gbps(double bytes, double time_us)
{
    return time_us > 0.0 ? bytes / (time_us * 1e3) : 0.0;
}
