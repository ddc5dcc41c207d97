/*
 * topology_cuda.c: the CUDA answers of tpinfer --check: runtime, driver and NCCL
 * versions, peer access between two GPUs of this node, and an all-reduce benchmark on
 * device buffers through an NCCL communicator of its own (nccl-tests' all_reduce_perf
 * shape: out of place, float32, a host timer around a synchronized stream).
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#ifdef HAVE_NCCL
/* nccl.h declares a few functions without prototypes (ncclGroupStart(), ...) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include "comm_nccl.h"
#endif

#include "comm.h"
#include "cuda_check.h"
#include "device.h"

tp_status tp_cuda_versions(int *runtime, int *driver, int *nccl)
{
    *runtime = *driver = *nccl = 0;
    TP_CUDA_CHECK(cudaRuntimeGetVersion(runtime));
    /* 0 without a driver: reported, not an error (--check runs on CPU-only nodes too) */
    if (cudaDriverGetVersion(driver) != cudaSuccess) {
        (void)cudaGetLastError();
        *driver = 0;
    }
#ifdef HAVE_NCCL
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess) *nccl = v;
#endif
    return TP_OK;
}

tp_status tp_cuda_p2p(int dev_a, int dev_b, int *can_access, int *perf_rank)
{
    *can_access = 0;
    *perf_rank = -1;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        count = 0;
    }
    if (dev_a < 0 || dev_b < 0 || dev_a >= count || dev_b >= count) {
        *can_access = -1; /* not visible to this process (CUDA_VISIBLE_DEVICES per rank?) */
        return TP_OK;
    }
    if (dev_a == dev_b) {
        *can_access = 1;
        *perf_rank = 0;
        return TP_OK;
    }
    int can = 0, supported = 0, rank = 0;
    TP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, dev_a, dev_b));
    TP_CUDA_CHECK(cudaDeviceGetP2PAttribute(&supported, cudaDevP2PAttrAccessSupported, dev_a, dev_b));
    if (!can || !supported) return TP_OK;
    TP_CUDA_CHECK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, dev_a, dev_b));
    *can_access = 1;
    *perf_rank = rank;
    return TP_OK;
}

struct tp_ar_bench {
    tp_comm *nccl;       /* over the bootstrap's ranks */
    int device;
    int rank, size;
    cudaStream_t stream;
    float *send, *recv;  /* device, max_count each */
    float *host;         /* pinned, for the check */
    size_t max_count;
};

void tp_cuda_ar_bench_close(tp_ar_bench *b)
{
    if (!b) return;
    if (b->device >= 0) (void)cudaSetDevice(b->device);
    if (b->stream) (void)cudaStreamSynchronize(b->stream);
    if (b->send) (void)cudaFree(b->send);
    if (b->recv) (void)cudaFree(b->recv);
    if (b->host) (void)cudaFreeHost(b->host);
    if (b->stream) (void)cudaStreamDestroy(b->stream);
    (void)cudaGetLastError();
    tp_comm_destroy(b->nccl);
    free(b);
}

#ifdef HAVE_NCCL

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tp_status tp_cuda_ar_bench_open(tp_comm *bootstrap, int device, size_t max_bytes, tp_ar_bench **out)
{
    *out = NULL;
    tp_status st = TP_OK;
    tp_ar_bench *b = calloc(1, sizeof *b);
    if (!b) return tp_error(TP_ERR_OOM, "out of memory");
    b->device = device;
    b->rank = bootstrap->rank;
    b->size = bootstrap->size;
    b->max_count = max_bytes / sizeof(float);
    size_t bytes = b->max_count * sizeof(float);
    TP_CUDA_CHECK_GOTO(cudaSetDevice(device), st, fail);
    TP_CHECK_GOTO(tp_comm_nccl_create(bootstrap, device, "check", &b->nccl), st, fail);
    TP_CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), st, fail);
    TP_CUDA_CHECK_GOTO(cudaMalloc((void **)&b->send, bytes), st, fail);
    TP_CUDA_CHECK_GOTO(cudaMalloc((void **)&b->recv, bytes), st, fail);
    TP_CUDA_CHECK_GOTO(cudaMallocHost((void **)&b->host, bytes), st, fail);
    /* every element of this rank's contribution is rank + 1 */
    const float mine = (float)(b->rank + 1);
    for (size_t i = 0; i < b->max_count; i++) b->host[i] = mine;
    TP_CUDA_CHECK_GOTO(cudaMemcpy(b->send, b->host, bytes, cudaMemcpyHostToDevice), st, fail);
    *out = b;
    return TP_OK;
fail:
    tp_cuda_ar_bench_close(b);
    return st;
}

tp_status tp_cuda_ar_bench_run(tp_ar_bench *b, size_t count, int warmup, int iters, double *seconds,
                               int64_t *wrong)
{
    *seconds = 0;
    *wrong = 0;
    if (count > b->max_count)
        return tp_error(TP_ERR_INTERNAL, "all-reduce of %zu floats on a %zu-float buffer", count,
                        b->max_count);
    TP_CUDA_CHECK(cudaSetDevice(b->device));
    for (int i = 0; i < warmup; i++)
        TP_CHECK(tp_comm_all_reduce_sum(b->nccl, b->send, b->recv, count, TP_DTYPE_F32, b->stream));
    TP_CUDA_CHECK(cudaStreamSynchronize(b->stream));
    TP_CHECK(tp_comm_barrier(b->nccl)); /* the group starts together */
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        TP_CHECK(tp_comm_all_reduce_sum(b->nccl, b->send, b->recv, count, TP_DTYPE_F32, b->stream));
    TP_CUDA_CHECK(cudaStreamSynchronize(b->stream));
    *seconds = now_s() - t0;

    /* a fresh result to check: recv filled with NaN (all bits set) first */
    TP_CUDA_CHECK(cudaMemsetAsync(b->recv, 0xff, count * sizeof(float), b->stream));
    TP_CHECK(tp_comm_all_reduce_sum(b->nccl, b->send, b->recv, count, TP_DTYPE_F32, b->stream));
    TP_CUDA_CHECK(cudaMemcpyAsync(b->host, b->recv, count * sizeof(float), cudaMemcpyDeviceToHost,
                                  b->stream));
    TP_CUDA_CHECK(cudaStreamSynchronize(b->stream));
    const float want = (float)((double)b->size * (b->size + 1) / 2.0);
    int64_t bad = 0;
    for (size_t i = 0; i < count; i++) bad += b->host[i] != want;
    *wrong = bad;
    return TP_OK;
}

#else /* CUDA without NCCL */

tp_status tp_cuda_ar_bench_open(tp_comm *bootstrap, int device, size_t max_bytes, tp_ar_bench **out)
{
    (void)bootstrap;
    (void)device;
    (void)max_bytes;
    *out = NULL;
    return tp_error(TP_ERR_UNAVAILABLE,
                    "this tpinfer was built without NCCL: the GPU all-reduce sweep needs it; "
                    "use --backend cpu");
}

tp_status tp_cuda_ar_bench_run(tp_ar_bench *b, size_t count, int warmup, int iters, double *seconds,
                               int64_t *wrong)
{
    (void)b;
    (void)count;
    (void)warmup;
    (void)iters;
    *seconds = 0;
    *wrong = 0;
    return tp_error(TP_ERR_UNAVAILABLE, "this tpinfer was built without NCCL");
}

#endif
