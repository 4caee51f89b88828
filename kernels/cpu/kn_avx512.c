/* kn_avx512.c - AVX-512 (F, BW, VL, VNNI) path. Compiled with those flags;
 * called only after cpuid says the CPU has them. */
#include "kn_avx512.h"
#include "kn_int.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Matches kn_quant_block_ref: d = amax/127, q = round-to-nearest-even(x*127/amax). */
static void quant_act_avx512(const float *x, int64_t k, int8_t *qs, float *d, float *ds) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        __m512 amax = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1));
        float am = _mm512_reduce_max_ps(amax);
        float id = am > 0 ? 127.f / am : 0.f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(qs + 32 * b), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qs + 32 * b + 16), _mm512_cvtsepi32_epi8(i1));
        int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        d[b] = am / 127.f;
        ds[b] = d[b] * (float)sum;
    }
}

#ifndef BT
#define BT 4 /* activation rows per register tile (8 measured no faster) */
#endif

/* One 16-row group against up to BT activation rows. Weights of the block
 * are unpacked once into registers and reused for every activation row. */
/* sym: kn_pq4s blocks (Q4_0: m = -8d, not stored), else kn_pq4. */
static inline __attribute__((always_inline)) void q4_group(const char *P, const int sym, int64_t nb,
                                                           const kn_act *a, int b0, int bn, __m512 *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const size_t bs = sym ? sizeof(kn_pq4s) : sizeof(kn_pq4);
    __m512 accm[BT];
    for (int t = 0; t < bn; t++) acc[t] = accm[t] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const char *p = P + (size_t)blk * bs;
        const uint8_t *qs = sym ? ((const kn_pq4s *)p)->qs[0] : ((const kn_pq4 *)p)->qs[0];
        /* hardware prefetchers stop at 4 KiB page ends; ask for the block
         * PF_AHEAD bytes on (it may belong to the next group: that is fine) */
        for (int l = 0; l < (int)bs; l += 64) _mm_prefetch(p + PF_AHEAD + l, _MM_HINT_T0);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 mw = sym ? _mm512_mul_ps(dw, _mm512_set1_ps(-8.f))
                        : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const kn_pq4 *)p)->m));
        __m512i lo[4], hi[4];
        for (int c = 0; c < 4; c++) {
            __m512i v = _mm512_loadu_si512(qs + 64 * c);
            lo[c] = _mm512_and_si512(v, m4);
            hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        for (int t = 0; t < bn; t++) {
            int b = b0 + t;
            const int32_t *xb = (const int32_t *)(a->qs + (size_t)b * a->k + 32 * blk);
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], _mm512_set1_epi32(xb[0]));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[0], _mm512_set1_epi32(xb[1]));
            s0 = _mm512_dpbusd_epi32(s0, lo[1], _mm512_set1_epi32(xb[2]));
            s1 = _mm512_dpbusd_epi32(s1, hi[1], _mm512_set1_epi32(xb[3]));
            s0 = _mm512_dpbusd_epi32(s0, lo[2], _mm512_set1_epi32(xb[4]));
            s1 = _mm512_dpbusd_epi32(s1, hi[2], _mm512_set1_epi32(xb[5]));
            s0 = _mm512_dpbusd_epi32(s0, lo[3], _mm512_set1_epi32(xb[6]));
            s1 = _mm512_dpbusd_epi32(s1, hi[3], _mm512_set1_epi32(xb[7]));
            __m512 sf = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            size_t ai = (size_t)b * a->nblk + blk;
            acc[t] = _mm512_fmadd_ps(sf, _mm512_mul_ps(dw, _mm512_set1_ps(a->d[ai])), acc[t]);
            accm[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->ds[ai]), accm[t]);
        }
    }
    for (int t = 0; t < bn; t++) acc[t] = _mm512_add_ps(acc[t], accm[t]);
}

