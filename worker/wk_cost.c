#include "wk_cost.h"

#include <math.h>
#include <string.h>

#define ATT_SCALE 1e-3      /* attended positions in thousands: keeps the sums well conditioned */
#define FORGET_PROMPT 0.9   /* weight kept by the evidence at each step of prompt tokens ... */
#define FORGET_DECODE 0.999 /* ... and at each step of decodes */
#define CLIP 3.0            /* residuals clipped beyond CLIP typical ones ... */
#define CLIP_FROM 8         /* ... once this many steps have set the typical one */

void wk_cost_init(wk_cost *c) {
    memset(c, 0, sizeof *c);
    c->scale = 1;
}

static double raw_predict(const double th[3], const double x[3]) { return th[0] * x[0] + th[1] * x[1] + th[2] * x[2]; }

/* Solves M z = r for the variables in mask (the others 0) by Gaussian
 * elimination with partial pivoting; 0 when singular. */
static int solve_face(const double A[3][3], const double y[3], int mask, double z[3]) {
    int idx[3], k = 0;
    for (int i = 0; i < 3; i++)
        if (mask & 1 << i) idx[k++] = i;
    double M[3][4];
    for (int i = 0; i < k; i++) {
        for (int j = 0; j < k; j++) M[i][j] = A[idx[i]][idx[j]];
        M[i][k] = y[idx[i]];
        M[i][i] += 1e-9 * (A[idx[i]][idx[i]] + 1); /* a whisker of ridge: steps of one shape leave M singular */
    }
    for (int col = 0; col < k; col++) {
        int piv = col;
        for (int i = col + 1; i < k; i++)
            if (fabs(M[i][col]) > fabs(M[piv][col])) piv = i;
        if (fabs(M[piv][col]) < 1e-300) return 0;
        if (piv != col)
            for (int j = 0; j <= k; j++) {
                double t = M[col][j];
                M[col][j] = M[piv][j], M[piv][j] = t;
            }
        for (int i = 0; i < k; i++) {
            if (i == col) continue;
            double f = M[i][col] / M[col][col];
            for (int j = col; j <= k; j++) M[i][j] -= f * M[col][j];
        }
    }
    z[0] = z[1] = z[2] = 0;
    for (int i = 0; i < k; i++) z[idx[i]] = M[i][k] / M[i][i];
    return 1;
}

/* Non-negative least squares on three variables: the convex objective's
 * minimum over the orthant is the unconstrained minimum on one of its seven
 * faces (or 0), so each face is solved and the best feasible one kept. */
static void refit(wk_cost *c) {
    double best[3] = {0, 0, 0}, best_obj = 0;
    for (int mask = 1; mask < 8; mask++) {
        double z[3];
        if (!solve_face(c->A, c->y, mask, z) || z[0] < 0 || z[1] < 0 || z[2] < 0) continue;
        double obj = 0; /* z'Az - 2 z'y */
        for (int i = 0; i < 3; i++) {
            obj -= 2 * z[i] * c->y[i];
            for (int j = 0; j < 3; j++) obj += z[i] * c->A[i][j] * z[j];
        }
        if (obj < best_obj) best_obj = obj, memcpy(best, z, sizeof best);
    }
    memcpy(c->theta, best, sizeof best);
}

void wk_cost_observe(wk_cost *c, double tokens, double attended, double ms) {
    if (!(ms >= 0) || !isfinite(ms) || tokens < 0 || attended < 0) return;
    double x[3] = {1, tokens, attended * ATT_SCALE};
    double ref = fmax(raw_predict(c->theta, x), 1.0), err = ms - raw_predict(c->theta, x);
    if (c->n >= CLIP_FROM) {
        double lim = (CLIP * c->scale + 0.05) * ref;
        err = fmax(-lim, fmin(lim, err));
    }
    c->scale += 0.05 * (fabs(err) / ref - c->scale);
    double v = raw_predict(c->theta, x) + err, lambda = tokens >= 32 ? FORGET_PROMPT : FORGET_DECODE;
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) c->A[i][j] = lambda * c->A[i][j] + x[i] * x[j];
        c->y[i] = lambda * c->y[i] + x[i] * v;
    }
    refit(c);
    c->n++;
    if (tokens >= 32) c->excited++;
}

int wk_cost_known(const wk_cost *c) { return c->excited > 0 && c->n >= 3; }

double wk_cost_predict(const wk_cost *c, double tokens, double attended) {
    if (!wk_cost_known(c)) return 0;
    double x[3] = {1, tokens, attended * ATT_SCALE};
    return raw_predict(c->theta, x);
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
