/* wk_model.c - loading a model: weights (sharded for tensor parallelism,
 * on the CPU or the GPU), norms, RoPE, the tokenizer; and freeing it. The
 * KV cache is wk_kv.c, the forward pass wk_forward.c. */
#include "wk_model.h"
#include "wk_wire.h"
#include "wk_cuda.h"
#include "wk_lora.h"
#include "cm_dtype.h"
#include "cm_quant.h"
#include "cm_hf_quant.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_rope.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Rows [r0, r1) and columns [c0, c1) of the [n][k] tensor `name`: a row
 * range is a pointer into the mapping; a column range (a tensor-parallel
 * shard of a row-parallel weight) is copied out, whole quantization blocks. */
static int prep_weight(wk_model *m, kn_weight *w, const cm_tensor_ref *t, const char *name, uint64_t k, uint64_t r0,
                       uint64_t r1, uint64_t c0, uint64_t c1, char *err, size_t errlen) {
    int rc = 0;
    if (!t->data) { /* a dummy made on the GPU: this rank's part is made there too */
        *w = (kn_weight){t->type, (int64_t)(r1 - r0), (int64_t)(c1 - c0), NULL, KN_PACK_NONE, NULL, NULL};
        return 0;
    }
    /* act-order GPTQ: the rows hold the inputs in the order of "<name minus .weight>.perm" */
    char pn[80];
    size_t nl = strlen(name);
    snprintf(pn, sizeof pn, "%.*s.perm", (int)(nl > 7 ? nl - 7 : nl), name);
    const cm_tensor_ref *pt = cm_model_tensor(m->file, pn);
    if (pt) {
        const char *why = pt->type != CM_I32 || pt->ne[0] != k || pt->n_dims != 1 ? "is not int32 [k]"
                          : !strcmp(name, "token_embd.weight")                     ? "is on the embedding"
                          : c0 != 0 || c1 != k ? "cannot be split by input columns (tensor parallelism)"
                          : m->device == WK_DEV_CUDA ? "runs on the CPU only"
                                                     : NULL;
        for (uint64_t j = 0; !why && j < k; j++)
            if (((const int32_t *)pt->data)[j] < 0 || (uint64_t)((const int32_t *)pt->data)[j] >= k)
                why = "is not a permutation";
        if (why) {
            snprintf(err, errlen, "%s: '%s' (act-order input order) %s", m->file->path, pn, why);
            return LLM_EUNSUP;
        }
    }
    size_t blk = cm_dtype_block(t->type), rb = cm_dtype_row_bytes(t->type, k);
    const char *raw = t->data ? (const char *)t->data + r0 * rb : NULL; /* NULL: dummy weights made on the GPU */
    if (c0 != 0 || c1 != k) {
        if (!blk || c0 % blk || c1 % blk) {
            snprintf(err, errlen, "%s: tensor '%s' cannot be split at column %llu (blocks of %zu)", m->file->path, name,
                     (unsigned long long)c0, blk);
            return LLM_EUNSUP;
        }
        size_t sb = cm_dtype_row_bytes(t->type, c1 - c0), off = cm_dtype_row_bytes(t->type, c0);
        char *copy = malloc(sb * (r1 - r0));
        void **ns = realloc(m->slices, sizeof *ns * (size_t)(m->n_slices + 1));
        if (!copy || !ns) {
            free(copy);
            if (ns) m->slices = ns;
            return LLM_ENOMEM;
        }
        m->slices = ns;
        m->slices[m->n_slices++] = copy;
        for (uint64_t r = 0; r < r1 - r0; r++) memcpy(copy + r * sb, raw + r * rb + off, sb);
        raw = copy;
        k = c1 - c0;
    }
    if (t->type == CM_MXFP4 && m->device == WK_DEV_CPU) {
        /* the CPU kernels hold MXFP4 as w = d*u + m with fp16 d = 2^(e-128) and m = -12 d (kn_pq6h): exact
         * for e in 104..140 (real weights' blocks; an all-zero block takes any) */
        size_t nb = (size_t)(r1 - r0) * (k / 32);
        for (size_t b = 0; b < nb; b++) {
            const uint8_t *xb = (const uint8_t *)raw + b * 17;
            int zero = 1;
            for (int j = 1; j < 17 && zero; j++) zero = !(xb[j] & 0x77); /* codes 0 and 8 are both 0 */
            if (!zero && (xb[0] < 104 || xb[0] > 140)) {
                snprintf(err, errlen, "%s: tensor '%s' has an MXFP4 block scale 2^%d, outside the 2^-24..2^12 the CPU "
                         "kernels hold exactly", m->file->path, name, (int)xb[0] - 128);
                return LLM_EUNSUP;
            }
        }
    }
    if (m->device == WK_DEV_CUDA && !cm_quant_known(t->type) && t->type != CM_F16 && t->type != CM_BF16 &&
        t->type != CM_F32)
        rc = LLM_EUNSUP;
    else if (m->device == WK_DEV_CUDA) /* the GPU reads GGUF blocks as they are: no CPU repacking */
        *w = (kn_weight){t->type, (int64_t)(r1 - r0), (int64_t)k, raw, KN_PACK_NONE, NULL, NULL};
    else
        rc = kn_weight_init(w, t->type, (int64_t)(r1 - r0), (int64_t)k, raw);
    if (!rc && pt) {
        /* GPTQ orders a layer's inputs by its Hessian, the same for every weight reading that input:
         * one pointer for equal orders lets the forward pass gather and quantize once for them */
        w->perm = pt->data;
        int seen = 0;
        for (int i = 0; i < 3 && !seen; i++)
            if (m->recent_perm[i] && m->recent_k[i] == k && !memcmp(m->recent_perm[i], pt->data, sizeof(int32_t) * k))
                w->perm = m->recent_perm[i], seen = 1;
        if (!seen) {
            for (int i = 2; i > 0; i--) m->recent_perm[i] = m->recent_perm[i - 1], m->recent_k[i] = m->recent_k[i - 1];
            m->recent_perm[0] = w->perm;
            m->recent_k[0] = k;
        }
        if ((int)k > m->perm_k) m->perm_k = (int)k;
    }
    if (rc == LLM_EUNSUP)
        snprintf(err, errlen, "%s: tensor '%s' has type %s, which is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                 "Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4)",
                 m->file->path, name, cm_dtype_name(t->type));
    else if (rc)
        snprintf(err, errlen, "%s: cannot prepare tensor '%s': %s", m->file->path, name, cm_strerror(rc));
    return rc;
}

