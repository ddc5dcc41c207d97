/*
 * check_shard_plan.c: the tp x pp split, checked exhaustively over small grids against an
 * independent enumeration of the HF tensors: summed over all ranks, every weight element
 * is read exactly as often as its role says (once, once per KV replica, or once per TP
 * rank for replicated norms), layer ranges partition the model, and bad grids say why.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_config.h"
#include "shard_plan.h"
#include "util.h"

#define MAX_TP 8
#define MAX_PP 6

// ----------------------------------------------------------------------------
// configs: synthetic shapes, and the shared models when present

typedef struct synth {
    const char *name;
    tp_arch arch;
    int64_t hidden, inter, layers, heads, kv, head_dim, vocab;
    int tie, attention_bias, o_bias, mlp_bias, qk_norm;
} synth;

static const synth synths[] = {
    /* name            arch           hid inter L  H   KV hd voc tie ab ob mb qk */
    {"mha",            TP_ARCH_LLAMA,   16, 24, 5, 4,  4, 4, 50, 0, 0, 0, 0, 0},
    {"gqa-replicated", TP_ARCH_LLAMA,   16, 16, 7, 8,  2, 2, 37, 1, 0, 0, 0, 0},
    {"mqa-biases",     TP_ARCH_LLAMA,    8, 40, 6, 8,  1, 2,  5, 0, 1, 1, 1, 0},
    {"qwen2-like",     TP_ARCH_QWEN2,   24, 12, 3, 6,  2, 4, 64, 1, 1, 0, 0, 0},
    {"qwen3-like",     TP_ARCH_QWEN3,   16, 32, 4, 8,  4, 4, 29, 0, 1, 1, 0, 1},
    {"one-layer",      TP_ARCH_MISTRAL,  4,  8, 1, 2,  1, 2,  3, 1, 0, 0, 0, 0},
    {"wide",           TP_ARCH_LLAMA,   48, 48, 6, 24, 8, 2, 100, 0, 0, 0, 1, 0},
};

static tp_model_config synth_config(const synth *s)
{
    tp_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = s->arch;
    c.hidden_size = s->hidden;
    c.intermediate_size = s->inter;
    c.n_layers = s->layers;
    c.n_heads = s->heads;
    c.n_kv_heads = s->kv;
    c.head_dim = s->head_dim;
    c.vocab_size = s->vocab;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000;
    c.tie_word_embeddings = s->tie;
    c.attention_bias = s->attention_bias;
    c.o_bias = s->o_bias;
    c.mlp_bias = s->mlp_bias;
    c.qk_norm = s->qk_norm;
    c.torch_dtype = TP_DTYPE_BF16;
    c.bos_token_id = -1;
    return c;
}

static const char *const shared_models[] = {
    "stories260K-hf", "stories260K-hf-bf16-sharded", "tiny-llama3",
    "tiny-mistral",   "tiny-qwen2",                  "tiny-qwen3",
};

/* Load $TPINFER_SHARED/models/NAME/config.json, or return 0 with a printed reason. */
static int shared_config(const char *name, tp_model_config *cfg)
{
    const char *shared = getenv("TPINFER_SHARED");
    if (!shared || !*shared) shared = "../shared";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/%s", shared, name);
    struct stat st;
    if (stat(dir, &st) != 0) {
        printf("SKIP: %s not found (set TPINFER_SHARED to the shared fixtures)\n", dir);
        return 0;
    }
    tp_error_clear();
    ck_assert_msg(tp_model_config_load(dir, cfg) == TP_OK, "%s: %s", dir, tp_error_message());
    return 1;
}

// ----------------------------------------------------------------------------
// the oracle: every tensor of the model, its full shape and how often it must be read

enum { ROLE_WEIGHT, ROLE_TIED_HEAD }; /* a tied embedding is also read as the LM head */

typedef struct expect {
    char name[160];
    int role;
    int64_t rows, cols;
    int mult;              /* reads per element over the whole grid */
    unsigned char *count;  /* reads seen, per element */
} expect;

typedef struct oracle {
    expect *e;
    int n, cap;
} oracle;

