/*
 * check_guided.c: guided_choice's token sets (src/guided.c) against the tokenizer's own
 * decoder, on real tokenizers (byte-level BPE: gpt2, tiny-llama3; SentencePiece with byte
 * fallback: mistral-7b-v0.1, stories260K, tiny-mistral; from $TPINFER_SHARED, default
 * ../shared) and on a hand-made one that needs nothing:
 *   - every allowed token keeps the decoded bytes a prefix of a choice (random walks);
 *   - every token that would is allowed (all ids, the first steps);
 *   - the end tokens exactly when the text is a choice, and the text a walk ends with is one;
 *   - each choice's own encoding is a path the guide allows;
 * and response_format's JSON object (tp_guide_allowed_json) the same way: every allowed token
 * keeps the decoded text the start of a JSON object (src/json_prefix.c), every token that
 * would is allowed (all ids, some steps), the end tokens exactly when the object is whole,
 * walks that end parse as objects (jansson), and real JSON texts' own encodings are paths.
 */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "guided.h"
#include "json_prefix.h"
#include "json_schema.h"
#include "tiny_tokenizer.h"
#include "tokenizer.h"
#include "util.h"

static const char *shared_dir(void)
{
    const char *s = getenv("TPINFER_SHARED");
    return s && *s ? s : "../shared";
}

static char *const CHOICES[] = {"Positive", "Negative", "Neutral \xe2\x9c\x93 \xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
                                " leading space", "yes", "yes!", "a"};
enum { N_CHOICES = sizeof CHOICES / sizeof CHOICES[0] };

static uint64_t rng = 88172645463325252ULL;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int is_eos(const int32_t *eos, int32_t n_eos, int32_t id)
{
    for (int32_t i = 0; i < n_eos; i++)
        if (eos[i] == id) return 1;
    return 0;
}

/* Whether s[0, n) is a prefix of a choice (exact: equal to one, when exact). */
static int on_path(const char *s, size_t n, int exact, char *const *choices, int32_t n_choices)
{
    for (int32_t c = 0; c < n_choices; c++) {
        const size_t cl = strlen(choices[c]);
        if ((exact ? cl == n : cl >= n) && memcmp(choices[c], s, n) == 0) return 1;
    }
    return 0;
}

static char *decode_raw(const tp_tokenizer *tok, const int32_t *ids, int32_t n, size_t *len)
{
    char *s = NULL;
    ck_assert_int_eq(tp_tokenizer_decode_raw(tok, ids, (size_t)n, &s, len), TP_OK);
    return s;
}

/* Whether token t may follow out[0, n) by the decoder itself: it adds bytes, and they stay
 * on a choice's path. */
static int may_follow(const tp_tokenizer *tok, int32_t *out, int32_t n, int32_t t, size_t before, char *const *choices,
                      int32_t n_choices)
{
    out[n] = t;
    size_t len;
    char *s = decode_raw(tok, out, n + 1, &len);
    /* only the first token may add nothing (SentencePiece's lone "▁") */
    const int ok = (len > before || n == 0) && on_path(s, len, 0, choices, n_choices);
    free(s);
    return ok;
}

