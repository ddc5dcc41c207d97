/*
 * util.h: small checked helpers shared by every module: whole-file reads with a size
 * cap, overflow-checked size arithmetic, and strict number parsing.
 */
#ifndef TP_UTIL_H
#define TP_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TP_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* Read a whole file (at most max_bytes) into a NUL-terminated malloc'ed buffer.
 * A missing file is TP_ERR_IO with a message naming path and the OS reason. */
tp_status tp_read_file(const char *path, size_t max_bytes, char **out, size_t *len);

/* 64-bit FNV-1a over n bytes, continuing from h (TP_FNV_OFFSET to start). */
#define TP_FNV_OFFSET UINT64_C(0xcbf29ce484222325)
uint64_t tp_fnv1a(uint64_t h, const void *data, size_t n);

/* "dir/name" in a malloc'ed string (NULL on OOM). */
char *tp_path_join(const char *dir, const char *name);

/* Overflow-checked arithmetic: return 0 on overflow, 1 on success. */
static inline int tp_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline int tp_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* Seconds on CLOCK_MONOTONIC (durations; it keeps counting while the process is stopped). */
double tp_monotonic_s(void);

/* bytes as "738.25 KiB", "4 KiB", "1.50 GiB" (powers of 1024; no decimals when whole). */
void tp_format_bytes(int64_t bytes, char *out, size_t cap);

/* Parse a whole string as a base-10 integer / finite double; 0 on any junk, overflow
 * or empty input ("2x", "1e3" for ints, "", "99999999999999999999"). */
int tp_parse_i64(const char *s, int64_t *out);
int tp_parse_double(const char *s, double *out);

#ifdef __cplusplus
}
#endif
#endif
