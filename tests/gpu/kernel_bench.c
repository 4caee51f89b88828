/* llmserve-cuda-kernel-bench: what the CUDA kernels reach on the real
 * shapes, before the CUDA forward pass exists. Weights are random BF16 made
 * on the device (--load-format dummy's idea), all layers allocated so no
 * cache can hold them.
 *
 *   llmserve-cuda-kernel-bench [--preset llama-3-8b] [--batches 1,64,256] [--ctx 1152] [--hbm-tbps 4.8]
 *                              [--tflops 989]
 *
 * Prints one row per batch: the time of a decode step's GEMMs (every layer's
 * q, k, v, o, gate, up, down and the LM head, cuBLAS BF16) and paged
 * attention over the batch's KV (f16 cache, blocks of 16, split-K as
 * planned), each beside its analytic bound and the fraction of it reached:
 * the GEMMs move the weights once (bytes / HBM) and do 2 x params x batch
 * FLOPs (/ the dense BF16 peak, --tflops: H100/H200 SXM 989), the bound the
 * larger of the two; attention reads every K and V of the batch once
 * (batch x ctx x 2 x kv width x 2 bytes a layer / HBM). Then the tokens/s
 * upper bound of GEMMs + attention; last, attention with the per-head kernel
 * pinned (the grouped one is what AUTO picks for GQA shapes). Then
 * kn_cuda_matmul over the same layers in Q4_0, Q8_0, Q4_K and Q6_K: the
 * fused GEMV at batches 1, 8 and 15 (one pass reads the weights once;
 * 15 rows take two), the tensor-core tiles from 16 rows, each against the
 * larger of bytes / HBM and 2 x weights x batch / peak; from 16 rows also
 * the engine's other way, the matrix dequantized to F16 and cuBLAS, so the
 * first run shows where the engine should switch (DEQ_MIN_ROWS in
 * wk_cuda.c); below 16, the per-element kernel the GEMV replaced. Median
 * of 5 after a warm-up. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_model.h"
#include "kernels.h"
#include "kn_cuda.h"
#include "kn_cuda_plan.h"

#include "../bench/bn_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) {                                                                                 \
            fprintf(stderr, "kernel bench: %s failed: %s\n", #call, cm_strerror(rc_));              \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* kn_cuda_matmul over every layer's seven matrices in each type, beside its bound; from 16 rows also
 * dequantization to F16 + cuBLAS on the same matrices. */
