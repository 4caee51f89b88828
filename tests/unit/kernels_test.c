/* CPU kernels: every SIMD path against the scalar references, over random
 * shapes and data, with guard values past the end of every output. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "kernels.h"
#include "tst.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)rnd() / 65535.f / 32768.f * 2.f - 1.f; }

#define GUARD 8
static const float guard_val = -12345.f;

static float *out_buf(size_t n) {
    float *p = malloc(sizeof(float) * (n + GUARD));
    for (size_t i = 0; i < n + GUARD; i++) p[i] = guard_val;
    return p;
}
static int guards_ok(const float *p, size_t n) {
    for (size_t i = n; i < n + GUARD; i++)
        if (p[i] != guard_val) return 0;
    return 1;
}

/* Random weights in GGUF layout: random quants, plausible scales. */
static void *rand_weight(int type, int64_t n, int64_t k) {
    size_t rb = cm_dtype_row_bytes(type, (uint64_t)k), sz = rb * (size_t)n;
    uint8_t *p = malloc(sz);
    for (size_t i = 0; i < sz; i++) p[i] = (uint8_t)rnd();
    /* each block's fp16 fields (scale, then minimum if any), at their byte offsets */
    int dof = -1, mof = -1;
    switch (type) {
    case CM_Q4_0: case CM_Q5_0: case CM_Q8_0: dof = 0; break;
    case CM_Q4_1: case CM_Q5_1: case CM_Q4_K: case CM_Q5_K: dof = 0, mof = 2; break;
    case CM_Q2_K: dof = 80, mof = 82; break;
    case CM_Q3_K: dof = 108; break;
    case CM_Q6_K: dof = 208; break;
    }
    size_t bb = cm_dtype_block_bytes(type);
    for (size_t o = 0; dof >= 0 && o < sz; o += bb) {
        uint16_t d = cm_f32_to_f16(0.001f + 0.05f * (float)(rnd() % 1000) / 1000.f);
        uint16_t m = cm_f32_to_f16((type == CM_Q4_1 || type == CM_Q5_1 ? -0.2f : 0.02f) * (float)(rnd() % 1000) / 1000.f);
        memcpy(p + o + dof, &d, 2);
        if (mof >= 0) memcpy(p + o + mof, &m, 2);
    }
    if (type == CM_MXFP4) /* E8M0 scales 2^-10..2^-3 */
        for (size_t o = 0; o < sz; o += bb) p[o] = (uint8_t)(118 + rnd() % 8);
    if (type == CM_F32)
        for (int64_t i = 0; i < n * k; i++) { float f = frand(); memcpy(p + 4 * i, &f, 4); }
    if (type == CM_F16)
        for (int64_t i = 0; i < n * k; i++) { uint16_t h = cm_f32_to_f16(frand()); memcpy(p + 2 * i, &h, 2); }
    if (type == CM_BF16)
        for (int64_t i = 0; i < n * k; i++) { uint16_t h = cm_f32_to_bf16(frand()); memcpy(p + 2 * i, &h, 2); }
    return p;
}

static const char *isas[] = {"scalar", "avx2", "avx512", "neon", "neon-dotprod"};
#define N_ISA ((int)(sizeof isas / sizeof *isas))

static void test_quant(void) {
    for (int is = 0; is < N_ISA; is++) {
        if (kn_set_isa(isas[is])) continue;
        int64_t k = 32 * (1 + rnd() % 40);
        float *x = malloc(sizeof(float) * (size_t)k);
        for (int64_t i = 0; i < k; i++) x[i] = frand() * (i % 7 == 0 ? 20.f : 1.f);
        x[5] = 0.5f * 127.f / 127.f; /* exercise exact halves */
        kn_act a;
        kn_act_init(&a, k, 1);
        kn_quantize_act(&a, x, 1);
        int diff = 0;
        for (int64_t b = 0; b < k / 32; b++) {
            int8_t q[32];
            float d, ds;
            kn_ref_quant_block(x + 32 * b, q, &d, &ds);
            diff += memcmp(q, a.qs + 32 * b, 32) != 0 || d != a.d[b] || fabsf(ds - a.ds[b]) > 1e-6f * fabsf(ds);
        }
        CHECK_INT(diff, 0);
        kn_act_free(&a);
        free(x);
    }
}

