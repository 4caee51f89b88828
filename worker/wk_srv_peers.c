/* wk_srv_peers.c - the gateways a worker serves and the requests they
 * have in flight: registration (Hello), liveness and drops, Health,
 * ModelInfo and Stats, sends that never block the loop, and the slots that
 * map a gateway's request id to the backend's. */
#include "wk_srv.h"
#include "wk_flags.h"
#include "wk_lora.h"

#include "cm_error.h"
#include "cm_log.h"

#include <nng/protocol/pipeline0/push.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

gateway *wk_srv_find_gw(server *s, const char *id) {
    for (int i = 0; i < MAX_GATEWAYS; i++)
        if (s->gw[i].used && !strcmp(s->gw[i].id, id)) return &s->gw[i];
    return NULL;
}

slot *wk_srv_find_req(server *s, int gw, uint64_t rid) {
    uintptr_t i = (uintptr_t)cm_idmap_get(&s->gw[gw].reqs, rid);
    return i ? &s->slots[i - 1] : NULL;
}

slot *wk_srv_slot_of(server *s, uint64_t eid) {
    uint64_t i = eid & ((1u << SLOT_BITS) - 1);
    if (i >= (uint64_t)s->n_slots || !s->slots[i].used || s->slots[i].eid != eid) return NULL;
    return &s->slots[i];
}

slot *wk_srv_slot_new(server *s, int gw, uint64_t rid) {
    int i = s->free_slot - 1;
    if (i >= 0) {
        s->free_slot = s->slots[i].next_free;
    } else {
        if (s->n_slots == (1 << SLOT_BITS)) return NULL;
        if (s->n_slots == s->cap_slots) {
            int cap = s->cap_slots ? 2 * s->cap_slots : 256;
            slot *n = realloc(s->slots, sizeof *n * (size_t)cap);
            if (!n) return NULL;
            s->slots = n;
            s->cap_slots = cap;
        }
        i = s->n_slots++;
    }
    slot *sl = &s->slots[i];
    *sl = (slot){0, gw, 0, rid, (++s->counter << SLOT_BITS) | (uint64_t)i, 0, 0, 1, 0};
    return sl;
}

void wk_srv_slot_start(server *s, slot *sl, int64_t deadline_ms) {
    if (cm_idmap_put(&s->gw[sl->gw].reqs, sl->rid, (void *)(uintptr_t)(sl - s->slots + 1))) {
        /* no room to find it by id: it still runs and answers; only a Cancel for it is not found */
        CM_WARN("request %llu: out of memory for its id", (unsigned long long)sl->rid);
    }
    sl->used = 1;
    sl->reserved = 0;
    sl->deadline_ms = deadline_ms;
    s->live++;
}

void wk_srv_slot_free(server *s, slot *sl) {
    if (sl->used) {
        if ((uintptr_t)cm_idmap_get(&s->gw[sl->gw].reqs, sl->rid) == (uintptr_t)(sl - s->slots + 1))
            cm_idmap_del(&s->gw[sl->gw].reqs, sl->rid);
        s->live--;
    } else if (!sl->reserved) {
        return; /* free already */
    }
    sl->used = sl->reserved = 0;
    sl->next_free = s->free_slot;
    s->free_slot = (int)(sl - s->slots) + 1;
}

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
        s->be->end(s, sl, WK_END_DROP, msg); /* told to the gateway: a no-op if it is not reading */
        aborted++;
    }
    s->gw_dropped++;
    s->aborted_on_drop += (uint64_t)aborted;
    CM_WARN("gateway %s dropped (%s); %d requests aborted%s", gw->id, why, aborted,
            aborted && !gw->drop_due ? " and reported to it" : "");
    if (gw->linger_until) nng_close(gw->linger); /* an earlier drop's, still open */
    gw->linger_until = 0;
    if (aborted && !gw->drop_due) { /* the reports are queued: a second for them to leave */
        gw->linger = gw->push;
        gw->linger_until = now_ms() + 1000;
    } else {
        nng_close(gw->push);
    }
    cm_idmap_free(&gw->reqs);
    gw->used = 0;
    /* the abort outputs of its requests have no slot any more and are ignored */
}

