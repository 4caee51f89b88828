// kn_cuda_fp8.cu - FP8 E4M3 GEMMs through cuBLASLt (sm_89 / sm_90 tensor
// cores): weights quantized once at load with a scale per output channel
// (or one per tensor), activations quantized per step with one dynamic
// scale (amax / 448). cuBLASLt multiplies the FP8 codes in the "TN" layout
// it requires, with fp32 accumulation and fp32 output; one small kernel then
// applies weight scale x activation scale per output column. The CPU
// reference of the conversion is kn_ref_f32_to_e4m3 (round to nearest even,
// saturating at 448).
#include "kn_cuda.h"
#include "kn_cuda_int.h"

#include <string.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>


#define FP8_MAX 448.f
#define LT_WORKSPACE (32u << 20)

#define LT_PLANS 128 // GEMM shapes remembered: 5 (n, k) pairs a model x the batch sizes in use

typedef struct {
    int ready;
    int64_t n, k;
    int B;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

struct kn_cuda_fp8 {
    cublasLtHandle_t lt;
    void *lt_ws;                 // cuBLASLt workspace
    uint8_t *xq;                 // activations as FP8 codes
    size_t xq_bytes;
    float *x_scale;              // one device float: amax(x) / 448
    unsigned *amax_bits;
    int in_rows;                 // what xq holds now (kn_cuda_fp8_input): in_rows x in_k codes, 0 when nothing
    int64_t in_k;
    lt_plan plans[LT_PLANS];     // by shape, replaced round-robin
    int next_plan;
};

static void plan_drop(lt_plan *p);

// grid-stride: atomic max of |x| as bits (non-negative floats order as unsigned ints)
__global__ void amax_kernel(int type, const void *x, size_t n, unsigned *out) {
    float m = 0.f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(weight_at(type, (const uint8_t *)x, (int64_t)i)));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) atomicMax(out, __float_as_uint(m));
}

// scale[0..n) = max(amax, tiny) / 448 (a zero tensor keeps a usable scale); n = 1 for activations,
// the weight's rows for a per-tensor weight scale (the rescale kernel reads one per column)
__global__ void scale_from_amax_kernel(const unsigned *bits, float *scale, int64_t n) {
    float s = fmaxf(__uint_as_float(*bits), 1e-12f) / FP8_MAX;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        scale[i] = s;
}

// grid: rows blocks of 256: per-row amax -> scale[r]
__global__ void row_scale_kernel(int type, const void *w, int64_t k, float *scale) {
    __shared__ float sh[32];
    float m = 0.f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(weight_at(type, (const uint8_t *)w, (int64_t)blockIdx.x * k + i)));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < (int)blockDim.x / 32; i++) m = fmaxf(m, sh[i]);
        m = fmaxf(m, sh[0]);
        scale[blockIdx.x] = fmaxf(m, 1e-12f) / FP8_MAX;
    }
}

// grid-stride: q[i] = e4m3(x[i] / scale[i / row_len]) (row_len 0: one scale)
__global__ void quant_kernel(int type, const void *x, size_t n, const float *scale, int64_t row_len, uint8_t *q) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = scale[row_len ? i / (size_t)row_len : 0];
        q[i] = (uint8_t)__nv_cvt_float_to_fp8(weight_at(type, (const uint8_t *)x, (int64_t)i) / s, __NV_SATFINITE, __NV_E4M3);
    }
}

// grid-stride over y [B][n]: y *= w_scale[col] * x_scale
__global__ void rescale_kernel(float *y, size_t total, int64_t n, const float *w_scale, const float *x_scale) {
    float xs = *x_scale;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] *= w_scale[i % (size_t)n] * xs;
}

static unsigned grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    return (unsigned)(g > 4096 ? 4096 : g ? g : 1);
}

