/*
 * pdl.c: whether kernels launch with programmatic dependent launch (common.cuh's
 * tp_launch): on for GPUs of compute capability 9.0 and later unless TPINFER_PDL=0.
 */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

int tp_cuda_pdl_enabled(void);

int tp_cuda_pdl_enabled(void)
{
    static int enabled = -1;
    if (enabled < 0) {
        const char *v = getenv("TPINFER_PDL");
        int device = 0, major = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
            (void)cudaGetLastError();
            major = 0;
        }
        enabled = major >= 9 && !(v && !strcmp(v, "0"));
    }
    return enabled;
}
