/* blocks_test: the KV block manager under 100k random operations.
 *
 * Beside the manager runs a model of what the KV cache would hold: every
 * write puts the token id into its (block, row) slot, copy-on-write copies
 * slots. After every operation the manager's own invariants are checked and
 * every live sequence must read back its own tokens through its table: a
 * prefix hit on the wrong block, a write into a shared block or a lost copy
 * shows up as a wrong token. The events, replayed, must give exactly the
 * manager's set of cached keys. */
#include "cm_error.h"
#include "cm_hash.h"
#include "tst.h"
#include "wk_blocks.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SEQ 16
#define MAX_LEN 96

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

typedef struct {
    int live;
    wk_bseq bs;
    int32_t tok[MAX_LEN];
    int n_tok, n_done; /* tokens known, tokens whose slots are written */
} seq;

typedef struct {
    uint64_t *keys;
    int n, cap;
} keyset;

static void ks_add(keyset *k, uint64_t key) {
    for (int i = 0; i < k->n; i++)
        if (k->keys[i] == key) return;
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 64;
        k->keys = realloc(k->keys, sizeof(uint64_t) * (size_t)k->cap);
    }
    k->keys[k->n++] = key;
}
static int ks_del(keyset *k, uint64_t key) {
    for (int i = 0; i < k->n; i++)
        if (k->keys[i] == key) {
            k->keys[i] = k->keys[--k->n];
            return 1;
        }
    return 0;
}
static void ks_add_cb(void *ctx, uint64_t key) { ks_add(ctx, key); }

static int same_set(keyset *a, keyset *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++) {
        int f = 0;
        for (int j = 0; j < b->n && !f; j++) f = a->keys[i] == b->keys[j];
        if (!f) return 0;
    }
    return 1;
}

/* Three shared "system prompts" make prefix hits common. */
static int32_t base[3][MAX_LEN];

static void write_slots(int32_t *slots, int bs, seq *s, int from, int to) {
    for (int p = from; p < to; p++) slots[(size_t)s->bs.ids[p / bs] * bs + p % bs] = s->tok[p];
}

/* What the cache does for reserve's copy-on-write list; returns the copies. */
static int apply_copies(int32_t *slots, int bs, const wk_copy *cp, int ncp) {
    for (int c = 0; c < ncp; c++)
        memcpy(slots + (size_t)cp[c].dst * bs, slots + (size_t)cp[c].src * bs, sizeof(int32_t) * (size_t)bs);
    return ncp;
}

