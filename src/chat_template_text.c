/*
 * chat_template_text.c: Python's text for chat templates: str(), repr() and json.dumps() of
 * jansson values (transformers' tojson), and the string operations of Jinja's filters and
 * Python's str methods that need more than a line (% formatting, indent, center, splitlines).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_internal.h"
#include "unicode.h"


void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}
void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Python repr(float): shortest round-trip digits, fixed for 1e-4 <= |x| < 1e16. */
void py_float(sbuf *b, double x)
{
    if (isnan(x)) return sb_str(b, "nan");
    if (isinf(x)) return sb_str(b, x < 0 ? "-inf" : "inf");
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]d.ddde[+-]XX */
    char digits[24];
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp = atoi(q + 1);
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) { /* Python's repr: positional from 1e-4 up to 1e16 */
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) out[o++] = digits[i];
            else out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    sb_str(b, out);
}

void py_repr_str(sbuf *b, const char *s, size_t n)
{
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '\\' || c == (unsigned char)q) {
            esc[0] = '\\';
            esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c == '\n') sb_str(b, "\\n");
        else if (c == '\r') sb_str(b, "\\r");
        else if (c == '\t') sb_str(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            sb_str(b, esc);
        } else if (c >= 0x80) { /* a character Python's repr escapes unless printable */
            uint32_t cp;
            int l = tp_utf8_next((const uint8_t *)s + i, n - i, &cp);
            if (l <= 0) l = 1, cp = c;
            char big[16];
            if (tp_uc_is_printable(cp)) sb_put(b, s + i, (size_t)l);
            else {
                if (cp < 0x100) snprintf(big, sizeof big, "\\x%02x", (unsigned)cp);
                else if (cp < 0x10000) snprintf(big, sizeof big, "\\u%04x", (unsigned)cp);
                else snprintf(big, sizeof big, "\\U%08x", (unsigned)cp);
                sb_str(b, big);
            }
            i += (size_t)l - 1;
        } else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, &q, 1);
}

void py_str(sbuf *b, json_t *j, int repr)
{
    switch (json_typeof(j)) {
    case JSON_NULL: return sb_str(b, "None");
    case JSON_TRUE: return sb_str(b, "True");
    case JSON_FALSE: return sb_str(b, "False");
    case JSON_INTEGER: {
        char t[32];
        snprintf(t, sizeof t, "%lld", (long long)json_integer_value(j));
        return sb_str(b, t);
    }
    case JSON_REAL: return py_float(b, json_real_value(j));
    case JSON_STRING:
        if (repr) return py_repr_str(b, json_string_value(j), json_string_length(j));
        return sb_put(b, json_string_value(j), json_string_length(j));
    case JSON_ARRAY:
        sb_str(b, "[");
        for (size_t i = 0; i < json_array_size(j); i++) {
            if (i) sb_str(b, ", ");
            py_str(b, json_array_get(j, i), 1);
        }
        return sb_str(b, "]");
    case JSON_OBJECT: {
        sb_str(b, "{");
        int first = 1;
        for (void *it = json_object_iter(j); it; it = json_object_iter_next(j, it)) {
            if (!first) sb_str(b, ", ");
            first = 0;
            const char *key = json_object_iter_key(it);
            const size_t kn = json_object_iter_key_len(it);
            if (kn && key[0] == CT_INT_KEY) sb_put(b, key + 1, kn - 1); /* an int key: its digits */
            else py_repr_str(b, key, kn);
            sb_str(b, ": ");
            py_str(b, json_object_iter_value(it), 1);
        }
        return sb_str(b, "}");
    }
    }
}

/* json.dumps' options as transformers' tojson filter takes them */

static void json_str(sbuf *b, const char *s, size_t n, int ascii)
{
    sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[16];
        switch (c) {
        case '"': sb_str(b, "\\\""); break;
        case '\\': sb_str(b, "\\\\"); break;
        case '\n': sb_str(b, "\\n"); break;
        case '\r': sb_str(b, "\\r"); break;
        case '\t': sb_str(b, "\\t"); break;
        case '\b': sb_str(b, "\\b"); break;
        case '\f': sb_str(b, "\\f"); break;
        default:
            if (c < 0x20 || (ascii && c == 0x7f)) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                sb_str(b, esc);
            } else if (ascii && c >= 0x80) { /* one character, as \uXXXX or a surrogate pair */
                uint32_t cp = 0xfffd;
                int l = tp_utf8_next((const uint8_t *)s + i, n - i, &cp);
                if (l > 1) i += (size_t)l - 1;
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
                } else snprintf(esc, sizeof esc, "\\u%04x", cp);
                sb_str(b, esc);
            } else sb_put(b, (const char *)&c, 1);
        }
    }
    sb_str(b, "\"");
}

