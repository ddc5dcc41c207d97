/*
 * model_config.c: config.json and generation_config.json of a Hugging Face Llama-family
 * model, parsed strictly (jansson, duplicate keys rejected) and checked for types, ranges
 * and consistency before any shape computed from them is trusted (reliability.md §3.2 C).
 * Every message names the file, the key, what was found and what is allowed.
 */
#include "model_config.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define MAX_CONFIG_BYTES (16u << 20) /* real configs are a few KiB */
#define MAX_DIM (INT64_C(1) << 24)   /* hidden, intermediate, vocab: refuse allocation bombs */
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024
#define MAX_POSITIONS INT64_C(2147483647)
#define MAX_TOKEN_ID INT64_C(2147483647)

// ----------------------------------------------------------------------------
// architectures

static const struct {
    const char *hf;         /* architectures[0] */
    const char *model_type; /* used when architectures is absent */
    tp_arch arch;
} archs[] = {
    {"LlamaForCausalLM", "llama", TP_ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", TP_ARCH_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", TP_ARCH_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", TP_ARCH_QWEN3},
    {"Phi3ForCausalLM", "phi3", TP_ARCH_PHI3},
    {"GraniteForCausalLM", "granite", TP_ARCH_GRANITE},
    {"GemmaForCausalLM", "gemma", TP_ARCH_GEMMA},
    {"Gemma2ForCausalLM", "gemma2", TP_ARCH_GEMMA2},
    {"Gemma3ForCausalLM", "gemma3_text", TP_ARCH_GEMMA3},
};

/* Multimodal checkpoints whose text model tpinfer runs: config.json's text_config is that
 * model's config, of the architecture its model_type names (text_arch where it names none; the
 * weights' names: weights.c). Not those whose text model reads images' positions or attends both
 * ways over the prompt (Qwen2-VL's M-RoPE, PaliGemma's prefix). */
static const struct {
    const char *hf, *model_type;
    tp_arch text_arch;
} multimodal_archs[] = {
    {"Gemma3ForConditionalGeneration", "gemma3", TP_ARCH_GEMMA3},
    {"Mistral3ForConditionalGeneration", "mistral3", TP_ARCH_MISTRAL},
};

/* The architecture named (architectures[0], or model_type with by_type): 1 and cfg->arch set
 * (and cfg->multimodal, for a multimodal one where multimodal_too), or 0 when none is. */
static int find_arch(const char *name, int by_type, int multimodal_too, tp_model_config *cfg)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(archs); i++)
        if (strcmp(name, by_type ? archs[i].model_type : archs[i].hf) == 0) {
            cfg->arch = archs[i].arch;
            return 1;
        }
    for (size_t i = 0; multimodal_too && i < TP_ARRAY_LEN(multimodal_archs); i++)
        if (strcmp(name, by_type ? multimodal_archs[i].model_type : multimodal_archs[i].hf) == 0) {
            cfg->arch = multimodal_archs[i].text_arch;
            cfg->multimodal = (int)i + 1;
            return 1;
        }
    return 0;
}

static int is_gemma(tp_arch a) { return a == TP_ARCH_GEMMA || a == TP_ARCH_GEMMA2 || a == TP_ARCH_GEMMA3; }
#define SUPPORTED_ARCHS                                                                            \
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, " \
    "GraniteForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "                 \
    "Gemma3ForConditionalGeneration and Mistral3ForConditionalGeneration (their text models)"

const char *tp_arch_name(tp_arch arch)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(archs); i++)
        if (archs[i].arch == arch) return archs[i].hf;
    return "unknown";
}

const char *tp_model_config_arch_name(const tp_model_config *cfg)
{
    if (cfg->multimodal > 0 && (size_t)cfg->multimodal <= TP_ARRAY_LEN(multimodal_archs))
        return multimodal_archs[cfg->multimodal - 1].hf;
    return tp_arch_name(cfg->arch);
}

int64_t tp_model_config_window_of_all(const tp_model_config *cfg)
{
    if (cfg->sliding_window <= 0) return 0;
    for (int64_t l = 0; l < cfg->n_layers; l++)
        if (!cfg->sliding_layer[l]) return 0;
    return cfg->sliding_window;
}

void tp_model_config_describe(const tp_model_config *cfg, char *buf, size_t n)
{
    static const char *const kinds[] = {[TP_ROPE_LINEAR] = "linear", [TP_ROPE_LLAMA3] = "llama3",
                                        [TP_ROPE_YARN] = "yarn"};
    const tp_rope_scaling *r = &cfg->rope_scaling;
    int64_t sliding = 0;
    for (int64_t l = 0; l < cfg->n_layers; l++) sliding += cfg->sliding_layer[l];
    char window[80] = "", rope[80] = "";
    if (sliding == cfg->n_layers)
        snprintf(window, sizeof window, " (all with a sliding window of %" PRId64 ")", cfg->sliding_window);
    else if (sliding > 0)
        snprintf(window, sizeof window, " (%" PRId64 " with a sliding window of %" PRId64 ")", sliding,
                 cfg->sliding_window);
    if (r->type == TP_ROPE_LINEAR)
        snprintf(rope, sizeof rope, ", linear rope x%g", r->factor);
    else if (r->type != TP_ROPE_DEFAULT)
        snprintf(rope, sizeof rope, ", %s rope x%g over %" PRId64 " positions", kinds[r->type], r->factor,
                 r->original_max_position);
    if (r->type != TP_ROPE_DEFAULT && cfg->rope_local_theta > 0) /* Gemma 3's sliding layers' rope is unscaled */
        snprintf(rope + strlen(rope), sizeof rope - strlen(rope), " on the full layers");
    char mult[160] = "";
    if (cfg->arch == TP_ARCH_GRANITE)
        snprintf(mult, sizeof mult, ", multipliers: embedding %g, residual %g, attention %g, logits 1/%g",
                 cfg->embedding_multiplier, cfg->residual_multiplier, cfg->attention_multiplier, cfg->logits_scaling);
    else if (cfg->arch == TP_ARCH_GEMMA3)
        snprintf(mult, sizeof mult, ", rope base %g (%g on the sliding layers), attention scale %g", cfg->rope_theta,
                 cfg->rope_local_theta, cfg->attention_multiplier);
    else if (cfg->arch == TP_ARCH_GEMMA2)
        snprintf(mult, sizeof mult, ", attention scale %g, soft-capping: attention %g, logits %g",
                 cfg->attention_multiplier, cfg->attn_softcap, cfg->final_softcap);
    snprintf(buf, n, "%" PRId64 " layers%s%s%s", cfg->n_layers, window, rope, mult);
}

// ----------------------------------------------------------------------------
// typed key readers: absent and (for optional keys) null leave the default in place

