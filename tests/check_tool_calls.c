/*
 * check_tool_calls.c: the hermes, llama3_json and mistral tool-call parsers against vLLM
 * 0.10's: every expectation is what vLLM's code (extract_tool_calls and serving_chat's use of
 * it, restated in Python with its json and re) gives for the text: whether tools were called,
 * the content and the calls, the arguments as json.dumps(ensure_ascii=False) writes them;
 * then what differs on purpose (JSON jansson refuses), the call ids, the parser
 * names and the marker a chat template shows; then the output lines a chat completion with
 * calls becomes (OpenAI's message.tool_calls, the compact line's tool_calls).
 */
#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "completion.h"
#include "tool_calls.h"

typedef struct expected_call {
    const char *name, *arguments;
} expected_call;

typedef struct parse_case {
    tp_tool_parser parser;
    const char *text;
    const char *content; /* NULL: none (JSON null) */
    int called;          /* vLLM's tools_called */
    size_t n;
    expected_call calls[2];
} parse_case;

static const parse_case cases[] = {
    {TP_TOOL_PARSER_HERMES, "Hello, no tools here.", "Hello, no tools here.", 0, 0, {}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>", NULL, 1, 1, {{"get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}},
    {TP_TOOL_PARSER_HERMES, "Let me check.\n<tool_call>\n{\"name\":\"a\",\"arguments\":{\"x\":1.5,\"y\":[1,2e3,-0,-0.0],\"z\":\"\303\251\\n\\u0001\",\"t\":0.1,\"b\":1e100}}\n</tool_call>\n<tool_call>\n{\"name\":\"b\",\"arguments\":{}}\n</tool_call>", "Let me check.\n", 1, 2, {{"a", "{\"x\": 1.5, \"y\": [1, 2000.0, 0, -0.0], \"z\": \"\303\251\\n\\u0001\", \"t\": 0.1, \"b\": 1e+100}"}, {"b", "{}"}}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":{\"q\":\"x\"}}", NULL, 1, 1, {{"f", "{\"q\": \"x\"}"}}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":\"already a string\"}</tool_call> and after", NULL, 1, 1, {{"f", "\"already a string\""}}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":}</tool_call>", "<tool_call>{\"name\":\"f\",\"arguments\":}</tool_call>", 0, 0, {}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>{\"name\":\"f\"}</tool_call>", "<tool_call>{\"name\":\"f\"}</tool_call>", 0, 0, {}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>{\"name\":7,\"arguments\":{}}</tool_call>", "<tool_call>{\"name\":7,\"arguments\":{}}</tool_call>", 0, 0, {}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>[1]</tool_call>", "<tool_call>[1]</tool_call>", 0, 0, {}},
    {TP_TOOL_PARSER_HERMES, "<tool_call></tool_call>", "<tool_call></tool_call>", 0, 0, {}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":{\"k\":1,\"k\":2}}</tool_call>", NULL, 1, 1, {{"f", "{\"k\": 2}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", NULL, 1, 1, {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"a\": 1}}; {\"name\": \"g\", \"parameters\": {\"b\": true, \"c\": null}}", NULL, 1, 2, {{"f", "{\"a\": 1}"}, {"g", "{\"b\": true, \"c\": null}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, " {\"name\": \"f\", \"parameters\": {}}", NULL, 1, 1, {{"f", "{}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "Sure! {\"name\": \"f\", \"parameters\": {}}", NULL, 1, 1, {{"f", "{}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {}}\n\n", NULL, 1, 1, {{"f", "{}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {}}\n\n\n", NULL, 1, 1, {{"f", "{}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\"}", "{\"name\": \"f\"}", 0, 0, {}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {\"s\": \"\346\227\245\346\234\254\"}}; {\"name\": \"g\", \"parameters\": {}}", NULL, 1, 2, {{"f", "{\"s\": \"\346\227\245\346\234\254\"}"}, {"g", "{}"}}},
    {TP_TOOL_PARSER_MISTRAL, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}]", NULL, 1, 1, {{"f", "{\"a\": \"b\"}"}}},
    {TP_TOOL_PARSER_MISTRAL, "Sure. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"name\":\"g\",\"arguments\":{\"n\":null}}] trailing", "Sure. ", 1, 2, {{"f", "{}"}, {"g", "{\"n\": null}"}}},
    {TP_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]not json", "not json", 0, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "  [TOOL_CALLS] {\"name\": \"f\", \"arguments\": {}}  ", "{\"name\": \"f\", \"arguments\": {}}", 0, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "No tag at all.", "No tag at all.", 0, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "[TOOL_CALLS][]", NULL, 1, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]{}", NULL, 1, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "Hi [TOOL_CALLS]\"\"", "Hi \"\"", 0, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "Hi [TOOL_CALLS] not json ", "Hi  not json", 0, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]", "[TOOL_CALLS]", 0, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "[TOOL_CALLS][{\"name\": \"f\"}]", "[{\"name\": \"f\"}]", 0, 0, {}},
    {TP_TOOL_PARSER_MISTRAL, "a[TOOL_CALLS][{\"name\": \"f\", \"arguments\": 1}][TOOL_CALLS]", "a", 1, 1, {{"f", "1"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {}}\303\251{\"name\": \"g\", \"parameters\": {}}", NULL, 1, 1, {{"f", "{}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {}};{\"name\": \"g\", \"arguments\": {\"x\": \"\346\227\245\"}}", NULL, 1, 2, {{"f", "{}"}, {"g", "{\"x\": \"\346\227\245\"}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "<|python_tag|>", "<|python_tag|>", 0, 0, {}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "Sure, calling it: {\"name\": \"f\", \"parameters\": {\"a\": 1}} now", NULL, 1, 1, {{"f", "{\"a\": 1}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {\"a\": {\"b\": 1}}}", "{\"name\": \"f\", \"parameters\": {\"a\": {\"b\": 1}}}", 0, 0, {}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {\"s\": \"a;b\"}}", "{\"name\": \"f\", \"parameters\": {\"s\": \"a;b\"}}", 0, 0, {}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "Use {x} or {\"name\": \"f\", \"parameters\": {}}", "Use {x} or {\"name\": \"f\", \"parameters\": {}}", 0, 0, {}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {}} ; {\"name\": \"g\", \"parameters\": {}} ; oops", NULL, 1, 2, {{"f", "{}"}, {"g", "{}"}}},
    {TP_TOOL_PARSER_HERMES, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call> mid <tool_call>{\"name\":\"b\",\"arguments\":{\"z\":[]}}", NULL, 1, 2, {{"a", "{}"}, {"b", "{\"z\": []}"}}},
    /* whitespace as vLLM's regex module matches \s (Unicode's White_Space: not U+001C, but
     * U+00A0) and str.strip() strips (both) */
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\":\"f\",\"arguments\":{}}\034;{\"name\":\"g\",\"arguments\":{}}", NULL, 1, 1, {{"f", "{}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\":\"f\",\"arguments\":{}}\302\240;{\"name\":\"g\",\"arguments\":{}}", NULL, 1, 2, {{"f", "{}"}, {"g", "{}"}}},
    {TP_TOOL_PARSER_LLAMA3_JSON, "{\"name\":\"f\",\"arguments\":{}}\343\200\200;\343\200\200{\"name\":\"g\",\"arguments\":{}}", NULL, 1, 2, {{"f", "{}"}, {"g", "{}"}}},
    {TP_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]\302\240[{\"name\": \"f\", \"arguments\": {}}]\342\200\250", NULL, 1, 1, {{"f", "{}"}}},
    {TP_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]\343\200\200not json\034", "not json", 0, 0, {}},
};

START_TEST(parse_as_vllm)
{
    const parse_case *c = &cases[_i];
    tp_tool_calls t;
    ck_assert_int_eq(tp_tool_calls_parse(c->parser, c->text, strlen(c->text), &t), TP_OK);
    ck_assert_msg(t.called == c->called && t.n == c->n, "case %d (%s): called %d, %zu calls; expected %d, %zu", _i,
                  tp_tool_parser_name(c->parser), t.called, t.n, c->called, c->n);
    if (c->content) {
        ck_assert_msg(t.content && t.content_len == strlen(c->content) && !memcmp(t.content, c->content, t.content_len),
                      "case %d: content \"%s\", expected \"%s\"", _i, t.content ? t.content : "(null)", c->content);
    } else {
        ck_assert_msg(!t.content && t.content_len == 0, "case %d: content \"%s\", expected none", _i, t.content);
    }
    for (size_t k = 0; k < t.n; k++) {
        ck_assert_str_eq(t.v[k].name, c->calls[k].name);
        ck_assert_str_eq(t.v[k].arguments, c->calls[k].arguments);
    }
    tp_tool_calls_free(&t);
    ck_assert_ptr_null(t.v);
}
END_TEST

/* Where tpinfer differs from vLLM, on purpose: JSON that Python reads and jansson refuses
 * (NaN, Infinity, integers beyond 64 bits) makes no call; the text stays content */
START_TEST(json_python_reads_and_jansson_refuses)
{
    static const char *const texts[] = {
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": NaN}}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": -Infinity}}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 123456789012345678901234567890}}</tool_call>",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        tp_tool_calls t;
        ck_assert_int_eq(tp_tool_calls_parse(TP_TOOL_PARSER_HERMES, texts[i], strlen(texts[i]), &t), TP_OK);
        ck_assert(!t.called && t.n == 0);
        ck_assert_str_eq(t.content, texts[i]);
        tp_tool_calls_free(&t);
    }
}
END_TEST

/* tool_choice "required": the text is a list of {"name", "parameters"}; each is a call, its
 * arguments as json.dumps writes the parameters (the expectations are Python's); a list cut
 * short keeps the items written whole, brackets and quotes inside strings not counted */
START_TEST(required_list)
{
    static const struct {
        const char *text;
        size_t n;
        expected_call calls[2];
    } lists[] = {
        {"[{\"name\": \"a\", \"parameters\": {\"x\": 0.1, \"y\": [1e20, -0.0], \"s\": \"\303\251\\u00e9\"}}, "
         "{\"name\":\"b\",\"parameters\":{}}]",
         2, {{"a", "{\"x\": 0.1, \"y\": [1e+20, -0.0], \"s\": \"\303\251\303\251\"}"}, {"b", "{}"}}},
        {" [\n{\"name\": \"a\", \"parameters\": {\"k\": \"}]\\\"[{\"}} ,\n {\"name\": \"b\", \"param", 1,
         {{"a", "{\"k\": \"}]\\\"[{\"}"}}},
        {"[{\"name\": \"a\", \"parameters\": {\"k\": [1, {\"z\": 2}]", 0, {}},
        {"[", 0, {}},
        {"", 0, {}},
    };
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        tp_tool_calls t;
        ck_assert_int_eq(tp_tool_calls_parse_list(lists[i].text, strlen(lists[i].text), &t), TP_OK);
        ck_assert(t.called && !t.content);
        ck_assert_uint_eq(t.n, lists[i].n);
        for (size_t k = 0; k < t.n; k++) {
            ck_assert_str_eq(t.v[k].name, lists[i].calls[k].name);
            ck_assert_str_eq(t.v[k].arguments, lists[i].calls[k].arguments);
        }
        tp_tool_calls_free(&t);
    }
}
END_TEST

/* No parser, or no text: the text is the content; an empty text has none */
START_TEST(no_parser_no_text)
{
    tp_tool_calls t;
    const char *s = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    ck_assert_int_eq(tp_tool_calls_parse(TP_TOOL_PARSER_NONE, s, strlen(s), &t), TP_OK);
    ck_assert_uint_eq(t.n, 0);
    ck_assert_str_eq(t.content, s);
    tp_tool_calls_free(&t);
    ck_assert_int_eq(tp_tool_calls_parse(TP_TOOL_PARSER_HERMES, "", 0, &t), TP_OK);
    ck_assert_uint_eq(t.n, 0);
    ck_assert_ptr_null(t.content);
    tp_tool_calls_free(&t);
    ck_assert_int_eq(tp_tool_calls_parse(TP_TOOL_PARSER_MISTRAL, NULL, 0, &t), TP_OK);
    ck_assert_uint_eq(t.n, 0);
    ck_assert_ptr_null(t.content);
    /* a NUL inside the text stays in the content, which is counted, not terminated */
    const char with_nul[] = "a\0b";
    ck_assert_int_eq(tp_tool_calls_parse(TP_TOOL_PARSER_HERMES, with_nul, 3, &t), TP_OK);
    ck_assert_uint_eq(t.content_len, 3);
    ck_assert(!memcmp(t.content, with_nul, 3));
    tp_tool_calls_free(&t);
}
END_TEST

/* Ids: the same for the same request, choice and call; another for another; vLLM's shape,
 * and 9 letters and digits for mistral */
START_TEST(call_ids)
{
    char a[64], b[64], c[64], d[64], m[64];
    tp_tool_call_id(TP_TOOL_PARSER_HERMES, "req-1", 0, 0, a, sizeof a);
    tp_tool_call_id(TP_TOOL_PARSER_HERMES, "req-1", 0, 0, b, sizeof b);
    tp_tool_call_id(TP_TOOL_PARSER_HERMES, "req-1", 0, 1, c, sizeof c);
    tp_tool_call_id(TP_TOOL_PARSER_HERMES, "req-2", 0, 0, d, sizeof d);
    ck_assert_str_eq(a, b);
    ck_assert_str_ne(a, c);
    ck_assert_str_ne(a, d);
    ck_assert_uint_eq(strlen(a), strlen("chatcmpl-tool-") + 32);
    ck_assert(!strncmp(a, "chatcmpl-tool-", 14));
    ck_assert_uint_eq(strspn(a + 14, "0123456789abcdef"), 32);
    tp_tool_call_id(TP_TOOL_PARSER_MISTRAL, "req-1", 1, 0, m, sizeof m);
    ck_assert_uint_eq(strlen(m), 9);
    ck_assert_uint_eq(strspn(m, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"), 9);
    tp_tool_call_id(TP_TOOL_PARSER_MISTRAL, "req-1", 1, 1, b, sizeof b);
    ck_assert_str_ne(m, b);
}
END_TEST

START_TEST(names_and_templates)
{
    ck_assert_int_eq(tp_tool_parser_from_name("hermes"), TP_TOOL_PARSER_HERMES);
    ck_assert_int_eq(tp_tool_parser_from_name("llama3_json"), TP_TOOL_PARSER_LLAMA3_JSON);
    ck_assert_int_eq(tp_tool_parser_from_name("mistral"), TP_TOOL_PARSER_MISTRAL);
    ck_assert_int_eq(tp_tool_parser_from_name("none"), -1);
    ck_assert_int_eq(tp_tool_parser_from_name("Hermes"), -1);
    ck_assert_int_eq(tp_tool_parser_from_name(NULL), -1);
    ck_assert_str_eq(tp_tool_parser_name(TP_TOOL_PARSER_LLAMA3_JSON), "llama3_json");
    ck_assert_int_eq(tp_tool_parser_of_template("{{ '<tool_call>\\n' + tool_call | tojson }}"), TP_TOOL_PARSER_HERMES);
    ck_assert_int_eq(tp_tool_parser_of_template("{{- \"<|python_tag|>\" + tool_call.name }}"),
                     TP_TOOL_PARSER_LLAMA3_JSON);
    ck_assert_int_eq(tp_tool_parser_of_template("{{ '[TOOL_CALLS]' }}"), TP_TOOL_PARSER_MISTRAL);
    ck_assert_int_eq(tp_tool_parser_of_template("{{ messages }}"), TP_TOOL_PARSER_NONE);
    ck_assert_int_eq(tp_tool_parser_of_template("<tool_call> [TOOL_CALLS]"), TP_TOOL_PARSER_NONE);
    ck_assert_int_eq(tp_tool_parser_of_template(NULL), TP_TOOL_PARSER_NONE);
}
END_TEST

/* The output line of one finished chat choice of text, through tp_completion_format */
static json_t *line_of(tp_endpoint endpoint, tp_tool_parser parser, int single, const char *text, int32_t n_choices)
{
    static int32_t out_ids[2] = {11, 12}, prompt[2] = {1, 2};
    tp_request rq;
    memset(&rq, 0, sizeof rq);
    rq.id = "req-7";
    rq.endpoint = endpoint;
    rq.parse_tool_calls = parser != TP_TOOL_PARSER_NONE;
    rq.single_tool_call = single;
    tp_choice ch[2];
    memset(ch, 0, sizeof ch);
    for (int j = 0; j < 2; j++) {
        ch[j].text = (char *)text;
        ch[j].len = strlen(text);
        ch[j].finish = TP_FINISH_STOP;
        ch[j].stop_token = -1;
        ch[j].out = (tp_ids){out_ids, 2, 2};
    }
    tp_completion c = {&rq, 3, 2, prompt, ch, n_choices, NULL, 0, "m", 1700000000, parser, 0};
    char *line = NULL;
    size_t len = 0;
    ck_assert_int_eq(tp_completion_format(&c, NULL, &line, &len), TP_OK);
    json_error_t err;
    json_t *o = json_loadb(line, len, 0, &err);
    ck_assert_msg(o != NULL, "%s: %s", line, err.text);
    free(line);
    return o;
}

/* An OpenAI line's first choice: response.body.choices[0] */
static json_t *chat_choice(json_t *o)
{
    json_t *body = json_object_get(json_object_get(o, "response"), "body");
    json_t *choice = json_array_get(json_object_get(body, "choices"), 0);
    ck_assert_msg(choice != NULL, "no response.body.choices[0]");
    return choice;
}

static const char *str_at(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_string(v), "%s is not a string", key);
    return json_string_value(v);
}

START_TEST(output_lines)
{
    const char *two = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n"
                      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    /* OpenAI chat: content before the calls, the calls, finish_reason "tool_calls" */
    json_t *o = line_of(TP_ENDPOINT_CHAT, TP_TOOL_PARSER_HERMES, 0, two, 1);
    json_t *msg = json_object_get(chat_choice(o), "message");
    ck_assert_str_eq(json_string_value(json_object_get(msg, "content")), "Checking.\n");
    json_t *calls = json_object_get(msg, "tool_calls");
    ck_assert_uint_eq(json_array_size(calls), 2);
    json_t *c0 = json_array_get(calls, 0);
    ck_assert_str_eq(json_string_value(json_object_get(c0, "type")), "function");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(c0, "function"), "name")), "get_weather");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(c0, "function"), "arguments")),
                     "{\"city\": \"Paris\"}");
    char id[64];
    tp_tool_call_id(TP_TOOL_PARSER_HERMES, "req-7", 0, 0, id, sizeof id);
    ck_assert_str_eq(json_string_value(json_object_get(c0, "id")), id);
    json_t *choice = chat_choice(o);
    ck_assert_str_eq(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
    ck_assert(json_is_null(json_object_get(choice, "stop_reason")));
    json_decref(o);
    /* "parallel_tool_calls": false: the first call */
    o = line_of(TP_ENDPOINT_CHAT, TP_TOOL_PARSER_HERMES, 1, two, 1);
    calls = json_object_get(json_object_get(chat_choice(o), "message"), "tool_calls");
    ck_assert_uint_eq(json_array_size(calls), 1);
    json_decref(o);
    /* nothing before the calls: content null */
    o = line_of(TP_ENDPOINT_CHAT, TP_TOOL_PARSER_LLAMA3_JSON, 0, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}", 1);
    msg = json_object_get(chat_choice(o), "message");
    ck_assert(json_is_null(json_object_get(msg, "content")));
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0),
                                                                       "function"), "arguments")), "{\"a\": 1}");
    json_decref(o);
    /* no calls found, or no parser: the text as it is, no tool_calls, the finish reason */
    for (int parser = 0; parser < 2; parser++) {
        o = line_of(TP_ENDPOINT_CHAT, parser ? TP_TOOL_PARSER_HERMES : TP_TOOL_PARSER_NONE, 0,
                    parser ? "plain text" : two, 1);
        choice = chat_choice(o);
        msg = json_object_get(choice, "message");
        ck_assert_str_eq(json_string_value(json_object_get(msg, "content")), parser ? "plain text" : two);
        ck_assert_ptr_null(json_object_get(msg, "tool_calls"));
        ck_assert_str_eq(json_string_value(json_object_get(choice, "finish_reason")), "stop");
        json_decref(o);
    }
    /* mistral's calls that do not parse: the text without its tag is the content (vLLM's
     * serving takes the parser's content where it is not empty); "[]": called, no calls */
    o = line_of(TP_ENDPOINT_CHAT, TP_TOOL_PARSER_MISTRAL, 0, "Hi [TOOL_CALLS] not json ", 1);
    choice = chat_choice(o);
    msg = json_object_get(choice, "message");
    ck_assert_str_eq(json_string_value(json_object_get(msg, "content")), "Hi  not json");
    ck_assert_ptr_null(json_object_get(msg, "tool_calls"));
    ck_assert_str_eq(json_string_value(json_object_get(choice, "finish_reason")), "stop");
    json_decref(o);
    o = line_of(TP_ENDPOINT_CHAT, TP_TOOL_PARSER_MISTRAL, 0, "[TOOL_CALLS][]", 1);
    choice = chat_choice(o);
    msg = json_object_get(choice, "message");
    ck_assert(json_is_null(json_object_get(msg, "content")));
    ck_assert(json_is_array(json_object_get(msg, "tool_calls")) && json_array_size(json_object_get(msg, "tool_calls")) == 0);
    ck_assert_str_eq(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
    json_decref(o);
    /* the compact line: text is the content, tool_calls beside it; n = 2: each choice's, ids
     * by choice */
    o = line_of(TP_ENDPOINT_NONE, TP_TOOL_PARSER_MISTRAL, 0, "Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]", 2);
    ck_assert_str_eq(str_at(o, "text"), "Sure.");
    ck_assert_str_eq(str_at(o, "finish_reason"), "tool_calls");
    ck_assert_uint_eq(json_array_size(json_object_get(o, "tool_calls")), 1);
    json_t *all = json_object_get(o, "choices");
    ck_assert_uint_eq(json_array_size(all), 2);
    char id1[64];
    tp_tool_call_id(TP_TOOL_PARSER_MISTRAL, "req-7", 1, 0, id1, sizeof id1);
    json_t *second = json_array_get(json_object_get(json_array_get(all, 1), "tool_calls"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(second, "id")), id1);
    ck_assert_uint_eq(strlen(id1), 9);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(all, 1), "finish_reason")), "tool_calls");
    json_decref(o);
    /* compact, nothing before the calls: "text" is "", and parallel_tool_calls false holds */
    o = line_of(TP_ENDPOINT_NONE, TP_TOOL_PARSER_HERMES, 1, two + strlen("Checking.\n"), 1);
    ck_assert_str_eq(str_at(o, "text"), "");
    ck_assert_uint_eq(json_array_size(json_object_get(o, "tool_calls")), 1);
    json_decref(o);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tool_calls");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, parse_as_vllm, 0, (int)(sizeof cases / sizeof cases[0]));
    tcase_add_test(tc, json_python_reads_and_jansson_refuses);
    tcase_add_test(tc, no_parser_no_text);
    tcase_add_test(tc, required_list);
    tcase_add_test(tc, call_ids);
    tcase_add_test(tc, names_and_templates);
    tcase_add_test(tc, output_lines);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
