/*
 * tokenizer_bpe.c: the BPE model of HF tokenizers: vocabulary and merges from
 * tokenizer.json, and word -> ids through a merge-rank hash table and a binary heap
 * (HF's Word::merge_all, same tie-breaking), with a bounded cache of recent words.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

#define MAX_VOCAB_ID (1 << 24)
#define CACHE_SLOTS 16384
#define CACHE_MAX_WORD 128

// ----------------------------------------------------------------------------
// vocabulary hash

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

tp_status tk_vocab_build_index(tk_vocab *v)
{
    size_t cap = 16;
    while (cap < v->count * 2 + 2) cap <<= 1;
    v->slots = malloc(cap * sizeof *v->slots);
    if (!v->slots) return tp_error(TP_ERR_OOM, "out of memory for the vocabulary index");
    memset(v->slots, 0xFF, cap * sizeof *v->slots);
    v->mask = cap - 1;
    for (size_t id = 0; id < v->n_ids; id++) {
        if (!v->tok[id]) continue;
        size_t i = hash_bytes(v->tok[id], v->tok_len[id]) & v->mask;
        while (v->slots[i] >= 0) {
            int32_t o = v->slots[i];
            if (v->tok_len[o] == v->tok_len[id] && memcmp(v->tok[o], v->tok[id], v->tok_len[id]) == 0)
                return tp_error(TP_ERR_FORMAT, "tokenizer.json: token \"%.64s\" appears twice in the vocabulary",
                                v->tok[id]);
            i = (i + 1) & v->mask;
        }
        v->slots[i] = (int32_t)id;
    }
    return TP_OK;
}

int32_t tk_vocab_get(const tk_vocab *v, const char *s, size_t n)
{
    if (!v->slots) return -1;
    size_t i = hash_bytes(s, n) & v->mask;
    for (;;) {
        int32_t id = v->slots[i];
        if (id < 0) return -1;
        if (v->tok_len[id] == n && memcmp(v->tok[id], s, n) == 0) return id;
        i = (i + 1) & v->mask;
    }
}

static void vocab_free(tk_vocab *v)
{
    if (v->tok)
        for (size_t i = 0; i < v->n_ids; i++) free(v->tok[i]);
    free(v->tok);
    free(v->tok_len);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

static tp_status vocab_load(tk_vocab *v, json_t *jv)
{
    if (!json_is_object(jv))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: model.vocab must be an object of token: id, not %s",
                        tk_json_type(jv));
    size_t n_ids = 0;
    const char *key;
    json_t *val;
    json_object_foreach(jv, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_VOCAB_ID)
            return tp_error(TP_ERR_FORMAT,
                            "tokenizer.json: model.vocab[\"%.64s\"] must be an integer id in [0, %d)", key,
                            MAX_VOCAB_ID);
        if ((size_t)json_integer_value(val) + 1 > n_ids) n_ids = (size_t)json_integer_value(val) + 1;
    }
    v->tok = calloc(n_ids ? n_ids : 1, sizeof *v->tok);
    v->tok_len = calloc(n_ids ? n_ids : 1, sizeof *v->tok_len);
    if (!v->tok || !v->tok_len) return tp_error(TP_ERR_OOM, "out of memory for %zu vocabulary ids", n_ids);
    v->n_ids = n_ids;
    /* Keys may hold NUL (json_object_foreach stops at it), so walk with key lengths. */
    void *it = json_object_iter(jv);
    while (it) {
        size_t klen = json_object_iter_key_len(it);
        const char *k = json_object_iter_key(it);
        int64_t id = json_integer_value(json_object_iter_value(it));
        if (v->tok[id])
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: id %lld is given to both \"%.64s\" and \"%.64s\"",
                            (long long)id, v->tok[id], k);
        if (klen == 0) return tp_error(TP_ERR_FORMAT, "tokenizer.json: the vocabulary has an empty token");
        v->tok[id] = malloc(klen + 1);
        if (!v->tok[id]) return tp_error(TP_ERR_OOM, "out of memory");
        memcpy(v->tok[id], k, klen + 1);
        v->tok_len[id] = (uint32_t)klen;
        v->count++;
        it = json_object_iter_next(jv, it);
    }
    return tk_vocab_build_index(v);
}

