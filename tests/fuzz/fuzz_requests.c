/* fuzz_requests.c: a prompt file as the fuzzer writes it, parsed in the format its first
 * byte picks (auto, text, JSONL, OpenAI batch, TensorRT-LLM), whole and as one replica's
 * share (the first byte's top bit picks which), with a line limit. Each bad line must become
 * an error record or a refusal, and the share must be the whole read's every other request. */
#include <string.h>

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
    const int part = data[0] >> 7;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    tp_request_list whole = {0}, share = {0};
    const int whole_ok = tp_requests_parse(text, len, "fuzz.jsonl", fmt, 1000, 512, &whole) == TP_OK;
    if (whole_ok) {
        char buf[512];
        tp_requests_unknown_summary(&whole, buf, sizeof buf);
    }
    tp_error_clear();
    /* one replica's share of two: every other request of the whole read, the same ones */
    const tp_request_share half = {.parts = 2, .part = part};
    if (tp_requests_parse_share(text, len, "fuzz.jsonl", fmt, 1000, 512, &half, &share) == TP_OK && whole_ok) {
        if (share.n_total != whole.n_total || share.n != (whole.n_total + 1 - (size_t)part) / 2) abort();
        for (size_t i = 0; i < share.n; i++) {
            const tp_request *a = &share.v[i], *b = &whole.v[2 * i + (size_t)part];
            if (a->pos != b->pos || a->line != b->line || !a->id != !b->id || (a->id && strcmp(a->id, b->id) != 0) ||
                (a->error_code == NULL) != (b->error_code == NULL) || a->n_prompt_ids != b->n_prompt_ids ||
                a->prompt_len != b->prompt_len)
                abort();
        }
    }
    tp_requests_free(&whole);
    tp_requests_free(&share);
    tp_error_clear();
    return 0;
}
