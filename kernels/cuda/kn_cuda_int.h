// kn_cuda_int.h - what the CUDA backend's .cu files share: error checks that
// log file and line and turn CUDA / cuBLAS failures into LLM_EDEVICE.
#ifndef KN_CUDA_INT_H
#define KN_CUDA_INT_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

#define KN_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, cudaGetErrorName(e_), \
                    cudaGetErrorString(e_));                                                       \
            return LLM_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)
#define KN_CUDA_LAUNCHED() KN_CUDA_CHECK(cudaGetLastError())
#define KN_CUBLAS_CHECK(call)                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: cuBLAS error %s\n", __FILE__, __LINE__, cublasGetStatusName(s_)); \
            return LLM_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)

#endif
