/* kn_avx2.c - AVX2 + FMA + F16C path (vpmaddubsw + vpmaddwd for the integer
 * dot products). Compiled with those flags; called only after cpuid says so. */
#include "cm_dtype.h"
#include "kn_int.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* Bytes of packed weights the GEMMs prefetch ahead of the block they read. 2 KiB, not the AVX-512 path's
 * 4 KiB: decode of a Llama-3-8B shape (2 threads, Xeon, LLMSERVE_ISA=avx2, two interleaved rounds) took
 * 214/215 ms a step at 4096, 196/200 at 16384, 194/203 at 8192, 184/190 at 3072, 187/193 at 1024 and
 * 177-183 at 2048 for Q4_0 (Q4_K 230 -> 204, Q8_0 394 -> 387, Q6_K 381 -> 375); the AVX-512 path measured
 * the same at 2048 and 4096. Not yet measured on Zen 3. */
#define PF_AHEAD_AVX2 2048

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline int hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void quant_act_avx2(const float *x, int64_t k, int8_t *qs, float *d, float *ds) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; b++) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        float am = hmax8(amax), id = am > 0 ? 127.f / am : 0.f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], vid),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            sum = _mm256_add_epi32(sum, q[j]);
        }
        /* pack 32 int32 -> 32 int8 in order */
        __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qs + 32 * b), p);
        d[b] = am / 127.f;
        ds[b] = d[b] * (float)hsum8i(sum);
    }
}

#define BT2 4 /* activation rows per Q8 register tile (BY_SIZE has a case for each size) */
/* An empty asm that takes v in a register: GCC may not reassociate the sums
 * around it. Without it, GCC regroups a tile's integer adds so that every
 * product of a block is computed before any is summed, which needs twice the
 * registers and spilled the tile to the stack. */
#define KEEP(v) __asm__("" : "+x"(v))

/* A 16-row group (both 8-row halves) against activation rows [b0, b0+BN),
 * BN <= 2; out[2 * t + h]. Chunk by chunk, a chunk's nibbles are unpacked
 * once and used for every row of the tile, each row and half summing into
 * its own int16 accumulator; each activation broadcast feeds 16 rows. Live
 * are 2*BN sums, 2*BN float accumulators and two unpacked chunks: AVX2's 16
 * registers. (Measured on Zen 4 against 8-row tiles of 1-4 activation rows:
 * 1.04-1.5x at B = 1, where a block is read in one pass; 1.25-1.4x at B = 2;
 * even at B = 32 and above, where both are bound by the vector ALUs.) A
 * vpmaddubsw lane is at most 2*15*128 = 3,840 in magnitude, so a block's
 * eight add up exactly in int16 (30,720), in any order, and one vpmaddwd per
 * row and block widens them. The same ops for every row whatever BN, so a
 * sequence's logits do not depend on its batch. */
static inline __attribute__((always_inline)) void q4_tile16(const char *P, const int sym, int64_t nb,
                                                            const kn_act *a, int b0, const int BN, __m256 *out) {
    const size_t bs = sym ? sizeof(kn_pq4s) : sizeof(kn_pq4); /* kn_pq4s: Q4_0, m = -8d not stored */
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const int8_t *xr[2];
    __m256 acc[4];
    for (int t = 0; t < BN; t++) {
        acc[2 * t] = acc[2 * t + 1] = _mm256_setzero_ps();
        xr[t] = a->qs + (size_t)(b0 + t) * a->k;
    }
    for (int64_t blk = 0; blk < nb; blk++) {
        const char *p = P + (size_t)blk * bs;
        const uint8_t *qs = sym ? ((const kn_pq4s *)p)->qs[0] : ((const kn_pq4 *)p)->qs[0];
        const uint16_t *pd = (const uint16_t *)p, *pm = sym ? NULL : ((const kn_pq4 *)p)->m;
        for (int l = 0; l < (int)bs; l += 64) _mm_prefetch(p + PF_AHEAD_AVX2 + l, _MM_HINT_T0);
        __m256i u[4];
        for (int c = 0; c < 4; c++) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(qs + 64 * c));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(qs + 64 * c + 32));
            __m256i lo0 = _mm256_and_si256(v0, m4), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4);
            __m256i lo1 = _mm256_and_si256(v1, m4), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4);
            for (int t = 0; t < BN; t++) {
                const int32_t *xb = (const int32_t *)(xr[t] + 32 * blk);
                __m256i bl = _mm256_set1_epi32(xb[2 * c]), bh = _mm256_set1_epi32(xb[2 * c + 1]);
                __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, bl), _mm256_maddubs_epi16(hi0, bh));
                __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo1, bl), _mm256_maddubs_epi16(hi1, bh));
                u[2 * t] = c ? _mm256_add_epi16(u[2 * t], s0) : s0;
                u[2 * t + 1] = c ? _mm256_add_epi16(u[2 * t + 1], s1) : s1;
                KEEP(u[2 * t]);
                KEEP(u[2 * t + 1]);
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pd + 8 * h)));
            __m256 mw = sym ? _mm256_mul_ps(dw, _mm256_set1_ps(-8.f))
                            : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pm + 8 * h)));
            for (int t = 0; t < BN; t++) {
                size_t ai = (size_t)(b0 + t) * a->nblk + blk;
                __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(u[2 * t + h], ones));
                acc[2 * t + h] = _mm256_fmadd_ps(s, _mm256_mul_ps(dw, _mm256_set1_ps(a->d[ai])), acc[2 * t + h]);
                acc[2 * t + h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a->ds[ai]), acc[2 * t + h]);
            }
        }
    }
    for (int i = 0; i < 2 * BN; i++) out[i] = acc[i];
}

