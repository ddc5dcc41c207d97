/*
 * guided.h: guided_choice, vLLM's decoding constrained to one of a list of strings, and
 * response_format's JSON object. At each step only the tokens that keep the completion's
 * bytes a prefix of some choice (of a JSON object) may be drawn, and the end-of-sequence
 * tokens once the bytes equal one (the object is whole); so the text is one of the choices
 * (an object), spelt by whatever tokens the model prefers. A token is matched by the bytes
 * it adds to the completion (tp_tokenizer_decode_raw: the first token's alone, a later
 * one's after another token), so a character split over byte tokens matches too.
 */
#ifndef TP_GUIDED_H
#define TP_GUIDED_H

#include <stdint.h>

#include "status.h"
#include "tokenizer.h"

struct tp_schema;

typedef struct tp_guide tp_guide;

/* One sequence's JSON reading kept between calls (tp_guide_json_ids), so that each call reads
 * only the tokens added since the one before, not the whole text again (a text of n tokens
 * would cost n^2 over its steps). Made at first use; NULL: no cursor, the text read whole. */
typedef struct tp_guide_cursor tp_guide_cursor;
void tp_guide_cursor_free(tp_guide_cursor *c); /* accepts NULL */

/* The byte pieces of every token of the model's vocabulary (special tokens and ids the
 * tokenizer lacks never match a choice); eos: the ids that end a completion. */
tp_status tp_guide_create(const tp_tokenizer *tok, int32_t vocab, const int32_t *eos, int32_t n_eos,
                          tp_guide **out);
void tp_guide_destroy(tp_guide *g); /* accepts NULL */

/* The most ids tp_guide_allowed returns. */
int32_t tp_guide_max_allowed(const tp_guide *g);

/* The ids that may follow out[0 .. n_out) (the completion so far) under choices[0 ..
 * n_choices) (NUL-terminated), each once, into dst (room for tp_guide_max_allowed); *n is
 * their count, 0 when none may (the completion left every choice, or is one and the model
 * has no end tokens). */
tp_status tp_guide_allowed(tp_guide *g, char *const *choices, int32_t n_choices, const int32_t *out, int32_t n_out,
                           int32_t *dst, int32_t *n);

/* response_format {"type": "json_object"}: the ids that keep out[0 .. n_out) (the completion
 * so far) the start of a JSON object (json_prefix.h), or with a schema (json_schema.h, kept
 * by the caller) of a value it holds to (compact: without whitespace between tokens), each
 * once, into dst (room for
 * tp_guide_max_allowed); the end tokens once the text is whole. *n is 0 when none may (a
 * token left the rule, or the text is whole and the model has no end tokens). cursor: NULL,
 * or the sequence's (*cursor made at first use; its later calls pass out with the same
 * first tokens, more of them or as many; another schema, compact or a shorter text starts
 * it again). */
tp_status tp_guide_allowed_json(tp_guide *g, const struct tp_schema *schema, int compact, tp_guide_cursor **cursor,
                                const int32_t *out, int32_t n_out, int32_t *dst, int32_t *n);

/* The JSON sets kept hold at most max_ids ids together (default 8 Mi, 32 MiB) beside the
 * one asked for last; the least recently read go first. For hosts short of memory, and
 * tests. tp_guide_json_kept: the ids kept now. */
void tp_guide_limit_json_sets(tp_guide *g, size_t max_ids);
size_t tp_guide_json_kept(const tp_guide *g);

/* The same set as it is kept, without a copy: *ids[0 .. *n) are the ids that may come, or
 * (*negated, where they are most of the vocabulary) those that may not. Valid until the
 * next call. */
tp_status tp_guide_json_ids(tp_guide *g, const struct tp_schema *schema, int compact, tp_guide_cursor **cursor,
                            const int32_t *out, int32_t n_out, const int32_t **ids, int32_t *n, int *negated);

#endif
