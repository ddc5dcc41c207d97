/*
 * backend.h: the compute backend as a table of operations (ggml's shape). The model
 * forward is written only against this table and comm.h. Every operation is enqueued
 * on the backend's stream and needs no host synchronisation, so a CUDA backend can
 * capture a whole decode step as one graph; only download() + synchronize() wait.
 * backend_cpu.c is the reference (f32 math); cuda/ implements the same table.
 */
#ifndef TP_BACKEND_H
#define TP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "sampler.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 2-D row-major matrix in backend memory: element (r, c) is at data + (r*stride + c). */
typedef struct tp_tensor {
    void *data;
    tp_dtype dtype;
    int64_t rows, cols;
    int64_t stride; /* elements between rows; >= cols */
} tp_tensor;

static inline tp_tensor tp_tensor_make(void *data, tp_dtype dt, int64_t rows, int64_t cols)
{
    tp_tensor t;
    t.data = data;
    t.dtype = dt;
    t.rows = rows;
    t.cols = cols;
    t.stride = cols;
    return t;
}

/* Columns [col0, col0 + ncols) of t, sharing its memory. */
static inline tp_tensor tp_tensor_cols(const tp_tensor *t, int64_t col0, int64_t ncols)
{
    tp_tensor v = *t;
    v.data = (char *)t->data + (size_t)col0 * tp_dtype_size(t->dtype);
    v.cols = ncols;
    return v;
}

/* Rows [row0, row0 + nrows) of t, sharing its memory. */
static inline tp_tensor tp_tensor_rows(const tp_tensor *t, int64_t row0, int64_t nrows)
{
    tp_tensor v = *t;
    v.data = (char *)t->data + (size_t)(row0 * t->stride) * tp_dtype_size(t->dtype);
    v.rows = nrows;
    return v;
}

/* Where the tokens of one forward step sit in the paged KV cache. All arrays are in
 * backend memory. Token i belongs to sequence seq[i] at position pos[i] and attends to
 * positions tp_attn_first_key(pos[i], window)..pos[i] of that sequence (causal; 0..pos[i]
 * without a window), whose keys/values were stored earlier or by kv_store() of this same
 * step. The arrays (and rope's inv_freq, the norms' weights) must come from uploads, never
 * from an operation of the step: the CUDA kernels read them while the previous kernel is
 * still running (programmatic dependent launch). */
typedef struct tp_attn_batch {
    int32_t n_tokens;
    const int32_t *seq;         /* [n_tokens] row of block_table */
    const int32_t *pos;         /* [n_tokens] */
    const int32_t *slot;        /* [n_tokens] cache slot to write: block * block_size + offset */
    const int32_t *block_table; /* [n_seqs, max_blocks] physical block of each logical block */
    int32_t max_blocks;         /* columns of block_table */
    int32_t max_pos;            /* host-known bound: every pos[i] < max_pos (kernel sizing) */
    int32_t one_per_seq;        /* 1: token i is the only one of sequence i (a decode step): its
                                 * keys before its own position were stored by earlier steps, so a
                                 * backend may read them before this step's K/V store has run. The
                                 * caller vouches that (a) something between those steps and this
                                 * one waits for all earlier work (the step's uploads do) and (b) no
                                 * token of the step stores into a block another sequence reads
                                 * below its position (no shared blocks; padding has slot -1). */
    int32_t window;             /* > 0: a sliding window, the layer's (the forward sets it per
                                 * layer): token i attends to its last window positions only */
    float softcap;              /* > 0: each scaled score s becomes softcap tanh(s / softcap)
                                 * before the softmax (Gemma 2's attn_logit_softcapping) */
} tp_attn_batch;

/* The first position a token at pos attends to (HF's sliding mask: pos - key < window) */
static inline int32_t tp_attn_first_key(int32_t pos, int32_t window)
{
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}

/* One layer's KV cache: K and V each [n_blocks, block_size, n_kv_heads, head_dim]. */
typedef struct tp_kv_layer {
    void *k, *v;
    tp_dtype dtype;
    int32_t n_blocks, block_size, n_kv_heads, head_dim;
} tp_kv_layer;

