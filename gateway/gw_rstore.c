#include "gw_rstore.h"
#include "cm_error.h"
#include "cm_idmap.h"
#include "cm_log.h"
#include "cm_time.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#ifdef LLMSERVE_HIREDIS
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#endif

/* An entry of the memory kind, on the FIFO of insertion (oldest first: with one TTL, also the first to expire). */
typedef struct ent {
    struct ent *prev, *next;
    uint64_t h;
    char *key, *val;
    size_t len;
    double expires;
} ent;

/* One operation until its callback is called and (Redis) its reply has come. */
typedef struct op {
    struct op *prev, *next;       /* s->ops */
    gw_rstore *s;
    gw_rstore_cb cb;
    void *arg;
    int rc, called, redis_pending;
    char *val;
    size_t len;
    struct event *timer;
} op;

struct gw_rstore {
    struct event_base *base;
    int redis;
    double ttl, timeout;
    int max_entries;
    size_t max_bytes;
    /* memory */
    cm_idmap map;                 /* XXH3 of the key -> ent */
    ent *head, *tail;
    int n;
    size_t bytes;
    /* redis */
    char host[256], password[256];
    int port, db;
#ifdef LLMSERVE_HIREDIS
    redisAsyncContext *ac;
#endif
    /* operations */
    op *ops;
    op *ready;                    /* finished without Redis (memory, or failed to start): called from ready_ev */
    struct event *ready_ev;
    gw_rstore_stats st;
};

static void op_unlink(op *o) {
    gw_rstore *s = o->s;
    if (o->prev) o->prev->next = o->next;
    else if (s->ops == o) s->ops = o->next;
    if (o->next) o->next->prev = o->prev;
    o->prev = o->next = NULL;
}

static void op_free(op *o) {
    if (o->timer) event_free(o->timer);
    free(o->val);
    free(o);
}

/* Calls the callback once; frees the op when nothing more will come for it. */
static void finish(op *o, int rc, const char *val, size_t len) {
    if (!o->called) {
        o->called = 1;
        if (o->timer) evtimer_del(o->timer);
        if (rc && rc != LLM_ENOTFOUND) o->s->st.errors++;
        o->cb(o->arg, rc, val, len);
    }
    if (!o->redis_pending) {
        op_unlink(o);
        op_free(o);
    }
}

static op *op_new(gw_rstore *s, gw_rstore_cb cb, void *arg) {
    op *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->s = s;
    o->cb = cb;
    o->arg = arg;
    o->next = s->ops;
    if (s->ops) s->ops->prev = o;
    s->ops = o;
    return o;
}

/* Done now: its callback comes from the loop, after the caller's call returns. */
static void later(gw_rstore *s, op *o, int rc, const char *val, size_t len) {
    o->rc = rc;
    if (val && !(o->val = malloc(len + 1))) o->rc = LLM_ENOMEM;
    if (o->val) {
        memcpy(o->val, val, len);
        o->val[len] = 0;
        o->len = len;
    }
    op_unlink(o);
    o->next = s->ready;
    s->ready = o;
    struct timeval zero = {0, 0};
    evtimer_add(s->ready_ev, &zero);
}

static void on_ready(evutil_socket_t fd, short what, void *arg) {
    gw_rstore *s = arg;
    (void)fd, (void)what;
    while (s->ready) {
        op *o = s->ready;
        s->ready = o->next;
        o->next = NULL;
        o->called = 1;
        if (o->rc && o->rc != LLM_ENOTFOUND) s->st.errors++;
        o->cb(o->arg, o->rc, o->val, o->len);
        op_free(o);
    }
}

/* ---- memory ------------------------------------------------------------------ */

static uint64_t hkey(const char *k) { return XXH3_64bits(k, strlen(k)); }

static void ent_drop(gw_rstore *s, ent *e) {
    cm_idmap_del(&s->map, e->h);
    if (e->prev) e->prev->next = e->next;
    else s->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else s->tail = e->prev;
    s->n--;
    s->bytes -= e->len + strlen(e->key);
    free(e->key);
    free(e->val);
    free(e);
}

