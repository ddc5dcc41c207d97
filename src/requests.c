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
 *
 * Here: the file as lines, the dialects (which fields each reads, the id, the unknown and
 * refused fields), the list; request_fields.c reads the fields themselves.
 */
#include "requests.h"
#include "request_line.h"
#include "json_schema.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

#define DETECT_LINES 1000 /* lines auto-detection may parse */

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
 * The dialects */

static int jsonl_id(line_ctx *c, const json_t *o)
{
    json_t *id = rq_get(o, "id"), *cid = rq_get(o, "custom_id");
    if (id || cid) return rq_read_id(c, id ? "id" : "custom_id", id ? id : cid, 1);
    return rq_set_standin_id(c); /* no id: the line number, as for text */
}

static int openai_id(line_ctx *c, const json_t *o) { return rq_read_id(c, "custom_id", rq_get(o, "custom_id"), 0); }
static int trtllm_id(line_ctx *c, const json_t *o) { return rq_read_id(c, "task_id", rq_get(o, "task_id"), 1); }

/* ------------------------------------------------------------------------------------
 * Fields tpinfer does not read */

/* read by rq_read_params besides its table of fields (rq_pfield_named) */
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
    return rq_pfield_named(k) || in_list(param_keys, k) || in_list(quiet_keys, k) || in_list(unsupported_keys, k) ||
           in_list(guided_keys, k);
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
    if ((v = rq_get(o, "functions")) && !(json_is_array(v) && json_array_size(v) == 0))
        return rq_fail(c, E_REQUEST, "\"%sfunctions\" (OpenAI's older function calling) is not supported: give \"tools\" "
                       "with \"tool_choice\": \"none\" to have them in the prompt", p);
    if ((v = rq_get(o, "function_call")) && !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
        return rq_fail(c, E_REQUEST, "\"%sfunction_call\" %s is not supported: tpinfer does not parse function calls", p,
                       rq_repr(b, v));
    if ((v = rq_get(o, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
        return rq_fail(c, E_REQUEST, "\"%ssuffix\" (fill-in-the-middle) is not supported", p);
    json_t *n = rq_get(o, "n"); /* best_of == n (vLLM's default) changes nothing */
    const json_int_t n_value = json_is_integer(n) ? json_integer_value(n) : 1;
    if ((v = rq_get(o, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == n_value))
        return rq_fail(c, E_REQUEST, "\"%sbest_of\" %s is not supported (\"n\" is)", p, rq_repr(b, v));
    if ((v = rq_get(o, "use_beam_search")) && !json_is_false(v))
        return rq_fail(c, E_REQUEST, "\"%suse_beam_search\": beam search is not supported", p);
    for (const char *const *g = guided_keys; *g; g++)
        if (rq_get(o, *g))
            return rq_fail(c, E_REQUEST, "\"%s%s\": guided decoding by a grammar is not supported "
                           "(guided_choice, guided_json, guided_regex and response_format are)", p, *g);
    if ((v = rq_get(o, "logits_processors")) && !(json_is_array(v) && json_array_size(v) == 0))
        return rq_fail(c, E_REQUEST, "\"%slogits_processors\": custom logits processors are not supported", p);
    return OK;
}

static int parse_jsonl(line_ctx *c, const json_t *o)
{
    TRY(jsonl_id(c, o));
    if (rq_get(o, "id") && rq_get(o, "custom_id"))
        return rq_fail(c, E_REQUEST, "give one of \"id\" and \"custom_id\", not both");
    static const char *const keys[] = {"prompt", "prompt_token_ids", "input_ids", "messages"};
    json_t *given[4];
    int n_given = 0;
    for (int i = 0; i < 4; i++) n_given += (given[i] = rq_get(o, keys[i])) != NULL;
    if (n_given != 1) {
        const char *hint = "";
        if (json_object_get(o, "body") && json_object_get(o, "url"))
            hint = " (this looks like an OpenAI batch line: use --input-format openai or auto)";
        else if (json_object_get(o, "task_id"))
            hint = " (this looks like a TensorRT-LLM line: use --input-format trtllm or auto)";
        return rq_fail(c, E_REQUEST,
                       "give exactly one of \"prompt\", \"prompt_token_ids\", \"input_ids\" and \"messages\" (the line has %d)%s",
                       n_given, hint);
    }
    if (given[0]) {
        if (json_is_array(given[0]))
            return rq_fail(c, E_REQUEST, "\"prompt\" must be a string, not an array (token ids go in \"prompt_token_ids\")");
        TRY(rq_set_prompt(c, given[0], "prompt"));
    } else if (given[1] || given[2]) {
        TRY(rq_read_token_ids(c, given[1] ? given[1] : given[2], given[1] ? keys[1] : keys[2], 0,
                              &c->r->prompt_ids, &c->r->n_prompt_ids));
    } else {
        TRY(rq_read_messages(c, given[3]));
    }
    TRY(rq_read_add_generation_prompt(c, o));
    TRY(refuse_unsupported(c, o));
    TRY(rq_read_tools(c, o));
    TRY(rq_read_params(c, o));
    note_unknown(c, o, jsonl_keys, 1);
    return OK;
}

static int parse_openai(line_ctx *c, const json_t *o)
{
    char b[QUOTE_CAP];
    TRY(openai_id(c, o));
    json_t *method = rq_get(o, "method"), *url = rq_get(o, "url"), *body = rq_get(o, "body");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST"))
        return rq_fail(c, E_REQUEST, "\"method\" must be \"POST\", not %s", method ? rq_repr(b, method) : "missing");
    if (json_is_string(url) && !strcmp(json_string_value(url), "/v1/completions"))
        c->r->endpoint = TP_ENDPOINT_COMPLETIONS;
    else if (json_is_string(url) && !strcmp(json_string_value(url), "/v1/chat/completions"))
        c->r->endpoint = TP_ENDPOINT_CHAT;
    else if (!url)
        return rq_fail(c, E_REQUEST, "\"url\" is required: \"/v1/completions\" or \"/v1/chat/completions\"");
    else
        return rq_fail(c, E_REQUEST, "\"url\" %s is not supported: use \"/v1/completions\" or \"/v1/chat/completions\"",
                       rq_repr(b, url));
    if (!json_is_object(body))
        return rq_fail(c, E_REQUEST, "\"body\" must be an object, not %s", body ? rq_repr(b, body) : "missing");
    note_unknown(c, o, openai_keys, 0);
    c->prefix = "body.";
    TRY(refuse_unsupported(c, body));
    note_unknown(c, body, body_keys, 1);
    json_t *stream = rq_get(body, "stream");
    if (stream && !json_is_boolean(stream))
        return rq_fail(c, E_REQUEST, "\"body.stream\" must be true or false, not %s", rq_repr(b, stream));
    if (json_is_true(stream)) return rq_fail(c, E_REQUEST, "\"body.stream\": stream mode is not supported in a batch");
    if (c->r->endpoint == TP_ENDPOINT_CHAT) {
        json_t *m = rq_get(body, "messages");
        if (!m) return rq_fail(c, E_REQUEST, "\"body.messages\" is required for /v1/chat/completions");
        TRY(rq_read_messages(c, m));
        TRY(rq_read_add_generation_prompt(c, body));
        TRY(rq_read_tools(c, body));
        return rq_read_params(c, body);
    }
    json_t *pr = rq_get(body, "prompt");
    if (!pr)
        return rq_fail(c, E_REQUEST, "\"body.prompt\" is required for /v1/completions%s",
                       rq_get(body, "messages") ? " (\"messages\" needs \"url\": \"/v1/chat/completions\")" : "");
    if (json_is_array(pr) && json_array_size(pr) > 0 && !json_is_integer(json_array_get(pr, 0)) &&
        !(c->lossy && json_is_real(json_array_get(pr, 0)))) {
        /* a list of prompts: one is fine */
        if (json_array_size(pr) > 1)
            return rq_fail(c, E_REQUEST, "\"body.prompt\" holds %zu prompts; a batch line takes one (write one line per prompt)",
                           json_array_size(pr));
        pr = json_array_get(pr, 0);
        if (json_is_array(pr))
            TRY(rq_read_token_ids(c, pr, "prompt[0]", 0, &c->r->prompt_ids, &c->r->n_prompt_ids));
        else
            TRY(rq_set_prompt(c, pr, "prompt[0]"));
    } else if (json_is_array(pr)) {
        TRY(rq_read_token_ids(c, pr, "prompt", 0, &c->r->prompt_ids, &c->r->n_prompt_ids));
    } else {
        TRY(rq_set_prompt(c, pr, "prompt"));
    }
    TRY(rq_read_tools(c, body)); /* none, or an error: tools need messages */
    return rq_read_params(c, body);
}

static int parse_trtllm(line_ctx *c, const json_t *o)
{
    TRY(trtllm_id(c, o));
    json_t *ids = rq_get(o, "input_ids"), *pr = rq_get(o, "prompt");
    if (rq_get(o, "lora_request")) return rq_fail(c, E_REQUEST, "\"lora_request\": LoRA adapters are not supported");
    if (rq_get(o, "media_paths")) return rq_fail(c, E_REQUEST, "\"media_paths\": multimodal input is not supported");
    if (ids) /* input_ids wins over prompt, as in trtllm-bench */
        TRY(rq_read_token_ids(c, ids, "input_ids", 0, &c->r->prompt_ids, &c->r->n_prompt_ids));
    else if (pr)
        TRY(rq_set_prompt(c, pr, "prompt"));
    else
        return rq_fail(c, E_REQUEST, "give \"prompt\" or \"input_ids\"");
    int has;
    int64_t x;
    TRY(rq_read_int(c, o, "output_tokens", 1, INT32_MAX, "[1, 2147483647]", &has, &x));
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
    for (size_t i = 0; i < n; i++, bad++) i += rq_utf8_valid_prefix((const unsigned char *)s + i, n - i);
    char *copy = malloc(n + 2 * bad + 1), *q = copy;
    if (!copy) return OOM;
    for (size_t i = 0; i < n;) {
        size_t ok = rq_utf8_valid_prefix((const unsigned char *)s + i, n - i);
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
        if (rc == OK && c->r->id && strstr(c->r->id, "\xEF\xBF\xBD")) rc = rq_set_unreadable_id(c);
        if (rc == BAD) rc = OK; /* the UTF-8 error is the one reported */
    }
    json_decref(o);
    if (rc == OK && !c->r->id) rc = rq_set_unreadable_id(c);
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
        rc = fmt == TP_INPUT_TEXT ? rq_set_standin_id(&c) : rq_set_unreadable_id(&c);
        if (rc == OK)
            rc = rq_fail(&c, E_REQUEST, "the line is %zu bytes, more than --max-line-bytes %zu", n, max_line);
    } else if ((valid = rq_utf8_valid_prefix((const unsigned char *)s, n)) < n) {
        rc = rq_fail(&c, E_UTF8, "invalid UTF-8 at byte %zu of the line (0x%02x)", valid + 1,
                     (unsigned char)s[valid]);
        if (rc != OOM) rc = fmt == TP_INPUT_TEXT ? rq_set_standin_id(&c) : recover_id(&c, fmt, s, n);
    } else if (fmt == TP_INPUT_TEXT) {
        rc = rq_set_standin_id(&c);
        if (rc == OK) {
            r->prompt = rq_dup_n(s, n);
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
            rc = rq_set_unreadable_id(&c);
            if (rc == OK && !strncmp(err.text, "invalid Unicode", 15))
                rc = rq_fail(&c, E_UTF8, "invalid JSON string escape at column %d: %s (a lone UTF-16 surrogate)",
                             err.column, err.text);
            else if (rc == OK)
                rc = rq_fail(&c, E_JSON, "invalid JSON at column %d: %s", err.column, err.text);
        } else if (!json_is_object(o)) {
            rc = rq_set_unreadable_id(&c);
            if (rc == OK) rc = rq_fail(&c, E_JSON, "a line must be a JSON object, not %s", type_name(o));
        } else {
            rc = fmt == TP_INPUT_OPENAI   ? parse_openai(&c, o)
                 : fmt == TP_INPUT_TRTLLM ? parse_trtllm(&c, o)
                                          : parse_jsonl(&c, o);
            if (rc == OK && c.lossy) /* the number is not in a field we read: still an error */
                rc = rq_fail(&c, E_REQUEST, "at column %d, %s: integers must fit in 64 bits", err.column, err.text);
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
        const id_ref *s = a->standin ? a : z;
        if (s->standin == STANDIN_LINE)
            snprintf(note, sizeof note, " (line %lld has no id, so its line number stands in)", (long long)s->line);
        else if (s->standin)
            snprintf(note, sizeof note, " (line %lld has no readable id, so \"line %lld\" stands in)",
                     (long long)s->line, (long long)s->line);
        st = tp_error(TP_ERR_INVALID_ARG, "%s: id %s is used on line %lld and again on line %lld%s; ids must be unique",
                      what, rq_quote(b, a->id, strlen(a->id)), (long long)a->line, (long long)z->line, note);
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
    l->id_standin[pos] = (unsigned char)standin;
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
