#include "wk_cost.h"

#include <string.h>

#define ATT_SCALE 1e-3 /* attended positions in thousands: keeps the fit well conditioned */

void wk_cost_init(wk_cost *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 3; i++) c->P[i][i] = 1e4;
}

void wk_cost_observe(wk_cost *c, double tokens, double attended, double ms) {
    double x[3] = {1, tokens, attended * ATT_SCALE}, Px[3], xPx = 0, err = ms;
    double lambda = tokens >= 32 ? 0.9 : 1.0;
    for (int i = 0; i < 3; i++) {
        Px[i] = 0;
        for (int j = 0; j < 3; j++) Px[i] += c->P[i][j] * x[j];
        xPx += x[i] * Px[i];
        err -= c->theta[i] * x[i];
    }
    double d = lambda + xPx;
    for (int i = 0; i < 3; i++) c->theta[i] += Px[i] / d * err;
    /* P = (P - Px Px' / d) / lambda (P stays symmetric) */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) c->P[i][j] = (c->P[i][j] - Px[i] * Px[j] / d) / lambda;
    c->n++;
    if (tokens >= 32) c->excited++;
}

int wk_cost_known(const wk_cost *c) { return c->excited > 0 && c->n >= 3; }

double wk_cost_predict(const wk_cost *c, double tokens, double attended) {
    if (!wk_cost_known(c)) return 0;
    double x[3] = {1, tokens, attended * ATT_SCALE}, ms = 0;
    for (int i = 0; i < 3; i++) ms += (c->theta[i] > 0 ? c->theta[i] : 0) * x[i];
    return ms;
}

double wk_cost_attended(double p, double n) { return n * p + n * (n - 1) / 2; }

int wk_cost_max_chunk(const wk_cost *c, double target_ms, double tokens, double attended, double p, int lo, int hi) {
    if (hi <= lo || !wk_cost_known(c)) return hi;
    if (wk_cost_predict(c, tokens + lo, attended + wk_cost_attended(p, lo)) > target_ms) return lo;
    while (lo < hi) { /* the prediction grows with n: bisect */
        int mid = lo + (hi - lo + 1) / 2;
        if (wk_cost_predict(c, tokens + mid, attended + wk_cost_attended(p, mid)) <= target_ms) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
