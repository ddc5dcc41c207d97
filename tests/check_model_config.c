/*
 * check_model_config.c: config.json and generation_config.json parsing. Every config of
 * $TPINFER_SHARED/models (skipped when absent) loads with the right values; then tables
 * of malformed configs (reliability.md §3.2 C1-C11) each give the expected status and a
 * message naming the file and the key.
 */
#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h" /* tp_rope_inv_freq */
#include "model_config.h"
#include "util.h"

#define WHAT "/m/config.json"
#define GEN_WHAT "/m/generation_config.json"

// ----------------------------------------------------------------------------
// shared model directories

/* $TPINFER_SHARED/models/NAME in buf, or 0 (with a printed reason) when absent. */
static int shared_model(const char *name, char *buf, size_t n)
{
    const char *shared = getenv("TPINFER_SHARED");
    if (!shared || !*shared) shared = "../shared";
    snprintf(buf, n, "%s/models%s%s", shared, name ? "/" : "", name ? name : "");
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
        printf("SKIP: %s not found (set TPINFER_SHARED to the shared fixtures)\n", buf);
        return 0;
    }
    return 1;
}

static void load_ok(const char *name, tp_model_config *cfg)
{
    char dir[4096];
    tp_error_clear();
    snprintf(dir, sizeof dir, "%s", name);
    tp_status st = tp_model_config_load(dir, cfg);
    ck_assert_msg(st == TP_OK, "%s: %s", dir, tp_error_message());
}

static void assert_eos(const int64_t *ids, int n, const int64_t *want, int n_want)
{
    ck_assert_int_eq(n, n_want);
    for (int i = 0; i < n; i++) ck_assert_int_eq(ids[i], want[i]);
}

START_TEST(every_shared_config_loads)
{
    char models[4096];
    if (!shared_model(NULL, models, sizeof models)) return;
    DIR *d = opendir(models);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char dir[4096 + 256], file[4096 + 300];
        snprintf(dir, sizeof dir, "%s/%s", models, e->d_name);
        snprintf(file, sizeof file, "%s/config.json", dir);
        if (access(file, F_OK) != 0) continue; /* stories260K: llama2.c format, no config */
        tp_model_config cfg;
        tp_generation_config gen;
        load_ok(dir, &cfg);
        tp_error_clear();
        ck_assert_msg(tp_generation_config_load(dir, &gen) == TP_OK, "%s: %s", dir,
                      tp_error_message());
        ck_assert_msg(tp_generation_config_check(&gen, &cfg, dir) == TP_OK, "%s: %s", dir,
                      tp_error_message());
        n++;
    }
    closedir(d);
    ck_assert_int_ge(n, 6);
}
END_TEST

START_TEST(stories260K_values)
{
    char dir[4096];
    if (!shared_model("stories260K-hf", dir, sizeof dir)) return;
    tp_model_config c;
    load_ok(dir, &c);
    ck_assert_int_eq(c.arch, TP_ARCH_LLAMA);
    ck_assert_str_eq(tp_arch_name(c.arch), "LlamaForCausalLM");
    ck_assert_int_eq(c.hidden_size, 64);
    ck_assert_int_eq(c.intermediate_size, 172);
    ck_assert_int_eq(c.n_layers, 5);
    ck_assert_int_eq(c.n_heads, 8);
    ck_assert_int_eq(c.n_kv_heads, 4);
    ck_assert_int_eq(c.head_dim, 8);
    ck_assert_int_eq(c.vocab_size, 512);
    ck_assert_int_eq(c.max_position_embeddings, 512);
    ck_assert_double_eq(c.rms_norm_eps, 1e-5);
    ck_assert_double_eq(c.rope_theta, 10000.0);
    ck_assert_int_eq(c.rope_scaling.type, TP_ROPE_DEFAULT);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert(!c.attention_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm);
    ck_assert_int_eq(c.torch_dtype, TP_DTYPE_F32);
    ck_assert_int_eq(c.bos_token_id, 1);
    assert_eos(c.eos_token_ids, c.n_eos, (const int64_t[]){2}, 1);

    if (!shared_model("stories260K-hf-bf16-sharded", dir, sizeof dir)) return;
    load_ok(dir, &c);
    ck_assert_int_eq(c.torch_dtype, TP_DTYPE_BF16);
    ck_assert_int_eq(c.hidden_size, 64);

    tp_generation_config g;
    tp_error_clear();
    ck_assert_int_eq(tp_generation_config_load(dir, &g), TP_OK);
    ck_assert_int_eq(g.bos_token_id, 1);
    assert_eos(g.eos_token_ids, g.n_eos, (const int64_t[]){2}, 1);
    ck_assert_int_eq(g.do_sample, 0);
    ck_assert_int_lt(g.max_new_tokens, 0); /* max_length is not max_new_tokens */
    ck_assert(g.temperature < 0 && g.top_p < 0 && g.top_k < 0 && g.repetition_penalty < 0);
}
END_TEST

START_TEST(tiny_llama3_values)
{
    char dir[4096];
    if (!shared_model("tiny-llama3", dir, sizeof dir)) return;
    tp_model_config c;
    load_ok(dir, &c);
    ck_assert_int_eq(c.arch, TP_ARCH_LLAMA);
    ck_assert_int_eq(c.hidden_size, 128);
    ck_assert_int_eq(c.intermediate_size, 352);
    ck_assert_int_eq(c.n_layers, 4);
    ck_assert_int_eq(c.n_heads, 8);
    ck_assert_int_eq(c.n_kv_heads, 2);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert_int_eq(c.vocab_size, 1024);
    ck_assert_double_eq(c.rope_theta, 500000.0);
    ck_assert_int_eq(c.rope_scaling.type, TP_ROPE_LLAMA3);
    ck_assert_double_eq(c.rope_scaling.factor, 8.0);
    ck_assert_double_eq(c.rope_scaling.low_freq_factor, 1.0);
    ck_assert_double_eq(c.rope_scaling.high_freq_factor, 4.0);
    ck_assert_int_eq(c.rope_scaling.original_max_position, 64);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.torch_dtype, TP_DTYPE_BF16);
    ck_assert_int_eq(c.bos_token_id, 1008);
    assert_eos(c.eos_token_ids, c.n_eos, (const int64_t[]){1009, 1016, 1017}, 3);

    tp_generation_config g;
    tp_error_clear();
    ck_assert_int_eq(tp_generation_config_load(dir, &g), TP_OK);
    ck_assert_int_eq(g.bos_token_id, 1008);
    assert_eos(g.eos_token_ids, g.n_eos, (const int64_t[]){1009, 1016, 1017}, 3);
    ck_assert_int_eq(g.do_sample, 0);
}
END_TEST

START_TEST(tiny_mistral_values)
{
    char dir[4096];
    if (!shared_model("tiny-mistral", dir, sizeof dir)) return;
    tp_model_config c;
    load_ok(dir, &c);
    ck_assert_int_eq(c.arch, TP_ARCH_MISTRAL);
    ck_assert_int_eq(c.hidden_size, 128);
    ck_assert_int_eq(c.intermediate_size, 384);
    ck_assert_int_eq(c.n_layers, 3);
    ck_assert_int_eq(c.n_heads, 8);
    ck_assert_int_eq(c.n_kv_heads, 4);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert_int_eq(c.vocab_size, 512);
    ck_assert_int_eq(c.max_position_embeddings, 1024);
    ck_assert_double_eq(c.rope_theta, 1000000.0);
    ck_assert(!c.attention_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
}
END_TEST

START_TEST(tiny_qwen2_values)
{
    char dir[4096];
    if (!shared_model("tiny-qwen2", dir, sizeof dir)) return;
    tp_model_config c;
    load_ok(dir, &c); /* sliding_window 4096 with use_sliding_window false */
    ck_assert_int_eq(c.arch, TP_ARCH_QWEN2);
    ck_assert_int_eq(c.n_heads, 4);
    ck_assert_int_eq(c.n_kv_heads, 2);
    ck_assert_int_eq(c.head_dim, 32); /* derived: 128 / 4 */
    ck_assert_int_eq(c.attention_bias, 1);
    ck_assert_int_eq(c.o_bias, 0);
    ck_assert_int_eq(c.mlp_bias, 0);
    ck_assert_int_eq(c.qk_norm, 0);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert_double_eq(c.rms_norm_eps, 1e-6);
    assert_eos(c.eos_token_ids, c.n_eos, (const int64_t[]){1002}, 1);

    tp_generation_config g;
    tp_error_clear();
    ck_assert_int_eq(tp_generation_config_load(dir, &g), TP_OK);
    ck_assert_int_eq(g.bos_token_id, 1000);
    assert_eos(g.eos_token_ids, g.n_eos, (const int64_t[]){1002, 1000}, 2);
}
END_TEST

START_TEST(tiny_qwen3_values)
{
    char dir[4096];
    if (!shared_model("tiny-qwen3", dir, sizeof dir)) return;
    tp_model_config c;
    load_ok(dir, &c);
    ck_assert_int_eq(c.arch, TP_ARCH_QWEN3);
    ck_assert_int_eq(c.hidden_size, 128);
    ck_assert_int_eq(c.n_heads, 8);
    ck_assert_int_eq(c.n_kv_heads, 2);
    ck_assert_int_eq(c.head_dim, 32); /* explicit, not 128 / 8 */
    ck_assert_int_eq(c.qk_norm, 1);
    ck_assert(!c.attention_bias && !c.o_bias && !c.mlp_bias);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.vocab_size, 1024);
}
END_TEST

// ----------------------------------------------------------------------------
// malformed config.json: a base config with one key set, deleted, or raw text

static const char *const llama_base =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":128,"
    "\"intermediate_size\":352,\"num_hidden_layers\":4,\"num_attention_heads\":8,"
    "\"num_key_value_heads\":2,\"vocab_size\":1024,\"max_position_embeddings\":512,"
    "\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,\"rope_scaling\":null,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"attention_bias\":false,"
    "\"mlp_bias\":false,\"bos_token_id\":1,\"eos_token_id\":2,\"torch_dtype\":\"bfloat16\"}";