extern "C" int kn_cuda_fp8_create(kn_cuda_fp8 **out) {
    *out = NULL;
    kn_cuda_fp8 *f = (kn_cuda_fp8 *)calloc(1, sizeof *f);
    if (!f) return LLM_ENOMEM;
    *out = f;
    KN_CUBLAS_CHECK(cublasLtCreate(&f->lt));
    KN_CUDA_CHECK(cudaMalloc(&f->lt_ws, LT_WORKSPACE));
    KN_CUDA_CHECK(cudaMalloc((void **)&f->x_scale, sizeof(float)));
    KN_CUDA_CHECK(cudaMalloc((void **)&f->amax_bits, sizeof(unsigned)));
    return 0;
}

// The activation-code buffer at bytes at least; what it held is gone when it grows.
static int xq_grow(kn_cuda_fp8 *f, size_t bytes) {
    if (bytes <= f->xq_bytes) return 0;
    f->in_rows = 0;
    cudaFree(f->xq);
    f->xq = NULL;
    f->xq_bytes = 0;
    KN_CUDA_CHECK(cudaMalloc((void **)&f->xq, bytes));
    f->xq_bytes = bytes;
    return 0;
}

extern "C" int kn_cuda_fp8_reserve(kn_cuda_fp8 *f, int max_rows, int64_t max_k) {
    if (max_rows <= 0 || max_k <= 0) return LLM_EINVAL;
    return xq_grow(f, (size_t)max_rows * (size_t)max_k);
}

extern "C" void kn_cuda_fp8_destroy(kn_cuda_fp8 *f) {
    if (!f) return;
    for (int i = 0; i < LT_PLANS; i++) plan_drop(&f->plans[i]);
    if (f->lt) cublasLtDestroy(f->lt);
    cudaFree(f->lt_ws);
    cudaFree(f->xq);
    cudaFree(f->x_scale);
    cudaFree(f->amax_bits);
    free(f);
}

extern "C" int kn_cuda_fp8_quantize(kn_cuda_fp8 *f, int type, const void *d_w, int64_t n, int64_t k, int per_channel,
                                    uint8_t *d_q, float *d_scale) {
    if (type != CM_F32 && type != CM_F16 && type != CM_BF16) return LLM_EUNSUP;
    if (n <= 0 || k <= 0 || n > INT32_MAX) return LLM_EINVAL;
    size_t total = (size_t)n * (size_t)k;
    if (per_channel) {
        row_scale_kernel<<<(unsigned)n, 256>>>(type, d_w, k, d_scale);
        KN_CUDA_LAUNCHED();
        quant_kernel<<<grid_for(total), 256>>>(type, d_w, total, d_scale, k, d_q);
        KN_CUDA_LAUNCHED();
        return 0;
    }
    KN_CUDA_CHECK(cudaMemset(f->amax_bits, 0, sizeof(unsigned)));
    amax_kernel<<<grid_for(total), 256>>>(type, d_w, total, f->amax_bits);
    KN_CUDA_LAUNCHED();
    scale_from_amax_kernel<<<grid_for((size_t)n), 256>>>(f->amax_bits, d_scale, n);
    KN_CUDA_LAUNCHED();
    quant_kernel<<<grid_for(total), 256>>>(type, d_w, total, d_scale, 0, d_q);
    KN_CUDA_LAUNCHED();
    return 0;
}

extern "C" int kn_cuda_fp8_input(kn_cuda_fp8 *f, const float *d_x, int B, int64_t k) {
    if (k <= 0 || B <= 0 || k > INT32_MAX) return LLM_EINVAL;
    size_t xs = (size_t)B * (size_t)k;
    f->in_rows = 0;
    int rc = xq_grow(f, xs);
    if (rc) return rc;
    KN_CUDA_CHECK(cudaMemsetAsync(f->amax_bits, 0, sizeof(unsigned), cudaStreamLegacy));
    amax_kernel<<<grid_for(xs), 256>>>(CM_F32, d_x, xs, f->amax_bits);
    KN_CUDA_LAUNCHED();
    scale_from_amax_kernel<<<1, 32>>>(f->amax_bits, f->x_scale, 1);
    KN_CUDA_LAUNCHED();
    quant_kernel<<<grid_for(xs), 256>>>(CM_F32, d_x, xs, f->x_scale, 0, f->xq);
    KN_CUDA_LAUNCHED();
    f->in_rows = B;
    f->in_k = k;
    return 0;
}

