/* wk_lora.h - LoRA adapters over the loaded model (multi-LoRA, as vLLM's
 * --lora-modules): each adapter's low-rank factors of the projections it
 * targets, in this rank's share, and their deltas added to a step's rows
 * sequence by sequence, so requests of different adapters and of the base
 * model run in one batch (a segmented gather-matmul, as Punica / S-LoRA). */
#ifndef WK_LORA_H
#define WK_LORA_H

#include "wk_model.h"

#define WK_LORA_MAX_RANK 512 /* --max-lora-rank's ceiling (vLLM's largest) */

/* The projections an adapter may target, in the order of wk_lora.mat. */
enum { WK_LORA_Q, WK_LORA_K, WK_LORA_V, WK_LORA_O, WK_LORA_GATE, WK_LORA_UP, WK_LORA_DOWN, WK_LORA_N };

typedef struct {
    void *at;                 /* A transposed, [in_l][ldr]: this rank's input columns (all but for O and down
                                 under TP), zero past the rank */
    void *bt;                 /* [rank][out_l]: B transposed, this rank's output rows (all for O and down) */
    int half;                 /* both F16, as the file holds them (kept so: exact, and half the bytes a
                                 step reads); else F32 */
} wk_lora_mat;

typedef struct wk_lora {
    char name[64];
    char path[512];
    int rank;
    int ldr;                  /* the rank rounded up to KN_LORA_ALIGN: A's row stride */
    float scale;              /* lora_alpha / rank (/ sqrt(rank) with use_rslora) */
    int gguf;                 /* from a GGUF LoRA: B's Q/K rows in the GGUF converter's order */
    int n_layer;
    wk_lora_mat *mat;         /* [n_layer][WK_LORA_N]; a NULL at: not targeted */
    int refs;                 /* engine requests using it */
    int dead;                 /* unloaded: no new requests; freed once refs is 0 (wk_lora_collect) */
    unsigned gen;             /* the model's lora_version when loaded: its prefix-cache salt */
} wk_lora;

/* A PEFT adapter directory (adapter_config.json, adapter_model.safetensors), or a GGUF LoRA file
 * (llama.cpp's convert_lora_to_gguf), for model m, at most max_rank:
 * every config key honoured or known harmless, every tensor one of the projections above (Q/K rows put in
 * the GGUF's pair order when m's RoPE is), else refused by name. */
int wk_lora_load(const wk_model *m, const char *name, const char *dir, int max_rank, wk_lora **out, char *err,
                 size_t errlen);
void wk_lora_free(wk_lora *l);

/* The slot (1-based) of the live adapter called name, or 0. */
int wk_lora_find(const wk_model *m, const char *name);
/* A request's prefix-cache salt for adapter slot: the name's (cm_salt_lora, as the gateway routes by),
 * with the load's generation for an adapter loaded at run time (a name reused never meets old K/V). */
uint64_t wk_lora_salt(const wk_model *m, int slot, uint64_t salt);
/* Loads adapter name from the PEFT directory path into a free slot, on every rank of a tensor-parallel
 * group (rank 0 only: the others follow through the step plan, wk_lora_follow). 0, or an error with err filled:
 * LLM_EINVAL a live adapter has the name (or a bad name), LLM_EAGAIN all --max-loras slots are taken, LLM_EUNSUP LoRA
 * is off, or the load's own error. */
int wk_lora_add(wk_model *m, const char *name, const char *path, char *err, size_t errlen);
/* Unloads name: no new requests from now; its memory goes when the last request using it ends
 * (wk_lora_collect). LLM_ENOTFOUND when no live adapter has the name. */
int wk_lora_remove(wk_model *m, const char *name, char *err, size_t errlen);
/* A request takes (+1) or leaves (-1) slot's adapter. */
void wk_lora_ref(wk_model *m, int slot, int d);
/* Frees the unloaded adapters no request uses any more, on every rank: 0 or the group's error. */
int wk_lora_collect(wk_model *m);
/* A follower's side of an update (wk_forward_follow): 0, or the group's error. */
int wk_lora_follow(wk_model *m, int slot, const char *name, const char *path);

/* Groups a step's rows by adapter (s[i].lora, 1-based; 0: the base model) for wk_lora_apply: 1 when some
 * sequence has an adapter, 0 when none does (nothing to apply), or LLM_ENOMEM. Once per forward step. */
int wk_lora_group(wk_model *m, int n_seq, const wk_batch_seq *s);

/* One projection's output: y[T][out_l], projection `which`. */
typedef struct {
    int which;
    float *y;
    int out_l;
} wk_lora_out;

/* y[T][out_l] += scale (x A^T) B^T for each of the n outputs, on the rows of the step grouped by
 * wk_lora_group whose adapter targets that projection of layer l; x is [T][in_l], shared by the n (Q, K
 * and V; gate and up). One pass over the pool: each adapter's factors are read once per ITEM of rows. */
void wk_lora_apply(wk_model *m, int l, int n, const wk_lora_out *o, const float *x, int in_l);

void wk_lora_step_free(struct wk_lora_step *st);

#endif
