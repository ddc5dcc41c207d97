/*
 * chat_template_value.h: the values a chat template computes with, shared by the evaluator
 * (chat_template_eval.c: expressions, statements, scopes), the operations on values
 * (chat_template_value.c: truthiness, str(), comparisons, arithmetic, indexing, slicing)
 * and the builtins (chat_template_builtins.c: filters, tests, functions, methods).
 */
#ifndef TP_CHAT_TEMPLATE_VALUE_H
#define TP_CHAT_TEMPLATE_VALUE_H

#include <string.h>

#include "chat_template_internal.h"

#define MAX_OUTPUT ((size_t)256 << 20) /* bytes a render may write */
#define MAX_RANGE 1000000              /* items range() and repeats may make */

enum vkind { V_UNDEF, V_JSON, V_NS, V_FUNC, V_METHOD, V_MACRO };

typedef struct val {
    enum vkind k;
    json_t *j;        /* owned reference (V_JSON, V_NS: the namespace object, V_METHOD: receiver) */
    const char *name; /* V_FUNC / V_METHOD / V_MACRO */
    const ct_node *macro; /* V_MACRO: its definition */
    size_t scope;         /* V_MACRO: the frame it was defined in, whose names its body reads */
} val;

static inline void vfree(val *v)
{
    json_decref(v->j);
    memset(v, 0, sizeof *v);
}

static inline val vjson(json_t *j) { return (val){.k = j ? V_JSON : V_UNDEF, .j = j}; } /* steals j */
static inline val vcopy(const val *v)
{
    val r = *v;
    json_incref(r.j);
    return r;
}

static inline int is_str(const val *v) { return v->k == V_JSON && json_is_string(v->j); }
static inline int is_num(const val *v) { return v->k == V_JSON && (json_is_number(v->j) || json_is_boolean(v->j)); }
static inline int is_int(const val *v) { return v->k == V_JSON && (json_is_integer(v->j) || json_is_boolean(v->j)); }
static inline double num(const val *v)
{
    return json_is_boolean(v->j) ? json_is_true(v->j) : json_number_value(v->j);
}
static inline int64_t inum(const val *v)
{
    return json_is_boolean(v->j) ? json_is_true(v->j) : json_integer_value(v->j);
}

/* the evaluator's state: builtins that call back (map, select) pass it on */
typedef struct ctx ctx;

/* Evaluated arguments of a call/filter/test node: kids[first..] and keywords (eval_args). */
#define MAX_ARGS 16

typedef struct args {
    val pos[MAX_ARGS];
    size_t n;
    val kw[MAX_ARGS];
    const char *kwname[MAX_ARGS];
    size_t nk;
} args;

typedef struct cps {
    size_t *off; /* byte offset of each character, plus the end */
    size_t n;
} cps;

tp_status ct_rt_error(const char *fmt, const char *a);
int ct_truthy(const val *v);
tp_status ct_to_string(const val *v, json_t **out);
tp_status ct_cps_of(const char *s, size_t len, cps *c);
int ct_is_space_cp(const char *s, size_t n, size_t *k);
json_t *ct_py_strip(const char *s, size_t n, const char *chars, size_t cn, int left, int right);
int ct_py_eq(const val *a, const val *b);
tp_status ct_py_cmp(const val *a, const val *b, int *out);
tp_status ct_py_in(const val *item, const val *cont, int *out);
tp_status ct_arith(const char *op, const val *a, const val *b, val *out);
tp_status ct_get_item(const val *obj, const val *key, val *out);
tp_status ct_slice(const val *obj, const val *parts, val *out);
void ct_args_free(args *a);
const val *ct_kwarg(const args *a, const char *name);
const val *ct_arg(const args *a, size_t i, const char *name);
tp_status ct_need_str(const val *v, const char *what);

/* chat_template_builtins.c */
tp_status ct_get_attr(const val *obj, const char *name, val *out);
tp_status ct_call_method(const val *self, const char *m, const args *a, val *out);
tp_status ct_call_function(ctx *c, const char *f, const args *a, val *out);
tp_status ct_run_filter(ctx *c, const char *f, val *in, const args *a, val *out);
tp_status ct_run_test(ctx *c, const char *name, const val *v, const args *a, int *out);

#endif