static void mem_trim(gw_rstore *s, size_t extra) {
    double t = cm_now();
    while (s->head && (s->head->expires <= t || s->n + 1 > s->max_entries || s->bytes + extra > s->max_bytes)) {
        if (s->head->expires > t) s->st.evicted++;
        ent_drop(s, s->head);
    }
}

static ent *mem_find(gw_rstore *s, const char *key) {
    ent *e = cm_idmap_get(&s->map, hkey(key));
    if (!e || strcmp(e->key, key)) return NULL;
    if (e->expires <= cm_now()) {
        ent_drop(s, e);
        return NULL;
    }
    return e;
}

static int mem_put(gw_rstore *s, const char *key, const char *val, size_t len) {
    size_t need = len + strlen(key);
    if (need > s->max_bytes) return LLM_ERANGE;
    ent *old = cm_idmap_get(&s->map, hkey(key));
    if (old) ent_drop(s, old); /* the same key again, or (once in 2^64) another of the same hash */
    mem_trim(s, need);
    ent *e = calloc(1, sizeof *e);
    if (e) {
        e->key = strdup(key);
        e->val = malloc(len + 1);
    }
    if (!e || !e->key || !e->val || cm_idmap_put(&s->map, hkey(key), e)) {
        if (e) free(e->key), free(e->val);
        free(e);
        return LLM_ENOMEM;
    }
    memcpy(e->val, val, len);
    e->val[len] = 0;
    e->len = len;
    e->h = hkey(key);
    e->expires = cm_now() + s->ttl;
    e->prev = s->tail;
    if (s->tail) s->tail->next = e;
    else s->head = e;
    s->tail = e;
    s->n++;
    s->bytes += need;
    return 0;
}

/* ---- redis --------------------------------------------------------------------- */

#ifdef LLMSERVE_HIREDIS
static void on_connect(const redisAsyncContext *ac, int status) {
    gw_rstore *s = ac->data;
    if (status != REDIS_OK) {
        CM_WARN("response store: cannot reach redis at %s:%d: %s", s->host, s->port, ac->errstr);
        if (s->ac == ac) s->ac = NULL; /* hiredis frees it */
    }
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
    gw_rstore *s = ac->data;
    if (status != REDIS_OK) CM_WARN("response store: redis at %s:%d lost: %s", s->host, s->port, ac->errstr);
    if (s->ac == ac) s->ac = NULL;
}

