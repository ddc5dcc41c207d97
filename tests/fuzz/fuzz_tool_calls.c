/* fuzz_tool_calls.c: the tool-call parsers on any completion text (the first byte picks
 * hermes, llama3_json or mistral, the rest is the text). Each text parses; every call has a
 * name and arguments that are JSON; where tools were called the content is a prefix of the
 * text (what came before the calls) or none; where not, the text (mistral's without its
 * [TOOL_CALLS]) is the content. */
#include <jansson.h>
#include <string.h>

#include "fuzz_common.h"
#include "tool_calls.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const tp_tool_parser p = (tp_tool_parser)(1 + data[0] % 3);
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    tp_tool_calls t;
    if (tp_tool_calls_parse(p, text, n, &t) != TP_OK) abort();
    for (size_t k = 0; k < t.n; k++) {
        json_t *v = json_loads(t.v[k].arguments, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (!t.v[k].name || !v) abort();
        json_decref(v);
        char id[64];
        tp_tool_call_id(p, t.v[k].name, 0, k, id, sizeof id);
        if (!id[0]) abort();
    }
    if (t.content && t.content_len > n) abort();
    if (t.n && !t.called) abort();
    if (t.called && t.content && memcmp(t.content, text, t.content_len)) abort();
    if (!t.called && p != TP_TOOL_PARSER_MISTRAL && (t.content_len != n || (n && memcmp(t.content, text, n)))) abort();
    if (!t.called && !t.content != !n) abort(); /* a text that called nothing is its content */
    tp_tool_calls_free(&t);
    return 0;
}
