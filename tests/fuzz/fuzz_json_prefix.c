/* fuzz_json_prefix.c: the JSON prefix recognizer (src/json_prefix.c, JSON mode's) on any
 * bytes (the first byte picks an object-only text or any value). A refused byte leaves the
 * state as it was; a text taken whole parses with jansson (an object where one is asked
 * for), unless a number in it is past a double's range, which jansson cannot hold. */
#include <jansson.h>
#include <string.h>

#include "fuzz_common.h"
#include "json_prefix.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int object_only = data[0] & 1;
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    tp_json_prefix s, before;
    tp_json_prefix_init(&s, object_only);
    size_t k = 0;
    for (; k < n; k++) {
        before = s;
        if (!tp_json_prefix_feed(&s, (unsigned char)text[k])) {
            if (memcmp(&s, &before, sizeof s)) abort();
            break;
        }
    }
    tp_json_prefix t;
    tp_json_prefix_init(&t, object_only);
    if (tp_json_prefix_feed_n(&t, text, n) != k || memcmp(&s, &t, sizeof s)) abort(); /* the same, all at once */
    if (k == n && tp_json_prefix_complete(&s)) {
        json_error_t err;
        json_t *v = json_loadb(text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (!v && json_error_code(&err) != json_error_numeric_overflow) abort();
        if (v && object_only && !json_is_object(v)) abort();
        json_decref(v);
    }
    return 0;
}
