/*
 * check_mutations.c: every parser of a file a user gives (safetensors and the shards'
 * index, config.json, generation_config.json, tokenizer.json and tokenizer_config.json, a
 * chat template, prompt files in each format, an output and its manifest to resume)
 * against thousands of randomly mutated copies of a valid input: bytes flipped or set to
 * JSON punctuation, spans deleted, duplicated or cut off, numbers made huge. Each copy is
 * accepted or refused with a message; never a crash, an out-of-bounds access or a leak
 * (CI runs this under AddressSanitizer), and what is accepted can be used: a tokenizer
 * encodes and decodes, a template renders, a safetensors image reads every tensor.
 * MUTATIONS=N sets the copies per parser (default 5000); a failing copy names its seed.
 */
#include <check.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "model_config.h"
#include "output.h"
#include "requests.h"
#include "safetensors.h"
#include "st_builder.h"
#include "status.h"
#include "test_random.h"
#include "tiny_tokenizer.h"
#include "tokenizer.h"
#include "weights.h"

/* ---------------------------------------------------------------------------
 * mutations */

static int copies(void)
{
    const char *v = getenv("MUTATIONS");
    return v && atoi(v) > 0 ? atoi(v) : 5000;
}

/* base[0, n) with 1-4 random edits, malloc'ed (one spare NUL byte past *len). */
static char *mutate(const char *base, size_t n, size_t *len)
{
    static const char punct[] = "{}[]\":,\\0-9e.nt \xff\x80";
    size_t cap = 2 * n + 64, m = n;
    char *s = malloc(cap + 1);
    memcpy(s, base, n);
    for (int edits = 1 + rand_int(4); edits > 0; edits--) {
        const size_t at = m ? (size_t)rand_int((int)m) : 0;
        switch (rand_int(7)) {
        case 0: /* flip bits */
            if (m) s[at] ^= (char)(1 + rand_int(255));
            break;
        case 1: /* a JSON character */
            if (m) s[at] = punct[rand_int((int)sizeof punct - 1)];
            break;
        case 2: { /* delete a span */
            size_t k = 1 + (size_t)rand_int(16);
            if (at + k > m) k = m - at;
            memmove(s + at, s + at + k, m - at - k);
            m -= k;
            break;
        }
        case 3: { /* duplicate a span of the base at a random place */
            size_t from = n ? (size_t)rand_int((int)n) : 0, k = 1 + (size_t)rand_int(32);
            if (from + k > n) k = n - from;
            if (m + k > cap) break;
            memmove(s + at + k, s + at, m - at);
            memcpy(s + at, base + from, k);
            m += k;
            break;
        }
        case 4: /* cut off */
            m = at;
            break;
        case 5: { /* a digit becomes a number at a range's edge */
            static const char *const nums[] = {"99999999999999999999", "-1", "1e308", "-0", "4294967296", "0"};
            const char *d = memchr(s + at, '0' + rand_int(10), m - at);
            const char *num = nums[rand_int(6)];
            const size_t k = strlen(num);
            if (!d || m + k > cap) break;
            const size_t p = (size_t)(d - s);
            memmove(s + p + k, s + p + 1, m - p - 1);
            memcpy(s + p, num, k);
            m += k - 1;
            break;
        }
        default: /* a NUL byte */
            if (m) s[at] = '\0';
            break;
        }
    }
    s[m] = '\0';
    *len = m;
    return s;
}

/* Accepted, or refused with a message: a status of the file-problem kinds. */
static void check_outcome(tp_status st, const char *what, uint64_t sd)
{
    if (st == TP_OK) return;
    ck_assert_msg(st == TP_ERR_FORMAT || st == TP_ERR_UNSUPPORTED || st == TP_ERR_INVALID_ARG || st == TP_ERR_IO,
                  "%s, seed %llu: status %s (%s)", what, (unsigned long long)sd, tp_status_str(st),
                  tp_error_message());
    ck_assert_msg(strlen(tp_error_message()) > 5, "%s, seed %llu: refused without a message", what,
                  (unsigned long long)sd);
}

static void report(const char *what, int accepted)
{
    printf("  %-24s %5d of %d mutated copies accepted (and used), the rest refused with a message\n", what, accepted,
           copies());
}

/* Each copy gets its own seed, so a failure can be replayed alone. */
#define FOR_EACH_COPY(sd, base_seed)                                             \
    for (uint64_t sd = (base_seed), end_ = (base_seed) + (uint64_t)copies(); sd < end_; sd++) \
        if ((seed(sd), tp_error_clear(), 1))

/* ---------------------------------------------------------------------------
 * safetensors */

