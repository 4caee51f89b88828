#include "gw_pool.h"
#include "cm_chat.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_time.h"
#include "gw_keyset.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int gw_pool_routable(const gw *g, int i) {
    const gw_worker *w = &g->w[i];
    return w->alive && w->ready && w->accepted && !w->gone && w->task == LLMSERVE__TASK__TASK_GENERATE;
}

int gw_pool_routable_embed(const gw *g, int i) {
    const gw_worker *w = &g->w[i];
    return w->alive && w->ready && w->accepted && !w->gone && w->task == LLMSERVE__TASK__TASK_EMBED;
}

int gw_pool_count_up(const gw *g) {
    int n = 0;
    for (int i = 0; i < g->n_workers; i++) n += gw_pool_routable(g, i) || gw_pool_routable_embed(g, i);
    return n;
}

int gw_pool_count_loading(const gw *g) {
    int n = 0;
    for (int i = 0; !g->dns_name[0] && i < g->n_workers; i++) n += !g->w[i].gone && !g->w[i].accepted && !g->w[i].refused[0];
    return n;
}

int gw_pool_send(gw *g, int i, pr_env *e) {
    if (i < 0 || i >= g->n_workers || g->w[i].gone) return LLM_EIO;
    return pr_send(g->w[i].push, e, NNG_FLAG_NONBLOCK);
}

void gw_pool_cancel(gw *g, int i, uint64_t rid) {
    Llmserve__Cancel c = LLMSERVE__CANCEL__INIT;
    c.request_id = rid;
    c.gateway_id = g->id;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_CANCEL;
    e.cancel = &c;
    gw_pool_send(g, i, &e);
}

/* The smallest max_model_len of the usable groups, for each task. */
static void update_max_len(gw *g) {
    int m[2] = {0, 0};
    for (int i = 0; i < g->n_workers; i++) {
        const gw_worker *w = &g->w[i];
        int t = w->task == LLMSERVE__TASK__TASK_EMBED;
        if (w->alive && w->accepted && !w->gone && (!m[t] || w->max_model_len < m[t])) m[t] = w->max_model_len;
    }
    g->max_model_len = m[0];
    g->emax_len = m[1];
}

/* Whether the model this gateway serves is settled: some accepted group is
 * alive, or was within GW_MODEL_HOLD_S. Then a group serving another one is
 * refused rather than followed. */
static int held(const gw *g) {
    for (int k = 0; k < g->n_workers; k++)
        if (g->w[k].alive && g->w[k].accepted && !g->w[k].gone && g->w[k].task == LLMSERVE__TASK__TASK_GENERATE) return 1;
    return g->settled_at > 0 && cm_now() - g->settled_at < GW_MODEL_HOLD_S;
}

static void refuse(gw *g, int i, const char *why) {
    gw_worker *w = &g->w[i];
    if (strcmp(w->refused, why)) CM_ERR("worker group %s (%s) is not used: %s", w->addr, w->worker_id, why);
    snprintf(w->refused, sizeof w->refused, "%s", why);
    w->accepted = 0;
}

static void accept_worker(gw *g, int i) {
    gw_worker *w = &g->w[i];
    if (!w->accepted)
        CM_INFO("worker group %s (%s) serves %s: max_model_len %d, block size %d, tokenizer %016llx", w->addr,
                w->worker_id, w->model, w->max_model_len, w->block_size, (unsigned long long)w->tok_fp);
    w->accepted = 1;
    w->refused[0] = 0;
    if (g->model && g->model->override) return; /* the name came with the override */
    if (!g->served[0])
        snprintf(g->served, sizeof g->served, "%s", g->conf.served_name ? g->conf.served_name : w->model);
}

