/*
 * gpu_gemm_search.c: how fast cuBLASLt can run Llama-3-8B's decode products at n rows when
 * its configurations are searched, not only the heuristic's 8 that cuda/matmul.c's tuner
 * times. The layout is matmul.c's: y [n, m] = x [n, k] @ w [m, k]^T, bf16 in and out, f32
 * accumulation (A = w transposed, B = x). Candidates per shape:
 *   heur      the heuristic's best fit, first 8 (what the tuner chooses among);
 *   id        the heuristic limited to each algorithm id (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID);
 *   config    each algorithm id's tiles x split-K (1..16) x reduction schemes x CTA swizzle,
 *             stages, custom options and cluster shapes left to the library, kept where
 *             cublasLtMatmulAlgoCheck accepts them.
 * Each is timed over calls that rotate over weight copies (>= 256 MB, so L2 holds none),
 * launched back to back on one stream (from the host, no graph); the 12 fastest are timed
 * again and printed with their configuration, the fastest's output compared with the
 * heuristic's first.
 *
 * usage: gpu_gemm_search [n rows (128)] [candidates timed per shape (3000)]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* cublasLt.h declares f() for f(void) */
#include <cublasLt.h>
#pragma GCC diagnostic pop
#include <cuda_runtime_api.h>

#include "bench_check.h"

#define WORKSPACE ((size_t)32 << 20) /* cuda/backend_cuda.c's */
#define ROTATE_BYTES ((size_t)256 << 20)
#define SCREEN_CALLS 12
#define FINAL_CALLS 60
#define TOP 12

#define LT(x)                                                                                         \
    do {                                                                                              \
        cublasStatus_t s_ = (x);                                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
            fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_);        \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

typedef struct shape {
    const char *name;
    int64_t m, k;
} shape;

static const shape shapes[] = {
    {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336},
};

typedef struct cand {
    cublasLtMatmulAlgo_t algo;
    const char *from;
    double us;
} cand;

typedef struct ctx {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    void **w, *x, *y, *ws;
    int copies;
    cudaStream_t s;
    cudaEvent_t e0, e1;
} ctx;

static cand *cands;
static int n_cands, cap_cands;

static void add(const cublasLtMatmulAlgo_t *a, const char *from)
{
    for (int i = 0; i < n_cands; i++)
        if (!memcmp(&cands[i].algo, a, sizeof *a)) return;
    if (n_cands == cap_cands) {
        cap_cands = cap_cands ? 2 * cap_cands : 1024;
        cands = realloc(cands, (size_t)cap_cands * sizeof *cands);
        if (!cands) exit(1);
    }
    cands[n_cands].algo = *a;
    cands[n_cands].from = from;
    cands[n_cands].us = INFINITY;
    n_cands++;
}

/* microseconds per call over calls back to back, rotating over the weight copies; INFINITY
 * where the library refuses the configuration */
static double time_algo(ctx *c, const cublasLtMatmulAlgo_t *a, int calls)
{
    const float alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < 2; i++)
        if (cublasLtMatmul(c->lt, c->op, &alpha, c->w[i % c->copies], c->la, c->x, c->lb, &beta, c->y, c->ld, c->y,
                           c->ld, a, c->ws, WORKSPACE, c->s) != CUBLAS_STATUS_SUCCESS)
            return INFINITY;
    BENCH_CUDA(cudaEventRecord(c->e0, c->s));
    for (int i = 0; i < calls; i++)
        if (cublasLtMatmul(c->lt, c->op, &alpha, c->w[(i + 2) % c->copies], c->la, c->x, c->lb, &beta, c->y, c->ld,
                           c->y, c->ld, a, c->ws, WORKSPACE, c->s) != CUBLAS_STATUS_SUCCESS)
            return INFINITY;
    BENCH_CUDA(cudaEventRecord(c->e1, c->s));
    if (cudaEventSynchronize(c->e1) != cudaSuccess) {
        fprintf(stderr, "a configuration failed on the device: %s\n", cudaGetErrorString(cudaGetLastError()));
        exit(1);
    }
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, c->e0, c->e1));
    return 1e3 * ms / calls;
}

