#include "gw_cache.h"
#include "cm_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static uint64_t nz(uint64_t k) { return k ? k : 1; } /* cm_idmap reserves 0 */

static uint64_t ekey(uint64_t scope, uint64_t exact) {
    uint64_t k[2] = {scope, exact};
    return nz(XXH3_64bits(k, sizeof k));
}

void gw_cache_init(gw_cache *c, int max_entries, double ttl, float threshold, int dim) {
    memset(c, 0, sizeof *c);
    c->max_entries = max_entries > 0 ? max_entries : 1;
    c->ttl = ttl;
    c->threshold = threshold;
    c->near = 0.05f;
    c->dim = dim;
}

static void unlink_entry(gw_cache *c, gw_centry *e) {
    if (e->lru_prev) e->lru_prev->lru_next = e->lru_next;
    else c->lru_head = e->lru_next;
    if (e->lru_next) e->lru_next->lru_prev = e->lru_prev;
    else c->lru_tail = e->lru_prev;
    if (e->sc_prev) {
        e->sc_prev->sc_next = e->sc_next;
    } else if (e->sc_next) {
        cm_idmap_put(&c->scopes, nz(e->scope), e->sc_next);
    } else {
        cm_idmap_del(&c->scopes, nz(e->scope));
    }
    if (e->sc_next) e->sc_next->sc_prev = e->sc_prev;
    cm_idmap_del(&c->exact, ekey(e->scope, e->exact));
    c->n--;
    c->bytes -= sizeof *e + e->len + (e->vec ? 5 * (size_t)c->dim : 0);
}

static void drop(gw_cache *c, gw_centry *e) {
    unlink_entry(c, e);
    free(e->vec);
    free(e->q8);
    free(e->text);
    free(e);
}

static void touch(gw_cache *c, gw_centry *e) { /* to the front of the LRU list */
    if (c->lru_head == e) return;
    e->lru_prev->lru_next = e->lru_next;
    if (e->lru_next) e->lru_next->lru_prev = e->lru_prev;
    else c->lru_tail = e->lru_prev;
    e->lru_prev = NULL;
    e->lru_next = c->lru_head;
    c->lru_head->lru_prev = e;
    c->lru_head = e;
}

void gw_cache_free(gw_cache *c) {
    while (c->lru_head) drop(c, c->lru_head);
    cm_idmap_free(&c->exact);
    cm_idmap_free(&c->scopes);
}

static int fresh(const gw_cache *c, const gw_centry *e, double now) { return c->ttl <= 0 || now - e->created < c->ttl; }

int gw_cache_get_exact(gw_cache *c, uint64_t scope, uint64_t exact, double now, gw_cache_hit *out) {
    out->e = NULL;
    out->similarity = -2;
    out->exact = 0;
    gw_centry *e = cm_idmap_get(&c->exact, ekey(scope, exact));
    if (e && !fresh(c, e, now)) {
        drop(c, e);
        c->expired++;
        e = NULL;
    }
    if (!e) return 0;
    touch(c, e);
    c->hits_exact++;
    out->e = e;
    out->similarity = 1;
    out->exact = 1;
    return 1;
}

/* Independent partial sums, so the compiler vectorizes both dot products. */
static float dot_f32(const float *a, const float *b, int n) {
    float acc[16] = {0}, s = 0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s += a[i] * b[i];
    for (int j = 0; j < 16; j++) s += acc[j];
    return s;
}

static float dot_q8(const int8_t *a, const float *b, int n) {
    float acc[16] = {0}, s = 0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += (float)a[i + j] * b[i + j];
    for (; i < n; i++) s += (float)a[i] * b[i];
    for (int j = 0; j < 16; j++) s += acc[j];
    return s;
}

#define RESCORE 4 /* best int8 scores scored again in float */

int gw_cache_get_similar(gw_cache *c, uint64_t scope, const float *vec, double now, gw_cache_hit *out) {
    out->e = NULL;
    out->similarity = -2;
    out->exact = 0;
    gw_centry *best = NULL, *cand[RESCORE] = {0};
    float bs = -2, cs[RESCORE] = {-3, -3, -3, -3};
    for (gw_centry *e = cm_idmap_get(&c->scopes, nz(scope)), *nx; e; e = nx) {
        nx = e->sc_next;
        if (!fresh(c, e, now)) {
            drop(c, e);
            c->expired++;
            continue;
        }
        if (!e->q8) continue;
        float s = dot_q8(e->q8, vec, c->dim) * e->q8_scale;
        if (s <= cs[RESCORE - 1]) continue;
        int k = RESCORE - 1; /* insertion into the short sorted list */
        while (k > 0 && cs[k - 1] < s) cs[k] = cs[k - 1], cand[k] = cand[k - 1], k--;
        cs[k] = s, cand[k] = e;
    }
    for (int k = 0; k < RESCORE && cand[k]; k++) {
        float s = dot_f32(cand[k]->vec, vec, c->dim);
        if (s > bs) bs = s, best = cand[k];
    }
    out->similarity = bs;
    if (best && bs >= c->threshold) {
        touch(c, best);
        c->hits_semantic++;
        out->e = best;
        return 1;
    }
    if (best && bs >= c->threshold - c->near) c->near_misses++;
    c->misses++;
    return 0;
}

