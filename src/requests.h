/*
 * requests.h: the prompts of --input, in any of four dialects (detected per file, or
 * --input-format): plain text, one prompt per line; JSONL of {"id"|"custom_id", one of
 * "prompt" | "prompt_token_ids" | "input_ids" | "messages", and per-request overrides};
 * OpenAI batch lines {"custom_id", "method": "POST", "url": "/v1/completions" |
 * "/v1/chat/completions", "body": {...}} (OpenAI's fields plus vLLM's extensions); and
 * TensorRT-LLM benchmark lines {"task_id", "prompt" | "input_ids", "output_tokens"}.
 * The file is read as a stream, a line at a time, before the model loads; a rank keeps
 * whole only its share of the requests (tp_request_share), so no rank holds the file, and
 * a replica holds only the prompts it runs. A bad line never stops the batch: it becomes
 * a request that carries an error (code + message) and is not run. Only a fatal problem
 * (unreadable file, duplicate ids) stops the job, with line numbers.
 */
#ifndef TP_REQUESTS_H
#define TP_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_input_format {
    TP_INPUT_AUTO,   /* the first non-blank line decides (see tp_requests_read) */
    TP_INPUT_TEXT,
    TP_INPUT_JSONL,
    TP_INPUT_OPENAI,
    TP_INPUT_TRTLLM,
} tp_input_format;

/* Parses "auto", "text", "jsonl", "openai", "trtllm"; 0 on anything else. */
int tp_input_format_from_name(const char *name, tp_input_format *out);

typedef enum tp_endpoint {
    TP_ENDPOINT_NONE,        /* not an OpenAI batch line: the compact output */
    TP_ENDPOINT_COMPLETIONS, /* /v1/completions */
    TP_ENDPOINT_CHAT,        /* /v1/chat/completions */
} tp_endpoint;

/* Per-request settings; has_* says whether the line gave it (else the run's default). */
typedef struct tp_request_params {
    int has_max_tokens;        int32_t max_tokens;        /* >= 1 (OpenAI max_tokens / max_completion_tokens, TRT-LLM output_tokens) */
    int has_min_tokens;        int32_t min_tokens;        /* >= 0 */
    int has_temperature;       double temperature;        /* [0, 100] */
    int has_top_k;             int32_t top_k;             /* -1 or >= 0 (0 and -1: off) */
    int has_top_p;             double top_p;              /* (0, 1] */
    int has_min_p;             double min_p;              /* [0, 1] */
    int has_repetition_penalty; double repetition_penalty; /* (0, 100] */
    int has_presence_penalty;  double presence_penalty;   /* [-2, 2] */
    int has_frequency_penalty; double frequency_penalty;  /* [-2, 2] */
    int has_seed;              uint64_t seed;             /* [0, 2^63) */
    int has_n;                 int32_t n;                 /* completions per prompt, [1, 128] */
    int has_logprobs;          int32_t logprobs;          /* top-N per generated token, [0, 20] (chat: "logprobs": true + "top_logprobs") */
    int has_prompt_logprobs;   int32_t prompt_logprobs;   /* [0, 20] */
    int has_ignore_eos;        int ignore_eos;
    int has_skip_special_tokens; int skip_special_tokens;
    int has_include_stop_str_in_output; int include_stop_str_in_output;
    int has_echo;              int echo;                  /* completions: the output text starts with the prompt */
    int echo_only;             /* echo with max_tokens 0: the prompt alone (one token is drawn and dropped, as vLLM) */
    char **stop;               int32_t n_stop;            /* stop strings (a string or an array of at most 16 non-empty strings) */
    int32_t *stop_token_ids;   int32_t n_stop_token_ids;  /* each in [0, vocab) */
    int32_t *allowed_token_ids; int32_t n_allowed_token_ids; /* vLLM's: the only ids drawn; 0: all */
    int32_t *bias_ids;         float *bias; int32_t n_bias;  /* logit_bias: distinct ids in [0, vocab), in
                                                              * increasing order, each bias in [-100, 100] */
    char **bad_words;          int32_t n_bad_words;       /* vLLM's: never generated (non-empty, without NUL) */
    char **choices;            int32_t n_choices;         /* guided_choice: the text is one of these
                                                           * (non-empty, without NUL, at most 4096) */
    int json_object;                                      /* response_format json_object: the text is a JSON
                                                           * object (never with choices) */
    int json_compact;                                     /* with json_object: no whitespace between tokens
                                                           * (structured_outputs.disable_any_whitespace) */
    const struct tp_schema *schema;                       /* with json_object, a JSON schema (response_format
                                                           * json_schema, guided_json): the text is a value it
                                                           * holds to; the list's, compiled once per schema */
} tp_request_params;

