/* kn_neon.h - shared by the two NEON files (kn_neon.c, kn_neon_dot.c). */
#ifndef KN_NEON_H
#define KN_NEON_H

#include "kn_int.h"

#include <arm_neon.h>

#define KN_NEON_BT 4 /* activation rows per register tile */

/* Unpacks block blk of 16-row group g into signed int8 wq[chunk][rows 4r..4r+3] (Q8: stored
 * +128, the xor makes it signed; Q4: low nibbles then high per 16-byte chunk; Q8H: 0..63 as
 * stored; Q4H: Q8H's chunks from nibbles) with its scales dw and, for Q4 and Q8H, minimums mw (zero for Q8), prefetching 4 KiB
 * ahead as the x86 paths do. Index [e] of dw and mw is the half block (chunks 4e..4e+3): Q8H's
 * differ, the others' are the same. */
static inline void kn_neon_unpack(const kn_weight *w, int64_t g, int64_t nb, int64_t blk, int8x16_t wq[8][4],
                                  float32x4_t dw[2][4], float32x4_t mw[2][4]) {
    if (kn_pack_q8h(w->pack)) {
        const kn_pq8h *p;
        int mode = kn_q8h_mode(w->pack);
        if (mode) { /* chunk c in the low nibbles of qs[c & 3] (c < 4), else the high ones */
            int six = mode >= 2;
            const char *pb = (const char *)w->packed + (size_t)(g * nb + blk) * kn_q8h_bytes(mode);
            const uint8_t *qs = (const uint8_t *)pb + kn_q8h_qs(mode), *qh = qs + 256;
            const uint8x16_t m4 = vdupq_n_u8(0x0f), m30 = vdupq_n_u8(0x30);
            __builtin_prefetch(pb + 4096);
            __builtin_prefetch(pb + 4096 + 256);
            for (int c = 0; c < 4; c++)
                for (int r = 0; r < 4; r++) {
                    uint8x16_t v = vld1q_u8(qs + 64 * c + 16 * r);
                    uint8x16_t lo = vandq_u8(v, m4), hi = vshrq_n_u8(v, 4);
                    if (six) { /* two more bits, from qh[e] bits 2c..2c+1, to bits 4..5 */
                        uint8x16_t h0 = vld1q_u8(qh + 16 * r), h1 = vld1q_u8(qh + 64 + 16 * r);
                        switch (c) {
                        case 0: h0 = vshlq_n_u8(h0, 4), h1 = vshlq_n_u8(h1, 4); break;
                        case 1: h0 = vshlq_n_u8(h0, 2), h1 = vshlq_n_u8(h1, 2); break;
                        case 2: break;
                        default: h0 = vshrq_n_u8(h0, 2), h1 = vshrq_n_u8(h1, 2); break;
                        }
                        lo = vorrq_u8(lo, vandq_u8(h0, m30));
                        hi = vorrq_u8(hi, vandq_u8(h1, m30));
                    }
                    wq[c][r] = vreinterpretq_s8_u8(lo);
                    wq[c + 4][r] = vreinterpretq_s8_u8(hi);
                }
            p = (const kn_pq8h *)pb; /* d and m where kn_pq8h has them */
        } else {
            p = (const kn_pq8h *)w->packed + g * nb + blk;
            __builtin_prefetch((const char *)p + 4096);
            __builtin_prefetch((const char *)p + 4096 + 256);
            __builtin_prefetch((const char *)p + 4096 + 512);
            for (int c = 0; c < 8; c++)
                for (int r = 0; r < 4; r++) wq[c][r] = vreinterpretq_s8_u8(vld1q_u8(p->qs[c] + 16 * r));
        }
        for (int e = 0; e < 2; e++)
            for (int r = 0; r < 4; r++) {
                dw[e][r] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p->d[e] + 4 * r)));
                mw[e][r] = mode == 3 ? vmulq_n_f32(dw[e][r], -32.f) /* kn_pq6s: m = -32d, not stored */
                                     : vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p->m[e] + 4 * r)));
            }
        return;
    }
    if (w->pack == KN_PACK_Q8) {
        const kn_pq8 *p = (const kn_pq8 *)w->packed + g * nb + blk;
        __builtin_prefetch((const char *)p + 4096);
        __builtin_prefetch((const char *)p + 4096 + 256);
        for (int c = 0; c < 8; c++)
            for (int r = 0; r < 4; r++)
                wq[c][r] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p->qs[c] + 16 * r), vdupq_n_u8(0x80)));
        for (int r = 0; r < 4; r++) {
            dw[0][r] = dw[1][r] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p->d + 4 * r)));
            mw[0][r] = mw[1][r] = vdupq_n_f32(0);
        }
        return;
    }
    int sym = w->pack == KN_PACK_Q4S; /* kn_pq4s: Q4_0, m = -8d not stored */
    const char *p = sym ? (const char *)((const kn_pq4s *)w->packed + g * nb + blk)
                        : (const char *)((const kn_pq4 *)w->packed + g * nb + blk);
    const uint8_t *qs = sym ? ((const kn_pq4s *)p)->qs[0] : ((const kn_pq4 *)p)->qs[0];
    const uint16_t *pd = (const uint16_t *)p;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    __builtin_prefetch(p + 4096);
    __builtin_prefetch(p + 4096 + 256);
    for (int c = 0; c < 4; c++)
        for (int r = 0; r < 4; r++) {
            uint8x16_t v = vld1q_u8(qs + 64 * c + 16 * r);
            wq[2 * c][r] = vreinterpretq_s8_u8(vandq_u8(v, m4));
            wq[2 * c + 1][r] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        }
    for (int r = 0; r < 4; r++) {
        dw[0][r] = dw[1][r] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(pd + 4 * r)));
        mw[0][r] = mw[1][r] = sym ? vmulq_n_f32(dw[0][r], -8.f)
                                  : vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(((const kn_pq4 *)p)->m + 4 * r)));
    }
}

/* Stores a tile's rows of one 16-row group: acc[t][r] holds rows 4r..4r+3. */
void kn_neon_store_rows(float *y, int64_t ldy, int b0, int bn, int64_t g, int64_t n, float32x4_t acc[][4]);
/* The GEMM on sdot (ARMv8.2 dotprod); call only where the CPU has it. */
void kn_neon_gemm_dot(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy, int64_t g0, int64_t g1);

#endif