static inline void q8_group(const kn_pq8 *P, int64_t nb, const kn_act *a, int b0, int bn,
                            __m512 *acc) {
    for (int t = 0; t < bn; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const kn_pq8 *p = &P[blk];
        for (int l = 0; l < (int)sizeof *p; l += 64) _mm_prefetch((const char *)p + PF_AHEAD + l, _MM_HINT_T0);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->d));
        __m512i w[8];
        for (int c = 0; c < 8; c++) w[c] = _mm512_loadu_si512(p->qs[c]);
        for (int t = 0; t < bn; t++) {
            int b = b0 + t;
            const int32_t *xb = (const int32_t *)(a->qs + (size_t)b * a->k + 32 * blk);
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(xb[0]));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], _mm512_set1_epi32(xb[1]));
            for (int c = 2; c < 8; c += 2) {
                s0 = _mm512_dpbusd_epi32(s0, w[c], _mm512_set1_epi32(xb[c]));
                s1 = _mm512_dpbusd_epi32(s1, w[c + 1], _mm512_set1_epi32(xb[c + 1]));
            }
            /* weights are stored +128: dw*(dx*s - 128*dx*sum(x)) */
            size_t ai = (size_t)b * a->nblk + blk;
            __m512 sf = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            __m512 t1 = _mm512_fmadd_ps(sf, _mm512_set1_ps(a->d[ai]), _mm512_set1_ps(-128.f * a->ds[ai]));
            acc[t] = _mm512_fmadd_ps(dw, t1, acc[t]);
        }
    }
}

/* kn_pq8h (mode 0): unsigned weights (0..63) with a scale and a minimum per half block; the halves' sums
 * kept apart (chunks 0-3, 4-7) and scaled each by its own. kn_pq4h (mode 1): the same in nibbles, chunk c
 * in the low ones of qs[c & 3] (c < 4) or the high ones; kn_pq6h (mode 2): those and two more bits from qh. */
static inline __attribute__((always_inline)) void q8h_group(const char *P, const int mode, int64_t nb, const kn_act *a,
                                                            int b0, int bn, __m512 *acc) {
    const size_t bs = kn_q8h_bytes(mode), qo = kn_q8h_qs(mode);
    __m512 accm[BT];
    for (int t = 0; t < bn; t++) acc[t] = accm[t] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const kn_pq8h *p = (const kn_pq8h *)(P + (size_t)blk * bs);
        for (int l = 0; l < (int)bs; l += 64) _mm_prefetch((const char *)p + PF_AHEAD + l, _MM_HINT_T0);
        __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->d[0]));
        __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->d[1]));
        __m512 m0 = mode == 3 ? _mm512_mul_ps(d0, _mm512_set1_ps(-32.f))
                              : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->m[0]));
        __m512 m1 = mode == 3 ? _mm512_mul_ps(d1, _mm512_set1_ps(-32.f))
                              : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->m[1]));
        __m512i w[8];
        kn_q8h_unpack((const uint8_t *)p + qo, mode, w);
        for (int t = 0; t < bn; t++) {
            int b = b0 + t;
            const int32_t *xb = (const int32_t *)(a->qs + (size_t)b * a->k + 32 * blk);
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(xb[0]));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[4], _mm512_set1_epi32(xb[4]));
            for (int c = 1; c < 4; c++) {
                s0 = _mm512_dpbusd_epi32(s0, w[c], _mm512_set1_epi32(xb[c]));
                s1 = _mm512_dpbusd_epi32(s1, w[c + 4], _mm512_set1_epi32(xb[c + 4]));
            }
            size_t ai = (size_t)b * a->nblk + blk;
            __m512 dx = _mm512_set1_ps(a->d[ai]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(d0, dx), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d1, dx), acc[t]);
            accm[t] = _mm512_fmadd_ps(m0, _mm512_set1_ps(a->hs[2 * ai]), accm[t]);
            accm[t] = _mm512_fmadd_ps(m1, _mm512_set1_ps(a->hs[2 * ai + 1]), accm[t]);
        }
    }
    for (int t = 0; t < bn; t++) acc[t] = _mm512_add_ps(acc[t], accm[t]);
}

static inline void store_rows(float *y, int64_t ldy, int b0, int bn, int64_t g, int64_t n,
                              const __m512 *acc) {
    int64_t r0 = g * KN_ROWS;
    __mmask16 m = n - r0 >= KN_ROWS ? 0xffff : (__mmask16)((1u << (n - r0)) - 1);
    for (int t = 0; t < bn; t++) _mm512_mask_storeu_ps(y + (size_t)(b0 + t) * ldy + r0, m, acc[t]);
}

