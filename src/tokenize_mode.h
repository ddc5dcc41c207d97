/*
 * tokenize_mode.h: tokenize / detokenize JSONL files with a model directory's tokenizer
 * (no weights needed), for scripts and tests; the CLI's --tokenize / --detokenize call it.
 */
#ifndef TP_TOKENIZE_MODE_H
#define TP_TOKENIZE_MODE_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tokenize: each line {"text": ..., "add_special_tokens": true} or {"messages": [...],
 * "add_generation_prompt": true} gives {"ids": [...]} (messages also "text": the rendering,
 * encoded without special tokens unless "add_special_tokens" says otherwise).
 * Detokenize: {"ids": [...], "skip_special_tokens": false} gives {"text": ...}.
 * A bad line gives {"error": {"line": N, "message": ...}} and the run goes on; the result is
 * then TP_ERR_INVALID_ARG. output_path NULL means stdout; chat_template_path NULL means the
 * model's own template. */
tp_status tp_tokenize_run(const char *model_dir, const char *input_path, const char *output_path, int detokenize,
                          const char *chat_template_path);

#ifdef __cplusplus
}
#endif
#endif
