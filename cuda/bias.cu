/*
 * bias.cu: y[i][j] = bias[j] (or 0 without a bias), one block per row. matmul uses it
 * to put the bias into y before cuBLASLt adds the product with beta = 1, so a biased
 * output is rounded once; it is also the whole matmul when k == 0.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename YT, typename BT>
__global__ void bias_fill_kernel(tp_tensor y, tp_tensor bias)
{
    pdl_begin(); /* inputs come from the previous kernel */
    const int64_t i = blockIdx.x;
    const BT *b = (const BT *)bias.data;
    YT *o = row_of<YT>(y, i);
    for (int64_t j = threadIdx.x; j < y.cols; j += blockDim.x) o[j] = from_f32<YT>(b ? to_f32(b[j]) : 0.0f);
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_bias_fill(tp_tensor y, tp_tensor bias, cudaStream_t stream)
{
    if (y.rows == 0 || y.cols == 0) return TP_OK;
    const tp_dtype bdt = bias.data ? bias.dtype : TP_DTYPE_F32;
    if (!is_float_dtype(y.dtype) || !is_float_dtype(bdt)) return TP_CUDA_BAD_DTYPE("matmul bias");
    if (y.rows > INT32_MAX) return tp_error(TP_ERR_UNSUPPORTED, "matmul: %lld rows is too many", (long long)y.rows);
    const int threads = row_threads(y.cols);
    dispatch_float(y.dtype, [&](auto yt) {
        dispatch_float(bdt, [&](auto bt) {
            tp_launch(bias_fill_kernel<decltype(yt), decltype(bt)>, (unsigned)y.rows, threads, 0, stream, y, bias);
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
