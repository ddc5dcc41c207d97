/*
 * rope.cu: Hugging Face rotate-half rotary embedding in place, one block per row. The
 * method is the CPU backend's (common.cuh's rope_angle and rope_rotate): x[j] <- x[j] c -
 * x[j+h] s, x[j+h] <- x[j+h] c + x[j] s in f32, rounded once to x's dtype. Each (head, j)
 * pair belongs to one thread.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename XT>
__global__ void rope_kernel(tp_tensor x, int32_t head_dim, int64_t heads, const int32_t *pos, const float *inv_freq)
{
    const int64_t i = blockIdx.x, half = head_dim / 2;
    const int32_t p = pos[i];
    XT *r = row_of<XT>(x, i);
    for (int64_t t = threadIdx.x; t < heads * half; t += blockDim.x) {
        const int64_t h = t / half, j = t % half;
        float s, c, y1, y2;
        rope_angle(p, inv_freq[j], &c, &s);
        XT *v = r + h * head_dim;
        rope_rotate(to_f32(v[j]), to_f32(v[j + half]), c, s, &y1, &y2);
        v[j] = from_f32<XT>(y1);
        v[j + half] = from_f32<XT>(y2);
    }
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_rope(tp_tensor x, int32_t head_dim, const int32_t *pos, const float *inv_freq,
                                  cudaStream_t stream)
{
    if (head_dim <= 0 || head_dim % 2) return tp_error(TP_ERR_INTERNAL, "rope: head_dim %d", head_dim);
    const int64_t heads = x.cols / head_dim;
    if (x.rows == 0 || heads == 0) return TP_OK;
    if (!is_float_dtype(x.dtype)) return TP_CUDA_BAD_DTYPE("rope");
    const int threads = row_threads(heads * (head_dim / 2));
    dispatch_float(x.dtype, [&](auto xt) {
        rope_kernel<decltype(xt)><<<(unsigned)x.rows, threads, 0, stream>>>(x, head_dim, heads, pos, inv_freq);
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