static void check_tokenizer_guide(const tp_tokenizer *tok, const char *name, const int32_t *eos, int32_t n_eos,
                                  char *const *choices, int32_t n_choices, int full_steps)
{
    const int32_t vocab = (int32_t)tp_tokenizer_vocab_size(tok);
    tp_guide *g = NULL;
    const clock_t t0 = clock();
    tp_status st = tp_guide_create(tok, vocab, eos, n_eos, &g);
    ck_assert_msg(st == TP_OK, "%s: %s", name, tp_error_message());
    printf("check_guided: %s: %d tokens, guide made in %.0f ms\n", name, (int)vocab,
           1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC);
    int32_t *allowed = malloc((size_t)tp_guide_max_allowed(g) * sizeof *allowed);
    int32_t out[256];
    uint8_t *in_set = calloc((size_t)vocab, 1);
    ck_assert(allowed && in_set);
    int ended[N_CHOICES + 8] = {0};
    for (int walk = 0; walk < 60; walk++) {
        int32_t n_out = 0;
        for (;;) {
            int32_t n = 0;
            ck_assert_int_eq(tp_guide_allowed(g, choices, n_choices, out, n_out, allowed, &n), TP_OK);
            size_t len;
            char *text = decode_raw(tok, out, n_out, &len);
            const int complete = on_path(text, len, 1, choices, n_choices);
            int n_end = 0;
            for (int32_t i = 0; i < n; i++) {
                if (is_eos(eos, n_eos, allowed[i])) {
                    n_end++;
                    continue;
                }
                ck_assert_msg(may_follow(tok, out, n_out, allowed[i], len, choices, n_choices),
                              "%s: token %d after %d tokens (\"%.*s\") leaves every choice", name, allowed[i], n_out,
                              (int)len, text);
            }
            ck_assert_msg(n_end == (complete ? n_eos : 0), "%s: %d end tokens allowed after \"%.*s\"", name, n_end,
                          (int)len, text);
            if (walk < 2 && n_out < full_steps) { /* every id the decoder would keep on a path is there */
                for (int32_t i = 0; i < n; i++) in_set[allowed[i]] = 1;
                for (int32_t t = 0; t < vocab; t++) {
                    size_t tl;
                    if (in_set[t] || !tp_tokenizer_id_to_token(tok, t, &tl) || tp_tokenizer_is_special(tok, t)) continue;
                    ck_assert_msg(!may_follow(tok, out, n_out, t, len, choices, n_choices),
                                  "%s: token %d would follow \"%.*s\" on a choice, and is not allowed", name, t,
                                  (int)len, text);
                }
                for (int32_t i = 0; i < n; i++) in_set[allowed[i]] = 0;
            }
            free(text);
            ck_assert_msg(n > 0, "%s: nothing allowed after %d tokens", name, n_out);
            ck_assert_int_lt(n_out, 255);
            const int32_t pick = allowed[next_rand() % (uint32_t)n];
            if (is_eos(eos, n_eos, pick)) break;
            out[n_out++] = pick;
        }
        /* the text as the output shows it (tp_tokenizer_decode) is one of the choices */
        char *text = NULL;
        size_t len = 0;
        ck_assert_int_eq(tp_tokenizer_decode(tok, out, (size_t)n_out, 0, &text, &len), TP_OK);
        int which = -1;
        for (int32_t c = 0; c < n_choices; c++)
            if (strlen(choices[c]) == len && memcmp(choices[c], text, len) == 0) which = c;
        ck_assert_msg(which >= 0, "%s: the walk ended on \"%.*s\", no choice", name, (int)len, text);
        ended[which]++;
        free(text);
    }
    int distinct = 0;
    for (int32_t c = 0; c < n_choices; c++) distinct += ended[c] > 0;
    ck_assert_msg(distinct >= 2, "%s: every walk ended on one choice", name);
    /* each choice's own encoding is a path */
    for (int32_t c = 0; c < n_choices; c++) {
        tp_ids ids = {0};
        tp_tokenizer *mut = (tp_tokenizer *)tok; /* encode caches; the guide does not mind */
        ck_assert_int_eq(tp_tokenizer_encode(mut, choices[c], strlen(choices[c]), 0, &ids), TP_OK);
        char *text = NULL;
        size_t len = 0;
        ck_assert_int_eq(tp_tokenizer_decode(tok, ids.v, ids.n, 0, &text, &len), TP_OK);
        const int round_trip = len == strlen(choices[c]) && memcmp(text, choices[c], len) == 0;
        free(text);
        if (!round_trip) { /* e.g. SentencePiece's dropped leading space: not a spelling of it */
            tp_ids_free(&ids);
            continue;
        }
        for (size_t k = 0; k <= ids.n; k++) {
            int32_t n = 0;
            ck_assert_int_eq(tp_guide_allowed(g, choices, n_choices, ids.v, (int32_t)k, allowed, &n), TP_OK);
            int found = 0;
            for (int32_t i = 0; i < n; i++)
                found |= k < ids.n ? allowed[i] == ids.v[k] : is_eos(eos, n_eos, allowed[i]);
            ck_assert_msg(found, "%s: choice %d's own token %zu (%d) is not allowed", name, (int)c, k,
                          k < ids.n ? ids.v[k] : -1);
        }
        tp_ids_free(&ids);
    }
    /* off every path: nothing */
    const int32_t eos0 = eos[0];
    int32_t n = 5;
    ck_assert_int_eq(tp_guide_allowed(g, choices, n_choices, &eos0, 1, allowed, &n), TP_OK);
    ck_assert_int_eq(n, 0);
    free(in_set);
    free(allowed);
    tp_guide_destroy(g);
}

