/* quant_test: the GGUF block formats decoded three ways agree with the gguf
 * Python package (llama.cpp's own reader), element for element, on random
 * blocks of every type we load (tests/data/quant_golden.bin, made by
 * tests/ref/quant_ref.py): cm_quant_at (the formula; the CUDA kernels' and
 * the CPU reference's), cm_unpack32 (the form the CPU kernels repack) and
 * kn_get_row (embedding rows). A corrupt or missing golden file fails. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_quant.h"
#include "cm_quantize.h"
#include "kernels.h"
#include "tst.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int close_to(float a, float ref) { return fabsf(a - ref) <= 1e-6f * fabsf(ref) + 1e-9f; }

static uint64_t rs = 88172645463325252ull;
static double gauss(void) { /* Box-Muller over xorshift */
    double u[2];
    for (int i = 0; i < 2; i++) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        u[i] = ((double)(rs >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* cm_quantize_row then cm_quant_at: the error of each format on Gaussian rows (with a few outliers, as
 * weights have) within what its bits allow, and better than plain round-to-nearest on the range would
 * give for the weighted columns when an importance is passed. */
static void roundtrip(void) {
    static const struct { int type; double max_rel; } T[] = {
        /* measured on this data, plus 15% */
        {CM_Q8_0, 0.0106}, {CM_Q6_K, 0.030}, {CM_Q5_K, 0.052}, {CM_Q5_1, 0.049}, {CM_Q5_0, 0.083}, {CM_Q4_K, 0.105},
        {CM_Q4_1, 0.101}, {CM_Q4_0, 0.164}, {CM_Q3_K, 0.213}, {CM_Q2_K, 0.336}};
    enum { N = 4096 };
    float *x = malloc(sizeof(float) * N), *imp = malloc(sizeof(float) * N);
    uint8_t *q = malloc(cm_dtype_row_bytes(CM_Q8_0, N) + 64);
    for (int i = 0; i < N; i++) {
        x[i] = (float)(0.02 * gauss() * (i % 97 == 0 ? 8 : 1));
        imp[i] = i % 4 == 0 ? 50.f : 1.f; /* every 4th column matters 50x more */
    }
    for (size_t t = 0; t < sizeof T / sizeof *T; t++) {
        double e = 0, s = 0, ew[2] = {0, 0};
        CHECK_RC(cm_quantize_row(T[t].type, x, N, NULL, q), 0);
        for (int i = 0; i < N; i++) {
            double d = cm_quant_at(T[t].type, q, i) - x[i];
            e += d * d, s += (double)x[i] * x[i];
        }
        double rel = sqrt(e / s);
        /* with the importance, the important columns' error falls */
        CHECK_RC(cm_quantize_row(T[t].type, x, N, imp, q), 0);
        for (int i = 0; i < N; i += 4) {
            double d = cm_quant_at(T[t].type, q, i) - x[i];
            ew[1] += d * d;
        }
        CHECK_RC(cm_quantize_row(T[t].type, x, N, NULL, q), 0);
        for (int i = 0; i < N; i += 4) {
            double d = cm_quant_at(T[t].type, q, i) - x[i];
            ew[0] += d * d;
        }
        printf("%-5s rel RMS error %.4f (bound %.3f); important columns' error x%.2f with the importance\n",
               cm_dtype_name(T[t].type), rel, T[t].max_rel, sqrt(ew[1] / ew[0]));
        CHECK(rel < T[t].max_rel);
        CHECK(T[t].type == CM_Q8_0 || ew[1] < ew[0]);
    }
    /* no worse than plain round-to-nearest (the largest magnitude to level -8, as ggml's reference Q4_0) */
    CHECK_RC(cm_quantize_row(CM_Q4_0, x, N, NULL, q), 0);
    double e_fit = 0, e_rtn = 0;
    for (int b = 0; b < N / 32; b++) {
        float xm = 0;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[32 * b + i]) > fabsf(xm)) xm = x[32 * b + i];
        float d = cm_f16_to_f32(cm_f32_to_f16(xm / -8.f));
        for (int i = 0; i < 32; i++) {
            int v = d != 0 ? (int)lrintf(x[32 * b + i] / d) : 0;
            v = v < -8 ? -8 : v > 7 ? 7 : v;
            double r1 = d * v - x[32 * b + i], r2 = cm_quant_at(CM_Q4_0, q, 32 * b + i) - x[32 * b + i];
            e_rtn += r1 * r1, e_fit += r2 * r2;
        }
    }
    printf("Q4_0 against round-to-nearest: error x%.3f\n", sqrt(e_fit / e_rtn));
    CHECK(e_fit <= e_rtn);
    /* a row that is already on a format's grid comes back unchanged */
    static const int exact[] = {CM_Q8_0, CM_Q4_0, CM_Q5_0};
    for (size_t t = 0; t < 3; t++) {
        float *y = malloc(sizeof(float) * N);
        CHECK_RC(cm_quantize_row(exact[t], x, N, NULL, q), 0);
        for (int i = 0; i < N; i++) y[i] = cm_quant_at(exact[t], q, i);
        CHECK_RC(cm_quantize_row(exact[t], y, N, NULL, q), 0);
        int diff = 0;
        for (int i = 0; i < N; i++) diff += fabsf(cm_quant_at(exact[t], q, i) - y[i]) > 1e-6f * fabsf(y[i]) + 1e-9f;
        CHECK_INT(diff, 0);
        free(y);
    }
    CHECK_RC(cm_quantize_row(CM_Q4_K, x, 100, NULL, q), LLM_EINVAL); /* not whole blocks */
    CHECK_RC(cm_quantize_row(CM_Q8_K, x, 256, NULL, q), LLM_EUNSUP);
    free(x);
    free(imp);
    free(q);
}

int main(int argc, char **argv) {
    roundtrip();
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