static void expect_add(oracle *o, const char *name, int role, int64_t rows, int64_t cols,
                       int mult)
{
    ck_assert_int_lt(o->n, o->cap);
    expect *e = &o->e[o->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->role = role;
    e->rows = rows;
    e->cols = cols;
    e->mult = mult;
    e->count = calloc((size_t)(rows * cols), 1);
    ck_assert_ptr_nonnull(e->count);
}

static void oracle_build(oracle *o, const tp_model_config *c, int tp, int kv_replicas)
{
    o->cap = (int)c->n_layers * 18 + 4;
    o->n = 0;
    o->e = calloc((size_t)o->cap, sizeof *o->e);
    ck_assert_ptr_nonnull(o->e);
    const int64_t H = c->hidden_size, hd = c->head_dim, I = c->intermediate_size;
    const int64_t q = c->n_heads * hd, kv = c->n_kv_heads * hd;
    expect_add(o, "model.embed_tokens.weight", ROLE_WEIGHT, c->vocab_size, H, 1);
    for (int64_t l = 0; l < c->n_layers; l++) {
        char n[160];
#define L(s) (snprintf(n, sizeof n, "model.layers.%lld.%s", (long long)l, s), n)
        expect_add(o, L("input_layernorm.weight"), ROLE_WEIGHT, H, 1, tp);
        expect_add(o, L("self_attn.q_proj.weight"), ROLE_WEIGHT, q, H, 1);
        expect_add(o, L("self_attn.k_proj.weight"), ROLE_WEIGHT, kv, H, kv_replicas);
        expect_add(o, L("self_attn.v_proj.weight"), ROLE_WEIGHT, kv, H, kv_replicas);
        if (c->attention_bias) {
            expect_add(o, L("self_attn.q_proj.bias"), ROLE_WEIGHT, q, 1, 1);
            expect_add(o, L("self_attn.k_proj.bias"), ROLE_WEIGHT, kv, 1, kv_replicas);
            expect_add(o, L("self_attn.v_proj.bias"), ROLE_WEIGHT, kv, 1, kv_replicas);
        }
        if (c->qk_norm) {
            expect_add(o, L("self_attn.q_norm.weight"), ROLE_WEIGHT, hd, 1, tp);
            expect_add(o, L("self_attn.k_norm.weight"), ROLE_WEIGHT, hd, 1, tp);
        }
        expect_add(o, L("self_attn.o_proj.weight"), ROLE_WEIGHT, H, q, 1);
        if (c->o_bias) expect_add(o, L("self_attn.o_proj.bias"), ROLE_WEIGHT, H, 1, 1);
        expect_add(o, L("post_attention_layernorm.weight"), ROLE_WEIGHT, H, 1, tp);
        expect_add(o, L("mlp.gate_proj.weight"), ROLE_WEIGHT, I, H, 1);
        expect_add(o, L("mlp.up_proj.weight"), ROLE_WEIGHT, I, H, 1);
        expect_add(o, L("mlp.down_proj.weight"), ROLE_WEIGHT, H, I, 1);
        if (c->mlp_bias) {
            expect_add(o, L("mlp.gate_proj.bias"), ROLE_WEIGHT, I, 1, 1);
            expect_add(o, L("mlp.up_proj.bias"), ROLE_WEIGHT, I, 1, 1);
            expect_add(o, L("mlp.down_proj.bias"), ROLE_WEIGHT, H, 1, 1);
        }
#undef L
    }
    expect_add(o, "model.norm.weight", ROLE_WEIGHT, H, 1, tp);
    if (c->tie_word_embeddings)
        expect_add(o, "model.embed_tokens.weight", ROLE_TIED_HEAD, c->vocab_size, H, 1);
    else
        expect_add(o, "lm_head.weight", ROLE_WEIGHT, c->vocab_size, H, 1);
}

static void oracle_free(oracle *o)
{
    for (int i = 0; i < o->n; i++) free(o->e[i].count);
    free(o->e);
}

static expect *oracle_find(oracle *o, const char *name, int role)
{
    for (int i = 0; i < o->n; i++)
        if (o->e[i].role == role && strcmp(o->e[i].name, name) == 0) return &o->e[i];
    return NULL;
}

// ----------------------------------------------------------------------------
// one grid

/* Why (tp, pp) cannot split c, as the message must say it, or NULL when it can. */
static const char *expected_failure(const tp_model_config *c, int tp, int pp, char *buf,
                                    size_t n)
{
    if (c->n_layers < pp)
        snprintf(buf, n, "model has %lld layers, fewer than --pp %d", (long long)c->n_layers, pp);
    else if (c->n_heads % tp)
        snprintf(buf, n, "num_attention_heads %lld is not divisible by --tp %d; choose a --tp "
                 "that divides %lld", (long long)c->n_heads, tp, (long long)c->n_heads);
    else if (c->n_kv_heads >= tp ? c->n_kv_heads % tp : tp % c->n_kv_heads)
        snprintf(buf, n, "num_key_value_heads %lld does not split over --tp %d",
                 (long long)c->n_kv_heads, tp);
    else if (c->intermediate_size % tp)
        snprintf(buf, n, "intermediate_size %lld is not divisible by --tp %d",
                 (long long)c->intermediate_size, tp);
    else
        return NULL;
    return buf;
}

static void check_rank(const tp_model_config *c, const tp_shard_plan *p, oracle *o,
                       const char *ctx)
{
    const int tp = p->tp, r = p->tp_rank;
    /* heads, MLP and vocab slices follow the documented formulas */
    int64_t h = c->n_heads / tp;
    ck_assert_msg(p->q_heads.begin == r * h && p->q_heads.end == (r + 1) * h, "%s", ctx);
    int reps = c->n_kv_heads >= tp ? 1 : tp / (int)c->n_kv_heads;
    ck_assert_int_eq(p->kv_replicas, reps);
    if (reps == 1) {
        int64_t k = c->n_kv_heads / tp;
        ck_assert_msg(p->kv_heads.begin == r * k && p->kv_heads.end == (r + 1) * k, "%s", ctx);
    } else {
        ck_assert_msg(p->kv_heads.begin == r / reps && p->kv_heads.end == r / reps + 1, "%s",
                      ctx);
    }
    /* the GQA group of each local query head is stored locally */
    int64_t group = c->n_heads / c->n_kv_heads;
    for (int64_t qh = p->q_heads.begin; qh < p->q_heads.end; qh++)
        ck_assert_msg(qh / group >= p->kv_heads.begin && qh / group < p->kv_heads.end,
                      "%s: query head %lld's KV head %lld is not local", ctx, (long long)qh,
                      (long long)(qh / group));
    int64_t m = c->intermediate_size / tp;
    ck_assert_msg(p->mlp.begin == r * m && p->mlp.end == (r + 1) * m, "%s", ctx);
    int64_t per = (c->vocab_size + tp - 1) / tp;
    int64_t vb = r * per < c->vocab_size ? r * per : c->vocab_size;
    int64_t ve = (r + 1) * per < c->vocab_size ? (r + 1) * per : c->vocab_size;
    ck_assert_msg(p->vocab.begin == vb && p->vocab.end == ve, "%s", ctx);
    ck_assert_int_eq(p->has_embedding, p->pp_rank == 0);
    ck_assert_int_eq(p->has_lm_head, p->pp_rank == p->pp - 1);

    tp_weight_slice *w = NULL;
    int n = 0;
    tp_error_clear();
    ck_assert_msg(tp_shard_plan_weights(c, p, &w, &n) == TP_OK, "%s: %s", ctx,
                  tp_error_message());
    ck_assert_int_gt(n, 0);
    if (p->has_embedding) ck_assert_str_eq(w[0].name, "model.embed_tokens.weight");
    if (p->has_lm_head)
        ck_assert_str_eq(w[n - 1].name,
                         c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    unsigned char *seen = calloc((size_t)o->n, 1); /* no tensor twice in one role */
    ck_assert_ptr_nonnull(seen);
    for (int i = 0; i < n; i++) {
        const tp_weight_slice *s = &w[i];
        int role = (c->tie_word_embeddings && p->has_lm_head && i == n - 1) ? ROLE_TIED_HEAD
                                                                             : ROLE_WEIGHT;
        expect *e = oracle_find(o, s->name, role);
        ck_assert_msg(e != NULL, "%s: unexpected tensor %s", ctx, s->name);
        ck_assert_msg(!seen[e - o->e], "%s: %s listed twice", ctx, s->name);
        seen[e - o->e] = 1;
        ck_assert_msg(s->full_rows == e->rows && s->full_cols == e->cols,
                      "%s: %s full shape %lld x %lld, want %lld x %lld", ctx, s->name,
                      (long long)s->full_rows, (long long)s->full_cols, (long long)e->rows,
                      (long long)e->cols);
        ck_assert_msg(s->row0 >= 0 && s->nrows >= 0 && s->row0 + s->nrows <= e->rows &&
                          s->col0 >= 0 && s->ncols >= 0 && s->col0 + s->ncols <= e->cols,
                      "%s: %s slice out of bounds", ctx, s->name);
        for (int64_t row = s->row0; row < s->row0 + s->nrows; row++)
            for (int64_t col = s->col0; col < s->col0 + s->ncols; col++)
                e->count[row * e->cols + col]++;
    }
    free(seen);
    free(w);
}

static void check_grid(const tp_model_config *c, int tp, int pp, const char *name)
{
    char ctx[256], why[256];
    snprintf(ctx, sizeof ctx, "%s --tp %d --pp %d", name, tp, pp);
    const char *fail = expected_failure(c, tp, pp, why, sizeof why);
    tp_error_clear();
    tp_status st = tp_shard_plan_validate(c, tp, pp);
    if (fail) {
        ck_assert_msg(st == TP_ERR_INVALID_ARG, "%s: accepted, want \"%s\"", ctx, fail);
        ck_assert_msg(strstr(tp_error_message(), fail) != NULL, "%s: \"%s\" lacks \"%s\"", ctx,
                      tp_error_message(), fail);
        tp_shard_plan p;
        tp_error_clear();
        ck_assert_int_eq(tp_shard_plan_make(c, tp, pp, 0, 0, &p), TP_ERR_INVALID_ARG);
        return;
    }
    ck_assert_msg(st == TP_OK, "%s: %s", ctx, tp_error_message());

    int reps = c->n_kv_heads >= tp ? 1 : tp / (int)c->n_kv_heads;
    oracle o;
    oracle_build(&o, c, tp, reps);
    int64_t next_layer = 0, kv_total = 0;
    for (int s = 0; s < pp; s++) {
        int64_t kv_stage = 0;
        tp_range layers = {0, 0};
        for (int r = 0; r < tp; r++) {
            char rctx[300];
            snprintf(rctx, sizeof rctx, "%s rank (tp %d, pp %d)", ctx, r, s);
            tp_shard_plan p;
            tp_error_clear();
            ck_assert_msg(tp_shard_plan_make(c, tp, pp, r, s, &p) == TP_OK, "%s: %s", rctx,
                          tp_error_message());
            ck_assert(p.tp == tp && p.pp == pp && p.tp_rank == r && p.pp_rank == s);
            if (r == 0) layers = p.layers;
            ck_assert_msg(p.layers.begin == layers.begin && p.layers.end == layers.end,
                          "%s: TP ranks of a stage disagree on its layers", rctx);
            check_rank(c, &p, &o, rctx);
            kv_stage += tp_shard_plan_kv_bytes_per_token(c, &p, 2);
        }
        /* contiguous, balanced, the first n_layers % pp stages one longer */
        int64_t size = c->n_layers / pp + (s < c->n_layers % pp);
        ck_assert_msg(layers.begin == next_layer && layers.end - layers.begin == size,
                      "%s stage %d: layers [%lld, %lld)", ctx, s, (long long)layers.begin,
                      (long long)layers.end);
        next_layer = layers.end;
        ck_assert_int_eq(kv_stage, 2 * size * c->n_kv_heads * c->head_dim * 2 * reps);
        kv_total += kv_stage;
    }
    ck_assert_int_eq(next_layer, c->n_layers);
    ck_assert_int_eq(kv_total, 2 * c->n_layers * c->n_kv_heads * c->head_dim * 2 * reps);

    for (int i = 0; i < o.n; i++) {
        const expect *e = &o.e[i];
        for (int64_t k = 0; k < e->rows * e->cols; k++)
            if (e->count[k] != e->mult)
                ck_abort_msg("%s: %s%s element (%lld, %lld) read %d times, want %d", ctx,
                             e->name, e->role == ROLE_TIED_HEAD ? " (as LM head)" : "",
                             (long long)(k / e->cols), (long long)(k % e->cols), e->count[k],
                             e->mult);
    }
    oracle_free(&o);
}

static void check_all_grids(const tp_model_config *c, const char *name)
{
    for (int tp = 1; tp <= MAX_TP; tp++)
        for (int pp = 1; pp <= MAX_PP; pp++) check_grid(c, tp, pp, name);
}

START_TEST(synthetic_grids)
{
    tp_model_config c = synth_config(&synths[_i]);
    check_all_grids(&c, synths[_i].name);
}
END_TEST

START_TEST(shared_model_grids)
{
    tp_model_config c;
    if (!shared_config(shared_models[_i], &c)) return;
    check_all_grids(&c, shared_models[_i]);
}
END_TEST

// ----------------------------------------------------------------------------
// spot checks and bad arguments

static const synth llama3_like = {"llama3-like", TP_ARCH_LLAMA, 128, 352, 4, 8, 2, 16, 1024,
                                  0, 0, 0, 0, 0};

static const tp_weight_slice *find_slice(const tp_weight_slice *w, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(w[i].name, name) == 0) return &w[i];
    return NULL;
}

START_TEST(spot_check_slices)
{
    tp_model_config c = synth_config(&llama3_like);
    tp_shard_plan p;
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_make(&c, 4, 2, 3, 1, &p), TP_OK);
    ck_assert(p.layers.begin == 2 && p.layers.end == 4);
    ck_assert(p.q_heads.begin == 6 && p.q_heads.end == 8);
    ck_assert(p.kv_heads.begin == 1 && p.kv_heads.end == 2 && p.kv_replicas == 2);
    ck_assert(p.mlp.begin == 264 && p.mlp.end == 352);
    ck_assert(p.vocab.begin == 768 && p.vocab.end == 1024);
    ck_assert(!p.has_embedding && p.has_lm_head);

    tp_weight_slice *w;
    int n;
    ck_assert_int_eq(tp_shard_plan_weights(&c, &p, &w, &n), TP_OK);
    ck_assert_int_eq(n, 2 * 9 + 2); /* 9 per layer, final norm, LM head */
    ck_assert_ptr_null(find_slice(w, n, "model.layers.1.self_attn.q_proj.weight"));
    const tp_weight_slice *s = find_slice(w, n, "model.layers.2.self_attn.q_proj.weight");
    ck_assert(s && s->row0 == 96 && s->nrows == 32 && s->col0 == 0 && s->ncols == 128);
    ck_assert(s->full_rows == 128 && s->full_cols == 128);
    s = find_slice(w, n, "model.layers.3.self_attn.k_proj.weight");
    ck_assert(s && s->row0 == 16 && s->nrows == 16 && s->full_rows == 32);
    s = find_slice(w, n, "model.layers.3.self_attn.o_proj.weight");
    ck_assert(s && s->row0 == 0 && s->nrows == 128 && s->col0 == 96 && s->ncols == 32);
    s = find_slice(w, n, "model.layers.3.mlp.down_proj.weight");
    ck_assert(s && s->col0 == 264 && s->ncols == 88 && s->full_cols == 352);
    s = find_slice(w, n, "model.layers.3.input_layernorm.weight");
    ck_assert(s && s->row0 == 0 && s->nrows == 128 && s->ncols == 1 && s->full_cols == 1);
    s = find_slice(w, n, "lm_head.weight");
    ck_assert(s && s->row0 == 768 && s->nrows == 256 && s->full_rows == 1024);
    ck_assert_int_eq(tp_shard_plan_kv_bytes_per_token(&c, &p, 2), 2 * 2 * 1 * 16 * 2);
    free(w);
}
END_TEST

