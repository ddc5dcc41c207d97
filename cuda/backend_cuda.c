/*
 * backend_cuda.c: the backend table on one GPU. Every operation validates what the host
 * can see (shapes, dtypes, NULL pointers; the same messages as the CPU backend), then
 * enqueues kernels or cuBLASLt on the backend's stream and returns without waiting.
 * Indices that live in device memory (gather rows, cache slots, sequence, position and
 * block-table entries) are checked by the kernels themselves: a bad one never reads or
 * writes out of bounds, it is recorded in a device fault word that synchronize() reads
 * back and reports as TP_ERR_INVALID_ARG, naming the operation and the token. argmax's
 * NaN logits, and sample's NaN/+Inf logits, bad tokens and parameters, are reported the
 * same way, naming the row.
 *
 * Dtypes: activations may be any of f32/f16/bf16 (forward.c passes f32 for the residual
 * stream and the logits and act_dtype elsewhere), weights and the KV cache likewise; the
 * residual of add_rmsnorm is f32 as the contract says. Arithmetic is f32 throughout.
 */
#include "backend_cuda.h"
#include "backend_check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "kernels.h"
#include "matmul.h"
#include "op_profile.h"

#define WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt's workspace */
#define SCRATCH_BYTES ((size_t)64 << 20)   /* matmul's dtype conversions */
#define ATTN_SCRATCH_BYTES ((size_t)64 << 20) /* attention's split-KV partials */
#define SMALL_UPLOAD_BYTES ((size_t)256 << 10) /* a step's metadata: one upload that need not wait */
#define SMALL_UPLOAD_MAX ((size_t)16 << 20)    /* the two buffers grow to this (long block tables) */

typedef struct cuda_ctx {
    int device;
    cudaStream_t stream;
    tp_cuda_gemm *gemm;
    tp_cuda_fault *fault_dev;  /* written by kernels */
    tp_cuda_fault *fault_host; /* pinned; read at synchronize() */
    tp_cuda_attn_scratch attn; /* split-KV partials; the SM count */
    void *stage[2];            /* pinned staging buffers of weight uploads */
    size_t stage_cap[2];
    cudaEvent_t stage_done[2]; /* recorded after the last copy out of each */
    int stage_next;
    void *small[2];            /* pinned: upload()s of up to small_cap bytes, alternately */
    size_t small_cap;          /* SMALL_UPLOAD_BYTES, grown up to SMALL_UPLOAD_MAX */
    cudaEvent_t small_done[2]; /* recorded after the copy out of each */
    int small_next;
    unsigned int *sample_flags; /* sample(): per block a zeroed flag word per column, then a bias per column */
    size_t sample_flags_words;
    int64_t sample_cols;        /* the V the scratch was last zeroed for */
    void *dl[2];               /* pinned: download_start()'s slots */
    size_t dl_cap[2], dl_bytes[2];
    tp_cuda_fault *dl_fault;   /* pinned [2]: the fault word as each slot's copy left it */
    cudaEvent_t dl_done[2];    /* recorded after each slot's copies */
} cuda_ctx;

static cuda_ctx *ctx_of(tp_backend *b) { return (cuda_ctx *)b->ctx; }

// ----------------------------------------------------------------------------
// argument checks: everything the host can see, before anything is enqueued


/* The shared checks, and the kernels' own limit: row counts fit an int. */
static tp_status check_tensor(const char *op, const char *name, const tp_tensor *t)
{
    TP_CHECK(tp_check_tensor(op, name, t));
    if (t->rows > INT32_MAX)
        return tp_error(TP_ERR_UNSUPPORTED, "%s: %s has %lld rows; the CUDA kernels take at most %d",
                        op, name, (long long)t->rows, INT32_MAX);
    return TP_OK;
}


// ----------------------------------------------------------------------------
// faults recorded by kernels, reported at synchronize()

/* seen: a pinned copy of the fault word (fault_host, or a download slot's) */
static tp_status report_fault_in(cuda_ctx *ctx, tp_cuda_fault *seen)
{
    const tp_cuda_fault f = *seen;
    if (f.code == TP_CUDA_FAULT_NONE) return TP_OK;
    memset(seen, 0, sizeof *seen);
    TP_CUDA_CHECK(cudaMemsetAsync(ctx->fault_dev, 0, sizeof *ctx->fault_dev, ctx->stream));
    const char *later = "(seen by the GPU in an operation since the last synchronize)";
    switch (f.code) {
    case TP_CUDA_FAULT_GATHER_ROW:
        return tp_error(TP_ERR_INVALID_ARG, "gather_rows: rows[%d] is %d, outside x's %d rows %s", f.index,
                        f.value, f.limit, later);
    case TP_CUDA_FAULT_KV_SLOT:
        return tp_error(TP_ERR_INVALID_ARG, "kv_store: token %d has slot %d, past the cache's %d slots %s",
                        f.index, f.value, f.limit, later);
    case TP_CUDA_FAULT_ATTN_SEQ:
        return tp_error(TP_ERR_INVALID_ARG, "attention: token %d has sequence %d %s", f.index, f.value, later);
    case TP_CUDA_FAULT_ATTN_POS:
        return tp_error(TP_ERR_INVALID_ARG, "attention: token %d has position %d, outside [0, max_pos %d) %s",
                        f.index, f.value, f.limit, later);
    case TP_CUDA_FAULT_ATTN_TABLE:
        return tp_error(TP_ERR_INVALID_ARG, "attention: token %d at position %d needs a logical block past "
                        "the block table's %d columns %s", f.index, f.value, f.limit, later);
    case TP_CUDA_FAULT_ATTN_BLOCK:
        return tp_error(TP_ERR_INVALID_ARG, "attention: token %d maps a logical block to physical block %d, "
                        "outside the cache's %d %s", f.index, f.value, f.limit, later);
    case TP_CUDA_FAULT_ARGMAX_NAN:
        return tp_error(TP_ERR_NUMERIC, "argmax: row %d of logits has NaN at column %d %s", f.index, f.value,
                        later);
    case TP_CUDA_FAULT_SAMPLE_NAN:
    case TP_CUDA_FAULT_SAMPLE_INF:
        return tp_error(TP_ERR_NUMERIC, "sample: row %d of logits has %s at column %d %s", f.index,
                        f.code == TP_CUDA_FAULT_SAMPLE_NAN ? "NaN" : "+Inf", f.value, later);
    case TP_CUDA_FAULT_SAMPLE_TOKEN:
        return tp_error(TP_ERR_INVALID_ARG, "sample: row %d has a penalty, banned, allowed or logit_bias token %d outside the "
                        "vocabulary [0, %d) %s", f.index, f.value, f.limit, later);
    case TP_CUDA_FAULT_SAMPLE_PARAM:
        return tp_error(TP_ERR_INVALID_ARG, "sample: row %d has a sampling parameter outside its range (see "
                        "tp_sampling_params_validate), n_logprobs outside [0, %d], a negative token offset or "
                        "count, or a logit bias that is not finite %s", f.index, TP_SAMPLE_MAX_LOGPROBS, later);
    case TP_CUDA_FAULT_TAKE_IDS:
        return tp_error(TP_ERR_INVALID_ARG, "take_ids: take[%d] is %d, outside the %d ids of the step before %s",
                        f.index, f.value, f.limit, later);
    default:
        return tp_error(TP_ERR_INTERNAL, "a CUDA kernel recorded fault code %d (token %d, value %d)", f.code,
                        f.index, f.value);
    }
}

