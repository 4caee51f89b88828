/* wk_cuda.h - the llama-family forward pass on the CUDA backend: weights,
 * activations and the paged KV cache in device memory, every op a kernel
 * from kernels/cuda (each checked against its CPU reference there). The
 * model picks it at load (wk_model_opts.device); wk_forward_batch and the
 * cache functions hand over to it, so the engine above does not change.
 * In a build without CUDA, loading with WK_DEV_CUDA fails with a message. */
#ifndef WK_CUDA_H
#define WK_CUDA_H

#include "wk_model.h"

/* Uploads the weights (GGUF blocks as stored; dummy F16 / BF16 matrices are
 * made on the device) and allocates activations for m->max_batch tokens. */
int wk_cuda_load(wk_model *m, char *err, size_t errlen);
void wk_cuda_free(wk_model *m);
/* One step, as wk_forward_batch (already validated); logits come back to
 * the host rows the caller asked for. */
int wk_cuda_forward(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len, float *logits);
/* Pipeline stages on the GPU, host-staged (one rank a stage): this stage's layers over a step whose rows
 * came from the stage before in m->x (stage 0: embeds the tokens); max_len is the step's longest sequence,
 * as wk_cuda_forward's. A stage before the last leaves its rows in m->x for the CPU wires to carry on; the
 * last keeps them on the device for wk_cuda_head, which runs the final norm and the LM head over the n rows
 * that want logits into out ([n][vocab]). */
int wk_cuda_layers(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len);
int wk_cuda_head(wk_model *m, int n, float *out);
int wk_cuda_alloc(void **d, size_t bytes);
void wk_cuda_release(void *d);
void wk_cuda_cache_copy(wk_cache *c, int src, int dst);
/* KV blocks that --gpu-memory-utilization leaves on the device now that the
 * weights and activations are allocated (their peak: nothing is allocated
 * per step). LLM_ENOMEM with why in err when not one block fits. */
int wk_cuda_kv_blocks(const wk_model *m, double utilization, size_t block_bytes, long *n_blocks, char *err,
                      size_t errlen);

/* Device memory in use (total - free), for the worker's stats. */
int wk_cuda_mem_used(uint64_t *bytes);

/* A step's metadata for the device, in one int32 array of
 * wk_step_meta_size entries: token ids [T], positions [T], row -> sequence
 * [T], K/V slots (block * block_size + offset) [T], rows that want logits
 * [T, the first return-value entries used], each sequence's offset into the
 * block tables [n_seq], the block tables (each cut to the blocks the step
 * touches). Returns how many rows want logits. Host code: tested on CPUs. */
size_t wk_step_meta_size(const wk_cache *c, int n_seq, const wk_batch_seq *s, int T);
int wk_step_meta(const wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int32_t *out);

#endif
