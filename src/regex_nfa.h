/*
 * regex_nfa.h: a regular expression compiled to its position automaton (Glushkov's: one state
 * per character class written in it, no empty moves), run one code point at a time over a
 * set of states that fits in two words, so a JSON recognizer's state can hold it (a JSON
 * schema's "pattern"). The syntax is what ECMA-262 and Python's re share: literals, escapes
 * (\d \w \s and their negations over ASCII, \n \t \r \f \v \0 \xHH \uHHHH, an escaped
 * punctuation character), ".", classes [...] with ranges and [^...], groups (...) and
 * (?:...), |, the quantifiers * + ? {n} {n,} {n,m} (lazy forms too: the same language), and
 * ^ and $ at the ends only. Where the two dialects differ it takes what both match ("." is
 * no line break; \D \W \S are ASCII only). Anything else (backreferences, lookaround, flags,
 * Unicode property classes) is refused, naming it.
 */
#ifndef TP_REGEX_NFA_H
#define TP_REGEX_NFA_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define TP_REGEX_MAX_STATES 128 /* the start state and at most 127 classes */

typedef struct tp_regex tp_regex;

/* The states a text so far may be in (bit 0: nothing matched yet) */
typedef struct tp_regex_set {
    uint64_t w[2];
} tp_regex_set;

/* Compile pattern[0, len) (UTF-8). search: JSON Schema's meaning, a match anywhere unless
 * ^ and $ anchor it; else the whole text must match. */
tp_status tp_regex_compile(const char *pattern, size_t len, int search, tp_regex **out);
void tp_regex_free(tp_regex *r); /* accepts NULL */

tp_regex_set tp_regex_start(const tp_regex *r);

/* Whether code point c may come next: 1 and s advanced (to states from which a match can
 * still end within budget more code points: a string's maxLength; TP_REGEX_UNBOUNDED for
 * none), or 0 and s unchanged. */
#define TP_REGEX_UNBOUNDED INT32_MAX
int tp_regex_step(const tp_regex *r, tp_regex_set *s, uint32_t c, int32_t budget);

/* Whether some code point in [lo, hi] may come next (a UTF-8 sequence or escape begun, whose
 * character is not whole yet) with a match still able to end within budget more: no byte is
 * taken that no character could go on from. */
int tp_regex_may_step(const tp_regex *r, const tp_regex_set *s, uint32_t lo, uint32_t hi, int32_t budget);

/* The fewest code points a match takes (a schema's maxLength below it leaves no string). */
int32_t tp_regex_min_length(const tp_regex *r);

/* Whether the text so far matches. */
int tp_regex_accepts(const tp_regex *r, const tp_regex_set *s);

#endif
