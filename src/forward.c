/*
 * forward.c: one step of the Llama-family forward pass on one rank, written only
 * against the backend and comm tables. Megatron tensor parallel: q|k|v and gate|up are
 * column-parallel (no communication), o and down are row-parallel and each is followed
 * by one all-reduce; the embedding and the LM head are vocab-parallel.
 */
#include "model.h"

#include "log.h"
#include "util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The parts TPINFER_BENCH_SKIP names. */
static const struct {
    const char *name;
    unsigned bit;
} skip_parts[] = {
    {"embedding", TP_SKIP_EMBEDDING}, {"norm", TP_SKIP_NORM}, {"qkv", TP_SKIP_QKV},
    {"attention", TP_SKIP_ATTENTION}, {"o", TP_SKIP_O},       {"gate_up", TP_SKIP_GATE_UP},
    {"down", TP_SKIP_DOWN},           {"lm_head", TP_SKIP_LM_HEAD}, {"allreduce", TP_SKIP_ALLREDUCE},
};

tp_status tp_bench_skip_parse(const char *list, unsigned *mask)
{
    *mask = 0;
    if (!list) return TP_OK;
    for (const char *p = list; *p;) {
        const size_t n = strcspn(p, ",");
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof skip_parts / sizeof skip_parts[0]; i++)
            if (strlen(skip_parts[i].name) == n && !strncmp(p, skip_parts[i].name, n)) bit = skip_parts[i].bit;
        if (!bit) {
            char names[128] = "";
            for (size_t i = 0; i < sizeof skip_parts / sizeof skip_parts[0]; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                         skip_parts[i].name);
            return tp_error(TP_ERR_INVALID_ARG, "TPINFER_BENCH_SKIP=%s: '%.*s' is not a part of the step; name "
                            "some of %s, separated by commas", list, (int)n, p, names);
        }
        *mask |= bit;
        p += n;
        if (*p == ',') p++;
    }
    return TP_OK;
}

/* Whether every step leaves part out (TPINFER_BENCH_SKIP). */
static int skip(const tp_model *m, unsigned part) { return (m->bench_skip & part) != 0; }

/* Whether a step's o and down products may be added into the residual in their own epilogue
 * (matmul_add) rather than written to delta for the next add_rmsnorm to add: one tensor
 * less to write and read a layer, the same sums (f32 product + f32 residual either way).
 * TPINFER_RESIDUAL_ADD=0 turns it off (for comparison); only where no all-reduce must
 * come between (tp 1), so a rank's choice never changes what its peers exchange. */
static int residual_add(const tp_model *m)
{
    static int on = -1, said;
    if (on < 0) {
        const char *v = getenv("TPINFER_RESIDUAL_ADD");
        on = !(v && !strcmp(v, "0"));
    }
    /* (Gemma norms a block's output before the add: it needs the product on its own) */
    const int yes = on && m->plan.tp == 1 && m->backend->ops->matmul_add != NULL && !m->cfg.block_output_norms;
    if (yes && !said) {
        said = 1;
        tp_log(TP_LOG_DEBUG, "the o and down products are added into the residual where they are made (matmul_add)");
    }
    return yes;
}

/* The row-parallel product of a block (o, down) of in by w: added into the residual x where
 * into_x, else into delta (all-reduced over tp), which the next add_rmsnorm adds; *pending
 * says which. */
static tp_status residual_product(tp_model *m, const tp_tensor *in, const tp_tensor *w, const tp_tensor *bias,
                                  const tp_tensor *post_norm, int into_x, tp_comm *tp, tp_tensor *x, tp_tensor *delta,
                                  int *pending, unsigned part)
{
    tp_backend *b = m->backend;
    if (skip(m, part)) { /* the residual stays; nothing pending */
        *pending = 0;
        return TP_OK;
    }
    if (into_x && !bias) {
        TP_CHECK(b->ops->matmul_add(b, in, w, x));
        *pending = 0;
        return TP_OK;
    }
    TP_CHECK(b->ops->matmul(b, in, w, bias, delta));
    if (m->plan.tp > 1 && !skip(m, TP_SKIP_ALLREDUCE))
        TP_CHECK(tp_comm_all_reduce_sum(tp, delta->data, delta->data, (size_t)(x->rows * m->dims.d), delta->dtype,
                                        b->stream));
    if (post_norm) /* Gemma: the block's whole output normed (after the sum) before the residual add */
        TP_CHECK(b->ops->head_rmsnorm(b, delta, (int32_t)m->dims.d, post_norm, (float)m->cfg.rms_norm_eps));
    *pending = 1;
    return TP_OK;
}

/* What the last stage's logits become on the device: copied whole to the host, the greedy
 * ids (argmax), or the sample op's choices. */
enum step_out { OUT_LOGITS, OUT_IDS, OUT_SAMPLE };

static tp_status sample_enqueue(tp_model *m, tp_step_buffers *buf, int32_t L);

/* The optional parts of a layer are tensors whose data is NULL. */
static const tp_tensor *opt(const tp_tensor *t) { return t->data ? t : NULL; }

/* The step's int32 arrays travel back to back in one upload (one synchronisation on a
 * GPU instead of six); the buffer pointers are set to where each landed. */
static tp_status upload_step(tp_model *m, tp_step_buffers *buf, const tp_step *s)
{
    tp_backend *b = m->backend;
    if (s->n_tokens > buf->max_tokens || s->n_logits > buf->max_logits || s->n_seqs > buf->max_seqs ||
        s->max_blocks > buf->max_blocks)
        return tp_error(TP_ERR_INTERNAL,
                        "step of %d tokens, %d logits, %d sequences exceeds the buffers (%d, %d, %d)",
                        s->n_tokens, s->n_logits, s->n_seqs, buf->max_tokens, buf->max_logits,
                        buf->max_seqs);
    const size_t n = (size_t)s->n_tokens, nb = (size_t)s->n_seqs * (size_t)s->max_blocks;
    /* take last: the others keep their places, which a recorded graph reads */
    const int32_t *src[] = {s->ids, s->pos, s->seq, s->slot, s->block_table, s->logit_rows, s->take};
    int32_t **dst[] = {&buf->ids, &buf->pos, &buf->seq, &buf->slot, &buf->block_table, &buf->logit_rows, &buf->take};
    const size_t len[] = {n, n, n, n, nb, (size_t)s->n_logits, s->take ? n : 0};
    size_t at = 0;
    for (int i = 0; i < 7; i++) {
        if (len[i] && src[i]) memcpy(buf->meta_host + at, src[i], len[i] * sizeof(int32_t));
        *dst[i] = buf->meta + at;
        at += len[i];
    }
    TP_CHECK(b->ops->upload(b, buf->meta, buf->meta_host, at * sizeof(int32_t)));
    if (!s->take) return TP_OK;
    if (!b->ops->take_ids) return tp_error(TP_ERR_UNAVAILABLE, "a step takes ids from the step before, but the %s "
                                           "backend has no take_ids", b->name);
    return b->ops->take_ids(b, buf->ids, buf->chosen, buf->chosen_rows, buf->chosen_stride, buf->take, s->n_tokens);
}

