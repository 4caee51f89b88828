#include "gw_req.h"
#include "cm_time.h"
#include "cm_error.h"
#include "cm_hash.h"
#include "cm_log.h"
#include "gw_http.h"
#include "gw_metrics.h"
#include "gw_pool.h"
#include "gw_route.h"
#include "pr_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A stream client that stops reading is cut off past this backlog, so its
 * output cannot grow the gateway's memory without bound. */
#define GW_MAX_BACKLOG (8u << 20)

static void log_request(gw_req *q, int status, const char *code) {
    gw *g = q->g;
    if (!g->conf.log_requests || q->parent || q->abandon) return; /* a batch logs once, as its parent */
    double t = cm_now();
    int out = 0;
    for (int i = 0; i < q->res.n; i++) out += q->res.ch[i].completion_tokens;
    const char *p = g->conf.log_prompts ? q->c.prompt : NULL;
    if (g->conf.log_prompts && !p && q->c.n_messages) p = q->c.messages[q->c.n_messages - 1].content;
    CM_INFO("request %s key=%s worker=%d in=%d out=%d cached=%d ttft=%.1fms total=%.1fms status=%d%s%s%s%.*s",
            q->id[0] ? q->id : "-", gw_auth_tag(&g->auth, q->key), q->worker, q->n_tok, out, q->res.cached_tokens,
            q->t_first > 0 ? (q->t_first - q->t_arrive) * 1e3 : -1.0, (t - q->t_arrive) * 1e3, status,
            code ? " code=" : "", code ? code : "", p ? " prompt=" : "", p ? 200 : 0, p ? p : "");
}

void gw_req_free(gw_req *q) {
    gw *g = q->g;
    if (q->rid) cm_idmap_del(&g->reqs, q->rid);
    if (q->prev || g->req_list == q) {
        if (q->prev) q->prev->next = q->next;
        else g->req_list = q->next;
        if (q->next) q->next->prev = q->prev;
    }
    if (q->timer) event_free(q->timer);
    free(q->tok);
    free(q->out_tok);
    free(q->echo);
    for (int i = 0; q->prompts && i < q->c.n_batch; i++) {
        free(q->prompts[i].tok);
        free(q->prompts[i].echo);
    }
    free(q->prompts);
    for (int i = 0; q->in_tok && i < q->n_inputs; i++) free(q->in_tok[i]);
    free(q->in_tok);
    free(q->in_len);
    json_decref(q->body);
    free(q->cache_etok);
    free(q->cache_vec);
    free(q->ctext);
    free(q->summ_tok);
    free(q->kids);
    json_decref(q->choices);
    cm_oai_result_free(&q->res);
    cm_oai_completion_free(&q->c);
    gw_model_unref(q->model);
    free(q);
}

static void kid_done(gw_req *par, gw_req *kid, int status, const char *msg, const char *code);

/* A batch's response: its kids' choices, and their usage summed. */
static json_t *batch_usage(const gw_req *q) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", q->sum_prompt, "completion_tokens", q->sum_completion,
                     "total_tokens", q->sum_prompt + q->sum_completion, "prompt_tokens_details", "cached_tokens",
                     q->sum_cached);
}

static json_t *batch_json(const gw_req *q, json_t *choices) { /* takes choices */
    return json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", q->id, "object", "text_completion", "created",
                     (json_int_t)q->res.created, "model", q->g->served, "choices", choices, "usage", batch_usage(q));
}

void gw_req_join(gw_req *q, int wi) {
    gw_req_leave(q, 0);
    q->worker = wi;
    q->joined = 1;
    q->g->w[wi].inflight++;
}

void gw_req_leave(gw_req *q, int cancel) {
    if (!q->joined) return;
    if (cancel) gw_pool_cancel(q->g, q->worker, q->rid);
    q->g->w[q->worker].inflight--;
    q->joined = 0;
}

void gw_req_sent(gw_req *q, int wi) {
    gw_req_join(q, wi);
    q->worker_inc = q->g->w[wi].incarnation;
    q->on_worker = 1;
    q->next_seq = 0;
    q->t_sent = cm_now();
    q->g->w[wi].routed++;
}

uint64_t gw_req_deadline_ms(const gw_req *q, double timeout) {
    if (timeout <= 0) return 0;
    return (uint64_t)(cm_wall_ms() + (timeout - (cm_now() - q->t_arrive)) * 1e3);
}