static const char *const qwen2_base =
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"model_type\":\"qwen2\",\"hidden_size\":128,"
    "\"intermediate_size\":320,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"vocab_size\":1024,\"max_position_embeddings\":32768,"
    "\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,\"tie_word_embeddings\":true,"
    "\"use_sliding_window\":false,\"sliding_window\":4096,\"max_window_layers\":3,"
    "\"eos_token_id\":1002,\"torch_dtype\":\"bfloat16\"}";

static const char *const mistral_base =
    "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":128,"
    "\"intermediate_size\":384,\"num_hidden_layers\":3,\"num_attention_heads\":8,"
    "\"num_key_value_heads\":4,\"head_dim\":16,\"vocab_size\":512,"
    "\"max_position_embeddings\":32768,\"sliding_window\":null}";

static const char *const qwen3_base =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":128,\"intermediate_size\":384,"
    "\"num_hidden_layers\":3,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
    "\"head_dim\":32,\"vocab_size\":1024,\"max_position_embeddings\":1024,"
    "\"attention_bias\":false}";

/* Phi-3-mini-4k's shape, scaled down: no head_dim key, a window of 2047 */
static const char *const phi3_base =
    "{\"architectures\":[\"Phi3ForCausalLM\"],\"model_type\":\"phi3\",\"hidden_size\":128,"
    "\"intermediate_size\":384,\"num_hidden_layers\":3,\"num_attention_heads\":8,"
    "\"num_key_value_heads\":4,\"vocab_size\":512,\"max_position_embeddings\":4096,"
    "\"original_max_position_embeddings\":4096,\"sliding_window\":2047,\"rope_scaling\":null,"
    "\"rope_theta\":10000.0,\"rms_norm_eps\":1e-05,\"pad_token_id\":32000,\"hidden_act\":\"silu\"}";

/* Gemma 3 1B's config.json as downloaded (transformers 4.50's keys), scaled down to 7 layers so
 * that sliding_window_pattern 6 leaves layer 5 full */
#define GEMMA3_4B                                                                                                  \
    "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"boi_token_index\":255999,\"eoi_token_index\":256000," \
    "\"eos_token_id\":[1,106],\"image_token_index\":262144,\"initializer_range\":0.02,\"mm_tokens_per_image\":256,"    \
    "\"model_type\":\"gemma3\",\"text_config\":{\"hidden_size\":2560,\"intermediate_size\":10240,"                   \
    "\"model_type\":\"gemma3_text\",\"num_hidden_layers\":34,\"rope_scaling\":{\"factor\":8.0,\"rope_type\":"       \
    "\"linear\"},\"sliding_window\":1024},\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.50.0.dev0\","   \
    "\"vision_config\":{\"hidden_size\":1152,\"image_size\":896,\"intermediate_size\":4304,\"model_type\":"         \
    "\"siglip_vision_model\",\"num_attention_heads\":16,\"num_hidden_layers\":27,\"patch_size\":14,"                 \
    "\"vision_use_head\":false}}"

#define MISTRAL_SMALL_31                                                                                           \
    "{\"architectures\":[\"Mistral3ForConditionalGeneration\"],\"image_token_index\":10,\"model_type\":\"mistral3\"," \
    "\"multimodal_projector_bias\":false,\"projector_hidden_act\":\"gelu\",\"spatial_merge_size\":2,"                 \
    "\"text_config\":{\"attention_dropout\":0.0,\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":5120,"     \
    "\"initializer_range\":0.02,\"intermediate_size\":32768,\"max_position_embeddings\":131072,\"model_type\":"       \
    "\"mistral\",\"num_attention_heads\":32,\"num_hidden_layers\":40,\"num_key_value_heads\":8,\"rms_norm_eps\":"   \
    "1e-05,\"rope_theta\":1000000000.0,\"sliding_window\":null,\"use_cache\":true,\"vocab_size\":131072},"           \
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.50.0.dev0\",\"vision_config\":{\"head_dim\":64,"     \
    "\"hidden_act\":\"silu\",\"hidden_size\":1024,\"image_size\":1540,\"intermediate_size\":4096,\"model_type\":"   \
    "\"pixtral\",\"num_attention_heads\":16,\"num_hidden_layers\":24,\"patch_size\":14,\"rope_theta\":10000.0},"    \
    "\"vision_feature_layer\":-1}"

static const char *const gemma3_base =
    "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\",\"hidden_size\":1152,"
    "\"intermediate_size\":6912,\"num_hidden_layers\":7,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
    "\"head_dim\":256,\"vocab_size\":262144,\"max_position_embeddings\":32768,\"hidden_activation\":"
    "\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":256,\"rms_norm_eps\":1e-06,\"rope_local_base_freq\":10000,"
    "\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":512,\"sliding_window_pattern\":6,"
    "\"attn_logit_softcapping\":null,\"final_logit_softcapping\":null,\"attention_bias\":false,"
    "\"bos_token_id\":2,\"eos_token_id\":[1,106],\"torch_dtype\":\"bfloat16\"}";

typedef struct cfg_case {
    const char *base; /* base config text (ignored when raw is set) */
    const char *del;  /* a key to delete, or NULL */
    const char *set;  /* a JSON object whose members replace the base's, or NULL */
    const char *raw;  /* whole text to parse instead */
    tp_status st;
    const char *msg;  /* expected message substring (errors), or NULL */
    void (*check)(const tp_model_config *cfg); /* extra checks on success, or NULL */
} cfg_case;

static void check_head_dim_16(const tp_model_config *c) { ck_assert_int_eq(c->head_dim, 16); }
static void check_qwen3_default_head_dim(const tp_model_config *c)
{
    ck_assert_int_eq(c->head_dim, 128);
}
static void check_qwen2(const tp_model_config *c)
{
    ck_assert_int_eq(c->arch, TP_ARCH_QWEN2);
    ck_assert(c->attention_bias && !c->o_bias && !c->mlp_bias);
}
/* the window (0: none) and which of the 3 layers slide, as a string of 0s and 1s */
static void check_window(const tp_model_config *c, int64_t window, const char *layers)
{
    ck_assert_int_eq(c->sliding_window, window);
    for (int i = 0; i < 3; i++) ck_assert_msg(c->sliding_layer[i] == layers[i] - '0', "layer %d", i);
    for (int i = 3; i < TP_MAX_LAYERS; i++) ck_assert_int_eq(c->sliding_layer[i], 0);
    /* the window the scheduler gives blocks back behind: only where every layer slides */
    ck_assert_int_eq(tp_model_config_window_of_all(c), strcmp(layers, "111") ? 0 : window);
}
static void check_no_window(const tp_model_config *c) { check_window(c, 0, "000"); }
static void check_window_all(const tp_model_config *c) { check_window(c, 4096, "111"); }
static void check_window_12(const tp_model_config *c) { check_window(c, 4096, "011"); }
static void check_window_2(const tp_model_config *c) { check_window(c, 4096, "001"); }
static void check_window_8_02(const tp_model_config *c) { check_window(c, 8, "101"); }
static void check_window_512_12(const tp_model_config *c) { check_window(c, 512, "011"); }
static void check_phi3(const tp_model_config *c)
{
    ck_assert_int_eq(c->arch, TP_ARCH_PHI3);
    ck_assert(!c->attention_bias && !c->o_bias && !c->mlp_bias && !c->qk_norm);
    ck_assert_int_eq(c->head_dim, 16);
    check_window(c, 2047, "111");
}
static void check_phi3_no_window(const tp_model_config *c)
{
    ck_assert_int_eq(c->arch, TP_ARCH_PHI3);
    check_window(c, 0, "000");
}
static void check_multipliers(const tp_model_config *c, tp_arch arch, double e, double r, double a, double l)
{
    ck_assert_int_eq(c->arch, arch);
    ck_assert_double_eq(c->embedding_multiplier, e);
    ck_assert_double_eq(c->residual_multiplier, r);
    ck_assert_double_eq(c->attention_multiplier, a);
    ck_assert_double_eq(c->logits_scaling, l);
}
/* Granite 3's values; GraniteConfig's defaults (attention_multiplier 1, not 1 / sqrt(head_dim));
 * Llama reads none of them (0: 1 / sqrt(head_dim)) */
static void check_granite3(const tp_model_config *c) { check_multipliers(c, TP_ARCH_GRANITE, 12, 0.22, 0.0078125, 16); }
static void check_granite_defaults(const tp_model_config *c) { check_multipliers(c, TP_ARCH_GRANITE, 1, 1, 1, 1); }
static void check_llama_ignores_multipliers(const tp_model_config *c) { check_multipliers(c, TP_ARCH_LLAMA, 1, 1, 0, 1); }
/* Gemma 3 1B: GeLU, norms of 1 + weight, q/k norms, tied, sqrt(1152) into the embedding, the
 * scores scaled by 256^-0.5, layers 0-4 and 6 sliding (512) with base 1e4, layer 5 full with 1e6 */
