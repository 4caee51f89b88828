/* kn_cuda.h - the CUDA backend's host API (C linkage).
 *
 * Every function returns 0 or an LLM_E* code; a CUDA or cuBLAS failure is
 * logged with file and line and becomes LLM_EDEVICE. Pointers named d_* are
 * device memory. Each kernel has its CPU reference in kernels/cpu (see
 * tests/unit/cuda_test.c, which compares them on a GPU and skips without one). */
#ifndef KN_CUDA_H
#define KN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kn_cuda_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable devices (0 when there is no driver or no GPU). */
int kn_cuda_device_count(int *n);
int kn_cuda_malloc(void **d, size_t bytes);
void kn_cuda_free(void *d);
int kn_cuda_upload(void *d, const void *h, size_t bytes);
int kn_cuda_download(void *h, const void *d, size_t bytes);
int kn_cuda_sync(void);

/* out[rows][n] = x * rsqrt(mean(x^2) + eps) * w; one block per row. */
int kn_cuda_rmsnorm(float *d_out, const float *d_x, const float *d_w, int rows, int n, float eps);
/* The residual add fused into the next norm: x += r (written back), then out = rmsnorm(x) * w. */
int kn_cuda_add_rmsnorm(float *d_out, float *d_x, const float *d_r, const float *d_w, int rows, int n, float eps);
/* x [n_heads][head_dim] rotated at pos; type 0 adjacent pairs, 1 halves. */
int kn_cuda_rope(float *d_x, int n_heads, int head_dim, int rope_dim, int type, int pos, float theta);
/* a = silu(a) * b over n elements. */
int kn_cuda_silu_mul(float *d_a, const float *d_b, int n);
/* y[B][N] = x[B][K] . W[N][K]^T with W in GGUF layout (every quantized type
 * cm_quant_known takes, and F32, F16, BF16). Quantized, below
 * KN_GEMV_MAX_ROWS (16) rows: the fused GEMV of kn_cuda_gemv.h, a warp per
 * output row, each block of 32 weights decoded in registers once for up to
 * KN_GEMV_NB rows of x, fp32 throughout; from 16 rows: tensor-core tiles of
 * 64 x 64, each weight tile dequantized into shared memory (f16 inputs, f32
 * sums). Dense: a warp per (row, batch) dot in fp32. */
int kn_cuda_matmul(int type, const void *d_w, int64_t n, int64_t k, const float *d_x, float *d_y, int B);
/* The same with the kernel pinned: KN_MATMUL_AUTO is kn_cuda_matmul; KN_MATMUL_PER_ELEMENT runs every type
 * through the warp-per-(row, batch) kernel, each weight decoded from its block alone in fp32 (what quantized
 * weights took before the GEMV and the tiles: a first run's way around a fault in either, and the bench's
 * baseline). */
enum { KN_MATMUL_AUTO = 0, KN_MATMUL_PER_ELEMENT = 1 };
int kn_cuda_matmul_as(int variant, int type, const void *d_w, int64_t n, int64_t k, const float *d_x, float *d_y,
                      int B);

/* SMs of the current device, and its memory (bytes) as cudaMemGetInfo says. */
int kn_cuda_sm_count(int *n);
/* The current device's compute capability (9.0 for H100/H200); FP8 tensor cores from 8.9. */
int kn_cuda_compute_capability(int *major, int *minor);
int kn_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* ---- paged attention (kn_cuda_attn.cu) ---------------------------------- */
/* K and V rows of `rows` new tokens ([rows][width], width = n_kv*hd) into
 * the layer's block pool (kc/vc: block 0, block_stride bytes apart, blocks of
 * 2^block_shift rows of width elements of kv_type): row r goes to slot[r] =
 * block * block_size + offset; slot < 0 skips the row. */
int kn_cuda_kv_store(int kv_type, void *d_kc, void *d_vc, size_t block_stride, const float *d_k, const float *d_v,
                     const int32_t *d_slot, int rows, int width, int block_shift);

