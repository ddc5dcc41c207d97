/*
 * backend.c: the backend registry, the one place that knows which backends were built.
 */
#include "config.h"
#include "backend.h"

#include <string.h>

tp_status tp_backend_create(const char *name, int device, tp_dtype act_dtype, tp_backend **out)
{
    *out = NULL;
    int want_cuda = !strcmp(name, "cuda");
    if (want_cuda || (!strcmp(name, "auto") && device >= 0)) {
#ifdef HAVE_CUDA
        if (device >= 0) return tp_backend_cuda_create(device, act_dtype, out);
        return tp_error(TP_ERR_UNAVAILABLE, "--backend cuda: no GPU is visible to this rank "
                        "(CUDA_VISIBLE_DEVICES?); use --backend cpu");
#else
        if (want_cuda)
            return tp_error(TP_ERR_UNAVAILABLE,
                            "this tpinfer was built without CUDA; rebuild with ./configure --with-cuda, "
                            "or use --backend cpu");
#endif
    }
    (void)act_dtype; /* the CPU backend computes in float32 whatever the weights are */
    return tp_backend_cpu_create(out);
}