/* Phi-3's fused tensors: at every tp up to 8 (past the 2 KV heads: replicas), the ranks of a
 * stage read each q row of qkv_proj once, each k and v row once per replica, each gate_up row
 * once, every slice filling its part (q, k, v; gate, up) from the right rows; the other
 * weights keep their names as parts */
START_TEST(phi3_fused_slices)
{
    static const synth phi3_like = {"phi3-like", TP_ARCH_PHI3, 128, 352, 2, 8, 2, 16, 1024, 0, 0, 0, 0, 0};
    tp_model_config c = synth_config(&phi3_like);
    const int64_t q_rows = 128, kv_rows = 32, inter = 352;
    for (int tp = 1; tp <= 8; tp *= 2) {
        int qkv_count[192] = {0}, gate_up_count[704] = {0};
        const int reps = tp > 2 ? tp / 2 : 1;
        for (int r = 0; r < tp; r++) {
            tp_shard_plan p;
            ck_assert_int_eq(tp_shard_plan_make(&c, tp, 1, r, 0, &p), TP_OK);
            tp_weight_slice *w;
            int n;
            ck_assert_int_eq(tp_shard_plan_weights(&c, &p, &w, &n), TP_OK);
            for (int i = 0; i < n; i++) {
                const tp_weight_slice *sl = &w[i];
                ck_assert_ptr_null(strstr(sl->name, "q_proj"));
                ck_assert_ptr_null(strstr(sl->name, "gate_proj"));
                const int layer0 = !strncmp(sl->name, "model.layers.0.", 15);
                if (strstr(sl->name, ".self_attn.qkv_proj.weight")) {
                    ck_assert_int_eq(sl->full_rows, q_rows + 2 * kv_rows);
                    const int64_t lo = !strcmp(sl->part, "self_attn.q_proj.weight")   ? 0
                                       : !strcmp(sl->part, "self_attn.k_proj.weight") ? q_rows
                                       : !strcmp(sl->part, "self_attn.v_proj.weight") ? q_rows + kv_rows
                                                                                      : -1;
                    ck_assert_msg(lo >= 0, "qkv_proj slice with part %s", sl->part);
                    const int64_t hi = lo == 0 ? q_rows : lo + kv_rows;
                    ck_assert_msg(sl->row0 >= lo && sl->row0 + sl->nrows <= hi, "tp %d rank %d: %s rows [%lld, +%lld)",
                                  tp, r, sl->part, (long long)sl->row0, (long long)sl->nrows);
                    for (int64_t row = sl->row0; layer0 && row < sl->row0 + sl->nrows; row++) qkv_count[row]++;
                } else if (strstr(sl->name, ".mlp.gate_up_proj.weight")) {
                    ck_assert_int_eq(sl->full_rows, 2 * inter);
                    const int up = !strcmp(sl->part, "mlp.up_proj.weight");
                    ck_assert(up || !strcmp(sl->part, "mlp.gate_proj.weight"));
                    ck_assert(sl->row0 >= up * inter && sl->row0 + sl->nrows <= (up + 1) * inter);
                    for (int64_t row = sl->row0; layer0 && row < sl->row0 + sl->nrows; row++) gate_up_count[row]++;
                } else if (!strncmp(sl->name, "model.layers.", 13)) {
                    ck_assert_str_eq(sl->part, strchr(sl->name + 13, '.') + 1);
                } else {
                    ck_assert_str_eq(sl->part, "");
                }
            }
            free(w);
        }
        for (int row = 0; row < 192; row++)
            ck_assert_msg(qkv_count[row] == (row < q_rows ? 1 : reps), "tp %d: qkv_proj row %d read %d times", tp,
                          row, qkv_count[row]);
        for (int row = 0; row < 704; row++) ck_assert_int_eq(gate_up_count[row], 1);
    }
}
END_TEST

