/*
 * requests.h: the prompts of --input: a text file (one prompt per line) or JSONL lines
 * {"id", "prompt" | "prompt_token_ids", and optional per-request "max_tokens",
 * "temperature", "top_k", "top_p", "seed", "ignore_eos"}. The file is read and checked
 * whole before the model loads; a bad line stops the job with its line number.
 */
#ifndef TP_REQUESTS_H
#define TP_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

#include "sampler.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_request {
    char *id;             /* "id" of the line, or its 1-based line number for text input */
    int64_t line;         /* 1-based line in the input file */
    char *prompt;         /* text, or NULL when prompt_ids were given */
    size_t prompt_len;
    int32_t *prompt_ids;  /* given ids, or NULL */
    int32_t n_prompt_ids;
    int32_t max_tokens;   /* -1: the default (--max-tokens) */
    int ignore_eos;       /* -1: the default */
    int has_temperature, has_top_k, has_top_p, has_seed;
    double temperature, top_p;
    int32_t top_k;
    uint64_t seed;
} tp_request;

typedef struct tp_request_list {
    tp_request *v;
    size_t n;
} tp_request_list;

/* Read and validate path. vocab_size bounds prompt_token_ids. */
tp_status tp_requests_read(const char *path, int64_t vocab_size, tp_request_list *out);
/* The same from memory (tests). */
tp_status tp_requests_parse(const char *text, size_t len, const char *what, int64_t vocab_size,
                            tp_request_list *out);
void tp_requests_free(tp_request_list *l);

#ifdef __cplusplus
}
#endif
#endif
