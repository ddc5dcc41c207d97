/*
 * json_schema.h: a JSON Schema compiled for guided decoding (response_format json_schema,
 * vLLM's guided_json): the nodes a byte-at-a-time recognizer (json_prefix.h) holds a text to.
 * What it holds is a subset of what the schema allows, so every text that ends is valid:
 * an object's properties are written in the schema's order, each required one, any other
 * or not (OpenAI's strict mode requires all), and never others. It takes type (a name or a
 * list), properties, required, additionalProperties (of an object without properties: its
 * values' schema), items, minItems, maxItems, enum and const of strings, numbers, booleans
 * and null, anyOf and oneOf whose branches begin with different characters, $ref to "#",
 * "#/$defs/..." or "#/definitions/..." (recursion included), and ignores annotations (title,
 * description, default, examples, format, ...). Anything else it refuses, naming it.
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
    TP_SCHEMA_UNION,  /* one of entries' nodes, picked by its first character */
} tp_schema_kind;

typedef struct tp_schema_node {
    tp_schema_kind kind;
    int32_t first, count;         /* OBJECT's properties, ENUM's values, UNION's branches: entries[first, first + count) */
    int32_t items;                /* ARRAY's items, a free OBJECT's values */
    int32_t min_items, max_items; /* ARRAY; max_items -1: no bound */
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

/* Whether a value of node n may begin with byte c (a UNION's branch is picked this way):
 * the node it begins, or -1. */
int32_t tp_schema_start(const tp_schema *s, int32_t n, unsigned char c);

#endif
