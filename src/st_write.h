/*
 * st_write.h: writing a safetensors file (for --dump-logits): the header is laid out as
 * the reference writer does (offsets in order, padded with spaces to 8 bytes), and the
 * file appears whole: written to a temporary name, fsynced, then renamed.
 */
#ifndef TP_ST_WRITE_H
#define TP_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct tp_st_out_tensor {
    const char *name;
    const char *dtype; /* "F32", "I32", ... */
    int rank;
    int64_t shape[4];
    const void *data;
    size_t bytes;
} tp_st_out_tensor;

/* metadata: n_meta pairs of key, value strings (may be 0). */
tp_status tp_st_write(const char *path, const tp_st_out_tensor *t, int n, const char *const *meta,
                      int n_meta);

#endif