static void run(int n_blocks, int bs, int caching, int ops) {
    wk_blocks *b;
    CHECK_RC(wk_blocks_create(n_blocks, bs, caching, &b), 0);
    seq sq[MAX_SEQ];
    memset(sq, 0, sizeof sq);
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)n_blocks * bs);
    for (int i = 0; i < n_blocks * bs; i++) slots[i] = -1;
    keyset from_events = {0}, actual = {0};
    wk_kv_event ev[64];
    long hits = 0, evictions = 0, forks = 0, cows = 0, refused = 0, specs = 0, rolled = 0;
    char err[256];
    int bad = 0;
    for (int op = 0; op < ops && !bad; op++) {
        int i = (int)(rnd() % MAX_SEQ), kind = (int)(rnd() % 100);
        seq *s = &sq[i];
        wk_copy cp[1];
        int ncp = 0;
        if (!s->live && kind < 60) { /* admit: a prompt on a shared base, match the cache, reserve */
            int which = (int)(rnd() % 3), keep = (int)(rnd() % MAX_LEN), n = 1 + (int)(rnd() % (MAX_LEN - 1));
            for (int p = 0; p < n; p++) s->tok[p] = p < keep ? base[which][p] : (int32_t)(rnd() % 50);
            s->n_tok = n;
            s->bs.salt = rnd() % 8 == 0 ? 7 : 0;
            int got = wk_blocks_match(b, &s->bs, s->tok, n);
            CHECK(got >= 0 && got % bs == 0 && got < n);
            hits += got > 0;
            /* what the cache holds for the matched blocks is this prompt */
            for (int p = 0; p < got; p++)
                if (slots[(size_t)s->bs.ids[p / bs] * bs + p % bs] != s->tok[p]) { CHECK(0); bad = 1; break; }
            int rc = wk_blocks_reserve(b, &s->bs, got, n, cp, &ncp);
            if (rc == LLM_EAGAIN) {
                refused++;
                CHECK(wk_blocks_needed(b, &s->bs, got, n) > wk_blocks_available(b));
                wk_blocks_release(b, &s->bs);
            } else {
                CHECK_RC(rc, 0);
                CHECK_INT(ncp, 0);
                wk_blocks_count_query(b, n, got);
                write_slots(slots, bs, s, got, n);
                s->n_done = n;
                wk_blocks_commit(b, &s->bs, s->tok, n);
                s->live = 1;
            }
        } else if (s->live && kind >= 60 && kind < 75) {
            /* a speculative step: k + 1 positions written, m of them kept, the rest rolled back */
            int k = 1 + (int)(rnd() % 6);
            if (s->n_done + 1 + k > MAX_LEN) k = MAX_LEN - s->n_done - 1;
            if (k > 0) {
                for (int p = 0; p <= k; p++) s->tok[s->n_done + p] = (int32_t)(rnd() % 50);
                int rc = wk_blocks_reserve(b, &s->bs, s->n_done, s->n_done + k + 1, cp, &ncp);
                if (rc == LLM_EAGAIN) {
                    refused++;
                } else {
                    CHECK_RC(rc, 0);
                    cows += apply_copies(slots, bs, cp, ncp);
                    write_slots(slots, bs, s, s->n_done, s->n_done + k + 1);
                    int m = (int)(rnd() % (unsigned)(k + 2));
                    CHECK_RC(wk_blocks_truncate(b, &s->bs, s->n_done + m), 0);
                    s->n_tok = s->n_done = s->n_done + m;
                    wk_blocks_commit(b, &s->bs, s->tok, s->n_done);
                    specs++;
                    rolled += k + 1 - m;
                }
            }
        } else if (s->live && kind < 75) { /* append a few tokens (a decode or a chunk) */
            int k = 1 + (int)(rnd() % 8);
            if (s->n_tok + k > MAX_LEN) k = MAX_LEN - s->n_tok;
            if (k > 0) {
                for (int p = 0; p < k; p++) s->tok[s->n_tok + p] = (int32_t)(rnd() % 50);
                int rc = wk_blocks_reserve(b, &s->bs, s->n_done, s->n_done + k, cp, &ncp);
                if (rc == LLM_EAGAIN) {
                    refused++;
                } else {
                    CHECK_RC(rc, 0);
                    cows += apply_copies(slots, bs, cp, ncp);
                    s->n_tok += k;
                    write_slots(slots, bs, s, s->n_done, s->n_tok);
                    s->n_done = s->n_tok;
                    wk_blocks_commit(b, &s->bs, s->tok, s->n_done);
                }
            }
        } else if (s->live && kind < 90) { /* finish */
            wk_blocks_release(b, &s->bs);
            s->live = 0;
        } else if (s->live && kind < 99) { /* fork (n > 1) into a free slot */
            int j = (int)(rnd() % MAX_SEQ);
            if (!sq[j].live) {
                CHECK_RC(wk_blocks_fork(b, &s->bs, &sq[j].bs), 0);
                memcpy(sq[j].tok, s->tok, sizeof s->tok);
                sq[j].n_tok = s->n_tok;
                sq[j].n_done = s->n_done;
                sq[j].live = 1;
                forks++;
            }
        } else if (kind == 99 && rnd() % 20 == 0) {
            wk_blocks_reset_cache(b);
        }
        /* invariants */
        const wk_bseq *live[MAX_SEQ];
        int nl = 0;
        for (int q = 0; q < MAX_SEQ; q++)
            if (sq[q].live) live[nl++] = &sq[q].bs;
        int rc = wk_blocks_check(b, live, nl, err, sizeof err);
        if (rc) {
            fprintf(stderr, "op %d: %s\n", op, err);
            CHECK(0);
            bad = 1;
        }
        for (int q = 0; q < MAX_SEQ && !bad; q++) {
            seq *t = &sq[q];
            if (!t->live) continue;
            if (t->bs.n != (t->n_done + bs - 1) / bs) { CHECK(0); bad = 1; }
            for (int p = 0; p < t->n_done && !bad; p++)
                if (slots[(size_t)t->bs.ids[p / bs] * bs + p % bs] != t->tok[p]) {
                    fprintf(stderr, "op %d: seq %d reads a wrong token at %d\n", op, q, p);
                    CHECK(0);
                    bad = 1;
                }
            /* the table's keys are the chain of its own tokens */
            uint64_t parent = CM_BLOCK_ROOT;
            for (int k = 0; k < t->bs.n_hashed && !bad; k++) {
                uint64_t key = cm_block_key(parent, t->bs.salt, t->tok + (size_t)k * bs, bs);
                if (key != t->bs.keys[k]) { CHECK(0); bad = 1; }
                parent = key;
            }
        }
        int ne;
        while ((ne = wk_blocks_events(b, ev, 64)) > 0)
            for (int e = 0; e < ne; e++) {
                if (ev[e].type == WK_EV_STORED) ks_add(&from_events, ev[e].key);
                else {
                    CHECK(ks_del(&from_events, ev[e].key));
                    evictions++;
                }
            }
        if (op % 997 == 0 || op == ops - 1) {
            /* a router replaying the events knows exactly the cached keys */
            actual.n = 0;
            wk_blocks_each_key(b, ks_add_cb, &actual);
            if (!caching) CHECK_INT(actual.n, 0);
            CHECK(same_set(&from_events, &actual));
        }
    }
    for (int q = 0; q < MAX_SEQ; q++)
        if (sq[q].live) wk_blocks_release(b, &sq[q].bs);
    CHECK_RC(wk_blocks_check(b, NULL, 0, err, sizeof err), 0);
    CHECK_INT(wk_blocks_available(b), n_blocks); /* nothing leaked */
    wk_blocks_stats st;
    wk_blocks_get_stats(b, &st);
    CHECK(st.events_dropped == 0);
    if (caching) {
        CHECK(hits > 0 && evictions > 0 && st.hits > 0 && st.hits <= st.queries);
    }
    CHECK(forks > 0 && (cows > 0 || bs == 1) && refused > 0); /* block size 1: never a partial block to copy */
    CHECK(specs > 0 && rolled > 0);
    fprintf(stderr, "  blocks %d x %d caching %d: %ld prefix hits, %ld evictions, %ld forks, %ld copies, %ld refused, "
            "%ld speculative steps (%ld positions rolled back)\n",
            n_blocks, bs, caching, hits, evictions, forks, cows, refused, specs, rolled);
    for (int q = 0; q < MAX_SEQ; q++) wk_bseq_free(&sq[q].bs);
    free(from_events.keys);
    free(actual.keys);
    free(slots);
    wk_blocks_free(b);
}