int gw_req_generate_pick(gw *g, gw_req *q, int exclude, int *hit) {
    uint64_t salt = q->c.cache_salt ? cm_salt_of(q->c.cache_salt, strlen(q->c.cache_salt)) : 0;
    return gw_route(g, q->tok, q->n_tok, salt, exclude, hit);
}

const gw_req_ops gw_req_generate_ops = {gw_req_generate_pick, gw_req_generate_send, NULL, 1};

static const gw_req_ops *ops_of(const gw_req *q) { return q->ops ? q->ops : &gw_req_generate_ops; }

void gw_req_finish(gw_req *q, int status, const char *msg, const char *code) {
    gw *g = q->g;
    if (ops_of(q)->on_end) ops_of(q)->on_end(q, status);
    int kid = q->parent || q->abandon;
    gw_req_leave(q, status != 200 && q->on_worker); /* it may still run there */
    if (status == 200) {
        if (!kid) gw_hist_add(&g->m.e2e, cm_now() - q->t_arrive);
        for (int i = 0; i < q->res.n; i++) g->m.completion_tokens += (uint64_t)q->res.ch[i].completion_tokens;
    }
    if (q->parent) { /* a batch's prompt: the parent answers */
        gw_req *par = q->parent;
        q->parent = NULL;
        kid_done(par, q, status, msg, code);
        gw_req_free(q);
        return;
    }
    if (kid) { /* its parent ended first */
        gw_req_free(q);
        return;
    }
    for (int i = 0; q->kids && i < q->n_kids; i++) /* a parent ending early: what still runs ends soon, unseen */
        if (q->kids[i]) {
            gw_req *k = q->kids[i];
            k->parent = NULL;
            k->abandon = 1;
            struct timeval now = {0, 0};
            if (k->timer) evtimer_add(k->timer, &now);
            q->kids[i] = NULL;
        }
    if (q->conn) {
        gw_conn *c = q->conn;
        q->conn = NULL;
        int streaming = gw_http_streaming(c);
        if (streaming) g->open_streams--;
        if (status == 200 && streaming) {
            for (int i = 0; q->res.tools && i < q->res.n; i++) { /* with tools: what is left, the calls, the finish */
                json_t *a = cm_oai_tools_stream(&q->res) ? cm_oai_tool_stream_json(&q->res, i, 1)
                                                         : cm_oai_tool_chunks_json(&q->res, i, q->model ? q->model->tok : NULL);
                for (size_t k = 0; k < json_array_size(a); k++) gw_http_stream_event(c, json_array_get(a, k));
                json_decref(a);
            }
            if (q->c.include_usage) {
                json_t *j = q->kids ? batch_json(q, json_array()) : cm_oai_usage_chunk_json(&q->res);
                gw_http_stream_event(c, j);
                json_decref(j);
            }
            gw_http_stream_end(c);
        } else if (status == 200 && q->body) {
            gw_http_json(c, 200, q->body);
        } else if (status == 200) {
            json_t *j = q->kids ? batch_json(q, json_incref(q->choices))
                                : cm_oai_response_json(&q->res, q->model ? q->model->tok : NULL);
            gw_http_json(c, 200, j);
            json_decref(j);
        } else if (streaming) { /* the 200 went out: the error is an event the client sees, then [DONE] */
            json_t *j = cm_oai_error_json(status, msg, NULL, code);
            gw_http_stream_event(c, j);
            json_decref(j);
            gw_http_stream_end(c);
        } else {
            gw_http_error(c, status, msg, q->param, code);
        }
    }
    log_request(q, status, status == 200 ? NULL : code);
    gw_req_free(q);
}

static void on_timer(evutil_socket_t fd, short what, void *arg);

/* The client went away: the worker stops computing for it at once. */
static void on_gone(void *arg) {
    gw_req *q = arg;
    if (gw_http_streaming(q->conn)) q->g->open_streams--;
    q->conn = NULL;
    q->g->m.cancelled++;
    gw_req_finish(q, 499, "the client closed the connection", "client_closed");
}

