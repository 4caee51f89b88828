/* llmserve-gateway: the OpenAI-compatible HTTP front door.
 *
 * libevent serves HTTP/1.1; each request is authenticated, rate limited,
 * parsed, templated and tokenized here, then routed to a worker group over
 * NNG and streamed back (SSE) or collected. One event loop: worker replies
 * wake it through NNG's receive fd. */
#include "cm_chat.h"
#include "cm_error.h"
#include "cm_model.h"
#include "cm_gguf.h"
#include "cm_hash.h"
#include "cm_log.h"
#include "cm_unicode.h"
#include "gw.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <getopt.h>
#include <math.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define LIVENESS_S 3.0

typedef struct {
    struct evbuffer *text;       /* non-streaming: the whole text */
    json_t *lp;                  /* logprobs entries (array) */
    int finish, completion, role_sent;
} gw_choice;

typedef struct gw_req {
    struct gw_req *next;
    gw *g;
    uint64_t rid;
    struct evhttp_request *http;  /* NULL once the client is gone */
    struct evhttp_connection *conn;
    cm_oai_completion c;
    int32_t *tok;
    int n_tok, max_tokens, worker, got_token, retried, headers_sent, done;
    uint32_t next_seq;
    char id[128], key[128];
    long created;
    double t_arrive, t_sent, t_first, t_last;
    struct event *timer;
    int prompt_tokens, cached_tokens;
    gw_choice ch[CM_OAI_MAX_N];
} gw_req;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- responses ----------------------------------------------------------- */

static int status_class(int code) {
    if (code < 300) return 0;
    if (code == 401) return 2;
    if (code == 429) return 3;
    if (code == 504) return 5;
    if (code >= 500) return 4;
    return 1;
}

static void add_common_headers(struct evhttp_request *r, const char *ctype) {
    struct evkeyvalq *h = evhttp_request_get_output_headers(r);
    evhttp_add_header(h, "Content-Type", ctype);
    evhttp_add_header(h, "Server", "llmserve");
}

static void send_json(gw *g, struct evhttp_request *r, int code, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    struct evbuffer *b = evbuffer_new();
    if (s) evbuffer_add(b, s, strlen(s));
    evbuffer_add(b, "\n", 1);
    add_common_headers(r, "application/json");
    evhttp_send_reply(r, code, code == 200 ? "OK" : "Error", b);
    evbuffer_free(b);
    free(s);
    g->m.requests[status_class(code)]++;
}

static json_t *error_json(const char *msg, const char *type, const char *param, const char *code) {
    return json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error", "message", msg, "type", type, "param", param, "code", code);
}

static void send_error(gw *g, struct evhttp_request *r, int status, const char *msg, const char *param,
                       const char *code) {
    const char *type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    json_t *j = error_json(msg, type, param, code);
    send_json(g, r, status, j);
    json_decref(j);
}

/* ---- requests ------------------------------------------------------------ */

static void req_free(gw_req *q) {
    gw *g = q->g;
    for (gw_req **p = &g->reqs; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            break;
        }
    if (q->conn) {
        evhttp_connection_set_closecb(q->conn, NULL, NULL);
        /* the next request on a kept-alive connection is read under the header timeout again */
        struct timeval ht = {(time_t)g->header_timeout, 0};
        evhttp_connection_set_timeout_tv(q->conn, &ht);
    }
    if (q->timer) event_free(q->timer);
    for (int i = 0; i < CM_OAI_MAX_N; i++) {
        if (q->ch[i].text) evbuffer_free(q->ch[i].text);
        json_decref(q->ch[i].lp);
    }
    if (q->worker >= 0 && g->w[q->worker].inflight > 0) g->w[q->worker].inflight--;
    if (q->c.stream && q->headers_sent) g->open_streams--;
    free(q->tok);
    cm_oai_completion_free(&q->c);
    free(q);
}

static gw_req *find_req(gw *g, uint64_t rid) {
    for (gw_req *q = g->reqs; q; q = q->next)
        if (q->rid == rid) return q;
    return NULL;
}

static void send_cancel(gw *g, gw_req *q) {
    if (q->worker < 0) return;
    Llmserve__Cancel c = LLMSERVE__CANCEL__INIT;
    c.request_id = q->rid;
    c.gateway_id = g->id;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_CANCEL;
    e.cancel = &c;
    pr_send(g->w[q->worker].push, &e, NNG_FLAG_NONBLOCK);
}

static void sse(gw_req *q, json_t *j) {
    if (!q->http) return;
    char *s = json_dumps(j, JSON_COMPACT);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "data: %s\n\n", s ? s : "{}");
    evhttp_send_reply_chunk(q->http, b);
    evbuffer_free(b);
    free(s);
}

static void sse_done(gw_req *q) {
    if (!q->http) return;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "data: [DONE]\n\n");
    evhttp_send_reply_chunk(q->http, b);
    evbuffer_free(b);
    evhttp_send_reply_end(q->http);
    q->g->m.requests[0]++;
    q->http = NULL;
}

static void log_request(gw *g, gw_req *q, int status) {
    if (!g->log_requests) return;
    double t = now_s();
    int out = 0;
    for (int i = 0; i < q->c.n; i++) out += q->ch[i].completion;
    CM_INFO("request %s key=%s worker=%d in=%d out=%d cached=%d ttft=%.1fms total=%.1fms status=%d%s%.*s", q->id,
            q->key[0] ? q->key : "-", q->worker, q->n_tok, out, q->cached_tokens,
            q->t_first > 0 ? (q->t_first - q->t_arrive) * 1e3 : -1.0, (t - q->t_arrive) * 1e3, status,
            g->log_prompts ? " prompt=" : "", g->log_prompts ? 200 : 0, g->log_prompts && q->c.prompt ? q->c.prompt : "");
}

/* Ends a request that failed: an OpenAI error (or an SSE error event once streaming). */
static void fail_req(gw_req *q, int status, const char *msg, const char *code) {
    gw *g = q->g;
    if (q->http) {
        if (q->headers_sent) {
            json_t *j = error_json(msg, status >= 500 ? "server_error" : "invalid_request_error", NULL, code);
            sse(q, j);
            json_decref(j);
            sse_done(q);
        } else {
            send_error(g, q->http, status, msg, NULL, code);
            q->http = NULL;
        }
    }
    log_request(g, q, status);
    req_free(q);
}

