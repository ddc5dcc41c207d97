/*
 * options.c: getopt_long parsing with strict values (no "2x", no overflow, no empty
 * values) and a --help generated from the same table, so they cannot disagree.
 */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "tool_calls.h"
#include "util.h"

enum {
    OPT_HELP = 'h',
    OPT_VERSION = 'V',
    OPT_MODEL = 'm',
    OPT_INPUT = 'i',
    OPT_OUTPUT = 'o',
    OPT_TP = 256,
    OPT_PP,
    OPT_DRY_RUN,
    OPT_MAX_MODEL_LEN,
    OPT_MAX_NUM_SEQS,
    OPT_MAX_NUM_BATCHED_TOKENS,
    OPT_GPU_MEMORY_UTILIZATION,
    OPT_SEED,
    OPT_DTYPE,
    OPT_BACKEND,
    OPT_ENFORCE_EAGER,
    OPT_PREFIX_CACHING,
    OPT_NO_PREFIX_CACHING,
    OPT_MAX_TOKENS,
    OPT_TEMPERATURE,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_IGNORE_EOS,
    OPT_KV_BLOCK_SIZE,
    OPT_KV_CACHE_MEMORY,
    OPT_DUMP_LOGITS,
    OPT_INPUT_FORMAT,
    OPT_MAX_LINE_BYTES,
    OPT_ERRORS,
    OPT_ORDERED,
    OPT_RESUME,
    OPT_FORCE,
    OPT_OVERWRITE,
    OPT_STATUS_FILE,
    OPT_PROGRESS_INTERVAL,
    OPT_STEP_TIMEOUT,
    OPT_CHAT_TEMPLATE,
    OPT_TOOL_CALL_PARSER,
    OPT_TOKENIZE,
    OPT_DETOKENIZE,
    OPT_CHECK,
    OPT_CHECK_MAX_BYTES,
};

typedef struct option_doc {
    struct option opt;
    const char *alias;   /* a second long name with the same meaning, or NULL */
    const char *arg;     /* metavariable, NULL for a switch */
    const char *help;
    const char *deflt;   /* shown as "(default: ...)", NULL for none */
} option_doc;