/* Row groups [g0, g1) against all B activation rows, BT rows per tile. */
static void gemm_avx512(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy, int64_t g0,
                        int64_t g1) {
    int64_t nb = w->k / 32;
    int done = kn_amx_on ? kn_amx_gemm(w, a, B, y, ldy, g0, g1) : 0; /* whole tiles of 16 rows, if any */
    for (int64_t g = g0; g < g1; g++)
        for (int b0 = done; b0 < B; b0 += BT) {
            int bn = B - b0 < BT ? B - b0 : BT;
            __m512 acc[BT];
            if (w->pack == KN_PACK_Q8) q8_group((const kn_pq8 *)w->packed + g * nb, nb, a, b0, bn, acc);
            else if (w->pack == KN_PACK_Q8H)
                q8h_group((const char *)((const kn_pq8h *)w->packed + g * nb), 0, nb, a, b0, bn, acc);
            else if (w->pack == KN_PACK_Q4H)
                q8h_group((const char *)((const kn_pq4h *)w->packed + g * nb), 1, nb, a, b0, bn, acc);
            else if (w->pack == KN_PACK_Q6H)
                q8h_group((const char *)((const kn_pq6h *)w->packed + g * nb), 2, nb, a, b0, bn, acc);
            else if (w->pack == KN_PACK_Q6S)
                q8h_group((const char *)((const kn_pq6s *)w->packed + g * nb), 3, nb, a, b0, bn, acc);
            else if (w->pack == KN_PACK_Q4S)
                q4_group((const char *)((const kn_pq4s *)w->packed + g * nb), 1, nb, a, b0, bn, acc);
            else q4_group((const char *)((const kn_pq4 *)w->packed + g * nb), 0, nb, a, b0, bn, acc);
            store_rows(y, ldy, b0, bn, g, w->n, acc);
        }
}

static float dot_avx512(const float *a, const float *b, int n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* 16 elements starting at element i of the row at p. */
static inline __m512 kv_load(const char *p, int i, int kind) {
    if (kind == KN_KV_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    if (kind == KN_KV_BF16) /* bf16 is the top half of an f32 */
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i))), 16));
    if (kind == KN_KV_FP8) {
        /* E4M3 bits moved into an f16's (sign to bit 15, exponent and mantissa up 7) read as that
         * value times 2^-8 exactly, subnormals included; the cache never holds the NaN code */
        __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + i)));
        __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
                                    _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
        return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f));
    }
    return _mm512_loadu_ps((const float *)p + i);
}

/* The cache lines of a row of hd elements, asked for ahead of their use. */
static inline void kv_prefetch(const char *row, int hd, int kind) {
    int bytes = hd * (kind == KN_KV_FP8 ? 1 : kind == KN_KV_F32 ? 4 : 2);
    for (int o = 0; o < bytes; o += 64) _mm_prefetch(row + o, _MM_HINT_T0);
}

/* r[p] = sum of the 16 lanes of a[p], p = 0..15: a transposing add tree,
 * 15 combine steps instead of 16 horizontal sums. */
static inline __m512 reduce16(__m512 *a) {
    __m512 b[8], c[4];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* GQA group attention: scores 16 positions at a time per head (K rows come
 * from L1 for the group's other heads), V rows loaded once for all g heads
 * with the outputs in registers. hd a multiple of 16 up to 128, g <= 4;
 * other shapes take the generic path. Softmax in fp32. The cache type is a
 * constant at each call site, so every cache type gets its own code. */
/* exp(x) for x <= 0 (softmax after subtracting the max): 2^(x log2 e) as
 * 2^n * p(f), p the degree-7 Taylor polynomial of 2^f on |f| <= 0.5
 * (relative error < 1e-7). */
static inline __m512 exp_avx512(__m512 x) {
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(kn_exp2_poly[0]);
    for (int k = 1; k < 8; k++) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kn_exp2_poly[k]));
    return _mm512_scalef_ps(p, _mm512_max_ps(n, _mm512_set1_ps(-200.f)));
}

