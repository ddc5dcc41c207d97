/*
 * common.cuh: what every kernel file shares: the 16-bit storage types and their f32
 * conversions (bit for bit those of src/dtype.c, so a value converted on the GPU equals
 * one converted by tp_convert, NaN payloads included), the dtype dispatch that turns a
 * runtime tp_dtype into a template argument, warp and block sums, and fault recording.
 */
#ifndef TP_CUDA_COMMON_CUH
#define TP_CUDA_COMMON_CUH

#include <stdint.h>

#include <utility>

#include <cuda_runtime.h>

#include "backend.h"
#include "cuda_check.h"
#include "kernels.h"

#define WARP_SIZE 32
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// ----------------------------------------------------------------------------
// element types: f32 is float; f16 and bf16 are their bits (conversions below)

struct f16_t {
    uint16_t bits;
};
struct bf16_t {
    uint16_t bits;
};

__device__ __forceinline__ float to_f32(float v) { return v; }

__device__ __forceinline__ float to_f32(bf16_t v) { return __uint_as_float((uint32_t)v.bits << 16); }

__device__ __forceinline__ float to_f32(f16_t v)
{
    const uint32_t h = v.bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact */
        const float f = (float)mant * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

template <typename T> __device__ __forceinline__ T from_f32(float f);

template <> __device__ __forceinline__ float from_f32<float>(float f) { return f; }

/* round to nearest even; NaN stays NaN (quiet) with its sign and top payload */
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float f)
{
    const uint32_t u = __float_as_uint(f);
    bf16_t r;
    if ((u & 0x7fffffffu) > 0x7f800000u) r.bits = (uint16_t)((u >> 16) | 0x0040u);
    else r.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return r;
}

