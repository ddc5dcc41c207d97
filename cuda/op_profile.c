/*
 * op_profile.c: TPINFER_PROFILE_OPS=1 times every operation of the CUDA backend with a pair
 * of CUDA events around it and prints, when the backend is destroyed, a table of GPU time
 * per operation (matmuls per shape) over the whole run. Steps then run eagerly (graphs off:
 * events inside a replayed graph cannot be told apart), so the table shows where the GPU
 * time of eager steps goes; what the whole step took minus the table's sum is the
 * collectives and the gaps between kernels. A tool for bench/, not for production runs.
 */
#include "op_profile.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "log.h"

#define MAX_KEYS 256
#define MAX_PENDING 8192

typedef struct entry {
    char name[96];
    double ms;
    int64_t calls;
} entry;

static const struct tp_backend_ops *inner; /* the backend's own table */
static struct tp_backend_ops outer;        /* the timed one */
static entry table[MAX_KEYS];
static int n_keys;
static struct {
    cudaEvent_t start, stop;
    int key;
} pending[MAX_PENDING];
static int n_pending, n_events;

static int key_of(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int key_of(const char *fmt, ...)
{
    char name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    for (int i = 0; i < n_keys; i++)
        if (!strcmp(table[i].name, name)) return i;
    if (n_keys == MAX_KEYS) return MAX_KEYS - 1; /* the last entry takes the overflow */
    snprintf(table[n_keys].name, sizeof table[n_keys].name, "%s", name);
    return n_keys++;
}

/* Add up the pending pairs (all enqueued before; waits for the last). */
static void harvest(void)
{
    if (n_pending == 0) return;
    if (cudaEventSynchronize(pending[n_pending - 1].stop) != cudaSuccess) (void)cudaGetLastError();
    for (int i = 0; i < n_pending; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, pending[i].start, pending[i].stop) == cudaSuccess) {
            table[pending[i].key].ms += ms;
            table[pending[i].key].calls++;
        } else {
            (void)cudaGetLastError();
        }
    }
    n_pending = 0;
}