/* x = embedding of the ids; each TP rank holds a vocab slice, the all-reduce adds the
 * rows the others looked up. */
static tp_status embed(tp_model *m, tp_step_buffers *buf, int32_t T, tp_comm *tp, tp_tensor *x)
{
    tp_backend *b = m->backend;
    if (!skip(m, TP_SKIP_EMBEDDING))
        TP_CHECK(b->ops->embedding(b, buf->ids, T, &m->embed, m->plan.vocab.begin, x));
    if (m->plan.tp > 1)
        TP_CHECK(tp_comm_all_reduce_sum(tp, x->data, x->data, (size_t)(T * m->dims.d), x->dtype, b->stream));
    return TP_OK;
}

/* Layer l of this stage's rope frequencies: Gemma 3's sliding layers have a base of their own */
static const float *layer_inv_freq(const tp_model *m, int64_t l)
{
    return m->inv_freq_local && m->cfg.local_rope[m->plan.layers.begin + l] ? m->inv_freq_local : m->inv_freq;
}

/* Layer l of this stage's sliding window (0: it attends to the whole context) */
static int32_t layer_window(const tp_model *m, int64_t l)
{
    return m->cfg.sliding_layer[m->plan.layers.begin + l] ? (int32_t)m->cfg.sliding_window : 0;
}

/* keep (backend memory, R of the T rows) where only those rows go on past the attention
 * (the model's last layer in a step with fewer logit rows than tokens: every token's keys
 * and values are stored, then the o projection, the MLP and the logits take the R rows).
 * They are gathered into buffers free by then (the residual into delta's, the attention's
 * output into qkv's) and o's product goes to x's: on return *x and *delta are [R, d] views.
 * into_x: o's product may go into the residual (residual_product). */
static tp_status attention_block(tp_model *m, const tp_layer_weights *L, const float *inv_freq, tp_kv_layer *cache,
                                 const tp_attn_batch *ab, tp_step_buffers *buf, int32_t T,
                                 const int32_t *pos, tp_comm *tp, tp_tensor *x, tp_tensor *delta,
                                 int *pending, int into_x, const int32_t *keep, int32_t R)
{
    tp_backend *b = m->backend;
    const tp_model_dims *d = &m->dims;
    const float eps = (float)m->cfg.rms_norm_eps;
    tp_tensor xn = tp_tensor_rows(&buf->xn, 0, T), qkv = tp_tensor_rows(&buf->qkv, 0, T);
    tp_tensor attn = tp_tensor_rows(&buf->attn, 0, T);
    if (!skip(m, TP_SKIP_NORM))
        TP_CHECK(b->ops->add_rmsnorm(b, x, *pending ? delta : NULL, &L->attn_norm, eps, &xn));
    *pending = 0;
    if (!skip(m, TP_SKIP_QKV)) TP_CHECK(b->ops->matmul(b, &xn, &L->qkv, opt(&L->qkv_bias), &qkv));
    tp_tensor q = tp_tensor_cols(&qkv, 0, d->hq * d->hd);
    tp_tensor k = tp_tensor_cols(&qkv, d->hq * d->hd, d->hk * d->hd);
    tp_tensor v = tp_tensor_cols(&qkv, (d->hq + d->hk) * d->hd, d->hk * d->hd);
    /* YaRN's attention factor multiplies HF's cos and sin, so q and k each: the scores by its square;
     * Granite's attention_multiplier stands for 1 / sqrt(head_dim) */
    const double af = m->cfg.rope_scaling.type == TP_ROPE_YARN ? m->cfg.rope_scaling.attention_factor : 1.0;
    const double base = m->cfg.attention_multiplier > 0 ? m->cfg.attention_multiplier : 1 / sqrt((double)d->hd);
    const float scale = (float)(af * af * base);
    if (skip(m, TP_SKIP_ATTENTION)) {
        /* attn keeps what it held */
    } else if (b->ops->qk_rope_attention) { /* in one pass where the backend can (a decode step on a GPU) */
        TP_CHECK(b->ops->qk_rope_attention(b, &q, &k, &v, opt(&L->q_norm), opt(&L->k_norm), eps, (int32_t)d->hd,
                                           inv_freq, cache, ab, (int32_t)d->hq, scale, &attn));
    } else {
        if (b->ops->qk_rope_store) {
            TP_CHECK(b->ops->qk_rope_store(b, &q, &k, &v, opt(&L->q_norm), opt(&L->k_norm), eps, (int32_t)d->hd,
                                           inv_freq, cache, ab));
        } else {
            if (L->q_norm.data) {
                TP_CHECK(b->ops->head_rmsnorm(b, &q, (int32_t)d->hd, &L->q_norm, eps));
                TP_CHECK(b->ops->head_rmsnorm(b, &k, (int32_t)d->hd, &L->k_norm, eps));
            }
            TP_CHECK(b->ops->rope(b, &q, (int32_t)d->hd, pos, inv_freq));
            TP_CHECK(b->ops->rope(b, &k, (int32_t)d->hd, pos, inv_freq));
            TP_CHECK(b->ops->kv_store(b, &k, &v, cache, ab));
        }
        TP_CHECK(b->ops->attention(b, &q, cache, ab, (int32_t)d->hq, scale, &attn));
    }
    if (keep) {
        tp_tensor x_kept = tp_tensor_make(buf->delta.data, TP_DTYPE_F32, R, d->d);
        tp_tensor attn_kept = tp_tensor_make(buf->qkv.data, attn.dtype, R, d->hq * d->hd);
        if (R > 0) {
            TP_CHECK(b->ops->gather_rows(b, x, keep, R, &x_kept));
            TP_CHECK(b->ops->gather_rows(b, &attn, keep, R, &attn_kept));
        }
        *x = x_kept;
        *delta = tp_tensor_make(buf->x.data, TP_DTYPE_F32, R, d->d);
        attn = attn_kept;
        T = R;
        if (R == 0) return TP_OK; /* no row samples: nothing past the keys and values */
    }
    return residual_product(m, &attn, &L->o, opt(&L->o_bias), opt(&L->post_attn_norm), into_x, tp, x, delta, pending,
                            TP_SKIP_O);
}

