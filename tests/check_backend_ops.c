/*
 * check_backend_ops.c: every operation of the CUDA backend against the CPU backend (the
 * reference), ggml's test-backend-ops shape. For each activation dtype the CUDA backend
 * is built for (f32, bf16, f16) and each op, inputs are drawn from fixed seeds, rounded
 * to the dtype the CUDA side holds (the CPU side gets the same values, widened to f32
 * where it wants f32), run on both, and compared by normalized error |a - b| / |b| under
 * a bound per dtype; NaN never passes. Outputs are poisoned (NaN bytes) before each run,
 * so an element left unwritten fails, and the columns outside a view must stay as they
 * were. Then argument errors and the faults only the GPU can see. One table line per
 * op / dtype / shape. Without CUDA, or without a GPU, it says why and exits 77 (skip).
 * Run with CK_FORK=no (a CUDA context does not survive fork); main sets it anyway.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h" /* tp_rope_inv_freq */
#ifdef HAVE_CUDA
#include "backend_cuda.h"
#include "kernels.h" /* tp_cuda_attention_force_simple */
#endif
#ifdef HAVE_NCCL
#include "comm_nccl.h"
#endif

static const tp_dtype float_dtypes[3] = {TP_DTYPE_F32, TP_DTYPE_F16, TP_DTYPE_BF16};

/* ---- the backends: the reference, and the CUDA backend of each activation dtype ------ */

static tp_backend *cpu;
static tp_backend *gpus[3]; /* act f32, bf16, f16 */
static int n_gpus;
static tp_backend *gb;      /* the one under test */

/* ---- allocations of a test, freed in teardown ---------------------------------------- */

#define MAX_TRACK 16384
static struct {
    tp_backend *b;
    void *p;
} dev_tracked[MAX_TRACK];
static void *host_tracked[MAX_TRACK];
static int n_dev, n_host;

static void setup(void)
{
    tp_error_clear();
    n_dev = n_host = 0;
}

static void teardown(void)
{
    for (int i = 0; i < n_dev; i++) dev_tracked[i].b->ops->free(dev_tracked[i].b, dev_tracked[i].p);
    for (int i = 0; i < n_host; i++) free(host_tracked[i]);
    n_dev = n_host = 0;
}

static void *dev_alloc(tp_backend *b, size_t bytes)
{
    void *p = NULL;
    ck_assert_msg(b->ops->alloc(b, bytes, &p) == TP_OK, "%s alloc: %s", b->name, tp_error_message());
    ck_assert_int_lt(n_dev, MAX_TRACK);
    dev_tracked[n_dev].b = b;
    dev_tracked[n_dev++].p = p;
    return p;
}

static void *host_alloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_lt(n_host, MAX_TRACK);
    host_tracked[n_host++] = p;
    return p;
}

static void *dev_copy(tp_backend *b, const void *src, size_t bytes)
{
    void *p = dev_alloc(b, bytes);
    ck_assert_msg(b->ops->upload(b, p, src, bytes) == TP_OK, "%s upload: %s", b->name, tp_error_message());
    return p;
}

/* Raw bytes of backend memory, after a synchronize that must succeed. */
static void *dev_bytes(tp_backend *b, const void *p, size_t bytes)
{
    void *h = host_alloc(bytes);
    ck_assert_int_eq(b->ops->download(b, h, p, bytes), TP_OK);
    ck_assert_msg(b->ops->synchronize(b) == TP_OK, "%s synchronize: %s", b->name, tp_error_message());
    return h;
}

/* An int32 array on both backends. */
static void ints_both(const int32_t *h, int n, int32_t **on_cpu, int32_t **on_gpu)
{
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(int32_t);
    int32_t *tmp = host_alloc(bytes);
    if (n > 0) memcpy(tmp, h, (size_t)n * sizeof(int32_t));
    *on_cpu = dev_copy(cpu, tmp, bytes);
    *on_gpu = dev_copy(gb, tmp, bytes);
}

#include "test_random.h"

/* ---- a matrix on both backends --------------------------------------------------------- */

enum { ACT, WEIGHT }; /* the CPU side holds an activation as f32, a weight in its own dtype */

typedef struct pt {
    int64_t rows, cols, width, col0; /* the view: columns [col0, col0 + cols) of width */
    tp_tensor g, c;                  /* the view on the GPU and on the CPU */
    tp_tensor gwhole, cwhole;        /* the allocations around them */
    unsigned char *gorig;            /* the GPU bytes as filled (guards) */
} pt;

/* A [rows, cols] view in a [rows, cols + pad] matrix of gdt on the GPU, filled with vals
 * (rows * (cols + pad), rounded to gdt here) or, when vals is NULL, with NaN bytes. */
static pt pt_from(tp_dtype gdt, int kind, int64_t rows, int64_t cols, int64_t pad, float *vals)
{
    pt t;
    memset(&t, 0, sizeof t);
    const tp_dtype cdt = kind == ACT ? TP_DTYPE_F32 : gdt;
    const size_t n = (size_t)(rows * (cols + pad)), gsz = tp_dtype_size(gdt), csz = tp_dtype_size(cdt);
    t.rows = rows;
    t.cols = cols;
    t.width = cols + pad;
    t.col0 = pad / 2;
    unsigned char *gbytes = host_alloc(n * gsz + 1), *cbytes = host_alloc(n * csz + 1);
    if (vals) {
        tp_convert(gbytes, gdt, vals, TP_DTYPE_F32, n);
        tp_convert(vals, TP_DTYPE_F32, gbytes, gdt, n); /* the values the GPU holds */
        tp_convert(cbytes, cdt, vals, TP_DTYPE_F32, n); /* exact: cdt is f32 or gdt */
    } else {
        memset(gbytes, 0xff, n * gsz + 1); /* NaN in f32, f16 and bf16 */
        memset(cbytes, 0xff, n * csz + 1);
    }
    t.gorig = gbytes;
    t.gwhole = tp_tensor_make(dev_copy(gb, gbytes, n * gsz + 1), gdt, rows, t.width);
    t.cwhole = tp_tensor_make(dev_copy(cpu, cbytes, n * csz + 1), cdt, rows, t.width);
    t.g = tp_tensor_cols(&t.gwhole, t.col0, cols);
    t.c = tp_tensor_cols(&t.cwhole, t.col0, cols);
    return t;
}

static pt pt_rand(tp_dtype gdt, int kind, int64_t rows, int64_t cols, int64_t pad, float lo, float hi)
{
    size_t n = (size_t)(rows * (cols + pad));
    float *v = host_alloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) v[i] = uniform(lo, hi);
    return pt_from(gdt, kind, rows, cols, pad, v);
}

/* An output: NaN bytes everywhere until the operation writes its view. */
static pt pt_poison(tp_dtype gdt, int64_t rows, int64_t cols, int64_t pad)
{
    return pt_from(gdt, ACT, rows, cols, pad, NULL);
}

/* The view's values on the GPU (gpu = 1) or the CPU, as f32, rows * cols. */
static float *pt_get(const pt *t, int gpu)
{
    tp_backend *b = gpu ? gb : cpu;
    const tp_tensor *w = gpu ? &t->gwhole : &t->cwhole;
    const size_t es = tp_dtype_size(w->dtype);
    unsigned char *raw = dev_bytes(b, w->data, (size_t)(t->rows * t->width) * es + 1);
    float *out = host_alloc((size_t)(t->rows * t->cols) * sizeof(float) + 1);
    for (int64_t r = 0; r < t->rows; r++)
        tp_convert(out + r * t->cols, TP_DTYPE_F32, raw + (size_t)(r * t->width + t->col0) * es, w->dtype,
                   (size_t)t->cols);
    return out;
}

/* The GPU left every byte outside the view as it was. */
static void pt_guards(const char *what, const pt *t)
{
    const size_t es = tp_dtype_size(t->gwhole.dtype), row = (size_t)t->width * es;
    const size_t before = (size_t)t->col0 * es, after = (size_t)(t->col0 + t->cols) * es;
    unsigned char *now = dev_bytes(gb, t->gwhole.data, (size_t)t->rows * row + 1);
    for (int64_t r = 0; r < t->rows; r++) {
        const size_t at = (size_t)r * row;
        ck_assert_msg(!memcmp(now + at, t->gorig + at, before), "%s: guard before row %lld changed", what,
                      (long long)r);
        ck_assert_msg(!memcmp(now + at + after, t->gorig + at + after, row - after),
                      "%s: guard after row %lld changed", what, (long long)r);
    }
}

/* ---- comparison and the table ----------------------------------------------------------- */

enum { ELEMENTWISE, REDUCTION, EXACT };

/* The bound on the normalized error of a result of dtype out (rounded once to it) from
 * the backend of the current activation dtype: the looser of the two dtypes' bounds. */
static double dtype_bound(tp_dtype dt, int kind)
{
    switch (dt) {
    case TP_DTYPE_BF16: return 1e-2;
    case TP_DTYPE_F16: return 2e-3;
    default: return kind == REDUCTION ? 1e-4 : 1e-5;
    }
}

static double bound_for(int kind, tp_dtype out)
{
    if (kind == EXACT) return 0.0;
    double a = dtype_bound(gb->act_dtype, kind), o = dtype_bound(out, kind);
    return a > o ? a : o;
}

static void compare(const char *op, const char *shape, const float *got, const float *ref, size_t n, int kind,
                    tp_dtype out)
{
    double num = 0.0, den = 0.0;
    int bad = 0;
    size_t first_bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || (isinf(got[i]) && got[i] != ref[i])) {
            if (!bad) first_bad = i;
            bad = 1;
            continue;
        }
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    double err = bad ? NAN : den > 0.0 ? sqrt(num / den) : sqrt(num);
    const double bound = bound_for(kind, out);
    const int ok = err <= bound; /* NaN fails */
    printf("  %-13s %-9s %-58s err %9.3e  bound %7.1e  %s\n", op, tp_dtype_name(gb->act_dtype), shape, err,
           bound, ok ? "ok" : "FAIL");
    fflush(stdout);
    if (bad)
        ck_abort_msg("%s %s [%s]: element %zu is %g (reference %g)", op, tp_dtype_name(gb->act_dtype), shape,
                     first_bad, (double)got[first_bad], (double)ref[first_bad]);
    ck_assert_msg(ok, "%s %s [%s]: normalized error %g exceeds %g", op, tp_dtype_name(gb->act_dtype), shape,
                  err, bound);
}

#define RUN_BOTH(call_cpu, call_gpu)                                                               \
    do {                                                                                           \
        tp_error_clear();                                                                          \
        ck_assert_msg((call_cpu) == TP_OK, "cpu: %s", tp_error_message());                         \
        ck_assert_msg((call_gpu) == TP_OK, "cuda: %s", tp_error_message());                        \
    } while (0)

#define EXPECT_STATUS(call, want, needle)                                                          \
    do {                                                                                           \
        tp_error_clear();                                                                          \
        ck_assert_int_eq((call), (want));                                                          \
        ck_assert_msg(strstr(tp_error_message(), (needle)) != NULL, "message \"%s\" lacks \"%s\"", \
                      tp_error_message(), (needle));                                               \
    } while (0)
#define EXPECT_INVALID(call, needle) EXPECT_STATUS(call, TP_ERR_INVALID_ARG, needle)
#define EXPECT_NUMERIC(call, needle) EXPECT_STATUS(call, TP_ERR_NUMERIC, needle) /* NaN/Inf logits */

/* An op that was enqueued (st: TP_OK) and failed a check only the device can make: the next
 * synchronize reports it, naming needle, and the one after finds nothing left. */
#define EXPECT_DEVICE_FAULT(gb, st, needle) EXPECT_DEVICE_STATUS(gb, st, TP_ERR_INVALID_ARG, needle)
#define EXPECT_DEVICE_NUMERIC(gb, st, needle) EXPECT_DEVICE_STATUS(gb, st, TP_ERR_NUMERIC, needle)
#define EXPECT_DEVICE_STATUS(gb, st, want, needle)                                                 \
    do {                                                                                           \
        ck_assert_msg((st) == TP_OK, "cuda: %s", tp_error_message());                              \
        tp_error_clear();                                                                          \
        ck_assert_int_eq((gb)->ops->synchronize(gb), (want));                                      \
        ck_assert_msg(strstr(tp_error_message(), (needle)) != NULL, "message \"%s\" lacks \"%s\"", \
                      tp_error_message(), (needle));                                               \
        ck_assert_int_eq((gb)->ops->synchronize(gb), TP_OK); /* reported once */                   \
    } while (0)

static const char *dn(tp_dtype dt) /* short dtype names for the table */
{
    return dt == TP_DTYPE_F32 ? "f32" : dt == TP_DTYPE_F16 ? "f16" : dt == TP_DTYPE_BF16 ? "bf16" : "?";
}

/* Run body once per CUDA backend (activation dtype). */
#define FOR_EACH_GPU for (int gi_ = 0; gi_ < n_gpus && (gb = gpus[gi_]) != NULL; gi_++)

/* ---- creation and memory ------------------------------------------------------------------ */

START_TEST(create_fields)
{
    FOR_EACH_GPU {
        ck_assert_str_eq(gb->name, "cuda");
        ck_assert_ptr_nonnull(gb->stream);
        const struct tp_backend_ops *o = gb->ops;
        ck_assert(o->alloc && o->free && o->upload && o->download && o->memset0 && o->synchronize);
        ck_assert(o->embedding && o->add_rmsnorm && o->head_rmsnorm && o->matmul && o->rope);
        ck_assert(o->kv_store && o->attention && o->swiglu && o->geglu && o->gather_rows && o->convert && o->destroy);
        ck_assert(o->argmax);
        ck_assert(o->sample);
        ck_assert(o->qk_rope_store);
        ck_assert(o->matmul_add);
    }
#ifdef HAVE_CUDA
    tp_backend *b = NULL;
    EXPECT_INVALID(tp_backend_cuda_create(0, TP_DTYPE_I32, &b), "activations");
    tp_error_clear();
    ck_assert_int_eq(tp_backend_cuda_create(1 << 20, TP_DTYPE_BF16, &b), TP_ERR_UNAVAILABLE);
    ck_assert_ptr_null(b);
    EXPECT_INVALID(tp_backend_cuda_create(0, TP_DTYPE_BF16, NULL), "out is NULL");
#endif
}
END_TEST

START_TEST(memory)
{
    static const size_t sizes[] = {0, 1, 3, 63, 64, 65, 1000, 1 << 20};
    gb = gpus[0];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        void *p = NULL;
        ck_assert_int_eq(gb->ops->alloc(gb, n, &p), TP_OK);
        ck_assert_ptr_nonnull(p);
        unsigned char *src = host_alloc(n), *dst = host_alloc(n);
        for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 7 + 1);
        ck_assert_int_eq(gb->ops->upload(gb, p, src, n), TP_OK);
        memset(src + (n ? n - 1 : 0), 0, n ? 1 : 0); /* reused at once: the upload has the old bytes */
        ck_assert_int_eq(gb->ops->download(gb, dst, p, n), TP_OK);
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
        for (size_t i = 0; i < n; i++) ck_assert_uint_eq(dst[i], (unsigned char)(i * 7 + 1));
        ck_assert_int_eq(gb->ops->memset0(gb, p, n), TP_OK);
        ck_assert_int_eq(gb->ops->download(gb, dst, p, n), TP_OK);
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
        for (size_t i = 0; i < n; i++) ck_assert_uint_eq(dst[i], 0);
        gb->ops->free(gb, p);
    }
    gb->ops->free(gb, NULL);
    EXPECT_INVALID(gb->ops->upload(gb, NULL, "x", 1), "upload");
    EXPECT_INVALID(gb->ops->download(gb, host_alloc(1), NULL, 1), "download");
    EXPECT_INVALID(gb->ops->memset0(gb, NULL, 1), "memset0");
    ck_assert_int_eq(gb->ops->upload(gb, NULL, NULL, 0), TP_OK);
    EXPECT_INVALID(gb->ops->alloc(gb, 1, NULL), "alloc");
    printf("  %-13s %-9s %-58s ok\n", "memory", "-", "alloc/upload/download/memset0, 0 B .. 1 MiB");
}
END_TEST

/* ---- matmul ------------------------------------------------------------------------------- */

static void matmul_case(tp_dtype wdt, int64_t n, int64_t k, int64_t m, int with_bias, tp_dtype ydt,
                        int64_t pad)
{
    const tp_dtype A = gb->act_dtype;
    pt x = pt_rand(A, ACT, n, k, pad, -1.0f, 1.0f);
    pt w = pt_rand(wdt, WEIGHT, m, k, pad, -1.0f, 1.0f);
    pt bias = pt_rand(wdt, WEIGHT, 1, m, pad, -1.0f, 1.0f);
    pt y = pt_poison(ydt, n, m, pad);
    RUN_BOTH(cpu->ops->matmul(cpu, &x.c, &w.c, with_bias ? &bias.c : NULL, &y.c),
             gb->ops->matmul(gb, &x.g, &w.g, with_bias ? &bias.g : NULL, &y.g));
    char shape[96];
    snprintf(shape, sizeof shape, "x %s [%lld,%lld] w %s [%lld,%lld]%s y %s pad %lld", dn(A), (long long)n,
             (long long)k, dn(wdt), (long long)m, (long long)k, with_bias ? " +bias" : "", dn(ydt),
             (long long)pad);
    compare("matmul", shape, pt_get(&y, 1), pt_get(&y, 0), (size_t)(n * m), REDUCTION, ydt);
    pt_guards("matmul y", &y);
}

START_TEST(matmul_shapes)
{
    static const int64_t shapes[][3] = {
        {1, 1, 1}, {1, 17, 3}, {3, 64, 17}, {17, 130, 64}, {64, 17, 130}, {130, 64, 3}, {5, 1030, 33},
        {2, 2048, 3000}, /* w converted in several tiles when its dtype differs from x's */
    };
    FOR_EACH_GPU {
        seed(1);
        for (int d = 0; d < 3; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int v = 0; v < 3; v++)
                    matmul_case(float_dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2], v > 0,
                                v == 1 ? TP_DTYPE_F32 : gb->act_dtype, v ? 3 : 0);
        /* an output of a third dtype, tiled over rows and columns of the f32 staging */
        for (int d = 0; d < 3; d++)
            if (float_dtypes[d] != gb->act_dtype && float_dtypes[d] != TP_DTYPE_F32)
                matmul_case(gb->act_dtype, 2100, 16, 2700, 1, float_dtypes[d], 1);
    }
}
END_TEST

START_TEST(matmul_empty)
{
    FOR_EACH_GPU {
        seed(2);
        /* k == 0: y = bias, or zeros */
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            pt x = pt_rand(gb->act_dtype, ACT, 3, 0, 2, -1, 1), w = pt_rand(TP_DTYPE_BF16, WEIGHT, 5, 0, 2, -1, 1);
            pt bias = pt_rand(TP_DTYPE_BF16, WEIGHT, 1, 5, 0, -1, 1), y = pt_poison(gb->act_dtype, 3, 5, 2);
            RUN_BOTH(cpu->ops->matmul(cpu, &x.c, &w.c, with_bias ? &bias.c : NULL, &y.c),
                     gb->ops->matmul(gb, &x.g, &w.g, with_bias ? &bias.g : NULL, &y.g));
            compare("matmul", with_bias ? "k = 0, y = bias" : "k = 0, y = 0", pt_get(&y, 1), pt_get(&y, 0), 15,
                    ELEMENTWISE, gb->act_dtype);
            pt_guards("matmul k=0", &y);
        }
        pt x0 = pt_rand(gb->act_dtype, ACT, 0, 4, 0, -1, 1), w4 = pt_rand(TP_DTYPE_F32, WEIGHT, 5, 4, 0, -1, 1);
        pt y0 = pt_poison(gb->act_dtype, 0, 5, 0);
        RUN_BOTH(cpu->ops->matmul(cpu, &x0.c, &w4.c, NULL, &y0.c), gb->ops->matmul(gb, &x0.g, &w4.g, NULL, &y0.g));
    }
}
END_TEST

/* matmul_add: y += x @ w^T on y's own values (the residual the o and down products go into),
 * y f32; every weight dtype, rows from one to past 256, y padded (unaligned) and not */
START_TEST(matmul_add_cases)
{
    static const int64_t shapes[][3] = {{1, 64, 130}, {3, 1030, 33}, {128, 512, 256}, {130, 64, 3}, {257, 2048, 96}};
    FOR_EACH_GPU {
        seed(7);
        const tp_dtype A = gb->act_dtype;
        for (int d = 0; d < 3; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int64_t pad = 0; pad <= 3; pad += 3) {
                    const int64_t n = shapes[s][0], k = shapes[s][1], m = shapes[s][2];
                    pt x = pt_rand(A, ACT, n, k, pad, -1.0f, 1.0f);
                    pt w = pt_rand(float_dtypes[d], WEIGHT, m, k, pad, -1.0f, 1.0f);
                    pt y = pt_rand(TP_DTYPE_F32, ACT, n, m, pad, -8.0f, 8.0f);
                    RUN_BOTH(cpu->ops->matmul_add(cpu, &x.c, &w.c, &y.c), gb->ops->matmul_add(gb, &x.g, &w.g, &y.g));
                    char shape[96];
                    snprintf(shape, sizeof shape, "x %s [%lld,%lld] w %s [%lld,%lld] += y f32 pad %lld", dn(A),
                             (long long)n, (long long)k, dn(float_dtypes[d]), (long long)m, (long long)k,
                             (long long)pad);
                    compare("matmul_add", shape, pt_get(&y, 1), pt_get(&y, 0), (size_t)(n * m), REDUCTION,
                            TP_DTYPE_F32);
                    pt_guards("matmul_add y", &y);
                }
        /* k = 0 adds nothing; no rows, nothing */
        pt x = pt_rand(A, ACT, 3, 0, 2, -1, 1), w = pt_rand(TP_DTYPE_BF16, WEIGHT, 5, 0, 2, -1, 1);
        pt y = pt_rand(TP_DTYPE_F32, ACT, 3, 5, 2, -1, 1);
        RUN_BOTH(cpu->ops->matmul_add(cpu, &x.c, &w.c, &y.c), gb->ops->matmul_add(gb, &x.g, &w.g, &y.g));
        compare("matmul_add", "k = 0, y as it was", pt_get(&y, 1), pt_get(&y, 0), 15, EXACT, TP_DTYPE_F32);
        pt x0 = pt_rand(A, ACT, 0, 4, 0, -1, 1), w4 = pt_rand(TP_DTYPE_F32, WEIGHT, 5, 4, 0, -1, 1);
        pt y0 = pt_rand(TP_DTYPE_F32, ACT, 0, 5, 0, -1, 1);
        RUN_BOTH(cpu->ops->matmul_add(cpu, &x0.c, &w4.c, &y0.c), gb->ops->matmul_add(gb, &x0.g, &w4.g, &y0.g));
        /* the sums must be f32 */
        if (A != TP_DTYPE_F32) {
            pt x1 = pt_rand(A, ACT, 2, 4, 0, -1, 1), yb = pt_rand(A, ACT, 2, 5, 0, -1, 1);
            EXPECT_INVALID(gb->ops->matmul_add(gb, &x1.g, &w4.g, &yb.g), "must be f32");
        }
    }
}
END_TEST

/* matmul_tune: 16-bit products of shapes first seen while tuning take the library's candidate
 * algorithms in turn (up to 8, one untimed and 3 timed calls each: the calls that matmul_tune
 * says take every one, and then the first again), and tuning off keeps the fastest (at least
 * one shape's by timing). Every form a product has (plain, with a bias, added into y, SwiGLU)
 * at one row, and a 128-row product; every call's result, under each candidate and after,
 * against the CPU's same calls, and the output's guards. Then matmul_one_row: the same
 * calls through the backend's own one-row kernel, and back through the library's. */