static void json_newline(sbuf *b, const json_opts *o, int level)
{
    sb_str(b, "\n");
    for (int k = 0; k < level; k++) sb_put(b, o->indent, o->indent_len);
}

typedef struct json_member {
    const char *key;
    size_t len;
    json_t *value;
} json_member;

/* Python's order of str keys: code points, i.e. UTF-8 bytes (a key may hold NUL) */
static int cmp_members(const void *x, const void *y)
{
    const json_member *a = x, *b = y;
    int c = memcmp(a->key, b->key, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* json.dumps(x, ...) with transformers' defaults (ensure_ascii=False) unless o says otherwise */
void py_json(sbuf *b, json_t *j, const json_opts *o, int level)
{
    int arr = json_is_array(j);
    if (!arr && !json_is_object(j)) {
        if (json_is_string(j)) return json_str(b, json_string_value(j), json_string_length(j), o->ascii);
        if (json_is_real(j)) return py_float(b, json_real_value(j));
        if (json_is_null(j)) return sb_str(b, "null");
        if (json_is_boolean(j)) return sb_str(b, json_is_true(j) ? "true" : "false");
        return py_str(b, j, 0);
    }
    size_t n = arr ? json_array_size(j) : json_object_size(j);
    if (n == 0) return sb_str(b, arr ? "[]" : "{}");
    json_member *m = NULL; /* the object's members, in order or sorted */
    if (!arr) {
        m = malloc(n * sizeof *m);
        if (!m) {
            b->oom = 1;
            return;
        }
        size_t k = 0;
        for (void *it = json_object_iter(j); it && k < n; it = json_object_iter_next(j, it), k++)
            m[k] = (json_member){json_object_iter_key(it), json_object_iter_key_len(it), json_object_iter_value(it)};
        n = k;
        if (o->sort_keys) qsort(m, n, sizeof *m, cmp_members);
    }
    sb_str(b, arr ? "[" : "{");
    for (size_t i = 0; i < n; i++) {
        if (i) sb_str(b, o->item_sep);
        if (o->indent) json_newline(b, o, level + 1);
        if (arr) {
            py_json(b, json_array_get(j, i), o, level + 1);
        } else {
            const int int_key = m[i].len && m[i].key[0] == CT_INT_KEY; /* json.dumps: as a string */
            json_str(b, m[i].key + int_key, m[i].len - (size_t)int_key, o->ascii);
            sb_str(b, o->key_sep);
            py_json(b, m[i].value, o, level + 1);
        }
    }
    free(m);
    if (o->indent) json_newline(b, o, level);
    sb_str(b, arr ? "]" : "}");
}


// ----------------------------------------------------------------------------
// mapping keys

json_t *ct_key_value(const char *k, size_t n)
{
    if (n && k[0] == CT_INT_KEY) return json_integer(strtoll(k + 1, NULL, 10));
    return json_stringn_nocheck(k, n);
}

int ct_key_of(json_t *v, char *buf, size_t cap, const char **k, size_t *n)
{
    if (json_is_string(v)) {
        *k = json_string_value(v);
        *n = json_string_length(v);
        return 1;
    }
    if (!json_is_integer(v) && !json_is_boolean(v)) return 0;
    const long long x = json_is_boolean(v) ? json_is_true(v) : json_integer_value(v);
    const int len = snprintf(buf, cap, "%c%lld", CT_INT_KEY, x);
    *k = buf;
    *n = (size_t)len;
    return len > 0 && (size_t)len < cap;
}

// ----------------------------------------------------------------------------
// Python's string operations

/* The length of the line boundary at s[i] (Python's str.splitlines: \n, \r, \r\n, \v, \f,
 * \x1c-\x1e, U+0085, U+2028, U+2029), 0 if none. */
static size_t line_break(const char *s, size_t n, size_t i)
{
    const unsigned char c = (unsigned char)s[i];
    if (c == '\r') return i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) return 1;
    if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85) return 2;
    if (c == 0xe2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xa8 || (unsigned char)s[i + 2] == 0xa9))
        return 3;
    return 0;
}

