/*
 * check_mode.h: tpinfer --check: what every rank runs on (host, GPU, PCI bus, CUDA and
 * NCCL versions), the peer-access matrix of each TP group's GPUs, and an all-reduce sweep
 * in every TP group at once (nccl-tests' all_reduce_perf figures: time, algbw, busbw,
 * #wrong). Needs no model. (Not check.h: under -I src that would shadow libcheck's.)
 */
#ifndef TP_CHECK_MODE_H
#define TP_CHECK_MODE_H

#include <stdint.h>
#include <stdio.h>

#include "comm_mpi.h"
#include "device.h"
#include "options.h"

/* Run the check over the grid; world rank 0 writes the report to out. *n_wrong is the
 * number of wrong elements all groups' all-reduces returned (0: everything checked out),
 * the same on every rank. On failure *n_failed says how many ranks failed (agreed
 * phases), and *must_abort is set when a rank failed inside a collective that its peers
 * may be waiting in (the job must be aborted, as tp_generate's). */
tp_status tp_check(const tp_options *o, tp_mpi_world *world, const tp_device_info *dev, FILE *out,
                   int *n_failed, int *must_abort, int64_t *n_wrong);

#endif