int gw_req_generate_send(gw *g, gw_req *q, int wi) {
    const cm_oai_completion *c = &q->c;
    cm_gen_params gp;
    cm_oai_gen_params(c, q->max_tokens, &gp);
    if (q->got_token) gp.prompt_logprobs = -1; /* a resumed request has had its prompt scored */
    Llmserve__SamplingParams sp;
    int32_t *bid;
    float *bval;
    if (pr_params_to_wire(&gp, &sp, &bid, &bval)) return LLM_ENOMEM;
    Llmserve__Generate gen = LLMSERVE__GENERATE__INIT;
    gen.request_id = q->rid;
    gen.n_token_ids = (size_t)q->n_tok;
    gen.token_ids = q->tok;
    gen.params = &sp;
    gen.has_priority = 1;
    gen.priority = gp.priority;
    gen.cache_salt = (char *)gp.cache_salt;
    gen.gateway_id = g->id;
    gen.reply_address = g->reply;
    if (q->got_token) { /* moved after its first tokens: it goes on after what the client has */
        gen.n_resume_token_ids = (size_t)q->n_out;
        gen.resume_token_ids = q->out_tok;
        gen.has_resume_text_bytes = 1;
        gen.resume_text_bytes = (uint32_t)q->out_text;
    }
    /* the deadlines, on the wall clock the worker shares: it refuses a prompt it cannot compute in time */
    gen.has_deadline_ms = (gen.deadline_ms = gw_req_deadline_ms(q, g->conf.request_timeout)) != 0;
    if (!q->got_token)
        gen.has_first_token_deadline_ms = (gen.first_token_deadline_ms = gw_req_deadline_ms(q, g->conf.ttft_timeout)) != 0;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_GENERATE;
    e.generate = &gen;
    int rc = gw_pool_send(g, wi, &e);
    free(bid);
    free(bval);
    if (rc) return rc;
    gw_req_sent(q, wi);
    return 0;
}

/* A fresh id on each send: chunks the last group still sends for the old
 * one are then ignored, never mixed in. */
static int assign_rid(gw *g, gw_req *q) {
    if (q->rid) cm_idmap_del(&g->reqs, q->rid);
    q->rid = ++g->next_rid;
    return cm_idmap_put(&g->reqs, q->rid, q);
}

static void list_in(gw *g, gw_req *q);

int gw_req_probe_enlist(gw *g, gw_req *q, void (*timeout)(evutil_socket_t, short, void *), double secs) {
    if (assign_rid(g, q)) return LLM_ENOMEM;
    list_in(g, q);
    q->timer = evtimer_new(g->base, timeout, q);
    struct timeval tv = {(time_t)secs, (suseconds_t)((secs - (double)(time_t)secs) * 1e6)};
    if (q->timer) evtimer_add(q->timer, &tv);
    return 0;
}

void gw_req_delist(gw *g, gw_req *q) {
    if (q->rid) cm_idmap_del(&g->reqs, q->rid);
    q->rid = 0;
    if (q->prev || g->req_list == q) {
        if (q->prev) q->prev->next = q->next;
        else g->req_list = q->next;
        if (q->next) q->next->prev = q->prev;
    }
    q->prev = q->next = NULL;
    if (q->timer) event_free(q->timer);
    q->timer = NULL;
}

/* Into the list worker loss and drain walk. */
static void list_in(gw *g, gw_req *q) {
    q->next = g->req_list;
    if (g->req_list) g->req_list->prev = q;
    g->req_list = q;
}

/* The client's hang-up, and the deadline timer every 200 ms. */
static void watch(gw *g, gw_req *q) {
    gw_http_on_gone(q->conn, on_gone, q);
    q->timer = evtimer_new(g->base, on_timer, q);
    struct timeval tv = {0, 200000};
    if (q->timer) evtimer_add(q->timer, &tv);
}

int gw_req_enlist(gw *g, gw_req *q) {
    if (assign_rid(g, q)) return LLM_ENOMEM;
    list_in(g, q);
    watch(g, q);
    return 0;
}

