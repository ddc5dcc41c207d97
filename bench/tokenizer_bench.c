/*
 * tokenizer_bench.c: encode throughput (MB/s) of the tokenizer on ~10 MB of generated
 * mixed text (prose, code, numbers, CJK, emoji), in 64 KiB prompts, and decode throughput.
 * Usage: tokenizer_bench TOKENIZER_DIR... (default: ../shared/tokenizers/gpt2)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *make_text(size_t n, size_t *len)
{
    static const char *const parts[] = {
        "The quick brown fox jumps over the lazy dog. ", "Once upon a time, there was a little girl named Lily. ",
        "    def f(x):\n        return x * 2\n", "1234567890 and 3.14159, ", "中文字符测试，你好世界。", "😀🎉👍🏽 ",
        "naïve café résumé ", "\n\n", "I'm sure they'll see it's fine. ", "https://example.org/a/b?q=1&r=2 ",
        "Привет, мир! ", "if (x == 1) { return y; } ",
    };
    char *buf = malloc(n + 128);
    size_t o = 0;
    unsigned s = 12345;
    while (o < n) {
        s = s * 1103515245u + 12345u;
        const char *p = parts[(s >> 16) % (sizeof parts / sizeof parts[0])];
        size_t l = strlen(p);
        memcpy(buf + o, p, l);
        o += l;
    }
    *len = o;
    return buf;
}

int main(int argc, char **argv)
{
    const char *def[] = {"../shared/tokenizers/gpt2"};
    const char **dirs = argc > 1 ? (const char **)argv + 1 : def;
    int ndirs = argc > 1 ? argc - 1 : 1;
    size_t len;
    char *text = make_text((size_t)10 << 20, &len);
    const size_t chunk = 64 << 10;
    printf("%-40s %10s %12s %12s %12s\n", "tokenizer", "MB", "tokens", "encode MB/s", "decode MB/s");
    for (int d = 0; d < ndirs; d++) {
        tp_tokenizer *tok;
        if (tp_tokenizer_load(dirs[d], &tok) != TP_OK) {
            fprintf(stderr, "tokenizer_bench: %s: %s\n", dirs[d], tp_error_message());
            return 1;
        }
        tp_ids ids = {0};
        double t0 = now();
        for (size_t o = 0; o < len;) {
            size_t n = len - o < chunk ? len - o : chunk;
            while (o + n < len && ((unsigned char)text[o + n] & 0xC0) == 0x80) n++; /* whole characters */
            if (tp_tokenizer_encode(tok, text + o, n, 0, &ids) != TP_OK) {
                fprintf(stderr, "tokenizer_bench: encode: %s\n", tp_error_message());
                return 1;
            }
            o += n;
        }
        double t1 = now();
        char *back;
        size_t blen;
        if (tp_tokenizer_decode(tok, ids.v, ids.n, 0, &back, &blen) != TP_OK) return 1;
        double t2 = now();
        printf("%-40s %10.1f %12zu %12.1f %12.1f\n", dirs[d], len / 1e6, ids.n, len / 1e6 / (t1 - t0),
               blen / 1e6 / (t2 - t1));
        free(back);
        tp_ids_free(&ids);
        tp_tokenizer_destroy(tok);
    }
    free(text);
    return 0;
}