json_t *py_splitlines(const char *s, size_t n, int keepends)
{
    json_t *r = json_array();
    size_t start = 0;
    for (size_t i = 0; r && i < n;) {
        const size_t k = line_break(s, n, i);
        if (!k) {
            i++;
            continue;
        }
        json_array_append_new(r, json_stringn_nocheck(s + start, (keepends ? i + k : i) - start));
        i += k;
        start = i;
    }
    if (r && start < n) json_array_append_new(r, json_stringn_nocheck(s + start, n - start));
    return r;
}

/* Jinja's indent filter: every line but the first (first: that too) after ind; blank lines
 * too only with blank (Jinja adds a newline before splitting, so a trailing one stays) */
json_t *py_indent(const char *s, size_t n, const char *ind, size_t il, int first, int blank)
{
    char *t = malloc(n + 2);
    if (!t) return NULL;
    memcpy(t, s, n);
    t[n] = '\n';
    json_t *lines = py_splitlines(t, n + 1, 0);
    free(t);
    if (!lines) return NULL;
    sbuf b = {0};
    sb_put(&b, "", 0);
    if (first) sb_put(&b, ind, il);
    for (size_t i = 0; i < json_array_size(lines); i++) {
        json_t *l = json_array_get(lines, i);
        if (i) {
            sb_put(&b, "\n", 1);
            if (blank || json_string_length(l)) sb_put(&b, ind, il);
        }
        sb_put(&b, json_string_value(l), json_string_length(l));
    }
    json_decref(lines);
    json_t *r = b.oom ? NULL : json_stringn_nocheck(b.s, b.len);
    free(b.s);
    return r;
}

/* str.center / ljust / rjust (how 'c', 'l', 'r') to width characters with the one-character
 * fill, and str.zfill (how 'z') */
json_t *py_pad(const char *s, size_t n, int64_t width, char how, const char *fill, size_t fill_len)
{
    int64_t len = 0;
    for (size_t i = 0; i < n; i += (size_t)tp_utf8_len((uint8_t)s[i])) len++;
    if (width <= len) return json_stringn_nocheck(s, n);
    const int64_t marg = width - len;
    int64_t left = how == 'c' ? marg / 2 + (marg & width & 1) : how == 'l' ? 0 : marg;
    sbuf b = {0};
    sb_put(&b, "", 0);
    size_t at = 0;
    if (how == 'z' && n && (s[0] == '+' || s[0] == '-')) { /* the sign stays first */
        sb_put(&b, s, 1);
        at = 1;
    }
    for (int64_t i = 0; i < left; i++) sb_put(&b, how == 'z' ? "0" : fill, how == 'z' ? 1 : fill_len);
    sb_put(&b, s + at, n - at);
    for (int64_t i = 0; i < marg - left; i++) sb_put(&b, fill, fill_len);
    json_t *r = b.oom ? NULL : json_stringn_nocheck(b.s, b.len);
    free(b.s);
    return r;
}

/* round(x, ndigits): the decimal nearest x's exact binary value, ties to even (as Python,
 * whose round(2.675, 2) is 2.67) */
double py_round(double x, int64_t ndigits)
{
    if (!isfinite(x) || ndigits > 300) return x;
    if (ndigits < -300) return 0.0 * x;
    char buf[512];
    if (ndigits >= 0) {
        snprintf(buf, sizeof buf, "%.*f", (int)ndigits, x); /* glibc: exact, ties to even */
        return strtod(buf, NULL);
    }
    const double p = pow(10.0, (double)-ndigits);
    snprintf(buf, sizeof buf, "%.0f", x / p);
    return strtod(buf, NULL) * p;
}

static tp_status fmt_error(const char *what)
{
    return tp_error(TP_ERR_INVALID_ARG, "chat template: %% formatting: %s", what);
}

/* Python's fmt % args: args is a list of the arguments (a tuple), or a mapping for
 * %(name)s, or any one value. Conversions s r d i u o x X e E f F g G c %, with flags
 * -+ #0, width and precision (* too). */