static redisAsyncContext *conn(gw_rstore *s) {
    if (s->ac) return s->ac;
    redisAsyncContext *ac = redisAsyncConnect(s->host, s->port);
    if (!ac) return NULL;
    if (ac->err) {
        CM_WARN("response store: redis at %s:%d: %s", s->host, s->port, ac->errstr);
        redisAsyncFree(ac);
        return NULL;
    }
    ac->data = s;
    if (redisLibeventAttach(ac, s->base) != REDIS_OK) {
        redisAsyncFree(ac);
        return NULL;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    s->ac = ac;
    /* queued ahead of every command; a refusal shows in the first command's own reply (NOAUTH) */
    if (s->password[0]) redisAsyncCommand(ac, NULL, NULL, "AUTH %s", s->password);
    if (s->db) redisAsyncCommand(ac, NULL, NULL, "SELECT %d", s->db);
    return ac;
}

static void on_reply(redisAsyncContext *ac, void *r, void *arg) {
    op *o = arg;
    redisReply *rep = r;
    (void)ac;
    o->redis_pending = 0;
    if (!rep) finish(o, LLM_EIO, NULL, 0);
    else if (rep->type == REDIS_REPLY_ERROR) {
        CM_WARN("response store: redis refused: %s", rep->str);
        finish(o, LLM_EIO, NULL, 0);
    } else if (rep->type == REDIS_REPLY_NIL || (rep->type == REDIS_REPLY_INTEGER && rep->integer == 0)) {
        finish(o, LLM_ENOTFOUND, NULL, 0);
    } else {
        finish(o, 0, rep->type == REDIS_REPLY_STRING ? rep->str : NULL, rep->type == REDIS_REPLY_STRING ? rep->len : 0);
    }
}

static void on_timeout(evutil_socket_t fd, short what, void *arg) {
    op *o = arg;
    (void)fd, (void)what;
    CM_WARN("response store: redis at %s:%d did not answer within %.1f s", o->s->host, o->s->port, o->s->timeout);
    finish(o, LLM_ETIMEDOUT, NULL, 0); /* kept until the reply (or the connection's loss) comes */
}

/* argv: the command's words (binary-safe) */
static void redis_run(gw_rstore *s, op *o, int argc, const char **argv, const size_t *lens) {
    redisAsyncContext *ac = conn(s);
    if (!ac) {
        later(s, o, LLM_EIO, NULL, 0);
        return;
    }
    o->timer = evtimer_new(s->base, on_timeout, o);
    o->redis_pending = 1;
    if (redisAsyncCommandArgv(ac, on_reply, o, argc, argv, lens) != REDIS_OK) {
        o->redis_pending = 0;
        later(s, o, LLM_EIO, NULL, 0);
        return;
    }
    struct timeval tv = {(time_t)s->timeout, (suseconds_t)((s->timeout - (time_t)s->timeout) * 1e6)};
    if (o->timer) evtimer_add(o->timer, &tv);
}
#endif

/* ---- the interface ---------------------------------------------------------------- */

static int parse_url(gw_rstore *s, const char *url, char *err, size_t errlen) {
    const char *p = url + 8, *at = strchr(p, '@'), *slash;
    s->port = 6379;
    if (at) { /* [user]:password@ (a user name, Redis 6's ACL, is not sent: AUTH with the password alone) */
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon || (size_t)(at - colon - 1) >= sizeof s->password) {
            snprintf(err, errlen, "--response-store: redis://[:PASSWORD@]HOST[:PORT][/DB], not '%s'", url);
            return LLM_EINVAL;
        }
        memcpy(s->password, colon + 1, (size_t)(at - colon - 1));
        p = at + 1;
    }
    slash = strchr(p, '/');
    size_t hl = slash ? (size_t)(slash - p) : strlen(p);
    const char *colon = memchr(p, ':', hl);
    size_t nl = colon ? (size_t)(colon - p) : hl;
    if (!nl || nl >= sizeof s->host) {
        snprintf(err, errlen, "--response-store: no host in '%s'", url);
        return LLM_EINVAL;
    }
    memcpy(s->host, p, nl);
    char *end;
    if (colon) {
        long port = strtol(colon + 1, &end, 10);
        if (end != p + hl || port < 1 || port > 65535) {
            snprintf(err, errlen, "--response-store: bad port in '%s'", url);
            return LLM_EINVAL;
        }
        s->port = (int)port;
    }
    if (slash && slash[1]) {
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 1000000) {
            snprintf(err, errlen, "--response-store: bad database number in '%s'", url);
            return LLM_EINVAL;
        }
        s->db = (int)db;
    }
    return 0;
}

int gw_rstore_open(struct event_base *base, const char *url, double ttl, int max_entries, size_t max_bytes,
                   double timeout, gw_rstore **out, char *err, size_t errlen) {
    *out = NULL;
    gw_rstore *s = calloc(1, sizeof *s);
    if (!s) return LLM_ENOMEM;
    s->base = base;
    s->ttl = ttl;
    s->timeout = timeout;
    s->max_entries = max_entries;
    s->max_bytes = max_bytes;
    if (url && *url && strcmp(url, "memory")) {
        if (strncmp(url, "redis://", 8)) {
            snprintf(err, errlen, "--response-store: 'memory' or redis://[:PASSWORD@]HOST[:PORT][/DB], not '%s'", url);
            free(s);
            return LLM_EINVAL;
        }
#ifndef LLMSERVE_HIREDIS
        snprintf(err, errlen, "--response-store redis://: this gateway was built without hiredis (apt-get install "
                 "libhiredis-dev, then build again)");
        free(s);
        return LLM_EUNSUP;
#else
        int rc = parse_url(s, url, err, errlen);
        if (rc) {
            free(s);
            return rc;
        }
        s->redis = 1;
#endif
    }
    (void)parse_url;
    if (!(s->ready_ev = evtimer_new(base, on_ready, s))) {
        free(s);
        return LLM_ENOMEM;
    }
    *out = s;
    return 0;
}