static tp_status report_fault(cuda_ctx *ctx) { return report_fault_in(ctx, ctx->fault_host); }

// ----------------------------------------------------------------------------
// memory

static tp_status cuda_alloc(tp_backend *b, size_t bytes, void **out)
{
    if (!out) return tp_error(TP_ERR_INVALID_ARG, "alloc: out is NULL");
    *out = NULL;
    cudaError_t err = cudaMalloc(out, bytes ? bytes : 1); /* a distinct pointer even for 0 bytes */
    if (err == cudaSuccess) return TP_OK;
    (void)cudaGetLastError();
    *out = NULL;
    if (err == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        return tp_error(TP_ERR_OOM, "alloc: out of GPU memory allocating %zu bytes on GPU %d (%zu of %zu "
                        "bytes free)", bytes, ctx_of(b)->device, free_b, total_b);
    }
    return tp_error(TP_ERR_CUDA, "alloc: cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(err));
}

static void cuda_free(tp_backend *b, void *p)
{
    if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError(); /* cudaFree waits for the device */
}

/* Both small buffers at least bytes (at most SMALL_UPLOAD_MAX), their last copies done first. */
static tp_status small_grow(cuda_ctx *ctx, size_t bytes)
{
    size_t cap = ctx->small_cap;
    while (cap < bytes) cap *= 2;
    if (cap > SMALL_UPLOAD_MAX) cap = SMALL_UPLOAD_MAX;
    for (int i = 0; i < 2; i++) {
        TP_CUDA_CHECK(cudaEventSynchronize(ctx->small_done[i]));
        TP_CUDA_CHECK(cudaFreeHost(ctx->small[i]));
        ctx->small[i] = NULL;
    }
    ctx->small_cap = 0; /* until both are back */
    for (int i = 0; i < 2; i++) TP_CUDA_CHECK(cudaMallocHost(&ctx->small[i], cap));
    ctx->small_cap = cap;
    return TP_OK;
}

/* The contract lets the caller reuse the host buffer at once. Uploads of up to
 * SMALL_UPLOAD_MAX bytes (a step's metadata: with long sequences its block table is the most
 * of it) go through one of two pinned buffers and are not waited for: the buffer is reused
 * only after its previous copy is done (its event), by which time the step that copy fed has
 * been enqueued long since, and a step enqueued ahead need not wait for the one before.
 * Larger ones copy, then wait. */
static tp_status cuda_upload(tp_backend *b, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return TP_OK;
    if (!dst || !src) return tp_error(TP_ERR_INVALID_ARG, "upload: NULL pointer for %zu bytes", bytes);
    cuda_ctx *ctx = ctx_of(b);
    if (bytes <= SMALL_UPLOAD_MAX && ctx->small[0] && ctx->small[1]) {
        if (bytes > ctx->small_cap) TP_CHECK(small_grow(ctx, bytes));
        const int s = ctx->small_next;
        ctx->small_next ^= 1;
        TP_CUDA_CHECK(cudaEventSynchronize(ctx->small_done[s]));
        memcpy(ctx->small[s], src, bytes);
        TP_CUDA_CHECK(cudaMemcpyAsync(dst, ctx->small[s], bytes, cudaMemcpyHostToDevice, ctx->stream));
        TP_CUDA_CHECK(cudaEventRecord(ctx->small_done[s], ctx->stream));
        return TP_OK;
    }
    TP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream));
    TP_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    return TP_OK;
}

static tp_status cuda_download(tp_backend *b, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return TP_OK;
    if (!dst || !src) return tp_error(TP_ERR_INVALID_ARG, "download: NULL pointer for %zu bytes", bytes);
    TP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx_of(b)->stream));
    return TP_OK;
}

static tp_status cuda_memset0(tp_backend *b, void *p, size_t bytes)
{
    if (bytes == 0) return TP_OK;
    if (!p) return tp_error(TP_ERR_INVALID_ARG, "memset0: NULL pointer for %zu bytes", bytes);
    TP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_of(b)->stream));
    return TP_OK;
}

/* Wait for the stream, then report a fault a kernel recorded (its 16 bytes come back with
 * the same wait). */
static tp_status cuda_synchronize(tp_backend *b)
{
    cuda_ctx *ctx = ctx_of(b);
    TP_CUDA_CHECK(cudaMemcpyAsync(ctx->fault_host, ctx->fault_dev, sizeof *ctx->fault_host,
                                  cudaMemcpyDeviceToHost, ctx->stream));
    TP_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    return report_fault(ctx);
}

/* The copy and the fault word go to pinned slot k, then an event: download_wait waits for
 * that event alone, so the steps enqueued after it keep running. */
