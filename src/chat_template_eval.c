/*
 * chat_template_eval.c: renders a chat-template syntax tree over jansson values with
 * Python/Jinja semantics (truthiness, str() and repr(), == across int and float, slicing
 * by code point, loop variables, namespace()) and the filters, tests, functions and
 * methods real chat templates use. tojson is transformers' json.dumps(ensure_ascii=False).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template_internal.h"
#include "unicode.h"

#define MAX_OUTPUT ((size_t)256 << 20)
#define MAX_STEPS 50000000L
#define MAX_RANGE 1000000

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

// ----------------------------------------------------------------------------
// values

enum vkind { V_UNDEF, V_JSON, V_NS, V_FUNC, V_METHOD, V_MACRO };

typedef struct val {
    enum vkind k;
    json_t *j;        /* owned reference (V_JSON, V_NS: the namespace object, V_METHOD: receiver) */
    const char *name; /* V_FUNC / V_METHOD / V_MACRO */
    const ct_node *macro; /* V_MACRO: its definition */
    size_t scope;         /* V_MACRO: the frame it was defined in, whose names its body reads */
} val;

static void vfree(val *v)
{
    json_decref(v->j);
    memset(v, 0, sizeof *v);
}

static val vjson(json_t *j) { return (val){.k = j ? V_JSON : V_UNDEF, .j = j}; } /* steals j */
static val vcopy(const val *v)
{
    val r = *v;
    json_incref(r.j);
    return r;
}

typedef struct var {
    char *name;
    val v;
} var;

/* A scope. Names not found in it are looked up in its parent's: the frame below it, but for
 * a macro's call the frame where the macro was defined (Jinja's macros see the names of
 * where they were written, as they are at the call, not the caller's). */
typedef struct frame {
    var *v;
    size_t n, cap;
    size_t parent; /* index of the next frame to look in; NO_PARENT: the globals next */
} frame;

#define NO_PARENT SIZE_MAX
#define MAX_CALL_DEPTH 100

typedef struct ctx {
    json_t *globals;
    frame *frames;
    size_t nf, capf;
    char *out;
    size_t len, cap;
    int brk, cont;
    long steps;
    int calls;   /* macro calls under way */
    int nesting; /* eval and exec under way */
} ctx;

static tp_status rt_error(const char *fmt, const char *a)
{
    return tp_error(TP_ERR_INVALID_ARG, fmt, a);
}

static tp_status put(ctx *c, const char *s, size_t n)
{
    if (c->len + n + 1 > c->cap) {
        if (c->len + n > MAX_OUTPUT) return tp_error(TP_ERR_INVALID_ARG, "chat template: output larger than 256 MiB");
        size_t cap = c->cap ? c->cap : 256;
        while (cap < c->len + n + 1) cap *= 2;
        char *b = realloc(c->out, cap);
        if (!b) return tp_error(TP_ERR_OOM, "out of memory");
        c->out = b;
        c->cap = cap;
    }
    memcpy(c->out + c->len, s, n);
    c->len += n;
    c->out[c->len] = '\0';
    return TP_OK;
}

static tp_status push_scope(ctx *c, size_t parent)
{
    if (c->nf == c->capf) {
        size_t cap = c->capf ? c->capf * 2 : 8;
        frame *f = realloc(c->frames, cap * sizeof *f);
        if (!f) return tp_error(TP_ERR_OOM, "out of memory");
        c->frames = f;
        c->capf = cap;
    }
    c->frames[c->nf++] = (frame){.parent = parent};
    return TP_OK;
}

static tp_status push_frame(ctx *c) { return push_scope(c, c->nf ? c->nf - 1 : NO_PARENT); }

static void pop_frame(ctx *c)
{
    frame *f = &c->frames[--c->nf];
    for (size_t i = 0; i < f->n; i++) {
        free(f->v[i].name);
        vfree(&f->v[i].v);
    }
    free(f->v);
}

/* Set name in the innermost frame (steals v). */
static tp_status set_var(ctx *c, const char *name, val v)
{
    frame *f = &c->frames[c->nf - 1];
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->v[i].name, name) == 0) {
            vfree(&f->v[i].v);
            f->v[i].v = v;
            return TP_OK;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        var *nv = realloc(f->v, cap * sizeof *nv);
        if (!nv) {
            vfree(&v);
            return tp_error(TP_ERR_OOM, "out of memory");
        }
        f->v = nv;
        f->cap = cap;
    }
    f->v[f->n].name = strdup(name);
    if (!f->v[f->n].name) {
        vfree(&v);
        return tp_error(TP_ERR_OOM, "out of memory");
    }
    f->v[f->n++].v = v;
    return TP_OK;
}

static val lookup(ctx *c, const char *name)
{
    for (size_t k = c->nf ? c->nf - 1 : NO_PARENT; k != NO_PARENT; k = c->frames[k].parent)
        for (size_t i = 0; i < c->frames[k].n; i++)
            if (strcmp(c->frames[k].v[i].name, name) == 0) return vcopy(&c->frames[k].v[i].v);
    json_t *g = json_object_get(c->globals, name);
    if (g) return vjson(json_incref(g));
    if (ct_known_function(name)) return (val){.k = V_FUNC, .name = name};
    return (val){.k = V_UNDEF};
}

static int truthy(const val *v)
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

static int is_str(const val *v) { return v->k == V_JSON && json_is_string(v->j); }
static int is_num(const val *v) { return v->k == V_JSON && (json_is_number(v->j) || json_is_boolean(v->j)); }
static int is_int(const val *v) { return v->k == V_JSON && (json_is_integer(v->j) || json_is_boolean(v->j)); }
static double num(const val *v)
{
    return json_is_boolean(v->j) ? json_is_true(v->j) : json_number_value(v->j);
}
static int64_t inum(const val *v) { return json_is_boolean(v->j) ? json_is_true(v->j) : json_integer_value(v->j); }

/* str(v) as a new JSON string value. */
static tp_status to_string(const val *v, json_t **out)
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

typedef struct cps {
    size_t *off; /* byte offset of each character, plus the end */
    size_t n;
} cps;

static tp_status cps_of(const char *s, size_t len, cps *c)
{
    c->off = malloc((len + 1) * sizeof *c->off);
    if (!c->off) return tp_error(TP_ERR_OOM, "out of memory");
    c->n = 0;
    for (size_t i = 0; i < len; i += (size_t)tp_utf8_len((uint8_t)s[i])) c->off[c->n++] = i;
    c->off[c->n] = len;
    return TP_OK;
}

static int is_space_cp(const char *s, size_t n, size_t *k)
{
    uint32_t cp;
    int l = tp_utf8_next((const uint8_t *)s, n, &cp);
    if (l <= 0) return 0;
    *k = (size_t)l;
    return tp_uc_is_py_space(cp);
}

/* Python str.strip/lstrip/rstrip, with chars (NULL: whitespace). */
static json_t *py_strip(const char *s, size_t n, const char *chars, size_t cn, int left, int right)
{
    size_t a = 0, b = n;
    while (left && a < b) {
        size_t k = (size_t)tp_utf8_len((uint8_t)s[a]);
        int hit = chars ? memmem(chars, cn, s + a, k) != NULL : is_space_cp(s + a, b - a, &k);
        if (!hit) break;
        a += k;
    }
    while (right && b > a) {
        size_t st = b - 1, k;
        while (st > a && ((uint8_t)s[st] & 0xC0) == 0x80) st--;
        k = b - st;
        int hit = chars ? memmem(chars, cn, s + st, k) != NULL : is_space_cp(s + st, k, &k);
        if (!hit) break;
        b = st;
    }
    return json_stringn_nocheck(s + a, b - a);
}

// ----------------------------------------------------------------------------
// comparisons and arithmetic

