/* kn_neon.c - ARM NEON (aarch64) path. Baseline ARMv8-A: integer dot
 * products by vmull_s8 + pairwise adds; kn_neon_dot.c has the same GEMM on
 * sdot (ARMv8.2 dotprod) for the CPUs that report it. Attention, SiLU,
 * exp and the F16 stores are shared by both. */
#include "kn_int.h"
#include "kn_neon.h"

#include <arm_neon.h>
#include <math.h>

/* Matches kn_quant_block_ref: d = amax/127, q = round-to-nearest-even(x*127/amax). */
static void quant_act_neon(const float *x, int64_t k, int8_t *qs, float *d, float *ds) {
    for (int64_t b = 0; b < k / 32; b++) {
        float32x4_t v[8], amax = vdupq_n_f32(0);
        for (int j = 0; j < 8; j++) {
            v[j] = vld1q_f32(x + 32 * b + 4 * j);
            amax = vmaxq_f32(amax, vabsq_f32(v[j]));
        }
        float am = vmaxvq_f32(amax), id = am > 0 ? 127.f / am : 0.f;
        int32x4_t sum = vdupq_n_s32(0);
        int16x8_t h[4];
        for (int j = 0; j < 4; j++) {
            int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(v[2 * j], id)), q1 = vcvtnq_s32_f32(vmulq_n_f32(v[2 * j + 1], id));
            sum = vaddq_s32(sum, vaddq_s32(q0, q1));
            h[j] = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
        }
        vst1q_s8(qs + 32 * b, vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])));
        vst1q_s8(qs + 32 * b + 16, vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3])));
        d[b] = am / 127.f;
        ds[b] = d[b] * (float)vaddvq_s32(sum);
    }
}

/* Four rows' 4-element dot products: lane r of the result gains
 * sum_i w[4r+i] * x[4r+i]. Products fit int16 (|w|, |x| <= 128, and a quantized
 * activation is at most 127), pair sums too (<= 2 * 128 * 127). */
static inline int32x4_t dot4_mull(int32x4_t acc, int8x16_t w, int8x16_t x) {
    int16x8_t p0 = vmull_s8(vget_low_s8(w), vget_low_s8(x)), p1 = vmull_high_s8(w, x);
    return vpadalq_s16(acc, vpaddq_s16(p0, p1));
}

/* y for one 16-row group against activation rows [b0, b0 + bn), bn <= KN_NEON_BT; the block's weights are
 * unpacked once and used for every row of the tile, and each row's arithmetic is the same whatever the
 * tile (batch-invariance). */
static void group_mull(const kn_weight *w, int64_t g, const kn_act *a, int b0, int bn, float32x4_t acc[][4]) {
    int64_t nb = w->k / 32;
    int q8 = w->pack == KN_PACK_Q8, q8h = kn_pack_q8h(w->pack);
    for (int t = 0; t < bn; t++)
        for (int r = 0; r < 4; r++) acc[t][r] = vdupq_n_f32(0);
    for (int64_t blk = 0; blk < nb; blk++) {
        int8x16_t wq[8][4]; /* [chunk][rows 4r..4r+3] */
        float32x4_t dw[2][4], mw[2][4];
        kn_neon_unpack(w, g, nb, blk, wq, dw, mw);
        for (int t = 0; t < bn; t++) {
            const int32_t *xb = (const int32_t *)(a->qs + (size_t)(b0 + t) * a->k + 32 * blk);
            size_t ai = (size_t)(b0 + t) * a->nblk + blk;
            for (int r = 0; r < 4; r++) {
                if (q8h) { /* each half block to its own scale and minimum */
                    for (int e = 0; e < 2; e++) {
                        int32x4_t s = vdupq_n_s32(0);
                        for (int c = 4 * e; c < 4 * e + 4; c++)
                            s = dot4_mull(s, wq[c][r], vreinterpretq_s8_s32(vdupq_n_s32(xb[c])));
                        acc[t][r] = vfmaq_f32(acc[t][r], vcvtq_f32_s32(s), vmulq_n_f32(dw[e][r], a->d[ai]));
                        acc[t][r] = vfmaq_n_f32(acc[t][r], mw[e][r], a->hs[2 * ai + e]);
                    }
                    continue;
                }
                int32x4_t s = vdupq_n_s32(0);
                for (int c = 0; c < 8; c++) s = dot4_mull(s, wq[c][r], vreinterpretq_s8_s32(vdupq_n_s32(xb[c])));
                acc[t][r] = vfmaq_f32(acc[t][r], vcvtq_f32_s32(s), vmulq_n_f32(dw[0][r], a->d[ai]));
                if (!q8) acc[t][r] = vfmaq_n_f32(acc[t][r], mw[0][r], a->ds[ai]);
            }
        }
    }
}

