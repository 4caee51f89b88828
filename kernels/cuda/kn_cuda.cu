// kn_cuda.cu - CUDA kernels: norm, RoPE, activation, embedding, the fused
// GEMV for GGUF-quantized weights (kn_cuda_gemv.h) and a dense-type matmul;
// cuBLAS/cuBLASLt (kn_cuda_gemm.cu, kn_cuda_fp8.cu) take dense and larger batches.
#include "kn_cuda.h"
#include "kn_cuda_int.h"
#include "kn_cuda_gemv.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


// grid: rows blocks, 256 threads; sum of squares in fp32, tree-reduced in shared memory. With r (the
// fused residual add): x += r first, written back, and the norm taken of the sum: one pass and one launch
// where the layer had two, and the same floats as the two (each thread adds and squares its own elements).
__global__ void rmsnorm_kernel(float *out, float *x, const float *r, const float *w, int n, float eps) {
    __shared__ float red[256];
    float *xr = x + (size_t)blockIdx.x * n;
    float *orow = out + (size_t)blockIdx.x * n;
    float s = 0.f;
    if (r) {
        const float *rr = r + (size_t)blockIdx.x * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float v = xr[i] + rr[i];
            xr[i] = v;
            s += v * v;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    }
    red[threadIdx.x] = s;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) red[threadIdx.x] += red[threadIdx.x + st];
        __syncthreads();
    }
    float scale = rsqrtf(red[0] / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
}

// grid: n_heads blocks, rope_dim/2 threads (<= 512)
__global__ void rope_kernel(float *x, int head_dim, int rope_dim, int type, int pos, float theta) {
    int i = threadIdx.x, half = rope_dim / 2;
    if (i >= half) return;
    float *v = x + (size_t)blockIdx.x * head_dim;
    float ang = (float)pos * powf(theta, -2.f * (float)i / (float)rope_dim), c, s;
    sincosf(ang, &s, &c);
    int i0 = type == 1 ? i : 2 * i, i1 = type == 1 ? i + half : 2 * i + 1;
    float a = v[i0], b = v[i1];
    v[i0] = a * c - b * s;
    v[i1] = a * s + b * c;
}

// grid: ceil(n/256) blocks of 256
__global__ void silu_mul_kernel(float *a, const float *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] / (1.f + __expf(-a[i])) * b[i];
}


// grid: (ceil(N/8), B) blocks of 8 warps; warp w of block x owns output row 8x+w
__global__ void matmul_kernel(int type, const uint8_t *w, int64_t n, int64_t k, size_t row_bytes,
                              const float *x, float *y) {
    int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    int lane = threadIdx.x % 32, b = blockIdx.y;
    if (row >= n) return;
    const uint8_t *wr = w + (size_t)row * row_bytes;
    const float *xr = x + (size_t)b * k;
    float s = 0.f;
    for (int64_t i = lane; i < k; i += 32) s += weight_at(type, wr, i) * xr[i];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) y[(size_t)b * n + row] = s;
}

// The quantized GEMV (kn_cuda_gemv.h): grid (ceil(n/8), ceil(B/NB)) blocks of 8 warps; warp w of block x owns
// output row 8x+w for the activation rows NB y .. NB y + NB - 1 (fewer in the last pass). Each lane decodes a
// block of 32 weights once for all of those rows; the lanes' sums meet by shuffles.
template <int TYPE, int NB>
__global__ void gemv_q_kernel(const uint8_t *__restrict__ w, int64_t n, int64_t k, size_t row_bytes,
                              const float *__restrict__ x, float *__restrict__ y, int B) {
    int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    int lane = threadIdx.x % 32, b0 = (int)blockIdx.y * NB, nb = B - b0 < NB ? B - b0 : NB;
    if (row >= n) return;
    const uint8_t *wr = w + (size_t)row * row_bytes;
    const float *xr = x + (size_t)b0 * k;
    float acc[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b] = 0.f;
    for (int64_t blk = lane; blk < k / 32; blk += 32) kn_gemv_block(TYPE, wr, blk, xr, k, nb, NB, acc);
#pragma unroll
    for (int b = 0; b < NB; b++) {
        float s = acc[b];
        for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
        if (lane == 0 && b < nb) y[(size_t)(b0 + b) * n + row] = s;
    }
}

