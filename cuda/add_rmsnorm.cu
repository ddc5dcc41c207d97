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
 * the same kernel takes pieces of 8 consecutive elements as 16-byte accesses, C a thread: a
 * prefill step's 16384 rows took 0.33 ms a call with the single-element accesses of 1024
 * threads a row (2.4 TB/s, Nsight Compute on an H200), 0.22 ms so. At most 256 threads a
 * row (C = 2 at 4096; rows of up to 8192).
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

/* N consecutive elements at p (N = 8: p 16-byte aligned, 16-byte accesses; N = 1: one). */
template <int N, typename T> __device__ __forceinline__ void load_n(const T *p, float (&v)[N])
{
    if constexpr (N == 8) load8(p, v);
    else v[0] = to_f32(p[0]);
}

template <int N, typename T> __device__ __forceinline__ void store_n(T *p, const float (&v)[N])
{
    if constexpr (N == 8) store8(p, v);
    else p[0] = from_f32<T>(v[0]);
}

/* The row in registers: thread t takes C pieces of VW consecutive elements, pieces t, t +
 * step, .. (the last ones may be past d). VW = 1: up to 1024 threads; VW = 8 (16-byte
 * accesses): at most 256, which the launch bounds allow for (under 1024, C = 4 spilled).
 * The two add a row's squares in different orders, so their results may differ in the last
 * bit; which one runs depends on the rows' alignment, fixed for a model's buffers. */
template <typename DT, typename WT, typename OT, int VW, int C>
__global__ void __launch_bounds__(VW == 8 ? 256 : 1024)
    add_rmsnorm_regs_kernel(tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps, tp_tensor out)
{
    pdl_trigger();
    const int64_t i = blockIdx.x;
    const int d = (int)residual.cols, t = threadIdx.x, step = blockDim.x;
    /* the norm's weights are no kernel's output: read while the previous kernel finishes */
    const WT *w = (const WT *)weight.data;
    float wv[C][VW], v[C][VW];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int j = (t + c * step) * VW;
        if (j < d) load_n<VW>(w + j, wv[c]);
    }
    pdl_wait(); /* the residual and delta from the previous kernels */
    float *r = row_of<float>(residual, i);
    const DT *dl = delta.data ? row_of<const DT>(delta, i) : nullptr;
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int j = (t + c * step) * VW;
        if (j < d) load_n<VW>(r + j, v[c]);
        else
#pragma unroll
            for (int e = 0; e < VW; e++) v[c][e] = 0.0f;
    }
    if (dl) {
        float dv[C][VW];
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int j = (t + c * step) * VW;
            if (j < d) load_n<VW>(dl + j, dv[c]);
        }
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int j = (t + c * step) * VW;
            if (j >= d) continue;
#pragma unroll
            for (int e = 0; e < VW; e++) v[c][e] = __fadd_rn(v[c][e], dv[c][e]);
            store_n<VW>(r + j, v[c]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int e = 0; e < VW; e++) ss += v[c][e] * v[c][e];
    ss = block_sum(ss);
    const float var = d > 0 ? ss / (float)d : 0.0f;
    const float inv = 1.0f / sqrtf(var + eps);
    OT *o = row_of<OT>(out, i);
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int j = (t + c * step) * VW;
        if (j >= d) continue;
        float y[VW];
#pragma unroll
        for (int e = 0; e < VW; e++) y[e] = v[c][e] * inv * wv[c][e];
        store_n<VW>(o + j, y);
    }
}

/* The registers kernel with pieces of VW elements, C a thread, one block of threads a row. */
template <typename DT, typename WT, typename OT, int VW>
static void launch_regs(int C, int threads, int64_t n, tp_tensor residual, tp_tensor delta, tp_tensor weight,
                        float eps, tp_tensor out, cudaStream_t stream)
{
    switch (C) {
    case 1: tp_launch(add_rmsnorm_regs_kernel<DT, WT, OT, VW, 1>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    case 2: tp_launch(add_rmsnorm_regs_kernel<DT, WT, OT, VW, 2>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    case 4: tp_launch(add_rmsnorm_regs_kernel<DT, WT, OT, VW, 4>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out); break;
    default: /* 8: single elements only (16-byte pieces stop at 4) */
        if constexpr (VW == 1)
            tp_launch(add_rmsnorm_regs_kernel<DT, WT, OT, 1, 8>, (unsigned)n, threads, 0, stream, residual, delta, weight, eps, out);
        break;
    }
}

template <typename DT, typename WT, typename OT>
static void launch_add_rmsnorm(int64_t n, tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps,
                               tp_tensor out, cudaStream_t stream)
{
    const int64_t d = residual.cols, chunks = d / 8;
    /* 16-byte pieces, at most 256 threads a row whatever the rows (a row's sums in one order
     * at any batch), rows of up to 4 x 256 x 8 */
    if (d % 8 == 0 && chunks <= 4 * 256 && rows_aligned16(residual) && rows_aligned16(out) &&
        rows_aligned16(weight) && (!delta.data || rows_aligned16(delta))) {
        const int C = chunks <= 256 ? 1 : chunks <= 512 ? 2 : 4;
        const int threads = (int)CEIL_DIV(CEIL_DIV(chunks, (int64_t)C), (int64_t)WARP_SIZE) * WARP_SIZE;
        launch_regs<DT, WT, OT, 8>(C, threads, n, residual, delta, weight, eps, out, stream);
        return;
    }
    const int K = d <= 1024 ? 1 : d <= 2048 ? 2 : d <= 4096 ? 4 : d <= 8192 ? 8 : 0;
    if (K == 0) {
        tp_launch(add_rmsnorm_kernel<DT, WT, OT>, (unsigned)n, row_threads(d), 0, stream, residual, delta, weight, eps, out);
        return;
    }
    const int threads = (int)CEIL_DIV(CEIL_DIV(d, (int64_t)K), (int64_t)WARP_SIZE) * WARP_SIZE;
    launch_regs<DT, WT, OT, 1>(K, threads, n, residual, delta, weight, eps, out, stream);
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