/* ---- the sample op's rows and results (see tp_backend_ops.sample) ---- */
#define TP_SAMPLE_MAX_LOGPROBS TP_MAX_LOGPROBS /* the sampler's limit on params.logprobs */

/* One row's rule for the sample op: tp_sampling_params flattened, plus where its tokens are. */
typedef struct tp_sample_row {
    double temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    uint64_t seed;      /* the stream (tp_sampler_request_seed, choice-adjusted by the caller) */
    uint64_t step;      /* the draw's step (tokens generated so far) */
    int32_t top_k;
    int32_t n_logprobs; /* 0..TP_SAMPLE_MAX_LOGPROBS: the chosen token's logprob and the top
                         * n_logprobs; -1: none wanted (logprob 0, n_top 0; both backends skip
                         * the log-sum-exp over the row, most of a greedy row's cost) */
    /* penalties: tokens[tokens .. +n_prompt) the prompt, then n_output output tokens (right
     * after the prompt); read only when a penalty is on */
    int32_t tokens, n_prompt, n_output;
    int32_t banned, n_banned; /* tokens[banned .. +n_banned): ids never drawn, whose raw logits still count in the logprobs (min_tokens' end tokens) */
    int32_t allowed, n_allowed; /* tokens[allowed .. +n_allowed): when n_allowed > 0, the only ids drawn (allowed_token_ids) */
    int32_t bias, n_bias;       /* tokens[bias .. +n_bias): distinct ids, then tokens[bias + n_bias ..
                                 * +n_bias): the bits of their finite float biases, added to the
                                 * logits before the penalties (logit_bias) */
} tp_sample_row;

typedef struct tp_sample_out {
    int32_t token;
    float logprob; /* chosen token's log-softmax of the raw logits (excluded ids included), as tp_sampler_sample_edited */
    int32_t n_top;
    int32_t top_id[TP_SAMPLE_MAX_LOGPROBS];
    float top_logprob[TP_SAMPLE_MAX_LOGPROBS];
} tp_sample_out;

typedef struct tp_backend tp_backend;

struct tp_backend_ops {
    /* ---- memory; pointers are backend memory (device memory on a GPU) ---- */
    tp_status (*alloc)(tp_backend *b, size_t bytes, void **out);
    void (*free)(tp_backend *b, void *p); /* accepts NULL */
    /* host -> backend; the host buffer may be reused as soon as this returns */
    tp_status (*upload)(tp_backend *b, void *dst, const void *src, size_t bytes);
    /* backend -> host; the data are there after synchronize() */
    tp_status (*download)(tp_backend *b, void *dst, const void *src, size_t bytes);
    tp_status (*memset0)(tp_backend *b, void *p, size_t bytes);
    /* wait until everything enqueued has finished */
    tp_status (*synchronize)(tp_backend *b);

