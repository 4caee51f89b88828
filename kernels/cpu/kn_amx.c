/* kn_amx.c - AMX int8 tiles for the AVX-512 path's batched matmul (Intel Xeon 4th generation on). Compiled
 * with the AMX and AVX-512 flags; run only after kn_cpu.c (kn_set_amx) has seen the CPU's AMX-INT8 bit and
 * the kernel has granted the tile data (arch_prctl).
 *
 * A 16-row weight group's block (16 rows x 32) is an AMX B tile as the packs already lay it out: chunk c,
 * byte 4r+i = row r element 4c+i, so 8 rows of 64 bytes (kn_pq8 as stored; kn_pq4's nibbles spread to
 * bytes first). Sixteen activation rows' 32 int8 of the block are the A tile; one TDPBSUD gives the 16 x 16
 * integer sums that kn_avx512.c's q4_group and q8_group get from 8 VNNI instructions a row. The sums are
 * exact integers in both, and the float scaling below is theirs, operation for operation and in their
 * order, so a row's result is bit-identical whichever path computed it: batches may mix the two.
 *
 * The half-block packs (Q5_0, Q5_1, Q5_K as kn_pq6h, Q6_K as kn_pq6s) have a scale a half of 16: each
 * group's blocks are expanded to kn_pq8h's bytes once (expand_q8h), each half is a K = 16 multiply with a C
 * tile of its own, and q8h_group's float operations follow (half_rows). */
#include "kn_avx512.h"
#include "kn_int.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int kn_amx_on; /* set by kn_cpu.c (kn_set_amx), read by kn_avx512.c's matmul */

#define AMX_M 16 /* activation rows per A tile */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_cfg;

/* Tiles 0-3: C, 16 x 16 int32, for U consecutive blocks (their multiplies overlap; one C tile would
 * serialise each block's multiply, store and reload); 4, 5: A, 16 rows x 32 int8; 6, 7: B, 8 rows x 64.
 * The half-block packs (kn_pq8h's family: a scale a half of 16) take K = 16 a multiply instead: A 16 x 16,
 * B 4 x 64, and C tiles 2j, 2j+1 for the halves of U / 2 blocks. A thread loads the shape it needs when it
 * differs from the one it last loaded. */
enum { U = 4 }; /* block_sums names the four C tiles */
static void configure(int half) {
    static __thread int loaded = -1;
    if (loaded == half) return;
    tile_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 4; t++) c.rows[t] = AMX_M, c.colsb[t] = 64;
    for (int t = 4; t < 6; t++) c.rows[t] = AMX_M, c.colsb[t] = half ? 16 : 32;
    for (int t = 6; t < 8; t++) c.rows[t] = half ? 4 : 8, c.colsb[t] = 64;
    _tile_loadconfig(&c);
    loaded = half;
}

/* The integer sums of blocks blk .. blk+n-1 (n <= U) of rows b0..b0+15 of a against the B tiles at
 * bt[j] (8 x 64 bytes each) into cs[j]. Tile numbers are immediates, hence the unrolled cases. */
#define AMX_BLOCK(j, ta, tb) /* the intrinsics paste their tile numbers as text: literals only */          \
    do {                                                                                                          \
        _tile_zero(j);                                                                                            \
        _tile_loadd(ta, a->qs + (size_t)b0 * a->k + 32 * (blk + j), a->k);                                        \
        _tile_loadd(tb, bt[j], 64);                                                                               \
        _tile_dpbsud(j, ta, tb);                                                                                  \
    } while (0)
static inline void block_sums(const kn_act *a, int b0, int64_t blk, int n, const void *const *bt,
                              int32_t (*cs)[AMX_M][16]) {
    AMX_BLOCK(0, 4, 6);
    if (n > 1) AMX_BLOCK(1, 5, 7);
    if (n > 2) AMX_BLOCK(2, 4, 6);
    if (n > 3) AMX_BLOCK(3, 5, 7);
    _tile_stored(0, cs[0], 64);
    if (n > 1) _tile_stored(1, cs[1], 64);
    if (n > 2) _tile_stored(2, cs[2], 64);
    if (n > 3) _tile_stored(3, cs[3], 64);
}

/* A kn_pq4 / kn_pq4s (sym) group's nb blocks with the nibbles spread to bytes, B tiles of 8 x 64, into ex:
 * once a group, read by every 16 rows of the batch. */
