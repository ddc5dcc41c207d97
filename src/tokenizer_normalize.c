/*
 * tokenizer_normalize.c: HF normalizers (Sequence, NFC/NFD/NFKC/NFKD, Lowercase, Strip,
 * Prepend, Replace) applied to one piece of text; Unicode work goes through libunistring.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

static tp_status copy_string(json_t *obj, const char *key, char **out, size_t *len, const char *what)
{
    const char *s;
    TP_CHECK(tk_get_string(obj, key, &s, len, what));
    *out = malloc(*len + 1);
    if (!*out) return tp_error(TP_ERR_OOM, "out of memory");
    memcpy(*out, s, *len + 1);
    return TP_OK;
}

tp_status tk_normalizer_parse(tk_normalizer *nz, json_t *j)
{
    memset(nz, 0, sizeof *nz);
    if (!json_is_object(j))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: a normalizer must be an object, not %s", tk_json_type(j));
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return tp_error(TP_ERR_FORMAT, "tokenizer.json: a normalizer has no \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        static const char *const known[] = {"type", "normalizers", NULL};
        TP_CHECK(tk_check_keys(j, known, "normalizer Sequence"));
        json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a))
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: normalizer Sequence needs a \"normalizers\" array");
        nz->type = TK_NORM_SEQUENCE;
        nz->kids = calloc(json_array_size(a) + 1, sizeof *nz->kids);
        if (!nz->kids) return tp_error(TP_ERR_OOM, "out of memory");
        for (size_t i = 0; i < json_array_size(a); i++) {
            nz->n_kids++;
            TP_CHECK(tk_normalizer_parse(&nz->kids[i], json_array_get(a, i)));
        }
        return TP_OK;
    }
    if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD")) {
        static const char *const known[] = {"type", NULL};
        TP_CHECK(tk_check_keys(j, known, "normalizer"));
        nz->type = TK_NORM_UNICODE;
        nz->str = strdup(type);
        return nz->str ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (strcmp(type, "Lowercase") == 0) {
        static const char *const known[] = {"type", NULL};
        TP_CHECK(tk_check_keys(j, known, "normalizer Lowercase"));
        nz->type = TK_NORM_LOWERCASE;
        return TP_OK;
    }
    if (strcmp(type, "Strip") == 0) {
        static const char *const known[] = {"type", "strip_left", "strip_right", NULL};
        TP_CHECK(tk_check_keys(j, known, "normalizer Strip"));
        nz->type = TK_NORM_STRIP;
        TP_CHECK(tk_get_bool(j, "strip_left", 1, &nz->left, "normalizer Strip"));
        return tk_get_bool(j, "strip_right", 1, &nz->right, "normalizer Strip");
    }
    if (strcmp(type, "Prepend") == 0) {
        static const char *const known[] = {"type", "prepend", NULL};
        TP_CHECK(tk_check_keys(j, known, "normalizer Prepend"));
        nz->type = TK_NORM_PREPEND;
        return copy_string(j, "prepend", &nz->str, &nz->str_len, "normalizer Prepend");
    }
    if (strcmp(type, "Replace") == 0) {
        static const char *const known[] = {"type", "pattern", "content", NULL};
        TP_CHECK(tk_check_keys(j, known, "normalizer Replace"));
        nz->type = TK_NORM_REPLACE;
        TP_CHECK(copy_string(j, "content", &nz->str, &nz->str_len, "normalizer Replace"));
        return tk_pattern_parse(&nz->pat, json_object_get(j, "pattern"), "normalizer Replace");
    }
    return tp_error(TP_ERR_UNSUPPORTED,
                    "tokenizer.json: normalizer type \"%.64s\" is not supported (supported: Sequence, NFC, NFD, "
                    "NFKC, NFKD, Lowercase, Strip, Prepend, Replace)",
                    type);
}

void tk_normalizer_free(tk_normalizer *nz)
{
    if (!nz) return;
    for (size_t i = 0; i < nz->n_kids; i++) tk_normalizer_free(&nz->kids[i]);
    free(nz->kids);
    free(nz->str);
    tk_pattern_free(&nz->pat);
    memset(nz, 0, sizeof *nz);
}

/* Length of the leading (or, with from_end, trailing) run of White_Space characters. */
static size_t ws_run(const char *s, size_t n, int from_end)
{
    size_t i = 0;
    if (!from_end) {
        while (i < n) {
            uint32_t cp;
            int k = tp_utf8_next((const uint8_t *)s + i, n - i, &cp);
            if (k < 0 || !tp_uc_is_whitespace(cp)) break;
            i += (size_t)k;
        }
        return i;
    }
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((uint8_t)s[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        int k = tp_utf8_next((const uint8_t *)s + st, end - st, &cp);
        if (k < 0 || !tp_uc_is_whitespace(cp)) break;
        end = st;
    }
    return n - end;
}

tp_status tk_normalize(const tk_normalizer *nz, const char *s, size_t n, tk_pool *pool, const char **out,
                       size_t *out_len)
{
    char *buf = NULL;
    size_t len = 0;
    switch (nz->type) {
    case TK_NORM_SEQUENCE:
        for (size_t i = 0; i < nz->n_kids; i++) TP_CHECK(tk_normalize(&nz->kids[i], s, n, pool, &s, &n));
        *out = s;
        *out_len = n;
        return TP_OK;
    case TK_NORM_UNICODE:
        TP_CHECK(tp_utf8_normalize(nz->str, s, n, &buf, &len));
        break;
    case TK_NORM_LOWERCASE:
        TP_CHECK(tp_utf8_lowercase(s, n, &buf, &len));
        break;
    case TK_NORM_STRIP: {
        size_t a = nz->left ? ws_run(s, n, 0) : 0;
        size_t b = nz->right && a < n ? ws_run(s + a, n - a, 1) : 0;
        *out = s + a;
        *out_len = n - a - b;
        return TP_OK;
    }
    case TK_NORM_PREPEND:
        if (n == 0) break;
        buf = malloc(n + nz->str_len + 1);
        if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
        memcpy(buf, nz->str, nz->str_len);
        memcpy(buf + nz->str_len, s, n);
        len = n + nz->str_len;
        buf[len] = '\0';
        break;
    case TK_NORM_REPLACE: {
        tk_buf b = {0};
        tp_status st = tk_pattern_replace(&nz->pat, s, n, nz->str, nz->str_len, &b);
        if (st != TP_OK) {
            tk_buf_free(&b);
            return st;
        }
        buf = b.s;
        len = b.len;
        break;
    }
    }
    if (!buf) {
        *out = s;
        *out_len = n;
        return TP_OK;
    }
    TP_CHECK(tk_pool_add(pool, buf));
    *out = buf;
    *out_len = len;
    return TP_OK;
}
