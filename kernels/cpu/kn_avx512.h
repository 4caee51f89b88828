/* kn_avx512.h - inline helpers shared by the files compiled with the AVX-512 flags (kn_avx512.c, kn_amx.c);
 * only they include it. */
#ifndef KN_AVX512_H
#define KN_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#ifndef PF_AHEAD
#define PF_AHEAD 4096 /* bytes of packed weights the GEMMs prefetch ahead of the block they read */
#endif

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

/* A kn_pq8h-family block's weights (its qs at qs; mode as kn_q8h_mode) as kn_pq8h's eight byte chunks,
 * 0..63 unsigned: chunks 0-3 half 0, 4-7 half 1. kn_pq4h / kn_pq6h's low four bits are the nibbles of
 * qs[c & 3], kn_pq6h's top two come from qh (256 bytes on). */
static inline __attribute__((always_inline)) void kn_q8h_unpack(const uint8_t *qs, int mode, __m512i w[8]) {
    if (!mode) {
        for (int c = 0; c < 8; c++) w[c] = _mm512_loadu_si512(qs + 64 * c);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i h0 = _mm512_setzero_si512(), h1 = h0;
    if (mode >= 2) {
        h0 = _mm512_loadu_si512(qs + 256);
        h1 = _mm512_loadu_si512(qs + 256 + 64);
    }
    for (int c = 0; c < 4; c++) {
        __m512i v = _mm512_loadu_si512(qs + 64 * c);
        w[c] = _mm512_and_si512(v, m4);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (mode >= 2) {
            w[c] = _mm512_or_si512(w[c], kn_top2(h0, c));
            w[c + 4] = _mm512_or_si512(w[c + 4], kn_top2(h1, c));
        }
    }
}

#endif
