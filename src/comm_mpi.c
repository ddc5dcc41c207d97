/*
 * comm_mpi.c: tp_comm over MPI, the communicator of the CPU backend and of start-up.
 * 16-bit floats are summed in f32 through user-defined MPI ops, as NCCL does.
 */
#include "comm_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

#define TP_MPI_CHECK(call)                                                        \
    do {                                                                          \
        int tp_mpi_rc_ = (call);                                                  \
        if (tp_mpi_rc_ != MPI_SUCCESS) {                                          \
            char tp_mpi_msg_[MPI_MAX_ERROR_STRING];                               \
            int tp_mpi_len_ = 0;                                                  \
            MPI_Error_string(tp_mpi_rc_, tp_mpi_msg_, &tp_mpi_len_);              \
            return tp_error(TP_ERR_MPI, "%s failed: %s", #call, tp_mpi_msg_);     \
        }                                                                         \
    } while (0)

typedef struct mpi_ctx {
    MPI_Comm comm;
    char name[32];
} mpi_ctx;

static MPI_Datatype half_type = MPI_DATATYPE_NULL; /* 2 bytes, for f16 and bf16 */
static MPI_Op sum_bf16 = MPI_OP_NULL, sum_f16 = MPI_OP_NULL;

static void sum_bf16_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = tp_f32_to_bf16(tp_bf16_to_f32(a[i]) + tp_bf16_to_f32(b[i]));
}

static void sum_f16_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = tp_f32_to_f16(tp_f16_to_f32(a[i]) + tp_f16_to_f32(b[i]));
}

static tp_status ensure_half_ops(void)
{
    if (half_type != MPI_DATATYPE_NULL) return TP_OK;
    TP_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &half_type));
    TP_MPI_CHECK(MPI_Type_commit(&half_type));
    TP_MPI_CHECK(MPI_Op_create(sum_bf16_fn, 1, &sum_bf16));
    TP_MPI_CHECK(MPI_Op_create(sum_f16_fn, 1, &sum_f16));
    return TP_OK;
}

static MPI_Datatype mpi_type(tp_dtype dt)
{
    switch (dt) {
    case TP_DTYPE_F32: return MPI_FLOAT;
    case TP_DTYPE_I32: return MPI_INT32_T;
    case TP_DTYPE_F16:
    case TP_DTYPE_BF16: return half_type;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_sum(tp_dtype dt)
{
    return dt == TP_DTYPE_BF16 ? sum_bf16 : dt == TP_DTYPE_F16 ? sum_f16 : MPI_SUM;
}

/* MPI counts are int: large buffers are an error rather than a silent wrap. */
static tp_status count_ok(size_t count, const char *op)
{
    if (count > (size_t)INT32_MAX)
        return tp_error(TP_ERR_INVALID_ARG, "%s of %zu elements exceeds MPI's int count", op, count);
    return TP_OK;
}

static MPI_Comm comm_of(tp_comm *c) { return ((mpi_ctx *)c->ctx)->comm; }

static tp_status mpi_all_reduce_sum(tp_comm *c, const void *send, void *recv, size_t count,
                                    tp_dtype dt, void *stream)
{
    TP_CHECK(count_ok(count, "all-reduce"));
    const void *src = send == recv ? MPI_IN_PLACE : send;
    TP_MPI_CHECK(MPI_Allreduce(src, recv, (int)count, mpi_type(dt), mpi_sum(dt), comm_of(c)));
    return TP_OK;
}

static tp_status mpi_all_gather(tp_comm *c, const void *send, void *recv, size_t count,
                                tp_dtype dt, void *stream)
{
    TP_CHECK(count_ok(count, "all-gather"));
    TP_MPI_CHECK(MPI_Allgather(send, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt),
                               comm_of(c)));
    return TP_OK;
}

static tp_status mpi_send(tp_comm *c, const void *buf, size_t count, tp_dtype dt, int peer,
                          void *stream)
{
    TP_CHECK(count_ok(count, "send"));
    TP_MPI_CHECK(MPI_Send(buf, (int)count, mpi_type(dt), peer, 0, comm_of(c)));
    return TP_OK;
}

static tp_status mpi_recv(tp_comm *c, void *buf, size_t count, tp_dtype dt, int peer,
                          void *stream)
{
    TP_CHECK(count_ok(count, "recv"));
    TP_MPI_CHECK(MPI_Recv(buf, (int)count, mpi_type(dt), peer, 0, comm_of(c), MPI_STATUS_IGNORE));
    return TP_OK;
}

static tp_status mpi_broadcast(tp_comm *c, void *buf, size_t count, tp_dtype dt, int root,
                               void *stream)
{
    TP_CHECK(count_ok(count, "broadcast"));
    TP_MPI_CHECK(MPI_Bcast(buf, (int)count, mpi_type(dt), root, comm_of(c)));
    return TP_OK;
}

static tp_status mpi_barrier(tp_comm *c)
{
    TP_MPI_CHECK(MPI_Barrier(comm_of(c)));
    return TP_OK;
}

static void mpi_destroy(tp_comm *c)
{
    mpi_ctx *ctx = c->ctx;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&ctx->comm);
    free(ctx);
    free(c);
}

