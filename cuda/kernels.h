/*
 * kernels.h: the C-visible launchers of the CUDA kernels (one op per .cu file) and the
 * device-side fault record. Each launcher enqueues on the stream it is given (last
 * argument), checks the launch with cudaGetLastError() and never synchronises. Shapes
 * and dtypes are validated by the caller (backend_cuda.c); what only the device can see
 * (an index inside a device array out of range) is written to a tp_cuda_fault, which
 * backend_cuda.c reads back at synchronize().
 */
#ifndef TP_CUDA_KERNELS_H
#define TP_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Attention reads a sliding window's keys from its first key rounded down to a multiple of
 * this (tp_backend.window_align): the split and prefill kernels keep their tiles aligned. */
#define TP_CUDA_WINDOW_ALIGN 64

/* ----------------------------------------------------------------------------
 * faults seen by kernels: the first one wins, later ones are dropped */

typedef enum tp_cuda_fault_code {
    TP_CUDA_FAULT_NONE = 0,
    TP_CUDA_FAULT_GATHER_ROW,   /* gather_rows: rows[index] = value outside [0, limit) */
    TP_CUDA_FAULT_KV_SLOT,      /* kv_store: token index has slot value >= limit slots */
    TP_CUDA_FAULT_ATTN_SEQ,     /* attention: token index has sequence value < 0 */
    TP_CUDA_FAULT_ATTN_POS,     /* attention: token index has position value outside [0, limit) */
    TP_CUDA_FAULT_ATTN_TABLE,   /* attention: token index at position value needs more than limit columns */
    TP_CUDA_FAULT_ATTN_BLOCK,   /* attention: token index maps to physical block value outside [0, limit) */
    TP_CUDA_FAULT_ARGMAX_NAN,   /* argmax: row index of logits has NaN at column value (of limit) */
    TP_CUDA_FAULT_SAMPLE_NAN,   /* sample: row index of logits has NaN at column value (of limit) */
    TP_CUDA_FAULT_SAMPLE_INF,   /* sample: row index of logits has +Inf at column value (of limit) */
    TP_CUDA_FAULT_SAMPLE_TOKEN, /* sample: row index has a penalty or banned token value outside [0, limit) */
    TP_CUDA_FAULT_SAMPLE_PARAM, /* sample: row index has a parameter out of range */
    TP_CUDA_FAULT_TAKE_IDS      /* take_ids: take[index] = value outside the limit ids of the step before */
} tp_cuda_fault_code;

typedef struct tp_cuda_fault {
    int32_t code; /* tp_cuda_fault_code */
    int32_t index;
    int32_t value;
    int32_t limit;
} tp_cuda_fault;

/* ----------------------------------------------------------------------------
 * launchers; tensors are passed by value (device pointers inside) */

/* out[i] = table[ids[i] - vocab_begin], or zeros when that row is not in table */
tp_status tp_cuda_embedding(const int32_t *ids, int32_t n, tp_tensor table, int64_t vocab_begin,
                            tp_tensor out, cudaStream_t stream);

/* residual (f32) += delta (delta.data may be NULL); out = rmsnorm(residual) * weight */
tp_status tp_cuda_add_rmsnorm(tp_tensor residual, tp_tensor delta, tp_tensor weight, float eps,
                              tp_tensor out, cudaStream_t stream);

/* per-head rmsnorm of x in place: x [n, heads * head_dim], weight [1, head_dim] */
tp_status tp_cuda_head_rmsnorm(tp_tensor x, int32_t head_dim, tp_tensor weight, float eps,
                               cudaStream_t stream);

/* rotate-half rotary embedding of x in place: pos [n], inv_freq [head_dim / 2] f32 */
tp_status tp_cuda_rope(tp_tensor x, int32_t head_dim, const int32_t *pos, const float *inv_freq,
                       cudaStream_t stream);

/* cache rows at slot[i] = k[i], v[i] (slot < 0: skipped) */
tp_status tp_cuda_kv_store(tp_tensor k, tp_tensor v, tp_kv_layer cache, const int32_t *slot,
                           int32_t n, tp_cuda_fault *fault, cudaStream_t stream);