template <int TYPE>
static void gemv_q_launch(const uint8_t *w, int64_t n, int64_t k, size_t rb, const float *x, float *y, int B) {
    unsigned gx = (unsigned)((n + 7) / 8);
    if (B == 1) gemv_q_kernel<TYPE, 1><<<dim3(gx, 1), 256>>>(w, n, k, rb, x, y, B);
    else if (B <= 4) gemv_q_kernel<TYPE, 4><<<dim3(gx, 1), 256>>>(w, n, k, rb, x, y, B);
    else gemv_q_kernel<TYPE, KN_GEMV_NB><<<dim3(gx, (unsigned)((B + KN_GEMV_NB - 1) / KN_GEMV_NB)), 256>>>(w, n, k, rb, x, y, B);
}

// The quantized GEMM in tiles, for batches of KN_GEMV_MAX_ROWS rows and more: the weights dequantized into
// shared memory a tile at a time (never a whole F16 copy of the matrix) and multiplied on the tensor cores
// (WMMA 16x16x16, f16 in, f32 sums). grid (ceil(n/64), ceil(B/64)), 128 threads: a CTA owns 64 activation
// rows x 64 weight rows, each warp a 32 x 32 quarter (2 x 2 fragments). A k-step is two blocks of 32: each
// thread decodes one weight row's block (cm_unpack32) and rounds 32 activations; rows and blocks past the
// ends are zeros. x is rounded to f16 as the dequantize + cuBLAS path rounds it.
#define QT_M 64          // activation rows a CTA
#define QT_N 64          // weight rows a CTA
#define QT_K 64          // k a step: two blocks
#define QT_LD (QT_K + 8) // shared row stride in halves: a multiple of 8 (WMMA), rows 144 bytes apart
#define QT_CLD (QT_N + 4)

