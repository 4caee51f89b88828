#include "wk_bert.h"
#include "cm_dtype.h"
#include "cm_error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_MAX_TOKENS 2048

static int weight(wk_encoder *e, kn_weight *w, const char *name, uint64_t k, uint64_t n, char *err, size_t el) {
    const cm_tensor_ref *t;
    int rc = cm_model_tensor_expect(e->file, name, k, n, &t, err, el);
    if (rc) return rc;
    rc = kn_weight_init(w, t->type, (int64_t)n, (int64_t)k, t->data);
    if (rc) snprintf(err, el, "%s: tensor '%s' of type %s: %s", e->file->path, name, cm_dtype_name(t->type),
                     cm_strerror(rc));
    return rc;
}

/* A vector as f32: mapped when stored as F32, else converted and owned. */
static int vec(wk_encoder *e, const float **out, const char *name, uint64_t n, char *err, size_t el) {
    const cm_tensor_ref *t;
    int rc = cm_model_tensor_expect(e->file, name, n, 1, &t, err, el);
    if (rc) return rc;
    if (t->type == CM_F32) {
        *out = t->data;
        return 0;
    }
    if (t->type != CM_F16 && t->type != CM_BF16) {
        snprintf(err, el, "%s: vector '%s' has unsupported type %s", e->file->path, name, cm_dtype_name(t->type));
        return LLM_EUNSUP;
    }
    float *v = malloc(sizeof(float) * n);
    float **no = realloc(e->owned, sizeof(float *) * (size_t)(e->n_owned + 1));
    if (no) e->owned = no;
    if (!v || !no) {
        free(v);
        return LLM_ENOMEM;
    }
    e->owned[e->n_owned++] = v;
    for (uint64_t i = 0; i < n; i++) v[i] = kn_ref_dequant(t->type, t->data, (int64_t)i);
    *out = v;
    return 0;
}

/* Floats of one thread's attention scratch: Q, K, V^T and the output of a
 * head [L][hd] each, the scores [L][L], the row sums [L]. */
static size_t wk_bert_scratch(int ml, int hd) {
    return 4 * (size_t)ml * (size_t)hd + (size_t)ml * (size_t)ml + (size_t)ml;
}

static int alloc_f(float **p, size_t n) {
    *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    return *p ? 0 : LLM_ENOMEM;
}

int wk_encoder_max_len(const wk_encoder *e) {
    return (int)(e->cfg.max_seq ? e->cfg.max_seq : e->cfg.ctx_len);
}