/* fused: per-head rmsnorm of q and k (when q_norm.data is not NULL), rope of both at pos,
 * cache rows at slot[i] = k[i], v[i] (slot < 0: skipped; past the cache: the kv_store fault);
 * q, k, v of one dtype, bit for bit head_rmsnorm, rope and kv_store */
tp_status tp_cuda_qk_rope_store(tp_tensor q, tp_tensor k, tp_tensor v, tp_tensor q_norm, tp_tensor k_norm,
                                float eps, int32_t head_dim, const int32_t *pos, const float *inv_freq,
                                tp_kv_layer cache, const int32_t *slot, int32_t n, tp_cuda_fault *fault,
                                cudaStream_t stream);

/* attention's device scratch for split-KV partials (data may be NULL: no splits) and the
 * SM count the splits are sized by; allocated once by the backend */
typedef struct tp_cuda_attn_scratch {
    void *data;
    size_t bytes;
    int sm_count;
} tp_cuda_attn_scratch;

/* causal grouped-query attention over the paged cache */
tp_status tp_cuda_attention(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads,
                            float scale, tp_tensor out, tp_cuda_attn_scratch scratch, tp_cuda_fault *fault,
                            cudaStream_t stream);

/* qk_rope_store without q/k norms, then attention, in the tensor-core decode kernel: each item
 * (token, KV head) ropes its q heads into shared memory and, in the split that holds pos, its
 * k head, which it stores with v at the token's slot before reading that row back. Bit for
 * bit tp_cuda_qk_rope_store then tp_cuda_attention (the cache and out; the same faults, but
 * where one token has two, e.g. a bad slot and a bad block, either may be the one reported),
 * except that q and k in qkv stay as they were. _fits: whether it takes the batch (one token per sequence,
 * batch.one_per_seq, as no item then reads a row another writes, but for padding tokens,
 * whose output is unused; a 16-bit cache with q, k and v of its dtype, head_dim 64 or 128, at
 * most 16 q heads per KV head; not TPINFER_ROPE_ATTENTION=0). */
int tp_cuda_attention_rope_fits(tp_tensor q, tp_tensor k, tp_tensor v, tp_kv_layer cache, tp_attn_batch batch,
                                int32_t q_heads);
tp_status tp_cuda_attention_rope(tp_tensor q, tp_tensor k, tp_tensor v, const float *inv_freq, tp_kv_layer cache,
                                 tp_attn_batch batch, int32_t q_heads, float scale, tp_tensor out,
                                 tp_cuda_attn_scratch scratch, tp_cuda_fault *fault, cudaStream_t stream);

/* on != 0: attention always runs the simple kernel (benchmarks compare the two) */
void tp_cuda_attention_force_simple(int on);

/* the prefill kernel (tensor cores, for prompt chunks): mode > 0 runs it whenever the
 * dtypes and head_dim allow, whatever the step's size; 0 never (the flash kernel alone, as
 * TPINFER_ATTN_PREFILL=0); < 0 the default (steps of 64 tokens or more, outside CUDA graphs).
 * Tests and benchmarks compare the two. */
void tp_cuda_attention_force_prefill(int mode);

/* the tensor-core decode kernel's warps per block: 1, 2 or 4 forced (as TPINFER_ATTN_DT_WARPS,
 * which it overrides), 0 the default; tests reach each kernel's paths with it */
void tp_cuda_attention_force_warps(int w);

/* A diagnostic (bench/gpu_attention): with on, the tensor-core decode kernel's blocks record
 * [entry, first tile in, done] (%globaltimer ns) and their SM; host (when not NULL) gets the
 * first `blocks` records (4 values each) of the last call. */
tp_status tp_cuda_attention_trace(int on, unsigned long long *host, int blocks);

