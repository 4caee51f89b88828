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
    if (!g->conf.log_requests) return;
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
    json_decref(q->body);
    if (q->ops && q->ops->release) q->ops->release(q);
    cm_oai_result_free(&q->res);
    cm_oai_completion_free(&q->c);
    gw_model_unref(q->model);
    free(q);
}

/* Counts q's adapter's requests on workers up or down (vllm:lora_requests_info). */
static void lora_run(gw_req *q, int d) {
    gw *g = q->g;
    if (!q->lora || !q->c.model) return;
    int i = 0;
    while (i < g->n_lora_run && strcmp(g->lora_run[i].name, q->c.model)) i++;
    if (i == g->n_lora_run) {
        if (d < 0 || i == (int)(sizeof g->lora_run / sizeof g->lora_run[0])) return;
        snprintf(g->lora_run[i].name, sizeof g->lora_run[i].name, "%s", q->c.model);
        g->lora_run[i].n = 0;
        g->n_lora_run++;
    }
    g->lora_run[i].n += d;
}

void gw_req_join(gw_req *q, int wi) {
    gw_req_leave(q, 0);
    q->worker = wi;
    q->joined = 1;
    q->g->w[wi].inflight++;
    q->joined_prefill = q->pd_decode && !q->got_token ? q->pd_tokens : 0;
    q->g->w[wi].prefill_tokens += q->joined_prefill;
    lora_run(q, 1);
}

void gw_req_leave(gw_req *q, int cancel) {
    if (!q->joined) return;
    if (cancel) gw_pool_cancel(q->g, q->worker, q->rid);
    q->g->w[q->worker].inflight--;
    q->g->w[q->worker].prefill_tokens -= q->joined_prefill;
    q->joined_prefill = 0;
    lora_run(q, -1);
    q->joined = 0;
}

/* After a send of q to group wi: joined there, on the worker, its sequence
 * from 0, the group's incarnation and the send time noted. */
static void sent(gw_req *q, int wi) {
    gw_req_join(q, wi);
    q->worker_inc = q->g->w[wi].incarnation;
    q->on_worker = 1;
    q->next_seq = 0;
    q->t_sent = cm_now();
    q->g->w[wi].routed++;
}

int gw_req_send_env(gw_req *q, int wi, pr_env *e) {
    int rc = gw_pool_send(q->g, wi, e);
    if (!rc) sent(q, wi);
    return rc;
}

uint64_t gw_req_deadline_ms(const gw_req *q, double timeout) {
    if (timeout <= 0) return 0;
    return (uint64_t)(cm_wall_ms() + (timeout - (cm_now() - q->t_arrive)) * 1e3);
}

const char *gw_req_lora(const gw *g, const gw_req *q) {
    (void)g;
    return q->lora ? q->c.model : NULL;
}

/* Disaggregated prefill and decode, decided per request as Dynamo does: the group it decodes on is picked as
 * ever (prefix, load; kv_producer groups only when nothing else is up); when that is a kv_consumer group and
 * the part of the prompt it has not cached is longer than --max-local-prefill-length, a kv_producer group
 * (prefix, load) prefills it first and sends it the KV. A shorter part (of --idle-prefill-min-length or more)
 * goes the same way while the consumer is busy and the producer picked has no long prompt to compute (what
 * this gateway has it prefill, this one included, within --max-local-prefill-length; nothing queued there, and
 * nothing running that is not this gateway's): the consumer's steps stay pure decode, and the prompt starts at
 * once. With --idle-decode such a request stays there to decode while the producer holds fewer of this
 * gateway's requests than the consumer (a guest: both cores decode while no long prompt comes); a long prompt
 * sent to that producer moves its guests to their decode group first (move_guests). One choice, no prompt
 * scoring, not resumed. */
static int producer_free(const gw *g, const gw_worker *w, int tokens) {
    return w->prefill_tokens + tokens <= g->conf.max_local_prefill && !w->waiting && w->running <= w->inflight;
}

