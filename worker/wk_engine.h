/* wk_engine.h - continuous batching over a paged KV cache.
 *
 * The engine owns the KV block pool, the prefix cache, the queues and the
 * sampler. Each wk_engine_step is one iteration: the scheduler picks running
 * decodes first, then chunks of waiting prompts, within a token budget and a
 * sequence cap; one batched forward pass runs them all; every sequence that
 * reached the end of its tokens samples one. Requests join at the next step
 * and leave as soon as they finish. When blocks run out the newest running
 * sequence of the lowest priority is preempted: its blocks are freed and it
 * is recomputed later (its tokens so far are kept, so its output does not
 * change).
 *
 * Single-threaded: one caller drives add / abort / step / outputs (the RPC
 * server's loop). The model's thread pool does the parallel work. */
#ifndef WK_ENGINE_H
#define WK_ENGINE_H

#include "wk_blocks.h"
#include "wk_tier.h"
#include "wk_model.h"
#include "cm_gen.h"
#include "wk_sampler.h"
#include "wk_spec.h"

#include <stddef.h>
#include <stdint.h>

#define WK_MAX_N 16       /* choices per request */
#define WK_MAX_STOP 16    /* stop strings per request */
#define WK_MAX_STOP_LEN 256
#define WK_MAX_STOP_IDS 64
#define WK_MAX_BIAS 1024

typedef struct {
    wk_sample_params s;       /* temperature, top_p, top_k, min_p, penalties, logit_bias */
    int max_tokens;           /* 0: up to the model length */
    int min_tokens;
    int n;                    /* choices (1..WK_MAX_N), sharing the prompt's blocks */
    int logprobs;             /* -1: none; else 0..WK_MAX_LOGPROBS alternatives */
    int ignore_eos;
    int has_seed;
    uint64_t seed;
    int priority;             /* lower runs first */
    uint64_t cache_salt;      /* cm_salt_of(cache_salt), with the adapter's name when lora (cm_salt_lora) */
    int lora;                 /* LoRA adapter, 1-based into the model's; 0: the base model */
    int n_stop;
    const char *stop[WK_MAX_STOP];      /* NUL-terminated, copied by add */
    int n_stop_ids;
    const int32_t *stop_ids;
    const char *grammar;      /* GBNF the output must match (structured outputs; wk_guide.h), or NULL */
    int prompt_logprobs;      /* -1: none; else each prompt token after the first gets its logprob and this
                                 many alternatives (0..WK_MAX_LOGPROBS); the prompt is computed whole, not
                                 taken from the prefix cache, since cached positions have no logits */
    size_t grammar_len;
    /* A request moved here from a lost worker after its first tokens: the last n_resume of the tokens given
       to wk_engine_add are output already delivered. They count as generated (max_tokens, penalties, stop
       strings, the grammar), are not reported again, nor are the first resume_text bytes of their text.
       n must be 1 and prompt_logprobs -1. */
    int n_resume;
    size_t resume_text;
} wk_params;

void wk_params_default(wk_params *p);
/* The engine's parameters from the neutral ones (pointers borrowed: g's
 * strings and arrays must outlive wk_engine_add, which copies them). 0, or
 * LLM_EINVAL with err set when a list is longer than the engine takes. */
int wk_params_from_gen(const cm_gen_params *g, wk_params *p, char *err, size_t errlen);

