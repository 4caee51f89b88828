/* wk_engine_int.h - the engine's state, shared by its two files and no other
 * module: wk_engine.c (requests, sampling, the step, outputs) and
 * wk_sched.c (what a step computes: decodes, speculative drafts, prompt
 * chunks, admissions, preemption). */
#ifndef WK_ENGINE_INT_H
#define WK_ENGINE_INT_H

#include "cm_idmap.h"
#include "wk_engine.h"
#include "wk_cost.h"
#include "wk_guide.h"

#include <pthread.h>
#include <stdlib.h>

enum { S_WAITING = 1, S_RUNNING, S_DONE };

#define WK_MAX_STAGES 64 /* --pipeline-parallel-size's bound: a virtual engine each, a step in flight each */

typedef struct wk_req wk_req;

typedef struct {
    wk_req *req;
    int index;
    int32_t *tok;            /* prompt, then generated tokens */
    int n_tok, cap;
    int n_computed;          /* tokens whose K/V are in the cache */
    wk_bseq bs;
    uint64_t rng;
    int state, finish;
    int stop_str;            /* the stop string that ended it (index into the request's), or -1 */
    int32_t stop_tok;        /* the stop_token_ids entry that ended it, or -1 */
    uint64_t order;          /* admission counter: newest preempted first */
    cm_detok dt;
    char *text;              /* generated text so far (stop strings cut it) */
    size_t text_len, text_cap, text_sent;
    int tok_sent;            /* generated tokens already reported */
    wk_token_lp *lp;         /* logprobs of generated tokens not yet reported */
    int n_lp, lp_cap;
    cm_gstate *gs;           /* the output's parse under the request's grammar, or NULL */
    int spec_k;              /* drafts to propose next (adapts to what was accepted, up to K); 0: one */
    int spec_miss, spec_wait; /* proposals in a row that got nothing taken; decodes left before the next one */
    float spec_rate;         /* its drafts' acceptance, a moving average (starts at 1: worth a try) */
    int n_draft;             /* drafts in this step's plan, also at tok[n_tok..n_tok+n_draft) as its input */
    int32_t draft[WK_SPEC_MAX_K];
    wk_bseq dbs;             /* draft model: its block table in the draft's own pool (never shared) */
    int d_computed;          /* draft model: tokens whose K/V are in the draft's cache */
    double tier_wait;        /* cm_now() when its admission first waited for blocks read from disk; 0 */
    int ve;                  /* two pipeline stages: the virtual engine (0 or 1) whose steps carry it */
} wk_seq;

struct wk_req {
    uint64_t id, arrival;
    double queued_at;             /* cm_now() when added: how long it has waited (wk_engine_opts.starve_ms) */
    int at;                  /* its index in the engine's reqs */
    wk_params p;
    char *stop_buf;          /* the stop strings, copied */
    int32_t *stop_ids;
    int32_t *end_ids;        /* masked while fewer than min_tokens: end-of-generation and stop ids */
    int n_end_ids;
    wk_bias *bias;
    int n_prompt, cached;
    int forked, queried, n_seqs, n_live;
    wk_token_lp *plp;        /* prompt logprobs: plp[p] for token p + 1 (n_prompt - 1 of them) */
    int plp_sent;
    size_t max_stop;
    wk_seq *seqs[WK_MAX_N];
};

typedef struct {
    uint64_t id;
    int index, n_tokens, tok_off, lp_off, finish, prompt_tokens, completion_tokens, cached_tokens;
    int stop_str;
    int32_t stop_tok;
    size_t text_off, text_len;
    int plp_off, n_plp;
    int last;                /* the request's last output */
} out_rec;

struct wk_engine {
    pthread_t owner;             /* the one thread that may change it (the first to call in) */
    int owned;
    wk_model *m;
    wk_engine_opts o;
    wk_cache *cache;
    wk_blocks *blocks;
    struct wk_tier *tier;    /* lower KV tiers under blocks (wk_offload.c), or NULL */
    uint64_t kv_fp;          /* the model and KV layout's fingerprint (wk_offload.c), 0 until first asked */
    wk_sample_ctx sc;
    /* a step's draws over the model's threads (wk_step.c): a scratch each, the draws waiting */
    wk_sample_ctx *psc;
    int n_psc;
    struct wk_draw {
        wk_seq *s;
        float *row;
        int32_t t;
        wk_token_lp lp;
    } *draws;
    int n_draws, cap_draws;
    wk_guide *guide;         /* structured outputs; made by the first request with a grammar */
    int32_t *eog;            /* end-of-generation ids of the vocabulary */
    int n_eog;
    /* queues */
    wk_seq **waiting, **running;
    int n_waiting, n_running, cap_waiting, cap_running;
    wk_req **reqs;           /* live requests, unordered */
    int n_reqs, cap_reqs;
    cm_idmap by_id;          /* id -> live request */
    uint64_t arrivals, admissions, rng;
    /* one step */
    wk_batch_seq *plan;
    wk_seq **plan_seq;
    int n_plan;
    float *logits, *row_copy;
    int logits_rows;
    wk_copy copies[1];
    /* pipeline stages, overlapped (wk_step.c): a virtual engine a stage, each a share of the running
     * sequences, step in turn; while the later stages compute the steps in flight (fly[], oldest at
     * fly0, n_fly of them, up to one a later stage), stage 0 computes another's. pipe: the number of
     * virtual engines (as many as stages; 0: off); ve: the one being planned; fly_peak: the most steps
     * in flight at once, launched: the steps launched (said when the engine ends). An aborted sequence's
     * entry in flight is NULL (its rows are skipped). */
    int pipe, ve, fly_peak;
    uint64_t launched;
    struct wk_fly {
        wk_batch_seq *plan;
        wk_seq **seq;
        int n, rows, ve;
        float *logits;
        int logits_rows;
    } fly[WK_MAX_STAGES];
    int fly0, n_fly;
    /* outputs since the last drain */
    out_rec *outs;
    int n_outs, cap_outs, drained;
    int32_t *otok;
    int n_otok, cap_otok;
    wk_token_lp *olp;
    int n_olp, cap_olp;
    char *otext;
    size_t n_otext, cap_otext;
    wk_output *view;
    int cap_view;
    wk_engine_stats st;
    wk_cost cost;            /* what a step costs, learned from the steps run */
    float spec_floor;        /* this step: the acceptance a sequence's drafts need to pay (wk_sched.c) */
    int spec_on;             /* this step: speculation is on and a draft could pay (floor below 1) */
    /* draft model (wk_draft.c): its cache, as many blocks as the target's, and a pool without prefix caching */
    wk_cache *dcache;
    wk_blocks *dblocks;
    float draft_cost;        /* what a draft token costs against a target one: the ratio of weight bytes */
    float *dlogits;
    int dlogits_rows;
    wk_batch_seq *dplan;
    int *dmap, *dend;
};

