/* kn_int.h - internals shared by the CPU backend's files; no other module
 * includes this. One kn_impl per instruction set. */
#ifndef KN_INT_H
#define KN_INT_H

#include "kernels.h"

#include <stddef.h>
#include <string.h>

/* Where one KV head's rows live: position j at byte offset kn_kv_off(r, j)
 * from k (and v); both already point at the head within a row. */
typedef struct kn_kv_rows {
    const char *k, *v;
    const int32_t *blocks;
    int shift, kind;      /* element type: KN_KV_F32, KN_KV_F16 or KN_KV_FP8 */
    size_t block_stride, row_bytes;
    int first;            /* row j is position first + j (a sliding window's start) */
    const float *sink;    /* [g] attention sinks of the call's heads (gpt-oss), or NULL: a logit per head that
                           * joins the softmax's max and sum but has no value row */
} kn_kv_rows;

/* The softmax sum of a head's scores exp(s_j - mx) (already summed: sum, their max: mx) with the head's
 * sink added; the scores must have been taken relative to max(mx, sink) (kn_sink_max). */
static inline float kn_sink_max(const kn_kv_rows *kv, int h, float mx) {
    return kv->sink && kv->sink[h] > mx ? kv->sink[h] : mx;
}

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
    void (*lora_shrink)(const void *at, int half, int in, int ldr, const float *const *x, int nr, float scale,
                        float *t);
    void (*lora_expand)(const void *bt, int half, int rk, int out, const float *t, int ldt, int nr,
                        float *const *y);
    /* nt >= 1 consecutive tokens of one sequence against one KV head, no window: token i attends to
     * len0 + i positions; its g query heads at q + i * qs ([g][hd]), its output at out + i * qs. Every
     * row's arithmetic is attn_group's, in the same order, so a token's result is bit-identical to
     * attending alone; what is shared is the conversion of each K and V row, once for the nt x g rows.
     * Scratch: kn_attention_scratch's. 0 where the ISA has none or the shape is not covered (hd, g):
     * then the tokens go one at a time. NULL: never. */
    int (*attn_tile)(const float *q, size_t qs, const struct kn_kv_rows *kv, int len0, int nt, int hd, int g,
                     float scale, float *s, float *out);
    /* a = gelu(a) * b, GELU's tanh form (Gemma's GeGLU); NULL: kn_gelu_mul_scalar */
    void (*gelu_mul)(float *a, const float *b, int n);
} kn_impl;

/* The byte-a-weight family of packs, read as kn_pq8h: kn_pq8h, kn_pq4h, kn_pq6h, kn_pq6s. */
static inline int kn_pack_q8h(int pack) {
    return pack == KN_PACK_Q8H || pack == KN_PACK_Q4H || pack == KN_PACK_Q6H || pack == KN_PACK_Q6S;
}
/* Their modes in the kernels: 0 kn_pq8h, 1 kn_pq4h, 2 kn_pq6h, 3 kn_pq6s (2's bits, no m: m = -32d). */
static inline int kn_q8h_mode(int pack) {
    return pack == KN_PACK_Q6S ? 3 : pack == KN_PACK_Q6H ? 2 : pack == KN_PACK_Q4H ? 1 : 0;
}
static inline size_t kn_q8h_bytes(int mode) {
    return mode == 3 ? sizeof(kn_pq6s) : mode == 2 ? sizeof(kn_pq6h) : mode ? sizeof(kn_pq4h) : sizeof(kn_pq8h);
}
/* Where a mode's qs start in its block (qh, of modes 2 and 3, right after them). */
static inline size_t kn_q8h_qs(int mode) { return mode == 3 ? offsetof(kn_pq6s, qs) : offsetof(kn_pq8h, qs); }

/* Rows (tokens x query heads of one KV head) of one attn_tile call at most. */
#define KN_ATTN_TILE_ROWS 16

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

/* LoRA's two halves for rows of one adapter (kn_lora_shrink, kn_lora_expand),
 * in GCC vector extensions of VL lanes compiled to the including file's ISA,
 * whose KN_LORA_LOADH(v, p) loads VL F16 values at p into v as floats. Both
 * loops run along contiguous memory with no reduction across lanes: A is
 * stored transposed ([in][ldr], ldr a multiple of 16, zero past the rank), so
 * the shrink broadcasts x[r][j] against A's row j; the expand keeps an output
 * vector of up to four rows in registers over the rank. Factors are F32, or
 * F16 (half) as adapters are mostly saved, which halves what a step reads.
 * Blocks of fewer rows run the same operations in the same order, so a row's
 * result never depends on the rows beside it. */