template <int TYPE>
__global__ void __launch_bounds__(128) gemm_q_kernel(const uint8_t *__restrict__ w, int64_t n, int64_t k,
                                                     size_t row_bytes, const float *__restrict__ x,
                                                     float *__restrict__ y, int B) {
    __shared__ __align__(32) __half xs[QT_M * QT_LD];
    __shared__ __align__(32) __half ws[QT_N * QT_LD];
    __shared__ __align__(32) float cs[QT_M * QT_CLD];
    int64_t n0 = (int64_t)blockIdx.x * QT_N, nblk = k / 32;
    int b0 = (int)blockIdx.y * QT_M, tid = threadIdx.x, warp = tid / 32;
    int wm = (warp / 2) * 32, wn = (warp % 2) * 32;
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) nvcuda::wmma::fill_fragment(acc[i][j], 0.f);
    for (int64_t blk0 = 0; blk0 < nblk; blk0 += 2) {
        { // weights: thread t decodes block blk0 + t / 64 of weight row n0 + t % 64
            int r = tid % QT_N, h = tid / QT_N;
            int64_t blk = blk0 + h;
            __half *dst = ws + r * QT_LD + h * 32;
            if (n0 + r < n && blk < nblk) {
                uint8_t u[32];
                float d[2], m[2];
                cm_unpack32(TYPE, w + (size_t)(n0 + r) * row_bytes, blk, u, d, m);
#pragma unroll
                for (int j = 0; j < 32; j++) dst[j] = __float2half_rn(d[j / 16] * (float)u[j] + m[j / 16]);
            } else {
#pragma unroll
                for (int j = 0; j < 32; j++) dst[j] = __float2half_rn(0.f);
            }
        }
        // activations: 64 rows x 64 floats, row by row (consecutive threads, consecutive floats)
        for (int i = tid; i < QT_M * QT_K; i += 128) {
            int r = i / QT_K, c = i % QT_K;
            int64_t col = blk0 * 32 + c;
            float v = b0 + r < B && col < k ? x[(size_t)(b0 + r) * (size_t)k + (size_t)col] : 0.f;
            xs[r * QT_LD + c] = __float2half_rn(v);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < QT_K; kk += 16) {
            nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major> a[2];
            nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half, nvcuda::wmma::col_major> bw[2];
#pragma unroll
            for (int i = 0; i < 2; i++) nvcuda::wmma::load_matrix_sync(a[i], xs + (wm + 16 * i) * QT_LD + kk, QT_LD);
            // B[kk][col] = W[col][kk]: the weight rows stored [n][k] are B column-major
#pragma unroll
            for (int j = 0; j < 2; j++) nvcuda::wmma::load_matrix_sync(bw[j], ws + (wn + 16 * j) * QT_LD + kk, QT_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) nvcuda::wmma::mma_sync(acc[i][j], a[i], bw[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            nvcuda::wmma::store_matrix_sync(cs + (wm + 16 * i) * QT_CLD + wn + 16 * j, acc[i][j], QT_CLD,
                                            nvcuda::wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < QT_M * QT_N; i += 128) {
        int r = i / QT_N, c = i % QT_N;
        if (b0 + r < B && n0 + c < n) y[(size_t)(b0 + r) * (size_t)n + (size_t)(n0 + c)] = cs[r * QT_CLD + c];
    }
}

template <int TYPE>
static void matmul_q_launch(const uint8_t *w, int64_t n, int64_t k, size_t rb, const float *x, float *y, int B) {
    if (B >= KN_GEMV_MAX_ROWS)
        gemm_q_kernel<TYPE><<<dim3((unsigned)((n + QT_N - 1) / QT_N), (unsigned)((B + QT_M - 1) / QT_M)), 128>>>(
            w, n, k, rb, x, y, B);
    else gemv_q_launch<TYPE>(w, n, k, rb, x, y, B);
}

// The quantized GEMV or tile GEMM for a type cm_quant_known takes; 0 when it took it, else LLM_EUNSUP.
static int matmul_q(int type, const uint8_t *w, int64_t n, int64_t k, size_t rb, const float *x, float *y, int B) {
    switch (type) {
    case CM_Q4_0: matmul_q_launch<CM_Q4_0>(w, n, k, rb, x, y, B); break;
    case CM_Q4_1: matmul_q_launch<CM_Q4_1>(w, n, k, rb, x, y, B); break;
    case CM_Q5_0: matmul_q_launch<CM_Q5_0>(w, n, k, rb, x, y, B); break;
    case CM_Q5_1: matmul_q_launch<CM_Q5_1>(w, n, k, rb, x, y, B); break;
    case CM_Q8_0: matmul_q_launch<CM_Q8_0>(w, n, k, rb, x, y, B); break;
    case CM_Q2_K: matmul_q_launch<CM_Q2_K>(w, n, k, rb, x, y, B); break;
    case CM_Q3_K: matmul_q_launch<CM_Q3_K>(w, n, k, rb, x, y, B); break;
    case CM_Q4_K: matmul_q_launch<CM_Q4_K>(w, n, k, rb, x, y, B); break;
    case CM_Q5_K: matmul_q_launch<CM_Q5_K>(w, n, k, rb, x, y, B); break;
    case CM_Q6_K: matmul_q_launch<CM_Q6_K>(w, n, k, rb, x, y, B); break;
    case CM_MXFP4: matmul_q_launch<CM_MXFP4>(w, n, k, rb, x, y, B); break;
    default: return LLM_EUNSUP;
    }
    return 0;
}

extern "C" int kn_cuda_device_count(int *n) {
    *n = 0;
    if (cudaGetDeviceCount(n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no driver" error
        *n = 0;
    }
    return 0;
}

extern "C" int kn_cuda_malloc(void **d, size_t bytes) {
    KN_CUDA_CHECK(cudaMalloc(d, bytes));
    return 0;
}

extern "C" void kn_cuda_free(void *d) {
    if (d) cudaFree(d);
}

extern "C" int kn_cuda_upload(void *d, const void *h, size_t bytes) {
    KN_CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return 0;
}

extern "C" int kn_cuda_download(void *h, const void *d, size_t bytes) {
    KN_CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int kn_cuda_sync(void) {
    KN_CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int kn_cuda_rmsnorm(float *d_out, const float *d_x, const float *d_w, int rows, int n, float eps) {
    if (rows <= 0 || n <= 0) return LLM_EINVAL;
    rmsnorm_kernel<<<rows, 256>>>(d_out, (float *)d_x, NULL, d_w, n, eps);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_add_rmsnorm(float *d_out, float *d_x, const float *d_r, const float *d_w, int rows, int n,
                                   float eps) {
    if (rows <= 0 || n <= 0 || !d_r) return LLM_EINVAL;
    rmsnorm_kernel<<<rows, 256>>>(d_out, d_x, d_r, d_w, n, eps);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_rope(float *d_x, int n_heads, int head_dim, int rope_dim, int type, int pos, float theta) {
    if (n_heads <= 0 || rope_dim <= 0 || rope_dim > head_dim || rope_dim / 2 > 512) return LLM_EINVAL;
    rope_kernel<<<n_heads, rope_dim / 2>>>(d_x, head_dim, rope_dim, type, pos, theta);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_silu_mul(float *d_a, const float *d_b, int n) {
    if (n <= 0) return LLM_EINVAL;
    silu_mul_kernel<<<(n + 255) / 256, 256>>>(d_a, d_b, n);
    KN_CUDA_LAUNCHED();
    return 0;
}

static int gguf_type_ok(int type) {
    return type == CM_F32 || type == CM_F16 || type == CM_BF16 || cm_quant_known(type);
}

extern "C" int kn_cuda_matmul_as(int variant, int type, const void *d_w, int64_t n, int64_t k, const float *d_x,
                                 float *d_y, int B) {
    if (!gguf_type_ok(type)) return LLM_EUNSUP;
    size_t rb = cm_dtype_row_bytes(type, (uint64_t)k);
    if (!rb || n <= 0 || B <= 0 || B > 65535) return LLM_EINVAL;
    if (variant != KN_MATMUL_AUTO && variant != KN_MATMUL_PER_ELEMENT) return LLM_EINVAL;
    if (variant == KN_MATMUL_AUTO && cm_quant_known(type)) {
        if (k % 32) return LLM_EINVAL; /* whole blocks: every quantized row is */
        if (matmul_q(type, (const uint8_t *)d_w, n, k, rb, d_x, d_y, B)) return LLM_EUNSUP;
    } else {
        dim3 grid((unsigned)((n + 7) / 8), (unsigned)B);
        matmul_kernel<<<grid, 256>>>(type, (const uint8_t *)d_w, n, k, rb, d_x, d_y);
    }
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_matmul(int type, const void *d_w, int64_t n, int64_t k, const float *d_x, float *d_y, int B) {
    return kn_cuda_matmul_as(KN_MATMUL_AUTO, type, d_w, n, k, d_x, d_y, B);
}

static int sync_mode = -1; /* LLMSERVE_CUDA_SYNC, read once */

int kn_cuda_after_launch(const char *file, int line) {
    cudaError_t e = cudaGetLastError();
    int mode = __atomic_load_n(&sync_mode, __ATOMIC_RELAXED);
    if (mode < 0) {
        const char *v = getenv("LLMSERVE_CUDA_SYNC");
        mode = v && *v && strcmp(v, "0") != 0;
        __atomic_store_n(&sync_mode, mode, __ATOMIC_RELAXED);
    }
    if (e == cudaSuccess && mode) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "%s:%d: CUDA error %s: %s%s\n", file, line, cudaGetErrorName(e), cudaGetErrorString(e),
            mode ? " (LLMSERVE_CUDA_SYNC: in the kernel launched here)" : "");
    return LLM_EDEVICE;
}

extern "C" int kn_cuda_sm_count(int *n) {
    int dev;
    KN_CUDA_CHECK(cudaGetDevice(&dev));
    KN_CUDA_CHECK(cudaDeviceGetAttribute(n, cudaDevAttrMultiProcessorCount, dev));
    return 0;
}

extern "C" int kn_cuda_compute_capability(int *major, int *minor) {
    int dev;
    KN_CUDA_CHECK(cudaGetDevice(&dev));
    KN_CUDA_CHECK(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, dev));
    KN_CUDA_CHECK(cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, dev));
    return 0;
}

extern "C" int kn_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    KN_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return 0;
}

// grid: rows blocks of 256; row r of out = row ids[r] of w dequantized (an
// id outside the vocabulary gives zeros: the host checks ids first)
__global__ void embed_kernel(int type, const uint8_t *w, int64_t vocab, int64_t dim, size_t row_bytes,
                             const int32_t *ids, float *out) {
    int32_t id = ids[blockIdx.x];
    float *o = out + (size_t)blockIdx.x * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = id >= 0 && id < vocab ? weight_at(type, w + (size_t)id * row_bytes, i) : 0.f;
}

// grid: (ceil(k/256), n): one element per thread, out [n][k] fp16
__global__ void dequant_f16_kernel(int type, const uint8_t *w, int64_t k, size_t row_bytes, __half *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (i < k) out[(size_t)r * k + i] = __float2half_rn(weight_at(type, w + (size_t)r * row_bytes, i));
}

__global__ void add_kernel(float *a, const float *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}


extern "C" int kn_cuda_embed(int type, const void *d_w, int64_t vocab, int64_t dim, const int32_t *d_ids, int rows,
                             float *d_out) {
    if (!gguf_type_ok(type)) return LLM_EUNSUP;
    size_t rb = cm_dtype_row_bytes(type, (uint64_t)dim);
    if (!rb || rows <= 0 || vocab <= 0) return LLM_EINVAL;
    embed_kernel<<<rows, 256>>>(type, (const uint8_t *)d_w, vocab, dim, rb, d_ids, d_out);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_dequant_f16(int type, const void *d_w, int64_t n, int64_t k, void *d_out) {
    if (!gguf_type_ok(type)) return LLM_EUNSUP;
    size_t rb = cm_dtype_row_bytes(type, (uint64_t)k);
    if (!rb || n <= 0 || n > 65535 * 64) return LLM_EINVAL;
    for (int64_t r0 = 0; r0 < n; r0 += 65535) { // grid.y is at most 65535 rows a launch
        int64_t nr = n - r0 < 65535 ? n - r0 : 65535;
        dim3 grid((unsigned)((k + 255) / 256), (unsigned)nr);
        dequant_f16_kernel<<<grid, 256>>>(type, (const uint8_t *)d_w + (size_t)r0 * rb, k, rb,
                                          (__half *)d_out + (size_t)r0 * k);
        KN_CUDA_LAUNCHED();
    }
    return 0;
}

extern "C" int kn_cuda_add(float *d_a, const float *d_b, size_t n) {
    if (!n) return 0;
    add_kernel<<<(unsigned)((n + 255) / 256), 256>>>(d_a, d_b, n);
    KN_CUDA_LAUNCHED();
    return 0;
}

// grid: ceil(n/256) blocks of 256: uniform in [-a, a) from a hash of (seed, i),
// so benchmark weights are made on the device (no host copy of 16 GB)
__global__ void fill_kernel(uint16_t *p, size_t n, unsigned long long seed, float a, int bf16) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long z = seed * 0x9e3779b97f4a7c15ull + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float v = ((float)(z >> 40) / 16777216.f * 2.f - 1.f) * a;
    if (bf16) {
        uint32_t u = __float_as_uint(v);
        p[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    } else {
        __half h = __float2half_rn(v);
        p[i] = *(uint16_t *)&h;
    }
}

// grid: ceil(blocks/256) of 256: GGUF blocks of 32 with the scale that puts
// weights in [-a, a) (as cm_model_dummy does on the host) and random codes
__global__ void fill_blocks_kernel(uint8_t *p, size_t nblocks, int type, unsigned long long seed, float a) {
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks) return;
    int bb = type == CM_Q8_0 ? 34 : type == CM_Q4_0 ? 18 : 20, hd = type == CM_Q4_1 ? 4 : 2;
    uint8_t *blk = p + b * (size_t)bb;
    float d = type == CM_Q8_0 ? a / 127.f : type == CM_Q4_0 ? a / 8.f : 2.f * a / 15.f;
    __half dh = __float2half_rn(d), mh = __float2half_rn(-a);
    memcpy(blk, &dh, 2);
    if (type == CM_Q4_1) memcpy(blk + 2, &mh, 2);
    unsigned long long z = seed * 0x9e3779b97f4a7c15ull + b;
    for (int i = hd; i < bb; i++) {
        if ((i - hd) % 8 == 0) {
            z += 0x9e3779b97f4a7c15ull;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
        }
        blk[i] = (uint8_t)(z >> (8 * ((i - hd) % 8)));
    }
}

extern "C" int kn_cuda_fill_random(void *d, int type, size_t n, unsigned long long seed, float a) {
    if (type == CM_Q8_0 || type == CM_Q4_0 || type == CM_Q4_1) {
        size_t nb = n / 32;
        for (size_t off = 0; off < nb; off += (size_t)1 << 30) {
            size_t m = nb - off < ((size_t)1 << 30) ? nb - off : ((size_t)1 << 30);
            fill_blocks_kernel<<<(unsigned)((m + 255) / 256), 256>>>(
                (uint8_t *)d + off * cm_dtype_block_bytes(type), m, type, seed + off, a);
            KN_CUDA_LAUNCHED();
        }
        return 0;
    }
    if (type != CM_F16 && type != CM_BF16) return LLM_EUNSUP;
    for (size_t off = 0; off < n; off += (size_t)1 << 30) { // grid.x limits: a billion elements a launch
        size_t m = n - off < ((size_t)1 << 30) ? n - off : ((size_t)1 << 30);
        fill_kernel<<<(unsigned)((m + 255) / 256), 256>>>((uint16_t *)d + off, m, seed + off, a, type == CM_BF16);
        KN_CUDA_LAUNCHED();
    }
    return 0;
}

// grid: (rows, n_heads), rope_dim/2 threads: head h of row r rotated at pos[r]
// with the host's inv_freq table (so CPU and GPU use the same frequencies)
__global__ void rope_rows_kernel(float *x, int n_heads, int head_dim, int rope_dim, int type, const int32_t *pos,
                                 const float *inv_freq) {
    int i = threadIdx.x, half = rope_dim / 2;
    if (i >= half) return;
    float *v = x + ((size_t)blockIdx.x * n_heads + blockIdx.y) * head_dim, c, s;
    sincosf((float)pos[blockIdx.x] * inv_freq[i], &s, &c);
    int i0 = type == 1 ? i : 2 * i, i1 = type == 1 ? i + half : 2 * i + 1;
    float a = v[i0], b = v[i1];
    v[i0] = a * c - b * s;
    v[i1] = a * s + b * c;
}

// grid: ceil(rows*n/256) blocks of 256
__global__ void add_bias_kernel(float *x, const float *b, size_t total, int n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += b[i % n];
}

// grid: ceil(n/256) blocks of 256
__global__ void scale_kernel(float *x, float s, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

// grid: rows blocks of 256: dst[r] = src[idx[r]]
__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *idx, int n) {
    const float *s = src + (size_t)idx[blockIdx.x] * n;
    float *d = dst + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

extern "C" int kn_cuda_rope_rows(float *d_x, int rows, int n_heads, int head_dim, int rope_dim, int type,
                                 const int32_t *d_pos, const float *d_inv_freq) {
    if (rows <= 0 || n_heads <= 0 || rope_dim <= 0 || rope_dim > head_dim || rope_dim / 2 > 1024) return LLM_EINVAL;
    rope_rows_kernel<<<dim3((unsigned)rows, (unsigned)n_heads), (unsigned)(rope_dim / 2)>>>(
        d_x, n_heads, head_dim, rope_dim, type, d_pos, d_inv_freq);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_add_bias(float *d_x, const float *d_b, int rows, int n) {
    if (rows <= 0 || n <= 0) return LLM_EINVAL;
    size_t total = (size_t)rows * (size_t)n;
    add_bias_kernel<<<(unsigned)((total + 255) / 256), 256>>>(d_x, d_b, total, n);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_scale(float *d_x, float s, size_t n) {
    if (n == 0) return 0;
    scale_kernel<<<(unsigned)((n + 255) / 256), 256>>>(d_x, s, n);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_gather_rows(float *d_dst, const float *d_src, const int32_t *d_idx, int rows, int n) {
    if (rows <= 0 || n <= 0) return LLM_EINVAL;
    gather_rows_kernel<<<rows, 256>>>(d_dst, d_src, d_idx, n);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_copy(void *d_dst, const void *d_src, size_t bytes) {
    KN_CUDA_CHECK(cudaMemcpy(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice));
    return 0;
}

extern "C" int kn_cuda_set_device(int dev) {
    KN_CUDA_CHECK(cudaSetDevice(dev));
    return 0;
}
