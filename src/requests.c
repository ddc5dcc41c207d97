/*
 * requests.c: reading the prompt file (--input) in one of four dialects: text, JSONL,
 * OpenAI batch, TensorRT-LLM benchmark lines (see requests.h).
 *
 * Lines are split on '\n' only, never on NUL; a trailing '\r' is dropped (CRLF files);
 * a UTF-8 byte order mark at the start of the file is skipped; lines of only spaces,
 * tabs and CRs are skipped but still counted, so line numbers are those of an editor.
 *
 * Each non-blank line becomes one request. A line that cannot be run becomes a request
 * with error_code/error_message set (the batch goes on without it):
 *   invalid_utf8    the line's bytes are not UTF-8 (bad bytes, overlong forms, encoded
 *                   surrogates, > U+10FFFF), or a JSON string escapes a lone surrogate
 *   invalid_json    not JSON, truncated, duplicate keys, not an object (JSON dialects)
 *   invalid_request a field of the wrong type or out of range, a missing field, a
 *                   line longer than max_line_bytes, an empty prompt
 * The message starts "line N: " and names the field, the value and what is allowed.
 *
 * The id of an error request: the line's real id whenever it can be read (the JSON
 * parses, or parses once its bad UTF-8 bytes are replaced, or once integers too big
 * for 64 bits are read as reals); otherwise the decimal line number, as for text lines
 * and JSONL lines without an id. Such a stand-in id still takes part in the duplicate
 * check, so it may collide with a real id (fatal; the message says which line's id is
 * a stand-in).
 *
 * Unknown fields are ignored (vLLM and OpenAI do the same), except TensorRT-LLM's
 * "lora_request" and "media_paths", which would change the result: those are errors.
 *
 * JSON is parsed with jansson, per line, with JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL:
 * a "\u0000" escape may sit in a prompt (prompt_len counts it), but never in an id, a
 * role or a stop string, which are C strings.
 */
#include "requests.h"
#include "json_schema.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

#define MAX_STOP 16                       /* stop strings per request */
#define MAX_MESSAGE_DEPTH 64              /* nesting inside one chat message */
#define DETECT_LINES 1000                 /* lines auto-detection may parse */

static const char E_JSON[] = "invalid_json";
static const char E_REQUEST[] = "invalid_request";
static const char E_UTF8[] = "invalid_utf8";

int tp_input_format_from_name(const char *name, tp_input_format *out)
{
    static const struct {
        const char *name;
        tp_input_format fmt;
    } names[] = {
        {"auto", TP_INPUT_AUTO},     {"text", TP_INPUT_TEXT},     {"jsonl", TP_INPUT_JSONL},
        {"openai", TP_INPUT_OPENAI}, {"trtllm", TP_INPUT_TRTLLM},
    };
    if (!name) return 0;
    for (size_t i = 0; i < TP_ARRAY_LEN(names); i++)
        if (!strcmp(name, names[i].name)) {
            *out = names[i].fmt;
            return 1;
        }
    return 0;
}

/* ------------------------------------------------------------------------------------
 * Freeing */

static void params_free(tp_request_params *p)
{
    for (int32_t i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop);
    free(p->stop_token_ids);
    free(p->allowed_token_ids);
    free(p->bias_ids);
    free(p->bias);
    for (int32_t i = 0; i < p->n_bad_words; i++) free(p->bad_words[i]);
    free(p->bad_words);
    for (int32_t i = 0; i < p->n_choices; i++) free(p->choices[i]);
    free(p->choices);
    memset(p, 0, sizeof *p);
}

/* What an error request must not carry: anything to run. */
static void payload_free(tp_request *r)
{
    free(r->prompt);
    free(r->prompt_ids);
    free(r->messages_json);
    free(r->tools_json);
    free(r->forced_tool);
    r->forced_tool = NULL;
    r->prompt = NULL;
    r->prompt_len = 0;
    r->prompt_ids = NULL;
    r->n_prompt_ids = 0;
    r->messages_json = r->tools_json = NULL;
    r->parse_tool_calls = r->single_tool_call = r->required_tools = 0;
    params_free(&r->p);
}

static void request_free(tp_request *r)
{
    payload_free(r);
    free(r->id);
    free(r->error_message);
}

void tp_requests_free(tp_request_list *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) request_free(&l->v[i]);
    for (size_t i = 0; i < l->n_schemas; i++) tp_schema_free(l->schemas[i]);
    free(l->schemas);
    json_decref((json_t *)l->schema_index);
    free(l->v);
    free(l->id_text);
    free(l->id_at);
    free(l->id_line);
    free(l->id_standin);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------------------------------
 * Small helpers */

static char *dup_n(const char *s, size_t n)
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
static size_t utf8_valid_prefix(const unsigned char *s, size_t n)
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
#define QUOTE_CAP 96
static const char *quote(char buf[QUOTE_CAP], const char *s, size_t n)
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
static const char *repr(char buf[QUOTE_CAP], const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return quote(buf, json_string_value(v), json_string_length(v));
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
static json_t *get(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* ------------------------------------------------------------------------------------
 * One line */

enum { OK = 0, BAD = 1, OOM = -1 }; /* line step results: BAD = an error was recorded */

#define TRY(expr)                  \
    do {                           \
        int try_rc_ = (expr);      \
        if (try_rc_) return try_rc_; \
    } while (0)

typedef struct line_ctx {
    tp_request *r;
    int64_t line;
    int64_t vocab;      /* token ids must be < vocab */
    int lossy;          /* parsed with JSON_DECODE_INT_AS_REAL after an integer overflow */
    int standin;        /* r->id is the line number, not an id the line gave */
    const char *prefix; /* "" or "body." before field names */
    tp_request_list *list; /* where unknown fields are counted */
    int unknown_here;      /* this line already counted in list->unknown_lines */
} line_ctx;

/* Record the line's first error; later ones are dropped (one message per line). */
__attribute__((format(printf, 3, 4))) static int fail(line_ctx *c, const char *code,
                                                       const char *fmt, ...)
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

static int set_standin_id(line_ctx *c)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)c->line);
    free(c->r->id);
    c->r->id = strdup(buf);
    c->standin = 1;
    return c->r->id ? OK : OOM;
}

/* An id from a JSON value: a non-empty string without NUL, or an integer (as decimal).
 * On anything else the line number stands in and an error is recorded. */
static int read_id(line_ctx *c, const char *key, const json_t *v, int allow_int)
{
    char b[QUOTE_CAP];
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (n == 0) {
            TRY(set_standin_id(c));
            return fail(c, E_REQUEST, "\"%s\" is empty", key);
        }
        if (memchr(s, '\0', n)) {
            TRY(set_standin_id(c));
            return fail(c, E_REQUEST, "\"%s\" %s holds a NUL character (\\u0000)", key, quote(b, s, n));
        }
        c->r->id = dup_n(s, n);
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
    TRY(set_standin_id(c));
    if (!v) return fail(c, E_REQUEST, "\"%s\" is required", key);
    return fail(c, E_REQUEST, "\"%s\" must be a string%s, not %s", key,
                allow_int ? " or an integer" : "", repr(b, v));
}

/* An integer field in [lo, hi]; range is how a message shows that interval. */
static int read_int(line_ctx *c, const json_t *o, const char *key, int64_t lo, int64_t hi,
                    const char *range, int *has, int64_t *out)
{
    json_t *v = get(o, key);
    char b[QUOTE_CAP];
    *has = 0;
    if (!v) return OK;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < lo || x > hi)
            return fail(c, E_REQUEST, "\"%s%s\" %lld is outside %s", c->prefix, key, (long long)x, range);
        *out = x;
        *has = 1;
        return OK;
    }
    if (c->lossy && json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) {
        double d = json_real_value(v);
        if (!(d >= (double)lo && d < (double)hi + 1.0)) /* shown as the integer it was */
            return fail(c, E_REQUEST, "\"%s%s\" %.0f is outside %s", c->prefix, key, d, range);
        *out = (int64_t)d; /* the line is an error anyway (see parse_line) */
        *has = 1;
        return OK;
    }
    return fail(c, E_REQUEST, "\"%s%s\" must be an integer in %s, not %s", c->prefix, key, range,
                repr(b, v));
}