static const char *finish_name(int f) {
    switch (f) {
    case LLMSERVE__FINISH_REASON__FINISH_STOP: return "stop";
    case LLMSERVE__FINISH_REASON__FINISH_LENGTH: return "length";
    case LLMSERVE__FINISH_REASON__FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

static json_t *jbytes(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *buf = malloc(n * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; buf && i < n;) {
        uint32_t cp;
        int l = cm_utf8_decode(s + i, n - i, &cp);
        o += (size_t)cm_utf8_encode(cp, buf + o);
        i += (size_t)l;
    }
    j = json_stringn(buf ? buf : "", o);
    free(buf);
    return j;
}

static json_t *token_str(gw *g, int32_t id) {
    const char *p;
    size_t l;
    if (cm_tok_piece(g->tok, id, 1, &p, &l)) return json_string("");
    return jbytes(p, l);
}

/* Logprobs of one chunk, in the request's API shape. */
static void add_logprobs(gw_req *q, gw_choice *ch, const Llmserve__TokenChunk *c, json_t *chunk_lp) {
    gw *g = q->g;
    for (size_t i = 0; i < c->n_logprobs; i++) {
        const Llmserve__TokenLogprob *l = c->logprobs[i];
        json_t *e;
        if (q->c.is_chat) {
            json_t *tops = json_array();
            for (size_t k = 0; k < l->n_top; k++)
                json_array_append_new(tops, json_pack("{s:o,s:f}", "token", token_str(g, l->top[k]->token_id), "logprob",
                                                      (double)l->top[k]->logprob));
            e = json_pack("{s:o,s:f,s:o}", "token", token_str(g, l->token_id), "logprob", (double)l->logprob,
                          "top_logprobs", tops);
        } else {
            json_t *top = json_object();
            for (size_t k = 0; k < l->n_top; k++) {
                json_t *ks = token_str(g, l->top[k]->token_id);
                if (!json_object_get(top, json_string_value(ks)))
                    json_object_set_new(top, json_string_value(ks), json_real(l->top[k]->logprob));
                json_decref(ks);
            }
            e = json_pack("{s:o,s:f,s:o}", "token", token_str(g, l->token_id), "logprob", (double)l->logprob, "top", top);
        }
        json_array_append(ch->lp ? ch->lp : chunk_lp, e);
        if (ch->lp && chunk_lp) json_array_append(chunk_lp, e);
        json_decref(e);
    }
}

/* Completions want {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_lp(const json_t *entries) {
    json_t *toks = json_array(), *vals = json_array(), *tops = json_array(), *offs = json_array();
    size_t off = 0, i;
    json_t *e;
    json_array_foreach(entries, i, e) {
        json_t *t = json_object_get(e, "token");
        json_array_append(toks, t);
        json_array_append(vals, json_object_get(e, "logprob"));
        json_array_append(tops, json_object_get(e, "top"));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += json_string_length(t);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", vals, "top_logprobs", tops, "text_offset", offs);
}

static json_t *usage_json(gw_req *q) {
    int out = 0;
    for (int i = 0; i < q->c.n; i++) out += q->ch[i].completion;
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", q->n_tok, "completion_tokens", out, "total_tokens",
                     q->n_tok + out, "prompt_tokens_details", "cached_tokens", q->cached_tokens);
}

static void finish_ok(gw_req *q) {
    gw *g = q->g;
    double t = now_s();
    gw_hist_add(&g->m.e2e, t - q->t_arrive);
    for (int i = 0; i < q->c.n; i++) g->m.completion_tokens += (uint64_t)q->ch[i].completion;
    if (q->c.stream) {
        if (q->c.include_usage) {
            json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", q->id, "object",
                                  q->c.is_chat ? "chat.completion.chunk" : "text_completion", "created",
                                  (json_int_t)q->created, "model", g->served_name, "choices", "usage", usage_json(q));
            sse(q, j);
            json_decref(j);
        }
        sse_done(q);
    } else if (q->http) {
        json_t *choices = json_array();
        for (int i = 0; i < q->c.n; i++) {
            gw_choice *ch = &q->ch[i];
            size_t n = evbuffer_get_length(ch->text);
            json_t *text = jbytes((const char *)evbuffer_pullup(ch->text, -1), n);
            json_t *lp = json_null();
            if (ch->lp) lp = q->c.is_chat ? json_pack("{s:O}", "content", ch->lp) : completion_lp(ch->lp);
            if (q->c.is_chat)
                json_array_append_new(choices, json_pack("{s:i,s:{s:s,s:o},s:o,s:s?}", "index", i, "message", "role",
                                                         "assistant", "content", text, "logprobs", lp, "finish_reason",
                                                         finish_name(ch->finish)));
            else
                json_array_append_new(choices, json_pack("{s:i,s:o,s:o,s:s?}", "index", i, "text", text, "logprobs", lp,
                                                         "finish_reason", finish_name(ch->finish)));
        }
        json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", q->id, "object",
                              q->c.is_chat ? "chat.completion" : "text_completion", "created", (json_int_t)q->created,
                              "model", g->served_name, "choices", choices, "usage", usage_json(q));
        send_json(g, q->http, 200, j);
        json_decref(j);
        q->http = NULL;
    }
    log_request(g, q, 200);
    req_free(q);
}

static void on_chunk(gw *g, const Llmserve__TokenChunk *c) {
    gw_req *q = find_req(g, c->request_id);
    if (!q) return; /* cancelled or timed out already */
    if (c->seq != q->next_seq) {
        send_cancel(g, q);
        fail_req(q, 502, "lost a message from the worker (sequence gap)", "stream_gap");
        return;
    }
    q->next_seq++;
    if (c->has_finish && (c->finish == LLMSERVE__FINISH_REASON__FINISH_ERROR ||
                          c->finish == LLMSERVE__FINISH_REASON__FINISH_TIMEOUT)) {
        int code = c->has_error_code ? c->error_code : 0, status = 500;
        const char *ec = "worker_error";
        if (c->finish == LLMSERVE__FINISH_REASON__FINISH_TIMEOUT) status = 504, ec = "timeout";
        else if (code == LLM_EINVAL || code == LLM_ERANGE) status = 400, ec = code == LLM_ERANGE ? "context_length_exceeded" : "invalid_value";
        else if (code == LLM_EAGAIN) status = 503, ec = "overloaded";
        if (status == 503 && !q->got_token && !q->retried) { /* another group may have room */
            int hit, w = gw_route(g, q->tok, q->n_tok, 0, q->worker, &hit);
            if (w >= 0) {
                q->retried = 1;
                g->m.retried++;
                g->w[q->worker].inflight--;
                q->worker = -1;
                extern int gw_send_generate(gw * g, gw_req * q, int w);
                if (!gw_send_generate(g, q, w)) return;
            }
        }
        if (status == 504) g->m.timed_out++;
        fail_req(q, status, c->error ? c->error : "the worker refused the request", ec);
        return;
    }
    if (c->index < 0 || c->index >= q->c.n) return;
    gw_choice *ch = &q->ch[c->index];
    double t = now_s();
    if (c->n_token_ids) {
        if (!q->got_token) {
            q->got_token = 1;
            q->t_first = t;
            gw_hist_add(&g->m.ttft, t - q->t_arrive);
        } else if (q->t_last > 0) {
            gw_hist_add(&g->m.itl, (t - q->t_last) / (double)c->n_token_ids);
        }
        q->t_last = t;
    }
    if (c->usage) {
        ch->completion = c->usage->completion_tokens;
        q->cached_tokens = c->usage->has_cached_tokens ? c->usage->cached_tokens : 0;
    } else {
        ch->completion += (int)c->n_token_ids;
    }
    int fin = c->has_finish ? c->finish : 0;
    if (fin == LLMSERVE__FINISH_REASON__FINISH_ABORT) { /* the worker ended it (it was dropped, or shut down) */
        fail_req(q, 503, "the worker aborted the request", "aborted");
        return;
    }
    if (q->c.stream) {
        json_t *lp = NULL;
        if (q->c.logprobs >= 0) {
            lp = json_array();
            add_logprobs(q, ch, c, lp);
        }
        const char *txt = c->has_text ? (const char *)c->text.data : "";
        size_t tl = c->has_text ? c->text.len : 0;
        if (tl || fin || !ch->role_sent) {
            json_t *choice;
            if (q->c.is_chat) {
                json_t *delta = json_object();
                if (!ch->role_sent) json_object_set_new(delta, "role", json_string("assistant"));
                if (tl || ch->role_sent) json_object_set_new(delta, "content", jbytes(txt, tl));
                else json_object_set_new(delta, "content", json_string(""));
                ch->role_sent = 1;
                choice = json_pack("{s:i,s:o,s:o,s:s?}", "index", c->index, "delta", delta, "logprobs",
                                   lp ? json_pack("{s:O}", "content", lp) : json_null(), "finish_reason", finish_name(fin));
            } else {
                ch->role_sent = 1;
                choice = json_pack("{s:i,s:o,s:o,s:s?}", "index", c->index, "text", jbytes(txt, tl), "logprobs",
                                   lp ? completion_lp(lp) : json_null(), "finish_reason", finish_name(fin));
            }
            json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", q->id, "object",
                                  q->c.is_chat ? "chat.completion.chunk" : "text_completion", "created",
                                  (json_int_t)q->created, "model", g->served_name, "choices", choice);
            sse(q, j);
            json_decref(j);
        }
        json_decref(lp);
    } else {
        if (c->has_text) evbuffer_add(ch->text, c->text.data, c->text.len);
        if (q->c.logprobs >= 0) add_logprobs(q, ch, c, NULL);
    }
    if (fin) ch->finish = fin;
    for (int i = 0; i < q->c.n; i++)
        if (!q->ch[i].finish) return;
    finish_ok(q);
}

