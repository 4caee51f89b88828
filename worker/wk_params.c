/* wk_params.c - a request's engine parameters: the defaults, and the one
 * converter from the neutral generation parameters (common/base/cm_gen.h) that
 * the RPC server and generate --batch both use. */
#include "wk_engine.h"
#include "cm_error.h"
#include "cm_hash.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

void wk_params_default(wk_params *p) {
    memset(p, 0, sizeof *p);
    p->s.temperature = 1;
    p->s.top_p = 1;
    p->s.repetition_penalty = 1;
    p->n = 1;
    p->logprobs = -1;
    p->prompt_logprobs = -1;
}

_Static_assert(sizeof(cm_gen_bias) == sizeof(wk_bias) && offsetof(cm_gen_bias, bias) == offsetof(wk_bias, bias),
               "the neutral logit_bias pairs are the sampler's");

int wk_params_from_gen(const cm_gen_params *g, wk_params *p, char *err, size_t errlen) {
    wk_params_default(p);
    if (g->n_stop > WK_MAX_STOP || g->n_stop_ids > WK_MAX_STOP_IDS || g->n_bias > WK_MAX_BIAS) {
        snprintf(err, errlen, "too many stop strings (%d, at most %d), stop ids (%d, at most %d) or logit_bias entries "
                 "(%d, at most %d)", g->n_stop, WK_MAX_STOP, g->n_stop_ids, WK_MAX_STOP_IDS, g->n_bias, WK_MAX_BIAS);
        return LLM_EINVAL;
    }
    p->s.temperature = g->temperature;
    p->s.top_p = g->top_p;
    p->s.min_p = g->min_p;
    p->s.top_k = g->top_k;
    p->s.presence_penalty = g->presence_penalty;
    p->s.frequency_penalty = g->frequency_penalty;
    p->s.repetition_penalty = g->repetition_penalty;
    p->s.n_bias = g->n_bias;
    p->s.bias = (const wk_bias *)g->bias;
    p->max_tokens = g->max_tokens;
    p->min_tokens = g->min_tokens;
    p->n = g->n;
    p->logprobs = g->logprobs;
    p->prompt_logprobs = g->prompt_logprobs;
    p->ignore_eos = g->ignore_eos;
    p->has_seed = g->has_seed;
    p->seed = g->seed;
    p->priority = g->priority;
    p->cache_salt = g->cache_salt ? cm_salt_of(g->cache_salt, strlen(g->cache_salt)) : 0;
    p->n_stop = g->n_stop;
    for (int i = 0; i < g->n_stop; i++) p->stop[i] = g->stop[i];
    p->n_stop_ids = g->n_stop_ids;
    p->stop_ids = g->stop_ids;
    p->grammar = g->grammar;
    p->grammar_len = g->grammar ? strlen(g->grammar) : 0;
    return 0;
}