/* The model name the groups report must agree; the API may alias it. */
static int name_ok(gw *g, int i) {
    if (g->model && g->model->override) return g->conf.served_name || !strcmp(g->w[i].model, g->served);
    const char *want = g->conf.served_name ? g->conf.served_name : g->served;
    if (!want[0] || !held(g)) return 1;
    if (g->conf.served_name) return 1; /* an alias: the groups behind it are the operator's choice */
    return !strcmp(g->w[i].model, want);
}

static void ask_model_info(gw *g, int i) {
    gw_worker *w = &g->w[i];
    double t = cm_now();
    if (t - w->info_asked < 1.0) return;
    w->info_asked = t;
    char tag[16];
    snprintf(tag, sizeof tag, "w%d", i);
    Llmserve__ModelInfoRequest r = LLMSERVE__MODEL_INFO_REQUEST__INIT;
    r.gateway_id = g->id;
    r.worker_tag = tag;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_MODEL_INFO_REQUEST;
    e.model_info_request = &r;
    gw_pool_send(g, i, &e);
}

/* An embedding group: the first one's model (name and tokenizer) is the
 * gateway's embedding model; the others must serve the same. */
static void judge_embed(gw *g, int i) {
    gw_worker *w = &g->w[i];
    char why[256];
    if (!g->emodel) {
        w->accepted = 0;
        ask_model_info(g, i);
        return;
    }
    if (strcmp(w->model, g->eserved) || w->tok_fp != g->emodel->fp || w->embed_dim != g->edim) {
        snprintf(why, sizeof why, "it serves embedding model '%.90s' (%d dimensions), the other groups '%.90s' (%d)",
                 w->model, w->embed_dim, g->eserved, g->edim);
        refuse(g, i, why);
        return;
    }
    if (!w->accepted)
        CM_INFO("worker group %s (%s) serves embedding model %s: %d dimensions, inputs up to %d tokens", w->addr,
                w->worker_id, w->model, w->embed_dim, w->max_model_len);
    w->accepted = 1;
    w->refused[0] = 0;
}

/* Health or ModelInfo said what group i serves: accept it, refuse it, or ask. */
static void judge(gw *g, int i) {
    gw_worker *w = &g->w[i];
    char why[256];
    if (w->task == LLMSERVE__TASK__TASK_EMBED) {
        judge_embed(g, i);
        return;
    }
    if (!name_ok(g, i)) {
        snprintf(why, sizeof why, "it serves model '%.100s', the other groups '%.100s'", w->model, g->served);
        refuse(g, i, why);
        return;
    }
    if (g->model && w->tok_fp == g->model->fp) {
        accept_worker(g, i);
        return;
    }
    if (g->model && (g->model->override || held(g))) {
        snprintf(why, sizeof why, "its tokenizer (%016llx) differs from the %s (%016llx) under model name '%s'",
                 (unsigned long long)w->tok_fp, g->model->override ? "one this gateway was given" : "other groups'",
                 (unsigned long long)g->model->fp, w->model);
        refuse(g, i, why);
        return;
    }
    w->accepted = 0;
    ask_model_info(g, i); /* first group, or the whole cluster changed model */
}

int gw_pool_has_lora(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p++)
        if (p > list && p[-1] == '\n' && p[n] == '\n') return 1;
    return 0;
}

/* A group's adapters, and the gateway's union of every group's (names a request's model may give). */
static void take_loras(gw *g, gw_worker *w, char **names, size_t n, unsigned version) {
    w->loras[0] = 0;
    w->lora_version = version;
    size_t used = 0;
    for (size_t k = 0; k < n; k++) {
        const char *nm = names[k];
        size_t nl = nm ? strlen(nm) : 0;
        if (!nl || nl > 63 || strchr(nm, '\n') || used + nl + 3 > sizeof w->loras) continue;
        used += (size_t)snprintf(w->loras + used, sizeof w->loras - used, "%s%s\n", used ? "" : "\n", nm);
    }
    g->loras[0] = 0;
    for (int i = 0; i < g->n_workers; i++) /* each name once: adapters loaded and unloaded come and go */
        for (const char *p = g->w[i].loras; p[0] && p[1];) {
            const char *e = strchr(p + 1, '\n');
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", (int)(e - p - 1), p + 1);
            size_t gl = strlen(g->loras), nl = strlen(nm);
            if (!gw_pool_has_lora(g->loras, nm) && gl + nl + 3 <= sizeof g->loras)
                snprintf(g->loras + gl, sizeof g->loras - gl, "%s%s\n", gl ? "" : "\n", nm);
            p = e;
        }
    if (n) CM_INFO("worker group %s serves %zu LoRA adapters", w->addr, n);
}

