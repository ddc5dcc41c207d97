/*
 * json_schema.c: a JSON Schema compiled into nodes (json_schema.h). Each schema object
 * becomes one node, made before its children so a $ref back to it (recursion) finds it.
 */
#include "json_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES 4096 /* compiling looks back over the nodes made (16 bits would hold 65535) */

typedef struct compiler {
    tp_schema *s;
    const json_t *root;
    int32_t cap_nodes, cap_entries;
    const json_t **seen; /* seen[i]: the schema object node i was made from */
    char path[512];      /* where in the schema, for messages */
} compiler;

static const char *const annotations[] = {"title", "description", "default", "examples", "format", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
                                          "strict", NULL};
static const char *const constraints[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                          "maxItems", "enum", "const", "anyOf", "oneOf", "$ref", NULL};

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
    }
    for (; *chars; chars++) set[(unsigned char)*chars / 8] |= (uint8_t)(1u << ((unsigned char)*chars % 8));
}

static tp_status check_union(compiler *c, int32_t n)
{
    const tp_schema_node *d = &c->s->nodes[n];
    for (int32_t i = 0; i < d->count; i++)
        for (int32_t j = i + 1; j < d->count; j++) {
            uint8_t a[32] = {0}, b[32] = {0};
            start_set(c->s, c->s->entries[d->first + i].node, a, 0);
            start_set(c->s, c->s->entries[d->first + j].node, b, 0);
            for (int k = 0; k < 32; k++)
                if (a[k] & b[k])
                    return refuse(c, " branches that can begin with the same character (tpinfer picks a branch by "
                                  "its first character: a string and a number, an object and null, ...)", "anyOf/oneOf/type with");
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

/* node n of one type name, from schema object v's keywords */
static tp_status compile_type(compiler *c, const json_t *v, const char *type, int32_t n)
{
    tp_schema_node *d = &c->s->nodes[n];
    if (!strcmp(type, "string")) d->kind = TP_SCHEMA_STRING;
    else if (!strcmp(type, "number")) d->kind = TP_SCHEMA_NUMBER;
    else if (!strcmp(type, "integer")) d->kind = TP_SCHEMA_INTEGER;
    else if (!strcmp(type, "boolean")) d->kind = TP_SCHEMA_BOOLEAN;
    else if (!strcmp(type, "null")) d->kind = TP_SCHEMA_NULL;
    else if (!strcmp(type, "array")) {
        d->kind = TP_SCHEMA_ARRAY;
        int32_t items = -1, lo = 0, hi = -1;
        const json_t *it = json_object_get(v, "items");
        if (it) IN_PATH(c, "%s", ".items", compile(c, it, &items));
        TP_CHECK(read_count(c, v, "minItems", &lo));
        TP_CHECK(read_count(c, v, "maxItems", &hi));
        if (hi >= 0 && hi < lo) return refuse(c, " is less than minItems", "maxItems");
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

static tp_status compile(compiler *c, const json_t *v, int32_t *out)
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
            return refuse(c, " is not supported (tpinfer holds a text to type, properties, required, items, minItems, "
                          "maxItems, enum, const, anyOf, oneOf and $ref)", key);
    }
    const json_t *ref = json_object_get(v, "$ref"), *en = json_object_get(v, "enum"), *co = json_object_get(v, "const"),
                 *any = json_object_get(v, "anyOf"), *one = json_object_get(v, "oneOf"), *type = json_object_get(v, "type");
    const int kinds = !!ref + !!(en || co) + !!(any || one);
    if (kinds > 1 || (any && one)) return refuse(c, ": give one of $ref, enum/const and anyOf/oneOf", "more than one");
    if (ref) {
        const json_t *target;
        TP_CHECK(resolve_ref(c, ref, &target));
        for (int32_t i = 1; i < c->s->n_nodes; i++)
            if (c->seen[i] == target) {
                *out = i;
                return TP_OK;
            }
        IN_PATH(c, "%s", ".$ref", compile(c, target, out));
        return TP_OK;
    }
    int32_t n;
    if (en || co) {
        TP_CHECK(new_node(c, v, TP_SCHEMA_ENUM, &n));
        if (en && (!json_is_array(en) || json_array_size(en) == 0)) return refuse(c, " must be a non-empty array", "enum");
        const size_t k = en ? json_array_size(en) : 1;
        TP_CHECK(new_entries(c, n, (int32_t)k));
        for (size_t i = 0; i < k; i++) {
            const json_t *e = en ? json_array_get(en, i) : co;
            if (json_is_object(e) || json_is_array(e)) return refuse(c, " values that are objects or arrays are not supported", en ? "enum" : "const");
            TP_CHECK(set_text(&c->s->entries[c->s->nodes[n].first + (int32_t)i], json_dumps(e, JSON_ENCODE_ANY | JSON_COMPACT)));
        }
        *out = n;
        return TP_OK;
    }
    if (any || one) {
        const json_t *a = any ? any : one;
        if (!json_is_array(a) || json_array_size(a) == 0) return refuse(c, " must be a non-empty array of schemas", any ? "anyOf" : "oneOf");
        TP_CHECK(new_node(c, v, TP_SCHEMA_UNION, &n));
        TP_CHECK(new_entries(c, n, (int32_t)json_array_size(a)));
        for (size_t i = 0; i < json_array_size(a); i++) {
            int32_t b;
            IN_PATH(c, any ? ".anyOf[%zu]" : ".oneOf[%zu]", i, compile(c, json_array_get(a, i), &b));
            c->s->entries[c->s->nodes[n].first + (int32_t)i].node = b;
        }
        *out = n;
        return check_union(c, n);
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
        return check_union(c, n);
    }
    if (type && !json_is_string(type)) return refuse(c, " must be a name or a list of names", "type");
    const char *t = type ? json_string_value(type) : json_object_get(v, "properties") ? "object" : NULL;
    if (!t) {
        if (json_object_get(v, "items")) t = "array";
        else {
            *out = 0; /* annotations only: any value */
            return TP_OK;
        }
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
    free(c.seen);
    if (st != TP_OK) {
        tp_schema_free(c.s);
        return st;
    }
    *out = c.s;
    return TP_OK;
}

void tp_schema_free(tp_schema *s)
{
    if (!s) return;
    for (int32_t i = 0; i < s->n_entries; i++) free(s->entries[i].text);
    free(s->entries);
    free(s->nodes);
    free(s);
}

int32_t tp_schema_start(const tp_schema *s, int32_t n, unsigned char c)
{
    const int bit = c % 8, byte = c / 8;
    if (!(s->nodes[n].start[byte] >> bit & 1)) return -1;
    for (int depth = 0; depth < 64 && s->nodes[n].kind == TP_SCHEMA_UNION; depth++) {
        const tp_schema_node *d = &s->nodes[n];
        int32_t next = -1; /* branches begin with different bytes: one holds c */
        for (int32_t i = 0; i < d->count && next < 0; i++) {
            const int32_t b = s->entries[d->first + i].node;
            if (s->nodes[b].start[byte] >> bit & 1) next = b;
        }
        if (next < 0) return -1;
        n = next;
    }
    return n;
}
