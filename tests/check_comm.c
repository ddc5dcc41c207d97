/*
 * check_comm.c: the MPI tp_comm on a 2 x 2 grid (run under mpirun -np 4): all-reduce,
 * all-gather, send/recv and broadcast on every dtype and every group communicator,
 * against values each rank can compute alone.
 */
#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_mpi.h"

static tp_mpi_world W;

static float value_of(int rank, size_t i) { return (float)(rank + 1) * 0.25f + (float)(i % 7); }

static void put(void *buf, tp_dtype dt, size_t i, float v)
{
    switch (dt) {
    case TP_DTYPE_F32: ((float *)buf)[i] = v; break;
    case TP_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)(v * 4); break;
    case TP_DTYPE_BF16: ((uint16_t *)buf)[i] = tp_f32_to_bf16(v); break;
    case TP_DTYPE_F16: ((uint16_t *)buf)[i] = tp_f32_to_f16(v); break;
    default: break;
    }
}

static float get(const void *buf, tp_dtype dt, size_t i)
{
    switch (dt) {
    case TP_DTYPE_F32: return ((const float *)buf)[i];
    case TP_DTYPE_I32: return (float)((const int32_t *)buf)[i] / 4;
    case TP_DTYPE_BF16: return tp_bf16_to_f32(((const uint16_t *)buf)[i]);
    case TP_DTYPE_F16: return tp_f16_to_f32(((const uint16_t *)buf)[i]);
    default: return 0;
    }
}

static void check_comm(tp_comm *c, tp_dtype dt)
{
    enum { N = 1000 };
    size_t es = tp_dtype_size(dt);
    char *a = malloc(N * es), *b = malloc(N * es * (size_t)c->size);
    /* all-reduce, out of place and in place; values are small so 16-bit sums are exact */
    for (size_t i = 0; i < N; i++) put(a, dt, i, value_of(c->rank, i));
    ck_assert_int_eq(tp_comm_all_reduce_sum(c, a, b, N, dt, NULL), TP_OK);
    ck_assert_int_eq(tp_comm_all_reduce_sum(c, a, a, N, dt, NULL), TP_OK);
    for (size_t i = 0; i < N; i++) {
        float want = 0;
        for (int r = 0; r < c->size; r++) want += value_of(r, i);
        ck_assert_float_eq_tol(get(b, dt, i), want, 1e-6);
        ck_assert_float_eq_tol(get(a, dt, i), want, 1e-6);
    }
    /* all-gather */
    for (size_t i = 0; i < N; i++) put(a, dt, i, value_of(c->rank, i));
    ck_assert_int_eq(tp_comm_all_gather(c, a, b, N, dt, NULL), TP_OK);
    for (int r = 0; r < c->size; r++)
        for (size_t i = 0; i < N; i++)
            ck_assert_float_eq_tol(get(b, dt, (size_t)r * N + i), value_of(r, i), 1e-6);
    /* broadcast from the last rank */
    int root = c->size - 1;
    for (size_t i = 0; i < N; i++) put(a, dt, i, value_of(c->rank, i));
    ck_assert_int_eq(tp_comm_broadcast(c, a, N, dt, root, NULL), TP_OK);
    for (size_t i = 0; i < N; i++) ck_assert_float_eq_tol(get(a, dt, i), value_of(root, i), 1e-6);
    /* a ring of send/recv, as pipeline stages pass activations (even ranks send first) */
    if (c->size > 1) {
        int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
        for (size_t i = 0; i < N; i++) put(a, dt, i, value_of(c->rank, i));
        if (c->rank % 2 == 0) {
            ck_assert_int_eq(tp_comm_send(c, a, N, dt, next, NULL), TP_OK);
            ck_assert_int_eq(tp_comm_recv(c, b, N, dt, prev, NULL), TP_OK);
        } else {
            ck_assert_int_eq(tp_comm_recv(c, b, N, dt, prev, NULL), TP_OK);
            ck_assert_int_eq(tp_comm_send(c, a, N, dt, next, NULL), TP_OK);
        }
        for (size_t i = 0; i < N; i++) ck_assert_float_eq_tol(get(b, dt, i), value_of(prev, i), 1e-6);
    }
    ck_assert_int_eq(tp_comm_barrier(c), TP_OK);
    free(a);
    free(b);
}

START_TEST(groups_have_the_right_members)
{
    const tp_grid *g = &W.grid;
    ck_assert_int_eq(g->world, 4);
    ck_assert_int_eq(W.tp->size, 2);
    ck_assert_int_eq(W.pp->size, 2);
    ck_assert_int_eq(W.dp->size, 1);
    ck_assert_int_eq(W.tp->rank, g->tp_rank);
    ck_assert_int_eq(W.pp->rank, g->pp_rank);
    /* the world ranks of my TP group, gathered through it, are consecutive */
    int32_t me = g->rank, ranks[2];
    ck_assert_int_eq(tp_comm_all_gather(W.tp, &me, ranks, 1, TP_DTYPE_I32, NULL), TP_OK);
    ck_assert_int_eq(ranks[1], ranks[0] + 1);
    ck_assert_int_eq(ranks[0] % 2, 0);
    ck_assert_int_eq(tp_comm_all_gather(W.pp, &me, ranks, 1, TP_DTYPE_I32, NULL), TP_OK);
    ck_assert_int_eq(ranks[1], ranks[0] + 2);
}
END_TEST

START_TEST(every_dtype_every_group)
{
    tp_comm *comms[] = {W.world, W.tp, W.pp, W.dp};
    tp_dtype dts[] = {TP_DTYPE_F32, TP_DTYPE_F16, TP_DTYPE_BF16, TP_DTYPE_I32};
    for (size_t c = 0; c < 4; c++)
        for (size_t d = 0; d < 4; d++) check_comm(comms[c], dts[d]);
}
END_TEST

START_TEST(agreement_counts_failures)
{
    int n_failed = -1, n_usage = -1;
    tp_status mine = W.grid.rank == 3 ? TP_ERR_INVALID_ARG : W.grid.rank == 1 ? TP_ERR_IO : TP_OK;
    ck_assert_int_eq(tp_mpi_agree(W.world, mine, &n_failed, &n_usage), TP_OK);
    ck_assert_int_eq(n_failed, 2);
    ck_assert_int_eq(n_usage, 1);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 4) {
        fprintf(stderr, "check_comm must run on 4 ranks (mpirun -np 4)\n");
        MPI_Finalize();
        return 1;
    }
    if (tp_mpi_world_create(2, 2, &W) != TP_OK) {
        fprintf(stderr, "tp_mpi_world_create: %s\n", tp_error_message());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    Suite *s = suite_create("comm_mpi");
    TCase *tc = tcase_create("collectives");
    tcase_add_test(tc, groups_have_the_right_members);
    tcase_add_test(tc, every_dtype_every_group);
    tcase_add_test(tc, agreement_counts_failures);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* an MPI process cannot fork its rank */
    srunner_run_all(sr, W.grid.rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    tp_mpi_world_free(&W);
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