/* sh[i] = exp(sh[i] - mx) / sum, in place; extra (an attention sink's exp(sink - mx), or 0) joins the sum. */
static inline void softmax_avx512(float *sh, int len, float mx, float extra) {
    __m512 vm = _mm512_set1_ps(mx), vs = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= len; i += 16) {
        __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(sh + i), vm));
        _mm512_storeu_ps(sh + i, e);
        vs = _mm512_add_ps(vs, e);
    }
    if (i < len) {
        __mmask16 m = (__mmask16)((1u << (len - i)) - 1);
        __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sh + i), vm));
        _mm512_mask_storeu_ps(sh + i, m, e);
        vs = _mm512_add_ps(vs, _mm512_maskz_mov_ps(m, e));
    }
    __m512 inv = _mm512_set1_ps(1.f / (_mm512_reduce_add_ps(vs) + extra));
    for (i = 0; i + 16 <= len; i += 16) _mm512_storeu_ps(sh + i, _mm512_mul_ps(_mm512_loadu_ps(sh + i), inv));
    for (; i < len; i++) sh[i] *= _mm512_cvtss_f32(inv);
}

/* nv = hd/16 (up to 16: head sizes to 256, Gemma's) and f16 are constants at each call site, so every shape
 * that is called gets straight-line inner loops. */