    /* ---- operations (shapes as [rows, cols]) ---- */
    /* out[i] = table[ids[i] - vocab_begin] when vocab_begin <= ids[i] < vocab_begin +
     * table.rows, else zeros (vocab-parallel: the TP all-reduce completes the lookup).
     * ids [n] int32, table [V_local, d], out [n, d] */
    tp_status (*embedding)(tp_backend *b, const int32_t *ids, int32_t n, const tp_tensor *table,
                           int64_t vocab_begin, tp_tensor *out);
    /* residual += delta (when delta is not NULL); out = rmsnorm(residual) * weight.
     * residual [n, d] (f32), delta [n, d] or NULL, weight [1, d], out [n, d] */
    tp_status (*add_rmsnorm)(tp_backend *b, tp_tensor *residual, const tp_tensor *delta,
                             const tp_tensor *weight, float eps, tp_tensor *out);
    /* Per-head RMSNorm in place (Qwen3 q/k norm): x [n, heads*head_dim], weight [1, head_dim] */
    tp_status (*head_rmsnorm)(tp_backend *b, tp_tensor *x, int32_t head_dim,
                              const tp_tensor *weight, float eps);
    /* y = x @ w^T + bias: x [n, k], w [m, k] (Hugging Face's [out, in]), bias [1, m] or
     * NULL, y [n, m]; f32 accumulation whatever the weight dtype */
    tp_status (*matmul)(tp_backend *b, const tp_tensor *x, const tp_tensor *w,
                        const tp_tensor *bias, tp_tensor *y);
    /* Rotary embedding in place, Hugging Face rotate-half layout: x [n, heads*head_dim],
     * pos [n], inv_freq [head_dim/2] f32 (the scaling type is folded into inv_freq) */
    tp_status (*rope)(tp_backend *b, tp_tensor *x, int32_t head_dim, const int32_t *pos,
                      const float *inv_freq);
    /* Store this step's keys and values at batch->slot: k, v [n, kv_heads*head_dim] */
    tp_status (*kv_store)(tp_backend *b, const tp_tensor *k, const tp_tensor *v,
                          tp_kv_layer *cache, const tp_attn_batch *batch);
    /* Causal attention over the paged cache, grouped-query: q [n, q_heads*head_dim],
     * out [n, q_heads*head_dim]; q head h reads KV head h / (q_heads / kv_heads) */
    tp_status (*attention)(tp_backend *b, const tp_tensor *q, const tp_kv_layer *cache,
                           const tp_attn_batch *batch, int32_t q_heads, float scale,
                           tp_tensor *out);
    /* out = silu(gate) * up: gate, up, out [n, m] */
    tp_status (*swiglu)(tp_backend *b, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out);
    /* out = gelu(gate) * up, GeLU's tanh form (PyTorch's gelu(approximate="tanh"), Gemma's
     * gelu_pytorch_tanh): gate, up, out [n, m]; out may alias gate or up */
    tp_status (*geglu)(tp_backend *b, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out);
    /* x = cap tanh(x / cap) in place, cap > 0 (Gemma 2's final_logit_softcapping): x [n, m] */
    tp_status (*softcap)(tp_backend *b, tp_tensor *x, float cap);
    /* out[i] = x[rows[i]]: rows [n] int32 in backend memory, out [n, d] */
    tp_status (*gather_rows)(tp_backend *b, const tp_tensor *x, const int32_t *rows, int32_t n,
                             tp_tensor *out);
    /* dst = src converted to dst's dtype (same shape) */
    tp_status (*convert)(tp_backend *b, const tp_tensor *src, tp_tensor *dst);
    /* Greedy sampling on the device, so that a decode step returns L ids instead of L x V
     * logits: per row of logits [L, V] (f32, stride honoured), the largest value's column
     * (ties to the lowest column) into ids [L] (int32, backend memory); when logprob is not
     * NULL, its log-softmax value (f32, computed in f32 with max subtraction) into logprob
     * [L]; when value is not NULL, the largest value itself into value [L] (so that TP ranks
     * holding vocabulary slices can pick the global winner from their local ones). Rows with NaN: the op fails with TP_ERR_NUMERIC naming the row (on a
     * GPU, at the next synchronize(), like the other index checks). */
    tp_status (*argmax)(tp_backend *b, const tp_tensor *logits, int32_t *ids, float *logprob, float *value);
    /* Sampling on the device, so that a step returns L results instead of L x V logits: per
     * row r of logits [L, V] (f32, stride honoured) the rule rows[r] (backend memory), with
     * tokens (backend memory, int32) holding the rows' penalty ids and edits; results into
     * out [L] (backend memory). Exactly tp_sampler_sample_edited's rule (allowed ids, banned
     * ids and biases, penalties, temperature, top-k, top-p, min-p, the counter-based draw,
     * greedy when temperature < 1e-5 or top_k == 1). A row with NaN/+Inf logits (not
     * counting excluded ids): the op fails with TP_ERR_NUMERIC, a parameter out of range or a
     * token outside [0, V) with TP_ERR_INVALID_ARG, naming the row (on a GPU at the next
     * synchronize(), through the fault word as argmax); such a row gets token -1 (the bad column for NaN/+Inf), logprob
     * NaN and n_top 0, the other rows their results. NULL in a backend that lacks it. */
    tp_status (*sample)(tp_backend *b, const tp_tensor *logits, int32_t L, const tp_sample_row *rows,
                        const int32_t *tokens, tp_sample_out *out);