void kn_neon_store_rows(float *y, int64_t ldy, int b0, int bn, int64_t g, int64_t n, float32x4_t acc[][4]) {
    int64_t r0 = g * KN_ROWS;
    for (int t = 0; t < bn; t++) {
        float *yr = y + (size_t)(b0 + t) * ldy + r0;
        if (r0 + KN_ROWS <= n)
            for (int r = 0; r < 4; r++) vst1q_f32(yr + 4 * r, acc[t][r]);
        else {
            float tmp[KN_ROWS];
            for (int r = 0; r < 4; r++) vst1q_f32(tmp + 4 * r, acc[t][r]);
            for (int r = 0; r < KN_ROWS && r0 + r < n; r++) yr[r] = tmp[r];
        }
    }
}

static void gemm_neon(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++)
        for (int b0 = 0; b0 < B; b0 += KN_NEON_BT) {
            int bn = B - b0 < KN_NEON_BT ? B - b0 : KN_NEON_BT;
            float32x4_t acc[KN_NEON_BT][4];
            group_mull(w, g, a, b0, bn, acc);
            kn_neon_store_rows(y, ldy, b0, bn, g, w->n, acc);
        }
}

static float dot_neon(const float *a, const float *b, int n) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* exp(x) for -87 <= x <= 87: 2^n * p(f) as exp_avx2 (kn_exp2_poly), 2^n in the exponent bits. */
static inline float32x4_t exp_neon(float32x4_t x) {
    float32x4_t t = vmulq_n_f32(x, 1.44269504f);
    float32x4_t n = vrndnq_f32(t);
    float32x4_t f = vsubq_f32(t, n);
    float32x4_t p = vdupq_n_f32(kn_exp2_poly[0]);
    for (int k = 1; k < 8; k++) p = vfmaq_f32(vdupq_n_f32(kn_exp2_poly[k]), p, f);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

static float exp_sum_neon(const float *x, int n, float mx, float scale, float *out) {
    const float32x4_t lo = vdupq_n_f32(-87.f);
    float32x4_t acc = vdupq_n_f32(0);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vmulq_n_f32(vsubq_f32(vld1q_f32(x + i), vdupq_n_f32(mx)), scale);
        uint32x4_t live = vcgeq_f32(v, lo); /* -inf (masked) and NaN: 0 */
        float32x4_t e = vreinterpretq_f32_u32(vandq_u32(live, vreinterpretq_u32_f32(exp_neon(vmaxq_f32(v, lo)))));
        vst1q_f32(out + i, e);
        acc = vaddq_f32(acc, e);
    }
    return vaddvq_f32(acc) + kn_exp_sum_scalar(x + i, n - i, mx, scale, out + i);
}

/* 4 elements starting at element i of a KV row. */
static inline float32x4_t kv_load4(const char *p, int i, int kind) {
    if (kind == KN_KV_F16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i)));
    if (kind == KN_KV_BF16) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + i), 16));
    if (kind == KN_KV_FP8) { /* E4M3 bits placed in an f16's, read as the value times 2^-8 (kn_avx512.c) */
        uint32_t w;
        __builtin_memcpy(&w, p + i, 4);
        uint16x4_t b = vget_low_u16(vmovl_u8(vcreate_u8(w)));
        uint16x4_t h = vorr_u16(vshl_n_u16(vand_u16(b, vdup_n_u16(0x7f)), 7), vshl_n_u16(vand_u16(b, vdup_n_u16(0x80)), 8));
        return vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(h)), 256.f);
    }
    return vld1q_f32((const float *)p + i);
}

