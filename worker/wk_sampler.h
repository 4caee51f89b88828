/* wk_sampler.h - turning logits into the next token.
 *
 * The pipeline, in vLLM's order: logit_bias, min_tokens (end tokens
 * masked), repetition / frequency / presence penalties, temperature (0 is
 * greedy), top_k, top_p (over what top_k left), min_p, then a draw from the
 * request's own RNG, so a request's tokens depend on its seed and never on
 * what else shares the batch. Logprobs are those of the model's raw
 * distribution (before any processing), with the top-N alternatives.
 * Selection is partial (quickselect), not a sort of the whole vocabulary. */
#ifndef WK_SAMPLER_H
#define WK_SAMPLER_H

#include <stdint.h>

#define WK_MAX_LOGPROBS 20

typedef struct {
    int32_t id;
    float bias;
} wk_bias;

typedef struct {
    float temperature;          /* <= 0: greedy */
    float top_p;                /* 1: off */
    float min_p;                /* 0: off */
    int top_k;                  /* <= 0: off */
    float presence_penalty;     /* on generated tokens; 0: off */
    float frequency_penalty;    /* on generated tokens; 0: off */
    float repetition_penalty;   /* on prompt and generated tokens; 1: off */
    int n_bias;
    const wk_bias *bias;
} wk_sample_params;

typedef struct {
    int32_t id;
    float logprob;
} wk_top;

/* Logprob of a chosen token and the top alternatives. */
typedef struct {
    int32_t token;
    float logprob;
    int n_top;
    wk_top top[WK_MAX_LOGPROBS];
    int rank;                   /* 1 + the tokens more likely than this one */
} wk_token_lp;

/* Scratch sized for one vocabulary, reused for every draw. */
typedef struct {
    int n_vocab;
    struct wk_cand { float p; int32_t id; } *cand;
    uint32_t *mark;              /* mark[id] == stamp: seen in this draw */
    int32_t *count;
    uint32_t stamp;
    float *raw;                  /* copy of the logits for logprobs */
    float *ex;                   /* exp((logit - max) / temperature) of every token */
} wk_sample_ctx;

int wk_sample_ctx_init(wk_sample_ctx *c, int n_vocab);
void wk_sample_ctx_free(wk_sample_ctx *c);

uint64_t wk_rng_next(uint64_t *state);
/* The RNG state of choice `index` of a request seeded with seed. */
uint64_t wk_rng_seed(uint64_t seed, int index);

/* Picks the next token. logits[n_vocab] is modified. prompt/out are the
 * sequence's tokens (for penalties). mask: tokens forbidden this step (end
 * tokens under min_tokens), n_mask entries. lp: NULL, or filled with
 * n_logprobs (<= WK_MAX_LOGPROBS) alternatives. */
int32_t wk_sample_next(wk_sample_ctx *c, const wk_sample_params *p, uint64_t *rng, float *logits,
                       const int32_t *prompt, int n_prompt, const int32_t *out, int n_out, const int32_t *mask,
                       int n_mask, int n_logprobs, wk_token_lp *lp);

/* lp: the logprob of tok under the raw logits raw[n_vocab], with the top
 * n_top (<= WK_MAX_LOGPROBS) alternatives. */
void wk_sample_logprobs(wk_sample_ctx *c, const float *raw, int32_t tok, int n_top, wk_token_lp *lp);

/* A simple sampler for the single-sequence tools. */
typedef struct {
    wk_sample_params p;
    wk_sample_ctx c;
    uint64_t state;
} wk_sampler;

int wk_sampler_init(wk_sampler *s, int n_vocab, float temperature, float top_p, int top_k, uint64_t seed);
void wk_sampler_free(wk_sampler *s);
int32_t wk_sample(wk_sampler *s, float *logits);
int32_t wk_argmax(const float *x, int n);

#endif
