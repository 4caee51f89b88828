#include "wk_sampler.h"
#include "cm_error.h"
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t wk_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t wk_rng_seed(uint64_t seed, int index) {
    uint64_t s = seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(index + 1));
    return wk_rng_next(&s);
}

int wk_sample_ctx_init(wk_sample_ctx *c, int n_vocab) {
    memset(c, 0, sizeof *c);
    c->n_vocab = n_vocab;
    c->cand = malloc(sizeof *c->cand * (size_t)n_vocab);
    c->mark = calloc((size_t)n_vocab, sizeof *c->mark);
    c->count = malloc(sizeof *c->count * (size_t)n_vocab);
    c->raw = malloc(sizeof *c->raw * (size_t)n_vocab);
    c->ex = malloc(sizeof *c->ex * (size_t)n_vocab);
    if (!c->cand || !c->mark || !c->count || !c->raw || !c->ex) {
        wk_sample_ctx_free(c);
        return LLM_ENOMEM;
    }
    return 0;
}

void wk_sample_ctx_free(wk_sample_ctx *c) {
    free(c->cand);
    free(c->mark);
    free(c->count);
    free(c->raw);
    free(c->ex);
    memset(c, 0, sizeof *c);
}

int32_t wk_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static uint32_t next_stamp(wk_sample_ctx *c) {
    if (++c->stamp == 0) { /* wrapped: old marks could alias */
        memset(c->mark, 0, sizeof *c->mark * (size_t)c->n_vocab);
        c->stamp = 1;
    }
    return c->stamp;
}

