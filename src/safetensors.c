/*
 * safetensors.c: the strict safetensors reader. The header length is bounded before any
 * allocation, the JSON header is parsed by jansson with duplicate keys rejected, and every
 * tensor's dtype, shape and byte range is checked (anchors/reliability.md §1.5) before the
 * file is mapped. Reads copy from the map with memcpy, as tensors may sit unaligned.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "util.h"

static const struct {
    const char *name;
    unsigned bits;
} st_dtypes[TP_ST_DTYPE_COUNT] = {
    [TP_ST_F4] = {"F4", 4},           [TP_ST_F6_E2M3] = {"F6_E2M3", 6},
    [TP_ST_F6_E3M2] = {"F6_E3M2", 6}, [TP_ST_BOOL] = {"BOOL", 8},
    [TP_ST_U8] = {"U8", 8},           [TP_ST_I8] = {"I8", 8},
    [TP_ST_F8_E5M2] = {"F8_E5M2", 8}, [TP_ST_F8_E4M3] = {"F8_E4M3", 8},
    [TP_ST_F8_E8M0] = {"F8_E8M0", 8}, [TP_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [TP_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8}, [TP_ST_I16] = {"I16", 16},
    [TP_ST_U16] = {"U16", 16},        [TP_ST_F16] = {"F16", 16},
    [TP_ST_BF16] = {"BF16", 16},      [TP_ST_I32] = {"I32", 32},
    [TP_ST_U32] = {"U32", 32},        [TP_ST_F32] = {"F32", 32},
    [TP_ST_I64] = {"I64", 64},        [TP_ST_U64] = {"U64", 64},
    [TP_ST_F64] = {"F64", 64},        [TP_ST_C64] = {"C64", 64},
};

const char *tp_st_dtype_name(tp_st_dtype dt)
{
    return (unsigned)dt < TP_ST_DTYPE_COUNT ? st_dtypes[dt].name : "unknown";
}

unsigned tp_st_dtype_bits(tp_st_dtype dt)
{
    return (unsigned)dt < TP_ST_DTYPE_COUNT ? st_dtypes[dt].bits : 0;
}

int tp_st_dtype_to_dtype(tp_st_dtype dt, tp_dtype *out)
{
    switch (dt) {
    case TP_ST_F32: *out = TP_DTYPE_F32; return 1;
    case TP_ST_F16: *out = TP_DTYPE_F16; return 1;
    case TP_ST_BF16: *out = TP_DTYPE_BF16; return 1;
    case TP_ST_I32: *out = TP_DTYPE_I32; return 1;
    default: return 0;
    }
}

int64_t tp_st_numel(const tp_st_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

/* Messages: "<file>: tensor "<name>": <reason>". Long names are cut so the reason shows. */
static tp_status st_fail(tp_status st, const tp_st_file *f, const char *tensor, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));
static tp_status st_fail(tp_status st, const tp_st_file *f, const char *tensor, const char *fmt,
                         ...)
{
    char reason[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    const char *path = f->path ? f->path : "<buffer>";
    if (!tensor) return tp_error(st, "%s: %s", path, reason);
    int cut = strlen(tensor) > 200;
    return tp_error(st, "%s: tensor \"%.200s%s\": %s", path, tensor, cut ? "..." : "", reason);
}

/* ---- header fields ---------------------------------------------------------------- */

static tp_status parse_dtype(const tp_st_file *f, const char *name, json_t *v, tp_st_tensor *t)
{
    if (!json_is_string(v)) return st_fail(TP_ERR_FORMAT, f, name, "dtype is not a string");
    const char *s = json_string_value(v);
    for (int i = 0; i < TP_ST_DTYPE_COUNT; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            t->dtype = (tp_st_dtype)i;
            return TP_OK;
        }
    }
    return st_fail(TP_ERR_FORMAT, f, name,
                   "unknown dtype \"%.40s\" (names are case-sensitive, e.g. F32, BF16)", s);
}