static void on_model_info(gw *g, int i, const Llmserve__ModelInfo *mi) {
    if (i < 0) return;
    gw_worker *w = &g->w[i];
    if (!(mi->has_task && mi->task == LLMSERVE__TASK__TASK_EMBED)) {
        take_loras(g, w, mi->loras, mi->n_loras, mi->lora_version);
        w->max_loras = (int)mi->max_loras;
    }
    if (!mi->has_tokenizer_gguf || !mi->tokenizer_gguf.len) {
        refuse(g, i, "its ModelInfo carries no tokenizer (a worker without one cannot be served)");
        return;
    }
    if (mi->has_task && mi->task == LLMSERVE__TASK__TASK_EMBED) {
        if (!g->emodel) {
            char err[256];
            cm_tokenizer *tok = NULL;
            if (cm_tok_import(mi->tokenizer_gguf.data, mi->tokenizer_gguf.len, &tok, err, sizeof err)) {
                snprintf(w->refused, sizeof w->refused, "bad tokenizer in ModelInfo: %.200s", err);
                CM_ERR("worker group %s: %s", w->addr, w->refused);
                return;
            }
            gw_model *m;
            if (cm_tok_fingerprint(tok) != mi->tokenizer_fingerprint || !mi->model || !mi->model[0] ||
                !mi->has_embedding_dim || mi->embedding_dim < 1 || mi->embedding_dim > 65536) {
                cm_tok_free(tok);
                refuse(g, i, "its ModelInfo does not describe an embedding model (name, dimensions, tokenizer)");
                return;
            }
            if (gw_model_make(tok, NULL, 0, &m, err, sizeof err)) {
                refuse(g, i, err);
                return;
            }
            g->emodel = m;
            snprintf(g->eserved, sizeof g->eserved, "%s", mi->model);
            g->edim = (int)mi->embedding_dim;
            if (!g->cache.dim) g->cache.dim = g->edim; /* the semantic cache's vectors are this model's */
            CM_INFO("embedding model %s from worker group %s: %d dimensions, vocabulary %d", g->eserved, w->addr, g->edim,
                    cm_tok_vocab(tok));
        }
        w->tok_fp = mi->tokenizer_fingerprint;
        judge_embed(g, i);
        update_max_len(g);
        return;
    }
    if (g->model && g->model->fp == mi->tokenizer_fingerprint) { /* someone else's answer got there first */
        w->tok_fp = mi->tokenizer_fingerprint;
        judge(g, i);
        return;
    }
    char err[256];
    cm_tokenizer *tok = NULL;
    int rc = cm_tok_import(mi->tokenizer_gguf.data, mi->tokenizer_gguf.len, &tok, err, sizeof err);
    if (rc) {
        snprintf(w->refused, sizeof w->refused, "bad tokenizer in ModelInfo: %.200s", err);
        CM_ERR("worker group %s: %s", w->addr, w->refused);
        return;
    }
    uint64_t fp = cm_tok_fingerprint(tok);
    if (fp != mi->tokenizer_fingerprint) {
        cm_tok_free(tok);
        refuse(g, i, "its ModelInfo's tokenizer does not match its fingerprint");
        return;
    }
    w->tok_fp = fp;
    if (g->model && (g->model->override || held(g))) {
        cm_tok_free(tok);
        judge(g, i); /* refuses, with the reason */
        return;
    }
    gw_model *m;
    if (gw_model_make(tok, g->conf.chat_template, 0, &m, err, sizeof err)) {
        refuse(g, i, err);
        return;
    }
    if (g->model) CM_WARN("every group now serves another tokenizer: switching from %016llx to %016llx",
                          (unsigned long long)g->model->fp, (unsigned long long)fp);
    gw_model_unref(g->model);
    g->model = m;
    g->served[0] = 0;
    CM_INFO("model %s from worker group %s: vocabulary %d, %s chat template, %zu bytes of tokenizer", mi->model ? mi->model : "?",
            w->addr, cm_tok_vocab(tok), cm_chat_name(m->chat_kind), mi->tokenizer_gguf.len);
    judge(g, i);
    update_max_len(g);
}

