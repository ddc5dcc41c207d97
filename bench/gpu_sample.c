/*
 * gpu_sample.c: the CUDA backend's sample op (cuda/sample.cu) alone, at Llama-3's vocabulary
 * (128,256) and 1, 16 or 128 rows (on 132 SMs, 1 and 16: a row split over a cluster of 8
 * blocks; 128: a block a row), under the rules a batch run uses: greedy, greedy with
 * logprobs, temperature (with and without the chosen token's logprob), temperature with
 * top-p / top-k / min-p, penalties over 192 tokens, logprobs. Two shapes of logits: "flat"
 * (N(0, 1) a column: a random-weight model's) and "peaked" (N(0, 2), one column in 500
 * lifted by 8, one by 14: a trained model's few likely tokens over a long tail).
 *
 * Each (shape, rule, rows) is timed with CUDA events around one eager call (the engine runs
 * the op eagerly), over 8 sets of rows whose steps differ (so the draws land in different
 * places), the median of 5 rounds of the 8; and its tokens are compared with the CPU
 * backend's op on the same logits and rows (the definition; a draw may differ from the CPU's
 * only where u * mass falls within rounding of a boundary: cuda/sample.cu's header).
 *
 * usage: gpu_sample [device] [vocab]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "bench_check.h"

#define SETS 8
#define ROUNDS 5
#define LMAX 128
#define PEN_PROMPT 128
#define PEN_OUTPUT 64

static uint64_t rng = 0x2545f4914f6cdd1dull;

static double unit(void) /* xorshift64*, in (0, 1) */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return ((double)((rng * 0x2545f4914f6cdd1dull) >> 11) + 0.5) * 0x1p-53;
}

static double normal(void)
{
    return sqrt(-2.0 * log(unit())) * cos(6.283185307179586 * unit());
}

typedef struct rule {
    const char *name;
    double temperature, top_p, min_p, rep, freq;
    int32_t top_k, n_logprobs;
} rule;

/* n_logprobs -1 (none wanted) as the engine sends a request without logprobs */
static const rule rules[] = {
    {"greedy", 0.0, 1.0, 0.0, 1.0, 0.0, 0, -1},
    {"greedy, logprobs 5", 0.0, 1.0, 0.0, 1.0, 0.0, 0, 5},
    {"T 0.8", 0.8, 1.0, 0.0, 1.0, 0.0, 0, -1},
    {"T 0.8, the token's logprob", 0.8, 1.0, 0.0, 1.0, 0.0, 0, 0},
    {"T 0.8, top_p 0.95", 0.8, 0.95, 0.0, 1.0, 0.0, 0, -1},
    {"T 0.8, top_k 50", 0.8, 1.0, 0.0, 1.0, 0.0, 50, -1},
    {"T 0.8, min_p 0.05", 0.8, 1.0, 0.05, 1.0, 0.0, 0, -1},
    {"T 0.8, rep 1.1, freq 0.2", 0.8, 1.0, 0.0, 1.1, 0.2, 0, -1},
    {"T 1, logprobs 5", 1.0, 1.0, 0.0, 1.0, 0.0, 0, 5},
};
#define N_RULES ((int)(sizeof rules / sizeof rules[0]))

/* one backend's buffers: logits [LMAX, V], SETS row sets, the tokens, the results */
typedef struct side {
    tp_backend *b;
    void *logits, *rows[SETS], *toks, *out;
} side;

static void side_create(side *s, tp_backend *b, int32_t V, int32_t n_toks)
{
    s->b = b;
    BENCH_TP(b->ops->alloc(b, (size_t)LMAX * (size_t)V * sizeof(float), &s->logits));
    for (int k = 0; k < SETS; k++) BENCH_TP(b->ops->alloc(b, LMAX * sizeof(tp_sample_row), &s->rows[k]));
    BENCH_TP(b->ops->alloc(b, (size_t)n_toks * sizeof(int32_t), &s->toks));
    BENCH_TP(b->ops->alloc(b, LMAX * sizeof(tp_sample_out), &s->out));
}

static void side_free(side *s)
{
    s->b->ops->free(s->b, s->logits);
    for (int k = 0; k < SETS; k++) s->b->ops->free(s->b, s->rows[k]);
    s->b->ops->free(s->b, s->toks);
    s->b->ops->free(s->b, s->out);
}

static void call(const side *s, int32_t L, int32_t V, int set)
{
    const tp_tensor x = tp_tensor_make(s->logits, TP_DTYPE_F32, L, V);
    BENCH_TP(s->b->ops->sample(s->b, &x, L, s->rows[set], s->toks, s->out));
}

