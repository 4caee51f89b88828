/* The CUDA backend's host-side planning, on the CPU: attention launch
 * geometry and split-K workspace, and the KV pool from
 * --gpu-memory-utilization. And the quantized GEMV's arithmetic: the code a
 * lane runs (kn_cuda_gemv.h) run here for 32 lanes of a warp. */
#include "cm_error.h"
#include "cm_quantize.h"
#include "kernels.h"
#include "kn_cuda_gemv.h"
#include "kn_cuda_plan.h"
#include "tst.h"

#include <stdlib.h>
#include <string.h>

/* gemv_q_kernel's sums for rows [0, n) of w and activation rows [b0, b0 + nb), as its warps make them: lane l
 * takes blocks l, l + 32, ... and the 32 lanes' partial sums are added. */
static void warp_gemv(const kn_weight *w, const float *x, int b0, int nb, float *y) {
    size_t rb = cm_dtype_row_bytes(w->type, (uint64_t)w->k);
    for (int64_t r = 0; r < w->n; r++) {
        float lanes[32][KN_GEMV_NB] = {{0}};
        for (int l = 0; l < 32; l++)
            for (int64_t blk = l; blk < w->k / 32; blk += 32)
                kn_gemv_block(w->type, (const uint8_t *)w->raw + (size_t)r * rb, blk, x + (size_t)b0 * w->k, w->k,
                              nb, KN_GEMV_NB, lanes[l]);
        for (int b = 0; b < nb; b++) {
            float s = 0.f;
            for (int l = 0; l < 32; l++) s += lanes[l][b];
            y[(size_t)(b0 + b) * w->n + r] = s;
        }
    }
}

/* Every quantized type the GPU runs, rows long enough that lanes take several blocks (k = 1,280: 40 blocks),
 * batches of 1, 3, 8 and 13 (two passes, the second partial), against the float64 reference. */
static void gemv_lanes(void) {
    static const int types[] = {CM_Q4_0, CM_Q4_1, CM_Q5_0, CM_Q5_1, CM_Q8_0, CM_Q2_K, CM_Q3_K,
                                CM_Q4_K, CM_Q5_K, CM_Q6_K, CM_MXFP4};
    const int64_t N = 6, K = 1280;
    float *wf = malloc(sizeof(float) * (size_t)(N * K)), *x = malloc(sizeof(float) * 13 * (size_t)K);
    float *yr = malloc(sizeof(float) * 13 * (size_t)N), *yg = malloc(sizeof(float) * 13 * (size_t)N);
    srand(7);
    for (int64_t i = 0; i < N * K; i++) wf[i] = (float)rand() / (float)RAND_MAX * 2.f - 1.f;
    for (int64_t i = 0; i < 13 * K; i++) x[i] = (float)rand() / (float)RAND_MAX * 2.f - 1.f;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t rb = cm_dtype_row_bytes(types[t], (uint64_t)K);
        uint8_t *raw = malloc(rb * (size_t)N);
        for (int64_t r = 0; r < N; r++) {
            if (types[t] != CM_MXFP4) {
                CHECK_RC(cm_quantize_row(types[t], wf + r * K, K, NULL, raw + (size_t)r * rb), 0);
                continue;
            }
            for (size_t i = 0; i < rb; i++) raw[(size_t)r * rb + i] = (uint8_t)rand();
            for (size_t i = 0; i < rb; i += 17) raw[(size_t)r * rb + i] = (uint8_t)(120 + rand() % 8); /* E8M0 near 1 */
        }
        kn_weight w = {types[t], N, K, raw, 0, NULL, NULL};
        static const int batches[] = {1, 3, 8, 13};
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            int B = batches[bi];
            kn_ref_matmul(&w, yr, x, B);
            for (int b0 = 0; b0 < B; b0 += KN_GEMV_NB) warp_gemv(&w, x, b0, B - b0 < KN_GEMV_NB ? B - b0 : KN_GEMV_NB, yg);
            double e = tst_rel_l2(yg, yr, (size_t)B * (size_t)N);
            if (!(e < 1e-5)) printf("gemv lanes %s B=%d: rel %.2e\n", cm_dtype_name(types[t]), B, e);
            CHECK(e < 1e-5);
        }
        free(raw);
    }
    free(wf); free(x); free(yr); free(yg);
}