static tp_status cuda_download_start(tp_backend *b, int k, const void *src, size_t bytes)
{
    cuda_ctx *ctx = ctx_of(b);
    if (k < 0 || k > 1) return tp_error(TP_ERR_INVALID_ARG, "download_start: slot %d is not 0 or 1", k);
    if (bytes && !src) return tp_error(TP_ERR_INVALID_ARG, "download_start: src is NULL for %zu bytes", bytes);
    if (!ctx->dl_fault) {
        TP_CUDA_CHECK(cudaMallocHost((void **)&ctx->dl_fault, 2 * sizeof *ctx->dl_fault));
        memset(ctx->dl_fault, 0, 2 * sizeof *ctx->dl_fault);
    }
    if (!ctx->dl_done[k]) TP_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->dl_done[k], cudaEventDisableTiming));
    if (bytes > ctx->dl_cap[k]) { /* the slot's last copy is done before its memory goes */
        TP_CUDA_CHECK(cudaEventSynchronize(ctx->dl_done[k]));
        if (ctx->dl[k]) TP_CUDA_CHECK(cudaFreeHost(ctx->dl[k]));
        ctx->dl[k] = NULL;
        ctx->dl_cap[k] = 0;
        const size_t cap = bytes < 4096 ? 4096 : bytes;
        TP_CUDA_CHECK(cudaMallocHost(&ctx->dl[k], cap));
        ctx->dl_cap[k] = cap;
    }
    ctx->dl_bytes[k] = bytes;
    if (bytes) TP_CUDA_CHECK(cudaMemcpyAsync(ctx->dl[k], src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    TP_CUDA_CHECK(cudaMemcpyAsync(&ctx->dl_fault[k], ctx->fault_dev, sizeof *ctx->fault_dev, cudaMemcpyDeviceToHost,
                                  ctx->stream));
    TP_CUDA_CHECK(cudaEventRecord(ctx->dl_done[k], ctx->stream));
    return TP_OK;
}

static tp_status cuda_download_wait(tp_backend *b, int k, void *dst)
{
    cuda_ctx *ctx = ctx_of(b);
    if (k < 0 || k > 1 || !ctx->dl_done[k])
        return tp_error(TP_ERR_INVALID_ARG, "download_wait: slot %d was not started", k);
    TP_CUDA_CHECK(cudaEventSynchronize(ctx->dl_done[k]));
    TP_CHECK(report_fault_in(ctx, &ctx->dl_fault[k]));
    if (ctx->dl_bytes[k]) {
        if (!dst) return tp_error(TP_ERR_INVALID_ARG, "download_wait: dst is NULL");
        memcpy(dst, ctx->dl[k], ctx->dl_bytes[k]);
    }
    return TP_OK;
}

static void cuda_profile_range(tp_backend *b, int on)
{
    (void)b;
    if ((on ? cudaProfilerStart() : cudaProfilerStop()) != cudaSuccess) (void)cudaGetLastError();
}

// ----------------------------------------------------------------------------
// operations

static tp_status cuda_embedding(tp_backend *b, const int32_t *ids, int32_t n, const tp_tensor *table,
                                int64_t vocab_begin, tp_tensor *out)
{
    TP_CHECK(check_tensor("embedding", "table", table));
    TP_CHECK(check_tensor("embedding", "out", out));
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "embedding: n is %d", n);
    TP_CHECK(tp_check_shape("embedding", "out", out, n, table->cols));
    if (n > 0 && !ids) return tp_error(TP_ERR_INVALID_ARG, "embedding: ids is NULL");
    return tp_cuda_embedding(ids, n, *table, vocab_begin, *out, ctx_of(b)->stream);
}

static tp_status cuda_add_rmsnorm(tp_backend *b, tp_tensor *residual, const tp_tensor *delta,
                                  const tp_tensor *weight, float eps, tp_tensor *out)
{
    TP_CHECK(check_tensor("add_rmsnorm", "residual", residual));
    if (residual->dtype != TP_DTYPE_F32)
        return tp_error(TP_ERR_INVALID_ARG, "add_rmsnorm: residual is %s; the residual stream is float32",
                        tp_dtype_name(residual->dtype));
    TP_CHECK(check_tensor("add_rmsnorm", "weight", weight));
    TP_CHECK(check_tensor("add_rmsnorm", "out", out));
    const int64_t n = residual->rows, d = residual->cols;
    tp_tensor none;
    memset(&none, 0, sizeof none);
    if (delta) {
        TP_CHECK(check_tensor("add_rmsnorm", "delta", delta));
        TP_CHECK(tp_check_shape("add_rmsnorm", "delta", delta, n, d));
    }
    TP_CHECK(tp_check_shape("add_rmsnorm", "weight", weight, 1, d));
    TP_CHECK(tp_check_shape("add_rmsnorm", "out", out, n, d));
    return tp_cuda_add_rmsnorm(*residual, delta ? *delta : none, *weight, eps, *out, ctx_of(b)->stream);
}

static tp_status cuda_head_rmsnorm(tp_backend *b, tp_tensor *x, int32_t head_dim, const tp_tensor *weight,
                                   float eps)
{
    TP_CHECK(check_tensor("head_rmsnorm", "x", x));
    TP_CHECK(check_tensor("head_rmsnorm", "weight", weight));
    if (head_dim <= 0 || x->cols % head_dim != 0)
        return tp_error(TP_ERR_INVALID_ARG, "head_rmsnorm: x has %lld columns, not a multiple of "
                        "head_dim %d", (long long)x->cols, head_dim);
    TP_CHECK(tp_check_shape("head_rmsnorm", "weight", weight, 1, head_dim));
    return tp_cuda_head_rmsnorm(*x, head_dim, *weight, eps, ctx_of(b)->stream);
}

/* matmul's and matmul_add's checks, under op */
static tp_status matmul_check(const char *op, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                              const tp_tensor *y)
{
    TP_CHECK(check_tensor(op, "x", x));
    TP_CHECK(check_tensor(op, "w", w));
    TP_CHECK(check_tensor(op, "y", y));
    if (x->cols != w->cols)
        return tp_error(TP_ERR_INVALID_ARG, "%s: x has %lld columns but w has %lld", op, (long long)x->cols,
                        (long long)w->cols);
    TP_CHECK(tp_check_shape(op, "y", y, x->rows, w->rows));
    if (bias) {
        TP_CHECK(check_tensor(op, "bias", bias));
        TP_CHECK(tp_check_shape(op, "bias", bias, 1, w->rows));
    }
    return TP_OK;
}

