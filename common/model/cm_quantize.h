/* cm_quantize.h - float rows into the GGUF block formats (the inverse of
 * cm_quant.h), for `llmserve quantize`.
 *
 * Each block's scales are chosen to minimise the weighted squared error of
 * the dequantized values, sum_i w_i (x_i - deq_i)^2: a search over candidate
 * scales around the range's, each refitted by least squares given its
 * rounding, the best kept; the K-quants then quantize their sub-block scales
 * (6, 8 or 4 bits against a super-block scale) and round the values again
 * against the scales they will be read with. w is the importance of each
 * column (an importance matrix: the mean squared activation feeding it), or
 * NULL for all 1. The formats and the search are ours, written from the
 * block layouts; only the layouts are llama.cpp's. */
#ifndef CM_QUANTIZE_H
#define CM_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

/* Whether cm_quantize_row can write the type: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
 * Q2_K Q3_K Q4_K Q5_K Q6_K, F16, BF16, F32. */
int cm_quantize_supported(int type);
/* x[n] -> out (cm_dtype_row_bytes(type, n) bytes); n a multiple of the
 * type's block. imp[n] or NULL. LLM_EINVAL for a bad n, LLM_EUNSUP. */
int cm_quantize_row(int type, const float *x, int64_t n, const float *imp, void *out);

#endif
