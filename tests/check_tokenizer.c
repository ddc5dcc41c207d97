/*
 * check_tokenizer.c: the tokenizer against Hugging Face references (every case of every
 * reference/tokens.json under $TPINFER_SHARED, default ../shared), streaming detokenization,
 * bad input (invalid UTF-8, malformed tokenizer.json files built here) and tokenize mode.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "chat_template.h"
#include "tiny_tokenizer.h"
#include "tokenize_mode.h"
#include "tokenizer.h"
#include "unicode.h"
#include "util.h"

static const char *shared_dir(void)
{
    const char *s = getenv("TPINFER_SHARED");
    return s && *s ? s : "../shared";
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int ids_equal(const tp_ids *ids, json_t *ref)
{
    if (!json_is_array(ref) || json_array_size(ref) != ids->n) return 0;
    for (size_t i = 0; i < ids->n; i++)
        if (json_integer_value(json_array_get(ref, i)) != ids->v[i]) return 0;
    return 1;
}

static int str_equal(const char *s, size_t n, json_t *ref)
{
    return json_is_string(ref) && json_string_length(ref) == n && memcmp(json_string_value(ref), s, n) == 0;
}

/* Streamed pieces concatenated must equal the full decode. */
static int stream_equal(const tp_tokenizer *tok, const tp_ids *ids, int skip)
{
    char *full;
    size_t full_len, n = 0;
    if (tp_tokenizer_decode(tok, ids->v, ids->n, skip, &full, &full_len) != TP_OK) return 0;
    tp_detok_stream *ds;
    int ok = tp_detok_stream_create(tok, skip, &ds) == TP_OK;
    for (size_t i = 0; ok && i <= ids->n; i++) {
        const char *t;
        size_t tl;
        tp_status st = i < ids->n ? tp_detok_stream_push(ds, ids->v[i], &t, &tl) : tp_detok_stream_finish(ds, &t, &tl);
        ok = st == TP_OK && n + tl <= full_len && memcmp(full + n, t, tl) == 0;
        /* Every piece handed out is whole UTF-8. */
        ok = ok && tp_utf8_valid(t, tl, NULL);
        n += tl;
    }
    ok = ok && n == full_len;
    tp_detok_stream_destroy(ds);
    free(full);
    return ok;
}

static json_t *ids_of(json_t *arr, tp_ids *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < json_array_size(arr); i++) tp_ids_push(out, (int32_t)json_integer_value(json_array_get(arr, i)));
    return arr;
}