static void expand_q4(const char *P, int sym, int64_t nb, uint8_t *ex) {
    const size_t bs = sym ? sizeof(kn_pq4s) : sizeof(kn_pq4);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t blk = 0; blk < nb; blk++) {
        const char *p = P + (size_t)blk * bs;
        const uint8_t *qs = sym ? ((const kn_pq4s *)p)->qs[0] : ((const kn_pq4 *)p)->qs[0];
        uint8_t *b = ex + (size_t)blk * 512;
        for (int l = 0; l < (int)bs; l += 64) _mm_prefetch(p + PF_AHEAD + l, _MM_HINT_T0);
        for (int c = 0; c < 4; c++) { /* low nibbles are k-quad 2c, high ones 2c+1 */
            __m512i v = _mm512_loadu_si512(qs + 64 * c);
            _mm512_store_si512(b + 128 * c, _mm512_and_si512(v, m4));
            _mm512_store_si512(b + 128 * c + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
        }
    }
}

/* The half-block sums of blocks blk, blk+1 (n of them, n <= 2) of rows b0..b0+15 against ex (expand_q8h's
 * blocks, 512 bytes each: half h's B tile at 256 h) into cs[2j + h]. */
#define AMX_HALF(tc, j, h, ta, tb) /* tc = 2 j + h, as a literal (tile numbers are pasted as text) */      \
    do {                                                                                                          \
        _tile_zero(tc);                                                                                           \
        _tile_loadd(ta, a->qs + (size_t)b0 * a->k + 32 * (blk + j) + 16 * h, a->k);                               \
        _tile_loadd(tb, ex + (size_t)(blk + j) * 512 + 256 * h, 64);                                              \
        _tile_dpbsud(tc, ta, tb);                                                                                 \
    } while (0)
static inline void half_sums(const kn_act *a, int b0, int64_t blk, int n, const uint8_t *ex,
                             int32_t (*cs)[AMX_M][16]) {
    AMX_HALF(0, 0, 0, 4, 6);
    AMX_HALF(1, 0, 1, 5, 7);
    if (n > 1) {
        AMX_HALF(2, 1, 0, 4, 6);
        AMX_HALF(3, 1, 1, 5, 7);
    }
    _tile_stored(0, cs[0], 64);
    _tile_stored(1, cs[1], 64);
    if (n > 1) {
        _tile_stored(2, cs[2], 64);
        _tile_stored(3, cs[3], 64);
    }
}

/* A kn_pq8h-family group's nb blocks (mode as kn_q8h_mode) unpacked as q8h_group unpacks them
 * (kn_q8h_unpack) into ex: chunks 0-3 are half 0's B tile (4 x 64), 4-7 half 1's. */
static void expand_q8h(const char *P, int mode, int64_t nb, uint8_t *ex) {
    const size_t bs = kn_q8h_bytes(mode), qo = kn_q8h_qs(mode);
    for (int64_t blk = 0; blk < nb; blk++) {
        for (int l = 0; l < (int)bs; l += 64) _mm_prefetch(P + (size_t)blk * bs + PF_AHEAD + l, _MM_HINT_T0);
        __m512i w[8];
        kn_q8h_unpack((const uint8_t *)P + (size_t)blk * bs + qo, mode, w);
        for (int c = 0; c < 8; c++) _mm512_store_si512(ex + (size_t)blk * 512 + 64 * c, w[c]);
    }
}

/* Rows b0..b0+15 against one kn_pq8h-family group (blocks expanded in ex): each block's two halves scaled
 * by their own d, as q8h_group, then the minimums' chain (m, or -32 d for mode 3, by the halves' sums) apart
 * and added last, q8h_group's float operations in its order. Two blocks' multiplies are issued before the
 * previous two blocks' sums are scaled. */
