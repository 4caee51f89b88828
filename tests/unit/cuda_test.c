/* CUDA kernels against their CPU references on random data. Without a GPU
 * (as on the development machines and in CI) it says so and skips (77). */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_quant.h"
#include "cm_rope.h"
#include "kernels.h"
#include "kn_cuda.h"
#include "kn_cuda_plan.h"
#include "tst.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float frand(void) { return (float)rand() / (float)RAND_MAX * 2.f - 1.f; }

/* Paged attention: K/V written by the GPU into a NaN-poisoned pool through
 * shuffled block tables must equal the CPU's store bit for bit, and the
 * attention over them (decodes, a prefill chunk over a cached prefix, a long
 * context that splits, partial last blocks) must match kn_attention. Each
 * case is a head_dim, a GQA ratio and a block size; T[s] query rows of
 * sequence s sit after P0[s] cached positions. */
typedef struct {
    int hd, nh, nkv, shift, nseq;
    int T[4], P0[4];
    double tol;
} attn_case;

static void attention(int kv_type, const attn_case *ac) {
    const int HD = ac->hd, NH = ac->nh, NKV = ac->nkv, SHIFT = ac->shift, BS = 1 << SHIFT, NSEQ = ac->nseq;
    const int *T = ac->T, *P0 = ac->P0;
    const int W = NKV * HD;
    int NBLK = 8; /* a few blocks no sequence uses: they stay NaN */
    for (int s = 0; s < NSEQ; s++) NBLK += (P0[s] + T[s] + BS - 1) / BS;
    size_t es = kn_kv_elem_bytes(kv_type), stride = (size_t)BS * W * es, bytes = stride * NBLK;
    char *kc = malloc(bytes), *vc = malloc(bytes), *kg = malloc(bytes), *vg = malloc(bytes);
    float nanv = NAN;
    for (size_t i = 0; i < bytes / es; i++) { /* poison: every slot not written stays NaN */
        if (es == 4) memcpy(kc + i * 4, &nanv, 4);
        else if (es == 2) { uint16_t hn = kv_type == KN_KV_BF16 ? 0x7fc0 : 0x7e00; memcpy(kc + i * 2, &hn, 2); }
        else kc[i] = 0x7f; /* E4M3 NaN */
    }
    memcpy(vc, kc, bytes);
    int *perm = malloc(sizeof(int) * (size_t)NBLK);
    for (int i = 0; i < NBLK; i++) perm[i] = i;
    for (int i = NBLK - 1; i > 0; i--) { int j = rand() % (i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)NBLK), seq_off[4];
    int nb = 0, rows = 0, total = 0, max_len = 0;
    for (int s = 0; s < NSEQ; s++) {
        int len = P0[s] + T[s];
        seq_off[s] = nb;
        for (int b = 0; b < (len + BS - 1) / BS; b++, nb++) blocks[nb] = perm[nb];
        rows += T[s];
        total += len;
        if (len > max_len) max_len = len;
    }
    /* every position's K/V row, with its slot */
    float *k = malloc(sizeof(float) * (size_t)total * W), *v = malloc(sizeof(float) * (size_t)total * W);
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)total);
    int p = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int j = 0; j < P0[s] + T[s]; j++, p++) {
            slot[p] = blocks[seq_off[s] + (j >> SHIFT)] * BS + (j & (BS - 1));
            for (int i = 0; i < W; i++) { k[(size_t)p * W + i] = frand(); v[(size_t)p * W + i] = frand(); }
            size_t off = (size_t)(slot[p] >> SHIFT) * stride + (size_t)(slot[p] & (BS - 1)) * W * es;
            kn_kv_store(kv_type, kc + off, k + (size_t)p * W, W);
            kn_kv_store(kv_type, vc + off, v + (size_t)p * W, W);
        }
    void *dk, *dv;
    float *dkr, *dvr;
    int32_t *dslot;
    kn_cuda_malloc(&dk, bytes);
    kn_cuda_malloc(&dv, bytes);
    kn_cuda_malloc((void **)&dkr, sizeof(float) * (size_t)total * W);
    kn_cuda_malloc((void **)&dvr, sizeof(float) * (size_t)total * W);
    kn_cuda_malloc((void **)&dslot, sizeof(int32_t) * (size_t)total);
    /* the device pool starts all NaN too */
    for (size_t i = 0; i < bytes / es; i++) {
        if (es == 4) memcpy(kg + i * 4, &nanv, 4);
        else if (es == 2) { uint16_t hn = kv_type == KN_KV_BF16 ? 0x7fc0 : 0x7e00; memcpy(kg + i * 2, &hn, 2); }
        else kg[i] = 0x7f;
    }
    kn_cuda_upload(dk, kg, bytes);
    kn_cuda_upload(dv, kg, bytes);
    kn_cuda_upload(dkr, k, sizeof(float) * (size_t)total * W);
    kn_cuda_upload(dvr, v, sizeof(float) * (size_t)total * W);
    kn_cuda_upload(dslot, slot, sizeof(int32_t) * (size_t)total);
    CHECK_RC(kn_cuda_kv_store(kv_type, dk, dv, stride, dkr, dvr, dslot, total, W, SHIFT), 0);
    kn_cuda_download(kg, dk, bytes);
    kn_cuda_download(vg, dv, bytes);
    CHECK(memcmp(kg, kc, bytes) == 0 && memcmp(vg, vc, bytes) == 0);
    /* queries: the last T positions of each sequence */
    float *q = malloc(sizeof(float) * (size_t)rows * NH * HD), *ref = malloc(sizeof(float) * (size_t)rows * NH * HD),
          *got = malloc(sizeof(float) * (size_t)rows * NH * HD);
    for (int i = 0; i < rows * NH * HD; i++) q[i] = frand();
    kn_attn_seq seqs[4];
    int32_t *row_seq = malloc(sizeof(int32_t) * (size_t)rows), *row_pos = malloc(sizeof(int32_t) * (size_t)rows);
    int r = 0;
    for (int s = 0; s < NSEQ; s++) {
        seqs[s] = (kn_attn_seq){T[s], P0[s], r, blocks + seq_off[s]};
        for (int t = 0; t < T[s]; t++, r++) { row_seq[r] = s; row_pos[r] = P0[s] + t; }
    }
    kn_pool *pool;
    kn_pool_create(1, &pool);
    float *scratch = malloc(sizeof(float) * kn_attention_scratch(max_len));
    kn_attn_args ca = {NSEQ, seqs, NH, NKV, HD, kv_type, SHIFT, max_len, q, ref, kc, vc, stride, scratch, 0, NULL};
    kn_attention(pool, &ca);
    int n_sm = 0;
    CHECK_RC(kn_cuda_sm_count(&n_sm), 0);
    /* each kernel pinned (the per-head one, the grouped one where it has an instantiation), as planned for
     * this GPU, then as if it had 100000 SMs (the most splits this length allows) */
    for (int run = 0; run < 4; run++) {
        int force_rows = run & 1, variant = run < 2 ? KN_ATTN_PER_HEAD : KN_ATTN_GROUPED;
        float *dq, *dout, *dws = NULL;
        int32_t *drs, *drp, *dso, *dbl;
        kn_cuda_malloc((void **)&dq, sizeof(float) * (size_t)rows * NH * HD);
        kn_cuda_malloc((void **)&dout, sizeof(float) * (size_t)rows * NH * HD);
        kn_cuda_malloc((void **)&drs, sizeof(int32_t) * (size_t)rows);
        kn_cuda_malloc((void **)&drp, sizeof(int32_t) * (size_t)rows);
        kn_cuda_malloc((void **)&dso, sizeof seq_off);
        kn_cuda_malloc((void **)&dbl, sizeof(int32_t) * (size_t)NBLK);
        size_t wsb = (size_t)rows * NH * KN_CUDA_ATTN_MAX_SPLITS * (HD + 2) * sizeof(float);
        kn_cuda_malloc((void **)&dws, wsb);
        kn_cuda_upload(dq, q, sizeof(float) * (size_t)rows * NH * HD);
        for (int i = 0; i < rows * NH * HD; i++) got[i] = NAN; /* an output the kernel skips stays NaN */
        kn_cuda_upload(dout, got, sizeof(float) * (size_t)rows * NH * HD);
        kn_cuda_upload(drs, row_seq, sizeof(int32_t) * (size_t)rows);
        kn_cuda_upload(drp, row_pos, sizeof(int32_t) * (size_t)rows);
        kn_cuda_upload(dso, seq_off, sizeof seq_off);
        kn_cuda_upload(dbl, blocks, sizeof(int32_t) * (size_t)NBLK);
        kn_cuda_attn_args ga = {rows, NH, NKV, HD, kv_type, SHIFT, max_len, force_rows ? 100000 : n_sm,
                                dq, dout, dk, dv, stride, drs, drp, dso, dbl, dws, wsb, variant};
        int arc = kn_cuda_paged_attention(&ga);
        if (arc == LLM_EUNSUP && variant == KN_ATTN_GROUPED) {
            if (!force_rows) printf("cuda paged attention, head_dim %d, GQA %d: no grouped kernel (the per-head one runs)\n", HD, NH / NKV);
            kn_cuda_free(dq); kn_cuda_free(dout); kn_cuda_free(drs); kn_cuda_free(drp);
            kn_cuda_free(dso); kn_cuda_free(dbl); kn_cuda_free(dws);
            continue;
        }
        CHECK_RC(arc, 0);
        CHECK_RC(kn_cuda_sync(), 0);
        kn_cuda_download(got, dout, sizeof(float) * (size_t)rows * NH * HD);
        double e = tst_rel_l2(got, ref, (size_t)rows * NH * HD);
        kn_cuda_attn_geom geo;
        CHECK_RC(kn_cuda_attn_geometry(&ga, &geo), 0);
        printf("cuda paged attention %s kv %s, head_dim %d, GQA %d, block %d, context %d, %s (%d splits): rel %.2e\n",
               variant == KN_ATTN_GROUPED ? "grouped" : "per-head",
               kv_type == KN_KV_F16 ? "f16" : kv_type == KN_KV_FP8 ? "fp8" : kv_type == KN_KV_BF16 ? "bf16" : "f32",
               HD, NH / NKV, BS, max_len, force_rows ? "more splits" : "as planned", geo.splits, e);
        CHECK(e < ac->tol);
        kn_cuda_free(dq); kn_cuda_free(dout); kn_cuda_free(drs); kn_cuda_free(drp);
        kn_cuda_free(dso); kn_cuda_free(dbl); kn_cuda_free(dws);
    }
    kn_pool_destroy(pool);
    kn_cuda_free(dk); kn_cuda_free(dv); kn_cuda_free(dkr); kn_cuda_free(dvr); kn_cuda_free(dslot);
    free(kc); free(vc); free(kg); free(vg); free(k); free(v); free(slot); free(q); free(ref); free(got); free(scratch);
    free(perm); free(blocks); free(row_seq); free(row_pos);
}

