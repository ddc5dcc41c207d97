/*
 * check_backend_cpu.c: every operation of the cpu backend against a naive reference
 * written here (double precision where there are sums), on random inputs from fixed
 * seeds: odd shapes, f32/f16/bf16 weights, column views of wider matrices (whose other
 * columns must stay untouched), paged KV caches with scattered blocks and GQA. Then the
 * invariances the engine relies on (a row alone == the row in a batch, 1 thread == 2
 * threads, bit for bit) and the argument checks (TP_ERR_INVALID_ARG, never a crash).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "model.h"
#include "sampler.h"

static const tp_dtype weight_dtypes[] = {TP_DTYPE_F32, TP_DTYPE_F16, TP_DTYPE_BF16};
#define N_WEIGHT_DTYPES 3

/* ---- fixture: the backend, and everything a test allocates (freed in teardown) ------ */

#define MAX_TRACK 8192
static tp_backend *be;
static void *dev_tracked[MAX_TRACK], *host_tracked[MAX_TRACK];
static int n_dev, n_host;
#ifdef _OPENMP
static int saved_threads;
#endif

static void setup(void)
{
#ifdef _OPENMP
    saved_threads = omp_get_max_threads();
#endif
    tp_error_clear();
    ck_assert_int_eq(tp_backend_cpu_create(&be), TP_OK);
    n_dev = n_host = 0;
}

static void teardown(void)
{
    for (int i = 0; i < n_dev; i++) be->ops->free(be, dev_tracked[i]);
    for (int i = 0; i < n_host; i++) free(host_tracked[i]);
    tp_backend_destroy(be);
    be = NULL;
#ifdef _OPENMP
    omp_set_num_threads(saved_threads); /* the thread tests change it */
#endif
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    ck_assert_int_eq(be->ops->alloc(be, bytes, &p), TP_OK);
    ck_assert_int_lt(n_dev, MAX_TRACK);
    dev_tracked[n_dev++] = p;
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

/* Host data copied into fresh backend memory. */
static void *dev_copy(const void *src, size_t bytes)
{
    void *p = dev_alloc(bytes);
    ck_assert_int_eq(be->ops->upload(be, p, src, bytes), TP_OK);
    return p;
}

static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

#include "test_random.h"

/* v as an element of type dt holds it. */
static float round_to(tp_dtype dt, float v)
{
    unsigned char bytes[4];
    float r;
    tp_convert(bytes, dt, &v, TP_DTYPE_F32, 1);
    tp_convert(&r, TP_DTYPE_F32, bytes, dt, 1);
    return r;
}

/* ---- matrices: a backend tensor beside the values it holds ---------------------------- */

/* A [rows, cols] view at column col0 of a backend matrix [rows, cols + pad] filled with
 * random values; the pad columns are guards that outputs must leave as they were. */
typedef struct mat {
    tp_tensor t;     /* the view an operation sees */
    tp_tensor whole; /* the allocation around it */
    void *orig;      /* bytes of whole as filled */
    double *ref;     /* [rows * cols] the view's values as the backend holds them */
} mat;

static mat mat_new(tp_dtype dt, int64_t rows, int64_t cols, int64_t pad, float lo, float hi)
{
    mat m;
    int64_t width = cols + pad;
    size_t n = (size_t)(rows * width), es = tp_dtype_size(dt);
    float *vals = host_alloc(n * sizeof(float) + 1), *round = host_alloc(n * sizeof(float) + 1);
    m.orig = host_alloc(n * es + 1);
    for (size_t i = 0; i < n; i++) vals[i] = uniform(lo, hi);
    tp_convert(m.orig, dt, vals, TP_DTYPE_F32, n);
    tp_convert(round, TP_DTYPE_F32, m.orig, dt, n);
    m.whole = tp_tensor_make(dev_copy(m.orig, n * es + 1), dt, rows, width);
    m.t = tp_tensor_cols(&m.whole, pad / 2, cols);
    m.ref = host_alloc((size_t)(rows * cols) * sizeof(double) + 1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) m.ref[r * cols + c] = round[r * width + pad / 2 + c];
    return m;
}

/* The view's values now, as f32 (rows * cols). */
static float *mat_get(const mat *m)
{
    size_t n = (size_t)(m->whole.rows * m->whole.cols), es = tp_dtype_size(m->t.dtype);
    unsigned char *raw = host_alloc(n * es + 1);
    float *out = host_alloc((size_t)(m->t.rows * m->t.cols) * sizeof(float) + 1);
    ck_assert_int_eq(be->ops->download(be, raw, m->whole.data, n * es), TP_OK);
    ck_assert_int_eq(be->ops->synchronize(be), TP_OK);
    int64_t col0 = ((char *)m->t.data - (char *)m->whole.data) / (int64_t)es;
    for (int64_t r = 0; r < m->t.rows; r++)
        tp_convert(out + r * m->t.cols, TP_DTYPE_F32, raw + (size_t)(r * m->whole.cols + col0) * es,
                   m->t.dtype, (size_t)m->t.cols);
    return out;
}

/* The columns outside the view are as they were filled. */
static void assert_guards(const mat *m)
{
    size_t es = tp_dtype_size(m->t.dtype);
    int64_t col0 = ((char *)m->t.data - (char *)m->whole.data) / (int64_t)es;
    const unsigned char *now = m->whole.data, *orig = m->orig;
    for (int64_t r = 0; r < m->whole.rows; r++) {
        size_t row = (size_t)(r * m->whole.cols) * es;
        ck_assert_msg(!memcmp(now + row, orig + row, (size_t)col0 * es), "guard before row %lld",
                      (long long)r);
        size_t after = (size_t)(col0 + m->t.cols) * es;
        size_t rest = (size_t)m->whole.cols * es - after;
        ck_assert_msg(!memcmp(now + row + after, orig + row + after, rest), "guard after row %lld",
                      (long long)r);
    }
}

/* ---- comparisons ------------------------------------------------------------------ */

/* |got - ref| <= atol + rtol * |ref| everywhere. */
static void assert_close(const char *what, const float *got, const double *ref, size_t n, double atol,
                         double rtol)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - ref[i]) <= atol + rtol * fabs(ref[i]),
                      "%s: element %zu is %.9g, reference %.9g (atol %g, rtol %g)", what, i,
                      (double)got[i], ref[i], atol, rtol);
}

/* ggml's normalized mean squared error: mse(got, ref) / mse(ref, 0). */
static double nmse(const float *got, const double *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? num / den : num;
}

#define NMSE_F32 1e-10 /* f32 accumulation against a double reference: ~1e-5 relative rms */

#define EXPECT_STATUS(call, want, needle)                                                        \
    do {                                                                                         \
        tp_error_clear();                                                                        \
        ck_assert_int_eq((call), (want));                                                        \
        ck_assert_msg(strstr(tp_error_message(), (needle)) != NULL, "message \"%s\" lacks \"%s\"", \
                      tp_error_message(), (needle));                                             \
    } while (0)
#define EXPECT_INVALID(call, needle) EXPECT_STATUS(call, TP_ERR_INVALID_ARG, needle)
#define EXPECT_NUMERIC(call, needle) EXPECT_STATUS(call, TP_ERR_NUMERIC, needle) /* NaN/Inf logits */

/* ---- creation and memory ------------------------------------------------------------ */

START_TEST(create_fields)
{
    ck_assert_str_eq(be->name, "cpu");
    ck_assert_int_eq(be->act_dtype, TP_DTYPE_F32);
    ck_assert_ptr_null(be->stream);
    const struct tp_backend_ops *o = be->ops;
    ck_assert(o->alloc && o->free && o->upload && o->download && o->memset0 && o->synchronize);
    ck_assert(o->embedding && o->add_rmsnorm && o->head_rmsnorm && o->matmul && o->rope);
    ck_assert(o->kv_store && o->attention && o->swiglu && o->geglu && o->gather_rows && o->convert && o->destroy);
    ck_assert(o->argmax && o->matmul_swiglu && o->qk_rope_store && o->staging && o->upload_staged);
    ck_assert(o->sample && o->matmul_add);
    ck_assert_int_eq(tp_backend_cpu_create(NULL), TP_ERR_INVALID_ARG);
    tp_backend_destroy(NULL);
}
END_TEST

START_TEST(memory)
{
    static const size_t sizes[] = {0, 1, 3, 63, 64, 65, 1000, 1 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        void *p = NULL;
        ck_assert_int_eq(be->ops->alloc(be, n, &p), TP_OK);
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq((uintptr_t)p % 64, 0);
        unsigned char *src = host_alloc(n), *dst = host_alloc(n);
        for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 7 + 1);
        ck_assert_int_eq(be->ops->upload(be, p, src, n), TP_OK);
        ck_assert_int_eq(be->ops->download(be, dst, p, n), TP_OK);
        ck_assert_int_eq(be->ops->synchronize(be), TP_OK);
        ck_assert(!memcmp(src, dst, n));
        ck_assert_int_eq(be->ops->memset0(be, p, n), TP_OK);
        ck_assert_int_eq(be->ops->download(be, dst, p, n), TP_OK);
        for (size_t i = 0; i < n; i++) ck_assert_uint_eq(dst[i], 0);
        be->ops->free(be, p);
    }
    be->ops->free(be, NULL);
    EXPECT_INVALID(be->ops->upload(be, NULL, "x", 1), "upload");
    EXPECT_INVALID(be->ops->download(be, host_alloc(1), NULL, 1), "download");
    EXPECT_INVALID(be->ops->memset0(be, NULL, 1), "memset0");
    ck_assert_int_eq(be->ops->upload(be, NULL, NULL, 0), TP_OK);
    EXPECT_INVALID(be->ops->alloc(be, 1, NULL), "alloc");
}
END_TEST

/* ---- matmul --------------------------------------------------------------------------- */

static void matmul_case(tp_dtype wdt, int64_t n, int64_t k, int64_t m, int with_bias, int64_t pad)
{
    mat x = mat_new(TP_DTYPE_F32, n, k, pad, -1.0f, 1.0f);
    mat w = mat_new(wdt, m, k, pad, -1.0f, 1.0f);
    mat bias = mat_new(wdt, 1, m, pad, -1.0f, 1.0f);
    mat y = mat_new(TP_DTYPE_F32, n, m, pad, -1.0f, 1.0f);
    tp_error_clear();
    ck_assert_msg(be->ops->matmul(be, &x.t, &w.t, with_bias ? &bias.t : NULL, &y.t) == TP_OK, "%s",
                  tp_error_message());
    float *got = mat_get(&y);
    double *ref = host_alloc((size_t)(n * m) * sizeof(double) + 1);
    char what[96];
    snprintf(what, sizeof what, "matmul %s n=%lld k=%lld m=%lld bias=%d pad=%lld",
             tp_dtype_name(wdt), (long long)n, (long long)k, (long long)m, with_bias, (long long)pad);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double s = with_bias ? bias.ref[j] : 0.0, mag = fabs(s);
            for (int64_t kk = 0; kk < k; kk++) {
                s += x.ref[i * k + kk] * w.ref[j * k + kk];
                mag += fabs(x.ref[i * k + kk] * w.ref[j * k + kk]);
            }
            ref[i * m + j] = s;
            ck_assert_msg(fabs(got[i * m + j] - s) <= 1e-5 * mag + 1e-30,
                          "%s: y[%lld,%lld] = %.9g, reference %.9g", what, (long long)i, (long long)j,
                          (double)got[i * m + j], s);
        }
    ck_assert_msg(nmse(got, ref, (size_t)(n * m)) <= NMSE_F32, "%s: nmse %g", what,
                  nmse(got, ref, (size_t)(n * m)));
    assert_guards(&y);
}

START_TEST(matmul_shapes)
{
    static const int64_t shapes[][3] = {
        {1, 1, 1},   {1, 17, 3},   {3, 17, 5},   {17, 64, 130}, {64, 130, 17},
        {130, 3, 64}, {37, 200, 33}, {2, 1030, 9}, {65, 33, 7},   {1, 300, 257},
    };
    seed(1);
    for (int d = 0; d < N_WEIGHT_DTYPES; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int variant = 0; variant < 2; variant++)
                matmul_case(weight_dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2], variant,
                            variant ? 3 : 0);
}
END_TEST