enum { TUNED_PLAIN, TUNED_BIAS, TUNED_ADD, TUNED_SWIGLU };

typedef struct tuned_case {
    int64_t n, k, m; /* SWIGLU: w [2m, k] */
    int form;
    pt x, w, bias, gu, y; /* y: out for SWIGLU; f32 for ADD */
} tuned_case;

static void tuned_call(tuned_case *c, int on_gpu, const char *when)
{
    tp_backend *b = on_gpu ? gb : cpu;
    tp_tensor *x = on_gpu ? &c->x.g : &c->x.c, *w = on_gpu ? &c->w.g : &c->w.c, *y = on_gpu ? &c->y.g : &c->y.c;
    tp_tensor *bias = c->form == TUNED_BIAS ? on_gpu ? &c->bias.g : &c->bias.c : NULL;
    tp_tensor *gu = on_gpu ? &c->gu.g : &c->gu.c;
    static const char *names[] = {"plain", "+bias", "added", "SwiGLU"};
    tp_error_clear();
    const tp_status st = c->form == TUNED_ADD      ? b->ops->matmul_add(b, x, w, y)
                         : c->form == TUNED_SWIGLU ? b->ops->matmul_swiglu(b, x, w, bias, gu, y)
                                                   : b->ops->matmul(b, x, w, bias, y);
    ck_assert_msg(st == TP_OK, "%s: %s", on_gpu ? "cuda" : "cpu", tp_error_message());
    if (!on_gpu) return;
    char shape[96];
    snprintf(shape, sizeof shape, "%s: %s [%lld,%lld] x [%lld,%lld]^T", when, names[c->form], (long long)c->n,
             (long long)c->k, (long long)c->w.c.rows, (long long)c->k);
    compare("matmul", shape, pt_get(&c->y, 1), pt_get(&c->y, 0), (size_t)(c->y.rows * c->y.cols), REDUCTION,
            c->y.g.dtype);
}

START_TEST(matmul_tuned)
{
    tuned_case cases[] = {{.n = 1, .k = 256, .m = 384, .form = TUNED_PLAIN},
                          {.n = 1, .k = 320, .m = 192, .form = TUNED_BIAS},
                          {.n = 1, .k = 256, .m = 128, .form = TUNED_ADD},
                          {.n = 1, .k = 512, .m = 160, .form = TUNED_SWIGLU},
                          {.n = 128, .k = 1024, .m = 512, .form = TUNED_PLAIN}};
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    FOR_EACH_GPU {
        if (!gb->ops->matmul_tune || gb->act_dtype == TP_DTYPE_F32) continue; /* f32 products are not tuned */
        seed(4);
        const tp_dtype A = gb->act_dtype;
        for (int i = 0; i < n_cases; i++) {
            tuned_case *c = &cases[i];
            const int64_t rows = c->form == TUNED_SWIGLU ? 2 * c->m : c->m;
            c->x = pt_rand(A, ACT, c->n, c->k, 0, -1.0f, 1.0f);
            c->w = pt_rand(A, WEIGHT, rows, c->k, 0, -1.0f, 1.0f);
            c->bias = pt_rand(A, WEIGHT, 1, rows, 0, -1.0f, 1.0f);
            c->gu = pt_poison(A, c->n, rows, 0);
            c->y = c->form == TUNED_ADD ? pt_rand(TP_DTYPE_F32, ACT, c->n, c->m, 0, -4.0f, 4.0f)
                                        : pt_poison(A, c->n, c->m, 0);
        }
        int calls = 0;
        ck_assert_int_eq(gb->ops->matmul_tune(gb, 1, &calls), TP_OK);
        ck_assert_msg(calls >= 8, "matmul_tune: %d calls would not time 2 candidates", calls);
        for (int i = 0; i < n_cases; i++)
            for (int call = 0; call < calls + 4; call++) {
                char when[32];
                snprintf(when, sizeof when, "tuning, call %d", call);
                tuned_call(&cases[i], 0, when); /* the CPU's same call: added ones add up alike */
                tuned_call(&cases[i], 1, when);
            }
        int tuned = 0;
        ck_assert_int_eq(gb->ops->matmul_tune(gb, 0, &tuned), TP_OK);
        /* the 128-row shape has several candidates on any GPU cuBLASLt tunes for (the one-row
         * shapes had several on an H100 and an H200, which other GPUs need not give) */
        ck_assert_msg(tuned >= 1, "matmul_tune: no shape was chosen by timing (%d)", tuned);
        for (int i = 0; i < n_cases; i++) {
            tuned_call(&cases[i], 0, "tuned");
            tuned_call(&cases[i], 1, "tuned");
            pt_guards("matmul tuned y", &cases[i].y);
        }
        if (!gb->ops->matmul_one_row) continue;
        const char *env = getenv("TPINFER_GEMV"); /* set: the user's choice stands */
        for (int own = 1; own >= 0; own--) {
            const int applies = gb->ops->matmul_one_row(gb, own);
            ck_assert_msg(applies == !(env && *env), "matmul_one_row(%d) gave %d with TPINFER_GEMV=%s", own, applies,
                          env ? env : "(unset)");
            if (!applies) break;
            for (int i = 0; i < n_cases; i++) {
                tuned_call(&cases[i], 0, own ? "one row, own" : "one row, library");
                tuned_call(&cases[i], 1, own ? "one row, own" : "one row, library");
                pt_guards("matmul one-row y", &cases[i].y);
            }
        }
    }
}
END_TEST

/* ---- small n: the GEMV (n <= 8, cuda/gemv.cu), its fallbacks, and the fused matmul_swiglu -- */

/* t (made with pad 0) narrowed to columns [col0, col0 + cols) of its rows */
static pt pt_narrow(pt t, int64_t col0, int64_t cols)
{
    t.col0 = col0;
    t.cols = cols;
    t.g = tp_tensor_cols(&t.gwhole, col0, cols);
    t.c = tp_tensor_cols(&t.cwhole, col0, cols);
    return t;
}

/* Layouts of a [rows, cols] operand: ALIGNED starts 8 columns into rows of a multiple of 8
 * columns (+ 16), so that data and row pitch are 16-byte aligned in every dtype (the GEMV's
 * condition); SHIFTED is pt_rand's pad 3 (column 1: misaligned); ODD_PITCH starts at
 * column 0 of rows of a multiple of 8 columns + 17 (aligned data, a pitch of 2 or 4 bytes
 * past a multiple of 16: the GEMV takes it for one row only). */
enum { ALIGNED, SHIFTED, ODD_PITCH };

static pt pt_layout(int layout, tp_dtype gdt, int kind, int64_t rows, int64_t cols, float lo, float hi)
{
    if (layout == SHIFTED) return pt_rand(gdt, kind, rows, cols, 3, lo, hi);
    if (layout == ODD_PITCH) return pt_narrow(pt_rand(gdt, kind, rows, (cols + 7) / 8 * 8 + 17, 0, lo, hi), 0, cols);
    return pt_narrow(pt_rand(gdt, kind, rows, (cols + 7) / 8 * 8 + 16, 0, lo, hi), 8, cols);
}

static const char *layout_name(int layout)
{
    return layout == ALIGNED ? "aligned" : layout == SHIFTED ? "shifted" : "odd pitch";
}

/* The GEMV's fast path, by the rule gemv.cu states (checked against tp_cuda_gemv_fits). */
static int gemv_expected(int layout, int64_t n, int64_t k, tp_dtype xdt, tp_dtype wdt)
{
    const int dtypes = xdt == wdt || (xdt == TP_DTYPE_F32 && wdt != TP_DTYPE_F32);
    return n >= 1 && n <= 8 && k >= 1 && dtypes && (layout == ALIGNED || (layout == ODD_PITCH && n == 1));
}

static void gemv_fits_check(const tp_tensor *x, const tp_tensor *w, int expected, const char *shape)
{
#ifdef HAVE_CUDA
    ck_assert_msg(tp_cuda_gemv_fits(x, w) == expected, "[%s]: tp_cuda_gemv_fits is %d, expected %d", shape,
                  !expected, expected);
#else
    (void)x, (void)w, (void)expected, (void)shape;
#endif
}

/* compare()'s normalized error without its table line (one line per block instead) */
static double err_of(const char *op, const char *shape, const float *got, const float *ref, size_t n, double bound)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(!isnan(got[i]) && !(isinf(got[i]) && got[i] != ref[i]), "%s %s [%s]: element %zu is %g "
                      "(reference %g)", op, tp_dtype_name(gb->act_dtype), shape, i, (double)got[i], (double)ref[i]);
        const double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    const double err = den > 0.0 ? sqrt(num / den) : sqrt(num);
    ck_assert_msg(err <= bound, "%s %s [%s]: normalized error %g exceeds %g", op, tp_dtype_name(gb->act_dtype),
                  shape, err, bound);
    return err;
}

#ifdef HAVE_CUDA
/* The GEMV itself (swiglu: the fused gate/up form) on the rows of x, against the reference
 * the backend's op met: matmul and matmul_swiglu take it only under TPINFER_GEMV */
static void gemv_direct(const char *op, tp_tensor x, tp_tensor w, const pt *bias, tp_dtype ydt, int64_t m, int form,
                        const char *shape, const float *ref, double bound)
{
    pt y = pt_poison(ydt, x.rows, m, 5);
    tp_tensor none = {0};
    ck_assert_msg(tp_cuda_gemv(x, w, bias ? bias->g : none, y.g, form, 132, (cudaStream_t)gb->stream) == TP_OK,
                  "%s [%s]: %s", op, shape, tp_error_message());
    err_of(op, shape, pt_get(&y, 1), ref, (size_t)(x.rows * m), bound);
    pt_guards(op, &y);
}

/* Its add form (y += x @ w^T: matmul_add at one row under TPINFER_GEMV=one) on an f32 y
 * filled at random first, against those values plus ref; and it refuses a bias. */
static void gemv_add_direct(tp_tensor x, tp_tensor w, int64_t m, const char *shape, const float *ref, double bound)
{
    pt y = pt_rand(TP_DTYPE_F32, ACT, x.rows, m, 5, -1.0f, 1.0f);
    const float *y0 = pt_get(&y, 1);
    float *want = host_alloc((size_t)(x.rows * m) * sizeof(float) + 1);
    for (int64_t i = 0; i < x.rows * m; i++) want[i] = y0[i] + ref[i];
    tp_tensor none = {0};
    ck_assert_msg(tp_cuda_gemv(x, w, none, y.g, TP_GEMV_ADD, 132, (cudaStream_t)gb->stream) == TP_OK,
                  "gemv add [%s]: %s", shape, tp_error_message());
    err_of("gemv add", shape, pt_get(&y, 1), want, (size_t)(x.rows * m), bound);
    pt_guards("gemv add", &y);
    ck_assert_msg(tp_cuda_gemv(x, w, y.g, y.g, TP_GEMV_ADD, 132, (cudaStream_t)gb->stream) != TP_OK,
                  "gemv add [%s]: took a bias", shape);
    tp_error_clear();
}
#endif

/* y = x @ w^T (+ bias) for n = 1..9 rows of one x [9, k], through matmul (cuBLASLt) and,
 * where the layout and dtypes allow (n <= 8), through the GEMV kernel directly; with and
 * without a bias, y alternating between f32 and the activation dtype, against the CPU's 9
 * rows. Frees the block's memory at the end. */
static void gemv_block(int layout, tp_dtype wdt, int64_t k, int64_t m)
{
    const tp_dtype A = gb->act_dtype;
    pt x = pt_layout(layout, A, ACT, 9, k, -1.0f, 1.0f);
    pt w = pt_layout(layout == ODD_PITCH ? ALIGNED : layout, wdt, WEIGHT, m, k, -1.0f, 1.0f);
    pt bias = pt_rand(wdt, WEIGHT, 1, m, 3, -1.0f, 1.0f);
    double worst = 0.0, bound = 0.0;
    int fast = 0;
    char shape[128];
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        pt ref = pt_poison(TP_DTYPE_F32, 9, m, 0);
        tp_error_clear();
        ck_assert_msg(cpu->ops->matmul(cpu, &x.c, &w.c, with_bias ? &bias.c : NULL, &ref.c) == TP_OK, "cpu: %s",
                      tp_error_message());
        const float *r = pt_get(&ref, 0);
        for (int64_t n = 1; n <= 9; n++) {
            const tp_dtype ydt = (n + with_bias) % 2 ? A : TP_DTYPE_F32;
            const int expected = gemv_expected(layout, n, k, A, wdt);
            fast += expected;
            snprintf(shape, sizeof shape, "x %s [%lld,%lld] w %s [%lld,%lld]%s y %s %s -> %s", dn(A), (long long)n,
                     (long long)k, dn(wdt), (long long)m, (long long)k, with_bias ? " +bias" : "", dn(ydt),
                     layout_name(layout), expected ? "gemv" : "cublaslt");
            tp_tensor xg = tp_tensor_rows(&x.g, 0, n);
            gemv_fits_check(&xg, &w.g, expected, shape);
            pt y = pt_poison(ydt, n, m, 5);
            tp_error_clear();
            ck_assert_msg(gb->ops->matmul(gb, &xg, &w.g, with_bias ? &bias.g : NULL, &y.g) == TP_OK, "cuda [%s]: %s",
                          shape, tp_error_message());
            const double b = bound_for(REDUCTION, ydt);
            const double e = err_of("matmul", shape, pt_get(&y, 1), r, (size_t)(n * m), b);
            if (e / b > worst / (bound > 0 ? bound : 1)) worst = e, bound = b;
            pt_guards("matmul y", &y);
#ifdef HAVE_CUDA
            if (expected) gemv_direct("gemv", xg, w.g, with_bias ? &bias : NULL, ydt, m, TP_GEMV_PLAIN, shape, r, b);
            if (expected && !with_bias && ydt == TP_DTYPE_F32) gemv_add_direct(xg, w.g, m, shape, r, b);
#endif
        }
    }
    snprintf(shape, sizeof shape, "n 1..9 x [n,%lld] w %s [%lld,%lld] +-bias, %s, %d of 18 gemv", (long long)k,
             dn(wdt), (long long)m, (long long)k, layout_name(layout), fast);
    printf("  %-13s %-9s %-58s err %9.3e  bound %7.1e  %s\n", "matmul small", tp_dtype_name(A), shape, worst, bound,
           "ok");
    fflush(stdout);
    teardown(); /* the big weights go now, and the allocation table stays small */
}

START_TEST(matmul_gemv)
{
    static const int64_t ks[] = {8, 64, 1000, 4096, 14336, 3, 13, 1001}; /* the last three: k % 8 != 0 */
    static const int64_t ms[] = {1, 7, 256, 6144};
    int big = 0;
    FOR_EACH_GPU {
        seed(20);
        const tp_dtype A = gb->act_dtype;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const int64_t k = ks[ki], m = ms[mi];
                if (k % 8 != 0 && m == 6144) continue;
                for (int d = 0; d < 3; d++) {
                    const tp_dtype wdt = float_dtypes[d];
                    /* the GEMV's dtype pairs everywhere; cuBLASLt's other pairs on small shapes */
                    const int gemv_pair = wdt == A || (A == TP_DTYPE_F32);
                    if (!gemv_pair && (k > 1001 || m > 256)) continue;
                    /* the two largest weights: one dtype each (in turn at f32 activations) */
                    if (k * m > (8 << 20) && A == TP_DTYPE_F32 && wdt != float_dtypes[big % 3]) continue;
                    gemv_block(ALIGNED, wdt, k, m);
                }
                if (k * m > (8 << 20)) big++;
            }
        /* layouts the GEMV refuses (or takes for n = 1 only) */
        for (int d = 0; d < 3; d++) {
            gemv_block(SHIFTED, float_dtypes[d], 64, 7);
            gemv_block(ODD_PITCH, float_dtypes[d], 1001, 256);
        }
    }
}
END_TEST

/* out = silu(gate) * up of [gate | up] = x @ w^T (+ bias) for n in 1..8 and 17 rows of one
 * x [17, k], against the CPU's composition (matmul, then swiglu) on 17 rows; gate_up is
 * scratch (its contents are not checked). Frees the block's memory at the end. */
static void swiglu_block(int layout, tp_dtype wdt, int64_t k, int64_t m)
{
    static const int64_t ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 17};
    const tp_dtype A = gb->act_dtype;
    pt x = pt_layout(layout, A, ACT, 17, k, -1.0f, 1.0f);
    pt w = pt_layout(layout == ODD_PITCH ? ALIGNED : layout, wdt, WEIGHT, 2 * m, k, -0.25f, 0.25f);
    pt bias = pt_rand(wdt, WEIGHT, 1, 2 * m, 3, -2.0f, 2.0f);
    double worst = 0.0, bound = 0.0;
    int fast = 0;
    char shape[128];
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        pt gu_ref = pt_poison(TP_DTYPE_F32, 17, 2 * m, 0), ref = pt_poison(TP_DTYPE_F32, 17, m, 0);
        tp_error_clear();
        ck_assert_msg(cpu->ops->matmul_swiglu(cpu, &x.c, &w.c, with_bias ? &bias.c : NULL, &gu_ref.c, &ref.c) == TP_OK,
                      "cpu: %s", tp_error_message());
        const float *r = pt_get(&ref, 0);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int64_t n = ns[ni];
            const tp_dtype ydt = (n + with_bias) % 2 ? A : TP_DTYPE_F32;
            const int expected = gemv_expected(layout, n, k, A, wdt);
            fast += expected;
            snprintf(shape, sizeof shape, "x %s [%lld,%lld] w %s [%lld,%lld]%s out %s %s -> %s", dn(A), (long long)n,
                     (long long)k, dn(wdt), (long long)(2 * m), (long long)k, with_bias ? " +bias" : "", dn(ydt),
                     layout_name(layout), expected ? "matmul+swiglu, and the gemv" : "matmul+swiglu");
            tp_tensor xg = tp_tensor_rows(&x.g, 0, n);
            gemv_fits_check(&xg, &w.g, expected, shape);
            pt gu = pt_poison(A, n, 2 * m, 3), out = pt_poison(ydt, n, m, 5);
            tp_error_clear();
            ck_assert_msg(gb->ops->matmul_swiglu(gb, &xg, &w.g, with_bias ? &bias.g : NULL, &gu.g, &out.g) == TP_OK,
                          "cuda [%s]: %s", shape, tp_error_message());
            const double b = bound_for(REDUCTION, ydt);
            const double e = err_of("matmul_swiglu", shape, pt_get(&out, 1), r, (size_t)(n * m), b);
            if (e / b > worst / (bound > 0 ? bound : 1)) worst = e, bound = b;
            pt_guards("matmul_swiglu out", &out);
#ifdef HAVE_CUDA
            if (expected)
                gemv_direct("gemv swiglu", xg, w.g, with_bias ? &bias : NULL, ydt, m, TP_GEMV_SWIGLU, shape, r, b);
#endif
        }
    }
    snprintf(shape, sizeof shape, "n 1..8,17 x [n,%lld] w %s [%lld,%lld] +-bias, %s, %d of 18 gemv too", (long long)k,
             dn(wdt), (long long)(2 * m), (long long)k, layout_name(layout), fast);
    printf("  %-13s %-9s %-58s err %9.3e  bound %7.1e  %s\n", "matmul_swiglu", tp_dtype_name(A), shape, worst, bound,
           "ok");
    fflush(stdout);
    teardown();
}

START_TEST(matmul_swiglu_cases)
{
    static const int64_t shapes[][2] = {{64, 1}, {1000, 7}, {4096, 256}, {13, 33}, {1001, 3}, {8, 1500}, {4096, 1792}};
    FOR_EACH_GPU {
        seed(21);
        const tp_dtype A = gb->act_dtype;
        ck_assert_ptr_nonnull(gb->ops->matmul_swiglu);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int d = 0; d < 3; d++) {
                const tp_dtype wdt = float_dtypes[d];
                if (wdt != A && A != TP_DTYPE_F32 && shapes[s][0] > 1001) continue;
                swiglu_block(ALIGNED, wdt, shapes[s][0], shapes[s][1]);
            }
        swiglu_block(SHIFTED, A, 64, 7);
        swiglu_block(ODD_PITCH, A, 64, 7);

        /* k == 0: out = silu(bias_gate) * bias_up, through the unfused path */
        pt x0 = pt_rand(A, ACT, 3, 0, 2, -1, 1), w0 = pt_rand(TP_DTYPE_BF16, WEIGHT, 10, 0, 2, -1, 1);
        pt b0 = pt_rand(TP_DTYPE_BF16, WEIGHT, 1, 10, 0, -3, 3), gu0 = pt_poison(A, 3, 10, 1);
        pt o0 = pt_poison(A, 3, 5, 2);
        RUN_BOTH(cpu->ops->matmul_swiglu(cpu, &x0.c, &w0.c, &b0.c, &gu0.c, &o0.c),
                 gb->ops->matmul_swiglu(gb, &x0.g, &w0.g, &b0.g, &gu0.g, &o0.g));
        compare("matmul_swiglu", "k = 0: out = silu(bias gate) * bias up", pt_get(&o0, 1), pt_get(&o0, 0), 15,
                ELEMENTWISE, A);
        pt_guards("matmul_swiglu k=0", &o0);

        /* recorded in a graph and replayed: the GEMV and the fused GEMV of a decode step */
        if (gb->ops->graph_begin) {
            pt x = pt_layout(ALIGNED, A, ACT, 4, 256, -1, 1), w = pt_layout(ALIGNED, A, WEIGHT, 96, 256, -0.25f, 0.25f);
            pt gu = pt_poison(A, 4, 96, 0), out = pt_poison(A, 4, 48, 0), y = pt_poison(A, 4, 96, 0);
            pt gu_c = pt_poison(TP_DTYPE_F32, 4, 96, 0), ref = pt_poison(TP_DTYPE_F32, 4, 48, 0);
            pt yref = pt_poison(TP_DTYPE_F32, 4, 96, 0);
            void *graph = NULL;
            tp_error_clear();
            ck_assert_msg(gb->ops->graph_begin(gb) == TP_OK, "graph_begin: %s", tp_error_message());
            ck_assert_msg(gb->ops->matmul_swiglu(gb, &x.g, &w.g, NULL, &gu.g, &out.g) == TP_OK, "%s",
                          tp_error_message());
            ck_assert_msg(gb->ops->matmul(gb, &x.g, &w.g, NULL, &y.g) == TP_OK, "%s", tp_error_message());
            ck_assert_msg(gb->ops->graph_end(gb, &graph) == TP_OK, "graph_end: %s", tp_error_message());
            ck_assert_msg(gb->ops->graph_launch(gb, graph) == TP_OK, "graph_launch: %s", tp_error_message());
            ck_assert_msg(cpu->ops->matmul_swiglu(cpu, &x.c, &w.c, NULL, &gu_c.c, &ref.c) == TP_OK, "cpu: %s",
                          tp_error_message());
            ck_assert_msg(cpu->ops->matmul(cpu, &x.c, &w.c, NULL, &yref.c) == TP_OK, "cpu: %s", tp_error_message());
            compare("matmul_swiglu", "graph: x [4,256] w [96,256] out [4,48]", pt_get(&out, 1), pt_get(&ref, 0),
                    4 * 48, REDUCTION, A);
            compare("matmul", "graph: x [4,256] w [96,256] y [4,96]", pt_get(&y, 1), pt_get(&yref, 0), 4 * 96,
                    REDUCTION, A);
            gb->ops->graph_free(gb, graph);
        }

        /* argument errors: the checks of matmul and swiglu under one name */
        pt x = pt_rand(A, ACT, 4, 64, 0, -1, 1), w = pt_rand(A, WEIGHT, 8, 64, 0, -1, 1);
        pt w7 = pt_rand(A, WEIGHT, 7, 64, 0, -1, 1), w32 = pt_rand(A, WEIGHT, 8, 32, 0, -1, 1);
        pt gu = pt_poison(A, 4, 8, 0), gu6 = pt_poison(A, 4, 6, 0), out = pt_poison(A, 4, 4, 0);
        pt out5 = pt_poison(A, 4, 5, 0), b7 = pt_rand(A, WEIGHT, 1, 7, 0, -1, 1);
        EXPECT_INVALID(gb->ops->matmul_swiglu(gb, &x.g, &w7.g, NULL, &gu.g, &out.g), "matmul_swiglu: w has 7 rows");
        EXPECT_INVALID(gb->ops->matmul_swiglu(gb, &x.g, &w32.g, NULL, &gu.g, &out.g),
                       "matmul_swiglu: x has 64 columns but w has 32");
        EXPECT_INVALID(gb->ops->matmul_swiglu(gb, &x.g, &w.g, NULL, &gu6.g, &out.g),
                       "matmul_swiglu: gate_up is [4, 6], expected [4, 8]");
        EXPECT_INVALID(gb->ops->matmul_swiglu(gb, &x.g, &w.g, NULL, &gu.g, &out5.g),
                       "matmul_swiglu: out is [4, 5], expected [4, 4]");
        EXPECT_INVALID(gb->ops->matmul_swiglu(gb, &x.g, &w.g, &b7.g, &gu.g, &out.g),
                       "matmul_swiglu: bias is [1, 7], expected [1, 8]");
        EXPECT_INVALID(gb->ops->matmul_swiglu(gb, NULL, &w.g, NULL, &gu.g, &out.g), "matmul_swiglu: x is NULL");
        EXPECT_INVALID(gb->ops->matmul_swiglu(gb, &x.g, &w.g, NULL, NULL, &out.g), "matmul_swiglu: gate_up is NULL");
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
        printf("  %-13s %-9s %-58s ok\n", "matmul_swiglu", tp_dtype_name(A), "k = 0, graph, TP_ERR_INVALID_ARG");
    }
}
END_TEST

