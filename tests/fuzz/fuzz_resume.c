/* fuzz_resume.c: an output file and its manifest as --resume finds them after a crash or
 * an edit (the bytes before the first NUL are the output, those after it the manifest; no
 * NUL: the output with a valid manifest), reopened to resume, given one more line and
 * closed. Every copy is resumed or refused with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "output.h"
#include "util.h"

static char out_path[64], man_path[96];
static char *valid_manifest;
static size_t valid_manifest_len;
/* no model directory or input file: the manifest is the same on every machine */
static const tp_manifest manifest = {"1.0", NULL, NULL, "{\"temperature\":0.7,\"max_tokens\":16}"};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    const char *dir = fuzz_dir();
    snprintf(out_path, sizeof out_path, "%s/out.jsonl", dir);
    snprintf(man_path, sizeof man_path, "%s/out.jsonl.manifest.json", dir);
    /* the run the inputs resume: its manifest is the one an input without a NUL gets */
    tp_output_config c = {out_path, NULL, 0, 0, 0, 0, 2.0};
    tp_output *o = NULL;
    static const char line[] = "{\"id\":\"a\",\"text\":\"one\",\"finish_reason\":\"length\"}";
    if (tp_output_open(&c, &manifest, &o) != TP_OK || tp_output_write(o, 0, line, sizeof line - 1, 0) != TP_OK ||
        tp_output_close(o, 0) != TP_OK)
        abort();
    if (tp_read_file(man_path, 1 << 20, &valid_manifest, &valid_manifest_len) != TP_OK) abort();
    /* run.sh: a seed of the output's line, a NUL, then this manifest */
    char output[sizeof line + 1];
    snprintf(output, sizeof output, "%s\n", line);
    fuzz_write_seed("with_manifest", output, sizeof output - 1, 0, valid_manifest, valid_manifest_len);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, 0, size);
    const size_t out_len = nul ? (size_t)(nul - text) : size;
    fuzz_put(out_path, text, out_len);
    if (nul)
        fuzz_put(man_path, nul + 1, size - out_len - 1);
    else
        fuzz_put(man_path, valid_manifest, valid_manifest_len);
    tp_output_config c = {out_path, NULL, 1, size & 1, 0, (size >> 1) & 1, 2.0};
    tp_output *o = NULL;
    if (tp_output_open(&c, &manifest, &o) == TP_OK) {
        static const char line[] = "{\"id\":\"z\",\"text\":\"more\",\"finish_reason\":\"stop\"}";
        tp_output_is_done(o, "a");
        tp_output_write(o, 0, line, sizeof line - 1, 0);
        tp_output_close(o, 1);
    }
    tp_error_clear();
    return 0;
}
