/*
 * matmul.h: y = x @ w^T + bias through cuBLASLt, or for n <= 8 rows the GEMV of gemv.cu,
 * for backend_cuda.c. The state is the cuBLASLt handle, its workspace, a scratch buffer
 * for dtype conversions, a small table of the algorithms chosen so far (one heuristic
 * query per shape and layout), the GPU's SM count and which products the GEMV takes
 * (TPINFER_GEMV in the environment when the state is created; unset: none, or those of one
 * row where tp_cuda_gemm_one_row says).
 */
#ifndef TP_CUDA_MATMUL_H
#define TP_CUDA_MATMUL_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_cuda_gemm tp_cuda_gemm;

/* On the current device: workspace_bytes for cuBLASLt, scratch_bytes for conversions. */
tp_status tp_cuda_gemm_create(size_t workspace_bytes, size_t scratch_bytes, tp_cuda_gemm **out);
void tp_cuda_gemm_destroy(tp_cuda_gemm *g); /* accepts NULL; the caller has synchronised */

/* on = 1: 16-bit products of shapes first seen from now on (outside graph recordings) try
 * cuBLASLt's first candidates in turn, each call timed, and *count (may be NULL) is how many
 * calls of a shape time them all; on = 0: each such shape keeps its fastest (waits for the
 * timed calls), and *count is how many shapes were chosen by their times. Only eager steps
 * should run in between. */
tp_status tp_cuda_gemm_tune(tp_cuda_gemm *g, int on, int *count);

/* Products of one row from now on through the GEMV (gemv = 1, as TPINFER_GEMV=one) or
 * cuBLASLt (0); 1 where it applies, 0 where TPINFER_GEMV was set (that choice stands). */
int tp_cuda_gemm_one_row(tp_cuda_gemm *g, int gemv);

/* y [n, m] = x [n, k] @ w [m, k]^T + bias [1, m] (bias may be NULL), enqueued on stream.
 * Shapes and dtypes (f32/f16/bf16, any mix) were validated by the caller. */
tp_status tp_cuda_matmul(tp_cuda_gemm *g, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                         const tp_tensor *y, cudaStream_t stream);

/* y [n, m] += x [n, k] @ w [m, k]^T in the product's epilogue (beta 1 on y); y is f32.
 * Validated by the caller. */
tp_status tp_cuda_matmul_add(tp_cuda_gemm *g, const tp_tensor *x, const tp_tensor *w, const tp_tensor *y,
                             cudaStream_t stream);

/* out [n, m] = silu(gate) * up where [gate | up] = x [n, k] @ w [2m, k]^T + bias [1, 2m]
 * (bias may be NULL): the fused GEMV for small n, else the matmul into gate_up [n, 2m]
 * and the swiglu kernel. Shapes and dtypes were validated by the caller. */
tp_status tp_cuda_matmul_swiglu(tp_cuda_gemm *g, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                                const tp_tensor *gate_up, const tp_tensor *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