START_TEST(row_parallel_bias_on_rank_0)
{
    tp_model_config c = synth_config(&synths[2]); /* mqa-biases: o and down biases */
    for (int r = 0; r < 2; r++) {
        tp_shard_plan p;
        tp_weight_slice *w;
        int n;
        ck_assert_int_eq(tp_shard_plan_make(&c, 2, 1, r, 0, &p), TP_OK);
        ck_assert_int_eq(tp_shard_plan_weights(&c, &p, &w, &n), TP_OK);
        int has_o = find_slice(w, n, "model.layers.0.self_attn.o_proj.bias") != NULL;
        int has_down = find_slice(w, n, "model.layers.5.mlp.down_proj.bias") != NULL;
        ck_assert_int_eq(has_o, r == 0);
        ck_assert_int_eq(has_down, r == 0);
        ck_assert_ptr_nonnull(find_slice(w, n, "model.layers.5.mlp.up_proj.bias"));
        free(w);
    }
}
END_TEST

START_TEST(tiny_vocab_leaves_ranks_empty)
{
    tp_model_config c = synth_config(&synths[2]); /* vocab 5 */
    int64_t covered = 0;
    for (int r = 0; r < 8; r++) {
        tp_shard_plan p;
        ck_assert_int_eq(tp_shard_plan_make(&c, 8, 1, r, 0, &p), TP_OK);
        ck_assert(p.vocab.begin <= p.vocab.end && p.vocab.end <= 5);
        ck_assert_int_eq(p.vocab.begin, covered); /* contiguous, in rank order */
        covered = p.vocab.end;
    }
    ck_assert_int_eq(covered, 5);
}
END_TEST

