#include "wk_server.h"
#include "cm_time.h"
#include "wk_embed.h"
#include "wk_cuda.h"
#include "cm_error.h"
#include "cm_hash.h"
#include "cm_log.h"
#include "pr_params.h"
#include "pr_wire.h"

#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/random.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_GATEWAYS 256
#define SLOT_BITS 20

typedef struct {
    int used;
    char id[128], reply[256], tag[64];
    nng_socket push;
    int64_t last_heard;
    int snapshot_due;            /* send every cached key with the next events */
    int drop_due;                /* its send buffer filled (maybe on the heartbeat thread): the loop drops it */
} gateway;

typedef struct {
    int used, gw, choices_left, timed_out;
    uint64_t rid, eid;
    uint32_t seq;
    int64_t deadline_ms;
} slot;

typedef struct {
    wk_engine *e;                /* a generation group's engine, or NULL */
    wk_embed *eq;                /* an embedding group's request queue, or NULL */
    int embed_dim;
    uint64_t embed_finished;
    const wk_server_opts *o;
    nng_socket pull;
    gateway gw[MAX_GATEWAYS];
    slot *slots;
    int n_slots, cap_slots, live;
    uint64_t counter;
    float step_ms[1024];
    int n_step, step_at;
    uint64_t dropped;
    /* The heartbeat thread sends Health to every gateway each second, so a
     * long step never looks like a dead worker. It never touches the engine:
     * the loop thread owns it. Everything that touches the gateway table
     * holds mu; the thread reads stats from snap, which the loop refreshes
     * between steps, and the model's facts from the copies below. */
    pthread_mutex_t mu;
    Llmserve__Stats snap;
    uint64_t spec_pos_snap[WK_SPEC_MAX_K]; /* snap's accepted-per-position counts (under mu) */
    uint64_t spec_pos[WK_SPEC_MAX_K];      /* the loop thread's, for the Stats it sends itself */
    int64_t last_progress;
    _Atomic int hb_stop;         /* set by the loop thread, read by the heartbeat thread */
    int max_model_len, block_size, vocab, tp;
    uint64_t incarnation;        /* random per process: gateways see a restart as a new value */
    uint8_t *tok_gguf;           /* the tokenizer for ModelInfo (cm_tok_export) */
    size_t tok_len;
    uint64_t tok_fp;
    int draining;                /* SIGTERM: no new requests, running ones finish */
    /* The receiving thread decodes every message as it arrives, notes that
     * its gateway is alive, and queues it (under mu); the loop drains the
     * whole queue before each step. So control messages wait for at most one
     * step, never for one message per step. */
    pthread_t rx;
    pthread_cond_t rx_cv;
    struct rxmsg *rx_head, *rx_tail;
    int rx_n;
    _Atomic int rx_stop;
    uint64_t rx_refused;         /* Generates refused: the queue was full */
    uint64_t gw_dropped, aborted_on_drop;
    uint64_t bad_since;          /* refused messages since the last log line */
    int64_t bad_logged;
} server;

typedef struct rxmsg {
    struct rxmsg *next;
    pr_env *env;
} rxmsg;

/* Queued messages: Generates beyond RX_CAP are refused at once (the gateway
 * retries elsewhere); anything beyond RX_HARD_CAP is dropped and counted. */
#define RX_CAP 16384
#define RX_HARD_CAP 65536

static int64_t now_ms(void) { return (int64_t)(cm_now() * 1e3); }

static gateway *find_gw(server *s, const char *id) {
    for (int i = 0; i < MAX_GATEWAYS; i++)
        if (s->gw[i].used && !strcmp(s->gw[i].id, id)) return &s->gw[i];
    return NULL;
}

static slot *find_req(server *s, int gw, uint64_t rid) {
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].used && s->slots[i].gw == gw && s->slots[i].rid == rid) return &s->slots[i];
    return NULL;
}

static slot *slot_of(server *s, uint64_t eid) {
    uint64_t i = eid & ((1u << SLOT_BITS) - 1);
    if (i >= (uint64_t)s->n_slots || !s->slots[i].used || s->slots[i].eid != eid) return NULL;
    return &s->slots[i];
}

static slot *slot_new(server *s) {
    for (int i = 0; i < s->n_slots; i++)
        if (!s->slots[i].used) return &s->slots[i];
    if (s->n_slots == (1 << SLOT_BITS)) return NULL;
    if (s->n_slots == s->cap_slots) {
        int cap = s->cap_slots ? 2 * s->cap_slots : 256;
        slot *n = realloc(s->slots, sizeof *n * (size_t)cap);
        if (!n) return NULL;
        s->slots = n;
        s->cap_slots = cap;
    }
    return &s->slots[s->n_slots++];
}

static void slot_free(server *s, slot *sl) {
    sl->used = 0;
    s->live--;
}

/* Sends to a gateway without blocking the engine. A gateway whose buffer is
 * full has stopped reading: it loses its requests rather than stalling all. */
static void send_gw(server *s, int g, pr_env *env);

static void send_error_chunk(server *s, int g, uint64_t rid, int code, const char *msg, int finish);

/* Ends every request of a gateway. Each is reported to it (when it still
 * reads), and all of them in the log and the counters. */
