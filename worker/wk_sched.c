/* wk_sched.c - the engine's queues and what one engine step computes (the
 * plan); see wk_engine_int.h. */
#include "wk_engine_int.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_time.h"

#include <string.h>

/* ---- queues ------------------------------------------------------------- */

/* Waiting order: priority (lower first), then arrival. */
static int waits_before(const wk_seq *a, const wk_seq *b) {
    if (a->req->p.priority != b->req->p.priority) return a->req->p.priority < b->req->p.priority;
    if (a->req->arrival != b->req->arrival) return a->req->arrival < b->req->arrival;
    return a->index < b->index;
}

int wk_eng_push_waiting(wk_engine *e, wk_seq *s) {
    GROW(e->waiting, e->cap_waiting, e->n_waiting + 1);
    int i = e->n_waiting;
    while (i > 0 && waits_before(s, e->waiting[i - 1])) {
        e->waiting[i] = e->waiting[i - 1];
        i--;
    }
    e->waiting[i] = s;
    e->n_waiting++;
    s->state = S_WAITING;
    return 0;
}

int wk_eng_push_running(wk_engine *e, wk_seq *s) {
    GROW(e->running, e->cap_running, e->n_running + 1);
    e->running[e->n_running++] = s;
    s->state = S_RUNNING;
    s->ve = e->ve; /* two pipeline stages: the virtual engine whose step admits it */
    s->order = ++e->admissions;
    return 0;
}

void wk_eng_remove_from(wk_seq **q, int *n, wk_seq *s) {
    for (int i = 0; i < *n; i++)
        if (q[i] == s) {
            memmove(q + i, q + i + 1, sizeof *q * (size_t)(*n - i - 1));
            (*n)--;
            return;
        }
}

/* ---- scheduling --------------------------------------------------------- */

static void preempt(wk_engine *e, wk_seq *s) {
    wk_eng_remove_from(e->running, &e->n_running, s);
    for (int i = 0; i < e->n_plan; i++)
        if (e->plan_seq[i] == s) {
            memmove(e->plan + i, e->plan + i + 1, sizeof *e->plan * (size_t)(e->n_plan - i - 1));
            memmove(e->plan_seq + i, e->plan_seq + i + 1, sizeof *e->plan_seq * (size_t)(e->n_plan - i - 1));
            e->n_plan--;
            break;
        }
    wk_blocks_release(e->blocks, &s->bs);
    wk_draft_release(e, s);
    s->n_computed = 0;
    s->n_draft = 0;
    wk_eng_push_waiting(e, s); /* cannot fail: waiting has room for every sequence it ever held */
    e->st.preemptions++;
    CM_DEBUG("preempted request %llu choice %d (%d tokens to recompute)", (unsigned long long)s->req->id, s->index,
             s->n_tok);
}

/* The running sequence to give up: lowest priority, then the newest admitted. */
static wk_seq *victim(const wk_engine *e) {
    wk_seq *v = NULL;
    for (int i = 0; i < e->n_running; i++) {
        wk_seq *s = e->running[i];
        if (e->pipe && s->ve != e->ve) continue; /* the other virtual engine's may be in flight */
        if (!v || s->req->p.priority > v->req->p.priority ||
            (s->req->p.priority == v->req->p.priority && s->order > v->order))
            v = s;
    }
    return v;
}

static void plan_add(wk_engine *e, wk_seq *s, int n) {
    int last = s->n_computed + n == s->n_tok, all = (s->req->plp && s->n_computed < s->req->n_prompt) || s->n_draft;
    e->plan[e->n_plan] = (wk_batch_seq){s->tok + s->n_computed, n, s->n_computed, s->bs.ids, all ? 0 : last ? n - 1 : n, s->req->p.lora};
    e->plan_seq[e->n_plan++] = s;
}

static int reserve(wk_engine *e, wk_seq *s, int n) {
    int nc = 0;
    int rc = wk_blocks_reserve(e->blocks, &s->bs, s->n_computed, s->n_computed + n, e->copies, &nc);
    for (int i = 0; i < nc; i++) wk_cache_copy(e->cache, e->copies[i].src, e->copies[i].dst);
    return rc;
}

/* Drafts for a decoding sequence at tok[n_tok..] (room for them made),
 * at most room and never more than the request may still generate (the
 * step yields up to one token past the drafts). Returns how many, or
 * LLM_ENOMEM. */
