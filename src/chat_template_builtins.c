/*
 * chat_template_builtins.c: the filters, tests, functions and methods real chat templates
 * use, with Jinja's and Python's semantics. tojson is transformers' json.dumps(ensure_ascii=False).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template_value.h"
#include "unicode.h"

static const char *const FILTERS[] = {"trim", "length", "count", "tojson", "string", "upper", "lower", "default", "d",
                                      "join", "items", "replace", "first", "last", "reverse", "list", "int", "float",
                                      "abs", "capitalize", "title", "safe", "select", "reject", "selectattr",
                                      "rejectattr", "map", "dictsort", "unique", "sort", "sum", "min", "max",
                                      "indent", "round", "format", "center", NULL};
static const char *const TESTS[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                    "boolean", "true", "false", "mapping", "iterable", "sequence", "even", "odd",
                                    "divisibleby", "equalto", "eq", "ne", "sameas", "in", "lower", "upper", "==", "!=",
                                    "gt", "ge", "lt", "le", ">", ">=", "<", "<=", "greaterthan", "lessthan",
                                    "callable", NULL};
static const char *const FUNCTIONS[] = {"raise_exception", "namespace", "range", "strftime_now", "dict", NULL};
static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper",
                                          "lower", "replace", "title", "capitalize", "find", "join", "count",
                                          "rfind", "index", "rindex", "removeprefix", "removesuffix", "zfill",
                                          "ljust", "rjust", "center", "splitlines", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};

static int in_list(const char *const *l, const char *s)
{
    for (size_t i = 0; l[i]; i++)
        if (strcmp(l[i], s) == 0) return 1;
    return 0;
}

int ct_known_filter(const char *name) { return in_list(FILTERS, name); }
int ct_known_test(const char *name) { return in_list(TESTS, name); }
int ct_known_function(const char *name) { return in_list(FUNCTIONS, name); }
int ct_known_method(const char *name) { return in_list(STR_METHODS, name) || in_list(DICT_METHODS, name); }

tp_status ct_get_attr(const val *obj, const char *name, val *out)
{
    *out = (val){.k = V_UNDEF};
    if (obj->k == V_UNDEF) return ct_rt_error("chat template: undefined value has no attribute '%s'", name);
    if (obj->k == V_JSON && json_is_object(obj->j) && in_list(DICT_METHODS, name)) {
        *out = (val){.k = V_METHOD, .j = json_incref(obj->j)};
        out->name = name;
        return TP_OK;
    }
    if (is_str(obj) && in_list(STR_METHODS, name)) {
        *out = (val){.k = V_METHOD, .j = json_incref(obj->j)};
        out->name = name;
        return TP_OK;
    }
    json_t *k = json_string(name);
    if (!k) return tp_error(TP_ERR_OOM, "out of memory");
    val key = vjson(k);
    tp_status st = ct_get_item(obj, &key, out);
    vfree(&key);
    return st;
}

tp_status ct_call_method(const val *self, const char *m, const args *a, val *out)
{
    json_t *j = self->j;
    if (json_is_object(j)) {
        if (!strcmp(m, "get")) {
            const val *k = ct_arg(a, 0, "key"), *d = ct_arg(a, 1, "default");
            char buf[32];
            const char *ks;
            size_t kn;
            json_t *v = k && k->k == V_JSON && ct_key_of(k->j, buf, sizeof buf, &ks, &kn) ? json_object_getn(j, ks, kn)
                                                                                           : NULL;
            *out = v ? vjson(json_incref(v)) : d ? vcopy(d) : vjson(json_null());
            return TP_OK;
        }
        json_t *r = json_array();
        for (void *it = json_object_iter(j); r && it; it = json_object_iter_next(j, it)) {
            json_t *key = ct_key_value(json_object_iter_key(it), json_object_iter_key_len(it));
            if (!strcmp(m, "keys")) json_array_append_new(r, key);
            else if (!strcmp(m, "values")) {
                json_decref(key);
                json_array_append(r, json_object_iter_value(it));
            } else json_array_append_new(r, json_pack("[oO]", key, json_object_iter_value(it)));
        }
        *out = vjson(r);
        return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    const char *s = json_string_value(j);
    size_t n = json_string_length(j);
    if ((!strcmp(m, "count") || !strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") ||
         !strcmp(m, "rindex") || !strcmp(m, "startswith") || !strcmp(m, "endswith")) &&
        (a->n > 1 || a->nk > 0))
        return ct_rt_error("chat template: %s() with start or end is not supported", m);
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        const val *ch = ct_arg(a, 0, "chars");
        int has = ch && is_str(ch);
        *out = vjson(ct_py_strip(s, n, has ? json_string_value(ch->j) : NULL, has ? json_string_length(ch->j) : 0,
                              m[0] != 'r', m[0] != 'l'));
    } else if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        const val *p = ct_arg(a, 0, "prefix");
        int hit = 0;
        json_t *list = p && p->k == V_JSON && json_is_array(p->j) ? p->j : NULL;
        for (size_t i = 0; i < (list ? json_array_size(list) : 1) && !hit; i++) {
            json_t *q = list ? json_array_get(list, i) : p ? p->j : NULL;
            if (!json_is_string(q)) return ct_rt_error("chat template: %s needs a string argument", m);
            size_t ql = json_string_length(q);
            hit = ql <= n && memcmp(m[0] == 's' ? s : s + n - ql, json_string_value(q), ql) == 0;
        }
        *out = vjson(json_boolean(hit));
    } else if (!strcmp(m, "split")) {
        const val *sep = ct_arg(a, 0, "sep"), *mx = ct_arg(a, 1, "maxsplit");
        int64_t maxsplit = mx && is_int(mx) ? inum(mx) : -1;
        json_t *r = json_array();
        if (sep && is_str(sep) && json_string_length(sep->j) > 0) {
            const char *sp = json_string_value(sep->j);
            size_t sl = json_string_length(sep->j), pos = 0;
            for (;;) {
                const char *f = maxsplit != 0 ? memmem(s + pos, n - pos, sp, sl) : NULL;
                if (!f) break;
                json_array_append_new(r, json_stringn_nocheck(s + pos, (size_t)(f - s) - pos));
                pos = (size_t)(f - s) + sl;
                if (maxsplit > 0) maxsplit--;
            }
            json_array_append_new(r, json_stringn_nocheck(s + pos, n - pos));
        } else if (sep && !(sep->k == V_JSON && json_is_null(sep->j))) {
            json_decref(r);
            return ct_rt_error("chat template: split() separator must be a non-empty string%s", "");
        } else {
            size_t i = 0, k;
            while (i < n) {
                while (i < n && ct_is_space_cp(s + i, n - i, &k)) i += k;
                if (i >= n) break;
                size_t st = i;
                if (maxsplit == 0) { /* Python keeps the rest as it is, its trailing whitespace too */
                    json_array_append_new(r, json_stringn_nocheck(s + st, n - st));
                    break;
                }
                while (i < n && !ct_is_space_cp(s + i, n - i, &k)) i += (size_t)tp_utf8_len((uint8_t)s[i]);
                json_array_append_new(r, json_stringn_nocheck(s + st, i - st));
                if (maxsplit > 0) maxsplit--;
            }
        }
        *out = vjson(r);
    } else if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
        /* Python's str methods, Unicode's full mappings (the title filter is Jinja's: run_filter) */
        char *r;
        size_t rn;
        TP_CHECK(tp_utf8_case(s, n, m[0] == 't' ? 'T' : m[0] == 'l' ? 'L' : m[0], &r, &rn));
        *out = vjson(json_stringn_nocheck(r, rn));
        free(r);
    } else if (!strcmp(m, "replace")) {
        const val *o = ct_arg(a, 0, "old"), *w = ct_arg(a, 1, "new"), *cnt = ct_arg(a, 2, "count");
        TP_CHECK(ct_need_str(o, "replace()"));
        TP_CHECK(ct_need_str(w, "replace()"));
        int64_t left = cnt && is_int(cnt) ? inum(cnt) : -1;
        const char *os = json_string_value(o->j);
        size_t ol = json_string_length(o->j), pos = 0;
        sbuf b = {0};
        sb_put(&b, "", 0);
        if (ol == 0) return ct_rt_error("chat template: replace() of an empty string is not supported%s", "");
        for (;;) {
            const char *f = left != 0 ? memmem(s + pos, n - pos, os, ol) : NULL;
            if (!f) break;
            sb_put(&b, s + pos, (size_t)(f - s) - pos);
            sb_put(&b, json_string_value(w->j), json_string_length(w->j));
            pos = (size_t)(f - s) + ol;
            if (left > 0) left--;
        }
        sb_put(&b, s + pos, n - pos);
        *out = vjson(b.oom ? NULL : json_stringn_nocheck(b.s, b.len));
        free(b.s);
    } else if (!strcmp(m, "find")) {
        const val *q = ct_arg(a, 0, "sub");
        TP_CHECK(ct_need_str(q, "find()"));
        const char *f = memmem(s, n, json_string_value(q->j), json_string_length(q->j));
        int64_t r = -1;
        if (f) {
            r = 0;
            for (const char *p = s; p < f; p += tp_utf8_len((uint8_t)*p)) r++;
        }
        *out = vjson(json_integer(r));
    } else if (!strcmp(m, "join")) {
        const val *l = ct_arg(a, 0, "iterable");
        if (!l || l->k != V_JSON || !json_is_array(l->j))
            return ct_rt_error("chat template: join() needs a list%s", "");
        sbuf b = {0};
        sb_put(&b, "", 0);
        for (size_t i = 0; i < json_array_size(l->j); i++) {
            json_t *e = json_array_get(l->j, i);
            if (!json_is_string(e)) {
                free(b.s);
                return ct_rt_error("chat template: str.join() needs strings%s", "");
            }
            if (i) sb_put(&b, s, n);
            sb_put(&b, json_string_value(e), json_string_length(e));
        }
        *out = vjson(b.oom ? NULL : json_stringn_nocheck(b.s, b.len));
        free(b.s);
    } else if (!strcmp(m, "count")) { /* non-overlapping; "" counts every gap */
        const val *q = ct_arg(a, 0, "sub");
        TP_CHECK(ct_need_str(q, "count()"));
        const char *qs = json_string_value(q->j);
        const size_t ql = json_string_length(q->j);
        int64_t r = 0;
        if (!ql) {
            for (size_t i = 0; i < n; i += (size_t)tp_utf8_len((uint8_t)s[i])) r++;
            r++;
        } else {
            for (const char *p = s, *e = s + n, *f; (f = memmem(p, (size_t)(e - p), qs, ql)); p = f + ql) r++;
        }
        *out = vjson(json_integer(r));
    } else if (!strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex")) {
        const val *q = ct_arg(a, 0, "sub");
        TP_CHECK(ct_need_str(q, "find()"));
        const char *qs = json_string_value(q->j), *hit = NULL;
        const size_t ql = json_string_length(q->j);
        for (const char *p = s, *e = s + n, *f; p <= e && (f = memmem(p, (size_t)(e - p), qs, ql)); p = f + 1) {
            hit = f;
            if (m[0] == 'i') break;
        }
        if (!hit && m[1] != 'f') return ct_rt_error("chat template: %s(): substring not found", m);
        int64_t r = -1;
        if (hit) {
            r = 0;
            for (const char *p = s; p < hit; p += tp_utf8_len((uint8_t)*p)) r++;
        }
        *out = vjson(json_integer(r));
    } else if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        const val *q = ct_arg(a, 0, NULL);
        TP_CHECK(ct_need_str(q, m));
        const size_t ql = json_string_length(q->j);
        const int pre = m[6] == 'p';
        const int has = ql <= n && !memcmp(pre ? s : s + n - ql, json_string_value(q->j), ql);
        *out = vjson(json_stringn_nocheck(has && pre ? s + ql : s, has ? n - ql : n));
    } else if (!strcmp(m, "zfill") || !strcmp(m, "ljust") || !strcmp(m, "rjust") || !strcmp(m, "center")) {
        const val *w = ct_arg(a, 0, "width"), *fill = ct_arg(a, 1, "fillchar");
        if (!w || !is_int(w)) return ct_rt_error("chat template: %s() needs an integer width", m);
        if (inum(w) > (int64_t)(MAX_OUTPUT / 4)) return ct_rt_error("chat template: %s() width too large", m);
        if (fill && !(is_str(fill) && json_string_length(fill->j) == (size_t)tp_utf8_len((uint8_t)*json_string_value(fill->j))))
            return ct_rt_error("chat template: %s()'s fill character must be one character", m);
        *out = vjson(py_pad(s, n, inum(w), m[0] == 'z' ? 'z' : m[0] == 'l' ? 'l' : m[0] == 'r' ? 'r' : 'c',
                            fill ? json_string_value(fill->j) : " ", fill ? json_string_length(fill->j) : 1));
    } else if (!strcmp(m, "splitlines")) {
        const val *keep = ct_arg(a, 0, "keepends");
        *out = vjson(py_splitlines(s, n, keep && ct_truthy(keep)));
    } else {
        return ct_rt_error("chat template: unknown method %s", m);
    }
    return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
}

