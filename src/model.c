/*
 * model.c: loading one rank's weight slices onto a backend (fused q|k|v and gate|up),
 * the RoPE frequencies, the KV cache and the step buffers.
 */
#include "model.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

/* YaRN's correction range (transformers' find_correction_range): the dims whose wavelength
 * turns beta_fast (lo) and beta_slow (hi) times over the pretraining length */
static void yarn_range(const tp_model_config *cfg, double *lo, double *hi)
{
    const tp_rope_scaling *rs = &cfg->rope_scaling;
    const double dim = (double)cfg->head_dim, base = cfg->rope_theta, len = (double)rs->original_max_position;
    double l = dim * log(len / (rs->beta_fast * 2.0 * M_PI)) / (2.0 * log(base));
    double h = dim * log(len / (rs->beta_slow * 2.0 * M_PI)) / (2.0 * log(base));
    if (rs->truncate) l = floor(l), h = ceil(h);
    *lo = l > 0 ? l : 0;
    *hi = h < dim - 1 ? h : dim - 1;
    if (*lo == *hi) *hi += 0.001; /* HF's guard against a zero-width ramp */
}

void tp_rope_inv_freq(const tp_model_config *cfg, float *inv_freq)
{
    const int64_t half = cfg->head_dim / 2;
    const tp_rope_scaling *rs = &cfg->rope_scaling;
    double ylo = 0, yhi = 1;
    if (rs->type == TP_ROPE_YARN) yarn_range(cfg, &ylo, &yhi);
    for (int64_t j = 0; j < half; j++) {
        /* HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32 */
        float expo = (float)(2 * j) / (float)cfg->head_dim;
        float f = (float)(1.0 / pow(cfg->rope_theta, (double)expo));
        if (rs->type == TP_ROPE_LINEAR) {
            f = (float)(f / rs->factor);
        } else if (rs->type == TP_ROPE_LLAMA3) {
            /* transformers' _compute_llama3_parameters */
            double old_len = (double)rs->original_max_position;
            double low_wavelen = old_len / rs->low_freq_factor;
            double high_wavelen = old_len / rs->high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = (float)(f / rs->factor);
            } else if (wavelen >= high_wavelen) { /* medium: blend */
                double smooth = (old_len / wavelen - rs->low_freq_factor) /
                                (rs->high_freq_factor - rs->low_freq_factor);
                f = (float)((1.0 - smooth) * f / rs->factor + smooth * f);
            }
        } else if (rs->type == TP_ROPE_YARN) {
            /* transformers' _compute_yarn_parameters, in float32 as there: dims below the ramp
             * keep their frequency (extrapolation), dims past it are divided by factor */
            float ramp = (float)(((double)j - ylo) / (yhi - ylo));
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            const float keep = 1.0f - ramp, interp = (float)(f / rs->factor);
            f = interp * (1.0f - keep) + f * keep;
        }
        inv_freq[j] = f;
    }
}

// ----------------------------------------------------------------------------
// backend allocations, tracked so that one call frees them all

static tp_status model_alloc(tp_model *m, size_t bytes, void **out)
{
    if (m->n_allocations == m->cap_allocations) {
        int cap = m->cap_allocations ? 2 * m->cap_allocations : 64;
        void **p = realloc(m->allocations, (size_t)cap * sizeof *p);
        if (!p) return tp_error(TP_ERR_OOM, "out of memory tracking buffers");
        m->allocations = p;
        m->cap_allocations = cap;
    }
    tp_status st = m->backend->ops->alloc(m->backend, bytes, out);
    if (st != TP_OK) {
        /* say what did not fit and which flags make room, keeping the backend's reason */
        char cause[512];
        snprintf(cause, sizeof cause, "%s", tp_error_message());
        tp_error_clear();
        int gpu = strcmp(m->backend->name, "cpu") != 0;
        return tp_error(st == TP_ERR_OOM || st == TP_ERR_CUDA ? TP_ERR_OOM : st,
                        "%s: %zu more bytes for %s did not fit (%s, after %lld bytes of weights); make room "
                        "with more ranks (--tp, --pp), %s, or a smaller --max-num-seqs / "
                        "--max-num-batched-tokens / --max-model-len",
                        m->backend->name, bytes, m->alloc_what ? m->alloc_what : "buffers", cause,
                        (long long)m->weight_bytes,
                        gpu ? "a higher --gpu-memory-utilization" : "a smaller --kv-cache-memory");
    }
    m->allocations[m->n_allocations++] = *out;
    m->allocated_bytes += (int64_t)bytes;
    return TP_OK;
}

