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
