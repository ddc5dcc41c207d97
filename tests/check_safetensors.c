/*
 * check_safetensors.c: the safetensors reader against anchors/reliability.md: the
 * malformed S-cases of §3.2 (table-driven, each with its status and message), the valid
 * cases of the §1.4 differential table, every shared model file, slice reads from
 * misaligned tensors, truncation under the map, and the dtype conversions.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "safetensors.h"
#include "st_builder.h"
#include "status.h"

/* One tensor entry of a header: T("a", "F32", "[2]", "[0,8]"). */
#define T(name, dt, shape, off) \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"
#define A8 T("a", "F32", "[2]", "[0,8]") /* the common valid tensor, 8 data bytes */

/* Time bounds: jansson's allocations dominate, and ASan makes them ~3x slower. */
#ifdef __SANITIZE_ADDRESS__
#define SLOW 3.0
#else
#define SLOW 1.0
#endif

/* This thread's CPU time: the bounds catch quadratic parsing, and other processes
 * sharing a loaded machine (CI, parallel make check) do not count against them. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- header generators ------------------------------------------------------------ */

static char *gen_rank1000(size_t *len)
{
    stb_str b = {0};
    stb_appendf(&b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1");
    for (int i = 1; i < 1000; i++) stb_appendf(&b, ",1");
    stb_appendf(&b, "],\"data_offsets\":[0,4]}}");
    *len = b.len;
    return b.s;
}

static char *gen_name(size_t name_len)
{
    char *name = malloc(name_len + 1);
    memset(name, 'n', name_len);
    name[name_len] = '\0';
    char *h = stb_strdupf("{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                          name);
    free(name);
    return h;
}

static char *gen_name_1mb(size_t *len)
{
    char *h = gen_name(1u << 20);
    *len = strlen(h);
    return h;
}

static char *gen_name_65537(size_t *len)
{
    char *h = gen_name(TP_ST_MAX_NAME + 1);
    *len = strlen(h);
    return h;
}

static char *gen_nested_metadata(size_t *len)
{
    stb_str b = {0};
    stb_appendf(&b, "{\"__metadata__\":");
    for (int i = 0; i < 100000; i++) stb_appendf(&b, "{\"x\":");
    stb_appendf(&b, "\"y\"");
    for (int i = 0; i < 100000; i++) stb_appendf(&b, "}");
    stb_appendf(&b, "}");
    *len = b.len;
    return b.s;
}

static char *gen_too_many(size_t *len)
{
    stb_str b = {0};
    stb_appendf(&b, "{");
    for (int i = 0; i <= TP_ST_MAX_TENSORS; i++) stb_appendf(&b, "%s\"%x\":0", i ? "," : "", i);
    stb_appendf(&b, "}");
    *len = b.len;
    return b.s;
}

/* ---- image generators (the length field itself is bad) ------------------------------ */

static unsigned char *image_n(uint64_t n, size_t real_header, size_t *len)
{
    return stb_image(n, "{}                              ", real_header, 0, len);
}

static unsigned char *img_empty(size_t *len) { *len = 0; return malloc(1); }
static unsigned char *img_7(size_t *len) { *len = 7; return calloc(1, 7); }
static unsigned char *img_n0(size_t *len) { return image_n(0, 0, len); }
static unsigned char *img_past(size_t *len) { return image_n(100, 20, len); }
static unsigned char *img_99m(size_t *len) { return image_n(99999999, 20, len); }
static unsigned char *img_u64max(size_t *len) { return image_n(UINT64_MAX, 2, len); }
static unsigned char *img_2p63(size_t *len) { return image_n(1ull << 63, 2, len); }
static unsigned char *img_100m1(size_t *len) { return image_n(100000001, 2, len); }

/* ---- malformed cases ------------------------------------------------------------- */

typedef struct bad_case {
    const char *name;
    const char *header;                  /* header text ... */
    size_t hlen;                         /* 0: strlen(header) */
    char *(*hgen)(size_t *hlen);         /* ... or generated */
    unsigned char *(*igen)(size_t *len); /* ... or the whole image generated */
    size_t data;                         /* data bytes after the header */
    const char *msg;                     /* a substring the message must contain */
} bad_case;

#define HDR(n, h, d, m) {n, h, 0, NULL, NULL, d, m}
#define RAW(n, h, d, m) {n, h, sizeof(h) - 1, NULL, NULL, d, m}
#define HGEN(n, g, d, m) {n, NULL, 0, g, NULL, d, m}
#define IGEN(n, g, m) {n, NULL, 0, NULL, g, 0, m}

static const bad_case bad_cases[] = {
    /* S1-S5: the length field */
    IGEN("S1 file of 0 bytes", img_empty, "8-byte header length"),
    IGEN("S1 file of 7 bytes", img_7, "8-byte header length"),
    IGEN("S2 N = 0", img_n0, "header length 0"),
    IGEN("S3 N > file size - 8", img_past, "header length 100 exceeds the 20 bytes"),
    IGEN("S3 N = 99,999,999 in a small file", img_99m, "header length 99999999 exceeds the 20"),
    IGEN("S4 N = 2^64-1", img_u64max, "header length 18446744073709551615"),
    IGEN("S4 N = 2^63", img_2p63, "header length 9223372036854775808"),
    IGEN("S5 N = 100,000,001", img_100m1, "100000000-byte limit"),
    /* S6-S9: the JSON text */
    RAW("S6 byte 0xFF", "{\"\xff\":1}", 0, "invalid JSON"),
    RAW("S6 overlong UTF-8", "{\"__metadata__\":{\"x\":\"\xc0\xaf\"}}", 0, "invalid JSON"),
    HDR("S6 lone surrogate", "{\"\\ud800\":" "{\"dtype\":\"F32\"}}", 0, "invalid JSON"),
    HDR("S7 lone brace", "{ ", 0, "invalid JSON"),
    HDR("S7 truncated", "{\"a\":{\"dtype\":\"F32\"", 0, "invalid JSON"),
    HDR("S7 trailing comma", "{" A8 ",}", 8, "invalid JSON"),
    HDR("S7 two objects", "{}{}", 0, "invalid JSON"),
    HDR("S7 junk after object", "{} x", 0, "invalid JSON"),
    HDR("S8 top-level array", "[]", 0, "not a JSON object"),
    HDR("S8 top-level number", "42", 0, "not a JSON object"),
    HDR("S8 top-level string", "\"x\"", 0, "not a JSON object"),
    RAW("S9 NUL padding", "{}\0\0\0\0\0\0", 0, "NUL byte at offset 2"),
    RAW("S9 NUL inside", "{\"a\0\":1}", 0, "NUL byte at offset 3"),
    RAW("S9 BOM", "\xef\xbb\xbf{}", 0, "byte order mark"),
    /* S10-S14: dtype and shape */
    HDR("S10 dtype F128", "{" T("a", "F128", "[2]", "[0,8]") "}", 8, "unknown dtype \"F128\""),
    HDR("S10 dtype f32", "{" T("a", "f32", "[2]", "[0,8]") "}", 8, "unknown dtype \"f32\""),
    HDR("S10 dtype empty", "{" T("a", "", "[2]", "[0,8]") "}", 8, "unknown dtype \"\""),
    HDR("S10 dtype number", "{\"a\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
        "dtype is not a string"),
    HDR("S12 shape [-2]", "{" T("a", "F32", "[-2]", "[0,8]") "}", 8, "shape[0] is not a non-neg"),
    HDR("S12 shape [2.0]", "{" T("a", "F32", "[2.0]", "[0,8]") "}", 8, "shape[0] is not"),
    HDR("S12 shape [\"2\"]", "{" T("a", "F32", "[\"2\"]", "[0,8]") "}", 8, "shape[0] is not"),
    HDR("S12 shape [2,true]", "{" T("a", "F32", "[2,true]", "[0,8]") "}", 8, "shape[1] is not"),
    HDR("S12 shape null", "{" T("a", "F32", "null", "[0,8]") "}", 8, "shape is not an array"),
    HGEN("S12 rank 1000", gen_rank1000, 4, "rank 1000, more than the 8"),
    HDR("S12 rank 9", "{" T("a", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, "rank 9"),
    HDR("S13 [2^32,2^32]", "{" T("a", "F32", "[4294967296,4294967296]", "[0,8]") "}", 8,
        "overflows"),
    HDR("S13 [2,2^63-1]", "{" T("a", "F32", "[2,9223372036854775807]", "[0,8]") "}", 8,
        "overflows"),
    HDR("S13 [2,2^64-2]", "{" T("a", "F32", "[2,18446744073709551614]", "[0,8]") "}", 8,
        "invalid JSON"),
    HDR("S13 bits overflow", "{" T("a", "F64", "[4611686018427387904]", "[0,8]") "}", 8,
        "overflows in bits"),
    HDR("S14 I32 [2,2] in 4 bytes", "{" T("a", "I32", "[2,2]", "[0,4]") "}", 4,
        "data_offsets [0, 4] span 4 bytes but I32 shape [2, 2] needs 16"),
    HDR("F4 odd count", "{" T("a", "F4", "[3]", "[0,2]") "}", 2, "not a whole number of bytes"),
    HDR("F6 odd count", "{" T("a", "F6_E2M3", "[3]", "[0,2]") "}", 2, "not a whole number"),
    /* S15-S20: offsets and the data region */
    HDR("S15 begin > end", "{" T("a", "F32", "[0]", "[8,0]") "}", 8, "begin is after end"),
    HDR("S16 overlap", "{" A8 "," T("b", "F32", "[1]", "[4,8]") "}", 8, "overlap tensor \"a\""),
    HDR("S16 ten tensors share [0,16]",
        "{" T("a", "F32", "[4]", "[0,16]") "," T("b", "F32", "[4]", "[0,16]") ","
        T("c", "F32", "[4]", "[0,16]") "," T("d", "F32", "[4]", "[0,16]") ","
        T("e", "F32", "[4]", "[0,16]") "," T("f", "F32", "[4]", "[0,16]") ","
        T("g", "F32", "[4]", "[0,16]") "," T("h", "F32", "[4]", "[0,16]") ","
        T("i", "F32", "[4]", "[0,16]") "," T("j", "F32", "[4]", "[0,16]") "}", 16, "overlap"),
    HDR("S17 gap", "{" T("a", "F32", "[1]", "[0,4]") "," T("b", "F32", "[1]", "[8,12]") "}", 12,
        "leave a gap after tensor \"a\""),
    HDR("S18 first not at 0", "{" T("a", "F32", "[1]", "[4,8]") "}", 8,
        "first tensor must start at 0"),
    HDR("S19 trailing bytes", "{" A8 "}", 9, "account for 70: 1 trailing bytes"),
    HDR("S19 one byte short", "{" A8 "}", 7, "truncated"),
    HDR("S19 no data at all", "{" A8 "}", 0, "truncated"),
    HDR("S20 one offset", "{" T("a", "F32", "[2]", "[0]") "}", 8, "not an array of 2"),
    HDR("S20 three offsets", "{" T("a", "F32", "[2]", "[0,8,9]") "}", 8, "not an array of 2"),
    HDR("S20 float offset", "{" T("a", "F32", "[2]", "[0,8.0]") "}", 8, "not 2 non-negative"),
    HDR("S20 negative offset", "{" T("a", "F32", "[2]", "[-8,0]") "}", 8, "not 2 non-negative"),
    HDR("S20 offset 2^63", "{" T("a", "F32", "[2]", "[0,9223372036854775808]") "}", 8,
        "invalid JSON"),
    HDR("S20 offset 2^64", "{" T("a", "F32", "[2]", "[0,18446744073709551616]") "}", 8,
        "invalid JSON"),
    HDR("S20 offsets string", "{" T("a", "F32", "[2]", "\"0,8\"") "}", 8, "not an array of 2"),
    /* S21-S24: fields, duplicates, metadata, names */
    HDR("S21 missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8,
        "missing field \"shape\""),
    HDR("S21 missing dtype", "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
        "missing field \"dtype\""),
    HDR("S21 missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
        "missing field \"data_offsets\""),
    HDR("S21 extra field",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 8,
        "unknown field \"extra\""),
    HDR("entry not an object", "{\"a\":[1]}", 0, "entry is not an object"),
    HDR("S22 duplicate key, same offsets", "{" A8 "," A8 "}", 8, "duplicate"),
    HDR("S22 duplicate key, contiguous", "{" A8 "," T("a", "F32", "[2]", "[8,16]") "}", 16,
        "duplicate"),
    HDR("S23 duplicate __metadata__",
        "{\"__metadata__\":{\"x\":\"1\"},\"__metadata__\":{\"x\":\"1\"}}", 0, "duplicate"),
    HDR("S23 metadata non-string", "{\"__metadata__\":{\"x\":1}}", 0,
        "__metadata__ value \"x\" is not a string"),
    HDR("S23 metadata nested", "{\"__metadata__\":{\"x\":{\"y\":\"z\"}}}", 0,
        "__metadata__ value \"x\" is not a string"),
    HDR("S23 metadata array", "{\"__metadata__\":[\"x\"]}", 0, "__metadata__ is not an object"),
    HDR("S24 NUL in name", "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"
        "[0,8]}}", 8, "invalid JSON"),
    HGEN("S24 1 MB name", gen_name_1mb, 8, "1048576 bytes, more than the 65536"),
    HGEN("S24 name of 65537 bytes", gen_name_65537, 8, "more than the 65536"),
    /* S25-S28 */
    HDR("S25 [0,2] with 8 bytes", "{" T("a", "F32", "[0,2]", "[0,8]") "}", 8, "needs 0"),
    HDR("S26 scalar with 8 bytes", "{" T("a", "I32", "[]", "[0,8]") "}", 8, "I32 shape [] needs 4"),
    HGEN("S28 metadata nested 100000 deep", gen_nested_metadata, 0, "invalid JSON"),
    HGEN("more than 1,000,000 entries", gen_too_many, 0, "more than the 1000000 tensors"),
};

static unsigned char *bad_image(const bad_case *c, size_t *len)
{
    if (c->igen) return c->igen(len);
    char *gen = NULL;
    size_t hlen = c->hlen;
    const char *h = c->header;
    if (c->hgen) h = gen = c->hgen(&hlen);
    else if (!hlen) hlen = strlen(h);
    unsigned char *img = stb_image(hlen, h, hlen, c->data, len);
    free(gen);
    return img;
}

static void expect_error(tp_status got, tp_status want, const char *name, const char *file,
                         const char *msg)
{
    const char *m = tp_error_message();
    ck_assert_msg(got == want, "%s: status %s, want %s (%s)", name, tp_status_str(got),
                  tp_status_str(want), m);
    ck_assert_msg(strstr(m, file), "%s: message does not name %s: %s", name, file, m);
    ck_assert_msg(strstr(m, msg), "%s: message lacks \"%s\": %s", name, msg, m);
}

START_TEST(test_bad_buffer)
{
    const bad_case *c = &bad_cases[_i];
    size_t len;
    unsigned char *img = bad_image(c, &len);
    tp_st_file f;
    tp_error_clear();
    tp_status st = tp_st_parse_buffer(img, len, "bad.safetensors", &f);
    expect_error(st, TP_ERR_FORMAT, c->name, "bad.safetensors", c->msg);
    ck_assert_ptr_null(f.tensors); /* freed on failure */
    free(img);
}
END_TEST

/* The same image as a file through tp_st_open (pread + mmap path). */
START_TEST(test_bad_file)
{
    const bad_case *c = &bad_cases[_i];
    size_t len;
    unsigned char *img = bad_image(c, &len);
    char *dir = stb_tmpdir();
    ck_assert_ptr_nonnull(dir);
    ck_assert_int_eq(stb_write(dir, "bad.safetensors", img, len), 0);
    char *path = stb_strdupf("%s/bad.safetensors", dir);
    tp_st_file f;
    tp_error_clear();
    tp_status st = tp_st_open(path, &f);
    expect_error(st, TP_ERR_FORMAT, c->name, path, c->msg);
    free(path);
    stb_rmtree(dir);
    free(dir);
    free(img);
}
END_TEST

/* ---- valid cases ------------------------------------------------------------------ */

typedef struct good_case {
    const char *name;
    const char *header;
    size_t data;
    size_t n_tensors, n_metadata;
} good_case;

static const good_case good_cases[] = {
    {"valid", "{" A8 "}", 8, 1, 0},
    {"unordered_ok", "{" T("b", "F32", "[2]", "[8,16]") "," A8 "}", 16, 2, 0},
    {"empty_header_obj", "{}", 0, 0, 0},
    {"header_space_padded", "{}      ", 0, 0, 0},
    {"header leading ws", "\t\n{}\r ", 0, 0, 0},
    {"metadata only", "{\"__metadata__\":{}}", 0, 0, 0},
    {"metadata strings", "{\"__metadata__\":{\"format\":\"pt\",\"x\":\"\"}," A8 "}", 8, 1, 2},
    {"zero_sized_tensor", "{" T("a", "F32", "[2,0]", "[0,0]") "}", 0, 1, 0},
    {"zero dim with huge dims", "{" T("a", "F32", "[0,4294967296,4]", "[0,0]") "}", 0, 1, 0},
    {"empty tensors around data", "{" T("z", "F32", "[0]", "[0,0]") "," A8 ","
     T("y", "BF16", "[0,3]", "[8,8]") "}", 8, 3, 0},
    {"scalar", "{" T("a", "I32", "[]", "[0,4]") "}", 4, 1, 0},
    {"key_empty_string", "{" T("", "F32", "[2]", "[0,8]") "}", 8, 1, 0},
    {"name with / and ..", "{" T("../a/./b", "F32", "[2]", "[0,8]") "}", 8, 1, 0},
    {"non-ASCII name", "{" T("gr\xc3\xb6\xc3\x9f" "e \xe2\x82\xac", "F32", "[2]", "[0,8]") "}", 8,
     1, 0},
    {"unsupported dtypes parse", "{" T("a", "F8_E8M0", "[2]", "[0,2]") ","
     T("b", "F4", "[2]", "[2,3]") "," T("c", "C64", "[1]", "[3,11]") ","
     T("d", "BOOL", "[1]", "[11,12]") "," T("e", "F6_E3M2", "[4]", "[12,15]") "}", 15, 5, 0},
    {"all 22 dtypes", "{" T("a", "F4", "[2]", "[0,1]") "," T("b", "F6_E2M3", "[4]", "[1,4]") ","
     T("c", "F6_E3M2", "[4]", "[4,7]") "," T("d", "BOOL", "[1]", "[7,8]") ","
     T("e", "U8", "[1]", "[8,9]") "," T("f", "I8", "[1]", "[9,10]") ","
     T("g", "F8_E5M2", "[1]", "[10,11]") "," T("h", "F8_E4M3", "[1]", "[11,12]") ","
     T("i", "F8_E8M0", "[1]", "[12,13]") "," T("j", "F8_E4M3FNUZ", "[1]", "[13,14]") ","
     T("k", "F8_E5M2FNUZ", "[1]", "[14,15]") "," T("l", "I16", "[1]", "[15,17]") ","
     T("m", "U16", "[1]", "[17,19]") "," T("n", "F16", "[1]", "[19,21]") ","
     T("o", "BF16", "[1]", "[21,23]") "," T("p", "I32", "[1]", "[23,27]") ","
     T("q", "U32", "[1]", "[27,31]") "," T("r", "F32", "[1]", "[31,35]") ","
     T("s", "I64", "[1]", "[35,43]") "," T("t", "U64", "[1]", "[43,51]") ","
     T("u", "F64", "[1]", "[51,59]") "," T("v", "C64", "[1]", "[59,67]") "}", 67, 22, 0},
};

START_TEST(test_good)
{
    const good_case *c = &good_cases[_i];
    size_t len, hlen = strlen(c->header);
    unsigned char *img = stb_image(hlen, c->header, hlen, c->data, &len);
    tp_st_file f;
    tp_error_clear();
    tp_status st = tp_st_parse_buffer(img, len, c->name, &f);
    ck_assert_msg(st == TP_OK, "%s: %s", c->name, tp_error_message());
    ck_assert_uint_eq(f.n_tensors, c->n_tensors);
    ck_assert_uint_eq(f.n_metadata, c->n_metadata);
    ck_assert_uint_eq(f.data_offset, 8 + hlen);
    for (size_t i = 0; i < f.n_tensors; i++) {
        ck_assert_ptr_eq(tp_st_find(&f, f.tensors[i].name), &f.tensors[i]);
        if (i) ck_assert_int_lt(strcmp(f.tensors[i - 1].name, f.tensors[i].name), 0);
    }
    ck_assert_ptr_null(tp_st_find(&f, "no such tensor"));
    tp_st_free(&f);
    free(img);
}
END_TEST

START_TEST(test_dtype_table)
{
    ck_assert_str_eq(tp_st_dtype_name(TP_ST_F8_E4M3FNUZ), "F8_E4M3FNUZ");
    ck_assert_uint_eq(tp_st_dtype_bits(TP_ST_F4), 4);
    ck_assert_uint_eq(tp_st_dtype_bits(TP_ST_F6_E3M2), 6);
    ck_assert_uint_eq(tp_st_dtype_bits(TP_ST_C64), 64);
    tp_dtype dt;
    ck_assert(tp_st_dtype_to_dtype(TP_ST_BF16, &dt) && dt == TP_DTYPE_BF16);
    ck_assert(tp_st_dtype_to_dtype(TP_ST_I32, &dt) && dt == TP_DTYPE_I32);
    ck_assert(!tp_st_dtype_to_dtype(TP_ST_F8_E4M3, &dt));
    ck_assert(!tp_st_dtype_to_dtype(TP_ST_F64, &dt));
}
END_TEST

/* S11: valid but unsupported dtypes parse, and fail clearly when read. */
START_TEST(test_unsupported_read)
{
    const char *h = "{" T("w.f8", "F8_E8M0", "[2]", "[0,2]") "," T("w.f4", "F4", "[2]", "[2,3]")
                    "," T("w.c64", "C64", "[1]", "[3,11]") "," T("w.bool", "BOOL", "[1]", "[11,12]")
                    "}";
    const char *names[] = {"w.f8", "w.f4", "w.c64", "w.bool"};
    const char *dts[] = {"F8_E8M0", "F4", "C64", "BOOL"};
    size_t len;
    unsigned char *img = stb_image(strlen(h), h, strlen(h), 12, &len);
    tp_st_file f;
    ck_assert_int_eq(tp_st_parse_buffer(img, len, "u.safetensors", &f), TP_OK);
    for (int i = 0; i < 4; i++) {
        float out[2];
        tp_error_clear();
        tp_status st = tp_st_read_slice(&f, tp_st_find(&f, names[i]), (tp_slice){0, 1, 0, 1},
                                        TP_DTYPE_F32, out);
        char *want = stb_strdupf("unsupported dtype %s for tensor \"%s\" (tpinfer loads F32, "
                                 "F16, BF16)", dts[i], names[i]);
        expect_error(st, TP_ERR_UNSUPPORTED, names[i], "u.safetensors", want);
        free(want);
    }
    tp_st_free(&f);
    free(img);
}
END_TEST

/* ---- large headers (time and memory bounds) --------------------------------------- */

START_TEST(test_s27_200k_tensors)
{
    enum { N = 200000 };
    stb_str b = {0};
    stb_appendf(&b, "{");
    for (int i = 0; i < N; i++)
        stb_appendf(&b, "%s\"model.layers.%d.w\":{\"dtype\":\"F32\",\"shape\":[1],"
                    "\"data_offsets\":[%d,%d]}", i ? "," : "", i, 4 * i, 4 * i + 4);
    stb_appendf(&b, "}");
    size_t len;
    unsigned char *img = stb_image(b.len, b.s, b.len, 4 * N, &len);
    free(b.s);
    tp_st_file f;
    double t0 = now_s();
    tp_status st = tp_st_parse_buffer(img, len, "big.safetensors", &f);
    double dt = now_s() - t0;
    ck_assert_msg(st == TP_OK, "%s", tp_error_message());
    ck_assert_uint_eq(f.n_tensors, N);
    ck_assert_ptr_nonnull(tp_st_find(&f, "model.layers.123456.w"));
    ck_assert_uint_eq(tp_st_find(&f, "model.layers.123456.w")->begin, 4u * 123456);
    printf("S27: %d tensors parsed in %.2f s\n", N, dt);
    ck_assert_msg(dt < 4.0 * SLOW, "200,000 tensors took %.2f s", dt);
    tp_st_free(&f);
    free(img);
}
END_TEST

START_TEST(test_s5_100mb_header)
{
    size_t hlen = TP_ST_MAX_HEADER, len;
    char *h = malloc(hlen);
    memset(h, ' ', hlen);
    memcpy(h, "{\"__metadata__\":{\"k\":\"v\"}}", 26);
    unsigned char *img = stb_image(hlen, h, hlen, 0, &len);
    free(h);
    tp_st_file f;
    double t0 = now_s();
    tp_status st = tp_st_parse_buffer(img, len, "hdr100m", &f);
    double dt = now_s() - t0;
    ck_assert_msg(st == TP_OK, "%s", tp_error_message());
    ck_assert_uint_eq(f.n_metadata, 1);
    printf("S5: 100,000,000-byte header parsed in %.2f s\n", dt);
    ck_assert_msg(dt < 5.0 * SLOW, "took %.2f s", dt);
    tp_st_free(&f);
    free(img);
}
END_TEST

START_TEST(test_s23_10mb_metadata)
{
    size_t vlen = 10u << 20;
    char *v = malloc(vlen + 1);
    memset(v, 'm', vlen);
    v[vlen] = '\0';
    char *h = stb_strdupf("{\"__metadata__\":{\"big\":\"%s\"}," A8 "}", v);
    free(v);
    size_t len;
    unsigned char *img = stb_image(strlen(h), h, strlen(h), 8, &len);
    free(h);
    tp_st_file f;
    ck_assert_int_eq(tp_st_parse_buffer(img, len, "meta", &f), TP_OK); /* bounded by N */
    ck_assert_uint_eq(f.n_metadata, 1);
    tp_st_free(&f);
    free(img);
}
END_TEST

/* ---- slices ------------------------------------------------------------------------- */

enum { R = 5, C = 7 };

static float value(int i) { return (float)(i - 17) * 0.375f; } /* exact in f16 and bf16 */

/* A file whose F32 tensor starts at data offset 2 and whose header length is 3 mod 8,
 * so no tensor below is 4-byte aligned in the file or the map. */
static unsigned char *slice_image(size_t *len)
{
    static float f32[R * C], f32_3d[24], vec[6], scalar[1];
    static uint16_t f16[R * C], bf16[R * C];
    static int32_t i32[R * C];
    for (int i = 0; i < R * C; i++) {
        f32[i] = value(i);
        f16[i] = tp_f32_to_f16(value(i));
        bf16[i] = tp_f32_to_bf16(value(i));
        i32[i] = i * 1000003 - 7;
    }
    for (int i = 0; i < 24; i++) f32_3d[i] = value(i);
    for (int i = 0; i < 6; i++) vec[i] = value(i);
    scalar[0] = 42.5f;
    static const unsigned char pad[2] = {1, 2};
    stb_tensor t[] = {
        {"pad", "U8", 1, {2}, pad, 2},
        {"f32", "F32", 2, {R, C}, f32, sizeof f32},
        {"f16", "F16", 2, {R, C}, f16, sizeof f16},
        {"bf16", "BF16", 2, {R, C}, bf16, sizeof bf16},
        {"i32", "I32", 2, {R, C}, i32, sizeof i32},
        {"f32_3d", "F32", 3, {2, 3, 4}, f32_3d, sizeof f32_3d},
        {"vec", "F32", 1, {6}, vec, sizeof vec},
        {"scalar", "F32", 0, {0}, scalar, sizeof scalar},
    };
    return stb_build(t, sizeof t / sizeof t[0], "{\"format\":\"pt\"}", 3, len);
}

/* Every slice equals the same part of a full read, for every float source/destination. */
static void check_slices(const tp_st_file *f)
{
    static const char *const srcs[] = {"f32", "f16", "bf16"};
    static const tp_dtype dsts[] = {TP_DTYPE_F32, TP_DTYPE_F16, TP_DTYPE_BF16};
    static const tp_slice slices[] = {{0, R, 0, C}, {1, 3, 0, C}, {0, R, 2, 4}, {2, 2, 3, 3},
                                      {4, 1, 6, 1}, {0, 0, 0, C}, {5, 0, 7, 0}};
    for (size_t si = 0; si < 3; si++) {
        const tp_st_tensor *t = tp_st_find(f, srcs[si]);
        ck_assert_ptr_nonnull(t);
        ck_assert_uint_ne((f->data_offset + t->begin) % 4, 0); /* really misaligned */
        float full[R * C];
        ck_assert_int_eq(tp_st_read_slice(f, t, (tp_slice){0, R, 0, C}, TP_DTYPE_F32, full), TP_OK);
        for (int i = 0; i < R * C; i++) ck_assert_float_eq(full[i], value(i));
        for (size_t di = 0; di < 3; di++) {
            size_t esz = tp_dtype_size(dsts[di]);
            for (size_t k = 0; k < sizeof slices / sizeof slices[0]; k++) {
                tp_slice s = slices[k];
                unsigned char got[R * C * 4 + 1], want[R * C * 4 + 1];
                /* got + 1: the destination is misaligned too */
                ck_assert_int_eq(tp_st_read_slice(f, t, s, dsts[di], got + 1), TP_OK);
                for (int64_t r = 0; r < s.nrows; r++)
                    tp_convert(want + r * s.ncols * esz, dsts[di],
                               &full[(s.row0 + r) * C + s.col0], TP_DTYPE_F32, (size_t)s.ncols);
                ck_assert_mem_eq(got + 1, want, (size_t)(s.nrows * s.ncols) * esz);
            }
        }
    }
}

static void check_views(const tp_st_file *f)
{
    float out[24];
    /* 3-D [2,3,4] is 2 rows of 12; 1-D [6] is 6 rows of 1; a scalar is 1 x 1. */
    ck_assert_int_eq(tp_st_read_slice(f, tp_st_find(f, "f32_3d"), (tp_slice){1, 1, 4, 5},
                                      TP_DTYPE_F32, out), TP_OK);
    for (int i = 0; i < 5; i++) ck_assert_float_eq(out[i], value(12 + 4 + i));
    ck_assert_int_eq(tp_st_read_slice(f, tp_st_find(f, "vec"), (tp_slice){2, 3, 0, 1},
                                      TP_DTYPE_F32, out), TP_OK);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(out[i], value(2 + i));
    ck_assert_int_eq(tp_st_read_slice(f, tp_st_find(f, "scalar"), (tp_slice){0, 1, 0, 1},
                                      TP_DTYPE_F32, out), TP_OK);
    ck_assert_float_eq(out[0], 42.5f);
    int32_t iv[R * C];
    ck_assert_int_eq(tp_st_read_slice(f, tp_st_find(f, "i32"), (tp_slice){1, 2, 3, 2},
                                      TP_DTYPE_I32, iv), TP_OK);
    ck_assert_int_eq(iv[0], (1 * C + 3) * 1000003 - 7);
    ck_assert_int_eq(iv[3], (2 * C + 4) * 1000003 - 7);
}

START_TEST(test_slices_buffer)
{
    size_t len;
    unsigned char *img = slice_image(&len);
    unsigned char *odd = malloc(len + 1); /* the whole image at an odd address */
    memcpy(odd + 1, img, len);
    tp_st_file f;
    ck_assert_int_eq(tp_st_parse_buffer(odd + 1, len, "slices", &f), TP_OK);
    ck_assert_uint_eq(f.data_offset % 8, 3);
    ck_assert_uint_eq(tp_st_find(&f, "f32")->begin, 2);
    ck_assert_uint_eq(f.n_metadata, 1);
    check_slices(&f);
    check_views(&f);
    tp_st_free(&f);
    free(odd);
    free(img);
}
END_TEST

static char *write_image(const char *dir, const char *name, unsigned char *img, size_t len)
{
    ck_assert_int_eq(stb_write(dir, name, img, len), 0);
    free(img);
    return stb_strdupf("%s/%s", dir, name);
}

START_TEST(test_slices_file)
{
    size_t len;
    char *dir = stb_tmpdir();
    unsigned char *img = slice_image(&len);
    char *path = write_image(dir, "s.safetensors", img, len);
    tp_st_file f;
    ck_assert_msg(tp_st_open(path, &f) == TP_OK, "%s", tp_error_message());
    ck_assert_ptr_nonnull(f.map);
    ck_assert_uint_eq(f.file_size, len);
    check_slices(&f);
    check_views(&f);
    tp_st_free(&f);
    free(path);
    stb_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_slice_errors)
{
    size_t len;
    unsigned char *img = slice_image(&len);
    tp_st_file f;
    ck_assert_int_eq(tp_st_parse_buffer(img, len, "errs", &f), TP_OK);
    const tp_st_tensor *t = tp_st_find(&f, "f32");
    static const tp_slice bad[] = {{0, 6, 0, 1}, {5, 1, 0, 1}, {-1, 1, 0, 1}, {0, 1, 0, 8},
                                   {0, 1, 7, 1}, {0, 1, -1, 2}, {0, -1, 0, 1}, {0, 1, 2, -1},
                                   {INT64_MAX, 2, 0, 1}, {1, INT64_MAX, 0, 1}};
    float out[R * C + 8];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tp_error_clear();
        expect_error(tp_st_read_slice(&f, t, bad[i], TP_DTYPE_F32, out), TP_ERR_INVALID_ARG,
                     "bad slice", "errs: tensor \"f32\"", "outside its 5 x 7 view");
    }
    tp_error_clear();
    expect_error(tp_st_read_slice(&f, tp_st_find(&f, "i32"), (tp_slice){0, 1, 0, 1},
                                  TP_DTYPE_F32, out), TP_ERR_INVALID_ARG, "i32 as f32", "errs",
                 "cannot load I32 data as float32");
    tp_error_clear();
    expect_error(tp_st_read_slice(&f, t, (tp_slice){0, 1, 0, 1}, TP_DTYPE_I32, out),
                 TP_ERR_INVALID_ARG, "f32 as i32", "errs", "cannot load F32 data as int32");
    tp_st_free(&f);
    free(img);
}
END_TEST

/* A column slice touches only its columns: every row's other half is PROT_NONE. */
START_TEST(test_slice_touches_only_its_columns)
{
    enum { ROWS = 3, COLS = 2048 }; /* 8192-byte rows: two pages each */
    long page = sysconf(_SC_PAGESIZE);
    if (page != 4096) return;
    float *data = malloc(sizeof(float) * ROWS * COLS);
    for (int i = 0; i < ROWS * COLS; i++) data[i] = (float)i;
    stb_tensor t = {"w", "F32", 2, {ROWS, COLS}, data, sizeof(float) * ROWS * COLS};
    size_t len;
    unsigned char *img = stb_build(&t, 1, NULL, 0, &len);
    free(data);
    /* Pad the header to 4088 bytes so the tensor starts on a page. */
    size_t hlen = (size_t)img[0] | (size_t)img[1] << 8;
    unsigned char *map = mmap(NULL, 4096 + 2 * 4096 * ROWS, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(map, MAP_FAILED);
    memset(map, ' ', 4096);
    memcpy(map, img, 8 + hlen);
    map[0] = 4088 & 0xff;
    map[1] = 4088 >> 8;
    memcpy(map + 4096, img + 8 + hlen, len - 8 - hlen);
    free(img);
    for (int r = 0; r < ROWS; r++)
        ck_assert_int_eq(mprotect(map + 4096 + 8192 * r + 4096, 4096, PROT_NONE), 0);
    tp_st_file f;
    ck_assert_msg(tp_st_parse_buffer(map, 4096 + 8192 * ROWS, "guarded", &f) == TP_OK, "%s",
                  tp_error_message());
    float *out = malloc(sizeof(float) * ROWS * 1024);
    ck_assert_int_eq(tp_st_read_slice(&f, tp_st_find(&f, "w"), (tp_slice){0, ROWS, 0, 1024},
                                      TP_DTYPE_F32, out), TP_OK);
    for (int r = 0; r < ROWS; r++) ck_assert_float_eq(out[r * 1024 + 1023], r * COLS + 1023);
    ck_assert_int_eq(tp_st_read_slice(&f, tp_st_find(&f, "w"), (tp_slice){1, 2, 10, 1000},
                                      TP_DTYPE_BF16, out), TP_OK);
    tp_st_free(&f);
    free(out);
    munmap(map, 4096 + 2 * 4096 * ROWS);
}
END_TEST

/* S31: a file shrunk after open is an error, not SIGBUS. */
START_TEST(test_truncated_after_open)
{
    size_t len;
    char *dir = stb_tmpdir();
    unsigned char *img = slice_image(&len);
    char *path = write_image(dir, "t.safetensors", img, len);
    tp_st_file f;
    ck_assert_int_eq(tp_st_open(path, &f), TP_OK);
    ck_assert_int_eq(truncate(path, 64), 0);
    float out[R * C];
    tp_error_clear();
    expect_error(tp_st_read_slice(&f, tp_st_find(&f, "f32"), (tp_slice){0, R, 0, C},
                                  TP_DTYPE_F32, out), TP_ERR_IO, "truncated", path,
                 "changed size since it was opened");
    tp_st_free(&f);
    free(path);
    stb_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_open_errors)
{
    char *dir = stb_tmpdir();
    char *missing = stb_strdupf("%s/missing.safetensors", dir);
    tp_st_file f;
    tp_error_clear();
    expect_error(tp_st_open(missing, &f), TP_ERR_IO, "missing", missing, "cannot open");
    tp_error_clear();
    expect_error(tp_st_open(dir, &f), TP_ERR_IO, "directory", dir, "not a regular file");
    char *fifo = stb_strdupf("%s/fifo.safetensors", dir); /* no writer: refused, not waited on */
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    tp_error_clear();
    expect_error(tp_st_open(fifo, &f), TP_ERR_IO, "FIFO", fifo, "not a regular file");
    unlink(fifo);
    free(fifo);
    size_t len;
    unsigned char *img = stb_image(2, "{}", 2, 0, &len);
    char *empty = write_image(dir, "e.safetensors", img, len);
    ck_assert_int_eq(tp_st_open(empty, &f), TP_OK); /* no data: nothing mapped */
    ck_assert_ptr_null(f.map);
    ck_assert_uint_eq(f.n_tensors, 0);
    tp_st_free(&f);
    tp_st_file zero = {0};
    int before = fcntl(0, F_GETFD);
    tp_st_free(&zero); /* must not close fd 0 */
    ck_assert_int_eq(fcntl(0, F_GETFD), before);
    free(missing);
    free(empty);
    stb_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- the shared models -------------------------------------------------------------- */

static int is_safetensors(const char *name)
{
    size_t n = strlen(name);
    return n > 12 && !strcmp(name + n - 12, ".safetensors");
}

/* Open every *.safetensors in dir and read each loadable tensor whole. */
static int open_all_in(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_safetensors(e->d_name)) continue;
        char *path = stb_strdupf("%s/%s", dir, e->d_name);
        tp_st_file f;
        tp_error_clear();
        ck_assert_msg(tp_st_open(path, &f) == TP_OK, "%s", tp_error_message());
        ck_assert_uint_gt(f.n_tensors, 0);
        for (size_t i = 0; i < f.n_tensors; i++) {
            const tp_st_tensor *t = &f.tensors[i];
            tp_dtype dt;
            ck_assert(tp_st_dtype_to_dtype(t->dtype, &dt));
            int64_t n = tp_st_numel(t), rows = t->rank ? t->shape[0] : 1;
            void *buf = malloc((size_t)n * 4 + 1);
            tp_dtype dst = dt == TP_DTYPE_I32 ? TP_DTYPE_I32 : TP_DTYPE_F32;
            ck_assert_int_eq(tp_st_read_slice(&f, t, (tp_slice){0, rows, 0, rows ? n / rows : 0},
                                              dst, buf), TP_OK);
            free(buf);
        }
        tp_st_free(&f);
        free(path);
        count++;
    }
    closedir(d);
    return count;
}

static const char *shared_dir(void)
{
    const char *s = getenv("TPINFER_SHARED");
    return s && *s ? s : "../shared";
}

START_TEST(test_shared_models)
{
    char *models = stb_strdupf("%s/models", shared_dir());
    DIR *d = opendir(models);
    if (!d) {
        printf("skipping the shared models: %s not found (set TPINFER_SHARED)\n", models);
        free(models);
        return;
    }
    int files = 0, dirs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *dir = stb_strdupf("%s/%s", models, e->d_name);
        char *ref = stb_strdupf("%s/reference", dir);
        int n = open_all_in(dir) + open_all_in(ref);
        files += n;
        dirs += n > 0;
        free(ref);
        free(dir);
    }
    closedir(d);
    printf("shared models: %d safetensors files in %d directories parsed and read\n", files, dirs);
    ck_assert_int_ge(files, 13);
    free(models);
}
END_TEST

/* ---- dtype conversions ------------------------------------------------------------- */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

START_TEST(test_dtype_names)
{
    static const struct {
        const char *name;
        tp_dtype dt;
    } ok[] = {{"float32", TP_DTYPE_F32}, {"fp32", TP_DTYPE_F32}, {"float", TP_DTYPE_F32},
              {"float16", TP_DTYPE_F16}, {"fp16", TP_DTYPE_F16}, {"half", TP_DTYPE_F16},
              {"bfloat16", TP_DTYPE_BF16}, {"bf16", TP_DTYPE_BF16}, {"int32", TP_DTYPE_I32}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tp_dtype dt = TP_DTYPE_COUNT;
        ck_assert_msg(tp_dtype_from_name(ok[i].name, &dt) && dt == ok[i].dt, "%s", ok[i].name);
    }
    static const char *const bad[] = {"", "F32", "float64", "bfloat", "int", "float32 ", "BF16"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tp_dtype dt;
        ck_assert_msg(!tp_dtype_from_name(bad[i], &dt), "%s accepted", bad[i]);
    }
    ck_assert_str_eq(tp_dtype_name(TP_DTYPE_BF16), "bfloat16");
    ck_assert_uint_eq(tp_dtype_size(TP_DTYPE_F32), 4);
    ck_assert_uint_eq(tp_dtype_size(TP_DTYPE_F16), 2);
    ck_assert_uint_eq(tp_dtype_size(TP_DTYPE_BF16), 2);
    ck_assert_uint_eq(tp_dtype_size(TP_DTYPE_I32), 4);
}
END_TEST

/* ck_assert marks a point through a pipe on every call; in million-iteration loops,
 * only call into check on a mismatch. */
#define EXPECT_U16(got, want)                                                          \
    do {                                                                               \
        unsigned g_ = (got), w_ = (want);                                              \
        if (g_ != w_) ck_abort_msg("%s = %04x, want %04x", #got, g_, w_);              \
    } while (0)

/* Exhaustive RNE: for each pair of adjacent finite values lo < hi of a 16-bit type, f32
 * values just below, at and just above the midpoint round to lo, the even one, and hi. */
static void check_rne(uint16_t (*to16)(float), float (*from16)(uint16_t), uint16_t max_finite)
{
    for (uint32_t h = 0; h < max_finite; h++) {
        float lo = from16((uint16_t)h), hi = from16((uint16_t)(h + 1));
        float mid = lo + (hi - lo) / 2; /* exact: one more bit than the 16-bit type */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        EXPECT_U16(to16(lo), h);
        EXPECT_U16(to16(nextafterf(mid, 0)), h);
        EXPECT_U16(to16(mid), even);
        EXPECT_U16(to16(nextafterf(mid, INFINITY)), h + 1);
        EXPECT_U16(to16(-mid), even | 0x8000u); /* symmetric in sign */
    }
}

/* Every 16-bit value survives a round trip through f32 (NaNs stay NaN). */
static void check_round_trip(uint16_t (*to16)(float), float (*from16)(uint16_t))
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = from16((uint16_t)h);
        if (isnan(f)) {
            if (!isnan(from16(to16(f)))) ck_abort_msg("NaN %04x lost", h);
        } else {
            EXPECT_U16(to16(f), h);
        }
    }
}

