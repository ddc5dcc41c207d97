/*
 * engine_internal.h: what the engine's two files share: engine.c (the run's phases: the
 * input, the output, weights and schedulers, the end) and engine_step.c (the step loop: the
 * steps, their sampling rules, steps enqueued ahead, --dump-logits). The state of a run, and
 * the few functions each calls of the other (eng_ prefix).
 */
#ifndef TP_ENGINE_INTERNAL_H
#define TP_ENGINE_INTERNAL_H

#include <stdint.h>

#include "backend.h"
#include "chat_template.h"
#include "collect.h"
#include "completion.h"
#include "engine.h"
#include "guided.h"
#include "model.h"
#include "model_config.h"
#include "output.h"
#include "requests.h"
#include "sampler.h"
#include "scheduler.h"
#include "share.h"
#include "tokenizer.h"
#include "util.h"
#include "watchdog.h"

typedef struct req {
    tp_request *in;
    int64_t index;          /* among this run's requests (after --resume skips), -1: skipped */
    int64_t runnable;       /* among those that run, -1: does not run */
    int32_t *prompt;
    int32_t n_prompt;
    tp_sampling_params sp;
    int32_t max_new, min_tokens, n;
    int ignore_eos, skip_special, include_stop;
    int32_t prompt_lp;      /* top-N of prompt logprobs, -1: none */
    const char *error_code; /* set: the request does not run */
    char *error_message;
    int64_t first_seq;
    /* sampler rank */
    tp_choice *choices;
    tp_prompt_logprob *plp;
    tp_token_logprob *plp_top;
    int32_t n_plp;          /* prompt positions recorded (prompt logprobs or dump) */
    float *dump_prompt, *dump_gen;
    int32_t n_dump_gen, dump_cap; /* rows kept in dump_gen, and its room */
    int32_t n_finished;
    int32_t n_cached;       /* prompt tokens its first choice read from the prefix cache */
    int32_t *bad_ids, *bad_len, n_bad; /* bad_words as token sequences (bad_words_of), one after another */
    int bad_ready;
    tp_guide_cursor **guide_cursor; /* [n] each choice's JSON reading so far (guided_ids), or NULL */
} req;

typedef struct seq {
    int64_t req;
    int32_t choice;
    /* steps enqueued ahead (loop_ahead): ids count from 1, 0 is none */
    int64_t ahead_id;  /* the last enqueued step that samples this sequence */
    int32_t ahead_row; /* its logit row there */
    int64_t end_id;    /* the scheduler ended it by length at this step: ends once that step's token is read */
    int dead;          /* ended: later rows of it (already enqueued) are dropped */
} seq;

/* Where the loop with steps ahead spends its time (TPINFER_LOG=debug prints it a step):
 * scheduling, the sampling rules, enqueueing steps and sample ops (uploads, graph launches),
 * waiting for a step's tokens, turning them into text (detokenizing, stops, logprobs),
 * applying them (the TP group's decisions, the scheduler, finished requests written), the
 * output's collector. */
enum { HOST_SCHEDULE, HOST_RULES, HOST_ENQUEUE, HOST_WAIT, HOST_TOKENS, HOST_APPLY, HOST_POLL, HOST_PHASES };

/* A step enqueued ahead whose tokens the host has not read yet. */
typedef struct ahead_step {
    int64_t id;
    int32_t n;      /* logit rows */
    int64_t *keys;  /* [max_rows] their sequences */
    int sampled;    /* chosen by the sample op (sout), else by argmax (ids) */
    int unsampled;  /* its rules read the step before's tokens: sampled once that step is read */
    int32_t *ids;   /* [max_rows] their tokens, once read */
    tp_sample_out *sout; /* [max_rows] the sample op's results, once read */
} ahead_step;