static const option_doc docs[] = {
    {{"model", required_argument, 0, OPT_MODEL}, NULL, "DIR",
     "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)", NULL},
    {{"input", required_argument, 0, OPT_INPUT}, NULL, "FILE", "prompts: text lines or JSONL", NULL},
    {{"output", required_argument, 0, OPT_OUTPUT}, NULL, "FILE", "completions as JSONL (- for stdout)", "stdout"},
    {{"tensor-parallel-size", required_argument, 0, OPT_TP}, "tp", "N",
     "ranks that split each layer (Megatron tensor parallel)", "1"},
    {{"pipeline-parallel-size", required_argument, 0, OPT_PP}, "pp", "N",
     "pipeline stages that split the layers", "1"},
    {{"dry-run", no_argument, 0, OPT_DRY_RUN}, NULL, NULL,
     "read headers only; print each rank's grid place, layers, slices and bytes", NULL},
    {{"max-model-len", required_argument, 0, OPT_MAX_MODEL_LEN}, NULL, "N",
     "context length (prompt + completion) per sequence", "the model's max_position_embeddings"},
    {{"max-num-seqs", required_argument, 0, OPT_MAX_NUM_SEQS}, NULL, "N",
     "sequences in one batch at most",
     "on GPUs of 70 GiB or more what the KV cache holds at full length, 256 to 1024; else 256; at most the run's sequences"},
    {{"max-num-batched-tokens", required_argument, 0, OPT_MAX_NUM_BATCHED_TOKENS}, NULL, "N",
     "tokens in one forward step at most (chunked prefill)", "16384 on GPUs of 70 GiB or more, else 8192"},
    {{"gpu-memory-utilization", required_argument, 0, OPT_GPU_MEMORY_UTILIZATION}, NULL, "F",
     "fraction of each GPU's memory tpinfer may use, in (0, 1]", "0.9"},
    {{"seed", required_argument, 0, OPT_SEED}, NULL, "N", "random seed for sampling", "0"},
    {{"dtype", required_argument, 0, OPT_DTYPE}, NULL, "T",
     "compute type: auto, float32, float16, bfloat16", "auto (the model's torch_dtype)"},
    {{"backend", required_argument, 0, OPT_BACKEND}, NULL, "B", "auto, cpu or cuda", "auto"},
    {{"enforce-eager", no_argument, 0, OPT_ENFORCE_EAGER}, NULL, NULL,
     "run every step eagerly: no CUDA graphs for decode steps", NULL},
    {{"enable-prefix-caching", no_argument, 0, OPT_PREFIX_CACHING}, NULL, NULL,
     "keep the KV blocks of prompts' full blocks for later prompts that start the same way", "on"},
    {{"no-enable-prefix-caching", no_argument, 0, OPT_NO_PREFIX_CACHING}, NULL, NULL,
     "compute every prompt token of every request", NULL},
    {{"max-tokens", required_argument, 0, OPT_MAX_TOKENS}, NULL, "N",
     "completion tokens per request, unless its line says max_tokens", "16"},
    {{"temperature", required_argument, 0, OPT_TEMPERATURE}, NULL, "T",
     "sampling temperature; 0 is greedy", "the model's generation_config, else 0"},
    {{"top-k", required_argument, 0, OPT_TOP_K}, NULL, "K", "sample among the K likeliest tokens; -1 is off",
     "the model's generation_config, else off"},
    {{"top-p", required_argument, 0, OPT_TOP_P}, NULL, "P",
     "sample within the top probability mass P, in (0, 1]", "the model's generation_config, else 1"},
    {{"ignore-eos", no_argument, 0, OPT_IGNORE_EOS}, NULL, NULL,
     "keep generating past the model's end-of-sequence tokens", NULL},
    {{"kv-block-size", required_argument, 0, OPT_KV_BLOCK_SIZE}, NULL, "N",
     "tokens per KV-cache block", "16"},
    {{"kv-cache-memory", required_argument, 0, OPT_KV_CACHE_MEMORY}, NULL, "BYTES",
     "KV-cache memory per rank on the CPU backend, such as 512MiB or 4GiB", "1GiB"},
    {{"dump-logits", required_argument, 0, OPT_DUMP_LOGITS}, NULL, "DIR",
     "write each request's float32 logits (prompt and generated steps) to DIR/ID.safetensors", NULL},
    {{"input-format", required_argument, 0, OPT_INPUT_FORMAT}, NULL, "F",
     "auto, text, jsonl, openai (batch API lines) or trtllm", "auto"},
    {{"max-line-bytes", required_argument, 0, OPT_MAX_LINE_BYTES}, NULL, "BYTES",
     "longest input line accepted; a longer one gets an error record", "64MiB"},
    {{"errors", required_argument, 0, OPT_ERRORS}, NULL, "FILE",
     "write error records here instead of inline in --output", NULL},
    {{"ordered", no_argument, 0, OPT_ORDERED}, NULL, NULL,
     "write results in input order (default: as they finish)", NULL},
    {{"resume", no_argument, 0, OPT_RESUME}, NULL, NULL,
     "continue an interrupted run: skip the ids already in --output", NULL},
    {{"force", no_argument, 0, OPT_FORCE}, NULL, NULL,
     "with --resume: accept a manifest that differs (model, input, settings)", NULL},
    {{"overwrite", no_argument, 0, OPT_OVERWRITE}, NULL, NULL, "replace an existing --output", NULL},
    {{"status-file", required_argument, 0, OPT_STATUS_FILE}, NULL, "FILE",
     "keep a JSON status object (OpenAI batch shape) here, replaced atomically", NULL},
    {{"progress-interval", required_argument, 0, OPT_PROGRESS_INTERVAL}, NULL, "S",
     "seconds between progress lines on stderr", "5"},
    {{"step-timeout", required_argument, 0, OPT_STEP_TIMEOUT}, NULL, "S",
     "end the job when no step (nor the NCCL setup, nor the warm-up) finishes in S seconds: a stopped or hung rank; 0: never",
     "600 on GPUs, 0 on the CPU backend"},
    {{"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE}, NULL, "FILE",
     "Jinja chat template for \"messages\" requests, instead of the model's", NULL},
    {{"tool-call-parser", required_argument, 0, OPT_TOOL_CALL_PARSER}, NULL, "NAME",
     "parse tool calls out of chat completions with tools (\"tool_choice\": \"auto\"): hermes, llama3_json or mistral",
     NULL},
    {{"tokenize", no_argument, 0, OPT_TOKENIZE}, NULL, NULL,
     "turn --input JSONL {\"text\"} or {\"messages\"} lines into {\"ids\"} lines; needs no weights", NULL},
    {{"detokenize", no_argument, 0, OPT_DETOKENIZE}, NULL, NULL,
     "turn --input JSONL {\"ids\"} lines into {\"text\"} lines", NULL},
    {{"check", no_argument, 0, OPT_CHECK}, NULL, NULL,
     "check the ranks' GPUs, P2P links and each TP group's all-reduce speed; needs no model", NULL},
    {{"check-max-bytes", required_argument, 0, OPT_CHECK_MAX_BYTES}, NULL, "BYTES",
     "largest all-reduce of the --check sweep (from 4KiB, doubling)", "256MiB"},
    {{"help", no_argument, 0, OPT_HELP}, NULL, NULL, "print this help and exit", NULL},
    {{"version", no_argument, 0, OPT_VERSION}, NULL, NULL, "print the version and exit", NULL},
};

void tp_options_defaults(tp_options *o)
{
    memset(o, 0, sizeof *o);
    o->mode = TP_MODE_GENERATE;
    o->tp = 1;
    o->pp = 1;
    o->max_num_seqs = 0;           /* the engine's default for the device */
    o->max_num_batched_tokens = 0; /* the same */
    o->gpu_memory_utilization = 0.9;
    o->dtype = "auto";
    o->backend = "auto";
    o->max_tokens = 16;
    o->temperature = -1;
    o->top_k = -2;
    o->top_p = -1;
    o->kv_block_size = 16;
    o->prefix_caching = 1;
    o->kv_cache_memory = INT64_C(1) << 30;
    o->input_format = "auto";
    o->max_line_bytes = INT64_C(64) << 20;
    o->progress_interval = 5;
    o->step_timeout = -1;
    o->check_max_bytes = INT64_C(256) << 20;
}

int tp_parse_bytes(const char *s, int64_t *out)
{
    static const struct { const char *suffix; int64_t mult; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1000}, {"KB", 1000}, {"KiB", 1024}, {"M", 1000000},
        {"MB", 1000000}, {"MiB", INT64_C(1) << 20}, {"G", 1000000000}, {"GB", 1000000000},
        {"GiB", INT64_C(1) << 30}, {"T", INT64_C(1000000000000)}, {"TiB", INT64_C(1) << 40}};
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0) return 0;
    for (size_t i = 0; i < TP_ARRAY_LEN(units); i++)
        if (!strcmp(end, units[i].suffix)) {
            int64_t r;
            if (__builtin_mul_overflow((int64_t)v, units[i].mult, &r)) return 0;
            *out = r;
            return 1;
        }
    return 0;
}