    /* ---- fused operations: the forward's hot paths (on the CPU, compositions of the above) ---- */
    /* out = silu(gate) * up where [gate | up] = x @ w^T + bias: x [n, k], w [2m, k] (gate rows,
     * then up rows), bias [1, 2m] or NULL, out [n, m]; gate_up [n, 2m] is scratch the backend
     * may use (its contents afterwards are unspecified) */
    tp_status (*matmul_swiglu)(tp_backend *b, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                               tp_tensor *gate_up, tp_tensor *out);
    /* The attention block's work between the qkv matmul and attention, in one pass: when
     * q_norm is not NULL (Qwen3) q and k get head_rmsnorm with q_norm / k_norm; then rope at
     * batch->pos; then kv_store of k and v at batch->slot. q [n, hq*head_dim] and k
     * [n, hk*head_dim] change in place (q is attention's input); v [n, hk*head_dim]. */
    tp_status (*qk_rope_store)(tp_backend *b, tp_tensor *q, tp_tensor *k, const tp_tensor *v,
                               const tp_tensor *q_norm, const tp_tensor *k_norm, float eps, int32_t head_dim,
                               const float *inv_freq, tp_kv_layer *cache, const tp_attn_batch *batch);
    /* Optional (NULL: the forward calls the two): qk_rope_store, then attention of q into out
     * (its arguments as those two take them), in one pass where the backend can (on a GPU a
     * decode step's batch, batch->one_per_seq, without q/k norms), else as the two. The cache
     * and out are the two ops'; q and k afterwards are unspecified (roped in place, or as
     * they were: the one pass keeps its rotated q and k to itself). */
    tp_status (*qk_rope_attention)(tp_backend *b, tp_tensor *q, tp_tensor *k, const tp_tensor *v,
                                   const tp_tensor *q_norm, const tp_tensor *k_norm, float eps, int32_t head_dim,
                                   const float *inv_freq, tp_kv_layer *cache, const tp_attn_batch *batch,
                                   int32_t q_heads, float scale, tp_tensor *out);
    /* Optional (NULL: the forward writes the product to a tensor of its own and add_rmsnorm
     * adds it): y += x @ w^T, the product added in f32 where it is made (on a GPU the
     * library's epilogue: no tensor of products written and read back). x [n, k], w [m, k],
     * y [n, m] f32; the sums those of matmul's product added to y. */
    tp_status (*matmul_add)(tp_backend *b, const tp_tensor *x, const tp_tensor *w, tp_tensor *y);

    /* ---- graphs are optional (NULL where the backend has none); staging is not ---- */
    /* Graphs: what is enqueued between graph_begin and graph_end is recorded, not run (no
     * download, upload or synchronize in between); graph_launch replays it on the stream
     * with the pointers and sizes it was recorded with. */
    tp_status (*graph_begin)(tp_backend *b);
    tp_status (*graph_end)(tp_backend *b, void **graph);
    tp_status (*graph_launch)(tp_backend *b, void *graph);
    void (*graph_free)(tp_backend *b, void *graph); /* accepts NULL */
    /* Staging for bulk uploads (weights; pinned memory on a GPU): staging() hands out one
     * of two host buffers of at least bytes, first waiting until the upload last made from
     * it is done; upload_staged() copies from such a buffer without waiting, so the caller
     * fills the other one while this one travels. synchronize() waits for them all;
     * staging(b, 0, NULL) waits and releases both buffers. */
    tp_status (*staging)(tp_backend *b, size_t bytes, void **host);
    tp_status (*upload_staged)(tp_backend *b, void *dst, const void *host, size_t bytes);

    /* Optional (NULL where matmul has nothing to choose): on = 1, matmuls of shapes first
     * seen from now on try the candidate algorithms in turn, timed where they run, and *count
     * (may be NULL) says how many calls of one shape time them all; on = 0 keeps each shape's
     * fastest and says in *count how many shapes had their choice made by timing. Between the
     * two, eager steps only (the warm-up). */
    tp_status (*matmul_tune)(tp_backend *b, int on, int *count);

