/*
 * check_custom_ar.c: the custom one-shot all-reduce (cuda/custom_ar.cu) against NCCL, bit
 * for bit, on a GPU machine: run under mpirun with 2..8 ranks on one host, one GPU each
 * (rank i on GPU local_rank). Build and run with tests/gpu/custom_ar.sh BUILD_DIR [NP].
 *
 * Three communicators over MPI_COMM_WORLD: A with the custom path (TPINFER_CUSTOM_AR=1),
 * B with NCCL alone (TPINFER_CUSTOM_AR=0), C with TPINFER_CUSTOM_AR_MAX=4096 (only its
 * reported limit is checked). Then:
 *   1. eager: 1000 all-reduces in a row on A (float32, bfloat16, float16 in turn; 16 B to
 *      the limit, 4 MiB or CHECK_CAR_MAX; a few larger or not a multiple of 16 bytes, which
 *      A sends to NCCL), each
 *      rank independently in place or out of place, 16-byte aligned or offset by an
 *      element; enqueued back to back with no host wait (slot or epoch bugs show), then the
 *      same 1000 on B. Every result of A must equal the host's sum in rank order bit for
 *      bit, and (two ranks) B's result bit for bit; with more ranks NCCL's order differs,
 *      so A against B is reported, not failed, beyond a tolerance;
 *   2. graph: 48 all-reduces on A captured in a CUDA graph (in-place ones behind a captured
 *      copy), replayed 100 times, fresh inputs uploaded between replays, nothing waited on
 *      until the end; then 10 replays back to back on the last inputs; every output bit for
 *      bit against the host reference;
 *   3. timing: a 16 KiB float32 in-place all-reduce (a batch-1 decode step's) on A and on
 *      B, eager and in a graph.
 * Exit status 0 when everything matched, 1 on any mismatch, 2 when A has no custom path
 * (P2P missing, several hosts...: the reason is printed).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "comm.h"
#include "comm_mpi.h"
#include "comm_nccl.h"
#include "dtype.h"
#include "log.h"
#include "status.h"

static int rank_, size_;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank_, __FILE__, __LINE__, #call,          \
                    cudaGetErrorString(e_));                                                       \
            MPI_Abort(MPI_COMM_WORLD, 3);                                                          \
        }                                                                                          \
    } while (0)

#define TPCK(call)                                                                                 \
    do {                                                                                           \
        tp_status s_ = (call);                                                                     \
        if (s_ != TP_OK) {                                                                         \
            fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank_, __FILE__, __LINE__, #call,          \
                    tp_error_message());                                                           \
            MPI_Abort(MPI_COMM_WORLD, 3);                                                          \
        }                                                                                          \
    } while (0)

// ----------------------------------------------------------------------------
// deterministic data: every rank can compute every rank's input

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Element i of rank r's input of test call k, as its dtype's bits (in a uint32). */
static uint32_t elem_bits(tp_dtype dt, int r, uint64_t k, size_t i)
{
    uint64_t h = mix(mix(mix(k * 0x100000001b3ull + 7) ^ (uint64_t)r * 0x51ed270b27ull) ^ (uint64_t)i);
    float m = 1.0f + (float)((h >> 40) & 0xffffff) / 16777216.0f; /* [1, 2) */
    int e = (int)((h >> 8) % 21) - 10;                              /* 2^-10 .. 2^10 */
    float v = ldexpf(m, e) * ((h & 1) ? -1.0f : 1.0f);
    if ((h >> 20) % 64 == 0) v = 0.0f; /* some zeros, signed sums of opposite values */
    uint32_t u;
    switch (dt) {
    case TP_DTYPE_F32: memcpy(&u, &v, 4); return u;
    case TP_DTYPE_BF16: return tp_f32_to_bf16(v);
    case TP_DTYPE_F16: return tp_f32_to_f16(v);
    default: return 0;
    }
}

static float bits_f32(tp_dtype dt, uint32_t b)
{
    float f;
    switch (dt) {
    case TP_DTYPE_F32: memcpy(&f, &b, 4); return f;
    case TP_DTYPE_BF16: return tp_bf16_to_f32((uint16_t)b);
    case TP_DTYPE_F16: return tp_f16_to_f32((uint16_t)b);
    default: return 0;
    }
}

