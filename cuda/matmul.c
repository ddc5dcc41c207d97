/*
 * matmul.c: y [n, m] = x [n, k] @ w [m, k]^T + bias through cuBLASLt, f32 accumulation
 * (CUBLAS_COMPUTE_32F: no TF32, so f32 inputs give f32 products, as on the CPU).
 *
 * Row-major to column-major: a row-major [r, c] matrix with stride ld is a column-major
 * (c x r) matrix with leading dimension ld. So y^T (m x n, ld = y.stride) = w (m x k) .
 * x^T (k x n): A = w's memory as a (k x m) matrix with op T, B = x's memory as (k x n)
 * with op N, D = y's memory as (m x n). Column views of wider matrices are strides.
 *
 * cuBLASLt multiplies A and B of one type and writes D of that type or f32. So:
 *  - x and w of one dtype (the usual case, bf16 x bf16): multiplied as they are;
 *  - x and w of different dtypes: both are taken to f32 (f32 weights with bf16
 *    activations: x widened; bf16 weights with f32 activations: w widened, tile by tile),
 *    never rounded to the narrower type, so the result is the CPU backend's up to order;
 *  - y of a third dtype (neither the product type nor f32): D is an f32 tile, then
 *    converted into y.
 * For n <= 8 rows (decode) the time is that of reading w once. cuBLASLt reads it at 3.4 to
 * 4.4 TB/s on an H200 (bench/RESULTS.md), faster than gemv.cu's kernel on all but the
 * smallest products (an 8B model's o: 32 MiB), so by default every
 * product goes to cuBLASLt, the MLP's gate|up product too, then swiglu.cu: on an H200 at
 * tp=1 that is 4-10 % faster a decode step at 1 to 8 rows than the GEMV that applies SwiGLU
 * as it writes. The GEMV takes the shapes it fits (tp_cuda_gemv_fits: dtypes, 16-byte
 * alignment) where TPINFER_GEMV was set when the state was created: "all" for every product
 * of up to 8 rows but the adds (the engine sets it at tp > 1, where the slices are small
 * enough that the GEMV wins), "one" for every product of one row, the adds by its add form
 * (TPINFER_GEMV_ONE_MAX_MB: those of at most that many MiB of weights; a small model's
 * batch-1 step gains, its kernels overlapping under PDL where cuBLASLt's do not), any other
 * value but 0 for the fused gate|up + SwiGLU alone (bench/gpu_matmul compares them). Where it
 * is unset, the warm-up times the batch-1 decode step both ways and keeps the faster
 * (tp_cuda_gemm_one_row: "one" or none): timing each product alone would miss the overlap.
 * Conversions go through a fixed scratch buffer in tiles of rows, all on the stream.
 * The bias is written into D first (bias_fill) and the product added with beta = 1, so a
 * biased 16-bit output is rounded once. Algorithms are chosen once per (types, shape,
 * leading dimensions, pointer alignments) with cublasLtMatmulAlgoGetHeuristic and kept in
 * a hashed table of 256 (TPINFER_LOG=debug reports the queries and their host time).
 *
 * Tuning in place (tp_cuda_gemm_tune, the warm-up's eager steps): a 16-bit shape first seen
 * while tuning gets the heuristic's first TUNE_CANDIDATES algorithms, and its calls take them
 * in turn, each candidate's first call untimed (its kernel may load then), the next
 * TUNE_SAMPLES timed with a pair of events; when tuning ends the one with the lowest median
 * stays (the heuristic's first unless another is 3 % faster; a candidate with fewer than two
 * timed calls is not compared). A shape needs TUNE_CALLS calls to time them all, which the
 * warm-up gives decode's shapes by repeating its steps where a model has fewer layers
 * (tp_cuda_gemm_tune says how many). The events time the GPU, which
 * in these steps runs behind the host, so the host's own call costs stay outside.
 * In place, because a product's time depends on its neighbours: a decode step calls each
 * layer's product once, with other weights streaming in between, so its own weights are
 * never in L2; timed alone in a loop they are, and earlier attempts that timed candidates in
 * isolation (with an L2 flush by memset) chose algorithms that were slower in the step.
 */
