/*
 * request_fields.c: one input line's fields into its tp_request, for requests.c's dialects:
 * the id, the prompt (text, token ids or chat messages), tools, and every per-request
 * setting (sampling, stop strings and ids, logit bias, allowed and bad words, guided
 * decoding and response formats, logprobs), each checked for type and range. A field that
 * cannot be run records the line's error (rq_fail: the first one, "line N: " and what was
 * wrong, what is allowed); request_line.h lists what requests.c calls.
 */
#include "requests.h"
#include "request_line.h"
#include "json_schema.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define MAX_STOP 16          /* stop strings per request */
#define MAX_MESSAGE_DEPTH 64 /* nesting inside one chat message */

/* ------------------------------------------------------------------------------------
 * Small helpers */

char *rq_dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* The length of the valid UTF-8 prefix of s (== n when all of it is valid). Rejects
 * stray continuation bytes, truncated sequences, overlong forms (C0, C1, E0 80..9F,
 * F0 80..8F), UTF-16 surrogates (ED A0..BF) and code points above U+10FFFF. */
size_t rq_utf8_valid_prefix(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) { /* ASCII fast path */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c == 0xE0) k = 2, lo = 0xA0;
        else if (c >= 0xE1 && c <= 0xEC) k = 2;
        else if (c == 0xED) k = 2, hi = 0x9F;
        else if (c >= 0xEE && c <= 0xEF) k = 2;
        else if (c == 0xF0) k = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) k = 3;
        else if (c == 0xF4) k = 3, hi = 0x8F;
        else return i;
        if (n - i <= k) return i; /* truncated at the end of the line */
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return i;
        i += k + 1;
    }
    return n;
}

/* s[0..n) for a message: quoted, escaped like JSON, cut to about 48 bytes. */
const char *rq_quote(char buf[QUOTE_CAP], const char *s, size_t n)
{
    size_t o = 0, i = 0, show = n <= 48 ? n : 40;
    if (show < n) /* do not cut a UTF-8 sequence */
        while (show > 0 && ((unsigned char)s[show] & 0xC0) == 0x80) show--;
    buf[o++] = '"';
    for (; i < show; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c & 0xC0) != 0x80 && o >= QUOTE_CAP - 32) break; /* full: stop at a character */
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c == '\n') {
            buf[o++] = '\\';
            buf[o++] = 'n';
        } else if (c < 0x20 || c == 0x7f) {
            o += (size_t)snprintf(buf + o, QUOTE_CAP - o, "\\u%04x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    buf[o++] = '"';
    if (i < n) snprintf(buf + o, QUOTE_CAP - o, "... (%zu bytes)", n);
    else buf[o] = '\0';
    return buf;
}

/* A JSON real as short as it round-trips, always with a '.' or an exponent (5.0, 1e+20),
 * so it never looks like an integer. */
static void fmt_double(char *buf, size_t cap, double d)
{
    snprintf(buf, cap, "%.15g", d);
    if (strtod(buf, NULL) != d) snprintf(buf, cap, "%.17g", d);
    if (!strpbrk(buf, ".en")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

/* A JSON value for a message. */
const char *rq_repr(char buf[QUOTE_CAP], const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return rq_quote(buf, json_string_value(v), json_string_length(v));
    case JSON_INTEGER: snprintf(buf, QUOTE_CAP, "%lld", (long long)json_integer_value(v)); return buf;
    case JSON_REAL: fmt_double(buf, QUOTE_CAP, json_real_value(v)); return buf;
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "?";
}

/* A field that is absent or null reads as NULL. */
json_t *rq_get(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* ------------------------------------------------------------------------------------
 * One line */




/* Record the line's first error; later ones are dropped (one message per line). */
int rq_fail(line_ctx *c, const char *code, const char *fmt, ...)
{
    if (c->r->error_code) return BAD;
    char buf[1024];
    int k = snprintf(buf, sizeof buf, "line %lld: ", (long long)c->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + k, sizeof buf - (size_t)k, fmt, ap);
    va_end(ap);
    c->r->error_message = strdup(buf);
    if (!c->r->error_message) return OOM;
    c->r->error_code = code;
    return BAD;
}

static int set_standin(line_ctx *c, const char *form, int kind)
{
    char buf[32];
    snprintf(buf, sizeof buf, form, (long long)c->line);
    free(c->r->id);
    c->r->id = strdup(buf);
    c->standin = kind;
    return c->r->id ? OK : OOM;
}

int rq_set_standin_id(line_ctx *c) { return set_standin(c, "%lld", STANDIN_LINE); }
int rq_set_unreadable_id(line_ctx *c) { return set_standin(c, "line %lld", STANDIN_UNREADABLE); }

/* An id from a JSON value: a non-empty string without NUL, or an integer (as decimal).
 * On anything else "line N" stands in (rq_set_unreadable_id) and an error is recorded. */
int rq_read_id(line_ctx *c, const char *key, const json_t *v, int allow_int)
{
    char b[QUOTE_CAP];
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (n == 0) {
            TRY(rq_set_unreadable_id(c));
            return rq_fail(c, E_REQUEST, "\"%s\" is empty", key);
        }
        if (memchr(s, '\0', n)) {
            TRY(rq_set_unreadable_id(c));
            return rq_fail(c, E_REQUEST, "\"%s\" %s holds a NUL character (\\u0000)", key, rq_quote(b, s, n));
        }
        c->r->id = rq_dup_n(s, n);
        return c->r->id ? OK : OOM;
    }
    if (allow_int && json_is_integer(v)) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        c->r->id = strdup(buf);
        return c->r->id ? OK : OOM;
    }
    if (allow_int && c->lossy && json_is_real(v)) { /* an integer, read as a real */
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) <= 9007199254740992.0) {
            char buf[32];
            snprintf(buf, sizeof buf, "%.0f", d);
            c->r->id = strdup(buf);
            return c->r->id ? OK : OOM;
        }
    }
    TRY(rq_set_unreadable_id(c));
    if (!v) return rq_fail(c, E_REQUEST, "\"%s\" is required", key);
    return rq_fail(c, E_REQUEST, "\"%s\" must be a string%s, not %s", key,
                   allow_int ? " or an integer" : "", rq_repr(b, v));
}

