/* llmserve-attn-bench: prefill attention alone, per SIMD path: a prompt's
 * chunk of --chunk tokens at position --pos over a paged f16 KV cache, in
 * the shape of a model's layer (--heads, --kv-heads, --head-dim),
 * computed two ways in the same run:
 *   tiled   one call with the chunk as one sequence: tokens go in tiles that
 *           share each K and V row's conversion (impl->attn_tile)
 *   token   the same tokens as one-token sequences in one call: each token
 *           reads and converts its whole prefix alone, as a decode row does
 * Both give bit-identical outputs (checked here, and in kernels_test).
 *
 *   llmserve-attn-bench [--threads 1] [--reps 5] [--isa avx2,avx512]
 *       [--heads 9] [--kv-heads 3] [--head-dim 64] [--pos 2048] [--chunk 512]
 *
 * The defaults are SmolLM2-135M's layer and the last chunk of a 2,560-token
 * prompt. Each line: the median time of a call over --reps interleaved runs,
 * its GFLOP/s (4 x positions read x head_dim per query head, the QK and PV
 * multiply-adds) and tiled's speed-up over token. A benchmark, not a test. */
#include "kernels.h"

#include "bn_util.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;

static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
}

int main(int argc, char **argv) {
    int threads = 1, reps = 5, nh = 9, nkv = 3, hd = 64, pos = 2048, chunk = 512, c;
    const char *isas = "avx2,avx512";
    static const struct option lo[] = {{"threads", 1, 0, 't'}, {"reps", 1, 0, 'r'}, {"isa", 1, 0, 'i'},
                                       {"heads", 1, 0, 'H'},   {"kv-heads", 1, 0, 'K'}, {"head-dim", 1, 0, 'D'},
                                       {"pos", 1, 0, 'p'},     {"chunk", 1, 0, 'c'},  {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 't': threads = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'i': isas = optarg; break;
        case 'H': nh = atoi(optarg); break;
        case 'K': nkv = atoi(optarg); break;
        case 'D': hd = atoi(optarg); break;
        case 'p': pos = atoi(optarg); break;
        case 'c': chunk = atoi(optarg); break;
        default:
            printf("usage: llmserve-attn-bench [--threads N] [--reps N] [--isa LIST] [--heads N] [--kv-heads N]\n"
                   "       [--head-dim N] [--pos N] [--chunk N]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (threads < 1 || reps < 1 || nkv < 1 || nh < nkv || nh % nkv || hd < 1 || hd > 256 || pos < 0 || chunk < 1 ||
        pos + chunk > (1 << 20)) {
        fprintf(stderr, "llmserve-attn-bench: bad shape or counts\n");
        return 2;
    }
    int shift = 4, bs = 1 << shift, len = pos + chunk, nb = (len + bs - 1) / bs;
    size_t row = (size_t)nkv * hd, kvn = (size_t)nb * bs * row;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int b = 0; b < nb; b++) table[b] = (b * 7919) % nb; /* scattered blocks, as a pool hands them out */
    float *kf = malloc(sizeof(float) * kvn), *vf = malloc(sizeof(float) * kvn);
    for (size_t i = 0; i < kvn; i++) { kf[i] = frand(); vf[i] = frand(); }
    void *kc = malloc(kn_kv_elem_bytes(KN_KV_F16) * kvn), *vc = malloc(kn_kv_elem_bytes(KN_KV_F16) * kvn);
    kn_kv_store(KN_KV_F16, kc, kf, (int)kvn);
    kn_kv_store(KN_KV_F16, vc, vf, (int)kvn);
    size_t qn = (size_t)chunk * nh * hd;
    float *q = malloc(sizeof(float) * qn), *y1 = malloc(sizeof(float) * qn), *y2 = malloc(sizeof(float) * qn);
    for (size_t i = 0; i < qn; i++) q[i] = frand() * 2;
    kn_pool *pool;
    if (kn_pool_create(threads, &pool)) return 1;
    float *scratch = malloc(sizeof(float) * kn_attention_scratch(len) * (size_t)threads);
    kn_attn_seq whole = {chunk, pos, 0, table}, *single = malloc(sizeof(kn_attn_seq) * (size_t)chunk);
    for (int t = 0; t < chunk; t++) single[t] = (kn_attn_seq){1, pos + t, t, table};
    kn_attn_args a = {1, &whole, nh, nkv, hd, KN_KV_F16, shift, len, q, y1, kc, vc, (size_t)bs * row * 2,
                      scratch, 0, NULL};
    kn_attn_args b = a;
    b.n_seq = chunk;
    b.seq = single;
    b.out = y2;
    double flops = 4.0 * hd * nh * ((double)chunk * pos + (double)chunk * (chunk + 1) / 2);
    printf("attention, %d query heads / %d KV heads x %d, f16 KV, a %d-token chunk at position %d, %d thread(s)\n",
           nh, nkv, hd, chunk, pos, threads);
    char list[256];
    snprintf(list, sizeof list, "%s", isas);
    for (char *sv = NULL, *isa = strtok_r(list, ",", &sv); isa; isa = strtok_r(NULL, ",", &sv)) {
        if (kn_set_isa(isa)) {
            printf("%-8s not on this machine\n", isa);
            continue;
        }
        double *tt = malloc(sizeof(double) * (size_t)reps), *ts = malloc(sizeof(double) * (size_t)reps);
        for (int r = 0; r < reps; r++) {
            double t0 = bn_now();
            kn_attention(pool, &a);
            double t1 = bn_now();
            kn_attention(pool, &b);
            tt[r] = t1 - t0;
            ts[r] = bn_now() - t1;
        }
        double mt = bn_median(tt, reps), ms = bn_median(ts, reps);
        printf("%-8s tiled %8.1f ms %6.1f GFLOP/s | token %8.1f ms %6.1f GFLOP/s | tiled %.2fx faster, outputs %s\n",
               isa, mt * 1e3, flops / mt * 1e-9, ms * 1e3, flops / ms * 1e-9, ms / mt,
               memcmp(y1, y2, sizeof(float) * qn) ? "DIFFER" : "identical");
        free(tt);
        free(ts);
    }
    kn_pool_destroy(pool);
    free(table); free(kf); free(vf); free(kc); free(vc); free(q); free(y1); free(y2); free(scratch); free(single);
    return 0;
}