int gw_req_generate_pick(gw *g, gw_req *q, int exclude, int *hit) {
    const char *lora = gw_req_lora(g, q);
    uint64_t salt = cm_salt_lora(q->c.cache_salt ? cm_salt_of(q->c.cache_salt, strlen(q->c.cache_salt)) : 0, lora);
    q->pd_decode = q->pd_guest = 0;
    int wi = gw_route(g, q->tok, q->n_tok, salt, exclude, lora, GW_ROLES_DECODE, hit);
    if (wi < 0) return gw_route(g, q->tok, q->n_tok, salt, exclude, lora, GW_ROLES_PREFILL, hit);
    int uncached = q->n_tok - *hit, idle_only = uncached <= g->conf.max_local_prefill;
    if (q->got_token || q->c.n != 1 || q->c.prompt_logprobs >= 0 || (q->c.echo && q->c.logprobs >= 0) || q->max_tokens == 1 ||
        g->w[wi].kv_role != LLMSERVE__KV_ROLE__KV_CONSUMER ||
        (idle_only && (!g->conf.idle_prefill_min || uncached < g->conf.idle_prefill_min || !g->w[wi].inflight)))
        return wi;
    int phit = 0, pi = gw_route(g, q->tok, q->n_tok, salt, exclude, lora, GW_ROLES_PREFILL, &phit);
    if (pi < 0 || (idle_only && !producer_free(g, &g->w[pi], q->n_tok - phit))) return wi;
    q->pd_decode = wi + 1;
    q->pd_guest = idle_only && g->conf.idle_decode && g->w[pi].inflight < g->w[wi].inflight;
    q->pd_tokens = q->n_tok - phit;
    *hit = phit;
    return pi;
}

void gw_req_generate_begin(gw_req *q) {
    cm_oai_result_init(&q->res, &q->c, q->id, q->lora ? q->c.model : q->g->served, (long)time(NULL), q->echo, q->echo_len);
    q->res.prompt_tokens = q->n_tok;
    if (!q->c.stream) { /* the echo is in the collected text already */
        free(q->echo);
        q->echo = NULL;
    }
}

const gw_req_ops gw_req_generate_ops = {.pick = gw_req_generate_pick,
                                        .send = gw_req_generate_send,
                                        .begin = gw_req_generate_begin,
                                        .none = "no worker group is available",
                                        .tokens = 1};

static const gw_req_ops *ops_of(const gw_req *q) { return q->ops ? q->ops : &gw_req_generate_ops; }

/* The connection q answers on: its own, or its whole's. */
static gw_conn *client_of(const gw_req *q) { return q->up ? q->up->conn : q->conn; }

/* The answer to q's client: the response, or the error, ending its reply. */
static void answer(gw_req *q, gw_conn *c, int status, const char *msg, const char *code) {
    if (status == 200 && gw_http_streaming(c)) {
        for (int i = 0; q->res.tools && i < q->res.n; i++) { /* with tools: what is left, the calls, the finish */
            json_t *a = cm_oai_tools_stream(&q->res) ? cm_oai_tool_stream_json(&q->res, i, 1)
                                                     : cm_oai_tool_chunks_json(&q->res, i, q->model ? q->model->tok : NULL);
            for (size_t k = 0; k < json_array_size(a); k++) gw_http_stream_event(c, json_array_get(a, k));
            json_decref(a);
        }
        json_t *j = q->body ? json_incref(q->body) : q->c.include_usage ? cm_oai_usage_chunk_json(&q->res) : NULL;
        if (j) gw_http_stream_event(c, j);
        json_decref(j);
        gw_http_stream_end(c);
    } else if (status == 200) {
        json_t *j = q->body ? json_incref(q->body) : cm_oai_response_json(&q->res, q->model ? q->model->tok : NULL);
        gw_http_json(c, 200, j);
        json_decref(j);
    } else if (gw_http_streaming(c)) { /* the 200 went out: the error is an event the client sees, then [DONE] */
        json_t *j = cm_oai_error_json(status, msg, NULL, code);
        gw_http_stream_event(c, j);
        json_decref(j);
        gw_http_stream_end(c);
    } else {
        gw_http_error(c, status, msg, q->param, code);
    }
}

void gw_req_finish(gw_req *q, int status, const char *msg, const char *code) {
    gw *g = q->g;
    const gw_req_ops *ops = ops_of(q);
    if (ops->on_end) ops->on_end(q, status, msg, code);
    gw_req_leave(q, status != 200 && q->on_worker); /* it may still run there */
    if (status == 200) {
        if (!ops->part) gw_hist_add(&g->m.e2e, cm_now() - q->t_arrive);
        for (int i = 0; i < q->res.n; i++) g->m.completion_tokens += (uint64_t)q->res.ch[i].completion_tokens;
    }
    if (q->conn) {
        gw_conn *c = q->conn;
        q->conn = NULL;
        answer(q, c, status, msg, code);
    }
    if (!ops->part) log_request(q, status, status == 200 ? NULL : code); /* a part logs as its whole */
    gw_req_free(q);
}

void gw_req_end_soon(gw_req *q, int status, const char *msg, const char *code) {
    q->end_status = status, q->end_msg = msg, q->end_code = code;
    struct timeval now = {0, 0};
    if (q->timer) evtimer_add(q->timer, &now);
}