static int propose(wk_engine *e, wk_seq *s, int room) {
    const wk_req *r = s->req;
    const wk_spec_config *c = &e->o.spec;
    int k = s->spec_k ? s->spec_k : 1; /* a first proposal of one: a trial that fails costs one token */
    int left = r->p.max_tokens - (s->n_tok - r->n_prompt) - 1, left_len = e->o.max_model_len - s->n_tok - 1;
    if (k > left) k = left;
    if (k > left_len) k = left_len;
    if (k > room) k = room;
    if (k <= 0) return 0;
    if (s->n_tok == r->n_prompt) return 0; /* the first token: the plain path samples it (and forks n > 1 choices) */
    if (s->spec_wait > 0) { /* its drafts have not been taken lately: plain decoding costs less */
        s->spec_wait--;
        return 0;
    }
    if (!e->spec_on || s->spec_rate < e->spec_floor) return 0; /* at this batch its drafts would cost more than they save */
    GROW(s->tok, s->cap, s->n_tok + k);
    if (c->method == WK_SPEC_DRAFT) return k; /* drawn by the draft model before the forward (wk_draft_step) */
    k = wk_spec_ngram(s->tok, s->n_tok, c->ngram_min, c->ngram_max, k, s->tok + s->n_tok);
    memcpy(s->draft, s->tok + s->n_tok, sizeof(int32_t) * (size_t)k);
    return k;
}

/* Plans the running sequences of one kind: decodes (one token left to
 * compute) or prefills (more), within *budget, preempting the newest when
 * blocks run out. */
static int plan_running(wk_engine *e, int decodes, int spec, int *budget, int *preempted) {
    for (int i = 0; i < e->n_running && *budget > 0; i++) {
        wk_seq *s = e->running[i];
        int n = s->n_tok - s->n_computed;
        if ((n <= 1) != decodes || (e->pipe && s->ve != e->ve)) continue;
        if (n > *budget) n = *budget;
        s->n_draft = 0;
        if (spec && n == 1) {
            int k = propose(e, s, *budget - 1);
            if (k < 0) return k;
            /* drafts never take blocks from another sequence: without room they are not proposed */
            if (k && wk_blocks_needed(e->blocks, &s->bs, s->n_computed, s->n_computed + 1 + k) >
                         wk_blocks_available(e->blocks))
                k = 0;
            s->n_draft = k;
            n += k;
        }
        int rc;
        while ((rc = reserve(e, s, n)) == LLM_EAGAIN) {
            wk_seq *v = victim(e);
            int vi = 0;
            while (e->running[vi] != v) vi++;
            for (int j = 0; j < e->n_plan; j++)
                if (e->plan_seq[j] == v) *budget += e->plan[j].n;
            preempt(e, v);
            *preempted = 1;
            if (v == s) break;
            if (vi < i) i--; /* the list shifted under us */
        }
        if (rc == LLM_EAGAIN) { /* s itself was preempted; running[i] is now the next one */
            i--;
            continue;
        }
        if (rc) return rc;
        plan_add(e, s, n);
        *budget -= n;
    }
    return 0;
}

/* What a prefill may get before any has been timed. */
#define COLD_PREFILL_CHUNK 64
#define TIER_WAIT_S 0.1 /* longest an admission waits for its blocks to come up from disk */