static tp_status cuda_matmul(tp_backend *b, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                             tp_tensor *y)
{
    TP_CHECK(matmul_check("matmul", x, w, bias, y));
    return tp_cuda_matmul(ctx_of(b)->gemm, x, w, bias, y, ctx_of(b)->stream);
}

static tp_status cuda_matmul_add(tp_backend *b, const tp_tensor *x, const tp_tensor *w, tp_tensor *y)
{
    TP_CHECK(matmul_check("matmul_add", x, w, NULL, y));
    if (y->dtype != TP_DTYPE_F32)
        return tp_error(TP_ERR_INVALID_ARG, "matmul_add: y is %s; the sums it adds to must be f32",
                        tp_dtype_name(y->dtype));
    return tp_cuda_matmul_add(ctx_of(b)->gemm, x, w, y, ctx_of(b)->stream);
}

static tp_status cuda_rope(tp_backend *b, tp_tensor *x, int32_t head_dim, const int32_t *pos,
                           const float *inv_freq)
{
    TP_CHECK(check_tensor("rope", "x", x));
    if (head_dim <= 0 || head_dim % 2 != 0 || x->cols % head_dim != 0)
        return tp_error(TP_ERR_INVALID_ARG, "rope: head_dim %d must be even and divide x's %lld "
                        "columns", head_dim, (long long)x->cols);
    if (x->rows == 0 || x->cols == 0) return TP_OK;
    if (!pos || !inv_freq) return tp_error(TP_ERR_INVALID_ARG, "rope: pos or inv_freq is NULL");
    return tp_cuda_rope(*x, head_dim, pos, inv_freq, ctx_of(b)->stream);
}

static tp_status cuda_kv_store(tp_backend *b, const tp_tensor *k, const tp_tensor *v, tp_kv_layer *cache,
                               const tp_attn_batch *batch)
{
    TP_CHECK(tp_check_cache("kv_store", cache));
    if (!batch) return tp_error(TP_ERR_INVALID_ARG, "kv_store: batch is NULL");
    TP_CHECK(check_tensor("kv_store", "k", k));
    TP_CHECK(check_tensor("kv_store", "v", v));
    const int64_t n = batch->n_tokens, width = (int64_t)cache->n_kv_heads * cache->head_dim;
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "kv_store: batch has %lld tokens", (long long)n);
    TP_CHECK(tp_check_shape("kv_store", "k", k, n, width));
    TP_CHECK(tp_check_shape("kv_store", "v", v, n, width));
    if (n == 0) return TP_OK;
    if (!batch->slot) return tp_error(TP_ERR_INVALID_ARG, "kv_store: batch->slot is NULL");
    cuda_ctx *ctx = ctx_of(b);
    return tp_cuda_kv_store(*k, *v, *cache, batch->slot, (int32_t)n, ctx->fault_dev, ctx->stream);
}

static tp_status attention_check(const tp_tensor *q, const tp_kv_layer *cache, const tp_attn_batch *batch,
                                 int32_t q_heads, const tp_tensor *out)
{
    TP_CHECK(tp_check_cache("attention", cache));
    if (!batch) return tp_error(TP_ERR_INVALID_ARG, "attention: batch is NULL");
    TP_CHECK(check_tensor("attention", "q", q));
    TP_CHECK(check_tensor("attention", "out", out));
    const int64_t hd = cache->head_dim, kvh = cache->n_kv_heads, n = batch->n_tokens;
    if (q_heads <= 0 || q_heads % kvh != 0)
        return tp_error(TP_ERR_INVALID_ARG, "attention: %d q heads is not a positive multiple of the "
                        "cache's %lld kv heads", q_heads, (long long)kvh);
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "attention: batch has %lld tokens", (long long)n);
    TP_CHECK(tp_check_shape("attention", "q", q, n, q_heads * hd));
    TP_CHECK(tp_check_shape("attention", "out", out, n, q_heads * hd));
    if (n == 0) return TP_OK; /* the tables are not read */
    if (!batch->seq || !batch->pos || !batch->block_table)
        return tp_error(TP_ERR_INVALID_ARG, "attention: batch has a NULL seq, pos or block_table");
    if (batch->max_blocks <= 0 || batch->max_pos <= 0)
        return tp_error(TP_ERR_INVALID_ARG, "attention: batch has max_blocks %d, max_pos %d; both "
                        "must be > 0", batch->max_blocks, batch->max_pos);
    return TP_OK;
}

static tp_status cuda_attention(tp_backend *b, const tp_tensor *q, const tp_kv_layer *cache,
                                const tp_attn_batch *batch, int32_t q_heads, float scale, tp_tensor *out)
{
    TP_CHECK(attention_check(q, cache, batch, q_heads, out));
    if (batch->n_tokens == 0) return TP_OK;
    cuda_ctx *ctx = ctx_of(b);
    return tp_cuda_attention(*q, *cache, *batch, q_heads, scale, *out, ctx->attn, ctx->fault_dev, ctx->stream);
}

/* swiglu and geglu (gelu): the gate's SiLU or GeLU (tanh form), times up */
static tp_status cuda_gated(tp_backend *b, const char *op, int gelu, const tp_tensor *gate, const tp_tensor *up,
                            tp_tensor *out)
{
    TP_CHECK(check_tensor(op, "gate", gate));
    TP_CHECK(check_tensor(op, "up", up));
    TP_CHECK(check_tensor(op, "out", out));
    TP_CHECK(tp_check_shape(op, "up", up, gate->rows, gate->cols));
    TP_CHECK(tp_check_shape(op, "out", out, gate->rows, gate->cols));
    return tp_cuda_gated(*gate, *up, *out, gelu, ctx_of(b)->stream);
}

static tp_status cuda_swiglu(tp_backend *b, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out)
{
    return cuda_gated(b, "swiglu", 0, gate, up, out);
}

