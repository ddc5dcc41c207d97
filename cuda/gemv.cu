/*
 * gemv.cu: y [n, m] = x [n, k] @ w [m, k]^T + bias for decode's few rows (n <= 8), and the
 * same product with silu(gate) * up fused on (matmul_swiglu: w [2m, k] is gate rows then
 * up rows; out[:, j] = silu(gate row j) * (up row j), no gate_up round trip), or added
 * into y (y += x @ w^T, matmul_add's form: o and down into the residual). matmul.c sends
 * products here under TPINFER_GEMV, which the engine sets at tp > 1, and those of one row
 * where the warm-up timed a batch-1 step faster so (tp_cuda_gemm_one_row). At such n
 * the time is the time to stream w once, so the kernel is built for bandwidth:
 *  - a group of G warps (G = 1, 2 or 4) owns R rows of w and splits k between its threads
 *    in 16-byte chunks; a block holds 4 warps, so 4 / G groups. Each thread has U chunks
 *    of each of its R rows in flight at once (16-byte loads that bypass L1, so that L1
 *    keeps x), and reads x (small, read by every group) through L1, each x value reused
 *    for the R rows;
 *  - f32 accumulation; each thread sums its chunks, a transposing warp reduction leaves
 *    lane q with the warp's total of value q, the G warps' totals meet in shared memory,
 *    and lane q of the group's first warp adds the bias (or y's value) and writes one
 *    output, rounded once to y's dtype;
 *  - G grows while the grid has fewer than 16 warps per SM, so narrow matrices (tensor-
 *    parallel slices) still keep enough loads in flight;
 *  - w is no earlier kernel's output, so under programmatic dependent launch a thread's
 *    first U chunks of each row are loaded into registers before the wait for the kernel
 *    before (n <= 4; TPINFER_GEMV_EARLY=0: into L2 only), and the next U into L2: the
 *    first round trip overlaps that kernel's end;
 *  - at n = 1 a thread's slots take the next round's chunks as each half round is used
 *    (PIPE), so half a round's loads or more stay in flight where a round's last sums
 *    would leave none (Llama-3-8B batch-1 decode 5.90 against 6.06 ms on an H100;
 *    TPINFER_GEMV_PIPE=0: the next round is loaded when this one is summed).
 * Every product is f32 (x and w widened exactly), so the result is the CPU backend's up
 * to the order of the f32 sums. R = 4, U = 4 for n = 1 (16 loads in flight; TPINFER_GEMV_WIDE=0:
 * R = 2, U = 4), R = 2, U = 4 for n = 2..4; R = 4, U = 2 above (x reused by more rows when n
 * is larger, the same 8 loads in flight).
 *
 * The fast path's conditions (tp_cuda_gemv_fits; matmul.c sends anything else to
 * cuBLASLt): 1 <= n <= 8, k >= 1; x and w of one dtype, or f32 x with f16/bf16 w (the
 * mixes cuBLASLt does through f32 copies that stay there); x and w 16-byte aligned, and
 * their row pitches (stride * element size) multiples of 16 bytes where they have more
 * than one row. k need not be a multiple of the chunk: the k % VW last columns are read
 * one element per thread. bias and y may have any float dtype and any alignment.
 */
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>

#include "common.cuh"

#define GEMV_THREADS 128
#define GEMV_WARPS (GEMV_THREADS / WARP_SIZE)
#define GEMV_MAX_N 8
#define GEMV_WARPS_PER_SM 16 /* G grows until the grid has this many warps per SM */

/* rows of w per group and chunks in flight per row, by n; WIDE (n = 1 unless
 * TPINFER_GEMV_WIDE=0): 4 rows x 4 chunks, twice the loads in flight per thread (batch-1
 * decode 5.07 against 5.11 ms on an H200, bench/RESULTS.md) */
template <int N, bool WIDE = false> struct gemv_shape {
    static constexpr int R = WIDE || N > 4 ? 4 : 2;
    static constexpr int U = WIDE || N <= 4 ? 4 : 2;
};

__host__ __device__ constexpr int pow2_ceil(int v) { return v <= 1 ? 1 : 2 * pow2_ceil((v + 1) / 2); }

// ----------------------------------------------------------------------------
// loads and conversions

