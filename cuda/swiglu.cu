/*
 * swiglu.cu: out = silu(gate) * up with silu(g) = g / (1 + expf(-g)) (PyTorch's
 * formula, the CPU backend's), one block per row, f32 arithmetic rounded once to out's
 * dtype. gate and up are usually column views of one gate|up matrix; out may alias
 * either (each element is read before it is written, by the same thread).
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename GT, typename UT, typename OT>
__global__ void swiglu_kernel(tp_tensor gate, tp_tensor up, tp_tensor out)
{
    const int64_t i = blockIdx.x;
    const GT *g = row_of<const GT>(gate, i);
    const UT *u = row_of<const UT>(up, i);
    OT *o = row_of<OT>(out, i);
    for (int64_t j = threadIdx.x; j < out.cols; j += blockDim.x) {
        const float gv = to_f32(g[j]);
        o[j] = from_f32<OT>(gv / (1.0f + expf(-gv)) * to_f32(u[j]));
    }
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_swiglu(tp_tensor gate, tp_tensor up, tp_tensor out, cudaStream_t stream)
{
    if (out.rows == 0 || out.cols == 0) return TP_OK;
    if (!is_float_dtype(gate.dtype) || !is_float_dtype(up.dtype) || !is_float_dtype(out.dtype))
        return TP_CUDA_BAD_DTYPE("swiglu");
    const int threads = row_threads(out.cols);
    dispatch_float(gate.dtype, [&](auto gt) {
        dispatch_float(up.dtype, [&](auto ut) {
            dispatch_float(out.dtype, [&](auto ot) {
                swiglu_kernel<decltype(gt), decltype(ut), decltype(ot)>
                    <<<(unsigned)out.rows, threads, 0, stream>>>(gate, up, out);
            });
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