static tp_status cuda_geglu(tp_backend *b, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out)
{
    return cuda_gated(b, "geglu", 1, gate, up, out);
}

static tp_status cuda_softcap(tp_backend *b, tp_tensor *x, float cap)
{
    TP_CHECK(check_tensor("softcap", "x", x));
    if (!(cap > 0)) return tp_error(TP_ERR_INVALID_ARG, "softcap: cap %g must be > 0", cap);
    return tp_cuda_softcap(*x, cap, ctx_of(b)->stream);
}

static tp_status cuda_argmax_merge(tp_backend *b, const int32_t *pairs, int n_tp, int32_t L, int32_t n,
                                   int64_t vocab_pad, int32_t *ids)
{
    TP_CHECK(tp_check_argmax_merge(pairs, n_tp, L, n, ids));
    return tp_cuda_argmax_merge(pairs, n_tp, L, n, vocab_pad, ids, ctx_of(b)->stream);
}

static tp_status cuda_take_ids(tp_backend *b, int32_t *ids, const int32_t *from, int32_t n_from, int32_t stride,
                               const int32_t *take, int32_t n)
{
    TP_CHECK(tp_check_take_ids(ids, from, n_from, stride, take, n));
    cuda_ctx *ctx = ctx_of(b);
    return tp_cuda_take_ids(ids, from, n_from, stride, take, n, ctx->fault_dev, ctx->stream);
}

static tp_status cuda_gather_rows(tp_backend *b, const tp_tensor *x, const int32_t *rows, int32_t n,
                                  tp_tensor *out)
{
    TP_CHECK(check_tensor("gather_rows", "x", x));
    TP_CHECK(check_tensor("gather_rows", "out", out));
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "gather_rows: n is %d", n);
    TP_CHECK(tp_check_shape("gather_rows", "out", out, n, x->cols));
    if (n > 0 && !rows) return tp_error(TP_ERR_INVALID_ARG, "gather_rows: rows is NULL");
    cuda_ctx *ctx = ctx_of(b);
    return tp_cuda_gather_rows(*x, rows, n, *out, ctx->fault_dev, ctx->stream);
}

static tp_status cuda_convert(tp_backend *b, const tp_tensor *src, tp_tensor *dst)
{
    TP_CHECK(check_tensor("convert", "src", src));
    TP_CHECK(check_tensor("convert", "dst", dst));
    TP_CHECK(tp_check_shape("convert", "dst", dst, src->rows, src->cols));
    return tp_cuda_convert(*src, *dst, ctx_of(b)->stream);
}

/* Greedy sampling: host-visible checks as the CPU backend's; a NaN is a device fault. */
static tp_status cuda_argmax(tp_backend *b, const tp_tensor *logits, int32_t *ids, float *logprob, float *value)
{
    TP_CHECK(check_tensor("argmax", "logits", logits));
    if (logits->dtype != TP_DTYPE_F32)
        return tp_error(TP_ERR_INVALID_ARG, "argmax: logits is %s; argmax reads float32 logits",
                        tp_dtype_name(logits->dtype));
    const int64_t L = logits->rows, V = logits->cols;
    if (L == 0) return TP_OK;
    if (V == 0)
        return tp_error(TP_ERR_INVALID_ARG, "argmax: logits has %lld rows but no columns", (long long)L);
    if (V > INT32_MAX)
        return tp_error(TP_ERR_INVALID_ARG, "argmax: logits has %lld columns, more than int32 ids reach",
                        (long long)V);
    if (!ids) return tp_error(TP_ERR_INVALID_ARG, "argmax: ids is NULL");
    cuda_ctx *ctx = ctx_of(b);
    return tp_cuda_argmax(*logits, ids, logprob, value, ctx->fault_dev, ctx->stream);
}

/* Sampling: host-visible checks shared with the CPU backend; the rows' parameters, tokens
 * and NaN/+Inf logits are device faults. The flag scratch (blocks x V words, kept zeroed by
 * the kernel) is allocated at the first call, or when V grows, outside graph capture. */
static tp_status cuda_sample(tp_backend *b, const tp_tensor *logits, int32_t L, const tp_sample_row *rows,
                             const int32_t *tokens, tp_sample_out *out)
{
    TP_CHECK(tp_check_sample(logits, L, rows, out));
    if (L == 0) return TP_OK;
    if (logits->cols > TP_CUDA_SAMPLE_MAX_VOCAB)
        return tp_error(TP_ERR_UNSUPPORTED, "sample: logits has %lld columns; the CUDA kernel takes at most %d",
                        (long long)logits->cols, TP_CUDA_SAMPLE_MAX_VOCAB);
    cuda_ctx *ctx = ctx_of(b);
    const int blocks = ctx->attn.sm_count > 0 ? ctx->attn.sm_count : 1;
    const size_t words = (size_t)blocks * 2 * (size_t)logits->cols; /* per block: flags, then biases */
    /* per block V flags, then V biases: another V moves the blocks' regions over words the
     * last calls left non-zero (biases are never cleared), so the scratch is zeroed again */
    if (ctx->sample_flags_words < words || ctx->sample_cols != logits->cols) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        TP_CUDA_CHECK(cudaStreamIsCapturing(ctx->stream, &cs));
        if (cs != cudaStreamCaptureStatusNone)
            return tp_error(TP_ERR_UNSUPPORTED, "sample: its scratch is allocated at the first call, which must "
                            "not be inside graph capture (call sample in an eager step first)");
        if (ctx->sample_flags_words < words) {
            TP_CUDA_CHECK(cudaStreamSynchronize(ctx->stream)); /* no kernel still uses the old scratch */
            if (ctx->sample_flags) TP_CUDA_CHECK(cudaFree(ctx->sample_flags));
            ctx->sample_flags = NULL;
            ctx->sample_flags_words = 0;
            TP_CHECK(cuda_alloc(b, words * sizeof(unsigned int), (void **)&ctx->sample_flags));
            ctx->sample_flags_words = words;
        }
        TP_CUDA_CHECK(cudaMemsetAsync(ctx->sample_flags, 0, ctx->sample_flags_words * sizeof(unsigned int), ctx->stream));
        ctx->sample_cols = logits->cols;
    }
    return tp_cuda_sample(*logits, L, rows, tokens, out, ctx->sample_flags, blocks, ctx->fault_dev, ctx->stream);
}