static void check_gemma3_layers(const tp_model_config *c, int64_t window, const char *sliding, const char *local)
{
    ck_assert_int_eq(c->arch, TP_ARCH_GEMMA3);
    ck_assert(c->mlp_act == TP_ACT_GELU_TANH && c->gemma_norms && c->qk_norm && c->tie_word_embeddings);
    ck_assert(!c->attention_bias && !c->o_bias && !c->mlp_bias);
    ck_assert_int_eq(c->head_dim, 256);
    ck_assert_double_eq_tol(c->embedding_multiplier, sqrt(1152.0), 1e-12);
    ck_assert_double_eq_tol(c->attention_multiplier, 1.0 / 16, 1e-15);
    ck_assert_int_eq(c->sliding_window, window);
    for (int i = 0; i < 7; i++) {
        ck_assert_msg(c->sliding_layer[i] == sliding[i] - '0', "layer %d slides", i);
        ck_assert_msg(c->local_rope[i] == local[i] - '0', "layer %d's rope", i);
    }
}
static void check_gemma3(const tp_model_config *c)
{
    check_gemma3_layers(c, 512, "1111101", "1111101");
    ck_assert_double_eq(c->rope_theta, 1e6);
    ck_assert_double_eq(c->rope_local_theta, 1e4);
    ck_assert_int_eq(c->rope_scaling.type, TP_ROPE_DEFAULT);
}
/* transformers 5's form: the bases in rope_parameters by layer type, the full layers' scaled */
static void check_gemma3_rope_parameters(const tp_model_config *c)
{
    check_gemma3_layers(c, 512, "1011111", "1011111");
    ck_assert_double_eq(c->rope_theta, 5e5);
    ck_assert_double_eq(c->rope_local_theta, 2e4);
    ck_assert_int_eq(c->rope_scaling.type, TP_ROPE_LINEAR);
    ck_assert_double_eq(c->rope_scaling.factor, 8.0);
}
/* no window (sliding_window null): no layer slides, the sliding type's rope base stays */
static void check_gemma3_no_window(const tp_model_config *c) { check_gemma3_layers(c, 0, "0000000", "1111101"); }
/* Gemma3TextConfig's defaults: head_dim 256, window 4096, bases 1e6 / 1e4, tied */
static void check_gemma3_defaults(const tp_model_config *c)
{
    check_gemma3_layers(c, 4096, "1111101", "1111101");
    ck_assert_double_eq(c->rope_theta, 1e6);
    ck_assert_double_eq(c->rope_local_theta, 1e4);
}
static void check_gemma3_caps(const tp_model_config *c)
{
    check_gemma3(c);
    ck_assert_double_eq(c->attn_softcap, 50);
    ck_assert_double_eq(c->final_softcap, 30);
}
/* Gemma 2 on Gemma 3's shape: its layers, every other one sliding from layer 0, one base */
static void check_gemma2(const tp_model_config *c, double attn_cap, double final_cap)
{
    ck_assert_int_eq(c->arch, TP_ARCH_GEMMA2);
    ck_assert(c->mlp_act == TP_ACT_GELU_TANH && c->gemma_norms && !c->qk_norm && c->tie_word_embeddings);
    ck_assert_double_eq_tol(c->embedding_multiplier, sqrt(1152.0), 1e-12);
    ck_assert_double_eq_tol(c->attention_multiplier, 1.0 / 16, 1e-15);
    ck_assert_int_eq(c->sliding_window, 512);
    for (int i = 0; i < 7; i++) {
        ck_assert_msg(c->sliding_layer[i] == (i % 2 == 0), "layer %d slides", i);
        ck_assert_int_eq(c->local_rope[i], 0);
    }
    ck_assert_double_eq(c->rope_theta, 10000);
    ck_assert_double_eq(c->rope_local_theta, 0);
    ck_assert_double_eq(c->attn_softcap, attn_cap);
    ck_assert_double_eq(c->final_softcap, final_cap);
}
/* Gemma 1 on Gemma 3's shape: Llama's layers with norms of 1 + weight (none around the blocks'
 * outputs), GeLU from the legacy "gelu", the scores by head_dim^-1/2, no window (GemmaConfig
 * reads none), tied */
static void check_gemma1(const tp_model_config *c)
{
    ck_assert_int_eq(c->arch, TP_ARCH_GEMMA);
    ck_assert(c->mlp_act == TP_ACT_GELU_TANH && c->gemma_norms && !c->block_output_norms && !c->qk_norm);
    ck_assert(c->tie_word_embeddings);
    ck_assert_double_eq_tol(c->embedding_multiplier, sqrt(1152.0), 1e-12);
    ck_assert_double_eq(c->attention_multiplier, 0);
    ck_assert_double_eq(c->attn_softcap, 0);
    check_window(c, 0, "000");
}
/* google/gemma-3-4b-it's config.json: Gemma3ForConditionalGeneration, whose text_config gives only
 * what differs from Gemma3TextConfig's defaults; the dtype and eos ids at the top level */
static void check_gemma3_4b(const tp_model_config *c)
{
    ck_assert(c->arch == TP_ARCH_GEMMA3 && c->multimodal);
    ck_assert_str_eq(tp_model_config_arch_name(c), "Gemma3ForConditionalGeneration");
    ck_assert(c->hidden_size == 2560 && c->intermediate_size == 10240 && c->n_layers == 34);
    ck_assert(c->n_heads == 8 && c->n_kv_heads == 4 && c->head_dim == 256);
    ck_assert(c->vocab_size == 262208 && c->max_position_embeddings == 131072);
    ck_assert_double_eq(c->rms_norm_eps, 1e-6);
    ck_assert_double_eq_tol(c->attention_multiplier, 1.0 / 16, 1e-15);
    ck_assert_double_eq_tol(c->embedding_multiplier, sqrt(2560.0), 1e-12);
    ck_assert(c->tie_word_embeddings && c->qk_norm && c->gemma_norms && c->block_output_norms);
    ck_assert_int_eq(c->sliding_window, 1024);
    for (int i = 0; i < 34; i++) {
        ck_assert_msg(c->sliding_layer[i] == ((i + 1) % 6 != 0), "layer %d slides", i);
        ck_assert_int_eq(c->local_rope[i], c->sliding_layer[i]);
    }
    ck_assert_double_eq(c->rope_theta, 1e6);
    ck_assert_double_eq(c->rope_local_theta, 1e4);
    ck_assert_int_eq(c->rope_scaling.type, TP_ROPE_LINEAR);
    ck_assert_double_eq(c->rope_scaling.factor, 8.0);
    ck_assert_int_eq(c->torch_dtype, TP_DTYPE_BF16);
    ck_assert_int_eq(c->bos_token_id, 2);
    ck_assert_int_eq(c->n_eos, 2);
    ck_assert(c->eos_token_ids[0] == 1 && c->eos_token_ids[1] == 106);
}
/* mistralai/Mistral-Small-3.1-24B-Instruct-2503's config.json: Mistral3ForConditionalGeneration,
 * its text model a Mistral with a rope base of 1e9, untied, no window */
static void check_mistral3(const tp_model_config *c)
{
    ck_assert(c->arch == TP_ARCH_MISTRAL && c->multimodal);
    ck_assert_str_eq(tp_model_config_arch_name(c), "Mistral3ForConditionalGeneration");
    ck_assert(c->hidden_size == 5120 && c->intermediate_size == 32768 && c->n_layers == 40);
    ck_assert(c->n_heads == 32 && c->n_kv_heads == 8 && c->head_dim == 128 && c->vocab_size == 131072);
    ck_assert_double_eq(c->rope_theta, 1e9);
    ck_assert_double_eq(c->rms_norm_eps, 1e-5);
    ck_assert(!c->tie_word_embeddings && !c->gemma_norms && c->sliding_window == 0 && c->mlp_act == TP_ACT_SILU);
    ck_assert_int_eq(c->torch_dtype, TP_DTYPE_BF16);
    ck_assert_int_eq(c->n_eos, 0);
}
/* a text_config of another supported type: that architecture */
static void check_mistral3_llama(const tp_model_config *c)
{
    ck_assert(c->arch == TP_ARCH_LLAMA && c->multimodal);
    ck_assert_str_eq(tp_model_config_arch_name(c), "Mistral3ForConditionalGeneration");
}
/* the text_config's own values win over the top level's */
static void check_gemma3_mm_own(const tp_model_config *c)
{
    ck_assert(c->multimodal && c->torch_dtype == TP_DTYPE_F32 && c->n_eos == 1 && c->eos_token_ids[0] == 7);
    ck_assert(!c->tie_word_embeddings);
}
/* the text model ties by its own config: the top level's tie_word_embeddings is not its */
static void check_mistral3_untied(const tp_model_config *c) { ck_assert(c->multimodal && !c->tie_word_embeddings); }
static void check_gemma3_mm_tied(const tp_model_config *c) { ck_assert(c->multimodal && c->tie_word_embeddings); }
static void check_gemma2_no_caps(const tp_model_config *c) { check_gemma2(c, 0, 0); }
static void check_gemma2_default_attn_cap(const tp_model_config *c) { check_gemma2(c, 50, 0); }
static void check_llama_biases(const tp_model_config *c)
{
    ck_assert(c->attention_bias && c->o_bias && c->mlp_bias && !c->qk_norm);
}
static void check_qwen3_biases(const tp_model_config *c)
{
    ck_assert(c->attention_bias && c->o_bias && !c->mlp_bias && c->qk_norm);
}
static void check_linear(const tp_model_config *c)
{
    ck_assert_int_eq(c->rope_scaling.type, TP_ROPE_LINEAR);
    ck_assert_double_eq(c->rope_scaling.factor, 2.0);
}
static void check_yarn(const tp_model_config *c, double factor, int64_t original, double beta_fast,
                       double beta_slow, int truncate, double attention_factor)
{
    const tp_rope_scaling *r = &c->rope_scaling;
    ck_assert_int_eq(r->type, TP_ROPE_YARN);
    ck_assert_double_eq_tol(r->factor, factor, 1e-12);
    ck_assert_int_eq(r->original_max_position, original);
    ck_assert_double_eq(r->beta_fast, beta_fast);
    ck_assert_double_eq(r->beta_slow, beta_slow);
    ck_assert_int_eq(r->truncate, truncate);
    ck_assert_double_eq_tol(r->attention_factor, attention_factor, 1e-12);
}
/* HF: 0.1 * log(factor) + 1; original_max_position_embeddings from max_position_embeddings */
static void check_yarn_defaults(const tp_model_config *c) { check_yarn(c, 4, 512, 32, 1, 1, 0.1 * log(4.0) + 1); }
static void check_yarn_top_level_length(const tp_model_config *c) { check_yarn(c, 4, 128, 32, 1, 1, 0.1 * log(4.0) + 1); }
static void check_yarn_factor_from_lengths(const tp_model_config *c) { check_yarn(c, 4, 128, 32, 1, 1, 0.1 * log(4.0) + 1); }
static void check_yarn_mscale(const tp_model_config *c)
{
    check_yarn(c, 8, 512, 16, 2, 0, (0.1 * log(8.0) + 1) / (0.05 * log(8.0) + 1));
}
static void check_yarn_attention_factor(const tp_model_config *c) { check_yarn(c, 8, 512, 32, 1, 1, 1.5); }
static void check_rope_parameters(const tp_model_config *c)
{
    ck_assert_double_eq(c->rope_theta, 250000.0);
    ck_assert_int_eq(c->rope_scaling.type, TP_ROPE_LLAMA3);
    ck_assert_int_eq(c->rope_scaling.original_max_position, 8192);
}
static void check_defaults(const tp_model_config *c)
{
    ck_assert_double_eq(c->rms_norm_eps, 1e-6);
    ck_assert_double_eq(c->rope_theta, 10000.0);
    ck_assert_int_eq(c->torch_dtype, TP_DTYPE_F32);
    ck_assert_int_eq(c->tie_word_embeddings, 0);
    ck_assert_int_eq(c->bos_token_id, -1);
    ck_assert_int_eq(c->n_eos, 0);
}
static void check_minimal(const tp_model_config *c)
{
    check_defaults(c);
    ck_assert_int_eq(c->n_kv_heads, c->n_heads);
    ck_assert_int_eq(c->head_dim, 16);
    ck_assert_int_eq(c->rope_scaling.type, TP_ROPE_DEFAULT);
}
static void check_dtype_key(const tp_model_config *c)
{
    ck_assert_int_eq(c->torch_dtype, TP_DTYPE_F16);
}
static void check_eos_list(const tp_model_config *c)
{
    assert_eos(c->eos_token_ids, c->n_eos, (const int64_t[]){5, 7, 1023}, 3);
}
static void check_no_eos(const tp_model_config *c) { ck_assert_int_eq(c->n_eos, 0); }

