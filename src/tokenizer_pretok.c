/*
 * tokenizer_pretok.c: HF pre-tokenizers (Split, ByteLevel, Metaspace, Digits, Whitespace,
 * WhitespaceSplit, Sequence) and the patterns they and the normalizers match with.
 * Regexes are Oniguruma syntax in tokenizer.json; PCRE2 (UTF + UCP) runs them here, with
 * \s and \w rewritten to Oniguruma's definitions.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the others to
 * U+0100 + n in byte order. */
const char *const tk_byte_char[256] = {
    "\xC4\x80", "\xC4\x81", "\xC4\x82", "\xC4\x83", "\xC4\x84", "\xC4\x85", "\xC4\x86", "\xC4\x87",
    "\xC4\x88", "\xC4\x89", "\xC4\x8A", "\xC4\x8B", "\xC4\x8C", "\xC4\x8D", "\xC4\x8E", "\xC4\x8F",
    "\xC4\x90", "\xC4\x91", "\xC4\x92", "\xC4\x93", "\xC4\x94", "\xC4\x95", "\xC4\x96", "\xC4\x97",
    "\xC4\x98", "\xC4\x99", "\xC4\x9A", "\xC4\x9B", "\xC4\x9C", "\xC4\x9D", "\xC4\x9E", "\xC4\x9F",
    "\xC4\xA0", "!", "\"", "#", "$", "%", "&", "'", "(", ")", "*", "+", ",", "-", ".", "/",
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ":", ";", "<", "=", ">", "?",
    "@", "A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O",
    "P", "Q", "R", "S", "T", "U", "V", "W", "X", "Y", "Z", "[", "\\", "]", "^", "_",
    "`", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o",
    "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z", "{", "|", "}", "~", "\xC4\xA1",
    "\xC4\xA2", "\xC4\xA3", "\xC4\xA4", "\xC4\xA5", "\xC4\xA6", "\xC4\xA7", "\xC4\xA8", "\xC4\xA9",
    "\xC4\xAA", "\xC4\xAB", "\xC4\xAC", "\xC4\xAD", "\xC4\xAE", "\xC4\xAF", "\xC4\xB0", "\xC4\xB1",
    "\xC4\xB2", "\xC4\xB3", "\xC4\xB4", "\xC4\xB5", "\xC4\xB6", "\xC4\xB7", "\xC4\xB8", "\xC4\xB9",
    "\xC4\xBA", "\xC4\xBB", "\xC4\xBC", "\xC4\xBD", "\xC4\xBE", "\xC4\xBF", "\xC5\x80", "\xC5\x81",
    "\xC5\x82", "\xC2\xA1", "\xC2\xA2", "\xC2\xA3", "\xC2\xA4", "\xC2\xA5", "\xC2\xA6", "\xC2\xA7",
    "\xC2\xA8", "\xC2\xA9", "\xC2\xAA", "\xC2\xAB", "\xC2\xAC", "\xC5\x83", "\xC2\xAE", "\xC2\xAF",
    "\xC2\xB0", "\xC2\xB1", "\xC2\xB2", "\xC2\xB3", "\xC2\xB4", "\xC2\xB5", "\xC2\xB6", "\xC2\xB7",
    "\xC2\xB8", "\xC2\xB9", "\xC2\xBA", "\xC2\xBB", "\xC2\xBC", "\xC2\xBD", "\xC2\xBE", "\xC2\xBF",
    "\xC3\x80", "\xC3\x81", "\xC3\x82", "\xC3\x83", "\xC3\x84", "\xC3\x85", "\xC3\x86", "\xC3\x87",
    "\xC3\x88", "\xC3\x89", "\xC3\x8A", "\xC3\x8B", "\xC3\x8C", "\xC3\x8D", "\xC3\x8E", "\xC3\x8F",
    "\xC3\x90", "\xC3\x91", "\xC3\x92", "\xC3\x93", "\xC3\x94", "\xC3\x95", "\xC3\x96", "\xC3\x97",
    "\xC3\x98", "\xC3\x99", "\xC3\x9A", "\xC3\x9B", "\xC3\x9C", "\xC3\x9D", "\xC3\x9E", "\xC3\x9F",
    "\xC3\xA0", "\xC3\xA1", "\xC3\xA2", "\xC3\xA3", "\xC3\xA4", "\xC3\xA5", "\xC3\xA6", "\xC3\xA7",
    "\xC3\xA8", "\xC3\xA9", "\xC3\xAA", "\xC3\xAB", "\xC3\xAC", "\xC3\xAD", "\xC3\xAE", "\xC3\xAF",
    "\xC3\xB0", "\xC3\xB1", "\xC3\xB2", "\xC3\xB3", "\xC3\xB4", "\xC3\xB5", "\xC3\xB6", "\xC3\xB7",
    "\xC3\xB8", "\xC3\xB9", "\xC3\xBA", "\xC3\xBB", "\xC3\xBC", "\xC3\xBD", "\xC3\xBE", "\xC3\xBF",
};

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char WHITESPACE_REGEX[] = "\\w+|[^\\w\\s]+";

