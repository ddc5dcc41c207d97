/*
 * matmul_cpu.c: time the cpu backend's matmul on decode-like shapes (n = 1, 8, 64 rows
 * against a 2048 x 2048 weight in f32 and bf16) and print a fixed table of time per call,
 * GFLOP/s (2*n*k*m per call) and GB/s of weight traffic (m*k*sizeof(w) per call). Each
 * shape is first checked against a double-precision dot product.
 *
 * usage: matmul_cpu [seconds per shape, default 0.5]   (threads: OMP_NUM_THREADS)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"

#define K 2048
#define M 2048

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float uniform(void) /* xorshift64*, in [-1, 1) */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1 << 23) - 1.0f;
}

/* Worst relative error of y against double-precision dot products, over a few elements. */
static double check(const float *x, const float *wf, const float *y, int n)
{
    double worst = 0.0;
    for (int s = 0; s < 64; s++) {
        int i = s % n, j = (s * 977) % M;
        double ref = 0.0, mag = 0.0;
        for (int kk = 0; kk < K; kk++) {
            ref += (double)x[(size_t)i * K + kk] * wf[(size_t)j * K + kk];
            mag += fabs((double)x[(size_t)i * K + kk] * wf[(size_t)j * K + kk]);
        }
        double err = fabs(y[(size_t)i * M + j] - ref) / (mag > 0 ? mag : 1.0);
        if (err > worst) worst = err;
    }
    return worst;
}

int main(int argc, char **argv)
{
    double budget = argc > 1 ? atof(argv[1]) : 0.5;
    if (!(budget > 0)) budget = 0.5;
    tp_backend *b;
    if (tp_backend_cpu_create(&b) != TP_OK) {
        fprintf(stderr, "matmul_cpu: %s\n", tp_error_message());
        return 1;
    }
    static const int ns[] = {1, 8, 64};
    static const tp_dtype dts[] = {TP_DTYPE_F32, TP_DTYPE_BF16};
    const int nmax = 64;

    float *x = malloc(sizeof(float) * nmax * K), *y = malloc(sizeof(float) * nmax * M);
    float *wf = malloc(sizeof(float) * M * K), *wround = malloc(sizeof(float) * M * K);
    uint16_t *wbf = malloc(sizeof(uint16_t) * M * K);
    if (!x || !y || !wf || !wround || !wbf) {
        fprintf(stderr, "matmul_cpu: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)nmax * K; i++) x[i] = uniform();
    for (size_t i = 0; i < (size_t)M * K; i++) wf[i] = uniform() * 0.05f;
    tp_convert(wbf, TP_DTYPE_BF16, wf, TP_DTYPE_F32, (size_t)M * K);
    tp_convert(wround, TP_DTYPE_F32, wbf, TP_DTYPE_BF16, (size_t)M * K);

    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("# cpu backend matmul, y[n,%d] = x[n,%d] @ w[%d,%d]^T, %d threads\n", M, K, M, K, threads);
    printf("%-8s %4s %5s %5s %10s %9s %9s %9s\n", "w dtype", "n", "k", "m", "us/call", "GFLOP/s",
           "w GB/s", "rel.err");
    int bad = 0;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
            int n = ns[s];
            tp_dtype dt = dts[d];
            tp_tensor tx = tp_tensor_make(x, TP_DTYPE_F32, n, K);
            tp_tensor tw = tp_tensor_make(dt == TP_DTYPE_F32 ? (void *)wf : (void *)wbf, dt, M, K);
            tp_tensor ty = tp_tensor_make(y, TP_DTYPE_F32, n, M);
            if (b->ops->matmul(b, &tx, &tw, NULL, &ty) != TP_OK) {
                fprintf(stderr, "matmul_cpu: %s\n", tp_error_message());
                return 1;
            }
            double err = check(x, dt == TP_DTYPE_F32 ? wf : wround, y, n);
            if (err > 1e-5) bad = 1;
            /* best of three runs of as many calls as fit in budget/3 */
            double best = INFINITY;
            for (int run = 0; run < 3; run++) {
                int calls = 0;
                double t0 = now(), t;
                do {
                    b->ops->matmul(b, &tx, &tw, NULL, &ty);
                    calls++;
                    t = now() - t0;
                } while (t < budget / 3);
                if (t / calls < best) best = t / calls;
            }
            double flops = 2.0 * n * K * M, wbytes = (double)M * K * tp_dtype_size(dt);
            printf("%-8s %4d %5d %5d %10.1f %9.2f %9.2f %9.1e\n", tp_dtype_name(dt), n, K, M,
                   best * 1e6, flops / best * 1e-9, wbytes / best * 1e-9, err);
        }
    }
    tp_backend_destroy(b);
    free(x);
    free(y);
    free(wf);
    free(wround);
    free(wbf);
    if (bad) fprintf(stderr, "matmul_cpu: results disagree with the reference\n");
    return bad;
}