static __attribute__((noinline)) void tile16_q4(const kn_weight *w, int64_t g, int64_t nb, const kn_act *a, int b0,
                                                 int bn, __m256 *acc) {
    if (w->pack == KN_PACK_Q4S) {
        const char *P = (const char *)((const kn_pq4s *)w->packed + g * nb);
        if (bn == 2) q4_tile16(P, 1, nb, a, b0, 2, acc);
        else q4_tile16(P, 1, nb, a, b0, 1, acc);
        return;
    }
    const char *P = (const char *)((const kn_pq4 *)w->packed + g * nb);
    if (bn == 2) q4_tile16(P, 0, nb, a, b0, 2, acc);
    else q4_tile16(P, 0, nb, a, b0, 1, acc);
}

/* Q8: weights stored q+128; xor gives signed q, and |q| * sign(x, q) keeps
 * vpmaddubsw's pair sums within int16 (but two of them would not be, so
 * each is widened). One 8-row half h against BN <= BT2 activation rows. */
static inline __attribute__((always_inline)) void q8_tile(const kn_pq8 *P, int64_t nb, int h, const kn_act *a,
                                                          int b0, const int BN, __m256 *out) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[BT2];
    for (int t = 0; t < BN; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const kn_pq8 *p = &P[blk];
        if (h == 0)
            for (int l = 0; l < (int)sizeof *p; l += 64) _mm_prefetch((const char *)p + PF_AHEAD_AVX2 + l, _MM_HINT_T0);
        __m256i si[BT2];
        for (int t = 0; t < BN; t++) si[t] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p->qs[c] + 32 * h)), flip);
            __m256i aq = _mm256_abs_epi8(q);
            for (int t = 0; t < BN; t++) {
                const int32_t *xb = (const int32_t *)(a->qs + (size_t)(b0 + t) * a->k + 32 * blk);
                __m256i tt = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_set1_epi32(xb[c]), q));
                si[t] = _mm256_add_epi32(si[t], _mm256_madd_epi16(tt, ones));
                KEEP(si[t]);
            }
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->d + 8 * h)));
        for (int t = 0; t < BN; t++) {
            size_t ai = (size_t)(b0 + t) * a->nblk + blk;
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si[t]), _mm256_mul_ps(dw, _mm256_set1_ps(a->d[ai])), acc[t]);
        }
    }
    for (int t = 0; t < BN; t++) out[t] = acc[t];
}

/* kn_pq8h: one 8-row half h against BN <= BT2 activation rows. Weights are 0..63, so a vpmaddubsw
 * lane is at most 2*63*128 = 16,128 and two chunks' add up exactly in int16; the block's halves of 16
 * elements (chunks 0-3, 4-7) sum apart, each to its own scale, and the minimums take the activations'
 * half sums. */
/* Bits 2c, 2c+1 of each byte of h moved to bits 4, 5 (kn_pq6h's top two bits of chunk c). */
static inline __m256i top2(__m256i h, int c) {
    const __m256i m30 = _mm256_set1_epi8(0x30);
    switch (c & 3) {
    case 0: return _mm256_and_si256(_mm256_slli_epi16(h, 4), m30);
    case 1: return _mm256_and_si256(_mm256_slli_epi16(h, 2), m30);
    case 2: return _mm256_and_si256(h, m30);
    default: return _mm256_and_si256(_mm256_srli_epi16(h, 2), m30);
    }
}

