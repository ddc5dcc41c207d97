/*
 * dtype.h: the element types tpinfer computes and communicates in, their sizes,
 * and scalar conversions between them (bf16/f16 <-> f32, round to nearest even).
 */
#ifndef TP_DTYPE_H
#define TP_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_dtype {
    TP_DTYPE_F32,
    TP_DTYPE_F16,
    TP_DTYPE_BF16,
    TP_DTYPE_I32,
    TP_DTYPE_COUNT
} tp_dtype;

size_t tp_dtype_size(tp_dtype dt);
const char *tp_dtype_name(tp_dtype dt); /* "float32", "float16", "bfloat16", "int32" */
/* Parses the names of --dtype and config.json's torch_dtype ("float32", "fp32", "bfloat16", ...). */
int tp_dtype_from_name(const char *name, tp_dtype *out);

float tp_bf16_to_f32(uint16_t h);
uint16_t tp_f32_to_bf16(float f);
float tp_f16_to_f32(uint16_t h);
uint16_t tp_f32_to_f16(float f);

/* Convert n elements between float types (F32/F16/BF16); src and dst may be unaligned. */
void tp_convert(void *dst, tp_dtype dst_dt, const void *src, tp_dtype src_dt, size_t n);

#ifdef __cplusplus
}
#endif
#endif