/* ---- embedding, norms, rope --------------------------------------------------------------- */

static void embedding_case(tp_dtype wdt, int32_t n, int64_t V, int64_t d, int64_t vocab_begin, tp_dtype odt,
                           int64_t pad)
{
    pt table = pt_rand(wdt, WEIGHT, V, d, pad, -1.0f, 1.0f);
    pt out = pt_poison(odt, n, d, pad);
    int32_t *ids = host_alloc((size_t)n * sizeof(int32_t) + 1), *ic, *ig;
    for (int32_t i = 0; i < n; i++) /* some outside this rank's slice, on both sides */
        ids[i] = (int32_t)(vocab_begin - 3 + rand_int((int)V + 6));
    ints_both(ids, n, &ic, &ig);
    RUN_BOTH(cpu->ops->embedding(cpu, ic, n, &table.c, vocab_begin, &out.c),
             gb->ops->embedding(gb, ig, n, &table.g, vocab_begin, &out.g));
    char shape[96];
    snprintf(shape, sizeof shape, "n %d table %s [%lld,%lld] from %lld out %s pad %lld", n, dn(wdt), (long long)V,
             (long long)d, (long long)vocab_begin, dn(odt), (long long)pad);
    compare("embedding", shape, pt_get(&out, 1), pt_get(&out, 0), (size_t)(n * d), ELEMENTWISE, odt);
    pt_guards("embedding out", &out);
}

START_TEST(embedding_cases)
{
    FOR_EACH_GPU {
        seed(3);
        for (int d = 0; d < 3; d++) {
            embedding_case(float_dtypes[d], 1, 1, 1, 0, TP_DTYPE_F32, 0);
            embedding_case(float_dtypes[d], 17, 64, 130, 5, TP_DTYPE_F32, 3);
            embedding_case(float_dtypes[d], 130, 17, 64, 1000, gb->act_dtype, 2);
        }
    }
}
END_TEST

static void add_rmsnorm_case(tp_dtype wdt, int64_t n, int64_t d, int with_delta, tp_dtype ddt, int64_t pad)
{
    const float eps = 1e-5f;
    const tp_dtype A = gb->act_dtype;
    pt res = pt_rand(TP_DTYPE_F32, ACT, n, d, pad, -2.0f, 2.0f);
    pt delta = pt_rand(ddt, ACT, n, d, pad, -1.0f, 1.0f);
    pt w = pt_rand(wdt, WEIGHT, 1, d, pad, 0.5f, 1.5f);
    pt out = pt_poison(A, n, d, pad);
    RUN_BOTH(cpu->ops->add_rmsnorm(cpu, &res.c, with_delta ? &delta.c : NULL, &w.c, eps, &out.c),
             gb->ops->add_rmsnorm(gb, &res.g, with_delta ? &delta.g : NULL, &w.g, eps, &out.g));
    char shape[96];
    snprintf(shape, sizeof shape, "[%lld,%lld] delta %s w %s out %s pad %lld", (long long)n, (long long)d,
             with_delta ? dn(ddt) : "-", dn(wdt), dn(A), (long long)pad);
    compare("add_rmsnorm.r", shape, pt_get(&res, 1), pt_get(&res, 0), (size_t)(n * d), EXACT, TP_DTYPE_F32);
    compare("add_rmsnorm", shape, pt_get(&out, 1), pt_get(&out, 0), (size_t)(n * d), ELEMENTWISE, A);
    pt_guards("add_rmsnorm residual", &res);
    pt_guards("add_rmsnorm out", &out);
}

START_TEST(add_rmsnorm_shapes)
{
    /* d picks the kernel: rows in registers K = 1, 2, 4, 8 per thread, or the loop past 8192;
     * rows 16-byte aligned with d % 8 == 0 take 16-byte chunks, 1, 2 or 4 a thread (d 64 ..
     * 8192): pad 0, or 16 (pt_from puts the view at column pad / 2, 16 bytes in at 16 bits);
     * pad 5 misaligns every row (the registers kernel); many rows as in a prefill step.
     * v: no delta (pad 0), an f32 delta (pad 16), the activations' dtype (pad 16, then 5) */
    static const int64_t shapes[][2] = {{1, 1},    {3, 17},   {17, 64},  {2, 130},  {5, 1000},  {2, 2048},
                                        {1, 4096}, {3, 4099}, {2, 8192}, {1, 8193}, {600, 4096}, {513, 1000}};
    FOR_EACH_GPU {
        seed(4);
        for (int d = 0; d < 3; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int v = 0; v < 4; v++)
                    add_rmsnorm_case(float_dtypes[d], shapes[s][0], shapes[s][1], v > 0,
                                     v >= 2 ? gb->act_dtype : TP_DTYPE_F32, v == 3 ? 5 : v ? 16 : 0);
    }
}
END_TEST

START_TEST(head_rmsnorm_shapes)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 2, 17}, {17, 4, 64}, {2, 3, 130}, {130, 8, 128}};
    const float eps = 1e-6f;
    FOR_EACH_GPU {
        seed(5);
        for (int d = 0; d < 3; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                int64_t n = shapes[s][0], heads = shapes[s][1], hd = shapes[s][2], cols = heads * hd;
                pt x = pt_rand(gb->act_dtype, ACT, n, cols, 7, -3.0f, 3.0f); /* a view, as q is of qkv */
                pt w = pt_rand(float_dtypes[d], WEIGHT, 1, hd, 0, 0.5f, 1.5f);
                RUN_BOTH(cpu->ops->head_rmsnorm(cpu, &x.c, (int32_t)hd, &w.c, eps),
                         gb->ops->head_rmsnorm(gb, &x.g, (int32_t)hd, &w.g, eps));
                char shape[96];
                snprintf(shape, sizeof shape, "n %lld heads %lld hd %lld w %s (view)", (long long)n,
                         (long long)heads, (long long)hd, dn(float_dtypes[d]));
                compare("head_rmsnorm", shape, pt_get(&x, 1), pt_get(&x, 0), (size_t)(n * cols), ELEMENTWISE,
                        gb->act_dtype);
                pt_guards("head_rmsnorm x", &x);
            }
    }
}
END_TEST

START_TEST(rope_shapes)
{
    static const int64_t shapes[][3] = {{1, 1, 2}, {3, 2, 64}, {17, 3, 130}, {5, 4, 128}, {64, 32, 128}};
    static const int32_t positions[] = {0, 1, 2, 17, 100, 4095, 32767, 131071};
    FOR_EACH_GPU {
        seed(6);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t n = shapes[s][0], heads = shapes[s][1], hd = shapes[s][2], cols = heads * hd, half = hd / 2;
            pt x = pt_rand(gb->act_dtype, ACT, n, cols, 6, -1.0f, 1.0f);
            int32_t *pos = host_alloc((size_t)n * sizeof(int32_t)), *pc, *pg;
            float *inv = host_alloc((size_t)half * sizeof(float));
            for (int64_t i = 0; i < n; i++) pos[i] = positions[rand_int(8)];
            for (int64_t j = 0; j < half; j++) inv[j] = (float)pow(500000.0, -2.0 * (double)j / (double)hd);
            ints_both(pos, (int)n, &pc, &pg);
            const float *ic = dev_copy(cpu, inv, (size_t)half * sizeof(float));
            const float *ig = dev_copy(gb, inv, (size_t)half * sizeof(float));
            RUN_BOTH(cpu->ops->rope(cpu, &x.c, (int32_t)hd, pc, ic), gb->ops->rope(gb, &x.g, (int32_t)hd, pg, ig));
            char shape[96];
            snprintf(shape, sizeof shape, "n %lld heads %lld hd %lld pos <= 131071 (view)", (long long)n,
                     (long long)heads, (long long)hd);
            compare("rope", shape, pt_get(&x, 1), pt_get(&x, 0), (size_t)(n * cols), ELEMENTWISE, gb->act_dtype);
            pt_guards("rope x", &x);
        }
    }
}
END_TEST

/* ---- KV cache and attention ------------------------------------------------------------------ */

/* One step: sequence s has hist[s] positions stored by an earlier kv_store and chunk[s]
 * new tokens in this step (interleaved across sequences, or each sequence's together in
 * order when contiguous, as the engine lays a step out); physical blocks are a random
 * permutation, and the block table has a spare column of -1. pad_token: the step's last
 * token is padding for kv_store (slot -1). max_pos_extra: added to the batch's max_pos,
 * a loose bound as a CUDA graph's (the whole context capacity). */
typedef struct attn_case {
    int kvh, ratio, hd, bs, n_seqs;
    int hist[8], chunk[8];
    int pad_token;
    int max_pos_extra;
    int contiguous;
} attn_case;

/* The CUDA prefill kernel: mode > 0 on wherever it fits, 0 off, < 0 the default. */
static void force_prefill_attention(int mode)
{
#ifdef HAVE_CUDA
    tp_cuda_attention_force_prefill(mode);
#else
    (void)mode;
#endif
}

static const attn_case attn_cases[] = {
    /* one sequence, a prefill chunk from scratch */
    {1, 1, 17, 4, 1, {0}, {13}, 0, 0, 0},
    /* three sequences: a chunk after history, a decode step, a first token; GQA 2 */
    {2, 2, 64, 16, 3, {10, 33, 0}, {10, 1, 1}, 0, 0, 0},
    /* GQA 4, block size 1, head dim 3 */
    {2, 4, 3, 1, 3, {5, 0, 20}, {3, 7, 1}, 1, 0, 0},
    /* positions over many blocks and several softmax chunks */
    {1, 4, 64, 8, 2, {70, 140}, {2, 30}, 0, 0, 0},
    /* head dim 130, block size 16, GQA 1 across four sequences */
    {3, 1, 130, 16, 4, {0, 1, 15, 16}, {1, 16, 2, 17}, 1, 0, 0},
    /* decode only, long contexts, Llama's head dim */
    {4, 2, 128, 16, 4, {300, 3, 47, 64}, {1, 1, 1, 1}, 0, 0, 0},
    /* a long prefill chunk */
    {2, 4, 128, 16, 2, {0, 150}, {200, 40}, 0, 0, 0},
};

/* qodt: the dtype of q and out (the activation dtype in the engine). both_paths: the GPU
 * runs twice against the one CPU result, the prefill kernel forced on, then off. window: the
 * attention's sliding window (0: none). */
static float case_softcap; /* attention_case's soft-capping (Gemma 2's), 0 but in the soft-capped rounds */

static void attention_case(const attn_case *c, tp_dtype cdt, tp_dtype qodt, uint64_t s, int both_paths, int window)
{
    seed(s);
    const tp_dtype A = gb->act_dtype;
    const int kvh = c->kvh, hd = c->hd, bs = c->bs, qh = kvh * c->ratio, width = kvh * hd;
    int total[8], max_blocks = 1, need = 0, n = 0, nh = 0;
    for (int q = 0; q < c->n_seqs; q++) {
        total[q] = c->hist[q] + c->chunk[q];
        int blocks = (total[q] + bs - 1) / bs;
        if (blocks + 1 > max_blocks) max_blocks = blocks + 1;
        need += blocks;
        n += c->chunk[q];
        nh += c->hist[q];
    }
    const int n_blocks = need + 3;
    int32_t *perm = host_alloc((size_t)n_blocks * sizeof(int32_t));
    random_permutation(perm, n_blocks);
    int32_t *table = host_alloc((size_t)(c->n_seqs * max_blocks) * sizeof(int32_t)), *tc, *tg;
    for (int i = 0, next = 0; i < c->n_seqs; i++)
        for (int lb = 0; lb < max_blocks; lb++) table[i * max_blocks + lb] = lb * bs < total[i] ? perm[next++] : -1;
    ints_both(table, c->n_seqs * max_blocks, &tc, &tg);
#define SLOT(q, p) (table[(q) * max_blocks + (p) / bs] * bs + (p) % bs)

    /* the caches, zeroed, one per backend */
    const size_t cache_bytes = (size_t)n_blocks * bs * width * tp_dtype_size(cdt);
    tp_kv_layer kc = {dev_alloc(cpu, cache_bytes), dev_alloc(cpu, cache_bytes), cdt, n_blocks, bs, kvh, hd};
    tp_kv_layer kg = {dev_alloc(gb, cache_bytes), dev_alloc(gb, cache_bytes), cdt, n_blocks, bs, kvh, hd};
    ck_assert_int_eq(cpu->ops->memset0(cpu, kc.k, cache_bytes), TP_OK);
    ck_assert_int_eq(cpu->ops->memset0(cpu, kc.v, cache_bytes), TP_OK);
    ck_assert_int_eq(gb->ops->memset0(gb, kg.k, cache_bytes), TP_OK);
    ck_assert_int_eq(gb->ops->memset0(gb, kg.v, cache_bytes), TP_OK);

    /* history: one kv_store of every earlier position */
    if (nh > 0) {
        pt hk = pt_rand(A, ACT, nh, width, 0, -1, 1), hv = pt_rand(A, ACT, nh, width, 0, -1, 1);
        int32_t *seq = host_alloc((size_t)nh * 4), *pos = host_alloc((size_t)nh * 4), *slot = host_alloc((size_t)nh * 4);
        for (int q = 0, i = 0; q < c->n_seqs; q++)
            for (int p = 0; p < c->hist[q]; p++, i++) {
                seq[i] = q;
                pos[i] = p;
                slot[i] = SLOT(q, p);
            }
        int32_t *sc, *sg, *pc, *pg, *lc, *lg;
        ints_both(seq, nh, &sc, &sg);
        ints_both(pos, nh, &pc, &pg);
        ints_both(slot, nh, &lc, &lg);
        tp_attn_batch bc = {nh, sc, pc, lc, tc, max_blocks, 1 << 20, 0, 0, 0}, bg = {nh, sg, pg, lg, tg, max_blocks, 1 << 20, 0, 0, 0};
        RUN_BOTH(cpu->ops->kv_store(cpu, &hk.c, &hv.c, &kc, &bc), gb->ops->kv_store(gb, &hk.g, &hv.g, &kg, &bg));
    }

    /* this step: tokens interleaved across sequences */
    int32_t *seq = host_alloc((size_t)n * 4), *pos = host_alloc((size_t)n * 4), *slot = host_alloc((size_t)n * 4);
    int max_pos = 1;
    if (c->contiguous) {
        for (int q = 0, i = 0; q < c->n_seqs; q++)
            for (int r = 0; r < c->chunk[q]; r++, i++) {
                seq[i] = q;
                pos[i] = c->hist[q] + r;
                slot[i] = SLOT(q, pos[i]);
                if (pos[i] + 1 > max_pos) max_pos = pos[i] + 1;
            }
    } else {
        for (int r = 0, i = 0; i < n; r++)
            for (int q = 0; q < c->n_seqs; q++)
                if (r < c->chunk[q]) {
                    seq[i] = q;
                    pos[i] = c->hist[q] + r;
                    slot[i] = SLOT(q, pos[i]);
                    if (pos[i] + 1 > max_pos) max_pos = pos[i] + 1;
                    i++;
                }
    }
    if (c->pad_token) slot[n - 1] = -1;
    max_pos += c->max_pos_extra;
    int32_t *sc, *sg, *pc, *pg, *lc, *lg;
    ints_both(seq, n, &sc, &sg);
    ints_both(pos, n, &pc, &pg);
    ints_both(slot, n, &lc, &lg);
    tp_attn_batch bc = {n, sc, pc, lc, tc, max_blocks, max_pos, 0, 0, 0}, bg = {n, sg, pg, lg, tg, max_blocks, max_pos, 0, 0, 0};
    /* a token per sequence, token i of sequence i (a decode step's layout): the CUDA decode
     * kernel asks for the keys before pos ahead of its wait for the previous kernel */
    int one = n == c->n_seqs;
    for (int i = 0; i < n; i++) one = one && seq[i] == i;
    bc.one_per_seq = bg.one_per_seq = one;
    bc.window = bg.window = window;
    bc.softcap = bg.softcap = case_softcap;
    pt qkv = pt_rand(A, ACT, n, (qh + 2 * kvh) * hd, 5, -1, 1);
    tp_tensor qc = tp_tensor_cols(&qkv.c, 0, qh * hd), qg = tp_tensor_cols(&qkv.g, 0, qh * hd);
    tp_tensor k_c = tp_tensor_cols(&qkv.c, qh * hd, width), k_g = tp_tensor_cols(&qkv.g, qh * hd, width);
    tp_tensor v_c = tp_tensor_cols(&qkv.c, qh * hd + width, width), v_g = tp_tensor_cols(&qkv.g, qh * hd + width, width);
    RUN_BOTH(cpu->ops->kv_store(cpu, &k_c, &v_c, &kc, &bc), gb->ops->kv_store(gb, &k_g, &v_g, &kg, &bg));
#undef SLOT

    char shape[160];
    char wnd[24] = "";
    if (window) snprintf(wnd, sizeof wnd, " window %d", window);
    snprintf(shape, sizeof shape, "cache %s kvh %d gqa %d hd %d bs %d seqs %d tokens %d max_pos %d%s%s%s%s%s", dn(cdt),
             kvh, c->ratio, hd, bs, c->n_seqs, n, max_pos, qodt != A ? " q/out " : "", qodt != A ? dn(qodt) : "",
             c->contiguous ? " contig" : "", one ? " decode" : "", wnd);

    /* q in its own dtype: qkv's q values, rounded to it on both sides */
    if (qodt != A) {
        const int64_t qw = (int64_t)qh * hd + 5, all = qkv.cols;
        const float *qv = pt_get(&qkv, 0);
        float *v = host_alloc((size_t)(n * qw) * sizeof(float));
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < qw; j++) /* the view starts at column 2 (pt_from's pad / 2) */
                v[r * qw + j] = j >= 2 && j - 2 < qh * hd ? qv[r * all + j - 2] : 0.0f;
        pt qo = pt_from(qodt, ACT, n, qh * hd, 5, v);
        qc = qo.c;
        qg = qo.g;
    }
    pt out = pt_poison(qodt, n, qh * hd, 3);
    const float scale = 1.0f / sqrtf((float)hd);
    tp_error_clear();
    ck_assert_msg(cpu->ops->attention(cpu, &qc, &kc, &bc, qh, scale, &out.c) == TP_OK, "cpu: %s", tp_error_message());
    if (both_paths) force_prefill_attention(1);
    tp_status gst = gb->ops->attention(gb, &qg, &kg, &bg, qh, scale, &out.g); /* right after kv_store */
    force_prefill_attention(-1);
    ck_assert_msg(gst == TP_OK, "cuda: %s", tp_error_message());
    /* the caches are the same bytes (the values are the same, the conversion too); read after
     * the attention, so that it ran right behind the kv_store (a decode layout's early loads) */
    ck_assert_msg(!memcmp(dev_bytes(cpu, kc.k, cache_bytes), dev_bytes(gb, kg.k, cache_bytes), cache_bytes),
                  "kv_store [%s]: the K caches differ", shape);
    ck_assert_msg(!memcmp(dev_bytes(cpu, kc.v, cache_bytes), dev_bytes(gb, kg.v, cache_bytes), cache_bytes),
                  "kv_store [%s]: the V caches differ", shape);
    printf("  %-13s %-9s %-58s err %9.3e  bound %7.1e  %s\n", "kv_store", tp_dtype_name(A), shape, 0.0, 0.0, "ok");
    const float *want = pt_get(&out, 0);
    char label[200];
    snprintf(label, sizeof label, "%s%s", shape, both_paths ? " prefill on" : "");
    compare("attention", label, pt_get(&out, 1), want, (size_t)(n * qh * hd), REDUCTION, qodt);
    pt_guards("attention out", &out);
    /* both paths: again with out's rows aligned (the prefill kernel's paired stores; pad 3
     * above leaves them single), then against the flash kernel alone */
    static const struct { int prefill, pad; const char *name; } again[] = {{1, 0, "prefill on, aligned out"},
                                                                        {0, 3, "prefill off"}};
    for (size_t v = 0; both_paths && v < sizeof again / sizeof again[0]; v++) {
        pt other = pt_poison(qodt, n, qh * hd, again[v].pad);
        force_prefill_attention(again[v].prefill);
        gst = gb->ops->attention(gb, &qg, &kg, &bg, qh, scale, &other.g);
        force_prefill_attention(-1);
        ck_assert_msg(gst == TP_OK, "cuda: %s", tp_error_message());
        snprintf(label, sizeof label, "%s %s", shape, again[v].name);
        compare("attention", label, pt_get(&other, 1), want, (size_t)(n * qh * hd), REDUCTION, qodt);
        snprintf(label, sizeof label, "attention out (%s)", again[v].name);
        pt_guards(label, &other);
    }
    pt_guards("kv_store qkv (read only)", &qkv);
}

START_TEST(attention_cases)
{
    FOR_EACH_GPU {
        for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++) {
            attention_case(&attn_cases[i], gb->act_dtype, gb->act_dtype, 100 + i, 0, 0);
            if (gb->act_dtype != TP_DTYPE_F32) attention_case(&attn_cases[i], TP_DTYPE_F32, gb->act_dtype, 200 + i, 0, 0);
        }
        /* soft-capped scores (Gemma 2), a window too */
        case_softcap = 0.7f;
        for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++)
            attention_case(&attn_cases[i], gb->act_dtype, gb->act_dtype, 300 + i, 0, i % 2 ? 5 : 0);
        case_softcap = 0;
    }
}
END_TEST

/* The flash kernel's shapes (cuda/attention.cu): long contexts split over many blocks, GQA
 * ratios 1 to 16 (more than 8 q heads per KV head take several blocks; odd ratios are
 * padded), head dims 8 to 256 and a fallback one (96), block sizes 1 to 64, batches mixing
 * short and long sequences, prefill, and graph-mode max_pos far past every position. */