static tp_status parse_shape(const tp_st_file *f, const char *name, json_t *v, tp_st_tensor *t)
{
    if (!json_is_array(v)) return st_fail(TP_ERR_FORMAT, f, name, "shape is not an array");
    size_t rank = json_array_size(v);
    if (rank > TP_ST_MAX_RANK)
        return st_fail(TP_ERR_FORMAT, f, name, "shape has rank %zu, more than the %d allowed",
                       rank, TP_ST_MAX_RANK);
    /* Also bound the product of the non-zero dims, so a 2-D view of an empty tensor
     * (e.g. [0, 2^40, 2^40]) cannot overflow either. */
    uint64_t nonzero = 1;
    for (size_t i = 0; i < rank; i++) {
        json_t *d = json_array_get(v, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return st_fail(TP_ERR_FORMAT, f, name,
                           "shape[%zu] is not a non-negative integer", i);
        t->shape[i] = json_integer_value(d);
        uint64_t dim = t->shape[i] ? (uint64_t)t->shape[i] : 1;
        if (!tp_mul_u64(nonzero, dim, &nonzero) || nonzero > INT64_MAX)
            return st_fail(TP_ERR_FORMAT, f, name, "shape's element count overflows");
    }
    t->rank = (int)rank;
    return TP_OK;
}

static tp_status parse_offsets(const tp_st_file *f, const char *name, json_t *v,
                               tp_st_tensor *t)
{
    if (!json_is_array(v) || json_array_size(v) != 2)
        return st_fail(TP_ERR_FORMAT, f, name, "data_offsets is not an array of 2 integers");
    json_t *b = json_array_get(v, 0), *e = json_array_get(v, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < 0)
        return st_fail(TP_ERR_FORMAT, f, name,
                       "data_offsets are not 2 non-negative integers");
    t->begin = (uint64_t)json_integer_value(b);
    t->end = (uint64_t)json_integer_value(e);
    if (t->begin > t->end)
        return st_fail(TP_ERR_FORMAT, f, name, "data_offsets [%" PRIu64 ", %" PRIu64
                       "]: begin is after end", t->begin, t->end);
    return TP_OK;
}

static void format_shape(const tp_st_tensor *t, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->rank && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

/* dtype x shape must need exactly end - begin bytes, in whole bytes. */
static tp_status check_size(const tp_st_file *f, const char *name, const tp_st_tensor *t)
{
    uint64_t numel = (uint64_t)tp_st_numel(t), bits; /* bounded by parse_shape */
    const char *why = NULL;
    if (!tp_mul_u64(numel, tp_st_dtype_bits(t->dtype), &bits)) why = "overflows in bits";
    else if (bits % 8 != 0) why = "is not a whole number of bytes";
    else if (t->end - t->begin == bits / 8) return TP_OK;
    char shape[256];
    format_shape(t, shape, sizeof shape);
    if (why)
        return st_fail(TP_ERR_FORMAT, f, name, "%s shape %s %s", tp_st_dtype_name(t->dtype),
                       shape, why);
    return st_fail(TP_ERR_FORMAT, f, name, "data_offsets [%" PRIu64 ", %" PRIu64 "] span %"
                   PRIu64 " bytes but %s shape %s needs %" PRIu64, t->begin, t->end,
                   t->end - t->begin, tp_st_dtype_name(t->dtype), shape, bits / 8);
}

static tp_status parse_tensor(const tp_st_file *f, const char *name, json_t *v, tp_st_tensor *t)
{
    if (strlen(name) > TP_ST_MAX_NAME)
        return st_fail(TP_ERR_FORMAT, f, name, "name is %zu bytes, more than the %d allowed",
                       strlen(name), TP_ST_MAX_NAME);
    if (!json_is_object(v)) return st_fail(TP_ERR_FORMAT, f, name, "entry is not an object");
    const char *key;
    json_t *field;
    json_object_foreach(v, key, field) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return st_fail(TP_ERR_FORMAT, f, name, "unknown field \"%.64s\" (only dtype, "
                           "shape and data_offsets are allowed)", key);
    }
    static const char *const required[] = {"dtype", "shape", "data_offsets"};
    for (size_t i = 0; i < 3; i++) {
        if (!json_object_get(v, required[i]))
            return st_fail(TP_ERR_FORMAT, f, name, "missing field \"%s\"", required[i]);
    }
    TP_CHECK(parse_dtype(f, name, json_object_get(v, "dtype"), t));
    TP_CHECK(parse_shape(f, name, json_object_get(v, "shape"), t));
    TP_CHECK(parse_offsets(f, name, json_object_get(v, "data_offsets"), t));
    return check_size(f, name, t);
}

static tp_status parse_metadata(const tp_st_file *f, json_t *v, size_t *count)
{
    if (!json_is_object(v)) return st_fail(TP_ERR_FORMAT, f, NULL, "__metadata__ is not an object");
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (!json_is_string(val))
            return st_fail(TP_ERR_FORMAT, f, NULL, "__metadata__ value \"%.64s\" is not a string",
                           key);
    }
    *count = json_object_size(v);
    return TP_OK;
}

