/*
 * gpu_attention.c: time the CUDA backend's attention op (through the backend table, as the
 * engine runs it) at Llama-3-8B's decode shapes: 32 q heads, 8 KV heads, head_dim 128,
 * bf16 cache and activations, block size 16, each sequence's blocks at shuffled places in
 * the cache. Batch 1 and 128 at contexts 256, 1024 and 4096, batch 1 at 32768, batch 128
 * at 192 (a b128 run's mean); every token at the last position of its sequence. Per shape
 * and kernel: warm-up, then the median of the runs timed with CUDA events on the backend's
 * stream, L2 flushed before each run (a 256 MiB memset). GB/s counts each K and V row read
 * once: batch * context * 8 KV heads * 128 * 2 bytes, for K and again for V.
 *
 * Columns: the simple kernel (the fallback, forced), the flash kernel with max_pos the
 * context (tight), and with max_pos 131072 (a CUDA graph's bound: splits planned for the
 * capacity, used for the context); "diff" is the largest |flash - simple| over the
 * outputs, relative to the largest |simple|. These three run with the prefill kernel off;
 * "+prefill" is the tight flash run with it forced on (it takes nothing from decode
 * tokens, one per sequence: what an eager decode step of 64 tokens or more pays for it).
 *
 * Then prefill: batch prompts of ctx tokens each, every token of a prompt in one step
 * (positions 0 .. ctx - 1, a sequence's tokens together, its keys already in the cache):
 * the flash kernel alone (prefill off) against the prefill kernel (tensor cores, forced
 * on). TFLOPS counts the causal attention's products: 4 * ctx^2 / 2 * q heads * head_dim
 * per prompt (q . k and p . V, 2 FLOPs a multiply-add, half the square).
 *
 * usage: gpu_attention [runs per shape, default 25] [BATCHxCONTEXT ...: only these decode shapes,
 * and no prefill table (what a profiler run under ncu wants)]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "kernels.h" /* tp_cuda_attention_force_simple, tp_cuda_attention_force_prefill */

#define QH 32
#define KVH 8
#define HD 128
#define BS 16
#define LOOSE_MAX_POS 131072
#define FLUSH_BYTES ((size_t)256 << 20)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void) /* xorshift64* */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

static float uniform(void) { return (float)(next() >> 40) / (float)(1 << 23) - 1.0f; } /* [-1, 1) */

static void die(const char *what)
{
    fprintf(stderr, "gpu_attention: %s: %s\n", what, tp_error_message());
    exit(1);
}