/* An untrusted string fit for a message: capped, control and non-ASCII bytes as '?'. */
static void sanitize(const char *src, size_t len, char *buf, size_t n)
{
    size_t k = 0;
    for (; k < len && k + 4 < n; k++)
        buf[k] = (src[k] >= 0x20 && src[k] < 0x7f) ? src[k] : '?';
    if (k < len) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
}

/* "the real number 4096.0", "the string \"4096\"", ... for "found ..." in messages. */
static void describe(const json_t *v, char *buf, size_t n)
{
    if (!v) {
        snprintf(buf, n, "nothing");
    } else if (json_is_null(v)) {
        snprintf(buf, n, "null");
    } else if (json_is_boolean(v)) {
        snprintf(buf, n, "%s", json_is_true(v) ? "true" : "false");
    } else if (json_is_integer(v)) {
        snprintf(buf, n, "the integer %lld", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        char num[64];
        snprintf(num, sizeof num, "%.17g", json_real_value(v));
        /* keep 4096.0 recognisable as a real, not the integer 4096 */
        const char *tail = strpbrk(num, ".eEni") ? "" : ".0";
        snprintf(buf, n, "the real number %s%s", num, tail);
    } else if (json_is_string(v)) {
        char s[48];
        sanitize(json_string_value(v), json_string_length(v), s, sizeof s);
        snprintf(buf, n, "the string \"%s\"", s);
    } else if (json_is_array(v)) {
        snprintf(buf, n, "an array");
    } else {
        snprintf(buf, n, "an object");
    }
}

/* "parent.key" or "key", for messages about nested keys. */
static void label(char *buf, size_t n, const char *parent, const char *key)
{
    if (parent)
        snprintf(buf, n, "%s.%s", parent, key);
    else
        snprintf(buf, n, "%s", key);
}

static tp_status bad_value(const char *what, const char *parent, const char *key,
                           const char *allowed, const json_t *v)
{
    char name[128], found[128];
    label(name, sizeof name, parent, key);
    describe(v, found, sizeof found);
    return tp_error(TP_ERR_FORMAT, "%s: %s must be %s, found %s", what, name, allowed, found);
}

static tp_status missing(const char *what, const char *parent, const char *key,
                         const char *allowed)
{
    char name[128];
    label(name, sizeof name, parent, key);
    return tp_error(TP_ERR_FORMAT, "%s: missing required key %s (%s)", what, name, allowed);
}

/* An integer in [lo, hi]; JSON reals, strings and booleans are refused, not converted. */
static tp_status int_key(const char *what, const json_t *obj, const char *parent,
                         const char *key, int required, int64_t lo, int64_t hi, int64_t *out,
                         int *found)
{
    char allowed[96];
    snprintf(allowed, sizeof allowed, "an integer in [%lld, %lld]", (long long)lo,
             (long long)hi);
    const json_t *v = json_object_get(obj, key);
    if (found) *found = 0;
    if (!v || (json_is_null(v) && !required)) {
        if (required) return missing(what, parent, key, allowed);
        return TP_OK;
    }
    if (!json_is_integer(v)) return bad_value(what, parent, key, allowed, v);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return bad_value(what, parent, key, allowed, v);
    *out = (int64_t)x;
    if (found) *found = 1;
    return TP_OK;
}

typedef enum { NUM_POSITIVE, NUM_NONNEGATIVE, NUM_UNIT } num_range;

/* A finite number (integer or real JSON) in the given range. */
static tp_status num_key(const char *what, const json_t *obj, const char *parent,
                         const char *key, int required, num_range range, double *out,
                         int *found)
{
    static const char *const allowed[] = {
        [NUM_POSITIVE] = "a finite number > 0",
        [NUM_NONNEGATIVE] = "a finite number >= 0",
        [NUM_UNIT] = "a number in [0, 1]",
    };
    const json_t *v = json_object_get(obj, key);
    if (found) *found = 0;
    if (!v || (json_is_null(v) && !required)) {
        if (required) return missing(what, parent, key, allowed[range]);
        return TP_OK;
    }
    if (!json_is_number(v)) return bad_value(what, parent, key, allowed[range], v);
    double x = json_number_value(v);
    int ok = isfinite(x);
    if (range == NUM_POSITIVE) ok = ok && x > 0;
    if (range == NUM_NONNEGATIVE) ok = ok && x >= 0;
    if (range == NUM_UNIT) ok = ok && x >= 0 && x <= 1;
    if (!ok) return bad_value(what, parent, key, allowed[range], v);
    *out = x;
    if (found) *found = 1;
    return TP_OK;
}

/* true/false only: 0 and 1 are not booleans to Python's json either. */
static tp_status bool_key(const char *what, const json_t *obj, const char *parent, const char *key,
                          int *out, int *found)
{
    const json_t *v = json_object_get(obj, key);
    if (found) *found = 0;
    if (!v || json_is_null(v)) return TP_OK;
    if (!json_is_boolean(v)) return bad_value(what, parent, key, "true or false", v);
    *out = json_is_true(v);
    if (found) *found = 1;
    return TP_OK;
}

/* A string, or NULL when absent or null. */
static tp_status str_key(const char *what, const json_t *obj, const char *parent,
                         const char *key, const char **out)
{
    const json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return TP_OK;
    if (!json_is_string(v)) return bad_value(what, parent, key, "a string", v);
    *out = json_string_value(v);
    return TP_OK;
}

/* A token id (integer in [0, limit)), a list of them, or null. Single-only keys (bos)
 * pass max_ids = 1 and refuse lists. */
static tp_status token_ids(const char *what, const json_t *obj, const char *key, int64_t limit,
                           int max_ids, int64_t *ids, int *n_ids)
{
    char allowed[128];
    if (max_ids == 1)
        snprintf(allowed, sizeof allowed, "a token id in [0, %lld)", (long long)limit);
    else
        snprintf(allowed, sizeof allowed,
                 "a token id in [0, %lld) or a list of at most %d of them", (long long)limit,
                 max_ids);
    const json_t *v = json_object_get(obj, key);
    *n_ids = 0;
    if (!v || json_is_null(v)) return TP_OK;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= limit) return bad_value(what, NULL, key, allowed, v);
        ids[0] = (int64_t)x;
        *n_ids = 1;
        return TP_OK;
    }
    if (!json_is_array(v) || max_ids == 1) return bad_value(what, NULL, key, allowed, v);
    if (json_array_size(v) > (size_t)max_ids)
        return tp_error(TP_ERR_FORMAT, "%s: %s lists %zu ids, more than the %d supported",
                        what, key, json_array_size(v), max_ids);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= limit) {
            char name[96];
            snprintf(name, sizeof name, "%s[%zu]", key, i);
            snprintf(allowed, sizeof allowed, "a token id in [0, %lld)", (long long)limit);
            return bad_value(what, NULL, name, allowed, e);
        }
        ids[i] = (int64_t)json_integer_value(e);
    }
    *n_ids = (int)json_array_size(v);
    return TP_OK;
}

