/*
 * chat_template.h: renders a chat request (messages as a JSON array) with the model's
 * Jinja chat_template, as transformers' apply_chat_template does (trim_blocks, lstrip_blocks,
 * loop controls), through a small Jinja-subset interpreter over jansson values. Constructs
 * outside the subset are errors, never silently skipped.
 */
#ifndef TP_CHAT_TEMPLATE_H
#define TP_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_chat_template tp_chat_template;

/* Parse a template; TP_ERR_UNSUPPORTED names a construct outside the subset that every
 * rendering would reach. One in conditional code (an if, a for loop, a macro, x if c else y)
 * is taken, as jinja2 takes an unknown filter in an if or a method it refuses only when
 * called (tpinfer is the more lenient in loops and macros, where jinja2 refuses an unknown
 * filter at once): a rendering that reaches it fails, naming it and its line. */
tp_status tp_chat_template_create(const char *source, size_t len, tp_chat_template **out);
/* The template in file path (--chat-template), read (its text in *source, malloc'd, the
 * caller's to free; 1 MiB at most) and parsed as above; a failure names the option and path. */
tp_status tp_chat_template_create_from_file(const char *path, char **source, tp_chat_template **out);
void tp_chat_template_destroy(tp_chat_template *tpl);

/* Those constructs in conditional code ("filter \"fromjson\" (line 66), ..."), or NULL. */
const char *tp_chat_template_partial(const tp_chat_template *tpl);

/* Render with the variables of the object vars (messages, add_generation_prompt,
 * bos_token, eos_token, tools, ...). *out is malloc'ed and NUL-terminated. A template that
 * calls raise_exception(msg) fails with TP_ERR_INVALID_ARG and msg. */
tp_status tp_chat_template_render(const tp_chat_template *tpl, json_t *vars, char **out, size_t *len);

/* The usual call: messages, tools (an array, or NULL: none), add_generation_prompt and the
 * bos/eos strings (may be NULL). */
tp_status tp_chat_template_apply(const tp_chat_template *tpl, json_t *messages, json_t *tools,
                                 int add_generation_prompt, const char *bos_token, const char *eos_token, char **out,
                                 size_t *len);

#ifdef __cplusplus
}
#endif
#endif