static void drop_gateway(server *s, int g, const char *why) {
    gateway *gw = &s->gw[g];
    if (!gw->used) return;
    int aborted = 0;
    char msg[160];
    snprintf(msg, sizeof msg, "the worker ended this request: it dropped its gateway (%s)", why);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->used || sl->gw != g) continue;
        if (s->e) wk_engine_abort(s->e, sl->eid);
        else wk_embed_remove(s->eq, sl->eid);
        send_error_chunk(s, g, sl->rid, LLM_EIO, msg, LLMSERVE__FINISH_REASON__FINISH_ERROR); /* no-op if not reading */
        slot_free(s, sl);
        aborted++;
    }
    s->gw_dropped++;
    s->aborted_on_drop += (uint64_t)aborted;
    CM_WARN("gateway %s dropped (%s); %d requests aborted%s", gw->id, why, aborted,
            aborted && !gw->drop_due ? " and reported to it" : "");
    nng_close(gw->push);
    gw->used = 0;
    /* the abort outputs of its requests have no slot any more and are ignored */
}

static void send_gw(server *s, int g, pr_env *env) {
    gateway *gw = &s->gw[g];
    if (!gw->used || gw->drop_due) return;
    int rc = pr_send(gw->push, env, NNG_FLAG_NONBLOCK);
    if (rc == LLM_EAGAIN) gw->drop_due = 1; /* dropped by the loop thread, which owns the engine */
    else if (rc) CM_WARN("send to gateway %s failed: %s", gw->id, cm_strerror(rc));
}

/* Loop thread only: drops the gateways whose buffers filled. */
static void apply_drops(server *s) {
    for (int g = 0; g < MAX_GATEWAYS; g++)
        if (s->gw[g].used && s->gw[g].drop_due) drop_gateway(s, g, "not reading: send buffer full");
}

static void send_error_chunk(server *s, int g, uint64_t rid, int code, const char *msg, int finish) {
    Llmserve__TokenChunk ch = LLMSERVE__TOKEN_CHUNK__INIT;
    ch.request_id = rid;
    ch.seq = 0;
    ch.has_finish = 1;
    ch.finish = finish;
    ch.error = (char *)msg;
    ch.has_error_code = 1;
    ch.error_code = code;
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_CHUNK;
    env.chunk = &ch;
    send_gw(s, g, &env);
}

static void send_embed_error(server *s, int g, uint64_t rid, int code, const char *msg) {
    Llmserve__EmbedResult r = LLMSERVE__EMBED_RESULT__INIT;
    r.request_id = rid;
    r.error = (char *)msg;
    r.has_error_code = 1;
    r.error_code = code;
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_EMBED_RESULT;
    env.embed_result = &r;
    send_gw(s, g, &env);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* pos: where the accepted-per-position counts live while st is in use. */
static void fill_stats(server *s, Llmserve__Stats *st, uint64_t *pos) {
    wk_engine_stats es;
    memset(&es, 0, sizeof es);
    if (s->e) wk_engine_get_stats(s->e, &es);
    else {
        es.waiting = s->eq->n_jobs;
        es.steps = s->eq->steps;
        es.requests_finished = s->embed_finished;
    }
    llmserve__stats__init(st);
#define SET(f, v) st->has_##f = 1, st->f = (v)
    SET(waiting, es.waiting);
    SET(running, es.running);
    SET(blocks_total, es.blocks_total);
    SET(blocks_free, es.blocks_free);
    SET(prefix_queries, es.prefix_queries);
    SET(prefix_hits, es.prefix_hits);
    SET(steps, es.steps);
    SET(tokens_generated, es.tokens_generated);
    SET(preemptions, es.preemptions);
    SET(requests_finished, es.requests_finished);
    SET(requests_aborted, es.requests_aborted);
    if (s->e) SET(kv_bytes, (uint64_t)es.blocks_total * wk_engine_options(s->e)->block_size * es.kv_bytes_per_token);
    SET(tp_size, (uint32_t)s->tp);
    SET(gateways_dropped, s->gw_dropped);
    SET(requests_aborted_on_drop, s->aborted_on_drop);
    SET(messages_refused, s->rx_refused + s->dropped);
    if (s->e && wk_engine_options(s->e)->spec.method != WK_SPEC_NONE) {
        SET(spec_drafts, es.spec_drafts);
        SET(spec_draft_tokens, es.spec_draft_tokens);
        SET(spec_accepted_tokens, es.spec_accepted_tokens);
        int k = wk_engine_options(s->e)->spec.k;
        memcpy(pos, es.spec_accepted_pos, sizeof(uint64_t) * (size_t)k);
        st->n_spec_accepted_per_pos = (size_t)k;
        st->spec_accepted_per_pos = pos;
    }
    int n = s->n_step < 1024 ? s->n_step : 1024;
    if (n) {
        float v[1024];
        memcpy(v, s->step_ms, sizeof(float) * (size_t)n);
        qsort(v, (size_t)n, sizeof *v, cmp_float);
        SET(step_ms_p50, v[n / 2]);
        SET(step_ms_p99, v[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1]);
    }
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) == 2) SET(rss_bytes, (uint64_t)rss * (uint64_t)sysconf(_SC_PAGE_SIZE));
        fclose(f);
    }
    uint64_t gpu = 0;
    if (s->e && wk_engine_model(s->e)->device == WK_DEV_CUDA && !wk_cuda_mem_used(&gpu)) SET(gpu_memory_used_bytes, gpu);