void gw_req_retry(gw_req *q, int kind, int status, const char *msg, const char *code) {
    gw *g = q->g;
    int old = q->worker;
    if (kind == GW_FAIL_WORKER_LOST) g->m.worker_lost++;
    /* once (a request that kills its group must not take a second); a draining gateway moves them too */
    int resumable = !q->got_token || (q->c.n == 1 && q->n_out > 0);
    if ((q->parent ? q->parent->conn : q->conn) && resumable && !q->retried) {
        int hit = 0, wi = ops_of(q)->pick(g, q, old, &hit);
        if (wi >= 0) {
            gw_req_leave(q, q->on_worker);
            q->worker = -1;
            q->on_worker = 0;
            if (!assign_rid(g, q) && !ops_of(q)->send(g, q, wi)) {
                q->retried = 1;
                if (q->got_token) {
                    g->m.resumed++;
                    CM_INFO("request %s resumed on group %d after %d tokens (group %d: %s)", q->id, wi, q->n_out, old, msg);
                } else {
                    g->m.retried++;
                    CM_INFO("request %s moved from group %d to %d (%s)", q->id, old, wi, msg);
                }
                return;
            }
        }
    }
    gw_req_finish(q, status, msg, code);
}

static void on_timer(evutil_socket_t fd, short what, void *arg) {
    gw_req *q = arg;
    (void)fd;
    (void)what;
    gw *g = q->g;
    if (q->abandon) {
        gw_req_finish(q, 499, "the rest of its batch ended", "client_closed");
        return;
    }
    const gw_conf *cf = &g->conf;
    double t = cm_now();
    const char *why = NULL;
    if (ops_of(q)->tokens && !q->got_token && cf->ttft_timeout > 0 && t - q->t_arrive >= cf->ttft_timeout)
        why = "no first token within --ttft-timeout";
    else if (cf->request_timeout > 0 && t - q->t_arrive >= cf->request_timeout) why = "request exceeded --request-timeout";
    else if (q->got_token && cf->idle_timeout > 0 && t - q->t_last >= cf->idle_timeout) why = "stream idle past --idle-timeout";
    if (why) {
        g->m.timed_out++;
        gw_req_finish(q, 504, why, "timeout");
        return;
    }
    /* a client waiting for a whole response shows its hang-up only to a look */
    if (q->conn && !gw_http_streaming(q->conn) && gw_http_check_gone(q->conn)) return; /* q is gone */
    struct timeval tv = {0, 200000};
    evtimer_add(q->timer, &tv);
}

/* ---- batches: a parent answers the client, one kid runs each prompt --- */

static void kid_done(gw_req *par, gw_req *kid, int status, const char *msg, const char *code) {
    for (int i = 0; i < par->n_kids; i++)
        if (par->kids[i] == kid) par->kids[i] = NULL;
    if (status != 200) {
        if (par->starting) { /* the parent ends once every kid has been started (or not) */
            if (!par->kid_status) {
                par->kid_status = status;
                snprintf(par->kid_msg, sizeof par->kid_msg, "%s", msg ? msg : "");
                par->kid_code = code;
                par->param = kid->param;
            }
            return;
        }
        par->param = kid->param;
        gw_req_finish(par, status, msg, code);
        return;
    }
    par->sum_prompt += kid->res.prompt_tokens;
    par->sum_cached += kid->res.cached_tokens;
    for (int i = 0; i < kid->res.n && !kid->c.score_only; i++) par->sum_completion += kid->res.ch[i].completion_tokens;
    if (!par->c.stream) { /* its choices, renumbered into the batch's */
        json_t *j = cm_oai_response_json(&kid->res, kid->model ? kid->model->tok : NULL);
        json_t *ch = json_object_get(j, "choices");
        for (size_t i = 0; i < json_array_size(ch); i++) {
            json_t *c = json_array_get(ch, i);
            json_object_set_new(c, "index", json_integer(kid->base + (int)i));
            json_array_set(par->choices, (size_t)kid->base + i, c);
        }
        json_decref(j);
    }
    if (--par->kids_left == 0 && !par->starting) gw_req_finish(par, 200, NULL, NULL);
}