/* into_x: the down product may go into the residual (residual_product). */
static tp_status mlp_block(tp_model *m, const tp_layer_weights *L, tp_step_buffers *buf, int32_t T,
                           tp_comm *tp, tp_tensor *x, tp_tensor *delta, int *pending, int into_x)
{
    tp_backend *b = m->backend;
    const tp_model_dims *d = &m->dims;
    tp_tensor xn = tp_tensor_rows(&buf->xn, 0, T), gu = tp_tensor_rows(&buf->gate_up, 0, T);
    tp_tensor act = tp_tensor_rows(&buf->act, 0, T);
    if (!skip(m, TP_SKIP_NORM))
        TP_CHECK(b->ops->add_rmsnorm(b, x, *pending ? delta : NULL, &L->mlp_norm, (float)m->cfg.rms_norm_eps, &xn));
    *pending = 0;
    if (skip(m, TP_SKIP_GATE_UP)) {
        /* act keeps what it held */
    } else if (b->ops->matmul_swiglu && m->cfg.mlp_act == TP_ACT_SILU) {
        TP_CHECK(b->ops->matmul_swiglu(b, &xn, &L->gate_up, opt(&L->gate_up_bias), &gu, &act));
    } else {
        TP_CHECK(b->ops->matmul(b, &xn, &L->gate_up, opt(&L->gate_up_bias), &gu));
        tp_tensor gate = tp_tensor_cols(&gu, 0, d->m), up = tp_tensor_cols(&gu, d->m, d->m);
        if (m->cfg.mlp_act == TP_ACT_GELU_TANH) TP_CHECK(b->ops->geglu(b, &gate, &up, &act));
        else TP_CHECK(b->ops->swiglu(b, &gate, &up, &act));
    }
    return residual_product(m, &act, &L->down, opt(&L->down_bias), opt(&L->post_mlp_norm), into_x, tp, x, delta,
                            pending, TP_SKIP_DOWN);
}

/* Final norm of the rows that sample, this rank's vocab slice of their logits, then the
 * greedy choice on the device (OUT_IDS), or the all-gather that gives every TP rank the
 * whole vocabulary (and, OUT_SAMPLE, the sample op). T tokens, L logit rows: the step's
 * logit_rows of them, or (in_order) the first L (a decode step's, or rows kept already). */
static tp_status logits_enqueue(tp_model *m, tp_step_buffers *buf, int32_t T, int32_t L, tp_comm *tp,
                                tp_tensor *x, tp_tensor *delta, int pending, int out, int in_order)
{
    tp_backend *b = m->backend;
    const tp_model_dims *d = &m->dims;
    if (L == 0) return TP_OK;
    tp_tensor xn = tp_tensor_rows(&buf->xn, 0, T), rows = tp_tensor_rows(&buf->rows, 0, L);
    if (!skip(m, TP_SKIP_NORM))
        TP_CHECK(b->ops->add_rmsnorm(b, x, pending ? delta : NULL, &m->final_norm, (float)m->cfg.rms_norm_eps, &xn));
    if (in_order) rows = tp_tensor_rows(&xn, 0, L);
    else TP_CHECK(b->ops->gather_rows(b, &xn, buf->logit_rows, L, &rows));
    /* [L, vocab_pad]: the padding columns past this rank's slice stay zero */
    tp_tensor lg = tp_tensor_rows(&buf->logits, 0, L);
    if (d->vocab < d->vocab_pad)
        TP_CHECK(b->ops->memset0(b, lg.data, (size_t)(L * d->vocab_pad) * sizeof(float)));
    if (d->vocab > 0 && !skip(m, TP_SKIP_LM_HEAD)) {
        tp_tensor part = tp_tensor_cols(&lg, 0, d->vocab);
        TP_CHECK(b->ops->matmul(b, &rows, &m->lm_head, NULL, &part));
        if (m->cfg.final_softcap > 0) TP_CHECK(b->ops->softcap(b, &part, (float)m->cfg.final_softcap));
    }
    if (out == OUT_IDS) {
        /* each rank's winner of its slice and its value, [L ids | L values]; over tp the
         * ranks swap those pairs instead of whole rows of logits */
        tp_tensor mine = tp_tensor_cols(&lg, 0, d->vocab);
        const int n_tp = m->plan.tp;
        TP_CHECK(b->ops->argmax(b, &mine, buf->argmax_ids, NULL, n_tp > 1 ? (float *)(buf->argmax_ids + L) : NULL));
        if (n_tp > 1) {
            TP_CHECK(tp_comm_all_gather(tp, buf->argmax_ids, buf->argmax_all, (size_t)(2 * L), TP_DTYPE_I32, b->stream));
            /* the winners compared on the device: only ids come back, and a step enqueued
             * ahead can take them */
            if (buf->argmax_merged)
                TP_CHECK(b->ops->argmax_merge(b, buf->argmax_all, n_tp, L, L, d->vocab_pad, buf->argmax_merged));
        }
    } else {
        if (m->plan.tp > 1)
            TP_CHECK(tp_comm_all_gather(tp, lg.data, buf->gathered.data, (size_t)(L * d->vocab_pad), TP_DTYPE_F32,
                                        b->stream));
        if (out == OUT_SAMPLE) TP_CHECK(sample_enqueue(m, buf, L));
    }
    return TP_OK;
}

/* The first n of the L logit rows the step computed, as host [n, vocab]. Gathered over
 * tp they are [tp][L][vocab_pad]: rank r's columns start at r * vocab_pad. One copy per
 * rank's block (row-by-row copies would cost a synchronisation each), then a re-layout. */
static tp_status logits_read(tp_model *m, tp_step_buffers *buf, int32_t L, int32_t n, float *logits_host)
{
    tp_backend *b = m->backend;
    const int64_t V = m->cfg.vocab_size, P = m->dims.vocab_pad;
    const int n_tp = m->plan.tp;
    if (n == 0) return TP_OK;
    if (n_tp == 1 && P == V) {
        TP_CHECK(b->ops->download(b, logits_host, buf->logits.data, (size_t)n * (size_t)V * sizeof(float)));
        return b->ops->synchronize(b);
    }
    const float *all = n_tp > 1 ? buf->gathered.data : buf->logits.data;
    size_t need = (size_t)n_tp * (size_t)n * (size_t)P;
    if (need > buf->host_cap) {
        float *p = realloc(buf->host, need * sizeof *p);
        if (!p) return tp_error(TP_ERR_OOM, "out of memory for %d rows of logits", n);
        buf->host = p;
        buf->host_cap = need;
    }
    for (int r = 0; r < n_tp; r++)
        TP_CHECK(b->ops->download(b, buf->host + (size_t)r * (size_t)n * (size_t)P,
                                  all + (size_t)r * (size_t)L * (size_t)P, (size_t)n * (size_t)P * sizeof(float)));
    TP_CHECK(b->ops->synchronize(b));
    for (int r = 0; r < n_tp; r++) {
        int64_t c0 = r * P, nc = V - c0 < P ? V - c0 : P;
        if (nc <= 0) break;
        for (int32_t i = 0; i < n; i++)
            memcpy(logits_host + (size_t)i * (size_t)V + (size_t)c0,
                   buf->host + ((size_t)r * (size_t)n + (size_t)i) * (size_t)P, (size_t)nc * sizeof(float));
    }
    return TP_OK;
}