int main(void) {
    gemv_lanes();
    kn_cuda_attn_geom g;
    /* H200: 132 SMs. One decode row of 32 heads over 8k positions: 32 CTAs
     * would leave SMs idle, so the positions split (264 / 32 -> 9 splits of 912). */
    CHECK_RC(kn_cuda_attn_plan(1, 32, 128, 8192, 132, &g), 0);
    CHECK_RC(g.splits, 9);
    CHECK_RC(g.chunk, 912);
    CHECK(g.chunk % 16 == 0 && (long)g.chunk * g.splits >= 8192 && (long)g.chunk * (g.splits - 1) < 8192);
    CHECK(g.grid[0] == 1 && g.grid[1] == 32 && g.grid[2] == 9 && g.threads == KN_CUDA_ATTN_THREADS);
    CHECK(g.workspace_bytes == (size_t)1 * 32 * 9 * (128 + 2) * 4);
    /* a batch of 64 decodes fills the GPU without splitting */
    CHECK_RC(kn_cuda_attn_plan(64, 32, 128, 8192, 132, &g), 0);
    CHECK(g.splits == 1 && g.workspace_bytes == 0 && g.chunk >= 8192);
    /* short contexts never split (a split must have KN_CUDA_ATTN_MIN_CHUNK positions) */
    CHECK_RC(kn_cuda_attn_plan(1, 8, 64, 300, 132, &g), 0);
    CHECK_RC(g.splits, 1);
    /* very long context, one row: capped at KN_CUDA_ATTN_MAX_SPLITS */
    CHECK_RC(kn_cuda_attn_plan(1, 1, 128, 1 << 20, 132, &g), 0);
    CHECK(g.splits <= KN_CUDA_ATTN_MAX_SPLITS && g.splits >= 32);
    CHECK((long)g.chunk * g.splits >= (1 << 20));
    /* head dims the kernel does not take, and nonsense */
    CHECK_RC(kn_cuda_attn_plan(1, 8, 80, 100, 132, &g), LLM_EUNSUP);
    CHECK_RC(kn_cuda_attn_plan(1, 8, 512, 100, 132, &g), LLM_EUNSUP);
    CHECK_RC(kn_cuda_attn_plan(0, 8, 64, 100, 132, &g), LLM_EINVAL);
    /* the grouped kernel: one CTA per KV head (8 for llama-3-8b's 32 heads), so the same decode row splits
     * 32 ways to fill the SMs (8 x 32 = 256 CTAs), the workspace still laid out per head */
    CHECK_RC(kn_cuda_attn_plan_ctas(1, 32, 8, 128, 8192, 132, &g), 0);
    CHECK_RC(g.splits, 32);
    CHECK_RC(g.chunk, 256);
    CHECK(g.grid[1] == 32 && g.workspace_bytes == (size_t)1 * 32 * 32 * (128 + 2) * 4);
    CHECK_RC(kn_cuda_attn_plan_ctas(1, 32, 5, 128, 8192, 132, &g), LLM_EINVAL); /* 5 does not divide 32 */
    /* the bound the engine sizes its workspace by (wk_cuda_load): under 4 x SMs x (heads / CTA heads) x
     * (hd + 2) floats, for every batch, context and CTA grouping */
    int over = 0;
    static const int lens[] = {1, 300, 511, 512, 4096, 32768, 1 << 20}, groups[] = {1, 2, 4, 8};
    for (int rows = 1; rows <= 300; rows++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
                int heads = 32, cta = heads / groups[gi];
                CHECK_RC(kn_cuda_attn_plan_ctas(rows, heads, cta, 128, lens[li], 132, &g), 0);
                over += g.workspace_bytes > (size_t)4 * 132 * (size_t)groups[gi] * (128 + 2) * sizeof(float);
                over += (long)g.chunk * g.splits < lens[li] || (g.splits > 1 && (long)g.chunk * (g.splits - 1) >= lens[li]);
            }
    CHECK_RC(over, 0);

    /* KV pool: H200 (141 GiB), nothing else on it, util 0.9, llama-3-8b bf16
     * (16.06 GB weights), 2 GiB activation peak; a block of 16 tokens is
     * 16 x 131072 B (32 layers x 8 KV heads x 128 x 2 x 2 bytes) = 2 MiB. */
    const double GiB = 1073741824.0;
    kn_cuda_mem_in in = {141 * GiB, 141 * GiB, 0.9, 16.06e9, 2 * GiB, 16 * 131072.0};
    kn_cuda_mem_out out;
    CHECK_RC(kn_cuda_kv_blocks(&in, &out), 0);
    double want = (141 * GiB * 0.9 - 16.06e9 - 2 * GiB) / (16 * 131072.0);
    CHECK_RC(out.n_blocks, (long)want);
    CHECK_NEAR(out.kv_bytes, (double)(long)want * 16 * 131072.0, 1);
    /* memory others already hold comes off the budget */
    in.free_at_start = 100 * GiB;
    CHECK_RC(kn_cuda_kv_blocks(&in, &out), 0);
    CHECK_RC(out.n_blocks, (long)((141 * GiB * 0.9 - 41 * GiB - 16.06e9 - 2 * GiB) / (16 * 131072.0)));
    /* llama-3-70b in bf16 (141 GB) does not fit one H200: said plainly */
    in = (kn_cuda_mem_in){141 * GiB, 141 * GiB, 0.9, 141.1e9, 4 * GiB, 16 * 327680.0};
    CHECK_RC(kn_cuda_kv_blocks(&in, &out), LLM_ENOMEM);
    CHECK(strstr(out.why, "no room for the KV cache") != NULL && out.n_blocks == 0);
    in.utilization = 1.5;
    CHECK_RC(kn_cuda_kv_blocks(&in, &out), LLM_EINVAL);

    return tst_done("cuda_plan_test");
}
