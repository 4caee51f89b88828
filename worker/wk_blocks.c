#include "wk_blocks.h"
#include "cm_error.h"
#include "cm_hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wk_blocks {
    int n, bs, caching;
    int32_t *ref;
    /* prefix cache: a block is keyed when hashed[i]; its key, parent, salt
     * and tokens let a match verify it exactly */
    uint8_t *hashed;
    uint64_t *key, *parent, *salt;
    int32_t *toks;            /* [n][bs] */
    int32_t *bucket, *hnext;  /* chained hash table over block ids */
    uint32_t bmask;
    int n_hashed;
    /* free list, least recently used at the head */
    int32_t *prev, *next;
    uint8_t *in_free;
    int32_t head, tail;
    int n_free;
    /* event ring */
    wk_kv_event *ev;
    int ev_cap, ev_first, ev_n;
    uint64_t ev_dropped, queries, hits;
    const wk_blocks_tier_ops *tops;
    void *tctx;
};

int wk_blocks_create(int n_blocks, int block_size, int caching, wk_blocks **out) {
    *out = NULL;
    if (n_blocks <= 0 || block_size <= 0 || block_size > 4096 || n_blocks > (1 << 30)) return LLM_EINVAL;
    wk_blocks *b = calloc(1, sizeof *b);
    if (!b) return LLM_ENOMEM;
    size_t n = (size_t)n_blocks;
    b->n = n_blocks;
    b->bs = block_size;
    b->caching = caching != 0;
    uint32_t nb = 1;
    while (nb < 2 * n) nb <<= 1;
    b->bmask = nb - 1;
    b->ev_cap = n_blocks * 2 < 1024 ? 1024 : n_blocks * 2;
    b->ref = calloc(n, sizeof *b->ref);
    b->hashed = calloc(n, 1);
    b->key = calloc(n, sizeof *b->key);
    b->parent = calloc(n, sizeof *b->parent);
    b->salt = calloc(n, sizeof *b->salt);
    b->toks = caching ? malloc(n * (size_t)block_size * sizeof *b->toks) : NULL;
    b->bucket = malloc(nb * sizeof *b->bucket);
    b->hnext = malloc(n * sizeof *b->hnext);
    b->prev = malloc(n * sizeof *b->prev);
    b->next = malloc(n * sizeof *b->next);
    b->in_free = malloc(n);
    b->ev = malloc((size_t)b->ev_cap * sizeof *b->ev);
    if (!b->ref || !b->hashed || !b->key || !b->parent || !b->salt || (caching && !b->toks) || !b->bucket ||
        !b->hnext || !b->prev || !b->next || !b->in_free || !b->ev) {
        wk_blocks_free(b);
        return LLM_ENOMEM;
    }
    for (uint32_t i = 0; i < nb; i++) b->bucket[i] = -1;
    for (int i = 0; i < n_blocks; i++) {
        b->prev[i] = i - 1;
        b->next[i] = i + 1 < n_blocks ? i + 1 : -1;
        b->in_free[i] = 1;
        b->hnext[i] = -1;
    }
    b->head = 0;
    b->tail = n_blocks - 1;
    b->n_free = n_blocks;
    *out = b;
    return 0;
}

void wk_blocks_free(wk_blocks *b) {
    if (!b) return;
    free(b->ref); free(b->hashed); free(b->key); free(b->parent); free(b->salt); free(b->toks);
    free(b->bucket); free(b->hnext); free(b->prev); free(b->next); free(b->in_free); free(b->ev);
    free(b);
}

int wk_blocks_block_size(const wk_blocks *b) { return b->bs; }
int wk_blocks_available(const wk_blocks *b) { return b->n_free; }

void wk_blocks_get_stats(const wk_blocks *b, wk_blocks_stats *st) {
    *st = (wk_blocks_stats){b->n, b->n_free, b->n_hashed, b->queries, b->hits, b->ev_dropped};
}

void wk_blocks_count_query(wk_blocks *b, int n, int hit) {
    b->queries += (uint64_t)n;
    b->hits += (uint64_t)hit;
}