static void test_matmul(kn_pool *pool) {
    static const int types[] = {CM_Q4_0, CM_Q4_1, CM_Q8_0, CM_F32, CM_F16, CM_BF16, CM_Q5_0,
                                CM_Q5_1, CM_Q2_K, CM_Q3_K, CM_Q4_K, CM_Q5_K, CM_Q6_K, CM_MXFP4};
    enum { NT = sizeof types / sizeof *types };
    for (int it = 0; it < 5 * NT; it++) {
        int type = types[it % NT];
        int64_t n = 1 + rnd() % 70, k = cm_dtype_block(type) == 256 ? 256 * (1 + rnd() % 3) : 32 * (1 + rnd() % 24);
        int B = it % 3 == 2 ? 16 + (int)(rnd() % 24) : 1 + (int)(rnd() % 13); /* and whole AMX tiles of 16 */
        void *raw = rand_weight(type, n, k);
        float *x = malloc(sizeof(float) * (size_t)(B * k));
        for (int64_t i = 0; i < B * k; i++) x[i] = frand();
        float *ref = malloc(sizeof(float) * (size_t)(B * n));
        kn_weight w;
        CHECK_RC(kn_weight_init(&w, type, n, k, raw), 0);
        kn_ref_matmul(&w, ref, x, B);
        /* the same with the activations as the integer path sees them (int8 blocks of 32, dequantized):
         * the integer kernels must match it to float rounding, and to the packs' fp16 scales (products
         * of two scales rounded: 2.4e-4 at most each) */
        float *xq = malloc(sizeof(float) * (size_t)(B * k)), *refq = malloc(sizeof(float) * (size_t)(B * n));
        for (int64_t b = 0; b < B * k / 32; b++) {
            int8_t qb[32];
            float d, ds;
            kn_ref_quant_block(x + 32 * b, qb, &d, &ds);
            for (int i = 0; i < 32; i++) xq[32 * b + i] = d * (float)qb[i];
        }
        kn_ref_matmul(&w, refq, xq, B);
        float *first = NULL;
        for (int is = 0; is < N_ISA; is++) {
            if (kn_set_isa(isas[is])) continue;
            kn_weight wi; /* repack under this ISA (layout is shared; checks determinism) */
            CHECK_RC(kn_weight_init(&wi, type, n, k, raw), 0);
            kn_act a;
            kn_act_init(&a, k, B);
            float *y = out_buf((size_t)(B * n));
            kn_matmul(pool, &wi, y, x, &a, B);
            double e = tst_rel_l2(y, ref, (size_t)(B * n));
            if (w.pack) {
                double eq = tst_rel_l2(y, refq, (size_t)(B * n));
                double tolq = type == CM_Q4_K || type == CM_Q6_K || type == CM_Q2_K || type == CM_Q3_K ||
                                      type == CM_Q5_K || type == CM_Q4_1 || type == CM_Q5_1 ? 5e-4 : 2e-5;
                if (!(eq < tolq))
                    fprintf(stderr, "matmul %s %s n=%lld k=%lld B=%d: rel %.3g against int8-rounded inputs\n", isas[is],
                            cm_dtype_name(type), (long long)n, (long long)k, B, eq);
                CHECK(eq < tolq);
            }
            /* quantized: int8 activations; float types: fp32 accumulation */
            double tol = w.pack ? 2e-2 : 1e-5;
            if (!(e < tol))
                fprintf(stderr, "matmul %s %s n=%lld k=%lld B=%d: rel %.3g\n", isas[is], cm_dtype_name(type),
                        (long long)n, (long long)k, B, e);
            CHECK(e < tol);
            CHECK(guards_ok(y, (size_t)(B * n)));
            /* the last row alone gives the same bits as in the batch (tiles change nothing) */
            if (w.pack) {
                kn_act a1;
                kn_act_init(&a1, k, 1);
                float *y1 = out_buf((size_t)n);
                kn_matmul(pool, &wi, y1, x + (size_t)(B - 1) * k, &a1, 1);
                CHECK(memcmp(y1, y + (size_t)(B - 1) * n, sizeof(float) * (size_t)n) == 0);
                kn_matmul(pool, &wi, y1, x, &a1, 1); /* and the first (in an AMX tile where B >= 16) */
                CHECK(memcmp(y1, y, sizeof(float) * (size_t)n) == 0);
                /* AMX tiles, where the machine has them, give the VNNI path's bits */
                if (!strcmp(isas[is], "avx512") && kn_set_amx(!kn_amx_active()) == 0) {
                    float *y2 = out_buf((size_t)(B * n));
                    kn_matmul(pool, &wi, y2, x, &a, B);
                    CHECK(memcmp(y2, y, sizeof(float) * (size_t)(B * n)) == 0);
                    CHECK_INT(kn_set_amx(!kn_amx_active()), 0);
                    free(y2);
                }
                free(y1);
                kn_act_free(&a1);
            }
            if (!first) first = y;
            else {
                /* SIMD paths run the same integer algorithm as the scalar one */
                CHECK(tst_rel_l2(y, first, (size_t)(B * n)) < 1e-5);
                free(y);
            }
            kn_act_free(&a);
            kn_weight_free(&wi);
        }
        free(first);
        free(xq);
        free(refq);
        kn_weight_free(&w);
        free(raw);
        free(x);
        free(ref);
    }
}