/* cuBLAS GEMM (F16, BF16), dequantization to F16 and the embedding gather. */
static void dense(void) {
    int64_t N = 300, K = 512;
    int B = 5;
    kn_cuda_blas *blas;
    CHECK_RC(kn_cuda_blas_create(&blas), 0);
    float *x = malloc(sizeof(float) * (size_t)(B * K)), *yr = malloc(sizeof(float) * (size_t)(B * N)),
          *yg = malloc(sizeof(float) * (size_t)(B * N));
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(N * K));
    for (int i = 0; i < B * K; i++) x[i] = frand();
    int types[2] = {CM_F16, CM_BF16};
    for (int t = 0; t < 2; t++) {
        for (int64_t i = 0; i < N * K; i++) w[i] = types[t] == CM_F16 ? cm_f32_to_f16(frand()) : cm_f32_to_bf16(frand());
        kn_weight wt = {types[t], N, K, w, 0, NULL, NULL};
        kn_ref_matmul(&wt, yr, x, B);
        void *dw;
        float *dx, *dy;
        kn_cuda_malloc(&dw, sizeof(uint16_t) * (size_t)(N * K));
        kn_cuda_malloc((void **)&dx, sizeof(float) * (size_t)(B * K));
        kn_cuda_malloc((void **)&dy, sizeof(float) * (size_t)(B * N));
        kn_cuda_upload(dw, w, sizeof(uint16_t) * (size_t)(N * K));
        kn_cuda_upload(dx, x, sizeof(float) * (size_t)(B * K));
        CHECK_RC(kn_cuda_gemm(blas, types[t], dw, N, K, dx, dy, B), 0);
        kn_cuda_download(yg, dy, sizeof(float) * (size_t)(B * N));
        double e = tst_rel_l2(yg, yr, (size_t)(B * N));
        printf("cuda cuBLAS gemm %s: rel %.2e\n", cm_dtype_name(types[t]), e);
        CHECK(e < (types[t] == CM_F16 ? 2e-3 : 1e-2)); /* x rounded to the weight type */
        /* x rounded once and multiplied twice (q, k, v share it so): the same bits as the whole GEMM */
        float *yh = malloc(sizeof(float) * (size_t)(B * N));
        CHECK_RC(kn_cuda_gemm_input(blas, types[t], dx, B, K), 0);
        for (int twice = 0; twice < 2; twice++) {
            CHECK_RC(kn_cuda_gemm_from_input(blas, types[t], dw, N, K, dy, B), 0);
            kn_cuda_download(yh, dy, sizeof(float) * (size_t)(B * N));
            CHECK(memcmp(yh, yg, sizeof(float) * (size_t)(B * N)) == 0);
        }
        CHECK_RC(kn_cuda_gemm_from_input(blas, types[t], dw, N, K + 16, dy, B), LLM_EINVAL); /* not what it holds */
        free(yh);
        kn_cuda_free(dw); kn_cuda_free(dx); kn_cuda_free(dy);
    }
    /* Q4_1 rows -> f16, and the embedding of a few ids */
    size_t rb = cm_dtype_row_bytes(CM_Q4_1, (uint64_t)K), bytes = rb * (size_t)N;
    uint8_t *raw = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) raw[i] = (uint8_t)rand();
    for (size_t i = 0; i < bytes / 20; i++) {
        uint16_t d = cm_f32_to_f16(0.01f), m = cm_f32_to_f16(-0.05f);
        memcpy(raw + i * 20, &d, 2);
        memcpy(raw + i * 20 + 2, &m, 2);
    }
    void *dw, *dh;
    float *de;
    int32_t ids[4] = {0, 299, 17, 17}, *dids;
    kn_cuda_malloc(&dw, bytes);
    kn_cuda_malloc(&dh, sizeof(uint16_t) * (size_t)(N * K));
    kn_cuda_malloc((void **)&de, sizeof(float) * 4 * (size_t)K);
    kn_cuda_malloc((void **)&dids, sizeof ids);
    kn_cuda_upload(dw, raw, bytes);
    kn_cuda_upload(dids, ids, sizeof ids);
    CHECK_RC(kn_cuda_dequant_f16(CM_Q4_1, dw, N, K, dh), 0);
    kn_cuda_download(w, dh, sizeof(uint16_t) * (size_t)(N * K));
    int bad = 0;
    for (int64_t r = 0; r < N; r++)
        for (int64_t i = 0; i < K; i++) bad += w[r * K + i] != cm_f32_to_f16(kn_ref_dequant(CM_Q4_1, raw + r * rb, i));
    CHECK_RC(bad, 0);
    CHECK_RC(kn_cuda_embed(CM_Q4_1, dw, N, K, dids, 4, de), 0);
    kn_cuda_download(yg, de, sizeof(float) * 4 * (size_t)K);
    kn_weight wq = {CM_Q4_1, N, K, raw, 0, NULL, NULL};
    for (int r = 0; r < 4; r++) {
        kn_get_row(&wq, ids[r], yr);
        CHECK(tst_rel_l2(yg + (size_t)r * K, yr, (size_t)K) < 1e-6);
    }
    kn_cuda_free(dw); kn_cuda_free(dh); kn_cuda_free(de); kn_cuda_free(dids);
    kn_cuda_blas_destroy(blas);
    free(raw); free(x); free(yr); free(yg); free(w);
}