static const struct tp_comm_ops mpi_ops = {
    /* .all_reduce_sum = */ mpi_all_reduce_sum,
    /* .all_gather     = */ mpi_all_gather,
    /* .send           = */ mpi_send,
    /* .recv           = */ mpi_recv,
    /* .broadcast      = */ mpi_broadcast,
    /* .barrier        = */ mpi_barrier,
    /* .destroy        = */ mpi_destroy,
};

tp_status tp_comm_mpi_create(MPI_Comm comm, const char *name, tp_comm **out)
{
    *out = NULL;
    TP_CHECK(ensure_half_ops());
    tp_comm *c = calloc(1, sizeof *c);
    mpi_ctx *ctx = calloc(1, sizeof *ctx);
    if (!c || !ctx) {
        free(c);
        free(ctx);
        return tp_error(TP_ERR_OOM, "out of memory creating communicator %s", name);
    }
    int rc = MPI_Comm_dup(comm, &ctx->comm);
    if (rc != MPI_SUCCESS) {
        free(c);
        free(ctx);
        return tp_error(TP_ERR_MPI, "MPI_Comm_dup for %s failed (%d)", name, rc);
    }
    snprintf(ctx->name, sizeof ctx->name, "mpi:%s", name);
    MPI_Comm_rank(ctx->comm, &c->rank);
    MPI_Comm_size(ctx->comm, &c->size);
    c->ops = &mpi_ops;
    c->ctx = ctx;
    c->name = ctx->name;
    *out = c;
    return TP_OK;
}

static tp_status split_comm(int color, int key, const char *name, tp_comm **out)
{
    MPI_Comm sub;
    TP_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &sub));
    tp_status st = tp_comm_mpi_create(sub, name, out);
    MPI_Comm_free(&sub);
    return st;
}

tp_status tp_mpi_world_create(int tp, int pp, tp_mpi_world *w)
{
    memset(w, 0, sizeof *w);
    int rank, size;
    TP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    TP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    TP_CHECK(tp_grid_layout(size, rank, tp, pp, &w->grid));
    tp_grid *g = &w->grid;

    MPI_Comm node;
    TP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &g->local_rank);
    MPI_Comm_size(node, &g->local_size);
    MPI_Comm_free(&node);

    tp_status st;
    TP_CHECK_GOTO(tp_comm_mpi_create(MPI_COMM_WORLD, "world", &w->world), st, fail);
    TP_CHECK_GOTO(split_comm(g->dp_rank * g->pp + g->pp_rank, g->tp_rank, "tp", &w->tp), st, fail);
    TP_CHECK_GOTO(split_comm(g->dp_rank * g->tp + g->tp_rank, g->pp_rank, "pp", &w->pp), st, fail);
    TP_CHECK_GOTO(split_comm(g->pp_rank * g->tp + g->tp_rank, g->dp_rank, "dp", &w->dp), st, fail);
    TP_CHECK_GOTO(split_comm(g->dp_rank, g->pp_rank * g->tp + g->tp_rank, "replica", &w->replica), st,
                  fail);
    return TP_OK;
fail:
    tp_mpi_world_free(w);
    return st;
}

void tp_mpi_world_free(tp_mpi_world *w)
{
    tp_comm_destroy(w->replica);
    tp_comm_destroy(w->dp);
    tp_comm_destroy(w->pp);
    tp_comm_destroy(w->tp);
    tp_comm_destroy(w->world);
    memset(w, 0, sizeof *w);
}

tp_status tp_mpi_agree(tp_comm *world, tp_status mine, int *n_failed, int *n_usage)
{
    int32_t v[2] = {mine != TP_OK, mine == TP_ERR_INVALID_ARG};
    TP_CHECK(tp_comm_all_reduce_sum(world, v, v, 2, TP_DTYPE_I32, NULL));
    *n_failed = v[0];
    *n_usage = v[1];
    return TP_OK;
}
