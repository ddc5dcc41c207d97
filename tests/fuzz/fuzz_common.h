/* fuzz_common.h: what every libFuzzer target here shares (tests/fuzz/run.sh builds them). */
#ifndef TP_FUZZ_COMMON_H
#define TP_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <dirent.h>
#include <string.h>
#include <unistd.h>

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

/* A scratch directory for the targets that need files (made once, removed with its files
 * at exit), and a file in it written whole: a failure here is the harness's, not the input's. */
static char fuzz_dir_path[] = "/tmp/tpinfer-fuzz.XXXXXX";

static inline void fuzz_dir_remove(void)
{
    DIR *d = opendir(fuzz_dir_path);
    for (struct dirent *e; d && (e = readdir(d));) {
        char p[sizeof fuzz_dir_path + 256];
        if (e->d_name[0] != '.' && snprintf(p, sizeof p, "%s/%s", fuzz_dir_path, e->d_name) < (int)sizeof p) unlink(p);
    }
    if (d) closedir(d);
    rmdir(fuzz_dir_path);
}

static inline const char *fuzz_dir(void)
{
    if (!mkdtemp(fuzz_dir_path)) abort();
    atexit(fuzz_dir_remove);
    return fuzz_dir_path;
}

static inline void fuzz_put(const char *path, const void *s, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(s, 1, n, f) != n) abort();
    fclose(f);
}

/* A seed made from parts known only at run time (a manifest, the template tests' contexts):
 * head, one separator byte (-1: none), then tail, as $TPINFER_FUZZ_SEED_DIR/name, where
 * run.sh sets that folder (elsewhere nothing is written). */
static inline void fuzz_write_seed(const char *name, const void *head, size_t head_n, int sep, const void *tail,
                                   size_t tail_n)
{
    const char *dir = getenv("TPINFER_FUZZ_SEED_DIR");
    char path[4096];
    if (!dir || snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return;
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(head, 1, head_n, f);
    if (sep >= 0) fputc(sep, f);
    fwrite(tail, 1, tail_n, f);
    fclose(f);
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