static inline void attn_group_body(const float *q, const kn_kv_rows *kv, int len, int nv, int g, float scale,
                                   float *s, float *out, int kind) {
    int hd = 16 * nv;
    __m512 vscale = _mm512_set1_ps(scale);
    for (int h = 0; h < g; h++) {
        __m512 qv[16];
        for (int v = 0; v < nv; v++) qv[v] = _mm512_loadu_ps(q + (size_t)h * hd + 16 * v);
        float *sh = s + (size_t)h * len;
        __m512 vmx = _mm512_set1_ps(-INFINITY);
        int j = 0;
        for (; j + 16 <= len; j += 16) {
            __m512 acc[16];
            for (int p = 0; p < 16; p++) {
                const char *row = kv->k + kn_kv_off(kv, j + p);
                if (h == 0 && j + 16 + p < len) kv_prefetch(kv->k + kn_kv_off(kv, j + 16 + p), hd, kind);
                acc[p] = _mm512_mul_ps(qv[0], kv_load(row, 0, kind));
                for (int v = 1; v < nv; v++) acc[p] = _mm512_fmadd_ps(qv[v], kv_load(row, 16 * v, kind), acc[p]);
            }
            __m512 sc = _mm512_mul_ps(reduce16(acc), vscale);
            _mm512_storeu_ps(sh + j, sc);
            vmx = _mm512_max_ps(vmx, sc);
        }
        float mx = _mm512_reduce_max_ps(vmx);
        for (; j < len; j++) {
            const char *row = kv->k + kn_kv_off(kv, j);
            __m512 acc = _mm512_mul_ps(qv[0], kv_load(row, 0, kind));
            for (int v = 1; v < nv; v++) acc = _mm512_fmadd_ps(qv[v], kv_load(row, 16 * v, kind), acc);
            sh[j] = _mm512_reduce_add_ps(acc) * scale;
            mx = sh[j] > mx ? sh[j] : mx;
        }
        mx = kn_sink_max(kv, h, mx);
        softmax_avx512(sh, len, mx, kv->sink ? expf(kv->sink[h] - mx) : 0.f);
    }
    __m512 o[4][16];
    for (int h = 0; h < g; h++)
        for (int v = 0; v < nv; v++) o[h][v] = _mm512_setzero_ps();
    for (int j = 0; j < len; j++) {
        const char *row = kv->v + kn_kv_off(kv, j);
        if (j + 16 < len) kv_prefetch(kv->v + kn_kv_off(kv, j + 16), hd, kind);
        __m512 p[4];
        for (int h = 0; h < g; h++) p[h] = _mm512_set1_ps(s[(size_t)h * len + j]);
        for (int v = 0; v < nv; v++) {
            __m512 vv = kv_load(row, 16 * v, kind);
            for (int h = 0; h < g; h++) o[h][v] = _mm512_fmadd_ps(p[h], vv, o[h][v]);
        }
    }
    for (int h = 0; h < g; h++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(out + (size_t)h * hd + 16 * v, o[h][v]);
}

static void attn_group_avx512(const float *q, const kn_kv_rows *kv, int len, int hd, int g, float scale, float *s,
                              float *out) {
    if (hd % 16 || hd > 256) {
        kn_attn_group_generic(q, kv, len, hd, g, scale, s, out);
        return;
    }
    /* at most 4 heads' outputs (2 of more than 128) stay in registers; larger groups go that many at a
     * time, so a head's arithmetic never depends on how heads are grouped
     * (the result of a sequence must not depend on its batch) */
    kn_kv_rows rest = *kv;
    int gm = hd > 128 ? 2 : 4;
    for (; g > gm; g -= gm, q += (size_t)gm * hd, out += (size_t)gm * hd) {
        attn_group_avx512(q, &rest, len, hd, gm, scale, s, out);
        if (rest.sink) rest.sink += gm;
    }
    kv = &rest;
    if (0)
        ;
    else if (hd == 64 && kv->kind == KN_KV_F16) /* the common head sizes, specialised */
        attn_group_body(q, kv, len, 4, g, scale, s, out, KN_KV_F16);
    else if (hd == 128 && kv->kind == KN_KV_F16)
        attn_group_body(q, kv, len, 8, g, scale, s, out, KN_KV_F16);
    else if (hd == 256 && kv->kind == KN_KV_F16) /* Gemma's */
        attn_group_body(q, kv, len, 16, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_F16)
        attn_group_body(q, kv, len, hd / 16, g, scale, s, out, KN_KV_F16);
    else if (hd == 64 && kv->kind == KN_KV_FP8)
        attn_group_body(q, kv, len, 4, g, scale, s, out, KN_KV_FP8);
    else if (hd == 128 && kv->kind == KN_KV_FP8)
        attn_group_body(q, kv, len, 8, g, scale, s, out, KN_KV_FP8);
    else if (kv->kind == KN_KV_FP8)
        attn_group_body(q, kv, len, hd / 16, g, scale, s, out, KN_KV_FP8);
    else if (kv->kind == KN_KV_BF16)
        attn_group_body(q, kv, len, hd / 16, g, scale, s, out, KN_KV_BF16);
    else
        attn_group_body(q, kv, len, hd / 16, g, scale, s, out, KN_KV_F32);
}

/* Rows j0 .. j0+nk-1 of base (K or V) as f32 in dst [nk][16 nv]; the next
 * block's rows (below lmax) asked for meanwhile. */
static inline void rows_f32(const kn_kv_rows *kv, const char *base, int j0, int nk, int lmax, int nv, int kind,
                            float *dst) {
    for (int p = 0; p < nk; p++) {
        const char *row = base + kn_kv_off(kv, j0 + p);
        if (j0 + 16 + p < lmax) kv_prefetch(base + kn_kv_off(kv, j0 + 16 + p), 16 * nv, kind);
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(dst + p * 16 * nv + 16 * v, kv_load(row, 16 * v, kind));
    }
}

/* attn_tile (kn_int.h): nt tokens x g heads = R rows of one KV head. Each K
 * block of 16 rows is converted to f32 once (kt) and scored against every
 * row that reaches it; each V block likewise (vt), its rows added into RB
 * rows' outputs held in registers. A row's scores, max, softmax and sums are
 * attn_group_body's operations in attn_group_body's order. */
static inline void attn_tile_body(const float *q, size_t qs, const kn_kv_rows *kv, int len0, int nt, int nv, int g,
                                  float scale, float *s, float *out, int kind) {
    enum { RB_MAX = 12 };
    int hd = 16 * nv, R = nt * g, lmax = len0 + nt - 1, RB = 24 / nv > RB_MAX ? RB_MAX : 24 / nv;
    float *kt = s + (size_t)R * lmax, *vt = kt + 16 * hd, *ob = vt + 16 * hd;
    __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmx[KN_ATTN_TILE_ROWS];
    float tmx[KN_ATTN_TILE_ROWS];
    for (int r = 0; r < R; r++) {
        vmx[r] = _mm512_set1_ps(-INFINITY);
        tmx[r] = -INFINITY;
    }
    for (int j0 = 0; j0 < lmax; j0 += 16) {
        int nk = lmax - j0 < 16 ? lmax - j0 : 16;
        rows_f32(kv, kv->k, j0, nk, lmax, nv, kind, kt);
        for (int r = 0; r < R; r++) {
            int len = len0 + r / g;
            if (len <= j0) continue;
            const float *qr = q + (size_t)(r / g) * qs + (size_t)(r % g) * hd;
            float *sh = s + (size_t)r * lmax;
            __m512 qv[16];
            for (int v = 0; v < nv; v++) qv[v] = _mm512_loadu_ps(qr + 16 * v);
            if (j0 + 16 <= len) {
                __m512 acc[16];
                for (int p = 0; p < 16; p++) {
                    acc[p] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kt + p * hd));
                    for (int v = 1; v < nv; v++)
                        acc[p] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(kt + p * hd + 16 * v), acc[p]);
                }
                __m512 sc = _mm512_mul_ps(reduce16(acc), vscale);
                _mm512_storeu_ps(sh + j0, sc);
                vmx[r] = _mm512_max_ps(vmx[r], sc);
            } else {
                for (int j = j0; j < len; j++) {
                    const float *kr = kt + (j - j0) * hd;
                    __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
                    for (int v = 1; v < nv; v++) acc = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(kr + 16 * v), acc);
                    sh[j] = _mm512_reduce_add_ps(acc) * scale;
                    tmx[r] = sh[j] > tmx[r] ? sh[j] : tmx[r];
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        int h = r % g;
        float mx = _mm512_reduce_max_ps(vmx[r]);
        mx = tmx[r] > mx ? tmx[r] : mx;
        mx = kn_sink_max(kv, h, mx);
        softmax_avx512(s + (size_t)r * lmax, len0 + r / g, mx, kv->sink ? expf(kv->sink[h] - mx) : 0.f);
    }
    memset(ob, 0, sizeof(float) * (size_t)R * hd);
    for (int j0 = 0; j0 < lmax; j0 += 16) {
        int nk = lmax - j0 < 16 ? lmax - j0 : 16;
        rows_f32(kv, kv->v, j0, nk, lmax, nv, kind, vt);
        for (int rb = 0; rb < R; rb += RB) {
            __m512 o[24];
            int lim[RB_MAX] = {0};
            for (int rr = 0; rr < RB; rr++) {
                lim[rr] = rb + rr < R ? len0 + (rb + rr) / g : 0; /* row rb+rr reads positions below lim */
                for (int v = 0; v < nv; v++)
                    o[rr * nv + v] = rb + rr < R ? _mm512_loadu_ps(ob + (size_t)(rb + rr) * hd + 16 * v)
                                                 : _mm512_setzero_ps();
            }
            int all = lim[0] - j0 < nk ? lim[0] - j0 : nk; /* every live row of the block reads these */
            if (RB == 1) { /* wide heads (over 192): one row, each V vector loaded as it is used */
                for (int p = 0; p < all; p++) {
                    __m512 pr = _mm512_set1_ps(s[(size_t)rb * lmax + j0 + p]);
                    for (int v = 0; v < nv; v++) o[v] = _mm512_fmadd_ps(pr, _mm512_loadu_ps(vt + p * hd + 16 * v), o[v]);
                }
            } else {
                for (int p = 0; p < nk; p++) {
                    __m512 vv[16];
                    for (int v = 0; v < nv; v++) vv[v] = _mm512_loadu_ps(vt + p * hd + 16 * v);
                    for (int rr = 0; rr < RB; rr++) {
                        if (p >= all && j0 + p >= lim[rr]) continue;
                        if (rb + rr >= R) continue;
                        __m512 pr = _mm512_set1_ps(s[(size_t)(rb + rr) * lmax + j0 + p]);
                        for (int v = 0; v < nv; v++) o[rr * nv + v] = _mm512_fmadd_ps(pr, vv[v], o[rr * nv + v]);
                    }
                }
            }
            for (int rr = 0; rr < RB && rb + rr < R; rr++)
                for (int v = 0; v < nv; v++) _mm512_storeu_ps(ob + (size_t)(rb + rr) * hd + 16 * v, o[rr * nv + v]);
        }
    }
    for (int r = 0; r < R; r++)
        memcpy(out + (size_t)(r / g) * qs + (size_t)(r % g) * hd, ob + (size_t)r * hd, sizeof(float) * (size_t)hd);
}