static tp_status alloc_tensor(tp_model *m, tp_dtype dt, int64_t rows, int64_t cols, tp_tensor *t)
{
    void *p = NULL;
    TP_CHECK(model_alloc(m, (size_t)(rows * cols) * tp_dtype_size(dt), &p));
    *t = tp_tensor_make(p, dt, rows, cols);
    return TP_OK;
}

// ----------------------------------------------------------------------------
// weights: each slice the shard plan lists goes to a place in a (fused) tensor

#define STAGING_CHUNK ((size_t)64 << 20) /* bytes of one pinned staging buffer's fill */

/* TPINFER_LOAD_CHUNK=BYTES: a smaller fill, for the tests of the chunked upload. */
static size_t staging_chunk(void)
{
    const char *v = getenv("TPINFER_LOAD_CHUNK");
    long long n = v ? atoll(v) : 0;
    return n > 0 ? (size_t)n : STAGING_CHUNK;
}

typedef struct placement {
    tp_tensor *dst;
    int64_t row0; /* first row of dst the slice fills */
} placement;

/* Allocate a layer's tensors (fused shapes) once its first slice arrives. */
static tp_status alloc_layer(tp_model *m, tp_layer_weights *L)
{
    const tp_model_dims *d = &m->dims;
    const tp_model_config *c = &m->cfg;
    tp_dtype dt = m->weight_dtype;
    int64_t qkv_rows = (d->hq + 2 * d->hk) * d->hd;
    TP_CHECK(alloc_tensor(m, dt, 1, d->d, &L->attn_norm));
    TP_CHECK(alloc_tensor(m, dt, qkv_rows, d->d, &L->qkv));
    if (c->attention_bias) TP_CHECK(alloc_tensor(m, dt, 1, qkv_rows, &L->qkv_bias));
    if (c->qk_norm) {
        TP_CHECK(alloc_tensor(m, dt, 1, d->hd, &L->q_norm));
        TP_CHECK(alloc_tensor(m, dt, 1, d->hd, &L->k_norm));
    }
    TP_CHECK(alloc_tensor(m, dt, d->d, d->hq * d->hd, &L->o));
    if (c->o_bias && m->plan.tp_rank == 0) TP_CHECK(alloc_tensor(m, dt, 1, d->d, &L->o_bias));
    TP_CHECK(alloc_tensor(m, dt, 1, d->d, &L->mlp_norm));
    if (c->block_output_norms) {
        TP_CHECK(alloc_tensor(m, dt, 1, d->d, &L->post_attn_norm));
        TP_CHECK(alloc_tensor(m, dt, 1, d->d, &L->post_mlp_norm));
    }
    TP_CHECK(alloc_tensor(m, dt, 2 * d->m, d->d, &L->gate_up));
    if (c->mlp_bias) TP_CHECK(alloc_tensor(m, dt, 1, 2 * d->m, &L->gate_up_bias));
    TP_CHECK(alloc_tensor(m, dt, d->d, d->m, &L->down));
    if (c->mlp_bias && m->plan.tp_rank == 0) TP_CHECK(alloc_tensor(m, dt, 1, d->d, &L->down_bias));
    return TP_OK;
}

/* Where slice s goes. 1-D tensors (norms, biases) are stored as one row [1, n], so
 * their slice rows become columns of that row: placement row0 is then a column. */
