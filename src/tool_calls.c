/*
 * tool_calls.c: vLLM's hermes, llama3_json and mistral tool-call parsers (their
 * extract_tool_calls, the whole completion at once, as vLLM 0.10 has them), on jansson.
 */
#include "tool_calls.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_internal.h" /* py_json: Python's json.dumps */

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define LLAMA_TAG "<|python_tag|>"
#define MISTRAL_TAG "[TOOL_CALLS]"

static const char *const names[] = {"none", "hermes", "llama3_json", "mistral"};

int tp_tool_parser_from_name(const char *name)
{
    for (int i = 1; i < (int)(sizeof names / sizeof names[0]); i++)
        if (name && !strcmp(name, names[i])) return i;
    return -1;
}

const char *tp_tool_parser_name(tp_tool_parser p)
{
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "none";
}

const char *tp_tool_parser_marker(tp_tool_parser p)
{
    return p == TP_TOOL_PARSER_HERMES        ? HERMES_OPEN
           : p == TP_TOOL_PARSER_LLAMA3_JSON ? LLAMA_TAG
           : p == TP_TOOL_PARSER_MISTRAL     ? MISTRAL_TAG
                                             : "";
}

tp_tool_parser tp_tool_parser_of_template(const char *src)
{
    if (!src) return TP_TOOL_PARSER_NONE;
    const int h = strstr(src, HERMES_OPEN) != NULL, l = strstr(src, LLAMA_TAG) != NULL,
              m = strstr(src, MISTRAL_TAG) != NULL;
    if (h + l + m != 1) return TP_TOOL_PARSER_NONE;
    return h ? TP_TOOL_PARSER_HERMES : l ? TP_TOOL_PARSER_LLAMA3_JSON : TP_TOOL_PARSER_MISTRAL;
}

void tp_tool_calls_free(tp_tool_calls *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->v[i].name);
        free(t->v[i].arguments);
    }
    free(t->v);
    free(t->content);
    memset(t, 0, sizeof *t);
}

