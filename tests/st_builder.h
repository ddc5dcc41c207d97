/*
 * st_builder.h: test helpers that build safetensors images in memory (u64 LE header
 * length + header text + data bytes) and write files into a fresh mkdtemp directory,
 * so each test makes exactly the malformed or valid input it needs.
 */
#ifndef TP_ST_BUILDER_H
#define TP_ST_BUILDER_H

#include <stddef.h>
#include <stdint.h>

/* A growing byte string, always NUL-terminated. */
typedef struct stb_str {
    char *s;
    size_t len, cap;
} stb_str;

void stb_append(stb_str *b, const void *data, size_t len);
void stb_appendf(stb_str *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *stb_strdupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* u64le(n_declared) + header[0, hlen) + data_len zero bytes, malloc'ed. */
unsigned char *stb_image(uint64_t n_declared, const void *header, size_t hlen, size_t data_len,
                         size_t *len);

typedef struct stb_tensor {
    const char *name;
    const char *dtype;  /* a safetensors dtype name */
    int rank;
    int64_t shape[8];
    const void *data;   /* nbytes bytes, copied as they are */
    size_t nbytes;
} stb_tensor;

/* The tensors back to back in the given order. The header is padded with spaces so its
 * length is hdr_mod8 modulo 8 (no padding when hdr_mod8 < 0); metadata is JSON object
 * text or NULL. */
unsigned char *stb_build(const stb_tensor *t, size_t n, const char *metadata, int hdr_mod8,
                         size_t *len);

/* A fresh directory under $TMPDIR (or /tmp), malloc'ed path; NULL on failure. */
char *stb_tmpdir(void);
/* Write dir/name; returns 0 on success. */
int stb_write(const char *dir, const char *name, const void *data, size_t len);
int stb_write_text(const char *dir, const char *name, const char *text);
/* Remove dir and everything under it (symlinks are removed, not followed). */
void stb_rmtree(const char *dir);

#endif