#include "matmul.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* cublasLt.h declares one function without a prototype (cublasLtLoggerForceDisable()) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "cuda_check.h"
#include "kernels.h"
#include "log.h"

#define TP_CUBLAS_GOTO(call, st, label)                                                           \
    do {                                                                                          \
        cublasStatus_t tp_cublas_st_ = (call);                                                    \
        if (tp_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                             \
            (st) = tp_error(TP_ERR_CUBLAS, "%s failed: %s", #call,                                \
                            cublasLtGetStatusString(tp_cublas_st_));                              \
            goto label;                                                                           \
        }                                                                                         \
    } while (0)

#define ALGO_PROBE 8
#define ALGO_CACHE 256 /* a power of two: the table is open-addressed by the key's hash */
#define TUNE_CANDIDATES 8
#define TUNE_SAMPLES 3 /* timed calls of each candidate, after an untimed one: 8 x 4 = one call per layer of a 32-layer step */
#define TUNE_CALLS (TUNE_CANDIDATES * (1 + TUNE_SAMPLES)) /* a shape's calls that time every candidate */
#define TUNE_MARGIN 0.97 /* another candidate replaces the heuristic's first when this much faster */

/* What an algorithm was chosen for (zero-filled, so memcmp compares it). */
typedef struct gemm_key {
    int32_t ab_type, d_type;
    int64_t m, n, k, lda, ldb, ldd;
    uint32_t align_a, align_b, align_d, unused;
} gemm_key;

/* A shape being tuned: its candidates, and each one's timed calls (event pairs). */
typedef struct tune_state {
    int n_cand, next; /* candidates; the one the next call takes */
    cublasLtMatmulAlgo_t cand[TUNE_CANDIDATES];
    int warm[TUNE_CANDIDATES];    /* its untimed first call made */
    int samples[TUNE_CANDIDATES]; /* its timed calls */
    cudaEvent_t ev[TUNE_CANDIDATES][TUNE_SAMPLES][2];
} tune_state;

typedef struct algo_entry {
    gemm_key key;
    cublasLtMatmulAlgo_t algo;
    int valid;
    tune_state *tune; /* while the state tunes and this shape has more than one candidate */
} algo_entry;

struct tp_cuda_gemm {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    void *scratch;
    size_t scratch_bytes;
    algo_entry algos[ALGO_CACHE];
    int next; /* where the next new algorithm goes when its probe run is full */
    int queries;          /* heuristic queries made, and their host time: TPINFER_LOG=debug */
    double query_seconds; /* prints them when the state is destroyed */
    int tuning;           /* tp_cuda_gemm_tune(g, 1) .. (g, 0) */
    int sms;  /* multiprocessors of the device (the GEMV's grid) */
    int gemv; /* 0 (TPINFER_GEMV unset or 0): no product takes the GEMV; 2 (all): every one it fits
               * but the adds; 3 (one): every one of one row it fits, adds included; 1 (any other
               * value): the fused gate/up+SwiGLU alone */
    int gemv_env; /* TPINFER_GEMV was set: tp_cuda_gemm_one_row leaves gemv as it is */
    size_t gemv_one_max; /* 3: only products of at most this many bytes of weights (TPINFER_GEMV_ONE_MAX_MB) */
};

/* One cuBLASLt call: D (m x n, ld ldd) = A^T . B (+ D when beta = 1), column-major. */
typedef struct gemm_args {
    tp_dtype ab;      /* A and B */
    const void *a;    /* w: (k x m), lda */
    int64_t lda;
    const void *b;    /* x: (k x n), ldb */
    int64_t ldb;
    tp_dtype d;       /* D (and C, the same memory) */
    void *dptr;       /* y: (m x n), ldd */
    int64_t ldd;
    int64_t m, n, k;
    float beta;       /* 0, or 1 to add to what D holds */
} gemm_args;

