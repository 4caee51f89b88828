/* kn_cuda_gemv.h - one lane's share of the quantized GEMV (kn_cuda.cu's
 * gemv_q_kernel): a block of 32 weights decoded once (cm_unpack32: w = d[h] *
 * u + m[h], h the half of 16) and multiplied with up to KN_GEMV_NB rows of
 * activations, so a weight is read once for the whole batch rather than once
 * a row. A warp owns an output row and its lanes take the row's blocks in
 * turn (lane l: blocks l, l + 32, ...), so the warp reads the row front to
 * back in contiguous spans; the 32 lanes' sums are added by shuffles.
 *
 * Header-only and written for host and device alike: the kernel inlines it
 * with the type and the batch bound as constants (the format's switch folds
 * away, the accumulators stay in registers), and cuda_plan_test runs the
 * same code on the CPU, 32 lanes in a loop, against the float64 reference. */
#ifndef KN_CUDA_GEMV_H
#define KN_CUDA_GEMV_H

#include "cm_quant.h"

#include <stdint.h>
#include <string.h>

/* The most activation rows one pass takes; larger batches make more passes
 * (the grid's y), each reading the weights again, up to the row count where
 * the engine dequantizes once and uses cuBLAS instead. */
#define KN_GEMV_NB 8
/* From this many rows kn_cuda_matmul multiplies quantized weights in tensor-core tiles instead. */
#define KN_GEMV_MAX_ROWS 16

/* Four activations from p (16-byte aligned: rows of k floats, k a multiple of 32, from cudaMalloc). */
CM_QHD void kn_gemv_x4(const float *p, float o[4]) {
#ifdef __CUDA_ARCH__
    float4 v = __ldg((const float4 *)p);
    o[0] = v.x;
    o[1] = v.y;
    o[2] = v.z;
    o[3] = v.w;
#else
    memcpy(o, p, sizeof(float) * 4);
#endif
}

/* acc[b] += block blk of a quantized row . x[b * ldx + 32 blk ...] for b < nb (nb <= nbmax <= KN_GEMV_NB;
 * nbmax a constant where it is inlined, so the loop unrolls). */
CM_QHD void kn_gemv_block(int type, const uint8_t *row, int64_t blk, const float *x, int64_t ldx, int nb, int nbmax,
                          float *acc) {
    uint8_t u[32];
    float d[2], m[2];
    cm_unpack32(type, row, blk, u, d, m);
    for (int b = 0; b < nbmax; b++) {
        if (b >= nb) break;
        const float *xb = x + (int64_t)b * ldx + blk * 32;
        float s[2] = {0.f, 0.f}, t[2] = {0.f, 0.f}; /* per half: sum of u * x, sum of x */
        for (int j = 0; j < 32; j += 4) {
            float v[4];
            kn_gemv_x4(xb + j, v);
            for (int i = 0; i < 4; i++) {
                s[j / 16] += (float)u[j + i] * v[i];
                t[j / 16] += v[i];
            }
        }
        acc[b] += d[0] * s[0] + m[0] * t[0] + d[1] * s[1] + m[1] * t[1];
    }
}

#endif
