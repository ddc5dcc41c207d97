/*
 * json_schema.c: a JSON Schema compiled into nodes (json_schema.h). Each schema object
 * becomes one node, made before its children so a $ref back to it (recursion) finds it.
 */
#include "json_schema.h"

#include "regex_nfa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES 4096 /* compiling looks back over the nodes made (16 bits would hold 65535) */
#define MAX_NESTING 64 /* schemas inside schemas */

/* A schema object made while compiling: allOf's parts merged, a $ref's target with the
 * keywords beside it, an anyOf branch with its siblings. Made once per (from, ctx), so a
 * recursion through it finds the node made from it. */
typedef struct made {
    const json_t *from, *ctx;
    json_t *to;
} made;

typedef struct compiler {
    tp_schema *s;
    const json_t *root;
    int32_t cap_nodes, cap_entries;
    const json_t **seen; /* seen[i]: the schema object node i was made from */
    made *made;
    size_t n_made, cap_made;
    int32_t *one_of;    /* oneOf's nodes, checked at the end */
    char **one_of_path; /* and where each is */
    size_t n_one_of;
    int depth;          /* compile's nesting */
    char path[512];      /* where in the schema, for messages */
} compiler;

static const char *const annotations[] = {"title", "description", "default", "examples", "format", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
                                          "strict", "discriminator", NULL};
static const char *const constraints[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                          "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
                                          "exclusiveMinimum", "exclusiveMaximum", "prefixItems", "additionalItems",
                                          "enum", "const", "anyOf", "oneOf", "allOf", "$ref", NULL};
/* bounds: merged by the tighter (allOf), lower and upper */
static const char *const lower_bounds[] = {"minItems", "minLength", "minimum", "exclusiveMinimum", NULL};
static const char *const upper_bounds[] = {"maxItems", "maxLength", "maximum", "exclusiveMaximum", NULL};

