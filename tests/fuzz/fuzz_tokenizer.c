/* fuzz_tokenizer.c: arbitrary bytes encoded by a real tokenizer (TPINFER_FUZZ_TOKENIZER: a
 * directory with tokenizer.json; run.sh gives GPT-2's from ../shared unless told another),
 * the ids decoded back, and the same bytes read as ids and decoded. Invalid UTF-8 must be
 * refused and valid UTF-8 encoded; what the encoder gives must decode, and back to the text
 * where the tokenizer is lossless (TPINFER_FUZZ_ROUNDTRIP=1: GPT-2's byte-level BPE). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer.h"
#include "unicode.h"

static tp_tokenizer *tok;
static int roundtrip; /* TPINFER_FUZZ_ROUNDTRIP=1: the tokenizer is lossless (byte-level BPE) */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    const char *dir = getenv("TPINFER_FUZZ_TOKENIZER");
    if (!dir || tp_tokenizer_load(dir, &tok) != TP_OK) {
        fprintf(stderr, "fuzz_tokenizer: set TPINFER_FUZZ_TOKENIZER to a directory with a tokenizer.json\n");
        exit(1);
    }
    const char *r = getenv("TPINFER_FUZZ_ROUNDTRIP");
    roundtrip = r && strcmp(r, "1") == 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    tp_ids ids = {0};
    const tp_status st = tp_tokenizer_encode(tok, text, size, size & 1, &ids);
    if ((st == TP_OK) != tp_utf8_valid(text, size, NULL)) abort();
    if (st == TP_OK) {
        char *back = NULL;
        size_t n = 0;
        if (tp_tokenizer_decode(tok, ids.v, ids.n, 0, &back, &n) != TP_OK) abort();
        if (roundtrip && (n != size || memcmp(back, text, size) != 0)) abort();
        free(back);
    }
    tp_ids_free(&ids);
    /* the bytes as ids: out-of-range and special ids are skipped, never read past the table,
     * and the stream's pieces add up to the whole decode */
    const size_t n_ids = size / 4;
    int32_t *as_ids = malloc(n_ids * 4 + 4);
    memcpy(as_ids, data, n_ids * 4);
    fuzz_check_stream(tok, as_ids, n_ids, 1);
    fuzz_check_stream(tok, as_ids, n_ids, 0);
    free(as_ids);
    tp_error_clear();
    return 0;
}
