#include "gw_admit.h"
#include "cm_log.h"
#include "cm_time.h"

#include "gw_req.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gw_prep_refuse(gw_prep *p, int status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    p->status = status;
    p->q->param = param;
    p->code = code;
}

int gw_admit_open(gw *g, gw_http_req *r) {
    if (!g->draining) return 1;
    gw_http_header(r->conn, "Connection", "close");
    gw_http_error(r->conn, 503, "the server is shutting down", NULL, "shutting_down");
    return 0;
}

gw_req *gw_admit_new(gw *g, gw_http_req *r, int key, gw_model *m, gw_prep *p) {
    gw_req *q = calloc(1, sizeof *q);
    char *body = malloc(r->body_len + 1);
    if (!q || !p || !body) {
        free(q);
        free(p);
        free(body);
        gw_http_error(r->conn, 500, "out of memory", NULL, "internal_error");
        return NULL;
    }
    memcpy(body, r->body, r->body_len);
    body[r->body_len] = 0;
    p->q = q;
    p->body = body;
    p->len = r->body_len;
    q->g = g;
    q->conn = r->conn;
    q->worker = -1;
    q->key = key;
    q->t_arrive = cm_now();
    q->model = gw_model_ref(m);
    return q;
}

void gw_admit_submit(gw *g, gw_prep *p, void (*gone)(void *)) {
    gw_req *q = p->q;
    if (gw_tokq_submit(g->tokq, &p->job)) {
        free(p->body);
        free(p);
        g->m.overloaded++;
        gw_http_header(q->conn, "Retry-After", "1");
        gw_req_finish(q, 503, "the gateway is at capacity: too many requests waiting to be tokenized", "overloaded");
        return;
    }
    gw_http_on_gone(q->conn, gone, q);
}

gw_req *gw_admit_prepared(gw_prep *p) {
    gw_req *q = p->q;
    gw *g = q->g;
    int status = p->status;
    char err[sizeof p->err];
    snprintf(err, sizeof err, "%s", p->err);
    const char *code = p->code;
    free(p->body);
    free(p);
    if (!q->conn) { /* the client left while its request was prepared */
        gw_req_finish(q, 499, "the client closed the connection", "client_closed");
        return NULL;
    }
    if (status) {
        gw_req_finish(q, status, err, code);
        return NULL;
    }
    if (g->draining) {
        gw_http_header(q->conn, "Connection", "close");
        gw_req_finish(q, 503, "the server is shutting down", "shutting_down");
        return NULL;
    }
    return q;
}

int gw_admit_limits(gw *g, gw_req *q, double need, const char *param, const char *what) {
    if (!gw_limits_fits(&g->lim, need)) {
        char err[300];
        q->param = param;
        snprintf(err, sizeof err, "this request needs %.0f tokens (%s), more than --rate-limit-tpm %.0f allows", need,
                 what, g->conf.tpm);
        gw_req_finish(q, 400, err, "invalid_value");
        return 1;
    }
    double wait = gw_limits_admit(&g->lim, cm_now(), q->key, need);
    if (wait > 0) {
        char ra[32];
        snprintf(ra, sizeof ra, "%d", (int)ceil(wait));
        gw_http_header(q->conn, "Retry-After", ra);
        g->m.rate_limited++;
        gw_req_finish(q, 429, "rate limit reached; retry after the time in Retry-After", "rate_limit_exceeded");
        return 1;
    }
    return 0;
}

/* ---- authentication -------------------------------------------------------- */

static void tail_401(evutil_socket_t fd, short what, void *arg) {
    gw *g = arg;
    (void)fd;
    (void)what;
    if (!g->quiet_401) return;
    CM_WARN("401: %lu more failed API-key checks after the last line", g->quiet_401);
    g->quiet_401 = 0;
    g->logged_401 = cm_now();
}

int gw_admit_authorized(gw *g, gw_http_req *r, int *key) {
    if (gw_auth_check(&g->auth, r->authorization, key)) return 1;
    const char *a = r->authorization;
    size_t tl = strlen(g->internal_token);
    if (tl && a && !strncmp(a, "Bearer ", 7) && strlen(a + 7) == tl && !memcmp(a + 7, g->internal_token, tl)) {
        *key = -1; /* this gateway's own batch jobs */
        return 1;
    }
    double t = cm_now();
    if (t - g->logged_401 >= 1.0) { /* one line a second at most: a key scanner must not flood the warnings */
        CM_WARN("401: %s API key from %s on %s (%lu more since the last line)", r->authorization ? "wrong" : "no", r->peer,
                r->path, g->quiet_401);
        g->logged_401 = t;
        g->quiet_401 = 0;
    } else if (g->quiet_401++ == 0) { /* the first held back: its burst's count goes out once the second is over */
        if (!g->tail_401) g->tail_401 = evtimer_new(g->base, tail_401, g);
        struct timeval tv = {1, 100000};
        if (g->tail_401) evtimer_add(g->tail_401, &tv);
    }
    if (g->conf.log_requests) /* the access log has every request, refused ones too */
        CM_INFO("request - key=- worker=-1 in=0 out=0 cached=0 ttft=-1.0ms total=0.0ms status=401 code=invalid_api_key "
                "peer=%s path=%.128s", r->peer, r->path);
    gw_http_error(r->conn, 401, "missing or invalid API key (Authorization: Bearer KEY)", NULL, "invalid_api_key");
    return 0;
}