/* ---- events ------------------------------------------------------------ */

void wk_blocks_emit(wk_blocks *b, int type, uint64_t key, uint64_t parent, int tier) {
    if (b->ev_n == b->ev_cap) { /* nobody is draining: drop the oldest */
        b->ev_first = (b->ev_first + 1) % b->ev_cap;
        b->ev_n--;
        b->ev_dropped++;
    }
    b->ev[(b->ev_first + b->ev_n) % b->ev_cap] = (wk_kv_event){type, key, parent, tier};
    b->ev_n++;
}

static void emit(wk_blocks *b, int type, uint64_t key, uint64_t parent) { wk_blocks_emit(b, type, key, parent, 0); }

void wk_blocks_set_tier(wk_blocks *b, const wk_blocks_tier_ops *ops, void *ctx) {
    b->tops = ops;
    b->tctx = ctx;
}

int wk_blocks_events(wk_blocks *b, wk_kv_event *out, int max) {
    int n = 0;
    for (; n < max && b->ev_n; n++) {
        out[n] = b->ev[b->ev_first];
        b->ev_first = (b->ev_first + 1) % b->ev_cap;
        b->ev_n--;
    }
    return n;
}

/* ---- free list --------------------------------------------------------- */

static void free_unlink(wk_blocks *b, int32_t i) {
    if (b->prev[i] >= 0) b->next[b->prev[i]] = b->next[i];
    else b->head = b->next[i];
    if (b->next[i] >= 0) b->prev[b->next[i]] = b->prev[i];
    else b->tail = b->prev[i];
    b->in_free[i] = 0;
    b->n_free--;
}

static void free_push(wk_blocks *b, int32_t i, int at_tail) {
    if (at_tail) {
        b->prev[i] = b->tail;
        b->next[i] = -1;
        if (b->tail >= 0) b->next[b->tail] = i;
        else b->head = i;
        b->tail = i;
    } else {
        b->prev[i] = -1;
        b->next[i] = b->head;
        if (b->head >= 0) b->prev[b->head] = i;
        else b->tail = i;
        b->head = i;
    }
    b->in_free[i] = 1;
    b->n_free++;
}

/* ---- hash table -------------------------------------------------------- */

static int32_t lookup(const wk_blocks *b, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    for (int32_t i = b->bucket[key & b->bmask]; i >= 0; i = b->hnext[i])
        if (b->key[i] == key && b->parent[i] == parent && b->salt[i] == salt &&
            !memcmp(b->toks + (size_t)i * b->bs, tok, sizeof(int32_t) * (size_t)b->bs))
            return i;
    return -1;
}

static void unhash(wk_blocks *b, int32_t i) {
    int32_t *p = &b->bucket[b->key[i] & b->bmask];
    while (*p != i) p = &b->hnext[*p];
    *p = b->hnext[i];
    b->hnext[i] = -1;
    b->hashed[i] = 0;
    b->n_hashed--;
}

/* Takes the least recently used free block, evicting its key. */
static int32_t take(wk_blocks *b) {
    int32_t i = b->head;
    free_unlink(b, i);
    if (b->hashed[i]) {
        emit(b, WK_EV_REMOVED, b->key[i], 0);
        if (b->tops) /* down a tier before its K/V is overwritten */
            b->tops->evict(b->tctx, i, b->key[i], b->parent[i], b->salt[i], b->toks + (size_t)i * b->bs);
        unhash(b, i);
    }
    b->ref[i] = 1;
    return i;
}

/* Block blk now holds the K/V of tokens t under parent and salt: findable, and news to the router. */
static void hash_in(wk_blocks *b, int32_t blk, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *t) {
    b->hashed[blk] = 1;
    b->key[blk] = key;
    b->parent[blk] = parent;
    b->salt[blk] = salt;
    memcpy(b->toks + (size_t)blk * b->bs, t, sizeof(int32_t) * (size_t)b->bs);
    uint32_t h = (uint32_t)(key & b->bmask);
    b->hnext[blk] = b->bucket[h];
    b->bucket[h] = blk;
    b->n_hashed++;
    emit(b, WK_EV_STORED, key, parent);
}