/* The greedy ids of the first n of the step's L logit rows. Over tp: rank r's pair block
 * [L ids | L values] holds its slice's winners (columns from r * vocab_pad); the largest
 * value wins, the lower rank on ties, which is the lower column as argmax's rule wants. */
static tp_status ids_read(tp_model *m, tp_step_buffers *buf, int32_t L, int32_t n, int32_t *ids_host)
{
    tp_backend *b = m->backend;
    const int n_tp = m->plan.tp;
    if (n_tp == 1 || buf->argmax_merged) {
        TP_CHECK(b->ops->download(b, ids_host, n_tp == 1 ? buf->argmax_ids : buf->argmax_merged,
                                  (size_t)n * sizeof(int32_t)));
        return b->ops->synchronize(b);
    }
    TP_CHECK(b->ops->download(b, buf->pair_host, buf->argmax_all, (size_t)n_tp * 2 * (size_t)L * sizeof(int32_t)));
    TP_CHECK(b->ops->synchronize(b));
    tp_argmax_merge(buf->pair_host, n_tp, L, n, m->dims.vocab_pad, ids_host);
    return TP_OK;
}

/* Sampling on the device, before the step is enqueued: the rules of the step's n rows and
 * of L - n padding rows (greedy) and the rows' tokens go up to buffers at fixed addresses, so
 * that a recorded graph reads each step's. A larger token buffer moves, and the graphs that
 * sample are dropped with the old one. */
static tp_status sample_prepare(tp_model *m, tp_step_buffers *buf, int32_t n, int32_t L, const tp_sample_request *rq)
{
    tp_backend *b = m->backend;
    if (!buf->sample_rows) {
        const size_t rows = (size_t)buf->max_logits;
        TP_CHECK(b->ops->alloc(b, rows * sizeof(tp_sample_row), (void **)&buf->sample_rows));
        TP_CHECK(b->ops->alloc(b, rows * sizeof(tp_sample_out), (void **)&buf->sample_out));
        buf->sample_rows_host = malloc(rows * sizeof(tp_sample_row));
        if (!buf->sample_rows_host) return tp_error(TP_ERR_OOM, "out of memory for the sampling rules of a step");
        if (m->plan.tp > 1)
            TP_CHECK(b->ops->alloc(b, rows * (size_t)m->cfg.vocab_size * sizeof(float), (void **)&buf->sample_logits));
    }
    if ((size_t)rq->n_tokens > buf->sample_tokens_cap || !buf->sample_tokens) {
        const size_t cap = 2 * (size_t)rq->n_tokens + 1024;
        for (int i = 0; i < TP_GRAPH_BUCKETS; i++) {
            if (b->ops->graph_free) b->ops->graph_free(b, buf->graphs[OUT_SAMPLE][i]);
            buf->graphs[OUT_SAMPLE][i] = NULL;
        }
        TP_CHECK(b->ops->synchronize(b)); /* nothing still reads the old buffer */
        b->ops->free(b, buf->sample_tokens);
        buf->sample_tokens = NULL;
        buf->sample_tokens_cap = 0;
        TP_CHECK(b->ops->alloc(b, cap * sizeof(int32_t), (void **)&buf->sample_tokens));
        buf->sample_tokens_cap = cap;
    }
    tp_sample_row pad;
    memset(&pad, 0, sizeof pad);
    pad.top_p = 1.0; /* greedy, everything off */
    pad.repetition_penalty = 1.0;
    pad.n_logprobs = -1;
    memcpy(buf->sample_rows_host, rq->rows, (size_t)n * sizeof(tp_sample_row));
    for (int32_t i = n; i < L; i++) buf->sample_rows_host[i] = pad;
    TP_CHECK(b->ops->upload(b, buf->sample_rows, buf->sample_rows_host, (size_t)L * sizeof(tp_sample_row)));
    if (rq->n_tokens > 0)
        TP_CHECK(b->ops->upload(b, buf->sample_tokens, rq->tokens, (size_t)rq->n_tokens * sizeof(int32_t)));
    return TP_OK;
}

/* The sample op on the step's L logit rows as [L, vocab]: over tp the gathered blocks
 * [tp][L][vocab_pad] re-laid out first, one convert per rank's block. */
static tp_status sample_enqueue(tp_model *m, tp_step_buffers *buf, int32_t L)
{
    tp_backend *b = m->backend;
    const int64_t V = m->cfg.vocab_size, P = m->dims.vocab_pad;
    const int n_tp = m->plan.tp;
    tp_tensor full;
    if (n_tp == 1) {
        full = tp_tensor_rows(&buf->logits, 0, L);
        full.cols = V; /* the padding columns past the vocabulary are not candidates */
    } else {
        full = tp_tensor_make(buf->sample_logits, TP_DTYPE_F32, L, V);
        tp_tensor all = tp_tensor_make(buf->gathered.data, TP_DTYPE_F32, (int64_t)n_tp * L, P);
        for (int r = 0; r < n_tp; r++) {
            const int64_t c0 = r * P, nc = V - c0 < P ? V - c0 : P;
            if (nc <= 0) break;
            tp_tensor src = tp_tensor_rows(&all, (int64_t)r * L, L);
            src = tp_tensor_cols(&src, 0, nc);
            tp_tensor dst = tp_tensor_cols(&full, c0, nc);
            TP_CHECK(b->ops->convert(b, &src, &dst));
        }
    }
    return b->ops->sample(b, &full, L, buf->sample_rows, buf->sample_tokens, buf->sample_out);
}

/* The results of the step's first n rows. */
static tp_status sample_read(tp_model *m, tp_step_buffers *buf, int32_t n, const tp_sample_request *rq)
{
    tp_backend *b = m->backend;
    if (n == 0) return TP_OK; /* no row sampled (a prefill chunk inside its prompt) */
    TP_CHECK(b->ops->download(b, rq->out, buf->sample_out, (size_t)n * sizeof(tp_sample_out)));
    TP_CHECK(b->ops->synchronize(b));
    buf->sample_ready = 1;
    return TP_OK;
}

/* Everything of a step after its upload, enqueued without a wait (so it can be recorded
 * as a graph): the layers of this stage and, on the last, the logits of L rows (in_order:
 * rows 0 .. L - 1, else the step's logit_rows). prune: on the last stage, the last layer
 * past its attention takes only the logit rows (a prefill's 16384 tokens, 128 of which
 * sample, skip ~88 % of a layer's products); every operation there works row by row, so
 * the logits are the same (on the CPU bit for bit; on a GPU up to rounding, as the
 * products of fewer rows may take other algorithms). */
