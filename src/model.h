/*
 * model.h: one rank's share of a Llama-family model on a backend (llama2.c's Config /
 * Weights / RunState split): the weights of its layers and slices, fused as the forward
 * pass wants them (q|k|v rows in one matrix, gate|up in another), its KV cache, and the
 * scratch buffers of one step. tp_model_forward runs one step of the Megatron forward.
 */
#ifndef TP_MODEL_H
#define TP_MODEL_H

#include "backend.h"
#include "comm.h"
#include "model_config.h"
#include "shard_plan.h"
#include "weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_layer_weights {
    tp_tensor attn_norm;    /* [1, d] */
    tp_tensor qkv;          /* [(hq + 2 hk) * hd, d]: this rank's q, k, v rows */
    tp_tensor qkv_bias;     /* [1, (hq + 2 hk) * hd], data NULL when none */
    tp_tensor q_norm;       /* [1, hd] Qwen3, data NULL when none */
    tp_tensor k_norm;
    tp_tensor o;            /* [d, hq * hd]: columns of this rank's heads */
    tp_tensor o_bias;       /* [1, d] on tp rank 0 only */
    tp_tensor mlp_norm;     /* [1, d] */
    tp_tensor post_attn_norm; /* [1, d] Gemma: the attention block's output normed before the residual add */
    tp_tensor post_mlp_norm;  /* [1, d] Gemma: the MLP's likewise; data NULL elsewhere */
    tp_tensor gate_up;      /* [2 m, d]: gate rows, then up rows */
    tp_tensor gate_up_bias; /* [1, 2 m] */
    tp_tensor down;         /* [d, m] */
    tp_tensor down_bias;    /* [1, d] on tp rank 0 only */
} tp_layer_weights;

typedef struct tp_model_dims {
    int64_t d;        /* hidden size */
    int64_t hq, hk;   /* query / KV heads on this rank */
    int64_t hd;       /* head dim */
    int64_t m;        /* MLP slice */
    int64_t vocab;    /* rows of this rank's vocab slice */
    int64_t vocab_pad;/* rows every rank's logits carry for the all-gather: ceil(V / tp) */
    int64_t n_layers; /* layers of this stage */
} tp_model_dims;

typedef struct tp_model {
    tp_model_config cfg;
    tp_shard_plan plan;
    tp_model_dims dims;
    tp_backend *backend; /* not owned */
    tp_dtype weight_dtype;
    tp_tensor embed;      /* [V_local, d] first stage */
    tp_tensor final_norm; /* [1, d] last stage */
    tp_tensor lm_head;    /* [V_local, d] last stage (may share embed's memory) */
    tp_layer_weights *layers;
    float *inv_freq;      /* [hd / 2] backend memory */
    float *inv_freq_local; /* [hd / 2] the layers cfg.local_rope marks (Gemma 3's sliding ones); NULL elsewhere */
    void **allocations;   /* every backend buffer, freed by tp_model_free */
    int n_allocations, cap_allocations;
    int64_t allocated_bytes; /* asked of the backend through them */
    int64_t weight_bytes;
    const char *alloc_what; /* what the allocations are for now, for out-of-memory messages */
    unsigned bench_skip;    /* TP_SKIP_* parts every step leaves out (TPINFER_BENCH_SKIP) */
} tp_model;

/* TPINFER_BENCH_SKIP: parts of the forward step left out of every step, so that bench/ can
 * time a step with and without each (the output is then wrong). */
enum {
    TP_SKIP_EMBEDDING = 1u << 0,
    TP_SKIP_NORM = 1u << 1,      /* every add_rmsnorm (the residual adds in them too) */
    TP_SKIP_QKV = 1u << 2,
    TP_SKIP_ATTENTION = 1u << 3, /* q/k norms, rope, the K/V store and the attention */
    TP_SKIP_O = 1u << 4,
    TP_SKIP_GATE_UP = 1u << 5,   /* with its SwiGLU */
    TP_SKIP_DOWN = 1u << 6,
    TP_SKIP_LM_HEAD = 1u << 7,
    TP_SKIP_ALLREDUCE = 1u << 8, /* the layers' tensor-parallel all-reduces */
};