void wk_srv_send(server *s, int g, pr_env *env) {
    gateway *gw = &s->gw[g];
    if (!gw->used || gw->drop_due) return;
    int rc = pr_send(gw->push, env, NNG_FLAG_NONBLOCK);
    if (rc == LLM_EAGAIN) gw->drop_due = 1; /* dropped by the loop thread, which owns the engine */
    else if (rc) CM_WARN("send to gateway %s failed: %s", gw->id, cm_strerror(rc));
}

/* Loop thread only: drops the gateways whose buffers filled. */
void wk_srv_apply_drops(server *s) {
    for (int g = 0; g < MAX_GATEWAYS; g++)
        if (s->gw[g].used && s->gw[g].drop_due) drop_gateway(s, g, "not reading: send buffer full");
}

void wk_srv_send_error_chunk(server *s, int g, uint64_t rid, int code, const char *msg, int finish) {
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
    wk_srv_send(s, g, &env);
}

void wk_srv_send_embed_error(server *s, int g, uint64_t rid, int code, const char *msg) {
    Llmserve__EmbedResult r = LLMSERVE__EMBED_RESULT__INIT;
    r.request_id = rid;
    r.error = (char *)msg;
    r.has_error_code = 1;
    r.error_code = code;
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_EMBED_RESULT;
    env.embed_result = &r;
    wk_srv_send(s, g, &env);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* pos: where the accepted-per-position counts live while st is in use. */
void wk_srv_fill_stats(server *s, Llmserve__Stats *st, uint64_t *pos) {
    wk_engine_stats es;
    memset(&es, 0, sizeof es);
    s->be->stats(s, &es);
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
    SET(tp_size, (uint32_t)s->tp);
    SET(gateways_dropped, s->gw_dropped);
    SET(requests_aborted_on_drop, s->aborted_on_drop);
    SET(messages_refused, s->rx_refused + s->dropped);
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
    if (s->be->stats_extra) s->be->stats_extra(s, &es, st, pos);
#undef SET
}

static void send_health_with(server *s, int g, Llmserve__Stats *stp);

static void send_health(server *s, int g) {
    Llmserve__Stats st;
    wk_srv_fill_stats(s, &st, s->spec_pos);
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
    h.has_lora_version = 1;
    h.lora_version = __atomic_load_n(&s->lora_version, __ATOMIC_RELAXED);
    if (s->be->task == LLMSERVE__TASK__TASK_EMBED) {
        h.has_task = h.has_embedding_dim = 1;
        h.task = LLMSERVE__TASK__TASK_EMBED;
        h.embedding_dim = (uint32_t)s->embed_dim;
    }
    if (s->o->kv_role != WK_KV_BOTH) {
        h.has_kv_role = 1;
        h.kv_role = s->o->kv_role == WK_KV_PRODUCER ? LLMSERVE__KV_ROLE__KV_PRODUCER : LLMSERVE__KV_ROLE__KV_CONSUMER;
    }
    h.stats = &st;
    h.worker_tag = s->gw[g].tag[0] ? s->gw[g].tag : NULL;
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_HEALTH;
    env.health = &h;
    wk_srv_send(s, g, &env);
}

void wk_srv_on_hello(server *s, const Llmserve__Hello *h) {
    gateway *gw = wk_srv_find_gw(s, h->gateway_id);
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
        nng_socket lg = gw->linger; /* a dropped gateway's socket still flushing keeps its close time */
        int64_t lu = gw->linger_until;
        memset(gw, 0, sizeof *gw);
        gw->linger = lg, gw->linger_until = lu;
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

/* The adapters a group serves now, for a LoraUpdateResult or a ModelInfo: up to max names. */
size_t wk_srv_lora_names(server *s, char **names, size_t max) {
    size_t n = 0;
    const wk_model *m = s->e && s->be->task == LLMSERVE__TASK__TASK_GENERATE ? wk_engine_model(s->e) : NULL;
    for (int i = 0; m && i < m->n_loras && n < max; i++)
        if (m->loras[i] && !m->loras[i]->dead) names[n++] = m->loras[i]->name;
    return n;
}

void wk_srv_on_model_info(server *s, const Llmserve__ModelInfoRequest *r) {
    gateway *gw = wk_srv_find_gw(s, r->gateway_id);
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
    char *loras[WK_MAX_LORA_MODULES];
    mi.n_loras = wk_srv_lora_names(s, loras, WK_MAX_LORA_MODULES);
    mi.loras = loras;
    mi.has_lora_version = mi.has_max_loras = s->be->task == LLMSERVE__TASK__TASK_GENERATE;
    mi.lora_version = __atomic_load_n(&s->lora_version, __ATOMIC_RELAXED);
    mi.max_loras = mi.has_max_loras ? (uint32_t)wk_engine_model(s->e)->max_loras : 0;
    if (s->be->task == LLMSERVE__TASK__TASK_EMBED) {
        mi.has_task = mi.has_embedding_dim = 1;
        mi.task = LLMSERVE__TASK__TASK_EMBED;
        mi.embedding_dim = (uint32_t)s->embed_dim;
    }
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_MODEL_INFO;
    env.model_info = &mi;
    wk_srv_send(s, (int)(gw - s->gw), &env);
}

int wk_srv_gateway_for(server *s, const char *id, const char *reply) {
    gateway *gw = wk_srv_find_gw(s, id);
    if (!gw && reply && reply[0]) { /* dropped earlier, or its Hello was lost: register it */
        Llmserve__Hello h = LLMSERVE__HELLO__INIT;
        h.gateway_id = (char *)id;
        h.reply_address = (char *)reply;
        wk_srv_on_hello(s, &h);
        gw = wk_srv_find_gw(s, id);
    }
    if (!gw) {
        s->dropped++;
        return -1;
    }
    gw->last_heard = now_ms();
    return (int)(gw - s->gw);
}

void wk_srv_refuse_duplicate(server *s, slot *sl) {
    char msg[160];
    snprintf(msg, sizeof msg, "duplicate request id %llu: a request with this id is running here",
             (unsigned long long)sl->rid);
    if (s->be->task == LLMSERVE__TASK__TASK_EMBED) {
        wk_srv_send_embed_error(s, sl->gw, sl->rid, LLM_EINVAL, msg);
        return;
    }
    /* in the running request's sequence, so the gateway takes it as that request's end */
    Llmserve__TokenChunk ch = LLMSERVE__TOKEN_CHUNK__INIT;
    ch.request_id = sl->rid;
    ch.seq = sl->seq++;
    ch.has_finish = ch.has_error_code = 1;
    ch.finish = LLMSERVE__FINISH_REASON__FINISH_ERROR;
    ch.error = msg;
    ch.error_code = LLM_EINVAL;
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_CHUNK;
    env.chunk = &ch;
    wk_srv_send(s, sl->gw, &env);
}

void wk_srv_on_stats_request(server *s, const Llmserve__StatsRequest *r) {
    gateway *gw = wk_srv_find_gw(s, r->gateway_id);
    if (!gw) return;
    Llmserve__Stats st;
    wk_srv_fill_stats(s, &st, s->spec_pos);
    pr_env out;
    pr_env_init(&out);
    out.body_case = LLMSERVE__ENVELOPE__BODY_STATS;
    out.stats = &st;
    wk_srv_send(s, (int)(gw - s->gw), &out);
}

void wk_srv_close_lingering(server *s, int64_t t) {
    for (int g = 0; g < MAX_GATEWAYS; g++)
        if (s->gw[g].linger_until && t >= s->gw[g].linger_until) {
            nng_close(s->gw[g].linger);
            s->gw[g].linger_until = 0;
        }
}

void wk_srv_check_timeouts(server *s) {
    int64_t t = now_ms(), w = (int64_t)cm_wall_ms();
    int hb = s->o->heartbeat_timeout_ms > 0 ? s->o->heartbeat_timeout_ms : 5000;
    for (int g = 0; g < MAX_GATEWAYS; g++)
        if (s->gw[g].used && t - s->gw[g].last_heard > hb) drop_gateway(s, g, "no heartbeat");
    wk_srv_close_lingering(s, t);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->used || sl->timed_out || !sl->deadline_ms || sl->deadline_ms > w) continue;
        sl->timed_out = 1;
        s->be->end(s, sl, WK_END_DEADLINE, NULL);
    }
}

