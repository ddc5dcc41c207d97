/*
 * tokenizer.c: loading tokenizer.json / tokenizer_config.json and the encode pipeline of
 * HF tokenizers: added tokens (raw, then normalized) -> normalizer -> pre-tokenizer ->
 * BPE -> post-processor. Each piece of that lives in tokenizer_*.c.
 */
#include "tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer_internal.h"
#include "unicode.h"
#include "util.h"

#define MAX_TOKENIZER_JSON ((size_t)1 << 30)
#define MAX_CONFIG_JSON ((size_t)64 << 20)

// ----------------------------------------------------------------------------
// small containers and JSON helpers

tp_status tp_ids_push(tp_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return tp_error(TP_ERR_OOM, "out of memory for %zu token ids", cap);
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return TP_OK;
}

void tp_ids_free(tp_ids *ids)
{
    if (!ids) return;
    free(ids->v);
    memset(ids, 0, sizeof *ids);
}

tp_status tk_pool_add(tk_pool *pool, char *buf)
{
    if (pool->n == pool->cap) {
        size_t cap = pool->cap ? pool->cap * 2 : 16;
        char **b = realloc(pool->bufs, cap * sizeof *b);
        if (!b) {
            free(buf);
            return tp_error(TP_ERR_OOM, "out of memory");
        }
        pool->bufs = b;
        pool->cap = cap;
    }
    pool->bufs[pool->n++] = buf;
    return TP_OK;
}

void tk_pool_free(tk_pool *pool)
{
    for (size_t i = 0; i < pool->n; i++) free(pool->bufs[i]);
    free(pool->bufs);
    memset(pool, 0, sizeof *pool);
}

tp_status tk_buf_put(tk_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) return tp_error(TP_ERR_OOM, "out of memory");
        b->s = p;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
    return TP_OK;
}

void tk_buf_free(tk_buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

const char *tk_json_type(json_t *j)
{
    if (!j) return "missing";
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

tp_status tk_get_bool(json_t *obj, const char *key, int dflt, int *out, const char *what)
{
    json_t *j = json_object_get(obj, key);
    if (!j || json_is_null(j)) {
        *out = dflt;
        return TP_OK;
    }
    if (!json_is_boolean(j))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: %s \"%s\" must be true or false, not %s", what, key,
                        tk_json_type(j));
    *out = json_is_true(j);
    return TP_OK;
}

tp_status tk_get_string(json_t *obj, const char *key, const char **out, size_t *len, const char *what)
{
    json_t *j = json_object_get(obj, key);
    if (!json_is_string(j))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: %s \"%s\" must be a string, not %s", what, key,
                        tk_json_type(j));
    *out = json_string_value(j);
    *len = json_string_length(j);
    return TP_OK;
}

tp_status tk_check_keys(json_t *obj, const char *const *known, const char *what)
{
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        int ok = 0;
        for (size_t i = 0; known[i] && !ok; i++) ok = strcmp(key, known[i]) == 0;
        if (!ok)
            return tp_error(TP_ERR_UNSUPPORTED,
                            "tokenizer.json: %s has a field \"%.64s\" that tpinfer does not know; refusing to "
                            "guess what it changes",
                            what, key);
    }
    return TP_OK;
}

// ----------------------------------------------------------------------------
// post-processors

static void post_free(tk_post *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n_kids; i++) post_free(&p->kids[i]);
    free(p->kids);
    free(p->before);
    free(p->after);
    memset(p, 0, sizeof *p);
}

static tp_status ids_append(int32_t **v, size_t *n, int32_t id)
{
    int32_t *nv = realloc(*v, (*n + 1) * sizeof *nv);
    if (!nv) return tp_error(TP_ERR_OOM, "out of memory");
    nv[(*n)++] = id;
    *v = nv;
    return TP_OK;
}