static const attn_case attn_long_cases[] = {
    /* one long decode: many splits */
    {2, 4, 128, 16, 1, {3000}, {1}, 0, 0, 0},
    /* Llama-3-8B's shape: 8 KV heads, GQA 4; short and long sequences in one batch */
    {8, 4, 128, 16, 8, {3000, 0, 17, 64, 127, 128, 1000, 2047}, {1, 1, 1, 1, 1, 1, 1, 1}, 0, 0, 0},
    /* the same batch as a CUDA graph sees it: max_pos the whole capacity */
    {8, 4, 128, 16, 8, {3000, 0, 17, 64, 127, 128, 1000, 2047}, {1, 1, 1, 1, 1, 1, 1, 1}, 0, 131072, 0},
    /* a short decode under a graph's bound: many splits planned, one used */
    {8, 4, 128, 16, 1, {100}, {1}, 0, 65536, 0},
    /* GQA 8, head dim 64, block size 32 */
    {1, 8, 64, 32, 4, {2500, 5, 700, 63}, {1, 1, 1, 1}, 0, 0, 0},
    /* GQA 1, head dim 256 (f32: two vectors per lane) */
    {4, 1, 256, 16, 2, {1500, 300}, {1, 1}, 0, 0, 0},
    /* GQA 16: two blocks of 8 q heads per KV head */
    {1, 16, 128, 16, 1, {900}, {2}, 0, 0, 0},
    /* GQA 6 (padded to 8) and 12 (two blocks of 6) */
    {2, 6, 64, 16, 2, {400, 129}, {1, 3}, 0, 0, 0},
    {1, 12, 64, 16, 1, {700}, {1}, 0, 4096, 0},
    /* GQA 3 (padded to 4) and 2; the tiny models' head dims 32, 8, 16 */
    {2, 3, 32, 16, 2, {300, 2}, {1, 5}, 0, 0, 0},
    {4, 2, 8, 16, 2, {300, 2}, {1, 5}, 0, 0, 0},
    {2, 4, 16, 8, 3, {500, 0, 33}, {1, 4, 1}, 1, 0, 0},
    /* block sizes 1 and 64 over long contexts; 24 and 12, not powers of two (the tensor-core
     * decode kernel divides where it would shift) */
    {2, 4, 128, 1, 2, {700, 3}, {1, 1}, 0, 0, 0},
    {2, 4, 128, 64, 2, {1900, 65}, {1, 1}, 0, 0, 0},
    {2, 4, 128, 24, 3, {700, 40, 0}, {1, 1, 1}, 0, 0, 0},
    {1, 8, 64, 12, 2, {300, 25}, {1, 2}, 0, 0, 0},
    /* prefill: a 600-token prompt (blocks enough without splits); a chunk after a long history */
    {2, 4, 128, 16, 1, {0}, {600}, 0, 0, 0},
    {2, 4, 128, 16, 1, {1000}, {64}, 0, 0, 0},
    /* head dim 96: the simple kernel, long */
    {2, 4, 96, 16, 2, {1000, 10}, {1, 1}, 0, 0, 0},
};

START_TEST(attention_long)
{
    FOR_EACH_GPU {
        const tp_dtype A = gb->act_dtype, other = A == TP_DTYPE_F32 ? TP_DTYPE_BF16 : TP_DTYPE_F32;
        for (size_t i = 0; i < sizeof attn_long_cases / sizeof attn_long_cases[0]; i++) {
            for (int d = 0; d < 3; d++) {
                attention_case(&attn_long_cases[i], float_dtypes[d], A, 300 + 10 * i + d, 0, 0);
                teardown(); /* the caches are large: free each case's allocations */
            }
            attention_case(&attn_long_cases[i], A, other, 400 + i, 0, 0); /* q and out unlike the activations */
            teardown();
        }
    }
}
END_TEST

/* The prefill kernel (cuda/attention.cu: tiles of 64 tokens on tensor cores, the flash kernel
 * for what it leaves), each case with it forced on and off: prompts from position 0 of 128,
 * 257 (a partial last tile), 1000 and 2048 tokens; a 200-token chunk after 300 cached
 * positions; several prompts with decode tokens in one step (runs across tile boundaries,
 * runs shorter than a tile, tiles mixing decode and prefill); GQA 1, 4, 8 (32 q heads over
 * 32, 8, 4 KV heads), head dims 64 and 128, block sizes 16 and 32. The kernel takes 16-bit
 * caches with q of the same dtype: on the f32 backend the cases run with a bf16 cache and
 * bf16 q/out. */
static const attn_case attn_prefill_cases[] = {
    {8, 4, 128, 16, 1, {0}, {128}, 0, 0, 1},
    {32, 1, 64, 32, 1, {0}, {257}, 0, 0, 1},
    {4, 8, 128, 16, 1, {0}, {1000}, 0, 0, 1},
    {8, 4, 128, 16, 1, {0}, {2048}, 0, 0, 1},
    /* chunked prefill: the prefix in the cache, the chunk's own keys stored this step */
    {8, 4, 64, 32, 1, {300}, {200}, 0, 0, 1},
    {32, 1, 128, 16, 1, {300}, {200}, 0, 0, 1},
    /* 3 prompts of 70, 130, 64 and 2 decode tokens; the same with chunks and GQA 8 */
    {8, 4, 128, 16, 5, {0, 0, 0, 40, 500}, {70, 130, 64, 1, 1}, 0, 0, 1},
    {4, 8, 64, 32, 5, {75, 0, 0, 300, 17}, {1, 70, 130, 1, 64}, 0, 0, 1},
    {32, 1, 128, 32, 6, {0, 1, 0, 64, 2, 0}, {20, 1, 100, 15, 1, 90}, 1, 0, 1},
    /* a graph-sized max_pos; an interleaved step (nothing for the prefill kernel) */
    {8, 4, 128, 16, 2, {0, 33}, {150, 80}, 0, 65536, 1},
    {8, 4, 128, 16, 3, {0, 100, 0}, {100, 100, 100}, 0, 0, 0},
};

START_TEST(attention_prefill)
{
    FOR_EACH_GPU {
        const tp_dtype A = gb->act_dtype, C = A == TP_DTYPE_F32 ? TP_DTYPE_BF16 : A;
        for (size_t i = 0; i < sizeof attn_prefill_cases / sizeof attn_prefill_cases[0]; i++) {
            attention_case(&attn_prefill_cases[i], C, C, 500 + i, 1, 0);
            teardown();
        }
        /* the small cases of attention_cases with it forced on (short runs and fallbacks) */
        for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++) {
            attention_case(&attn_cases[i], C, C, 600 + i, 1, 0);
            teardown();
        }
    }
}
END_TEST

/* Sliding windows (Mistral's, Qwen's): the decode kernels' splits over a window that starts
 * past 0 (not on a tile: keys below it masked), windows wider than every context, graph-mode
 * max_pos; the simple kernel (head dim 96) and the f32 flash kernel; the prefill kernel, forced
 * on and off, with a window shorter than the prompt, a chunk whose window starts inside the
 * cached prefix, prompts and decode tokens in one step, and a window of 1 (a token sees only
 * itself). */
static const struct {
    attn_case c;
    int window;
} attn_window_cases[] = {
    {{8, 4, 128, 16, 8, {3000, 0, 17, 64, 127, 128, 1000, 2047}, {1, 1, 1, 1, 1, 1, 1, 1}, 0, 0, 0}, 100},
    {{8, 4, 128, 16, 8, {3000, 0, 17, 64, 127, 128, 1000, 2047}, {1, 1, 1, 1, 1, 1, 1, 1}, 0, 131072, 0}, 1000},
    {{8, 4, 128, 16, 8, {3000, 0, 17, 64, 127, 128, 1000, 2047}, {1, 1, 1, 1, 1, 1, 1, 1}, 0, 0, 0}, 64},
    {{2, 4, 128, 16, 2, {3000, 40}, {1, 1}, 0, 0, 0}, 4096},
    {{1, 8, 64, 32, 4, {2500, 5, 700, 63}, {1, 1, 1, 1}, 0, 0, 0}, 333},
    {{2, 4, 128, 24, 3, {700, 40, 0}, {1, 1, 1}, 0, 0, 0}, 50},
    {{2, 4, 96, 16, 2, {1000, 10}, {1, 1}, 0, 0, 0}, 200},
    {{2, 4, 16, 8, 3, {500, 0, 33}, {1, 4, 1}, 1, 0, 0}, 7},
};
static const struct {
    attn_case c;
    int window;
} attn_window_prefill_cases[] = {
    {{8, 4, 128, 16, 1, {0}, {1000}, 0, 0, 1}, 256},
    {{8, 4, 64, 32, 1, {300}, {200}, 0, 0, 1}, 100},
    {{8, 4, 128, 16, 5, {0, 0, 0, 40, 500}, {70, 130, 64, 1, 1}, 0, 0, 1}, 50},
    {{2, 4, 128, 16, 2, {0, 40}, {100, 1}, 0, 0, 1}, 1},
    {{32, 1, 128, 16, 1, {0}, {257}, 0, 0, 1}, 65},
};

START_TEST(attention_window)
{
    FOR_EACH_GPU {
        const tp_dtype A = gb->act_dtype, C = A == TP_DTYPE_F32 ? TP_DTYPE_BF16 : A;
        for (size_t i = 0; i < sizeof attn_window_cases / sizeof attn_window_cases[0]; i++)
            for (int d = 0; d < 3; d++) {
                attention_case(&attn_window_cases[i].c, float_dtypes[d], A, 800 + 10 * i + d, 0,
                               attn_window_cases[i].window);
                teardown();
            }
        for (size_t i = 0; i < sizeof attn_window_prefill_cases / sizeof attn_window_prefill_cases[0]; i++) {
            attention_case(&attn_window_prefill_cases[i].c, C, C, 900 + i, 1, attn_window_prefill_cases[i].window);
            teardown();
        }
    }
}
END_TEST

/* Gemma 2's soft-capped scores in the fast kernels (each caps where it scales a score to the
 * log2 domain): the flash decode kernel's splits, GQA 1 to 16, head dims 8 to 256 and every
 * cache dtype (the tensor-core decode kernel at 64 and 128); the prefill kernel forced on and
 * off; a window with it. A cap of 0.7 bites (the scaled scores of these random rows spread
 * about ±0.33 and pass 1). */
START_TEST(attention_softcap)
{
    static const size_t long_ones[] = {0, 1, 2, 4, 5, 6, 7, 9, 13, 14, 16};
    static const size_t prefill_ones[] = {0, 1, 4, 6, 8};
    FOR_EACH_GPU {
        const tp_dtype A = gb->act_dtype, C = A == TP_DTYPE_F32 ? TP_DTYPE_BF16 : A;
        case_softcap = 0.7f;
        for (size_t k = 0; k < sizeof long_ones / sizeof long_ones[0]; k++) {
            ck_assert_uint_lt(long_ones[k], sizeof attn_long_cases / sizeof attn_long_cases[0]);
            attention_case(&attn_long_cases[long_ones[k]], float_dtypes[k % 3], A, 1000 + k, 0, 0);
            teardown();
        }
        for (size_t k = 0; k < sizeof prefill_ones / sizeof prefill_ones[0]; k++) {
            ck_assert_uint_lt(prefill_ones[k], sizeof attn_prefill_cases / sizeof attn_prefill_cases[0]);
            attention_case(&attn_prefill_cases[prefill_ones[k]], C, C, 1100 + k, 1, 0);
            teardown();
        }
        attention_case(&attn_window_cases[0].c, A, A, 1200, 0, attn_window_cases[0].window);
        teardown();
        attention_case(&attn_window_prefill_cases[2].c, C, C, 1201, 1, attn_window_prefill_cases[2].window);
        teardown();
        case_softcap = 50.0f; /* Gemma 2's own: it rarely bites, the results as without */
        attention_case(&attn_long_cases[1], A, A, 1202, 0, 0);
        teardown();
        case_softcap = 0;
    }
}
END_TEST

/* ---- the fused qk_rope_store ------------------------------------------------------------------ */

/* Whether two GPU buffers hold the same bytes. */
static int same_gpu_bytes(const void *a, const void *b, size_t bytes)
{
    return !memcmp(dev_bytes(gb, a, bytes), dev_bytes(gb, b, bytes), bytes);
}

/* A fused op's row of the table against the ops it replaces: bit-identical or not. */
static void bits_row(const char *op, const char *shape, int same)
{
    printf("  %-13s %-9s %-58s %s\n", op, tp_dtype_name(gb->act_dtype), shape, same ? "bit-identical  ok" : "DIFFERENT  FAIL");
    fflush(stdout);
}

/* Columns [c0, c0 + w) of an [n, cols] f32 matrix, as a dense [n, w] one. */
static float *cols_of(const float *m, int64_t n, int64_t cols, int64_t c0, int64_t w)
{
    float *out = host_alloc((size_t)(n * w) * sizeof(float) + 1);
    for (int64_t r = 0; r < n; r++) memcpy(out + r * w, m + r * cols + c0, (size_t)w * sizeof(float));
    return out;
}

/* q, k, v as forward.c passes them: columns of one qkv [n, (hq + 2 hk) hd] (inside wider
 * rows when pad > 0). Slots distinct, drawn from a cache with spare rows; about one token
 * in five padding (-1), the last one always when n > 1. Positions up to 99999 (0 and 99999
 * always); inv_freq of Llama 3.1's scaled rope, or random in [0, 1) when rnd_freq. The
 * caches start as random rows, the same on every side. Checked against the CPU: q and k in
 * place, v untouched, the cache rows written; on the GPU: every other cache row untouched,
 * and qkv and both caches bit for bit those of the unfused ops (head_rmsnorm x2, rope x2,
 * kv_store) on the same inputs. graph: the fused op is recorded and replayed as a graph. */
static void qk_rope_store_case(int hd, int hq, int hk, int n, int norm, tp_dtype wdt, tp_dtype cdt, int64_t pad,
                               int rnd_freq, int graph, uint64_t s)
{
    seed(s);
    const tp_dtype A = gb->act_dtype;
    const int64_t qw = (int64_t)hq * hd, kw = (int64_t)hk * hd, cols = qw + 2 * kw, half = hd / 2;
    const float eps = 1e-6f;

    /* qkv: on the CPU, and twice on the GPU (the fused op's, the unfused ops') */
    const size_t nv = (size_t)(n * (cols + pad));
    float *vals = host_alloc(nv * sizeof(float) + 1);
    for (size_t i = 0; i < nv; i++) vals[i] = uniform(-2.0f, 2.0f);
    pt qkv = pt_from(A, ACT, n, cols, pad, vals), ref = pt_from(A, ACT, n, cols, pad, vals);
    tp_tensor qc = tp_tensor_cols(&qkv.c, 0, qw), kc = tp_tensor_cols(&qkv.c, qw, kw);
    tp_tensor vc = tp_tensor_cols(&qkv.c, qw + kw, kw);
    tp_tensor qg = tp_tensor_cols(&qkv.g, 0, qw), kg = tp_tensor_cols(&qkv.g, qw, kw);
    tp_tensor vg = tp_tensor_cols(&qkv.g, qw + kw, kw);
    tp_tensor qr = tp_tensor_cols(&ref.g, 0, qw), kr = tp_tensor_cols(&ref.g, qw, kw);
    tp_tensor vr = tp_tensor_cols(&ref.g, qw + kw, kw);
    pt qn = pt_rand(wdt, WEIGHT, 1, hd, 0, 0.5f, 1.5f), kn = pt_rand(wdt, WEIGHT, 1, hd, 0, 0.5f, 1.5f);

    float *inv = host_alloc((size_t)half * sizeof(float) + 1);
    if (rnd_freq) {
        for (int64_t j = 0; j < half; j++) inv[j] = uniform(0.0f, 1.0f);
    } else {
        tp_model_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.head_dim = hd;
        cfg.rope_theta = 500000.0;
        cfg.rope_scaling.type = TP_ROPE_LLAMA3;
        cfg.rope_scaling.factor = 8.0;
        cfg.rope_scaling.low_freq_factor = 1.0;
        cfg.rope_scaling.high_freq_factor = 4.0;
        cfg.rope_scaling.original_max_position = 8192;
        tp_rope_inv_freq(&cfg, inv);
    }
    const float *ic = dev_copy(cpu, inv, (size_t)half * sizeof(float) + 1);
    const float *ig = dev_copy(gb, inv, (size_t)half * sizeof(float) + 1);

    /* positions and slots */
    const int bs = 16, n_blocks = (n + bs - 1) / bs + 2, n_slots = n_blocks * bs;
    int32_t *perm = host_alloc((size_t)n_slots * sizeof(int32_t));
    random_permutation(perm, n_slots);
    int32_t *pos = host_alloc((size_t)n * 4), *slot = host_alloc((size_t)n * 4), *written = host_alloc((size_t)n_slots * 4);
    for (int i = 0; i < n_slots; i++) written[i] = -1; /* the token stored at each cache row */
    for (int i = 0; i < n; i++) {
        pos[i] = i == 0 ? 0 : i == 1 ? 99999 : rand_int(4) == 0 ? rand_int(64) : rand_int(100000);
        slot[i] = (n > 1 && i == n - 1) || rand_int(5) == 0 ? -1 : perm[i];
        if (slot[i] >= 0) written[slot[i]] = i;
    }
    int32_t *pc, *pg, *sc, *sg;
    ints_both(pos, n, &pc, &pg);
    ints_both(slot, n, &sc, &sg);
    /* only pos and slot are the op's: seq and block_table stay NULL */
    tp_attn_batch bc = {n, NULL, pc, sc, NULL, 1, 100000, 0, 0, 0}, bg = {n, NULL, pg, sg, NULL, 1, 100000, 0, 0, 0};

    /* the caches: the same random rows on the CPU and in both GPU caches */
    const size_t ce = tp_dtype_size(cdt), cache_n = (size_t)n_slots * (size_t)kw, cache_bytes = cache_n * ce;
    unsigned char *init[2];
    for (int c = 0; c < 2; c++) {
        float *f = host_alloc(cache_n * sizeof(float) + 1);
        for (size_t e = 0; e < cache_n; e++) f[e] = uniform(-1.0f, 1.0f);
        init[c] = host_alloc(cache_bytes + 1);
        tp_convert(init[c], cdt, f, TP_DTYPE_F32, cache_n);
    }
    tp_kv_layer cc = {dev_copy(cpu, init[0], cache_bytes), dev_copy(cpu, init[1], cache_bytes), cdt, n_blocks, bs, hk, hd};
    tp_kv_layer cg = {dev_copy(gb, init[0], cache_bytes), dev_copy(gb, init[1], cache_bytes), cdt, n_blocks, bs, hk, hd};
    tp_kv_layer cr = {dev_copy(gb, init[0], cache_bytes), dev_copy(gb, init[1], cache_bytes), cdt, n_blocks, bs, hk, hd};

    /* the fused op on both backends (on the GPU, directly or as a replayed graph) */
    tp_error_clear();
    ck_assert_msg(cpu->ops->qk_rope_store(cpu, &qc, &kc, &vc, norm ? &qn.c : NULL, norm ? &kn.c : NULL, eps, hd, ic,
                                          &cc, &bc) == TP_OK, "cpu: %s", tp_error_message());
    if (graph) {
        void *gr = NULL;
        ck_assert_msg(gb->ops->graph_begin(gb) == TP_OK, "cuda graph_begin: %s", tp_error_message());
        tp_status st = gb->ops->qk_rope_store(gb, &qg, &kg, &vg, norm ? &qn.g : NULL, norm ? &kn.g : NULL, eps, hd,
                                              ig, &cg, &bg);
        ck_assert_msg(gb->ops->graph_end(gb, &gr) == TP_OK && st == TP_OK, "cuda graph: %s", tp_error_message());
        ck_assert_msg(gb->ops->graph_launch(gb, gr) == TP_OK, "cuda graph_launch: %s", tp_error_message());
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
        gb->ops->graph_free(gb, gr);
    } else {
        ck_assert_msg(gb->ops->qk_rope_store(gb, &qg, &kg, &vg, norm ? &qn.g : NULL, norm ? &kn.g : NULL, eps, hd,
                                             ig, &cg, &bg) == TP_OK, "cuda: %s", tp_error_message());
    }
    /* the unfused ops, as forward.c ran them before */
    if (norm) {
        ck_assert_msg(gb->ops->head_rmsnorm(gb, &qr, hd, &qn.g, eps) == TP_OK, "%s", tp_error_message());
        ck_assert_msg(gb->ops->head_rmsnorm(gb, &kr, hd, &kn.g, eps) == TP_OK, "%s", tp_error_message());
    }
    ck_assert_msg(gb->ops->rope(gb, &qr, hd, pg, ig) == TP_OK, "%s", tp_error_message());
    ck_assert_msg(gb->ops->rope(gb, &kr, hd, pg, ig) == TP_OK, "%s", tp_error_message());
    ck_assert_msg(gb->ops->kv_store(gb, &kr, &vr, &cr, &bg) == TP_OK, "%s", tp_error_message());

    char shape[96];
    snprintf(shape, sizeof shape, "hd %d hq %d hk %d n %d norm %s cache %s pad %lld %s%s", hd, hq, hk, n,
             norm ? dn(wdt) : "-", dn(cdt), (long long)pad, rnd_freq ? "rand" : "llama3", graph ? " graph" : "");

    /* q and k in place, v untouched: against the CPU */
    const float *g = pt_get(&qkv, 1), *c = pt_get(&qkv, 0);
    compare("qk_rope.q", shape, cols_of(g, n, cols, 0, qw), cols_of(c, n, cols, 0, qw), (size_t)(n * qw),
            ELEMENTWISE, A);
    compare("qk_rope.k", shape, cols_of(g, n, cols, qw, kw), cols_of(c, n, cols, qw, kw), (size_t)(n * kw),
            ELEMENTWISE, A);
    compare("qk_rope.v", shape, cols_of(g, n, cols, qw + kw, kw), cols_of(c, n, cols, qw + kw, kw),
            (size_t)(n * kw), EXACT, A);
    pt_guards("qk_rope_store qkv", &qkv);

    /* the caches: written rows against the CPU's, the others as they were */
    for (int kv = 0; kv < 2; kv++) {
        const unsigned char *gcache = dev_bytes(gb, kv ? cg.v : cg.k, cache_bytes);
        const unsigned char *ccache = dev_bytes(cpu, kv ? cc.v : cc.k, cache_bytes);
        float *gw = host_alloc((size_t)(n * kw) * sizeof(float) + 1), *cw = host_alloc((size_t)(n * kw) * sizeof(float) + 1);
        size_t rows = 0;
        const size_t row_bytes = (size_t)kw * ce;
        for (int r = 0; r < n_slots; r++) {
            const size_t at = (size_t)r * row_bytes;
            if (written[r] < 0) {
                ck_assert_msg(!memcmp(gcache + at, init[kv] + at, row_bytes), "qk_rope_store [%s]: %s cache row %d "
                              "(no token's slot) changed", shape, kv ? "V" : "K", r);
                continue;
            }
            tp_convert(gw + rows * kw, TP_DTYPE_F32, gcache + at, cdt, (size_t)kw);
            tp_convert(cw + rows * kw, TP_DTYPE_F32, ccache + at, cdt, (size_t)kw);
            rows++;
        }
        compare(kv ? "qk_rope.vc" : "qk_rope.kc", shape, gw, cw, rows * (size_t)kw, kv ? EXACT : ELEMENTWISE, cdt);
    }

    /* bit for bit the unfused CUDA ops */
    const int same_qkv = same_gpu_bytes(qkv.gwhole.data, ref.gwhole.data, nv * tp_dtype_size(A) + 1);
    const int same_k = same_gpu_bytes(cg.k, cr.k, cache_bytes), same_v = same_gpu_bytes(cg.v, cr.v, cache_bytes);
    const int same = same_qkv && same_k && same_v;
    bits_row("qk_rope.bits", shape, same);
    ck_assert_msg(same, "qk_rope_store [%s]: differs from head_rmsnorm + rope + kv_store on the GPU (qkv %s, "
                  "K cache %s, V cache %s)", shape, same_qkv ? "same" : "DIFFERENT", same_k ? "same" : "DIFFERENT",
                  same_v ? "same" : "DIFFERENT");
}