/* FP8 GEMM (cuBLASLt): against the same quantization done on the CPU with
 * kn_ref_f32_to_e4m3 (tight), and against the unquantized product (loose). */
static void fp8(void) {
    int64_t N = 256, K = 512;
    int B = 6;
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(N * K));
    float *wf = malloc(sizeof(float) * (size_t)(N * K)), *x = malloc(sizeof(float) * (size_t)(B * K));
    float *yq = malloc(sizeof(float) * (size_t)(B * N)), *yf = malloc(sizeof(float) * (size_t)(B * N)),
          *yg = malloc(sizeof(float) * (size_t)(B * N));
    for (int64_t i = 0; i < N * K; i++) {
        w[i] = cm_f32_to_f16(frand() * (1 + (float)(i / K % 7))); /* rows of different ranges */
        wf[i] = cm_f16_to_f32(w[i]);
    }
    for (int i = 0; i < B * K; i++) x[i] = frand() * 3;
    kn_cuda_fp8 *f8;
    if (kn_cuda_fp8_create(&f8)) {
        printf("cuda fp8: cannot create cuBLASLt; FAILED\n");
        CHECK(0);
        return;
    }
    void *dw;
    uint8_t *dq;
    float *ds, *dx, *dy;
    kn_cuda_malloc(&dw, sizeof(uint16_t) * (size_t)(N * K));
    kn_cuda_malloc((void **)&dq, (size_t)(N * K));
    kn_cuda_malloc((void **)&ds, sizeof(float) * (size_t)N);
    kn_cuda_malloc((void **)&dx, sizeof(float) * (size_t)(B * K));
    kn_cuda_malloc((void **)&dy, sizeof(float) * (size_t)(B * N));
    kn_cuda_upload(dw, w, sizeof(uint16_t) * (size_t)(N * K));
    kn_cuda_upload(dx, x, sizeof(float) * (size_t)(B * K));
    float xa = 0;
    for (int i = 0; i < B * K; i++) xa = fmaxf(xa, fabsf(x[i]));
    float xs = xa / 448.f;
    for (int per_ch = 0; per_ch < 2; per_ch++) {
        CHECK_RC(kn_cuda_fp8_quantize(f8, CM_F16, dw, N, K, per_ch, dq, ds), 0);
        int rc = kn_cuda_gemm_fp8(f8, dq, ds, N, K, dx, dy, B);
        if (rc == LLM_EUNSUP) {
            int ma = 0, mi = 0;
            CHECK_RC(kn_cuda_compute_capability(&ma, &mi), 0);
            printf("cuda fp8: no FP8 tensor-core kernel on this GPU (sm_%d%d)%s\n", ma, mi,
                   ma * 10 + mi >= 89 ? ": FAILED, sm_89 and later have them" : "; skipped");
            CHECK(ma * 10 + mi < 89); /* Ada and Hopper must run it: unsupported there is a failure */
            break;
        }
        CHECK_RC(rc, 0);
        kn_cuda_download(yg, dy, sizeof(float) * (size_t)(B * N));
        /* the CPU does the same quantization */
        float wt = 0;
        for (int64_t i = 0; i < N * K; i++) wt = fmaxf(wt, fabsf(wf[i]));
        for (int64_t r = 0; r < N; r++) {
            float ra = 0;
            for (int64_t i = 0; i < K; i++) ra = fmaxf(ra, fabsf(wf[r * K + i]));
            float sw = (per_ch ? ra : wt) / 448.f;
            for (int b = 0; b < B; b++) {
                double acc = 0, exact = 0;
                for (int64_t i = 0; i < K; i++) {
                    float qw = kn_ref_e4m3_to_f32(kn_ref_f32_to_e4m3(wf[r * K + i] / sw));
                    float qx = kn_ref_e4m3_to_f32(kn_ref_f32_to_e4m3(x[b * K + i] / xs));
                    acc += (double)qw * qx;
                    exact += (double)wf[r * K + i] * x[b * K + i];
                }
                yq[b * N + r] = (float)(acc * sw * xs);
                yf[b * N + r] = (float)exact;
            }
        }
        double eq = tst_rel_l2(yg, yq, (size_t)(B * N)), ef = tst_rel_l2(yg, yf, (size_t)(B * N));
        printf("cuda fp8 gemm (%s scales): rel %.2e vs the CPU's FP8 arithmetic, %.2e vs unquantized\n",
               per_ch ? "per-channel" : "per-tensor", eq, ef);
        CHECK(eq < 2e-3); /* Hopper accumulates FP8 products with a shorter mantissa than fp32 */
        CHECK(ef < 8e-2);
        /* x quantized once, multiplied twice: the same bits as the whole FP8 GEMM */
        float *yh = malloc(sizeof(float) * (size_t)(B * N));
        CHECK_RC(kn_cuda_fp8_input(f8, dx, B, K), 0);
        for (int twice = 0; twice < 2; twice++) {
            CHECK_RC(kn_cuda_gemm_fp8_from_input(f8, dq, ds, N, K, dy, B), 0);
            kn_cuda_download(yh, dy, sizeof(float) * (size_t)(B * N));
            CHECK(memcmp(yh, yg, sizeof(float) * (size_t)(B * N)) == 0);
        }
        free(yh);
    }
    kn_cuda_free(dw); kn_cuda_free(dq); kn_cuda_free(ds); kn_cuda_free(dx); kn_cuda_free(dy);
    kn_cuda_fp8_destroy(f8);
    free(w); free(wf); free(x); free(yq); free(yf); free(yg);
}

