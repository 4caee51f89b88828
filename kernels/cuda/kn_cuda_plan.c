#include "kn_cuda_plan.h"
#include "cm_error.h"

#include <stdio.h>
#include <string.h>

int kn_cuda_attn_plan(int n_rows, int n_head, int hd, int max_len, int n_sm, kn_cuda_attn_geom *g) {
    return kn_cuda_attn_plan_ctas(n_rows, n_head, n_head, hd, max_len, n_sm, g);
}

int kn_cuda_attn_plan_ctas(int n_rows, int n_head, int cta_heads, int hd, int max_len, int n_sm, kn_cuda_attn_geom *g) {
    memset(g, 0, sizeof *g);
    if (n_rows <= 0 || n_head <= 0 || max_len <= 0 || n_sm <= 0 || cta_heads <= 0 || n_head % cta_heads)
        return LLM_EINVAL;
    if (hd <= 0 || hd % 32 || hd > 256) return LLM_EUNSUP;
    long ctas = (long)n_rows * cta_heads, target = 2L * n_sm; /* two waves' worth keeps every SM busy */
    int splits = 1;
    if (ctas < target && max_len >= 2 * KN_CUDA_ATTN_MIN_CHUNK) {
        long want = (target + ctas - 1) / ctas, most = max_len / KN_CUDA_ATTN_MIN_CHUNK;
        splits = (int)(want < most ? want : most);
        if (splits > KN_CUDA_ATTN_MAX_SPLITS) splits = KN_CUDA_ATTN_MAX_SPLITS;
    }
    int chunk = (max_len + splits - 1) / splits;
    chunk = (chunk + 15) / 16 * 16;
    splits = (max_len + chunk - 1) / chunk; /* rounding the chunk up may leave a split empty */
    g->splits = splits;
    g->chunk = chunk;
    g->grid[0] = (unsigned)n_rows;
    g->grid[1] = (unsigned)n_head;
    g->grid[2] = (unsigned)splits;
    g->threads = KN_CUDA_ATTN_THREADS;
    g->workspace_bytes = splits > 1 ? (size_t)n_rows * (size_t)n_head * (size_t)splits * (size_t)(hd + 2) * sizeof(float) : 0;
    return 0;
}

int kn_cuda_kv_blocks(const kn_cuda_mem_in *in, kn_cuda_mem_out *out) {
    memset(out, 0, sizeof *out);
    if (!(in->utilization > 0 && in->utilization <= 1) || !(in->total > 0) || !(in->block_bytes > 0) ||
        in->free_at_start > in->total || in->free_at_start < 0) {
        snprintf(out->why, sizeof out->why, "bad memory figures (utilization must be in (0, 1])");
        return LLM_EINVAL;
    }
    out->others_bytes = in->total - in->free_at_start;
    out->budget_bytes = in->total * in->utilization;
    out->kv_bytes = out->budget_bytes - out->others_bytes - in->weight_bytes - in->activation_peak_bytes;
    if (out->kv_bytes < in->block_bytes) {
        snprintf(out->why, sizeof out->why,
                 "no room for the KV cache: %.2f GiB budget (%.2f x %.2f GiB) - %.2f GiB weights - %.2f GiB "
                 "activations - %.2f GiB held by others",
                 out->budget_bytes / 1073741824.0, in->utilization, in->total / 1073741824.0,
                 in->weight_bytes / 1073741824.0, in->activation_peak_bytes / 1073741824.0,
                 out->others_bytes / 1073741824.0);
        out->kv_bytes = 0;
        return LLM_ENOMEM;
    }
    out->n_blocks = (long)(out->kv_bytes / in->block_bytes);
    out->kv_bytes = (double)out->n_blocks * in->block_bytes;
    return 0;
}

