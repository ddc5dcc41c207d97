/*
 * check_requests.c: the prompt-file reader: every dialect (text, JSONL, OpenAI batch,
 * TensorRT-LLM) with every field, auto-detection, explicit-format mismatches, and the
 * bad-input catalog P1-P5, P8-P12, P14-P17, P19 of anchors/reliability.md §3.2 (P6/P7
 * need the tokenizer, P18 the output module). Every bad line is checked for its error
 * code, its message, its id, and that the good lines around it are intact.
 */
#include <check.h>
#include <jansson.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "json_schema.h"
#include <time.h>
#include <unistd.h>

#include "requests.h"
#include "util.h"

#define VOCAB 1000

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 5 /* sanitizers: time bounds are this much looser */
#else
#define SLOW 1
#endif

static tp_request_list L;

static tp_status parse_n(const char *text, size_t len, tp_input_format fmt, size_t max_line)
{
    tp_requests_free(&L);
    tp_error_clear();
    return tp_requests_parse(text, len, "prompts.jsonl", fmt, VOCAB, max_line, &L);
}

static tp_status parse(const char *text, tp_input_format fmt) { return parse_n(text, strlen(text), fmt, 0); }

static void free_list(void) { tp_requests_free(&L); }

static void expect_error(const char *needle)
{
    ck_assert_msg(strstr(tp_error_message(), needle), "message '%s' lacks '%s'", tp_error_message(), needle);
}

static void assert_ok(const tp_request *r)
{
    ck_assert_msg(r->error_code == NULL, "line %lld: unexpected %s: %s", (long long)r->line,
                  r->error_code ? r->error_code : "", r->error_message ? r->error_message : "");
    ck_assert_ptr_null(r->error_message);
}

static void assert_prompt(const tp_request *r, const char *s)
{
    assert_ok(r);
    ck_assert_ptr_nonnull(r->prompt);
    ck_assert_uint_eq(r->prompt_len, strlen(s));
    ck_assert_mem_eq(r->prompt, s, strlen(s));
}

/* ------------------------------------------------------------------------------------ */

START_TEST(format_names)
{
    tp_input_format f;
    static const struct {
        const char *name;
        tp_input_format fmt;
    } ok[] = {{"auto", TP_INPUT_AUTO}, {"text", TP_INPUT_TEXT}, {"jsonl", TP_INPUT_JSONL},
              {"openai", TP_INPUT_OPENAI}, {"trtllm", TP_INPUT_TRTLLM}};
    for (size_t i = 0; i < TP_ARRAY_LEN(ok); i++) {
        f = (tp_input_format)-1;
        ck_assert(tp_input_format_from_name(ok[i].name, &f));
        ck_assert_int_eq(f, ok[i].fmt);
    }
    ck_assert(!tp_input_format_from_name("JSONL", &f));
    ck_assert(!tp_input_format_from_name("", &f));
    ck_assert(!tp_input_format_from_name("csv", &f));
    ck_assert(!tp_input_format_from_name(NULL, &f));
}
END_TEST

/* P11 for text: CRLF, BOM, blank and whitespace-only lines, last line without '\n'. */
START_TEST(text_lines)
{
    const char in[] = "\xEF\xBB\xBF"
                      "first prompt\r\n"
                      "\n"
                      "   \t \r\n"
                      "  indented {\"id\": 1}\n"
                      "caf\xC3\xA9 \xF0\x9F\x99\x82\r\n"
                      "a\rb\n"
                      "last, no newline";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n, 5);
    ck_assert_uint_eq(L.n_errors, 0);
    static const struct {
        const char *id, *prompt;
        int64_t line;
    } want[] = {{"1", "first prompt", 1},
                {"4", "  indented {\"id\": 1}", 4},
                {"5", "caf\xC3\xA9 \xF0\x9F\x99\x82", 5},
                {"6", "a\rb", 6},
                {"7", "last, no newline", 7}};
    for (size_t i = 0; i < TP_ARRAY_LEN(want); i++) {
        ck_assert_str_eq(L.v[i].id, want[i].id);
        ck_assert_int_eq(L.v[i].line, want[i].line);
        assert_prompt(&L.v[i], want[i].prompt);
        ck_assert_int_eq(L.v[i].endpoint, TP_ENDPOINT_NONE);
        ck_assert_ptr_null(L.v[i].prompt_ids);
        ck_assert_ptr_null(L.v[i].messages_json);
        ck_assert_int_eq(L.v[i].p.has_max_tokens, 0);
    }
}
END_TEST

/* P10 for text: a raw NUL byte is part of the prompt, never a line end. */
START_TEST(text_raw_nul)
{
    const char in[] = "a\0b\nsecond";
    ck_assert_int_eq(parse_n(in, sizeof in - 1, TP_INPUT_TEXT, 0), TP_OK);
    ck_assert_uint_eq(L.n, 2);
    ck_assert_uint_eq(L.v[0].prompt_len, 3);
    ck_assert_mem_eq(L.v[0].prompt, "a\0b", 3);
    assert_prompt(&L.v[1], "second");
}
END_TEST

/* JSONL with every field: each value lands in the struct exactly. */
START_TEST(jsonl_every_field)
{
    const char *in =
        "{\"id\": \"all\", \"prompt\": \"Hello\\u0000 w\\u00f6rld\", \"max_tokens\": 77, \"min_tokens\": 3,"
        " \"temperature\": 0.7, \"top_k\": 40, \"top_p\": 0.95, \"min_p\": 0.05, \"repetition_penalty\": 1.1,"
        " \"presence_penalty\": -0.5, \"frequency_penalty\": 1.5, \"seed\": 9223372036854775807, \"n\": 4,"
        " \"logprobs\": 5, \"prompt_logprobs\": 2, \"ignore_eos\": true, \"skip_special_tokens\": false,"
        " \"include_stop_str_in_output\": true, \"stop\": [\"\\n\\n\", \"END\"], \"stop_token_ids\": [0, 2, 999],"
        " \"add_generation_prompt\": false}\n"
        "{\"custom_id\": \"ids\", \"prompt_token_ids\": [1, 0, 999]}\n"
        "{\"input_ids\": [5]}\n"
        "{\"id\": 12, \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
        " {\"role\": \"user\", \"content\": \"Hi \\\"you\\\" \\u00e9\", \"name\": \"bob\"},"
        " {\"role\": \"assistant\", \"content\": null}], \"max_completion_tokens\": 9, \"max_tokens\": 100,"
        " \"stop\": \"STOP\", \"logprobs\": true, \"top_logprobs\": 3}\n"
        "{\"id\": \"nulls\", \"prompt\": \"x\", \"max_tokens\": null, \"stop\": null, \"seed\": null, \"id2\": null}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n, 5);
    ck_assert_uint_eq(L.n_errors, 0);

    const tp_request *r = &L.v[0];
    ck_assert_str_eq(r->id, "all");
    ck_assert_int_eq(r->endpoint, TP_ENDPOINT_NONE);
    ck_assert_uint_eq(r->prompt_len, 13);
    ck_assert_mem_eq(r->prompt, "Hello\0 w\xC3\xB6rld", 13);
    const tp_request_params *p = &r->p;
    ck_assert(p->has_max_tokens && p->max_tokens == 77);
    ck_assert(p->has_min_tokens && p->min_tokens == 3);
    ck_assert(p->has_temperature && p->temperature == 0.7);
    ck_assert(p->has_top_k && p->top_k == 40);
    ck_assert(p->has_top_p && p->top_p == 0.95);
    ck_assert(p->has_min_p && p->min_p == 0.05);
    ck_assert(p->has_repetition_penalty && p->repetition_penalty == 1.1);
    ck_assert(p->has_presence_penalty && p->presence_penalty == -0.5);
    ck_assert(p->has_frequency_penalty && p->frequency_penalty == 1.5);
    ck_assert(p->has_seed && p->seed == UINT64_C(9223372036854775807));
    ck_assert(p->has_n && p->n == 4);
    ck_assert(p->has_logprobs && p->logprobs == 5);
    ck_assert(p->has_prompt_logprobs && p->prompt_logprobs == 2);
    ck_assert(p->has_ignore_eos && p->ignore_eos == 1);
    ck_assert(p->has_skip_special_tokens && p->skip_special_tokens == 0);
    ck_assert(p->has_include_stop_str_in_output && p->include_stop_str_in_output == 1);
    ck_assert_int_eq(p->n_stop, 2);
    ck_assert_str_eq(p->stop[0], "\n\n");
    ck_assert_str_eq(p->stop[1], "END");
    ck_assert_int_eq(p->n_stop_token_ids, 3);
    ck_assert_int_eq(p->stop_token_ids[0], 0);
    ck_assert_int_eq(p->stop_token_ids[1], 2);
    ck_assert_int_eq(p->stop_token_ids[2], 999);
    ck_assert_int_eq(r->add_generation_prompt, 0);

    r = &L.v[1];
    ck_assert_str_eq(r->id, "ids");
    ck_assert_ptr_null(r->prompt);
    ck_assert_int_eq(r->n_prompt_ids, 3);
    ck_assert_int_eq(r->prompt_ids[0], 1);
    ck_assert_int_eq(r->prompt_ids[1], 0);
    ck_assert_int_eq(r->prompt_ids[2], 999);
    ck_assert_int_eq(r->add_generation_prompt, 1);
    ck_assert_int_eq(r->p.has_max_tokens + r->p.has_seed + r->p.has_logprobs + r->p.n_stop, 0);

    r = &L.v[2];
    ck_assert_str_eq(r->id, "3"); /* no id: the line number */
    ck_assert_int_eq(r->n_prompt_ids, 1);
    ck_assert_int_eq(r->prompt_ids[0], 5);

    r = &L.v[3];
    ck_assert_str_eq(r->id, "12");
    ck_assert_ptr_null(r->prompt);
    ck_assert_str_eq(r->messages_json,
                     "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                     "{\"role\":\"user\",\"content\":\"Hi \\\"you\\\" \xC3\xA9\",\"name\":\"bob\"},"
                     "{\"role\":\"assistant\",\"content\":null}]");
    ck_assert_int_eq(r->add_generation_prompt, 1);
    ck_assert(r->p.has_max_tokens && r->p.max_tokens == 9); /* max_completion_tokens wins */
    ck_assert_int_eq(r->p.n_stop, 1);
    ck_assert_str_eq(r->p.stop[0], "STOP");
    ck_assert(r->p.has_logprobs && r->p.logprobs == 3);

    r = &L.v[4];
    assert_prompt(r, "x");
    ck_assert_int_eq(r->p.has_max_tokens + r->p.has_seed + r->p.n_stop, 0);
}
END_TEST

static const char OPENAI_COMPLETION[] =
    "{\"custom_id\": \"c-1\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"model\": \"any\","
    " \"prompt\": \"Once upon\", \"max_tokens\": 16, \"min_tokens\": 1, \"temperature\": 1, \"top_k\": -1,"
    " \"top_p\": 1, \"min_p\": 0, \"repetition_penalty\": 100, \"presence_penalty\": 2, \"frequency_penalty\": -2,"
    " \"seed\": 0, \"n\": 128, \"logprobs\": 20, \"prompt_logprobs\": 0, \"ignore_eos\": false,"
    " \"skip_special_tokens\": true, \"include_stop_str_in_output\": false, \"stop\": [\"a\"],"
    " \"stop_token_ids\": [], \"stream\": false, \"echo\": false, \"user\": \"u\"}}\n";

START_TEST(openai_every_field)
{
    char in[4096];
    snprintf(in, sizeof in, "%s%s", OPENAI_COMPLETION,
             "{\"custom_id\": \"c-2\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"only one\"]}}\n"
             "{\"custom_id\": \"c-3\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [7, 8, 9]}}\n"
             "{\"custom_id\": \"c-4\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [[4, 2]]}}\n"
             "{\"custom_id\": \"chat-1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {\"model\": \"m\","
             " \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}],"
             " \"max_completion_tokens\": 5, \"logprobs\": true, \"top_logprobs\": 20, \"n\": 2, \"seed\": 42,"
             " \"add_generation_prompt\": false, \"stop\": \"x\"}}\n"
             "{\"custom_id\": \"chat-2\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {"
             " \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": false}}\n"
             "{\"custom_id\": \"chat-3\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {"
             " \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true}}\n");
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n, 7);
    ck_assert_uint_eq(L.n_errors, 0);

    const tp_request *r = &L.v[0];
    ck_assert_str_eq(r->id, "c-1");
    ck_assert_int_eq(r->endpoint, TP_ENDPOINT_COMPLETIONS);
    assert_prompt(r, "Once upon");
    const tp_request_params *p = &r->p;
    ck_assert(p->has_max_tokens && p->max_tokens == 16);
    ck_assert(p->has_min_tokens && p->min_tokens == 1);
    ck_assert(p->has_temperature && p->temperature == 1.0);
    ck_assert(p->has_top_k && p->top_k == -1);
    ck_assert(p->has_top_p && p->top_p == 1.0);
    ck_assert(p->has_min_p && p->min_p == 0.0);
    ck_assert(p->has_repetition_penalty && p->repetition_penalty == 100.0);
    ck_assert(p->has_presence_penalty && p->presence_penalty == 2.0);
    ck_assert(p->has_frequency_penalty && p->frequency_penalty == -2.0);
    ck_assert(p->has_seed && p->seed == 0);
    ck_assert(p->has_n && p->n == 128);
    ck_assert(p->has_logprobs && p->logprobs == 20);
    ck_assert(p->has_prompt_logprobs && p->prompt_logprobs == 0);
    ck_assert(p->has_ignore_eos && p->ignore_eos == 0);
    ck_assert(p->has_skip_special_tokens && p->skip_special_tokens == 1);
    ck_assert(p->has_include_stop_str_in_output && p->include_stop_str_in_output == 0);
    ck_assert_int_eq(p->n_stop, 1);
    ck_assert_str_eq(p->stop[0], "a");
    ck_assert_int_eq(p->n_stop_token_ids, 0);

    assert_prompt(&L.v[1], "only one");
    ck_assert_int_eq(L.v[2].n_prompt_ids, 3);
    ck_assert_int_eq(L.v[2].prompt_ids[2], 9);
    ck_assert_int_eq(L.v[3].n_prompt_ids, 2);
    ck_assert_int_eq(L.v[3].prompt_ids[0], 4);
    ck_assert_int_eq(L.v[3].endpoint, TP_ENDPOINT_COMPLETIONS);

    r = &L.v[4];
    ck_assert_str_eq(r->id, "chat-1");
    ck_assert_int_eq(r->endpoint, TP_ENDPOINT_CHAT);
    ck_assert_ptr_null(r->prompt);
    ck_assert_str_eq(r->messages_json, "[{\"role\":\"user\",\"content\":\"a\\nb\"}]");
    ck_assert_int_eq(r->add_generation_prompt, 0);
    ck_assert(r->p.has_max_tokens && r->p.max_tokens == 5);
    ck_assert(r->p.has_logprobs && r->p.logprobs == 20);
    ck_assert(r->p.has_n && r->p.n == 2);
    ck_assert(r->p.has_seed && r->p.seed == 42);
    ck_assert_str_eq(r->p.stop[0], "x");

    ck_assert(!L.v[5].p.has_logprobs && L.v[5].p.logprobs == 0); /* false: none, as if absent */
    ck_assert(L.v[6].p.has_logprobs && L.v[6].p.logprobs == 0); /* true without top_logprobs */
    ck_assert_int_eq(L.v[6].add_generation_prompt, 1);
}
END_TEST

