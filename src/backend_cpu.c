/*
 * backend_cpu.c: the reference backend. Activations are f32 in ordinary host memory;
 * weights and the KV cache may be f32, f16 or bf16 and are widened to f32 as they are
 * read. Work is spread over OpenMP threads, and every result is computed the same way
 * whatever the thread count or the batch around it (see "matmul"), so a row decoded
 * alone is bit-identical to the same row inside a batch.
 *
 * Determinism: the sums below are written out lane by lane, and the build uses ISO C
 * (-std=c11), where GCC does not contract a*b+c into an FMA (-ffp-contract=off). With
 * -ffast-math or -ffp-contract=fast the results stay close but lose bit-invariance.
 * One caller at a time: operations share one scratch buffer, as a stream is in order.
 */
#include "backend.h"
#include "backend_check.h"
#include "sampler.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Below this many multiply-adds an operation runs on the calling thread alone. */
#define PAR_WORK 32768

#define ALIGN 64

/* ---- context: one scratch buffer the operations share (they never run at once) ------ */

typedef struct cpu_ctx {
    float *scratch;
    size_t scratch_floats;
    void *stage[2]; /* staging(): two host buffers, as the CUDA backend's pinned pair */
    size_t stage_cap[2];
    int stage_next;
    tp_sampler **samplers; /* sample(): one a thread, made for the vocabulary of the first call,
                            * remade if it changes */
    int n_samplers;
    int32_t sampler_vocab;
    void *slot[2]; /* download_start()'s host slots */
    size_t slot_cap[2], slot_bytes[2];
} cpu_ctx;

/* At least n floats of 64-byte aligned scratch, or NULL (out of memory). */
static float *scratch_get(cpu_ctx *ctx, size_t n)
{
    if (n <= ctx->scratch_floats && ctx->scratch) return ctx->scratch;
    if (n > (SIZE_MAX - ALIGN) / sizeof(float)) return NULL;
    size_t bytes = (n * sizeof(float) + ALIGN - 1) / ALIGN * ALIGN;
    free(ctx->scratch);
    ctx->scratch = aligned_alloc(ALIGN, bytes ? bytes : ALIGN);
    ctx->scratch_floats = ctx->scratch ? n : 0;
    return ctx->scratch;
}

/* ---- argument checks: every operation validates before it touches memory ---------- */

enum { ACT, WEIGHT }; /* what a tensor may hold: f32 activations, or any float type */


/* The shared checks, and the CPU's own rule: activations are float32. */
static tp_status check_tensor(const char *op, const char *name, const tp_tensor *t, int kind)
{
    if (t && kind == ACT && t->dtype != TP_DTYPE_F32)
        return tp_error(TP_ERR_INVALID_ARG, "%s: %s is %s; the cpu backend's activations are float32",
                        op, name, tp_dtype_name(t->dtype));
    return tp_check_tensor(op, name, t);
}


/* Row r of t, and of an f32 t. */
static inline void *row_ptr(const tp_tensor *t, int64_t r)
{
    return (char *)t->data + (size_t)(r * t->stride) * tp_dtype_size(t->dtype);
}

static inline float *row_f32(const tp_tensor *t, int64_t r)
{
    return (float *)t->data + r * t->stride;
}

/* ---- widening to f32: exact, and inline so that hot loops make no call per element -- */

static inline float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
    return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* dst[0..n) = src[0..n) of type dt as f32; src may be unaligned. Same values as
 * tp_convert, which these conversions match bit for bit. */
static void to_f32(float *dst, const void *src, tp_dtype dt, int64_t n)
{
    const unsigned char *s = src;
    int64_t j = 0;
    switch (dt) {
    case TP_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case TP_DTYPE_BF16:
        for (; j + 8 <= n; j += 8) { /* fixed-width block: GCC vectorizes it at -O2 */
            uint16_t h[8];
            uint32_t u[8];
            memcpy(h, s + 2 * j, sizeof h);
            for (int l = 0; l < 8; l++) u[l] = (uint32_t)h[l] << 16;
            memcpy(dst + j, u, sizeof u);
        }
        for (; j < n; j++) {
            uint16_t h;
            memcpy(&h, s + 2 * j, 2);
            dst[j] = bits_to_f32((uint32_t)h << 16);
        }
        break;
    case TP_DTYPE_F16:
        for (; j < n; j++) {
            uint16_t h;
            memcpy(&h, s + 2 * j, 2);
            dst[j] = f16_to_f32(h);
        }
        break;
    default:
        memset(dst, 0, (size_t)n * sizeof(float));
    }
}

/* A [1, n] weight as f32: its own memory when it is f32, else converted into buf. */
static const float *weight_row(const tp_tensor *w, float *buf)
{
    if (w->dtype == TP_DTYPE_F32) return w->data;
    to_f32(buf, w->data, w->dtype, w->cols);
    return buf;
}

/* ---- memory ------------------------------------------------------------------------ */

static tp_status cpu_alloc(tp_backend *b, size_t bytes, void **out)
{
    if (!out) return tp_error(TP_ERR_INVALID_ARG, "alloc: out is NULL");
    *out = NULL;
    if (bytes > SIZE_MAX - ALIGN)
        return tp_error(TP_ERR_OOM, "alloc: %zu bytes is more than this machine can address", bytes);
    size_t rounded = (bytes + ALIGN - 1) / ALIGN * ALIGN; /* aligned_alloc wants a multiple */
    *out = aligned_alloc(ALIGN, rounded ? rounded : ALIGN);
    if (!*out) return tp_error(TP_ERR_OOM, "alloc: out of memory allocating %zu bytes", bytes);
    return TP_OK;
}

static void cpu_free(tp_backend *b, void *p)
{
    free(p);
}

static tp_status cpu_copy(const char *op, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return TP_OK;
    if (!dst || !src) return tp_error(TP_ERR_INVALID_ARG, "%s: NULL pointer for %zu bytes", op, bytes);
    memcpy(dst, src, bytes);
    return TP_OK;
}

static tp_status cpu_upload(tp_backend *b, void *dst, const void *src, size_t bytes)
{
    return cpu_copy("upload", dst, src, bytes);
}

static tp_status cpu_download(tp_backend *b, void *dst, const void *src, size_t bytes)
{
    return cpu_copy("download", dst, src, bytes);
}

/* Everything has run when an op returns, so the copy is made at once; the slot keeps it
 * until download_wait, as the device's pinned slot would. */
static tp_status cpu_download_start(tp_backend *b, int k, const void *src, size_t bytes)
{
    cpu_ctx *ctx = b->ctx;
    if (k < 0 || k > 1) return tp_error(TP_ERR_INVALID_ARG, "download_start: slot %d is not 0 or 1", k);
    if (bytes > ctx->slot_cap[k]) {
        void *p = realloc(ctx->slot[k], bytes);
        if (!p) return tp_error(TP_ERR_OOM, "download_start: out of memory for %zu bytes", bytes);
        ctx->slot[k] = p;
        ctx->slot_cap[k] = bytes;
    }
    ctx->slot_bytes[k] = bytes;
    return cpu_copy("download_start", ctx->slot[k], src, bytes);
}

static tp_status cpu_download_wait(tp_backend *b, int k, void *dst)
{
    cpu_ctx *ctx = b->ctx;
    if (k < 0 || k > 1) return tp_error(TP_ERR_INVALID_ARG, "download_wait: slot %d is not 0 or 1", k);
    return cpu_copy("download_wait", dst, ctx->slot[k], ctx->slot_bytes[k]);
}

static tp_status cpu_memset0(tp_backend *b, void *p, size_t bytes)
{
    if (bytes == 0) return TP_OK;
    if (!p) return tp_error(TP_ERR_INVALID_ARG, "memset0: NULL pointer for %zu bytes", bytes);
    memset(p, 0, bytes);
    return TP_OK;
}