START_TEST(matmul_empty)
{
    seed(2);
    /* k == 0: y = bias; n == 0 or m == 0: nothing to do */
    mat x = mat_new(TP_DTYPE_F32, 3, 0, 2, -1, 1), w = mat_new(TP_DTYPE_BF16, 5, 0, 2, -1, 1);
    mat bias = mat_new(TP_DTYPE_BF16, 1, 5, 0, -1, 1), y = mat_new(TP_DTYPE_F32, 3, 5, 2, -1, 1);
    ck_assert_int_eq(be->ops->matmul(be, &x.t, &w.t, &bias.t, &y.t), TP_OK);
    float *got = mat_get(&y);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) ck_assert_float_eq(got[i * 5 + j], (float)bias.ref[j]);
    ck_assert_int_eq(be->ops->matmul(be, &x.t, &w.t, NULL, &y.t), TP_OK);
    got = mat_get(&y);
    for (int i = 0; i < 15; i++) ck_assert_float_eq(got[i], 0.0f);
    /* matmul_add of empty sums leaves y as it was */
    mat r = mat_new(TP_DTYPE_F32, 3, 5, 2, -1, 1);
    float *was = mat_get(&r);
    ck_assert_int_eq(be->ops->matmul_add(be, &x.t, &w.t, &r.t), TP_OK);
    ck_assert_mem_eq(mat_get(&r), was, 15 * sizeof(float));
    assert_guards(&r);
    mat x0 = mat_new(TP_DTYPE_F32, 0, 4, 0, -1, 1), w4 = mat_new(TP_DTYPE_F32, 5, 4, 0, -1, 1);
    mat y0 = mat_new(TP_DTYPE_F32, 0, 5, 0, -1, 1);
    ck_assert_int_eq(be->ops->matmul(be, &x0.t, &w4.t, NULL, &y0.t), TP_OK);
}
END_TEST

/* ---- normalization -------------------------------------------------------------------- */

static void add_rmsnorm_case(tp_dtype wdt, int64_t n, int64_t d, int with_delta, int64_t pad)
{
    const float eps = 1e-5f;
    mat res = mat_new(TP_DTYPE_F32, n, d, pad, -2.0f, 2.0f);
    mat delta = mat_new(TP_DTYPE_F32, n, d, pad, -1.0f, 1.0f);
    mat w = mat_new(wdt, 1, d, pad, 0.5f, 1.5f);
    mat out = mat_new(TP_DTYPE_F32, n, d, pad, -1.0f, 1.0f);
    tp_error_clear();
    ck_assert_msg(be->ops->add_rmsnorm(be, &res.t, with_delta ? &delta.t : NULL, &w.t, eps, &out.t) ==
                      TP_OK, "%s", tp_error_message());
    float *r = mat_get(&res), *o = mat_get(&out);
    double *ref_r = host_alloc((size_t)(n * d) * sizeof(double) + 1);
    double *ref_o = host_alloc((size_t)(n * d) * sizeof(double) + 1);
    for (int64_t i = 0; i < n; i++) {
        double ss = 0.0;
        for (int64_t j = 0; j < d; j++) {
            /* the residual add is one f32 addition, exact to compare */
            float v = (float)res.ref[i * d + j] + (with_delta ? (float)delta.ref[i * d + j] : 0.0f);
            ref_r[i * d + j] = v;
            ss += (double)v * v;
        }
        double inv = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t j = 0; j < d; j++) ref_o[i * d + j] = ref_r[i * d + j] * inv * w.ref[j];
    }
    assert_close("add_rmsnorm residual", r, ref_r, (size_t)(n * d), 0.0, 0.0);
    assert_close("add_rmsnorm out", o, ref_o, (size_t)(n * d), 1e-6, 2e-6);
    assert_guards(&res);
    assert_guards(&out);
}

START_TEST(add_rmsnorm_shapes)
{
    static const int64_t shapes[][2] = {{1, 1}, {3, 17}, {17, 64}, {2, 130}, {5, 1000}};
    seed(3);
    for (int dt = 0; dt < N_WEIGHT_DTYPES; dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int v = 0; v < 2; v++)
                add_rmsnorm_case(weight_dtypes[dt], shapes[s][0], shapes[s][1], v, v ? 5 : 0);
}
END_TEST

START_TEST(head_rmsnorm_shapes)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 2, 17}, {17, 4, 64}, {2, 3, 130}};
    const float eps = 1e-6f;
    seed(4);
    for (int dt = 0; dt < N_WEIGHT_DTYPES; dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t n = shapes[s][0], heads = shapes[s][1], hd = shapes[s][2], cols = heads * hd;
            mat x = mat_new(TP_DTYPE_F32, n, cols, 7, -3.0f, 3.0f); /* a view, as q is of qkv */
            mat w = mat_new(weight_dtypes[dt], 1, hd, 0, 0.5f, 1.5f);
            ck_assert_int_eq(be->ops->head_rmsnorm(be, &x.t, (int32_t)hd, &w.t, eps), TP_OK);
            float *got = mat_get(&x);
            double *ref = host_alloc((size_t)(n * cols) * sizeof(double));
            for (int64_t i = 0; i < n; i++)
                for (int64_t h = 0; h < heads; h++) {
                    const double *v = x.ref + i * cols + h * hd;
                    double ss = 0.0;
                    for (int64_t j = 0; j < hd; j++) ss += v[j] * v[j];
                    double inv = 1.0 / sqrt(ss / (double)hd + eps);
                    for (int64_t j = 0; j < hd; j++) ref[i * cols + h * hd + j] = v[j] * inv * w.ref[j];
                }
            assert_close("head_rmsnorm", got, ref, (size_t)(n * cols), 1e-6, 2e-6);
            assert_guards(&x);
        }
}
END_TEST

/* ---- rope ------------------------------------------------------------------------------ */

START_TEST(rope_shapes)
{
    static const int64_t shapes[][3] = {{1, 1, 2}, {3, 2, 64}, {17, 3, 130}, {5, 4, 128}};
    static const int32_t positions[] = {0, 1, 2, 17, 100, 4095, 32767, 131071};
    seed(5);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0], heads = shapes[s][1], hd = shapes[s][2];
        int64_t cols = heads * hd, half = hd / 2;
        mat x = mat_new(TP_DTYPE_F32, n, cols, 6, -1.0f, 1.0f);
        int32_t *pos = host_alloc((size_t)n * sizeof(int32_t));
        float *inv = host_alloc((size_t)half * sizeof(float));
        for (int64_t i = 0; i < n; i++) pos[i] = positions[rand_int(8)];
        for (int64_t j = 0; j < half; j++) inv[j] = (float)pow(500000.0, -2.0 * (double)j / (double)hd);
        const int32_t *dpos = dev_copy(pos, (size_t)n * sizeof(int32_t));
        const float *dinv = dev_copy(inv, (size_t)half * sizeof(float));
        ck_assert_int_eq(be->ops->rope(be, &x.t, (int32_t)hd, dpos, dinv), TP_OK);
        float *got = mat_get(&x);
        double *ref = host_alloc((size_t)(n * cols) * sizeof(double));
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t j = 0; j < half; j++) {
                    /* HF: the angle is an f32 product; its cos and sin are then exact here */
                    double a = (double)((float)pos[i] * inv[j]);
                    const double *v = x.ref + i * cols + h * hd;
                    double x1 = v[j], x2 = v[j + half];
                    ref[i * cols + h * hd + j] = x1 * cos(a) - x2 * sin(a);
                    ref[i * cols + h * hd + j + half] = x2 * cos(a) + x1 * sin(a);
                }
        assert_close("rope", got, ref, (size_t)(n * cols), 1e-6, 1e-6);
        assert_guards(&x);
    }
}
END_TEST

/* ---- KV cache and attention ------------------------------------------------------------ */

/* One step of a paged-attention scenario: sequence s has hist[s] positions stored by an
 * earlier kv_store, and chunk[s] new tokens in this step (interleaved across sequences);
 * physical blocks are a random permutation. window: the sliding window (0: none). */
typedef struct attn_case {
    tp_dtype cache_dt;
    int kvh, ratio, hd, bs, n_seqs;
    int hist[4], chunk[4];
    int window;
    float softcap; /* > 0: scores s become softcap tanh(s / softcap) (Gemma 2) */
} attn_case;

typedef struct attn_state {
    int qh, n;              /* q heads, tokens in the step */
    tp_kv_layer cache;
    tp_attn_batch batch;    /* device pointers */
    int32_t *seq, *pos;     /* host copies */
    mat qkv;                /* [n, (qh + 2 kvh) hd]: q, k, v are column views */
    tp_tensor q;
    mat out;                /* [n, qh hd] */
    float scale;
} attn_state;