// ----------------------------------------------------------------------------
// patterns

/* Oniguruma's \s is [\t-\r\x85\p{Z}] and its \w is [\p{L}\p{M}\p{Nd}\p{Pc}]; PCRE2's UCP
 * versions differ (U+180E in \s; \p{N} and no marks in \w), so spell them out. */
static tp_status onig_to_pcre2(const char *re, char **out)
{
    static const char S_IN[] = "\\t-\\r\\x{85}\\p{Z}";
    static const char W_IN[] = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
    size_t n = strlen(re);
    char *buf = malloc(n * 24 + 1);
    if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
    size_t o = 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char e = re[i + 1];
            const char *in = e == 's' || e == 'S' ? S_IN : e == 'w' || e == 'W' ? W_IN : NULL;
            int neg = e == 'S' || e == 'W';
            if (in && !(in_class && neg)) {
                o += (size_t)sprintf(buf + o, in_class ? "%s" : neg ? "[^%s]" : "[%s]", in);
            } else {
                buf[o++] = c;
                buf[o++] = e;
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            buf[o++] = c;
            /* A ']' first in a class is a literal. */
            if (i + 1 < n && re[i + 1] == '^') buf[o++] = re[++i];
            if (i + 1 < n && re[i + 1] == ']') buf[o++] = re[++i];
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        buf[o++] = c;
    }
    buf[o] = '\0';
    *out = buf;
    return TP_OK;
}

