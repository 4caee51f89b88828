/* kn_neon.h - shared by the two NEON files (kn_neon.c, kn_neon_dot.c). */
#ifndef KN_NEON_H
#define KN_NEON_H

#include "kn_int.h"

#include <arm_neon.h>

#define KN_NEON_BT 4 /* activation rows per register tile */

/* Stores a tile's rows of one 16-row group: acc[t][r] holds rows 4r..4r+3. */
void kn_neon_store_rows(float *y, int64_t ldy, int b0, int bn, int64_t g, int64_t n, float32x4_t acc[][4]);
/* The GEMM on sdot (ARMv8.2 dotprod); call only where the CPU has it. */
void kn_neon_gemm_dot(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy, int64_t g0, int64_t g1);

#endif