START_TEST(safetensors_images)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {1, 2, 3, 4};
    stb_tensor t[] = {{"model.a", "F32", 2, {2, 3}, a, sizeof a}, {"model.b", "BF16", 1, {4}, b, sizeof b}};
    size_t n = 0;
    unsigned char *img = stb_build(t, 2, "{\"format\":\"pt\"}", 0, &n);
    int accepted = 0;
    FOR_EACH_COPY(sd, 1000)
    {
        size_t len;
        char *m = mutate((const char *)img, n, &len);
        tp_st_file f;
        memset(&f, 0, sizeof f);
        const tp_status st = tp_st_parse_buffer(m, len, "mutated.safetensors", &f);
        check_outcome(st, "safetensors", sd);
        accepted += st == TP_OK;
        if (st == TP_OK) { /* every tensor reads whole, as f32 */
            for (size_t i = 0; i < f.n_tensors; i++) {
                const tp_st_tensor *x = &f.tensors[i];
                int64_t rows = x->rank ? x->shape[0] : 1, cols = 1;
                for (int d = 1; d < x->rank; d++) cols *= x->shape[d];
                if (rows * cols > 1 << 20) continue;
                float *out = malloc((size_t)(rows * cols > 0 ? rows * cols : 1) * sizeof *out);
                tp_slice s = {0, rows, 0, cols};
                tp_error_clear();
                check_outcome(tp_st_read_slice(&f, x, s, TP_DTYPE_F32, out), "safetensors read", sd);
                free(out);
            }
        }
        tp_st_free(&f);
        free(m);
    }
    free(img);
    report("safetensors", accepted);
}
END_TEST

START_TEST(shard_indexes)
{
    static const char INDEX[] = "{\"metadata\":{\"total_size\":1024},\"weight_map\":{\"model.a\":"
                                "\"model-00001-of-00002.safetensors\",\"model.b\":\"model-00002-of-00002.safetensors\","
                                "\"model.c\":\"model-00001-of-00002.safetensors\"}}";
    char *dir = stb_tmpdir(), path[4096];
    for (int i = 1; i <= 2; i++) { /* the shards the index names */
        snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, i);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fclose(f);
    }
    int accepted = 0;
    FOR_EACH_COPY(sd, 6000)
    {
        size_t len;
        char *m = mutate(INDEX, strlen(INDEX), &len);
        char **names = NULL;
        size_t n = 0;
        const tp_status st = tp_weights_parse_index(m, len, dir, &names, &n);
        check_outcome(st, "model.safetensors.index.json", sd);
        accepted += st == TP_OK;
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
        free(m);
    }
    stb_rmtree(dir);
    free(dir);
    report("safetensors index", accepted);
}
END_TEST

/* ---------------------------------------------------------------------------
 * config.json, generation_config.json */