/* The event stream alone rebuilds the cached key set (no reset in between). */
static void test_events_mirror(void) {
    wk_blocks *b;
    CHECK_RC(wk_blocks_create(24, 4, 1, &b), 0);
    keyset mirror = {0}, actual = {0};
    wk_kv_event ev[16];
    wk_bseq s = {0};
    for (int round = 0; round < 200; round++) {
        int32_t tok[40];
        int n = 5 + (int)(rnd() % 30);
        for (int p = 0; p < n; p++) tok[p] = p < 12 ? p : (int32_t)(rnd() % 6);
        int got = wk_blocks_match(b, &s, tok, n);
        wk_copy cp[1];
        int ncp;
        if (wk_blocks_reserve(b, &s, got, n, cp, &ncp) == 0) wk_blocks_commit(b, &s, tok, n);
        wk_blocks_release(b, &s);
        int ne;
        while ((ne = wk_blocks_events(b, ev, 16)) > 0)
            for (int e = 0; e < ne; e++) {
                if (ev[e].type == WK_EV_STORED) ks_add(&mirror, ev[e].key);
                else CHECK(ks_del(&mirror, ev[e].key));
            }
        actual.n = 0;
        wk_blocks_each_key(b, ks_add_cb, &actual);
        CHECK(same_set(&mirror, &actual));
    }
    /* the 12-token shared prefix (3 blocks) is found again */
    int32_t tok[20];
    for (int p = 0; p < 20; p++) tok[p] = p < 12 ? p : 99;
    CHECK_INT(wk_blocks_match(b, &s, tok, 20), 12);
    wk_blocks_release(b, &s);
    /* a different salt sees nothing */
    s.salt = cm_salt_of("tenant-b", 8);
    CHECK_INT(wk_blocks_match(b, &s, tok, 20), 0);
    /* a fully cached prompt still leaves its last token to compute */
    s.salt = 0;
    CHECK_INT(wk_blocks_match(b, &s, tok, 12), 8);
    wk_blocks_release(b, &s);
    wk_bseq_free(&s);
    free(mirror.keys);
    free(actual.keys);
    wk_blocks_free(b);
}