#undef SET
}

static void send_health_with(server *s, int g, Llmserve__Stats *stp);

static void send_health(server *s, int g) {
    Llmserve__Stats st;
    fill_stats(s, &st, s->spec_pos);
    send_health_with(s, g, &st);
}

/* Called from the heartbeat thread too: touches no engine state. */
static void send_health_with(server *s, int g, Llmserve__Stats *stp) {
    Llmserve__Health h = LLMSERVE__HEALTH__INIT;
    Llmserve__Stats st = *stp;
    h.worker_id = (char *)s->o->worker_id;
    h.model = (char *)s->o->model_name;
    h.has_max_model_len = h.has_block_size = h.has_vocab = h.has_ready = h.has_tp_size = 1;
    h.max_model_len = s->max_model_len;
    h.block_size = s->block_size;
    h.vocab = s->vocab;
    h.ready = !s->draining;
    h.tp_size = (uint32_t)s->tp;
    h.has_incarnation = h.has_tokenizer_fingerprint = 1;
    h.incarnation = s->incarnation;
    h.tokenizer_fingerprint = s->tok_fp;
    if (s->eq) {
        h.has_task = h.has_embedding_dim = 1;
        h.task = LLMSERVE__TASK__TASK_EMBED;
        h.embedding_dim = (uint32_t)s->embed_dim;
    }
    h.stats = &st;
    h.worker_tag = s->gw[g].tag[0] ? s->gw[g].tag : NULL;
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_HEALTH;
    env.health = &h;
    send_gw(s, g, &env);
}

static void on_hello(server *s, const Llmserve__Hello *h) {
    gateway *gw = find_gw(s, h->gateway_id);
    if (gw && strcmp(gw->reply, h->reply_address)) { /* restarted on a new address */
        drop_gateway(s, (int)(gw - s->gw), "reply address changed");
        gw = NULL;
    }
    if (!gw) {
        if (strlen(h->gateway_id) >= sizeof gw->id || strlen(h->reply_address) >= sizeof gw->reply) {
            CM_WARN("Hello with an over-long gateway id or address dropped");
            return;
        }
        for (int i = 0; i < MAX_GATEWAYS && !gw; i++)
            if (!s->gw[i].used) gw = &s->gw[i];
        if (!gw) {
            CM_WARN("gateway %s refused: %d gateways already connected", h->gateway_id, MAX_GATEWAYS);
            return;
        }
        memset(gw, 0, sizeof *gw);
        int rv = nng_push0_open(&gw->push);
        if (!rv) rv = nng_socket_set_int(gw->push, NNG_OPT_SENDBUF, s->o->send_buffer > 0 ? s->o->send_buffer : 8192);
        if (!rv) rv = nng_socket_set_ms(gw->push, NNG_OPT_RECONNMINT, 50);
        if (!rv) rv = nng_socket_set_ms(gw->push, NNG_OPT_RECONNMAXT, 1000);
        if (!rv) rv = nng_dial(gw->push, h->reply_address, NULL, NNG_FLAG_NONBLOCK);
        if (rv) {
            CM_WARN("cannot dial gateway %s at %s: %s", h->gateway_id, h->reply_address, nng_strerror(rv));
            nng_close(gw->push);
            return;
        }
        snprintf(gw->id, sizeof gw->id, "%s", h->gateway_id);
        snprintf(gw->reply, sizeof gw->reply, "%s", h->reply_address);
        gw->used = 1;
        gw->snapshot_due = 1;
        CM_INFO("gateway %s connected (replies to %s)", gw->id, gw->reply);
    }
    gw->last_heard = now_ms();
    if (h->worker_tag) snprintf(gw->tag, sizeof gw->tag, "%s", h->worker_tag);
    send_health(s, (int)(gw - s->gw));
}

static void on_hello(server *s, const Llmserve__Hello *h);
static void on_embed(server *s, const Llmserve__Embed *m);
static void start_generate(server *s, int gi, const Llmserve__Generate *g, const int32_t *toks, int n_toks, wk_params *pp);

