/*
 * shard_plan.c: the Megatron split of a Llama-family model over a tp x pp grid, as
 * arithmetic on the config: layer ranges per stage, heads / MLP / vocab slices per
 * TP rank, and the list of HF weight slices each rank reads.
 */
#include "shard_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

tp_status tp_shard_plan_validate(const tp_model_config *cfg, int tp, int pp)
{
    if (tp < 1) return tp_error(TP_ERR_INVALID_ARG, "--tp must be at least 1, got %d", tp);
    if (pp < 1) return tp_error(TP_ERR_INVALID_ARG, "--pp must be at least 1, got %d", pp);
    /* a hand-built config that skipped tp_model_config_parse would divide by zero below */
    if (cfg->n_layers < 1 || cfg->n_heads < 1 || cfg->n_kv_heads < 1 ||
        cfg->intermediate_size < 1 || cfg->vocab_size < 1 || cfg->head_dim < 1 ||
        cfg->hidden_size < 1)
        return tp_error(TP_ERR_INTERNAL, "shard plan asked for an unvalidated model config");
    if (cfg->n_layers < pp)
        return tp_error(TP_ERR_INVALID_ARG,
                        "model has %lld layers, fewer than --pp %d; choose a --pp of at most "
                        "%lld", (long long)cfg->n_layers, pp, (long long)cfg->n_layers);
    if (cfg->n_heads % tp != 0)
        return tp_error(TP_ERR_INVALID_ARG,
                        "num_attention_heads %lld is not divisible by --tp %d; choose a --tp "
                        "that divides %lld", (long long)cfg->n_heads, tp,
                        (long long)cfg->n_heads);
    /* KV heads split like query heads, or, when fewer than tp, each is replicated on
     * tp / n_kv consecutive ranks (which then hold exactly its GQA group) */
    if (cfg->n_kv_heads >= tp ? cfg->n_kv_heads % tp != 0 : tp % cfg->n_kv_heads != 0)
        return tp_error(TP_ERR_INVALID_ARG,
                        "num_key_value_heads %lld does not split over --tp %d; choose a --tp "
                        "that divides %lld or is a multiple of it",
                        (long long)cfg->n_kv_heads, tp, (long long)cfg->n_kv_heads);
    if (cfg->intermediate_size % tp != 0)
        return tp_error(TP_ERR_INVALID_ARG,
                        "intermediate_size %lld is not divisible by --tp %d; choose a --tp "
                        "that divides %lld", (long long)cfg->intermediate_size, tp,
                        (long long)cfg->intermediate_size);
    return TP_OK;
}

tp_status tp_shard_plan_make(const tp_model_config *cfg, int tp, int pp, int tp_rank,
                             int pp_rank, tp_shard_plan *plan)
{
    TP_CHECK(tp_shard_plan_validate(cfg, tp, pp));
    if (tp_rank < 0 || tp_rank >= tp || pp_rank < 0 || pp_rank >= pp)
        return tp_error(TP_ERR_INVALID_ARG, "rank (tp %d, pp %d) is outside the %d x %d grid",
                        tp_rank, pp_rank, tp, pp);
    memset(plan, 0, sizeof *plan);
    plan->tp = tp;
    plan->pp = pp;
    plan->tp_rank = tp_rank;
    plan->pp_rank = pp_rank;

    /* the first n_layers % pp stages take one extra layer */
    int64_t base = cfg->n_layers / pp, extra = cfg->n_layers % pp;
    plan->layers.begin = pp_rank * base + min64(pp_rank, extra);
    plan->layers.end = plan->layers.begin + base + (pp_rank < extra);
    plan->has_embedding = pp_rank == 0;
    plan->has_lm_head = pp_rank == pp - 1;

    int64_t h = cfg->n_heads / tp;
    plan->q_heads = (tp_range){tp_rank * h, (tp_rank + 1) * h};
    if (cfg->n_kv_heads >= tp) {
        int64_t k = cfg->n_kv_heads / tp;
        plan->kv_replicas = 1;
        plan->kv_heads = (tp_range){tp_rank * k, (tp_rank + 1) * k};
    } else {
        plan->kv_replicas = tp / (int)cfg->n_kv_heads;
        int64_t kv = tp_rank / plan->kv_replicas;
        plan->kv_heads = (tp_range){kv, kv + 1};
    }

    int64_t m = cfg->intermediate_size / tp;
    plan->mlp = (tp_range){tp_rank * m, (tp_rank + 1) * m};

    /* ceil split: the last ranks may get fewer rows, or none when vocab < tp */
    int64_t per = TP_CEIL_DIV(cfg->vocab_size, tp);
    plan->vocab.begin = min64(cfg->vocab_size, tp_rank * per);
    plan->vocab.end = min64(cfg->vocab_size, (tp_rank + 1) * per);
    return TP_OK;
}

// ----------------------------------------------------------------------------
// weight list

typedef struct builder {
    tp_weight_slice *v;
    int n, cap;
} builder;