static tp_status enqueue_step(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_attn_batch *ab,
                              int32_t L, tp_comm *tp, const tp_tensor *in_x, const tp_tensor *in_delta, int out,
                              int in_order, int prune)
{
    tp_backend *b = m->backend;
    const int32_t T = ab->n_tokens;
    tp_tensor x = tp_tensor_rows(&buf->x, 0, T), delta = tp_tensor_rows(&buf->delta, 0, T);
    int pending = 0; /* delta holds a product not yet added to x */
    const int in_place = residual_add(m);
    if (m->plan.has_embedding) {
        TP_CHECK(embed(m, buf, T, tp, &x));
    } else {
        TP_CHECK(b->ops->convert(b, in_x, &x));
        TP_CHECK(b->ops->convert(b, in_delta, &delta));
        pending = 1;
    }
    int32_t rows = T; /* that go on; L past a pruned last layer */
    for (int64_t l = 0; l < m->dims.n_layers; l++) {
        const tp_layer_weights *Lw = &m->layers[l];
        const int keep = prune && m->plan.has_lm_head && l == m->dims.n_layers - 1 && L < T;
        tp_attn_batch layer_ab = *ab;
        layer_ab.window = layer_window(m, l);
        layer_ab.softcap = (float)m->cfg.attn_softcap;
        TP_CHECK(attention_block(m, Lw, layer_inv_freq(m, l), &kv->layers[l], &layer_ab, buf, T, buf->pos, tp, &x,
                                 &delta, &pending, in_place, keep ? buf->logit_rows : NULL, L));
        if (keep) {
            tp_log(TP_LOG_DEBUG, "the last layer past its attention: %d logit rows of %d tokens", L, T);
            rows = L;
            in_order = 1;
        }
        /* a stage that sends on leaves its last product in delta, as its receiver expects */
        const int into_x = in_place && (m->plan.has_lm_head || l < m->dims.n_layers - 1);
        if (rows > 0) TP_CHECK(mlp_block(m, Lw, buf, rows, tp, &x, &delta, &pending, into_x));
    }
    if (m->plan.has_lm_head) TP_CHECK(logits_enqueue(m, buf, rows, L, tp, &x, &delta, pending, out, in_order));
    return TP_OK;
}

// ----------------------------------------------------------------------------
// decode steps as graphs

/* Graph batch sizes: 1, 2, 4, 8, then steps of 8 to 64, of 16 to 128, of 32 to 256, of
 * 64 beyond; the largest is the cap itself. */
static int32_t bucket_size(int i, int32_t cap)
{
    static const int32_t first[] = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                                    160, 192, 224, 256};
    const int nf = (int)(sizeof first / sizeof first[0]);
    int32_t v = i < nf ? first[i] : 256 + 64 * (i - nf + 1);
    return v < cap ? v : cap;
}

/* The largest padded batch: what every step buffer holds. */
static int32_t graph_cap(const tp_step_buffers *buf)
{
    int32_t cap = buf->max_tokens;
    if (buf->max_seqs < cap) cap = buf->max_seqs;
    if (buf->max_logits < cap) cap = buf->max_logits;
    return cap;
}

/* The bucket of a step that may run as a graph, or -1: the whole model on this rank's
 * stage (pp 1), only decode tokens (token i is sequence i's one new token, its logit row
 * i), and buffers that hold the padded batch. */
static int graph_bucket(const tp_model *m, const tp_step_buffers *buf, const tp_step *s)
{
    if (!buf->use_graphs || !m->plan.has_embedding || !m->plan.has_lm_head) return -1;
    const int32_t n = s->n_tokens;
    if (s->n_seqs != n || s->n_logits != n || s->max_blocks != buf->max_blocks) return -1;
    for (int32_t i = 0; i < n; i++)
        if (s->seq[i] != i || s->logit_rows[i] != i) return -1;
    const int32_t cap = graph_cap(buf);
    for (int i = 0; i < TP_GRAPH_BUCKETS; i++) {
        int32_t v = bucket_size(i, cap);
        if (n <= v) return i;
        if (v == cap) break;
    }
    return -1;
}

/* Whether token i is the only one of sequence row i (a decode step's layout; the graphs'):
 * tp_attn_batch.one_per_seq. Its other conditions hold here: upload_step's copies come before
 * the step's kernels on the stream (all earlier steps' stores done), and no two sequences
 * share a block. */
static int32_t one_per_seq(const tp_step *s)
{
    if (s->n_seqs != s->n_tokens) return 0;
    for (int32_t i = 0; i < s->n_tokens; i++)
        if (s->seq[i] != i) return 0;
    return 1;
}

/* The step padded to B tokens: a padding token is id 0 at position 0 of its own sequence
 * row, whose block table is all block 0 (zeroed at creation, or some sequence's keys:
 * finite either way), with slot -1 so nothing is stored, and its logit row is computed
 * and ignored. */
static tp_step pad_step(tp_step_buffers *buf, const tp_step *s, int32_t B)
{
    const int32_t n = s->n_tokens, mb = s->max_blocks;
    int32_t *ids = buf->pad_host, *pos = ids + B, *seq = pos + B, *slot = seq + B, *rows = slot + B;
    int32_t *take = rows + B, *table = take + B;
    if (s->take) memcpy(take, s->take, (size_t)n * sizeof(int32_t));
    memcpy(ids, s->ids, (size_t)n * sizeof(int32_t));
    memcpy(pos, s->pos, (size_t)n * sizeof(int32_t));
    memcpy(slot, s->slot, (size_t)n * sizeof(int32_t));
    memcpy(table, s->block_table, (size_t)n * (size_t)mb * sizeof(int32_t));
    memset(table + (size_t)n * (size_t)mb, 0, (size_t)(B - n) * (size_t)mb * sizeof(int32_t));
    for (int32_t i = 0; i < B; i++) {
        seq[i] = i;
        rows[i] = i;
        if (i >= n) ids[i] = pos[i] = 0, slot[i] = -1, take[i] = -1;
    }
    tp_step p = {B, ids, pos, seq, slot, B, mb, s->max_pos, table, B, rows, s->take ? take : NULL};
    return p;
}

/* Replay the bucket's graph, recording it first if this is its first use. A step that
 * cannot be recorded runs eagerly, and graphs stay off from then on. */
