/*
 * check_json_prefix.c: the JSON prefix recognizer (src/json_prefix.c) against jansson's parser:
 *   - hand-picked texts: each prefix taken, the text whole or not, the byte that is refused;
 *   - random JSON values (jansson's dumps, with whitespace, escapes, UTF-8 and surrogate
 *     pairs): every byte taken, whole at the end;
 *   - one-byte edits of them: the recognizer takes the text whole exactly when jansson parses
 *     it and its whitespace keeps llama.cpp's rule (none, a space, or a newline and at most
 *     TP_JSON_MAX_INDENT spaces or tabs; ws_conforms below); the texts nest less than
 *     TP_JSON_MAX_DEPTH.
 */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_prefix.h"

/* The bytes taken from s (all of them when none is refused) and whether they are whole. */
static size_t taken(const char *s, size_t n, int object_only, int *whole)
{
    tp_json_prefix p;
    tp_json_prefix_init(&p, object_only);
    const size_t k = tp_json_prefix_feed_n(&p, s, n);
    *whole = k == n && tp_json_prefix_complete(&p);
    return k;
}

/* Whether every run of whitespace outside strings is none, " ", or "\n" and at most
 * TP_JSON_MAX_INDENT spaces or tabs. */
static int ws_conforms(const char *s, size_t n)
{
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_string) {
            if (s[i] == '\\') i++;
            else if (s[i] == '"') in_string = 0;
            continue;
        }
        if (s[i] == '"') in_string = 1;
        if (!strchr(" \t\n\r", s[i]) || s[i] == 0) continue;
        size_t j = i;
        while (j < n && s[j] && strchr(" \t\n\r", s[j])) j++;
        if (s[i] == ' ' ? j - i > 1 : s[i] != '\n' || j - i > 1 + TP_JSON_MAX_INDENT) return 0;
        for (size_t k = i + 1; k < j; k++)
            if (s[k] != ' ' && s[k] != '\t') return 0;
        i = j - 1;
    }
    return 1;
}

/* 1 or 0; -1 where jansson cannot tell */
static int jansson_parses(const char *s, size_t n, int object_only)
{
    json_error_t err;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!v && json_error_code(&err) == json_error_numeric_overflow)
        return -1; /* a number past a double's range (1e999): jansson stops there, whatever follows */
    const int ok = v && (!object_only || json_is_object(v));
    json_decref(v);
    return ok;
}

static const struct {
    const char *text;
    int object_only;
    long refused; /* the first byte refused, -1: none */
    int whole;
} CASES[] = {
    {"{}", 1, -1, 1},
    {" {\n\t\"a\" : [1, -2.5e+3, 0, true, false, null, \"x\"] }\n", 1, -1, 1},
    {"{\n                    \"a\": 1}", 1, -1, 1},    /* a newline and 20 spaces */
    {"{\n                     \"a\": 1}", 1, 22, 0},   /* and 21 */
    {"{  \"a\": 1}", 1, 2, 0},  /* two spaces */
    {"{\n\n\"a\": 1}", 1, 2, 0}, /* two newlines */
    {"{\t\"a\": 1}", 1, 1, 0}, /* a tab, no newline */
    {"{\r\n}", 1, 1, 0},
    {"{} ", 1, -1, 1},
    {"{\"k\": {\"n\": [[], {}, [[1]]]}}", 1, -1, 1},
    {"{\"esc\": \"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\ud83d\\ude00\"}", 1, -1, 1},
    {"{\"utf8\": \"\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80\"}", 1, -1, 1},
    {"{\"a\": 1", 1, -1, 0},  /* a prefix */
    {"{\"a\": 12", 1, -1, 0},
    {"[1]", 1, 0, 0},         /* an array where an object must be */
    {"\"s\"", 1, 0, 0},
    {"[1, 2]", 0, -1, 1},
    {"12", 0, -1, 1},         /* a number at the top is whole (it may end there) */
    {"-", 0, -1, 0},
    {"-0.5E-07", 0, -1, 1},
    {"01", 0, 1, 0},          /* no leading zeros */
    {"1.", 0, -1, 0},
    {"1.e5", 0, 2, 0},
    {"{\"a\" 1}", 1, 5, 0},   /* a colon missing */
    {"{\"a\": 1,}", 1, 8, 0}, /* a trailing comma */
    {"[1,]", 0, 3, 0},
    {"{1: 2}", 1, 1, 0},      /* a key that is not a string */
    {"{\"a\": tru}", 1, 9, 0},
    {"{\"a\": nul", 1, -1, 0},
    {"{\"a\": \"\x01\"}", 1, 7, 0},             /* a control character */
    {"{\"a\": \"\\x\"}", 1, 8, 0},              /* an escape JSON lacks */
    {"{\"a\": \"\\u12g4\"}", 1, 11, 0},
    {"{\"a\": \"\\udc00\"}", 1, 12, 0},         /* a lone low surrogate */
    {"{\"a\": \"\\ud800x\"}", 1, 13, 0},        /* a high one without its low one */
    {"{\"a\": \"\\ud800\\u0041\"}", 1, 18, 0},  /* followed by no low one */
    {"{\"a\": \"\xc0\xaf\"}", 1, 7, 0},          /* an overlong form */
    {"{\"a\": \"\xed\xa0\x80\"}", 1, 8, 0},      /* a surrogate in UTF-8 */
    {"{\"a\": \"\xf4\x90\x80\x80\"}", 1, 8, 0},  /* past U+10FFFF */
    {"{\"a\": \"\xe2\x9c\"}", 1, 9, 0},          /* a character cut short */
    {"{} {}", 1, 3, 0},       /* one text only */
    {"{}x", 1, 2, 0},
    {"{]", 1, 1, 0},
    {"[}", 0, 1, 0},
    {"{\"a\": [1}", 1, 8, 0},
    {"", 1, -1, 0},
};