static tp_status place(tp_model *m, const tp_weight_slice *s, placement *p, int *is_vector)
{
    const tp_model_dims *d = &m->dims;
    *is_vector = s->full_cols == 1;
    p->row0 = 0;
    if (!strcmp(s->name, "model.embed_tokens.weight")) {
        /* listed first for the embedding, again (tied) for the LM head */
        p->dst = m->plan.has_embedding && !m->embed.data ? &m->embed : &m->lm_head;
        return TP_OK;
    }
    if (!strcmp(s->name, "lm_head.weight")) { p->dst = &m->lm_head; return TP_OK; }
    if (!strcmp(s->name, "model.norm.weight")) { p->dst = &m->final_norm; return TP_OK; }
    long long layer;
    int off = 0;
    if (sscanf(s->name, "model.layers.%lld.%n", &layer, &off) != 1 || off == 0 ||
        layer < m->plan.layers.begin || layer >= m->plan.layers.end)
        return tp_error(TP_ERR_INTERNAL, "shard plan lists %s, which this stage does not hold", s->name);
    tp_layer_weights *L = &m->layers[layer - m->plan.layers.begin];
    if (!L->qkv.data) TP_CHECK(alloc_layer(m, L));
    const char *n = s->part; /* Llama's name of the part, for fused tensors too */
    int64_t q = d->hq * d->hd, k = d->hk * d->hd;
    static const char *const names[] = {
        "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.q_proj.bias",
        "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.q_norm.weight",
        "self_attn.k_norm.weight", "self_attn.o_proj.weight", "self_attn.o_proj.bias",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
        "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"};
    tp_tensor *dst[] = {&L->attn_norm, &L->mlp_norm, &L->qkv, &L->qkv, &L->qkv, &L->qkv_bias,
                        &L->qkv_bias, &L->qkv_bias, &L->q_norm, &L->k_norm, &L->o, &L->o_bias,
                        &L->gate_up, &L->gate_up, &L->down, &L->gate_up_bias, &L->gate_up_bias,
                        &L->down_bias};
    int64_t row0[] = {0, 0, 0, q, q + k, 0, q, q + k, 0, 0, 0, 0, 0, d->m, 0, 0, d->m, 0};
    if (m->cfg.block_output_norms) { /* Gemma 2's and 3's names: post_attention_layernorm norms the attention's output */
        static const char *const gemma[] = {"post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
                                            "post_feedforward_layernorm.weight"};
        tp_tensor *to[] = {&L->post_attn_norm, &L->mlp_norm, &L->post_mlp_norm};
        for (size_t i = 0; i < TP_ARRAY_LEN(gemma); i++)
            if (!strcmp(n, gemma[i])) {
                p->dst = to[i];
                return TP_OK;
            }
    }
    for (size_t i = 0; i < TP_ARRAY_LEN(names); i++)
        if (!strcmp(n, names[i])) {
            p->dst = dst[i];
            p->row0 = row0[i];
            return TP_OK;
        }
    return tp_error(TP_ERR_INTERNAL, "no place for weight %s", s->name);
}

/* The embedding's multiplier as the model applies it: Gemma's sqrt(hidden_size) rounded to the
 * weights' dtype first (Gemma3TextScaledWordEmbedding), Granite's as configured */
static double embedding_multiplier(const tp_model *m)
{
    const double e = m->cfg.embedding_multiplier;
    if (!m->cfg.gemma_norms) return e;
    float f = (float)e, r;
    char rounded[4];
    tp_convert(rounded, m->weight_dtype, &f, TP_DTYPE_F32, 1);
    tp_convert(&r, TP_DTYPE_F32, rounded, m->weight_dtype, 1);
    return r;
}

