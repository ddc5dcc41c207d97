/*
 * guided.c: the tokens that keep a completion on one of its choices (guided.h). Each token's
 * piece, the bytes it adds, is kept twice, sorted by bytes: as the first token of a
 * completion and after another (decoders such as SentencePiece's drop the leading space of
 * the text). The tokens that may come next are those whose piece is a prefix of what a
 * choice still needs: one binary search per prefix length, up to the longest piece.
 */
#include "guided.h"

#include <stdlib.h>
#include <string.h>

#include "json_prefix.h"

/* JSON states whose allowed ids are kept: a completion revisits few (inside a string, after
 * a value, ...), and a state's ids take a walk over the whole vocabulary. A batch under a
 * schema meets more (each tool of tool_choice "required" has its own), so many are kept,
 * up to a bound on the ids held. */
enum { JSON_CACHE = 256, JSON_CACHE_IDS = 8 << 20 /* 32 MiB */ };

typedef struct json_cached {
    tp_json_prefix *paths; /* [n_paths]: the state, its readings sorted (json_prefix.h) */
    int n_paths;
    int first;     /* the first token's pieces (no token yet) */
    int negated;   /* ids are those that may not come */
    int32_t *ids;  /* NULL: the entry is free */
    int32_t n;
    uint64_t used; /* when last read: the least recent goes first */
} json_cached;

typedef struct piece_table {
    int32_t *ids;   /* [n] sorted by their pieces' bytes */
    int32_t n;
    uint32_t *off;  /* [vocab] where each id's piece starts in bytes */
    int32_t *len;   /* [vocab] its length; -1: never matches */
} piece_table;

struct tp_guide {
    int32_t vocab, n_eos, max_len;
    int32_t *eos;
    char *bytes; /* every piece of both tables */
    size_t n_bytes, cap_bytes;
    piece_table first, later;
    int32_t *empty_first; /* ids whose first piece is empty: SentencePiece's lone "▁", whose
                           * space the decoder drops at the text's start; a later piece is
                           * never empty (it could repeat forever) */
    int32_t n_empty_first;
    uint8_t *mark; /* [vocab] ids already in the answer; all zero between calls */
    char *text;    /* the completion's bytes so far */
    size_t text_cap;
    tp_json_prefix *walk; /* [max_len + 1][TP_JSON_MAX_PATHS]: the readings after each byte of a piece */
    int *walk_n;          /* [max_len + 1]: how many */
    int32_t *json_ids;    /* [vocab + n_eos]: a walk's ids */
    tp_json_paths *state; /* the text so far's readings */
    json_cached json[JSON_CACHE];
    uint64_t json_hash[JSON_CACHE]; /* json[i]'s state's hash; 0: free */
    uint64_t json_clock;
    size_t json_ids_kept; /* the ids the entries hold */
    size_t json_ids_max;  /* and at most (beside the last asked for) */
};

static const piece_table *sort_ctx; /* qsort has no context argument in C11 */
static const char *sort_bytes;