static int load_weight_part(wk_model *m, kn_weight *w, const char *name, uint64_t k, uint64_t n, uint64_t r0,
                            uint64_t r1, uint64_t c0, uint64_t c1, char *err, size_t errlen) {
    const cm_tensor_ref *t;
    int rc = cm_model_tensor_expect(m->file, name, k, n, &t, err, errlen);
    return rc ? rc : prep_weight(m, w, t, name, k, r0, r1, c0, c1, err, errlen);
}

/* Expert e's [n][k] `kind` matrix of layer l (rows [r0, r1), columns [c0, c1)): a slice of the merged
 * blk.l.ffn_{kind}_exps.weight [k, n, n_expert] of current GGUFs, else blk.l.ffn_{kind}.e.weight (older
 * GGUFs, Hugging Face checkpoints). */
static int load_expert(wk_model *m, kn_weight *w, uint32_t l, const char *kind, uint32_t e, uint64_t k, uint64_t n,
                       uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1, char *err, size_t errlen) {
    char nm[80];
    snprintf(nm, sizeof nm, "blk.%u.ffn_%s_exps.weight", l, kind);
    const cm_tensor_ref *t = cm_model_tensor(m->file, nm);
    if (!t) {
        snprintf(nm, sizeof nm, "blk.%u.ffn_%s.%u.weight", l, kind, e);
        return load_weight_part(m, w, nm, k, n, r0, r1, c0, c1, err, errlen);
    }
    uint64_t E = m->cfg.n_expert;
    if (t->ne[0] != k || t->ne[1] != n || t->ne[2] != E || t->ne[3] != 1) {
        snprintf(err, errlen, "%s: tensor '%s' has shape [%llu, %llu, %llu], expected [%llu, %llu, %llu]", m->file->path,
                 nm, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                 (unsigned long long)k, (unsigned long long)n, (unsigned long long)E);
        return LLM_EFORMAT;
    }
    cm_tensor_ref sub = *t;
    uint64_t per = cm_dtype_row_bytes(t->type, k) * n;
    sub.n_dims = 2;
    sub.ne[2] = 1;
    sub.nbytes = per;
    sub.data = t->data ? (const char *)t->data + e * per : NULL;
    return prep_weight(m, w, &sub, nm, k, r0, r1, c0, c1, err, errlen);
}

static int load_weight(wk_model *m, kn_weight *w, const char *name, uint64_t k, uint64_t n, char *err,
                       size_t errlen) {
    return load_weight_part(m, w, name, k, n, 0, n, 0, k, err, errlen);
}

int wk_model_pp_check(int pp, int n_layer, char *err, size_t errlen) {
    if (pp > 1 && n_layer > 0 && pp > n_layer) {
        snprintf(err, errlen, "--pipeline-parallel-size %d is more stages than the model's %d layers", pp, n_layer);
        return LLM_EUNSUP;
    }
    return 0;
}