static tp_status cpu_synchronize(tp_backend *b)
{
    return TP_OK; /* every operation has finished when it returns */
}

/* ---- matmul ------------------------------------------------------------------------ */
/*
 * y (n,m) = x (n,k) @ w (m,k)^T + bias (m). Each output element is one dot product over
 * the whole of k, accumulated in LANES f32 lanes: product kk goes into lane kk % LANES
 * (the ragged tail is zero-padded to a full vector), and the lanes are summed at the end
 * as (l0 + l2) + (l1 + l3). That order depends on k alone, not on n, on the tile or slot
 * that computes the element, nor on the thread: batch and thread-count invariance follow.
 *
 * Cache blocking: a task is a block of MB rows of w (~256 KiB, so it stays in L2) times a
 * block of up to NB rows of x; bf16/f16 blocks are widened to f32 once per task into the
 * thread's scratch, not once per row of x. Inside, a micro-tile keeps NR x MR accumulator
 * vectors in registers, so each load of x is used MR times and each load of w NR times.
 * Decode-shaped calls (n <= NR, GEMV) are the same loop with one block of x, the threads
 * splitting m; there bf16 rows are widened in registers as the tile loads them, since
 * each element is used once anyway. Widening is exact, so every path gives the same bits.
 *
 * The vectors are GCC/Clang vector extensions, whose element-wise arithmetic is exactly
 * the lane arithmetic above. "#pragma omp simd reduction" would leave the order to the
 * compiler (vector width, peeling for alignment: a row could then sum differently alone
 * than inside a batch), and plain C lane arrays are not kept in registers by GCC 12 at
 * -O2 (about 4x slower).
 */

#define LANES 4 /* f32 lanes per accumulator: one SSE register */
#define NR 2    /* rows of x per micro-tile */
#define MR 4    /* rows of w per micro-tile */
#define NB 64   /* rows of x per task */
#define WBLOCK_FLOATS 65536 /* target size of one converted block of w: 256 KiB */

typedef float vlanes __attribute__((vector_size(LANES * sizeof(float))));

static inline vlanes load_lanes(const float *p)
{
    vlanes v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* LANES bf16 values widened to f32 in registers (exact: the bits move up 16 places). */
static inline vlanes load_lanes_bf16(const uint16_t *p)
{
    typedef uint16_t vh __attribute__((vector_size(LANES * sizeof(uint16_t))));
    typedef uint32_t vw __attribute__((vector_size(LANES * sizeof(uint32_t))));
    vh h;
    memcpy(&h, p, sizeof h);
    vw u = __builtin_convertvector(h, vw) << 16;
    vlanes v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline float sum_lanes(vlanes v)
{
    return (v[0] + v[2]) + (v[1] + v[3]);
}

/* out[r][c] = x[r] . w[c] over k, for r < nr (1 or NR) and c < MR; the rows of w are f32,
 * or bf16 widened as they are loaded (same values, so the same bits either way). */
static inline __attribute__((always_inline)) void
tile(int nr, int bf16, const float *const *x, const void *const *w, int64_t k, float out[NR][MR])
{
    vlanes acc[NR][MR];
    _Pragma("GCC unroll 8") for (int r = 0; r < nr; r++)
        _Pragma("GCC unroll 8") for (int c = 0; c < MR; c++) acc[r][c] = (vlanes){0};
    int64_t kk = 0;
    for (; kk + LANES <= k; kk += LANES) {
        vlanes xv[NR];
        _Pragma("GCC unroll 8") for (int r = 0; r < nr; r++) xv[r] = load_lanes(x[r] + kk);
        _Pragma("GCC unroll 8") for (int c = 0; c < MR; c++) {
            vlanes wv = bf16 ? load_lanes_bf16((const uint16_t *)w[c] + kk)
                             : load_lanes((const float *)w[c] + kk);
            _Pragma("GCC unroll 8") for (int r = 0; r < nr; r++) acc[r][c] += xv[r] * wv;
        }
    }
    if (kk < k) { /* the tail, zero-padded: 0 * 0 adds nothing */
        float xt[NR][LANES] = {{0}}, wt[MR][LANES] = {{0}};
        for (int r = 0; r < nr; r++) memcpy(xt[r], x[r] + kk, (size_t)(k - kk) * sizeof(float));
        for (int c = 0; c < MR; c++)
            to_f32(wt[c], (const char *)w[c] + (size_t)kk * (bf16 ? 2 : 4),
                   bf16 ? TP_DTYPE_BF16 : TP_DTYPE_F32, k - kk);
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < MR; c++) acc[r][c] += load_lanes(xt[r]) * load_lanes(wt[c]);
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < nr; r++)
        _Pragma("GCC unroll 8") for (int c = 0; c < MR; c++) out[r][c] = sum_lanes(acc[r][c]);
}

static void tile_f32_2(const float *const *x, const void *const *w, int64_t k, float out[NR][MR])
{
    tile(2, 0, x, w, k, out);
}

static void tile_f32_1(const float *const *x, const void *const *w, int64_t k, float out[NR][MR])
{
    tile(1, 0, x, w, k, out);
}

static void tile_bf16_2(const float *const *x, const void *const *w, int64_t k, float out[NR][MR])
{
    tile(2, 1, x, w, k, out);
}

static void tile_bf16_1(const float *const *x, const void *const *w, int64_t k, float out[NR][MR])
{
    tile(1, 1, x, w, k, out);
}

/* A single dot product, accumulated exactly as one element of a tile. */
static float dot(const float *a, const float *b, int64_t k)
{
    vlanes acc = {0};
    int64_t kk = 0;
    for (; kk + LANES <= k; kk += LANES) acc += load_lanes(a + kk) * load_lanes(b + kk);
    if (kk < k) {
        float at[LANES] = {0}, bt[LANES] = {0};
        memcpy(at, a + kk, (size_t)(k - kk) * sizeof(float));
        memcpy(bt, b + kk, (size_t)(k - kk) * sizeof(float));
        acc += load_lanes(at) * load_lanes(bt);
    }
    return sum_lanes(acc);
}

/* y rows [i0, i0+ni) x columns [j0, j0+nj). The rows of w come from wblock (widened, ldw
 * floats apart) when it is not NULL, else straight from w (f32, or bf16 widened in the
 * tile). add: each finished sum is added to y's value (one f32 addition, as a product
 * written out and added later gets). */
static void matmul_block(const tp_tensor *x, const float *wblock, int64_t ldw, const tp_tensor *w,
                         int64_t i0, int64_t ni, int64_t j0, int64_t nj, int64_t k,
                         const float *bias, int add, tp_tensor *y)
{
    const int bf16 = !wblock && w->dtype == TP_DTYPE_BF16;
    for (int64_t c = 0; c < nj; c += MR) {
        const void *wr[MR];
        for (int cc = 0; cc < MR; cc++) { /* past the edge: repeat the last row, drop the result */
            int64_t j = c + cc < nj ? c + cc : nj - 1;
            wr[cc] = wblock ? (const void *)(wblock + j * ldw) : row_ptr(w, j0 + j);
        }
        int64_t nc = nj - c < MR ? nj - c : MR;
        for (int64_t i = 0; i < ni; i += NR) {
            const float *xr[NR];
            float out[NR][MR];
            int64_t nr = ni - i < NR ? ni - i : NR;
            for (int r = 0; r < NR; r++) xr[r] = row_f32(x, i0 + i + (r < nr ? r : nr - 1));
            if (bf16 && nr == NR) tile_bf16_2(xr, wr, k, out);
            else if (bf16) tile_bf16_1(xr, wr, k, out);
            else if (nr == NR) tile_f32_2(xr, wr, k, out);
            else tile_f32_1(xr, wr, k, out);
            for (int64_t r = 0; r < nr; r++) {
                float *yr = row_f32(y, i0 + i + r) + j0 + c;
                for (int64_t cc = 0; cc < nc; cc++) {
                    const float v = bias ? out[r][cc] + bias[j0 + c + cc] : out[r][cc];
                    yr[cc] = add ? yr[cc] + v : v;
                }
            }
        }
    }
}

/* matmul (op "matmul") or matmul_add (op "matmul_add": add, no bias) */
static tp_status matmul_into(tp_backend *b, const char *op, const tp_tensor *x, const tp_tensor *w,
                             const tp_tensor *bias, int add, tp_tensor *y)
{
    TP_CHECK(check_tensor(op, "x", x, ACT));
    TP_CHECK(check_tensor(op, "w", w, WEIGHT));
    TP_CHECK(check_tensor(op, "y", y, ACT));
    if (x->cols != w->cols)
        return tp_error(TP_ERR_INVALID_ARG, "%s: x has %lld columns but w has %lld", op, (long long)x->cols,
                        (long long)w->cols);
    TP_CHECK(tp_check_shape(op, "y", y, x->rows, w->rows));
    if (bias) {
        TP_CHECK(check_tensor(op, "bias", bias, WEIGHT));
        TP_CHECK(tp_check_shape(op, "bias", bias, 1, w->rows));
    }
    const int64_t n = x->rows, k = x->cols, m = w->rows;
    if (n == 0 || m == 0 || (add && k == 0)) return TP_OK;
    if (k == 0) { /* empty sums: y = bias, or zeros */
        for (int64_t i = 0; i < n; i++)
            if (bias) tp_convert(row_f32(y, i), TP_DTYPE_F32, bias->data, bias->dtype, (size_t)m);
            else memset(row_f32(y, i), 0, (size_t)m * sizeof(float));
        return TP_OK;
    }

    /* MB rows of w per block: a multiple of MR, ~WBLOCK_FLOATS, and enough blocks for
     * every thread to have several (the split never changes a result). */
    const int nt = max_threads();
    int64_t mb = WBLOCK_FLOATS / k;
    if (mb > 64) mb = 64;
    while (mb > MR && (m + mb - 1) / mb < 4 * nt) mb /= 2;
    mb = mb < MR ? MR : mb / MR * MR;
    const int64_t n_mblocks = (m + mb - 1) / mb, n_nblocks = (n + NB - 1) / NB;
    const int64_t tasks = n_mblocks * n_nblocks;

    /* f32 weights are read in place; bf16 ones too when n <= NR (each element is widened
     * once either way); otherwise blocks are widened into scratch rows ldw floats apart
     * (padded so that the rows of a block do not share L1 sets). */
    const int widen = w->dtype == TP_DTYPE_F16 || (w->dtype == TP_DTYPE_BF16 && n > NR);
    const int64_t ldw = (k + 15) / 16 * 16 + 16;
    const int64_t bias_floats = bias && bias->dtype != TP_DTYPE_F32 ? (m + 15) / 16 * 16 : 0;
    size_t need = (size_t)bias_floats + (widen ? (size_t)nt * (size_t)(mb * ldw) : 0);
    float *scratch = need ? scratch_get(b->ctx, need) : NULL;
    if (need && !scratch)
        return tp_error(TP_ERR_OOM, "matmul: out of memory for %zu floats of scratch", need);
    const float *bv = bias ? weight_row(bias, scratch) : NULL;
    float *wblocks = widen ? scratch + bias_floats : NULL;

#pragma omp parallel num_threads(nt) if (tasks > 1 && (double)n * m * k > PAR_WORK)
    {
        float *wblock = widen ? wblocks + (size_t)thread_id() * (size_t)(mb * ldw) : NULL;
        int64_t have = -1; /* which block of w wblock holds */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t jb = t / n_nblocks, ib = t % n_nblocks;
            int64_t j0 = jb * mb, nj = m - j0 < mb ? m - j0 : mb;
            int64_t i0 = ib * NB, ni = n - i0 < NB ? n - i0 : NB;
            if (widen && have != jb) {
                for (int64_t j = 0; j < nj; j++) to_f32(wblock + j * ldw, row_ptr(w, j0 + j), w->dtype, k);
                have = jb;
            }
            matmul_block(x, wblock, ldw, w, i0, ni, j0, nj, k, bv, add, y);
        }
    }
    return TP_OK;
}