/* Whether text[0, len) is the start of a JSON object (whole, when *whole is set). */
static int json_start(const char *text, size_t len, int *whole)
{
    tp_json_prefix p;
    tp_json_prefix_init(&p, 1);
    const int ok = tp_json_prefix_feed_n(&p, text, len) == len;
    *whole = ok && tp_json_prefix_complete(&p);
    return ok;
}

/* Whether token t may follow out[0, n) in a JSON object by the decoder itself. */
static int json_may_follow(const tp_tokenizer *tok, int32_t *out, int32_t n, int32_t t, size_t before)
{
    out[n] = t;
    size_t len;
    int whole;
    char *s = decode_raw(tok, out, n + 1, &len);
    const int ok = (len > before || n == 0) && json_start(s, len, &whole);
    free(s);
    return ok;
}

static const char *const JSON_TEXTS[] = {
    "{\"name\": \"Ana\", \"age\": 31, \"tags\": [\"a\", \"b\"], \"ok\": true, \"x\": null}",
    "{\n  \"nested\": {\"list\": [1, 2.5, -3e2, {}], \"s\": \"caf\xc3\xa9 \\\"quoted\\\" \\u00e9\"}\n}",
    "{\"\xe6\x97\xa5\xe6\x9c\xac\": \"\xe8\xaa\x9e\", \"emoji\": \"\xf0\x9f\x98\x80\"}",
};