static const char *find(const char *s, size_t n, const char *needle)
{
    const size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

/* The whitespace character at s[i]: its length in bytes, or 0. Unicode's White_Space, which
 * the regex module's \s matches; str.strip() (strip) also takes U+001C..U+001F. */
static size_t space_at(const char *s, size_t n, size_t i, int strip)
{
    const unsigned char *u = (const unsigned char *)s + i;
    const size_t left = n - i;
    if (i >= n) return 0;
    if (u[0] == ' ' || (u[0] >= '\t' && u[0] <= '\r') || (strip && u[0] >= 0x1c && u[0] <= 0x1f)) return 1;
    if (left >= 2 && u[0] == 0xc2 && (u[1] == 0x85 || u[1] == 0xa0)) return 2; /* U+0085, U+00A0 */
    if (left < 3) return 0;
    if (u[0] == 0xe1 && u[1] == 0x9a && u[2] == 0x80) return 3; /* U+1680 */
    if (u[0] == 0xe2 && u[1] == 0x80 && (u[2] <= 0x8a || u[2] == 0xa8 || u[2] == 0xa9 || u[2] == 0xaf))
        return u[2] >= 0x80 ? 3 : 0; /* U+2000..200A, U+2028, U+2029, U+202F */
    if (u[0] == 0xe2 && u[1] == 0x81 && u[2] == 0x9f) return 3; /* U+205F */
    if (u[0] == 0xe3 && u[1] == 0x80 && u[2] == 0x80) return 3; /* U+3000 */
    return 0;
}

/* str.strip() of s[*lo..*hi) */
static void py_strip(const char *s, size_t *lo, size_t *hi)
{
    for (size_t k; *lo < *hi && (k = space_at(s, *hi, *lo, 1));) *lo += k;
    while (*hi > *lo) {
        size_t start = *hi - 1; /* the last character's first byte */
        while (start > *lo && ((unsigned char)s[start] & 0xc0) == 0x80 && *hi - start < 4) start--;
        if (space_at(s, *hi, start, 1) != *hi - start) break;
        *hi = start;
    }
}

/* json.loads of s[0..n) (whitespace around allowed), or NULL: a failed parse (jansson also
 * refuses what Python reads, tool_calls.h says which; such a call then stays text) */
static json_t *load(const char *s, size_t n)
{
    return json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
}

typedef struct calls {
    tp_tool_call *v;
    size_t n, cap;
    int oom;
} calls;

/* json.dumps(value, ensure_ascii=False) */
static char *dumps(json_t *value)
{
    sbuf b = {0};
    const json_opts o = {0, NULL, 0, ", ", ": ", 0};
    py_json(&b, value, &o, 0);
    if (b.oom || !b.s) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* One {"name": str, key: value} object as a call; 0 where it is not one (vLLM's KeyError or
 * validation error: the whole text then has no calls) */
static int add_call(calls *c, json_t *obj, const char *key, const char *other_key)
{
    json_t *name = json_is_object(obj) ? json_object_get(obj, "name") : NULL;
    json_t *args = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    if (!args && other_key && json_is_object(obj)) args = json_object_get(obj, other_key);
    if (!json_is_string(name) || !args || memchr(json_string_value(name), '\0', json_string_length(name))) return 0;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 4;
        tp_tool_call *v = realloc(c->v, cap * sizeof *v);
        if (!v) return c->oom = 1, 0;
        c->v = v;
        c->cap = cap;
    }
    tp_tool_call *t = &c->v[c->n];
    t->name = strdup(json_string_value(name));
    t->arguments = dumps(args);
    if (!t->name || !t->arguments) {
        free(t->name);
        free(t->arguments);
        return c->oom = 1, 0;
    }
    c->n++;
    return 1;
}

/* <tool_call>(.*?)</tool_call>|<tool_call>(.*), each json.loads'd */
static int hermes(calls *c, const char *s, size_t n, size_t *content_len)
{
    const char *first = find(s, n, HERMES_OPEN);
    if (!first) return 0;
    const size_t lo = strlen(HERMES_OPEN), lc = strlen(HERMES_CLOSE);
    for (const char *p = first; p; ) {
        const char *body = p + lo, *end = s + n;
        const char *close = find(body, (size_t)(end - body), HERMES_CLOSE);
        const char *stop = close ? close : end;
        json_t *v = load(body, (size_t)(stop - body));
        const int ok = v && add_call(c, v, "arguments", NULL);
        json_decref(v);
        if (!ok) return 0;
        p = close ? find(close + lc, (size_t)(end - close - lc), HERMES_OPEN) : NULL;
    }
    *content_len = (size_t)(first - s);
    return 1;
}

/* The regex {[^{}]*(?:{[^{}]*}[^{}]*)*} at s[i] (an object whose braces nest at most two deep,
 * strings not told apart): the end after its closing brace, or 0 */
static size_t brace_object(const char *s, size_t n, size_t i)
{
    if (i >= n || s[i] != '{') return 0;
    int depth = 1;
    for (size_t j = i + 1; j < n; j++) {
        if (s[j] == '{' && ++depth > 2) return 0;
        if (s[j] == '}' && --depth == 0) return j + 1;
    }
    return 0;
}

/* \s* at s[i] */
static size_t skip_space(const char *s, size_t n, size_t i)
{
    for (size_t k; (k = space_at(s, n, i, 0));) i += k;
    return i;
}

/* vLLM 0.10's llama3_json: the first match of the regex above followed by any number of
 * \s*;\s* and another such object, anywhere in the text; split at every ";", each piece
 * stripped and (unless empty) json.loads'd; no content */
static int llama3_json(calls *c, const char *s, size_t n)
{
    size_t start = 0, end = 0;
    for (size_t i = 0; i < n && !end; i++)
        if (s[i] == '{' && (end = brace_object(s, n, i))) start = i;
    if (!end) return 0;
    for (;;) { /* (?:\s*;\s*OBJECT)*, greedy: each repetition whole or not at all */
        size_t j = skip_space(s, n, end);
        if (j >= n || s[j] != ';') break;
        size_t k = brace_object(s, n, skip_space(s, n, j + 1));
        if (!k) break;
        end = k;
    }
    for (size_t a = start; a < end;) {
        size_t b = a;
        while (b < end && s[b] != ';') b++;
        size_t lo = a, hi = b;
        py_strip(s, &lo, &hi);
        if (hi > lo) {
            json_t *v = load(s + lo, hi - lo);
            const int ok = v && add_call(c, v, "arguments", "parameters");
            json_decref(v);
            if (!ok) return 0;
        }
        a = b + 1;
    }
    return 1;
}

/* [TOOL_CALLS] anywhere: what is left without it, stripped, is a JSON array of calls (or its
 * first "[{" to its last "}]" is). *rest: that text, the content where the calls fail. */
static int mistral(calls *c, const char *s, size_t n, size_t *content_len, char **rest, size_t *rest_len)
{
    const char *first = find(s, n, MISTRAL_TAG);
    if (!first) return 0;
    const size_t lt = strlen(MISTRAL_TAG);
    char *t = malloc(n + 1);
    if (!t) return c->oom = 1, 0;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        if (i + lt <= n && !memcmp(s + i, MISTRAL_TAG, lt)) {
            i += lt;
            continue;
        }
        t[m++] = s[i++];
    }
    size_t a = 0;
    py_strip(t, &a, &m);
    memmove(t, t + a, m - a);
    m -= a;
    t[m] = '\0';
    *rest = t;
    *rest_len = m;
    json_t *arr = load(t, m);
    if (!arr) { /* the regex \[{.*}\] (DOTALL): the first "[{" to the last "}]" */
        const char *open = find(t, m, "[{");
        const char *close = NULL;
        for (size_t i = m; open && i >= 2; i--)
            if (t[i - 2] == '}' && t[i - 1] == ']') {
                close = t + i - 2;
                break;
            }
        if (open && close && close >= open + 2) arr = load(open, (size_t)(close + 2 - open));
    }
    /* "for raw_function_call in function_call_arr": a list's items must each be a call; an
     * empty list, object or string iterates nothing (called, no calls); anything else fails */
    int ok = json_is_array(arr) || (json_is_object(arr) && json_object_size(arr) == 0) ||
             (json_is_string(arr) && json_string_length(arr) == 0);
    for (size_t i = 0; ok && json_is_array(arr) && i < json_array_size(arr); i++)
        ok = add_call(c, json_array_get(arr, i), "arguments", NULL);
    json_decref(arr);
    *content_len = (size_t)(first - s);
    return ok;
}