/* Multipliers folded into the weights as they load (each scales a product that is linear in
 * its weights): the embedding's rows by embedding_multiplier (Granite's, Gemma's), o_proj's and
 * down_proj's weights and biases by residual_multiplier, the LM head by 1 / logits_scaling or,
 * where the head is the embedding itself (tied, one stage), the final norm by
 * 1 / (logits_scaling * embedding_multiplier). 1 for the other architectures. */
static double fold_factor(const tp_model *m, const tp_weight_slice *s, const placement *p)
{
    const tp_model_config *c = &m->cfg;
    if (c->arch != TP_ARCH_GRANITE && !c->gemma_norms) return 1.0;
    if (p->dst == &m->embed) return embedding_multiplier(m);
    if (p->dst == &m->lm_head) return 1.0 / c->logits_scaling;
    if (p->dst == &m->final_norm) {
        const int head_is_embedding = c->tie_word_embeddings && m->plan.has_embedding && m->plan.has_lm_head;
        return head_is_embedding ? 1.0 / (c->logits_scaling * embedding_multiplier(m)) : 1.0;
    }
    static const char *const residual[] = {"self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight",
                                           "mlp.down_proj.bias"};
    for (size_t i = 0; i < TP_ARRAY_LEN(residual); i++)
        if (!strcmp(s->part, residual[i])) return c->residual_multiplier;
    return 1.0;
}

static int ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Gemma's norms scale by 1 + weight (in float32, as Gemma3RMSNorm): the 1 is added as they
 * load, so every RMSNorm op stays weight-times */
static double norm_shift(const tp_model *m, const tp_weight_slice *s, const placement *p)
{
    if (!m->cfg.gemma_norms) return 0;
    return p->dst == &m->final_norm || ends_with(s->part, "layernorm.weight") || ends_with(s->part, "_norm.weight");
}

/* n elements of dtype dt at p become (x + shift) * f, in float32 */
static void scale_host(void *p, tp_dtype dt, size_t n, double shift, double f)
{
    float chunk[256];
    for (size_t i = 0; i < n; i += 256) {
        const size_t k = n - i < 256 ? n - i : 256;
        char *at = (char *)p + i * tp_dtype_size(dt);
        tp_convert(chunk, TP_DTYPE_F32, at, dt, k);
        for (size_t j = 0; j < k; j++) chunk[j] = (float)((float)(chunk[j] + shift) * f);
        tp_convert(at, dt, chunk, TP_DTYPE_F32, k);
    }
}

/* Slice s, in chunks of rows through the backend's two staging buffers: reading (and
 * converting) the next chunk from the mapped shard overlaps the copy of this one. */
static tp_status load_slice(tp_model *m, const tp_weights *w, const tp_weight_slice *s)
{
    TP_CHECK(tp_weights_check(w, s->name, s->full_rows, s->full_cols, NULL));
    placement p = {NULL, 0};
    int is_vector = 0;
    TP_CHECK(place(m, s, &p, &is_vector));
    tp_dtype dt = m->weight_dtype;
    size_t bytes = (size_t)(s->nrows * s->ncols) * tp_dtype_size(dt);
    if (!p.dst->data) { /* whole-tensor destinations: embedding, head, final norm */
        if (is_vector) TP_CHECK(alloc_tensor(m, dt, 1, s->nrows, p.dst));
        else TP_CHECK(alloc_tensor(m, dt, s->nrows, s->ncols, p.dst));
    }
    /* a vector slice fills columns [row0, row0 + n) of a [1, n] tensor; a matrix slice
     * fills rows [row0, row0 + nrows) of a matrix whose width is the slice's */
    int64_t elem_offset = is_vector ? p.row0 : p.row0 * p.dst->stride;
    int64_t cap = p.dst->rows * p.dst->stride;
    int64_t n = s->nrows * s->ncols;
    if ((!is_vector && s->ncols != p.dst->cols) || elem_offset + n > cap)
        return tp_error(TP_ERR_INTERNAL, "slice of %s (%lld x %lld) does not fit its buffer",
                        s->name, (long long)s->nrows, (long long)s->ncols);
    char *dst = (char *)p.dst->data + (size_t)elem_offset * tp_dtype_size(dt);
    tp_backend *b = m->backend;
    m->weight_bytes += (int64_t)bytes;
    const size_t row_bytes = (size_t)s->ncols * tp_dtype_size(dt);
    const double fold = fold_factor(m, s, &p), shift = norm_shift(m, s, &p);
    int64_t rows_per = row_bytes ? (int64_t)(staging_chunk() / row_bytes) : s->nrows;
    if (rows_per < 1) rows_per = 1;
    for (int64_t r = 0; r < s->nrows; r += rows_per) {
        const int64_t nr = s->nrows - r < rows_per ? s->nrows - r : rows_per;
        const size_t chunk = (size_t)nr * row_bytes;
        void *host = NULL;
        TP_CHECK(b->ops->staging(b, chunk, &host));
        tp_slice part = {s->row0 + r, nr, s->col0, s->ncols};
        TP_CHECK(tp_weights_read_slice(w, s->name, part, dt, host));
        if (fold != 1.0 || shift != 0) scale_host(host, dt, (size_t)(nr * s->ncols), shift, fold);
        TP_CHECK(b->ops->upload_staged(b, dst + (size_t)r * row_bytes, host, chunk));
    }
    return TP_OK;
}