START_TEST(trtllm_every_field)
{
    const char *in = "{\"task_id\": 0, \"prompt\": \"tell me\", \"output_tokens\": 128}\n"
                     "{\"task_id\": \"t-1\", \"input_ids\": [3, 1, 4], \"output_tokens\": 1}\n"
                     "{\"task_id\": -5, \"prompt\": \"ignored\", \"input_ids\": [9]}\n"
                     "{\"task_id\": 7, \"prompt\": \"x\", \"temperature\": 99}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n, 4);
    ck_assert_uint_eq(L.n_errors, 0);
    ck_assert_str_eq(L.v[0].id, "0");
    assert_prompt(&L.v[0], "tell me");
    ck_assert(L.v[0].p.has_max_tokens && L.v[0].p.max_tokens == 128);
    ck_assert_str_eq(L.v[1].id, "t-1");
    ck_assert_int_eq(L.v[1].n_prompt_ids, 3);
    ck_assert_int_eq(L.v[1].prompt_ids[2], 4);
    ck_assert(L.v[1].p.has_max_tokens && L.v[1].p.max_tokens == 1);
    ck_assert_str_eq(L.v[2].id, "-5");
    ck_assert_ptr_null(L.v[2].prompt); /* input_ids wins */
    ck_assert_int_eq(L.v[2].n_prompt_ids, 1);
    ck_assert_int_eq(L.v[2].p.has_max_tokens, 0);
    ck_assert_int_eq(L.v[3].p.has_temperature, 0); /* not a TensorRT-LLM field: ignored */
    ck_assert_int_eq(L.v[3].endpoint, TP_ENDPOINT_NONE);
}
END_TEST

/* Auto-detection: the first non-blank line decides (the first parsable object among the
 * JSON lines picks the dialect). */
static const struct detect_case {
    const char *in;
    const char *id0, *prompt0; /* the first request */
    const char *err0;          /* its error code, or NULL */
    tp_endpoint ep0;
    size_t n;
} detect_cases[] = {
    {"hello\n{\"id\":\"x\",\"prompt\":\"y\"}\n", "1", "hello", NULL, TP_ENDPOINT_NONE, 2},
    {"\n\n  \t{\"id\":\"x\",\"prompt\":\"y\"}\n", "x", "y", NULL, TP_ENDPOINT_NONE, 1},
    {"\xEF\xBB\xBF{\"id\":\"x\",\"prompt\":\"y\"}\r\n", "x", "y", NULL, TP_ENDPOINT_NONE, 1},
    {"{\"custom_id\":\"x\",\"prompt\":\"y\"}", "x", "y", NULL, TP_ENDPOINT_NONE, 1}, /* no url/body: JSONL */
    {"{\"custom_id\":\"o\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}", "o", "p", NULL,
     TP_ENDPOINT_COMPLETIONS, 1},
    {"{\"task_id\":3,\"prompt\":\"p\"}", "3", "p", NULL, TP_ENDPOINT_NONE, 1},
    {"{\"custom_id\":\"o\",\"meth\n{\"custom_id\":\"o2\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}",
     "line 1", NULL, "invalid_json", TP_ENDPOINT_NONE, 2}, /* broken first line; the second picks openai */
    {"{not json at all\n", "line 1", NULL, "invalid_json", TP_ENDPOINT_NONE, 1},
    {"[1, 2]\n", "1", NULL, "text", TP_ENDPOINT_NONE, 1}, /* not '{': text */
    {"\"quoted\"\n", "1", "\"quoted\"", NULL, TP_ENDPOINT_NONE, 1},
};

