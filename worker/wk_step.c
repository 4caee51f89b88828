/* wk_step.c - one engine step: plan (wk_sched.c), forward, then sample what
 * the forward gave and report. With pipeline stages the steps overlap: a
 * virtual engine (as vLLM's) a stage, each a share of the running
 * sequences, step in turn, so that stage 0 computes one's step while the
 * later stages compute the others', and the logits of a step are sampled
 * once as many later steps have been launched as there are later stages. */
#include "wk_engine_int.h"
#include "cm_error.h"
#include "cm_log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Room for rows of logits in *buf (*cap rows so far). */
static int logits_room(float **buf, int *cap, int rows, size_t vocab) {
    if (rows <= *cap) return 0;
    float *l = realloc(*buf, sizeof(float) * (size_t)rows * vocab);
    if (!l) return LLM_ENOMEM;
    *buf = l;
    *cap = rows;
    return 0;
}

static int plan_rows(const wk_batch_seq *plan, int n) {
    int rows = 0;
    for (int i = 0; i < n; i++) rows += plan[i].n - plan[i].logits_from;
    return rows;
}

static double ms_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-6;
}

/* What a step's forward cost, for the scheduler's time target and the stats. */
static void observe(wk_engine *e, const wk_batch_seq *plan, int n_plan, int tokens, double ms) {
    double att = 0;
    for (int i = 0; i < n_plan; i++) att += wk_cost_attended(plan[i].pos0, plan[i].n);
    CM_LOG(CM_LOG_DEBUG, "step: %d tokens in %d sequences, %.0f attended, %.1f ms (predicted %.1f, budget %d)", tokens,
           n_plan, att, ms, wk_cost_predict(&e->cost, tokens, att), e->st.step_token_budget);
    wk_cost_observe(&e->cost, tokens, att, ms);
    e->st.ms_per_token = wk_cost_known(&e->cost) ? (float)wk_cost_predict(&e->cost, 1, 0) : 0;
    e->st.last_forward_ms = (float)ms;
    e->st.steps++;
    e->st.tokens_computed += (uint64_t)tokens;
}

/* The step's plain draws (sequences without a grammar, one row each), over the model's threads: each
 * thread a share of them with its own scratch. A draw reads and writes only its sequence's state and row,
 * so the tokens are those of the draws one by one. */
static void draw_part(void *ctx, int ith, int nth) {
    wk_engine *e = ctx;
    for (int i = ith; i < e->n_draws; i += nth) {
        struct wk_draw *d = &e->draws[i];
        d->t = wk_eng_draw(d->s, &e->psc[ith], d->row, &d->lp);
    }
}

/* A draw put off to the step's parallel part (room made as needed); 0, or LLM_ENOMEM. */
static int defer(wk_engine *e, wk_seq *s, float *row) {
    if (e->n_draws == e->cap_draws) {
        int cap = e->cap_draws ? 2 * e->cap_draws : 64;
        struct wk_draw *d = realloc(e->draws, sizeof *d * (size_t)cap);
        if (!d) return LLM_ENOMEM;
        e->draws = d;
        e->cap_draws = cap;
    }
    e->draws[e->n_draws++] = (struct wk_draw){.s = s, .row = row};
    return 0;
}

/* The draws put off: run over the pool (one alone on this thread), then taken in the plan's order. */
static int draw_all(wk_engine *e) {
    int n = e->n_draws, rc = 0;
    e->n_draws = 0;
    if (!n) return 0;
    kn_pool *pool = e->m->pool;
    int nth = pool && n > 1 ? kn_pool_size(pool) : 1;
    if (e->n_psc < nth) { /* a scratch a thread, made once */
        wk_sample_ctx *p = realloc(e->psc, sizeof *p * (size_t)nth);
        if (!p) return LLM_ENOMEM;
        e->psc = p;
        for (; e->n_psc < nth; e->n_psc++)
            if ((rc = wk_sample_ctx_init(&e->psc[e->n_psc], (int)e->m->cfg.vocab))) return rc;
    }
    e->n_draws = n;
    if (nth > 1) kn_pool_run(pool, draw_part, e);
    else draw_part(e, 0, 1);
    e->n_draws = 0;
    for (int i = 0; i < n && !rc; i++) rc = wk_eng_accept(e, e->draws[i].s, e->draws[i].t, &e->draws[i].lp);
    return rc;
}

/* A computed step's logits taken: positions committed, prompt log-probabilities, tokens sampled (a
 * request's first forks its choices), drafts verified. A NULL sequence was aborted while in flight. The
 * plain draws wait for the end, where they run at once (draw_all). */
