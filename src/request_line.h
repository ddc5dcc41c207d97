/*
 * request_line.h: what requests.c (the file and its dialects) and request_fields.c (one
 * line's fields) share, inside the input reader only: the state of the line being read,
 * its step results, and the readers of the fields every dialect has.
 */
#ifndef TP_REQUEST_LINE_H
#define TP_REQUEST_LINE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "requests.h"

/* a request's error_code (requests.h lists them) */
#define E_JSON "invalid_json"
#define E_REQUEST "invalid_request"
#define E_UTF8 "invalid_utf8"

enum { OK = 0, BAD = 1, OOM = -1 }; /* line step results: BAD = an error was recorded */

#define TRY(expr)                    \
    do {                             \
        int try_rc_ = (expr);        \
        if (try_rc_) return try_rc_; \
    } while (0)

typedef struct line_ctx {
    tp_request *r;
    int64_t line;
    int64_t vocab;      /* token ids must be < vocab */
    int lossy;          /* parsed with JSON_DECODE_INT_AS_REAL after an integer overflow */
    int standin;        /* r->id is not one the line gave: STANDIN_LINE or STANDIN_UNREADABLE */
    const char *prefix; /* "" or "body." before field names */
    tp_request_list *list; /* where unknown fields are counted */
    int unknown_here;      /* this line already counted in list->unknown_lines */
} line_ctx;

/* ---- small helpers */
char *rq_dup_n(const char *s, size_t n); /* s[0..n) as a C string; NULL when out of memory */
/* The length of the valid UTF-8 prefix of s (== n when all of it is valid). Rejects
 * stray continuation bytes, truncated sequences, overlong forms (C0, C1, E0 80..9F,
 * F0 80..8F), UTF-16 surrogates (ED A0..BF) and code points above U+10FFFF. */
size_t rq_utf8_valid_prefix(const unsigned char *s, size_t n);
#define QUOTE_CAP 96
/* s[0..n) for a message: quoted, escaped like JSON, cut to about 48 bytes. */
const char *rq_quote(char buf[QUOTE_CAP], const char *s, size_t n);
const char *rq_repr(char buf[QUOTE_CAP], const json_t *v); /* a JSON value for a message */
json_t *rq_get(const json_t *o, const char *key); /* a field that is absent or null reads as NULL */

/* ---- one line: each returns OK, BAD (the line's error recorded) or OOM */
/* Record the line's first error; later ones are dropped (one message per line). */
__attribute__((format(printf, 3, 4))) int rq_fail(line_ctx *c, const char *code, const char *fmt, ...);
/* A line with no id (text, JSONL without one): its line number is its id. */
#define STANDIN_LINE 1
int rq_set_standin_id(line_ctx *c);
/* A line whose id cannot be read (not JSON, a bad id, a dialect's required id missing): an
 * error record with id "line N", which no line's own id is likely to be, where the bare
 * number would clash with ids counted from 0 (line N + 1's id N). */
#define STANDIN_UNREADABLE 2
int rq_set_unreadable_id(line_ctx *c);
/* An id from a JSON value: a non-empty string without NUL, or an integer (as decimal).
 * On anything else "line N" stands in (rq_set_unreadable_id) and an error is recorded. */
int rq_read_id(line_ctx *c, const char *key, const json_t *v, int allow_int);
/* An integer field in [lo, hi]; range is how a message shows that interval. */
int rq_read_int(line_ctx *c, const json_t *o, const char *key, int64_t lo, int64_t hi, const char *range, int *has,
                int64_t *out);
/* A non-empty array of token ids in [0, vocab) into a fresh array. */
int rq_read_token_ids(line_ctx *c, const json_t *v, const char *key, int allow_empty, int32_t **out, int32_t *n_out);
int rq_set_prompt(line_ctx *c, const json_t *v, const char *key); /* a prompt string: the line's text */
/* "messages": a non-empty array of {"role": string, "content": ...} (other keys kept),
 * stored re-serialized (compact, UTF-8) in messages_json. */
int rq_read_messages(line_ctx *c, const json_t *v);
int rq_read_tools(line_ctx *c, const json_t *o); /* "tools" (and "tool_choice") */
/* The per-request settings of o (a JSONL line, or an OpenAI body). */
int rq_read_params(line_ctx *c, const json_t *o);
int rq_read_add_generation_prompt(line_ctx *c, const json_t *o);
int rq_pfield_named(const char *k); /* k is a setting of rq_read_params' table */

#endif