/* Scores of one head, 4 positions per register, and their exp; returns the sum. */
static inline float scores_neon(const float *qh, const kn_kv_rows *kv, int h, int len, int nv, float scale, float *sh,
                                int kind) {
    float mx = -INFINITY;
    int j = 0;
    for (; j + 4 <= len; j += 4) {
        float32x4_t acc[4];
        for (int p = 0; p < 4; p++) {
            const char *row = kv->k + kn_kv_off(kv, j + p);
            acc[p] = vmulq_f32(vld1q_f32(qh), kv_load4(row, 0, kind));
            for (int v = 1; v < nv; v++) acc[p] = vfmaq_f32(acc[p], vld1q_f32(qh + 4 * v), kv_load4(row, 4 * v, kind));
        }
        float32x4_t sc = vmulq_n_f32(vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3])), scale);
        vst1q_f32(sh + j, sc);
        float m = vmaxvq_f32(sc);
        mx = m > mx ? m : mx;
    }
    for (; j < len; j++) {
        const char *row = kv->k + kn_kv_off(kv, j);
        float32x4_t acc = vmulq_f32(vld1q_f32(qh), kv_load4(row, 0, kind));
        for (int v = 1; v < nv; v++) acc = vfmaq_f32(acc, vld1q_f32(qh + 4 * v), kv_load4(row, 4 * v, kind));
        sh[j] = vaddvq_f32(acc) * scale;
        mx = sh[j] > mx ? sh[j] : mx;
    }
    mx = kn_sink_max(kv, h, mx);
    float32x4_t vs = vdupq_n_f32(0);
    for (j = 0; j + 4 <= len; j += 4) {
        float32x4_t e = exp_neon(vmaxq_f32(vsubq_f32(vld1q_f32(sh + j), vdupq_n_f32(mx)), vdupq_n_f32(-87.f)));
        vst1q_f32(sh + j, e);
        vs = vaddq_f32(vs, e);
    }
    float sum = vaddvq_f32(vs);
    for (; j < len; j++) sum += (sh[j] = expf(sh[j] - mx));
    return kv->sink ? sum + expf(kv->sink[h] - mx) : sum;
}

/* out[h] = sum_j s[h][j] V_j * inv[h] for G <= 4 heads and 32 columns from c: V rows read once for the
 * heads, 32 accumulators in registers. */
static inline void pv_neon(const kn_kv_rows *kv, const float *s, int len, int hd, int G, int c, const float *inv,
                           float *out, int kind) {
    float32x4_t o[4][8];
    for (int h = 0; h < G; h++)
        for (int v = 0; v < 8; v++) o[h][v] = vdupq_n_f32(0);
    for (int j = 0; j < len; j++) {
        const char *row = kv->v + kn_kv_off(kv, j);
        float p[4];
        for (int h = 0; h < G; h++) p[h] = s[(size_t)h * len + j];
        for (int v = 0; v < 8; v++) {
            float32x4_t vv = kv_load4(row, c + 4 * v, kind);
            for (int h = 0; h < G; h++) o[h][v] = vfmaq_n_f32(o[h][v], vv, p[h]);
        }
    }
    for (int h = 0; h < G; h++)
        for (int v = 0; v < 8; v++) vst1q_f32(out + (size_t)h * hd + c + 4 * v, vmulq_n_f32(o[h][v], inv[h]));
}

/* Heads go through the V pass up to 3 at a time (the output registers
 * stay within 32 with the row and weights); a head's arithmetic does not
 * depend on which heads share its pass, so results never depend on the batch. */
