/*
 * scheduler.h: continuous batching over a paged KV cache. Sequences wait, are admitted
 * as blocks and the --max-num-seqs / --max-num-batched-tokens budgets allow, prefill in
 * chunks, decode one token a step, and give their blocks back when finished. When a
 * running sequence's step needs a block and none is free, the most recently admitted
 * running sequence not yet in the step is preempted: its blocks are freed and it is recomputed later from its
 * tokens, so nothing is lost. A sequence is admitted beside running ones only when the
 * blocks for all of its known tokens are free with one more for each running sequence,
 * so a preempted one does not come back until it can run (alone, it goes on its first
 * chunk). Pure host logic, deterministic: every rank of a replica
 * runs an identical scheduler and reaches identical decisions.
 *
 * Prefix caching (cfg.prefix_caching): a block full of prompt tokens is registered when
 * the step that computed it is committed, and outlives its sequence until its room is
 * needed. A sequence being admitted (first, or again after a preemption) takes the longest
 * run of its prompt's leading full blocks found registered, and its first chunk starts
 * after them; at least its last prompt token is always computed, since its logits sample
 * the first new token. Blocks of a step are registered only at its commit, so no step
 * reads keys and values that the same step writes.
 *
 * Sliding window (cfg.window, where every layer slides): a sequence gives back its leading
 * blocks once no token it has still to compute reads them (vLLM's sliding-window manager),
 * so it holds about window tokens' blocks however long it runs; a prefix block given back
 * stays in the prefix cache like any other let go, and when the sequence lets go of the rest
 * it is made the last of them to be evicted (the head of a prefix, which every hit needs).
 */
#ifndef TP_SCHEDULER_H
#define TP_SCHEDULER_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_sched_config {
    int32_t block_size;             /* tokens per KV block (--kv-block-size) */
    int32_t n_blocks;               /* physical blocks this scheduler owns */
    int32_t max_num_seqs;           /* running sequences at most */
    int32_t max_num_batched_tokens; /* tokens in one step at most (chunked prefill) */
    int32_t max_model_len;          /* prompt + completion of one sequence at most */
    int prefix_caching;             /* keep full prompt blocks for later sequences (block_alloc.h) */
    int32_t window;                 /* > 0: every layer's sliding window (tp_attn_first_key): blocks
                                     * wholly before what a sequence's next token reads are given back */
    int32_t window_align;           /* the backend reads a window from its first key rounded down to a
                                     * multiple of this (tp_backend.window_align); 0 is taken as 1 */
} tp_sched_config;

/* The most KV blocks one sequence of n_tokens holds at once when its steps feed at most chunk
 * tokens: every block of its tokens, or with a window those from its window's first kept
 * position to the end of its step. Sizes the cache and --max-num-seqs; chunk 1 gives the
 * least a sequence can run in (the scheduler shrinks its chunks to the blocks free). */
int64_t tp_sched_seq_blocks(const tp_sched_config *cfg, int64_t n_tokens, int64_t chunk);

/* One forward step. Arrays are owned by the scheduler, valid until the next schedule. */
typedef struct tp_sched_batch {
    int32_t n_tokens;
    int32_t *tokens;      /* [n_tokens] ids to feed */
    int32_t *pos;         /* [n_tokens] positions */
    int32_t *seq;         /* [n_tokens] row of block_table the token belongs to */
    int32_t *slot;        /* [n_tokens] KV slot to write: block * block_size + offset */
    int32_t n_seqs;       /* sequences in this step (rows of block_table) */
    int32_t max_blocks;   /* columns of block_table: ceil(max_model_len / block_size) */
    int32_t *block_table; /* [n_seqs * max_blocks]; unused entries 0 */
    int64_t *seq_key;     /* [n_seqs] the caller's key of each row */
    int32_t *seq_first;   /* [n_seqs] index of the row's first token in this step */
    int32_t *seq_len;     /* [n_seqs] tokens of the row in this step */
    int32_t n_logits;     /* rows that end their known tokens: they sample a token */
    int32_t *logit_token; /* [n_logits] token index whose logits sample the next token */
    int32_t *logit_seq;   /* [n_logits] their rows */
    int32_t max_pos;      /* 1 + the largest pos in this step */
} tp_sched_batch;

typedef struct tp_scheduler tp_scheduler;

/* How many sequences n_blocks hold at once when each takes its full length: n_seqs
 * sequences that need seq_blocks blocks in all (each its ceil((prompt + max_new) /
 * block_size)), so n_blocks * n_seqs / seq_blocks, within [lo, hi]. The engine's default
 * --max-num-seqs on large GPUs: as many as run without preemption even where none stops
 * early, if all were of the mean length (TensorRT-LLM's guaranteed-no-evict admission, as a
 * cap on the count), never fewer than lo. hi with no sequences. */
int32_t tp_sched_fit_seqs(int64_t n_blocks, int64_t seq_blocks, int64_t n_seqs, int32_t lo, int32_t hi);

