/*
 * requests.c: reading the prompt file. JSONL when the first non-blank line starts with
 * '{', else one prompt per line. Lines are split on '\n' (a trailing '\r' is dropped),
 * never on NUL, so a prompt may hold any byte sequence JSON can carry.
 */
#include "requests.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define MAX_INPUT_BYTES ((size_t)1 << 34) /* 16 GiB: a million long prompts */

static void request_free(tp_request *r)
{
    free(r->id);
    free(r->prompt);
    free(r->prompt_ids);
}

void tp_requests_free(tp_request_list *l)
{
    for (size_t i = 0; i < l->n; i++) request_free(&l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static tp_status push(tp_request_list *l, size_t *cap, tp_request **out)
{
    if (l->n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        tp_request *v = realloc(l->v, c * sizeof *v);
        if (!v) return tp_error(TP_ERR_OOM, "out of memory reading prompts");
        l->v = v;
        *cap = c;
    }
    *out = &l->v[l->n++];
    memset(*out, 0, sizeof **out);
    (*out)->max_tokens = -1;
    (*out)->ignore_eos = -1;
    return TP_OK;
}

/* An optional number field: absent is fine; present it must be a number in [lo, hi]. */
static tp_status num_field(json_t *o, const char *key, double lo, double hi, int integer,
                           const char *what, int64_t line, int *has, double *out)
{
    json_t *v = json_object_get(o, key);
    *has = 0;
    if (!v || json_is_null(v)) return TP_OK;
    if (integer ? !json_is_integer(v) : !json_is_number(v))
        return tp_error(TP_ERR_INVALID_ARG, "%s:%lld: \"%s\" must be %s", what, (long long)line,
                        key, integer ? "an integer" : "a number");
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return tp_error(TP_ERR_INVALID_ARG, "%s:%lld: \"%s\" %g is outside [%g, %g]", what,
                        (long long)line, key, x, lo, hi);
    *has = 1;
    *out = x;
    return TP_OK;
}

static tp_status parse_json_line(tp_request *r, const char *s, size_t n, const char *what,
                                 int64_t vocab_size)
{
    json_error_t err;
    json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &err);
    tp_status st = TP_OK;
    long long line = (long long)r->line;
    if (!o) return tp_error(TP_ERR_INVALID_ARG, "%s:%lld: invalid JSON: %s", what, line, err.text);
    if (!json_is_object(o)) {
        st = tp_error(TP_ERR_INVALID_ARG, "%s:%lld: a line must be a JSON object", what, line);
        goto out;
    }
    json_t *id = json_object_get(o, "id");
    if (!id) id = json_object_get(o, "custom_id");
    if (json_is_string(id)) {
        r->id = dup_n(json_string_value(id), json_string_length(id));
    } else if (json_is_integer(id)) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(id));
        r->id = dup_n(buf, strlen(buf));
    } else if (!id) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", line);
        r->id = dup_n(buf, strlen(buf));
    } else {
        st = tp_error(TP_ERR_INVALID_ARG, "%s:%lld: \"id\" must be a string or an integer", what, line);
        goto out;
    }
    json_t *prompt = json_object_get(o, "prompt");
    json_t *ids = json_object_get(o, "prompt_token_ids");
    if (!!prompt == !!ids) {
        st = tp_error(TP_ERR_INVALID_ARG, "%s:%lld: give exactly one of \"prompt\" and \"prompt_token_ids\"",
                      what, line);
        goto out;
    }
    if (prompt) {
        if (!json_is_string(prompt)) {
            st = tp_error(TP_ERR_INVALID_ARG, "%s:%lld: \"prompt\" must be a string", what, line);
            goto out;
        }
        r->prompt_len = json_string_length(prompt);
        r->prompt = dup_n(json_string_value(prompt), r->prompt_len);
    } else {
        size_t k = json_array_size(ids);
        if (!json_is_array(ids) || k == 0 || k > INT32_MAX) {
            st = tp_error(TP_ERR_INVALID_ARG, "%s:%lld: \"prompt_token_ids\" must be a non-empty array",
                          what, line);
            goto out;
        }
        r->prompt_ids = malloc(k * sizeof *r->prompt_ids);
        if (!r->prompt_ids) {
            st = tp_error(TP_ERR_OOM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < k; i++) {
            json_t *e = json_array_get(ids, i);
            json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
            if (v < 0 || v >= vocab_size) {
                st = tp_error(TP_ERR_INVALID_ARG,
                              "%s:%lld: prompt_token_ids[%zu] must be an integer in [0, %lld)", what,
                              line, i, (long long)vocab_size);
                goto out;
            }
            r->prompt_ids[i] = (int32_t)v;
        }
        r->n_prompt_ids = (int32_t)k;
    }
    if (!r->id || (prompt && !r->prompt)) {
        st = tp_error(TP_ERR_OOM, "out of memory");
        goto out;
    }
    int has;
    double x;
    TP_CHECK_GOTO(num_field(o, "max_tokens", 1, 1 << 30, 1, what, r->line, &has, &x), st, out);
    if (has) r->max_tokens = (int32_t)x;
    TP_CHECK_GOTO(num_field(o, "temperature", 0, 100, 0, what, r->line, &r->has_temperature, &r->temperature), st, out);
    TP_CHECK_GOTO(num_field(o, "top_k", -1, 1 << 30, 1, what, r->line, &r->has_top_k, &x), st, out);
    if (r->has_top_k) r->top_k = (int32_t)x;
    TP_CHECK_GOTO(num_field(o, "top_p", 1e-9, 1, 0, what, r->line, &r->has_top_p, &r->top_p), st, out);
    TP_CHECK_GOTO(num_field(o, "seed", 0, 9007199254740991.0, 1, what, r->line, &r->has_seed, &x), st, out);
    if (r->has_seed) r->seed = (uint64_t)json_integer_value(json_object_get(o, "seed"));
    json_t *ie = json_object_get(o, "ignore_eos");
    if (ie && !json_is_null(ie)) {
        if (!json_is_boolean(ie)) {
            st = tp_error(TP_ERR_INVALID_ARG, "%s:%lld: \"ignore_eos\" must be true or false", what, line);
            goto out;
        }
        r->ignore_eos = json_is_true(ie);
    }
out:
    json_decref(o);
    return st;
}

