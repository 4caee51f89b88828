// kn_cuda_gemm.cu - dense GEMMs through cuBLAS: y[B][N] = x[B][K] . W[N][K]^T
// with W in F16 or BF16 (tensor cores), fp32 accumulation and output.
//
// Row-major y [B][N] is column-major y^T [N][B]; W row-major [N][K] is
// column-major [K][N], so y^T = op_T(W) . x^T with lda = ldb = K, ldc = N.
#include "kn_cuda.h"
#include "kn_cuda_int.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>

struct kn_cuda_blas {
    cublasHandle_t h;
    void *ws;          // x rounded to W's type, sized at load by kn_cuda_blas_reserve (no per-step malloc after)
    size_t ws_bytes;
    void *blas_ws;     // cuBLAS's own workspace, given to it at load so that it allocates none later
    int in_type, in_rows; // what ws holds now (kn_cuda_gemm_input): x rounded to in_type, in_rows x in_k
    int64_t in_k;
};

#define BLAS_WORKSPACE (32u << 20) // what cuBLAS recommends for Hopper

// grid: ceil(n/256) blocks of 256
__global__ void to_half_kernel(const float *x, __half *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(x[i]);
}
__global__ void to_bf16_kernel(const float *x, __nv_bfloat16 *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

extern "C" int kn_cuda_blas_create(kn_cuda_blas **out) {
    *out = NULL;
    kn_cuda_blas *b = (kn_cuda_blas *)calloc(1, sizeof *b);
    if (!b) return LLM_ENOMEM;
    cublasStatus_t s = cublasCreate(&b->h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "%s:%d: cuBLAS error %s\n", __FILE__, __LINE__, cublasGetStatusName(s));
        free(b);
        return LLM_EDEVICE;
    }
    *out = b;
    return 0;
}

extern "C" void kn_cuda_blas_destroy(kn_cuda_blas *b) {
    if (!b) return;
    if (b->h) cublasDestroy(b->h);
    if (b->ws) cudaFree(b->ws);
    if (b->blas_ws) cudaFree(b->blas_ws);
    free(b);
}

// The rounded-activation buffer at need bytes at least; what it held is gone when it grows.
static int ws_grow(kn_cuda_blas *b, size_t need) {
    if (need <= b->ws_bytes) return 0;
    b->in_rows = 0;
    if (b->ws) cudaFree(b->ws);
    b->ws = NULL;
    b->ws_bytes = 0;
    KN_CUDA_CHECK(cudaMalloc(&b->ws, need));
    b->ws_bytes = need;
    return 0;
}

extern "C" int kn_cuda_blas_reserve(kn_cuda_blas *b, int max_rows, int64_t max_k) {
    if (max_rows <= 0 || max_k <= 0) return LLM_EINVAL;
    if (!b->blas_ws) {
        KN_CUDA_CHECK(cudaMalloc(&b->blas_ws, BLAS_WORKSPACE));
        KN_CUBLAS_CHECK(cublasSetWorkspace(b->h, b->blas_ws, BLAS_WORKSPACE));
    }
    return ws_grow(b, (size_t)max_rows * (size_t)max_k * 2);
}

extern "C" int kn_cuda_gemm_input(kn_cuda_blas *b, int type, const float *d_x, int B, int64_t k) {
    if (type != CM_F16 && type != CM_BF16) return LLM_EUNSUP;
    if (k <= 0 || B <= 0 || k > INT32_MAX) return LLM_EINVAL;
    size_t elems = (size_t)B * (size_t)k;
    b->in_rows = 0;
    int rc = ws_grow(b, elems * 2);
    if (rc) return rc;
    if (type == CM_F16) to_half_kernel<<<(unsigned)((elems + 255) / 256), 256>>>(d_x, (__half *)b->ws, elems);
    else to_bf16_kernel<<<(unsigned)((elems + 255) / 256), 256>>>(d_x, (__nv_bfloat16 *)b->ws, elems);
    KN_CUDA_LAUNCHED();
    b->in_type = type;
    b->in_rows = B;
    b->in_k = k;
    return 0;
}

extern "C" int kn_cuda_gemm_from_input(kn_cuda_blas *b, int type, const void *d_w, int64_t n, int64_t k, float *d_y,
                                       int B) {
    if (n <= 0 || n > INT32_MAX) return LLM_EINVAL;
    if (b->in_rows != B || b->in_k != k || b->in_type != type) return LLM_EINVAL; // not what ws holds
    cudaDataType_t dt = type == CM_F16 ? CUDA_R_16F : CUDA_R_16BF;
    const float alpha = 1.f, beta = 0.f;
    KN_CUBLAS_CHECK(cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, B, (int)k, &alpha, d_w, dt, (int)k, b->ws, dt,
                                 (int)k, &beta, d_y, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

extern "C" int kn_cuda_gemm(kn_cuda_blas *b, int type, const void *d_w, int64_t n, int64_t k, const float *d_x,
                            float *d_y, int B) {
    if (type != CM_F16 && type != CM_BF16) return LLM_EUNSUP;
    if (n <= 0 || k <= 0 || B <= 0 || n > INT32_MAX || k > INT32_MAX) return LLM_EINVAL;
    int rc = kn_cuda_gemm_input(b, type, d_x, B, k);
    return rc ? rc : kn_cuda_gemm_from_input(b, type, d_w, n, k, d_y, B);
}
