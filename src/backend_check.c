/*
 * backend_check.c: shared argument checks of the backend operations.
 */
#include "backend_check.h"

int tp_dtype_is_float(tp_dtype dt)
{
    return dt == TP_DTYPE_F32 || dt == TP_DTYPE_F16 || dt == TP_DTYPE_BF16;
}

tp_status tp_check_tensor(const char *op, const char *name, const tp_tensor *t)
{
    if (!t) return tp_error(TP_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
    if (!tp_dtype_is_float(t->dtype))
        return tp_error(TP_ERR_INVALID_ARG, "%s: %s is %s, not float32, float16 or bfloat16", op,
                        name, tp_dtype_name(t->dtype));
    if (t->rows < 0 || t->cols < 0)
        return tp_error(TP_ERR_INVALID_ARG, "%s: %s has a negative shape [%lld, %lld]", op, name,
                        (long long)t->rows, (long long)t->cols);
    if (t->stride < t->cols)
        return tp_error(TP_ERR_INVALID_ARG, "%s: %s has stride %lld, less than its %lld columns", op,
                        name, (long long)t->stride, (long long)t->cols);
    if (t->stride > 0 && t->rows > INT64_MAX / 8 / t->stride)
        return tp_error(TP_ERR_INVALID_ARG, "%s: %s is too large ([%lld, %lld], stride %lld)", op,
                        name, (long long)t->rows, (long long)t->cols, (long long)t->stride);
    if (!t->data && t->rows > 0 && t->cols > 0)
        return tp_error(TP_ERR_INVALID_ARG, "%s: %s has no data but shape [%lld, %lld]", op, name,
                        (long long)t->rows, (long long)t->cols);
    return TP_OK;
}

tp_status tp_check_shape(const char *op, const char *name, const tp_tensor *t, int64_t rows, int64_t cols)
{
    if (t->rows != rows || t->cols != cols)
        return tp_error(TP_ERR_INVALID_ARG, "%s: %s is [%lld, %lld], expected [%lld, %lld]", op, name,
                        (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
    return TP_OK;
}

tp_status tp_check_cache(const char *op, const tp_kv_layer *c)
{
    if (!c) return tp_error(TP_ERR_INVALID_ARG, "%s: cache is NULL", op);
    if (!tp_dtype_is_float(c->dtype))
        return tp_error(TP_ERR_INVALID_ARG, "%s: cache is %s, not float32, float16 or bfloat16", op,
                        tp_dtype_name(c->dtype));
    if (c->n_blocks <= 0 || c->block_size <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0)
        return tp_error(TP_ERR_INVALID_ARG,
                        "%s: cache has %d blocks of %d slots, %d kv heads of dim %d; all must be > 0",
                        op, c->n_blocks, c->block_size, c->n_kv_heads, c->head_dim);
    if ((int64_t)c->n_blocks * c->block_size > INT32_MAX)
        return tp_error(TP_ERR_INVALID_ARG, "%s: cache has %lld slots, more than int32 slot numbers reach",
                        op, (long long)c->n_blocks * c->block_size);
    if (!c->k || !c->v) return tp_error(TP_ERR_INVALID_ARG, "%s: cache has no k or v memory", op);
    return TP_OK;
}

tp_status tp_check_sample(const tp_tensor *logits, int32_t L, const void *rows, const void *out)
{
    TP_CHECK(tp_check_tensor("sample", "logits", logits));
    if (logits->dtype != TP_DTYPE_F32)
        return tp_error(TP_ERR_INVALID_ARG, "sample: logits is %s; sample reads float32 logits",
                        tp_dtype_name(logits->dtype));
    if (L < 0 || L > logits->rows)
        return tp_error(TP_ERR_INVALID_ARG, "sample: L is %d; logits has %lld rows", (int)L,
                        (long long)logits->rows);
    if (L == 0) return TP_OK;
    if (logits->cols == 0)
        return tp_error(TP_ERR_INVALID_ARG, "sample: logits has %d rows to sample but no columns", (int)L);
    if (logits->cols > INT32_MAX)
        return tp_error(TP_ERR_INVALID_ARG, "sample: logits has %lld columns, more than int32 ids reach",
                        (long long)logits->cols);
    if (!rows || !out) return tp_error(TP_ERR_INVALID_ARG, "sample: rows or out is NULL for %d rows", (int)L);
    return TP_OK;
}

int tp_staging_slot(void *const stage[2], const size_t cap[2], const void *host, size_t bytes)
{
    const char *h = host;
    for (int i = 0; i < 2; i++)
        if (stage[i] && h >= (const char *)stage[i] && bytes <= cap[i] &&
            (size_t)(h - (const char *)stage[i]) <= cap[i] - bytes)
            return i;
    tp_error(TP_ERR_INVALID_ARG, "upload_staged: %zu bytes not inside a staging buffer", bytes);
    return -1;
}

tp_status tp_check_take_ids(const void *ids, const void *from, int32_t n_from, int32_t stride, const void *take,
                            int32_t n)
{
    if (n < 0 || n_from < 0 || stride < 1)
        return tp_error(TP_ERR_INVALID_ARG, "take_ids: n is %d, n_from %d, stride %d", n, n_from, stride);
    if (n > 0 && (!ids || !take || (n_from > 0 && !from)))
        return tp_error(TP_ERR_INVALID_ARG, "take_ids: NULL pointer");
    return TP_OK;
}

tp_status tp_check_argmax_merge(const void *pairs, int n_tp, int32_t L, int32_t n, const void *ids)
{
    if (n_tp < 1 || L < 0 || n < 0 || n > L)
        return tp_error(TP_ERR_INVALID_ARG, "argmax_merge: %d ranks, %d rows of %d", n_tp, n, L);
    if (n > 0 && (!pairs || !ids)) return tp_error(TP_ERR_INVALID_ARG, "argmax_merge: NULL pointer");
    return TP_OK;
}
