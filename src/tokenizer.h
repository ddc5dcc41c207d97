/*
 * tokenizer.h: Hugging Face tokenizer.json (BPE) in C: text -> ids exactly as HF tokenizers
 * encodes them, ids -> text (whole or streamed), and the strings of tokenizer_config.json
 * (bos/eos tokens, chat template). Inputs must be valid UTF-8 (HF only takes str).
 * A tokenizer is read-only after loading except for its BPE cache: one encoder per thread.
 */
#ifndef TP_TOKENIZER_H
#define TP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_tokenizer tp_tokenizer;

/* A growable id list; zero-initialize, then tp_ids_free. */
typedef struct tp_ids {
    int32_t *v;
    size_t n, cap;
} tp_ids;

tp_status tp_ids_push(tp_ids *ids, int32_t id);
void tp_ids_free(tp_ids *ids);

/* Load dir/tokenizer.json and, if present, dir/tokenizer_config.json. Anything outside
 * the supported components is TP_ERR_UNSUPPORTED naming it; malformed content is
 * TP_ERR_FORMAT. */
tp_status tp_tokenizer_load(const char *model_dir, tp_tokenizer **out);
/* The same from memory (config_json may be NULL); for tests and embedded use. */
tp_status tp_tokenizer_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                                 size_t config_len, tp_tokenizer **out);
void tp_tokenizer_destroy(tp_tokenizer *tok);

/* Encode text[0..len) (NUL bytes allowed) and append the ids to out. add_special_tokens
 * runs the post-processor (e.g. a leading BOS). Invalid UTF-8 is TP_ERR_INVALID_ARG. */
tp_status tp_tokenizer_encode(tp_tokenizer *tok, const char *text, size_t len,
                              int add_special_tokens, tp_ids *out);

/* Decode ids into a malloc'ed NUL-terminated string (*len excludes the NUL). Ids that are
 * not tokens are skipped, as HF does. */
tp_status tp_tokenizer_decode(const tp_tokenizer *tok, const int32_t *ids, size_t n,
                              int skip_special_tokens, char **text, size_t *len);

/* The bytes ids decode to, where tp_tokenizer_decode would put U+FFFD for bytes that are
 * not valid UTF-8 on their own (a character split over tokens): what guided decoding
 * matches token by token. Special tokens are decoded too. */
tp_status tp_tokenizer_decode_raw(const tp_tokenizer *tok, const int32_t *ids, size_t n, char **text, size_t *len);

/* Number of ids in use (largest token id + 1, added tokens included). */
size_t tp_tokenizer_vocab_size(const tp_tokenizer *tok);
/* The token string of id (NULL if none); *len gets its length. */
const char *tp_tokenizer_id_to_token(const tp_tokenizer *tok, int32_t id, size_t *len);
/* The id of an exact token string (added tokens first), or -1. */
int32_t tp_tokenizer_token_to_id(const tp_tokenizer *tok, const char *s, size_t len);
int tp_tokenizer_is_special(const tp_tokenizer *tok, int32_t id);

/* From tokenizer_config.json; NULL when absent. The ids are -1 when absent. */
const char *tp_tokenizer_bos_token(const tp_tokenizer *tok);
const char *tp_tokenizer_eos_token(const tp_tokenizer *tok);
const char *tp_tokenizer_chat_template(const tp_tokenizer *tok);
/* The file the chat template came from: "chat_template.jinja", "tokenizer_config.json" or
 * "chat_template.json"; NULL with no template. */
const char *tp_tokenizer_chat_template_file(const tp_tokenizer *tok);
int32_t tp_tokenizer_bos_id(const tp_tokenizer *tok);
int32_t tp_tokenizer_eos_id(const tp_tokenizer *tok);

/* ----------------------------------------------------------------------------
 * Streaming detokenization: push ids one at a time and get the text they complete.
 * Text is released only at complete UTF-8 characters (and never text a later id could
 * still change), so the concatenation of every push and the finish equals
 * tp_tokenizer_decode of all the ids. */

typedef struct tp_detok_stream tp_detok_stream;

tp_status tp_detok_stream_create(const tp_tokenizer *tok, int skip_special_tokens,
                                 tp_detok_stream **out);
/* *text (not NUL-terminated, may be empty) stays valid until the next call. */
tp_status tp_detok_stream_push(tp_detok_stream *ds, int32_t id, const char **text, size_t *len);
/* Release whatever is still held back (end of generation). */
tp_status tp_detok_stream_finish(tp_detok_stream *ds, const char **text, size_t *len);
void tp_detok_stream_destroy(tp_detok_stream *ds);

#ifdef __cplusplus
}
#endif
#endif