#define LLAMA3_OK "\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4," \
                  "\"original_max_position_embeddings\":8192"

static const cfg_case cfg_cases[] = {
    /* C1: required keys */
    {llama_base, "hidden_size", NULL, NULL, TP_ERR_FORMAT, "missing required key hidden_size",
     NULL},
    {llama_base, "num_attention_heads", NULL, NULL, TP_ERR_FORMAT,
     "missing required key num_attention_heads", NULL},
    {llama_base, "num_hidden_layers", NULL, NULL, TP_ERR_FORMAT,
     "missing required key num_hidden_layers", NULL},
    {llama_base, "vocab_size", NULL, NULL, TP_ERR_FORMAT, "missing required key vocab_size",
     NULL},
    {llama_base, "intermediate_size", NULL, NULL, TP_ERR_FORMAT,
     "missing required key intermediate_size", NULL},
    {llama_base, "max_position_embeddings", NULL, NULL, TP_ERR_FORMAT,
     "missing required key max_position_embeddings", NULL},
    /* C2: head_dim derivation */
    {llama_base, NULL, "{\"hidden_size\":100}", NULL, TP_ERR_FORMAT,
     "hidden_size 100 is not divisible by num_attention_heads 8", NULL},
    {llama_base, NULL, "{\"hidden_size\":100,\"head_dim\":16}", NULL, TP_OK, NULL,
     check_head_dim_16},
    {llama_base, NULL, "{\"head_dim\":null}", NULL, TP_OK, NULL, check_head_dim_16},
    {llama_base, NULL, "{\"head_dim\":15}", NULL, TP_ERR_FORMAT, "head_dim 15 must be even",
     NULL},
    {llama_base, NULL, "{\"head_dim\":0}", NULL, TP_ERR_FORMAT,
     "head_dim must be an integer in [1, 1024], found the integer 0", NULL},
    {qwen3_base, "head_dim", NULL, NULL, TP_OK, NULL, check_qwen3_default_head_dim},
    /* C3: GQA shape */
    {llama_base, NULL, "{\"num_key_value_heads\":3}", NULL, TP_ERR_FORMAT,
     "num_attention_heads 8 is not divisible by num_key_value_heads 3", NULL},
    {llama_base, NULL, "{\"num_key_value_heads\":16}", NULL, TP_ERR_FORMAT,
     "num_key_value_heads 16 is more than num_attention_heads 8", NULL},
    {llama_base, NULL, "{\"num_key_value_heads\":0}", NULL, TP_ERR_FORMAT,
     "num_key_value_heads must be an integer in [1, 1024], found the integer 0", NULL},
    /* C5: zero, negative, huge */
    {llama_base, NULL, "{\"num_hidden_layers\":1000000000}", NULL, TP_ERR_FORMAT,
     "num_hidden_layers must be an integer in [1, 1024], found the integer 1000000000", NULL},
    {llama_base, NULL, "{\"vocab_size\":0}", NULL, TP_ERR_FORMAT,
     "vocab_size must be an integer in [1, 16777216], found the integer 0", NULL},
    {llama_base, NULL, "{\"hidden_size\":-128}", NULL, TP_ERR_FORMAT,
     "hidden_size must be an integer in [1, 16777216], found the integer -128", NULL},
    {llama_base, NULL, "{\"intermediate_size\":1099511627776}", NULL, TP_ERR_FORMAT,
     "intermediate_size must be an integer", NULL},
    {llama_base, NULL, "{\"num_attention_heads\":4096}", NULL, TP_ERR_FORMAT,
     "num_attention_heads must be an integer in [1, 1024]", NULL},
    {llama_base, NULL, "{\"max_position_embeddings\":0}", NULL, TP_ERR_FORMAT,
     "max_position_embeddings must be an integer in [1, 2147483647], found the integer 0", NULL},
    {llama_base, NULL, "{\"vocab_size\":9223372036854775807}", NULL, TP_ERR_FORMAT,
     "vocab_size must be an integer", NULL},
    /* C6: JSON types */
    {llama_base, NULL, "{\"hidden_size\":4096.0}", NULL, TP_ERR_FORMAT,
     "hidden_size must be an integer in [1, 16777216], found the real number 4096.0", NULL},
    {llama_base, NULL, "{\"hidden_size\":\"4096\"}", NULL, TP_ERR_FORMAT,
     "hidden_size must be an integer in [1, 16777216], found the string \"4096\"", NULL},
    {llama_base, NULL, "{\"hidden_size\":true}", NULL, TP_ERR_FORMAT,
     "hidden_size must be an integer in [1, 16777216], found true", NULL},
    {llama_base, NULL, "{\"hidden_size\":null}", NULL, TP_ERR_FORMAT,
     "hidden_size must be an integer in [1, 16777216], found null", NULL},
    {llama_base, NULL, "{\"num_hidden_layers\":[4]}", NULL, TP_ERR_FORMAT,
     "num_hidden_layers must be an integer in [1, 1024], found an array", NULL},
    {llama_base, NULL, "{\"num_key_value_heads\":2.5}", NULL, TP_ERR_FORMAT,
     "num_key_value_heads must be an integer in [1, 1024], found the real number 2.5", NULL},
    {llama_base, NULL, "{\"num_key_value_heads\":null}", NULL, TP_OK, NULL, NULL},
    {llama_base, NULL, "{\"tie_word_embeddings\":1}", NULL, TP_ERR_FORMAT,
     "tie_word_embeddings must be true or false, found the integer 1", NULL},
    {llama_base, NULL, "{\"tie_word_embeddings\":\"true\"}", NULL, TP_ERR_FORMAT,
     "tie_word_embeddings must be true or false, found the string \"true\"", NULL},
    {llama_base, NULL, "{\"attention_bias\":{}}", NULL, TP_ERR_FORMAT,
     "attention_bias must be true or false, found an object", NULL},
    {llama_base, NULL, "{\"eos_token_id\":\"2\"}", NULL, TP_ERR_FORMAT,
     "eos_token_id must be a token id in [0, 1024) or a list", NULL},
    {llama_base, NULL, "{\"eos_token_id\":[5,\"7\"]}", NULL, TP_ERR_FORMAT,
     "eos_token_id[1] must be a token id in [0, 1024)", NULL},
    {llama_base, NULL, "{\"eos_token_id\":1024}", NULL, TP_ERR_FORMAT,
     "eos_token_id must be a token id in [0, 1024) or a list of at most 16 of them, "
     "found the integer 1024", NULL},
    {llama_base, NULL, "{\"eos_token_id\":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}", NULL,
     TP_ERR_FORMAT, "eos_token_id lists 17 ids, more than the 16 supported", NULL},
    {llama_base, NULL, "{\"eos_token_id\":[5,7,1023]}", NULL, TP_OK, NULL, check_eos_list},
    {llama_base, NULL, "{\"eos_token_id\":null}", NULL, TP_OK, NULL, check_no_eos},
    {llama_base, NULL, "{\"bos_token_id\":-1}", NULL, TP_ERR_FORMAT,
     "bos_token_id must be a token id in [0, 1024), found the integer -1", NULL},
    {llama_base, NULL, "{\"bos_token_id\":[1]}", NULL, TP_ERR_FORMAT,
     "bos_token_id must be a token id in [0, 1024), found an array", NULL},
    /* C8: architectures */
    {llama_base, NULL, "{\"architectures\":[\"GPT2LMHeadModel\"]}", NULL, TP_ERR_UNSUPPORTED,
     "architectures[0] is the string \"GPT2LMHeadModel\", which tpinfer does not run "
     "(supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, "
     "GraniteForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration and Mistral3ForConditionalGeneration (their text models))",
     NULL},
    {llama_base, NULL, "{\"architectures\":[\"Qwen3MoeForCausalLM\"]}", NULL, TP_ERR_UNSUPPORTED,
     "Qwen3MoeForCausalLM", NULL},
    {llama_base, NULL, "{\"architectures\":[]}", NULL, TP_ERR_FORMAT,
     "architectures must be a non-empty list of architecture names, found an array", NULL},
    {llama_base, NULL, "{\"architectures\":\"LlamaForCausalLM\"}", NULL, TP_ERR_FORMAT,
     "architectures must be a non-empty list", NULL},
    {llama_base, "architectures", "{\"model_type\":\"gpt2\"}", NULL, TP_ERR_UNSUPPORTED,
     "model_type is the string \"gpt2\"", NULL},
    {qwen2_base, "architectures", NULL, NULL, TP_OK, NULL, check_qwen2},
    {qwen2_base, "model_type", "{\"architectures\":null}", NULL, TP_ERR_FORMAT,
     "neither architectures nor model_type", NULL},
    {llama_base, NULL, "{\"hidden_act\":\"gelu\"}", NULL, TP_ERR_UNSUPPORTED,
     "hidden_act is the string \"gelu\" (supported: silu)", NULL},
    /* C9: rope, norm, positions */
    {llama_base, NULL, "{\"rope_theta\":0}", NULL, TP_ERR_FORMAT,
     "rope_theta must be a finite number > 0, found the integer 0", NULL},
    {llama_base, NULL, "{\"rope_theta\":-10000.0}", NULL, TP_ERR_FORMAT,
     "rope_theta must be a finite number > 0, found the real number -10000.0", NULL},
    {llama_base, NULL, "{\"rope_theta\":\"10000\"}", NULL, TP_ERR_FORMAT,
     "rope_theta must be a finite number > 0, found the string", NULL},
    {llama_base, NULL, "{\"rms_norm_eps\":-1e-5}", NULL, TP_ERR_FORMAT,
     "rms_norm_eps must be a finite number > 0, found the real number -1", NULL},
    {llama_base, NULL, "{\"rms_norm_eps\":0.0}", NULL, TP_ERR_FORMAT,
     "rms_norm_eps must be a finite number > 0", NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"LlamaForCausalLM\"],\"rms_norm_eps\":NaN}",
     TP_ERR_FORMAT, "invalid JSON", NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"LlamaForCausalLM\"],\"rms_norm_eps\":1e400}",
     TP_ERR_FORMAT, "invalid JSON at line 1", NULL},
    /* YaRN: HF's defaults, the pretraining length's three sources, the attention factor's three */
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}", NULL, TP_OK, NULL,
     check_yarn_defaults},
    {llama_base, NULL,
     "{\"original_max_position_embeddings\":128,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,"
     "\"original_max_position_embeddings\":256}}", NULL, TP_OK, NULL, check_yarn_top_level_length},
    {llama_base, NULL,
     "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":null,\"original_max_position_embeddings\":128}}",
     NULL, TP_OK, NULL, check_yarn_factor_from_lengths},
    {llama_base, NULL,
     "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8,\"mscale\":1,\"mscale_all_dim\":0.5,"
     "\"beta_fast\":16,\"beta_slow\":2,\"truncate\":false}}", NULL, TP_OK, NULL, check_yarn_mscale},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8,\"attention_factor\":1.5,"
     "\"beta_fast\":0,\"beta_slow\":null}}", NULL, TP_OK, NULL, check_yarn_attention_factor},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"yarn\"}}", NULL, TP_ERR_FORMAT,
     "missing required key rope_scaling.factor", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,\"truncate\":\"no\"}}", NULL,
     TP_ERR_FORMAT, "rope_scaling.truncate must be true or false, found the string \"no\"", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,\"beta_fast\":-1}}", NULL,
     TP_ERR_FORMAT, "rope_scaling.beta_fast must be a finite number >= 0, found the integer -1", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,\"attention_factor\":0}}",
     NULL, TP_ERR_FORMAT, "rope_scaling.attention_factor must be a finite number > 0, found the integer 0", NULL},
    {llama_base, NULL,
     "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":0}}",
     NULL, TP_ERR_FORMAT, "rope_scaling.original_max_position_embeddings must be an integer in [1, ", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2.0}}", NULL,
     TP_ERR_UNSUPPORTED, "rope_scaling type 'dynamic' is not supported", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"longrope\"}}", NULL,
     TP_ERR_UNSUPPORTED, "rope_scaling type 'longrope' is not supported", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"factor\":2.0}}", NULL, TP_ERR_FORMAT,
     "rope_scaling has no rope_type", NULL},
    {llama_base, NULL, "{\"rope_scaling\":\"linear\"}", NULL, TP_ERR_FORMAT,
     "rope_scaling must be an object or null, found the string \"linear\"", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":7}}", NULL, TP_ERR_FORMAT,
     "rope_scaling.rope_type must be a string, found the integer 7", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"linear\"}}", NULL, TP_ERR_FORMAT,
     "missing required key rope_scaling.factor", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":0}}", NULL,
     TP_ERR_FORMAT, "rope_scaling.factor must be a finite number > 0, found the integer 0", NULL},
    {llama_base, NULL, "{\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}", NULL, TP_OK, NULL,
     check_linear},
    {llama_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"default\"}}", NULL, TP_OK, NULL, NULL},
    {llama_base, NULL,
     "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"high_freq_factor\":4,"
     "\"original_max_position_embeddings\":8192}}", NULL, TP_ERR_FORMAT,
     "missing required key rope_scaling.low_freq_factor", NULL},
    {llama_base, NULL,
     "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,"
     "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192}}", NULL, TP_ERR_FORMAT,
     "rope_scaling.high_freq_factor 4 must be greater than low_freq_factor 4", NULL},
    {llama_base, NULL,
     "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
     "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192.0}}", NULL,
     TP_ERR_FORMAT, "rope_scaling.original_max_position_embeddings must be an integer in "
     "[1, 2147483647], found the real number 8192.0", NULL},
    {llama_base, NULL,
     "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
     "\"high_freq_factor\":4,\"original_max_position_embeddings\":0}}", NULL, TP_ERR_FORMAT,
     "original_max_position_embeddings must be an integer in [1, 2147483647], "
     "found the integer 0", NULL},
    {llama_base, "rope_theta",
     "{\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":250000.0," LLAMA3_OK "}}",
     NULL, TP_OK, NULL, check_rope_parameters},
    {llama_base, NULL, "{\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000.0}}",
     NULL, TP_ERR_FORMAT, "rope_theta 500000 and rope_parameters.rope_theta 10000 disagree",
     NULL},
    {llama_base, NULL, "{\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4}}", NULL, TP_OK, NULL,
     check_yarn_defaults},
    {llama_base, NULL, "{\"rope_parameters\":{\"rope_type\":\"longrope\",\"factor\":4}}", NULL,
     TP_ERR_UNSUPPORTED,
     "rope_parameters type 'longrope' is not supported (supported: linear, llama3, yarn)", NULL},
    {llama_base, NULL, "{\"rope_parameters\":[1]}", NULL, TP_ERR_FORMAT,
     "rope_parameters must be an object or null, found an array", NULL},
    /* sliding windows: Mistral's on every layer; Qwen's only with use_sliding_window, from
     * max_window_layers on or where layer_types says; none as wide as the context */
    {qwen2_base, NULL, NULL, NULL, TP_OK, NULL, check_no_window},
    {qwen2_base, NULL, "{\"use_sliding_window\":true,\"max_window_layers\":0}", NULL, TP_OK, NULL,
     check_window_all},
    {qwen2_base, NULL, "{\"use_sliding_window\":true,\"max_window_layers\":1}", NULL, TP_OK, NULL,
     check_window_12},
    {qwen2_base, NULL, "{\"use_sliding_window\":true,\"max_window_layers\":3}", NULL, TP_OK, NULL,
     check_no_window},
    {qwen2_base, "max_window_layers", "{\"use_sliding_window\":true}", NULL, TP_OK, NULL, check_no_window},
    {qwen2_base, NULL,
     "{\"use_sliding_window\":true,\"max_window_layers\":0,\"max_position_embeddings\":4096}",
     NULL, TP_OK, NULL, check_no_window},
    {qwen2_base, NULL,
     "{\"use_sliding_window\":true,\"max_window_layers\":0,\"sliding_window\":null}",
     NULL, TP_OK, NULL, check_no_window},
    {qwen2_base, NULL,
     "{\"use_sliding_window\":true,\"layer_types\":[\"full_attention\",\"full_attention\","
     "\"sliding_attention\"]}", NULL, TP_OK, NULL, check_window_2},
    {qwen2_base, NULL,
     "{\"use_sliding_window\":true,\"sliding_window\":8,\"max_window_layers\":1,\"layer_types\":"
     "[\"sliding_attention\",\"full_attention\",\"sliding_attention\"]}", NULL, TP_OK, NULL,
     check_window_8_02},
    {qwen2_base, NULL,
     "{\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"sliding_attention\"]}",
     NULL, TP_OK, NULL, check_no_window},
    {qwen2_base, NULL, "{\"use_sliding_window\":true,\"max_window_layers\":0,\"sliding_window\":0}", NULL,
     TP_ERR_FORMAT, "sliding_window must be a positive integer or null, found 0", NULL},
    {qwen3_base, NULL, "{\"use_sliding_window\":true,\"sliding_window\":512,\"max_window_layers\":1}",
     NULL, TP_OK, NULL, check_window_512_12},
    {llama_base, NULL, "{\"sliding_window\":4096}", NULL, TP_OK, NULL, check_no_window},
    {qwen2_base, NULL, "{\"layer_types\":[\"full_attention\"]}", NULL, TP_ERR_FORMAT,
     "layer_types must be a list of 3", NULL},
    {qwen2_base, NULL, "{\"layer_types\":[\"full_attention\",\"local\",\"full_attention\"]}", NULL, TP_ERR_FORMAT,
     "layer_types[1] must be \"full_attention\" or \"sliding_attention\", found the string \"local\"", NULL},
    {qwen2_base, NULL, "{\"layer_types\":[\"full_attention\",\"full_attention\",null]}", NULL, TP_ERR_FORMAT,
     "layer_types[2] must be \"full_attention\" or \"sliding_attention\", found null", NULL},
    {llama_base, NULL, "{\"hidden_size\":8192,\"num_attention_heads\":4,\"num_key_value_heads\":2}", NULL,
     TP_ERR_FORMAT, "head_dim hidden_size / num_attention_heads = 2048 is more than the 1024 supported", NULL},
    {qwen2_base, NULL, "{\"use_sliding_window\":\"false\"}", NULL, TP_ERR_FORMAT,
     "use_sliding_window must be true or false, found the string \"false\"", NULL},
    {qwen2_base, NULL, "{\"sliding_window\":\"4096\"}", NULL, TP_ERR_FORMAT,
     "sliding_window must be an integer", NULL},
    {qwen2_base, NULL, "{\"attention_bias\":false}", NULL, TP_OK, NULL, check_qwen2},
    {mistral_base, NULL, "{\"sliding_window\":4096}", NULL, TP_OK, NULL, check_window_all},
    {mistral_base, NULL, "{\"sliding_window\":32768}", NULL, TP_OK, NULL, check_no_window},
    {mistral_base, NULL, "{\"sliding_window\":null}", NULL, TP_OK, NULL, check_no_window},
    {mistral_base, NULL, "{\"sliding_window\":0}", NULL, TP_ERR_FORMAT,
     "sliding_window must be a positive integer or null, found 0", NULL},
    {mistral_base, NULL, "{\"sliding_window\":-1}", NULL, TP_ERR_FORMAT,
     "sliding_window must be an integer in [0, ", NULL},
    {qwen2_base, NULL, "{\"use_sliding_window\":true,\"max_window_layers\":-1}", NULL, TP_ERR_FORMAT,
     "max_window_layers must be an integer in [0, ", NULL},
    {mistral_base, NULL, NULL, NULL, TP_OK, NULL, check_defaults},
    /* Phi-3 (Phi3ForCausalLM): Mistral's rule for the window; a scaled rope is longrope to HF */
    {phi3_base, NULL, NULL, NULL, TP_OK, NULL, check_phi3},
    {phi3_base, "architectures", NULL, NULL, TP_OK, NULL, check_phi3},
    {phi3_base, NULL, "{\"sliding_window\":null}", NULL, TP_OK, NULL, check_phi3_no_window},
    {phi3_base, NULL, "{\"attention_bias\":true,\"mlp_bias\":true}", NULL, TP_OK, NULL, check_phi3},
    {phi3_base, NULL,
     "{\"rope_scaling\":{\"type\":\"su\",\"short_factor\":[1,1,1,1,1,1,1,1],\"long_factor\":[1,1,1,1,1,1,1,1]}}",
     NULL, TP_ERR_UNSUPPORTED, "rope_scaling type 'su' is not supported for Phi3ForCausalLM (Hugging Face runs it "
     "as longrope", NULL},
    {phi3_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", NULL, TP_ERR_UNSUPPORTED,
     "rope_scaling type 'yarn' is not supported for Phi3ForCausalLM", NULL},
    {phi3_base, NULL, "{\"rope_scaling\":{\"rope_type\":\"default\"}}", NULL, TP_OK, NULL, check_phi3},
    /* partial_rotary_factor (Phi-4-mini's 0.75), at the top or in rope_parameters */
    {phi3_base, NULL, "{\"partial_rotary_factor\":0.75}", NULL, TP_ERR_UNSUPPORTED,
     "partial_rotary_factor 0.75 is not supported (tpinfer rotates every dimension of a head: 1.0)", NULL},
    {phi3_base, NULL, "{\"partial_rotary_factor\":1.0}", NULL, TP_OK, NULL, check_phi3},
    {llama_base, NULL, "{\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.5}}", NULL,
     TP_ERR_UNSUPPORTED, "partial_rotary_factor 0.5 is not supported", NULL},
    {llama_base, NULL, "{\"partial_rotary_factor\":\"half\"}", NULL, TP_ERR_FORMAT,
     "partial_rotary_factor must be a finite number > 0, found the string \"half\"", NULL},
    /* Granite (GraniteForCausalLM): four multipliers, Llama's biases */
    {llama_base, NULL,
     "{\"architectures\":[\"GraniteForCausalLM\"],\"embedding_multiplier\":12,\"residual_multiplier\":0.22,"
     "\"attention_multiplier\":0.0078125,\"logits_scaling\":16}", NULL, TP_OK, NULL, check_granite3},
    {llama_base, NULL, "{\"architectures\":[\"GraniteForCausalLM\"]}", NULL, TP_OK, NULL, check_granite_defaults},
    {llama_base, "architectures", "{\"model_type\":\"granite\"}", NULL, TP_OK, NULL, check_granite_defaults},
    {llama_base, NULL, "{\"embedding_multiplier\":12,\"attention_multiplier\":0.5}", NULL, TP_OK, NULL,
     check_llama_ignores_multipliers},
    {llama_base, NULL, "{\"architectures\":[\"GraniteForCausalLM\"],\"residual_multiplier\":0}", NULL, TP_ERR_FORMAT,
     "residual_multiplier must be a finite number > 0, found the integer 0", NULL},
    {llama_base, NULL, "{\"architectures\":[\"GraniteForCausalLM\"],\"logits_scaling\":\"16\"}", NULL,
     TP_ERR_FORMAT, "logits_scaling must be a finite number > 0, found the string \"16\"", NULL},
    {llama_base, NULL, "{\"architectures\":[\"GraniteForCausalLM\"],\"attention_bias\":true,\"mlp_bias\":true}",
     NULL, TP_OK, NULL, check_llama_biases},
    /* Gemma 3 (Gemma3ForCausalLM) */
    {gemma3_base, NULL, NULL, NULL, TP_OK, NULL, check_gemma3},
    {gemma3_base, "architectures", NULL, NULL, TP_OK, NULL, check_gemma3},
    {gemma3_base, "rope_theta",
     "{\"rope_local_base_freq\":null,\"sliding_window_pattern\":null,\"layer_types\":[\"sliding_attention\","
     "\"full_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\","
     "\"sliding_attention\"],\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\",\"factor\":8.0,"
     "\"rope_theta\":500000},\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":20000}}}",
     NULL, TP_OK, NULL, check_gemma3_rope_parameters},
    {gemma3_base, NULL, "{\"sliding_window\":null}", NULL, TP_OK, NULL, check_gemma3_no_window},
    {NULL, NULL, NULL,
     "{\"architectures\":[\"Gemma3ForCausalLM\"],\"hidden_size\":1152,\"intermediate_size\":6912,"
     "\"num_hidden_layers\":7,\"num_attention_heads\":4,\"num_key_value_heads\":1,\"vocab_size\":262144,"
     "\"max_position_embeddings\":32768}", TP_OK, NULL, check_gemma3_defaults},
    {gemma3_base, NULL, "{\"attn_logit_softcapping\":50.0,\"final_logit_softcapping\":30.0}", NULL, TP_OK, NULL,
     check_gemma3_caps},
    {gemma3_base, NULL, "{\"final_logit_softcapping\":-1}", NULL, TP_ERR_FORMAT,
     "final_logit_softcapping must be a finite number > 0", NULL},
    /* Gemma 3's text model in Gemma3ForConditionalGeneration (the Hub's 4B, 12B, 27B) */
    {NULL, NULL, NULL, GEMMA3_4B, TP_OK, NULL, check_gemma3_4b},
    {NULL, NULL, NULL,
     "{\"model_type\":\"gemma3\",\"torch_dtype\":\"bfloat16\",\"eos_token_id\":[1,106],\"tie_word_embeddings\":true,"
     "\"text_config\":{\"torch_dtype\":\"float32\",\"eos_token_id\":7,\"tie_word_embeddings\":false}}", TP_OK, NULL,
     check_gemma3_mm_own},
    /* quantized checkpoints: refused naming the method (at the top level or in a text_config) */
    {llama_base, NULL, "{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":128}}", NULL,
     TP_ERR_UNSUPPORTED, "quantization_config (quant_method \"awq\"): the checkpoint is quantized, and tpinfer runs "
     "float32, float16 and bfloat16 weights only; give the unquantized model", NULL},
    {llama_base, NULL, "{\"compression_config\":{\"format\":\"float-quantized\"}}", NULL, TP_ERR_UNSUPPORTED,
     "config.json: compression_config: the checkpoint is quantized", NULL},
    {llama_base, NULL, "{\"quantization_config\":null}", NULL, TP_OK, NULL, NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"Mistral3ForConditionalGeneration\"],\"text_config\":{\"quantization_config\":"
     "{\"quant_method\":\"fp8\"}}}", TP_ERR_UNSUPPORTED, "quantization_config (quant_method \"fp8\")", NULL},
    /* Mistral 3's (Mistral Small 3.1 and 3.2) */
    {NULL, NULL, NULL, MISTRAL_SMALL_31, TP_OK, NULL, check_mistral3},
    {NULL, NULL, NULL,
     "{\"model_type\":\"mistral3\",\"text_config\":{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":"
     "128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,\"max_position_embeddings\":64}}",
     TP_OK, NULL, check_mistral3_llama},
    {NULL, NULL, NULL,
     "{\"model_type\":\"mistral3\",\"tie_word_embeddings\":true,\"text_config\":{\"hidden_size\":64,\"intermediate_size\":"
     "128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,\"max_position_embeddings\":64}}",
     TP_OK, NULL, check_mistral3_untied},
    {NULL, NULL, NULL, "{\"model_type\":\"gemma3\",\"tie_word_embeddings\":false,\"text_config\":{}}", TP_OK, NULL,
     check_gemma3_mm_tied},
    {NULL, NULL, NULL, "{\"architectures\":[\"Mistral3ForConditionalGeneration\"],\"text_config\":{\"model_type\":"
     "\"llama4_text\"}}", TP_ERR_UNSUPPORTED, "text_config.model_type is \"llama4_text\", which tpinfer does not run as "
     "Mistral3ForConditionalGeneration's text model (supported: llama, mistral, qwen2, qwen3, phi3, granite, gemma, "
     "gemma2, gemma3_text)", NULL},
    {NULL, NULL, NULL, "{\"model_type\":\"mistral3\",\"text_config\":{\"model_type\":5}}", TP_ERR_FORMAT,
     "text_config.model_type must be", NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"model_type\":\"gemma3\"}",
     TP_ERR_FORMAT, "Gemma3ForConditionalGeneration has no text_config object (found nothing): the text model's config "
     "goes there", NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"text_config\":[1]}",
     TP_ERR_FORMAT, "has no text_config object (found an array)", NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"text_config\":{\"head_dim\":7}}",
     TP_ERR_FORMAT, "head_dim 7 must be even", NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"LlavaForConditionalGeneration\"],\"text_config\":{}}",
     TP_ERR_UNSUPPORTED, "Mistral3ForConditionalGeneration (their text models))", NULL},
    /* Gemma 1 (GemmaForCausalLM): its config's hidden_act, "gelu" meaning the tanh form */
    {gemma3_base, "model_type", "{\"architectures\":[\"GemmaForCausalLM\"],\"hidden_act\":\"gelu\",\"num_hidden_layers\":3}",
     NULL, TP_OK, NULL, check_gemma1},
    {gemma3_base, "architectures", "{\"model_type\":\"gemma\",\"hidden_act\":\"gelu_pytorch_tanh\",\"num_hidden_layers\":3}",
     NULL, TP_OK, NULL, check_gemma1},
    {gemma3_base, "model_type", "{\"architectures\":[\"GemmaForCausalLM\"],\"hidden_act\":\"relu\"}", NULL,
     TP_ERR_UNSUPPORTED, "hidden_act is the string \"relu\" (supported: gelu_pytorch_tanh)", NULL},
    /* Gemma 2 (Gemma2ForCausalLM): no q/k norms, every other layer sliding (Gemma2Config reads
     * no sliding_window_pattern), one rope base, soft-capping 50 and 30 by default, none where null */
    {gemma3_base, "rope_local_base_freq",
     "{\"architectures\":[\"Gemma2ForCausalLM\"],\"model_type\":\"gemma2\",\"sliding_window_pattern\":6,"
     "\"attn_logit_softcapping\":null,\"final_logit_softcapping\":null,\"rope_theta\":10000}", NULL, TP_OK, NULL,
     check_gemma2_no_caps},
    {gemma3_base, "attn_logit_softcapping",
     "{\"architectures\":[\"Gemma2ForCausalLM\"],\"sliding_window_pattern\":null,\"final_logit_softcapping\":null,"
     "\"rope_theta\":10000}", NULL, TP_OK, NULL, check_gemma2_default_attn_cap},
    {gemma3_base, NULL, "{\"use_bidirectional_attention\":true}", NULL, TP_ERR_UNSUPPORTED,
     "use_bidirectional_attention is true", NULL},
    {gemma3_base, NULL, "{\"hidden_activation\":\"gelu\"}", NULL, TP_ERR_UNSUPPORTED,
     "hidden_activation is the string \"gelu\" (supported: gelu_pytorch_tanh)", NULL},
    {gemma3_base, NULL, "{\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"linear\",\"factor\":2}}}",
     NULL, TP_ERR_UNSUPPORTED, "rope_parameters.sliding_attention.rope_type is 'linear'", NULL},
    {gemma3_base, NULL, "{\"rope_parameters\":{\"full_attention\":5}}", NULL, TP_ERR_FORMAT,
     "rope_parameters must be {\"full_attention\": {...}, \"sliding_attention\": {...}}", NULL},
    {gemma3_base, NULL, "{\"rope_parameters\":[1]}", NULL, TP_ERR_FORMAT, "rope_parameters must be an object or null",
     NULL},
    {gemma3_base, NULL, "{\"query_pre_attn_scalar\":0}", NULL, TP_ERR_FORMAT,
     "query_pre_attn_scalar must be a finite number > 0", NULL},
    {gemma3_base, NULL, "{\"sliding_window_pattern\":0}", NULL, TP_ERR_FORMAT, "sliding_window_pattern", NULL},
    /* biases */
    {llama_base, NULL, "{\"attention_bias\":true,\"mlp_bias\":true}", NULL, TP_OK, NULL,
     check_llama_biases},
    {qwen3_base, NULL, "{\"attention_bias\":true,\"mlp_bias\":true}", NULL, TP_OK, NULL,
     check_qwen3_biases},
    /* C10: dtype */
    {llama_base, NULL, "{\"torch_dtype\":\"float64\"}", NULL, TP_ERR_UNSUPPORTED,
     "torch_dtype is the string \"float64\" (supported: float32, float16, bfloat16)", NULL},
    {llama_base, NULL, "{\"torch_dtype\":\"fp8\"}", NULL, TP_ERR_UNSUPPORTED,
     "torch_dtype is the string \"fp8\"", NULL},
    {llama_base, NULL, "{\"torch_dtype\":16}", NULL, TP_ERR_FORMAT,
     "torch_dtype must be a string, found the integer 16", NULL},
    {llama_base, "torch_dtype", "{\"dtype\":\"float16\"}", NULL, TP_OK, NULL, check_dtype_key},
    {llama_base, NULL, "{\"dtype\":\"float16\"}", NULL, TP_ERR_FORMAT,
     "torch_dtype \"bfloat16\" and dtype \"float16\" disagree", NULL},
    {llama_base, NULL,
     "{\"torch_dtype\":\"\\u0001\\u0002xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "xxxxxxxxxxxxxxxxxxx\"}", NULL, TP_ERR_UNSUPPORTED, "torch_dtype is the string \"??xxxxx",
     NULL},
    /* C11 and syntax */
    {NULL, NULL, NULL,
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"hidden_size\":128}",
     TP_ERR_FORMAT, "duplicate key", NULL},
    {NULL, NULL, NULL,
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"hidden_size\":64}",
     TP_ERR_FORMAT, "\"hidden_size\"", NULL},
    {NULL, NULL, NULL,
     "{\"rope_scaling\":{\"factor\":1,\"factor\":2},\"architectures\":[\"LlamaForCausalLM\"]}",
     TP_ERR_FORMAT, "duplicate key", NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"LlamaForCausalLM\"],}", TP_ERR_FORMAT,
     "invalid JSON at line 1", NULL},
    {NULL, NULL, NULL, "[{\"architectures\":[\"LlamaForCausalLM\"]}]", TP_ERR_FORMAT,
     "the top level must be a JSON object, found an array", NULL},
    {NULL, NULL, NULL, "42", TP_ERR_FORMAT,
     "the top level must be a JSON object, found the integer 42", NULL},
    {NULL, NULL, NULL, "", TP_ERR_FORMAT, "invalid JSON", NULL},
    {NULL, NULL, NULL, "{\"architectures\":[\"LlamaForCausalLM\"]", TP_ERR_FORMAT, "invalid JSON",
     NULL},
    {NULL, NULL, NULL, "{} trailing", TP_ERR_FORMAT, "invalid JSON", NULL},
    /* every default */
    {NULL, NULL, NULL,
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":32,"
     "\"max_position_embeddings\":64}", TP_OK, NULL, check_minimal},
};

