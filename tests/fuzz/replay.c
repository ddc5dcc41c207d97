/* replay.c: a libFuzzer target as a plain program, for `make check`: each argument (a file,
 * or a directory of files) is given to LLVMFuzzerTestOneInput once. The crashes fuzzing
 * found live in tests/fuzz/regressions/TARGET/, so they stay fixed. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"
#include "util.h"

static int replay_file(const char *path)
{
    size_t len = 0;
    char *data = NULL;
    if (tp_read_file(path, (size_t)1 << 30, &data, &len) != TP_OK) {
        fprintf(stderr, "replay: %s\n", tp_error_message());
        return 1;
    }
    /* an exact-size copy, so a read past the input's end is caught as under libFuzzer */
    uint8_t *exact = malloc(len ? len : 1);
    memcpy(exact, data, len);
    free(data);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    LLVMFuzzerInitialize(&argc, &argv);
    int failed = 0, n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
            failed = 1;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            failed |= replay_file(argv[i]);
            n++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            failed |= replay_file(path);
            n++;
        }
        if (d) closedir(d);
    }
    printf("replayed %d inputs\n", n);
    return failed;
}