static void attention_run(const attn_case *c, uint64_t s, attn_state *st)
{
    seed(s);
    const int kvh = c->kvh, hd = c->hd, bs = c->bs, qh = kvh * c->ratio, width = kvh * hd;
    int total[4], max_blocks = 1, need = 0, n = 0, nh = 0;
    for (int q = 0; q < c->n_seqs; q++) {
        total[q] = c->hist[q] + c->chunk[q];
        int blocks = (total[q] + bs - 1) / bs;
        if (blocks + 1 > max_blocks) max_blocks = blocks + 1; /* a spare column, left -1 */
        need += blocks;
        n += c->chunk[q];
        nh += c->hist[q];
    }
    /* block table: a random permutation of the physical blocks */
    const int n_blocks = need + 3;
    int32_t *perm = host_alloc((size_t)n_blocks * sizeof(int32_t));
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = rand_int(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *table = host_alloc((size_t)(c->n_seqs * max_blocks) * sizeof(int32_t));
    for (int i = 0, next = 0; i < c->n_seqs; i++)
        for (int lb = 0; lb < max_blocks; lb++)
            table[i * max_blocks + lb] = lb * bs < total[i] ? perm[next++] : -1;

    /* the cache, zeroed */
    size_t es = tp_dtype_size(c->cache_dt), cache_bytes = (size_t)n_blocks * bs * width * es;
    st->cache = (tp_kv_layer){dev_alloc(cache_bytes), dev_alloc(cache_bytes), c->cache_dt, n_blocks,
                              bs, kvh, hd};
    ck_assert_int_eq(be->ops->memset0(be, st->cache.k, cache_bytes), TP_OK);
    ck_assert_int_eq(be->ops->memset0(be, st->cache.v, cache_bytes), TP_OK);
    const int32_t *dtable = dev_copy(table, (size_t)(c->n_seqs * max_blocks) * sizeof(int32_t));

    /* logical keys and values, [seq][pos][kvh*hd], as the cache holds them */
    double *kref[4], *vref[4];
    for (int q = 0; q < c->n_seqs; q++) {
        kref[q] = host_alloc((size_t)(total[q] * width) * sizeof(double) + 1);
        vref[q] = host_alloc((size_t)(total[q] * width) * sizeof(double) + 1);
    }
#define SLOT(q, p) (table[(q) * max_blocks + (p) / bs] * bs + (p) % bs)

    /* history: one kv_store of every earlier position */
    if (nh > 0) {
        mat hk = mat_new(TP_DTYPE_F32, nh, width, 0, -1, 1);
        mat hv = mat_new(TP_DTYPE_F32, nh, width, 0, -1, 1);
        int32_t *seq = host_alloc((size_t)nh * 4), *pos = host_alloc((size_t)nh * 4);
        int32_t *slot = host_alloc((size_t)nh * 4);
        for (int q = 0, i = 0; q < c->n_seqs; q++)
            for (int p = 0; p < c->hist[q]; p++, i++) {
                seq[i] = q;
                pos[i] = p;
                slot[i] = SLOT(q, p);
                for (int e = 0; e < width; e++) {
                    kref[q][p * width + e] = round_to(c->cache_dt, (float)hk.ref[i * width + e]);
                    vref[q][p * width + e] = round_to(c->cache_dt, (float)hv.ref[i * width + e]);
                }
            }
        tp_attn_batch hb = {nh, dev_copy(seq, (size_t)nh * 4), dev_copy(pos, (size_t)nh * 4),
                            dev_copy(slot, (size_t)nh * 4), dtable, max_blocks, 1 << 20, 0, 0, 0};
        ck_assert_int_eq(be->ops->kv_store(be, &hk.t, &hv.t, &st->cache, &hb), TP_OK);
    }

    /* this step: tokens interleaved across sequences */
    st->qh = qh;
    st->n = n;
    st->seq = host_alloc((size_t)n * 4);
    st->pos = host_alloc((size_t)n * 4);
    int32_t *slot = host_alloc((size_t)n * 4);
    int max_pos = 1;
    for (int r = 0, i = 0; i < n; r++)
        for (int q = 0; q < c->n_seqs; q++)
            if (r < c->chunk[q]) {
                st->seq[i] = q;
                st->pos[i] = c->hist[q] + r;
                slot[i] = SLOT(q, st->pos[i]);
                if (st->pos[i] + 1 > max_pos) max_pos = st->pos[i] + 1;
                i++;
            }
    st->qkv = mat_new(TP_DTYPE_F32, n, (qh + 2 * kvh) * hd, 5, -1, 1);
    st->q = tp_tensor_cols(&st->qkv.t, 0, qh * hd);
    tp_tensor k = tp_tensor_cols(&st->qkv.t, qh * hd, width);
    tp_tensor v = tp_tensor_cols(&st->qkv.t, qh * hd + width, width);
    const int qkv_cols = (qh + 2 * kvh) * hd;
    for (int i = 0; i < n; i++)
        for (int e = 0; e < width; e++) {
            const double *row = st->qkv.ref + (size_t)i * qkv_cols + qh * hd;
            kref[st->seq[i]][st->pos[i] * width + e] = round_to(c->cache_dt, (float)row[e]);
            vref[st->seq[i]][st->pos[i] * width + e] = round_to(c->cache_dt, (float)row[width + e]);
        }
    st->batch = (tp_attn_batch){n, dev_copy(st->seq, (size_t)n * 4), dev_copy(st->pos, (size_t)n * 4),
                                dev_copy(slot, (size_t)n * 4), dtable, max_blocks, max_pos, 0, c->window,
                                c->softcap};
    st->out = mat_new(TP_DTYPE_F32, n, qh * hd, 3, -1, 1);
    st->scale = 1.0f / sqrtf((float)hd);
    tp_error_clear();
    ck_assert_msg(be->ops->kv_store(be, &k, &v, &st->cache, &st->batch) == TP_OK, "%s",
                  tp_error_message());

    /* the cache holds every position where the block table says */
    size_t cache_elems = (size_t)n_blocks * bs * width;
    unsigned char *raw = host_alloc(cache_bytes);
    float *kc = host_alloc(cache_elems * 4), *vc = host_alloc(cache_elems * 4);
    ck_assert_int_eq(be->ops->download(be, raw, st->cache.k, cache_bytes), TP_OK);
    tp_convert(kc, TP_DTYPE_F32, raw, c->cache_dt, cache_elems);
    ck_assert_int_eq(be->ops->download(be, raw, st->cache.v, cache_bytes), TP_OK);
    tp_convert(vc, TP_DTYPE_F32, raw, c->cache_dt, cache_elems);
    for (int q = 0; q < c->n_seqs; q++)
        for (int p = 0; p < total[q]; p++)
            for (int e = 0; e < width; e++) {
                size_t at = (size_t)SLOT(q, p) * width + e;
                ck_assert_msg(kc[at] == (float)kref[q][p * width + e] &&
                                  vc[at] == (float)vref[q][p * width + e],
                              "kv_store: seq %d pos %d element %d", q, p, e);
            }

    tp_error_clear();
    ck_assert_msg(be->ops->attention(be, &st->q, &st->cache, &st->batch, qh, st->scale, &st->out.t) ==
                      TP_OK, "%s", tp_error_message());
    float *got = mat_get(&st->out);
    double *ref = host_alloc((size_t)(n * qh * hd) * sizeof(double));
    double *w = host_alloc((size_t)max_pos * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int h = 0; h < qh; h++) {
            const int sq = st->seq[i], kh = h / c->ratio, np = st->pos[i] + 1;
            /* with a window, keys p with pos - p < window (Hugging Face's sliding mask) */
            const int lo = c->window > 0 && np > c->window ? np - c->window : 0;
            const double *qv = st->qkv.ref + (size_t)i * qkv_cols + h * hd;
            double mx = -INFINITY, sum = 0.0;
            for (int p = lo; p < np; p++) {
                double d = 0.0;
                for (int e = 0; e < hd; e++) d += qv[e] * kref[sq][p * width + kh * hd + e];
                w[p] = d * st->scale;
                if (c->softcap > 0) w[p] = c->softcap * tanh(w[p] / c->softcap);
                if (w[p] > mx) mx = w[p];
            }
            for (int p = lo; p < np; p++) sum += w[p] = exp(w[p] - mx);
            for (int e = 0; e < hd; e++) {
                double o = 0.0;
                for (int p = lo; p < np; p++) o += w[p] * vref[sq][p * width + kh * hd + e];
                ref[(size_t)i * qh * hd + h * hd + e] = o / sum;
            }
        }
    char what[128];
    snprintf(what, sizeof what, "attention %s kvh=%d ratio=%d hd=%d bs=%d window=%d softcap=%g",
             tp_dtype_name(c->cache_dt), kvh, c->ratio, hd, bs, c->window, c->softcap);
    assert_close(what, got, ref, (size_t)(n * qh * hd), 2e-6, 2e-5);
    ck_assert_msg(nmse(got, ref, (size_t)(n * qh * hd)) <= NMSE_F32, "%s: nmse %g", what,
                  nmse(got, ref, (size_t)(n * qh * hd)));
    assert_guards(&st->out);
#undef SLOT
}

static const attn_case attn_cases[] = {
    /* one sequence, a prefill chunk from scratch: later tokens see earlier ones */
    {TP_DTYPE_F32, 1, 1, 17, 4, 1, {0}, {13}, 0, 0},
    /* three sequences: a chunk after history, a decode step, a first token; GQA 2 */
    {TP_DTYPE_F32, 2, 2, 64, 16, 3, {10, 33, 0}, {10, 1, 1}, 0, 0},
    /* GQA 4, block size 1, bf16 cache */
    {TP_DTYPE_BF16, 2, 4, 3, 1, 3, {5, 0, 20}, {3, 7, 1}, 0, 0},
    /* f16 cache, positions over many blocks */
    {TP_DTYPE_F16, 1, 4, 64, 8, 2, {70, 40}, {2, 30}, 0, 0},
    /* head dim 130, block size 16, GQA 1 across four sequences */
    {TP_DTYPE_F32, 3, 1, 130, 16, 4, {0, 1, 15, 16}, {1, 16, 2, 17}, 0, 0},
    /* decode only */
    {TP_DTYPE_BF16, 4, 2, 64, 16, 4, {100, 3, 47, 64}, {1, 1, 1, 1}, 0, 0},
    /* sliding windows: a chunk after history, decode steps past and within the window, a
     * first token; a window of 1 (a token sees itself only) */
    {TP_DTYPE_F32, 2, 2, 64, 16, 3, {10, 33, 0}, {10, 1, 1}, 8, 0},
    {TP_DTYPE_BF16, 4, 2, 64, 16, 4, {100, 3, 47, 64}, {1, 1, 1, 1}, 48, 0},
    {TP_DTYPE_F32, 1, 1, 17, 4, 1, {0}, {13}, 1, 0},
    /* soft-capped scores (Gemma 2's attn_logit_softcapping): a cap that bites, with a window */
    {TP_DTYPE_F32, 2, 2, 64, 16, 3, {10, 33, 0}, {10, 1, 1}, 0, 0.5f},
    {TP_DTYPE_BF16, 4, 2, 64, 16, 4, {100, 3, 47, 64}, {1, 1, 1, 1}, 48, 2.0f},
};

START_TEST(attention_cases)
{
    for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++) {
        attn_state st;
        attention_run(&attn_cases[i], 100 + i, &st);
    }
}
END_TEST

START_TEST(kv_store_padding_slot)
{
    /* a slot < 0 is padding: nothing is written */
    seed(6);
    tp_kv_layer cache = {dev_alloc(256), dev_alloc(256), TP_DTYPE_F32, 2, 4, 1, 8}; /* 2 x 4 x 1 x 8 */
    ck_assert_int_eq(be->ops->memset0(be, cache.k, 256), TP_OK);
    ck_assert_int_eq(be->ops->memset0(be, cache.v, 256), TP_OK);
    mat k = mat_new(TP_DTYPE_F32, 2, 8, 0, 1, 2), v = mat_new(TP_DTYPE_F32, 2, 8, 0, 1, 2);
    int32_t slot[2] = {-1, 5};
    tp_attn_batch b = {2, NULL, NULL, dev_copy(slot, 8), NULL, 0, 0, 0, 0, 0};
    ck_assert_int_eq(be->ops->kv_store(be, &k.t, &v.t, &cache, &b), TP_OK);
    float kc[64];
    ck_assert_int_eq(be->ops->download(be, kc, cache.k, sizeof kc), TP_OK);
    for (int i = 0; i < 64; i++) {
        float want = i >= 40 && i < 48 ? (float)k.ref[8 + i - 40] : 0.0f;
        ck_assert_float_eq(kc[i], want);
    }
}
END_TEST

/* ---- element-wise, gathers, conversions --------------------------------------------------- */

START_TEST(swiglu_shapes)
{
    static const int64_t shapes[][2] = {{1, 1}, {3, 17}, {17, 130}, {4, 64}};
    seed(7);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0], m = shapes[s][1];
        /* gate | up in one matrix, as the engine has them */
        mat gu = mat_new(TP_DTYPE_F32, n, 2 * m, 3, -12.0f, 12.0f);
        mat out = mat_new(TP_DTYPE_F32, n, m, 2, -1, 1);
        tp_tensor g = tp_tensor_cols(&gu.t, 0, m), u = tp_tensor_cols(&gu.t, m, m);
        ck_assert_int_eq(be->ops->swiglu(be, &g, &u, &out.t), TP_OK);
        float *got = mat_get(&out);
        double *ref = host_alloc((size_t)(n * m) * sizeof(double));
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                double gv = gu.ref[i * 2 * m + j], uv = gu.ref[i * 2 * m + m + j];
                ref[i * m + j] = gv / (1.0 + exp(-gv)) * uv;
            }
        assert_close("swiglu", got, ref, (size_t)(n * m), 1e-6, 1e-6);
        assert_guards(&out);
        /* geglu: GeLU's tanh form (PyTorch's gelu(approximate="tanh")) of gate, times up */
        mat gout = mat_new(TP_DTYPE_F32, n, m, 2, -1, 1);
        ck_assert_int_eq(be->ops->geglu(be, &g, &u, &gout.t), TP_OK);
        got = mat_get(&gout);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                double gv = gu.ref[i * 2 * m + j], uv = gu.ref[i * 2 * m + m + j];
                ref[i * m + j] = 0.5 * gv * (1.0 + tanh(sqrt(2.0 / M_PI) * (gv + 0.044715 * gv * gv * gv))) * uv;
            }
        assert_close("geglu", got, ref, (size_t)(n * m), 1e-6, 1e-6);
        assert_guards(&gout);
    }
    /* saturation: silu(-100) is -0 in f32, silu(100) is 100 */
    float gv[2] = {-100.0f, 100.0f}, uv[2] = {1.0f, 1.0f}, ov[2];
    tp_tensor g = tp_tensor_make(dev_copy(gv, 8), TP_DTYPE_F32, 1, 2);
    tp_tensor u = tp_tensor_make(dev_copy(uv, 8), TP_DTYPE_F32, 1, 2);
    tp_tensor o = tp_tensor_make(dev_alloc(8), TP_DTYPE_F32, 1, 2);
    ck_assert_int_eq(be->ops->swiglu(be, &g, &u, &o), TP_OK);
    ck_assert_int_eq(be->ops->download(be, ov, o.data, 8), TP_OK);
    ck_assert(fabsf(ov[0]) < 1e-30f && !isnan(ov[0]));
    ck_assert_float_eq(ov[1], 100.0f);
}
END_TEST