/* mode 0: kn_pq8h; 1: kn_pq4h; 2: kn_pq6h (nibbles and two bits from qh); 3: kn_pq6s (2's, m = -32d). */
static inline __attribute__((always_inline)) void q8h_tile(const char *P, int64_t nb, int h, const kn_act *a,
                                                           int b0, const int BN, __m256 *out, const int mode) {
    const int nib = mode != 0;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0f);
    const size_t bs = kn_q8h_bytes(mode), qo = kn_q8h_qs(mode);
    __m256 acc[BT2];
    for (int t = 0; t < BN; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const kn_pq8h *p = (const kn_pq8h *)(P + (size_t)blk * bs);
        if (h == 0)
            for (int l = 0; l < (int)bs; l += 64) _mm_prefetch((const char *)p + PF_AHEAD_AVX2 + l, _MM_HINT_T0);
        const uint8_t *qs = (const uint8_t *)p + qo;
        __m256i v4[4], qh[2];
        if (nib) /* kn_pq4h: chunk c in the low nibbles of qs[c & 3] (c < 4), else the high ones */
            for (int c = 0; c < 4; c++) v4[c] = _mm256_loadu_si256((const __m256i *)(qs + 64 * c + 32 * h));
        if (mode >= 2)
            for (int e = 0; e < 2; e++) qh[e] = _mm256_loadu_si256((const __m256i *)(qs + 256 + 64 * e + 32 * h));
        for (int e = 0; e < 2; e++) {
            __m256i si[BT2];
            for (int t = 0; t < BN; t++) si[t] = _mm256_setzero_si256();
            for (int c = 4 * e; c < 4 * e + 4; c += 2) {
                __m256i w0, w1;
                if (nib) {
                    w0 = _mm256_and_si256(e ? _mm256_srli_epi16(v4[c & 3], 4) : v4[c & 3], m4);
                    w1 = _mm256_and_si256(e ? _mm256_srli_epi16(v4[(c + 1) & 3], 4) : v4[(c + 1) & 3], m4);
                    if (mode >= 2) {
                        w0 = _mm256_or_si256(w0, top2(qh[e], c));
                        w1 = _mm256_or_si256(w1, top2(qh[e], c + 1));
                    }
                } else {
                    w0 = _mm256_loadu_si256((const __m256i *)(qs + 64 * c + 32 * h));
                    w1 = _mm256_loadu_si256((const __m256i *)(qs + 64 * (c + 1) + 32 * h));
                }
                for (int t = 0; t < BN; t++) {
                    const int32_t *xb = (const int32_t *)(a->qs + (size_t)(b0 + t) * a->k + 32 * blk);
                    __m256i tt = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(xb[c])),
                                                  _mm256_maddubs_epi16(w1, _mm256_set1_epi32(xb[c + 1])));
                    si[t] = _mm256_add_epi32(si[t], _mm256_madd_epi16(tt, ones));
                    KEEP(si[t]);
                }
            }
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->d[e] + 8 * h)));
            __m256 mw = mode == 3 ? _mm256_mul_ps(dw, _mm256_set1_ps(-32.f))
                                  : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->m[e] + 8 * h)));
            for (int t = 0; t < BN; t++) {
                size_t ai = (size_t)(b0 + t) * a->nblk + blk;
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si[t]), _mm256_mul_ps(dw, _mm256_set1_ps(a->d[ai])), acc[t]);
                acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a->hs[2 * ai + e]), acc[t]);
            }
        }
    }
    for (int t = 0; t < BN; t++) out[t] = acc[t];
}
static inline __attribute__((always_inline)) void q8h_tile8(const char *P, int64_t nb, int h, const kn_act *a, int b0,
                                                            const int BN, __m256 *out) {
    q8h_tile(P, nb, h, a, b0, BN, out, 0);
}
static inline __attribute__((always_inline)) void q4h_tile(const char *P, int64_t nb, int h, const kn_act *a, int b0,
                                                           const int BN, __m256 *out) {
    q8h_tile(P, nb, h, a, b0, BN, out, 1);
}
static inline __attribute__((always_inline)) void q6h_tile(const char *P, int64_t nb, int h, const kn_act *a, int b0,
                                                           const int BN, __m256 *out) {
    q8h_tile(P, nb, h, a, b0, BN, out, 2);
}
static inline __attribute__((always_inline)) void q6s_tile(const char *P, int64_t nb, int h, const kn_act *a, int b0,
                                                           const int BN, __m256 *out) {
    q8h_tile(P, nb, h, a, b0, BN, out, 3);
}

/* The tile for bn rows (1..BT2), each size its own inlined copy. */
#define BY_SIZE(fn, P)                                                                                 \
    switch (bn) {                                                                                      \
    case 4: fn(P, nb, h, a, b0, 4, acc); break;                                                        \
    case 3: fn(P, nb, h, a, b0, 3, acc); break;                                                        \
    case 2: fn(P, nb, h, a, b0, 2, acc); break;                                                        \
    default: fn(P, nb, h, a, b0, 1, acc); break;                                                       \
    }
