/* gw_cache.h - the response cache behind --semantic-cache.
 *
 * Answers are stored under a scope (a hash of everything but the last user
 * turn that could change the answer: tenant, model, sampling parameters,
 * tools and structured-output schemas, cache_salt, the earlier messages)
 * and, within it, an exact key (the last user turn, whitespace- and
 * case-normalised) and optionally that turn's sentence embedding. A lookup
 * never leaves its scope, so one tenant's answer never reaches another and
 * a request with other parameters or another schema never gets it.
 *
 * The semantic index is flat: the cosine of the query against every entry
 * of its scope (unit vectors: a dot product), O(entries in the scope x
 * dim). The scan reads int8 copies of the vectors (a quarter of the
 * memory traffic), then the few best are scored again in float, so the
 * similarity that decides is exact. docs/tuning.md has the measured cost
 * against entries. Entries leave by TTL (checked on
 * lookup) and least-recently-used order past the size bound. Everything
 * here runs on the gateway's loop thread. */
#ifndef GW_CACHE_H
#define GW_CACHE_H

#include "cm_idmap.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gw_centry {
    struct gw_centry *lru_prev, *lru_next;     /* most recent first */
    struct gw_centry *sc_prev, *sc_next;       /* its scope's entries */
    uint64_t scope, exact;
    double created;
    float *vec;                                /* [dim] unit length, or NULL */
    int8_t *q8;                                /* [dim] vec in int8, q8 * q8_scale = vec (the scan reads these) */
    float q8_scale;
    char *text;                                /* the answer */
    size_t len;
    int finish;                                /* CM_OAI_FINISH_STOP or _LENGTH */
    int completion_tokens;
} gw_centry;

typedef struct {
    int max_entries, dim;
    double ttl;
    float threshold, near;                     /* a semantic hit; a near miss is within near below it */
    cm_idmap exact;                              /* exact key ^ scope -> entry */
    cm_idmap scopes;                             /* scope -> its first entry */
    gw_centry *lru_head, *lru_tail;
    int n;
    size_t bytes;
    uint64_t hits_exact, hits_semantic, misses, near_misses, evictions, expired, inserts;
    uint64_t saved_prompt_tokens, saved_completion_tokens;
} gw_cache;

typedef struct {
    const gw_centry *e;                        /* the hit, or NULL */
    float similarity;                          /* semantic: the best cosine in the scope (-2: none) */
    int exact;                                 /* the hit was exact */
} gw_cache_hit;

void gw_cache_init(gw_cache *c, int max_entries, double ttl, float threshold, int dim);
void gw_cache_free(gw_cache *c);
/* The exact entry of (scope, exact), if fresh. */
int gw_cache_get_exact(gw_cache *c, uint64_t scope, uint64_t exact, double now, gw_cache_hit *out);
/* The nearest entry of scope to vec (unit length, c->dim), a hit when its
 * cosine reaches the threshold. Counts a hit, a near miss or a miss. */
int gw_cache_get_similar(gw_cache *c, uint64_t scope, const float *vec, double now, gw_cache_hit *out);
/* Stores an answer (copies text and vec; vec may be NULL); replaces the
 * entry of the same exact key; evicts past the size bound. LLM_ENOMEM. */
int gw_cache_put(gw_cache *c, uint64_t scope, uint64_t exact, const float *vec, const char *text, size_t len, int finish,
                 int completion_tokens, double now);
/* The exact key of a user turn: XXH3 of its text with runs of whitespace
 * made one space, the ends trimmed and ASCII letters lowercased. */
uint64_t gw_cache_exact_key(const char *text, size_t len);

/* context_overflow summarize: the summaries of dropped turns, by their
 * transcript's hash, the newest GW_SUMS of them (oldest out first). */
#define GW_SUMS 256
typedef struct {
    cm_idmap map;                /* key -> malloc'd NUL-terminated text */
    uint64_t ring[GW_SUMS];      /* keys in insertion order */
    int at, n;
} gw_sums;

/* NULL when absent. */
const char *gw_sums_get(const gw_sums *s, uint64_t key);
/* Keeps a copy of text[0, len) under key (a key held already keeps its
 * first text); the oldest goes when full. 0 or LLM_ENOMEM. */
int gw_sums_put(gw_sums *s, uint64_t key, const char *text, size_t len);
void gw_sums_free(gw_sums *s);

#endif