tp_status tk_pattern_compile(tk_pattern *p, const char *regex, const char *what)
{
    char *conv;
    TP_CHECK(onig_to_pcre2(regex, &conv));
    int err;
    PCRE2_SIZE off;
    p->re = pcre2_compile((PCRE2_SPTR)conv, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    free(conv);
    if (!p->re) {
        char msg[256];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        return tp_error(TP_ERR_UNSUPPORTED, "tokenizer.json: %s regex \"%.200s\" is not supported: %s", what,
                        regex, msg);
    }
    (void)pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* interpreted if JIT is unavailable */
    p->md = pcre2_match_data_create_from_pattern(p->re, NULL);
    if (!p->md) return tp_error(TP_ERR_OOM, "out of memory");
    return TP_OK;
}

tp_status tk_pattern_parse(tk_pattern *p, json_t *j, const char *what)
{
    memset(p, 0, sizeof *p);
    json_t *s = json_object_get(j, "String"), *r = json_object_get(j, "Regex");
    if (!json_is_object(j) || (!s == !r) || json_object_size(j) != 1)
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: %s pattern must be {\"String\": ...} or {\"Regex\": ...}",
                        what);
    if (s) {
        if (!json_is_string(s)) return tp_error(TP_ERR_FORMAT, "tokenizer.json: %s pattern String must be a string", what);
        p->literal_len = json_string_length(s);
        p->literal = malloc(p->literal_len + 1);
        if (!p->literal) return tp_error(TP_ERR_OOM, "out of memory");
        memcpy(p->literal, json_string_value(s), p->literal_len + 1);
        return TP_OK;
    }
    if (!json_is_string(r)) return tp_error(TP_ERR_FORMAT, "tokenizer.json: %s pattern Regex must be a string", what);
    if (strlen(json_string_value(r)) != json_string_length(r))
        return tp_error(TP_ERR_UNSUPPORTED, "tokenizer.json: %s regex contains a NUL character", what);
    return tk_pattern_compile(p, json_string_value(r), what);
}

void tk_pattern_free(tk_pattern *p)
{
    if (!p) return;
    free(p->literal);
    if (p->md) pcre2_match_data_free(p->md);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

int tk_pattern_find(const tk_pattern *p, const char *s, size_t n, size_t pos, size_t *ms, size_t *me)
{
    if (p->literal) {
        if (p->literal_len == 0 || pos > n) return 0;
        const char *f = memmem(s + pos, n - pos, p->literal, p->literal_len);
        if (!f) return 0;
        *ms = (size_t)(f - s);
        *me = *ms + p->literal_len;
        return 1;
    }
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, p->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

// ----------------------------------------------------------------------------
// pieces and splitting

tp_status tk_pieces_push(tk_pieces *p, const char *s, size_t len, int32_t id, int at_start)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        tk_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return tp_error(TP_ERR_OOM, "out of memory");
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (tk_piece){s, len, id, (uint8_t)at_start};
    return TP_OK;
}

void tk_pieces_free(tk_pieces *p)
{
    free(p->v);
    memset(p, 0, sizeof *p);
}

typedef struct span {
    size_t a, b;
    int match;
} span;

typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

static tp_status spans_push(spans *s, size_t a, size_t b, int match)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return tp_error(TP_ERR_OOM, "out of memory");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (span){a, b, match};
    return TP_OK;
}

/* HF's Pattern::find_matches: the whole text as (offsets, is_match) spans; an empty match
 * right after a match is skipped (the onig crate's find_iter). */
static tp_status find_matches(const tk_pattern *pat, const char *s, size_t n, spans *out)
{
    out->n = 0;
    if (n == 0) return spans_push(out, 0, 0, 0);
    size_t prev = 0, pos = 0, last_match_end = (size_t)-1;
    while (pos <= n) {
        size_t ms, me;
        int r = tk_pattern_find(pat, s, n, pos, &ms, &me);
        if (r < 0) return tp_error(TP_ERR_INTERNAL, "regex match failed (resource limit?)");
        if (r == 0) break;
        if (ms == me && me == last_match_end) {
            if (pos >= n) break;
            pos += (size_t)tp_utf8_len((uint8_t)s[pos]);
            continue;
        }
        if (prev != ms) TP_CHECK(spans_push(out, prev, ms, 0));
        TP_CHECK(spans_push(out, ms, me, 1));
        prev = me;
        last_match_end = me;
        if (me == ms) {
            if (me >= n) break;
            pos = me + (size_t)tp_utf8_len((uint8_t)s[me]);
        } else {
            pos = me;
        }
    }
    if (prev != n) TP_CHECK(spans_push(out, prev, n, 0));
    return TP_OK;
}

tp_status tk_pattern_replace(const tk_pattern *pat, const char *s, size_t n, const char *with, size_t with_len,
                             tk_buf *out)
{
    spans m = {0};
    tp_status st;
    out->len = 0;
    TP_CHECK_GOTO(find_matches(pat, s, n, &m), st, done);
    for (size_t i = 0; i < m.n; i++) {
        if (m.v[i].match) TP_CHECK_GOTO(tk_buf_put(out, with, with_len), st, done);
        else TP_CHECK_GOTO(tk_buf_put(out, s + m.v[i].a, m.v[i].b - m.v[i].a), st, done);
    }
    st = tk_buf_put(out, "", 0);
done:
    free(m.v);
    return st;
}

/* char-predicate patterns (Digits, WhitespaceSplit): each matching char is a match, the
 * runs between are non-matches. */
static tp_status find_char_matches(int (*pred)(uint32_t), const char *s, size_t n, spans *out)
{
    out->n = 0;
    if (n == 0) return spans_push(out, 0, 0, 0);
    size_t last = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tp_utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k < 0) k = 1, cp = 0xFFFD;
        if (pred(cp)) {
            if (last < i) TP_CHECK(spans_push(out, last, i, 0));
            TP_CHECK(spans_push(out, i, i + (size_t)k, 1));
            last = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (n > last) TP_CHECK(spans_push(out, last, n, 0));
    return TP_OK;
}

/* NormalizedString::split: apply the delimiter behavior and emit the non-empty pieces. */
static tp_status split_one(const tk_piece *pc, spans *m, int invert, enum tk_split_behavior behavior,
                           tk_pieces *out)
{
    if (invert)
        for (size_t i = 0; i < m->n; i++) m->v[i].match = !m->v[i].match;
    size_t k = 0; /* spans merged in place: m->v[0..k) */
    int prev_match = 0;
    for (size_t i = 0; i < m->n; i++) {
        span sp = m->v[i];
        if (behavior == TK_SPLIT_REMOVED || behavior == TK_SPLIT_ISOLATED || behavior == TK_SPLIT_MERGED_NEXT) {
            m->v[k++] = sp;
            continue;
        }
        int merge = behavior == TK_SPLIT_CONTIGUOUS ? sp.match == prev_match : sp.match && !prev_match;
        if (merge && k > 0) m->v[k - 1].b = sp.b;
        else m->v[k++] = (span){sp.a, sp.b, 0};
        prev_match = sp.match;
    }
    if (behavior == TK_SPLIT_MERGED_NEXT) {
        /* Fold from the right: a match joins the piece after it. */
        size_t w = k;
        prev_match = 0;
        for (size_t i = k; i-- > 0;) {
            span sp = m->v[i];
            if (sp.match && !prev_match && w < k) m->v[w].a = sp.a;
            else m->v[--w] = (span){sp.a, sp.b, 0};
            prev_match = sp.match;
        }
        memmove(m->v, m->v + w, (k - w) * sizeof *m->v);
        k -= w;
    }
    for (size_t i = 0; i < k; i++) {
        span sp = m->v[i];
        if (behavior == TK_SPLIT_REMOVED && sp.match) continue;
        if (sp.b > sp.a) TP_CHECK(tk_pieces_push(out, pc->s + sp.a, sp.b - sp.a, -1, pc->at_start && sp.a == 0));
    }
    return TP_OK;
}

/* What splits a piece: a regex pattern, or a character class. */
typedef struct splitter {
    const tk_pattern *pat;   /* or NULL: */
    int (*pred)(uint32_t);
} splitter;

/* Split every piece that is not an added token where sp matches, per behavior. */
static tp_status split_pieces_by(splitter sp, int invert, enum tk_split_behavior behavior, tk_pieces *pieces)
{
    tk_pieces out = {0};
    spans m = {0};
    tp_status st = TP_OK;
    for (size_t i = 0; i < pieces->n; i++) {
        const tk_piece *pc = &pieces->v[i];
        if (pc->id >= 0) {
            TP_CHECK_GOTO(tk_pieces_push(&out, pc->s, pc->len, pc->id, pc->at_start), st, fail);
            continue;
        }
        if (sp.pat) TP_CHECK_GOTO(find_matches(sp.pat, pc->s, pc->len, &m), st, fail);
        else TP_CHECK_GOTO(find_char_matches(sp.pred, pc->s, pc->len, &m), st, fail);
        TP_CHECK_GOTO(split_one(pc, &m, invert, behavior, &out), st, fail);
    }
    free(m.v);
    tk_pieces_free(pieces);
    *pieces = out;
    return TP_OK;
fail:
    free(m.v);
    tk_pieces_free(&out);
    return st;
}

tp_status tk_split_pieces(const tk_pattern *pat, int invert, enum tk_split_behavior behavior, tk_pieces *pieces)
{
    splitter sp = {pat, NULL};
    return split_pieces_by(sp, invert, behavior, pieces);
}

static tp_status split_char_pieces(int (*pred)(uint32_t), enum tk_split_behavior behavior, tk_pieces *pieces)
{
    splitter sp = {NULL, pred};
    return split_pieces_by(sp, 0, behavior, pieces);
}

// ----------------------------------------------------------------------------
// ByteLevel and Metaspace

static tp_status prefix_space(tk_pieces *pieces, tk_pool *pool, const char *pre, size_t pre_len,
                              int (*want)(const tk_piece *, const char *, size_t))
{
    for (size_t i = 0; i < pieces->n; i++) {
        tk_piece *pc = &pieces->v[i];
        if (pc->id >= 0 || !want(pc, pre, pre_len)) continue;
        char *buf = malloc(pc->len + pre_len + 1);
        if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
        memcpy(buf, pre, pre_len);
        memcpy(buf + pre_len, pc->s, pc->len);
        TP_CHECK(tk_pool_add(pool, buf));
        pc->s = buf;
        pc->len += pre_len;
    }
    return TP_OK;
}

static int want_prefix_always(const tk_piece *pc, const char *pre, size_t n)
{
    return pc->len < n || memcmp(pc->s, pre, n) != 0;
}

static int want_prefix_first(const tk_piece *pc, const char *pre, size_t n)
{
    return pc->at_start && want_prefix_always(pc, pre, n);
}

/* Map every byte of the text pieces to its bytes_to_unicode character. */
static tp_status byte_map(tk_pieces *pieces, tk_pool *pool)
{
    size_t total = 0;
    for (size_t i = 0; i < pieces->n; i++)
        if (pieces->v[i].id < 0) total += pieces->v[i].len * 2;
    if (total == 0) return TP_OK;
    char *buf = malloc(total);
    if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
    TP_CHECK(tk_pool_add(pool, buf));
    size_t o = 0;
    for (size_t i = 0; i < pieces->n; i++) {
        tk_piece *pc = &pieces->v[i];
        if (pc->id >= 0) continue;
        char *start = buf + o;
        for (size_t k = 0; k < pc->len; k++) {
            const char *c = tk_byte_char[(uint8_t)pc->s[k]];
            buf[o++] = c[0];
            if (c[1]) buf[o++] = c[1];
        }
        pc->s = start;
        pc->len = (size_t)(buf + o - start);
    }
    return TP_OK;
}

static tp_status metaspace(const tk_pretok *p, tk_pieces *pieces, tk_pool *pool)
{
    for (size_t i = 0; i < pieces->n; i++) {
        tk_piece *pc = &pieces->v[i];
        if (pc->id >= 0) continue;
        size_t spaces = 0;
        for (size_t k = 0; k < pc->len; k++) spaces += pc->s[k] == ' ';
        if (!spaces) continue;
        char *buf = malloc(pc->len + spaces * p->repl_len + 1);
        if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
        TP_CHECK(tk_pool_add(pool, buf));
        size_t o = 0;
        for (size_t k = 0; k < pc->len; k++) {
            if (pc->s[k] == ' ') {
                memcpy(buf + o, p->repl, p->repl_len);
                o += p->repl_len;
            } else {
                buf[o++] = pc->s[k];
            }
        }
        pc->s = buf;
        pc->len = o;
    }
    if (p->prepend == TK_PREPEND_ALWAYS)
        TP_CHECK(prefix_space(pieces, pool, p->repl, p->repl_len, want_prefix_always));
    else if (p->prepend == TK_PREPEND_FIRST)
        TP_CHECK(prefix_space(pieces, pool, p->repl, p->repl_len, want_prefix_first));
    if (p->split) {
        tk_pattern lit = {.literal = (char *)p->repl, .literal_len = p->repl_len};
        TP_CHECK(tk_split_pieces(&lit, 0, TK_SPLIT_MERGED_NEXT, pieces));
    }
    return TP_OK;
}

tp_status tk_pretokenize(const tk_pretok *p, tk_pieces *pieces, tk_pool *pool)
{
    switch (p->type) {
    case TK_PRE_SEQUENCE:
        for (size_t i = 0; i < p->n_kids; i++) TP_CHECK(tk_pretokenize(&p->kids[i], pieces, pool));
        return TP_OK;
    case TK_PRE_SPLIT:
        return tk_split_pieces(&p->pat, p->invert, p->behavior, pieces);
    case TK_PRE_BYTELEVEL:
        if (p->add_prefix_space) TP_CHECK(prefix_space(pieces, pool, " ", 1, want_prefix_always));
        if (p->use_regex) TP_CHECK(tk_split_pieces(&p->pat, 0, TK_SPLIT_ISOLATED, pieces));
        return byte_map(pieces, pool);
    case TK_PRE_METASPACE:
        return metaspace(p, pieces, pool);
    case TK_PRE_DIGITS:
        return split_char_pieces(tp_uc_is_numeric, p->individual_digits ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS,
                                 pieces);
    case TK_PRE_WHITESPACE:
        return tk_split_pieces(&p->pat, 1, TK_SPLIT_REMOVED, pieces);
    case TK_PRE_WHITESPACE_SPLIT:
        return split_char_pieces(tp_uc_is_whitespace, TK_SPLIT_REMOVED, pieces);
    }
    return tp_error(TP_ERR_INTERNAL, "unknown pre-tokenizer");
}

// ----------------------------------------------------------------------------
// parsing

static tp_status parse_behavior(json_t *j, enum tk_split_behavior *out)
{
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                        "Contiguous"};
    const char *s = json_string_value(j);
    for (int i = 0; s && i < 5; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (enum tk_split_behavior)i;
            return TP_OK;
        }
    return tp_error(TP_ERR_UNSUPPORTED, "tokenizer.json: Split behavior %s is not one of Removed, Isolated, "
                    "MergedWithPrevious, MergedWithNext, Contiguous", s ? s : tk_json_type(j));
}