/* An integer field in [lo, hi]; range is how a message shows that interval. */
int rq_read_int(line_ctx *c, const json_t *o, const char *key, int64_t lo, int64_t hi,
                    const char *range, int *has, int64_t *out)
{
    json_t *v = rq_get(o, key);
    char b[QUOTE_CAP];
    *has = 0;
    if (!v) return OK;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < lo || x > hi)
            return rq_fail(c, E_REQUEST, "\"%s%s\" %lld is outside %s", c->prefix, key, (long long)x, range);
        *out = x;
        *has = 1;
        return OK;
    }
    if (c->lossy && json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) {
        double d = json_real_value(v);
        if (!(d >= (double)lo && d < (double)hi + 1.0)) /* shown as the integer it was */
            return rq_fail(c, E_REQUEST, "\"%s%s\" %.0f is outside %s", c->prefix, key, d, range);
        *out = (int64_t)d; /* the line is an error anyway (see parse_line) */
        *has = 1;
        return OK;
    }
    return rq_fail(c, E_REQUEST, "\"%s%s\" must be an integer in %s, not %s", c->prefix, key, range,
                   rq_repr(b, v));
}

static int read_real(line_ctx *c, const json_t *o, const char *key, double lo, double hi,
                     int lo_open, const char *range, int *has, double *out)
{
    json_t *v = rq_get(o, key);
    char b[QUOTE_CAP];
    *has = 0;
    if (!v) return OK;
    if (!json_is_number(v))
        return rq_fail(c, E_REQUEST, "\"%s%s\" must be a number in %s, not %s", c->prefix, key, range,
                       rq_repr(b, v));
    double d = json_number_value(v);
    if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
        return rq_fail(c, E_REQUEST, "\"%s%s\" %s is outside %s", c->prefix, key, rq_repr(b, v), range);
    *out = d;
    *has = 1;
    return OK;
}

static int read_bool(line_ctx *c, const json_t *o, const char *key, int *has, int *out)
{
    json_t *v = rq_get(o, key);
    char b[QUOTE_CAP];
    *has = 0;
    if (!v) return OK;
    if (!json_is_boolean(v))
        return rq_fail(c, E_REQUEST, "\"%s%s\" must be true or false, not %s", c->prefix, key, rq_repr(b, v));
    *out = json_is_true(v);
    *has = 1;
    return OK;
}

/* A non-empty array of token ids in [0, vocab) into a fresh array. */
int rq_read_token_ids(line_ctx *c, const json_t *v, const char *key, int allow_empty,
                          int32_t **out, int32_t *n_out)
{
    char b[QUOTE_CAP];
    if (!json_is_array(v))
        return rq_fail(c, E_REQUEST, "\"%s%s\" must be an array of token ids, not %s", c->prefix, key,
                       rq_repr(b, v));
    size_t k = json_array_size(v);
    if (k == 0 && !allow_empty)
        return rq_fail(c, E_REQUEST, "\"%s%s\" is an empty array", c->prefix, key);
    if (k > INT32_MAX) return rq_fail(c, E_REQUEST, "\"%s%s\" holds %zu ids, too many", c->prefix, key, k);
    int32_t *ids = malloc((k ? k : 1) * sizeof *ids);
    if (!ids) return OOM;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(v, i);
        double d = 0;
        int is_int = json_is_integer(e);
        if (!is_int && c->lossy && json_is_real(e)) {
            d = json_real_value(e);
            is_int = d == floor(d);
        } else if (is_int) {
            d = (double)json_integer_value(e);
        }
        int in_range = is_int && (json_is_integer(e) ? json_integer_value(e) >= 0 &&
                                                           json_integer_value(e) < c->vocab
                                                     : d >= 0 && d < (double)c->vocab);
        if (!in_range) {
            free(ids);
            if (!is_int)
                return rq_fail(c, E_REQUEST, "\"%s%s\"[%zu] must be an integer token id, not %s",
                               c->prefix, key, i, rq_repr(b, e));
            return rq_fail(c, E_REQUEST, "\"%s%s\"[%zu] %s is outside [0, %lld) (the vocabulary)",
                        c->prefix, key, i, rq_repr(b, e), (long long)c->vocab);
        }
        ids[i] = (int32_t)(json_is_integer(e) ? json_integer_value(e) : (json_int_t)d);
    }
    if (k == 0) {
        free(ids);
        ids = NULL;
    }
    *out = ids;
    *n_out = (int32_t)k;
    return OK;
}

int rq_set_prompt(line_ctx *c, const json_t *v, const char *key)
{
    char b[QUOTE_CAP];
    if (!json_is_string(v))
        return rq_fail(c, E_REQUEST, "\"%s%s\" must be a string, not %s", c->prefix, key, rq_repr(b, v));
    if (json_string_length(v) == 0) return rq_fail(c, E_REQUEST, "\"%s%s\": the prompt is empty", c->prefix, key);
    c->r->prompt_len = json_string_length(v);
    c->r->prompt = rq_dup_n(json_string_value(v), c->r->prompt_len);
    return c->r->prompt ? OK : OOM;
}

/* Nesting depth of v, or more than limit (stops counting there: no deep recursion). */
static int depth_over(const json_t *v, int limit)
{
    if (limit < 0) return 1;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (depth_over(json_array_get(v, i), limit - 1)) return 1;
    } else if (json_is_object(v)) {
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) if (depth_over(e, limit - 1)) return 1;
    }
    return 0;
}

/* A message's content: a string, null (assistant only), or an array of text parts
 * ({"type": "text", "text": "..."}), joined with '\n' as vLLM does. *out is new. */
static int read_content(line_ctx *c, const json_t *m, size_t i, const char *role, json_t **out)
{
    json_t *v = rq_get(m, "content");
    char b[QUOTE_CAP];
    if (!v) {
        if (strcmp(role, "assistant"))
            return rq_fail(c, E_REQUEST, "\"%smessages\"[%zu].content is missing (only an assistant message may have no content)",
                           c->prefix, i);
        *out = json_null();
        return OK;
    }
    if (json_is_string(v)) {
        *out = json_incref(v);
        return OK;
    }
    if (!json_is_array(v))
        return rq_fail(c, E_REQUEST, "\"%smessages\"[%zu].content must be a string or an array of text parts, not %s",
                       c->prefix, i, rq_repr(b, v));
    size_t total = 0, k = json_array_size(v);
    for (size_t j = 0; j < k; j++) {
        json_t *part = json_array_get(v, j), *type = json_object_get(part, "type"),
               *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text))
            return rq_fail(c, E_REQUEST,
                           "\"%smessages\"[%zu].content[%zu] is not a text part {\"type\": \"text\", \"text\": \"...\"}: only text content is supported",
                           c->prefix, i, j);
        total += json_string_length(text) + 1;
    }
    char *s = malloc(total + 1), *p = s;
    if (!s) return OOM;
    for (size_t j = 0; j < k; j++) {
        json_t *text = json_object_get(json_array_get(v, j), "text");
        if (j) *p++ = '\n';
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    *out = json_stringn_nocheck(s, (size_t)(p - s));
    free(s);
    return *out ? OK : OOM;
}