/* ---- workers --------------------------------------------------------------- */

static void on_health(gw *g, const Llmserve__Health *h, int from) {
    gw_worker *w = from >= 0 ? &g->w[from] : NULL;
    if (!w || w->gone) return;
    if (!w->up) CM_INFO("worker %s (%s) is up: model %s, max_model_len %d", w->addr, h->worker_id, h->model ? h->model : "?",
                        h->max_model_len);
    w->up = 1;
    w->backoff = 0;
    w->last_health = now_s();
    if (h->model) snprintf(w->model, sizeof w->model, "%s", h->model);
    w->max_model_len = h->max_model_len;
    w->block_size = h->block_size;
    w->vocab = h->vocab;
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
    }
    int m = 0;
    for (int i = 0; i < g->n_workers; i++)
        if (g->w[i].up && (!m || g->w[i].max_model_len < m)) m = g->w[i].max_model_len;
    g->max_model_len = m;
}

/* Health and KvEvents echo the tag our Hello gave that worker: "w<index>". */
static int tag_worker(gw *g, const char *tag) {
    if (!tag || tag[0] != 'w') return -1;
    char *end;
    long i = strtol(tag + 1, &end, 10);
    return *end || i < 0 || i >= g->n_workers ? -1 : (int)i;
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
        if (rc) {
            CM_WARN("bad message from a worker dropped: %s", err);
            continue;
        }
        switch (e->body_case) {
        case LLMSERVE__ENVELOPE__BODY_CHUNK: on_chunk(g, e->chunk); break;
        case LLMSERVE__ENVELOPE__BODY_HEALTH: on_health(g, e->health, tag_worker(g, e->health->worker_tag)); break;
        case LLMSERVE__ENVELOPE__BODY_KV_EVENTS: {
            int from = tag_worker(g, e->kv_events->worker_tag);
            if (from < 0) break;
            gw_worker *w = &g->w[from];
            if (e->kv_events->full_snapshot) gw_keyset_clear(&w->cached);
            for (size_t i = 0; i < e->kv_events->n_events; i++) {
                const Llmserve__KvEvent *ev = e->kv_events->events[i];
                if (ev->kind == LLMSERVE__KV_EVENT__KIND__STORED) gw_keyset_add(&w->cached, ev->key);
                else gw_keyset_del(&w->cached, ev->key);
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
    double t = now_s();
    for (int i = 0; i < g->n_workers; i++) {
        gw_worker *w = &g->w[i];
        if (w->gone) continue;
        if (!w->up && w->last_health > 0) { /* a failed group is probed with backoff: 1, 2, 4 ... 30 s */
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

static int add_worker(gw *g, const char *addr);

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
            nng_push0_open(&g->w[found].push);
            nng_dial(g->w[found].push, addr, NULL, NNG_FLAG_NONBLOCK);
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
            g->w[i].gone = 1;
            g->w[i].up = 0;
            gw_keyset_clear(&g->w[i].cached);
            nng_close(g->w[i].push);
        }
}

static void on_tick(evutil_socket_t fd, short what, void *arg) {
    gw *g = arg;
    (void)fd;
    (void)what;
    if (g->dns_name[0] && g->tick++ % 10 == 0) resolve_workers(g);
    hello_all(g);
    double t = now_s();
    for (int i = 0; i < g->n_workers; i++) {
        gw_worker *w = &g->w[i];
        if (!w->up || t - w->last_health <= LIVENESS_S) continue;
        w->up = 0;
        gw_keyset_clear(&w->cached);
        CM_WARN("worker %s stopped answering; its requests fail or move", w->addr);
        /* requests on it: retried elsewhere if no token came yet, else ended */
        for (gw_req *q = g->reqs, *nx; q; q = nx) {
            nx = q->next;
            if (q->worker != i) continue;
            int hit, nw = !q->got_token && !q->retried ? gw_route(g, q->tok, q->n_tok, 0, i, &hit) : -1;
            extern int gw_send_generate(gw * g, gw_req * q, int w);
            q->worker = -1;
            w->inflight = w->inflight > 0 ? w->inflight - 1 : 0;
            if (nw >= 0) {
                q->retried = 1;
                g->m.retried++;
                if (!gw_send_generate(g, q, nw)) continue;
            }
            fail_req(q, 502, "the worker serving this request went away", "worker_lost");
        }
    }
}

/* ---- admission ----------------------------------------------------------- */

int gw_send_generate(gw *g, gw_req *q, int wi) {
    const cm_oai_completion *c = &q->c;
    Llmserve__SamplingParams sp = LLMSERVE__SAMPLING_PARAMS__INIT;
    sp.has_temperature = sp.has_top_p = sp.has_top_k = sp.has_min_p = 1;
    sp.temperature = (float)c->temperature;
    sp.top_p = (float)c->top_p;
    sp.top_k = c->top_k;
    sp.min_p = (float)c->min_p;
    sp.has_presence_penalty = sp.has_frequency_penalty = sp.has_repetition_penalty = 1;
    sp.presence_penalty = (float)c->presence_penalty;
    sp.frequency_penalty = (float)c->frequency_penalty;
    sp.repetition_penalty = (float)c->repetition_penalty;
    sp.has_max_tokens = sp.has_min_tokens = sp.has_n = sp.has_logprobs = sp.has_ignore_eos = 1;
    sp.max_tokens = q->max_tokens;
    sp.min_tokens = c->min_tokens;
    sp.n = c->n;
    sp.logprobs = c->logprobs;
    sp.ignore_eos = c->ignore_eos;
    sp.has_seed = c->has_seed;
    sp.seed = c->seed;
    sp.n_stop = (size_t)c->n_stop;
    sp.stop = (char **)c->stop;
    sp.n_stop_token_ids = (size_t)c->n_stop_ids;
    sp.stop_token_ids = (int32_t *)c->stop_ids;
    int32_t bid[CM_OAI_MAX_BIAS];
    float bval[CM_OAI_MAX_BIAS];
    for (int i = 0; i < c->n_bias; i++) {
        bid[i] = c->bias[i].id;
        bval[i] = c->bias[i].bias;
    }
    sp.n_logit_bias_ids = sp.n_logit_bias_values = (size_t)c->n_bias;
    sp.logit_bias_ids = bid;
    sp.logit_bias_values = bval;
    Llmserve__Generate gen = LLMSERVE__GENERATE__INIT;
    gen.request_id = q->rid;
    gen.n_token_ids = (size_t)q->n_tok;
    gen.token_ids = q->tok;
    gen.params = &sp;
    gen.has_priority = 1;
    gen.priority = c->priority;
    gen.cache_salt = c->cache_salt;
    gen.gateway_id = g->id;
    gen.reply_address = g->reply;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_GENERATE;
    e.generate = &gen;
    int rc = pr_send(g->w[wi].push, &e, NNG_FLAG_NONBLOCK);
    if (rc) return rc;
    q->worker = wi;
    q->next_seq = 0;
    q->t_sent = now_s();
    g->w[wi].inflight++;
    g->w[wi].routed++;
    return 0;
}

static double bucket_take(gw_bucket *b, double amount) {
    double t = now_s();
    if (b->last == 0) b->tokens = b->burst;
    b->tokens += (t - b->last) * b->rate;
    if (b->tokens > b->burst) b->tokens = b->burst;
    b->last = t;
    if (b->tokens >= amount) {
        b->tokens -= amount;
        return 0;
    }
    return (amount - b->tokens) / b->rate; /* seconds until it would fit */
}

static struct gw_keylimit *key_limit(gw *g, const char *key) {
    for (int i = 0; i < g->n_klim; i++)
        if (!strcmp(g->klim[i].key, key)) return &g->klim[i];
    struct gw_keylimit *n = realloc(g->klim, sizeof *n * (size_t)(g->n_klim + 1));
    if (!n) return NULL;
    g->klim = n;
    struct gw_keylimit *k = &g->klim[g->n_klim++];
    memset(k, 0, sizeof *k);
    snprintf(k->key, sizeof k->key, "%s", key);
    k->rps = (gw_bucket){0, g->rps, g->rps > 1 ? g->rps : 1, 0};
    k->tpm = (gw_bucket){0, g->tpm / 60.0, g->tpm, 0};
    return k;
}

/* 0 when allowed; else seconds to wait. */
static double rate_check(gw *g, const char *key, int tokens) {
    double wait = 0, w;
    if (g->rps > 0) {
        if ((w = bucket_take(&g->global_rps, 1)) > wait) wait = w;
        struct gw_keylimit *k = key[0] ? key_limit(g, key) : NULL;
        if (k && (w = bucket_take(&k->rps, 1)) > wait) wait = w;
    }
    if (g->tpm > 0) {
        if ((w = bucket_take(&g->global_tpm, tokens)) > wait) wait = w;
        struct gw_keylimit *k = key[0] ? key_limit(g, key) : NULL;
        if (k && (w = bucket_take(&k->tpm, tokens)) > wait) wait = w;
    }
    return wait;
}

static void on_client_close(struct evhttp_connection *conn, void *arg) {
    gw_req *q = arg;
    (void)conn;
    q->http = NULL;
    q->conn = NULL;
    q->g->m.cancelled++;
    send_cancel(q->g, q);
    log_request(q->g, q, 499);
    req_free(q);
}

static void on_timer(evutil_socket_t fd, short what, void *arg) {
    gw_req *q = arg;
    (void)fd;
    (void)what;
    gw *g = q->g;
    double t = now_s();
    const char *why = NULL;
    if (!q->got_token && g->ttft_timeout > 0 && t - q->t_arrive >= g->ttft_timeout) why = "no first token within --ttft-timeout";
    else if (g->request_timeout > 0 && t - q->t_arrive >= g->request_timeout) why = "request exceeded --request-timeout";
    else if (q->got_token && g->idle_timeout > 0 && t - q->t_last >= g->idle_timeout) why = "stream idle past --idle-timeout";
    if (!why) {
        struct timeval tv = {0, 200000};
        evtimer_add(q->timer, &tv);
        return;
    }
    g->m.timed_out++;
    send_cancel(g, q);
    fail_req(q, 504, why, "timeout");
}

static int authorized(gw *g, struct evhttp_request *r, char *key, size_t keylen) {
    key[0] = 0;
    if (!g->n_api_keys) return 1;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(r), "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    const char *k = h + 7;
    for (int i = 0; i < g->n_api_keys; i++)
        if (!strcmp(k, g->api_keys[i])) {
            snprintf(key, keylen, "%s", k);
            return 1;
        }
    return 0;
}

static void handle_generate(gw *g, struct evhttp_request *r, int chat) {
    char key[128];
    if (!authorized(g, r, key, sizeof key)) {
        send_error(g, r, 401, "missing or invalid API key (Authorization: Bearer KEY)", NULL, "invalid_api_key");
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(r);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    gw_req *q = calloc(1, sizeof *q);
    if (!q) {
        send_error(g, r, 500, "out of memory", NULL, NULL);
        return;
    }
    q->g = g;
    q->worker = -1;
    q->t_arrive = now_s();
    snprintf(q->key, sizeof q->key, "%s", key);
    char err[512];
    const char *param = NULL;
    int rc = chat ? cm_oai_parse_chat(body, len, &q->c, err, sizeof err, &param)
                  : cm_oai_parse_completion(body, len, &q->c, err, sizeof err, &param);
    if (rc) {
        send_error(g, r, 400, err, param, "invalid_value");
        free(q);
        return;
    }
    if (q->c.model && strcmp(q->c.model, g->served_name)) {
        snprintf(err, sizeof err, "The model `%.128s` does not exist.", q->c.model);
        send_error(g, r, 404, err, "model", "model_not_found");
        cm_oai_completion_free(&q->c);
        free(q);
        return;
    }
    if (q->c.echo) {
        send_error(g, r, 400, "'echo' is not supported by the gateway", "echo", "invalid_value");
        cm_oai_completion_free(&q->c);
        free(q);
        return;
    }
    /* template and tokenize */
    size_t nt = 0;
    if (chat) {
        cm_chat_msg *msgs = malloc(sizeof *msgs * (size_t)q->c.n_messages);
        char *text = NULL;
        if (msgs) {
            for (int i = 0; i < q->c.n_messages; i++) msgs[i] = (cm_chat_msg){q->c.messages[i].role, q->c.messages[i].content};
            rc = cm_chat_render(g->chat_kind, g->default_system, msgs, (size_t)q->c.n_messages, q->c.add_generation_prompt, &text);
        }
        free(msgs);
        if (!msgs || rc || !text) {
            send_error(g, r, 400, "cannot render the messages with the chat template", "messages", "invalid_value");
            cm_oai_completion_free(&q->c);
            free(q);
            return;
        }
        rc = cm_tok_encode(g->tok, text, strlen(text), -1, 1, &q->tok, &nt);
        free(text);
    } else if (q->c.prompt) {
        rc = cm_tok_encode(g->tok, q->c.prompt, q->c.prompt_len, -1, 1, &q->tok, &nt);
    } else {
        q->tok = malloc(sizeof(int32_t) * (size_t)q->c.n_prompt_ids);
        rc = q->tok ? 0 : LLM_ENOMEM;
        if (q->tok) memcpy(q->tok, q->c.prompt_ids, sizeof(int32_t) * (size_t)q->c.n_prompt_ids);
        nt = (size_t)q->c.n_prompt_ids;
        for (size_t i = 0; i < nt && !rc; i++)
            if (q->tok[i] >= cm_tok_vocab(g->tok)) rc = LLM_EINVAL;
    }
    q->n_tok = (int)nt;
    int L = g->max_model_len;
    if (rc || nt == 0) {
        send_error(g, r, 400, rc ? "the prompt cannot be tokenized (or has ids outside the vocabulary)" : "the prompt is empty",
                   chat ? "messages" : "prompt", "invalid_value");
        goto drop;
    }
    if (!L) {
        send_error(g, r, 503, "no worker group is available", NULL, "no_workers");
        goto drop;
    }
    q->max_tokens = q->c.max_tokens ? q->c.max_tokens : chat ? L - (int)nt : 16;
    if ((int)nt >= L || (int64_t)nt + q->max_tokens > L) {
        snprintf(err, sizeof err,
                 "This model's maximum context length is %d tokens. However, you requested %lld tokens (%zu in the "
                 "%s, %d in the completion). Please reduce the length of the %s or completion.",
                 L, (long long)nt + q->max_tokens, nt, chat ? "messages" : "prompt", q->max_tokens,
                 chat ? "messages" : "prompt");
        send_error(g, r, 400, err, chat ? "messages" : "max_tokens", "context_length_exceeded");
        goto drop;
    }
    double wait = rate_check(g, key, (int)nt + q->max_tokens);
    if (wait > 0) {
        char ra[32];
        snprintf(ra, sizeof ra, "%d", (int)ceil(wait));
        evhttp_add_header(evhttp_request_get_output_headers(r), "Retry-After", ra);
        g->m.rate_limited++;
        send_error(g, r, 429, "rate limit reached; retry after the time in Retry-After", NULL, "rate_limit_exceeded");
        goto drop;
    }
    int hit, wi = gw_route(g, q->tok, q->n_tok, q->c.cache_salt ? cm_salt_of(q->c.cache_salt, strlen(q->c.cache_salt)) : 0,
                           -1, &hit);
    if (wi < 0) {
        send_error(g, r, 503, "no worker group is available", NULL, "no_workers");
        goto drop;
    }
    if (g->max_queue > 0 && g->w[wi].inflight >= g->max_queue) {
        evhttp_add_header(evhttp_request_get_output_headers(r), "Retry-After", "1");
        send_error(g, r, 429, "the server is at capacity; retry shortly", NULL, "overloaded");
        goto drop;
    }
    q->rid = ++g->next_rid;
    q->created = (long)time(NULL);
    snprintf(q->id, sizeof q->id, "%s-%s%llx", chat ? "chatcmpl" : "cmpl", g->id, (unsigned long long)q->rid);
    for (int i = 0; i < q->c.n; i++) {
        q->ch[i].text = evbuffer_new();
        if (q->c.logprobs >= 0 && !q->c.stream) q->ch[i].lp = json_array();
    }
    if (gw_send_generate(g, q, wi)) {
        send_error(g, r, 503, "the worker group is not accepting requests", NULL, "overloaded");
        goto drop;
    }
    g->w[wi].routed_hit_tokens += (uint64_t)hit;
    g->m.prompt_tokens += nt;
    gw_hist_add(&g->m.queue, q->t_sent - q->t_arrive);
    q->http = r;
    q->conn = evhttp_request_get_connection(r);
    q->next = g->reqs;
    g->reqs = q;
    evhttp_connection_set_closecb(q->conn, on_client_close, q);
    /* admitted: from here our own deadlines govern, not libevent's read/write timeout
     * (a stream can wait for its first token longer than a header may take) */
    double lim = g->request_timeout > 0 ? g->request_timeout + 10 : 86400;
    struct timeval lt = {(time_t)lim, 0};
    evhttp_connection_set_timeout_tv(q->conn, &lt);
    q->timer = evtimer_new(g->base, on_timer, q);
    struct timeval tv = {0, 200000};
    evtimer_add(q->timer, &tv);
    if (q->c.stream) {
        add_common_headers(r, "text/event-stream");
        evhttp_add_header(evhttp_request_get_output_headers(r), "Cache-Control", "no-cache");
        evhttp_send_reply_start(r, 200, "OK");
        q->headers_sent = 1;
        g->open_streams++;
    }
    return;
drop:
    free(q->tok);
    cm_oai_completion_free(&q->c);
    free(q);
}

static void handle_models(gw *g, struct evhttp_request *r) {
    char key[128];
    if (!authorized(g, r, key, sizeof key)) {
        send_error(g, r, 401, "missing or invalid API key (Authorization: Bearer KEY)", NULL, "invalid_api_key");
        return;
    }
    json_t *j = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:i}]}", "object", "list", "data", "id", g->served_name, "object",
                          "model", "created", (json_int_t)time(NULL), "owned_by", "llmserve", "max_model_len",
                          g->max_model_len);
    send_json(g, r, 200, j);
    json_decref(j);
}

static void handle_health(gw *g, struct evhttp_request *r) {
    int up = 0;
    for (int i = 0; i < g->n_workers; i++) up += g->w[i].up;
    json_t *j = json_pack("{s:s,s:i,s:i}", "status", up ? "ok" : "unavailable", "workers_up", up, "workers", g->n_workers);
    send_json(g, r, up ? 200 : 503, j);
    json_decref(j);
}

static void handle_metrics(gw *g, struct evhttp_request *r) {
    struct evbuffer *b = evbuffer_new();
    gw_metrics_write(g, b);
    add_common_headers(r, "text/plain; version=0.0.4");
    evhttp_send_reply(r, 200, "OK", b);
    evbuffer_free(b);
}

static void on_http(struct evhttp_request *r, void *arg) {
    gw *g = arg;
    const char *uri = evhttp_request_get_uri(r);
    char path[256];
    snprintf(path, sizeof path, "%s", uri ? uri : "/");
    char *qm = strchr(path, '?');
    if (qm) *qm = 0;
    enum evhttp_cmd_type m = evhttp_request_get_command(r);
    if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/v1/completions")) {
        if (m != EVHTTP_REQ_POST) {
            send_error(g, r, 405, "use POST", NULL, "method_not_allowed");
            return;
        }
        handle_generate(g, r, path[4] == 'c' && path[5] == 'h');
    } else if (!strcmp(path, "/v1/models") && m == EVHTTP_REQ_GET) {
        handle_models(g, r);
    } else if (!strcmp(path, "/health") && m == EVHTTP_REQ_GET) {
        handle_health(g, r);
    } else if (!strcmp(path, "/metrics") && m == EVHTTP_REQ_GET) {
        handle_metrics(g, r);
    } else {
        send_error(g, r, 404, "no such endpoint", NULL, "not_found");
    }
}

