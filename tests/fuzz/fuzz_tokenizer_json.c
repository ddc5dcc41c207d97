/* fuzz_tokenizer_json.c: a tokenizer.json as the fuzzer writes it (the bytes after the
 * first NUL, if any, are tokenizer_config.json); what loads must encode and decode a
 * mixed text, special tokens and invalid ids included. */
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char text[] = "<s>Hello  world\n\tabc 123 \xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80 </s><unk>ab c";
    const char *json = (const char *)data;
    const char *nul = memchr(json, 0, size);
    const size_t json_len = nul ? (size_t)(nul - json) : size;
    const char *config = nul ? nul + 1 : NULL;
    const size_t config_len = nul ? size - json_len - 1 : 0;
    tp_tokenizer *tok = NULL;
    if (tp_tokenizer_load_json(json, json_len, config, config_len, &tok) == TP_OK) {
        tp_ids ids = {0};
        if (tp_tokenizer_encode(tok, text, sizeof text - 1, 1, &ids) == TP_OK) {
            const int32_t extra[] = {-1, 0, (int32_t)tp_tokenizer_vocab_size(tok), 1 << 30};
            for (size_t i = 0; i < 4; i++) tp_ids_push(&ids, extra[i]);
            /* up to 4096 ids of the vocabulary, in a stride the input picks, through the stream */
            const size_t vocab = tp_tokenizer_vocab_size(tok) < 4096 ? tp_tokenizer_vocab_size(tok) : 4096;
            for (size_t i = 0; i < vocab; i++) tp_ids_push(&ids, (int32_t)((i * 7 + size) % vocab));
            fuzz_check_stream(tok, ids.v, ids.n, 0);
            fuzz_check_stream(tok, ids.v, ids.n, 1);
            char *out = NULL;
            size_t n = 0;
            tp_tokenizer_decode(tok, ids.v, ids.n, 0, &out, &n);
            free(out);
            out = NULL;
            tp_tokenizer_decode(tok, ids.v, ids.n, 1, &out, &n);
            free(out);
        }
        tp_ids_free(&ids);
        tp_tokenizer_chat_template(tok);
    }
    tp_tokenizer_destroy(tok);
    tp_error_clear();
    return 0;
}
