/*
 * tool_calls.h: the tool calls in a chat completion's text, as vLLM 0.10's tool-call parsers
 * (--tool-call-parser; their extract_tool_calls and its use in serving_chat) find them when a
 * request has tools and "tool_choice": "auto":
 *  - hermes (Hermes 2 Pro / 3, Qwen 2.5 / 3): <tool_call>{"name": ..., "arguments": ...}</tool_call>
 *    blocks, the last one maybe unclosed; the content is the text before the first;
 *  - llama3_json (Llama 3.1 / 3.2 / 3.3): the first {...} anywhere in the text whose braces nest
 *    at most two deep (vLLM's regex), with any more joined by ";", each {"name": ...,
 *    "arguments" or "parameters": ...}; no content;
 *  - mistral (Mistral 7B v0.3, Nemo, Small with tokenizer.json): without its [TOOL_CALLS] the
 *    stripped text is a JSON list of {"name": ..., "arguments": ...} (else its first "[{" to its
 *    last "}]" is); the content is the text before [TOOL_CALLS].
 * As in vLLM, a text whose calls do not all parse has none: it stays content (for mistral,
 * without its [TOOL_CALLS] and the spaces around, unless that leaves nothing). Each call's
 * arguments are re-written as Python's json.dumps(ensure_ascii=False) writes them. Where
 * this differs from vLLM 0.10: JSON that Python reads and jansson does not (NaN, Infinity,
 * integers beyond 64 bits, lone surrogates, a NUL in a key) makes no call; its llama3_json
 * wrote non-ASCII arguments as \u escapes, fixed in later versions as here; and as in later
 * versions (0.11), hermes keeps special tokens and "parallel_tool_calls": false keeps the
 * first call (completion.c, engine.c); an explicit "tool_choice": null is the default
 * ("auto" with tools), as OpenAI's null and every other field's (0.10 gave text).
 */
#ifndef TP_TOOL_CALLS_H
#define TP_TOOL_CALLS_H

#include <stddef.h>

#include "status.h"

typedef enum tp_tool_parser {
    TP_TOOL_PARSER_NONE,
    TP_TOOL_PARSER_HERMES,
    TP_TOOL_PARSER_LLAMA3_JSON,
    TP_TOOL_PARSER_MISTRAL,
} tp_tool_parser;

/* "hermes", "llama3_json", "mistral" (vLLM's names); -1 for another */
int tp_tool_parser_from_name(const char *name);
const char *tp_tool_parser_name(tp_tool_parser p);
/* The parser whose marker the chat template writes (<tool_call>, <|python_tag|>,
 * [TOOL_CALLS]), or NONE (no template, or none of them, or more than one). */
tp_tool_parser tp_tool_parser_of_template(const char *template_source);
/* That marker: "<tool_call>", "<|python_tag|>", "[TOOL_CALLS]" ("" for NONE) */
const char *tp_tool_parser_marker(tp_tool_parser p);

typedef struct tp_tool_call {
    char *name;      /* NUL-terminated (a name holding a NUL is no call) */
    char *arguments; /* JSON text */
} tp_tool_call;

typedef struct tp_tool_calls {
    int called;      /* vLLM's tools_called: the finish reason is then "tool_calls" */
    tp_tool_call *v; /* the calls (none where not called; none either for mistral's "[]") */
    size_t n;
    char *content; /* called: what came before the calls, NULL for none (JSON null); else the
                    * message's text (the completion's, or mistral's without its tag) */
    size_t content_len;
} tp_tool_calls;

/* Parse text[0..len) with parser p (NONE: no calls, the text is the content). Fails only
 * for memory. */
tp_status tp_tool_calls_parse(tp_tool_parser p, const char *text, size_t len, tp_tool_calls *out);
void tp_tool_calls_free(tp_tool_calls *t);

/* "tool_choice": "required" (vLLM's): the text is a JSON list of {"name": ..., "parameters":
 * ...}, as guided decoding holds it; each item is a call (its arguments the parameters, as
 * json.dumps writes them), and a list cut short (max_tokens) gives the calls written whole.
 * Always called, with no content. Fails only for memory. */
tp_status tp_tool_calls_parse_list(const char *text, size_t len, tp_tool_calls *out);

/* A call's id, the same for the same (request id, choice, call) in every run: vLLM's shape,
 * "chatcmpl-tool-" and 32 hex digits; for mistral 9 letters and digits, the only ids
 * Mistral's chat templates take back. */
void tp_tool_call_id(tp_tool_parser p, const char *request_id, int choice, size_t call, char *out, size_t cap);

#endif