/* "messages": a non-empty array of {"role": string, "content": ...} (other keys kept),
 * stored re-serialized (compact, UTF-8) in messages_json. */
int rq_read_messages(line_ctx *c, const json_t *v)
{
    char b[QUOTE_CAP];
    if (!json_is_array(v) || json_array_size(v) == 0)
        return rq_fail(c, E_REQUEST, "\"%smessages\" must be a non-empty array of messages, not %s", c->prefix,
                       json_is_array(v) ? "an empty array" : rq_repr(b, v));
    json_t *out = json_array();
    if (!out) return OOM;
    int rc = OK;
    for (size_t i = 0; i < json_array_size(v) && rc == OK; i++) {
        json_t *m = json_array_get(v, i), *role, *content = NULL, *nm;
        if (!json_is_object(m)) {
            rc = rq_fail(c, E_REQUEST, "\"%smessages\"[%zu] must be an object, not %s", c->prefix, i, rq_repr(b, m));
            break;
        }
        role = rq_get(m, "role");
        if (!json_is_string(role) || json_string_length(role) == 0 ||
            memchr(json_string_value(role), '\0', json_string_length(role))) {
            rc = rq_fail(c, E_REQUEST, "\"%smessages\"[%zu].role must be a non-empty string, not %s", c->prefix, i,
                         role ? rq_repr(b, role) : "missing");
            break;
        }
        rc = read_content(c, m, i, json_string_value(role), &content);
        if (rc) break;
        nm = json_object();
        if (!nm) json_decref(content);
        /* json_*_new take their argument even when they fail */
        if (!nm || json_array_append_new(out, nm) || json_object_set(nm, "role", role) ||
            json_object_set_new(nm, "content", content)) {
            rc = OOM;
            break;
        }
        const char *k;
        json_t *e;
        json_object_foreach(m, k, e)
        {
            if (!strcmp(k, "role") || !strcmp(k, "content")) continue;
            if (depth_over(e, MAX_MESSAGE_DEPTH)) {
                rc = rq_fail(c, E_REQUEST, "\"%smessages\"[%zu].%s is nested more than %d deep", c->prefix, i,
                             rq_quote(b, k, strlen(k)), MAX_MESSAGE_DEPTH);
                break;
            }
            if (json_object_set(nm, k, e)) {
                rc = OOM;
                break;
            }
        }
    }
    if (rc == OK) {
        c->r->messages_json = json_dumps(out, JSON_COMPACT);
        if (!c->r->messages_json) rc = OOM;
    }
    json_decref(out);
    return rc;
}

/* Whether a string or key anywhere in v holds a NUL (the chat template's values cannot) */
static int holds_nul(const json_t *v)
{
    if (json_is_string(v)) return memchr(json_string_value(v), '\0', json_string_length(v)) != NULL;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (holds_nul(json_array_get(v, i))) return 1;
    } else if (json_is_object(v)) {
        for (void *it = json_object_iter((json_t *)v); it; it = json_object_iter_next((json_t *)v, it))
            if (memchr(json_object_iter_key(it), '\0', json_object_iter_key_len(it)) ||
                holds_nul(json_object_iter_value(it)))
                return 1;
    }
    return 0;
}

/* "tools": OpenAI's tool definitions ({"type": "function", "function": {"name": ...}}), which
 * the chat template renders into the prompt (transformers' apply_chat_template(tools=); an
 * empty list too). "tool_choice": "none": the completion is text, as vLLM's; "auto" (OpenAI's
 * default with tools): the engine parses tool calls out of the text (--tool-call-parser);
 * a named function: the text is its arguments, held to its "parameters" schema, and is
 * written as one call to it (vLLM's way); "required": the text is a list of calls, each a
 * tool's name and its parameters (vLLM's schema), at least one. A tool_choice other than
 * "none" without tools is an error, as OpenAI's and vLLM's.
 * "parallel_tool_calls": false keeps the first call ("required": makes the list one call). */
static int read_schema(line_ctx *c, const json_t *v, const char *key, const struct tp_schema **out);

/* whether v holds {"$ref": "#"} (a schema's reference to its own root) */
static int refers_to_root(const json_t *v)
{
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (refers_to_root(json_array_get(v, i))) return 1;
        return 0;
    }
    if (!json_is_object(v)) return 0;
    const json_t *r = json_object_get(v, "$ref");
    if (json_is_string(r) && !strcmp(json_string_value(r), "#")) return 1;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x)
    if (refers_to_root(x)) return 1;
    return 0;
}

/* vLLM's schema for "tool_choice": "required": {"type": "array", "minItems": 1, "items":
 * {"type": "object", "anyOf": [{"properties": {"name": {"type": "string", "enum": [NAME]},
 * "parameters": PARAMETERS}, "required": ["name", "parameters"]}, ...]}}, each tool's $defs
 * (and definitions) lifted to the top, where its $refs find them */
static int required_schema(line_ctx *c, const json_t *tools, int single, json_t **out)
{
    char b[QUOTE_CAP];
    int rc = OOM;
    json_t *any = json_array(), *defs = json_object(), *definitions = json_object(), *p = NULL;
    json_t *s = any ? json_pack("{s:s, s:i, s:{s:s, s:O}}", "type", "array", "minItems", 1, "items", "type", "object",
                                "anyOf", any)
                    : NULL;
    if (!s || !defs || !definitions || (single && json_object_set_new(s, "maxItems", json_integer(1)))) goto out;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *fn = rq_get(json_array_get(tools, i), "function"), *params = rq_get(fn, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params)) {
            rc = rq_fail(c, E_REQUEST, "\"%stools\"[%zu].function.parameters must be a JSON schema object, not %s",
                         c->prefix, i, rq_repr(b, params));
            goto out;
        }
        if (refers_to_root(params)) {
            rc = rq_fail(c, E_REQUEST, "\"%stools\"[%zu].function.parameters refers to itself as \"#\", which "
                         "\"tool_choice\": \"required\" cannot keep apart from the other tools' (use \"#/$defs/...\")",
                         c->prefix, i);
            goto out;
        }
        p = json_is_object(params) ? json_copy(params) : json_pack("{s:s, s:{}}", "type", "object", "properties");
        if (!p) goto out;
        const char *boxes[] = {"$defs", "definitions"};
        json_t *lifted[] = {defs, definitions};
        for (int k = 0; k < 2; k++) {
            const char *name;
            json_t *def;
            json_object_foreach(rq_get(p, boxes[k]), name, def)
            {
                json_t *have = json_object_get(lifted[k], name);
                if (have && !json_equal(have, def)) {
                    rc = rq_fail(c, E_REQUEST, "\"%stools\" give two schemas named %s in %s; \"tool_choice\": "
                                 "\"required\" puts every tool's in one", c->prefix, rq_quote(b, name, strlen(name)), boxes[k]);
                    goto out;
                }
                json_object_set(lifted[k], name, def);
            }
            json_object_del(p, boxes[k]);
        }
        json_t *branch = json_pack("{s:{s:{s:s, s:[O]}, s:O}, s:[s, s]}", "properties", "name", "type", "string", "enum",
                                   rq_get(fn, "name"), "parameters", p, "required", "name", "parameters");
        json_decref(p);
        p = NULL;
        if (!branch || json_array_append_new(any, branch)) goto out;
    }
    if ((json_object_size(defs) && json_object_set(s, "$defs", defs)) ||
        (json_object_size(definitions) && json_object_set(s, "definitions", definitions)))
        goto out;
    *out = s;
    s = NULL;
    rc = OK;
