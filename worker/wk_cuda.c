/* wk_cuda.c - the forward pass on the GPU. Same step as forward_step in
 * wk_model.c (which stays the reference), with every op a CUDA kernel:
 *
 *   embed -> per layer: RMSNorm, Q/K/V GEMMs (+bias), RoPE at each row's
 *   position, K/V into the paged pool, paged attention over block tables,
 *   O GEMM, residual, RMSNorm, gate/up GEMMs, SiLU-mul, down GEMM, residual
 *   -> the rows that want logits: RMSNorm, LM head, logits to the host.
 *
 * GEMMs: F16 / BF16 weights through cuBLAS; GGUF-quantized weights through
 * kn_cuda_matmul (the fused GEMV below 16 rows, tensor-core tiles that
 * dequantize in shared memory from 16) and from DEQ_MIN_ROWS rows
 * dequantized to F16 once and multiplied by cuBLAS; F32 weights a warp per
 * row and batch; with
 * --quantization fp8 the dense layer weights become E4M3 with a scale per
 * output channel and go through cuBLASLt's FP8 GEMM.
 * Everything is allocated at load except the step metadata, which grows to
 * the largest step seen; the KV pool is sized from what is left. With
 * tensor parallelism each rank holds its Megatron shard (wk_model.c's split)
 * and the two row-parallel GEMMs of a layer are summed with NCCL. */
#include "wk_cuda.h"
#include "cm_dtype.h"
#include "cm_quant.h"
#include "cm_error.h"
#include "cm_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t wk_step_meta_size(const wk_cache *c, int n_seq, const wk_batch_seq *s, int T) {
    size_t nb = 0;
    for (int i = 0; i < n_seq; i++) nb += (size_t)((s[i].pos0 + s[i].n + c->block_size - 1) >> c->block_shift);
    return 5 * (size_t)T + (size_t)n_seq + nb;
}

int wk_step_meta(const wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int32_t *out) {
    int32_t *ids = out, *pos = ids + T, *rseq = pos + T, *slot = rseq + T, *lrows = slot + T, *soff = lrows + T,
            *blk = soff + n_seq;
    int nl = 0, mask = (1 << c->block_shift) - 1;
    size_t ob = 0;
    for (int i = 0, t = 0; i < n_seq; i++) {
        int nb = (s[i].pos0 + s[i].n + c->block_size - 1) >> c->block_shift;
        soff[i] = (int32_t)ob;
        memcpy(blk + ob, s[i].blocks, sizeof(int32_t) * (size_t)nb);
        ob += (size_t)nb;
        for (int j = 0; j < s[i].n; j++, t++) {
            int p = s[i].pos0 + j;
            ids[t] = s[i].tokens[j];
            pos[t] = p;
            rseq[t] = i;
            slot[t] = s[i].blocks[p >> c->block_shift] * c->block_size + (p & mask);
            if (j >= s[i].logits_from) lrows[nl++] = t;
        }
    }
    return nl;
}

#ifdef LLMSERVE_HAVE_CUDA
#include "kn_cuda.h"
#include "kn_cuda_plan.h"

/* From this many rows a step, a quantized matrix is dequantized to F16 whole and multiplied by cuBLAS rather
 * than in kn_cuda_matmul's tiles: the copy (2 bytes a weight written, then read) pays off once the tiles' lower
 * tensor-core rate costs more. 64 is an estimate from the kernels' instruction counts; llmserve-cuda-kernel-bench
 * times both at 16-256 rows (tests/gpu/run.sh b), which is what should set it. */
#define DEQ_MIN_ROWS 64
#define N_MAT 7 /* q k v o gate up down */
#define N_VEC 5 /* attn_norm ffn_norm bq bk bv */

#define DW_FP8 1000 /* a dweight of E4M3 codes with a scale per row */

typedef struct {
    void *d;
    int type;                     /* cm_dtype, or DW_FP8 */
    int64_t n, k;
    float *scale;                 /* DW_FP8: [n] */
} dweight;

