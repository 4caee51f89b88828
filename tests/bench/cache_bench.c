/* cache_bench: what one semantic-cache lookup costs on the gateway's loop
 * thread, against the entries it must compare (the flat index scans every
 * entry of the request's scope: the worst case is one scope holding all).
 * Random unit vectors of all-MiniLM-L6-v2's width (384); medians of 50
 * lookups at each size.
 *   llmserve-cache-bench [DIM]                                              */
#include "bn_util.h"
#include "gw_cache.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 16777216.0f * 2 - 1;
}

static void unit(float *v, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) {
        v[i] = urand();
        s += (double)v[i] * v[i];
    }
    for (int i = 0; i < d; i++) v[i] = (float)(v[i] / sqrt(s));
}

int main(int argc, char **argv) {
    int D = argc > 1 ? atoi(argv[1]) : 384;
    int sizes[] = {100, 1000, 10000, 100000};
    float *v = malloc(sizeof(float) * (size_t)D), *q = malloc(sizeof(float) * (size_t)D);
    printf("| entries in the scope | lookup (median of 50) | per entry |\n|---:|---:|---:|\n");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        gw_cache c;
        gw_cache_init(&c, sizes[s], 0, 0.9f, D);
        for (int i = 0; i < sizes[s]; i++) {
            unit(v, D);
            gw_cache_put(&c, 42, (uint64_t)i + 1, v, "answer", 6, 1, 10, 0.0);
        }
        double t[50];
        for (int r = 0; r < 50; r++) {
            unit(q, D);
            gw_cache_hit h;
            double t0 = bn_now();
            gw_cache_get_similar(&c, 42, q, 1.0, &h);
            t[r] = bn_now() - t0;
        }
        double m = bn_median(t, 50);
        printf("| %d | %.3f ms | %.1f ns |\n", sizes[s], m * 1e3, m * 1e9 / sizes[s]);
        gw_cache_free(&c);
    }
    free(v);
    free(q);
    return 0;
}
