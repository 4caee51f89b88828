/* llmserve-gateway: the OpenAI API in front of worker groups.
 *
 * The modules, along a request's flow: gw_conf (flags), gw_http (the only
 * evhttp user), gw_auth, gw_limit, gw_oai (handlers; preparation on
 * gw_tokq's threads), gw_req (a request's life), gw_route, gw_pool (worker
 * sockets, heartbeats, ModelInfo, incarnations), gw_metrics. This file
 * wires them and owns the lifecycle: SIGTERM drains. */
#include "cm_error.h"
#include "cm_gguf.h"
#include "cm_log.h"
#include "cm_model.h"
#include "gw.h"
#include "gw_http.h"
#include "gw_metrics.h"
#include "gw_oai.h"
#include "gw_pool.h"
#include "gw_req.h"
#include "gw_tokq.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void on_status(void *ctx, int status) {
    gw_metrics_status(&((gw *)ctx)->m, status);
}

/* Drain: /health says 503 and new requests get 503 at once; what runs may
 * finish until --shutdown-timeout, then ends with an error its client sees.
 * The loop keeps running until the last answer has had time to go out. */
static void on_drain_tick(evutil_socket_t fd, short what, void *arg) {
    gw *g = arg;
    (void)fd;
    (void)what;
    static double idle_since;
    double t = gw_now();
    if (g->req_list && t >= g->drain_deadline) {
        CM_WARN("shutdown timeout: ending %s in-flight requests with an error", g->req_list->next ? "the" : "the last");
        gw_req_fail_all(g, 503, "the gateway is shutting down", "shutting_down");
    }
    if (g->req_list || g->preparing) {
        idle_since = 0;
        return;
    }
    if (!idle_since) idle_since = t;
    if (t - idle_since >= 0.2) event_base_loopexit(g->base, NULL); /* the last bytes have gone out */
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    gw *g = arg;
    (void)what;
    if (g->draining) { /* a second signal: stop now */
        CM_WARN("second signal: ending every request now");
        g->drain_deadline = 0;
        return;
    }
    g->draining = 1;
    g->drain_deadline = gw_now() + g->conf.shutdown_timeout;
    int n = 0;
    for (gw_req *q = g->req_list; q; q = q->next) n++;
    CM_INFO("signal %d: draining %d requests for up to %.0f s (/health answers 503, new requests 503)", (int)sig, n,
            g->conf.shutdown_timeout);
    struct timeval tv = {0, 50000};
    g->drain_ev = event_new(g->base, -1, EV_PERSIST, on_drain_tick, g);
    if (g->drain_ev) event_add(g->drain_ev, &tv);
}

/* --model or --load-format dummy: the gateway's own tokenizer, not the workers'. */
static int load_override(gw *g, char *err, size_t errlen) {
    const gw_conf *c = &g->conf;
    cm_tokenizer *tok = NULL;
    char name[256];
    if (c->model_config) {
        cm_model_config mc;
        if (cm_model_config_resolve(c->model_config, &mc, err, errlen)) return LLM_EINVAL;
        if (cm_tok_synthetic(mc.vocab, &tok)) {
            snprintf(err, errlen, "%s: no stand-in tokenizer for a vocabulary of %u", c->model_config, mc.vocab);
            return LLM_EINVAL;
        }
    } else {
        cm_gguf *gg;
        char e2[400];
        if (cm_gguf_open(c->model, &gg, e2, sizeof e2)) {
            snprintf(err, errlen, "%s", e2);
            return LLM_EIO;
        }
        int rc = cm_tok_from_gguf(gg, &tok, e2, sizeof e2);
        cm_gguf_close(gg);
        if (rc) {
            snprintf(err, errlen, "%s: %s", c->model, e2);
            return rc;
        }
    }
    int rc = gw_model_make(tok, c->chat_template, 1, &g->model, err, errlen);
    if (rc) return rc;
    cm_model_served_name(c->model, c->model_config, name, sizeof name);
    snprintf(g->served, sizeof g->served, "%s", c->served_name ? c->served_name : name);
    return 0;
}

