/*
 * device.h: which accelerators this rank can see. The CUDA build answers through
 * cuda/device_cuda.c; a build without CUDA reports none. The one #ifdef HAVE_CUDA
 * of this interface is in device.c.
 */
#ifndef TP_DEVICE_H
#define TP_DEVICE_H

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

/* The CUDA implementation (cuda/device_cuda.c); only called when built with CUDA. */
tp_status tp_cuda_device_query(int local_rank, tp_device_info *info);

#ifdef __cplusplus
}
#endif
#endif
