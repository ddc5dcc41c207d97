/*
 * st_write.c: a small safetensors writer with jansson for the header.
 */
#include "st_write.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static tp_status write_all(int fd, const void *p, size_t n, const char *path)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return tp_error(TP_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        c += w;
        n -= (size_t)w;
    }
    return TP_OK;
}

static char *header_text(const tp_st_out_tensor *t, int n, const char *const *meta, int n_meta,
                         size_t *len)
{
    json_t *h = json_object();
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].rank; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", t[i].dtype, "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + t[i].bytes)));
        off += t[i].bytes;
    }
    if (n_meta) {
        json_t *m = json_object();
        for (int i = 0; i < n_meta; i++) json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1]));
        json_object_set_new(h, "__metadata__", m);
    }
    char *s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!s) return NULL;
    size_t l = strlen(s), padded = (l + 7) / 8 * 8;
    char *p = realloc(s, padded + 1);
    if (!p) {
        free(s);
        return NULL;
    }
    memset(p + l, ' ', padded - l);
    p[padded] = '\0';
    *len = padded;
    return p;
}

tp_status tp_st_write(const char *path, const tp_st_out_tensor *t, int n, const char *const *meta,
                      int n_meta)
{
    size_t hlen;
    char *header = header_text(t, n, meta, n_meta, &hlen);
    if (!header) return tp_error(TP_ERR_OOM, "out of memory writing %s", path);
    size_t plen = strlen(path) + 16;
    char *tmp = malloc(plen);
    if (!tmp) {
        free(header);
        return tp_error(TP_ERR_OOM, "out of memory");
    }
    snprintf(tmp, plen, "%s.tmp", path);
    tp_status st = TP_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = tp_error(TP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    st = write_all(fd, len8, 8, tmp);
    if (st == TP_OK) st = write_all(fd, header, hlen, tmp);
    for (int i = 0; i < n && st == TP_OK; i++) st = write_all(fd, t[i].data, t[i].bytes, tmp);
    if (st == TP_OK && fsync(fd) != 0) st = tp_error(TP_ERR_IO, "cannot fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == TP_OK) st = tp_error(TP_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
    if (st == TP_OK && rename(tmp, path) != 0)
        st = tp_error(TP_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != TP_OK) unlink(tmp);
out:
    free(tmp);
    free(header);
    return st;
}