static int py_eq(const val *a, const val *b)
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
            if (!py_eq(&p, &q)) return 0;
        }
        return 1;
    }
    if (json_is_object(x)) { /* {'a': 1} == {'a': 1.0}, as Python */
        if (json_object_size(x) != json_object_size(y)) return 0;
        for (void *it = json_object_iter(x); it; it = json_object_iter_next(x, it)) {
            json_t *w = json_object_getn(y, json_object_iter_key(it), json_object_iter_key_len(it));
            val p = {.k = V_JSON, .j = json_object_iter_value(it)}, q = {.k = V_JSON, .j = w};
            if (!w || !py_eq(&p, &q)) return 0;
        }
        return 1;
    }
    return json_equal(x, y);
}

static tp_status py_cmp(const val *a, const val *b, int *out)
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
            if (py_eq(&p, &q)) continue;
            return py_cmp(&p, &q, out);
        }
        *out = na < nb ? -1 : na > nb;
        return TP_OK;
    }
    return rt_error("chat template: cannot order values of different or unordered types%s", "");
}

static tp_status py_in(const val *item, const val *cont, int *out)
{
    if (cont->k == V_UNDEF) { /* Jinja's Undefined holds nothing */
        *out = 0;
        return TP_OK;
    }
    if (is_str(cont)) {
        if (!is_str(item)) return rt_error("chat template: 'in <string>' needs a string on the left%s", "");
        *out = json_string_length(item->j) == 0 ||
               memmem(json_string_value(cont->j), json_string_length(cont->j), json_string_value(item->j),
                      json_string_length(item->j)) != NULL;
        return TP_OK;
    }
    if (cont->k == V_JSON && json_is_array(cont->j)) {
        *out = 0;
        for (size_t i = 0; i < json_array_size(cont->j) && !*out; i++) {
            val e = {.k = V_JSON, .j = json_array_get(cont->j, i)};
            *out = py_eq(item, &e);
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
    return rt_error("chat template: 'in' needs a string, list or mapping on the right%s", "");
}

static tp_status arith(const char *op, const val *a, const val *b, val *out)
{
    if (!strcmp(op, "~")) {
        json_t *x, *y;
        TP_CHECK(to_string(a, &x));
        tp_status st = to_string(b, &y);
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
    if (!strcmp(op, "*") && is_int(a) && !is_num(b)) return arith(op, b, a, out); /* 3 * 'ab' */
    if (!strcmp(op, "*") && a->k == V_JSON && json_is_array(a->j) && is_int(b)) {
        const int64_t k = inum(b);
        const size_t len = json_array_size(a->j);
        if (k > 0 && len > 0 && (uint64_t)k > MAX_RANGE / len)
            return rt_error("chat template: list repetition too large%s", "");
        json_t *r = json_array();
        for (int64_t i = 0; r && i < k; i++) json_array_extend(r, a->j);
        *out = vjson(r);
        return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(op, "*") && is_str(a) && is_int(b)) {
        int64_t k = inum(b);
        size_t sl = json_string_length(a->j);
        if (k > 0 && sl > 0 && (uint64_t)k > MAX_OUTPUT / sl)
            return rt_error("chat template: string repetition too large%s", "");
        sbuf s = {0};
        sb_put(&s, "", 0);
        for (int64_t i = 0; i < k; i++) sb_put(&s, json_string_value(a->j), json_string_length(a->j));
        *out = vjson(s.oom ? NULL : json_stringn_nocheck(s.s, s.len));
        free(s.s);
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!is_num(a) || !is_num(b))
        return rt_error("chat template: operator %s needs numbers (or strings/lists for +); use ~ to join text", op);
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
            if (y == 0) return rt_error("chat template: division by zero%s", "");
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
        if (!ok) return rt_error("chat template: integer overflow in %s", op);
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
        if (y == 0) return rt_error("chat template: division by zero%s", "");
        r = !strcmp(op, "/") ? x / y : !strcmp(op, "//") ? floor(x / y) : x - floor(x / y) * y;
    }
    *out = vjson(json_real(r));
    return TP_OK;
}

// ----------------------------------------------------------------------------
// expressions

static tp_status eval(ctx *c, const ct_node *n, val *out);

static tp_status get_item(const val *obj, const val *key, val *out)
{
    *out = (val){.k = V_UNDEF};
    if (obj->k == V_UNDEF) return rt_error("chat template: cannot index an undefined value%s", "");
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
        TP_CHECK(cps_of(json_string_value(j), json_string_length(j), &cp));
        int64_t n = (int64_t)cp.n;
        if (i < 0) i += n;
        if (i >= 0 && i < n)
            *out = vjson(json_stringn_nocheck(json_string_value(j) + cp.off[i], cp.off[i + 1] - cp.off[i]));
        free(cp.off);
    }
    return TP_OK;
}

static tp_status get_attr(const val *obj, const char *name, val *out)
{
    *out = (val){.k = V_UNDEF};
    if (obj->k == V_UNDEF) return rt_error("chat template: undefined value has no attribute '%s'", name);
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
    tp_status st = get_item(obj, &key, out);
    vfree(&key);
    return st;
}

static tp_status do_slice(const val *obj, const val *parts, val *out)
{
    int64_t idx[3] = {0, 0, 1};
    int has[3];
    for (int k = 0; k < 3; k++) {
        has[k] = parts[k].k == V_JSON && !json_is_null(parts[k].j);
        if (has[k] && !is_int(&parts[k])) return rt_error("chat template: slice bounds must be integers%s", "");
        if (has[k]) idx[k] = inum(&parts[k]);
    }
    if (idx[2] == 0) return rt_error("chat template: slice step cannot be zero%s", "");
    int str = is_str(obj);
    if (!str && !(obj->k == V_JSON && json_is_array(obj->j)))
        return rt_error("chat template: only strings and lists can be sliced%s", "");
    cps cp = {0};
    int64_t n;
    if (str) {
        TP_CHECK(cps_of(json_string_value(obj->j), json_string_length(obj->j), &cp));
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

/* Evaluated arguments of a call/filter/test node: kids[first..] and keywords. */
#define MAX_ARGS 16

typedef struct args {
    val pos[MAX_ARGS];
    size_t n;
    val kw[MAX_ARGS];
    const char *kwname[MAX_ARGS];
    size_t nk;
} args;

static void args_free(args *a)
{
    for (size_t i = 0; i < a->n; i++) vfree(&a->pos[i]);
    for (size_t i = 0; i < a->nk; i++) vfree(&a->kw[i]);
}

static tp_status eval_args(ctx *c, const ct_node *n, size_t first, args *a)
{
    memset(a, 0, sizeof *a);
    if (n->n_kids - first > MAX_ARGS || n->n_names > MAX_ARGS)
        return rt_error("chat template: more than 16 arguments in a call%s", "");
    for (size_t i = first; i < n->n_kids; i++) {
        TP_CHECK(eval(c, n->kids[i], &a->pos[a->n]));
        a->n++;
    }
    for (size_t i = 0; i < n->n_names; i++) {
        a->kwname[a->nk] = n->names[i];
        TP_CHECK(eval(c, n->kw[i], &a->kw[a->nk]));
        a->nk++;
    }
    return TP_OK;
}

/* Keyword argument name; NULL if absent. */
static const val *kwarg(const args *a, const char *name)
{
    for (size_t k = 0; name && k < a->nk; k++)
        if (strcmp(a->kwname[k], name) == 0) return &a->kw[k];
    return NULL;
}

/* Positional argument i, or keyword name; NULL if absent. */
static const val *arg(const args *a, size_t i, const char *name)
{
    return i < a->n ? &a->pos[i] : kwarg(a, name);
}

static tp_status need_str(const val *v, const char *what)
{
    return v && is_str(v) ? TP_OK : rt_error("chat template: %s needs a string argument", what);
}

static tp_status run_test(ctx *c, const char *name, const val *v, const args *a, int *out);

static tp_status call_method(const val *self, const char *m, const args *a, val *out)
{
    json_t *j = self->j;
    if (json_is_object(j)) {
        if (!strcmp(m, "get")) {
            const val *k = arg(a, 0, "key"), *d = arg(a, 1, "default");
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
        return rt_error("chat template: %s() with start or end is not supported", m);
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        const val *ch = arg(a, 0, "chars");
        int has = ch && is_str(ch);
        *out = vjson(py_strip(s, n, has ? json_string_value(ch->j) : NULL, has ? json_string_length(ch->j) : 0,
                              m[0] != 'r', m[0] != 'l'));
    } else if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        const val *p = arg(a, 0, "prefix");
        int hit = 0;
        json_t *list = p && p->k == V_JSON && json_is_array(p->j) ? p->j : NULL;
        for (size_t i = 0; i < (list ? json_array_size(list) : 1) && !hit; i++) {
            json_t *q = list ? json_array_get(list, i) : p ? p->j : NULL;
            if (!json_is_string(q)) return rt_error("chat template: %s needs a string argument", m);
            size_t ql = json_string_length(q);
            hit = ql <= n && memcmp(m[0] == 's' ? s : s + n - ql, json_string_value(q), ql) == 0;
        }
        *out = vjson(json_boolean(hit));
    } else if (!strcmp(m, "split")) {
        const val *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
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
            return rt_error("chat template: split() separator must be a non-empty string%s", "");
        } else {
            size_t i = 0, k;
            while (i < n) {
                while (i < n && is_space_cp(s + i, n - i, &k)) i += k;
                if (i >= n) break;
                size_t st = i;
                if (maxsplit == 0) { /* Python keeps the rest as it is, its trailing whitespace too */
                    json_array_append_new(r, json_stringn_nocheck(s + st, n - st));
                    break;
                }
                while (i < n && !is_space_cp(s + i, n - i, &k)) i += (size_t)tp_utf8_len((uint8_t)s[i]);
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
        const val *o = arg(a, 0, "old"), *w = arg(a, 1, "new"), *cnt = arg(a, 2, "count");
        TP_CHECK(need_str(o, "replace()"));
        TP_CHECK(need_str(w, "replace()"));
        int64_t left = cnt && is_int(cnt) ? inum(cnt) : -1;
        const char *os = json_string_value(o->j);
        size_t ol = json_string_length(o->j), pos = 0;
        sbuf b = {0};
        sb_put(&b, "", 0);
        if (ol == 0) return rt_error("chat template: replace() of an empty string is not supported%s", "");
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
        const val *q = arg(a, 0, "sub");
        TP_CHECK(need_str(q, "find()"));
        const char *f = memmem(s, n, json_string_value(q->j), json_string_length(q->j));
        int64_t r = -1;
        if (f) {
            r = 0;
            for (const char *p = s; p < f; p += tp_utf8_len((uint8_t)*p)) r++;
        }
        *out = vjson(json_integer(r));
    } else if (!strcmp(m, "join")) {
        const val *l = arg(a, 0, "iterable");
        if (!l || l->k != V_JSON || !json_is_array(l->j)) return rt_error("chat template: join() needs a list%s", "");
        sbuf b = {0};
        sb_put(&b, "", 0);
        for (size_t i = 0; i < json_array_size(l->j); i++) {
            json_t *e = json_array_get(l->j, i);
            if (!json_is_string(e)) {
                free(b.s);
                return rt_error("chat template: str.join() needs strings%s", "");
            }
            if (i) sb_put(&b, s, n);
            sb_put(&b, json_string_value(e), json_string_length(e));
        }
        *out = vjson(b.oom ? NULL : json_stringn_nocheck(b.s, b.len));
        free(b.s);
    } else if (!strcmp(m, "count")) { /* non-overlapping; "" counts every gap */
        const val *q = arg(a, 0, "sub");
        TP_CHECK(need_str(q, "count()"));
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
        const val *q = arg(a, 0, "sub");
        TP_CHECK(need_str(q, "find()"));
        const char *qs = json_string_value(q->j), *hit = NULL;
        const size_t ql = json_string_length(q->j);
        for (const char *p = s, *e = s + n, *f; p <= e && (f = memmem(p, (size_t)(e - p), qs, ql)); p = f + 1) {
            hit = f;
            if (m[0] == 'i') break;
        }
        if (!hit && m[1] != 'f') return rt_error("chat template: %s(): substring not found", m);
        int64_t r = -1;
        if (hit) {
            r = 0;
            for (const char *p = s; p < hit; p += tp_utf8_len((uint8_t)*p)) r++;
        }
        *out = vjson(json_integer(r));
    } else if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        const val *q = arg(a, 0, NULL);
        TP_CHECK(need_str(q, m));
        const size_t ql = json_string_length(q->j);
        const int pre = m[6] == 'p';
        const int has = ql <= n && !memcmp(pre ? s : s + n - ql, json_string_value(q->j), ql);
        *out = vjson(json_stringn_nocheck(has && pre ? s + ql : s, has ? n - ql : n));
    } else if (!strcmp(m, "zfill") || !strcmp(m, "ljust") || !strcmp(m, "rjust") || !strcmp(m, "center")) {
        const val *w = arg(a, 0, "width"), *fill = arg(a, 1, "fillchar");
        if (!w || !is_int(w)) return rt_error("chat template: %s() needs an integer width", m);
        if (inum(w) > (int64_t)(MAX_OUTPUT / 4)) return rt_error("chat template: %s() width too large", m);
        if (fill && !(is_str(fill) && json_string_length(fill->j) == (size_t)tp_utf8_len((uint8_t)*json_string_value(fill->j))))
            return rt_error("chat template: %s()'s fill character must be one character", m);
        *out = vjson(py_pad(s, n, inum(w), m[0] == 'z' ? 'z' : m[0] == 'l' ? 'l' : m[0] == 'r' ? 'r' : 'c',
                            fill ? json_string_value(fill->j) : " ", fill ? json_string_length(fill->j) : 1));
    } else if (!strcmp(m, "splitlines")) {
        const val *keep = arg(a, 0, "keepends");
        *out = vjson(py_splitlines(s, n, keep && truthy(keep)));
    } else {
        return rt_error("chat template: unknown method %s", m);
    }
    return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
}

static tp_status call_function(ctx *c, const char *f, const args *a, val *out)
{
    if (!strcmp(f, "raise_exception")) {
        const val *m = arg(a, 0, NULL);
        json_t *s = NULL;
        if (m) TP_CHECK(to_string(m, &s));
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
            if (!is_int(&a->pos[i]) || i > 2) return rt_error("chat template: range() takes 1-3 integers%s", "");
            v[i] = inum(&a->pos[i]);
        }
        int64_t start = a->n >= 2 ? v[0] : 0, stop = a->n >= 2 ? v[1] : v[0], step = a->n == 3 ? v[2] : 1;
        if (step == 0) return rt_error("chat template: range() step cannot be zero%s", "");
        json_t *r = json_array();
        int64_t count = 0;
        for (int64_t i = start; r && (step > 0 ? i < stop : i > stop); i += step) {
            if (++count > MAX_RANGE) {
                json_decref(r);
                return rt_error("chat template: range() longer than a million%s", "");
            }
            json_array_append_new(r, json_integer(i));
        }
        *out = vjson(r);
        return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(f, "strftime_now")) {
        const val *fmt = arg(a, 0, NULL);
        TP_CHECK(need_str(fmt, "strftime_now()"));
        char buf[256];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, json_string_value(fmt->j), &tm);
        *out = vjson(json_stringn(buf, n));
        return TP_OK;
    }
    (void)c;
    return rt_error("chat template: unknown function %s", f);
}

/* select/reject/selectattr/rejectattr/map over a list. */
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
            st = rt_error("chat template: attribute name too long in \"%.40s\"", path);
            break;
        }
        memcpy(part, path, n);
        part[n] = '\0';
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= part[i] >= '0' && part[i] <= '9';
        val next = {0};
        if (digits) {
            val key = vjson(json_integer(strtoll(part, NULL, 10)));
            st = get_item(&cur, &key, &next);
            vfree(&key);
        } else st = get_attr(&cur, part, &next);
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