static void on_generate(server *s, const Llmserve__Generate *g) {
    gateway *gw = find_gw(s, g->gateway_id);
    if (!gw && g->reply_address && g->reply_address[0]) { /* dropped earlier, or its Hello was lost: register it */
        Llmserve__Hello h = LLMSERVE__HELLO__INIT;
        h.gateway_id = g->gateway_id;
        h.reply_address = g->reply_address;
        on_hello(s, &h);
        gw = find_gw(s, g->gateway_id);
    }
    if (!gw) {
        s->dropped++;
        CM_WARN("Generate %llu from unknown gateway '%s' dropped (no Hello yet)", (unsigned long long)g->request_id,
                g->gateway_id);
        return;
    }
    int gi = (int)(gw - s->gw);
    gw->last_heard = now_ms();
    if (find_req(s, gi, g->request_id)) {
        pr_env env;
        pr_env_init(&env);
        Llmserve__Error er = LLMSERVE__ERROR__INIT;
        char msg[160];
        snprintf(msg, sizeof msg, "duplicate request id %llu: a request with this id is running",
                 (unsigned long long)g->request_id);
        er.message = msg;
        er.has_code = 1;
        er.code = LLM_EAGAIN;
        env.body_case = LLMSERVE__ENVELOPE__BODY_ERROR;
        env.error = &er;
        send_gw(s, gi, &env);
        return;
    }
    if (s->draining) { /* not started: the gateway can still take it elsewhere */
        send_error_chunk(s, gi, g->request_id, LLM_EAGAIN, "the worker is shutting down", LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    if (!s->e) {
        send_error_chunk(s, gi, g->request_id, LLM_EUNSUP, "this worker group serves embeddings, not generation",
                         LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    wk_engine_stats es;
    wk_engine_get_stats(s->e, &es);
    int maxw = s->o->max_waiting > 0 ? s->o->max_waiting : 1024;
    if (es.waiting >= maxw) {
        send_error_chunk(s, gi, g->request_id, LLM_EAGAIN, "worker overloaded: too many waiting requests", LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    if (g->deadline_ms && (int64_t)g->deadline_ms <= (int64_t)cm_wall_ms()) {
        send_error_chunk(s, gi, g->request_id, LLM_ETIMEDOUT, "deadline passed before the request started",
                         LLMSERVE__FINISH_REASON__FINISH_TIMEOUT);
        return;
    }
    wk_params p;
    cm_gen_params gp;
    cm_gen_bias bias[WK_MAX_BIAS];
    char perr[256];
    if (pr_params_from_wire(g->params, &gp, bias, WK_MAX_BIAS, perr, sizeof perr) ||
        wk_params_from_gen(&gp, &p, perr, sizeof perr)) {
        send_error_chunk(s, gi, g->request_id, LLM_EINVAL, perr, LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    p.priority = g->priority; /* on the Generate, not in its SamplingParams */
    p.cache_salt = g->cache_salt ? cm_salt_of(g->cache_salt, strlen(g->cache_salt)) : 0;
    if (g->n_token_ids > (size_t)INT32_MAX / 2 || g->n_resume_token_ids > (size_t)INT32_MAX / 2) {
        send_error_chunk(s, gi, g->request_id, LLM_ERANGE, "prompt too long", LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    /* a request moved here after its first tokens: the prompt, then the output delivered so far */
    int32_t *all = NULL;
    const int32_t *toks = g->token_ids;
    size_t n_all = g->n_token_ids;
    if (g->n_resume_token_ids) {
        n_all += g->n_resume_token_ids;
        if (!(all = malloc(sizeof *all * n_all))) {
            send_error_chunk(s, gi, g->request_id, LLM_ENOMEM, "out of memory", LLMSERVE__FINISH_REASON__FINISH_ERROR);
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
            send_error_chunk(s, gi, g->request_id, LLM_ETIMEDOUT, m, LLMSERVE__FINISH_REASON__FINISH_TIMEOUT);
            return;
        }
    }
    slot *sl = slot_new(s);
    if (!sl) {
        send_error_chunk(s, gi, g->request_id, LLM_ENOMEM, "worker out of request slots", LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    uint64_t eid = (++s->counter << SLOT_BITS) | (uint64_t)(sl - s->slots);
    char err[512] = "";
    int rc = wk_engine_add(s->e, eid, toks, n_toks, &p, err, sizeof err);
    if (rc) {
        send_error_chunk(s, gi, g->request_id, rc, err[0] ? err : cm_strerror(rc), LLMSERVE__FINISH_REASON__FINISH_ERROR);
        return;
    }
    *sl = (slot){1, gi, p.n, 0, g->request_id, eid, 0, (int64_t)g->deadline_ms};
    s->live++;
}

static void on_cancel(server *s, const Llmserve__Cancel *c) {
    gateway *gw = find_gw(s, c->gateway_id);
    slot *sl = gw ? find_req(s, (int)(gw - s->gw), c->request_id) : NULL;
    if (!sl) {
        CM_DEBUG("Cancel of unknown request %llu from %s ignored", (unsigned long long)c->request_id, c->gateway_id);
        return;
    }
    if (!s->e) { /* an embedding: nothing streams, so nothing to tell */
        wk_embed_remove(s->eq, sl->eid);
        slot_free(s, sl);
        return;
    }
    wk_engine_abort(s->e, sl->eid); /* its outputs (finish = abort) go out with the next sends */
}

/* An embedding request joins the queue; its result goes out whole when its
 * last input is embedded (send_embed_results). */
static void on_embed(server *s, const Llmserve__Embed *m) {
    gateway *gw = find_gw(s, m->gateway_id);
    if (!gw && m->reply_address && m->reply_address[0]) {
        Llmserve__Hello h = LLMSERVE__HELLO__INIT;
        h.gateway_id = m->gateway_id;
        h.reply_address = m->reply_address;
        on_hello(s, &h);
        gw = find_gw(s, m->gateway_id);
    }
    if (!gw) {
        s->dropped++;
        return;
    }
    int gi = (int)(gw - s->gw);
    if (!s->eq) {
        send_embed_error(s, gi, m->request_id, LLM_EUNSUP, "this worker group serves generation, not embeddings");
        return;
    }
    if (find_req(s, gi, m->request_id)) {
        send_embed_error(s, gi, m->request_id, LLM_EINVAL, "duplicate request id: a request with this id is running");
        return;
    }
    if (s->draining) {
        send_embed_error(s, gi, m->request_id, LLM_EAGAIN, "the worker is shutting down");
        return;
    }
    int maxw = s->o->max_waiting > 0 ? s->o->max_waiting : 1024;
    if (s->eq->n_jobs >= maxw) {
        send_embed_error(s, gi, m->request_id, LLM_EAGAIN, "worker overloaded: too many waiting requests");
        return;
    }
    if (m->deadline_ms && (int64_t)m->deadline_ms <= (int64_t)cm_wall_ms()) {
        send_embed_error(s, gi, m->request_id, LLM_ETIMEDOUT, "deadline passed before the request started");
        return;
    }
    if (m->n_inputs > WK_EMBED_MAX_INPUTS) {
        send_embed_error(s, gi, m->request_id, LLM_EINVAL, "more than 2048 inputs in one request");
        return;
    }
    const int32_t *tok[WK_EMBED_MAX_INPUTS];
    int len[WK_EMBED_MAX_INPUTS];
    for (size_t i = 0; i < m->n_inputs; i++) {
        tok[i] = m->inputs[i]->token_ids;
        len[i] = m->inputs[i]->n_token_ids > (size_t)INT32_MAX ? -1 : (int)m->inputs[i]->n_token_ids;
    }
    slot *sl = slot_new(s);
    if (!sl) {
        send_embed_error(s, gi, m->request_id, LLM_ENOMEM, "worker out of request slots");
        return;
    }
    uint64_t eid = (++s->counter << SLOT_BITS) | (uint64_t)(sl - s->slots);
    char err[300] = "";
    int rc = wk_embed_add(s->eq, eid, (int64_t)m->deadline_ms, (int)m->n_inputs, tok, len, err, sizeof err);
    if (rc) {
        send_embed_error(s, gi, m->request_id, rc, err[0] ? err : cm_strerror(rc));
        return;
    }
    *sl = (slot){1, gi, 1, 0, m->request_id, eid, 0, (int64_t)m->deadline_ms};
    s->live++;
}

/* Finished embedding requests to their gateways. */
static void send_embed_results(server *s) {
    for (wk_ejob *j = wk_embed_take_done(s->eq), *next; j; j = next) {
        next = j->next;
        slot *sl = slot_of(s, j->id);
        if (sl) {
            Llmserve__EmbedResult r = LLMSERVE__EMBED_RESULT__INIT;
            r.request_id = sl->rid;
            r.n_embedding = (size_t)j->n * (size_t)s->embed_dim;
            r.embedding = j->out;
            r.has_dim = r.has_prompt_tokens = r.has_sent_unix_ns = 1;
            r.dim = (uint32_t)s->embed_dim;
            r.prompt_tokens = j->tokens;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            r.sent_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
            pr_env env;
            pr_env_init(&env);
            env.body_case = LLMSERVE__ENVELOPE__BODY_EMBED_RESULT;
            env.embed_result = &r;
            int g = sl->gw;
            slot_free(s, sl);
            s->embed_finished++;
            send_gw(s, g, &env);
        }
        wk_ejob_free(j);
    }
}

static void on_model_info_request(server *s, const Llmserve__ModelInfoRequest *r) {
    gateway *gw = find_gw(s, r->gateway_id);
    if (!gw) return; /* its Hello comes first, every second */
    Llmserve__ModelInfo mi = LLMSERVE__MODEL_INFO__INIT;
    mi.worker_id = (char *)s->o->worker_id;
    mi.model = (char *)s->o->model_name;
    mi.has_max_model_len = mi.has_block_size = mi.has_vocab = mi.has_incarnation = mi.has_tokenizer_fingerprint = 1;
    mi.max_model_len = s->max_model_len;
    mi.block_size = s->block_size;
    mi.vocab = s->vocab;
    mi.incarnation = s->incarnation;
    mi.tokenizer_fingerprint = s->tok_fp;
    mi.has_tokenizer_gguf = 1;
    mi.tokenizer_gguf.data = s->tok_gguf;
    mi.tokenizer_gguf.len = s->tok_len;
    mi.worker_tag = gw->tag[0] ? gw->tag : NULL;
    if (s->eq) {
        mi.has_task = mi.has_embedding_dim = 1;
        mi.task = LLMSERVE__TASK__TASK_EMBED;
        mi.embedding_dim = (uint32_t)s->embed_dim;
    }
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_MODEL_INFO;
    env.model_info = &mi;
    send_gw(s, (int)(gw - s->gw), &env);
}

static void handle(server *s, pr_env *env) {
    switch (env->body_case) {
    case LLMSERVE__ENVELOPE__BODY_MODEL_INFO_REQUEST: on_model_info_request(s, env->model_info_request); break;
    case LLMSERVE__ENVELOPE__BODY_HELLO: on_hello(s, env->hello); break;
    case LLMSERVE__ENVELOPE__BODY_GENERATE: on_generate(s, env->generate); break;
    case LLMSERVE__ENVELOPE__BODY_CANCEL: on_cancel(s, env->cancel); break;
    case LLMSERVE__ENVELOPE__BODY_EMBED: on_embed(s, env->embed); break;
    case LLMSERVE__ENVELOPE__BODY_STATS_REQUEST: {
        gateway *gw = find_gw(s, env->stats_request->gateway_id);
        if (!gw) break;
        Llmserve__Stats st;
        fill_stats(s, &st, s->spec_pos);
        pr_env out;
        pr_env_init(&out);
        out.body_case = LLMSERVE__ENVELOPE__BODY_STATS;
        out.stats = &st;
        send_gw(s, (int)(gw - s->gw), &out);
        break;
    }
    default:
        s->dropped++;
        CM_WARN("unexpected message (body %d) dropped", env->body_case);
    }
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

static void send_outputs(server *s) {
    const wk_output *o;
    int n = wk_engine_outputs(s->e, &o);
    for (int i = 0; i < n; i++) {
        slot *sl = slot_of(s, o[i].id);
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
        if (o[i].finish && --sl->choices_left <= 0) slot_free(s, sl);
        send_gw(s, g, &env);
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

static void ev_add(ev_buf *b, int kind, uint64_t key, uint64_t parent) {
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
    b->n++;
}

static void key_cb(void *ctx, uint64_t key) {
    ev_add(ctx, LLMSERVE__KV_EVENT__KIND__STORED, key, 0);
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
            send_gw(s, g, &env);
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
                   ev[i].key, ev[i].parent);
    if (b.n) send_events(s, &b, 0, -1);
    for (int g = 0; g < MAX_GATEWAYS; g++) {
        if (!s->gw[g].used || !s->gw[g].snapshot_due) continue;
        s->gw[g].snapshot_due = 0;
        b.n = 0;
        wk_engine_each_key(s->e, key_cb, &b);
        send_events(s, &b, 1, g);
    }
    free(b.ev);
}

static void check_timeouts(server *s) {
    int64_t t = now_ms(), w = (int64_t)cm_wall_ms();
    int hb = s->o->heartbeat_timeout_ms > 0 ? s->o->heartbeat_timeout_ms : 5000;
    for (int g = 0; g < MAX_GATEWAYS; g++)
        if (s->gw[g].used && t - s->gw[g].last_heard > hb) drop_gateway(s, g, "no heartbeat");
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->used || sl->timed_out || !sl->deadline_ms || sl->deadline_ms > w) continue;
        sl->timed_out = 1; /* its abort output goes out as a timeout */
        if (s->e) {
            wk_engine_abort(s->e, sl->eid);
        } else {
            wk_embed_remove(s->eq, sl->eid);
            send_embed_error(s, sl->gw, sl->rid, LLM_ETIMEDOUT, "deadline exceeded");
            slot_free(s, sl);
        }
    }
}

/* The gateway a message comes from, or NULL. */
static const char *gateway_of(const pr_env *env) {
    switch (env->body_case) {
    case LLMSERVE__ENVELOPE__BODY_HELLO: return env->hello->gateway_id;
    case LLMSERVE__ENVELOPE__BODY_GENERATE: return env->generate->gateway_id;
    case LLMSERVE__ENVELOPE__BODY_CANCEL: return env->cancel->gateway_id;
    case LLMSERVE__ENVELOPE__BODY_STATS_REQUEST: return env->stats_request->gateway_id;
    case LLMSERVE__ENVELOPE__BODY_MODEL_INFO_REQUEST: return env->model_info_request->gateway_id;
    case LLMSERVE__ENVELOPE__BODY_EMBED: return env->embed->gateway_id;
    default: return NULL;
    }
}

/* The receiving thread: touches no engine state. */
static void *receiver(void *arg) {
    server *s = arg;
    nng_socket_set_ms(s->pull, NNG_OPT_RECVTIMEO, 100);
    while (!s->rx_stop) {
        pr_env *env;
        char e2[256];
        uint32_t pv = 0;
        int rc = pr_recv(s->pull, &env, 0, &pv, e2, sizeof e2);
        if (rc == LLM_EAGAIN || rc == LLM_ETIMEDOUT) continue;
        pthread_mutex_lock(&s->mu);
        if (rc) {
            s->dropped++;
            pthread_mutex_unlock(&s->mu);
            if (rc == LLM_EIO) { /* the socket itself failed: not a message; do not spin */
                usleep(10000);
                continue;
            }
            s->bad_since++;
            int64_t t = now_ms();
            if (t - s->bad_logged >= 10000 || s->bad_logged == 0) { /* a stranger's flood is one line every 10 s */
                CM_WARN("message dropped: %s (%llu since the last report)", e2, (unsigned long long)s->bad_since);
                s->bad_logged = t;
                s->bad_since = 0;
            }
            continue;
        }
        const char *gid = gateway_of(env);
        gateway *gw = gid ? find_gw(s, gid) : NULL;
        if (gw && (env->body_case != LLMSERVE__ENVELOPE__BODY_HELLO || !strcmp(gw->reply, env->hello->reply_address)))
            gw->last_heard = now_ms(); /* alive, whatever the loop is doing */
        rxmsg *m = NULL;
        int generate = env->body_case == LLMSERVE__ENVELOPE__BODY_GENERATE;
        int embed = env->body_case == LLMSERVE__ENVELOPE__BODY_EMBED;
        if ((generate || embed) && s->rx_n >= RX_CAP) {
            if (gw && generate)
                send_error_chunk(s, (int)(gw - s->gw), env->generate->request_id, LLM_EAGAIN,
                                 "worker overloaded: its receive queue is full", LLMSERVE__FINISH_REASON__FINISH_ERROR);
            if (gw && embed)
                send_embed_error(s, (int)(gw - s->gw), env->embed->request_id, LLM_EAGAIN,
                                 "worker overloaded: its receive queue is full");
            s->rx_refused++;
        } else if (s->rx_n >= RX_HARD_CAP || !(m = malloc(sizeof *m))) {
            s->dropped++;
        }
        if (m) {
            m->env = env;
            m->next = NULL;
            if (s->rx_tail) s->rx_tail->next = m;
            else s->rx_head = m;
            s->rx_tail = m;
            s->rx_n++;
            pthread_cond_signal(&s->rx_cv);
        } else {
            pr_free(env);
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* Loop thread, under mu: everything queued, in arrival order. When idle
 * and nothing is queued, waits up to 50 ms for a message first. */
static void drain_queue(server *s, int idle) {
    if (idle && !s->rx_head) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->rx_cv, &s->mu, &ts);
    }
    rxmsg *m = s->rx_head;
    s->rx_head = s->rx_tail = NULL;
    s->rx_n = 0;
    while (m) {
        rxmsg *next = m->next;
        handle(s, m->env);
        pr_free(m->env);
        free(m);
        m = next;
    }
}

static void *heartbeat(void *arg) {
    server *s = arg;
    while (!s->hb_stop) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&s->mu);
        /* a loop stuck in one step for 30 s is not ready, whatever it says */
        Llmserve__Stats st = s->snap;
        for (int g = 0; g < MAX_GATEWAYS && now_ms() - s->last_progress < 30000; g++)
            if (s->gw[g].used) send_health_with(s, g, &st);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* The group is going down (a rank died, the device failed): every gateway
 * hears it for each of its requests now, instead of after its heartbeat
 * window. LLM_EAGAIN: one that has no token yet moves to another group. */
static void tell_gateways_going(server *s, const char *why) {
    char msg[300];
    snprintf(msg, sizeof msg, "the worker group stopped (%s)", why);
    pthread_mutex_lock(&s->mu);
    int told = 0;
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].used) {
            send_error_chunk(s, s->slots[i].gw, s->slots[i].rid, LLM_EAGAIN, msg, LLMSERVE__FINISH_REASON__FINISH_ERROR);
            told++;
        }
    pthread_mutex_unlock(&s->mu);
    CM_ERR("%s: told the gateways of its %d requests", msg, told);
    struct timespec ts = {0, 200000000}; /* let the messages leave before the sockets close */
    nanosleep(&ts, NULL);
}

/* Two short requests, start to end, before the first client: the first
 * steps pay for page faults in the weights, kernels' first launches and an
 * unmeasured cost model (two prompt sizes and their decodes give the fit
 * its three coefficients and the noise its scale, so the first client's
 * deadline is judged on evidence). */
static int warm_up(wk_engine *e, char *err, size_t errlen) {
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

/* Either a generation engine (e) or an embedding queue (eq). */
static int serve(wk_engine *e, wk_embed *eq, const wk_server_opts *o, volatile sig_atomic_t *stop, char *err,
                 size_t errlen) {
    if (o->warmup && e) {
        double t0 = (double)now_ms();
        int rc = warm_up(e, err, errlen);
        if (rc) return rc;
        CM_INFO("warmed up in %.0f ms", (double)now_ms() - t0);
    }
    server *s = calloc(1, sizeof *s);
    if (!s) return LLM_ENOMEM;
    s->e = e;
    s->eq = eq;
    s->o = o;
    const cm_tokenizer *tok;
    if (e) {
        const wk_model *m = wk_engine_model(e);
        s->max_model_len = wk_engine_options(e)->max_model_len;
        s->block_size = wk_engine_options(e)->block_size;
        s->vocab = (int)m->cfg.vocab;
        tok = m->tok;
    } else {
        s->max_model_len = wk_encoder_max_len(eq->enc);
        s->vocab = (int)eq->enc->cfg.vocab;
        s->embed_dim = (int)eq->enc->cfg.dim;
        tok = eq->enc->tok;
    }
    s->tp = o->tp_size > 0 ? o->tp_size : 1;
    if (getrandom(&s->incarnation, sizeof s->incarnation, 0) != sizeof s->incarnation)
        s->incarnation = (uint64_t)now_ms() * 2654435761u ^ (uint64_t)getpid();
    if (tok && cm_tok_export(tok, &s->tok_gguf, &s->tok_len) == 0) s->tok_fp = cm_tok_fingerprint(tok);
    int rv = nng_pull0_open(&s->pull);
    if (!rv) rv = nng_socket_set_size(s->pull, NNG_OPT_RECVMAXSZ, PR_MAX_MSG);
    if (!rv) rv = nng_socket_set_int(s->pull, NNG_OPT_RECVBUF, 1024);
    if (!rv) rv = nng_listen(s->pull, o->listen, NULL, 0);
    if (rv) {
        snprintf(err, errlen, "cannot listen on %s: %s", o->listen, nng_strerror(rv));
        if (s->pull.id) nng_close(s->pull);
        free(s->tok_gguf);
        free(s);
        return LLM_EIO;
    }
    CM_INFO("worker %s listening on %s (incarnation %016llx, tokenizer %016llx, %zu bytes for gateways)", o->worker_id,
            o->listen, (unsigned long long)s->incarnation, (unsigned long long)s->tok_fp, s->tok_len);
    pthread_mutex_init(&s->mu, NULL);
    fill_stats(s, &s->snap, s->spec_pos_snap);
    s->last_progress = now_ms();
    pthread_cond_init(&s->rx_cv, NULL);
    pthread_t hb;
    int have_hb = pthread_create(&hb, NULL, heartbeat, s) == 0;
    if (pthread_create(&s->rx, NULL, receiver, s)) {
        snprintf(err, errlen, "cannot start the receiving thread");
        s->hb_stop = 1;
        if (have_hb) pthread_join(hb, NULL);
        nng_close(s->pull);
        free(s->tok_gguf);
        free(s);
        return LLM_ENOMEM;
    }
    int64_t last_check = now_ms(), drain_until = 0;
    wk_health_set_state(o->health, WK_H_READY);
    for (;;) {
        wk_health_beat(o->health);
        if (*stop && !s->draining) { /* SIGTERM: finish what runs, take nothing new */
            pthread_mutex_lock(&s->mu);
            s->draining = 1;
            pthread_mutex_unlock(&s->mu);
            wk_health_set_state(o->health, WK_H_DRAINING);
            int64_t ms = o->shutdown_timeout_ms >= 0 ? o->shutdown_timeout_ms : 30000;
            drain_until = now_ms() + ms;
            CM_INFO("draining: %d requests running, up to %lld ms (a second signal stops at once)", s->live, (long long)ms);
        }
        if (s->draining && (s->live == 0 || now_ms() >= drain_until || *stop > 1)) {
            if (s->live) { /* out of time: the rest end as aborted, which their clients see */
                CM_WARN("drain timeout: aborting %d requests", s->live);
                pthread_mutex_lock(&s->mu);
                for (int i = 0; i < s->n_slots; i++) {
                    if (!s->slots[i].used) continue;
                    if (e) {
                        wk_engine_abort(e, s->slots[i].eid);
                    } else {
                        wk_embed_remove(eq, s->slots[i].eid);
                        send_embed_error(s, s->slots[i].gw, s->slots[i].rid, LLM_EAGAIN, "the worker shut down");
                    }
                }
                if (e) send_outputs(s);
                pthread_mutex_unlock(&s->mu);
            }
            break;
        }
        /* everything that arrived; wait a little only when idle */
        int idle = e ? !wk_engine_has_work(e) : !wk_embed_has_work(eq);
        pthread_mutex_lock(&s->mu);
        drain_queue(s, idle);
        if (now_ms() - last_check >= 100) {
            check_timeouts(s);
            last_check = now_ms();
        }
        apply_drops(s);
        pthread_mutex_unlock(&s->mu);
        if (e ? wk_engine_has_work(e) : wk_embed_has_work(eq)) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            int rc = e ? wk_engine_step(e) : wk_embed_step(eq);
            clock_gettime(CLOCK_MONOTONIC, &b);
            if (rc < 0) {
                snprintf(err, errlen, "engine step failed: %s", cm_strerror(rc));
                tell_gateways_going(s, err);
                break;
            }
            s->step_ms[s->step_at] = (float)((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6);
            s->step_at = (s->step_at + 1) % 1024;
            s->n_step++;
        }
        pthread_mutex_lock(&s->mu);
        if (e) {
            send_outputs(s);
            publish_events(s);
        } else {
            send_embed_results(s);
        }
        apply_drops(s);
        fill_stats(s, &s->snap, s->spec_pos_snap);
        s->last_progress = now_ms();
        pthread_mutex_unlock(&s->mu);
    }
    s->hb_stop = 1;
    s->rx_stop = 1;
    if (have_hb) pthread_join(hb, NULL);
    pthread_join(s->rx, NULL);
    for (rxmsg *q = s->rx_head, *next; q; q = next) {
        next = q->next;
        pr_free(q->env);
        free(q);
    }
    pthread_cond_destroy(&s->rx_cv);
    pthread_mutex_destroy(&s->mu);
    for (int g = 0; g < MAX_GATEWAYS; g++)
        if (s->gw[g].used) nng_close(s->gw[g].push);
    nng_close(s->pull);
    free(s->slots);
    free(s->tok_gguf);
    int drained = s->draining;
    free(s);
    return drained ? 0 : LLM_EIO;
}

int wk_server_run(wk_engine *e, const wk_server_opts *o, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    return serve(e, NULL, o, stop, err, errlen);
}

int wk_server_run_embed(wk_encoder *enc, const wk_server_opts *o, volatile sig_atomic_t *stop, char *err,
                        size_t errlen) {
    wk_embed q;
    int rc = wk_embed_init(&q, enc);
    if (rc) return rc;
    if (o->warmup) { /* one short input first: page faults in the weights are not the first client's */
        int32_t t[4] = {0, 1, 2, 3}, *tp = t, n = 4;
        char e2[200];
        double t0 = (double)now_ms();
        if (wk_embed_add(&q, 1, 0, 1, (const int32_t *const *)&tp, &n, e2, sizeof e2) == 0 && wk_embed_step(&q) == 0)
            CM_INFO("warmed up in %.0f ms", (double)now_ms() - t0);
        for (wk_ejob *j = wk_embed_take_done(&q), *nx; j; j = nx) {
            nx = j->next;
            wk_ejob_free(j);
        }
    }
    rc = serve(NULL, &q, o, stop, err, errlen);
    wk_embed_free(&q);
    return rc;
}