START_TEST(auto_detect)
{
    const struct detect_case *c = &detect_cases[_i];
    ck_assert_int_eq(parse(c->in, TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n, c->n);
    ck_assert_str_eq(L.v[0].id, c->id0);
    ck_assert_int_eq(L.v[0].endpoint, c->ep0);
    if (c->err0 && !strcmp(c->err0, "text")) {
        assert_prompt(&L.v[0], "[1, 2]");
    } else if (c->err0) {
        ck_assert_str_eq(L.v[0].error_code, c->err0);
    } else {
        assert_prompt(&L.v[0], c->prompt0);
    }
    if (_i == 6) { /* the second line is read as openai */
        ck_assert_str_eq(L.v[1].id, "o2");
        ck_assert_int_eq(L.v[1].endpoint, TP_ENDPOINT_COMPLETIONS);
        assert_prompt(&L.v[1], "p");
    }
}
END_TEST

/* ------------------------------------------------------------------------------------
 * One bad line between two good ones, in every dialect: the bad one is flagged with its
 * code, a message naming the line and the problem, and its id (the real one when it can
 * be read, else the line number "2"); the good ones are intact. */

typedef struct bad_case {
    tp_input_format fmt;
    const char *line;
    size_t len; /* 0: strlen */
    const char *code, *needle, *id;
} bad_case;

#define J TP_INPUT_JSONL
#define O TP_INPUT_OPENAI
#define T TP_INPUT_TRTLLM
#define X TP_INPUT_TEXT
#define EJ "invalid_json"
#define ER "invalid_request"
#define EU "invalid_utf8"
#define OA(body) "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"," body "}}"
#define OC(body) "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{" body "}}"
#define JP(fields) "{\"id\":\"bad\",\"prompt\":\"p\"," fields "}"

static const bad_case bad_cases[] = {
    /* P1: truncated, trailing comma, single quotes, trailing garbage */
    {J, "{\"id\":\"bad\",\"prompt\":\"x\"", 0, EJ, "invalid JSON at column", "line 2"},
    {J, "{\"id\":\"bad\",\"prompt\":\"x\",}", 0, EJ, "invalid JSON", "line 2"},
    {J, "{'id':'bad','prompt':'x'}", 0, EJ, "invalid JSON", "line 2"},
    {J, "{\"id\":\"bad\",\"prompt\":\"x\"} junk", 0, EJ, "invalid JSON", "line 2"},
    {J, "{\"id\":\"bad\",\"prompt\":\"x\"}{}", 0, EJ, "invalid JSON", "line 2"},
    {J, "{", 0, EJ, "invalid JSON", "line 2"},
    {J, "not json", 0, EJ, "invalid JSON", "line 2"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}", 0, EJ,
     "invalid JSON", "line 2"},
    {T, "{\"task_id\":\"bad\",\"prompt\":", 0, EJ, "invalid JSON", "line 2"},
    /* P2: valid JSON, not an object */
    {J, "[]", 0, EJ, "must be a JSON object, not an array", "line 2"},
    {J, "\"x\"", 0, EJ, "must be a JSON object, not a string", "line 2"},
    {J, "42", 0, EJ, "must be a JSON object, not a number", "line 2"},
    {J, "null", 0, EJ, "must be a JSON object, not null", "line 2"},
    {J, "true", 0, EJ, "must be a JSON object, not a boolean", "line 2"},
    {O, "[{\"custom_id\":\"bad\"}]", 0, EJ, "must be a JSON object", "line 2"},
    {T, "3.5", 0, EJ, "must be a JSON object", "line 2"},
    /* P3: missing prompt, prompt of the wrong type, bad ids */
    {J, "{\"id\":\"bad\"}", 0, ER, "give exactly one of \"prompt\", \"prompt_token_ids\", \"input_ids\" and \"messages\" (the line has 0)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"b\"}]}", 0, ER, "(the line has 2)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt_token_ids\":[1],\"input_ids\":[1]}", 0, ER, "(the line has 2)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":[\"a\"]}", 0, ER, "\"prompt\" must be a string, not an array", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":{\"a\":1}}", 0, ER, "\"prompt\" must be a string, not an object", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":5}", 0, ER, "\"prompt\" must be a string, not 5", "bad"},
    {J, "{\"id\":true,\"prompt\":\"x\"}", 0, ER, "\"id\" must be a string or an integer, not true", "line 2"},
    {J, "{\"id\":1.5,\"prompt\":\"x\"}", 0, ER, "\"id\" must be a string or an integer, not 1.5", "line 2"},
    {J, "{\"id\":2.0,\"prompt\":\"x\"}", 0, ER, "not 2.0", "line 2"},
    {J, "{\"id\":{},\"prompt\":\"x\"}", 0, ER, "not an object", "line 2"},
    {J, "{\"id\":\"\",\"prompt\":\"x\"}", 0, ER, "\"id\" is empty", "line 2"},
    {J, "{\"id\":\"a\\u0000b\",\"prompt\":\"x\"}", 0, ER, "\"id\" \"a\\u0000b\" holds a NUL character", "line 2"},
    {J, "{\"id\":\"bad\",\"custom_id\":\"c\",\"prompt\":\"x\"}", 0, ER, "give one of \"id\" and \"custom_id\", not both", "bad"},
    {J, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}", 0, ER,
     "this looks like an OpenAI batch line: use --input-format openai", "bad"},
    {J, "{\"id\":\"bad\",\"prompt_token_ids\":\"1 2\"}", 0, ER, "\"prompt_token_ids\" must be an array of token ids, not \"1 2\"", "bad"},
    {J, "{\"id\":\"bad\",\"prompt_token_ids\":[]}", 0, ER, "\"prompt_token_ids\" is an empty array", "bad"},
    {J, "{\"id\":\"bad\",\"prompt_token_ids\":[1,-1]}", 0, ER, "\"prompt_token_ids\"[1] -1 is outside [0, 1000)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt_token_ids\":[1000]}", 0, ER, "\"prompt_token_ids\"[0] 1000 is outside [0, 1000)", "bad"},
    {J, "{\"id\":\"bad\",\"input_ids\":[1,2.0]}", 0, ER, "\"input_ids\"[1] must be an integer token id, not 2.0", "bad"},
    {J, "{\"id\":\"bad\",\"input_ids\":[1,\"2\"]}", 0, ER, "\"input_ids\"[1] must be an integer token id, not \"2\"", "bad"},
    /* messages */
    {J, "{\"id\":\"bad\",\"messages\":[]}", 0, ER, "\"messages\" must be a non-empty array of messages, not an empty array", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":\"hi\"}", 0, ER, "\"messages\" must be a non-empty array of messages, not \"hi\"", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":[5]}", 0, ER, "\"messages\"[0] must be an object, not 5", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":[{\"content\":\"x\"}]}", 0, ER, "\"messages\"[0].role must be a non-empty string, not missing", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":[{\"role\":7,\"content\":\"x\"}]}", 0, ER, "\"messages\"[0].role must be a non-empty string, not 7", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\"}]}", 0, ER,
     "\"messages\"[1].content is missing (only an assistant message may have no content)", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":[{\"role\":\"user\",\"content\":null}]}", 0, ER, "\"messages\"[0].content is missing", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 0, ER,
     "\"messages\"[0].content must be a string or an array of text parts, not 5", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 0, ER,
     "\"messages\"[0].content[0] is not a text part", "bad"},
    {J, "{\"id\":\"bad\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"add_generation_prompt\":1}", 0, ER,
     "\"add_generation_prompt\" must be true or false, not 1", "bad"},
    /* P5: empty prompt */
    {J, "{\"id\":\"bad\",\"prompt\":\"\"}", 0, ER, "\"prompt\": the prompt is empty", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"\"}}", 0, ER,
     "\"body.prompt\": the prompt is empty", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":[\"\"]}}", 0, ER,
     "\"body.prompt[0]\": the prompt is empty", "bad"},
    {T, "{\"task_id\":\"bad\",\"prompt\":\"\"}", 0, ER, "\"prompt\": the prompt is empty", "bad"},
    /* P8: raw invalid UTF-8 (the id is still read when it is intact) */
    {J, "{\"id\":\"bad\",\"prompt\":\"a\xFF\"}", 0, EU, "invalid UTF-8 at byte 24 of the line (0xff)", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"\xFE\"}}", 0, EU,
     "invalid UTF-8", "bad"},
    {T, "{\"task_id\":\"bad\",\"prompt\":\"\x80\"}", 0, EU, "(0x80)", "bad"},
    {X, "plain \xFF text", 0, EU, "invalid UTF-8 at byte 7 of the line (0xff)", "2"},
    {J, "{\"id\":\"b\xFF\",\"prompt\":\"x\"}", 0, EU, "invalid UTF-8", "line 2"},  /* the id itself is broken */
    {J, "{\"id\":\"bad\",\"prompt\":\"x\"\xFF}", 0, EU, "invalid UTF-8", "line 2"}, /* outside a string: no JSON */
    /* P9: overlong forms, encoded surrogates, beyond U+10FFFF, truncated, escaped surrogates */
    {J, "{\"id\":\"bad\",\"prompt\":\"\xC0\xAF\"}", 0, EU, "(0xc0)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\xC1\xBF\"}", 0, EU, "(0xc1)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\xE0\x80\xAF\"}", 0, EU, "(0xe0)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\xF0\x80\x80\xAF\"}", 0, EU, "(0xf0)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\xED\xA0\x80\"}", 0, EU, "(0xed)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\xF4\x90\x80\x80\"}", 0, EU, "(0xf4)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\xF5\x80\x80\x80\"}", 0, EU, "(0xf5)", "bad"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\xE2\x82\"}", 0, EU, "(0xe2)", "bad"},
    {X, "truncated at the end \xE2\x82", 0, EU, "(0xe2)", "2"},
    {X, "overlong \xC0\xAF", 0, EU, "(0xc0)", "2"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\\ud800\"}", 0, EU, "lone UTF-16 surrogate", "line 2"},
    {J, "{\"id\":\"bad\",\"prompt\":\"\\udc00x\"}", 0, EU, "lone UTF-16 surrogate", "line 2"},
    /* P10: a raw NUL byte in a JSON line */
    {J, "{\"id\":\"bad\",\"prompt\":\"a\0b\"}", 25, EJ, "invalid JSON", "line 2"},
    {J, "{\"id\":\"bad\",\0\"prompt\":\"a\"}", 25, EJ, "invalid JSON", "line 2"},
    /* P12 (small): a line over max_line_bytes (the table runs with 4096) */
    {J, NULL, 5000, ER, "the line is 5000 bytes, more than --max-line-bytes 4096", "line 2"},
    {X, NULL, 4097, ER, "the line is 4097 bytes, more than --max-line-bytes 4096", "2"},
    /* P14: duplicate keys */
    {J, "{\"id\":\"bad\",\"prompt\":\"a\",\"prompt\":\"b\"}", 0, EJ, "duplicate object key", "line 2"},
    {J, "{\"id\":\"bad\",\"id\":\"b\",\"prompt\":\"a\"}", 0, EJ, "duplicate object key", "line 2"},
    {O, OA("\"max_tokens\":1,\"max_tokens\":2"), 0, EJ, "duplicate object key", "line 2"},
    {J, "{\"id\":\"bad\",\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"x\"}]}", 0, EJ, "duplicate object key", "line 2"},
    /* P16: sampling ranges (CVE-2026-21869 style), every field, both edges */
    {J, JP("\"max_tokens\":0"), 0, ER, "line 2: \"max_tokens\" 0 is outside [1, 2147483647]", "bad"},
    {J, JP("\"max_tokens\":-1"), 0, ER, "\"max_tokens\" -1 is outside [1, 2147483647]", "bad"},
    {J, JP("\"max_tokens\":2147483648"), 0, ER, "\"max_tokens\" 2147483648 is outside [1, 2147483647]", "bad"},
    {J, JP("\"max_tokens\":1e20"), 0, ER, "\"max_tokens\" must be an integer in [1, 2147483647], not 1e+20", "bad"},
    {J, JP("\"max_tokens\":100000000000000000000"), 0, ER, "\"max_tokens\" 100000000000000000000 is outside [1, 2147483647]", "bad"},
    {J, JP("\"max_tokens\":-100000000000000000000"), 0, ER, "\"max_tokens\" -100000000000000000000 is outside", "bad"},
    {J, JP("\"max_tokens\":16.5"), 0, ER, "\"max_tokens\" must be an integer in [1, 2147483647], not 16.5", "bad"},
    {J, JP("\"max_tokens\":\"16\""), 0, ER, "\"max_tokens\" must be an integer in [1, 2147483647], not \"16\"", "bad"},
    {J, JP("\"max_tokens\":true"), 0, ER, "not true", "bad"},
    {J, JP("\"max_completion_tokens\":0"), 0, ER, "\"max_completion_tokens\" 0 is outside [1, 2147483647]", "bad"},
    {J, JP("\"min_tokens\":-1"), 0, ER, "\"min_tokens\" -1 is outside [0, 2147483647]", "bad"},
    {J, JP("\"min_tokens\":5,\"max_tokens\":4"), 0, ER, "\"min_tokens\" 5 is more than \"max_tokens\" 4", "bad"},
    {J, JP("\"temperature\":-1"), 0, ER, "\"temperature\" -1 is outside [0, 100]", "bad"},
    {J, JP("\"temperature\":100.5"), 0, ER, "\"temperature\" 100.5 is outside [0, 100]", "bad"},
    {J, JP("\"temperature\":\"hot\""), 0, ER, "\"temperature\" must be a number in [0, 100], not \"hot\"", "bad"},
    {J, JP("\"top_k\":-2"), 0, ER, "\"top_k\" -2 is outside [-1, 2147483647]", "bad"},
    {J, JP("\"top_p\":1.5"), 0, ER, "\"top_p\" 1.5 is outside (0, 1]", "bad"},
    {J, JP("\"top_p\":0"), 0, ER, "\"top_p\" 0 is outside (0, 1]", "bad"},
    {J, JP("\"min_p\":1.01"), 0, ER, "\"min_p\" 1.01 is outside [0, 1]", "bad"},
    {J, JP("\"min_p\":-0.1"), 0, ER, "\"min_p\" -0.1 is outside [0, 1]", "bad"},
    {J, JP("\"repetition_penalty\":0"), 0, ER, "\"repetition_penalty\" 0 is outside (0, 100]", "bad"},
    {J, JP("\"repetition_penalty\":101"), 0, ER, "\"repetition_penalty\" 101 is outside (0, 100]", "bad"},
    {J, JP("\"presence_penalty\":2.5"), 0, ER, "\"presence_penalty\" 2.5 is outside [-2, 2]", "bad"},
    {J, JP("\"frequency_penalty\":-2.01"), 0, ER, "\"frequency_penalty\" -2.01 is outside [-2, 2]", "bad"},
    {J, JP("\"seed\":18446744073709551616"), 0, ER, "\"seed\" 18446744073709551616 is outside [0, 2^63)", "bad"},
    {J, JP("\"seed\":9223372036854775808"), 0, ER, "\"seed\" 9223372036854775808 is outside [0, 2^63)", "bad"},
    {J, JP("\"seed\":-1"), 0, ER, "\"seed\" -1 is outside [0, 2^63)", "bad"},
    {J, JP("\"seed\":1.5"), 0, ER, "\"seed\" must be an integer in [0, 2^63), not 1.5", "bad"},
    {J, JP("\"n\":0"), 0, ER, "\"n\" 0 is outside [1, 128]", "bad"},
    {J, JP("\"n\":129"), 0, ER, "\"n\" 129 is outside [1, 128]", "bad"},
    {J, JP("\"logprobs\":21"), 0, ER, "\"logprobs\" 21 is outside [0, 20]", "bad"},
    {J, JP("\"logprobs\":-1"), 0, ER, "\"logprobs\" -1 is outside [0, 20]", "bad"},
    {J, JP("\"logprobs\":true,\"top_logprobs\":21"), 0, ER, "\"top_logprobs\" 21 is outside [0, 20]", "bad"},
    {J, JP("\"logprobs\":false,\"top_logprobs\":2"), 0, ER, "\"top_logprobs\" needs \"logprobs\": true", "bad"},
    {J, JP("\"top_logprobs\":2"), 0, ER, "\"top_logprobs\" needs \"logprobs\": true", "bad"},
    {J, JP("\"prompt_logprobs\":21"), 0, ER, "\"prompt_logprobs\" 21 is outside [0, 20]", "bad"},
    {J, JP("\"ignore_eos\":\"yes\""), 0, ER, "\"ignore_eos\" must be true or false, not \"yes\"", "bad"},
    {J, JP("\"skip_special_tokens\":0"), 0, ER, "\"skip_special_tokens\" must be true or false, not 0", "bad"},
    {J, JP("\"include_stop_str_in_output\":[]"), 0, ER, "\"include_stop_str_in_output\" must be true or false, not an array", "bad"},
    {J, JP("\"stop\":5"), 0, ER, "\"stop\" must be a string or an array of strings, not 5", "bad"},
    {J, JP("\"stop\":\"\""), 0, ER, "\"stop\" is an empty string", "bad"},
    {J, JP("\"stop\":[\"a\",\"\"]"), 0, ER, "\"stop\"[1] is an empty string", "bad"},
    {J, JP("\"stop\":[\"a\",7]"), 0, ER, "\"stop\"[1] must be a string, not 7", "bad"},
    {J, JP("\"stop\":[\"a\\u0000\"]"), 0, ER, "\"stop\" \"a\\u0000\" holds a NUL character", "bad"},
    {J, JP("\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]"), 0, ER,
     "\"stop\" has 17 strings, more than 16", "bad"},
    {J, JP("\"stop_token_ids\":[1,1000]"), 0, ER, "\"stop_token_ids\"[1] 1000 is outside [0, 1000)", "bad"},
    {J, JP("\"stop_token_ids\":7"), 0, ER, "\"stop_token_ids\" must be an array of token ids, not 7", "bad"},
    {J, JP("\"unknown\":99999999999999999999"), 0, ER, "too big integer near '99999999999999999999': integers must fit in 64 bits", "bad"},
    {J, "{\"id\":99999999999999999999,\"prompt\":\"x\"}", 0, ER, "\"id\" must be a string or an integer, not 1e+20", "line 2"},
    /* OpenAI schema: every required field, the body's fields with "body." */
    {O, OA("\"max_tokens\":0"), 0, ER, "\"body.max_tokens\" 0 is outside [1, 2147483647]", "bad"},
    {O, OA("\"seed\":18446744073709551616"), 0, ER, "\"body.seed\" 18446744073709551616 is outside [0, 2^63)", "bad"},
    {O, OA("\"top_p\":1.5"), 0, ER, "\"body.top_p\" 1.5 is outside (0, 1]", "bad"},
    {O, OA("\"n\":0"), 0, ER, "\"body.n\" 0 is outside [1, 128]", "bad"},
    {O, OA("\"logprobs\":21"), 0, ER, "\"body.logprobs\" 21 is outside [0, 20]", "bad"},
    {O, OA("\"temperature\":-1"), 0, ER, "\"body.temperature\" -1 is outside [0, 100]", "bad"},
    {O, OA("\"stream\":true"), 0, ER, "stream mode is not supported in a batch", "bad"},
    {O, OA("\"stream\":\"no\""), 0, ER, "\"body.stream\" must be true or false, not \"no\"", "bad"},
    {O, OC("\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":-3"), 0, ER,
     "\"body.max_completion_tokens\" -3 is outside [1, 2147483647]", "bad"},
    {O, OC("\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21"), 0, ER,
     "\"body.top_logprobs\" 21 is outside [0, 20]", "bad"},
    {O, OC("\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true"), 0, ER, "stream mode is not supported", "bad"},
    {O, OC("\"prompt\":\"x\""), 0, ER, "\"body.messages\" is required for /v1/chat/completions", "bad"},
    {O, OC("\"messages\":[]"), 0, ER, "\"body.messages\" must be a non-empty array of messages", "bad"},
    {O, OC("\"messages\":[{\"role\":\"user\",\"content\":{}}]"), 0, ER, "\"body.messages\"[0].content must be a string", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"messages\":[]}}", 0, ER,
     "\"body.prompt\" is required for /v1/completions (\"messages\" needs \"url\": \"/v1/chat/completions\")", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":[\"a\",\"b\"]}}", 0, ER,
     "\"body.prompt\" holds 2 prompts; a batch line takes one", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":[]}}", 0, ER,
     "\"body.prompt\" is an empty array", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":[1,5000]}}", 0, ER,
     "\"body.prompt\"[1] 5000 is outside [0, 1000)", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":[{}]}}", 0, ER,
     "\"body.prompt[0]\" must be a string, not an object", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":5}}", 0, ER,
     "\"body.prompt\" must be a string, not 5", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", 0, ER,
     "\"body.prompt\" is required for /v1/completions", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}", 0, ER,
     "\"method\" must be \"POST\", not \"GET\"", "bad"},
    {O, "{\"custom_id\":\"bad\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}", 0, ER,
     "\"method\" must be \"POST\", not missing", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"input\":\"p\"}}", 0, ER,
     "\"url\" \"/v1/embeddings\" is not supported: use \"/v1/completions\" or \"/v1/chat/completions\"", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"body\":{\"prompt\":\"p\"}}", 0, ER,
     "\"url\" is required: \"/v1/completions\" or \"/v1/chat/completions\"", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\"}", 0, ER, "\"body\" must be an object, not missing", "bad"},
    {O, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":[]}", 0, ER,
     "\"body\" must be an object, not an array", "bad"},
    {O, "{\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}", 0, ER, "\"custom_id\" is required", "line 2"},
    {O, "{\"custom_id\":17,\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}", 0, ER,
     "\"custom_id\" must be a string, not 17", "line 2"},
    {O, "{\"custom_id\":null,\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}", 0, ER,
     "\"custom_id\" is required", "line 2"},
    /* TensorRT-LLM */
    {T, "{\"prompt\":\"x\"}", 0, ER, "\"task_id\" is required", "line 2"},
    {T, "{\"task_id\":true,\"prompt\":\"x\"}", 0, ER, "\"task_id\" must be a string or an integer, not true", "line 2"},
    {T, "{\"task_id\":\"bad\"}", 0, ER, "give \"prompt\" or \"input_ids\"", "bad"},
    {T, "{\"task_id\":\"bad\",\"input_ids\":[]}", 0, ER, "\"input_ids\" is an empty array", "bad"},
    {T, "{\"task_id\":\"bad\",\"input_ids\":[1.5]}", 0, ER, "\"input_ids\"[0] must be an integer token id, not 1.5", "bad"},
    {T, "{\"task_id\":\"bad\",\"prompt\":\"x\",\"output_tokens\":0}", 0, ER, "\"output_tokens\" 0 is outside [1, 2147483647]", "bad"},
    {T, "{\"task_id\":\"bad\",\"prompt\":\"x\",\"output_tokens\":\"5\"}", 0, ER, "\"output_tokens\" must be an integer", "bad"},
    {T, "{\"task_id\":\"bad\",\"prompt\":\"x\",\"lora_request\":{\"lora_name\":\"a\"}}", 0, ER, "LoRA adapters are not supported", "bad"},
    {T, "{\"task_id\":\"bad\",\"prompt\":\"x\",\"media_paths\":[\"a.png\"]}", 0, ER, "multimodal input is not supported", "bad"},
    /* explicit format, line of another dialect */
    {O, "{\"id\":\"x\",\"prompt\":\"p\"}", 0, ER, "\"custom_id\" is required", "line 2"},
    {T, "{\"id\":\"x\",\"prompt\":\"p\"}", 0, ER, "\"task_id\" is required", "line 2"},
    {J, "{\"task_id\":\"t\",\"input_ids\":[1],\"prompt\":\"p\"}", 0, ER, "this looks like a TensorRT-LLM line", "2"},
    {J, "just some text", 0, EJ, "invalid JSON", "line 2"},
    {O, "just some text", 0, EJ, "invalid JSON", "line 2"},
    {T, "just some text", 0, EJ, "invalid JSON", "line 2"},
};

static const char *good_line(tp_input_format fmt, int which)
{
    static const char *const g[][2] = {
        [TP_INPUT_TEXT] = {"first", "last"},
        [TP_INPUT_JSONL] = {"{\"id\":\"g1\",\"prompt\":\"first\"}", "{\"id\":\"g3\",\"prompt\":\"last\"}"},
        [TP_INPUT_OPENAI] = {"{\"custom_id\":\"g1\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"first\"}}",
                             "{\"custom_id\":\"g3\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"last\"}}"},
        [TP_INPUT_TRTLLM] = {"{\"task_id\":\"g1\",\"prompt\":\"first\"}", "{\"task_id\":\"g3\",\"prompt\":\"last\"}"},
    };
    return g[fmt][which];
}

