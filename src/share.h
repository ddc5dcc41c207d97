/*
 * share.h: the input split over the grid. Every rank reads the prompt file (requests.h)
 * and keeps its replica's share; the ranks of a replica split its tokenizing, request k of
 * the share by the replica's rank k mod size (tp_share_encodes), and exchange the ids
 * (tp_share_exchange); at dp > 1 rank 0 gathers every replica's ids (tp_share_gather_ids),
 * so no rank parses the whole input.
 */
#ifndef TP_SHARE_H
#define TP_SHARE_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "requests.h"

/* Whether this rank of replica (the replica's communicator) encodes the share's k-th request. */
int tp_share_encodes(const tp_comm *replica, size_t k);

/* Every rank of the replica, collectively, for the share's requests [b0, b1) of l: each
 * sends what it encoded (prompt ids, or the error: in->encoded set) and takes the others'.
 * heads: [3 * replica size] words. stop_here: this rank had a stop signal. *mine: this
 * rank's status so far; an unpacking failure lands there (and the next exchange tells
 * the others). *stop, *failed: some rank of the replica was stopped or has failed: all then
 * leave together. An error returned (the communicator, or no memory once the others are in
 * the exchange) leaves peers in a collective: the job must be aborted. */
tp_status tp_share_exchange(tp_request_list *l, tp_comm *replica, int32_t *heads, size_t b0, size_t b1,
                            int stop_here, tp_status *mine, int *stop, int *failed);

/* The first ranks of the replicas (dp, their communicator, ordered by replica), collectively:
 * rank 0 gathers every replica's ids into l's table (tp_requests_id; l holds replica 0's
 * share, the others' request k is the input's q + k * dp) with the fields they do not read
 * and their dialect, then checks the ids (what: the file, for messages). Every other rank
 * sends its share's. */
tp_status tp_share_gather_ids(tp_request_list *l, tp_comm *dp, const char *what);

#endif
