/*
 * json_schema.h: a JSON Schema compiled for guided decoding (response_format json_schema,
 * vLLM's guided_json): the nodes a byte-at-a-time recognizer (json_prefix.h) holds a text to.
 * What it holds is a subset of what the schema allows, so every text that ends is valid:
 * an object's properties are written in the schema's order, each required one, any other
 * or not (OpenAI's strict mode requires all), and never others. It takes type (a name or a
 * list), properties, required, additionalProperties (of an object without properties: its
 * values' schema), items, prefixItems (and draft 7's items list with additionalItems),
 * minItems, maxItems, minLength, maxLength, pattern (regex_nfa.h's syntax), minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (whole-number bounds for numbers; any for integers),
 * enum and const of strings, numbers, booleans
 * and null, anyOf (a text is read by every branch it may be in, until the bytes pick one),
 * oneOf whose branches are shown apart (they begin differently, or one requires a property
 * the other never writes, or writes with other const/enum values), allOf and keywords beside
 * anyOf/oneOf/$ref (merged into one schema: properties and required joined, types and
 * enums intersected, the tighter item bounds), $ref to "#", "#/$defs/..." or
 * "#/definitions/..." (recursion included), and ignores annotations (title, description,
 * default, examples, format, ...). Anything else it refuses, naming it.
 */
#ifndef TP_JSON_SCHEMA_H
#define TP_JSON_SCHEMA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum tp_schema_kind {
    TP_SCHEMA_ANY,    /* any JSON value */
    TP_SCHEMA_OBJECT, /* count >= 0: its properties; -1: any keys, values of node items */
    TP_SCHEMA_ARRAY,
    TP_SCHEMA_STRING,
    TP_SCHEMA_NUMBER,
    TP_SCHEMA_INTEGER,
    TP_SCHEMA_BOOLEAN,
    TP_SCHEMA_NULL,
    TP_SCHEMA_ENUM,   /* one of entries' texts, byte for byte */
    TP_SCHEMA_UNION,  /* any of entries' nodes (a text may be read by several at once) */
    TP_SCHEMA_TEXT,   /* not JSON: the whole text matches pattern (guided_regex's root) */
} tp_schema_kind;

typedef struct tp_schema_node {
    tp_schema_kind kind;
    int32_t first, count;         /* OBJECT's properties, ENUM's values, UNION's branches, ARRAY's first
                                   * items (a tuple's, prefixItems): entries[first, first + count) */
    int32_t items;                /* ARRAY's items, a free OBJECT's values */
    int32_t min_items, max_items; /* ARRAY's items, STRING's characters (code points); max -1: no bound */
    int64_t lo, hi;               /* INTEGER, NUMBER: the bounds, whole numbers (|x| <= 2^53) */
    uint8_t has_lo, has_hi;       /* the bounds given */
    uint8_t lo_excl, hi_excl;     /* NUMBER: a bound itself excluded (INTEGER's are made inclusive) */
    struct tp_regex *pattern;     /* STRING: its "pattern", TEXT: the text's (owned), or NULL */
    uint8_t start[32];            /* the bytes a value of it may begin with, a bit each (made once) */
} tp_schema_node;

typedef struct tp_schema_entry {
    char *text;   /* a property's key as JSON ("\"name\"") or an enum value as JSON; NULL for a branch */
    size_t len;
    int32_t node; /* the property's value or the branch */
    int required; /* a property "required" names */
} tp_schema_entry;

typedef struct tp_schema {
    tp_schema_node *nodes;
    int32_t n_nodes, root;
    tp_schema_entry *entries;
    int32_t n_entries;
} tp_schema;

/* Compile a schema; a schema it does not take is TP_ERR_UNSUPPORTED with a message naming
 * what (the keyword, its place). */
tp_status tp_schema_compile(const json_t *schema, tp_schema **out);
void tp_schema_free(tp_schema *s); /* accepts NULL */

/* vLLM's guided_regex: a "schema" whose root is TEXT, the whole text matching the regular
 * expression pattern[0, len) (regex_nfa.h; anchored at both ends, as vLLM's). */
tp_status tp_schema_compile_regex(const char *pattern, size_t len, tp_schema **out);

#define TP_SCHEMA_MAX_ALIKE 64 /* an anyOf's branches that may begin with one byte, at most */

/* The nodes a value of node n may begin with byte c as (a UNION's branches, through nested
 * ones; n itself where it is no UNION), each once, into out (room at most): their count,
 * 0 where none may. */
int tp_schema_starts(const tp_schema *s, int32_t n, unsigned char c, int32_t *out, int room);

#endif