int wk_encoder_load(const wk_encoder_opts *o, wk_encoder **out, char *err, size_t errlen) {
    *out = NULL;
    int rc;
    wk_encoder *e = calloc(1, sizeof *e);
    if (!e) return LLM_ENOMEM;
    if ((rc = cm_model_open(o->model_path, &e->file, err, errlen))) goto fail;
    e->cfg = e->file->cfg;
    const cm_model_config *c = &e->cfg;
    if (!c->encoder) {
        snprintf(err, errlen, "%s: a %s model is not an embedding encoder (bert)", o->model_path, c->arch);
        rc = LLM_EUNSUP;
        goto fail;
    }
    if (c->n_head * c->head_dim != c->dim) {
        snprintf(err, errlen, "%s: %u heads of %u do not make the width %u", o->model_path, c->n_head, c->head_dim,
                 c->dim);
        rc = LLM_EFORMAT;
        goto fail;
    }
    if (e->file->format == CM_FMT_HF) {
        char te[600];
        if ((rc = cm_tok_from_hf_dir(o->model_path, &e->tok, te, sizeof te))) {
            snprintf(err, errlen, "%s", te);
            goto fail;
        }
    } else if (e->file->format == CM_FMT_GGUF) {
        char te[300];
        if ((rc = cm_tok_from_gguf(e->file->gguf, &e->tok, te, sizeof te))) {
            snprintf(err, errlen, "%s: %s", o->model_path, te);
            goto fail;
        }
    }
    if (!e->tok || cm_tok_vocab(e->tok) != (int32_t)c->vocab) {
        snprintf(err, errlen, "%s: tokenizer has %d tokens but the model %u", o->model_path,
                 e->tok ? cm_tok_vocab(e->tok) : 0, c->vocab);
        rc = LLM_EFORMAT;
        goto fail;
    }
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (o->pool) e->pool = o->pool, e->pool_borrowed = 1;
    else if ((rc = kn_pool_create(threads, &e->pool))) goto fail;
    uint64_t D = c->dim, H = c->hidden;
    if ((rc = weight(e, &e->tok_embd, "token_embd.weight", D, c->vocab, err, errlen)) ||
        (rc = weight(e, &e->pos_embd, "position_embd.weight", D, c->ctx_len, err, errlen)) ||
        (c->n_types && (rc = weight(e, &e->type_embd, "token_types.weight", D, c->n_types, err, errlen))) ||
        (rc = vec(e, &e->embd_ln_w, "token_embd_norm.weight", D, err, errlen)) ||
        (rc = vec(e, &e->embd_ln_b, "token_embd_norm.bias", D, err, errlen)))
        goto fail;
    e->layers = calloc(c->n_layer, sizeof *e->layers);
    if (!e->layers) {
        rc = LLM_ENOMEM;
        goto fail;
    }
    for (uint32_t l = 0; l < c->n_layer; l++) {
        wk_bert_layer *L = &e->layers[l];
        char nm[64];
#define W(field, suffix, k, n)                                                                                   \
    snprintf(nm, sizeof nm, "blk.%u." suffix, l);                                                                \
    if ((rc = weight(e, &L->field, nm, k, n, err, errlen))) goto fail;
#define V(field, suffix, n)                                                                                      \
    snprintf(nm, sizeof nm, "blk.%u." suffix, l);                                                                \
    if ((rc = vec(e, &L->field, nm, n, err, errlen))) goto fail;
        W(wq, "attn_q.weight", D, D)
        W(wk, "attn_k.weight", D, D)
        W(wv, "attn_v.weight", D, D)
        W(wo, "attn_output.weight", D, D)
        W(up, "ffn_up.weight", D, H)
        W(down, "ffn_down.weight", H, D)
        V(bq, "attn_q.bias", D)
        V(bk, "attn_k.bias", D)
        V(bv, "attn_v.bias", D)
        V(bo, "attn_output.bias", D)
        V(bup, "ffn_up.bias", H)
        V(bdown, "ffn_down.bias", D)
        V(ln1_w, "attn_output_norm.weight", D)
        V(ln1_b, "attn_output_norm.bias", D)
        V(ln2_w, "layer_output_norm.weight", D)
        V(ln2_b, "layer_output_norm.bias", D)
#undef W
#undef V
    }
    int ml = wk_encoder_max_len(e);
    if (ml > 4096) { /* attention holds an input's whole score matrix */
        snprintf(err, errlen, "%s: inputs of %d tokens; encoders of more than 4096 are not supported", o->model_path, ml);
        rc = LLM_EUNSUP;
        goto fail;
    }
    e->max_tokens = o->max_tokens > 0 ? o->max_tokens : DEFAULT_MAX_TOKENS;
    if (e->max_tokens < ml) e->max_tokens = ml;
    size_t T = (size_t)e->max_tokens;
    if ((rc = alloc_f(&e->x, T * D)) || (rc = alloc_f(&e->q, T * D)) || (rc = alloc_f(&e->k, T * D)) ||
        (rc = alloc_f(&e->v, T * D)) || (rc = alloc_f(&e->att, T * D)) || (rc = alloc_f(&e->tmp, T * D)) ||
        (rc = alloc_f(&e->h, T * H)) ||
        (rc = alloc_f(&e->scratch, (size_t)kn_pool_size(e->pool) * wk_bert_scratch(ml, (int)c->head_dim))))
        goto fail;
    if (D % 32 == 0 && (rc = kn_act_init(&e->act_dim, (int64_t)D, e->max_tokens))) goto fail;
    if (H % 32 == 0 && (rc = kn_act_init(&e->act_hidden, (int64_t)H, e->max_tokens))) goto fail;
    *out = e;
    return 0;
fail:
    if (rc == LLM_ENOMEM && err && !err[0]) snprintf(err, errlen, "%s: out of memory", o->model_path);
    wk_encoder_free(e);
    return rc;
}

void wk_encoder_free(wk_encoder *e) {
    if (!e) return;
    if (e->layers)
        for (uint32_t l = 0; l < e->cfg.n_layer; l++) {
            wk_bert_layer *L = &e->layers[l];
            kn_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->up, &L->down};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) kn_weight_free(ws[i]);
        }
    kn_weight_free(&e->tok_embd);
    kn_weight_free(&e->pos_embd);
    kn_weight_free(&e->type_embd);
    for (int i = 0; i < e->n_owned; i++) free(e->owned[i]);
    free(e->owned);
    free(e->layers);
    free(e->x); free(e->q); free(e->k); free(e->v); free(e->att); free(e->tmp); free(e->h); free(e->scratch);
    kn_act_free(&e->act_dim);
    kn_act_free(&e->act_hidden);
    if (!e->pool_borrowed) kn_pool_destroy(e->pool);
    cm_tok_free(e->tok);
    cm_model_close(e->file);
    free(e);
}