/* Append a [rows, cols] tensor's slice; 1-D tensors pass cols = 1. */
static tp_status add(builder *b, const char *name, int64_t full_rows, int64_t full_cols,
                     int64_t row0, int64_t nrows, int64_t col0, int64_t ncols)
{
    /* "model.layers.N.PART" */
    const char *part = strncmp(name, "model.layers.", 13) ? NULL : strchr(name + 13, '.');
    if (b->n == b->cap)
        return tp_error(TP_ERR_INTERNAL, "shard plan weight list overflowed %d entries",
                        b->cap);
    tp_weight_slice *w = &b->v[b->n];
    int len = snprintf(w->name, sizeof w->name, "%s", name);
    if (len < 0 || (size_t)len >= sizeof w->name)
        return tp_error(TP_ERR_INTERNAL, "weight name %s is too long", name);
    snprintf(w->part, sizeof w->part, "%s", part ? part + 1 : "");
    w->row0 = row0;
    w->nrows = nrows;
    w->col0 = col0;
    w->ncols = ncols;
    w->full_rows = full_rows;
    w->full_cols = full_cols;
    b->n++;
    return TP_OK;
}

/* Column-parallel: rows [r0, r0 + n) of a [rows, cols] weight (or of a 1-D bias). */
static tp_status add_rows(builder *b, const char *name, int64_t rows, int64_t cols, int64_t r0,
                          int64_t n)
{
    return add(b, name, rows, cols, r0, n, 0, cols);
}

/* Replicated on every rank that reads it: the whole tensor. */
static tp_status add_whole(builder *b, const char *name, int64_t rows, int64_t cols)
{
    return add(b, name, rows, cols, 0, rows, 0, cols);
}

/* A part of a fused tensor (Phi-3's): rows [r0, r0 + n) of it, filling part */
static tp_status add_fused(builder *b, const char *name, const char *part, int64_t rows, int64_t cols,
                           int64_t r0, int64_t n)
{
    TP_CHECK(add_rows(b, name, rows, cols, r0, n));
    snprintf(b->v[b->n - 1].part, sizeof b->v[b->n - 1].part, "%s", part);
    return TP_OK;
}

/* "model.layers.{layer}.{suffix}" in buf. */
static const char *layer_name(char *buf, size_t n, int64_t layer, const char *suffix)
{
    snprintf(buf, n, "model.layers.%lld.%s", (long long)layer, suffix);
    return buf;
}

static tp_status add_layer(builder *b, const tp_model_config *cfg, const tp_shard_plan *plan,
                           int64_t layer)
{
    char name[160];
#define LNAME(suffix) layer_name(name, sizeof name, layer, suffix)
    const int64_t hidden = cfg->hidden_size, hd = cfg->head_dim;
    const int64_t q_rows = cfg->n_heads * hd, kv_rows = cfg->n_kv_heads * hd;
    const int64_t q0 = plan->q_heads.begin * hd;
    const int64_t nq = (plan->q_heads.end - plan->q_heads.begin) * hd;
    const int64_t k0 = plan->kv_heads.begin * hd;
    const int64_t nk = (plan->kv_heads.end - plan->kv_heads.begin) * hd;
    const int64_t inter = cfg->intermediate_size;
    const int64_t m0 = plan->mlp.begin, nm = plan->mlp.end - plan->mlp.begin;
    /* the all-reduce sums the TP ranks' partial outputs of a row-parallel layer (o_proj,
     * down_proj), so its bias must enter the sum once: tp rank 0 reads and adds it */
    const int bias_owner = plan->tp_rank == 0;

    TP_CHECK(add_whole(b, LNAME("input_layernorm.weight"), hidden, 1));
    if (cfg->arch == TP_ARCH_PHI3) { /* qkv_proj: q's rows, k's, v's */
        const int64_t rows = q_rows + 2 * kv_rows;
        TP_CHECK(add_fused(b, LNAME("self_attn.qkv_proj.weight"), "self_attn.q_proj.weight", rows, hidden, q0, nq));
        TP_CHECK(add_fused(b, LNAME("self_attn.qkv_proj.weight"), "self_attn.k_proj.weight", rows, hidden,
                           q_rows + k0, nk));
        TP_CHECK(add_fused(b, LNAME("self_attn.qkv_proj.weight"), "self_attn.v_proj.weight", rows, hidden,
                           q_rows + kv_rows + k0, nk));
    } else {
        TP_CHECK(add_rows(b, LNAME("self_attn.q_proj.weight"), q_rows, hidden, q0, nq));
        TP_CHECK(add_rows(b, LNAME("self_attn.k_proj.weight"), kv_rows, hidden, k0, nk));
        TP_CHECK(add_rows(b, LNAME("self_attn.v_proj.weight"), kv_rows, hidden, k0, nk));
    }
    if (cfg->attention_bias) {
        TP_CHECK(add_rows(b, LNAME("self_attn.q_proj.bias"), q_rows, 1, q0, nq));
        TP_CHECK(add_rows(b, LNAME("self_attn.k_proj.bias"), kv_rows, 1, k0, nk));
        TP_CHECK(add_rows(b, LNAME("self_attn.v_proj.bias"), kv_rows, 1, k0, nk));
    }
    if (cfg->qk_norm) {
        TP_CHECK(add_whole(b, LNAME("self_attn.q_norm.weight"), hd, 1));
        TP_CHECK(add_whole(b, LNAME("self_attn.k_norm.weight"), hd, 1));
    }
    TP_CHECK(add(b, LNAME("self_attn.o_proj.weight"), hidden, q_rows, 0, hidden, q0, nq));
    if (cfg->o_bias && bias_owner)
        TP_CHECK(add_whole(b, LNAME("self_attn.o_proj.bias"), hidden, 1));
    TP_CHECK(add_whole(b, LNAME("post_attention_layernorm.weight"), hidden, 1));
    if (cfg->block_output_norms) { /* Gemma 2, 3: post_attention_layernorm norms the attention's output; these the
                                    * MLP's input and output */
        TP_CHECK(add_whole(b, LNAME("pre_feedforward_layernorm.weight"), hidden, 1));
        TP_CHECK(add_whole(b, LNAME("post_feedforward_layernorm.weight"), hidden, 1));
    }
    if (cfg->arch == TP_ARCH_PHI3) { /* gate_up_proj: gate's rows, then up's */
        TP_CHECK(add_fused(b, LNAME("mlp.gate_up_proj.weight"), "mlp.gate_proj.weight", 2 * inter, hidden, m0, nm));
        TP_CHECK(add_fused(b, LNAME("mlp.gate_up_proj.weight"), "mlp.up_proj.weight", 2 * inter, hidden,
                           inter + m0, nm));
    } else {
        TP_CHECK(add_rows(b, LNAME("mlp.gate_proj.weight"), inter, hidden, m0, nm));
        TP_CHECK(add_rows(b, LNAME("mlp.up_proj.weight"), inter, hidden, m0, nm));
    }
    TP_CHECK(add(b, LNAME("mlp.down_proj.weight"), hidden, inter, 0, hidden, m0, nm));
    if (cfg->mlp_bias) {
        TP_CHECK(add_rows(b, LNAME("mlp.gate_proj.bias"), inter, 1, m0, nm));
        TP_CHECK(add_rows(b, LNAME("mlp.up_proj.bias"), inter, 1, m0, nm));
        if (bias_owner) TP_CHECK(add_whole(b, LNAME("mlp.down_proj.bias"), hidden, 1));
    }
#undef LNAME
    return TP_OK;
}

