/*
 * gpu_matmul.c: the CUDA backend's matmul on Llama-3-8B's decode shapes, the GEMV of
 * cuda/gemv.cu (n <= 8) against cuBLASLt, through the backend table. bf16 weights and
 * activations (the logits f32), f32 accumulation: qkv 4096->6144, o 4096->4096, gate_up
 * 4096->28672 (plain, and fused with swiglu), down 14336->4096, lm_head 4096->128256, at
 * n = 1, 2, 4, 8, 16, 64, 128 rows.
 *
 * Two backends on one GPU: one created with TPINFER_GEMV=0 (cuBLASLt only), one without
 * (the GEMV where it fits). Each shape gets enough weight copies (>= 256 MB together) that
 * the 50 MB L2 holds none when the next call comes, and the calls rotate over them. Each
 * sample is one CUDA graph of B calls (B >= 10, a multiple of the copies; plain launches
 * when the backend has no graphs) timed with CUDA events, divided by B; the figure is the
 * median of 25 samples after a warm-up. GB/s counts weight bytes only (x and y are < 1 %
 * of them at n <= 8). At n <= 8 the two paths' outputs are compared as well.
 *
 * usage: gpu_matmul [device]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "bench_check.h"

#define SAMPLES 25
#define MIN_CALLS 10
#define ROTATE_BYTES ((size_t)256 << 20)
#define NMAX 128
#define FILL_ELEMS ((size_t)16 << 20) /* random bf16 values, tiled over every weight copy */

typedef struct shape {
    const char *name;
    int64_t k, rows; /* w [rows, k] */
    int swiglu;      /* out [n, rows / 2] = silu(gate) * up */
    tp_dtype ydt;
} shape;

static const shape shapes[] = {
    {"qkv", 4096, 6144, 0, TP_DTYPE_BF16},       {"o", 4096, 4096, 0, TP_DTYPE_BF16},
    {"gate_up", 4096, 28672, 0, TP_DTYPE_BF16},  {"gate_up+swiglu", 4096, 28672, 1, TP_DTYPE_BF16},
    {"down", 14336, 4096, 0, TP_DTYPE_BF16},     {"lm_head", 4096, 128256, 0, TP_DTYPE_F32},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))
static const int ns[] = {1, 2, 4, 8, 16, 64, 128};
#define N_NS ((int)(sizeof ns / sizeof ns[0]))

static double results[N_SHAPES][N_NS][2]; /* microseconds; [.][.][0] GEMV, [1] cuBLASLt; 0: not run */


static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float uniform(void) /* xorshift64*, in [-1, 1) */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1 << 23) - 1.0f;
}

/* bytes of device memory filled from the host's random bf16 block, tiled */
static void fill(tp_backend *b, void *dst, size_t bytes, const void *block, size_t block_bytes)
{
    for (size_t at = 0; at < bytes; at += block_bytes)
        BENCH_TP(b->ops->upload(b, (char *)dst + at, block, bytes - at < block_bytes ? bytes - at : block_bytes));
}

typedef struct job {
    const shape *s;
    int n, copies;
    void **w;
    void *x, *y, *gate_up;
} job;

static tp_status call(tp_backend *b, const job *j, int copy)
{
    const shape *s = j->s;
    tp_tensor x = tp_tensor_make(j->x, TP_DTYPE_BF16, j->n, s->k);
    tp_tensor w = tp_tensor_make(j->w[copy], TP_DTYPE_BF16, s->rows, s->k);
    if (!s->swiglu) {
        tp_tensor y = tp_tensor_make(j->y, s->ydt, j->n, s->rows);
        return b->ops->matmul(b, &x, &w, NULL, &y);
    }
    tp_tensor gu = tp_tensor_make(j->gate_up, TP_DTYPE_BF16, j->n, s->rows);
    tp_tensor out = tp_tensor_make(j->y, s->ydt, j->n, s->rows / 2);
    return b->ops->matmul_swiglu(b, &x, &w, NULL, &gu, &out);
}