static void check_tokenizer_json(const tp_tokenizer *tok, const char *name, const int32_t *eos, int32_t n_eos)
{
    const int32_t vocab = (int32_t)tp_tokenizer_vocab_size(tok);
    tp_guide *g = NULL;
    ck_assert_msg(tp_guide_create(tok, vocab, eos, n_eos, &g) == TP_OK, "%s: %s", name, tp_error_message());
    int32_t *allowed = malloc((size_t)tp_guide_max_allowed(g) * sizeof *allowed);
    uint8_t *in_set = calloc((size_t)vocab, 1);
    /* tokens that end strings, values and containers: walks pick them often, so they end */
    int32_t *structural = malloc((size_t)vocab * sizeof *structural), n_structural = 0;
    ck_assert(allowed && in_set && structural);
    for (int32_t t = 0; t < vocab; t++) {
        size_t tl, len;
        if (!tp_tokenizer_id_to_token(tok, t, &tl) || tp_tokenizer_is_special(tok, t)) continue;
        char *sp = decode_raw(tok, &t, 1, &len);
        if (len >= 1 && len <= 2 && strchr("{}[]\":,0123456789", sp[len - 1])) structural[n_structural++] = t;
        free(sp);
    }
    ck_assert_int_gt(n_structural, 0);
    int32_t out[512];
    int ended = 0;
    double miss_ms = 0.0;
    int misses = 0;
    for (int walk = 0; walk < 24; walk++) {
        int32_t n_out = 0;
        int done = 0;
        while (!done && n_out < 400) {
            int32_t n = 0;
            const clock_t t0 = clock();
            ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 0, NULL, out, n_out, allowed, &n), TP_OK);
            const double ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC;
            if (ms > 0.5) {
                miss_ms += ms;
                misses++;
            }
            size_t len;
            int whole;
            char *text = decode_raw(tok, out, n_out, &len);
            ck_assert_msg(json_start(text, len, &whole), "%s: the walk left JSON: \"%.*s\"", name, (int)len, text);
            int n_end = 0;
            for (int32_t i = 0; i < n; i++) {
                in_set[allowed[i]] = 1;
                if (is_eos(eos, n_eos, allowed[i])) n_end++;
            }
            ck_assert_msg(n_end == (whole ? n_eos : 0), "%s: %d end tokens allowed after \"%.*s\"", name, n_end,
                          (int)len, text);
            /* a sample of the allowed tokens (all of them where few), by the decoder */
            for (int32_t k = 0; k < (n < 64 ? n : 64); k++) {
                const int32_t t = allowed[n < 64 ? k : (int32_t)(next_rand() % (uint32_t)n)];
                if (is_eos(eos, n_eos, t)) continue;
                ck_assert_msg(json_may_follow(tok, out, n_out, t, len), "%s: token %d after \"%.*s\" leaves JSON",
                              name, t, (int)len, text);
            }
            if (walk == 0 && (n_out <= 1 || n_out == 4 || n_out == 9)) /* every token that would is there */
                for (int32_t t = 0; t < vocab; t++) {
                    size_t tl;
                    if (in_set[t] || !tp_tokenizer_id_to_token(tok, t, &tl) || tp_tokenizer_is_special(tok, t)) continue;
                    ck_assert_msg(!json_may_follow(tok, out, n_out, t, len),
                                  "%s: token %d would follow \"%.*s\" in JSON, and is not allowed", name, t, (int)len,
                                  text);
                }
            free(text);
            ck_assert_msg(n > 0, "%s: nothing allowed after %d tokens", name, n_out);
            int32_t pick = -1;
            if (n_end && next_rand() % 2) pick = eos[0];
            for (int tries = 0; pick < 0 && tries < 200 && next_rand() % 8 < 5; tries++) {
                const int32_t t = structural[next_rand() % (uint32_t)n_structural];
                if (in_set[t]) pick = t;
            }
            if (pick < 0) pick = allowed[next_rand() % (uint32_t)n];
            for (int32_t i = 0; i < n; i++) in_set[allowed[i]] = 0;
            if (is_eos(eos, n_eos, pick)) done = 1;
            else out[n_out++] = pick;
        }
        if (!done) continue;
        ended++;
        char *text = NULL; /* the text as the output shows it */
        size_t len = 0;
        ck_assert_int_eq(tp_tokenizer_decode(tok, out, (size_t)n_out, 0, &text, &len), TP_OK);
        json_error_t err;
        json_t *v = json_loadb(text, len, JSON_ALLOW_NUL, &err);
        /* 1e999 is JSON that jansson does not hold in a double; it stops there */
        ck_assert_msg((v && json_is_object(v)) || json_error_code(&err) == json_error_numeric_overflow,
                      "%s: the walk ended on \"%.*s\": %s", name, (int)len, text, err.text);
        json_decref(v);
        free(text);
    }
    ck_assert_msg(ended >= 4, "%s: %d of 24 walks ended", name, ended);
    printf("check_guided: %s: JSON, %d of 24 walks ended; %d walks over the vocabulary, %.1f ms each\n", name, ended,
           misses, misses ? miss_ms / misses : 0.0);
    /* real texts' own encodings are paths; the end only at their end */
    for (size_t j = 0; j < sizeof JSON_TEXTS / sizeof JSON_TEXTS[0]; j++) {
        tp_ids ids = {0};
        ck_assert_int_eq(tp_tokenizer_encode((tp_tokenizer *)tok, JSON_TEXTS[j], strlen(JSON_TEXTS[j]), 0, &ids), TP_OK);
        for (size_t k = 0; k <= ids.n; k++) {
            int32_t n = 0;
            ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 0, NULL, ids.v, (int32_t)k, allowed, &n), TP_OK);
            int found = 0, ends = 0;
            for (int32_t i = 0; i < n; i++) {
                found |= k < ids.n && allowed[i] == ids.v[k];
                ends |= is_eos(eos, n_eos, allowed[i]);
            }
            ck_assert_msg(k == ids.n ? ends : found && !ends, "%s: JSON text %zu, token %zu (%d): allowed %d, end %d",
                          name, j, k, k < ids.n ? ids.v[k] : -1, found, ends);
        }
        tp_ids_free(&ids);
    }
    /* kept sets bounded (here to one set): what is allowed is the same as with room for all;
     * and a cursor fed as the text grows (by 1 to 3 tokens, twice at the same length) gives
     * what reading the text whole gives */
    tp_guide *small = NULL;
    ck_assert_int_eq(tp_guide_create(tok, vocab, eos, n_eos, &small), TP_OK);
    tp_guide_limit_json_sets(small, 1);
    int32_t *again = malloc((size_t)tp_guide_max_allowed(g) * sizeof *again);
    for (size_t j = 0; j < sizeof JSON_TEXTS / sizeof JSON_TEXTS[0]; j++) {
        tp_ids ids = {0};
        ck_assert_int_eq(tp_tokenizer_encode((tp_tokenizer *)tok, JSON_TEXTS[j], strlen(JSON_TEXTS[j]), 0, &ids), TP_OK);
        tp_guide_cursor *cursor = NULL;
        for (size_t k = 0; k <= ids.n; k += 1 + k % 3) {
            int32_t n1 = 0, n2 = 0;
            ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 0, NULL, ids.v, (int32_t)k, allowed, &n1), TP_OK);
            ck_assert_int_eq(tp_guide_allowed_json(small, NULL, 0, NULL, ids.v, (int32_t)k, again, &n2), TP_OK);
            ck_assert_int_eq(n1, n2);
            ck_assert(!memcmp(allowed, again, (size_t)n1 * sizeof *allowed));
            ck_assert_uint_le(tp_guide_json_kept(small), (size_t)vocab); /* the last set alone */
            for (int twice = 0; twice < 1 + (k % 4 == 0); twice++) {
                ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 0, &cursor, ids.v, (int32_t)k, again, &n2), TP_OK);
                ck_assert_msg(n1 == n2 && !memcmp(allowed, again, (size_t)n1 * sizeof *allowed),
                              "%s: JSON text %zu after %zu tokens: %d ids with the cursor, %d without", name, j, k,
                              n2, n1);
            }
        }
        /* the same cursor under another rule (compact), or back to a shorter text: read again */
        int32_t n1 = 0, n2 = 0;
        const int32_t half = (int32_t)ids.n / 2;
        ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 1, NULL, ids.v, half, allowed, &n1), TP_OK);
        ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 1, &cursor, ids.v, half, again, &n2), TP_OK);
        ck_assert(n1 == n2 && !memcmp(allowed, again, (size_t)n1 * sizeof *allowed));
        ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 1, NULL, ids.v, 1, allowed, &n1), TP_OK);
        ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 1, &cursor, ids.v, 1, again, &n2), TP_OK);
        ck_assert(n1 == n2 && !memcmp(allowed, again, (size_t)n1 * sizeof *allowed));
        tp_guide_cursor_free(cursor);
        tp_ids_free(&ids);
    }
    ck_assert_uint_gt(tp_guide_json_kept(g), tp_guide_json_kept(small));
    free(again);
    tp_guide_destroy(small);
    /* off JSON: nothing, and nothing after it through a cursor either */
    int32_t n = 5;
    const int32_t eos0 = eos[0], off[3] = {eos[0], 0, 1};
    ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 0, NULL, &eos0, 1, allowed, &n), TP_OK);
    ck_assert_int_eq(n, 0);
    tp_guide_cursor *cursor = NULL;
    for (int32_t k = 1; k <= 3; k++) {
        n = 5;
        ck_assert_int_eq(tp_guide_allowed_json(g, NULL, 0, &cursor, off, k, allowed, &n), TP_OK);
        ck_assert_int_eq(n, 0);
    }
    tp_guide_cursor_free(cursor);
    free(structural);
    free(in_set);
    free(allowed);
    tp_guide_destroy(g);
}