/* Parse with duplicate keys rejected (transformers would silently keep the last one).
 * JSON_DECODE_ANY only so that "42" gets the clearer "must be an object" message. */
static tp_status load_object(const char *json_text, size_t len, const char *what,
                             json_t **root)
{
    json_error_t err;
    *root = NULL;
    if (!json_text) return tp_error(TP_ERR_INVALID_ARG, "%s: no text to parse", what);
    json_t *r = json_loadb(json_text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
    if (!r) {
        if (json_error_code(&err) == json_error_duplicate_key)
            return tp_error(TP_ERR_FORMAT,
                            "%s: line %d: duplicate key (%s); each key may appear once", what,
                            err.line, err.text);
        return tp_error(TP_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", what,
                        err.line, err.column, err.text);
    }
    if (!json_is_object(r)) {
        char found[128];
        describe(r, found, sizeof found);
        json_decref(r);
        return tp_error(TP_ERR_FORMAT, "%s: the top level must be a JSON object, found %s",
                        what, found);
    }
    *root = r;
    return TP_OK;
}

// ----------------------------------------------------------------------------
// config.json sections

static tp_status parse_arch(const char *what, const json_t *root, tp_model_config *cfg)
{
    const json_t *a = json_object_get(root, "architectures");
    const char *name, *key;
    if (a && !json_is_null(a)) {
        key = "architectures[0]";
        if (!json_is_array(a) || json_array_size(a) == 0 ||
            !json_is_string(json_array_get(a, 0)))
            return bad_value(what, NULL, "architectures",
                             "a non-empty list of architecture names", a);
        name = json_string_value(json_array_get(a, 0));
        if (find_arch(name, 0, 1, cfg)) return TP_OK;
    } else {
        key = "model_type";
        TP_CHECK(str_key(what, root, NULL, "model_type", &name));
        if (!name)
            return tp_error(TP_ERR_FORMAT,
                            "%s: neither architectures nor model_type is given (supported: "
                            SUPPORTED_ARCHS ")", what);
        if (find_arch(name, 1, 1, cfg)) return TP_OK;
    }
    char found[128];
    describe(a && !json_is_null(a) ? json_array_get(a, 0) : json_object_get(root, key), found,
             sizeof found);
    return tp_error(TP_ERR_UNSUPPORTED,
                    "%s: %s is %s, which tpinfer does not run (supported: " SUPPORTED_ARCHS ")",
                    what, key, found);
}

static tp_status parse_shape(const char *what, const json_t *root, tp_model_config *cfg)
{
    int hd_found;
    TP_CHECK(int_key(what, root, NULL, "hidden_size", 1, 1, MAX_DIM, &cfg->hidden_size, NULL));
    TP_CHECK(int_key(what, root, NULL, "intermediate_size", 1, 1, MAX_DIM,
                     &cfg->intermediate_size, NULL));
    TP_CHECK(int_key(what, root, NULL, "num_hidden_layers", 1, 1, TP_MAX_LAYERS, &cfg->n_layers,
                     NULL));
    TP_CHECK(int_key(what, root, NULL, "num_attention_heads", 1, 1, MAX_HEADS, &cfg->n_heads,
                     NULL));
    TP_CHECK(int_key(what, root, NULL, "vocab_size", 1, 1, MAX_DIM, &cfg->vocab_size, NULL));

    /* HF: a null or absent num_key_value_heads means plain multi-head attention */
    cfg->n_kv_heads = cfg->n_heads;
    TP_CHECK(int_key(what, root, NULL, "num_key_value_heads", 0, 1, MAX_HEADS, &cfg->n_kv_heads,
                     NULL));
    if (cfg->n_kv_heads > cfg->n_heads)
        return tp_error(TP_ERR_FORMAT,
                        "%s: num_key_value_heads %lld is more than num_attention_heads %lld; "
                        "it must divide it", what, (long long)cfg->n_kv_heads,
                        (long long)cfg->n_heads);
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return tp_error(TP_ERR_FORMAT,
                        "%s: num_attention_heads %lld is not divisible by num_key_value_heads "
                        "%lld; every KV head must serve the same number of query heads", what,
                        (long long)cfg->n_heads, (long long)cfg->n_kv_heads);

    TP_CHECK(int_key(what, root, NULL, "head_dim", 0, 1, MAX_HEAD_DIM, &cfg->head_dim,
                     &hd_found));
    if (!hd_found && (cfg->arch == TP_ARCH_QWEN3 || is_gemma(cfg->arch)) && !json_object_get(root, "head_dim")) {
        cfg->head_dim = cfg->arch == TP_ARCH_QWEN3 ? 128 : 256; /* the configs' defaults, not hidden / heads */
    } else if (!hd_found) {
        if (cfg->hidden_size % cfg->n_heads != 0)
            return tp_error(TP_ERR_FORMAT,
                            "%s: hidden_size %lld is not divisible by num_attention_heads %lld "
                            "and no head_dim is given", what, (long long)cfg->hidden_size,
                            (long long)cfg->n_heads);
        cfg->head_dim = cfg->hidden_size / cfg->n_heads;
        if (cfg->head_dim > MAX_HEAD_DIM)
            return tp_error(TP_ERR_FORMAT,
                            "%s: head_dim hidden_size / num_attention_heads = %lld is more than "
                            "the %d supported", what, (long long)cfg->head_dim, MAX_HEAD_DIM);
    }
    if (cfg->head_dim % 2 != 0) /* RoPE rotates pairs of dimensions */
        return tp_error(TP_ERR_FORMAT, "%s: head_dim %lld must be even for rotary embeddings",
                        what, (long long)cfg->head_dim);

    TP_CHECK(int_key(what, root, NULL, "max_position_embeddings", 1, 1, MAX_POSITIONS,
                     &cfg->max_position_embeddings, NULL));

    /* Gemma 2's and 3's config names it hidden_activation (gelu_pytorch_tanh, their default);
     * Gemma 1's hidden_act "gelu" is a legacy name for the same (GemmaConfig says so) */
    const int gemma = is_gemma(cfg->arch), legacy = cfg->arch == TP_ARCH_GEMMA;
    const char *act, *key = gemma && !legacy ? "hidden_activation" : "hidden_act";
    TP_CHECK(str_key(what, root, NULL, key, &act));
    cfg->mlp_act = gemma ? TP_ACT_GELU_TANH : TP_ACT_SILU;
    if (act && (gemma ? strcmp(act, "gelu_pytorch_tanh") != 0 && !(legacy && strcmp(act, "gelu") == 0)
                      : strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)) {
        char found[128];
        describe(json_object_get(root, key), found, sizeof found);
        return tp_error(TP_ERR_UNSUPPORTED, "%s: %s is %s (supported: %s)", what, key, found,
                        gemma ? "gelu_pytorch_tanh" : "silu");
    }
    return TP_OK;
}

static tp_status parse_norm_and_bias(const char *what, const json_t *root,
                                     tp_model_config *cfg)
{
    cfg->rms_norm_eps = 1e-6;
    TP_CHECK(num_key(what, root, NULL, "rms_norm_eps", 0, NUM_POSITIVE, &cfg->rms_norm_eps,
                     NULL));
    cfg->tie_word_embeddings = is_gemma(cfg->arch); /* Gemma2Config's and Gemma3TextConfig's default */
    TP_CHECK(bool_key(what, root, NULL, "tie_word_embeddings", &cfg->tie_word_embeddings, NULL));

    /* which projections carry biases follows the HF modeling code of each architecture */
    int attention_bias = 0, mlp_bias = 0;
    TP_CHECK(bool_key(what, root, NULL, "attention_bias", &attention_bias, NULL));
    TP_CHECK(bool_key(what, root, NULL, "mlp_bias", &mlp_bias, NULL));
    switch (cfg->arch) {
    case TP_ARCH_LLAMA:
    case TP_ARCH_GRANITE:
        cfg->attention_bias = cfg->o_bias = attention_bias;
        cfg->mlp_bias = mlp_bias;
        break;
    case TP_ARCH_QWEN3:
        cfg->attention_bias = cfg->o_bias = attention_bias;
        cfg->qk_norm = 1;
        break;
    case TP_ARCH_GEMMA:
    case TP_ARCH_GEMMA2:
    case TP_ARCH_GEMMA3:
        cfg->attention_bias = cfg->o_bias = attention_bias;
        cfg->gemma_norms = 1;
        cfg->block_output_norms = cfg->arch != TP_ARCH_GEMMA;
        cfg->qk_norm = cfg->arch == TP_ARCH_GEMMA3;
        break;
    case TP_ARCH_QWEN2:
        cfg->attention_bias = 1; /* q/k/v always, o never, whatever the keys say */
        break;
    default: /* Mistral: no biases at all */
        break;
    }
    return TP_OK;
}

/* Gemma 1, 2 and 3: the embedding's output times sqrt(hidden_size) (the loader rounds it to the
 * weights' dtype, as Gemma's scaled embedding does), the scores' scale
 * query_pre_attn_scalar^-0.5, the scores' and the logits' soft-capping (Gemma 2's defaults 50
 * and 30; Gemma 3's none; null: none); bidirectional attention refused */
static tp_status parse_gemma(const char *what, const json_t *root, tp_model_config *cfg)
{
    cfg->embedding_multiplier = sqrt((double)cfg->hidden_size);
    if (cfg->arch == TP_ARCH_GEMMA) { /* Gemma 1: the scores by head_dim^-1/2, no caps */
        cfg->attention_multiplier = 0;
        return TP_OK;
    }
    double scalar = 256; /* the configs' default */
    TP_CHECK(num_key(what, root, NULL, "query_pre_attn_scalar", 0, NUM_POSITIVE, &scalar, NULL));
    cfg->attention_multiplier = 1.0 / sqrt(scalar);
    const int two = cfg->arch == TP_ARCH_GEMMA2;
    cfg->attn_softcap = two ? 50 : 0;
    cfg->final_softcap = two ? 30 : 0;
    TP_CHECK(num_key(what, root, NULL, "attn_logit_softcapping", 0, NUM_POSITIVE, &cfg->attn_softcap, NULL));
    TP_CHECK(num_key(what, root, NULL, "final_logit_softcapping", 0, NUM_POSITIVE, &cfg->final_softcap, NULL));
    if (json_is_null(json_object_get(root, "attn_logit_softcapping"))) cfg->attn_softcap = 0;
    if (json_is_null(json_object_get(root, "final_logit_softcapping"))) cfg->final_softcap = 0;
    int bidirectional = 0;
    TP_CHECK(bool_key(what, root, NULL, "use_bidirectional_attention", &bidirectional, NULL));
    if (bidirectional)
        return tp_error(TP_ERR_UNSUPPORTED, "%s: use_bidirectional_attention is true; tpinfer decodes causally",
                        what);
    return TP_OK;
}

/* Granite's four multipliers (GraniteConfig's defaults: 1); the other architectures' modeling
 * code reads none of them */
static tp_status parse_multipliers(const char *what, const json_t *root, tp_model_config *cfg)
{
    cfg->embedding_multiplier = cfg->residual_multiplier = cfg->attention_multiplier = cfg->logits_scaling = 1.0;
    if (is_gemma(cfg->arch)) return parse_gemma(what, root, cfg);
    if (cfg->arch != TP_ARCH_GRANITE) {
        cfg->attention_multiplier = 0; /* 1 / sqrt(head_dim) */
        return TP_OK;
    }
    TP_CHECK(num_key(what, root, NULL, "embedding_multiplier", 0, NUM_POSITIVE, &cfg->embedding_multiplier, NULL));
    TP_CHECK(num_key(what, root, NULL, "residual_multiplier", 0, NUM_POSITIVE, &cfg->residual_multiplier, NULL));
    TP_CHECK(num_key(what, root, NULL, "attention_multiplier", 0, NUM_POSITIVE, &cfg->attention_multiplier, NULL));
    TP_CHECK(num_key(what, root, NULL, "logits_scaling", 0, NUM_POSITIVE, &cfg->logits_scaling, NULL));
    return TP_OK;
}

/* HF's yarn_get_mscale */
static double yarn_mscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* YaRN as transformers' _compute_yarn_parameters reads it (Qwen2.5's and Qwen3's long-context
 * setting): the frequencies blend in model.c's tp_rope_inv_freq, the attention factor that HF
 * multiplies cos and sin by is computed here (the forward scales the scores by its square). */