static int in_list(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static tp_status refuse(compiler *c, const char *fmt, const char *what)
{
    return tp_error(TP_ERR_UNSUPPORTED, "the JSON schema at %s: %s%s", c->path[0] ? c->path : "its root", what,
                    fmt);
}

static tp_status new_node(compiler *c, const json_t *from, tp_schema_kind kind, int32_t *out)
{
    tp_schema *s = c->s;
    if (s->n_nodes >= MAX_NODES) return refuse(c, " nodes: the schema is too large", "more than 4096");
    if (s->n_nodes == c->cap_nodes) {
        c->cap_nodes = 2 * c->cap_nodes + 16;
        tp_schema_node *n = realloc(s->nodes, (size_t)c->cap_nodes * sizeof *n);
        const json_t **seen = realloc(c->seen, (size_t)c->cap_nodes * sizeof *seen);
        if (n) s->nodes = n;
        if (seen) c->seen = seen;
        if (!n || !seen) return tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
    }
    *out = s->n_nodes++;
    memset(&s->nodes[*out], 0, sizeof s->nodes[*out]);
    s->nodes[*out].kind = kind;
    s->nodes[*out].items = -1;
    s->nodes[*out].max_items = -1;
    c->seen[*out] = from;
    return TP_OK;
}

/* entries[first, first + count) reserved for node n */
static tp_status new_entries(compiler *c, int32_t n, int32_t count)
{
    tp_schema *s = c->s;
    if (s->n_entries + count > c->cap_entries) {
        c->cap_entries = 2 * (s->n_entries + count) + 16;
        tp_schema_entry *e = realloc(s->entries, (size_t)c->cap_entries * sizeof *e);
        if (!e) return tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
        s->entries = e;
    }
    s->nodes[n].first = s->n_entries;
    s->nodes[n].count = count;
    if (count > 0) /* none yet: entries may be NULL, and NULL + 0 is undefined */
        memset(&s->entries[s->n_entries], 0, (size_t)count * sizeof *s->entries);
    s->n_entries += count;
    return TP_OK;
}

static tp_status set_text(tp_schema_entry *e, char *text)
{
    if (!text) return tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
    e->text = text;
    e->len = strlen(text);
    return TP_OK;
}

static tp_status compile(compiler *c, const json_t *v, int32_t *out);

/* path += suffix while f runs */
#define IN_PATH(c, fmt, arg, call)                                                    \
    do {                                                                              \
        const size_t at_ = strlen((c)->path);                                         \
        snprintf((c)->path + at_, sizeof (c)->path - at_, fmt, arg);                  \
        tp_status st_ = (call);                                                       \
        (c)->path[at_] = 0;                                                           \
        if (st_ != TP_OK) return st_;                                                 \
    } while (0)

static tp_status resolve_ref(compiler *c, const json_t *ref, const json_t **target)
{
    const char *r = json_is_string(ref) ? json_string_value(ref) : NULL;
    if (r && !strcmp(r, "#")) {
        *target = c->root;
        return TP_OK;
    }
    const char *name = NULL, *box = NULL;
    if (r && !strncmp(r, "#/$defs/", 8)) box = "$defs", name = r + 8;
    else if (r && !strncmp(r, "#/definitions/", 14)) box = "definitions", name = r + 14;
    char key[256];
    size_t k = 0;
    for (; name && *name && k + 1 < sizeof key; name++) { /* JSON pointer: ~1 is '/', ~0 '~' */
        if (*name == '/') return refuse(c, ": only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are followed", "$ref");
        if (*name == '~' && (name[1] == '0' || name[1] == '1')) key[k++] = name[1] == '1' ? '/' : '~', name++;
        else key[k++] = *name;
    }
    key[k] = 0;
    *target = box ? json_object_get(json_object_get(c->root, box), key) : NULL;
    if (!*target) return refuse(c, ": not found, or not \"#\", \"#/$defs/NAME\" or \"#/definitions/NAME\"", "$ref");
    return TP_OK;
}

/* The first characters a value of node n may begin with, as a 256-bit set */
static void start_set(const tp_schema *s, int32_t n, uint8_t set[32], int depth)
{
    const tp_schema_node *d = &s->nodes[n];
    const char *chars = NULL;
    switch (d->kind) {
    case TP_SCHEMA_ANY: chars = "{[\"-0123456789tfn"; break;
    case TP_SCHEMA_OBJECT: chars = "{"; break;
    case TP_SCHEMA_ARRAY: chars = "["; break;
    case TP_SCHEMA_STRING: chars = "\""; break;
    case TP_SCHEMA_NUMBER:
    case TP_SCHEMA_INTEGER: chars = "-0123456789"; break;
    case TP_SCHEMA_BOOLEAN: chars = "tf"; break;
    case TP_SCHEMA_NULL: chars = "n"; break;
    case TP_SCHEMA_ENUM:
        for (int32_t i = 0; i < d->count; i++) {
            const unsigned char b = (unsigned char)s->entries[d->first + i].text[0];
            set[b / 8] |= (uint8_t)(1u << (b % 8));
        }
        return;
    case TP_SCHEMA_UNION:
        for (int32_t i = 0; i < d->count && depth < 64; i++) start_set(s, s->entries[d->first + i].node, set, depth + 1);
        return;
    case TP_SCHEMA_TEXT: /* never a JSON value's */
        return;
    }
    for (; *chars; chars++) set[(unsigned char)*chars / 8] |= (uint8_t)(1u << ((unsigned char)*chars % 8));
}

static int same_value(const tp_schema_entry *a, const tp_schema_entry *b)
{
    if (a->len == b->len && !memcmp(a->text, b->text, a->len)) return 1;
    json_t *x = json_loads(a->text, JSON_DECODE_ANY, NULL), *y = json_loads(b->text, JSON_DECODE_ANY, NULL);
    const int eq = json_is_number(x) && json_is_number(y) && json_number_value(x) == json_number_value(y); /* 1 and 1.0 */
    json_decref(x);
    json_decref(y);
    return eq;
}

static const tp_schema_entry *property(const tp_schema *s, const tp_schema_node *d, const tp_schema_entry *key)
{
    for (int32_t k = 0; k < d->count; k++)
        if (s->entries[d->first + k].len == key->len && !memcmp(s->entries[d->first + k].text, key->text, key->len))
            return &s->entries[d->first + k];
    return NULL;
}

/* Whether no text held to node a (json_prefix.h's subset of it) is valid under node b; 0
 * where that is not shown. oneOf's branches must exclude each other so: a text valid under
 * two would be valid under none of oneOf. */
static int excludes(const tp_schema *s, int32_t a, int32_t b, int depth)
{
    const tp_schema_node *x = &s->nodes[a], *y = &s->nodes[b];
    int common = 0;
    for (int k = 0; k < 32; k++) common |= x->start[k] & y->start[k];
    if (!common) return 1; /* they begin differently: a string and a number, an object and null */
    if (depth > 16) return 0;
    if (x->kind == TP_SCHEMA_UNION) {
        for (int32_t i = 0; i < x->count; i++)
            if (!excludes(s, s->entries[x->first + i].node, b, depth + 1)) return 0;
        return 1;
    }
    if (y->kind == TP_SCHEMA_UNION) {
        for (int32_t i = 0; i < y->count; i++)
            if (!excludes(s, a, s->entries[y->first + i].node, depth + 1)) return 0;
        return 1;
    }
    if (x->kind == TP_SCHEMA_ENUM && y->kind == TP_SCHEMA_ENUM) {
        for (int32_t i = 0; i < x->count; i++)
            for (int32_t j = 0; j < y->count; j++)
                if (same_value(&s->entries[x->first + i], &s->entries[y->first + j])) return 0;
        return 1;
    }
    if (x->kind == TP_SCHEMA_OBJECT && x->count >= 0 && y->kind == TP_SCHEMA_OBJECT && y->count >= 0)
        for (int32_t k = 0; k < y->count; k++) { /* a property b requires: a never writes it, or not as b would */
            const tp_schema_entry *q = &s->entries[y->first + k], *p = property(s, x, q);
            if (q->required && (!p || excludes(s, p->node, q->node, depth + 1))) return 1;
        }
    return 0;
}

static tp_status later_one_of(compiler *c, int32_t n)
{
    int32_t *nodes = realloc(c->one_of, (c->n_one_of + 1) * sizeof *nodes);
    if (nodes) c->one_of = nodes;
    char **paths = realloc(c->one_of_path, (c->n_one_of + 1) * sizeof *paths);
    if (paths) c->one_of_path = paths;
    char *path = strdup(c->path);
    if (!nodes || !paths || !path) {
        free(path);
        return tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
    }
    c->one_of[c->n_one_of] = n;
    c->one_of_path[c->n_one_of++] = path;
    return TP_OK;
}

static tp_status check_one_of(compiler *c, int32_t n)
{
    const tp_schema_node *d = &c->s->nodes[n];
    for (int32_t i = 0; i < d->count; i++)
        for (int32_t j = 0; j < d->count; j++)
            if (i != j && !excludes(c->s, c->s->entries[d->first + i].node, c->s->entries[d->first + j].node, 0)) {
                char what[64];
                snprintf(what, sizeof what, "oneOf[%d] and oneOf[%d]", (int)i, (int)j);
                return refuse(c, " may both hold for one text, which oneOf forbids; tpinfer keeps oneOf's branches "
                              "apart where they begin differently, or where one requires a property the other does "
                              "not write or writes with other const/enum values (use anyOf where both may hold)",
                              what);
            }
    return TP_OK;
}

static tp_status read_count(compiler *c, const json_t *v, const char *key, int32_t *out)
{
    const json_t *x = json_object_get(v, key);
    if (!x) return TP_OK;
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1000000)
        return refuse(c, " must be an integer in [0, 1000000]", key);
    *out = (int32_t)json_integer_value(x);
    return TP_OK;
}

