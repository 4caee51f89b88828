/* cm_quant.h - the GGUF quantized block formats, decoded two ways.
 *
 * cm_quant_at: element i of a row, straight from the format's definition
 * (ggml's dequantize_row_* loops, read as formulas). Header-only so the CUDA
 * backend's kernels use the same code on the device; the CPU's reference
 * (kn_ref_dequant) and the tests use it on the host.
 *
 * cm_unpack32: one block of 32 elements as unsigned integers u[32] and two
 * affine maps, one per half of 16: w = d[h] * u + m[h]. Every type we run
 * has that shape (the K-quants' sub-blocks are 16 or 32 long), so one
 * repacking and one integer kernel serve them all; the kernels' loaders
 * use it, and tests check it against cm_quant_at and against the gguf
 * Python package.
 *
 * Layouts (bytes; d, dmin, m are fp16; QK_K = 256):
 *   Q4_0 (18)  d, qs[16]                      w = d*(q-8)
 *   Q4_1 (20)  d, m, qs[16]                   w = d*q + m
 *   Q5_0 (22)  d, qh[4], qs[16]               w = d*(q-16), bit j of qh is element j's 5th bit
 *   Q5_1 (24)  d, m, qh[4], qs[16]            w = d*q + m
 *   Q8_0 (34)  d, int8 qs[32]                 w = d*q
 *   Q2_K (84)  scales[16], qs[64], d, dmin    16 sub-blocks of 16: 4-bit scale and min
 *   Q3_K (110) hmask[32], qs[64], scales[12], d   16 of 16: 6-bit signed scales, q in -4..3
 *   Q4_K (144) d, dmin, scales[12], qs[128]   8 of 32: 6-bit scale and min
 *   Q5_K (176) d, dmin, scales[12], qh[32], qs[128]
 *   Q6_K (210) ql[128], qh[64], int8 scales[16], d   16 of 16, q in -32..31
 *   MXFP4 (17) e, qs[16]                      w = 2^(e-128) * K[q], K = E2M1's values doubled
 *              (OCP microscaling: an E8M0 scale 2^(e-127) on 4-bit floats; gpt-oss's experts) */
#ifndef CM_QUANT_H
#define CM_QUANT_H

#include "cm_dtype.h"

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CM_QHD static __host__ __device__ __forceinline__
#else
#define CM_QHD static inline
#endif

/* fp16 at p (little-endian), by arithmetic: the same code on host and device */
CM_QHD float cm_q_half(const uint8_t *p) {
    unsigned h = (unsigned)p[0] | (unsigned)p[1] << 8, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? (float)m * (1.f / 16777216.f) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), (int)e - 25);
    return h & 0x8000 ? -v : v;
}

