/* wk_draft.c - draft-model speculation: the draft model's share of a step.
 *
 * The draft has its own paged cache (as many blocks as the target's) and
 * its own block pool without prefix caching, so a sequence's draft blocks
 * are never shared: no copy-on-write, no keys, nothing to invalidate. The
 * draft follows a sequence lazily: prompt chunks are mirrored in the step
 * that computes them (so a prompt is ready when decoding starts) while
 * drafts could pay at the step's batch (wk_sched.c's cost rule), plain
 * decodes are not, and a proposal first feeds the draft every token it has
 * not seen (usually one or two: the token verification added, and the
 * accepted drafts it did not feed itself). Then each draft is the argmax of
 * the draft's logits, one draft-model decode per draft, all proposing
 * sequences in one batch. Verification (wk_engine.c) is unchanged: for a
 * deterministic draft, drawing each target row as plain decoding would and
 * stopping at the first difference is exact rejection sampling. */
#include "wk_engine_int.h"
#include "cm_error.h"

#include <stdio.h>

#include <string.h>

int wk_draft_model_load(const wk_model_opts *target, wk_model *tm, const wk_spec_config *spec, wk_model **out,
                        char *err, size_t errlen) {
    wk_model_opts o = *target;
    o.pool = tm->pool;
    o.comm = NULL;
    o.pipe = NULL;
    o.pp_size = o.pp_rank = 0;
    o.tokenizer_path = NULL;
    if (target->model_config) { /* dummy weights: spec->model is the draft's shape */
        o.model_config = spec->model;
        o.seed = target->seed + 1;
    } else {
        o.model_path = spec->model;
        o.model_config = NULL;
    }
    char e2[512] = "";
    int rc = wk_model_load(&o, out, e2, sizeof e2);
    if (rc) snprintf(err, errlen, "draft model: %s", e2[0] ? e2 : cm_strerror(rc));
    return rc;
}

void wk_draft_release(wk_engine *e, wk_seq *s) {
    if (!e->dblocks) return;
    wk_blocks_release(e->dblocks, &s->dbs);
    s->d_computed = 0;
}

void wk_draft_keep(wk_engine *e, wk_seq *s, int n) {
    if (!e->dblocks || s->d_computed <= n) return;
    s->d_computed = n;
    wk_blocks_truncate(e->dblocks, &s->dbs, n); /* cannot fail: the draft's blocks carry no keys */
}

static int32_t argmax(const float *x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static int room_for_rows(wk_engine *e, int rows) {
    if (rows <= e->dlogits_rows) return 0;
    float *l = realloc(e->dlogits, sizeof(float) * (size_t)rows * e->o.draft->cfg.vocab);
    if (!l) return LLM_ENOMEM;
    e->dlogits = l;
    e->dlogits_rows = rows;
    return 0;
}

/* Its drafts are dropped: the plan row becomes a plain decode. Returns how many. */
static int drop_drafts(wk_engine *e, int i) {
    wk_seq *s = e->plan_seq[i];
    int k = s->n_draft;
    e->plan[i].n -= k;
    e->plan[i].logits_from = e->plan[i].n - 1;
    s->n_draft = 0;
    return k;
}

int wk_draft_step(wk_engine *e) {
    wk_model *dm = e->o.draft;
    size_t V = dm->cfg.vocab;
    int n = 0, dropped = 0, want = 0, kmax = 0;
    /* what the draft computes for each planned sequence: tokens [d_computed, dend) */
    for (int i = 0; i < e->n_plan; i++) {
        wk_seq *s = e->plan_seq[i];
        const wk_req *r = s->req;
        int end;
        if (s->n_draft) end = s->n_tok; /* through its last token: those logits give the first draft */
        else if (e->spec_on && (e->plan[i].n > 1 || s->n_tok == r->n_prompt)) /* a prompt chunk, in a step where */
            end = e->plan[i].pos0 + e->plan[i].n;                           /* drafts could pay: ready to draft */
        else continue; /* a plain decode, or drafts cannot pay now: the draft catches up if they later can */
        if (r->p.max_tokens > 0 && r->p.max_tokens - (s->n_tok - r->n_prompt) <= 1 && !s->n_draft) continue;
        if (s->d_computed >= end) {
            if (!s->n_draft) continue;
            wk_draft_keep(e, s, end - 1); /* cannot happen (a proposal lags at least its last token); be safe */
        }
        int to = end + (s->n_draft ? s->n_draft - 1 : 0), nc = 0;
        wk_copy cp[1];
        int rc = wk_blocks_reserve(e->dblocks, &s->dbs, s->d_computed, to, cp, &nc);
        if (rc == LLM_EAGAIN) { /* the draft's pool is full: no drafts, and this chunk is caught up later */
            if (s->n_draft) dropped += drop_drafts(e, i);
            continue;
        }
        if (rc) return rc;
        e->dmap[n] = i;
        e->dend[n++] = end;
        want += s->n_draft > 0;
        if (s->n_draft > kmax) kmax = s->n_draft;
    }
    if (!n) return dropped;
    int rc = room_for_rows(e, want);
    if (rc) return rc;
    /* catch up, in forwards of at most the draft's batch capacity; the last position of a proposing
       sequence yields its first draft */
    for (;;) {
        int nb = 0, used = 0;
        for (int j = 0; j < n && used < dm->max_batch; j++) {
            wk_seq *s = e->plan_seq[e->dmap[j]];
            int left = e->dend[j] - s->d_computed;
            if (left <= 0) continue;
            int take = left < dm->max_batch - used ? left : dm->max_batch - used, last = take == left && s->n_draft;
            e->dplan[nb] = (wk_batch_seq){s->tok + s->d_computed, take, s->d_computed, s->dbs.ids, last ? take - 1 : take, 0};
            e->dmap[n + nb] = j; /* dmap: [0, n) entry -> plan row, [n, n + nb) batch row -> entry */
            nb++;
            used += take;
        }
        if (!nb) break;
        if ((rc = wk_forward_batch(dm, e->dcache, nb, e->dplan, e->dlogits))) return rc;
        const float *row = e->dlogits;
        for (int b = 0; b < nb; b++) {
            wk_seq *s = e->plan_seq[e->dmap[e->dmap[n + b]]];
            s->d_computed += e->dplan[b].n;
            if (e->dplan[b].logits_from < e->dplan[b].n) {
                s->draft[0] = s->tok[s->n_tok] = argmax(row, V);
                row += V;
            }
        }
    }
    /* the other drafts: one draft-model decode each, every proposing sequence in one batch */
    for (int d = 1; d < kmax; d++) {
        int nb = 0;
        for (int j = 0; j < n; j++) {
            wk_seq *s = e->plan_seq[e->dmap[j]];
            if (s->n_draft <= d) continue;
            int pos = s->n_tok + d - 1;
            e->dplan[nb] = (wk_batch_seq){s->tok + pos, 1, pos, s->dbs.ids, 0, 0};
            e->dmap[n + nb++] = j;
        }
        if ((rc = wk_forward_batch(dm, e->dcache, nb, e->dplan, e->dlogits))) return rc;
        for (int b = 0; b < nb; b++) {
            wk_seq *s = e->plan_seq[e->dmap[e->dmap[n + b]]];
            s->d_computed = s->n_tok + d;
            s->draft[d] = s->tok[s->n_tok + d] = argmax(e->dlogits + (size_t)b * V, V);
        }
    }
    return dropped;
}