static __attribute__((noinline)) void tile_q8(const kn_weight *w, int64_t g, int64_t nb, int h, const kn_act *a,
                                               int b0, int bn, __m256 *acc) {
    if (w->pack == KN_PACK_Q8H) BY_SIZE(q8h_tile8, (const char *)((const kn_pq8h *)w->packed + g * nb))
    else if (w->pack == KN_PACK_Q4H) BY_SIZE(q4h_tile, (const char *)((const kn_pq4h *)w->packed + g * nb))
    else if (w->pack == KN_PACK_Q6H) BY_SIZE(q6h_tile, (const char *)((const kn_pq6h *)w->packed + g * nb))
    else if (w->pack == KN_PACK_Q6S) BY_SIZE(q6s_tile, (const char *)((const kn_pq6s *)w->packed + g * nb))
    else BY_SIZE(q8_tile, (const kn_pq8 *)w->packed + g * nb)
}
#undef BY_SIZE

static void store8(float *yr, int64_t r0, int64_t n, __m256 v) {
    if (r0 + 8 <= n) _mm256_storeu_ps(yr, v);
    else {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        for (int r = 0; r < 8 && r0 + r < n; r++) yr[r] = tmp[r];
    }
}

/* A group's kn_pq4h (mode 1), kn_pq6h (2) or kn_pq6s (3) blocks as kn_pq8h: a batch of more than one
 * tile unpacks each block once instead of once a tile (prefill: the unpacking is a third of the work).
 * Mode 3's m is -32d, which fp16 holds exactly, as the tile computes it in float. */
static void expand_group(const char *P, int mode, int64_t nb, kn_pq8h *out) {
    const size_t bs = kn_q8h_bytes(mode), qo = kn_q8h_qs(mode);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t blk = 0; blk < nb; blk++) {
        const kn_pq8h *p = (const kn_pq8h *)(P + (size_t)blk * bs); /* d (and m) where kn_pq8h has them */
        const uint8_t *qs = (const uint8_t *)p + qo, *qh = qs + 256;
        kn_pq8h *o = &out[blk];
        if (mode == 3) {
            memcpy(o->d, p->d, sizeof o->d);
            for (int e = 0; e < 2; e++)
                for (int r = 0; r < KN_ROWS; r++) o->m[e][r] = cm_f32_to_f16(-32.f * cm_f16_to_f32(o->d[e][r]));
        } else {
            memcpy(o->d, p->d, sizeof o->d + sizeof o->m);
        }
        for (int h = 0; h < 2; h++) {
            __m256i q0 = _mm256_setzero_si256(), q1 = q0;
            if (mode >= 2) {
                q0 = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
                q1 = _mm256_loadu_si256((const __m256i *)(qh + 64 + 32 * h));
            }
            for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * c + 32 * h));
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (mode >= 2) {
                    lo = _mm256_or_si256(lo, top2(q0, c));
                    hi = _mm256_or_si256(hi, top2(q1, c));
                }
                _mm256_storeu_si256((__m256i *)(o->qs[c] + 32 * h), lo);
                _mm256_storeu_si256((__m256i *)(o->qs[c + 4] + 32 * h), hi);
            }
        }
    }
}

static void gemm_avx2(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy, int64_t g0, int64_t g1) {
    int64_t nb = w->k / 32;
    if (w->pack == KN_PACK_Q4 || w->pack == KN_PACK_Q4S) { /* whole groups, two activation rows a tile */
        for (int64_t g = g0; g < g1; g++)
            for (int b0 = 0; b0 < B; b0 += 2) {
                int bn = B - b0 < 2 ? B - b0 : 2;
                __m256 acc[4];
                tile16_q4(w, g, nb, a, b0, bn, acc);
                for (int t = 0; t < bn; t++)
                    for (int h = 0; h < 2; h++) {
                        int64_t r0 = g * KN_ROWS + 8 * h;
                        if (r0 < w->n) store8(y + (size_t)(b0 + t) * ldy + r0, r0, w->n, acc[2 * t + h]);
                    }
            }
        return;
    }
    /* kn_pq4h / kn_pq6h against more than one tile: each group expanded to kn_pq8h once (x), not per tile;
       without the memory for it, unpacked per tile */
    int mode = kn_q8h_mode(w->pack);
    kn_pq8h *x = mode && B > BT2 ? aligned_alloc(64, sizeof(kn_pq8h) * (size_t)nb) : NULL;
    for (int64_t g = g0; g < g1; g++) {
        const kn_weight *tw = w;
        int64_t tg = g;
        kn_weight v;
        if (x) {
            expand_group((const char *)w->packed + (size_t)(g * nb) * kn_q8h_bytes(mode), mode, nb, x);
            v = *w;
            v.pack = KN_PACK_Q8H;
            v.packed = x;
            tw = &v, tg = 0;
        }
        for (int h = 0; h < 2; h++) {
            int64_t r0 = g * KN_ROWS + 8 * h;
            if (r0 >= w->n) break;
            for (int b0 = 0; b0 < B; b0 += BT2) {
                int bn = B - b0 < BT2 ? B - b0 : BT2;
                __m256 acc[BT2];
                tile_q8(tw, tg, nb, h, a, b0, bn, acc);
                for (int t = 0; t < bn; t++) store8(y + (size_t)(b0 + t) * ldy + r0, r0, w->n, acc[t]);
            }
        }
    }
    free(x);
}