/* The case's text: raw, or the base with its key deleted and its members set. */
static char *case_text(const cfg_case *c)
{
    if (c->raw) return strdup(c->raw);
    json_error_t err;
    json_t *root = json_loads(c->base, 0, &err);
    ck_assert_msg(root != NULL, "base config: %s", err.text);
    if (c->del) json_object_del(root, c->del);
    if (c->set) {
        json_t *set = json_loads(c->set, 0, &err);
        ck_assert_msg(set != NULL, "case set text: %s", err.text);
        json_object_update(root, set);
        json_decref(set);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(root);
    return text;
}

START_TEST(malformed_config)
{
    const cfg_case *c = &cfg_cases[_i];
    char *text = case_text(c);
    tp_model_config cfg, before;
    memset(&cfg, 0xab, sizeof cfg);
    memcpy(&before, &cfg, sizeof cfg);
    tp_error_clear();
    tp_status st = tp_model_config_parse(text, strlen(text), WHAT, &cfg);
    ck_assert_msg(st == c->st, "case %d (%s): status %s, want %s; message: %s", _i, text,
                  tp_status_str(st), tp_status_str(c->st), tp_error_message());
    if (st != TP_OK) {
        ck_assert_msg(strstr(tp_error_message(), WHAT) != NULL, "case %d: no file name in: %s",
                      _i, tp_error_message());
        ck_assert_msg(strstr(tp_error_message(), c->msg) != NULL,
                      "case %d: message \"%s\" lacks \"%s\"", _i, tp_error_message(), c->msg);
        /* a failed parse leaves the output untouched */
        ck_assert(memcmp(&cfg, &before, sizeof cfg) == 0);
    } else if (c->check) {
        c->check(&cfg);
    }
    free(text);
}
END_TEST

/* YaRN's frequencies against transformers 5.25's rotary_emb.inv_freq for the config of
 * tests/data/variants/mistral-yarn8-mscale (head_dim 16, rope_theta 1e6, factor 8 over 128
 * positions, beta_fast 16, beta_slow 2, the range not rounded): the dims below the ramp keep
 * their frequency, those past it are divided by 8, the one inside blends */
START_TEST(yarn_inv_freq)
{
    static const float hf[8] = {1.0f, 0.06668107211589813f, 0.0039528473280370235f, 0.0007029266562312841f,
                                0.0001250000059371814f, 2.2228492525755428e-05f, 3.9528467823402025e-06f,
                                7.029266839708725e-07f};
    static const char cfg_text[] =
        "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":128,\"intermediate_size\":384,"
        "\"num_hidden_layers\":3,\"num_attention_heads\":8,\"num_key_value_heads\":4,\"head_dim\":16,"
        "\"vocab_size\":512,\"max_position_embeddings\":1024,\"rope_theta\":1000000.0,"
        "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8.0,\"original_max_position_embeddings\":128,"
        "\"beta_fast\":16,\"beta_slow\":2,\"mscale\":1.0,\"mscale_all_dim\":0.5,\"truncate\":false}}";
    tp_model_config c;
    ck_assert_int_eq(tp_model_config_parse(cfg_text, strlen(cfg_text), "config.json", &c), TP_OK);
    float inv[8];
    tp_rope_inv_freq(&c, inv);
    for (int j = 0; j < 8; j++)
        ck_assert_msg(fabsf(inv[j] - hf[j]) <= 2e-7f * hf[j], "inv_freq[%d] %.9g, HF %.9g", j, inv[j], hf[j]);
    ck_assert_double_eq_tol(c.rope_scaling.attention_factor, 1.094179988101349, 1e-12);
}
END_TEST

START_TEST(long_string_is_capped)
{
    char text[8192];
    char big[4000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    snprintf(text, sizeof text, "{\"architectures\":[\"%s\"]}", big);
    tp_model_config cfg;
    tp_error_clear();
    ck_assert_int_eq(tp_model_config_parse(text, strlen(text), WHAT, &cfg), TP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "xxx...\""));
    ck_assert_int_lt(strlen(tp_error_message()), 400);
}
END_TEST

START_TEST(config_file_errors)
{
    tp_model_config cfg;
    tp_error_clear();
    ck_assert_int_eq(tp_model_config_load("/nonexistent-tpinfer-model", &cfg), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "--model /nonexistent-tpinfer-model: No such file or directory"));
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "give a Hugging Face model directory"));

    char dir[] = "/tmp/check_model_config.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char *path = tp_path_join(dir, "config.json");
    /* --model naming a file, and a directory without config.json */
    FILE *f0 = fopen(path, "w");
    ck_assert_ptr_nonnull(f0);
    fclose(f0);
    tp_error_clear();
    ck_assert_int_eq(tp_model_config_load(path, &cfg), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "config.json is not a directory (give a Hugging Face model"));
    unlink(path);
    tp_error_clear();
    ck_assert_int_eq(tp_model_config_load(dir, &cfg), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), dir));
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "has no config.json: give the directory of a Hugging Face model"));
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096.0}", f);
    fclose(f);
    tp_error_clear();
    ck_assert_int_eq(tp_model_config_load(dir, &cfg), TP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), path)); /* the real path */
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "hidden_size"));
    unlink(path);
    free(path);
    rmdir(dir);
}
END_TEST

