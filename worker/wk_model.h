/* wk_model.h - the llama-family forward pass on the CPU backend.
 *
 * Handles GQA, tied or untied embeddings, QKV bias (qwen2), RoPE in both
 * conventions with theta from metadata. wk_forward takes any number of
 * tokens of one sequence: a prompt is processed max_batch tokens at a time
 * (prefill: every matmul is a GEMM over the chunk), a decode step is T = 1.
 * Several sequences share one step (wk_forward_batch); K/V live in a paged
 * block pool. */
#ifndef WK_MODEL_H
#define WK_MODEL_H

#include "cm_model.h"
#include "cm_tokenizer.h"
#include "kernels.h"
#include "wk_comm.h"

typedef struct {
    kn_weight wq, wk, wv, wo, gate, up, down;
    const float *attn_norm, *ffn_norm;   /* [dim] */
    const float *bq, *bk, *bv;           /* [n_head*hd], [n_kv*hd], or NULL */
    /* Gemma 3: norms after attention and FFN [dim], of each query and key head [hd], or NULL */
    const float *post_attn_norm, *post_ffn_norm, *q_norm, *k_norm;
    int window;                          /* sliding window (local layers), 0: global */
    /* mixture of experts (cfg.n_expert): the router [n_expert][dim] (replicated on every rank) and each
     * expert's gate, up and down, this rank's FFN columns of each as in a dense layer; gate/up/down unused */
    kn_weight router;
    kn_weight *xgate, *xup, *xdown;      /* [n_expert] */
    const float *inv_freq;               /* the layer's RoPE frequencies (local and global differ) */
    /* gpt-oss: the attention output's bias [dim] (added by the rank holding head 0), this rank's heads'
     * sinks [n_head_l], the router's bias [n_expert], and the experts' biases, whole: gate and up
     * [n_expert][hidden] (this rank adds its columns), down [n_expert][dim] (added by the rank holding
     * column 0 of the expert); each NULL when absent */
    const float *bo, *sinks, *router_b, *xgate_b, *xup_b, *xdown_b;
} wk_layer;

enum { WK_DEV_CPU = 0, WK_DEV_CUDA = 1 };

typedef struct wk_model {
    cm_model_file *file;
    int device;                          /* WK_DEV_*: where the weights, activations and KV cache live */
    int quant;                           /* WK_QUANT_* */
    struct wk_cuda *cu;                  /* the CUDA backend's state (wk_cuda.c), or NULL */
    cm_model_config cfg;
    cm_tokenizer *tok;
    kn_pool *pool;
    int pool_borrowed;                   /* the pool is another model's (wk_model_opts.pool) */
    kn_weight tok_embd, output;
    const float *output_norm;
    wk_layer *layers;
    float *inv_freq;                     /* [rope_dim/2] */
    float *inv_freq_swa;                 /* [rope_dim/2] local layers' (Gemma 3), or NULL */
    float **owned;                       /* norms converted to f32 */
    int n_owned;
    int max_batch;
    /* activations, sized once for max_batch tokens */
    float *x, *xb, *xb2;                 /* [B][dim] */
    float *q, *att;                      /* [B][n_head*hd] */
    float *k, *v;                        /* [B][n_kv*hd] */
    float *hb, *hb2;                     /* [B][hidden] */
    float *attn_scratch;                 /* [threads][kn_attention_scratch(attn_scratch_len)] */
    int attn_scratch_len;
    int *tok_pos;                        /* [B] position of each token of a step */
    const int32_t **tok_blocks;          /* [B] its sequence's block table */
    kn_attn_seq *attn_seq;               /* [B] */
    kn_act act_dim, act_q, act_hidden;
    /* mixture of experts: the router's scores [B][n_expert], each token's chosen experts and weights
     * [B][n_expert_used], one expert's tokens gathered [B][dim] and its output [B][dim] */
    float *moe_logits, *moe_w, *moe_x, *moe_y;
    int *moe_e, *moe_rows, *moe_slot;
    /* act-order GPTQ weights read their input gathered (kn_weight.perm): [B][perm_k] */
    float *xperm;
    kn_act act_perm;
    int perm_k;                          /* the longest input of such a weight, 0: none */
    const int32_t *recent_perm[3];       /* the last distinct ones loaded: q/k/v (gate/up) share theirs */
    uint64_t recent_k[3];                /* their lengths */
    /* tensor parallelism: this rank's share (everything when tp_size is 1).
     * Query heads [head0, head0+n_head_l) with their KV heads
     * [kv0, kv0+n_kv_l), FFN columns [hid0, hid0+hidden_l), vocabulary rows
     * [voc0, voc0+vocab_l) of the LM head. */
    int tp_rank, tp_size;
    wk_comm *comm;                       /* this stage's TP group (tp_size ranks), or NULL */
    /* pipeline parallelism (--pipeline-parallel-size): this rank is stage pp_rank of pp_size and holds
     * layers [layer0, layer1) (their weights and KV only); stage 0 embeds, the last stage computes the
     * logits. The stages' first ranks pass the step's hidden rows to the next stage over their pair
     * (prev, next: wk_comm_pipeline), the last stage's logits go back to stage 0 over the ring pair, and
     * each first rank hands what reaches it on to its stage's comm; stage 0's first rank drives (pp_size
     * 1: every layer, no pairs) */
    wk_comm *prev, *next, *ring;
    int pp_rank, pp_size, layer0, layer1;
    int gpu;                             /* CUDA pipeline stages: this rank's GPU (wk_model_opts.gpu) */
    struct wk_back *back;                /* the last stage's first rank, overlapped: the sender of the
                                          * logits back over the ring (wk_wire.h) */
    int head0, n_head_l, kv0, n_kv_l, hid0, hidden_l, voc0, vocab_l;
    /* experts [exp0, exp1) live on this rank (all of them but under --enable-expert-parallel, where
     * each is whole on one rank and hid0/hidden_l cover every column) */
    int exp0, exp1, expert_parallel;
    int *voc_width;                      /* [tp_size] vocabulary rows per rank */
    float *lm_local;                     /* [lm_rows][vocab_l] before the gather */
    int lm_rows;
    void **slices;                       /* K-sliced weight copies, owned */
    int n_slices;
    int32_t *plan;                       /* step plan buffer (tensor parallel) */
    size_t plan_cap;
    struct wk_batch_seq *plan_seqs;      /* [max_batch] */
    double plan_t;                       /* rank 0: when it last sent the ranks anything (cm_now) */
    /* LoRA adapters (--lora-modules), applied per sequence of a step (wk_lora.h) */
    struct wk_lora **loras;              /* [max_loras] slots; NULL: free */
    int n_loras;                         /* slots [0, n_loras) may be in use */
    int max_loras, max_lora_rank;        /* 0 max_loras: LoRA off (no --enable-lora) */
    unsigned lora_version;               /* changes with every load and unload */
    struct wk_lora_step *lora_step;      /* the current step's rows grouped by adapter (wk_lora_group) */
    /* called with every matmul's input rows x [T][w->k] before it runs (llmserve imatrix), or NULL */
    void (*act_hook)(void *ctx, const kn_weight *w, const float *x, int T);
    void *act_hook_ctx;
} wk_model;

