/* pr_params.c - cm_gen_params <-> SamplingParams; see pr_params.h. */
#include "pr_params.h"
#include "cm_error.h"

#include <stdio.h>
#include <stdlib.h>

int pr_params_to_wire(const cm_gen_params *p, Llmserve__SamplingParams *sp, int32_t **ids, float **vals) {
    llmserve__sampling_params__init(sp);
    *ids = NULL;
    *vals = NULL;
    sp->has_temperature = sp->has_top_p = sp->has_top_k = sp->has_min_p = 1;
    sp->temperature = p->temperature;
    sp->top_p = p->top_p;
    sp->top_k = p->top_k;
    sp->min_p = p->min_p;
    sp->has_presence_penalty = sp->has_frequency_penalty = sp->has_repetition_penalty = 1;
    sp->presence_penalty = p->presence_penalty;
    sp->frequency_penalty = p->frequency_penalty;
    sp->repetition_penalty = p->repetition_penalty;
    sp->has_max_tokens = sp->has_min_tokens = sp->has_n = sp->has_logprobs = sp->has_ignore_eos = 1;
    sp->max_tokens = p->max_tokens;
    sp->min_tokens = p->min_tokens;
    sp->n = p->n;
    sp->logprobs = p->logprobs;
    sp->ignore_eos = p->ignore_eos;
    sp->has_prompt_logprobs = 1;
    sp->prompt_logprobs = p->prompt_logprobs;
    sp->has_seed = p->has_seed;
    sp->seed = p->seed;
    sp->n_stop = (size_t)p->n_stop;
    sp->stop = (char **)p->stop;
    sp->n_stop_token_ids = (size_t)p->n_stop_ids;
    sp->stop_token_ids = (int32_t *)p->stop_ids;
    sp->grammar = (char *)p->grammar;
    if (p->n_bias > 0) {
        *ids = malloc(sizeof **ids * (size_t)p->n_bias);
        *vals = malloc(sizeof **vals * (size_t)p->n_bias);
        if (!*ids || !*vals) {
            free(*ids);
            free(*vals);
            *ids = NULL;
            *vals = NULL;
            return LLM_ENOMEM;
        }
        for (int i = 0; i < p->n_bias; i++) {
            (*ids)[i] = p->bias[i].id;
            (*vals)[i] = p->bias[i].bias;
        }
        sp->n_logit_bias_ids = sp->n_logit_bias_values = (size_t)p->n_bias;
        sp->logit_bias_ids = *ids;
        sp->logit_bias_values = *vals;
    }
    return 0;
}

int pr_params_from_wire(const Llmserve__SamplingParams *sp, cm_gen_params *p, cm_gen_bias *bias, int max_bias, char *err,
                        size_t errlen) {
    cm_gen_params_default(p);
    if (!sp) return 0;
    if (sp->n_logit_bias_ids != sp->n_logit_bias_values || sp->n_logit_bias_ids > (size_t)max_bias ||
        sp->n_stop > 1024 || sp->n_stop_token_ids > 65536) {
        snprintf(err, errlen, "malformed SamplingParams: %zu logit_bias ids for %zu values (at most %d), %zu stop strings, "
                 "%zu stop ids", sp->n_logit_bias_ids, sp->n_logit_bias_values, max_bias, sp->n_stop,
                 sp->n_stop_token_ids);
        return LLM_EINVAL;
    }
    p->temperature = sp->has_temperature ? sp->temperature : 1;
    p->top_p = sp->has_top_p ? sp->top_p : 1;
    p->top_k = sp->has_top_k ? sp->top_k : -1;
    p->min_p = sp->min_p;
    p->presence_penalty = sp->presence_penalty;
    p->frequency_penalty = sp->frequency_penalty;
    p->repetition_penalty = sp->has_repetition_penalty ? sp->repetition_penalty : 1;
    p->max_tokens = sp->max_tokens;
    p->min_tokens = sp->min_tokens;
    p->n = sp->has_n ? sp->n : 1;
    p->logprobs = sp->has_logprobs ? sp->logprobs : -1;
    p->prompt_logprobs = sp->has_prompt_logprobs ? sp->prompt_logprobs : -1;
    p->ignore_eos = sp->ignore_eos;
    p->has_seed = sp->has_seed;
    p->seed = sp->seed;
    p->stop = (const char *const *)sp->stop;
    p->n_stop = (int)sp->n_stop;
    p->stop_ids = sp->stop_token_ids;
    p->n_stop_ids = (int)sp->n_stop_token_ids;
    for (size_t i = 0; i < sp->n_logit_bias_ids; i++) bias[i] = (cm_gen_bias){sp->logit_bias_ids[i], sp->logit_bias_values[i]};
    p->bias = bias;
    p->n_bias = (int)sp->n_logit_bias_ids;
    p->grammar = sp->grammar;
    return 0;
}
