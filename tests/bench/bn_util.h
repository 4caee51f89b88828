/* bn_util.h - the clock and the median the benchmark programs share
 * (tests/bench, tests/gpu). Header-only: each program is one file. */
#ifndef BN_UTIL_H
#define BN_UTIL_H

#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bn_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bn_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[n] (sorts v). */
static inline double bn_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bn_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
