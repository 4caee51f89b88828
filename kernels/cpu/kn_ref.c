/* kn_ref.c - scalar references and the portable integer path.
 *
 * kn_ref_* work on the raw GGUF layout in float64 and are the ground truth
 * for tests; kn_impl_scalar runs the same integer algorithm as the SIMD paths
 * over the packed layout, in plain C, for CPUs without AVX2. */
#include "cm_dtype.h"
#include "cm_quant.h"
#include "kn_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

float kn_ref_dequant(int type, const void *row, int64_t i) {
    const uint8_t *p = row;
    switch (type) {
    case CM_F32: { float f; memcpy(&f, p + 4 * i, 4); return f; }
    case CM_F16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return cm_f16_to_f32(h); }
    case CM_BF16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return cm_bf16_to_f32(h); }
    case CM_Q4_0: {
        const cm_block_q4_0 *b = (const cm_block_q4_0 *)p + i / 32;
        int j = (int)(i % 32), q = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
        return cm_f16_to_f32(b->d) * (float)(q - 8);
    }
    case CM_Q4_1: {
        const cm_block_q4_1 *b = (const cm_block_q4_1 *)p + i / 32;
        int j = (int)(i % 32), q = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
        return cm_f16_to_f32(b->d) * (float)q + cm_f16_to_f32(b->m);
    }
    case CM_Q8_0: {
        const cm_block_q8_0 *b = (const cm_block_q8_0 *)p + i / 32;
        return cm_f16_to_f32(b->d) * (float)b->qs[i % 32];
    }
    default: return cm_quant_known(type) ? cm_quant_at(type, p, i) : NAN;
    }
}

void kn_ref_matmul(const kn_weight *w, float *y, const float *x, int B) {
    size_t rb = cm_dtype_row_bytes(w->type, (uint64_t)w->k);
    for (int b = 0; b < B; b++)
        for (int64_t n = 0; n < w->n; n++) {
            const uint8_t *row = (const uint8_t *)w->raw + (size_t)n * rb;
            double acc = 0;
            for (int64_t i = 0; i < w->k; i++)
                acc += (double)kn_ref_dequant(w->type, row, i) * x[(size_t)b * w->k + i];
            y[(size_t)b * w->n + n] = (float)acc;
        }
}

/* Element i of KV head kvh at position j of sequence sq. */
static float kv_at(const kn_attn_args *a, const kn_attn_seq *sq, const void *base, int j, int kvh, int i) {
    size_t eb = kn_kv_elem_bytes(a->kv_type), mask = ((size_t)1 << a->block_shift) - 1;
    const char *p = (const char *)base + (size_t)sq->blocks[j >> a->block_shift] * a->block_stride +
                    (((size_t)j & mask) * (size_t)a->n_kv * (size_t)a->hd + (size_t)kvh * (size_t)a->hd + (size_t)i) * eb;
    return a->kv_type == KN_KV_F16   ? cm_f16_to_f32(*(const uint16_t *)p)
           : a->kv_type == KN_KV_FP8 ? cm_e4m3_to_f32(*(const uint8_t *)p)
           : a->kv_type == KN_KV_BF16 ? cm_bf16_to_f32(*(const uint16_t *)p)
                                     : *(const float *)p;
}

void kn_ref_attention(const kn_attn_args *a) {
    int group = a->n_head / a->n_kv;
    double *s = malloc(sizeof(double) * (size_t)a->max_len);
    for (int si = 0; si < a->n_seq; si++) {
        const kn_attn_seq *sq = &a->seq[si];
        for (int t = 0; t < sq->T; t++)
            for (int h = 0; h < a->n_head; h++) {
                int len = sq->pos0 + t + 1, kvh = h / group, first = kn_attn_first(a, sq->pos0 + t);
                size_t qo = ((size_t)(sq->row + t) * a->n_head + h) * a->hd;
                const float *q = a->q + qo;
                double mx = -INFINITY, sum = 0;
                for (int j = first; j < len; j++) {
                    double d = 0;
                    for (int i = 0; i < a->hd; i++) d += (double)q[i] * kv_at(a, sq, a->kc, j, kvh, i);
                    s[j] = d / sqrt((double)a->hd);
                    if (s[j] > mx) mx = s[j];
                }
                if (a->sinks && a->sinks[h] > mx) mx = a->sinks[h];
                for (int j = first; j < len; j++) sum += (s[j] = exp(s[j] - mx));
                if (a->sinks) sum += exp((double)a->sinks[h] - mx); /* a logit without a value row */
                float *o = a->out + qo;
                for (int i = 0; i < a->hd; i++) {
                    double acc = 0;
                    for (int j = first; j < len; j++) acc += s[j] * kv_at(a, sq, a->vc, j, kvh, i);
                    o[i] = (float)(acc / sum);
                }
            }
    }
    free(s);
}