out:
    json_decref(p);
    json_decref(s);
    json_decref(any);
    json_decref(defs);
    json_decref(definitions);
    return rc;
}

int rq_read_tools(line_ctx *c, const json_t *o)
{
    char b[QUOTE_CAP];
    const char *p = c->prefix;
    json_t *v = rq_get(o, "tools"), *choice = rq_get(o, "tool_choice");
    if (choice && json_is_null(choice)) choice = NULL;
    const int none = json_is_string(choice) && !strcmp(json_string_value(choice), "none");
    const int valid = !choice || (json_is_string(choice) && (none || !strcmp(json_string_value(choice), "auto") ||
                                                             !strcmp(json_string_value(choice), "required"))) ||
                      (json_is_object(choice) && json_is_object(rq_get(choice, "function")));
    if (!valid)
        return rq_fail(c, E_REQUEST, "\"%stool_choice\" must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}, not %s", p, rq_repr(b, choice));
    if (v && json_is_null(v)) v = NULL;
    if (!v || (json_is_array(v) && json_array_size(v) == 0)) {
        if (choice && !none)
            return rq_fail(c, E_REQUEST, "\"%stool_choice\" %s needs \"tools\"", p, rq_repr(b, choice));
        if (!v || !c->r->messages_json) return OK; /* no tools */
        c->r->tools_json = strdup("[]");
        return c->r->tools_json ? OK : OOM;
    }
    if (!c->r->messages_json)
        return rq_fail(c, E_REQUEST, "\"%stools\" needs a chat request (\"messages\"): its chat template renders them", p);
    if (!json_is_array(v))
        return rq_fail(c, E_REQUEST, "\"%stools\" must be an array of tools, not %s", p, rq_repr(b, v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *t = json_array_get(v, i), *type = json_is_object(t) ? rq_get(t, "type") : NULL;
        json_t *fn = json_is_object(t) ? rq_get(t, "function") : NULL, *name = json_is_object(fn) ? rq_get(fn, "name") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_string(name) ||
            json_string_length(name) == 0)
            return rq_fail(c, E_REQUEST, "\"%stools\"[%zu] must be {\"type\": \"function\", \"function\": {\"name\": "
                           "..., \"parameters\": ...}}, not %s", p, i, rq_repr(b, t));
        if (depth_over(t, MAX_MESSAGE_DEPTH))
            return rq_fail(c, E_REQUEST, "\"%stools\"[%zu] is nested more than %d deep", p, i, MAX_MESSAGE_DEPTH);
        if (holds_nul(t)) return rq_fail(c, E_REQUEST, "\"%stools\"[%zu] holds a NUL character (\\u0000)", p, i);
    }
    const int auto_ = !choice || (json_is_string(choice) && !strcmp(json_string_value(choice), "auto"));
    json_t *parallel = rq_get(o, "parallel_tool_calls");
    if (parallel && !json_is_null(parallel) && !json_is_boolean(parallel))
        return rq_fail(c, E_REQUEST, "\"%sparallel_tool_calls\" must be true or false, not %s", p, rq_repr(b, parallel));
    if (json_is_string(choice) && !none && !auto_) { /* "required": a list of calls */
        if (json_array_size(v) > TP_SCHEMA_MAX_ALIKE)
            return rq_fail(c, E_REQUEST, "\"%stool_choice\" \"required\" follows at most %d tools at once, and \"%stools\" "
                           "gives %zu: name the function, or give fewer tools", p, TP_SCHEMA_MAX_ALIKE, p, json_array_size(v));
        json_t *schema;
        TRY(required_schema(c, v, json_is_false(parallel), &schema));
        const int rc = read_schema(c, schema, "tool_choice", &c->r->p.schema);
        json_decref(schema);
        TRY(rc);
        c->r->p.json_object = 1;
        c->r->required_tools = 1;
    }
    if (json_is_object(choice)) { /* a named function: its arguments, held to its parameters' schema */
        json_t *want = rq_get(rq_get(choice, "function"), "name"), *fn = NULL;
        for (size_t i = 0; json_is_string(want) && !fn && i < json_array_size(v); i++) {
            json_t *f = rq_get(json_array_get(v, i), "function");
            if (json_equal(rq_get(f, "name"), want)) fn = f;
        }
        if (!fn)
            return rq_fail(c, E_REQUEST, "\"%stool_choice\" names %s, which \"tools\" does not give", p,
                           rq_repr(b, want ? want : choice));
        json_t *params = rq_get(fn, "parameters");
        json_t *any_object = params ? NULL : json_pack("{s:s}", "type", "object");
        const int rc = read_schema(c, params ? params : any_object, "tool_choice", &c->r->p.schema);
        json_decref(any_object);
        TRY(rc);
        c->r->p.json_object = 1;
        c->r->forced_tool = strdup(json_string_value(want));
        if (!c->r->forced_tool) return OOM;
    }
    c->r->parse_tool_calls = auto_ && !c->r->forced_tool;
    c->r->single_tool_call = json_is_false(parallel);
    c->r->tools_json = json_dumps(v, JSON_COMPACT);
    return c->r->tools_json ? OK : OOM;
}