/* Check one directory with tokenizer.json and reference/tokens.json; returns mismatches. */
static int check_dir(const char *dir)
{
    char *ref_path = tp_path_join(dir, "reference/tokens.json");
    int bad = 0;
    json_error_t err;
    json_t *ref = is_file(ref_path) ? json_load_file(ref_path, JSON_ALLOW_NUL, &err) : NULL;
    free(ref_path);
    if (!ref) return 0;
    tp_tokenizer *tok;
    tp_status st = tp_tokenizer_load(dir, &tok);
    ck_assert_msg(st == TP_OK, "%s: %s", dir, tp_error_message());
    json_t *cases = json_object_get(ref, "cases");
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *jt = json_object_get(c, "text");
        const char *text = json_string_value(jt);
        size_t tl = json_string_length(jt);
        tp_ids ids = {0}, ns = {0}, ref_ns;
        ck_assert_int_eq(tp_tokenizer_encode(tok, text, tl, 1, &ids), TP_OK);
        ck_assert_int_eq(tp_tokenizer_encode(tok, text, tl, 0, &ns), TP_OK);
        int ok = ids_equal(&ids, json_object_get(c, "ids")) && ids_equal(&ns, json_object_get(c, "ids_no_special"));
        json_t *toks = json_object_get(c, "tokens_no_special");
        for (size_t k = 0; ok && k < ns.n && toks; k++) {
            size_t len;
            const char *t = tp_tokenizer_id_to_token(tok, ns.v[k], &len);
            ok = t && str_equal(t, len, json_array_get(toks, k));
        }
        static const char *const keys[] = {"decode", "decode_skip_special", "decode_no_special"};
        for (int d = 0; ok && d < 3; d++) {
            ids_of(json_object_get(c, d == 2 ? "ids_no_special" : "ids"), &ref_ns);
            char *s;
            size_t n;
            ok = tp_tokenizer_decode(tok, ref_ns.v, ref_ns.n, d == 1, &s, &n) == TP_OK &&
                 str_equal(s, n, json_object_get(c, keys[d]));
            if (ok) free(s);
            ok = ok && stream_equal(tok, &ref_ns, d == 1);
            tp_ids_free(&ref_ns);
        }
        if (!ok && ++bad <= 3) fprintf(stderr, "%s: case %zu differs: %.80s\n", dir, i, text);
        tp_ids_free(&ids);
        tp_ids_free(&ns);
    }
    json_t *chat = json_object_get(ref, "chat");
    if (chat) {
        tp_chat_template *tpl;
        const char *src = tp_tokenizer_chat_template(tok);
        ck_assert_msg(src != NULL, "%s: reference has a chat rendering but the model no template", dir);
        ck_assert_msg(tp_chat_template_create(src, strlen(src), &tpl) == TP_OK, "%s", tp_error_message());
        char *s;
        size_t n;
        ck_assert_msg(tp_chat_template_apply(tpl, json_object_get(chat, "messages"), NULL,
                                             json_is_true(json_object_get(chat, "add_generation_prompt")),
                                             tp_tokenizer_bos_token(tok), tp_tokenizer_eos_token(tok), &s,
                                             &n) == TP_OK,
                      "%s", tp_error_message());
        ck_assert_msg(str_equal(s, n, json_object_get(chat, "text")), "%s: chat rendering differs:\n%s", dir, s);
        tp_ids ids = {0};
        ck_assert_int_eq(tp_tokenizer_encode(tok, s, n, 0, &ids), TP_OK);
        ck_assert_msg(ids_equal(&ids, json_object_get(chat, "ids")), "%s: chat ids differ", dir);
        tp_ids_free(&ids);
        free(s);
        tp_chat_template_destroy(tpl);
    }
    tp_tokenizer_destroy(tok);
    json_decref(ref);
    return bad;
}

static void check_all_in(const char *sub)
{
    char *base = tp_path_join(shared_dir(), sub);
    DIR *d = opendir(base);
    if (!d) {
        fprintf(stderr, "check_tokenizer: SKIP references: no %s (set TPINFER_SHARED)\n", base);
        free(base);
        return;
    }
    struct dirent *e;
    int bad = 0, dirs = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *dir = tp_path_join(base, e->d_name);
        char *tj = tp_path_join(dir, "tokenizer.json");
        if (is_dir(dir) && is_file(tj)) {
            bad += check_dir(dir);
            dirs++;
        }
        free(tj);
        free(dir);
    }
    closedir(d);
    free(base);
    ck_assert_msg(bad == 0, "%d reference cases differ in %s", bad, sub);
    fprintf(stderr, "check_tokenizer: %d tokenizers under %s match their references\n", dirs, sub);
}

START_TEST(test_models_reference) { check_all_in("models"); }
END_TEST

START_TEST(test_tokenizers_reference) { check_all_in("tokenizers"); }
END_TEST

// ----------------------------------------------------------------------------
// a small tokenizer built here, and malformed variants of it

#define BASE TINY_TOKENIZER_JSON

static tp_status load_variant(const char *path, json_t *value, tp_tokenizer **tok)
{
    json_t *root = json_loads(BASE, 0, NULL);
    ck_assert_ptr_nonnull(root);
    /* path: "model.merges" style, last component set to value (NULL: deleted) */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *obj = root;
    char *save, *part = strtok_r(buf, ".", &save), *next;
    while ((next = strtok_r(NULL, ".", &save))) {
        obj = json_object_get(obj, part);
        part = next;
    }
    if (value) json_object_set_new(obj, part, value);
    else json_object_del(obj, part);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    tp_error_clear();
    tp_status st = tp_tokenizer_load_json(s, strlen(s), NULL, 0, tok);
    free(s);
    return st;
}

