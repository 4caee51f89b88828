/* wk_srv_embed.c - the embed wire and the embedding backend: an Embed
 * joins the encoder's continuous batch; its EmbedResult goes out whole when
 * its last input is embedded. */
#include "wk_srv.h"

#include "cm_error.h"
#include "cm_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* An embedding request joins the queue; its result goes out whole when its
 * last input is embedded (send_embed_results). */
void wk_srv_on_embed(server *s, const Llmserve__Embed *m) {
    int gi = wk_srv_gateway_for(s, m->gateway_id, m->reply_address);
    if (gi < 0) return;
    if (s->be->task != LLMSERVE__TASK__TASK_EMBED) {
        wk_srv_send_embed_error(s, gi, m->request_id, LLM_EUNSUP, "this worker group serves generation, not embeddings");
        return;
    }
    slot *dup = wk_srv_find_req(s, gi, m->request_id);
    if (dup) {
        wk_srv_refuse_duplicate(s, dup);
        return;
    }
    if (s->draining) {
        wk_srv_send_embed_error(s, gi, m->request_id, LLM_EAGAIN, "the worker is shutting down");
        return;
    }
    int maxw = s->o->max_waiting > 0 ? s->o->max_waiting : 1024;
    if (s->eq->n_jobs >= maxw) {
        wk_srv_send_embed_error(s, gi, m->request_id, LLM_EAGAIN, "worker overloaded: too many waiting requests");
        return;
    }
    if (m->deadline_ms && (int64_t)m->deadline_ms <= (int64_t)cm_wall_ms()) {
        wk_srv_send_embed_error(s, gi, m->request_id, LLM_ETIMEDOUT, "deadline passed before the request started");
        return;
    }
    if (m->n_inputs > WK_EMBED_MAX_INPUTS) {
        wk_srv_send_embed_error(s, gi, m->request_id, LLM_EINVAL, "more than 2048 inputs in one request");
        return;
    }
    const int32_t *tok[WK_EMBED_MAX_INPUTS];
    int len[WK_EMBED_MAX_INPUTS];
    for (size_t i = 0; i < m->n_inputs; i++) {
        tok[i] = m->inputs[i]->token_ids;
        len[i] = m->inputs[i]->n_token_ids > (size_t)INT32_MAX ? -1 : (int)m->inputs[i]->n_token_ids;
    }
    slot *sl = wk_srv_slot_new(s, gi, m->request_id);
    if (!sl) {
        wk_srv_send_embed_error(s, gi, m->request_id, LLM_ENOMEM, "worker out of request slots");
        return;
    }
    char err[300] = "";
    int rc = wk_embed_add(s->eq, sl->eid, (int64_t)m->deadline_ms, (int)m->n_inputs, tok, len, err, sizeof err);
    if (rc) {
        wk_srv_slot_free(s, sl);
        wk_srv_send_embed_error(s, gi, m->request_id, rc, err[0] ? err : cm_strerror(rc));
        return;
    }
    wk_srv_slot_start(s, sl, (int64_t)m->deadline_ms);
}

/* Finished embedding requests to their gateways. */
static void send_embed_results(server *s) {
    for (wk_ejob *j = wk_embed_take_done(s->eq), *next; j; j = next) {
        next = j->next;
        slot *sl = wk_srv_slot_of(s, j->id);
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
            wk_srv_slot_free(s, sl);
            s->embed_finished++;
            wk_srv_send(s, g, &env);
        }
        wk_ejob_free(j);
    }
}

/* ---- the backend -------------------------------------------------------- */

static int embed_has_work(const server *s) { return wk_embed_has_work(s->eq); }

static int embed_step(server *s) { return wk_embed_step(s->eq); }

/* Nothing streams: the request leaves the queue now and its gateway hears
 * why (a cancel needs no answer). */
static void embed_end(server *s, slot *sl, int why, const char *msg) {
    wk_embed_remove(s->eq, sl->eid);
    if (why == WK_END_DEADLINE) wk_srv_send_embed_error(s, sl->gw, sl->rid, LLM_ETIMEDOUT, "deadline exceeded");
    else if (why == WK_END_SHUTDOWN) wk_srv_send_embed_error(s, sl->gw, sl->rid, LLM_EAGAIN, "the worker shut down");
    else if (why == WK_END_DROP) wk_srv_send_embed_error(s, sl->gw, sl->rid, LLM_EIO, msg);
    wk_srv_slot_free(s, sl);
}

static void embed_stats(const server *s, wk_engine_stats *es) {
    es->waiting = s->eq->n_jobs;
    es->steps = s->eq->steps;
    es->requests_finished = s->embed_finished;
}

const wk_backend wk_srv_embed_backend = {.task = LLMSERVE__TASK__TASK_EMBED,
                                         .has_work = embed_has_work,
                                         .step = embed_step,
                                         .end = embed_end,
                                         .flush = send_embed_results,
                                         .stats = embed_stats};