static uint32_t f32_bits(tp_dtype dt, float f)
{
    uint32_t u;
    switch (dt) {
    case TP_DTYPE_F32: memcpy(&u, &f, 4); return u;
    case TP_DTYPE_BF16: return tp_f32_to_bf16(f);
    case TP_DTYPE_F16: return tp_f32_to_f16(f);
    default: return 0;
    }
}

static void put(void *buf, tp_dtype dt, size_t i, uint32_t b)
{
    if (dt == TP_DTYPE_F32) memcpy((char *)buf + 4 * i, &b, 4);
    else {
        uint16_t h = (uint16_t)b;
        memcpy((char *)buf + 2 * i, &h, 2);
    }
}

static uint32_t get(const void *buf, tp_dtype dt, size_t i)
{
    if (dt == TP_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, (const char *)buf + 4 * i, 4);
        return u;
    }
    uint16_t h;
    memcpy(&h, (const char *)buf + 2 * i, 2);
    return h;
}

/* The sum in rank order, in float32, rounded once to dt: what the custom path computes. */
static uint32_t reference(tp_dtype dt, uint64_t k, size_t i)
{
    float acc = bits_f32(dt, elem_bits(dt, 0, k, i));
    for (int r = 1; r < size_; r++) acc += bits_f32(dt, elem_bits(dt, r, k, i));
    return f32_bits(dt, acc);
}

// ----------------------------------------------------------------------------
// one test call: what every rank agrees on (size, dtype) and what is its own (placement)

typedef struct call {
    uint64_t key;   /* data seed */
    tp_dtype dt;
    size_t count;
    int in_place;
    size_t send_off, recv_off; /* bytes past the region's 256-aligned start */
    size_t region;  /* offset of the call's region in the pools */
} call;

static const tp_dtype DTS[3] = {TP_DTYPE_F32, TP_DTYPE_BF16, TP_DTYPE_F16};

/* The custom path's limit under test: the default (4 MiB for two ranks, 512 KiB for more),
 * or CHECK_CAR_MAX bytes (a power of two, given to A as TPINFER_CUSTOM_AR_MAX) */
static size_t big_ = 4194304;