/* 16 bytes of w: read once, so not kept in L1 (L2 prefetches the next 256 bytes) */
__device__ __forceinline__ uint4 load_stream(const void *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* 16 bytes as f32 values, exactly (hardware f16 conversion: exact for every finite value) */
__device__ __forceinline__ void widen(const uint4 &v, float (&f)[8], bf16_t)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        f[2 * q] = __uint_as_float(u[q] << 16);
        f[2 * q + 1] = __uint_as_float(u[q] & 0xffff0000u);
    }
}

__device__ __forceinline__ void widen(const uint4 &v, float (&f)[8], f16_t)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        f[2 * q] = __half2float(__ushort_as_half((unsigned short)(u[q] & 0xffffu)));
        f[2 * q + 1] = __half2float(__ushort_as_half((unsigned short)(u[q] >> 16)));
    }
}

__device__ __forceinline__ void widen(const uint4 &v, float (&f)[4], float)
{
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
}

/* VW consecutive elements of x at p (16-byte aligned) as f32, through L1: f32 x takes
 * VW / 4 loads, 16-bit x (VW = 8, as its w) one */
template <int VW> __device__ __forceinline__ void load_x(const char *p, float (&f)[VW], float)
{
#pragma unroll
    for (int t = 0; t < VW / 4; t++) {
        const float4 v = __ldg((const float4 *)p + t);
        f[4 * t] = v.x;
        f[4 * t + 1] = v.y;
        f[4 * t + 2] = v.z;
        f[4 * t + 3] = v.w;
    }
}

template <int VW, typename XT> __device__ __forceinline__ void load_x(const char *p, float (&f)[VW], XT)
{
    static_assert(VW == 8, "16-bit x goes with 16-bit w");
    widen(__ldg((const uint4 *)p), f, XT{});
}