/* Device sampling: greedy is the CPU's argmax; a stochastic draw always
 * lands in the set top-k / top-p / min-p allow; penalties move the choice. */
static int sample_one(float *dl, const float *logits, int vocab, kn_cuda_sample_params *pp, const int32_t *hist,
                      int n_hist) {
    kn_cuda_sample_params *dp;
    int32_t *dh, *dout, out = -1;
    kn_cuda_malloc((void **)&dp, sizeof *pp);
    kn_cuda_malloc((void **)&dh, sizeof(int32_t) * (size_t)(n_hist + 1));
    kn_cuda_malloc((void **)&dout, sizeof(int32_t));
    pp->hist_off = 0;
    pp->hist_len = n_hist;
    kn_cuda_upload(dp, pp, sizeof *pp);
    if (n_hist) kn_cuda_upload(dh, hist, sizeof(int32_t) * (size_t)n_hist);
    kn_cuda_upload(dl, logits, sizeof(float) * (size_t)vocab);
    CHECK_RC(kn_cuda_sample(dl, 1, vocab, dp, dh, dout), 0);
    kn_cuda_download(&out, dout, sizeof out);
    kn_cuda_free(dp); kn_cuda_free(dh); kn_cuda_free(dout);
    return out;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* 64 seeded draws each with top-k 5, top-p 0.5, min-p 0.3 and no filter at temperature 0.7: every draw
 * inside the filter's cut (computed here over the tokens left) and never a masked (-inf) token, and not
 * all the same. Under a mask the filters once read -inf as the row's minimum and kept everything. */
static void stochastic(float *dl, const float *l, int V, int masked) {
    float *sorted = malloc(sizeof(float) * (size_t)V);
    int nf = 0;
    for (int i = 0; i < V; i++)
        if (isfinite(l[i])) sorted[nf++] = l[i];
    qsort(sorted, (size_t)nf, sizeof(float), cmp_desc);
    double z = 0, acc = 0, T = 0.7;
    for (int i = 0; i < nf; i++) z += exp((sorted[i] - sorted[0]) / T);
    float pth = sorted[0];
    for (int i = 0; i < nf && acc < 0.5 * z; i++) { acc += exp((sorted[i] - sorted[0]) / T); pth = sorted[i]; }
    for (int mode = 0; mode < 4; mode++) {
        kn_cuda_sample_params q = {0};
        q.temperature = (float)T;
        q.repetition_penalty = 1.f;
        if (mode == 0) q.top_k = 5;
        if (mode == 1) q.top_p = 0.5f;
        if (mode == 2) q.min_p = 0.3f;
        float cut = mode == 0 ? sorted[4] : mode == 1 ? pth : mode == 2 ? sorted[0] + (float)(T * log(0.3)) : -INFINITY;
        int distinct = 0, prev = -1, ok = 1;
        for (int s = 0; s < 64; s++) {
            q.seed = 1234;
            q.step = s;
            int id = sample_one(dl, l, V, &q, NULL, 0);
            ok &= id >= 0 && id < V && isfinite(l[id]) && l[id] >= cut - 1e-4f;
            distinct += id != prev;
            prev = id;
        }
        printf("cuda sampling%s, mode %d: every draw allowed %s, %d changes over 64 draws\n",
               masked ? " under a mask" : "", mode, ok ? "yes" : "NO", distinct);
        CHECK(ok);
        CHECK(distinct > 1);
    }
    free(sorted);
}

static void sampling(void) {
    int V = 5000;
    float *l = malloc(sizeof(float) * (size_t)V), *dl;
    for (int i = 0; i < V; i++) l[i] = frand() * 6;
    kn_cuda_malloc((void **)&dl, sizeof(float) * (size_t)V);
    int best = 0, second = -1;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    for (int i = 0; i < V; i++)
        if (i != best && (second < 0 || l[i] > l[second])) second = i;
    kn_cuda_sample_params p = {0};
    p.repetition_penalty = 1.f;
    CHECK_RC(sample_one(dl, l, V, &p, NULL, 0), best);
    p.temperature = 1.f;
    p.top_k = 1;
    CHECK_RC(sample_one(dl, l, V, &p, NULL, 0), best);
    /* presence / frequency / repetition penalties on the best token hand the choice to the second */
    p.temperature = 0;
    p.top_k = 0;
    int32_t hist[3] = {best, best, 7};
    p.presence_penalty = 100.f;
    CHECK_RC(sample_one(dl, l, V, &p, hist, 3), second);
    p.presence_penalty = 0;
    p.frequency_penalty = 50.f;
    CHECK_RC(sample_one(dl, l, V, &p, hist, 3), second);
    p.frequency_penalty = 0;
    /* stochastic, then under a grammar's mask (-inf on every even token) */
    stochastic(dl, l, V, 0);
    float *lm = malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < V; i++) lm[i] = i % 2 ? l[i] : -INFINITY;
    stochastic(dl, lm, V, 1);
    free(lm);
    kn_cuda_free(dl);
    free(l);
}

