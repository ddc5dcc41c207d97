/*
 * grid.c: rank <-> (dp, pp, tp) coordinates.
 */
#include "grid.h"

#include <string.h>

tp_status tp_grid_layout(int world, int rank, int tp, int pp, tp_grid *g)
{
    memset(g, 0, sizeof *g);
    if (world < 1 || rank < 0 || rank >= world)
        return tp_error(TP_ERR_INTERNAL, "rank %d of a world of %d", rank, world);
    if (tp < 1 || pp < 1)
        return tp_error(TP_ERR_INVALID_ARG, "--tp and --pp must be at least 1 (got %d, %d)", tp, pp);
    long long cell = (long long)tp * pp;
    if (world % cell != 0) {
        if (cell > world)
            return tp_error(TP_ERR_INVALID_ARG,
                            "--tp %d x --pp %d needs %lld ranks but %d were started; "
                            "start a multiple of %lld ranks (mpirun -np %lld)",
                            tp, pp, cell, world, cell, cell);
        return tp_error(TP_ERR_INVALID_ARG,
                        "%d ranks cannot be split into replicas of --tp %d x --pp %d = %lld; "
                        "start a multiple of %lld ranks (such as -np %lld)",
                        world, tp, pp, cell, cell, cell * (world / cell));
    }
    g->world = world;
    g->rank = rank;
    g->tp = tp;
    g->pp = pp;
    g->dp = (int)(world / cell);
    g->tp_rank = rank % tp;
    g->pp_rank = (rank / tp) % pp;
    g->dp_rank = rank / (int)cell;
    g->local_rank = 0;
    g->local_size = 1;
    return TP_OK;
}

int tp_grid_rank_of(const tp_grid *g, int dp_rank, int pp_rank, int tp_rank)
{
    return (dp_rank * g->pp + pp_rank) * g->tp + tp_rank;
}