static cudaDataType_t cuda_type(tp_dtype dt)
{
    switch (dt) {
    case TP_DTYPE_F16: return CUDA_R_16F;
    case TP_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

/* The largest power of two <= 256 that divides the address (cuBLASLt's MIN_ALIGNMENT). */
static uint32_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

// ----------------------------------------------------------------------------
// state

static void tune_free(tune_state *t);

/* TPINFER_GEMV_ONE_MAX_MB, in bytes; unset: no bound (a value that is not a count of MiB
 * from 1 to 2^20 is said and ignored) */
static size_t gemv_one_max(void)
{
    const char *v = getenv("TPINFER_GEMV_ONE_MAX_MB");
    if (!v || !*v) return SIZE_MAX;
    char *end;
    const long mb = strtol(v, &end, 10);
    if (*end || mb < 1 || mb > (1L << 20)) {
        tp_log(TP_LOG_WARN, "TPINFER_GEMV_ONE_MAX_MB='%s' is not a count of MiB from 1 to 1048576; no bound", v);
        return SIZE_MAX;
    }
    return (size_t)mb << 20;
}

tp_status tp_cuda_gemm_create(size_t workspace_bytes, size_t scratch_bytes, tp_cuda_gemm **out)
{
    *out = NULL;
    tp_cuda_gemm *g = calloc(1, sizeof *g);
    if (!g) return tp_error(TP_ERR_OOM, "out of memory creating the cuBLASLt state");
    tp_status st = TP_OK;
    TP_CUBLAS_GOTO(cublasLtCreate(&g->lt), st, fail);
    cudaError_t err = cudaMalloc(&g->workspace, workspace_bytes);
    if (err == cudaSuccess) err = cudaMalloc(&g->scratch, scratch_bytes);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        st = tp_error(err == cudaErrorMemoryAllocation ? TP_ERR_OOM : TP_ERR_CUDA,
                      "cudaMalloc of the matmul workspace (%zu + %zu bytes) failed: %s", workspace_bytes,
                      scratch_bytes, cudaGetErrorString(err));
        goto fail;
    }
    g->workspace_bytes = workspace_bytes;
    g->scratch_bytes = scratch_bytes;
    int device = 0;
    TP_CUDA_CHECK_GOTO(cudaGetDevice(&device), st, fail);
    TP_CUDA_CHECK_GOTO(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, device), st, fail);
    const char *env = getenv("TPINFER_GEMV");
    g->gemv = !env || !*env || !strcmp(env, "0") ? 0 : !strcmp(env, "all") ? 2 : !strcmp(env, "one") ? 3 : 1;
    g->gemv_env = env && *env;
    g->gemv_one_max = gemv_one_max();
    *out = g;
    return TP_OK;
fail:
    tp_cuda_gemm_destroy(g);
    return st;
}

void tp_cuda_gemm_destroy(tp_cuda_gemm *g)
{
    if (!g) return;
    if (g->queries)
        tp_log(TP_LOG_DEBUG, "cuBLASLt: %d algorithm queries (one per new shape), %.1f ms of host time", g->queries,
               1e3 * g->query_seconds);
    for (int i = 0; i < ALGO_CACHE; i++) tune_free(g->algos[i].tune);
    if (g->workspace) cudaFree(g->workspace);
    if (g->scratch) cudaFree(g->scratch);
    if (g->lt) cublasLtDestroy(g->lt);
    free(g);
}

// ----------------------------------------------------------------------------
// one cuBLASLt matmul, its algorithm from the table or from the heuristic

static void tune_free(tune_state *t)
{
    if (!t) return;
    for (int c = 0; c < t->n_cand; c++)
        for (int r = 0; r < TUNE_SAMPLES; r++)
            for (int e = 0; e < 2; e++)
                if (t->ev[c][r][e]) cudaEventDestroy(t->ev[c][r][e]);
    free(t);
}

/* Whether the stream is being recorded into a graph (or cannot say: then no tuning either). */
static int recording(cudaStream_t stream)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* The algorithm of this call, and when it is a timed call of a shape being tuned, the pair of
 * events to record around it (else ev[0] = ev[1] = NULL). */