/* ---- layout: the tensors must tile the data region exactly ----------------------- */

static int by_offset(const void *a, const void *b)
{
    const tp_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1; /* empty tensors first */
    return strcmp(x->name, y->name);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const tp_st_tensor *)a)->name, ((const tp_st_tensor *)b)->name);
}

static tp_status check_layout(tp_st_file *f)
{
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, by_offset);
    uint64_t end = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const tp_st_tensor *t = &f->tensors[i];
        if (t->begin < end)
            return st_fail(TP_ERR_FORMAT, f, t->name, "data_offsets [%" PRIu64 ", %" PRIu64
                           "] overlap tensor \"%.200s\", which ends at %" PRIu64,
                           t->begin, t->end, f->tensors[i - 1].name, end);
        if (t->begin > end && i == 0)
            return st_fail(TP_ERR_FORMAT, f, t->name, "data_offsets [%" PRIu64 ", %" PRIu64
                           "] start at %" PRIu64 ", but the first tensor must start at 0",
                           t->begin, t->end, t->begin);
        if (t->begin > end)
            return st_fail(TP_ERR_FORMAT, f, t->name, "data_offsets [%" PRIu64 ", %" PRIu64
                           "] leave a gap after tensor \"%.200s\", which ends at %" PRIu64,
                           t->begin, t->end, f->tensors[i - 1].name, end);
        end = t->end;
    }
    uint64_t need;
    if (!tp_add_u64(f->data_offset, end, &need) || need > f->file_size)
        return st_fail(TP_ERR_FORMAT, f, NULL, "file is truncated: it has %" PRIu64 " bytes but "
                       "the header and data_offsets need %" PRIu64 " + %" PRIu64,
                       f->file_size, f->data_offset, end);
    if (need < f->file_size)
        return st_fail(TP_ERR_FORMAT, f, NULL, "file has %" PRIu64 " bytes but the header and "
                       "data_offsets account for %" PRIu64 ": %" PRIu64 " trailing bytes after "
                       "the last tensor", f->file_size, need, f->file_size - need);
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, by_name);
    return TP_OK;
}

/* ---- the header as a whole ------------------------------------------------------- */

static tp_status check_header_length(const tp_st_file *f, uint64_t n)
{
    if (n > TP_ST_MAX_HEADER)
        return st_fail(TP_ERR_FORMAT, f, NULL, "header length %" PRIu64 " exceeds the %llu-byte "
                       "limit", n, TP_ST_MAX_HEADER);
    if (n > f->file_size - 8)
        return st_fail(TP_ERR_FORMAT, f, NULL, "header length %" PRIu64 " exceeds the %" PRIu64
                       " bytes after the length field", n, f->file_size - 8);
    if (n < 2) return st_fail(TP_ERR_FORMAT, f, NULL, "header length %" PRIu64 " is too small "
                              "for a JSON object", n);
    return TP_OK;
}

/* The tensors and their names share one allocation: names live after the array, so a
 * header of many tensors costs one malloc, and sorting moves only the structs. */
static tp_status parse_entries(tp_st_file *f, json_t *root)
{
    size_t n = json_object_size(root), names = 0;
    if (n > TP_ST_MAX_TENSORS)
        return st_fail(TP_ERR_FORMAT, f, NULL, "header has %zu entries, more than the %d "
                       "tensors allowed", n, TP_ST_MAX_TENSORS);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) names += strlen(key) + 1; /* bounded by the header */
    f->tensors = calloc(1, n * sizeof *f->tensors + names);
    if (!f->tensors) return tp_error(TP_ERR_OOM, "out of memory reading %s", f->path);
    char *next = (char *)(f->tensors + n);
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            TP_CHECK(parse_metadata(f, v, &f->n_metadata));
            continue;
        }
        tp_st_tensor *t = &f->tensors[f->n_tensors];
        TP_CHECK(parse_tensor(f, key, v, t));
        t->name = strcpy(next, key);
        next += strlen(key) + 1;
        f->n_tensors++;
    }
    return TP_OK;
}