/* The parts a comma-separated list names (NULL or "": none) into *mask; an unknown name is
 * TP_ERR_INVALID_ARG naming it and the parts there are. */
tp_status tp_bench_skip_parse(const char *list, unsigned *mask);

/* HF's RoPE inverse frequencies for head_dim / 2 pairs, scaling applied (default, linear,
 * llama3), as float32 (the dtype HF computes them in). */
void tp_rope_inv_freq(const tp_model_config *cfg, float *inv_freq);

/* Tensors of w that no rank of any grid reads for cfg (a num_hidden_layers below the file's
 * layers, a config of another model), not counting those Hugging Face ignores too (a tied
 * lm_head.weight, rotary_emb.inv_freq buffers): a warning naming how many and the first,
 * as transformers warns of unused weights. Returns their count. */
int tp_model_warn_unused(const tp_model_config *cfg, const tp_weights *w);

/* Load this rank's slices (plan) from w onto backend b, converting to weight_dtype. */
/* stop (or NULL): asked between tensors; nonzero ends the load (the model freed, an error
 * saying so), so that a signal during a long load is not held until it ends */
tp_status tp_model_load(tp_model *m, const tp_model_config *cfg, const tp_shard_plan *plan,
                        const tp_weights *w, tp_backend *b, tp_dtype weight_dtype, int (*stop)(void));
void tp_model_free(tp_model *m); /* accepts a zeroed model */

/* ----------------------------------------------------------------------------
 * One forward step */

typedef struct tp_kv_cache {
    tp_kv_layer *layers; /* [n_layers of this stage] */
    int32_t n_blocks, block_size;
} tp_kv_cache;

tp_status tp_kv_cache_create(tp_model *m, int32_t n_blocks, int32_t block_size, tp_dtype dtype,
                             tp_kv_cache *kv);
void tp_kv_cache_free(tp_model *m, tp_kv_cache *kv);

#define TP_GRAPH_BUCKETS 64

/* Scratch for steps of up to max_tokens tokens and max_logits logit rows. */
typedef struct tp_step_buffers {
    int32_t max_tokens, max_logits, max_seqs, max_blocks;
    int32_t *ids, *pos, *seq, *slot, *block_table, *logit_rows, *take; /* this step's, inside meta */
    int32_t *meta;        /* backend memory: a step's int32 arrays back to back, one upload */
    int32_t *meta_host;   /* host staging of meta */
    size_t meta_cap;      /* int32 elements of meta */
    int32_t *argmax_ids;  /* [2L] device-side greedy choices: L ids, then L f32 values */
    const int32_t *chosen; /* the last step's device-chosen tokens (what a step's take names): */
    int32_t chosen_rows, chosen_stride; /* rows, int32s between them (argmax_ids or sample_out) */
    int32_t *argmax_all;  /* [tp, 2L] every TP rank's argmax_ids */
    int32_t *argmax_merged; /* [L] over tp, where the backend has argmax_merge: the step's greedy ids */
    int32_t *pair_host;   /* host copy of argmax_all */
    tp_tensor x, delta;   /* [T, d] residual stream and the last layer output (f32) */
    tp_tensor xn;         /* [T, d] normalized */
    tp_tensor qkv;        /* [T, (hq + 2 hk) hd] */
    tp_tensor attn;       /* [T, hq hd] */
    tp_tensor gate_up;    /* [T, 2 m] */
    tp_tensor act;        /* [T, m] */
    tp_tensor rows;       /* [L, d] normalized rows that produce logits */
    tp_tensor logits;     /* [L, vocab_pad] this rank's logits (padded) */
    tp_tensor gathered;   /* [tp, L, vocab_pad] all TP ranks' logits */
    float *host;          /* host copy of gathered, re-laid out into logits_host */
    size_t host_cap;
    /* decode steps as graphs (forward.c): one per padded batch size and per what the logits
     * become (copied out, argmax, sample op); recorded on first use */
    int use_graphs;
    /* the last layer past its attention on the logit rows alone (forward.c; 1 at creation; the
     * engine sets what a replica's ranks agreed from TPINFER_PRUNE_LAST: it changes all-reduce
     * sizes) */
    int prune_last;
    void *graphs[3][TP_GRAPH_BUCKETS];
    int32_t *pad_host;    /* a padded step's host arrays */
    /* sampling on the device (forward.c, allocated at first use) */
    tp_sample_row *sample_rows; /* [max_logits] */
    tp_sample_row *sample_rows_host; /* [max_logits] a step's rules, padding rows included */
    int sample_ready;           /* an eager step has sampled: the backend's scratch exists */
    tp_sample_out *sample_out;  /* [max_logits] */
    int32_t *sample_tokens;     /* penalty and banned ids of a step */
    size_t sample_tokens_cap;
    float *sample_logits;       /* [max_logits, vocab] over tp: the gathered blocks re-laid out */
    int32_t unsampled_n, unsampled_rows; /* tp_model_forward_start_unsampled's step: its logit rows,
                                          * and the rows computed (a graph's padded batch) */
} tp_step_buffers;

