/*
 * engine.h: generation over the rank grid: read and tokenize the prompts, load this
 * rank's shard, then run the step loop (continuous batching; with pp > 1, pp micro-
 * batches in flight so that every stage works at once), and write the completions.
 */
#ifndef TP_ENGINE_H
#define TP_ENGINE_H

#include "comm_mpi.h"
#include "device.h"
#include "options.h"

/* On failure *n_failed says how many ranks failed (a rank that did not fail itself has no
 * message recorded), and *must_abort is set when ranks may be blocked in a collective:
 * then only MPI_Abort ends the job safely. *n_request_errors counts requests that got an
 * error record instead of a completion; *interrupted that a signal (SIGTERM, SIGINT,
 * SIGUSR1) stopped the run early, with every finished request saved. */
tp_status tp_generate(const tp_options *o, tp_mpi_world *w, const tp_device_info *dev,
                      int *n_failed, int *must_abort, int64_t *n_request_errors, int *interrupted);

#endif