/* median microseconds per call */
static double time_calls(tp_backend *b, const job *j)
{
    const int calls = (MIN_CALLS + j->copies - 1) / j->copies * j->copies;
    for (int c = 0; c < j->copies; c++) BENCH_TP(call(b, j, c)); /* warm-up: algorithms, first touch */
    BENCH_TP(b->ops->synchronize(b));
    void *graph = NULL;
    if (b->ops->graph_begin) {
        BENCH_TP(b->ops->graph_begin(b));
        for (int c = 0; c < calls; c++) BENCH_TP(call(b, j, c % j->copies));
        BENCH_TP(b->ops->graph_end(b, &graph));
        BENCH_TP(b->ops->graph_launch(b, graph));
        BENCH_TP(b->ops->synchronize(b));
    }
    cudaStream_t stream = (cudaStream_t)b->stream;
    cudaEvent_t e0, e1;
    BENCH_CUDA(cudaEventCreate(&e0));
    BENCH_CUDA(cudaEventCreate(&e1));
    double us[SAMPLES];
    for (int t = 0; t < SAMPLES; t++) {
        BENCH_CUDA(cudaEventRecord(e0, stream));
        if (graph) BENCH_TP(b->ops->graph_launch(b, graph));
        else
            for (int c = 0; c < calls; c++) BENCH_TP(call(b, j, c % j->copies));
        BENCH_CUDA(cudaEventRecord(e1, stream));
        BENCH_CUDA(cudaEventSynchronize(e1));
        float ms = 0.0f;
        BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        us[t] = 1e3 * ms / calls;
    }
    BENCH_TP(b->ops->synchronize(b));
    if (graph) b->ops->graph_free(b, graph);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return bench_median(us, SAMPLES);
}

/* y of one call on copy 0, as f32 */
static float *output(tp_backend *b, const job *j, size_t count)
{
    const size_t es = tp_dtype_size(j->s->ydt);
    void *raw = malloc(count * es);
    float *f = malloc(count * sizeof(float));
    if (!raw || !f) {
        fprintf(stderr, "gpu_matmul: out of memory\n");
        exit(1);
    }
    BENCH_TP(call(b, j, 0));
    BENCH_TP(b->ops->download(b, raw, j->y, count * es));
    BENCH_TP(b->ops->synchronize(b));
    tp_convert(f, TP_DTYPE_F32, raw, j->s->ydt, count);
    free(raw);
    return f;
}

