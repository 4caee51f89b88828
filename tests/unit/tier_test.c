/* tier_test: the lower KV tiers (wk_tier) under a real block manager.
 *
 * A model of the KV cache holds each slot's token id (as blocks_test does);
 * a block's payload is its slots. Prompts from a set of shared prefixes,
 * more than the pool holds, go through match / reserve / commit / release
 * with the tiers plugged in: every block a match returns, from the pool or
 * loaded back from memory or disk, must hold its own tokens. Then the disk
 * tier across a restart, a corrupt and a truncated block file (dropped,
 * never served), a file of another model, its byte bound, a full disk
 * (RLIMIT_FSIZE), and the events that mirror what each tier holds. */
#include "cm_error.h"
#include "cm_hash.h"
#include "tst.h"
#include "wk_blocks.h"
#include "wk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define BS 4
#define POOL 12
#define PAYLOAD (BS * sizeof(int32_t) + 40) /* the slots, then padding that must come back too */

static int32_t slots[POOL][BS];
static wk_tier *tier;
static wk_blocks *blocks;

typedef struct {
    uint64_t keys[4096];
    int tier[4096];
    int n;
} mirror;
static mirror mir;

static void mir_apply(int type, uint64_t key, int t) {
    for (int i = 0; i < mir.n; i++)
        if (mir.keys[i] == key && mir.tier[i] == t) {
            if (type == WK_EV_REMOVED) {
                mir.keys[i] = mir.keys[--mir.n];
                mir.tier[i] = mir.tier[mir.n];
            }
            return;
        }
    if (type == WK_EV_STORED && mir.n < 4096) {
        mir.keys[mir.n] = key;
        mir.tier[mir.n++] = t;
    }
}

static void on_event(void *ctx, int type, uint64_t key, uint64_t parent, int t) {
    (void)ctx;
    (void)parent;
    mir_apply(type, key, t);
}

static void save(void *ctx, void *dst) {
    int32_t blk = *(int32_t *)ctx;
    memcpy(dst, slots[blk], sizeof slots[blk]);
    for (size_t i = sizeof slots[blk]; i < PAYLOAD; i++) ((char *)dst)[i] = (char)(slots[blk][0] + (int)i);
}

static int loaded_bad;
static void store(void *ctx, const void *src) {
    int32_t blk = *(int32_t *)ctx;
    memcpy(slots[blk], src, sizeof slots[blk]);
    for (size_t i = sizeof slots[blk]; i < PAYLOAD; i++)
        if (((const char *)src)[i] != (char)(slots[blk][0] + (int)i)) loaded_bad++;
}

static void ev_evict(void *ctx, int32_t blk, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    (void)ctx;
    wk_tier_put(tier, key, parent, salt, tok, save, &blk);
}
static int ev_has(void *ctx, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    (void)ctx;
    return wk_tier_find(tier, key, parent, salt, tok) != 0;
}
static int ev_load(void *ctx, int32_t blk, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    (void)ctx;
    return wk_tier_load(tier, key, parent, salt, tok, store, &blk);
}
static int ev_prefetch(void *ctx, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    (void)ctx;
    return wk_tier_prefetch(tier, key, parent, salt, tok);
}
static const wk_blocks_tier_ops OPS = {ev_evict, ev_has, ev_load, ev_prefetch};

static int open_tier(const char *dir, size_t ram_blocks, size_t disk_blocks, uint64_t fp) {
    size_t file = WK_TIER_HEADER + BS * sizeof(int32_t) + PAYLOAD;
    wk_tier_opts o = {.block_bytes = PAYLOAD, .block_size = BS, .ram_bytes = ram_blocks * PAYLOAD, .disk_dir = dir,
                      .disk_bytes = disk_blocks * file, .fingerprint = fp, .event = on_event};
    char err[300] = "";
    int rc = wk_tier_create(&o, &tier, err, sizeof err);
    if (rc) fprintf(stderr, "tier: %s\n", err);
    return rc;
}

