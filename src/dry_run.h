/*
 * dry_run.h: --dry-run: every rank makes its shard plan, checks each slice it would
 * read against the safetensors headers (name, shape, dtype) and reports bytes; rank 0
 * prints every rank's report in rank order, then the totals. No weight data is read.
 */
#ifndef TP_DRY_RUN_H
#define TP_DRY_RUN_H

#include <stdio.h>

#include "comm_mpi.h"
#include "device.h"
#include "model_config.h"
#include "options.h"
#include "shard_plan.h"
#include "weights.h"

typedef struct tp_rank_report {
    int64_t weight_bytes;     /* bytes of weights this rank reads (stored dtype) */
    int64_t n_tensors;        /* slices it reads */
    int64_t kv_bytes_per_token;
} tp_rank_report;

/* This rank's part: check the plan's slices against the open weights, count bytes and
 * write a human-readable block to text (size cap bytes). */
tp_status tp_dry_run_rank(const tp_options *o, const tp_grid *g, const tp_model_config *cfg,
                          const tp_weights *w, const tp_device_info *dev, tp_rank_report *rep,
                          char *text, size_t cap);

/* The whole --dry-run over the grid; rank 0 writes to out. On failure *n_failed says
 * how many ranks failed; a rank that did not fail itself returns an error status with
 * no message recorded. */
tp_status tp_dry_run(const tp_options *o, tp_mpi_world *world, const tp_device_info *dev,
                     FILE *out, int *n_failed);

#endif