START_TEST(test_small_tokenizer)
{
    tp_tokenizer *tok;
    tp_error_clear();
    ck_assert_msg(tp_tokenizer_load_json(BASE, strlen(BASE), NULL, 0, &tok) == TP_OK, "%s", tp_error_message());
    tp_ids ids = {0};
    ck_assert_int_eq(tp_tokenizer_encode(tok, "abc", 3, 1, &ids), TP_OK);
    ck_assert_uint_eq(ids.n, 2);
    ck_assert_int_eq(ids.v[0], 6);
    ck_assert_int_eq(ids.v[1], 4);
    ids.n = 0;
    /* Empty text: only what the post-processor adds. */
    ck_assert_int_eq(tp_tokenizer_encode(tok, "", 0, 1, &ids), TP_OK);
    ck_assert_uint_eq(ids.n, 1);
    ids.n = 0;
    ck_assert_int_eq(tp_tokenizer_encode(tok, "", 0, 0, &ids), TP_OK);
    ck_assert_uint_eq(ids.n, 0);
    /* Invalid UTF-8 is refused with a message that says so. */
    static const char *const bad[] = {"a\xff", "\xc0\xaf", "\xed\xa0\x80", "ab\xe4\xb8", "\xf4\x90\x80\x80"};
    for (size_t i = 0; i < 5; i++) {
        tp_error_clear();
        ck_assert_int_eq(tp_tokenizer_encode(tok, bad[i], strlen(bad[i]), 1, &ids), TP_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(tp_error_message(), "UTF-8"));
        ck_assert_uint_eq(ids.n, 0);
    }
    /* Characters with no token and no unk_token vanish, as in HF. */
    ck_assert_int_eq(tp_tokenizer_encode(tok, "xyz", 3, 0, &ids), TP_OK);
    ck_assert_uint_eq(ids.n, 0);
    tp_ids_free(&ids);
    tp_tokenizer_destroy(tok);
}
END_TEST