START_TEST(qk_rope_store_cases)
{
    static const int shapes[][4] = {/* hd, hq, hk, n */
                                    {8, 4, 2, 5},    {64, 8, 8, 17},  {128, 32, 8, 33}, {128, 8, 1, 3},
                                    {256, 8, 4, 9},  {130, 6, 2, 7},  {2, 3, 1, 4},     {64, 2, 2, 1},
                                    {128, 16, 4, 300}, {192, 4, 2, 5}, {128, 32, 8, 2100}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    FOR_EACH_GPU {
        for (int s = 0; s < n_shapes; s++)
            for (int norm = 0; norm < 2; norm++)
                qk_rope_store_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], norm,
                                   float_dtypes[(2 * s + norm) % 3], float_dtypes[(s + norm + gi_) % 3],
                                   (s + norm) % 2 ? 4 : 0, (s + norm + gi_) % 3 == 0,
                                   gb->ops->graph_begin && s == n_shapes - 1 && norm, 300 + 10 * (uint64_t)s + norm);
    }
}
END_TEST

/* ---- qk_rope_store and attention in one op --------------------------------------------------- */

typedef struct rope_attn_case {
    int kvh, ratio, hd, n;
    int hist[8]; /* token i is sequence i's new one, at position hist[i] (n > 8: random) */
    int pad_last, graph, bad_slot, bad_pos;
    int window;    /* the attention's sliding window, 0: none */
    float softcap; /* > 0: soft-capped scores (Gemma 2) */
} rope_attn_case;

static void force_decode_warps(int w);

/* A decode step's batch (token i of sequence i; earlier keys are the cache's random rows, the
 * rows the step stores NaN until it does, so that a read before the store shows): the
 * qk_rope_attention op against the CPU's qk_rope_store then attention, and on the GPU bit for
 * bit its own two ops run on copies of the same inputs (both caches, out; v untouched, q and k
 * unspecified), directly or (graph) recorded and replayed, with the decode kernel's warps
 * forced (warps 1, 2 or 4; 0 its choice). pad_last: the last token is padding (slot -1, as
 * graphs pad); bad_slot: token 0's slot is past the cache, a kv_store fault either way;
 * bad_pos: token 0's position is max_pos, an attention fault, its row stored all the same
 * (with either, no CPU side). Where the GPU's activations are 16-bit the fused kernel takes
 * the batch. */
static void qk_rope_attention_case(const rope_attn_case *c, int warps, uint64_t s)
{
    seed(s);
    const tp_dtype A = gb->act_dtype;
    const int kvh = c->kvh, hd = c->hd, qh = kvh * c->ratio, width = kvh * hd, bs = 16, n = c->n;
    const int64_t qw = (int64_t)qh * hd, cols = qw + 2 * (int64_t)width;
    int32_t *hist = host_alloc((size_t)n * 4);
    int max_blocks = 1, need = 0;
    for (int i = 0; i < n; i++) {
        hist[i] = n <= 8 ? c->hist[i] : rand_int(300);
        const int b = hist[i] / bs + 1;
        need += b;
        if (b > max_blocks) max_blocks = b;
    }
    const int n_blocks = need + 2, n_slots = n_blocks * bs;
    int32_t *perm = host_alloc((size_t)n_blocks * 4), *table = host_alloc((size_t)(n * max_blocks) * 4);
    random_permutation(perm, n_blocks);
    for (int i = 0, next = 0; i < n; i++)
        for (int lb = 0; lb < max_blocks; lb++) table[i * max_blocks + lb] = lb <= hist[i] / bs ? perm[next++] : -1;
    int32_t *seq = host_alloc((size_t)n * 4), *slot = host_alloc((size_t)n * 4);
    for (int i = 0; i < n; i++) {
        seq[i] = i;
        slot[i] = table[i * max_blocks + hist[i] / bs] * bs + hist[i] % bs;
    }
    if (c->pad_last) slot[n - 1] = -1;
    if (c->bad_slot) slot[0] = n_slots;
    int32_t *tc, *tg, *sc, *sg, *pc, *pg, *lc, *lg;
    ints_both(table, n * max_blocks, &tc, &tg);
    ints_both(seq, n, &sc, &sg);
    ints_both(hist, n, &pc, &pg);
    ints_both(slot, n, &lc, &lg);
    const int max_pos = c->bad_pos ? hist[0] : max_blocks * bs; /* a bound, as a graph's */
    tp_attn_batch bc = {n, sc, pc, lc, tc, max_blocks, max_pos, 1, c->window, c->softcap};
    tp_attn_batch bg = {n, sg, pg, lg, tg, max_blocks, max_pos, 1, c->window, c->softcap};

    /* the caches: the same random rows on the CPU and in both GPU caches */
    const tp_dtype cdt = A;
    const size_t cache_n = (size_t)n_slots * (size_t)width, cache_bytes = cache_n * tp_dtype_size(cdt);
    unsigned char *init[2];
    for (int kv = 0; kv < 2; kv++) {
        float *f = host_alloc(cache_n * sizeof(float) + 1);
        for (size_t e = 0; e < cache_n; e++) f[e] = uniform(-1.0f, 1.0f);
        init[kv] = host_alloc(cache_bytes + 1);
        tp_convert(init[kv], cdt, f, TP_DTYPE_F32, cache_n);
        for (int i = 0; i < n; i++) /* the rows this step stores: NaN bytes */
            if (slot[i] >= 0 && slot[i] < n_slots)
                memset(init[kv] + (size_t)slot[i] * width * tp_dtype_size(cdt), 0xff, (size_t)width * tp_dtype_size(cdt));
    }
    tp_kv_layer cc = {dev_copy(cpu, init[0], cache_bytes), dev_copy(cpu, init[1], cache_bytes), cdt, n_blocks, bs, kvh, hd};
    tp_kv_layer cg = {dev_copy(gb, init[0], cache_bytes), dev_copy(gb, init[1], cache_bytes), cdt, n_blocks, bs, kvh, hd};
    tp_kv_layer cr = {dev_copy(gb, init[0], cache_bytes), dev_copy(gb, init[1], cache_bytes), cdt, n_blocks, bs, kvh, hd};

    /* qkv (on the CPU and the fused op's GPU copy; the two ops' copy), Llama 3's frequencies */
    const size_t nv = (size_t)(n * (cols + 4));
    float *vals = host_alloc(nv * sizeof(float) + 1);
    for (size_t e = 0; e < nv; e++) vals[e] = uniform(-2.0f, 2.0f);
    pt qkv = pt_from(A, ACT, n, cols, 4, vals), ref = pt_from(A, ACT, n, cols, 4, vals);
    tp_tensor qc = tp_tensor_cols(&qkv.c, 0, qw), kc = tp_tensor_cols(&qkv.c, qw, width);
    tp_tensor vc = tp_tensor_cols(&qkv.c, qw + width, width), qg = tp_tensor_cols(&qkv.g, 0, qw);
    tp_tensor kg = tp_tensor_cols(&qkv.g, qw, width), vg = tp_tensor_cols(&qkv.g, qw + width, width);
    tp_tensor qr = tp_tensor_cols(&ref.g, 0, qw), kr = tp_tensor_cols(&ref.g, qw, width);
    tp_tensor vr = tp_tensor_cols(&ref.g, qw + width, width);
    float *inv = host_alloc((size_t)hd / 2 * sizeof(float) + 1);
    tp_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.head_dim = hd;
    cfg.rope_theta = 500000.0;
    tp_rope_inv_freq(&cfg, inv);
    const float *ic = dev_copy(cpu, inv, (size_t)hd / 2 * sizeof(float) + 1);
    const float *ig = dev_copy(gb, inv, (size_t)hd / 2 * sizeof(float) + 1);
    pt out = pt_poison(A, n, qw, 3), outr = pt_poison(A, n, qw, 3);
    const float scale = 1.0f / sqrtf((float)hd), eps = 1e-6f;

    char shape[160];
    int fused = 0;
#ifdef HAVE_CUDA
    fused = tp_cuda_attention_rope_fits(qg, kg, vg, cg, bg, qh);
#endif
    snprintf(shape, sizeof shape, "kvh %d gqa %d hd %d tokens %d%s%s%s%s warps %d%s window %d softcap %g", kvh,
             c->ratio, hd, n, c->pad_last ? " padded" : "", c->graph ? " graph" : "", c->bad_slot ? " bad slot" : "",
             c->bad_pos ? " bad pos" : "", warps, fused ? " fused" : " two ops", c->window, c->softcap);
    ck_assert_msg(fused == (A != TP_DTYPE_F32), "qk_rope_attention [%s]: the fused kernel %s the batch", shape,
                  fused ? "takes" : "does not take");

    /* the fused op (directly or as a replayed graph), then the two ops */
    force_decode_warps(warps);
    tp_error_clear();
    tp_status st;
    if (c->graph) {
        void *gr = NULL;
        ck_assert_msg(gb->ops->graph_begin(gb) == TP_OK, "cuda graph_begin: %s", tp_error_message());
        st = gb->ops->qk_rope_attention(gb, &qg, &kg, &vg, NULL, NULL, eps, hd, ig, &cg, &bg, qh, scale, &out.g);
        ck_assert_msg(gb->ops->graph_end(gb, &gr) == TP_OK && st == TP_OK, "cuda graph: %s", tp_error_message());
        st = gb->ops->graph_launch(gb, gr);
        ck_assert_msg(st == TP_OK, "cuda graph_launch: %s", tp_error_message());
        gb->ops->graph_free(gb, gr);
    } else {
        st = gb->ops->qk_rope_attention(gb, &qg, &kg, &vg, NULL, NULL, eps, hd, ig, &cg, &bg, qh, scale, &out.g);
    }
    if (c->bad_slot) {
        char needle[96];
        snprintf(needle, sizeof needle, "kv_store: token 0 has slot %d, past the cache's %d slots", n_slots, n_slots);
        EXPECT_DEVICE_FAULT(gb, st, needle);
        EXPECT_DEVICE_FAULT(gb, gb->ops->qk_rope_store(gb, &qr, &kr, &vr, NULL, NULL, eps, hd, ig, &cr, &bg), needle);
        ck_assert_msg(gb->ops->attention(gb, &qr, &cr, &bg, qh, scale, &outr.g) == TP_OK, "%s", tp_error_message());
    } else if (c->bad_pos) {
        char needle[96];
        snprintf(needle, sizeof needle, "attention: token 0 has position %d, outside [0, max_pos %d)", hist[0], max_pos);
        EXPECT_DEVICE_FAULT(gb, st, needle);
        ck_assert_msg(gb->ops->qk_rope_store(gb, &qr, &kr, &vr, NULL, NULL, eps, hd, ig, &cr, &bg) == TP_OK, "%s",
                      tp_error_message());
        EXPECT_DEVICE_FAULT(gb, gb->ops->attention(gb, &qr, &cr, &bg, qh, scale, &outr.g), needle);
    } else {
        ck_assert_msg(st == TP_OK, "cuda: %s", tp_error_message());
        ck_assert_msg(gb->ops->qk_rope_store(gb, &qr, &kr, &vr, NULL, NULL, eps, hd, ig, &cr, &bg) == TP_OK, "%s",
                      tp_error_message());
        ck_assert_msg(gb->ops->attention(gb, &qr, &cr, &bg, qh, scale, &outr.g) == TP_OK, "%s", tp_error_message());
        /* against the CPU: out, and q and k in place */
        ck_assert_msg(cpu->ops->qk_rope_store(cpu, &qc, &kc, &vc, NULL, NULL, eps, hd, ic, &cc, &bc) == TP_OK &&
                          cpu->ops->attention(cpu, &qc, &cc, &bc, qh, scale, &out.c) == TP_OK,
                      "cpu: %s", tp_error_message());
        compare("qk_rope_attn", shape, pt_get(&out, 1), pt_get(&out, 0), (size_t)(n * qw), REDUCTION, A);
        const float *g = pt_get(&qkv, 1), *h = pt_get(&qkv, 0);
        compare("qk_rope_attn.v", shape, cols_of(g, n, cols, qw + width, width), cols_of(h, n, cols, qw + width, width),
                (size_t)(n * width), EXACT, A);
    }
    force_decode_warps(0);
    ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
    pt_guards("qk_rope_attention out", &out);
    pt_guards("qk_rope_attention qkv", &qkv);

    /* bit for bit the two ops */
    const int same_k = same_gpu_bytes(cg.k, cr.k, cache_bytes), same_v = same_gpu_bytes(cg.v, cr.v, cache_bytes);
    const int same_out = same_gpu_bytes(out.gwhole.data, outr.gwhole.data, (size_t)(n * (qw + 3)) * tp_dtype_size(A) + 1);
    const int same = same_k && same_v && same_out;
    bits_row("qk_rope_attn.bits", shape, same);
    ck_assert_msg(same, "qk_rope_attention [%s]: differs from qk_rope_store + attention on the GPU (K cache %s, "
                  "V cache %s, out %s)", shape, same_k ? "same" : "DIFFERENT", same_v ? "same" : "DIFFERENT",
                  same_out ? "same" : "DIFFERENT");
}

START_TEST(qk_rope_attention_cases)
{
    static const rope_attn_case cases[] = {
        /* kvh, ratio, hd, n, hist, pad_last, graph, bad_slot, bad_pos, window, softcap */
        {8, 4, 128, 5, {0, 7, 40, 200, 15}, 1, 0, 0, 0, 0, 0},     /* Llama 3's heads; a first position; padding */
        {2, 2, 64, 3, {16, 31, 64}, 0, 0, 0, 0, 0, 0},             /* head_dim 64; a position starting a tile */
        {1, 16, 128, 4, {5, 100, 17, 48}, 0, 0, 0, 0, 0, 0},       /* 16 q heads a KV head */
        {2, 4, 128, 2, {300, 1000}, 0, 0, 0, 0, 0, 0},             /* few long items: splits */
        {4, 8, 64, 130, {0}, 0, 0, 0, 0, 0, 0},                    /* many items: no splits */
        {8, 4, 128, 5, {0, 7, 40, 200, 15}, 1, 1, 0, 0, 0, 0},     /* recorded as a graph */
        {2, 2, 64, 3, {16, 31, 64}, 0, 0, 1, 0, 0, 0},             /* a slot past the cache */
        {2, 2, 64, 3, {64, 31, 16}, 0, 0, 0, 1, 0, 0},             /* token 0 at max_pos */
        {8, 4, 128, 5, {0, 7, 40, 200, 15}, 1, 0, 0, 0, 30, 0},    /* sliding windows: one that starts past 0 */
        {2, 4, 128, 2, {300, 1000}, 0, 0, 0, 0, 129, 0},           /* ... splits over a window not on a tile */
        {8, 4, 128, 5, {0, 7, 40, 200, 15}, 1, 1, 0, 0, 8, 0},     /* ... recorded as a graph */
        {8, 4, 128, 5, {0, 7, 40, 200, 15}, 1, 0, 0, 0, 30, 0.7f}, /* soft-capped scores, a window */
        {2, 4, 128, 2, {300, 1000}, 0, 0, 0, 0, 0, 0.7f},          /* ... splits */
        {2, 2, 64, 3, {16, 31, 64}, 0, 1, 0, 0, 0, 0.7f},          /* ... head_dim 64, as a graph */
    };
    static const int warps[] = {0, 1, 2, 4};
    FOR_EACH_GPU {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (size_t w = 0; w < sizeof warps / sizeof warps[0]; w++)
                if (!cases[i].graph || gb->ops->graph_begin) qk_rope_attention_case(&cases[i], warps[w], 700 + i);
    }
}
END_TEST

/* ---- element-wise, gathers, conversions ------------------------------------------------------ */

START_TEST(swiglu_shapes)
{
    static const int64_t shapes[][2] = {{1, 1}, {3, 17}, {17, 64}, {2, 130}, {64, 1000}};
    FOR_EACH_GPU {
        seed(7);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t n = shapes[s][0], m = shapes[s][1];
            pt gu = pt_rand(gb->act_dtype, ACT, n, 2 * m, 3, -6.0f, 6.0f);
            pt out = pt_poison(gb->act_dtype, n, m, 2);
            tp_tensor gc = tp_tensor_cols(&gu.c, 0, m), uc = tp_tensor_cols(&gu.c, m, m);
            tp_tensor gg = tp_tensor_cols(&gu.g, 0, m), ug = tp_tensor_cols(&gu.g, m, m);
            RUN_BOTH(cpu->ops->swiglu(cpu, &gc, &uc, &out.c), gb->ops->swiglu(gb, &gg, &ug, &out.g));
            char shape[96];
            snprintf(shape, sizeof shape, "[%lld,%lld] gate|up views", (long long)n, (long long)m);
            compare("swiglu", shape, pt_get(&out, 1), pt_get(&out, 0), (size_t)(n * m), ELEMENTWISE, gb->act_dtype);
            pt_guards("swiglu out", &out);
            /* softcap (Gemma 2's logits) on the gate half, in place */
            pt caps = pt_rand(TP_DTYPE_F32, ACT, n, m, 4, -60.0f, 60.0f);
            RUN_BOTH(cpu->ops->softcap(cpu, &caps.c, 30.0f), gb->ops->softcap(gb, &caps.g, 30.0f));
            compare("softcap", shape, pt_get(&caps, 1), pt_get(&caps, 0), (size_t)(n * m), ELEMENTWISE, TP_DTYPE_F32);
            pt_guards("softcap x", &caps);
            /* geglu (Gemma's GeLU, tanh form): the same kernels, the other activation */
            pt gout = pt_poison(gb->act_dtype, n, m, 2);
            RUN_BOTH(cpu->ops->geglu(cpu, &gc, &uc, &gout.c), gb->ops->geglu(gb, &gg, &ug, &gout.g));
            compare("geglu", shape, pt_get(&gout, 1), pt_get(&gout, 0), (size_t)(n * m), ELEMENTWISE, gb->act_dtype);
            pt_guards("geglu out", &gout);
        }
    }
}
END_TEST

START_TEST(gather_rows_cases)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {17, 64, 3}, {130, 17, 130}, {5, 1000, 9}};
    FOR_EACH_GPU {
        seed(8);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int v = 0; v < 2; v++) {
                int64_t T = shapes[s][0], d = shapes[s][1];
                int32_t n = (int32_t)shapes[s][2];
                tp_dtype odt = v ? TP_DTYPE_F32 : gb->act_dtype;
                pt x = pt_rand(gb->act_dtype, ACT, T, d, 2 * v, -1, 1);
                pt out = pt_poison(odt, n, d, 3 * v);
                int32_t *rows = host_alloc((size_t)n * 4), *rc, *rg;
                for (int32_t i = 0; i < n; i++) rows[i] = rand_int((int)T);
                ints_both(rows, n, &rc, &rg);
                RUN_BOTH(cpu->ops->gather_rows(cpu, &x.c, rc, n, &out.c), gb->ops->gather_rows(gb, &x.g, rg, n, &out.g));
                char shape[96];
                snprintf(shape, sizeof shape, "%d of [%lld,%lld] out %s", n, (long long)T, (long long)d, dn(odt));
                compare("gather_rows", shape, pt_get(&out, 1), pt_get(&out, 0), (size_t)n * (size_t)d, ELEMENTWISE,
                        odt);
                pt_guards("gather_rows out", &out);
            }
    }
}
END_TEST

/* take_ids (a step's ids from the step before's device-chosen ones) and download_start /
 * download_wait (two slots, each waited for while later work is enqueued): the CPU's
 * semantics, then every GPU against them. */
static void take_ids_on(tp_backend *b, const int32_t *ids0, const int32_t *from, int32_t n_from, int32_t stride,
                        const int32_t *take, int32_t n, int32_t *got)
{
    size_t bn = (size_t)n * 4, bf = (size_t)n_from * (size_t)stride * 4;
    int32_t *ids = dev_copy(b, ids0, bn), *f = dev_copy(b, from, bf), *t = dev_copy(b, take, bn);
    int32_t *other = dev_alloc(b, bf);
    ck_assert_msg(b->ops->take_ids(b, ids, f, n_from, stride, t, n) == TP_OK, "%s take_ids: %s", b->name,
                  tp_error_message());
    ck_assert_int_eq(b->ops->download_start(b, 1, ids, bn), TP_OK);
    ck_assert_int_eq(b->ops->download_start(b, 0, f, bf), TP_OK);
    /* work after the copies: it must not show in what the slots hold */
    ck_assert_int_eq(b->ops->memset0(b, ids, bn), TP_OK);
    ck_assert_int_eq(b->ops->memset0(b, f, bf), TP_OK);
    ck_assert_int_eq(b->ops->upload(b, other, from, bf), TP_OK);
    int32_t *back = host_alloc(bf);
    ck_assert_msg(b->ops->download_wait(b, 0, back) == TP_OK, "%s download_wait: %s", b->name, tp_error_message());
    ck_assert_int_eq(memcmp(back, from, bf), 0);
    ck_assert_msg(b->ops->download_wait(b, 1, got) == TP_OK, "%s download_wait: %s", b->name, tp_error_message());
    ck_assert_int_eq(b->ops->synchronize(b), TP_OK);
} /* (the fixture frees what dev_alloc and host_alloc made) */

START_TEST(take_ids_cases)
{
    seed(9);
    /* n, rows before, stride (1: argmax's ids; the sample op's results' token fields) */
    const int32_t so = (int32_t)(sizeof(tp_sample_out) / 4);
    const int32_t sizes[][3] = {{1, 1, 1}, {5, 3, 1}, {128, 128, 1}, {300, 1000, 1}, {2000, 7, 1}, {128, 128, so}, {7, 3, so}};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        const int32_t n = sizes[c][0], n_from = sizes[c][1], stride = sizes[c][2];
        int32_t *ids = host_alloc((size_t)n * 4), *from = host_alloc((size_t)n_from * (size_t)stride * 4);
        int32_t *take = host_alloc((size_t)n * 4), *want = host_alloc((size_t)n * 4), *got = host_alloc((size_t)n * 4);
        for (int32_t i = 0; i < n_from * stride; i++) from[i] = 1000000 + rand_int(128256);
        for (int32_t i = 0; i < n; i++) {
            ids[i] = rand_int(50);
            take[i] = rand_int(3) == 0 ? -1 : rand_int(n_from);
            want[i] = take[i] >= 0 ? from[take[i] * stride] : ids[i];
        }
        take_ids_on(cpu, ids, from, n_from, stride, take, n, got);
        ck_assert_int_eq(memcmp(got, want, (size_t)n * 4), 0);
        FOR_EACH_GPU {
            memset(got, 0, (size_t)n * 4);
            take_ids_on(gb, ids, from, n_from, stride, take, n, got);
            for (int32_t i = 0; i < n; i++)
                ck_assert_msg(got[i] == want[i], "%s take_ids: %d of %d from %d (stride %d): id %d is %d, want %d",
                              gb->name, i, n, n_from, stride, i, got[i], want[i]);
        }
        printf("  %-13s %-9s %-58s ok\n", "take_ids", "i32", "");
    }
    /* a take past the ids of the step before: named, on the CPU at once */
    int32_t ids[2] = {0, 0}, from[3] = {7, 8, 9}, take[2] = {1, 3};
    ck_assert_int_eq(cpu->ops->take_ids(cpu, ids, from, 3, 1, take, 2), TP_ERR_INVALID_ARG);
    ck_assert_msg(strstr(tp_error_message(), "take[1] is 3, outside the 3 ids") != NULL, "%s", tp_error_message());
    tp_error_clear();
    ck_assert_int_eq(ids[0], 0); /* nothing taken */
}
END_TEST

