/* cm_model.h - one model description filled from either file format.
 *
 * A cm_model_file maps a GGUF file or a llama2.c .bin checkpoint and exposes
 * its hyper-parameters as a cm_model_config and its weights as tensors named
 * the GGUF way ("token_embd.weight", "blk.3.attn_q.weight", ...), so the
 * forward pass never knows which format it came from. */
#ifndef CM_MODEL_H
#define CM_MODEL_H

#include "cm_gguf.h"

#include <stddef.h>
#include <stdint.h>

enum { CM_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): llama in GGUF, llama2.c */
       CM_ROPE_NEOX = 1  /* rotate halves (x[i], x[i+d/2]): qwen2, gpt-neox */ };

/* RoPE scaling (cm_rope.h). */
enum { CM_RS_NONE = 0, CM_RS_LINEAR, CM_RS_DYNAMIC, CM_RS_YARN, CM_RS_LLAMA3 };

typedef struct {
    int type;            /* CM_RS_* */
    float factor;        /* how many times the original context */
    uint32_t orig_ctx;   /* the context the model was trained at (original_max_position_embeddings) */
    float low_freq_factor, high_freq_factor; /* llama3 */
    float beta_fast, beta_slow;              /* yarn: the blend's ends, in rotations over orig_ctx */
    int truncate;                            /* yarn: the blend's ends rounded out to whole pairs */
    float mscale;        /* yarn's attention factor: cos and sin times it, so q.k times its square (1: none) */
} cm_rope_scaling;

enum { CM_FMT_GGUF = 1, CM_FMT_LLAMA2C = 2, CM_FMT_DUMMY = 3, CM_FMT_HF = 4 };

/* How an encoder's token states become one sentence embedding. */
enum { CM_POOL_CLS = 0, CM_POOL_MEAN = 1, CM_POOL_LAST = 2 };

typedef struct {
    char arch[32];
    char name[96];
    uint32_t n_layer, dim, n_head, n_kv_head, head_dim, hidden, vocab, ctx_len;
    uint32_t rope_dim;   /* leading dims of each head that rotate (= head_dim usually) */
    int rope_type;
    float rope_theta, norm_eps;
    int tied;            /* LM head is the token embedding */
    int qkv_bias;        /* attn_q/k/v have bias vectors (qwen2) */
    /* encoders (bert): bidirectional attention, learned absolute positions,
     * post-LayerNorm with biases, GELU; no KV cache, no LM head */
    int encoder;
    uint32_t n_types;    /* token type vocabulary (segment embeddings), 0: none */
    int gelu_tanh;       /* GELU by its tanh approximation ("gelu_new"), not erf */
    int pooling;         /* CM_POOL_*: the checkpoint's sentence-transformers pooling (default CLS) */
    int normalize;       /* L2-normalise the pooled embedding */
    uint32_t max_seq;    /* longest input the embedding model takes (<= ctx_len) */
    /* Gemma 3 (gemma3): the embedding scaled by sqrt(dim), GeGLU (tanh GELU), RMS norms after the
     * attention and the FFN (post_attention_norm, post_ffw_norm) and of each query and key head
     * (attn_q_norm, attn_k_norm); local layers attend to the last swa_window positions, with RoPE
     * base rope_theta_swa; every swa_period-th layer (l+1 a multiple) is global, its positions
     * scaled by rs (the local layers never are) */
    int gemma;
    uint32_t swa_window, swa_period;
    float rope_theta_swa;
    cm_rope_scaling rs;  /* RoPE scaling (cm_rope.h); for gemma3, of the global layers */
    int qk_norm;         /* an RMS norm of each query and key head before RoPE (attn_q_norm, attn_k_norm):
                          * gemma3, qwen3, qwen3moe */
    /* mixture of experts (Mixtral: llama with experts; qwen3moe): every layer's FFN is n_expert experts
     * of `hidden` columns each; a router (ffn_gate_inp) scores them per token, a softmax over all of them
     * weighs the n_expert_used best, renormalised to sum 1 when expert_norm. 0: a dense FFN */
    uint32_t n_expert, n_expert_used;
    int expert_norm;
    /* gpt-oss (gpt-oss): experts as above (top n_expert_used router logits, softmaxed among themselves) with
     * biases on the router and on each expert's gate, up and down; attention sinks (blk.N.attn_sinks.weight,
     * a logit a head that joins the softmax without a value); a bias on the attention output; every other
     * layer local (swa_window, swa_period 2, the same RoPE as the global ones); the FFN's input norm is
     * post_attention_norm; the clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
     * (u + 1) * g * sigmoid(alpha * g) */
    int gpt_oss;
    float swiglu_alpha, swiglu_limit;
    float attn_scale;    /* softmax scale of the scores; 0: 1/sqrt(head_dim) */
} cm_model_config;

typedef struct {
    char name[64];
    int type;            /* enum cm_dtype */
    uint32_t n_dims;
    uint64_t ne[4];      /* ne[0] contiguous */
    const void *data;
    uint64_t nbytes;
    int used;            /* looked up (cm_model_tensor): a loader checks none is left unused */
} cm_tensor_ref;