START_TEST(test_malformed)
{
    /* each refused with a message; where needle is given, one that names what is wrong */
    struct {
        const char *path;
        const char *json; /* NULL: delete */
        const char *needle;
    } cases[] = {
        {"model.merges", "[\"ab\"]", NULL},                 /* no space */
        {"model.merges", "[\"a b c\"]", NULL},              /* three parts */
        {"model.merges", "[[\"a\"]]", NULL},                /* array of one */
        {"model.merges", "[42]", NULL},
        {"model.merges", "[\"a zz\"]", NULL},               /* unknown token */
        {"model.merges", "[\"b c\"]", NULL},                /* merged token "bc" missing */
        {"model.merges", "\"a b\"", NULL},
        {"model.vocab", "{\"a\":0,\"b\":0,\"ab\":2,\"c\":3,\"abc\":4}", NULL},  /* duplicate ids */
        {"model.vocab", "{\"a\":-1,\"b\":1,\"ab\":2,\"c\":3,\"abc\":4}", NULL}, /* negative id */
        {"model.vocab", "{\"a\":0,\"b\":1,\"ab\":2,\"c\":3,\"abc\":99999999999}", NULL},
        {"model.vocab", "[\"a\"]", NULL},
        {"model.vocab", NULL, NULL},
        {"model", NULL, NULL},
        {"model.type", "\"WordPiece\"", NULL},
        {"model.type", "\"Unigram\"", NULL},
        {"model.dropout", "0.1", NULL},
        {"model.unk_token", "\"<unk>\"", NULL}, /* not in the vocabulary */
        {"normalizer", "{\"type\":\"BertNormalizer\"}", NULL},
        {"normalizer", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Precompiled\"}]}", NULL},
        {"normalizer", "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"(\"},\"content\":\"x\"}", NULL},
        {"pre_tokenizer", "{\"type\":\"Punctuation\"}", NULL},
        {"pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a-\"},\"behavior\":\"Isolated\",\"invert\":false}", NULL},
        {"pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Sideways\",\"invert\":false}", NULL},
        {"pre_tokenizer", "{\"type\":\"ByteLevel\",\"mystery\":1}", NULL},
        {"pre_tokenizer", "{\"no_type\":1}", NULL},
        {"post_processor", "{\"type\":\"Hypothetical\"}", NULL},
        {"post_processor", "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<q>\",\"type_id\":0}}],"
                           "\"pair\":[],\"special_tokens\":{}}", NULL},
        {"post_processor", "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
                           "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{\"<s>\":"
                           "{\"id\":\"<s>\",\"ids\":[500],\"tokens\":[\"<s>\"]}}}", NULL},
        {"decoder", "{\"type\":\"CTC\"}", NULL},
        {"decoder", "{\"type\":\"Strip\",\"content\":\"ab\",\"start\":1,\"stop\":0}", NULL},
        {"added_tokens", "[{\"id\":999,\"content\":\"<x>\",\"special\":true}]", NULL},        /* id beyond vocab */
        {"added_tokens", "[{\"id\":6,\"content\":\"\",\"special\":true}]", NULL},             /* empty content */
        {"added_tokens", "[{\"id\":6,\"content\":\"<x>\"},{\"id\":7,\"content\":\"<x>\"}]", NULL}, /* two ids */
        {"added_tokens", "[{\"id\":0,\"content\":\"b\"}]", NULL},                           /* vocab says 1 */
        {"added_tokens", "{}", NULL},
        {"truncation", "{\"max_length\":8}", NULL},
        {"padding", "{\"strategy\":{\"Fixed\":8}}", NULL},
        {"surprise", "1", NULL},
        {"pre_tokenizer", "[1]", "a pre_tokenizer must be an object, not an array"},
        {"pre_tokenizer", "{\"type\":\"Sequence\"}", "pre_tokenizer Sequence needs a \"pretokenizers\" array"},
        {"pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Glob\":\"*\"},\"behavior\":\"Isolated\",\"invert\":false}",
         "pattern must be {\"String\": ...} or {\"Regex\": ...}"},
        {"pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\\u0000b\"},\"behavior\":\"Isolated\",\"invert\":false}",
         "regex contains a NUL character"},
        {"pre_tokenizer", "{\"type\":\"Metaspace\",\"replacement\":\"ab\",\"prepend_scheme\":\"always\",\"split\":true}",
         "replacement must be exactly one character"},
        {"pre_tokenizer", "{\"type\":\"Metaspace\",\"replacement\":\"_\",\"prepend_scheme\":\"sometimes\",\"split\":true}",
         "prepend_scheme must be always, first or never"},
        {"post_processor", "\"TemplateProcessing\"", "a post_processor must be an object, not a string"},
        {"post_processor", "{\"type\":\"Sequence\"}", "post_processor Sequence needs a \"processors\" array"},
        {"post_processor", "{\"type\":\"TemplateProcessing\",\"pair\":[],\"special_tokens\":{}}",
         "TemplateProcessing needs a \"single\" array and a \"special_tokens\" object"},
        {"post_processor", "{\"type\":\"TemplateProcessing\",\"single\":[],\"pair\":[],\"special_tokens\":{}}",
         "TemplateProcessing \"single\" has no Sequence A"},
        {"post_processor", "{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"B\",\"type_id\":0}}],"
                           "\"pair\":[],\"special_tokens\":{}}",
         "TemplateProcessing \"single\" must hold sequence A exactly once"},
        {"post_processor", "{\"type\":\"BertProcessing\",\"cls\":[\"<s>\"],\"sep\":[\"</s>\",2]}",
         "needs \"cls\" and \"sep\" as [token, id]"},
        {"added_tokens", "[{\"id\":\"6\",\"content\":\"<x>\"}]", "added token \"<x>\" has no valid \"id\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *v = NULL;
        if (cases[i].json) {
            v = json_loads(cases[i].json, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            ck_assert_msg(v != NULL, "bad test json %zu", i);
        }
        tp_tokenizer *tok = NULL;
        tp_status st = load_variant(cases[i].path, v, &tok);
        ck_assert_msg(st != TP_OK, "case %zu (%s = %s) was accepted", i, cases[i].path,
                      cases[i].json ? cases[i].json : "deleted");
        ck_assert_ptr_null(tok);
        ck_assert_msg(strlen(tp_error_message()) > 10, "case %zu has no message", i);
        ck_assert_msg(!cases[i].needle || strstr(tp_error_message(), cases[i].needle), "case %zu: '%s' lacks '%s'", i,
                      tp_error_message(), cases[i].needle);
    }
    /* tokenizer_config.json beside it */
    static const char *const configs[][2] = {
        {"[]", "tokenizer_config.json: the top level must be an object"},
        {"{\"bos_token\":5}", "tokenizer_config.json: \"bos_token\" must be a string, an object with \"content\", or null"},
        {"{\"eos_token\":{\"content\":[1]}}", "\"eos_token\" must be a string"},
        {"{\"chat_template\":{\"default\":\"x\"}}", "tokenizer_config.json: \"chat_template\" must be a string"},
        {"{\"bos_token\":\"<nope>\"}", "tokenizer_config.json: bos_token \"<nope>\" is not a token"},
    };
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        tp_tokenizer *tok = NULL;
        tp_error_clear();
        ck_assert_msg(tp_tokenizer_load_json(BASE, strlen(BASE), configs[i][0], strlen(configs[i][0]), &tok) != TP_OK,
                      "config %zu accepted", i);
        ck_assert_ptr_null(tok);
        ck_assert_msg(strstr(tp_error_message(), configs[i][1]), "config %zu: '%s' lacks '%s'", i, tp_error_message(),
                      configs[i][1]);
    }

    /* Byte-fallback tokens that are not <0xHH>. */
    static const char *const bytes[] = {"<0x-1>", "<0xZZ>", "<0x100>", "<0x>", "<0x4g>", "<0xab>"};
    for (size_t i = 0; i < 6; i++) {
        json_t *root = json_loads(BASE, 0, NULL);
        json_t *model = json_object_get(root, "model");
        json_object_set_new(model, "byte_fallback", json_true());
        json_object_set_new(json_object_get(model, "vocab"), bytes[i], json_integer(7));
        json_object_set_new(json_array_get(json_object_get(root, "added_tokens"), 0), "id", json_integer(7));
        char *s = json_dumps(root, JSON_COMPACT);
        tp_tokenizer *tok = NULL;
        tp_error_clear();
        ck_assert_msg(tp_tokenizer_load_json(s, strlen(s), NULL, 0, &tok) == TP_ERR_FORMAT, "%s accepted", bytes[i]);
        ck_assert_ptr_nonnull(strstr(tp_error_message(), "byte-fallback"));
        free(s);
        json_decref(root);
    }
    /* Truncated and otherwise broken JSON, at every length of a prefix. */
    size_t n = strlen(BASE);
    for (size_t cut = 0; cut < n; cut += 7) {
        tp_tokenizer *tok = NULL;
        tp_error_clear();
        ck_assert_int_eq(tp_tokenizer_load_json(BASE, cut, NULL, 0, &tok), TP_ERR_FORMAT);
        ck_assert_ptr_null(tok);
    }
    static const char *const junk[] = {"", "[]", "42", "null", "{\"model\":1}", "{\"a\":1,\"a\":2}", "\xff"};
    for (size_t i = 0; i < 7; i++) {
        tp_tokenizer *tok = NULL;
        tp_error_clear();
        ck_assert_int_ne(tp_tokenizer_load_json(junk[i], strlen(junk[i]), NULL, 0, &tok), TP_OK);
    }
}
END_TEST

static tp_tokenizer *load_shared(const char *sub)
{
    char *dir = tp_path_join(shared_dir(), sub);
    tp_tokenizer *tok = NULL;
    if (is_dir(dir)) ck_assert_msg(tp_tokenizer_load(dir, &tok) == TP_OK, "%s", tp_error_message());
    else fprintf(stderr, "check_tokenizer: SKIP: no %s (set TPINFER_SHARED)\n", dir);
    free(dir);
    return tok;
}

START_TEST(test_big_prompt)
{
    tp_tokenizer *tok = load_shared("tokenizers/gpt2");
    if (!tok) return;
    static const char *const parts[] = {"Hello world, ", "ça va? ", "中文 ", "😀 ", "\n\n", "   ", "1234 ", "x'll "};
    size_t n = 1 << 20;
    char *text = malloc(n + 16);
    size_t o = 0;
    for (unsigned i = 0; o < n; i = i * 7 + 3) {
        const char *p = parts[i % 8];
        memcpy(text + o, p, strlen(p));
        o += strlen(p);
    }
    tp_ids ids = {0};
    ck_assert_int_eq(tp_tokenizer_encode(tok, text, o, 0, &ids), TP_OK);
    ck_assert_uint_gt(ids.n, 100000);
    char *back;
    size_t blen;
    ck_assert_int_eq(tp_tokenizer_decode(tok, ids.v, ids.n, 0, &back, &blen), TP_OK);
    ck_assert_uint_eq(blen, o);
    ck_assert(memcmp(back, text, o) == 0);
    free(back);
    free(text);
    tp_ids_free(&ids);
    tp_tokenizer_destroy(tok);
}
END_TEST

START_TEST(test_stream_utf8)
{
    /* Mistral spells a rare character with byte-fallback tokens; the stream holds them
     * back until the character is whole. */
    tp_tokenizer *tok = load_shared("tokenizers/mistral-7b-v0.1");
    if (!tok) return;
    tp_ids ids = {0};
    const char *text = "a \xf0\x9f\xab\xa0 b"; /* U+1FAE0 */
    ck_assert_int_eq(tp_tokenizer_encode(tok, text, strlen(text), 0, &ids), TP_OK);
    tp_detok_stream *ds;
    ck_assert_int_eq(tp_detok_stream_create(tok, 0, &ds), TP_OK);
    char out[64];
    size_t o = 0;
    for (size_t i = 0; i < ids.n; i++) {
        const char *t;
        size_t tl;
        ck_assert_int_eq(tp_detok_stream_push(ds, ids.v[i], &t, &tl), TP_OK);
        ck_assert(tp_utf8_valid(t, tl, NULL));
        ck_assert(tl == 0 || memchr(t, 0xEF, tl) == NULL); /* never a U+FFFD placeholder */
        memcpy(out + o, t, tl);
        o += tl;
    }
    const char *t;
    size_t tl;
    ck_assert_int_eq(tp_detok_stream_finish(ds, &t, &tl), TP_OK);
    memcpy(out + o, t, tl);
    o += tl;
    ck_assert_uint_eq(o, strlen(text));
    ck_assert(memcmp(out, text, o) == 0);
    tp_detok_stream_destroy(ds);
    tp_detok_stream_destroy(NULL);
    tp_ids_free(&ids);
    tp_tokenizer_destroy(tok);
}
END_TEST

START_TEST(test_stream_dropped_ids)
{
    /* A run of byte-fallback tokens goes on across an id the decode drops (a special token
     * skipped, an id past the tokenizer's vocabulary: a model's padded embedding can sample
     * one): the stream must hold the run back over it, or it hands out a byte that the run
     * later turns into U+FFFD and loses the rest. Expected strings: Hugging Face tokenizers
     * 0.23's decode of the same ids. */
    tp_tokenizer *tok = load_shared("tokenizers/mistral-7b-v0.1");
    if (!tok) return;
    static const struct {
        int32_t ids[5];
        size_t n;
        int skip;
        const char *hf;
    } cases[] = {
        {{2048, 111, 2, 255}, 4, 1, "ocument\xef\xbf\xbd\xef\xbf\xbd"},   /* </s> skipped: <0x6C><0xFC> one run */
        {{2048, 111, 1, 231, 180}, 5, 1, "ocument\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {{2048, 111, 40000, 255}, 4, 1, "ocument\xef\xbf\xbd\xef\xbf\xbd"}, /* no token 40000 */
        {{2048, 111, 40000, 255}, 4, 0, "ocument\xef\xbf\xbd\xef\xbf\xbd"},
        {{231, 2, 180, 164}, 4, 1, "\xe4\xb1\xa1"},                           /* a whole character across </s> */
        {{2048, 111, 2, 2048}, 4, 1, "ocumentlocument"},
        {{2048, 111, 2, 255}, 4, 0, "ocumentl</s>\xef\xbf\xbd"},              /* </s> kept: it ends the run */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tp_ids ids = {0};
        for (size_t i = 0; i < cases[c].n; i++) tp_ids_push(&ids, cases[c].ids[i]);
        char *whole;
        size_t n;
        ck_assert_int_eq(tp_tokenizer_decode(tok, ids.v, ids.n, cases[c].skip, &whole, &n), TP_OK);
        ck_assert_msg(n == strlen(cases[c].hf) && memcmp(whole, cases[c].hf, n) == 0, "case %zu: decode", c);
        ck_assert_msg(stream_equal(tok, &ids, cases[c].skip), "case %zu: the stream differs from the decode", c);
        free(whole);
        tp_ids_free(&ids);
    }
    tp_tokenizer_destroy(tok);
}
END_TEST

static char *slurp(const char *path)
{
    char *s;
    size_t n;
    ck_assert_int_eq(tp_read_file(path, 1 << 20, &s, &n), TP_OK);
    return s;
}

START_TEST(test_tokenize_mode)
{
    char *dir = tp_path_join(shared_dir(), "models/tiny-qwen2");
    if (!is_dir(dir)) {
        fprintf(stderr, "check_tokenizer: SKIP tokenize mode: no %s\n", dir);
        free(dir);
        return;
    }
    char in[] = "/tmp/tp_tokmode_in_XXXXXX", out[] = "/tmp/tp_tokmode_out_XXXXXX";
    int fi = mkstemp(in), fo = mkstemp(out);
    ck_assert(fi >= 0 && fo >= 0);
    close(fo);
    const char *lines = "{\"text\": \"Hello world\"}\n"
                        "\n"
                        "{\"text\": \"Hello world\", \"add_special_tokens\": false}\n"
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": true}\n"
                        "not json\n"
                        "{\"text\": 5}\n"
                        "{\"text\": \"a\\u0000b\"}\r\n";
    ck_assert(write(fi, lines, strlen(lines)) == (ssize_t)strlen(lines));
    close(fi);
    tp_error_clear();
    ck_assert_int_eq(tp_tokenize_run(dir, in, out, 0, NULL), TP_ERR_INVALID_ARG);
    char *got = slurp(out);
    ck_assert_msg(strstr(got, "{\"error\":{\"line\":5,") != NULL, "%s", got);
    ck_assert_msg(strstr(got, "{\"error\":{\"line\":6,") != NULL, "%s", got);
    ck_assert_msg(strstr(got, "\"text\":\"<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n"
                              "<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n\"") != NULL,
                  "%s", got);
    int count = 0;
    for (char *p = got; *p; p++) count += *p == '\n';
    ck_assert_int_eq(count, 6);
    free(got);
    /* Detokenize round trip of the first line's ids. */
    FILE *f = fopen(in, "w");
    fputs("{\"ids\": [9707, 1879]}\n{\"ids\": [1000, 72], \"skip_special_tokens\": true}\n{\"ids\": [-1]}\n", f);
    fclose(f);
    ck_assert_int_eq(tp_tokenize_run(dir, in, out, 1, NULL), TP_ERR_INVALID_ARG);
    got = slurp(out);
    ck_assert_msg(strstr(got, "{\"error\":{\"line\":3,") != NULL, "%s", got);
    free(got);
    unlink(in);
    unlink(out);
    free(dir);
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *ref = tcase_create("reference");
    tcase_set_timeout(ref, 300);
    tcase_add_test(ref, test_models_reference);
    tcase_add_test(ref, test_tokenizers_reference);
    suite_add_tcase(s, ref);
    TCase *bad = tcase_create("bad_input");
    tcase_set_timeout(bad, 120);
    tcase_add_test(bad, test_small_tokenizer);
    tcase_add_test(bad, test_malformed);
    tcase_add_test(bad, test_big_prompt);
    suite_add_tcase(s, bad);
    TCase *str = tcase_create("stream_and_mode");
    tcase_add_test(str, test_stream_utf8);
    tcase_add_test(str, test_stream_dropped_ids);
    tcase_add_test(str, test_tokenize_mode);
    suite_add_tcase(s, str);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tokenizer_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