int main(int argc, char **argv) {
    gw *g = calloc(1, sizeof *g);
    if (!g) return 1;
    int ret = 1;
    char err[600] = "";
    struct event *sigs[2] = {0};
    int rc = gw_conf_parse(&g->conf, argc, argv);
    if (rc) {
        gw_conf_free(&g->conf);
        free(g);
        return rc == 1 ? 0 : 2;
    }
    const gw_conf *c = &g->conf;
    cm_log_set_level(c->log_level);
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < c->n_api_keys; i++)
        if (gw_auth_add(&g->auth, c->api_keys[i], strlen(c->api_keys[i]))) {
            fprintf(stderr, "llmserve-gateway: --api-key: an empty key would let nobody in\n");
            ret = 2;
            goto out;
        }
    if (c->api_keys_file && gw_auth_load_file(&g->auth, c->api_keys_file, err, sizeof err)) {
        fprintf(stderr, "llmserve-gateway: %s\n", err);
        ret = 2;
        goto out;
    }
    if (c->rpc_secret_file && pr_load_secret_file(c->rpc_secret_file, err, sizeof err)) {
        fprintf(stderr, "llmserve-gateway: %s\n", err);
        ret = 2;
        goto out;
    }
    if (gw_limits_init(&g->lim, c->rps, c->tpm, g->auth.n)) goto out;
    gw_metrics_init(&g->m);
    if ((c->model || c->model_config) && load_override(g, err, sizeof err)) {
        fprintf(stderr, "llmserve-gateway: %s\n", err);
        goto out;
    }
    snprintf(g->id, sizeof g->id, "gw%x%lx", (unsigned)getpid(), (long)time(NULL) & 0xffff);
    g->base = event_base_new();
    if (!g->base || gw_tokq_create(g->base, c->tokenizer_threads, c->tokenizer_queue, &g->tokq)) goto out;
    gw_http_opts ho = {c->host, c->port, (size_t)c->max_body, c->header_timeout, c->body_timeout, c->max_connections,
                       gw_oai_handle, on_status, g};
    if (gw_http_create(g->base, &ho, &g->http, err, sizeof err)) {
        fprintf(stderr, "llmserve-gateway: %s\n", err[0] ? err : "cannot start the HTTP server");
        goto out;
    }
    if (gw_pool_start(g, err, sizeof err)) {
        fprintf(stderr, "llmserve-gateway: %s\n", err);
        goto out;
    }
    sigs[0] = evsignal_new(g->base, SIGINT, on_signal, g);
    sigs[1] = evsignal_new(g->base, SIGTERM, on_signal, g);
    for (int i = 0; i < 2; i++)
        if (sigs[i]) event_add(sigs[i], NULL);
    CM_INFO("gateway on http://%s:%d, %d worker group(s), replies at %s; model %s", c->host, c->port, g->n_workers, g->reply,
            g->model ? g->served : "from the workers' handshake");
    event_base_dispatch(g->base);
    CM_INFO("gateway stopped");
    ret = 0;
out:
    if (g->req_list) gw_req_fail_all(g, 503, "the gateway is shutting down", "shutting_down");
    for (int i = 0; i < 2; i++)
        if (sigs[i]) event_free(sigs[i]);
    if (g->drain_ev) event_free(g->drain_ev);
    gw_tokq_free(g->tokq); /* finishes queued jobs: their done() answers or frees them */
    if (g->req_list) gw_req_fail_all(g, 503, "the gateway is shutting down", "shutting_down");
    gw_http_free(g->http);
    if (g->base) gw_pool_stop(g);
    if (g->base) event_base_free(g->base);
    gw_map_free(&g->reqs);
    gw_model_unref(g->model);
    gw_limits_free(&g->lim);
    gw_auth_free(&g->auth);
    gw_conf_free(&g->conf);
    free(g);
    return ret;
}