/* What the router knew of a group's cached blocks, all tiers. */
static void forget_cache(gw_worker *w) {
    gw_keyset_clear(&w->cached);
    gw_keyset_clear(&w->lower[0]);
    gw_keyset_clear(&w->lower[1]);
}

static void on_health(gw *g, int i, const Llmserve__Health *h) {
    if (i < 0) return;
    gw_worker *w = &g->w[i];
    if (w->gone) return;
    if (w->incarnation && h->has_incarnation && h->incarnation != w->incarnation) {
        CM_WARN("worker group %s restarted (incarnation %016llx -> %016llx): its requests move or end now", w->addr,
                (unsigned long long)w->incarnation, (unsigned long long)h->incarnation);
        forget_cache(w);
        g->pool_ops->on_lost(g, i, "the worker group serving this request restarted");
        w->accepted = 0;
    }
    if (!w->alive) CM_INFO("worker group %s (%s) answers: model %s", w->addr, h->worker_id, h->model ? h->model : "?");
    w->incarnation = h->has_incarnation ? h->incarnation : 0;
    w->alive = 1;
    w->ready = !h->has_ready || h->ready;
    w->backoff = 0;
    w->last_health = cm_now();
    snprintf(w->worker_id, sizeof w->worker_id, "%s", h->worker_id);
    snprintf(w->model, sizeof w->model, "%s", h->model ? h->model : "");
    w->max_model_len = h->max_model_len;
    w->block_size = h->block_size;
    w->vocab = h->vocab;
    w->tok_fp = h->has_tokenizer_fingerprint ? h->tokenizer_fingerprint : 0;
    if (w->accepted && h->has_lora_version && h->lora_version != w->lora_version)
        ask_model_info(g, i); /* adapters loaded or unloaded, maybe through another gateway */
    int task = h->has_task && h->task == LLMSERVE__TASK__TASK_EMBED ? LLMSERVE__TASK__TASK_EMBED : LLMSERVE__TASK__TASK_GENERATE;
    if (task != w->task && w->accepted) { /* the address now serves the other task: judged afresh */
        g->pool_ops->on_lost(g, i, "the worker group serving this request changed what it serves");
        w->accepted = 0;
    }
    w->task = task;
    w->kv_role = h->has_kv_role ? (int)h->kv_role : LLMSERVE__KV_ROLE__KV_BOTH;
    w->embed_dim = h->has_embedding_dim ? (int)h->embedding_dim : 0;
    if (h->stats) {
        w->running = h->stats->running;
        w->waiting = h->stats->waiting;
        w->prefix_queries = h->stats->prefix_queries;
        w->prefix_hits = h->stats->prefix_hits;
        w->preemptions = h->stats->preemptions;
        w->blocks_total = (uint64_t)h->stats->blocks_total;
        w->blocks_free = (uint64_t)h->stats->blocks_free;
        w->rss_bytes = h->stats->rss_bytes;
        w->gpu_bytes = h->stats->has_gpu_memory_used_bytes ? h->stats->gpu_memory_used_bytes : 0;
        w->gateways_dropped = h->stats->gateways_dropped;
        w->aborted_on_drop = h->stats->requests_aborted_on_drop;
        w->messages_refused = h->stats->messages_refused;
        w->spec_drafts = h->stats->spec_drafts;
        w->spec_draft_tokens = h->stats->spec_draft_tokens;
        w->spec_accepted_tokens = h->stats->spec_accepted_tokens;
        w->n_spec_pos = 0; /* a worker's list is untrusted: at most what we keep */
        for (size_t k = 0; k < h->stats->n_spec_accepted_per_pos && k < 16; k++)
            w->spec_pos[w->n_spec_pos++] = h->stats->spec_accepted_per_pos[k];
    }
    judge(g, i);
    if (w->accepted && w->task == LLMSERVE__TASK__TASK_GENERATE) g->settled_at = cm_now();
    update_max_len(g);
}