    /* ---- a step enqueued before the previous one's tokens reach the host (optional:
     * NULL in a backend without them; then every step waits for the one before) ---- */
    /* ids[i] = from[take[i] * stride] where take[i] >= 0, else ids[i] stays: a step's tokens
     * that the step before chose on the device (argmax's ids, stride 1; the sample op's
     * results, the token field of each, stride sizeof(tp_sample_out) / 4). ids, take [n], from
     * [n_from rows of stride]: int32 in backend memory. take[i] >= n_from fails with
     * TP_ERR_INVALID_ARG naming i (on a GPU at the next synchronize() or download_wait(),
     * through the fault word as argmax). */
    tp_status (*take_ids)(tp_backend *b, int32_t *ids, const int32_t *from, int32_t n_from, int32_t stride,
                          const int32_t *take, int32_t n);
    /* tp_argmax_merge in backend memory: pairs [n_tp][L ids | L values] (the TP ranks'
     * argmax winners, gathered), ids [n] */
    tp_status (*argmax_merge)(tp_backend *b, const int32_t *pairs, int n_tp, int32_t L, int32_t n, int64_t vocab_pad,
                              int32_t *ids);
    /* download_start copies bytes from src into the backend's host slot k (0 or 1; it grows
     * to bytes, which may wait for the device) after everything enqueued so far;
     * download_wait waits for that copy alone (work enqueued after it may still run), puts it
     * in dst and reports what synchronize() would (a fault a kernel recorded). */
    tp_status (*download_start)(tp_backend *b, int k, const void *src, size_t bytes);
    tp_status (*download_wait)(tp_backend *b, int k, void *dst);

    /* Optional: a profiler's capture range (on GPUs cudaProfilerStart / Stop), so that a
     * profiler started with capture off sees only the steps TPINFER_PROFILE_STEPS names. */
    void (*profile_range)(tp_backend *b, int on);
    /* Optional: products of one row from now on through the backend's own kernel (own = 1)
     * or the library's (0), for the warm-up to time a batch-1 step both ways; returns 0 where
     * the choice is not the warm-up's to make (the user's setting stands). */
    int (*matmul_one_row)(tp_backend *b, int own);

    void (*destroy)(tp_backend *b);
};

struct tp_backend {
    const struct tp_backend_ops *ops;
    void *ctx;
    const char *name;   /* "cpu", "cuda" */
    tp_dtype act_dtype; /* dtype of activations between operations */
    void *stream;       /* what comm operations are ordered on (cudaStream_t; NULL on CPU) */
    int32_t window_align; /* attention may read (and mask) a window's keys from its first key
                           * rounded down to a multiple of this; blocks before that the caller
                           * may give to other sequences (1: exactly the window) */
};

/* The greedy ids of rows 0..n-1 from every TP rank's winners: pairs is [n_tp][L ids | L f32
 * values] (argmax of each rank's vocabulary slice, columns from r * vocab_pad); the largest
 * value wins, the lower rank on ties, so the lowest column as argmax's rule wants. Host
 * memory; the argmax_merge op does it in backend memory. */
void tp_argmax_merge(const int32_t *pairs, int n_tp, int32_t L, int32_t n, int64_t vocab_pad, int32_t *ids);

/* The CPU backend (OpenMP threads; f32 activations). */
tp_status tp_backend_cpu_create(tp_backend **out);

/* The CUDA backend on GPU device with activations of act_dtype (cuda/backend_cuda.c;
 * only in a build with CUDA). */
tp_status tp_backend_cuda_create(int device, tp_dtype act_dtype, tp_backend **out);

/* By name: "cpu", "cuda" (device = GPU index), or "auto". TP_ERR_UNAVAILABLE when the
 * backend is not built in or has no device. */
tp_status tp_backend_create(const char *name, int device, tp_dtype act_dtype, tp_backend **out);

static inline void tp_backend_destroy(tp_backend *b)
{
    if (b) b->ops->destroy(b);
}

#ifdef __cplusplus
}
#endif
#endif