/* Whether token t may follow out[0, n) under schema (every reading, by the decoder itself) */
static int schema_may_follow(const tp_tokenizer *tok, const tp_schema *schema, int32_t *out, int32_t n, int32_t t,
                             size_t before)
{
    out[n] = t;
    size_t len;
    char *s = decode_raw(tok, out, n + 1, &len);
    tp_json_prefix start;
    tp_json_prefix_init_schema(&start, schema);
    static tp_json_paths p;
    tp_json_paths_init(&p, &start);
    const int ok = (len > before || n == 0) && tp_json_paths_feed_n(&p, s, len) == len;
    free(s);
    return ok;
}

/* Under a schema whose anyOf branches begin alike (tool_choice "required"'s, three tools):
 * at every token of a text's own encoding the set is every token some reading takes, and
 * only those (all ids, by the decoder) */
static void check_tokenizer_schema(const tp_tokenizer *tok, const char *name, const int32_t *eos, int32_t n_eos)
{
    static const char *const schema_text =
        "{\"type\": \"array\", \"minItems\": 1, \"items\": {\"type\": \"object\", \"anyOf\": ["
        "{\"properties\": {\"name\": {\"enum\": [\"get_time\"]}, \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"tz\": {\"type\": \"string\", \"maxLength\": 6}}, \"required\": [\"tz\"]}}, "
        "\"required\": [\"name\", \"parameters\"]},"
        "{\"properties\": {\"name\": {\"enum\": [\"get_weather\"]}, \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 14}}}}, "
        "\"required\": [\"name\", \"parameters\"]},"
        "{\"properties\": {\"name\": {\"enum\": [\"get_weather_now\"]}, \"parameters\": {}}, "
        "\"required\": [\"name\", \"parameters\"]}]}}";
    static const char *const text =
        "[{\"name\": \"get_weather\", \"parameters\": {\"days\": 12}}, {\"name\": \"get_time\", "
        "\"parameters\": {\"tz\": \"UTC+1\"}}]";
    json_t *doc = json_loads(schema_text, 0, NULL);
    tp_schema *schema = NULL;
    ck_assert_msg(doc && tp_schema_compile(doc, &schema) == TP_OK, "%s", tp_error_message());
    const int32_t vocab = (int32_t)tp_tokenizer_vocab_size(tok);
    tp_guide *g = NULL;
    ck_assert_int_eq(tp_guide_create(tok, vocab, eos, n_eos, &g), TP_OK);
    int32_t *allowed = malloc((size_t)tp_guide_max_allowed(g) * sizeof *allowed), out[512];
    uint8_t *in_set = calloc((size_t)vocab, 1);
    tp_ids ids = {0};
    ck_assert_int_eq(tp_tokenizer_encode((tp_tokenizer *)tok, text, strlen(text), 0, &ids), TP_OK);
    ck_assert(ids.n < 500);
    tp_guide_cursor *cursor = NULL; /* followed a token at a time: the same sets */
    int32_t *again = malloc((size_t)tp_guide_max_allowed(g) * sizeof *again);
    for (size_t k = 0; k <= ids.n; k++) {
        int32_t n = 0, n2 = 0;
        ck_assert_int_eq(tp_guide_allowed_json(g, schema, 0, NULL, ids.v, (int32_t)k, allowed, &n), TP_OK);
        ck_assert_int_eq(tp_guide_allowed_json(g, schema, 0, &cursor, ids.v, (int32_t)k, again, &n2), TP_OK);
        ck_assert_msg(n == n2 && !memcmp(allowed, again, (size_t)n * sizeof *allowed),
                      "%s: under the schema after token %zu: %d ids with the cursor, %d without", name, k, n2, n);
        memcpy(out, ids.v, k * sizeof *out);
        size_t before;
        char *s = decode_raw(tok, out, (int32_t)k, &before);
        free(s);
        int ends = 0;
        for (int32_t i = 0; i < n; i++) {
            in_set[allowed[i]] = 1;
            ends |= is_eos(eos, n_eos, allowed[i]);
        }
        ck_assert_msg(ends == (k == ids.n), "%s: token %zu: the end %sallowed", name, k, ends ? "" : "not ");
        if (k < 8 || k % 5 == 0 || k == ids.n) /* every id, at the forks and some places after */
            for (int32_t t = 0; t < vocab; t++) {
                size_t tl;
                if (!tp_tokenizer_id_to_token(tok, t, &tl) || tp_tokenizer_is_special(tok, t)) continue;
                ck_assert_msg(in_set[t] == schema_may_follow(tok, schema, out, (int32_t)k, t, before),
                              "%s: under the schema, after token %zu, token %d: allowed %d", name, k, t, in_set[t]);
            }
        ck_assert_msg(k == ids.n || in_set[ids.v[k]], "%s: the text's own token %zu refused", name, k);
        for (int32_t i = 0; i < n; i++) in_set[allowed[i]] = 0;
    }
    tp_ids_free(&ids);
    tp_guide_cursor_free(cursor);
    free(again);
    free(in_set);
    free(allowed);
    tp_guide_destroy(g);
    tp_schema_free(schema);
    json_decref(doc);
}