/* Sizes every rank draws alike (a fixed seed); placements differ per rank. */
static size_t pick_bytes(int k, uint64_t *rng)
{
    /* multiples of 16 up to the limit take the custom path; the rest (odd sizes, larger) NCCL */
    static const size_t fixed[] = {16,     32,     48,     64,     112,    496,     512,    1008,
                                   4096,   8192,   16384,  16400,  32768,  65536,   131072, 262128,
                                   262144, 524272, 524288, 524304, 1048576, 2097152, 4194304,
                                   20,     36,     1004,   4194320};
    const int nf = (int)(sizeof fixed / sizeof fixed[0]);
    if (k < 3 * nf) return fixed[k / 3];
    *rng = mix(*rng);
    uint64_t h = *rng;
    if (h % 10 == 0) return (h >> 8) % 2 ? big_ + 16 * (1 + (h >> 16) % 32768) : 4 + 16 * ((h >> 16) % 4096);
    /* log-uniform 16 B .. the limit, a multiple of 16 */
    double lg = 4.0 + (log2((double)big_) - 4.0) * (double)((h >> 11) & 0xfffff) / 1048576.0;
    size_t b = (size_t)pow(2.0, lg) / 16 * 16;
    return b < 16 ? 16 : b > big_ ? big_ : b;
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void place(call *c, int mode)
{
    size_t es = tp_dtype_size(c->dt);
    c->in_place = mode == 1 || mode == 3;
    c->send_off = mode >= 2 ? es : 0;
    c->recv_off = mode == 2 ? 2 * es : c->send_off;
    if (c->in_place) c->recv_off = c->send_off;
}

static int near(tp_dtype dt, uint32_t x, uint32_t y)
{
    double fx = bits_f32(dt, x), fy = bits_f32(dt, y);
    double tol = dt == TP_DTYPE_F32 ? 1e-5 : 2e-2;
    return fabs(fx - fy) <= tol * (fabs(fx) + 1e-3);
}

/* Compare a call's results with the reference in rank order (exact_ref: bit for bit, else
 * within a tolerance) and with other's (NULL: not; exact_other: bit for bit, else within
 * a tolerance, the differences counted in *other_diff). Returns the mismatches. */
static long compare(const char *what, const call *c, const void *got, const void *other, int exact_ref,
                    int exact_other, long *other_diff)
{
    long bad = 0, shown = 0;
    for (size_t i = 0; i < c->count; i++) {
        uint32_t want = reference(c->dt, c->key, i), g = get(got, c->dt, i);
        if (g != want && (exact_ref || !near(c->dt, g, want))) {
            if (shown++ < 3)
                fprintf(stderr, "rank %d: %s: %s x %zu, element %zu: 0x%x (%g), want 0x%x (%g)\n", rank_, what,
                        tp_dtype_name(c->dt), c->count, i, g, (double)bits_f32(c->dt, g), want,
                        (double)bits_f32(c->dt, want));
            bad++;
        }
        if (other) {
            uint32_t o = get(other, c->dt, i);
            if (o == g) continue;
            if (exact_other || !near(c->dt, g, o)) {
                if (shown++ < 3)
                    fprintf(stderr, "rank %d: %s: %s x %zu, element %zu: custom comm 0x%x (%g), NCCL comm 0x%x (%g)\n",
                            rank_, what, tp_dtype_name(c->dt), c->count, i, g, (double)bits_f32(c->dt, g), o,
                            (double)bits_f32(c->dt, o));
                bad++;
            } else {
                (*other_diff)++;
            }
        }
    }
    return bad;
}

// ----------------------------------------------------------------------------
// 1. eager

enum { N_EAGER = 1000 };

static long eager(tp_comm *a, tp_comm *b, cudaStream_t s, size_t car_max)
{
    call *calls = calloc(N_EAGER, sizeof *calls);
    uint64_t rng = 12345;
    size_t pool = 0;
    int n_custom = 0;
    for (int k = 0; k < N_EAGER; k++) {
        call *c = &calls[k];
        c->key = 1000000 + (uint64_t)k;
        c->dt = DTS[k % 3];
        size_t bytes = pick_bytes(k, &rng);
        size_t es = tp_dtype_size(c->dt);
        c->count = bytes / es;
        place(c, (k / 3 + rank_) % 4);
        c->region = pool;
        pool += round_up(bytes + 32, 256);
        n_custom += bytes % 16 == 0 && bytes <= car_max;
    }
    char *h_in = NULL, *h_a = NULL, *h_b = NULL, *d_in = NULL, *d_a = NULL, *d_b = NULL;
    CK(cudaMallocHost((void **)&h_in, pool));
    CK(cudaMallocHost((void **)&h_a, pool));
    CK(cudaMallocHost((void **)&h_b, pool));
    CK(cudaMalloc((void **)&d_in, pool));
    CK(cudaMalloc((void **)&d_a, pool));
    CK(cudaMalloc((void **)&d_b, pool));
    memset(h_in, 0, pool);
    for (int k = 0; k < N_EAGER; k++) {
        const call *c = &calls[k];
        for (size_t i = 0; i < c->count; i++) put(h_in + c->region + c->send_off, c->dt, i, elem_bits(c->dt, rank_, c->key, i));
    }
    CK(cudaMemcpy(d_in, h_in, pool, cudaMemcpyHostToDevice));
    CK(cudaMemset(d_a, 0xff, pool));
    CK(cudaMemset(d_b, 0xff, pool));
    /* in-place calls start from their input in the output pool */
    for (int k = 0; k < N_EAGER; k++) {
        const call *c = &calls[k];
        if (!c->in_place) continue;
        size_t bytes = c->count * tp_dtype_size(c->dt), o = c->region + c->send_off;
        CK(cudaMemcpy(d_a + o, d_in + o, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(d_b + o, d_in + o, bytes, cudaMemcpyDeviceToDevice));
    }
    CK(cudaDeviceSynchronize());
    MPI_Barrier(MPI_COMM_WORLD);

    for (int pass = 0; pass < 2; pass++) {
        tp_comm *cm = pass == 0 ? a : b;
        char *out = pass == 0 ? d_a : d_b;
        for (int k = 0; k < N_EAGER; k++) {
            const call *c = &calls[k];
            const void *send = c->in_place ? (const void *)(out + c->region + c->send_off)
                                           : (const void *)(d_in + c->region + c->send_off);
            void *recv = out + c->region + c->recv_off;
            TPCK(tp_comm_all_reduce_sum(cm, send, recv, c->count, c->dt, s));
        }
        CK(cudaStreamSynchronize(s));
    }
    CK(cudaMemcpy(h_a, d_a, pool, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h_b, d_b, pool, cudaMemcpyDeviceToHost));

    long bad = 0, nccl_diff = 0;
    for (int k = 0; k < N_EAGER; k++) {
        const call *c = &calls[k];
        char what[64];
        snprintf(what, sizeof what, "eager call %d (%s)", k, c->in_place ? "in place" : "out of place");
        size_t bytes = c->count * tp_dtype_size(c->dt);
        int custom = bytes % 16 == 0 && bytes <= car_max;
        /* two ranks: everything bit for bit (a + b has one result); more: the custom path
         * against the rank-order reference, NCCL's (other order) within a tolerance */
        bad += compare(what, c, h_a + c->region + c->recv_off, h_b + c->region + c->recv_off,
                       size_ == 2 || custom, size_ == 2, &nccl_diff);
    }
    if (rank_ == 0)
        printf("eager: %d all-reduces in a row (%d of them through the custom path), %d ranks: %ld wrong "
               "element(s) on rank 0%s\n",
               N_EAGER, n_custom, size_, bad, size_ == 2 ? "" : " (against NCCL: a tolerance, ranks > 2)");
    if (nccl_diff && rank_ == 0)
        printf("  %ld element(s) differ from NCCL within the tolerance (NCCL sums in another order)\n", nccl_diff);
    cudaFreeHost(h_in);
    cudaFreeHost(h_a);
    cudaFreeHost(h_b);
    cudaFree(d_in);
    cudaFree(d_a);
    cudaFree(d_b);
    free(calls);
    return bad;
}

// ----------------------------------------------------------------------------
// 2. a captured graph

enum { G_CALLS = 48, G_REPLAYS = 100, G_TAIL = 10 };

static long graph(tp_comm *a, cudaStream_t s)
{
    static const size_t gbytes[] = {16384, 16384, 4096, 64, 16, 32768, 131072, 524288, 8192, 1048576, 20, 16400};
    const int ng = (int)(sizeof gbytes / sizeof gbytes[0]);
    call calls[G_CALLS];
    size_t pool = 0;
    for (int j = 0; j < G_CALLS; j++) {
        call *c = &calls[j];
        c->dt = j % 4 == 3 ? TP_DTYPE_BF16 : TP_DTYPE_F32;
        c->count = gbytes[j % ng] / tp_dtype_size(c->dt);
        place(c, (j + rank_) % 4);
        c->region = pool;
        pool += round_up(gbytes[j % ng] + 32, 256);
    }
    char *d_in = NULL, *d_out = NULL, *h_in = NULL, *h_out = NULL;
    CK(cudaMalloc((void **)&d_in, pool));
    CK(cudaMalloc((void **)&d_out, pool));
    CK(cudaMemset(d_in, 0, pool));
    CK(cudaMemset(d_out, 0, pool));
    CK(cudaMallocHost((void **)&h_in, pool * (G_REPLAYS + 1)));
    CK(cudaMallocHost((void **)&h_out, pool * (G_REPLAYS + 1)));
    memset(h_in, 0, pool * (G_REPLAYS + 1));
    for (int r = 0; r < G_REPLAYS; r++)
        for (int j = 0; j < G_CALLS; j++) {
            const call *c = &calls[j];
            uint64_t key = 5000000 + (uint64_t)r * G_CALLS + (uint64_t)j;
            for (size_t i = 0; i < c->count; i++)
                put(h_in + (size_t)r * pool + c->region + c->send_off, c->dt, i, elem_bits(c->dt, rank_, key, i));
        }
    CK(cudaDeviceSynchronize());

    /* capture: in-place calls copy their input first (inside the graph) */
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int j = 0; j < G_CALLS; j++) {
        const call *c = &calls[j];
        size_t bytes = c->count * tp_dtype_size(c->dt), o = c->region + c->send_off;
        const void *send = d_in + o;
        if (c->in_place) {
            CK(cudaMemcpyAsync(d_out + o, d_in + o, bytes, cudaMemcpyDeviceToDevice, s));
            send = d_out + o;
        }
        TPCK(tp_comm_all_reduce_sum(a, send, d_out + c->region + c->recv_off, c->count, c->dt, s));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    MPI_Barrier(MPI_COMM_WORLD);

    for (int r = 0; r < G_REPLAYS; r++) {
        CK(cudaMemcpyAsync(d_in, h_in + (size_t)r * pool, pool, cudaMemcpyHostToDevice, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaMemcpyAsync(h_out + (size_t)r * pool, d_out, pool, cudaMemcpyDeviceToHost, s));
    }
    /* then replays back to back on the last inputs, nothing in between */
    CK(cudaMemsetAsync(d_out, 0xff, pool, s));
    for (int r = 0; r < G_TAIL; r++) CK(cudaGraphLaunch(ge, s));
    CK(cudaMemcpyAsync(h_out + (size_t)G_REPLAYS * pool, d_out, pool, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));

    long bad = 0, unused = 0;
    for (int r = 0; r <= G_REPLAYS; r++) {
        int data = r < G_REPLAYS ? r : G_REPLAYS - 1;
        for (int j = 0; j < G_CALLS; j++) {
            call c = calls[j];
            c.key = 5000000 + (uint64_t)data * G_CALLS + (uint64_t)j;
            size_t bytes = c.count * tp_dtype_size(c.dt);
            /* NCCL's sum of more than two ranks is in another order: not bit for bit */
            int exact = size_ == 2 || (bytes % 16 == 0 && bytes <= big_);
            char what[96];
            snprintf(what, sizeof what, "graph %s %d, call %d (%s)", r < G_REPLAYS ? "replay" : "tail", r, j,
                     c.in_place ? "in place" : "out of place");
            bad += compare(what, &c, h_out + (size_t)r * pool + c.region + c.recv_off, NULL, exact, 0, &unused);
        }
    }
    if (rank_ == 0)
        printf("graph: %d all-reduces captured, %d replays with fresh inputs + %d back to back: %ld wrong "
               "element(s) on rank 0\n",
               G_CALLS, G_REPLAYS, G_TAIL, bad);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    cudaFree(d_in);
    cudaFree(d_out);
    cudaFreeHost(h_in);
    cudaFreeHost(h_out);
    return bad;
}

// ----------------------------------------------------------------------------
// 3. timing of a decode step's all-reduce

static double time_eager(tp_comm *c, float *buf, size_t count, cudaStream_t s, int iters)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 50; i++) TPCK(tp_comm_all_reduce_sum(c, buf, buf, count, TP_DTYPE_F32, s));
    CK(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < iters; i++) TPCK(tp_comm_all_reduce_sum(c, buf, buf, count, TP_DTYPE_F32, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1e3 * ms / iters;
}

static double time_graph(tp_comm *c, float *buf, size_t count, cudaStream_t s)
{
    enum { PER = 64, REPLAYS = 50 };
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < PER; i++) TPCK(tp_comm_all_reduce_sum(c, buf, buf, count, TP_DTYPE_F32, s));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < REPLAYS; i++) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return 1e3 * ms / (PER * REPLAYS);
}

static void timing(tp_comm *a, tp_comm *b, cudaStream_t s)
{
    const size_t count = 4096; /* [1, 4096] float32: 16 KiB */
    float *buf = NULL;
    CK(cudaMalloc((void **)&buf, count * sizeof *buf));
    CK(cudaMemset(buf, 0, count * sizeof *buf)); /* zeros stay zeros */
    double ea = time_eager(a, buf, count, s, 2000), eb = time_eager(b, buf, count, s, 2000);
    double ga = time_graph(a, buf, count, s), gb = time_graph(b, buf, count, s);
    double t[4] = {ea, eb, ga, gb}, worst[4];
    MPI_Reduce(t, worst, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank_ == 0)
        printf("16 KiB float32 in place, per call (slowest rank): custom %.2f us, NCCL %.2f us eager; "
               "custom %.2f us, NCCL %.2f us in a graph\n",
               worst[0], worst[1], worst[2], worst[3]);
    cudaFree(buf);
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    tp_log_init(rank_, size_);
    if (size_ < 2) {
        fprintf(stderr, "check_custom_ar: run it under mpirun with 2 to 8 ranks\n");
        MPI_Finalize();
        return 2;
    }
    MPI_Comm node;
    int local = 0, ngpu = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    CK(cudaGetDeviceCount(&ngpu));
    if (ngpu < 1) {
        fprintf(stderr, "rank %d: no GPU\n", rank_);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int dev = local % ngpu;
    CK(cudaSetDevice(dev));

    tp_comm *boot = NULL, *a = NULL, *b = NULL, *c = NULL;
    TPCK(tp_comm_mpi_create(MPI_COMM_WORLD, "world", &boot));
    const char *big = getenv("CHECK_CAR_MAX");
    if (big && *big) {
        big_ = (size_t)strtoull(big, NULL, 10);
        if (big_ < 65536 || big_ > 268435456 || (big_ & (big_ - 1))) {
            if (rank_ == 0)
                fprintf(stderr, "check_custom_ar: CHECK_CAR_MAX=%s is not a power of two from 65536 to 268435456\n", big);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        setenv("TPINFER_CUSTOM_AR_MAX", big, 1);
    } else {
        big_ = size_ == 2 ? 4194304 : 524288;
        unsetenv("TPINFER_CUSTOM_AR_MAX");
    }
    setenv("TPINFER_CUSTOM_AR", "1", 1);
    TPCK(tp_comm_nccl_create(boot, dev, "custom", &a));
    setenv("TPINFER_CUSTOM_AR", "0", 1);
    TPCK(tp_comm_nccl_create(boot, dev, "nccl", &b));
    setenv("TPINFER_CUSTOM_AR", "1", 1);
    setenv("TPINFER_CUSTOM_AR_MAX", "4096", 1);
    TPCK(tp_comm_nccl_create(boot, dev, "small", &c));
    unsetenv("TPINFER_CUSTOM_AR_MAX");

    size_t max_a = 0, max_b = 0, max_c = 0;
    int why_a = tp_comm_nccl_custom_ar(a, &max_a), why_b = tp_comm_nccl_custom_ar(b, &max_b);
    int why_c = tp_comm_nccl_custom_ar(c, &max_c);
    tp_comm_destroy(c);
    if (rank_ == 0)
        printf("check_custom_ar: %d ranks; custom path: %s, up to %zu bytes; TPINFER_CUSTOM_AR=0: %s; "
               "TPINFER_CUSTOM_AR_MAX=4096: up to %zu bytes\n",
               size_, tp_comm_nccl_custom_ar_why(why_a), max_a, tp_comm_nccl_custom_ar_why(why_b), max_c);
    if (why_a != TP_CUSTOM_AR_ON) {
        if (rank_ == 0) printf("check_custom_ar: no custom path to test (%s)\n", tp_comm_nccl_custom_ar_why(why_a));
        tp_comm_destroy(a);
        tp_comm_destroy(b);
        tp_comm_destroy(boot);
        MPI_Finalize();
        return 2;
    }
    long bad = 0;
    if (max_a != big_ || why_b != TP_CUSTOM_AR_OFF_ENV || max_b != 0 || why_c != TP_CUSTOM_AR_ON || max_c != 4096) {
        if (rank_ == 0) printf("FAIL: the switches: A max %zu, B %s max %zu, C max %zu\n", max_a,
                               tp_comm_nccl_custom_ar_why(why_b), max_b, max_c);
        bad++;
    }

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    bad += eager(a, b, s, max_a);
    bad += graph(a, s);
    timing(a, b, s);
    CK(cudaStreamDestroy(s));

    long total = 0;
    MPI_Allreduce(&bad, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank_ == 0) printf("check_custom_ar: %s (%ld mismatch(es) over all ranks)\n", total ? "FAIL" : "PASS", total);
    tp_comm_destroy(a);
    tp_comm_destroy(b);
    tp_comm_destroy(boot);
    MPI_Finalize();
    return total ? 1 : 0;
}