/* This rank's pipeline stage: its layers, the earlier stages taking one more where they do not divide
 * (stage 0's KV per token is then the largest, which the cache geometry rank 0 sends is sized by). The
 * other stages' layer tensors are marked used: they are theirs, not ignored. */
static int stage_layers(wk_model *m, char *err, size_t errlen) {
    int L = (int)m->cfg.n_layer, P = m->pp_size, s = m->pp_rank;
    int rc = wk_model_pp_check(P, L, err, errlen);
    if (rc) return rc;
    m->layer0 = (int)(((int64_t)s * L + P - 1) / P);
    m->layer1 = (int)(((int64_t)(s + 1) * L + P - 1) / P);
    for (size_t i = 0; P > 1 && i < m->file->n_tensors; i++) {
        unsigned l;
        int off = 0;
        if (sscanf(m->file->tensors[i].name, "blk.%u.%n", &l, &off) == 1 && off &&
            ((int)l < m->layer0 || (int)l >= m->layer1))
            m->file->tensors[i].used = 1;
    }
    return 0;
}

/* This rank's share of heads, FFN columns and vocabulary. */
static int shard(wk_model *m, char *err, size_t errlen) {
    const cm_model_config *c = &m->cfg;
    int S = m->tp_size, R = m->tp_rank, nkv = (int)c->n_kv_head, group = (int)(c->n_head / c->n_kv_head);
    if (S > nkv) {
        /* more ranks than KV heads (70B's 8 over TP=16): each KV head is replicated on S/nkv ranks, which
         * split its query heads; each rank holds one KV head (as vLLM does) */
        int rep = S / nkv;
        if (S % nkv || group % rep) {
            snprintf(err, errlen, "tensor parallel size %d does not fit the model's %d KV heads (%d query heads "
                     "each): it must divide the KV heads, or be a multiple of them that divides the query heads",
                     S, nkv, group);
            return LLM_EUNSUP;
        }
        m->kv0 = R / rep;
        m->n_kv_l = 1;
        m->n_head_l = group / rep;
        m->head0 = m->kv0 * group + (R % rep) * m->n_head_l;
    } else {
        m->kv0 = R * nkv / S;
        m->n_kv_l = (R + 1) * nkv / S - m->kv0;
        m->head0 = m->kv0 * group;
        m->n_head_l = m->n_kv_l * group;
    }
    int hb = (int)c->hidden / 32;
    m->hid0 = S > 1 ? R * hb / S * 32 : 0;
    m->hidden_l = S > 1 ? (R + 1) * hb / S * 32 - m->hid0 : (int)c->hidden;
    m->exp0 = 0;
    m->exp1 = (int)c->n_expert;
    if (m->expert_parallel) {
        /* vLLM's expert parallelism over the TP group: experts whole, E/S a rank; activations are
         * replicated after attention's all-reduce, so each rank runs its experts for every token that
         * chose them and the same all-reduce sums what the experts gave (no all-to-all to route) */
        if (!c->n_expert || (uint32_t)S > c->n_expert) {
            snprintf(err, errlen, "--enable-expert-parallel: %s", !c->n_expert ? "the model has no experts"
                     : "more ranks than experts");
            return LLM_EUNSUP;
        }
        m->exp0 = (int)((int64_t)R * c->n_expert / S);
        m->exp1 = (int)((int64_t)(R + 1) * c->n_expert / S);
        m->hid0 = 0;
        m->hidden_l = (int)c->hidden;
    } else if (S > 1 && c->hidden % 32) {
        snprintf(err, errlen, "FFN size %u is not a multiple of 32: cannot split it over %d ranks", c->hidden, S);
        return LLM_EUNSUP;
    }
    m->voc0 = (int)((int64_t)R * c->vocab / S);
    m->vocab_l = (int)((int64_t)(R + 1) * c->vocab / S) - m->voc0;
    m->voc_width = malloc(sizeof(int) * (size_t)S);
    if (!m->voc_width) return LLM_ENOMEM;
    for (int r = 0; r < S; r++) m->voc_width[r] = (int)((int64_t)(r + 1) * c->vocab / S - (int64_t)r * c->vocab / S);
    return 0;
}

/* A vector [n] (or n1 of them, [n1][n]) parameter as f32: mapped directly when stored as F32, else
 * converted. */