START_TEST(test_bf16_rne)
{
    check_rne(tp_f32_to_bf16, tp_bf16_to_f32, 0x7f7f);
    ck_assert_uint_eq(tp_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(tp_f32_to_bf16(from_bits(0x3f808000)), 0x3f80); /* tie to even */
    ck_assert_uint_eq(tp_f32_to_bf16(from_bits(0x3f818000)), 0x3f82);
    ck_assert_uint_eq(tp_f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
    ck_assert_uint_eq(tp_f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80); /* FLT_MAX -> Inf */
    ck_assert_uint_eq(tp_f32_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(tp_f32_to_bf16(-0.0f), 0x8000);
    ck_assert_uint_eq(tp_f32_to_bf16(from_bits(0x00000001)), 0x0000); /* tiny subnormal */
    static const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0xffc00001, 0x7fffffff, 0xff800001};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t b = tp_f32_to_bf16(from_bits(nans[i]));
        ck_assert(isnan(tp_bf16_to_f32(b)));
        ck_assert_int_eq(signbit(tp_bf16_to_f32(b)) != 0, (nans[i] >> 31) != 0);
    }
    check_round_trip(tp_f32_to_bf16, tp_bf16_to_f32);
}
END_TEST

START_TEST(test_f16_rne)
{
    check_rne(tp_f32_to_f16, tp_f16_to_f32, 0x7bff);
    ck_assert_uint_eq(tp_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(tp_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(tp_f32_to_f16(nextafterf(65520.0f, 0)), 0x7bff);
    ck_assert_uint_eq(tp_f32_to_f16(65520.0f), 0x7c00); /* the tie goes to Inf */
    ck_assert_uint_eq(tp_f32_to_f16(1e10f), 0x7c00);
    ck_assert_uint_eq(tp_f32_to_f16(-INFINITY), 0xfc00);
    ck_assert_uint_eq(tp_f32_to_f16(0x1p-24f), 0x0001); /* smallest subnormal */
    ck_assert_uint_eq(tp_f32_to_f16(0x1p-25f), 0x0000); /* tie to even 0 */
    ck_assert_uint_eq(tp_f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001);
    ck_assert_uint_eq(tp_f32_to_f16(3 * 0x1p-25f), 0x0002);
    ck_assert_uint_eq(tp_f32_to_f16(0x1p-14f), 0x0400); /* smallest normal */
    ck_assert_uint_eq(tp_f32_to_f16(nextafterf(0x1p-14f, 0)), 0x0400);
    ck_assert_uint_eq(tp_f32_to_f16(1e-10f), 0x0000);
    ck_assert_uint_eq(tp_f32_to_f16(-1e-10f), 0x8000);
    ck_assert_float_eq(tp_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
    ck_assert_float_eq(tp_f16_to_f32(0x8001), -0x1p-24f);
    static const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0xffc00001, 0x7fffffff, 0xff800001};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = tp_f32_to_f16(from_bits(nans[i]));
        ck_assert(isnan(tp_f16_to_f32(h)));
        ck_assert_int_eq(signbit(tp_f16_to_f32(h)) != 0, (nans[i] >> 31) != 0);
    }
    check_round_trip(tp_f32_to_f16, tp_f16_to_f32);
#ifdef __FLT16_MAX__
    /* The compiler's _Float16 conversion (RNE) as an independent oracle. */
    uint32_t x = 12345;
    for (int i = 0; i < 2000000; i++) {
        x = x * 1664525u + 1013904223u;
        float f = from_bits(x);
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        if (!isnan(f)) EXPECT_U16(tp_f32_to_f16(f), rb);
    }
#endif
}
END_TEST

START_TEST(test_convert_unaligned)
{
    enum { N = 600 }; /* more than one conversion chunk */
    float src[N], back[N];
    for (int i = 0; i < N; i++) src[i] = value(i % 35) * 0.25f; /* exact in all three */
    unsigned char a[N * 4 + 3], b[N * 4 + 3];
    static const tp_dtype types[] = {TP_DTYPE_F32, TP_DTYPE_F16, TP_DTYPE_BF16};
    for (int s = 0; s < 3; s++) {
        for (int d = 0; d < 3; d++) {
            tp_convert(a + 1, types[s], src, TP_DTYPE_F32, N);
            tp_convert(b + 3, types[d], a + 1, types[s], N);
            tp_convert(back, TP_DTYPE_F32, b + 3, types[d], N);
            for (int i = 0; i < N; i++) ck_assert_float_eq(back[i], src[i]);
        }
    }
    int32_t iv[3] = {INT32_MIN, -1, INT32_MAX}, io[3];
    tp_convert((unsigned char *)a + 1, TP_DTYPE_I32, iv, TP_DTYPE_I32, 3);
    tp_convert(io, TP_DTYPE_I32, a + 1, TP_DTYPE_I32, 3);
    ck_assert_mem_eq(io, iv, sizeof iv);
    uint16_t h[2];
    float one[2] = {1.0f + 0x1p-9f, -3.0f};
    tp_convert(h, TP_DTYPE_BF16, one, TP_DTYPE_F32, 2); /* 1 + 2^-9 is a bf16 tie */
    ck_assert_uint_eq(h[0], 0x3f80);
    ck_assert_uint_eq(h[1], tp_f32_to_bf16(-3.0f));
}
END_TEST

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("malformed");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_bad_buffer, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_loop_test(tc, test_bad_file, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
    suite_add_tcase(s, tc);

    tc = tcase_create("valid");
    tcase_add_loop_test(tc, test_good, 0, (int)(sizeof good_cases / sizeof good_cases[0]));
    tcase_add_test(tc, test_dtype_table);
    tcase_add_test(tc, test_unsupported_read);
    suite_add_tcase(s, tc);

    tc = tcase_create("large");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_s27_200k_tensors);
    tcase_add_test(tc, test_s5_100mb_header);
    tcase_add_test(tc, test_s23_10mb_metadata);
    suite_add_tcase(s, tc);

    tc = tcase_create("read");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_slices_buffer);
    tcase_add_test(tc, test_slices_file);
    tcase_add_test(tc, test_slice_errors);
    tcase_add_test(tc, test_slice_touches_only_its_columns);
    tcase_add_test(tc, test_truncated_after_open);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_shared_models);
    suite_add_tcase(s, tc);

    tc = tcase_create("dtype");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_dtype_names);
    tcase_add_test(tc, test_bf16_rne);
    tcase_add_test(tc, test_f16_rne);
    tcase_add_test(tc, test_convert_unaligned);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(safetensors_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failures = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failures ? 1 : 0;
}