static tp_status cpu_matmul(tp_backend *b, const tp_tensor *x, const tp_tensor *w,
                            const tp_tensor *bias, tp_tensor *y)
{
    return matmul_into(b, "matmul", x, w, bias, 0, y);
}

/* ---- normalization ----------------------------------------------------------------- */

/* out = r * (1 / sqrt(mean(r^2) + eps)) * w over d elements (Hugging Face LlamaRMSNorm in
 * f32; the mean of squares is summed in double, then rounded to f32). out may be r. */
static void rmsnorm_row(float *out, const float *r, const float *w, int64_t d, float eps)
{
    double ss = 0.0;
    for (int64_t j = 0; j < d; j++) ss += (double)r[j] * (double)r[j];
    float var = d > 0 ? (float)(ss / (double)d) : 0.0f;
    float inv = 1.0f / sqrtf(var + eps);
    for (int64_t j = 0; j < d; j++) out[j] = r[j] * inv * w[j];
}

static tp_status cpu_add_rmsnorm(tp_backend *b, tp_tensor *residual, const tp_tensor *delta,
                                 const tp_tensor *weight, float eps, tp_tensor *out)
{
    TP_CHECK(check_tensor("add_rmsnorm", "residual", residual, ACT));
    TP_CHECK(check_tensor("add_rmsnorm", "weight", weight, WEIGHT));
    TP_CHECK(check_tensor("add_rmsnorm", "out", out, ACT));
    const int64_t n = residual->rows, d = residual->cols;
    if (delta) {
        TP_CHECK(check_tensor("add_rmsnorm", "delta", delta, ACT));
        TP_CHECK(tp_check_shape("add_rmsnorm", "delta", delta, n, d));
    }
    TP_CHECK(tp_check_shape("add_rmsnorm", "weight", weight, 1, d));
    TP_CHECK(tp_check_shape("add_rmsnorm", "out", out, n, d));
    if (n == 0) return TP_OK;
    float *buf = weight->dtype == TP_DTYPE_F32 ? NULL : scratch_get(b->ctx, (size_t)d);
    if (weight->dtype != TP_DTYPE_F32 && !buf)
        return tp_error(TP_ERR_OOM, "add_rmsnorm: out of memory");
    const float *w = weight_row(weight, buf);

#pragma omp parallel for schedule(static) if ((double)n * d > PAR_WORK)
    for (int64_t i = 0; i < n; i++) {
        float *r = row_f32(residual, i);
        if (delta) {
            const float *dl = row_f32(delta, i);
            for (int64_t j = 0; j < d; j++) r[j] += dl[j];
        }
        rmsnorm_row(row_f32(out, i), r, w, d, eps);
    }
    return TP_OK;
}

static tp_status cpu_head_rmsnorm(tp_backend *b, tp_tensor *x, int32_t head_dim,
                                  const tp_tensor *weight, float eps)
{
    TP_CHECK(check_tensor("head_rmsnorm", "x", x, ACT));
    TP_CHECK(check_tensor("head_rmsnorm", "weight", weight, WEIGHT));
    if (head_dim <= 0 || x->cols % head_dim != 0)
        return tp_error(TP_ERR_INVALID_ARG, "head_rmsnorm: x has %lld columns, not a multiple of "
                        "head_dim %d", (long long)x->cols, head_dim);
    TP_CHECK(tp_check_shape("head_rmsnorm", "weight", weight, 1, head_dim));
    const int64_t n = x->rows, heads = x->cols / head_dim;
    if (n == 0 || heads == 0) return TP_OK;
    float *buf = weight->dtype == TP_DTYPE_F32 ? NULL : scratch_get(b->ctx, (size_t)head_dim);
    if (weight->dtype != TP_DTYPE_F32 && !buf)
        return tp_error(TP_ERR_OOM, "head_rmsnorm: out of memory");
    const float *w = weight_row(weight, buf);

#pragma omp parallel for schedule(static) if ((double)n * x->cols > PAR_WORK)
    for (int64_t i = 0; i < n; i++) {
        float *r = row_f32(x, i);
        for (int64_t h = 0; h < heads; h++) rmsnorm_row(r + h * head_dim, r + h * head_dim, w, head_dim, eps);
    }
    return TP_OK;
}