/* Bit for bit tp_convert's: values over 40 binary orders of magnitude (f16 overflow and
 * subnormals, bf16 ties), and NaN and infinities. */
START_TEST(convert_cases)
{
    gb = gpus[0];
    seed(9);
    const int64_t rows = 37, cols = 301, pad = 3, n = rows * (cols + pad);
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++) {
            tp_dtype sdt = float_dtypes[s], ddt = float_dtypes[d];
            float *v = host_alloc((size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++) v[i] = uniform(-1.0f, 1.0f) * ldexpf(1.0f, rand_int(45) - 27);
            v[5] = NAN;
            v[6] = -INFINITY;
            v[7] = INFINITY;
            v[8] = -0.0f;
            pt src = pt_from(sdt, WEIGHT, rows, cols, pad, v);
            pt dst = pt_from(ddt, WEIGHT, rows, cols, pad, NULL);
            RUN_BOTH(cpu->ops->convert(cpu, &src.c, &dst.c), gb->ops->convert(gb, &src.g, &dst.g));
            size_t bytes = (size_t)n * tp_dtype_size(ddt) + 1;
            int same = !memcmp(dev_bytes(cpu, dst.cwhole.data, bytes), dev_bytes(gb, dst.gwhole.data, bytes), bytes);
            char shape[96];
            snprintf(shape, sizeof shape, "%s -> %s [%lld,%lld] view, NaN/Inf/subnormals", dn(sdt), dn(ddt),
                     (long long)rows, (long long)cols);
            printf("  %-13s %-9s %-58s %s\n", "convert", "-", shape, same ? "bit-identical  ok" : "DIFFERENT  FAIL");
            ck_assert_msg(same, "convert %s", shape);
        }
}
END_TEST

/* ---- greedy sampling ------------------------------------------------------------------------ */

/* Rows of [L, V] f32 logits in [lo, hi), each with its maximum tied at two columns (the
 * lower must win) and V / 50 entries of -inf; rows 0 and 3 place the tie across threads and
 * warps of a 1024-thread block (columns 1000 and 1027; 5 and 1029). When special: row 1
 * is all -inf and row 2 has +inf at two columns. CUDA against CPU: ids equal, logprobs
 * within 1e-5; then again without logprob. */
static void argmax_case(int64_t L, int64_t V, int64_t pad, float lo, float hi, int special)
{
    const int64_t width = V + pad, col0 = pad / 2;
    float *v = host_alloc((size_t)(L * width) * sizeof(float) + 1);
    for (int64_t i = 0; i < L * width; i++) v[i] = uniform(lo, hi);
    for (int64_t r = 0; r < L; r++) {
        float *x = v + r * width + col0;
        for (int64_t k = 0; k < V / 50; k++) x[rand_int((int)V)] = -INFINITY;
        if (V >= 2) {
            int64_t a = rand_int((int)V), b = rand_int((int)V - 1);
            if (b >= a) b++;
            if (r == 0 && V > 1027) a = 1000, b = 1027;
            if (r == 3 && V > 1029) a = 1029, b = 5;
            x[a] = x[b] = hi + 1.0f + (float)(r % 7);
        }
        if (special && r == 1)
            for (int64_t j = 0; j < V; j++) x[j] = -INFINITY;
        if (special && r == 2 && V >= 2) x[V - 1] = x[V / 2] = INFINITY;
    }
    pt x = pt_from(TP_DTYPE_F32, ACT, L, V, pad, v);
    const size_t bytes = (size_t)(L > 0 ? L : 1) * 4;
    unsigned char *poison = host_alloc(bytes);
    memset(poison, 0xff, bytes); /* ids -1, logprobs NaN */
    int32_t *ic = dev_copy(cpu, poison, bytes), *ig = dev_copy(gb, poison, bytes), *ig2 = dev_copy(gb, poison, bytes);
    float *lc = dev_copy(cpu, poison, bytes), *lg = dev_copy(gb, poison, bytes);
    float *vc = dev_copy(cpu, poison, bytes), *vg = dev_copy(gb, poison, bytes);
    int32_t *ig3 = dev_copy(gb, poison, bytes);
    float *vg3 = dev_copy(gb, poison, bytes);
    RUN_BOTH(cpu->ops->argmax(cpu, &x.c, ic, lc, vc), gb->ops->argmax(gb, &x.g, ig, lg, vg));
    /* without the logprob (a greedy step's call; over tp with the value) */
    ck_assert_msg(gb->ops->argmax(gb, &x.g, ig2, NULL, NULL) == TP_OK, "cuda: %s", tp_error_message());
    ck_assert_msg(gb->ops->argmax(gb, &x.g, ig3, NULL, vg3) == TP_OK, "cuda: %s", tp_error_message());
    const int32_t *hic = dev_bytes(cpu, ic, bytes), *hig = dev_bytes(gb, ig, bytes), *hig2 = dev_bytes(gb, ig2, bytes);
    const int32_t *hig3 = dev_bytes(gb, ig3, bytes);
    const float *hlc = dev_bytes(cpu, lc, bytes), *hlg = dev_bytes(gb, lg, bytes);
    const float *hvc = dev_bytes(cpu, vc, bytes), *hvg = dev_bytes(gb, vg, bytes), *hvg3 = dev_bytes(gb, vg3, bytes);
    /* and the row's first columns as a view from column 0 (rows that start 16-byte aligned
     * where the padded width allows: a vocabulary slice of V % 4 != 0 in a padded row) */
    const int32_t *hic0 = hic, *hig0 = hig3;
    const float *hvc0 = hvc, *hvg0 = hvg3;
    if (pad > 0) {
        tp_tensor xc0 = tp_tensor_cols(&x.cwhole, 0, V), xg0 = tp_tensor_cols(&x.gwhole, 0, V);
        int32_t *ic0 = dev_copy(cpu, poison, bytes), *ig0 = dev_copy(gb, poison, bytes);
        float *lc0 = dev_copy(cpu, poison, bytes), *vc0 = dev_copy(cpu, poison, bytes), *vg0 = dev_copy(gb, poison, bytes);
        RUN_BOTH(cpu->ops->argmax(cpu, &xc0, ic0, lc0, vc0), gb->ops->argmax(gb, &xg0, ig0, NULL, vg0));
        hic0 = dev_bytes(cpu, ic0, bytes), hig0 = dev_bytes(gb, ig0, bytes);
        hvc0 = dev_bytes(cpu, vc0, bytes), hvg0 = dev_bytes(gb, vg0, bytes);
    }
    int64_t bad_id = -1, bad_lp = -1;
    double err = 0.0;
    for (int64_t r = 0; r < L; r++) {
        if ((hig[r] != hic[r] || hig2[r] != hic[r] || hig3[r] != hic[r] || hvg[r] != hvc[r] || hvg3[r] != hvc[r] ||
             hig0[r] != hic0[r] || hvg0[r] != hvc0[r]) && bad_id < 0)
            bad_id = r;
        const double d = fabs((double)hlg[r] - (double)hlc[r]);
        if (!(d <= 1e-5) && bad_lp < 0) bad_lp = r; /* NaN fails */
        if (d > err) err = d;
    }
    char shape[96];
    snprintf(shape, sizeof shape, "[%lld,%lld]%s in [%g,%g)%s, ties, -inf", (long long)L, (long long)V,
             pad ? " view" : "", (double)lo, (double)hi, special ? ", inf rows" : "");
    const int ok = bad_id < 0 && bad_lp < 0;
    printf("  %-13s %-9s %-58s ids %s, logprob |err| %8.2e  bound 1e-05  %s\n", "argmax", tp_dtype_name(gb->act_dtype),
           shape, bad_id < 0 ? "equal" : "DIFFER", err, ok ? "ok" : "FAIL");
    fflush(stdout);
    if (bad_id >= 0)
        ck_abort_msg("argmax [%s] row %lld: cuda column %d (%d and %d without logprob; %d from column 0, cpu %d), "
                     "cpu %d", shape, (long long)bad_id, hig[bad_id], hig2[bad_id], hig3[bad_id], hig0[bad_id],
                     hic0[bad_id], hic[bad_id]);
    if (bad_lp >= 0)
        ck_abort_msg("argmax [%s] row %lld: cuda logprob %.9g, cpu %.9g", shape, (long long)bad_lp,
                     (double)hlg[bad_lp], (double)hlc[bad_lp]);
}

/* argmax_merge against tp_argmax_merge (the host's rule): 1 to 8 ranks, values with ties
 * between ranks (the lower rank wins), -inf and NaN (never a winner), n below L. */
START_TEST(argmax_merge_cases)
{
    static const int32_t cases[][3] = {{1, 4, 4}, {2, 128, 128}, {2, 130, 97}, {4, 256, 200}, {8, 33, 33}};
    FOR_EACH_GPU {
        seed(21);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const int n_tp = cases[c][0];
            const int32_t L = cases[c][1], n = cases[c][2];
            const int64_t vocab_pad = 64128;
            int32_t *pairs = host_alloc((size_t)n_tp * 2 * (size_t)L * 4), *want = host_alloc((size_t)n * 4);
            int32_t *got = host_alloc((size_t)n * 4);
            for (int r = 0; r < n_tp; r++)
                for (int32_t i = 0; i < L; i++) {
                    int32_t *pr = pairs + (size_t)r * 2 * (size_t)L;
                    pr[i] = rand_int((int)vocab_pad);
                    const int k = rand_int(8);
                    float v = k == 0 ? 1.5f : k == 1 ? -INFINITY : k == 2 ? NAN : (float)rand_int(1000) / 7.0f;
                    memcpy(&pr[L + i], &v, 4); /* k == 0: ties between ranks */
                }
            tp_argmax_merge(pairs, n_tp, L, n, vocab_pad, want);
            int32_t *dp = dev_copy(gb, pairs, (size_t)n_tp * 2 * (size_t)L * 4), *dids = dev_alloc(gb, (size_t)n * 4);
            ck_assert_msg(gb->ops->argmax_merge(gb, dp, n_tp, L, n, vocab_pad, dids) == TP_OK, "%s", tp_error_message());
            ck_assert_int_eq(gb->ops->download(gb, got, dids, (size_t)n * 4), TP_OK);
            ck_assert_msg(gb->ops->synchronize(gb) == TP_OK, "%s", tp_error_message());
            for (int32_t i = 0; i < n; i++)
                ck_assert_msg(got[i] == want[i], "argmax_merge %d ranks, row %d of %d: %d, want %d", n_tp, i, n, got[i],
                              want[i]);
            printf("  %-13s %-9s %-58s ok\n", "argmax_merge", "i32", "");
        }
    }
}
END_TEST

START_TEST(argmax_cases)
{
    static const int64_t shapes[][3] = {{1, 1, 0},         {3, 1, 2},      {4, 7, 3},       {5, 1000, 0},
                                        {7, 1025, 5},      {2, 152064, 0}, {3, 152064, 64}, {4, 262144, 1},
                                        {3000, 33, 0},     {1000, 1031, 0}, {64, 32768, 3},
                                        {3, 1030, 2},      {2, 152063, 1},  {1, 1031, 0}};
    FOR_EACH_GPU {
        seed(12);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            argmax_case(shapes[s][0], shapes[s][1], shapes[s][2], -20.0f, 20.0f, 0);
            argmax_case(shapes[s][0], shapes[s][1], shapes[s][2], 990.0f, 1000.0f, 1);
        }
        argmax_case(0, 5, 0, -1.0f, 1.0f, 0);
    }
}
END_TEST

/* ---- sampling on the device ------------------------------------------------------------------ */

/* The rows, tokens and results of one sample call, on both backends. */
typedef struct sample_io {
    tp_sample_row *rows;
    int32_t *toks, n_toks;
    tp_sample_out *oc, *og; /* results on each backend */
    tp_sample_out *hc, *hg; /* and on the host, after run */
} sample_io;

static tp_sample_row sample_row_plain(uint64_t s)
{
    tp_sample_row row;
    memset(&row, 0, sizeof row);
    row.temperature = 1.0;
    row.top_p = 1.0;
    row.repetition_penalty = 1.0;
    row.seed = 0x5eedULL + s * 7919ULL;
    return row;
}

/* Row r's rule: greedy, temperature 0.7/1.0/1.3, top-k 1/5/50/V, top-p 0.1/0.9/0.999,
 * min-p 0.05, penalties over prompt and output tokens that repeat, banned ids among the
 * likely winners, logprobs 0/1/5/20, cycling with different periods so that they mix. */
static tp_sample_row sample_rule_of(int r, int32_t V, int32_t *toks, int32_t *n_toks)
{
    tp_sample_row row = sample_row_plain((uint64_t)r);
    row.step = (uint64_t)r * 3u;
    row.temperature = (double[]){0.0, 0.7, 1.0, 1.3, 1.0}[r % 5];
    row.top_k = (int32_t[]){0, 5, 0, 50, -1, 1, 0, V, 0}[r % 9];
    row.top_p = (double[]){1.0, 0.9, 1.0, 0.1, 0.999, 1.0, 0.9}[r % 7];
    row.min_p = r % 4 == 2 ? 0.05 : 0.0;
    row.repetition_penalty = r % 3 == 1 ? 1.3 : r % 11 == 4 ? 0.8 : 1.0;
    row.presence_penalty = r % 5 == 3 ? 0.5 : 0.0;
    row.frequency_penalty = r % 6 == 1 ? 0.7 : r % 6 == 4 ? -0.4 : 0.0;
    row.n_logprobs = r % 8 == 6 ? -1 : (int32_t[]){0, 1, 5, 20}[r % 4]; /* -1: none wanted */
    row.tokens = *n_toks;
    row.n_prompt = 5 + r % 9;
    row.n_output = r % 6;
    for (int32_t k = 0; k < row.n_prompt + row.n_output; k++)
        toks[(*n_toks)++] = k % 2 ? rand_int(V) : rand_int(V < 16 ? V : 16); /* repeats */
    row.banned = *n_toks;
    row.n_banned = r % 4 == 3 ? 3 : 0;
    for (int32_t k = 0; k < row.n_banned; k++) toks[(*n_toks)++] = rand_int(V);
    row.allowed = *n_toks; /* repeats allowed, as a request's list may hold them */
    row.n_allowed = r % 7 == 5 ? 40 : r % 13 == 8 ? 1 : 0;
    for (int32_t k = 0; k < row.n_allowed; k++) toks[(*n_toks)++] = rand_int(V);
    row.bias = *n_toks; /* distinct ids, then their biases' bits: some lift a token to the top */
    row.n_bias = r % 5 == 1 ? (V < 6 ? V : 6) : 0;
    for (int32_t k = 0; k < row.n_bias; k++) toks[row.bias + k] = (int32_t)(((int64_t)r * 131 + (int64_t)k * 7) % V);
    for (int32_t k = 0; k < row.n_bias; k++) {
        const float b = k == 0 ? 100.0f : k == 1 ? -100.0f : uniform(-12.0f, 12.0f);
        memcpy(&toks[row.bias + row.n_bias + k], &b, sizeof b);
    }
    *n_toks += 2 * row.n_bias;
    return row;
}

static void sample_upload(sample_io *io, int32_t L, const tp_sample_row *rows, const int32_t *toks, int32_t n_toks,
                          const tp_sample_row **rc, const tp_sample_row **rg, const int32_t **tc, const int32_t **tg)
{
    const size_t rb = (size_t)(L > 0 ? L : 1) * sizeof(tp_sample_row), ob = (size_t)(L > 0 ? L : 1) * sizeof(tp_sample_out);
    *rc = dev_copy(cpu, rows, rb);
    *rg = dev_copy(gb, rows, rb);
    int32_t *c, *g;
    ints_both(toks, n_toks, &c, &g);
    *tc = c;
    *tg = g;
    unsigned char *poison = host_alloc(ob);
    memset(poison, 0xff, ob);
    io->oc = dev_copy(cpu, poison, ob);
    io->og = dev_copy(gb, poison, ob);
}

/* |a - b|, 0 for equal values (the -inf logprobs of impossible tokens included), NaN for NaN */
static double lp_diff(float a, float b)
{
    return a == b ? 0.0 : fabs((double)a - (double)b);
}

/* Both backends' results agree: tokens, top ids, counts equal; logprobs within 1e-5. */
static void sample_compare(const char *shape, int32_t L, const tp_sample_out *hc, const tp_sample_out *hg,
                           const tp_sample_row *rows)
{
    int32_t bad = -1;
    double err = 0.0;
    for (int32_t r = 0; r < L; r++) {
        int same = hc[r].token == hg[r].token && hc[r].n_top == hg[r].n_top;
        /* a failed row: NaN on both */
        double d = isnan(hc[r].logprob) && isnan(hg[r].logprob) ? 0.0 : lp_diff(hc[r].logprob, hg[r].logprob);
        for (int32_t k = 0; same && k < hc[r].n_top; k++) {
            same = hc[r].top_id[k] == hg[r].top_id[k];
            const double e = lp_diff(hc[r].top_logprob[k], hg[r].top_logprob[k]);
            if (!(e <= d)) d = e; /* NaN propagates */
        }
        if (!(d <= 1e-5)) same = 0;
        if (d > err) err = d;
        if (!same && bad < 0) bad = r;
    }
    printf("  %-13s %-9s %-58s tokens %s, logprob |err| %8.2e  bound 1e-05  %s\n", "sample",
           tp_dtype_name(gb->act_dtype), shape, bad < 0 ? "equal" : "DIFFER", err, bad < 0 ? "ok" : "FAIL");
    fflush(stdout);
    if (bad >= 0) {
        const tp_sample_row *w = &rows[bad];
        ck_abort_msg("sample [%s] row %d (T %g, top_k %d, top_p %g, min_p %g, rep %g, pres %g, freq %g, n_logprobs %d, "
                     "banned %d, allowed %d, biased %d): cuda token %d (n_top %d, logprob %.9g), cpu %d (n_top %d, logprob %.9g)",
                     shape, bad, w->temperature, w->top_k, w->top_p, w->min_p, w->repetition_penalty,
                     w->presence_penalty, w->frequency_penalty, w->n_logprobs, w->n_banned, w->n_allowed, w->n_bias, hg[bad].token,
                     hg[bad].n_top, (double)hg[bad].logprob, hc[bad].token, hc[bad].n_top, (double)hc[bad].logprob);
    }
}

/* Whether a row's allowed list (none: every token) holds id and its banned list does not. */
static int sample_row_admits(const tp_sample_row *row, const int32_t *toks, int32_t id)
{
    int allowed = row->n_allowed == 0;
    for (int32_t k = 0; k < row->n_allowed; k++) allowed |= toks[row->allowed + k] == id;
    for (int32_t k = 0; k < row->n_banned; k++) allowed &= toks[row->banned + k] != id;
    return allowed;
}

/* L rows of [L, V] logits in a [L, V + pad] matrix: kind 0 uniform in [-10, 10), 1 quantised
 * to 5 values (ties everywhere), 2 uniform with 20 tokens well above the rest, 3 uniform with
 * a quarter of the values f32's extremes (+-3e38, +-0, subnormals, -1e30); row 1 all -inf
 * and row 2 one finite value when L >= 3. Each row's rule from sample_rule_of (row offset
 * rule0, so the cases cover different rules). */
static void sample_case(int32_t L, int32_t V, int32_t pad, int kind, int rule0)
{
    const int64_t width = V + pad, col0 = pad / 2;
    float *v = host_alloc((size_t)(L * width) * sizeof(float) + 1);
    /* kind 3: for the range of cuda/sample.cu's spread bins (its first select level) */
    static const float extremes[] = {3e38f, -3e38f, 0.0f, -0.0f, 1e-40f, -1e-40f, -1e30f};
    for (int64_t i = 0; i < L * width; i++)
        v[i] = kind == 1                    ? (float)rand_int(5) * 0.75f - 2.0f
               : kind == 3 && rand_int(4) == 0 ? extremes[rand_int(7)]
                                               : uniform(-10.0f, 10.0f);
    for (int32_t r = 0; r < L; r++) {
        float *x = v + r * width + col0;
        if (kind == 2)
            for (int k = 0; k < 20; k++) x[rand_int(V)] = uniform(12.0f, 16.0f);
        if (L >= 3 && r == 1)
            for (int32_t j = 0; j < V; j++) x[j] = -INFINITY;
        if (L >= 3 && r == 2) {
            for (int32_t j = 0; j < V; j++) x[j] = -INFINITY;
            x[V / 3] = 0.5f;
        }
    }
    pt x = pt_from(TP_DTYPE_F32, ACT, L, V, pad, v);
    int32_t *toks = host_alloc((size_t)L * 96 * sizeof(int32_t) + 4), n_toks = 0;
    tp_sample_row *rows = host_alloc((size_t)L * sizeof *rows);
    for (int32_t r = 0; r < L; r++) rows[r] = sample_rule_of(r + rule0, V, toks, &n_toks);
    sample_io io;
    const tp_sample_row *rc, *rg;
    const int32_t *tc, *tg;
    sample_upload(&io, L, rows, toks, n_toks, &rc, &rg, &tc, &tg);
    RUN_BOTH(cpu->ops->sample(cpu, &x.c, L, rc, tc, io.oc), gb->ops->sample(gb, &x.g, L, rg, tg, io.og));
    const size_t ob = (size_t)L * sizeof(tp_sample_out);
    const tp_sample_out *hc = dev_bytes(cpu, io.oc, ob), *hg = dev_bytes(gb, io.og, ob);
    char shape[96];
    snprintf(shape, sizeof shape, "[%d,%d]%s %s, rules from %d", (int)L, (int)V, pad ? " view" : "",
             kind == 0 ? "uniform" : kind == 1 ? "5 values (ties)" : "20 peaks", rule0);
    sample_compare(shape, L, hc, hg, rows);
    if (L >= 3) {
        ck_assert_int_eq(hg[1].token, 0); /* all -inf: token 0, as the sampler */
        /* one finite value: that token, unless the row's allowed list leaves it out or it is
         * banned (then nothing is live: token 0) */
        ck_assert_int_eq(hg[2].token, sample_row_admits(&rows[2], toks, V / 3) ? V / 3 : 0);
    }
}

START_TEST(sample_cases)
{
    static const int32_t vocabs[] = {1000, 32000, 128256, 151936};
    /* on 132 SMs: a row to a cluster of 8 blocks, of 8, of 4, of 2 (cuda/sample.cu's teams) */
    static const int32_t lens[] = {1, 3, 20, 37};
    gb = gpus[0]; /* the op reads f32 logits whatever the activations: one backend is enough */
    {
        seed(31);
        int rule0 = 0;
        for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int kind = 0; kind < 4; kind++) {
                    sample_case(lens[li], vocabs[vi], li == 3 ? 5 : 0, kind, rule0);
                    rule0 += lens[li];
                }
        /* more rows than blocks: a block's flags serve several rows, cleared in between */
        sample_case(300, 1000, 3, 0, 7);
        sample_case(300, 1000, 0, 1, 11);
        sample_case(1, 1, 0, 0, 0);
        sample_case(2, 2, 1, 1, 5);
    }
}
END_TEST