void *wk_srv_heartbeat(void *arg) {
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
void wk_srv_tell_going(server *s, const char *why) {
    char msg[300];
    snprintf(msg, sizeof msg, "the worker group stopped (%s)", why);
    pthread_mutex_lock(&s->mu);
    int told = 0;
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].used) {
            wk_srv_send_error_chunk(s, s->slots[i].gw, s->slots[i].rid, LLM_EAGAIN, msg, LLMSERVE__FINISH_REASON__FINISH_ERROR);
            told++;
        }
    pthread_mutex_unlock(&s->mu);
    CM_ERR("%s: told the gateways of its %d requests", msg, told);
    struct timespec ts = {0, 200000000}; /* let the messages leave before the sockets close */
    nanosleep(&ts, NULL);
}

/* One line of Prometheus text (with its HELP and TYPE) into b at *n. */
static void wk_srv_metric(char *b, size_t cap, size_t *n, const char *name, const char *type, const char *help,
                   const char *labels, double v) {
    if (*n >= cap) return;
    int k = snprintf(b + *n, cap - *n, "# HELP %s %s\n# TYPE %s %s\n%s%s %.17g\n", name, help, name, type, name, labels, v);
    if (k > 0) *n += (size_t)k < cap - *n ? (size_t)k : cap - *n;
}

