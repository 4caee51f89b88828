/* quant_test: the GGUF block formats decoded three ways agree with the gguf
 * Python package (llama.cpp's own reader), element for element, on random
 * blocks of every type we load (tests/data/quant_golden.bin, made by
 * tests/ref/quant_ref.py): cm_quant_at (the formula; the CUDA kernels' and
 * the CPU reference's), cm_unpack32 (the form the CPU kernels repack) and
 * kn_get_row (embedding rows). A corrupt or missing golden file fails. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_quant.h"
#include "kernels.h"
#include "tst.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int close_to(float a, float ref) { return fabsf(a - ref) <= 1e-6f * fabsf(ref) + 1e-9f; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: quant_test quant_golden.bin\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    CHECK(f != NULL);
    if (!f) return tst_done("quant_test");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)len);
    CHECK(buf && fread(buf, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    CHECK(len > 8 && !memcmp(buf, "LQNT", 4));
    uint32_t count;
    memcpy(&count, buf + 4, 4);
    CHECK_INT((int)count, 10); /* Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K */
    size_t off = 8;
    int seen = 0;
    for (uint32_t t = 0; t < count && off + 8 <= (size_t)len; t++) {
        uint32_t type, nblocks;
        memcpy(&type, buf + off, 4);
        memcpy(&nblocks, buf + off + 4, 4);
        off += 8;
        size_t bb = cm_dtype_block_bytes((int)type), be = cm_dtype_block((int)type);
        CHECK(cm_quant_known((int)type) && bb && be);
        size_t nel = be * nblocks, raw_bytes = bb * nblocks;
        CHECK(off + raw_bytes + 4 * nel <= (size_t)len);
        if (!cm_quant_known((int)type) || off + raw_bytes + 4 * nel > (size_t)len) break;
        const uint8_t *raw = buf + off;
        float *ref = malloc(4 * nel), *row = malloc(4 * nel);
        memcpy(ref, raw + raw_bytes, 4 * nel);
        int bad_at = 0, bad_unpack = 0, bad_row = 0, bad_wide = 0;
        for (size_t i = 0; i < nel; i++) bad_at += !close_to(cm_quant_at((int)type, raw, (int64_t)i), ref[i]);
        for (size_t b = 0; b < nel / 32; b++) {
            uint8_t u[32];
            float d[2], m[2];
            cm_unpack32((int)type, raw, (int64_t)b, u, d, m);
            for (int j = 0; j < 32; j++) {
                bad_unpack += !(fabsf(d[j / 16] * (float)u[j] + m[j / 16] - ref[32 * b + j]) <= 1e-5f * (fabsf(ref[32 * b + j]) + 0.01f));
                /* the 4-bit types' u fit kn_pq4's nibbles; the rest kn_pq8h's 0..63 (Q8_0: 0..255) */
                int lim = type == CM_Q4_0 || type == CM_Q4_1 || type == CM_Q4_K ? 16 : type == CM_Q8_0 ? 256 : 64;
                bad_wide += u[j] >= lim;
            }
        }
        kn_weight w; /* the whole run as one row */
        CHECK_RC(kn_weight_init(&w, (int)type, 1, (int64_t)nel, raw), 0);
        kn_get_row(&w, 0, row);
        for (size_t i = 0; i < nel; i++)
            bad_row += !(fabsf(row[i] - ref[i]) <= 1e-5f * (fabsf(ref[i]) + 0.01f));
        kn_weight_free(&w);
        if (bad_at || bad_unpack || bad_row || bad_wide)
            fprintf(stderr, "%s: %d of %zu elements differ (formula), %d (unpack32), %d (get_row), %d too wide\n",
                    cm_dtype_name((int)type), bad_at, nel, bad_unpack, bad_row, bad_wide);
        CHECK_INT(bad_at, 0);
        CHECK_INT(bad_unpack, 0);
        CHECK_INT(bad_row, 0);
        CHECK_INT(bad_wide, 0);
        seen++;
        off += raw_bytes + 4 * nel;
        free(ref);
        free(row);
    }
    CHECK_INT(seen, 10);
    CHECK(off == (size_t)len);
    free(buf);
    return tst_done("quant_test");
}