START_TEST(hand_picked)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const char *t = CASES[i].text;
        const size_t n = strlen(t);
        int whole;
        const size_t k = taken(t, n, CASES[i].object_only, &whole);
        const long want = CASES[i].refused < 0 ? (long)n : CASES[i].refused;
        ck_assert_msg((long)k == want, "case %zu %s: %zu bytes taken, want %ld", i, t, k, want);
        ck_assert_msg(whole == CASES[i].whole, "case %zu %s: whole %d, want %d", i, t, whole, CASES[i].whole);
        if (ws_conforms(t, n))
            ck_assert_msg(whole == jansson_parses(t, n, CASES[i].object_only), "case %zu %s: jansson disagrees", i, t);
    }
}
END_TEST

START_TEST(limits)
{
    char buf[512];
    int whole;
    /* TP_JSON_MAX_DEPTH arrays nest, one more is refused */
    size_t n = 0;
    for (int i = 0; i < TP_JSON_MAX_DEPTH; i++) buf[n++] = '[';
    for (int i = 0; i < TP_JSON_MAX_DEPTH; i++) buf[n++] = ']';
    ck_assert_uint_eq(taken(buf, n, 0, &whole), n);
    ck_assert(whole);
    n = 0;
    for (int i = 0; i <= TP_JSON_MAX_DEPTH; i++) buf[n++] = '[';
    ck_assert_uint_eq(taken(buf, n, 0, &whole), TP_JSON_MAX_DEPTH);
    /* a newline and TP_JSON_MAX_INDENT indents in a run, one more is refused; a token ends the run */
    n = 0;
    buf[n++] = '{';
    for (int k = 0; k < 2; k++) {
        buf[n++] = '\n';
        for (int i = 0; i < TP_JSON_MAX_INDENT; i++) buf[n++] = i % 3 ? ' ' : '\t';
        buf[n++] = k ? '}' : '"';
        if (!k) memcpy(buf + n, "a\": 1", 5), n += 5;
    }
    buf[n++] = ' ';
    ck_assert_uint_eq(taken(buf, n, 1, &whole), n);
    ck_assert(whole);
    buf[n++] = ' ';
    ck_assert_uint_eq(taken(buf, n, 1, &whole), n - 1);
    /* a state that refuses a byte is left as it was */
    tp_json_prefix p, q;
    tp_json_prefix_init(&p, 1);
    ck_assert_uint_eq(tp_json_prefix_feed_n(&p, "{\"a\":", 5), 5);
    q = p;
    ck_assert(!tp_json_prefix_feed(&p, '}'));
    ck_assert(memcmp(&p, &q, sizeof p) == 0);
}
END_TEST

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static json_t *random_value(int depth)
{
    static const char *const strings[] = {"", "a", "key", "quote \" and \\ slash /", "tab\tnew\nline", "\xc3\xa9t\xc3\xa9",
                                          "\xe2\x9c\x93 check", "emoji \xf0\x9f\x98\x80", "nul \\u0000?", "\x7f del",
                                          "ctl \x01\x1f"};
    const uint32_t k = next_rand() % (depth < 4 ? 9 : 6);
    switch (k) {
    case 0: return json_true();
    case 1: return json_false();
    case 2: return json_null();
    case 3: return json_integer((json_int_t)(int32_t)next_rand() >> (next_rand() % 31));
    case 4: return json_real((double)(int32_t)next_rand() / 1024.0);
    case 5: return json_string(strings[next_rand() % (sizeof strings / sizeof strings[0])]);
    case 6:
    case 7: {
        json_t *a = json_array();
        for (uint32_t i = next_rand() % 4; i > 0; i--) json_array_append_new(a, random_value(depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        char key[16];
        for (uint32_t i = next_rand() % 4; i > 0; i--) {
            snprintf(key, sizeof key, "k%u\xc3\xa9", next_rand() % 100);
            json_object_set_new(o, key, random_value(depth + 1));
        }
        return o;
    }
    }
}

/* jansson's dump of a random value: indented or compact, ASCII-escaped (surrogate pairs) or not */
static char *random_text(int object_only)
{
    json_t *v = object_only ? json_object() : random_value(0);
    if (object_only)
        for (uint32_t i = 1 + next_rand() % 4; i > 0; i--) {
            char key[16];
            snprintf(key, sizeof key, "f%u", next_rand() % 50);
            json_object_set_new(v, key, random_value(1));
        }
    const size_t flags = (next_rand() % 2 ? JSON_INDENT(next_rand() % 3) : JSON_COMPACT) |
                         (next_rand() % 2 ? JSON_ENSURE_ASCII : 0) | JSON_ENCODE_ANY;
    char *s = json_dumps(v, flags);
    json_decref(v);
    return s;
}

START_TEST(random_texts)
{
    static const char edit_bytes[] = "{}[]:,\" \n0123456789-+.eEtrufalsn\\u/\x01\xc3\xa9\xed\xa0\x80";
    char buf[8192];
    for (int i = 0; i < 3000; i++) {
        const int object_only = i % 2;
        char *s = random_text(object_only);
        const size_t n = strlen(s);
        ck_assert(n < sizeof buf - 2);
        int whole;
        ck_assert_msg(taken(s, n, object_only, &whole) == n && whole, "jansson's dump refused: %s", s);
        /* one byte inserted, deleted or replaced */
        for (int e = 0; e < 8; e++) {
            const size_t at = next_rand() % (n + 1);
            const char b = edit_bytes[next_rand() % (sizeof edit_bytes - 1)];
            size_t m = 0;
            const int kind = next_rand() % 3;
            memcpy(buf, s, at);
            m = at;
            if (kind != 1) buf[m++] = b;
            const size_t rest = kind == 0 ? at : at + 1;
            if (rest < n) {
                memcpy(buf + m, s + rest, n - rest);
                m += n - rest;
            }
            taken(buf, m, object_only, &whole);
            if (!ws_conforms(buf, m)) {
                ck_assert_msg(!whole, "edited text (%d at %zu) breaks the whitespace rule, and is taken: %.*s", kind, at,
                              (int)m, buf);
                continue;
            }
            const int parses = jansson_parses(buf, m, object_only);
            if (parses < 0) continue;
            ck_assert_msg(whole == parses, "edited text (%d at %zu): recognizer %d, jansson %d: %.*s", kind, at, whole,
                          parses, (int)m, buf);
        }
        free(s);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("json_prefix");
    TCase *tc = tcase_create("json_prefix");
    tcase_add_test(tc, hand_picked);
    tcase_add_test(tc, limits);
    tcase_add_test(tc, random_texts);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    const int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