static void describe(const cublasLtMatmulAlgo_t *a, char *out, size_t cap)
{
    int32_t id = 0, splitk = 0;
    uint32_t tile = 0, red = 0, swz = 0, custom = 0, stages = 0;
    uint16_t inner = 0, cluster = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner, sizeof inner, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    snprintf(out, cap, "id %d tile %u stages %u splitk %d red %u swz %u custom %u inner %u cluster %u", id, tile,
             stages, splitk, red, swz, custom, (unsigned)inner, (unsigned)cluster);
}

static int by_us(const void *a, const void *b)
{
    const double x = ((const cand *)a)->us, y = ((const cand *)b)->us;
    return x < y ? -1 : x > y;
}

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float f32_of(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int main(int argc, char **argv)
{
    const int64_t n = argc > 1 ? atoll(argv[1]) : 128;
    const int max_timed = argc > 2 ? atoi(argv[2]) : 3000;
    ctx c;
    memset(&c, 0, sizeof c);
    LT(cublasLtCreate(&c.lt));
    BENCH_CUDA(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
    BENCH_CUDA(cudaEventCreate(&c.e0));
    BENCH_CUDA(cudaEventCreate(&c.e1));
    BENCH_CUDA(cudaMalloc(&c.ws, WORKSPACE));
    const cudaDataType_t bf = CUDA_R_16BF;
    const cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    printf("# cuBLASLt search: y [%lld, m] = x [%lld, k] @ w [m, k]^T, bf16, f32 accumulation; us per call, "
           "calls back to back over weight copies (L2 cold)\n",
           (long long)n, (long long)n);
    printf("| shape | heuristic's first us | best of its 8 | best found | GB/s (weights) | candidates timed | "
           "max rel diff | best configuration |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    fflush(stdout);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        const size_t wbytes = (size_t)(sh->m * sh->k) * 2;
        c.copies = (int)((ROTATE_BYTES + wbytes - 1) / wbytes);
        if (c.copies < 2) c.copies = 2;
        c.w = calloc((size_t)c.copies, sizeof *c.w);
        /* random bf16 in [-0.05, 0.05) for w, [-1, 1) for x */
        size_t fill = (size_t)1 << 22;
        uint16_t *host = malloc(fill * 2);
        if (!c.w || !host) {
            fprintf(stderr, "out of host memory\n");
            return 1;
        }
        uint32_t r = 12345u + (uint32_t)si;
        for (size_t i = 0; i < fill; i++) {
            r = r * 1664525u + 1013904223u;
            host[i] = bf16_of(((float)(r >> 8) / 16777216.0f - 0.5f) * 0.1f);
        }
        for (int i = 0; i < c.copies; i++) {
            BENCH_CUDA(cudaMalloc(&c.w[i], wbytes));
            for (size_t at = 0; at < wbytes; at += fill * 2)
                BENCH_CUDA(cudaMemcpy((char *)c.w[i] + at, host, wbytes - at < fill * 2 ? wbytes - at : fill * 2,
                              cudaMemcpyHostToDevice));
        }
        const size_t xbytes = (size_t)(n * sh->k) * 2, ybytes = (size_t)(n * sh->m) * 2;
        uint16_t *hx = malloc(xbytes);
        if (!hx) {
            fprintf(stderr, "out of host memory\n");
            return 1;
        }
        for (size_t i = 0; i < xbytes / 2; i++) {
            r = r * 1664525u + 1013904223u;
            hx[i] = bf16_of((float)(r >> 8) / 8388608.0f - 1.0f);
        }
        BENCH_CUDA(cudaMalloc(&c.x, xbytes));
        BENCH_CUDA(cudaMalloc(&c.y, ybytes));
        BENCH_CUDA(cudaMemcpy(c.x, hx, xbytes, cudaMemcpyHostToDevice));

        const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        LT(cublasLtMatmulDescCreate(&c.op, ct, CUDA_R_32F));
        LT(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        LT(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        LT(cublasLtMatrixLayoutCreate(&c.la, bf, (uint64_t)sh->k, (uint64_t)sh->m, sh->k));
        LT(cublasLtMatrixLayoutCreate(&c.lb, bf, (uint64_t)sh->k, (uint64_t)n, sh->k));
        LT(cublasLtMatrixLayoutCreate(&c.ld, bf, (uint64_t)sh->m, (uint64_t)n, sh->m));
        cublasLtMatmulPreference_t pref;
        LT(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t ws = WORKSPACE;
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));

        n_cands = 0;
        cublasLtMatmulHeuristicResult_t res[16];
        int found = 0;
        LT(cublasLtMatmulAlgoGetHeuristic(c.lt, c.op, c.la, c.lb, c.ld, c.ld, pref, 8, res, &found));
        if (found < 1) {
            fprintf(stderr, "%s: the heuristic found no algorithm\n", sh->name);
            return 1;
        }
        for (int i = 0; i < found; i++) add(&res[i].algo, "heur");
        const int n_heur = n_cands;
        const cublasLtMatmulAlgo_t heur0 = res[0].algo;

        int ids[512], n_ids = 0;
        LT(cublasLtMatmulAlgoGetIds(c.lt, ct, CUDA_R_32F, bf, bf, bf, bf, 512, ids, &n_ids));
        /* the heuristic per algorithm id */
        cublasLtMatmulPreference_t pid;
        LT(cublasLtMatmulPreferenceCreate(&pid));
        LT(cublasLtMatmulPreferenceSetAttribute(pid, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        const uint32_t mode = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
        LT(cublasLtMatmulPreferenceSetAttribute(pid, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode, sizeof mode));
        for (int a = 0; a < n_ids; a++) {
            for (int i = 0; i < 16; i++)
                cublasLtMatmulAlgoInit(c.lt, ct, CUDA_R_32F, bf, bf, bf, bf, ids[a], &res[i].algo);
            found = 0;
            if (cublasLtMatmulAlgoGetHeuristic(c.lt, c.op, c.la, c.lb, c.ld, c.ld, pid, 16, res, &found) ==
                CUBLAS_STATUS_SUCCESS)
                for (int i = 0; i < found; i++)
                    if (res[i].state == CUBLAS_STATUS_SUCCESS) add(&res[i].algo, "id");
        }
        const int n_id = n_cands - n_heur;
        /* configurations */
        static const int splits[] = {1, 2, 3, 4, 6, 8, 12, 16};
        for (int a = 0; a < n_ids && n_cands < 4 * max_timed; a++) {
            cublasLtMatmulAlgo_t algo;
            if (cublasLtMatmulAlgoInit(c.lt, ct, CUDA_R_32F, bf, bf, bf, bf, ids[a], &algo) != CUBLAS_STATUS_SUCCESS)
                continue;
            uint32_t tiles[128];
            size_t w = 0;
            int n_tiles = 0;
            if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof tiles, &w) ==
                CUBLAS_STATUS_SUCCESS)
                n_tiles = (int)(w / sizeof tiles[0]);
            if (n_tiles == 0) tiles[0] = 0, n_tiles = 1;
            int32_t splitk_ok = 0;
            uint32_t red_mask = 0, swz_ok = 0;
            cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof splitk_ok, &w);
            cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &red_mask,
                                              sizeof red_mask, &w);
            cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok,
                                              &w);
            for (int t = 0; t < n_tiles; t++)
                for (size_t sp = 0; sp < sizeof splits / sizeof splits[0]; sp++) {
                    if (splits[sp] > 1 && !splitk_ok) break;
                    for (uint32_t red = 0; red <= 4; red = red ? red << 1 : 1) {
                        if ((splits[sp] == 1) != (red == 0)) continue;
                        if (red && !(red_mask & red)) continue;
                        for (uint32_t swz = 0; swz <= (swz_ok ? 1u : 0u); swz++) {
                            cublasLtMatmulAlgo_t x = algo;
                            const int32_t k = splits[sp];
                            cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[t],
                                                                 sizeof tiles[t]);
                            cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof k);
                            cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                                                 sizeof red);
                            cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz,
                                                                 sizeof swz);
                            cublasLtMatmulHeuristicResult_t chk;
                            if (cublasLtMatmulAlgoCheck(c.lt, c.op, c.la, c.lb, c.ld, c.ld, &x, &chk) ==
                                    CUBLAS_STATUS_SUCCESS &&
                                chk.workspaceSize <= WORKSPACE)
                                add(&x, "config");
                        }
                    }
                }
        }
        const int n_cfg = n_cands - n_heur - n_id;
        /* screen, then time the fastest again */
        const int timed = n_cands < max_timed ? n_cands : max_timed;
        for (int i = 0; i < timed; i++) cands[i].us = time_algo(&c, &cands[i].algo, SCREEN_CALLS);
        const double first = time_algo(&c, &cands[0].algo, FINAL_CALLS);
        double heur_best = INFINITY;
        for (int i = 0; i < n_heur; i++) {
            const double t = time_algo(&c, &cands[i].algo, FINAL_CALLS);
            if (t < heur_best) heur_best = t;
        }
        qsort(cands, (size_t)timed, sizeof *cands, by_us);
        const int top = timed < TOP ? timed : TOP;
        for (int i = 0; i < top; i++) cands[i].us = time_algo(&c, &cands[i].algo, FINAL_CALLS);
        qsort(cands, (size_t)top, sizeof *cands, by_us);
        /* the fastest's output against the heuristic's first */
        const float alpha = 1.0f, beta = 0.0f;
        uint16_t *y0 = malloc(ybytes), *y1 = malloc(ybytes);
        if (!y0 || !y1) {
            fprintf(stderr, "out of host memory\n");
            return 1;
        }
        LT(cublasLtMatmul(c.lt, c.op, &alpha, c.w[0], c.la, c.x, c.lb, &beta, c.y, c.ld, c.y, c.ld, &heur0, c.ws,
                          WORKSPACE, c.s));
        BENCH_CUDA(cudaStreamSynchronize(c.s));
        BENCH_CUDA(cudaMemcpy(y0, c.y, ybytes, cudaMemcpyDeviceToHost));
        double diff = NAN;
        if (cublasLtMatmul(c.lt, c.op, &alpha, c.w[0], c.la, c.x, c.lb, &beta, c.y, c.ld, c.y, c.ld, &cands[0].algo,
                           c.ws, WORKSPACE, c.s) == CUBLAS_STATUS_SUCCESS) {
            BENCH_CUDA(cudaStreamSynchronize(c.s));
            BENCH_CUDA(cudaMemcpy(y1, c.y, ybytes, cudaMemcpyDeviceToHost));
            double md = 0, mx = 0;
            for (size_t i = 0; i < ybytes / 2; i++) {
                const double a = f32_of(y0[i]), b = f32_of(y1[i]);
                if (fabs(a - b) > md) md = fabs(a - b);
                if (fabs(a) > mx) mx = fabs(a);
            }
            diff = mx > 0 ? md / mx : md;
        }
        char desc[256];
        describe(&cands[0].algo, desc, sizeof desc);
        printf("| %s m=%lld k=%lld | %.1f | %.1f | %.1f (%s) | %.0f | %d (%d heur, %d id, %d config) | %.1e | %s |\n",
               sh->name, (long long)sh->m, (long long)sh->k, first, heur_best, cands[0].us, cands[0].from,
               (double)wbytes / (cands[0].us * 1e3), timed, n_heur, n_id, n_cfg, diff, desc);
        for (int i = 0; i < top; i++) {
            describe(&cands[i].algo, desc, sizeof desc);
            fprintf(stderr, "%s %2d %8.1f us %-6s %s\n", sh->name, i + 1, cands[i].us, cands[i].from, desc);
        }
        fflush(stdout);
        free(y0), free(y1), free(hx), free(host);
        cublasLtMatmulPreferenceDestroy(pid);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(c.la), cublasLtMatrixLayoutDestroy(c.lb), cublasLtMatrixLayoutDestroy(c.ld);
        cublasLtMatmulDescDestroy(c.op);
        for (int i = 0; i < c.copies; i++) BENCH_CUDA(cudaFree(c.w[i]));
        free(c.w);
        BENCH_CUDA(cudaFree(c.x));
        BENCH_CUDA(cudaFree(c.y));
    }
    return 0;
}