/* softcap: x = cap tanh(x / cap) in place (Gemma 2's logits); a cap of 0 refused */
START_TEST(softcap_cases)
{
    seed(9);
    mat x = mat_new(TP_DTYPE_F32, 3, 37, 2, -80.0f, 80.0f);
    ck_assert_int_eq(be->ops->softcap(be, &x.t, 30.0f), TP_OK);
    float *got = mat_get(&x);
    double *ref = host_alloc(3 * 37 * sizeof(double));
    for (int i = 0; i < 3 * 37; i++) ref[i] = 30.0 * tanh(x.ref[i] / 30.0);
    assert_close("softcap", got, ref, 3 * 37, 1e-6, 1e-6);
    assert_guards(&x);
    EXPECT_INVALID(be->ops->softcap(be, &x.t, 0.0f), "softcap: cap 0 must be > 0");
}
END_TEST

START_TEST(gather_rows_cases)
{
    seed(8);
    for (int dt = 0; dt < N_WEIGHT_DTYPES; dt++) {
        mat x = mat_new(TP_DTYPE_F32, 9, 13, 3, -1, 1);
        mat out = mat_new(weight_dtypes[dt], 5, 13, 2, -1, 1);
        int32_t rows[5] = {8, 0, 3, 3, 7};
        ck_assert_int_eq(be->ops->gather_rows(be, &x.t, dev_copy(rows, sizeof rows), 5, &out.t), TP_OK);
        float *got = mat_get(&out);
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 13; j++) {
                ck_assert_float_eq(got[i * 13 + j],
                                   round_to(weight_dtypes[dt], (float)x.ref[rows[i] * 13 + j]));
            }
        assert_guards(&out);
    }
}
END_TEST

START_TEST(embedding_cases)
{
    /* this rank holds ids [100, 150) */
    static const int32_t ids[] = {100, 149, 99, 150, -1, INT32_MAX, INT32_MIN, 120, 100};
    const int n = (int)(sizeof ids / sizeof ids[0]), d = 17;
    seed(9);
    for (int dt = 0; dt < N_WEIGHT_DTYPES; dt++) {
        mat table = mat_new(weight_dtypes[dt], 50, d, 4, -1, 1);
        mat out = mat_new(TP_DTYPE_F32, n, d, 3, -1, 1);
        const int32_t *dids = dev_copy(ids, sizeof ids);
        ck_assert_int_eq(be->ops->embedding(be, dids, n, &table.t, 100, &out.t), TP_OK);
        float *got = mat_get(&out);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < d; j++) {
                int64_t r = (int64_t)ids[i] - 100;
                float want = r >= 0 && r < 50 ? (float)table.ref[r * d + j] : 0.0f;
                ck_assert_msg(got[i * d + j] == want, "embedding %s id %d col %d",
                              tp_dtype_name(weight_dtypes[dt]), ids[i], j);
            }
        assert_guards(&out);
    }
    /* a vocab slice that starts past INT32_MAX: nothing matches */
    mat table = mat_new(TP_DTYPE_BF16, 4, d, 0, -1, 1), out = mat_new(TP_DTYPE_F32, n, d, 0, -1, 1);
    const int32_t *dids = dev_copy(ids, sizeof ids);
    ck_assert_int_eq(be->ops->embedding(be, dids, n, &table.t, (int64_t)1 << 40, &out.t), TP_OK);
    float *got = mat_get(&out);
    for (int i = 0; i < n * d; i++) ck_assert_float_eq(got[i], 0.0f);
}
END_TEST

START_TEST(convert_cases)
{
    seed(10);
    for (int a = 0; a < N_WEIGHT_DTYPES; a++)
        for (int b = 0; b < N_WEIGHT_DTYPES; b++) {
            tp_dtype sdt = weight_dtypes[a], ddt = weight_dtypes[b];
            mat src = mat_new(sdt, 7, 19, 3, -70000.0f, 70000.0f); /* f16 overflows to inf here */
            mat dst = mat_new(ddt, 7, 19, 2, -1, 1);
            ck_assert_int_eq(be->ops->convert(be, &src.t, &dst.t), TP_OK);
            float *got = mat_get(&dst);
            for (int i = 0; i < 7 * 19; i++) {
                float want = round_to(ddt, (float)src.ref[i]);
                ck_assert_msg(got[i] == want || (isnan(got[i]) && isnan(want)), "convert %s -> %s",
                              tp_dtype_name(sdt), tp_dtype_name(ddt));
            }
            assert_guards(&dst);
        }
}
END_TEST

/* ---- greedy sampling ------------------------------------------------------------------ */

/* Logits [L, V] as a view at column pad / 2 of an [L, V + pad] f32 matrix; vals is
 * L * (V + pad), which the view's values are read from. */
static tp_tensor logits_view(const float *vals, int64_t L, int64_t V, int64_t pad)
{
    tp_tensor whole = tp_tensor_make(dev_copy(vals, (size_t)(L * (V + pad)) * sizeof(float)), TP_DTYPE_F32, L,
                                     V + pad);
    return tp_tensor_cols(&whole, pad / 2, V);
}

/* The naive answer for one row: the first column of the maximum (a strict > scan), and
 * its log-softmax summed in double over two passes; -log(V) for a row all -inf. */
static void argmax_ref(const float *x, int64_t V, int32_t *id, double *lp)
{
    int64_t arg = 0;
    for (int64_t j = 1; j < V; j++)
        if (x[j] > x[arg]) arg = j;
    *id = (int32_t)arg;
    const double m = x[arg];
    if (m == -INFINITY) {
        *lp = -log((double)V);
        return;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < V; j++) sum += exp((double)x[j] - m);
    *lp = -log(sum);
}

/* Random rows of L x V in [lo, hi), each row with extras: a tie for its maximum at two
 * columns (the lower expected), some -inf entries; the row 1 all -inf when all_inf. */
static float *argmax_fill(int64_t L, int64_t V, int64_t pad, float lo, float hi, int all_inf)
{
    const int64_t width = V + pad;
    float *v = host_alloc((size_t)(L * width) * sizeof(float) + 1);
    for (int64_t i = 0; i < L * width; i++) v[i] = uniform(lo, hi);
    for (int64_t r = 0; r < L; r++) {
        float *x = v + r * width + pad / 2;
        for (int64_t k = 0; k < V / 50; k++) x[rand_int((int)V)] = -INFINITY;
        if (V >= 2) {
            int64_t a = rand_int((int)V), b = rand_int((int)V - 1);
            if (b >= a) b++;
            x[a] = x[b] = hi + 1.0f + (float)r; /* equal maxima at a and b */
        }
        if (all_inf && r == 1)
            for (int64_t j = 0; j < V; j++) x[j] = -INFINITY;
    }
    return v;
}

static void argmax_case(int64_t L, int64_t V, int64_t pad, float lo, float hi, int all_inf)
{
    const float *v = argmax_fill(L, V, pad, lo, hi, all_inf);
    tp_tensor t = logits_view(v, L, V, pad);
    int32_t *ids = dev_alloc((size_t)L * sizeof(int32_t)), *ids2 = dev_alloc((size_t)L * sizeof(int32_t));
    float *lp = dev_alloc((size_t)L * sizeof(float)), *val = dev_alloc((size_t)L * sizeof(float));
    memset(ids, 0xff, (size_t)L * sizeof(int32_t));
    memset(lp, 0xff, (size_t)L * sizeof(float));
    memset(val, 0xff, (size_t)L * sizeof(float));
    ck_assert_msg(be->ops->argmax(be, &t, ids, lp, NULL) == TP_OK, "%s", tp_error_message());
    ck_assert_msg(be->ops->argmax(be, &t, ids2, NULL, val) == TP_OK, "%s", tp_error_message());
    for (int64_t r = 0; r < L; r++) {
        int32_t want;
        double ref;
        argmax_ref(v + r * (V + pad) + pad / 2, V, &want, &ref);
        ck_assert_msg(ids[r] == want && ids2[r] == want, "argmax [%lld, %lld] row %lld: column %d (%d without "
                      "logprob), expected %d", (long long)L, (long long)V, (long long)r, ids[r], ids2[r], want);
        ck_assert_msg(fabs(lp[r] - ref) <= 1e-5, "argmax [%lld, %lld] row %lld: logprob %.9g, reference %.9g",
                      (long long)L, (long long)V, (long long)r, (double)lp[r], ref);
        const float top = v[r * (V + pad) + pad / 2 + want];
        ck_assert_msg(val[r] == top, "argmax [%lld, %lld] row %lld: value %.9g, the row's largest %.9g", (long long)L,
                      (long long)V, (long long)r, (double)val[r], (double)top);
    }
}