static float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* exp(x) for -87 <= x <= 0: 2^(x log2 e) as 2^n * p(f), p the degree-7
 * Taylor polynomial of 2^f on |f| <= 0.5 (as exp_avx512), 2^n built in the
 * exponent bits (n >= -126 here, a normal float). */
static inline __m256 exp_avx2(__m256 x) {
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(kn_exp2_poly[0]);
    for (int k = 1; k < 8; k++) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kn_exp2_poly[k]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static float exp_sum_avx2(const float *x, int n, float mx, float scale, float *out) {
    const __m256 vm = _mm256_set1_ps(mx), vs = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-87.f);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vs);
        __m256 live = _mm256_cmp_ps(v, lo, _CMP_GE_OQ); /* -inf (masked) and NaN: 0 */
        __m256 e = _mm256_and_ps(live, exp_avx2(_mm256_max_ps(v, lo)));
        _mm256_storeu_ps(out + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum8(acc) + kn_exp_sum_scalar(x + i, n - i, mx, scale, out + i);
}

/* 8 elements starting at element i of the row at p. */
static inline __m256 kv_load8(const char *p, int i, int kind) {
    if (kind == KN_KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    if (kind == KN_KV_BF16) /* bf16 is the top half of an f32 */
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
    if (kind == KN_KV_FP8) { /* E4M3 bits placed in an f16's, read as the value times 2^-8 (kn_avx512.c) */
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + i)));
        __m128i hb = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7),
                                  _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
        return _mm256_mul_ps(_mm256_cvtph_ps(hb), _mm256_set1_ps(256.f));
    }
    return _mm256_loadu_ps((const float *)p + i);
}

/* The cache lines of a row of hd elements, asked for ahead of their use. */
static inline void kv_prefetch8(const char *row, int hd, int kind) {
    int bytes = hd * (kind == KN_KV_FP8 ? 1 : kind == KN_KV_F32 ? 4 : 2);
    for (int o = 0; o < bytes; o += 64) _mm_prefetch(row + o, _MM_HINT_T0);
}

/* r[p] = sum of the 8 lanes of a[p], p = 0..7. */
static inline __m256 reduce8(const __m256 *a) {
    __m256 b0 = _mm256_hadd_ps(a[0], a[1]), b1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 b2 = _mm256_hadd_ps(a[4], a[5]), b3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 c0 = _mm256_hadd_ps(b0, b1), c1 = _mm256_hadd_ps(b2, b3);
    return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
}

/* A head's softmax numerators in place (scores minus the max mx of the
 * positions, never below -87 after scaling by 1); returns their sum, the
 * sink's term included. */
static inline float exp_row_avx2(const kn_kv_rows *kv, int h, int len, float mx, float *sh) {
    mx = kn_sink_max(kv, h, mx);
    __m256 vm = _mm256_set1_ps(mx), vs = _mm256_setzero_ps();
    int j;
    for (j = 0; j + 8 <= len; j += 8) {
        __m256 e = exp_avx2(_mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(sh + j), vm), _mm256_set1_ps(-87.f)));
        _mm256_storeu_ps(sh + j, e);
        vs = _mm256_add_ps(vs, e);
    }
    float sum = hsum8(vs);
    for (; j < len; j++) sum += (sh[j] = expf(sh[j] - mx));
    return kv->sink ? sum + expf(kv->sink[h] - mx) : sum;
}

/* The scores of one head, 8 positions per register (K rows come from L1
 * for the group's other heads), and their exp; returns the sum. */
static inline float scores_avx2(const float *qh, const kn_kv_rows *kv, int h, int len, int nv, float scale, float *sh,
                                int kind) {
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= len; j += 8) {
        __m256 acc[8];
        for (int p = 0; p < 8; p++) {
            const char *row = kv->k + kn_kv_off(kv, j + p);
            if (h == 0 && j + 16 + p < len) kv_prefetch8(kv->k + kn_kv_off(kv, j + 16 + p), 8 * nv, kind);
            acc[p] = _mm256_mul_ps(_mm256_loadu_ps(qh), kv_load8(row, 0, kind));
            for (int v = 1; v < nv; v++) acc[p] = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v), kv_load8(row, 8 * v, kind), acc[p]);
        }
        __m256 sc = _mm256_mul_ps(reduce8(acc), _mm256_set1_ps(scale));
        _mm256_storeu_ps(sh + j, sc);
        vmx = _mm256_max_ps(vmx, sc);
    }
    float mx = hmax8(vmx);
    for (; j < len; j++) {
        const char *row = kv->k + kn_kv_off(kv, j);
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qh), kv_load8(row, 0, kind));
        for (int v = 1; v < nv; v++) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v), kv_load8(row, 8 * v, kind), acc);
        sh[j] = hsum8(acc) * scale;
        mx = sh[j] > mx ? sh[j] : mx;
    }
    return exp_row_avx2(kv, h, len, mx, sh);
}