#define MAX_BOUND 9007199254740992.0 /* 2^53: bounds past it are no bounds */

/* minimum, maximum, exclusiveMinimum, exclusiveMaximum (2020-12's numbers, or draft 4's
 * booleans beside minimum/maximum) of an INTEGER or NUMBER node n: the tighter of each side,
 * an integer's made inclusive whole numbers; a number's must be whole numbers */
static tp_status read_bounds(compiler *c, const json_t *v, int32_t n)
{
    tp_schema_node *d = &c->s->nodes[n];
    const int integer = d->kind == TP_SCHEMA_INTEGER;
    for (int upper = 0; upper < 2; upper++) {
        const json_t *plain = json_object_get(v, upper ? "maximum" : "minimum");
        const json_t *excl = json_object_get(v, upper ? "exclusiveMaximum" : "exclusiveMinimum");
        const char *name = upper ? "maximum" : "minimum";
        if (plain && !json_is_number(plain)) return refuse(c, " must be a number", name);
        if (excl && !json_is_number(excl) && !json_is_boolean(excl))
            return refuse(c, " must be a number (or draft 4's boolean)", upper ? "exclusiveMaximum" : "exclusiveMinimum");
        double x = 0;
        int have = 0, ex = 0;
        if (plain) x = json_number_value(plain), have = 1, ex = json_is_true(excl);
        if (excl && json_is_number(excl)) {
            const double e = json_number_value(excl);
            if (!have || (upper ? e <= x : e >= x)) x = e, have = 1, ex = 1;
        }
        if (!have || fabs(x) > MAX_BOUND) continue;
        if (integer) { /* the whole numbers within: inclusive */
            double w = upper ? floor(x) : ceil(x);
            if (ex && w == x) w += upper ? -1 : 1;
            x = w, ex = 0;
        } else if (x != floor(x))
            return refuse(c, " that is not a whole number is not supported for \"number\" (tpinfer bounds a number's "
                          "digits by whole numbers)", name);
        if (upper) d->hi = (int64_t)x, d->has_hi = 1, d->hi_excl = (uint8_t)ex;
        else d->lo = (int64_t)x, d->has_lo = 1, d->lo_excl = (uint8_t)ex;
    }
    if (d->has_lo && d->has_hi && (d->hi < d->lo || (d->hi == d->lo && (d->lo_excl || d->hi_excl))))
        return refuse(c, ": no number is within minimum and maximum", "the bounds");
    return TP_OK;
}