/* element i of a float array of runtime dtype dt (bias, y: one access per output) */
__device__ __forceinline__ float load_any(const void *p, int32_t dt, int64_t i)
{
    switch (dt) {
    case TP_DTYPE_F16: return to_f32(((const f16_t *)p)[i]);
    case TP_DTYPE_BF16: return to_f32(((const bf16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__device__ __forceinline__ void store_any(void *p, int32_t dt, int64_t i, float v)
{
    switch (dt) {
    case TP_DTYPE_F16: ((f16_t *)p)[i] = from_f32<f16_t>(v); break;
    case TP_DTYPE_BF16: ((bf16_t *)p)[i] = from_f32<bf16_t>(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

// ----------------------------------------------------------------------------
// reduction

/* v[0..V) of every lane (V a power of two <= 32) summed over the warp: lane l returns the
 * total of value l % V. Each step halves the values a lane holds (keeping the half its
 * lane bit names, sending the other half to the partner): V - 1 + 5 - log2(V) shuffles
 * instead of 5 V. */
template <int V, int HALF = V / 2> __device__ __forceinline__ float warp_sum_transpose(float (&v)[V], int lane)
{
    if constexpr (HALF >= 1) {
        const bool upper = (lane & HALF) != 0;
#pragma unroll
        for (int j = 0; j < HALF; j++) {
            const float send = upper ? v[j] : v[j + HALF];
            const float keep = upper ? v[j + HALF] : v[j];
            v[j] = keep + __shfl_xor_sync(0xffffffffu, send, HALF);
        }
        return warp_sum_transpose<V, HALF / 2>(v, lane);
    } else {
#pragma unroll
        for (int o = V; o < WARP_SIZE; o *= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        return v[0];
    }
}

// ----------------------------------------------------------------------------
// CUDA kernel

/* x [N, k], w [rows, k], bias [1, rows] (data NULL: none), y [N, mo]. Matmul: rows = mo,
 * group g owns rows and outputs g*R .. g*R+R-1. SWIGLU: rows = 2 mo, group g owns outputs
 * j = g*P .. g*P+P-1 (P = R/2) and reads gate rows j and up rows mo + j. G warps per
 * group (1, 2, 4), the same for the whole grid. early: a thread's first chunks of w are
 * loaded before the wait for the previous kernel (N <= 4; at more rows their sums leave no
 * registers for them). */
template <typename XT, typename WT, int N, bool SWIGLU, bool WIDE = false, bool PIPE = false>
__global__ void __launch_bounds__(GEMV_THREADS, 4) gemv_kernel(tp_tensor x, tp_tensor w, tp_tensor bias, tp_tensor y,
                                                            int G, int add, int early)
{
    early = early && N <= 4;
    constexpr int R = gemv_shape<N, WIDE>::R, U = gemv_shape<N, WIDE>::U;
    static_assert(!PIPE || U % 2 == 0, "pipe refills half a round at a time");
    constexpr int P = SWIGLU ? R / 2 : R;         /* outputs per group (per row of x) */
    constexpr int VW = 16 / (int)sizeof(WT);      /* elements of w per 16-byte chunk */
    constexpr int V = pow2_ceil(R * N);           /* sums per group, padded for the reduction */
    static_assert(V <= WARP_SIZE, "one lane per sum");
    __shared__ float red[GEMV_WARPS][V];

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int64_t mo = y.cols, k = x.cols, nchunks = k / VW;
    const int64_t j0 = ((int64_t)blockIdx.x * (GEMV_WARPS / G) + warp / G) * P; /* first output */
    const int gt = (warp % G) * WARP_SIZE + lane, GT = G * WARP_SIZE; /* thread within the group */

    float acc[R][N];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < N; i++) acc[r][i] = 0.0f;

    const char *wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        /* outputs past mo read the last valid row (results dropped): no bounds checks */
        const int64_t j = j0 + (SWIGLU && r >= P ? r - P : r);
        const int64_t row = (SWIGLU && r >= P ? mo : 0) + (j < mo ? j : mo - 1);
        wrow[r] = (const char *)w.data + row * w.stride * (int64_t)sizeof(WT);
    }
    uint4 wv[U][R];
    auto load_slot = [&](uint4 (&slot)[R], int64_t c) { /* chunk c of each of the R rows (zeros past k) */
#pragma unroll
        for (int r = 0; r < R; r++) slot[r] = c < nchunks ? load_stream(wrow[r] + c * 16) : make_uint4(0, 0, 0, 0);
    };
    auto load_chunks = [&](int64_t c0) { /* U chunks of each of the R rows from chunk c0 on, GT apart */
#pragma unroll
        for (int u = 0; u < U; u++) load_slot(wv[u], c0 + (int64_t)u * GT);
    };

    /* The weights are not the previous kernel's output: while it finishes (programmatic
     * dependent launch, common.cuh), this thread's first chunks come into registers (early;
     * else into L2) and its next ones into L2. */
    pdl_trigger();
    if (j0 < mo) {
        if (early) load_chunks(gt);
#pragma unroll
        for (int r = 0; r < R; r++)
            for (int64_t c = gt + (early ? (int64_t)GT * U : 0); c < nchunks && c < gt + (int64_t)GT * 2 * U; c += GT)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow[r] + c * 16));
    }
    pdl_wait(); /* x (and y, which the previous kernel may still read) from here on */

    if (j0 < mo) { /* a group past the end only joins the __syncthreads below */
        const char *xb = (const char *)x.data;
        const int64_t xp = x.stride * (int64_t)sizeof(XT); /* x's row pitch in bytes */

        auto sum_chunk = [&](const uint4 (&slot)[R], int64_t c) { /* acc += chunk c of the R rows (in slot) . x's */
            float wf[R][VW];
#pragma unroll
            for (int r = 0; r < R; r++) widen(slot[r], wf[r], WT{});
#pragma unroll
            for (int i = 0; i < N; i++) {
                float xf[VW];
                load_x<VW>(xb + i * xp + c * VW * (int64_t)sizeof(XT), xf, XT{});
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int e = 0; e < VW; e++) acc[r][i] = fmaf(wf[r][e], xf[e], acc[r][i]);
            }
        };
        if constexpr (!PIPE) {
            for (int64_t c0 = gt; c0 < nchunks; c0 += (int64_t)GT * U) {
                if (c0 != gt || !early) load_chunks(c0); /* the first ones came before the wait */
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int64_t c = c0 + (int64_t)u * GT;
                    if (c >= nchunks) break;
                    sum_chunk(wv[u], c);
                }
            }
        } else {
            /* slots take the next round's chunks as each half round is used, so that half a
             * round's loads or more are always in flight (the same sums, in the same order) */
            if (!early) load_chunks(gt);
            for (int64_t c0 = gt; c0 < nchunks; c0 += (int64_t)GT * U) {
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int64_t c = c0 + (int64_t)u * GT;
                    if (c < nchunks) sum_chunk(wv[u], c);
                    if (u % (U / 2) == U / 2 - 1)
#pragma unroll
                        for (int v = u + 1 - U / 2; v <= u; v++) load_slot(wv[v], c0 + (int64_t)(U + v) * GT);
                }
            }
        }

        /* the k % VW last columns: one per thread of the group (VW <= 8 < 32) */
        const int64_t e = nchunks * VW + gt;
        if (e < k) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float wv = to_f32(((const WT *)wrow[r])[e]);
#pragma unroll
                for (int i = 0; i < N; i++) acc[r][i] = fmaf(wv, to_f32(((const XT *)(xb + i * xp))[e]), acc[r][i]);
            }
        }
    }

    /* value q = r * N + i: lane q of each warp gets the warp's total, shared memory the group's */
    float v[V];
#pragma unroll
    for (int q = 0; q < V; q++) v[q] = q < R * N ? acc[q / N][q % N] : 0.0f;
    const float s = warp_sum_transpose<V>(v, lane);
    if (lane < V) red[warp][lane] = s;
    __syncthreads();
    if (warp % G != 0 || j0 >= mo) return;

    const int q = lane, i = q % N;
    if (q >= P * N) return;
    const int64_t j = j0 + q / N;
    if (j >= mo) return;
    float t = 0.0f;
    for (int g = 0; g < G; g++) t += red[warp + g][q];
    if (bias.data) t += load_any(bias.data, bias.dtype, j);
    if (SWIGLU) { /* t is gate row j's sum; up row mo + j's is value q + P * N */
        float u = 0.0f;
        for (int g = 0; g < G; g++) u += red[warp + g][q + P * N];
        if (bias.data) u += load_any(bias.data, bias.dtype, mo + j);
        t = t / (1.0f + expf(-t)) * u;
    }
    if (add) t += load_any(y.data, y.dtype, i * y.stride + j); /* y += the product (one thread an output) */
    store_any(y.data, y.dtype, i * y.stride + j, t);
}