/* out[h] = sum_j s[h][j] V_j / sums[h] for G heads (G <= 3) and 32 columns
 * from c: each V row is read once for the heads, 12 accumulators in
 * registers. */
static inline void pv_avx2(const kn_kv_rows *kv, const float *s, int len, int hd, int G, int c, const float *inv,
                           float *out, int kind) {
    __m256 o[3][4];
    for (int h = 0; h < G; h++)
        for (int v = 0; v < 4; v++) o[h][v] = _mm256_setzero_ps();
    for (int j = 0; j < len; j++) {
        const char *row = kv->v + kn_kv_off(kv, j);
        if (c == 0 && j + 16 < len) kv_prefetch8(kv->v + kn_kv_off(kv, j + 16), hd, kind);
        __m256 p[3];
        for (int h = 0; h < G; h++) p[h] = _mm256_broadcast_ss(s + (size_t)h * len + j);
        for (int v = 0; v < 4; v++) {
            __m256 vv = kv_load8(row, c + 8 * v, kind);
            for (int h = 0; h < G; h++) o[h][v] = _mm256_fmadd_ps(p[h], vv, o[h][v]);
        }
    }
    for (int h = 0; h < G; h++)
        for (int v = 0; v < 4; v++)
            _mm256_storeu_ps(out + (size_t)h * hd + c + 8 * v, _mm256_mul_ps(o[h][v], _mm256_set1_ps(inv[h])));
}

/* nv = hd/8 and the cache type are constants at each call site. Heads go
 * through the V pass 3 at a time; a head's arithmetic is the same whichever
 * heads share its pass, so the result never depends on the batch. */
static inline void attn_body_avx2(const float *q, const kn_kv_rows *kv, int len, int nv, int g, float scale, float *s,
                                  float *out, int kind) {
    int hd = 8 * nv;
    float inv[8];
    for (int h = 0; h < g; h++) inv[h] = 1.f / scores_avx2(q + (size_t)h * hd, kv, h, len, nv, scale, s + (size_t)h * len, kind);
    for (int h0 = 0; h0 < g; h0 += 3) {
        int G = g - h0 < 3 ? g - h0 : 3;
        const float *sh = s + (size_t)h0 * len;
        float *oh = out + (size_t)h0 * hd;
        for (int c = 0; c < hd; c += 32) {
            if (G == 3) pv_avx2(kv, sh, len, hd, 3, c, inv + h0, oh, kind);
            else if (G == 2) pv_avx2(kv, sh, len, hd, 2, c, inv + h0, oh, kind);
            else pv_avx2(kv, sh, len, hd, 1, c, inv + h0, oh, kind);
        }
    }
}

/* Rows j0 .. j0+nk-1 of base (K or V) as f32 in dst [nk][8 nv]; the rows 16
 * on (below lmax) asked for meanwhile. */
static inline void rows_f32_avx2(const kn_kv_rows *kv, const char *base, int j0, int nk, int lmax, int nv, int kind,
                                 float *dst) {
    for (int p = 0; p < nk; p++) {
        const char *row = base + kn_kv_off(kv, j0 + p);
        if (j0 + 16 + p < lmax) kv_prefetch8(base + kn_kv_off(kv, j0 + 16 + p), 8 * nv, kind);
        for (int v = 0; v < nv; v++) _mm256_storeu_ps(dst + p * 8 * nv + 8 * v, kv_load8(row, 8 * v, kind));
    }
}

/* attn_tile (kn_int.h): nt tokens x g heads = R rows of one KV head. Each
 * block of 8 K rows (16 V rows) is converted to f32 once (kt, vt) and used by
 * every row that reaches it; a row's scores, exp, sums and output are
 * attn_body_avx2's operations in its order (pv_avx2's accumulators move
 * through ob between V blocks, which changes no value). */