static tp_status run_graph(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_attn_batch *ab,
                           int bucket, tp_comm *tp, int out)
{
    tp_backend *b = m->backend;
    if (!b->ops->graph_begin) /* padded but eager: the CPU backend under TPINFER_PAD_DECODE */
        return enqueue_step(m, kv, buf, ab, ab->n_tokens, tp, NULL, NULL, out, 1, 0);
    void **g = &buf->graphs[out][bucket];
    if (!*g) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        TP_CHECK(b->ops->graph_begin(b));
        tp_status st = enqueue_step(m, kv, buf, ab, ab->n_tokens, tp, NULL, NULL, out, 1, 0);
        tp_status end = b->ops->graph_end(b, st == TP_OK ? g : NULL);
        if (st != TP_OK || end != TP_OK) {
            /* over tp the peers would go on padding their steps to graphs' sizes while this rank
             * did not: their collectives would not match (the engine ends every rank instead) */
            if (m->plan.tp > 1) {
                char why[512];
                snprintf(why, sizeof why, "%s", tp_error_message());
                tp_error_clear();
                return tp_error(st != TP_OK ? st : end, "cannot record a decode step of %d tokens as a CUDA graph "
                                "(%s); at tp %d every rank must take graphs or none: run with --enforce-eager",
                                ab->n_tokens, why, m->plan.tp);
            }
            tp_log(TP_LOG_WARN, "cannot record a decode step of %d tokens as a CUDA graph (%s); running every "
                   "step eagerly from now on", ab->n_tokens, tp_error_message());
            tp_error_clear();
            buf->use_graphs = 0;
            return enqueue_step(m, kv, buf, ab, ab->n_tokens, tp, NULL, NULL, out, 1, 0);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        tp_log(TP_LOG_DEBUG, "recorded the decode graph of %d tokens in %.1f ms", ab->n_tokens,
               1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec));
    }
    return b->ops->graph_launch(b, *g);
}

/* What the next step's take names: the L device-chosen tokens of a step whose logits became
 * `out` (argmax ids, or the token field of each sample op result: its first), or none. */
static void note_chosen(const tp_model *m, tp_step_buffers *buf, int out, int32_t L)
{
    _Static_assert(offsetof(tp_sample_out, token) == 0 && sizeof(tp_sample_out) % 4 == 0, "tp_sample_out.token");
    const int32_t *ids = m->plan.tp > 1 ? buf->argmax_merged : buf->argmax_ids;
    buf->chosen = out == OUT_IDS ? ids : out == OUT_SAMPLE ? (const int32_t *)buf->sample_out : NULL;
    buf->chosen_rows = buf->chosen ? L : 0;
    buf->chosen_stride = out == OUT_SAMPLE ? (int32_t)(sizeof(tp_sample_out) / 4) : 1;
}

/* The step enqueued; *L_out: the logit rows it computes (a graph's padded batch, or the
 * step's own). */
static tp_status forward_enqueue(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_step *s,
                                 tp_comm *tp, const tp_tensor *in_x, const tp_tensor *in_delta, int out,
                                 const tp_sample_request *sample, int32_t *L_out)
{
    const int32_t T = s->n_tokens;
    /* the backend's sample scratch is made at its first call, which must not be recorded (the
     * engine runs that step eagerly on the sampler's TP peers too: engine_step.c, run_stage) */
    const int bucket = out == OUT_SAMPLE && !buf->sample_ready ? -1 : graph_bucket(m, buf, s);
    int32_t L = s->n_logits; /* logit rows computed; the first s->n_logits are the step's */
    if (bucket >= 0) {
        const int32_t B = bucket_size(bucket, graph_cap(buf));
        if (out == OUT_SAMPLE) TP_CHECK(sample_prepare(m, buf, s->n_logits, B, sample));
        tp_step padded = pad_step(buf, s, B);
        TP_CHECK(upload_step(m, buf, &padded));
        /* positions bounded by the table's capacity, so one recording serves every step */
        tp_attn_batch ab = {B, buf->seq, buf->pos, buf->slot, buf->block_table, padded.max_blocks,
                            padded.max_blocks * kv->block_size, 1, 0, 0};
        TP_CHECK(run_graph(m, kv, buf, &ab, bucket, tp, out));
        L = B;
    } else {
        if (out == OUT_SAMPLE) TP_CHECK(sample_prepare(m, buf, L, L, sample));
        TP_CHECK(upload_step(m, buf, s));
        tp_attn_batch ab = {T, buf->seq, buf->pos, buf->slot, buf->block_table, s->max_blocks, s->max_pos,
                            one_per_seq(s), 0, 0};
        int in_order = 1;
        for (int32_t i = 0; i < L && in_order; i++) in_order = s->logit_rows[i] == i;
        TP_CHECK(enqueue_step(m, kv, buf, &ab, L, tp, in_x, in_delta, out, in_order, buf->prune_last));
    }
    note_chosen(m, buf, out, L);
    *L_out = L;
    return TP_OK;
}

tp_status tp_model_forward(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_step *s,
                           tp_comm *tp, const tp_tensor *in_x, const tp_tensor *in_delta,
                           float *logits_host, int32_t *ids_host, const tp_sample_request *sample)
{
    if (s->n_tokens == 0) return TP_OK;
    if (ids_host && !tp_model_can_argmax(m))
        return tp_error(TP_ERR_UNAVAILABLE, "greedy choice on the device needs the last stage, a vocabulary slice "
                        "on every TP rank and a backend with argmax");
    if (sample && !tp_model_can_sample(m))
        return tp_error(TP_ERR_UNAVAILABLE, "sampling on the device needs the last stage and a backend with the "
                        "sample op");
    const int out = ids_host ? OUT_IDS : sample ? OUT_SAMPLE : OUT_LOGITS;
    int32_t L = 0;
    TP_CHECK(forward_enqueue(m, kv, buf, s, tp, in_x, in_delta, out, sample, &L));
    if (!m->plan.has_lm_head) return TP_OK;
    if (ids_host) return ids_read(m, buf, L, s->n_logits, ids_host);
    if (logits_host) return logits_read(m, buf, L, s->n_logits, logits_host);
    if (sample) return sample_read(m, buf, s->n_logits, sample);
    return TP_OK;
}

int tp_model_can_overlap(const tp_model *m)
{
    const struct tp_backend_ops *ops = m->backend->ops;
    return (m->plan.tp == 1 || ops->argmax_merge) && m->plan.has_embedding && m->plan.has_lm_head &&
           tp_model_can_argmax(m) && ops->take_ids && ops->download_start && ops->download_wait;
}