static void test_attention(kn_pool *pool) {
    for (int it = 0; it < 120; it++) {
        static const int kv_types[4] = {KN_KV_F32, KN_KV_F16, KN_KV_FP8, KN_KV_BF16};
        int kv_type = kv_types[it / 3 % 4]; /* every type meets every shape */
        /* head sizes on and off the AVX-512 fast path (multiples of 16 up to 256, Gemma's),
         * groups of 1..10 (above 4 in steps of 4 on AVX-512, 3 on AVX2; above 8 split), block sizes 1..64, several
         * sequences of different lengths (decode T = 1 and prefill over a prefix)
         * whose blocks are scattered over the pool in random order */
        int n_kv = 1 + (int)(rnd() % 3), group = 1 + (int)(rnd() % 10);
        int hd = it % 7 == 5 ? 256 : it % 3 ? 16 * (1 + (int)(rnd() % 16)) : 4 * (1 + (int)(rnd() % 20));
        int gemma = it % 20 == 7; /* Gemma 3's shape: one KV head of 256 for 4 query heads, 500-odd positions */
        if (gemma) n_kv = 1, group = 4, hd = 256;
        int shift = (int)(rnd() % 7), bs = 1 << shift, n_seq = 1 + (int)(rnd() % 4), nh = n_kv * group;
        kn_attn_seq seq[4];
        int32_t *tables[4];
        int rows = 0, max_len = 1, n_blocks = 0;
        for (int i = 0; i < n_seq; i++) {
            /* decode rows, short chunks, and chunks that span several 16-position blocks (prefill tiles) */
            seq[i].T = it % 4 == 0 ? 1 : 1 + (int)(rnd() % (it % 4 == 3 ? 40 : 6));
            seq[i].pos0 = (int)(rnd() % (gemma ? 600 : 100));
            seq[i].row = rows;
            rows += seq[i].T;
            int len = seq[i].pos0 + seq[i].T;
            if (len > max_len) max_len = len;
            n_blocks += (len + bs - 1) / bs + 1; /* one spare per sequence */
        }
        int *perm = malloc(sizeof(int) * (size_t)n_blocks);
        for (int i = 0; i < n_blocks; i++) perm[i] = i;
        for (int i = n_blocks - 1; i > 0; i--) {
            int j = (int)(rnd() % (uint32_t)(i + 1)), tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
        }
        for (int i = 0, used = 0; i < n_seq; i++) {
            int nb = (seq[i].pos0 + seq[i].T + bs - 1) / bs;
            tables[i] = malloc(sizeof(int32_t) * (size_t)nb);
            for (int b = 0; b < nb; b++) tables[i][b] = perm[used++];
            seq[i].blocks = tables[i];
        }
        size_t row_n = (size_t)n_kv * hd, kvn = (size_t)n_blocks * bs * row_n, eb = kn_kv_elem_bytes(kv_type);
        /* unused slots (spare blocks, rows past a sequence) are NaN: reading one poisons the result */
        float *kf = malloc(sizeof(float) * kvn), *vf = malloc(sizeof(float) * kvn);
        for (size_t i = 0; i < kvn; i++) kf[i] = vf[i] = NAN;
        for (int i = 0; i < n_seq; i++)
            for (int j = 0; j < seq[i].pos0 + seq[i].T; j++) {
                size_t o = ((size_t)seq[i].blocks[j >> shift] * bs + (size_t)(j & (bs - 1))) * row_n;
                for (size_t e = 0; e < row_n; e++) { kf[o + e] = frand(); vf[o + e] = frand(); }
            }
        void *kc = malloc(eb * kvn), *vc = malloc(eb * kvn);
        kn_kv_store(kv_type, kc, kf, (int)kvn);
        kn_kv_store(kv_type, vc, vf, (int)kvn);
        size_t qn = (size_t)rows * nh * hd;
        float *q = malloc(sizeof(float) * qn), *ref = malloc(sizeof(float) * qn);
        for (size_t i = 0; i < qn; i++) q[i] = frand() * 3;
        float *scratch = malloc(sizeof(float) * kn_attention_scratch(max_len) * (size_t)kn_pool_size(pool));
        kn_attn_args ra = {n_seq, seq, nh, n_kv, hd, kv_type, shift, max_len, q, ref, kc, vc,
                           (size_t)bs * row_n * eb, NULL, 0, NULL};
        if (it % 5 == 1) ra.window = 1 + (int)(rnd() % 40); /* Gemma's local layers */
        float *sinks = NULL;
        if (it % 3 == 1) { /* gpt-oss's attention sinks: some below the scores, some far above them */
            sinks = malloc(sizeof(float) * (size_t)nh);
            for (int h = 0; h < nh; h++) sinks[h] = h % 4 == 3 ? 30.f : frand() * 4;
            ra.sinks = sinks;
        }
        kn_ref_attention(&ra);
        for (int is = 0; is < N_ISA; is++) {
            if (kn_set_isa(isas[is])) continue;
            float *y = out_buf(qn);
            kn_attn_args a = ra;
            a.out = y;
            a.scratch = scratch;
            kn_attention(pool, &a);
            double e = tst_rel_l2(y, ref, qn);
            if (!(e < 1e-5))
                fprintf(stderr, "attention %s kv %s hd %d group %d bs %d seqs %d: rel %.3g\n", isas[is],
                        kv_type == KN_KV_F16 ? "f16" : kv_type == KN_KV_FP8 ? "fp8" : kv_type == KN_KV_BF16 ? "bf16" : "f32",
                        hd, group, bs, n_seq, e);
            CHECK(e < 1e-5);
            CHECK(guards_ok(y, qn));
            /* each sequence alone gives bit-identical rows (batch-invariance) */
            {
                for (int i = 0; i < n_seq; i++) {
                    kn_attn_seq one = seq[i];
                    kn_attn_args b = a;
                    b.n_seq = 1;
                    b.seq = &one;
                    float *z = out_buf(qn);
                    b.out = z;
                    kn_attention(pool, &b);
                    size_t o = (size_t)seq[i].row * nh * hd, n = (size_t)seq[i].T * nh * hd;
                    CHECK(memcmp(z + o, y + o, sizeof(float) * n) == 0);
                    /* and each token alone (a decode row) gives the rows of the chunk (prefill tiles) */
                    for (int t = 0; t < seq[i].T; t++) {
                        kn_attn_seq tok = {1, seq[i].pos0 + t, seq[i].row + t, seq[i].blocks};
                        b.seq = &tok;
                        kn_attention(pool, &b);
                        size_t ot = (size_t)(seq[i].row + t) * nh * hd;
                        CHECK(memcmp(z + ot, y + ot, sizeof(float) * (size_t)nh * hd) == 0);
                    }
                    free(z);
                }
            }
            free(y);
        }
        for (int i = 0; i < n_seq; i++) free(tables[i]);
        free(perm); free(kf); free(vf); free(kc); free(vc); free(q); free(ref); free(scratch); free(sinks);
    }
    /* F16 store rounds like the reference conversion */
    float src[40];
    uint16_t a16[40];
    for (int i = 0; i < 40; i++) src[i] = frand() * 1000;
    for (int is = 0; is < N_ISA; is++) {
        if (kn_set_isa(isas[is])) continue;
        kn_kv_store(KN_KV_F16, a16, src, 40);
        int diff = 0;
        for (int i = 0; i < 40; i++) diff += a16[i] != cm_f32_to_f16(src[i]);
        CHECK_INT(diff, 0);
    }
}