// ----------------------------------------------------------------------------
// merges

static uint64_t hash_pair(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

static const tk_merge_entry *merge_get(const tk_bpe *bpe, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = hash_pair(key) & bpe->merge_mask;
    for (;;) {
        const tk_merge_entry *e = &bpe->merges[i];
        if (e->key == UINT64_MAX) return NULL;
        if (e->key == key) return e;
        i = (i + 1) & bpe->merge_mask;
    }
}

static tp_status merge_token(const tk_bpe *bpe, const char *s, size_t n, size_t rank, int32_t *id)
{
    *id = tk_vocab_get(&bpe->vocab, s, n);
    if (*id < 0)
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: merge %zu names \"%.*s\", which is not in the vocabulary",
                        rank, (int)(n > 64 ? 64 : n), s);
    return TP_OK;
}

static tp_status merges_load(tk_bpe *bpe, json_t *jm)
{
    size_t n = jm ? json_array_size(jm) : 0;
    if (jm && !json_is_array(jm))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: model.merges must be an array, not %s", tk_json_type(jm));
    size_t cap = 16;
    while (cap < n * 2 + 2) cap <<= 1;
    bpe->merges = malloc(cap * sizeof *bpe->merges);
    if (!bpe->merges) return tp_error(TP_ERR_OOM, "out of memory for %zu merges", n);
    for (size_t i = 0; i < cap; i++) bpe->merges[i].key = UINT64_MAX;
    bpe->merge_mask = cap - 1;
    char *joined = NULL;
    tp_status st = TP_OK;
    for (size_t r = 0; r < n; r++) {
        json_t *m = json_array_get(jm, r);
        const char *a, *b;
        size_t alen, blen;
        if (json_is_string(m)) {
            /* "a b": split at the first space (HF: splitn(2, ' ')). */
            a = json_string_value(m);
            size_t len = json_string_length(m);
            const char *sp = memchr(a, ' ', len);
            if (!sp) {
                st = tp_error(TP_ERR_FORMAT, "tokenizer.json: merge %zu \"%.64s\" is not two tokens separated by a space",
                              r, a);
                goto done;
            }
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = len - alen - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            alen = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            blen = json_string_length(json_array_get(m, 1));
        } else {
            st = tp_error(TP_ERR_FORMAT, "tokenizer.json: merge %zu must be \"a b\" or [\"a\", \"b\"], not %s", r,
                          tk_json_type(m));
            goto done;
        }
        int32_t ida, idb, idn;
        TP_CHECK_GOTO(merge_token(bpe, a, alen, r, &ida), st, done);
        TP_CHECK_GOTO(merge_token(bpe, b, blen, r, &idb), st, done);
        if (blen < bpe->prefix_len) {
            st = tp_error(TP_ERR_FORMAT, "tokenizer.json: merge %zu: \"%.64s\" is shorter than the subword prefix",
                          r, b);
            goto done;
        }
        free(joined);
        joined = malloc(alen + blen + 1);
        if (!joined) {
            st = tp_error(TP_ERR_OOM, "out of memory");
            goto done;
        }
        memcpy(joined, a, alen);
        memcpy(joined + alen, b + bpe->prefix_len, blen - bpe->prefix_len);
        TP_CHECK_GOTO(merge_token(bpe, joined, alen + blen - bpe->prefix_len, r, &idn), st, done);
        /* A repeated pair keeps the later rank, as HF's HashMap collect does. */
        uint64_t key = ((uint64_t)(uint32_t)ida << 32) | (uint32_t)idb;
        size_t i = hash_pair(key) & bpe->merge_mask;
        while (bpe->merges[i].key != UINT64_MAX && bpe->merges[i].key != key) i = (i + 1) & bpe->merge_mask;
        bpe->merges[i].key = key;
        bpe->merges[i].rank = (uint32_t)r;
        bpe->merges[i].new_id = idn;
    }
done:
    free(joined);
    return st;
}

// ----------------------------------------------------------------------------
// load / free