/* Health and KvEvents echo the tag our Hello gave that worker: "w<index>". */
static int tag_worker(gw *g, const char *tag) {
    if (!tag || tag[0] != 'w') return -1;
    char *end;
    long i = strtol(tag + 1, &end, 10);
    return *end || end == tag + 1 || i < 0 || i >= g->n_workers ? -1 : (int)i;
}

static void on_recv(evutil_socket_t fd, short what, void *arg) {
    gw *g = arg;
    (void)fd;
    (void)what;
    for (int k = 0; k < 1024; k++) {
        nng_msg *msg;
        if (nng_recvmsg(g->pull, &msg, NNG_FLAG_NONBLOCK)) break;
        pr_env *e;
        char err[256];
        int rc = pr_decode(nng_msg_body(msg), nng_msg_len(msg), &e, NULL, err, sizeof err);
        nng_msg_free(msg);
        if (rc) { /* one line every 10 s at most: a stranger may send a flood */
            g->bad_msgs++;
            double t = cm_now();
            if (t - g->bad_logged >= 10) {
                CM_WARN("message from a worker dropped: %s (%llu since the last report)", err,
                        (unsigned long long)g->bad_msgs);
                g->bad_logged = t;
                g->bad_msgs = 0;
            }
            continue;
        }
        switch (e->body_case) {
        case LLMSERVE__ENVELOPE__BODY_CHUNK: g->pool_ops->on_chunk(g, e->chunk); break;
        case LLMSERVE__ENVELOPE__BODY_EMBED_RESULT: g->pool_ops->on_embed_result(g, e->embed_result); break;
        case LLMSERVE__ENVELOPE__BODY_LORA_UPDATE_RESULT: {
            int i = tag_worker(g, e->lora_update_result->worker_tag);
            if (i < 0) break;
            take_loras(g, &g->w[i], e->lora_update_result->loras, e->lora_update_result->n_loras,
                       e->lora_update_result->lora_version);
            g->pool_ops->on_lora_result(g, i, e->lora_update_result);
            break;
        }
        case LLMSERVE__ENVELOPE__BODY_HEALTH: on_health(g, tag_worker(g, e->health->worker_tag), e->health); break;
        case LLMSERVE__ENVELOPE__BODY_MODEL_INFO:
            on_model_info(g, tag_worker(g, e->model_info->worker_tag), e->model_info);
            break;
        case LLMSERVE__ENVELOPE__BODY_KV_EVENTS: {
            int from = tag_worker(g, e->kv_events->worker_tag);
            if (from < 0) break;
            gw_worker *w = &g->w[from];
            if (e->kv_events->full_snapshot) forget_cache(w);
            for (size_t i = 0; i < e->kv_events->n_events; i++) {
                const Llmserve__KvEvent *ev = e->kv_events->events[i];
                uint32_t tier = ev->has_tier ? ev->tier : 1;
                if (tier < 1 || tier > 3) continue; /* a tier this gateway does not know */
                gw_keyset *set = tier == 1 ? &w->cached : &w->lower[tier - 2];
                if (ev->kind == LLMSERVE__KV_EVENT__KIND__STORED) gw_keyset_add(set, ev->key);
                else gw_keyset_del(set, ev->key);
            }
            break;
        }
        case LLMSERVE__ENVELOPE__BODY_ERROR: CM_WARN("worker error: %s", e->error->message); break;
        default: break;
        }
        pr_free(e);
    }
}