static void test_elementwise(void) {
    int n = 1 + (int)(rnd() % 300);
    float *x = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)n);
    float *y = out_buf((size_t)n);
    double ss = 0;
    for (int i = 0; i < n; i++) { x[i] = frand() * 4; w[i] = frand(); ss += (double)x[i] * x[i]; }
    kn_rmsnorm(y, x, w, n, 1e-5f);
    double s = 1 / sqrt(ss / n + 1e-5), err = 0;
    for (int i = 0; i < n; i++) err = fmax(err, fabs(y[i] - x[i] * s * w[i]));
    CHECK(err < 1e-5);
    CHECK(guards_ok(y, (size_t)n));
    /* softmax sums to one and is order-preserving */
    memcpy(y, x, sizeof(float) * (size_t)n);
    kn_softmax(y, n);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += y[i];
    CHECK_NEAR(sum, 1, 1e-5);
    /* silu * mul, every path, including the saturated ends */
    x[0] = 200;
    x[1] = -200;
    for (int is = 0; is < N_ISA; is++) {
        if (kn_set_isa(isas[is])) continue;
        memcpy(y, x, sizeof(float) * (size_t)n);
        kn_silu_mul(y, w, n);
        err = 0;
        for (int i = 0; i < n; i++) err = fmax(err, fabs(y[i] - x[i] / (1 + exp(-x[i])) * w[i]) / (1 + fabs(x[i] * w[i])));
        CHECK(err < 1e-6);
        /* and gelu (tanh form) * mul, against float64; x 200 and -200 saturate, a cube past float's range too */
        memcpy(y, x, sizeof(float) * (size_t)n);
        y[2] = 1e13f;
        y[3] = -1e37f;
        float x2 = y[2], x3 = y[3];
        kn_gelu_mul(y, w, n);
        err = 0;
        for (int i = 0; i < n; i++) {
            double v = i == 2 ? x2 : i == 3 ? x3 : x[i];
            double want = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) * w[i];
            if (!isfinite(want)) want = v > 0 ? v * w[i] : 0;
            err = fmax(err, i == 3 ? fabs(y[i]) : fabs(y[i] - want) / (1 + fabs(v * w[i]))); /* -1e37: 0 */
        }
        if (!(err < 1e-6)) fprintf(stderr, "gelu_mul %s: error %.3g\n", isas[is], err);
        CHECK(err < 1e-6);
    }
    /* the sampler's exp and sum, every path: against float64, -inf exactly 0, odd lengths */
    {
        enum { NV = 49157 };
        float *lg = malloc(sizeof(float) * NV), *ex = malloc(sizeof(float) * NV);
        float mx = -INFINITY;
        for (int i = 0; i < NV; i++) {
            lg[i] = i % 97 == 0 ? -INFINITY : 30 * frand();
            if (lg[i] > mx) mx = lg[i];
        }
        for (int is = 0; is < N_ISA; is++) {
            if (kn_set_isa(isas[is])) continue;
            for (int k = 0; k < 3; k++) {
                float scale = k == 0 ? 1.f : k == 1 ? 1.f / 0.7f : 50.f; /* temperatures 1, 0.7, 0.02 */
                int len = NV - k * 5;
                double want = 0, rel = 0;
                int zero_ok = 1;
                float got = kn_exp_sum(lg, len, mx, scale, ex);
                for (int i = 0; i < len; i++) {
                    float vf = (lg[i] - mx) * scale; /* the argument as the kernels round it */
                    double e = vf >= -87.f ? exp((double)vf) : 0;
                    want += e;
                    if (e > 1e-30) rel = fmax(rel, fabs(ex[i] - e) / e);
                    if (isinf(lg[i]) && ex[i] != 0) zero_ok = 0;
                }
                if (!(rel < 1e-5)) fprintf(stderr, "  exp_sum %s scale %g: rel %.3g\n", isas[is], scale, rel);
                CHECK(rel < 1e-5); /* the argument x log2(e) rounds to float: a few 1e-6 */
                CHECK(zero_ok);
                CHECK_NEAR(got / want, 1, 1e-5);
            }
        }
        free(lg);
        free(ex);
    }
    kn_init();
    /* rope, both conventions, against a float64 rotation */
    int hd = 16, heads = 3, pos = 37;
    float v[48], orig[48], inv[8];
    for (int i = 0; i < 8; i++) inv[i] = (float)pow(10000.0, -2.0 * i / hd);
    for (int type = 0; type < 2; type++) {
        for (int i = 0; i < 48; i++) orig[i] = v[i] = frand();
        kn_rope(v, heads, hd, hd, type, pos, inv);
        err = 0;
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < hd / 2; i++) {
                int a = type ? i : 2 * i, b = type ? i + hd / 2 : 2 * i + 1;
                double ang = pos * pow(10000.0, -2.0 * i / hd), c = cos(ang), sn = sin(ang);
                double ra = orig[h * hd + a] * c - orig[h * hd + b] * sn;
                double rb = orig[h * hd + a] * sn + orig[h * hd + b] * c;
                err = fmax(err, fmax(fabs(v[h * hd + a] - ra), fabs(v[h * hd + b] - rb)));
            }
        CHECK(err < 1e-4);
    }
    free(x); free(w); free(y);
}

