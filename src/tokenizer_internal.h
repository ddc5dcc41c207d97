/*
 * tokenizer_internal.h: the data structures shared by the tokenizer's files (load and
 * encode in tokenizer.c, BPE in tokenizer_bpe.c, normalizers, pre-tokenizers, decoders).
 * Every stage mirrors one component of Hugging Face tokenizers; offsets are not tracked.
 */
#ifndef TP_TOKENIZER_INTERNAL_H
#define TP_TOKENIZER_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "status.h"
#include "tokenizer.h"

/* ----------------------------------------------------------------------------
 * Text pieces flowing through the pipeline, and the buffers that own their bytes */

typedef struct tk_piece {
    const char *s;
    size_t len;
    int32_t id;       /* >= 0: already an added token; -1: still text */
    uint8_t at_start; /* starts at offset 0 of the original input (Metaspace "first") */
} tk_piece;

typedef struct tk_pieces {
    tk_piece *v;
    size_t n, cap;
} tk_pieces;

typedef struct tk_pool {
    char **bufs;
    size_t n, cap;
} tk_pool;

tp_status tk_pieces_push(tk_pieces *p, const char *s, size_t len, int32_t id, int at_start);
void tk_pieces_free(tk_pieces *p);
/* Take ownership of a malloc'ed buffer (freed by tk_pool_free even on failure). */
tp_status tk_pool_add(tk_pool *pool, char *buf);
void tk_pool_free(tk_pool *pool);

/* A growable byte string. */
typedef struct tk_buf {
    char *s;
    size_t len, cap;
} tk_buf;
tp_status tk_buf_put(tk_buf *b, const char *s, size_t n);
void tk_buf_free(tk_buf *b);

/* ----------------------------------------------------------------------------
 * Patterns: HF's {"String": "..."} (literal) or {"Regex": "..."} (Oniguruma, run here by
 * PCRE2 in UTF + Unicode-property mode). */

typedef struct tk_pattern {
    char *literal; /* the String form, or NULL */
    size_t literal_len;
    pcre2_code *re; /* the Regex form, or NULL */
    pcre2_match_data *md;
} tk_pattern;

/* Parse {"String": s} / {"Regex": r}; what names the component for error messages. */
tp_status tk_pattern_parse(tk_pattern *p, json_t *j, const char *what);
tp_status tk_pattern_compile(tk_pattern *p, const char *regex, const char *what);
void tk_pattern_free(tk_pattern *p);
/* Next match in s[0..n) at or after pos: 1 with [*ms, *me), 0 if none, -1 on match error. */
int tk_pattern_find(const tk_pattern *p, const char *s, size_t n, size_t pos, size_t *ms,
                    size_t *me);

/* ----------------------------------------------------------------------------
 * Components */

enum tk_norm_type {
    TK_NORM_SEQUENCE,
    TK_NORM_UNICODE, /* NFC/NFD/NFKC/NFKD, form in str */
    TK_NORM_LOWERCASE,
    TK_NORM_STRIP,
    TK_NORM_PREPEND,
    TK_NORM_REPLACE,
};

typedef struct tk_normalizer {
    enum tk_norm_type type;
    struct tk_normalizer *kids;
    size_t n_kids;
    char *str; /* Prepend text, Replace content, or the Unicode form name */
    size_t str_len;
    tk_pattern pat;
    int left, right;
} tk_normalizer;

enum tk_split_behavior {
    TK_SPLIT_REMOVED,
    TK_SPLIT_ISOLATED,
    TK_SPLIT_MERGED_PREV,
    TK_SPLIT_MERGED_NEXT,
    TK_SPLIT_CONTIGUOUS,
};

enum tk_prepend_scheme { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER };

enum tk_pre_type {
    TK_PRE_SEQUENCE,
    TK_PRE_SPLIT,
    TK_PRE_BYTELEVEL,
    TK_PRE_METASPACE,
    TK_PRE_DIGITS,
    TK_PRE_WHITESPACE,
    TK_PRE_WHITESPACE_SPLIT,
};

typedef struct tk_pretok {
    enum tk_pre_type type;
    struct tk_pretok *kids;
    size_t n_kids;
    tk_pattern pat; /* Split's pattern; ByteLevel/Whitespace regex */
    enum tk_split_behavior behavior;
    int invert;
    int add_prefix_space, use_regex;
    char repl[8]; /* Metaspace replacement character, UTF-8 */
    size_t repl_len;
    enum tk_prepend_scheme prepend;
    int split;
    int individual_digits;
} tk_pretok;

enum tk_post_type { TK_POST_SEQUENCE, TK_POST_TEMPLATE, TK_POST_BYTELEVEL };

typedef struct tk_post {
    enum tk_post_type type;
    struct tk_post *kids;
    size_t n_kids;
    int32_t *before, *after; /* special ids around the sequence */
    size_t n_before, n_after;
} tk_post;