static void start_batch(gw *g, gw_req *q) {
    int P = q->c.n_batch, n = q->c.n;
    snprintf(q->id, sizeof q->id, "cmpl-%s%llxb", g->id, (unsigned long long)(g->next_rid + 1));
    q->res.created = (long)time(NULL);
    q->kids = calloc((size_t)P, sizeof *q->kids);
    q->choices = json_array();
    for (int i = 0; q->choices && i < P * n; i++) json_array_append_new(q->choices, json_null());
    if (!q->kids || !q->choices) {
        gw_req_finish(q, 500, "out of memory", "internal_error");
        return;
    }
    list_in(g, q);
    watch(g, q);
    if (q->c.stream) {
        gw_http_stream_begin(q->conn);
        g->open_streams++;
    }
    q->starting = 1;
    q->n_kids = P;
    for (int i = 0; i < P && !q->kid_status; i++) {
        gw_req *k = calloc(1, sizeof *k);
        if (!k || cm_oai_completion_copy_params(&q->c, &k->c)) {
            free(k);
            q->kid_status = 500;
            snprintf(q->kid_msg, sizeof q->kid_msg, "out of memory");
            q->kid_code = "internal_error";
            break;
        }
        k->g = g;
        k->parent = q;
        k->base = i * n;
        k->worker = -1;
        k->key = q->key;
        k->t_arrive = q->t_arrive;
        k->model = gw_model_ref(q->model);
        k->tok = q->prompts[i].tok, k->n_tok = q->prompts[i].n_tok;
        k->echo = q->prompts[i].echo, k->echo_len = q->prompts[i].echo_len;
        q->prompts[i].tok = NULL, q->prompts[i].echo = NULL;
        k->max_tokens = q->max_tokens / P;
        snprintf(k->id, sizeof k->id, "%s", q->id);
        q->kids[i] = k;
        q->kids_left++;
        gw_req_start(g, k); /* a refusal comes back through kid_done */
    }
    q->starting = 0;
    if (q->kid_status) gw_req_finish(q, q->kid_status, q->kid_msg, q->kid_code);
    else if (!q->kids_left) gw_req_finish(q, 200, NULL, NULL);
}

void gw_req_start(gw *g, gw_req *q) {
    if (q->c.n_batch) {
        start_batch(g, q);
        return;
    }
    int hit = 0, wi = ops_of(q)->pick(g, q, -1, &hit);
    if (wi < 0) {
        g->m.overloaded++;
        gw_req_finish(q, 503, "no worker group is available", "no_workers");
        return;
    }
    if (g->conf.max_queue > 0 && g->w[wi].inflight >= g->conf.max_queue) {
        gw_conn *cc = q->parent ? q->parent->conn : q->conn;
        if (cc && !gw_http_streaming(cc)) gw_http_header(cc, "Retry-After", "1");
        g->m.overloaded++;
        gw_req_finish(q, 429, "the server is at capacity; retry shortly", "overloaded");
        return;
    }
    q->t_sent = cm_now();
    if (!q->parent) /* a batch's prompts answer under their parent's id */
        snprintf(q->id, sizeof q->id, "%s-%s%llx", q->c.is_chat ? "chatcmpl" : "cmpl", g->id, (unsigned long long)(g->next_rid + 1));
    if (assign_rid(g, q)) {
        gw_req_finish(q, 500, "out of memory", "internal_error");
        return;
    }
    list_in(g, q);
    cm_oai_result_init(&q->res, &q->c, q->id, g->served, (long)time(NULL), q->echo, q->echo_len);
    q->res.prompt_tokens = q->n_tok;
    q->res.trim_policy = q->trim_policy, q->res.trim_messages = q->trim_messages, q->res.trim_tokens = q->trim_tokens;
    q->res.trim_summary_tokens = q->summ_tokens, q->res.trim_summary_cached = q->summ_cached;
    if (!q->c.stream) { /* the echo is in the collected text already */
        free(q->echo);
        q->echo = NULL;
    }
    if (ops_of(q)->send(g, q, wi)) {
        g->m.overloaded++;
        gw_req_finish(q, 503, "the worker group is not accepting requests", "overloaded");
        return;
    }
    g->w[wi].routed_hit_tokens += (uint64_t)hit;
    g->m.prompt_tokens += (uint64_t)q->n_tok;
    gw_hist_add(&g->m.queue, q->t_sent - q->t_arrive);
    if (!q->parent && q->conn) gw_http_on_gone(q->conn, on_gone, q); /* a summary request has no client */
    q->timer = evtimer_new(g->base, on_timer, q);
    struct timeval tv = {0, 200000};
    if (q->timer) evtimer_add(q->timer, &tv);
    if (q->c.stream && !q->parent) {
        gw_http_stream_begin(q->conn);
        g->open_streams++;
    }
}

static void lp_from_wire(cm_oai_lp *o, const Llmserve__TokenLogprob *l) {
    o->token = l->token_id;
    o->logprob = l->logprob;
    o->rank = l->has_rank ? l->rank : 0;
    o->n_top = (int)(l->n_top < CM_OAI_MAX_LOGPROBS ? l->n_top : CM_OAI_MAX_LOGPROBS);
    for (int k = 0; k < o->n_top; k++) o->top[k] = (cm_oai_top){l->top[k]->token_id, l->top[k]->logprob};
}