static int read_stop(line_ctx *c, const json_t *o)
{
    json_t *v = rq_get(o, "stop");
    char b[QUOTE_CAP];
    tp_request_params *p = &c->r->p;
    if (!v) return OK;
    size_t k = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_string(v))
        return rq_fail(c, E_REQUEST, "\"%sstop\" must be a string or an array of strings, not %s", c->prefix,
                       rq_repr(b, v));
    if (k > MAX_STOP)
        return rq_fail(c, E_REQUEST, "\"%sstop\" has %zu strings, more than %d", c->prefix, k, MAX_STOP);
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(e))
            return rq_fail(c, E_REQUEST, "\"%sstop\"[%zu] must be a string, not %s", c->prefix, i, rq_repr(b, e));
        if (json_string_length(e) == 0 && json_is_array(v))
            return rq_fail(c, E_REQUEST, "\"%sstop\"[%zu] is an empty string", c->prefix, i);
        if (json_string_length(e) == 0) return rq_fail(c, E_REQUEST, "\"%sstop\" is an empty string", c->prefix);
        if (memchr(json_string_value(e), '\0', json_string_length(e)))
            return rq_fail(c, E_REQUEST, "\"%sstop\" %s holds a NUL character (\\u0000)", c->prefix,
                           rq_repr(b, e));
    }
    if (k == 0) return OK;
    p->stop = calloc(k, sizeof *p->stop);
    if (!p->stop) return OOM;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        p->stop[i] = rq_dup_n(json_string_value(e), json_string_length(e));
        if (!p->stop[i]) return OOM;
        p->n_stop = (int32_t)(i + 1);
    }
    return OK;
}

typedef struct bias_entry {
    int32_t id;
    float bias;
    int32_t order; /* the key's place in the object: the last of equal ids wins, as a Python dict */
} bias_entry;

static int bias_entry_cmp(const void *a, const void *b)
{
    const bias_entry *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* "logit_bias": {"token id": bias, ...} as OpenAI gives it; each bias clamped to [-100, 100]
 * as vLLM does (OpenAI's range); keys naming one id twice ("7", "07"): the last wins. */
static int read_logit_bias(line_ctx *c, const json_t *o)
{
    tp_request_params *p = &c->r->p;
    char b[QUOTE_CAP];
    json_t *v = rq_get(o, "logit_bias");
    if (!v) return OK;
    if (!json_is_object(v))
        return rq_fail(c, E_REQUEST, "\"%slogit_bias\" must be an object mapping token ids to biases, not %s",
                       c->prefix, rq_repr(b, v));
    const size_t k = json_object_size(v);
    if (k == 0) return OK;
    bias_entry *e = malloc(k * sizeof *e);
    if (!e) return OOM;
    size_t n = 0;
    const char *key;
    json_t *val;
    int rc = OK;
    json_object_foreach(v, key, val)
    {
        const size_t len = strlen(key);
        int digits = len > 0;
        long long id = 0;
        for (size_t i = 0; digits && i < len; i++) {
            digits = key[i] >= '0' && key[i] <= '9';
            if (id <= c->vocab) id = 10 * id + (key[i] - '0'); /* past the vocabulary: stays past it */
        }
        if (!digits) {
            rc = rq_fail(c, E_REQUEST, "\"%slogit_bias\" key %s is not a token id (a non-negative decimal integer)",
                         c->prefix, rq_quote(b, key, len));
            break;
        }
        if (id >= c->vocab) {
            rc = rq_fail(c, E_REQUEST, "\"%slogit_bias\" key %s is outside [0, %lld) (the vocabulary)",
                      c->prefix, rq_quote(b, key, len), (long long)c->vocab);
            break;
        }
        if (!json_is_number(val)) {
            rc = rq_fail(c, E_REQUEST, "\"%slogit_bias\" of token %lld must be a number in [-100, 100], not %s",
                         c->prefix, id, rq_repr(b, val));
            break;
        }
        const double d = json_number_value(val);
        e[n].id = (int32_t)id;
        e[n].bias = (float)(d < -100.0 ? -100.0 : d > 100.0 ? 100.0 : d);
        e[n].order = (int32_t)n;
        n++;
    }
    if (rc != OK) {
        free(e);
        return rc;
    }
    qsort(e, n, sizeof *e, bias_entry_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && e[m - 1].id == e[i].id) m--; /* a later key for the same id replaces it */
        e[m++] = e[i];
    }
    p->bias_ids = malloc(m * sizeof *p->bias_ids);
    p->bias = malloc(m * sizeof *p->bias);
    if (!p->bias_ids || !p->bias) {
        free(e);
        return OOM;
    }
    for (size_t i = 0; i < m; i++) {
        p->bias_ids[i] = e[i].id;
        p->bias[i] = e[i].bias;
    }
    p->n_bias = (int32_t)m;
    free(e);
    return OK;
}

#define MAX_CHOICES 4096

/* An array of strings, each with something besides white space and no NUL, at most max:
 * into *out (NULL when absent or null). */
static int read_strings(line_ctx *c, const json_t *v, const char *key, int32_t max, char ***out, int32_t *n_out)
{
    char b[QUOTE_CAP];
    if (!v) return OK;
    if (!json_is_array(v) || json_array_size(v) == 0)
        return rq_fail(c, E_REQUEST, "\"%s%s\" must be a non-empty array of strings, not %s", c->prefix, key,
                       json_is_array(v) ? "an empty array" : rq_repr(b, v));
    const size_t k = json_array_size(v);
    if (k > (size_t)max)
        return rq_fail(c, E_REQUEST, "\"%s%s\" holds %zu strings, more than %d", c->prefix, key, k, (int)max);
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(v, i);
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        const size_t n = s ? json_string_length(e) : 0;
        size_t blank = 0;
        while (blank < n && strchr(" \t\n\r\f\v", s[blank])) blank++;
        if (!s || blank == n)
            return rq_fail(c, E_REQUEST, "\"%s%s\"[%zu] must be a string with more than white space, not %s", c->prefix,
                           key, i, rq_repr(b, e));
        if (memchr(s, '\0', n))
            return rq_fail(c, E_REQUEST, "\"%s%s\"[%zu] holds a NUL character (\\u0000)", c->prefix, key, i);
    }
    char **a = calloc(k, sizeof *a);
    if (!a) return OOM;
    *out = a;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(v, i);
        a[i] = rq_dup_n(json_string_value(e), json_string_length(e));
        if (!a[i]) return OOM;
        *n_out = (int32_t)(i + 1);
    }
    return OK;
}

/* response_format (OpenAI's): {"type": "text"}, nothing; {"type": "json_object"}, a JSON
 * object; a schema is refused (tpinfer holds the text to JSON, not to a schema). */