/* ---- portable integer path ------------------------------------------- */

static void quant_act_scalar(const float *x, int64_t k, int8_t *qs, float *d, float *ds) {
    for (int64_t b = 0; b < k / 32; b++) kn_quant_block_ref(x + 32 * b, qs + 32 * b, d + b, ds + b);
}

static void gemm_q4_scalar(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy,
                           int64_t g0, int64_t g1) {
    int64_t nb = w->k / 32;
    int sym = w->pack == KN_PACK_Q4S; /* kn_pq4s: m = -8d */
    size_t bs = sym ? sizeof(kn_pq4s) : sizeof(kn_pq4);
    for (int64_t g = g0; g < g1; g++)
        for (int b = 0; b < B; b++) {
            float acc[KN_ROWS] = {0};
            const int8_t *xq = a->qs + (size_t)b * a->k;
            for (int64_t blk = 0; blk < nb; blk++) {
                const char *pb = (const char *)w->packed + (size_t)(g * nb + blk) * bs;
                const uint16_t *pd = (const uint16_t *)pb, *pm = sym ? NULL : ((const kn_pq4 *)pb)->m;
                const uint8_t *qs = sym ? ((const kn_pq4s *)pb)->qs[0] : ((const kn_pq4 *)pb)->qs[0];
                const int8_t *xb = xq + 32 * blk;
                float dx = a->d[(size_t)b * nb + blk], dsx = a->ds[(size_t)b * nb + blk];
                for (int r = 0; r < KN_ROWS; r++) {
                    int s = 0;
                    for (int c = 0; c < 4; c++)
                        for (int i = 0; i < 4; i++) {
                            uint8_t v = qs[64 * c + r * 4 + i];
                            s += (v & 15) * xb[8 * c + i] + (v >> 4) * xb[8 * c + 4 + i];
                        }
                    float dw = cm_f16_to_f32(pd[r]), mw = sym ? dw * -8.f : cm_f16_to_f32(pm[r]);
                    acc[r] += dw * dx * (float)s + mw * dsx;
                }
            }
            for (int r = 0; r < KN_ROWS && g * KN_ROWS + r < w->n; r++)
                y[(size_t)b * ldy + g * KN_ROWS + r] = acc[r];
        }
}

static void gemm_q8_scalar(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy,
                           int64_t g0, int64_t g1) {
    int64_t nb = w->k / 32;
    const kn_pq8 *P = w->packed;
    for (int64_t g = g0; g < g1; g++)
        for (int b = 0; b < B; b++) {
            float acc[KN_ROWS] = {0};
            const int8_t *xq = a->qs + (size_t)b * a->k;
            for (int64_t blk = 0; blk < nb; blk++) {
                const kn_pq8 *p = &P[g * nb + blk];
                const int8_t *xb = xq + 32 * blk;
                float dx = a->d[(size_t)b * nb + blk];
                for (int r = 0; r < KN_ROWS; r++) {
                    int s = 0;
                    for (int c = 0; c < 8; c++)
                        for (int i = 0; i < 4; i++)
                            s += ((int)p->qs[c][r * 4 + i] - 128) * xb[4 * c + i];
                    acc[r] += cm_f16_to_f32(p->d[r]) * dx * (float)s;
                }
            }
            for (int r = 0; r < KN_ROWS && g * KN_ROWS + r < w->n; r++)
                y[(size_t)b * ldy + g * KN_ROWS + r] = acc[r];
        }
}

