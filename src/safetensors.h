/*
 * safetensors.h: a strict reader of the safetensors format (8-byte LE header length,
 * JSON header, data region). Every check of anchors/reliability.md §1.5 is made before
 * any tensor is touched; a failure names the file, the tensor and the reason.
 */
#ifndef TP_SAFETENSORS_H
#define TP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TP_ST_MAX_HEADER 100000000ull /* the reference crate's MAX_HEADER_SIZE */
#define TP_ST_MAX_RANK 8
#define TP_ST_MAX_TENSORS 1000000
#define TP_ST_MAX_NAME 65536

/* All 22 dtype names of the format; only F32, F16, BF16 (and I32 for non-weights) are loadable. */
typedef enum tp_st_dtype {
    TP_ST_F4, TP_ST_F6_E2M3, TP_ST_F6_E3M2, TP_ST_BOOL, TP_ST_U8, TP_ST_I8, TP_ST_F8_E5M2,
    TP_ST_F8_E4M3, TP_ST_F8_E8M0, TP_ST_F8_E4M3FNUZ, TP_ST_F8_E5M2FNUZ, TP_ST_I16, TP_ST_U16,
    TP_ST_F16, TP_ST_BF16, TP_ST_I32, TP_ST_U32, TP_ST_F32, TP_ST_I64, TP_ST_U64, TP_ST_F64,
    TP_ST_C64, TP_ST_DTYPE_COUNT
} tp_st_dtype;

const char *tp_st_dtype_name(tp_st_dtype dt);
unsigned tp_st_dtype_bits(tp_st_dtype dt);
/* The tp_dtype a stored dtype loads as; returns 0 when tpinfer cannot load it. */
int tp_st_dtype_to_dtype(tp_st_dtype dt, tp_dtype *out);

typedef struct tp_st_tensor {
    char *name;
    tp_st_dtype dtype;
    int rank;
    int64_t shape[TP_ST_MAX_RANK];
    uint64_t begin, end; /* byte range inside the data region */
} tp_st_tensor;

typedef struct tp_st_file {
    char *path;            /* for messages; "<buffer>" when parsed from memory */
    int fd;                /* -1 when parsed from memory */
    uint64_t file_size;
    uint64_t data_offset;  /* 8 + header length: where the data region starts */
    const unsigned char *map; /* mmap of the whole file (NULL until mapped, or from memory) */
    tp_st_tensor *tensors; /* sorted by name */
    size_t n_tensors;
    size_t n_metadata;     /* __metadata__ entries */
} tp_st_file;

/* Parse and validate a complete safetensors image held in memory (tests, fuzzing).
 * The tensors' data are not copied; f->map points into buf, which must outlive f. */
tp_status tp_st_parse_buffer(const void *buf, size_t len, const char *what, tp_st_file *f);

/* Open a file: read and validate its header with pread, then mmap it read-only. */
tp_status tp_st_open(const char *path, tp_st_file *f);
void tp_st_free(tp_st_file *f); /* accepts a zeroed file */

/* Lookup by name (binary search); NULL if absent. */
const tp_st_tensor *tp_st_find(const tp_st_file *f, const char *name);

/* A rectangular slice of a tensor viewed as 2-D: rows = shape[0], cols = the product of
 * the other dims (a 1-D tensor is shape[0] rows of 1 column; a scalar is 1 x 1). */
typedef struct tp_slice {
    int64_t row0, nrows;
    int64_t col0, ncols;
} tp_slice;

/* Copy a slice into dst (row-major nrows x ncols of dst_dt), converting from the stored
 * dtype. Only the bytes of the slice are touched; the file is re-checked for truncation
 * first so a file shrunk under the mmap is an error, not SIGBUS. */
tp_status tp_st_read_slice(const tp_st_file *f, const tp_st_tensor *t, tp_slice s,
                           tp_dtype dst_dt, void *dst);

/* Number of elements (checked at parse time not to overflow). */
int64_t tp_st_numel(const tp_st_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
