/* wk_sampler.h - token sampling: greedy, temperature, top-k, top-p, seeded. */
#ifndef WK_SAMPLER_H
#define WK_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature;   /* <= 0: greedy */
    float top_p;         /* 1: off */
    int top_k;           /* 0: off */
    uint64_t state;      /* RNG state (splitmix64) */
    int n_vocab;
    struct wk_cand { float p; int32_t id; } *cand; /* [n_vocab] scratch, allocated once */
} wk_sampler;

int wk_sampler_init(wk_sampler *s, int n_vocab, float temperature, float top_p, int top_k, uint64_t seed);
void wk_sampler_free(wk_sampler *s);
/* Picks a token from logits[n_vocab] (logits may be modified). */
int32_t wk_sample(wk_sampler *s, float *logits);
int32_t wk_argmax(const float *x, int n);

#endif
