/*
 * json_prefix.h: whether bytes are the start of a JSON text (RFC 8259), one byte at a time:
 * the recognizer behind response_format {"type": "json_object"}. The state is a small value
 * (copied freely, compared with memcmp), so guided decoding can try every token's bytes from
 * the same point. Beyond RFC 8259 it bounds what a model could otherwise repeat forever:
 * containers nest at most TP_JSON_MAX_DEPTH deep, and whitespace between tokens is as
 * llama.cpp's JSON grammar has it: none, one space, or a newline and at most
 * TP_JSON_MAX_INDENT spaces or tabs (a small model asked for JSON otherwise spends its tokens
 * on blank lines). Strings must be valid UTF-8, and a \u escape of a high surrogate must be
 * followed by one of a low surrogate (what strict parsers, jansson's among them, require).
 * Under a schema a text may have several readings at once: where a value of an anyOf begins
 * and more than one branch may begin so, each branch is a reading (tp_json_paths) until the
 * bytes leave all but one.
 */
#ifndef TP_JSON_PREFIX_H
#define TP_JSON_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "regex_nfa.h"

#define TP_JSON_MAX_DEPTH 64
#define TP_JSON_MAX_INDENT 20
#define TP_SCHEMA_MAX_DEPTH 16 /* containers nest at most this deep under a schema */
#define TP_JSON_MAX_PATHS 64   /* readings held at once; past it the later branches are dropped */

struct tp_schema;

/* No padding: every byte is a field, so equal states are equal bytes. */
typedef struct tp_json_prefix {
    const struct tp_schema *schema; /* NULL: any JSON; else the text is held to it (json_schema.h) */
    uint16_t frame_node[TP_SCHEMA_MAX_DEPTH]; /* under a schema: each open container's node */
    uint16_t frame_pos[TP_SCHEMA_MAX_DEPTH];  /* and its properties or items written so far */
    uint16_t node;     /* under a schema: the scalar being written's node (an enum's, an integer's) */
    uint16_t lit;      /* an enum value the bytes so far begin; */
    uint16_t lit_off;  /* the bytes of it (or of the key being written) matched */
    uint16_t count;    /* a length-bounded string's characters so far (kept at minLength without maxLength) */
    uint64_t objects;  /* bit d: container d is an object (1) or an array (0) */
    uint64_t num;      /* a bounded number's integer part so far (its magnitude) */
    uint16_t code;     /* a \u escape's value so far; the high surrogate while a low one is due */
    uint8_t depth;     /* containers open */
    uint8_t mode;      /* what may come next (json_prefix.c's enum) */
    uint8_t sub;       /* the part within mode: a literal's position, a number's part, an escape's */
    uint8_t utf8_need; /* continuation bytes a string's character still needs */
    uint8_t utf8_lo, utf8_hi; /* the next continuation byte's range */
    uint8_t space;     /* the whitespace run: 0 none, 1 one space, 2 + k a newline and k indents */
    uint8_t flags;     /* the string is a key; a low surrogate's \u is due; an object at the top;
                        * a bounded number is negative, has a fraction digit not 0; no whitespace */
    uint16_t pad_;
    uint32_t cp;       /* under a pattern: the character being read (a UTF-8 sequence's, a high surrogate) */
    tp_regex_set re;   /* under a pattern: where its automaton may be */
} tp_json_prefix;
_Static_assert(sizeof(tp_json_prefix) == 128, "tp_json_prefix has no padding");

/* The state before any byte: the text must be an object (object_only) or any JSON value. */
void tp_json_prefix_init(tp_json_prefix *s, int object_only);

/* The state before any byte of a text held to schema (kept by the caller while s is used). */
void tp_json_prefix_init_schema(tp_json_prefix *s, const struct tp_schema *schema);

/* The states byte c leads s to, into out (room at most): more than one where a value of an
 * anyOf begins with c and several branches may; 0 when c may not follow. */
int tp_json_prefix_next(const tp_json_prefix *s, unsigned char c, tp_json_prefix *out, int room);

/* No whitespace between tokens from here on (vLLM's disable_any_whitespace). */
void tp_json_prefix_compact(tp_json_prefix *s);

/* Whether byte c may follow: 1 and s advanced (to the first reading, where there are
 * several), or 0 and s unchanged. Enough for texts without a schema, which have one reading. */
int tp_json_prefix_feed(tp_json_prefix *s, unsigned char c);

/* tp_json_prefix_feed for n bytes: the count taken before one could not follow (n when all did). */
size_t tp_json_prefix_feed_n(tp_json_prefix *s, const char *bytes, size_t n);

/* Whether the bytes so far are a whole JSON text (so the text may end here). */
int tp_json_prefix_complete(const tp_json_prefix *s);

/* Every reading of the text so far, sorted by their bytes and each once, so equal sets are
 * equal bytes over path[0, n). Dropping readings past TP_JSON_MAX_PATHS keeps what is
 * allowed a subset of the schema's: every text that ends still validates. */
typedef struct tp_json_paths {
    int32_t n; /* 0: the text left the rule */
    tp_json_prefix path[TP_JSON_MAX_PATHS];
} tp_json_paths;

void tp_json_paths_init(tp_json_paths *p, const tp_json_prefix *start);

/* The readings byte c leads in[0, n_in) to, sorted and each once, into out (room for
 * TP_JSON_MAX_PATHS; not in): their count, 0 when c may not follow. */
int tp_json_paths_next(const tp_json_prefix *in, int n_in, unsigned char c, tp_json_prefix *out);

/* tp_json_prefix_feed and _feed_n over every reading: 1 (the count fed) while one takes the
 * bytes; p is unchanged by a byte none takes. */
int tp_json_paths_feed(tp_json_paths *p, unsigned char c);
size_t tp_json_paths_feed_n(tp_json_paths *p, const char *bytes, size_t n);

/* Whether some reading is a whole JSON text. */
int tp_json_paths_complete(const tp_json_paths *p);

#endif
