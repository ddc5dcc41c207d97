/* fuzz_json_schema.c: the JSON schema compiler (src/json_schema.c: allOf and $ref merged,
 * anyOf's readings, oneOf's proofs; patterns through src/regex_nfa.c) and the recognizer under
 * it, on any bytes: a schema (or a JSON string: guided_regex's pattern), a NUL, then a
 * text. Compiling ends (refused or not) without a crash, however $refs loop; under a
 * compiled schema a refused byte leaves the readings as they were, there are at most
 * TP_JSON_MAX_PATHS, and a text taken whole parses with jansson (under a pattern of its own:
 * is valid UTF-8). */
#include <jansson.h>
#include <string.h>

#include "fuzz_common.h"
#include "json_prefix.h"
#include "json_schema.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t schema_len = nul ? (size_t)(nul - data) : size;
    json_t *doc = json_loadb((const char *)data, schema_len, JSON_DECODE_ANY, NULL);
    if (!doc) return 0;
    tp_schema *schema = NULL; /* a JSON string: guided_regex's pattern */
    const tp_status st = json_is_string(doc)
                             ? tp_schema_compile_regex(json_string_value(doc), json_string_length(doc), &schema)
                             : tp_schema_compile(doc, &schema);
    if (st != TP_OK) {
        tp_error_clear();
        json_decref(doc);
        return 0;
    }
    const char *text = nul ? (const char *)nul + 1 : "";
    const size_t n = nul ? size - schema_len - 1 : 0;
    tp_json_prefix start;
    tp_json_prefix_init_schema(&start, schema);
    static tp_json_paths s, before;
    tp_json_paths_init(&s, &start);
    size_t k = 0;
    for (; k < n; k++) {
        before = s;
        if (!tp_json_paths_feed(&s, (unsigned char)text[k])) {
            if (s.n != before.n || memcmp(s.path, before.path, (size_t)s.n * sizeof *s.path)) abort();
            break;
        }
        if (s.n < 1 || s.n > TP_JSON_MAX_PATHS) abort();
        for (int i = 1; i < s.n; i++) /* sorted, each once */
            if (memcmp(&s.path[i - 1], &s.path[i], sizeof s.path[i]) >= 0) abort();
    }
    if (k == n && n && tp_json_paths_complete(&s) && json_is_string(doc)) { /* a regex's text: valid UTF-8 */
        json_t *t = json_stringn(text, n);
        if (!t) abort();
        json_decref(t);
    } else if (k == n && n && tp_json_paths_complete(&s)) {
        json_error_t err;
        json_t *v = json_loadb(text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (!v && json_error_code(&err) != json_error_numeric_overflow) abort();
        json_decref(v);
    }
    tp_schema_free(schema);
    json_decref(doc);
    return 0;
}