static void hello_all(gw *g) {
    Llmserve__Hello h = LLMSERVE__HELLO__INIT;
    h.gateway_id = g->id;
    h.reply_address = g->reply;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    double t = cm_now();
    for (int i = 0; i < g->n_workers; i++) {
        gw_worker *w = &g->w[i];
        if (w->gone) continue;
        if (!w->alive && w->last_health > 0) { /* a failed group is probed with backoff: 1, 2, 4 ... 30 s */
            if (t < w->down_until) continue;
            w->backoff = w->backoff ? (w->backoff * 2 > 30 ? 30 : w->backoff * 2) : 1;
            w->down_until = t + w->backoff;
        }
        char tag[16];
        snprintf(tag, sizeof tag, "w%d", i);
        h.worker_tag = tag;
        pr_send(g->w[i].push, &e, NNG_FLAG_NONBLOCK);
    }
}

/* NNG's thread: a connection to a group closed (a killed process closes
 * its sockets at once). The loop hears of it through the pipe. */
static void on_pipe_gone(nng_pipe p, nng_pipe_ev ev, void *arg) {
    const gw_worker *w = arg;
    (void)p;
    (void)ev;
    unsigned char b = (unsigned char)w->idx;
    int fd = __atomic_load_n(&w->wake_fd, __ATOMIC_ACQUIRE);
    if (fd >= 0) (void)!write(fd, &b, 1);
}

static int dial(gw_worker *w) {
    int rv = nng_push0_open(&w->push);
    if (!rv) rv = nng_pipe_notify(w->push, NNG_PIPE_EV_REM_POST, on_pipe_gone, w);
    if (!rv) rv = nng_socket_set_int(w->push, NNG_OPT_SENDBUF, 4096);
    if (!rv) rv = nng_socket_set_ms(w->push, NNG_OPT_RECONNMINT, 100);
    if (!rv) rv = nng_socket_set_ms(w->push, NNG_OPT_RECONNMAXT, 1000);
    if (!rv) rv = nng_dial(w->push, w->addr, NULL, NNG_FLAG_NONBLOCK);
    if (rv) CM_ERR("cannot dial worker %s: %s", w->addr, nng_strerror(rv));
    return rv ? LLM_EIO : 0;
}

static int add_worker(gw *g, const char *addr) {
    if (g->n_workers == GW_MAX_WORKERS) {
        CM_ERR("more than %d worker groups: %s left out", GW_MAX_WORKERS, addr);
        return LLM_ERANGE;
    }
    gw_worker *w = &g->w[g->n_workers];
    memset(w, 0, sizeof *w);
    snprintf(w->addr, sizeof w->addr, "%s", addr);
    w->idx = g->n_workers;
    w->wake_fd = g->lost_pipe[1];
    if (dial(w)) return LLM_EIO;
    g->n_workers++;
    return 0;
}