/* matmul's and swiglu's checks under one name; then the fused GEMV for small n (gate_up
 * untouched), else matmul into gate_up and swiglu (matmul.c). */
static tp_status cuda_matmul_swiglu(tp_backend *b, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                                    tp_tensor *gate_up, tp_tensor *out)
{
    const char *op = "matmul_swiglu";
    TP_CHECK(check_tensor(op, "x", x));
    TP_CHECK(check_tensor(op, "w", w));
    TP_CHECK(check_tensor(op, "gate_up", gate_up));
    TP_CHECK(check_tensor(op, "out", out));
    if (w->rows % 2 != 0)
        return tp_error(TP_ERR_INVALID_ARG, "matmul_swiglu: w has %lld rows; gate and up need an even count",
                        (long long)w->rows);
    if (x->cols != w->cols)
        return tp_error(TP_ERR_INVALID_ARG, "matmul_swiglu: x has %lld columns but w has %lld",
                        (long long)x->cols, (long long)w->cols);
    TP_CHECK(tp_check_shape(op, "gate_up", gate_up, x->rows, w->rows));
    TP_CHECK(tp_check_shape(op, "out", out, x->rows, w->rows / 2));
    if (bias) {
        TP_CHECK(check_tensor(op, "bias", bias));
        TP_CHECK(tp_check_shape(op, "bias", bias, 1, w->rows));
    }
    cuda_ctx *ctx = ctx_of(b);
    return tp_cuda_matmul_swiglu(ctx->gemm, x, w, bias, gate_up, out, ctx->stream);
}

/* head_rmsnorm (when q_norm is given), rope of q and k, kv_store: their checks under one
 * name, then one kernel. A slot past the cache is kv_store's device fault. */
static tp_status qk_rope_store_check(const tp_tensor *q, const tp_tensor *k, const tp_tensor *v,
                                     const tp_tensor *q_norm, const tp_tensor *k_norm, int32_t head_dim,
                                     const float *inv_freq, const tp_kv_layer *cache, const tp_attn_batch *batch)
{
    const char *op = "qk_rope_store";
    if (!batch) return tp_error(TP_ERR_INVALID_ARG, "qk_rope_store: batch is NULL");
    TP_CHECK(tp_check_cache(op, cache));
    TP_CHECK(check_tensor(op, "q", q));
    TP_CHECK(check_tensor(op, "k", k));
    TP_CHECK(check_tensor(op, "v", v));
    if (head_dim <= 0 || head_dim % 2 != 0 || q->cols % head_dim != 0 || k->cols % head_dim != 0)
        return tp_error(TP_ERR_INVALID_ARG, "qk_rope_store: head_dim %d must be even and divide q's %lld "
                        "and k's %lld columns", head_dim, (long long)q->cols, (long long)k->cols);
    const int64_t n = batch->n_tokens, width = (int64_t)cache->n_kv_heads * cache->head_dim;
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "qk_rope_store: batch has %lld tokens", (long long)n);
    TP_CHECK(tp_check_shape(op, "q", q, n, q->cols));
    TP_CHECK(tp_check_shape(op, "k", k, n, width));
    TP_CHECK(tp_check_shape(op, "v", v, n, width));
    if (q_norm) {
        if (!k_norm) return tp_error(TP_ERR_INVALID_ARG, "qk_rope_store: q_norm without k_norm");
        TP_CHECK(check_tensor(op, "q_norm", q_norm));
        TP_CHECK(check_tensor(op, "k_norm", k_norm));
        TP_CHECK(tp_check_shape(op, "q_norm", q_norm, 1, head_dim));
        TP_CHECK(tp_check_shape(op, "k_norm", k_norm, 1, head_dim));
    }
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return tp_error(TP_ERR_UNSUPPORTED, "qk_rope_store: q, k and v are %s, %s and %s; the CUDA kernel "
                        "takes them in one dtype (columns of one qkv)", tp_dtype_name(q->dtype),
                        tp_dtype_name(k->dtype), tp_dtype_name(v->dtype));
    if (n == 0) return TP_OK; /* pos, slot and inv_freq are not read */
    if (!batch->pos || !batch->slot)
        return tp_error(TP_ERR_INVALID_ARG, "qk_rope_store: batch has a NULL pos or slot");
    if (!inv_freq) return tp_error(TP_ERR_INVALID_ARG, "qk_rope_store: inv_freq is NULL");
    return TP_OK;
}

static tp_status cuda_qk_rope_store(tp_backend *b, tp_tensor *q, tp_tensor *k, const tp_tensor *v,
                                    const tp_tensor *q_norm, const tp_tensor *k_norm, float eps, int32_t head_dim,
                                    const float *inv_freq, tp_kv_layer *cache, const tp_attn_batch *batch)
{
    TP_CHECK(qk_rope_store_check(q, k, v, q_norm, k_norm, head_dim, inv_freq, cache, batch));
    if (batch->n_tokens == 0) return TP_OK;
    tp_tensor none;
    memset(&none, 0, sizeof none);
    cuda_ctx *ctx = ctx_of(b);
    return tp_cuda_qk_rope_store(*q, *k, *v, q_norm ? *q_norm : none, q_norm ? *k_norm : none, eps, head_dim,
                                 batch->pos, inv_freq, *cache, batch->slot, (int32_t)batch->n_tokens,
                                 ctx->fault_dev, ctx->stream);
}

/* qk_rope_store then attention, both ops' checks; one kernel where the decode kernel can rope
 * and store its own item's rows (tp_cuda_attention_rope_fits: a decode step's batch without
 * q/k norms), else the two ops. */