static tp_status opt_string(json_t *model, const char *key, char **out, size_t *len)
{
    json_t *j = json_object_get(model, key);
    *out = NULL;
    if (len) *len = 0;
    if (!j || json_is_null(j)) return TP_OK;
    if (!json_is_string(j))
        return tp_error(TP_ERR_FORMAT, "tokenizer.json: model.%s must be a string or null, not %s", key,
                        tk_json_type(j));
    size_t n = json_string_length(j);
    if (n == 0) return TP_OK; /* "" is the same as none for prefix and suffix */
    *out = malloc(n + 1);
    if (!*out) return tp_error(TP_ERR_OOM, "out of memory");
    memcpy(*out, json_string_value(j), n + 1);
    if (len) *len = n;
    return TP_OK;
}

tp_status tk_bpe_load(tk_bpe *bpe, json_t *model)
{
    static const char *const known[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                        "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                        "vocab", "merges", NULL};
    memset(bpe, 0, sizeof *bpe);
    bpe->unk_id = -1;
    TP_CHECK(tk_check_keys(model, known, "model (BPE)"));
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return tp_error(TP_ERR_UNSUPPORTED,
                        "tokenizer.json: BPE dropout is random at encode time; tpinfer needs dropout null");
    TP_CHECK(tk_get_bool(model, "fuse_unk", 0, &bpe->fuse_unk, "model"));
    TP_CHECK(tk_get_bool(model, "byte_fallback", 0, &bpe->byte_fallback, "model"));
    TP_CHECK(tk_get_bool(model, "ignore_merges", 0, &bpe->ignore_merges, "model"));
    TP_CHECK(opt_string(model, "unk_token", &bpe->unk_token, NULL));
    TP_CHECK(opt_string(model, "continuing_subword_prefix", &bpe->prefix, &bpe->prefix_len));
    TP_CHECK(opt_string(model, "end_of_word_suffix", &bpe->suffix, &bpe->suffix_len));
    json_t *jv = json_object_get(model, "vocab");
    if (!jv) return tp_error(TP_ERR_FORMAT, "tokenizer.json: model has no \"vocab\"");
    TP_CHECK(vocab_load(&bpe->vocab, jv));
    TP_CHECK(merges_load(bpe, json_object_get(model, "merges")));
    if (bpe->unk_token) {
        bpe->unk_id = tk_vocab_get(&bpe->vocab, bpe->unk_token, strlen(bpe->unk_token));
        if (bpe->unk_id < 0)
            return tp_error(TP_ERR_FORMAT, "tokenizer.json: model.unk_token \"%.64s\" is not in the vocabulary",
                            bpe->unk_token);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        bpe->byte_ids[b] = tk_vocab_get(&bpe->vocab, name, 6);
    }
    if (bpe->byte_fallback) {
        /* A token that looks like a byte but is not "<0xHH>" would decode differently from
         * what its name suggests (cf. LM Studio #2289); reject such vocabularies. */
        for (size_t id = 0; id < bpe->vocab.n_ids; id++) {
            const char *t = bpe->vocab.tok[id];
            size_t n = bpe->vocab.tok_len[id];
            if (!t || n < 4 || memcmp(t, "<0x", 3) != 0 || t[n - 1] != '>') continue;
            int ok = n == 6;
            for (size_t i = 3; ok && i < 5; i++)
                ok = (t[i] >= '0' && t[i] <= '9') || (t[i] >= 'A' && t[i] <= 'F');
            if (!ok)
                return tp_error(TP_ERR_FORMAT,
                                "tokenizer.json: byte-fallback token \"%.32s\" (id %zu) is not of the form <0xHH> "
                                "with two uppercase hex digits",
                                t, id);
        }
    }
    bpe->cache = calloc(CACHE_SLOTS, sizeof *bpe->cache);
    if (!bpe->cache) return tp_error(TP_ERR_OOM, "out of memory");
    bpe->cache_mask = CACHE_SLOTS - 1;
    return TP_OK;
}

static void cache_clear(tk_bpe *bpe)
{
    if (!bpe->cache) return;
    for (size_t i = 0; i <= bpe->cache_mask; i++) {
        free(bpe->cache[i].key);
        free(bpe->cache[i].ids);
    }
    memset(bpe->cache, 0, (bpe->cache_mask + 1) * sizeof *bpe->cache);
    bpe->cache_used = 0;
}

void tk_bpe_free(tk_bpe *bpe)
{
    if (!bpe) return;
    cache_clear(bpe);
    free(bpe->cache);
    vocab_free(&bpe->vocab);
    free(bpe->merges);
    free(bpe->unk_token);
    free(bpe->prefix);
    free(bpe->suffix);
    memset(bpe, 0, sizeof *bpe);
}

// ----------------------------------------------------------------------------
// word -> ids

typedef struct symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes of the word it covers; 0 = merged away */
} symbol;

