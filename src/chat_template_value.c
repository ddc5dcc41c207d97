/*
 * chat_template_value.c: Python's and Jinja's operations on a chat template's values:
 * truthiness, str(), strings indexed by code point, ==, <, in, arithmetic, indexing and
 * slicing, and reading a call's arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_value.h"
#include "unicode.h"

tp_status ct_rt_error(const char *fmt, const char *a)
{
    return tp_error(TP_ERR_INVALID_ARG, fmt, a);
}

int ct_truthy(const val *v)
{
    if (v->k == V_UNDEF) return 0;
    if (v->k != V_JSON) return 1;
    json_t *j = v->j;
    switch (json_typeof(j)) {
    case JSON_NULL:
    case JSON_FALSE: return 0;
    case JSON_TRUE: return 1;
    case JSON_INTEGER: return json_integer_value(j) != 0;
    case JSON_REAL: return json_real_value(j) != 0.0;
    case JSON_STRING: return json_string_length(j) > 0;
    case JSON_ARRAY: return json_array_size(j) > 0;
    case JSON_OBJECT: return json_object_size(j) > 0;
    }
    return 0;
}

/* str(v) as a new JSON string value. */
tp_status ct_to_string(const val *v, json_t **out)
{
    sbuf b = {0};
    sb_put(&b, "", 0);
    if (v->k == V_JSON) py_str(&b, v->j, 0);
    else if (v->k == V_NS) sb_str(&b, "<Namespace>");
    else if (v->k == V_MACRO) {
        sb_str(&b, "<Macro '");
        sb_str(&b, v->name);
        sb_str(&b, "'>");
    } else if (v->k != V_UNDEF) sb_str(&b, "<function>");
    *out = b.oom ? NULL : json_stringn_nocheck(b.s, b.len);
    free(b.s);
    return *out ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
}

// ----------------------------------------------------------------------------
// code points (Python indexes strings by character)
tp_status ct_cps_of(const char *s, size_t len, cps *c)
{
    c->off = malloc((len + 1) * sizeof *c->off);
    if (!c->off) return tp_error(TP_ERR_OOM, "out of memory");
    c->n = 0;
    for (size_t i = 0; i < len; i += (size_t)tp_utf8_len((uint8_t)s[i])) c->off[c->n++] = i;
    c->off[c->n] = len;
    return TP_OK;
}

int ct_is_space_cp(const char *s, size_t n, size_t *k)
{
    uint32_t cp;
    int l = tp_utf8_next((const uint8_t *)s, n, &cp);
    if (l <= 0) return 0;
    *k = (size_t)l;
    return tp_uc_is_py_space(cp);
}

/* Python str.strip/lstrip/rstrip, with chars (NULL: whitespace). */
json_t *ct_py_strip(const char *s, size_t n, const char *chars, size_t cn, int left, int right)
{
    size_t a = 0, b = n;
    while (left && a < b) {
        size_t k = (size_t)tp_utf8_len((uint8_t)s[a]);
        int hit = chars ? memmem(chars, cn, s + a, k) != NULL : ct_is_space_cp(s + a, b - a, &k);
        if (!hit) break;
        a += k;
    }
    while (right && b > a) {
        size_t st = b - 1, k;
        while (st > a && ((uint8_t)s[st] & 0xC0) == 0x80) st--;
        k = b - st;
        int hit = chars ? memmem(chars, cn, s + st, k) != NULL : ct_is_space_cp(s + st, k, &k);
        if (!hit) break;
        b = st;
    }
    return json_stringn_nocheck(s + a, b - a);
}

// ----------------------------------------------------------------------------
// comparisons and arithmetic