/* Kubernetes headless services: every address NAME resolves to is a group. */
static void resolve_workers(gw *g) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(g->dns_name, g->dns_port, &hints, &res);
    if (rc) {
        CM_WARN("--workers-dns %s: %s", g->dns_name, gai_strerror(rc));
        return;
    }
    char seen[GW_MAX_WORKERS] = {0};
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        char ip[64], addr[256];
        inet_ntop(AF_INET, &((struct sockaddr_in *)a->ai_addr)->sin_addr, ip, sizeof ip);
        snprintf(addr, sizeof addr, "tcp://%s:%s", ip, g->dns_port);
        int found = -1;
        for (int i = 0; i < g->n_workers; i++)
            if (!strcmp(g->w[i].addr, addr)) found = i;
        if (found >= 0 && g->w[found].gone) { /* back again */
            g->w[found].gone = 0;
            dial(&g->w[found]);
        }
        if (found < 0 && !add_worker(g, addr)) {
            found = g->n_workers - 1;
            CM_INFO("worker group %s added (from %s)", addr, g->dns_name);
        }
        if (found >= 0) seen[found] = 1;
    }
    freeaddrinfo(res);
    for (int i = 0; i < g->n_workers; i++)
        if (!seen[i] && !g->w[i].gone) {
            CM_INFO("worker group %s left %s", g->w[i].addr, g->dns_name);
            g->pool_ops->on_lost(g, i, "the worker group serving this request left the service");
            g->w[i].gone = 1;
            g->w[i].alive = g->w[i].accepted = 0;
            forget_cache(&g->w[i]);
            nng_close(g->w[i].push);
        }
    update_max_len(g);
}

/* Group i is taken for dead until its next Health: what it held moves or ends now. */
static void lost(gw *g, int i, const char *what, const char *why) {
    gw_worker *w = &g->w[i];
    w->alive = 0;
    /* its numbers are unknown now: a dead group reports zeros, not its last values */
    w->running = w->waiting = 0;
    w->blocks_total = w->blocks_free = w->rss_bytes = w->gpu_bytes = 0;
    forget_cache(w);
    CM_WARN("worker group %s %s; its requests move or end now", w->addr, what);
    g->pool_ops->on_lost(g, i, why);
    update_max_len(g);
}

static void on_tick(evutil_socket_t fd, short what, void *arg) {
    gw *g = arg;
    (void)fd;
    (void)what;
    if (g->dns_name[0] && g->tick++ % 10 == 0) resolve_workers(g);
    hello_all(g);
    double t = cm_now();
    for (int i = 0; i < g->n_workers; i++)
        if (g->w[i].alive && t - g->w[i].last_health > GW_LIVENESS_S)
            lost(g, i, "stopped answering", "the worker group serving this request stopped answering");
}

/* A connection closed: the group is not waited for until the heartbeat
 * window ends. If it lives (a cut, not a death), its next Health brings it
 * back; what moved stays moved. */
static void on_lost(evutil_socket_t fd, short what, void *arg) {
    gw *g = arg;
    (void)what;
    unsigned char b[64];
    ssize_t n;
    while ((n = read(fd, b, sizeof b)) > 0)
        for (ssize_t k = 0; k < n; k++)
            if (b[k] < g->n_workers && g->w[b[k]].alive && !g->w[b[k]].gone)
                lost(g, b[k], "closed its connection", "the worker group serving this request closed its connection");
}