tp_status tp_model_forward_start(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_step *s,
                                 tp_comm *tp, const tp_sample_request *sample, int k)
{
    if (!tp_model_can_overlap(m) || (sample && !tp_model_can_sample(m)))
        return tp_error(TP_ERR_UNAVAILABLE, "a step enqueued before the previous one's tokens are read needs pp 1, "
                        "a backend with argmax (and argmax_merge over tp), take_ids and download_start (and the "
                        "sample op to sample)");
    tp_backend *b = m->backend;
    const int out = sample ? OUT_SAMPLE : OUT_IDS;
    int32_t L = 0;
    if (s->n_tokens > 0) {
        TP_CHECK(forward_enqueue(m, kv, buf, s, tp, NULL, NULL, out, sample, &L));
        /* its sample op made the backend's scratch: later steps may be recorded */
        if (out == OUT_SAMPLE) buf->sample_ready = 1;
    }
    const size_t each = out == OUT_SAMPLE ? sizeof(tp_sample_out) : sizeof(int32_t);
    const void *src = out == OUT_SAMPLE ? (const void *)buf->sample_out
                      : m->plan.tp > 1  ? (const void *)buf->argmax_merged
                                        : (const void *)buf->argmax_ids;
    return b->ops->download_start(b, k, src, (size_t)(s->n_tokens > 0 ? s->n_logits : 0) * each);
}

tp_status tp_model_forward_start_unsampled(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_step *s,
                                           tp_comm *tp)
{
    if (!tp_model_can_overlap(m) || !tp_model_can_sample(m))
        return tp_error(TP_ERR_UNAVAILABLE, "a step sampled after the previous one's tokens are read needs pp 1 and "
                        "a backend with the sample op, take_ids and download_start (and argmax_merge over tp)");
    buf->unsampled_rows = 0;
    buf->unsampled_n = s->n_logits;
    if (s->n_tokens == 0) return TP_OK;
    return forward_enqueue(m, kv, buf, s, tp, NULL, NULL, OUT_LOGITS, NULL, &buf->unsampled_rows);
}

tp_status tp_model_sample_start(tp_model *m, tp_step_buffers *buf, const tp_sample_request *sample, int k)
{
    tp_backend *b = m->backend;
    const int32_t n = buf->unsampled_n, L = buf->unsampled_rows;
    buf->unsampled_n = buf->unsampled_rows = 0; /* sampled once */
    if (L > 0) {
        TP_CHECK(sample_prepare(m, buf, n, L, sample));
        TP_CHECK(sample_enqueue(m, buf, L));
        buf->sample_ready = 1; /* the backend's scratch exists: later steps may record it */
    }
    note_chosen(m, buf, L > 0 ? OUT_SAMPLE : OUT_LOGITS, L);
    return b->ops->download_start(b, k, buf->sample_out, (size_t)(L > 0 ? n : 0) * sizeof(tp_sample_out));
}

tp_status tp_model_forward_wait(tp_model *m, int k, void *out)
{
    tp_backend *b = m->backend;
    return b->ops->download_wait(b, k, out);
}

int tp_model_can_sample(const tp_model *m)
{
    return m->plan.has_lm_head && m->backend->ops->sample != NULL;
}

int tp_model_can_argmax(const tp_model *m)
{
    /* every TP rank's slice has a column: the same answer on every rank of the stage */
    return m->plan.has_lm_head && m->backend->ops->argmax != NULL &&
           m->cfg.vocab_size > (int64_t)(m->plan.tp - 1) * m->dims.vocab_pad;
}

// ----------------------------------------------------------------------------
// warm-up

/* Dummy tokens in seqs sequences of near-equal length (sequence i: tokens i * n / seqs ..
 * (i + 1) * n / seqs - 1, at positions from 0), all id 0, with slot -1 (the KV cache is not
 * written) and a block-table row of block 0 (zeroed at creation, or some sequence's keys:
 * finite either way); each sequence's last token has a logit row. 1 <= seqs <= n. */
static tp_status warm_step(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, tp_comm *tp, const tp_warm_up *w,
                           int32_t n, int32_t seqs, int32_t *host, int stage_input)
{
    const int32_t mb = buf->max_blocks;
    int32_t *ids = host, *pos = ids + n, *seq = pos + n, *slot = seq + n, *rows = slot + n, *table = rows + seqs;
    int32_t longest = 0;
    for (int32_t i = 0; i < seqs; i++) {
        const int32_t j0 = (int32_t)((int64_t)i * n / seqs), j1 = (int32_t)((int64_t)(i + 1) * n / seqs);
        for (int32_t j = j0; j < j1; j++) ids[j] = 0, pos[j] = j - j0, seq[j] = i, slot[j] = -1;
        rows[i] = j1 - 1;
        if (j1 - j0 > longest) longest = j1 - j0;
    }
    memset(table, 0, (size_t)seqs * (size_t)mb * sizeof(int32_t));
    tp_step s = {n, ids, pos, seq, slot, seqs, mb, longest, table, seqs, rows, NULL};
    tp_sample_request rq = {w->sample_rows, w->sample_rows ? ids : NULL, 0, w->sample_out};
    tp_tensor in_x, in_delta;
    if (stage_input && w->in_x) {
        in_x = tp_tensor_rows(w->in_x, 0, n);
        in_delta = tp_tensor_rows(w->in_delta, 0, n);
    }
    TP_CHECK(tp_model_forward(m, kv, buf, &s, tp, stage_input && w->in_x ? &in_x : NULL,
                              stage_input && w->in_x ? &in_delta : NULL, w->logits, w->ids,
                              w->sample_rows ? &rq : NULL));
    if (w->beat) w->beat(w->beat_arg);
    return TP_OK;
}

static int32_t warm_len(const tp_kv_cache *kv, const tp_step_buffers *buf, const tp_warm_up *w)
{
    return w->max_len < buf->max_blocks * kv->block_size ? w->max_len : buf->max_blocks * kv->block_size;
}

int32_t tp_model_warm_up_tokens(const tp_kv_cache *kv, const tp_step_buffers *buf, const tp_warm_up *w)
{
    const int32_t len = warm_len(kv, buf, w);
    int32_t n = w->prefill_tokens;
    if (len <= 0) return 0;
    if ((int64_t)n > (int64_t)buf->max_seqs * len) n = buf->max_seqs * len;
    if (n > buf->max_tokens) n = buf->max_tokens;
    if ((n + len - 1) / len > buf->max_logits) n = buf->max_logits * len;
    return n > 0 ? n : 0;
}

/* A decode step at each graph batch size, reps times: recorded and replayed where
 * buf->use_graphs, else eager. */
static tp_status warm_buckets(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, tp_comm *tp, const tp_warm_up *w,
                              int32_t *host, int reps)
{
    const int32_t cap = graph_cap(buf);
    for (int i = 0; i < TP_GRAPH_BUCKETS; i++) {
        const int32_t B = bucket_size(i, cap);
        for (int r = 0; r < reps; r++) TP_CHECK(warm_step(m, kv, buf, tp, w, B, B, host, 0));
        if (B == cap) break;
    }
    return TP_OK;
}