typedef struct { int hits[64]; } pool_ctx;
static void pool_task(void *p, int ith, int nth) {
    pool_ctx *c = p;
    c->hits[ith] += nth;
}

static void test_pool(void) {
    kn_pool *p;
    CHECK_RC(kn_pool_create(0, &p), LLM_EINVAL);
    CHECK_RC(kn_pool_create(4, &p), 0);
    pool_ctx c = {{0}};
    for (int i = 0; i < 10000; i++) kn_pool_run(p, pool_task, &c);
    for (int i = 0; i < 4; i++) CHECK_INT(c.hits[i], 40000);
    kn_pool_destroy(p);
}

/* LoRA's shrink and expand, every path, F32 and F16 factors: against a double reference, odd ranks, inputs
 * and outputs (vector tails), and each row the same bit for bit computed alone as among up to nine rows. */
static void test_lora(void) {
    for (int it = 0; it < 40; it++) {
        int in = 1 + (int)(rnd() % 700), rk = 1 + (int)(rnd() % 40), out = 1 + (int)(rnd() % 300);
        int nr = 1 + (int)(rnd() % 9), half = (int)(rnd() % 2);
        int ldr = (rk + KN_LORA_ALIGN - 1) / KN_LORA_ALIGN * KN_LORA_ALIGN;
        float scale = 0.5f + frand();
        size_t es = half ? 2 : 4;
        uint8_t *at = calloc((size_t)in * ldr, es), *bt = malloc((size_t)rk * out * es);
        double *af = calloc((size_t)in * ldr, sizeof(double)), *bf = malloc(sizeof(double) * (size_t)rk * out);
        for (int j = 0; j < in; j++)
            for (int k = 0; k < rk; k++) {
                float v = frand();
                uint16_t h = cm_f32_to_f16(v);
                if (half) memcpy(at + ((size_t)j * ldr + k) * 2, &h, 2), v = cm_f16_to_f32(h);
                else memcpy(at + ((size_t)j * ldr + k) * 4, &v, 4);
                af[(size_t)j * ldr + k] = v;
            }
        for (int i = 0; i < rk * out; i++) {
            float v = frand();
            uint16_t h = cm_f32_to_f16(v);
            if (half) memcpy(bt + (size_t)i * 2, &h, 2), v = cm_f16_to_f32(h);
            else memcpy(bt + (size_t)i * 4, &v, 4);
            bf[i] = v;
        }
        float *x = malloc(sizeof(float) * (size_t)nr * in), *y0 = malloc(sizeof(float) * (size_t)nr * out);
        for (int i = 0; i < nr * in; i++) x[i] = frand();
        for (int i = 0; i < nr * out; i++) y0[i] = frand();
        float *y = out_buf((size_t)nr * out), *ya = out_buf((size_t)out), *t = out_buf((size_t)nr * ldr);
        const float *xr[9];
        float *yr[9];
        for (int r = 0; r < nr; r++) xr[r] = x + (size_t)r * in, yr[r] = y + (size_t)r * out;
        for (int is = 0; is < N_ISA; is++) {
            if (kn_set_isa(isas[is])) continue;
            memcpy(y, y0, sizeof(float) * (size_t)nr * out);
            kn_lora_shrink(at, half, in, ldr, xr, nr, scale, t);
            kn_lora_expand(bt, half, rk, out, t, ldr, nr, yr);
            double err = 0;
            int alone_same = 1;
            for (int r = 0; r < nr; r++) {
                double tr[40];
                for (int k = 0; k < rk; k++) {
                    tr[k] = 0;
                    for (int j = 0; j < in; j++) tr[k] += (double)xr[r][j] * af[(size_t)j * ldr + k];
                    tr[k] *= scale;
                }
                for (int o = 0; o < out; o++) {
                    double want = y0[(size_t)r * out + o], mag = fabs(want);
                    for (int k = 0; k < rk; k++) want += tr[k] * bf[(size_t)k * out + o], mag += fabs(tr[k] * bf[(size_t)k * out + o]);
                    err = fmax(err, fabs(yr[r][o] - want) / (mag + 1e-3));
                }
                float ta[KN_LORA_ALIGN * 3 + GUARD];
                memcpy(ya, y0 + (size_t)r * out, sizeof(float) * (size_t)out);
                kn_lora_shrink(at, half, in, ldr, &xr[r], 1, scale, ta);
                kn_lora_expand(bt, half, rk, out, ta, ldr, 1, &ya);
                alone_same &= !memcmp(ya, yr[r], sizeof(float) * (size_t)out);
            }
            if (!(err < 1e-5) || !alone_same)
                fprintf(stderr, "lora %s half %d in %d rank %d out %d rows %d: rel %.3g, alone %s\n", isas[is], half,
                        in, rk, out, nr, err, alone_same ? "same" : "DIFFERS");
            CHECK(err < 1e-5);
            CHECK(alone_same);
            CHECK(guards_ok(y, (size_t)nr * out));
            CHECK(guards_ok(t, (size_t)nr * ldr));
            CHECK(guards_ok(ya, (size_t)out));
        }
        free(at), free(bt), free(af), free(bf), free(x), free(y0), free(y), free(ya), free(t);
    }
}