typedef struct tp_request {
    char *id;               /* "custom_id" / "id" / "task_id" (integers as decimal), or the line number for text */
    int64_t line;           /* 1-based line in the input */
    int64_t pos;            /* 0-based among the file's requests (its non-blank lines) */
    int standin;            /* the id is not the line's own: 1 its line number (it gave none), 2 "line N" (unreadable) */
    tp_endpoint endpoint;
    char *prompt;           /* text (may hold NUL bytes), or NULL */
    size_t prompt_len;
    int32_t *prompt_ids;    /* token ids, or NULL */
    int32_t n_prompt_ids;
    int encoded;            /* prompt_ids are the text's or messages' (then freed), by the engine's tokenizer */
    char *messages_json;    /* the "messages" array as JSON text (chat), or NULL */
    char *tools_json;       /* chat with tools: the "tools" array as JSON text, or NULL */
    int parse_tool_calls;   /* "tool_choice": "auto" (the default with tools): calls parsed out of the text */
    int single_tool_call;   /* "parallel_tool_calls": false: the first call only */
    char *forced_tool;      /* "tool_choice" naming a function: the text is its arguments (p.schema, its
                             * parameters), written as one call to it; or NULL */
    int required_tools;     /* "tool_choice": "required": the text is a list of calls (p.schema, vLLM's) */
    int add_generation_prompt; /* chat: default 1 */
    tp_request_params p;
    const char *error_code; /* NULL, or "invalid_json", "invalid_request", "invalid_utf8": the line is not run */
    char *error_message;    /* what was wrong and where: "line 7: \"top_p\" 1.5 is outside (0, 1]" */
} tp_request;

/* An OpenAI chat line that gives no max_tokens: OpenAI and vLLM let it run to the context's
 * end (unless --max-tokens says otherwise) */
static inline int tp_request_chat_without_max_tokens(const tp_request *r)
{
    return r->endpoint == TP_ENDPOINT_CHAT && !r->p.has_max_tokens;
}

/* A field of the input that tpinfer does not read (a misspelt "max_token" would otherwise
 * pass unseen): the lines that hold it and the first of them. */
#define TP_UNKNOWN_FIELDS_KEPT 8
typedef struct tp_unknown_field {
    char name[40];     /* "body." before an OpenAI body's field; cut with "..." */
    int64_t lines, first_line;
} tp_unknown_field;

typedef struct tp_request_list {
    tp_request *v;          /* the requests kept (all, or the share's), in file order */
    size_t n;
    size_t n_total;         /* requests in the file, kept or not */
    size_t n_errors;        /* requests kept that carry an error */
    int any_endpoint;       /* some request read is an OpenAI batch line (error records answer in its shape) */
    int any_chat_room;      /* some OpenAI chat line gives no max_tokens (it may run to the context's end) */
    /* with tp_request_share.all_ids, or put: every request's id, by pos (tp_requests_id) */
    char *id_text;
    size_t id_len, id_cap;
    size_t *id_at;          /* [id_n] offsets into id_text, SIZE_MAX: none yet */
    int64_t *id_line;       /* [id_n] their lines, until tp_requests_check_ids */
    unsigned char *id_standin; /* [id_n] the request's standin */
    size_t id_n;
    int64_t unknown_lines;  /* lines holding fields tpinfer does not read (ignored) */
    int n_unknown;          /* distinct such fields kept, the first TP_UNKNOWN_FIELDS_KEPT */
    int unknown_more;       /* more distinct fields than kept */
    tp_unknown_field unknown[TP_UNKNOWN_FIELDS_KEPT];
    struct tp_schema **schemas; /* the JSON schemas the requests hold to, each compiled once */
    size_t n_schemas;
    void *schema_index;         /* a jansson object: a schema's compact text -> its index */
} tp_request_list;

