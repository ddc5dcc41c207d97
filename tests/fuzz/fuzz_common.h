/* fuzz_common.h: what every libFuzzer target here shares (tests/fuzz/run.sh builds them). */
#ifndef TP_FUZZ_COMMON_H
#define TP_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "status.h"

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

#endif