static void run_bad_case(const bad_case *c, tp_input_format parse_as)
{
    const char *g1 = good_line(c->fmt, 0), *g3 = good_line(c->fmt, 1);
    size_t n1 = strlen(g1), n3 = strlen(g3), nb = c->line ? (c->len ? c->len : strlen(c->line)) : c->len;
    char *buf = malloc(n1 + nb + n3 + 8), *p = buf;
    memcpy(p, g1, n1), p += n1, *p++ = '\n';
    if (c->line) memcpy(p, c->line, nb);
    else { /* an over-long line: a JSON line for the JSON dialects */
        memset(p, 'a', nb);
        if (c->fmt != TP_INPUT_TEXT) memcpy(p, "{\"id\":\"bad\",\"prompt\":\"", 22), memcpy(p + nb - 2, "\"}", 2);
    }
    p += nb, *p++ = '\r', *p++ = '\n'; /* CRLF in the middle */
    memcpy(p, g3, n3), p += n3;        /* and no final newline */
    ck_assert_int_eq(parse_n(buf, (size_t)(p - buf), parse_as, 4096), TP_OK);
    free(buf);

    ck_assert_uint_eq(L.n, 3);
    ck_assert_uint_eq(L.n_errors, 1);
    const char *id1 = c->fmt == TP_INPUT_TEXT ? "1" : "g1", *id3 = c->fmt == TP_INPUT_TEXT ? "3" : "g3";
    ck_assert_str_eq(L.v[0].id, id1);
    assert_prompt(&L.v[0], "first");
    ck_assert_int_eq(L.v[0].line, 1);
    ck_assert_str_eq(L.v[2].id, id3);
    assert_prompt(&L.v[2], "last");
    ck_assert_int_eq(L.v[2].line, 3);

    const tp_request *r = &L.v[1];
    ck_assert_int_eq(r->line, 2);
    ck_assert_ptr_nonnull(r->error_code);
    ck_assert_str_eq(r->error_code, c->code);
    ck_assert_ptr_nonnull(r->error_message);
    ck_assert_msg(!strncmp(r->error_message, "line 2: ", 8), "message '%s'", r->error_message);
    ck_assert_msg(strstr(r->error_message, c->needle), "message '%s' lacks '%s'", r->error_message, c->needle);
    ck_assert_str_eq(r->id, c->id);
    /* an error request carries nothing to run */
    ck_assert_ptr_null(r->prompt);
    ck_assert_ptr_null(r->prompt_ids);
    ck_assert_ptr_null(r->messages_json);
    ck_assert_ptr_null(r->p.stop);
    ck_assert_ptr_null(r->p.stop_token_ids);
    ck_assert_int_eq(r->p.has_max_tokens + r->p.has_seed + r->p.has_temperature, 0);
}

START_TEST(bad_line)
{
    const bad_case *c = &bad_cases[_i];
    run_bad_case(c, c->fmt);
    run_bad_case(c, TP_INPUT_AUTO); /* the good first line makes auto pick the same dialect */
}
END_TEST

/* Values at the edges of every range are accepted. */
START_TEST(edge_values_accepted)
{
    const char *in =
        "{\"id\":\"lo\",\"prompt\":\"   \",\"max_tokens\":1,\"min_tokens\":0,\"temperature\":0,\"top_k\":-1,"
        "\"top_p\":1e-300,\"min_p\":0,\"repetition_penalty\":1e-9,\"presence_penalty\":-2,\"frequency_penalty\":-2,"
        "\"seed\":0,\"n\":1,\"logprobs\":0,\"prompt_logprobs\":0,\"stop\":[],\"stop_token_ids\":[]}\n"
        "{\"id\":\"hi\",\"prompt\":\"\\t\",\"max_tokens\":2147483647,\"min_tokens\":2147483647,\"temperature\":100,"
        "\"top_k\":2147483647,\"top_p\":1,\"min_p\":1,\"repetition_penalty\":100,\"presence_penalty\":2,"
        "\"frequency_penalty\":2,\"seed\":9223372036854775807,\"n\":128,\"logprobs\":20,\"prompt_logprobs\":20,"
        "\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\"],"
        "\"stop_token_ids\":[999]}\n"
        "{\"id\":\"nul\",\"prompt\":\"\\u0000\"}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    ck_assert_uint_eq(L.n, 3);
    ck_assert_uint_eq(L.n_errors, 0);
    const tp_request_params *lo = &L.v[0].p, *hi = &L.v[1].p;
    assert_prompt(&L.v[0], "   "); /* whitespace-only prompts are allowed (P5) */
    ck_assert_int_eq(lo->max_tokens, 1);
    ck_assert_int_eq(lo->top_k, -1);
    ck_assert(lo->top_p == 1e-300);
    ck_assert(lo->repetition_penalty == 1e-9);
    ck_assert_int_eq(lo->n_stop, 0);
    ck_assert_ptr_null(lo->stop);
    ck_assert_int_eq(lo->n_stop_token_ids, 0);
    ck_assert_ptr_null(lo->stop_token_ids);
    ck_assert(lo->has_logprobs && lo->logprobs == 0);
    assert_prompt(&L.v[1], "\t");
    ck_assert_int_eq(hi->max_tokens, INT32_MAX);
    ck_assert_int_eq(hi->min_tokens, INT32_MAX);
    ck_assert_int_eq(hi->top_k, INT32_MAX);
    ck_assert(hi->seed == (uint64_t)INT64_MAX);
    ck_assert_int_eq(hi->n_stop, 16);
    ck_assert_str_eq(hi->stop[15], "16");
    ck_assert_int_eq(L.v[2].prompt_len, 1); /* P9: "\u0000" in a prompt */
    ck_assert_int_eq(L.v[2].prompt[0], '\0');
}
END_TEST

/* Each {fields, message}: a JSONL line with those fields is an invalid_request error record
 * whose message holds the text, carrying nothing to run, and every field is a known one. */
static void expect_refused(const char *const (*cases)[2], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char line[256];
        snprintf(line, sizeof line, "{\"id\":\"r\",\"prompt\":\"x\",%s}\n", cases[i][0]);
        ck_assert_int_eq(parse(line, TP_INPUT_JSONL), TP_OK);
        ck_assert_msg(L.v[0].error_code && !strcmp(L.v[0].error_code, "invalid_request"), "%s ran", line);
        ck_assert_msg(strstr(L.v[0].error_message, cases[i][1]), "%s: %s", line, L.v[0].error_message);
        const tp_request_params *p = &L.v[0].p;
        ck_assert_int_eq(p->n_bias + p->n_allowed_token_ids + p->n_choices + p->n_bad_words + p->json_object, 0);
        ck_assert_int_eq(L.unknown_lines, 0);
    }
}

/* P15: unknown fields are ignored, in every dialect. */
START_TEST(unknown_fields_ignored)
{
    char sum[512];
    /* unknown fields run the line as if absent, and are counted with their first line */
    const char *in = "{\"id\":\"a\",\"prompt\":\"x\",\"model\":\"m\",\"foo\":{\"bar\":[1,{\"baz\":null}]},\"logit_bias\":{}}\n"
                     "{\"id\":\"b\",\"prompt\":\"x\",\"max_token\":5,\"foo\":1}\n"
                     "{\"id\":\"c\",\"prompt\":\"x\",\"max_token\":5,\"user\":\"u\",\"stream\":false}\n"
                     "{\"id\":\"d\",\"prompt\":\"x\",\"max_tokens\":5}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    assert_prompt(&L.v[0], "x");
    ck_assert_uint_eq(L.n_errors, 0);
    ck_assert(!L.v[1].p.has_max_tokens);
    ck_assert_int_eq(L.unknown_lines, 3);
    ck_assert_int_eq(L.n_unknown, 2);
    tp_requests_unknown_summary(&L, sum, sizeof sum);
    ck_assert_str_eq(sum, "\"foo\" (2 lines, first line 1), \"max_token\" (2 lines, first line 2)");
    in = "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"extra\":1,"
         "\"body\":{\"model\":\"gpt\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"meta\":{\"k\":[1]}}],"
         "\"response_format\":{\"type\":\"text\"},\"user\":\"u\",\"temprature\":0.5}}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    assert_ok(&L.v[0]);
    ck_assert_str_eq(L.v[0].messages_json, "[{\"role\":\"user\",\"content\":\"x\",\"meta\":{\"k\":[1]}}]");
    tp_requests_unknown_summary(&L, sum, sizeof sum);
    ck_assert_str_eq(sum, "\"extra\" (line 1), \"body.temprature\" (line 1)");
    ck_assert_int_eq(L.unknown_lines, 1);
    in = "{\"task_id\":1,\"prompt\":\"x\",\"whatever\":[]}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    assert_prompt(&L.v[0], "x");
    tp_requests_unknown_summary(&L, sum, sizeof sum);
    ck_assert_str_eq(sum, "\"whatever\" (line 1)");
    /* more distinct fields than kept, and a long name cut */
    char many[1024] = "{\"id\":\"m\",\"prompt\":\"x\"";
    for (int i = 0; i < TP_UNKNOWN_FIELDS_KEPT + 2; i++) sprintf(many + strlen(many), ",\"f%d\":1", i);
    strcat(many, ",\"a_field_name_longer_than_forty_bytes_is_cut_here\":1}\n");
    ck_assert_int_eq(parse(many, TP_INPUT_JSONL), TP_OK);
    ck_assert_int_eq(L.n_unknown, TP_UNKNOWN_FIELDS_KEPT);
    ck_assert(L.unknown_more);
    tp_requests_unknown_summary(&L, sum, sizeof sum);
    ck_assert(strstr(sum, "\"f7\" (line 1) and others"));
    /* fields that would change the output, which tpinfer does not do: an error record each;
     * their neutral values run */
    static const char *const refused[][2] = {
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"multipleOf\":2}}}",
         "\"response_format\": the JSON schema at its root: multipleOf is not supported"},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}",
         "\"response_format\" \"json_schema\" needs \"json_schema\": {\"schema\""},
        {"\"response_format\":{\"type\":\"xml\"}", "\"response_format\" must be {\"type\": \"text\"}, {\"type\""},
        {"\"response_format\":\"json\"", "or {\"type\": \"json_schema\", ...}, not \"json\""},
        {"\"tools\":[{\"type\":\"function\"}]", "\"tools\" needs a chat request"},
        {"\"echo\":1", "\"echo\" must be"},
        {"\"suffix\":\"end\"", "fill-in-the-middle"},
        {"\"best_of\":3", "\"best_of\" 3 is not supported"},
        {"\"use_beam_search\":true", "beam search"},
        {"\"guided_json\":5", "\"guided_json\" must be a JSON schema (an object), not 5"},
        {"\"guided_json\":\"{\\\"type\\\": \"", "\"guided_json\" is not a JSON schema"},
        {"\"guided_grammar\":\"root ::= x\"", "\"guided_grammar\": guided decoding by a grammar is not supported"},
        {"\"guided_regex\":\"(?=a)\"", "\"guided_regex\": the regular expression \"(?=a)\": lookaround"},
        {"\"guided_regex\":5", "\"guided_regex\" must be a regular expression (a string), not 5"},
        {"\"guided_regex\":\"a\",\"guided_json\":{}", "\"guided_regex\" with \"guided_json\": give one"},
        {"\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]", "\"guided_regex\" with \"guided_choice\": give one"},
        {"\"guided_regex\":\"a\",\"structured_outputs\":{\"regex\":\"b\"}", "give one"},
        {"\"guided_regex\":\"a\",\"min_tokens\":2", "the object may be whole sooner"},
        {"\"guided_regex\":\"[]\"", "a class that begins with ']'"},
        {"\"guided_regex\":\"ab[^\\\\x00-\\udbff\\udfff]\"", "\"ab[^\\x00-\xf4\x8f\xbf\xbf]\" matches no text"},
        /* a pattern no string of maxLength matches: refused, not a text that ends unfinished */
        {"\"guided_json\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^(abcd|x{5,})$\","
         "\"maxLength\":3}}}", "the JSON schema at .properties.a: maxLength 3 is less than the 4 characters its pattern needs at least"},
        {"\"structured_outputs\":{\"grammar\":\"root ::= x\"}", "\"structured_outputs\".\"grammar\": guided decoding other than"},
        {"\"n\":2,\"best_of\":3", "\"best_of\" 3 is not supported"},
        {"\"logits_processors\":[\"m.f\"]", "custom logits processors are not supported"},
    };
    expect_refused(refused, TP_ARRAY_LEN(refused));
    in = "{\"custom_id\":\"o\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":"
         "[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert(strstr(L.v[0].error_message, "\"body.echo\" is for completions"));
    /* echo on completions: the prompt first; with max_tokens 0 the prompt alone (one token drawn) */
    in = "{\"id\":\"e\",\"prompt\":\"x\",\"echo\":true}\n{\"id\":\"f\",\"prompt\":\"x\",\"echo\":true,\"max_tokens\":0}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    ck_assert_uint_eq(L.n_errors, 0);
    ck_assert(L.v[0].p.echo && !L.v[0].p.echo_only && !L.v[0].p.has_max_tokens);
    ck_assert(L.v[1].p.echo && L.v[1].p.echo_only && L.v[1].p.has_max_tokens && L.v[1].p.max_tokens == 1);
    in = "{\"id\":\"n\",\"prompt\":\"x\",\"logit_bias\":{},\"tools\":[],\"echo\":false,\"best_of\":1,"
         "\"suffix\":\"\",\"use_beam_search\":false,\"response_format\":{\"type\":\"text\"},\"tool_choice\":\"none\","
         "\"logits_processors\":[]}\n{\"id\":\"n2\",\"prompt\":\"x\",\"n\":2,\"best_of\":2}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    assert_prompt(&L.v[0], "x");
    assert_prompt(&L.v[1], "x");
    ck_assert_int_eq(L.unknown_lines, 0);
    /* a message value nested too deeply is refused (json_dumps recursion) */
    char deep[512] = "{\"id\":\"d\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"k\":";
    for (int i = 0; i < 70; i++) strcat(deep, "[");
    for (int i = 0; i < 70; i++) strcat(deep, "]");
    strcat(deep, "}]}");
    ck_assert_int_eq(parse(deep, TP_INPUT_AUTO), TP_OK);
    ck_assert_str_eq(L.v[0].error_code, "invalid_request");
    ck_assert(strstr(L.v[0].error_message, "is nested more than 64 deep"));
    /* and so is a tool's */
    char deep_tool[640] = "{\"id\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
                          "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"k\":";
    for (int i = 0; i < 70; i++) strcat(deep_tool, "[");
    for (int i = 0; i < 70; i++) strcat(deep_tool, "]");
    strcat(deep_tool, "}}}]}");
    ck_assert_int_eq(parse(deep_tool, TP_INPUT_AUTO), TP_OK);
    ck_assert_str_eq(L.v[0].error_code, "invalid_request");
    ck_assert_msg(strstr(L.v[0].error_message, "\"tools\"[0] is nested more than 64 deep"), "%s", L.v[0].error_message);
    /* "bad_words": at most 4096 strings */
    const size_t cap = 64 + 4097 * 4;
    char *words = malloc(cap);
    ck_assert_ptr_nonnull(words);
    size_t len = (size_t)snprintf(words, cap, "{\"id\":\"b\",\"prompt\":\"x\",\"bad_words\":[");
    for (int i = 0; i < 4097; i++) len += (size_t)snprintf(words + len, cap - len, "%s\"w\"", i ? "," : "");
    snprintf(words + len, cap - len, "]}");
    ck_assert_int_eq(parse(words, TP_INPUT_AUTO), TP_OK);
    ck_assert_str_eq(L.v[0].error_code, "invalid_request");
    ck_assert_msg(strstr(L.v[0].error_message, "\"bad_words\" holds 4097 strings, more than 4096"), "%s",
                  L.v[0].error_message);
    free(words);
}
END_TEST