// ----------------------------------------------------------------------------
// generation_config.json

typedef struct gen_case {
    const char *text;
    tp_status st;
    const char *msg;
} gen_case;

static const gen_case gen_cases[] = {
    {"{\"eos_token_id\":\"2\"}", TP_ERR_FORMAT, "eos_token_id must be a token id"},
    {"{\"eos_token_id\":[1,2.0]}", TP_ERR_FORMAT,
     "eos_token_id[1] must be a token id in [0, 2147483647), found the real number 2.0"},
    {"{\"eos_token_id\":[-1]}", TP_ERR_FORMAT, "eos_token_id[0] must be a token id"},
    {"{\"bos_token_id\":true}", TP_ERR_FORMAT,
     "bos_token_id must be a token id in [0, 2147483647), found true"},
    {"{\"do_sample\":\"false\"}", TP_ERR_FORMAT,
     "do_sample must be true or false, found the string \"false\""},
    {"{\"do_sample\":0}", TP_ERR_FORMAT, "do_sample must be true or false, found the integer 0"},
    {"{\"temperature\":-1}", TP_ERR_FORMAT,
     "temperature must be a finite number >= 0, found the integer -1"},
    {"{\"temperature\":\"0.7\"}", TP_ERR_FORMAT,
     "temperature must be a finite number >= 0, found the string \"0.7\""},
    {"{\"top_p\":1.5}", TP_ERR_FORMAT,
     "top_p must be a number in [0, 1], found the real number 1.5"},
    {"{\"top_k\":-1}", TP_ERR_FORMAT,
     "top_k must be an integer in [0, 2147483647], found the integer -1"},
    {"{\"top_k\":5.0}", TP_ERR_FORMAT,
     "top_k must be an integer in [0, 2147483647], found the real number 5.0"},
    {"{\"repetition_penalty\":0}", TP_ERR_FORMAT,
     "repetition_penalty must be a finite number > 0"},
    {"{\"max_new_tokens\":0}", TP_ERR_FORMAT,
     "max_new_tokens must be an integer in [1, 2147483647], found the integer 0"},
    {"{\"max_new_tokens\":100000000000000000000}", TP_ERR_FORMAT, "invalid JSON"},
    {"{\"do_sample\":true,\"do_sample\":false}", TP_ERR_FORMAT, "duplicate key"},
    {"[]", TP_ERR_FORMAT, "the top level must be a JSON object, found an array"},
    {"{\"pad_token_id\":\"x\",\"max_length\":20,\"transformers_version\":\"5.17.0\",\"whatever"
     "\":{}}", TP_OK, NULL},
    {"{\"eos_token_id\":null,\"temperature\":null}", TP_OK, NULL},
};