tp_status tp_step_buffers_create(tp_model *m, int32_t max_tokens, int32_t max_logits,
                                 int32_t max_seqs, int32_t max_blocks, tp_step_buffers *s);
/* The backend bytes tp_step_buffers_create and the step's later buffers (the sample op's)
 * take for these sizes, so that the KV cache leaves room for them. */
int64_t tp_step_buffers_bytes(const tp_model *m, int32_t max_tokens, int32_t max_logits, int32_t max_seqs,
                              int32_t max_blocks);
void tp_step_buffers_free(tp_model *m, tp_step_buffers *s);

/* The host description of a step (from the scheduler). */
typedef struct tp_step {
    int32_t n_tokens;
    const int32_t *ids, *pos, *seq, *slot; /* [n_tokens] */
    int32_t n_seqs, max_blocks, max_pos;
    const int32_t *block_table;            /* [n_seqs * max_blocks] */
    int32_t n_logits;
    const int32_t *logit_rows;             /* [n_logits] token indices */
    const int32_t *take;                   /* [n_tokens] or NULL: where take[i] >= 0, token i's id is
                                            * row take[i] of the step before's device-chosen ids
                                            * (tp_model_forward_start), not ids[i] */
} tp_step;

/* A step's sampling on the device (the backend's sample op) for its first n_logits rows:
 * only the results come back. */
typedef struct tp_sample_request {
    const tp_sample_row *rows; /* [n_logits] host */
    const int32_t *tokens;     /* [n_tokens] host: the rows' penalty and banned ids */
    int32_t n_tokens;
    tp_sample_out *out;        /* [n_logits] host: filled */
} tp_sample_request;

/* Run this stage's layers on the step. The first stage embeds step->ids; a later stage
 * starts from in_x / in_delta ([n_tokens, d], the previous stage's buf->x and
 * buf->delta, which the caller received). A stage that is not the last leaves its output
 * in buf->x and buf->delta for the caller to send on. On the last stage: with ids_host,
 * the greedy choice of each of the n_logits rows is made on the device and only the ids
 * come back (needs tp_model_can_argmax); else with logits_host, the logits [n_logits,
 * vocab] (f32, the full vocabulary gathered over tp) come back; else with sample, each row is
 * sampled on the device by its rule (tp_model_can_sample) and only the results come back.
 * A decode-only step runs as a recorded graph when buf->use_graphs is set and the backend
 * has graphs (with sample, once an eager step has sampled: the backend's sample scratch is
 * made at its first call). */
tp_status tp_model_forward(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_step *step,
                           tp_comm *tp, const tp_tensor *in_x, const tp_tensor *in_delta,
                           float *logits_host, int32_t *ids_host, const tp_sample_request *sample);

/* A step whose tokens are chosen on the device (greedy, as tp_model_forward with ids_host;
 * with sample, by the sample op, as tp_model_forward with sample: needs tp_model_can_sample),
 * enqueued without waiting: its n_logits ids (or tp_sample_out results) start toward the
 * backend's host slot k (0 or 1), and tp_model_forward_wait(k) waits for them alone, into out,
 * while later steps run. So the next step can be enqueued before this one's tokens reach the
 * host: its tokens from this one are named by its take. Needs tp_model_can_overlap. */
tp_status tp_model_forward_start(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_step *step,
                                 tp_comm *tp, const tp_sample_request *sample, int k);