/* ---- rotary embedding ---------------------------------------------------------------- */
/*
 * Hugging Face rotate-half, in f32 as HF computes it: freq = (float)pos * inv_freq[j] (an
 * f32 product), cos/sin of that f32 value with cosf/sinf, then
 * x[j] <- x[j] cos - x[j+h] sin, x[j+h] <- x[j+h] cos + x[j] sin, for j < h = head_dim/2.
 */
static tp_status cpu_rope(tp_backend *b, tp_tensor *x, int32_t head_dim, const int32_t *pos,
                          const float *inv_freq)
{
    TP_CHECK(check_tensor("rope", "x", x, ACT));
    if (head_dim <= 0 || head_dim % 2 != 0 || x->cols % head_dim != 0)
        return tp_error(TP_ERR_INVALID_ARG, "rope: head_dim %d must be even and divide x's %lld "
                        "columns", head_dim, (long long)x->cols);
    const int64_t n = x->rows, heads = x->cols / head_dim, half = head_dim / 2;
    if (n == 0 || heads == 0) return TP_OK;
    if (!pos || !inv_freq) return tp_error(TP_ERR_INVALID_ARG, "rope: pos or inv_freq is NULL");

#pragma omp parallel for schedule(static) if ((double)n * x->cols > PAR_WORK / 4)
    for (int64_t i = 0; i < n; i++) {
        float *r = row_f32(x, i);
        const float p = (float)pos[i];
        for (int64_t j = 0; j < half; j++) {
            const float f = p * inv_freq[j];
            const float c = cosf(f), s = sinf(f);
            for (int64_t h = 0; h < heads; h++) {
                float *v = r + h * head_dim;
                const float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * c - x2 * s;
                v[j + half] = x2 * c + x1 * s;
            }
        }
    }
    return TP_OK;
}

/* ---- KV cache and attention ---------------------------------------------------------- */

/* Element offset of (slot, kv head) in a cache laid out [n_blocks, block_size, heads, hd]. */
static inline size_t cache_off(const tp_kv_layer *c, int64_t slot, int64_t head)
{
    return (size_t)((slot * c->n_kv_heads + head) * c->head_dim);
}

/* Slots below zero are padding and are skipped (vLLM's convention). */
static tp_status cpu_kv_store(tp_backend *b, const tp_tensor *k, const tp_tensor *v,
                              tp_kv_layer *cache, const tp_attn_batch *batch)
{
    TP_CHECK(tp_check_cache("kv_store", cache));
    if (!batch) return tp_error(TP_ERR_INVALID_ARG, "kv_store: batch is NULL");
    TP_CHECK(check_tensor("kv_store", "k", k, ACT));
    TP_CHECK(check_tensor("kv_store", "v", v, ACT));
    const int64_t n = batch->n_tokens, width = (int64_t)cache->n_kv_heads * cache->head_dim;
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "kv_store: batch has %lld tokens", (long long)n);
    TP_CHECK(tp_check_shape("kv_store", "k", k, n, width));
    TP_CHECK(tp_check_shape("kv_store", "v", v, n, width));
    if (n == 0) return TP_OK;
    if (!batch->slot) return tp_error(TP_ERR_INVALID_ARG, "kv_store: batch->slot is NULL");
    const int64_t slots = (int64_t)cache->n_blocks * cache->block_size;
    for (int64_t i = 0; i < n; i++)
        if (batch->slot[i] >= slots)
            return tp_error(TP_ERR_INVALID_ARG, "kv_store: token %lld has slot %d, past the cache's "
                            "%lld slots (%d blocks of %d)", (long long)i, batch->slot[i],
                            (long long)slots, cache->n_blocks, cache->block_size);
    const size_t es = tp_dtype_size(cache->dtype);
    for (int64_t i = 0; i < n; i++) {
        if (batch->slot[i] < 0) continue;
        size_t off = cache_off(cache, batch->slot[i], 0) * es;
        tp_convert((char *)cache->k + off, cache->dtype, row_f32(k, i), TP_DTYPE_F32, (size_t)width);
        tp_convert((char *)cache->v + off, cache->dtype, row_f32(v, i), TP_DTYPE_F32, (size_t)width);
    }
    return TP_OK;
}

static tp_status check_attn_batch(const tp_kv_layer *c, const tp_attn_batch *ab)
{
    if (ab->n_tokens == 0) return TP_OK;
    if (!ab->seq || !ab->pos || !ab->block_table)
        return tp_error(TP_ERR_INVALID_ARG, "attention: batch has a NULL seq, pos or block_table");
    if (ab->max_blocks <= 0 || ab->max_pos <= 0)
        return tp_error(TP_ERR_INVALID_ARG, "attention: batch has max_blocks %d, max_pos %d; both "
                        "must be > 0", ab->max_blocks, ab->max_pos);
    if (ab->window < 0) return tp_error(TP_ERR_INVALID_ARG, "attention: batch has window %d", ab->window);
    if (!(ab->softcap >= 0)) return tp_error(TP_ERR_INVALID_ARG, "attention: batch has softcap %g", ab->softcap);
    for (int32_t i = 0; i < ab->n_tokens; i++) {
        int32_t s = ab->seq[i], p = ab->pos[i];
        if (s < 0) return tp_error(TP_ERR_INVALID_ARG, "attention: token %d has sequence %d", i, s);
        if (p < 0 || p >= ab->max_pos)
            return tp_error(TP_ERR_INVALID_ARG, "attention: token %d has position %d, outside "
                            "[0, max_pos %d)", i, p, ab->max_pos);
        if (p / c->block_size >= ab->max_blocks)
            return tp_error(TP_ERR_INVALID_ARG, "attention: token %d at position %d needs logical "
                            "block %d, but the block table has %d columns", i, p,
                            p / c->block_size, ab->max_blocks);
        const int32_t *bt = ab->block_table + (int64_t)s * ab->max_blocks;
        for (int32_t lb = 0; lb <= p / c->block_size; lb++)
            if (bt[lb] < 0 || bt[lb] >= c->n_blocks)
                return tp_error(TP_ERR_INVALID_ARG, "attention: sequence %d maps logical block %d "
                                "to physical block %d, outside the cache's %d", s, lb, bt[lb],
                                c->n_blocks);
    }
    return TP_OK;
}

/* Row of K or V at (sequence position p, kv head) as f32: in place when the cache is f32,
 * else widened into buf. */
static const float *cache_row(const tp_kv_layer *c, const void *base, const int32_t *bt, int32_t p,
                              int64_t head, float *buf)
{
    int64_t slot = (int64_t)bt[p / c->block_size] * c->block_size + p % c->block_size;
    size_t off = cache_off(c, slot, head);
    if (c->dtype == TP_DTYPE_F32) return (const float *)base + off;
    to_f32(buf, (const char *)base + off * tp_dtype_size(c->dtype), c->dtype, c->head_dim);
    return buf;
}

/* acc[0..n) += a * v[0..n) (element-wise, so the order over positions is all that matters). */
static void axpy(float *acc, float a, const float *v, int64_t n)
{
    int64_t j = 0;
    vlanes av = {a, a, a, a};
    for (; j + LANES <= n; j += LANES) {
        vlanes s = load_lanes(acc + j) + av * load_lanes(v + j);
        memcpy(acc + j, &s, sizeof s);
    }
    for (; j < n; j++) acc[j] += a * v[j];
}