static void cuda_die(const char *what, cudaError_t e)
{
    fprintf(stderr, "gpu_attention: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* random bf16 values over bytes of backend memory, uploaded in 16 MiB pieces */
static void fill_random(tp_backend *b, void *dst, size_t bytes)
{
    const size_t piece = (size_t)16 << 20;
    uint16_t *h = malloc(piece);
    float *f = malloc(piece * 2);
    if (!h || !f) {
        fprintf(stderr, "gpu_attention: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < piece / 2; i++) f[i] = uniform();
    tp_convert(h, TP_DTYPE_BF16, f, TP_DTYPE_F32, piece / 2);
    for (size_t at = 0; at < bytes; at += piece) {
        size_t n = bytes - at < piece ? bytes - at : piece;
        if (b->ops->upload(b, (char *)dst + at, h, n) != TP_OK) die("upload");
        if (b->ops->synchronize(b) != TP_OK) die("synchronize"); /* h is reused at once anyway */
    }
    free(h);
    free(f);
}

typedef struct shape {
    int batch, ctx;
} shape;

/* The median over runs of one attention call in microseconds, L2 flushed before each. */
static double time_attention(tp_backend *b, const tp_tensor *q, const tp_kv_layer *cache, const tp_attn_batch *ab,
                             tp_tensor *o, void *flush, int runs, float *times)
{
    cudaStream_t stream = (cudaStream_t)b->stream;
    static cudaEvent_t ev0, ev1;
    cudaError_t ce;
    if (!ev0 && ((ce = cudaEventCreate(&ev0)) != cudaSuccess || (ce = cudaEventCreate(&ev1)) != cudaSuccess))
        cuda_die("cudaEventCreate", ce);
    const float scale = 1.0f / sqrtf((float)HD);
    for (int w = 0; w < 3; w++)
        if (b->ops->attention(b, q, cache, ab, QH, scale, o) != TP_OK) die("attention");
    if (b->ops->synchronize(b) != TP_OK) die("attention (warm-up)");
    for (int r = 0; r < runs; r++) {
        if (b->ops->memset0(b, flush, FLUSH_BYTES) != TP_OK) die("memset0");
        if ((ce = cudaEventRecord(ev0, stream)) != cudaSuccess) cuda_die("cudaEventRecord", ce);
        if (b->ops->attention(b, q, cache, ab, QH, scale, o) != TP_OK) die("attention");
        if ((ce = cudaEventRecord(ev1, stream)) != cudaSuccess) cuda_die("cudaEventRecord", ce);
        if ((ce = cudaEventSynchronize(ev1)) != cudaSuccess) cuda_die("cudaEventSynchronize", ce);
        if ((ce = cudaEventElapsedTime(&times[r], ev0, ev1)) != cudaSuccess) cuda_die("cudaEventElapsedTime", ce);
    }
    if (b->ops->synchronize(b) != TP_OK) die("attention");
    qsort(times, (size_t)runs, sizeof(float), cmp_float);
    return 1e3 * (runs % 2 ? times[runs / 2] : 0.5 * (times[runs / 2 - 1] + times[runs / 2]));
}

/* The largest |got - ref| over n bf16 values of backend memory, relative to the largest |ref|
 * (NaN sticks). */
static double rel_diff(tp_backend *b, const void *got, const void *ref, size_t n)
{
    uint16_t *h[2] = {malloc(n * 2), malloc(n * 2)};
    float *f[2] = {malloc(n * 4), malloc(n * 4)};
    if (!h[0] || !h[1] || !f[0] || !f[1]) {
        fprintf(stderr, "gpu_attention: out of host memory\n");
        exit(1);
    }
    if (b->ops->download(b, h[0], ref, n * 2) != TP_OK || b->ops->download(b, h[1], got, n * 2) != TP_OK)
        die("download");
    if (b->ops->synchronize(b) != TP_OK) die("synchronize");
    double diff = 0.0, big = 0.0;
    for (int k = 0; k < 2; k++) tp_convert(f[k], TP_DTYPE_F32, h[k], TP_DTYPE_BF16, n);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)f[1][i] - (double)f[0][i]);
        if (!(d <= diff)) diff = d;
        if (fabs((double)f[0][i]) > big) big = fabs((double)f[0][i]);
    }
    for (int k = 0; k < 2; k++) {
        free(h[k]);
        free(f[k]);
    }
    return diff / (big > 0 ? big : 1.0);
}

/* A step on the device: its batch arrays (n tokens, n_table block-table entries), random q
 * and two outputs, [n, QH * HD] bf16 each. */
typedef struct bench_step {
    void *seq, *pos, *slot, *table, *q, *out[2];
    size_t act; /* bytes of q and of each output */
} bench_step;

static bench_step step_create(tp_backend *b, int n, const int32_t *seq, const int32_t *pos, const int32_t *slot,
                              const int32_t *table, int n_table)
{
    bench_step st;
    st.act = (size_t)n * QH * HD * 2;
    if (b->ops->alloc(b, (size_t)n * 4, &st.seq) || b->ops->alloc(b, (size_t)n * 4, &st.pos) ||
        b->ops->alloc(b, (size_t)n * 4, &st.slot) || b->ops->alloc(b, (size_t)n_table * 4, &st.table) ||
        b->ops->alloc(b, st.act, &st.q) || b->ops->alloc(b, st.act, &st.out[0]) || b->ops->alloc(b, st.act, &st.out[1]))
        die("alloc");
    if (b->ops->upload(b, st.seq, seq, (size_t)n * 4) || b->ops->upload(b, st.pos, pos, (size_t)n * 4) ||
        b->ops->upload(b, st.slot, slot, (size_t)n * 4) || b->ops->upload(b, st.table, table, (size_t)n_table * 4))
        die("upload");
    fill_random(b, st.q, st.act);
    return st;
}

static void step_free(tp_backend *b, bench_step *st)
{
    void *p[] = {st->seq, st->pos, st->slot, st->table, st->q, st->out[0], st->out[1]};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) b->ops->free(b, p[i]);
}

