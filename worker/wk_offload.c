/* wk_offload.c - the engine's lower KV tiers (wk_tier.h) under its block
 * pool: a keyed block the pool evicts goes down to host memory (then disk)
 * with its K/V; a prefix the pool lacks but a tier holds is loaded back into
 * free blocks by wk_blocks_match, as if computed. The CPU backend copies
 * blocks with memcpy; a device cache would stage them through pinned host
 * memory (docs/architecture.md), which is not built yet and is refused. */
#include "wk_engine_int.h"
#include "wk_tier.h"
#include "cm_error.h"
#include "cm_hash.h"
#include "cm_log.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <stdio.h>
#include <string.h>

typedef struct {
    wk_cache *c;
    int32_t blk;
} blkref;

/* A block's payload: for each layer its K then its V (wk_cache's layout). */
static void save(void *ctx, void *dst) {
    const blkref *r = ctx;
    const wk_cache *c = r->c;
    char *d = dst;
    for (int l = 0; l < c->n_layer; l++) {
        size_t at = ((size_t)l * (size_t)c->n_blocks + (size_t)r->blk) * c->block_stride;
        memcpy(d, c->k + at, c->block_stride);
        memcpy(d + c->block_stride, c->v + at, c->block_stride);
        d += 2 * c->block_stride;
    }
}

static void load(void *ctx, const void *src) {
    const blkref *r = ctx;
    wk_cache *c = r->c;
    const char *s = src;
    for (int l = 0; l < c->n_layer; l++) {
        size_t at = ((size_t)l * (size_t)c->n_blocks + (size_t)r->blk) * c->block_stride;
        memcpy(c->k + at, s, c->block_stride);
        memcpy(c->v + at, s + c->block_stride, c->block_stride);
        s += 2 * c->block_stride;
    }
}

static void on_evict(void *ctx, int32_t blk, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    wk_engine *e = ctx;
    blkref r = {e->cache, blk};
    wk_tier_put(e->tier, key, parent, salt, tok, save, &r);
}

static int on_has(void *ctx, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    wk_engine *e = ctx;
    return wk_tier_find(e->tier, key, parent, salt, tok) != 0;
}

static int on_load(void *ctx, int32_t blk, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    wk_engine *e = ctx;
    blkref r = {e->cache, blk};
    return wk_tier_load(e->tier, key, parent, salt, tok, load, &r);
}

static int on_prefetch(void *ctx, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    wk_engine *e = ctx;
    return wk_tier_prefetch(e->tier, key, parent, salt, tok);
}

static void on_event(void *ctx, int type, uint64_t key, uint64_t parent, int tier) {
    wk_engine *e = ctx;
    wk_blocks_emit(e->blocks, type, key, parent, tier);
}

static const wk_blocks_tier_ops OPS = {on_evict, on_has, on_load, on_prefetch};

/* What the K/V of a block depend on besides its tokens and salt: the weights and the cache's layout. A disk
 * tier's files carry it, so a file of another model, quantization or layout is never loaded. */
static uint64_t fingerprint(const wk_engine *e) {
    const cm_model_file *f = e->m->file;
    const wk_cache *c = e->cache;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    int64_t shape[6] = {c->n_layer, (int64_t)c->block_stride, c->block_size, c->type, (int64_t)f->n_tensors,
                        (int64_t)f->cfg.vocab};
    XXH3_64bits_update(&st, shape, sizeof shape);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const cm_tensor_ref *t = &f->tensors[i];
        XXH3_64bits_update(&st, t->name, strnlen(t->name, sizeof t->name));
        XXH3_64bits_update(&st, &t->nbytes, sizeof t->nbytes);
        /* a sample of the weights: the first 4 KiB of the first 64 tensors */
        if (i < 64 && t->data) XXH3_64bits_update(&st, t->data, t->nbytes < 4096 ? (size_t)t->nbytes : 4096);
    }
    return XXH3_64bits_digest(&st);
}

