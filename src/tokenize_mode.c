/*
 * tokenize_mode.c: the JSONL tokenize/detokenize mode. One output line per non-blank
 * input line, in order; a bad line becomes an error record and the run continues.
 */
#include "tokenize_mode.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat_template.h"
#include "tokenizer.h"
#include "util.h"

#define MAX_LINE ((size_t)64 << 20)

typedef struct run {
    tp_tokenizer *tok;
    tp_chat_template *tpl;
    const char *tpl_source; /* the model's template, parsed on first use */
    int tpl_tried;
    tp_status tpl_status;
    char tpl_error[512];
} run;

static tp_status get_flag(json_t *line, const char *key, int dflt, int *out)
{
    json_t *j = json_object_get(line, key);
    if (!j) {
        *out = dflt;
        return TP_OK;
    }
    if (!json_is_boolean(j)) return tp_error(TP_ERR_INVALID_ARG, "\"%s\" must be true or false", key);
    *out = json_is_true(j);
    return TP_OK;
}

static tp_status ids_to_json(const tp_ids *ids, json_t **out)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < ids->n; i++)
        if (json_array_append_new(a, json_integer(ids->v[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    *out = a;
    return a ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
}

static tp_status chat_template(run *r, tp_chat_template **out)
{
    if (!r->tpl && !r->tpl_tried) {
        r->tpl_tried = 1;
        if (!r->tpl_source) {
            r->tpl_status = TP_ERR_INVALID_ARG;
            snprintf(r->tpl_error, sizeof r->tpl_error,
                     "the model has no chat_template in tokenizer_config.json; pass --chat-template FILE");
        } else {
            tp_error_clear();
            r->tpl_status = tp_chat_template_create(r->tpl_source, strlen(r->tpl_source), &r->tpl);
            snprintf(r->tpl_error, sizeof r->tpl_error, "%s", tp_error_message());
        }
    }
    *out = r->tpl;
    if (r->tpl) return TP_OK;
    return tp_error(r->tpl_status, "%s", r->tpl_error);
}

static tp_status tokenize_line(run *r, json_t *line, json_t *res)
{
    json_t *text = json_object_get(line, "text"), *msgs = json_object_get(line, "messages");
    if (!text == !msgs) return tp_error(TP_ERR_INVALID_ARG, "a line needs exactly one of \"text\" or \"messages\"");
    tp_ids ids = {0};
    tp_status st;
    json_t *jids;
    if (text) {
        int add = 0;
        if (!json_is_string(text)) return tp_error(TP_ERR_INVALID_ARG, "\"text\" must be a string");
        TP_CHECK(get_flag(line, "add_special_tokens", 1, &add));
        TP_CHECK_GOTO(tp_tokenizer_encode(r->tok, json_string_value(text), json_string_length(text), add, &ids), st,
                      done);
    } else {
        int gen = 0, add = 0;
        tp_chat_template *tpl;
        if (!json_is_array(msgs)) return tp_error(TP_ERR_INVALID_ARG, "\"messages\" must be an array");
        TP_CHECK(get_flag(line, "add_generation_prompt", 1, &gen));
        /* transformers encodes the rendering with add_special_tokens=False: the template
         * already wrote the BOS it wants. */
        TP_CHECK(get_flag(line, "add_special_tokens", 0, &add));
        TP_CHECK(chat_template(r, &tpl));
        json_t *tools = json_object_get(line, "tools"); /* as apply_chat_template(tools=) */
        if (tools && !json_is_array(tools) && !json_is_null(tools))
            return tp_error(TP_ERR_INVALID_ARG, "\"tools\" must be an array");
        char *s;
        size_t n;
        TP_CHECK(tp_chat_template_apply(tpl, msgs, json_is_array(tools) ? tools : NULL, gen,
                                        tp_tokenizer_bos_token(r->tok), tp_tokenizer_eos_token(r->tok), &s, &n));
        st = tp_tokenizer_encode(r->tok, s, n, add, &ids);
        if (st == TP_OK) json_object_set_new(res, "text", json_stringn(s, n));
        free(s);
        if (st != TP_OK) goto done;
    }
    TP_CHECK_GOTO(ids_to_json(&ids, &jids), st, done);
    json_object_set_new(res, "ids", jids);
done:
    tp_ids_free(&ids);
    return st;
}

static tp_status detokenize_line(run *r, json_t *line, json_t *res)
{
    json_t *jids = json_object_get(line, "ids");
    int skip = 0;
    if (!json_is_array(jids)) return tp_error(TP_ERR_INVALID_ARG, "\"ids\" must be an array of token ids");
    TP_CHECK(get_flag(line, "skip_special_tokens", 0, &skip));
    size_t n = json_array_size(jids), vocab = tp_tokenizer_vocab_size(r->tok);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return tp_error(TP_ERR_OOM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(jids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) >= vocab) {
            free(ids);
            return tp_error(TP_ERR_INVALID_ARG, "ids[%zu] is not a token id in [0, %zu)", i, vocab);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *s;
    size_t len;
    tp_status st = tp_tokenizer_decode(r->tok, ids, n, skip, &s, &len);
    free(ids);
    TP_CHECK(st);
    json_object_set_new(res, "text", json_stringn(s, len));
    free(s);
    return TP_OK;
}

static int write_json(FILE *out, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    if (!s) return -1;
    int rc = fputs(s, out) < 0 || fputc('\n', out) == EOF ? -1 : 0;
    free(s);
    return rc;
}

tp_status tp_tokenize_run(const char *model_dir, const char *input_path, const char *output_path, int detokenize,
                          const char *chat_template_path)
{
    run r = {0};
    FILE *in = NULL, *out = NULL;
    char *line = NULL, *tpl_file = NULL;
    size_t cap = 0, lineno = 0, failed = 0, total = 0;
    tp_status st;
    TP_CHECK_GOTO(tp_tokenizer_load(model_dir, &r.tok), st, done);
    r.tpl_source = tp_tokenizer_chat_template(r.tok);
    if (chat_template_path && !detokenize)
        TP_CHECK_GOTO(tp_chat_template_create_from_file(chat_template_path, &tpl_file, &r.tpl), st, done);
    in = fopen(input_path, "r");
    if (!in) {
        st = tp_error(TP_ERR_IO, "cannot open %s: %s", input_path, strerror(errno));
        goto done;
    }
    out = output_path ? fopen(output_path, "w") : stdout;
    if (!out) {
        st = tp_error(TP_ERR_IO, "cannot create %s: %s", output_path, strerror(errno));
        goto done;
    }
    ssize_t got;
    while ((got = getline(&line, &cap, in)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t')) k++;
        if (k == len) continue; /* blank lines carry no request */
        total++;
        tp_error_clear();
        json_t *res = json_object();
        json_error_t err;
        json_t *j = NULL;
        tp_status ls;
        if (!res) {
            st = tp_error(TP_ERR_OOM, "out of memory");
            goto done;
        }
        if (len > MAX_LINE) {
            ls = tp_error(TP_ERR_INVALID_ARG, "line of %zu bytes is longer than %zu", len, MAX_LINE);
        } else if (!(j = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err))) {
            ls = tp_error(TP_ERR_INVALID_ARG, "invalid JSON at column %d: %s", err.column, err.text);
        } else if (!json_is_object(j)) {
            ls = tp_error(TP_ERR_INVALID_ARG, "a line must be a JSON object");
        } else {
            ls = detokenize ? detokenize_line(&r, j, res) : tokenize_line(&r, j, res);
        }
        json_decref(j);
        if (ls != TP_OK) {
            failed++;
            json_decref(res);
            res = json_pack("{s:{s:I,s:s}}", "error", "line", (json_int_t)lineno, "message",
                            tp_error_message()[0] ? tp_error_message() : tp_status_str(ls));
        }
        int wr = res ? write_json(out, res) : -1;
        json_decref(res);
        if (wr != 0) {
            st = tp_error(TP_ERR_IO, "cannot write %s: %s", output_path ? output_path : "stdout", strerror(errno));
            goto done;
        }
    }
    if (ferror(in)) {
        st = tp_error(TP_ERR_IO, "cannot read %s: %s", input_path, strerror(errno));
        goto done;
    }
    if (fflush(out) != 0) {
        st = tp_error(TP_ERR_IO, "cannot write %s: %s", output_path ? output_path : "stdout", strerror(errno));
        goto done;
    }
    tp_error_clear();
    st = failed ? tp_error(TP_ERR_INVALID_ARG, "%zu of %zu lines of %s failed (see the error records)", failed,
                           total, input_path)
                : TP_OK;
done:
    if (in) fclose(in);
    if (out && out != stdout && fclose(out) != 0 && st == TP_OK)
        st = tp_error(TP_ERR_IO, "cannot write %s: %s", output_path, strerror(errno));
    free(line);
    free(tpl_file);
    tp_chat_template_destroy(r.tpl);
    tp_tokenizer_destroy(r.tok);
    return st;
}
