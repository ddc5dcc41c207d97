/*
 * grid.h: the data x pipeline x tensor rank grid. Ranks of one TP group are
 * consecutive (rank = (dp * pp_size + pp) * tp_size + tp), so under mpirun's usual
 * by-slot mapping a TP group shares a node and its fast links.
 */
#ifndef TP_GRID_H
#define TP_GRID_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_grid {
    int world, rank;
    int tp, pp, dp;                /* sizes */
    int tp_rank, pp_rank, dp_rank; /* this rank's coordinates */
    int local_rank, local_size;    /* among the ranks of this node (GPU = local_rank) */
} tp_grid;

/* Lay out world ranks as dp x pp x tp; a world that tp * pp does not divide is an error
 * that says which -np would work. local_rank/local_size are left 0/1. */
tp_status tp_grid_layout(int world, int rank, int tp, int pp, tp_grid *g);

/* The world rank at coordinates (dp, pp, tp). */
int tp_grid_rank_of(const tp_grid *g, int dp_rank, int pp_rank, int tp_rank);

#ifdef __cplusplus
}
#endif
#endif