typedef struct wk_engine_opts {
    int max_num_seqs;             /* default 256 */
    int max_num_batched_tokens;   /* token budget of a step; <= the model's max_batch */
    int max_model_len;            /* default: the model's context */
    int block_size;               /* default 16, a power of two */
    size_t kv_cache_bytes;        /* default 4 GiB, capped at what max_num_seqs full sequences need */
    int n_blocks;                 /* overrides kv_cache_bytes when > 0 */
    int kv_type;                  /* KN_KV_F16 / KN_KV_F32 / KN_KV_FP8 */
    int prefix_caching;           /* default 1 */
    float gpu_memory_utilization; /* CUDA backend; unused on the CPU */
    float max_step_ms;            /* a step's time target: prefill chunks are sized to it from the measured cost
                                     per token (decodes always advance); 0: tokens only. Default 250 */
    int step_decoding_only;       /* max_step_ms holds only for steps that decode (a kv_producer: a prefill alone
                                     runs whole chunks; streams the gateway lets it decode keep short steps) */
    float starve_ms;              /* a waiting request of a lower priority that has waited this long is admitted
                                     before the higher ones (they pass it; they do not stop it). Default 10000;
                                     0: strict priorities */
    size_t kv_offload_bytes;      /* lower KV tiers (wk_tier.h): host memory, 0: none */
    const char *kv_offload_dir;   /* and disk (NULL: none), borrowed */
    size_t kv_offload_disk_bytes; /* default 16 GiB */
    wk_spec_config spec;          /* speculative decoding (wk_spec.h); off by default */
    wk_model *draft;              /* spec.method WK_SPEC_DRAFT: the draft model, loaded by the caller (same
                                     vocabulary and tokenizer as the target, one rank); not owned */
} wk_engine_opts;

void wk_engine_opts_default(wk_engine_opts *o);

/* Loads the draft model of a draft_model configuration with the target's load options (the same
 * device and batch capacity, one rank) onto the target tm's thread pool (the two never run at once;
 * free the draft first). A dummy target (model_config set) gets a dummy draft
 * whose shape is spec->model (a preset or a config.json) in the same weight type, seeded next to the
 * target's: GPU timing of a draft/target pair without checkpoints. err names the draft. */
int wk_draft_model_load(const wk_model_opts *target, wk_model *tm, const wk_spec_config *spec, wk_model **out,
                        char *err, size_t errlen);

enum { WK_FINISH_NONE = 0, WK_FINISH_STOP, WK_FINISH_LENGTH, WK_FINISH_ABORT };
const char *wk_finish_name(int finish); /* "stop", "length", "abort", or NULL */

/* What one choice of one request produced since the last outputs call. */
typedef struct {
    uint64_t id;
    int index;                    /* choice */
    int n_tokens;
    const int32_t *tokens;
    const wk_token_lp *logprobs;  /* n_tokens entries when asked, else NULL */
    const wk_token_lp *prompt_logprobs; /* in choice 0's first output when asked: tokens 1..prompt_tokens-1 */
    int n_prompt_logprobs;
    const char *text;             /* new text (not NUL-terminated) */
    size_t text_len;
    int finish;                   /* WK_FINISH_* */
    int stop_str;                 /* with STOP: the stop string that matched (index), or -1 */
    int32_t stop_tok;             /* with STOP: the stop_token_ids entry that ended it, or -1 (EOS: both -1) */
    int prompt_tokens, completion_tokens, cached_tokens;
    int last;                     /* the request's last output: every choice has ended, the id is free */
} wk_output;

typedef struct {
    int waiting, running;
    int blocks_total, blocks_free, blocks_cached;
    uint64_t prefix_queries, prefix_hits;  /* tokens */
    uint64_t steps, tokens_computed, tokens_generated, preemptions;
    uint64_t starved;             /* admissions of a lower priority ahead of higher ones, past starve_ms */
    uint64_t requests_finished, requests_aborted;
    size_t kv_bytes_per_token;
    float ms_per_token;           /* measured cost of a token in a step (moving average; 0: not yet known) */
    int step_token_budget;        /* tokens the last step was allowed, after the time target */
    float last_forward_ms;        /* the last step's forward pass; the rest of its time is sampling (and masks) */
    /* speculative decoding, as vLLM counts it: proposals verified, drafts in them, drafts accepted, and
       accepted at each draft position (accepted_pos[i]: proposals whose draft i was taken) */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    uint64_t spec_accepted_pos[WK_SPEC_MAX_K];
} wk_engine_stats;

typedef struct wk_engine wk_engine;

/* m must have been loaded with max_batch >= max_num_batched_tokens. Logs the
 * KV sizing. err gets the reason on failure. */
int wk_engine_create(wk_model *m, const wk_engine_opts *o, wk_engine **out, char *err, size_t errlen);
void wk_engine_free(wk_engine *e);