tp_status ct_call_function(ctx *c, const char *f, const args *a, val *out)
{
    if (!strcmp(f, "raise_exception")) {
        const val *m = ct_arg(a, 0, NULL);
        json_t *s = NULL;
        if (m) TP_CHECK(ct_to_string(m, &s));
        tp_status st = tp_error(TP_ERR_INVALID_ARG, "chat template raised an exception: %s",
                                s ? json_string_value(s) : "");
        json_decref(s);
        return st;
    }
    if (!strcmp(f, "namespace") || !strcmp(f, "dict")) {
        json_t *o = json_object();
        for (size_t i = 0; o && i < a->nk; i++) /* namespace(): an undefined value leaves no key (it reads back undefined) */
            if (a->kw[i].k != V_UNDEF || f[0] != 'n')
                json_object_set(o, a->kwname[i], a->kw[i].k == V_JSON ? a->kw[i].j : json_null());
        if (!o) return tp_error(TP_ERR_OOM, "out of memory");
        *out = (val){.k = f[0] == 'n' ? V_NS : V_JSON, .j = o};
        return TP_OK;
    }
    if (!strcmp(f, "range")) {
        int64_t v[3] = {0, 0, 1};
        for (size_t i = 0; i < a->n; i++) {
            if (!is_int(&a->pos[i]) || i > 2) return ct_rt_error("chat template: range() takes 1-3 integers%s", "");
            v[i] = inum(&a->pos[i]);
        }
        int64_t start = a->n >= 2 ? v[0] : 0, stop = a->n >= 2 ? v[1] : v[0], step = a->n == 3 ? v[2] : 1;
        if (step == 0) return ct_rt_error("chat template: range() step cannot be zero%s", "");
        json_t *r = json_array();
        int64_t count = 0;
        for (int64_t i = start; r && (step > 0 ? i < stop : i > stop); i += step) {
            if (++count > MAX_RANGE) {
                json_decref(r);
                return ct_rt_error("chat template: range() longer than a million%s", "");
            }
            json_array_append_new(r, json_integer(i));
        }
        *out = vjson(r);
        return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(f, "strftime_now")) {
        const val *fmt = ct_arg(a, 0, NULL);
        TP_CHECK(ct_need_str(fmt, "strftime_now()"));
        char buf[256];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, json_string_value(fmt->j), &tm);
        *out = vjson(json_stringn(buf, n));
        return TP_OK;
    }
    (void)c;
    return ct_rt_error("chat template: unknown function %s", f);
}