static tp_status template_parse(tk_post *p, json_t *j)
{
    json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
    if (!json_is_array(single) || (specials && !json_is_object(specials)))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: TemplateProcessing needs a \"single\" array and a "
                        "\"special_tokens\" object");
    int seen_seq = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *it = json_array_get(single, i);
        json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
        if (sq) {
            const char *id = json_string_value(json_object_get(sq, "id"));
            if (!id || strcmp(id, "A") != 0 || seen_seq)
                return tp_error(TP_ERR_UNSUPPORTED, "tokenizer.json: TemplateProcessing \"single\" must hold "
                                "sequence A exactly once");
            seen_seq = 1;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        if (!name)
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: TemplateProcessing item %zu is neither SpecialToken "
                            "nor Sequence", i);
        json_t *ids = json_object_get(json_object_get(specials, name), "ids");
        if (!json_is_array(ids))
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: TemplateProcessing special token \"%.64s\" is not in "
                            "special_tokens", name);
        for (size_t k = 0; k < json_array_size(ids); k++) {
            json_t *v = json_array_get(ids, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
                return tp_error(TP_ERR_FORMAT, "tokenizer.json: TemplateProcessing special token \"%.64s\" has "
                                "a bad id", name);
            int32_t id = (int32_t)json_integer_value(v);
            TP_CHECK(seen_seq ? ids_append(&p->after, &p->n_after, id) : ids_append(&p->before, &p->n_before, id));
        }
    }
    if (!seen_seq)
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: TemplateProcessing \"single\" has no Sequence A");
    return TP_OK;
}

/* BertProcessing / RobertaProcessing: "cls": [token, id], "sep": [token, id]. */
static tp_status cls_sep_parse(tk_post *p, json_t *j, const char *what)
{
    json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
    json_t *ci = json_array_get(cls, 1), *si = json_array_get(sep, 1);
    if (!json_is_integer(ci) || !json_is_integer(si) || json_integer_value(ci) < 0 || json_integer_value(si) < 0 ||
        json_integer_value(ci) > INT32_MAX || json_integer_value(si) > INT32_MAX)
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: %s needs \"cls\" and \"sep\" as [token, id]", what);
    p->type = TK_POST_TEMPLATE;
    TP_CHECK(ids_append(&p->before, &p->n_before, (int32_t)json_integer_value(ci)));
    return ids_append(&p->after, &p->n_after, (int32_t)json_integer_value(si));
}

static tp_status post_parse(tk_post *p, json_t *j)
{
    memset(p, 0, sizeof *p);
    if (!json_is_object(j))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: a post_processor must be an object, not %s", tk_json_type(j));
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return tp_error(TP_ERR_FORMAT, "tokenizer.json: a post_processor has no \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        json_t *a = json_object_get(j, "processors");
        if (!json_is_array(a))
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: post_processor Sequence needs a \"processors\" array");
        p->type = TK_POST_SEQUENCE;
        p->kids = calloc(json_array_size(a) + 1, sizeof *p->kids);
        if (!p->kids) return tp_error(TP_ERR_OOM, "out of memory");
        for (size_t i = 0; i < json_array_size(a); i++) {
            p->n_kids++;
            TP_CHECK(post_parse(&p->kids[i], json_array_get(a, i)));
        }
        return TP_OK;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        static const char *const known[] = {"type", "single", "pair", "special_tokens", NULL};
        TP_CHECK(tk_check_keys(j, known, "post_processor TemplateProcessing"));
        p->type = TK_POST_TEMPLATE;
        return template_parse(p, j);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        /* Only moves offsets; ids are untouched. */
        static const char *const known[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        p->type = TK_POST_BYTELEVEL;
        return tk_check_keys(j, known, "post_processor ByteLevel");
    }
    if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) {
        static const char *const known[] = {"type", "cls", "sep", "trim_offsets", "add_prefix_space", NULL};
        TP_CHECK(tk_check_keys(j, known, "post_processor"));
        return cls_sep_parse(p, j, type);
    }
    return tp_error(TP_ERR_UNSUPPORTED,
                    "tokenizer.json: post_processor type \"%.64s\" is not supported (supported: Sequence, "
                    "TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing)",
                    type);
}

static tp_status post_check_ids(const tk_post *p, const tp_tokenizer *tok)
{
    for (size_t i = 0; i < p->n_kids; i++) TP_CHECK(post_check_ids(&p->kids[i], tok));
    for (size_t i = 0; i < p->n_before + p->n_after; i++) {
        int32_t id = i < p->n_before ? p->before[i] : p->after[i - p->n_before];
        if (!tp_tokenizer_id_to_token(tok, id, NULL))
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: post_processor adds id %d, which is not a token", id);
    }
    return TP_OK;
}

