/*
 * tokenizer_driver.c: the C side of tests/tokenizer_diff.py. Reads JSONL {"text": ...}
 * and writes one JSONL line per input: ids with and without special tokens, both decodes,
 * and whether streaming detokenization reproduced the full decode.
 * Usage: tokenizer_driver TOKENIZER_DIR IN.jsonl OUT.jsonl
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer.h"

static json_t *ids_json(const tp_ids *ids)
{
    json_t *a = json_array();
    for (size_t i = 0; i < ids->n; i++) json_array_append_new(a, json_integer(ids->v[i]));
    return a;
}

static int stream_matches(const tp_tokenizer *tok, const tp_ids *ids, int skip, const char *full, size_t full_len)
{
    tp_detok_stream *ds;
    if (tp_detok_stream_create(tok, skip, &ds) != TP_OK) return 0;
    char *acc = malloc(full_len + 1);
    size_t n = 0;
    int ok = acc != NULL;
    for (size_t i = 0; ok && i <= ids->n; i++) {
        const char *t;
        size_t tl;
        tp_status st = i < ids->n ? tp_detok_stream_push(ds, ids->v[i], &t, &tl) : tp_detok_stream_finish(ds, &t, &tl);
        if (st != TP_OK || n + tl > full_len || memcmp(full + n, t, tl) != 0) ok = 0;
        else n += tl;
    }
    tp_detok_stream_destroy(ds);
    free(acc);
    return ok && n == full_len;
}

static json_t *process(tp_tokenizer *tok, json_t *line)
{
    json_t *jt = json_object_get(line, "text");
    json_t *res = json_object();
    if (!json_is_string(jt)) {
        json_object_set_new(res, "error", json_string("no text"));
        return res;
    }
    tp_ids ids = {0}, ns = {0};
    tp_error_clear();
    if (tp_tokenizer_encode(tok, json_string_value(jt), json_string_length(jt), 1, &ids) != TP_OK ||
        tp_tokenizer_encode(tok, json_string_value(jt), json_string_length(jt), 0, &ns) != TP_OK) {
        json_object_set_new(res, "error", json_string(tp_error_message()));
        goto done;
    }
    json_object_set_new(res, "ids", ids_json(&ids));
    json_object_set_new(res, "ids_ns", ids_json(&ns));
    int stream_ok = 1;
    for (int skip = 0; skip < 2; skip++) {
        char *s;
        size_t n;
        if (tp_tokenizer_decode(tok, ids.v, ids.n, skip, &s, &n) != TP_OK) {
            json_object_set_new(res, "error", json_string(tp_error_message()));
            goto done;
        }
        json_object_set_new(res, skip ? "decode_skip" : "decode", json_stringn(s, n));
        stream_ok &= stream_matches(tok, &ids, skip, s, n);
        free(s);
    }
    json_object_set_new(res, "stream_ok", json_boolean(stream_ok));
done:
    tp_ids_free(&ids);
    tp_ids_free(&ns);
    return res;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s TOKENIZER_DIR IN.jsonl OUT.jsonl\n", argv[0]);
        return 2;
    }
    tp_tokenizer *tok;
    if (tp_tokenizer_load(argv[1], &tok) != TP_OK) {
        fprintf(stderr, "tokenizer_driver: %s (%s)\n", tp_error_message(), tp_error_where());
        return 1;
    }
    FILE *in = fopen(argv[2], "r"), *out = fopen(argv[3], "w");
    if (!in || !out) {
        fprintf(stderr, "tokenizer_driver: cannot open %s or %s\n", argv[2], argv[3]);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, in)) > 0) {
        json_error_t err;
        json_t *j = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &err);
        json_t *res = j ? process(tok, j) : json_pack("{s:s}", "error", err.text);
        char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        fprintf(out, "%s\n", s ? s : "{\"error\": \"dump\"}");
        free(s);
        json_decref(res);
        json_decref(j);
    }
    free(line);
    fclose(in);
    fclose(out);
    tp_tokenizer_destroy(tok);
    return 0;
}
