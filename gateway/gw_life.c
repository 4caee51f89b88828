/* gw_life.c - the gateway's lifecycle: start every module from a parsed
 * gw_conf, drain on the first signal, stop. llmserve-gateway's main() and
 * the HTTP fuzz harness (tests/fuzz/fuzz_http.c) run the same gateway
 * through it. */
#include "cm_error.h"
#include "cm_time.h"
#include "cm_gguf.h"
#include "cm_log.h"
#include "cm_model.h"
#include "gw.h"
#include "gw_embed.h"
#include "gw_lora.h"
#include "gw_http.h"
#include "gw_rstore.h"
#include "gw_jobs.h"
#include "gw_life.h"
#include "gw_metrics.h"
#include "gw_router.h"
#include "gw_pool.h"
#include "gw_req.h"
#include "gw_tokq.h"

#include <malloc.h>
#include <sys/random.h>
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
    double t = cm_now();
    if (g->req_list && t >= g->drain_deadline) {
        CM_WARN("shutdown timeout: ending %s in-flight requests with an error", g->req_list->next ? "the" : "the last");
        gw_req_fail_all(g, 503, "the gateway is shutting down", "shutting_down");
    }
    if (g->req_list || gw_tokq_queued(g->tokq)) { /* and requests being prepared: the tokenizer queue counts them */
        idle_since = 0;
        return;
    }
    if (!idle_since) idle_since = t;
    if (t - idle_since >= 0.2) event_base_loopexit(g->base, NULL); /* the last bytes have gone out */
}