/* The long name the user typed for option index idx (an alias if that is what was used). */
static const char *flag_name(const char *typed, int val)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(docs); i++)
        if (docs[i].opt.val == val) {
            if (typed && docs[i].alias && !strncmp(typed, "--", 2) &&
                !strncmp(typed + 2, docs[i].alias, strlen(docs[i].alias)))
                return docs[i].alias;
            return docs[i].opt.name;
        }
    return "?";
}

static tp_status int_arg(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t x;
    if (!tp_parse_i64(v, &x) || x < lo || x > hi)
        return tp_error(TP_ERR_INVALID_ARG,
                        "--%s: '%s' is not allowed; give a whole number from %lld to %lld", flag,
                        v, (long long)lo, (long long)hi);
    *out = x;
    return TP_OK;
}

static tp_status str_arg(const char *flag, const char *v, const char *const *allowed,
                         const char *what)
{
    for (size_t i = 0; allowed[i]; i++)
        if (!strcmp(v, allowed[i])) return TP_OK;
    return tp_error(TP_ERR_INVALID_ARG, "--%s: '%s' is not allowed; give one of %s", flag, v, what);
}

static tp_status apply(tp_options *o, int val, const char *flag, const char *v)
{
    static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
    int64_t x;
    double d;
    tp_dtype dt;
    if (v && !*v)
        return tp_error(TP_ERR_INVALID_ARG, "--%s: the value is empty; give a value", flag);
    switch (val) {
    case OPT_MODEL: o->model = v; break;
    case OPT_INPUT: o->input = v; break;
    case OPT_OUTPUT: o->output = v; break;
    case OPT_TP: TP_CHECK(int_arg(flag, v, 1, 4096, &x)); o->tp = (int)x; break;
    case OPT_PP: TP_CHECK(int_arg(flag, v, 1, 4096, &x)); o->pp = (int)x; break;
    case OPT_DRY_RUN: o->mode = TP_MODE_DRY_RUN; break;
    case OPT_MAX_MODEL_LEN: TP_CHECK(int_arg(flag, v, 1, INT64_C(1) << 32, &o->max_model_len)); break;
    case OPT_MAX_NUM_SEQS: TP_CHECK(int_arg(flag, v, 1, 1 << 20, &o->max_num_seqs)); break;
    case OPT_MAX_NUM_BATCHED_TOKENS:
        TP_CHECK(int_arg(flag, v, 1, INT32_MAX, &o->max_num_batched_tokens));
        break;
    case OPT_GPU_MEMORY_UTILIZATION:
        if (!tp_parse_double(v, &d) || !(d > 0.0 && d <= 1.0))
            return tp_error(TP_ERR_INVALID_ARG,
                            "--%s: '%s' is not allowed; give a fraction in (0, 1], such as 0.9",
                            flag, v);
        o->gpu_memory_utilization = d;
        break;
    case OPT_SEED:
        TP_CHECK(int_arg(flag, v, 0, INT64_MAX, &x));
        o->seed = (uint64_t)x;
        break;
    case OPT_DTYPE:
        if (strcmp(v, "auto") && !(tp_dtype_from_name(v, &dt) && dt != TP_DTYPE_I32))
            return tp_error(TP_ERR_INVALID_ARG,
                            "--%s: '%s' is not allowed; give one of auto, float32, float16, bfloat16",
                            flag, v);
        o->dtype = v;
        break;
    case OPT_BACKEND: TP_CHECK(str_arg(flag, v, backends, "auto, cpu, cuda")); o->backend = v; break;
    case OPT_MAX_TOKENS:
        TP_CHECK(int_arg(flag, v, 1, 1 << 30, &o->max_tokens));
        o->max_tokens_given = 1;
        break;
    case OPT_TEMPERATURE:
        if (!tp_parse_double(v, &d) || d < 0 || d > 100)
            return tp_error(TP_ERR_INVALID_ARG, "--%s: '%s' is not allowed; give a number from 0 to 100",
                            flag, v);
        o->temperature = d;
        break;
    case OPT_TOP_K: TP_CHECK(int_arg(flag, v, -1, 1 << 30, &o->top_k)); break;
    case OPT_TOP_P:
        if (!tp_parse_double(v, &d) || !(d > 0.0 && d <= 1.0))
            return tp_error(TP_ERR_INVALID_ARG, "--%s: '%s' is not allowed; give a number in (0, 1]",
                            flag, v);
        o->top_p = d;
        break;
    case OPT_IGNORE_EOS: o->ignore_eos = 1; break;
    case OPT_KV_BLOCK_SIZE: TP_CHECK(int_arg(flag, v, 1, 1024, &o->kv_block_size)); break;
    case OPT_KV_CACHE_MEMORY:
        if (!tp_parse_bytes(v, &o->kv_cache_memory) || o->kv_cache_memory < 1)
            return tp_error(TP_ERR_INVALID_ARG,
                            "--%s: '%s' is not allowed; give bytes with an optional unit, such as 512MiB or 4GiB",
                            flag, v);
        break;
    case OPT_DUMP_LOGITS: o->dump_logits = v; break;
    case OPT_INPUT_FORMAT: {
        static const char *const formats[] = {"auto", "text", "jsonl", "openai", "trtllm", NULL};
        TP_CHECK(str_arg(flag, v, formats, "auto, text, jsonl, openai, trtllm"));
        o->input_format = v;
        break;
    }
    case OPT_MAX_LINE_BYTES:
        if (!tp_parse_bytes(v, &o->max_line_bytes) || o->max_line_bytes < 1)
            return tp_error(TP_ERR_INVALID_ARG, "--%s: '%s' is not allowed; give bytes such as 64MiB", flag, v);
        break;
    case OPT_ERRORS: o->errors = v; break;
    case OPT_ORDERED: o->ordered = 1; break;
    case OPT_ENFORCE_EAGER: o->enforce_eager = 1; break;
    case OPT_PREFIX_CACHING: o->prefix_caching = 1; break;
    case OPT_NO_PREFIX_CACHING: o->prefix_caching = 0; break;
    case OPT_RESUME: o->resume = 1; break;
    case OPT_FORCE: o->force = 1; break;
    case OPT_OVERWRITE: o->overwrite = 1; break;
    case OPT_STATUS_FILE: o->status_file = v; break;
    case OPT_PROGRESS_INTERVAL:
        if (!tp_parse_double(v, &d) || d < 0 || d > 86400)
            return tp_error(TP_ERR_INVALID_ARG, "--%s: '%s' is not allowed; give seconds from 0 to 86400", flag, v);
        o->progress_interval = d;
        break;
    case OPT_STEP_TIMEOUT:
        if (!tp_parse_double(v, &d) || d < 0 || d > 604800)
            return tp_error(TP_ERR_INVALID_ARG, "--%s: '%s' is not allowed; give seconds from 0 (never) to 604800",
                            flag, v);
        o->step_timeout = d;
        break;
    case OPT_CHAT_TEMPLATE: o->chat_template = v; break;
    case OPT_TOOL_CALL_PARSER:
        if (tp_tool_parser_from_name(v) < 0)
            return tp_error(TP_ERR_INVALID_ARG, "--%s: '%s' is not allowed; give hermes (Hermes, Qwen 2.5 and 3), "
                            "llama3_json (Llama 3.1 to 3.3) or mistral", flag, v);
        o->tool_call_parser = tp_tool_parser_from_name(v);
        break;
    case OPT_TOKENIZE: o->mode = TP_MODE_TOKENIZE; break;
    case OPT_DETOKENIZE: o->mode = TP_MODE_DETOKENIZE; break;
    case OPT_CHECK: o->mode = TP_MODE_CHECK; break;
    case OPT_CHECK_MAX_BYTES:
        if (!tp_parse_bytes(v, &o->check_max_bytes) || o->check_max_bytes < 4096 ||
            o->check_max_bytes > (INT64_C(8) << 30))
            return tp_error(TP_ERR_INVALID_ARG,
                            "--%s: '%s' is not allowed; give bytes from 4KiB to 8GiB, such as 64MiB",
                            flag, v);
        break;
    case OPT_HELP: o->mode = TP_MODE_HELP; break;
    case OPT_VERSION: o->mode = TP_MODE_VERSION; break;
    default: return tp_error(TP_ERR_INTERNAL, "option %d has no handler", val);
    }
    return TP_OK;
}

