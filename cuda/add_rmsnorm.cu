/*
 * add_rmsnorm.cu: the fused residual add and RMSNorm, one block per row. The residual
 * stream is f32: residual += delta is one f32 addition per element (as on the CPU), the
 * mean of squares is reduced in f32 over the block, then out = r * (1 / sqrtf(mean +
 * eps)) * w, rounded once to out's dtype. out may alias residual.
 *
 * Rows of up to 8 x 1024 elements are held in registers (K per thread, strided by the
 * block): every load of the row is issued before the first use, so a decode step's
 * single row costs a few memory latencies, not one per element (16 us -> a few on an
 * H200 at d = 4096). Longer rows take the looping kernel.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename DT, typename WT, typename OT>
__global__ void add_rmsnorm_kernel(tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps,
                                   tp_tensor out)
{
    pdl_begin(); /* inputs come from the previous kernel */
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

template <typename DT, typename WT, typename OT, int K>
__global__ void __launch_bounds__(1024)
    add_rmsnorm_regs_kernel(tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps, tp_tensor out)
{
    pdl_trigger();
    const int64_t i = blockIdx.x;
    const int d = (int)residual.cols, t = threadIdx.x, step = blockDim.x;
    /* the norm's weights are no kernel's output: read while the previous kernel finishes */
    const WT *w = (const WT *)weight.data;
    float wv[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int j = t + k * step;
        wv[k] = j < d ? to_f32(w[j]) : 0.0f;
    }
    pdl_wait(); /* the residual and delta from the previous kernels */
    float *r = row_of<float>(residual, i);
    const DT *dl = delta.data ? row_of<const DT>(delta, i) : nullptr;
    float v[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int j = t + k * step;
        v[k] = j < d ? r[j] : 0.0f;
    }
    if (dl) {
        float dv[K];
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int j = t + k * step;
            dv[k] = j < d ? to_f32(dl[j]) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int j = t + k * step;
            v[k] = __fadd_rn(v[k], dv[k]);
            if (j < d) r[j] = v[k];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) ss += v[k] * v[k];
    ss = block_sum(ss);
    const float var = d > 0 ? ss / (float)d : 0.0f;
    const float inv = 1.0f / sqrtf(var + eps);
    OT *o = row_of<OT>(out, i);
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int j = t + k * step;
        if (j < d) o[j] = from_f32<OT>(v[k] * inv * wv[k]);
    }
}

template <typename DT, typename WT, typename OT>
static void launch_add_rmsnorm(int64_t n, tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps,
                               tp_tensor out, cudaStream_t stream)
{
    const int64_t d = residual.cols;
    const int K = d <= 1024 ? 1 : d <= 2048 ? 2 : d <= 4096 ? 4 : d <= 8192 ? 8 : 0;
    if (K == 0) {
        tp_launch(add_rmsnorm_kernel<DT, WT, OT>, (unsigned)n, row_threads(d), 0, stream, residual, delta, weight, eps, out);
        return;
    }
    const int threads = (int)CEIL_DIV(CEIL_DIV(d, (int64_t)K), (int64_t)WARP_SIZE) * WARP_SIZE;
    switch (K) {
    case 1: tp_launch(add_rmsnorm_regs_kernel<DT, WT, OT, 1>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    case 2: tp_launch(add_rmsnorm_regs_kernel<DT, WT, OT, 2>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    case 4: tp_launch(add_rmsnorm_regs_kernel<DT, WT, OT, 4>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    default: tp_launch(add_rmsnorm_regs_kernel<DT, WT, OT, 8>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    }
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
    if (!is_float_dtype(ddt) || !is_float_dtype(weight.dtype) || !is_float_dtype(out.dtype))
        return TP_CUDA_BAD_DTYPE("add_rmsnorm");
    dispatch_float(ddt, [&](auto dt) {
        dispatch_float(weight.dtype, [&](auto wt) {
            dispatch_float(out.dtype, [&](auto ot) {
                launch_add_rmsnorm<decltype(dt), decltype(wt), decltype(ot)>(n, residual, delta, weight, eps, out,
                                                                              stream);
            });
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