/* A chunk to the client; a batch's prompt renumbers its choices into the batch's. */
static void stream_out(gw_req *q, gw_conn *out, json_t *j) {
    if (q->base) {
        json_t *ch = json_object_get(j, "choices");
        for (size_t i = 0; i < json_array_size(ch); i++) {
            json_t *c = json_array_get(ch, i);
            json_object_set_new(c, "index", json_integer(q->base + json_integer_value(json_object_get(c, "index"))));
        }
    }
    gw_http_stream_event(out, j);
}

static int finish_code(int f) {
    switch (f) {
    case LLMSERVE__FINISH_REASON__FINISH_STOP: return CM_OAI_FINISH_STOP;
    case LLMSERVE__FINISH_REASON__FINISH_LENGTH: return CM_OAI_FINISH_LENGTH;
    case LLMSERVE__FINISH_REASON__FINISH_ABORT: return CM_OAI_FINISH_ABORT;
    default: return CM_OAI_FINISH_NONE;
    }
}

void gw_req_worker_error(gw_req *q, int code, const char *msg) {
    gw *g = q->g;
    switch (code) {
    case LLM_ETIMEDOUT:
        g->m.timed_out++;
        gw_req_finish(q, 504, msg, "timeout");
        break;
    case LLM_EAGAIN: /* full or draining: another group may have room */
        g->m.overloaded++;
        gw_req_retry(q, GW_FAIL_OVERLOADED, 503, msg, "overloaded");
        break;
    case LLM_ERANGE: gw_req_finish(q, 400, msg, "context_length_exceeded"); break;
    case LLM_EINVAL: gw_req_finish(q, 400, msg, "invalid_value"); break;
    default: gw_req_finish(q, 500, msg, "worker_error");
    }
}