/* ---- the forward pass ---------------------------------------------------- */

/* out = LayerNorm(x) * w + b over n, statistics in double (the reference's
 * float32 sums differ by rounding only). */
static void layer_norm(float *out, const float *x, const float *w, const float *b, int n, float eps) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++) s += x[i];
    double mean = s / n;
    for (int i = 0; i < n; i++) ss += (x[i] - mean) * (x[i] - mean);
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = ((float)(x[i] - mean)) * inv * w[i] + b[i];
}

/* The step's layout: input s holds rows [row[s], row[s] + len[s]). */
typedef struct {
    wk_encoder *e;
    int n, *row, *len;
    int n_units;         /* inputs x heads */
} attn_ctx;

/* Bidirectional attention, one (input, head) unit at a time: every token
 * sees every token of its own input. The head's Q and K and V transposed
 * are copied out contiguous, then scores S = Q K^T and the sum P V are two
 * float GEMMs on the kernels' blocked path; softmax in fp32 between them. */
static void attn_task(void *p, int ith, int nth) {
    attn_ctx *a = p;
    wk_encoder *e = a->e;
    int H = (int)e->cfg.n_head, hd = (int)e->cfg.head_dim, D = (int)e->cfg.dim, ml = wk_encoder_max_len(e);
    float scale = 1.0f / sqrtf((float)hd);
    float *qb = e->scratch + (size_t)ith * wk_bert_scratch(ml, hd), *kb = qb + (size_t)ml * hd, *vt = kb + (size_t)ml * hd,
          *S = vt + (size_t)ml * hd, *O = S + (size_t)ml * ml; /* [L][hd] [L][hd] [hd][L] [L][L] [L][hd] */
    for (int u = ith; u < a->n_units; u += nth) {
        int s = u / H, h = u % H, r0 = a->row[s], L = a->len[s];
        for (int i = 0; i < L; i++) {
            const float *src = (size_t)(r0 + i) * D + h * hd + e->q;
            memcpy(qb + (size_t)i * hd, src, sizeof(float) * (size_t)hd);
            memcpy(kb + (size_t)i * hd, e->k + (size_t)(r0 + i) * D + h * hd, sizeof(float) * (size_t)hd);
            for (int d = 0; d < hd; d++) vt[(size_t)d * L + i] = e->v[(size_t)(r0 + i) * D + h * hd + d];
        }
        kn_gemm_f32(kb, hd, L, qb, L, S, L); /* S[i][j] = q_i . k_j */
        float *inv = O + (size_t)ml * hd;
        for (int i = 0; i < L; i++) {
            float *row = S + (size_t)i * L, mx = -INFINITY;
            for (int j = 0; j < L; j++) mx = row[j] > mx ? row[j] : mx;
            inv[i] = 1.0f / kn_exp_sum(row, L, mx, scale, row);
        }
        kn_gemm_f32(vt, L, hd, S, L, O, hd); /* O[i][d] = sum_j p_ij v_jd */
        for (int i = 0; i < L; i++) {
            float *o = e->att + (size_t)(r0 + i) * D + h * hd;
            for (int d = 0; d < hd; d++) o[d] = O[(size_t)i * hd + d] * inv[i];
        }
    }
}

typedef struct {
    float *h;
    const float *bias;
    size_t rows, n;
    int tanh_form;
} gelu_ctx;

/* h = GELU(h + bias), rows split over the pool. */
static void gelu_task(void *p, int ith, int nth) {
    gelu_ctx *g = p;
    size_t r0 = g->rows * (size_t)ith / (size_t)nth, r1 = g->rows * (size_t)(ith + 1) / (size_t)nth;
    for (size_t r = r0; r < r1; r++) {
        float *x = g->h + r * g->n;
        for (size_t i = 0; i < g->n; i++) {
            float v = x[i] + g->bias[i];
            x[i] = g->tanh_form ? 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))
                                : 0.5f * v * (1.0f + erff(v * 0.70710678118f));
        }
    }
}

static void add_bias(float *y, const float *b, int rows, int n) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) y[(size_t)r * n + i] += b[i];
}