static tp_status run_filter(ctx *c, const char *f, val *in, const args *a, val *out);

static tp_status filter_seq(ctx *c, const char *f, const val *in, const args *a, val *out)
{
    if (in->k == V_UNDEF) { /* Jinja's Undefined iterates as nothing */
        *out = vjson(json_array());
        return out->j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (in->k != V_JSON || !json_is_array(in->j)) return rt_error("chat template: filter %s needs a list", f);
    int attr = strstr(f, "attr") != NULL, is_map = !strcmp(f, "map");
    const val *fname = is_map ? arg(a, 0, NULL) : NULL;
    if (fname) { /* map('upper'), map('replace', 'a', 'b'): a filter on each item */
        if (!is_str(fname) || !ct_known_filter(json_string_value(fname->j)))
            return rt_error("chat template: map's filter %s is not supported",
                            is_str(fname) ? json_string_value(fname->j) : "(not a name)");
        args fargs = {0};
        for (size_t i = 1; i < a->n; i++) fargs.pos[fargs.n++] = a->pos[i];
        for (size_t i = 0; i < a->nk; i++) fargs.kw[fargs.nk] = a->kw[i], fargs.kwname[fargs.nk++] = a->kwname[i];
        json_t *r = json_array();
        tp_status st = r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
        for (size_t i = 0; st == TP_OK && i < json_array_size(in->j); i++) {
            val e = {.k = V_JSON, .j = json_incref(json_array_get(in->j, i))}, o = {0};
            st = run_filter(c, json_string_value(fname->j), &e, &fargs, &o);
            if (st == TP_OK) json_array_append(r, o.k == V_JSON ? o.j : json_null());
            vfree(&o);
            vfree(&e);
        }
        if (st != TP_OK) json_decref(r);
        else *out = vjson(r);
        return st; /* fargs borrows a's values: not freed */
    }
    const val *an = is_map ? kwarg(a, "attribute") : attr ? arg(a, 0, NULL) : NULL;
    const val *dflt = is_map ? kwarg(a, "default") : NULL;
    if ((attr || is_map) && (!an || !is_str(an)))
        return rt_error("chat template: %s needs an attribute name (map(attribute=...))", f);
    const val *tn = arg(a, attr ? 1 : 0, NULL);
    if (!is_map && tn && !is_str(tn)) return rt_error("chat template: %s needs a test name", f);
    if (tn && !is_map && !ct_known_test(json_string_value(tn->j)))
        return rt_error("chat template: test %s is not supported", json_string_value(tn->j));
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
            int ok = truthy(&subject);
            if (tn) st = run_test(c, json_string_value(tn->j), &subject, &targs, &ok);
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
        TP_CHECK(cps_of(json_string_value(v->j), json_string_length(v->j), &cp));
        free(cp.off);
        *n = (int64_t)cp.n;
    } else if (v->k == V_JSON && json_is_array(v->j)) *n = (int64_t)json_array_size(v->j);
    else if ((v->k == V_JSON || v->k == V_NS) && json_is_object(v->j)) *n = (int64_t)json_object_size(v->j);
    else return rt_error("chat template: length of a value that has none%s", "");
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
        return rt_error("chat template: attribute= must be a name%s", "");
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
        TP_CHECK(py_cmp(&v[j].key, &v[i].key, &r)); /* take the right one only if it goes strictly first */
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
    const val *cs = arg(a, dict ? 0 : !strcmp(f, "sort") ? 1 : 0, "case_sensitive");
    const val *attribute = dict ? NULL : arg(a, !strcmp(f, "sort") ? 2 : 1, "attribute");
    const val *rev = arg(a, dict ? 2 : 0, "reverse"), *by = dict ? arg(a, 1, "by") : NULL;
    if (!strcmp(f, "unique") || !strcmp(f, "min") || !strcmp(f, "max")) rev = NULL;
    const int case_sensitive = cs && truthy(cs), reverse = rev && truthy(rev);
    int by_value = 0;
    if (by && !(is_str(by) && (!strcmp(json_string_value(by->j), "key") || !strcmp(json_string_value(by->j), "value"))))
        return rt_error("chat template: dictsort's by must be 'key' or 'value'%s", "");
    if (by) by_value = json_string_value(by->j)[0] == 'v';
    json_t *items = NULL;
    if (dict) {
        if (in->k != V_JSON || !json_is_object(in->j)) return rt_error("chat template: dictsort needs a mapping%s", "");
        items = json_array();
        for (void *it = json_object_iter(in->j); items && it; it = json_object_iter_next(in->j, it))
            json_array_append_new(items, json_pack("[oO]", ct_key_value(json_object_iter_key(it),
                                                                         json_object_iter_key_len(it)),
                                                   json_object_iter_value(it)));
    } else if (in->k == V_JSON && json_is_array(in->j)) {
        items = json_incref(in->j);
    } else if (is_str(in) || (in->k == V_JSON && json_is_object(in->j))) {
        val l = {0};
        TP_CHECK(run_filter(NULL, "list", (val *)in, &(args){0}, &l)); /* characters; a mapping's keys */
        items = l.j;
    } else {
        return rt_error("chat template: filter %s needs a list", f);
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
            for (size_t k = 0; k < i && !seen; k++) seen = py_eq(&v[k].key, &v[i].key);
            if (!seen) json_array_append(r, v[i].item);
        }
    } else if (st == TP_OK) { /* min, max: the first extreme item; none of an empty list */
        size_t best = 0;
        for (size_t i = 1; st == TP_OK && i < n; i++) {
            int c = 0;
            st = py_cmp(&v[i].key, &v[best].key, &c);
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

static tp_status run_filter(ctx *c, const char *f, val *in, const args *a, val *out)
{
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const val *d = arg(a, 0, "default_value"), *b = arg(a, 1, "boolean");
        int use = in->k == V_UNDEF || (b && truthy(b) && !truthy(in));
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
            tp_status st = empty.j ? run_filter(c, f, &empty, a, out) : tp_error(TP_ERR_OOM, "out of memory");
            vfree(&empty);
            return st;
        }
        else return rt_error("chat template: filter %s applied to an undefined value", f);
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
        TP_CHECK(to_string(in, &s));
        *out = vjson(s);
        return TP_OK;
    }
    if (!strcmp(f, "tojson")) { /* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        const val *asc = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"),
                  *srt = arg(a, 3, "sort_keys");
        if (in->k != V_JSON && in->k != V_NS) return rt_error("chat template: tojson of a non-JSON value%s", "");
        static const char spaces[] = "                                                                ";
        json_opts o = {asc && truthy(asc), NULL, 0, ", ", ": ", srt && truthy(srt)};
        if (ind && is_int(ind)) { /* n spaces a level (at most 64) */
            const int64_t k = inum(ind);
            o.indent = spaces;
            o.indent_len = k <= 0 ? 0 : k > 64 ? 64 : (size_t)k;
        } else if (ind && is_str(ind)) {
            o.indent = json_string_value(ind->j);
            o.indent_len = json_string_length(ind->j);
        } else if (ind && !(ind->k == V_JSON && json_is_null(ind->j)))
            return rt_error("chat template: tojson's indent must be an integer, a string or none%s", "");
        if (o.indent) o.item_sep = ",";
        if (sep && sep->k == V_JSON && json_is_array(sep->j) && json_array_size(sep->j) == 2 &&
            json_is_string(json_array_get(sep->j, 0)) && json_is_string(json_array_get(sep->j, 1))) {
            o.item_sep = json_string_value(json_array_get(sep->j, 0));
            o.key_sep = json_string_value(json_array_get(sep->j, 1));
        } else if (sep && !(sep->k == V_JSON && json_is_null(sep->j)))
            return rt_error("chat template: tojson's separators must be a pair of strings%s", "");
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
        const val *attribute = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
        if (in->k != V_JSON || !json_is_array(in->j)) return rt_error("chat template: sum needs a list%s", "");
        val acc = start ? vcopy(start) : vjson(json_integer(0));
        tp_status st = TP_OK;
        for (size_t i = 0; st == TP_OK && i < json_array_size(in->j); i++) {
            val e = {.k = V_JSON, .j = json_array_get(in->j, i)}, x = {0}, next = {0};
            st = attribute && is_str(attribute) ? attr_path(&e, json_string_value(attribute->j), NULL, &x)
                                                : (x = vcopy(&e), TP_OK);
            if (st == TP_OK) st = arith("+", &acc, &x, &next);
            vfree(&x);
            vfree(&acc);
            acc = next;
        }
        if (st != TP_OK) vfree(&acc);
        else *out = acc;
        return st;
    }
    if (!strcmp(f, "round")) { /* round(value, precision=0, method='common'|'ceil'|'floor') */
        const val *pr = arg(a, 0, "precision"), *me = arg(a, 1, "method");
        const int64_t p = pr && is_int(pr) ? inum(pr) : 0;
        const char *method = me && is_str(me) ? json_string_value(me->j) : "common";
        if (!is_num(in)) return rt_error("chat template: round needs a number%s", "");
        if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
            return rt_error("chat template: round's method must be common, ceil or floor%s", "");
        if (!strcmp(method, "common") && is_int(in)) { /* round(3, 0) is 3; round(25, -1) 20 (to even) */
            int64_t x = inum(in), r = x;
            if (p < 0 && p >= -18) {
                int64_t m = 1;
                for (int64_t i = 0; i < -p; i++) m *= 10;
                int64_t q = x / m, rem = x % m;
                if (rem < 0) rem += m, q--; /* floor division */
                if (2 * rem > m || (2 * rem == m && (q & 1))) q++;
                if (__builtin_mul_overflow(q, m, &r)) return rt_error("chat template: round() overflows%s", "");
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
        if (a->n && a->nk) return rt_error("chat template: format takes positional or keyword arguments, not both%s", "");
        json_t *args_j = a->nk ? json_object() : json_array();
        for (size_t i = 0; args_j && i < a->n; i++) /* str(Undefined) is "" */
            json_array_append_new(args_j, a->pos[i].k == V_JSON ? json_incref(a->pos[i].j) : json_string(""));
        for (size_t i = 0; args_j && i < a->nk; i++)
            json_object_set(args_j, a->kwname[i], a->kw[i].k == V_JSON ? a->kw[i].j : json_null());
        json_t *str = NULL, *r = NULL;
        tp_status st = args_j ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
        if (st == TP_OK && !is_str(in)) st = to_string(in, &str);
        if (st == TP_OK)
            st = py_percent(json_string_value(str ? str : in->j), json_string_length(str ? str : in->j), args_j, &r);
        json_decref(args_j);
        json_decref(str);
        if (st == TP_OK) *out = vjson(r);
        return st;
    }
    if (!strcmp(f, "indent") || !strcmp(f, "center")) {
        json_t *str = NULL, *r = NULL;
        if (!is_str(in)) TP_CHECK(to_string(in, &str));
        const char *sv = json_string_value(str ? str : in->j);
        const size_t sn = json_string_length(str ? str : in->j);
        tp_status st = TP_OK;
        if (f[0] == 'i') { /* indent(width=4, first=False, blank=False); width may be a string */
            const val *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
            char *spaces = NULL;
            const char *ind = "    ";
            size_t il = 4;
            if (w && is_str(w)) ind = json_string_value(w->j), il = json_string_length(w->j);
            else if (w && is_int(w) && inum(w) > 4096) st = rt_error("chat template: indent's width over 4096%s", "");
            else if (w && is_int(w)) {
                il = inum(w) < 0 ? 0 : (size_t)inum(w);
                spaces = malloc(il + 1);
                if (spaces) memset(spaces, ' ', il);
                ind = spaces;
                if (!spaces) st = tp_error(TP_ERR_OOM, "out of memory");
            } else if (w) st = rt_error("chat template: indent's width must be a number or a string%s", "");
            if (st == TP_OK) r = py_indent(sv, sn, ind, il, first && truthy(first), blank && truthy(blank));
            free(spaces);
        } else if (f[0] == 'c') {
            const val *w = arg(a, 0, "width");
            const int64_t width = w && is_int(w) ? inum(w) : 80;
            if (w && !is_int(w)) st = rt_error("chat template: center's width must be an integer%s", "");
            else if (width > (int64_t)(MAX_OUTPUT / 4)) st = rt_error("chat template: center's width too large%s", "");
            else r = py_pad(sv, sn, width, 'c', " ", 1);
        }
        json_decref(str);
        TP_CHECK(st);
        *out = vjson(r);
        return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (!strcmp(f, "items")) {
        if (in->k != V_JSON || !json_is_object(in->j)) return rt_error("chat template: items needs a mapping%s", "");
        return call_method(in, "items", a, out);
    }
    if (!strcmp(f, "join")) {
        const val *sep_arg = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
        if (in->k != V_JSON || !json_is_array(in->j)) return rt_error("chat template: join needs a list%s", "");
        if (attr && !is_str(attr)) return rt_error("chat template: join's attribute must be a name%s", "");
        json_t *sep_str = NULL; /* the separator as str() gives it */
        if (sep_arg) TP_CHECK(to_string(sep_arg, &sep_str));
        val sep_v = {.k = V_JSON, .j = sep_str}, *sep = sep_str ? &sep_v : NULL;
        sbuf b = {0};
        sb_put(&b, "", 0);
        for (size_t i = 0; i < json_array_size(in->j); i++) {
            json_t *s;
            val e = {.k = V_JSON, .j = json_array_get(in->j, i)}, picked = {0};
            if (i && sep && is_str(sep)) sb_put(&b, json_string_value(sep->j), json_string_length(sep->j));
            tp_status st = attr ? attr_path(&e, json_string_value(attr->j), NULL, &picked) : TP_OK;
            if (st == TP_OK) st = to_string(attr ? &picked : &e, &s);
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
        tp_status st = get_item(in, &key, out);
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
                TP_CHECK(cps_of(json_string_value(in->j), json_string_length(in->j), &cp));
                json_t *r = json_array();
                for (size_t i = 0; r && i < cp.n; i++)
                    json_array_append_new(r, json_stringn_nocheck(json_string_value(in->j) + cp.off[i],
                                                                  cp.off[i + 1] - cp.off[i]));
                free(cp.off);
                vfree(&parts[2]);
                *out = vjson(r);
                return r ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
            }
            tp_status st = do_slice(in, parts, out);
            vfree(&parts[2]);
            return st;
        }
        return rt_error("chat template: filter %s needs a string or list", f);
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
            if (!is_num(in)) return rt_error("chat template: abs needs a number%s", "");
            *out = vjson(integral ? json_integer(llabs((long long)inum(in))) : json_real(fabs(x)));
        } else {
            *out = vjson(f[0] == 'i' ? json_integer((json_int_t)x) : json_real(x));
        }
        return TP_OK;
    }
    const int on_str = !strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") ||
                       !strcmp(f, "capitalize") || !strcmp(f, "replace");
    if (!on_str) return rt_error("chat template: unknown filter %s", f);
    /* Jinja's string filters take str(value): None is "None", a list its repr */
    json_t *str = NULL;
    if (!is_str(in)) TP_CHECK(to_string(in, &str));
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
    } else st = call_method(&sv, !strcmp(f, "trim") ? "strip" : f, a, out);
    json_decref(str);
    return st;
}

