/*
 * qk_rope_store.cu: the attention block's work between the qkv matmul and attention in one
 * launch: per-head RMSNorm of q and k (Qwen3's q_norm/k_norm; optional), rotate-half rope
 * of both at pos, and the store of k and v into the paged cache at slot.
 *
 * Grid: blockIdx.x is the token, blockIdx.y a group of heads. The block first puts the
 * token's cos/sin (one per pair j) in shared memory, then each warp takes heads of
 * [q heads | k heads] one at a time; the warp of k head h also stores v head h.
 *
 * Bit for bit the unfused CUDA ops (head_rmsnorm, rope, rope, kv_store): the same f32
 * formulas in the same order (the sum of squares strided by lane as head_rmsnorm's, the
 * angle and products as rope's), q and k rounded to their dtype after the norm (where
 * head_rmsnorm writes them back) and again after rope, and the cache given the rounded k.
 * Slots below zero are padding (skipped); a slot past the cache is recorded as kv_store's
 * fault and skipped, and that token's q and k are still normed and rotated in place.
 */
#include "common.cuh"

#define QKR_WARPS 4              /* heads in flight per block */
#define QKR_MAX_HEAD_DIM 8192    /* the token's cos/sin in shared memory: 4 * head_dim bytes */
#define QKR_MAX_GROUPS 65535     /* gridDim.y */
#define QKR_MAX_PAIRS 4          /* pairs a lane holds in registers: head_dim 64k up to 256 */

// ----------------------------------------------------------------------------
// CUDA kernels