#define GROW(ptr, cap, need)                                                                       \
    do {                                                                                           \
        if ((need) > (cap)) {                                                                      \
            size_t _c = (cap) ? (size_t)(cap) * 2 : 16;                                            \
            while (_c < (size_t)(need)) _c *= 2;                                                   \
            void *_p = realloc((ptr), _c * sizeof *(ptr));                                         \
            if (!_p) return LLM_ENOMEM;                                                            \
            (ptr) = _p;                                                                            \
            (cap) = _c;                                                                            \
        }                                                                                          \
    } while (0)

/* The least a prefill may get in a step, whatever the time target says. */
#define MIN_PREFILL_CHUNK 16

/* wk_engine.c, for the step (wk_step.c): outputs begin (and the owner thread is checked), a sequence's
 * news reported, a sequence ended and a request dropped; a row sampled into a sequence, a request's
 * first row forked into its n choices, a speculating decode's rows verified. */
void wk_eng_out_begin(wk_engine *e);
int wk_eng_emit(wk_engine *e, wk_seq *s);
void wk_eng_seq_finish(wk_engine *e, wk_seq *s, int finish);
void wk_eng_req_drop(wk_engine *e, wk_req *r);
int wk_eng_sample(wk_engine *e, wk_seq *s, float *row);
/* wk_eng_sample of a sequence without a grammar in two halves: the draw (from its own state and row, with
 * sc's scratch: draws of different sequences may run at once, each with its own sc), then the token taken
 * (the engine's thread, in the plan's order). */
int32_t wk_eng_draw(wk_seq *s, wk_sample_ctx *sc, float *row, wk_token_lp *lp);
int wk_eng_accept(wk_engine *e, wk_seq *s, int32_t t, const wk_token_lp *lp);
int wk_eng_fork(wk_engine *e, wk_seq *s0);
int wk_eng_verify(wk_engine *e, wk_seq *s, float *rows);

/* The queues (wk_sched.c). push: LLM_ENOMEM; waiting is kept in priority, then arrival order. */
int wk_eng_push_waiting(wk_engine *e, wk_seq *s);
int wk_eng_push_running(wk_engine *e, wk_seq *s);
void wk_eng_remove_from(wk_seq **q, int *n, wk_seq *s);

/* Plans one step into e->plan / e->plan_seq (wk_sched.c): every running
 * decode (with its drafts when speculating), then prompt chunks and
 * admissions within the token budget and the time target, preempting the
 * newest lowest-priority sequence when blocks run out. *tokens: what the
 * plan computes. 0 or an error. */
int wk_sched_plan(wk_engine *e, int *tokens);

/* Draft-model speculation (wk_draft.c). wk_draft_step runs the draft's share of a planned step before
 * the target's forward: it catches each proposing sequence up to its last token and draws its n_draft
 * greedy drafts into draft[] and tok[n_tok..] (a sequence whose drafts find no room in the draft's pool
 * loses them: its plan row shrinks to a plain decode), and mirrors prompt chunks so that the draft is
 * ready when decoding starts. Returns the draft tokens dropped from the plan, or an error. */
int wk_draft_step(wk_engine *e);
/* After verification: the draft's cache keeps only positions [0, n) (inputs that were taken). */
void wk_draft_keep(wk_engine *e, wk_seq *s, int n);
/* Frees a sequence's draft blocks (finished, preempted). */
void wk_draft_release(wk_engine *e, wk_seq *s);

/* wk_offload.c: the lower KV tiers of --kv-offloading-size / --kv-offloading-dir, if asked (after the
 * cache and the block pool exist). */
int wk_offload_init(wk_engine *e, char *err, size_t errlen);

#endif