/* ---- set-up ---------------------------------------------------------------- */

static volatile sig_atomic_t stopping;
static struct event_base *g_base;
static void on_signal(evutil_socket_t s, short w, void *a) {
    (void)s;
    (void)w;
    (void)a;
    stopping = 1;
    event_base_loopbreak(g_base);
}

static int add_worker(gw *g, const char *addr) {
    if (g->n_workers == GW_MAX_WORKERS) return LLM_ERANGE;
    gw_worker *w = &g->w[g->n_workers];
    memset(w, 0, sizeof *w);
    snprintf(w->addr, sizeof w->addr, "%s", addr);
    int rv = nng_push0_open(&w->push);
    if (!rv) rv = nng_socket_set_int(w->push, NNG_OPT_SENDBUF, 4096);
    if (!rv) rv = nng_socket_set_ms(w->push, NNG_OPT_RECONNMINT, 100);
    if (!rv) rv = nng_socket_set_ms(w->push, NNG_OPT_RECONNMAXT, 2000);
    if (!rv) rv = nng_dial(w->push, addr, NULL, NNG_FLAG_NONBLOCK);
    if (rv) {
        CM_ERR("cannot dial worker %s: %s", addr, nng_strerror(rv));
        return LLM_EIO;
    }
    g->n_workers++;
    return 0;
}

