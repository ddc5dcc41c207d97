/*
 * comm_mpi.h: the MPI side of start-up: the rank grid's communicators (world, TP, PP,
 * DP, node-local) made with MPI_Comm_split, each wrapped as a tp_comm.
 */
#ifndef TP_COMM_MPI_H
#define TP_COMM_MPI_H

#include <mpi.h>

#include "comm.h"
#include "grid.h"

typedef struct tp_mpi_world {
    tp_grid grid;
    tp_comm *world; /* every rank */
    tp_comm *tp;    /* the ranks of this rank's TP group, ordered by tp_rank */
    tp_comm *pp;    /* the stages of this rank's pipeline, ordered by pp_rank */
    tp_comm *dp;    /* the replicas of this rank's (pp, tp) place, ordered by dp_rank */
    tp_comm *replica; /* every rank of this rank's replica, ordered as pp_rank * tp + tp_rank */
} tp_mpi_world;

/* Wrap a duplicate of comm (the caller keeps its own). */
tp_status tp_comm_mpi_create(MPI_Comm comm, const char *name, tp_comm **out);

/* After MPI_Init: lay out the grid (tp_grid_layout's errors), find the node-local rank
 * with MPI_COMM_TYPE_SHARED and split the group communicators. */
tp_status tp_mpi_world_create(int tp, int pp, tp_mpi_world *w);
void tp_mpi_world_free(tp_mpi_world *w);

/* A phase boundary every rank reaches: how many ranks failed (mine is this rank's
 * status) and how many of those failures were usage errors (TP_ERR_INVALID_ARG). */
tp_status tp_mpi_agree(tp_comm *world, tp_status mine, int *n_failed, int *n_usage);

#endif
