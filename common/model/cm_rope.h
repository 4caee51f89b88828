/* cm_rope.h - RoPE scaling as the ecosystem writes it: read from GGUF
 * metadata ({arch}.rope.scaling.*, and the rope_freqs.weight tensor of Llama
 * 3.x files) or a Hugging Face config.json's rope_scaling, and turned into
 * the per-pair inverse frequencies every backend rotates with (the CPU
 * kernels and the CUDA ones read the same table).
 *
 * Types: linear (positions divided by the factor), dynamic (NTK: the base
 * raised as vLLM does it, for the longest context the factor allows), yarn
 * (frequencies blended between interpolation and extrapolation by
 * wavelength, and q.k scaled by the attention factor squared), llama3
 * (low frequencies divided by the factor, high ones kept, a smooth blend
 * between). The longest context is what vLLM derives: max_position x
 * factor for linear and dynamic, original_max_position x factor for yarn,
 * max_position itself for llama3. Anything else is refused, naming it. */
#ifndef CM_ROPE_H
#define CM_ROPE_H

#include "cm_gguf.h"
#include "cm_model.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* {arch}.rope.scaling.* into c->rs (and c->ctx_len, c->attn_scale). */
int cm_rope_from_gguf(const cm_gguf *g, cm_model_config *c, char *err, size_t errlen);
/* A config.json's rope_scaling (NULL or null: none) into c->rs, after the
 * rest of c is filled (max_position_embeddings in ctx_len). what names the
 * source in errors ("config.json", "--rope-scaling"). */
int cm_rope_from_json(const json_t *rs, cm_model_config *c, const char *what, char *err, size_t errlen);
/* inv_freq[i] for i < rope_dim / 2: theta^(-2i/rope_dim) changed by the
 * scaling; factors (GGUF rope_freqs.weight: one divisor a pair) or NULL. */
void cm_rope_inv_freq(const cm_rope_scaling *rs, double theta, uint32_t rope_dim, const float *factors,
                      float *inv_freq);
/* The scaling's name ("none", "linear", ...). */
const char *cm_rope_type_name(int type);

#endif