int main(int argc, char **argv)
{
    const int device = argc > 1 ? atoi(argv[1]) : 0;
    const int32_t V = argc > 2 ? atoi(argv[2]) : 128256;
    tp_backend *gpu = NULL, *cpu = NULL;
    BENCH_TP(tp_backend_cuda_create(device, TP_DTYPE_BF16, &gpu));
    BENCH_TP(tp_backend_cpu_create(&cpu));
    const int32_t n_toks = LMAX * (PEN_PROMPT + PEN_OUTPUT);
    side g, c;
    side_create(&g, gpu, V, n_toks);
    side_create(&c, cpu, V, n_toks);
    float *logits = malloc((size_t)LMAX * (size_t)V * sizeof(float));
    int32_t *toks = malloc((size_t)n_toks * sizeof(int32_t));
    tp_sample_row *rows = malloc(LMAX * sizeof(tp_sample_row));
    tp_sample_out *og = malloc(LMAX * sizeof(tp_sample_out)), *oc = malloc(LMAX * sizeof(tp_sample_out));
    if (!logits || !toks || !rows || !og || !oc) {
        fprintf(stderr, "gpu_sample: out of memory\n");
        return 1;
    }
    /* the penalty tokens: the likely columns (low ids, where "peaked" lifts some) repeat */
    for (int32_t k = 0; k < n_toks; k++) toks[k] = k % 3 ? (int32_t)(unit() * V) : (int32_t)(unit() * 2000);
    BENCH_TP(gpu->ops->upload(gpu, g.toks, toks, (size_t)n_toks * sizeof(int32_t)));
    BENCH_TP(cpu->ops->upload(cpu, c.toks, toks, (size_t)n_toks * sizeof(int32_t)));

    struct cudaDeviceProp prop;
    BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
    cudaStream_t stream = (cudaStream_t)gpu->stream;
    cudaEvent_t e0, e1;
    BENCH_CUDA(cudaEventCreate(&e0));
    BENCH_CUDA(cudaEventCreate(&e1));
    printf("# gpu_sample: %s, %d SMs; V %d; us a call (median of %d rounds of %d row sets); tokens "
           "against the CPU backend's\n", prop.name, prop.multiProcessorCount, (int)V, ROUNDS, SETS);
    printf("| logits | rule | rows | us a call | tokens = CPU |\n| --- | --- | ---: | ---: | --- |\n");
    for (int shape = 0; shape < 2; shape++) {
        for (size_t i = 0; i < (size_t)LMAX * (size_t)V; i++) {
            const int32_t col = (int32_t)(i % (size_t)V);
            logits[i] = shape == 0 ? (float)normal()
                                   : (float)(2.0 * normal() + (col % 500 == 7 ? 8.0 : 0.0) + (col == 4242 ? 14.0 : 0.0));
        }
        BENCH_TP(gpu->ops->upload(gpu, g.logits, logits, (size_t)LMAX * (size_t)V * sizeof(float)));
        BENCH_TP(cpu->ops->upload(cpu, c.logits, logits, (size_t)LMAX * (size_t)V * sizeof(float)));
        for (int ri = 0; ri < N_RULES; ri++) {
            const rule *u = &rules[ri];
            for (int set = 0; set < SETS; set++) {
                for (int32_t r = 0; r < LMAX; r++) {
                    tp_sample_row *w = &rows[r];
                    memset(w, 0, sizeof *w);
                    w->temperature = u->temperature;
                    w->top_p = u->top_p;
                    w->min_p = u->min_p;
                    w->repetition_penalty = u->rep;
                    w->frequency_penalty = u->freq;
                    w->top_k = u->top_k;
                    w->n_logprobs = u->n_logprobs;
                    w->seed = 1000u + (uint64_t)r;
                    w->step = (uint64_t)set * 17u;
                    w->tokens = r * (PEN_PROMPT + PEN_OUTPUT);
                    w->n_prompt = PEN_PROMPT;
                    w->n_output = PEN_OUTPUT;
                }
                BENCH_TP(gpu->ops->upload(gpu, g.rows[set], rows, LMAX * sizeof(tp_sample_row)));
                BENCH_TP(cpu->ops->upload(cpu, c.rows[set], rows, LMAX * sizeof(tp_sample_row)));
            }
            for (int li = 0; li < 3; li++) {
                const int32_t L = li == 0 ? 1 : li == 1 ? 16 : LMAX;
                call(&g, L, V, 0); /* warm-up: the flag scratch */
                BENCH_TP(gpu->ops->synchronize(gpu));
                double us[ROUNDS * SETS];
                for (int t = 0; t < ROUNDS * SETS; t++) {
                    BENCH_CUDA(cudaEventRecord(e0, stream));
                    call(&g, L, V, t % SETS);
                    BENCH_CUDA(cudaEventRecord(e1, stream));
                    BENCH_CUDA(cudaEventSynchronize(e1));
                    float ms = 0.0f;
                    BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
                    us[t] = 1e3 * ms;
                }
                BENCH_TP(gpu->ops->synchronize(gpu));
                /* tokens against the CPU's, every set */
                int same = 0, all = 0;
                for (int set = 0; set < SETS; set++) {
                    call(&g, L, V, set);
                    call(&c, L, V, set);
                    BENCH_TP(gpu->ops->download(gpu, og, g.out, (size_t)L * sizeof(tp_sample_out)));
                    BENCH_TP(gpu->ops->synchronize(gpu));
                    BENCH_TP(cpu->ops->download(cpu, oc, c.out, (size_t)L * sizeof(tp_sample_out)));
                    for (int32_t r = 0; r < L; r++) same += og[r].token == oc[r].token;
                    all += L;
                }
                printf("| %s | %s | %d | %.1f | %d of %d |\n", shape == 0 ? "flat" : "peaked", u->name, (int)L,
                       bench_median(us, ROUNDS * SETS), same, all);
                fflush(stdout);
            }
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    side_free(&g);
    side_free(&c);
    free(logits);
    free(toks);
    free(rows);
    free(og);
    free(oc);
    tp_backend_destroy(gpu);
    tp_backend_destroy(cpu);
    return 0;
}