static int read_real(line_ctx *c, const json_t *o, const char *key, double lo, double hi,
                     int lo_open, const char *range, int *has, double *out)
{
    json_t *v = get(o, key);
    char b[QUOTE_CAP];
    *has = 0;
    if (!v) return OK;
    if (!json_is_number(v))
        return fail(c, E_REQUEST, "\"%s%s\" must be a number in %s, not %s", c->prefix, key, range,
                    repr(b, v));
    double d = json_number_value(v);
    if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
        return fail(c, E_REQUEST, "\"%s%s\" %s is outside %s", c->prefix, key, repr(b, v), range);
    *out = d;
    *has = 1;
    return OK;
}

static int read_bool(line_ctx *c, const json_t *o, const char *key, int *has, int *out)
{
    json_t *v = get(o, key);
    char b[QUOTE_CAP];
    *has = 0;
    if (!v) return OK;
    if (!json_is_boolean(v))
        return fail(c, E_REQUEST, "\"%s%s\" must be true or false, not %s", c->prefix, key, repr(b, v));
    *out = json_is_true(v);
    *has = 1;
    return OK;
}

/* A non-empty array of token ids in [0, vocab) into a fresh array. */
static int read_token_ids(line_ctx *c, const json_t *v, const char *key, int allow_empty,
                          int32_t **out, int32_t *n_out)
{
    char b[QUOTE_CAP];
    if (!json_is_array(v))
        return fail(c, E_REQUEST, "\"%s%s\" must be an array of token ids, not %s", c->prefix, key,
                    repr(b, v));
    size_t k = json_array_size(v);
    if (k == 0 && !allow_empty)
        return fail(c, E_REQUEST, "\"%s%s\" is an empty array", c->prefix, key);
    if (k > INT32_MAX) return fail(c, E_REQUEST, "\"%s%s\" holds %zu ids, too many", c->prefix, key, k);
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
                return fail(c, E_REQUEST, "\"%s%s\"[%zu] must be an integer token id, not %s",
                            c->prefix, key, i, repr(b, e));
            return fail(c, E_REQUEST, "\"%s%s\"[%zu] %s is outside [0, %lld) (the vocabulary)",
                        c->prefix, key, i, repr(b, e), (long long)c->vocab);
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

static int set_prompt(line_ctx *c, const json_t *v, const char *key)
{
    char b[QUOTE_CAP];
    if (!json_is_string(v))
        return fail(c, E_REQUEST, "\"%s%s\" must be a string, not %s", c->prefix, key, repr(b, v));
    if (json_string_length(v) == 0) return fail(c, E_REQUEST, "\"%s%s\": the prompt is empty", c->prefix, key);
    c->r->prompt_len = json_string_length(v);
    c->r->prompt = dup_n(json_string_value(v), c->r->prompt_len);
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
    json_t *v = get(m, "content");
    char b[QUOTE_CAP];
    if (!v) {
        if (strcmp(role, "assistant"))
            return fail(c, E_REQUEST, "\"%smessages\"[%zu].content is missing (only an assistant message may have no content)",
                        c->prefix, i);
        *out = json_null();
        return OK;
    }
    if (json_is_string(v)) {
        *out = json_incref(v);
        return OK;
    }
    if (!json_is_array(v))
        return fail(c, E_REQUEST, "\"%smessages\"[%zu].content must be a string or an array of text parts, not %s",
                    c->prefix, i, repr(b, v));
    size_t total = 0, k = json_array_size(v);
    for (size_t j = 0; j < k; j++) {
        json_t *part = json_array_get(v, j), *type = json_object_get(part, "type"),
               *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text))
            return fail(c, E_REQUEST,
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
static int read_messages(line_ctx *c, const json_t *v)
{
    char b[QUOTE_CAP];
    if (!json_is_array(v) || json_array_size(v) == 0)
        return fail(c, E_REQUEST, "\"%smessages\" must be a non-empty array of messages, not %s", c->prefix,
                    json_is_array(v) ? "an empty array" : repr(b, v));
    json_t *out = json_array();
    if (!out) return OOM;
    int rc = OK;
    for (size_t i = 0; i < json_array_size(v) && rc == OK; i++) {
        json_t *m = json_array_get(v, i), *role, *content = NULL, *nm;
        if (!json_is_object(m)) {
            rc = fail(c, E_REQUEST, "\"%smessages\"[%zu] must be an object, not %s", c->prefix, i, repr(b, m));
            break;
        }
        role = get(m, "role");
        if (!json_is_string(role) || json_string_length(role) == 0 ||
            memchr(json_string_value(role), '\0', json_string_length(role))) {
            rc = fail(c, E_REQUEST, "\"%smessages\"[%zu].role must be a non-empty string, not %s", c->prefix, i,
                      role ? repr(b, role) : "missing");
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
                rc = fail(c, E_REQUEST, "\"%smessages\"[%zu].%s is nested more than %d deep", c->prefix, i,
                          quote(b, k, strlen(k)), MAX_MESSAGE_DEPTH);
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
        json_t *fn = get(json_array_get(tools, i), "function"), *params = get(fn, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params)) {
            rc = fail(c, E_REQUEST, "\"%stools\"[%zu].function.parameters must be a JSON schema object, not %s",
                      c->prefix, i, repr(b, params));
            goto out;
        }
        if (refers_to_root(params)) {
            rc = fail(c, E_REQUEST, "\"%stools\"[%zu].function.parameters refers to itself as \"#\", which "
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
            json_object_foreach(get(p, boxes[k]), name, def)
            {
                json_t *have = json_object_get(lifted[k], name);
                if (have && !json_equal(have, def)) {
                    rc = fail(c, E_REQUEST, "\"%stools\" give two schemas named %s in %s; \"tool_choice\": "
                              "\"required\" puts every tool's in one", c->prefix, quote(b, name, strlen(name)), boxes[k]);
                    goto out;
                }
                json_object_set(lifted[k], name, def);
            }
            json_object_del(p, boxes[k]);
        }
        json_t *branch = json_pack("{s:{s:{s:s, s:[O]}, s:O}, s:[s, s]}", "properties", "name", "type", "string", "enum",
                                   get(fn, "name"), "parameters", p, "required", "name", "parameters");
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

static int read_tools(line_ctx *c, const json_t *o)
{
    char b[QUOTE_CAP];
    const char *p = c->prefix;
    json_t *v = get(o, "tools"), *choice = get(o, "tool_choice");
    if (choice && json_is_null(choice)) choice = NULL;
    const int none = json_is_string(choice) && !strcmp(json_string_value(choice), "none");
    const int valid = !choice || (json_is_string(choice) && (none || !strcmp(json_string_value(choice), "auto") ||
                                                             !strcmp(json_string_value(choice), "required"))) ||
                      (json_is_object(choice) && json_is_object(get(choice, "function")));
    if (!valid)
        return fail(c, E_REQUEST, "\"%stool_choice\" must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                    "\"function\": {\"name\": ...}}, not %s", p, repr(b, choice));
    if (v && json_is_null(v)) v = NULL;
    if (!v || (json_is_array(v) && json_array_size(v) == 0)) {
        if (choice && !none)
            return fail(c, E_REQUEST, "\"%stool_choice\" %s needs \"tools\"", p, repr(b, choice));
        if (!v || !c->r->messages_json) return OK; /* no tools */
        c->r->tools_json = strdup("[]");
        return c->r->tools_json ? OK : OOM;
    }
    if (!c->r->messages_json)
        return fail(c, E_REQUEST, "\"%stools\" needs a chat request (\"messages\"): its chat template renders them", p);
    if (!json_is_array(v))
        return fail(c, E_REQUEST, "\"%stools\" must be an array of tools, not %s", p, repr(b, v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *t = json_array_get(v, i), *type = json_is_object(t) ? get(t, "type") : NULL;
        json_t *fn = json_is_object(t) ? get(t, "function") : NULL, *name = json_is_object(fn) ? get(fn, "name") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_string(name) ||
            json_string_length(name) == 0)
            return fail(c, E_REQUEST, "\"%stools\"[%zu] must be {\"type\": \"function\", \"function\": {\"name\": "
                        "..., \"parameters\": ...}}, not %s", p, i, repr(b, t));
        if (depth_over(t, MAX_MESSAGE_DEPTH))
            return fail(c, E_REQUEST, "\"%stools\"[%zu] is nested more than %d deep", p, i, MAX_MESSAGE_DEPTH);
        if (holds_nul(t)) return fail(c, E_REQUEST, "\"%stools\"[%zu] holds a NUL character (\\u0000)", p, i);
    }
    const int auto_ = !choice || (json_is_string(choice) && !strcmp(json_string_value(choice), "auto"));
    json_t *parallel = get(o, "parallel_tool_calls");
    if (parallel && !json_is_null(parallel) && !json_is_boolean(parallel))
        return fail(c, E_REQUEST, "\"%sparallel_tool_calls\" must be true or false, not %s", p, repr(b, parallel));
    if (json_is_string(choice) && !none && !auto_) { /* "required": a list of calls */
        if (json_array_size(v) > TP_SCHEMA_MAX_ALIKE)
            return fail(c, E_REQUEST, "\"%stool_choice\" \"required\" follows at most %d tools at once, and \"%stools\" "
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
        json_t *want = get(get(choice, "function"), "name"), *fn = NULL;
        for (size_t i = 0; json_is_string(want) && !fn && i < json_array_size(v); i++) {
            json_t *f = get(json_array_get(v, i), "function");
            if (json_equal(get(f, "name"), want)) fn = f;
        }
        if (!fn)
            return fail(c, E_REQUEST, "\"%stool_choice\" names %s, which \"tools\" does not give", p,
                        repr(b, want ? want : choice));
        json_t *params = get(fn, "parameters");
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
    json_t *v = get(o, "stop");
    char b[QUOTE_CAP];
    tp_request_params *p = &c->r->p;
    if (!v) return OK;
    size_t k = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_string(v))
        return fail(c, E_REQUEST, "\"%sstop\" must be a string or an array of strings, not %s", c->prefix,
                    repr(b, v));
    if (k > MAX_STOP)
        return fail(c, E_REQUEST, "\"%sstop\" has %zu strings, more than %d", c->prefix, k, MAX_STOP);
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(e))
            return fail(c, E_REQUEST, "\"%sstop\"[%zu] must be a string, not %s", c->prefix, i, repr(b, e));
        if (json_string_length(e) == 0 && json_is_array(v))
            return fail(c, E_REQUEST, "\"%sstop\"[%zu] is an empty string", c->prefix, i);
        if (json_string_length(e) == 0) return fail(c, E_REQUEST, "\"%sstop\" is an empty string", c->prefix);
        if (memchr(json_string_value(e), '\0', json_string_length(e)))
            return fail(c, E_REQUEST, "\"%sstop\" %s holds a NUL character (\\u0000)", c->prefix,
                        repr(b, e));
    }
    if (k == 0) return OK;
    p->stop = calloc(k, sizeof *p->stop);
    if (!p->stop) return OOM;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        p->stop[i] = dup_n(json_string_value(e), json_string_length(e));
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
    json_t *v = get(o, "logit_bias");
    if (!v) return OK;
    if (!json_is_object(v))
        return fail(c, E_REQUEST, "\"%slogit_bias\" must be an object mapping token ids to biases, not %s",
                    c->prefix, repr(b, v));
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
            rc = fail(c, E_REQUEST, "\"%slogit_bias\" key %s is not a token id (a non-negative decimal integer)",
                      c->prefix, quote(b, key, len));
            break;
        }
        if (id >= c->vocab) {
            rc = fail(c, E_REQUEST, "\"%slogit_bias\" key %s is outside [0, %lld) (the vocabulary)",
                      c->prefix, quote(b, key, len), (long long)c->vocab);
            break;
        }
        if (!json_is_number(val)) {
            rc = fail(c, E_REQUEST, "\"%slogit_bias\" of token %lld must be a number in [-100, 100], not %s",
                      c->prefix, id, repr(b, val));
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
        return fail(c, E_REQUEST, "\"%s%s\" must be a non-empty array of strings, not %s", c->prefix, key,
                    json_is_array(v) ? "an empty array" : repr(b, v));
    const size_t k = json_array_size(v);
    if (k > (size_t)max)
        return fail(c, E_REQUEST, "\"%s%s\" holds %zu strings, more than %d", c->prefix, key, k, (int)max);
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(v, i);
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        const size_t n = s ? json_string_length(e) : 0;
        size_t blank = 0;
        while (blank < n && strchr(" \t\n\r\f\v", s[blank])) blank++;
        if (!s || blank == n)
            return fail(c, E_REQUEST, "\"%s%s\"[%zu] must be a string with more than white space, not %s", c->prefix,
                        key, i, repr(b, e));
        if (memchr(s, '\0', n))
            return fail(c, E_REQUEST, "\"%s%s\"[%zu] holds a NUL character (\\u0000)", c->prefix, key, i);
    }
    char **a = calloc(k, sizeof *a);
    if (!a) return OOM;
    *out = a;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(v, i);
        a[i] = dup_n(json_string_value(e), json_string_length(e));
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
    json_t *t = json_is_object(v) ? get(v, "type") : NULL;
    const char *type = json_is_string(t) ? json_string_value(t) : NULL;
    if (type && !strcmp(type, "text")) return OK;
    if (type && !strcmp(type, "json_object")) {
        *json = 1;
        return OK;
    }
    if (type && !strcmp(type, "json_schema")) { /* {"json_schema": {"name", "schema", "strict"}} */
        json_t *js = get(v, "json_schema");
        *schema = json_is_object(js) ? get(js, "schema") : NULL;
        if (!*schema)
            return fail(c, E_REQUEST, "\"%sresponse_format\" \"json_schema\" needs \"json_schema\": {\"schema\": "
                        "{...}}", c->prefix);
        *json = 1;
        return OK;
    }
    return fail(c, E_REQUEST, "\"%sresponse_format\" must be {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                "or {\"type\": \"json_schema\", ...}, not %s", c->prefix, t ? repr(b, t) : repr(b, v));
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
        const int rc = fail(c, E_REQUEST, "\"%s%s\": %s", c->prefix, key, tp_error_message());
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
        return fail(c, E_REQUEST, "\"%s%s\" must be a regular expression (a string), not %s", c->prefix, key, repr(b, v));
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
        if (!parsed) return fail(c, E_REQUEST, "\"%s%s\" is not a JSON schema: %s", c->prefix, key, err.text);
        v = parsed;
    }
    if (!json_is_object(v) && !json_is_true(v)) {
        json_decref(parsed);
        return fail(c, E_REQUEST, "\"%s%s\" must be a JSON schema (an object), not %s", c->prefix, key, repr(b, v));
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
        return fail(c, E_REQUEST, "\"%sstructured_outputs\" must be an object, not %s", c->prefix, repr(b, so));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)so, k, x)
    {
        if (json_is_null(x) || !strcmp(k, "choice")) continue;
        if (!strcmp(k, "json_object")) {
            if (!json_is_boolean(x))
                return fail(c, E_REQUEST, "\"%sstructured_outputs\".json_object must be true or false, not %s",
                            c->prefix, repr(b, x));
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
                return fail(c, E_REQUEST, "\"%sstructured_outputs\".%s must be true or false, not %s", c->prefix, k,
                            repr(b, x));
            if (!strcmp(k, "disable_any_whitespace")) *compact = json_is_true(x);
            continue;
        }
        return fail(c, E_REQUEST, "\"%sstructured_outputs\".%s: guided decoding other than \"choice\", \"json\", "
                    "\"json_object\" and \"regex\" (and the option disable_any_whitespace) is not supported", c->prefix,
                    quote(b, k, strlen(k)));
    }
    *choices = get(so, "choice");
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
    json_t *so = get(o, "structured_outputs"), *v = get(o, "guided_choice"), *rf = get(o, "response_format"),
           *gj = get(o, "guided_json");
    const char *key = "guided_choice";
    int json = 0, so_json = 0, compact = 0;
    const json_t *schema = NULL, *so_schema = NULL, *regex = get(o, "guided_regex"), *so_regex = NULL;
    if (so && v) return fail(c, E_REQUEST, "give one of \"%sguided_choice\" and \"%sstructured_outputs\", not both",
                             c->prefix, c->prefix);
    if (rf) TRY(read_response_format(c, rf, &json, &schema));
    if (so) {
        TRY(read_structured_outputs(c, so, &v, &so_json, &so_schema, &compact, &so_regex));
        if (regex && so_regex)
            return fail(c, E_REQUEST, "\"%sguided_regex\" with \"%sstructured_outputs.regex\": give one", c->prefix,
                        c->prefix);
        key = "structured_outputs.choice";
    }
    const char *what = json ? "response_format" : so_schema ? "structured_outputs.json" : so_json ? "structured_outputs.json_object" : key;
    if ((json || so_json) && gj)
        return fail(c, E_REQUEST, "\"%sguided_json\" with \"%s%s\": give one", c->prefix, c->prefix, what);
    if (json && so_json)
        return fail(c, E_REQUEST, "\"%sresponse_format\" with \"%sstructured_outputs\": give one", c->prefix, c->prefix);
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
            return fail(c, E_REQUEST, "\"%s%s\" with \"%s%s\": give one", c->prefix, rk, c->prefix, json ? what : key);
        json = 1;
        what = rk;
    }
    if (c->r->forced_tool || c->r->required_tools) { /* tool_choice: its schema holds the text */
        if (json || v)
            return fail(c, E_REQUEST, "\"%stool_choice\" %s with \"%s%s\": give one", c->prefix,
                        c->r->required_tools ? "\"required\"" : "naming a function", c->prefix, json ? what : key);
        json = 1;
        what = "tool_choice";
    }
    if (json && v)
        return fail(c, E_REQUEST, "\"%s%s\" with \"%s%s\": give one", c->prefix, key, c->prefix, what);
    const char *why_min = json ? "the object may be whole sooner" : "a choice may end sooner";
    if (!v && !json) return OK;
    if (v) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return fail(c, E_REQUEST, "\"%s%s\" must be a non-empty array of strings, not %s", c->prefix, key,
                        json_is_array(v) ? "an empty array" : repr(b, v));
        const size_t k = json_array_size(v);
        if (k > MAX_CHOICES)
            return fail(c, E_REQUEST, "\"%s%s\" holds %zu choices, more than %d", c->prefix, key, k, MAX_CHOICES);
        for (size_t i = 0; i < k; i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_string(e) || json_string_length(e) == 0)
                return fail(c, E_REQUEST, "\"%s%s\"[%zu] must be a non-empty string, not %s", c->prefix, key, i,
                            repr(b, e));
            if (memchr(json_string_value(e), '\0', json_string_length(e)))
                return fail(c, E_REQUEST, "\"%s%s\"[%zu] holds a NUL character (\\u0000)", c->prefix, key, i);
        }
    }
    if (p->n_allowed_token_ids)
        return fail(c, E_REQUEST, "\"%s%s\" and \"%sallowed_token_ids\" both say which tokens may come: give one",
                    c->prefix, what, c->prefix);
    if (p->has_min_tokens && p->min_tokens > 0)
        return fail(c, E_REQUEST, "\"%s%s\" with \"%smin_tokens\" %d: %s", c->prefix, what, c->prefix, p->min_tokens,
                    why_min);
    if (p->has_ignore_eos && p->ignore_eos)
        return fail(c, E_REQUEST, "\"%s%s\" with \"%signore_eos\": true: %s ends at the end token", c->prefix, what,
                    c->prefix, json ? "the object" : "a choice");
    if (get(o, "bad_words"))
        return fail(c, E_REQUEST, "\"%s%s\" with \"%sbad_words\": %s; give one", c->prefix, what, c->prefix,
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
        p->choices[i] = dup_n(json_string_value(e), json_string_length(e));
        if (!p->choices[i]) return OOM;
        p->n_choices = (int32_t)(i + 1);
    }
    return OK;
}