static void half_rows(const char *P, int mode, int64_t nb, const uint8_t *ex, const kn_act *a, int b0, float *y,
                      int64_t ldy, int64_t r0, __mmask16 m) {
    const size_t bs = kn_q8h_bytes(mode);
    _Alignas(64) int32_t cs[2][U][AMX_M][16];
    __m512 acc[AMX_M];
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) acc[t] = _mm512_setzero_ps();
    int64_t prev = -1;
    int pn = 0;
    for (int64_t blk = 0;; blk += U / 2) {
        int n = blk < nb ? (nb - blk < U / 2 ? (int)(nb - blk) : U / 2) : 0, h = (int)(blk / (U / 2)) & 1;
        if (n) half_sums(a, b0, blk, n, ex, cs[h]);
        for (int j = 0; j < pn; j++) {
            const kn_pq8h *p = (const kn_pq8h *)(P + (size_t)(prev + j) * bs);
            __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->d[0]));
            __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->d[1]));
            _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) {
                __m512 dx = _mm512_set1_ps(a->d[(size_t)(b0 + t) * a->nblk + prev + j]);
                __m512 s0 = _mm512_cvtepi32_ps(_mm512_load_si512(cs[h ^ 1][2 * j][t]));
                __m512 s1 = _mm512_cvtepi32_ps(_mm512_load_si512(cs[h ^ 1][2 * j + 1][t]));
                acc[t] = _mm512_fmadd_ps(s0, _mm512_mul_ps(d0, dx), acc[t]);
                acc[t] = _mm512_fmadd_ps(s1, _mm512_mul_ps(d1, dx), acc[t]);
            }
        }
        if (!n) break;
        prev = blk, pn = n;
    }
    __m512 accm[AMX_M];
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) accm[t] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const kn_pq8h *p = (const kn_pq8h *)(P + (size_t)blk * bs);
        __m512 m0, m1;
        if (mode == 3) {
            m0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->d[0])), _mm512_set1_ps(-32.f));
            m1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->d[1])), _mm512_set1_ps(-32.f));
        } else {
            m0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->m[0]));
            m1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p->m[1]));
        }
        _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) {
            size_t ai = (size_t)(b0 + t) * a->nblk + blk;
            accm[t] = _mm512_fmadd_ps(m0, _mm512_set1_ps(a->hs[2 * ai]), accm[t]);
            accm[t] = _mm512_fmadd_ps(m1, _mm512_set1_ps(a->hs[2 * ai + 1]), accm[t]);
        }
    }
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++)
        _mm512_mask_storeu_ps(y + (size_t)(b0 + t) * ldy + r0, m, _mm512_add_ps(acc[t], accm[t]));
}

/* Scales block blk's integer sums cs (16 rows x 16) into acc: q4_group's (q8 0) or q8_group's (q8 1)
 * float operations for the block, in their order. */
static inline __attribute__((always_inline)) void post_block(const char *p, int q8, const kn_act *a, int b0,
                                                              int64_t blk, int32_t (*cs)[16], __m512 *acc) {
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) {
        size_t ai = (size_t)(b0 + t) * a->nblk + blk;
        __m512 sf = _mm512_cvtepi32_ps(_mm512_load_si512(cs[t]));
        if (q8) acc[t] = _mm512_fmadd_ps(dw, _mm512_fmadd_ps(sf, _mm512_set1_ps(a->d[ai]), _mm512_set1_ps(-128.f * a->ds[ai])), acc[t]);
        else acc[t] = _mm512_fmadd_ps(sf, _mm512_mul_ps(dw, _mm512_set1_ps(a->d[ai])), acc[t]);
    }
}

/* Rows b0..b0+15 against one group: pack 0 kn_pq4, 1 kn_pq4s (B tiles from expand_q4's ex), 2 kn_pq8
 * (B tiles as stored; ex unused). The tile multiplies of U blocks are issued before the previous U blocks'
 * sums are scaled, so the tile unit and the vector units work at once. Then, for the 4-bit packs, the
 * minimum's accm as q4_group's separate chain, and acc + accm. */
