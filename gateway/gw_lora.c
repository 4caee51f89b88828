/* gw_lora.c - run-time LoRA adapter updates; see gw_lora.h. */
#include "gw_lora.h"

#include "cm_error.h"
#include "cm_log.h"
#include "gw_pool.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LORA_UPDATE_TIMEOUT_S 300 /* a large adapter read from a slow volume, on every rank */

typedef struct gw_lora_op {
    struct gw_lora_op *next;
    gw *g;
    gw_conn *conn;               /* NULL once the client left (the update still completes) */
    uint64_t id;
    int unload, waiting, n_sent, n_ok, n_notfound;
    char name[64];
    unsigned char want[GW_MAX_WORKERS]; /* groups whose answer is awaited */
    char errs[1024];
    struct event *timer;
} gw_lora_op;

static void op_free(gw_lora_op *op) {
    for (gw_lora_op **p = &op->g->lora_ops; *p; p = &(*p)->next)
        if (*p == op) {
            *p = op->next;
            break;
        }
    if (op->timer) event_free(op->timer);
    if (op->conn) gw_http_on_gone(op->conn, NULL, NULL);
    free(op);
}

static void note(gw_lora_op *op, const gw_worker *w, const char *msg) {
    size_t l = strlen(op->errs);
    snprintf(op->errs + l, sizeof op->errs - l, "%sgroup %s: %s", l ? "; " : "", w->addr, msg);
}

/* Every group answered (or the time ran out): the client's one answer. */
static void answer(gw_lora_op *op, int timed_out) {
    gw_conn *c = op->conn;
    const char *verb = op->unload ? "unload" : "load";
    if (c) {
        char msg[1400];
        if (!timed_out && op->n_ok == op->n_sent) {
            int n = snprintf(msg, sizeof msg, "Success: LoRA adapter '%s' %s successfully.", op->name,
                             op->unload ? "removed" : "added");
            gw_http_body(c, 200, "text/plain; charset=utf-8", msg, (size_t)n);
        } else if (timed_out) {
            snprintf(msg, sizeof msg, "LoRA adapter '%s': %d of %d worker groups did not answer the %s within %d s%s%s",
                     op->name, op->waiting, op->n_sent, verb, LORA_UPDATE_TIMEOUT_S, op->errs[0] ? "; " : "", op->errs);
            gw_http_error(c, 504, msg, NULL, "timeout");
        } else if (op->n_notfound == op->n_sent) {
            snprintf(msg, sizeof msg, "The lora adapter '%s' cannot be found.", op->name);
            gw_http_error(c, 404, msg, "lora_name", "not_found");
        } else {
            snprintf(msg, sizeof msg, "LoRA adapter '%s': the %s failed on %d of %d worker groups (%s)", op->name, verb,
                     op->n_sent - op->n_ok, op->n_sent, op->errs);
            gw_http_error(c, 400, msg, op->unload ? "lora_name" : "lora_path", "invalid_value");
        }
    }
    CM_INFO("LoRA adapter %s: %s on %d of %d worker groups%s%s", op->name, verb, op->n_ok, op->n_sent,
            op->errs[0] ? ": " : "", op->errs);
    op->conn = NULL;
    op_free(op);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    answer(arg, 1);
}

static void on_gone(void *arg) { ((gw_lora_op *)arg)->conn = NULL; }

#define REFUSE(st, prm, ...)                                                                        \
    do {                                                                                            \
        char m_[512];                                                                               \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                       \
        gw_http_error(r->conn, (st), m_, (prm), (st) == 503 ? "unavailable" : "invalid_value");     \
        json_decref(o);                                                                             \
        return;                                                                                     \
    } while (0)

