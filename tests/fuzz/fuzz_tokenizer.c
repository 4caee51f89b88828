/* Fuzz target: the tokenizer on arbitrary bytes. Byte 0 bit 0: parse
 * special tokens; the rest is the text. The tokenizer is the model's named
 * by $LLMSERVE_FUZZ_MODEL (a GGUF file; the default model in ctest), else a
 * synthetic one. Every input must encode into ids inside the vocabulary,
 * decode back to the same bytes (byte-level BPE), stop early under a token
 * limit, and take time linear in its length: 100 ms plus 20 us a byte (twice,
 * so a busy machine's stall is not taken for a quadratic path) is
 * far above the worst linear case (about 0.4 us a byte) and far below what
 * a quadratic path takes on the long inputs the drivers build. */
#include "cm_error.h"
#include "cm_time.h"
#include "cm_gguf.h"
#include "cm_oai.h"
#include "cm_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static cm_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("LLMSERVE_FUZZ_MODEL");
    char err[512] = "";
    if (path && *path) {
        cm_gguf *g;
        if (cm_gguf_open(path, &g, err, sizeof err) || cm_tok_from_gguf(g, &tok, err, sizeof err)) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", err);
            return 1;
        }
        cm_gguf_close(g);
        fprintf(stderr, "fuzz_tokenizer: the tokenizer of %s\n", path);
    } else if (cm_tok_synthetic(512, &tok)) {
        return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size || !tok) return 0;
    int special = data[0] & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    double t0 = cm_now();
    int rc = cm_tok_encode(tok, text, len, 0, special, &ids, &n);
    double dt = cm_now() - t0, bound = 0.1 + 20e-6 * (double)len;
    if (dt > bound) { /* again, before calling it quadratic: the machine may have been busy */
        int32_t *again;
        size_t na;
        t0 = cm_now();
        if (cm_tok_encode(tok, text, len, 0, special, &again, &na) == 0) free(again);
        double dt2 = cm_now() - t0;
        if (dt2 > bound) {
            fprintf(stderr, "fuzz_tokenizer: %zu bytes took %.3f s and %.3f s: not linear\n", len, dt, dt2);
            abort();
        }
    }
    if (rc) {
        if (rc != LLM_ENOMEM) abort();
        return 0;
    }
    int32_t V = cm_tok_vocab(tok);
    size_t out_len = 0;
    char *back = malloc(len + 1);
    int same = back != NULL, unk = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) abort();
        unk |= ids[i] == cm_tok_unk(tok);
        const char *b;
        size_t bl;
        if (cm_tok_piece(tok, ids[i], 1, &b, &bl)) abort();
        if (same && out_len + bl <= len) memcpy(back + out_len, b, bl);
        else same = 0;
        out_len += bl;
    }
    /* valid UTF-8 only: a byte-level vocabulary may lack the bytes that UTF-8
     * never uses (SmolLM2's has no 0xC0, 0xC1, 0xF5-0xFF), and every
     * client's text is checked before it is tokenized; nor when a byte the
     * vocabulary lacks (SmolLM2 has no 0xF1: planes 4-7) became the unknown
     * token, as it does in the model's own tokenizer */
    if (cm_tok_kind(tok) == CM_TOK_BPE && cm_utf8_valid(text, len) && !unk && (!same || out_len != len || memcmp(back, text, len))) {
        fprintf(stderr, "fuzz_tokenizer: %zu bytes decode to %zu other bytes\n", len, out_len);
        abort();
    }
    free(back);
    if (n > 2) { /* a limit below the count stops early with LLM_ERANGE */
        int32_t *lim;
        size_t nl;
        if (cm_tok_encode_limit(tok, text, len, 0, special, n - 1, &lim, &nl) != LLM_ERANGE || lim) abort();
        if (cm_tok_encode_limit(tok, text, len, 0, special, n, &lim, &nl) || nl != n || memcmp(lim, ids, n * sizeof *ids))
            abort();
        free(lim);
    }
    free(ids);
    return 0;
}
