/*
 * unicode.c: strict UTF-8 decoding, Rust-compatible lossy conversion, and thin wrappers
 * over libunistring for character properties, normalization and lowercasing.
 */
#include "unicode.h"

#include <stdlib.h>
#include <string.h>
#include <unicase.h>
#include <unictype.h>
#include <uninorm.h>

int tp_utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F; /* surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    uint32_t v = b & (0x3F >> need);
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return -i;
        uint8_t c = s[i];
        if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return -i;
        v = (v << 6) | (c & 0x3F);
    }
    *cp = v;
    return need + 1;
}

int tp_utf8_put(uint32_t cp, char *out)
{
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int tp_utf8_valid(const char *s, size_t n, size_t *bad_at)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tp_utf8_next(p + i, n - i, &cp);
        if (k < 0) {
            if (bad_at) *bad_at = i;
            return 0;
        }
        i += (size_t)k;
    }
    return 1;
}

tp_status tp_utf8_lossy(const char *s, size_t n, char **out, size_t *out_len)
{
    /* Worst case: every byte becomes a 3-byte U+FFFD. */
    char *buf = malloc(n * 3 + 1);
    if (!buf) return tp_error(TP_ERR_OOM, "out of memory decoding %zu bytes", n);
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        int k = tp_utf8_next(p + i, n - i, &cp);
        if (k > 0) {
            memcpy(buf + o, p + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)-k;
        }
    }
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return TP_OK;
}

int tp_uc_is_whitespace(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return uc_is_property_white_space(cp);
}

int tp_uc_is_py_space(uint32_t cp) { return tp_uc_is_whitespace(cp) || (cp >= 0x1c && cp <= 0x1f); }

int tp_uc_is_printable(uint32_t cp)
{
    if (cp == ' ') return 1;
    return !(uc_is_general_category(cp, UC_CATEGORY_C) || uc_is_general_category(cp, UC_CATEGORY_Z));
}

int tp_uc_is_numeric(uint32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return uc_is_general_category(cp, UC_CATEGORY_N);
}

int tp_uc_is_alphanumeric(uint32_t cp)
{
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z' ? 1 : cp >= '0' && cp <= '9';
    return uc_is_property_alphabetic(cp) || uc_is_general_category(cp, UC_CATEGORY_N);
}

int tp_uc_is_word(uint32_t cp)
{
    if (cp < 0x80) return tp_uc_is_alphanumeric(cp) || cp == '_';
    return uc_is_property_alphabetic(cp) || uc_is_general_category(cp, UC_CATEGORY_M) ||
           uc_is_general_category(cp, UC_CATEGORY_Nd) ||
           uc_is_general_category(cp, UC_CATEGORY_Pc) || uc_is_property_join_control(cp);
}

tp_status tp_utf8_normalize(const char *form, const char *s, size_t n, char **out, size_t *out_len)
{
    uninorm_t nf;
    if (strcmp(form, "NFC") == 0) nf = UNINORM_NFC;
    else if (strcmp(form, "NFD") == 0) nf = UNINORM_NFD;
    else if (strcmp(form, "NFKC") == 0) nf = UNINORM_NFKC;
    else if (strcmp(form, "NFKD") == 0) nf = UNINORM_NFKD;
    else return tp_error(TP_ERR_INTERNAL, "unknown normalization form %s", form);
    size_t len = 0;
    /* libunistring returns NULL for empty input; keep the "" case explicit. */
    if (n == 0) {
        *out = calloc(1, 1);
        *out_len = 0;
        return *out ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    uint8_t *r = u8_normalize(nf, (const uint8_t *)s, n, NULL, &len);
    if (!r) return tp_error(TP_ERR_FORMAT, "%s normalization failed (invalid UTF-8?)", form);
    char *buf = realloc(r, len + 1);
    if (!buf) {
        free(r);
        return tp_error(TP_ERR_OOM, "out of memory");
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return TP_OK;
}

/* One character's case mapping: 'u' upper, 'l' lower, 't' title (full mappings, at most 8
 * characters out); the character itself where there is none. */
static size_t map_case(uint32_t cp, char how, uint32_t mapped[8])
{
    if (cp < 0x80 && how != 't') {
        mapped[0] = how == 'u' ? (cp >= 'a' && cp <= 'z' ? cp - 32u : cp) : (cp >= 'A' && cp <= 'Z' ? cp + 32u : cp);
        return 1;
    }
    size_t mn = 8;
    uint32_t *r = how == 'u'   ? u32_toupper(&cp, 1, NULL, NULL, mapped, &mn)
                  : how == 'l' ? u32_tolower(&cp, 1, NULL, NULL, mapped, &mn)
                               : u32_totitle(&cp, 1, NULL, NULL, mapped, &mn);
    if (!r || mn == 0) {
        mapped[0] = cp;
        return 1;
    }
    if (r != mapped) {
        mn = mn < 8 ? mn : 8;
        memcpy(mapped, r, mn * sizeof *r);
        free(r);
    }
    return mn;
}

static int is_cased(uint32_t cp)
{
    bool cased = false;
    return u32_is_cased(&cp, 1, NULL, &cased) == 0 && cased;
}

tp_status tp_utf8_case(const char *s, size_t n, char how, char **out, size_t *out_len)
{
    size_t cap = n + 16, o = 0;
    char *buf = malloc(cap);
    if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    int first = 1, prev_cased = 0, word_start = 1;
    while (i < n) {
        uint32_t cp;
        int k = tp_utf8_next(p + i, n - i, &cp);
        if (k < 0) {
            free(buf);
            return tp_error(TP_ERR_INVALID_ARG, "invalid UTF-8 at byte %zu", i);
        }
        i += (size_t)k;
        char m = how == 'L' ? 'l' : how; /* 'u', 'l', or the per-character choice of the other ways */
        if (how == 'c') m = first ? 't' : 'l';
        else if (how == 'T') m = prev_cased ? 'l' : 't';
        else if (how == 'J') {
            const int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tp_uc_is_py_space(cp);
            m = sep ? 'l' : word_start ? 'u' : 'l';
            word_start = sep;
        }
        uint32_t mapped[8];
        size_t mn = map_case(cp, m, mapped);
        if (how != 'l' && m == 'l' && cp == 0x3a3 && prev_cased) { /* Python's final sigma: not before a cased letter */
            uint32_t next = 0;
            if (i >= n || tp_utf8_next(p + i, n - i, &next) < 0 || !is_cased(next)) mapped[0] = 0x3c2;
        }
        prev_cased = is_cased(cp);
        first = 0;
        if (o + mn * 4 + 1 > cap) {
            cap = cap * 2 + mn * 4 + 1;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return tp_error(TP_ERR_OOM, "out of memory");
            }
            buf = nb;
        }
        for (size_t j = 0; j < mn; j++) o += (size_t)tp_utf8_put(mapped[j], buf + o);
    }
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return TP_OK;
}

tp_status tp_utf8_lowercase(const char *s, size_t n, char **out, size_t *out_len)
{
    return tp_utf8_case(s, n, 'l', out, out_len);
}