/* Higher p first; equal p by lower id, so the order is total and stable. */
static int before(const struct wk_cand *a, const struct wk_cand *b) {
    return a->p > b->p || (a->p == b->p && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Moves the k best of c[0..n) to c[0..k), sorted (quickselect, then a sort of k). */
static void select_top(struct wk_cand *c, int n, int k) {
    if (k >= n) {
        qsort(c, (size_t)n, sizeof *c, cmp_cand);
        return;
    }
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        struct wk_cand piv = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (before(&c[i], &piv)) i++;
            while (before(&piv, &c[j])) j--;
            if (i <= j) {
                struct wk_cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
    qsort(c, (size_t)k, sizeof *c, cmp_cand);
}

static void apply_penalties(wk_sample_ctx *c, const wk_sample_params *p, float *lg, const int32_t *prompt,
                            int n_prompt, const int32_t *out, int n_out) {
    if (p->presence_penalty != 0 || p->frequency_penalty != 0) {
        uint32_t st = next_stamp(c);
        for (int i = 0; i < n_out; i++) {
            int32_t t = out[i];
            if (c->mark[t] != st) {
                c->mark[t] = st;
                c->count[t] = 0;
            }
            c->count[t]++;
        }
        st = next_stamp(c);
        for (int i = 0; i < n_out; i++) {
            int32_t t = out[i];
            if (c->mark[t] == st) continue;
            c->mark[t] = st;
            lg[t] -= p->presence_penalty + p->frequency_penalty * (float)c->count[t];
        }
    }
    if (p->repetition_penalty > 0 && p->repetition_penalty != 1) {
        uint32_t st = next_stamp(c);
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *v = pass ? out : prompt;
            int n = pass ? n_out : n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t t = v[i];
                if (c->mark[t] == st) continue;
                c->mark[t] = st;
                lg[t] = lg[t] > 0 ? lg[t] / p->repetition_penalty : lg[t] * p->repetition_penalty;
            }
        }
    }
}

void wk_sample_logprobs(wk_sample_ctx *c, const float *raw, int32_t tok, int n_top, wk_token_lp *lp) {
    int V = c->n_vocab;
    float mx = raw[wk_argmax(raw, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)(raw[i] - mx));
    float lse = mx + (float)log(sum);
    lp->token = tok;
    lp->logprob = raw[tok] - lse;
    lp->n_top = n_top;
    int above = 0;
    for (int i = 0; i < V; i++) above += raw[i] > raw[tok];
    lp->rank = above + 1;
    if (!n_top) return;
    for (int i = 0; i < V; i++) c->cand[i] = (struct wk_cand){raw[i], i};
    select_top(c->cand, V, n_top);
    for (int i = 0; i < n_top; i++) lp->top[i] = (wk_top){c->cand[i].id, c->cand[i].p - lse};
}

int32_t wk_sample_next(wk_sample_ctx *c, const wk_sample_params *p, uint64_t *rng, float *lg, const int32_t *prompt,
                       int n_prompt, const int32_t *out, int n_out, const int32_t *mask, int n_mask, int n_logprobs,
                       wk_token_lp *lp) {
    int V = c->n_vocab;
    if (lp) memcpy(c->raw, lg, sizeof(float) * (size_t)V);
    for (int i = 0; i < p->n_bias; i++) lg[p->bias[i].id] += p->bias[i].bias;
    for (int i = 0; i < n_mask; i++) lg[mask[i]] = -INFINITY;
    apply_penalties(c, p, lg, prompt, n_prompt, out, n_out);
    int32_t tok;
    if (p->temperature <= 0) {
        tok = wk_argmax(lg, V);
    } else {
        float mx = lg[wk_argmax(lg, V)], inv_t = 1.f / p->temperature;
        float mass = kn_exp_sum(lg, V, mx, inv_t, c->ex); /* vectorized: most of a draw's time */
        if (p->top_k <= 0 && !(p->top_p > 0 && p->top_p < 1) && !(p->min_p > 0)) {
            /* the whole distribution (OpenAI's defaults): one scan of the cumulative mass, no candidates */
            double r = (double)(wk_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0) * mass, acc = 0;
            tok = -1;
            int last = 0;
            for (int i = 0; i < V; i++) {
                if (c->ex[i] <= 0) continue;
                last = i;
                acc += c->ex[i];
                if (r < acc) {
                    tok = i;
                    break;
                }
            }
            if (tok < 0) tok = last; /* rounding: the sum in float, the scan in double */
            if (lp) wk_sample_logprobs(c, c->raw, tok, n_logprobs, lp);
            return tok;
        }
        int m = 0;
        for (int i = 0; i < V; i++)
            if (c->ex[i] > 0) c->cand[m++] = (struct wk_cand){c->ex[i], i};
        if (p->top_k > 0 && p->top_k < m) {
            select_top(c->cand, m, p->top_k);
            m = p->top_k;
        }
        if (p->top_p > 0 && p->top_p < 1) {
            double total = 0;
            for (int i = 0; i < m; i++) total += c->cand[i].p;
            /* sort a growing head until it holds top_p of the mass */
            int k = 64, sorted = p->top_k > 0 ? m : 0;
            for (;;) {
                if (k > m) k = m;
                if (sorted < k) {
                    select_top(c->cand, m, k);
                    sorted = k;
                }
                double acc = 0, want = p->top_p * total;
                int cut = -1;
                for (int i = 0; i < k; i++) {
                    acc += c->cand[i].p;
                    if (acc >= want) { cut = i + 1; break; }
                }
                if (cut > 0) { m = cut; break; }
                if (k == m) break;
                k *= 4;
            }
        }
        if (p->min_p > 0) {
            float pmax = 0;
            for (int i = 0; i < m; i++) pmax = c->cand[i].p > pmax ? c->cand[i].p : pmax;
            int w = 0;
            for (int i = 0; i < m; i++)
                if (c->cand[i].p >= p->min_p * pmax) c->cand[w++] = c->cand[i];
            m = w;
        }
        double sum = 0;
        for (int i = 0; i < m; i++) sum += c->cand[i].p;
        double r = (double)(wk_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
        tok = c->cand[m - 1].id;
        for (int i = 0; i < m; i++) {
            acc += c->cand[i].p;
            if (r < acc) { tok = c->cand[i].id; break; }
        }
    }
    if (lp) wk_sample_logprobs(c, c->raw, tok, n_logprobs, lp);
    return tok;
}

int wk_sampler_init(wk_sampler *s, int n_vocab, float temperature, float top_p, int top_k, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->p.temperature = temperature;
    s->p.top_p = top_p > 0 && top_p <= 1 ? top_p : 1;
    s->p.top_k = top_k;
    s->p.repetition_penalty = 1;
    s->state = seed;
    return wk_sample_ctx_init(&s->c, n_vocab);
}

void wk_sampler_free(wk_sampler *s) {
    wk_sample_ctx_free(&s->c);
}

int32_t wk_sample(wk_sampler *s, float *logits) {
    return wk_sample_next(&s->c, &s->p, &s->state, logits, NULL, 0, NULL, 0, NULL, 0, 0, NULL);
}