/* node n of one type name, from schema object v's keywords */
static tp_status compile_type(compiler *c, const json_t *v, const char *type, int32_t n)
{
    tp_schema_node *d = &c->s->nodes[n];
    if (!strcmp(type, "string")) {
        d->kind = TP_SCHEMA_STRING;
        int32_t lo = 0, hi = -1;
        TP_CHECK(read_count(c, v, "minLength", &lo));
        TP_CHECK(read_count(c, v, "maxLength", &hi));
        if (hi >= 0 && hi < lo) return refuse(c, " is less than minLength", "maxLength");
        if (hi > 65535) hi = -1; /* past what a text under a schema is written to: no bound */
        if (lo > 65535) return refuse(c, " is more than 65535", "minLength");
        const json_t *pattern = json_object_get(v, "pattern");
        struct tp_regex *re = NULL;
        if (pattern && !json_is_string(pattern)) return refuse(c, " must be a string", "pattern");
        if (pattern && tp_regex_compile(json_string_value(pattern), json_string_length(pattern), 1, &re) != TP_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", tp_error_message());
            tp_error_clear(); /* the message again, with where in the schema */
            return refuse(c, "", why);
        }
        const int32_t least = re ? tp_regex_min_length(re) : 0;
        if (hi >= 0 && least > hi) { /* no string would do: refused, not a dead end */
            char what[96];
            snprintf(what, sizeof what, "maxLength %d", (int)hi);
            tp_regex_free(re);
            char why[96];
            snprintf(why, sizeof why, " is less than the %d characters its pattern needs at least", (int)least);
            return refuse(c, why, what);
        }
        d = &c->s->nodes[n];
        d->min_items = lo;
        d->max_items = hi;
        d->pattern = re;
    } else if (!strcmp(type, "number") || !strcmp(type, "integer")) {
        d->kind = !strcmp(type, "number") ? TP_SCHEMA_NUMBER : TP_SCHEMA_INTEGER;
        TP_CHECK(read_bounds(c, v, n));
    } else if (!strcmp(type, "boolean")) d->kind = TP_SCHEMA_BOOLEAN;
    else if (!strcmp(type, "null")) d->kind = TP_SCHEMA_NULL;
    else if (!strcmp(type, "array")) {
        d->kind = TP_SCHEMA_ARRAY;
        int32_t items = -1, lo = 0, hi = -1;
        /* a tuple's first items (2020-12's prefixItems, or draft 7's items as a list, the rest
         * then additionalItems); false for the rest: no more items */
        const json_t *prefix = json_object_get(v, "prefixItems"), *rest = json_object_get(v, "items");
        const char *rest_name = ".items";
        if (json_is_array(rest)) {
            if (prefix) return refuse(c, " with items as a list: give one", "prefixItems");
            prefix = rest;
            rest = json_object_get(v, "additionalItems");
            rest_name = ".additionalItems";
        }
        if (prefix && !json_is_array(prefix)) return refuse(c, " must be an array of schemas", "prefixItems");
        if (prefix) {
            TP_CHECK(new_entries(c, n, (int32_t)json_array_size(prefix)));
            for (size_t i = 0; i < json_array_size(prefix); i++) {
                int32_t b;
                IN_PATH(c, ".prefixItems[%zu]", i, compile(c, json_array_get(prefix, i), &b));
                c->s->entries[c->s->nodes[n].first + (int32_t)i].node = b;
            }
        }
        if (rest && !json_is_false(rest)) IN_PATH(c, "%s", rest_name, compile(c, rest, &items));
        TP_CHECK(read_count(c, v, "minItems", &lo));
        TP_CHECK(read_count(c, v, "maxItems", &hi));
        const int32_t n_prefix = prefix ? (int32_t)json_array_size(prefix) : 0;
        if (json_is_false(rest) && (hi < 0 || hi > n_prefix)) hi = n_prefix;
        if (hi >= 0 && hi < lo) return refuse(c, " is less than minItems (or the items a tuple may hold)", "maxItems");
        d = &c->s->nodes[n];
        d->items = items >= 0 ? items : 0; /* node 0 is ANY */
        d->min_items = lo;
        d->max_items = hi;
    } else if (!strcmp(type, "object")) {
        d->kind = TP_SCHEMA_OBJECT;
        const json_t *props = json_object_get(v, "properties"), *req = json_object_get(v, "required"),
                     *add = json_object_get(v, "additionalProperties");
        if (props && !json_is_object(props)) return refuse(c, " must be an object", "properties");
        if (req && !json_is_array(req)) return refuse(c, " must be an array of names", "required");
        for (size_t i = 0; req && i < json_array_size(req); i++) {
            const json_t *name = json_array_get(req, i);
            if (!json_is_string(name) || !json_object_get(props, json_string_value(name)))
                return refuse(c, " names a property that \"properties\" does not give", "required");
        }
        if (!props || json_object_size(props) == 0) { /* no properties: any keys (additionalProperties' values) */
            if (json_is_false(add)) return new_entries(c, n, 0); /* {} only */
            int32_t values = 0;
            if (json_is_object(add)) IN_PATH(c, "%s", ".additionalProperties", compile(c, add, &values));
            c->s->nodes[n].count = -1;
            c->s->nodes[n].items = values;
            return TP_OK;
        }
        TP_CHECK(new_entries(c, n, (int32_t)json_object_size(props)));
        int32_t i = 0;
        const char *key;
        const json_t *p;
        json_object_foreach((json_t *)props, key, p)
        {
            const int32_t e = c->s->nodes[n].first + i++;
            json_t *k = json_string(key);
            char *text = k ? json_dumps(k, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            json_decref(k);
            TP_CHECK(set_text(&c->s->entries[e], text));
            int32_t child;
            IN_PATH(c, ".properties.%s", key, compile(c, p, &child));
            c->s->entries[e].node = child;
            for (size_t r = 0; req && r < json_array_size(req); r++)
                if (!strcmp(json_string_value(json_array_get(req, r)), key)) c->s->entries[e].required = 1;
        }
    } else
        return refuse(c, ": \"type\" must be string, number, integer, boolean, null, array or object", type);
    return TP_OK;
}

/* ---- allOf, a $ref beside other keywords, anyOf's siblings: schema objects merged into one */

enum { T_STRING = 1, T_NUMBER = 2, T_INTEGER = 4, T_BOOLEAN = 8, T_NULL = 16, T_ARRAY = 32, T_OBJECT = 64 };
static const char *const type_names[] = {"string", "number", "integer", "boolean", "null", "array", "object", NULL};

/* "type" (a name or a list) as a set of T_ bits; absent: every type */
static tp_status type_bits(compiler *c, const json_t *type, int *bits)
{
    *bits = 0;
    if (!type) {
        *bits = 127;
        return TP_OK;
    }
    const size_t n = json_is_array(type) ? json_array_size(type) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_is_array(type) ? json_array_get(type, i) : type;
        int k = 0;
        while (type_names[k] && !(json_is_string(t) && !strcmp(type_names[k], json_string_value(t)))) k++;
        if (!type_names[k])
            return refuse(c, ": \"type\" must be string, number, integer, boolean, null, array or object (or a list of them)",
                          json_is_string(t) ? json_string_value(t) : "type");
        *bits |= 1 << k;
    }
    if (*bits & T_NUMBER) *bits |= T_INTEGER; /* every integer is a number */
    return TP_OK;
}

static json_t *type_json(int bits)
{
    if (bits & T_NUMBER) bits &= ~T_INTEGER;
    json_t *list = json_array();
    for (int k = 0; type_names[k]; k++)
        if (bits >> k & 1) json_array_append_new(list, json_string(type_names[k]));
    if (json_array_size(list) != 1) return list;
    json_t *one = json_incref(json_array_get(list, 0));
    json_decref(list);
    return one;
}

/* the T_ bits a JSON value is of (1.0 is an integer, as JSON Schema has it) */
static int value_bits(const json_t *v)
{
    if (json_is_string(v)) return T_STRING;
    if (json_is_integer(v)) return T_NUMBER | T_INTEGER;
    if (json_is_real(v)) return T_NUMBER | (json_real_value(v) == (double)(long long)json_real_value(v) ? T_INTEGER : 0);
    if (json_is_boolean(v)) return T_BOOLEAN;
    if (json_is_null(v)) return T_NULL;
    return json_is_array(v) ? T_ARRAY : T_OBJECT;
}