static inline __attribute__((always_inline)) void group_rows(const char *P, const int pack, int64_t nb,
                                                              const uint8_t *ex, const kn_act *a, int b0,
                                                              float *y, int64_t ldy, int64_t r0, __mmask16 m) {
    const size_t bs = pack == 2 ? sizeof(kn_pq8) : pack == 1 ? sizeof(kn_pq4s) : sizeof(kn_pq4);
    _Alignas(64) int32_t cs[2][U][AMX_M][16];
    __m512 acc[AMX_M];
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) acc[t] = _mm512_setzero_ps();
    int64_t prev = -1;
    int pn = 0;
    for (int64_t blk = 0;; blk += U) {
        int n = blk < nb ? (nb - blk < U ? (int)(nb - blk) : U) : 0, h = (int)(blk / U) & 1;
        if (n) {
            if (pack == 2) /* the group streams from memory for its first rows: ask ahead, as the VNNI path does */
                for (int l = 0; l < U * (int)bs; l += 64) _mm_prefetch(P + (size_t)blk * bs + PF_AHEAD + l, _MM_HINT_T0);
            const void *bt[U];
            for (int j = 0; j < U; j++) {
                int64_t bj = blk + (j < n ? j : 0);
                bt[j] = pack == 2 ? (const void *)((const kn_pq8 *)P)[bj].qs[0] : (const void *)(ex + (size_t)bj * 512);
            }
            block_sums(a, b0, blk, n, bt, cs[h]);
        }
        for (int j = 0; j < pn; j++)
            post_block(P + (size_t)(prev + j) * bs, pack == 2, a, b0, prev + j, cs[h ^ 1][j], acc);
        if (!n) break;
        prev = blk, pn = n;
    }
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) _mm512_mask_storeu_ps(y + (size_t)(b0 + t) * ldy + r0, m, acc[t]);
    if (pack == 2) return;
    __m512 accm[AMX_M];
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) accm[t] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const char *p = P + (size_t)blk * bs;
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 mw = pack == 1 ? _mm512_mul_ps(dw, _mm512_set1_ps(-8.f))
                              : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const kn_pq4 *)p)->m));
        _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++)
            accm[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->ds[(size_t)(b0 + t) * a->nblk + blk]), accm[t]);
    }
    _Pragma("GCC unroll 16") for (int t = 0; t < AMX_M; t++) {
        float *yr = y + (size_t)(b0 + t) * ldy + r0;
        _mm512_mask_storeu_ps(yr, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, yr), accm[t]));
    }
}

int kn_amx_gemm(const kn_weight *w, const kn_act *a, int B, float *y, int64_t ldy, int64_t g0, int64_t g1) {
    /* kn_pq4h (Q2_K, Q3_K) stays on VNNI: its registers-only unpacking is cheap, and expanding each group to
     * bytes for the tiles measured slower below 128 rows (llmserve-gemm-bench, 4096x4096: 0.77x at 16) */
    int half = kn_pack_q8h(w->pack) && w->pack != KN_PACK_Q4H;
    if (B < AMX_M || !(half || w->pack == KN_PACK_Q4 || w->pack == KN_PACK_Q4S || w->pack == KN_PACK_Q8)) return 0;
    int64_t nb = w->k / 32;
    int q4 = w->pack == KN_PACK_Q4 || w->pack == KN_PACK_Q4S, sym = w->pack == KN_PACK_Q4S, rows = B - B % AMX_M;
    int mode = half ? kn_q8h_mode(w->pack) : 0;
    uint8_t *ex = q4 || half ? aligned_alloc(64, (size_t)nb * 512) : NULL;
    if ((q4 || half) && !ex) return 0; /* the VNNI path does them */
    configure(half);
    size_t bs = half ? kn_q8h_bytes(mode) : w->pack == KN_PACK_Q8 ? sizeof(kn_pq8) : sym ? sizeof(kn_pq4s) : sizeof(kn_pq4);
    /* The batch in chunks of rows whose int8 activations stay in the L2 (about 1 MiB) while every group
     * passes over them: a large prefill would otherwise stream all of its rows from the L3 once a group. */
    int chunk = (int)((1 << 20) / w->k) / AMX_M * AMX_M;
    if (chunk < AMX_M) chunk = AMX_M;
    for (int c0 = 0; c0 < rows; c0 += chunk)
    for (int64_t g = g0; g < g1; g++) {
        int64_t r0 = g * KN_ROWS;
        __mmask16 m = w->n - r0 >= KN_ROWS ? 0xffff : (__mmask16)((1u << (w->n - r0)) - 1);
        const char *P = (const char *)w->packed + (size_t)(g * nb) * bs;
        if (q4) expand_q4(P, sym, nb, ex);
        else if (half) expand_q8h(P, mode, nb, ex);
        for (int b0 = c0; b0 < rows && b0 < c0 + chunk; b0 += AMX_M) {
            if (half) half_rows(P, mode, nb, ex, a, b0, y, ldy, r0, m);
            else if (!q4) group_rows(P, 2, nb, NULL, a, b0, y, ldy, r0, m);
            else if (sym) group_rows(P, 1, nb, ex, a, b0, y, ldy, r0, m);
            else group_rows(P, 0, nb, ex, a, b0, y, ldy, r0, m);
        }
    }
    free(ex);
    return rows;
}