/* hdr holds the n header bytes; f->path and f->file_size are set. */
static tp_status parse_header(tp_st_file *f, const char *hdr, uint64_t n)
{
    f->data_offset = 8 + n;
    /* jansson rejects these too, but with messages that do not say why. */
    const char *nul = memchr(hdr, 0, (size_t)n);
    if (nul)
        return st_fail(TP_ERR_FORMAT, f, NULL, "header has a NUL byte at offset %zu (headers "
                       "are padded with spaces)", (size_t)(nul - hdr));
    if (n >= 3 && memcmp(hdr, "\xef\xbb\xbf", 3) == 0)
        return st_fail(TP_ERR_FORMAT, f, NULL, "header starts with a UTF-8 byte order mark");
    json_error_t err;
    json_t *root = json_loadb(hdr, (size_t)n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
    if (!root)
        return st_fail(TP_ERR_FORMAT, f, NULL, "invalid JSON header: %s (at byte %d)", err.text,
                       err.position);
    tp_status st = TP_OK;
    if (!json_is_object(root)) st = st_fail(TP_ERR_FORMAT, f, NULL, "header is not a JSON object");
    if (st == TP_OK) st = parse_entries(f, root);
    if (st == TP_OK) st = check_layout(f);
    json_decref(root);
    return st;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

tp_status tp_st_parse_buffer(const void *buf, size_t len, const char *what, tp_st_file *f)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!(f->path = strdup(what ? what : "<buffer>")))
        return tp_error(TP_ERR_OOM, "out of memory");
    f->file_size = len;
    tp_status st = TP_OK;
    if (len < 8)
        st = st_fail(TP_ERR_FORMAT, f, NULL, "%zu bytes is shorter than the 8-byte header "
                     "length", len);
    uint64_t n = st == TP_OK ? le64(buf) : 0;
    if (st == TP_OK) st = check_header_length(f, n);
    if (st == TP_OK) st = parse_header(f, (const char *)buf + 8, n);
    if (st != TP_OK) {
        tp_st_free(f);
        return st;
    }
    f->map = buf;
    return TP_OK;
}

static tp_status pread_all(const tp_st_file *f, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(f->fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return st_fail(TP_ERR_IO, f, NULL, "read failed: %s", strerror(errno));
        if (r == 0) return st_fail(TP_ERR_IO, f, NULL, "file shrank while reading its header");
        got += (size_t)r;
    }
    return TP_OK;
}

/* Everything of tp_st_open after the open(): size, header, validation, map. */
static tp_status open_fd(tp_st_file *f)
{
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) return st_fail(TP_ERR_IO, f, NULL, "fstat: %s", strerror(errno));
    if (!S_ISREG(sb.st_mode)) return st_fail(TP_ERR_IO, f, NULL, "not a regular file");
    f->file_size = (uint64_t)sb.st_size;
    if (f->file_size < 8)
        return st_fail(TP_ERR_FORMAT, f, NULL, "%" PRIu64 " bytes is shorter than the 8-byte "
                       "header length", f->file_size);
    if (f->file_size > SIZE_MAX) return st_fail(TP_ERR_UNSUPPORTED, f, NULL, "file too large");
    unsigned char len8[8];
    TP_CHECK(pread_all(f, len8, 8, 0));
    uint64_t n = le64(len8);
    TP_CHECK(check_header_length(f, n)); /* before the allocation it bounds */
    char *hdr = malloc((size_t)n);
    if (!hdr) return tp_error(TP_ERR_OOM, "out of memory reading the header of %s", f->path);
    tp_status st = pread_all(f, hdr, (size_t)n, 8);
    if (st == TP_OK) st = parse_header(f, hdr, n);
    free(hdr);
    if (st != TP_OK || f->file_size == f->data_offset) return st; /* no data: nothing to map */
    void *m = mmap(NULL, (size_t)f->file_size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (m == MAP_FAILED) return st_fail(TP_ERR_IO, f, NULL, "mmap: %s", strerror(errno));
    f->map = m;
    return TP_OK;
}

tp_status tp_st_open(const char *path, tp_st_file *f)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!(f->path = strdup(path))) return tp_error(TP_ERR_OOM, "out of memory");
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: refused, not waited on */
    tp_status st = f->fd < 0 ? st_fail(TP_ERR_IO, f, NULL, "cannot open: %s", strerror(errno))
                             : open_fd(f);
    if (st != TP_OK) tp_st_free(f);
    return st;
}

