/* Fuzz target: the KV disk tier's block files (wk_tier.h), which a worker
 * reads back from a directory that outlives it (and that anything else on
 * the host could have written). The input is one block file, raw (first
 * byte even) or a valid file made from the input's bytes and then damaged
 * at the positions the rest of the input names (first byte odd). It is put
 * in a disk tier's directory, which is then opened and asked for the block
 * the file's header names. A block is served only from a file that passes
 * the format's checks, with exactly the file's payload; a valid, undamaged
 * file is always served. */
#include "cm_error.h"
#include "cm_hash.h"
#include "wk_blocks.h"
#include "wk_tier.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BS 4
#define PAYLOAD 48
#define FILE_BYTES (WK_TIER_HEADER + BS * 4 + PAYLOAD)
#define FP UINT64_C(0x5eed5eed5eed5eed)

static char root[64], dir[128];

static void cleanup(void) {
    rmdir(dir);
    rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(root, sizeof root, "/tmp/llmserve-fuzz-kvb-%d", (int)getpid());
    snprintf(dir, sizeof dir, "%s/%016" PRIx64, root, FP);
    atexit(cleanup);
    return 0;
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The format as wk_tier.h describes it, written independently of wk_tier.c. */
static void make_valid(const uint8_t *src, size_t n, uint8_t *f) {
    for (size_t i = 0; i < FILE_BYTES; i++) f[i] = n ? src[i % n] : (uint8_t)i;
    memset(f, 0, WK_TIER_HEADER);
    memcpy(f, "LLMSKVB1", 8);
    f[8] = 1;
    f[12] = BS;
    put64(f + 16, FP);
    int32_t tok[BS];
    memcpy(tok, f + WK_TIER_HEADER, sizeof tok);
    uint64_t parent = n > 8 ? get64(src + 1) : CM_BLOCK_ROOT, salt = n > 16 ? get64(src + 9) : 0;
    put64(f + 24, cm_block_key(parent, salt, tok, BS));
    put64(f + 32, parent);
    put64(f + 40, salt);
    put64(f + 48, PAYLOAD);
    put64(f + 56, XXH3_64bits(f, FILE_BYTES)); /* over the file with this field zero */
}

typedef struct {
    const uint8_t *want;
    int got, same;
} sink;

static void store(void *ctx, const void *src) {
    sink *s = ctx;
    s->got = 1;
    s->same = !memcmp(src, s->want, PAYLOAD);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    uint8_t valid[FILE_BYTES];
    const uint8_t *file = data + 1;
    size_t len = size - 1;
    int damaged = 0;
    if (data[0] & 1) {
        make_valid(data + 1, size - 1, valid);
        for (size_t i = 1 + 24; i + 3 <= size; i += 3) { /* (position, xor) from the input's tail */
            size_t at = ((size_t)data[i] | (size_t)data[i + 1] << 8) % FILE_BYTES;
            if (data[i + 2]) damaged = 1;
            valid[at] ^= data[i + 2];
        }
        file = valid;
        len = FILE_BYTES;
    }
    char path[200];
    uint64_t key = len >= 32 ? get64(file + 24) : 0;
    wk_tier_opts o = {.block_bytes = PAYLOAD, .block_size = BS, .disk_dir = root, .disk_bytes = 1 << 20,
                      .fingerprint = FP};
    char err[300] = "";
    wk_tier *t;
    if (wk_tier_create(&o, &t, err, sizeof err)) abort(); /* makes the directory */
    wk_tier_free(t);
    snprintf(path, sizeof path, "%s/%016" PRIx64 ".kvb", dir, key);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (len && fwrite(file, 1, len, f) != len) abort();
    fclose(f);
    if (wk_tier_create(&o, &t, err, sizeof err)) abort();
    int ok = wk_tier_check_file(file, len, BS, PAYLOAD, FP) == 0;
    if (len >= WK_TIER_HEADER + BS * 4) {
        int32_t tok[BS];
        memcpy(tok, file + WK_TIER_HEADER, sizeof tok);
        sink s = {file + WK_TIER_HEADER + BS * 4, 0, 0};
        int rc = wk_tier_load(t, key, get64(file + 32), get64(file + 40), tok, store, &s);
        if (rc == 0 && (!ok || !s.got || !s.same)) {
            fprintf(stderr, "fuzz_kvblock: a block was served from a file that fails the checks or with other bytes\n");
            abort();
        }
        if ((data[0] & 1) && !damaged && rc != 0) {
            fprintf(stderr, "fuzz_kvblock: a valid block file was not served (%d)\n", rc);
            abort();
        }
    }
    wk_tier_free(t);
    unlink(path);
    return 0;
}