tp_status tp_options_parse(int argc, char *const argv[], tp_options *o)
{
    enum { N = TP_ARRAY_LEN(docs) };
    struct option longopts[2 * N + 1];
    size_t n = 0;
    for (size_t i = 0; i < N; i++) {
        longopts[n++] = docs[i].opt;
        if (docs[i].alias) {
            longopts[n] = docs[i].opt;
            longopts[n++].name = docs[i].alias;
        }
    }
    memset(&longopts[n], 0, sizeof longopts[n]);

    tp_options_defaults(o);
    int help = 0, version = 0;
    optind = 0; /* full reset of GNU getopt, so tests can parse several times */
    opterr = 0;
    for (;;) {
        int prev = optind ? optind : 1;
        int c = getopt_long(argc, argv, ":hVm:i:o:", longopts, NULL);
        if (c == -1) break;
        const char *typed = prev < argc ? argv[prev] : NULL;
        if (c == '?') {
            if (optopt)
                return tp_error(TP_ERR_INVALID_ARG, "unknown option '-%c'; see tpinfer --help", optopt);
            return tp_error(TP_ERR_INVALID_ARG, "unknown option '%s'; see tpinfer --help",
                            typed ? typed : "?");
        }
        if (c == ':')
            return tp_error(TP_ERR_INVALID_ARG, "option '%s' needs a value; see tpinfer --help",
                            typed ? typed : "?");
        if (c == OPT_HELP) help = 1;
        else if (c == OPT_VERSION) version = 1;
        else TP_CHECK(apply(o, c, flag_name(typed, c), optarg));
    }
    if (optind < argc)
        return tp_error(TP_ERR_INVALID_ARG,
                        "unexpected argument '%s'; options take the form --name VALUE", argv[optind]);
    if (help) { o->mode = TP_MODE_HELP; return TP_OK; }
    if (version) { o->mode = TP_MODE_VERSION; return TP_OK; }
    if (o->mode == TP_MODE_CHECK) return TP_OK; /* no model, no input: the ranks and links */
    if (!o->model)
        return tp_error(TP_ERR_INVALID_ARG, "--model is required: give a Hugging Face model directory");
    if (o->mode == TP_MODE_GENERATE && !o->input)
        return tp_error(TP_ERR_INVALID_ARG,
                        "--input is required to generate (or give --dry-run to check the plan)");
    if ((o->mode == TP_MODE_TOKENIZE || o->mode == TP_MODE_DETOKENIZE) && !o->input)
        return tp_error(TP_ERR_INVALID_ARG, "--input is required with --tokenize and --detokenize");
    if (o->output && !strcmp(o->output, "-")) o->output = NULL; /* "-": standard output, as the default */
    if (o->errors && !strcmp(o->errors, "-"))
        return tp_error(TP_ERR_INVALID_ARG, "--errors needs a file's path, not '-': without --errors, error records "
                        "go inline in --output (standard output by default)");
    if (o->status_file && !strcmp(o->status_file, "-"))
        return tp_error(TP_ERR_INVALID_ARG, "--status-file needs a file's path, not '-': the status is a JSON "
                        "document rewritten whole at each update");
    if (o->resume && !o->output)
        return tp_error(TP_ERR_INVALID_ARG, "--resume needs --output FILE (there is nothing to resume on stdout)");
    if (o->force && !o->resume)
        return tp_error(TP_ERR_INVALID_ARG, "--force only applies with --resume");
    if (o->resume && o->overwrite)
        return tp_error(TP_ERR_INVALID_ARG, "--resume and --overwrite contradict each other; give one");
    return TP_OK;
}

