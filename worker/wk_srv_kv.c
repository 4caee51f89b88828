/* wk_srv_kv.c - disaggregated prefill and decode, worker to worker.
 *
 * The prefill side: a Generate with kv_push_address and kv_transfer_id is
 * tracked; after every step the prompt's blocks committed since the last
 * look go to that address (a decode group's PULL socket) as KvTransfer
 * messages of up to KV_MSG_BYTES, so the transfer overlaps the prefill of
 * the later chunks; when the request ends, a last message says how many
 * were sent. All of it before the step's TokenChunks leave, so the transfer
 * is on its way when the gateway hears the first token.
 *
 * The decode side: each block is checked (the sender's model fingerprint,
 * the block's key against its parent, salt and tokens, its size) and adopted
 * into the memory tier (wk_engine_kv_import), where the prefix match finds
 * it. A Generate that names a transfer (the same request moved here after
 * its first token) is held in the receive queue until that transfer's last
 * message, for up to KV_WAIT_MS: past that it runs, and computes what did
 * not come. */
#include "wk_srv.h"

#include "cm_error.h"
#include "cm_log.h"

#include <jansson.h>
#include <nng/protocol/pipeline0/push.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KV_MAX_DEST 16
#define KV_RECENT 1024
#define KV_MSG_BYTES (8u << 20)
#define KV_GIVEUP_MS 30000 /* a transfer its destination does not take for this long is dropped */

typedef struct xout {
    struct xout *next;
    uint64_t eid, id, salt;
    int dest;
    int32_t *tok;
    int n, cap, sent, ended;
    int64_t t0;
} xout;

typedef struct {
    char addr[256];
    nng_socket push;
    int used;
    int64_t last_used;
} kdest;

typedef struct {
    uint64_t id;
    int done;
    uint32_t blocks;
} xin;

struct wk_srv_kv {
    xout *out;
    kdest dest[KV_MAX_DEST];
    xin in[KV_RECENT];
    int in_at;
    wk_kv_block *blk;
    uint8_t *pay;
    int cap;                     /* blocks blk and pay have room for */
    int64_t refused_logged;
};

const double wk_kv_bucket_ms[WK_KV_BUCKETS - 1] = {1, 5, 10, 25, 50, 100, 250};

static uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int wk_kv_transfer_config_parse(const char *text, int *role, size_t *buffer, char *err, size_t errlen) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    int rc = LLM_EINVAL;
    if (!json_is_object(j)) {
        snprintf(err, errlen, "--kv-transfer-config expects a JSON object such as '{\"kv_role\": \"kv_producer\"}'");
        goto out;
    }
    const char *k;
    json_t *v;
    *role = WK_KV_BOTH;
    json_object_foreach(j, k, v) {
        if (!strcmp(k, "kv_role")) {
            const char *r = json_string_value(v);
            if (r && !strcmp(r, "kv_producer")) *role = WK_KV_PRODUCER;
            else if (r && !strcmp(r, "kv_consumer")) *role = WK_KV_CONSUMER;
            else if (r && !strcmp(r, "kv_both")) *role = WK_KV_BOTH;
            else {
                snprintf(err, errlen, "--kv-transfer-config: kv_role is kv_producer, kv_consumer or kv_both");
                goto out;
            }
        } else if (!strcmp(k, "kv_buffer_size")) {
            double b = json_number_value(v);
            if (!json_is_number(v) || b < 1048576 || b > 1e15) {
                snprintf(err, errlen, "--kv-transfer-config: kv_buffer_size is bytes (at least 1 MiB)");
                goto out;
            }
            *buffer = (size_t)b;
        } else {
            snprintf(err, errlen, "--kv-transfer-config: \"%.64s\" is not supported (kv_role and kv_buffer_size are)", k);
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(j);
    return rc;
}

const char *wk_kv_role_name(int role) {
    return role == WK_KV_PRODUCER ? "kv_producer" : role == WK_KV_CONSUMER ? "kv_consumer" : "kv_both";
}

int wk_srv_kv_start(server *s) {
    if (!s->e) return 0;
    s->kv = calloc(1, sizeof *s->kv);
    return s->kv ? 0 : LLM_ENOMEM;
}

static void xout_free(xout *x) {
    free(x->tok);
    free(x);
}

void wk_srv_kv_stop(server *s) {
    if (!s->kv) return;
    for (xout *x = s->kv->out, *nx; x; x = nx) {
        nx = x->next;
        xout_free(x);
    }
    for (int i = 0; i < KV_MAX_DEST; i++)
        if (s->kv->dest[i].used) nng_close(s->kv->dest[i].push);
    free(s->kv->blk);
    free(s->kv->pay);
    free(s->kv);
    s->kv = NULL;
}

int wk_srv_kv_check_address(const char *a, char *err, size_t errlen) {
    size_t n = strlen(a);
    if (n >= sizeof((kdest *)0)->addr || (strncmp(a, "tcp://", 6) && strncmp(a, "ipc://", 6))) {
        snprintf(err, errlen, "kv_push_address must be a tcp:// or ipc:// address of under 256 bytes");
        return LLM_EINVAL;
    }
    return 0;
}

/* A push socket to addr, dialed once and kept (the least recently used one closed for a 17th). */
static int dest_for(server *s, const char *addr) {
    struct wk_srv_kv *k = s->kv;
    int old = 0;
    for (int i = 0; i < KV_MAX_DEST; i++) {
        if (k->dest[i].used && !strcmp(k->dest[i].addr, addr)) {
            k->dest[i].last_used = now_ms();
            return i;
        }
        if (!k->dest[i].used || (k->dest[old].used && k->dest[i].last_used < k->dest[old].last_used)) old = i;
    }
    kdest *d = &k->dest[old];
    if (d->used) {
        for (xout *x = k->out; x; x = x->next)
            if (x->dest == old) x->dest = -1; /* its transfers are dropped at the next push */
        nng_close(d->push);
        d->used = 0;
    }
    int rv = nng_push0_open(&d->push);
    if (!rv) rv = nng_socket_set_int(d->push, NNG_OPT_SENDBUF, 64);
    if (!rv) rv = nng_socket_set_ms(d->push, NNG_OPT_RECONNMINT, 50);
    if (!rv) rv = nng_socket_set_ms(d->push, NNG_OPT_RECONNMAXT, 1000);
    if (!rv) rv = nng_dial(d->push, addr, NULL, NNG_FLAG_NONBLOCK);
    if (rv) {
        CM_WARN("KV transfer: cannot dial %s: %s", addr, nng_strerror(rv));
        if (d->push.id) nng_close(d->push);
        return -1;
    }
    snprintf(d->addr, sizeof d->addr, "%s", addr);
    d->used = 1;
    d->last_used = now_ms();
    return old;
}

int wk_srv_kv_track(server *s, const slot *sl, const Llmserve__Generate *g, const int32_t *tok, int n, uint64_t salt) {
    if (!s->kv) return LLM_EUNSUP;
    xout *x = calloc(1, sizeof *x);
    if (!x || !(x->tok = malloc(sizeof *x->tok * (size_t)(n ? n : 1)))) {
        free(x);
        return LLM_ENOMEM;
    }
    memcpy(x->tok, tok, sizeof *tok * (size_t)n);
    x->n = x->cap = n;
    x->eid = sl->eid;
    x->id = g->kv_transfer_id;
    x->salt = salt;
    x->t0 = now_ms();
    x->dest = dest_for(s, g->kv_push_address);
    x->next = s->kv->out;
    s->kv->out = x;
    return 0;
}

static int room(struct wk_srv_kv *k, int blocks, size_t bb) {
    if (blocks <= k->cap) return 0;
    wk_kv_block *b = realloc(k->blk, sizeof *b * (size_t)blocks);
    if (!b) return LLM_ENOMEM;
    k->blk = b;
    uint8_t *p = realloc(k->pay, bb * (size_t)blocks);
    if (!p) return LLM_ENOMEM;
    k->pay = p;
    k->cap = blocks;
    return 0;
}

/* One message of x's next blocks (or its last): 1 sent with more to come, 0 done for this turn, -1 the
 * transfer is over (ended and all sent, or dropped). */
static int push_one(server *s, xout *x) {
    struct wk_srv_kv *k = s->kv;
    wk_srv_kv_stats *st = &s->kvst;
    if (x->dest < 0) {
        st->send_failed++;
        return -1;
    }
    size_t bb = wk_engine_kv_block_bytes(s->e);
    int per = (int)(KV_MSG_BYTES / bb);
    if (per < 1) per = 1;
    if (room(k, per, bb)) return 0;
    int got = wk_engine_kv_export(s->e, x->salt, x->tok, x->n, x->sent, per, k->blk, k->pay);
    if (got < 0) {
        st->send_failed++;
        return -1;
    }
    if (!got && !x->ended) return 0;
    Llmserve__KvBlock *b = got ? calloc((size_t)got, sizeof *b) : NULL;
    Llmserve__KvBlock **bp = got ? calloc((size_t)got, sizeof *bp) : NULL;
    if (got && (!b || !bp)) {
        free(b);
        free(bp);
        return 0;
    }
    int bs = s->block_size;
    for (int i = 0; i < got; i++) {
        llmserve__kv_block__init(&b[i]);
        b[i].key = k->blk[i].key;
        b[i].has_parent = b[i].has_salt = b[i].has_payload = 1;
        b[i].parent = k->blk[i].parent;
        b[i].salt = x->salt;
        b[i].n_token_ids = (size_t)bs;
        b[i].token_ids = (int32_t *)k->blk[i].tok;
        b[i].payload.data = k->pay + (size_t)i * bb;
        b[i].payload.len = bb;
        bp[i] = &b[i];
    }
    Llmserve__KvTransfer t = LLMSERVE__KV_TRANSFER__INIT;
    t.transfer_id = x->id;
    t.has_fingerprint = t.has_sent_unix_ns = 1;
    t.fingerprint = wk_engine_kv_fingerprint(s->e);
    t.sent_unix_ns = wall_ns();
    t.n_blocks = (size_t)got;
    t.blocks = bp;
    int last = x->ended && got < per; /* nothing more can come: the chain stops here */
    if (last) {
        t.has_last = t.has_block_count = 1;
        t.last = 1;
        t.block_count = (uint32_t)(x->sent + got);
    }
    pr_env env;
    pr_env_init(&env);
    env.body_case = LLMSERVE__ENVELOPE__BODY_KV_TRANSFER;
    env.kv_transfer = &t;
    int rc = pr_send(k->dest[x->dest].push, &env, NNG_FLAG_NONBLOCK);
    free(b);
    free(bp);
    if (rc == LLM_EAGAIN) return 0; /* its queue is full: again after the next step */
    if (rc) {
        st->send_failed++;
        CM_WARN("KV transfer %016llx to %s: %s", (unsigned long long)x->id, k->dest[x->dest].addr, cm_strerror(rc));
        return -1;
    }
    x->sent += got;
    st->sent_blocks += (uint64_t)got;
    st->sent_bytes += (uint64_t)got * bb;
    if (last) {
        st->sent_done++;
        return -1;
    }
    return got == per ? 1 : 0;
}

/* The tokens a request made go on its chain: the blocks they fill are sent too (a request the gateway lets its
 * prefill group decode, then moves to its decode group, takes all its KV along). */
static void follow(xout *x, const wk_output *o) {
    if (o->index || o->n_tokens <= 0 || x->cap < 0) return;
    if (x->n + o->n_tokens > x->cap) {
        int cap = x->cap * 2 > x->n + o->n_tokens ? x->cap * 2 : x->n + o->n_tokens;
        int32_t *t = realloc(x->tok, sizeof *t * (size_t)cap);
        if (!t) { /* the chain stops where it is: the rest is computed there */
            x->cap = -1;
            return;
        }
        x->tok = t;
        x->cap = cap;
    }
    memcpy(x->tok + x->n, o->tokens, sizeof *x->tok * (size_t)o->n_tokens);
    x->n += o->n_tokens;
}

void wk_srv_kv_push(server *s, const wk_output *o, int n) {
    if (!s->kv || !s->kv->out) return;
    for (int i = 0; i < n; i++)
        for (xout *x = s->kv->out; x; x = x->next)
            if (x->eid == o[i].id) {
                follow(x, &o[i]);
                if (o[i].last) x->ended = 1;
            }
    for (xout **p = &s->kv->out; *p;) {
        xout *x = *p;
        int r;
        while ((r = push_one(s, x)) == 1) {
        }
        if (r == 0 && now_ms() - x->t0 > KV_GIVEUP_MS) { /* its destination does not take it */
            s->kvst.send_failed++;
            CM_WARN("KV transfer %016llx dropped: not taken within %d s", (unsigned long long)x->id, KV_GIVEUP_MS / 1000);
            r = -1;
        }
        if (r < 0) {
            *p = x->next;
            xout_free(x);
        } else {
            p = &x->next;
        }
    }
}

static xin *find_in(struct wk_srv_kv *k, uint64_t id, int make) {
    for (int i = 0; i < KV_RECENT; i++)
        if (k->in[i].id == id) return &k->in[i];
    if (!make) return NULL;
    xin *r = &k->in[k->in_at];
    k->in_at = (k->in_at + 1) % KV_RECENT;
    *r = (xin){.id = id};
    return r;
}

static void refuse(server *s, const char *why, uint64_t id) {
    s->kvst.refused++;
    int64_t t = now_ms();
    if (t - s->kv->refused_logged >= 10000) {
        CM_WARN("KV transfer %016llx: %s (blocks refused: %llu in all)", (unsigned long long)id, why,
                (unsigned long long)s->kvst.refused);
        s->kv->refused_logged = t;
    }
}

void wk_srv_kv_on_transfer(server *s, const Llmserve__KvTransfer *t) {
    if (!s->kv || !t->transfer_id) {
        s->dropped++;
        return;
    }
    if (!t->has_fingerprint || t->fingerprint != wk_engine_kv_fingerprint(s->e)) {
        s->kvst.refused += t->n_blocks;
        refuse(s, "another model or KV layout sent it", t->transfer_id);
        return;
    }
    xin *r = find_in(s->kv, t->transfer_id, 1);
    size_t bb = wk_engine_kv_block_bytes(s->e);
    for (size_t i = 0; i < t->n_blocks; i++) {
        const Llmserve__KvBlock *b = t->blocks[i];
        if (b->n_token_ids != (size_t)s->block_size || !b->has_payload || b->payload.len != bb) {
            refuse(s, "a block of the wrong size", t->transfer_id);
            continue;
        }
        wk_kv_block kb = {b->key, b->has_parent ? b->parent : 0, b->token_ids};
        int rc = wk_engine_kv_import(s->e, &kb, b->has_salt ? b->salt : 0, b->payload.data);
        if (rc < 0) {
            refuse(s, rc == LLM_EINVAL ? "a block whose key does not match its tokens" : "no memory tier to keep it",
                   t->transfer_id);
            continue;
        }
        r->blocks++;
        s->kvst.recv_blocks++;
        s->kvst.recv_bytes += bb;
    }
    if (t->has_last && t->last && !r->done) {
        r->done = 1;
        s->kvst.recv_done++;
        double ms = t->has_sent_unix_ns ? (double)(int64_t)(wall_ns() - t->sent_unix_ns) / 1e6 : 0;
        if (ms < 0) ms = 0;
        s->kvst.ms_sum += ms;
        int k = 0;
        while (k < WK_KV_BUCKETS - 1 && ms > wk_kv_bucket_ms[k]) k++;
        s->kvst.ms_bucket[k]++;
    }
}

int wk_srv_kv_ready(server *s, uint64_t id) {
    if (!s->kv) return 1;
    const xin *r = find_in(s->kv, id, 0);
    return r && r->done;
}

void wk_srv_kv_stats_fill(const server *s, Llmserve__Stats *st) {
    if (!s->kv) return;
    const wk_srv_kv_stats *k = &s->kvst;
#define SET(f, v) st->has_##f = 1, st->f = (v)
    SET(kv_xfer_sent_blocks, k->sent_blocks);
    SET(kv_xfer_sent_bytes, k->sent_bytes);
    SET(kv_xfer_recv_blocks, k->recv_blocks);
    SET(kv_xfer_recv_bytes, k->recv_bytes);
    SET(kv_xfer_sent_done, k->sent_done);
    SET(kv_xfer_recv_done, k->recv_done);
    SET(kv_xfer_wait_expired, k->wait_expired);
    SET(kv_xfer_refused, k->refused);
    SET(kv_xfer_ms_sum, k->ms_sum);
    SET(kv_xfer_send_failed, k->send_failed);
    SET(kv_role, (uint32_t)s->o->kv_role);
#undef SET
    st->n_kv_xfer_ms_bucket = WK_KV_BUCKETS;
    st->kv_xfer_ms_bucket = (uint64_t *)k->ms_bucket; /* read under mu, as the counts are written */
}
