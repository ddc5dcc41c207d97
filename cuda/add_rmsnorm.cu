/*
 * add_rmsnorm.cu: the fused residual add and RMSNorm, one block per row. The residual
 * stream is f32: residual += delta is one f32 addition per element (as on the CPU), the
 * mean of squares is reduced in f32 over the block, then out = r * (1 / sqrtf(mean +
 * eps)) * w, rounded once to out's dtype. out may alias residual.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename DT, typename WT, typename OT>
__global__ void add_rmsnorm_kernel(tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps,
                                   tp_tensor out)
{
    const int64_t i = blockIdx.x, d = residual.cols;
    float *r = row_of<float>(residual, i);
    const DT *dl = delta.data ? row_of<const DT>(delta, i) : nullptr;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float v = r[j];
        if (dl) {
            v = __fadd_rn(v, to_f32(dl[j]));
            r[j] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss); /* also orders the residual writes before the reads below */
    const float var = d > 0 ? ss / (float)d : 0.0f;
    const float inv = 1.0f / sqrtf(var + eps);
    const WT *w = (const WT *)weight.data;
    OT *o = row_of<OT>(out, i);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = from_f32<OT>(r[j] * inv * to_f32(w[j]));
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_add_rmsnorm(tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps,
                                         tp_tensor out, cudaStream_t stream)
{
    const int64_t n = residual.rows;
    if (n == 0 || residual.cols == 0) return TP_OK;
    if (residual.dtype != TP_DTYPE_F32) return TP_CUDA_BAD_DTYPE("add_rmsnorm");
    const tp_dtype ddt = delta.data ? delta.dtype : TP_DTYPE_F32;
    const int threads = row_threads(residual.cols);
    if (!is_float_dtype(ddt) || !is_float_dtype(weight.dtype) || !is_float_dtype(out.dtype))
        return TP_CUDA_BAD_DTYPE("add_rmsnorm");
    dispatch_float(ddt, [&](auto dt) {
        dispatch_float(weight.dtype, [&](auto wt) {
            dispatch_float(out.dtype, [&](auto ot) {
                add_rmsnorm_kernel<decltype(dt), decltype(wt), decltype(ot)>
                    <<<(unsigned)n, threads, 0, stream>>>(residual, delta, weight, eps, out);
            });
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