typedef struct cm_model_file {
    int format;
    char path[512];
    cm_gguf *gguf;       /* CM_FMT_GGUF */
    void *map;           /* CM_FMT_LLAMA2C mapping */
    size_t map_size;
    int map_borrowed;    /* cm_model_open_mem: the caller's memory, not unmapped */
    void *owned;         /* CM_FMT_DUMMY: the tensors' memory */
    size_t owned_size;
    cm_model_config cfg;
    cm_tensor_ref *tensors;
    size_t n_tensors;
    struct cm_safetensors **st; /* CM_FMT_HF: the checkpoint's files */
    int n_st;
    void **bufs;         /* CM_FMT_HF: AWQ / GPTQ layers converted to GGUF blocks, owned */
    int n_bufs;
    int hf_quant;        /* CM_FMT_HF: the checkpoint's quantization (CM_HFQ_* of cm_hf_quant.h) */
} cm_model_file;

/* Opens by content: GGUF magic, else a llama2.c checkpoint; a directory is
 * a Hugging Face checkpoint (cm_hf.c). err gets one line naming the file and
 * the problem. */
int cm_model_open(const char *path, cm_model_file **out, char *err, size_t errlen);
/* The same over caller-owned memory (tests, fuzzing), which must outlive the
 * result; name stands for the path in errors. */
int cm_model_open_mem(const void *data, size_t size, const char *name, cm_model_file **out, char *err, size_t errlen);
/* A GGUF or llama2.c file (cm_model_gguf.c): cm_model_open without the directory case. */
int cm_model_open_file(const char *path, cm_model_file **out, char *err, size_t errlen);
void cm_model_close(cm_model_file *m);
/* NULL when absent. Marks the tensor used. */
const cm_tensor_ref *cm_model_tensor(const cm_model_file *m, const char *name);
/* The name of a tensor no lookup has asked for (one the loader would
 * ignore), or NULL. */
const char *cm_model_unused_tensor(const cm_model_file *m);
/* Checks a tensor exists with shape [ne0, ne1] (ne1 = 1 for vectors). */
int cm_model_tensor_expect(const cm_model_file *m, const char *name, uint64_t ne0, uint64_t ne1,
                           const cm_tensor_ref **out, char *err, size_t errlen);

/* The name the API serves a model under when none is given: the file name
 * without ".gguf", or "dummy-" and the config's name for dummy weights
 * (dummy_config non-NULL). Gateway and worker must agree on it. */
void cm_model_served_name(const char *model_path, const char *dummy_config, char *out, size_t len);

/* Checks hyper-parameters are plausible (sizes, divisibility, rope, eps). */
int cm_model_validate_config(const cm_model_config *c, char *err, size_t errlen);

/* ---- Hugging Face checkpoints (cm_hf.c) ---------------------------------- */
/* A directory with config.json and model.safetensors (or shards listed in
 * model.safetensors.index.json), F32/F16/BF16, or AWQ / GPTQ layers
 * (quantization_config), converted to Q4_0 / Q4_1 / Q8_0 blocks at load
 * (cm_hf_quant.h; act-order layers add "<name>.perm" tensors). Tensors are renamed the GGUF
 * way (llama: token_embd, blk.N.attn_q ...; bert: as llama.cpp's BERT GGUFs,
 * token_embd, position_embd, token_types, token_embd_norm, blk.N.attn_q,
 * attn_output_norm, ffn_up, ffn_down, layer_output_norm). Llama-family
 * weights keep Hugging Face's rotate-halves RoPE layout (CM_ROPE_NEOX).
 * sentence-transformers files (modules.json, the pooling config,
 * sentence_bert_config.json) set pooling, normalize and max_seq. */
int cm_hf_open(const char *dir, cm_model_file **out, char *err, size_t errlen);
/* A file name a checkpoint's JSON may name inside its directory: no '/',
 * not starting with '.', printable ASCII. */
int cm_hf_safe_name(const char *name);

/* ---- shapes without a checkpoint (cm_model_dummy.c) --------------------- */
/* Built-in shapes (cm_model_preset_names; case-insensitive). 0 or LLM_ENOTFOUND. */
int cm_model_preset(const char *name, cm_model_config *out);
const char *cm_model_preset_names(void);
/* From a Hugging Face config.json (llama / mistral / qwen2 / bert keys; cm_hf_config.c): every key
 * honoured or known not to change the math, any other refused by name. */
int cm_model_config_json(const char *path, cm_model_config *out, char *err, size_t errlen);
/* A preset name, else a config.json path. */
int cm_model_config_resolve(const char *spec, cm_model_config *out, char *err, size_t errlen);
/* Random weights of cfg's real shape, matrices in wtype (F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1), norms 1, uniform in +-1/sqrt(row length); the same
 * seed gives the same weights. A model file like any other (CM_FMT_DUMMY),
 * freed by cm_model_close. With CM_DUMMY_DEVICE_MATRICES, matrices other
 * than F32 have data NULL: a GPU backend fills them where they live. */
enum { CM_DUMMY_DEVICE_MATRICES = 1 };
int cm_model_dummy(const cm_model_config *cfg, int wtype, uint64_t seed, unsigned flags, cm_model_file **out,
                   char *err, size_t errlen);

#endif
