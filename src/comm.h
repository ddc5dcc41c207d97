/*
 * comm.h: the collectives the model forward needs, as a table of operations over one
 * group of ranks (NCCL's shape: device buffers, a stream, no host sync required).
 * comm_mpi.c implements it with MPI (the CPU backend and CI); cuda/ adds NCCL.
 */
#ifndef TP_COMM_H
#define TP_COMM_H

#include <stddef.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_comm tp_comm;

struct tp_comm_ops {
    /* recv[i] = sum over ranks of send[i], i < count; send == recv is allowed (in place). */
    tp_status (*all_reduce_sum)(tp_comm *c, const void *send, void *recv, size_t count,
                                tp_dtype dt, void *stream);
    /* recv = the ranks' send buffers of count elements each, concatenated in rank order. */
    tp_status (*all_gather)(tp_comm *c, const void *send, void *recv, size_t count, tp_dtype dt,
                            void *stream);
    /* Point to point, to/from rank peer of this group. */
    tp_status (*send)(tp_comm *c, const void *buf, size_t count, tp_dtype dt, int peer,
                      void *stream);
    tp_status (*recv)(tp_comm *c, void *buf, size_t count, tp_dtype dt, int peer, void *stream);
    /* buf of root is copied to every rank's buf. */
    tp_status (*broadcast)(tp_comm *c, void *buf, size_t count, tp_dtype dt, int root,
                           void *stream);
    /* Host-side barrier: returns when every rank of the group has called it. */
    tp_status (*barrier)(tp_comm *c);
    void (*destroy)(tp_comm *c);
};

struct tp_comm {
    const struct tp_comm_ops *ops;
    void *ctx;
    int rank, size;
    const char *name; /* "mpi:tp", "nccl:tp", ... for messages */
};

/* NCCL communicator over the ranks of bootstrap (an MPI tp_comm of the same group, which
 * shares the unique id), on GPU device; buffers must be device memory (cuda/comm_nccl.c,
 * only in a build with NCCL). tp_comm_nccl_abort ends it without waiting for peers. */
tp_status tp_comm_nccl_create(tp_comm *bootstrap, int device, const char *name, tp_comm **out);
void tp_comm_nccl_abort(tp_comm *c);
/* Connects each rank's NCCL channel to the next rank (a pipeline's sends) now, at start-up,
 * not in the first step. */
tp_status tp_comm_nccl_connect_next(tp_comm *c);

static inline tp_status tp_comm_all_reduce_sum(tp_comm *c, const void *send, void *recv,
                                               size_t count, tp_dtype dt, void *stream)
{
    return c->ops->all_reduce_sum(c, send, recv, count, dt, stream);
}
static inline tp_status tp_comm_all_gather(tp_comm *c, const void *send, void *recv, size_t count,
                                           tp_dtype dt, void *stream)
{
    return c->ops->all_gather(c, send, recv, count, dt, stream);
}
static inline tp_status tp_comm_send(tp_comm *c, const void *buf, size_t count, tp_dtype dt,
                                     int peer, void *stream)
{
    return c->ops->send(c, buf, count, dt, peer, stream);
}
static inline tp_status tp_comm_recv(tp_comm *c, void *buf, size_t count, tp_dtype dt, int peer,
                                     void *stream)
{
    return c->ops->recv(c, buf, count, dt, peer, stream);
}
static inline tp_status tp_comm_broadcast(tp_comm *c, void *buf, size_t count, tp_dtype dt,
                                          int root, void *stream)
{
    return c->ops->broadcast(c, buf, count, dt, root, stream);
}
static inline tp_status tp_comm_barrier(tp_comm *c) { return c->ops->barrier(c); }
static inline void tp_comm_destroy(tp_comm *c)
{
    if (c) c->ops->destroy(c);
}

#ifdef __cplusplus
}
#endif
#endif