/* Jinja's attribute getter: "a.b.0" walks attribute a, then b, then item 0; an undefined
 * step becomes dflt where there is one (map's default=), else the next step fails */
static tp_status attr_path(const val *e, const char *path, const val *dflt, val *out)
{
    val cur = vcopy(e);
    tp_status st = TP_OK;
    for (;;) {
        const char *dot = strchr(path, '.');
        const size_t n = dot ? (size_t)(dot - path) : strlen(path);
        char part[128];
        if (n >= sizeof part) {
            st = ct_rt_error("chat template: attribute name too long in \"%.40s\"", path);
            break;
        }
        memcpy(part, path, n);
        part[n] = '\0';
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= part[i] >= '0' && part[i] <= '9';
        val next = {0};
        if (digits) {
            val key = vjson(json_integer(strtoll(part, NULL, 10)));
            st = ct_get_item(&cur, &key, &next);
            vfree(&key);
        } else st = ct_get_attr(&cur, part, &next);
        vfree(&cur);
        cur = next;
        if (st != TP_OK) break;
        if (cur.k == V_UNDEF && dflt) cur = vcopy(dflt);
        if (!dot) break;
        path = dot + 1;
    }
    if (st != TP_OK) {
        vfree(&cur);
        return st;
    }
    *out = cur;
    return TP_OK;
}

