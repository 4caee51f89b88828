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
/* x [n_heads][head_dim] rotated at pos; type 0 adjacent pairs, 1 halves. */
int kn_cuda_rope(float *d_x, int n_heads, int head_dim, int rope_dim, int type, int pos, float theta);
/* a = silu(a) * b over n elements. */
int kn_cuda_silu_mul(float *d_a, const float *d_b, int n);
/* y[B][N] = x[B][K] . W[N][K]^T with W in GGUF layout (Q4_0, Q4_1, Q8_0, F32,
 * F16): one warp per (row, batch) dot product, weights dequantized in registers. */
int kn_cuda_matmul(int type, const void *d_w, int64_t n, int64_t k, const float *d_x, float *d_y, int B);

#ifdef __cplusplus
}
#endif
#endif