static inline void attn_body_neon(const float *q, const kn_kv_rows *kv, int len, int nv, int g, float scale,
                                  float *s, float *out, int kind) {
    int hd = 4 * nv;
    float inv[8];
    for (int h = 0; h < g; h++) inv[h] = 1.f / scores_neon(q + (size_t)h * hd, kv, h, len, nv, scale, s + (size_t)h * len, kind);
    for (int h0 = 0; h0 < g; h0 += 3) {
        int G = g - h0 < 3 ? g - h0 : 3;
        const float *sh = s + (size_t)h0 * len;
        float *oh = out + (size_t)h0 * hd;
        for (int c = 0; c < hd; c += 32) {
            if (G == 3) pv_neon(kv, sh, len, hd, 3, c, inv + h0, oh, kind);
            else if (G == 2) pv_neon(kv, sh, len, hd, 2, c, inv + h0, oh, kind);
            else pv_neon(kv, sh, len, hd, 1, c, inv + h0, oh, kind);
        }
    }
}

static void attn_group_neon(const float *q, const kn_kv_rows *kv, int len, int hd, int g, float scale, float *s,
                            float *out) {
    if (hd % 32 || hd > 256 || g > 8) {
        kn_attn_group_generic(q, kv, len, hd, g, scale, s, out);
        return;
    }
    if (hd == 64 && kv->kind == KN_KV_F16) attn_body_neon(q, kv, len, 16, g, scale, s, out, KN_KV_F16);
    else if (hd == 128 && kv->kind == KN_KV_F16) attn_body_neon(q, kv, len, 32, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_F16) attn_body_neon(q, kv, len, hd / 4, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_FP8) attn_body_neon(q, kv, len, hd / 4, g, scale, s, out, KN_KV_FP8);
    else if (kv->kind == KN_KV_BF16) attn_body_neon(q, kv, len, hd / 4, g, scale, s, out, KN_KV_BF16);
    else attn_body_neon(q, kv, len, hd / 4, g, scale, s, out, KN_KV_F32);
}

static void f16_to_f32_neon(const uint16_t *src, float *dst, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
    kn_f16_to_f32_scalar(src + i, dst + i, n - i);
}

static void f32_to_f16_neon(const float *src, uint16_t *dst, int n) {
    int i = 0; /* FCVTN rounds to nearest even, as cm_f32_to_f16 */
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    kn_f32_to_f16_scalar(src + i, dst + i, n - i);
}

/* silu(a) * b = a * b / (1 + exp(-a)), -a clamped to [-87, 87] (see kn_avx2.c). */
static void silu_mul_neon(float *a, const float *b, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t x = vld1q_f32(a + i);
        float32x4_t e = exp_neon(vminq_f32(vmaxq_f32(vnegq_f32(x), vdupq_n_f32(-87.f)), vdupq_n_f32(87.f)));
        vst1q_f32(a + i, vdivq_f32(vmulq_f32(x, vld1q_f32(b + i)), vaddq_f32(vdupq_n_f32(1.f), e)));
    }
    kn_silu_mul_scalar(a + i, b + i, n - i);
}

KN_GEMM_F32(gemm_f32_neon, 4)

#define KN_LORA_LOADH(v, p)                                                                  \
    do {                                                                                         \
        float32x4_t h_ = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));                         \
        memcpy(&(v), &h_, sizeof h_);                                                            \
    } while (0)
KN_LORA(lora_neon, 4)

const kn_impl kn_impl_neon = {"neon", quant_act_neon, gemm_neon, gemm_neon, gemm_neon, dot_neon, gemm_f32_neon,
                              attn_group_neon, f32_to_f16_neon, f16_to_f32_neon, silu_mul_neon, exp_sum_neon,
                              lora_neon_shrink, lora_neon_expand, NULL, NULL};
const kn_impl kn_impl_neon_dot = {"neon-dotprod", quant_act_neon, kn_neon_gemm_dot, kn_neon_gemm_dot, kn_neon_gemm_dot, dot_neon,
                                  gemm_f32_neon, attn_group_neon, f32_to_f16_neon, f16_to_f32_neon, silu_mul_neon, exp_sum_neon,
                                  lora_neon_shrink, lora_neon_expand, NULL, NULL};