static int quant_gemv(const cm_model_config *c, int64_t shapes[7][2], double hbm, double peak, kn_cuda_blas *blas) {
    static const int types[] = {CM_Q4_0, CM_Q8_0, CM_Q4_K, CM_Q6_K}, batches[] = {1, 8, 15, 16, 64, 256};
    enum { NBATCH = sizeof batches / sizeof batches[0], MAXB = 256 };
    int L = (int)c->n_layer;
    int64_t maxk = 0, maxn = 0;
    for (int j = 0; j < 7; j++) {
        if (shapes[j][1] > maxk) maxk = shapes[j][1];
        if (shapes[j][0] > maxn) maxn = shapes[j][0];
    }
    void **w = calloc((size_t)L * 7, sizeof *w), *deq;
    float *x, *y;
    if (!w) return 1;
    TRY(kn_cuda_malloc((void **)&x, sizeof(float) * MAXB * (size_t)maxk));
    TRY(kn_cuda_malloc((void **)&y, sizeof(float) * MAXB * (size_t)maxn));
    TRY(kn_cuda_malloc(&deq, (size_t)maxn * (size_t)maxk * 2));
    TRY(kn_cuda_fill_random(x, CM_F16, MAXB * (size_t)maxk * 2, 5, 0.5f));
    printf("\nquantized weights (kn_cuda_matmul: GEMV below 16 rows, tensor-core tiles from 16), the %d layers' GEMMs\n"
           "%6s %6s %8s %10s %10s %8s %14s\n", L, "type", "batch", "GB", "GEMMs ms", "bound ms", "of bound",
           "before ms");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        double bytes = 0;
        for (int l = 0; l < L; l++)
            for (int j = 0; j < 7; j++) {
                size_t rb = cm_dtype_row_bytes(types[t], (uint64_t)shapes[j][1]), sz = rb * (size_t)shapes[j][0];
                TRY(kn_cuda_malloc(&w[l * 7 + j], sz));
                /* Q4_0 and Q8_0 as the dummy loader makes them; the K-quants' bytes random (only time matters) */
                if (types[t] == CM_Q4_0 || types[t] == CM_Q8_0)
                    TRY(kn_cuda_fill_random(w[l * 7 + j], types[t], (size_t)(shapes[j][0] * shapes[j][1]),
                                            (unsigned long long)(l * 7 + j), 0.02f));
                else TRY(kn_cuda_fill_random(w[l * 7 + j], CM_F16, sz / 2, (unsigned long long)(l * 7 + j), 0.02f));
                bytes += (double)sz;
            }
        double params = 0;
        for (int j = 0; j < 7; j++) params += (double)shapes[j][0] * (double)shapes[j][1] * L;
        for (int bi = 0; bi < NBATCH; bi++) {
            int B = batches[bi];
            double tq[6], td[6] = {0}; /* td: deq + cuBLAS from 16 rows, the per-element kernel below */
            for (int rep = 0; rep < 6; rep++) { /* rep 0 warms up */
                double t0 = bn_now();
                for (int l = 0; l < L; l++)
                    for (int j = 0; j < 7; j++)
                        TRY(kn_cuda_matmul(types[t], w[l * 7 + j], shapes[j][0], shapes[j][1], x, y, B));
                TRY(kn_cuda_sync());
                double t1 = bn_now();
                for (int l = 0; l < L; l++)
                    for (int j = 0; j < 7; j++) {
                        if (B < 16) {
                            TRY(kn_cuda_matmul_as(KN_MATMUL_PER_ELEMENT, types[t], w[l * 7 + j], shapes[j][0],
                                                  shapes[j][1], x, y, B));
                            continue;
                        }
                        TRY(kn_cuda_dequant_f16(types[t], w[l * 7 + j], shapes[j][0], shapes[j][1], deq));
                        TRY(kn_cuda_gemm(blas, CM_F16, deq, shapes[j][0], shapes[j][1], x, y, B));
                    }
                TRY(kn_cuda_sync());
                tq[rep] = t1 - t0;
                td[rep] = bn_now() - t1;
            }
            qsort(tq + 1, 5, sizeof(double), bn_cmp_d);
            qsort(td + 1, 5, sizeof(double), bn_cmp_d);
            double mem = bytes / hbm, flop = 2.0 * params * B / peak, bound = mem > flop ? mem : flop;
            printf("%6s %6d %8.2f %10.3f %10.3f %7.1f%% %14.3f (%s)\n", cm_dtype_name(types[t]), B, bytes / 1e9,
                   tq[3] * 1e3, bound * 1e3, bound / tq[3] * 100, td[3] * 1e3, B < 16 ? "per-element" : "deq+cuBLAS");
        }
        for (int i = 0; i < L * 7; i++) {
            kn_cuda_free(w[i]);
            w[i] = NULL;
        }
    }
    kn_cuda_free(x);
    kn_cuda_free(y);
    kn_cuda_free(deq);
    free(w);
    return 0;
}