static tp_status parse_yarn(const char *what, const json_t *root, const json_t *rs, const char *parent,
                            tp_model_config *cfg)
{
    tp_rope_scaling *s = &cfg->rope_scaling;
    s->type = TP_ROPE_YARN;
    /* the pretraining length: a top-level original_max_position_embeddings first (as HF's
     * standardize_rope_params), then the scaling's, then max_position_embeddings */
    int found = 0;
    TP_CHECK(int_key(what, root, NULL, "original_max_position_embeddings", 0, 1, MAX_POSITIONS,
                     &s->original_max_position, &found));
    if (!found)
        TP_CHECK(int_key(what, rs, parent, "original_max_position_embeddings", 0, 1, MAX_POSITIONS,
                         &s->original_max_position, &found));
    if (!found) s->original_max_position = cfg->max_position_embeddings;
    const json_t *f = json_object_get(rs, "factor");
    if (f && json_is_null(f)) /* DeepSeek's form: the ratio of the two lengths */
        s->factor = (double)cfg->max_position_embeddings / (double)s->original_max_position;
    else
        TP_CHECK(num_key(what, rs, parent, "factor", 1, NUM_POSITIVE, &s->factor, NULL));
    double mscale = 0, mscale_all_dim = 0;
    TP_CHECK(num_key(what, rs, parent, "mscale", 0, NUM_NONNEGATIVE, &mscale, NULL));
    TP_CHECK(num_key(what, rs, parent, "mscale_all_dim", 0, NUM_NONNEGATIVE, &mscale_all_dim, NULL));
    TP_CHECK(num_key(what, rs, parent, "attention_factor", 0, NUM_POSITIVE, &s->attention_factor, &found));
    if (!found)
        s->attention_factor = mscale != 0 && mscale_all_dim != 0
                                  ? yarn_mscale(s->factor, mscale) / yarn_mscale(s->factor, mscale_all_dim)
                                  : yarn_mscale(s->factor, 1.0);
    /* HF takes `or 32` / `or 1`: absent, null or 0 give the defaults */
    s->beta_fast = s->beta_slow = 0;
    TP_CHECK(num_key(what, rs, parent, "beta_fast", 0, NUM_NONNEGATIVE, &s->beta_fast, NULL));
    TP_CHECK(num_key(what, rs, parent, "beta_slow", 0, NUM_NONNEGATIVE, &s->beta_slow, NULL));
    if (s->beta_fast == 0) s->beta_fast = 32;
    if (s->beta_slow == 0) s->beta_slow = 1;
    s->truncate = 1;
    TP_CHECK(bool_key(what, rs, parent, "truncate", &s->truncate, NULL));
    return TP_OK;
}