/*
 * For token i and q head h: scores s_p = scale * q.k_p over positions p = 0..pos[i] of
 * the token's sequence, softmax in f32 with the maximum subtracted, out = sum_p e_p v_p /
 * sum_p e_p. Each (token, head) is one task whose arithmetic does not depend on the rest
 * of the batch. out may be q itself (a task reads its slice of q before writing it).
 */
static tp_status cpu_attention(tp_backend *b, const tp_tensor *q, const tp_kv_layer *cache,
                               const tp_attn_batch *batch, int32_t q_heads, float scale,
                               tp_tensor *out)
{
    TP_CHECK(tp_check_cache("attention", cache));
    if (!batch) return tp_error(TP_ERR_INVALID_ARG, "attention: batch is NULL");
    TP_CHECK(check_tensor("attention", "q", q, ACT));
    TP_CHECK(check_tensor("attention", "out", out, ACT));
    const int64_t hd = cache->head_dim, kvh = cache->n_kv_heads, n = batch->n_tokens;
    if (q_heads <= 0 || q_heads % kvh != 0)
        return tp_error(TP_ERR_INVALID_ARG, "attention: %d q heads is not a positive multiple of the "
                        "cache's %lld kv heads", q_heads, (long long)kvh);
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "attention: batch has %lld tokens", (long long)n);
    TP_CHECK(tp_check_shape("attention", "q", q, n, q_heads * hd));
    TP_CHECK(tp_check_shape("attention", "out", out, n, q_heads * hd));
    TP_CHECK(check_attn_batch(cache, batch));
    if (n == 0) return TP_OK;

    /* per thread: scores [max_pos], acc [hd], k and v rows [hd] each */
    const int nt = max_threads();
    const size_t per = ((size_t)batch->max_pos + 3 * (size_t)hd + 15) / 16 * 16;
    float *scratch = scratch_get(b->ctx, per * (size_t)nt);
    if (!scratch) return tp_error(TP_ERR_OOM, "attention: out of memory for scratch");
    const int64_t group = q_heads / kvh, tasks = n * q_heads;
    const float cap = batch->softcap;

#pragma omp parallel num_threads(nt) if (tasks > 1 && (double)tasks * batch->max_pos * hd > PAR_WORK)
    {
        float *scores = scratch + per * (size_t)thread_id();
        float *acc = scores + batch->max_pos, *kbuf = acc + hd, *vbuf = kbuf + hd;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t i = t / q_heads, h = t % q_heads, kh = h / group;
            const int32_t np = batch->pos[i] + 1, lo = tp_attn_first_key(batch->pos[i], batch->window);
            const int32_t *bt = batch->block_table + (int64_t)batch->seq[i] * batch->max_blocks;
            const float *qv = row_f32(q, i) + h * hd;
            float mx = -INFINITY;
            for (int32_t p = lo; p < np; p++) {
                float s = scale * dot(qv, cache_row(cache, cache->k, bt, p, kh, kbuf), hd);
                if (cap > 0) s = cap * tanhf(s / cap);
                scores[p] = s;
                if (s > mx) mx = s;
            }
            float sum = 0.0f;
            memset(acc, 0, (size_t)hd * sizeof(float));
            for (int32_t p = lo; p < np; p++) {
                float e = expf(scores[p] - mx);
                sum += e;
                axpy(acc, e, cache_row(cache, cache->v, bt, p, kh, vbuf), hd);
            }
            float *o = row_f32(out, i) + h * hd;
            for (int64_t j = 0; j < hd; j++) o[j] = acc[j] / sum;
        }
    }
    return TP_OK;
}

/* ---- element-wise, gathers, conversions ---------------------------------------------- */

/* out = act(gate) * up, in float32: SiLU, silu(g) = g / (1 + exp(-g)) (PyTorch's formula),
 * or (gelu) GeLU's tanh form, 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) (PyTorch's
 * gelu(approximate="tanh")). out may alias gate or up. */
static tp_status cpu_gated(const char *op, int gelu, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out)
{
    TP_CHECK(check_tensor(op, "gate", gate, ACT));
    TP_CHECK(check_tensor(op, "up", up, ACT));
    TP_CHECK(check_tensor(op, "out", out, ACT));
    TP_CHECK(tp_check_shape(op, "up", up, gate->rows, gate->cols));
    TP_CHECK(tp_check_shape(op, "out", out, gate->rows, gate->cols));
    const int64_t n = gate->rows, m = gate->cols;
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */

#pragma omp parallel for schedule(static) if ((double)n * m > PAR_WORK / 4)
    for (int64_t i = 0; i < n; i++) {
        const float *g = row_f32(gate, i), *u = row_f32(up, i);
        float *o = row_f32(out, i);
        if (gelu)
            for (int64_t j = 0; j < m; j++) o[j] = 0.5f * g[j] * (1.0f + tanhf(k * (g[j] + 0.044715f * g[j] * g[j] * g[j]))) * u[j];
        else
            for (int64_t j = 0; j < m; j++) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
    return TP_OK;
}

/* x = cap tanh(x / cap) in place */
static tp_status cpu_softcap(tp_backend *b, tp_tensor *x, float cap)
{
    (void)b;
    TP_CHECK(check_tensor("softcap", "x", x, ACT));
    if (!(cap > 0)) return tp_error(TP_ERR_INVALID_ARG, "softcap: cap %g must be > 0", cap);
    const int64_t n = x->rows, m = x->cols;
#pragma omp parallel for schedule(static) if ((double)n * m > PAR_WORK / 4)
    for (int64_t i = 0; i < n; i++) {
        float *v = row_f32(x, i);
        for (int64_t j = 0; j < m; j++) v[j] = cap * tanhf(v[j] / cap);
    }
    return TP_OK;
}

static tp_status cpu_swiglu(tp_backend *b, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out)
{
    (void)b;
    return cpu_gated("swiglu", 0, gate, up, out);
}

static tp_status cpu_geglu(tp_backend *b, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out)
{
    (void)b;
    return cpu_gated("geglu", 1, gate, up, out);
}

/* backend.h: the host's merge, and the CPU backend's argmax_merge */
void tp_argmax_merge(const int32_t *pairs, int n_tp, int32_t L, int32_t n, int64_t vocab_pad, int32_t *ids)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t best = pairs[i];
        float best_v;
        memcpy(&best_v, pairs + L + i, sizeof best_v);
        for (int r = 1; r < n_tp; r++) {
            const int32_t *pr = pairs + (size_t)r * 2 * (size_t)L;
            float v;
            memcpy(&v, pr + L + i, sizeof v);
            if (v > best_v) best_v = v, best = (int32_t)(r * vocab_pad) + pr[i];
        }
        ids[i] = best;
    }
}

static tp_status cpu_argmax_merge(tp_backend *b, const int32_t *pairs, int n_tp, int32_t L, int32_t n,
                                  int64_t vocab_pad, int32_t *ids)
{
    TP_CHECK(tp_check_argmax_merge(pairs, n_tp, L, n, ids));
    tp_argmax_merge(pairs, n_tp, L, n, vocab_pad, ids);
    return TP_OK;
}

static tp_status cpu_take_ids(tp_backend *b, int32_t *ids, const int32_t *from, int32_t n_from, int32_t stride,
                              const int32_t *take, int32_t n)
{
    TP_CHECK(tp_check_take_ids(ids, from, n_from, stride, take, n));
    for (int32_t i = 0; i < n; i++)
        if (take[i] >= n_from)
            return tp_error(TP_ERR_INVALID_ARG, "take_ids: take[%d] is %d, outside the %d ids of the step before", i,
                            take[i], n_from);
    for (int32_t i = 0; i < n; i++)
        if (take[i] >= 0) ids[i] = from[(int64_t)take[i] * stride];
    return TP_OK;
}