static int grow(wk_bseq *s, int n) {
    if (n <= s->cap) return 0;
    int cap = s->cap ? s->cap : 8;
    while (cap < n) cap *= 2;
    int32_t *ids = realloc(s->ids, sizeof *ids * (size_t)cap);
    if (!ids) return LLM_ENOMEM;
    s->ids = ids;
    uint64_t *keys = realloc(s->keys, sizeof *keys * (size_t)cap);
    if (!keys) return LLM_ENOMEM;
    s->keys = keys;
    s->cap = cap;
    return 0;
}

/* ---- sequences --------------------------------------------------------- */

int wk_blocks_match(wk_blocks *b, wk_bseq *s, const int32_t *tok, int n) {
    if (!b->caching || s->n || n <= 1) return 0;
    int max = (n - 1) / b->bs, got = 0;
    uint64_t parent = CM_BLOCK_ROOT;
    for (; got < max; got++) {
        const int32_t *t = tok + (size_t)got * b->bs;
        uint64_t key = cm_block_key(parent, s->salt, t, b->bs);
        int32_t i = lookup(b, key, parent, s->salt, t);
        if (i < 0) { /* a lower tier may hold it: into a free block */
            if (!b->tops || !b->n_free || !b->tops->has(b->tctx, key, parent, s->salt, t) || grow(s, got + 1)) break;
            i = take(b);
            if (b->tops->onload(b->tctx, i, key, parent, s->salt, t)) {
                b->ref[i] = 0;
                free_push(b, i, 0);
                break;
            }
            hash_in(b, i, key, parent, s->salt, t);
        } else {
            if (grow(s, got + 1)) break;
            if (b->ref[i]++ == 0) free_unlink(b, i);
        }
        s->ids[got] = i;
        s->keys[got] = key;
        parent = key;
    }
    s->n = s->n_hashed = got;
    return got * b->bs;
}

int wk_blocks_cached(const wk_blocks *b, uint64_t salt, const int32_t *tok, int n) {
    if (!b->caching || n <= 1) return 0;
    int max = (n - 1) / b->bs, got = 0;
    uint64_t parent = CM_BLOCK_ROOT;
    for (; got < max; got++) {
        const int32_t *t = tok + (size_t)got * b->bs;
        uint64_t key = cm_block_key(parent, salt, t, b->bs);
        if (lookup(b, key, parent, salt, t) < 0) break;
        parent = key;
    }
    return got * b->bs;
}

int wk_blocks_chain(const wk_blocks *b, uint64_t salt, const int32_t *tok, int n, int from, int max, int32_t *blk,
                    uint64_t *key, uint64_t *parent) {
    if (!b->caching || n < b->bs || max <= 0) return 0;
    int nb = n / b->bs, got = 0;
    uint64_t par = CM_BLOCK_ROOT;
    for (int i = 0; i < nb && got < max; i++) {
        const int32_t *t = tok + (size_t)i * b->bs;
        uint64_t k = cm_block_key(par, salt, t, b->bs);
        if (i >= from) {
            int32_t at = lookup(b, k, par, salt, t);
            if (at < 0) break;
            blk[got] = at, key[got] = k, parent[got] = par;
            got++;
        }
        par = k;
    }
    return got;
}

int wk_blocks_holds(const wk_blocks *b, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    return b->caching && lookup(b, key, parent, salt, tok) >= 0;
}

int wk_blocks_prefetch(wk_blocks *b, uint64_t salt, const int32_t *tok, int n) {
    if (!b->caching || !b->tops || !b->tops->prefetch || n <= 1) return 0;
    int max = (n - 1) / b->bs, pending = 0;
    uint64_t parent = CM_BLOCK_ROOT;
    for (int got = 0; got < max; got++) {
        const int32_t *t = tok + (size_t)got * b->bs;
        uint64_t key = cm_block_key(parent, salt, t, b->bs);
        if (lookup(b, key, parent, salt, t) < 0) {
            int r = b->tops->prefetch(b->tctx, key, parent, salt, t);
            if (!r) break;
            pending += r == 2;
        }
        parent = key;
    }
    return pending;
}