static int cmp_u64(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

/* GPU_ATTN_TRACE=1: one call with the decode kernel's per-block timeline on, then the
 * percentiles of each block's start (from the first block's), time to its first tile, run
 * time and end, in us, and the blocks per SM. */
static void trace_call(tp_backend *b, const tp_tensor *q, const tp_kv_layer *cache, const tp_attn_batch *ab,
                       tp_tensor *out, void *flush, int n, int ctx)
{
    const int blocks = n * KVH;
    unsigned long long *rec = calloc((size_t)4 * blocks, sizeof *rec), *v = calloc((size_t)blocks, sizeof *v);
    if (!rec || !v) die("trace: out of host memory");
    if (b->ops->memset0(b, flush, FLUSH_BYTES) || tp_cuda_attention_trace(1, NULL, 0) ||
        b->ops->attention(b, q, cache, ab, QH, 0.0883883f, out) || b->ops->synchronize(b) ||
        tp_cuda_attention_trace(0, rec, blocks))
        die("trace");
    unsigned long long base = ~0ull;
    int per_sm[1024] = {0}, sms = 0;
    for (int i = 0; i < blocks; i++) {
        if (rec[4 * i] && rec[4 * i] < base) base = rec[4 * i];
        if (rec[4 * i + 3] < 1024) per_sm[rec[4 * i + 3]]++;
    }
    int lo = 1 << 30, hi = 0;
    for (int s = 0; s < 1024; s++)
        if (per_sm[s]) sms++, lo = per_sm[s] < lo ? per_sm[s] : lo, hi = per_sm[s] > hi ? per_sm[s] : hi;
    static const char *what[4] = {"start", "first tile", "run", "end"};
    printf("# trace %dx%d (%d blocks on %d SMs, %d-%d each): us at p0 p10 p50 p90 p100\n", n, ctx, blocks, sms, lo, hi);
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < blocks; i++) {
            const unsigned long long *r = rec + 4 * i;
            v[i] = k == 0 ? r[0] - base : k == 1 ? r[1] - r[0] : k == 2 ? r[2] - r[0] : r[2] - base;
        }
        qsort(v, (size_t)blocks, sizeof *v, cmp_u64);
        printf("#   %-10s %7.2f %7.2f %7.2f %7.2f %7.2f\n", what[k], v[0] * 1e-3, v[blocks / 10] * 1e-3,
               v[blocks / 2] * 1e-3, v[blocks * 9 / 10] * 1e-3, v[blocks - 1] * 1e-3);
    }
    /* the SMs by how many blocks they held: their last block's end, mean and range */
    double sum[17] = {0}, lo_e[17], hi_e[17];
    int cnt[17] = {0};
    unsigned long long end_of[1024] = {0};
    for (int i = 0; i < blocks; i++) {
        const unsigned long long *r = rec + 4 * i;
        if (r[3] < 1024 && r[2] - base > end_of[r[3]]) end_of[r[3]] = r[2] - base;
    }
    for (int s = 0; s < 1024; s++) {
        if (!per_sm[s]) continue;
        const int k = per_sm[s] < 16 ? per_sm[s] : 16;
        const double e = end_of[s] * 1e-3;
        if (!cnt[k]) lo_e[k] = hi_e[k] = e;
        lo_e[k] = e < lo_e[k] ? e : lo_e[k];
        hi_e[k] = e > hi_e[k] ? e : hi_e[k];
        sum[k] += e;
        cnt[k]++;
    }
    for (int k = 1; k <= 16; k++)
        if (cnt[k])
            printf("#   SMs holding %2d blocks: %3d, their last block ends at %.2f us (%.2f - %.2f)\n", k, cnt[k],
                   sum[k] / cnt[k], lo_e[k], hi_e[k]);
    free(rec);
    free(v);
}

/* Whether the arguments after the run count name the decode shape (all when none do; a
 * name not in the table is not run). */