/* A family of two series that differ in one label (besides the model's). */
static void wk_srv_metric2(char *b, size_t cap, size_t *n, const char *name, const char *type, const char *help,
                    const char *model, const char *label, const char *l1, double v1, const char *l2, double v2) {
    if (*n >= cap) return;
    int k = snprintf(b + *n, cap - *n,
                     "# HELP %s %s\n# TYPE %s %s\n%s{model_name=\"%.200s\",%s=\"%s\"} %.17g\n"
                     "%s{model_name=\"%.200s\",%s=\"%s\"} %.17g\n",
                     name, help, name, type, name, model, label, l1, v1, name, model, label, l2, v2);
    if (k > 0) *n += (size_t)k < cap - *n ? (size_t)k : cap - *n;
}

/* The lower KV tiers' series, when the group has them. */
static void tier_metrics(const server *s, const Llmserve__Stats *st, const char *model, const char *lab, char *b,
                         size_t cap, size_t *n) {
    if (!st->has_kv_tier_ram_blocks) return;
    double bs = (double)wk_engine_options(s->e)->block_size;
    wk_srv_metric(b, cap, n, "vllm:external_prefix_cache_hits_total", "counter",
           "Prompt tokens loaded from the lower KV tiers, not computed.", lab,
           bs * (double)(st->kv_tier_ram_hits + st->kv_tier_disk_hits));
    wk_srv_metric2(b, cap, n, "llmserve:kv_tier_hit_tokens_total", "counter", "Prompt tokens loaded back from a lower KV tier.",
            model, "tier", "memory", bs * (double)st->kv_tier_ram_hits, "disk", bs * (double)st->kv_tier_disk_hits);
    wk_srv_metric2(b, cap, n, "llmserve:kv_tier_blocks", "gauge", "KV blocks held in a lower tier.", model, "tier", "memory",
            (double)st->kv_tier_ram_blocks, "disk", (double)st->kv_tier_disk_blocks);
    wk_srv_metric2(b, cap, n, "llmserve:kv_tier_bytes", "gauge", "Bytes a lower KV tier holds.", model, "tier", "memory",
            (double)st->kv_tier_ram_bytes, "disk", (double)st->kv_tier_disk_bytes);
    wk_srv_metric(b, cap, n, "llmserve:kv_tier_offload_bytes_total", "counter", "K/V bytes moved down from the pool.", lab,
           (double)st->kv_tier_bytes_out);
    wk_srv_metric(b, cap, n, "llmserve:kv_tier_load_bytes_total", "counter", "K/V bytes loaded back into the pool.", lab,
           (double)st->kv_tier_bytes_in);
    if (*n < cap) {
        int k = snprintf(b + *n, cap - *n,
                         "# HELP llmserve:kv_tier_load_seconds Time to load a block back from a lower tier.\n"
                         "# TYPE llmserve:kv_tier_load_seconds summary\n"
                         "llmserve:kv_tier_load_seconds_sum%s %.17g\nllmserve:kv_tier_load_seconds_count%s %.17g\n",
                         lab, st->kv_tier_load_ms_sum / 1e3, lab, (double)(st->kv_tier_ram_hits + st->kv_tier_disk_hits));
        if (k > 0) *n += (size_t)k < cap - *n ? (size_t)k : cap - *n;
    }
    wk_srv_metric(b, cap, n, "llmserve:kv_tier_corrupt_total", "counter", "Block files refused as truncated or corrupt.", lab,
           (double)st->kv_tier_corrupt);
    wk_srv_metric(b, cap, n, "llmserve:kv_tier_write_errors_total", "counter", "Block files that could not be written.", lab,
           (double)st->kv_tier_write_errors);
    wk_srv_metric(b, cap, n, "llmserve:kv_tier_dropped_total", "counter", "Blocks dropped from the last tier.", lab,
           (double)st->kv_tier_dropped);
}