tp_status tp_shard_plan_weights(const tp_model_config *cfg, const tp_shard_plan *plan,
                                tp_weight_slice **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    /* per layer: 2 norms, 4 attention weights, 4 biases, q/k norms, 3 MLP weights, 3 biases;
     * then the embedding, the final norm and the LM head */
    enum { PER_LAYER_MAX = 18, GLOBAL_MAX = 3 };
    int64_t n_layers = plan->layers.end - plan->layers.begin;
    if (n_layers < 0 || n_layers > TP_MAX_LAYERS)
        return tp_error(TP_ERR_INTERNAL, "shard plan has a bad layer range [%lld, %lld)",
                        (long long)plan->layers.begin, (long long)plan->layers.end);
    builder b = {NULL, 0, (int)n_layers * PER_LAYER_MAX + GLOBAL_MAX};
    b.v = calloc((size_t)b.cap, sizeof *b.v);
    if (!b.v) return tp_error(TP_ERR_OOM, "out of memory for %d weight slices", b.cap);

    const int64_t vocab = cfg->vocab_size, hidden = cfg->hidden_size;
    const int64_t v0 = plan->vocab.begin, nv = plan->vocab.end - plan->vocab.begin;
    tp_status st;
    /* vocab-parallel embedding: each rank looks up its rows, the all-reduce fills the rest */
    if (plan->has_embedding)
        TP_CHECK_GOTO(add_rows(&b, "model.embed_tokens.weight", vocab, hidden, v0, nv), st,
                      fail);
    for (int64_t l = plan->layers.begin; l < plan->layers.end; l++)
        TP_CHECK_GOTO(add_layer(&b, cfg, plan, l), st, fail);
    if (plan->has_lm_head) {
        TP_CHECK_GOTO(add_whole(&b, "model.norm.weight", hidden, 1), st, fail);
        /* tied: the embedding's rows again, listed as the LM head (a one-stage loader may
         * share the buffer with the embedding's) */
        const char *head =
            cfg->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
        TP_CHECK_GOTO(add_rows(&b, head, vocab, hidden, v0, nv), st, fail);
    }
    *out = b.v;
    *n_out = b.n;
    return TP_OK;
fail:
    free(b.v);
    return st;
}

int64_t tp_shard_plan_kv_bytes_per_token(const tp_model_config *cfg, const tp_shard_plan *plan,
                                         int64_t elem_size)
{
    /* K and V, per layer of this stage, per KV head stored here (replicas included) */
    int64_t layers = plan->layers.end - plan->layers.begin;
    int64_t kv_heads = plan->kv_heads.end - plan->kv_heads.begin;
    return 2 * layers * kv_heads * cfg->head_dim * elem_size;
}