static tp_status parse_scaling(const char *what, const json_t *root, const json_t *rs, const char *parent,
                               int with_theta, tp_model_config *cfg);

/* Gemma 3's two rope bases: the full layers' rope_theta (default 1e6) with any scaling, the
 * sliding layers' rope_local_base_freq (default 1e4) unscaled; transformers 5 writes both in
 * rope_parameters, one object per layer type */
static tp_status parse_gemma3_rope(const char *what, const json_t *root, tp_model_config *cfg)
{
    const json_t *params = json_object_get(root, "rope_parameters"), *full = NULL, *sliding = NULL;
    if (params && !json_is_null(params)) {
        if (!json_is_object(params)) return bad_value(what, NULL, "rope_parameters", "an object or null", params);
        full = json_object_get(params, "full_attention");
        sliding = json_object_get(params, "sliding_attention");
        if (!full && !sliding) full = params; /* one flat object: the full layers' */
        if ((full && !json_is_object(full)) || (sliding && !json_is_object(sliding)))
            return bad_value(what, NULL, "rope_parameters", "{\"full_attention\": {...}, \"sliding_attention\": {...}}",
                             params);
    }
    cfg->rope_theta = 1e6;
    cfg->rope_local_theta = 1e4;
    TP_CHECK(num_key(what, root, NULL, "rope_theta", 0, NUM_POSITIVE, &cfg->rope_theta, NULL));
    TP_CHECK(num_key(what, root, NULL, "rope_local_base_freq", 0, NUM_POSITIVE, &cfg->rope_local_theta, NULL));
    if (full) TP_CHECK(num_key(what, full, "rope_parameters.full_attention", "rope_theta", 0, NUM_POSITIVE,
                               &cfg->rope_theta, NULL));
    if (sliding) {
        TP_CHECK(num_key(what, sliding, "rope_parameters.sliding_attention", "rope_theta", 0, NUM_POSITIVE,
                         &cfg->rope_local_theta, NULL));
        const char *type;
        TP_CHECK(str_key(what, sliding, "rope_parameters.sliding_attention", "rope_type", &type));
        if (type && strcmp(type, "default") != 0)
            return tp_error(TP_ERR_UNSUPPORTED, "%s: rope_parameters.sliding_attention.rope_type is '%.32s'; tpinfer "
                            "scales only the full layers' rope (Gemma 3's sliding layers have none)", what, type);
    }
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return bad_value(what, NULL, "rope_scaling", "an object or null", rs);
        return parse_scaling(what, root, rs, "rope_scaling", 0, cfg);
    }
    return parse_scaling(what, root, full, "rope_parameters.full_attention", 1, cfg);
}

static tp_status parse_rope(const char *what, const json_t *root, tp_model_config *cfg)
{
    if (cfg->arch == TP_ARCH_GEMMA3) return parse_gemma3_rope(what, root, cfg);
    /* transformers >= 5 may group rope_theta and the scaling in rope_parameters */
    const json_t *params = json_object_get(root, "rope_parameters");
    if (params && json_is_null(params)) params = NULL;
    if (params && !json_is_object(params))
        return bad_value(what, NULL, "rope_parameters", "an object or null", params);

    double theta = 10000.0, ptheta = 0;
    int found, pfound = 0;
    TP_CHECK(num_key(what, root, NULL, "rope_theta", 0, NUM_POSITIVE, &theta, &found));
    if (params)
        TP_CHECK(num_key(what, params, "rope_parameters", "rope_theta", 0, NUM_POSITIVE, &ptheta,
                         &pfound));
    if (found && pfound && theta != ptheta)
        return tp_error(TP_ERR_FORMAT,
                        "%s: rope_theta %g and rope_parameters.rope_theta %g disagree", what,
                        theta, ptheta);
    cfg->rope_theta = pfound ? ptheta : theta;

    /* HF rotates only the first partial_rotary_factor of each head (Phi-4-mini's 0.75) */
    const json_t *holders[] = {root, params};
    const char *holder_names[] = {NULL, "rope_parameters"};
    for (int i = 0; i < 2; i++) {
        double prf = 1.0;
        if (holders[i])
            TP_CHECK(num_key(what, holders[i], holder_names[i], "partial_rotary_factor", 0, NUM_POSITIVE, &prf, NULL));
        if (prf != 1.0)
            return tp_error(TP_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported (tpinfer rotates "
                            "every dimension of a head: 1.0)", what, prf);
    }

    const char *parent = "rope_scaling";
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs) && !json_is_object(rs))
        return bad_value(what, NULL, "rope_scaling", "an object or null", rs);
    if (!rs || json_is_null(rs)) {
        rs = params;
        parent = "rope_parameters";
    }
    return parse_scaling(what, root, rs, parent, rs == params, cfg);
}

/* The rope scaling in rs (rope_scaling, or the rope_parameters that hold rope_theta: with_theta,
 * where no type means none), named parent in messages; NULL: none */
