/*
 * kv_store.cu: this step's keys and values into the paged cache, one block per token:
 * cache row slot[i] (laid out [n_blocks * block_size, kv_heads * head_dim]) = k[i], v[i],
 * converted to the cache's dtype. A slot below zero is padding (skipped, as vLLM does); a
 * slot past the cache is recorded as a fault and skipped.
 */
#include "common.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename KT, typename VT, typename CT>
__global__ void kv_store_kernel(tp_tensor k, tp_tensor v, tp_kv_layer cache, const int32_t *slot,
                                tp_cuda_fault *fault)
{
    const int64_t i = blockIdx.x;
    const int64_t s = slot[i], slots = (int64_t)cache.n_blocks * cache.block_size;
    if (s < 0) return;
    if (s >= slots) {
        if (threadIdx.x == 0) fault_record(fault, TP_CUDA_FAULT_KV_SLOT, i, s, slots);
        return;
    }
    const int64_t width = (int64_t)cache.n_kv_heads * cache.head_dim;
    const KT *kr = row_of<const KT>(k, i);
    const VT *vr = row_of<const VT>(v, i);
    CT *kc = (CT *)cache.k + s * width, *vc = (CT *)cache.v + s * width;
    for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
        kc[e] = from_f32<CT>(to_f32(kr[e]));
        vc[e] = from_f32<CT>(to_f32(vr[e]));
    }
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_kv_store(tp_tensor k, tp_tensor v, tp_kv_layer cache, const int32_t *slot,
                                      int32_t n, tp_cuda_fault *fault, cudaStream_t stream)
{
    const int64_t width = (int64_t)cache.n_kv_heads * cache.head_dim;
    if (n <= 0 || width == 0) return TP_OK;
    if (!is_float_dtype(k.dtype) || !is_float_dtype(v.dtype) || !is_float_dtype(cache.dtype))
        return TP_CUDA_BAD_DTYPE("kv_store");
    const int threads = row_threads(width);
    dispatch_float(k.dtype, [&](auto kt) {
        dispatch_float(v.dtype, [&](auto vt) {
            dispatch_float(cache.dtype, [&](auto ct) {
                kv_store_kernel<decltype(kt), decltype(vt), decltype(ct)>
                    <<<(unsigned)n, threads, 0, stream>>>(k, v, cache, slot, fault);
            });
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