static void help(FILE *f) {
    fprintf(f,
            "usage: llmserve-gateway [flags]\n"
            "  --host H                  address to bind (default 127.0.0.1)\n"
            "  --port N                  HTTP port (default 8000)\n"
            "  --workers ADDR,...        worker groups (tcp://HOST:PORT or ipc://PATH; default tcp://127.0.0.1:7600)\n"
            "  --workers-dns NAME:PORT   every address NAME resolves to is a group, re-resolved every 10 s\n"
            "                            (a Kubernetes headless service)\n"
            "  --reply-address ADDR      where workers send replies (default tcp://127.0.0.1:0, an ephemeral port)\n"
            "  --model PATH              GGUF whose tokenizer and chat template to use (default " DEFAULT_MODEL ")\n"
            "  --load-format dummy --model-config SPEC   front workers running dummy weights of that shape\n"
            "                            (the same stand-in tokenizer they use; no model file)\n"
            "  --served-model-name NAME  the model's name in the API (default: file name)\n"
            "  --chat-template NAME      chatml|llama2|llama3|mistral|gemma (default: from the model)\n"
            "  --api-key KEY             require this key (repeatable); --api-keys-file PATH: one per line\n"
            "  --rate-limit-rps R        requests per second, per key and global (0: off)\n"
            "  --rate-limit-tpm T        prompt + max tokens per minute, per key and global (0: off)\n"
            "  --max-queue N             requests in flight per worker group before 429 (default 512)\n"
            "  --max-body-bytes N        largest request body (default 8 MiB; beyond: 413)\n"
            "  --header-timeout S        time to read a request (default 30)\n"
            "  --ttft-timeout S          time to first token before 504 (default 0 = off)\n"
            "  --request-timeout S       whole request (default 600)\n"
            "  --idle-timeout S          gap between streamed tokens (default 60)\n"
            "  --routing prefix|least-load|round-robin   (default prefix)\n"
            "  --route-lambda L          prefix routing: tokens of cache worth one queued request (default 64)\n"
            "  --log-requests / --log-prompts   access log lines; with prompts (off)\n"
            "  --log-level L             error|warn|info|debug (default info)\n");
}

