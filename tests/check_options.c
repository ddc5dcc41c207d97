/*
 * check_options.c: every flag's parsing, its defaults, and each bad value's one-line
 * message (catalog L1, L3, L4 of anchors/reliability.md).
 */
#include <check.h>
#include <stdarg.h>
#include <string.h>

#include "options.h"
#include "util.h"

static tp_options opts;

/* Parse a NULL-terminated list of arguments (argv[0] is added). */
static tp_status parse(const char *first, ...)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"tpinfer";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 63; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    tp_error_clear();
    return tp_options_parse(argc, argv, &opts);
}

static void expect_error(const char *needle)
{
    ck_assert_msg(strstr(tp_error_message(), needle), "message '%s' lacks '%s'", tp_error_message(),
                  needle);
}

START_TEST(defaults)
{
    ck_assert_int_eq(parse("--model", "m", "--input", "p.txt", NULL), TP_OK);
    ck_assert_int_eq(opts.mode, TP_MODE_GENERATE);
    ck_assert_str_eq(opts.model, "m");
    ck_assert_str_eq(opts.input, "p.txt");
    ck_assert_ptr_null(opts.output);
    ck_assert_int_eq(opts.tp, 1);
    ck_assert_int_eq(opts.pp, 1);
    ck_assert_int_eq(opts.max_model_len, 0);
    ck_assert_int_eq(opts.max_num_seqs, 0);           /* the engine chooses by the device */
    ck_assert_int_eq(opts.max_num_batched_tokens, 0); /* the same */
    ck_assert_double_eq(opts.gpu_memory_utilization, 0.9);
    ck_assert_uint_eq(opts.seed, 0);
    ck_assert_str_eq(opts.dtype, "auto");
    ck_assert_str_eq(opts.backend, "auto");
    ck_assert_int_eq(opts.enforce_eager, 0); /* decode steps as CUDA graphs */
    ck_assert_double_lt(opts.step_timeout, 0); /* the backend's default */
    ck_assert_int_eq(parse("--model", "m", "--input", "p.txt", "--step-timeout", "2.5", NULL), TP_OK);
    ck_assert_double_eq(opts.step_timeout, 2.5);
    ck_assert_int_eq(parse("--model", "m", "--input", "p.txt", "--enforce-eager", NULL), TP_OK);
    ck_assert_int_eq(opts.enforce_eager, 1);
    ck_assert_int_ne(parse("--model", "m", "--input", "p.txt", "--enforce-eager=1", NULL), TP_OK);
}
END_TEST

START_TEST(every_flag)
{
    ck_assert_int_eq(parse("--model=m", "--dry-run", "--tensor-parallel-size", "4", "--pp=2",
                           "--max-model-len", "4096", "--max-num-seqs", "8",
                           "--max-num-batched-tokens", "512", "--gpu-memory-utilization", "0.5",
                           "--seed", "7", "--dtype", "bfloat16", "--backend", "cpu", "-o", "out",
                           "-i", "in", NULL),
                     TP_OK);
    ck_assert_int_eq(opts.mode, TP_MODE_DRY_RUN);
    ck_assert_int_eq(opts.tp, 4);
    ck_assert_int_eq(opts.pp, 2);
    ck_assert_int_eq(opts.max_model_len, 4096);
    ck_assert_int_eq(opts.max_num_seqs, 8);
    ck_assert_int_eq(opts.max_num_batched_tokens, 512);
    ck_assert_double_eq(opts.gpu_memory_utilization, 0.5);
    ck_assert_uint_eq(opts.seed, 7);
    ck_assert_str_eq(opts.dtype, "bfloat16");
    ck_assert_str_eq(opts.backend, "cpu");
    ck_assert_str_eq(opts.output, "out");
    ck_assert_str_eq(opts.input, "in");
    /* aliases, and the last of a repeated flag wins */
    ck_assert_int_eq(parse("--model", "m", "--dry-run", "--tp", "2", "--tp", "8", NULL), TP_OK);
    ck_assert_int_eq(opts.tp, 8);
    ck_assert_int_eq(parse("--model", "m", "--dry-run", "--pipeline-parallel-size", "3", NULL), TP_OK);
    ck_assert_int_eq(opts.pp, 3);
}
END_TEST

START_TEST(help_and_version_need_nothing_else)
{
    ck_assert_int_eq(parse("--help", NULL), TP_OK);
    ck_assert_int_eq(opts.mode, TP_MODE_HELP);
    ck_assert_int_eq(parse("--version", NULL), TP_OK);
    ck_assert_int_eq(opts.mode, TP_MODE_VERSION);
    ck_assert_int_eq(parse("--tp", "3", "-h", NULL), TP_OK);
    ck_assert_int_eq(opts.mode, TP_MODE_HELP);
}
END_TEST