static int read_response_format(line_ctx *c, const json_t *v, int *json, const json_t **schema)
{
    char b[QUOTE_CAP];
    json_t *t = json_is_object(v) ? rq_get(v, "type") : NULL;
    const char *type = json_is_string(t) ? json_string_value(t) : NULL;
    if (type && !strcmp(type, "text")) return OK;
    if (type && !strcmp(type, "json_object")) {
        *json = 1;
        return OK;
    }
    if (type && !strcmp(type, "json_schema")) { /* {"json_schema": {"name", "schema", "strict"}} */
        json_t *js = rq_get(v, "json_schema");
        *schema = json_is_object(js) ? rq_get(js, "schema") : NULL;
        if (!*schema)
            return rq_fail(c, E_REQUEST, "\"%sresponse_format\" \"json_schema\" needs \"json_schema\": {\"schema\": "
                           "{...}}", c->prefix);
        *json = 1;
        return OK;
    }
    return rq_fail(c, E_REQUEST, "\"%sresponse_format\" must be {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                   "or {\"type\": \"json_schema\", ...}, not %s", c->prefix, t ? rq_repr(b, t) : rq_repr(b, v));
}

/* A schema (an object, true, or vLLM's JSON text of one) compiled, once per distinct
 * schema in the list, into *out; one tpinfer does not take is the line's error. */
/* s under key (its text) in the list's compiled schemas; NULL where there is none */
static tp_schema *interned(tp_request_list *l, const char *key)
{
    json_t *at = l->schema_index ? json_object_get((json_t *)l->schema_index, key) : NULL;
    return at ? l->schemas[json_integer_value(at)] : NULL;
}

/* s, compiled, kept under key; s released where it cannot be */
static int intern(tp_request_list *l, const char *key, tp_schema *s)
{
    tp_schema **grown = realloc(l->schemas, (l->n_schemas + 1) * sizeof *grown);
    if (grown) l->schemas = grown;
    if (!grown || (!l->schema_index && !(l->schema_index = json_object())) ||
        json_object_set_new((json_t *)l->schema_index, key, json_integer((json_int_t)l->n_schemas))) {
        tp_schema_free(s);
        return OOM;
    }
    l->schemas[l->n_schemas++] = s;
    return OK;
}

/* what compiling gave (st, s): s kept under name, or the line's error record saying why */
static int keep_compiled(line_ctx *c, const char *key, tp_status st, tp_schema *s, const char *name,
                         const struct tp_schema **out)
{
    if (st == TP_ERR_OOM) return OOM;
    if (st != TP_OK) {
        const int rc = rq_fail(c, E_REQUEST, "\"%s%s\": %s", c->prefix, key, tp_error_message());
        tp_error_clear();
        return rc;
    }
    const int rc = intern(c->list, name, s);
    if (rc == OK) *out = s;
    return rc;
}

/* vLLM's guided_regex (structured_outputs.regex): the whole text matches it; compiled once
 * per list, as schemas are */
static int read_regex(line_ctx *c, const json_t *v, const char *key, const struct tp_schema **out)
{
    char b[QUOTE_CAP];
    if (!json_is_string(v))
        return rq_fail(c, E_REQUEST, "\"%s%s\" must be a regular expression (a string), not %s", c->prefix, key, rq_repr(b, v));
    const size_t n = json_string_length(v);
    char *name = malloc(n + 7);
    if (!name) return OOM;
    memcpy(name, "regex:", 6);
    memcpy(name + 6, json_string_value(v), n + 1); /* a NUL inside ends the key: compiled again, the same */
    tp_schema *s = interned(c->list, name);
    if (s) {
        free(name);
        *out = s;
        return OK;
    }
    const tp_status st = tp_schema_compile_regex(json_string_value(v), n, &s);
    const int rc = keep_compiled(c, key, st, s, name, out);
    free(name);
    return rc;
}

static int read_schema(line_ctx *c, const json_t *v, const char *key, const struct tp_schema **out)
{
    char b[QUOTE_CAP];
    json_t *parsed = NULL;
    if (json_is_string(v)) { /* vLLM takes the schema as JSON text too */
        json_error_t err;
        parsed = json_loadb(json_string_value(v), json_string_length(v), JSON_DECODE_ANY, &err);
        if (!parsed) return rq_fail(c, E_REQUEST, "\"%s%s\" is not a JSON schema: %s", c->prefix, key, err.text);
        v = parsed;
    }
    if (!json_is_object(v) && !json_is_true(v)) {
        json_decref(parsed);
        return rq_fail(c, E_REQUEST, "\"%s%s\" must be a JSON schema (an object), not %s", c->prefix, key, rq_repr(b, v));
    }
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); /* insertion order kept: it is the properties' */
    tp_schema *s = text ? interned(c->list, text) : NULL;
    if (!text || s) {
        free(text);
        json_decref(parsed);
        *out = s;
        return s ? OK : OOM;
    }
    const tp_status st = tp_schema_compile(v, &s);
    json_decref(parsed);
    const int rc = keep_compiled(c, key, st, s, text, out);
    free(text);
    return rc;
}

/* vLLM's "structured_outputs": {"choice": [...]}, {"json_object": true}, {"json": SCHEMA} or
 * {"regex": PATTERN};
 * *choices its choice array, or NULL. Of its options, disable_any_whitespace (*compact) is
 * followed; disable_fallback (no other backend to fall back to) and
 * disable_additional_properties (properties a schema does not give are never written) hold
 * as they are. */
static int read_structured_outputs(line_ctx *c, const json_t *so, json_t **choices, int *json, const json_t **schema,
                                   int *compact, const json_t **regex)
{
    char b[QUOTE_CAP];
    if (!json_is_object(so))
        return rq_fail(c, E_REQUEST, "\"%sstructured_outputs\" must be an object, not %s", c->prefix, rq_repr(b, so));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)so, k, x)
    {
        if (json_is_null(x) || !strcmp(k, "choice")) continue;
        if (!strcmp(k, "json_object")) {
            if (!json_is_boolean(x))
                return rq_fail(c, E_REQUEST, "\"%sstructured_outputs\".json_object must be true or false, not %s",
                               c->prefix, rq_repr(b, x));
            *json |= json_is_true(x);
            continue;
        }
        if (!strcmp(k, "json")) {
            *schema = x;
            *json = 1;
            continue;
        }
        if (!strcmp(k, "regex")) {
            *regex = x;
            continue;
        }
        if (!strcmp(k, "disable_any_whitespace") || !strcmp(k, "disable_fallback") ||
            !strcmp(k, "disable_additional_properties")) {
            if (!json_is_boolean(x))
                return rq_fail(c, E_REQUEST, "\"%sstructured_outputs\".%s must be true or false, not %s", c->prefix, k,
                               rq_repr(b, x));
            if (!strcmp(k, "disable_any_whitespace")) *compact = json_is_true(x);
            continue;
        }
        return rq_fail(c, E_REQUEST, "\"%sstructured_outputs\".%s: guided decoding other than \"choice\", \"json\", "
                       "\"json_object\" and \"regex\" (and the option disable_any_whitespace) is not supported", c->prefix,
                       rq_quote(b, k, strlen(k)));
    }
    *choices = rq_get(so, "choice");
    return OK;
}