/* out[i] = x[rows[i]], converting when the dtypes differ. */
static tp_status cpu_gather_rows(tp_backend *b, const tp_tensor *x, const int32_t *rows, int32_t n,
                                 tp_tensor *out)
{
    TP_CHECK(check_tensor("gather_rows", "x", x, WEIGHT));
    TP_CHECK(check_tensor("gather_rows", "out", out, WEIGHT));
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "gather_rows: n is %d", n);
    TP_CHECK(tp_check_shape("gather_rows", "out", out, n, x->cols));
    if (n > 0 && !rows) return tp_error(TP_ERR_INVALID_ARG, "gather_rows: rows is NULL");
    for (int32_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= x->rows)
            return tp_error(TP_ERR_INVALID_ARG, "gather_rows: rows[%d] is %d, outside x's %lld rows",
                            i, rows[i], (long long)x->rows);
    for (int32_t i = 0; i < n; i++)
        tp_convert(row_ptr(out, i), out->dtype, row_ptr(x, rows[i]), x->dtype, (size_t)x->cols);
    return TP_OK;
}

/* out[i] = table[ids[i] - vocab_begin] when that row is on this rank, else zeros. */
static tp_status cpu_embedding(tp_backend *b, const int32_t *ids, int32_t n, const tp_tensor *table,
                               int64_t vocab_begin, tp_tensor *out)
{
    TP_CHECK(check_tensor("embedding", "table", table, WEIGHT));
    TP_CHECK(check_tensor("embedding", "out", out, ACT));
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "embedding: n is %d", n);
    TP_CHECK(tp_check_shape("embedding", "out", out, n, table->cols));
    if (n > 0 && !ids) return tp_error(TP_ERR_INVALID_ARG, "embedding: ids is NULL");
    const int64_t d = table->cols;

#pragma omp parallel for schedule(static) if ((double)n * d > PAR_WORK)
    for (int32_t i = 0; i < n; i++) {
        int64_t r = (int64_t)ids[i] - vocab_begin;
        if (r >= 0 && r < table->rows) to_f32(row_f32(out, i), row_ptr(table, r), table->dtype, d);
        else memset(row_f32(out, i), 0, (size_t)d * sizeof(float));
    }
    return TP_OK;
}

static tp_status cpu_convert(tp_backend *b, const tp_tensor *src, tp_tensor *dst)
{
    TP_CHECK(check_tensor("convert", "src", src, WEIGHT));
    TP_CHECK(check_tensor("convert", "dst", dst, WEIGHT));
    TP_CHECK(tp_check_shape("convert", "dst", dst, src->rows, src->cols));
    const int64_t n = src->rows;

#pragma omp parallel for schedule(static) if ((double)n * src->cols > PAR_WORK)
    for (int64_t i = 0; i < n; i++)
        tp_convert(row_ptr(dst, i), dst->dtype, row_ptr(src, i), src->dtype, (size_t)src->cols);
    return TP_OK;
}

/* ---- greedy sampling ----------------------------------------------------------------- */
/*
 * Per row, the first column of the largest value and its log-softmax, computed as the
 * sampler's greedy path computes the chosen token's logprob (src/sampler.c): one pass with
 * an online log-sum-exp in double, lse = m + log(sum), logprob = (float)(x - lse); on a
 * finite row the two agree bit for bit. Where the sampler stops: a row all -inf gives
 * column 0 and -log(V) (the sampler's uniform limit); +inf entries win (the first of
 * them) with -log(their count), the limit of a softmax over them. A NaN fails the call,
 * naming the lowest such row and its first NaN column; that row's outputs are the NaN's
 * column and NaN (what the CUDA backend writes too). Each row is one task, so the results
 * do not depend on the thread count or on the rows around it.
 */
static int64_t argmax_row(const float *x, int64_t V, int32_t *id, float *lp, float *value)
{
    double m = -INFINITY, sum = 0.0;
    int64_t arg = 0;
    for (int64_t j = 0; j < V; j++) {
        const float f = x[j];
        if (isnan(f)) {
            *id = (int32_t)j;
            if (lp) *lp = NAN;
            if (value) *value = NAN;
            return j;
        }
        const double r = f;
        if (r > m) {
            sum = sum * exp(m - r) + 1.0;
            m = r;
            arg = j;
        } else if (r == m) {
            sum += 1.0; /* exp(0), and a count of equal infinities */
        } else if (r != -INFINITY) {
            sum += exp(r - m);
        }
    }
    *id = (int32_t)arg;
    if (value) *value = x[arg];
    if (lp) {
        if (m == -INFINITY) *lp = (float)-log((double)V);
        else if (m == INFINITY) *lp = (float)-log(sum);
        else *lp = (float)((double)x[arg] - (m + log(sum)));
    }
    return -1;
}

static tp_status cpu_argmax(tp_backend *b, const tp_tensor *logits, int32_t *ids, float *logprob, float *value)
{
    TP_CHECK(check_tensor("argmax", "logits", logits, WEIGHT));
    if (logits->dtype != TP_DTYPE_F32)
        return tp_error(TP_ERR_INVALID_ARG, "argmax: logits is %s; argmax reads float32 logits",
                        tp_dtype_name(logits->dtype));
    const int64_t L = logits->rows, V = logits->cols;
    if (L == 0) return TP_OK;
    if (V == 0)
        return tp_error(TP_ERR_INVALID_ARG, "argmax: logits has %lld rows but no columns", (long long)L);
    if (V > INT32_MAX)
        return tp_error(TP_ERR_INVALID_ARG, "argmax: logits has %lld columns, more than int32 ids reach",
                        (long long)V);
    if (!ids) return tp_error(TP_ERR_INVALID_ARG, "argmax: ids is NULL");
    int64_t bad = INT64_MAX;

#pragma omp parallel for schedule(static) reduction(min : bad) if ((double)L * V > PAR_WORK / 4)
    for (int64_t i = 0; i < L; i++)
        if (argmax_row(row_f32(logits, i), V, ids + i, logprob ? logprob + i : NULL, value ? value + i : NULL) >= 0 &&
            i < bad)
            bad = i;
    if (bad != INT64_MAX) {
        int32_t col;
        argmax_row(row_f32(logits, bad), V, &col, NULL, NULL);
        return tp_error(TP_ERR_NUMERIC, "argmax: row %lld of logits has NaN at column %d", (long long)bad,
                        col);
    }
    return TP_OK;
}

/* ---- sampling: tp_sampler_sample row by row (the reference for the CUDA kernel) ---- */

/* Record "sample: row r: <the message already recorded>" (the sampler's message names the
 * field or token; this names the row). */
static tp_status sample_row_error(tp_status st, int32_t r)
{
    return tp_error_prefix(st, "sample: row %d", (int)r);
}

/* Whether column j is never drawn: banned, or not among the allowed (when some are). */
static int is_excluded(const int32_t *tokens, const tp_sample_row *row, int32_t j)
{
    for (int32_t k = 0; k < row->n_banned; k++)
        if (tokens[row->banned + k] == j) return 1;
    if (row->n_allowed == 0) return 0;
    for (int32_t k = 0; k < row->n_allowed; k++)
        if (tokens[row->allowed + k] == j) return 0;
    return 1;
}

