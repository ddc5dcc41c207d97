/*
 * cuda_check.h: CUDA status translation at the library edge (llm.c's cudaCheck with
 * the failing statement and file:line, NCCL's sticky-error reset).
 */
#ifndef TP_CUDA_CHECK_H
#define TP_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "status.h"

#define TP_CUDA_CHECK(call)                                                          \
    do {                                                                             \
        cudaError_t tp_cuda_err_ = (call);                                           \
        if (tp_cuda_err_ != cudaSuccess) {                                           \
            (void)cudaGetLastError();                                                \
            return tp_error(TP_ERR_CUDA, "%s failed: %s", #call,                     \
                            cudaGetErrorString(tp_cuda_err_));                       \
        }                                                                            \
    } while (0)

/* The same, jumping to a cleanup label with st set (NCCL's CHECKGOTO shape). */
#define TP_CUDA_CHECK_GOTO(call, st, label)                                          \
    do {                                                                             \
        cudaError_t tp_cuda_err_ = (call);                                           \
        if (tp_cuda_err_ != cudaSuccess) {                                           \
            (void)cudaGetLastError();                                                \
            (st) = tp_error(TP_ERR_CUDA, "%s failed: %s", #call,                     \
                            cudaGetErrorString(tp_cuda_err_));                       \
            goto label;                                                              \
        }                                                                            \
    } while (0)

#ifdef __cplusplus
extern "C" {
#endif
/* Run a one-thread kernel that writes value to *out and read it back: proves the GPU
 * executes code for the architecture this build targets. */
tp_status tp_cuda_probe(int device, int value, int *out);
#ifdef __cplusplus
}
#endif

#endif