static int attn_tile_avx512(const float *q, size_t qs, const kn_kv_rows *kv, int len0, int nt, int hd, int g,
                            float scale, float *s, float *out) {
    if (hd % 16 || hd > 256 || nt * g > KN_ATTN_TILE_ROWS) return 0;
    if (hd == 64 && kv->kind == KN_KV_F16)
        attn_tile_body(q, qs, kv, len0, nt, 4, g, scale, s, out, KN_KV_F16);
    else if (hd == 128 && kv->kind == KN_KV_F16)
        attn_tile_body(q, qs, kv, len0, nt, 8, g, scale, s, out, KN_KV_F16);
    else if (hd == 256 && kv->kind == KN_KV_F16)
        attn_tile_body(q, qs, kv, len0, nt, 16, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_F16)
        attn_tile_body(q, qs, kv, len0, nt, hd / 16, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_FP8)
        attn_tile_body(q, qs, kv, len0, nt, hd / 16, g, scale, s, out, KN_KV_FP8);
    else if (kv->kind == KN_KV_BF16)
        attn_tile_body(q, qs, kv, len0, nt, hd / 16, g, scale, s, out, KN_KV_BF16);
    else
        attn_tile_body(q, qs, kv, len0, nt, hd / 16, g, scale, s, out, KN_KV_F32);
    return 1;
}