static int load_vecs(wk_model *m, const float **out, const char *name, uint64_t n, uint64_t n1, int optional,
                     char *err, size_t errlen) {
    const cm_tensor_ref *t = cm_model_tensor(m->file, name);
    if (!t && optional) {
        *out = NULL;
        return 0;
    }
    int rc = cm_model_tensor_expect(m->file, name, n, n1, &t, err, errlen);
    if (rc) return rc;
    n *= n1;
    if (t->type == CM_F32) {
        *out = t->data;
        return 0;
    }
    if (t->type != CM_F16 && t->type != CM_BF16) {
        snprintf(err, errlen, "%s: vector '%s' has unsupported type %s", m->file->path, name, cm_dtype_name(t->type));
        return LLM_EUNSUP;
    }
    float *v = malloc(sizeof(float) * n);
    float **no = realloc(m->owned, sizeof(float *) * (size_t)(m->n_owned + 1));
    if (!v || !no) {
        free(v);
        if (no) m->owned = no;
        return LLM_ENOMEM;
    }
    m->owned = no;
    m->owned[m->n_owned++] = v;
    for (uint64_t i = 0; i < n; i++) v[i] = kn_ref_dequant(t->type, t->data, (int64_t)i);
    *out = v;
    return 0;
}

static int load_vec(wk_model *m, const float **out, const char *name, uint64_t n, int optional, char *err,
                    size_t errlen) {
    return load_vecs(m, out, name, n, 1, optional, err, errlen);
}

static int alloc_f(float **p, size_t n) {
    *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    return *p ? 0 : LLM_ENOMEM;
}

/* --rope-scaling, as vLLM's: config.json's rope_scaling for a model that has none (one with its own would
 * mean two scalings, and Gemma 3 scales only its global layers: both refused). */
static int rope_override(wk_model *m, const char *js, char *err, size_t errlen) {
    cm_model_config *c = &m->cfg;
    if (c->rs.type != CM_RS_NONE || c->gemma || cm_model_tensor(m->file, "rope_freqs.weight")) {
        snprintf(err, errlen, "--rope-scaling: the model has its own RoPE scaling (%s%s): not replaced",
                 c->gemma ? "gemma3 " : "", c->rs.type != CM_RS_NONE ? cm_rope_type_name(c->rs.type) : "rope_freqs.weight");
        return LLM_EUNSUP;
    }
    json_error_t je;
    json_t *j = json_loads(js, 0, &je);
    int rc = cm_rope_from_json(j, c, "--rope-scaling", err, errlen);
    json_decref(j);
    if (!rc && c->rs.type != CM_RS_NONE)
        CM_INFO("--rope-scaling: %s x%g, context %u", cm_rope_type_name(c->rs.type), (double)c->rs.factor, c->ctx_len);
    return rc;
}

