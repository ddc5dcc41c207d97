/*
 * device.h: which accelerators this rank can see. The CUDA build answers through
 * cuda/device_cuda.c; a build without CUDA reports none. The one #ifdef HAVE_CUDA
 * of this interface is in device.c.
 */
#ifndef TP_DEVICE_H
#define TP_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_device_info {
    int count;           /* GPUs visible to this process (0 without CUDA) */
    int index;           /* the GPU this rank uses (local_rank), -1 when none */
    char name[256];      /* "NVIDIA H200", or "" */
    char pci_bus[32];    /* "0000:19:00.0", or "" */
    int64_t total_bytes; /* memory of that GPU */
    int64_t free_bytes;
    int cc_major, cc_minor;
} tp_device_info;

/* Fill info for this rank's GPU (local_rank modulo nothing: a local_rank beyond the
 * visible count is an error naming both). With no GPU, count = 0 and TP_OK. */
tp_status tp_device_query(int local_rank, tp_device_info *info);

/* Whether info's GPU has 70 GiB or more (H100, H200, B200 class): there the run's defaults
 * follow vLLM's offline ones for such GPUs, up to 1024 sequences (as many as the KV cache
 * holds) and 16384 tokens a step; elsewhere (smaller GPUs, the CPU) 256 and 8192. */
int tp_device_large(const tp_device_info *info);

/* The CUDA implementation (cuda/device_cuda.c); only called when built with CUDA. */
tp_status tp_cuda_device_query(int local_rank, tp_device_info *info);

/* --- for tpinfer --check (src/check.c) ---------------------------------------------
 * Versions as CUDA and NCCL encode them (CUDA 12040 = 12.4, NCCL 22803 = 2.28.3);
 * 0 for what this build or machine lacks. Without CUDA all three are 0 and TP_OK. */
tp_status tp_device_versions(int *cuda_runtime, int *cuda_driver, int *nccl);

/* Can GPU dev_a (of this node) read/write GPU dev_b's memory directly? *perf_rank is
 * cudaDevP2PAttrPerformanceRank (0 is the best link, e.g. NVLink; higher is slower),
 * -1 when there is no P2P. Without CUDA: TP_ERR_UNAVAILABLE. */
tp_status tp_device_p2p(int dev_a, int dev_b, int *can_access, int *perf_rank);

/* An all-reduce benchmark over the ranks of bootstrap (an MPI tp_comm of one TP group)
 * on GPU device: NCCL on device buffers of float32, with its own stream and an NCCL
 * communicator made by tp_comm_nccl_create. Without CUDA or NCCL: TP_ERR_UNAVAILABLE. */
struct tp_comm;
typedef struct tp_ar_bench tp_ar_bench;
tp_status tp_device_ar_bench_open(struct tp_comm *bootstrap, int device, size_t max_bytes,
                                  tp_ar_bench **out);
/* warmup untimed then iters timed out-of-place all-reduces of count floats, each rank
 * contributing rank + 1 at every element; *seconds is the time of the timed loop on
 * this rank (between host barriers, the stream synchronized), *wrong the elements of a
 * fresh all-reduce that differ from n(n+1)/2. */
tp_status tp_device_ar_bench_run(tp_ar_bench *b, size_t count, int warmup, int iters,
                                 double *seconds, int64_t *wrong);
void tp_device_ar_bench_close(tp_ar_bench *b);

/* The CUDA implementations (cuda/topology_cuda.c). */
tp_status tp_cuda_versions(int *runtime, int *driver, int *nccl);
tp_status tp_cuda_p2p(int dev_a, int dev_b, int *can_access, int *perf_rank);
tp_status tp_cuda_ar_bench_open(struct tp_comm *bootstrap, int device, size_t max_bytes,
                                tp_ar_bench **out);
tp_status tp_cuda_ar_bench_run(tp_ar_bench *b, size_t count, int warmup, int iters,
                               double *seconds, int64_t *wrong);
void tp_cuda_ar_bench_close(tp_ar_bench *b);

#ifdef __cplusplus
}
#endif
#endif
