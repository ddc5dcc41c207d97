/*
 * shard_plan.h: which part of the model one rank of a (tp, pp) grid owns (Megatron
 * layout): its pipeline stage's contiguous layer range, its query and KV heads
 * (KV heads replicated when there are fewer than tp), its slice of the MLP inner
 * dimension and of the vocabulary. Pure arithmetic on the config: no files, no MPI.
 */
#ifndef TP_SHARD_PLAN_H
#define TP_SHARD_PLAN_H

#include <stdint.h>

#include "model_config.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_range {
    int64_t begin, end; /* [begin, end) */
} tp_range;

typedef struct tp_shard_plan {
    int tp, pp;           /* grid sizes */
    int tp_rank, pp_rank; /* this rank's place */
    tp_range layers;      /* layers of this stage */
    int has_embedding;    /* first stage */
    int has_lm_head;      /* last stage: final norm and LM head */
    tp_range q_heads;     /* query heads of this TP rank */
    tp_range kv_heads;    /* KV heads stored on this TP rank (whole heads) */
    int kv_replicas;      /* how many TP ranks hold each KV head (1 when n_kv_heads >= tp) */
    tp_range mlp;         /* slice of intermediate_size (gate/up rows, down columns) */
    tp_range vocab;       /* rows of embed_tokens / lm_head (vocab-parallel) */
} tp_shard_plan;

/* Check the config can be split over tp x pp at all; the message says which shape and
 * which flag to change. */
tp_status tp_shard_plan_validate(const tp_model_config *cfg, int tp, int pp);

tp_status tp_shard_plan_make(const tp_model_config *cfg, int tp, int pp, int tp_rank,
                             int pp_rank, tp_shard_plan *plan);

/* One weight tensor this rank reads: its HF name and the slice of it. part: which of a
 * layer's weights the slice fills, by Llama's name ("self_attn.k_proj.weight"), the name's
 * end except where a checkpoint fuses them (Phi-3's qkv_proj and gate_up_proj: three or two
 * slices of one tensor); empty outside the layers. */
typedef struct tp_weight_slice {
    char name[160];
    char part[48];
    int64_t row0, nrows; /* rows of the [rows, cols] view (see safetensors.h) */
    int64_t col0, ncols;
    int64_t full_rows, full_cols; /* the whole tensor's expected shape */
} tp_weight_slice;

/* The list of every weight slice this rank reads, in load order. *out is malloc'ed;
 * free() it. Row-parallel weights (o_proj, down_proj) are sliced by columns, the rest
 * by rows. Tied embeddings: the last stage reads embed_tokens rows as its LM head.
 * Row-parallel biases (o_proj.bias, down_proj.bias) are listed on tp rank 0 only: the
 * all-reduce sums the ranks' partial outputs, so the bias must be added by one rank. */
tp_status tp_shard_plan_weights(const tp_model_config *cfg, const tp_shard_plan *plan,
                                tp_weight_slice **out, int *n_out);

/* KV cache bytes per token on this rank for a given element size. */
int64_t tp_shard_plan_kv_bytes_per_token(const tp_model_config *cfg, const tp_shard_plan *plan,
                                         int64_t elem_size);

#ifdef __cplusplus
}
#endif
#endif