typedef struct {
    const char *model_path;
    const char *tokenizer_path;          /* llama2.c models: tokenizer.bin */
    int threads;                         /* 0: all online CPUs */
    int max_batch;                       /* tokens per step (prefill chunk), default 64 */
    wk_comm *comm;                       /* tensor parallel group (this rank's stage), or NULL */
    int pp_size;                         /* pipeline stages (0 or 1: none) */
    int pp_rank;                         /* this rank's stage */
    const wk_comm_pipe *pipe;            /* the pipeline's wires (wk_comm_pipeline): its pairs are used */
    int gpu;                             /* CUDA, pipeline stages: this rank's GPU on its host (modulo those
                                          * visible; TP ranks take theirs in the NCCL communicator) */
    const char *model_config;            /* set: dummy weights of this preset / config.json shape */
    int dummy_type;                      /* their cm_dtype (CM_F32 is 0: flags default to F16) */
    uint64_t seed;                       /* their seed */
    int device;                          /* WK_DEV_CPU (default) or WK_DEV_CUDA */
    int dummy_on_host;                   /* CUDA: make dummy weights on the host as the CPU does (tests
                                          * comparing devices), not on the GPU (fast, the default) */
    int quant;                           /* WK_QUANT_*: weights re-quantized at load (CUDA) */
    kn_pool *pool;                       /* set: run on this thread pool (another model's, which must
                                          * outlive this one) instead of starting one */
    const char *rope_scaling;            /* --rope-scaling: a rope_scaling JSON object for a model without one */
    int expert_parallel;                 /* --enable-expert-parallel: experts whole, a share on each rank */
    int lora_on;                         /* --enable-lora: adapters at start and at run time */
    const char *const *lora_modules;     /* [n_lora_modules] "NAME=PATH" (PEFT directories) */
    int n_lora_modules;
    int max_loras;                       /* 0: 8 */
    int max_lora_rank;                   /* 0: 16 */
} wk_model_opts;

/* FP8: float weights re-quantized to E4M3 at load (CUDA). AWQ / GPTQ: the checkpoint must be
 * one (they are read from its config.json either way; the flag only insists, as vLLM's does). */
enum { WK_QUANT_NONE = 0, WK_QUANT_FP8 = 1, WK_QUANT_AWQ = 2, WK_QUANT_GPTQ = 3 };

int wk_model_load(const wk_model_opts *o, wk_model **out, char *err, size_t errlen);
/* --pipeline-parallel-size P of a model of n_layer layers (0: not known yet): refused by name where it
 * cannot run (LLM_EUNSUP and err), before a group forms for it. */
