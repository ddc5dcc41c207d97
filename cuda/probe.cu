/*
 * probe.cu: the smallest kernel that proves a GPU runs this build's code
 * (a missing sm_XX in the fatbin fails here, not in the first real kernel).
 */
#include "cuda_check.h"

// ----------------------------------------------------------------------------
// CUDA kernels

__global__ void probe_kernel(int *out, int value) { *out = value; }

// ----------------------------------------------------------------------------
// launchers

extern "C" tp_status tp_cuda_probe(int device, int value, int *out)
{
    int *d_out = nullptr;
    TP_CUDA_CHECK(cudaSetDevice(device));
    TP_CUDA_CHECK(cudaMalloc(&d_out, sizeof(int)));
    probe_kernel<<<1, 1>>>(d_out, value);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaMemcpy(out, d_out, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d_out);
    TP_CUDA_CHECK(err);
    return TP_OK;
}