int wk_blocks_needed(const wk_blocks *b, const wk_bseq *s, int from, int to) {
    int want = (to + b->bs - 1) / b->bs, need = want > s->n ? want - s->n : 0;
    for (int i = from / b->bs; i < s->n && i < want; i++)
        if (b->ref[s->ids[i]] > 1) need++;
    return need;
}

int wk_blocks_reserve(wk_blocks *b, wk_bseq *s, int from, int to, wk_copy *copies, int *n_copies) {
    *n_copies = 0;
    if (from < 0 || to < from) return LLM_EINVAL;
    int want = (to + b->bs - 1) / b->bs;
    if (wk_blocks_needed(b, s, from, to) > b->n_free) return LLM_EAGAIN;
    if (grow(s, want)) return LLM_ENOMEM;
    for (int i = from / b->bs; i < s->n && i < want; i++) {
        int32_t old = s->ids[i];
        if (b->ref[old] <= 1) continue;
        int32_t nw = take(b);
        b->ref[old]--;
        s->ids[i] = nw;
        if ((int64_t)i * b->bs < from) copies[(*n_copies)++] = (wk_copy){old, nw};
    }
    while (s->n < want) s->ids[s->n++] = take(b);
    return 0;
}

void wk_blocks_commit(wk_blocks *b, wk_bseq *s, const int32_t *tok, int n_done) {
    for (int i = s->n_hashed; i < s->n && (int64_t)(i + 1) * b->bs <= n_done; i++) {
        uint64_t parent = i ? s->keys[i - 1] : CM_BLOCK_ROOT;
        const int32_t *t = tok + (size_t)i * b->bs;
        uint64_t key = cm_block_key(parent, s->salt, t, b->bs);
        s->keys[i] = key;
        s->n_hashed = i + 1;
        int32_t blk = s->ids[i];
        /* a block computed twice (two requests raced on one prefix) stays
         * unkeyed: the first copy is the cached one */
        if (!b->caching || b->hashed[blk] || lookup(b, key, parent, s->salt, t) >= 0) continue;
        hash_in(b, blk, key, parent, s->salt, t);
    }
}

int wk_blocks_truncate(wk_blocks *b, wk_bseq *s, int n) {
    if (n < 0 || (int64_t)n < (int64_t)s->n_hashed * b->bs) return LLM_EINVAL;
    int keep = (n + b->bs - 1) / b->bs;
    for (int i = s->n - 1; i >= keep; i--) {
        int32_t blk = s->ids[i];
        if (--b->ref[blk] == 0) free_push(b, blk, b->hashed[blk]);
    }
    if (keep < s->n) s->n = keep;
    return 0;
}

void wk_blocks_release(wk_blocks *b, wk_bseq *s) {
    /* last blocks first: within one sequence the tail is evicted before the
     * prefix it extends (the prefix is the likelier to be shared) */
    for (int i = s->n - 1; i >= 0; i--) {
        int32_t blk = s->ids[i];
        if (--b->ref[blk] == 0) free_push(b, blk, b->hashed[blk]);
    }
    s->n = s->n_hashed = 0;
}

int wk_blocks_fork(wk_blocks *b, const wk_bseq *src, wk_bseq *dst) {
    if (dst->n) return LLM_EINVAL;
    if (grow(dst, src->n)) return LLM_ENOMEM;
    for (int i = 0; i < src->n; i++) {
        dst->ids[i] = src->ids[i];
        b->ref[src->ids[i]]++;
    }
    if (src->n_hashed) memcpy(dst->keys, src->keys, sizeof(uint64_t) * (size_t)src->n_hashed);
    dst->n = src->n;
    dst->n_hashed = src->n_hashed;
    dst->salt = src->salt;
    return 0;
}