typedef struct heap_item {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} heap_item;

/* Min-heap on (rank, pos): HF's Merge ordering. */
static int heap_less(const heap_item *a, const heap_item *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_item *h, size_t *n, heap_item it)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static heap_item heap_pop(heap_item *h, size_t *n)
{
    heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

typedef struct word {
    symbol *sym;
    size_t n, cap;
} word;

static tp_status word_add(word *w, int32_t id, size_t len)
{
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        symbol *s = realloc(w->sym, cap * sizeof *s);
        if (!s) return tp_error(TP_ERR_OOM, "out of memory");
        w->sym = s;
        w->cap = cap;
    }
    int32_t i = (int32_t)w->n++;
    w->sym[i] = (symbol){id, i - 1, -1, (uint32_t)len};
    if (i > 0) w->sym[i - 1].next = i;
    return TP_OK;
}

/* HF's BPE::merge_word: one symbol per character (with prefix/suffix), byte fallback,
 * unknown-token fusing. */
static tp_status word_split(const tk_bpe *bpe, const char *s, size_t n, word *w)
{
    char stackbuf[64];
    int32_t unk_id = -1;
    size_t unk_len = 0;
    int have_unk = 0;
    size_t i = 0;
    while (i < n) {
        size_t clen = (size_t)tp_utf8_len((uint8_t)s[i]);
        if (clen > n - i) clen = n - i;
        int is_first = i == 0, is_last = i + clen == n;
        const char *piece = s + i;
        size_t plen = clen;
        char *heap = NULL;
        if ((!is_first && bpe->prefix) || (is_last && bpe->suffix)) {
            size_t need = clen + (is_first ? 0 : bpe->prefix_len) + (is_last ? bpe->suffix_len : 0);
            char *buf = need <= sizeof stackbuf ? stackbuf : (heap = malloc(need));
            if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
            size_t o = 0;
            if (!is_first && bpe->prefix) memcpy(buf, bpe->prefix, o = bpe->prefix_len);
            memcpy(buf + o, s + i, clen);
            o += clen;
            if (is_last && bpe->suffix) {
                memcpy(buf + o, bpe->suffix, bpe->suffix_len);
                o += bpe->suffix_len;
            }
            piece = buf;
            plen = o;
        }
        int32_t id = tk_vocab_get(&bpe->vocab, piece, plen);
        tp_status st = TP_OK;
        if (id >= 0) {
            if (have_unk) {
                st = word_add(w, unk_id, unk_len);
                have_unk = 0;
            }
            if (st == TP_OK) st = word_add(w, id, clen);
        } else {
            int done = 0;
            if (bpe->byte_fallback) {
                done = 1;
                for (size_t k = 0; k < plen; k++)
                    if (bpe->byte_ids[(uint8_t)piece[k]] < 0) done = 0;
                for (size_t k = 0; done && st == TP_OK && k < plen; k++)
                    st = word_add(w, bpe->byte_ids[(uint8_t)piece[k]], 1);
            }
            if (!done && bpe->unk_id >= 0) {
                if (have_unk && bpe->fuse_unk) {
                    unk_len += clen;
                } else {
                    if (have_unk) st = word_add(w, unk_id, unk_len);
                    unk_id = bpe->unk_id;
                    unk_len = clen;
                    have_unk = 1;
                }
            }
            /* No unk_token: the character is dropped, as HF does. */
        }
        free(heap);
        TP_CHECK(st);
        i += clen;
    }
    if (have_unk) TP_CHECK(word_add(w, unk_id, unk_len));
    return TP_OK;
}