/* select/reject/selectattr/rejectattr/map over a list. */
static tp_status filter_seq(ctx *c, const char *f, const val *in, const args *a, val *out)
{
    if (in->k == V_UNDEF) { /* Jinja's Undefined iterates as nothing */
        *out = vjson(json_array());
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (in->k != V_JSON || !json_is_array(in->j)) return ct_rt_error("chat template: filter %s needs a list", f);
    int attr = strstr(f, "attr") != NULL, is_map = !strcmp(f, "map");
    const val *fname = is_map ? ct_arg(a, 0, NULL) : NULL;
    if (fname) { /* map('upper'), map('replace', 'a', 'b'): a filter on each item */
        if (!is_str(fname) || !ct_known_filter(json_string_value(fname->j)))
            return ct_rt_error("chat template: map's filter %s is not supported",
                            is_str(fname) ? json_string_value(fname->j) : "(not a name)");
        args fargs = {0};
        for (size_t i = 1; i < a->n; i++) fargs.pos[fargs.n++] = a->pos[i];
        for (size_t i = 0; i < a->nk; i++) fargs.kw[fargs.nk] = a->kw[i], fargs.kwname[fargs.nk++] = a->kwname[i];
        json_t *r = json_array();
        tp_status st = r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
        for (size_t i = 0; st == TP_OK && i < json_array_size(in->j); i++) {
            val e = {.k = V_JSON, .j = json_incref(json_array_get(in->j, i))}, o = {0};
            st = ct_run_filter(c, json_string_value(fname->j), &e, &fargs, &o);
            if (st == TP_OK) json_array_append(r, o.k == V_JSON ? o.j : json_null());
            vfree(&o);
            vfree(&e);
        }
        if (st != TP_OK) json_decref(r);
        else *out = vjson(r);
        return st; /* fargs borrows a's values: not freed */
    }
    const val *an = is_map ? ct_kwarg(a, "attribute") : attr ? ct_arg(a, 0, NULL) : NULL;
    const val *dflt = is_map ? ct_kwarg(a, "default") : NULL;
    if ((attr || is_map) && (!an || !is_str(an)))
        return ct_rt_error("chat template: %s needs an attribute name (map(attribute=...))", f);
    const val *tn = ct_arg(a, attr ? 1 : 0, NULL);
    if (!is_map && tn && !is_str(tn)) return ct_rt_error("chat template: %s needs a test name", f);
    if (tn && !is_map && !ct_known_test(json_string_value(tn->j)))
        return ct_rt_error("chat template: test %s is not supported", json_string_value(tn->j));
    args targs = {0};
    for (size_t i = (attr ? 2 : 1); i < a->n && targs.n < 8; i++) targs.pos[targs.n++] = a->pos[i];
    json_t *r = json_array();
    tp_status st = TP_OK;
    for (size_t i = 0; r && st == TP_OK && i < json_array_size(in->j); i++) {
        val e = {.k = V_JSON, .j = json_array_get(in->j, i)}, subject = {0};
        if (an) st = attr_path(&e, json_string_value(an->j), dflt, &subject);
        else subject = vcopy(&e);
        if (st != TP_OK) break;
        if (is_map) {
            json_array_append(r, subject.k == V_JSON ? subject.j : json_null());
        } else {
            int ok = ct_truthy(&subject);
            if (tn) st = ct_run_test(c, json_string_value(tn->j), &subject, &targs, &ok);
            if (ok == (f[0] == 's')) json_array_append(r, e.j);
        }
        vfree(&subject);
    }
    if (st != TP_OK) {
        json_decref(r);
        return st;
    }
    *out = vjson(r);
    return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
}

static tp_status length_of(const val *v, int64_t *n)
{
    if (is_str(v)) {
        cps cp;
        TP_CHECK(ct_cps_of(json_string_value(v->j), json_string_length(v->j), &cp));
        free(cp.off);
        *n = (int64_t)cp.n;
    } else if (v->k == V_JSON && json_is_array(v->j)) *n = (int64_t)json_array_size(v->j);
    else if ((v->k == V_JSON || v->k == V_NS) && json_is_object(v->j)) *n = (int64_t)json_object_size(v->j);
    else return ct_rt_error("chat template: length of a value that has none%s", "");
    return TP_OK;
}


// ----------------------------------------------------------------------------
// sort, dictsort, unique, min, max, sum (Jinja's: case-insensitive unless case_sensitive)

typedef struct keyed {
    val key;
    json_t *item; /* borrowed */
} keyed;

/* Jinja's sort key of item: attribute (dotted paths, "a,b" for several) or the item, its
 * strings lower-cased unless case_sensitive */
static tp_status sort_key(json_t *item, const val *attribute, int case_sensitive, val *out)
{
    val e = {.k = V_JSON, .j = item};
    tp_status st = TP_OK;
    if (attribute && is_str(attribute) && strchr(json_string_value(attribute->j), ',')) {
        json_t *parts = json_array();
        const char *p = json_string_value(attribute->j);
        while (parts && st == TP_OK) {
            const char *comma = strchr(p, ',');
            char name[128];
            const size_t n = comma ? (size_t)(comma - p) : strlen(p);
            snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), p);
            val one = {0};
            st = attr_path(&e, name, NULL, &one);
            if (st == TP_OK) json_array_append(parts, one.k == V_JSON ? one.j : json_null());
            vfree(&one);
            if (!comma) break;
            p = comma + 1;
        }
        *out = vjson(parts);
        if (st == TP_OK && !parts) st = tp_error(TP_ERR_OOM, "out of memory");
    } else if (attribute && is_str(attribute)) {
        st = attr_path(&e, json_string_value(attribute->j), NULL, out);
    } else if (attribute && !(attribute->k == V_JSON && json_is_null(attribute->j))) {
        return ct_rt_error("chat template: attribute= must be a name%s", "");
    } else {
        *out = vcopy(&e);
    }
    if (st != TP_OK || case_sensitive || out->k != V_JSON) return st;
    json_t *k = out->j;
    /* the parts of "a,b" are lower-cased one by one (that list is ours); a list item is not */
    json_t *list = attribute && is_str(attribute) && strchr(json_string_value(attribute->j), ',') ? k : NULL;
    if (!list && !json_is_string(k)) return TP_OK;
    for (size_t i = 0; i < (list ? json_array_size(list) : 1); i++) {
        json_t *x = list ? json_array_get(list, i) : k;
        if (!json_is_string(x)) continue;
        char *lo;
        size_t nl;
        TP_CHECK(tp_utf8_case(json_string_value(x), json_string_length(x), 'L', &lo, &nl));
        json_t *l = json_stringn_nocheck(lo, nl);
        free(lo);
        if (!l) return tp_error(TP_ERR_OOM, "out of memory");
        if (list) json_array_set_new(list, i, l);
        else {
            json_decref(out->j);
            out->j = l;
        }
    }
    return TP_OK;
}

/* Stable merge sort of v by key (Python's sorted; reverse keeps equal items in order) */
static tp_status sort_keyed(keyed *v, keyed *tmp, size_t n, int reverse)
{
    if (n < 2) return TP_OK;
    const size_t h = n / 2;
    TP_CHECK(sort_keyed(v, tmp, h, reverse));
    TP_CHECK(sort_keyed(v + h, tmp, n - h, reverse));
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        int r;
        TP_CHECK(ct_py_cmp(&v[j].key, &v[i].key, &r)); /* take the right one only if it goes strictly first */
        tmp[o++] = (reverse ? r > 0 : r < 0) ? v[j++] : v[i++];
    }
    while (i < h) tmp[o++] = v[i++];
    while (j < n) tmp[o++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
    return TP_OK;
}

