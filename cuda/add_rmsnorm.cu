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
 *
 * Where every row starts 16-byte aligned and d is a multiple of 8 (the model's own tensors),
 * each thread takes C chunks of 8 consecutive elements as 16-byte accesses: a prefill
 * step's 16384 rows took 0.33 ms a call with the scalar accesses of 1024 threads a row
 * (2.4 TB/s, Nsight Compute on an H200). At most 256 threads a row (C = 2 at 4096; rows of up
 * to 8192).
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

/* The registers kernel with 16-byte accesses: thread t takes chunks t, t + step, .. of 8
 * elements (C of them; the last ones may be past d). Same arithmetic per element; the sum of
 * squares is added in another order, so a row's result may differ from the registers
 * kernel's in the last bit (which of the two runs depends on the rows' alignment, fixed for
 * a model's buffers). At most 256 threads: launch bounds for them, or C = 4 spills. */
template <typename DT, typename WT, typename OT, int C>
__global__ void __launch_bounds__(256)
    add_rmsnorm_vec8_kernel(tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps, tp_tensor out)
{
    pdl_trigger();
    const int64_t i = blockIdx.x;
    const int d = (int)residual.cols, t = threadIdx.x, step = blockDim.x;
    const WT *w = (const WT *)weight.data;
    float wv[C][8], v[C][8];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int j = (t + c * step) * 8;
        if (j < d) load8(w + j, wv[c]);
    }
    pdl_wait(); /* the residual and delta from the previous kernels */
    float *r = row_of<float>(residual, i);
    const DT *dl = delta.data ? row_of<const DT>(delta, i) : nullptr;
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int j = (t + c * step) * 8;
        if (j < d) load8(r + j, v[c]);
        else for (int e = 0; e < 8; e++) v[c][e] = 0.0f;
    }
    if (dl) {
        float dv[C][8];
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int j = (t + c * step) * 8;
            if (j < d) load8(dl + j, dv[c]);
        }
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int j = (t + c * step) * 8;
            if (j >= d) continue;
#pragma unroll
            for (int e = 0; e < 8; e++) v[c][e] = __fadd_rn(v[c][e], dv[c][e]);
            store8(r + j, v[c]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int e = 0; e < 8; e++) ss += v[c][e] * v[c][e];
    ss = block_sum(ss);
    const float var = d > 0 ? ss / (float)d : 0.0f;
    const float inv = 1.0f / sqrtf(var + eps);
    OT *o = row_of<OT>(out, i);
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int j = (t + c * step) * 8;
        if (j >= d) continue;
        float y[8];
#pragma unroll
        for (int e = 0; e < 8; e++) y[e] = v[c][e] * inv * wv[c][e];
        store8(o + j, y);
    }
}

static bool rows_aligned16(const tp_tensor &t)
{
    return (uintptr_t)t.data % 16 == 0 && (t.stride * (int64_t)tp_dtype_size(t.dtype)) % 16 == 0;
}

/* The 16-byte kernel where it fits: true when launched. */
template <typename DT, typename WT, typename OT>
static bool launch_add_rmsnorm_vec8(int64_t n, tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps,
                                    tp_tensor out, cudaStream_t stream)
{
    const int64_t d = residual.cols, chunks = d / 8;
    if (d % 8 || chunks > 4 * 256 || !rows_aligned16(residual) || !rows_aligned16(out) ||
        (uintptr_t)weight.data % 16 || (delta.data && !rows_aligned16(delta)))
        return false;
    /* at most 256 threads a row, whatever the rows (a row's sums in one order at any batch) */
    const int64_t most = 256;
    const int C = chunks <= most ? 1 : chunks <= 2 * most ? 2 : 4;
    const int threads = (int)CEIL_DIV(CEIL_DIV(chunks, (int64_t)C), (int64_t)WARP_SIZE) * WARP_SIZE;
    switch (C) {
    case 1: tp_launch(add_rmsnorm_vec8_kernel<DT, WT, OT, 1>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    case 2: tp_launch(add_rmsnorm_vec8_kernel<DT, WT, OT, 2>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    default: tp_launch(add_rmsnorm_vec8_kernel<DT, WT, OT, 4>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    }
    return true;
}

template <typename DT, typename WT, typename OT>
static void launch_add_rmsnorm(int64_t n, tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps,
                               tp_tensor out, cudaStream_t stream)
{
    const int64_t d = residual.cols;
    if (launch_add_rmsnorm_vec8<DT, WT, OT>(n, residual, delta, weight, eps, out, stream)) return;
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