int ct_py_eq(const val *a, const val *b)
{
    if (a->k == V_UNDEF || b->k == V_UNDEF) return a->k == b->k;
    if (a->k != V_JSON || b->k != V_JSON) return a->j == b->j;
    if (is_num(a) && is_num(b)) return num(a) == num(b);
    json_t *x = a->j, *y = b->j;
    if (json_typeof(x) != json_typeof(y)) return 0;
    if (json_is_array(x)) {
        if (json_array_size(x) != json_array_size(y)) return 0;
        for (size_t i = 0; i < json_array_size(x); i++) {
            val p = {.k = V_JSON, .j = json_array_get(x, i)}, q = {.k = V_JSON, .j = json_array_get(y, i)};
            if (!ct_py_eq(&p, &q)) return 0;
        }
        return 1;
    }
    if (json_is_object(x)) { /* {'a': 1} == {'a': 1.0}, as Python */
        if (json_object_size(x) != json_object_size(y)) return 0;
        for (void *it = json_object_iter(x); it; it = json_object_iter_next(x, it)) {
            json_t *w = json_object_getn(y, json_object_iter_key(it), json_object_iter_key_len(it));
            val p = {.k = V_JSON, .j = json_object_iter_value(it)}, q = {.k = V_JSON, .j = w};
            if (!w || !ct_py_eq(&p, &q)) return 0;
        }
        return 1;
    }
    return json_equal(x, y);
}

tp_status ct_py_cmp(const val *a, const val *b, int *out)
{
    if (is_num(a) && is_num(b)) {
        double x = num(a), y = num(b);
        *out = x < y ? -1 : x > y;
        return TP_OK;
    }
    if (is_str(a) && is_str(b)) {
        size_t la = json_string_length(a->j), lb = json_string_length(b->j);
        int r = memcmp(json_string_value(a->j), json_string_value(b->j), la < lb ? la : lb);
        *out = r ? (r < 0 ? -1 : 1) : (la < lb ? -1 : la > lb);
        return TP_OK;
    }
    if (a->k == V_JSON && b->k == V_JSON && json_is_array(a->j) && json_is_array(b->j)) { /* tuples: in order */
        const size_t na = json_array_size(a->j), nb = json_array_size(b->j);
        for (size_t i = 0; i < na && i < nb; i++) {
            val p = {.k = V_JSON, .j = json_array_get(a->j, i)}, q = {.k = V_JSON, .j = json_array_get(b->j, i)};
            if (ct_py_eq(&p, &q)) continue;
            return ct_py_cmp(&p, &q, out);
        }
        *out = na < nb ? -1 : na > nb;
        return TP_OK;
    }
    return ct_rt_error("chat template: cannot order values of different or unordered types%s", "");
}

tp_status ct_py_in(const val *item, const val *cont, int *out)
{
    if (cont->k == V_UNDEF) { /* Jinja's Undefined holds nothing */
        *out = 0;
        return TP_OK;
    }
    if (is_str(cont)) {
        if (!is_str(item)) return ct_rt_error("chat template: 'in <string>' needs a string on the left%s", "");
        *out = json_string_length(item->j) == 0 ||
               memmem(json_string_value(cont->j), json_string_length(cont->j), json_string_value(item->j),
                      json_string_length(item->j)) != NULL;
        return TP_OK;
    }
    if (cont->k == V_JSON && json_is_array(cont->j)) {
        *out = 0;
        for (size_t i = 0; i < json_array_size(cont->j) && !*out; i++) {
            val e = {.k = V_JSON, .j = json_array_get(cont->j, i)};
            *out = ct_py_eq(item, &e);
        }
        return TP_OK;
    }
    json_t *obj = cont->j;
    if ((cont->k == V_JSON || cont->k == V_NS) && json_is_object(obj)) {
        char buf[32];
        const char *k;
        size_t kn;
        *out = item->k == V_JSON && ct_key_of(item->j, buf, sizeof buf, &k, &kn) && json_object_getn(obj, k, kn);
        return TP_OK;
    }
    return ct_rt_error("chat template: 'in' needs a string, list or mapping on the right%s", "");
}