int wk_offload_init(wk_engine *e, char *err, size_t errlen) {
    const wk_engine_opts *o = &e->o;
    if (!o->kv_offload_bytes && !o->kv_offload_dir) return 0;
    if (!o->prefix_caching) {
        snprintf(err, errlen, "--kv-offloading-size / --kv-offloading-dir keep prefix-cache blocks: they need prefix "
                 "caching (drop --no-enable-prefix-caching)");
        return LLM_EINVAL;
    }
    if (e->cache->device) {
        snprintf(err, errlen, "--kv-offloading-size / --kv-offloading-dir: the lower KV tiers are built for the CPU "
                 "backend only (a device cache needs pinned host staging, not built yet)");
        return LLM_EUNSUP;
    }
    if (o->kv_offload_dir && e->m->max_loras) {
        snprintf(err, errlen, "--kv-offloading-dir with --enable-lora: a disk tier outlives the process, and an adapter "
                 "loaded again under its name after a restart would be served the K/V of the old one; use "
                 "--kv-offloading-size (memory) alone");
        return LLM_EUNSUP;
    }
    const wk_cache *c = e->cache;
    wk_tier_opts to = {
        .block_bytes = 2 * c->block_stride * (size_t)c->n_layer,
        .block_size = c->block_size,
        .ram_bytes = o->kv_offload_bytes,
        .disk_dir = o->kv_offload_dir,
        .disk_bytes = o->kv_offload_disk_bytes ? o->kv_offload_disk_bytes : (size_t)16 << 30,
        .fingerprint = wk_engine_kv_fingerprint(e),
        .event = on_event,
        .ctx = e,
    };
    int rc = wk_tier_create(&to, &e->tier, err, errlen);
    if (rc) return rc;
    wk_blocks_set_tier(e->blocks, &OPS, e);
    CM_INFO("KV tiers: %.1f MiB of host memory (%zu blocks)%s%s%s, %zu bytes a block",
            (double)to.ram_bytes / 1048576.0, to.ram_bytes / to.block_bytes, o->kv_offload_dir ? ", then disk in " : "",
            o->kv_offload_dir ? o->kv_offload_dir : "", o->kv_offload_dir ? "" : " (no disk tier)", to.block_bytes);
    return 0;
}

int wk_engine_tier_stats(const wk_engine *e, wk_tier_stats *st) {
    if (!e->tier) return LLM_ENOTFOUND;
    wk_tier_get_stats(e->tier, st);
    return 0;
}

void wk_engine_each_tier_key(const wk_engine *e, void (*fn)(void *ctx, uint64_t key, int tier), void *ctx) {
    if (e->tier) wk_tier_each_key(e->tier, fn, ctx);
}

/* ---- disaggregated prefill and decode ------------------------------------ */

size_t wk_engine_kv_block_bytes(const wk_engine *e) { return 2 * e->cache->block_stride * (size_t)e->cache->n_layer; }

uint64_t wk_engine_kv_fingerprint(wk_engine *e) {
    if (!e->kv_fp) e->kv_fp = fingerprint(e) | 1; /* never 0: 0 is "not asked yet" */
    return e->kv_fp;
}

int wk_engine_kv_export(wk_engine *e, uint64_t salt, const int32_t *tok, int n, int from, int max, wk_kv_block *out,
                        void *payload) {
    if (e->cache->device) return LLM_EUNSUP; /* device blocks would be staged through pinned host memory: not built */
    enum { STEP = 64 };
    int32_t blk[STEP];
    uint64_t key[STEP], parent[STEP];
    size_t bb = wk_engine_kv_block_bytes(e);
    int bs = e->cache->block_size, got = 0;
    while (got < max) {
        int want = max - got < STEP ? max - got : STEP;
        int k = wk_blocks_chain(e->blocks, salt, tok, n, from + got, want, blk, key, parent);
        for (int i = 0; i < k; i++) {
            blkref r = {e->cache, blk[i]};
            save(&r, (char *)payload + (size_t)(got + i) * bb);
            out[got + i] = (wk_kv_block){key[i], parent[i], tok + (size_t)(from + got + i) * bs};
        }
        got += k;
        if (k < want) break;
    }
    return got;
}

typedef struct {
    size_t bytes;
    const void *src;
} copy_ctx;

static void copy_in(void *ctx, void *dst) {
    const copy_ctx *c = ctx;
    memcpy(dst, c->src, c->bytes);
}

int wk_engine_kv_import(wk_engine *e, const wk_kv_block *b, uint64_t salt, const void *payload) {
    if (!e->tier) return LLM_EUNSUP;
    if (cm_block_key(b->parent, salt, b->tok, e->cache->block_size) != b->key) return LLM_EINVAL;
    if (wk_blocks_holds(e->blocks, b->key, b->parent, salt, b->tok)) return 1;
    copy_ctx c = {wk_engine_kv_block_bytes(e), payload};
    wk_tier_put(e->tier, b->key, b->parent, salt, b->tok, copy_in, &c);
    return 0;
}
