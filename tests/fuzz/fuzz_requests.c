/* fuzz_requests.c: a prompt file as the fuzzer writes it, parsed in the format its first
 * byte picks (auto, text, JSONL, OpenAI batch, TensorRT-LLM), whole and as one replica's
 * share, with a line limit. Each bad line must become an error record or a refusal. */
#include "fuzz_common.h"
#include "requests.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const tp_input_format fmt = (tp_input_format)(data[0] % 5);
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    tp_request_list l = {0};
    if (tp_requests_parse(text, len, "fuzz.jsonl", fmt, 1000, 512, &l) == TP_OK) {
        char buf[512];
        tp_requests_unknown_summary(&l, buf, sizeof buf);
    }
    tp_requests_free(&l);
    tp_error_clear();
    const tp_request_share share = {.parts = 2, .part = data[0] >> 7};
    tp_request_list s = {0};
    tp_requests_parse_share(text, len, "fuzz.jsonl", fmt, 0, 0, &share, &s);
    tp_requests_free(&s);
    tp_error_clear();
    return 0;
}
