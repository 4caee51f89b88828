#include "gw_hist.h"

#include <string.h>

void gw_hist_init(gw_hist *h, const double *bounds, int nb) {
    memset(h, 0, sizeof *h);
    h->nb = nb;
    memcpy(h->buckets, bounds, sizeof(double) * (size_t)nb);
}

void gw_hist_add(gw_hist *h, double v) {
    int i = 0;
    while (i < h->nb && v > h->buckets[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}