const char *gw_rstore_kind(const gw_rstore *s) { return s->redis ? "redis" : "memory"; }

static char *rkey(const char *key, size_t *len) {
    size_t n = strlen(key) + 16;
    char *k = malloc(n);
    if (k) *len = (size_t)snprintf(k, n, "llmserve:resp:%s", key);
    return k;
}

static void redis_op(gw_rstore *s, op *o, const char *cmd, const char *key, const char *val, size_t len) {
#ifdef LLMSERVE_HIREDIS
    size_t kl = 0;
    char *k = rkey(key, &kl), ttl[32];
    if (!k) {
        later(s, o, LLM_ENOMEM, NULL, 0);
        return;
    }
    int tl = snprintf(ttl, sizeof ttl, "%lld", (long long)(s->ttl < 1 ? 1 : s->ttl));
    const char *argv[] = {cmd, k, val, "EX", ttl};
    size_t lens[] = {strlen(cmd), kl, len, 2, (size_t)tl};
    redis_run(s, o, val ? 5 : 2, argv, lens);
    free(k);
#else
    (void)cmd, (void)key, (void)val, (void)len, (void)rkey;
    later(s, o, LLM_EUNSUP, NULL, 0);
#endif
}

void gw_rstore_put(gw_rstore *s, const char *key, const char *val, size_t len, gw_rstore_cb cb, void *arg) {
    op *o = op_new(s, cb, arg);
    if (!o) return cb(arg, LLM_ENOMEM, NULL, 0); /* (the one case called inside: no memory for the op itself) */
    s->st.puts++;
    if (s->redis) redis_op(s, o, "SET", key, val, len);
    else later(s, o, mem_put(s, key, val, len), NULL, 0);
}

void gw_rstore_get(gw_rstore *s, const char *key, gw_rstore_cb cb, void *arg) {
    op *o = op_new(s, cb, arg);
    if (!o) return cb(arg, LLM_ENOMEM, NULL, 0);
    s->st.gets++;
    if (s->redis) {
        redis_op(s, o, "GET", key, NULL, 0);
        return;
    }
    ent *e = mem_find(s, key);
    if (e) s->st.hits++;
    later(s, o, e ? 0 : LLM_ENOTFOUND, e ? e->val : NULL, e ? e->len : 0);
}

void gw_rstore_del(gw_rstore *s, const char *key, gw_rstore_cb cb, void *arg) {
    op *o = op_new(s, cb, arg);
    if (!o) return cb(arg, LLM_ENOMEM, NULL, 0);
    s->st.deletes++;
    if (s->redis) {
        redis_op(s, o, "DEL", key, NULL, 0);
        return;
    }
    ent *e = mem_find(s, key);
    if (e) ent_drop(s, e);
    later(s, o, e ? 0 : LLM_ENOTFOUND, NULL, 0);
}

void gw_rstore_stats_get(const gw_rstore *s, gw_rstore_stats *st) {
    *st = s->st;
    st->entries = s->n;
    st->bytes = s->bytes;
}

void gw_rstore_free(gw_rstore *s) {
    if (!s) return;
    on_ready(-1, 0, s);
#ifdef LLMSERVE_HIREDIS
    if (s->ac) { /* calls every pending reply callback with NULL: they finish with LLM_EIO */
        redisAsyncContext *ac = s->ac;
        s->ac = NULL;
        redisAsyncFree(ac);
    }
#endif
    while (s->ops) { /* timed out and still waiting on a reply that will not come now */
        op *o = s->ops;
        o->redis_pending = 0;
        finish(o, LLM_EIO, NULL, 0);
    }
    while (s->head) ent_drop(s, s->head);
    cm_idmap_free(&s->map);
    event_free(s->ready_ev);
    free(s);
}