/* sort, dictsort, unique, min, max over the list (dictsort: the mapping's (key, value) pairs) */
static tp_status filter_order(const char *f, const val *in, const args *a, val *out)
{
    const int dict = !strcmp(f, "dictsort");
    const val *cs = ct_arg(a, dict ? 0 : !strcmp(f, "sort") ? 1 : 0, "case_sensitive");
    const val *attribute = dict ? NULL : ct_arg(a, !strcmp(f, "sort") ? 2 : 1, "attribute");
    const val *rev = ct_arg(a, dict ? 2 : 0, "reverse"), *by = dict ? ct_arg(a, 1, "by") : NULL;
    if (!strcmp(f, "unique") || !strcmp(f, "min") || !strcmp(f, "max")) rev = NULL;
    const int case_sensitive = cs && ct_truthy(cs), reverse = rev && ct_truthy(rev);
    int by_value = 0;
    if (by && !(is_str(by) && (!strcmp(json_string_value(by->j), "key") || !strcmp(json_string_value(by->j), "value"))))
        return ct_rt_error("chat template: dictsort's by must be 'key' or 'value'%s", "");
    if (by) by_value = json_string_value(by->j)[0] == 'v';
    json_t *items = NULL;
    if (dict) {
        if (in->k != V_JSON || !json_is_object(in->j))
            return ct_rt_error("chat template: dictsort needs a mapping%s", "");
        items = json_array();
        for (void *it = json_object_iter(in->j); items && it; it = json_object_iter_next(in->j, it))
            json_array_append_new(items, json_pack("[oO]", ct_key_value(json_object_iter_key(it),
                                                                         json_object_iter_key_len(it)),
                                                   json_object_iter_value(it)));
    } else if (in->k == V_JSON && json_is_array(in->j)) {
        items = json_incref(in->j);
    } else if (is_str(in) || (in->k == V_JSON && json_is_object(in->j))) {
        val l = {0};
        TP_CHECK(ct_run_filter(NULL, "list", (val *)in, &(args){0}, &l)); /* characters; a mapping's keys */
        items = l.j;
    } else {
        return ct_rt_error("chat template: filter %s needs a list", f);
    }
    if (!items) return tp_error(TP_ERR_OOM, "out of memory");
    const size_t n = json_array_size(items);
    keyed *v = calloc(n ? 2 * n : 1, sizeof *v);
    tp_status st = v ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    for (size_t i = 0; st == TP_OK && i < n; i++) {
        v[i].item = json_array_get(items, i);
        json_t *subject = dict ? json_array_get(v[i].item, by_value ? 1 : 0) : v[i].item;
        st = sort_key(subject, attribute, case_sensitive, &v[i].key);
    }
    json_t *r = NULL;
    if (st == TP_OK && (!strcmp(f, "sort") || dict)) {
        st = sort_keyed(v, v + n, n, reverse);
        r = json_array();
        for (size_t i = 0; r && st == TP_OK && i < n; i++) json_array_append(r, v[i].item);
    } else if (st == TP_OK && !strcmp(f, "unique")) { /* the first of each key, in order */
        r = json_array();
        for (size_t i = 0; r && i < n; i++) {
            int seen = 0;
            for (size_t k = 0; k < i && !seen; k++) seen = ct_py_eq(&v[k].key, &v[i].key);
            if (!seen) json_array_append(r, v[i].item);
        }
    } else if (st == TP_OK) { /* min, max: the first extreme item; none of an empty list */
        size_t best = 0;
        for (size_t i = 1; st == TP_OK && i < n; i++) {
            int c = 0;
            st = ct_py_cmp(&v[i].key, &v[best].key, &c);
            if (f[1] == 'i' ? c < 0 : c > 0) best = i;
        }
        if (st == TP_OK && n) *out = vjson(json_incref(v[best].item));
    }
    for (size_t i = 0; v && i < n; i++) vfree(&v[i].key);
    free(v);
    json_decref(items);
    if (r && st == TP_OK) *out = vjson(r);
    else json_decref(r);
    if (st == TP_OK && (!strcmp(f, "sort") || dict || !strcmp(f, "unique")) && !r) st = tp_error(TP_ERR_OOM, "out of memory");
    return st;
}