/* Guided decoding: vLLM's guided_choice (or "structured_outputs": {"choice": [...]}), a
 * non-empty array of non-empty strings the text must be one of; or a JSON object
 * (response_format {"type": "json_object"}, "structured_outputs": {"json_object": true}).
 * One of them, and refused beside allowed_token_ids (both would say which tokens may come),
 * min_tokens (the text may be whole sooner), ignore_eos (it ends at the end token) and
 * bad_words. */
static int read_guided(line_ctx *c, const json_t *o)
{
    tp_request_params *p = &c->r->p;
    char b[QUOTE_CAP];
    json_t *so = rq_get(o, "structured_outputs"), *v = rq_get(o, "guided_choice"), *rf = rq_get(o, "response_format"),
           *gj = rq_get(o, "guided_json");
    const char *key = "guided_choice";
    int json = 0, so_json = 0, compact = 0;
    const json_t *schema = NULL, *so_schema = NULL, *regex = rq_get(o, "guided_regex"), *so_regex = NULL;
    if (so && v) return rq_fail(c, E_REQUEST, "give one of \"%sguided_choice\" and \"%sstructured_outputs\", not both",
                                c->prefix, c->prefix);
    if (rf) TRY(read_response_format(c, rf, &json, &schema));
    if (so) {
        TRY(read_structured_outputs(c, so, &v, &so_json, &so_schema, &compact, &so_regex));
        if (regex && so_regex)
            return rq_fail(c, E_REQUEST, "\"%sguided_regex\" with \"%sstructured_outputs.regex\": give one", c->prefix,
                           c->prefix);
        key = "structured_outputs.choice";
    }
    const char *what = json ? "response_format" : so_schema ? "structured_outputs.json" : so_json ? "structured_outputs.json_object" : key;
    if ((json || so_json) && gj)
        return rq_fail(c, E_REQUEST, "\"%sguided_json\" with \"%s%s\": give one", c->prefix, c->prefix, what);
    if (json && so_json)
        return rq_fail(c, E_REQUEST, "\"%sresponse_format\" with \"%sstructured_outputs\": give one", c->prefix, c->prefix);
    if (gj) {
        json = 1;
        schema = gj;
        what = "guided_json";
    }
    json |= so_json;
    if (so_schema) schema = so_schema;
    if (so_regex) regex = so_regex;
    if (regex) { /* the whole text matches it: held as JSON's rules are */
        const char *rk = so_regex ? "structured_outputs.regex" : "guided_regex";
        if (json || v)
            return rq_fail(c, E_REQUEST, "\"%s%s\" with \"%s%s\": give one", c->prefix, rk, c->prefix, json ? what : key);
        json = 1;
        what = rk;
    }
    if (c->r->forced_tool || c->r->required_tools) { /* tool_choice: its schema holds the text */
        if (json || v)
            return rq_fail(c, E_REQUEST, "\"%stool_choice\" %s with \"%s%s\": give one", c->prefix,
                           c->r->required_tools ? "\"required\"" : "naming a function", c->prefix, json ? what : key);
        json = 1;
        what = "tool_choice";
    }
    if (json && v)
        return rq_fail(c, E_REQUEST, "\"%s%s\" with \"%s%s\": give one", c->prefix, key, c->prefix, what);
    const char *why_min = json ? "the object may be whole sooner" : "a choice may end sooner";
    if (!v && !json) return OK;
    if (v) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return rq_fail(c, E_REQUEST, "\"%s%s\" must be a non-empty array of strings, not %s", c->prefix, key,
                           json_is_array(v) ? "an empty array" : rq_repr(b, v));
        const size_t k = json_array_size(v);
        if (k > MAX_CHOICES)
            return rq_fail(c, E_REQUEST, "\"%s%s\" holds %zu choices, more than %d", c->prefix, key, k, MAX_CHOICES);
        for (size_t i = 0; i < k; i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_string(e) || json_string_length(e) == 0)
                return rq_fail(c, E_REQUEST, "\"%s%s\"[%zu] must be a non-empty string, not %s", c->prefix, key, i,
                               rq_repr(b, e));
            if (memchr(json_string_value(e), '\0', json_string_length(e)))
                return rq_fail(c, E_REQUEST, "\"%s%s\"[%zu] holds a NUL character (\\u0000)", c->prefix, key, i);
        }
    }
    if (p->n_allowed_token_ids)
        return rq_fail(c, E_REQUEST, "\"%s%s\" and \"%sallowed_token_ids\" both say which tokens may come: give one",
                       c->prefix, what, c->prefix);
    if (p->has_min_tokens && p->min_tokens > 0)
        return rq_fail(c, E_REQUEST, "\"%s%s\" with \"%smin_tokens\" %d: %s", c->prefix, what, c->prefix, p->min_tokens,
                       why_min);
    if (p->has_ignore_eos && p->ignore_eos)
        return rq_fail(c, E_REQUEST, "\"%s%s\" with \"%signore_eos\": true: %s ends at the end token", c->prefix, what,
                       c->prefix, json ? "the object" : "a choice");
    if (rq_get(o, "bad_words"))
        return rq_fail(c, E_REQUEST, "\"%s%s\" with \"%sbad_words\": %s; give one", c->prefix, what, c->prefix,
                       json ? "a banned word could be all the object may go on with" : "the choices alone say what may come");
    if (json) {
        if (regex) TRY(read_regex(c, regex, what, &p->schema));
        else if (schema && !c->r->forced_tool && !c->r->required_tools) TRY(read_schema(c, schema, what, &p->schema));
        p->json_object = 1;
        p->json_compact = compact;
        return OK;
    }
    const size_t k = json_array_size(v);
    p->choices = calloc(k, sizeof *p->choices);
    if (!p->choices) return OOM;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(v, i);
        p->choices[i] = rq_dup_n(json_string_value(e), json_string_length(e));
        if (!p->choices[i]) return OOM;
        p->n_choices = (int32_t)(i + 1);
    }
    return OK;
}

/* "logprobs": an integer in [0, 20], or (chat style) true/false with "top_logprobs". */
static int read_logprobs(line_ctx *c, const json_t *o)
{
    tp_request_params *p = &c->r->p;
    json_t *v = rq_get(o, "logprobs");
    int has_top = 0;
    int64_t top = 0;
    TRY(rq_read_int(c, o, "top_logprobs", 0, 20, "[0, 20]", &has_top, &top));
    if (v && json_is_boolean(v)) {
        if (has_top && !json_is_true(v))
            return rq_fail(c, E_REQUEST, "\"%stop_logprobs\" needs \"%slogprobs\": true", c->prefix, c->prefix);
        p->has_logprobs = json_is_true(v); /* false: none, as if absent (OpenAI, vLLM) */
        p->logprobs = p->has_logprobs ? (int32_t)top : 0;
        return OK;
    }
    if (has_top)
        return rq_fail(c, E_REQUEST, "\"%stop_logprobs\" needs \"%slogprobs\": true", c->prefix, c->prefix);
    int has;
    int64_t x;
    TRY(rq_read_int(c, o, "logprobs", 0, 20, "[0, 20] (or true/false)", &has, &x));
    if (has) {
        p->has_logprobs = 1;
        p->logprobs = (int32_t)x;
    }
    return OK;
}