int tp_model_warn_unused(const tp_model_config *cfg, const tp_weights *w)
{
    tp_shard_plan whole; /* one rank holding everything: every tensor the config uses */
    tp_weight_slice *used = NULL;
    int n_used = 0;
    if (tp_shard_plan_make(cfg, 1, 1, 0, 0, &whole) != TP_OK || tp_shard_plan_weights(cfg, &whole, &used, &n_used) != TP_OK) {
        tp_error_clear(); /* the load that follows reports what is wrong with the config */
        return 0;
    }
    char *is_used = calloc(w->n_refs ? w->n_refs : 1, 1);
    if (!is_used) {
        free(used);
        return 0; /* a warning's worth of memory: the load reports real shortage */
    }
    for (int j = 0; j < n_used; j++) {
        const tp_weight_ref *r = tp_weights_find(w, used[j].name);
        if (r) is_used[r - w->refs] = 1;
    }
    int unused = 0;
    const char *first = NULL;
    for (size_t i = 0; i < w->n_refs; i++) {
        const char *name = w->refs[i].name;
        if (is_used[i] || w->refs[i].other_part || ends_with(name, "rotary_emb.inv_freq") ||
            (cfg->tie_word_embeddings && !strcmp(name, "lm_head.weight")))
            continue;
        if (!unused++) first = w->refs[i].tensor->name;
    }
    free(is_used);
    if (unused)
        tp_log(TP_LOG_WARN, "%d tensor(s) of %s are not used by its config.json (num_hidden_layers %" PRId64 "), the "
               "first %s: check that config.json belongs to these weights", unused, w->dir, cfg->n_layers, first);
    free(used);
    return unused;
}

