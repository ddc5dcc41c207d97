/* fuzz_chat_template.c: a chat template as the fuzzer writes it, parsed, then rendered
 * with a four-message conversation. Refusals are fine; crashes, hangs and leaks are not. */
#include <jansson.h>
#include <stdlib.h>

#include "chat_template.h"
#include "fuzz_common.h"

static json_t *messages;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    messages = json_loads("[{\"role\":\"system\",\"content\":\" Be brief. \"},{\"role\":\"user\",\"content\":\"Hi\"},"
                          "{\"role\":\"assistant\",\"content\":\"Hello\"},{\"role\":\"user\",\"content\":\"Why?\"}]",
                          0, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_chat_template *tpl = NULL;
    if (tp_chat_template_create((const char *)data, size, &tpl) == TP_OK) {
        char *out = NULL;
        size_t n = 0;
        tp_chat_template_apply(tpl, messages, NULL, 1, "<s>", "</s>", &out, &n);
        free(out);
    }
    tp_chat_template_destroy(tpl);
    tp_error_clear();
    return 0;
}
