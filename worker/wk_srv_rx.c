/* wk_srv_rx.c - the receive side: a thread decodes each message as it
 * arrives, notes that its gateway is alive and queues it; the loop drains
 * the queue before each step and dispatches every message in arrival
 * order. */
#include "wk_srv.h"

#include "cm_error.h"
#include "cm_log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A held decode Generate of this gateway and id, taken off the list; NULL if none. */
static rxmsg *unhold(server *s, const char *gid, uint64_t rid) {
    for (rxmsg **p = &s->held; *p; p = &(*p)->next) {
        const Llmserve__Generate *g = (*p)->env->generate;
        if (g->request_id == rid && !strcmp(g->gateway_id, gid)) {
            rxmsg *m = *p;
            *p = m->next;
            return m;
        }
    }
    return NULL;
}

static void on_cancel(server *s, const Llmserve__Cancel *c) {
    gateway *gw = wk_srv_find_gw(s, c->gateway_id);
    slot *sl = gw ? wk_srv_find_req(s, (int)(gw - s->gw), c->request_id) : NULL;
    rxmsg *h = sl ? NULL : unhold(s, c->gateway_id, c->request_id);
    if (h) { /* still waiting for its KV: it never starts */
        pr_free(h->env);
        free(h);
        return;
    }
    if (!sl) {
        CM_DEBUG("Cancel of unknown request %llu from %s ignored", (unsigned long long)c->request_id, c->gateway_id);
        return;
    }
    s->be->end(s, sl, WK_END_CANCEL, NULL);
}

/* One message, on the loop thread. */
static void handle(server *s, pr_env *env) {
    switch (env->body_case) {
    case LLMSERVE__ENVELOPE__BODY_MODEL_INFO_REQUEST: wk_srv_on_model_info(s, env->model_info_request); break;
    case LLMSERVE__ENVELOPE__BODY_HELLO: wk_srv_on_hello(s, env->hello); break;
    case LLMSERVE__ENVELOPE__BODY_GENERATE: wk_srv_on_generate(s, env->generate); break;
    case LLMSERVE__ENVELOPE__BODY_CANCEL: on_cancel(s, env->cancel); break;
    case LLMSERVE__ENVELOPE__BODY_EMBED: wk_srv_on_embed(s, env->embed); break;
    case LLMSERVE__ENVELOPE__BODY_STATS_REQUEST: wk_srv_on_stats_request(s, env->stats_request); break;
    case LLMSERVE__ENVELOPE__BODY_LORA_UPDATE: wk_srv_on_lora_update(s, env->lora_update); break;
    case LLMSERVE__ENVELOPE__BODY_KV_TRANSFER: wk_srv_kv_on_transfer(s, env->kv_transfer); break;
    default:
        s->dropped++;
        CM_WARN("unexpected message (body %d) dropped", env->body_case);
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
    case LLMSERVE__ENVELOPE__BODY_LORA_UPDATE: return env->lora_update->gateway_id;
    default: return NULL;
    }
}

/* The receiving thread: touches no engine state. */
void *wk_srv_receiver(void *arg) {
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
        gateway *gw = gid ? wk_srv_find_gw(s, gid) : NULL;
        if (gw && (env->body_case != LLMSERVE__ENVELOPE__BODY_HELLO || !strcmp(gw->reply, env->hello->reply_address)))
            gw->last_heard = now_ms(); /* alive, whatever the loop is doing */
        rxmsg *m = NULL;
        int generate = env->body_case == LLMSERVE__ENVELOPE__BODY_GENERATE;
        int embed = env->body_case == LLMSERVE__ENVELOPE__BODY_EMBED;
        if ((generate || embed) && s->rx_n >= RX_CAP) {
            if (gw && generate)
                wk_srv_send_error_chunk(s, (int)(gw - s->gw), env->generate->request_id, LLM_EAGAIN,
                                 "worker overloaded: its receive queue is full", LLMSERVE__FINISH_REASON__FINISH_ERROR);
            if (gw && embed)
                wk_srv_send_embed_error(s, (int)(gw - s->gw), env->embed->request_id, LLM_EAGAIN,
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

void wk_srv_drain_queue(server *s, int idle) {
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
    rxmsg **tail = &s->held;
    while (*tail) tail = &(*tail)->next;
    while (m) {
        rxmsg *next = m->next;
        const pr_env *env = m->env;
        /* a request moved here after its prefill elsewhere waits for that prefill's KV to arrive */
        if (env->body_case == LLMSERVE__ENVELOPE__BODY_GENERATE && env->generate->has_kv_transfer_id &&
            !env->generate->kv_push_address && !wk_srv_kv_ready(s, env->generate->kv_transfer_id)) {
            m->held_since = now_ms();
            m->next = NULL;
            *tail = m;
            tail = &m->next;
        } else {
            handle(s, m->env);
            pr_free(m->env);
            free(m);
        }
        m = next;
    }
    for (rxmsg **p = &s->held; *p;) { /* in arrival order: those whose transfer ended, or waited enough */
        rxmsg *h = *p;
        int ready = wk_srv_kv_ready(s, h->env->generate->kv_transfer_id);
        if (!ready && now_ms() - h->held_since < WK_KV_WAIT_MS) {
            p = &h->next;
            continue;
        }
        if (!ready) s->kvst.wait_expired++;
        *p = h->next;
        handle(s, h->env);
        pr_free(h->env);
        free(h);
    }
}

void wk_srv_free_held(server *s) {
    for (rxmsg *h = s->held, *nx; h; h = nx) {
        nx = h->next;
        pr_free(h->env);
        free(h);
    }
    s->held = NULL;
}
