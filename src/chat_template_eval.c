/*
 * chat_template_eval.c: renders a chat-template syntax tree over jansson values with
 * Python/Jinja semantics: scopes, expressions (operations on values in
 * chat_template_value.c, filters, tests, functions and methods in chat_template_builtins.c),
 * macros, loop variables and statements.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_value.h"
#include "unicode.h"

#define MAX_STEPS 50000000L

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

struct ctx {
    json_t *globals;
    frame *frames;
    size_t nf, capf;
    char *out;
    size_t len, cap;
    int brk, cont;
    long steps;
    int calls;   /* macro calls under way */
    int nesting; /* eval and exec under way */
};

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

// ----------------------------------------------------------------------------
// expressions

static tp_status eval(ctx *c, const ct_node *n, val *out);

static tp_status eval_args(ctx *c, const ct_node *n, size_t first, args *a)
{
    memset(a, 0, sizeof *a);
    if (n->n_kids - first > MAX_ARGS || n->n_names > MAX_ARGS)
        return ct_rt_error("chat template: more than 16 arguments in a call%s", "");
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
        const val *given = ct_arg(a, i, def->names[i]);
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
        if (a.k == V_FUNC) st = ct_call_function(c, a.name, &ar, out);
        else if (a.k == V_METHOD) st = ct_call_method(&a, a.name, &ar, out);
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
        if (st == TP_OK) st = ct_run_filter(c, n->str, &a, &ar, out);
        break;
    case CT_TEST: {
        int r = 0;
        if (!ct_known_test(n->str))
            return tp_error(TP_ERR_INVALID_ARG, "chat template: line %d: test \"is %s\" is not supported by "
                            "tpinfer (the rendering of this request reached it)", n->line, n->str);
        TP_CHECK(eval(c, n->kids[0], &a));
        st = eval_args(c, n, 1, &ar);
        if (st == TP_OK) st = ct_run_test(c, n->str, &a, &ar, &r);
        if (st == TP_OK) *out = vjson(json_boolean(r != n->flag));
        break;
    }
    default: break;
    }
    vfree(&a);
    ct_args_free(&ar);
    if (st != TP_OK) vfree(out);
    return st;
}

static tp_status eval_node(ctx *c, const ct_node *n, val *out)
{
    *out = (val){.k = V_UNDEF};
    if (++c->steps > MAX_STEPS) return ct_rt_error("chat template: too much work (endless loop?)%s", "");
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
        st = ct_get_attr(&a, n->str, out);
        break;
    case CT_ITEM:
        TP_CHECK(eval(c, n->kids[0], &a));
        st = eval(c, n->kids[1], &b);
        if (st == TP_OK) st = ct_get_item(&a, &b, out);
        break;
    case CT_SLICE: {
        val parts[3] = {{0}, {0}, {0}};
        st = eval(c, n->kids[0], &a);
        for (int k = 0; k < 3 && st == TP_OK; k++)
            if (n->kids[k + 1]) st = eval(c, n->kids[k + 1], &parts[k]);
        if (st == TP_OK) st = ct_slice(&a, parts, out);
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
            if (ct_truthy(&a) == (op[0] == 'o')) {
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
            *out = vjson(json_boolean(ct_py_eq(&a, &b) == (op[0] == '=')));
        } else if (!strcmp(op, "in") || !strcmp(op, "not in")) {
            st = ct_py_in(&a, &b, &r);
            if (st == TP_OK) *out = vjson(json_boolean(r == (op[0] == 'i')));
        } else if (op[0] == '<' || op[0] == '>') {
            st = ct_py_cmp(&a, &b, &r);
            int res = op[0] == '<' ? (op[1] ? r <= 0 : r < 0) : (op[1] ? r >= 0 : r > 0);
            if (st == TP_OK) *out = vjson(json_boolean(res));
        } else if (!strcmp(op, "%") && is_str(&a) && !(n->kids[1]->kind == CT_LIST && n->kids[1]->flag)) {
            /* one argument: a list too (only a tuple literal holds several) */
            val one = vjson(json_array());
            if (one.j) json_array_append_new(one.j, b.k == V_JSON ? json_incref(b.j) : json_string(""));
            st = one.j ? ct_arith(op, &a, &one, out) : tp_error(TP_ERR_OOM, "out of memory");
            vfree(&one);
        } else {
            st = ct_arith(op, &a, &b, out);
        }
        break;
    }
    case CT_NOT:
        TP_CHECK(eval(c, n->kids[0], &a));
        *out = vjson(json_boolean(!ct_truthy(&a)));
        break;
    case CT_NEG:
        TP_CHECK(eval(c, n->kids[0], &a));
        if (!is_num(&a)) st = ct_rt_error("chat template: unary minus needs a number%s", "");
        else *out = vjson(is_int(&a) && inum(&a) != INT64_MIN ? json_integer(-inum(&a)) : json_real(-num(&a)));
        break;
    case CT_COND:
        TP_CHECK(eval(c, n->kids[0], &a));
        if (ct_truthy(&a)) st = eval(c, n->kids[1], out);
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
                    st = ct_rt_error("chat template: dict keys must be strings or integers%s", "");
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
        return ct_rt_error("chat template: expressions and macro calls nested too deeply (endless recursion?)%s", "");
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
        return ct_rt_error("chat template: cannot unpack a loop item into %s", n->names[0]);
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
            st = ct_cps_of(json_string_value(j), json_string_length(j), &cp);
            for (size_t i = 0; st == TP_OK && i < cp.n; i++)
                json_array_append_new(items, json_stringn_nocheck(json_string_value(j) + cp.off[i], cp.off[i + 1] - cp.off[i]));
            if (st == TP_OK) free(cp.off);
        } else st = ct_rt_error("chat template: cannot loop over a value that is not a list, mapping or string%s", "");
    } else if (st == TP_OK && it.k != V_UNDEF) {
        st = ct_rt_error("chat template: cannot loop over this value%s", "");
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
            if (st == TP_OK && ct_truthy(&cond)) json_array_append(kept, json_array_get(items, i));
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
        return ct_rt_error("chat template: blocks and macro calls nested too deeply (endless recursion?)%s", "");
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
        tp_status st = ct_to_string(&v, &s);
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
            int t = ct_truthy(&v);
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
            if (ns.k != V_NS) st = ct_rt_error("chat template: {%% set %s.attr %%} needs a namespace()", n->str);
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