typedef struct wk_cuda {
    kn_cuda_blas *blas;
    kn_cuda_fp8 *f8;              /* --quantization fp8 */
    int n_sm;
    dweight *w;                   /* [n_layer][N_MAT] */
    dweight embd, out;            /* out.d == embd.d when tied */
    float **vec;                  /* [n_layer][N_VEC], NULL where absent */
    float *out_norm, *inv_freq;
    void *deq;                    /* F16 copy of one quantized weight, for prefill-sized batches */
    size_t deq_bytes;
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2; /* [B][dim | q | kv | hidden] */
    float *logits;                /* [B][this rank's vocabulary rows] */
    float *logits_all;            /* [B][vocab] gathered from the ranks (tensor parallel) */
    int32_t *meta, *hmeta;        /* step metadata: device and host staging */
    size_t meta_cap;              /* int32s */
    int step_rows, step_logits;   /* the last step's rows and rows that want logits (for wk_cuda_head) */
    float *ws;                    /* split-K attention workspace */
    size_t ws_bytes;
} wk_cuda;

int wk_cuda_alloc(void **d, size_t bytes) { return kn_cuda_malloc(d, bytes); }

int wk_cuda_mem_used(uint64_t *bytes) {
    size_t fr = 0, tot = 0;
    int rc = kn_cuda_mem_info(&fr, &tot);
    if (!rc) *bytes = (uint64_t)(tot - fr);
    return rc;
}
void wk_cuda_release(void *d) { kn_cuda_free(d); }

void wk_cuda_cache_copy(wk_cache *c, int src, int dst) {
    for (int l = 0; l < c->n_layer; l++) {
        size_t base = (size_t)l * (size_t)c->n_blocks * c->block_stride;
        kn_cuda_copy(c->k + base + (size_t)dst * c->block_stride, c->k + base + (size_t)src * c->block_stride,
                     c->block_stride);
        kn_cuda_copy(c->v + base + (size_t)dst * c->block_stride, c->v + base + (size_t)src * c->block_stride,
                     c->block_stride);
    }
}

/* A weight to the device as stored (or made there, for dummies); with fp8,
 * a dense matrix is staged in its own type and re-quantized to E4M3. */
static int up_weight(wk_cuda *g, const kn_weight *w, dweight *d, uint64_t seed, int fp8) {
    size_t bytes = cm_dtype_row_bytes(w->type, (uint64_t)w->k) * (size_t)w->n;
    int dense = w->type == CM_F16 || w->type == CM_BF16 || w->type == CM_F32;
    fp8 = fp8 && dense && w->n % 16 == 0 && w->k % 16 == 0;
    void *stage = NULL;
    int rc = kn_cuda_malloc(&stage, bytes);
    if (rc) return rc;
    d->type = w->type;
    d->n = w->n;
    d->k = w->k;
    if (cm_quant_known(w->type)) {
        size_t deq = (size_t)w->n * (size_t)w->k * 2;
        if (deq > g->deq_bytes) g->deq_bytes = deq;
    }
    /* dummy weights are made here, uniform in +-1/sqrt(row length) as on the host */
    rc = w->raw ? kn_cuda_upload(stage, w->raw, bytes)
                : kn_cuda_fill_random(stage, w->type, (size_t)w->n * (size_t)w->k, seed, 1.f / sqrtf((float)w->k));
    if (rc || !fp8) {
        d->d = stage;
        return rc;
    }
    if (!(rc = kn_cuda_malloc(&d->d, (size_t)w->n * (size_t)w->k)) &&
        !(rc = kn_cuda_malloc((void **)&d->scale, sizeof(float) * (size_t)w->n)) &&
        !(rc = kn_cuda_fp8_quantize(g->f8, w->type, stage, w->n, w->k, 1, d->d, d->scale)))
        rc = kn_cuda_sync();
    kn_cuda_free(stage);
    d->type = DW_FP8;
    return rc;
}