/* whether UTF-8 text[0, n) matches a pattern (as JSON Schema's, anywhere); one tpinfer does
 * not take matches nothing */
static int matches(const char *pattern, size_t pattern_len, const char *text, size_t n)
{
    tp_regex *re;
    if (tp_regex_compile(pattern, pattern_len, 1, &re) != TP_OK) {
        tp_error_clear();
        return 0;
    }
    tp_regex_set s = tp_regex_start(re);
    int ok = 1;
    for (size_t i = 0; i < n && ok;) { /* the code points (the text is jansson's: valid UTF-8) */
        const unsigned char b = (unsigned char)text[i];
        const int more = b < 0x80 ? 0 : b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : 1;
        uint32_t cp = more ? b & (0x3f >> more) : b;
        for (int k = 1; k <= more && i + (size_t)k < n; k++) cp = cp << 6 | ((unsigned char)text[i + (size_t)k] & 0x3f);
        i += (size_t)more + 1;
        ok = tp_regex_step(re, &s, cp, TP_REGEX_UNBOUNDED);
    }
    ok = ok && tp_regex_accepts(re, &s);
    tp_regex_free(re);
    return ok;
}

/* whether value e keeps the string length, pattern and number bounds beside it in schema v */
static int within(const json_t *v, const json_t *e)
{
    if (json_is_string(e)) {
        const char *t = json_string_value(e);
        double chars = 0; /* code points: UTF-8 bytes that do not continue one */
        for (size_t i = 0; i < json_string_length(e); i++) chars += ((unsigned char)t[i] & 0xc0) != 0x80;
        const json_t *lo = json_object_get(v, "minLength"), *hi = json_object_get(v, "maxLength");
        if ((json_is_number(lo) && chars < json_number_value(lo)) || (json_is_number(hi) && chars > json_number_value(hi)))
            return 0;
        const json_t *pattern = json_object_get(v, "pattern");
        return !json_is_string(pattern) || matches(json_string_value(pattern), json_string_length(pattern), t,
                                                    json_string_length(e));
    }
    if (!json_is_number(e)) return 1;
    const double x = json_number_value(e);
    const json_t *lo = json_object_get(v, "minimum"), *hi = json_object_get(v, "maximum");
    const json_t *elo = json_object_get(v, "exclusiveMinimum"), *ehi = json_object_get(v, "exclusiveMaximum");
    if (json_is_number(lo) && (json_is_true(elo) ? x <= json_number_value(lo) : x < json_number_value(lo))) return 0;
    if (json_is_number(hi) && (json_is_true(ehi) ? x >= json_number_value(hi) : x > json_number_value(hi))) return 0;
    if (json_is_number(elo) && x <= json_number_value(elo)) return 0;
    if (json_is_number(ehi) && x >= json_number_value(ehi)) return 0;
    return 1;
}

static json_t *find_made(const compiler *c, const json_t *from, const json_t *ctx)
{
    for (size_t i = 0; i < c->n_made; i++)
        if (c->made[i].from == from && c->made[i].ctx == ctx) return c->made[i].to;
    return NULL;
}

static tp_status keep_made(compiler *c, const json_t *from, const json_t *ctx, json_t *to)
{
    if (c->n_made == c->cap_made) {
        c->cap_made = 2 * c->cap_made + 8;
        made *m = realloc(c->made, c->cap_made * sizeof *m);
        if (!m) {
            json_decref(to);
            return tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
        }
        c->made = m;
    }
    c->made[c->n_made++] = (made){from, ctx, to};
    return TP_OK;
}

static int has_constraints(const json_t *v, const char *but)
{
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x)
    {
        (void)x;
        if (in_list(constraints, key) && strcmp(key, but)) return 1;
    }
    return 0;
}

/* a value list: an enum's, or a const's as one */
static json_t *values_of(const json_t *v)
{
    const json_t *en = json_object_get(v, "enum");
    if (json_is_array(en)) return json_incref((json_t *)en);
    json_t *l = json_array();
    json_array_append(l, json_object_get(v, "const"));
    return l;
}

/* r's enum/const and b's: r's enum becomes the values both give */
static tp_status intersect_values(compiler *c, json_t *r, const json_t *b)
{
    json_t *x = values_of(r), *y = values_of(b), *both = json_array();
    for (size_t i = 0; i < json_array_size(x); i++)
        for (size_t j = 0; j < json_array_size(y); j++)
            if (json_equal(json_array_get(x, i), json_array_get(y, j))) {
                json_array_append(both, json_array_get(x, i));
                break;
            }
    json_decref(x);
    json_decref(y);
    json_object_del(r, "const");
    json_object_set_new(r, "enum", both);
    return json_array_size(both) ? TP_OK : refuse(c, ": no value both allow", "enum/const");
}

