/*
 * backend_cuda.h: the CUDA backend's constructor. src/ includes this only under
 * #ifdef HAVE_CUDA (the backend registry in backend.c).
 */
#ifndef TP_BACKEND_CUDA_H
#define TP_BACKEND_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend of GPU device (an index among the visible ones) with activations of
 * act_dtype (TP_DTYPE_BF16 normally; F16 or F32). It makes device current for the
 * calling thread, and its operations must be called from a thread where it is current.
 * TP_ERR_UNAVAILABLE when there is no GPU or no such device; TP_ERR_INVALID_ARG for an
 * act_dtype that is not a float type. */
tp_status tp_backend_cuda_create(int device, tp_dtype act_dtype, tp_backend **out);

#ifdef __cplusplus
}
#endif
#endif
