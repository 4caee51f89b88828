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

// One K or V row's NE elements at p (lane l's slice [l*NE, l*NE + NE) of a head), in as few loads as
// its bytes allow: 16-byte loads for 16-bit caches at head_dim 256, 8-byte at 128. The slice is aligned to
// its own size: the pool is cudaMalloc'd, blocks, rows and heads are multiples of 32 elements apart.
template <int NE, typename KV>
__device__ __forceinline__ void load_row(const KV *p, float *out) {
    constexpr int BYTES = NE * (int)sizeof(KV);
    union {
        uint4 v16[BYTES / 16 > 0 ? BYTES / 16 : 1];
        uint2 v8[BYTES / 8 > 0 ? BYTES / 8 : 1];
        unsigned v4[BYTES / 4 > 0 ? BYTES / 4 : 1];
        KV e[NE];
    } u;
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int i = 0; i < BYTES / 16; i++) u.v16[i] = ((const uint4 *)p)[i];
    } else if constexpr (BYTES % 8 == 0) {
#pragma unroll
        for (int i = 0; i < BYTES / 8; i++) u.v8[i] = ((const uint2 *)p)[i];
    } else if constexpr (BYTES % 4 == 0) {
#pragma unroll
        for (int i = 0; i < BYTES / 4; i++) u.v4[i] = ((const unsigned *)p)[i];
    } else {
#pragma unroll
        for (int e = 0; e < NE; e++) u.e[e] = p[e];
    }
#pragma unroll
    for (int e = 0; e < NE; e++) out[e] = kv_load(&u.e[e]);
}

// The decode kernel for grouped-query attention. grid: (rows, n_kv, splits), KN_CUDA_ATTN_THREADS threads
// = 4 warps. One CTA serves the G = n_head / n_kv query heads that share KV head hk, so each K and V row
// is read once for all G of them (the per-head kernel reads it G times); lane l holds the NE contiguous
// elements [l*NE, l*NE + NE) of a row (vector loads), V is loaded with K, each warp takes U consecutive
// positions in turn (every 4th group of U; U row pairs in flight a warp) with an online softmax per head,
// and the warps merge through shared memory. The output (or the
// split's partial, merged by attn_combine_kernel) is laid out as the per-head kernel's.
template <int NE, int G, typename KV>
__global__ void paged_attn_gqa_kernel(const float *q, float *out, float *ws, const KV *kc, const KV *vc,
                                      size_t block_stride_el, const int32_t *row_seq, const int32_t *row_pos,
                                      const int32_t *seq_off, const int32_t *blocks, int n_head, int n_kv, int bshift,
                                      int chunk, float scale) {
    constexpr int HD = NE * 32, NW = KN_CUDA_ATTN_THREADS / 32;
    const int r = blockIdx.x, hk = blockIdx.y, s = blockIdx.z, splits = gridDim.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int len = row_pos[r] + 1, j0 = s * chunk, j1 = min(len, j0 + chunk);
    const int32_t *bt = blocks + seq_off[row_seq[r]];
    float qv[G][NE], acc[G][NE], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qh = q + ((size_t)r * n_head + (size_t)hk * G + g) * HD + lane * NE;
#pragma unroll
        for (int e = 0; e < NE; e++) {
            qv[g][e] = qh[e] * scale;
            acc[g][e] = 0.f;
        }
        m[g] = -INFINITY;
        l[g] = 0.f;
    }
    // U consecutive positions a warp at a time, all their K and V loads issued before any is used (U row
    // pairs in flight a warp, not one); positions past j1 load nothing and weigh 0.
    constexpr int U = G * NE <= 16 ? 4 : 2;
    for (int jb = j0 + warp * U; jb < j1; jb += NW * U) {
        float kr[U][NE], vr[U][NE];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = jb + u;
            if (j < j1) {
                size_t base = (size_t)bt[j >> bshift] * block_stride_el +
                              ((size_t)(j & ((1 << bshift) - 1)) * n_kv + hk) * HD + (size_t)lane * NE;
                load_row<NE>(kc + base, kr[u]);
                load_row<NE>(vc + base, vr[u]);
            } else {
#pragma unroll
                for (int e = 0; e < NE; e++) kr[u][e] = vr[u][e] = 0.f;
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float dot[U], mn = m[g];
#pragma unroll
            for (int u = 0; u < U; u++) {
                dot[u] = 0.f;
#pragma unroll
                for (int e = 0; e < NE; e++) dot[u] += qv[g][e] * kr[u][e];
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], off);
                if (jb + u >= j1) dot[u] = -INFINITY;
                mn = fmaxf(mn, dot[u]);
            }
            // position jb is below j1, so mn is finite and no exp sees inf - inf
            float c = expf(m[g] - mn);
            l[g] *= c;
#pragma unroll
            for (int e = 0; e < NE; e++) acc[g][e] *= c;
#pragma unroll
            for (int u = 0; u < U; u++) {
                float p = expf(dot[u] - mn);
                l[g] += p;
#pragma unroll
                for (int e = 0; e < NE; e++) acc[g][e] += p * vr[u][e];
            }
            m[g] = mn;
        }
    }
    __shared__ float sm_m[NW][G], sm_l[NW][G];
    __shared__ float sm_acc[NW][G][HD];
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < NE; e++) sm_acc[warp][g][lane * NE + e] = acc[g][e];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += KN_CUDA_ATTN_THREADS) {
        const int g = idx / HD, i = idx % HD, h = hk * G + g;
        float M = -INFINITY, L = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) M = fmaxf(M, sm_m[w][g]);