static void test_bad_args(void) {
    wk_blocks *b;
    CHECK_RC(wk_blocks_create(0, 16, 1, &b), LLM_EINVAL);
    CHECK_RC(wk_blocks_create(4, 0, 1, &b), LLM_EINVAL);
    CHECK_RC(wk_blocks_create(4, 2, 1, &b), 0);
    wk_bseq s = {0};
    wk_copy cp[1];
    int ncp;
    CHECK_RC(wk_blocks_reserve(b, &s, 0, 9, cp, &ncp), LLM_EAGAIN); /* 5 blocks of 4 */
    CHECK_INT(s.n, 0);
    CHECK_RC(wk_blocks_reserve(b, &s, 3, 1, cp, &ncp), LLM_EINVAL);
    CHECK_RC(wk_blocks_reserve(b, &s, 0, 8, cp, &ncp), 0);
    CHECK_INT(wk_blocks_available(b), 0);
    /* truncate: never into a keyed block; down to what covers n positions */
    int32_t t8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    wk_blocks_commit(b, &s, t8, 3); /* block 0 full and keyed */
    CHECK_RC(wk_blocks_truncate(b, &s, 1), LLM_EINVAL);
    CHECK_RC(wk_blocks_truncate(b, &s, -1), LLM_EINVAL);
    CHECK_INT(s.n, 4);
    CHECK_RC(wk_blocks_truncate(b, &s, 3), 0);
    CHECK_INT(s.n, 2);
    CHECK_INT(wk_blocks_available(b), 2);
    CHECK_RC(wk_blocks_truncate(b, &s, 7), 0); /* longer than the table: nothing to drop */
    CHECK_INT(s.n, 2);
    wk_blocks_release(b, &s);
    CHECK_INT(wk_blocks_available(b), 4);
    wk_bseq_free(&s);
    wk_blocks_free(b);
}

int main(void) {
    for (int w = 0; w < 3; w++)
        for (int p = 0; p < MAX_LEN; p++) base[w][p] = (int32_t)(100 + w * 1000 + p);
    test_bad_args();
    test_events_mirror();
    /* 100k operations over block sizes 1, 4, 16 and with caching off */
    run(64, 4, 1, 40000);
    run(200, 1, 1, 20000);
    run(24, 16, 1, 20000);
    run(48, 4, 0, 20000);
    return tst_done("blocks_test");
}
