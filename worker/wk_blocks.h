/* wk_blocks.h - the KV block manager and prefix cache.
 *
 * A fixed pool of blocks of block_size positions. Each sequence has a block
 * table (wk_bseq); a block's reference count is the number of tables that
 * hold it. Blocks with count zero sit on one free list: those that carry a
 * prefix-cache key stay findable there until evicted, least recently used
 * first; blocks without a key are reused before any cached one.
 *
 * A full block's key is cm_block_key(parent key, salt, its tokens), so a key
 * names the whole prefix up to the block's end. Matching verifies parent,
 * salt and tokens, so a 64-bit collision costs a miss, never wrong K/V.
 * Every key that enters or leaves the cache produces an event (for the
 * gateway's prefix-aware router).
 *
 * Copy-on-write: fork shares every block of a table; writing into a shared
 * block first moves the writer to a fresh block, and reserve reports the
 * copies the cache must perform before the step runs. */
#ifndef WK_BLOCKS_H
#define WK_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t *ids;        /* block table */
    uint64_t *keys;      /* key of each full block, [0, n_hashed) */
    int n, cap;          /* blocks held */
    int n_hashed;        /* leading full blocks whose key is known */
    uint64_t salt;
} wk_bseq;

enum { WK_EV_STORED = 1, WK_EV_REMOVED = 2 };
typedef struct {
    int type;
    uint64_t key, parent; /* parent: 0 for removed */
    int tier;             /* 0: this pool; a lower tier's WK_TIER_* (wk_tier.h) */
} wk_kv_event;

/* Lower tiers under the pool (wk_tier.h through the engine): a keyed block
 * about to be evicted is offered to evict (its K/V still intact); a match
 * that runs out of pooled blocks asks has, then onload to fill a block it
 * took for the next key (0: filled, and it joins the cache as if computed). */
typedef struct {
    void (*evict)(void *ctx, int32_t blk, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok);
    int (*has)(void *ctx, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok);
    int (*onload)(void *ctx, int32_t blk, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok);
    /* 1 ready to load, 2 on its way (a read in flight), 0 not held (NULL: every held block is ready) */
    int (*prefetch)(void *ctx, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok);
} wk_blocks_tier_ops;

typedef struct {
    int32_t src, dst;
} wk_copy;

typedef struct {
    int total, free, cached;  /* blocks; free includes cached ones with no user */
    uint64_t queries, hits;   /* prefix cache, in tokens */
    uint64_t events_dropped;  /* events lost because nobody drained them */
} wk_blocks_stats;

typedef struct wk_blocks wk_blocks;

/* caching: 0 disables prefix caching (no keys, no events). */
int wk_blocks_create(int n_blocks, int block_size, int caching, wk_blocks **out);
void wk_blocks_free(wk_blocks *b);
int wk_blocks_block_size(const wk_blocks *b);
/* Lower tiers (ops borrowed; NULL: none). */
void wk_blocks_set_tier(wk_blocks *b, const wk_blocks_tier_ops *ops, void *ctx);
/* Queues an event of a lower tier with the pool's own, in order. */
void wk_blocks_emit(wk_blocks *b, int type, uint64_t key, uint64_t parent, int tier);
/* Blocks an allocation can take now (free or evictable). */
int wk_blocks_available(const wk_blocks *b);
void wk_blocks_get_stats(const wk_blocks *b, wk_blocks_stats *st);

/* For an empty table: takes the longest chain of cached full blocks that
 * begins tok[0..n), leaving at least one token uncovered (so the step that
 * computes the rest yields logits); where the pool's chain ends, a lower
 * tier's blocks continue it (loaded into free blocks). Returns the tokens
 * covered (a multiple of the block size), or LLM_ENOMEM. */
int wk_blocks_match(wk_blocks *b, wk_bseq *s, const int32_t *tok, int n);
/* The tokens of tok that wk_blocks_match would find cached now; takes nothing. */
int wk_blocks_cached(const wk_blocks *b, uint64_t salt, const int32_t *tok, int n);
/* Readies the lower tiers' blocks that a match of tok[0..n) would load: the blocks still on their way there
 * (reads in flight); 0 when a match would wait on nothing. */
int wk_blocks_prefetch(wk_blocks *b, uint64_t salt, const int32_t *tok, int n);
/* The pool's blocks of the chain of tok[0..n)'s full blocks (the last one too), from block index from on, in
 * order, up to max, stopping at the first the pool lacks: each one's block, key and parent (disaggregated
 * prefill sends them). Returns how many. */
int wk_blocks_chain(const wk_blocks *b, uint64_t salt, const int32_t *tok, int n, int from, int max, int32_t *blk,
                    uint64_t *key, uint64_t *parent);
/* 1 when the pool caches this block now. */
int wk_blocks_holds(const wk_blocks *b, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok);
/* Counts a prefix-cache query of n tokens of which hit were found. */
void wk_blocks_count_query(wk_blocks *b, int n, int hit);

/* Makes the table cover positions [0, to) so that [from, to) can be written.
 * Shared blocks in the written range are replaced by private ones; when a
 * replaced block holds positions below from its content must be copied, and
 * the copy is listed in copies (only the block holding position from can
 * need one: copies has room for 1; *n_copies set). LLM_EAGAIN with nothing changed if there are not enough
 * blocks. */
int wk_blocks_reserve(wk_blocks *b, wk_bseq *s, int from, int to, wk_copy *copies, int *n_copies);
/* Blocks reserve(from, to) would take. */
int wk_blocks_needed(const wk_blocks *b, const wk_bseq *s, int from, int to);
/* The first n_done tokens tok[] of the sequence are computed: keys the full
 * blocks among them and publishes the new ones. */
void wk_blocks_commit(wk_blocks *b, wk_bseq *s, const int32_t *tok, int n_done);
/* Shortens the table to the blocks that cover positions [0, n) (speculative
 * decoding's rollback of rejected drafts): later blocks are dropped, last
 * first. n must not cut into a keyed block (n >= n_hashed * block_size):
 * LLM_EINVAL and nothing changed. */
int wk_blocks_truncate(wk_blocks *b, wk_bseq *s, int n);
/* Drops every block of the table (keyed ones stay cached). */
void wk_blocks_release(wk_blocks *b, wk_bseq *s);
/* dst (empty) shares every block of src. */
int wk_blocks_fork(wk_blocks *b, const wk_bseq *src, wk_bseq *dst);
/* Forgets every cached key not held by a sequence (a REMOVED event each). */
void wk_blocks_reset_cache(wk_blocks *b);
/* Moves up to max pending events to out, oldest first; returns how many. */
int wk_blocks_events(wk_blocks *b, wk_kv_event *out, int max);
/* Calls fn for every key in the cache (a router's full resync). */
void wk_blocks_each_key(const wk_blocks *b, void (*fn)(void *ctx, uint64_t key), void *ctx);

/* Frees the table's own memory (after release). */
void wk_bseq_free(wk_bseq *s);

/* Checks every invariant against the complete list of live tables: counts
 * equal table references, the free list holds exactly the unreferenced
 * blocks once each, every key is findable and points at its block, tables'
 * keys agree with their blocks. 0 or LLM_EINVAL with a message. */
int wk_blocks_check(const wk_blocks *b, const wk_bseq *const *seqs, int n_seqs, char *err, size_t errlen);

#endif