static tp_status parse_scaling(const char *what, const json_t *root, const json_t *rs, const char *parent,
                               int with_theta, tp_model_config *cfg)
{
    memset(&cfg->rope_scaling, 0, sizeof cfg->rope_scaling);
    cfg->rope_scaling.type = TP_ROPE_DEFAULT;
    cfg->rope_scaling.factor = 1.0;
    cfg->rope_scaling.attention_factor = 1.0;
    if (!rs) return TP_OK;

    /* HF reads rope_type, then the legacy "type" */
    const char *type;
    TP_CHECK(str_key(what, rs, parent, "rope_type", &type));
    if (!type) TP_CHECK(str_key(what, rs, parent, "type", &type));
    if (!type) {
        if (with_theta) return TP_OK; /* rope_parameters with only rope_theta */
        return tp_error(TP_ERR_FORMAT,
                        "%s: rope_scaling has no rope_type (or type); use null for no scaling",
                        what);
    }
    tp_rope_scaling *s = &cfg->rope_scaling;
    if (strcmp(type, "default") == 0) return TP_OK;
    if (cfg->arch == TP_ARCH_PHI3) { /* Phi3Config turns every other type (su, yarn) into longrope */
        char shown[48];
        sanitize(type, strlen(type), shown, sizeof shown);
        return tp_error(TP_ERR_UNSUPPORTED,
                        "%s: %s type '%s' is not supported for Phi3ForCausalLM (Hugging Face runs it as "
                        "longrope, which tpinfer does not; the models of 4K-16K contexts have none)",
                        what, parent, shown);
    }
    if (strcmp(type, "linear") == 0) {
        s->type = TP_ROPE_LINEAR;
        return num_key(what, rs, parent, "factor", 1, NUM_POSITIVE, &s->factor, NULL);
    }
    if (strcmp(type, "llama3") == 0) {
        s->type = TP_ROPE_LLAMA3;
        TP_CHECK(num_key(what, rs, parent, "factor", 1, NUM_POSITIVE, &s->factor, NULL));
        TP_CHECK(num_key(what, rs, parent, "low_freq_factor", 1, NUM_POSITIVE,
                         &s->low_freq_factor, NULL));
        TP_CHECK(num_key(what, rs, parent, "high_freq_factor", 1, NUM_POSITIVE,
                         &s->high_freq_factor, NULL));
        TP_CHECK(int_key(what, rs, parent, "original_max_position_embeddings", 1, 1,
                         MAX_POSITIONS, &s->original_max_position, NULL));
        /* the smoothing between the two wavelengths divides by high - low */
        if (!(s->high_freq_factor > s->low_freq_factor))
            return tp_error(TP_ERR_FORMAT,
                            "%s: %s.high_freq_factor %g must be greater than low_freq_factor %g",
                            what, parent, s->high_freq_factor, s->low_freq_factor);
        return TP_OK;
    }
    if (strcmp(type, "yarn") == 0) return parse_yarn(what, root, rs, parent, cfg);
    char shown[48];
    sanitize(type, strlen(type), shown, sizeof shown);
    return tp_error(TP_ERR_UNSUPPORTED,
                    "%s: %s type '%s' is not supported (supported: linear, llama3, yarn)", what,
                    parent, shown);
}

/* Sliding-window attention as Hugging Face's modeling code applies it: Mistral and Phi-3
 * slide every layer when sliding_window is set; Qwen2 and Qwen3 only with use_sliding_window,
 * and then the layers from max_window_layers on, or those an explicit layer_types list marks.
 * Llama's code never reads sliding_window, so there it is only type-checked. A window as wide
 * as the context changes nothing and is dropped. */
static tp_status parse_sliding_window(const char *what, const json_t *root,
                                      tp_model_config *cfg)
{
    int64_t window = 0;
    int has_window;
    TP_CHECK(int_key(what, root, NULL, "sliding_window", 0, 0, INT64_MAX, &window,
                     &has_window));
    int use = 0;
    TP_CHECK(bool_key(what, root, NULL, "use_sliding_window", &use, NULL));
    int64_t max_window_layers = 28; /* Qwen2Config / Qwen3Config default */
    TP_CHECK(int_key(what, root, NULL, "max_window_layers", 0, 0, INT64_MAX, &max_window_layers,
                     NULL));

    /* Qwen: an explicit layer_types list overrides max_window_layers */
    int qwen = cfg->arch == TP_ARCH_QWEN2 || cfg->arch == TP_ARCH_QWEN3;
    int gemma = cfg->arch == TP_ARCH_GEMMA2 || cfg->arch == TP_ARCH_GEMMA3; /* Gemma 1 reads no window */
    memset(cfg->sliding_layer, 0, sizeof cfg->sliding_layer);
    for (int64_t i = max_window_layers; i < cfg->n_layers; i++) cfg->sliding_layer[i] = 1;
    if (gemma) { /* Gemma 3: every sliding_window_pattern-th layer (from 1) full, the rest slide;
                  * Gemma 2 (which reads no such key): every other */
        int64_t pattern = 2;
        if (cfg->arch == TP_ARCH_GEMMA3) {
            pattern = 6;
            TP_CHECK(int_key(what, root, NULL, "sliding_window_pattern", 0, 1, INT64_MAX, &pattern, NULL));
        }
        for (int64_t i = 0; i < cfg->n_layers; i++) cfg->sliding_layer[i] = (i + 1) % pattern != 0;
        if (!json_object_get(root, "sliding_window")) window = 4096, has_window = 1; /* its default */
    }
    const json_t *types = json_object_get(root, "layer_types");
    if ((qwen || gemma) && types && !json_is_null(types)) {
        char allowed[128];
        snprintf(allowed, sizeof allowed,
                 "a list of %lld \"full_attention\" or \"sliding_attention\" strings",
                 (long long)cfg->n_layers);
        if (!json_is_array(types) || (int64_t)json_array_size(types) != cfg->n_layers)
            return bad_value(what, NULL, "layer_types", allowed, types);
        for (size_t i = 0; i < json_array_size(types); i++) {
            const char *t = json_string_value(json_array_get(types, i));
            if (t && strcmp(t, "sliding_attention") == 0)
                cfg->sliding_layer[i] = 1;
            else if (t && strcmp(t, "full_attention") == 0)
                cfg->sliding_layer[i] = 0;
            else {
                char key[48];
                snprintf(key, sizeof key, "layer_types[%zu]", i);
                return bad_value(what, NULL, key, "\"full_attention\" or \"sliding_attention\"",
                                 json_array_get(types, i));
            }
        }
    }

    if (cfg->arch == TP_ARCH_GEMMA3) memcpy(cfg->local_rope, cfg->sliding_layer, sizeof cfg->local_rope);
    int used = 0;
    switch (cfg->arch) {
    case TP_ARCH_MISTRAL:
    case TP_ARCH_PHI3: /* Phi-3-mini's 2047 */
        used = has_window;
        memset(cfg->sliding_layer, 1, (size_t)cfg->n_layers);
        break;
    case TP_ARCH_QWEN2:
    case TP_ARCH_QWEN3:
        used = has_window && use; /* HF drops the window unless use_sliding_window */
        break;
    case TP_ARCH_GEMMA2:
    case TP_ARCH_GEMMA3:
        used = has_window;
        break;
    default:
        break;
    }
    if (used && window == 0)
        return tp_error(TP_ERR_FORMAT, "%s: sliding_window must be a positive integer or null, "
                        "found 0", what);
    int any = 0;
    for (int64_t i = 0; i < cfg->n_layers; i++) any |= cfg->sliding_layer[i];
    if (!used || !any || window >= cfg->max_position_embeddings) {
        cfg->sliding_window = 0;
        memset(cfg->sliding_layer, 0, sizeof cfg->sliding_layer);
    } else {
        cfg->sliding_window = window;
    }
    return TP_OK;
}

