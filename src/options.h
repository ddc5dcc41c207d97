/*
 * options.h: the command line. Every flag, its default and its check live in one
 * table in options.c, from which --help and the man page test are derived.
 */
#ifndef TP_OPTIONS_H
#define TP_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_mode {
    TP_MODE_GENERATE, /* the default: run the prompts of --input */
    TP_MODE_DRY_RUN,  /* --dry-run: plan and check shapes; read no weight data */
    TP_MODE_TOKENIZE, /* --tokenize: JSONL texts or messages to ids; no weights */
    TP_MODE_DETOKENIZE,
    TP_MODE_CHECK,    /* --check: devices, P2P links, all-reduce sweep; no model */
    TP_MODE_HELP,
    TP_MODE_VERSION
} tp_mode;

typedef struct tp_options {
    tp_mode mode;
    const char *model;       /* --model DIR */
    const char *input;       /* --input FILE */
    const char *output;      /* --output FILE (default: stdout) */
    int tp;                  /* --tensor-parallel-size */
    int pp;                  /* --pipeline-parallel-size */
    int64_t max_model_len;   /* 0: the model's max_position_embeddings */
    int64_t max_num_seqs;           /* 0: the engine's default (on GPUs of 70 GiB or more what the KV cache
                                     * holds at full length, 256 to 1024; else 256; at most the run's own) */
    int64_t max_num_batched_tokens; /* 0: 16384 on GPUs of 70 GiB or more, else 8192 (engine) */
    double gpu_memory_utilization;
    uint64_t seed;
    const char *dtype;       /* "auto" or a dtype name */
    const char *backend;     /* "auto", "cpu", "cuda" */
    int64_t max_tokens;      /* completion tokens per request unless the request says */
    int max_tokens_given;    /* --max-tokens was on the command line (else OpenAI chat lines get the context's room) */
    double temperature;      /* < 0: the model's generation_config (greedy without one) */
    int64_t top_k;           /* < 0: unset */
    double top_p;            /* < 0: unset */
    int ignore_eos;
    int64_t kv_block_size;
    int64_t kv_cache_memory; /* bytes of KV cache per rank (CPU backend) */
    const char *dump_logits; /* directory, or NULL */
    const char *input_format; /* "auto", "text", "jsonl", "openai", "trtllm" */
    int64_t max_line_bytes;
    const char *errors;      /* --errors FILE, or NULL: error records go inline */
    int ordered, resume, force, overwrite;
    int enforce_eager; /* no CUDA graphs */
    int prefix_caching; /* --enable-prefix-caching (the default) / --no-enable-prefix-caching */
    const char *status_file;
    double progress_interval;
    double step_timeout;       /* --step-timeout: seconds; < 0: the backend's default */
    const char *chat_template; /* --chat-template FILE */
    int tool_call_parser;      /* --tool-call-parser: a tp_tool_parser, 0 (none) by default */
    int64_t check_max_bytes;   /* --check-max-bytes: largest all-reduce of --check */
} tp_options;

/* "1GiB", "512MiB", "2G", "1000000" -> bytes; 0 on junk or overflow. */
int tp_parse_bytes(const char *s, int64_t *out);

void tp_options_defaults(tp_options *o);

/* Parse argv; on TP_ERR_INVALID_ARG the recorded message is one line naming the flag
 * and what it allows. Does not print. getopt state is reset, so it can run twice. */
tp_status tp_options_parse(int argc, char *const argv[], tp_options *o);

void tp_options_print_help(FILE *out);

#ifdef __cplusplus
}
#endif
#endif
