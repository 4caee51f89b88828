/* kn_cuda_plan.h - host-side planning for the CUDA backend: launch
 * geometry, workspace sizes and the KV pool. Plain C with no CUDA in it, so
 * the unit tests check it on machines without a GPU. */
#ifndef KN_CUDA_PLAN_H
#define KN_CUDA_PLAN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Paged attention geometry: one CTA of KN_CUDA_ATTN_THREADS per (query row,
 * head, split). Long contexts with few query rows are split along the KV
 * positions (flash-decoding) so the GPU's SMs all get work; the splits are
 * merged by a second kernel through a float workspace of
 * [rows][heads][splits][head_dim + 2] (running max, sum, accumulator). */
#define KN_CUDA_ATTN_THREADS 128
#define KN_CUDA_ATTN_MIN_CHUNK 256   /* positions per split at least: below that a split costs more than it saves */
#define KN_CUDA_ATTN_MAX_SPLITS 64

typedef struct {
    int splits;                /* KV splits per (row, head) */
    int chunk;                 /* positions per split (a multiple of 16) */
    unsigned grid[3];          /* rows, heads, splits */
    int threads;
    size_t workspace_bytes;    /* 0 when splits == 1 */
} kn_cuda_attn_geom;

/* n_rows query tokens of head_dim hd (a multiple of 32, at most 256), n_head
 * heads, the longest context max_len, n_sm multiprocessors. LLM_EUNSUP for a
 * head dim the kernel does not take, LLM_EINVAL for non-positive sizes. */
int kn_cuda_attn_plan(int n_rows, int n_head, int hd, int max_len, int n_sm, kn_cuda_attn_geom *g);
/* The same with cta_heads CTAs a row and split (n_head for the per-head kernel, n_kv for the grouped one,
 * whose CTA serves n_head / n_kv heads): the splits fill the SMs by those CTAs, while the workspace stays
 * laid out per head. Splits only happen while rows x cta_heads < 2 x SMs, so rows x cta_heads x splits
 * stays under 4 x SMs and the workspace under 4 x SMs x (n_head / cta_heads) x (hd + 2) floats. */
int kn_cuda_attn_plan_ctas(int n_rows, int n_head, int cta_heads, int hd, int max_len, int n_sm, kn_cuda_attn_geom *g);

/* The KV pool on a GPU as vLLM sizes it: what --gpu-memory-utilization
 * leaves of the device's memory after the weights, the profiled activation
 * peak and what others already hold (total - free at start), in whole blocks.
 * LLM_ENOMEM (with why) when not even one block fits. */
typedef struct {
    double total, free_at_start;       /* bytes, from cudaMemGetInfo */
    double utilization;                /* (0, 1] */
    double weight_bytes, activation_peak_bytes;
    double block_bytes;                /* one block, K and V, all layers, this rank */
} kn_cuda_mem_in;

typedef struct {
    long n_blocks;
    double kv_bytes, budget_bytes, others_bytes;
    char why[200];
} kn_cuda_mem_out;

int kn_cuda_kv_blocks(const kn_cuda_mem_in *in, kn_cuda_mem_out *out);


#ifdef __cplusplus
}
#endif
#endif