static tp_status find_algo(tp_cuda_gemm *g, const gemm_args *a, cublasLtMatmulDesc_t op,
                           cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                           cublasLtMatrixLayout_t ld, cudaStream_t stream, cublasLtMatmulAlgo_t *algo,
                           cudaEvent_t ev[2])
{
    ev[0] = ev[1] = NULL;
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.ab_type = (int32_t)a->ab;
    key.d_type = (int32_t)a->d;
    key.m = a->m;
    key.n = a->n;
    key.k = a->k;
    key.lda = a->lda;
    key.ldb = a->ldb;
    key.ldd = a->ldd;
    key.align_a = alignment(a->a);
    key.align_b = alignment(a->b);
    key.align_d = alignment(a->dptr);
    /* FNV-1a over the key, then a short linear probe */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof key; i++) h = (h ^ ((const unsigned char *)&key)[i]) * 1099511628211ull;
    int slot = -1;
    for (int p = 0; p < ALGO_PROBE; p++) {
        algo_entry *c = &g->algos[(h + (uint64_t)p) % ALGO_CACHE];
        if (!c->valid) {
            if (slot < 0) slot = (int)((h + (uint64_t)p) % ALGO_CACHE);
            continue;
        }
        if (!memcmp(&c->key, &key, sizeof key)) {
            tune_state *t = c->tune;
            *algo = c->algo;
            if (t && recording(stream)) t = NULL; /* a recording keeps the heuristic's first, and no events */
            if (t) { /* the candidates in turn: one untimed call (its kernel's first launch), then
                      * TUNE_SAMPLES timed ones; after that, the heuristic's first */
                const int cand = t->next;
                if (!t->warm[cand]) {
                    *algo = t->cand[cand];
                    t->warm[cand] = 1;
                } else if (t->samples[cand] < TUNE_SAMPLES) {
                    cudaEvent_t *pair = t->ev[cand][t->samples[cand]];
                    if (!pair[0] && cudaEventCreate(&pair[0]) != cudaSuccess) pair[0] = NULL;
                    if (!pair[1] && cudaEventCreate(&pair[1]) != cudaSuccess) pair[1] = NULL;
                    if (pair[0] && pair[1]) {
                        *algo = t->cand[cand];
                        ev[0] = pair[0];
                        ev[1] = pair[1];
                        t->samples[cand]++;
                    } else {
                        (void)cudaGetLastError(); /* no events: this call untimed */
                    }
                }
                t->next = (cand + 1) % t->n_cand;
            }
            return TP_OK;
        }
    }
    if (slot < 0) { /* the probe run is full: replace one of it in turn */
        slot = (int)((h + (uint64_t)g->next) % ALGO_CACHE);
        g->next = (g->next + 1) % ALGO_PROBE;
    }
    /* tuned: 16-bit products first seen while tuning, outside a graph recording */
    const int tune = g->tuning && (a->ab == TP_DTYPE_BF16 || a->ab == TP_DTYPE_F16) && !recording(stream);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    tp_status st = TP_OK;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[TUNE_CANDIDATES];
    int found = 0;
    uint64_t ws = g->workspace_bytes;
    memset(res, 0, sizeof res);
    TP_CUBLAS_GOTO(cublasLtMatmulPreferenceCreate(&pref), st, done);
    TP_CUBLAS_GOTO(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                        sizeof ws), st, done);
    TP_CUBLAS_GOTO(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                        &key.align_a, sizeof key.align_a), st, done);
    TP_CUBLAS_GOTO(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                        &key.align_b, sizeof key.align_b), st, done);
    TP_CUBLAS_GOTO(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                        &key.align_d, sizeof key.align_d), st, done);
    TP_CUBLAS_GOTO(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                        &key.align_d, sizeof key.align_d), st, done);
    cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(g->lt, op, la, lb, ld, ld, pref, tune ? TUNE_CANDIDATES : 1, res, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found < 1 || res[0].state != CUBLAS_STATUS_SUCCESS) {
        st = tp_error(TP_ERR_CUBLAS,
                      "matmul: cuBLASLt has no algorithm for %s x %s -> %s with m=%lld n=%lld k=%lld, "
                      "leading dimensions %lld/%lld/%lld, alignments %u/%u/%u bytes (%s)",
                      tp_dtype_name(a->ab), tp_dtype_name(a->ab), tp_dtype_name(a->d), (long long)a->m,
                      (long long)a->n, (long long)a->k, (long long)a->lda, (long long)a->ldb,
                      (long long)a->ldd, key.align_a, key.align_b, key.align_d,
                      cublasLtGetStatusString(hs != CUBLAS_STATUS_SUCCESS ? hs : res[0].state));
        goto done;
    }
    *algo = res[0].algo;
    algo_entry *e = &g->algos[slot];
    tune_free(e->tune);
    memset(e, 0, sizeof *e);
    e->key = key;
    e->algo = res[0].algo;
    e->valid = 1;
    if (tune && found > 1) {
        tune_state *t = calloc(1, sizeof *t);
        if (t) { /* without it the shape keeps the heuristic's first */
            for (int c = 0; c < found; c++)
                if (res[c].state == CUBLAS_STATUS_SUCCESS && res[c].workspaceSize <= g->workspace_bytes)
                    t->cand[t->n_cand++] = res[c].algo;
            if (t->n_cand > 1) e->tune = t;
            else free(t);
        }
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    g->queries++;
    g->query_seconds += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return st;
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The median of a candidate's timed calls in microseconds, or -1 when it has fewer than
 * two (or a time could not be read). */
static double tune_median(tune_state *t, int c)
{
    float us[TUNE_SAMPLES];
    const int n = t->samples[c];
    if (n < 2) return -1.0;
    for (int r = 0; r < n; r++) {
        float ms = 0.0f;
        if (cudaEventSynchronize(t->ev[c][r][1]) != cudaSuccess ||
            cudaEventElapsedTime(&ms, t->ev[c][r][0], t->ev[c][r][1]) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1.0;
        }
        us[r] = 1e3f * ms;
    }
    qsort(us, (size_t)n, sizeof us[0], cmp_float);
    return n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
}

int tp_cuda_gemm_one_row(tp_cuda_gemm *g, int gemv)
{
    if (g->gemv_env) return 0;
    g->gemv = gemv ? 3 : 0;
    return 1;
}

tp_status tp_cuda_gemm_tune(tp_cuda_gemm *g, int on, int *count)
{
    if (count) *count = on ? TUNE_CALLS : 0;
    if (on) {
        g->tuning = 1;
        return TP_OK;
    }
    g->tuning = 0;
    int tuned = 0, changed = 0;
    double first_us = 0.0, best_us = 0.0;
    for (int i = 0; i < ALGO_CACHE; i++) {
        algo_entry *e = &g->algos[i];
        tune_state *t = e->tune;
        if (!t) continue;
        e->tune = NULL;
        const double t0 = tune_median(t, 0);
        int best = 0;
        double bt = t0;
        for (int c = 1; t0 > 0.0 && c < t->n_cand; c++) {
            const double tc = tune_median(t, c);
            if (tc > 0.0 && tc < bt) best = c, bt = tc;
        }
        if (best && bt > TUNE_MARGIN * t0) best = 0, bt = t0;
        if (t0 > 0.0) {
            tuned++;
            changed += best != 0;
            first_us += t0;
            best_us += bt;
            e->algo = t->cand[best];
            tp_log(TP_LOG_DEBUG, "cuBLASLt tuned %s m=%lld n=%lld k=%lld: candidate %d of %d, %.1f us against the "
                   "heuristic's first %.1f us", tp_dtype_name((tp_dtype)e->key.ab_type), (long long)e->key.m,
                   (long long)e->key.n, (long long)e->key.k, best + 1, t->n_cand, bt, t0);
        }
        tune_free(t);
    }
    if (tuned)
        tp_log(TP_LOG_DEBUG, "cuBLASLt: %d shapes tuned in place, %d changed; one call of each: %.1f us, %.1f with "
               "the heuristic's first", tuned, changed, best_us, first_us);
    if (count) *count = tuned;
    return TP_OK;
}

static tp_status gemm_run(tp_cuda_gemm *g, const gemm_args *a, cudaStream_t stream)
{
    tp_status st = TP_OK;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulAlgo_t algo;
    const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const float alpha = 1.0f;
    TP_CUBLAS_GOTO(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), st, done);
    TP_CUBLAS_GOTO(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), st, done);
    TP_CUBLAS_GOTO(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), st, done);
    TP_CUBLAS_GOTO(cublasLtMatrixLayoutCreate(&la, cuda_type(a->ab), (uint64_t)a->k, (uint64_t)a->m, a->lda),
                   st, done);
    TP_CUBLAS_GOTO(cublasLtMatrixLayoutCreate(&lb, cuda_type(a->ab), (uint64_t)a->k, (uint64_t)a->n, a->ldb),
                   st, done);
    TP_CUBLAS_GOTO(cublasLtMatrixLayoutCreate(&ld, cuda_type(a->d), (uint64_t)a->m, (uint64_t)a->n, a->ldd),
                   st, done);
    cudaEvent_t ev[2];
    TP_CHECK_GOTO(find_algo(g, a, op, la, lb, ld, stream, &algo, ev), st, done);
    if (ev[0]) TP_CUDA_CHECK_GOTO(cudaEventRecord(ev[0], stream), st, done);
    TP_CUBLAS_GOTO(cublasLtMatmul(g->lt, op, &alpha, a->a, la, a->b, lb, &a->beta, a->dptr, ld, a->dptr, ld,
                                  &algo, g->workspace, g->workspace_bytes, (cudaStream_t)stream),
                   st, done);
    if (ev[1]) TP_CUDA_CHECK_GOTO(cudaEventRecord(ev[1], stream), st, done);