static tp_status cuda_qk_rope_attention(tp_backend *b, tp_tensor *q, tp_tensor *k, const tp_tensor *v,
                                        const tp_tensor *q_norm, const tp_tensor *k_norm, float eps, int32_t head_dim,
                                        const float *inv_freq, tp_kv_layer *cache, const tp_attn_batch *batch,
                                        int32_t q_heads, float scale, tp_tensor *out)
{
    TP_CHECK(qk_rope_store_check(q, k, v, q_norm, k_norm, head_dim, inv_freq, cache, batch));
    TP_CHECK(attention_check(q, cache, batch, q_heads, out));
    if (batch->n_tokens == 0) return TP_OK;
    cuda_ctx *ctx = ctx_of(b);
    if (!q_norm && head_dim == cache->head_dim && tp_cuda_attention_rope_fits(*q, *k, *v, *cache, *batch, q_heads))
        return tp_cuda_attention_rope(*q, *k, *v, inv_freq, *cache, *batch, q_heads, scale, *out, ctx->attn,
                                      ctx->fault_dev, ctx->stream);
    TP_CHECK(cuda_qk_rope_store(b, q, k, v, q_norm, k_norm, eps, head_dim, inv_freq, cache, batch));
    return cuda_attention(b, q, cache, batch, q_heads, scale, out);
}

static tp_status cuda_matmul_tune(tp_backend *b, int on, int *count)
{
    return tp_cuda_gemm_tune(ctx_of(b)->gemm, on, count);
}

static int cuda_matmul_one_row(tp_backend *b, int own)
{
    return tp_cuda_gemm_one_row(ctx_of(b)->gemm, own);
}

// ----------------------------------------------------------------------------
// graphs: a decode step recorded once per batch size and replayed (NCCL calls included)

static tp_status cuda_graph_begin(tp_backend *b)
{
    /* thread-local: only this thread's calls into CUDA are checked for capture safety */
    TP_CUDA_CHECK(cudaStreamBeginCapture(ctx_of(b)->stream, cudaStreamCaptureModeThreadLocal));
    return TP_OK;
}

/* Ends the capture (also after a failed operation, so the stream is usable again) and
 * instantiates what was recorded. */
static tp_status cuda_graph_end(tp_backend *b, void **graph)
{
    if (graph) *graph = NULL;
    cudaGraph_t g = NULL;
    cudaError_t err = cudaStreamEndCapture(ctx_of(b)->stream, &g);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return tp_error(TP_ERR_CUDA, "graph capture failed: %s (an operation that cannot be recorded, "
                        "or a wait inside the step; --enforce-eager runs without graphs)", cudaGetErrorString(err));
    }
    if (!graph) {
        cudaGraphDestroy(g);
        return TP_OK;
    }
    cudaGraphExec_t exec = NULL;
    err = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return tp_error(TP_ERR_CUDA, "cudaGraphInstantiate failed: %s", cudaGetErrorString(err));
    }
    *graph = exec;
    return TP_OK;
}

static tp_status cuda_graph_launch(tp_backend *b, void *graph)
{
    if (!graph) return tp_error(TP_ERR_INVALID_ARG, "graph_launch: graph is NULL");
    TP_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, ctx_of(b)->stream));
    return TP_OK;
}

static void cuda_graph_free(tp_backend *b, void *graph)
{
    (void)b;
    if (graph && cudaGraphExecDestroy((cudaGraphExec_t)graph) != cudaSuccess) (void)cudaGetLastError();
}

// ----------------------------------------------------------------------------
// pinned staging: the loader fills one buffer while the other is copied

static tp_status cuda_staging(tp_backend *b, size_t bytes, void **host)
{
    cuda_ctx *ctx = ctx_of(b);
    if (!host && bytes == 0) { /* release, once their copies are done */
        for (int i = 0; i < 2; i++) {
            if (ctx->stage_done[i]) TP_CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[i]));
            if (ctx->stage[i]) cudaFreeHost(ctx->stage[i]);
            ctx->stage[i] = NULL;
            ctx->stage_cap[i] = 0;
        }
        return TP_OK;
    }
    if (!host) return tp_error(TP_ERR_INVALID_ARG, "staging: host is NULL");
    const int s = ctx->stage_next;
    ctx->stage_next ^= 1;
    if (!ctx->stage_done[s]) TP_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->stage_done[s], cudaEventDisableTiming));
    TP_CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[s])); /* its last copy has finished */
    if (ctx->stage_cap[s] < bytes) {
        if (ctx->stage[s]) cudaFreeHost(ctx->stage[s]);
        ctx->stage[s] = NULL;
        ctx->stage_cap[s] = 0;
        cudaError_t err = cudaMallocHost(&ctx->stage[s], bytes);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return tp_error(TP_ERR_OOM, "staging: cudaMallocHost of %zu pinned bytes failed: %s", bytes,
                            cudaGetErrorString(err));
        }
        ctx->stage_cap[s] = bytes;
    }
    *host = ctx->stage[s];
    return TP_OK;
}

static tp_status cuda_upload_staged(tp_backend *b, void *dst, const void *host, size_t bytes)
{
    cuda_ctx *ctx = ctx_of(b);
    const int s = tp_staging_slot(ctx->stage, ctx->stage_cap, host, bytes);
    if (s < 0) return TP_ERR_INVALID_ARG;
    if (bytes == 0) return TP_OK;
    if (!dst) return tp_error(TP_ERR_INVALID_ARG, "upload_staged: dst is NULL");
    TP_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    TP_CUDA_CHECK(cudaEventRecord(ctx->stage_done[s], ctx->stream));
    return TP_OK;
}

// ----------------------------------------------------------------------------
// the table

static void cuda_destroy(tp_backend *b)
{
    if (!b) return;
    cuda_ctx *ctx = ctx_of(b);
    if (ctx) {
        if (ctx->stream && cudaStreamSynchronize(ctx->stream) != cudaSuccess) (void)cudaGetLastError();
        tp_cuda_gemm_destroy(ctx->gemm);
        if (ctx->fault_dev) cudaFree(ctx->fault_dev);
        if (ctx->fault_host) cudaFreeHost(ctx->fault_host);
        if (ctx->attn.data) cudaFree(ctx->attn.data);
        if (ctx->sample_flags) cudaFree(ctx->sample_flags);
        for (int i = 0; i < 2; i++) {
            if (ctx->small[i]) cudaFreeHost(ctx->small[i]);
            if (ctx->small_done[i]) cudaEventDestroy(ctx->small_done[i]);
        }
        for (int i = 0; i < 2; i++) {
            if (ctx->stage[i]) cudaFreeHost(ctx->stage[i]);
            if (ctx->stage_done[i]) cudaEventDestroy(ctx->stage_done[i]);
            if (ctx->dl[i]) cudaFreeHost(ctx->dl[i]);
            if (ctx->dl_done[i]) cudaEventDestroy(ctx->dl_done[i]);
        }
        if (ctx->dl_fault) cudaFreeHost(ctx->dl_fault);
        if (ctx->stream) cudaStreamDestroy(ctx->stream);
        (void)cudaGetLastError();
        free(ctx);
    }
    free(b);
}