static tp_status post_apply(const tk_post *p, tp_ids *ids)
{
    if (p->type == TK_POST_SEQUENCE) {
        for (size_t i = 0; i < p->n_kids; i++) TP_CHECK(post_apply(&p->kids[i], ids));
        return TP_OK;
    }
    if (p->type != TK_POST_TEMPLATE || (p->n_before == 0 && p->n_after == 0)) return TP_OK;
    for (size_t i = 0; i < p->n_before + p->n_after; i++) TP_CHECK(tp_ids_push(ids, 0)); /* make room */
    memmove(ids->v + p->n_before, ids->v, (ids->n - p->n_before - p->n_after) * sizeof *ids->v);
    if (p->n_before) memcpy(ids->v, p->before, p->n_before * sizeof *ids->v);
    if (p->n_after) memcpy(ids->v + ids->n - p->n_after, p->after, p->n_after * sizeof *ids->v);
    return TP_OK;
}

// ----------------------------------------------------------------------------
// added tokens

static tp_status added_parse(tp_tokenizer *tok, json_t *arr)
{
    if (!arr || json_is_null(arr)) return TP_OK;
    if (!json_is_array(arr))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: \"added_tokens\" must be an array, not %s", tk_json_type(arr));
    tok->added = calloc(json_array_size(arr) + 1, sizeof *tok->added);
    if (!tok->added) return tp_error(TP_ERR_OOM, "out of memory");
    /* HF ignores the ids in the file and assigns them: the model's id if the content is in
     * the vocabulary, else the next id after the vocabulary. A file whose ids disagree would
     * encode differently here and there, so it is rejected. */
    int64_t next_id = (int64_t)tok->bpe.vocab.count, max_added = -1;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        static const char *const known[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized",
                                            "special", NULL};
        json_t *j = json_array_get(arr, i);
        if (!json_is_object(j))
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] must be an object", i);
        TP_CHECK(tk_check_keys(j, known, "added token"));
        json_t *jid = json_object_get(j, "id");
        const char *content;
        size_t len;
        TP_CHECK(tk_get_string(j, "content", &content, &len, "added token"));
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= (1 << 24))
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: added token \"%.64s\" has no valid \"id\"", content);
        if (len == 0) return tp_error(TP_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] has an empty content", i);
        int64_t id = json_integer_value(jid);
        int lstrip, rstrip, normalized, special, single_word;
        TP_CHECK(tk_get_bool(j, "lstrip", 0, &lstrip, "added token"));
        TP_CHECK(tk_get_bool(j, "rstrip", 0, &rstrip, "added token"));
        TP_CHECK(tk_get_bool(j, "special", 0, &special, "added token"));
        TP_CHECK(tk_get_bool(j, "normalized", !special, &normalized, "added token"));
        TP_CHECK(tk_get_bool(j, "single_word", 0, &single_word, "added token"));
        int dup = 0;
        for (size_t k = 0; k < tok->n_added; k++) {
            if (tok->added[k].len != len || memcmp(tok->added[k].content, content, len) != 0) continue;
            if (tok->added[k].id != id)
                return tp_error(TP_ERR_FORMAT, "tokenizer.json: added token \"%.64s\" appears with ids %d and %lld",
                                content, tok->added[k].id, (long long)id);
            dup = 1;
        }
        if (dup) continue;
        int64_t expect = tk_vocab_get(&tok->bpe.vocab, content, len);
        if (expect < 0) {
            expect = max_added >= next_id ? max_added + 1 : next_id;
        }
        if (expect != id)
            return tp_error(TP_ERR_FORMAT,
                            "tokenizer.json: added token \"%.64s\" has id %lld, but Hugging Face tokenizers would give "
                            "it id %lld (the vocabulary has %zu tokens); the file is inconsistent",
                            content, (long long)id, (long long)expect, tok->bpe.vocab.count);
        if (tk_vocab_get(&tok->bpe.vocab, content, len) < 0 && id > max_added) max_added = id;
        tk_added *a = &tok->added[tok->n_added];
        a->content = malloc(len + 1);
        if (!a->content) return tp_error(TP_ERR_OOM, "out of memory");
        memcpy(a->content, content, len + 1);
        a->len = len;
        a->id = (int32_t)id;
        a->special = (uint8_t)special;
        a->lstrip = (uint8_t)lstrip;
        a->rstrip = (uint8_t)rstrip;
        a->normalized = (uint8_t)normalized;
        a->single_word = (uint8_t)single_word;
        tok->n_added++;
    }
    return TP_OK;
}