tp_status ct_arith(const char *op, const val *a, const val *b, val *out)
{
    if (!strcmp(op, "~")) {
        json_t *x, *y;
        TP_CHECK(ct_to_string(a, &x));
        tp_status st = ct_to_string(b, &y);
        if (st != TP_OK) {
            json_decref(x);
            return st;
        }
        sbuf s = {0};
        sb_put(&s, json_string_value(x), json_string_length(x));
        sb_put(&s, json_string_value(y), json_string_length(y));
        json_decref(x);
        json_decref(y);
        *out = vjson(s.oom ? NULL : json_stringn_nocheck(s.s ? s.s : "", s.len));
        free(s.s);
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(op, "+") && is_str(a) && is_str(b)) {
        sbuf s = {0};
        sb_put(&s, json_string_value(a->j), json_string_length(a->j));
        sb_put(&s, json_string_value(b->j), json_string_length(b->j));
        *out = vjson(s.oom ? NULL : json_stringn_nocheck(s.s, s.len));
        free(s.s);
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(op, "+") && a->k == V_JSON && b->k == V_JSON && json_is_array(a->j) && json_is_array(b->j)) {
        json_t *r = json_copy(a->j);
        if (!r || json_array_extend(r, b->j) != 0) {
            json_decref(r);
            return tp_error(TP_ERR_OOM, "out of memory");
        }
        *out = vjson(r);
        return TP_OK;
    }
    if (!strcmp(op, "%") && is_str(a)) { /* Python's printf-style formatting: b a tuple (a list here,
                                           * see the caller), a mapping or one value */
        json_t *r, *empty = b->k == V_UNDEF ? json_string("") : NULL; /* str(Undefined) is "" */
        tp_status st = py_percent(json_string_value(a->j), json_string_length(a->j),
                                  empty ? empty : b->k == V_JSON ? b->j : json_null(), &r);
        json_decref(empty);
        TP_CHECK(st);
        *out = vjson(r);
        return TP_OK;
    }
    if (!strcmp(op, "*") && is_int(a) && !is_num(b)) return ct_arith(op, b, a, out); /* 3 * 'ab' */
    if (!strcmp(op, "*") && a->k == V_JSON && json_is_array(a->j) && is_int(b)) {
        const int64_t k = inum(b);
        const size_t len = json_array_size(a->j);
        if (k > 0 && len > 0 && (uint64_t)k > MAX_RANGE / len)
            return ct_rt_error("chat template: list repetition too large%s", "");
        json_t *r = json_array();
        for (int64_t i = 0; r && i < k; i++) json_array_extend(r, a->j);
        *out = vjson(r);
        return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(op, "*") && is_str(a) && is_int(b)) {
        int64_t k = inum(b);
        size_t sl = json_string_length(a->j);
        if (k > 0 && sl > 0 && (uint64_t)k > MAX_OUTPUT / sl)
            return ct_rt_error("chat template: string repetition too large%s", "");
        sbuf s = {0};
        sb_put(&s, "", 0);
        for (int64_t i = 0; i < k; i++) sb_put(&s, json_string_value(a->j), json_string_length(a->j));
        *out = vjson(s.oom ? NULL : json_stringn_nocheck(s.s, s.len));
        free(s.s);
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!is_num(a) || !is_num(b))
        return ct_rt_error("chat template: operator %s needs numbers (or strings/lists for +); use ~ to join text", op);
    if (is_int(a) && is_int(b) && strcmp(op, "/") != 0) {
        int64_t x = inum(a), y = inum(b), r = 0;
        int ok = 1;
        if (!strcmp(op, "+")) ok = !__builtin_add_overflow(x, y, &r);
        else if (!strcmp(op, "-")) ok = !__builtin_sub_overflow(x, y, &r);
        else if (!strcmp(op, "*")) ok = !__builtin_mul_overflow(x, y, &r);
        else if (!strcmp(op, "**")) {
            if (y < 0) goto real;
            r = 1;
            for (int64_t i = 0; i < y && ok; i++) ok = !__builtin_mul_overflow(r, x, &r);
        } else {
            if (y == 0) return ct_rt_error("chat template: division by zero%s", "");
            if (x == INT64_MIN && y == -1) ok = 0;
            else {
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                r = !strcmp(op, "//") ? q : m;
            }
        }
        if (!ok) return ct_rt_error("chat template: integer overflow in %s", op);
        *out = vjson(json_integer(r));
        return TP_OK;
    }
real:;
    double x = num(a), y = num(b), r;
    if (!strcmp(op, "+")) r = x + y;
    else if (!strcmp(op, "-")) r = x - y;
    else if (!strcmp(op, "*")) r = x * y;
    else if (!strcmp(op, "**")) r = pow(x, y);
    else {
        if (y == 0) return ct_rt_error("chat template: division by zero%s", "");
        r = !strcmp(op, "/") ? x / y : !strcmp(op, "//") ? floor(x / y) : x - floor(x / y) * y;
    }
    *out = vjson(json_real(r));
    return TP_OK;
}