tp_status ct_run_filter(ctx *c, const char *f, val *in, const args *a, val *out)
{
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const val *d = ct_arg(a, 0, "default_value"), *b = ct_arg(a, 1, "boolean");
        int use = in->k == V_UNDEF || (b && ct_truthy(b) && !ct_truthy(in));
        *out = use ? (d ? vcopy(d) : vjson(json_string(""))) : vcopy(in);
        return TP_OK;
    }
    if (!strcmp(f, "safe")) {
        *out = vcopy(in);
        return TP_OK;
    }
    if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr") ||
        !strcmp(f, "map"))
        return filter_seq(c, f, in, a, out);
    if (in->k == V_UNDEF) { /* Jinja's Undefined: "" as a string, empty as a sequence (int, float: an error) */
        if (!strcmp(f, "length") || !strcmp(f, "count")) *out = vjson(json_integer(0));
        else if (!strcmp(f, "list") || !strcmp(f, "reverse") || !strcmp(f, "items")) *out = vjson(json_array());
        else if (!strcmp(f, "first") || !strcmp(f, "last") || !strcmp(f, "min") || !strcmp(f, "max"))
            *out = (val){.k = V_UNDEF};
        else if (!strcmp(f, "sort") || !strcmp(f, "unique")) *out = vjson(json_array());
        else if (!strcmp(f, "sum")) *out = vjson(json_integer(0));
        else if (!strcmp(f, "string") || !strcmp(f, "join") || !strcmp(f, "trim") || !strcmp(f, "upper") ||
                 !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize") || !strcmp(f, "replace"))
            *out = vjson(json_string(""));
        else if (!strcmp(f, "center")) { /* str(Undefined) is "", then centred */
            val empty = vjson(json_string(""));
            tp_status st = empty.j ? ct_run_filter(c, f, &empty, a, out) : tp_error(TP_ERR_OOM, "out of memory");
            vfree(&empty);
            return st;
        }
        else return ct_rt_error("chat template: filter %s applied to an undefined value", f);
        return out->k == V_UNDEF || out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        int64_t n = 0;
        TP_CHECK(length_of(in, &n));
        *out = vjson(json_integer(n));
        return TP_OK;
    }
    if (!strcmp(f, "string")) {
        json_t *s;
        TP_CHECK(ct_to_string(in, &s));
        *out = vjson(s);
        return TP_OK;
    }
    if (!strcmp(f, "tojson")) { /* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        const val *asc = ct_arg(a, 0, "ensure_ascii"), *ind = ct_arg(a, 1, "indent"), *sep = ct_arg(a, 2, "separators"),
                  *srt = ct_arg(a, 3, "sort_keys");
        if (in->k != V_JSON && in->k != V_NS) return ct_rt_error("chat template: tojson of a non-JSON value%s", "");
        static const char spaces[] = "                                                                ";
        json_opts o = {asc && ct_truthy(asc), NULL, 0, ", ", ": ", srt && ct_truthy(srt)};
        if (ind && is_int(ind)) { /* n spaces a level (at most 64) */
            const int64_t k = inum(ind);
            o.indent = spaces;
            o.indent_len = k <= 0 ? 0 : k > 64 ? 64 : (size_t)k;
        } else if (ind && is_str(ind)) {
            o.indent = json_string_value(ind->j);
            o.indent_len = json_string_length(ind->j);
        } else if (ind && !(ind->k == V_JSON && json_is_null(ind->j)))
            return ct_rt_error("chat template: tojson's indent must be an integer, a string or none%s", "");
        if (o.indent) o.item_sep = ",";
        if (sep && sep->k == V_JSON && json_is_array(sep->j) && json_array_size(sep->j) == 2 &&
            json_is_string(json_array_get(sep->j, 0)) && json_is_string(json_array_get(sep->j, 1))) {
            o.item_sep = json_string_value(json_array_get(sep->j, 0));
            o.key_sep = json_string_value(json_array_get(sep->j, 1));
        } else if (sep && !(sep->k == V_JSON && json_is_null(sep->j)))
            return ct_rt_error("chat template: tojson's separators must be a pair of strings%s", "");
        sbuf b = {0};
        sb_put(&b, "", 0);
        py_json(&b, in->j, &o, 0);
        *out = vjson(b.oom ? NULL : json_stringn_nocheck(b.s, b.len));
        free(b.s);
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(f, "sort") || !strcmp(f, "dictsort") || !strcmp(f, "unique") || !strcmp(f, "min") ||
        !strcmp(f, "max"))
        return filter_order(f, in, a, out);
    if (!strcmp(f, "sum")) { /* sum(items[.attribute], start) */
        const val *attribute = ct_arg(a, 0, "attribute"), *start = ct_arg(a, 1, "start");
        if (in->k != V_JSON || !json_is_array(in->j)) return ct_rt_error("chat template: sum needs a list%s", "");
        val acc = start ? vcopy(start) : vjson(json_integer(0));
        tp_status st = TP_OK;
        for (size_t i = 0; st == TP_OK && i < json_array_size(in->j); i++) {
            val e = {.k = V_JSON, .j = json_array_get(in->j, i)}, x = {0}, next = {0};
            st = attribute && is_str(attribute) ? attr_path(&e, json_string_value(attribute->j), NULL, &x)
                                                : (x = vcopy(&e), TP_OK);
            if (st == TP_OK) st = ct_arith("+", &acc, &x, &next);
            vfree(&x);
            vfree(&acc);
            acc = next;
        }
        if (st != TP_OK) vfree(&acc);
        else *out = acc;
        return st;
    }
    if (!strcmp(f, "round")) { /* round(value, precision=0, method='common'|'ceil'|'floor') */
        const val *pr = ct_arg(a, 0, "precision"), *me = ct_arg(a, 1, "method");
        const int64_t p = pr && is_int(pr) ? inum(pr) : 0;
        const char *method = me && is_str(me) ? json_string_value(me->j) : "common";
        if (!is_num(in)) return ct_rt_error("chat template: round needs a number%s", "");
        if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
            return ct_rt_error("chat template: round's method must be common, ceil or floor%s", "");
        if (!strcmp(method, "common") && is_int(in)) { /* round(3, 0) is 3; round(25, -1) 20 (to even) */
            int64_t x = inum(in), r = x;
            if (p < 0 && p >= -18) {
                int64_t m = 1;
                for (int64_t i = 0; i < -p; i++) m *= 10;
                int64_t q = x / m, rem = x % m;
                if (rem < 0) rem += m, q--; /* floor division */
                if (2 * rem > m || (2 * rem == m && (q & 1))) q++;
                if (__builtin_mul_overflow(q, m, &r)) return ct_rt_error("chat template: round() overflows%s", "");
            } else if (p < -18) {
                r = 0;
            }
            *out = vjson(json_integer(r));
            return TP_OK;
        }
        const double x = num(in), scale = pow(10.0, (double)p);
        *out = vjson(json_real(method[0] == 'c' && method[1] == 'o' ? py_round(x, p)
                               : (method[0] == 'c' ? ceil(x * scale) : floor(x * scale)) / scale));
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(f, "format")) { /* fmt|format(*args) is fmt % args; with keywords, fmt % kwargs */
        if (a->n && a->nk)
            return ct_rt_error("chat template: format takes positional or keyword arguments, not both%s", "");
        json_t *args_j = a->nk ? json_object() : json_array();
        for (size_t i = 0; args_j && i < a->n; i++) /* str(Undefined) is "" */
            json_array_append_new(args_j, a->pos[i].k == V_JSON ? json_incref(a->pos[i].j) : json_string(""));
        for (size_t i = 0; args_j && i < a->nk; i++)
            json_object_set(args_j, a->kwname[i], a->kw[i].k == V_JSON ? a->kw[i].j : json_null());
        json_t *str = NULL, *r = NULL;
        tp_status st = args_j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
        if (st == TP_OK && !is_str(in)) st = ct_to_string(in, &str);
        if (st == TP_OK)
            st = py_percent(json_string_value(str ? str : in->j), json_string_length(str ? str : in->j), args_j, &r);
        json_decref(args_j);
        json_decref(str);
        if (st == TP_OK) *out = vjson(r);
        return st;
    }
    if (!strcmp(f, "indent") || !strcmp(f, "center")) {
        json_t *str = NULL, *r = NULL;
        if (!is_str(in)) TP_CHECK(ct_to_string(in, &str));
        const char *sv = json_string_value(str ? str : in->j);
        const size_t sn = json_string_length(str ? str : in->j);
        tp_status st = TP_OK;
        if (f[0] == 'i') { /* indent(width=4, first=False, blank=False); width may be a string */
            const val *w = ct_arg(a, 0, "width"), *first = ct_arg(a, 1, "first"), *blank = ct_arg(a, 2, "blank");
            char *spaces = NULL;
            const char *ind = "    ";
            size_t il = 4;
            if (w && is_str(w)) ind = json_string_value(w->j), il = json_string_length(w->j);
            else if (w && is_int(w) && inum(w) > 4096)
                st = ct_rt_error("chat template: indent's width over 4096%s", "");
            else if (w && is_int(w)) {
                il = inum(w) < 0 ? 0 : (size_t)inum(w);
                spaces = malloc(il + 1);
                if (spaces) memset(spaces, ' ', il);
                ind = spaces;
                if (!spaces) st = tp_error(TP_ERR_OOM, "out of memory");
            } else if (w) st = ct_rt_error("chat template: indent's width must be a number or a string%s", "");
            if (st == TP_OK) r = py_indent(sv, sn, ind, il, first && ct_truthy(first), blank && ct_truthy(blank));
            free(spaces);
        } else if (f[0] == 'c') {
            const val *w = ct_arg(a, 0, "width");
            const int64_t width = w && is_int(w) ? inum(w) : 80;
            if (w && !is_int(w)) st = ct_rt_error("chat template: center's width must be an integer%s", "");
            else if (width > (int64_t)(MAX_OUTPUT / 4))
                st = ct_rt_error("chat template: center's width too large%s", "");
            else r = py_pad(sv, sn, width, 'c', " ", 1);
        }
        json_decref(str);
        TP_CHECK(st);
        *out = vjson(r);
        return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(f, "items")) {
        if (in->k != V_JSON || !json_is_object(in->j)) return ct_rt_error("chat template: items needs a mapping%s", "");
        return ct_call_method(in, "items", a, out);
    }
    if (!strcmp(f, "join")) {
        const val *sep_arg = ct_arg(a, 0, "d"), *attr = ct_arg(a, 1, "attribute");
        if (in->k != V_JSON || !json_is_array(in->j)) return ct_rt_error("chat template: join needs a list%s", "");
        if (attr && !is_str(attr)) return ct_rt_error("chat template: join's attribute must be a name%s", "");
        json_t *sep_str = NULL; /* the separator as str() gives it */
        if (sep_arg) TP_CHECK(ct_to_string(sep_arg, &sep_str));
        val sep_v = {.k = V_JSON, .j = sep_str}, *sep = sep_str ? &sep_v : NULL;
        sbuf b = {0};
        sb_put(&b, "", 0);
        for (size_t i = 0; i < json_array_size(in->j); i++) {
            json_t *s;
            val e = {.k = V_JSON, .j = json_array_get(in->j, i)}, picked = {0};
            if (i && sep && is_str(sep)) sb_put(&b, json_string_value(sep->j), json_string_length(sep->j));
            tp_status st = attr ? attr_path(&e, json_string_value(attr->j), NULL, &picked) : TP_OK;
            if (st == TP_OK) st = ct_to_string(attr ? &picked : &e, &s);
            vfree(&picked);
            if (st != TP_OK) {
                free(b.s);
                json_decref(sep_str);
                return st;
            }
            sb_put(&b, json_string_value(s), json_string_length(s));
            json_decref(s);
        }
        json_decref(sep_str);
        *out = vjson(b.oom ? NULL : json_stringn_nocheck(b.s, b.len));
        free(b.s);
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        json_t *k = json_integer(f[0] == 'f' ? 0 : -1);
        val key = vjson(k);
        tp_status st = ct_get_item(in, &key, out);
        vfree(&key);
        return st;
    }
    if (!strcmp(f, "reverse") || !strcmp(f, "list")) {
        if (is_str(in) || (in->k == V_JSON && json_is_array(in->j))) {
            if (f[0] == 'l' && !is_str(in)) {
                *out = vcopy(in);
                return TP_OK;
            }
            val parts[3] = {{0}, {0}, {.k = V_JSON, .j = json_integer(-1)}};
            if (f[0] == 'l') {
                /* list("abc") -> ['a', 'b', 'c'] */
                cps cp;
                TP_CHECK(ct_cps_of(json_string_value(in->j), json_string_length(in->j), &cp));
                json_t *r = json_array();
                for (size_t i = 0; r && i < cp.n; i++)
                    json_array_append_new(r, json_stringn_nocheck(json_string_value(in->j) + cp.off[i],
                                                                  cp.off[i + 1] - cp.off[i]));
                free(cp.off);
                vfree(&parts[2]);
                *out = vjson(r);
                return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
            }
            tp_status st = ct_slice(in, parts, out);
            vfree(&parts[2]);
            return st;
        }
        return ct_rt_error("chat template: filter %s needs a string or list", f);
    }
    if (!strcmp(f, "int") || !strcmp(f, "float") || !strcmp(f, "abs")) {
        double x = 0;
        int integral = 0;
        if (is_num(in)) {
            x = num(in);
            integral = is_int(in);
        } else if (is_str(in)) {
            /* Python's int() / float() of a string: surrounding whitespace allowed, no hex */
            const char *str = json_string_value(in->j);
            char *end;
            x = strpbrk(str, "xX") ? 0 : strtod(str, &end);
            if (!strpbrk(str, "xX")) {
                while (*end == ' ' || (*end >= '\t' && *end <= '\r')) end++;
                if (*end || end == str) x = 0;
            }
            if (!strcmp(f, "int") && !isfinite(x)) x = 0; /* int(float('inf')) fails: jinja2's default 0 */
        }
        if (!strcmp(f, "abs")) {
            if (!is_num(in)) return ct_rt_error("chat template: abs needs a number%s", "");
            *out = vjson(integral ? json_integer(llabs((long long)inum(in))) : json_real(fabs(x)));
        } else {
            *out = vjson(f[0] == 'i' ? json_integer((json_int_t)x) : json_real(x));
        }
        return TP_OK;
    }
    const int on_str = !strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") ||
                       !strcmp(f, "capitalize") || !strcmp(f, "replace");
    if (!on_str) return ct_rt_error("chat template: unknown filter %s", f);
    /* Jinja's string filters take str(value): None is "None", a list its repr */
    json_t *str = NULL;
    if (!is_str(in)) TP_CHECK(ct_to_string(in, &str));
    val sv = {.k = V_JSON, .j = str ? str : in->j};
    tp_status st;
    if (!strcmp(f, "title")) { /* Jinja's own: words begin after whitespace, -, (, {, [ or < */
        char *r;
        size_t rn;
        st = tp_utf8_case(json_string_value(sv.j), json_string_length(sv.j), 'J', &r, &rn);
        if (st == TP_OK) {
            *out = vjson(json_stringn_nocheck(r, rn));
            free(r);
            if (!out->j) st = tp_error(TP_ERR_OOM, "out of memory");
        }
    } else st = ct_call_method(&sv, !strcmp(f, "trim") ? "strip" : f, a, out);
    json_decref(str);
    return st;
}

