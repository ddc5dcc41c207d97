/*
 * head_rmsnorm.cu: RMSNorm of every head of every row in place (Qwen3's q/k norm), one
 * warp per (row, head): the mean of squares is a warp sum in f32, then x = x * (1 /
 * sqrtf(mean + eps)) * w as on the CPU. x may be a column view (q or k of qkv).
 */
#include "common.cuh"

#define HEAD_RMSNORM_WARPS 4 /* (row, head) tasks per block */

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename XT, typename WT>
__global__ void head_rmsnorm_kernel(tp_tensor x, int32_t head_dim, int64_t heads, tp_tensor weight, float eps)
{
    const int64_t task = (int64_t)blockIdx.x * HEAD_RMSNORM_WARPS + threadIdx.x / WARP_SIZE;
    if (task >= x.rows * heads) return; /* the whole warp leaves together */
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t i = task / heads, h = task % heads;
    XT *v = row_of<XT>(x, i) + h * head_dim;
    const WT *w = (const WT *)weight.data;
    float ss = 0.0f;
    for (int j = lane; j < head_dim; j += WARP_SIZE) {
        const float a = to_f32(v[j]);
        ss += a * a;
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int j = lane; j < head_dim; j += WARP_SIZE) v[j] = from_f32<XT>(to_f32(v[j]) * inv * to_f32(w[j]));
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_head_rmsnorm(tp_tensor x, int32_t head_dim, tp_tensor weight, float eps,
                                          cudaStream_t stream)
{
    if (head_dim <= 0) return tp_error(TP_ERR_INTERNAL, "head_rmsnorm: head_dim %d", head_dim);
    const int64_t heads = x.cols / head_dim, tasks = x.rows * heads;
    if (tasks == 0) return TP_OK;
    if (!is_float_dtype(x.dtype) || !is_float_dtype(weight.dtype)) return TP_CUDA_BAD_DTYPE("head_rmsnorm");
    const int64_t blocks = CEIL_DIV(tasks, (int64_t)HEAD_RMSNORM_WARPS);
    if (blocks > INT32_MAX) return tp_error(TP_ERR_UNSUPPORTED, "head_rmsnorm: %lld heads is too many", (long long)tasks);
    dispatch_float(x.dtype, [&](auto xt) {
        dispatch_float(weight.dtype, [&](auto wt) {
            head_rmsnorm_kernel<decltype(xt), decltype(wt)>
                <<<(unsigned)blocks, HEAD_RMSNORM_WARPS * WARP_SIZE, 0, stream>>>(x, head_dim, heads, weight, eps);
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
