/*
 * st_builder.c: safetensors images and temp files for the tests. Allocation failures
 * abort: these run only in tests, never on user input.
 */
#include "st_builder.h"

#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) abort();
    return q;
}

void stb_append(stb_str *b, const void *data, size_t len)
{
    if (b->len + len + 1 > b->cap) {
        b->cap = (b->len + len + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, data, len);
    b->len += len;
    b->s[b->len] = '\0';
}

static void vappendf(stb_str *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) abort();
    char *tmp = xrealloc(NULL, (size_t)n + 1);
    vsnprintf(tmp, (size_t)n + 1, fmt, ap);
    stb_append(b, tmp, (size_t)n);
    free(tmp);
}

void stb_appendf(stb_str *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vappendf(b, fmt, ap);
    va_end(ap);
}

char *stb_strdupf(const char *fmt, ...)
{
    stb_str b = {0};
    va_list ap;
    va_start(ap, fmt);
    vappendf(&b, fmt, ap);
    va_end(ap);
    if (!b.s) stb_append(&b, "", 0);
    return b.s;
}

unsigned char *stb_image(uint64_t n_declared, const void *header, size_t hlen, size_t data_len,
                         size_t *len)
{
    *len = 8 + hlen + data_len;
    unsigned char *img = xrealloc(NULL, *len);
    for (int i = 0; i < 8; i++) img[i] = (unsigned char)(n_declared >> (8 * i));
    if (hlen) memcpy(img + 8, header, hlen);
    memset(img + 8 + hlen, 0, data_len);
    return img;
}

unsigned char *stb_build(const stb_tensor *t, size_t n, const char *metadata, int hdr_mod8,
                         size_t *len)
{
    stb_str h = {0};
    stb_append(&h, "{", 1);
    if (metadata) stb_appendf(&h, "\"__metadata__\":%s", metadata);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        stb_appendf(&h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", (metadata || i) ? "," : "",
                    t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].rank; d++)
            stb_appendf(&h, "%s%" PRId64, d ? "," : "", t[i].shape[d]);
        stb_appendf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    stb_append(&h, "}", 1);
    while (hdr_mod8 >= 0 && h.len % 8 != (size_t)hdr_mod8) stb_append(&h, " ", 1);
    unsigned char *img = stb_image(h.len, h.s, h.len, off, len);
    off = 8 + h.len;
    for (size_t i = 0; i < n; i++) {
        if (t[i].nbytes) memcpy(img + off, t[i].data, t[i].nbytes);
        off += t[i].nbytes;
    }
    free(h.s);
    return img;
}

char *stb_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *tmpl = stb_strdupf("%s/tpinfer-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpl)) {
        free(tmpl);
        return NULL;
    }
    return tmpl;
}

int stb_write(const char *dir, const char *name, const void *data, size_t len)
{
    char *path = stb_strdupf("%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    free(path);
    if (fd < 0) return -1;
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return close(fd);
}

int stb_write_text(const char *dir, const char *name, const char *text)
{
    return stb_write(dir, name, text, strlen(text));
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    return type == FTW_DP ? rmdir(path) : unlink(path);
}

void stb_rmtree(const char *dir)
{
    if (dir) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