static const char CONFIG[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":"
    "172,\"num_hidden_layers\":5,\"num_attention_heads\":8,\"num_key_value_heads\":4,\"vocab_size\":512,"
    "\"max_position_embeddings\":512,\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"rope_scaling\":{\"rope_type\":"
    "\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":"
    "8192},\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"bos_token_id\":1,\"eos_token_id\":[2,3],"
    "\"hidden_act\":\"silu\",\"attention_bias\":false,\"head_dim\":8}";

static const char GENERATION[] =
    "{\"bos_token_id\":1,\"eos_token_id\":[2,3],\"do_sample\":true,\"temperature\":0.6,\"top_p\":0.9,\"top_k\":50,"
    "\"repetition_penalty\":1.1,\"max_new_tokens\":256}";

START_TEST(model_configs)
{
    int accepted = 0, gen_accepted = 0;
    FOR_EACH_COPY(sd, 2000)
    {
        size_t len;
        char *m = mutate(CONFIG, strlen(CONFIG), &len);
        tp_model_config cfg;
        tp_status st = tp_model_config_parse(m, len, "mutated config.json", &cfg);
        check_outcome(st, "config.json", sd);
        accepted += st == TP_OK;
        free(m);
        tp_error_clear();
        m = mutate(GENERATION, strlen(GENERATION), &len);
        tp_generation_config gen;
        st = tp_generation_config_parse(m, len, "mutated generation_config.json", &gen);
        check_outcome(st, "generation_config.json", sd);
        gen_accepted += st == TP_OK;
        free(m);
    }
    report("config.json", accepted);
    report("generation_config.json", gen_accepted);
}
END_TEST

/* ---------------------------------------------------------------------------
 * tokenizer.json */

START_TEST(tokenizers)
{
    int accepted = 0;
    FOR_EACH_COPY(sd, 3000)
    {
        size_t len;
        char *m = mutate(TINY_TOKENIZER_JSON, strlen(TINY_TOKENIZER_JSON), &len);
        tp_tokenizer *tok = NULL;
        const tp_status st = tp_tokenizer_load_json(m, len, NULL, 0, &tok);
        check_outcome(st, "tokenizer.json", sd);
        accepted += st == TP_OK;
        if (st == TP_OK) { /* it encodes and decodes */
            static const char text[] = "abc ab c<s>cab \xc3\xa7" "a";
            tp_ids ids = {0};
            tp_error_clear();
            check_outcome(tp_tokenizer_encode(tok, text, sizeof text - 1, 1, &ids), "encode", sd);
            char *out = NULL;
            size_t n = 0;
            tp_error_clear();
            check_outcome(tp_tokenizer_decode(tok, ids.v, ids.n, 0, &out, &n), "decode", sd);
            free(out);
            tp_ids_free(&ids);
        }
        tp_tokenizer_destroy(tok);
        free(m);
    }
    report("tokenizer.json", accepted);
}
END_TEST

START_TEST(tokenizer_configs)
{
    static const char CONFIG_JSON[] =
        "{\"add_bos_token\":true,\"add_eos_token\":false,\"bos_token\":\"<s>\",\"eos_token\":{\"content\":\"</s>\","
        "\"lstrip\":false},\"model_max_length\":2048,\"added_tokens_decoder\":{\"6\":{\"content\":\"<s>\","
        "\"special\":true}},\"chat_template\":\"{% for m in messages %}{{ m['content'] }}{% endfor %}\"}";
    int accepted = 0;
    FOR_EACH_COPY(sd, 7000)
    {
        size_t len;
        char *m = mutate(CONFIG_JSON, strlen(CONFIG_JSON), &len);
        tp_tokenizer *tok = NULL;
        const tp_status st = tp_tokenizer_load_json(TINY_TOKENIZER_JSON, strlen(TINY_TOKENIZER_JSON), m, len, &tok);
        check_outcome(st, "tokenizer_config.json", sd);
        accepted += st == TP_OK;
        if (st == TP_OK) {
            tp_ids ids = {0};
            tp_error_clear();
            check_outcome(tp_tokenizer_encode(tok, "abc<s>", 6, 1, &ids), "encode", sd);
            tp_ids_free(&ids);
        }
        tp_tokenizer_destroy(tok);
        free(m);
    }
    report("tokenizer_config.json", accepted);
}
END_TEST

/* ---------------------------------------------------------------------------
 * chat templates */

static const char TEMPLATE[] =
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system + '<|eot_id|>' }}"
    "{%- for message in messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('roles must alternate') }}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    "{% for i in range(3) %}{{ i ~ ',' }}{% endfor %}{{ messages | length }}";

START_TEST(chat_templates)
{
    json_t *msgs = json_loads("[{\"role\":\"system\",\"content\":\" Be brief. \"},{\"role\":\"user\",\"content\":\"Hi\"},"
                              "{\"role\":\"assistant\",\"content\":\"Hello\"},{\"role\":\"user\",\"content\":\"Why?\"}]",
                              0, NULL);
    ck_assert_ptr_nonnull(msgs);
    int accepted = 0;
    FOR_EACH_COPY(sd, 4000)
    {
        size_t len;
        char *m = mutate(TEMPLATE, strlen(TEMPLATE), &len);
        tp_chat_template *tpl = NULL;
        const tp_status st = tp_chat_template_create(m, len, &tpl);
        check_outcome(st, "chat template", sd);
        accepted += st == TP_OK;
        if (st == TP_OK) {
            char *out = NULL;
            size_t n = 0;
            tp_error_clear();
            check_outcome(tp_chat_template_apply(tpl, msgs, NULL, 1, "<s>", "</s>", &out, &n), "render", sd);
            free(out);
        }
        tp_chat_template_destroy(tpl);
        free(m);
    }
    json_decref(msgs);
    report("chat template", accepted);
}
END_TEST

/* ---------------------------------------------------------------------------
 * prompt files: JSONL, OpenAI batch lines, plain text, TensorRT-LLM's */

static const char JSONL[] =
    "{\"id\":\"a\",\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0.7,\"stop\":[\"\\n\"]}\n"
    "{\"id\":\"b\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"n\":2,\"logprobs\":3,\"seed\":5}\n"
    "{\"id\":\"c\",\"prompt_token_ids\":[1,2,3,511],\"ignore_eos\":true,\"top_k\":4,\"min_tokens\":2}\n";

static const char OPENAI[] =
    "{\"custom_id\":\"r1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
    "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":8}}\n"
    "{\"custom_id\":\"r2\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\",\"prompt\":\"Hello\","
    "\"temperature\":0.2}}\n";