/* "logit_bias" (OpenAI: token id strings to biases) and vLLM's "allowed_token_ids": read into
 * sorted, distinct ids; biases clamped to [-100, 100] as vLLM does; "guided_choice" (or
 * "structured_outputs": {"choice"}) into its strings; bad keys, ids and values are an error
 * record naming the field. */
START_TEST(logit_bias_and_allowed_ids)
{
    const char *in =
        "{\"id\":\"a\",\"prompt\":\"x\",\"logit_bias\":{\"9\":-3.5,\"2\":100,\"5\":1e9,\"07\":-1000,\"7\":2}}\n"
        "{\"id\":\"c\",\"prompt\":\"x\",\"logit_bias\":{},\"allowed_token_ids\":null}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n_errors, 0);
    const tp_request_params *a = &L.v[0].p;
    ck_assert_int_eq(a->n_bias, 4); /* "07" and "7" are one id: the later key wins */
    const int32_t ids[4] = {2, 5, 7, 9};
    const float bias[4] = {100.0f, 100.0f, 2.0f, -3.5f};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(a->bias_ids[i], ids[i]);
        ck_assert_float_eq(a->bias[i], bias[i]);
    }
    ck_assert_int_eq(a->n_allowed_token_ids, 0);
    ck_assert_int_eq(L.v[1].p.n_bias, 0);
    ck_assert_int_eq(L.v[1].p.n_allowed_token_ids, 0);
    in = "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":"
         "[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"0\":-100},\"allowed_token_ids\":[3,1,3]}}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n_errors, 0);
    const tp_request_params *b = &L.v[0].p;
    ck_assert_int_eq(b->n_bias, 1);
    ck_assert_int_eq(b->bias_ids[0], 0);
    ck_assert_float_eq(b->bias[0], -100.0f);
    ck_assert_int_eq(b->n_allowed_token_ids, 3);
    ck_assert_int_eq(b->allowed_token_ids[1], 1);
    ck_assert_int_eq(L.unknown_lines, 0);
    static const char *const bad[][2] = {
        {"\"logit_bias\":[1]", "\"logit_bias\" must be an object mapping token ids to biases, not an array"},
        {"\"logit_bias\":\"5\"", "\"logit_bias\" must be an object"},
        {"\"logit_bias\":{\"a\":1}", "\"logit_bias\" key \"a\" is not a token id"},
        {"\"logit_bias\":{\"-1\":1}", "\"logit_bias\" key \"-1\" is not a token id"},
        {"\"logit_bias\":{\" 1\":1}", "is not a token id"},
        {"\"logit_bias\":{\"\":1}", "\"logit_bias\" key \"\" is not a token id"},
        {"\"logit_bias\":{\"1000\":1}", "\"logit_bias\" key \"1000\" is outside [0, 1000) (the vocabulary)"},
        {"\"logit_bias\":{\"99999999999999999999999\":1}", "is outside [0, 1000)"},
        {"\"logit_bias\":{\"3\":\"1\"}", "\"logit_bias\" of token 3 must be a number in [-100, 100], not \"1\""},
        {"\"logit_bias\":{\"3\":null}", "\"logit_bias\" of token 3 must be a number"},
        {"\"allowed_token_ids\":[]", "\"allowed_token_ids\" is an empty array"},
        {"\"allowed_token_ids\":[1,1000]", "\"allowed_token_ids\"[1] 1000 is outside [0, 1000)"},
        {"\"allowed_token_ids\":5", "\"allowed_token_ids\" must be an array of token ids"},
    };
    expect_refused(bad, TP_ARRAY_LEN(bad));
    /* guided_choice, or structured_outputs.choice: the strings kept as they are */
    in = "{\"id\":\"g\",\"prompt\":\"x\",\"guided_choice\":[\"yes\",\"no \\u2713\"]}\n"
         "{\"id\":\"h\",\"prompt\":\"x\",\"structured_outputs\":{\"choice\":[\"a\"],\"json\":null}}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    ck_assert_uint_eq(L.n_errors, 0);
    ck_assert_int_eq(L.v[0].p.n_choices, 2);
    ck_assert_str_eq(L.v[0].p.choices[1], "no \xe2\x9c\x93");
    ck_assert_int_eq(L.v[1].p.n_choices, 1);
    ck_assert_str_eq(L.v[1].p.choices[0], "a");
    static const char *const bad_choice[][2] = {
        {"\"guided_choice\":\"yes\"", "\"guided_choice\" must be a non-empty array of strings, not \"yes\""},
        {"\"guided_choice\":[]", "not an empty array"},
        {"\"guided_choice\":[\"\"]", "\"guided_choice\"[0] must be a non-empty string, not \"\""},
        {"\"guided_choice\":[\"a\\u0000b\"]", "\"guided_choice\"[0] holds a NUL character"},
        {"\"structured_outputs\":[\"a\"]", "\"structured_outputs\" must be an object"},
        {"\"structured_outputs\":{\"choice\":[1]}", "\"structured_outputs.choice\"[0] must be a non-empty string"},
        {"\"guided_choice\":[\"a\"],\"allowed_token_ids\":[1]", "both say which tokens may come"},
        {"\"guided_choice\":[\"a\"],\"min_tokens\":1", "a choice may end sooner"},
        {"\"guided_choice\":[\"a\"],\"ignore_eos\":true", "a choice ends at the end token"},
    };
    expect_refused(bad_choice, TP_ARRAY_LEN(bad_choice));
    /* a JSON object: response_format json_object, or structured_outputs.json_object */
    in = "{\"id\":\"j\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}\n"
         "{\"id\":\"k\",\"prompt\":\"x\",\"structured_outputs\":{\"json_object\":true,\"choice\":null}}\n"
         "{\"id\":\"l\",\"prompt\":\"x\",\"structured_outputs\":{\"json_object\":false}}\n"
         "{\"id\":\"t\",\"prompt\":\"x\",\"response_format\":{\"type\":\"text\"}}\n"
         "{\"id\":\"w\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"},\"structured_outputs\":"
         "{\"disable_any_whitespace\":true,\"disable_fallback\":true,\"disable_additional_properties\":false}}\n"
         "{\"id\":\"v\",\"prompt\":\"x\",\"structured_outputs\":{\"json_object\":true,\"disable_any_whitespace\":false}}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    ck_assert_uint_eq(L.n_errors, 0);
    ck_assert_int_eq(L.unknown_lines, 0);
    ck_assert(L.v[0].p.json_object && L.v[1].p.json_object && !L.v[2].p.json_object && !L.v[3].p.json_object);
    ck_assert_int_eq(L.v[0].p.n_choices + L.v[1].p.n_choices, 0);
    /* disable_any_whitespace: the JSON rule (response_format's here) without whitespace */
    ck_assert(L.v[4].p.json_object && L.v[4].p.json_compact && L.v[5].p.json_object && !L.v[5].p.json_compact);
    ck_assert(!L.v[0].p.json_compact && !L.v[1].p.json_compact);
    /* guided_regex, structured_outputs.regex: a TEXT root holding the pattern, one per pattern */
    in = "{\"id\":\"r1\",\"prompt\":\"x\",\"guided_regex\":\"[a-c]+\"}\n"
         "{\"id\":\"r2\",\"prompt\":\"x\",\"structured_outputs\":{\"regex\":\"[a-c]+\"}}\n"
         "{\"id\":\"r3\",\"prompt\":\"x\",\"guided_regex\":\"yes|no\"}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    ck_assert_uint_eq(L.n_errors, 0);
    ck_assert_int_eq(L.unknown_lines, 0);
    for (int i = 0; i < 3; i++) {
        ck_assert(L.v[i].p.json_object && L.v[i].p.schema);
        ck_assert_int_eq(L.v[i].p.schema->nodes[L.v[i].p.schema->root].kind, TP_SCHEMA_TEXT);
    }
    ck_assert_ptr_eq(L.v[0].p.schema, L.v[1].p.schema);
    ck_assert_ptr_ne(L.v[0].p.schema, L.v[2].p.schema);
    /* a JSON schema: response_format json_schema, structured_outputs.json (an object or its
     * text), vLLM's guided_json; compiled once per distinct schema */
    in = "{\"id\":\"s1\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
         "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}}\n"
         "{\"id\":\"s2\",\"prompt\":\"x\",\"guided_json\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}\n"
         "{\"id\":\"s3\",\"prompt\":\"x\",\"structured_outputs\":{\"json\":\"{\\\"enum\\\": [1, 2]}\"}}\n"
         "{\"id\":\"s4\",\"prompt\":\"x\",\"guided_json\":{\"properties\":{\"a\":{\"type\":\"integer\"}},\"type\":\"object\",\"required\":[\"a\"]}}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    ck_assert_uint_eq(L.n_errors, 0);
    for (int i = 0; i < 4; i++) ck_assert(L.v[i].p.json_object && L.v[i].p.schema);
    ck_assert_ptr_eq(L.v[0].p.schema, L.v[1].p.schema); /* the same schema: one compiled */
    ck_assert_ptr_ne(L.v[0].p.schema, L.v[2].p.schema);
    ck_assert_ptr_ne(L.v[0].p.schema, L.v[3].p.schema); /* properties in another order: another schema */
    ck_assert_uint_eq(L.n_schemas, 3);
    static const char *const bad_json[][2] = {
        {"\"response_format\":{\"type\":\"json_object\"},\"guided_choice\":[\"a\"]",
         "\"guided_choice\" with \"response_format\": give one"},
        {"\"structured_outputs\":{\"json_object\":true,\"choice\":[\"a\"]}",
         "\"structured_outputs.choice\" with \"structured_outputs.json_object\": give one"},
        {"\"structured_outputs\":{\"json_object\":1}", "\"structured_outputs\".json_object must be true or false, not 1"},
        {"\"structured_outputs\":{\"json_object\":true,\"disable_any_whitespace\":0}",
         "\"structured_outputs\".disable_any_whitespace must be true or false, not 0"},
        {"\"structured_outputs\":{\"json_object\":true,\"whitespace_pattern\":\" \"}",
         "\"structured_outputs\".\"whitespace_pattern\": guided decoding other than"},
        {"\"structured_outputs\":{\"grammar\":\"x\"}", "other than \"choice\", \"json\", \"json_object\" and \"regex\" (and the option disable_any_whitespace) is not supported"},
        {"\"response_format\":{\"type\":\"json_object\"},\"allowed_token_ids\":[1]", "both say which tokens may come"},
        {"\"response_format\":{\"type\":\"json_object\"},\"guided_json\":{}", "\"guided_json\" with \"response_format\": give one"},
        {"\"response_format\":{\"type\":\"json_object\"},\"structured_outputs\":{\"json_object\":true}",
         "\"response_format\" with \"structured_outputs\": give one"},
        {"\"guided_json\":{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "\"guided_json\": the JSON schema at its root: the regular expression \"(?=a)\": lookaround"},
        {"\"guided_json\":{\"type\":\"integer\",\"multipleOf\":3}", "\"guided_json\": the JSON schema at its root: multipleOf is not supported"},
        {"\"structured_outputs\":{\"json\":{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}}",
         "\"structured_outputs.json\": the JSON schema at its root: oneOf[0] and oneOf[1] may both hold"},
        {"\"response_format\":{\"type\":\"json_object\"},\"min_tokens\":1", "the object may be whole sooner"},
        {"\"response_format\":{\"type\":\"json_object\"},\"ignore_eos\":true", "the object ends at the end token"},
        {"\"structured_outputs\":{\"json_object\":true},\"bad_words\":[\"a\"]",
         "\"structured_outputs.json_object\" with \"bad_words\""},
    };
    expect_refused(bad_json, TP_ARRAY_LEN(bad_json));
    /* bad_words: strings kept as given (the engine tokenizes them) */
    in = "{\"id\":\"w\",\"prompt\":\"x\",\"bad_words\":[\" big\",\"red ball\"]}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    ck_assert_int_eq(L.v[0].p.n_bad_words, 2);
    ck_assert_str_eq(L.v[0].p.bad_words[0], " big");
    ck_assert_int_eq(L.unknown_lines, 0);
    static const char *const bad_words[][2] = {
        {"\"bad_words\":\"big\"", "\"bad_words\" must be a non-empty array of strings, not \"big\""},
        {"\"bad_words\":[]", "not an empty array"},
        {"\"bad_words\":[\"a\",\" \\n\"]", "\"bad_words\"[1] must be a string with more than white space"},
        {"\"bad_words\":[1]", "\"bad_words\"[0] must be a string with more than white space, not 1"},
        {"\"bad_words\":[\"a\\u0000\"]", "\"bad_words\"[0] holds a NUL character"},
    };
    expect_refused(bad_words, TP_ARRAY_LEN(bad_words));
    char many[80000] = "{\"id\":\"m\",\"prompt\":\"x\",\"guided_choice\":[\"c\"";
    for (int i = 0; i < 4096; i++) strcat(many, ",\"c\"");
    strcat(many, "]}\n");
    ck_assert_int_eq(parse(many, TP_INPUT_JSONL), TP_OK);
    ck_assert_msg(strstr(L.v[0].error_message, "holds 4097 choices, more than 4096"), "%s", L.v[0].error_message);
    /* OpenAI bodies name the field with its prefix */
    in = "{\"custom_id\":\"o\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
         "\"logit_bias\":{\"x\":1}}}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert(strstr(L.v[0].error_message, "\"body.logit_bias\" key \"x\" is not a token id"));
}
END_TEST

/* "tools" reach the chat template (as apply_chat_template(tools=)): with "tool_choice": "none"
 * the completion is text; with "auto" (the default) the engine parses calls out of it, and
 * "parallel_tool_calls": false keeps the first; a named tool is one call to it, its text held
 * to the tool's parameters (their schema, or any object); "required" is a list of calls held
 * to vLLM's schema (one call with parallel_tool_calls false). Malformed tools are refused,
 * and tools without messages. */