static const struct {
    const char *name;
    tp_dtype dt;
} torch_dtypes[] = {
    {"float32", TP_DTYPE_F32},
    {"float16", TP_DTYPE_F16},
    {"bfloat16", TP_DTYPE_BF16},
};

static tp_status dtype_key(const char *what, const json_t *root, const char *key,
                           tp_dtype *out, int *found)
{
    const char *name;
    *found = 0;
    TP_CHECK(str_key(what, root, NULL, key, &name));
    if (!name) return TP_OK;
    for (size_t i = 0; i < TP_ARRAY_LEN(torch_dtypes); i++)
        if (strcmp(name, torch_dtypes[i].name) == 0) {
            *out = torch_dtypes[i].dt;
            *found = 1;
            return TP_OK;
        }
    char found_s[96];
    describe(json_object_get(root, key), found_s, sizeof found_s);
    return tp_error(TP_ERR_UNSUPPORTED,
                    "%s: %s is %s (supported: float32, float16, bfloat16)", what, key, found_s);
}

static tp_status parse_dtype(const char *what, const json_t *root, tp_model_config *cfg)
{
    /* newer transformers write "dtype", older ones "torch_dtype" */
    tp_dtype a = TP_DTYPE_F32, b = TP_DTYPE_F32;
    int fa, fb;
    TP_CHECK(dtype_key(what, root, "torch_dtype", &a, &fa));
    TP_CHECK(dtype_key(what, root, "dtype", &b, &fb));
    if (fa && fb && a != b)
        return tp_error(TP_ERR_FORMAT, "%s: torch_dtype \"%s\" and dtype \"%s\" disagree", what,
                        json_string_value(json_object_get(root, "torch_dtype")),
                        json_string_value(json_object_get(root, "dtype")));
    cfg->torch_dtype = fb ? b : a;
    return TP_OK;
}

static tp_status parse_token_ids(const char *what, const json_t *root, tp_model_config *cfg)
{
    int64_t bos;
    int n;
    cfg->bos_token_id = -1;
    TP_CHECK(token_ids(what, root, "bos_token_id", cfg->vocab_size, 1, &bos, &n));
    if (n == 1) cfg->bos_token_id = bos;
    return token_ids(what, root, "eos_token_id", cfg->vocab_size, TP_MAX_EOS_IDS,
                     cfg->eos_token_ids, &cfg->n_eos);
}

/* A quantized checkpoint (AWQ, GPTQ, FP8, bitsandbytes...: its config.json's quantization_config,
 * or compression_config as compressed-tensors first wrote it) holds packed or 8-bit tensors with
 * scales beside them, which tpinfer does not read: refused here, naming the method, rather than
 * later as a missing or mistyped tensor. */
static tp_status refuse_quantized(const char *what, const json_t *root)
{
    static const char *const keys[] = {"quantization_config", "compression_config"};
    for (size_t i = 0; i < TP_ARRAY_LEN(keys); i++) {
        const json_t *q = json_object_get(root, keys[i]);
        if (!q || json_is_null(q)) continue;
        const char *method = json_string_value(json_object_get(q, "quant_method"));
        char name[64] = "";
        if (method) sanitize(method, strlen(method), name, sizeof name);
        return tp_error(TP_ERR_UNSUPPORTED, "%s: %s%s%s%s: the checkpoint is quantized, and tpinfer runs float32, "
                        "float16 and bfloat16 weights only; give the unquantized model", what, keys[i],
                        method ? " (quant_method \"" : "", name, method ? "\")" : "");
    }
    return TP_OK;
}

/* The config the text model reads, in place of *root: a multimodal checkpoint's text_config,
 * with the top level's dtype and token ids where it gives none (Gemma3Config keeps them there);
 * for Gemma 3, either way, Gemma3TextConfig's defaults for the keys it leaves out (the Hub's
 * Gemma 3 4B, 12B and 27B give only what differs from them). *root's reference is released
 * for the new object's. */
static tp_status text_model_config(const char *what, tp_model_config *cfg, json_t **root)
{
    json_t *text = *root;
    if (cfg->multimodal) {
        const json_t *t = json_object_get(*root, "text_config");
        if (!json_is_object(t)) {
            char found[128];
            describe(t, found, sizeof found);
            return tp_error(TP_ERR_FORMAT, "%s: %s has no text_config object (found %s): the text model's config "
                            "goes there", what, tp_model_config_arch_name(cfg), found);
        }
        const char *type;
        TP_CHECK(str_key(what, t, "text_config", "model_type", &type));
        if (type && !find_arch(type, 1, 0, cfg)) {
            char types[256] = ""; /* archs' model_types, as the table has them */
            for (size_t i = 0; i < TP_ARRAY_LEN(archs); i++)
                snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s", i ? ", " : "",
                         archs[i].model_type);
            return tp_error(TP_ERR_UNSUPPORTED, "%s: text_config.model_type is \"%.64s\", which tpinfer does not run "
                            "as %s's text model (supported: %s)", what, type, tp_model_config_arch_name(cfg), types);
        }
        text = json_deep_copy(t);
        /* not tie_word_embeddings: the text model ties by its own config's (or its default) */
        static const char *const inherited[] = {"torch_dtype", "dtype", "bos_token_id", "eos_token_id"};
        for (size_t i = 0; text && i < TP_ARRAY_LEN(inherited); i++) {
            json_t *v = json_object_get(*root, inherited[i]);
            if (v && !json_object_get(text, inherited[i]) && json_object_set(text, inherited[i], v)) {
                json_decref(text);
                text = NULL;
            }
        }
    } else {
        json_incref(text);
    }
    if (text && cfg->arch == TP_ARCH_GEMMA3) {
        json_t *defaults = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:i, s:i}", "vocab_size", 262208,
                                     "hidden_size", 2304, "intermediate_size", 9216, "num_hidden_layers", 26,
                                     "num_attention_heads", 8, "num_key_value_heads", 4, "head_dim", 256,
                                     "max_position_embeddings", 131072, "rms_norm_eps", 1e-6, "bos_token_id", 2,
                                     "eos_token_id", 1);
        if (!defaults || json_object_update_missing(text, defaults)) {
            json_decref(text);
            text = NULL;
        }
        json_decref(defaults);
    }
    if (!text) return tp_error(TP_ERR_OOM, "%s: out of memory reading the text model's config", what);
    json_decref(*root);
    *root = text;
    return TP_OK;
}