/* Causal attention of n_rows query tokens over their sequences' blocks, as
 * kn_attention does on the CPU. Row r belongs to sequence row_seq[r] and sits
 * at position row_pos[r] (it attends 0..row_pos[r]); sequence s's block table
 * starts at blocks[seq_off[s]]. q, out: [n_rows][n_head][hd]. The split-K
 * workspace must hold kn_cuda_attn_geometry's workspace_bytes for these sizes. */
typedef struct {
    int n_rows, n_head, n_kv, hd, kv_type, block_shift, max_len, n_sm;
    const float *d_q;
    float *d_out;
    const void *d_kc, *d_vc;
    size_t block_stride;
    const int32_t *d_row_seq, *d_row_pos, *d_seq_off, *d_blocks;
    float *d_ws;
    size_t ws_bytes;
    int variant;            /* KN_ATTN_*: which kernel (tests pin one; the engine leaves it AUTO) */
} kn_cuda_attn_args;
/* AUTO: the grouped kernel where it has an instantiation (head_dim 64, 128 or 256 with 2, 4 or 8 query
 * heads a KV head; 256 with 2 or 4), which reads each K/V row once for the whole group, else the per-head
 * kernel. PER_HEAD / GROUPED pin one (GROUPED: LLM_EUNSUP where it has none). */
enum { KN_ATTN_AUTO = 0, KN_ATTN_PER_HEAD = 1, KN_ATTN_GROUPED = 2 };
int kn_cuda_paged_attention(const kn_cuda_attn_args *a);
/* The kernel's geometry for these arguments (the pointers unused): its splits and the workspace it needs. */
int kn_cuda_attn_geometry(const kn_cuda_attn_args *a, kn_cuda_attn_geom *g);

/* ---- dense GEMMs through cuBLAS (kn_cuda_gemm.cu) ------------------------ */
typedef struct kn_cuda_blas kn_cuda_blas;
int kn_cuda_blas_create(kn_cuda_blas **out);
/* Every buffer the handle's GEMMs need up to max_rows x max_k activations, and cuBLAS's own workspace
 * (32 MiB), allocated now: called at load, before the KV pool takes what is free. */
int kn_cuda_blas_reserve(kn_cuda_blas *b, int max_rows, int64_t max_k);
void kn_cuda_blas_destroy(kn_cuda_blas *b);
/* y[B][N] (f32) = x[B][K] . W[N][K]^T for W in F16 or BF16 (row-major, as
 * GGUF and safetensors store it): x is rounded to W's type into the handle's
 * workspace, the product accumulates in fp32 (cublasGemmEx, tensor cores). */
int kn_cuda_gemm(kn_cuda_blas *b, int type, const void *d_w, int64_t n, int64_t k, const float *d_x, float *d_y,
                 int B);
/* The same GEMM in two halves, for several weights that multiply one x (q, k and v; gate and up): x is
 * rounded to the weights' type once (kn_cuda_gemm_input), then each weight multiplies what the handle
 * holds (kn_cuda_gemm_from_input; LLM_EINVAL when B, k or the type differ from the input's). The same
 * results as kn_cuda_gemm on each. */
int kn_cuda_gemm_input(kn_cuda_blas *b, int type, const float *d_x, int B, int64_t k);
int kn_cuda_gemm_from_input(kn_cuda_blas *b, int type, const void *d_w, int64_t n, int64_t k, float *d_y, int B);
/* GGUF rows of any type kn_cuda_matmul takes -> F16 rows, for prefill-sized
 * batches where one dequantization and cuBLAS beat kn_cuda_matmul's tiles. */
int kn_cuda_dequant_f16(int type, const void *d_w, int64_t n, int64_t k, void *d_out);
/* out[rows][dim] = embedding rows ids[r] of W (any GGUF type kn_cuda_matmul takes). */
int kn_cuda_embed(int type, const void *d_w, int64_t vocab, int64_t dim, const int32_t *d_ids, int rows, float *d_out);
/* n elements of F16 or BF16 uniform in [-a, a), or of Q8_0 / Q4_0 / Q4_1
 * blocks spanning [-a, a), made on the device from seed (dummy weights). */
