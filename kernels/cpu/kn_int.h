/* kn_int.h - internals shared by the CPU backend's files; no other module
 * includes this. One kn_impl per instruction set. */
#ifndef KN_INT_H
#define KN_INT_H

#include "kernels.h"

#include <string.h>

/* Where one KV head's rows live: position j at byte offset kn_kv_off(r, j)
 * from k (and v); both already point at the head within a row. */
typedef struct kn_kv_rows {
    const char *k, *v;
    const int32_t *blocks;
    int shift, kind;      /* element type: KN_KV_F32, KN_KV_F16 or KN_KV_FP8 */
    size_t block_stride, row_bytes;
    int first;            /* row j is position first + j (a sliding window's start) */
} kn_kv_rows;

static inline size_t kn_kv_off(const kn_kv_rows *r, int j) {
    j += r->first;
    return (size_t)r->blocks[j >> r->shift] * r->block_stride +
           (size_t)(j & ((1 << r->shift) - 1)) * r->row_bytes;
}

typedef struct {
    const char *name;
    /* x[k] -> qs[k], d[k/32], ds[k/32] */
    void (*quant_act)(const float *x, int64_t k, int8_t *qs, float *d, float *ds);
    /* y[b][g*16+r] for row groups [g0, g1) and all B rows of a */
    void (*gemm_q4)(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy,
                    int64_t g0, int64_t g1);
    void (*gemm_q8)(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy,
                    int64_t g0, int64_t g1);
    void (*gemm_q8h)(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy,
                     int64_t g0, int64_t g1);
    float (*dot)(const float *a, const float *b, int n);
    /* y[b * ldy + r] = w[r] . x[b] for r < nr, b < B: float weights [nr][k]
     * against float activations [B][k] (F32 checkpoints; F16/BF16 rows
     * converted first). KN_GEMM_F32 below makes each ISA's. */
    void (*gemm_f32)(const float *w, int64_t k, int64_t nr, const float *x, int B, float *y, int64_t ldy);
    /* Attention of the g query heads sharing one KV head, one query token:
     * q [g][hd], len positions read through kv, s scratch [g][len],
     * out [g][hd]. */
    void (*attn_group)(const float *q, const struct kn_kv_rows *kv, int len, int hd, int g, float scale,
                       float *s, float *out);
    void (*f32_to_f16)(const float *src, uint16_t *dst, int n);
    void (*f16_to_f32)(const uint16_t *src, float *dst, int n); /* F16 weights' rows (kn_get_row) */
    void (*silu_mul)(float *a, const float *b, int n); /* a = silu(a) * b */
    float (*exp_sum)(const float *x, int n, float mx, float scale, float *out); /* kn_exp_sum */
} kn_impl;

/* A float GEMM blocked 4 weight rows x 4 activation rows: 16 accumulators of
 * VL lanes (GCC vector extensions, compiled to the including file's ISA),
 * so each loaded vector feeds four FMAs instead of one dot product's one.
 * Edge blocks (fewer rows or activations) run the same arithmetic in the
 * same order, so a token's result never depends on where in the batch it
 * sits. */