void wk_blocks_reset_cache(wk_blocks *b) {
    for (int32_t i = b->head; i >= 0; i = b->next[i])
        if (b->hashed[i]) {
            emit(b, WK_EV_REMOVED, b->key[i], 0);
            unhash(b, i);
        }
}

void wk_blocks_each_key(const wk_blocks *b, void (*fn)(void *ctx, uint64_t key), void *ctx) {
    for (int i = 0; i < b->n; i++)
        if (b->hashed[i]) fn(ctx, b->key[i]);
}

void wk_bseq_free(wk_bseq *s) {
    free(s->ids);
    free(s->keys);
    memset(s, 0, sizeof *s);
}

/* ---- invariants -------------------------------------------------------- */

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        rc = LLM_EINVAL;                                                                           \
        goto done;                                                                                 \
    } while (0)

int wk_blocks_check(const wk_blocks *b, const wk_bseq *const *seqs, int n_seqs, char *err, size_t errlen) {
    int rc = 0, n_hashed = 0, seen = 0;
    int32_t *count = calloc((size_t)b->n, sizeof *count);
    uint8_t *on_list = calloc((size_t)b->n, 1);
    if (!count || !on_list) FAIL("out of memory");
    for (int q = 0; q < n_seqs; q++) {
        const wk_bseq *s = seqs[q];
        if (s->n_hashed > s->n) FAIL("seq %d: %d keys for %d blocks", q, s->n_hashed, s->n);
        for (int i = 0; i < s->n; i++) {
            int32_t blk = s->ids[i];
            if (blk < 0 || blk >= b->n) FAIL("seq %d: block id %d out of range", q, blk);
            count[blk]++;
            if (i < s->n_hashed && b->hashed[blk] && b->key[blk] != s->keys[i])
                FAIL("seq %d block %d: table key differs from the block's", q, i);
            if (i < s->n_hashed && b->hashed[blk] && b->parent[blk] != (i ? s->keys[i - 1] : CM_BLOCK_ROOT))
                FAIL("seq %d block %d: parent key differs", q, i);
        }
    }
    for (int32_t i = b->head, prev = -1; i >= 0; prev = i, i = b->next[i]) {
        if (i >= b->n || on_list[i]) FAIL("free list: block %d repeated or out of range", i);
        if (b->prev[i] != prev) FAIL("free list: block %d has a bad back link", i);
        on_list[i] = 1;
        seen++;
    }
    if (seen != b->n_free) FAIL("free list holds %d blocks, counter says %d", seen, b->n_free);
    for (int i = 0; i < b->n; i++) {
        if (b->ref[i] != count[i]) FAIL("block %d: ref %d but %d tables hold it", i, b->ref[i], count[i]);
        if ((b->ref[i] == 0) != on_list[i] || on_list[i] != b->in_free[i])
            FAIL("block %d: ref %d, on free list %d, flag %d", i, b->ref[i], on_list[i], b->in_free[i]);
        if (!b->hashed[i]) continue;
        n_hashed++;
        if (!b->caching) FAIL("block %d keyed with caching off", i);
        int32_t found = -1;
        for (int32_t j = b->bucket[b->key[i] & b->bmask]; j >= 0; j = b->hnext[j])
            if (j == i) found = j;
        if (found != i) FAIL("block %d: keyed but not in the table", i);
        if (lookup(b, b->key[i], b->parent[i], b->salt[i], b->toks + (size_t)i * b->bs) != i)
            FAIL("block %d: lookup of its key finds another block", i);
        if (cm_block_key(b->parent[i], b->salt[i], b->toks + (size_t)i * b->bs, b->bs) != b->key[i])
            FAIL("block %d: key does not match its tokens", i);
    }
    if (n_hashed != b->n_hashed) FAIL("%d keyed blocks, counter says %d", n_hashed, b->n_hashed);
done:
    free(count);
    free(on_list);
    return rc;
}