// ----------------------------------------------------------------------------
// launcher

extern "C" int tp_cuda_gemv_fits(const tp_tensor *x, const tp_tensor *w)
{
    if (x->rows < 1 || x->rows > GEMV_MAX_N || x->cols < 1 || w->rows < 1) return 0;
    const bool same = x->dtype == w->dtype && is_float_dtype(w->dtype);
    const bool widened = x->dtype == TP_DTYPE_F32 && (w->dtype == TP_DTYPE_F16 || w->dtype == TP_DTYPE_BF16);
    return (same || widened) && rows_aligned16(*x) && rows_aligned16(*w);
}

/* The kernel's later ways, read once: each is on unless its variable is 0, which gives the
 * way before it, kept for comparison (man tpinfer). wide: n = 1 in the 4-row shape
 * (TPINFER_GEMV_WIDE); early: the first chunks into registers before the wait, not only
 * into L2 (TPINFER_GEMV_EARLY); pipe: one row's next round half a round at a time, not
 * once this one is summed (TPINFER_GEMV_PIPE). */
struct gemv_options {
    bool wide, early, pipe;
};

static bool env_not_0(const char *name)
{
    const char *v = getenv(name);
    return !(v && !strcmp(v, "0"));
}

static const gemv_options &gemv_opts()
{
    static const gemv_options o = {env_not_0("TPINFER_GEMV_WIDE"), env_not_0("TPINFER_GEMV_EARLY"),
                                   env_not_0("TPINFER_GEMV_PIPE")};
    return o;
}

