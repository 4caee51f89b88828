/* tl_bench.c - the arithmetic of `llmserve bench serve`, kept pure so the
 * tests check it: the request RNG, gamma/Poisson inter-arrival gaps, vLLM's
 * percentile, the capacity knee of a sweep and its SVG plot. */
#include "tl_plan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint64_t rng_state = 1;

void tl_bench_seed(uint64_t seed) { rng_state = seed * 2654435761u + 1; }

/* splitmix64: uniform in [0, 1) with 53 bits. */
double tl_bench_urand(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* Gamma(shape k, scale theta) by Marsaglia-Tsang; k < 1 by the boost u^(1/k). */
static double gamma_draw(double k, double theta) {
    if (k < 1) return gamma_draw(k + 1, theta) * pow(tl_bench_urand(), 1.0 / k);
    double d = k - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x, v;
        do {
            double u1 = tl_bench_urand(), u2 = tl_bench_urand();
            x = sqrt(-2 * log(u1 > 0 ? u1 : 1e-300)) * cos(2 * M_PI * u2);
            v = 1 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = tl_bench_urand();
        if (u < 1 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1 - v + log(v))) return d * v * theta;
    }
}

double tl_bench_gap(double rate, double burstiness) {
    if (!isfinite(rate) || rate <= 0) return 0;
    return gamma_draw(burstiness, 1.0 / (rate * burstiness));
}

double tl_bench_percentile(const double *sorted, int n, double p) {
    if (n <= 0) return 0;
    double r = p / 100.0 * (n - 1);
    int lo = (int)floor(r), hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (r - lo);
}

int tl_bench_meets_slo(double ttft, double tpot, double e2el, const double slo[3]) {
    return (!(slo[0] > 0) || ttft <= slo[0]) && (!(slo[1] > 0) || tpot <= slo[1]) && (!(slo[2] > 0) || e2el <= slo[2]);
}

int tl_bench_knee(const double *thr, const double *lat, int n, double min_gain, double slo, int *reached) {
    *reached = 0;
    if (n <= 0) return -1;
    if (slo > 0) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (lat[i] <= slo) best = i;
        *reached = best >= 0 && best < n - 1;
        return best;
    }
    for (int i = 0; i + 1 < n; i++) {
        double gain = thr[i] > 0 ? (thr[i + 1] - thr[i]) / thr[i] : INFINITY;
        if (gain < min_gain && lat[i + 1] > lat[i]) {
            *reached = 1;
            return i;
        }
    }
    return n - 1;
}

/* Tick step of about 5 per axis: 1, 2 or 5 times a power of ten. */
static double tick_step(double span) {
    double raw = span / 5, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

int tl_bench_svg(FILE *f, const char *title, const char *param, const double *value, const double *thr,
                 const double *lat, int n, const char *lat_name, int knee, double slo) {
    if (n <= 0) return -1;
    const double W = 720, H = 480, L = 80, R = 30, T = 50, B = 60;
    double xmax = 0, ymax = slo > 0 ? slo : 0;
    for (int i = 0; i < n; i++) {
        if (thr[i] > xmax) xmax = thr[i];
        if (lat[i] > ymax) ymax = lat[i];
    }
    double xs = tick_step(xmax > 0 ? xmax : 1), ys = tick_step(ymax > 0 ? ymax : 1);
    xmax = ceil((xmax > 0 ? xmax : 1) * 1.05 / xs) * xs;
    ymax = ceil((ymax > 0 ? ymax : 1) * 1.05 / ys) * ys;
#define PX(x) (L + (x) / xmax * (W - L - R))
#define PY(y) (H - B - (y) / ymax * (H - T - B))
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text x=\"%g\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">",
            W, H, W, H, W / 2);
    for (const char *c = title; *c; c++) { /* the title may carry a model name: escape it */
        if (*c == '<') fputs("&lt;", f);
        else if (*c == '>') fputs("&gt;", f);
        else if (*c == '&') fputs("&amp;", f);
        else if (*c == '"') fputs("&quot;", f);
        else fputc(*c, f);
    }
    fprintf(f, "</text>\n");
    for (double x = 0; x <= xmax + xs / 2; x += xs)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                PX(x), PY(0), PX(x), PY(ymax), PX(x), PY(0) + 18, x);
    for (double y = 0; y <= ymax + ys / 2; y += ys)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                PX(0), PY(y), PX(xmax), PY(y), PX(0) - 6, PY(y) + 4, y);
    fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">output throughput (tokens/s)</text>\n"
               "<text x=\"18\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 18 %g)\">p99 %s (ms)</text>\n",
            (L + W - R) / 2, H - 16, (T + H - B) / 2, (T + H - B) / 2, lat_name);
    if (slo > 0)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c33\" stroke-dasharray=\"6 4\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#c33\">SLO %g ms</text>\n",
                PX(0), PY(slo), PX(xmax), PY(slo), PX(xmax), PY(slo) - 5, slo);
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f5fa8\" stroke-width=\"2\" points=\"");
    for (int i = 0; i < n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", PX(thr[i]), PY(lat[i]));
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n; i++) { /* labels left of points in the right half, so they stay inside */
        int left = PX(thr[i]) > L + 0.6 * (W - L - R);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">%s=%g%s</text>\n",
                PX(thr[i]), PY(lat[i]), i == knee ? 7 : 4, i == knee ? "#c33" : "#1f5fa8",
                PX(thr[i]) + (left ? -10 : 8), PY(lat[i]) - 8, left ? "end" : "start", param, value[i],
                i == knee ? " (knee)" : "");
    }
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    return ferror(f) ? -1 : 0;
}