void tp_options_print_help(FILE *out)
{
    fprintf(out,
            "Usage: mpirun -np N tpinfer --model DIR [--tp T] [--pp P] --input FILE [--output FILE]\n"
            "       tpinfer --model DIR --dry-run [--tp T] [--pp P]\n"
            "       mpirun -np N tpinfer --check [--tp T] [--pp P] [--backend B]\n"
            "Offline batch inference for Hugging Face Llama-family models over MPI ranks\n"
            "(one per GPU). The world size is dp x pp x tp; dp = ranks / (tp * pp).\n\n"
            "Options:\n");
    for (size_t i = 0; i < TP_ARRAY_LEN(docs); i++) {
        const option_doc *d = &docs[i];
        char left[96];
        int n = snprintf(left, sizeof left, "  --%s%s%s%s%s", d->opt.name,
                         d->alias ? ", --" : "", d->alias ? d->alias : "", d->arg ? " " : "",
                         d->arg ? d->arg : "");
        if (n < 0) n = 0;
        fprintf(out, "%-36s %s", left, d->help);
        if (d->deflt) fprintf(out, " (default: %s)", d->deflt);
        fputc('\n', out);
    }
    fprintf(out, "\nExit status: 0 all requests succeeded, 1 a fatal error, 2 usage error,\n"
                 "3 interrupted (continue with --resume), 4 finished with some requests failed.\n"
                 "See tpinfer(1) for details.\n");
}