/* a merged into by b (allOf's meaning: a value must hold to both), into *out (new) */
static tp_status merge(compiler *c, const json_t *a, const json_t *b, json_t **out)
{
    json_t *r = json_copy((json_t *)a);
    if (!r) return tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
    tp_status st = TP_OK;
    const char *key;
    json_t *bv;
    json_object_foreach((json_t *)b, key, bv)
    {
        json_t *av = json_object_get(r, key), *set = NULL;
        if ((!strcmp(key, "enum") || !strcmp(key, "const")) && (json_object_get(r, "enum") || json_object_get(r, "const"))) {
            if ((st = intersect_values(c, r, b)) != TP_OK) break;
            continue;
        }
        if (!av) {
            json_object_set(r, key, bv);
            continue;
        }
        if (json_equal(av, bv) || in_list(annotations, key)) continue;
        if (!strcmp(key, "type")) {
            int x, y;
            if ((st = type_bits(c, av, &x)) != TP_OK || (st = type_bits(c, bv, &y)) != TP_OK) break;
            if (!(x & y)) {
                st = refuse(c, ": the types merged (allOf, or beside anyOf/oneOf/$ref) have no value in common", "type");
                break;
            }
            set = type_json(x & y);
        } else if (!strcmp(key, "properties") && json_is_object(av) && json_is_object(bv)) {
            set = json_copy(av);
            const char *k;
            json_t *p;
            json_object_foreach(bv, k, p)
            {
                json_t *q = json_object_get(set, k);
                if (q && !json_equal(q, p)) json_object_set_new(set, k, json_pack("{s:[OO]}", "allOf", q, p));
                else json_object_set(set, k, p);
            }
        } else if (!strcmp(key, "required") && json_is_array(av) && json_is_array(bv)) {
            set = json_copy(av);
            for (size_t i = 0; i < json_array_size(bv); i++) {
                size_t j = 0;
                while (j < json_array_size(set) && !json_equal(json_array_get(set, j), json_array_get(bv, i))) j++;
                if (j == json_array_size(set)) json_array_append(set, json_array_get(bv, i));
            }
        } else if ((in_list(lower_bounds, key) || in_list(upper_bounds, key)) && json_is_number(av) && json_is_number(bv)) {
            const int b_less = json_number_value(bv) < json_number_value(av);
            set = json_incref(in_list(upper_bounds, key) == b_less ? bv : av); /* the tighter bound */
        } else if (!strcmp(key, "additionalProperties") && (json_is_false(av) || json_is_false(bv))) {
            set = json_false();
        } else if (!strcmp(key, "items") || !strcmp(key, "additionalProperties")) {
            set = json_pack("{s:[OO]}", "allOf", av, bv);
        } else {
            st = refuse(c, " is given twice with different values (allOf, or beside anyOf/oneOf/$ref), which tpinfer "
                        "does not merge", key);
            break;
        }
        if (!set) {
            st = tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
            break;
        }
        json_object_set_new(r, key, set);
    }
    if (st != TP_OK) {
        json_decref(r);
        return st;
    }
    *out = r;
    return TP_OK;
}

static tp_status flatten(compiler *c, const json_t *v, int depth, const json_t **out);

/* v, or where v is only a $ref (and annotations) what it leads to, flattened */
static tp_status deref(compiler *c, const json_t *v, int depth, const json_t **out)
{
    for (int hops = 0; json_is_object(v) && json_object_get(v, "$ref") && !has_constraints(v, "$ref"); hops++) {
        if (hops > 32) return refuse(c, " leads back to itself", "$ref");
        TP_CHECK(resolve_ref(c, json_object_get(v, "$ref"), &v));
    }
    return flatten(c, v, depth, out);
}

/* v without allOf, or a $ref beside other keywords: the parts merged into one schema object
 * (made once per v); v itself when it has neither */
static tp_status flatten(compiler *c, const json_t *v, int depth, const json_t **out)
{
    *out = v;
    if (!json_is_object(v)) return TP_OK;
    const json_t *ref = json_object_get(v, "$ref"), *all = json_object_get(v, "allOf");
    if (!all && !(ref && has_constraints(v, "$ref"))) return TP_OK;
    if ((*out = find_made(c, v, NULL))) return TP_OK;
    if (depth > 32) return refuse(c, " nest too deep (a $ref that leads back to itself?)", "$ref/allOf");
    if (all && (!json_is_array(all) || json_array_size(all) == 0))
        return refuse(c, " must be a non-empty array of schemas", "allOf");
    json_t *r = json_copy((json_t *)v);
    if (!r) return tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
    json_object_del(r, "allOf");
    json_object_del(r, "$ref");
    tp_status st = TP_OK;
    const json_t *target;
    if (ref && (st = resolve_ref(c, ref, &target)) == TP_OK && (st = deref(c, target, depth + 1, &target)) == TP_OK) {
        json_t *m;
        if (!json_is_object(target)) st = json_is_true(target) ? TP_OK : refuse(c, " leads to a schema that is not an object", "$ref");
        else if ((st = merge(c, target, r, &m)) == TP_OK) {
            json_decref(r);
            r = m;
        }
    }
    for (size_t i = 0; st == TP_OK && all && i < json_array_size(all); i++) {
        const json_t *part;
        json_t *m;
        if ((st = deref(c, json_array_get(all, i), depth + 1, &part)) != TP_OK) break;
        if (json_is_true(part)) continue;
        if (!json_is_object(part)) {
            st = refuse(c, " holds a schema that is not an object", "allOf");
            break;
        }
        if ((st = merge(c, r, part, &m)) != TP_OK) break;
        json_decref(r);
        r = m;
    }
    if (st == TP_OK) st = keep_made(c, v, NULL, r);
    else json_decref(r);
    if (st == TP_OK) *out = r;
    return st;
}

/* anyOf/oneOf's branch i of v, with v's other keywords merged in (made once) */
static tp_status branch_of(compiler *c, const json_t *v, const json_t *list, size_t i, const json_t **out)
{
    const json_t *b = json_array_get(list, i);
    *out = b;
    json_t *sib = json_object();
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x)
    if (in_list(constraints, key) && strcmp(key, "anyOf") && strcmp(key, "oneOf")) json_object_set(sib, key, x);
    if (json_object_size(sib) == 0) {
        json_decref(sib);
        return TP_OK;
    }
    if ((*out = find_made(c, b, v))) {
        json_decref(sib);
        return TP_OK;
    }
    const json_t *flat;
    json_t *m = NULL;
    tp_status st = deref(c, b, 0, &flat);
    if (st == TP_OK && json_is_true(flat)) {
        m = sib;
        sib = NULL;
    } else if (st == TP_OK && !json_is_object(flat))
        st = refuse(c, " (a schema must be an object or true)", "not an object");
    else if (st == TP_OK)
        st = merge(c, sib, flat, &m);
    json_decref(sib);
    if (st == TP_OK) st = keep_made(c, b, v, m);
    if (st == TP_OK) *out = m;
    return st;
}

