// kn_cuda_sample.cu - sampling on the device, one CTA per row of logits, so
// only token ids cross to the host. vLLM's order: repetition and presence
// penalties (once per distinct previous token), frequency penalty (per
// occurrence), temperature, then top-k, top-p and min-p as one logit
// threshold found by bisection (no sort: 40 passes over the row in shared
// nothing, each a block reduction), and an inverse-CDF draw in index order
// from a counter-based hash of (seed, step). Temperature 0 is argmax (the
// lowest index among equals, as the CPU sampler does).
#include "kn_cuda.h"
#include "kn_cuda_int.h"

#include <math.h>

#define SAMPLE_THREADS 1024

__device__ float block_sum(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.f;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    return sh[0];
}

__device__ float block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : -INFINITY;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    return sh[0];
}

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// a logit survives the threshold; -inf (masked by a grammar) never does, even when no filter set one
__device__ __forceinline__ bool kept(float v, float thr) { return v >= thr && v > -INFINITY; }

// grid: rows CTAs of SAMPLE_THREADS
__global__ void sample_kernel(float *logits, int vocab, const kn_cuda_sample_params *params, const int32_t *hist,
                              int32_t *out) {
    __shared__ float sh[32];
    __shared__ float sh_v[SAMPLE_THREADS];
    __shared__ int sh_i[SAMPLE_THREADS];
    const kn_cuda_sample_params P = params[blockIdx.x];
    float *l = logits + (size_t)blockIdx.x * vocab;
    const int32_t *h = hist + P.hist_off;
    const int t = threadIdx.x, nt = blockDim.x;
    // penalties: distinct tokens first (no two threads touch one logit), then every occurrence
    if (P.repetition_penalty != 1.f || P.presence_penalty != 0.f)
        for (int i = t; i < P.hist_len; i += nt) {
            int32_t id = h[i];
            bool first = id >= 0 && id < vocab;
            for (int j = 0; j < i && first; j++) first = h[j] != id;
            if (!first) continue;
            float v = l[id];
            if (P.repetition_penalty != 1.f) v = v > 0.f ? v / P.repetition_penalty : v * P.repetition_penalty;
            l[id] = v - P.presence_penalty;
        }
    __syncthreads();
    if (P.frequency_penalty != 0.f)
        for (int i = t; i < P.hist_len; i += nt)
            if (h[i] >= 0 && h[i] < vocab) atomicAdd(&l[h[i]], -P.frequency_penalty);
    __syncthreads();
    if (P.temperature <= 0.f || P.top_k == 1) { // greedy: (value, lowest index) argmax
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = t; i < vocab; i += nt)
            if (l[i] > bv) {
                bv = l[i];
                bi = i;
            }
        sh_v[t] = bv;
        sh_i[t] = bi;
        __syncthreads();
        for (int s = nt / 2; s > 0; s >>= 1) {
            if (t < s && (sh_v[t + s] > sh_v[t] || (sh_v[t + s] == sh_v[t] && sh_i[t + s] < sh_i[t]))) {
                sh_v[t] = sh_v[t + s];
                sh_i[t] = sh_i[t + s];
            }
            __syncthreads();
        }
        if (t == 0) out[blockIdx.x] = sh_i[0] < vocab ? sh_i[0] : 0;
        return;
    }
    const float inv_t = 1.f / P.temperature;
    float mx = -INFINITY, mn = INFINITY; // mn: the smallest finite logit; a -inf one (a grammar's mask) is never kept
    for (int i = t; i < vocab; i += nt) {
        float v = l[i] * inv_t;
        l[i] = v;
        mx = fmaxf(mx, v);
        if (v > -INFINITY) mn = fminf(mn, v);
    }
    mx = block_max(mx, sh);
    mn = -block_max(-mn, sh);
    if (mx == -INFINITY) { // every token masked: nothing to draw (the host never asks this)
        if (t == 0) out[blockIdx.x] = 0;
        return;
    }
    float thr = -INFINITY;
    if (P.top_k > 0 && P.top_k < vocab) { // largest threshold keeping at least top_k logits
        float lo = mn, hi = mx;
        for (int it = 0; it < 40; it++) {
            float mid = 0.5f * (lo + hi), c = 0.f;
            for (int i = t; i < vocab; i += nt) c += kept(l[i], mid) ? 1.f : 0.f;
            if (block_sum(c, sh) >= (float)P.top_k) lo = mid;
            else hi = mid;
        }
        thr = lo;
    }
    if (P.min_p > 0.f) thr = fmaxf(thr, mx + logf(P.min_p));
    if (P.top_p > 0.f && P.top_p < 1.f) { // largest threshold whose kept mass is at least top_p
        float z = 0.f;
        for (int i = t; i < vocab; i += nt) z += kept(l[i], thr) ? expf(l[i] - mx) : 0.f;
        z = block_sum(z, sh);
        float lo = thr > mn ? thr : mn, hi = mx;
        for (int it = 0; it < 40; it++) {
            float mid = 0.5f * (lo + hi), s = 0.f;
            for (int i = t; i < vocab; i += nt) s += kept(l[i], mid) ? expf(l[i] - mx) : 0.f;
            if (block_sum(s, sh) >= P.top_p * z) lo = mid;
            else hi = mid;
        }
        thr = fmaxf(thr, lo);
    }
    // inverse CDF in index order: each thread owns a contiguous chunk of the row
    int per = (vocab + nt - 1) / nt, i0 = t * per, i1 = min(vocab, i0 + per);
    float mine = 0.f;
    for (int i = i0; i < i1; i++) mine += kept(l[i], thr) ? expf(l[i] - mx) : 0.f;
    sh_v[t] = mine;
    __syncthreads();
    for (int s = 1; s < nt; s <<= 1) { // inclusive scan (Hillis-Steele)
        float add = t >= s ? sh_v[t - s] : 0.f;
        __syncthreads();
        sh_v[t] += add;
        __syncthreads();
    }
    float total = sh_v[nt - 1];
    unsigned long long r = mix64(P.seed * 0x9e3779b97f4a7c15ull + (unsigned long long)P.step + 1);
    float u = (float)((double)(r >> 11) * (1.0 / 9007199254740992.0)) * total;
    float before = t ? sh_v[t - 1] : 0.f;
    if (t == 0) sh_i[0] = -1;
    __syncthreads();
    if (u >= before && u < sh_v[t] && mine > 0.f) {
        float acc = before;
        int pick = -1, last = -1;
        for (int i = i0; i < i1 && pick < 0; i++) {
            if (!kept(l[i], thr)) continue;
            last = i;
            acc += expf(l[i] - mx);
            if (u < acc) pick = i;
        }
        sh_i[0] = pick >= 0 ? pick : last; // rounding at the chunk's end: its last kept token
    }
    __syncthreads();
    if (t == 0) {
        int pick = sh_i[0];
        if (pick < 0) // u fell on the total (rounding): the last kept token of the row
            for (int i = vocab - 1; i >= 0 && pick < 0; i--)
                if (kept(l[i], thr)) pick = i;
        out[blockIdx.x] = pick < 0 ? 0 : pick;
    }
}

extern "C" int kn_cuda_sample(float *d_logits, int rows, int vocab, const kn_cuda_sample_params *d_params,
                              const int32_t *d_hist, int32_t *d_out) {
    if (rows <= 0 || vocab <= 0) return LLM_EINVAL;
    sample_kernel<<<rows, SAMPLE_THREADS>>>(d_logits, vocab, d_params, d_hist, d_out);
    KN_CUDA_LAUNCHED();
    return 0;
}