static void on_timer(evutil_socket_t fd, short what, void *arg);

/* The client went away: the worker stops computing for it at once. */
static void on_gone(void *arg) {
    gw_req *q = arg;
    q->conn = NULL;
    q->g->m.cancelled++;
    gw_req_finish(q, 499, "the client closed the connection", "client_closed");
}

static void hand_over(gw_req *q, int running);

/* The guests decoding on prefill group wi go on on their decode groups: cancelled there (which ends their
 * prompts' KV transfers), sent on after what their clients have, that KV adopted and the rest computed. */
static void move_guests(gw *g, int wi) {
    for (gw_req *r = g->req_list, *nx; r; r = nx) {
        nx = r->next;
        if (r->worker != wi || !r->on_worker || !r->pd_guest) continue;
        r->pd_guest = 0;
        if (!r->got_token) r->xfer = 0; /* not started: its decode group computes the prompt */
        g->m.disagg_moved++;
        hand_over(r, 1);
    }
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
    gen.lora = (char *)gw_req_lora(g, q);
    gen.gateway_id = g->id;
    gen.reply_address = g->reply;
    if (q->pd_decode && !q->got_token && !q->pd_guest && q->pd_tokens > g->conf.max_local_prefill)
        move_guests(g, wi); /* before the prompt, so their cancels reach the producer first */
    if (q->pd_decode && !q->got_token) { /* a prefill: the first token here (a guest's all), the KV to the decode group */
        if (!q->pd_guest) {
            sp.max_tokens = 1;
            if (sp.min_tokens > 1) sp.min_tokens = 1;
        }
        q->xfer = cm_salt_of(g->id, strlen(g->id)) ^ (q->rid * 0x9E3779B97F4A7C15ull);
        if (!q->xfer) q->xfer = 1;
        gen.kv_push_address = g->w[q->pd_decode - 1].addr;
        gen.has_kv_transfer_id = 1;
        gen.kv_transfer_id = q->xfer;
    } else if (q->xfer && q->got_token) { /* its decode group: the prompt's KV is on its way there */
        gen.has_kv_transfer_id = 1;
        gen.kv_transfer_id = q->xfer;
        q->xfer = 0;
    }
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
    int rc = gw_req_send_env(q, wi, &e);
    if (!rc && gen.kv_push_address) {
        g->m.disagg_prefills++;
        g->m.disagg_guests += (uint64_t)q->pd_guest;
    }
    free(bid);
    free(bval);
    return rc;
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
    if (client_of(q) && resumable && !q->retried) {
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
    if (q->end_status) {
        gw_req_finish(q, q->end_status, q->end_msg, q->end_code);
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

void gw_req_start(gw *g, gw_req *q) {
    const gw_req_ops *ops = ops_of(q);
    int hit = 0, wi = ops->pick(g, q, -1, &hit);
    if (wi < 0) {
        g->m.overloaded++;
        gw_req_finish(q, 503, ops->none, "no_workers");
        return;
    }
    if (g->conf.max_queue > 0 && g->w[wi].inflight >= g->conf.max_queue) {
        gw_conn *cc = client_of(q);
        if (cc && !gw_http_streaming(cc)) gw_http_header(cc, "Retry-After", "1");
        g->m.overloaded++;
        gw_req_finish(q, 429, "the server is at capacity; retry shortly", "overloaded");
        return;
    }
    q->t_sent = cm_now();
    if (!ops->part) /* a part answers under its whole's id */
        snprintf(q->id, sizeof q->id, "%s-%s%llx", ops->id_prefix ? ops->id_prefix : q->c.is_chat ? "chatcmpl" : "cmpl",
                 g->id, (unsigned long long)(g->next_rid + 1));
    if (assign_rid(g, q)) {
        gw_req_finish(q, 500, "out of memory", "internal_error");
        return;
    }
    list_in(g, q);
    if (ops->begin) ops->begin(q);
    if (ops->send(g, q, wi)) {
        g->m.overloaded++;
        gw_req_finish(q, 503, "the worker group is not accepting requests", "overloaded");
        return;
    }
    g->w[wi].routed_hit_tokens += (uint64_t)hit;
    g->m.prompt_tokens += (uint64_t)q->n_tok;
    gw_hist_add(&g->m.queue, q->t_sent - q->t_arrive);
    if (q->conn) watch(g, q); /* a part, or a request the gateway asks itself, has no client of its own */
    else if ((q->timer = evtimer_new(g->base, on_timer, q))) {
        struct timeval tv = {0, 200000};
        evtimer_add(q->timer, &tv);
    }
    if (q->c.stream && q->conn) gw_http_stream_begin(q->conn);
}

static void lp_from_wire(cm_oai_lp *o, const Llmserve__TokenLogprob *l) {
    o->token = l->token_id;
    o->logprob = l->logprob;
    o->rank = l->has_rank ? l->rank : 0;
    o->n_top = (int)(l->n_top < CM_OAI_MAX_LOGPROBS ? l->n_top : CM_OAI_MAX_LOGPROBS);
    for (int k = 0; k < o->n_top; k++) o->top[k] = (cm_oai_top){l->top[k]->token_id, l->top[k]->logprob};
}

/* A chunk to the client; a part renumbers its choices into its whole's. */
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

/* A prefilled request goes on on its decode group, after the tokens it has, naming the transfer of its KV (a
 * guest still running on the prefill group is cancelled there); a decode group that cannot take it is a lost
 * group (another resumes it, computing the prompt). */
static void hand_over(gw_req *q, int running) {
    gw *g = q->g;
    int wi = q->pd_decode - 1;
    q->pd_decode = 0;
    q->pd_done = 1;
    gw_req_leave(q, running); /* it ended on the prefill group, or ends there now */
    q->on_worker = 0;
    if (gw_pool_routable(g, wi) && !assign_rid(g, q) && !ops_of(q)->send(g, q, wi)) {
        g->m.disagg_handoffs += !running;
        return;
    }
    q->xfer = 0;
    gw_req_retry(q, GW_FAIL_WORKER_LOST, 502, "the decode group could not take the request", "worker_lost");
}

void gw_req_on_chunk(gw *g, const Llmserve__TokenChunk *c) {
    gw_req *q = cm_idmap_get(&g->reqs, c->request_id);
    if (!q || !q->on_worker) return; /* ended, or an old id of a moved request */
    int error = c->has_finish && (c->finish == LLMSERVE__FINISH_REASON__FINISH_ERROR ||
                                  c->finish == LLMSERVE__FINISH_REASON__FINISH_TIMEOUT);
    /* an error carries no output, and a worker sends it outside the request's sequence (a group that stops
     * tells each request so): it is taken as it comes. A gap in the output: what the client has is whole up to
     * it, so the request goes on elsewhere from there, as from a lost group */
    if (c->seq != q->next_seq && !error) {
        gw_req_leave(q, 1);
        q->on_worker = 0;
        gw_req_retry(q, GW_FAIL_WORKER_LOST, 502, "lost a message from the worker (sequence gap)", "stream_gap");
        return;
    }
    q->next_seq++;
    if (error) {
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
    /* a prefill group's first token, at the length it was held to: not the end, the request goes on on its
     * decode group (unless that length is the request's own, or the model's) */
    int handoff = q->pd_decode && !q->pd_guest && fin == CM_OAI_FINISH_LENGTH && c->n_token_ids &&
                  (q->max_tokens <= 0 || q->n_out + (int)c->n_token_ids < q->max_tokens) &&
                  q->n_tok + q->n_out + (int)c->n_token_ids < g->w[q->pd_decode - 1].max_model_len;
    if (handoff) fin = CM_OAI_FINISH_NONE;
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
            if (q->pd_guest) { /* its prompt is computed: the producer counts as free of it */
                g->w[q->worker].prefill_tokens -= q->joined_prefill;
                q->joined_prefill = 0;
            }
            q->got_token = 1;
            q->t_first = t;
            gw_hist_add(&g->m.ttft, t - q->t_arrive);
        } else if (q->t_last > 0) {
            gw_hist_add(&g->m.itl, (t - q->t_last) / (double)c->n_token_ids);
        }
        q->t_last = t;
    }
    cm_oai_choice *ch = &q->res.ch[c->index];
    if (c->has_finish && c->has_stop_string) ch->stop_kind = CM_OAI_STOP_STRING, ch->stop_val = c->stop_string;
    else if (c->has_finish && c->has_stop_token) ch->stop_kind = CM_OAI_STOP_TOKEN, ch->stop_val = c->stop_token;
    if (c->usage) {
        ch->completion_tokens = c->usage->completion_tokens;
        if (!q->pd_done) /* after a handoff the decode group's count would hold the KV it was sent */
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
    gw_conn *out = client_of(q);
    if (q->up) { /* the whole's clocks: its first token, its idle time */
        if (c->n_token_ids && !q->up->got_token) q->up->got_token = 1, q->up->t_first = t;
        q->up->t_last = t;
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
        if (tl && ops_of(q)->on_text) ops_of(q)->on_text(q, txt, tl);
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
    if (handoff) {
        hand_over(q, 0);
        return;
    }
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