START_TEST(malformed_generation_config)
{
    const gen_case *c = &gen_cases[_i];
    tp_generation_config g;
    tp_error_clear();
    tp_status st = tp_generation_config_parse(c->text, strlen(c->text), GEN_WHAT, &g);
    ck_assert_msg(st == c->st, "case %d (%s): status %s, want %s; message: %s", _i, c->text,
                  tp_status_str(st), tp_status_str(c->st), tp_error_message());
    if (st != TP_OK) {
        ck_assert_ptr_nonnull(strstr(tp_error_message(), GEN_WHAT));
        ck_assert_msg(strstr(tp_error_message(), c->msg) != NULL,
                      "case %d: message \"%s\" lacks \"%s\"", _i, tp_error_message(), c->msg);
    } else {
        ck_assert_int_eq(g.n_eos, 0);
        ck_assert(g.temperature < 0);
    }
}
END_TEST

START_TEST(generation_config_values)
{
    const char *t = "{\"bos_token_id\":1,\"eos_token_id\":[2,3],\"do_sample\":true,"
                    "\"temperature\":0.7,\"top_p\":0.9,\"top_k\":40,"
                    "\"repetition_penalty\":1.1,\"max_new_tokens\":256}";
    tp_generation_config g;
    tp_error_clear();
    ck_assert_int_eq(tp_generation_config_parse(t, strlen(t), GEN_WHAT, &g), TP_OK);
    ck_assert_int_eq(g.bos_token_id, 1);
    assert_eos(g.eos_token_ids, g.n_eos, (const int64_t[]){2, 3}, 2);
    ck_assert_int_eq(g.do_sample, 1);
    ck_assert_double_eq(g.temperature, 0.7);
    ck_assert_double_eq(g.top_p, 0.9);
    ck_assert_int_eq(g.top_k, 40);
    ck_assert_double_eq(g.repetition_penalty, 1.1);
    ck_assert_int_eq(g.max_new_tokens, 256);

    t = "{\"eos_token_id\":7}";
    ck_assert_int_eq(tp_generation_config_parse(t, strlen(t), GEN_WHAT, &g), TP_OK);
    assert_eos(g.eos_token_ids, g.n_eos, (const int64_t[]){7}, 1);
    ck_assert_int_eq(g.bos_token_id, -1);
    ck_assert_int_eq(g.do_sample, -1);
    ck_assert(g.top_p < 0 && g.top_k < 0 && g.repetition_penalty < 0 && g.max_new_tokens < 0);

    /* ids are checked against the model's vocabulary separately */
    tp_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = 8;
    ck_assert_int_eq(tp_generation_config_check(&g, &cfg, GEN_WHAT), TP_OK);
    cfg.vocab_size = 7;
    ck_assert_int_eq(tp_generation_config_check(&g, &cfg, GEN_WHAT), TP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "eos_token_id 7 is not below vocab_size 7"));
    g.bos_token_id = 7;
    cfg.vocab_size = 8;
    ck_assert_int_eq(tp_generation_config_check(&g, &cfg, GEN_WHAT), TP_OK);
    cfg.vocab_size = 7;
    g.n_eos = 0;
    tp_error_clear();
    ck_assert_int_eq(tp_generation_config_check(&g, &cfg, GEN_WHAT), TP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "bos_token_id 7 is not below vocab_size 7"));
}
END_TEST