/* Disaggregated prefill and decode's series, when the group moves KV (wk_srv_kv.c fills them). */
static void kv_metrics(const Llmserve__Stats *st, const char *model, const char *lab, char *b, size_t cap, size_t *n) {
    if (!st->has_kv_xfer_sent_blocks) return;
    char rl[300];
    unsigned role = st->has_kv_role ? st->kv_role : 0;
    snprintf(rl, sizeof rl, "{model_name=\"%.200s\",role=\"%s\"}", model, wk_kv_role_name((int)role));
    wk_srv_metric(b, cap, n, "llmserve:kv_role", "gauge",
                  "The group's role in disaggregated prefill and decode (--kv-transfer-config).", rl, 1);
    wk_srv_metric2(b, cap, n, "llmserve:kv_transfer_blocks_total", "counter", "KV blocks moved between groups.", model,
                   "direction", "sent", (double)st->kv_xfer_sent_blocks, "received", (double)st->kv_xfer_recv_blocks);
    wk_srv_metric2(b, cap, n, "llmserve:kv_transfer_bytes_total", "counter", "KV payload bytes moved between groups.",
                   model, "direction", "sent", (double)st->kv_xfer_sent_bytes, "received", (double)st->kv_xfer_recv_bytes);
    wk_srv_metric2(b, cap, n, "llmserve:kv_transfers_total", "counter", "Transfers ended (their last message).", model,
                   "direction", "sent", (double)st->kv_xfer_sent_done, "received", (double)st->kv_xfer_recv_done);
    wk_srv_metric(b, cap, n, "llmserve:kv_transfer_failed_total", "counter",
                  "Transfers this group could not send (its destination gone or not reading).", lab,
                  (double)st->kv_xfer_send_failed);
    wk_srv_metric(b, cap, n, "llmserve:kv_transfer_refused_blocks_total", "counter",
                  "Blocks received and refused (another model, a bad key or size).", lab, (double)st->kv_xfer_refused);
    wk_srv_metric(b, cap, n, "llmserve:kv_transfer_wait_expired_total", "counter",
                  "Decode requests that stopped waiting for their transfer and computed the rest.", lab,
                  (double)st->kv_xfer_wait_expired);
    if (*n >= cap) return;
    int w = snprintf(b + *n, cap - *n,
                     "# HELP llmserve:kv_transfer_seconds A received transfer's last message: from its sending (the "
                     "prefill's end) to its adoption here.\n# TYPE llmserve:kv_transfer_seconds histogram\n");
    if (w > 0) *n += (size_t)w < cap - *n ? (size_t)w : cap - *n;
    uint64_t cum = 0;
    for (size_t i = 0; i < st->n_kv_xfer_ms_bucket && i < WK_KV_BUCKETS && *n < cap; i++) {
        cum += st->kv_xfer_ms_bucket[i];
        char le[32];
        if (i < WK_KV_BUCKETS - 1) snprintf(le, sizeof le, "%g", wk_kv_bucket_ms[i] / 1e3);
        else snprintf(le, sizeof le, "+Inf");
        w = snprintf(b + *n, cap - *n, "llmserve:kv_transfer_seconds_bucket{model_name=\"%.200s\",le=\"%s\"} %llu\n",
                     model, le, (unsigned long long)cum);
        if (w > 0) *n += (size_t)w < cap - *n ? (size_t)w : cap - *n;
    }
    if (*n >= cap) return;
    w = snprintf(b + *n, cap - *n, "llmserve:kv_transfer_seconds_sum%s %.17g\nllmserve:kv_transfer_seconds_count%s %llu\n",
                 lab, st->kv_xfer_ms_sum / 1e3, lab, (unsigned long long)st->kv_xfer_recv_done);
    if (w > 0) *n += (size_t)w < cap - *n ? (size_t)w : cap - *n;
}

