/* cm_hf_quant.h - AWQ and GPTQ checkpoints (Hugging Face format) read into
 * GGUF blocks, so every backend runs them as it runs a GGUF file.
 *
 * A quantized linear layer is four tensors beside where "<prefix>.weight"
 * would be: qweight, qzeros, scales and (GPTQ) g_idx. For a layer of K
 * inputs and N outputs, groups of `group` inputs (K when the config says
 * -1) and pack = 32/bits values to an int32, lowest bits first:
 *
 *   GPTQ  qweight int32 [K/pack][N]    packed along K: input k of column n is
 *                                      field k%pack of qweight[k/pack][n]
 *         qzeros  int32 [G][N/pack]    packed along N; the stored zero is
 *                                      z-1 ("gptq", AutoGPTQ's v1) or z
 *                                      (checkpoint_format "gptq_v2")
 *         scales  fp16  [G][N]
 *         g_idx   int32 [K]            the group of each input (act-order
 *                                      checkpoints permute them)
 *         w[n][k] = scales[g][n] * (q - z[g][n]),  g = g_idx[k]
 *   AWQ   qweight int32 [K][N/8]       packed along N, 4 bits, the columns
 *         qzeros  int32 [G][N/8]       8c+{0,2,4,6,1,3,5,7} in fields 0..7
 *         scales  fp16  [G][N]         ("gemm" version)
 *         w[n][k] = scales[k/group][n] * (q - z[k/group][n])
 *
 * Each becomes exact GGUF blocks of 32 inputs: Q4_0 (every zero 8, d = s),
 * else Q4_1 (d = s, m = -s*z rounded to fp16), and Q8_0 for 8 bits (zero
 * 128 only: d = s, q - 128). Act-order inputs are sorted by group so each
 * block has one, and "<name>.perm" (int32 [K]) says which input each sorted
 * row was: the forward pass gathers x[perm[j]]. */
#ifndef CM_HF_QUANT_H
#define CM_HF_QUANT_H

#include "cm_model.h"
#include "cm_safetensors.h"

#include <jansson.h>

enum { CM_HFQ_NONE = 0, CM_HFQ_GPTQ = 1, CM_HFQ_AWQ = 2 };
enum { CM_HFQ_QWEIGHT, CM_HFQ_QZEROS, CM_HFQ_SCALES, CM_HFQ_GIDX, CM_HFQ_NPARTS };

typedef struct {
    int method;          /* CM_HFQ_* */
    int bits;            /* 4 or 8 (GPTQ), 4 (AWQ) */
    int group;           /* inputs per group; 0: the whole row */
    int zero_v2;         /* zeros stored as they are (gptq_v2, AWQ), not z-1 */
} cm_hfq_config;

/* config.json's quantization_config (absent: method NONE). Unknown methods,
 * versions and widths are refused by name. */
int cm_hfq_config_parse(json_t *config, cm_hfq_config *q, char *err, size_t errlen);
/* Which part a tensor name is (CM_HFQ_*), with base = the name with
 * ".weight" in place of the part's suffix; -1 when it is none. */
int cm_hfq_part(const char *name, char *base, size_t len);
/* One linear from its parts (g_idx may be NULL) into w (and perm, whose
 * data stays NULL without act-order); the blocks are allocated into *buf_w,
 * the permutation into *buf_perm, both the caller's to free. */
int cm_hfq_convert(const cm_hfq_config *q, const cm_st_tensor *const part[CM_HFQ_NPARTS], const char *name,
                   cm_tensor_ref *w, cm_tensor_ref *perm, void **buf_w, void **buf_perm, char *err, size_t errlen);

#endif
