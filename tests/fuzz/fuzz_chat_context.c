/* fuzz_chat_context.c: the real templates (Llama-3.1, Qwen2.5, Qwen3, Mistral, Llama-2 and
 * the feature tour of check_chat_template_cases.h; the first byte picks one) rendered with a
 * context the fuzzer writes (the rest: messages, tools, add_generation_prompt, ... as JSON),
 * as a request's "messages" reach them. Any context is rendered or refused with a message. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "check_chat_template_cases.h"
#include "fuzz_common.h"

static const char *const templates[] = {TPL_LLAMA31, TPL_QWEN25, TPL_QWEN3, TPL_MISTRAL, TPL_LLAMA2, TPL_FEATURES};
enum { N_TEMPLATES = sizeof templates / sizeof templates[0] };
static tp_chat_template *parsed[N_TEMPLATES];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    for (int i = 0; i < N_TEMPLATES; i++)
        if (tp_chat_template_create(templates[i], strlen(templates[i]), &parsed[i]) != TP_OK) abort();
    /* run.sh: each template (its index, the first byte) with each context of the template tests */
    const char *const contexts[] = {CTX_1, CTX_2, CTX_3, CTX_4};
    for (int i = 0; i < N_TEMPLATES; i++)
        for (int c = 0; c < 4; c++) {
            char name[32];
            snprintf(name, sizeof name, "t%d-ctx%d", i, c + 1);
            fuzz_write_seed(name, "", 0, i, contexts[c], strlen(contexts[c]));
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    json_t *vars = json_loadb((const char *)data + 1, size - 1, JSON_ALLOW_NUL, NULL);
    if (!vars) return 0;
    char *out = NULL;
    size_t n = 0;
    const tp_chat_template *tpl = parsed[data[0] % N_TEMPLATES];
    if (json_is_object(vars))
        tp_chat_template_render(tpl, vars, &out, &n);
    else /* any other JSON value as the messages, as a request's "messages" field gives them */
        tp_chat_template_apply(tpl, vars, NULL, data[0] >> 7, "<s>", "</s>", &out, &n);
    free(out);
    json_decref(vars);
    tp_error_clear();
    return 0;
}