int wk_model_load(const wk_model_opts *o, wk_model **out, char *err, size_t errlen) {
    *out = NULL;
    int rc;
    wk_model *m = calloc(1, sizeof *m);
    if (!m) return LLM_ENOMEM;
    m->device = o->device;
    m->quant = o->quant;
    if (m->quant == WK_QUANT_FP8 && m->device != WK_DEV_CUDA) {
        snprintf(err, errlen, "--quantization fp8 runs on FP8 tensor cores: it needs --device cuda");
        rc = LLM_EUNSUP;
        goto fail;
    }
    if (o->model_config && o->device == WK_DEV_CUDA && (o->dummy_type == CM_Q4_K || o->dummy_type == CM_Q6_K)) {
        snprintf(err, errlen, "--dtype %s: dummy K-quant weights are made for the CPU only (with --device cuda use "
                 "f16, bf16, f32, q8_0, q4_0 or q4_1)", cm_dtype_name(o->dummy_type));
        rc = LLM_EUNSUP;
        goto fail;
    }
    if (o->model_config) { /* --load-format dummy: random weights of a preset's or config.json's shape */
        cm_model_config dc;
        if ((rc = cm_model_config_resolve(o->model_config, &dc, err, errlen)) ||
            (rc = cm_model_dummy(&dc, o->dummy_type, o->seed,
                                 o->device == WK_DEV_CUDA && !o->dummy_on_host ? CM_DUMMY_DEVICE_MATRICES : 0, &m->file, err, errlen)))
            goto fail;
    } else if ((rc = cm_model_open(o->model_path, &m->file, err, errlen)))
        goto fail;
    if ((m->quant == WK_QUANT_AWQ || m->quant == WK_QUANT_GPTQ) &&
        m->file->hf_quant != (m->quant == WK_QUANT_AWQ ? CM_HFQ_AWQ : CM_HFQ_GPTQ)) {
        snprintf(err, errlen, "--quantization %s: %s is not %s checkpoint (its config.json's quantization_config "
                 "says %s)", m->quant == WK_QUANT_AWQ ? "awq" : "gptq", o->model_path ? o->model_path : "the model",
                 m->quant == WK_QUANT_AWQ ? "an AWQ" : "a GPTQ",
                 m->file->hf_quant == CM_HFQ_AWQ ? "awq" : m->file->hf_quant == CM_HFQ_GPTQ ? "gptq" : "nothing");
        rc = LLM_EINVAL;
        goto fail;
    }
    m->cfg = m->file->cfg;
    if (o->rope_scaling && (rc = rope_override(m, o->rope_scaling, err, errlen))) goto fail;
    const cm_model_config *c = &m->cfg;
    if (c->encoder) {
        snprintf(err, errlen, "%s: a %s model is an embedding encoder, not a generative model", o->model_path, c->arch);
        rc = LLM_EUNSUP;
        goto fail;
    }
    if (m->file->format == CM_FMT_DUMMY) {
        if ((rc = cm_tok_synthetic(c->vocab, &m->tok))) {
            snprintf(err, errlen, "%s: cannot make a stand-in tokenizer of %u tokens", m->file->path, c->vocab);
            goto fail;
        }
    } else if (m->file->format == CM_FMT_GGUF) {
        char e[256];
        if ((rc = cm_tok_from_gguf(m->file->gguf, &m->tok, e, sizeof e))) {
            snprintf(err, errlen, "%s: %s", o->model_path, e);
            goto fail;
        }
    } else if (m->file->format == CM_FMT_HF) {
        if ((rc = cm_tok_from_hf_dir(o->model_path, &m->tok, err, errlen))) goto fail;
    } else {
        if (!o->tokenizer_path) {
            snprintf(err, errlen, "%s: a llama2.c model needs --tokenizer PATH (tokenizer.bin)", o->model_path);
            rc = LLM_EINVAL;
            goto fail;
        }
        if ((rc = cm_tok_from_llama2c(o->tokenizer_path, c->vocab, &m->tok, err, errlen))) goto fail;
    }
    if (cm_tok_vocab(m->tok) != (int32_t)c->vocab) {
        snprintf(err, errlen, "%s: tokenizer has %d tokens but the model %u", o->model_path, cm_tok_vocab(m->tok), c->vocab);
        rc = LLM_EFORMAT;
        goto fail;
    }
    m->comm = o->comm;
    m->pp_size = o->pp_size > 1 ? o->pp_size : 1;
    m->gpu = o->gpu;
    m->tp_size = o->comm ? o->comm->size : 1;
    m->tp_rank = o->comm ? o->comm->rank : 0;
    m->pp_rank = m->pp_size > 1 ? o->pp_rank : 0;
    if (m->pp_size > 1 && m->tp_rank == 0 && o->pipe)
        m->prev = o->pipe->prev, m->next = o->pipe->next, m->ring = o->pipe->ring;
    if ((rc = stage_layers(m, err, errlen))) goto fail; /* the stage count first: more than layers is refused */
    int first = m->pp_size > 1 && m->tp_rank == 0, s = m->pp_rank, last = s == m->pp_size - 1;
    int has_prev = m->prev != NULL, has_next = m->next != NULL, has_ring = m->ring != NULL;
    if (s < 0 || s >= m->pp_size || (first && (has_prev != (s > 0) || has_next != !last || has_ring != (s == 0 || last))) ||
        (m->prev && m->prev->rank != 1) || (m->next && m->next->rank != 0) || (m->ring && m->ring->rank != !!s)) {
        snprintf(err, errlen, "stage %d of %d pipeline stages: the pairs between the stages' first ranks do not "
                 "match", m->pp_rank, m->pp_size);
        rc = LLM_EINVAL;
        goto fail;
    }
    m->expert_parallel = o->expert_parallel;
    if ((rc = shard(m, err, errlen))) goto fail;
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (o->pool) m->pool = o->pool, m->pool_borrowed = 1;
    else if ((rc = kn_pool_create(threads, &m->pool))) goto fail;
    uint64_t D = c->dim, QD = (uint64_t)c->n_head * c->head_dim, KVD = (uint64_t)c->n_kv_head * c->head_dim;
    uint64_t v0 = (uint64_t)m->voc0, v1 = (uint64_t)(m->voc0 + m->vocab_l);
    if ((rc = load_weight(m, &m->tok_embd, "token_embd.weight", D, c->vocab, err, errlen))) goto fail;
    /* the LM head (this rank's vocabulary rows) gets its own packed copy; the
     * embedding keeps raw rows for lookups */
    if (m->pp_rank < m->pp_size - 1) /* the LM head lives on the last stage */
        cm_model_tensor(m->file, c->tied ? "token_embd.weight" : "output.weight");
    else if ((rc = load_weight_part(m, &m->output, c->tied ? "token_embd.weight" : "output.weight", D, c->vocab, v0, v1,
                                    0, D, err, errlen)))
        goto fail;
    if ((rc = load_vec(m, &m->output_norm, "output_norm.weight", D, 0, err, errlen))) goto fail;
    m->layers = calloc(c->n_layer, sizeof *m->layers);
    if (!m->layers) { rc = LLM_ENOMEM; goto fail; }
    for (uint32_t l = (uint32_t)m->layer0; l < (uint32_t)m->layer1; l++) {
        wk_layer *L = &m->layers[l];
        char nm[64];
#define W(field, suffix, k, n)                                                                     \
    snprintf(nm, sizeof nm, "blk.%u." suffix, l);                                                  \
    if ((rc = load_weight(m, &L->field, nm, k, n, err, errlen))) goto fail;
#define V(field, suffix, n, opt)                                                                   \
    snprintf(nm, sizeof nm, "blk.%u." suffix, l);                                                  \
    if ((rc = load_vec(m, &L->field, nm, n, opt, err, errlen))) goto fail;
#define P(field, suffix, k, n, r0, r1, c0, c1)                                                     \
    snprintf(nm, sizeof nm, "blk.%u." suffix, l);                                                  \
    if ((rc = load_weight_part(m, &L->field, nm, k, n, r0, r1, c0, c1, err, errlen))) goto fail;
        /* Megatron split: Q/K/V and gate/up by output rows (whole heads),
         * O and down by input columns; with one rank, everything */
        uint64_t hd = c->head_dim, q0 = (uint64_t)m->head0 * hd, q1 = q0 + (uint64_t)m->n_head_l * hd;
        uint64_t k0 = (uint64_t)m->kv0 * hd, k1 = k0 + (uint64_t)m->n_kv_l * hd;
        uint64_t f0 = (uint64_t)m->hid0, f1 = f0 + (uint64_t)m->hidden_l;
        P(wq, "attn_q.weight", D, QD, q0, q1, 0, D)
        P(wk, "attn_k.weight", D, KVD, k0, k1, 0, D)
        P(wv, "attn_v.weight", D, KVD, k0, k1, 0, D)
        P(wo, "attn_output.weight", QD, D, 0, D, q0, q1)
        if (c->n_expert) {
            uint32_t E = c->n_expert;
            W(router, "ffn_gate_inp.weight", D, E)
            if (c->gpt_oss) {
                V(router_b, "ffn_gate_inp.bias", E, 0)
                snprintf(nm, sizeof nm, "blk.%u.ffn_gate_exps.bias", l);
                if ((rc = load_vecs(m, &L->xgate_b, nm, c->hidden, E, 0, err, errlen))) goto fail;
                snprintf(nm, sizeof nm, "blk.%u.ffn_up_exps.bias", l);
                if ((rc = load_vecs(m, &L->xup_b, nm, c->hidden, E, 0, err, errlen))) goto fail;
                snprintf(nm, sizeof nm, "blk.%u.ffn_down_exps.bias", l);
                if ((rc = load_vecs(m, &L->xdown_b, nm, D, E, 0, err, errlen))) goto fail;
            }
            L->xgate = calloc(E, sizeof *L->xgate);
            L->xup = calloc(E, sizeof *L->xup);
            L->xdown = calloc(E, sizeof *L->xdown);
            if (!L->xgate || !L->xup || !L->xdown) { rc = LLM_ENOMEM; goto fail; }
            for (uint32_t e = (uint32_t)m->exp0; e < (uint32_t)m->exp1; e++) /* this rank's (all but under EP) */
                if ((rc = load_expert(m, &L->xgate[e], l, "gate", e, D, c->hidden, f0, f1, 0, D, err, errlen)) ||
                    (rc = load_expert(m, &L->xup[e], l, "up", e, D, c->hidden, f0, f1, 0, D, err, errlen)) ||
                    (rc = load_expert(m, &L->xdown[e], l, "down", e, c->hidden, D, 0, D, f0, f1, err, errlen)))
                    goto fail;
            for (uint32_t e = 0; e < E; e++) /* the other ranks' (per-expert tensors): theirs, not unused */
                for (int j = 0; j < 3 && ((int)e < m->exp0 || (int)e >= m->exp1); j++) {
                    snprintf(nm, sizeof nm, "blk.%u.ffn_%s.%u.weight", l, j == 0 ? "gate" : j == 1 ? "up" : "down", e);
                    cm_model_tensor(m->file, nm);
                }
        } else {
            P(gate, "ffn_gate.weight", D, c->hidden, f0, f1, 0, D)
            P(up, "ffn_up.weight", D, c->hidden, f0, f1, 0, D)
            P(down, "ffn_down.weight", c->hidden, D, 0, D, f0, f1)
        }
        V(attn_norm, "attn_norm.weight", D, 0)
        if (c->gpt_oss) { /* gpt-oss names its FFN's input norm for where it sits */
            V(ffn_norm, "post_attention_norm.weight", D, 0)
            V(bo, "attn_output.bias", D, 0)
            V(sinks, "attn_sinks.weight", c->n_head, 0)
            L->sinks += m->head0;
        } else {
            V(ffn_norm, "ffn_norm.weight", D, 0)
        }
        V(bq, "attn_q.bias", QD, 1)
        V(bk, "attn_k.bias", KVD, 1)
        V(bv, "attn_v.bias", KVD, 1)
        if (c->qk_norm) {
            V(q_norm, "attn_q_norm.weight", hd, 0)
            V(k_norm, "attn_k_norm.weight", hd, 0)
        }
        if (c->gemma) {
            V(post_attn_norm, "post_attention_norm.weight", D, 0)
            V(post_ffn_norm, "post_ffw_norm.weight", D, 0)
        }
        if (c->swa_period) L->window = (l + 1) % c->swa_period ? (int)c->swa_window : 0;
        if (L->bq) L->bq += q0;
        if (L->bk) L->bk += k0;
        if (L->bv) L->bv += k0;
#undef W
#undef V
#undef P
    }
    /* Llama 3.x GGUF files carry their rope scaling as one divisor a frequency pair */
    const cm_tensor_ref *rf = cm_model_tensor(m->file, "rope_freqs.weight");
    if (rf && (rf->type != CM_F32 || rf->ne[0] != c->rope_dim / 2 || (rf->n_dims > 1 && rf->ne[1] != 1))) {
        snprintf(err, errlen, "%s: rope_freqs.weight must be %u F32 values (one per rotated pair)", o->model_path,
                 c->rope_dim / 2);
        rc = LLM_EFORMAT;
        goto fail;
    }
    const char *unused = cm_model_unused_tensor(m->file);
    if (unused) {
        snprintf(err, errlen, "%s: tensor '%s' is not one the %s forward pass computes with: refused rather than ignored",
                 o->model_path, unused, c->arch);
        rc = LLM_EUNSUP;
        goto fail;
    }
    m->inv_freq = malloc(sizeof(float) * (c->rope_dim / 2 + 1));
    if (!m->inv_freq) { rc = LLM_ENOMEM; goto fail; }
    cm_rope_inv_freq(&c->rs, c->rope_theta, c->rope_dim, rf ? rf->data : NULL, m->inv_freq);
    if (c->gemma) { /* the local layers: their own base, never scaled */
        if (!(m->inv_freq_swa = malloc(sizeof(float) * (c->rope_dim / 2 + 1)))) { rc = LLM_ENOMEM; goto fail; }
        cm_rope_inv_freq(NULL, c->rope_theta_swa, c->rope_dim, NULL, m->inv_freq_swa);
    }
    for (uint32_t l = 0; l < c->n_layer; l++)
        m->layers[l].inv_freq = m->layers[l].window && m->inv_freq_swa ? m->inv_freq_swa : m->inv_freq;
    int B = m->max_batch = o->max_batch > 0 ? o->max_batch : 64;
    size_t b = (size_t)B;
    if ((rc = alloc_f(&m->x, b * D)) || (rc = alloc_f(&m->xb, b * (D > QD ? D : QD))) ||
        (rc = alloc_f(&m->xb2, b * D)) || (rc = alloc_f(&m->q, b * QD)) ||
        (rc = alloc_f(&m->att, b * QD)) || (rc = alloc_f(&m->k, b * KVD)) ||
        (rc = alloc_f(&m->v, b * KVD)) || (rc = alloc_f(&m->hb, b * c->hidden)) ||
        (rc = alloc_f(&m->hb2, b * c->hidden)))
        goto fail;
    m->tok_pos = malloc(sizeof(int) * b);
    m->tok_blocks = malloc(sizeof(*m->tok_blocks) * b);
    m->attn_seq = malloc(sizeof(kn_attn_seq) * b);
    m->plan_seqs = malloc(sizeof(wk_batch_seq) * b);
    if (!m->tok_pos || !m->tok_blocks || !m->attn_seq || !m->plan_seqs) { rc = LLM_ENOMEM; goto fail; }
    if (D % 32 == 0 && (rc = kn_act_init(&m->act_dim, (int64_t)D, B))) goto fail;
    uint64_t QDl = (uint64_t)m->n_head_l * c->head_dim;
    if (QDl % 32 == 0 && (rc = kn_act_init(&m->act_q, (int64_t)QDl, B))) goto fail;
    if (m->hidden_l % 32 == 0 && (rc = kn_act_init(&m->act_hidden, (int64_t)m->hidden_l, B))) goto fail;
    if (c->n_expert) {
        size_t E = c->n_expert, K = c->n_expert_used;
        if ((rc = alloc_f(&m->moe_logits, b * E)) || (rc = alloc_f(&m->moe_w, b * K)) ||
            (rc = alloc_f(&m->moe_x, b * D)) || (rc = alloc_f(&m->moe_y, b * D)))
            goto fail;
        m->moe_e = malloc(sizeof(int) * b * K);
        m->moe_rows = malloc(sizeof(int) * b);
        m->moe_slot = malloc(sizeof(int) * b);
        if (!m->moe_e || !m->moe_rows || !m->moe_slot) { rc = LLM_ENOMEM; goto fail; }
    }
    if (m->perm_k && ((rc = alloc_f(&m->xperm, b * (size_t)m->perm_k)) ||
                      (rc = kn_act_init(&m->act_perm, (int64_t)m->perm_k, B))))
        goto fail;
    if (m->device == WK_DEV_CUDA && (rc = wk_cuda_load(m, err, errlen))) goto fail;
    if (o->lora_on || o->n_lora_modules) {
        if (m->device == WK_DEV_CUDA) {
            snprintf(err, errlen, "--enable-lora: LoRA runs on the CPU backend only for now");
            rc = LLM_EUNSUP;
            goto fail;
        }
        m->max_loras = o->max_loras > 0 ? o->max_loras : 8;
        m->max_lora_rank = o->max_lora_rank > 0 ? o->max_lora_rank : 16;
        if (!(m->loras = calloc((size_t)m->max_loras, sizeof *m->loras))) { rc = LLM_ENOMEM; goto fail; }
        for (int i = 0; i < o->n_lora_modules && i < m->max_loras; i++) {
            const char *spec = o->lora_modules[i], *eq = strchr(spec, '=');
            char name[64];
            snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - spec) : 0, spec);
            if ((rc = wk_lora_load(m, name, eq + 1, m->max_lora_rank, &m->loras[i], err, errlen))) goto fail;
            m->n_loras++;
        }
    }
    *out = m;
    return 0;