void gw_drain(gw *g, int sig) {
    if (g->draining) { /* a second signal: stop now */
        CM_WARN("second signal: ending every request now");
        g->drain_deadline = 0;
        return;
    }
    g->draining = 1;
    g->drain_deadline = cm_now() + g->conf.shutdown_timeout;
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

/* libevent's own messages, into our log at their level. One is known and
 * harmless: when evhttp closes a connection from inside the write callback
 * of our filter bufferevent (gw_http), the filter finds its socket
 * bufferevent's count one lower than it expects and skips freeing it; the
 * socket bufferevent is freed, and its descriptor closed, when the filter's
 * reference goes. tests/fuzz/fuzz_http.c checks that no descriptor leaks. */
static void on_event_log(int severity, const char *msg) {
    if (strstr(msg, "BEV_OPT_CLOSE_ON_FREE set on an bufferevent with too few references")) {
        CM_DEBUG("libevent: %s", msg);
        return;
    }
    if (severity >= EVENT_LOG_ERR) CM_ERR("libevent: %s", msg);
    else if (severity == EVENT_LOG_WARN) CM_WARN("libevent: %s", msg);
    else CM_DEBUG("libevent: %s", msg);
}

int gw_start(gw *g, char *err, size_t errlen) {
    const gw_conf *c = &g->conf;
#ifdef __GLIBC__
    /* Bodies of megabytes are read, copied and parsed (on the tokenizer
     * threads' own arenas) and then freed. glibc's mmap threshold grows to
     * the largest such block freed, after which they come from heaps whose
     * tops are kept resident: the gateway would stay at the peak of its
     * largest bodies for good. A fixed threshold maps them and returns them
     * on free (gw_http trims the rest after each large body). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif
    cm_log_set_level(c->log_level);
    event_set_log_callback(on_event_log);
    for (int i = 0; i < c->n_api_keys; i++)
        if (gw_auth_add(&g->auth, c->api_keys[i], strlen(c->api_keys[i]))) {
            snprintf(err, errlen, "--api-key: an empty key would let nobody in");
            return LLM_EINVAL;
        }
    if (c->api_keys_file && gw_auth_load_file(&g->auth, c->api_keys_file, err, errlen)) return LLM_EINVAL;
    if (c->rpc_secret_file && pr_load_secret_file(c->rpc_secret_file, err, errlen)) return LLM_EINVAL;
    if (gw_limits_init(&g->lim, c->rps, c->tpm, g->auth.n)) {
        snprintf(err, errlen, "out of memory for the rate limits");
        return LLM_ENOMEM;
    }
    gw_metrics_init(&g->m);
    if (c->scache) gw_cache_init(&g->cache, c->scache_size, c->scache_ttl, (float)c->scache_threshold, 0);
    int rc;
    if ((c->model || c->model_config) && (rc = load_override(g, err, errlen))) return rc;
    g->started = cm_now();
    snprintf(g->id, sizeof g->id, "gw%x%lx", (unsigned)getpid(), (long)time(NULL) & 0xffff);
    g->base = event_base_new();
    if (!g->base || gw_tokq_create(g->base, c->tokenizer_threads, c->tokenizer_queue, &g->tokq)) {
        snprintf(err, errlen, "cannot start the event loop or the tokenizer threads");
        return LLM_ENOMEM;
    }
    if ((rc = gw_cors_init(&g->cors, c->allowed_origins, c->allowed_methods, c->allowed_headers, c->allow_credentials,
                           err, errlen)))
        return rc;
    if ((rc = gw_rstore_open(g->base, c->response_store, c->response_store_ttl, c->response_store_size,
                             (size_t)c->response_store_bytes, c->response_store_timeout, &g->rstore, err, errlen)))
        return rc;
    gw_http_opts ho = {c->host, c->port, (size_t)c->max_body, c->header_timeout, c->body_timeout, c->max_connections,
                       gw_router_handle, on_status, g, &g->cors};
    if (gw_http_create(g->base, &ho, &g->http, err, errlen)) {
        if (!err[0]) snprintf(err, errlen, "cannot start the HTTP server");
        return LLM_EIO;
    }
    /* batch jobs: their requests come back in through our own port, with a bearer only this process knows */
    unsigned char tb[32];
    if (getrandom(tb, sizeof tb, 0) != (ssize_t)sizeof tb) {
        snprintf(err, errlen, "no random bytes for the internal token");
        return LLM_EIO;
    }
    for (int i = 0; i < 32; i++) snprintf(g->internal_token + 2 * i, 3, "%02x", tb[i]);
    const char *tmp = getenv("TMPDIR");
    snprintf(g->files_dir, sizeof g->files_dir, "%s", c->files_dir ? c->files_dir : "");
    if (!c->files_dir) snprintf(g->files_dir, sizeof g->files_dir, "%s/llmserve-files", tmp && *tmp ? tmp : "/tmp");
    /* without a writable folder the rest serves on: /v1/files and /v1/batches answer 503 saying why */
    if (gw_jobs_start(g->base, g->files_dir, c->host, gw_http_port(g->http), g->internal_token, c->batch_concurrency,
                      &g->jobs, g->files_off, sizeof g->files_off))
        CM_WARN("/v1/files and /v1/batches are off: %s", g->files_off);
    static const gw_pool_ops ops = {gw_req_on_chunk, gw_embed_on_result, gw_req_worker_lost, gw_lora_on_result};
    if ((rc = gw_pool_start(g, &ops, err, errlen))) return rc;
    return 0;
}

void gw_stop(gw *g) {
    gw_lora_fail_all(g);
    if (g->req_list) gw_req_fail_all(g, 503, "the gateway is shutting down", "shutting_down");
    if (g->drain_ev) event_free(g->drain_ev);
    g->drain_ev = NULL;
    if (g->tail_401) event_free(g->tail_401);
    g->tail_401 = NULL;
    gw_tokq_free(g->tokq); /* finishes queued jobs: their done() answers or frees them */
    g->tokq = NULL;
    if (g->req_list) gw_req_fail_all(g, 503, "the gateway is shutting down", "shutting_down");
    gw_jobs_free(g->jobs); /* its batches stay in the directory for the next gateway */
    g->jobs = NULL;
    gw_rstore_free(g->rstore); /* its pending operations end their replies */
    g->rstore = NULL;
    gw_http_free(g->http);
    g->http = NULL;
    if (g->base) gw_pool_stop(g);
    if (g->base) event_base_free(g->base);
    g->base = NULL;
    cm_idmap_free(&g->reqs);
    gw_model_unref(g->model);
    gw_model_unref(g->emodel);
    g->model = g->emodel = NULL;
    gw_cache_free(&g->cache);
    gw_sums_free(&g->sums);
    gw_limits_free(&g->lim);
    gw_auth_free(&g->auth);
    gw_cors_free(&g->cors);
    gw_conf_free(&g->conf);
}