typedef struct engine {
    const tp_options *o;
    tp_mpi_world *w;
    const tp_grid *g;
    const tp_device_info *dev;
    tp_model_config cfg;
    tp_generation_config gen;
    tp_tokenizer *tok;
    tp_chat_template *tpl;
    tp_tool_parser tool_parser_hint; /* the parser whose marker the template writes, for an error's hint */
    tp_request_list reqs;
    req *R;
    seq *S_;                /* every sequence of this replica */
    int64_t n_seqs;
    int64_t n_index;        /* this run's requests (all replicas'; those done earlier not counted) */
    int64_t n_runnable;     /* this replica's requests that run */
    int any_runnable;       /* some replica runs a request (else no rank loads the model) */
    int openai;             /* the input holds OpenAI batch lines: error records answer in that shape */
    int64_t n_encoded;      /* prompts this rank tokenized (its part of its replica's) */
    tp_ids encode_scratch;  /* encode_input's vector, reused prompt after prompt */
    size_t n_kept_read;     /* requests of the share read so far (eng_take_kept) */
    int reread;             /* --resume: the share read again, of the requests to go */
    int32_t *exchange_heads; /* prepare_all's exchanges: [3 * replica size] */
    int abort_startup;      /* a rank failed with peers in a collective of the startup: abort the job */
    size_t keep_pos;        /* keep_to_go: positions before keep_pos counted into keep_index */
    int64_t keep_index;
    int32_t max_model_len;
    int32_t max_batched;    /* --max-num-batched-tokens, or its default for the device (load) */
    int32_t max_seqs;       /* --max-num-seqs, or its default for the device (load) */
    int seqs_fitted;        /* max_seqs is the large GPU's default, fitted to the KV cache (load) */
    int32_t warm, tune;     /* the warm-up, and cuBLASLt tuning in it: agreed by the replica's ranks */
    int32_t warm_first;     /* the warm-up's prefill of the first step's size (agreed too) */
    int32_t eos[TP_MAX_EOS_IDS];
    int n_eos;
    const char *model_name;

    tp_output *out;         /* rank 0 */
    tp_progress *progress;  /* rank 0 */
    int status_early;       /* rank 0: the status file says "validating" (no progress yet) */
    tp_collector *collector;
    tp_watchdog *watchdog;     /* armed while the warm-up and the loop run (--step-timeout) */
    uint32_t *done_bits;    /* resume: requests the output already holds */
    int32_t done_errors;    /* resume: of those, error records (the batch's exit status counts them) */

    tp_weights weights;
    tp_backend *backend;
    tp_comm *tpc, *ppc;     /* the TP and PP collectives (MPI, or NCCL on GPUs) */
    tp_comm *nccl_tp, *nccl_pp;
    tp_model model;
    tp_kv_cache kv;
    tp_step_buffers buf;
    tp_tensor rx, rdelta;   /* activations received from the previous stage */

    int P;
    int32_t blocks_per_engine;
    tp_scheduler **S;
    tp_sched_batch *B;
    int *inflight;
    int64_t *entered;
    int stopping;           /* the replica agreed to stop early */

    int is_sampler;
    int greedy_on_device;   /* this step's tokens are chosen by the backend's argmax */
    int sample_on_device;   /* sampler rank: this step's rows were sampled by the backend's sample op */
    int sample_op_ran;      /* every rank alike: a step (or the warm-up) ran the sample op on some rows */
    /* what the environment asks that changes a step's collectives, agreed by the replica's
     * ranks (env_wanted, then the start-up all-gather): TPINFER_SAMPLE_ON_HOST, decode steps
     * padded as graphs (graphs, or TPINFER_PAD_DECODE=1), TPINFER_PRUNE_LAST, steps enqueued
     * ahead (unless TPINFER_OVERLAP=0) */
    int sample_on_host, pad_decode, prune_last, overlap;
    int test_skew; /* TPINFER_TEST_SKEW_AT=read:RANK: this rank misreads a choice (same_choices) */
    tp_sample_row *srows;   /* [max_rows] their rules */
    tp_sample_out *sout;    /* [max_rows] their results */
    int32_t *stokens;       /* their penalty and banned ids */
    size_t stokens_cap;
    int64_t steps_by_path[3]; /* sampler rank: steps chosen by device argmax, device sample op, host sampler */
    tp_sampler *sampler;
    tp_guide *guide;        /* sampler rank: guided decoding's token pieces, made at its first use */
    int32_t *guided;        /* [tp_guide_max_allowed]: the ids a guided row may draw next */
    float *logits_host;
    int32_t *ban;           /* a row's banned ids: min_tokens' end tokens, bad_words' last tokens */
    size_t ban_cap;
    int32_t max_rows;
    tp_token_logprob *top;
    int32_t *slot, *block_table, *rows, *extra_seq, *sync, *take;
    ahead_step ahead[2];    /* loop_ahead: by id % 2 (the ids' host slot) */
    int64_t launched;       /* loop_ahead: steps enqueued */
    int64_t prof_from, prof_to; /* TPINFER_PROFILE_STEPS: the profiler's range, in steps (-1: none) */
    double t_loop_end;          /* when the loop returned (now_s) */
    int32_t n_extra;
    uint8_t *finish;
    int64_t generated_tokens, prompt_tokens;
    int64_t guide_dead_ends; /* choices guided decoding left with no next token (the first few are named) */
    double t0;
    double forward_seconds; /* the waiting loop's forward steps, GPU wait included (with steps
                             * ahead: host_s' enqueue and wait) */
    int64_t forward_steps;
    double host_s[HOST_PHASES]; /* the loop with steps ahead: its time by phase (host_lap) */
    double load_seconds;    /* reading and placing this rank's weights */
} engine;

static inline double now_s(void) { return tp_monotonic_s(); }

/* The time since t counted to phase; returns now, the next phase's start. */
static inline double host_lap(engine *e, int phase, double t)
{
    const double now = now_s();
    e->host_s[phase] += now - t;
    return now;
}

/* engine.c */
int eng_stop_signal(void); /* SIGTERM, SIGINT or SIGUSR1 arrived (the signal), else 0 */
/* the choice's rows that ask for prompt logprobs or a --dump-logits dump */
int eng_wants_prompt_rows(const engine *e, const req *r, int32_t choice);
/* a sequence just popped: its request's prompt tokens read from the prefix cache (first choice) */
void eng_note_cached(engine *e, const tp_scheduler *s, int64_t key);

/* engine_requests.c */
tp_status eng_load_chat_template(engine *e);     /* --chat-template, or the model's */
tp_status eng_take_kept(void *arg, tp_request *in); /* the reader's callback: a request of the share, as read */
void eng_drop_prompt(tp_request *in);             /* its text and ids freed */
tp_status eng_make_requests(engine *e);          /* the engine's side of each request kept */
tp_status eng_prepare_request(engine *e, req *r); /* its settings and prompt checked, or its error */

/* engine_step.c */
tp_status eng_warm_up(engine *e);   /* before the first step */
tp_status eng_run_loop(engine *e);  /* every step of the run */
void eng_free_cursors(req *r);      /* a request's guided JSON readings */

#endif