#pragma unroll
        for (int w = 0; w < NW; w++) {
            if (sm_m[w][g] == -INFINITY) continue; // a warp that saw no position
            float c = expf(sm_m[w][g] - M);
            L += sm_l[w][g] * c;
            o += sm_acc[w][g][i] * c;
        }
        if (splits == 1) {
            out[((size_t)r * n_head + h) * HD + i] = L > 0.f ? o / L : 0.f;
            continue;
        }
        float *pw = ws + (((size_t)r * n_head + h) * splits + s) * (HD + 2);
        if (i == 0) {
            pw[0] = M;
            pw[1] = L;
        }
        pw[2 + i] = o;
    }
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

template <int NE, int G, typename KV>
static void launch_gqa_as(const kn_cuda_attn_args *a, const kn_cuda_attn_geom *g, float scale) {
    dim3 grid(g->grid[0], (unsigned)a->n_kv, g->grid[2]);
    size_t stride_el = a->block_stride / sizeof(KV);
    paged_attn_gqa_kernel<NE, G, KV><<<grid, g->threads>>>(
        a->d_q, a->d_out, a->d_ws, (const KV *)a->d_kc, (const KV *)a->d_vc, stride_el, a->d_row_seq, a->d_row_pos,
        a->d_seq_off, a->d_blocks, a->n_head, a->n_kv, a->block_shift, g->chunk, scale);
}

template <int NE, int G>
static int launch_gqa(const kn_cuda_attn_args *a, const kn_cuda_attn_geom *g) {
    float scale = 1.f / sqrtf((float)a->hd);
    if (a->kv_type == KN_KV_F16) launch_gqa_as<NE, G, __half>(a, g, scale);
    else if (a->kv_type == KN_KV_BF16) launch_gqa_as<NE, G, __nv_bfloat16>(a, g, scale);
    else if (a->kv_type == KN_KV_FP8) launch_gqa_as<NE, G, __nv_fp8_e4m3>(a, g, scale);
    else launch_gqa_as<NE, G, float>(a, g, scale);
    KN_CUDA_LAUNCHED();
    if (g->splits > 1) {
        attn_combine_kernel<<<dim3(g->grid[0], g->grid[1]), a->hd>>>(a->d_out, a->d_ws, a->n_head, a->hd, g->splits);
        KN_CUDA_LAUNCHED();
    }
    return 0;
}

/* The grouped kernel's instantiations: head_dim 64, 128 and 256 with 2, 4 or 8 query heads a KV head
 * (G x NE <= 32 floats of queries and as many of accumulators a lane). */
static bool gqa_has(int hd, int G) {
    return (hd == 64 || hd == 128) ? (G == 2 || G == 4 || G == 8) : hd == 256 ? (G == 2 || G == 4) : false;
}

static int gqa_launch(const kn_cuda_attn_args *a, const kn_cuda_attn_geom *g) {
    switch (a->hd * 16 + a->n_head / a->n_kv) {
    case 64 * 16 + 2: return launch_gqa<2, 2>(a, g);
    case 64 * 16 + 4: return launch_gqa<2, 4>(a, g);
    case 64 * 16 + 8: return launch_gqa<2, 8>(a, g);
    case 128 * 16 + 2: return launch_gqa<4, 2>(a, g);
    case 128 * 16 + 4: return launch_gqa<4, 4>(a, g);
    case 128 * 16 + 8: return launch_gqa<4, 8>(a, g);
    case 256 * 16 + 2: return launch_gqa<8, 2>(a, g);
    case 256 * 16 + 4: return launch_gqa<8, 4>(a, g);
    default: return LLM_EUNSUP; // gqa_has said yes: cannot happen
    }
}

// Which kernel a call runs (1: the grouped one) and its geometry: the splits fill the SMs by that kernel's CTAs.
static int attn_choose(const kn_cuda_attn_args *a, kn_cuda_attn_geom *g, int *grouped) {
    if (a->n_kv <= 0 || a->n_head <= 0 || a->n_head % a->n_kv || a->kv_type < KN_KV_F32 || a->kv_type > KN_KV_BF16 ||
        a->variant < KN_ATTN_AUTO || a->variant > KN_ATTN_GROUPED)
        return LLM_EINVAL;
    *grouped = a->variant != KN_ATTN_PER_HEAD && gqa_has(a->hd, a->n_head / a->n_kv);
    if (a->variant == KN_ATTN_GROUPED && !*grouped) return LLM_EUNSUP;
    return kn_cuda_attn_plan_ctas(a->n_rows, a->n_head, *grouped ? a->n_kv : a->n_head, a->hd, a->max_len, a->n_sm, g);
}

extern "C" int kn_cuda_attn_geometry(const kn_cuda_attn_args *a, kn_cuda_attn_geom *g) {
    int grouped;
    return attn_choose(a, g, &grouped);
}

extern "C" int kn_cuda_paged_attention(const kn_cuda_attn_args *a) {
    kn_cuda_attn_geom g;
    int grouped, rc = attn_choose(a, &g, &grouped);
    if (rc) return rc;
    if (g.workspace_bytes > a->ws_bytes) return LLM_ERANGE; // size it with kn_cuda_attn_geometry at start
    if (grouped) return gqa_launch(a, &g);
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