/* Prompt p of the set: 3 blocks of a prefix shared by p / 2, then a tail of its own. */
static int prompt(int p, int32_t *tok) {
    for (int i = 0; i < 3 * BS; i++) tok[i] = 1000 * (p / 2 + 1) + i;
    for (int i = 3 * BS; i < 4 * BS + 1; i++) tok[i] = 7 * p + i;
    return 4 * BS + 1;
}

/* Runs prompt p as the engine would; returns the tokens matched, checks every matched block's slots. */
static int run(int p, int *bad) {
    int32_t tok[64];
    int n = prompt(p, tok);
    wk_bseq s = {0};
    int got = wk_blocks_match(blocks, &s, tok, n);
    for (int b = 0; b < got / BS; b++)
        for (int r = 0; r < BS; r++) *bad += slots[s.ids[b]][r] != tok[b * BS + r];
    wk_copy cp[1];
    int ncp;
    if (wk_blocks_reserve(blocks, &s, got, n, cp, &ncp) == 0) {
        for (int pos = got; pos < n; pos++) slots[s.ids[pos / BS]][pos % BS] = tok[pos]; /* "compute" */
        wk_blocks_commit(blocks, &s, tok, n);
    }
    wk_blocks_release(blocks, &s);
    wk_bseq_free(&s);
    wk_kv_event ev[64];
    int ne;
    while ((ne = wk_blocks_events(blocks, ev, 64)) > 0) (void)ne; /* the pool's own: blocks_test checks them */
    if (p % 3 == 0) wk_tier_flush(tier); /* now and then the writer catches up: in between blocks are in flight */
    return got;
}

typedef struct {
    int n, unknown;
} tally;
static void tally_cb(void *ctx, uint64_t key, int t) {
    tally *y = ctx;
    y->n++;
    int found = 0;
    for (int i = 0; i < mir.n; i++) found |= mir.keys[i] == key && mir.tier[i] == t;
    y->unknown += !found;
}

static void events_agree(void) {
    tally y = {0, 0};
    wk_tier_each_key(tier, tally_cb, &y);
    CHECK_INT(y.unknown, 0);
    CHECK_INT(y.n, mir.n);
}

