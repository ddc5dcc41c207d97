/*
 * attention.cu: causal grouped-query attention over the paged KV cache, the simple
 * correct kernel. One block per (token, q head); q head h reads KV head h / (q_heads /
 * kv_heads). Positions 0..pos of the token's sequence are taken in chunks of ATTN_CHUNK:
 * one warp per position computes the score scale * (q . k) (f32, warp sum), then the
 * chunk is folded into a running softmax (flash-attention's online rescaling): running
 * maximum m, running sum l, and acc[hd] in f32 shared memory, each dimension owned by one
 * thread. Nothing of size pos goes to global memory. out = acc / l.
 *
 * What only the device can check (sequence, position, block-table entries) is checked
 * here: a bad one is recorded as a fault, and the (token, head) output is zeros.
 */
#include <math.h>

#include "common.cuh"

#define ATTN_THREADS 128 /* 4 warps */
#define ATTN_CHUNK 64    /* positions per chunk; <= ATTN_THREADS */
#define ATTN_MAX_HEAD_DIM 4096

// ----------------------------------------------------------------------------
// CUDA kernels

template <typename QT, typename CT, typename OT>
__global__ void __launch_bounds__(ATTN_THREADS)
    attention_kernel(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads, float scale,
                     tp_tensor out, tp_cuda_fault *fault)
{
    extern __shared__ float smem[];
    __shared__ int64_t row_s[ATTN_CHUNK]; /* element offset of each position's K/V row; -1: bad */
    __shared__ int bad_s;
    const int hd = cache.head_dim, bs = cache.block_size;
    float *q_s = smem, *acc_s = smem + hd, *p_s = smem + 2 * hd; /* [hd], [hd], [ATTN_CHUNK] */

    const int64_t i = blockIdx.x / q_heads;
    const int h = (int)(blockIdx.x % q_heads), kh = h / (q_heads / cache.n_kv_heads);
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int nwarps = blockDim.x / WARP_SIZE;
    OT *o = row_of<OT>(out, i) + (int64_t)h * hd;

    /* the token's own indices: uniform over the block, so an early return is safe */
    const int32_t seq = batch.seq[i], pos = batch.pos[i];
    int32_t code = TP_CUDA_FAULT_NONE, value = 0, limit = 0;
    if (seq < 0) code = TP_CUDA_FAULT_ATTN_SEQ, value = seq;
    else if (pos < 0 || pos >= batch.max_pos) code = TP_CUDA_FAULT_ATTN_POS, value = pos, limit = batch.max_pos;
    else if (pos / bs >= batch.max_blocks) code = TP_CUDA_FAULT_ATTN_TABLE, value = pos, limit = batch.max_blocks;
    if (code != TP_CUDA_FAULT_NONE) {
        if (tid == 0) fault_record(fault, code, i, value, limit);
        for (int e = tid; e < hd; e += blockDim.x) o[e] = from_f32<OT>(0.0f);
        return;
    }

    const QT *qv = row_of<const QT>(q, i) + (int64_t)h * hd;
    for (int e = tid; e < hd; e += blockDim.x) {
        q_s[e] = to_f32(qv[e]);
        acc_s[e] = 0.0f;
    }
    if (tid == 0) bad_s = 0;
    __syncthreads();

    const int32_t *bt = batch.block_table + (int64_t)seq * batch.max_blocks;
    const int64_t width = (int64_t)cache.n_kv_heads * hd;
    const CT *kc = (const CT *)cache.k, *vc = (const CT *)cache.v;
    const int np = pos + 1;
    float m = -INFINITY, l = 0.0f; /* the same values in every thread */

    for (int p0 = 0; p0 < np; p0 += ATTN_CHUNK) {
        const int cnt = min(ATTN_CHUNK, np - p0);
        /* scores: one warp per position */
        for (int c = warp; c < cnt; c += nwarps) {
            const int p = p0 + c;
            const int32_t blk = bt[p / bs];
            if (blk < 0 || blk >= cache.n_blocks) { /* uniform over the warp */
                if (lane == 0) {
                    fault_record(fault, TP_CUDA_FAULT_ATTN_BLOCK, i, blk, cache.n_blocks);
                    bad_s = 1;
                    row_s[c] = -1;
                    p_s[c] = -INFINITY;
                }
                continue;
            }
            const int64_t row = ((int64_t)blk * bs + p % bs) * width + (int64_t)kh * hd;
            const CT *kr = kc + row;
            float dot = 0.0f;
            for (int e = lane; e < hd; e += WARP_SIZE) dot += q_s[e] * to_f32(kr[e]);
            dot = warp_sum(dot);
            if (lane == 0) {
                row_s[c] = row;
                p_s[c] = scale * dot;
            }
        }
        __syncthreads();
        /* fold the chunk into the running softmax */
        float cmax = -INFINITY;
        for (int c = 0; c < cnt; c++) cmax = fmaxf(cmax, p_s[c]);
        const float m_new = fmaxf(m, cmax);
        const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
        __syncthreads(); /* every thread has read the scores */
        if (tid < cnt) p_s[tid] = expf(p_s[tid] - m_new);
        __syncthreads();
        float csum = 0.0f;
        for (int c = 0; c < cnt; c++) csum += p_s[c];
        l = l * corr + csum;
        for (int e = tid; e < hd; e += blockDim.x) {
            float a = acc_s[e] * corr;
            for (int c = 0; c < cnt; c++)
                if (row_s[c] >= 0) a += p_s[c] * to_f32(vc[row_s[c] + e]);
            acc_s[e] = a;
        }
        m = m_new;
        __syncthreads(); /* before the next chunk overwrites p_s and row_s */
    }

    const bool bad = bad_s != 0;
    for (int e = tid; e < hd; e += blockDim.x) o[e] = from_f32<OT>(bad ? 0.0f : acc_s[e] / l);
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_attention(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads,
                                       float scale, tp_tensor out, tp_cuda_fault *fault, cudaStream_t stream)
{
    const int64_t tasks = (int64_t)batch.n_tokens * q_heads;
    if (tasks <= 0) return TP_OK;
    if (cache.head_dim > ATTN_MAX_HEAD_DIM)
        return tp_error(TP_ERR_UNSUPPORTED, "attention: head_dim %d is more than the CUDA kernel's %d",
                        cache.head_dim, ATTN_MAX_HEAD_DIM);
    if (tasks > INT32_MAX)
        return tp_error(TP_ERR_UNSUPPORTED, "attention: %lld (token, head) pairs is too many", (long long)tasks);
    if (!is_float_dtype(q.dtype) || !is_float_dtype(cache.dtype) || !is_float_dtype(out.dtype))
        return TP_CUDA_BAD_DTYPE("attention");
    const size_t smem = (2 * (size_t)cache.head_dim + ATTN_CHUNK) * sizeof(float);
    dispatch_float(q.dtype, [&](auto qt) {
        dispatch_float(cache.dtype, [&](auto ct) {
            dispatch_float(out.dtype, [&](auto ot) {
                attention_kernel<decltype(qt), decltype(ct), decltype(ot)>
                    <<<(unsigned)tasks, ATTN_THREADS, smem, stream>>>(q, cache, batch, q_heads, scale, out, fault);
            });
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