int main(void) {
    kn_pool *pool;
    kn_pool_create(3, &pool);
    printf("kernels_test: default ISA %s (%s)\n", kn_isa_name(), kn_isa_reason());
    for (int is = 0; is < N_ISA; is++) printf("  %s: %s\n", isas[is], kn_set_isa(isas[is]) ? "not on this CPU" : "tested");
    test_quant();
    test_matmul(pool);
    test_attention(pool);
    test_elementwise();
    test_lora();
    test_pool();
    kn_pool_destroy(pool);
    /* a rank takes rank 0's kernels by their name: any path this CPU has, AMX only with AVX-512; a name it
     * lacks changes nothing */
    for (int is = 0; is < N_ISA; is++) {
        if (kn_set_isa(isas[is])) continue;
        const char *name = kn_isa_name();
        CHECK_RC(kn_set_isa("scalar"), 0);
        CHECK_RC(kn_follow_isa(name, 0, "rank 0's choice"), 0);
        CHECK(!strcmp(kn_isa_name(), name) && !kn_amx_active() && !strcmp(kn_isa_reason(), "rank 0's choice"));
        if (strcmp(isas[is], "avx512")) CHECK_RC(kn_follow_isa(name, 1, "x"), LLM_EUNSUP);
        else if (kn_follow_isa(name, 1, "x") == 0) CHECK(kn_amx_active());
    }
    CHECK_RC(kn_set_isa("scalar"), 0);
    CHECK_RC(kn_follow_isa("avx1024", 0, "x"), LLM_EUNSUP);
    CHECK_RC(kn_follow_isa("", 0, "x"), LLM_EUNSUP);
    CHECK(!strcmp(kn_isa_name(), "scalar"));
    /* FP8 E4M3 reference: worked values, ties to even, saturation, every code round-trips */
    CHECK_RC(kn_ref_f32_to_e4m3(1.0f), 0x38);
    CHECK_RC(kn_ref_f32_to_e4m3(-2.5f), 0xc2);
    CHECK_RC(kn_ref_f32_to_e4m3(448.f), 0x7e);
    CHECK_RC(kn_ref_f32_to_e4m3(1e6f), 0x7e);
    CHECK_RC(kn_ref_f32_to_e4m3(-1e6f), 0xfe);
    CHECK_RC(kn_ref_f32_to_e4m3(0.001953125f), 0x01); /* 2^-9, the smallest subnormal */
    CHECK_RC(kn_ref_f32_to_e4m3(1.0625f), 0x38);      /* halfway 1 and 1.125: the even one */
    CHECK_RC(kn_ref_f32_to_e4m3(1.1875f), 0x3a);      /* halfway 1.125 and 1.25: the even one */
    CHECK(kn_ref_e4m3_to_f32(0x7f) != kn_ref_e4m3_to_f32(0x7f));
    int rt = 0;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f) rt += kn_ref_f32_to_e4m3(kn_ref_e4m3_to_f32((uint8_t)c)) == (c == 0x80 ? 0x80 : c);
    CHECK_RC(rt, 254);
    /* the fast conversions (common/base/cm_dtype.h, used by the FP8 KV cache) agree with the reference:
     * every code, every midpoint between neighbours and random values over the whole range */
    int agree = 0, total = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        float v = kn_ref_e4m3_to_f32((uint8_t)c), nx = kn_ref_e4m3_to_f32((uint8_t)(c + 1 == 0x7f ? c : c + 1));
        float probes[3] = {v, 0.5f * (v + nx), nextafterf(0.5f * (v + nx), 1e9f)};
        for (int k = 0; k < 3; k++, total++)
            agree += cm_f32_to_e4m3(probes[k]) == kn_ref_f32_to_e4m3(probes[k]) &&
                     (cm_e4m3_to_f32((uint8_t)c) == v || c == 0x80);
    }
    for (int i = 0; i < 20000; i++, total++) {
        float v = frand() * powf(2.f, (float)(rnd() % 24) - 12.f);
        agree += cm_f32_to_e4m3(v) == kn_ref_f32_to_e4m3(v);
    }
    CHECK_RC(agree, total);
    int lut = 0;
    for (int c = 0; c < 256; c++) {
        float a = kn_e4m3_lut[c], b = cm_e4m3_to_f32((uint8_t)c);
        lut += a == b || (a != a && b != b);
    }
    CHECK_RC(lut, 256);
    return tst_done("kernels_test");
}
