/*
 * comm_nccl.h: tp_comm over NCCL, for the CUDA backend's device buffers. Made from a
 * bootstrap comm over the same ranks (an MPI tp_comm), which carries NCCL's unique id
 * and serves the host barrier. src/ includes this only under #ifdef HAVE_NCCL.
 */
#ifndef TP_COMM_NCCL_H
#define TP_COMM_NCCL_H

#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over bootstrap's ranks: rank i of bootstrap is rank i of the NCCL comm, on
 * GPU device (made current). bootstrap is borrowed, not owned, and must outlive the
 * result. name ("tp", "pp") is for messages: the comm is named "nccl:<name>". Buffers
 * passed to its operations are device memory; stream is a cudaStream_t (NULL: the
 * default stream). Operations are enqueued on the stream and do not wait for it. */
tp_status tp_comm_nccl_create(tp_comm *bootstrap, int device, const char *name, tp_comm **out);

/* For the fatal path: abort the communicator (ncclCommAbort), ending any operation that
 * is in flight or hung; later operations fail with TP_ERR_NCCL. tp_comm_destroy is still
 * needed to free c. Accepts NULL and a comm that is not NCCL's (ignored). */
void tp_comm_nccl_abort(tp_comm *c);

#ifdef __cplusplus
}
#endif
#endif