START_TEST(generation_config_files)
{
    char dir[] = "/tmp/check_model_config.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    tp_generation_config g;
    memset(&g, 0x5a, sizeof g);
    /* missing: every field absent, and no error recorded */
    tp_error_clear();
    ck_assert_int_eq(tp_generation_config_load(dir, &g), TP_OK);
    ck_assert_str_eq(tp_error_message(), "");
    ck_assert_int_eq(g.bos_token_id, -1);
    ck_assert_int_eq(g.n_eos, 0);
    ck_assert_int_eq(g.do_sample, -1);
    ck_assert(g.temperature < 0 && g.max_new_tokens < 0);

    char *path = tp_path_join(dir, "generation_config.json");
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"eos_token_id\":[4,5],\"do_sample\":false}", f);
    fclose(f);
    ck_assert_int_eq(tp_generation_config_load(dir, &g), TP_OK);
    assert_eos(g.eos_token_ids, g.n_eos, (const int64_t[]){4, 5}, 2);

    f = fopen(path, "w");
    fputs("{\"top_p\":2}", f);
    fclose(f);
    tp_error_clear();
    ck_assert_int_eq(tp_generation_config_load(dir, &g), TP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), path));

    /* present but unreadable as a file: an error, not "absent" */
    unlink(path);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    tp_error_clear();
    ck_assert_int_eq(tp_generation_config_load(dir, &g), TP_ERR_IO);
    rmdir(path);
    free(path);
    rmdir(dir);
}
END_TEST

static Suite *model_config_suite(void)
{
    Suite *s = suite_create("model_config");
    TCase *tc = tcase_create("shared");
    tcase_add_test(tc, every_shared_config_loads);
    tcase_add_test(tc, stories260K_values);
    tcase_add_test(tc, tiny_llama3_values);
    tcase_add_test(tc, tiny_mistral_values);
    tcase_add_test(tc, tiny_qwen2_values);
    tcase_add_test(tc, tiny_qwen3_values);
    suite_add_tcase(s, tc);

    tc = tcase_create("config");
    tcase_add_loop_test(tc, malformed_config, 0, (int)TP_ARRAY_LEN(cfg_cases));
    tcase_add_test(tc, long_string_is_capped);
    tcase_add_test(tc, yarn_inv_freq);
    tcase_add_test(tc, config_file_errors);
    suite_add_tcase(s, tc);

    tc = tcase_create("generation_config");
    tcase_add_loop_test(tc, malformed_generation_config, 0, (int)TP_ARRAY_LEN(gen_cases));
    tcase_add_test(tc, generation_config_values);
    tcase_add_test(tc, generation_config_files);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(model_config_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failures = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failures ? 1 : 0;
}
