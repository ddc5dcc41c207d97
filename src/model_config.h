/*
 * model_config.h: what config.json and generation_config.json of a Hugging Face
 * Llama-family model directory say, validated (types, ranges, consistency).
 */
#ifndef TP_MODEL_CONFIG_H
#define TP_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TP_MAX_LAYERS 1024
#define TP_MAX_EOS_IDS 16

typedef enum tp_arch {
    TP_ARCH_LLAMA,   /* LlamaForCausalLM */
    TP_ARCH_MISTRAL, /* MistralForCausalLM */
    TP_ARCH_QWEN2,   /* Qwen2ForCausalLM */
    TP_ARCH_QWEN3,   /* Qwen3ForCausalLM */
    TP_ARCH_PHI3,    /* Phi3ForCausalLM (Phi-3, Phi-4): Llama's layers with q|k|v and gate|up fused */
    TP_ARCH_GRANITE, /* GraniteForCausalLM (IBM Granite 3): Llama's layers with four multipliers */
    TP_ARCH_GEMMA,   /* GemmaForCausalLM (Gemma 1, CodeGemma): Llama's layers with norms of 1 + weight,
                      * GeLU, the embedding times sqrt(hidden_size), tied */
    TP_ARCH_GEMMA2,  /* Gemma2ForCausalLM: norms of 1 + weight, also around each block's output; GeLU;
                      * every other layer sliding; scores and logits soft-capped */
    TP_ARCH_GEMMA3,  /* Gemma3ForCausalLM (Gemma 3 1B, 270M): Gemma 2's layers with q/k norms, no
                      * soft-capping, sliding layers with a rope base of their own */
    TP_ARCH_COUNT
} tp_arch;

typedef enum tp_rope_type { TP_ROPE_DEFAULT, TP_ROPE_LINEAR, TP_ROPE_LLAMA3, TP_ROPE_YARN } tp_rope_type;

/* The MLP's gate activation: SiLU (SwiGLU), or GeLU's tanh form (GeGLU: Gemma's
 * gelu_pytorch_tanh) */
typedef enum tp_mlp_act { TP_ACT_SILU, TP_ACT_GELU_TANH } tp_mlp_act;

typedef struct tp_rope_scaling {
    tp_rope_type type;
    double factor;                  /* linear, llama3, yarn */
    double low_freq_factor;         /* llama3 */
    double high_freq_factor;        /* llama3 */
    int64_t original_max_position;  /* llama3, yarn */
    double beta_fast, beta_slow;    /* yarn: the correction range's rotations */
    int truncate;                   /* yarn: the range rounded outwards to whole dims */
    double attention_factor;        /* yarn: HF's cos/sin multiplier (the scores get its square) */
} tp_rope_scaling;