/* Contents of normalized added tokens go through the normalizer once, as HF does when it
 * builds its second matcher. */
static tp_status added_normalize(tp_tokenizer *tok)
{
    for (size_t i = 0; i < tok->n_added; i++) {
        tk_added *a = &tok->added[i];
        if (!a->normalized) continue;
        const char *s = a->content;
        size_t n = a->len;
        tk_pool pool = {0};
        tp_status st = TP_OK;
        if (tok->normalizer) st = tk_normalize(tok->normalizer, a->content, a->len, &pool, &s, &n);
        if (st == TP_OK) {
            a->norm = malloc(n + 1);
            if (!a->norm) st = tp_error(TP_ERR_OOM, "out of memory");
            else {
                memcpy(a->norm, s, n);
                a->norm[n] = '\0';
                a->norm_len = n;
            }
        }
        tk_pool_free(&pool);
        TP_CHECK(st);
    }
    return TP_OK;
}

static int ends_with_word(const char *s, size_t n)
{
    if (n == 0) return 0;
    size_t st = n - 1;
    while (st > 0 && ((uint8_t)s[st] & 0xC0) == 0x80) st--;
    uint32_t cp;
    return tp_utf8_next((const uint8_t *)s + st, n - st, &cp) > 0 && tp_uc_is_word(cp);
}

static int starts_with_word(const char *s, size_t n)
{
    uint32_t cp;
    return n > 0 && tp_utf8_next((const uint8_t *)s, n, &cp) > 0 && tp_uc_is_word(cp);
}

static size_t trailing_ws(const char *s, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((uint8_t)s[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        if (tp_utf8_next((const uint8_t *)s + st, end - st, &cp) <= 0 || !tp_uc_is_whitespace(cp)) break;
        end = st;
    }
    return n - end;
}

static size_t leading_ws(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tp_utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0 || !tp_uc_is_whitespace(cp)) break;
        i += (size_t)k;
    }
    return i;
}

/* The longest added token of the given kind (normalized or not) starting at s[i]. */
static const tk_added *added_match_at(const tp_tokenizer *tok, int normalized, const char *s, size_t n, size_t i)
{
    const tk_added *best = NULL;
    size_t best_len = 0;
    for (size_t k = 0; k < tok->n_added; k++) {
        const tk_added *a = &tok->added[k];
        if (a->normalized != normalized) continue;
        const char *c = normalized ? a->norm : a->content;
        size_t cl = normalized ? a->norm_len : a->len;
        if (cl == 0 || cl <= best_len || cl > n - i || c[0] != s[i] || memcmp(c, s + i, cl) != 0) continue;
        best = a;
        best_len = cl;
    }
    return best;
}

/* AddedVocabulary::find_matches on one text piece: leftmost-longest matches, then
 * single_word / lstrip / rstrip; gaps become text pieces. */
static tp_status split_added(const tp_tokenizer *tok, int normalized, const tk_piece *pc, tk_pieces *out)
{
    const char *s = pc->s;
    size_t n = pc->len, start_offset = 0, i = 0;
    uint8_t any[256] = {0};
    int have = 0;
    for (size_t k = 0; k < tok->n_added; k++) {
        const tk_added *a = &tok->added[k];
        if (a->normalized != normalized) continue;
        size_t cl = normalized ? a->norm_len : a->len;
        if (cl) any[(uint8_t)(normalized ? a->norm : a->content)[0]] = have = 1;
    }
    while (have && i < n) {
        const tk_added *a = any[(uint8_t)s[i]] ? added_match_at(tok, normalized, s, n, i) : NULL;
        if (!a) {
            i++;
            continue;
        }
        size_t start = i, stop = i + (normalized ? a->norm_len : a->len);
        i = stop;
        if (a->single_word) {
            int start_space = start == 0 || !ends_with_word(s, start);
            int stop_space = stop == n || !starts_with_word(s + stop, n - stop);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start - trailing_ws(s, start);
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) stop += leading_ws(s + stop, n - stop);
        if (stop <= start_offset) continue; /* swallowed by the previous token's rstrip */
        if (start < start_offset) start = start_offset;
        if (start > start_offset)
            TP_CHECK(tk_pieces_push(out, s + start_offset, start - start_offset, -1, pc->at_start && start_offset == 0));
        TP_CHECK(tk_pieces_push(out, s + start, stop - start, a->id, 0));
        start_offset = stop;
        if (i < stop) i = stop;
    }
    if (start_offset < n)
        TP_CHECK(tk_pieces_push(out, s + start_offset, n - start_offset, -1, pc->at_start && start_offset == 0));
    return TP_OK;
}