done:
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return st;
}

// ----------------------------------------------------------------------------
// y = x @ w^T + bias, or (add) y += x @ w^T

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static size_t weight_bytes(const tp_tensor *w) { return (size_t)(w->rows * w->cols) * tp_dtype_size(w->dtype); }

/* Whether the product of x by w in that form (TP_GEMV_PLAIN: matmul, ADD: matmul_add,
 * SWIGLU: matmul_swiglu) goes to the GEMV, as gemv (TPINFER_GEMV, or the warm-up's choice)
 * says */
static int gemv_takes(const tp_cuda_gemm *g, const tp_tensor *x, const tp_tensor *w, int form)
{
    if (!tp_cuda_gemv_fits(x, w)) return 0;
    const int one = x->rows == 1 && weight_bytes(w) <= g->gemv_one_max;
    switch (form) {
    case TP_GEMV_SWIGLU: return g->gemv == 3 ? one : g->gemv != 0;
    case TP_GEMV_ADD: return g->gemv == 3 && one;
    default: return g->gemv == 2 || (g->gemv == 3 && one);
    }
}

/* add: beta 1 on y as it is (no bias; y f32, so D is never converted) */
static tp_status matmul_into(tp_cuda_gemm *g, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                             const tp_tensor *y, int add, cudaStream_t stream)
{
    const int64_t n = x->rows, k = x->cols, m = w->rows;
    tp_tensor none;
    memset(&none, 0, sizeof none);
    const tp_tensor bv = bias ? *bias : none;
    const float beta = bias || add ? 1.0f : 0.0f;
    if (n == 0 || m == 0) return TP_OK;
    if (k == 0) return add ? TP_OK : tp_cuda_bias_fill(*y, bv, stream); /* empty sums: y = bias, or zeros */
    const int form = add ? TP_GEMV_ADD : TP_GEMV_PLAIN;
    if (gemv_takes(g, x, w, form) && !(add && bias)) return tp_cuda_gemv(*x, *w, bv, *y, form, g->sms, stream);

    /* the product's type, D's type, and what must be converted to get there */
    const tp_dtype ab = x->dtype == w->dtype ? w->dtype : TP_DTYPE_F32;
    const tp_dtype dt = y->dtype == ab || y->dtype == TP_DTYPE_F32 ? y->dtype : TP_DTYPE_F32;
    const int conv_x = x->dtype != ab, conv_w = w->dtype != ab, conv_d = dt != y->dtype; /* add: y f32, so not d */
    if (!conv_x && !conv_w && !conv_d) {
        if (bias) TP_CHECK(tp_cuda_bias_fill(*y, bv, stream));
        gemm_args a = {ab, w->data, w->stride, x->data, x->stride, dt, y->data, y->stride, m, n, k, beta};
        return gemm_run(g, &a, stream);
    }

    /* tiles: mt rows of w and nt rows of x at a time, each conversion in a third of scratch */
    const int64_t region = (int64_t)(g->scratch_bytes / 3 / 256 * 256), row_bytes = k * (int64_t)sizeof(float);
    int64_t mt = m, nt = n;
    if (conv_w) mt = min64(m, region / row_bytes);
    if (conv_x) nt = min64(n, region / row_bytes);
    if (conv_d) {
        const int64_t cells = region / (int64_t)sizeof(float);
        mt = min64(mt, cells);
        if (mt > 0 && nt > cells / mt) nt = cells / mt;
    }
    if (mt <= 0 || nt <= 0)
        return tp_error(TP_ERR_UNSUPPORTED, "matmul: k = %lld is too long for the %zu-byte conversion scratch "
                        "(%s x %s -> %s)", (long long)k, g->scratch_bytes, tp_dtype_name(x->dtype),
                        tp_dtype_name(w->dtype), tp_dtype_name(y->dtype));
    char *sx = g->scratch, *sw = sx + region, *sd = sw + region;
    for (int64_t m0 = 0; m0 < m; m0 += mt) {
        const int64_t mc = min64(mt, m - m0);
        tp_tensor wv = tp_tensor_rows(w, m0, mc);
        if (conv_w) {
            tp_tensor wf = tp_tensor_make(sw, TP_DTYPE_F32, mc, k);
            TP_CHECK(tp_cuda_convert(wv, wf, stream));
            wv = wf;
        }
        const tp_tensor bc = bias ? tp_tensor_cols(bias, m0, mc) : none;
        for (int64_t n0 = 0; n0 < n; n0 += nt) {
            const int64_t nc = min64(nt, n - n0);
            tp_tensor xv = tp_tensor_rows(x, n0, nc);
            if (conv_x) {
                tp_tensor xf = tp_tensor_make(sx, TP_DTYPE_F32, nc, k);
                TP_CHECK(tp_cuda_convert(xv, xf, stream));
                xv = xf;
            }
            const tp_tensor yr = tp_tensor_rows(y, n0, nc);
            const tp_tensor yv = tp_tensor_cols(&yr, m0, mc);
            const tp_tensor dv = conv_d ? tp_tensor_make(sd, TP_DTYPE_F32, nc, mc) : yv;
            if (bias) TP_CHECK(tp_cuda_bias_fill(dv, bc, stream));
            gemm_args a = {ab, wv.data, wv.stride, xv.data, xv.stride, dv.dtype, dv.data, dv.stride, mc, nc, k, beta};
            TP_CHECK(gemm_run(g, &a, stream));
            if (conv_d) TP_CHECK(tp_cuda_convert(dv, yv, stream));
        }
    }
    return TP_OK;
}

