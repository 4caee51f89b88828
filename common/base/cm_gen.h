/* cm_gen.h - a request's generation parameters, neutral of OpenAI's JSON,
 * the wire and the engine. Each boundary converts once: cm_oai_gen_params
 * (a parsed OpenAI request -> these), pr_params_to_wire / _from_wire
 * (these <-> SamplingParams, proto/pr_params.c), wk_params_from_gen (these
 * -> the engine's wk_params). The gateway, the worker and the CLI's batch
 * mode all cross the same converters, so no field is mapped by hand twice
 * or dropped on one path. Pointers borrow from whoever filled the struct. */
#ifndef CM_GEN_H
#define CM_GEN_H

#include <stdint.h>

typedef struct {
    int32_t id;
    float bias;
} cm_gen_bias;

typedef struct {
    float temperature, top_p, min_p;      /* temperature <= 0: greedy; top_p 1, min_p 0: off */
    int top_k;                            /* <= 0: off */
    float presence_penalty, frequency_penalty, repetition_penalty; /* 0, 0, 1: off */
    int max_tokens;                       /* 0: up to the model length */
    int min_tokens;
    int n;                                /* choices */
    int logprobs;                         /* -1: none; else alternatives */
    int prompt_logprobs;                  /* -1: none; else the prompt's tokens scored, with alternatives */
    int ignore_eos;
    int has_seed;
    uint64_t seed;
    int priority;                         /* lower runs first */
    const char *cache_salt;               /* NULL: none */
    const char *const *stop;              /* [n_stop] NUL-terminated */
    int n_stop;
    const int32_t *stop_ids;
    int n_stop_ids;
    const cm_gen_bias *bias;
    int n_bias;
    const char *grammar;                  /* GBNF the output must match, or NULL */
} cm_gen_params;

/* The defaults: what an absent field means on every path. */
void cm_gen_params_default(cm_gen_params *p);

#endif