/* Under a pattern (guided_regex's whole text, a JSON string's) no allowed token leads where
 * nothing may come: random walks each end at the end token, every text they end matching
 * (byte tokens and multi-byte characters among them); with maxLength too, no text goes where
 * the pattern's match could end only past it ("abc" under ^(ab|abcdef)$ and 3 did) */
static void check_tokenizer_patterns(const tp_tokenizer *tok, const char *name, const int32_t *eos, int32_t n_eos)
{
    static const char *const regexes[] = {"(yes|no|maybe)", "\xc3\xa9t\xc3\xa9 [^\\n]{1,5}!", "[A-Z][a-z]{2,4}\\.",
                                          "\\d{2}-\\d{2}", "[\xc3\xa0-\xc3\xbf\xe2\x82\xac]{2}x",
                                          /* a branch through a class of no character is never taken */
                                          "(ab[^\\x00-\xf4\x8f\xbf\xbf]|cd)"};
#define STRING_SCHEMA(keywords) \
    "{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", " keywords "}}, \"required\": [\"s\"]}"
    static const char *const jsons[] = {STRING_SCHEMA("\"pattern\": \"^[a-c\\u00e9\\u20ac]{1,3}$\""),
                                        STRING_SCHEMA("\"pattern\": \"^(ab|abcdef)$\", \"maxLength\": 3"),
                                        STRING_SCHEMA("\"pattern\": \"^x[a-z\\u00e9]*yz$\", \"maxLength\": 5"),
                                        STRING_SCHEMA("\"pattern\": \"[a-c]+\\\\d\", \"maxLength\": 2")};