int gw_cache_put(gw_cache *c, uint64_t scope, uint64_t exact, const float *vec, const char *text, size_t len, int finish,
                 int completion_tokens, double now) {
    gw_centry *old = cm_idmap_get(&c->exact, ekey(scope, exact));
    if (old) drop(c, old);
    gw_centry *e = calloc(1, sizeof *e);
    if (!e) return LLM_ENOMEM;
    e->text = malloc(len + 1);
    e->vec = vec ? malloc(sizeof(float) * (size_t)c->dim) : NULL;
    e->q8 = vec ? malloc((size_t)c->dim) : NULL;
    if (!e->text || (vec && (!e->vec || !e->q8)) || cm_idmap_put(&c->exact, ekey(scope, exact), e)) {
        free(e->text);
        free(e->vec);
        free(e->q8);
        free(e);
        return LLM_ENOMEM;
    }
    memcpy(e->text, text, len);
    e->text[len] = 0;
    if (vec) {
        float mx = 0;
        memcpy(e->vec, vec, sizeof(float) * (size_t)c->dim);
        for (int d = 0; d < c->dim; d++) mx = fabsf(vec[d]) > mx ? fabsf(vec[d]) : mx;
        e->q8_scale = mx > 0 ? mx / 127 : 1;
        for (int d = 0; d < c->dim; d++) e->q8[d] = (int8_t)lrintf(vec[d] / e->q8_scale);
    }
    e->len = len;
    e->scope = scope;
    e->exact = exact;
    e->created = now;
    e->finish = finish;
    e->completion_tokens = completion_tokens;
    gw_centry *head = cm_idmap_get(&c->scopes, nz(scope));
    e->sc_next = head;
    if (head) head->sc_prev = e;
    if (cm_idmap_put(&c->scopes, nz(scope), e)) { /* undo */
        if (head) head->sc_prev = NULL;
        cm_idmap_del(&c->exact, ekey(scope, exact));
        free(e->text);
        free(e->vec);
        free(e->q8);
        free(e);
        return LLM_ENOMEM;
    }
    e->lru_next = c->lru_head;
    if (c->lru_head) c->lru_head->lru_prev = e;
    c->lru_head = e;
    if (!c->lru_tail) c->lru_tail = e;
    c->n++;
    c->bytes += sizeof *e + len + (vec ? 5 * (size_t)c->dim : 0);
    c->inserts++;
    while (c->n > c->max_entries) {
        drop(c, c->lru_tail);
        c->evictions++;
    }
    return 0;
}

uint64_t gw_cache_exact_key(const char *text, size_t len) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return nz(XXH3_64bits(text, len));
    XXH3_64bits_reset(st);
    char buf[256];
    size_t n = 0;
    int space = 0, any = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v') {
            space = any;
            continue;
        }
        if (space) buf[n++] = ' ';
        space = 0;
        any = 1;
        buf[n++] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
        if (n >= sizeof buf - 2) {
            XXH3_64bits_update(st, buf, n);
            n = 0;
        }
    }
    XXH3_64bits_update(st, buf, n);
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return nz(h);
}

const char *gw_sums_get(const gw_sums *s, uint64_t key) { return cm_idmap_get(&s->map, key); }

int gw_sums_put(gw_sums *s, uint64_t key, const char *text, size_t len) {
    if (cm_idmap_get(&s->map, key)) return 0;
    char *copy = strndup(text, len);
    if (!copy || cm_idmap_put(&s->map, key, copy)) {
        free(copy);
        return LLM_ENOMEM;
    }
    if (s->n == GW_SUMS) free(cm_idmap_del(&s->map, s->ring[s->at]));
    else s->n++;
    s->ring[s->at] = key;
    s->at = (s->at + 1) % GW_SUMS;
    return 0;
}

void gw_sums_free(gw_sums *s) {
    for (int i = 0; i < s->n; i++) free(cm_idmap_del(&s->map, s->ring[i]));
    cm_idmap_free(&s->map);
    s->n = s->at = 0;
}