static tp_status run_test(ctx *c, const char *t, const val *v, const args *a, int *out)
{
    (void)c;
    const val *x = arg(a, 0, NULL);
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
        if (!(j && json_is_string(j))) TP_CHECK(to_string(v, &str));
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
        if (!is_int(v)) return rt_error("chat template: test %s needs an integer", t);
        int64_t d = !strcmp(t, "divisibleby") ? (x && is_int(x) ? inum(x) : 0) : 2;
        if (d == 0) return rt_error("chat template: divisibleby needs a non-zero integer%s", "");
        int64_t r = inum(v) % d;
        *out = t[0] == 'o' ? r != 0 : r == 0;
    } else if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==") || !strcmp(t, "sameas") ||
               !strcmp(t, "ne") || !strcmp(t, "!=")) {
        if (!x) return rt_error("chat template: test %s needs an argument", t);
        *out = py_eq(v, x) != (t[0] == 'n' || t[0] == '!');
    } else if (!strcmp(t, "gt") || !strcmp(t, ">") || !strcmp(t, "greaterthan") || !strcmp(t, "ge") ||
               !strcmp(t, ">=") || !strcmp(t, "lt") || !strcmp(t, "<") || !strcmp(t, "lessthan") ||
               !strcmp(t, "le") || !strcmp(t, "<=")) { /* Jinja's comparison tests and their operator names */
        if (!x) return rt_error("chat template: test %s needs an argument", t);
        int c3;
        TP_CHECK(py_cmp(v, x, &c3));
        const int greater = t[0] == 'g' || t[0] == '>', or_equal = !strcmp(t, "ge") || !strcmp(t, "le") || t[1] == '=';
        *out = greater ? (or_equal ? c3 >= 0 : c3 > 0) : (or_equal ? c3 <= 0 : c3 < 0);
    } else if (!strcmp(t, "in")) {
        if (!x) return rt_error("chat template: test in needs an argument%s", "");
        TP_CHECK(py_in(v, x, out));
    } else {
        return rt_error("chat template: unknown test %s", t);
    }
    return TP_OK;
}