tp_status tp_model_load(tp_model *m, const tp_model_config *cfg, const tp_shard_plan *plan,
                        const tp_weights *w, tp_backend *b, tp_dtype weight_dtype, int (*stop)(void))
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->plan = *plan;
    m->backend = b;
    m->weight_dtype = weight_dtype;
    m->alloc_what = "this rank's weights";
    const char *skip = getenv("TPINFER_BENCH_SKIP");
    TP_CHECK(tp_bench_skip_parse(skip, &m->bench_skip));
    if (m->bench_skip)
        tp_log(TP_LOG_WARN, "TPINFER_BENCH_SKIP=%s: every step leaves these parts out; the output is wrong (a "
               "benchmark setting)", skip);
    tp_model_dims *d = &m->dims;
    d->d = cfg->hidden_size;
    d->hq = plan->q_heads.end - plan->q_heads.begin;
    d->hk = plan->kv_heads.end - plan->kv_heads.begin;
    d->hd = cfg->head_dim;
    d->m = plan->mlp.end - plan->mlp.begin;
    d->vocab = plan->vocab.end - plan->vocab.begin;
    d->vocab_pad = TP_CEIL_DIV(cfg->vocab_size, plan->tp);
    d->n_layers = plan->layers.end - plan->layers.begin;

    tp_weight_slice *slices = NULL;
    int n = 0;
    tp_status st;
    m->layers = calloc((size_t)(d->n_layers ? d->n_layers : 1), sizeof *m->layers);
    if (!m->layers) return tp_error(TP_ERR_OOM, "out of memory");
    TP_CHECK_GOTO(tp_shard_plan_weights(cfg, plan, &slices, &n), st, fail);
    for (int i = 0; i < n; i++) {
        if (stop && stop()) {
            st = tp_error(TP_ERR_IO, "the weights' load was stopped (a signal) at tensor %d of %d", i, n);
            goto fail;
        }
        /* a one-stage pipeline with tied embeddings reads the embedding once */
        if (cfg->tie_word_embeddings && plan->has_embedding && plan->has_lm_head && m->embed.data &&
            !strcmp(slices[i].name, "model.embed_tokens.weight")) {
            m->lm_head = m->embed;
            continue;
        }
        TP_CHECK_GOTO(load_slice(m, w, &slices[i]), st, fail);
    }
    float *inv = malloc((size_t)(d->hd / 2 > 0 ? d->hd / 2 : 1) * sizeof *inv);
    if (!inv) {
        st = tp_error(TP_ERR_OOM, "out of memory");
        goto fail;
    }
    tp_rope_inv_freq(cfg, inv);
    st = model_alloc(m, (size_t)(d->hd / 2) * sizeof(float), (void **)&m->inv_freq);
    if (st == TP_OK) st = b->ops->upload(b, m->inv_freq, inv, (size_t)(d->hd / 2) * sizeof(float));
    if (st == TP_OK && cfg->rope_local_theta > 0) { /* Gemma 3's sliding layers: their own base, unscaled */
        tp_model_config local = *cfg;
        local.rope_theta = cfg->rope_local_theta;
        memset(&local.rope_scaling, 0, sizeof local.rope_scaling);
        local.rope_scaling.type = TP_ROPE_DEFAULT;
        tp_rope_inv_freq(&local, inv);
        st = model_alloc(m, (size_t)(d->hd / 2) * sizeof(float), (void **)&m->inv_freq_local);
        if (st == TP_OK) st = b->ops->upload(b, m->inv_freq_local, inv, (size_t)(d->hd / 2) * sizeof(float));
    }
    free(inv);
    if (st != TP_OK) goto fail;
    TP_CHECK_GOTO(b->ops->synchronize(b), st, fail);
    free(slices);
    return b->ops->staging(b, 0, NULL); /* the staging buffers are not needed again */
fail:
    free(slices);
    (void)b->ops->staging(b, 0, NULL);
    tp_model_free(m);
    return st;
}