/* The 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K. */
CM_QHD void cm_q_scale_min_k4(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 6-bit scale (0..63, 32 meaning 0) of sub-block j (0..15) of Q3_K. */
CM_QHD int cm_q_scale_q3k(int j, const uint8_t *s) {
    int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return lo | hi << 4;
}

/* Whether cm_quant_at and cm_unpack32 know the type (a block type we run). */
CM_QHD int cm_quant_known(int type) {
    return type == CM_Q4_0 || type == CM_Q4_1 || type == CM_Q5_0 || type == CM_Q5_1 || type == CM_Q8_0 ||
           type == CM_Q2_K || type == CM_Q3_K || type == CM_Q4_K || type == CM_Q5_K || type == CM_Q6_K ||
           type == CM_MXFP4;
}

/* MXFP4's code q (0..15) as an integer: E2M1 doubled, 0, 1, 2, 3, 4, 6, 8, 12 and their negatives. */
CM_QHD int cm_q_mxfp4(int q) {
    int m = q & 7, v = m < 5 ? m : 2 * m - 4; /* 5, 6, 7 -> 6, 8, 12 */
    v = m == 7 ? 12 : v;
    return q & 8 ? -v : v;
}

/* Element i of a row of a quantized type (cm_quant_known). */
CM_QHD float cm_quant_at(int type, const uint8_t *row, int64_t i) {
    int j = (int)(i % 32);
    switch (type) {
    case CM_Q4_0: {
        const uint8_t *b = row + (i / 32) * 18;
        int q = j < 16 ? b[2 + j] & 15 : b[2 + j - 16] >> 4;
        return cm_q_half(b) * (float)(q - 8);
    }
    case CM_Q4_1: {
        const uint8_t *b = row + (i / 32) * 20;
        int q = j < 16 ? b[4 + j] & 15 : b[4 + j - 16] >> 4;
        return cm_q_half(b) * (float)q + cm_q_half(b + 2);
    }
    case CM_Q5_0: case CM_Q5_1: {
        int one = type == CM_Q5_1, bb = one ? 24 : 22;
        const uint8_t *b = row + (i / 32) * bb, *qh = b + 2 + 2 * one, *qs = qh + 4;
        int q = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | ((qh[j / 8] >> (j % 8)) & 1) << 4;
        return one ? cm_q_half(b) * (float)q + cm_q_half(b + 2) : cm_q_half(b) * (float)(q - 16);
    }
    case CM_Q8_0: {
        const uint8_t *b = row + (i / 32) * 34;
        return cm_q_half(b) * (float)(int8_t)b[2 + j];
    }
    case CM_MXFP4: {
        const uint8_t *b = row + (i / 32) * 17;
        int q = j < 16 ? b[1 + j] & 15 : b[1 + j - 16] >> 4;
        return ldexpf((float)cm_q_mxfp4(q), (int)b[0] - 128);
    }
    case CM_Q4_K: case CM_Q5_K: {
        int five = type == CM_Q5_K, ib = (int)(i % 256), g = ib / 64, half = (ib % 64) / 32, l = ib % 32, sc, mn;
        const uint8_t *b = row + (i / 256) * (five ? 176 : 144), *qs = b + (five ? 48 : 16);
        cm_q_scale_min_k4(2 * g + half, b + 4, &sc, &mn);
        int q = half ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 15;
        if (five) q |= ((b[16 + l] >> (2 * g + half)) & 1) << 4;
        return cm_q_half(b) * (float)sc * (float)q - cm_q_half(b + 2) * (float)mn;
    }
    case CM_Q6_K: {
        const uint8_t *b = row + (i / 256) * 210;
        int ib = (int)(i % 256), n = ib / 128, quarter = (ib % 128) / 32, l = ib % 32;
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        int lo = quarter & 1 ? ql[l + 32] : ql[l];
        lo = quarter & 2 ? lo >> 4 : lo & 15;
        int q = (lo | ((qh[l] >> (2 * quarter)) & 3) << 4) - 32;
        return cm_q_half(b + 208) * (float)(int8_t)b[192 + 8 * n + l / 16 + 2 * quarter] * (float)q;
    }
    case CM_Q2_K: case CM_Q3_K: {
        int three = type == CM_Q3_K, ib = (int)(i % 256), n = ib / 128, jj = (ib % 128) / 32, l = ib % 32;
        int is = 8 * n + 2 * jj + l / 16;
        const uint8_t *b = row + (i / 256) * (three ? 110 : 84), *qs = b + (three ? 32 : 16);
        int q = (qs[32 * n + l] >> (2 * jj)) & 3;
        if (!three) return cm_q_half(b + 80) * (float)(b[is] & 15) * (float)q - cm_q_half(b + 82) * (float)(b[is] >> 4);
        q -= b[l] & (1 << (4 * n + jj)) ? 0 : 4;
        return cm_q_half(b + 108) * (float)(cm_q_scale_q3k(is, b + 96) - 32) * (float)q;
    }
    default: return NAN;
    }
}

/* Block blk (of 32 elements) of a row as w = d[h] * u + m[h], h = element / 16.
 * u is 0..255 (0..15 for Q4_0, Q4_1 and Q4_K: the 4-bit packing's). */
CM_QHD void cm_unpack32(int type, const uint8_t *row, int64_t blk, uint8_t u[32], float d[2], float m[2]) {
    switch (type) {
    case CM_Q4_0: case CM_Q4_1: case CM_Q5_0: case CM_Q5_1: {
        int hasm = type == CM_Q4_1 || type == CM_Q5_1, five = type == CM_Q5_0 || type == CM_Q5_1;
        const uint8_t *b = row + blk * (2 + 2 * hasm + 4 * five + 16), *qh = b + 2 + 2 * hasm;
        const uint8_t *qs = five ? qh + 4 : qh;
        float dd = cm_q_half(b), mm = hasm ? cm_q_half(b + 2) : (five ? -16.f : -8.f) * dd;
        for (int j = 0; j < 16; j++) {
            u[j] = qs[j] & 15;
            u[j + 16] = qs[j] >> 4;
        }
        if (five)
            for (int j = 0; j < 32; j++) u[j] |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
        d[0] = d[1] = dd;
        m[0] = m[1] = mm;
        return;
    }
    case CM_Q8_0: {
        const uint8_t *b = row + blk * 34;
        for (int j = 0; j < 32; j++) u[j] = (uint8_t)((int)(int8_t)b[2 + j] + 128);
        d[0] = d[1] = cm_q_half(b);
        m[0] = m[1] = -128.f * d[0];
        return;
    }
    case CM_MXFP4: { /* u = K[q] + 12 in 0..24 */
        const uint8_t *b = row + blk * 17;
        for (int j = 0; j < 16; j++) {
            u[j] = (uint8_t)(cm_q_mxfp4(b[1 + j] & 15) + 12);
            u[j + 16] = (uint8_t)(cm_q_mxfp4(b[1 + j] >> 4) + 12);
        }
        d[0] = d[1] = ldexpf(1.f, (int)b[0] - 128);
        m[0] = m[1] = -12.f * d[0];
        return;
    }
    case CM_Q4_K: case CM_Q5_K: {
        int five = type == CM_Q5_K, sb = (int)(blk % 8), g = sb / 2, half = sb % 2, sc, mn;
        const uint8_t *b = row + (blk / 8) * (five ? 176 : 144), *qs = b + (five ? 48 : 16) + 32 * g;
        cm_q_scale_min_k4(sb, b + 4, &sc, &mn);
        for (int l = 0; l < 32; l++) {
            u[l] = half ? qs[l] >> 4 : qs[l] & 15;
            if (five) u[l] |= ((b[16 + l] >> sb) & 1) << 4;
        }
        d[0] = d[1] = cm_q_half(b) * (float)sc;
        m[0] = m[1] = -cm_q_half(b + 2) * (float)mn;
        return;
    }
    case CM_Q6_K: {
        int sb = (int)(blk % 8), n = sb / 4, quarter = sb % 4;
        const uint8_t *b = row + (blk / 8) * 210, *ql = b + 64 * n + (quarter & 1) * 32, *qh = b + 128 + 32 * n;
        for (int l = 0; l < 32; l++)
            u[l] = (uint8_t)((quarter & 2 ? ql[l] >> 4 : ql[l] & 15) | ((qh[l] >> (2 * quarter)) & 3) << 4);
        for (int h = 0; h < 2; h++) {
            d[h] = cm_q_half(b + 208) * (float)(int8_t)b[192 + 8 * n + 2 * quarter + h];
            m[h] = -32.f * d[h];
        }
        return;
    }
    case CM_Q2_K: case CM_Q3_K: {
        int three = type == CM_Q3_K, sb = (int)(blk % 8), n = sb / 4, jj = sb % 4;
        const uint8_t *b = row + (blk / 8) * (three ? 110 : 84), *qs = b + (three ? 32 : 16) + 32 * n;
        for (int l = 0; l < 32; l++) {
            u[l] = (qs[l] >> (2 * jj)) & 3;
            if (three && (b[l] & (1 << (4 * n + jj)))) u[l] += 4;
        }
        for (int h = 0; h < 2; h++) {
            int is = 8 * n + 2 * jj + h;
            if (three) {
                d[h] = cm_q_half(b + 108) * (float)(cm_q_scale_q3k(is, b + 96) - 32);
                m[h] = -4.f * d[h];
            } else {
                d[h] = cm_q_half(b + 80) * (float)(b[is] & 15);
                m[h] = -cm_q_half(b + 82) * (float)(b[is] >> 4);
            }
        }
        return;
    }
    default:
        for (int j = 0; j < 32; j++) u[j] = 0;
        d[0] = d[1] = m[0] = m[1] = NAN;
    }
}

#endif
