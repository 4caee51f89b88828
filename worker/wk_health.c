#include "wk_health.h"
#include "cm_time.h"
#include "cm_error.h"
#include "cm_log.h"

#include <nng/nng.h>
#include <pthread.h>
#include <unistd.h>
#include <nng/supplemental/http/http.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wk_health {
    nng_http_server *srv;        /* NULL without --health-port: the load deadline still holds */
    pthread_t watch;             /* the load deadline's watchdog */
    int watching;
    double load_s;
    _Atomic int64_t load_end_ms; /* while loading: the deadline (monotonic ms), 0 while suspended */
    pthread_mutex_t mu;          /* guards metrics */
    char *metrics;               /* the latest /metrics text (wk_health_set_metrics), or NULL */
    size_t metrics_len;
    _Atomic int64_t beat_ms;     /* the main loop's last pass (monotonic ms) */
    _Atomic int state;
    _Atomic int beating;         /* the loop calls wk_health_beat (rank 0's does; a follower's never) */
    int live_ms;
};

static int64_t mono_ms(void) { return (int64_t)(cm_now() * 1e3); }

static const char *state_name(int s) {
    switch (s) {
    case WK_H_LOADING: return "loading";
    case WK_H_READY: return "ready";
    case WK_H_DRAINING: return "draining";
    case WK_H_LOAD_TIMEOUT: return "load_timeout";
    default: return "failed";
    }
}