tp_status tp_tool_calls_parse(tp_tool_parser p, const char *text, size_t len, tp_tool_calls *out)
{
    memset(out, 0, sizeof *out);
    calls c = {0};
    size_t content_len = 0, rest_len = 0;
    char *rest = NULL;
    int found = 0;
    if (text) {
        if (p == TP_TOOL_PARSER_HERMES) found = hermes(&c, text, len, &content_len);
        else if (p == TP_TOOL_PARSER_LLAMA3_JSON) found = llama3_json(&c, text, len);
        else if (p == TP_TOOL_PARSER_MISTRAL) found = mistral(&c, text, len, &content_len, &rest, &rest_len);
    }
    if (c.oom) found = 0;
    const char *from = text;
    if (found) {
        out->called = 1;
        out->v = c.v;
        out->n = c.n;
        c.v = NULL;
        c.n = 0;
    } else if (rest && rest_len > 0) { /* mistral's text without its tag, where it is not empty */
        from = rest;
        content_len = rest_len;
    } else {
        content_len = len;
    }
    tp_status st = TP_OK;
    if (content_len > 0) {
        out->content = malloc(content_len + 1);
        if (out->content) {
            memcpy(out->content, from, content_len);
            out->content[content_len] = '\0';
            out->content_len = content_len;
        }
    }
    if (c.oom || (content_len > 0 && !out->content)) {
        st = tp_error(TP_ERR_OOM, "out of memory parsing tool calls");
        tp_tool_calls_free(out);
    }
    for (size_t i = 0; i < c.n; i++) {
        free(c.v[i].name);
        free(c.v[i].arguments);
    }
    free(c.v);
    free(rest);
    return st;
}

/* Where the last whole item of the JSON list in s[0..n) ends (its closing brace + 1), 0
 * where none is whole: the bytes are a list's start, as guided decoding writes them. */
static size_t last_whole_item(const char *s, size_t n)
{
    size_t end = 0;
    int depth = 0, in_string = 0;
    for (size_t i = 0; i < n; i++) {
        const char ch = s[i];
        if (in_string) {
            if (ch == '\\') i++;
            else if (ch == '"') in_string = 0;
        } else if (ch == '"')
            in_string = 1;
        else if (ch == '[' || ch == '{')
            depth++;
        else if (ch == ']' || ch == '}') {
            depth--;
            if (depth == 1) end = i + 1;
        }
    }
    return end;
}

tp_status tp_tool_calls_parse_list(const char *text, size_t len, tp_tool_calls *out)
{
    memset(out, 0, sizeof *out);
    out->called = 1;
    calls c = {0};
    json_t *list = load(text, len);
    if (!list) { /* cut short (max_tokens): the calls written whole */
        const size_t end = last_whole_item(text, len);
        char *whole = end ? malloc(end + 2) : NULL;
        if (whole) {
            memcpy(whole, text, end);
            memcpy(whole + end, "]", 2);
            list = load(whole, end + 1);
        }
        free(whole);
        if (end && !whole) c.oom = 1;
    }
    for (size_t i = 0; json_is_array(list) && i < json_array_size(list); i++)
        if (!add_call(&c, json_array_get(list, i), "parameters", NULL) && c.oom) break;
    json_decref(list);
    if (c.oom) {
        for (size_t i = 0; i < c.n; i++) {
            free(c.v[i].name);
            free(c.v[i].arguments);
        }
        free(c.v);
        return tp_error(TP_ERR_OOM, "out of memory parsing tool calls");
    }
    out->v = c.v;
    out->n = c.n;
    return TP_OK;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

void tp_tool_call_id(tp_tool_parser p, const char *request_id, int choice, size_t call, char *out, size_t cap)
{
    uint64_t h = fnv(1469598103934665603ull, request_id, strlen(request_id));
    char tail[48];
    snprintf(tail, sizeof tail, "/%d/%zu", choice, call);
    h = fnv(h, tail, strlen(tail));
    const uint64_t h2 = fnv(h ^ 0x9e3779b97f4a7c15ull, tail, strlen(tail));
    if (p == TP_TOOL_PARSER_MISTRAL) {
        static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        char id[10];
        uint64_t x = h;
        for (int i = 0; i < 9; i++, x /= 62) id[i] = digits[x % 62];
        id[9] = '\0';
        snprintf(out, cap, "%s", id);
        return;
    }
    snprintf(out, cap, "chatcmpl-tool-%016llx%016llx", (unsigned long long)h, (unsigned long long)h2);
}