static void drop_graphs(tp_backend *b, tp_step_buffers *buf, int bucket)
{
    for (int o = 0; o < 3; o++) {
        if (b->ops->graph_free) b->ops->graph_free(b, buf->graphs[o][bucket]);
        buf->graphs[o][bucket] = NULL;
    }
}

/* A batch-1 decode step both ways, where the backend lets the warm-up choose: a small model's
 * is faster with the backend's own one-row products (their kernels start while the one
 * before ends), a large one's with the library's, which reads big weights faster; timing
 * each product alone would miss the overlap, so whole steps are timed. Each way: its graph
 * recorded, then ONE_ROW_STEPS steps, each way twice in turn; the backend's own stays where
 * it was 1 % faster. */
#define ONE_ROW_STEPS 8
static tp_status choose_one_row(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, tp_comm *tp,
                                const tp_warm_up *w, int32_t *host)
{
    tp_backend *b = m->backend;
    double secs[2] = {0.0, 0.0}; /* [own] */
    for (int k = 0; k < 4; k++) {
        const int own = (k == 1 || k == 2); /* library, own, own, library */
        if (!b->ops->matmul_one_row(b, own)) return TP_OK;
        drop_graphs(b, buf, 0);
        TP_CHECK(warm_step(m, kv, buf, tp, w, 1, 1, host, 0)); /* recorded, replayed once */
        TP_CHECK(b->ops->synchronize(b));
        const double t0 = tp_monotonic_s();
        for (int i = 0; i < ONE_ROW_STEPS; i++) TP_CHECK(warm_step(m, kv, buf, tp, w, 1, 1, host, 0));
        TP_CHECK(b->ops->synchronize(b));
        secs[own] += tp_monotonic_s() - t0;
    }
    const int own = secs[1] < 0.99 * secs[0];
    b->ops->matmul_one_row(b, own);
    drop_graphs(b, buf, 0);
    const double steps = 2.0 * ONE_ROW_STEPS; /* timed each way */
    tp_log(TP_LOG_DEBUG, "warm-up: a batch-1 step takes %.3f ms with the backend's own one-row products, %.3f ms with "
           "the library's: %s kept", 1e3 * secs[1] / steps, 1e3 * secs[0] / steps, own ? "its own" : "the library's");
    return TP_OK;
}

tp_status tp_model_warm_up(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, tp_comm *tp, const tp_warm_up *w)
{
    const int32_t len = warm_len(kv, buf, w), n = tp_model_warm_up_tokens(kv, buf, w);
    /* the first step's prefill, where it is smaller: f tokens in as many sequences as it has
     * (its logit rows, so its last products' shapes), none longer than len, at most as many
     * as a step holds */
    const int32_t f = w->first_tokens > 0 && w->first_tokens < n ? w->first_tokens : 0;
    int32_t seqs_f = w->first_seqs < f ? w->first_seqs : f;
    if (seqs_f > buf->max_seqs) seqs_f = buf->max_seqs;
    if (f > 0 && seqs_f < TP_CEIL_DIV(f, len)) seqs_f = (int32_t)TP_CEIL_DIV(f, len);
    /* host arrays for the largest of the kinds of step: 4 per token, 1 + max_blocks per sequence */
    const int32_t cap = graph_cap(buf), most = n > cap ? n : cap, seqs = n > 0 ? (n + len - 1) / len : 0;
    int32_t seqs_most = seqs > cap ? seqs : cap;
    if (seqs_f > seqs_most) seqs_most = seqs_f;
    int32_t *host = malloc((5 * (size_t)most + (size_t)seqs_most * (size_t)buf->max_blocks) * sizeof(int32_t));
    if (!host) return tp_error(TP_ERR_OOM, "out of memory for the warm-up steps");
    tp_backend *b = m->backend;
    const int tune = w->tune && b->ops->matmul_tune != NULL, graphs = w->graphs && buf->use_graphs;
    int tune_calls = 0; /* calls of a shape that time all its candidates: decode's shapes get them */
    tp_status st = tune ? b->ops->matmul_tune(b, 1, &tune_calls) : TP_OK;
    const int tune_reps = m->dims.n_layers > 0 && tune_calls > m->dims.n_layers
                              ? (int)TP_CEIL_DIV(tune_calls, m->dims.n_layers) : 1;
    if (st == TP_OK && n > 0) st = warm_step(m, kv, buf, tp, w, n, seqs, host, 1);
    if (st == TP_OK && w->after_prefill) st = w->after_prefill(w->beat_arg, n); /* the next stage's input */
    if (st == TP_OK && f > 0 && seqs_f > 0) {
        /* eager even where graphs are recorded: a step of one-token sequences would be
         * taken for a decode step and recorded before its products are tuned */
        const int use_graphs = buf->use_graphs;
        buf->use_graphs = 0;
        st = warm_step(m, kv, buf, tp, w, f, seqs_f, host, 1);
        buf->use_graphs = use_graphs;
        tp_log(TP_LOG_DEBUG, "warm-up: the first step's prefill too, %d tokens in %d sequences (the first step's: %d)",
               (int)f, (int)seqs_f, (int)w->first_seqs);
    }
    /* a sampled step's graphs exist only after an eager step sampled (the backend's scratch);
     * tuning: each graph's batch size eagerly, so the recordings take tuned products (more
     * than once where the stage has fewer layers than a shape's tuning takes calls) */
    if (st == TP_OK && graphs && (w->sampled || tune)) {
        buf->use_graphs = 0;
        if (w->sampled) st = warm_step(m, kv, buf, tp, w, 1, 1, host, 0);
        if (st == TP_OK && tune) st = warm_buckets(m, kv, buf, tp, w, host, tune_reps);
        buf->use_graphs = 1;
    }
    if (tune) {
        int tuned = 0;
        const tp_status off = b->ops->matmul_tune(b, 0, &tuned);
        if (st == TP_OK) st = off;
        tp_log(TP_LOG_DEBUG, "warm-up: %d matrix product shapes tuned", tuned);
    }
    if (st == TP_OK && graphs && tune && b->ops->matmul_one_row && buf->use_graphs)
        st = choose_one_row(m, kv, buf, tp, w, host);
    /* recorded, then replayed once */
    if (st == TP_OK && graphs && w->unsampled != 2) st = warm_buckets(m, kv, buf, tp, w, host, 1);
    if (st == TP_OK && graphs && w->unsampled) { /* the graphs whose logits stay on the device */
        tp_warm_up bare = *w;
        bare.ids = NULL;
        bare.logits = NULL;
        bare.sample_rows = NULL;
        bare.sample_out = NULL;
        st = warm_buckets(m, kv, buf, tp, &bare, host, 1);
    }
    if (st == TP_OK) st = b->ops->synchronize(b);
    free(host);
    return st;
}
