/*
 * convert.cu: dst = src converted element by element (any of f32/f16/bf16 to any), one
 * block per row, both sides strided. Conversions are bit for bit tp_convert's.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename ST, typename DT>
__global__ void convert_kernel(tp_tensor src, tp_tensor dst)
{
    pdl_begin(); /* inputs come from the previous kernel */
    const int64_t i = blockIdx.x;
    const ST *s = row_of<const ST>(src, i);
    DT *d = row_of<DT>(dst, i);
    for (int64_t j = threadIdx.x; j < dst.cols; j += blockDim.x) d[j] = from_f32<DT>(to_f32(s[j]));
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_convert(tp_tensor src, tp_tensor dst, cudaStream_t stream)
{
    if (dst.rows == 0 || dst.cols == 0) return TP_OK;
    if (!is_float_dtype(src.dtype) || !is_float_dtype(dst.dtype)) return TP_CUDA_BAD_DTYPE("convert");
    if (dst.rows > INT32_MAX) return tp_error(TP_ERR_UNSUPPORTED, "convert: %lld rows is too many", (long long)dst.rows);
    const int threads = row_threads(dst.cols);
    dispatch_float(src.dtype, [&](auto st) {
        dispatch_float(dst.dtype, [&](auto dt) {
            tp_launch(convert_kernel<decltype(st), decltype(dt)>, (unsigned)dst.rows, threads, 0, stream, src, dst);
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
