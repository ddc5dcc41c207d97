/*
 * completion.h: what one request's completions become: each choice's tokens, its text
 * (streamed through the detokenizer so stop strings are found as soon as they appear,
 * never splitting a character), its logprobs and finish reason; then the output line
 * in the request's dialect (compact, OpenAI /v1/completions or /v1/chat/completions).
 */
#ifndef TP_COMPLETION_H
#define TP_COMPLETION_H

#include <stddef.h>
#include <stdint.h>

#include "requests.h"
#include "sampler.h"
#include "status.h"
#include "tokenizer.h"
#include "tool_calls.h"

typedef enum tp_finish { TP_FINISH_NONE, TP_FINISH_STOP, TP_FINISH_LENGTH } tp_finish;

typedef struct tp_choice {
    tp_ids out;            /* generated ids, a final EOS / stop token included */
    char *text;            /* the text so far (special tokens as the request says) */
    size_t len, cap;
    tp_detok_stream *ds;
    tp_finish finish;
    int32_t stop_str;      /* 1 + the index of the stop string that ended it, or 0 */
    int32_t stop_token;    /* the stop_token_ids entry that ended it, or -1 (vLLM's stop_reason) */
    int32_t n_logprobs;    /* top-N per token (0: only the chosen token's when want_logprobs) */
    int want_logprobs;
    float *lp;             /* [n] chosen token's logprob */
    tp_token_logprob *top; /* [n * n_logprobs] */
    size_t lp_cap;
    double t_sched, t_first, t_last; /* for TTFT / inter-token latency */
} tp_choice;

tp_status tp_choice_init(tp_choice *c, const tp_tokenizer *tok, int skip_special, int want_logprobs,
                         int32_t n_logprobs);
void tp_choice_free(tp_choice *c);

/* Append a sampled token. in_text = 0 for a token that ends the choice without being part
 * of its text (EOS, stop_token_ids). When check_stops, the stop strings are looked for in
 * the text the token completed; a match truncates the text (keeping the stop string only
 * with include_stop) and sets *stopped. */
tp_status tp_choice_push(tp_choice *c, int32_t token, int in_text, char *const *stop, int32_t n_stop,
                         int include_stop, int check_stops, int *stopped);
/* Keep a token's logprobs (call before or after push, once per token). */
tp_status tp_choice_keep_logprobs(tp_choice *c, const tp_sample_result *r);
/* The end: release the text the detokenizer held back (unless a stop string ended it). */
tp_status tp_choice_finish(tp_choice *c, tp_finish why, char *const *stop, int32_t n_stop, int include_stop);

/* One prompt position's logprobs (vLLM prompt_logprobs): the prompt's own token there and
 * the top-N of the distribution that predicted it. Position 0 has none. */
typedef struct tp_prompt_logprob {
    int32_t id;
    float logprob;
    int32_t rank; /* 1 = the likeliest */
    tp_token_logprob *top;
} tp_prompt_logprob;

/* From one row of logits: the logprob and rank of token id, and the top-N. */
void tp_logprob_of(const float *logits, int32_t vocab, int32_t id, int32_t n_top, float *logprob,
                   int32_t *rank, tp_token_logprob *top);

typedef struct tp_completion {
    const tp_request *req;
    int64_t index;                 /* among the requests of this run */
    int32_t n_prompt;
    const int32_t *prompt;
    tp_choice *choices;
    int32_t n_choices;
    tp_prompt_logprob *prompt_lp;  /* [n_prompt] or NULL */
    int32_t n_prompt_lp_top;
    const char *model;             /* the model directory's name, for OpenAI bodies */
    int64_t created;               /* unix seconds */
    tp_tool_parser tool_parser;    /* a chat with tools and "tool_choice" "auto": its calls parsed out */
    int32_t n_cached;              /* prompt tokens read from the prefix cache (usage.prompt_tokens_details) */
} tp_completion;

/* The output line (no newline) of a finished request. */
tp_status tp_completion_format(const tp_completion *c, const tp_tokenizer *tok, char **line, size_t *len);

/* The output line of a request that did not run: compact {"id", "line", "code",
 * "message"}, or (openai: the file is OpenAI batch lines, even if this line could not be
 * read as one) an OpenAI batch line with status_code 400 and an error body. */
tp_status tp_error_line_format(const tp_request *r, int64_t index, const char *code, const char *message,
                               int openai, char **line, size_t *len);

#endif