/* The row's edits as the sampler takes them; the biases' bits copied into bias. */
static tp_status row_edits(const tp_sample_row *row, const int32_t *tokens, int32_t V, float *bias,
                           tp_logit_edits *e)
{
    const struct {
        const char *what;
        int32_t at, n;
    } lists[] = {{"banned", row->banned, row->n_banned}, {"allowed", row->allowed, row->n_allowed},
                 {"logit_bias", row->bias, row->n_bias}};
    for (size_t l = 0; l < TP_ARRAY_LEN(lists); l++)
        for (int32_t k = 0; k < lists[l].n; k++) {
            const int32_t t = tokens[lists[l].at + k];
            if (t < 0 || t >= V)
                return tp_error(TP_ERR_INVALID_ARG, "%s token %d at position %d is outside the vocabulary "
                                "[0, %d)", lists[l].what, (int)t, (int)k, (int)V);
        }
    for (int32_t k = 0; k < row->n_bias; k++) {
        memcpy(&bias[k], &tokens[row->bias + row->n_bias + k], sizeof(float));
        if (!isfinite(bias[k]))
            return tp_error(TP_ERR_INVALID_ARG, "the logit_bias of token %d is not finite",
                            (int)tokens[row->bias + k]);
    }
    *e = (tp_logit_edits){0};
    if (row->n_banned) e->banned = tokens + row->banned, e->n_banned = row->n_banned;
    if (row->n_allowed) e->allowed = tokens + row->allowed, e->n_allowed = row->n_allowed;
    if (row->n_bias) e->bias_ids = tokens + row->bias, e->bias = bias, e->n_bias = row->n_bias;
    return TP_OK;
}

/* One row: the row's checks, then tp_sampler_sample_edited. When the failure is NaN/+Inf
 * logits, *bad is its column (excluded columns do not count: the sampler never draws them);
 * else -1. */
static tp_status sample_one(tp_sampler *sampler, const float *x, int32_t V, const tp_sample_row *row,
                            const int32_t *tokens, tp_sample_out *o, int32_t *bad)
{
    *bad = -1;
    if (row->n_logprobs < -1 || row->n_logprobs > TP_SAMPLE_MAX_LOGPROBS)
        return tp_error(TP_ERR_INVALID_ARG, "n_logprobs %d is outside [-1, %d]", (int)row->n_logprobs,
                        TP_SAMPLE_MAX_LOGPROBS);
    if (row->tokens < 0 || row->n_prompt < 0 || row->n_output < 0 || row->banned < 0 || row->n_banned < 0 ||
        row->allowed < 0 || row->n_allowed < 0 || row->bias < 0 || row->n_bias < 0)
        return tp_error(TP_ERR_INVALID_ARG, "token offsets or counts are negative (tokens %d, n_prompt %d, "
                        "n_output %d, banned %d, n_banned %d, allowed %d, n_allowed %d, bias %d, n_bias %d)",
                        (int)row->tokens, (int)row->n_prompt, (int)row->n_output, (int)row->banned,
                        (int)row->n_banned, (int)row->allowed, (int)row->n_allowed, (int)row->bias,
                        (int)row->n_bias);
    if ((row->n_prompt + (int64_t)row->n_output > 0 || row->n_banned > 0 || row->n_allowed > 0 || row->n_bias > 0) &&
        !tokens)
        return tp_error(TP_ERR_INVALID_ARG, "the row has tokens but the tokens array is NULL");
    float *bias = NULL;
    if (row->n_bias > 0 && !(bias = malloc((size_t)row->n_bias * sizeof *bias)))
        return tp_error(TP_ERR_OOM, "out of memory for a row's %d logit biases", (int)row->n_bias);
    tp_logit_edits edits;
    tp_status est = row_edits(row, tokens, V, bias, &edits);
    if (est != TP_OK) {
        free(bias);
        return est;
    }
    tp_sampling_params p;
    tp_sampling_params_default(&p);
    p.temperature = row->temperature;
    p.top_k = row->top_k;
    p.top_p = row->top_p;
    p.min_p = row->min_p;
    p.repetition_penalty = row->repetition_penalty;
    p.presence_penalty = row->presence_penalty;
    p.frequency_penalty = row->frequency_penalty;
    p.seed = row->seed;
    p.logprobs = row->n_logprobs < 0 ? 0 : row->n_logprobs;
    p.logprob_off = row->n_logprobs < 0; /* none wanted: 0, as the CUDA op, without the log-sum-exp */
    tp_token_logprob top[TP_SAMPLE_MAX_LOGPROBS];
    tp_sample_result res = {0, 0.0f, 0, top};
    const int32_t *prompt = tokens ? tokens + row->tokens : NULL;
    tp_status st = tp_sampler_sample_edited(sampler, &p, row->step, x, &edits, prompt, row->n_prompt,
                                            prompt ? prompt + row->n_prompt : NULL, row->n_output, &res);
    free(bias);
    if (st != TP_OK) {
        /* The sampler checks the parameters, then (penalized) the tokens, then the logits;
         * its message may be dropped (an earlier row's is kept), so the cause is found here. */
        int tokens_ok = 1;
        if (p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)
            for (int32_t k = 0; k < row->n_prompt + row->n_output; k++)
                if (prompt[k] < 0 || prompt[k] >= V) tokens_ok = 0;
        /* (a message is recorded already, so validate's own is dropped) */
        if (tokens_ok && tp_sampling_params_validate(&p) == TP_OK)
            for (int32_t j = 0; j < V && *bad < 0; j++)
                if ((isnan(x[j]) || x[j] == INFINITY) && !is_excluded(tokens, row, j)) *bad = j;
        return st;
    }
    o->token = res.token;
    o->logprob = res.logprob;
    o->n_top = res.n_top;
    for (int32_t k = 0; k < res.n_top; k++) {
        o->top_id[k] = top[k].id;
        o->top_logprob[k] = top[k].logprob;
    }
    return TP_OK;
}

/* The samplers for V columns, one for each of n threads (scratch each). */
static tp_status samplers_get(cpu_ctx *ctx, int32_t V, int n)
{
    if (ctx->sampler_vocab != V) {
        for (int t = 0; t < ctx->n_samplers; t++) tp_sampler_destroy(ctx->samplers[t]);
        ctx->n_samplers = 0;
        ctx->sampler_vocab = V;
    }
    if (ctx->n_samplers >= n) return TP_OK;
    tp_sampler **more = realloc(ctx->samplers, (size_t)n * sizeof *more);
    if (!more) return tp_error(TP_ERR_OOM, "sample: out of memory for %d samplers", n);
    ctx->samplers = more;
    for (; ctx->n_samplers < n; ctx->n_samplers++)
        TP_CHECK(tp_sampler_create(V, &ctx->samplers[ctx->n_samplers]));
    return TP_OK;
}

/* Rows spread over the threads, each with a sampler of its own (a row's answer does not
 * depend on the thread). Every row is answered; a failing row gets token -1 (NaN/+Inf: the
 * bad column), logprob NaN and no top entries, and the call fails naming the lowest such
 * row, as the CUDA backend's fault does: failed rows are run again on this thread, whose
 * error message the caller reads (a worker's is its own, and cleared). */
static tp_status cpu_sample(tp_backend *b, const tp_tensor *logits, int32_t L, const tp_sample_row *rows,
                            const int32_t *tokens, tp_sample_out *out)
{
    TP_CHECK(tp_check_sample(logits, L, rows, out));
    if (L == 0) return TP_OK;
    cpu_ctx *ctx = b->ctx;
    const int32_t V = (int32_t)logits->cols;
    const int nt = L > 1 && (double)L * V > PAR_WORK ? (max_threads() < L ? max_threads() : (int)L) : 1;
    TP_CHECK(samplers_get(ctx, V, nt));
    int32_t first_failed = L;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) reduction(min : first_failed) if (nt > 1)
    for (int32_t r = 0; r < L; r++) {
        int32_t bad;
        if (sample_one(ctx->samplers[thread_id()], row_f32(logits, r), V, &rows[r], tokens, &out[r], &bad) != TP_OK) {
            out[r].token = bad; /* -1 unless NaN/+Inf */
            out[r].logprob = NAN;
            out[r].n_top = 0;
            if (r < first_failed) first_failed = r;
            tp_error_clear(); /* this thread's message: the lowest failed row runs again below */
        }
    }
    if (first_failed == L) return TP_OK;
    /* the lowest failed row's message, made on this thread; the others' answers stand */
    const float *x = row_f32(logits, first_failed);
    int32_t bad;
    tp_sample_out again;
    const tp_status st = sample_one(ctx->samplers[0], x, V, &rows[first_failed], tokens, &again, &bad);
    if (st == TP_OK)
        return tp_error(TP_ERR_INTERNAL, "sample: row %d failed on a worker thread, not again", (int)first_failed);
    if (bad >= 0) {
        tp_error_clear();
        return tp_error(TP_ERR_NUMERIC, "sample: row %d of logits has %s at column %d", (int)first_failed,
                        isnan(x[bad]) ? "NaN" : "+Inf", (int)bad);
    }
    return sample_row_error(st, first_failed);
}

