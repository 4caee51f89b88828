/* wk_model.h - the llama-family forward pass on the CPU backend.
 *
 * Handles GQA, tied or untied embeddings, QKV bias (qwen2), RoPE in both
 * conventions with theta from metadata. wk_forward takes any number of
 * tokens of one sequence: a prompt is processed max_batch tokens at a time
 * (prefill: every matmul is a GEMM over the chunk), a decode step is T = 1.
 * The KV cache here is a simple contiguous per-sequence one. */
#ifndef WK_MODEL_H
#define WK_MODEL_H

#include "cm_model.h"
#include "cm_tokenizer.h"
#include "kernels.h"

typedef struct {
    kn_weight wq, wk, wv, wo, gate, up, down;
    const float *attn_norm, *ffn_norm;   /* [dim] */
    const float *bq, *bk, *bv;           /* [n_head*hd], [n_kv*hd], or NULL */
} wk_layer;

typedef struct wk_model {
    cm_model_file *file;
    cm_model_config cfg;
    cm_tokenizer *tok;
    kn_pool *pool;
    kn_weight tok_embd, output;
    const float *output_norm;
    wk_layer *layers;
    float *inv_freq;                     /* [rope_dim/2] */
    float **owned;                       /* norms converted to f32 */
    int n_owned;
    int max_batch;
    /* activations, sized once for max_batch tokens */
    float *x, *xb, *xb2;                 /* [B][dim] */
    float *q, *att;                      /* [B][n_head*hd] */
    float *k, *v;                        /* [B][n_kv*hd] */
    float *hb, *hb2;                     /* [B][hidden] */
    float *attn_scratch;                 /* [threads][ctx + 16] */
    int attn_scratch_ctx;
    kn_act act_dim, act_q, act_hidden;
} wk_model;

typedef struct {
    int ctx;                             /* positions available */
    int n;                               /* positions filled */
    int type;                            /* KN_KV_F16 (default) or KN_KV_F32 */
    void *k, *v;                         /* [n_layer][ctx][n_kv][hd] of type */
} wk_kv;

typedef struct {
    const char *model_path;
    const char *tokenizer_path;          /* llama2.c models: tokenizer.bin */
    int threads;                         /* 0: all online CPUs */
    int max_batch;                       /* prefill chunk, default 64 */
} wk_model_opts;

int wk_model_load(const wk_model_opts *o, wk_model **out, char *err, size_t errlen);
void wk_model_free(wk_model *m);

int wk_kv_create(const wk_model *m, int ctx, int type, wk_kv **out);
void wk_kv_free(wk_kv *kv);

/* Runs T tokens at positions kv->n.. and advances kv->n. logits gets
 * [T][vocab] when all_logits, else [vocab] for the last token.
 * LLM_ERANGE if the tokens do not fit the cache, LLM_EINVAL for an id
 * outside the vocabulary. */
int wk_forward(wk_model *m, wk_kv *kv, const int32_t *tokens, int T, float *logits, int all_logits);

#endif