void gw_req_on_chunk(gw *g, const Llmserve__TokenChunk *c) {
    gw_req *q = cm_idmap_get(&g->reqs, c->request_id);
    if (!q || !q->on_worker) return; /* ended, or an old id of a moved request */
    if (c->seq != q->next_seq) {
        gw_req_finish(q, 502, "lost a message from the worker (sequence gap)", "stream_gap");
        return;
    }
    q->next_seq++;
    if (c->has_finish && (c->finish == LLMSERVE__FINISH_REASON__FINISH_ERROR ||
                          c->finish == LLMSERVE__FINISH_REASON__FINISH_TIMEOUT)) {
        q->on_worker = 0; /* it ended there */
        gw_req_worker_error(q, c->finish == LLMSERVE__FINISH_REASON__FINISH_TIMEOUT ? LLM_ETIMEDOUT
                               : c->has_error_code                                  ? c->error_code
                                                                                    : LLM_EIO,
                            c->error ? c->error : "the worker refused the request");
        return;
    }
    if (c->index < 0 || c->index >= q->res.n) return;
    int fin = c->has_finish ? finish_code(c->finish) : CM_OAI_FINISH_NONE;
    if (fin == CM_OAI_FINISH_ABORT) { /* the worker ended it: it drained past its deadline, or dropped us */
        q->on_worker = 0;
        gw_req_retry(q, GW_FAIL_WORKER_LOST, 503, "the worker aborted the request", "aborted");
        return;
    }
    if (c->index == 0 && q->c.n == 1 && c->n_token_ids) { /* what a resume needs */
        if (q->n_out + (int)c->n_token_ids > q->cap_out) {
            int cap = q->cap_out ? q->cap_out : 64;
            while (cap < q->n_out + (int)c->n_token_ids) cap *= 2;
            int32_t *t = realloc(q->out_tok, sizeof *t * (size_t)cap);
            if (!t) {
                gw_req_finish(q, 500, "out of memory", "internal_error");
                return;
            }
            q->out_tok = t;
            q->cap_out = cap;
        }
        memcpy(q->out_tok + q->n_out, c->token_ids, sizeof *q->out_tok * c->n_token_ids);
        q->n_out += (int)c->n_token_ids;
    }
    if (c->index == 0 && c->has_text) q->out_text += c->text.len;
    double t = cm_now();
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
    cm_oai_choice *ch = &q->res.ch[c->index];
    if (c->usage) {
        ch->completion_tokens = c->usage->completion_tokens;
        q->res.cached_tokens = c->usage->has_cached_tokens ? c->usage->cached_tokens : 0;
    } else {
        ch->completion_tokens += (int)c->n_token_ids;
    }
    cm_oai_lp lp[8];
    int n_lp = 0;
    for (size_t i = 0; i < c->n_logprobs && n_lp < 8; i++) lp_from_wire(&lp[n_lp++], c->logprobs[i]);
    if (c->n_prompt_logprobs) { /* once, with choice 0's first chunk */
        cm_oai_lp *pl = malloc(sizeof *pl * c->n_prompt_logprobs);
        for (size_t i = 0; pl && i < c->n_prompt_logprobs; i++) lp_from_wire(&pl[i], c->prompt_logprobs[i]);
        if (pl && c->n_prompt_logprobs < (size_t)q->n_tok) cm_oai_result_prompt(&q->res, q->tok, q->n_tok, pl, (int)c->n_prompt_logprobs);
        free(pl);
    }
    const cm_tokenizer *tok = q->model ? q->model->tok : NULL;
    const char *txt = c->has_text ? (const char *)c->text.data : "";
    size_t tl = c->has_text ? c->text.len : 0;
    gw_conn *out = q->parent ? q->parent->conn : q->conn;
    if (q->parent) { /* the batch's clocks: its first token, its idle time */
        if (c->n_token_ids && !q->parent->got_token) q->parent->got_token = 1, q->parent->t_first = t;
        q->parent->t_last = t;
    }
    if (q->c.stream && out && !q->res.tools) { /* with tools, the text is held: calls are parsed at the end */
        if (q->echo) { /* completions with echo: the prompt first, once per choice */
            for (int i = 0; i < q->res.n; i++) {
                json_t *j = cm_oai_chunk_json(&q->res, i, q->echo, q->echo_len, NULL, 0, 0, tok);
                if (j) stream_out(q, out, j);
                json_decref(j);
            }
            free(q->echo);
            q->echo = NULL;
        }
        json_t *j = cm_oai_chunk_json(&q->res, c->index, txt, tl, n_lp ? lp : NULL, n_lp, fin, tok);
        if (j) stream_out(q, out, j);
        if (q->cache_on && tl) { /* the answer, to be stored when it ends well */
            if (q->clen + tl + 1 > q->ccap) {
                size_t cap = q->ccap ? q->ccap : 256;
                while (cap < q->clen + tl + 1) cap *= 2;
                char *nt = realloc(q->ctext, cap);
                if (nt) q->ctext = nt, q->ccap = cap;
                else q->cache_on = 0;
            }
            if (q->cache_on) memcpy(q->ctext + q->clen, txt, tl), q->clen += tl;
        }
        json_decref(j);
        if (gw_http_backlog(out) > GW_MAX_BACKLOG) {
            g->m.cancelled++;
            CM_WARN("request %s: the client reads too slowly (%zu bytes unsent): cut off", q->id, gw_http_backlog(out));
            gw_req_finish(q, 499, "the client is not reading its stream", "client_too_slow");
            return;
        }
    } else {
        cm_oai_result_add(&q->res, c->index, txt, tl, n_lp ? lp : NULL, n_lp, tok);
        if (q->c.stream && out && cm_oai_tools_stream(&q->res)) { /* Hermes calls go out as they are written */
            json_t *a = cm_oai_tool_stream_json(&q->res, c->index, 0);
            for (size_t k = 0; k < json_array_size(a); k++) gw_http_stream_event(out, json_array_get(a, k));
            json_decref(a);
        }
    }
    if (fin) ch->finish = fin;
    if (cm_oai_result_done(&q->res)) {
        q->on_worker = 0;
        gw_req_finish(q, 200, NULL, NULL);
    }
}

void gw_req_worker_lost(gw *g, int w, const char *why) {
    for (gw_req *q = g->req_list, *nx; q; q = nx) {
        nx = q->next;
        if (q->worker == w) gw_req_retry(q, GW_FAIL_WORKER_LOST, 502, why, "worker_lost");
    }
}

void gw_req_fail_all(gw *g, int status, const char *msg, const char *code) {
    while (g->req_list) gw_req_finish(g->req_list, status, msg, code);
}
