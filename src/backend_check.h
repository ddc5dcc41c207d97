/*
 * backend_check.h: the argument checks every backend makes before an operation, shared so
 * that the CPU and CUDA backends refuse the same calls with the same messages.
 */
#ifndef TP_BACKEND_CHECK_H
#define TP_BACKEND_CHECK_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

int tp_dtype_is_float(tp_dtype dt); /* F32, F16 or BF16 */

/* A float tensor with a sane shape, stride and data pointer; op and name go in messages. */
tp_status tp_check_tensor(const char *op, const char *name, const tp_tensor *t);
/* t is [rows, cols]. */
tp_status tp_check_shape(const char *op, const char *name, const tp_tensor *t, int64_t rows, int64_t cols);
/* A usable KV cache layer. */
tp_status tp_check_cache(const char *op, const tp_kv_layer *c);
/* The sample op's host-visible arguments: f32 logits with columns for int32 ids, L <= its
 * rows, rows and out present when L > 0 (tokens is checked where a row reads it). */
tp_status tp_check_sample(const tp_tensor *logits, int32_t L, const void *rows, const void *out);
/* take_ids' and argmax_merge's host-visible arguments (take's entries are checked where
 * they are read). */
tp_status tp_check_take_ids(const void *ids, const void *from, int32_t n_from, int32_t stride, const void *take,
                            int32_t n);
tp_status tp_check_argmax_merge(const void *pairs, int n_tp, int32_t L, int32_t n, const void *ids);
/* Which of a backend's two staging buffers (stage[i] of cap[i] bytes, NULL when none) holds
 * [host, host + bytes); -1: neither, and the error names upload_staged. */
int tp_staging_slot(void *const stage[2], const size_t cap[2], const void *host, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