static const struct {
    const char *flag, *value, *needle;
} bad_values[] = {
    {"--tp", "2x", "--tp: '2x' is not allowed"},
    {"--tp", "-1", "from 1 to"},
    {"--tp", "0", "from 1 to"},
    {"--tensor-parallel-size", "1.5", "--tensor-parallel-size: '1.5'"},
    {"--pp", "abc", "--pp: 'abc'"},
    {"--step-timeout", "-1", "--step-timeout: '-1' is not allowed; give seconds from 0 (never) to 604800"},
    {"--step-timeout", "10m", "--step-timeout: '10m'"},
    {"--max-num-seqs", "1e3", "whole number"},
    {"--max-model-len", "99999999999999999999", "whole number"},
    {"--max-num-batched-tokens", "0", "from 1 to"},
    {"--max-num-batched-tokens", "2147483648", "from 1 to"}, /* steps are counted in 32 bits */
    {"--gpu-memory-utilization", "1.5", "(0, 1]"},
    {"--gpu-memory-utilization", "0", "(0, 1]"},
    {"--gpu-memory-utilization", "nan", "(0, 1]"},
    {"--seed", "-3", "--seed"},
    {"--seed", "18446744073709551616", "--seed"},
    {"--dtype", "float64", "auto, float32, float16, bfloat16"},
    {"--dtype", "int32", "auto, float32"},
    {"--backend", "tpu", "auto, cpu, cuda"},
    {"--max-tokens", "0", "--max-tokens: '0' is not allowed; give a whole number from 1 to"},
    {"--temperature", "-0.5", "--temperature: '-0.5' is not allowed; give a number from 0 to 100"},
    {"--temperature", "101", "from 0 to 100"},
    {"--temperature", "hot", "--temperature: 'hot'"},
    {"--top-p", "0", "--top-p: '0' is not allowed; give a number in (0, 1]"},
    {"--top-p", "1.01", "(0, 1]"},
    {"--top-k", "-2", "--top-k: '-2' is not allowed; give a whole number from -1 to"},
    {"--kv-block-size", "0", "from 1 to 1024"},
    {"--kv-block-size", "2048", "from 1 to 1024"},
    {"--kv-cache-memory", "lots", "--kv-cache-memory: 'lots' is not allowed; give bytes with an optional unit"},
    {"--kv-cache-memory", "0", "such as 512MiB or 4GiB"},
    {"--input-format", "csv", "auto, text, jsonl, openai, trtllm"},
    {"--max-line-bytes", "0", "--max-line-bytes: '0' is not allowed; give bytes such as 64MiB"},
    {"--max-line-bytes", "1XB", "give bytes such as 64MiB"},
    {"--progress-interval", "-1", "--progress-interval: '-1' is not allowed; give seconds from 0 to 86400"},
    {"--progress-interval", "86401", "from 0 to 86400"},
    {"--tool-call-parser", "pythonic", "--tool-call-parser: 'pythonic' is not allowed; give hermes"},
    {"--check-max-bytes", "1KiB", "--check-max-bytes: '1KiB' is not allowed; give bytes from 4KiB to 8GiB"},
};

START_TEST(bad_value)
{
    ck_assert_int_eq(parse("--model", "m", "--dry-run", bad_values[_i].flag, bad_values[_i].value, NULL),
                     TP_ERR_INVALID_ARG);
    expect_error(bad_values[_i].needle);
    ck_assert_ptr_null(strchr(tp_error_message(), '\n'));
}
END_TEST

START_TEST(bad_usage)
{
    ck_assert_int_eq(parse("--model", "m", "--dry-run", "--frobnicate", NULL), TP_ERR_INVALID_ARG);
    expect_error("unknown option '--frobnicate'");
    ck_assert_int_eq(parse("--model", "m", "--dry-run", "-z", NULL), TP_ERR_INVALID_ARG);
    expect_error("unknown option '-z'");
    ck_assert_int_eq(parse("--model", "m", "--dry-run", "--tp", NULL), TP_ERR_INVALID_ARG);
    expect_error("needs a value");
    ck_assert_int_eq(parse("--model", "m", "--dry-run", "--tp=", NULL), TP_ERR_INVALID_ARG);
    expect_error("--tp: the value is empty");
    ck_assert_int_eq(parse("--model=", "--dry-run", NULL), TP_ERR_INVALID_ARG);
    expect_error("--model: the value is empty");
    ck_assert_int_eq(parse("--dry-run", NULL), TP_ERR_INVALID_ARG);
    expect_error("--model is required");
    ck_assert_int_eq(parse("--model", "m", NULL), TP_ERR_INVALID_ARG);
    expect_error("--input is required");
    ck_assert_int_eq(parse("--model", "m", "--dry-run", "stray", NULL), TP_ERR_INVALID_ARG);
    expect_error("unexpected argument 'stray'");
    ck_assert_int_eq(parse("--model", "m", "--input", "p", "--output", "o", "--resume", "--overwrite", NULL),
                     TP_ERR_INVALID_ARG);
    expect_error("--resume and --overwrite contradict each other; give one");
    ck_assert_int_eq(parse("--model", "m", "--input", "p", "--output", "o", "--force", NULL), TP_ERR_INVALID_ARG);
    expect_error("--force only applies with --resume");
    ck_assert_int_eq(parse("--model", "m", "--input", "p", "--resume", NULL), TP_ERR_INVALID_ARG);
    expect_error("--resume needs --output FILE");
    ck_assert_int_eq(parse("--model", "m", "--tokenize", NULL), TP_ERR_INVALID_ARG);
    expect_error("--input is required with --tokenize and --detokenize");
    ck_assert_int_eq(parse("--model", "m", "--detokenize", NULL), TP_ERR_INVALID_ARG);
    expect_error("--input is required with --tokenize and --detokenize");
}
END_TEST

START_TEST(parse_twice_resets_state)
{
    ck_assert_int_eq(parse("--model", "a", "--dry-run", "--tp", "4", NULL), TP_OK);
    ck_assert_int_eq(parse("--model", "b", "--dry-run", NULL), TP_OK);
    ck_assert_int_eq(opts.tp, 1);
    ck_assert_str_eq(opts.model, "b");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, every_flag);
    tcase_add_test(tc, help_and_version_need_nothing_else);
    tcase_add_loop_test(tc, bad_value, 0, (int)TP_ARRAY_LEN(bad_values));
    tcase_add_test(tc, bad_usage);
    tcase_add_test(tc, parse_twice_resets_state);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