int main(int argc, char **argv) {
    const char *preset = "llama-3-8b", *batches = "1,64,256";
    int ctx = 1152;
    double hbm = 4.8e12, peak = 989e12;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
        else if (!strcmp(argv[i], "--batches")) batches = argv[i + 1];
        else if (!strcmp(argv[i], "--ctx")) ctx = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hbm-tbps")) hbm = atof(argv[i + 1]) * 1e12;
        else if (!strcmp(argv[i], "--tflops")) peak = atof(argv[i + 1]) * 1e12;
        else {
            fprintf(stderr, "usage: %s [--preset NAME] [--batches 1,64,256] [--ctx N] [--hbm-tbps F] [--tflops F]\n", argv[0]);
            return 2;
        }
    }
    int ndev = 0;
    kn_cuda_device_count(&ndev);
    if (!ndev) {
        printf("kernel bench: no CUDA device; skipped\n");
        return 77;
    }
    cm_model_config c;
    if (cm_model_preset(preset, &c) || ctx < 1 || ctx > 1 << 20) {
        fprintf(stderr, "kernel bench: unknown preset '%s' or bad --ctx\n", preset);
        return 2;
    }
    int64_t D = c.dim, QD = (int64_t)c.n_head * c.head_dim, KVD = (int64_t)c.n_kv_head * c.head_dim, H = c.hidden;
    int64_t shapes[7][2] = {{QD, D}, {KVD, D}, {KVD, D}, {D, QD}, {H, D}, {H, D}, {D, H}}; /* [n][k] */
    int L = (int)c.n_layer;
    void **w = calloc((size_t)L * 7 + 1, sizeof *w);
    double bytes = 0;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < 7; j++) {
            size_t n = (size_t)(shapes[j][0] * shapes[j][1]);
            TRY(kn_cuda_malloc(&w[l * 7 + j], n * 2));
            TRY(kn_cuda_fill_random(w[l * 7 + j], CM_BF16, n, (unsigned long long)(l * 7 + j), 0.02f));
            bytes += (double)n * 2;
        }
    TRY(kn_cuda_malloc(&w[L * 7], (size_t)c.vocab * (size_t)D * 2));
    TRY(kn_cuda_fill_random(w[L * 7], CM_BF16, (size_t)c.vocab * (size_t)D, 999, 0.02f));
    bytes += (double)c.vocab * (double)D * 2;
    kn_cuda_blas *blas;
    TRY(kn_cuda_blas_create(&blas));
    int n_sm;
    TRY(kn_cuda_sm_count(&n_sm));
    printf("%s BF16 dummy weights: %.2f GB of GEMM weights, %d SMs, HBM bound %.2f TB/s -> %.2f ms a step at B=1\n",
           preset, bytes / 1e9, n_sm, hbm / 1e12, bytes / hbm * 1e3);
    if (!(hbm > 0) || !(peak > 0)) {
        fprintf(stderr, "kernel bench: --hbm-tbps and --tflops must be positive\n");
        return 2;
    }
    printf("%6s %10s %10s %8s %10s %10s %8s %12s %12s\n", "batch", "GEMMs ms", "bound ms", "of bound", "attn ms",
           "bound ms", "of bound", "tok/s bound", "per-head ms");
    for (const char *p = batches; *p;) {
        int B = atoi(p);
        if (B < 1 || B > 4096) break;
        float *x, *y;
        int64_t maxk = H > QD ? H : QD, maxn = c.vocab > H ? c.vocab : H;
        TRY(kn_cuda_malloc((void **)&x, sizeof(float) * (size_t)B * (size_t)maxk));
        TRY(kn_cuda_malloc((void **)&y, sizeof(float) * (size_t)B * (size_t)maxn));
        TRY(kn_cuda_fill_random(x, CM_F16, (size_t)B * (size_t)maxk * 2, 5, 0.5f)); /* any bits: only time matters */
        /* the batch's KV: B sequences of ctx positions, f16, blocks of 16 */
        int bs = 16, nb_seq = (ctx + bs - 1) / bs, nblk = B * nb_seq;
        size_t stride = (size_t)bs * (size_t)KVD * 2;
        void *kc, *vc;
        float *q, *out, *ws;
        int32_t *row_seq, *row_pos, *seq_off, *blocks;
        kn_cuda_attn_geom g, gp;
        kn_cuda_attn_args shape = {B, (int)c.n_head, (int)c.n_kv_head, (int)c.head_dim, KN_KV_F16, 4, ctx, n_sm,
                                   NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, 0, KN_ATTN_PER_HEAD};
        TRY(kn_cuda_attn_geometry(&shape, &gp));
        shape.variant = KN_ATTN_AUTO;
        TRY(kn_cuda_attn_geometry(&shape, &g));
        if (gp.workspace_bytes > g.workspace_bytes) g.workspace_bytes = gp.workspace_bytes; /* one workspace, both */
        TRY(kn_cuda_malloc(&kc, stride * (size_t)nblk));
        TRY(kn_cuda_malloc(&vc, stride * (size_t)nblk));
        TRY(kn_cuda_fill_random(kc, CM_F16, stride * (size_t)nblk / 2, 11, 1.f));
        TRY(kn_cuda_fill_random(vc, CM_F16, stride * (size_t)nblk / 2, 12, 1.f));
        TRY(kn_cuda_malloc((void **)&q, sizeof(float) * (size_t)B * (size_t)QD));
        TRY(kn_cuda_malloc((void **)&out, sizeof(float) * (size_t)B * (size_t)QD));
        TRY(kn_cuda_malloc((void **)&ws, g.workspace_bytes + 4));
        TRY(kn_cuda_fill_random(q, CM_F16, (size_t)B * (size_t)QD * 2, 13, 0.5f));
        int32_t *h_rs = malloc(sizeof(int32_t) * (size_t)B), *h_rp = malloc(sizeof(int32_t) * (size_t)B),
                *h_so = malloc(sizeof(int32_t) * (size_t)B), *h_bl = malloc(sizeof(int32_t) * (size_t)nblk);
        for (int s = 0; s < B; s++) {
            h_rs[s] = s;
            h_rp[s] = ctx - 1;
            h_so[s] = s * nb_seq;
        }
        for (int i = 0; i < nblk; i++) h_bl[i] = (int32_t)(((int64_t)i * 7919) % nblk); /* scattered blocks */
        TRY(kn_cuda_malloc((void **)&row_seq, sizeof(int32_t) * (size_t)B));
        TRY(kn_cuda_malloc((void **)&row_pos, sizeof(int32_t) * (size_t)B));
        TRY(kn_cuda_malloc((void **)&seq_off, sizeof(int32_t) * (size_t)B));
        TRY(kn_cuda_malloc((void **)&blocks, sizeof(int32_t) * (size_t)nblk));
        TRY(kn_cuda_upload(row_seq, h_rs, sizeof(int32_t) * (size_t)B));
        TRY(kn_cuda_upload(row_pos, h_rp, sizeof(int32_t) * (size_t)B));
        TRY(kn_cuda_upload(seq_off, h_so, sizeof(int32_t) * (size_t)B));
        TRY(kn_cuda_upload(blocks, h_bl, sizeof(int32_t) * (size_t)nblk));
        kn_cuda_attn_args aa = {B, (int)c.n_head, (int)c.n_kv_head, (int)c.head_dim, KN_KV_F16, 4, ctx, n_sm,
                                q, out, kc, vc, stride, row_seq, row_pos, seq_off, blocks, ws, g.workspace_bytes,
                                KN_ATTN_AUTO};
        kn_cuda_attn_args ap = aa;
        ap.variant = KN_ATTN_PER_HEAD;
        double tg[6], ta[6], tp[6];
        for (int rep = 0; rep < 6; rep++) { /* rep 0 warms up */
            double t0 = bn_now();
            for (int l = 0; l < L; l++)
                for (int j = 0; j < 7; j++) TRY(kn_cuda_gemm(blas, CM_BF16, w[l * 7 + j], shapes[j][0], shapes[j][1], x, y, B));
            TRY(kn_cuda_gemm(blas, CM_BF16, w[L * 7], c.vocab, D, x, y, B));
            TRY(kn_cuda_sync());
            double t1 = bn_now();
            for (int l = 0; l < L; l++) TRY(kn_cuda_paged_attention(&aa));
            TRY(kn_cuda_sync());
            double t2 = bn_now();
            for (int l = 0; l < L; l++) TRY(kn_cuda_paged_attention(&ap));
            TRY(kn_cuda_sync());
            tg[rep] = t1 - t0;
            ta[rep] = t2 - t1;
            tp[rep] = bn_now() - t2;
        }
        qsort(tg + 1, 5, sizeof(double), bn_cmp_d);
        qsort(ta + 1, 5, sizeof(double), bn_cmp_d);
        qsort(tp + 1, 5, sizeof(double), bn_cmp_d);
        double g_ms = tg[3] * 1e3, a_ms = ta[3] * 1e3;
        double g_mem = bytes / hbm, g_flop = 2.0 * (bytes / 2) * B / peak, g_bound = g_mem > g_flop ? g_mem : g_flop;
        double a_bound = (double)L * B * ctx * 2.0 * (double)KVD * 2.0 / hbm;
        printf("%6d %10.3f %10.3f %7.1f%% %10.3f %10.3f %7.1f%% %12.0f %12.3f\n", B, g_ms, g_bound * 1e3,
               g_bound / tg[3] * 100, a_ms, a_bound * 1e3, a_bound / ta[3] * 100, B / (tg[3] + ta[3]), tp[3] * 1e3);
        kn_cuda_free(x); kn_cuda_free(y); kn_cuda_free(kc); kn_cuda_free(vc); kn_cuda_free(q); kn_cuda_free(out);
        kn_cuda_free(ws); kn_cuda_free(row_seq); kn_cuda_free(row_pos); kn_cuda_free(seq_off); kn_cuda_free(blocks);
        free(h_rs); free(h_rp); free(h_so); free(h_bl);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    for (int i = 0; i <= L * 7; i++) kn_cuda_free(w[i]);
    free(w);
    int rc = quant_gemv(&c, shapes, hbm, peak, blas);
    kn_cuda_blas_destroy(blas);
    return rc;
}