/* Queues a request. LLM_EINVAL for bad parameters or token ids, LLM_ERANGE
 * when prompt + max_tokens exceed max_model_len, LLM_EAGAIN for a duplicate
 * live id; err says which. With p->n_resume, the prompt is the first
 * n_prompt - n_resume tokens; a resumed output that already ends (a stop
 * token or string, max_tokens, the grammar's end) finishes at once, its
 * output ready at the next wk_engine_outputs. */
int wk_engine_add(wk_engine *e, uint64_t id, const int32_t *prompt, int n_prompt, const wk_params *p, char *err,
                  size_t errlen);
/* Ends a request at once and frees everything it held; its choices report
 * WK_FINISH_ABORT. LLM_ENOTFOUND for an unknown id. */
int wk_engine_abort(wk_engine *e, uint64_t id);
/* One iteration. Returns tokens computed (0: nothing to do) or an error. */
int wk_engine_step(wk_engine *e);
/* What computing n prompt tokens is expected to take, in ms, at the
 * measured cost per token (0 until a step has been measured). */
double wk_engine_prefill_estimate_ms(const wk_engine *e, int n);
/* The same for a prompt, less what the prefix cache holds of it (salt as in
 * wk_params.cache_salt). */
double wk_engine_prompt_estimate_ms(const wk_engine *e, const int32_t *prompt, int n, uint64_t salt);
/* Everything produced since the last call; valid until the next call of any
 * engine function. */
int wk_engine_outputs(wk_engine *e, const wk_output **out);
int wk_engine_has_work(const wk_engine *e);
void wk_engine_get_stats(const wk_engine *e, wk_engine_stats *st);
/* Prefix-cache events (block stored / removed) since the last call. */
int wk_engine_events(wk_engine *e, wk_kv_event *out, int max);
/* Every key in the prefix cache (a router's full resync). */
void wk_engine_each_key(const wk_engine *e, void (*fn)(void *ctx, uint64_t key), void *ctx);
/* The lower KV tiers' blocks, with their tier (WK_TIER_RAM, WK_TIER_DISK); and their counters (LLM_ENOTFOUND:
 * no tiers). */
void wk_engine_each_tier_key(const wk_engine *e, void (*fn)(void *ctx, uint64_t key, int tier), void *ctx);
int wk_engine_tier_stats(const wk_engine *e, wk_tier_stats *st);
/* Disaggregated prefill and decode (wk_offload.c): KV blocks moved between groups in the lower tiers'
 * layout (each layer's K, then its V: wk_engine_kv_block_bytes a block), named as in the prefix cache. */
typedef struct {
    uint64_t key, parent;
    const int32_t *tok;          /* block_size tokens */
} wk_kv_block;
size_t wk_engine_kv_block_bytes(const wk_engine *e);
/* The model and KV layout's fingerprint: a block of another is never adopted. */
uint64_t wk_engine_kv_fingerprint(wk_engine *e);
/* The pool's blocks of tok[0..n)'s full blocks from index from on (at most max, in order, up to the first not
 * cached): each named in out[] (its tok points into tok) and its K/V copied to payload (max blocks' room).
 * Returns how many, or LLM_EUNSUP for a device cache. */
int wk_engine_kv_export(wk_engine *e, uint64_t salt, const int32_t *tok, int n, int from, int max, wk_kv_block *out,
                        void *payload);
/* Adopts a block another group computed: checked (its key against its parent, salt and tokens), then kept in
 * the memory tier, where the prefix match finds it as if evicted here. 0, 1 (the pool caches it already),
 * LLM_EINVAL (a key that does not match), LLM_EUNSUP (no memory tier). */
int wk_engine_kv_import(wk_engine *e, const wk_kv_block *b, uint64_t salt, const void *payload);
const wk_model *wk_engine_model(const wk_engine *e);
/* The same model to change between steps (LoRA adapters loaded and unloaded at run time). */
wk_model *wk_engine_model_rw(wk_engine *e);
/* Nothing to step this turn: keeps a tensor-parallel group's ranks within
 * their deadline (wk_forward_keepalive). 0, or LLM_EIO when a rank died. */
int wk_engine_idle(wk_engine *e);
wk_cache *wk_engine_cache(wk_engine *e);
const wk_engine_opts *wk_engine_options(const wk_engine *e);

#endif
