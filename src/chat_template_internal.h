/*
 * chat_template_internal.h: the syntax tree shared by the chat-template parser
 * (chat_template.c) and its evaluator (chat_template_eval.c, chat_template_value.h).
 */
#ifndef TP_CHAT_TEMPLATE_INTERNAL_H
#define TP_CHAT_TEMPLATE_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"

enum ct_kind {
    /* statements */
    CT_BLOCK,    /* kids: statements */
    CT_TEXT,     /* str */
    CT_OUT,      /* kids[0]: expression */
    CT_IF,       /* kids: cond, body, cond, body, ..., [else body]; flag: has else */
    CT_FOR,      /* names: targets; kids: iterable, body, else body or NULL, filter or NULL */
    CT_SET,      /* str: variable; attr: namespace attribute or NULL; kids[0]: value */
    CT_MACRO,    /* str: name; names: parameters, kw: their defaults (NULL: none); kids[0]: body;
                  * flag: MACRO_VARARGS | MACRO_KWARGS where the body reads them (as Jinja) */
    CT_SCOPE,    /* kids[0]: body in a scope of its own ({% generation %}, transformers' tag) */
    CT_BREAK,
    CT_CONTINUE,
    /* expressions */
    CT_LIT,    /* lit */
    CT_NAME,   /* str */
    CT_ATTR,   /* kids[0].str */
    CT_ITEM,   /* kids[0][kids[1]] */
    CT_SLICE,  /* kids[0][kids[1]:kids[2]:kids[3]], any of 1..3 may be NULL */
    CT_CALL,   /* kids[0](kids[1..], names=kw values) */
    CT_FILTER, /* kids[0] | str(kids[1..], kw) */
    CT_TEST,   /* kids[0] is [not] str(kids[1..]); flag: negated */
    CT_BINOP,  /* str: operator */
    CT_NOT,
    CT_NEG,
    CT_COND, /* kids[1] if kids[0] else kids[2] (NULL: undefined) */
    CT_LIST, /* flag: a tuple literal */
    CT_DICT, /* kids: key, value, key, value, ... */
    CT_RENDER, /* kids[0]: a block, whose rendering is the value ({% set x %}, {% filter %}) */
};

enum { MACRO_VARARGS = 1, MACRO_KWARGS = 2 };

typedef struct ct_node {
    enum ct_kind kind;
    char *str;
    size_t len;
    char *attr;
    json_t *lit;
    struct ct_node **kids;
    size_t n_kids;
    char **names; /* for-loop targets, or keyword names of a call/filter/test */
    size_t n_names;
    struct ct_node **kw; /* keyword values, parallel to names (calls) */
    int flag;
    int line; /* of calls, filters and tests: runtime errors name it */
} ct_node;

struct tp_chat_template {
    ct_node *root;
    char *partial; /* constructs outside the subset in conditional code, or NULL */
};

void ct_node_free(ct_node *n);

/* chat_template_text.c: a growing string (oom set on failure; s NUL-terminated), and
 * Python's str() (repr: repr()) and json.dumps() into one */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

typedef struct json_opts {
    int ascii;                 /* ensure_ascii: every non-ASCII character (and DEL) as \uXXXX */
    const char *indent;        /* NULL: None (one line); else the string of one level */
    size_t indent_len;
    const char *item_sep, *key_sep; /* separators: default ", " / ": " (",", ": " with an indent) */
    int sort_keys;
} json_opts;

void sb_put(sbuf *b, const char *s, size_t n);
void sb_str(sbuf *b, const char *s);
void py_float(sbuf *b, double x);
void py_repr_str(sbuf *b, const char *s, size_t n);
void py_str(sbuf *b, json_t *j, int repr);
void py_json(sbuf *b, json_t *j, const json_opts *o, int level);

/* A mapping's int key (Python's {512: 128}) is kept as this byte, which no UTF-8 string
 * holds, then its decimal digits. ct_key_value: the key as a value (a string or an int);
 * ct_key_of: the stored key of a string or int value in buf (0: v cannot be a key). */
#define CT_INT_KEY '\xff'
json_t *ct_key_value(const char *k, size_t n);
int ct_key_of(json_t *v, char *buf, size_t cap, const char **k, size_t *n);

/* Python's string operations (NULL: out of memory): str.splitlines, Jinja's indent filter,
 * str.center/ljust/rjust/zfill (how 'c' 'l' 'r' 'z'), round(x, ndigits), fmt % args (args: a
 * list for a tuple, a mapping for %(name)s, else one value) */
json_t *py_splitlines(const char *s, size_t n, int keepends);
json_t *py_indent(const char *s, size_t n, const char *ind, size_t il, int first, int blank);
json_t *py_pad(const char *s, size_t n, int64_t width, char how, const char *fill, size_t fill_len);
double py_round(double x, int64_t ndigits);
tp_status py_percent(const char *fmt, size_t n, json_t *args, json_t **out);

/* chat_template_eval.c */
tp_status ct_render(const ct_node *root, json_t *vars, char **out, size_t *len);
/* chat_template_builtins.c: the names the parser accepts */
int ct_known_filter(const char *name);
int ct_known_test(const char *name);
int ct_known_function(const char *name);
int ct_known_method(const char *name);

#endif