static int take(wk_engine *e, const wk_batch_seq *plan, wk_seq *const *plan_seq, int n_plan, float *logits) {
    size_t V = e->m->cfg.vocab;
    float *row = logits;
    int rc;
    e->n_draws = 0;
    for (int i = 0; i < n_plan; i++) {
        wk_seq *s = plan_seq[i];
        if (!s) {
            row += (size_t)(plan[i].n - plan[i].logits_from) * V;
            continue;
        }
        wk_req *r = s->req;
        if (s->n_draft) {
            if ((rc = wk_eng_verify(e, s, row))) return rc;
            row += (size_t)(s->n_draft + 1) * V;
            s->n_draft = 0;
            continue;
        }
        s->n_computed += plan[i].n;
        wk_blocks_commit(e->blocks, &s->bs, s->tok, s->n_computed);
        if (plan[i].logits_from == plan[i].n) continue;
        if (r->plp && plan[i].pos0 < r->n_prompt) { /* prompt rows: the logprob of each next prompt token */
            int prows = plan[i].n - plan[i].logits_from, sample = s->n_computed == s->n_tok;
            for (int k = 0; k < prows - sample; k++, row += V) {
                int pos = plan[i].pos0 + plan[i].logits_from + k;
                if (pos + 1 < r->n_prompt)
                    wk_sample_logprobs(&e->sc, row, s->tok[pos + 1], r->p.prompt_logprobs, &r->plp[pos]);
            }
            if (!sample) continue;
        }
        int forks = 0;
        if (s->n_tok == r->n_prompt && s->tok_sent == 0 && !r->forked && s->index == 0) {
            cm_detok_init(&s->dt, e->m->tok);
            s->dt.first = 0;
            if (r->p.n > 1) {
                if ((rc = wk_eng_fork(e, s))) return rc;
                /* each choice draws from its own copy of the prompt's logits */
                for (int c = 1; c < r->p.n; c++) {
                    memcpy(e->row_copy, row, sizeof(float) * V);
                    if ((rc = wk_eng_sample(e, r->seqs[c], e->row_copy))) return rc;
                }
                forks = 1;
            }
        }
        if (!s->gs && !forks) rc = defer(e, s, row); /* a grammar's draw walks the shared guide: here, in turn */
        else rc = wk_eng_sample(e, s, row);
        if (rc) return rc;
        row += V;
    }
    return draw_all(e);
}

/* Reports every sequence's news and lets finished choices and requests go. */
static int report(wk_engine *e) {
    for (int i = 0; i < e->n_reqs; i++) {
        wk_req *r = e->reqs[i];
        for (int k = 0; k < r->n_seqs; k++) {
            wk_seq *s = r->seqs[k];
            if (s->state == S_DONE) continue;
            if (s->finish) wk_eng_seq_finish(e, s, s->finish);
            int rc = wk_eng_emit(e, s);
            if (rc) return rc;
        }
        if (!r->n_live) {
            e->st.requests_finished++;
            wk_eng_req_drop(e, r);
            i--;
        }
    }
    return 0;
}

/* Whether virtual engine v has a step in flight. */
static int flying(const wk_engine *e, int v) {
    for (int k = 0; k < e->n_fly; k++)
        if (e->fly[(e->fly0 + k) % e->pipe].ve == v) return 1;
    return 0;
}

/* Pipeline stages: plan the next virtual engine not in flight that has something to run (in turn after the
 * one planned last), launch its step and, once as many are in flight as there are later stages (or when
 * there is nothing to launch), collect the oldest and sample it; the new one stays in flight. */
static int step_pipe(wk_engine *e) {
    int tokens = 0, rc, P = e->pipe, from = e->ve;
    e->n_plan = 0;
    for (int k = 1; k <= P && !e->n_plan; k++) {
        int v = (from + k) % P;
        if (flying(e, v)) continue;
        e->ve = v;
        if ((rc = wk_sched_plan(e, &tokens))) return rc;
    }
    if (!e->n_plan && !e->n_fly) return 0; /* nothing to run or to collect: the stages need hear nothing */
    int rows = plan_rows(e->plan, e->n_plan);
    if ((rc = logits_room(&e->logits, &e->logits_rows, rows, e->m->cfg.vocab))) return rc;
    /* the new step goes in flight: its plan and logits buffer swap places with a free slot's */
    if (e->n_plan) {
        struct wk_fly *f = &e->fly[(e->fly0 + e->n_fly) % P];
        wk_batch_seq *p = f->plan;
        wk_seq **ps = f->seq;
        float *l = f->logits;
        int lr = f->logits_rows;
        f->plan = e->plan, f->seq = e->plan_seq, f->logits = e->logits, f->logits_rows = e->logits_rows;
        f->n = e->n_plan, f->rows = rows, f->ve = e->ve;
        e->plan = p, e->plan_seq = ps, e->logits = l, e->logits_rows = lr;
        e->n_fly++;
        e->launched++;
        if (e->n_fly > e->fly_peak) e->fly_peak = e->n_fly;
    }
    struct wk_fly *old = e->n_fly == P || !e->n_plan ? &e->fly[e->fly0] : NULL, *nw = &e->fly[(e->fly0 + e->n_fly - 1) % P];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if ((rc = wk_forward_pp(e->m, e->cache, e->n_plan, e->n_plan ? nw->plan : NULL, old ? old->logits : NULL,
                            old ? old->rows : 0)))
        return rc;
    if (e->n_plan) observe(e, nw->plan, nw->n, tokens, ms_since(&t0));
    e->n_plan = 0;
    if (old) {
        e->fly0 = (e->fly0 + 1) % P;
        e->n_fly--;
        if (old->n && (rc = take(e, old->plan, old->seq, old->n, old->logits))) return rc;
        old->n = 0;
    }
    if ((rc = report(e))) return rc;
    return tokens;
}

int wk_engine_step(wk_engine *e) {
    wk_eng_out_begin(e);
    if (!wk_engine_has_work(e)) return 0;
    if (e->pipe) return step_pipe(e);
    int tokens = 0, rc = wk_sched_plan(e, &tokens);
    if (rc) return rc;
    if (!e->n_plan) return 0;
    if ((rc = logits_room(&e->logits, &e->logits_rows, plan_rows(e->plan, e->n_plan), e->m->cfg.vocab))) return rc;
    if (e->dblocks) { /* the draft model's share first: its drafts are the plan's input */
        if ((rc = wk_draft_step(e)) < 0) return rc;
        tokens -= rc;
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if ((rc = wk_forward_batch(e->m, e->cache, e->n_plan, e->plan, e->logits))) return rc;
    observe(e, e->plan, e->n_plan, tokens, ms_since(&t0));
    if ((rc = take(e, e->plan, e->plan_seq, e->n_plan, e->logits)) || (rc = report(e))) return rc;
    return tokens;
}
