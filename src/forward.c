/*
 * forward.c: one step of the Llama-family forward pass on one rank, written only
 * against the backend and comm tables. Megatron tensor parallel: q|k|v and gate|up are
 * column-parallel (no communication), o and down are row-parallel and each is followed
 * by one all-reduce; the embedding and the LM head are vocab-parallel.
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    const int32_t *src[] = {s->ids, s->pos, s->seq, s->slot, s->block_table, s->logit_rows};
    int32_t **dst[] = {&buf->ids, &buf->pos, &buf->seq, &buf->slot, &buf->block_table, &buf->logit_rows};
    const size_t len[] = {n, n, n, n, nb, (size_t)s->n_logits};
    size_t at = 0;
    for (int i = 0; i < 6; i++) {
        if (len[i] && src[i]) memcpy(buf->meta_host + at, src[i], len[i] * sizeof(int32_t));
        *dst[i] = buf->meta + at;
        at += len[i];
    }
    return b->ops->upload(b, buf->meta, buf->meta_host, at * sizeof(int32_t));
}

/* x = embedding of the ids; each TP rank holds a vocab slice, the all-reduce adds the
 * rows the others looked up. */
static tp_status embed(tp_model *m, tp_step_buffers *buf, int32_t T, tp_comm *tp, tp_tensor *x)
{
    tp_backend *b = m->backend;
    TP_CHECK(b->ops->embedding(b, buf->ids, T, &m->embed, m->plan.vocab.begin, x));
    if (m->plan.tp > 1)
        TP_CHECK(tp_comm_all_reduce_sum(tp, x->data, x->data, (size_t)(T * m->dims.d), x->dtype, b->stream));
    return TP_OK;
}

static tp_status attention_block(tp_model *m, const tp_layer_weights *L, tp_kv_layer *cache,
                                 const tp_attn_batch *ab, tp_step_buffers *buf, int32_t T,
                                 const int32_t *pos, tp_comm *tp, tp_tensor *x, tp_tensor *delta,
                                 int first)
{
    tp_backend *b = m->backend;
    const tp_model_dims *d = &m->dims;
    const float eps = (float)m->cfg.rms_norm_eps;
    tp_tensor xn = tp_tensor_rows(&buf->xn, 0, T), qkv = tp_tensor_rows(&buf->qkv, 0, T);
    tp_tensor attn = tp_tensor_rows(&buf->attn, 0, T);
    TP_CHECK(b->ops->add_rmsnorm(b, x, first ? NULL : delta, &L->attn_norm, eps, &xn));
    TP_CHECK(b->ops->matmul(b, &xn, &L->qkv, opt(&L->qkv_bias), &qkv));
    tp_tensor q = tp_tensor_cols(&qkv, 0, d->hq * d->hd);
    tp_tensor k = tp_tensor_cols(&qkv, d->hq * d->hd, d->hk * d->hd);
    tp_tensor v = tp_tensor_cols(&qkv, (d->hq + d->hk) * d->hd, d->hk * d->hd);
    if (L->q_norm.data) {
        TP_CHECK(b->ops->head_rmsnorm(b, &q, (int32_t)d->hd, &L->q_norm, eps));
        TP_CHECK(b->ops->head_rmsnorm(b, &k, (int32_t)d->hd, &L->k_norm, eps));
    }
    TP_CHECK(b->ops->rope(b, &q, (int32_t)d->hd, pos, m->inv_freq));
    TP_CHECK(b->ops->rope(b, &k, (int32_t)d->hd, pos, m->inv_freq));
    TP_CHECK(b->ops->kv_store(b, &k, &v, cache, ab));
    TP_CHECK(b->ops->attention(b, &q, cache, ab, (int32_t)d->hq, 1.0f / sqrtf((float)d->hd), &attn));
    TP_CHECK(b->ops->matmul(b, &attn, &L->o, opt(&L->o_bias), delta));
    if (m->plan.tp > 1)
        TP_CHECK(tp_comm_all_reduce_sum(tp, delta->data, delta->data, (size_t)(T * d->d), delta->dtype,
                                        b->stream));
    return TP_OK;
}

static tp_status mlp_block(tp_model *m, const tp_layer_weights *L, tp_step_buffers *buf, int32_t T,
                           tp_comm *tp, tp_tensor *x, tp_tensor *delta)
{
    tp_backend *b = m->backend;
    const tp_model_dims *d = &m->dims;
    tp_tensor xn = tp_tensor_rows(&buf->xn, 0, T), gu = tp_tensor_rows(&buf->gate_up, 0, T);
    tp_tensor act = tp_tensor_rows(&buf->act, 0, T);
    TP_CHECK(b->ops->add_rmsnorm(b, x, delta, &L->mlp_norm, (float)m->cfg.rms_norm_eps, &xn));
    TP_CHECK(b->ops->matmul(b, &xn, &L->gate_up, opt(&L->gate_up_bias), &gu));
    tp_tensor gate = tp_tensor_cols(&gu, 0, d->m), up = tp_tensor_cols(&gu, d->m, d->m);
    TP_CHECK(b->ops->swiglu(b, &gate, &up, &act));
    TP_CHECK(b->ops->matmul(b, &act, &L->down, opt(&L->down_bias), delta));
    if (m->plan.tp > 1)
        TP_CHECK(tp_comm_all_reduce_sum(tp, delta->data, delta->data, (size_t)(T * d->d), delta->dtype,
                                        b->stream));
    return TP_OK;
}

/* Final norm of the rows that sample, this rank's vocab slice of their logits, then the
 * all-gather that gives every TP rank the whole vocabulary. */