void tp_st_free(tp_st_file *f)
{
    if (!f) return;
    /* A zeroed struct has no path; only a file we opened has fd >= 0 with a path. */
    if (f->path && f->fd >= 0) {
        if (f->map) munmap((void *)f->map, (size_t)f->file_size);
        close(f->fd);
    }
    free(f->tensors); /* the names too */
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const tp_st_tensor *tp_st_find(const tp_st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->tensors[mid].name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

/* ---- reading ---------------------------------------------------------------------- */

static tp_status check_convertible(const tp_st_file *f, const tp_st_tensor *t, tp_dtype dst_dt,
                                   tp_dtype *src_dt)
{
    if (!tp_st_dtype_to_dtype(t->dtype, src_dt))
        return st_fail(TP_ERR_UNSUPPORTED, f, NULL, "unsupported dtype %s for tensor \"%.200s\" "
                       "(tpinfer loads F32, F16, BF16)", tp_st_dtype_name(t->dtype), t->name);
    if ((unsigned)dst_dt >= TP_DTYPE_COUNT ||
        (*src_dt == TP_DTYPE_I32) != (dst_dt == TP_DTYPE_I32))
        return st_fail(TP_ERR_INVALID_ARG, f, t->name, "cannot load %s data as %s",
                       tp_st_dtype_name(t->dtype), tp_dtype_name(dst_dt));
    return TP_OK;
}

static tp_status check_slice(const tp_st_file *f, const tp_st_tensor *t, tp_slice s,
                             int64_t *cols)
{
    int64_t rows = t->rank ? t->shape[0] : 1;
    *cols = 1;
    for (int i = 1; i < t->rank; i++) *cols *= t->shape[i]; /* bounded at parse time */
    if (s.row0 < 0 || s.nrows < 0 || s.row0 > rows || s.nrows > rows - s.row0 ||
        s.col0 < 0 || s.ncols < 0 || s.col0 > *cols || s.ncols > *cols - s.col0)
        return st_fail(TP_ERR_INVALID_ARG, f, t->name, "slice rows [%" PRId64 ", +%" PRId64
                       "), cols [%" PRId64 ", +%" PRId64 ") is outside its %" PRId64 " x %"
                       PRId64 " view", s.row0, s.nrows, s.col0, s.ncols, rows, *cols);
    return TP_OK;
}

/* The map is only safe to touch while the file still has the size it had at open. */
static tp_status check_unchanged(const tp_st_file *f)
{
    if (f->fd < 0) return TP_OK;
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) return st_fail(TP_ERR_IO, f, NULL, "fstat: %s", strerror(errno));
    if ((uint64_t)sb.st_size != f->file_size)
        return st_fail(TP_ERR_IO, f, NULL, "file changed size since it was opened (%" PRIu64
                       " bytes, now %lld): truncated or rewritten while loading?",
                       f->file_size, (long long)sb.st_size);
    return TP_OK;
}

tp_status tp_st_read_slice(const tp_st_file *f, const tp_st_tensor *t, tp_slice s,
                           tp_dtype dst_dt, void *dst)
{
    tp_dtype src_dt = TP_DTYPE_F32;
    int64_t cols;
    TP_CHECK(check_convertible(f, t, dst_dt, &src_dt));
    TP_CHECK(check_slice(f, t, s, &cols));
    if (s.nrows == 0 || s.ncols == 0) return TP_OK;
    if (!dst) return st_fail(TP_ERR_INVALID_ARG, f, t->name, "no destination buffer");
    TP_CHECK(check_unchanged(f));
    size_t ssz = tp_dtype_size(src_dt), dsz = tp_dtype_size(dst_dt);
    const unsigned char *base = f->map + f->data_offset + t->begin;
    unsigned char *out = dst;
    for (int64_t r = 0; r < s.nrows; r++) {
        uint64_t elem = (uint64_t)(s.row0 + r) * (uint64_t)cols + (uint64_t)s.col0;
        tp_convert(out + (size_t)r * (size_t)s.ncols * dsz, dst_dt, base + elem * ssz, src_dt,
                   (size_t)s.ncols);
    }
    return TP_OK;
}