tp_status tp_model_forward_wait(tp_model *m, int k, void *out);

/* The same in two parts, for rows whose sampling rules need the tokens of the step before
 * (penalties, guided decoding, bad words): tp_model_forward_start_unsampled enqueues the
 * forward, its logits left on the device (gathered over tp); once the host has read the step
 * before and made the rules, tp_model_sample_start enqueues the sample op on them and starts
 * its results toward slot k, as tp_model_forward_start with sample does. So the host makes
 * the rules while the device computes the forward. */
tp_status tp_model_forward_start_unsampled(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, const tp_step *step,
                                           tp_comm *tp);
tp_status tp_model_sample_start(tp_model *m, tp_step_buffers *buf, const tp_sample_request *sample, int k);

/* The first and last layers on this rank (pp 1), and a backend with argmax, take_ids and
 * download_start / download_wait (and argmax_merge over tp). */
int tp_model_can_overlap(const tp_model *m);

/* What tp_model_warm_up runs before the first request's step, so that the run pays no
 * first-use costs (kernels loaded at their first launch, cuBLASLt's choice at each new
 * shape, a decode graph's recording): one eager step of prefill_tokens dummy tokens (at most
 * the buffers' tokens and sequences of max_len positions), then, with graphs, a decode step
 * at each graph batch size, recorded and replayed. Dummy tokens write nothing to the KV
 * cache and their outputs are dropped. The outputs are taken as the run's steps will take
 * them (the graphs differ by it): ids (greedy on the device); in a run sampled by the
 * device (sampled set on every rank: one eager sampled step comes first) sample_rows /
 * sample_out on the ranks that run the sample op (the sampler; where steps are enqueued
 * ahead, every rank of its TP group) (at least max(graph cap, sequences) entries, every rule
 * greedy); logits; or none of them. With tune (and a backend with matmul_tune), the eager
 * steps choose the matmuls' algorithms in place, with graphs after one eager step at each
 * graph batch size. At tp > 1 every rank of the group calls it alike. A pipeline
 * stage after the first takes the prefill step's input from in_x / in_delta (at least
 * tp_model_warm_up_tokens rows, received from the stage before); after that step (its output
 * in buf->x and buf->delta, as tp_model_forward leaves it) after_prefill lets the caller send
 * it on at once, so that the next stage waits for one step, not the whole warm-up (graphs
 * need pp 1). */
typedef struct tp_warm_up {
    int32_t prefill_tokens, max_len;
    /* the run's first step as the scheduler will take it (0: unknown): a prefill of other
     * product shapes than prefill_tokens' is run too, so that its products are looked up
     * (and tuned) here rather than in the step a first token waits for */
    int32_t first_tokens, first_seqs;
    int graphs, sampled;
    int unsampled; /* with graphs: 1 also each size with its logits left on the device, as
                    * tp_model_forward_start_unsampled's steps take them; 2 those alone (the
                    * run's decode steps all wait for their rules) */
    int tune; /* the backend's matmul_tune around the eager steps (then each graph size once eagerly) */
    int32_t *ids;
    float *logits;
    const tp_sample_row *sample_rows;
    tp_sample_out *sample_out;
    const tp_tensor *in_x, *in_delta;
    void (*beat)(void *arg); /* called after each step (a watchdog's heartbeat), or NULL */
    tp_status (*after_prefill)(void *arg, int32_t n); /* after the n-token prefill step, or NULL */
    void *beat_arg;           /* the argument of both */
} tp_warm_up;

/* The tokens of the warm-up's prefill-sized step. */
int32_t tp_model_warm_up_tokens(const tp_kv_cache *kv, const tp_step_buffers *buf, const tp_warm_up *w);
tp_status tp_model_warm_up(tp_model *m, tp_kv_cache *kv, tp_step_buffers *buf, tp_comm *tp, const tp_warm_up *w);

/* Sampling on the device is possible: the last stage and a backend with the sample op. */
int tp_model_can_sample(const tp_model *m);

/* Greedy choice on the device is possible: the last stage, a backend with argmax, and a
 * vocabulary slice on every TP rank (their winners are compared, not their logits). */
int tp_model_can_argmax(const tp_model *m);


#ifdef __cplusplus
}
#endif
#endif