tp_status ct_get_item(const val *obj, const val *key, val *out)
{
    *out = (val){.k = V_UNDEF};
    if (obj->k == V_UNDEF) return ct_rt_error("chat template: cannot index an undefined value%s", "");
    json_t *j = obj->j;
    if ((obj->k == V_JSON || obj->k == V_NS) && json_is_object(j)) {
        char buf[32];
        const char *k;
        size_t kn;
        if (key->k == V_JSON && ct_key_of(key->j, buf, sizeof buf, &k, &kn)) {
            json_t *v = json_object_getn(j, k, kn);
            if (v) *out = vjson(json_incref(v));
        }
        return TP_OK;
    }
    if (obj->k != V_JSON || !is_int(key)) return TP_OK;
    int64_t i = inum(key);
    if (json_is_array(j)) {
        int64_t n = (int64_t)json_array_size(j);
        if (i < 0) i += n;
        if (i >= 0 && i < n) *out = vjson(json_incref(json_array_get(j, (size_t)i)));
    } else if (json_is_string(j)) {
        cps cp;
        TP_CHECK(ct_cps_of(json_string_value(j), json_string_length(j), &cp));
        int64_t n = (int64_t)cp.n;
        if (i < 0) i += n;
        if (i >= 0 && i < n)
            *out = vjson(json_stringn_nocheck(json_string_value(j) + cp.off[i], cp.off[i + 1] - cp.off[i]));
        free(cp.off);
    }
    return TP_OK;
}

tp_status ct_slice(const val *obj, const val *parts, val *out)
{
    int64_t idx[3] = {0, 0, 1};
    int has[3];
    for (int k = 0; k < 3; k++) {
        has[k] = parts[k].k == V_JSON && !json_is_null(parts[k].j);
        if (has[k] && !is_int(&parts[k])) return ct_rt_error("chat template: slice bounds must be integers%s", "");
        if (has[k]) idx[k] = inum(&parts[k]);
    }
    if (idx[2] == 0) return ct_rt_error("chat template: slice step cannot be zero%s", "");
    int str = is_str(obj);
    if (!str && !(obj->k == V_JSON && json_is_array(obj->j)))
        return ct_rt_error("chat template: only strings and lists can be sliced%s", "");
    cps cp = {0};
    int64_t n;
    if (str) {
        TP_CHECK(ct_cps_of(json_string_value(obj->j), json_string_length(obj->j), &cp));
        n = (int64_t)cp.n;
    } else {
        n = (int64_t)json_array_size(obj->j);
    }
    /* Python's slice.indices() */
    int64_t step = idx[2], lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    int64_t start = has[0] ? idx[0] : (step < 0 ? hi : lo), stop = has[1] ? idx[1] : (step < 0 ? lo : hi);
    if (has[0]) start = start < 0 ? (start + n < lo ? lo : start + n) : (start > hi ? hi : start);
    if (has[1]) stop = stop < 0 ? (stop + n < lo ? lo : stop + n) : (stop > hi ? hi : stop);
    sbuf b = {0};
    json_t *arr = str ? NULL : json_array();
    sb_put(&b, "", 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (str) sb_put(&b, json_string_value(obj->j) + cp.off[i], cp.off[i + 1] - cp.off[i]);
        else json_array_append(arr, json_array_get(obj->j, (size_t)i));
    }
    free(cp.off);
    if (str) {
        *out = vjson(b.oom ? NULL : json_stringn_nocheck(b.s, b.len));
        free(b.s);
    } else {
        free(b.s);
        *out = vjson(arr);
    }
    return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
}

void ct_args_free(args *a)
{
    for (size_t i = 0; i < a->n; i++) vfree(&a->pos[i]);
    for (size_t i = 0; i < a->nk; i++) vfree(&a->kw[i]);
}

/* Keyword argument name; NULL if absent. */
const val *ct_kwarg(const args *a, const char *name)
{
    for (size_t k = 0; name && k < a->nk; k++)
        if (strcmp(a->kwname[k], name) == 0) return &a->kw[k];
    return NULL;
}

/* Positional argument i, or keyword name; NULL if absent. */
const val *ct_arg(const args *a, size_t i, const char *name)
{
    return i < a->n ? &a->pos[i] : ct_kwarg(a, name);
}

tp_status ct_need_str(const val *v, const char *what)
{
    return v && is_str(v) ? TP_OK : ct_rt_error("chat template: %s needs a string argument", what);
}
