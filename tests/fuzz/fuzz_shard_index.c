/* fuzz_shard_index.c: a model.safetensors.index.json as the fuzzer writes it, checked
 * against a directory that holds the two shards it names: a shard name that leaves the
 * directory, is missing or is not a string must be refused, never followed. */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "weights.h"

static const char *dir;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    dir = fuzz_dir();
    for (int i = 1; i <= 2; i++) { /* the shards the seed names: empty files do for the checks */
        char shard[128];
        snprintf(shard, sizeof shard, "%s/model-0000%d-of-00002.safetensors", dir, i);
        fuzz_put(shard, "", 0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char **names = NULL;
    size_t n = 0;
    tp_weights_parse_index((const char *)data, size, dir, &names, &n);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    tp_error_clear();
    return 0;
}