static tp_status compile_at(compiler *c, const json_t *v, int32_t *out);

/* compile_at one level deeper: schemas nest at most MAX_NESTING deep */
static tp_status compile(compiler *c, const json_t *v, int32_t *out)
{
    if (c->depth >= MAX_NESTING) return refuse(c, " deep: the schema nests too deep", "more than 64");
    c->depth++;
    const tp_status st = compile_at(c, v, out);
    c->depth--;
    return st;
}

static tp_status compile_at(compiler *c, const json_t *v, int32_t *out)
{
    for (int32_t i = 0; i < c->s->n_nodes; i++) /* made already (a $ref back, or the same object twice) */
        if (c->seen[i] == v && i > 0) {
            *out = i;
            return TP_OK;
        }
    if (json_is_true(v) || (json_is_object(v) && json_object_size(v) == 0)) {
        *out = 0;
        return TP_OK;
    }
    if (!json_is_object(v)) return refuse(c, " (a schema must be an object or true)", json_is_false(v) ? "false" : "not an object");
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x)
    {
        (void)x;
        if (!in_list(annotations, key) && !in_list(constraints, key))
            return refuse(c, " is not supported (tpinfer holds a text to type, properties, required, "
                          "additionalProperties, items, prefixItems, minItems, maxItems, minLength, maxLength, pattern, "
                          "minimum, maximum, exclusiveMinimum, exclusiveMaximum, enum, const, anyOf, oneOf, allOf and "
                          "$ref)",
                          key);
    }
    const json_t *flat;
    TP_CHECK(flatten(c, v, 0, &flat));
    if (flat != v) return compile(c, flat, out);
    const json_t *ref = json_object_get(v, "$ref"), *en = json_object_get(v, "enum"), *co = json_object_get(v, "const"),
                 *any = json_object_get(v, "anyOf"), *one = json_object_get(v, "oneOf"), *type = json_object_get(v, "type");
    if (any && one) return refuse(c, ": give one of anyOf and oneOf", "both");
    if (ref) { /* only a $ref (and annotations): where it leads, through other such */
        const json_t *target = v;
        for (int hops = 0; json_is_object(target) && json_object_get(target, "$ref") && !has_constraints(target, "$ref");
             hops++) {
            if (hops > 32) return refuse(c, " leads back to itself", "$ref");
            TP_CHECK(resolve_ref(c, json_object_get(target, "$ref"), &target));
        }
        for (int32_t i = 1; i < c->s->n_nodes; i++)
            if (c->seen[i] == target) {
                *out = i;
                return TP_OK;
            }
        IN_PATH(c, "%s", ".$ref", compile(c, target, out));
        return TP_OK;
    }
    int32_t n;
    if (any || one) { /* beside it, any keyword holds for each branch */
        const json_t *a = any ? any : one;
        if (!json_is_array(a) || json_array_size(a) == 0) return refuse(c, " must be a non-empty array of schemas", any ? "anyOf" : "oneOf");
        TP_CHECK(new_node(c, v, TP_SCHEMA_UNION, &n));
        TP_CHECK(new_entries(c, n, (int32_t)json_array_size(a)));
        for (size_t i = 0; i < json_array_size(a); i++) {
            int32_t b;
            const json_t *branch;
            IN_PATH(c, any ? ".anyOf[%zu]" : ".oneOf[%zu]", i, branch_of(c, v, a, i, &branch));
            IN_PATH(c, any ? ".anyOf[%zu]" : ".oneOf[%zu]", i, compile(c, branch, &b));
            c->s->entries[c->s->nodes[n].first + (int32_t)i].node = b;
        }
        *out = n;
        if (one) return later_one_of(c, n); /* once every node is whole */
        return TP_OK;
    }
    int types;
    TP_CHECK(type_bits(c, type, &types));
    if (en || co) { /* the values of the types "type" names */
        if (en && (!json_is_array(en) || json_array_size(en) == 0)) return refuse(c, " must be a non-empty array", "enum");
        json_t *values = values_of(v), *kept = json_array();
        for (size_t i = 0; i < json_array_size(values); i++)
            if ((value_bits(json_array_get(values, i)) & types) && within(v, json_array_get(values, i)))
                json_array_append(kept, json_array_get(values, i));
        json_decref(values);
        tp_status st = new_node(c, v, TP_SCHEMA_ENUM, &n);
        if (st == TP_OK && !json_array_size(kept))
            st = refuse(c, ": no value is of the type \"type\" names and within its bounds", en ? "enum" : "const");
        if (st == TP_OK) st = new_entries(c, n, (int32_t)json_array_size(kept));
        for (size_t i = 0; st == TP_OK && i < json_array_size(kept); i++) {
            const json_t *e = json_array_get(kept, i);
            if (json_is_object(e) || json_is_array(e)) st = refuse(c, " values that are objects or arrays are not supported", en ? "enum" : "const");
            else st = set_text(&c->s->entries[c->s->nodes[n].first + (int32_t)i], json_dumps(e, JSON_ENCODE_ANY | JSON_COMPACT));
        }
        json_decref(kept);
        if (st == TP_OK) *out = n;
        return st;
    }
    if (json_is_array(type)) { /* ["string", "null"]: one node a name, as anyOf */
        if (json_array_size(type) == 0) return refuse(c, " must not be empty", "type");
        TP_CHECK(new_node(c, v, TP_SCHEMA_UNION, &n));
        TP_CHECK(new_entries(c, n, (int32_t)json_array_size(type)));
        for (size_t i = 0; i < json_array_size(type); i++) {
            const json_t *t = json_array_get(type, i);
            if (!json_is_string(t)) return refuse(c, " must hold type names", "type");
            int32_t b;
            TP_CHECK(new_node(c, NULL, TP_SCHEMA_ANY, &b));
            TP_CHECK(compile_type(c, v, json_string_value(t), b));
            c->s->entries[c->s->nodes[n].first + (int32_t)i].node = b;
        }
        *out = n;
        return TP_OK;
    }
    if (type && !json_is_string(type)) return refuse(c, " must be a name or a list of names", "type");
    /* without "type", keywords of one type make it that one: what is held is then a subset */
    const char *t = type ? json_string_value(type) : NULL;
    if (!t && (json_object_get(v, "properties") || json_object_get(v, "required") || json_object_get(v, "additionalProperties")))
        t = "object";
    if (!t && (json_object_get(v, "items") || json_object_get(v, "prefixItems") || json_object_get(v, "minItems") ||
               json_object_get(v, "maxItems")))
        t = "array";
    if (!t) {
        *out = 0; /* annotations only: any value */
        return TP_OK;
    }
    TP_CHECK(new_node(c, v, TP_SCHEMA_ANY, &n));
    TP_CHECK(compile_type(c, v, t, n));
    *out = n;
    return TP_OK;
}