int wk_sched_plan(wk_engine *e, int *tokens) {
    int budget = e->o.max_num_batched_tokens, preempted = 0, rc, spec = 0;
    e->n_plan = 0;
    e->spec_on = 0;
    if (e->o.spec.method != WK_SPEC_NONE) {
        /* A step of T tokens costs F + a*T (wk_cost's fit). B decodes plus drafts of which a share r is taken
           yield more tokens per second than B plain decodes exactly when r > a*B / (F + a*B), the share of the
           step that per-token compute takes: near 0 where a step is bound by reading the weights (small B),
           toward 1 where it is compute-bound. A sequence speculates while its own acceptance beats that;
           before the fit knows the costs, speculation waits. disable_by_batch_size, if set, is a hard cap. */
        int dec = 0;
        for (int i = 0; i < e->n_running; i++) dec += e->running[i]->n_tok - e->running[i]->n_computed <= 1;
        spec = (!e->o.spec.max_batch || dec <= e->o.spec.max_batch) && (wk_cost_known(&e->cost) || !e->o.spec.cost_rule);
        e->spec_floor = spec && e->o.spec.cost_rule ? wk_spec_floor(&e->cost, dec, e->draft_cost) : 0.f;
        e->spec_on = spec && e->spec_floor < 1.f;
    }
    /* every running stream advances each step; prompts share what is left */
    if ((rc = plan_running(e, 1, spec, &budget, &preempted))) return rc;
    int decoded = e->o.max_num_batched_tokens - budget;
    if (e->o.max_step_ms > 0 && (decoded || !e->o.step_decoding_only)) { /* the time target, at the measured cost */
        double att = 0;
        int p0 = 0;
        for (int i = 0; i < e->n_plan; i++) att += wk_cost_attended(e->plan[i].pos0, e->plan[i].n);
        for (int i = 0; i < e->n_running; i++) /* the prompt that goes first */
            if (e->running[i]->n_tok - e->running[i]->n_computed > 1) {
                p0 = e->running[i]->n_computed;
                break;
            }
        int cap = wk_cost_known(&e->cost)
                      ? wk_cost_max_chunk(&e->cost, e->o.max_step_ms, decoded, att, p0, MIN_PREFILL_CHUNK, budget)
                      : COLD_PREFILL_CHUNK;
        if (cap < budget) budget = cap;
    }
    int prefill_budget = budget;
    e->st.step_token_budget = decoded + budget;
    if ((rc = plan_running(e, 0, 0, &budget, &preempted))) return rc;
    /* no starvation: the first lower-priority request that has waited starve_ms goes to the head */
    if (e->o.starve_ms > 0 && e->n_waiting > 1) {
        double now = cm_now();
        int top = e->waiting[0]->req->p.priority;
        for (int i = 1; i < e->n_waiting; i++) {
            wk_seq *s = e->waiting[i];
            if (s->req->p.priority > top && (now - s->req->queued_at) * 1e3 >= e->o.starve_ms) {
                memmove(e->waiting + 1, e->waiting, sizeof *e->waiting * (size_t)i);
                e->waiting[0] = s;
                e->st.starved++;
                break;
            }
        }
    }
    /* admit waiting requests into what is left; not in a step that had to preempt. Pipeline stages: into the
     * virtual engine planned while it holds no more than the emptiest other, so that their steps stay even */
    int mine = 0;
    if (e->pipe) {
        int held[WK_MAX_STAGES] = {0}, least = 1 << 30;
        for (int i = 0; i < e->n_running; i++) held[e->running[i]->ve]++;
        for (int v = 0; v < e->pipe; v++)
            if (v != e->ve && held[v] < least) least = held[v];
        mine = held[e->ve] - least;
    }
    while (!preempted && e->n_waiting && budget > 0 && mine <= 0) {
        wk_seq *s = e->waiting[0];
        wk_req *r = s->req;
        int seats = r->forked ? 1 : r->p.n;
        if (e->n_running + seats > e->o.max_num_seqs && e->n_running) break;
        /* blocks of its prefix on disk are read into memory by the tiers' thread first: the running streams
         * step on meanwhile (for up to TIER_WAIT_S; then a load reads what is left itself) */
        if (e->tier && !r->plp && wk_blocks_prefetch(e->blocks, s->bs.salt, s->tok, s->n_tok)) {
            double now = cm_now();
            if (!s->tier_wait) s->tier_wait = now;
            if (now - s->tier_wait < TIER_WAIT_S) break;
        }
        int hit = wk_blocks_match(e->blocks, &s->bs, s->tok, s->n_tok);
        if (hit < 0) return hit;
        if (hit && r->plp) { /* cached positions have no logits: the prompt is computed whole */
            wk_blocks_release(e->blocks, &s->bs);
            hit = 0;
        }
        s->n_computed = hit;
        int n = s->n_tok - hit;
        if (n > budget) n = budget;
        rc = reserve(e, s, n);
        if (rc == LLM_EAGAIN) {
            wk_blocks_release(e->blocks, &s->bs);
            s->n_computed = 0;
            break;
        }
        if (rc) return rc;
        if (!r->queried) { /* count a request's prompt once, not at every retry or recompute */
            wk_blocks_count_query(e->blocks, s->n_tok, hit);
            r->cached = hit;
            r->queried = 1;
        }
        e->n_waiting--;
        memmove(e->waiting, e->waiting + 1, sizeof *e->waiting * (size_t)e->n_waiting);
        if ((rc = wk_eng_push_running(e, s))) return rc;
        plan_add(e, s, n);
        budget -= n;
        mine += e->pipe ? seats : 0;
    }
    *tokens = decoded + prefill_budget - budget;
    return 0;
}