#define KN_GEMM_F32(NAME, VL)                                                                               \
    typedef float NAME##_vf __attribute__((vector_size(VL * 4)));                                          \
    static inline __attribute__((always_inline)) void NAME##_block(const float *const *wr, int np, const float *const *xb, int nq, int64_t k, \
                                    float *y, int64_t ldy, int full) {                                     \
        NAME##_vf acc[4][4];                                                                               \
        memset(acc, 0, sizeof acc);                                                                        \
        int64_t kv = k / VL * VL;                                                                          \
        for (int64_t i = 0; i < kv; i += VL) {                                                             \
            NAME##_vf a[4], c[4];                                                                          \
            if (full) { /* constant bounds: the compiler keeps all 16 in registers */                      \
                for (int t = 0; t < 4; t++) {                                                              \
                    memcpy(&a[t], wr[t] + i, sizeof a[t]);                                                 \
                    memcpy(&c[t], xb[t] + i, sizeof c[t]);                                                 \
                }                                                                                          \
                for (int p = 0; p < 4; p++)                                                                \
                    for (int q = 0; q < 4; q++) acc[p][q] += a[p] * c[q];                                  \
            } else {                                                                                       \
                for (int t = 0; t < np; t++) memcpy(&a[t], wr[t] + i, sizeof a[t]);                        \
                for (int t = 0; t < nq; t++) memcpy(&c[t], xb[t] + i, sizeof c[t]);                        \
                for (int p = 0; p < np; p++)                                                               \
                    for (int q = 0; q < nq; q++) acc[p][q] += a[p] * c[q];                                 \
            }                                                                                              \
        }                                                                                                  \
        for (int p = 0; p < np; p++)                                                                       \
            for (int q = 0; q < nq; q++) {                                                                 \
                float s = 0;                                                                               \
                for (int j = 0; j < VL; j++) s += acc[p][q][j];                                            \
                for (int64_t i = kv; i < k; i++) s += wr[p][i] * xb[q][i];                                 \
                y[(int64_t)q * ldy + p] = s;                                                               \
            }                                                                                              \
    }                                                                                                      \
    static void NAME(const float *w, int64_t k, int64_t nr, const float *x, int B, float *y, int64_t ldy) { \
        for (int64_t r = 0; r < nr; r += 4) {                                                              \
            int np = nr - r < 4 ? (int)(nr - r) : 4;                                                       \
            const float *wr[4];                                                                            \
            for (int t = 0; t < 4; t++) wr[t] = w + (r + (t < np ? t : 0)) * k;                            \
            for (int b = 0; b < B; b += 4) {                                                               \
                int nq = B - b < 4 ? B - b : 4;                                                            \
                const float *xb[4];                                                                        \
                for (int t = 0; t < 4; t++) xb[t] = x + (int64_t)(b + (t < nq ? t : 0)) * k;               \
                if (np == 4 && nq == 4) /* two copies: the full block's loops have constant bounds */    \
                    NAME##_block(wr, 4, xb, 4, k, y + (int64_t)b * ldy + r, ldy, 1);                        \
                else                                                                                       \
                    NAME##_block(wr, np, xb, nq, k, y + (int64_t)b * ldy + r, ldy, 0);                      \
            }                                                                                              \
        }                                                                                                  \
    }

void kn_attn_group_generic(const float *q, const kn_kv_rows *kv, int len, int hd, int g, float scale, float *s,
                           float *out);
void kn_f32_to_f16_scalar(const float *src, uint16_t *dst, int n);
void kn_f16_to_f32_scalar(const uint16_t *src, float *dst, int n);
void kn_silu_mul_scalar(float *a, const float *b, int n);
float kn_exp_sum_scalar(const float *x, int n, float mx, float scale, float *out);

/* exp as 2^(x log2 e) = 2^n * p(f): the degree-7 Taylor polynomial of 2^f on |f| <= 0.5, highest power
 * first (the SIMD paths' exp; relative error < 1e-7 in f, a few 1e-6 from x log2 e rounding to float). */
static const float kn_exp2_poly[8] = {1.525273e-05f, 1.540353e-04f, 1.333356e-03f, 9.618129e-03f,
                                      5.550411e-02f, 2.402265e-01f, 6.931472e-01f, 1.f};

extern const kn_impl kn_impl_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const kn_impl kn_impl_avx2;
extern const kn_impl kn_impl_avx512;
#endif
#if defined(__aarch64__)
extern const kn_impl kn_impl_neon;
extern const kn_impl kn_impl_neon_dot;
#endif

/* Quantizes one block of 32 floats: the shared rounding rule of every path
 * (d = amax/127, q = nearest(x/d)); SIMD paths must agree with it. */
static inline void kn_quant_block_ref(const float *x, int8_t *q, float *d, float *ds) {
    float amax = 0;
    for (int i = 0; i < 32; i++) {
        float v = x[i] < 0 ? -x[i] : x[i];
        if (v > amax) amax = v;
    }
    float s = amax / 127.f, id = amax > 0 ? 127.f / amax : 0.f;
    int sum = 0;
    for (int i = 0; i < 32; i++) {
        float v = x[i] * id;
        int qi = (int)__builtin_nearbyintf(v);
        q[i] = (int8_t)qi;
        sum += qi;
    }
    *d = s;
    *ds = s * (float)sum;
}

#endif