template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float f)
{
    const uint32_t u = __float_as_uint(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t x = u & 0x7fffffffu;
    f16_t r;
    if (x > 0x7f800000u) r.bits = (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    else if (x >= 0x477ff000u) r.bits = (uint16_t)(sign | 0x7c00u); /* >= 65520: Inf */
    else if (x >= 0x38800000u) { /* normal: rebias, round 13 bits away */
        x -= 0x38000000u;
        r.bits = (uint16_t)(sign | ((x + 0xfffu + ((x >> 13) & 1u)) >> 13));
    } else if (x < 0x33000000u) r.bits = sign; /* below 2^-25: zero */
    else { /* subnormal result */
        const uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        r.bits = (uint16_t)(sign | q);
    }
    return r;
}

// ----------------------------------------------------------------------------
// eight consecutive elements as 16-byte accesses (p 16-byte aligned): one for 16-bit types,
// two for f32

template <typename T> __device__ __forceinline__ void load8(const T *p, float (&v)[8])
{
    if constexpr (sizeof(T) == 4) {
        const float4 a = *(const float4 *)p, b = *((const float4 *)p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        const uint4 u = *(const uint4 *)p;
        const T *e = (const T *)&u;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = to_f32(e[k]);
    }
}

template <typename T> __device__ __forceinline__ void store8(T *p, const float (&v)[8])
{
    if constexpr (sizeof(T) == 4) {
        *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
        *((float4 *)p + 1) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        uint4 u;
        T *e = (T *)&u;
#pragma unroll
        for (int k = 0; k < 8; k++) e[k] = from_f32<T>(v[k]);
        *(uint4 *)p = u;
    }
}

// ----------------------------------------------------------------------------
// tensors: row r of a strided matrix

template <typename T> __device__ __forceinline__ T *row_of(const tp_tensor &t, int64_t r)
{
    return (T *)t.data + r * t.stride;
}

// ----------------------------------------------------------------------------
// reductions (blockDim.x must be a multiple of WARP_SIZE)

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The sum of v over the block, returned to every thread. Call it from all threads. */
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float partial[WARP_SIZE];
    __shared__ float total;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < (int)(blockDim.x / WARP_SIZE) ? partial[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) total = t;
    }
    __syncthreads();
    return total;
}

// ----------------------------------------------------------------------------
// rotate-half rope (rope.cu, qk_rope_store.cu, attention.cu's fused form): the CPU backend's
// method, angle = (float)pos * inv_freq[j] (one f32 product), its cos and sin in f32, and
// each product and sum rounded on its own (no FMA contraction), so every kernel gives the
// same bits

__device__ __forceinline__ void rope_angle(int32_t pos, float inv_freq, float *c, float *s)
{
    sincosf(__fmul_rn((float)pos, inv_freq), s, c);
}

/* the pair (x1, x2) = (x[j], x[j + half]) rotated by (c, s), in f32 */
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, float *y1, float *y2)
{
    *y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// ----------------------------------------------------------------------------
// faults: the first kernel to see a bad index records it; backend_cuda.c reports it

__device__ __forceinline__ void fault_record(tp_cuda_fault *f, int32_t code, int64_t index,
                                             int64_t value, int64_t limit)
{
    if (f && atomicCAS(&f->code, 0, code) == 0) {
        f->index = (int32_t)index;
        f->value = (int32_t)value;
        f->limit = (int32_t)limit;
    }
}

// ----------------------------------------------------------------------------
// host side: dtype dispatch and launch shapes

static inline bool is_float_dtype(tp_dtype dt)
{
    return dt == TP_DTYPE_F32 || dt == TP_DTYPE_F16 || dt == TP_DTYPE_BF16;
}

/* f(T{}) with T the element type of dt; false (f not called) for a non-float dtype.
 * Nest calls to dispatch several arguments: f's parameter type is the template argument. */
template <typename F> static bool dispatch_float(tp_dtype dt, F &&f)
{
    switch (dt) {
    case TP_DTYPE_F32: f(float{}); return true;
    case TP_DTYPE_F16: f(f16_t{}); return true;
    case TP_DTYPE_BF16: f(bf16_t{}); return true;
    default: return false;
    }
}

/* Whether every row of t starts 16-byte aligned (16-byte loads and stores of its rows). */
static inline bool rows_aligned16(const tp_tensor &t)
{
    return (uintptr_t)t.data % 16 == 0 && (t.rows <= 1 || (t.stride * (int64_t)tp_dtype_size(t.dtype)) % 16 == 0);
}

/* Threads for a block that walks a row of cols elements: a multiple of 32, at most 256. */
static inline int row_threads(int64_t cols)
{
    if (cols >= 256) return 256;
    int t = (int)CEIL_DIV(cols, (int64_t)WARP_SIZE) * WARP_SIZE;
    return t < WARP_SIZE ? WARP_SIZE : t;
}

// ----------------------------------------------------------------------------
// programmatic dependent launch (Hopper): a decode step is hundreds of short kernels, and
// the gap between two of them (the next one's launch and block scheduling) is a sizeable
// part of a batch-1 step. A kernel launched by tp_launch may start while its predecessor in
// the stream is still running; it calls pdl_wait() before it reads anything an earlier
// kernel wrote (or writes anything one reads), and pdl_wait() returns only when the
// predecessor has finished and its writes are visible, so results are those of plain
// stream order. pdl_trigger() lets the next kernel launch early. TPINFER_PDL=0 turns it off
// (then both instructions are no-ops); so does a GPU older than sm_90.

__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Both, at the top of a kernel with nothing to do before its inputs are ready. */
__device__ __forceinline__ void pdl_begin()
{
    pdl_trigger();
    pdl_wait();
}

/* Whether tp_launch asks for early launch (TPINFER_PDL, read once; cuda/pdl.c). */
extern "C" int tp_cuda_pdl_enabled(void);

/* kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization
 * when tp_cuda_pdl_enabled(). A launch error is left for TP_CUDA_CHECK_LAUNCH(). */
template <typename... KArgs, typename... Args>
static inline void tp_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args &&...args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = tp_cuda_pdl_enabled() ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

/* The launch just enqueued, as a tp_status. */
#define TP_CUDA_CHECK_LAUNCH() TP_CUDA_CHECK(cudaGetLastError())

/* A dtype the dispatch cannot handle (the caller validated, so this is a bug). */
#define TP_CUDA_BAD_DTYPE(op) tp_error(TP_ERR_INTERNAL, "%s: a tensor has a dtype the CUDA kernel lacks", op)

#endif
