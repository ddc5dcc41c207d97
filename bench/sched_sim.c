/*
 * sched_sim.c: an offline run through the real scheduler (scheduler.c) with a cost model in
 * place of the model, to weigh scheduling choices (--max-num-seqs, the cache's size) without
 * a GPU. N prompts of P distinct tokens, each run to G new tokens (ignore_eos), in a cache of
 * C tokens. A step costs max(weights, prefill tokens x prefill) + K/V tokens read x K/V bytes
 * / K/V rate + rows x row: the weights stream once a step, under the prefill's products where
 * a step has them; each row's attention reads its keys and values. Defaults: Llama-3-8B on an
 * H100 (5.3 ms of weights, 23 us a prefill token at ~700 TFLOP/s, 128 KiB of K/V a token at
 * 2.4 TB/s, 2 us a row), which put 1024 x 128 / 2048 at 256 at once at 195.7 s against the
 * 197.8 s measured (bench/RESULTS.md, fortieth session).
 * Usage: sched_sim N P G MAX_NUM_SEQS CACHE_TOKENS [BATCHED_TOKENS [BLOCK]]
 * (e.g. sched_sim 1024 128 2048 256 463000: an H100's cache of ~213 such sequences whole)
 */
#include <stdio.h>
#include <stdlib.h>

#include "scheduler.h"
#include "status.h"

#define WEIGHTS_S 5.3e-3
#define PREFILL_S_PER_TOKEN 23e-6
#define KV_BYTES_PER_TOKEN 131072.0
#define KV_BYTES_PER_S 2.4e12
#define ROW_S 2e-6

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: sched_sim N P G MAX_NUM_SEQS CACHE_TOKENS [BATCHED_TOKENS [BLOCK]]\n");
        return 2;
    }
    const int32_t n = atoi(argv[1]), prompt = atoi(argv[2]), max_new = atoi(argv[3]);
    const int32_t batched = argc > 6 ? atoi(argv[6]) : 16384, block = argc > 7 ? atoi(argv[7]) : 16;
    const tp_sched_config cfg = {block, (int32_t)(atol(argv[5]) / block), atoi(argv[4]), batched, prompt + max_new, 1, 0, 0};
    tp_scheduler *s = NULL;
    int32_t *tokens = malloc((size_t)(prompt > cfg.max_num_seqs ? prompt : cfg.max_num_seqs) * sizeof *tokens);
    if (!tokens || tp_scheduler_create(&cfg, &s) != TP_OK) goto fail;
    for (int32_t i = 0; i < n; i++) {
        for (int32_t t = 0; t < prompt; t++) tokens[t] = 1 + (i * 7919 + t * 31) % 30000;
        tokens[0] = 1 + i; /* no two prompts share a block: no prefix hits */
        if (tp_scheduler_add(s, i, tokens, prompt, max_new, 0) != TP_OK) goto fail;
    }
    for (int32_t i = 0; i < cfg.max_num_seqs; i++) tokens[i] = 5; /* every sampled token */
    double seconds = 0;
    while (!tp_scheduler_idle(s)) {
        tp_sched_batch b;
        if (tp_scheduler_schedule(s, &b) != TP_OK) goto fail;
        double kv = 0, prefill = 0;
        for (int32_t r = 0; r < b.n_seqs; r++) {
            kv += b.pos[b.seq_first[r]] + b.seq_len[r]; /* the row's keys: all up to its last */
            if (b.seq_len[r] > 1) prefill += b.seq_len[r];
        }
        const double products = prefill * PREFILL_S_PER_TOKEN;
        seconds += (products > WEIGHTS_S ? products : WEIGHTS_S) + kv * KV_BYTES_PER_TOKEN / KV_BYTES_PER_S +
                   b.n_seqs * ROW_S;
        if (tp_scheduler_commit(s, &b, tokens, NULL) != TP_OK) goto fail;
        int64_t key;
        const int32_t *generated;
        int32_t n_generated;
        while (tp_scheduler_pop_finished(s, &key, &generated, &n_generated)) {}
    }
    tp_sched_stats st;
    tp_scheduler_stats(s, &st);
    printf("| sequences | at once | cache blocks | seconds | generated tok/s | steps | preempted | prefill tokens |\n"
           "| %d x %d / %d | %d | %d | %.1f | %.0f | %lld | %lld | %lld |\n",
           n, prompt, max_new, cfg.max_num_seqs, cfg.n_blocks, seconds, (double)n * max_new / seconds,
           (long long)st.steps, (long long)st.preemptions, (long long)st.prefill_tokens);
    tp_scheduler_destroy(s);
    free(tokens);
    return 0;
fail:
    fprintf(stderr, "sched_sim: %s\n", tp_error_message());
    tp_scheduler_destroy(s);
    free(tokens);
    return 1;
}