// ----------------------------------------------------------------------------
// public entry points

tp_status tp_model_config_parse(const char *json_text, size_t len, const char *what,
                                tp_model_config *cfg)
{
    json_t *root;
    TP_CHECK(load_object(json_text, len, what, &root));
    /* fill a local copy so a failure leaves *cfg untouched */
    tp_model_config c;
    memset(&c, 0, sizeof c);
    tp_status st;
    TP_CHECK_GOTO(parse_arch(what, root, &c), st, done);
    TP_CHECK_GOTO(refuse_quantized(what, root), st, done);
    TP_CHECK_GOTO(text_model_config(what, &c, &root), st, done);
    if (c.multimodal) TP_CHECK_GOTO(refuse_quantized(what, root), st, done); /* its text_config's */
    TP_CHECK_GOTO(parse_shape(what, root, &c), st, done);
    TP_CHECK_GOTO(parse_norm_and_bias(what, root, &c), st, done);
    TP_CHECK_GOTO(parse_multipliers(what, root, &c), st, done);
    TP_CHECK_GOTO(parse_rope(what, root, &c), st, done);
    TP_CHECK_GOTO(parse_sliding_window(what, root, &c), st, done);
    TP_CHECK_GOTO(parse_dtype(what, root, &c), st, done);
    TP_CHECK_GOTO(parse_token_ids(what, root, &c), st, done);
    *cfg = c;
done:
    json_decref(root);
    return st;
}

tp_status tp_model_config_load(const char *model_dir, tp_model_config *cfg)
{
    struct stat sb;
    if (stat(model_dir, &sb) != 0)
        return tp_error(TP_ERR_IO, "--model %s: %s (give a Hugging Face model directory: config.json, *.safetensors, "
                        "tokenizer.json)", model_dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return tp_error(TP_ERR_IO, "--model %s is not a directory (give a Hugging Face model directory: config.json, "
                        "*.safetensors, tokenizer.json)", model_dir);
    char *path = tp_path_join(model_dir, "config.json");
    if (!path) return tp_error(TP_ERR_OOM, "out of memory joining %s/config.json", model_dir);
    char *text;
    size_t len;
    tp_status st = tp_read_file(path, MAX_CONFIG_BYTES, &text, &len);
    if (st != TP_OK && access(path, F_OK) != 0) {
        tp_error_clear(); /* the first error stands otherwise; this one says what to do */
        st = tp_error(TP_ERR_IO, "--model %s has no config.json: give the directory of a Hugging Face model as "
                      "downloaded (config.json, *.safetensors, tokenizer.json), e.g. from huggingface-cli download",
                      model_dir);
    }
    if (st == TP_OK) {
        st = tp_model_config_parse(text, len, path, cfg);
        free(text);
    }
    free(path);
    return st;
}

static void generation_config_absent(tp_generation_config *gen)
{
    memset(gen, 0, sizeof *gen);
    gen->bos_token_id = -1;
    gen->do_sample = -1;
    gen->temperature = -1;
    gen->top_p = -1;
    gen->top_k = -1;
    gen->repetition_penalty = -1;
    gen->max_new_tokens = -1;
}

/* Token ids are checked against the vocabulary later (tp_generation_config_check), as this
 * file alone does not say its size. pad_token_id, max_length and other keys are ignored. */
tp_status tp_generation_config_parse(const char *json_text, size_t len, const char *what,
                                     tp_generation_config *gen)
{
    json_t *root;
    TP_CHECK(load_object(json_text, len, what, &root));
    tp_generation_config g;
    generation_config_absent(&g);
    tp_status st;
    int64_t bos;
    int n;
    TP_CHECK_GOTO(token_ids(what, root, "bos_token_id", MAX_TOKEN_ID, 1, &bos, &n), st, done);
    if (n == 1) g.bos_token_id = bos;
    TP_CHECK_GOTO(token_ids(what, root, "eos_token_id", MAX_TOKEN_ID, TP_MAX_EOS_IDS,
                            g.eos_token_ids, &g.n_eos), st, done);
    TP_CHECK_GOTO(bool_key(what, root, NULL, "do_sample", &g.do_sample, NULL), st, done);
    TP_CHECK_GOTO(num_key(what, root, NULL, "temperature", 0, NUM_NONNEGATIVE, &g.temperature,
                          NULL), st, done);
    TP_CHECK_GOTO(num_key(what, root, NULL, "top_p", 0, NUM_UNIT, &g.top_p, NULL), st, done);
    TP_CHECK_GOTO(int_key(what, root, NULL, "top_k", 0, 0, INT32_MAX, &g.top_k, NULL), st, done);
    TP_CHECK_GOTO(num_key(what, root, NULL, "repetition_penalty", 0, NUM_POSITIVE,
                          &g.repetition_penalty, NULL), st, done);
    TP_CHECK_GOTO(int_key(what, root, NULL, "max_new_tokens", 0, 1, INT32_MAX,
                          &g.max_new_tokens, NULL), st, done);
    *gen = g;
done:
    json_decref(root);
    return st;
}

tp_status tp_generation_config_load(const char *model_dir, tp_generation_config *gen)
{
    generation_config_absent(gen);
    char *path = tp_path_join(model_dir, "generation_config.json");
    if (!path)
        return tp_error(TP_ERR_OOM, "out of memory joining %s/generation_config.json",
                        model_dir);
    /* only a missing file means "no generation config"; any other failure is reported */
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) {
        free(path);
        return TP_OK;
    }
    char *text;
    size_t len;
    tp_status st = tp_read_file(path, MAX_CONFIG_BYTES, &text, &len);
    if (st == TP_OK) {
        st = tp_generation_config_parse(text, len, path, gen);
        free(text);
    }
    free(path);
    return st;
}

tp_status tp_generation_config_check(const tp_generation_config *gen,
                                     const tp_model_config *cfg, const char *what)
{
    if (gen->bos_token_id >= cfg->vocab_size)
        return tp_error(TP_ERR_FORMAT, "%s: bos_token_id %lld is not below vocab_size %lld",
                        what, (long long)gen->bos_token_id, (long long)cfg->vocab_size);
    for (int i = 0; i < gen->n_eos; i++)
        if (gen->eos_token_ids[i] >= cfg->vocab_size)
            return tp_error(TP_ERR_FORMAT,
                            "%s: eos_token_id %lld is not below vocab_size %lld", what,
                            (long long)gen->eos_token_ids[i], (long long)cfg->vocab_size);
    return TP_OK;
}
