/* wk_tier.h - the KV cache's lower tiers: host memory (tier 2) and local
 * disk (tier 3) under the engine's block pool (tier 1).
 *
 * A keyed block the pool evicts is put here instead of vanishing (its K and
 * V for every layer, block_bytes, in the layout wk_cache_block_save writes).
 * The memory tier is bounded in bytes, least recently used first. The disk
 * tier is a directory of one file per block, bounded in bytes, written
 * through (a block put is queued for the disk at once, so a kill loses only
 * the writes in flight), that outlives the process: a restarted worker finds
 * its blocks again. The files are written, and read ahead into memory
 * (wk_tier_prefetch), by a thread of the tier's own, off the engine's step;
 * a block is on disk (and announced) once written.
 *
 * A block is named as in the pool: its key, parent key, salt and tokens, all
 * verified on a find, so a 64-bit collision is a miss, never wrong K/V. A
 * block file carries the model's fingerprint and a checksum over all of it;
 * a file that is truncated, corrupt or of another shape is dropped (and
 * counted), never served.
 *
 * On-disk format (little-endian), WK_TIER_HEADER bytes of header:
 *   magic "LLMSKVB1", u32 version 1, u32 block_size, u64 model fingerprint,
 *   u64 key, u64 parent, u64 salt, u64 payload bytes, u64 XXH3 checksum of
 *   the whole file with this field zero; then block_size int32 tokens, then
 *   the payload. Written to a temporary name and renamed: a crash leaves a
 *   whole file or a temporary one (removed at start).
 *
 * Not thread-safe: the engine's thread owns it (its writer thread shares
 * only the queue). */
#ifndef WK_TIER_H
#define WK_TIER_H

#include <stddef.h>
#include <stdint.h>

enum { WK_TIER_POOL = 1, WK_TIER_RAM = 2, WK_TIER_DISK = 3 };
#define WK_TIER_HEADER 64

typedef struct {
    size_t block_bytes;      /* one block's payload */
    int block_size;          /* tokens per block */
    size_t ram_bytes;        /* memory tier's bound; 0: none */
    const char *disk_dir;    /* disk tier's directory (made if missing); NULL: none */
    size_t disk_bytes;       /* disk tier's bound */
    uint64_t fingerprint;    /* the model and KV layout: another's files are not used */
    /* where a block enters (type WK_EV_STORED) or leaves (WK_EV_REMOVED) a tier */
    void (*event)(void *ctx, int type, uint64_t key, uint64_t parent, int tier);
    void *ctx;
} wk_tier_opts;

typedef struct {
    uint64_t ram_blocks, disk_blocks;      /* held now */
    uint64_t ram_bytes, disk_bytes;
    uint64_t puts, ram_hits, disk_hits;    /* blocks */
    uint64_t bytes_out, bytes_in;          /* offloaded to the tiers, loaded back */
    uint64_t dropped;                      /* evicted from the last tier */
    uint64_t corrupt, write_errors;        /* block files refused; writes that failed (a full disk) or were
                                              shed (the writer 64 MiB behind) */
    double load_ms_sum;                    /* loads back, their time */
    uint64_t load_ms_bucket[8];            /* loads of <= 0.1, 0.25, 0.5, 1, 2.5, 5, 10 ms, more */
} wk_tier_stats;

typedef struct wk_tier wk_tier;

/* Opens the tiers; the disk tier's existing files are indexed (their
 * checksums are verified when loaded). err gets the reason on failure. */
int wk_tier_create(const wk_tier_opts *o, wk_tier **out, char *err, size_t errlen);
void wk_tier_free(wk_tier *t);

/* A block leaving the pool: fill writes its payload into dst (block_bytes).
 * A block the tiers hold already is refreshed, not copied again. */
void wk_tier_put(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok,
                 void (*fill)(void *ctx, void *dst), void *ctx);
/* The tier that holds the block (WK_TIER_RAM or WK_TIER_DISK), or 0. */
int wk_tier_find(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok);
/* The block's payload for the pool: store(ctx, src) copies it in. A memory
 * block leaves that tier (the pool holds it now); a disk block stays on disk.
 * 0, LLM_ENOENT (not held), or LLM_EIO (its file was bad: dropped). */
int wk_tier_load(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok,
                 void (*store)(void *ctx, const void *src), void *ctx);
/* Readies the block for a load that does not wait on the disk: 1 a load now finds it in memory (or reads it
 * itself: no memory tier), 2 it is being read into memory (ask again), 0 not held. */
int wk_tier_prefetch(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok);
/* Calls fn for every block held, with its tier (a router's full resync). */
void wk_tier_each_key(wk_tier *t, void (*fn)(void *ctx, uint64_t key, int tier), void *ctx);
void wk_tier_get_stats(wk_tier *t, wk_tier_stats *st);
/* Waits for the disk writer to finish what is queued (tests; a stop does it too). */
void wk_tier_flush(wk_tier *t);

/* Checks one block file's bytes as a load does (the fuzz target's entry):
 * 0 when it is whole and of this shape, else LLM_EIO. */
int wk_tier_check_file(const void *buf, size_t len, int block_size, size_t block_bytes, uint64_t fingerprint);

#endif