tp_status tk_parse_prepend_scheme(json_t *obj, enum tk_prepend_scheme *out, const char *what)
{
    json_t *ps = json_object_get(obj, "prepend_scheme");
    if (!ps) {
        /* Older files: add_prefix_space true/false meant always/never. */
        int aps;
        TP_CHECK(tk_get_bool(obj, "add_prefix_space", 1, &aps, what));
        *out = aps ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
        return TP_OK;
    }
    const char *s = json_string_value(ps);
    if (s && strcmp(s, "always") == 0) *out = TK_PREPEND_ALWAYS;
    else if (s && strcmp(s, "first") == 0) *out = TK_PREPEND_FIRST;
    else if (s && strcmp(s, "never") == 0) *out = TK_PREPEND_NEVER;
    else return tp_error(TP_ERR_UNSUPPORTED, "tokenizer.json: %s prepend_scheme must be always, first or never", what);
    return TP_OK;
}

tp_status tk_parse_replacement(json_t *obj, uint32_t *cp, const char *what)
{
    const char *s;
    size_t n;
    TP_CHECK(tk_get_string(obj, "replacement", &s, &n, what));
    int k = n ? tp_utf8_next((const uint8_t *)s, n, cp) : -1;
    if (k < 0 || (size_t)k != n)
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: %s replacement must be exactly one character", what);
    return TP_OK;
}