tp_status ct_run_test(ctx *c, const char *t, const val *v, const args *a, int *out)
{
    (void)c;
    const val *x = ct_arg(a, 0, NULL);
    json_t *j = v->k == V_JSON ? v->j : NULL;
    if (!strcmp(t, "defined")) *out = v->k != V_UNDEF;
    else if (!strcmp(t, "callable")) *out = v->k == V_FUNC || v->k == V_METHOD || v->k == V_MACRO;
    else if (!strcmp(t, "undefined")) *out = v->k == V_UNDEF;
    else if (!strcmp(t, "none")) *out = j && json_is_null(j);
    else if (!strcmp(t, "string")) *out = j && json_is_string(j);
    else if (!strcmp(t, "number")) *out = j && (json_is_number(j) || json_is_boolean(j)); /* Python's bool is an int */
    else if (!strcmp(t, "integer")) *out = j && json_is_integer(j);
    else if (!strcmp(t, "float")) *out = j && json_is_real(j);
    else if (!strcmp(t, "boolean")) *out = j && json_is_boolean(j);
    else if (!strcmp(t, "true")) *out = j && json_is_true(j);
    else if (!strcmp(t, "false")) *out = j && json_is_false(j);
    else if (!strcmp(t, "mapping")) *out = (j && json_is_object(j)) || v->k == V_NS;
    else if (!strcmp(t, "iterable") || !strcmp(t, "sequence")) /* Jinja's Undefined iterates, empty */
        *out = v->k == V_UNDEF || (j && (json_is_array(j) || json_is_object(j) || json_is_string(j)));
    else if (!strcmp(t, "lower") || !strcmp(t, "upper")) { /* Jinja: str(v).islower() / .isupper() */
        json_t *str = NULL;
        if (!(j && json_is_string(j))) TP_CHECK(ct_to_string(v, &str));
        const char *s = json_string_value(str ? str : j);
        const size_t n = json_string_length(str ? str : j);
        char *lo = NULL, *up = NULL;
        size_t nl = 0, nu = 0;
        tp_status st = tp_utf8_case(s, n, 'L', &lo, &nl);
        if (st == TP_OK) st = tp_utf8_case(s, n, 'u', &up, &nu);
        /* a cased character, and none of the other case: the string is its own lower (upper) case
         * and not its own upper (lower) case */
        const int is_lo = nl == n && !memcmp(lo, s, n), is_up = nu == n && !memcmp(up, s, n);
        *out = t[0] == 'l' ? is_lo && !is_up : is_up && !is_lo;
        free(lo);
        free(up);
        json_decref(str);
        TP_CHECK(st);
    } else if (!strcmp(t, "even") || !strcmp(t, "odd") || !strcmp(t, "divisibleby")) {
        if (!is_int(v)) return ct_rt_error("chat template: test %s needs an integer", t);
        int64_t d = !strcmp(t, "divisibleby") ? (x && is_int(x) ? inum(x) : 0) : 2;
        if (d == 0) return ct_rt_error("chat template: divisibleby needs a non-zero integer%s", "");
        int64_t r = inum(v) % d;
        *out = t[0] == 'o' ? r != 0 : r == 0;
    } else if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==") || !strcmp(t, "sameas") ||
               !strcmp(t, "ne") || !strcmp(t, "!=")) {
        if (!x) return ct_rt_error("chat template: test %s needs an argument", t);
        *out = ct_py_eq(v, x) != (t[0] == 'n' || t[0] == '!');
    } else if (!strcmp(t, "gt") || !strcmp(t, ">") || !strcmp(t, "greaterthan") || !strcmp(t, "ge") ||
               !strcmp(t, ">=") || !strcmp(t, "lt") || !strcmp(t, "<") || !strcmp(t, "lessthan") ||
               !strcmp(t, "le") || !strcmp(t, "<=")) { /* Jinja's comparison tests and their operator names */
        if (!x) return ct_rt_error("chat template: test %s needs an argument", t);
        int c3;
        TP_CHECK(ct_py_cmp(v, x, &c3));
        const int greater = t[0] == 'g' || t[0] == '>', or_equal = !strcmp(t, "ge") || !strcmp(t, "le") || t[1] == '=';
        *out = greater ? (or_equal ? c3 >= 0 : c3 > 0) : (or_equal ? c3 <= 0 : c3 < 0);
    } else if (!strcmp(t, "in")) {
        if (!x) return ct_rt_error("chat template: test in needs an argument%s", "");
        TP_CHECK(ct_py_in(v, x, out));
    } else {
        return ct_rt_error("chat template: unknown test %s", t);
    }
    return TP_OK;
}