static int begin(tp_backend *b)
{
    if (n_pending == MAX_PENDING) harvest();
    int i = n_pending;
    if (i >= n_events) {
        if (cudaEventCreate(&pending[i].start) != cudaSuccess || cudaEventCreate(&pending[i].stop) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
        n_events = i + 1;
    }
    cudaEventRecord(pending[i].start, (cudaStream_t)b->stream);
    return i;
}

static void end(tp_backend *b, int i, int key)
{
    if (i < 0) return;
    cudaEventRecord(pending[i].stop, (cudaStream_t)b->stream);
    pending[i].key = key;
    n_pending = i + 1;
}

#define TIMED(call, ...)                            \
    do {                                            \
        int ev_ = begin(b);                         \
        tp_status st_ = (call);                     \
        end(b, ev_, key_of(__VA_ARGS__));           \
        return st_;                                 \
    } while (0)

static tp_status p_upload(tp_backend *b, void *dst, const void *src, size_t bytes)
{
    TIMED(inner->upload(b, dst, src, bytes), "upload");
}
static tp_status p_download(tp_backend *b, void *dst, const void *src, size_t bytes)
{
    TIMED(inner->download(b, dst, src, bytes), "download");
}
static tp_status p_memset0(tp_backend *b, void *p, size_t bytes) { TIMED(inner->memset0(b, p, bytes), "memset0"); }
static tp_status p_synchronize(tp_backend *b)
{
    tp_status st = inner->synchronize(b);
    harvest();
    return st;
}
static tp_status p_embedding(tp_backend *b, const int32_t *ids, int32_t n, const tp_tensor *table_,
                             int64_t vocab_begin, tp_tensor *out)
{
    TIMED(inner->embedding(b, ids, n, table_, vocab_begin, out), "embedding");
}
static tp_status p_add_rmsnorm(tp_backend *b, tp_tensor *residual, const tp_tensor *delta, const tp_tensor *weight,
                               float eps, tp_tensor *out)
{
    TIMED(inner->add_rmsnorm(b, residual, delta, weight, eps, out), "add_rmsnorm");
}
static tp_status p_head_rmsnorm(tp_backend *b, tp_tensor *x, int32_t head_dim, const tp_tensor *weight, float eps)
{
    TIMED(inner->head_rmsnorm(b, x, head_dim, weight, eps), "head_rmsnorm");
}
static tp_status p_matmul(tp_backend *b, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias, tp_tensor *y)
{
    TIMED(inner->matmul(b, x, w, bias, y), "matmul %lldx%lld -> %lld", (long long)x->rows, (long long)x->cols,
          (long long)w->rows);
}
static tp_status p_rope(tp_backend *b, tp_tensor *x, int32_t head_dim, const int32_t *pos, const float *inv_freq)
{
    TIMED(inner->rope(b, x, head_dim, pos, inv_freq), "rope");
}
static tp_status p_kv_store(tp_backend *b, const tp_tensor *k, const tp_tensor *v, tp_kv_layer *cache,
                            const tp_attn_batch *batch)
{
    TIMED(inner->kv_store(b, k, v, cache, batch), "kv_store");
}
static tp_status p_attention(tp_backend *b, const tp_tensor *q, const tp_kv_layer *cache, const tp_attn_batch *batch,
                             int32_t q_heads, float scale, tp_tensor *out)
{
    TIMED(inner->attention(b, q, cache, batch, q_heads, scale, out), "attention %d tokens", (int)batch->n_tokens);
}
static tp_status p_swiglu(tp_backend *b, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out)
{
    TIMED(inner->swiglu(b, gate, up, out), "swiglu");
}
static tp_status p_geglu(tp_backend *b, const tp_tensor *gate, const tp_tensor *up, tp_tensor *out)
{
    TIMED(inner->geglu(b, gate, up, out), "geglu");
}
static tp_status p_softcap(tp_backend *b, tp_tensor *x, float cap)
{
    TIMED(inner->softcap(b, x, cap), "softcap");
}
static tp_status p_gather_rows(tp_backend *b, const tp_tensor *x, const int32_t *rows, int32_t n, tp_tensor *out)
{
    TIMED(inner->gather_rows(b, x, rows, n, out), "gather_rows");
}
static tp_status p_convert(tp_backend *b, const tp_tensor *src, tp_tensor *dst)
{
    TIMED(inner->convert(b, src, dst), "convert");
}
static tp_status p_argmax(tp_backend *b, const tp_tensor *logits, int32_t *ids, float *logprob, float *value)
{
    TIMED(inner->argmax(b, logits, ids, logprob, value), "argmax");
}
static tp_status p_sample(tp_backend *b, const tp_tensor *logits, int32_t L, const tp_sample_row *rows,
                          const int32_t *tokens, tp_sample_out *out)
{
    TIMED(inner->sample(b, logits, L, rows, tokens, out), "sample %d rows", (int)L);
}
static tp_status p_matmul_swiglu(tp_backend *b, const tp_tensor *x, const tp_tensor *w, const tp_tensor *bias,
                                 tp_tensor *gate_up, tp_tensor *out)
{
    TIMED(inner->matmul_swiglu(b, x, w, bias, gate_up, out), "matmul_swiglu %lldx%lld -> %lld", (long long)x->rows,
          (long long)x->cols, (long long)w->rows);
}
static tp_status p_matmul_add(tp_backend *b, const tp_tensor *x, const tp_tensor *w, tp_tensor *y)
{
    TIMED(inner->matmul_add(b, x, w, y), "matmul_add %lldx%lld -> %lld", (long long)x->rows, (long long)x->cols,
          (long long)w->rows);
}
static tp_status p_qk_rope_store(tp_backend *b, tp_tensor *q, tp_tensor *k, const tp_tensor *v,
                                 const tp_tensor *q_norm, const tp_tensor *k_norm, float eps, int32_t head_dim,
                                 const float *inv_freq, tp_kv_layer *cache, const tp_attn_batch *batch)
{
    TIMED(inner->qk_rope_store(b, q, k, v, q_norm, k_norm, eps, head_dim, inv_freq, cache, batch), "qk_rope_store");
}

static tp_status p_qk_rope_attention(tp_backend *b, tp_tensor *q, tp_tensor *k, const tp_tensor *v,
                                     const tp_tensor *q_norm, const tp_tensor *k_norm, float eps, int32_t head_dim,
                                     const float *inv_freq, tp_kv_layer *cache, const tp_attn_batch *batch,
                                     int32_t q_heads, float scale, tp_tensor *out)
{
    TIMED(inner->qk_rope_attention(b, q, k, v, q_norm, k_norm, eps, head_dim, inv_freq, cache, batch, q_heads, scale,
                                   out),
          "qk_rope_attention %d tokens", (int)batch->n_tokens);
}

static int by_time(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return (x->ms < y->ms) - (x->ms > y->ms);
}

static void p_destroy(tp_backend *b)
{
    harvest();
    double total = 0.0;
    for (int i = 0; i < n_keys; i++) total += table[i].ms;
    qsort(table, (size_t)n_keys, sizeof table[0], by_time);
    tp_log(TP_LOG_INFO, "TPINFER_PROFILE_OPS: GPU time per operation over the run (eager steps), %.1f ms in all",
           total);
    tp_log(TP_LOG_INFO, "| operation | calls | ms | us per call | share |");
    for (int i = 0; i < n_keys; i++)
        tp_log(TP_LOG_INFO, "| %s | %lld | %.2f | %.1f | %.1f%% |", table[i].name, (long long)table[i].calls,
               table[i].ms, table[i].calls ? 1e3 * table[i].ms / (double)table[i].calls : 0.0,
               total > 0 ? 100.0 * table[i].ms / total : 0.0);
    for (int i = 0; i < n_events; i++) {
        cudaEventDestroy(pending[i].start);
        cudaEventDestroy(pending[i].stop);
    }
    n_events = n_pending = n_keys = 0;
    inner->destroy(b);
}

void tp_cuda_op_profile_wrap(tp_backend *b)
{
    const char *v = getenv("TPINFER_PROFILE_OPS");
    if (!v || strcmp(v, "1") || inner) return; /* one backend per process is profiled */
    inner = b->ops;
    outer = *inner;
    outer.upload = p_upload;
    outer.download = p_download;
    outer.memset0 = p_memset0;
    outer.synchronize = p_synchronize;
    outer.embedding = p_embedding;
    outer.add_rmsnorm = p_add_rmsnorm;
    outer.head_rmsnorm = p_head_rmsnorm;
    outer.matmul = p_matmul;
    outer.rope = p_rope;
    outer.kv_store = p_kv_store;
    outer.attention = p_attention;
    outer.swiglu = p_swiglu;
    outer.geglu = p_geglu;
    outer.softcap = p_softcap;
    outer.gather_rows = p_gather_rows;
    outer.convert = p_convert;
    outer.argmax = p_argmax;
    outer.sample = inner->sample ? p_sample : NULL;
    outer.matmul_swiglu = p_matmul_swiglu;
    outer.qk_rope_store = p_qk_rope_store;
    outer.qk_rope_attention = inner->qk_rope_attention ? p_qk_rope_attention : NULL;
    outer.matmul_add = inner->matmul_add ? p_matmul_add : NULL;
    outer.graph_begin = NULL; /* eager steps: forward.c pads decode steps but runs them */
    outer.graph_end = NULL;
    outer.graph_launch = NULL;
    outer.graph_free = NULL;
    outer.take_ids = NULL; /* and every step waits for the one before */
    outer.argmax_merge = NULL;
    outer.download_start = NULL;
    outer.download_wait = NULL;
    outer.destroy = p_destroy;
    b->ops = &outer;
    tp_log(TP_LOG_WARN, "TPINFER_PROFILE_OPS=1: every operation is timed and CUDA graphs are off (a profiling run)");
}