// ----------------------------------------------------------------------------
// encode

tp_status tp_tokenizer_encode(tp_tokenizer *tok, const char *text, size_t len, int add_special_tokens, tp_ids *out)
{
    size_t bad;
    if (!tp_utf8_valid(text, len, &bad))
        return tp_error(TP_ERR_INVALID_ARG, "the text to tokenize is not valid UTF-8 (byte %zu of %zu); "
                        "tokenizers only take valid UTF-8", bad, len);
    tk_pieces a = {0}, b = {0};
    tk_pool pool = {0};
    tp_ids body = {0};
    size_t first = out->n;
    tp_status st = TP_OK;
    if (len > 0) {
        tk_piece whole = {text, len, -1, 1};
        TP_CHECK_GOTO(split_added(tok, 0, &whole, &a), st, done);
    }
    for (size_t i = 0; i < a.n; i++) {
        tk_piece pc = a.v[i];
        if (pc.id >= 0) {
            TP_CHECK_GOTO(tk_pieces_push(&b, pc.s, pc.len, pc.id, pc.at_start), st, done);
            continue;
        }
        if (tok->normalizer) TP_CHECK_GOTO(tk_normalize(tok->normalizer, pc.s, pc.len, &pool, &pc.s, &pc.len), st, done);
        if (pc.len == 0) continue;
        TP_CHECK_GOTO(split_added(tok, 1, &pc, &b), st, done);
    }
    if (tok->pretok) TP_CHECK_GOTO(tk_pretokenize(tok->pretok, &b, &pool), st, done);
    for (size_t i = 0; i < b.n; i++) {
        if (b.v[i].id >= 0) TP_CHECK_GOTO(tp_ids_push(&body, b.v[i].id), st, done);
        else TP_CHECK_GOTO(tk_bpe_tokenize(&tok->bpe, b.v[i].s, b.v[i].len, &body), st, done);
    }
    if (add_special_tokens && tok->post) TP_CHECK_GOTO(post_apply(tok->post, &body), st, done);
    for (size_t i = 0; i < body.n; i++) TP_CHECK_GOTO(tp_ids_push(out, body.v[i]), st, done);
done:
    tk_pieces_free(&a);
    tk_pieces_free(&b);
    tk_pool_free(&pool);
    tp_ids_free(&body);
    if (st != TP_OK) out->n = first;
    return st;
}

// ----------------------------------------------------------------------------
// load

static tp_status config_token(json_t *cfg, const char *key, char **out)
{
    json_t *j = json_object_get(cfg, key);
    if (json_is_object(j)) j = json_object_get(j, "content");
    if (!j || json_is_null(j)) return TP_OK;
    if (!json_is_string(j))
        return tp_error(TP_ERR_FORMAT, "tokenizer_config.json: \"%s\" must be a string, an object with "
                        "\"content\", or null", key);
    *out = strdup(json_string_value(j));
    return *out ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
}