int gw_pool_start(gw *g, const gw_pool_ops *ops, char *err, size_t errlen) {
    g->pool_ops = ops;
    const gw_conf *c = &g->conf;
    if (c->workers_dns) {
        const char *colon = strrchr(c->workers_dns, ':');
        if (!colon || colon == c->workers_dns || strlen(colon + 1) >= sizeof g->dns_port ||
            (size_t)(colon - c->workers_dns) >= sizeof g->dns_name) {
            snprintf(err, errlen, "--workers-dns expects NAME:PORT, not '%s'", c->workers_dns);
            return LLM_EINVAL;
        }
        memcpy(g->dns_name, c->workers_dns, (size_t)(colon - c->workers_dns));
        snprintf(g->dns_port, sizeof g->dns_port, "%s", colon + 1);
    }
    if (pipe(g->lost_pipe)) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return LLM_EIO;
    }
    g->lost_pipe_ok = 1;
    if (fcntl(g->lost_pipe[0], F_SETFL, O_NONBLOCK) || fcntl(g->lost_pipe[1], F_SETFL, O_NONBLOCK) ||
        fcntl(g->lost_pipe[0], F_SETFD, FD_CLOEXEC) || fcntl(g->lost_pipe[1], F_SETFD, FD_CLOEXEC)) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return LLM_EIO;
    }
    nng_listener l;
    int rv = nng_pull0_open(&g->pull);
    if (!rv) rv = nng_socket_set_size(g->pull, NNG_OPT_RECVMAXSZ, PR_MAX_MSG);
    if (!rv) rv = nng_socket_set_int(g->pull, NNG_OPT_RECVBUF, 8192);
    if (!rv) rv = nng_listen(g->pull, c->reply_address, &l, 0);
    if (rv) {
        snprintf(err, errlen, "cannot listen on %s: %s", c->reply_address, nng_strerror(rv));
        return LLM_EIO;
    }
    nng_sockaddr sa;
    if (!strncmp(c->reply_address, "tcp://", 6) && !nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa) &&
        sa.s_family == NNG_AF_INET) {
        char hostpart[200];
        snprintf(hostpart, sizeof hostpart, "%s", c->reply_address + 6);
        char *colon = strrchr(hostpart, ':');
        if (colon) *colon = 0;
        snprintf(g->reply, sizeof g->reply, "tcp://%s:%u", hostpart, ntohs(sa.s_in.sa_port));
    } else {
        snprintf(g->reply, sizeof g->reply, "%s", c->reply_address);
    }
    int recv_fd;
    if (nng_socket_get_int(g->pull, NNG_OPT_RECVFD, &recv_fd)) {
        snprintf(err, errlen, "no receive fd on the reply socket");
        return LLM_EIO;
    }
    if (!c->workers_dns)
        for (const char *p = c->workers; *p;) {
            const char *e = strchr(p, ',');
            char a[256];
            size_t n = e ? (size_t)(e - p) : strlen(p);
            if (n >= sizeof a) {
                snprintf(err, errlen, "--workers: an address is over %zu bytes", sizeof a - 1);
                return LLM_EINVAL;
            }
            memcpy(a, p, n);
            a[n] = 0;
            if (n && add_worker(g, a)) {
                snprintf(err, errlen, "--workers: cannot use '%s'", a);
                return LLM_EINVAL;
            }
            if (!e) break;
            p = e + 1;
        }
    if (g->dns_name[0]) resolve_workers(g);
    g->recv_ev = event_new(g->base, recv_fd, EV_READ | EV_PERSIST, on_recv, g);
    g->tick_ev = event_new(g->base, -1, EV_PERSIST, on_tick, g);
    g->lost_ev = event_new(g->base, g->lost_pipe[0], EV_READ | EV_PERSIST, on_lost, g);
    if (!g->recv_ev || !g->tick_ev || !g->lost_ev) return LLM_ENOMEM;
    event_add(g->recv_ev, NULL);
    event_add(g->lost_ev, NULL);
    struct timeval one = {1, 0};
    event_add(g->tick_ev, &one);
    hello_all(g);
    return 0;
}

void gw_pool_stop(gw *g) {
    if (g->recv_ev) event_free(g->recv_ev);
    if (g->tick_ev) event_free(g->tick_ev);
    if (g->lost_ev) event_free(g->lost_ev);
    g->recv_ev = g->tick_ev = g->lost_ev = NULL;
    for (int i = 0; i < g->n_workers; i++) {
        __atomic_store_n(&g->w[i].wake_fd, -1, __ATOMIC_RELEASE); /* closing its socket tells no one */
        if (!g->w[i].gone) nng_close(g->w[i].push);
        free(g->w[i].cached.k);
        free(g->w[i].lower[0].k);
        free(g->w[i].lower[1].k);
    }
    nng_close(g->pull);
    if (g->lost_pipe_ok) {
        close(g->lost_pipe[0]);
        close(g->lost_pipe[1]);
        g->lost_pipe_ok = 0;
    }
}
