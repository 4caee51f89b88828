// kn_cuda_attn.cu - paged attention on the GPU: K/V rows written into the
// block pool, and causal attention over block tables for any mix of decodes
// and prefill chunks, split along the KV positions (flash-decoding) when few
// query rows would leave SMs idle. The CPU reference is kn_attention
// (kernels/cpu): same cache layout, same fp32 softmax.
#include "kn_cuda.h"
#include "kn_cuda_int.h"
#include "kn_cuda_plan.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>

extern "C" {
#include "kernels.h"
}

__device__ __forceinline__ float kv_load(const float *p) { return *p; }
__device__ __forceinline__ float kv_load(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void kv_put(float *p, float v) { *p = v; }
__device__ __forceinline__ void kv_put(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ float kv_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void kv_put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
// FP8 E4M3 without a scale (as vLLM's default fp8 cache): round to nearest even, saturating at 448
__device__ __forceinline__ float kv_load(const __nv_fp8_e4m3 *p) { return (float)*p; }
__device__ __forceinline__ void kv_put(__nv_fp8_e4m3 *p, float v) { *p = __nv_fp8_e4m3(v); }

// grid: rows blocks of 256 threads. Row r's K and V ([width] = n_kv*hd) go to
// slot[r] = block * block_size + offset; a negative slot is skipped (padding).
template <typename KV>
__global__ void kv_store_kernel(KV *kc, KV *vc, size_t block_stride_el, const float *k, const float *v,
                                const int32_t *slot, int width, int bshift) {
    int r = blockIdx.x, s = slot[r];
    if (s < 0) return;
    size_t base = (size_t)(s >> bshift) * block_stride_el + (size_t)(s & ((1 << bshift) - 1)) * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        kv_put(kc + base + i, k[(size_t)r * width + i]);
        kv_put(vc + base + i, v[(size_t)r * width + i]);
    }
}

// grid: (rows, n_head, splits), KN_CUDA_ATTN_THREADS threads = 4 warps.
// Query row r (head h) attends positions [s*chunk, min((s+1)*chunk, pos+1))
// of its sequence; each warp takes every 4th position with an online softmax,
// lanes hold NE = hd/32 elements. Scores and sums in fp32. Only positions
// before pos+1 are read: a NaN anywhere else in the pool cannot leak in.
template <int NE, typename KV>
__global__ void paged_attn_kernel(const float *q, float *out, float *ws, const KV *kc, const KV *vc,
                                  size_t block_stride_el, const int32_t *row_seq, const int32_t *row_pos,
                                  const int32_t *seq_off, const int32_t *blocks, int n_head, int n_kv, int bshift,
                                  int chunk, float scale) {
    const int hd = NE * 32, r = blockIdx.x, h = blockIdx.y, s = blockIdx.z, splits = gridDim.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = KN_CUDA_ATTN_THREADS / 32;
    const int len = row_pos[r] + 1, j0 = s * chunk, j1 = min(len, j0 + chunk), hk = h / (n_head / n_kv);
    const int32_t *bt = blocks + seq_off[row_seq[r]];
    float qv[NE], acc[NE], m = -INFINITY, l = 0.f;
    for (int e = 0; e < NE; e++) {
        qv[e] = q[((size_t)r * n_head + h) * hd + lane + 32 * e] * scale;
        acc[e] = 0.f;
    }
    for (int j = j0 + warp; j < j1; j += nw) {
        size_t base = (size_t)bt[j >> bshift] * block_stride_el +
                      ((size_t)(j & ((1 << bshift) - 1)) * n_kv + hk) * hd + lane;
        float dot = 0.f;
        for (int e = 0; e < NE; e++) dot += qv[e] * kv_load(kc + base + 32 * e);
        for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        float mn = fmaxf(m, dot), c = expf(m - mn), p = expf(dot - mn);
        l = l * c + p;
        for (int e = 0; e < NE; e++) acc[e] = acc[e] * c + p * kv_load(vc + base + 32 * e);
        m = mn;
    }
    __shared__ float sm_m[KN_CUDA_ATTN_THREADS / 32], sm_l[KN_CUDA_ATTN_THREADS / 32];
    __shared__ float sm_acc[KN_CUDA_ATTN_THREADS / 32][NE * 32];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    for (int e = 0; e < NE; e++) sm_acc[warp][lane + 32 * e] = acc[e];
    __syncthreads();
    if (warp != 0) return;
    float M = -INFINITY, L = 0.f, o[NE];
    for (int w = 0; w < nw; w++) M = fmaxf(M, sm_m[w]);
    for (int e = 0; e < NE; e++) o[e] = 0.f;
    for (int w = 0; w < nw; w++) {
        if (sm_m[w] == -INFINITY) continue; // a warp that saw no position
        float c = expf(sm_m[w] - M);
        L += sm_l[w] * c;
        for (int e = 0; e < NE; e++) o[e] += sm_acc[w][lane + 32 * e] * c;
    }
    if (splits == 1) {
        float inv = L > 0.f ? 1.f / L : 0.f;
        for (int e = 0; e < NE; e++) out[((size_t)r * n_head + h) * hd + lane + 32 * e] = o[e] * inv;
        return;
    }
    float *p = ws + (((size_t)r * n_head + h) * splits + s) * (hd + 2);
    if (lane == 0) {
        p[0] = M;
        p[1] = L;
    }
    for (int e = 0; e < NE; e++) p[2 + lane + 32 * e] = o[e];
}

// grid: (rows, n_head), hd threads: merges the splits of one (row, head).
__global__ void attn_combine_kernel(float *out, const float *ws, int n_head, int hd, int splits) {
    int r = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
    const float *p = ws + ((size_t)r * n_head + h) * splits * (hd + 2);
    float M = -INFINITY, L = 0.f, o = 0.f;
    for (int s = 0; s < splits; s++) M = fmaxf(M, p[(size_t)s * (hd + 2)]);
    for (int s = 0; s < splits; s++) {
        const float *ps = p + (size_t)s * (hd + 2);
        if (ps[0] == -INFINITY) continue; // a split past this row's length
        float c = expf(ps[0] - M);
        L += ps[1] * c;
        o += ps[2 + t] * c;
    }
    out[((size_t)r * n_head + h) * hd + t] = L > 0.f ? o / L : 0.f;
}

extern "C" int kn_cuda_kv_store(int kv_type, void *d_kc, void *d_vc, size_t block_stride, const float *d_k,
                                const float *d_v, const int32_t *d_slot, int rows, int width, int block_shift) {
    if (rows <= 0 || width <= 0 || block_shift < 0 || block_shift > 12) return LLM_EINVAL;
    if (kv_type == KN_KV_F16)
        kv_store_kernel<__half><<<rows, 256>>>((__half *)d_kc, (__half *)d_vc, block_stride / sizeof(__half), d_k,
                                               d_v, d_slot, width, block_shift);
    else if (kv_type == KN_KV_F32)
        kv_store_kernel<float><<<rows, 256>>>((float *)d_kc, (float *)d_vc, block_stride / sizeof(float), d_k, d_v,
                                              d_slot, width, block_shift);
    else if (kv_type == KN_KV_BF16)
        kv_store_kernel<__nv_bfloat16><<<rows, 256>>>((__nv_bfloat16 *)d_kc, (__nv_bfloat16 *)d_vc, block_stride / 2, d_k,
                                                      d_v, d_slot, width, block_shift);
    else if (kv_type == KN_KV_FP8)
        kv_store_kernel<__nv_fp8_e4m3><<<rows, 256>>>((__nv_fp8_e4m3 *)d_kc, (__nv_fp8_e4m3 *)d_vc, block_stride, d_k,
                                                      d_v, d_slot, width, block_shift);
    else
        return LLM_EUNSUP;
    KN_CUDA_LAUNCHED();
    return 0;
}

template <int NE>
static int launch_attn(const kn_cuda_attn_args *a, const kn_cuda_attn_geom *g) {
    dim3 grid(g->grid[0], g->grid[1], g->grid[2]);
    float scale = 1.f / sqrtf((float)a->hd);
    if (a->kv_type == KN_KV_F16)
        paged_attn_kernel<NE, __half><<<grid, g->threads>>>(
            a->d_q, a->d_out, a->d_ws, (const __half *)a->d_kc, (const __half *)a->d_vc,
            a->block_stride / sizeof(__half), a->d_row_seq, a->d_row_pos, a->d_seq_off, a->d_blocks, a->n_head,
            a->n_kv, a->block_shift, g->chunk, scale);
    else if (a->kv_type == KN_KV_BF16)
        paged_attn_kernel<NE, __nv_bfloat16><<<grid, g->threads>>>(
            a->d_q, a->d_out, a->d_ws, (const __nv_bfloat16 *)a->d_kc, (const __nv_bfloat16 *)a->d_vc,
            a->block_stride / 2, a->d_row_seq, a->d_row_pos, a->d_seq_off, a->d_blocks, a->n_head, a->n_kv,
            a->block_shift, g->chunk, scale);
    else if (a->kv_type == KN_KV_FP8)
        paged_attn_kernel<NE, __nv_fp8_e4m3><<<grid, g->threads>>>(
            a->d_q, a->d_out, a->d_ws, (const __nv_fp8_e4m3 *)a->d_kc, (const __nv_fp8_e4m3 *)a->d_vc,
            a->block_stride, a->d_row_seq, a->d_row_pos, a->d_seq_off, a->d_blocks, a->n_head, a->n_kv,
            a->block_shift, g->chunk, scale);
    else
        paged_attn_kernel<NE, float><<<grid, g->threads>>>(
            a->d_q, a->d_out, a->d_ws, (const float *)a->d_kc, (const float *)a->d_vc, a->block_stride / sizeof(float),
            a->d_row_seq, a->d_row_pos, a->d_seq_off, a->d_blocks, a->n_head, a->n_kv, a->block_shift, g->chunk,
            scale);
    KN_CUDA_LAUNCHED();
    if (g->splits > 1) {
        attn_combine_kernel<<<dim3(g->grid[0], g->grid[1]), a->hd>>>(a->d_out, a->d_ws, a->n_head, a->hd, g->splits);
        KN_CUDA_LAUNCHED();
    }
    return 0;
}

extern "C" int kn_cuda_paged_attention(const kn_cuda_attn_args *a) {
    kn_cuda_attn_geom g;
    int rc = kn_cuda_attn_plan(a->n_rows, a->n_head, a->hd, a->max_len, a->n_sm, &g);
    if (rc) return rc;
    if (a->n_kv <= 0 || a->n_head % a->n_kv ||
        a->kv_type < KN_KV_F32 || a->kv_type > KN_KV_BF16)
        return LLM_EINVAL;
    if (g.workspace_bytes > a->ws_bytes) return LLM_ERANGE; // size it with kn_cuda_attn_plan at start
    switch (a->hd / 32) {
    case 1: return launch_attn<1>(a, &g);
    case 2: return launch_attn<2>(a, &g);
    case 3: return launch_attn<3>(a, &g);
    case 4: return launch_attn<4>(a, &g);
    case 5: return launch_attn<5>(a, &g);
    case 6: return launch_attn<6>(a, &g);
    case 7: return launch_attn<7>(a, &g);
    default: return launch_attn<8>(a, &g);
    }
}