static int wanted(int argc, char **argv, int batch, int ctx)
{
    if (argc <= 2) return 1;
    for (int i = 2; i < argc; i++) {
        int bt = 0, c = 0;
        if (sscanf(argv[i], "%dx%d", &bt, &c) == 2 && bt == batch && c == ctx) return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 25;
    if (runs < 1) runs = 25;
    static const shape shapes[] = {{1, 256}, {1, 1024}, {1, 4096}, {1, 32768},
                                   {128, 192}, {128, 256}, {128, 1024}, {128, 4096}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    tp_backend *b = NULL;
    if (tp_backend_cuda_create(0, TP_DTYPE_BF16, &b) != TP_OK) die("tp_backend_cuda_create");

    /* one cache big enough for the largest shape, blocks handed out in a shuffled order */
    int64_t max_positions = 0;
    for (int s = 0; s < nshapes; s++)
        if ((int64_t)shapes[s].batch * shapes[s].ctx > max_positions) max_positions = (int64_t)shapes[s].batch * shapes[s].ctx;
    const int32_t n_blocks = (int32_t)(max_positions / BS);
    const size_t row_bytes = (size_t)KVH * HD * 2, cache_bytes = (size_t)n_blocks * BS * row_bytes;
    tp_kv_layer cache = {NULL, NULL, TP_DTYPE_BF16, n_blocks, BS, KVH, HD};
    void *flush = NULL;
    if (b->ops->alloc(b, cache_bytes, &cache.k) != TP_OK || b->ops->alloc(b, cache_bytes, &cache.v) != TP_OK ||
        b->ops->alloc(b, FLUSH_BYTES, &flush) != TP_OK)
        die("alloc");
    fill_random(b, cache.k, cache_bytes);
    fill_random(b, cache.v, cache_bytes);
    int32_t *perm = malloc((size_t)n_blocks * sizeof(int32_t));
    for (int32_t i = 0; i < n_blocks; i++) perm[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(next() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }

    float *times = malloc((size_t)runs * sizeof(float));

    printf("# cuda backend attention: %d q heads, %d KV heads, head_dim %d, bf16 cache and q/out, block %d, "
           "median of %d runs, L2 flushed\n", QH, KVH, HD, BS, runs);
    printf("%5s %7s | %11s %8s | %11s %8s | %11s %8s | %11s | %8s %8s\n", "batch", "context", "simple us", "GB/s",
           "flash us", "GB/s", "graph us", "GB/s", "+prefill us", "speedup", "diff");
    for (int s = 0; s < nshapes; s++) {
        const int n = shapes[s].batch, ctx = shapes[s].ctx, max_blocks = ctx / BS;
        if (!wanted(argc, argv, n, ctx)) continue;
        int32_t *seq = malloc((size_t)n * 4), *pos = malloc((size_t)n * 4), *slot = malloc((size_t)n * 4);
        int32_t *table = malloc((size_t)n * max_blocks * 4);
        for (int i = 0; i < n; i++) {
            seq[i] = i;
            pos[i] = ctx - 1;
            slot[i] = -1;
            for (int lb = 0; lb < max_blocks; lb++) table[i * max_blocks + lb] = perm[i * max_blocks + lb];
        }
        bench_step st = step_create(b, n, seq, pos, slot, table, n * max_blocks);
        tp_tensor q = tp_tensor_make(st.q, TP_DTYPE_BF16, n, QH * HD);
        tp_tensor out[2] = {tp_tensor_make(st.out[0], TP_DTYPE_BF16, n, QH * HD),
                            tp_tensor_make(st.out[1], TP_DTYPE_BF16, n, QH * HD)};
        double med[4];
        for (int k = 0; k < 4; k++) { /* simple, flash (tight max_pos), flash (loose max_pos), flash + prefill */
            /* a decode step's batch: one token per sequence (the kernel's early loads) */
            tp_attn_batch ab = {n, st.seq, st.pos, st.slot, st.table, max_blocks, k == 2 ? LOOSE_MAX_POS : ctx, 1, 0, 0};
            tp_cuda_attention_force_simple(k == 0);
            tp_cuda_attention_force_prefill(k == 3 ? 1 : 0);
            med[k] = time_attention(b, &q, &cache, &ab, &out[k == 0 ? 0 : 1], flush, runs, times);
        }
        tp_cuda_attention_force_simple(0);
        tp_cuda_attention_force_prefill(-1);
        if (getenv("GPU_ATTN_TRACE")) { /* the tight flash kernel's blocks, one call after an L2 flush */
            tp_attn_batch ab = {n, st.seq, st.pos, st.slot, st.table, max_blocks, ctx, 1, 0, 0};
            tp_cuda_attention_force_prefill(0);
            trace_call(b, &q, &cache, &ab, &out[1], flush, n, ctx);
            tp_cuda_attention_force_prefill(-1);
        }
        const double diff = rel_diff(b, st.out[1], st.out[0], st.act / 2);
        const double kv_bytes = 2.0 * n * (double)ctx * KVH * HD * 2;
        printf("%5d %7d | %11.1f %8.1f | %11.1f %8.1f | %11.1f %8.1f | %11.1f | %7.1fx %8.1e\n", n, ctx, med[0],
               kv_bytes / med[0] * 1e-3, med[1], kv_bytes / med[1] * 1e-3, med[2], kv_bytes / med[2] * 1e-3, med[3],
               med[0] / med[1], diff);
        fflush(stdout);
        step_free(b, &st);
        free(seq);
        free(pos);
        free(slot);
        free(table);
    }

    if (argc > 2) return 0; /* shapes chosen: decode only */
    /* prefill: every prompt's ctx tokens in one step, keys already in the cache */
    static const shape pshapes[] = {{128, 128}, {1, 2048}, {4, 2048}, {1, 8192}};
    printf("\n# prefill: batch prompts of context tokens in one step (positions 0 .. context - 1), same heads "
           "and cache\n");
    printf("%5s %7s | %11s %8s | %11s %8s | %8s %8s\n", "batch", "context", "flash us", "TFLOPS", "prefill us",
           "TFLOPS", "speedup", "diff");
    for (size_t s = 0; s < sizeof pshapes / sizeof pshapes[0]; s++) {
        const int nb = pshapes[s].batch, ctx = pshapes[s].ctx, max_blocks = ctx / BS, n = nb * ctx;
        if ((int64_t)nb * max_blocks > n_blocks) continue; /* the cache is sized by the decode shapes */
        int32_t *seq = malloc((size_t)n * 4), *pos = malloc((size_t)n * 4), *slot = malloc((size_t)n * 4);
        int32_t *table = malloc((size_t)nb * max_blocks * 4);
        for (int i = 0; i < n; i++) {
            seq[i] = i / ctx;
            pos[i] = i % ctx;
            slot[i] = -1;
        }
        for (int i = 0; i < nb * max_blocks; i++) table[i] = perm[i];
        bench_step st = step_create(b, n, seq, pos, slot, table, nb * max_blocks);
        tp_tensor q = tp_tensor_make(st.q, TP_DTYPE_BF16, n, QH * HD);
        tp_tensor out[2] = {tp_tensor_make(st.out[0], TP_DTYPE_BF16, n, QH * HD),
                            tp_tensor_make(st.out[1], TP_DTYPE_BF16, n, QH * HD)};
        tp_attn_batch ab = {n, st.seq, st.pos, st.slot, st.table, max_blocks, ctx, 0, 0, 0};
        double med[2];
        for (int k = 0; k < 2; k++) { /* the flash kernel alone, the prefill kernel */
            tp_cuda_attention_force_prefill(k);
            med[k] = time_attention(b, &q, &cache, &ab, &out[k], flush, runs, times);
        }
        tp_cuda_attention_force_prefill(-1);
        const double diff = rel_diff(b, st.out[1], st.out[0], st.act / 2);
        const double flops = 4.0 * (double)ctx * ctx / 2 * QH * HD * nb;
        printf("%5d %7d | %11.1f %8.1f | %11.1f %8.1f | %7.1fx %8.1e\n", nb, ctx, med[0], flops / med[0] * 1e-6,
               med[1], flops / med[1] * 1e-6, med[0] / med[1], diff);
        fflush(stdout);
        step_free(b, &st);
        free(seq);
        free(pos);
        free(slot);
        free(table);
    }
    b->ops->free(b, flush);
    b->ops->free(b, cache.k);
    b->ops->free(b, cache.v);
    tp_backend_destroy(b);
    free(perm);
    free(times);
    return 0;
}