int main(int argc, char **argv) {
    gw *g = calloc(1, sizeof *g);
    if (!g) return 1;
    const char *host = "127.0.0.1", *workers = "tcp://127.0.0.1:7600", *model = DEFAULT_MODEL, *served = NULL,
               *tmpl = NULL, *reply_listen = "tcp://127.0.0.1:0";
    int port = 8000;
    double header_timeout = 30;
    g->header_timeout = 30;
    g->max_queue = 512;
    g->max_body = 8u << 20;
    g->request_timeout = 600;
    g->idle_timeout = 60;
    g->lambda = 64;
    g->log_requests = 1;
    if (getenv("LLMSERVE_MODEL")) model = getenv("LLMSERVE_MODEL");
    cm_log_set_level(CM_LOG_INFO);
    enum { O_HOST = 1, O_PORT, O_WORKERS, O_REPLY, O_MODEL, O_NAME, O_TMPL, O_KEY, O_KEYS, O_RPS, O_TPM, O_MAXQ, O_BODY,
           O_HDR, O_TTFT, O_REQ, O_IDLE, O_ROUTE, O_LAMBDA, O_LOGR, O_LOGP, O_LOG, O_NOLOGR, O_DNS, O_LFMT, O_MCFG };
    const char *load_format = "auto", *model_config = NULL;
    static const struct option lo[] = {
        {"host", 1, 0, O_HOST}, {"port", 1, 0, O_PORT}, {"workers", 1, 0, O_WORKERS}, {"reply-address", 1, 0, O_REPLY},
        {"workers-dns", 1, 0, O_DNS},
        {"model", 1, 0, O_MODEL}, {"served-model-name", 1, 0, O_NAME}, {"chat-template", 1, 0, O_TMPL},
        {"load-format", 1, 0, O_LFMT}, {"model-config", 1, 0, O_MCFG},
        {"api-key", 1, 0, O_KEY}, {"api-keys-file", 1, 0, O_KEYS}, {"rate-limit-rps", 1, 0, O_RPS},
        {"rate-limit-tpm", 1, 0, O_TPM}, {"max-queue", 1, 0, O_MAXQ}, {"max-body-bytes", 1, 0, O_BODY},
        {"header-timeout", 1, 0, O_HDR}, {"ttft-timeout", 1, 0, O_TTFT}, {"request-timeout", 1, 0, O_REQ},
        {"idle-timeout", 1, 0, O_IDLE}, {"routing", 1, 0, O_ROUTE}, {"route-lambda", 1, 0, O_LAMBDA},
        {"log-requests", 0, 0, O_LOGR}, {"no-log-requests", 0, 0, O_NOLOGR}, {"log-prompts", 0, 0, O_LOGP},
        {"log-level", 1, 0, O_LOG}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c, lvl;
    char *end;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        double v = optarg ? strtod(optarg, &end) : 0;
        int num_ok = optarg && end != optarg && !*end && v >= 0;
        switch (c) {
        case O_HOST: host = optarg; break;
        case O_PORT: if (!num_ok || v < 1 || v > 65535) goto bad; port = (int)v; break;
        case O_WORKERS: workers = optarg; break;
        case O_DNS: {
            const char *colon = strrchr(optarg, ':');
            if (!colon || colon == optarg || strlen(colon + 1) >= sizeof g->dns_port ||
                (size_t)(colon - optarg) >= sizeof g->dns_name)
                goto bad;
            memcpy(g->dns_name, optarg, (size_t)(colon - optarg));
            snprintf(g->dns_port, sizeof g->dns_port, "%s", colon + 1);
            workers = "";
            break;
        }
        case O_REPLY: reply_listen = optarg; break;
        case O_MODEL: model = optarg; break;
        case O_LFMT: load_format = optarg; break;
        case O_MCFG: model_config = optarg; break;
        case O_NAME: served = optarg; break;
        case O_TMPL: tmpl = optarg; break;
        case O_KEY: {
            char **k = realloc(g->api_keys, sizeof *k * (size_t)(g->n_api_keys + 1));
            if (!k) return 1;
            g->api_keys = k;
            g->api_keys[g->n_api_keys++] = strdup(optarg);
            break;
        }
        case O_KEYS: {
            FILE *f = fopen(optarg, "r");
            if (!f) {
                fprintf(stderr, "llmserve-gateway: cannot open %s\n", optarg);
                return 2;
            }
            char line[256];
            while (fgets(line, sizeof line, f)) {
                line[strcspn(line, "\r\n")] = 0;
                if (!line[0] || line[0] == '#') continue;
                char **k = realloc(g->api_keys, sizeof *k * (size_t)(g->n_api_keys + 1));
                if (!k) return 1;
                g->api_keys = k;
                g->api_keys[g->n_api_keys++] = strdup(line);
            }
            fclose(f);
            break;
        }
        case O_RPS: if (!num_ok) goto bad; g->rps = v; break;
        case O_TPM: if (!num_ok) goto bad; g->tpm = v; break;
        case O_MAXQ: if (!num_ok) goto bad; g->max_queue = (int)v; break;
        case O_BODY: if (!num_ok || v < 1024) goto bad; g->max_body = (size_t)v; break;
        case O_HDR: if (!num_ok || v <= 0) goto bad; header_timeout = g->header_timeout = v; break;
        case O_TTFT: if (!num_ok) goto bad; g->ttft_timeout = v; break;
        case O_REQ: if (!num_ok) goto bad; g->request_timeout = v; break;
        case O_IDLE: if (!num_ok) goto bad; g->idle_timeout = v; break;
        case O_ROUTE:
            if (!strcmp(optarg, "prefix")) g->routing = GW_ROUTE_PREFIX;
            else if (!strcmp(optarg, "least-load")) g->routing = GW_ROUTE_LEAST_LOAD;
            else if (!strcmp(optarg, "round-robin")) g->routing = GW_ROUTE_ROUND_ROBIN;
            else goto bad;
            break;
        case O_LAMBDA: if (!num_ok) goto bad; g->lambda = v; break;
        case O_LOGR: g->log_requests = 1; break;
        case O_NOLOGR: g->log_requests = 0; break;
        case O_LOGP: g->log_prompts = 1; break;
        case O_LOG:
            if (cm_log_parse_level(optarg, &lvl)) goto bad;
            cm_log_set_level(lvl);
            break;
        case 'h': help(stdout); return 0;
        default: help(stderr); return 2;
        }
        continue;
    bad:
        fprintf(stderr, "llmserve-gateway: bad value '%s' for --%s\n", optarg ? optarg : "", lo[0].name);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    char err[512];
    cm_gguf *gg = NULL;
    int dummy = !strcmp(load_format, "dummy");
    if ((!dummy && strcmp(load_format, "auto")) || dummy != (model_config != NULL)) {
        fprintf(stderr, "llmserve-gateway: --load-format dummy and --model-config SPEC go together (load format '%s')\n",
                load_format);
        for (int i = 0; i < g->n_api_keys; i++) free(g->api_keys[i]);
        free(g->api_keys);
        free(g); /* nothing else is held yet (and LeakSanitizer would turn exit 2 into 1) */
        return 2;
    }
    if (dummy) { /* workers with dummy weights tokenize with a stand-in of the config's vocabulary: so do we */
        cm_model_config mc;
        if (cm_model_config_resolve(model_config, &mc, err, sizeof err)) {
            fprintf(stderr, "llmserve-gateway: %s\n", err);
            return 1;
        }
        if (cm_tok_synthetic(mc.vocab, &g->tok)) {
            fprintf(stderr, "llmserve-gateway: %s: no stand-in tokenizer for a vocabulary of %u\n", model_config, mc.vocab);
            return 1;
        }
    } else { /* the tokenizer and template from the model file (only its metadata is read) */
        if (cm_gguf_open(model, &gg, err, sizeof err)) {
            fprintf(stderr, "llmserve-gateway: %s\n", err);
            return 1;
        }
        if (cm_tok_from_gguf(gg, &g->tok, err, sizeof err)) {
            fprintf(stderr, "llmserve-gateway: %s: %s\n", model, err);
            return 1;
        }
    }
    g->chat_kind = tmpl ? cm_chat_by_name(tmpl) : cm_chat_detect(cm_tok_chat_template(g->tok));
    if (g->chat_kind < 0) {
        fprintf(stderr, "llmserve-gateway: unknown chat template '%s'\n", tmpl);
        return 2;
    }
    g->default_system = cm_chat_default_system(cm_tok_chat_template(g->tok));
    char name[256];
    if (!served) { /* as the worker names it */
        cm_model_served_name(model, dummy ? model_config : NULL, name, sizeof name);
        served = name;
    }
    g->served_name = served;
    snprintf(g->id, sizeof g->id, "gw%x%lx", (unsigned)getpid(), (long)time(NULL) & 0xffff);
    /* replies from workers */
    nng_listener l;
    int rv = nng_pull0_open(&g->pull);
    if (!rv) rv = nng_socket_set_size(g->pull, NNG_OPT_RECVMAXSZ, PR_MAX_MSG);
    if (!rv) rv = nng_socket_set_int(g->pull, NNG_OPT_RECVBUF, 8192);
    if (!rv) rv = nng_listen(g->pull, reply_listen, &l, 0);
    if (rv) {
        fprintf(stderr, "llmserve-gateway: cannot listen on %s: %s\n", reply_listen, nng_strerror(rv));
        return 1;
    }
    nng_sockaddr sa;
    if (!strncmp(reply_listen, "tcp://", 6) && !nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa) &&
        sa.s_family == NNG_AF_INET) {
        char hostpart[200];
        snprintf(hostpart, sizeof hostpart, "%s", reply_listen + 6);
        char *colon = strrchr(hostpart, ':');
        if (colon) *colon = 0;
        snprintf(g->reply, sizeof g->reply, "tcp://%s:%u", hostpart, ntohs(sa.s_in.sa_port));
    } else {
        snprintf(g->reply, sizeof g->reply, "%s", reply_listen);
    }
    int recv_fd;
    if (nng_socket_get_int(g->pull, NNG_OPT_RECVFD, &recv_fd)) {
        fprintf(stderr, "llmserve-gateway: no receive fd\n");
        return 1;
    }
    for (const char *p = workers; *p;) {
        const char *e = strchr(p, ',');
        char a[256];
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n >= sizeof a) return 2;
        memcpy(a, p, n);
        a[n] = 0;
        if (n && add_worker(g, a)) return 1;
        if (!e) break;
        p = e + 1;
    }
    if (g->dns_name[0]) resolve_workers(g);
    static const double tb[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double ib[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
    gw_hist_init(&g->m.ttft, tb, 12);
    gw_hist_init(&g->m.e2e, tb, 12);
    gw_hist_init(&g->m.queue, tb, 12);
    gw_hist_init(&g->m.itl, ib, 10);
    g->global_rps = (gw_bucket){0, g->rps, g->rps > 1 ? g->rps : 1, 0};
    g->global_tpm = (gw_bucket){0, g->tpm / 60.0, g->tpm, 0};
    g->base = g_base = event_base_new();
    g->http = evhttp_new(g->base);
    evhttp_set_max_body_size(g->http, (ev_ssize_t)g->max_body);
    evhttp_set_max_headers_size(g->http, 64 * 1024);
    struct timeval ht = {(time_t)header_timeout, (suseconds_t)((header_timeout - (double)(time_t)header_timeout) * 1e6)};
    evhttp_set_timeout_tv(g->http, &ht);
    evhttp_set_allowed_methods(g->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_gencb(g->http, on_http, g);
    if (!evhttp_bind_socket_with_handle(g->http, host, (uint16_t)port)) {
        fprintf(stderr, "llmserve-gateway: cannot bind %s:%d: %s\n", host, port, strerror(errno));
        return 1;
    }
    g->recv_ev = event_new(g->base, recv_fd, EV_READ | EV_PERSIST, on_recv, g);
    event_add(g->recv_ev, NULL);
    g->tick_ev = event_new(g->base, -1, EV_PERSIST, on_tick, g);
    struct timeval one = {1, 0};
    event_add(g->tick_ev, &one);
    struct event *si = evsignal_new(g->base, SIGINT, on_signal, NULL), *st = evsignal_new(g->base, SIGTERM, on_signal, NULL);
    event_add(si, NULL);
    event_add(st, NULL);
    hello_all(g);
    CM_INFO("gateway on http://%s:%d serving %s (%s template), %d worker group(s), replies at %s", host, port, served,
            cm_chat_name(g->chat_kind), g->n_workers, g->reply);
    event_base_dispatch(g->base);
    CM_INFO("gateway stopping");
    while (g->reqs) {
        send_cancel(g, g->reqs);
        fail_req(g->reqs, 503, "the gateway is shutting down", "shutdown");
    }
    event_free(si);
    event_free(st);
    event_free(g->recv_ev);
    event_free(g->tick_ev);
    evhttp_free(g->http);
    event_base_free(g->base);
    for (int i = 0; i < g->n_workers; i++) {
        nng_close(g->w[i].push);
        free(g->w[i].cached.k);
    }
    nng_close(g->pull);
    cm_tok_free(g->tok);
    cm_gguf_close(gg);
    free(g->default_system);
    for (int i = 0; i < g->n_api_keys; i++) free(g->api_keys[i]);
    free(g->api_keys);
    free(g->klim);
    free(g);
    return 0;
}