/* ---- the table --------------------------------------------------------------------- */

/* ---- fused operations: compositions, so the CPU stays the reference ---- */

static tp_status cpu_matmul_swiglu(tp_backend *b, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                                   tp_tensor *gate_up, tp_tensor *out)
{
    if (!w || !gate_up || !out) return tp_error(TP_ERR_INVALID_ARG, "matmul_swiglu: w, gate_up or out is NULL");
    if (w->rows % 2 != 0)
        return tp_error(TP_ERR_INVALID_ARG, "matmul_swiglu: w has %lld rows; gate and up need an even count",
                        (long long)w->rows);
    TP_CHECK(cpu_matmul(b, x, w, bias, gate_up));
    const int64_t m = w->rows / 2;
    tp_tensor gate = tp_tensor_cols(gate_up, 0, m), up = tp_tensor_cols(gate_up, m, m);
    return cpu_swiglu(b, &gate, &up, out);
}

/* y += x @ w^T: each of matmul's sums added to y where it is made (the same f32 additions
 * as the product written out and added by add_rmsnorm) */
static tp_status cpu_matmul_add(tp_backend *b, const tp_tensor *x, const tp_tensor *w, tp_tensor *y)
{
    return matmul_into(b, "matmul_add", x, w, NULL, 1, y);
}

static tp_status cpu_qk_rope_store(tp_backend *b, tp_tensor *q, tp_tensor *k, const tp_tensor *v,
                                   const tp_tensor *q_norm, const tp_tensor *k_norm, float eps, int32_t head_dim,
                                   const float *inv_freq, tp_kv_layer *cache, const tp_attn_batch *batch)
{
    if (!batch) return tp_error(TP_ERR_INVALID_ARG, "qk_rope_store: batch is NULL");
    if (q_norm) {
        if (!k_norm) return tp_error(TP_ERR_INVALID_ARG, "qk_rope_store: q_norm without k_norm");
        TP_CHECK(cpu_head_rmsnorm(b, q, head_dim, q_norm, eps));
        TP_CHECK(cpu_head_rmsnorm(b, k, head_dim, k_norm, eps));
    }
    TP_CHECK(cpu_rope(b, q, head_dim, batch->pos, inv_freq));
    TP_CHECK(cpu_rope(b, k, head_dim, batch->pos, inv_freq));
    return cpu_kv_store(b, k, v, cache, batch);
}

/* ---- staging: the CUDA backend's pair of buffers, so that the loader takes the same path
 * (and its chunking is tested) on the CPU; an upload is a copy, finished at return ---- */

static tp_status cpu_staging(tp_backend *b, size_t bytes, void **host)
{
    cpu_ctx *ctx = b->ctx;
    if (!host && bytes == 0) { /* release */
        for (int i = 0; i < 2; i++) {
            free(ctx->stage[i]);
            ctx->stage[i] = NULL;
            ctx->stage_cap[i] = 0;
        }
        return TP_OK;
    }
    if (!host) return tp_error(TP_ERR_INVALID_ARG, "staging: host is NULL");
    const int s = ctx->stage_next;
    ctx->stage_next ^= 1;
    if (ctx->stage_cap[s] < bytes) {
        void *p = realloc(ctx->stage[s], bytes ? bytes : 1);
        if (!p) return tp_error(TP_ERR_OOM, "staging: out of memory for %zu bytes", bytes);
        ctx->stage[s] = p;
        ctx->stage_cap[s] = bytes;
    }
    *host = ctx->stage[s];
    return TP_OK;
}

static tp_status cpu_upload_staged(tp_backend *b, void *dst, const void *host, size_t bytes)
{
    cpu_ctx *ctx = b->ctx;
    if (tp_staging_slot(ctx->stage, ctx->stage_cap, host, bytes) < 0) return TP_ERR_INVALID_ARG;
    return cpu_copy("upload_staged", dst, host, bytes);
}

static void cpu_destroy(tp_backend *b)
{
    if (!b) return;
    cpu_ctx *ctx = b->ctx;
    if (ctx) {
        free(ctx->scratch);
        free(ctx->stage[0]);
        free(ctx->stage[1]);
        free(ctx->slot[0]);
        free(ctx->slot[1]);
        for (int t = 0; t < ctx->n_samplers; t++) tp_sampler_destroy(ctx->samplers[t]);
        free(ctx->samplers);
    }
    free(ctx);
    free(b);
}

static const struct tp_backend_ops cpu_ops = {
    /* .alloc        = */ cpu_alloc,
    /* .free         = */ cpu_free,
    /* .upload       = */ cpu_upload,
    /* .download     = */ cpu_download,
    /* .memset0      = */ cpu_memset0,
    /* .synchronize  = */ cpu_synchronize,
    /* .embedding    = */ cpu_embedding,
    /* .add_rmsnorm  = */ cpu_add_rmsnorm,
    /* .head_rmsnorm = */ cpu_head_rmsnorm,
    /* .matmul       = */ cpu_matmul,
    /* .rope         = */ cpu_rope,
    /* .kv_store     = */ cpu_kv_store,
    /* .attention    = */ cpu_attention,
    /* .swiglu       = */ cpu_swiglu,
    /* .geglu        = */ cpu_geglu,
    /* .softcap      = */ cpu_softcap,
    /* .gather_rows  = */ cpu_gather_rows,
    /* .convert      = */ cpu_convert,
    /* .argmax       = */ cpu_argmax,
    /* .sample       = */ cpu_sample,
    /* .matmul_swiglu= */ cpu_matmul_swiglu,
    /* .qk_rope_store= */ cpu_qk_rope_store,
    /* .qk_rope_attention = */ NULL, /* the forward calls the two */
    /* .matmul_add = */ cpu_matmul_add,
    /* .graph_begin  = */ NULL,
    /* .graph_end    = */ NULL,
    /* .graph_launch = */ NULL,
    /* .graph_free   = */ NULL,
    /* .staging      = */ cpu_staging,
    /* .upload_staged= */ cpu_upload_staged,
    /* .matmul_tune  = */ NULL,
    /* .take_ids     = */ cpu_take_ids,
    /* .argmax_merge = */ cpu_argmax_merge,
    /* .download_start = */ cpu_download_start,
    /* .download_wait  = */ cpu_download_wait,
    /* .profile_range  = */ NULL,
    /* .matmul_one_row = */ NULL,
    /* .destroy      = */ cpu_destroy,
};

tp_status tp_backend_cpu_create(tp_backend **out)
{
    if (!out) return tp_error(TP_ERR_INVALID_ARG, "tp_backend_cpu_create: out is NULL");
    *out = NULL;
    tp_backend *b = calloc(1, sizeof *b);
    cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!b || !ctx) {
        free(b);
        free(ctx);
        return tp_error(TP_ERR_OOM, "out of memory creating the cpu backend");
    }
    b->ops = &cpu_ops;
    b->ctx = ctx;
    b->name = "cpu";
    b->act_dtype = TP_DTYPE_F32;
    b->stream = NULL;
    b->window_align = 1;
    *out = b;
    return TP_OK;
}
