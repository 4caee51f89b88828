/* kn_avx2.c - AVX2 + FMA + F16C path (vpmaddubsw + vpmaddwd for the integer
 * dot products). Compiled with those flags; called only after cpuid says so. */
#include "kn_int.h"

#include <immintrin.h>

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

static void gemm_q4_avx2(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy,
                         int64_t g0, int64_t g1) {
    int64_t nb = w->k / 32;
    const kn_pq4 *P = w->packed;
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int64_t g = g0; g < g1; g++)
        for (int h = 0; h < 2; h++) {
            int64_t r0 = g * KN_ROWS + 8 * h;
            if (r0 >= w->n) break;
            for (int b = 0; b < B; b++) {
                __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
                for (int64_t blk = 0; blk < nb; blk++) {
                    const kn_pq4 *p = &P[g * nb + blk];
                    if (h == 0 && b == 0) /* see kn_avx512.c: prefetchers stop at page ends */
                        for (int l = 0; l < (int)sizeof *p; l += 64) _mm_prefetch((const char *)p + 4096 + l, _MM_HINT_T0);
                    const int32_t *xb = (const int32_t *)(a->qs + (size_t)b * a->k + 32 * blk);
                    __m256i s = _mm256_setzero_si256();
                    for (int c = 0; c < 4; c++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(p->qs[c] + 32 * h));
                        __m256i lo = _mm256_and_si256(v, m4);
                        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                        __m256i t0 = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xb[2 * c]));
                        __m256i t1 = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xb[2 * c + 1]));
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_add_epi16(t0, t1), ones));
                    }
                    size_t ai = (size_t)b * a->nblk + blk;
                    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->d + 8 * h)));
                    __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->m + 8 * h)));
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(a->d[ai])), acc);
                    accm = _mm256_fmadd_ps(mw, _mm256_set1_ps(a->ds[ai]), accm);
                }
                acc = _mm256_add_ps(acc, accm);
                float tmp[8];
                _mm256_storeu_ps(tmp, acc);
                for (int r = 0; r < 8 && r0 + r < w->n; r++) y[(size_t)b * ldy + r0 + r] = tmp[r];
            }
        }
}

static void gemm_q8_avx2(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy,
                         int64_t g0, int64_t g1) {
    int64_t nb = w->k / 32;
    const kn_pq8 *P = w->packed;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int64_t g = g0; g < g1; g++)
        for (int h = 0; h < 2; h++) {
            int64_t r0 = g * KN_ROWS + 8 * h;
            if (r0 >= w->n) break;
            for (int b = 0; b < B; b++) {
                __m256 acc = _mm256_setzero_ps();
                for (int64_t blk = 0; blk < nb; blk++) {
                    const kn_pq8 *p = &P[g * nb + blk];
                    if (h == 0 && b == 0)
                        for (int l = 0; l < (int)sizeof *p; l += 64) _mm_prefetch((const char *)p + 4096 + l, _MM_HINT_T0);
                    const int32_t *xb = (const int32_t *)(a->qs + (size_t)b * a->k + 32 * blk);
                    __m256i s = _mm256_setzero_si256();
                    for (int c = 0; c < 8; c++) {
                        /* stored q+128: xor gives signed q; |q| * sign(x, q) keeps
                         * vpmaddubsw's pair sums within int16 */
                        __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p->qs[c] + 32 * h)), flip);
                        __m256i x = _mm256_set1_epi32(xb[c]);
                        __m256i t = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(t, ones));
                    }
                    size_t ai = (size_t)b * a->nblk + blk;
                    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->d + 8 * h)));
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(a->d[ai])), acc);
                }
                float tmp[8];
                _mm256_storeu_ps(tmp, acc);
                for (int r = 0; r < 8 && r0 + r < w->n; r++) y[(size_t)b * ldy + r0 + r] = tmp[r];
            }
        }
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

const kn_impl kn_impl_avx2 = {"avx2", quant_act_avx2, gemm_q4_avx2, gemm_q8_avx2, dot_avx2,
                              kn_attn_group_generic, kn_f32_to_f16_scalar, kn_silu_mul_scalar, exp_sum_avx2};