static tp_status logits(tp_model *m, tp_step_buffers *buf, const tp_step *s, tp_comm *tp,
                        tp_tensor *x, tp_tensor *delta, float *logits_host)
{
    tp_backend *b = m->backend;
    const tp_model_dims *d = &m->dims;
    int32_t T = s->n_tokens, L = s->n_logits;
    if (L == 0) return TP_OK;
    tp_tensor xn = tp_tensor_rows(&buf->xn, 0, T), rows = tp_tensor_rows(&buf->rows, 0, L);
    TP_CHECK(b->ops->add_rmsnorm(b, x, delta, &m->final_norm, (float)m->cfg.rms_norm_eps, &xn));
    TP_CHECK(b->ops->gather_rows(b, &xn, buf->logit_rows, L, &rows));
    /* [L, vocab_pad]: the padding columns past this rank's slice stay zero */
    tp_tensor lg = tp_tensor_rows(&buf->logits, 0, L);
    size_t lg_bytes = (size_t)(L * d->vocab_pad) * sizeof(float);
    if (d->vocab < d->vocab_pad) TP_CHECK(b->ops->memset0(b, lg.data, lg_bytes));
    if (d->vocab > 0) {
        tp_tensor part = tp_tensor_cols(&lg, 0, d->vocab);
        TP_CHECK(b->ops->matmul(b, &rows, &m->lm_head, NULL, &part));
    }
    const float *all = lg.data;
    if (m->plan.tp > 1) {
        TP_CHECK(tp_comm_all_gather(tp, lg.data, buf->gathered.data, (size_t)(L * d->vocab_pad),
                                    TP_DTYPE_F32, b->stream));
        all = buf->gathered.data;
    }
    if (!logits_host) return TP_OK;
    /* [tp][L][vocab_pad] -> [L][vocab]: rank r's columns start at r * vocab_pad. One copy
     * from the device (row-by-row copies cost a synchronisation each), then a re-layout */
    const int64_t V = m->cfg.vocab_size, P = d->vocab_pad;
    const int n_tp = m->plan.tp;
    if (n_tp == 1 && P == V) {
        TP_CHECK(b->ops->download(b, logits_host, all, (size_t)L * (size_t)V * sizeof(float)));
        return b->ops->synchronize(b);
    }
    size_t n = (size_t)n_tp * (size_t)L * (size_t)P;
    if (n > buf->host_cap) {
        float *p = realloc(buf->host, n * sizeof *p);
        if (!p) return tp_error(TP_ERR_OOM, "out of memory for %d rows of logits", L);
        buf->host = p;
        buf->host_cap = n;
    }
    TP_CHECK(b->ops->download(b, buf->host, all, n * sizeof(float)));
    TP_CHECK(b->ops->synchronize(b));
    for (int r = 0; r < n_tp; r++) {
        int64_t c0 = r * P, nc = V - c0 < P ? V - c0 : P;
        if (nc <= 0) break;
        for (int32_t i = 0; i < L; i++)
            memcpy(logits_host + (size_t)i * (size_t)V + (size_t)c0,
                   buf->host + ((size_t)r * (size_t)L + (size_t)i) * (size_t)P, (size_t)nc * sizeof(float));
    }
    return TP_OK;
}

tp_status tp_model_forward(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_step *s,
                           tp_comm *tp, const tp_tensor *in_x, const tp_tensor *in_delta,
                           float *logits_host)
{
    tp_backend *b = m->backend;
    const int32_t T = s->n_tokens;
    if (T == 0) return TP_OK;
    TP_CHECK(upload_step(m, buf, s));
    tp_attn_batch ab = {T, buf->seq, buf->pos, buf->slot, buf->block_table, s->max_blocks, s->max_pos};
    tp_tensor x = tp_tensor_rows(&buf->x, 0, T), delta = tp_tensor_rows(&buf->delta, 0, T);

    int first = 1; /* no delta to add yet */
    if (m->plan.has_embedding) {
        TP_CHECK(embed(m, buf, T, tp, &x));
    } else {
        TP_CHECK(b->ops->convert(b, in_x, &x));
        TP_CHECK(b->ops->convert(b, in_delta, &delta));
        first = 0;
    }
    for (int64_t l = 0; l < m->dims.n_layers; l++) {
        const tp_layer_weights *L = &m->layers[l];
        TP_CHECK(attention_block(m, L, &kv->layers[l], &ab, buf, T, buf->pos, tp, &x, &delta, first));
        first = 0;
        TP_CHECK(mlp_block(m, L, buf, T, tp, &x, &delta));
    }
    if (m->plan.has_lm_head) TP_CHECK(logits(m, buf, s, tp, &x, &delta, logits_host));
    return TP_OK;
}

int tp_model_can_argmax(const tp_model *m)
{
    return m->plan.tp == 1 && m->plan.has_lm_head && m->backend->ops->argmax != NULL;
}

tp_status tp_model_argmax(tp_model *m, tp_step_buffers *buf, int32_t n_logits, int32_t *ids_host)
{
    if (!tp_model_can_argmax(m))
        return tp_error(TP_ERR_UNAVAILABLE, "greedy choice on the device needs tp 1 and a backend with argmax");
    tp_backend *b = m->backend;
    tp_tensor lg = tp_tensor_rows(&buf->logits, 0, n_logits);
    lg.cols = m->cfg.vocab_size; /* at tp 1 the padded width is the vocabulary */
    TP_CHECK(b->ops->argmax(b, &lg, buf->argmax_ids, NULL));
    TP_CHECK(b->ops->download(b, ids_host, buf->argmax_ids, (size_t)n_logits * sizeof(int32_t)));
    return b->ops->synchronize(b);
}