tp_status tp_schema_compile(const json_t *schema, tp_schema **out)
{
    *out = NULL;
    compiler c;
    memset(&c, 0, sizeof c);
    c.root = schema;
    c.s = calloc(1, sizeof *c.s);
    if (!c.s) return tp_error(TP_ERR_OOM, "out of memory compiling a JSON schema");
    int32_t any;
    tp_status st = new_node(&c, NULL, TP_SCHEMA_ANY, &any); /* node 0: any value */
    if (st == TP_OK) st = compile(&c, schema, &c.s->root);
    for (int32_t n = 0; st == TP_OK && n < c.s->n_nodes; n++) start_set(c.s, n, c.s->nodes[n].start, 0);
    for (int32_t n = 0; st == TP_OK && n < c.s->n_nodes; n++) /* readings a text's byte may fork into */
        for (int b = 0; st == TP_OK && b < 256 && c.s->nodes[n].kind == TP_SCHEMA_UNION; b++) {
            int32_t branch[TP_SCHEMA_MAX_ALIKE + 1];
            if (tp_schema_starts(c.s, n, (unsigned char)b, branch, TP_SCHEMA_MAX_ALIKE + 1) > TP_SCHEMA_MAX_ALIKE)
                st = tp_error(TP_ERR_UNSUPPORTED, "the JSON schema: an anyOf/oneOf has more than %d branches that "
                              "may begin with '%c'; tpinfer follows at most %d at once",
                              TP_SCHEMA_MAX_ALIKE, b, TP_SCHEMA_MAX_ALIKE);
        }
    for (size_t i = 0; i < c.n_one_of; i++) {
        if (st == TP_OK) {
            snprintf(c.path, sizeof c.path, "%s", c.one_of_path[i]);
            st = check_one_of(&c, c.one_of[i]);
        }
        free(c.one_of_path[i]);
    }
    free(c.one_of);
    free(c.one_of_path);
    free(c.seen);
    for (size_t i = 0; i < c.n_made; i++) json_decref(c.made[i].to);
    free(c.made);
    if (st != TP_OK) {
        tp_schema_free(c.s);
        return st;
    }
    *out = c.s;
    return TP_OK;
}

tp_status tp_schema_compile_regex(const char *pattern, size_t len, tp_schema **out)
{
    *out = NULL;
    tp_regex *re = NULL;
    TP_CHECK(tp_regex_compile(pattern, len, 0, &re));
    tp_schema *s = calloc(1, sizeof *s);
    if (s) s->nodes = calloc(2, sizeof *s->nodes);
    if (!s || !s->nodes) {
        tp_regex_free(re);
        free(s);
        return tp_error(TP_ERR_OOM, "out of memory compiling a regular expression");
    }
    s->n_nodes = 2;
    s->root = 1; /* node 0 is ANY, as in every schema */
    s->nodes[1].kind = TP_SCHEMA_TEXT;
    s->nodes[1].items = -1;
    s->nodes[1].max_items = -1;
    s->nodes[1].pattern = re;
    *out = s;
    return TP_OK;
}

void tp_schema_free(tp_schema *s)
{
    if (!s) return;
    for (int32_t i = 0; i < s->n_nodes; i++) tp_regex_free(s->nodes[i].pattern);
    for (int32_t i = 0; i < s->n_entries; i++) free(s->entries[i].text);
    free(s->entries);
    free(s->nodes);
    free(s);
}

static void starts(const tp_schema *s, int32_t n, int byte, int bit, int32_t *out, int *k, int room, int depth)
{
    if (!(s->nodes[n].start[byte] >> bit & 1)) return;
    if (s->nodes[n].kind != TP_SCHEMA_UNION) {
        for (int i = 0; i < *k; i++)
            if (out[i] == n) return;
        if (*k < room) out[(*k)++] = n;
        return;
    }
    const tp_schema_node *d = &s->nodes[n];
    for (int32_t i = 0; i < d->count && depth < 64; i++)
        starts(s, s->entries[d->first + i].node, byte, bit, out, k, room, depth + 1);
}

int tp_schema_starts(const tp_schema *s, int32_t n, unsigned char c, int32_t *out, int room)
{
    int k = 0;
    starts(s, n, c / 8, c % 8, out, &k, room, 0);
    return k;
}