/* Prefix caching's share of a run's blocks, for sizing it: prompts added in turn, each
 * tp_prefix_count_add says how many blocks of `copies` sequences of it need not be held
 * again (its leading full blocks, up to the one with its last token, that an earlier prompt
 * or an earlier copy has; by 64-bit hashes of whole prefixes). Remembers at most max_blocks
 * prefixes; past that, new ones count as not shared. */
typedef struct tp_prefix_count tp_prefix_count;
tp_status tp_prefix_count_create(int32_t block_size, int64_t max_blocks, tp_prefix_count **out);
int64_t tp_prefix_count_add(tp_prefix_count *c, const int32_t *prompt, int32_t n_prompt, int32_t copies);
void tp_prefix_count_destroy(tp_prefix_count *c); /* accepts NULL */

tp_status tp_scheduler_create(const tp_sched_config *cfg, tp_scheduler **out);
void tp_scheduler_destroy(tp_scheduler *s); /* accepts NULL */

/* tp_scheduler_add's flags: the sequence computes every prompt token (its prompt rows'
 * logits are wanted: prompt logprobs, dumps), taking nothing from the prefix cache. */
#define TP_SCHED_NO_PREFIX_HITS 1

/* Queue a sequence. key is the caller's handle (unique). max_new_tokens >= 1. A sequence
 * whose prompt + max_new_tokens exceeds max_model_len, or could never fit in n_blocks,
 * is refused with TP_ERR_INVALID_ARG and a message saying both numbers; nothing is
 * queued then. The prompt is copied. */
tp_status tp_scheduler_add(tp_scheduler *s, int64_t key, const int32_t *prompt, int32_t n_prompt,
                           int32_t max_new_tokens, int flags);

/* Choose the next step: running decodes first (one token each, in admission order),
 * then prefill chunks of running and then waiting sequences (FIFO) within the token and
 * sequence budgets. b->n_tokens == 0 when nothing can run (then tp_scheduler_idle()). */
tp_status tp_scheduler_schedule(tp_scheduler *s, tp_sched_batch *b);

/* A token not known yet: the device chose it and the host has not read it (see
 * tp_scheduler_resolve). A later step may feed it (its batch shows TP_TOKEN_PENDING there). */
#define TP_TOKEN_PENDING (-1)

/* Apply the step's outcome: for each logit row i, sampled[i] is the new token of
 * logit_seq[i] (or TP_TOKEN_PENDING; a known token after a pending one of the same sequence
 * is refused, TP_ERR_INTERNAL), and finish[i] (0/1) says the caller ends that sequence
 * (EOS, stop, limit). A sequence that reaches its max_new_tokens finishes here whatever
 * finish[] says. finish may be NULL (no sequence ended by the caller). Must be called once
 * after each non-empty schedule, before the next schedule. */
tp_status tp_scheduler_commit(tp_scheduler *s, const tp_sched_batch *b, const int32_t *sampled,
                              const uint8_t *finish);

/* The oldest pending token of sequence key becomes token; with end, the sequence ends
 * there: its later pending tokens are dropped and, unless it finished already (by length),
 * it finishes now (running or preempted), its blocks given back. Call between a commit and
 * the next schedule: the step in flight on the device may still write the blocks, which is
 * safe because the steps a later schedule makes run after it. Returns 1, or 0 when key is
 * not known (popped already) or has no pending token. */
int tp_scheduler_resolve(tp_scheduler *s, int64_t key, int32_t token, int end);

/* Finished sequences, oldest first: returns 1 and fills key / tokens generated (pointer
 * valid until the next call) or 0 when none is left. */
int tp_scheduler_pop_finished(tp_scheduler *s, int64_t *key, const int32_t **generated,
                              int32_t *n_generated);

/* The run's first step, as tp_scheduler_schedule will take it, without taking it: the tokens
 * and sequences it admits from the waiting queue (FIFO, within max_num_seqs, the token budget
 * and the free blocks). For a scheduler where nothing runs or was computed yet (the warm-up
 * sizes a step by it). */
void tp_scheduler_peek_first(const tp_scheduler *s, int32_t *n_tokens, int32_t *n_seqs);

/* Prompt tokens that sequence key took from the prefix cache when it was first admitted
 * (0 before, or without a hit); key is a sequence not popped yet or the one popped last. */
int32_t tp_scheduler_cached_tokens(const tp_scheduler *s, int64_t key);

/* 1 when no sequence is waiting or running. */
int tp_scheduler_idle(const tp_scheduler *s);

/* Counters for tests and progress. */
typedef struct tp_sched_stats {
    int64_t steps, preemptions, prefill_tokens, decode_tokens;
    int64_t cached_tokens; /* prompt tokens taken from the prefix cache, over every admission */
    int32_t waiting, running, free_blocks;
} tp_sched_stats;
void tp_scheduler_stats(const tp_scheduler *s, tp_sched_stats *st);

#ifdef __cplusplus
}
#endif
#endif