static int by_id_then_line(const void *a, const void *b)
{
    const tp_request *x = *(const tp_request *const *)a, *y = *(const tp_request *const *)b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

static tp_status check_unique_ids(const tp_request_list *l, const char *what)
{
    const tp_request **v = malloc(l->n * sizeof *v);
    if (!v) return tp_error(TP_ERR_OOM, "out of memory");
    for (size_t i = 0; i < l->n; i++) v[i] = &l->v[i];
    qsort(v, l->n, sizeof *v, by_id_then_line);
    tp_status st = TP_OK;
    for (size_t i = 1; i < l->n && st == TP_OK; i++)
        if (!strcmp(v[i - 1]->id, v[i]->id))
            st = tp_error(TP_ERR_INVALID_ARG, "%s:%lld: id \"%s\" was already used on line %lld", what,
                          (long long)v[i]->line, v[i]->id, (long long)v[i - 1]->line);
    free(v);
    return st;
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

tp_status tp_requests_parse(const char *text, size_t len, const char *what, int64_t vocab_size,
                            tp_request_list *out)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    /* a UTF-8 byte order mark is not part of the first prompt */
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) {
        text += 3;
        len -= 3;
    }
    int jsonl = -1;
    int64_t line = 0;
    tp_status st = TP_OK;
    for (size_t at = 0; at < len;) {
        const char *s = text + at;
        const char *nl = memchr(s, '\n', len - at);
        size_t n = nl ? (size_t)(nl - s) : len - at;
        at += n + (nl != NULL);
        line++;
        if (n && s[n - 1] == '\r') n--;
        if (blank(s, n)) continue;
        if (jsonl < 0) {
            size_t i = 0;
            while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
            jsonl = s[i] == '{';
        }
        tp_request *r = NULL;
        TP_CHECK_GOTO(push(out, &cap, &r), st, fail);
        r->line = line;
        if (jsonl) {
            TP_CHECK_GOTO(parse_json_line(r, s, n, what, vocab_size), st, fail);
        } else {
            char buf[32];
            snprintf(buf, sizeof buf, "%lld", (long long)line);
            r->id = dup_n(buf, strlen(buf));
            r->prompt = dup_n(s, n);
            r->prompt_len = n;
            if (!r->id || !r->prompt) {
                st = tp_error(TP_ERR_OOM, "out of memory");
                goto fail;
            }
        }
    }
    if (out->n == 0) {
        st = tp_error(TP_ERR_INVALID_ARG, "%s holds no prompts", what);
        goto fail;
    }
    /* duplicate ids would make the output ambiguous: refuse, naming both lines */
    TP_CHECK_GOTO(check_unique_ids(out, what), st, fail);
    return TP_OK;
fail:
    tp_requests_free(out);
    return st;
}

tp_status tp_requests_read(const char *path, int64_t vocab_size, tp_request_list *out)
{
    char *text;
    size_t len;
    memset(out, 0, sizeof *out);
    TP_CHECK(tp_read_file(path, MAX_INPUT_BYTES, &text, &len));
    tp_status st = tp_requests_parse(text, len, path, vocab_size, out);
    free(text);
    return st;
}