size_t wk_srv_metrics_text(const server *s, const Llmserve__Stats *st, char *b, size_t cap) {
    char lab[300];
    const char *model = s->o->model_name ? s->o->model_name : "unknown";
    snprintf(lab, sizeof lab, "{model_name=\"%.200s\"}", model);
    size_t n = 0;
    double kv = st->blocks_total ? 1.0 - (double)st->blocks_free / (double)st->blocks_total : 0.0;
    wk_srv_metric(b, cap, &n, "vllm:num_requests_running", "gauge", "Requests running on this group.", lab, st->running);
    wk_srv_metric(b, cap, &n, "vllm:num_requests_waiting", "gauge", "Requests waiting on this group.", lab, st->waiting);
    wk_srv_metric(b, cap, &n, "vllm:kv_cache_usage_perc", "gauge", "KV cache usage, 0 to 1.", lab, kv);
    wk_srv_metric(b, cap, &n, "vllm:num_preemptions_total", "counter", "Sequences preempted.", lab, (double)st->preemptions);
    wk_srv_metric(b, cap, &n, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in tokens.", lab,
           (double)st->prefix_queries);
    wk_srv_metric(b, cap, &n, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.", lab,
           (double)st->prefix_hits);
    wk_srv_metric(b, cap, &n, "vllm:generation_tokens_total", "counter", "Tokens generated.", lab, (double)st->tokens_generated);
    wk_srv_metric(b, cap, &n, "llmserve:worker_ready", "gauge", "1 while the group takes requests.", lab, !s->draining);
    wk_srv_metric(b, cap, &n, "llmserve:worker_steps_total", "counter", "Engine steps.", lab, (double)st->steps);
    wk_srv_metric(b, cap, &n, "llmserve:worker_requests_finished_total", "counter", "Requests finished.", lab,
           (double)st->requests_finished);
    wk_srv_metric(b, cap, &n, "llmserve:worker_requests_aborted_total", "counter", "Requests aborted.", lab,
           (double)st->requests_aborted);
    wk_srv_metric(b, cap, &n, "llmserve:worker_step_ms_p50", "gauge", "Median step time over the last 1024 steps, ms.", lab,
           st->has_step_ms_p50 ? st->step_ms_p50 : 0);
    wk_srv_metric(b, cap, &n, "llmserve:worker_step_ms_p99", "gauge", "99th percentile step time over the last 1024 steps, ms.",
           lab, st->has_step_ms_p99 ? st->step_ms_p99 : 0);
    wk_srv_metric(b, cap, &n, "llmserve:worker_rss_bytes", "gauge", "Resident memory of rank 0's process.", lab,
           (double)st->rss_bytes);
    wk_srv_metric(b, cap, &n, "llmserve:worker_tp_size", "gauge", "Ranks in the tensor-parallel group.", lab, st->tp_size);
    wk_srv_metric(b, cap, &n, "llmserve:worker_gateways_dropped_total", "counter", "Gateways dropped (no heartbeat).", lab,
           (double)st->gateways_dropped);
    wk_srv_metric(b, cap, &n, "llmserve:worker_messages_refused_total", "counter", "Messages refused.", lab,
           (double)st->messages_refused);
    tier_metrics(s, st, model, lab, b, cap, &n);
    kv_metrics(st, model, lab, b, cap, &n);
    return n;
}
