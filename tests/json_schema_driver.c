/*
 * json_schema_driver.c: for tests/json_schema.sh. `json_schema_driver SCHEMA_FILE` compiles
 * the schema (exit 2 and its message when tpinfer refuses it) and then reads texts, one a
 * line, each a JSON string literal, and prints per text what the recognizer makes of it:
 * "whole" (every byte taken and the text may end), "prefix" (every byte taken, more needed),
 * or "refused N" (byte N refused).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_prefix.h"
#include "json_schema.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: json_schema_driver SCHEMA_FILE < texts\n");
        return 1;
    }
    json_error_t err;
    json_t *doc = json_load_file(argv[1], JSON_DECODE_ANY, &err);
    if (!doc) {
        fprintf(stderr, "%s: %s\n", argv[1], err.text);
        return 1;
    }
    tp_schema *schema = NULL;
    if (tp_schema_compile(doc, &schema) != TP_OK) {
        printf("refused: %s\n", tp_error_message());
        json_decref(doc);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, stdin)) > 0) {
        json_t *t = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (!json_is_string(t)) {
            fprintf(stderr, "not a JSON string: %s", line);
            return 1;
        }
        tp_json_prefix start;
        tp_json_prefix_init_schema(&start, schema);
        static tp_json_paths s;
        tp_json_paths_init(&s, &start);
        const size_t n = json_string_length(t), k = tp_json_paths_feed_n(&s, json_string_value(t), n);
        if (k < n) printf("refused %zu\n", k);
        else printf("%s\n", tp_json_paths_complete(&s) ? "whole" : "prefix");
        json_decref(t);
    }
    free(line);
    tp_schema_free(schema);
    json_decref(doc);
    return 0;
}