/* 2000 draws (steps 0..1999 of one stream) from one distribution over V = 5000: 10 tokens
 * carrying most of the mass and a tail; the counts of the 10 and of the tail against the
 * probabilities (chi-square, 10 degrees of freedom, bound 45: far past the 1e-5 quantile),
 * and every draw the CPU's. rule: 0 temperature 1 alone, 1 temperature 0.8 with top-p 0.9. */
static void sample_draws(int rule)
{
    enum { N = 2000, V = 5000, HEAVY = 10 };
    float *row = host_alloc(V * sizeof(float));
    for (int j = 0; j < V; j++) row[j] = uniform(-6.0f, 0.0f);
    int heavy[HEAVY];
    for (int k = 0; k < HEAVY; k++) {
        heavy[k] = 100 + 397 * k;
        row[heavy[k]] = 6.0f + 0.35f * (float)k;
    }
    float *v = host_alloc((size_t)N * V * sizeof(float));
    for (int r = 0; r < N; r++) memcpy(v + (size_t)r * V, row, V * sizeof(float));
    pt x = pt_from(TP_DTYPE_F32, ACT, N, V, 0, v);
    tp_sample_row *rows = host_alloc(N * sizeof *rows);
    for (int r = 0; r < N; r++) {
        rows[r] = sample_row_plain(42);
        rows[r].step = (uint64_t)r;
        if (rule == 1) {
            rows[r].temperature = 0.8;
            rows[r].top_p = 0.9;
        }
    }
    sample_io io;
    const tp_sample_row *rc, *rg;
    const int32_t *tc, *tg;
    sample_upload(&io, N, rows, NULL, 0, &rc, &rg, &tc, &tg);
    RUN_BOTH(cpu->ops->sample(cpu, &x.c, N, rc, tc, io.oc), gb->ops->sample(gb, &x.g, N, rg, tg, io.og));
    const tp_sample_out *hc = dev_bytes(cpu, io.oc, N * sizeof(tp_sample_out));
    const tp_sample_out *hg = dev_bytes(gb, io.og, N * sizeof(tp_sample_out));
    /* the probabilities, in double, from the rule */
    const double T = rule == 1 ? 0.8 : 1.0;
    double *w = host_alloc(V * sizeof(double)), z = 0.0, mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = fmax(mx, row[j]);
    for (int j = 0; j < V; j++) z += w[j] = exp(((double)row[j] - mx) / T);
    if (rule == 1) { /* top-p 0.9: the heavy ones in rank order until 0.9 of the mass */
        double acc = 0.0, nz = 0.0;
        int keep[HEAVY], nk = 0;
        for (int k = HEAVY - 1; k >= 0 && acc < 0.9 * z; k--) {
            acc += w[heavy[k]];
            keep[nk++] = heavy[k];
        }
        ck_assert_msg(acc >= 0.9 * z, "the top-p cut falls in the tail: pick other logits");
        for (int k = 0; k < nk; k++) nz += w[keep[k]];
        for (int j = 0; j < V; j++) {
            int kept = 0;
            for (int k = 0; k < nk; k++) kept |= keep[k] == j;
            if (!kept) w[j] = 0.0;
        }
        z = nz;
    }
    double p[HEAVY + 1], chi = 0.0;
    int count[HEAVY + 1] = {0}, same = 0;
    p[HEAVY] = 1.0;
    for (int k = 0; k < HEAVY; k++) {
        p[k] = w[heavy[k]] / z;
        p[HEAVY] -= p[k];
    }
    for (int r = 0; r < N; r++) {
        int c = HEAVY;
        for (int k = 0; k < HEAVY; k++)
            if (hg[r].token == heavy[k]) c = k;
        count[c]++;
        same += hg[r].token == hc[r].token;
    }
    for (int c = 0; c <= HEAVY; c++) {
        const double e = p[c] * N;
        if (e > 0.0) chi += ((double)count[c] - e) * ((double)count[c] - e) / e;
        else ck_assert_msg(count[c] == 0, "category %d has probability 0 but %d draws", c, count[c]);
    }
    char shape[96];
    snprintf(shape, sizeof shape, "%d draws, V %d, %s: chi2 %.1f (10 dof)", N, V,
             rule ? "T 0.8, top-p 0.9" : "T 1", chi);
    const int ok = chi < 45.0 && same == N;
    printf("  %-13s %-9s %-58s same as cpu %d/%d  %s\n", "sample", "-", shape, same, N, ok ? "ok" : "FAIL");
    fflush(stdout);
    ck_assert_msg(chi < 45.0, "sample draws: chi-square %g over 11 categories", chi);
    ck_assert_msg(same == N, "sample draws: %d of %d differ from the cpu's", N - same, N);
}

START_TEST(sample_draw_frequencies)
{
    gb = gpus[0];
    seed(32);
    sample_draws(0);
    sample_draws(1);
}
END_TEST

/* Faults: NaN in row 1 (lowest at column 9), a banned NaN that does not count, +Inf, a
 * penalty token outside the vocabulary, a parameter out of range, a NaN bias; each names its row at
 * synchronize, once, and the other rows are the CPU's. */
START_TEST(sample_faults)
{
    gb = gpus[0];
    seed(33);
    enum { L = 3, V = 2000 };
    float *lv = host_alloc(L * V * sizeof(float));
    for (int i = 0; i < L * V; i++) lv[i] = uniform(-5.0f, 5.0f);
    lv[V + 1500] = NAN;
    lv[V + 9] = NAN;
    lv[V + 4] = NAN; /* banned below */
    tp_sample_row rows[L];
    for (int r = 0; r < L; r++) {
        rows[r] = sample_row_plain((uint64_t)r);
        rows[r].n_logprobs = 3;
    }
    int32_t toks[6] = {4, 7, 7, 5000, 3, 0x7fc00000 /* a NaN bias for token 3 */};
    rows[1].banned = 0;
    rows[1].n_banned = 1;
    rows[2].repetition_penalty = 1.5;
    rows[2].tokens = 1;
    rows[2].n_prompt = 2;
    struct {
        int what;
        const char *needle;
    } cases[] = {{0, "sample: row 1 of logits has NaN at column 9"},
                 {1, "sample: row 2 has a penalty, banned, allowed or logit_bias token 5000 outside the vocabulary [0, 2000)"},
                 {2, "sample: row 0 has a sampling parameter outside its range"},
                 {3, "sample: row 1 of logits has +Inf at column 1500"},
                 {4, "sample: row 0 has a sampling parameter outside its range"},
                 {5, "sample: row 0 has a sampling parameter outside its range"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tp_sample_row rr[L];
        memcpy(rr, rows, sizeof rr);
        if (cases[c].what == 1) {
            lv[V + 1500] = lv[V + 9] = 0.0f;
            rr[2].n_prompt = 3;
        }
        if (cases[c].what == 2) rr[0].top_p = 1.5;
        if (cases[c].what == 3) lv[V + 1500] = INFINITY;
        if (cases[c].what == 4) {
            lv[V + 1500] = 0.0f;
            rr[0].bias = 4;
            rr[0].n_bias = 1;
        }
        if (cases[c].what == 5) rr[0].n_logprobs = -2; /* -1 is "none wanted"; below it, nothing */
        pt l2 = pt_from(TP_DTYPE_F32, ACT, L, V, 0, lv);
        sample_io io;
        const tp_sample_row *rc, *rg;
        const int32_t *tc, *tg;
        sample_upload(&io, L, rr, toks, 6, &rc, &rg, &tc, &tg);
        /* NaN/+Inf logits: the model's numbers, not an argument (TP_ERR_NUMERIC) */
        const tp_status want = cases[c].what == 0 || cases[c].what == 3 ? TP_ERR_NUMERIC : TP_ERR_INVALID_ARG;
        EXPECT_STATUS(cpu->ops->sample(cpu, &l2.c, L, rc, tc, io.oc), want, cases[c].what == 1 ? "sample: row 2: prompt token 5000" :
                      cases[c].what == 2 ? "sample: row 0: top_p 1.5" :
                      cases[c].what == 4 ? "sample: row 0: the logit_bias of token 3 is not finite"
                      : cases[c].what == 5 ? "sample: row 0: n_logprobs -2 is outside [-1, 20]"
                                           : cases[c].needle);
        ck_assert_int_eq(gb->ops->sample(gb, &l2.g, L, rg, tg, io.og), TP_OK);
        tp_error_clear();
        ck_assert_int_eq(gb->ops->synchronize(gb), want);
        ck_assert_msg(strstr(tp_error_message(), cases[c].needle), "message \"%s\" lacks \"%s\"", tp_error_message(),
                      cases[c].needle);
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
        const tp_sample_out *hc = dev_bytes(cpu, io.oc, sizeof(tp_sample_out) * L);
        const tp_sample_out *hg = dev_bytes(gb, io.og, sizeof(tp_sample_out) * L);
        sample_compare(cases[c].needle, L, hc, hg, rr); /* the failed row too: token -1 or the column, NaN */
    }
    printf("  %-13s %-9s %-58s ok\n", "device faults", "-", "sample: NaN, +Inf, token, parameters");
}
END_TEST

/* ---- argument errors, and faults only the GPU sees ------------------------------------------ */

START_TEST(bad_shapes)
{
    FOR_EACH_GPU {
        seed(10);
        const tp_dtype A = gb->act_dtype;
        pt x = pt_rand(A, ACT, 4, 64, 0, -1, 1), w = pt_rand(TP_DTYPE_BF16, WEIGHT, 8, 128, 0, -1, 1);
        pt w64 = pt_rand(TP_DTYPE_BF16, WEIGHT, 8, 64, 0, -1, 1), y = pt_poison(A, 4, 8, 0);
        pt y5 = pt_poison(A, 4, 5, 0), bias9 = pt_rand(TP_DTYPE_F32, WEIGHT, 1, 9, 0, -1, 1);
        EXPECT_INVALID(gb->ops->matmul(gb, &x.g, &w.g, NULL, &y.g), "matmul: x has 64 columns but w has 128");
        EXPECT_INVALID(gb->ops->matmul(gb, &x.g, &w64.g, NULL, &y5.g), "matmul: y is [4, 5], expected [4, 8]");
        EXPECT_INVALID(gb->ops->matmul(gb, &x.g, &w64.g, &bias9.g, &y.g), "matmul: bias is [1, 9]");
        EXPECT_INVALID(gb->ops->matmul(gb, NULL, &w64.g, NULL, &y.g), "matmul: x is NULL");
        tp_tensor bad = x.g;
        bad.stride = 10;
        EXPECT_INVALID(gb->ops->matmul(gb, &bad, &w64.g, NULL, &y.g), "matmul: x has stride 10");
        bad = w64.g;
        bad.dtype = TP_DTYPE_I32;
        EXPECT_INVALID(gb->ops->matmul(gb, &x.g, &bad, NULL, &y.g), "matmul: w is int32");

        pt r = pt_rand(TP_DTYPE_F32, ACT, 3, 16, 0, -1, 1), r16 = pt_rand(A, ACT, 3, 16, 0, -1, 1);
        pt w8 = pt_rand(TP_DTYPE_F32, WEIGHT, 1, 8, 0, -1, 1), w16 = pt_rand(TP_DTYPE_F32, WEIGHT, 1, 16, 0, -1, 1);
        EXPECT_INVALID(gb->ops->add_rmsnorm(gb, &r.g, NULL, &w8.g, 1e-5f, &r16.g), "add_rmsnorm: weight is [1, 8]");
        if (A != TP_DTYPE_F32)
            EXPECT_INVALID(gb->ops->add_rmsnorm(gb, &r16.g, NULL, &w16.g, 1e-5f, &r16.g), "residual stream is float32");
        EXPECT_INVALID(gb->ops->head_rmsnorm(gb, &r16.g, 5, &w8.g, 1e-5f), "head_rmsnorm: x has 16 columns");
        EXPECT_INVALID(gb->ops->rope(gb, &r16.g, 3, (const int32_t *)w8.g.data, (const float *)w8.g.data), "rope: head_dim 3");
        EXPECT_INVALID(gb->ops->rope(gb, &r16.g, 8, NULL, (const float *)w8.g.data), "rope");
        EXPECT_INVALID(gb->ops->swiglu(gb, &r16.g, &y5.g, &r16.g), "swiglu: up is [4, 5]");
        EXPECT_INVALID(gb->ops->geglu(gb, &r16.g, &y5.g, &r16.g), "geglu: up is [4, 5]");
        EXPECT_INVALID(gb->ops->gather_rows(gb, &r16.g, NULL, 2, &y.g), "gather_rows: out is [4, 8]");
        EXPECT_INVALID(gb->ops->convert(gb, &r16.g, &y.g), "convert: dst is [4, 8]");

        const int kvh = 2, hd = 8, bsz = 4, nb = 3, width = kvh * hd;
        tp_kv_layer cache = {dev_alloc(gb, nb * bsz * width * 4), dev_alloc(gb, nb * bsz * width * 4), TP_DTYPE_F32,
                             nb, bsz, kvh, hd};
        pt k = pt_rand(A, ACT, 2, width, 0, -1, 1), k15 = pt_rand(A, ACT, 2, width - 1, 0, -1, 1);
        pt q = pt_rand(A, ACT, 2, 4 * hd, 0, -1, 1), q3 = pt_rand(A, ACT, 2, 3 * hd, 0, -1, 1);
        int32_t hb[2] = {0, 0}, *dseq = dev_copy(gb, hb, sizeof hb);
        tp_attn_batch b2 = {2, dseq, dseq, dseq, dseq, 1, 8, 0, 0, 0};
        EXPECT_INVALID(gb->ops->kv_store(gb, &k15.g, &k.g, &cache, &b2), "kv_store: k is [2, 15], expected [2, 16]");
        tp_kv_layer badc = cache;
        badc.block_size = 0;
        EXPECT_INVALID(gb->ops->kv_store(gb, &k.g, &k.g, &badc, &b2), "kv_store: cache has");
        EXPECT_INVALID(gb->ops->attention(gb, &q3.g, &cache, &b2, 3, 0.3f, &q3.g), "attention: 3 q heads");
        EXPECT_INVALID(gb->ops->attention(gb, &q3.g, &cache, &b2, 4, 0.3f, &q.g), "attention: q is [2, 24], expected [2, 32]");
        tp_attn_batch bnull = b2;
        bnull.block_table = NULL;
        EXPECT_INVALID(gb->ops->attention(gb, &q.g, &cache, &bnull, 4, 0.3f, &q.g), "NULL seq, pos or block_table");
        EXPECT_INVALID(gb->ops->attention(gb, &q.g, &cache, NULL, 4, 0.3f, &q.g), "attention: batch is NULL");
        /* qk_rope_store: the checks of head_rmsnorm, rope and kv_store, under its name */
        pt fqkv = pt_rand(A, ACT, 2, 4 * hd + 2 * width, 0, -1, 1), k8 = pt_rand(A, ACT, 2, hd, 0, -1, 1);
        pt n5 = pt_rand(TP_DTYPE_F32, WEIGHT, 1, 5, 0, -1, 1);
        tp_tensor fq = tp_tensor_cols(&fqkv.g, 0, 4 * hd), fk = tp_tensor_cols(&fqkv.g, 4 * hd, width);
        tp_tensor fv = tp_tensor_cols(&fqkv.g, 4 * hd + width, width);
        const float *finv = (const float *)w8.g.data;
        tp_attn_batch bslot = b2;
        bslot.slot = NULL;
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &fk, &fv, NULL, NULL, 1e-6f, hd, finv, &cache, NULL),
                       "qk_rope_store: batch is NULL");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &fk, &fv, NULL, NULL, 1e-6f, hd, finv, &badc, &b2),
                       "qk_rope_store: cache has");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, NULL, &fk, &fv, NULL, NULL, 1e-6f, hd, finv, &cache, &b2),
                       "qk_rope_store: q is NULL");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &fk, &fv, NULL, NULL, 1e-6f, 3, finv, &cache, &b2),
                       "qk_rope_store: head_dim 3 must be even");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &k8.g, &fv, NULL, NULL, 1e-6f, hd, finv, &cache, &b2),
                       "qk_rope_store: k is [2, 8], expected [2, 16]");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &fk, &k8.g, NULL, NULL, 1e-6f, hd, finv, &cache, &b2),
                       "qk_rope_store: v is [2, 8], expected [2, 16]");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &fk, &fv, &w8.g, NULL, 1e-6f, hd, finv, &cache, &b2),
                       "qk_rope_store: q_norm without k_norm");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &fk, &fv, &w8.g, &n5.g, 1e-6f, hd, finv, &cache, &b2),
                       "qk_rope_store: k_norm is [1, 5], expected [1, 8]");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &fk, &fv, &w8.g, &w8.g, 1e-6f, hd, NULL, &cache, &b2),
                       "qk_rope_store: inv_freq is NULL");
        EXPECT_INVALID(gb->ops->qk_rope_store(gb, &fq, &fk, &fv, NULL, NULL, 1e-6f, hd, finv, &cache, &bslot),
                       "qk_rope_store: batch has a NULL pos or slot");
        if (A != TP_DTYPE_F32) { /* q, k, v of one qkv share its dtype; the kernel relies on it */
            pt v32 = pt_rand(TP_DTYPE_F32, ACT, 2, width, 0, -1, 1);
            tp_error_clear();
            ck_assert_int_eq(gb->ops->qk_rope_store(gb, &fq, &fk, &v32.g, NULL, NULL, 1e-6f, hd, finv, &cache, &b2),
                             TP_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(tp_error_message(), "qk_rope_store: q, k and v are"), "%s", tp_error_message());
        }
        EXPECT_INVALID(gb->ops->argmax(gb, &w64.g, (int32_t *)y.g.data, NULL, NULL), "argmax: logits is bfloat16");
        EXPECT_INVALID(gb->ops->argmax(gb, &r.g, NULL, NULL, NULL), "argmax: ids is NULL");
        bad = r.g;
        bad.cols = 0;
        EXPECT_INVALID(gb->ops->argmax(gb, &bad, (int32_t *)y.g.data, NULL, NULL), "argmax: logits has 3 rows but no columns");
        EXPECT_INVALID(gb->ops->argmax(gb, NULL, (int32_t *)y.g.data, NULL, NULL), "argmax: logits is NULL");
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK); /* nothing was enqueued by the refusals */
        printf("  %-13s %-9s %-58s ok\n", "bad shapes", tp_dtype_name(A), "TP_ERR_INVALID_ARG, the CPU backend's messages");
    }
}
END_TEST

/* Indices in device memory are checked by the kernels: the operation returns TP_OK, the
 * bad entry reads or writes nothing out of bounds, and synchronize reports it once. */
START_TEST(device_faults)
{
    FOR_EACH_GPU {
        seed(11);
        const tp_dtype A = gb->act_dtype;
        /* gather_rows */
        pt x = pt_rand(A, ACT, 3, 16, 0, -1, 1), out = pt_poison(A, 2, 16, 0);
        int32_t rows[2] = {0, 7};
        int32_t *drows = dev_copy(gb, rows, sizeof rows);
        EXPECT_DEVICE_FAULT(gb, gb->ops->gather_rows(gb, &x.g, drows, 2, &out.g),
                            "gather_rows: rows[1] is 7, outside x's 3 rows");
        float *got = pt_get(&out, 1);
        for (int j = 0; j < 16; j++) ck_assert(got[16 + j] == 0.0f && !isnan(got[j]));

        /* take_ids past the step before's ids: reported by synchronize, and by download_wait
         * (which a step enqueued ahead waits on) */
        int32_t ids[2] = {4, 5}, from[3] = {7, 8, 9}, take[2] = {1, 3};
        int32_t *dids = dev_copy(gb, ids, sizeof ids), *dfrom = dev_copy(gb, from, sizeof from);
        int32_t *dtake = dev_copy(gb, take, sizeof take);
        EXPECT_DEVICE_FAULT(gb, gb->ops->take_ids(gb, dids, dfrom, 3, 1, dtake, 2),
                            "take_ids: take[1] is 3, outside the 3 ids of the step before");
        ck_assert_int_eq(gb->ops->take_ids(gb, dids, dfrom, 3, 1, dtake, 2), TP_OK);
        ck_assert_int_eq(gb->ops->download_start(gb, 0, dids, sizeof ids), TP_OK);
        int32_t back[2] = {0, 0};
        ck_assert_int_eq(gb->ops->download_wait(gb, 0, back), TP_ERR_INVALID_ARG);
        ck_assert_msg(strstr(tp_error_message(), "take_ids: take[1] is 3") != NULL, "%s", tp_error_message());
        tp_error_clear();
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK); /* reported once */

        /* kv_store past the cache */
        const int kvh = 1, hd = 8, bsz = 4, nb = 2, width = kvh * hd;
        const size_t cb = (size_t)nb * bsz * width * 4;
        tp_kv_layer cache = {dev_alloc(gb, cb), dev_alloc(gb, cb), TP_DTYPE_F32, nb, bsz, kvh, hd};
        ck_assert_int_eq(gb->ops->memset0(gb, cache.k, cb), TP_OK);
        ck_assert_int_eq(gb->ops->memset0(gb, cache.v, cb), TP_OK);
        pt k = pt_rand(A, ACT, 2, width, 0, -1, 1);
        int32_t seq[2] = {0, 0}, pos[2] = {0, 1}, slot[2] = {1, nb * bsz}, table[2] = {1, 0};
        int32_t *dseq = dev_copy(gb, seq, 8), *dpos = dev_copy(gb, pos, 8), *dslot = dev_copy(gb, slot, 8);
        int32_t *dtable = dev_copy(gb, table, 8);
        tp_attn_batch ab = {2, dseq, dpos, dslot, dtable, 2, 8, 0, 0, 0};
        EXPECT_DEVICE_FAULT(gb, gb->ops->kv_store(gb, &k.g, &k.g, &cache, &ab),
                            "kv_store: token 1 has slot 8, past the cache's 8 slots");

        /* qk_rope_store with the same slots: kv_store's fault; q and k still normed and rotated
         * in place (as the CPU's composition leaves them), and token 0 stored at slot 1 */
        pt fqkv = pt_rand(A, ACT, 2, 4 * hd, 0, -1, 1), fw = pt_rand(TP_DTYPE_BF16, WEIGHT, 1, hd, 0, 0.5f, 1.5f);
        tp_tensor fqg = tp_tensor_cols(&fqkv.g, 0, 2 * hd), fkg = tp_tensor_cols(&fqkv.g, 2 * hd, hd);
        tp_tensor fvg = tp_tensor_cols(&fqkv.g, 3 * hd, hd), fqc = tp_tensor_cols(&fqkv.c, 0, 2 * hd);
        tp_tensor fkc = tp_tensor_cols(&fqkv.c, 2 * hd, hd), fvc = tp_tensor_cols(&fqkv.c, 3 * hd, hd);
        const float finv[4] = {1.0f, 0.3f, 0.1f, 0.01f};
        const float *fic = dev_copy(cpu, finv, sizeof finv), *fig = dev_copy(gb, finv, sizeof finv);
        tp_kv_layer ccache = {dev_alloc(cpu, cb), dev_alloc(cpu, cb), TP_DTYPE_F32, nb, bsz, kvh, hd};
        tp_attn_batch cab = {2, NULL, dev_copy(cpu, pos, 8), dev_copy(cpu, slot, 8), NULL, 2, 8, 0, 0, 0};
        EXPECT_INVALID(cpu->ops->qk_rope_store(cpu, &fqc, &fkc, &fvc, &fw.c, &fw.c, 1e-6f, hd, fic, &ccache, &cab),
                       "kv_store: token 1 has slot 8");
        ck_assert_int_eq(gb->ops->qk_rope_store(gb, &fqg, &fkg, &fvg, &fw.g, &fw.g, 1e-6f, hd, fig, &cache, &ab), TP_OK);
        tp_error_clear();
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_ERR_INVALID_ARG);
        ck_assert_msg(strstr(tp_error_message(), "kv_store: token 1 has slot 8, past the cache's 8 slots"), "%s",
                      tp_error_message());
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
        const float *fgot = pt_get(&fqkv, 1);
        compare("qk_rope_store", "slot past the cache: q, k, v in place", fgot, pt_get(&fqkv, 0), 2 * 4 * hd,
                ELEMENTWISE, A);
        const float *kcache = dev_bytes(gb, cache.k, cb), *vcache = dev_bytes(gb, cache.v, cb);
        for (int j = 0; j < hd; j++)
            ck_assert(kcache[hd + j] == fgot[2 * hd + j] && vcache[hd + j] == fgot[3 * hd + j]);

        /* attention: a physical block outside the cache; a position past max_pos */
        pt q = pt_rand(A, ACT, 2, 2 * hd, 0, -1, 1), o = pt_poison(A, 2, 2 * hd, 0);
        int32_t bad_table[2] = {1, 99};
        int32_t pos5[2] = {0, 5};
        tp_attn_batch bb = ab;
        bb.block_table = dev_copy(gb, bad_table, 8);
        bb.pos = dev_copy(gb, pos5, 8);
        ck_assert_int_eq(gb->ops->attention(gb, &q.g, &cache, &bb, 2, 0.3f, &o.g), TP_OK);
        tp_error_clear();
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_ERR_INVALID_ARG);
        ck_assert_msg(strstr(tp_error_message(), "physical block 99, outside the cache's 2"), "%s", tp_error_message());
        got = pt_get(&o, 1);
        for (int j = 0; j < 2 * hd; j++) ck_assert(!isnan(got[j]) && got[2 * hd + j] == 0.0f);
        bb = ab;
        bb.max_pos = 1;
        EXPECT_DEVICE_FAULT(gb, gb->ops->attention(gb, &q.g, &cache, &bb, 2, 0.3f, &o.g),
                            "token 1 has position 1, outside [0, max_pos 1)");

        /* argmax: NaN in row 1 (its lowest at column 9); the other rows are still answered */
        float lv[3 * 2000];
        for (int i = 0; i < 3 * 2000; i++) lv[i] = uniform(-5.0f, 5.0f);
        lv[2000 + 1500] = NAN;
        lv[2000 + 9] = NAN;
        lv[2000 + 1033] = NAN;
        pt lg = pt_from(TP_DTYPE_F32, ACT, 3, 2000, 0, lv);
        int32_t *aid = dev_alloc(gb, 3 * sizeof(int32_t)), *cid = dev_alloc(cpu, 3 * sizeof(int32_t));
        float *alp = dev_alloc(gb, 3 * sizeof(float)), *clp = dev_alloc(cpu, 3 * sizeof(float));
        EXPECT_NUMERIC(cpu->ops->argmax(cpu, &lg.c, cid, clp, NULL), "argmax: row 1 of logits has NaN at column 9");
        EXPECT_DEVICE_NUMERIC(gb, gb->ops->argmax(gb, &lg.g, aid, alp, NULL), "argmax: row 1 of logits has NaN at column 9");
        const int32_t *hid = dev_bytes(gb, aid, 3 * sizeof(int32_t));
        const int32_t *hcid = dev_bytes(cpu, cid, 3 * sizeof(int32_t));
        const float *hlp = dev_bytes(gb, alp, 3 * sizeof(float)), *hclp = dev_bytes(cpu, clp, 3 * sizeof(float));
        ck_assert(hid[0] == hcid[0] && hid[2] == hcid[2] && hid[1] == 9 && hcid[1] == 9);
        ck_assert(fabsf(hlp[0] - hclp[0]) <= 1e-5f && fabsf(hlp[2] - hclp[2]) <= 1e-5f && isnan(hlp[1]));
        /* the same without the logprob (a greedy step's kernel), with the value */
        float *aval = dev_alloc(gb, 3 * sizeof(float));
        EXPECT_DEVICE_NUMERIC(gb, gb->ops->argmax(gb, &lg.g, aid, NULL, aval), "argmax: row 1 of logits has NaN at column 9");
        hid = dev_bytes(gb, aid, 3 * sizeof(int32_t));
        const float *hval = dev_bytes(gb, aval, 3 * sizeof(float));
        ck_assert(hid[0] == hcid[0] && hid[2] == hcid[2] && hid[1] == 9 && isnan(hval[1]));
        printf("  %-13s %-9s %-58s ok\n", "device faults", tp_dtype_name(A),
               "gather row, cache slot, block, position, argmax NaN");
    }
}
END_TEST