/* "logprobs": an integer in [0, 20], or (chat style) true/false with "top_logprobs". */
static int read_logprobs(line_ctx *c, const json_t *o)
{
    tp_request_params *p = &c->r->p;
    json_t *v = get(o, "logprobs");
    int has_top = 0;
    int64_t top = 0;
    TRY(read_int(c, o, "top_logprobs", 0, 20, "[0, 20]", &has_top, &top));
    if (v && json_is_boolean(v)) {
        if (has_top && !json_is_true(v))
            return fail(c, E_REQUEST, "\"%stop_logprobs\" needs \"%slogprobs\": true", c->prefix, c->prefix);
        p->has_logprobs = json_is_true(v); /* false: none, as if absent (OpenAI, vLLM) */
        p->logprobs = p->has_logprobs ? (int32_t)top : 0;
        return OK;
    }
    if (has_top)
        return fail(c, E_REQUEST, "\"%stop_logprobs\" needs \"%slogprobs\": true", c->prefix, c->prefix);
    int has;
    int64_t x;
    TRY(read_int(c, o, "logprobs", 0, 20, "[0, 20] (or true/false)", &has, &x));
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
static int read_params(line_ctx *c, const json_t *o)
{
    tp_request_params *p = &c->r->p;
    /* echo with max_tokens 0: the prompt alone (vLLM draws one token and drops it) */
    json_t *mt = get(o, "max_tokens");
    if (json_is_integer(mt) && json_integer_value(mt) == 0 && json_is_true(get(o, "echo"))) {
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
            TRY(read_int(c, o, f->key, f->ilo, f->ihi, f->range, has, &x));
            if (*has) *(int32_t *)val = (int32_t)x;
        } else if (f->kind == 'u') {
            TRY(read_int(c, o, f->key, f->ilo, f->ihi, f->range, has, &x));
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
    TRY(read_int(c, o, "max_completion_tokens", 1, INT32_MAX, "[1, 2147483647]", &has, &x));
    if (has) {
        p->has_max_tokens = 1;
        p->max_tokens = (int32_t)x;
    }
    if (p->has_min_tokens && p->has_max_tokens && p->min_tokens > p->max_tokens)
        return fail(c, E_REQUEST, "\"%smin_tokens\" %d is more than \"%smax_tokens\" %d", c->prefix,
                    p->min_tokens, c->prefix, p->max_tokens);
    if (p->echo && (c->r->endpoint == TP_ENDPOINT_CHAT || c->r->messages_json))
        return fail(c, E_REQUEST, "\"%secho\" is for completions (the prompt before the text); a chat request "
                    "cannot echo its messages", c->prefix);
    if (p->echo_only && get(o, "max_completion_tokens"))
        return fail(c, E_REQUEST, "\"%smax_tokens\" 0 (the prompt alone) with \"%smax_completion_tokens\": give one",
                    c->prefix, c->prefix);
    TRY(read_logprobs(c, o));
    TRY(read_stop(c, o));
    json_t *v = get(o, "stop_token_ids");
    if (v) TRY(read_token_ids(c, v, "stop_token_ids", 1, &p->stop_token_ids, &p->n_stop_token_ids));
    /* vLLM refuses an empty list, which would leave nothing to draw */
    if ((v = get(o, "allowed_token_ids")))
        TRY(read_token_ids(c, v, "allowed_token_ids", 0, &p->allowed_token_ids, &p->n_allowed_token_ids));
    TRY(read_logit_bias(c, o));
    TRY(read_guided(c, o));
    TRY(read_strings(c, get(o, "bad_words"), "bad_words", MAX_CHOICES, &p->bad_words, &p->n_bad_words));
    return OK;
}

static int read_add_generation_prompt(line_ctx *c, const json_t *o)
{
    int has, val;
    TRY(read_bool(c, o, "add_generation_prompt", &has, &val));
    if (has) c->r->add_generation_prompt = val;
    return OK;
}

/* ------------------------------------------------------------------------------------
 * The dialects */

static int jsonl_id(line_ctx *c, const json_t *o)
{
    json_t *id = get(o, "id"), *cid = get(o, "custom_id");
    if (id || cid) return read_id(c, id ? "id" : "custom_id", id ? id : cid, 1);
    return set_standin_id(c); /* no id: the line number, as for text */
}

static int openai_id(line_ctx *c, const json_t *o) { return read_id(c, "custom_id", get(o, "custom_id"), 0); }
static int trtllm_id(line_ctx *c, const json_t *o) { return read_id(c, "task_id", get(o, "task_id"), 1); }

/* ------------------------------------------------------------------------------------
 * Fields tpinfer does not read */

/* read by read_params besides pfields */
static const char *const param_keys[] = {"max_completion_tokens", "logprobs", "top_logprobs", "stop",
                                         "stop_token_ids", "allowed_token_ids", "logit_bias", "guided_choice",
                                         "structured_outputs", "bad_words", "response_format", "guided_json",
                                         "guided_regex", NULL};
/* meaningless in an offline batch of one model: accepted without a word */
static const char *const quiet_keys[] = {"model", "user", "stream", "stream_options", "metadata", "store",
                                         "service_tier", "parallel_tool_calls", "tool_choice", NULL};
static const char *const jsonl_keys[] = {"id", "custom_id", "prompt", "prompt_token_ids", "input_ids",
                                         "messages", "add_generation_prompt", "tools", NULL};
static const char *const openai_keys[] = {"custom_id", "method", "url", "body", NULL};
static const char *const body_keys[] = {"prompt", "messages", "add_generation_prompt", "tools", NULL};
static const char *const trtllm_keys[] = {"task_id", "prompt", "input_ids", "output_tokens", "lora_request",
                                          "media_paths", NULL};
/* they change what a request produces, and tpinfer does not do them: an error record, not
 * an output other than the one asked for (checked by refuse_unsupported) */
static const char *const unsupported_keys[] = {"functions", "function_call", "suffix",
                                               "best_of", "use_beam_search", "logits_processors", NULL};
/* vLLM's guided decoding: refused whatever their value */
static const char *const guided_keys[] = {"guided_grammar", NULL};

static int in_list(const char *const *list, const char *k)
{
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

static int is_param(const char *k)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(pfields); i++)
        if (!strcmp(pfields[i].key, k)) return 1;
    return in_list(param_keys, k) || in_list(quiet_keys, k) || in_list(unsupported_keys, k) || in_list(guided_keys, k);
}

static void count_unknown(line_ctx *c, const char *key)
{
    tp_request_list *l = c->list;
    if (!l) return;
    if (!c->unknown_here) l->unknown_lines++;
    c->unknown_here = 1;
    char name[sizeof l->unknown[0].name];
    int k = snprintf(name, sizeof name, "%s%s", c->prefix, key);
    if (k >= (int)sizeof name) memcpy(name + sizeof name - 4, "...", 4);
    for (int i = 0; i < l->n_unknown; i++)
        if (!strcmp(l->unknown[i].name, name)) {
            l->unknown[i].lines++;
            return;
        }
    if (l->n_unknown == TP_UNKNOWN_FIELDS_KEPT) {
        l->unknown_more = 1;
        return;
    }
    tp_unknown_field *u = &l->unknown[l->n_unknown++];
    memcpy(u->name, name, sizeof name);
    u->lines = 1;
    u->first_line = c->line;
}

/* o's keys that are neither in known nor (params) request settings: counted */
static void note_unknown(line_ctx *c, const json_t *o, const char *const *known, int params)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v)
    {
        (void)v;
        if (!in_list(known, k) && !(params && is_param(k))) count_unknown(c, k);
    }
}

