/*
 * argmax.cu: greedy sampling on the GPU, so that a decode step downloads L ids instead of
 * L x V logits. One block per row of f32 logits, in one read of the row: each thread walks
 * a strided part keeping its largest value with the lowest column and an online sum of
 * exp(x - max) in f32 (rescaled when its max rises); a block reduction merges those
 * (max, column, sum) triples, ties going to the lower column, and thread 0 writes the
 * column and -log(sum), the winner's log-softmax. The reduction order depends on the row
 * length alone, so a row gives the same bits whatever the batch around it.
 *
 * The limits match the CPU backend: a row all -inf gives column 0 and -log(V); +inf
 * entries win (the first of them) with -log(their count). A NaN is recorded as a fault
 * (the row, its lowest NaN column) that synchronize() reports; that row's outputs are the
 * NaN's column and NaN.
 */
#include <math.h>

#include "common.cuh"

#define ARGMAX_THREADS 1024
#define NO_COL INT32_MAX

// ----------------------------------------------------------------------------
// the running state of a part of a row, and how two parts merge

struct argmax_state {
    float m;     /* the largest value seen (-inf when none) */
    float s;     /* sum of exp(x - m) over the values seen; x == m counts 1 (equal infinities too) */
    int32_t col; /* the lowest column holding m; NO_COL when nothing was seen */
    int32_t nan; /* the lowest column holding NaN; NO_COL when none */
};

/* exp(from - to) for from <= to, with equal values (infinities included) giving 1. */
__device__ __forceinline__ float rescale(float from, float to)
{
    return from == to ? 1.0f : expf(from - to);
}

__device__ __forceinline__ void argmax_push(argmax_state &a, float x, int32_t j)
{
    if (isnan(x)) {
        if (j < a.nan) a.nan = j;
        return;
    }
    if (x > a.m) {
        a.s = a.s * rescale(a.m, x) + 1.0f;
        a.m = x;
        a.col = j;
    } else {
        a.s += rescale(x, a.m);
        if (x == a.m && j < a.col) a.col = j; /* only a leading -inf: columns rise */
    }
}

__device__ __forceinline__ argmax_state argmax_merge(const argmax_state &a, const argmax_state &b)
{
    const bool b_wins = b.m > a.m || (b.m == a.m && b.col < a.col);
    argmax_state r;
    r.m = b_wins ? b.m : a.m;
    r.col = b_wins ? b.col : a.col;
    r.s = a.s * rescale(a.m, r.m) + b.s * rescale(b.m, r.m);
    r.nan = a.nan < b.nan ? a.nan : b.nan;
    return r;
}

__device__ __forceinline__ argmax_state warp_argmax(argmax_state v)
{
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        argmax_state other;
        other.m = __shfl_xor_sync(0xffffffffu, v.m, o);
        other.s = __shfl_xor_sync(0xffffffffu, v.s, o);
        other.col = __shfl_xor_sync(0xffffffffu, v.col, o);
        other.nan = __shfl_xor_sync(0xffffffffu, v.nan, o);
        v = argmax_merge(v, other);
    }
    return v;
}

// ----------------------------------------------------------------------------
// CUDA kernel: block i reduces row i

/* x's value at column j, pushed; SUM: the running sum of exp(x - max) too (the logprob),
 * else only (max, column, NaN) are kept (a greedy step's: no exp an element). */
template <bool SUM> __device__ __forceinline__ void push(argmax_state &a, float x, int32_t j)
{
    if constexpr (SUM) {
        argmax_push(a, x, j);
    } else {
        if (isnan(x)) {
            if (j < a.nan) a.nan = j;
        } else if (x > a.m || (x == a.m && j < a.col)) { /* only a leading -inf: columns rise */
            a.m = x;
            a.col = j;
        }
    }
}

/* the four columns c .. c + 3 of v, in order */
template <bool SUM> __device__ __forceinline__ void push4(argmax_state &a, const float4 &v, int32_t c)
{
    push<SUM>(a, v.x, c);
    push<SUM>(a, v.y, c + 1);
    push<SUM>(a, v.z, c + 2);
    push<SUM>(a, v.w, c + 3);
}

/* VEC: the row starts 16-byte aligned and its columns are read as float4, four of them in
 * flight a thread (a scalar load each, four in flight, kept ~16 KB in flight an SM: 40 us for
 * 128 rows of 128256 on an H200, latency-bound). Either way a thread's columns rise, and
 * its part and the reduction's order depend on the row length alone. */