fail:
    if (rc == LLM_ENOMEM && err && !err[0])
        snprintf(err, errlen, "%s: out of memory", o->model_config ? o->model_config : o->model_path);
    wk_model_free(m);
    return rc;
}

void wk_model_free(wk_model *m) {
    if (!m) return;
    wk_wire_back_stop(m);
    wk_cuda_free(m);
    if (m->layers) {
        for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
            wk_layer *L = &m->layers[l];
            kn_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down, &L->router};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) kn_weight_free(ws[i]);
            for (uint32_t e = 0; e < m->cfg.n_expert; e++) {
                if (L->xgate) kn_weight_free(&L->xgate[e]);
                if (L->xup) kn_weight_free(&L->xup[e]);
                if (L->xdown) kn_weight_free(&L->xdown[e]);
            }
            free(L->xgate);
            free(L->xup);
            free(L->xdown);
        }
    }
    for (int i = 0; i < m->n_loras; i++) wk_lora_free(m->loras[i]);
    free(m->loras);
    wk_lora_step_free(m->lora_step);
    kn_weight_free(&m->tok_embd);
    kn_weight_free(&m->output);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->inv_freq);
    free(m->inv_freq_swa);
    free(m->x); free(m->xb); free(m->xb2); free(m->q); free(m->att); free(m->k); free(m->v);
    free(m->hb); free(m->hb2); free(m->attn_scratch);
    free(m->tok_pos); free(m->tok_blocks); free(m->attn_seq);
    free(m->moe_logits); free(m->moe_w); free(m->moe_x); free(m->moe_y);
    free(m->moe_e); free(m->moe_rows); free(m->moe_slot);
    for (int i = 0; i < m->n_slices; i++) free(m->slices[i]);
    free(m->slices);
    free(m->voc_width);
    free(m->lm_local);
    free(m->plan);
    free(m->plan_seqs);
    kn_act_free(&m->act_dim);
    kn_act_free(&m->act_q);
    kn_act_free(&m->act_hidden);
    kn_act_free(&m->act_perm);
    free(m->xperm);
    if (!m->pool_borrowed) kn_pool_destroy(m->pool);
    cm_tok_free(m->tok);
    cm_model_close(m->file);
    free(m);
}