void tp_model_free(tp_model *m)
{
    for (int i = 0; i < m->n_allocations; i++) m->backend->ops->free(m->backend, m->allocations[i]);
    free(m->allocations);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

// ----------------------------------------------------------------------------
// KV cache and step buffers

tp_status tp_kv_cache_create(tp_model *m, int32_t n_blocks, int32_t block_size, tp_dtype dtype,
                             tp_kv_cache *kv)
{
    memset(kv, 0, sizeof *kv);
    const tp_model_dims *d = &m->dims;
    kv->layers = calloc((size_t)(d->n_layers ? d->n_layers : 1), sizeof *kv->layers);
    if (!kv->layers) return tp_error(TP_ERR_OOM, "out of memory");
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    m->alloc_what = "the KV cache";
    size_t per = (size_t)n_blocks * (size_t)block_size * (size_t)(d->hk * d->hd) * tp_dtype_size(dtype);
    for (int64_t l = 0; l < d->n_layers; l++) {
        tp_kv_layer *L = &kv->layers[l];
        L->dtype = dtype;
        L->n_blocks = n_blocks;
        L->block_size = block_size;
        L->n_kv_heads = (int32_t)d->hk;
        L->head_dim = (int32_t)d->hd;
        TP_CHECK(model_alloc(m, per, &L->k));
        TP_CHECK(model_alloc(m, per, &L->v));
        /* block 0 zeroed: a padded row of a graph step reads its first position, which must
         * hold finite numbers before any sequence has written there */
        const size_t block0 = (size_t)block_size * (size_t)(d->hk * d->hd) * tp_dtype_size(dtype);
        TP_CHECK(m->backend->ops->memset0(m->backend, L->k, block0 < per ? block0 : per));
        TP_CHECK(m->backend->ops->memset0(m->backend, L->v, block0 < per ? block0 : per));
    }
    return TP_OK;
}

void tp_kv_cache_free(tp_model *m, tp_kv_cache *kv)
{
    (void)m; /* the buffers are the model's: tp_model_free releases them */
    free(kv->layers);
    memset(kv, 0, sizeof *kv);
}

tp_status tp_step_buffers_create(tp_model *m, int32_t T, int32_t L, int32_t max_seqs,
                                 int32_t max_blocks, tp_step_buffers *s)
{
    memset(s, 0, sizeof *s);
    s->prune_last = 1; /* the engine sets what the replica agreed (TPINFER_PRUNE_LAST) */
    const tp_model_dims *d = &m->dims;
    m->alloc_what = "the step buffers";
    const int64_t before = m->allocated_bytes;
    s->max_tokens = T;
    s->max_logits = L;
    s->max_seqs = max_seqs;
    s->max_blocks = max_blocks;
    size_t i32 = sizeof(int32_t);
    /* ids, pos, seq, slot [T] each, the block table, the logit rows [L], take [T] */
    s->meta_cap = 5 * (size_t)T + (size_t)max_seqs * (size_t)max_blocks + (size_t)L;
    TP_CHECK(model_alloc(m, s->meta_cap * i32, (void **)&s->meta));
    s->meta_host = malloc(s->meta_cap * i32);
    if (!s->meta_host) return tp_error(TP_ERR_OOM, "out of memory for the step buffers");
    TP_CHECK(model_alloc(m, 2 * (size_t)L * i32, (void **)&s->argmax_ids));
    TP_CHECK(model_alloc(m, (size_t)m->plan.tp * 2 * (size_t)L * i32, (void **)&s->argmax_all));
    if (m->plan.tp > 1 && m->backend->ops->argmax_merge)
        TP_CHECK(model_alloc(m, (size_t)L * i32, (void **)&s->argmax_merged));
    s->pair_host = malloc((size_t)m->plan.tp * 2 * (size_t)L * i32);
    if (!s->pair_host) return tp_error(TP_ERR_OOM, "out of memory for the step buffers");
    /* a padded decode step: ids, pos, seq, slot, logit rows, take [B] and the table [B, max_blocks] */
    s->pad_host = malloc((6 + (size_t)max_blocks) * (size_t)(max_seqs > 0 ? max_seqs : 1) * i32);
    if (!s->pad_host) return tp_error(TP_ERR_OOM, "out of memory for the step buffers");
    tp_dtype act = m->backend->act_dtype;
    TP_CHECK(alloc_tensor(m, TP_DTYPE_F32, T, d->d, &s->x));
    TP_CHECK(alloc_tensor(m, TP_DTYPE_F32, T, d->d, &s->delta));
    TP_CHECK(alloc_tensor(m, act, T, d->d, &s->xn));
    TP_CHECK(alloc_tensor(m, act, T, (d->hq + 2 * d->hk) * d->hd, &s->qkv));
    TP_CHECK(alloc_tensor(m, act, T, d->hq * d->hd, &s->attn));
    TP_CHECK(alloc_tensor(m, act, T, 2 * d->m, &s->gate_up));
    TP_CHECK(alloc_tensor(m, act, T, d->m, &s->act));
    TP_CHECK(alloc_tensor(m, act, L, d->d, &s->rows));
    TP_CHECK(alloc_tensor(m, TP_DTYPE_F32, L, d->vocab_pad, &s->logits));
    if (m->plan.tp > 1) /* every rank's logits, gathered (at tp 1 the step's own are all) */
        TP_CHECK(alloc_tensor(m, TP_DTYPE_F32, (int64_t)m->plan.tp * L, d->vocab_pad, &s->gathered));
    if (m->bench_skip) { /* a part left out leaves its output as it was: zeros, not what the memory held */
        const tp_tensor *out[] = {&s->x, &s->delta, &s->xn, &s->qkv, &s->attn, &s->gate_up, &s->act, &s->rows,
                                  &s->logits};
        for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
            TP_CHECK(m->backend->ops->memset0(m->backend, out[i]->data,
                                              (size_t)(out[i]->rows * out[i]->cols) * tp_dtype_size(out[i]->dtype)));
    }
    /* the KV cache was sized to leave this much: a buffer added here must be counted there */
    const int64_t used = m->allocated_bytes - before, counted = tp_step_buffers_bytes(m, T, L, max_seqs, max_blocks);
    if (used > counted)
        return tp_error(TP_ERR_INTERNAL, "the step buffers took %lld bytes, more than the %lld that "
                        "tp_step_buffers_bytes counts for the KV cache to leave (src/model.c)", (long long)used,
                        (long long)counted);
    return TP_OK;
}

int64_t tp_step_buffers_bytes(const tp_model *m, int32_t T, int32_t L, int32_t max_seqs, int32_t max_blocks)
{
    const tp_model_dims *d = &m->dims;
    const int64_t a = (int64_t)tp_dtype_size(m->backend->act_dtype), f = 4, tp = m->plan.tp;
    int64_t b = (5 * (int64_t)T + (int64_t)max_seqs * max_blocks + L) * 4 + (1 + tp) * 2 * (int64_t)L * 4;
    if (tp > 1) b += (int64_t)L * 4; /* argmax_merged */
    b += 2 * (int64_t)T * d->d * f;                                           /* x, delta */
    b += (int64_t)T * (d->d + (d->hq + 2 * d->hk) * d->hd + d->hq * d->hd + 3 * d->m) * a; /* xn .. act */
    b += (int64_t)L * d->d * a + (tp > 1 ? 1 + tp : 1) * (int64_t)L * d->vocab_pad * f; /* rows, logits */
    /* the sample op's rules and results, and over tp its re-laid-out logits */
    b += (int64_t)L * (int64_t)(sizeof(tp_sample_row) + sizeof(tp_sample_out));
    if (tp > 1) b += (int64_t)L * m->cfg.vocab_size * f;
    return b + ((int64_t)16 << 20); /* the allocator's rounding of ~16 buffers */
}

void tp_step_buffers_free(tp_model *m, tp_step_buffers *s)
{
    /* the backend buffers are the model's */
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < TP_GRAPH_BUCKETS; i++)
            if (s->graphs[k][i] && m && m->backend && m->backend->ops->graph_free)
                m->backend->ops->graph_free(m->backend, s->graphs[k][i]);
    if (m && m->backend) { /* forward.c's, allocated at first use */
        tp_backend *b = m->backend;
        b->ops->free(b, s->sample_rows);
        b->ops->free(b, s->sample_out);
        b->ops->free(b, s->sample_tokens);
        b->ops->free(b, s->sample_logits);
    }
    free(s->sample_rows_host);
    free(s->pad_host);
    free(s->pair_host);
    free(s->host);
    free(s->meta_host);
    memset(s, 0, sizeof *s);
}