/* One step: inputs [0, n) packed in rows; pooled vectors to out[n][dim]. */
static void encode_step(wk_encoder *e, int n, const int32_t *const *tokens, const int *len, int *row, float *out) {
    const cm_model_config *c = &e->cfg;
    int D = (int)c->dim, Hd = (int)c->hidden, T = 0;
    float eps = c->norm_eps;
    float *pe = e->tmp, *te = e->att; /* free until the first layer */
    if (c->n_types) kn_get_row(&e->type_embd, 0, te); /* one segment: type 0 everywhere */
    for (int s = 0; s < n; s++) {
        row[s] = T;
        for (int i = 0; i < len[s]; i++, T++) {
            float *x = e->x + (size_t)T * D;
            kn_get_row(&e->tok_embd, tokens[s][i], x);
            kn_get_row(&e->pos_embd, i, pe);
            for (int d = 0; d < D; d++) x[d] += pe[d] + (c->n_types ? te[d] : 0);
            layer_norm(x, x, e->embd_ln_w, e->embd_ln_b, D, eps);
        }
    }
    attn_ctx ac = {e, n, row, (int *)len, n * (int)c->n_head};
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const wk_bert_layer *L = &e->layers[l];
        const kn_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
        float *const y3[3] = {e->q, e->k, e->v};
        if (kn_weight_wants_act(&L->wq)) kn_quantize_act(&e->act_dim, e->x, T);
        kn_matmul_multi(e->pool, 3, qkv, y3, e->x, &e->act_dim, T);
        add_bias(e->q, L->bq, T, D);
        add_bias(e->k, L->bk, T, D);
        add_bias(e->v, L->bv, T, D);
        kn_pool_run(e->pool, attn_task, &ac);
        kn_matmul(e->pool, &L->wo, e->tmp, e->att, &e->act_dim, T);
        for (int r = 0; r < T; r++) { /* x = LN(x + attn + bo) */
            float *x = e->x + (size_t)r * D, *t = e->tmp + (size_t)r * D;
            for (int d = 0; d < D; d++) x[d] += t[d] + L->bo[d];
            layer_norm(x, x, L->ln1_w, L->ln1_b, D, eps);
        }
        kn_matmul(e->pool, &L->up, e->h, e->x, &e->act_dim, T);
        gelu_ctx gc = {e->h, L->bup, (size_t)T, (size_t)Hd, c->gelu_tanh};
        kn_pool_run(e->pool, gelu_task, &gc);
        kn_matmul(e->pool, &L->down, e->tmp, e->h, &e->act_hidden, T);
        for (int r = 0; r < T; r++) { /* x = LN(x + ffn + bdown) */
            float *x = e->x + (size_t)r * D, *t = e->tmp + (size_t)r * D;
            for (int d = 0; d < D; d++) x[d] += t[d] + L->bdown[d];
            layer_norm(x, x, L->ln2_w, L->ln2_b, D, eps);
        }
    }
    for (int s = 0; s < n; s++) {
        float *o = out + (size_t)s * D;
        const float *x0 = e->x + (size_t)row[s] * D;
        if (c->pooling == CM_POOL_MEAN) {
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int i = 0; i < len[s]; i++) acc += x0[(size_t)i * D + d];
                o[d] = (float)(acc / len[s]);
            }
        } else {
            memcpy(o, c->pooling == CM_POOL_LAST ? x0 + (size_t)(len[s] - 1) * D : x0, sizeof(float) * (size_t)D);
        }
        if (c->normalize) {
            double ss = 0;
            for (int d = 0; d < D; d++) ss += (double)o[d] * o[d];
            float inv = (float)(1.0 / fmax(sqrt(ss), 1e-12));
            for (int d = 0; d < D; d++) o[d] *= inv;
        }
    }
}

int wk_encode(wk_encoder *e, int n, const int32_t *const *tokens, const int *len, float *out) {
    int ml = wk_encoder_max_len(e);
    if (n < 0) return LLM_EINVAL;
    for (int s = 0; s < n; s++) {
        if (len[s] < 1 || len[s] > ml) return LLM_ERANGE;
        for (int i = 0; i < len[s]; i++)
            if (tokens[s][i] < 0 || tokens[s][i] >= (int32_t)e->cfg.vocab) return LLM_EINVAL;
    }
    int *row = malloc(sizeof(int) * ((size_t)n + 1));
    if (!row) return LLM_ENOMEM;
    /* pack consecutive inputs into steps of at most max_tokens tokens */
    for (int s0 = 0; s0 < n;) {
        int s1 = s0, T = 0;
        while (s1 < n && T + len[s1] <= e->max_tokens) T += len[s1++];
        encode_step(e, s1 - s0, tokens + s0, len + s0, row, out + (size_t)s0 * e->cfg.dim);
        s0 = s1;
    }
    free(row);
    return 0;
}