#define KN_LORA(NAME, VL)                                                                                   \
    typedef float NAME##_lv __attribute__((vector_size(VL * 4)));                                          \
    static inline __attribute__((always_inline)) NAME##_lv NAME##_ld(const void *p, size_t i, int half) {  \
        NAME##_lv v;                                                                                       \
        if (half) KN_LORA_LOADH(v, (const uint16_t *)p + i);                                              \
        else memcpy(&v, (const float *)p + i, sizeof v);                                                   \
        return v;                                                                                          \
    }                                                                                                      \
    static inline __attribute__((always_inline)) void NAME##_shrink_blk(const void *at, int half, int in,  \
                                    int ldr, int k0, const float *const *x, int n, int nv, float scale,     \
                                    float *t) {                                                            \
        NAME##_lv acc[4][2], acc2[4][2]; /* even and odd j: two chains of FMAs per output */              \
        memset(acc, 0, sizeof acc);                                                                        \
        memset(acc2, 0, sizeof acc2);                                                                      \
        int j = 0;                                                                                         \
        for (; j + 2 <= in; j += 2) {                                                                      \
            NAME##_lv a[2], b[2];                                                                          \
            for (int v = 0; v < nv; v++) {                                                                \
                a[v] = NAME##_ld(at, (size_t)j * ldr + k0 + v * VL, half);                                 \
                b[v] = NAME##_ld(at, (size_t)(j + 1) * ldr + k0 + v * VL, half);                           \
            }                                                                                              \
            for (int r = 0; r < n; r++)                                                                    \
                for (int v = 0; v < nv; v++) {                                                             \
                    acc[r][v] += x[r][j] * a[v];                                                           \
                    acc2[r][v] += x[r][j + 1] * b[v];                                                      \
                }                                                                                          \
        }                                                                                                  \
        for (; j < in; j++)                                                                                \
            for (int v = 0; v < nv; v++) {                                                                 \
                NAME##_lv a = NAME##_ld(at, (size_t)j * ldr + k0 + v * VL, half);                          \
                for (int r = 0; r < n; r++) acc[r][v] += x[r][j] * a;                                      \
            }                                                                                              \
        for (int r = 0; r < n; r++)                                                                        \
            for (int v = 0; v < nv; v++) {                                                                 \
                acc[r][v] = (acc[r][v] + acc2[r][v]) * scale;                                              \
                memcpy(t + (size_t)r * ldr + k0 + v * VL, &acc[r][v], sizeof acc[r][v]);                   \
            }                                                                                              \
    }                                                                                                      \
    static inline __attribute__((always_inline)) void NAME##_shrink_h(const void *at, int half, int in,    \
                                    int ldr, const float *const *x, int nr, float scale, float *t) {       \
        for (int r0 = 0; r0 < nr; r0 += 4) {                                                               \
            int n = nr - r0 < 4 ? nr - r0 : 4;                                                             \
            for (int k0 = 0; k0 < ldr; k0 += 2 * VL) {                                                     \
                float *tr = t + (size_t)r0 * ldr;                                                          \
                if (k0 + VL >= ldr)                                                                        \
                    NAME##_shrink_blk(at, half, in, ldr, k0, x + r0, n, 1, scale, tr);                     \
                else if (n == 4) /* constant bounds: the accumulators stay in registers */                 \
                    NAME##_shrink_blk(at, half, in, ldr, k0, x + r0, 4, 2, scale, tr);                     \
                else                                                                                       \
                    NAME##_shrink_blk(at, half, in, ldr, k0, x + r0, n, 2, scale, tr);                     \
            }                                                                                              \
        }                                                                                                  \
    }                                                                                                      \
    static void NAME##_shrink(const void *at, int half, int in, int ldr, const float *const *x, int nr,    \
                              float scale, float *t) {                                                     \
        if (half) NAME##_shrink_h(at, 1, in, ldr, x, nr, scale, t);                                        \
        else NAME##_shrink_h(at, 0, in, ldr, x, nr, scale, t);                                             \
    }                                                                                                      \
    static inline __attribute__((always_inline)) void NAME##_expand_h(const void *bt, int half, int rk,    \
                                    int out, const float *t, int ldt, int nr, float *const *y) {           \
        int ov = out / VL * VL;                                                                            \
        for (int r0 = 0; r0 < nr; r0 += 4) {                                                               \
            int n = nr - r0 < 4 ? nr - r0 : 4;                                                             \
            const float *tr = t + (size_t)r0 * ldt;                                                        \
            for (int o = 0; o < ov; o += 2 * VL) { /* two vectors of outputs: independent chains */      \
                int nv = o + VL < ov ? 2 : 1;                                                              \
                NAME##_lv acc[4][2] = {{{0}}}; /* each one read is loaded first; the compiler cannot tell */ \
                for (int r = 0; r < n; r++)                                                                \
                    for (int v = 0; v < nv; v++) memcpy(&acc[r][v], y[r0 + r] + o + v * VL, sizeof acc[r][v]); \
                for (int k = 0; k < rk; k++)                                                               \
                    for (int v = 0; v < nv; v++) {                                                         \
                        NAME##_lv b = NAME##_ld(bt, (size_t)k * out + o + v * VL, half);                   \
                        for (int r = 0; r < n; r++) acc[r][v] += tr[(size_t)r * ldt + k] * b;              \
                    }                                                                                      \
                for (int r = 0; r < n; r++)                                                                \
                    for (int v = 0; v < nv; v++) memcpy(y[r0 + r] + o + v * VL, &acc[r][v], sizeof acc[r][v]); \
            }                                                                                              \
            for (int o = ov; o < out; o++)                                                                 \
                for (int r = 0; r < n; r++) {                                                              \
                    float s = y[r0 + r][o];                                                                \
                    for (int k = 0; k < rk; k++) {                                                         \
                        size_t e = (size_t)k * out + o;                                                    \
                        s += tr[(size_t)r * ldt + k] *                                                     \
                             (half ? kn_f16_one(((const uint16_t *)bt)[e]) : ((const float *)bt)[e]);     \
                    }                                                                                      \
                    y[r0 + r][o] = s;                                                                      \
                }                                                                                          \
        }                                                                                                  \
    }                                                                                                      \
    static void NAME##_expand(const void *bt, int half, int rk, int out, const float *t, int ldt, int nr,  \
                              float *const *y) {                                                           \
        if (half) NAME##_expand_h(bt, 1, rk, out, t, ldt, nr, y);                                          \
        else NAME##_expand_h(bt, 0, rk, out, t, ldt, nr, y);                                               \
    }