static int cmp_piece(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const int32_t lx = sort_ctx->len[x], ly = sort_ctx->len[y];
    const int c = memcmp(sort_bytes + sort_ctx->off[x], sort_bytes + sort_ctx->off[y], (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

static tp_status put_bytes(tp_guide *g, const char *s, size_t n, uint32_t *off)
{
    if (g->n_bytes + n > UINT32_MAX) return tp_error(TP_ERR_UNSUPPORTED, "guided decoding: the vocabulary's pieces pass 4 GiB");
    if (g->n_bytes + n > g->cap_bytes) {
        size_t cap = 2 * (g->n_bytes + n) + 4096;
        char *p = realloc(g->bytes, cap);
        if (!p) return tp_error(TP_ERR_OOM, "out of memory for guided decoding's token pieces");
        g->bytes = p;
        g->cap_bytes = cap;
    }
    memcpy(g->bytes + g->n_bytes, s, n);
    *off = (uint32_t)g->n_bytes;
    g->n_bytes += n;
    return TP_OK;
}

/* A token that decodes to one ASCII letter, alone and twice in a row: the "other token"
 * before a later piece. -1 if the vocabulary has none. */
static int32_t plain_token(const tp_tokenizer *tok, int32_t vocab)
{
    for (int32_t id = 0; id < vocab; id++) {
        size_t tl;
        if (!tp_tokenizer_id_to_token(tok, id, &tl) || tp_tokenizer_is_special(tok, id)) continue;
        char *s = NULL;
        size_t n = 0;
        if (tp_tokenizer_decode_raw(tok, &id, 1, &s, &n) != TP_OK) {
            tp_error_clear();
            continue;
        }
        int ok = n == 1 && ((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'));
        const char c = n ? s[0] : 0;
        free(s);
        if (!ok) continue;
        const int32_t two[2] = {id, id};
        if (tp_tokenizer_decode_raw(tok, two, 2, &s, &n) != TP_OK) {
            tp_error_clear();
            continue;
        }
        ok = n == 2 && s[0] == c && s[1] == c;
        free(s);
        if (ok) return id;
    }
    return -1;
}

static tp_status table_alloc(piece_table *t, int32_t vocab)
{
    t->ids = malloc((size_t)vocab * sizeof *t->ids);
    t->off = calloc((size_t)vocab, sizeof *t->off);
    t->len = malloc((size_t)vocab * sizeof *t->len);
    if (!t->ids || !t->off || !t->len) return tp_error(TP_ERR_OOM, "out of memory for guided decoding's tables");
    for (int32_t i = 0; i < vocab; i++) t->len[i] = -1;
    return TP_OK;
}

static void table_sort(piece_table *t, const char *bytes)
{
    sort_ctx = t;
    sort_bytes = bytes;
    qsort(t->ids, (size_t)t->n, sizeof *t->ids, cmp_piece);
    sort_ctx = NULL;
    sort_bytes = NULL;
}

/* Token id's pieces: alone (first) and after ref (later). */
static tp_status add_token(tp_guide *g, const tp_tokenizer *tok, int32_t id, int32_t ref, const char *ref_text,
                           size_t ref_len)
{
    char *s = NULL;
    size_t n = 0;
    TP_CHECK(tp_tokenizer_decode_raw(tok, &id, 1, &s, &n));
    tp_status st = TP_OK;
    if (n == 0) {
        g->first.len[id] = 0;
        g->empty_first[g->n_empty_first++] = id;
    } else if (n <= INT32_MAX) {
        st = put_bytes(g, s, n, &g->first.off[id]);
        g->first.len[id] = (int32_t)n;
        g->first.ids[g->first.n++] = id;
    }
    free(s);
    TP_CHECK(st);
    const int32_t pair[2] = {ref, id};
    TP_CHECK(tp_tokenizer_decode_raw(tok, pair, 2, &s, &n));
    /* a piece that changes the text before it (a decoder that merges) never matches */
    if (n > ref_len && n - ref_len <= INT32_MAX && memcmp(s, ref_text, ref_len) == 0) {
        st = put_bytes(g, s + ref_len, n - ref_len, &g->later.off[id]);
        g->later.len[id] = (int32_t)(n - ref_len);
        g->later.ids[g->later.n++] = id;
        if ((int32_t)(n - ref_len) > g->max_len) g->max_len = (int32_t)(n - ref_len);
    }
    if (g->first.len[id] > g->max_len) g->max_len = g->first.len[id];
    free(s);
    return st;
}

tp_status tp_guide_create(const tp_tokenizer *tok, int32_t vocab, const int32_t *eos, int32_t n_eos, tp_guide **out)
{
    *out = NULL;
    if (vocab < 1 || n_eos < 0) return tp_error(TP_ERR_INVALID_ARG, "guided decoding: vocabulary %d, %d end tokens", (int)vocab, (int)n_eos);
    tp_guide *g = calloc(1, sizeof *g);
    if (!g) return tp_error(TP_ERR_OOM, "out of memory for guided decoding");
    g->vocab = vocab;
    g->n_eos = n_eos;
    g->json_ids_max = JSON_CACHE_IDS;
    tp_status st = TP_OK;
    g->eos = malloc(((size_t)n_eos + 1) * sizeof *g->eos);
    g->mark = calloc((size_t)vocab, 1);
    g->empty_first = malloc((size_t)vocab * sizeof *g->empty_first);
    if (!g->eos || !g->mark || !g->empty_first) st = tp_error(TP_ERR_OOM, "out of memory for guided decoding");
    if (st == TP_OK) {
        if (n_eos) memcpy(g->eos, eos, (size_t)n_eos * sizeof *eos);
        st = table_alloc(&g->first, vocab);
    }
    if (st == TP_OK) st = table_alloc(&g->later, vocab);
    const int32_t ref = st == TP_OK ? plain_token(tok, vocab) : -1;
    char *ref_text = NULL;
    size_t ref_len = 0;
    if (st == TP_OK && ref < 0)
        st = tp_error(TP_ERR_UNSUPPORTED, "guided decoding: the vocabulary has no token of one plain letter to "
                      "measure the others' pieces after");
    if (st == TP_OK) st = tp_tokenizer_decode_raw(tok, &ref, 1, &ref_text, &ref_len);
    for (int32_t id = 0; st == TP_OK && id < vocab; id++) {
        size_t tl;
        if (!tp_tokenizer_id_to_token(tok, id, &tl) || tp_tokenizer_is_special(tok, id)) continue;
        st = add_token(g, tok, id, ref, ref_text, ref_len);
    }
    free(ref_text);
    if (st != TP_OK) {
        tp_guide_destroy(g);
        return st;
    }
    table_sort(&g->first, g->bytes);
    table_sort(&g->later, g->bytes);
    *out = g;
    return TP_OK;
}

void tp_guide_destroy(tp_guide *g)
{
    if (!g) return;
    piece_table *ts[2] = {&g->first, &g->later};
    for (int i = 0; i < 2; i++) {
        free(ts[i]->ids);
        free(ts[i]->off);
        free(ts[i]->len);
    }
    free(g->eos);
    free(g->bytes);
    free(g->mark);
    free(g->empty_first);
    free(g->text);
    free(g->walk);
    free(g->walk_n);
    free(g->state);
    free(g->json_ids);
    for (int i = 0; i < JSON_CACHE; i++) {
        free(g->json[i].ids);
        free(g->json[i].paths);
    }
    free(g);
}

int32_t tp_guide_max_allowed(const tp_guide *g) { return g->vocab + g->n_eos; }

void tp_guide_limit_json_sets(tp_guide *g, size_t max_ids) { g->json_ids_max = max_ids; }

size_t tp_guide_json_kept(const tp_guide *g) { return g->json_ids_kept; }

/* Compare a piece with key[0, k): the sorted order's. */
static int cmp_key(const tp_guide *g, const piece_table *t, int32_t id, const char *key, size_t k)
{
    const size_t l = (size_t)t->len[id];
    const int c = memcmp(g->bytes + t->off[id], key, l < k ? l : k);
    if (c) return c;
    return (l > k) - (l < k);
}

static void add_id(tp_guide *g, int32_t id, int32_t *dst, int32_t *n)
{
    if (g->mark[id]) return;
    g->mark[id] = 1;
    dst[(*n)++] = id;
}

/* Every token whose piece is exactly key[0, k). */
static void add_equal(tp_guide *g, const piece_table *t, const char *key, size_t k, int32_t *dst, int32_t *n)
{
    int32_t lo = 0, hi = t->n;
    while (lo < hi) { /* the first piece >= key */
        const int32_t mid = lo + (hi - lo) / 2;
        if (cmp_key(g, t, t->ids[mid], key, k) < 0) lo = mid + 1;
        else hi = mid;
    }
    for (int32_t i = lo; i < t->n && cmp_key(g, t, t->ids[i], key, k) == 0; i++) add_id(g, t->ids[i], dst, n);
}

tp_status tp_guide_allowed(tp_guide *g, char *const *choices, int32_t n_choices, const int32_t *out, int32_t n_out,
                           int32_t *dst, int32_t *n)
{
    *n = 0;
    /* the completion's bytes; a token that matches no piece leaves every choice */
    size_t len = 0;
    int off_path = 0;
    for (int32_t i = 0; i < n_out && !off_path; i++) {
        const piece_table *t = i ? &g->later : &g->first;
        const int32_t id = out[i];
        if (id < 0 || id >= g->vocab || t->len[id] < 0) {
            off_path = 1;
            break;
        }
        const size_t l = (size_t)t->len[id];
        if (l == 0) continue; /* an empty first piece */
        if (len + l > g->text_cap) {
            size_t cap = 2 * (len + l) + 64;
            char *p = realloc(g->text, cap);
            if (!p) return tp_error(TP_ERR_OOM, "out of memory for a guided completion's text");
            g->text = p;
            g->text_cap = cap;
        }
        memcpy(g->text + len, g->bytes + t->off[id], l);
        len += l;
    }
    if (off_path) return TP_OK;
    const piece_table *t = n_out ? &g->later : &g->first;
    if (n_out == 0) /* choices are not empty: an empty first piece leaves them all ahead */
        for (int32_t i = 0; i < g->n_empty_first; i++) add_id(g, g->empty_first[i], dst, n);
    int complete = 0;
    for (int32_t c = 0; c < n_choices; c++) {
        const size_t cl = strlen(choices[c]);
        if (cl < len || (len && memcmp(choices[c], g->text, len) != 0)) continue;
        const char *rest = choices[c] + len;
        const size_t rl = cl - len;
        if (rl == 0) complete = 1;
        for (size_t k = 1; k <= rl && k <= (size_t)g->max_len; k++) add_equal(g, t, rest, k, dst, n);
    }
    if (complete)
        for (int32_t i = 0; i < g->n_eos; i++)
            if (g->eos[i] >= 0 && g->eos[i] < g->vocab) add_id(g, g->eos[i], dst, n);
    for (int32_t i = 0; i < *n; i++) g->mark[dst[i]] = 0;
    return TP_OK;
}

/* The ids of table t whose pieces the JSON text may go on with from state start. The pieces
 * are sorted, so each shares a prefix with the one before: its walk starts where that
 * prefix's did, and a piece that shares the byte the one before was refused at is refused. */
static void json_walk(tp_guide *g, const piece_table *t, const tp_json_paths *start, int32_t *dst, int32_t *n)
{
    tp_json_prefix *st = g->walk; /* level d: st + d * TP_JSON_MAX_PATHS */
    int *sn = g->walk_n;
    memcpy(st, start->path, (size_t)start->n * sizeof *st);
    sn[0] = start->n;
    const char *prev = NULL;
    size_t prev_len = 0, valid = 0; /* the bytes of prev taken */
    for (int32_t i = 0; i < t->n; i++) {
        const int32_t id = t->ids[i];
        const char *p = g->bytes + t->off[id];
        const size_t l = (size_t)t->len[id], m = l < prev_len ? l : prev_len;
        size_t same = 0;
        while (same < m && p[same] == prev[same]) same++;
        prev = p;
        prev_len = l;
        if (same > valid) continue;
        size_t d = same;
        for (; d < l; d++) {
            sn[d + 1] = tp_json_paths_next(st + d * TP_JSON_MAX_PATHS, sn[d], (unsigned char)p[d],
                                           st + (d + 1) * TP_JSON_MAX_PATHS);
            if (!sn[d + 1]) break;
        }
        valid = d;
        if (d == l) add_id(g, id, dst, n);
    }
}

/* a word at a time (a state is whole words: json_prefix.h asserts its size), never 0: the
 * kept hashes' 0 is a free entry */
static uint64_t state_hash(const tp_json_paths *state)
{
    _Static_assert(sizeof(tp_json_prefix) % sizeof(uint64_t) == 0, "a state is whole words");
    const size_t words = (size_t)state->n * sizeof *state->path / sizeof(uint64_t);
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, (const char *)state->path + i * sizeof w, sizeof w);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h | 1;
}

static void json_evict(tp_guide *g, json_cached *c)
{
    g->json_hash[c - g->json] = 0;
    if (c->ids) g->json_ids_kept -= (size_t)c->n;
    free(c->ids);
    free(c->paths);
    c->ids = NULL;
    c->paths = NULL;
}

/* The cached ids of (state, first), or the least recently read entry (its ids freed) */
static json_cached *json_lookup(tp_guide *g, const tp_json_paths *state, uint64_t hash, int first, int *hit)
{
    for (int i = 0; i < JSON_CACHE; i++) { /* the hashes first: one small array */
        if (g->json_hash[i] != hash) continue;
        json_cached *c = &g->json[i];
        if (c->ids && c->first == first && c->n_paths == state->n &&
            memcmp(c->paths, state->path, (size_t)state->n * sizeof *c->paths) == 0) {
            c->used = ++g->json_clock;
            *hit = 1;
            return c;
        }
    }
    json_cached *old = &g->json[0];
    for (int i = 0; i < JSON_CACHE; i++) {
        json_cached *c = &g->json[i];
        if (!c->ids || (old->ids && c->used < old->used)) old = c;
    }
    json_evict(g, old);
    *hit = 0;
    return old;
}

/* room for k more ids within json_ids_max: the least recently read entries go (not keep) */
static void json_make_room(tp_guide *g, size_t k, const json_cached *keep)
{
    while (g->json_ids_kept + k > g->json_ids_max) {
        json_cached *old = NULL;
        for (int i = 0; i < JSON_CACHE; i++) {
            json_cached *c = &g->json[i];
            if (c->ids && c != keep && (!old || c->used < old->used)) old = c;
        }
        if (!old) return;
        json_evict(g, old);
    }
}

struct tp_guide_cursor {
    const struct tp_schema *schema;
    int compact;
    int32_t fed; /* the tokens read into state */
    int left;    /* one of them left the rule */
    tp_json_paths state;
};

void tp_guide_cursor_free(tp_guide_cursor *c) { free(c); }

/* The readings after out[0 .. n_out): the cursor's, fed the tokens it has not read, or made
 * from the start (without a cursor, in g->state). 0 where a token left the rule (a token with
 * no piece leaves JSON); -1 out of memory. */
static int json_state(tp_guide *g, const struct tp_schema *schema, int compact, tp_guide_cursor *c,
                      const int32_t *out, int32_t n_out, tp_json_paths **state)
{
    int32_t i = 0;
    if (c && c->schema == schema && c->compact == compact && c->fed <= n_out) {
        if (c->left) return 0;
        i = c->fed;
    } else {
        tp_json_prefix start;
        if (schema) tp_json_prefix_init_schema(&start, schema);
        else tp_json_prefix_init(&start, 1);
        if (compact) tp_json_prefix_compact(&start);
        if (c) {
            c->schema = schema;
            c->compact = compact;
            c->left = 0;
        }
        if (!c && !g->state && !(g->state = malloc(sizeof *g->state))) return -1;
        tp_json_paths_init(c ? &c->state : g->state, &start);
    }
    *state = c ? &c->state : g->state;
    for (; i < n_out; i++) {
        const piece_table *t = i ? &g->later : &g->first;
        const int32_t id = out[i];
        if (id < 0 || id >= g->vocab || t->len[id] < 0) break;
        const size_t l = (size_t)t->len[id];
        if (tp_json_paths_feed_n(*state, g->bytes + t->off[id], l) != l) break;
    }
    if (c) {
        c->fed = n_out;
        c->left = i < n_out;
    }
    return i == n_out;
}

tp_status tp_guide_json_ids(tp_guide *g, const struct tp_schema *schema, int compact, tp_guide_cursor **cursor,
                            const int32_t *out, int32_t n_out, const int32_t **ids, int32_t *n, int *negated)
{
    *ids = NULL;
    *n = 0;
    *negated = 0;
    if (cursor && !*cursor) {
        *cursor = malloc(sizeof **cursor);
        if (*cursor) { /* matches no rule: the first call starts it */
            (*cursor)->schema = NULL;
            (*cursor)->compact = -1;
            (*cursor)->fed = 0;
            (*cursor)->left = 0;
        }
    }
    if (cursor && !*cursor) return tp_error(TP_ERR_OOM, "out of memory for guided JSON");
    tp_json_paths *state;
    const int read = json_state(g, schema, compact, cursor ? *cursor : NULL, out, n_out, &state);
    if (read < 0) return tp_error(TP_ERR_OOM, "out of memory for guided JSON");
    if (!read) return TP_OK;
    int hit;
    const uint64_t hash = state_hash(state);
    json_cached *c = json_lookup(g, state, hash, n_out == 0, &hit);
    if (!hit) {
        if (!g->walk) g->walk = malloc(((size_t)g->max_len + 1) * TP_JSON_MAX_PATHS * sizeof *g->walk);
        if (!g->walk_n) g->walk_n = malloc(((size_t)g->max_len + 1) * sizeof *g->walk_n);
        if (!g->json_ids) g->json_ids = malloc(((size_t)g->vocab + (size_t)g->n_eos) * sizeof *g->json_ids);
        if (!g->walk || !g->walk_n || !g->json_ids) return tp_error(TP_ERR_OOM, "out of memory for guided JSON");
        int32_t *dst = g->json_ids, k = 0;
        json_walk(g, n_out ? &g->later : &g->first, state, dst, &k);
        if (n_out == 0) /* an empty first piece leaves the state as it is */
            for (int32_t i = 0; i < g->n_empty_first; i++) add_id(g, g->empty_first[i], dst, &k);
        if (tp_json_paths_complete(state))
            for (int32_t i = 0; i < g->n_eos; i++)
                if (g->eos[i] >= 0 && g->eos[i] < g->vocab) add_id(g, g->eos[i], dst, &k);
        /* kept as the ids that may come, or (most of the vocabulary: inside a string) as
         * those that may not; g->mark holds the set until then */
        const int neg = k > g->vocab / 2;
        const int32_t kept = neg ? g->vocab - k : k;
        json_make_room(g, (size_t)kept, c);
        c->ids = malloc(((size_t)kept + 1) * sizeof *c->ids);
        c->paths = malloc((size_t)state->n * sizeof *c->paths);
        if (!c->paths) {
            free(c->ids);
            c->ids = NULL;
        }
        if (c->ids) {
            if (neg)
                for (int32_t t = 0, j = 0; t < g->vocab; t++) {
                    if (!g->mark[t]) c->ids[j++] = t;
                }
            else
                memcpy(c->ids, dst, (size_t)k * sizeof *dst);
            c->n = kept;
            g->json_ids_kept += (size_t)kept;
            g->json_hash[c - g->json] = hash;
            c->negated = neg;
            memcpy(c->paths, state->path, (size_t)state->n * sizeof *c->paths);
            c->n_paths = state->n;
            c->first = n_out == 0;
            c->used = ++g->json_clock;
        }
        for (int32_t i = 0; i < k; i++) g->mark[dst[i]] = 0;
        if (!c->ids) { /* not kept when memory is short: the ids that may come, as they are */
            *ids = dst;
            *n = k;
            return TP_OK;
        }
    }
    *ids = c->ids;
    *n = c->n;
    *negated = c->negated;
    return TP_OK;
}

tp_status tp_guide_allowed_json(tp_guide *g, const struct tp_schema *schema, int compact, tp_guide_cursor **cursor,
                                const int32_t *out, int32_t n_out, int32_t *dst, int32_t *n)
{
    const int32_t *ids;
    int negated;
    TP_CHECK(tp_guide_json_ids(g, schema, compact, cursor, out, n_out, &ids, n, &negated));
    if (!negated) {
        if (*n) memcpy(dst, ids, (size_t)*n * sizeof *dst);
        return TP_OK;
    }
    for (int32_t i = 0; i < *n; i++) g->mark[ids[i]] = 1;
    int32_t k = 0;
    for (int32_t t = 0; t < g->vocab; t++)
        if (g->mark[t]) g->mark[t] = 0;
        else dst[k++] = t;
    *n = k;
    return TP_OK;
}