/* The unsupported fields of o (the line, or an OpenAI body) where they ask for something:
 * an error record. Their neutral values pass (no tools, best_of 1 or n, no logits
 * processors). */
static int refuse_unsupported(line_ctx *c, const json_t *o)
{
    char b[QUOTE_CAP];
    const char *p = c->prefix;
    json_t *v;
    if ((v = get(o, "functions")) && !(json_is_array(v) && json_array_size(v) == 0))
        return fail(c, E_REQUEST, "\"%sfunctions\" (OpenAI's older function calling) is not supported: give \"tools\" "
                    "with \"tool_choice\": \"none\" to have them in the prompt", p);
    if ((v = get(o, "function_call")) && !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
        return fail(c, E_REQUEST, "\"%sfunction_call\" %s is not supported: tpinfer does not parse function calls", p,
                    repr(b, v));
    if ((v = get(o, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
        return fail(c, E_REQUEST, "\"%ssuffix\" (fill-in-the-middle) is not supported", p);
    json_t *n = get(o, "n"); /* best_of == n (vLLM's default) changes nothing */
    const json_int_t n_value = json_is_integer(n) ? json_integer_value(n) : 1;
    if ((v = get(o, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == n_value))
        return fail(c, E_REQUEST, "\"%sbest_of\" %s is not supported (\"n\" is)", p, repr(b, v));
    if ((v = get(o, "use_beam_search")) && !json_is_false(v))
        return fail(c, E_REQUEST, "\"%suse_beam_search\": beam search is not supported", p);
    for (const char *const *g = guided_keys; *g; g++)
        if (get(o, *g))
            return fail(c, E_REQUEST, "\"%s%s\": guided decoding by a grammar is not supported "
                        "(guided_choice, guided_json, guided_regex and response_format are)", p, *g);
    if ((v = get(o, "logits_processors")) && !(json_is_array(v) && json_array_size(v) == 0))
        return fail(c, E_REQUEST, "\"%slogits_processors\": custom logits processors are not supported", p);
    return OK;
}

static int parse_jsonl(line_ctx *c, const json_t *o)
{
    TRY(jsonl_id(c, o));
    if (get(o, "id") && get(o, "custom_id"))
        return fail(c, E_REQUEST, "give one of \"id\" and \"custom_id\", not both");
    static const char *const keys[] = {"prompt", "prompt_token_ids", "input_ids", "messages"};
    json_t *given[4];
    int n_given = 0;
    for (int i = 0; i < 4; i++) n_given += (given[i] = get(o, keys[i])) != NULL;
    if (n_given != 1) {
        const char *hint = "";
        if (json_object_get(o, "body") && json_object_get(o, "url"))
            hint = " (this looks like an OpenAI batch line: use --input-format openai or auto)";
        else if (json_object_get(o, "task_id"))
            hint = " (this looks like a TensorRT-LLM line: use --input-format trtllm or auto)";
        return fail(c, E_REQUEST,
                    "give exactly one of \"prompt\", \"prompt_token_ids\", \"input_ids\" and \"messages\" (the line has %d)%s",
                    n_given, hint);
    }
    if (given[0]) {
        if (json_is_array(given[0]))
            return fail(c, E_REQUEST, "\"prompt\" must be a string, not an array (token ids go in \"prompt_token_ids\")");
        TRY(set_prompt(c, given[0], "prompt"));
    } else if (given[1] || given[2]) {
        TRY(read_token_ids(c, given[1] ? given[1] : given[2], given[1] ? keys[1] : keys[2], 0,
                           &c->r->prompt_ids, &c->r->n_prompt_ids));
    } else {
        TRY(read_messages(c, given[3]));
    }
    TRY(read_add_generation_prompt(c, o));
    TRY(refuse_unsupported(c, o));
    TRY(read_tools(c, o));
    TRY(read_params(c, o));
    note_unknown(c, o, jsonl_keys, 1);
    return OK;
}

static int parse_openai(line_ctx *c, const json_t *o)
{
    char b[QUOTE_CAP];
    TRY(openai_id(c, o));
    json_t *method = get(o, "method"), *url = get(o, "url"), *body = get(o, "body");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST"))
        return fail(c, E_REQUEST, "\"method\" must be \"POST\", not %s", method ? repr(b, method) : "missing");
    if (json_is_string(url) && !strcmp(json_string_value(url), "/v1/completions"))
        c->r->endpoint = TP_ENDPOINT_COMPLETIONS;
    else if (json_is_string(url) && !strcmp(json_string_value(url), "/v1/chat/completions"))
        c->r->endpoint = TP_ENDPOINT_CHAT;
    else if (!url)
        return fail(c, E_REQUEST, "\"url\" is required: \"/v1/completions\" or \"/v1/chat/completions\"");
    else
        return fail(c, E_REQUEST, "\"url\" %s is not supported: use \"/v1/completions\" or \"/v1/chat/completions\"",
                    repr(b, url));
    if (!json_is_object(body))
        return fail(c, E_REQUEST, "\"body\" must be an object, not %s", body ? repr(b, body) : "missing");
    note_unknown(c, o, openai_keys, 0);
    c->prefix = "body.";
    TRY(refuse_unsupported(c, body));
    note_unknown(c, body, body_keys, 1);
    json_t *stream = get(body, "stream");
    if (stream && !json_is_boolean(stream))
        return fail(c, E_REQUEST, "\"body.stream\" must be true or false, not %s", repr(b, stream));
    if (json_is_true(stream)) return fail(c, E_REQUEST, "\"body.stream\": stream mode is not supported in a batch");
    if (c->r->endpoint == TP_ENDPOINT_CHAT) {
        json_t *m = get(body, "messages");
        if (!m) return fail(c, E_REQUEST, "\"body.messages\" is required for /v1/chat/completions");
        TRY(read_messages(c, m));
        TRY(read_add_generation_prompt(c, body));
        TRY(read_tools(c, body));
        return read_params(c, body);
    }
    json_t *pr = get(body, "prompt");
    if (!pr)
        return fail(c, E_REQUEST, "\"body.prompt\" is required for /v1/completions%s",
                    get(body, "messages") ? " (\"messages\" needs \"url\": \"/v1/chat/completions\")" : "");
    if (json_is_array(pr) && json_array_size(pr) > 0 && !json_is_integer(json_array_get(pr, 0)) &&
        !(c->lossy && json_is_real(json_array_get(pr, 0)))) {
        /* a list of prompts: one is fine */
        if (json_array_size(pr) > 1)
            return fail(c, E_REQUEST, "\"body.prompt\" holds %zu prompts; a batch line takes one (write one line per prompt)",
                        json_array_size(pr));
        pr = json_array_get(pr, 0);
        if (json_is_array(pr))
            TRY(read_token_ids(c, pr, "prompt[0]", 0, &c->r->prompt_ids, &c->r->n_prompt_ids));
        else
            TRY(set_prompt(c, pr, "prompt[0]"));
    } else if (json_is_array(pr)) {
        TRY(read_token_ids(c, pr, "prompt", 0, &c->r->prompt_ids, &c->r->n_prompt_ids));
    } else {
        TRY(set_prompt(c, pr, "prompt"));
    }
    TRY(read_tools(c, body)); /* none, or an error: tools need messages */
    return read_params(c, body);
}

static int parse_trtllm(line_ctx *c, const json_t *o)
{
    TRY(trtllm_id(c, o));
    json_t *ids = get(o, "input_ids"), *pr = get(o, "prompt");
    if (get(o, "lora_request")) return fail(c, E_REQUEST, "\"lora_request\": LoRA adapters are not supported");
    if (get(o, "media_paths")) return fail(c, E_REQUEST, "\"media_paths\": multimodal input is not supported");
    if (ids) /* input_ids wins over prompt, as in trtllm-bench */
        TRY(read_token_ids(c, ids, "input_ids", 0, &c->r->prompt_ids, &c->r->n_prompt_ids));
    else if (pr)
        TRY(set_prompt(c, pr, "prompt"));
    else
        return fail(c, E_REQUEST, "give \"prompt\" or \"input_ids\"");
    int has;
    int64_t x;
    TRY(read_int(c, o, "output_tokens", 1, INT32_MAX, "[1, 2147483647]", &has, &x));
    if (has) {
        c->r->p.has_max_tokens = 1;
        c->r->p.max_tokens = (int32_t)x;
    }
    note_unknown(c, o, trtllm_keys, 0);
    return OK;
}

static int read_dialect_id(line_ctx *c, tp_input_format fmt, const json_t *o)
{
    if (fmt == TP_INPUT_OPENAI) return openai_id(c, o);
    if (fmt == TP_INPUT_TRTLLM) return trtllm_id(c, o);
    return jsonl_id(c, o);
}

/* A line with bad UTF-8: try to read its id anyway, from a copy whose bad bytes are
 * replaced by U+FFFD (an id that then holds U+FFFD is not trusted). */
static int recover_id(line_ctx *c, tp_input_format fmt, const char *s, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++, bad++) i += utf8_valid_prefix((const unsigned char *)s + i, n - i);
    char *copy = malloc(n + 2 * bad + 1), *q = copy;
    if (!copy) return OOM;
    for (size_t i = 0; i < n;) {
        size_t ok = utf8_valid_prefix((const unsigned char *)s + i, n - i);
        memcpy(q, s + i, ok);
        q += ok;
        i += ok;
        if (i < n) {
            memcpy(q, "\xEF\xBF\xBD", 3);
            q += 3;
            i++;
        }
    }
    json_t *o = json_loadb(copy, (size_t)(q - copy), JSON_ALLOW_NUL, NULL);
    free(copy);
    int rc = OK;
    if (json_is_object(o)) {
        rc = read_dialect_id(c, fmt, o);
        if (rc == OK && c->r->id && strstr(c->r->id, "\xEF\xBF\xBD")) rc = set_standin_id(c);
        if (rc == BAD) rc = OK; /* the UTF-8 error is the one reported */
    }
    json_decref(o);
    if (rc == OK && !c->r->id) rc = set_standin_id(c);
    return rc;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    default: return "an object";
    }
}

/* Fill r from line s[0..n) (no '\n', no trailing '\r'). OOM is the only failure; a bad
 * line is recorded in r. */
static int parse_line(tp_request *r, const char *s, size_t n, int64_t line, tp_input_format fmt,
                      int64_t vocab, size_t max_line, int *standin, tp_request_list *list)
{
    line_ctx c = {.r = r, .line = line, .vocab = vocab, .prefix = "", .list = list};
    r->line = line;
    r->add_generation_prompt = 1;
    int rc = OK;
    size_t valid;
    if (n > max_line) {
        rc = set_standin_id(&c);
        if (rc == OK)
            rc = fail(&c, E_REQUEST, "the line is %zu bytes, more than --max-line-bytes %zu", n, max_line);
    } else if ((valid = utf8_valid_prefix((const unsigned char *)s, n)) < n) {
        rc = fail(&c, E_UTF8, "invalid UTF-8 at byte %zu of the line (0x%02x)", valid + 1,
                  (unsigned char)s[valid]);
        if (rc != OOM) rc = fmt == TP_INPUT_TEXT ? set_standin_id(&c) : recover_id(&c, fmt, s, n);
    } else if (fmt == TP_INPUT_TEXT) {
        rc = set_standin_id(&c);
        if (rc == OK) {
            r->prompt = dup_n(s, n);
            r->prompt_len = n;
            if (!r->prompt) rc = OOM;
        }
    } else {
        json_error_t err, err2;
        const size_t flags = JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY;
        json_t *o = json_loadb(s, n, flags, &err);
        if (!o && json_error_code(&err) == json_error_numeric_overflow) {
            /* an integer beyond 64 bits: read it as a real to report the field, keep the id */
            o = json_loadb(s, n, flags | JSON_DECODE_INT_AS_REAL, &err2);
            c.lossy = o != NULL;
        }
        if (!o) {
            rc = set_standin_id(&c);
            if (rc == OK && !strncmp(err.text, "invalid Unicode", 15))
                rc = fail(&c, E_UTF8, "invalid JSON string escape at column %d: %s (a lone UTF-16 surrogate)",
                          err.column, err.text);
            else if (rc == OK)
                rc = fail(&c, E_JSON, "invalid JSON at column %d: %s", err.column, err.text);
        } else if (!json_is_object(o)) {
            rc = set_standin_id(&c);
            if (rc == OK) rc = fail(&c, E_JSON, "a line must be a JSON object, not %s", type_name(o));
        } else {
            rc = fmt == TP_INPUT_OPENAI   ? parse_openai(&c, o)
                 : fmt == TP_INPUT_TRTLLM ? parse_trtllm(&c, o)
                                          : parse_jsonl(&c, o);
            if (rc == OK && c.lossy) /* the number is not in a field we read: still an error */
                rc = fail(&c, E_REQUEST, "at column %d, %s: integers must fit in 64 bits", err.column, err.text);
        }
        json_decref(o);
    }
    *standin = c.standin;
    if (rc == OOM) return OOM;
    if (r->error_code) payload_free(r);
    return OK;
}

/* ------------------------------------------------------------------------------------
 * The file, as a stream of lines */

#define READ_CHUNK ((size_t)1 << 20) /* bytes read at a time */

/* The input's non-blank lines, one at a time, from a file (read in chunks, holding at most
 * the longest line it returns) or from memory. */
typedef struct line_reader {
    FILE *f;              /* NULL: memory */
    char *buf;            /* file: owned; memory: the text */
    size_t cap, at, end;  /* buf[at..end) not yet returned */
    size_t no_nl;         /* bytes from at known to hold no '\n' (a long line is not searched again) */
    char lead;            /* the last line's first byte other than a space or tab */
    size_t max_line;      /* a longer line is skipped, not held: only its length is returned */
    int eof, started;
    int64_t line;         /* 1-based number of the last line returned */
    const char *what;
} line_reader;

static void reader_memory(line_reader *rd, const char *text, size_t len, size_t max_line, const char *what)
{
    memset(rd, 0, sizeof *rd);
    rd->buf = (char *)text;
    rd->end = len;
    rd->eof = 1;
    rd->max_line = max_line;
    rd->what = what;
}

static tp_status reader_fill(line_reader *rd)
{
    if (rd->at > 0) { /* keep the unread tail at the start */
        memmove(rd->buf, rd->buf + rd->at, rd->end - rd->at);
        rd->end -= rd->at;
        rd->at = 0;
    }
    if (rd->cap - rd->end < READ_CHUNK) {
        size_t c = rd->cap ? 2 * rd->cap : 2 * READ_CHUNK;
        while (c - rd->end < READ_CHUNK) c *= 2;
        char *b = realloc(rd->buf, c);
        if (!b) return tp_error(TP_ERR_OOM, "out of memory reading %s (a line of %zu bytes)", rd->what, rd->end);
        rd->buf = b;
        rd->cap = c;
    }
    size_t got = fread(rd->buf + rd->end, 1, rd->cap - rd->end, rd->f);
    rd->end += got;
    if (got == 0 && ferror(rd->f)) return tp_error(TP_ERR_IO, "cannot read %s: %s", rd->what, strerror(errno));
    if (got == 0) rd->eof = 1;
    return TP_OK;
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

/* The rest of a line too long to hold, up to its '\n' (or the end): counted into *n (a
 * last '\r' not), *all_blank cleared where it holds more than blanks. */
static tp_status reader_skip_line(line_reader *rd, size_t *n, int *all_blank)
{
    char last = 0;
    for (;;) {
        const char *s = rd->buf + rd->at;
        const char *nl = rd->end > rd->at ? memchr(s, '\n', rd->end - rd->at) : NULL;
        const size_t k = nl ? (size_t)(nl - s) : rd->end - rd->at;
        if (*all_blank) *all_blank = blank(s, k);
        if (k) last = s[k - 1];
        *n += k;
        rd->at += k + (nl != NULL);
        rd->no_nl = 0;
        if (nl || rd->eof) break;
        rd->at = rd->end = 0; /* nothing of it is kept */
        TP_CHECK(reader_fill(rd));
        if (rd->end == 0 && rd->eof) break;
    }
    if (last == '\r') --*n;
    return TP_OK;
}

static char lead_byte(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
    return i < n ? s[i] : 0;
}

/* The next non-blank line, without its '\n' and trailing '\r': *got 0 at the end. *s is
 * NULL for a line longer than max_line (+ its '\r'), which is not held: *n is its length. */
static tp_status reader_next(line_reader *rd, const char **s_out, size_t *n_out, int *got)
{
    *got = 0;
    for (;;) {
        /* a UTF-8 byte order mark is not part of the first line (even one too long to hold) */
        if (!rd->started && (!rd->f || rd->eof || rd->end - rd->at >= 3)) {
            rd->started = 1;
            if (rd->end - rd->at >= 3 && !memcmp(rd->buf + rd->at, "\xEF\xBB\xBF", 3)) rd->at += 3;
        }
        if (rd->f && !rd->eof) {
            const size_t unsearched = rd->end - rd->at - rd->no_nl;
            if (!unsearched || !memchr(rd->buf + rd->at + rd->no_nl, '\n', unsearched)) {
                rd->no_nl = rd->end - rd->at;
                if (rd->no_nl > rd->max_line + 1) { /* too long to hold: count it, keep nothing */
                    size_t n = 0;
                    int all_blank = 1;
                    const char lead = lead_byte(rd->buf + rd->at, rd->end - rd->at);
                    rd->line++;
                    TP_CHECK(reader_skip_line(rd, &n, &all_blank));
                    if (all_blank) continue;
                    rd->lead = lead;
                    *s_out = NULL;
                    *n_out = n;
                    *got = 1;
                    return TP_OK;
                }
                TP_CHECK(reader_fill(rd));
                continue;
            }
        }
        if (rd->at >= rd->end) return TP_OK;
        const char *s = rd->buf + rd->at;
        const char *nl = memchr(s, '\n', rd->end - rd->at);
        size_t n = nl ? (size_t)(nl - s) : rd->end - rd->at;
        rd->at += n + (nl != NULL);
        rd->no_nl = 0;
        rd->line++;
        if (n && s[n - 1] == '\r') n--;
        if (blank(s, n)) continue;
        rd->lead = lead_byte(s, n);
        *s_out = n > rd->max_line ? NULL : s;
        *n_out = n;
        *got = 1;
        return TP_OK;
    }
}

/* Back to the first line (auto-detection reads ahead). */
static tp_status reader_rewind(line_reader *rd)
{
    rd->line = 0;
    rd->started = 0;
    if (!rd->f) {
        rd->at = 0;
        return TP_OK;
    }
    rd->at = rd->end = rd->no_nl = 0;
    rd->eof = 0;
    if (fseek(rd->f, 0, SEEK_SET) != 0) return tp_error(TP_ERR_IO, "cannot read %s again: %s", rd->what, strerror(errno));
    return TP_OK;
}

/* TP_INPUT_AUTO: text unless the first non-blank line starts with '{'; then the first
 * line (of the first DETECT_LINES) that parses as an object picks the dialect. */
static tp_status detect(line_reader *rd, tp_input_format *fmt)
{
    const char *s;
    size_t n;
    int got;
    *fmt = TP_INPUT_JSONL;
    TP_CHECK(reader_next(rd, &s, &n, &got));
    if (!got) return reader_rewind(rd);
    if (rd->lead != '{') {
        *fmt = TP_INPUT_TEXT;
        return reader_rewind(rd);
    }
    for (int k = 0; k < DETECT_LINES; k++) {
        if (k > 0) TP_CHECK(reader_next(rd, &s, &n, &got));
        if (!got) break;
        if (!s) continue; /* longer than max_line */
        json_t *o = json_loadb(s, n, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL);
        if (!json_is_object(o)) {
            json_decref(o);
            continue;
        }
        if (json_object_get(o, "custom_id") && json_object_get(o, "body") && json_object_get(o, "url"))
            *fmt = TP_INPUT_OPENAI;
        else if (json_object_get(o, "task_id"))
            *fmt = TP_INPUT_TRTLLM;
        json_decref(o);
        break;
    }
    return reader_rewind(rd);
}

/* ------------------------------------------------------------------------------------
 * The requests */

typedef struct id_ref {
    const char *id;
    int64_t line;
    int standin;
} id_ref;

static int by_id_then_line(const void *a, const void *b)
{
    const id_ref *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

static tp_status check_unique_ids(const tp_request_list *l, const char *what)
{
    const size_t n = l->n_total;
    for (size_t i = 0; i < n; i++)
        if (i >= l->id_n || l->id_at[i] == SIZE_MAX)
            return tp_error(TP_ERR_INTERNAL, "%s: the id of request %zu (of %zu) is missing", what, i, n);
    id_ref *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return tp_error(TP_ERR_OOM, "out of memory checking %zu request ids", n);
    for (size_t i = 0; i < n; i++) v[i] = (id_ref){l->id_text + l->id_at[i], l->id_line[i], l->id_standin[i]};
    qsort(v, n, sizeof *v, by_id_then_line);
    tp_status st = TP_OK;
    for (size_t i = 1; i < n; i++) {
        if (strcmp(v[i - 1].id, v[i].id)) continue;
        char b[QUOTE_CAP], note[160] = "";
        const id_ref *a = &v[i - 1], *z = &v[i];
        if (a->standin || z->standin)
            snprintf(note, sizeof note, " (line %lld has no readable id, so its line number stands in)",
                     (long long)(a->standin ? a->line : z->line));
        st = tp_error(TP_ERR_INVALID_ARG, "%s: id %s is used on line %lld and again on line %lld%s; ids must be unique",
                      what, quote(b, a->id, strlen(a->id)), (long long)a->line, (long long)z->line, note);
        break;
    }
    free(v);
    return st;
}

tp_status tp_requests_check_ids(tp_request_list *l, const char *what)
{
    tp_status st = check_unique_ids(l, what ? what : "the input");
    free(l->id_line); /* only the ids are needed from here on */
    free(l->id_standin);
    l->id_line = NULL;
    l->id_standin = NULL;
    return st;
}

tp_status tp_requests_put_id(tp_request_list *l, size_t pos, const char *id, int64_t line, int standin)
{
    if (pos >= l->id_n) {
        size_t c = l->id_n ? l->id_n : 64;
        while (c <= pos) c *= 2;
        size_t *at = realloc(l->id_at, c * sizeof *at);
        if (at) l->id_at = at;
        int64_t *ln = at ? realloc(l->id_line, c * sizeof *ln) : NULL;
        if (ln) l->id_line = ln;
        unsigned char *si = ln ? realloc(l->id_standin, c) : NULL;
        if (!si) return tp_error(TP_ERR_OOM, "out of memory for %zu request ids", c);
        l->id_standin = si;
        for (size_t i = l->id_n; i < c; i++) at[i] = SIZE_MAX;
        l->id_n = c;
    }
    const size_t k = strlen(id) + 1;
    if (l->id_cap - l->id_len < k) {
        size_t c = l->id_cap ? 2 * l->id_cap : 4096;
        while (c - l->id_len < k) c *= 2;
        char *t = realloc(l->id_text, c);
        if (!t) return tp_error(TP_ERR_OOM, "out of memory for request ids (%zu bytes)", c);
        l->id_text = t;
        l->id_cap = c;
    }
    l->id_at[pos] = l->id_len;
    memcpy(l->id_text + l->id_len, id, k);
    l->id_len += k;
    l->id_line[pos] = line;
    l->id_standin[pos] = (unsigned char)(standin != 0);
    return TP_OK;
}

/* Room for one more request at l->v[l->n]. */
static tp_status grow(tp_request_list *l, size_t *cap, const char *what)
{
    if (l->n < *cap) return TP_OK;
    size_t c = *cap ? 2 * *cap : 64;
    tp_request *v = realloc(l->v, c * sizeof *v);
    if (!v) return tp_error(TP_ERR_OOM, "out of memory reading %s (%zu requests so far)", what, l->n);
    l->v = v;
    *cap = c;
    return TP_OK;
}

static tp_status read_lines(line_reader *rd, tp_input_format fmt, int64_t vocab_size, const tp_request_share *share,
                            tp_request_list *out)
{
    const char *what = rd->what;
    const tp_request_share all = {1, 0, 1, NULL, NULL, NULL};
    if (!share) share = &all;
    if (share->parts < 1 || share->part < 0 || share->part >= share->parts)
        return tp_error(TP_ERR_INTERNAL, "a share %d of %d requests", share->part, share->parts);
    if (fmt == TP_INPUT_AUTO) TP_CHECK(detect(rd, &fmt));

    size_t cap = 0;
    tp_status st = TP_OK;
    const char *s;
    size_t n;
    int got;
    for (;;) {
        TP_CHECK_GOTO(reader_next(rd, &s, &n, &got), st, fail);
        if (!got) break;
        const size_t pos = out->n_total;
        const int kept = share->keep ? share->keep(share->arg, pos) : pos % (size_t)share->parts == (size_t)share->part;
        if (!kept && !share->all_ids) {
            out->n_total++;
            continue;
        }
        TP_CHECK_GOTO(grow(out, &cap, what), st, fail);
        tp_request *r = &out->v[out->n];
        memset(r, 0, sizeof *r);
        r->pos = (int64_t)pos;
        if (parse_line(r, s, n, rd->line, fmt, vocab_size, rd->max_line, &r->standin, out) != OK) {
            request_free(r);
            st = tp_error(TP_ERR_OOM, "out of memory reading %s at line %lld", what, (long long)rd->line);
            goto fail;
        }
        out->any_endpoint |= r->endpoint != TP_ENDPOINT_NONE;
        out->any_chat_room |= tp_request_chat_without_max_tokens(r) && !r->error_code;
        if (share->all_ids && (st = tp_requests_put_id(out, pos, r->id, r->line, r->standin)) != TP_OK) {
            request_free(r);
            goto fail;
        }
        out->n_total++;
        if (!kept) {
            request_free(r);
            continue;
        }
        out->n++;
        out->n_errors += r->error_code != NULL;
        if (share->on_kept) TP_CHECK_GOTO(share->on_kept(share->arg, r), st, fail);
    }
    if (out->n_total == 0) {
        st = tp_error(TP_ERR_INVALID_ARG, "%s holds no requests (it is empty or has only blank lines)", what);
        goto fail;
    }
    /* duplicate ids would make the output ambiguous: refuse, naming both lines */
    if (share->all_ids) TP_CHECK_GOTO(tp_requests_check_ids(out, what), st, fail);
    if (out->n && out->n < cap) { /* held for the whole run: give back the doubling's spare room */
        tp_request *fit = realloc(out->v, out->n * sizeof *out->v);
        if (fit) out->v = fit;
    }
    return TP_OK;
fail:
    tp_requests_free(out);
    return st;
}

tp_status tp_requests_parse_share(const char *text, size_t len, const char *what, tp_input_format fmt,
                                  int64_t vocab_size, size_t max_line_bytes, const tp_request_share *share,
                                  tp_request_list *out)
{
    memset(out, 0, sizeof *out);
    if (vocab_size <= 0 || vocab_size > (int64_t)INT32_MAX + 1) vocab_size = (int64_t)INT32_MAX + 1;
    line_reader rd;
    reader_memory(&rd, text, len, max_line_bytes ? max_line_bytes : SIZE_MAX - 2, what ? what : "the input");
    return read_lines(&rd, fmt, vocab_size, share, out);
}

tp_status tp_requests_parse(const char *text, size_t len, const char *what, tp_input_format fmt,
                            int64_t vocab_size, size_t max_line_bytes, tp_request_list *out)
{
    return tp_requests_parse_share(text, len, what, fmt, vocab_size, max_line_bytes, NULL, out);
}

const char *tp_requests_id(const tp_request_list *l, size_t pos)
{
    return pos < l->id_n && pos < l->n_total && l->id_at[pos] != SIZE_MAX ? l->id_text + l->id_at[pos] : NULL;
}

void tp_requests_unknown_summary(const tp_request_list *l, char *buf, size_t cap)
{
    size_t o = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < l->n_unknown && o < cap; i++) {
        const tp_unknown_field *u = &l->unknown[i];
        int k = u->lines == 1
                    ? snprintf(buf + o, cap - o, "%s\"%s\" (line %lld)", i ? ", " : "", u->name, (long long)u->first_line)
                    : snprintf(buf + o, cap - o, "%s\"%s\" (%lld lines, first line %lld)", i ? ", " : "", u->name,
                               (long long)u->lines, (long long)u->first_line);
        if (k < 0) break;
        o += (size_t)k;
    }
    if (l->unknown_more && o < cap) snprintf(buf + o, cap - o, " and others");
}

tp_status tp_requests_read_share(const char *path, tp_input_format fmt, int64_t vocab_size, size_t max_line_bytes,
                                 const tp_request_share *share, tp_request_list *out)
{
    struct stat sb;
    memset(out, 0, sizeof *out);
    if (!path || !strcmp(path, "-"))
        return tp_error(TP_ERR_INVALID_ARG,
                        "reading prompts from standard input is not supported: write them to a file and give its path");
    /* stat first: opening a FIFO would block until a writer comes */
    if (stat(path, &sb) != 0) return tp_error(TP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return tp_error(TP_ERR_IO, "%s is a directory, not a prompt file", path);
    if (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode) || S_ISCHR(sb.st_mode))
        return tp_error(TP_ERR_IO,
                        "%s is a %s, not a regular file: every rank reads the prompt file, and checks it before the "
                        "model loads, so pipes and standard input (/dev/stdin) are not supported; write the prompts "
                        "to a file",
                        path, S_ISFIFO(sb.st_mode) ? "pipe (FIFO)" : S_ISSOCK(sb.st_mode) ? "socket" : "character device");
    if (!S_ISREG(sb.st_mode)) return tp_error(TP_ERR_IO, "%s is not a regular file", path);
    if (vocab_size <= 0 || vocab_size > (int64_t)INT32_MAX + 1) vocab_size = (int64_t)INT32_MAX + 1;
    line_reader rd;
    memset(&rd, 0, sizeof rd);
    rd.max_line = max_line_bytes ? max_line_bytes : SIZE_MAX - 2;
    rd.what = path;
    rd.f = fopen(path, "rb");
    if (!rd.f) return tp_error(TP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    tp_status st = read_lines(&rd, fmt, vocab_size, share, out);
    fclose(rd.f);
    free(rd.buf);
    return st;
}

tp_status tp_requests_read(const char *path, tp_input_format fmt, int64_t vocab_size, size_t max_line_bytes,
                           tp_request_list *out)
{
    return tp_requests_read_share(path, fmt, vocab_size, max_line_bytes, NULL, out);
}