void kn_attn_group_generic(const float *q, const kn_kv_rows *kv, int len, int hd, int g, float scale, float *s,
                           float *out);
void kn_f32_to_f16_scalar(const float *src, uint16_t *dst, int n);
void kn_f16_to_f32_scalar(const uint16_t *src, float *dst, int n);
void kn_silu_mul_scalar(float *a, const float *b, int n);
void kn_gelu_mul_scalar(float *a, const float *b, int n);
float kn_exp_sum_scalar(const float *x, int n, float mx, float scale, float *out);

/* One F16 value as a float (the kernels' scalar tails). */
static inline float kn_f16_one(uint16_t h) {
    float f;
    kn_f16_to_f32_scalar(&h, &f, 1);
    return f;
}

/* exp as 2^(x log2 e) = 2^n * p(f): the degree-7 Taylor polynomial of 2^f on |f| <= 0.5, highest power
 * first (the SIMD paths' exp; relative error < 1e-7 in f, a few 1e-6 from x log2 e rounding to float). */
static const float kn_exp2_poly[8] = {1.525273e-05f, 1.540353e-04f, 1.333356e-03f, 9.618129e-03f,
                                      5.550411e-02f, 2.402265e-01f, 6.931472e-01f, 1.f};

extern const kn_impl kn_impl_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const kn_impl kn_impl_avx2;
extern const kn_impl kn_impl_avx512;
/* kn_amx.c: rows [0, B - B % 16) of the AVX-512 path's matmul in AMX int8 tiles, bit for bit its VNNI
 * result, for kn_pq4, kn_pq4s and kn_pq8 (else 0 rows); the rows it did. Only while kn_amx_on. */
int kn_amx_gemm(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy, int64_t g0, int64_t g1);
extern int kn_amx_on;
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