tp_status tp_cuda_matmul(tp_cuda_gemm *g, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                         const tp_tensor *y, cudaStream_t stream)
{
    return matmul_into(g, x, w, bias, y, 0, stream);
}

tp_status tp_cuda_matmul_add(tp_cuda_gemm *g, const tp_tensor *x, const tp_tensor *w, const tp_tensor *y,
                             cudaStream_t stream)
{
    return matmul_into(g, x, w, NULL, y, 1, stream);
}

// ----------------------------------------------------------------------------
// out = silu(gate) * up where [gate | up] = x @ w^T + bias

tp_status tp_cuda_matmul_swiglu(tp_cuda_gemm *g, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                                const tp_tensor *gate_up, const tp_tensor *out, cudaStream_t stream)
{
    const int64_t m = out->cols;
    if (out->rows == 0 || m == 0) return TP_OK;
    /* the GEMV: no gate_up round trip (fits implies k >= 1) */
    if (gemv_takes(g, x, w, TP_GEMV_SWIGLU)) {
        tp_tensor none;
        memset(&none, 0, sizeof none);
        return tp_cuda_gemv(*x, *w, bias ? *bias : none, *out, TP_GEMV_SWIGLU, g->sms, stream);
    }
    TP_CHECK(tp_cuda_matmul(g, x, w, bias, gate_up, stream));
    return tp_cuda_swiglu(tp_tensor_cols(gate_up, 0, m), tp_tensor_cols(gate_up, m, m), *out, stream);
}