void gw_lora_handle(gw *g, gw_http_req *r, int unload) {
    json_error_t je;
    json_t *o = json_loadb(r->body ? r->body : "", r->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) REFUSE(400, NULL, "the body must be a JSON object: %s", o ? "not an object" : je.text);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (!strcmp(k, "lora_name") || (!unload && !strcmp(k, "lora_path"))) continue;
        if (!strcmp(k, "load_inplace") && json_is_false(v)) continue;
        if (!strcmp(k, "lora_int_id") && unload) continue; /* vLLM's client may send it; names are the key here */
        REFUSE(400, k, "'%s' is not supported by %s (this server takes lora_name%s)", k, r->path,
               unload ? "" : " and lora_path");
    }
    json_t *jn = json_object_get(o, "lora_name"), *jp = json_object_get(o, "lora_path");
    const char *name = json_string_value(jn), *path = json_string_value(jp);
    if (!name || !name[0] || strlen(name) > 63 || strpbrk(name, "\n=,"))
        REFUSE(400, "lora_name", "lora_name must be a string of 1 to 63 characters without newline, '=' or ','");
    if (!unload && (!path || !path[0] || strlen(path) > 900))
        REFUSE(400, "lora_path", "lora_path must be the adapter's directory on the workers (up to 900 characters)");
    if (!strcmp(name, g->served) || !strcmp(name, g->eserved))
        REFUSE(400, "lora_name", "lora_name '%s' is the name of a served model", name);
    gw_lora_op *op = calloc(1, sizeof *op);
    if (!op) REFUSE(503, NULL, "out of memory");
    op->g = g;
    op->id = ++g->lora_op_seq;
    op->unload = unload;
    snprintf(op->name, sizeof op->name, "%s", name);
    op->next = g->lora_ops;
    g->lora_ops = op;
    for (int i = 0; i < g->n_workers; i++) {
        if (!gw_pool_routable(g, i)) continue;
        char tag[16];
        snprintf(tag, sizeof tag, "w%d", i);
        Llmserve__LoraUpdate u = LLMSERVE__LORA_UPDATE__INIT;
        u.gateway_id = g->id;
        u.id = op->id;
        u.name = (char *)name;
        u.path = unload ? NULL : (char *)path;
        u.has_unload = u.unload = unload;
        u.worker_tag = tag;
        pr_env e;
        pr_env_init(&e);
        e.body_case = LLMSERVE__ENVELOPE__BODY_LORA_UPDATE;
        e.lora_update = &u;
        op->n_sent++;
        int rc = gw_pool_send(g, i, &e);
        if (rc) note(op, &g->w[i], cm_strerror(rc));
        else op->want[i] = 1, op->waiting++;
    }
    json_decref(o);
    o = NULL;
    if (!op->n_sent) {
        op_free(op);
        REFUSE(503, NULL, "no worker group is up to %s LoRA adapter '%s'", unload ? "unload" : "load", name);
    }
    op->conn = r->conn;
    gw_http_on_gone(op->conn, on_gone, op);
    if (!op->waiting) {
        answer(op, 0);
        return;
    }
    struct timeval tv = {LORA_UPDATE_TIMEOUT_S, 0};
    if (!(op->timer = evtimer_new(g->base, on_timeout, op)) || evtimer_add(op->timer, &tv)) {
        answer(op, 1);
        return;
    }
}

void gw_lora_on_result(gw *g, int i, const Llmserve__LoraUpdateResult *r) {
    gw_lora_op *op = g->lora_ops;
    while (op && op->id != r->id) op = op->next;
    if (!op || i < 0 || i >= g->n_workers || !op->want[i]) return; /* late, or not ours */
    op->want[i] = 0;
    op->waiting--;
    if (!r->has_error_code || !r->error_code) op->n_ok++;
    else {
        op->n_notfound += r->error_code == LLM_ENOTFOUND;
        note(op, &g->w[i], r->error ? r->error : cm_strerror(r->error_code));
    }
    if (!op->waiting) answer(op, 0);
}

void gw_lora_fail_all(gw *g) {
    while (g->lora_ops) {
        gw_lora_op *op = g->lora_ops;
        if (op->conn) gw_http_error(op->conn, 503, "the gateway is shutting down", NULL, "shutting_down");
        op->conn = NULL;
        op_free(op);
    }
}
