/* The CUDA backend's host-side planning, on the CPU: attention launch
 * geometry and split-K workspace, and the KV pool from
 * --gpu-memory-utilization. */
#include "cm_error.h"
#include "kn_cuda_plan.h"
#include "tst.h"

#include <string.h>

int main(void) {
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
