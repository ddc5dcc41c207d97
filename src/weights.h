/*
 * weights.h: a Hugging Face model directory's weights: one model.safetensors, or the
 * shards that model.safetensors.index.json names. Shard names are checked to stay inside
 * the directory, and every tensor must be found exactly once. A multimodal checkpoint's
 * text model (Gemma3ForConditionalGeneration's) is found under the text-only names.
 */
#ifndef TP_WEIGHTS_H
#define TP_WEIGHTS_H

#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_weight_ref {
    const tp_st_file *file;
    const tp_st_tensor *tensor;
    const char *name; /* what tpinfer finds it by: tensor->name, less a multimodal checkpoint's
                       * text-model prefix ("language_model.model.X" is "model.X") */
    int other_part;   /* a multimodal checkpoint's vision tower or projector: never read */
} tp_weight_ref;

typedef struct tp_weights {
    char *dir;
    tp_st_file *shards;
    size_t n_shards;
    tp_weight_ref *refs; /* every tensor of every shard, sorted by name */
    size_t n_refs;
    int from_index;      /* 1 when model.safetensors.index.json was used */
    int multimodal;      /* 1 when the text model's tensors carry a multimodal checkpoint's prefix */
} tp_weights;

/* Precedence: the index when present (a warning if model.safetensors is there too),
 * else model.safetensors; neither is an error naming both. */
tp_status tp_weights_open(const char *model_dir, tp_weights *w);
void tp_weights_free(tp_weights *w);

/* Parse an index held in memory: fills names[i] with the shard file names (deduplicated,
 * in first-seen order) after the path checks. For tests; tp_weights_open uses it. */
tp_status tp_weights_parse_index(const char *json_text, size_t len, const char *dir,
                                 char ***shard_names, size_t *n_shards);

/* A fingerprint of the weights as stored, for comparing two copies without reading either
 * whole: each shard's size and tensor table (names, dtypes, shapes, offsets) and 16 blocks
 * of 4 KiB spread over its data (another checkpoint of the same shapes differs in each). */
tp_status tp_weights_fingerprint(const tp_weights *w, uint64_t *fingerprint);

/* By its text-only name (tp_weight_ref.name); NULL if absent. */
const tp_weight_ref *tp_weights_find(const tp_weights *w, const char *name);

/* Whether the named tensor is there with a dtype tpinfer loads (F32, F16, BF16) and the
 * whole shape config.json implies: full_rows x full_cols in the [rows, cols] view of
 * safetensors.h, full_cols 1 meaning a 1-D tensor of full_rows. An error naming the file,
 * the tensor and both shapes otherwise (a slice that merely fits inside a larger tensor
 * would load the wrong values). *dtype (may be NULL) gets the stored dtype. */
tp_status tp_weights_check(const tp_weights *w, const char *name, int64_t full_rows, int64_t full_cols,
                           tp_dtype *dtype);

/* tp_st_read_slice on the named tensor; a missing tensor is an error naming it. */
tp_status tp_weights_read_slice(const tp_weights *w, const char *name, tp_slice s,
                                tp_dtype dst_dt, void *dst);

#ifdef __cplusplus
}
#endif
#endif