enum tk_dec_type {
    TK_DEC_SEQUENCE,
    TK_DEC_BYTELEVEL,
    TK_DEC_REPLACE,
    TK_DEC_BYTEFALLBACK,
    TK_DEC_FUSE,
    TK_DEC_STRIP,
    TK_DEC_METASPACE,
};

typedef struct tk_decoder {
    enum tk_dec_type type;
    struct tk_decoder *kids;
    size_t n_kids;
    tk_pattern pat;
    char *content; /* Replace content */
    size_t content_len;
    uint32_t ch; /* Strip content / Metaspace replacement */
    size_t start, stop;
    enum tk_prepend_scheme prepend;
} tk_decoder;

/* ----------------------------------------------------------------------------
 * Vocabulary (string -> id hash, id -> string), BPE merges, added tokens */

typedef struct tk_vocab {
    char **tok; /* by id; NULL for ids not in use */
    uint32_t *tok_len;
    size_t n_ids; /* largest id + 1 */
    size_t count;
    int32_t *slots; /* open addressing: id or -1 */
    size_t mask;
} tk_vocab;

int32_t tk_vocab_get(const tk_vocab *v, const char *s, size_t n);

typedef struct tk_merge_entry {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty */
    uint32_t rank;
    int32_t new_id;
} tk_merge_entry;

typedef struct tk_cache_entry {
    char *key;
    uint32_t key_len;
    uint32_t n_ids;
    int32_t *ids;
} tk_cache_entry;

typedef struct tk_bpe {
    tk_vocab vocab;
    tk_merge_entry *merges;
    size_t merge_mask;
    int32_t unk_id; /* -1: no unk_token */
    char *unk_token;
    int byte_fallback, fuse_unk, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    size_t prefix_len, suffix_len;
    int32_t byte_ids[256]; /* "<0xHH>" ids, -1 if absent */
    tk_cache_entry *cache;
    size_t cache_mask, cache_used;
} tk_bpe;

typedef struct tk_added {
    char *content;
    size_t len;
    char *norm; /* content through the normalizer (normalized tokens, when there is one) */
    size_t norm_len;
    int32_t id;
    uint8_t special, lstrip, rstrip, normalized, single_word;
    uint8_t skip; /* skipped by decode(skip_special_tokens) */
} tk_added;

struct tp_tokenizer {
    tk_bpe bpe;
    tk_added *added;
    size_t n_added;
    int32_t *added_by_id; /* id -> index into added, -1 */
    size_t n_ids;         /* ids in use: max over vocab and added, + 1 */
    tk_normalizer *normalizer;
    tk_pretok *pretok;
    tk_post *post;
    tk_decoder *decoder;
    /* tokenizer_config.json */
    char *bos_token, *eos_token, *chat_template;
    const char *chat_template_file; /* where chat_template came from (a static name) */
};

/* tokenizer_bpe.c */
tp_status tk_bpe_load(tk_bpe *bpe, json_t *model);
void tk_bpe_free(tk_bpe *bpe);
tp_status tk_bpe_tokenize(tk_bpe *bpe, const char *s, size_t n, tp_ids *out);
tp_status tk_vocab_build_index(tk_vocab *v);

/* tokenizer_normalize.c */
tp_status tk_normalizer_parse(tk_normalizer *n, json_t *j);
void tk_normalizer_free(tk_normalizer *n);
/* Normalize s[0..n); the result is s itself or a buffer handed to pool. */
tp_status tk_normalize(const tk_normalizer *nz, const char *s, size_t n, tk_pool *pool,
                       const char **out, size_t *out_len);

/* tokenizer_pretok.c */
tp_status tk_pretok_parse(tk_pretok *p, json_t *j);
void tk_pretok_free(tk_pretok *p);
/* Split the text pieces of *pieces further (added-token pieces pass through). */
tp_status tk_pretokenize(const tk_pretok *p, tk_pieces *pieces, tk_pool *pool);
/* s with every match of pat replaced (HF NormalizedString::replace); out is overwritten. */
tp_status tk_pattern_replace(const tk_pattern *pat, const char *s, size_t n, const char *with, size_t with_len,
                             tk_buf *out);
tp_status tk_parse_prepend_scheme(json_t *obj, enum tk_prepend_scheme *out, const char *what);
tp_status tk_parse_replacement(json_t *obj, uint32_t *cp, const char *what);
tp_status tk_split_pieces(const tk_pattern *pat, int invert, enum tk_split_behavior behavior,
                          tk_pieces *pieces);
extern const char *const tk_byte_char[256]; /* GPT-2 bytes_to_unicode, as UTF-8 */

/* tokenizer_decode.c */
tp_status tk_decoder_parse(tk_decoder *d, json_t *j);
void tk_decoder_free(tk_decoder *d);

/* Component names and small JSON helpers for messages (tokenizer.c). */
const char *tk_json_type(json_t *j);
tp_status tk_get_bool(json_t *obj, const char *key, int dflt, int *out, const char *what);
tp_status tk_get_string(json_t *obj, const char *key, const char **out, size_t *len,
                        const char *what);
tp_status tk_check_keys(json_t *obj, const char *const *known, const char *what);

#endif
