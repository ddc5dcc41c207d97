/*
 * bench_check.h: the GPU benchmarks' checks. A benchmark has nothing to clean up or hand
 * back, so a failed call prints the statement, file:line and the library's message, and
 * exits 1. And the median the benchmarks report of their timings.
 */
#ifndef TP_BENCH_CHECK_H
#define TP_BENCH_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "status.h"

#define BENCH_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t bench_err_ = (call);                                                           \
        if (bench_err_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                        \
                    cudaGetErrorString(bench_err_));                                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define BENCH_TP(call)                                                                             \
    do {                                                                                           \
        if ((call) != TP_OK) {                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, tp_error_message());     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline int bench_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0 .. n), which it sorts. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

#endif