START_TEST(tools_with_tool_choice_none)
{
    const char *tool = "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}}";
    char line[1024];
    for (int openai = 0; openai < 2; openai++) {
        if (openai)
            snprintf(line, sizeof line, "{\"custom_id\":\"o\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\","
                     "\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[%s],"
                     "\"tool_choice\":\"none\"}}\n", tool);
        else
            snprintf(line, sizeof line, "{\"id\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                     "\"tools\":[%s],\"tool_choice\":\"none\"}\n{\"id\":\"e\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"hi\"}],\"tools\":[]}\n", tool);
        ck_assert_int_eq(parse(line, TP_INPUT_AUTO), TP_OK);
        ck_assert_msg(!L.v[0].error_code, "%s", L.v[0].error_message ? L.v[0].error_message : "");
        char want[512];
        snprintf(want, sizeof want, "[%s]", tool);
        ck_assert_pstr_eq(L.v[0].tools_json, want);
        ck_assert_int_eq(L.unknown_lines, 0);
        ck_assert(!L.v[0].parse_tool_calls);
        if (!openai) { /* an empty list is passed as one, as transformers' tools=[] */
            ck_assert_pstr_eq(L.v[1].tools_json, "[]");
            ck_assert(!L.v[1].error_code);
            ck_assert(!L.v[1].parse_tool_calls);
        }
    }
    /* "auto", given or the default: the tools, and the calls to parse; parallel_tool_calls */
    static const char *const parsed[][2] = {
        {"", "0"}, {",\"tool_choice\":\"auto\"", "0"}, {",\"tool_choice\":null,\"parallel_tool_calls\":true", "0"},
        {",\"parallel_tool_calls\":false", "1"}, {",\"parallel_tool_calls\":null", "0"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(parsed); i++) {
        for (int openai = 0; openai < 2; openai++) {
            if (openai)
                snprintf(line, sizeof line, "{\"custom_id\":\"o\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\","
                         "\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[%s]%s}}\n", tool,
                         parsed[i][0]);
            else
                snprintf(line, sizeof line, "{\"id\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                         "\"tools\":[%s]%s}\n", tool, parsed[i][0]);
            ck_assert_int_eq(parse(line, TP_INPUT_AUTO), TP_OK);
            ck_assert_msg(!L.v[0].error_code, "%s: %s", line, L.v[0].error_message ? L.v[0].error_message : "");
            ck_assert_msg(L.v[0].parse_tool_calls == 1, "%s", line);
            ck_assert_int_eq(L.v[0].single_tool_call, parsed[i][1][0] - '0');
            ck_assert_ptr_nonnull(L.v[0].tools_json);
            ck_assert_int_eq(L.unknown_lines, 0);
        }
    }
    /* a named function: its call forced, its arguments held to its parameters' schema */
    for (int openai = 0; openai < 2; openai++) {
        const char *named = "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}";
        if (openai)
            snprintf(line, sizeof line, "{\"custom_id\":\"o\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\","
                     "\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[%s],%s}}\n", tool, named);
        else
            snprintf(line, sizeof line, "{\"id\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                     "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}],%s}\n", named);
        ck_assert_int_eq(parse(line, TP_INPUT_AUTO), TP_OK);
        ck_assert_msg(!L.v[0].error_code, "%s: %s", line, L.v[0].error_message ? L.v[0].error_message : "");
        ck_assert_pstr_eq(L.v[0].forced_tool, "get_weather");
        ck_assert(L.v[0].p.json_object && L.v[0].p.schema && !L.v[0].parse_tool_calls);
        ck_assert_int_eq(L.v[0].p.schema->nodes[L.v[0].p.schema->root].kind, TP_SCHEMA_OBJECT);
    }
    /* "required": a list of calls, each tool's name and parameters (their $defs lifted) */
    for (int openai = 0; openai < 2; openai++) {
        const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\","
                            "\"properties\":{\"p\":{\"$ref\":\"#/$defs/P\"}},\"$defs\":{\"P\":{\"type\":\"integer\"}}}}},"
                            "{\"type\":\"function\",\"function\":{\"name\":\"b\"}}]";
        const char *parallel = openai ? ",\"parallel_tool_calls\":false" : "";
        if (openai)
            snprintf(line, sizeof line, "{\"custom_id\":\"o\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\","
                     "\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":%s,"
                     "\"tool_choice\":\"required\"%s}}\n", tools, parallel);
        else
            snprintf(line, sizeof line, "{\"id\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                     "\"tools\":%s,\"tool_choice\":\"required\"%s}\n", tools, parallel);
        ck_assert_int_eq(parse(line, TP_INPUT_AUTO), TP_OK);
        ck_assert_msg(!L.v[0].error_code, "%s: %s", line, L.v[0].error_message ? L.v[0].error_message : "");
        const tp_request *r = &L.v[0];
        ck_assert(r->required_tools && !r->forced_tool && r->p.json_object && r->p.schema && !r->parse_tool_calls);
        const tp_schema *s = r->p.schema;
        const tp_schema_node *list = &s->nodes[s->root], *item = &s->nodes[list->items];
        ck_assert_int_eq(list->kind, TP_SCHEMA_ARRAY);
        ck_assert_int_eq(list->min_items, 1);
        ck_assert_int_eq(list->max_items, openai ? 1 : -1); /* parallel_tool_calls false: one call */
        ck_assert_int_eq(item->kind, TP_SCHEMA_UNION);
        ck_assert_int_eq(item->count, 2);
        for (int k = 0; k < 2; k++) { /* {"name": enum [a or b], "parameters": ...} */
            const tp_schema_node *call = &s->nodes[s->entries[item->first + k].node];
            ck_assert_int_eq(call->kind, TP_SCHEMA_OBJECT);
            ck_assert_int_eq(call->count, 2);
            const tp_schema_entry *name = &s->entries[call->first], *params = &s->entries[call->first + 1];
            ck_assert_str_eq(name->text, "\"name\"");
            ck_assert_str_eq(params->text, "\"parameters\"");
            ck_assert(name->required && params->required);
            ck_assert_str_eq(s->entries[s->nodes[name->node].first].text, k ? "\"b\"" : "\"a\"");
            const tp_schema_node *pn = &s->nodes[params->node];
            ck_assert_int_eq(pn->kind, TP_SCHEMA_OBJECT);
            if (!k) /* the $ref found its definition, lifted to the top */
                ck_assert_int_eq(s->nodes[s->entries[pn->first].node].kind, TP_SCHEMA_INTEGER);
            else
                ck_assert_int_eq(pn->count, -1); /* no parameters: any object */
        }
    }
    { /* more tools than "required" follows at once */
        char *big = malloc(8192);
        size_t at = (size_t)snprintf(big, 8192, "{\"id\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                     "\"tool_choice\":\"required\",\"tools\":[");
        for (int k = 0; k < 65; k++)
            at += (size_t)snprintf(big + at, 8192 - at, "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}",
                                   k ? "," : "", k);
        snprintf(big + at, 8192 - at, "]}\n");
        ck_assert_int_eq(parse(big, TP_INPUT_JSONL), TP_OK);
        ck_assert(L.v[0].error_code && strstr(L.v[0].error_message, "\"tool_choice\" \"required\" follows at most 64 tools "
                                                                   "at once, and \"tools\" gives 65"));
        free(big);
    }
    static const char *const refused[][2] = {
        {"\"tools\":[T],\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}",
         "\"tool_choice\" \"required\" with \"response_format\": give one"},
        {"\"tools\":[T],\"tool_choice\":\"required\",\"guided_choice\":[\"a\"]",
         "\"tool_choice\" \"required\" with \"guided_choice\": give one"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"$defs\":{\"X\":{\"type\":\"string\"}}}}},"
         "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"$defs\":{\"X\":{\"type\":\"integer\"}}}}}],"
         "\"tool_choice\":\"required\"", "\"tools\" give two schemas named \"X\" in $defs"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
         "\"properties\":{\"k\":{\"$ref\":\"#\"}}}}}],\"tool_choice\":\"required\"", "refers to itself as \"#\""},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":7}}],\"tool_choice\":\"required\"",
         "\"tools\"[0].function.parameters must be a JSON schema object, not 7"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"string\","
         "\"multipleOf\":2}}}],\"tool_choice\":\"required\"", "multipleOf is not supported"},
        {"\"tools\":[T],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"other\"}}",
         "\"tool_choice\" names \"other\", which \"tools\" does not give"},
        {"\"tools\":[T],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
         "\"response_format\":{\"type\":\"json_object\"}", "\"tool_choice\" naming a function with \"response_format\": give one"},
        {"\"tools\":[T],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"min_tokens\":2",
         "the object may be whole sooner"},
        {"\"tools\":[T],\"parallel_tool_calls\":\"no\"", "\"parallel_tool_calls\" must be true or false, not \"no\""},
        {"\"tools\":{},\"tool_choice\":\"none\"", "\"tools\" must be an array of tools"},
        {"\"tools\":[1],\"tool_choice\":\"none\"", "\"tools\"[0] must be {\"type\": \"function\""},
        {"\"tools\":[{\"type\":\"function\"}],\"tool_choice\":\"none\"", "\"tools\"[0] must be"},
        {"\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"x\"}}],\"tool_choice\":\"none\"", "\"tools\"[0] must be"},
        {"\"tools\":[T,{\"type\":\"function\",\"function\":{\"name\":\"\"}}],\"tool_choice\":\"none\"", "\"tools\"[1] must be"},
        /* a tool_choice that asks for calls needs tools; an unknown one is named */
        {"\"tool_choice\":\"required\"", "\"tool_choice\" \"required\" needs \"tools\""},
        {"\"tools\":[],\"tool_choice\":\"auto\"", "\"tool_choice\" \"auto\" needs \"tools\""},
        {"\"tools\":null,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"x\"}}", "needs \"tools\""},
        {"\"tools\":[T],\"tool_choice\":\"NONE\"", "\"tool_choice\" must be \"none\", \"auto\", \"required\" or"},
        {"\"tool_choice\":7", "\"tool_choice\" must be"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\\u0000b\"}}],\"tool_choice\":\"none\"",
         "\"tools\"[0] holds a NUL character"},
        {"\"functions\":[{\"name\":\"f\"}]", "\"functions\" (OpenAI's older function calling) is not supported"},
        {"\"function_call\":\"auto\"", "\"function_call\" \"auto\" is not supported"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(refused); i++) {
        char fields[512], *t = strstr(refused[i][0], "T");
        if (t && (t[-1] == '[' || t[-1] == ',')) /* T: the valid tool */
            snprintf(fields, sizeof fields, "%.*s%s%s", (int)(t - refused[i][0]), refused[i][0], tool, t + 1);
        else
            snprintf(fields, sizeof fields, "%s", refused[i][0]);
        snprintf(line, sizeof line, "{\"id\":\"r\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}\n", fields);
        ck_assert_int_eq(parse(line, TP_INPUT_JSONL), TP_OK);
        ck_assert_msg(L.v[0].error_code && !strcmp(L.v[0].error_code, "invalid_request"), "%s ran", line);
        ck_assert_msg(strstr(L.v[0].error_message, refused[i][1]), "%s: %s", line, L.v[0].error_message);
        ck_assert_ptr_null(L.v[0].tools_json);
    }
    snprintf(line, sizeof line, "{\"id\":\"f\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[%s],"
             "\"tool_choice\":\"none\",\"max_tokens\":-5}\n{\"id\":\"n\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"hi\"}],\"tool_choice\":\"none\",\"function_call\":\"none\",\"functions\":[]}\n", tool);
    ck_assert_int_eq(parse(line, TP_INPUT_JSONL), TP_OK); /* the first fails after its tools were read */
    ck_assert(L.v[0].error_code && strstr(L.v[0].error_message, "max_tokens"));
    ck_assert_ptr_null(L.v[0].tools_json);
    ck_assert(!L.v[1].error_code);
    ck_assert_ptr_null(L.v[1].tools_json);
    ck_assert_int_eq(L.unknown_lines, 0);
    snprintf(line, sizeof line, "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":"
             "\"x\",\"tools\":[%s],\"tool_choice\":\"none\"}}\n", tool);
    ck_assert_int_eq(parse(line, TP_INPUT_AUTO), TP_OK);
    ck_assert(strstr(L.v[0].error_message, "\"body.tools\" needs a chat request"));
}
END_TEST

/* P17: ids with newlines, quotes, control characters, non-ASCII, big integers are kept
 * byte for byte. */
START_TEST(ids_exact)
{
    const char *in = "{\"id\":\"a\\nb\",\"prompt\":\"x\"}\n"
                     "{\"id\":\"q\\\"uote\\\\ /\",\"prompt\":\"x\"}\n"
                     "{\"id\":\"\\u0001\\u001f\\t\\r\\u007f\",\"prompt\":\"x\"}\n"
                     "{\"id\":\"\xC3\xA9\\ud83d\\ude42\",\"prompt\":\"x\"}\n"
                     "{\"id\":-7,\"prompt\":\"x\"}\n"
                     "{\"id\":9223372036854775807,\"prompt\":\"x\"}\n"
                     "{\"id\":-9223372036854775808,\"prompt\":\"x\"}\n"
                     "{\"custom_id\":\" spaced \",\"prompt\":\"x\"}\n";
    ck_assert_int_eq(parse(in, TP_INPUT_JSONL), TP_OK);
    ck_assert_uint_eq(L.n_errors, 0);
    static const char *const want[] = {"a\nb", "q\"uote\\ /", "\x01\x1f\t\r\x7f", "\xC3\xA9\xF0\x9F\x99\x82",
                                       "-7", "9223372036854775807", "-9223372036854775808", " spaced "};
    ck_assert_uint_eq(L.n, TP_ARRAY_LEN(want));
    for (size_t i = 0; i < TP_ARRAY_LEN(want); i++) ck_assert_str_eq(L.v[i].id, want[i]);
    in = "{\"custom_id\":\"line\\nbreak\\u0002\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert_str_eq(L.v[0].id, "line\nbreak\x02");
}
END_TEST