START_TEST(prompt_files)
{
    static const struct {
        const char *text;
        tp_input_format fmt;
    } bases[] = {{JSONL, TP_INPUT_JSONL}, {OPENAI, TP_INPUT_OPENAI}, {JSONL, TP_INPUT_AUTO}, {OPENAI, TP_INPUT_AUTO},
                 {"Once upon a time\nThe capital of France is\n", TP_INPUT_TEXT}};
    int accepted = 0;
    FOR_EACH_COPY(sd, 5000)
    {
        const int b = rand_int((int)(sizeof bases / sizeof bases[0]));
        size_t len;
        char *m = mutate(bases[b].text, strlen(bases[b].text), &len);
        tp_request_list l;
        memset(&l, 0, sizeof l);
        /* fatal (no request, two ids alike) or per-line error records; no crash either way */
        const tp_status st = tp_requests_parse(m, len, "mutated.jsonl", bases[b].fmt, 512, 1 << 16, &l);
        check_outcome(st, "prompts", sd);
        accepted += st == TP_OK && l.n_errors < l.n; /* at least one request without an error record */
        tp_requests_free(&l);
        free(m);
    }
    report("prompt files", accepted);
}
END_TEST

/* ---------------------------------------------------------------------------
 * an output and its manifest, as --resume finds them after a crash or a user's edit */

static void put(const char *path, const char *s, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, s, n), (ssize_t)n);
    close(fd);
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)k + 1);
    ck_assert_int_eq(fread(s, 1, (size_t)k, f), (size_t)k);
    s[k] = '\0';
    fclose(f);
    *n = (size_t)k;
    return s;
}

START_TEST(resumed_outputs)
{
    char *dir = stb_tmpdir(), out[4096], man[4096], in[4096];
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    snprintf(man, sizeof man, "%s/out.jsonl.manifest.json", dir);
    snprintf(in, sizeof in, "%s/in.jsonl", dir);
    static const char input[] = "{\"id\":\"a\",\"prompt\":\"x\"}\n{\"id\":\"b\",\"prompt\":\"y\"}\n";
    put(in, input, sizeof input - 1);
    const tp_manifest mf = {"1.0", dir, in, "{\"temperature\":0.7,\"max_tokens\":16}"};
    tp_output_config c = {out, NULL, 0, 0, 0, 0, 2.0};
    tp_output *o = NULL;
    ck_assert_msg(tp_output_open(&c, &mf, &o) == TP_OK, "%s", tp_error_message()); /* the run the copies resume */
    static const char *const lines[] = {"{\"id\":\"a\",\"text\":\"one\",\"finish_reason\":\"length\"}",
                                        "{\"custom_id\":\"b\",\"response\":{\"status_code\":200},\"error\":null}",
                                        "{\"id\":\"c\",\"code\":\"invalid_request\",\"message\":\"x\"}"};
    for (int i = 0; i < 3; i++) ck_assert_int_eq(tp_output_write(o, i, lines[i], strlen(lines[i]), i == 2), TP_OK);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
    size_t n_out, n_man;
    char *base_out = slurp(out, &n_out), *base_man = slurp(man, &n_man);
    c.resume = 1;
    int accepted = 0;
    const int every = 5; /* files on disk each time: a fifth of the copies */
    fflush(stderr);
    const int saved = dup(2), quiet = open("/dev/null", O_WRONLY);
    dup2(quiet, 2); /* resume's info lines, thousands of them */
    close(quiet);
    FOR_EACH_COPY(sd, 8000)
    {
        if (sd % every) continue;
        size_t len;
        const int which = rand_int(2);
        char *m = mutate(which ? base_man : base_out, which ? n_man : n_out, &len);
        put(out, which ? base_out : m, which ? n_out : len);
        put(man, which ? m : base_man, which ? len : n_man);
        o = NULL;
        const tp_status st = tp_output_open(&c, &mf, &o);
        check_outcome(st, which ? "manifest" : "output to resume", sd);
        accepted += st == TP_OK;
        if (st == TP_OK) {
            tp_error_clear();
            check_outcome(tp_output_close(o, 0), "close", sd);
        }
        free(m);
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    free(base_out);
    free(base_man);
    stb_rmtree(dir);
    free(dir);
    printf("  %-24s %5d of %d mutated copies accepted (and used), the rest refused with a message\n",
           "resumed output, manifest", accepted, copies() / every);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mutations");
    TCase *tc = tcase_create("parsers");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, safetensors_images);
    tcase_add_test(tc, shard_indexes);
    tcase_add_test(tc, model_configs);
    tcase_add_test(tc, tokenizers);
    tcase_add_test(tc, tokenizer_configs);
    tcase_add_test(tc, chat_templates);
    tcase_add_test(tc, prompt_files);
    tcase_add_test(tc, resumed_outputs);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
