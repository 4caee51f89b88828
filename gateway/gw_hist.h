/* gw_hist.h - a cumulative histogram with fixed bucket bounds, as
 * Prometheus exposes one (gw_metrics writes it out). */
#ifndef GW_HIST_H
#define GW_HIST_H

#include <stdint.h>

typedef struct {
    double buckets[16];
    uint64_t counts[17];
    double sum;
    uint64_t n;
    int nb;
} gw_hist;

/* bounds: nb (at most 16) ascending upper bounds; values above the last count in counts[nb]. */
void gw_hist_init(gw_hist *h, const double *bounds, int nb);
void gw_hist_add(gw_hist *h, double v);

#endif
