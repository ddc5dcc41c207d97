/*
 * swiglu.cu: out = silu(gate) * up with silu(g) = g / (1 + expf(-g)) (PyTorch's
 * formula, the CPU backend's), or (geglu, Gemma's MLP) gelu(gate) * up in GeLU's tanh form, one thread per element (eight for aligned 16-bit rows), f32
 * arithmetic rounded once to out's dtype. gate and up are usually column views of one gate|up matrix; out may alias
 * either (each element is read before it is written, by the same thread).
 */
#include "common.cuh"

#define SWIGLU_THREADS 256

// ----------------------------------------------------------------------------
// CUDA kernels

/* the gate's activation: SiLU, or (GELU) GeLU's tanh form as the CPU backend computes it */
template <bool GELU>
__device__ __forceinline__ float gate_act(float g)
{
    if (GELU) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));
}

/* One element per thread, block (row, chunk of SWIGLU_THREADS columns): with no loop there is
 * no chain of loads behind stores (out may alias gate or up, so a per-row loop could not run
 * ahead), and a batch of rows fills the GPU (a loop over one row per block took ~40 us at
 * 128 rows of 14336 on an H200). */
template <bool GELU, typename GT, typename UT, typename OT>
__global__ void swiglu_kernel(tp_tensor gate, tp_tensor up, tp_tensor out)
{
    pdl_begin(); /* inputs come from the previous kernel */
    const int64_t i = blockIdx.x, j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= out.cols) return;
    const float gv = to_f32(row_of<const GT>(gate, i)[j]);
    const float uv = to_f32(row_of<const UT>(up, i)[j]);
    row_of<OT>(out, i)[j] = from_f32<OT>(gate_act<GELU>(gv) * uv);
}

/* Eight elements per thread as 16-byte loads and stores, for 16-bit gate, up and out of
 * one dtype whose rows start 16-byte aligned (the gate|up matrix of the MLP): the scalar
 * kernel's 2-byte accesses took 10.5 us at 128 rows of 14336 on an H200, for 11 MB. */
template <bool GELU, typename T>
__global__ void swiglu_vec8_kernel(tp_tensor gate, tp_tensor up, tp_tensor out)
{
    pdl_begin(); /* inputs come from the previous kernel */
    const int64_t i = blockIdx.x, j = ((int64_t)blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (j >= out.cols) return;
    const uint4 gv = *(const uint4 *)(row_of<const T>(gate, i) + j);
    const uint4 uv = *(const uint4 *)(row_of<const T>(up, i) + j);
    const T *g8 = (const T *)&gv, *u8 = (const T *)&uv;
    uint4 ov;
    T *o8 = (T *)&ov;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const float gf = to_f32(g8[e]);
        o8[e] = from_f32<T>(gate_act<GELU>(gf) * to_f32(u8[e]));
    }
    *(uint4 *)(row_of<T>(out, i) + j) = ov;
}

// ----------------------------------------------------------------------------
// launcher

extern "C" tp_status tp_cuda_swiglu(tp_tensor gate, tp_tensor up, tp_tensor out, cudaStream_t stream)
{
    return tp_cuda_gated(gate, up, out, 0, stream);
}

template <bool GELU>
static tp_status gated(tp_tensor gate, tp_tensor up, tp_tensor out, cudaStream_t stream)
{
    if (out.rows == 0 || out.cols == 0) return TP_OK;
    if (!is_float_dtype(gate.dtype) || !is_float_dtype(up.dtype) || !is_float_dtype(out.dtype))
        return TP_CUDA_BAD_DTYPE(GELU ? "geglu" : "swiglu");
    const int threads = SWIGLU_THREADS;
    if ((out.dtype == TP_DTYPE_BF16 || out.dtype == TP_DTYPE_F16) && gate.dtype == out.dtype &&
        up.dtype == out.dtype && out.cols % 8 == 0 && rows_aligned16(gate) && rows_aligned16(up) &&
        rows_aligned16(out) && out.rows <= INT32_MAX && CEIL_DIV(out.cols / 8, (int64_t)threads) <= 65535) {
        const dim3 grid((unsigned)out.rows, (unsigned)CEIL_DIV(out.cols / 8, (int64_t)threads));
        if (out.dtype == TP_DTYPE_BF16) tp_launch(swiglu_vec8_kernel<GELU, bf16_t>, grid, threads, 0, stream, gate, up, out);
        else tp_launch(swiglu_vec8_kernel<GELU, f16_t>, grid, threads, 0, stream, gate, up, out);
        TP_CUDA_CHECK_LAUNCH();
        return TP_OK;
    }
    const int64_t chunks = CEIL_DIV(out.cols, (int64_t)threads);
    if (chunks > 65535 || out.rows > INT32_MAX)
        return tp_error(TP_ERR_UNSUPPORTED, "%s: [%lld, %lld] is larger than the kernel's grid", GELU ? "geglu" : "swiglu",
                        (long long)out.rows, (long long)out.cols);
    const dim3 grid((unsigned)out.rows, (unsigned)chunks);
    dispatch_float(gate.dtype, [&](auto gt) {
        dispatch_float(up.dtype, [&](auto ut) {
            dispatch_float(out.dtype, [&](auto ot) {
                tp_launch(swiglu_kernel<GELU, decltype(gt), decltype(ut), decltype(ot)>, grid, threads, 0, stream, gate, up,
                          out);
            });
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}

extern "C" tp_status tp_cuda_gated(tp_tensor gate, tp_tensor up, tp_tensor out, int gelu, cudaStream_t stream)
{
    return gelu ? gated<true>(gate, up, out, stream) : gated<false>(gate, up, out, stream);
}