static void reply(nng_aio *aio, int status, const char *body) {
    nng_http_res *res;
    if (nng_http_res_alloc(&res)) {
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    nng_http_res_set_status(res, (uint16_t)status);
    nng_http_res_set_header(res, "Content-Type", "application/json");
    nng_http_res_set_header(res, "Cache-Control", "no-store");
    nng_http_res_copy_data(res, body, strlen(body));
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static void on_live(nng_aio *aio) {
    nng_http_handler *hd = nng_aio_get_input(aio, 1);
    wk_health *h = nng_http_handler_get_data(hd);
    int64_t age = mono_ms() - atomic_load(&h->beat_ms);
    int st = atomic_load(&h->state);
    char b[160];
    /* a load (minutes for a 70B model) is alive until --load-timeout; ranks that follow rank 0 block
     * between its steps and never beat: alive while the process is */
    int ok = st == WK_H_LOADING ||
             (st != WK_H_FAILED && st != WK_H_LOAD_TIMEOUT && (!atomic_load(&h->beating) || age <= h->live_ms));
    snprintf(b, sizeof b, "{\"status\":\"%s\",\"state\":\"%s\",\"loop_ms_ago\":%lld}\n", ok ? "ok" : "stuck",
             state_name(st), (long long)age);
    reply(aio, ok ? 200 : 503, b);
}

static void on_metrics(nng_aio *aio) {
    nng_http_handler *hd = nng_aio_get_input(aio, 1);
    wk_health *h = nng_http_handler_get_data(hd);
    nng_http_res *res;
    if (nng_http_res_alloc(&res)) {
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    pthread_mutex_lock(&h->mu);
    int have = h->metrics != NULL;
    if (have) nng_http_res_copy_data(res, h->metrics, h->metrics_len);
    pthread_mutex_unlock(&h->mu);
    if (!have) { /* loading: nothing to count yet, but the state */
        char b[160];
        int st = atomic_load(&h->state);
        snprintf(b, sizeof b, "# TYPE llmserve:worker_ready gauge\nllmserve:worker_ready %d\n", st == WK_H_READY);
        nng_http_res_copy_data(res, b, strlen(b));
    }
    nng_http_res_set_status(res, 200);
    nng_http_res_set_header(res, "Content-Type", "text/plain; version=0.0.4");
    nng_http_res_set_header(res, "Cache-Control", "no-store");
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

void wk_health_set_metrics(wk_health *h, const char *text, size_t len) {
    if (!h || !h->srv) return;
    char *c = malloc(len + 1);
    if (!c) return;
    memcpy(c, text, len);
    c[len] = 0;
    pthread_mutex_lock(&h->mu);
    free(h->metrics);
    h->metrics = c;
    h->metrics_len = len;
    pthread_mutex_unlock(&h->mu);
}

int wk_health_serving(const wk_health *h) { return h && h->srv; }

static void on_ready(nng_aio *aio) {
    nng_http_handler *hd = nng_aio_get_input(aio, 1);
    wk_health *h = nng_http_handler_get_data(hd);
    int st = atomic_load(&h->state);
    int64_t age = mono_ms() - atomic_load(&h->beat_ms);
    int ok = st == WK_H_READY && (!atomic_load(&h->beating) || age <= h->live_ms);
    char b[160];
    snprintf(b, sizeof b, "{\"status\":\"%s\",\"state\":\"%s\"}\n", ok ? "ok" : "unavailable", state_name(st));
    reply(aio, ok ? 200 : 503, b);
}

int wk_health_start(const char *host, int port, int live_ms, wk_health **out, char *err, size_t errlen) {
    *out = NULL;
    wk_health *h = calloc(1, sizeof *h);
    if (!h) return LLM_ENOMEM;
    h->live_ms = live_ms > 0 ? live_ms : 30000;
    pthread_mutex_init(&h->mu, NULL);
    atomic_store(&h->beat_ms, mono_ms());
    atomic_store(&h->state, WK_H_LOADING);
    if (!port) { /* no probes: only the deadline */
        *out = h;
        return 0;
    }
    char url[300];
    snprintf(url, sizeof url, "http://%s:%d", host && *host ? host : "0.0.0.0", port);
    nng_url *u = NULL;
    int rv = nng_url_parse(&u, url);
    if (!rv) rv = nng_http_server_hold(&h->srv, u);
    const char *paths[] = {"/live", "/ready", "/health", "/metrics"};
    void (*cbs[])(nng_aio *) = {on_live, on_ready, on_ready, on_metrics};
    for (int i = 0; i < 4 && !rv; i++) {
        nng_http_handler *hd;
        rv = nng_http_handler_alloc(&hd, paths[i], cbs[i]);
        if (!rv) rv = nng_http_handler_set_data(hd, h, NULL);
        if (!rv && (rv = nng_http_server_add_handler(h->srv, hd))) nng_http_handler_free(hd);
    }
    if (!rv) rv = nng_http_server_start(h->srv);
    if (u) nng_url_free(u);
    if (rv) {
        snprintf(err, errlen, "--health-port %d: cannot serve %s: %s", port, url, nng_strerror(rv));
        if (h->srv) nng_http_server_release(h->srv);
        free(h);
        return LLM_EIO;
    }
    CM_INFO("probes on %s: /live, /ready, /health, /metrics", url);
    *out = h;
    return 0;
}

void wk_health_beat(wk_health *h) {
    if (!h) return;
    atomic_store(&h->beat_ms, mono_ms());
    atomic_store(&h->beating, 1);
}

void wk_health_set_state(wk_health *h, int state) {
    if (h) atomic_store(&h->state, state);
}

/* Past the deadline with the model still loading: the probes say so, and the
 * process ends (exit 1: a restart may find the volume well), since the load
 * itself may be stuck in a read that never returns. */
static void *watch_load(void *arg) {
    wk_health *h = arg;
    while (atomic_load(&h->state) == WK_H_LOADING) {
        int64_t end = atomic_load(&h->load_end_ms);
        if (end && mono_ms() >= end) {
            atomic_store(&h->state, WK_H_LOAD_TIMEOUT);
            CM_ERR("the model did not load within --load-timeout %.0f s (a stalled volume or download?): exiting",
                   h->load_s);
            fflush(NULL);
            _exit(1);
        }
        usleep(100000);
    }
    return NULL;
}

int wk_health_load_deadline(wk_health *h, double secs, int hold) {
    if (!h || secs <= 0) return 0;
    h->load_s = secs;
    atomic_store(&h->load_end_ms, hold ? 0 : mono_ms() + (int64_t)(secs * 1e3));
    if (h->watching) return 0;
    if (pthread_create(&h->watch, NULL, watch_load, h)) return LLM_ENOMEM;
    h->watching = 1;
    return 0;
}

void wk_health_stop(wk_health *h) {
    if (!h) return;
    if (h->watching) {
        if (atomic_load(&h->state) == WK_H_LOADING) atomic_store(&h->state, WK_H_FAILED); /* ends the watch */
        pthread_join(h->watch, NULL);
    }
    if (h->srv) {
        nng_http_server_stop(h->srv);
        nng_http_server_release(h->srv);
    }
    pthread_mutex_destroy(&h->mu);
    free(h->metrics);
    free(h);
}