typedef struct pfield {
    const char *key;
    char kind; /* 'i' int32, 'u' uint64 (seed), 'r' double, 'b' bool (int) */
    int64_t ilo, ihi;
    double rlo, rhi;
    int lo_open;
    const char *range;
    size_t has_off, val_off;
} pfield;

#define PF_I(key, field, lo, hi, range) \
    {key, 'i', lo, hi, 0, 0, 0, range, offsetof(tp_request_params, has_##field), offsetof(tp_request_params, field)}
#define PF_R(key, field, lo, hi, lo_open, range) \
    {key, 'r', 0, 0, lo, hi, lo_open, range, offsetof(tp_request_params, has_##field), offsetof(tp_request_params, field)}
#define PF_B(key, field) \
    {key, 'b', 0, 0, 0, 0, 0, "", offsetof(tp_request_params, has_##field), offsetof(tp_request_params, field)}

static const pfield pfields[] = {
    PF_I("max_tokens", max_tokens, 1, INT32_MAX, "[1, 2147483647]"),
    PF_I("min_tokens", min_tokens, 0, INT32_MAX, "[0, 2147483647]"),
    PF_R("temperature", temperature, 0, 100, 0, "[0, 100]"),
    PF_I("top_k", top_k, -1, INT32_MAX, "[-1, 2147483647] (-1 and 0: off)"),
    PF_R("top_p", top_p, 0, 1, 1, "(0, 1]"),
    PF_R("min_p", min_p, 0, 1, 0, "[0, 1]"),
    PF_R("repetition_penalty", repetition_penalty, 0, 100, 1, "(0, 100]"),
    PF_R("presence_penalty", presence_penalty, -2, 2, 0, "[-2, 2]"),
    PF_R("frequency_penalty", frequency_penalty, -2, 2, 0, "[-2, 2]"),
    {"seed", 'u', 0, INT64_MAX, 0, 0, 0, "[0, 2^63)", offsetof(tp_request_params, has_seed),
     offsetof(tp_request_params, seed)},
    PF_I("n", n, 1, 128, "[1, 128]"),
    PF_I("prompt_logprobs", prompt_logprobs, 0, 20, "[0, 20]"),
    PF_B("ignore_eos", ignore_eos),
    PF_B("skip_special_tokens", skip_special_tokens),
    PF_B("include_stop_str_in_output", include_stop_str_in_output),
    PF_B("echo", echo),
};

/* The per-request settings of o (a JSONL line, or an OpenAI body). */
int rq_read_params(line_ctx *c, const json_t *o)
{
    tp_request_params *p = &c->r->p;
    /* echo with max_tokens 0: the prompt alone (vLLM draws one token and drops it) */
    json_t *mt = rq_get(o, "max_tokens");
    if (json_is_integer(mt) && json_integer_value(mt) == 0 && json_is_true(rq_get(o, "echo"))) {
        p->echo_only = 1;
        p->has_max_tokens = 1;
        p->max_tokens = 1;
    }
    for (size_t i = 0; i < TP_ARRAY_LEN(pfields); i++) {
        const pfield *f = &pfields[i];
        if (p->echo_only && !strcmp(f->key, "max_tokens")) continue;
        int *has = (int *)((char *)p + f->has_off);
        void *val = (char *)p + f->val_off;
        int64_t x;
        if (f->kind == 'i') {
            TRY(rq_read_int(c, o, f->key, f->ilo, f->ihi, f->range, has, &x));
            if (*has) *(int32_t *)val = (int32_t)x;
        } else if (f->kind == 'u') {
            TRY(rq_read_int(c, o, f->key, f->ilo, f->ihi, f->range, has, &x));
            if (*has) *(uint64_t *)val = (uint64_t)x;
        } else if (f->kind == 'r') {
            TRY(read_real(c, o, f->key, f->rlo, f->rhi, f->lo_open, f->range, has, (double *)val));
        } else {
            TRY(read_bool(c, o, f->key, has, (int *)val));
        }
    }
    /* OpenAI's newer name wins over max_tokens, as in vLLM */
    int has;
    int64_t x;
    TRY(rq_read_int(c, o, "max_completion_tokens", 1, INT32_MAX, "[1, 2147483647]", &has, &x));
    if (has) {
        p->has_max_tokens = 1;
        p->max_tokens = (int32_t)x;
    }
    if (p->has_min_tokens && p->has_max_tokens && p->min_tokens > p->max_tokens)
        return rq_fail(c, E_REQUEST, "\"%smin_tokens\" %d is more than \"%smax_tokens\" %d", c->prefix,
                       p->min_tokens, c->prefix, p->max_tokens);
    if (p->echo && (c->r->endpoint == TP_ENDPOINT_CHAT || c->r->messages_json))
        return rq_fail(c, E_REQUEST, "\"%secho\" is for completions (the prompt before the text); a chat request "
                       "cannot echo its messages", c->prefix);
    if (p->echo_only && rq_get(o, "max_completion_tokens"))
        return rq_fail(c, E_REQUEST, "\"%smax_tokens\" 0 (the prompt alone) with \"%smax_completion_tokens\": give one",
                       c->prefix, c->prefix);
    TRY(read_logprobs(c, o));
    TRY(read_stop(c, o));
    json_t *v = rq_get(o, "stop_token_ids");
    if (v) TRY(rq_read_token_ids(c, v, "stop_token_ids", 1, &p->stop_token_ids, &p->n_stop_token_ids));
    /* vLLM refuses an empty list, which would leave nothing to draw */
    if ((v = rq_get(o, "allowed_token_ids")))
        TRY(rq_read_token_ids(c, v, "allowed_token_ids", 0, &p->allowed_token_ids, &p->n_allowed_token_ids));
    TRY(read_logit_bias(c, o));
    TRY(read_guided(c, o));
    TRY(read_strings(c, rq_get(o, "bad_words"), "bad_words", MAX_CHOICES, &p->bad_words, &p->n_bad_words));
    return OK;
}

int rq_read_add_generation_prompt(line_ctx *c, const json_t *o)
{
    int has, val;
    TRY(read_bool(c, o, "add_generation_prompt", &has, &val));
    if (has) c->r->add_generation_prompt = val;
    return OK;
}

int rq_pfield_named(const char *k)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(pfields); i++)
        if (!strcmp(pfields[i].key, k)) return 1;
    return 0;
}
