#include "wk_sampler.h"
#include "cm_error.h"

#include <math.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int wk_sampler_init(wk_sampler *s, int n_vocab, float temperature, float top_p, int top_k, uint64_t seed) {
    s->temperature = temperature;
    s->top_p = top_p > 0 && top_p <= 1 ? top_p : 1;
    s->top_k = top_k > 0 && top_k < n_vocab ? top_k : 0;
    s->state = seed;
    s->n_vocab = n_vocab;
    s->cand = malloc(sizeof *s->cand * (size_t)n_vocab);
    return s->cand ? 0 : LLM_ENOMEM;
}

void wk_sampler_free(wk_sampler *s) {
    free(s->cand);
    s->cand = NULL;
}

int32_t wk_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int by_p_desc(const void *a, const void *b) {
    float x = ((const struct wk_cand *)a)->p, y = ((const struct wk_cand *)b)->p;
    if (x != y) return x < y ? 1 : -1;
    int32_t i = ((const struct wk_cand *)a)->id, j = ((const struct wk_cand *)b)->id;
    return (i > j) - (i < j);
}

int32_t wk_sample(wk_sampler *s, float *logits) {
    int n = s->n_vocab;
    if (s->temperature <= 0) return wk_argmax(logits, n);
    float mx = logits[wk_argmax(logits, n)], sum = 0;
    for (int i = 0; i < n; i++) {
        float p = expf((logits[i] - mx) / s->temperature);
        s->cand[i] = (struct wk_cand){p, i};
        sum += p;
    }
    int m = n;
    if (s->top_k || s->top_p < 1) {
        /* O(V log V) sort: fine at CPU decode rates; the engine issue brings
         * a partial selection */
        qsort(s->cand, (size_t)n, sizeof *s->cand, by_p_desc);
        if (s->top_k) m = s->top_k;
        if (s->top_p < 1) {
            float acc = 0;
            for (int i = 0; i < m; i++) {
                acc += s->cand[i].p / sum;
                if (acc >= s->top_p) { m = i + 1; break; }
            }
        }
        sum = 0;
        for (int i = 0; i < m; i++) sum += s->cand[i].p;
    }
    double r = (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += s->cand[i].p;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[m - 1].id;
}