START_TEST(bad_arguments)
{
    tp_model_config c = synth_config(&llama3_like);
    tp_shard_plan p;
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_validate(&c, 0, 1), TP_ERR_INVALID_ARG);
    ck_assert_str_eq(tp_error_message(), "--tp must be at least 1, got 0");
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_validate(&c, 1, -1), TP_ERR_INVALID_ARG);
    ck_assert_str_eq(tp_error_message(), "--pp must be at least 1, got -1");
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_validate(&c, 3, 1), TP_ERR_INVALID_ARG);
    ck_assert_str_eq(tp_error_message(),
                     "num_attention_heads 8 is not divisible by --tp 3; choose a --tp that "
                     "divides 8");
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_validate(&c, 1, 5), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "model has 4 layers, fewer than --pp 5"));
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_make(&c, 2, 2, 2, 0, &p), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "outside the 2 x 2 grid"));
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_make(&c, 2, 2, 0, -1, &p), TP_ERR_INVALID_ARG);
    /* reliability.md C4: num_key_value_heads=8 with --tp 3 */
    c.n_heads = 24;
    c.n_kv_heads = 8;
    c.intermediate_size = 360;
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_validate(&c, 3, 1), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(),
                                 "num_key_value_heads 8 does not split over --tp 3"));
    /* a config that never went through tp_model_config_parse */
    c.n_kv_heads = 0;
    tp_error_clear();
    ck_assert_int_eq(tp_shard_plan_validate(&c, 1, 1), TP_ERR_INTERNAL);
}
END_TEST

static Suite *shard_plan_suite(void)
{
    Suite *s = suite_create("shard_plan");
    TCase *tc = tcase_create("grids");
    tcase_set_timeout(tc, 120); /* exhaustive element counting under sanitizers */
    tcase_add_loop_test(tc, synthetic_grids, 0, (int)TP_ARRAY_LEN(synths));
    tcase_add_loop_test(tc, shared_model_grids, 0, (int)TP_ARRAY_LEN(shared_models));
    suite_add_tcase(s, tc);

    tc = tcase_create("spot");
    tcase_add_test(tc, spot_check_slices);
    tcase_add_test(tc, phi3_fused_slices);
    tcase_add_test(tc, row_parallel_bias_on_rank_0);
    tcase_add_test(tc, tiny_vocab_leaves_ranks_empty);
    tcase_add_test(tc, bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(shard_plan_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failures = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failures ? 1 : 0;
}