START_TEST(argmax_cases)
{
    seed(16);
    static const int64_t shapes[][3] = {{1, 1, 0}, {3, 1, 2}, {4, 7, 0}, {5, 7, 3}, {6, 1000, 0},
                                        {9, 1000, 5}, {3, 152064, 0}, {2, 152064, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        argmax_case(shapes[s][0], shapes[s][1], shapes[s][2], -20.0f, 20.0f, 0);
        argmax_case(shapes[s][0], shapes[s][1], shapes[s][2], -3.0f, 3.0f, 1);
        argmax_case(shapes[s][0], shapes[s][1], shapes[s][2], 990.0f, 1000.0f, 1); /* max subtraction */
    }
    argmax_case(0, 7, 0, -1, 1, 0); /* no rows: nothing to do */
}
END_TEST

/* What the sampler never sees: infinities, and ties between every column. */
START_TEST(argmax_limits)
{
    int32_t id[4];
    float lp[4];
    float inf_rows[4][6] = {
        {1.0f, INFINITY, 2.0f, INFINITY, -INFINITY, 3.0f}, /* +inf wins, the first; -log 2 */
        {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY}, /* column 0, -log 6 */
        {-INFINITY, -INFINITY, 5.0f, -INFINITY, -INFINITY, -INFINITY}, /* one live: logprob 0 */
        {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, /* all tie: column 0, -log 6 */
    };
    tp_tensor t = logits_view(&inf_rows[0][0], 4, 6, 0);
    ck_assert_int_eq(be->ops->argmax(be, &t, id, lp, NULL), TP_OK);
    ck_assert_int_eq(id[0], 1);
    ck_assert_int_eq(id[1], 0);
    ck_assert_int_eq(id[2], 2);
    ck_assert_int_eq(id[3], 0);
    ck_assert(fabs(lp[0] + log(2.0)) < 1e-6);
    ck_assert(fabs(lp[1] + log(6.0)) < 1e-6);
    ck_assert_float_eq(lp[2], 0.0f);
    ck_assert(fabs(lp[3] + log(6.0)) < 1e-6);
}
END_TEST

START_TEST(argmax_errors)
{
    seed(17);
    const int64_t L = 5, V = 300, pad = 4;
    float *v = argmax_fill(L, V, pad, -5.0f, 5.0f, 0);
    v[3 * (V + pad) + pad / 2 + 7] = NAN;
    v[3 * (V + pad) + pad / 2 + 200] = NAN;
    v[4 * (V + pad) + pad / 2 + 1] = NAN;
    v[1 * (V + pad) + pad / 2 + V] = NAN; /* outside the view: not seen */
    tp_tensor t = logits_view(v, L, V, pad);
    int32_t ids[5];
    float lp[5];
    EXPECT_NUMERIC(be->ops->argmax(be, &t, ids, lp, NULL), "argmax: row 3 of logits has NaN at column 7");
    EXPECT_NUMERIC(be->ops->argmax(be, &t, ids, NULL, NULL), "argmax: row 3 of logits has NaN at column 7");
    ck_assert(ids[3] == 7 && ids[4] == 1); /* a NaN row's outputs: its first NaN, and NaN */
    tp_tensor ok = tp_tensor_rows(&t, 0, 3);
    ck_assert_int_eq(be->ops->argmax(be, &ok, ids, lp, NULL), TP_OK);

    tp_tensor bad = t;
    bad.dtype = TP_DTYPE_BF16;
    EXPECT_INVALID(be->ops->argmax(be, &bad, ids, lp, NULL), "argmax: logits is bfloat16");
    bad.dtype = TP_DTYPE_I32;
    EXPECT_INVALID(be->ops->argmax(be, &bad, ids, lp, NULL), "argmax: logits is int32");
    EXPECT_INVALID(be->ops->argmax(be, NULL, ids, lp, NULL), "argmax: logits is NULL");
    EXPECT_INVALID(be->ops->argmax(be, &ok, NULL, lp, NULL), "argmax: ids is NULL");
    bad = t;
    bad.cols = 0;
    EXPECT_INVALID(be->ops->argmax(be, &bad, ids, lp, NULL), "argmax: logits has 5 rows but no columns");
    bad = t;
    bad.stride = V - 1;
    EXPECT_INVALID(be->ops->argmax(be, &bad, ids, lp, NULL), "argmax: logits has stride 299");
    bad = t;
    bad.rows = 0;
    bad.data = NULL;
    ck_assert_int_eq(be->ops->argmax(be, &bad, NULL, NULL, NULL), TP_OK);
}
END_TEST

/* ---- invariances: batch composition and thread count change no bit ------------------------ */

/* Row i of x alone, at another alignment, gives the same bits as inside a batch of n. */
static void matmul_batch_invariance(tp_dtype wdt, int64_t n, int64_t k, int64_t m)
{
    mat x = mat_new(TP_DTYPE_F32, n, k, 0, -1, 1), w = mat_new(wdt, m, k, 2, -1, 1);
    mat bias = mat_new(wdt, 1, m, 0, -1, 1), y = mat_new(TP_DTYPE_F32, n, m, 0, -1, 1);
    ck_assert_int_eq(be->ops->matmul(be, &x.t, &w.t, &bias.t, &y.t), TP_OK);
    float *batch = mat_get(&y);
    static const int64_t subs[] = {1, 2, 3, 5, 17, 37, 64, 65};
    float *row = host_alloc((size_t)(k + 1) * sizeof(float));
    float *yr = host_alloc((size_t)(m * n) * sizeof(float));
    for (size_t s = 0; s < sizeof subs / sizeof subs[0]; s++) {
        int64_t sub = subs[s] < n ? subs[s] : n;
        for (int64_t i0 = 0; i0 + sub <= n; i0 += n - sub > 0 ? n - sub : 1) { /* first and last rows */
            tp_tensor xs = tp_tensor_rows(&x.t, i0, sub);
            const size_t bytes = (size_t)(sub * m) * sizeof(float);
            tp_tensor ys = tp_tensor_make(dev_alloc(bytes), TP_DTYPE_F32, sub, m);
            ck_assert_int_eq(be->ops->matmul(be, &xs, &w.t, &bias.t, &ys), TP_OK);
            ck_assert_int_eq(be->ops->download(be, yr, ys.data, bytes), TP_OK);
            ck_assert_msg(!memcmp(yr, batch + i0 * m, (size_t)(sub * m) * sizeof(float)),
                          "matmul %s: rows %lld..%lld alone differ from the batch of %lld",
                          tp_dtype_name(wdt), (long long)i0, (long long)(i0 + sub), (long long)n);
            if (i0 + sub >= n) break;
        }
    }
    /* one row copied to a buffer offset by one float: alignment changes nothing */
    float *xr = host_alloc((size_t)k * sizeof(float));
    for (int64_t i = 0; i < n; i += 7) {
        for (int64_t j = 0; j < k; j++) xr[j] = (float)x.ref[i * k + j];
        float *dx = dev_alloc((size_t)(k + 1) * sizeof(float));
        ck_assert_int_eq(be->ops->upload(be, dx + 1, xr, (size_t)k * sizeof(float)), TP_OK);
        tp_tensor x1 = tp_tensor_make(dx + 1, TP_DTYPE_F32, 1, k);
        tp_tensor y1 = tp_tensor_make(dev_alloc((size_t)m * sizeof(float)), TP_DTYPE_F32, 1, m);
        ck_assert_int_eq(be->ops->matmul(be, &x1, &w.t, &bias.t, &y1), TP_OK);
        ck_assert_int_eq(be->ops->download(be, row, y1.data, (size_t)m * sizeof(float)), TP_OK);
        ck_assert_msg(!memcmp(row, batch + i * m, (size_t)m * sizeof(float)),
                      "matmul %s: row %lld alone differs from the batch", tp_dtype_name(wdt),
                      (long long)i);
    }
}

START_TEST(matmul_batch_invariant)
{
    seed(11);
    for (int d = 0; d < N_WEIGHT_DTYPES; d++) {
        matmul_batch_invariance(weight_dtypes[d], 37, 130, 67);
        matmul_batch_invariance(weight_dtypes[d], 130, 2048, 33);
    }
}
END_TEST

START_TEST(matmul_thread_invariant)
{
    seed(12);
    for (int d = 0; d < N_WEIGHT_DTYPES; d++) {
        mat x = mat_new(TP_DTYPE_F32, 37, 515, 1, -1, 1);
        mat w = mat_new(weight_dtypes[d], 301, 515, 0, -1, 1);
        mat y = mat_new(TP_DTYPE_F32, 37, 301, 0, -1, 1);
        float *got[3];
        static const int threads[3] = {1, 2, 3};
        for (int t = 0; t < 3; t++) {
            set_threads(threads[t]);
            ck_assert_int_eq(be->ops->matmul(be, &x.t, &w.t, NULL, &y.t), TP_OK);
            got[t] = mat_get(&y);
        }
        for (int t = 1; t < 3; t++)
            ck_assert_msg(!memcmp(got[0], got[t], 37 * 301 * sizeof(float)),
                          "matmul %s: %d threads differ from 1", tp_dtype_name(weight_dtypes[d]),
                          threads[t]);
    }
}
END_TEST

/* Row results do not depend on the thread count nor on the rows around them. */
START_TEST(argmax_invariant)
{
    seed(18);
    const int64_t L = 37, V = 4099;
    const float *v = argmax_fill(L, V, 0, -10.0f, 10.0f, 0);
    tp_tensor t = logits_view(v, L, V, 0);
    int32_t ids[3][37];
    float lp[3][37];
    static const int threads[3] = {1, 2, 3};
    for (int k = 0; k < 3; k++) {
        set_threads(threads[k]);
        ck_assert_int_eq(be->ops->argmax(be, &t, ids[k], lp[k], NULL), TP_OK);
        ck_assert_msg(!memcmp(ids[0], ids[k], sizeof ids[0]) && !memcmp(lp[0], lp[k], sizeof lp[0]),
                      "argmax: %d threads differ from 1", threads[k]);
    }
    for (int64_t r = 0; r < L; r++) {
        tp_tensor one = tp_tensor_rows(&t, r, 1);
        int32_t id;
        float p;
        ck_assert_int_eq(be->ops->argmax(be, &one, &id, &p, NULL), TP_OK);
        ck_assert_msg(id == ids[0][r] && !memcmp(&p, &lp[0][r], sizeof p), "argmax: row %lld alone differs",
                      (long long)r);
    }
}
END_TEST

/* Sequence 1's tokens alone (a batch of 1 sequence) give the same bits as in the batch of 3. */
START_TEST(attention_batch_invariant)
{
    static const attn_case cases[] = {
        {TP_DTYPE_F32, 2, 2, 64, 16, 3, {10, 33, 0}, {10, 5, 1}, 0, 0},
        {TP_DTYPE_BF16, 1, 4, 17, 4, 3, {3, 40, 7}, {4, 1, 9}, 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        attn_state st;
        attention_run(&cases[c], 200 + c, &st);
        float *all = mat_get(&st.out);
        const int width = st.qh * cases[c].hd, qkv_cols = (int)st.qkv.t.cols;
        int idx[64], m = 0;
        for (int i = 0; i < st.n; i++)
            if (st.seq[i] == 1) idx[m++] = i;
        /* q rows of sequence 1 into their own matrix; seq, pos of those tokens */
        float *q = host_alloc((size_t)(m * width) * sizeof(float));
        int32_t seq[64], pos[64];
        for (int r = 0; r < m; r++) {
            for (int e = 0; e < width; e++) q[r * width + e] = (float)st.qkv.ref[idx[r] * qkv_cols + e];
            seq[r] = 1;
            pos[r] = st.pos[idx[r]];
        }
        const size_t bytes = (size_t)(m * width) * sizeof(float);
        tp_tensor qs = tp_tensor_make(dev_copy(q, bytes), TP_DTYPE_F32, m, width);
        tp_tensor os = tp_tensor_make(dev_alloc(bytes), TP_DTYPE_F32, m, width);
        tp_attn_batch sb = st.batch;
        sb.n_tokens = m;
        sb.seq = dev_copy(seq, (size_t)m * 4);
        sb.pos = dev_copy(pos, (size_t)m * 4);
        sb.slot = NULL;
        ck_assert_int_eq(be->ops->attention(be, &qs, &st.cache, &sb, st.qh, st.scale, &os), TP_OK);
        float *alone = host_alloc((size_t)(m * width) * sizeof(float));
        ck_assert_int_eq(be->ops->download(be, alone, os.data, bytes), TP_OK);
        for (int r = 0; r < m; r++)
            ck_assert_msg(!memcmp(alone + r * width, all + idx[r] * width, (size_t)width * 4),
                          "attention: token %d of sequence 1 alone differs from the batch", r);
        /* and 1 thread == 2 threads == 3 threads */
        float *t1 = NULL;
        for (int t = 1; t <= 3; t++) {
            set_threads(t);
            ck_assert_int_eq(be->ops->attention(be, &st.q, &st.cache, &st.batch, st.qh, st.scale,
                                                &st.out.t), TP_OK);
            float *now = mat_get(&st.out);
            if (t == 1) t1 = now;
            else ck_assert_msg(!memcmp(t1, now, (size_t)(st.n * width) * sizeof(float)),
                               "attention: %d threads differ from 1", t);
        }
    }
}
END_TEST

/* ---- argument checks ---------------------------------------------------------------------- */

START_TEST(matmul_errors)
{
    seed(13);
    mat x = mat_new(TP_DTYPE_F32, 4, 64, 0, -1, 1), w = mat_new(TP_DTYPE_BF16, 8, 128, 0, -1, 1);
    mat w64 = mat_new(TP_DTYPE_BF16, 8, 64, 0, -1, 1), y = mat_new(TP_DTYPE_F32, 4, 8, 0, -1, 1);
    mat xh = mat_new(TP_DTYPE_BF16, 4, 64, 0, -1, 1), bias = mat_new(TP_DTYPE_F32, 1, 9, 0, -1, 1);
    EXPECT_INVALID(be->ops->matmul(be, &x.t, &w.t, NULL, &y.t),
                   "matmul: x has 64 columns but w has 128");
    mat y5 = mat_new(TP_DTYPE_F32, 4, 5, 0, -1, 1);
    EXPECT_INVALID(be->ops->matmul(be, &x.t, &w64.t, NULL, &y5.t),
                   "matmul: y is [4, 5], expected [4, 8]");
    EXPECT_INVALID(be->ops->matmul(be, &x.t, &w64.t, &bias.t, &y.t), "matmul: bias is [1, 9]");
    EXPECT_INVALID(be->ops->matmul(be, &xh.t, &w64.t, NULL, &y.t), "matmul: x is bfloat16");
    EXPECT_INVALID(be->ops->matmul(be, NULL, &w64.t, NULL, &y.t), "matmul: x is NULL");
    tp_tensor bad = x.t;
    bad.stride = 10;
    EXPECT_INVALID(be->ops->matmul(be, &bad, &w64.t, NULL, &y.t), "matmul: x has stride 10");
    bad = w64.t;
    bad.dtype = TP_DTYPE_I32;
    EXPECT_INVALID(be->ops->matmul(be, &x.t, &bad, NULL, &y.t), "matmul: w is int32");
    bad = w64.t;
    bad.data = NULL;
    EXPECT_INVALID(be->ops->matmul(be, &x.t, &bad, NULL, &y.t), "matmul: w has no data");
    bad = x.t;
    bad.rows = -1;
    EXPECT_INVALID(be->ops->matmul(be, &bad, &w64.t, NULL, &y.t), "negative shape");
}
END_TEST

START_TEST(other_errors)
{
    seed(14);
    mat a = mat_new(TP_DTYPE_F32, 3, 16, 0, -1, 1), b16 = mat_new(TP_DTYPE_F32, 3, 16, 0, -1, 1);
    mat b15 = mat_new(TP_DTYPE_F32, 3, 15, 0, -1, 1), w16 = mat_new(TP_DTYPE_F32, 1, 16, 0, -1, 1);
    mat w8 = mat_new(TP_DTYPE_F32, 1, 8, 0, -1, 1), w5 = mat_new(TP_DTYPE_F32, 1, 5, 0, -1, 1);
    mat r4 = mat_new(TP_DTYPE_F32, 4, 16, 0, -1, 1);
    EXPECT_INVALID(be->ops->add_rmsnorm(be, &a.t, &b15.t, &w16.t, 1e-5f, &b16.t),
                   "add_rmsnorm: delta is [3, 15]");
    EXPECT_INVALID(be->ops->add_rmsnorm(be, &a.t, NULL, &w8.t, 1e-5f, &b16.t),
                   "add_rmsnorm: weight is [1, 8]");
    EXPECT_INVALID(be->ops->add_rmsnorm(be, &a.t, NULL, &w16.t, 1e-5f, &r4.t),
                   "add_rmsnorm: out is [4, 16]");
    EXPECT_INVALID(be->ops->head_rmsnorm(be, &a.t, 5, &w5.t, 1e-5f),
                   "head_rmsnorm: x has 16 columns");
    EXPECT_INVALID(be->ops->head_rmsnorm(be, &a.t, 0, &w5.t, 1e-5f), "head_rmsnorm");
    EXPECT_INVALID(be->ops->head_rmsnorm(be, &a.t, 8, &w5.t, 1e-5f),
                   "head_rmsnorm: weight is [1, 5]");
    int32_t pos[3] = {0, 1, 2};
    float inv[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    EXPECT_INVALID(be->ops->rope(be, &a.t, 3, pos, inv), "rope: head_dim 3");
    EXPECT_INVALID(be->ops->rope(be, &a.t, 32, pos, inv), "rope: head_dim 32");
    EXPECT_INVALID(be->ops->rope(be, &a.t, 8, NULL, inv), "rope");
    EXPECT_INVALID(be->ops->swiglu(be, &a.t, &b15.t, &b16.t), "swiglu: up is [3, 15]");
    EXPECT_INVALID(be->ops->geglu(be, &a.t, &b15.t, &b16.t), "geglu: up is [3, 15]");
    EXPECT_INVALID(be->ops->geglu(be, &a.t, &b16.t, &r4.t), "geglu: out is [4, 16]");
    EXPECT_INVALID(be->ops->swiglu(be, &a.t, &b16.t, &r4.t), "swiglu: out is [4, 16]");
    int32_t rows[2] = {0, 3};
    mat o2 = mat_new(TP_DTYPE_F32, 2, 16, 0, -1, 1), o2b = mat_new(TP_DTYPE_F32, 2, 15, 0, -1, 1);
    EXPECT_INVALID(be->ops->gather_rows(be, &a.t, rows, 2, &o2.t), "gather_rows: rows[1] is 3");
    EXPECT_INVALID(be->ops->gather_rows(be, &a.t, rows, 1, &o2.t),
                   "gather_rows: out is [2, 16], expected [1, 16]");
    EXPECT_INVALID(be->ops->gather_rows(be, &a.t, rows, 2, &o2b.t), "gather_rows: out is [2, 15]");
    EXPECT_INVALID(be->ops->gather_rows(be, &a.t, NULL, 2, &o2.t), "gather_rows: rows is NULL");
    int32_t ids[3] = {0, 1, 2};
    mat table = mat_new(TP_DTYPE_BF16, 10, 16, 0, -1, 1);
    EXPECT_INVALID(be->ops->embedding(be, ids, 3, &table.t, 0, &b15.t),
                   "embedding: out is [3, 15]");
    EXPECT_INVALID(be->ops->embedding(be, ids, 2, &table.t, 0, &a.t),
                   "embedding: out is [3, 16], expected [2, 16]");
    EXPECT_INVALID(be->ops->embedding(be, NULL, 3, &table.t, 0, &a.t), "embedding: ids is NULL");
    EXPECT_INVALID(be->ops->embedding(be, ids, 3, &table.t, 0, &table.t),
                   "embedding: out is bfloat16");
    EXPECT_INVALID(be->ops->convert(be, &a.t, &b15.t), "convert: dst is [3, 15]");
    tp_tensor ints = a.t;
    ints.dtype = TP_DTYPE_I32;
    EXPECT_INVALID(be->ops->convert(be, &ints, &b16.t), "convert: src is int32");
}
END_TEST

START_TEST(cache_errors)
{
    seed(15);
    const int kvh = 2, hd = 8, bs = 4, nb = 3, width = kvh * hd;
    const size_t bytes = (size_t)(nb * bs * width) * 4;
    tp_kv_layer cache = {dev_alloc(bytes), dev_alloc(bytes), TP_DTYPE_F32, nb, bs, kvh, hd};
    mat k = mat_new(TP_DTYPE_F32, 2, width, 0, -1, 1), v = mat_new(TP_DTYPE_F32, 2, width, 0, -1, 1);
    mat k15 = mat_new(TP_DTYPE_F32, 2, width - 1, 0, -1, 1);
    mat k3 = mat_new(TP_DTYPE_F32, 3, width, 0, -1, 1);
    int32_t seq[2] = {0, 0}, pos[2] = {0, 5}, slot[2] = {0, 5}, table[2] = {2, 1};
    tp_attn_batch b = {2, seq, pos, slot, table, 2, 8, 0, 0, 0};
    ck_assert_int_eq(be->ops->kv_store(be, &k.t, &v.t, &cache, &b), TP_OK);
    EXPECT_INVALID(be->ops->kv_store(be, &k15.t, &v.t, &cache, &b),
                   "kv_store: k is [2, 15], expected [2, 16]");
    EXPECT_INVALID(be->ops->kv_store(be, &k.t, &k3.t, &cache, &b), "kv_store: v is [3, 16]");
    int32_t far[2] = {0, nb * bs};
    tp_attn_batch bf = b;
    bf.slot = far;
    EXPECT_INVALID(be->ops->kv_store(be, &k.t, &v.t, &cache, &bf), "kv_store: token 1 has slot 12");
    tp_kv_layer bad = cache;
    bad.block_size = 0;
    EXPECT_INVALID(be->ops->kv_store(be, &k.t, &v.t, &bad, &b), "kv_store: cache has");
    bad = cache;
    bad.dtype = TP_DTYPE_I32;
    EXPECT_INVALID(be->ops->kv_store(be, &k.t, &v.t, &bad, &b), "kv_store: cache is int32");

    const int qh = 4;
    mat q = mat_new(TP_DTYPE_F32, 2, qh * hd, 0, -1, 1);
    mat out = mat_new(TP_DTYPE_F32, 2, qh * hd, 0, -1, 1);
    mat q3 = mat_new(TP_DTYPE_F32, 2, 3 * hd, 0, -1, 1);
    ck_assert_int_eq(be->ops->attention(be, &q.t, &cache, &b, qh, 0.3f, &out.t), TP_OK);
    EXPECT_INVALID(be->ops->attention(be, &q3.t, &cache, &b, 3, 0.3f, &out.t),
                   "attention: 3 q heads");
    EXPECT_INVALID(be->ops->attention(be, &q3.t, &cache, &b, qh, 0.3f, &out.t),
                   "attention: q is [2, 24], expected [2, 32]");
    EXPECT_INVALID(be->ops->attention(be, &q.t, &cache, &b, qh, 0.3f, &q3.t),
                   "attention: out is [2, 24]");
    tp_attn_batch ab = b;
    int32_t pos_far[2] = {0, 8};
    ab.pos = pos_far;
    EXPECT_INVALID(be->ops->attention(be, &q.t, &cache, &ab, qh, 0.3f, &out.t),
                   "attention: token 1 has position 8");
    ab = b;
    ab.max_pos = 100;
    int32_t pos_blocks[2] = {0, 9};
    ab.pos = pos_blocks;
    EXPECT_INVALID(be->ops->attention(be, &q.t, &cache, &ab, qh, 0.3f, &out.t), "logical block 2");
    ab = b;
    int32_t table_bad[2] = {2, 3};
    ab.block_table = table_bad;
    EXPECT_INVALID(be->ops->attention(be, &q.t, &cache, &ab, qh, 0.3f, &out.t), "physical block 3");
    ab = b;
    ab.softcap = -1.0f;
    EXPECT_INVALID(be->ops->attention(be, &q.t, &cache, &ab, qh, 0.3f, &out.t), "attention: batch has softcap -1");
    ab = b;
    int32_t seq_bad[2] = {0, -1};
    ab.seq = seq_bad;
    EXPECT_INVALID(be->ops->attention(be, &q.t, &cache, &ab, qh, 0.3f, &out.t),
                   "token 1 has sequence -1");
    ab = b;
    ab.n_tokens = 3;
    EXPECT_INVALID(be->ops->attention(be, &q.t, &cache, &ab, qh, 0.3f, &out.t),
                   "attention: q is [2, 32], expected [3, 32]");
    EXPECT_INVALID(be->ops->attention(be, &q.t, NULL, &b, qh, 0.3f, &out.t),
                   "attention: cache is NULL");
    EXPECT_INVALID(be->ops->attention(be, &q.t, &cache, NULL, qh, 0.3f, &out.t),
                   "attention: batch is NULL");
}
END_TEST

/* ---- greedy over TP ranks: each slice's winner and value, merged, is the row's argmax ------ */

START_TEST(argmax_merge_over_slices)
{
    seed(13);
    const int32_t L = 6, n = 5; /* L rows computed (a padded step), the first n read */
    const int64_t V = 103;
    float *v = host_alloc((size_t)(L * V) * sizeof(float));
    for (int tp = 1; tp <= 8; tp++) {
        const int64_t P = (V + tp - 1) / tp; /* vocab_pad: rank r holds [r P, min(V, (r+1) P)) */
        for (int64_t i = 0; i < L * V; i++) v[i] = (float)(rand_int(9) - 4); /* many ties */
        for (int64_t j = 0; j < V; j++) v[1 * V + j] = -INFINITY;           /* a row all -inf */
        v[2 * V + 0] = v[2 * V + V - 1] = 50.0f;                            /* first and last column tie */
        if (tp > 1) v[3 * V + P] = v[3 * V + P - 1] = 60.0f;                /* a tie across ranks 0 and 1 */
        int32_t *pairs = host_alloc((size_t)tp * 2 * (size_t)L * sizeof(int32_t));
        for (int r = 0; r < tp; r++) {
            const int64_t c0 = r * P, nc = V - c0 < P ? V - c0 : P;
            if (nc <= 0) continue; /* tp_model_can_argmax refuses such a split; skip it here too */
            tp_tensor slice = {v + c0, TP_DTYPE_F32, L, nc, V};
            int32_t *ids = pairs + (size_t)r * 2 * (size_t)L;
            ck_assert_int_eq(be->ops->argmax(be, &slice, ids, NULL, (float *)(ids + L)), TP_OK);
        }
        if ((int64_t)(tp - 1) * P >= V) continue;
        int32_t got[6], want[6];
        tp_argmax_merge(pairs, tp, L, n, P, got);
        tp_tensor whole = {v, TP_DTYPE_F32, n, V, V};
        ck_assert_int_eq(be->ops->argmax(be, &whole, want, NULL, NULL), TP_OK);
        for (int32_t i = 0; i < n; i++)
            ck_assert_msg(got[i] == want[i], "tp %d row %d: merged %d, argmax of the row %d", tp, i, got[i], want[i]);
    }
}
END_TEST

/* ---- sampling: the op is tp_sampler_sample_edited row by row ------------------------------ */

/* Row r's rule: a mix of greedy, temperature, top-k, top-p, min-p, penalties, banned ids and
 * logprobs; its tokens (prompt, output, banned) appended to toks. */
static tp_sample_row sample_rule(int r, int32_t V, int32_t *toks, int32_t *n_toks)
{
    tp_sample_row row;
    memset(&row, 0, sizeof row);
    row.temperature = (double[]){0.0, 0.7, 1.0, 1.3}[r % 4];
    row.top_p = (double[]){1.0, 0.9, 0.5, 1.0, 0.999}[r % 5];
    row.min_p = r % 6 == 5 ? 0.05 : 0.0;
    row.top_k = (int32_t[]){0, 5, 0, 50, -1, 1, 0}[r % 7];
    row.repetition_penalty = r % 3 == 1 ? 1.3 : 1.0;
    row.presence_penalty = r % 5 == 2 ? 0.5 : 0.0;
    row.frequency_penalty = r % 4 == 3 ? -0.7 : 0.0;
    row.seed = 1000u + (uint64_t)r * 77u;
    row.step = (uint64_t)r;
    row.n_logprobs = r % 8 == 6 ? -1 : (int32_t[]){0, 1, 5, 20}[r % 4]; /* -1: none wanted */
    row.tokens = *n_toks;
    row.n_prompt = 3 + r % 5;
    row.n_output = r % 4;
    for (int32_t k = 0; k < row.n_prompt + row.n_output; k++) toks[(*n_toks)++] = rand_int(k % 3 ? V : 8); /* repeats */
    row.banned = *n_toks;
    row.n_banned = r % 3 == 2 ? 2 : 0;
    for (int32_t k = 0; k < row.n_banned; k++) toks[(*n_toks)++] = rand_int(4); /* among the likely winners */
    row.allowed = *n_toks;
    row.n_allowed = r % 5 == 3 ? 12 : 0;
    for (int32_t k = 0; k < row.n_allowed; k++) toks[(*n_toks)++] = rand_int(V);
    row.bias = *n_toks; /* distinct ids, then the bits of their biases */
    row.n_bias = r % 4 == 1 ? 3 : 0;
    for (int32_t k = 0; k < row.n_bias; k++) {
        const float b = (float[]){9.0f, -100.0f, 2.5f}[k];
        toks[row.bias + k] = (r * 11 + k * 5) % V;
        memcpy(&toks[row.bias + row.n_bias + k], &b, sizeof b);
    }
    *n_toks += 2 * row.n_bias;
    return row;
}

START_TEST(sample_matches_sampler)
{
    seed(21);
    const int32_t L = 24, V = 300, stride = 307;
    float *x = host_alloc((size_t)L * stride * sizeof(float));
    for (int64_t i = 0; i < (int64_t)L * stride; i++) x[i] = uniform(-4.0f, 4.0f);
    for (int32_t j = 0; j < 4; j++) x[5 * stride + j] = x[6 * stride + j] = 6.0f; /* ties at the top */
    for (int32_t j = 0; j < V; j++) x[7 * stride + j] = (float)(rand_int(3)); /* heavy ties */
    for (int32_t j = 0; j < V; j++) x[8 * stride + j] = -INFINITY;           /* all -inf */
    for (int32_t j = 0; j < V; j++) x[9 * stride + j] = j == 77 ? 1.0f : -INFINITY; /* one finite */
    int32_t *toks = host_alloc(4096 * sizeof(int32_t)), n_toks = 0;
    tp_sample_row *rows = host_alloc((size_t)L * sizeof *rows);
    for (int32_t r = 0; r < L; r++) rows[r] = sample_rule(r, V, toks, &n_toks);
    tp_sample_out *out = host_alloc((size_t)(L + 1) * sizeof *out);
    out[L].token = 12345; /* past L: untouched */
    tp_tensor t = {x, TP_DTYPE_F32, L + 0, V, stride};
    tp_error_clear();
    ck_assert_msg(be->ops->sample(be, &t, L, rows, toks, out) == TP_OK, "%s", tp_error_message());
    ck_assert_int_eq(out[L].token, 12345);

    tp_sampler *smp = NULL;
    ck_assert_int_eq(tp_sampler_create(V, &smp), TP_OK);
    int drew = 0;
    for (int32_t r = 0; r < L; r++) {
        const tp_sample_row *w = &rows[r];
        tp_sampling_params p;
        tp_sampling_params_default(&p);
        p.temperature = w->temperature;
        p.top_k = w->top_k;
        p.top_p = w->top_p;
        p.min_p = w->min_p;
        p.repetition_penalty = w->repetition_penalty;
        p.presence_penalty = w->presence_penalty;
        p.frequency_penalty = w->frequency_penalty;
        p.seed = w->seed;
        p.logprobs = w->n_logprobs < 0 ? 0 : w->n_logprobs;
        tp_token_logprob top[TP_SAMPLE_MAX_LOGPROBS];
        tp_sample_result res = {0, 0.0f, 0, top};
        float bias[3];
        memcpy(bias, toks + w->bias + w->n_bias, (size_t)w->n_bias * sizeof(float));
        const tp_logit_edits ed = {toks + w->allowed, w->n_allowed, toks + w->banned, w->n_banned,
                                   toks + w->bias, bias, w->n_bias};
        ck_assert_int_eq(tp_sampler_sample_edited(smp, &p, w->step, x + (size_t)r * stride, &ed, toks + w->tokens,
                                                  w->n_prompt, toks + w->tokens + w->n_prompt, w->n_output, &res),
                         TP_OK);
        ck_assert_msg(out[r].token == res.token, "row %d: op %d, sampler %d", r, out[r].token, res.token);
        if (w->n_logprobs < 0) ck_assert(out[r].logprob == 0.0f); /* none wanted */
        else ck_assert(memcmp(&out[r].logprob, &res.logprob, sizeof(float)) == 0);
        ck_assert_int_eq(out[r].n_top, res.n_top);
        for (int32_t k = 0; k < res.n_top; k++) {
            ck_assert_int_eq(out[r].top_id[k], top[k].id);
            ck_assert(memcmp(&out[r].top_logprob[k], &top[k].logprob, sizeof(float)) == 0);
        }
        for (int32_t k = 0; k < w->n_banned; k++)
            if (x[(size_t)r * stride + 8] != -INFINITY) /* a live row never draws a banned id */
                ck_assert_int_ne(out[r].token, toks[w->banned + k]);
        if (w->n_allowed && r != 8) { /* nor one it does not allow */
            int allowed = 0;
            for (int32_t k = 0; k < w->n_allowed; k++) allowed |= out[r].token == toks[w->allowed + k];
            ck_assert_msg(allowed, "row %d drew %d, which it does not allow", r, out[r].token);
        }
        drew += w->temperature > 0.0 && w->top_k != 1;
    }
    ck_assert_int_gt(drew, 10);
    ck_assert_int_eq(out[8].token, 0);  /* all -inf: the greedy rule's token 0 */
    ck_assert_int_eq(out[9].token, 77); /* one finite value */
    tp_sampler_destroy(smp);

    /* a different vocabulary remakes the op's sampler */
    tp_tensor narrow = {x, TP_DTYPE_F32, 2, 40, stride};
    tp_sample_row plain[2] = {rows[0], rows[1]};
    for (int i = 0; i < 2; i++)
        plain[i].n_prompt = plain[i].n_output = plain[i].n_banned = plain[i].n_allowed = plain[i].n_bias = 0;
    ck_assert_int_eq(be->ops->sample(be, &narrow, 2, plain, NULL, out), TP_OK);
    ck_assert(out[0].token >= 0 && out[0].token < 40 && out[1].token >= 0 && out[1].token < 40);
    ck_assert_int_eq(be->ops->sample(be, &narrow, 0, NULL, NULL, NULL), TP_OK);
}
END_TEST

START_TEST(sample_errors)
{
    seed(22);
    const int32_t L = 4, V = 50;
    float *x = host_alloc((size_t)L * V * sizeof(float));
    for (int32_t i = 0; i < L * V; i++) x[i] = uniform(-1.0f, 1.0f);
    tp_sample_row rows[4];
    memset(rows, 0, sizeof rows);
    for (int r = 0; r < L; r++) {
        rows[r].temperature = 1.0;
        rows[r].top_p = 1.0;
        rows[r].repetition_penalty = 1.0;
        rows[r].seed = (uint64_t)r;
        rows[r].n_logprobs = 2;
    }
    int32_t toks[4] = {3, 9, 60, 1};
    tp_sample_out out[4];
    tp_tensor t = {x, TP_DTYPE_F32, L, V, V};

    /* NaN in row 2 at columns 30 and 7, +Inf in row 3; a banned NaN does not count */
    x[2 * V + 30] = NAN;
    x[2 * V + 7] = NAN;
    x[3 * V + 11] = INFINITY;
    EXPECT_NUMERIC(be->ops->sample(be, &t, L, rows, toks, out), "sample: row 2 of logits has NaN at column 7");
    ck_assert(out[2].token == 7 && isnan(out[2].logprob) && out[2].n_top == 0);
    ck_assert(out[3].token == 11 && isnan(out[3].logprob));
    ck_assert(out[0].token >= 0 && out[1].token >= 0 && out[0].n_top == 2); /* the others answered */
    x[2 * V + 30] = x[2 * V + 7] = 0.0f;
    EXPECT_NUMERIC(be->ops->sample(be, &t, L, rows, toks, out), "sample: row 3 of logits has +Inf at column 11");
    rows[3].banned = 3;
    rows[3].n_banned = 1;
    toks[3] = 11;
    ck_assert_int_eq(be->ops->sample(be, &t, L, rows, toks, out), TP_OK);
    ck_assert_int_ne(out[3].token, 11);

    /* a banned id or a penalty token outside the vocabulary; a parameter out of range */
    rows[1].banned = 2;
    rows[1].n_banned = 1;
    EXPECT_INVALID(be->ops->sample(be, &t, L, rows, toks, out), "sample: row 1: banned token 60");
    ck_assert(out[1].token == -1 && isnan(out[1].logprob));
    rows[1].n_banned = 0;
    rows[0].repetition_penalty = 1.2;
    rows[0].tokens = 0;
    rows[0].n_prompt = 3;
    EXPECT_INVALID(be->ops->sample(be, &t, L, rows, toks, out), "sample: row 0: prompt token 60 at position 2");
    rows[0].n_prompt = 2;
    ck_assert_int_eq(be->ops->sample(be, &t, L, rows, toks, out), TP_OK);
    rows[1].top_p = 1.5;
    EXPECT_INVALID(be->ops->sample(be, &t, L, rows, toks, out), "sample: row 1: top_p 1.5 is outside (0, 1]");
    rows[1].top_p = 1.0;
    rows[1].n_logprobs = 21;
    EXPECT_INVALID(be->ops->sample(be, &t, L, rows, toks, out), "sample: row 1: n_logprobs 21 is outside [-1, 20]");
    rows[1].n_logprobs = -2;
    EXPECT_INVALID(be->ops->sample(be, &t, L, rows, toks, out), "sample: row 1: n_logprobs -2 is outside [-1, 20]");
    rows[1].n_logprobs = 0;
    EXPECT_INVALID(be->ops->sample(be, &t, L, rows, NULL, out), "sample: row 0: the row has tokens but the tokens array is NULL");

    /* the shared checks */
    EXPECT_INVALID(be->ops->sample(be, &t, 5, rows, toks, out), "sample: L is 5; logits has 4 rows");
    EXPECT_INVALID(be->ops->sample(be, &t, L, NULL, toks, out), "sample: rows or out is NULL");
    EXPECT_INVALID(be->ops->sample(be, NULL, L, rows, toks, out), "sample: logits is NULL");
    tp_tensor bf = t;
    bf.dtype = TP_DTYPE_BF16;
    EXPECT_INVALID(be->ops->sample(be, &bf, L, rows, toks, out), "sample: logits is bfloat16");
    tp_tensor empty = {x, TP_DTYPE_F32, L, 0, 0};
    EXPECT_INVALID(be->ops->sample(be, &empty, 2, rows, toks, out), "sample: logits has 2 rows to sample but no columns");
}
END_TEST

/* Rows spread over threads answer as on one thread, bit for bit, failed rows included, and
 * the message names the lowest failed row (made again on the calling thread). */
START_TEST(sample_thread_invariant)
{
    seed(23);
    enum { L = 40, V = 2000 }; /* L x V above the op's threshold for threads */
    float *x = host_alloc((size_t)L * V * sizeof(float));
    for (int64_t i = 0; i < (int64_t)L * V; i++) x[i] = uniform(-6.0f, 6.0f);
    int32_t *toks = host_alloc(8192 * sizeof(int32_t)), n_toks = 0;
    tp_sample_row *rows = host_alloc((size_t)L * sizeof *rows);
    for (int32_t r = 0; r < L; r++) rows[r] = sample_rule(r, V, toks, &n_toks);
    tp_tensor t = {x, TP_DTYPE_F32, L, V, V};
    tp_sample_out *one = host_alloc((size_t)L * sizeof *one), *many = host_alloc((size_t)L * sizeof *many);
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* failures in rows 33 (a banned id outside), 17 (NaN), 25 (+Inf) */
            x[17 * V + 1500] = NAN;
            x[17 * V + 900] = NAN;
            x[25 * V + 3] = INFINITY;
            toks[rows[33].tokens] = V + 7;
            rows[33].repetition_penalty = 1.2;
        }
        const int32_t want = round ? TP_ERR_NUMERIC : TP_OK;
        const char *needle = round ? "sample: row 17 of logits has NaN at column 900" : "";
        set_threads(1);
        memset(one, 0xab, (size_t)L * sizeof *one);
        EXPECT_STATUS(be->ops->sample(be, &t, L, rows, toks, one), want, needle);
        for (int nt = 2; nt <= 4; nt++) {
            set_threads(nt);
            /* filled as one: what the op leaves alone (top entries past n_top) stays equal */
            memset(many, 0xab, (size_t)L * sizeof *many);
            EXPECT_STATUS(be->ops->sample(be, &t, L, rows, toks, many), want, needle);
            for (int32_t r = 0; r < L; r++) /* NaN logprobs compare by their bits too */
                ck_assert_msg(memcmp(&one[r], &many[r], sizeof one[r]) == 0, "round %d, %d threads: row %d differs",
                              round, nt, (int)r);
        }
        if (round == 1) {
            ck_assert(one[17].token == 900 && isnan(one[17].logprob) && one[25].token == 3 && one[33].token == -1);
            ck_assert(one[16].token >= 0 && !isnan(one[16].logprob)); /* the others answered */
        }
    }
    /* a later call on the same threads starts clean */
    x[17 * V + 1500] = x[17 * V + 900] = x[25 * V + 3] = 0.0f;
    rows[33].repetition_penalty = 1.0;
    set_threads(4);
    EXPECT_STATUS(be->ops->sample(be, &t, L, rows, toks, many), TP_OK, "");
}
END_TEST

/* ---- the fused operations are their compositions, bit for bit --------------------------- */

START_TEST(fused_ops)
{
    seed(12);
    /* matmul_swiglu = matmul into gate_up, then swiglu of its halves */
    const int64_t n = 5, k = 24, m = 7;
    mat x = mat_new(TP_DTYPE_F32, n, k, 0, -1, 1), w = mat_new(TP_DTYPE_BF16, 2 * m, k, 0, -1, 1);
    mat bias = mat_new(TP_DTYPE_F32, 1, 2 * m, 0, -1, 1);
    mat gu = mat_new(TP_DTYPE_F32, n, 2 * m, 0, 0, 1), gu2 = mat_new(TP_DTYPE_F32, n, 2 * m, 0, 0, 1);
    mat fused = mat_new(TP_DTYPE_F32, n, m, 2, 0, 1), plain = mat_new(TP_DTYPE_F32, n, m, 2, 0, 1);
    ck_assert_int_eq(be->ops->matmul_swiglu(be, &x.t, &w.t, &bias.t, &gu.t, &fused.t), TP_OK);
    ck_assert_int_eq(be->ops->matmul(be, &x.t, &w.t, &bias.t, &gu2.t), TP_OK);
    tp_tensor g = tp_tensor_cols(&gu2.t, 0, m), u = tp_tensor_cols(&gu2.t, m, m);
    ck_assert_int_eq(be->ops->swiglu(be, &g, &u, &plain.t), TP_OK);
    ck_assert_mem_eq(mat_get(&fused), mat_get(&plain), (size_t)(n * m) * sizeof(float));
    assert_guards(&fused);
    mat odd = mat_new(TP_DTYPE_BF16, 2 * m + 1, k, 0, -1, 1);
    EXPECT_INVALID(be->ops->matmul_swiglu(be, &x.t, &odd.t, NULL, &gu.t, &fused.t), "gate and up need an even count");

    /* matmul_add = matmul's product added to y: the residual's sums with and without it */
    mat res = mat_new(TP_DTYPE_F32, n, 2 * m, 3, -4, 4), prod = mat_new(TP_DTYPE_F32, n, 2 * m, 0, 0, 1);
    float *before = mat_get(&res), *want = host_alloc((size_t)(n * 2 * m) * sizeof(float));
    ck_assert_int_eq(be->ops->matmul(be, &x.t, &w.t, NULL, &prod.t), TP_OK);
    const float *p = mat_get(&prod);
    for (int64_t i = 0; i < n * 2 * m; i++) want[i] = before[i] + p[i];
    ck_assert_int_eq(be->ops->matmul_add(be, &x.t, &w.t, &res.t), TP_OK);
    ck_assert_mem_eq(mat_get(&res), want, (size_t)(n * 2 * m) * sizeof(float));
    assert_guards(&res);
    EXPECT_INVALID(be->ops->matmul_add(be, &x.t, &w.t, &fused.t), "matmul_add");

    /* qk_rope_store = head_rmsnorm of q and k, rope of both, kv_store */
    const int32_t hq = 4, hk = 2, hd = 8, T = 3, width = (hq + 2 * hk) * hd;
    float inv[4] = {1.0f, 0.1f, 0.01f, 0.001f};
    int32_t pos[3] = {0, 5, 9}, slot[3] = {3, -1, 6};
    const float *dinv = dev_copy(inv, sizeof inv);
    const int32_t *dpos = dev_copy(pos, sizeof pos), *dslot = dev_copy(slot, sizeof slot);
    tp_attn_batch b = {T, NULL, dpos, dslot, NULL, 0, 0, 0, 0, 0};
    mat qn = mat_new(TP_DTYPE_F32, 1, hd, 0, 0.5f, 1.5f), kn = mat_new(TP_DTYPE_F32, 1, hd, 0, 0.5f, 1.5f);
    mat qkv[2];
    tp_kv_layer cache[2];
    qkv[0] = mat_new(TP_DTYPE_F32, T, width, 0, -2, 2);
    qkv[1] = qkv[0];
    qkv[1].t.data = dev_copy(mat_get(&qkv[0]), (size_t)(T * width) * sizeof(float));
    const size_t cb = (size_t)2 * 4 * hk * hd * sizeof(float); /* 2 blocks of 4 */
    for (int c = 0; c < 2; c++) {
        tp_kv_layer L = {dev_alloc(cb), dev_alloc(cb), TP_DTYPE_F32, 2, 4, hk, hd};
        ck_assert_int_eq(be->ops->memset0(be, L.k, cb), TP_OK);
        ck_assert_int_eq(be->ops->memset0(be, L.v, cb), TP_OK);
        cache[c] = L;
    }
    for (int c = 0; c < 2; c++) {
        tp_tensor q = tp_tensor_cols(&qkv[c].t, 0, hq * hd), kk = tp_tensor_cols(&qkv[c].t, hq * hd, hk * hd);
        tp_tensor v = tp_tensor_cols(&qkv[c].t, (hq + hk) * hd, hk * hd);
        if (c == 0) {
            ck_assert_int_eq(be->ops->qk_rope_store(be, &q, &kk, &v, &qn.t, &kn.t, 1e-6f, hd, dinv, &cache[0], &b),
                             TP_OK);
        } else {
            ck_assert_int_eq(be->ops->head_rmsnorm(be, &q, hd, &qn.t, 1e-6f), TP_OK);
            ck_assert_int_eq(be->ops->head_rmsnorm(be, &kk, hd, &kn.t, 1e-6f), TP_OK);
            ck_assert_int_eq(be->ops->rope(be, &q, hd, dpos, dinv), TP_OK);
            ck_assert_int_eq(be->ops->rope(be, &kk, hd, dpos, dinv), TP_OK);
            ck_assert_int_eq(be->ops->kv_store(be, &kk, &v, &cache[1], &b), TP_OK);
        }
    }
    ck_assert_mem_eq(qkv[0].t.data, qkv[1].t.data, (size_t)(T * width) * sizeof(float));
    ck_assert_mem_eq(cache[0].k, cache[1].k, cb);
    ck_assert_mem_eq(cache[0].v, cache[1].v, cb);
    tp_tensor q = tp_tensor_cols(&qkv[0].t, 0, hq * hd), kk = tp_tensor_cols(&qkv[0].t, hq * hd, hk * hd);
    EXPECT_INVALID(be->ops->qk_rope_store(be, &q, &kk, &kk, &qn.t, NULL, 1e-6f, hd, dinv, &cache[0], &b),
                   "qk_rope_store: q_norm without k_norm");

    /* staging: two buffers; an upload from anywhere else is refused */
    void *s1 = NULL, *s2 = NULL;
    ck_assert_int_eq(be->ops->staging(be, 64, &s1), TP_OK);
    ck_assert_int_eq(be->ops->staging(be, 64, &s2), TP_OK);
    ck_assert_ptr_ne(s1, s2);
    memset(s1, 7, 64);
    void *d = dev_alloc(64);
    ck_assert_int_eq(be->ops->upload_staged(be, d, s1, 64), TP_OK);
    ck_assert_mem_eq(d, s1, 64);
    char elsewhere[64] = {0};
    EXPECT_INVALID(be->ops->upload_staged(be, d, elsewhere, 64), "not inside a staging buffer");
    ck_assert_int_eq(be->ops->staging(be, 0, NULL), TP_OK); /* released */
    EXPECT_INVALID(be->ops->upload_staged(be, d, s1, 64), "not inside a staging buffer");
    ck_assert_int_eq(be->ops->staging(be, 16, &s1), TP_OK); /* and made again on demand */
    ck_assert_int_eq(be->ops->upload_staged(be, d, s1, 16), TP_OK);
    /* no graphs on the CPU: the forward runs every step eagerly */
    ck_assert_ptr_null(be->ops->graph_begin);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backend_cpu");
    TCase *tc;
    struct {
        const char *name;
        const TTest *tests[8];
    } groups[] = {
        {"memory", {create_fields, memory}},
        {"matmul", {matmul_shapes, matmul_empty}},
        {"norms", {add_rmsnorm_shapes, head_rmsnorm_shapes}},
        {"rope", {rope_shapes}},
        {"attention", {attention_cases, kv_store_padding_slot}},
        {"elementwise", {swiglu_shapes, softcap_cases, gather_rows_cases, embedding_cases, convert_cases}},
        {"fused", {fused_ops}},
        {"argmax", {argmax_cases, argmax_limits, argmax_errors, argmax_merge_over_slices}},
        {"sample", {sample_matches_sampler, sample_errors, sample_thread_invariant}},
        {"invariance", {matmul_batch_invariant, matmul_thread_invariant, attention_batch_invariant,
                        argmax_invariant}},
        {"errors", {matmul_errors, other_errors, cache_errors}},
    };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        tc = tcase_create(groups[g].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        for (int t = 0; t < 8 && groups[g].tests[t]; t++) tcase_add_test(tc, groups[g].tests[t]);
        suite_add_tcase(s, tc);
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