/* P17: a 1 MB id is kept; two of them collide with a short message. */
START_TEST(megabyte_id)
{
    size_t idn = 1 << 20;
    char *buf = malloc(2 * (idn + 64));
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        n += (size_t)sprintf(buf + n, "{\"id\":\"");
        memset(buf + n, 'i', idn), n += idn;
        n += (size_t)sprintf(buf + n, "\",\"prompt\":\"p%d\"}\n", k);
    }
    ck_assert_int_eq(parse_n(buf, n / 2, TP_INPUT_AUTO, 0), TP_OK);
    ck_assert_uint_eq(L.n, 1);
    ck_assert_uint_eq(strlen(L.v[0].id), idn);
    assert_prompt(&L.v[0], "p0");
    ck_assert_int_eq(parse_n(buf, n, TP_INPUT_AUTO, 2 << 20), TP_ERR_INVALID_ARG);
    expect_error("is used on line 1 and again on line 2");
    expect_error("... (1048576 bytes)");
    ck_assert_uint_lt(strlen(tp_error_message()), 400);
    /* with --max-line-bytes 1 MiB the line is an error record with its line number */
    ck_assert_int_eq(parse_n(buf, n / 2, TP_INPUT_AUTO, 1 << 20), TP_OK);
    ck_assert_str_eq(L.v[0].error_code, "invalid_request");
    ck_assert_str_eq(L.v[0].id, "line 1");
    free(buf);
}
END_TEST

/* P4: duplicate ids stop the job and name both lines, whatever the lines hold. */
static const struct dup_case {
    const char *in;
    tp_input_format fmt;
    const char *needle;
} dup_cases[] = {
    {"{\"id\":\"a\",\"prompt\":\"x\"}\n{\"id\":\"b\",\"prompt\":\"x\"}\n\n{\"id\":\"a\",\"prompt\":\"y\"}\n", TP_INPUT_AUTO,
     "prompts.jsonl: id \"a\" is used on line 1 and again on line 4; ids must be unique"},
    {"{\"id\":1,\"prompt\":\"x\"}\n{\"id\":\"1\",\"prompt\":\"x\"}\n", TP_INPUT_AUTO, "id \"1\" is used on line 1 and again on line 2"},
    {"{\"prompt\":\"x\"}\n{\"id\":\"1\",\"prompt\":\"x\"}\n", TP_INPUT_AUTO,
     "id \"1\" is used on line 1 and again on line 2 (line 1 has no id, so its line number stands in)"},
    {"{\"id\":\"line 2\",\"prompt\":\"x\"}\n{\"id\":1,\"prompt\n", TP_INPUT_AUTO,
     "id \"line 2\" is used on line 1 and again on line 2 (line 2 has no readable id, so \"line 2\" stands in)"},
    {"{\"id\":\"e\",\"prompt\":\"\"}\n{\"id\":\"e\",\"prompt\":\"x\",\"n\":0}\n", TP_INPUT_AUTO,
     "id \"e\" is used on line 1 and again on line 2"},
    {"{\"custom_id\":\"r\\n1\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}}\n"
     "{\"custom_id\":\"r\\n1\",\"method\":\"GET\"}\n", TP_INPUT_AUTO, "id \"r\\n1\" is used on line 1 and again on line 2"},
    {"{\"task_id\":5,\"prompt\":\"x\"}\n{\"task_id\":\"5\",\"input_ids\":[1]}\n", TP_INPUT_AUTO, "id \"5\" is used on line 1"},
};

START_TEST(duplicate_ids)
{
    const struct dup_case *c = &dup_cases[_i];
    ck_assert_int_eq(parse(c->in, c->fmt), TP_ERR_INVALID_ARG);
    expect_error(c->needle);
    ck_assert_uint_eq(L.n, 0);
    ck_assert_ptr_null(L.v);
}
END_TEST

/* A line whose id cannot be read gets "line N", never the bare number that ids counted from
 * 0 give the next line: one broken line among them is one error record, the rest run. */
START_TEST(unreadable_id_takes_no_other_lines_id)
{
    ck_assert_int_eq(parse("{\"id\":0,\"prompt\":\"x\"}\n{\"id\":1,\"prompt\n{\"id\":2,\"prompt\":\"z\"}\n",
                           TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n, 3);
    ck_assert_uint_eq(L.n_errors, 1);
    ck_assert_str_eq(L.v[0].id, "0");
    ck_assert_str_eq(L.v[1].id, "line 2");
    ck_assert_str_eq(L.v[1].error_code, "invalid_json");
    ck_assert_str_eq(L.v[2].id, "2");
    assert_prompt(&L.v[2], "z");
}
END_TEST

/* Messages cut long ids at a character boundary: they stay valid UTF-8. */
START_TEST(long_ids_in_messages)
{
    char line[1024], in[2048];
    strcpy(line, "{\"id\":\"");
    for (int i = 0; i < 40; i++) strcat(line, "\xE2\x82\xAC\\\"\\\\\\n"); /* "€", an escaped quote, backslash, newline */
    strcat(line, "\",\"prompt\":\"x\"}\n");
    snprintf(in, sizeof in, "%s%s", line, line);
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_ERR_INVALID_ARG);
    expect_error("is used on line 1 and again on line 2");
    expect_error("... (");
    const char *m = tp_error_message();
    json_t *probe = json_stringn(m, strlen(m)); /* NULL when m is not valid UTF-8 */
    ck_assert_ptr_nonnull(probe);
    json_decref(probe);
    ck_assert_ptr_null(strchr(m, '\n'));
}
END_TEST

