/*
 * comm_nccl.h: tp_comm over NCCL, for the CUDA backend's device buffers. Made from a
 * bootstrap comm over the same ranks (an MPI tp_comm), which carries NCCL's unique id
 * and serves the host barrier. src/ includes this only under #ifdef HAVE_NCCL.
 *
 * Small all-reduces (float32/bfloat16/float16, a multiple of 16 bytes, up to 4 MiB for two
 * ranks and 512 KiB for more, or
 * TPINFER_CUSTOM_AR_MAX bytes) go through a one-shot kernel over CUDA IPC instead of NCCL
 * (cuda/custom_ar.cu) when every rank of the group is on one host with peer access
 * between every pair of GPUs; TPINFER_CUSTOM_AR=0 (read at creation) keeps them on NCCL.
 * Callers see no difference: same results, bit for bit, as NCCL's for two ranks (the sum
 * is taken in rank order in float32, identical on every rank).
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

/* Rank r's channel to rank r + 1 (a pipeline's sends), connected now by one small send. */
tp_status tp_comm_nccl_connect_next(tp_comm *c);

/* For the fatal path: abort the communicator (ncclCommAbort), ending any operation that
 * is in flight or hung; later operations fail with TP_ERR_NCCL. tp_comm_destroy is still
 * needed to free c. Accepts NULL and a comm that is not NCCL's (ignored). */
void tp_comm_nccl_abort(tp_comm *c);

/* Why a communicator has (or has not) the custom one-shot all-reduce; the same on every
 * rank of its group. */
enum {
    TP_CUSTOM_AR_ON = 0,      /* all-reduces up to max bytes go through it */
    TP_CUSTOM_AR_OFF_ENV,     /* TPINFER_CUSTOM_AR=0 on some rank */
    TP_CUSTOM_AR_GROUP_SIZE,  /* the group has 1 rank or more than 8 */
    TP_CUSTOM_AR_HOSTS,       /* the ranks are on several hosts */
    TP_CUSTOM_AR_NO_P2P,      /* a pair of GPUs without peer access (or a peer GPU not visible) */
    TP_CUSTOM_AR_SETUP,       /* allocation, CUDA IPC or the start-up probe failed on some rank */
    TP_CUSTOM_AR_NONE         /* not an NCCL communicator, or none was made */
};

/* The custom all-reduce of c, or (c NULL) of the NCCL communicator this process made last
 * (tpinfer --check's benchmark keeps its own): a TP_CUSTOM_AR_ reason, and in *max_bytes
 * (may be NULL) the largest message it takes, 0 when every all-reduce goes to NCCL. */
int tp_comm_nccl_custom_ar(const tp_comm *c, size_t *max_bytes);

/* A reason in words ("TPINFER_CUSTOM_AR=0", "ranks on several hosts", ...). */
const char *tp_comm_nccl_custom_ar_why(int reason);

#ifdef __cplusplus
}
#endif
#endif
