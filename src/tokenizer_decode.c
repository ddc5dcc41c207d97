/*
 * tokenizer_decode.c: ids -> text through HF decoders (Sequence, ByteLevel, Replace,
 * ByteFallback, Fuse, Strip, Metaspace), each a step over a list of token strings as in
 * HF's decode_chain, and the streaming detokenizer built on it.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

// ----------------------------------------------------------------------------
// parsing

tp_status tk_decoder_parse(tk_decoder *d, json_t *j)
{
    memset(d, 0, sizeof *d);
    if (!json_is_object(j))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: a decoder must be an object, not %s", tk_json_type(j));
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return tp_error(TP_ERR_FORMAT, "tokenizer.json: a decoder has no \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        static const char *const known[] = {"type", "decoders", NULL};
        TP_CHECK(tk_check_keys(j, known, "decoder Sequence"));
        json_t *a = json_object_get(j, "decoders");
        if (!json_is_array(a))
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: decoder Sequence needs a \"decoders\" array");
        d->type = TK_DEC_SEQUENCE;
        d->kids = calloc(json_array_size(a) + 1, sizeof *d->kids);
        if (!d->kids) return tp_error(TP_ERR_OOM, "out of memory");
        for (size_t i = 0; i < json_array_size(a); i++) {
            d->n_kids++;
            TP_CHECK(tk_decoder_parse(&d->kids[i], json_array_get(a, i)));
        }
        return TP_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const known[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        d->type = TK_DEC_BYTELEVEL;
        return tk_check_keys(j, known, "decoder ByteLevel");
    }
    if (strcmp(type, "ByteFallback") == 0 || strcmp(type, "Fuse") == 0) {
        static const char *const known[] = {"type", NULL};
        d->type = type[0] == 'B' ? TK_DEC_BYTEFALLBACK : TK_DEC_FUSE;
        return tk_check_keys(j, known, "decoder");
    }
    if (strcmp(type, "Replace") == 0) {
        static const char *const known[] = {"type", "pattern", "content", NULL};
        TP_CHECK(tk_check_keys(j, known, "decoder Replace"));
        d->type = TK_DEC_REPLACE;
        const char *c;
        TP_CHECK(tk_get_string(j, "content", &c, &d->content_len, "decoder Replace"));
        d->content = malloc(d->content_len + 1);
        if (!d->content) return tp_error(TP_ERR_OOM, "out of memory");
        memcpy(d->content, c, d->content_len + 1);
        return tk_pattern_parse(&d->pat, json_object_get(j, "pattern"), "decoder Replace");
    }
    if (strcmp(type, "Strip") == 0) {
        static const char *const known[] = {"type", "content", "start", "stop", NULL};
        TP_CHECK(tk_check_keys(j, known, "decoder Strip"));
        d->type = TK_DEC_STRIP;
        const char *c;
        size_t n;
        TP_CHECK(tk_get_string(j, "content", &c, &n, "decoder Strip"));
        int k = n ? tp_utf8_next((const uint8_t *)c, n, &d->ch) : -1;
        json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        if (k < 0 || (size_t)k != n || !json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(b) < 0 || json_integer_value(a) > 1000000 || json_integer_value(b) > 1000000)
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: decoder Strip needs one \"content\" character and "
                            "non-negative \"start\" and \"stop\"");
        d->start = (size_t)json_integer_value(a);
        d->stop = (size_t)json_integer_value(b);
        return TP_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        static const char *const known[] = {"type", "replacement", "prepend_scheme", "split", "add_prefix_space",
                                            "str_rep", NULL};
        TP_CHECK(tk_check_keys(j, known, "decoder Metaspace"));
        d->type = TK_DEC_METASPACE;
        TP_CHECK(tk_parse_replacement(j, &d->ch, "decoder Metaspace"));
        return tk_parse_prepend_scheme(j, &d->prepend, "decoder Metaspace");
    }
    return tp_error(TP_ERR_UNSUPPORTED,
                    "tokenizer.json: decoder type \"%.64s\" is not supported (supported: Sequence, ByteLevel, "
                    "Replace, ByteFallback, Fuse, Strip, Metaspace)",
                    type);
}

void tk_decoder_free(tk_decoder *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->n_kids; i++) tk_decoder_free(&d->kids[i]);
    free(d->kids);
    free(d->content);
    tk_pattern_free(&d->pat);
    memset(d, 0, sizeof *d);
}

// ----------------------------------------------------------------------------
// token lists

typedef struct toklist {
    tk_buf *v;
    size_t n, cap;
} toklist;

static void toklist_free(toklist *l)
{
    for (size_t i = 0; i < l->n; i++) tk_buf_free(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static tp_status toklist_push(toklist *l, const char *s, size_t n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        tk_buf *v = realloc(l->v, cap * sizeof *v);
        if (!v) return tp_error(TP_ERR_OOM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = (tk_buf){0};
    TP_CHECK(tk_buf_put(&l->v[l->n], s, n));
    l->n++;
    return TP_OK;
}

/* Inverse of bytes_to_unicode: code point -> byte, -1 if the code point is not a byte. */
static int char_byte(uint32_t cp)
{
    static int16_t table[0x144];
    static int ready;
    if (!ready) {
        for (size_t i = 0; i < 0x144; i++) table[i] = -1;
        for (int b = 0; b < 256; b++) {
            uint32_t c;
            const char *s = tk_byte_char[b];
            tp_utf8_next((const uint8_t *)s, strlen(s), &c);
            table[c] = (int16_t)b;
        }
        ready = 1;
    }
    return cp < 0x144 ? table[cp] : -1;
}