static tp_status config_parse(tp_tokenizer *tok, const char *js, size_t len)
{
    json_error_t err;
    /* model_max_length is often 1e30 written as an integer, past int64: read numbers as reals. */
    json_t *cfg = json_loadb(js, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &err);
    if (!cfg)
        return tp_error(TP_ERR_FORMAT, "tokenizer_config.json: invalid JSON at line %d column %d: %s", err.line,
                        err.column, err.text);
    tp_status st = TP_OK;
    if (!json_is_object(cfg)) {
        st = tp_error(TP_ERR_FORMAT, "tokenizer_config.json: the top level must be an object");
        goto done;
    }
    TP_CHECK_GOTO(config_token(cfg, "bos_token", &tok->bos_token), st, done);
    TP_CHECK_GOTO(config_token(cfg, "eos_token", &tok->eos_token), st, done);
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_array(ct)) {
        /* [{"name": "default", "template": ...}, ...]: the default one. */
        json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            const char *name = json_string_value(json_object_get(json_array_get(ct, i), "name"));
            if (name && strcmp(name, "default") == 0) pick = json_object_get(json_array_get(ct, i), "template");
        }
        ct = pick;
    }
    if (ct && !json_is_null(ct)) {
        if (!json_is_string(ct)) {
            st = tp_error(TP_ERR_FORMAT, "tokenizer_config.json: \"chat_template\" must be a string");
            goto done;
        }
        tok->chat_template = strdup(json_string_value(ct));
        tok->chat_template_file = "tokenizer_config.json";
        if (!tok->chat_template) st = tp_error(TP_ERR_OOM, "out of memory");
    }
    if (st == TP_OK && tok->bos_token && tp_tokenizer_bos_id(tok) < 0)
        st = tp_error(TP_ERR_FORMAT, "tokenizer_config.json: bos_token \"%.64s\" is not a token", tok->bos_token);
    if (st == TP_OK && tok->eos_token && tp_tokenizer_eos_id(tok) < 0)
        st = tp_error(TP_ERR_FORMAT, "tokenizer_config.json: eos_token \"%.64s\" is not a token", tok->eos_token);
done:
    json_decref(cfg);
    return st;
}

static tp_status component(json_t *root, const char *key, size_t size, void **out,
                           tp_status (*parse)(void *, json_t *))
{
    json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j)) return TP_OK;
    *out = calloc(1, size);
    if (!*out) return tp_error(TP_ERR_OOM, "out of memory");
    return parse(*out, j);
}

static tp_status parse_norm(void *p, json_t *j) { return tk_normalizer_parse(p, j); }
static tp_status parse_pre(void *p, json_t *j) { return tk_pretok_parse(p, j); }
static tp_status parse_post(void *p, json_t *j) { return post_parse(p, j); }
static tp_status parse_dec(void *p, json_t *j) { return tk_decoder_parse(p, j); }

static tp_status tokenizer_parse(tp_tokenizer *tok, json_t *root)
{
    static const char *const known[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                        "pre_tokenizer", "model", "post_processor", "decoder", NULL};
    if (!json_is_object(root)) return tp_error(TP_ERR_FORMAT, "tokenizer.json: the top level must be an object");
    TP_CHECK(tk_check_keys(root, known, "the top level"));
    json_t *trunc = json_object_get(root, "truncation"), *pad = json_object_get(root, "padding");
    if (trunc && !json_is_null(trunc))
        return tp_error(TP_ERR_UNSUPPORTED, "tokenizer.json: \"truncation\" is set; tpinfer never truncates "
                        "prompts silently, remove it from the file");
    if (pad && !json_is_null(pad)) {
        json_t *strat = json_object_get(pad, "strategy");
        if (!json_is_string(strat) || strcmp(json_string_value(strat), "BatchLongest") != 0)
            return tp_error(TP_ERR_UNSUPPORTED, "tokenizer.json: \"padding\" with a fixed length is not supported");
    }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return tp_error(TP_ERR_FORMAT, "tokenizer.json: no \"model\" object");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    /* Old files leave the type out; HF then recognizes BPE by its merges. */
    if (mtype ? strcmp(mtype, "BPE") != 0 : !json_object_get(model, "merges"))
        return tp_error(TP_ERR_UNSUPPORTED,
                        "tokenizer.json: model type \"%.64s\" is not supported (tpinfer supports BPE)",
                        mtype ? mtype : "(none)");
    TP_CHECK(tk_bpe_load(&tok->bpe, model));
    TP_CHECK(component(root, "normalizer", sizeof(tk_normalizer), (void **)&tok->normalizer, parse_norm));
    TP_CHECK(component(root, "pre_tokenizer", sizeof(tk_pretok), (void **)&tok->pretok, parse_pre));
    TP_CHECK(component(root, "post_processor", sizeof(tk_post), (void **)&tok->post, parse_post));
    TP_CHECK(component(root, "decoder", sizeof(tk_decoder), (void **)&tok->decoder, parse_dec));
    TP_CHECK(added_parse(tok, json_object_get(root, "added_tokens")));
    TP_CHECK(added_normalize(tok));
    /* HF skips a token in decode when its text is the content of a special token; for a
     * normalized token that text is the normalized content. */
    for (size_t i = 0; i < tok->n_added; i++) {
        size_t len;
        const char *t = tok->added[i].norm ? tok->added[i].norm : tok->added[i].content;
        len = tok->added[i].norm ? tok->added[i].norm_len : tok->added[i].len;
        for (size_t k = 0; k < tok->n_added; k++)
            if (tok->added[k].special && tok->added[k].len == len && memcmp(tok->added[k].content, t, len) == 0)
                tok->added[i].skip = 1;
    }
    tok->n_ids = tok->bpe.vocab.n_ids;
    for (size_t i = 0; i < tok->n_added; i++)
        if ((size_t)tok->added[i].id + 1 > tok->n_ids) tok->n_ids = (size_t)tok->added[i].id + 1;
    tok->added_by_id = malloc((tok->n_ids ? tok->n_ids : 1) * sizeof *tok->added_by_id);
    if (!tok->added_by_id) return tp_error(TP_ERR_OOM, "out of memory");
    memset(tok->added_by_id, 0xFF, (tok->n_ids ? tok->n_ids : 1) * sizeof *tok->added_by_id);
    for (size_t i = 0; i < tok->n_added; i++) tok->added_by_id[tok->added[i].id] = (int32_t)i;
    if (tok->post) TP_CHECK(post_check_ids(tok->post, tok));
    return TP_OK;
}