extern "C" int kn_cuda_gemm_fp8(kn_cuda_fp8 *f, const uint8_t *d_wq, const float *d_wscale, int64_t n, int64_t k,
                                const float *d_x, float *d_y, int B) {
    if (n <= 0 || k <= 0 || B <= 0 || n > INT32_MAX || k > INT32_MAX) return LLM_EINVAL;
    if (k % 16 || n % 16) return LLM_EUNSUP; // FP8 tensor-core layouts want 16-byte-aligned leading dimensions
    int rc = kn_cuda_fp8_input(f, d_x, B, k);
    return rc ? rc : kn_cuda_gemm_fp8_from_input(f, d_wq, d_wscale, n, k, d_y, B);
}

// One GEMM shape's cuBLASLt descriptors and the algorithm its heuristic chose, made once (a step calls
// the same few shapes hundreds of times; the heuristic alone costs tens of microseconds of host time).
static void plan_drop(lt_plan *p) {
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

static int plan_get(kn_cuda_fp8 *f, int64_t n, int64_t k, int B, lt_plan **out) {
    for (int i = 0; i < LT_PLANS; i++)
        if (f->plans[i].ready && f->plans[i].n == n && f->plans[i].k == k && f->plans[i].B == B) {
            *out = &f->plans[i];
            return 0;
        }
    lt_plan *p = &f->plans[f->next_plan];
    f->next_plan = (f->next_plan + 1) % LT_PLANS;
    plan_drop(p);
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0, rc = 0;
    size_t ws = LT_WORKSPACE;
#define LT(call)                                                                                   \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: cuBLASLt error %s\n", __FILE__, __LINE__, cublasGetStatusName(s_)); \
            rc = s_ == CUBLAS_STATUS_NOT_SUPPORTED ? LLM_EUNSUP : LLM_EDEVICE;                     \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
    // y^T [n][B] (column-major) = W (stored k x n column-major, used transposed) . x^T (k x B)
    LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k));
    LT(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)B, k));
    LT(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)n, (uint64_t)B, n));
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT(cublasLtMatmulAlgoGetHeuristic(f->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &heur, &found));
#undef LT
    if (!found) {
        fprintf(stderr, "%s:%d: cuBLASLt has no FP8 kernel for %lld x %lld x %d on this GPU\n", __FILE__, __LINE__,
                (long long)n, (long long)k, B);
        rc = LLM_EUNSUP;
        goto done;
    }
    p->algo = heur.algo;
    p->n = n;
    p->k = k;
    p->B = B;
    p->ready = 1;
    *out = p;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (rc) plan_drop(p);
    return rc;
}

extern "C" int kn_cuda_gemm_fp8_from_input(kn_cuda_fp8 *f, const uint8_t *d_wq, const float *d_wscale, int64_t n,
                                           int64_t k, float *d_y, int B) {
    if (n <= 0 || n > INT32_MAX) return LLM_EINVAL;
    if (k % 16 || n % 16) return LLM_EUNSUP;
    if (f->in_rows != B || f->in_k != k) return LLM_EINVAL; // not what xq holds
    lt_plan *p;
    int rc = plan_get(f, n, k, B, &p);
    if (rc) return rc;
    const float alpha = 1.f, beta = 0.f;
    cublasStatus_t s = cublasLtMatmul(f->lt, p->op, &alpha, d_wq, p->la, f->xq, p->lb, &beta, d_y, p->lc, d_y, p->lc,
                                      &p->algo, f->lt_ws, LT_WORKSPACE, 0);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "%s:%d: cuBLASLt error %s\n", __FILE__, __LINE__, cublasGetStatusName(s));
        return s == CUBLAS_STATUS_NOT_SUPPORTED ? LLM_EUNSUP : LLM_EDEVICE;
    }
    KN_CUDA_LAUNCHED();
    rescale_kernel<<<grid_for((size_t)B * (size_t)n), 256>>>(d_y, (size_t)B * (size_t)n, n, d_wscale, f->x_scale);
    KN_CUDA_LAUNCHED();
    return 0;
}