static inline void attn_tile_body_avx2(const float *q, size_t qs, const kn_kv_rows *kv, int len0, int nt, int nv,
                                       int g, float scale, float *s, float *out, int kind) {
    int hd = 8 * nv, R = nt * g, lmax = len0 + nt - 1;
    float *kt = s + (size_t)R * lmax, *vt = kt + 8 * hd, *ob = vt + 16 * hd;
    __m256 vmx[KN_ATTN_TILE_ROWS];
    float tmx[KN_ATTN_TILE_ROWS], inv[KN_ATTN_TILE_ROWS];
    for (int r = 0; r < R; r++) {
        vmx[r] = _mm256_set1_ps(-INFINITY);
        tmx[r] = -INFINITY;
    }
    for (int j0 = 0; j0 < lmax; j0 += 8) {
        int nk = lmax - j0 < 8 ? lmax - j0 : 8;
        rows_f32_avx2(kv, kv->k, j0, nk, lmax, nv, kind, kt);
        for (int r = 0; r < R; r++) {
            int len = len0 + r / g;
            if (len <= j0) continue;
            const float *qh = q + (size_t)(r / g) * qs + (size_t)(r % g) * hd;
            float *sh = s + (size_t)r * lmax;
            if (j0 + 8 <= len) {
                __m256 acc[8];
                for (int p = 0; p < 8; p++) {
                    acc[p] = _mm256_mul_ps(_mm256_loadu_ps(qh), _mm256_loadu_ps(kt + p * hd));
                    for (int v = 1; v < nv; v++)
                        acc[p] = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v), _mm256_loadu_ps(kt + p * hd + 8 * v), acc[p]);
                }
                __m256 sc = _mm256_mul_ps(reduce8(acc), _mm256_set1_ps(scale));
                _mm256_storeu_ps(sh + j0, sc);
                vmx[r] = _mm256_max_ps(vmx[r], sc);
            } else {
                for (int j = j0; j < len; j++) {
                    const float *kr = kt + (j - j0) * hd;
                    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qh), _mm256_loadu_ps(kr));
                    for (int v = 1; v < nv; v++)
                        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v), _mm256_loadu_ps(kr + 8 * v), acc);
                    sh[j] = hsum8(acc) * scale;
                    tmx[r] = sh[j] > tmx[r] ? sh[j] : tmx[r];
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        float mx = hmax8(vmx[r]);
        mx = tmx[r] > mx ? tmx[r] : mx;
        inv[r] = 1.f / exp_row_avx2(kv, r % g, len0 + r / g, mx, s + (size_t)r * lmax);
    }
    memset(ob, 0, sizeof(float) * (size_t)R * hd);
    for (int j0 = 0; j0 < lmax; j0 += 16) {
        int nk = lmax - j0 < 16 ? lmax - j0 : 16;
        rows_f32_avx2(kv, kv->v, j0, nk, lmax, nv, kind, vt);
        for (int rb = 0; rb < R; rb += 3)
            for (int c = 0; c < hd; c += 32) {
                __m256 o[3][4];
                int lim[3];
                for (int rr = 0; rr < 3; rr++) {
                    lim[rr] = rb + rr < R ? len0 + (rb + rr) / g : 0; /* row rb+rr reads positions below lim */
                    for (int v = 0; v < 4; v++)
                        o[rr][v] = rb + rr < R ? _mm256_loadu_ps(ob + (size_t)(rb + rr) * hd + c + 8 * v)
                                               : _mm256_setzero_ps();
                }
                for (int p = 0; p < nk; p++) {
                    int j = j0 + p;
                    __m256 pr[3];
                    for (int rr = 0; rr < 3; rr++)
                        pr[rr] = j < lim[rr] ? _mm256_broadcast_ss(s + (size_t)(rb + rr) * lmax + j) : _mm256_setzero_ps();
                    for (int v = 0; v < 4; v++) {
                        __m256 vv = _mm256_loadu_ps(vt + p * hd + c + 8 * v);
                        for (int rr = 0; rr < 3; rr++)
                            if (j < lim[rr]) o[rr][v] = _mm256_fmadd_ps(pr[rr], vv, o[rr][v]);
                    }
                }
                for (int rr = 0; rr < 3 && rb + rr < R; rr++)
                    for (int v = 0; v < 4; v++) _mm256_storeu_ps(ob + (size_t)(rb + rr) * hd + c + 8 * v, o[rr][v]);
            }
    }
    for (int r = 0; r < R; r++) {
        float *dst = out + (size_t)(r / g) * qs + (size_t)(r % g) * hd;
        for (int c = 0; c < hd; c += 8)
            _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(ob + (size_t)r * hd + c), _mm256_set1_ps(inv[r])));
    }
}

static int attn_tile_avx2(const float *q, size_t qs, const kn_kv_rows *kv, int len0, int nt, int hd, int g, float scale,
                          float *s, float *out) {
    if (hd % 32 || hd > 256 || g > 8 || nt * g > KN_ATTN_TILE_ROWS) return 0;
    if (hd == 64 && kv->kind == KN_KV_F16) attn_tile_body_avx2(q, qs, kv, len0, nt, 8, g, scale, s, out, KN_KV_F16);
    else if (hd == 128 && kv->kind == KN_KV_F16) attn_tile_body_avx2(q, qs, kv, len0, nt, 16, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_F16) attn_tile_body_avx2(q, qs, kv, len0, nt, hd / 8, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_FP8) attn_tile_body_avx2(q, qs, kv, len0, nt, hd / 8, g, scale, s, out, KN_KV_FP8);
    else if (kv->kind == KN_KV_BF16) attn_tile_body_avx2(q, qs, kv, len0, nt, hd / 8, g, scale, s, out, KN_KV_BF16);
    else attn_tile_body_avx2(q, qs, kv, len0, nt, hd / 8, g, scale, s, out, KN_KV_F32);
    return 1;
}