template <typename XT, typename WT, int N, bool SWIGLU, bool WIDE = false, bool PIPE = false>
static void gemv_launch(const tp_tensor &x, const tp_tensor &w, const tp_tensor &bias, const tp_tensor &y, int add,
                        int sms, cudaStream_t stream)
{
    constexpr int P = SWIGLU ? gemv_shape<N, WIDE>::R / 2 : gemv_shape<N, WIDE>::R;
    const int64_t groups = CEIL_DIV(y.cols, (int64_t)P), nchunks = x.cols / (16 / (int64_t)sizeof(WT));
    int G = 1;
    while (G < GEMV_WARPS && groups * G < (int64_t)GEMV_WARPS_PER_SM * sms && nchunks >= 2 * WARP_SIZE * G) G *= 2;
    const int64_t blocks = CEIL_DIV(groups, (int64_t)(GEMV_WARPS / G));
    tp_launch(gemv_kernel<XT, WT, N, SWIGLU, WIDE, PIPE>, (unsigned)blocks, GEMV_THREADS, 0, stream, x, w, bias, y, G, add,
              (int)gemv_opts().early);
}

template <typename XT, typename WT, bool SWIGLU>
static void gemv_dispatch_n(const tp_tensor &x, const tp_tensor &w, const tp_tensor &bias, const tp_tensor &y,
                            int add, int sms, cudaStream_t stream)
{
    const gemv_options &o = gemv_opts();
    switch (x.rows) {
    case 1:
        if (o.wide && o.pipe) gemv_launch<XT, WT, 1, SWIGLU, true, true>(x, w, bias, y, add, sms, stream);
        else if (o.wide) gemv_launch<XT, WT, 1, SWIGLU, true>(x, w, bias, y, add, sms, stream);
        else gemv_launch<XT, WT, 1, SWIGLU>(x, w, bias, y, add, sms, stream);
        break;
    case 2: gemv_launch<XT, WT, 2, SWIGLU>(x, w, bias, y, add, sms, stream); break;
    case 3: gemv_launch<XT, WT, 3, SWIGLU>(x, w, bias, y, add, sms, stream); break;
    case 4: gemv_launch<XT, WT, 4, SWIGLU>(x, w, bias, y, add, sms, stream); break;
    case 5: gemv_launch<XT, WT, 5, SWIGLU>(x, w, bias, y, add, sms, stream); break;
    case 6: gemv_launch<XT, WT, 6, SWIGLU>(x, w, bias, y, add, sms, stream); break;
    case 7: gemv_launch<XT, WT, 7, SWIGLU>(x, w, bias, y, add, sms, stream); break;
    default: gemv_launch<XT, WT, 8, SWIGLU>(x, w, bias, y, add, sms, stream); break;
    }
}

template <bool SWIGLU>
static bool gemv_dispatch(const tp_tensor &x, const tp_tensor &w, const tp_tensor &bias, const tp_tensor &y, int add,
                          int sms, cudaStream_t stream)
{
    if (x.dtype == w.dtype)
        return dispatch_float(w.dtype, [&](auto wt) {
            using T = decltype(wt);
            gemv_dispatch_n<T, T, SWIGLU>(x, w, bias, y, add, sms, stream);
        });
    if (x.dtype != TP_DTYPE_F32) return false;
    if (w.dtype == TP_DTYPE_BF16) gemv_dispatch_n<float, bf16_t, SWIGLU>(x, w, bias, y, add, sms, stream);
    else if (w.dtype == TP_DTYPE_F16) gemv_dispatch_n<float, f16_t, SWIGLU>(x, w, bias, y, add, sms, stream);
    else return false;
    return true;
}

extern "C" tp_status tp_cuda_gemv(tp_tensor x, tp_tensor w, tp_tensor bias, tp_tensor y, int form, int sms,
                                  cudaStream_t stream)
{
    if (y.rows == 0 || y.cols == 0) return TP_OK;
    const int swiglu = form == TP_GEMV_SWIGLU, add = form == TP_GEMV_ADD;
    if (!tp_cuda_gemv_fits(&x, &w) || y.rows != x.rows || w.rows != (swiglu ? 2 : 1) * y.cols ||
        !is_float_dtype(y.dtype) || (bias.data && !is_float_dtype(bias.dtype)) || (add && bias.data))
        return tp_error(TP_ERR_INTERNAL, "gemv: called for a shape, dtype or alignment it does not take");
    if (sms < 1) sms = 1;
    const bool ok = swiglu ? gemv_dispatch<true>(x, w, bias, y, 0, sms, stream)
                           : gemv_dispatch<false>(x, w, bias, y, add, sms, stream);
    if (!ok) return TP_CUDA_BAD_DTYPE("gemv");
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}