#undef STRING_SCHEMA
    const size_t n_regexes = sizeof regexes / sizeof regexes[0], n_all = n_regexes + sizeof jsons / sizeof jsons[0];
    const int32_t vocab = (int32_t)tp_tokenizer_vocab_size(tok);
    tp_guide *g = NULL;
    ck_assert_int_eq(tp_guide_create(tok, vocab, eos, n_eos, &g), TP_OK);
    int32_t *allowed = malloc((size_t)tp_guide_max_allowed(g) * sizeof *allowed), out[160];
    /* kept while the guide lives: its sets are known by the schema's address */
    tp_schema *kept[sizeof regexes / sizeof regexes[0] + sizeof jsons / sizeof jsons[0]] = {0};
    for (size_t k = 0; k < n_all; k++) {
        tp_schema *schema = NULL;
        json_t *doc = NULL;
        if (k < n_regexes)
            ck_assert_msg(tp_schema_compile_regex(regexes[k], strlen(regexes[k]), &schema) == TP_OK, "%s",
                          tp_error_message());
        else {
            doc = json_loads(jsons[k - n_regexes], 0, NULL);
            ck_assert_msg(doc && tp_schema_compile(doc, &schema) == TP_OK, "schema %zu: %s", k, tp_error_message());
        }
        int ended = 0;
        for (int walk = 0; walk < 12; walk++) {
            int32_t n_out = 0;
            for (;;) {
                int32_t n = 0;
                ck_assert_int_eq(tp_guide_allowed_json(g, schema, 0, NULL, out, n_out, allowed, &n), TP_OK);
                if (n == 0) {
                    size_t len;
                    char *text = decode_raw(tok, out, n_out, &len);
                    ck_assert_msg(0, "%s: pattern %zu: nothing may come after %d tokens, \"%.*s\" (last %d)", name, k,
                                  n_out, (int)len, text, n_out ? out[n_out - 1] : -1);
                }
                int32_t pick = allowed[next_rand() % (uint32_t)n];
                for (int32_t i = 0; i < n && walk % 2; i++) /* half the walks end as soon as they may */
                    if (is_eos(eos, n_eos, allowed[i])) pick = allowed[i];
                if (is_eos(eos, n_eos, pick)) break;
                if (n_out >= 150) {
                    size_t len;
                    char *text = decode_raw(tok, out, n_out, &len);
                    ck_assert_msg(0, "%s: pattern %zu: a walk past 150 tokens: \"%.*s\"", name, k, (int)len, text);
                }
                out[n_out++] = pick;
            }
            size_t len;
            char *text = decode_raw(tok, out, n_out, &len);
            tp_json_prefix start;
            tp_json_prefix_init_schema(&start, schema);
            static tp_json_paths p;
            tp_json_paths_init(&p, &start);
            ck_assert_msg(tp_json_paths_feed_n(&p, text, len) == len && tp_json_paths_complete(&p),
                          "%s: pattern %zu: the walk ended on \"%.*s\", not a match", name, k, (int)len, text);
            free(text);
            ended++;
        }
        ck_assert_int_eq(ended, 12);
        kept[k] = schema;
        json_decref(doc);
    }
    free(allowed);
    tp_guide_destroy(g);
    for (size_t k = 0; k < n_all; k++) tp_schema_free(kept[k]);
}