/* P8 on a big line: the id is still recovered from a 10 MB line with a bad byte. */
START_TEST(big_line_bad_utf8)
{
    size_t big = (size_t)10 << 20;
    char *buf = malloc(big + 256);
    size_t n = (size_t)sprintf(buf, "{\"custom_id\":\"big\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"");
    memset(buf + n, '\xFF', big), n += big;
    n += (size_t)sprintf(buf + n, "\"}}");
    ck_assert_int_eq(parse_n(buf, n, TP_INPUT_AUTO, 0), TP_OK);
    free(buf);
    ck_assert_uint_eq(L.n, 1);
    ck_assert_str_eq(L.v[0].id, "big");
    ck_assert_str_eq(L.v[0].error_code, "invalid_utf8");
}
END_TEST

/* P11: files with no requests are fatal. */
START_TEST(no_requests)
{
    static const char *const empties[] = {"", "\n", "\n\n  \r\n\t\n", "\xEF\xBB\xBF", "\xEF\xBB\xBF\r\n  "};
    for (size_t i = 0; i < TP_ARRAY_LEN(empties); i++)
        for (int f = TP_INPUT_AUTO; f <= TP_INPUT_TRTLLM; f++) {
            ck_assert_int_eq(parse(empties[i], (tp_input_format)f), TP_ERR_INVALID_ARG);
            expect_error("prompts.jsonl holds no requests (it is empty or has only blank lines)");
        }
}
END_TEST

/* P11 for JSONL: CRLF everywhere, blank lines counted, last line without '\n'. */
START_TEST(jsonl_crlf_and_blank_lines)
{
    const char *in = "\xEF\xBB\xBF\r\n{\"id\":\"a\",\"prompt\":\"x\\r\\n\"}\r\n\r\n  \r\n{\"id\":\"b\",\"prompt\":\"y\"}  \r\n"
                     "{\"id\":\"c\",\"prompt\":\"z\"}";
    ck_assert_int_eq(parse(in, TP_INPUT_AUTO), TP_OK);
    ck_assert_uint_eq(L.n, 3);
    ck_assert_int_eq(L.v[0].line, 2);
    assert_prompt(&L.v[0], "x\r\n");
    ck_assert_int_eq(L.v[1].line, 5);
    assert_prompt(&L.v[1], "y");
    ck_assert_int_eq(L.v[2].line, 6);
    assert_prompt(&L.v[2], "z");
}
END_TEST

/* Explicit text: JSON-looking lines are prompts; explicit JSONL on a text file flags
 * every line but reads them all. */
START_TEST(explicit_format_mismatch)
{
    const char *json = "{\"id\":\"a\",\"prompt\":\"x\"}\n";
    ck_assert_int_eq(parse(json, TP_INPUT_TEXT), TP_OK);
    ck_assert_str_eq(L.v[0].id, "1");
    assert_prompt(&L.v[0], "{\"id\":\"a\",\"prompt\":\"x\"}");

    ck_assert_int_eq(parse("one\ntwo\n\nthree\n", TP_INPUT_JSONL), TP_OK);
    ck_assert_uint_eq(L.n, 3);
    ck_assert_uint_eq(L.n_errors, 3);
    ck_assert_str_eq(L.v[2].id, "line 4");
    ck_assert_str_eq(L.v[2].error_code, "invalid_json");

    /* a JSONL file read as openai: each line says what is missing */
    ck_assert_int_eq(parse("{\"id\":\"a\",\"prompt\":\"x\"}\n{\"id\":\"b\",\"prompt\":\"y\"}\n", TP_INPUT_OPENAI), TP_OK);
    ck_assert_uint_eq(L.n_errors, 2);
    ck_assert(strstr(L.v[1].error_message, "line 2: \"custom_id\" is required"));
    ck_assert_str_eq(L.v[1].id, "line 2");

    /* a TensorRT-LLM line read as JSONL: "task_id" is an unknown field, the id the line number */
    ck_assert_int_eq(parse("{\"task_id\":\"t\",\"prompt\":\"p\"}\n", TP_INPUT_JSONL), TP_OK);
    ck_assert_str_eq(L.v[0].id, "1");
    assert_prompt(&L.v[0], "p");

    /* an openai file read as trtllm */
    ck_assert_int_eq(parse(OPENAI_COMPLETION, TP_INPUT_TRTLLM), TP_OK);
    ck_assert_str_eq(L.v[0].error_code, "invalid_request");
    ck_assert(strstr(L.v[0].error_message, "\"task_id\" is required"));
}
END_TEST

/* vocab_size <= 0: token ids are only checked against int32. */
START_TEST(unknown_vocab)
{
    const char *in = "{\"id\":\"a\",\"prompt_token_ids\":[2147483647]}\n{\"id\":\"b\",\"prompt_token_ids\":[2147483648]}\n";
    tp_requests_free(&L);
    tp_error_clear();
    ck_assert_int_eq(tp_requests_parse(in, strlen(in), "x", TP_INPUT_AUTO, 0, 0, &L), TP_OK);
    assert_ok(&L.v[0]);
    ck_assert_int_eq(L.v[0].prompt_ids[0], INT32_MAX);
    ck_assert_str_eq(L.v[1].error_code, "invalid_request");
    ck_assert(strstr(L.v[1].error_message, "2147483648 is outside [0, 2147483648)"));
}
END_TEST

/* P12: a 100 MB line with --max-line-bytes 1 MiB: an error record, the rest read. */
START_TEST(hundred_megabyte_line)
{
    size_t big = (size_t)100 << 20;
    for (int text = 0; text < 2; text++) {
        char *buf = malloc(big + 256);
        size_t n = (size_t)sprintf(buf, text ? "before\n" : "{\"id\":\"a\",\"prompt\":\"before\"}\n");
        size_t start = n;
        memset(buf + n, 'x', big), n += big;
        if (!text) memcpy(buf + start, "{\"id\":\"huge\",\"prompt\":\"", 23), memcpy(buf + n - 2, "\"}", 2);
        n += (size_t)sprintf(buf + n, text ? "\nafter" : "\n{\"id\":\"c\",\"prompt\":\"after\"}");
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ck_assert_int_eq(parse_n(buf, n, TP_INPUT_AUTO, 1 << 20), TP_OK);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        free(buf);
        ck_assert_uint_eq(L.n, 3);
        ck_assert_uint_eq(L.n_errors, 1);
        assert_prompt(&L.v[0], "before");
        assert_prompt(&L.v[2], "after");
        ck_assert_str_eq(L.v[1].error_code, "invalid_request");
        ck_assert_str_eq(L.v[1].id, text ? "2" : "line 2"); /* a text line's id is its number */
        ck_assert_str_eq(L.v[1].error_message, "line 2: the line is 104857600 bytes, more than --max-line-bytes 1048576");
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        ck_assert_msg(s < 2.0 * SLOW, "took %.2f s", s);
    }
}
END_TEST

/* P13: a million lines, generated in memory, read in a few seconds. */
START_TEST(million_lines)
{
    size_t lines = 1000000;
    char *buf = malloc(lines * 80);
    size_t n = 0;
    for (size_t i = 0; i < lines; i++)
        n += (size_t)sprintf(buf + n, "{\"id\":\"r%zu\",\"prompt\":\"prompt number %zu\",\"max_tokens\":%zu}\n", i, i,
                             1 + i % 100);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(parse_n(buf, n, TP_INPUT_AUTO, 1 << 20), TP_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    free(buf);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "check_requests: 1,000,000 JSONL lines read in %.2f s\n", s);
    ck_assert_uint_eq(L.n, lines);
    ck_assert_uint_eq(L.n_errors, 0);
    ck_assert_str_eq(L.v[777777].id, "r777777");
    assert_prompt(&L.v[777777], "prompt number 777777");
    ck_assert_int_eq(L.v[777777].p.max_tokens, 78);
    ck_assert_int_eq(L.v[lines - 1].line, (int64_t)lines);
    ck_assert_msg(s < 15.0 * SLOW, "took %.2f s", s); /* about 2-5 s on 2 busy cores */
}
END_TEST

/* ------------------------------------------------------------------------------------
 * P19: files that cannot be read. */

static char tmpdir[64];

static void make_tmpdir(void)
{
    strcpy(tmpdir, "/tmp/check_requests.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static char *tmp_path(const char *name)
{
    char *p = tp_path_join(tmpdir, name);
    ck_assert_ptr_nonnull(p);
    return p;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static tp_status read_path(const char *path)
{
    tp_requests_free(&L);
    tp_error_clear();
    return tp_requests_read(path, TP_INPUT_AUTO, VOCAB, 1 << 20, &L);
}

START_TEST(read_files)
{
    make_tmpdir();
    char *ok = tmp_path("ok.jsonl"), *missing = tmp_path("missing.jsonl"), *fifo = tmp_path("fifo"),
         *noperm = tmp_path("noperm.jsonl"), *empty = tmp_path("empty.txt");
    write_file(ok, "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\","
                   "\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n");
    ck_assert_int_eq(read_path(ok), TP_OK);
    ck_assert_uint_eq(L.n, 1);
    ck_assert_int_eq(L.v[0].endpoint, TP_ENDPOINT_CHAT);

    ck_assert_int_eq(read_path(missing), TP_ERR_IO);
    expect_error("cannot open ");
    expect_error("missing.jsonl: No such file or directory");
    ck_assert_uint_eq(L.n, 0);

    ck_assert_int_eq(read_path(tmpdir), TP_ERR_IO);
    expect_error("is a directory, not a prompt file");

    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(read_path(fifo), TP_ERR_IO); /* must not block waiting for a writer */
    expect_error("is a pipe (FIFO), not a regular file");
    expect_error("write the prompts to a file");

    ck_assert_int_eq(read_path("/dev/null"), TP_ERR_IO);
    expect_error("/dev/null is a character device, not a regular file");

    ck_assert_int_eq(read_path("-"), TP_ERR_INVALID_ARG);
    expect_error("reading prompts from standard input is not supported");

    write_file(empty, "\n\n");
    ck_assert_int_eq(read_path(empty), TP_ERR_INVALID_ARG);
    expect_error("empty.txt holds no requests");

    write_file(noperm, "x\n");
    ck_assert_int_eq(chmod(noperm, 0), 0);
    if (geteuid() != 0) { /* root reads anything */
        ck_assert_int_eq(read_path(noperm), TP_ERR_IO);
        expect_error("Permission denied");
    }
    unlink(ok), unlink(fifo), unlink(noperm), unlink(empty);
    rmdir(tmpdir);
    free(ok), free(missing), free(fifo), free(noperm), free(empty);
    tp_requests_free(&L);
}
END_TEST

/* A pipe on standard input, as /dev/stdin (P19). */
START_TEST(read_dev_stdin_pipe)
{
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    int saved = dup(0);
    ck_assert_int_eq(dup2(fd[0], 0), 0);
    tp_status st = read_path("/dev/stdin");
    dup2(saved, 0);
    close(saved), close(fd[0]), close(fd[1]);
    ck_assert_int_eq(st, TP_ERR_IO);
    expect_error("is a pipe (FIFO), not a regular file");
    expect_error("/dev/stdin");
}
END_TEST

/* The file is read in chunks of 1 MiB: what it gives must be what the same bytes give
 * from memory, across chunk boundaries, with a BOM, CRLF, blank lines, a line longer than
 * a chunk, one longer than --max-line-bytes (ending in '\r') and no final newline. */
START_TEST(stream_matches_memory)
{
    make_tmpdir();
    char *path = tmp_path("mixed.jsonl");
    const size_t max_line = (size_t)2 << 20, cap = (size_t)16 << 20;
    char *text = malloc(cap);
    size_t n = (size_t)sprintf(text, "\xEF\xBB\xBF{\"id\":\"first\",\"prompt\":\"a\"}\r\n\n  \r\n");
    for (int i = 0; i < 40000; i++) {
        n += (size_t)sprintf(text + n, "{\"id\":\"r%d\",\"prompt\":\"%*d\"}%s", i, 1 + i % 97, i, i % 3 ? "\n" : "\r\n");
        if (i == 20000 || i == 30000) { /* 1.5 MiB, then 3 MiB + '\r' (too long) */
            const size_t big = i == 20000 ? (size_t)3 << 19 : (size_t)3 << 20;
            n += (size_t)sprintf(text + n, "{\"id\":\"big%d\",\"prompt\":\"", i);
            memset(text + n, 'y', big), n += big;
            n += (size_t)sprintf(text + n, "\"}\r\n\t\n");
        }
    }
    n += (size_t)sprintf(text + n, "{\"id\":\"last\",\"prompt\":\"z\"}");
    ck_assert_uint_lt(n, cap);
    FILE *f = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(text, 1, n, f), n);
    fclose(f);

    tp_request_list mem;
    ck_assert_int_eq(tp_requests_parse(text, n, path, TP_INPUT_AUTO, VOCAB, max_line, &mem), TP_OK);
    ck_assert_int_eq(tp_requests_read_share(path, TP_INPUT_AUTO, VOCAB, max_line, NULL, &L), TP_OK);
    ck_assert_uint_eq(L.n, 40004);
    ck_assert_uint_eq(L.n, mem.n);
    ck_assert_uint_eq(L.n_total, mem.n);
    ck_assert_uint_eq(L.n_errors, 1);
    for (size_t i = 0; i < L.n; i++) {
        const tp_request *a = &L.v[i], *b = &mem.v[i];
        ck_assert_str_eq(a->id, b->id);
        ck_assert_str_eq(tp_requests_id(&L, i), b->id);
        ck_assert_int_eq(a->line, b->line);
        ck_assert_int_eq(a->pos, (int64_t)i);
        ck_assert_uint_eq(a->prompt_len, b->prompt_len);
        ck_assert(a->prompt_len == 0 || !memcmp(a->prompt, b->prompt, a->prompt_len));
        ck_assert_str_eq(a->error_message ? a->error_message : "", b->error_message ? b->error_message : "");
    }
    ck_assert_str_eq(L.v[0].id, "first");
    ck_assert_int_eq(L.v[0].line, 1);
    ck_assert_uint_eq(L.v[20002].prompt_len, (size_t)3 << 19);
    ck_assert_str_eq(L.v[30003].id, "line 30007"); /* 3 lines before r0, 2 with the first big line */
    char want[128];
    snprintf(want, sizeof want, "line 30007: the line is %zu bytes, more than --max-line-bytes %zu",
             ((size_t)3 << 20) + 29, max_line); /* the line less its "\r" */
    ck_assert_str_eq(L.v[30003].error_message, want);
    ck_assert_str_eq(L.v[L.n - 1].id, "last");
    tp_requests_free(&mem);
    tp_requests_free(&L);
    unlink(path);
    rmdir(tmpdir);
    free(path), free(text);
}
END_TEST

/* A byte order mark before a first line too long to hold is still no part of it: the
 * dialect is the next line's, and the long line's length is its own. */
START_TEST(stream_bom_before_long_line)
{
    make_tmpdir();
    char *path = tmp_path("bom.jsonl");
    FILE *f = fopen(path, "wb");
    fputs("\xEF\xBB\xBF{\"id\":\"a\",\"prompt\":\"", f);
    char ys[1024];
    memset(ys, 'y', sizeof ys);
    for (int i = 0; i < 3 << 10; i++) fwrite(ys, 1, sizeof ys, f); /* 3 MiB */
    fputs("\"}\n{\"id\":\"b\",\"prompt\":\"Once\",\"max_tokens\":2}\n", f);
    fclose(f);
    ck_assert_int_eq(tp_requests_read_share(path, TP_INPUT_AUTO, VOCAB, 1 << 20, NULL, &L), TP_OK);
    ck_assert_uint_eq(L.n, 2);
    ck_assert_str_eq(L.v[0].error_message, "line 1: the line is 3145750 bytes, more than --max-line-bytes 1048576");
    assert_prompt(&L.v[1], "Once"); /* read as JSONL, not as a line of text */
    ck_assert_str_eq(L.v[1].id, "b");
    ck_assert_int_eq(L.v[1].p.max_tokens, 2);
    tp_requests_free(&L);
    unlink(path);
    rmdir(tmpdir);
    free(path);
}
END_TEST

static long max_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* A 100 MiB line in a file is counted, not held: reading it costs a few MiB, not 100. */
START_TEST(stream_long_line_not_held)
{
    make_tmpdir();
    char *path = tmp_path("long.txt");
    FILE *f = fopen(path, "wb");
    fputs("before\n", f);
    char chunk[1 << 16];
    memset(chunk, 'x', sizeof chunk);
    for (int i = 0; i < 1600; i++) fwrite(chunk, 1, sizeof chunk, f);
    fputs("\r\nafter\n", f);
    fclose(f);
    const long before = max_rss_kib();
    ck_assert_int_eq(tp_requests_read_share(path, TP_INPUT_AUTO, VOCAB, 1 << 20, NULL, &L), TP_OK);
    const long grew = max_rss_kib() - before;
    ck_assert_msg(grew < 32 * 1024, "reading grew the peak RSS by %ld KiB", grew);
    ck_assert_uint_eq(L.n, 3);
    assert_prompt(&L.v[0], "before"); /* a text file, though its first long line was never held */
    assert_prompt(&L.v[2], "after");
    ck_assert_str_eq(L.v[1].error_message, "line 2: the line is 104857600 bytes, more than --max-line-bytes 1048576");
    ck_assert_int_eq(L.v[2].line, 3);
    tp_requests_free(&L);
    unlink(path);
    rmdir(tmpdir);
    free(path);
}
END_TEST

static int64_t kept_pos[16];
static int n_kept_seen;

static tp_status note_kept(void *arg, tp_request *r)
{
    ck_assert_ptr_eq(arg, &n_kept_seen);
    kept_pos[n_kept_seen++] = r->pos;
    free(r->prompt); /* the callee may take the payload */
    r->prompt = NULL;
    return TP_OK;
}

/* A replica's share: every parts-th request, the others counted; the rank that checks ids
 * parses them all. */
START_TEST(share_of_requests)
{
    const char *in = "{\"id\":\"a\",\"prompt\":\"0\"}\n"
                     "{\"id\":\"b\",\"prompt\":\"1\"}\n\n"
                     "{\"id\":\"c\",\"prompt\":\"2\"}\n"
                     "{\"id\":\"same\",\"prompt\":\"3\"}\n"
                     "not json\n"
                     "{\"id\":\"d\",\"prompt\":\"5\",\"max_tokenz\":1}\n"
                     "{\"id\":\"e\",\"prompt\":\"6\"}\n"
                     "{\"id\":\"same\",\"prompt\":\"7\"}\n";
    tp_request_list l;
    n_kept_seen = 0;
    tp_request_share sh = {3, 1, 0, note_kept, &n_kept_seen, NULL};
    ck_assert_int_eq(tp_requests_parse_share(in, strlen(in), "x", TP_INPUT_AUTO, VOCAB, 0, &sh, &l), TP_OK);
    ck_assert_uint_eq(l.n_total, 8);
    ck_assert_uint_eq(l.n, 3); /* pos 1, 4, 7 */
    ck_assert_int_eq(n_kept_seen, 3);
    ck_assert_int_eq(kept_pos[0], 1); ck_assert_int_eq(kept_pos[1], 4); ck_assert_int_eq(kept_pos[2], 7);
    ck_assert_str_eq(l.v[0].id, "b"); ck_assert_int_eq(l.v[0].line, 2);
    ck_assert_str_eq(l.v[1].id, "line 6"); ck_assert_int_eq(l.v[1].pos, 4);
    ck_assert_str_eq(l.v[1].error_code, "invalid_json");
    ck_assert_str_eq(l.v[2].id, "same"); ck_assert_int_eq(l.v[2].line, 9);
    ck_assert_ptr_null(l.v[0].prompt);
    ck_assert_ptr_null(tp_requests_id(&l, 0)); /* ids of other shares are not kept */
    ck_assert_int_eq(l.unknown_lines, 0);    /* their lines are not parsed */
    tp_requests_free(&l);

    /* part 2 holds the bad line; every id kept: the duplicate is seen though neither is kept */
    sh = (tp_request_share){3, 2, 1, NULL, NULL, NULL};
    ck_assert_int_eq(tp_requests_parse_share(in, strlen(in), "x", TP_INPUT_AUTO, VOCAB, 0, &sh, &l), TP_ERR_INVALID_ARG);
    ck_assert_str_eq(tp_error_message(), "x: id \"same\" is used on line 5 and again on line 9; ids must be unique");
    tp_error_clear();
    const char *unique = "{\"id\":\"a\",\"prompt\":\"0\"}\n"
                         "not json\n"
                         "{\"custom_id\":\"q\",\"prompt\":\"x\"}\n"
                         "{\"id\":\"d\",\"prompt\":\"5\",\"max_tokenz\":1}\n";
    sh.part = 1;
    ck_assert_int_eq(tp_requests_parse_share(unique, strlen(unique), "x", TP_INPUT_JSONL, VOCAB, 0, &sh, &l), TP_OK);
    ck_assert_uint_eq(l.n_total, 4);
    ck_assert_uint_eq(l.n, 1);
    ck_assert_str_eq(l.v[0].id, "line 2"); ck_assert_str_eq(l.v[0].error_code, "invalid_json");
    ck_assert_str_eq(tp_requests_id(&l, 0), "a"); ck_assert_str_eq(tp_requests_id(&l, 3), "d");
    ck_assert_int_eq(l.unknown_lines, 1); /* seen on a line of another share */
    ck_assert_int_eq(l.any_endpoint, 0);  /* a JSONL line: no endpoint */
    tp_requests_free(&l);

    /* a share of one: everything, as tp_requests_parse */
    sh = (tp_request_share){1, 0, 0, NULL, NULL, NULL};
    ck_assert_int_eq(tp_requests_parse_share(unique, strlen(unique), "x", TP_INPUT_AUTO, VOCAB, 0, &sh, &l), TP_OK);
    ck_assert_uint_eq(l.n, 4);
    ck_assert_int_eq(l.v[3].pos, 3);
    tp_requests_free(&l);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("requests");
    TCase *tc = tcase_create("dialects");
    tcase_add_test(tc, format_names);
    tcase_add_test(tc, text_lines);
    tcase_add_test(tc, text_raw_nul);
    tcase_add_test(tc, jsonl_every_field);
    tcase_add_test(tc, openai_every_field);
    tcase_add_test(tc, trtllm_every_field);
    tcase_add_loop_test(tc, auto_detect, 0, (int)TP_ARRAY_LEN(detect_cases));
    tcase_add_test(tc, edge_values_accepted);
    tcase_add_test(tc, unknown_fields_ignored);
    tcase_add_test(tc, logit_bias_and_allowed_ids);
    tcase_add_test(tc, tools_with_tool_choice_none);
    tcase_add_test(tc, ids_exact);
    tcase_add_test(tc, jsonl_crlf_and_blank_lines);
    tcase_add_test(tc, explicit_format_mismatch);
    tcase_add_test(tc, unknown_vocab);
    tcase_add_checked_fixture(tc, NULL, free_list);
    suite_add_tcase(s, tc);

    TCase *bad = tcase_create("bad_input");
    tcase_add_loop_test(bad, bad_line, 0, (int)TP_ARRAY_LEN(bad_cases));
    tcase_add_loop_test(bad, duplicate_ids, 0, (int)TP_ARRAY_LEN(dup_cases));
    tcase_add_test(bad, unreadable_id_takes_no_other_lines_id);
    tcase_add_test(bad, long_ids_in_messages);
    tcase_add_test(bad, no_requests);
    tcase_add_test(bad, read_files);
    tcase_add_test(bad, read_dev_stdin_pipe);
    tcase_add_checked_fixture(bad, NULL, free_list);
    suite_add_tcase(s, bad);

    TCase *big = tcase_create("big");
    tcase_set_timeout(big, 120);
    tcase_add_test(big, megabyte_id);
    tcase_add_test(big, hundred_megabyte_line);
    tcase_add_test(big, million_lines);
    tcase_add_test(big, big_line_bad_utf8);
    tcase_add_test(big, stream_matches_memory);
    tcase_add_test(big, stream_long_line_not_held);
    tcase_add_test(big, stream_bom_before_long_line);
    tcase_add_test(big, share_of_requests);
    tcase_add_checked_fixture(big, NULL, free_list);
    suite_add_tcase(s, big);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