static void f16_to_f32_avx512(const uint16_t *src, float *dst, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    kn_f16_to_f32_scalar(src + i, dst + i, n - i);
}

static void f32_to_f16_avx512(const float *src, uint16_t *dst, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    kn_f32_to_f16_scalar(src + i, dst + i, n - i);
}

/* silu(a) * b = a * b / (1 + exp(-a)); exp_avx512 saturates to 0 / inf at
 * the ends, which gives the right limits (a*b and -0). */
static void silu_mul_avx512(float *a, const float *b, int n) {
    const __m512 one = _mm512_set1_ps(1.f), zero = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(a + i);
        __m512 e = exp_avx512(_mm512_sub_ps(zero, x));
        _mm512_storeu_ps(a + i, _mm512_div_ps(_mm512_mul_ps(x, _mm512_loadu_ps(b + i)), _mm512_add_ps(one, e)));
    }
    kn_silu_mul_scalar(a + i, b + i, n - i);
}

/* gelu(a) * b in GELU's tanh form: 0.5 a (1 + tanh(u)) = a / (1 + exp(-2u)), u = sqrt(2/pi) (a + 0.044715 a^3);
 * -2u clamped to [-87, 87] for the exp (below, the result is a*b; above, 0: the quotient itself would not
 * reach 0 for a far below -87). */
static void gelu_mul_avx512(float *a, const float *b, int n) {
    const __m512 one = _mm512_set1_ps(1.f), c1 = _mm512_set1_ps(-1.5957691216f), c3 = _mm512_set1_ps(0.044715f);
    const __m512 lo = _mm512_set1_ps(-87.f), hi = _mm512_set1_ps(87.f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(a + i);
        __m512 z = _mm512_mul_ps(c1, _mm512_fmadd_ps(_mm512_mul_ps(c3, _mm512_mul_ps(x, x)), x, x));
        __m512 e = exp_avx512(_mm512_min_ps(_mm512_max_ps(z, lo), hi));
        __m512 y = _mm512_div_ps(_mm512_mul_ps(x, _mm512_loadu_ps(b + i)), _mm512_add_ps(one, e));
        _mm512_storeu_ps(a + i, _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(z, hi, _CMP_GT_OQ), _mm512_setzero_ps()));
    }
    kn_gelu_mul_scalar(a + i, b + i, n - i);
}

static float exp_sum_avx512(const float *x, int n, float mx, float scale, float *out) {
    const __m512 vm = _mm512_set1_ps(mx), vs = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-87.f);
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vs);
        __mmask16 live = _mm512_cmp_ps_mask(v, lo, _CMP_GE_OQ); /* -inf (masked) and NaN: 0 */
        __m512 e = _mm512_maskz_mov_ps(live, exp_avx512(_mm512_max_ps(v, lo)));
        _mm512_storeu_ps(out + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc) + kn_exp_sum_scalar(x + i, n - i, mx, scale, out + i);
}

KN_GEMM_F32(gemm_f32_avx512, 16)

#define KN_LORA_LOADH(v, p) (v) = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
KN_LORA(lora_avx512, 16)

const kn_impl kn_impl_avx512 = {"avx512-vnni", quant_act_avx512, gemm_avx512, gemm_avx512, gemm_avx512, dot_avx512, gemm_f32_avx512,
                                attn_group_avx512, f32_to_f16_avx512, f16_to_f32_avx512, silu_mul_avx512, exp_sum_avx512,
                                lora_avx512_shrink, lora_avx512_expand, attn_tile_avx512, gelu_mul_avx512};