static void gemm_q8h_scalar(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy,
                            int64_t g0, int64_t g1) {
    int64_t nb = w->k / 32;
    int mode = kn_q8h_mode(w->pack), nib = mode != 0, six = mode >= 2;
    size_t bs = kn_q8h_bytes(mode);
    for (int64_t g = g0; g < g1; g++)
        for (int b = 0; b < B; b++) {
            float acc[KN_ROWS] = {0};
            const int8_t *xq = a->qs + (size_t)b * a->k;
            for (int64_t blk = 0; blk < nb; blk++) {
                const kn_pq8h *p = (const kn_pq8h *)((const char *)w->packed + (size_t)(g * nb + blk) * bs);
                const uint8_t *qs = (const uint8_t *)p + kn_q8h_qs(mode), *qh = qs + 256;
                const int8_t *xb = xq + 32 * blk;
                float dx = a->d[(size_t)b * nb + blk];
                const float *hs = a->hs + ((size_t)b * nb + blk) * 2;
                for (int r = 0; r < KN_ROWS; r++)
                    for (int h = 0; h < 2; h++) {
                        int s = 0;
                        for (int c = 4 * h; c < 4 * h + 4; c++)
                            for (int i = 0; i < 4; i++) {
                                int u = nib ? (qs[64 * (c & 3) + r * 4 + i] >> (c >= 4 ? 4 : 0)) & 15 : qs[64 * c + r * 4 + i];
                                if (six) u |= ((qh[64 * (c >> 2) + r * 4 + i] >> (2 * (c & 3))) & 3) << 4;
                                s += u * xb[4 * c + i];
                            }
                        float dw = cm_f16_to_f32(p->d[h][r]), mw = mode == 3 ? dw * -32.f : cm_f16_to_f32(p->m[h][r]);
                        acc[r] += dw * dx * (float)s + mw * hs[h];
                    }
            }
            for (int r = 0; r < KN_ROWS && g * KN_ROWS + r < w->n; r++)
                y[(size_t)b * ldy + g * KN_ROWS + r] = acc[r];
        }
}

static float dot_scalar(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_scalar(float s, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += s * x[i];
}

static const float *kv_row_f32(const kn_kv_rows *kv, const char *base, int j, int hd, float *row) {
    const char *p = base + kn_kv_off(kv, j);
    if (kv->kind == KN_KV_F32) return (const float *)p;
    if (kv->kind == KN_KV_FP8)
        for (int i = 0; i < hd; i++) row[i] = kn_e4m3_lut[((const uint8_t *)p)[i]];
    else if (kv->kind == KN_KV_BF16)
        for (int i = 0; i < hd; i++) row[i] = cm_bf16_to_f32(((const uint16_t *)p)[i]);
    else
        for (int i = 0; i < hd; i++) row[i] = cm_f16_to_f32(((const uint16_t *)p)[i]);
    return row;
}

void kn_attn_group_generic(const float *q, const kn_kv_rows *kv, int len, int hd, int g, float scale, float *s,
                           float *out) {
    float row[1024]; /* hd <= 1024, enforced by the loader */
    for (int h = 0; h < g; h++) {
        float *sh = s + (size_t)h * len, mx = -INFINITY, sum = 0;
        for (int j = 0; j < len; j++) {
            sh[j] = dot_scalar(q + (size_t)h * hd, kv_row_f32(kv, kv->k, j, hd, row), hd) * scale;
            mx = sh[j] > mx ? sh[j] : mx;
        }
        mx = kn_sink_max(kv, h, mx);
        for (int j = 0; j < len; j++) sum += (sh[j] = expf(sh[j] - mx));
        if (kv->sink) sum += expf(kv->sink[h] - mx);
        float inv = 1.f / sum, *o = out + (size_t)h * hd;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j < len; j++) axpy_scalar(sh[j] * inv, kv_row_f32(kv, kv->v, j, hd, row), o, hd);
    }
}

void kn_f16_to_f32_scalar(const uint16_t *src, float *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = cm_f16_to_f32(src[i]);
}

void kn_f32_to_f16_scalar(const float *src, uint16_t *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = cm_f32_to_f16(src[i]);
}

/* no blocking: the reference is the plain dot product, row by row */
static void gemm_f32_scalar(const float *w, int64_t k, int64_t nr, const float *x, int B, float *y, int64_t ldy) {
    for (int64_t r = 0; r < nr; r++)
        for (int b = 0; b < B; b++) y[(int64_t)b * ldy + r] = dot_scalar(w + r * k, x + (int64_t)b * k, (int)k);
}

#define KN_LORA_LOADH(v, p)                                                                  \
    do {                                                                                         \
        float h_[4];                                                                             \
        kn_f16_to_f32_scalar((p), h_, 4);                                                        \
        memcpy(&(v), h_, sizeof h_);                                                             \
    } while (0)
KN_LORA(lora_scalar, 4)

const kn_impl kn_impl_scalar = {"scalar", quant_act_scalar, gemm_q4_scalar, gemm_q8_scalar, gemm_q8h_scalar,
                                dot_scalar, gemm_f32_scalar, kn_attn_group_generic, kn_f32_to_f16_scalar, kn_f16_to_f32_scalar,
                                kn_silu_mul_scalar, kn_exp_sum_scalar,
                                lora_scalar_shrink, lora_scalar_expand, NULL, kn_gelu_mul_scalar};

