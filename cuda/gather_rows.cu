/*
 * gather_rows.cu: out[i] = x[rows[i]] converted to out's dtype, one block per output
 * row. rows lives in device memory, so its range is checked here: a row outside x is
 * recorded as a fault and its output row is zeros (never an out-of-bounds read).
 * take_ids: a step's token ids from the step before's device-chosen ones, alike.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename XT, typename OT>
__global__ void gather_rows_kernel(tp_tensor x, const int32_t *rows, tp_tensor out, tp_cuda_fault *fault)
{
    pdl_begin(); /* inputs come from the previous kernel */
    const int64_t i = blockIdx.x, r = rows[i];
    OT *o = row_of<OT>(out, i);
    if (r < 0 || r >= x.rows) {
        if (threadIdx.x == 0) fault_record(fault, TP_CUDA_FAULT_GATHER_ROW, i, r, x.rows);
        for (int64_t j = threadIdx.x; j < out.cols; j += blockDim.x) o[j] = from_f32<OT>(0.0f);
        return;
    }
    const XT *s = row_of<const XT>(x, r);
    for (int64_t j = threadIdx.x; j < out.cols; j += blockDim.x) o[j] = from_f32<OT>(to_f32(s[j]));
}

/* ids[i] = from[take[i] * stride] where take[i] >= 0; a take past from is a fault (ids[i] stays) */
__global__ void take_ids_kernel(int32_t *ids, const int32_t *from, int32_t n_from, int32_t stride, const int32_t *take,
                                int32_t n, tp_cuda_fault *fault)
{
    pdl_begin(); /* from comes from the previous kernel */
    const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int32_t t = take[i];
    if (t >= n_from) fault_record(fault, TP_CUDA_FAULT_TAKE_IDS, i, t, n_from);
    else if (t >= 0) ids[i] = from[(int64_t)t * stride];
}

// ----------------------------------------------------------------------------
// launchers

extern "C" tp_status tp_cuda_take_ids(int32_t *ids, const int32_t *from, int32_t n_from, int32_t stride,
                                      const int32_t *take, int32_t n, tp_cuda_fault *fault, cudaStream_t stream)
{
    if (n <= 0) return TP_OK;
    tp_launch(take_ids_kernel, (unsigned)CEIL_DIV(n, 256), 256, 0, stream, ids, from, n_from, stride, take, n, fault);
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}

extern "C" tp_status tp_cuda_gather_rows(tp_tensor x, const int32_t *rows, int32_t n, tp_tensor out,
                                         tp_cuda_fault *fault, cudaStream_t stream)
{
    if (n <= 0 || out.cols == 0) return TP_OK;
    if (!is_float_dtype(x.dtype) || !is_float_dtype(out.dtype)) return TP_CUDA_BAD_DTYPE("gather_rows");
    const int threads = row_threads(out.cols);
    dispatch_float(x.dtype, [&](auto xt) {
        dispatch_float(out.dtype, [&](auto ot) {
            tp_launch(gather_rows_kernel<decltype(xt), decltype(ot)>, (unsigned)n, threads, 0, stream, x, rows, out, fault);
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