static tp_status exec_block(ctx *c, const ct_node *n);

/* body rendered as a string of its own (a macro's call, {% set x %}...{% endset %}) */
static tp_status render_apart(ctx *c, const ct_node *body, val *out)
{
    char *saved = c->out;
    const size_t saved_len = c->len, saved_cap = c->cap;
    c->out = NULL;
    c->len = c->cap = 0;
    tp_status st = put(c, "", 0);
    if (st == TP_OK) st = exec_block(c, body);
    json_t *s = st == TP_OK ? json_stringn_nocheck(c->out, c->len) : NULL;
    if (st == TP_OK && !s) st = tp_error(TP_ERR_OOM, "out of memory");
    free(c->out);
    c->out = saved;
    c->len = saved_len;
    c->cap = saved_cap;
    if (st == TP_OK) *out = vjson(s);
    return st;
}

/* A call of the macro m: its parameters bound from a (missing ones from their defaults, else
 * undefined), extra positional arguments in varargs and extra keywords in kwargs where the
 * body reads them; the value is what the body renders. */
static tp_status call_macro(ctx *c, const val *m, const args *a, val *out)
{
    const ct_node *def = m->macro;
    const size_t np = def->n_names;
    if (a->n > np && !(def->flag & MACRO_VARARGS))
        return tp_error(TP_ERR_INVALID_ARG, "chat template: macro %s takes at most %zu argument(s), given %zu",
                        def->str, np, a->n);
    for (size_t k = 0; k < a->nk; k++) {
        size_t i = 0;
        while (i < np && strcmp(def->names[i], a->kwname[k])) i++;
        if (i == np && !(def->flag & MACRO_KWARGS))
            return tp_error(TP_ERR_INVALID_ARG, "chat template: macro %s has no parameter %s", def->str,
                            a->kwname[k]);
        if (i < np && i < a->n)
            return tp_error(TP_ERR_INVALID_ARG, "chat template: macro %s: parameter %s given twice", def->str,
                            a->kwname[k]);
    }
    if (c->calls >= MAX_CALL_DEPTH)
        return tp_error(TP_ERR_INVALID_ARG, "chat template: macro %s: calls nested more than %d deep (endless "
                        "recursion?)", def->str, MAX_CALL_DEPTH);
    TP_CHECK(push_scope(c, m->scope));
    c->calls++; /* its defaults may call it too */
    tp_status st = TP_OK;
    for (size_t i = 0; i < np && st == TP_OK; i++) {
        const val *given = arg(a, i, def->names[i]);
        val v = {0};
        if (given) v = vcopy(given);
        else if (def->kw[i]) st = eval(c, def->kw[i], &v); /* sees the parameters before it */
        if (st == TP_OK) st = set_var(c, def->names[i], v);
    }
    json_t *extra = NULL;
    if (st == TP_OK && (def->flag & MACRO_VARARGS)) {
        extra = json_array();
        for (size_t i = np; extra && i < a->n; i++)
            json_array_append(extra, a->pos[i].k == V_JSON ? a->pos[i].j : json_null());
        st = extra ? set_var(c, "varargs", vjson(extra)) : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (st == TP_OK && (def->flag & MACRO_KWARGS)) {
        extra = json_object();
        for (size_t k = 0; extra && k < a->nk; k++) {
            size_t i = 0;
            while (i < np && strcmp(def->names[i], a->kwname[k])) i++;
            if (i == np) json_object_set(extra, a->kwname[k], a->kw[k].k == V_JSON ? a->kw[k].j : json_null());
        }
        st = extra ? set_var(c, "kwargs", vjson(extra)) : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (st == TP_OK) st = render_apart(c, def->kids[0], out);
    c->brk = c->cont = 0; /* no loop outside the macro is broken by it */
    c->calls--;
    pop_frame(c);
    return st;
}

/* Calls, filters and tests: their arguments' frame is apart from eval's, which recursion
 * through other nodes keeps small */
static __attribute__((noinline)) tp_status eval_call(ctx *c, const ct_node *n, val *out)
{
    tp_status st = TP_OK;
    val a = {0};
    args ar = {0};
    switch (n->kind) {
    case CT_CALL:
        TP_CHECK(eval(c, n->kids[0], &a));
        st = eval_args(c, n, 1, &ar);
        if (st != TP_OK) break;
        if (a.k == V_FUNC) st = call_function(c, a.name, &ar, out);
        else if (a.k == V_METHOD) st = call_method(&a, a.name, &ar, out);
        else if (a.k == V_MACRO) st = call_macro(c, &a, &ar, out);
        else if (n->kids[0]->kind == CT_ATTR)
            st = tp_error(TP_ERR_INVALID_ARG, "chat template: line %d: method .%s() is not supported%s%s", n->line,
                          n->kids[0]->str, ct_known_method(n->kids[0]->str) ? " on this value" : " by tpinfer",
                          " (the rendering of this request reached it)");
        else if (a.k == V_UNDEF && n->kids[0]->kind == CT_NAME && !strcmp(n->kids[0]->str, "caller"))
            st = tp_error(TP_ERR_INVALID_ARG, "chat template: line %d: caller() is not supported: tpinfer has no "
                          "{%% call %%} blocks", n->line);
        else if (a.k == V_UNDEF && n->kids[0]->kind == CT_NAME)
            st = tp_error(TP_ERR_INVALID_ARG, "chat template: line %d: %s is undefined where it is called (a macro "
                          "is defined once its {%% macro %%} has run, and only in the loop body that holds it; "
                          "tpinfer has no function of this name)", n->line, n->kids[0]->str);
        else st = tp_error(TP_ERR_INVALID_ARG, "chat template: line %d: calling something that is not a function "
                           "(%s)", n->line, n->kids[0]->str ? n->kids[0]->str : "?");
        break;
    case CT_FILTER:
        if (!ct_known_filter(n->str))
            return tp_error(TP_ERR_INVALID_ARG, "chat template: line %d: filter \"%s\" is not supported by tpinfer "
                            "(the rendering of this request reached it)", n->line, n->str);
        TP_CHECK(eval(c, n->kids[0], &a));
        st = eval_args(c, n, 1, &ar);
        if (st == TP_OK) st = run_filter(c, n->str, &a, &ar, out);
        break;
    case CT_TEST: {
        int r = 0;
        if (!ct_known_test(n->str))
            return tp_error(TP_ERR_INVALID_ARG, "chat template: line %d: test \"is %s\" is not supported by "
                            "tpinfer (the rendering of this request reached it)", n->line, n->str);
        TP_CHECK(eval(c, n->kids[0], &a));
        st = eval_args(c, n, 1, &ar);
        if (st == TP_OK) st = run_test(c, n->str, &a, &ar, &r);
        if (st == TP_OK) *out = vjson(json_boolean(r != n->flag));
        break;
    }
    default: break;
    }
    vfree(&a);
    args_free(&ar);
    if (st != TP_OK) vfree(out);
    return st;
}

static tp_status eval_node(ctx *c, const ct_node *n, val *out)
{
    *out = (val){.k = V_UNDEF};
    if (++c->steps > MAX_STEPS) return rt_error("chat template: too much work (endless loop?)%s", "");
    tp_status st = TP_OK;
    val a = {0}, b = {0};
    switch (n->kind) {
    case CT_LIT:
        *out = vjson(json_incref(n->lit));
        return TP_OK;
    case CT_NAME:
        *out = lookup(c, n->str);
        return TP_OK;
    case CT_ATTR:
        TP_CHECK(eval(c, n->kids[0], &a));
        st = get_attr(&a, n->str, out);
        break;
    case CT_ITEM:
        TP_CHECK(eval(c, n->kids[0], &a));
        st = eval(c, n->kids[1], &b);
        if (st == TP_OK) st = get_item(&a, &b, out);
        break;
    case CT_SLICE: {
        val parts[3] = {{0}, {0}, {0}};
        st = eval(c, n->kids[0], &a);
        for (int k = 0; k < 3 && st == TP_OK; k++)
            if (n->kids[k + 1]) st = eval(c, n->kids[k + 1], &parts[k]);
        if (st == TP_OK) st = do_slice(&a, parts, out);
        for (int k = 0; k < 3; k++) vfree(&parts[k]);
        break;
    }
    case CT_RENDER: /* a set or filter block: its sets stay inside; a break in it ends the loop outside */
        TP_CHECK(push_frame(c));
        st = render_apart(c, n->kids[0], out);
        pop_frame(c);
        return st;
    case CT_CALL:
    case CT_FILTER:
    case CT_TEST: return eval_call(c, n, out);
    case CT_BINOP: {
        const char *op = n->str;
        TP_CHECK(eval(c, n->kids[0], &a));
        if (!strcmp(op, "and") || !strcmp(op, "or")) {
            /* Python returns the deciding operand itself. */
            if (truthy(&a) == (op[0] == 'o')) {
                *out = a;
                return TP_OK;
            }
            vfree(&a);
            return eval(c, n->kids[1], out);
        }
        st = eval(c, n->kids[1], &b);
        if (st != TP_OK) break;
        int r;
        if (!strcmp(op, "==") || !strcmp(op, "!=")) {
            *out = vjson(json_boolean(py_eq(&a, &b) == (op[0] == '=')));
        } else if (!strcmp(op, "in") || !strcmp(op, "not in")) {
            st = py_in(&a, &b, &r);
            if (st == TP_OK) *out = vjson(json_boolean(r == (op[0] == 'i')));
        } else if (op[0] == '<' || op[0] == '>') {
            st = py_cmp(&a, &b, &r);
            int res = op[0] == '<' ? (op[1] ? r <= 0 : r < 0) : (op[1] ? r >= 0 : r > 0);
            if (st == TP_OK) *out = vjson(json_boolean(res));
        } else if (!strcmp(op, "%") && is_str(&a) && !(n->kids[1]->kind == CT_LIST && n->kids[1]->flag)) {
            /* one argument: a list too (only a tuple literal holds several) */
            val one = vjson(json_array());
            if (one.j) json_array_append_new(one.j, b.k == V_JSON ? json_incref(b.j) : json_string(""));
            st = one.j ? arith(op, &a, &one, out) : tp_error(TP_ERR_OOM, "out of memory");
            vfree(&one);
        } else {
            st = arith(op, &a, &b, out);
        }
        break;
    }
    case CT_NOT:
        TP_CHECK(eval(c, n->kids[0], &a));
        *out = vjson(json_boolean(!truthy(&a)));
        break;
    case CT_NEG:
        TP_CHECK(eval(c, n->kids[0], &a));
        if (!is_num(&a)) st = rt_error("chat template: unary minus needs a number%s", "");
        else *out = vjson(is_int(&a) && inum(&a) != INT64_MIN ? json_integer(-inum(&a)) : json_real(-num(&a)));
        break;
    case CT_COND:
        TP_CHECK(eval(c, n->kids[0], &a));
        if (truthy(&a)) st = eval(c, n->kids[1], out);
        else if (n->kids[2]) st = eval(c, n->kids[2], out);
        break;
    case CT_LIST:
    case CT_DICT: {
        json_t *r = n->kind == CT_LIST ? json_array() : json_object();
        if (!r) return tp_error(TP_ERR_OOM, "out of memory");
        for (size_t i = 0; i < n->n_kids && st == TP_OK; i++) {
            st = eval(c, n->kids[i], &a);
            if (st != TP_OK) break;
            if (n->kind == CT_LIST) {
                json_array_append(r, a.k == V_JSON ? a.j : json_null());
            } else {
                st = eval(c, n->kids[++i], &b);
                char buf[32];
                const char *k;
                size_t kn;
                if (st == TP_OK && !(a.k == V_JSON && ct_key_of(a.j, buf, sizeof buf, &k, &kn)))
                    st = rt_error("chat template: dict keys must be strings or integers%s", "");
                if (st == TP_OK) json_object_setn_nocheck(r, k, kn, b.k == V_JSON ? b.j : json_null());
                vfree(&b);
            }
            vfree(&a);
        }
        if (st != TP_OK) json_decref(r);
        else *out = vjson(r);
        break;
    }
    default:
        st = tp_error(TP_ERR_INTERNAL, "chat template: statement in expression position");
    }
    vfree(&a);
    vfree(&b);
    if (st != TP_OK) vfree(out);
    return st;
}


/* eval and exec nest at most this deep (macros' recursion, long chains): the stack holds */
#define MAX_NESTING 1500

static tp_status eval(ctx *c, const ct_node *n, val *out)
{
    *out = (val){.k = V_UNDEF};
    if (++c->nesting > MAX_NESTING) {
        c->nesting--;
        return rt_error("chat template: expressions and macro calls nested too deeply (endless recursion?)%s", "");
    }
    const tp_status st = eval_node(c, n, out);
    c->nesting--;
    return st;
}

// ----------------------------------------------------------------------------
// statements

static tp_status exec(ctx *c, const ct_node *n);

static tp_status exec_block(ctx *c, const ct_node *n)
{
    for (size_t i = 0; i < n->n_kids && !c->brk && !c->cont; i++) TP_CHECK(exec(c, n->kids[i]));
    return TP_OK;
}

static tp_status loop_vars(json_t *items, size_t i, json_t **out)
{
    size_t n = json_array_size(items);
    /* depth: 1 for every loop (recursive loops are refused at start) */
    json_t *l = json_pack("{sI sI sI sI sb sb sI sI sI}", "index", (json_int_t)i + 1, "index0", (json_int_t)i, "revindex",
                          (json_int_t)(n - i), "revindex0", (json_int_t)(n - i - 1), "first", i == 0, "last",
                          i + 1 == n, "length", (json_int_t)n, "depth", (json_int_t)1, "depth0", (json_int_t)0);
    if (!l) return tp_error(TP_ERR_OOM, "out of memory");
    if (i > 0) json_object_set(l, "previtem", json_array_get(items, i - 1));
    if (i + 1 < n) json_object_set(l, "nextitem", json_array_get(items, i + 1));
    *out = l;
    return TP_OK;
}

static tp_status bind_targets(ctx *c, const ct_node *n, json_t *item)
{
    if (n->n_names == 1) return set_var(c, n->names[0], vjson(json_incref(item)));
    if (!json_is_array(item) || json_array_size(item) != n->n_names)
        return rt_error("chat template: cannot unpack a loop item into %s", n->names[0]);
    for (size_t k = 0; k < n->n_names; k++) TP_CHECK(set_var(c, n->names[k], vjson(json_incref(json_array_get(item, k)))));
    return TP_OK;
}

static tp_status exec_for(ctx *c, const ct_node *n)
{
    val it;
    TP_CHECK(eval(c, n->kids[0], &it));
    json_t *items = json_array();
    tp_status st = items ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    /* Materialize what is iterated: list items, mapping keys, string characters. */
    if (st == TP_OK && it.k == V_JSON) {
        json_t *j = it.j;
        if (json_is_array(j)) json_array_extend(items, j);
        else if (json_is_object(j))
            for (void *i = json_object_iter(j); i; i = json_object_iter_next(j, i))
                json_array_append_new(items, ct_key_value(json_object_iter_key(i), json_object_iter_key_len(i)));
        else if (json_is_string(j)) {
            cps cp;
            st = cps_of(json_string_value(j), json_string_length(j), &cp);
            for (size_t i = 0; st == TP_OK && i < cp.n; i++)
                json_array_append_new(items, json_stringn_nocheck(json_string_value(j) + cp.off[i], cp.off[i + 1] - cp.off[i]));
            if (st == TP_OK) free(cp.off);
        } else st = rt_error("chat template: cannot loop over a value that is not a list, mapping or string%s", "");
    } else if (st == TP_OK && it.k != V_UNDEF) {
        st = rt_error("chat template: cannot loop over this value%s", "");
    }
    vfree(&it);
    const ct_node *filter = n->kids[3];
    if (st == TP_OK && filter) {
        json_t *kept = json_array();
        for (size_t i = 0; kept && st == TP_OK && i < json_array_size(items); i++) {
            val cond;
            st = push_frame(c);
            if (st != TP_OK) break;
            st = bind_targets(c, n, json_array_get(items, i));
            if (st == TP_OK) st = eval(c, filter, &cond);
            pop_frame(c);
            if (st == TP_OK && truthy(&cond)) json_array_append(kept, json_array_get(items, i));
            vfree(&cond);
        }
        json_decref(items);
        items = kept;
        if (!items && st == TP_OK) st = tp_error(TP_ERR_OOM, "out of memory");
    }
    size_t count = st == TP_OK ? json_array_size(items) : 0;
    for (size_t i = 0; st == TP_OK && i < count; i++) {
        json_t *lv = NULL;
        TP_CHECK_GOTO(push_frame(c), st, done);
        st = loop_vars(items, i, &lv);
        if (st == TP_OK) st = set_var(c, "loop", vjson(lv));
        if (st == TP_OK) st = bind_targets(c, n, json_array_get(items, i));
        if (st == TP_OK) st = exec_block(c, n->kids[1]);
        pop_frame(c);
        c->cont = 0;
        if (c->brk) {
            c->brk = 0;
            break;
        }
    }
    if (st == TP_OK && count == 0 && n->kids[2]) st = exec_block(c, n->kids[2]);
done:
    json_decref(items);
    return st;
}

static tp_status exec_node(ctx *c, const ct_node *n);

static tp_status exec(ctx *c, const ct_node *n)
{
    if (++c->nesting > MAX_NESTING) {
        c->nesting--;
        return rt_error("chat template: blocks and macro calls nested too deeply (endless recursion?)%s", "");
    }
    const tp_status st = exec_node(c, n);
    c->nesting--;
    return st;
}

static tp_status exec_node(ctx *c, const ct_node *n)
{
    val v;
    switch (n->kind) {
    case CT_BLOCK: return exec_block(c, n);
    case CT_TEXT: return put(c, n->str, n->len);
    case CT_OUT: {
        TP_CHECK(eval(c, n->kids[0], &v));
        json_t *s;
        tp_status st = to_string(&v, &s);
        vfree(&v);
        TP_CHECK(st);
        st = put(c, json_string_value(s), json_string_length(s));
        json_decref(s);
        return st;
    }
    case CT_IF: {
        size_t pairs = (n->n_kids - (size_t)n->flag) / 2;
        for (size_t i = 0; i < pairs; i++) {
            TP_CHECK(eval(c, n->kids[2 * i], &v));
            int t = truthy(&v);
            vfree(&v);
            if (t) return exec_block(c, n->kids[2 * i + 1]);
        }
        return n->flag ? exec_block(c, n->kids[n->n_kids - 1]) : TP_OK;
    }
    case CT_FOR: return exec_for(c, n);
    case CT_MACRO:
        return set_var(c, n->str, (val){.k = V_MACRO, .name = n->str, .macro = n, .scope = c->nf - 1});
    case CT_SET:
        TP_CHECK(eval(c, n->kids[0], &v));
        if (n->attr) {
            val ns = lookup(c, n->str);
            tp_status st = TP_OK;
            if (ns.k != V_NS) st = rt_error("chat template: {%% set %s.attr %%} needs a namespace()", n->str);
            else if (v.k == V_UNDEF) json_object_del(ns.j, n->attr); /* reads back undefined, as Jinja */
            else json_object_set(ns.j, n->attr, v.k == V_JSON ? v.j : json_null());
            vfree(&ns);
            vfree(&v);
            return st;
        }
        return set_var(c, n->str, v);
    case CT_SCOPE: {
        TP_CHECK(push_frame(c));
        tp_status st = exec_block(c, n->kids[0]);
        pop_frame(c);
        return st;
    }
    case CT_BREAK: c->brk = 1; return TP_OK;
    case CT_CONTINUE: c->cont = 1; return TP_OK;
    default: return tp_error(TP_ERR_INTERNAL, "chat template: expression in statement position");
    }
}

tp_status ct_render(const ct_node *root, json_t *vars, char **out, size_t *len)
{
    ctx c = {0};
    c.globals = vars;
    tp_status st = push_frame(&c);
    if (st == TP_OK) st = put(&c, "", 0);
    if (st == TP_OK) st = exec(&c, root);
    while (c.nf) pop_frame(&c);
    free(c.frames);
    if (st != TP_OK) {
        free(c.out);
        return st;
    }
    *out = c.out;
    *len = c.len;
    return TP_OK;
}