/* Which requests a rank keeps whole: the one at pos where pos % parts == part (a
 * replica's share); the others are counted but not kept. all_ids: every line is parsed,
 * every id is kept (tp_requests_id) and checked for duplicates, and unknown fields and
 * the dialect are seen in every line (the rank that writes the output); otherwise the
 * lines of other shares are only counted, and duplicate ids are not looked for. on_kept,
 * where set, is called with each kept request as soon as it is read (its payload is the
 * callee's to transform, e.g. to tokenize the text and free it); a status other than
 * TP_OK stops the read. */
typedef struct tp_request_share {
    int parts, part;
    int all_ids;
    tp_status (*on_kept)(void *arg, tp_request *r);
    void *arg;
    int (*keep)(void *arg, size_t pos); /* where set, decides instead of parts and part (asked of
                                          * every request, in order) */
} tp_request_share;

/* Read and check path, keeping every request (a share of one part, with all ids).
 * vocab_size bounds token ids. Fatal (the job stops): the file cannot be read, is a
 * directory, holds no requests, or two requests share an id (the message names both
 * lines). Per-line problems become requests with error_code set. A
 * line longer than max_line_bytes is an error record too, not a crash.
 * vocab_size <= 0: not known yet (ids are then only checked to fit in int32);
 * max_line_bytes 0: no limit. A line whose id cannot be read (not JSON, bad UTF-8 that
 * hides it, too long) gets its decimal line number as id, which takes part in the
 * duplicate check like any other id. Fields that change the output but that tpinfer
 * does not support (logit_bias, response_format other than text, tools, guided decoding,
 * echo, suffix, best_of, beam search) make the line an error record; other unknown fields
 * are ignored and counted in unknown_lines / unknown (tp_requests_unknown_summary). */
tp_status tp_requests_read(const char *path, tp_input_format fmt, int64_t vocab_size,
                           size_t max_line_bytes, tp_request_list *out);
/* The same, keeping share's part (NULL: all). */
tp_status tp_requests_read_share(const char *path, tp_input_format fmt, int64_t vocab_size, size_t max_line_bytes,
                                 const tp_request_share *share, tp_request_list *out);
/* The same from memory (tests). */
tp_status tp_requests_parse(const char *text, size_t len, const char *what, tp_input_format fmt,
                            int64_t vocab_size, size_t max_line_bytes, tp_request_list *out);
tp_status tp_requests_parse_share(const char *text, size_t len, const char *what, tp_input_format fmt,
                                  int64_t vocab_size, size_t max_line_bytes, const tp_request_share *share,
                                  tp_request_list *out);
/* The id of the request at pos (0 <= pos < n_total), read with all_ids or put; NULL if none. */
const char *tp_requests_id(const tp_request_list *l, size_t pos);
/* The table of every id by pos, on the rank that checks them, filled by hand where the
 * requests were read in shares (rank 0 of a data-parallel run gathers the replicas'): put
 * each request's id, then check them all (duplicates refused, naming both lines; an id
 * missing is an internal error). */
tp_status tp_requests_put_id(tp_request_list *l, size_t pos, const char *id, int64_t line, int standin);
tp_status tp_requests_check_ids(tp_request_list *l, const char *what);
void tp_requests_free(tp_request_list *l);

/* "\"max_token\" (3 lines, first line 7), ..." into buf: the unknown fields l counted. */
void tp_requests_unknown_summary(const tp_request_list *l, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