START_TEST(tiny_tokenizer_guide)
{
    tp_tokenizer *tok = NULL;
    ck_assert_int_eq(tp_tokenizer_load_json(TINY_TOKENIZER_JSON, strlen(TINY_TOKENIZER_JSON), NULL, 0, &tok), TP_OK);
    char *const choices[] = {"abc", "ab ab", "c", "cab"};
    const int32_t eos[1] = {6};
    check_tokenizer_guide(tok, "tiny", eos, 1, choices, 4, 4);
    tp_tokenizer_destroy(tok);
}
END_TEST

static void shared_case(const char *sub, int full_steps)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", shared_dir(), sub);
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        printf("check_guided: SKIP %s: no %s (set TPINFER_SHARED)\n", sub, dir);
        return;
    }
    tp_tokenizer *tok = NULL;
    ck_assert_msg(tp_tokenizer_load(dir, &tok) == TP_OK, "%s: %s", dir, tp_error_message());
    int32_t eos = tp_tokenizer_eos_id(tok);
    if (eos < 0) eos = 0;
    check_tokenizer_guide(tok, sub, &eos, 1, CHOICES, N_CHOICES, full_steps);
    /* JSON needs an end token that spells nothing (gpt2's tokenizer.json names none: its
     * first special token, <|endoftext|>) */
    int32_t end = tp_tokenizer_eos_id(tok);
    for (int32_t t = 0; end < 0 && t < (int32_t)tp_tokenizer_vocab_size(tok); t++)
        if (tp_tokenizer_is_special(tok, t)) end = t;
    ck_assert_msg(end >= 0, "%s: no special token to end JSON with", sub);
    check_tokenizer_json(tok, sub, &end, 1);
    check_tokenizer_schema(tok, sub, &end, 1);
    check_tokenizer_patterns(tok, sub, &end, 1);
    tp_tokenizer_destroy(tok);
}

START_TEST(shared_tokenizers_guide)
{
    static const char *const subs[] = {"tokenizers/gpt2", "tokenizers/mistral-7b-v0.1", "models/stories260K-hf",
                                       "models/tiny-llama3", "models/tiny-mistral"};
    shared_case(subs[_i], 2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("guided");
    TCase *tc = tcase_create("guided");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, tiny_tokenizer_guide);
    tcase_add_loop_test(tc, shared_tokenizers_guide, 0, 5);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    const int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