int main(void) {
    int ndev = 0;
    kn_cuda_device_count(&ndev);
    if (ndev == 0) {
        printf("cuda_test: no CUDA device on this machine; skipped\n");
        return TST_SKIP;
    }
    srand(7);
    /* rmsnorm */
    int rows = 5, n = 576;
    float *x = malloc(sizeof(float) * (size_t)(rows * n)), *w = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * (size_t)(rows * n)), *got = malloc(sizeof(float) * (size_t)(rows * n));
    for (int i = 0; i < rows * n; i++) x[i] = frand() * 3;
    for (int i = 0; i < n; i++) w[i] = frand();
    for (int r = 0; r < rows; r++) kn_rmsnorm(ref + r * n, x + r * n, w, n, 1e-5f);
    float *dx, *dw, *dy;
    CHECK_RC(kn_cuda_malloc((void **)&dx, sizeof(float) * (size_t)(rows * n)), 0);
    CHECK_RC(kn_cuda_malloc((void **)&dw, sizeof(float) * (size_t)n), 0);
    CHECK_RC(kn_cuda_malloc((void **)&dy, sizeof(float) * (size_t)(rows * n)), 0);
    kn_cuda_upload(dx, x, sizeof(float) * (size_t)(rows * n));
    kn_cuda_upload(dw, w, sizeof(float) * (size_t)n);
    CHECK_RC(kn_cuda_rmsnorm(dy, dx, dw, rows, n, 1e-5f), 0);
    kn_cuda_download(got, dy, sizeof(float) * (size_t)(rows * n));
    CHECK(tst_rel_l2(got, ref, (size_t)(rows * n)) < 1e-5);
    /* rope, both conventions */
    float inv[32];
    for (int i = 0; i < 32; i++) inv[i] = powf(10000.f, -2.f * (float)i / 64.f);
    for (int type = 0; type < 2; type++) {
        memcpy(ref, x, sizeof(float) * 9 * 64);
        kn_rope(ref, 9, 64, 64, type, 123, inv);
        kn_cuda_upload(dx, x, sizeof(float) * 9 * 64);
        CHECK_RC(kn_cuda_rope(dx, 9, 64, 64, type, 123, 10000.f), 0);
        kn_cuda_download(got, dx, sizeof(float) * 9 * 64);
        CHECK(tst_rel_l2(got, ref, 9 * 64) < 1e-4);
    }
    /* rope over rows with scaled frequency tables (llama3, yarn), then yarn's q scale */
    {
        cm_rope_scaling rs[2] = {{CM_RS_LLAMA3, 8.f, 8192, 1.f, 4.f, 0, 0, 0, 1.f},
                                 {CM_RS_YARN, 4.f, 4096, 0, 0, 32.f, 1.f, 1, 1.2f}};
        int32_t pos[3] = {5, 9000, 30000}, *dpos;
        float finv[32], *dinv;
        CHECK_RC(kn_cuda_malloc((void **)&dpos, sizeof pos), 0);
        CHECK_RC(kn_cuda_malloc((void **)&dinv, sizeof finv), 0);
        kn_cuda_upload(dpos, pos, sizeof pos);
        for (int k = 0; k < 2; k++) {
            cm_rope_inv_freq(&rs[k], 500000.0, 64, NULL, finv);
            kn_cuda_upload(dinv, finv, sizeof finv);
            memcpy(ref, x, sizeof(float) * 3 * 4 * 64);
            for (int r = 0; r < 3; r++) kn_rope(ref + r * 4 * 64, 4, 64, 64, CM_ROPE_NEOX, pos[r], finv);
            for (int i = 0; k == 1 && i < 3 * 4 * 64; i++) ref[i] *= 1.44f;
            kn_cuda_upload(dx, x, sizeof(float) * 3 * 4 * 64);
            CHECK_RC(kn_cuda_rope_rows(dx, 3, 4, 64, 64, CM_ROPE_NEOX, dpos, dinv), 0);
            if (k == 1) CHECK_RC(kn_cuda_scale(dx, 1.44f, 3 * 4 * 64), 0);
            kn_cuda_download(got, dx, sizeof(float) * 3 * 4 * 64);
            CHECK(tst_rel_l2(got, ref, 3 * 4 * 64) < 1e-4);
        }
        kn_cuda_free(dpos);
        kn_cuda_free(dinv);
    }
    /* SwiGLU's silu(a) * b, a bias added to every row, a residual add, and the gather of the rows that
     * want logits, each against the CPU (x holds rows * n = 2880 values: 5 rows of 576) */
    {
        enum { R = 5, C = 576 };
        float *db, *dz;
        int32_t idx[3] = {4, 0, 2}, *didx;
        CHECK_RC(kn_cuda_malloc((void **)&db, sizeof(float) * R * C), 0);
        CHECK_RC(kn_cuda_malloc((void **)&dz, sizeof(float) * R * C), 0);
        CHECK_RC(kn_cuda_malloc((void **)&didx, sizeof idx), 0);
        float *b = malloc(sizeof(float) * R * C);
        for (int i = 0; i < R * C; i++) b[i] = frand() * 2;
        /* silu */
        memcpy(ref, x, sizeof(float) * R * C);
        kn_silu_mul(ref, b, R * C);
        kn_cuda_upload(dx, x, sizeof(float) * R * C);
        kn_cuda_upload(db, b, sizeof(float) * R * C);
        CHECK_RC(kn_cuda_silu_mul(dx, db, R * C), 0);
        kn_cuda_download(got, dx, sizeof(float) * R * C);
        double e = tst_rel_l2(got, ref, R * C);
        printf("cuda silu_mul: rel %.2e\n", e);
        CHECK(e < 1e-5);
        /* bias: b's first row added to each of the rows */
        for (int r = 0; r < R; r++)
            for (int i = 0; i < C; i++) ref[r * C + i] = x[r * C + i] + b[i];
        kn_cuda_upload(dx, x, sizeof(float) * R * C);
        CHECK_RC(kn_cuda_add_bias(dx, db, R, C), 0);
        kn_cuda_download(got, dx, sizeof(float) * R * C);
        CHECK(memcmp(got, ref, sizeof(float) * R * C) == 0);
        /* residual add */
        for (int i = 0; i < R * C; i++) ref[i] = x[i] + b[i];
        kn_cuda_upload(dx, x, sizeof(float) * R * C);
        CHECK_RC(kn_cuda_add(dx, db, (size_t)R * C), 0);
        kn_cuda_download(got, dx, sizeof(float) * R * C);
        CHECK(memcmp(got, ref, sizeof(float) * R * C) == 0);
        /* the residual add fused into the norm: x + b written back exactly, the norm as kn_rmsnorm's */
        float *nrm = malloc(sizeof(float) * R * C);
        for (int rr = 0; rr < R; rr++) kn_rmsnorm(nrm + rr * C, ref + rr * C, w, C, 1e-5f);
        kn_cuda_upload(dx, x, sizeof(float) * R * C);
        kn_cuda_upload(dw, w, sizeof(float) * C);
        CHECK_RC(kn_cuda_add_rmsnorm(dz, dx, db, dw, R, C, 1e-5f), 0);
        kn_cuda_download(got, dx, sizeof(float) * R * C);
        CHECK(memcmp(got, ref, sizeof(float) * R * C) == 0);
        kn_cuda_download(got, dz, sizeof(float) * R * C);
        e = tst_rel_l2(got, nrm, R * C);
        printf("cuda add + rmsnorm fused: rel %.2e\n", e);
        CHECK(e < 1e-5);
        free(nrm);
        /* rows 4, 0, 2 gathered */
        kn_cuda_upload(dx, x, sizeof(float) * R * C);
        kn_cuda_upload(didx, idx, sizeof idx);
        CHECK_RC(kn_cuda_gather_rows(dz, dx, didx, 3, C), 0);
        kn_cuda_download(got, dz, sizeof(float) * 3 * C);
        for (int r = 0; r < 3; r++) CHECK(memcmp(got + r * C, x + idx[r] * C, sizeof(float) * C) == 0);
        printf("cuda bias, residual add, row gather: exact\n");
        kn_cuda_free(db);
        kn_cuda_free(dz);
        kn_cuda_free(didx);
        free(b);
    }
    /* matmul over the GGUF types against the float64 reference: rows of 40 blocks (41 where the type's blocks
     * are 32: an odd count ends the tiles' last k-step half empty; the GEMV's lanes take several), batches of 1,
     * 3, 8 and 13 (its three kernels, and two passes with a partial one), then 16 and 70 (the tensor-core tiles,
     * f16 inputs: two row tiles, the second partial, and 77 weight rows, two column tiles); each also with the
     * per-element kernel pinned */
    int types[] = {CM_F32, CM_F16, CM_Q4_0, CM_Q4_1, CM_Q8_0, CM_Q5_0, CM_Q5_1, CM_Q2_K, CM_Q3_K, CM_Q4_K, CM_Q5_K, CM_Q6_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int64_t N = 77, K = cm_dtype_block(types[t]) == 256 ? 1280 : 1312;
        int B = 70;
        size_t bytes = cm_dtype_row_bytes(types[t], (uint64_t)K) * (size_t)N;
        uint8_t *raw = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) raw[i] = (uint8_t)rand();
        if (types[t] == CM_F32) for (size_t i = 0; i < bytes / 4; i++) ((float *)raw)[i] = frand();
        if (types[t] == CM_F16) for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)raw)[i] = cm_f32_to_f16(frand());
        size_t bb = cm_dtype_block_bytes(types[t]);
        /* each block's fp16 scale (and minimum) at its offset: sane values, as in kernels_test */
        int ty = types[t], dof = ty == CM_Q2_K ? 80 : ty == CM_Q3_K ? 108 : ty == CM_Q6_K ? 208 : 0;
        int mof = ty == CM_Q4_1 || ty == CM_Q5_1 || ty == CM_Q4_K || ty == CM_Q5_K ? 2 : ty == CM_Q2_K ? 82 : -1;
        if (ty != CM_F32 && ty != CM_F16)
            for (size_t i = 0; i < bytes / bb; i++) {
                uint16_t d = cm_f32_to_f16(0.01f), m = cm_f32_to_f16(ty == CM_Q4_1 || ty == CM_Q5_1 ? -0.05f : 0.01f);
                memcpy(raw + i * bb + dof, &d, 2);
                if (mof >= 0) memcpy(raw + i * bb + mof, &m, 2);
            }
        kn_weight wt = {types[t], N, K, raw, 0, NULL, NULL};
        float *xs = malloc(sizeof(float) * (size_t)(B * K)), *yr = malloc(sizeof(float) * (size_t)(B * N)),
              *yg = malloc(sizeof(float) * (size_t)(B * N));
        for (int i = 0; i < B * K; i++) xs[i] = frand();
        void *dwt;
        float *dxs, *dys;
        kn_cuda_malloc(&dwt, bytes);
        kn_cuda_malloc((void **)&dxs, sizeof(float) * (size_t)(B * K));
        kn_cuda_malloc((void **)&dys, sizeof(float) * (size_t)(B * N));
        kn_cuda_upload(dwt, raw, bytes);
        kn_cuda_upload(dxs, xs, sizeof(float) * (size_t)(B * K));
        static const int batches[] = {1, 3, 8, 13, 16, 70};
        for (int bi = 0; bi < 6; bi++) {
            int nb = batches[bi];
            kn_ref_matmul(&wt, yr, xs, nb);
            /* as chosen, then with the per-element kernel pinned (LLMSERVE_CUDA_MATMUL=per-element's) */
            for (int pin = 0; pin < 2; pin++) {
                int tiles = !pin && nb >= 16 && cm_quant_known(types[t]); /* f16 inputs */
                CHECK_RC(kn_cuda_matmul_as(pin ? KN_MATMUL_PER_ELEMENT : KN_MATMUL_AUTO, types[t], dwt, N, K, dxs, dys,
                                           nb), 0);
                kn_cuda_download(yg, dys, sizeof(float) * (size_t)(nb * N));
                double e = tst_rel_l2(yg, yr, (size_t)(nb * N));
                printf("cuda matmul %s B=%d%s: rel %.2e\n", cm_dtype_name(types[t]), nb, pin ? " per-element" : "", e);
                CHECK(e < (tiles ? 3e-3 : 1e-5));
            }
        }
        kn_cuda_free(dwt); kn_cuda_free(dxs); kn_cuda_free(dys);
        free(raw); free(xs); free(yr); free(yg);
    }
    /* head_dim 64 (GQA 3, block 16): every KV type; then the shapes of real models: head_dim 64 with GQA 1
     * over blocks of 32, head_dim 128 with GQA 4 over blocks of 32 and a 32k context (11 rows x 32 heads fill
     * two waves of 132 SMs: no split as planned), head_dim 256 with GQA 8 (the per-head kernel only), and
     * one shape for each size the grouped kernel takes with 8, 2 and 4 heads a group; every case has partial
     * last blocks */
    static const attn_case base = {64, 6, 2, 4, 4, {1, 7, 1, 1}, {2999, 40, 0, 500}, 1e-5},
                           real[] = {{64, 4, 4, 5, 2, {2, 1}, {63, 200}, 1e-5},
                                     {128, 32, 8, 5, 3, {1, 1, 9}, {32767, 100, 37}, 1e-4},
                                     {256, 8, 1, 4, 2, {1, 3}, {1000, 15}, 1e-5},
                                     {64, 16, 2, 4, 2, {1, 5}, {700, 33}, 1e-5},
                                     {128, 8, 4, 4, 3, {1, 1, 2}, {4000, 17, 300}, 1e-5},
                                     {256, 16, 4, 5, 2, {1, 4}, {2500, 60}, 1e-5}};
    attention(KN_KV_F16, &base);
    attention(KN_KV_F32, &base);
    attention(KN_KV_FP8, &base);
    attention(KN_KV_BF16, &base);
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
        attention(KN_KV_BF16, &real[i]);
        attention(KN_KV_F16, &real[i]);
        if (i >= 3) { /* the grouped kernel's shapes: the f32 and fp8 caches too */
            attention(KN_KV_F32, &real[i]);
            attention(KN_KV_FP8, &real[i]);
        }
    }
    dense();
    fp8();
    sampling();
    CHECK_RC(kn_cuda_sync(), 0);
    kn_cuda_free(dx); kn_cuda_free(dw); kn_cuda_free(dy);
    free(x); free(w); free(ref); free(got);
    return tst_done("cuda_test");
}
