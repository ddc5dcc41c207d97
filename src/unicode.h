/*
 * unicode.h: UTF-8 decoding with Rust's rules (the tokenizer must agree with HF tokenizers,
 * which is Rust), lossy conversion as String::from_utf8_lossy does it, and the few Unicode
 * properties and mappings the tokenizer needs, taken from libunistring (no hand tables).
 */
#ifndef TP_UNICODE_H
#define TP_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Decode one scalar value at s[0..n). Returns its length (1-4) and sets *cp, or returns
 * -k where k is the length of the invalid "maximal subpart" there (what Rust's lossy
 * decoder replaces by one U+FFFD). n must be > 0. */
int tp_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);

/* Length of the UTF-8 character starting with lead byte b, for text already validated. */
static inline int tp_utf8_len(uint8_t b)
{
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

/* Encode cp into out (room for 4 bytes); returns the length. */
int tp_utf8_put(uint32_t cp, char *out);

/* 1 if s[0..n) is valid UTF-8 (no surrogates, overlongs or values past U+10FFFF), else 0
 * with *bad_at set to the offset of the first invalid byte. */
int tp_utf8_valid(const char *s, size_t n, size_t *bad_at);

/* Rust's String::from_utf8_lossy: a malloc'ed, NUL-terminated copy of s[0..n) with each
 * invalid maximal subpart replaced by U+FFFD. */
tp_status tp_utf8_lossy(const char *s, size_t n, char **out, size_t *out_len);

/* Rust char predicates (char::is_whitespace, is_numeric, is_alphanumeric) and the
 * regex crate's \w (alphabetic, marks, decimal digits, connector punctuation, join controls). */
int tp_uc_is_whitespace(uint32_t cp);
/* Python's str.isspace: White_Space and the separators \x1c-\x1f (what Jinja's strip,
 * split and whitespace control take, as the templates run by jinja2) */
int tp_uc_is_py_space(uint32_t cp);
/* Python's str.isprintable for one character: not Other (Cc, Cf, Cs, Co, Cn) nor a
 * separator (Zs, Zl, Zp) other than the space */
int tp_uc_is_printable(uint32_t cp);
int tp_uc_is_numeric(uint32_t cp);
int tp_uc_is_alphanumeric(uint32_t cp);
int tp_uc_is_word(uint32_t cp);

/* Unicode normalization (form "NFC", "NFD", "NFKC" or "NFKD") of valid UTF-8 through
 * libunistring's u8_normalize; malloc'ed result. */
tp_status tp_utf8_normalize(const char *form, const char *s, size_t n, char **out, size_t *out_len);

/* Rust str::to_lowercase applied char by char (char::to_lowercase: full mappings, no
 * context), as HF's Lowercase normalizer does; malloc'ed result. */
tp_status tp_utf8_lowercase(const char *s, size_t n, char **out, size_t *out_len);

/* Case maps of valid UTF-8, character by character with libunistring's full mappings
 * (no context): how 'u' upper (Python's str.upper), 'l' lower (Rust's char by char),
 * 'L' Python's str.lower (a final sigma as such), 'c' Python's str.capitalize (the first
 * character title-cased, the rest as 'L'), 'T' Python's str.title (title case after an
 * uncased character, else as 'L'), 'J' Jinja's title filter (upper after -, whitespace,
 * (, {, [, < or at the start, else as 'L'); malloc'ed result. */
tp_status tp_utf8_case(const char *s, size_t n, char how, char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