int kn_cuda_fill_random(void *d, int type, size_t n, unsigned long long seed, float a);
/* Rotates head h of row r of x [rows][n_heads][head_dim] at position pos[r]
 * with frequencies inv_freq [rope_dim/2]; type 0 adjacent pairs, 1 halves. */
int kn_cuda_rope_rows(float *d_x, int rows, int n_heads, int head_dim, int rope_dim, int type, const int32_t *d_pos,
                      const float *d_inv_freq);
/* x[r][i] += b[i] for rows x n. */
int kn_cuda_add_bias(float *d_x, const float *d_b, int rows, int n);
/* x[i] *= s over n floats (the CPU reference is the loop). */
int kn_cuda_scale(float *d_x, float s, size_t n);
/* dst[r] = src[idx[r]], rows of n floats. */
int kn_cuda_gather_rows(float *d_dst, const float *d_src, const int32_t *d_idx, int rows, int n);
/* Device to device. */
int kn_cuda_copy(void *d_dst, const void *d_src, size_t bytes);
int kn_cuda_set_device(int dev);
/* a[i] += b[i] */
int kn_cuda_add(float *d_a, const float *d_b, size_t n);

/* ---- FP8 E4M3 GEMMs through cuBLASLt (kn_cuda_fp8.cu; sm_89 and newer) ---- */
typedef struct kn_cuda_fp8 kn_cuda_fp8;
int kn_cuda_fp8_create(kn_cuda_fp8 **out);
/* The quantized-activation buffer for up to max_rows x max_k, allocated now (at load, before the KV pool). */
int kn_cuda_fp8_reserve(kn_cuda_fp8 *f, int max_rows, int64_t max_k);
void kn_cuda_fp8_destroy(kn_cuda_fp8 *f);
/* W [n][k] (F32, F16 or BF16 on the device) -> E4M3 codes q [n][k] and
 * scale [n] (per output channel: amax of the row / 448; per tensor: the
 * same value n times), so W ~ q * scale[row]. */
int kn_cuda_fp8_quantize(kn_cuda_fp8 *f, int type, const void *d_w, int64_t n, int64_t k, int per_channel, uint8_t *d_q,
                         float *d_scale);
/* y[B][n] = x[B][k] . W^T with W as above: x quantized to E4M3 with one
 * dynamic scale, cuBLASLt FP8 GEMM (fp32 accumulate and output), then the
 * scales applied per column. n and k multiples of 16; LLM_EUNSUP when the
 * GPU has no FP8 kernel. */
int kn_cuda_gemm_fp8(kn_cuda_fp8 *f, const uint8_t *d_wq, const float *d_wscale, int64_t n, int64_t k, const float *d_x,
                     float *d_y, int B);
/* In two halves, as kn_cuda_gemm_input / _from_input: x quantized once (its dynamic scale is one amax, so
 * each weight's product is the same as kn_cuda_gemm_fp8's), then any number of weights. */
int kn_cuda_fp8_input(kn_cuda_fp8 *f, const float *d_x, int B, int64_t k);
int kn_cuda_gemm_fp8_from_input(kn_cuda_fp8 *f, const uint8_t *d_wq, const float *d_wscale, int64_t n, int64_t k,
                                float *d_y, int B);

/* ---- sampling on the device (kn_cuda_sample.cu) -------------------------- */
/* Per row of logits [rows][vocab]: penalties over its previous tokens, then
 * temperature, top-k, top-p, min-p, and a draw with a counter-based RNG from
 * (seed, step); temperature 0 is greedy. Only the token ids come back. The
 * logits are modified in place. */
typedef struct {
    float temperature, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty;
    int top_k;                 /* 0: off */
    unsigned long long seed;
    int step;                  /* tokens generated so far: the draw's counter */
    int hist_off, hist_len;    /* its previous tokens in the history array */
} kn_cuda_sample_params;
int kn_cuda_sample(float *d_logits, int rows, int vocab, const kn_cuda_sample_params *d_params,
                   const int32_t *d_hist, int32_t *d_out);

#ifdef __cplusplus
}
#endif
#endif