int wk_model_pp_check(int pp, int n_layer, char *err, size_t errlen);
void wk_model_free(wk_model *m);

/* The KV cache: a pool of blocks of block_size positions per layer.
 * Layer l's K blocks start at k + l * n_blocks * block_stride, each holding
 * [block_size][n_kv][hd] elements of type; V the same. Which block holds
 * which positions of which sequence is the block manager's business
 * (wk_blocks.h); the forward pass only follows block tables. */
typedef struct wk_cache {
    int type;                            /* KN_KV_F16 (default), KN_KV_F32 or KN_KV_FP8 */
    int device;                          /* k and v are device memory (the model's WK_DEV_CUDA) */
    int block_size, block_shift, n_blocks, n_layer;
    size_t block_stride;                 /* bytes of one block of one layer (K or V) */
    char *k, *v;
    /* tensor parallel rank 0: copies to replay on the other ranks */
    int record_copies, n_copies, cap_copies;
    int32_t *copies;                     /* [n_copies][2] src, dst */
} wk_cache;

/* Bytes of K and V per token on this rank: 2 x layers x local kv_heads x
 * head_dim x dtype. */
size_t wk_kv_bytes_per_token(const wk_model *m, int type);
/* block_size: a power of two. */
int wk_cache_create(const wk_model *m, int type, int block_size, int n_blocks, wk_cache **out);
void wk_cache_free(wk_cache *c);
/* Copies block src to dst in every layer (copy-on-write of a shared block). */
void wk_cache_copy(wk_cache *c, int src, int dst);

/* One sequence's part of a step: n tokens at positions pos0..pos0+n-1.
 * blocks covers positions 0..pos0+n-1. Logits are produced for tokens
 * logits_from..n-1 (n: none). */
typedef struct wk_batch_seq {
    const int32_t *tokens;
    int n, pos0;
    const int32_t *blocks;
    int logits_from;
    int lora;                            /* its LoRA adapter, 1-based into wk_model.loras; 0: the base model */
} wk_batch_seq;

/* Runs one step over several sequences: every matmul is one GEMM over all
 * their tokens (at most m->max_batch in total), attention reads each
 * sequence's blocks. logits gets one [vocab] row per requested token, in
 * sequence order. A token's result does not depend on the other sequences
 * in the step. LLM_EINVAL for a bad id, LLM_ERANGE past the model context or
 * the batch capacity. */
int wk_forward_batch(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, float *logits);

/* Tensor parallelism. Rank 0's wk_forward_batch first broadcasts the step
 * (with the cache's recorded copy-on-write copies); the other ranks call
 * wk_forward_follow in a loop, which receives one step, replays its copies
 * and runs it on their shard. wk_forward_shutdown (rank 0) ends the loop
 * (*shutdown = 1). LLM_EIO when a rank died, LLM_EFORMAT for a bad plan. */
int wk_forward_follow(wk_model *m, wk_cache *c, int *shutdown);
/* Pipeline stages, overlapped (rank 0): stage 0's layers over this step (n_seq 0: none), its plan and rows
 * sent to stage 1, then the logits of the oldest step in flight (prev_rows rows into prev; 0: none), which
 * the later stages finished while stage 0 computed; they come back in the order the steps went down. The
 * caller keeps the steps' sequences apart (a sequence in one step in flight at most). */
int wk_forward_pp(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, float *prev, int prev_rows);
int wk_forward_shutdown(wk_model *m);
/* A step plan's header is {WK_PLAN_MAGIC, n_seq, copies, words}; an n_seq of WK_PLAN_LORA is a LoRA
 * update instead ({.., slot, bytes of "name\0path\0"}, then those bytes; wk_lora.c sends it, and
 * wk_forward_follow hands it to wk_lora_follow). */
#define WK_PLAN_MAGIC 0x4c504c4e
#define WK_PLAN_LORA (-2)
/* Rank 0, idle: once a quarter of the group's collective deadline has
 * passed since it last sent the ranks a step, an empty step that keeps them
 * within it (wk_forward_follow returns with nothing run). Nothing without
 * tensor parallelism or a deadline; 0 or LLM_EIO. */
int wk_forward_keepalive(wk_model *m);

/* A single sequence with a private cache of ctx positions (generate,
 * perplexity, tests): blocks 0, 1, 2 ... in order. */
typedef struct {
    int ctx;                             /* positions available */
    int n;                               /* positions filled */
    int type;
    wk_cache *cache;
    int32_t *blocks;
} wk_kv;

int wk_kv_create(const wk_model *m, int ctx, int type, wk_kv **out);
void wk_kv_free(wk_kv *kv);

/* Runs T tokens at positions kv->n.. and advances kv->n. logits gets
 * [T][vocab] when all_logits, else [vocab] for the last token.
 * LLM_ERANGE if the tokens do not fit the cache, LLM_EINVAL for an id
 * outside the vocabulary. */
int wk_forward(wk_model *m, wk_kv *kv, const int32_t *tokens, int T, float *logits, int all_logits);

#endif
