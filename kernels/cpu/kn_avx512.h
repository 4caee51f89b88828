/* kn_avx512.h - inline helpers shared by the files compiled with the AVX-512 flags (kn_avx512.c, kn_amx.c);
 * only they include it. */
#ifndef KN_AVX512_H
#define KN_AVX512_H

#include <immintrin.h>

/* Bits 2c, 2c+1 of each byte of h moved to bits 4, 5 (kn_pq6h's top two bits of chunk c). */
static inline __m512i kn_top2(__m512i h, int c) {
    const __m512i m30 = _mm512_set1_epi8(0x30);
    switch (c) {
    case 0: return _mm512_and_si512(_mm512_slli_epi16(h, 4), m30);
    case 1: return _mm512_and_si512(_mm512_slli_epi16(h, 2), m30);
    case 2: return _mm512_and_si512(h, m30);
    default: return _mm512_and_si512(_mm512_srli_epi16(h, 2), m30);
    }
}

#endif