/* out = silu(gate) * up */
tp_status tp_cuda_swiglu(tp_tensor gate, tp_tensor up, tp_tensor out, cudaStream_t stream);
/* out = act(gate) * up: SiLU (gelu 0, swiglu's) or GeLU's tanh form (gelu 1, Gemma's) */
tp_status tp_cuda_gated(tp_tensor gate, tp_tensor up, tp_tensor out, int gelu, cudaStream_t stream);
/* x = cap tanh(x / cap) in place (softcap.cu) */
tp_status tp_cuda_softcap(tp_tensor x, float cap, cudaStream_t stream);

/* out[i] = x[rows[i]] */
tp_status tp_cuda_gather_rows(tp_tensor x, const int32_t *rows, int32_t n, tp_tensor out,
                              tp_cuda_fault *fault, cudaStream_t stream);

/* tp_argmax_merge on the device */
tp_status tp_cuda_argmax_merge(const int32_t *pairs, int n_tp, int32_t L, int32_t n, int64_t vocab_pad, int32_t *ids,
                               cudaStream_t stream);

/* ids[i] = from[take[i] * stride] where take[i] >= 0 */
tp_status tp_cuda_take_ids(int32_t *ids, const int32_t *from, int32_t n_from, int32_t stride, const int32_t *take,
                           int32_t n, tp_cuda_fault *fault, cudaStream_t stream);

/* dst = src converted (same shape) */
tp_status tp_cuda_convert(tp_tensor src, tp_tensor dst, cudaStream_t stream);

/* per row i of logits [L, V] (f32): ids[i] = the column of the largest value, the lowest
 * on ties; logprob[i] (when logprob is not NULL) = its log-softmax, in f32; value[i] (when
 * value is not NULL) = the largest value. A row with NaN is recorded as a fault. */
tp_status tp_cuda_argmax(tp_tensor logits, int32_t *ids, float *logprob, float *value, tp_cuda_fault *fault,
                         cudaStream_t stream);

/* The sample op (sample.cu): rows [0, L) of logits (f32, cols <= 2^22) by rows[i] into
 * out[i], with the penalty and banned ids in tokens; flags: blocks x 2 x cols zeroed uint32 of
 * device scratch (left zeroed), blocks: the most blocks to run (one per SM is enough; when
 * the rows are few, each is split over a cluster of them).
 * NaN/+Inf logits, bad tokens and parameters are recorded as faults. */
tp_status tp_cuda_sample(tp_tensor logits, int32_t L, const tp_sample_row *rows, const int32_t *tokens,
                         tp_sample_out *out, unsigned int *flags, int blocks, tp_cuda_fault *fault,
                         cudaStream_t stream);

/* the most columns tp_cuda_sample takes (its weight sums are sized for it) */
#define TP_CUDA_SAMPLE_MAX_VOCAB (1 << 22)

/* y[i][j] = bias[j], or 0 where bias.data is NULL (bias [1, y.cols]) */
tp_status tp_cuda_bias_fill(tp_tensor y, tp_tensor bias, cudaStream_t stream);

/* Whether gemv takes y = x @ w^T: 1 <= x.rows <= 8, k >= 1, x and w of one dtype or f32 x
 * with 16-bit w, both 16-byte aligned with 16-byte row pitches (gemv.cu) */
int tp_cuda_gemv_fits(const tp_tensor *x, const tp_tensor *w);

/* The GEMV's forms: y [n, m] = x [n, k] @ w [m, k]^T + bias [1, m] (bias.data may be
 * NULL); SWIGLU: y [n, m] = silu(gate) * up where [gate | up] = x @ w^T + bias, w [2m, k],
 * bias [1, 2m]; ADD: y += x @ w^T (no bias). */
enum { TP_GEMV_PLAIN, TP_GEMV_SWIGLU, TP_GEMV_ADD };

/* y by the GEMV in that form, only where tp_cuda_gemv_fits(x, w). sms: the GPU's
 * multiprocessors (grid sizing). w is read before the wait for the kernels before it
 * (programmatic dependent launch): it must be nothing they write (weights). */
tp_status tp_cuda_gemv(tp_tensor x, tp_tensor w, tp_tensor bias, tp_tensor y, int form, int sms,
                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