tp_status tp_tokenizer_load_json(const char *tokenizer_json, size_t len, const char *config_json, size_t config_len,
                                 tp_tokenizer **out)
{
    *out = NULL;
    json_error_t err;
    json_t *root = json_loadb(tokenizer_json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!root)
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: invalid JSON at line %d column %d: %s", err.line, err.column,
                        err.text);
    tp_tokenizer *tok = calloc(1, sizeof *tok);
    tp_status st = tok ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    if (st == TP_OK) st = tokenizer_parse(tok, root);
    json_decref(root);
    if (st == TP_OK && config_json) st = config_parse(tok, config_json, config_len);
    if (st != TP_OK) {
        tp_tokenizer_destroy(tok);
        return st;
    }
    *out = tok;
    return TP_OK;
}

/* The chat template from the model directory's own files, as transformers and vLLM find it:
 * chat_template.jinja (transformers >= 4.52 saves it there, no longer in tokenizer_config.json)
 * wins over tokenizer_config.json's; a multimodal model's processor keeps it in
 * chat_template.json ({"chat_template": "..."}), which vLLM reads where the tokenizer has none. */
static tp_status file_chat_template(const char *model_dir, tp_tokenizer *tok)
{
    static const char *const files[] = {"chat_template.jinja", "chat_template.json"};
    for (size_t f = 0; f < TP_ARRAY_LEN(files); f++) {
        if (f == 1 && tok->chat_template) break;
        char *path = tp_path_join(model_dir, files[f]), *text = NULL, *tpl = NULL;
        if (!path) return tp_error(TP_ERR_OOM, "out of memory");
        struct stat sb;
        size_t len;
        tp_status st = stat(path, &sb) == 0 ? tp_read_file(path, MAX_CONFIG_JSON, &text, &len) : TP_OK;
        if (st == TP_OK && text && f == 0) {
            if (strlen(text) != len)
                st = tp_error(TP_ERR_FORMAT, "%s: a NUL byte at offset %zu (a chat template is text)", path,
                              strlen(text));
            tpl = text;
            text = NULL;
        } else if (st == TP_OK && text) {
            json_error_t err;
            json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
            const json_t *ct = json_object_get(j, "chat_template");
            if (!j)
                st = tp_error(TP_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", path, err.line, err.column,
                              err.text);
            else if (!json_is_string(ct))
                st = tp_error(TP_ERR_FORMAT, "%s: \"chat_template\" must be a string (the processor's template)",
                              path);
            else if (!(tpl = strdup(json_string_value(ct))))
                st = tp_error(TP_ERR_OOM, "out of memory");
            json_decref(j);
        }
        free(text);
        free(path);
        if (st != TP_OK) {
            free(tpl);
            return st;
        }
        if (tpl) {
            free(tok->chat_template);
            tok->chat_template = tpl;
            tok->chat_template_file = files[f];
        }
    }
    return TP_OK;
}