static int up_vec(const float *h, size_t n, float **d) {
    *d = NULL;
    if (!h) return 0;
    int rc = kn_cuda_malloc((void **)d, sizeof(float) * n);
    return rc ? rc : kn_cuda_upload(*d, h, sizeof(float) * n);
}

int wk_cuda_load(wk_model *m, char *err, size_t errlen) {
    int n_dev = 0, rc;
    /* what the kernels cannot compute is said first, with or without a GPU here */
    const cm_model_config *c = &m->cfg;
    if (c->gemma || c->qk_norm || c->n_expert) {
        snprintf(err, errlen, "--device cuda: %s (%s) runs on the CPU only for now", c->arch,
                 c->gemma ? "sliding-window attention, GeGLU, the extra norms"
                 : c->n_expert ? "experts" : "per-head query and key norms");
        return LLM_EUNSUP;
    }
    if (c->head_dim == 0 || c->head_dim % 32 || c->head_dim > 256) { /* kn_cuda_attn_plan's range */
        snprintf(err, errlen, "--device cuda: head_dim %d is not supported by the CUDA attention kernel (a multiple "
                 "of 32 up to 256); this model runs with --device cpu", (int)c->head_dim);
        return LLM_EUNSUP;
    }
    kn_cuda_device_count(&n_dev);
    if (!n_dev) {
        snprintf(err, errlen, "--device cuda: no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES)");
        return LLM_EDEVICE;
    }
    if (m->pp_size > 1 && m->tp_size == 1 && (rc = kn_cuda_set_device(m->gpu % n_dev))) { /* a stage's GPU */
        snprintf(err, errlen, "--device cuda: cannot select GPU %d: %s", m->gpu % n_dev, cm_strerror(rc));
        return rc;
    }
    wk_cuda *g = calloc(1, sizeof *g);
    if (!g) return LLM_ENOMEM;
    m->cu = g;
    /* this rank's share (everything with one rank): heads, FFN columns, vocabulary rows */
    size_t L = c->n_layer, B = (size_t)m->max_batch, D = c->dim, QD = (size_t)m->n_head_l * c->head_dim,
           KVD = (size_t)m->n_kv_l * c->head_dim, H = (size_t)m->hidden_l;
    g->w = calloc(L * N_MAT, sizeof *g->w);
    g->vec = calloc(L * N_VEC, sizeof *g->vec);
    if (!g->w || !g->vec) return LLM_ENOMEM;
    if ((rc = kn_cuda_blas_create(&g->blas)) || (rc = kn_cuda_sm_count(&g->n_sm))) goto fail;
    int fp8 = m->quant == WK_QUANT_FP8;
    if (fp8 && (rc = kn_cuda_fp8_create(&g->f8))) goto fail;
    /* the embedding and the LM head stay in their own type, as vLLM keeps them; a pipeline stage holds the
     * embedding if it is the first (or the last, whose head shares it), the head if it is the last, and
     * its own layers only */
    int first = m->pp_rank == 0, last = m->pp_rank == m->pp_size - 1;
    int share = c->tied && m->tp_size == 1 && m->output.raw == m->tok_embd.raw;
    if ((first || (last && share)) && (rc = up_weight(g, &m->tok_embd, &g->embd, 1u << 20, 0))) goto fail;
    if (last && share) g->out = g->embd;
    else if (last && (rc = up_weight(g, &m->output, &g->out, (1u << 20) + 1, 0))) goto fail;
    for (size_t l = (size_t)m->layer0; l < (size_t)m->layer1; l++) {
        const wk_layer *Ly = &m->layers[l];
        const kn_weight *mats[N_MAT] = {&Ly->wq, &Ly->wk, &Ly->wv, &Ly->wo, &Ly->gate, &Ly->up, &Ly->down};
        for (int j = 0; j < N_MAT; j++)
            if ((rc = up_weight(g, mats[j], &g->w[l * N_MAT + j], (l * N_MAT + (size_t)j) * 64 + (size_t)m->tp_rank,
                                fp8)))
                goto fail;
        const float *vecs[N_VEC] = {Ly->attn_norm, Ly->ffn_norm, Ly->bq, Ly->bk, Ly->bv};
        size_t lens[N_VEC] = {D, D, QD, KVD, KVD};
        for (int j = 0; j < N_VEC; j++)
            if ((rc = up_vec(vecs[j], lens[j], &g->vec[l * N_VEC + j]))) goto fail;
    }
    if ((rc = up_vec(m->output_norm, D, &g->out_norm)) || (rc = up_vec(m->inv_freq, c->rope_dim / 2, &g->inv_freq)))
        goto fail;
    if (g->deq_bytes && (rc = kn_cuda_malloc(&g->deq, g->deq_bytes))) goto fail;
    struct {
        float **p;
        size_t n;
    } acts[] = {{&g->x, B * D},    {&g->xb, B * (D > QD ? D : QD)}, {&g->xb2, B * D}, {&g->q, B * QD},
                {&g->k, B * KVD},  {&g->v, B * KVD},                 {&g->att, B * QD}, {&g->hb, B * H},
                {&g->hb2, B * H},  {&g->logits, B * (size_t)m->vocab_l},
                {&g->logits_all, m->tp_size > 1 ? B * c->vocab : 1}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if ((rc = kn_cuda_malloc((void **)acts[i].p, sizeof(float) * acts[i].n))) goto fail;
    /* split-K workspace: splits only happen while rows x CTA heads < 2 x SMs, so rows x CTA heads x splits
     * stays under 4 x SMs, and the workspace, laid out per head, under G = heads / KV heads times that (the
     * grouped kernel's CTA serves G heads; kn_cuda_attn_plan_ctas) */
    g->ws_bytes = (size_t)4 * (size_t)g->n_sm * (size_t)(m->n_head_l / m->n_kv_l) * (c->head_dim + 2) * sizeof(float) +
                  4096;
    if ((rc = kn_cuda_malloc((void **)&g->ws, g->ws_bytes))) goto fail;
    /* every buffer a step can grow, at its largest now: the KV pool is sized next from what is free (the
     * widest GEMM input is the FFN's down projection, H, or the attention output, QD) */
    size_t kmax = D > QD ? D : QD;
    if (H > kmax) kmax = H;
    if ((rc = kn_cuda_blas_reserve(g->blas, (int)B, (int64_t)kmax))) goto fail;
    if (fp8 && (rc = kn_cuda_fp8_reserve(g->f8, (int)B, (int64_t)kmax))) goto fail;
    if (m->comm && m->tp_size > 1 && m->comm->ops->reserve &&
        (rc = m->comm->ops->reserve(m->comm, sizeof(float) * B * c->vocab + (1u << 20))))
        goto fail;
    if ((rc = kn_cuda_sync())) goto fail;
    size_t fr = 0, tot = 0;
    kn_cuda_mem_info(&fr, &tot);
    CM_INFO("CUDA: weights and activations for %d tokens a step on the device, %.1f GiB of %.1f GiB free, %d SMs",
            m->max_batch, (double)fr / 1073741824.0, (double)tot / 1073741824.0, g->n_sm);
    return 0;
fail:
    snprintf(err, errlen, "--device cuda: cannot place the model on the GPU: %s", cm_strerror(rc));
    return rc;
}

void wk_cuda_free(wk_model *m) {
    wk_cuda *g = m->cu;
    if (!g) return;
    if (g->w)
        for (size_t i = 0; i < (size_t)m->cfg.n_layer * N_MAT; i++) {
            kn_cuda_free(g->w[i].d);
            kn_cuda_free(g->w[i].scale);
        }
    if (g->vec)
        for (size_t i = 0; i < (size_t)m->cfg.n_layer * N_VEC; i++) kn_cuda_free(g->vec[i]);
    if (g->out.d != g->embd.d) kn_cuda_free(g->out.d);
    kn_cuda_free(g->embd.d);
    float *bufs[] = {g->out_norm, g->inv_freq, g->x, g->xb, g->xb2, g->q, g->k, g->v, g->att, g->hb, g->hb2,
                     g->logits, g->logits_all, g->ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kn_cuda_free(bufs[i]);
    kn_cuda_free(g->deq);
    kn_cuda_free(g->meta);
    kn_cuda_blas_destroy(g->blas);
    kn_cuda_fp8_destroy(g->f8);
    free(g->hmeta);
    free(g->w);
    free(g->vec);
    free(g);
    m->cu = NULL;
}

int wk_cuda_kv_blocks(const wk_model *m, double utilization, size_t block_bytes, long *n_blocks, char *err,
                      size_t errlen) {
    (void)m;
    size_t fr = 0, tot = 0;
    int rc = kn_cuda_mem_info(&fr, &tot);
    if (rc) return rc;
    kn_cuda_mem_in in = {(double)tot, (double)fr, utilization, 0, 0, (double)block_bytes};
    kn_cuda_mem_out out;
    rc = kn_cuda_kv_blocks(&in, &out);
    if (rc) {
        snprintf(err, errlen, "--gpu-memory-utilization %.2f: %s (weights and activations are already placed)",
                 utilization, out.why);
        return rc;
    }
    *n_blocks = out.n_blocks;
    return 0;
}

/* A kernel pinned by an environment variable, read once into *v: pinned where var is set to val, else dflt. */
static int env_pin(int *v, const char *var, const char *val, int pinned, int dflt) {
    int got = __atomic_load_n(v, __ATOMIC_RELAXED);
    if (got < 0) {
        const char *e = getenv(var);
        got = e && !strcmp(e, val) ? pinned : dflt;
        __atomic_store_n(v, got, __ATOMIC_RELAXED);
    }
    return got;
}

/* LLMSERVE_CUDA_ATTN=per-head pins the per-head attention kernel (a first run's way around a fault in the
 * grouped one); anything else, or nothing, lets kn_cuda_paged_attention choose. */
static int attn_variant(void) {
    static int v = -1;
    return env_pin(&v, "LLMSERVE_CUDA_ATTN", "per-head", KN_ATTN_PER_HEAD, KN_ATTN_AUTO);
}

/* LLMSERVE_CUDA_MATMUL=per-element pins the per-element kernel for GGUF weights, and dequantize + cuBLAS
 * from 16 rows, as before the fused GEMV and the tiles (a first run's way around a fault in either);
 * anything else, or nothing, takes them. */
static int matmul_variant(void) {
    static int v = -1;
    return env_pin(&v, "LLMSERVE_CUDA_MATMUL", "per-element", KN_MATMUL_PER_ELEMENT, KN_MATMUL_AUTO);
}

/* Sums a row-parallel GEMM's partial results over the ranks (NCCL on its own stream, ordered between our
 * kernels by events: no host wait). */
static int reduce(wk_model *m, float *buf, size_t n) {
    if (!m->comm || m->tp_size == 1) return 0;
    return m->comm->ops->all_reduce_sum(m->comm, buf, n);
}

/* The end of a step on the device: NCCL's last collective finished (within the deadline: a dead rank is
 * LLM_EIO, not a hang), then the host takes bytes from src into dst, or only waits (dst NULL). */
static int finish(wk_model *m, void *dst, const void *src, size_t bytes) {
    int rc;
    if (m->comm && m->tp_size > 1 && m->comm->ops->settle && (rc = m->comm->ops->settle(m->comm))) return rc;
    return dst ? kn_cuda_download(dst, src, bytes) : kn_cuda_sync();
}

/* y[B][w.n] = x[B][w.k] . w^T on the device. */
static int dmm(wk_cuda *g, const dweight *w, const float *x, float *y, int B) {
    if (w->type == DW_FP8) return kn_cuda_gemm_fp8(g->f8, w->d, w->scale, w->n, w->k, x, y, B);
    if (w->type == CM_F16 || w->type == CM_BF16) return kn_cuda_gemm(g->blas, w->type, w->d, w->n, w->k, x, y, B);
    int variant = matmul_variant();
    if (B >= (variant == KN_MATMUL_PER_ELEMENT ? 16 : DEQ_MIN_ROWS) && g->deq && w->type != CM_F32) {
        int rc = kn_cuda_dequant_f16(w->type, w->d, w->n, w->k, g->deq);
        return rc ? rc : kn_cuda_gemm(g->blas, CM_F16, g->deq, w->n, w->k, x, y, B);
    }
    return kn_cuda_matmul_as(variant, w->type, w->d, w->n, w->k, x, y, B);
}

/* Several weights times one x (q, k, v; gate, up): x rounded or quantized once when they share a type
 * that allows it (F16 / BF16 through cuBLAS, FP8), else one dmm each. The same products as dmm's. */
static int dmm_shared(wk_cuda *g, const dweight *w, int n, const float *x, float *const *y, int B) {
    int t = w[0].type, same = 1, rc;
    for (int i = 1; i < n; i++) same &= w[i].type == t && w[i].k == w[0].k;
    if (same && (t == CM_F16 || t == CM_BF16)) {
        if ((rc = kn_cuda_gemm_input(g->blas, t, x, B, w[0].k))) return rc;
        for (int i = 0; i < n; i++)
            if ((rc = kn_cuda_gemm_from_input(g->blas, t, w[i].d, w[i].n, w[i].k, y[i], B))) return rc;
        return 0;
    }
    if (same && t == DW_FP8) {
        if ((rc = kn_cuda_fp8_input(g->f8, x, B, w[0].k))) return rc;
        for (int i = 0; i < n; i++)
            if ((rc = kn_cuda_gemm_fp8_from_input(g->f8, w[i].d, w[i].scale, w[i].n, w[i].k, y[i], B))) return rc;
        return 0;
    }
    for (int i = 0; i < n; i++)
        if ((rc = dmm(g, &w[i], x, y[i], B))) return rc;
    return 0;
}

/* Host staging of a step (the layout wk_step_meta writes), one upload. */
static int stage(wk_cuda *g, const wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int *n_logit, int32_t **d) {
    size_t need = wk_step_meta_size(c, n_seq, s, T);
    if (need > g->meta_cap) { /* grows to the largest step seen, then stays */
        size_t cap = need * 2;
        int32_t *h = realloc(g->hmeta, sizeof(int32_t) * cap);
        if (!h) return LLM_ENOMEM;
        g->hmeta = h;
        kn_cuda_free(g->meta);
        g->meta = NULL;
        g->meta_cap = 0;
        int rc = kn_cuda_malloc((void **)&g->meta, sizeof(int32_t) * cap);
        if (rc) return rc;
        g->meta_cap = cap;
    }
    *n_logit = wk_step_meta(c, n_seq, s, T, g->hmeta);
    *d = g->meta;
    return kn_cuda_upload(g->meta, g->hmeta, sizeof(int32_t) * need);
}

/* This rank's layers over a step: stage 0 embeds the tokens, a later pipeline stage uploads the rows that
 * came from the stage before (m->x); *nl: the rows that want logits (their indexes stay in g->meta for
 * the head). */
static int run_layers(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len, int *nl) {
    wk_cuda *g = m->cu;
    const cm_model_config *cf = &m->cfg;
    int D = (int)cf->dim, hd = (int)cf->head_dim, nh = m->n_head_l, nkv = m->n_kv_l, H = m->hidden_l;
    int QD = nh * hd, KVD = nkv * hd, rc;
    int32_t *d;
    if ((rc = stage(g, c, n_seq, s, T, nl, &d))) return rc;
    g->step_rows = T;
    g->step_logits = *nl;
    const int32_t *d_ids = d, *d_pos = d + T, *d_rseq = d + 2 * T, *d_slot = d + 3 * T, *d_soff = d + 5 * T,
                  *d_blk = d + 5 * T + n_seq;
#define TRY(call)                                                                                  \
    if ((rc = (call))) return rc
    if (m->pp_rank == 0) {
        TRY(kn_cuda_embed(g->embd.type, g->embd.d, g->embd.n, D, d_ids, T, g->x));
    } else {
        TRY(kn_cuda_upload(g->x, m->x, sizeof(float) * (size_t)T * (size_t)D)); /* host staging: the hop's rows */
    }
    for (uint32_t l = (uint32_t)m->layer0; l < (uint32_t)m->layer1; l++) {
        const dweight *w = g->w + (size_t)l * N_MAT;
        float *const *vec = g->vec + (size_t)l * N_VEC;
        if (l == (uint32_t)m->layer0) { /* later layers: fused into the residual add that ends the one before */
            TRY(kn_cuda_rmsnorm(g->xb, g->x, vec[0], T, D, cf->norm_eps));
        }
        float *qkv[3] = {g->q, g->k, g->v}, *gu[2] = {g->hb, g->hb2};
        TRY(dmm_shared(g, &w[0], 3, g->xb, qkv, T)); /* x rounded (or quantized) once for q, k and v */
        if (vec[2]) TRY(kn_cuda_add_bias(g->q, vec[2], T, QD));
        if (vec[3]) TRY(kn_cuda_add_bias(g->k, vec[3], T, KVD));
        if (vec[4]) TRY(kn_cuda_add_bias(g->v, vec[4], T, KVD));
        if (cf->attn_scale > 0) /* the kernel scales by 1/sqrt(hd): the rest here, as the CPU path does */
            TRY(kn_cuda_scale(g->q, cf->attn_scale * sqrtf((float)hd), (size_t)T * (size_t)QD));
        TRY(kn_cuda_rope_rows(g->q, T, nh, hd, (int)cf->rope_dim, cf->rope_type, d_pos, g->inv_freq));
        TRY(kn_cuda_rope_rows(g->k, T, nkv, hd, (int)cf->rope_dim, cf->rope_type, d_pos, g->inv_freq));
        size_t layer = (size_t)(l - (uint32_t)m->layer0) * (size_t)c->n_blocks * c->block_stride; /* the stage's cache */
        TRY(kn_cuda_kv_store(c->type, c->k + layer, c->v + layer, c->block_stride, g->k, g->v, d_slot, T, KVD,
                             c->block_shift));
        kn_cuda_attn_args aa = {T,     nh,     nkv,          hd,          c->type, c->block_shift, max_len, g->n_sm,
                                g->q,  g->att, c->k + layer, c->v + layer, c->block_stride,  d_rseq, d_pos,
                                d_soff, d_blk, g->ws,        g->ws_bytes, attn_variant()};
        TRY(kn_cuda_paged_attention(&aa));
        TRY(dmm(g, &w[3], g->att, g->xb2, T));
        TRY(reduce(m, g->xb2, (size_t)T * (size_t)D));
        TRY(kn_cuda_add_rmsnorm(g->xb, g->x, g->xb2, vec[1], T, D, cf->norm_eps)); /* residual + ffn norm */
        TRY(dmm_shared(g, &w[4], 2, g->xb, gu, T)); /* and once for gate and up */
        TRY(kn_cuda_silu_mul(g->hb, g->hb2, T * H));
        TRY(dmm(g, &w[6], g->hb, g->xb2, T));
        TRY(reduce(m, g->xb2, (size_t)T * (size_t)D));
        if (l + 1 < (uint32_t)m->layer1) { /* residual + the next layer's attention norm */
            TRY(kn_cuda_add_rmsnorm(g->xb, g->x, g->xb2, g->vec[(size_t)(l + 1) * N_VEC], T, D, cf->norm_eps));
        } else {
            TRY(kn_cuda_add(g->x, g->xb2, (size_t)T * (size_t)D));
        }
    }
    return 0;
}

/* The final norm and the LM head over the step's nl rows that want logits; *full: the whole vocabulary's
 * logits on the device (gathered on the first rank under TP). */
static int run_head(wk_model *m, int nl, float **full) {
    wk_cuda *g = m->cu;
    const cm_model_config *cf = &m->cfg;
    int D = (int)cf->dim, rc;
    const int32_t *d_lrows = g->meta + 4 * (size_t)g->step_rows;
    TRY(kn_cuda_gather_rows(g->xb, g->x, d_lrows, nl, D));
    TRY(kn_cuda_rmsnorm(g->xb2, g->xb, g->out_norm, nl, D, cf->norm_eps));
    TRY(dmm(g, &g->out, g->xb2, g->logits, nl));
    *full = g->logits;
    if (m->tp_size > 1) { /* vocabulary-parallel LM head: the first rank gathers the columns */
        TRY(m->comm->ops->all_gather_cols(m->comm, g->logits, nl, m->voc_width, m->tp_rank == 0 ? g->logits_all : NULL));
        *full = g->logits_all;
    }
#undef TRY
    return 0;
}

int wk_cuda_layers(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len) {
    int nl, rc = run_layers(m, c, n_seq, s, T, max_len, &nl);
    if (rc) return rc;
    if (m->pp_rank == m->pp_size - 1) return finish(m, NULL, NULL, 0); /* the head runs next, on the device */
    return finish(m, m->x, m->cu->x, sizeof(float) * (size_t)T * m->cfg.dim); /* the rows for the next stage */
}

int wk_cuda_head(wk_model *m, int n, float *out) {
    wk_cuda *g = m->cu;
    if (!g || n != g->step_logits || m->pp_rank != m->pp_size - 1) return LLM_EINVAL;
    float *full;
    int rc = run_head(m, n, &full);
    if (rc) return rc;
    if (!out || m->tp_rank) return finish(m, NULL, NULL, 0);
    return finish(m, out, full, sizeof(float) * (size_t)n * m->cfg.vocab);
}

int wk_cuda_forward(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len, float *logits) {
    int nl, rc = run_layers(m, c, n_seq, s, T, max_len, &nl);
    if (rc) return rc;
    if (!nl) return finish(m, NULL, NULL, 0);
    float *full;
    if ((rc = run_head(m, nl, &full))) return rc;
    if (!logits) return finish(m, NULL, NULL, 0);
    return finish(m, logits, full, sizeof(float) * (size_t)nl * m->cfg.vocab);
}

#else /* built without CUDA */

int wk_cuda_load(wk_model *m, char *err, size_t errlen) {
    (void)m;
    snprintf(err, errlen, "--device cuda: this build has no CUDA backend (configure with nvcc on the PATH or "
                          "-DLLMSERVE_CUDA=ON)");
    return LLM_EUNSUP;
}
void wk_cuda_free(wk_model *m) { (void)m; }
int wk_cuda_forward(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len, float *logits) {
    (void)m, (void)c, (void)n_seq, (void)s, (void)T, (void)max_len, (void)logits;
    return LLM_EUNSUP;
}
int wk_cuda_layers(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len) {
    (void)m, (void)c, (void)n_seq, (void)s, (void)T, (void)max_len;
    return LLM_EUNSUP;
}
int wk_cuda_head(wk_model *m, int n, float *out) {
    (void)m, (void)n, (void)out;
    return LLM_EUNSUP;
}
int wk_cuda_alloc(void **d, size_t bytes) {
    (void)bytes;
    *d = NULL;
    return LLM_EUNSUP;
}
int wk_cuda_mem_used(uint64_t *bytes) {
    *bytes = 0;
    return LLM_EUNSUP;
}
void wk_cuda_release(void *d) { (void)d; }
void wk_cuda_cache_copy(wk_cache *c, int src, int dst) { (void)c, (void)src, (void)dst; }
int wk_cuda_kv_blocks(const wk_model *m, double utilization, size_t block_bytes, long *n_blocks, char *err,
                      size_t errlen) {
    (void)m, (void)utilization, (void)block_bytes, (void)n_blocks;
    snprintf(err, errlen, "this build has no CUDA backend");
    return LLM_EUNSUP;
}

#endif
