// kn_cuda_int.h - what the CUDA backend's .cu files share: error checks that
// log file and line and turn CUDA / cuBLAS failures into LLM_EDEVICE.
#ifndef KN_CUDA_INT_H
#define KN_CUDA_INT_H

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "cm_dtype.h"
#include "cm_error.h"
}
#include "cm_quant.h"

#define KN_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, cudaGetErrorName(e_), \
                    cudaGetErrorString(e_));                                                       \
            return LLM_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)
/* After a kernel launch or a cuBLAS call: the launch's own error, and with
 * LLMSERVE_CUDA_SYNC=1 in the environment a device-wide sync after each one,
 * so a fault is reported at the kernel that made it (file and line) rather
 * than at the next download. Debugging only: it serializes every step. */
int kn_cuda_after_launch(const char *file, int line);
#define KN_CUDA_LAUNCHED()                                                                         \
    do {                                                                                           \
        int r_ = kn_cuda_after_launch(__FILE__, __LINE__);                                         \
        if (r_) return r_;                                                                         \
    } while (0)
#define KN_CUBLAS_CHECK(call)                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: cuBLAS error %s\n", __FILE__, __LINE__, cublasGetStatusName(s_)); \
            return LLM_EDEVICE;                                                                    \
        }                                                                                          \
        KN_CUDA_LAUNCHED();                                                                        \
    } while (0)

/* Element i of a row stored in GGUF layout (F32, F16, BF16, and every
 * quantized type cm_quant.h decodes), dequantized in registers. For dense
 * types `row` may be a whole tensor and i a flat index. */
__device__ __forceinline__ float weight_at(int type, const uint8_t *row, int64_t i) {
    switch (type) {
    case CM_F32: return ((const float *)row)[i];
    case CM_F16: return __half2float(((const __half *)row)[i]);
    case CM_BF16: return __uint_as_float((uint32_t)((const uint16_t *)row)[i] << 16);
    default: return cm_quant_at(type, row, i);
    }
}

#endif
