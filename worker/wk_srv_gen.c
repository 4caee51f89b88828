/* wk_srv_gen.c - the generate wire and the generation backend: a Generate
 * checked and turned into an engine request, the engine's outputs into
 * TokenChunks in each request's sequence, its prefix-cache changes into
 * KvEvents for the gateways' routers. */
#include "wk_srv.h"

#include "cm_error.h"
#include "cm_hash.h"
#include "cm_log.h"
#include "pr_params.h"
#include "wk_cuda.h"
#include "wk_flags.h"
#include "wk_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void start_generate(server *s, int gi, const Llmserve__Generate *g, const int32_t *toks, int n_toks, wk_params *pp);

void wk_srv_on_generate(server *s, const Llmserve__Generate *g) {
    int gi = wk_srv_gateway_for(s, g->gateway_id, g->reply_address);
    if (gi < 0) {
        CM_WARN("Generate %llu from unknown gateway '%s' dropped (no Hello yet)", (unsigned long long)g->request_id,
                g->gateway_id);
        return;
    }
    slot *dup = wk_srv_find_req(s, gi, g->request_id);
    if (dup) {
        wk_srv_refuse_duplicate(s, dup);
        return;
    }
    if (s->draining) { /* not started: the gateway can still take it elsewhere */
        wk_srv_send_error_chunk(s, gi, g->request_id, LLM_EAGAIN, "the worker is shutting down", LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    if (s->be->task != LLMSERVE__TASK__TASK_GENERATE) {
        wk_srv_send_error_chunk(s, gi, g->request_id, LLM_EUNSUP, "this worker group serves embeddings, not generation",
                                LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    wk_engine_stats es;
    wk_engine_get_stats(s->e, &es);
    int maxw = s->o->max_waiting > 0 ? s->o->max_waiting : 1024;
    if (es.waiting >= maxw) {
        wk_srv_send_error_chunk(s, gi, g->request_id, LLM_EAGAIN, "worker overloaded: too many waiting requests", LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    if (g->deadline_ms && (int64_t)g->deadline_ms <= (int64_t)cm_wall_ms()) {
        wk_srv_send_error_chunk(s, gi, g->request_id, LLM_ETIMEDOUT, "deadline passed before the request started",
                         LLMSERVE__FINISH_REASON__FINISH_TIMEOUT);
        return;
    }
    wk_params p;
    cm_gen_params gp;
    cm_gen_bias bias[WK_MAX_BIAS];
    char perr[256];
    if (pr_params_from_wire(g->params, &gp, bias, WK_MAX_BIAS, perr, sizeof perr) ||
        wk_params_from_gen(&gp, &p, perr, sizeof perr)) {
        wk_srv_send_error_chunk(s, gi, g->request_id, LLM_EINVAL, perr, LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    p.priority = g->priority; /* on the Generate, not in its SamplingParams */
    p.cache_salt = g->cache_salt ? cm_salt_of(g->cache_salt, strlen(g->cache_salt)) : 0;
    if (g->lora && g->lora[0]) { /* an adapter: its slot, and a cache of its own */
        const wk_model *m = wk_engine_model(s->e);
        p.lora = wk_lora_find(m, g->lora);
        if (!p.lora) {
            char m2[160];
            snprintf(m2, sizeof m2, "LoRA adapter '%.64s' is not loaded on this worker", g->lora);
            wk_srv_send_error_chunk(s, gi, g->request_id, LLM_EINVAL, m2, LLMSERVE__FINISH_REASON__FINISH_ERROR);
            return;
        }
        p.cache_salt = wk_lora_salt(m, p.lora, p.cache_salt);
    }
    if (g->kv_push_address && (!g->kv_transfer_id ? snprintf(perr, sizeof perr, "kv_push_address without a kv_transfer_id")
                                                  : wk_srv_kv_check_address(g->kv_push_address, perr, sizeof perr))) {
        wk_srv_send_error_chunk(s, gi, g->request_id, LLM_EINVAL, perr, LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    if (g->n_token_ids > (size_t)INT32_MAX / 2 || g->n_resume_token_ids > (size_t)INT32_MAX / 2) {
        wk_srv_send_error_chunk(s, gi, g->request_id, LLM_ERANGE, "prompt too long", LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    /* a request moved here after its first tokens: the prompt, then the output delivered so far */
    int32_t *all = NULL;
    const int32_t *toks = g->token_ids;
    size_t n_all = g->n_token_ids;
    if (g->n_resume_token_ids) {
        n_all += g->n_resume_token_ids;
        if (!(all = malloc(sizeof *all * n_all))) {
            wk_srv_send_error_chunk(s, gi, g->request_id, LLM_ENOMEM, "out of memory", LLMSERVE__FINISH_REASON__FINISH_ERROR);
            return;
        }
        if (g->n_token_ids) memcpy(all, g->token_ids, sizeof *all * g->n_token_ids);
        memcpy(all + g->n_token_ids, g->resume_token_ids, sizeof *all * g->n_resume_token_ids);
        toks = all;
        p.n_resume = (int)g->n_resume_token_ids;
        p.resume_text = g->resume_text_bytes;
    }
    start_generate(s, gi, g, toks, (int)n_all, &p);
    free(all);
}

/* The rest of on_generate, on the whole context (prompt and resumed output). */
static void start_generate(server *s, int gi, const Llmserve__Generate *g, const int32_t *toks, int n_toks, wk_params *pp) {
    wk_params p = *pp;
    /* a prompt that cannot be computed before its deadline is refused now, not timed out later */
    int64_t due = (int64_t)g->deadline_ms;
    if (g->first_token_deadline_ms && (!due || (int64_t)g->first_token_deadline_ms < due)) due = (int64_t)g->first_token_deadline_ms;
    if (due) {
        double est = wk_engine_prompt_estimate_ms(s->e, toks, n_toks, p.cache_salt);
        int64_t left = due - (int64_t)cm_wall_ms();
        if (est > 0 && est > (double)left) {
            char m[200];
            snprintf(m, sizeof m, "the prompt's %d tokens would take about %.0f ms to compute here, past the request's "
                     "deadline (%lld ms from now)", n_toks, est, (long long)left);
            wk_srv_send_error_chunk(s, gi, g->request_id, LLM_ETIMEDOUT, m, LLMSERVE__FINISH_REASON__FINISH_TIMEOUT);
            return;
        }
    }
    slot *sl = wk_srv_slot_new(s, gi, g->request_id);
    if (!sl) {
        wk_srv_send_error_chunk(s, gi, g->request_id, LLM_ENOMEM, "worker out of request slots",
                                LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    char err[512] = "";
    int rc = wk_engine_add(s->e, sl->eid, toks, n_toks, &p, err, sizeof err);
    if (rc) {
        wk_srv_slot_free(s, sl);
        wk_srv_send_error_chunk(s, gi, g->request_id, rc, err[0] ? err : cm_strerror(rc), LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    wk_srv_slot_start(s, sl, (int64_t)g->deadline_ms);
    /* a prefill for another group: its blocks go there as they are computed (a failure costs that group a
     * recomputation, not this request) */
    if (g->kv_push_address && (rc = wk_srv_kv_track(s, sl, g, toks, n_toks, p.cache_salt)))
        CM_WARN("request %llu: its KV cannot be sent to %s: %s", (unsigned long long)g->request_id, g->kv_push_address,
                cm_strerror(rc));
}

static int finish_code(int f) {
    switch (f) {
    case WK_FINISH_STOP: return LLMSERVE__FINISH_REASON__FINISH_STOP;
    case WK_FINISH_LENGTH: return LLMSERVE__FINISH_REASON__FINISH_LENGTH;
    case WK_FINISH_ABORT: return LLMSERVE__FINISH_REASON__FINISH_ABORT;
    default: return LLMSERVE__FINISH_REASON__FINISH_NONE;
    }
}

/* A logprob for the wire; tops and topp hold its alternatives (WK_MAX_LOGPROBS each). */
static void lp_to_wire(Llmserve__TokenLogprob *w, Llmserve__TopLogprob *tops, Llmserve__TopLogprob **topp,
                       const wk_token_lp *l) {
    llmserve__token_logprob__init(w);
    w->token_id = l->token;
    w->logprob = l->logprob;
    w->has_rank = 1;
    w->rank = l->rank;
    for (int t = 0; t < l->n_top; t++) {
        llmserve__top_logprob__init(&tops[t]);
        tops[t].token_id = l->top[t].id;
        tops[t].logprob = l->top[t].logprob;
        topp[t] = &tops[t];
    }
    w->n_top = (size_t)l->n_top;
    w->top = topp;
}

static void send_outputs(server *s, const wk_output *o, int n) {
    for (int i = 0; i < n; i++) {
        slot *sl = wk_srv_slot_of(s, o[i].id);
        if (!sl) continue; /* its gateway is gone */
        Llmserve__TokenChunk ch = LLMSERVE__TOKEN_CHUNK__INIT;
        ch.request_id = sl->rid;
        ch.seq = sl->seq++;
        ch.has_index = 1;
        ch.index = o[i].index;
        ch.n_token_ids = (size_t)o[i].n_tokens;
        ch.token_ids = (int32_t *)o[i].tokens;
        ch.has_text = 1;
        ch.text.data = (uint8_t *)o[i].text;
        ch.text.len = o[i].text_len;
        Llmserve__TokenLogprob lps[8], *lpp[8];
        Llmserve__TopLogprob tops[8][WK_MAX_LOGPROBS], *topp[8][WK_MAX_LOGPROBS];
        if (o[i].logprobs) {
            int nl = o[i].n_tokens < 8 ? o[i].n_tokens : 8;
            for (int k = 0; k < nl; k++) {
                lp_to_wire(&lps[k], tops[k], topp[k], &o[i].logprobs[k]);
                lpp[k] = &lps[k];
            }
            ch.n_logprobs = (size_t)nl;
            ch.logprobs = lpp;
        }
        Llmserve__TokenLogprob *plps = NULL, **plpp = NULL;
        Llmserve__TopLogprob *ptops = NULL, **ptopp = NULL;
        int np = o[i].n_prompt_logprobs;
        if (np > 0) { /* thousands of them: on the heap, once per request */
            plps = malloc(sizeof *plps * (size_t)np);
            plpp = malloc(sizeof *plpp * (size_t)np);
            ptops = malloc(sizeof *ptops * (size_t)np * WK_MAX_LOGPROBS);
            ptopp = malloc(sizeof *ptopp * (size_t)np * WK_MAX_LOGPROBS);
            if (plps && plpp && ptops && ptopp) {
                for (int k = 0; k < np; k++) {
                    lp_to_wire(&plps[k], ptops + k * WK_MAX_LOGPROBS, ptopp + k * WK_MAX_LOGPROBS, &o[i].prompt_logprobs[k]);
                    plpp[k] = &plps[k];
                }
                ch.n_prompt_logprobs = (size_t)np;
                ch.prompt_logprobs = plpp;
            }
        }
        Llmserve__Usage us = LLMSERVE__USAGE__INIT;
        if (o[i].finish) {
            ch.has_finish = 1;
            ch.finish = finish_code(o[i].finish);
            if (o[i].stop_str >= 0) ch.has_stop_string = 1, ch.stop_string = o[i].stop_str;
            if (o[i].stop_tok >= 0) ch.has_stop_token = 1, ch.stop_token = o[i].stop_tok;
            if (sl->timed_out && o[i].finish == WK_FINISH_ABORT) {
                ch.finish = LLMSERVE__FINISH_REASON__FINISH_TIMEOUT;
                ch.error = "deadline exceeded";
            }
            us.prompt_tokens = o[i].prompt_tokens;
            us.completion_tokens = o[i].completion_tokens;
            us.has_cached_tokens = 1;
            us.cached_tokens = o[i].cached_tokens;
            ch.usage = &us;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ch.has_sent_unix_ns = 1;
        ch.sent_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        pr_env env;
        pr_env_init(&env);
        env.body_case = LLMSERVE__ENVELOPE__BODY_CHUNK;
        env.chunk = &ch;
        int g = sl->gw;
        if (o[i].last) wk_srv_slot_free(s, sl); /* every choice ended, however many ran */
        wk_srv_send(s, g, &env);
        free(plps);
        free(plpp);
        free(ptops);
        free(ptopp);
    }
}

typedef struct {
    Llmserve__KvEvent *ev;
    Llmserve__KvEvent **evp;
    size_t n, cap;
} ev_buf;

static void ev_add(ev_buf *b, int kind, uint64_t key, uint64_t parent, int tier) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        Llmserve__KvEvent *e = realloc(b->ev, sizeof *e * cap);
        if (!e) return;
        b->ev = e;
        b->cap = cap;
    }
    llmserve__kv_event__init(&b->ev[b->n]);
    b->ev[b->n].kind = kind;
    b->ev[b->n].key = key;
    b->ev[b->n].has_parent = parent != 0;
    b->ev[b->n].parent = parent;
    b->ev[b->n].has_tier = tier > 1;
    b->ev[b->n].tier = (uint32_t)tier;
    b->n++;
}

static void key_cb(void *ctx, uint64_t key) {
    ev_add(ctx, LLMSERVE__KV_EVENT__KIND__STORED, key, 0, 1);
}

static void tier_key_cb(void *ctx, uint64_t key, int tier) {
    ev_add(ctx, LLMSERVE__KV_EVENT__KIND__STORED, key, 0, tier);
}

static void send_events(server *s, ev_buf *b, int snapshot, int only_gw) {
    Llmserve__KvEvent **evp = malloc(sizeof *evp * (b->n + 1));
    if (!evp) return;
    for (size_t i = 0; i < b->n; i++) evp[i] = &b->ev[i];
    Llmserve__KvEvents kv = LLMSERVE__KV_EVENTS__INIT;
    kv.n_events = b->n;
    kv.events = evp;
    kv.has_full_snapshot = 1;
    kv.full_snapshot = snapshot;
    kv.has_block_size = 1;
    kv.block_size = (uint32_t)wk_engine_options(s->e)->block_size;
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_KV_EVENTS;
    env.kv_events = &kv;
    for (int g = 0; g < MAX_GATEWAYS; g++)
        if (s->gw[g].used && (only_gw < 0 || g == only_gw)) {
            kv.worker_tag = s->gw[g].tag[0] ? s->gw[g].tag : NULL;
            wk_srv_send(s, g, &env);
        }
    free(evp);
}

/* New prefix-cache events to every gateway; a full snapshot to new ones. */
static void publish_events(server *s) {
    ev_buf b = {0};
    wk_kv_event ev[512];
    int n;
    while ((n = wk_engine_events(s->e, ev, 512)) > 0)
        for (int i = 0; i < n; i++)
            ev_add(&b, ev[i].type == WK_EV_STORED ? LLMSERVE__KV_EVENT__KIND__STORED : LLMSERVE__KV_EVENT__KIND__REMOVED,
                   ev[i].key, ev[i].parent, ev[i].tier ? ev[i].tier : 1);
    if (b.n) send_events(s, &b, 0, -1);
    for (int g = 0; g < MAX_GATEWAYS; g++) {
        if (!s->gw[g].used || !s->gw[g].snapshot_due) continue;
        s->gw[g].snapshot_due = 0;
        b.n = 0;
        wk_engine_each_key(s->e, key_cb, &b);
        wk_engine_each_tier_key(s->e, tier_key_cb, &b);
        send_events(s, &b, 1, g);
    }
    free(b.ev);
}

/* Two short requests, start to end, before the first client: the first
 * steps pay for page faults in the weights, kernels' first launches and an
 * unmeasured cost model (two prompt sizes and their decodes give the fit
 * its three coefficients and the noise its scale, so the first client's
 * deadline is judged on evidence). */
int wk_srv_warm_up(wk_engine *e, char *err, size_t errlen) {
    int32_t prompt[64];
    int vocab = (int)wk_engine_model(e)->cfg.vocab;
    for (int r = 0; r < 2; r++) {
        int n = 32 << r;
        for (int i = 0; i < n; i++) prompt[i] = (int32_t)((1000 + 37 * i + 501 * r) % (vocab > 1 ? vocab : 1));
        wk_params p;
        wk_params_default(&p);
        p.max_tokens = 4;
        p.ignore_eos = 1;
        int rc = wk_engine_add(e, UINT64_MAX - 7 - (uint64_t)r, prompt, n, &p, err, errlen);
        if (rc) return rc;
        for (int guard = 0; wk_engine_has_work(e) && guard < 10000; guard++) {
            if ((rc = wk_engine_step(e)) < 0) {
                snprintf(err, errlen, "warm-up step failed: %s", cm_strerror(rc));
                return rc;
            }
            const wk_output *out;
            wk_engine_outputs(e, &out);
        }
    }
    wk_kv_event ev[64];
    while (wk_engine_events(e, ev, 64) == 64) { /* its cache blocks are no news to gateways */
    }
    return 0;
}

/* ---- the backend -------------------------------------------------------- */

static int gen_has_work(const server *s) { return wk_engine_has_work(s->e); }

/* A step, then the memory of adapters unloaded whose last request it ended. */
static int gen_step(server *s) {
    int rc = wk_engine_step(s->e);
    wk_model *m = wk_engine_model_rw(s->e);
    if (rc >= 0 && m->max_loras) {
        int r2 = wk_lora_collect(m);
        if (r2) return r2;
    }
    return rc;
}

void wk_srv_on_lora_update(server *s, const Llmserve__LoraUpdate *u) {
    gateway *gw = wk_srv_find_gw(s, u->gateway_id);
    if (!gw) return; /* its Hello comes first, every second */
    char err[600] = "";
    int rc;
    if (s->be->task != LLMSERVE__TASK__TASK_GENERATE) {
        snprintf(err, sizeof err, "an embedding group serves no LoRA adapters");
        rc = LLM_EUNSUP;
    } else {
        wk_model *m = wk_engine_model_rw(s->e);
        rc = u->has_unload && u->unload ? wk_lora_remove(m, u->name, err, sizeof err)
                                        : wk_lora_add(m, u->name, u->path ? u->path : "", err, sizeof err);
        if (!rc) rc = wk_lora_collect(m); /* an unused adapter's memory goes now */
        __atomic_store_n(&s->lora_version, m->lora_version, __ATOMIC_RELAXED);
        if (rc && !err[0]) snprintf(err, sizeof err, "%s", cm_strerror(rc));
    }
    Llmserve__LoraUpdateResult r = LLMSERVE__LORA_UPDATE_RESULT__INIT;
    char *names[WK_MAX_LORA_MODULES];
    r.id = u->id;
    r.has_error_code = rc != 0;
    r.error_code = rc;
    r.error = rc ? err : NULL;
    r.n_loras = wk_srv_lora_names(s, names, WK_MAX_LORA_MODULES);
    r.loras = names;
    r.has_lora_version = 1;
    r.lora_version = __atomic_load_n(&s->lora_version, __ATOMIC_RELAXED);
    r.worker_tag = u->worker_tag;
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_LORA_UPDATE_RESULT;
    env.lora_update_result = &r;
    wk_srv_send(s, (int)(gw - s->gw), &env);
}

static int gen_idle(server *s) { return wk_engine_idle(s->e); }

/* A drop is told with an error chunk and frees the slot now (the abort's
 * output finds no slot); otherwise the abort's own output reports it (as a
 * timeout past the deadline) and frees the slot as the request's last. */
static void gen_end(server *s, slot *sl, int why, const char *msg) {
    if (why == WK_END_DROP)
        wk_srv_send_error_chunk(s, sl->gw, sl->rid, LLM_EIO, msg, LLMSERVE__FINISH_REASON__FINISH_ERROR);
    wk_engine_abort(s->e, sl->eid);
    if (why == WK_END_DROP) wk_srv_slot_free(s, sl);
}

static void gen_flush(server *s) {
    const wk_output *o;
    int n = wk_engine_outputs(s->e, &o);
    if (n < 0) n = 0;
    wk_srv_kv_push(s, o, n); /* a prefill's blocks leave before its first token does */
    send_outputs(s, o, n);
    publish_events(s);
}

static void gen_stats(const server *s, wk_engine_stats *es) { wk_engine_get_stats(s->e, es); }

static void gen_stats_extra(const server *s, const wk_engine_stats *es, Llmserve__Stats *st, uint64_t *pos) {
#define SET(f, v) st->has_##f = 1, st->f = (v)
    SET(kv_bytes, (uint64_t)es->blocks_total * wk_engine_options(s->e)->block_size * es->kv_bytes_per_token);
    if (wk_engine_options(s->e)->spec.method != WK_SPEC_NONE) {
        SET(spec_drafts, es->spec_drafts);
        SET(spec_draft_tokens, es->spec_draft_tokens);
        SET(spec_accepted_tokens, es->spec_accepted_tokens);
        int k = wk_engine_options(s->e)->spec.k;
        memcpy(pos, es->spec_accepted_pos, sizeof(uint64_t) * (size_t)k);
        st->n_spec_accepted_per_pos = (size_t)k;
        st->spec_accepted_per_pos = pos;
    }
    wk_tier_stats ts;
    if (!wk_engine_tier_stats(s->e, &ts)) {
        SET(kv_tier_ram_blocks, ts.ram_blocks);
        SET(kv_tier_disk_blocks, ts.disk_blocks);
        SET(kv_tier_ram_bytes, ts.ram_bytes);
        SET(kv_tier_disk_bytes, ts.disk_bytes);
        SET(kv_tier_ram_hits, ts.ram_hits);
        SET(kv_tier_disk_hits, ts.disk_hits);
        SET(kv_tier_bytes_out, ts.bytes_out);
        SET(kv_tier_bytes_in, ts.bytes_in);
        SET(kv_tier_corrupt, ts.corrupt);
        SET(kv_tier_write_errors, ts.write_errors);
        SET(kv_tier_dropped, ts.dropped);
        SET(kv_tier_load_ms_sum, ts.load_ms_sum);
    }
    wk_srv_kv_stats_fill(s, st);
    uint64_t gpu = 0;
    if (wk_engine_model(s->e)->device == WK_DEV_CUDA && !wk_cuda_mem_used(&gpu)) SET(gpu_memory_used_bytes, gpu);
#undef SET
}

const wk_backend wk_srv_generate_backend = {.task = LLMSERVE__TASK__TASK_GENERATE,
                                            .has_work = gen_has_work,
                                            .step = gen_step,
                                            .idle = gen_idle,
                                            .end = gen_end,
                                            .flush = gen_flush,
                                            .stats = gen_stats,
                                            .stats_extra = gen_stats_extra};