tp_status tk_pretok_parse(tk_pretok *p, json_t *j)
{
    memset(p, 0, sizeof *p);
    if (!json_is_object(j))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: a pre_tokenizer must be an object, not %s", tk_json_type(j));
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return tp_error(TP_ERR_FORMAT, "tokenizer.json: a pre_tokenizer has no \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        static const char *const known[] = {"type", "pretokenizers", NULL};
        TP_CHECK(tk_check_keys(j, known, "pre_tokenizer Sequence"));
        json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a))
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: pre_tokenizer Sequence needs a \"pretokenizers\" array");
        p->type = TK_PRE_SEQUENCE;
        p->kids = calloc(json_array_size(a) + 1, sizeof *p->kids);
        if (!p->kids) return tp_error(TP_ERR_OOM, "out of memory");
        for (size_t i = 0; i < json_array_size(a); i++) {
            p->n_kids++;
            TP_CHECK(tk_pretok_parse(&p->kids[i], json_array_get(a, i)));
        }
        return TP_OK;
    }
    if (strcmp(type, "Split") == 0) {
        static const char *const known[] = {"type", "pattern", "behavior", "invert", NULL};
        TP_CHECK(tk_check_keys(j, known, "pre_tokenizer Split"));
        p->type = TK_PRE_SPLIT;
        TP_CHECK(tk_get_bool(j, "invert", 0, &p->invert, "pre_tokenizer Split"));
        TP_CHECK(parse_behavior(json_object_get(j, "behavior"), &p->behavior));
        return tk_pattern_parse(&p->pat, json_object_get(j, "pattern"), "pre_tokenizer Split");
    }
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const known[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        TP_CHECK(tk_check_keys(j, known, "pre_tokenizer ByteLevel"));
        p->type = TK_PRE_BYTELEVEL;
        TP_CHECK(tk_get_bool(j, "add_prefix_space", 1, &p->add_prefix_space, "pre_tokenizer ByteLevel"));
        TP_CHECK(tk_get_bool(j, "use_regex", 1, &p->use_regex, "pre_tokenizer ByteLevel"));
        return p->use_regex ? tk_pattern_compile(&p->pat, GPT2_REGEX, "ByteLevel") : TP_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        static const char *const known[] = {"type", "replacement", "prepend_scheme", "split", "add_prefix_space",
                                            "str_rep", NULL};
        TP_CHECK(tk_check_keys(j, known, "pre_tokenizer Metaspace"));
        p->type = TK_PRE_METASPACE;
        uint32_t cp;
        TP_CHECK(tk_parse_replacement(j, &cp, "pre_tokenizer Metaspace"));
        p->repl_len = (size_t)tp_utf8_put(cp, p->repl);
        TP_CHECK(tk_parse_prepend_scheme(j, &p->prepend, "pre_tokenizer Metaspace"));
        return tk_get_bool(j, "split", 1, &p->split, "pre_tokenizer Metaspace");
    }
    if (strcmp(type, "Digits") == 0) {
        static const char *const known[] = {"type", "individual_digits", NULL};
        TP_CHECK(tk_check_keys(j, known, "pre_tokenizer Digits"));
        p->type = TK_PRE_DIGITS;
        return tk_get_bool(j, "individual_digits", 0, &p->individual_digits, "pre_tokenizer Digits");
    }
    if (strcmp(type, "Whitespace") == 0) {
        static const char *const known[] = {"type", NULL};
        TP_CHECK(tk_check_keys(j, known, "pre_tokenizer Whitespace"));
        p->type = TK_PRE_WHITESPACE;
        return tk_pattern_compile(&p->pat, WHITESPACE_REGEX, "Whitespace");
    }
    if (strcmp(type, "WhitespaceSplit") == 0) {
        static const char *const known[] = {"type", NULL};
        TP_CHECK(tk_check_keys(j, known, "pre_tokenizer WhitespaceSplit"));
        p->type = TK_PRE_WHITESPACE_SPLIT;
        return TP_OK;
    }
    return tp_error(TP_ERR_UNSUPPORTED,
                    "tokenizer.json: pre_tokenizer type \"%.64s\" is not supported (supported: Sequence, Split, "
                    "ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit)",
                    type);
}

void tk_pretok_free(tk_pretok *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n_kids; i++) tk_pretok_free(&p->kids[i]);
    free(p->kids);
    tk_pattern_free(&p->pat);
    memset(p, 0, sizeof *p);
}