static tp_status word_merge(const tk_bpe *bpe, word *w)
{
    if (w->n < 2) return TP_OK;
    /* Each merge pushes at most two entries and removes a symbol: 3n bounds the heap. */
    heap_item *h = malloc(3 * w->n * sizeof *h);
    if (!h) return tp_error(TP_ERR_OOM, "out of memory");
    size_t hn = 0;
    for (size_t i = 0; i + 1 < w->n; i++) {
        const tk_merge_entry *m = merge_get(bpe, w->sym[i].id, w->sym[i + 1].id);
        if (m) heap_push(h, &hn, (heap_item){m->rank, (uint32_t)i, m->new_id});
    }
    symbol *sym = w->sym;
    while (hn > 0) {
        heap_item top = heap_pop(h, &hn);
        symbol *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t next_pos = cur->next;
        symbol right = sym[next_pos];
        const tk_merge_entry *m = merge_get(bpe, cur->id, right.id);
        if (!m || m->new_id != top.new_id) continue; /* stale entry */
        cur->id = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        sym[next_pos].len = 0;
        if (right.next >= 0) sym[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            m = merge_get(bpe, sym[cur->prev].id, cur->id);
            if (m && hn < 3 * w->n) heap_push(h, &hn, (heap_item){m->rank, (uint32_t)cur->prev, m->new_id});
        }
        if (cur->next >= 0) {
            m = merge_get(bpe, cur->id, sym[cur->next].id);
            if (m && hn < 3 * w->n) heap_push(h, &hn, (heap_item){m->rank, top.pos, m->new_id});
        }
    }
    free(h);
    return TP_OK;
}

static tk_cache_entry *cache_slot(tk_bpe *bpe, const char *s, size_t n, int *found)
{
    size_t i = hash_bytes(s, n) & bpe->cache_mask;
    for (;;) {
        tk_cache_entry *e = &bpe->cache[i];
        if (!e->key) {
            *found = 0;
            return e;
        }
        if (e->key_len == n && memcmp(e->key, s, n) == 0) {
            *found = 1;
            return e;
        }
        i = (i + 1) & bpe->cache_mask;
    }
}

tp_status tk_bpe_tokenize(tk_bpe *bpe, const char *s, size_t n, tp_ids *out)
{
    if (n == 0) return TP_OK;
    if (bpe->ignore_merges) {
        int32_t id = tk_vocab_get(&bpe->vocab, s, n);
        if (id >= 0) return tp_ids_push(out, id);
    }
    int use_cache = n <= CACHE_MAX_WORD && bpe->cache;
    if (use_cache) {
        int found;
        tk_cache_entry *e = cache_slot(bpe, s, n, &found);
        if (found) {
            for (uint32_t i = 0; i < e->n_ids; i++) TP_CHECK(tp_ids_push(out, e->ids[i]));
            return TP_OK;
        }
    }
    word w = {0};
    tp_status st;
    TP_CHECK_GOTO(word_split(bpe, s, n, &w), st, done);
    TP_CHECK_GOTO(word_merge(bpe, &w), st, done);
    size_t start = out->n;
    for (size_t i = 0; i < w.n; i++)
        if (w.sym[i].len) TP_CHECK_GOTO(tp_ids_push(out, w.sym[i].id), st, done);
    if (use_cache) {
        if (bpe->cache_used * 4 >= (bpe->cache_mask + 1) * 3) cache_clear(bpe);
        int found;
        tk_cache_entry *e = cache_slot(bpe, s, n, &found);
        size_t k = out->n - start;
        char *key = malloc(n);
        int32_t *ids = malloc((k ? k : 1) * sizeof *ids);
        if (!key || !ids) {
            free(key);
            free(ids);
        } else {
            memcpy(key, s, n);
            if (k) memcpy(ids, out->v + start, k * sizeof *ids);
            *e = (tk_cache_entry){key, (uint32_t)n, (uint32_t)k, ids};
            bpe->cache_used++;
        }
    }
done:
    free(w.sym);
    return st;
}