tp_status tp_tokenizer_load(const char *model_dir, tp_tokenizer **out)
{
    *out = NULL;
    char *tpath = tp_path_join(model_dir, "tokenizer.json");
    char *cpath = tp_path_join(model_dir, "tokenizer_config.json");
    char *tj = NULL, *cj = NULL;
    size_t tl = 0, cl = 0;
    tp_status st = TP_OK;
    if (!tpath || !cpath) {
        st = tp_error(TP_ERR_OOM, "out of memory");
        goto done;
    }
    struct stat sb;
    if (stat(tpath, &sb) != 0) {
        st = tp_error(TP_ERR_IO, "%s: %s (the model directory needs a Hugging Face tokenizer.json)", tpath,
                      strerror(errno));
        goto done;
    }
    TP_CHECK_GOTO(tp_read_file(tpath, MAX_TOKENIZER_JSON, &tj, &tl), st, done);
    if (stat(cpath, &sb) == 0) TP_CHECK_GOTO(tp_read_file(cpath, MAX_CONFIG_JSON, &cj, &cl), st, done);
    st = tp_tokenizer_load_json(tj, tl, cj, cl, out);
    if (st == TP_OK && (st = file_chat_template(model_dir, *out)) != TP_OK) {
        tp_tokenizer_destroy(*out);
        *out = NULL;
    }
done:
    free(tpath);
    free(cpath);
    free(tj);
    free(cj);
    return st;
}

void tp_tokenizer_destroy(tp_tokenizer *tok)
{
    if (!tok) return;
    tk_bpe_free(&tok->bpe);
    for (size_t i = 0; i < tok->n_added; i++) {
        free(tok->added[i].content);
        free(tok->added[i].norm);
    }
    free(tok->added);
    free(tok->added_by_id);
    tk_normalizer_free(tok->normalizer);
    free(tok->normalizer);
    tk_pretok_free(tok->pretok);
    free(tok->pretok);
    post_free(tok->post);
    free(tok->post);
    tk_decoder_free(tok->decoder);
    free(tok->decoder);
    free(tok->bos_token);
    free(tok->eos_token);
    free(tok->chat_template);
    free(tok);
}

// ----------------------------------------------------------------------------
// accessors

size_t tp_tokenizer_vocab_size(const tp_tokenizer *tok) { return tok->n_ids; }

const char *tp_tokenizer_id_to_token(const tp_tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= tok->n_ids) return NULL;
    if (tok->added_by_id && tok->added_by_id[id] >= 0) {
        /* HF hands out a normalized token's normalized content (what it matched). */
        const tk_added *a = &tok->added[tok->added_by_id[id]];
        if (len) *len = a->norm ? a->norm_len : a->len;
        return a->norm ? a->norm : a->content;
    }
    if ((size_t)id >= tok->bpe.vocab.n_ids || !tok->bpe.vocab.tok[id]) return NULL;
    if (len) *len = tok->bpe.vocab.tok_len[id];
    return tok->bpe.vocab.tok[id];
}

int32_t tp_tokenizer_token_to_id(const tp_tokenizer *tok, const char *s, size_t len)
{
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && memcmp(tok->added[i].content, s, len) == 0) return tok->added[i].id;
    return tk_vocab_get(&tok->bpe.vocab, s, len);
}

int tp_tokenizer_is_special(const tp_tokenizer *tok, int32_t id)
{
    if (id < 0 || (size_t)id >= tok->n_ids || tok->added_by_id[id] < 0) return 0;
    return tok->added[tok->added_by_id[id]].skip;
}

const char *tp_tokenizer_bos_token(const tp_tokenizer *tok) { return tok->bos_token; }
const char *tp_tokenizer_eos_token(const tp_tokenizer *tok) { return tok->eos_token; }
const char *tp_tokenizer_chat_template(const tp_tokenizer *tok) { return tok->chat_template; }
const char *tp_tokenizer_chat_template_file(const tp_tokenizer *tok)
{
    return tok->chat_template ? tok->chat_template_file : NULL;
}

int32_t tp_tokenizer_bos_id(const tp_tokenizer *tok)
{
    return tok->bos_token ? tp_tokenizer_token_to_id(tok, tok->bos_token, strlen(tok->bos_token)) : -1;
}

int32_t tp_tokenizer_eos_id(const tp_tokenizer *tok)
{
    return tok->eos_token ? tp_tokenizer_token_to_id(tok, tok->eos_token, strlen(tok->eos_token)) : -1;
}