/* "<0xHH>" -> byte, as Rust's u8::from_str_radix(&t[3..5], 16) reads it ("+F" included). */
static int byte_token(const char *t, size_t n)
{
    if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
    int v = 0, digits = 0;
    for (int i = 3; i < 5; i++) {
        char c = t[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) {
            if (i == 3 && c == '+') continue;
            return -1;
        }
        v = v * 16 + d;
        digits++;
    }
    return digits ? v : -1;
}

/* raw: the bytes as they are, valid UTF-8 or not (tp_tokenizer_decode_raw) */
static tp_status flush_bytes(toklist *out, tk_buf *bytes, int raw)
{
    if (bytes->len == 0) return TP_OK;
    tp_status st;
    if (raw || tp_utf8_valid(bytes->s, bytes->len, NULL)) {
        st = toklist_push(out, bytes->s, bytes->len);
    } else {
        /* HF: one U+FFFD per byte when the run is not valid UTF-8 as a whole. */
        st = TP_OK;
        for (size_t i = 0; i < bytes->len && st == TP_OK; i++) st = toklist_push(out, "\xEF\xBF\xBD", 3);
    }
    bytes->len = 0;
    return st;
}

static tp_status strip_token(const tk_decoder *d, const tk_buf *t, toklist *out)
{
    const uint8_t *s = (const uint8_t *)t->s;
    size_t a = 0, b = t->len;
    for (size_t k = 0; k < d->start && a < t->len; k++) {
        uint32_t cp;
        int n = tp_utf8_next(s + a, t->len - a, &cp);
        if (n < 0 || cp != d->ch) break;
        a += (size_t)n;
    }
    for (size_t k = 0; k < d->stop && b > a; k++) {
        size_t st = b - 1;
        while (st > a && (s[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        if (tp_utf8_next(s + st, b - st, &cp) < 0 || cp != d->ch) break;
        b = st;
    }
    return toklist_push(out, t->s + a, b - a);
}

static tp_status decode_chain(const tk_decoder *d, toklist *in, toklist *out, int raw)
{
    tk_buf tmp = {0};
    tp_status st = TP_OK;
    switch (d->type) {
    case TK_DEC_SEQUENCE:
        for (size_t i = 0; i < d->n_kids; i++) {
            toklist next = {0};
            st = decode_chain(&d->kids[i], in, &next, raw);
            toklist_free(in);
            *in = next;
            if (st != TP_OK) return st;
        }
        *out = *in;
        memset(in, 0, sizeof *in);
        return TP_OK;
    case TK_DEC_BYTELEVEL:
        for (size_t i = 0; i < in->n && st == TP_OK; i++) {
            const tk_buf *t = &in->v[i];
            size_t mark = tmp.len, k = 0;
            int all = 1;
            while (k < t->len && st == TP_OK) {
                uint32_t cp;
                int n = tp_utf8_next((const uint8_t *)t->s + k, t->len - k, &cp);
                int b = n > 0 ? char_byte(cp) : -1;
                if (b < 0) {
                    all = 0;
                    break;
                }
                char c = (char)b;
                st = tk_buf_put(&tmp, &c, 1);
                k += (size_t)n;
            }
            if (!all) {
                tmp.len = mark;
                st = tk_buf_put(&tmp, t->s, t->len);
            }
        }
        if (st == TP_OK && raw) {
            st = toklist_push(out, tmp.s ? tmp.s : "", tmp.len);
        } else if (st == TP_OK) {
            char *lossy;
            size_t n;
            st = tp_utf8_lossy(tmp.s ? tmp.s : "", tmp.len, &lossy, &n);
            if (st == TP_OK) {
                st = toklist_push(out, lossy, n);
                free(lossy);
            }
        }
        break;
    case TK_DEC_REPLACE:
        for (size_t i = 0; i < in->n && st == TP_OK; i++) {
            st = tk_pattern_replace(&d->pat, in->v[i].s, in->v[i].len, d->content, d->content_len, &tmp);
            if (st == TP_OK) st = toklist_push(out, tmp.s, tmp.len);
        }
        break;
    case TK_DEC_BYTEFALLBACK:
        for (size_t i = 0; i < in->n && st == TP_OK; i++) {
            int b = byte_token(in->v[i].s, in->v[i].len);
            if (b >= 0) {
                char c = (char)b;
                st = tk_buf_put(&tmp, &c, 1);
                continue;
            }
            st = flush_bytes(out, &tmp, raw);
            if (st == TP_OK) st = toklist_push(out, in->v[i].s, in->v[i].len);
        }
        if (st == TP_OK) st = flush_bytes(out, &tmp, raw);
        break;
    case TK_DEC_FUSE:
        st = tk_buf_put(&tmp, "", 0);
        for (size_t i = 0; i < in->n && st == TP_OK; i++) st = tk_buf_put(&tmp, in->v[i].s, in->v[i].len);
        if (st == TP_OK) st = toklist_push(out, tmp.s, tmp.len);
        break;
    case TK_DEC_STRIP:
        for (size_t i = 0; i < in->n && st == TP_OK; i++) st = strip_token(d, &in->v[i], out);
        break;
    case TK_DEC_METASPACE:
        for (size_t i = 0; i < in->n && st == TP_OK; i++) {
            const tk_buf *t = &in->v[i];
            tmp.len = 0;
            st = tk_buf_put(&tmp, "", 0);
            for (size_t k = 0; k < t->len && st == TP_OK;) {
                uint32_t cp;
                int n = tp_utf8_next((const uint8_t *)t->s + k, t->len - k, &cp);
                if (n < 0) n = 1, cp = 0;
                if (n > 0 && cp == d->ch) {
                    if (!(i == 0 && d->prepend != TK_PREPEND_NEVER)) st = tk_buf_put(&tmp, " ", 1);
                } else {
                    st = tk_buf_put(&tmp, t->s + k, (size_t)n);
                }
                k += (size_t)n;
            }
            if (st == TP_OK) st = toklist_push(out, tmp.s, tmp.len);
        }
        break;
    }
    tk_buf_free(&tmp);
    return st;
}

// ----------------------------------------------------------------------------
// decode

static tp_status decode_ids(const tp_tokenizer *tok, const int32_t *ids, size_t n, int skip_special_tokens, int raw,
                            char **text, size_t *len);

tp_status tp_tokenizer_decode(const tp_tokenizer *tok, const int32_t *ids, size_t n, int skip_special_tokens,
                              char **text, size_t *len)
{
    return decode_ids(tok, ids, n, skip_special_tokens, 0, text, len);
}

tp_status tp_tokenizer_decode_raw(const tp_tokenizer *tok, const int32_t *ids, size_t n, char **text, size_t *len)
{
    return decode_ids(tok, ids, n, 0, 1, text, len);
}

static tp_status decode_ids(const tp_tokenizer *tok, const int32_t *ids, size_t n, int skip_special_tokens, int raw,
                            char **text, size_t *len)
{
    toklist in = {0}, out = {0};
    tk_buf res = {0};
    tp_status st = tk_buf_put(&res, "", 0);
    for (size_t i = 0; i < n && st == TP_OK; i++) {
        size_t tl;
        const char *t = tp_tokenizer_id_to_token(tok, ids[i], &tl);
        if (!t || (skip_special_tokens && tp_tokenizer_is_special(tok, ids[i]))) continue;
        st = toklist_push(&in, t, tl);
    }
    if (st == TP_OK && tok->decoder) {
        st = decode_chain(tok->decoder, &in, &out, raw);
        for (size_t i = 0; i < out.n && st == TP_OK; i++) st = tk_buf_put(&res, out.v[i].s, out.v[i].len);
    } else {
        /* No decoder: HF joins the tokens with spaces. */
        for (size_t i = 0; i < in.n && st == TP_OK; i++) {
            if (i) st = tk_buf_put(&res, " ", 1);
            if (st == TP_OK) st = tk_buf_put(&res, in.v[i].s, in.v[i].len);
        }
    }
    toklist_free(&in);
    toklist_free(&out);
    if (st != TP_OK) {
        tk_buf_free(&res);
        return st;
    }
    *text = res.s;
    *len = res.len;
    return TP_OK;
}

// ----------------------------------------------------------------------------
// streaming

struct tp_detok_stream {
    const tp_tokenizer *tok;
    int skip;
    tp_ids win;    /* ids since the window start */
    tk_buf prefix; /* the part of decode(win) already handed out */
    tk_buf out;
    int byte_fallback;    /* the decoder regroups runs of <0xHH> tokens */
    int strip_stop;       /* a Strip decoder removes trailing characters */
    uint32_t strip_ch[8]; /* which ones */
};

static void scan_decoder(tp_detok_stream *ds, const tk_decoder *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->n_kids; i++) scan_decoder(ds, &d->kids[i]);
    if (d->type == TK_DEC_BYTEFALLBACK) ds->byte_fallback = 1;
    if (d->type == TK_DEC_STRIP && d->stop > 0 && ds->strip_stop < 8) ds->strip_ch[ds->strip_stop++] = d->ch;
}

tp_status tp_detok_stream_create(const tp_tokenizer *tok, int skip_special_tokens, tp_detok_stream **out)
{
    tp_detok_stream *ds = calloc(1, sizeof *ds);
    if (!ds) return tp_error(TP_ERR_OOM, "out of memory");
    ds->tok = tok;
    ds->skip = skip_special_tokens;
    scan_decoder(ds, tok->decoder);
    if (tk_buf_put(&ds->prefix, "", 0) != TP_OK || tk_buf_put(&ds->out, "", 0) != TP_OK) {
        tp_detok_stream_destroy(ds);
        return TP_ERR_OOM;
    }
    *out = ds;
    return TP_OK;
}

void tp_detok_stream_destroy(tp_detok_stream *ds)
{
    if (!ds) return;
    tp_ids_free(&ds->win);
    tk_buf_free(&ds->prefix);
    tk_buf_free(&ds->out);
    free(ds);
}

static int is_byte_id(const tp_detok_stream *ds, int32_t id)
{
    size_t n;
    const char *t = tp_tokenizer_id_to_token(ds->tok, id, &n);
    if (!t || (ds->skip && tp_tokenizer_is_special(ds->tok, id))) return 0;
    return byte_token(t, n) >= 0;
}

/* An id the decode drops (not a token, or a special token skipped): a run of <0xHH>
 * tokens goes on across it, as in the whole decode. */
static int is_dropped_id(const tp_detok_stream *ds, int32_t id)
{
    size_t n;
    return !tp_tokenizer_id_to_token(ds->tok, id, &n) || (ds->skip && tp_tokenizer_is_special(ds->tok, id));
}

/* Length of s without the characters a later token could still change: trailing U+FFFD
 * (an incomplete UTF-8 sequence so far) and trailing characters a Strip(stop) removes. */
static size_t stable_len(const tp_detok_stream *ds, const char *s, size_t n)
{
    for (;;) {
        if (n >= 3 && memcmp(s + n - 3, "\xEF\xBF\xBD", 3) == 0) {
            n -= 3;
            continue;
        }
        int cut = 0;
        for (int k = 0; k < ds->strip_stop && n > 0 && !cut; k++) {
            char c[4];
            size_t cl = (size_t)tp_utf8_put(ds->strip_ch[k], c);
            if (n >= cl && memcmp(s + n - cl, c, cl) == 0) {
                n -= cl;
                cut = 1;
            }
        }
        if (!cut) return n;
    }
}

static tp_status emit_from(tp_detok_stream *ds, const char *s, size_t n)
{
    /* A window decode that no longer extends what was handed out cannot be fixed;
     * hold it back and let finish() hand out the difference. */
    if (n <= ds->prefix.len || memcmp(s, ds->prefix.s, ds->prefix.len) != 0) return TP_OK;
    TP_CHECK(tk_buf_put(&ds->out, s + ds->prefix.len, n - ds->prefix.len));
    return tk_buf_put(&ds->prefix, s + ds->prefix.len, n - ds->prefix.len);
}

tp_status tp_detok_stream_push(tp_detok_stream *ds, int32_t id, const char **text, size_t *len)
{
    ds->out.len = 0;
    ds->out.s[0] = '\0';
    *text = ds->out.s;
    *len = 0;
    TP_CHECK(tp_ids_push(&ds->win, id));
    size_t m = ds->win.n;
    if (ds->byte_fallback) /* the run of byte tokens at the end may still grow: hold it back */
        while (m > 0 && (is_byte_id(ds, ds->win.v[m - 1]) || is_dropped_id(ds, ds->win.v[m - 1]))) m--;
    char *s;
    size_t n;
    TP_CHECK(tp_tokenizer_decode(ds->tok, ds->win.v, m, ds->skip, &s, &n));
    size_t keep = stable_len(ds, s, n);
    tp_status st = emit_from(ds, s, keep);
    int all_out = st == TP_OK && m == ds->win.n && keep == n && ds->prefix.len == n;
    free(s);
    TP_CHECK(st);
    /* Slide the window to the last id when everything is out and that id decodes to
     * something on its own, so every push costs O(1) tokens. */
    if (all_out && ds->win.n > 1 && !is_byte_id(ds, id)) {
        TP_CHECK(tp_tokenizer_decode(ds->tok, &id, 1, ds->skip, &s, &n));
        if (n > 0) {
            ds->win.v[0] = id;
            ds->win.n = 1;
            ds->prefix.len = 0;
            st = tk_buf_put(&ds->prefix, s, n);
        }
        free(s);
        TP_CHECK(st);
    }
    *text = ds->out.s;
    *len = ds->out.len;
    return TP_OK;
}

tp_status tp_detok_stream_finish(tp_detok_stream *ds, const char **text, size_t *len)
{
    ds->out.len = 0;
    ds->out.s[0] = '\0';
    char *s;
    size_t n;
    TP_CHECK(tp_tokenizer_decode(ds->tok, ds->win.v, ds->win.n, ds->skip, &s, &n));
    size_t from = ds->prefix.len <= n && memcmp(s, ds->prefix.s, ds->prefix.len) == 0 ? ds->prefix.len : n;
    tp_status st = tk_buf_put(&ds->out, s + from, n - from);
    free(s);
    TP_CHECK(st);
    ds->win.n = 0;
    ds->prefix.len = 0;
    *text = ds->out.s;
    *len = ds->out.len;
    return TP_OK;
}
