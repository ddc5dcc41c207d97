/*
 * device_cuda.c: the CUDA answer to tp_device_query: the GPU of this rank, its name,
 * PCI bus and memory, after proving it runs this build's kernels.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "cuda_check.h"
#include "device.h"

tp_status tp_cuda_device_query(int local_rank, tp_device_info *info)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError();
        info->count = 0; /* a CUDA build on a machine without a GPU: the CPU backend runs */
        return TP_OK;
    }
    TP_CUDA_CHECK(err);
    info->count = count;
    if (count == 0) return TP_OK;
    if (local_rank >= count)
        return tp_error(TP_ERR_UNAVAILABLE,
                        "local rank %d needs GPU %d but only %d GPU(s) are visible on this node "
                        "(CUDA_VISIBLE_DEVICES?); start at most %d ranks per node",
                        local_rank, local_rank, count, count);
    struct cudaDeviceProp prop;
    TP_CUDA_CHECK(cudaGetDeviceProperties(&prop, local_rank));
    info->index = local_rank;
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    snprintf(info->pci_bus, sizeof info->pci_bus, "%04x:%02x:%02x.0", prop.pciDomainID,
             prop.pciBusID, prop.pciDeviceID);
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    int probed = 0;
    TP_CHECK(tp_cuda_probe(local_rank, 0x7470, &probed));
    if (probed != 0x7470)
        return tp_error(TP_ERR_CUDA, "GPU %d (%s) ran the probe kernel but returned %#x", local_rank,
                        prop.name, probed);
    size_t free_b = 0, total_b = 0;
    TP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    info->free_bytes = (int64_t)free_b;
    info->total_bytes = (int64_t)total_b;
    return TP_OK;
}
