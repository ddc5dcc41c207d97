/*
 * softcap.cu: x = cap tanh(x / cap) in place, element by element in float32 (Gemma 2's
 * final_logit_softcapping on the logits), one block per row.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename T>
__global__ void softcap_kernel(tp_tensor x, float cap)
{
    pdl_begin(); /* x comes from the previous kernel */
    T *v = row_of<T>(x, blockIdx.x);
    for (int64_t j = threadIdx.x; j < x.cols; j += blockDim.x) v[j] = from_f32<T>(cap * tanhf(to_f32(v[j]) / cap));
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_softcap(tp_tensor x, float cap, cudaStream_t stream)
{
    if (x.rows == 0 || x.cols == 0) return TP_OK;
    if (!is_float_dtype(x.dtype)) return TP_CUDA_BAD_DTYPE("softcap");
    if (x.rows > INT32_MAX) return tp_error(TP_ERR_UNSUPPORTED, "softcap: %lld rows is too many", (long long)x.rows);
    const int threads = row_threads(x.cols);
    dispatch_float(x.dtype, [&](auto t) {
        tp_launch(softcap_kernel<decltype(t)>, (unsigned)x.rows, threads, 0, stream, x, cap);
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