template <bool SUM, bool VEC>
__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_kernel(tp_tensor logits, int32_t *ids, float *logprob, float *value, tp_cuda_fault *fault)
{
    pdl_begin(); /* inputs come from the previous kernel */
    __shared__ argmax_state partial[ARGMAX_THREADS / WARP_SIZE];
    const int64_t row = blockIdx.x, V = logits.cols, step = blockDim.x;
    const float *__restrict__ x = row_of<const float>(logits, row);

    argmax_state st = {-INFINITY, 0.0f, NO_COL, NO_COL};
    int64_t j = threadIdx.x;
    if constexpr (VEC) {
        const float4 *__restrict__ x4 = (const float4 *)x;
        const int64_t V4 = V / 4;
        for (; j + 3 * step < V4; j += 4 * step) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = __ldg(x4 + j + u * step);
#pragma unroll
            for (int u = 0; u < 4; u++) push4<SUM>(st, v[u], (int32_t)(4 * (j + u * step)));
        }
        for (; j < V4; j += step) push4<SUM>(st, __ldg(x4 + j), (int32_t)(4 * j));
        /* the last V % 4 columns: thread t takes column 4 V4 + t, past every column it read */
        if (threadIdx.x < V - 4 * V4) push<SUM>(st, __ldg(x + 4 * V4 + threadIdx.x), (int32_t)(4 * V4 + threadIdx.x));
    } else {
        for (; j + 3 * step < V; j += 4 * step) { /* four loads in flight before the updates */
            const float v0 = __ldg(x + j), v1 = __ldg(x + j + step), v2 = __ldg(x + j + 2 * step),
                        v3 = __ldg(x + j + 3 * step);
            push<SUM>(st, v0, (int32_t)j);
            push<SUM>(st, v1, (int32_t)(j + step));
            push<SUM>(st, v2, (int32_t)(j + 2 * step));
            push<SUM>(st, v3, (int32_t)(j + 3 * step));
        }
        for (; j < V; j += step) push<SUM>(st, __ldg(x + j), (int32_t)j);
    }

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    st = warp_argmax(st);
    if (lane == 0) partial[warp] = st;
    __syncthreads();
    if (warp != 0) return;
    const argmax_state none = {-INFINITY, 0.0f, NO_COL, NO_COL};
    st = lane < (int)(blockDim.x / WARP_SIZE) ? partial[lane] : none;
    st = warp_argmax(st);
    if (lane != 0) return;
    if (st.nan != NO_COL) {
        fault_record(fault, TP_CUDA_FAULT_ARGMAX_NAN, row, st.nan, V);
        ids[row] = st.nan;
        if (logprob) logprob[row] = __int_as_float(0x7fc00000);
        if (value) value[row] = __int_as_float(0x7fc00000);
        return;
    }
    ids[row] = st.col;
    if (value) value[row] = st.m;
    if (logprob) logprob[row] = -logf(st.s);
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_argmax(tp_tensor logits, int32_t *ids, float *logprob, float *value,
                                    tp_cuda_fault *fault, cudaStream_t stream)
{
    if (logits.rows <= 0) return TP_OK;
    if (logits.dtype != TP_DTYPE_F32 || logits.cols <= 0 || logits.cols > INT32_MAX || logits.rows > INT32_MAX)
        return tp_error(TP_ERR_INTERNAL, "argmax: logits [%lld, %lld] of %s reached the CUDA kernel",
                        (long long)logits.rows, (long long)logits.cols, tp_dtype_name(logits.dtype));
    const int threads = logits.cols >= ARGMAX_THREADS
                            ? ARGMAX_THREADS
                            : (int)CEIL_DIV(logits.cols, (int64_t)WARP_SIZE) * WARP_SIZE;
    /* float4 where every row starts 16-byte aligned (the tail of V % 4 < 4 <= threads columns) */
    const bool vec = rows_aligned16(logits);
    auto kernel = logprob ? (vec ? argmax_kernel<true, true> : argmax_kernel<true, false>)
                          : (vec ? argmax_kernel<false, true> : argmax_kernel<false, false>);
    tp_launch(kernel, (unsigned)logits.rows, threads, 0, stream, logits, ids, logprob, value, fault);
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}

/* ids[i] from the TP ranks' winners of row i, as tp_argmax_merge: the largest value, the
 * lower rank on ties (a NaN value never wins; argmax recorded its fault) */
__global__ void argmax_merge_kernel(const int32_t *pairs, int n_tp, int32_t L, int32_t n, int64_t vocab_pad, int32_t *ids)
{
    pdl_begin(); /* pairs come from the previous kernel (the all-gather) */
    const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int32_t best = pairs[i];
    float best_v = __int_as_float(pairs[L + i]);
    for (int r = 1; r < n_tp; r++) {
        const int32_t *pr = pairs + (size_t)r * 2 * (size_t)L;
        const float v = __int_as_float(pr[L + i]);
        if (v > best_v) best_v = v, best = (int32_t)(r * vocab_pad) + pr[i];
    }
    ids[i] = best;
}

extern "C" tp_status tp_cuda_argmax_merge(const int32_t *pairs, int n_tp, int32_t L, int32_t n, int64_t vocab_pad,
                                          int32_t *ids, cudaStream_t stream)
{
    if (n <= 0) return TP_OK;
    tp_launch(argmax_merge_kernel, (unsigned)CEIL_DIV(n, 128), 128, 0, stream, pairs, n_tp, L, n, vocab_pad, ids);
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