typedef struct tp_model_config {
    tp_arch arch;
    int multimodal;            /* > 0: the text model of a multimodal checkpoint (Gemma3ForConditionalGeneration,
                                * Mistral3ForConditionalGeneration: config.json's text_config; the vision
                                * tower is not read); which one, for tp_model_config_arch_name */
    int64_t hidden_size;       /* d_model */
    int64_t intermediate_size; /* MLP inner dim */
    int64_t n_layers;
    int64_t n_heads;           /* query heads */
    int64_t n_kv_heads;
    int64_t head_dim;          /* explicit, or hidden_size / n_heads */
    int64_t vocab_size;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    tp_rope_scaling rope_scaling;
    int tie_word_embeddings;
    int attention_bias;        /* q/k/v biases (Qwen2 always; Llama/Qwen3 when attention_bias) */
    int o_bias;                /* o_proj bias (Llama attention_bias) */
    int mlp_bias;
    int qk_norm;               /* Qwen3 per-head q/k RMSNorm */
    tp_mlp_act mlp_act;
    int gemma_norms;           /* Gemma: every RMSNorm scales by 1 + weight (the loader adds the 1); the
                                * embedding's output times sqrt(hidden_size) */
    int block_output_norms;    /* Gemma 2 and 3: each block's output is normed before the residual add
                                * (post_attention_layernorm, post_feedforward_layernorm; the MLP's
                                * input norm is then pre_feedforward_layernorm) */
    double attn_softcap;       /* > 0: every attention score s becomes c tanh(s / c) (Gemma 2's
                                * attn_logit_softcapping); 0: none */
    double final_softcap;      /* > 0: every logit likewise (final_logit_softcapping); 0: none */
    double rope_local_theta;   /* > 0: the rope base, unscaled, of the layers local_rope marks
                                * (Gemma 3's rope_local_base_freq); 0: every layer's is rope_theta */
    uint8_t local_rope[TP_MAX_LAYERS]; /* 1: layer i is of Gemma 3's sliding type (its rope base
                                        * is rope_local_theta, whether a window is set or not) */
    int64_t sliding_window;    /* > 0: a token of a layer sliding_layer marks attends to its last
                                * sliding_window positions only (itself and the window - 1 before
                                * it); 0: every layer attends to the whole context */
    uint8_t sliding_layer[TP_MAX_LAYERS]; /* 1: layer i (of the whole model) slides */
    /* Granite's multipliers (1 elsewhere; attention_multiplier 0: 1 / sqrt(head_dim)): the
     * embedding's output, each block's output before the residual add, the attention scores'
     * scale, and the logits' divisor. The loader folds all but the attention's into weights. */
    double embedding_multiplier, residual_multiplier, attention_multiplier, logits_scaling;
    tp_dtype torch_dtype;      /* F32 when absent */
    int64_t bos_token_id;      /* -1 when absent */
    int64_t eos_token_ids[TP_MAX_EOS_IDS];
    int n_eos;
} tp_model_config;

typedef struct tp_generation_config {
    int64_t bos_token_id;      /* -1 when absent */
    int64_t eos_token_ids[TP_MAX_EOS_IDS];
    int n_eos;                 /* 0 when absent: the model config's eos ids apply */
    int do_sample;             /* -1 when absent */
    double temperature;        /* < 0 when absent */
    double top_p;              /* < 0 when absent */
    int64_t top_k;             /* < 0 when absent */
    double repetition_penalty; /* < 0 when absent */
    int64_t max_new_tokens;    /* < 0 when absent */
} tp_generation_config;

const char *tp_arch_name(tp_arch arch); /* the HF architectures[] string */
/* config.json's architecture: tp_arch_name, or the multimodal one whose text model runs */
const char *tp_model_config_arch_name(const tp_model_config *cfg);
/* "3 layers (2 with a sliding window of 8), yarn rope x4 over 256 positions": the layer count
 * and what differs from plain Llama (windows, rope scaling, Granite's multipliers), for logs
 * and --dry-run */
void tp_model_config_describe(const tp_model_config *cfg, char *buf, size_t n);

/* The sliding window of every layer, where all of them slide; 0 where some layer attends to
 * the whole context (a sequence's KV blocks behind that window are then read by no layer). */
int64_t tp_model_config_window_of_all(const tp_model_config *cfg);

/* Parse config.json text; what names the file in messages. */
tp_status tp_model_config_parse(const char *json_text, size_t len, const char *what,
                                tp_model_config *cfg);
/* Read DIR/config.json. */
tp_status tp_model_config_load(const char *model_dir, tp_model_config *cfg);

/* generation_config.json is optional: a missing file gives all fields "absent". */
tp_status tp_generation_config_parse(const char *json_text, size_t len, const char *what,
                                     tp_generation_config *gen);
tp_status tp_generation_config_load(const char *model_dir, tp_generation_config *gen);
/* generation_config.json alone does not know the vocabulary: check its token ids against
 * the model's vocab_size (what names the file in messages). */
tp_status tp_generation_config_check(const tp_generation_config *gen,
                                     const tp_model_config *cfg, const char *what);

#ifdef __cplusplus
}
#endif
#endif