void kn_ref_quant_block(const float *x, int8_t *q, float *d, float *ds) {
    kn_quant_block_ref(x, q, d, ds);
}

float kn_ref_e4m3_to_f32(uint8_t v) {
    int e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return NAN;
    float r = e ? ldexpf(1.f + (float)m / 8.f, e - 7) : ldexpf((float)m / 8.f, -6);
    return v & 0x80 ? -r : r;
}

/* By search over the 127 finite magnitudes: slow and obviously right (tests only). */
uint8_t kn_ref_f32_to_e4m3(float f) {
    if (f != f) return 0x7f;
    uint8_t s = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.f) return s | 0x7e;
    int best = 0;
    float bd = a;
    for (int c = 1; c <= 0x7e; c++) {
        float d = fabsf(kn_ref_e4m3_to_f32((uint8_t)c) - a);
        if (d < bd || (d == bd && (c & 1) == 0 && (best & 1))) {
            bd = d;
            best = c;
        }
    }
    return s | (uint8_t)best;
}

/* ---- scalar helpers the SIMD paths finish their tails with ---------------- */

void kn_silu_mul_scalar(float *a, const float *b, int n) {
    for (int i = 0; i < n; i++) a[i] = a[i] / (1.f + expf(-a[i])) * b[i];
}

void kn_gelu_mul_scalar(float *a, const float *b, int n) {
    for (int i = 0; i < n; i++) {
        float v = a[i];
        a[i] = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))) * b[i];
    }
}

float kn_exp_sum_scalar(const float *x, int n, float mx, float scale, float *out) {
    float sum = 0;
    for (int i = 0; i < n; i++) {
        float v = (x[i] - mx) * scale;
        sum += (out[i] = v >= -87.f ? expf(v) : 0.f);
    }
    return sum;
}

/* E4M3 code -> float (cm_e4m3_to_f32 of every code; kernels_test checks they agree). */
float kn_e4m3_lut[256] = {
    0.0f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f, 0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f, 0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f, 0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f, 0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f, 0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f,
    1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f,
    2.0f, 2.25f, 2.5f, 2.75f, 3.0f, 3.25f, 3.5f, 3.75f,
    4.0f, 4.5f, 5.0f, 5.5f, 6.0f, 6.5f, 7.0f, 7.5f,
    8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f,
    16.0f, 18.0f, 20.0f, 22.0f, 24.0f, 26.0f, 28.0f, 30.0f,
    32.0f, 36.0f, 40.0f, 44.0f, 48.0f, 52.0f, 56.0f, 60.0f,
    64.0f, 72.0f, 80.0f, 88.0f, 96.0f, 104.0f, 112.0f, 120.0f,
    128.0f, 144.0f, 160.0f, 176.0f, 192.0f, 208.0f, 224.0f, 240.0f,
    256.0f, 288.0f, 320.0f, 352.0f, 384.0f, 416.0f, 448.0f, NAN,
    -0.0f, -0.001953125f, -0.00390625f, -0.005859375f, -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f, -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f, -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f, -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f, -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f, -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f, -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.0f, -1.125f, -1.25f, -1.375f, -1.5f, -1.625f, -1.75f, -1.875f,
    -2.0f, -2.25f, -2.5f, -2.75f, -3.0f, -3.25f, -3.5f, -3.75f,
    -4.0f, -4.5f, -5.0f, -5.5f, -6.0f, -6.5f, -7.0f, -7.5f,
    -8.0f, -9.0f, -10.0f, -11.0f, -12.0f, -13.0f, -14.0f, -15.0f,
    -16.0f, -18.0f, -20.0f, -22.0f, -24.0f, -26.0f, -28.0f, -30.0f,
    -32.0f, -36.0f, -40.0f, -44.0f, -48.0f, -52.0f, -56.0f, -60.0f,
    -64.0f, -72.0f, -80.0f, -88.0f, -96.0f, -104.0f, -112.0f, -120.0f,
    -128.0f, -144.0f, -160.0f, -176.0f, -192.0f, -208.0f, -224.0f, -240.0f,
    -256.0f, -288.0f, -320.0f, -352.0f, -384.0f, -416.0f, -448.0f, NAN,
};

size_t kn_kv_elem_bytes(int kv_type) {
    return kv_type == KN_KV_F16 || kv_type == KN_KV_BF16 ? 2 : kv_type == KN_KV_FP8 ? 1 : 4;
}