static int files_in(const char *dir, const char *ext, char *first, size_t len) { /* first: the first one's path */
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name), e = strlen(ext);
        if (l > e && !strcmp(de->d_name + l - e, ext)) {
            if (!n && first) snprintf(first, len, "%s/%s", dir, de->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

int main(void) {
    char root[] = "/tmp/llmserve-tier-test-XXXXXX";
    if (!mkdtemp(root)) return 1;
    char sub[600];
    snprintf(sub, sizeof sub, "%s/%016llx", root, 0x1234ull);

    /* the pool of 12 blocks, memory for 8, disk for 128 (written through): 40 prompts of 20 shared prefixes,
     * 100 blocks in all */
    CHECK_RC(wk_blocks_create(POOL, BS, 1, &blocks), 0);
    CHECK_RC(open_tier(root, 8, 128, 0x1234), 0);
    wk_blocks_set_tier(blocks, &OPS, NULL);
    int bad = 0, hits = 0;
    unsigned r = 12345;
    for (int k = 0; k < 400; k++) {
        r = r * 1103515245u + 12345u;
        hits += run((int)(r >> 16) % 40, &bad) > 0;
    }
    CHECK_INT(bad, 0);
    CHECK_INT(loaded_bad, 0);
    wk_tier_flush(tier);
    wk_tier_stats st;
    wk_tier_get_stats(tier, &st);
    CHECK(hits > 360);
    CHECK(st.ram_hits > 0 && st.disk_hits > 0 && st.puts > 0);
    CHECK(st.ram_blocks <= 8 && st.ram_blocks > 0 && st.disk_blocks <= 128 && st.disk_blocks > 0);
    CHECK_INT(st.corrupt + st.write_errors, 0);
    CHECK(st.bytes_in == (st.ram_hits + st.disk_hits) * PAYLOAD);
    events_agree();
    char err[200];
    CHECK_RC(wk_blocks_check(blocks, NULL, 0, err, sizeof err), 0);

    /* a restart: the memory tier and the pool are gone, the disk tier is found and served */
    uint64_t on_disk = st.disk_blocks;
    wk_tier_free(tier);
    wk_blocks_free(blocks);
    mir.n = 0;
    memset(slots, 0, sizeof slots);
    CHECK_RC(wk_blocks_create(POOL, BS, 1, &blocks), 0);
    CHECK_RC(open_tier(root, 0, 128, 0x1234), 0);
    wk_blocks_set_tier(blocks, &OPS, NULL);
    wk_tier_get_stats(tier, &st);
    CHECK_INT(st.disk_blocks, on_disk);
    int found = 0;
    for (int p = 0; p < 40; p++) found += run(p, &bad) > 0;
    CHECK_INT(found, 40); /* written through: the disk held every block */
    CHECK_INT(bad, 0);
    wk_tier_get_stats(tier, &st);
    CHECK(st.disk_hits > 0);

    /* read ahead: with a memory tier, the blocks a prompt needs from disk are read by the tiers' thread into
     * memory first (prefetch says how many are on their way), then loaded without touching the disk */
    wk_tier_free(tier);
    wk_blocks_free(blocks);
    CHECK_RC(wk_blocks_create(POOL, BS, 1, &blocks), 0);
    CHECK_RC(open_tier(root, 8, 128, 0x1234), 0);
    wk_blocks_set_tier(blocks, &OPS, NULL);
    {
        int32_t tok[64];
        int n = prompt(5, tok);
        int pend = wk_blocks_prefetch(blocks, 0, tok, n);
        CHECK_INT(pend, 4); /* its 4 full blocks below the last token, all on disk */
        wk_tier_flush(tier);
        CHECK_INT(wk_blocks_prefetch(blocks, 0, tok, n), 0);
        wk_tier_get_stats(tier, &st);
        CHECK_INT(st.ram_blocks, 4);
        uint64_t disk_before = st.disk_hits;
        CHECK_INT(run(5, &bad), 16);
        CHECK_INT(bad, 0);
        wk_tier_get_stats(tier, &st);
        CHECK_INT(st.disk_hits - disk_before, 4); /* counted where they came from */
        CHECK_INT(st.ram_hits, 0);
    }

    /* a corrupt block file: refused at load (checksum), deleted, counted, the block recomputed */
    char path[1200];
    wk_tier_free(tier);
    wk_blocks_free(blocks);
    CHECK_RC(wk_blocks_create(POOL, BS, 1, &blocks), 0);
    CHECK_RC(open_tier(root, 0, 64, 0x1234), 0);
    wk_blocks_set_tier(blocks, &OPS, NULL);
    int before = files_in(sub, ".kvb", NULL, 0);
    CHECK(before > 0);
    int corrupted = 0;
    DIR *d = opendir(sub);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".kvb")) { /* one byte of every payload */
            snprintf(path, sizeof path, "%.600s/%.255s", sub, de->d_name);
            int fd = open(path, O_RDWR);
            char c;
            off_t at = WK_TIER_HEADER + BS * 4 + 3;
            if (fd >= 0 && pread(fd, &c, 1, at) == 1) {
                c ^= 0x20;
                corrupted += pwrite(fd, &c, 1, at) == 1;
            }
            if (fd >= 0) close(fd);
        }
    if (d) closedir(d);
    CHECK_INT(corrupted, before);
    loaded_bad = 0;
    for (int p = 0; p < 40; p++) run(p, &bad);
    CHECK_INT(bad, 0);
    CHECK_INT(loaded_bad, 0);
    wk_tier_get_stats(tier, &st);
    CHECK(st.corrupt > 0);
    CHECK_INT(st.disk_hits, 0);

    /* a truncated file and a stray temporary one: dropped at the start; another model's directory unseen */
    wk_tier_free(tier);
    CHECK(files_in(sub, ".kvb", path, sizeof path) > 0);
    CHECK(truncate(path, 30) == 0);
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s/00000000000000aa.tmp", sub);
    FILE *f = fopen(tmp, "w");
    if (f) fclose(f);
    int n_files = files_in(sub, ".kvb", NULL, 0);
    CHECK_RC(open_tier(root, 0, 64, 0x1234), 0);
    wk_tier_get_stats(tier, &st);
    CHECK_INT(st.corrupt, 1);
    CHECK_INT(st.disk_blocks, n_files - 1);
    CHECK_INT(files_in(sub, ".tmp", NULL, 0), 0);
    wk_tier_free(tier);
    CHECK_RC(open_tier(root, 0, 64, 0x9999), 0);
    wk_tier_get_stats(tier, &st);
    CHECK_INT(st.disk_blocks, 0);
    wk_tier_free(tier);

    /* the disk bound: 5 files at most, the oldest go first */
    CHECK_RC(open_tier(root, 0, 5, 0x1234), 0);
    wk_tier_get_stats(tier, &st);
    CHECK(st.disk_blocks <= 5);
    wk_blocks_set_tier(blocks, &OPS, NULL);
    for (int p = 0; p < 40; p++) run(p, &bad);
    wk_tier_flush(tier);
    wk_tier_get_stats(tier, &st);
    CHECK(st.disk_blocks <= 5 && st.dropped > 0);
    CHECK(files_in(sub, ".kvb", NULL, 0) <= 5);
    CHECK_INT(bad, 0);

    /* a full disk: writes fail (counted, the block dropped), no partial file is left, serving goes on */
    wk_tier_free(tier);
    CHECK_RC(open_tier(root, 0, 64, 0x4321), 0);
    wk_blocks_set_tier(blocks, &OPS, NULL);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim = {100, 100};
    getrlimit(RLIMIT_FSIZE, &old);
    lim.rlim_max = old.rlim_max;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    for (int p = 0; p < 40; p++) run(p, &bad);
    wk_tier_flush(tier);
    setrlimit(RLIMIT_FSIZE, &old);
    wk_tier_get_stats(tier, &st);
    CHECK(st.write_errors > 0);
    CHECK_INT(st.disk_blocks, 0);
    char sub2[600];
    snprintf(sub2, sizeof sub2, "%s/%016llx", root, 0x4321ull);
    CHECK_INT(files_in(sub2, ".kvb", NULL, 0) + files_in(sub2, ".tmp", NULL, 0), 0);
    CHECK_INT(bad, 0);
    wk_tier_free(tier);
    wk_blocks_free(blocks);

    /* the file check on bytes that are not a block file */
    unsigned char junk[WK_TIER_HEADER + BS * 4 + PAYLOAD];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 31 + 7);
    CHECK_RC(wk_tier_check_file(junk, sizeof junk, BS, PAYLOAD, 0x1234), LLM_EIO);
    CHECK_RC(wk_tier_check_file(junk, 10, BS, PAYLOAD, 0x1234), LLM_EIO);

    /* nothing to hold, and a directory that cannot be made */
    wk_tier_opts o = {.block_bytes = PAYLOAD, .block_size = BS};
    CHECK_RC(wk_tier_create(&o, &tier, err, sizeof err), LLM_EINVAL);
    o.disk_dir = "/proc/llmserve-no";
    o.disk_bytes = 1 << 20;
    CHECK_RC(wk_tier_create(&o, &tier, err, sizeof err), LLM_EIO);
    CHECK(strstr(err, "--kv-offloading-dir") != NULL);

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "tier_test: could not remove %s\n", root);
    printf("tier_test: %d checks, %d failed\n", tst_checks, tst_failures);
    return tst_failures ? 1 : 0;
}