static const struct tp_backend_ops cuda_ops = {
    /* .alloc        = */ cuda_alloc,
    /* .free         = */ cuda_free,
    /* .upload       = */ cuda_upload,
    /* .download     = */ cuda_download,
    /* .memset0      = */ cuda_memset0,
    /* .synchronize  = */ cuda_synchronize,
    /* .embedding    = */ cuda_embedding,
    /* .add_rmsnorm  = */ cuda_add_rmsnorm,
    /* .head_rmsnorm = */ cuda_head_rmsnorm,
    /* .matmul       = */ cuda_matmul,
    /* .rope         = */ cuda_rope,
    /* .kv_store     = */ cuda_kv_store,
    /* .attention    = */ cuda_attention,
    /* .swiglu       = */ cuda_swiglu,
    /* .geglu        = */ cuda_geglu,
    /* .softcap      = */ cuda_softcap,
    /* .gather_rows  = */ cuda_gather_rows,
    /* .convert      = */ cuda_convert,
    /* .argmax       = */ cuda_argmax,
    /* .sample       = */ cuda_sample,
    /* .matmul_swiglu= */ cuda_matmul_swiglu,
    /* .qk_rope_store= */ cuda_qk_rope_store,
    /* .qk_rope_attention = */ cuda_qk_rope_attention,
    /* .matmul_add = */ cuda_matmul_add,
    /* .graph_begin  = */ cuda_graph_begin,
    /* .graph_end    = */ cuda_graph_end,
    /* .graph_launch = */ cuda_graph_launch,
    /* .graph_free   = */ cuda_graph_free,
    /* .staging      = */ cuda_staging,
    /* .upload_staged= */ cuda_upload_staged,
    /* .matmul_tune  = */ cuda_matmul_tune,
    /* .take_ids     = */ cuda_take_ids,
    /* .argmax_merge = */ cuda_argmax_merge,
    /* .download_start = */ cuda_download_start,
    /* .download_wait  = */ cuda_download_wait,
    /* .profile_range  = */ cuda_profile_range,
    /* .matmul_one_row = */ cuda_matmul_one_row,
    /* .destroy      = */ cuda_destroy,
};

tp_status tp_backend_cuda_create(int device, tp_dtype act_dtype, tp_backend **out)
{
    if (!out) return tp_error(TP_ERR_INVALID_ARG, "tp_backend_cuda_create: out is NULL");
    *out = NULL;
    if (!tp_dtype_is_float(act_dtype))
        return tp_error(TP_ERR_INVALID_ARG, "the CUDA backend's activations are float32, float16 or "
                        "bfloat16, not %s", tp_dtype_name(act_dtype));
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return tp_error(TP_ERR_UNAVAILABLE, "no CUDA device: %s",
                        err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found none");
    }
    if (device < 0 || device >= count)
        return tp_error(TP_ERR_UNAVAILABLE, "CUDA device %d does not exist: %d visible "
                        "(CUDA_VISIBLE_DEVICES?)", device, count);

    tp_status st = TP_OK;
    tp_backend *b = calloc(1, sizeof *b);
    cuda_ctx *ctx = calloc(1, sizeof *ctx);
    if (!b || !ctx) {
        free(b);
        free(ctx);
        return tp_error(TP_ERR_OOM, "out of memory creating the cuda backend");
    }
    b->ops = &cuda_ops;
    b->ctx = ctx;
    b->name = "cuda";
    b->act_dtype = act_dtype;
    b->window_align = TP_CUDA_WINDOW_ALIGN;
    ctx->device = device;
    TP_CUDA_CHECK_GOTO(cudaSetDevice(device), st, fail);
    TP_CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking), st, fail);
    TP_CUDA_CHECK_GOTO(cudaMalloc((void **)&ctx->fault_dev, sizeof *ctx->fault_dev), st, fail);
    TP_CUDA_CHECK_GOTO(cudaMemset(ctx->fault_dev, 0, sizeof *ctx->fault_dev), st, fail);
    TP_CUDA_CHECK_GOTO(cudaMallocHost((void **)&ctx->fault_host, sizeof *ctx->fault_host), st, fail);
    memset(ctx->fault_host, 0, sizeof *ctx->fault_host);
    for (int i = 0; i < 2; i++) {
        TP_CUDA_CHECK_GOTO(cudaMallocHost(&ctx->small[i], SMALL_UPLOAD_BYTES), st, fail);
        ctx->small_cap = SMALL_UPLOAD_BYTES;
        TP_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&ctx->small_done[i], cudaEventDisableTiming), st, fail);
    }
    TP_CHECK_GOTO(tp_cuda_gemm_create(WORKSPACE_BYTES, SCRATCH_BYTES, &ctx->gemm), st, fail);
    TP_CUDA_CHECK_GOTO(cudaMalloc(&ctx->attn.data, ATTN_SCRATCH_BYTES), st, fail);
    ctx->attn.bytes = ATTN_SCRATCH_BYTES;
    TP_CUDA_CHECK_GOTO(cudaDeviceGetAttribute(&ctx->attn.sm_count, cudaDevAttrMultiProcessorCount, device), st,
                       fail);
    TP_CUDA_CHECK_GOTO(cudaDeviceSynchronize(), st, fail); /* the memset, before the first kernel */
    b->stream = ctx->stream;
    tp_cuda_op_profile_wrap(b); /* TPINFER_PROFILE_OPS=1 only */
    *out = b;
    return TP_OK;
fail:
    cuda_destroy(b);
    return st;
}