int main(int argc, char **argv)
{
    const int device = argc > 1 ? atoi(argv[1]) : 0;
    tp_backend *lt = NULL, *gv = NULL;
    setenv("TPINFER_GEMV", "0", 1);
    BENCH_TP(tp_backend_cuda_create(device, TP_DTYPE_BF16, &lt));
    setenv("TPINFER_GEMV", "all", 1); /* plain products too: the comparison this bench makes */
    BENCH_TP(tp_backend_cuda_create(device, TP_DTYPE_BF16, &gv));
    unsetenv("TPINFER_GEMV");

    uint16_t *block = malloc(FILL_ELEMS * sizeof(uint16_t));
    float *vals = malloc(FILL_ELEMS * sizeof(float));
    if (!block || !vals) {
        fprintf(stderr, "gpu_matmul: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < FILL_ELEMS; i++) vals[i] = 0.05f * uniform();
    tp_convert(block, TP_DTYPE_BF16, vals, TP_DTYPE_F32, FILL_ELEMS);
    free(vals);

    struct cudaDeviceProp prop;
    BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
    printf("# gpu_matmul: %s, %d SMs, %.0f MB L2; bf16 x and w, f32 accumulation; median of %d graph "
           "samples of >= %d calls\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, SAMPLES,
           MIN_CALLS);
    printf("%-15s %6s %7s %4s %-9s %10s %9s %9s\n", "shape", "k", "m", "n", "path", "us/call", "w GB/s",
           "max diff");
    for (int si = 0; si < N_SHAPES; si++) {
        const shape *s = &shapes[si];
        const size_t wbytes = (size_t)(s->rows * s->k) * 2;
        job j;
        memset(&j, 0, sizeof j);
        j.s = s;
        j.copies = (int)((ROTATE_BYTES + wbytes - 1) / wbytes);
        if (j.copies < 2) j.copies = 2;
        j.w = calloc((size_t)j.copies, sizeof(void *));
        if (!j.w) return 1;
        for (int c = 0; c < j.copies; c++) {
            BENCH_TP(gv->ops->alloc(gv, wbytes, &j.w[c]));
            fill(gv, j.w[c], wbytes, block, FILL_ELEMS * sizeof(uint16_t));
        }
        const int64_t mo = s->swiglu ? s->rows / 2 : s->rows;
        BENCH_TP(gv->ops->alloc(gv, (size_t)(NMAX * s->k) * 2, &j.x));
        fill(gv, j.x, (size_t)(NMAX * s->k) * 2, block, FILL_ELEMS * sizeof(uint16_t));
        BENCH_TP(gv->ops->alloc(gv, (size_t)(NMAX * mo) * tp_dtype_size(s->ydt), &j.y));
        if (s->swiglu) BENCH_TP(gv->ops->alloc(gv, (size_t)(NMAX * s->rows) * 2, &j.gate_up));
        for (int ni = 0; ni < N_NS; ni++) {
            j.n = ns[ni];
            for (int p = 0; p < 2; p++) {
                if (p == 0 && j.n > 8) continue; /* no GEMV above 8 rows: the same cuBLASLt call */
                tp_backend *b = p == 0 ? gv : lt;
                const double us = time_calls(b, &j);
                results[si][ni][p] = us;
                char diff[32] = "";
                if (p == 1 && j.n <= 8) { /* the GEMV's output against cuBLASLt's */
                    const size_t count = (size_t)(j.n * mo);
                    float *a = output(gv, &j, count), *r = output(lt, &j, count);
                    double worst = 0.0, mag = 0.0;
                    for (size_t i = 0; i < count; i++) {
                        worst = fmax(worst, fabs((double)a[i] - r[i]));
                        mag = fmax(mag, fabs((double)r[i]));
                    }
                    snprintf(diff, sizeof diff, "%.1e", mag > 0 ? worst / mag : worst);
                    free(a);
                    free(r);
                }
                printf("%-15s %6lld %7lld %4d %-9s %10.2f %9.0f %9s\n", s->name, (long long)s->k, (long long)mo,
                       j.n, p == 0 ? "gemv" : "cublaslt", us, (double)wbytes / (us * 1e-6) / 1e9, diff);
                fflush(stdout);
            }
        }
        for (int c = 0; c < j.copies; c++) gv->ops->free(gv, j.w[c]);
        gv->ops->free(gv, j.x);
        gv->ops->free(gv, j.y);
        gv->ops->free(gv, j.gate_up);
        free(j.w);
    }

    printf("\n# summary: us per call (w GB/s), GEMV against cuBLASLt\n");
    printf("| shape | n | GEMV | cuBLASLt | speed-up |\n| --- | --- | --- | --- | --- |\n");
    for (int si = 0; si < N_SHAPES; si++) {
        const size_t wbytes = (size_t)(shapes[si].rows * shapes[si].k) * 2;
        for (int ni = 0; ni < N_NS; ni++) {
            const double g = results[si][ni][0], c = results[si][ni][1];
            if (g <= 0 || (ns[ni] != 1 && ns[ni] != 8)) continue;
            printf("| %s | %d | %.1f us (%.0f GB/s) | %.1f us (%.0f GB/s) | %.2fx |\n", shapes[si].name, ns[ni], g,
                   (double)wbytes / (g * 1e-6) / 1e9, c, (double)wbytes / (c * 1e-6) / 1e9, c / g);
        }
    }
    free(block);
    tp_backend_destroy(gv);
    tp_backend_destroy(lt);
    return 0;
}
