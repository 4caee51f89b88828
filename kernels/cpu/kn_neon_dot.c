/* kn_neon_dot.c - the NEON GEMM on sdot (vdotq_s32), compiled for
 * ARMv8.2-A + dotprod and called only where the CPU reports it (HWCAP_ASIMDDP). */
#include "kn_neon.h"

/* One 16-row group against activation rows [b0, b0 + bn): the block's weights unpacked once into
 * registers for the tile; per row the same arithmetic whatever the tile. */
static void group_dot(const kn_weight *w, int64_t g, const kn_act *a, int b0, int bn, float32x4_t acc[][4]) {
    int64_t nb = w->k / 32;
    int q8 = w->pack == KN_PACK_Q8, q8h = kn_pack_q8h(w->pack);
    for (int t = 0; t < bn; t++)
        for (int r = 0; r < 4; r++) acc[t][r] = vdupq_n_f32(0);
    for (int64_t blk = 0; blk < nb; blk++) {
        int8x16_t wq[8][4]; /* [chunk][rows 4r..4r+3] */
        float32x4_t dw[2][4], mw[2][4];
        kn_neon_unpack(w, g, nb, blk, wq, dw, mw);
        for (int t = 0; t < bn; t++) {
            const int32_t *xb = (const int32_t *)(a->qs + (size_t)(b0 + t) * a->k + 32 * blk);
            size_t ai = (size_t)(b0 + t) * a->nblk + blk;
            int8x16_t x[8];
            for (int c = 0; c < 8; c++) x[c] = vreinterpretq_s8_s32(vdupq_n_s32(xb[c]));
            for (int r = 0; r < 4; r++) {
                if (q8h) { /* each half block to its own scale and minimum */
                    int32x4_t s0 = vdotq_s32(vdupq_n_s32(0), wq[0][r], x[0]);
                    int32x4_t s1 = vdotq_s32(vdupq_n_s32(0), wq[4][r], x[4]);
                    for (int c = 1; c < 4; c++) {
                        s0 = vdotq_s32(s0, wq[c][r], x[c]);
                        s1 = vdotq_s32(s1, wq[c + 4][r], x[c + 4]);
                    }
                    acc[t][r] = vfmaq_f32(acc[t][r], vcvtq_f32_s32(s0), vmulq_n_f32(dw[0][r], a->d[ai]));
                    acc[t][r] = vfmaq_f32(acc[t][r], vcvtq_f32_s32(s1), vmulq_n_f32(dw[1][r], a->d[ai]));
                    acc[t][r] = vfmaq_n_f32(acc[t][r], mw[0][r], a->hs[2 * ai]);
                    acc[t][r] = vfmaq_n_f32(acc[t][r], mw[1][r], a->hs[2 * ai + 1]);
                    continue;
                }
                int32x4_t s0 = vdotq_s32(vdupq_n_s32(0), wq[0][r], x[0]);
                int32x4_t s1 = vdotq_s32(vdupq_n_s32(0), wq[1][r], x[1]);
                for (int c = 2; c < 8; c += 2) {
                    s0 = vdotq_s32(s0, wq[c][r], x[c]);
                    s1 = vdotq_s32(s1, wq[c + 1][r], x[c + 1]);
                }
                acc[t][r] = vfmaq_f32(acc[t][r], vcvtq_f32_s32(vaddq_s32(s0, s1)), vmulq_n_f32(dw[0][r], a->d[ai]));
                if (!q8) acc[t][r] = vfmaq_n_f32(acc[t][r], mw[0][r], a->ds[ai]);
            }
        }
    }
}

void kn_neon_gemm_dot(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++)
        for (int b0 = 0; b0 < B; b0 += KN_NEON_BT) {
            int bn = B - b0 < KN_NEON_BT ? B - b0 : KN_NEON_BT;
            float32x4_t acc[KN_NEON_BT][4];
            group_dot(w, g, a, b0, bn, acc);
            kn_neon_store_rows(y, ldy, b0, bn, g, w->n, acc);
        }
}
