/* fuzz_common.h: what every libFuzzer target here shares (tests/fuzz/run.sh builds them). */
#ifndef TP_FUZZ_COMMON_H
#define TP_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>

#include "log.h"
#include "status.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Refusals are the expected outcome of most inputs: keep their messages off stderr. */
static inline void fuzz_quiet(void)
{
    setenv("TPINFER_LOG", "error", 0);
    tp_log_init(0, 1);
}

/* path's bytes, malloc'ed (NULL on failure), for targets that load a fixed file once. */
static inline char *fuzz_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) s[n] = 0, *len = (size_t)n;
    return s;
}

/* The streaming detokenizer's pieces, pushed id by id, must add up to the whole decode of
 * the ids (what a completion's text is built from against what Hugging Face's decode gives). */
static inline void fuzz_check_stream(const tp_tokenizer *tok, const int32_t *ids, size_t n, int skip)
{
    char *whole = NULL, *streamed = malloc(16);
    size_t whole_n = 0, streamed_n = 0, streamed_cap = 16;
    tp_detok_stream *ds = NULL;
    if (tp_tokenizer_decode(tok, ids, n, skip, &whole, &whole_n) == TP_OK && tp_detok_stream_create(tok, skip, &ds) == TP_OK) {
        int ok = 1;
        for (size_t i = 0; i <= n && ok; i++) {
            const char *piece;
            size_t k;
            ok = (i < n ? tp_detok_stream_push(ds, ids[i], &piece, &k) : tp_detok_stream_finish(ds, &piece, &k)) == TP_OK;
            if (!ok) abort(); /* the whole decode of the same ids succeeded */
            while (streamed_n + k > streamed_cap) streamed = realloc(streamed, streamed_cap *= 2);
            memcpy(streamed + streamed_n, piece, k);
            streamed_n += k;
        }
        if (ok && (streamed_n != whole_n || memcmp(streamed, whole, whole_n) != 0)) abort();
    }
    tp_detok_stream_destroy(ds);
    free(whole);
    free(streamed);
    tp_error_clear();
}

#endif