/* Element i of a norm weight of dtype dt (a branch uniform over the grid). */
__device__ __forceinline__ float weight_at(const void *w, int32_t dt, int64_t i)
{
    switch (dt) {
    case TP_DTYPE_F16: return to_f32(((const f16_t *)w)[i]);
    case TP_DTYPE_BF16: return to_f32(((const bf16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

/* Pair j of a head (x1 = x[j], x2 = x[j + half], read already): normed (rounded to XT)
 * where norm, rotated (rounded to XT), written back to x and, where kc, to the K cache. */
template <typename XT, typename CT>
__device__ __forceinline__ void rope_pair(XT *x, CT *kc, int j, int half, float x1, float x2, bool norm, float inv,
                                          const void *w, int32_t wdt, const float *cs_s)
{
    if (norm) {
        x1 = to_f32(from_f32<XT>(x1 * inv * weight_at(w, wdt, j)));
        x2 = to_f32(from_f32<XT>(x2 * inv * weight_at(w, wdt, j + half)));
    }
    float r1, r2;
    rope_rotate(x1, x2, cs_s[j], cs_s[half + j], &r1, &r2);
    const XT y1 = from_f32<XT>(r1), y2 = from_f32<XT>(r2);
    x[j] = y1;
    x[j + half] = y2;
    if (kc) {
        kc[j] = from_f32<CT>(to_f32(y1));
        kc[j + half] = from_f32<CT>(to_f32(y2));
    }
}

/* q [n, hq*hd], k, v [n, hk*hd] of XT (columns of one qkv); q_norm, k_norm [1, hd] or data
 * NULL; cache rows [slots, hk*hd] of CT. Dynamic shared memory: hd floats. */
template <typename XT, typename CT>
__global__ void __launch_bounds__(QKR_WARPS * WARP_SIZE)
    qk_rope_store_kernel(tp_tensor q, tp_tensor k, tp_tensor v, tp_tensor q_norm, tp_tensor k_norm, float eps,
                         int32_t head_dim, const int32_t *pos, const float *inv_freq, tp_kv_layer cache,
                         const int32_t *slot, tp_cuda_fault *fault)
{
    pdl_trigger();
    extern __shared__ float cs_s[]; /* [half] cos, then [half] sin */
    const int64_t i = blockIdx.x;
    const int half = head_dim / 2, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;

    /* rope.cu's angle. Positions, slots and inv_freq are uploads, never a kernel's output:
     * done while the previous kernel finishes. */
    const int32_t p = pos[i];
    for (int j = threadIdx.x; j < half; j += blockDim.x) rope_angle(p, inv_freq[j], &cs_s[j], &cs_s[half + j]);
    const int64_t s = slot[i], slots = (int64_t)cache.n_blocks * cache.block_size;
    pdl_wait(); /* q, k, v from the previous kernel */
    __syncthreads();

    /* the token's cache row (kv_store's rule) */
    const int64_t width = (int64_t)cache.n_kv_heads * cache.head_dim; /* == k.cols */
    const bool store = s >= 0 && s < slots;
    if (s >= slots && blockIdx.y == 0 && threadIdx.x == 0) fault_record(fault, TP_CUDA_FAULT_KV_SLOT, i, s, slots);

    const int64_t hq = q.cols / head_dim, heads = hq + k.cols / head_dim;
    const bool norm = q_norm.data != NULL;
    for (int64_t h = (int64_t)blockIdx.y * QKR_WARPS + warp; h < heads; h += (int64_t)gridDim.y * QKR_WARPS) {
        const bool is_k = h >= hq;
        const int64_t kh = h - hq; /* the kv head, when is_k */
        XT *x = is_k ? row_of<XT>(k, i) + kh * head_dim : row_of<XT>(q, i) + h * head_dim;
        const void *w = is_k ? k_norm.data : q_norm.data;
        const int32_t wdt = is_k ? (int32_t)k_norm.dtype : (int32_t)q_norm.dtype;

        CT *kc = is_k && store ? (CT *)cache.k + s * width + kh * head_dim : NULL;
        const XT *vr = kc ? row_of<const XT>(v, i) + kh * head_dim : NULL;
        CT *vc = kc ? (CT *)cache.v + s * width + kh * head_dim : NULL;
        if (half % WARP_SIZE == 0 && half <= QKR_MAX_PAIRS * WARP_SIZE) {
            /* every load of the head (its pairs, and v) before the first store: the loop
             * below had a memory latency per pair and per element of v (stores ahead of
             * loads that might alias) */
            const int P = half / WARP_SIZE;
            float a1[QKR_MAX_PAIRS], a2[QKR_MAX_PAIRS], vv[2 * QKR_MAX_PAIRS];
#pragma unroll
            for (int u = 0; u < QKR_MAX_PAIRS; u++)
                if (u < P) {
                    a1[u] = to_f32(x[lane + WARP_SIZE * u]);
                    a2[u] = to_f32(x[lane + WARP_SIZE * u + half]);
                }
            if (vr)
#pragma unroll
                for (int u = 0; u < 2 * QKR_MAX_PAIRS; u++)
                    if (u < 2 * P) vv[u] = to_f32(vr[lane + WARP_SIZE * u]);
            float inv = 1.0f;
            if (norm) { /* head_rmsnorm's order: element lane + 32 t for t = 0, 1, .. */
                float ss = 0.0f;
#pragma unroll
                for (int u = 0; u < QKR_MAX_PAIRS; u++) /* elements lane + 32 t, t < P: the first half */
                    if (u < P) ss += a1[u] * a1[u];
#pragma unroll
                for (int u = 0; u < QKR_MAX_PAIRS; u++) /* then t = P .. 2P - 1: the second half */
                    if (u < P) ss += a2[u] * a2[u];
                ss = warp_sum(ss);
                inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
            }
#pragma unroll
            for (int u = 0; u < QKR_MAX_PAIRS; u++)
                if (u < P) rope_pair(x, kc, lane + WARP_SIZE * u, half, a1[u], a2[u], norm, inv, w, wdt, cs_s);
            if (vc)
#pragma unroll
                for (int u = 0; u < 2 * QKR_MAX_PAIRS; u++)
                    if (u < 2 * P) vc[lane + WARP_SIZE * u] = from_f32<CT>(vv[u]);
            continue;
        }

        /* head_rmsnorm's scale: lane-strided sum of squares, warp sum */
        float inv = 1.0f;
        if (norm) {
            float ss = 0.0f;
            for (int j = lane; j < head_dim; j += WARP_SIZE) {
                const float a = to_f32(x[j]);
                ss += a * a;
            }
            ss = warp_sum(ss);
            inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
            __syncwarp(); /* every lane has read its elements before any lane writes a pair */
        }

        /* pair j of the head belongs to one lane: norm (rounded to XT), rope (rounded to XT) */
        for (int j = lane; j < half; j += WARP_SIZE)
            rope_pair(x, kc, j, half, to_f32(x[j]), to_f32(x[j + half]), norm, inv, w, wdt, cs_s);
        if (vc)
            for (int e = lane; e < head_dim; e += WARP_SIZE) vc[e] = from_f32<CT>(to_f32(vr[e]));
    }
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_qk_rope_store(tp_tensor q, tp_tensor k, tp_tensor v, tp_tensor q_norm,
                                           tp_tensor k_norm, float eps, int32_t head_dim, const int32_t *pos,
                                           const float *inv_freq, tp_kv_layer cache, const int32_t *slot,
                                           int32_t n, tp_cuda_fault *fault, cudaStream_t stream)
{
    if (head_dim <= 0 || head_dim % 2) return tp_error(TP_ERR_INTERNAL, "qk_rope_store: head_dim %d", head_dim);
    if (head_dim > QKR_MAX_HEAD_DIM)
        return tp_error(TP_ERR_UNSUPPORTED, "qk_rope_store: head_dim %d is more than the CUDA kernel's %d",
                        head_dim, QKR_MAX_HEAD_DIM);
    const int64_t heads = q.cols / head_dim + k.cols / head_dim;
    if (n <= 0 || heads == 0) return TP_OK;
    if (!is_float_dtype(q.dtype) || k.dtype != q.dtype || v.dtype != q.dtype || !is_float_dtype(cache.dtype) ||
        (q_norm.data && (!is_float_dtype(q_norm.dtype) || !k_norm.data || !is_float_dtype(k_norm.dtype))))
        return TP_CUDA_BAD_DTYPE("qk_rope_store");
    /* heads a warp takes: n / 512, at least 1 (a decode step's few tokens: latency), at most
     * its share of the token's heads (then one block a token): a block's cos/sin serve more
     * heads and blocks are fewer. 16384 tokens at one head a warp (12 blocks a token) took
     * 0.28 ms a call, 1.5 TB/s; at one block a token 0.20 ms (Nsight Compute, H200). */
    int64_t per_warp = n / 512 < 1 ? 1 : n / 512;
    if (per_warp > CEIL_DIV(heads, (int64_t)QKR_WARPS)) per_warp = CEIL_DIV(heads, (int64_t)QKR_WARPS);
    int64_t groups = CEIL_DIV(heads, (int64_t)QKR_WARPS * per_warp);
    if (groups > QKR_MAX_GROUPS) groups = QKR_MAX_GROUPS; /* warps loop over the rest */
    const dim3 grid((unsigned)n, (unsigned)groups);
    const size_t shared = (size_t)head_dim * sizeof(float);
    dispatch_float(q.dtype, [&](auto xt) {
        dispatch_float(cache.dtype, [&](auto ct) {
            tp_launch(qk_rope_store_kernel<decltype(xt), decltype(ct)>, grid, QKR_WARPS * WARP_SIZE, shared, stream,
                      q, k, v, q_norm, k_norm, eps, head_dim, pos, inv_freq, cache, slot, fault);
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
