/*
 * embedding.cu: vocab-parallel row lookup. Block i writes out row i: the table row
 * ids[i] - vocab_begin when this rank holds it, else zeros (the TP all-reduce adds the
 * rank that does). Any float table and output dtype.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

/* The row's loads are not behind its stores (out is never the table: __restrict__), so a
 * thread's 16 loads of a 4096-wide row are in flight together: one after another they
 * took 9.6 us for 128 tokens on an H200, a memory latency each. */
template <typename TT, typename OT>
__global__ void embedding_kernel(const int32_t *ids, tp_tensor table, int64_t vocab_begin, tp_tensor out)
{
    pdl_begin(); /* inputs come from the previous kernel */
    const int64_t i = blockIdx.x, r = (int64_t)ids[i] - vocab_begin;
    OT *__restrict__ o = row_of<OT>(out, i);
    if (r >= 0 && r < table.rows) {
        const TT *__restrict__ t = row_of<const TT>(table, r);
        const int64_t n = out.cols, step = blockDim.x;
        int64_t j = threadIdx.x;
        for (; j + 7 * step < n; j += 8 * step) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = to_f32(t[j + u * step]);
#pragma unroll
            for (int u = 0; u < 8; u++) o[j + u * step] = from_f32<OT>(v[u]);
        }
        for (; j < n; j += step) o[j] = from_f32<OT>(to_f32(t[j]));
    } else {
        for (int64_t j = threadIdx.x; j < out.cols; j += blockDim.x) o[j] = from_f32<OT>(0.0f);
    }
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_embedding(const int32_t *ids, int32_t n, tp_tensor table, int64_t vocab_begin,
                                       tp_tensor out, cudaStream_t stream)
{
    if (n <= 0 || out.cols == 0) return TP_OK;
    const int threads = row_threads(out.cols);
    if (!is_float_dtype(table.dtype) || !is_float_dtype(out.dtype)) return TP_CUDA_BAD_DTYPE("embedding");
    dispatch_float(table.dtype, [&](auto tt) {
        dispatch_float(out.dtype, [&](auto ot) {
            tp_launch(embedding_kernel<decltype(tt), decltype(ot)>, (unsigned)n, threads, 0, stream, ids, table, vocab_begin, out);
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