tp_status py_percent(const char *fmt, size_t n, json_t *args, json_t **out)
{
    const int tuple = json_is_array(args), mapping = json_is_object(args);
    size_t next = 0, used_single = 0;
    sbuf b = {0};
    sb_put(&b, "", 0);
    tp_status st = TP_OK;
    for (size_t i = 0; i < n && st == TP_OK;) {
        if (fmt[i] != '%') {
            const char *pc = memchr(fmt + i, '%', n - i);
            const size_t k = pc ? (size_t)(pc - fmt) : n;
            sb_put(&b, fmt + i, k - i);
            i = k;
            continue;
        }
        i++;
        json_t *v = NULL;
        if (i < n && fmt[i] == '(') {
            const char *close = memchr(fmt + i, ')', n - i);
            if (!close) {
                st = fmt_error("a %( without its )");
                break;
            }
            if (!mapping) {
                st = fmt_error("%(name) needs a mapping");
                break;
            }
            v = json_object_getn(args, fmt + i + 1, (size_t)(close - fmt) - i - 1);
            if (!v) {
                st = fmt_error("a %(name) that the mapping does not have");
                break;
            }
            i = (size_t)(close - fmt) + 1;
        }
        char flags[8] = "";
        size_t nf = 0;
        while (i < n && strchr("-+ #0", fmt[i]) && fmt[i]) {
            if (nf < sizeof flags - 1) flags[nf++] = fmt[i];
            flags[nf] = '\0';
            i++;
        }
        int64_t width = -1, prec = -1;
        for (int part = 0; part < 2; part++) {
            if (part == 1) {
                if (i < n && fmt[i] == '.') {
                    i++;
                    prec = 0;
                } else break;
            }
            int64_t *dst = part ? &prec : &width;
            if (i < n && fmt[i] == '*') {
                json_t *w = tuple ? json_array_get(args, next++) : NULL;
                if (!json_is_integer(w)) {
                    st = fmt_error("* needs an integer argument");
                    break;
                }
                *dst = json_integer_value(w);
                if (*dst > 100000) {
                    st = fmt_error("a width or precision over 100000");
                    break;
                }
                if (*dst < 0 && !part) { /* Python: a negative * width left-aligns */
                    *dst = -*dst;
                    if (nf < sizeof flags - 1) flags[nf++] = '-', flags[nf] = '\0';
                }
                i++;
            } else {
                int64_t d = 0;
                int any = 0;
                while (i < n && fmt[i] >= '0' && fmt[i] <= '9' && d < 100000) d = d * 10 + (fmt[i++] - '0'), any = 1;
                if (any || part) *dst = d;
            }
        }
        if (st != TP_OK) break;
        if (i >= n) {
            st = fmt_error("a conversion is cut short");
            break;
        }
        const char conv = fmt[i++];
        if (conv == '%') {
            sb_put(&b, "%", 1);
            continue;
        }
        if (!v) {
            if (tuple) v = json_array_get(args, next++);
            else if (!used_single++) v = args;
            if (!v) {
                st = fmt_error("not enough arguments for the format string");
                break;
            }
        }
        sbuf piece = {0};
        sb_put(&piece, "", 0);
        char spec[48], buf[1024]; /* %.300f of 1e308: 610 characters */
        const int left = strchr(flags, '-') != NULL;
        if (conv == 's' || conv == 'r') {
            py_str(&piece, v, conv != 's');
            if (prec >= 0) { /* cut to prec characters */
                size_t k = 0;
                for (int64_t c = 0; c < prec && k < piece.len; c++) k += (size_t)tp_utf8_len((uint8_t)piece.s[k]);
                piece.len = k < piece.len ? k : piece.len;
            }
        } else if (strchr("diuoxXeEfFgGc", conv)) {
            const int is_int = json_is_integer(v) || json_is_boolean(v);
            const double x = json_is_boolean(v) ? json_is_true(v) : json_number_value(v);
            const long long iv = json_is_boolean(v) ? json_is_true(v) : json_is_integer(v) ? json_integer_value(v)
                                 : fabs(x) < 9.2e18 ? (long long)x : 0; /* larger: refused below */
            if (!json_is_number(v) && !json_is_boolean(v) && !(conv == 'c' && json_is_string(v))) {
                st = fmt_error("a number is required");
            } else if (!is_int && strchr("diu", conv) && !(fabs(x) < 9.2e18)) {
                st = fmt_error("%d of a number beyond 64-bit integers");
                sb_put(&piece, "", 0);
            } else if (conv == 'c') {
                if (json_is_string(v) && json_string_length(v) &&
                    json_string_length(v) == (size_t)tp_utf8_len((uint8_t)*json_string_value(v)))
                    sb_put(&piece, json_string_value(v), json_string_length(v));
                else if (json_is_string(v)) st = fmt_error("%c needs one character");
                else {
                    char u[4];
                    const int ok = is_int && iv >= 0 && iv <= 0x10ffff && !(iv >= 0xd800 && iv <= 0xdfff);
                    if (!ok) st = fmt_error("%c needs a character");
                    else sb_put(&piece, u, (size_t)tp_utf8_put((uint32_t)iv, u));
                }
            } else if (strchr("diu", conv)) { /* a precision is the least number of digits */
                snprintf(spec, sizeof spec, "%%%s.*lld", flags);
                snprintf(buf, sizeof buf, spec, (int)(prec < 0 ? 1 : prec > 300 ? 300 : prec), iv);
                sb_str(&piece, buf);
            } else if (strchr("oxX", conv)) {
                if (!is_int) st = fmt_error("%x and %o need an integer");
                else {
                    const unsigned long long mag = iv < 0 ? 0ULL - (unsigned long long)iv : (unsigned long long)iv;
                    snprintf(buf, sizeof buf, conv == 'o' ? "%.*llo" : conv == 'x' ? "%.*llx" : "%.*llX",
                             (int)(prec < 0 ? 1 : prec > 300 ? 300 : prec), mag);
                    if (iv < 0) sb_put(&piece, "-", 1);
                    else if (strchr(flags, '+')) sb_put(&piece, "+", 1);
                    else if (strchr(flags, ' ')) sb_put(&piece, " ", 1);
                    if (strchr(flags, '#')) sb_str(&piece, conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X");
                    sb_str(&piece, buf);
                }
            } else {
                char fl[8];
                size_t k = 0;
                for (size_t q = 0; flags[q]; q++)
                    if (flags[q] != '-' && flags[q] != '0') fl[k++] = flags[q];
                fl[k] = '\0';
                if (prec > 300) {
                    st = fmt_error("a precision over 300 for a float");
                } else {
                    snprintf(spec, sizeof spec, "%%%s.%d%c", fl, (int)(prec < 0 ? 6 : prec), conv);
                    snprintf(buf, sizeof buf, spec, x);
                    sb_str(&piece, buf);
                }
            }
        } else {
            st = fmt_error("an unsupported conversion character");
        }
        if (st == TP_OK) { /* pad to width characters: zeros after the sign for numbers with 0 */
            int64_t chars = 0;
            for (size_t k = 0; k < piece.len; k += (size_t)tp_utf8_len((uint8_t)piece.s[k])) chars++;
            const int zero = !left && strchr(flags, '0') && strchr("diuoxXeEfFgG", conv);
            size_t lead = 0;
            if (zero) {
                if (lead < piece.len && strchr("+- ", piece.s[lead])) lead++;
                if (lead + 1 < piece.len && piece.s[lead] == '0' && strchr("oxX", piece.s[lead + 1])) lead += 2;
            }
            if (!left) sb_put(&b, piece.s, zero ? lead : 0);
            for (int64_t k = chars; k < width && !left; k++) sb_put(&b, zero ? "0" : " ", 1);
            sb_put(&b, piece.s + (zero ? lead : 0), piece.len - (zero ? lead : 0));
            for (int64_t k = chars; k < width && left; k++) sb_put(&b, " ", 1);
        }
        free(piece.s);
    }
    if (st == TP_OK && tuple && next < json_array_size(args))
        st = fmt_error("not all arguments converted during string formatting");
    if (st == TP_OK && !tuple && !mapping && !used_single && json_typeof(args) != JSON_OBJECT)
        st = fmt_error("not all arguments converted during string formatting");
    *out = st == TP_OK && !b.oom ? json_stringn_nocheck(b.s, b.len) : NULL;
    free(b.s);
    if (st == TP_OK && !*out) st = tp_error(TP_ERR_OOM, "out of memory");
    return st;
}
