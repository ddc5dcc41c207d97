/*
 * device.c: the device registry: CUDA when built with it, otherwise none.
 */
#include "config.h"
#include "device.h"

#include <string.h>

tp_status tp_device_query(int local_rank, tp_device_info *info)
{
    memset(info, 0, sizeof *info);
    info->index = -1;
#ifdef HAVE_CUDA
    return tp_cuda_device_query(local_rank, info);
#else
    return TP_OK;
#endif
}

int tp_device_large(const tp_device_info *info)
{
    return info->count > 0 && info->total_bytes >= (INT64_C(70) << 30);
}

tp_status tp_device_versions(int *cuda_runtime, int *cuda_driver, int *nccl)
{
    *cuda_runtime = *cuda_driver = *nccl = 0;
#ifdef HAVE_CUDA
    return tp_cuda_versions(cuda_runtime, cuda_driver, nccl);
#else
    return TP_OK;
#endif
}

tp_status tp_device_p2p(int dev_a, int dev_b, int *can_access, int *perf_rank)
{
    *can_access = 0;
    *perf_rank = -1;
#ifdef HAVE_CUDA
    return tp_cuda_p2p(dev_a, dev_b, can_access, perf_rank);
#else
    (void)dev_a;
    (void)dev_b;
    return tp_error(TP_ERR_UNAVAILABLE, "this tpinfer was built without CUDA: no GPU peer access to ask about");
#endif
}

tp_status tp_device_ar_bench_open(struct tp_comm *bootstrap, int device, size_t max_bytes,
                                  tp_ar_bench **out)
{
    *out = NULL;
#ifdef HAVE_CUDA
    return tp_cuda_ar_bench_open(bootstrap, device, max_bytes, out);
#else
    (void)bootstrap;
    (void)device;
    (void)max_bytes;
    return tp_error(TP_ERR_UNAVAILABLE,
                    "this tpinfer was built without CUDA; rebuild with ./configure --with-cuda, "
                    "or use --backend cpu");
#endif
}

tp_status tp_device_ar_bench_run(tp_ar_bench *b, size_t count, int warmup, int iters,
                                 double *seconds, int64_t *wrong)
{
#ifdef HAVE_CUDA
    return tp_cuda_ar_bench_run(b, count, warmup, iters, seconds, wrong);
#else
    (void)b;
    (void)count;
    (void)warmup;
    (void)iters;
    *seconds = 0;
    *wrong = 0;
    return tp_error(TP_ERR_UNAVAILABLE, "this tpinfer was built without CUDA");
#endif
}

void tp_device_ar_bench_close(tp_ar_bench *b)
{
#ifdef HAVE_CUDA
    tp_cuda_ar_bench_close(b);
#else
    (void)b;
#endif
}
