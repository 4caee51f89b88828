/* wk_bert.h - the BERT-family encoder on the CPU backend: sentence
 * embeddings.
 *
 * Learned absolute positions and token types, post-LayerNorm blocks with
 * biases, GELU, bidirectional attention; the token states are pooled (mean,
 * CLS or last token, as the checkpoint's sentence-transformers config says)
 * and L2-normalised when it says so. Several inputs share each step: every
 * matmul is one GEMM over all their tokens, attention stays inside each
 * input. Weights go through the same kernels as the decoder's. */
#ifndef WK_BERT_H
#define WK_BERT_H

#include "cm_model.h"
#include "cm_tokenizer.h"
#include "kernels.h"

typedef struct {
    kn_weight wq, wk, wv, wo, up, down;
    const float *bq, *bk, *bv, *bo, *bup, *bdown;  /* biases */
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;      /* after attention, after the FFN */
} wk_bert_layer;

typedef struct wk_encoder {
    cm_model_file *file;
    cm_model_config cfg;
    cm_tokenizer *tok;
    kn_pool *pool;
    int pool_borrowed;
    kn_weight tok_embd, pos_embd, type_embd;
    const float *embd_ln_w, *embd_ln_b;
    wk_bert_layer *layers;
    float **owned;                       /* vectors converted to f32 */
    int n_owned;
    int max_tokens;                      /* tokens per step */
    /* activations for max_tokens tokens */
    float *x;                            /* [T][dim] */
    float *q, *k, *v, *att, *tmp;        /* [T][dim] */
    float *h;                            /* [T][hidden] */
    float *scratch;                      /* [threads][max_seq] attention scores */
    kn_act act_dim, act_hidden;
} wk_encoder;

typedef struct {
    const char *model_path;              /* a Hugging Face directory (or a file cm_model_open takes) */
    int threads;                         /* 0: all online CPUs */
    int max_tokens;                      /* tokens per step; 0: 2048 (at least the longest input) */
    kn_pool *pool;                       /* set: run on this pool (which must outlive the encoder) */
} wk_encoder_opts;

/* Refuses a model that is not an encoder, and one whose tokenizer or
 * tensors do not match its config. */
int wk_encoder_load(const wk_encoder_opts *o, wk_encoder **out, char *err, size_t errlen);
void wk_encoder_free(wk_encoder *e);
/* The longest input in tokens ([CLS] and [SEP] included). */
int wk_encoder_max_len(const wk_encoder *e);

/* Embeds n inputs (tokens[i][0..len[i]), each 1..max_len) into out[n][dim].
 * LLM_EINVAL for a token id outside the vocabulary, LLM_ERANGE for an input
 * too long or empty. The result of one input does not depend on the
 * others it shares a step with. */
int wk_encode(wk_encoder *e, int n, const int32_t *const *tokens, const int *len, float *out);

#endif