static void attn_group_avx2(const float *q, const kn_kv_rows *kv, int len, int hd, int g, float scale, float *s,
                            float *out) {
    if (hd % 32 || hd > 256 || g > 8) {
        kn_attn_group_generic(q, kv, len, hd, g, scale, s, out);
        return;
    }
    if (hd == 64 && kv->kind == KN_KV_F16) attn_body_avx2(q, kv, len, 8, g, scale, s, out, KN_KV_F16);
    else if (hd == 128 && kv->kind == KN_KV_F16) attn_body_avx2(q, kv, len, 16, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_F16) attn_body_avx2(q, kv, len, hd / 8, g, scale, s, out, KN_KV_F16);
    else if (kv->kind == KN_KV_FP8) attn_body_avx2(q, kv, len, hd / 8, g, scale, s, out, KN_KV_FP8);
    else if (kv->kind == KN_KV_BF16) attn_body_avx2(q, kv, len, hd / 8, g, scale, s, out, KN_KV_BF16);
    else attn_body_avx2(q, kv, len, hd / 8, g, scale, s, out, KN_KV_F32);
}

static void f16_to_f32_avx2(const uint16_t *src, float *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    kn_f16_to_f32_scalar(src + i, dst + i, n - i);
}

static void f32_to_f16_avx2(const float *src, uint16_t *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    kn_f32_to_f16_scalar(src + i, dst + i, n - i);
}

/* silu(a) * b = a * b / (1 + exp(-a)); exp_avx2 takes -87 <= x: beyond it
 * 1 + exp(-a) is huge and the result -0-ish, so -a is clamped to 87 above
 * (exp(87) ~ 6e37 keeps a*b/that at 0 for any float a*b that matters) and
 * -87 below (exp(-87) ~ 0: the result is a*b). */
static void silu_mul_avx2(float *a, const float *b, int n) {
    const __m256 one = _mm256_set1_ps(1.f), lo = _mm256_set1_ps(-87.f), hi = _mm256_set1_ps(87.f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i);
        __m256 e = exp_avx2(_mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), lo), hi));
        _mm256_storeu_ps(a + i, _mm256_div_ps(_mm256_mul_ps(x, _mm256_loadu_ps(b + i)), _mm256_add_ps(one, e)));
    }
    kn_silu_mul_scalar(a + i, b + i, n - i);
}

/* gelu(a) * b in GELU's tanh form: 0.5 a (1 + tanh(u)) = a / (1 + exp(-2u)), u = sqrt(2/pi) (a + 0.044715 a^3),
 * -2u clamped to [-87, 87] for the exp (below, the result is a*b; above, 0: the quotient itself would not
 * reach 0 for a far below -87). */
static void gelu_mul_avx2(float *a, const float *b, int n) {
    const __m256 one = _mm256_set1_ps(1.f), lo = _mm256_set1_ps(-87.f), hi = _mm256_set1_ps(87.f);
    const __m256 c1 = _mm256_set1_ps(-1.5957691216f), c3 = _mm256_set1_ps(0.044715f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i);
        __m256 z = _mm256_mul_ps(c1, _mm256_fmadd_ps(_mm256_mul_ps(c3, _mm256_mul_ps(x, x)), x, x));
        __m256 e = exp_avx2(_mm256_min_ps(_mm256_max_ps(z, lo), hi));
        __m256 y = _mm256_div_ps(_mm256_mul_ps(x, _mm256_loadu_ps(b + i)), _mm256_add_ps(one, e));
        _mm256_storeu_ps(a + i, _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(z, hi, _CMP_GT_OQ)));
    }
    kn_gelu_mul_scalar(a + i, b + i, n - i);
}

KN_GEMM_F32(gemm_f32_avx2, 8)

#define KN_LORA_LOADH(v, p) (v) = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
KN_LORA(lora_avx2, 8)

const kn_impl kn_impl_avx2 = {"avx2", quant_act_avx2, gemm_avx2, gemm_avx2, gemm_avx2, dot_avx2, gemm_f32_avx2,
                              attn_group_avx2, f32_to_f16_avx2, f16_to_f32_avx2, silu_mul_avx2, exp_sum_avx2,
                              lora_avx2_shrink, lora_avx2_expand, attn_tile_avx2, gelu_mul_avx2};