static void force_simple_attention(int on)
{
#ifdef HAVE_CUDA
    tp_cuda_attention_force_simple(on);
#else
    (void)on;
#endif
}

static void force_decode_warps(int w)
{
#ifdef HAVE_CUDA
    tp_cuda_attention_force_warps(w);
#else
    (void)w;
#endif
}

/* Attention's device-side faults, on a batch of a long context (split over many blocks)
 * and a short one (written directly): kind 0 a bad block in the long one's table, 1 a
 * negative sequence, 2 a position past max_pos, 3 a position past the table's columns, 4
 * a bad block in the short one's table, 5 a bad first block in the long one's (met before
 * the decode kernel's wait: the batch is a decode step's, one_per_seq, but for kind 1).
 * synchronize reports it naming the token, that token's output is zeros, the other's is
 * the CPU's. simple: the fallback kernel forced. warps: the tensor-core decode kernel's
 * warps forced (0: chosen): one warp reads a 16-key tile from one block-table entry (tile in
 * block), two and four per key (their tiles span blocks). */
static void attention_fault_case(int hd, int simple, int warps, int kind)
{
    const tp_dtype A = gb->act_dtype;
    const int kvh = 2, qh = 8, bs = 16, width = kvh * hd, long_pos = 2000, short_pos = 5;
    const int max_blocks = long_pos / bs + 2, n_blocks = max_blocks + 3; /* 127 columns, 130 blocks */
    const float scale = 1.0f / sqrtf((float)hd);
    pt kcache = pt_rand(A, WEIGHT, (int64_t)n_blocks * bs, width, 0, -1, 1);
    pt vcache = pt_rand(A, WEIGHT, (int64_t)n_blocks * bs, width, 0, -1, 1);
    tp_kv_layer kc = {kcache.cwhole.data, vcache.cwhole.data, A, n_blocks, bs, kvh, hd};
    tp_kv_layer kg = {kcache.gwhole.data, vcache.gwhole.data, A, n_blocks, bs, kvh, hd};
    int32_t perm[130], table[2 * 127], seq[2] = {0, 1}, pos[2] = {long_pos, short_pos}, slot[2] = {-1, -1};
    random_permutation(perm, n_blocks);
    for (int lb = 0; lb < max_blocks; lb++) {
        table[lb] = lb <= long_pos / bs ? perm[lb] : -1;
        table[max_blocks + lb] = lb == 0 ? perm[max_blocks - 1] : -1;
    }
    int32_t *sc, *sg, *pc, *pg, *tc, *tg, *lc, *lg;
    ints_both(seq, 2, &sc, &sg);
    ints_both(pos, 2, &pc, &pg);
    ints_both(slot, 2, &lc, &lg);
    ints_both(table, 2 * max_blocks, &tc, &tg);
    pt q = pt_rand(A, ACT, 2, qh * hd, 3, -2, 2), ref = pt_poison(A, 2, qh * hd, 0);
    tp_attn_batch bc = {2, sc, pc, lc, tc, max_blocks, long_pos + 1, 0, 0, 0};
    ck_assert_msg(cpu->ops->attention(cpu, &q.c, &kc, &bc, qh, scale, &ref.c) == TP_OK, "%s", tp_error_message());
    const float *want = pt_get(&ref, 0);

    int bad_tok = 0, bmax_pos = long_pos + 1;
    char needle[160];
    switch (kind) {
    case 0:
        table[70] = 99999;
        snprintf(needle, sizeof needle, "attention: token 0 maps a logical block to physical block 99999, "
                 "outside the cache's %d", n_blocks);
        break;
    case 1:
        seq[0] = -1;
        snprintf(needle, sizeof needle, "attention: token 0 has sequence -1");
        break;
    case 2:
        bmax_pos = 1500;
        snprintf(needle, sizeof needle, "attention: token 0 has position 2000, outside [0, max_pos 1500)");
        break;
    case 3:
        pos[0] = max_blocks * bs;
        bmax_pos = 4096;
        snprintf(needle, sizeof needle, "attention: token 0 at position %d needs a logical block past the block "
                 "table's %d columns", max_blocks * bs, max_blocks);
        break;
    case 4:
        table[max_blocks] = -5;
        bad_tok = 1;
        snprintf(needle, sizeof needle, "attention: token 1 maps a logical block to physical block -5, "
                 "outside the cache's %d", n_blocks);
        break;
    default: /* the first block: in the tiles a decode step's kernel asks for before its wait */
        table[0] = 99999;
        snprintf(needle, sizeof needle, "attention: token 0 maps a logical block to physical block 99999, "
                 "outside the cache's %d", n_blocks);
        break;
    }
    /* a decode layout (token i of sequence i) but for kind 1 */
    tp_attn_batch bg = {2, dev_copy(gb, seq, sizeof seq), dev_copy(gb, pos, sizeof pos), lg,
                        dev_copy(gb, table, sizeof table), max_blocks, bmax_pos, kind != 1, 0, 0};
    pt out = pt_poison(A, 2, qh * hd, 3);
    force_simple_attention(simple);
    force_decode_warps(warps);
    const tp_status st = gb->ops->attention(gb, &q.g, &kg, &bg, qh, scale, &out.g);
    force_decode_warps(0);
    force_simple_attention(0);
    EXPECT_DEVICE_FAULT(gb, st, needle);
    const float *got = pt_get(&out, 1);
    const int good = 1 - bad_tok, row = qh * hd;
    for (int j = 0; j < row; j++)
        ck_assert_msg(got[bad_tok * row + j] == 0.0f,
                      "attention fault %d (hd %d%s, warps %d): token %d element %d is %g, not 0", kind, hd,
                      simple ? ", simple" : "", warps, bad_tok, j, (double)got[bad_tok * row + j]);
    char shape[96];
    snprintf(shape, sizeof shape, "fault %d: token %d zeros, token %d right (hd %d%s, warps %d)", kind, bad_tok,
             good, hd, simple ? ", simple" : "", warps);
    compare("attention", shape, got + good * row, want + good * row, (size_t)row, REDUCTION, A);
    pt_guards("attention out (fault)", &out);
}

/* The same on a 256-token prompt, with the prefill kernel forced on (prefill) or off: kind 0
 * a bad block at positions 48..63, so every token from position 48 on is zeros (the block in
 * the prefill kernel's first key tile, looked up before its loop), 3 the same at 160..175 (in
 * its third, looked up inside the loop); 1 token 40 has sequence -1, 2 token 100 a position
 * past max_pos: that token is zeros, the runs on either side are still the prefill kernel's
 * (at least 16 tokens of a tile) and right. The bad block's token is whichever read it
 * first: the message is checked without it. */
static void attention_prefill_fault_case(int kind, int prefill)
{
    const tp_dtype A = gb->act_dtype, C = A == TP_DTYPE_F32 ? TP_DTYPE_BF16 : A; /* a 16-bit cache */
    enum { N = 256, BS = 16, MAX_BLOCKS = N / BS + 1, N_BLOCKS = MAX_BLOCKS + 3 };
    const int kvh = 2, qh = 8, hd = 128, width = kvh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    pt kcache = pt_rand(C, WEIGHT, (int64_t)N_BLOCKS * BS, width, 0, -1, 1);
    pt vcache = pt_rand(C, WEIGHT, (int64_t)N_BLOCKS * BS, width, 0, -1, 1);
    tp_kv_layer kc = {kcache.cwhole.data, vcache.cwhole.data, C, N_BLOCKS, BS, kvh, hd};
    tp_kv_layer kg = {kcache.gwhole.data, vcache.gwhole.data, C, N_BLOCKS, BS, kvh, hd};
    int32_t perm[N_BLOCKS], table[MAX_BLOCKS], seq[N], pos[N], slot[N];
    random_permutation(perm, N_BLOCKS);
    for (int lb = 0; lb < MAX_BLOCKS; lb++) table[lb] = lb < N / BS ? perm[lb] : -1;
    for (int i = 0; i < N; i++) seq[i] = 0, pos[i] = i, slot[i] = -1;
    int32_t *sc, *sg, *pc, *pg, *tc, *tg, *lc, *lg;
    ints_both(seq, N, &sc, &sg);
    ints_both(pos, N, &pc, &pg);
    ints_both(slot, N, &lc, &lg);
    ints_both(table, MAX_BLOCKS, &tc, &tg);
    pt q = pt_rand(C, ACT, N, qh * hd, 3, -2, 2), ref = pt_poison(C, N, qh * hd, 0);
    tp_attn_batch bc = {N, sc, pc, lc, tc, MAX_BLOCKS, N, 0, 0, 0};
    ck_assert_msg(cpu->ops->attention(cpu, &q.c, &kc, &bc, qh, scale, &ref.c) == TP_OK, "%s", tp_error_message());
    const float *want = pt_get(&ref, 0);

    int z0, z1, max_pos = N; /* tokens z0 .. z1 - 1 are zeros */
    char needle[160];
    switch (kind) {
    case 0:
    case 3:
        table[kind == 0 ? 3 : 10] = 99999;
        z0 = (kind == 0 ? 3 : 10) * BS, z1 = N;
        snprintf(needle, sizeof needle, "maps a logical block to physical block 99999, outside the cache's %d",
                 N_BLOCKS);
        break;
    case 1:
        seq[40] = -1;
        z0 = 40, z1 = 41;
        snprintf(needle, sizeof needle, "attention: token 40 has sequence -1");
        break;
    default:
        pos[100] = 5000;
        max_pos = 4096;
        z0 = 100, z1 = 101;
        snprintf(needle, sizeof needle, "attention: token 100 has position 5000, outside [0, max_pos 4096)");
        break;
    }
    tp_attn_batch bg = {N, dev_copy(gb, seq, sizeof seq), dev_copy(gb, pos, sizeof pos), lg,
                        dev_copy(gb, table, sizeof table), MAX_BLOCKS, max_pos, 0, 0, 0};
    pt out = pt_poison(C, N, qh * hd, 3);
    force_prefill_attention(prefill);
    const tp_status st = gb->ops->attention(gb, &q.g, &kg, &bg, qh, scale, &out.g);
    force_prefill_attention(-1);
    EXPECT_DEVICE_FAULT(gb, st, needle);
    const float *got = pt_get(&out, 1);
    const int row = qh * hd;
    for (int t = z0; t < z1; t++)
        for (int j = 0; j < row; j++)
            ck_assert_msg(got[t * row + j] == 0.0f, "prefill fault %d (prefill %s): token %d element %d is %g, not 0",
                          kind, prefill ? "on" : "off", t, j, (double)got[t * row + j]);
    char shape[96];
    snprintf(shape, sizeof shape, "prefill fault %d: tokens %d..%d zeros, prefill %s, before", kind, z0, z1 - 1,
             prefill ? "on" : "off");
    compare("attention", shape, got, want, (size_t)(z0 * row), REDUCTION, C);
    if (z1 < N) {
        snprintf(shape, sizeof shape, "prefill fault %d: tokens %d..%d zeros, prefill %s, after", kind, z0, z1 - 1,
                 prefill ? "on" : "off");
        compare("attention", shape, got + z1 * row, want + z1 * row, (size_t)((N - z1) * row), REDUCTION, C);
    }
    pt_guards("attention out (prefill fault)", &out);
}

START_TEST(attention_prefill_faults)
{
    FOR_EACH_GPU {
        seed(17);
        for (int prefill = 1; prefill >= 0; prefill--)
            for (int kind = 0; kind < 4; kind++) attention_prefill_fault_case(kind, prefill);
    }
}
END_TEST

START_TEST(attention_faults)
{
    FOR_EACH_GPU {
        seed(13);
        /* tensor cores (head dim 128) with the warps chosen, 1 and 2 forced; simple forced; simple (head dim 96) */
        for (int path = 0; path < 5; path++)
            for (int kind = 0; kind < 6; kind++)
                attention_fault_case(path == 4 ? 96 : 128, path == 3, path < 3 ? path : 0, kind);
    }
}
END_TEST

/* ---- the NCCL comm on one rank (the multi-rank test runs under mpirun elsewhere) ------------ */

#ifdef HAVE_NCCL
/* A bootstrap comm of one rank: broadcast and barrier have nothing to do. */
static tp_status self_noop(void) { return TP_OK; }
static tp_status self_all_reduce(tp_comm *c, const void *s, void *r, size_t n, tp_dtype dt, void *st) { return self_noop(); }
static tp_status self_all_gather(tp_comm *c, const void *s, void *r, size_t n, tp_dtype dt, void *st) { return self_noop(); }
static tp_status self_send(tp_comm *c, const void *b, size_t n, tp_dtype dt, int p, void *st) { return self_noop(); }
static tp_status self_recv(tp_comm *c, void *b, size_t n, tp_dtype dt, int p, void *st) { return self_noop(); }
static tp_status self_broadcast(tp_comm *c, void *b, size_t n, tp_dtype dt, int root, void *st) { return self_noop(); }
static tp_status self_barrier(tp_comm *c) { return self_noop(); }
static void self_destroy(tp_comm *c) {}
static const struct tp_comm_ops self_ops = {
    /* .all_reduce_sum = */ self_all_reduce,
    /* .all_gather     = */ self_all_gather,
    /* .send           = */ self_send,
    /* .recv           = */ self_recv,
    /* .broadcast      = */ self_broadcast,
    /* .barrier        = */ self_barrier,
    /* .destroy        = */ self_destroy,
};
#endif

START_TEST(nccl_one_rank)
{
#ifdef HAVE_NCCL
    tp_comm self = {&self_ops, NULL, 0, 1, "self"};
    tp_comm *c = NULL;
    gb = gpus[1];
    tp_error_clear();
    ck_assert_msg(tp_comm_nccl_create(&self, 0, "test", &c) == TP_OK, "%s", tp_error_message());
    ck_assert_str_eq(c->name, "nccl:test");
    ck_assert_int_eq(c->rank, 0);
    ck_assert_int_eq(c->size, 1);
    enum { N = 1000 };
    for (int d = 0; d < 4; d++) {
        const tp_dtype dt = d < 3 ? float_dtypes[d] : TP_DTYPE_I32;
        const size_t bytes = N * tp_dtype_size(dt);
        unsigned char *h = host_alloc(bytes), *back = host_alloc(bytes);
        for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)(i * 13 + 5) & 0x3f; /* finite in every dtype */
        void *a = dev_copy(gb, h, bytes), *r = dev_alloc(gb, bytes);
        ck_assert_int_eq(tp_comm_all_reduce_sum(c, a, r, N, dt, gb->stream), TP_OK);
        ck_assert_int_eq(tp_comm_all_reduce_sum(c, a, a, N, dt, gb->stream), TP_OK);
        ck_assert_int_eq(gb->ops->download(gb, back, r, bytes), TP_OK);
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
        ck_assert(!memcmp(h, back, bytes)); /* the sum over one rank */
        ck_assert_int_eq(tp_comm_all_gather(c, a, r, N, dt, gb->stream), TP_OK);
        ck_assert_int_eq(tp_comm_broadcast(c, r, N, dt, 0, gb->stream), TP_OK);
        ck_assert_int_eq(gb->ops->download(gb, back, r, bytes), TP_OK);
        ck_assert_int_eq(gb->ops->synchronize(gb), TP_OK);
        ck_assert(!memcmp(h, back, bytes));
    }
    ck_assert_int_eq(tp_comm_barrier(c), TP_OK);
    tp_comm_nccl_abort(c);
    tp_error_clear();
    void *p = dev_alloc(gb, 16);
    ck_assert_int_eq(tp_comm_all_reduce_sum(c, p, p, 4, TP_DTYPE_F32, gb->stream), TP_ERR_NCCL);
    ck_assert_msg(strstr(tp_error_message(), "failed or was aborted"), "%s", tp_error_message());
    tp_comm_destroy(c);
    tp_comm_nccl_abort(&self); /* not NCCL's: ignored */
    printf("  %-13s %-9s %-58s ok\n", "nccl", "-", "one rank: all-reduce, all-gather, broadcast, abort");
#else
    printf("  %-13s %-9s %-58s skipped\n", "nccl", "-", "built without NCCL");
#endif
}
END_TEST

/* ---- the runner -------------------------------------------------------------------------------- */

static Suite *make_suite(void)
{
    Suite *s = suite_create("backend_ops");
    struct {
        const char *name;
        const TTest *tests[8];
    } groups[] = {
        {"memory", {create_fields, memory}},
        {"matmul", {matmul_shapes, matmul_empty, matmul_add_cases, matmul_gemv, matmul_swiglu_cases, matmul_tuned}},
        {"norms", {embedding_cases, add_rmsnorm_shapes, head_rmsnorm_shapes, rope_shapes}},
        {"attention", {attention_cases, qk_rope_store_cases, qk_rope_attention_cases, attention_long, attention_prefill,
                       attention_window, attention_softcap}},
        {"elementwise", {swiglu_shapes, gather_rows_cases, convert_cases, take_ids_cases}},
        {"argmax", {argmax_cases, argmax_merge_cases}},
        {"sample", {sample_cases, sample_draw_frequencies, sample_faults}},
        {"errors", {bad_shapes, device_faults, attention_faults, attention_prefill_faults}},
        {"nccl", {nccl_one_rank}},
    };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        TCase *tc = tcase_create(groups[g].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 600);
        for (int t = 0; t < 6 && groups[g].tests[t]; t++) tcase_add_test(tc, groups[g].tests[t]);
        suite_add_tcase(s, tc);
    }
    return s;
}

static void destroy_backends(void)
{
    for (int i = 0; i < n_gpus; i++) tp_backend_destroy(gpus[i]);
    n_gpus = 0;
    tp_backend_destroy(cpu);
    cpu = NULL;
}

int main(void)
{
    SRunner *sr = srunner_create(make_suite());
    srunner_set_fork_status(sr, CK_NOFORK); /* a CUDA context does not survive fork() */
    int code = 77;
    if (tp_backend_cpu_create(&cpu) != TP_OK) {
        fprintf(stderr, "check_backend_ops: the cpu backend: %s\n", tp_error_message());
        code = 1;
        goto done;
    }
#ifdef HAVE_CUDA
    static const tp_dtype acts[3] = {TP_DTYPE_F32, TP_DTYPE_BF16, TP_DTYPE_F16};
    for (int i = 0; i < 3; i++) {
        tp_error_clear();
        tp_status st = tp_backend_cuda_create(0, acts[i], &gpus[n_gpus]);
        if (st == TP_ERR_UNAVAILABLE) {
            printf("check_backend_ops: skipped: %s\n", tp_error_message());
            goto done;
        }
        if (st != TP_OK) {
            fprintf(stderr, "check_backend_ops: creating the cuda backend (%s): %s (%s)\n",
                    tp_dtype_name(acts[i]), tp_error_message(), tp_status_str(st));
            code = 1;
            goto done;
        }
        n_gpus++;
    }
    printf("check_backend_ops: cuda (f32, bf16, f16 activations) against cpu; normalized error |a-b|/|b|\n");
    srunner_run_all(sr, CK_NORMAL);
    code = srunner_ntests_failed(sr) ? 1 : 0;
#else
    printf("check_backend_ops: skipped: this build has no CUDA backend\n");
#endif
done:
    destroy_backends();
    srunner_free(sr);
    return code;
}
