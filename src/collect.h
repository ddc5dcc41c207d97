/*
 * collect.h: finished requests travel from the sampler rank of each replica (the rank
 * that builds their output lines) to world rank 0, the only writer. Senders never wait
 * for rank 0 (MPI_Isend, completed lazily); rank 0 polls between steps and writes what
 * arrived through tp_output, so finished work reaches the disk while the batch runs.
 */
#ifndef TP_COLLECT_H
#define TP_COLLECT_H

#include "comm_mpi.h"
#include "output.h"

typedef struct tp_record_stats {
    int64_t prompt_tokens, completion_tokens;
    double ttft, itl; /* seconds; < 0 when none (error records) */
    int64_t cached_tokens; /* prompt tokens read from the prefix cache */
} tp_record_stats;

typedef struct tp_collector tp_collector;

/* Every rank calls it (collectively). n_senders: the ranks that will send (one sampler
 * rank per replica). out and progress are rank 0's (NULL elsewhere). */
tp_status tp_collector_create(tp_mpi_world *w, int is_sender, tp_output *out, tp_progress *progress,
                              tp_collector **c);

/* --step-timeout (0: none), once every rank knows it: senders then beat while they run
 * (tp_collector_beat, tp_collector_poll) and rank 0 ends its wait for a sender that is
 * silent for twice it. */
void tp_collector_set_timeout(tp_collector *c, double timeout_s);

/* Senders: an empty message to rank 0 if none went for a while (a quarter of the timeout,
 * at most 1 s); cheap, for a phase without polls (the warm-up's steps). */
tp_status tp_collector_beat(tp_collector *c);

/* A finished request's line (without newline); index orders it for --ordered. */
tp_status tp_collector_send(tp_collector *c, int64_t index, int is_error, const char *line, size_t len,
                            const tp_record_stats *st);

/* Rank 0: write what has arrived, sync on cadence, update progress. Senders: reclaim
 * finished sends, and beat. Cheap; call between steps. */
tp_status tp_collector_poll(tp_collector *c);

/* The end of this rank's loop: a sender says it is done (and whether it was interrupted);
 * rank 0 then writes until every sender is done (or one is silent too long: an error). *any_interrupted (rank 0) tells whether
 * some replica stopped early. */
tp_status tp_collector_finish(tp_collector *c, int interrupted, int *any_interrupted);

void tp_collector_destroy(tp_collector *c);

#endif
