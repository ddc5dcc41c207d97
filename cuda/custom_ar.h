/*
 * custom_ar.h: the one-shot all-reduce over CUDA IPC (cuda/custom_ar.cu) that the NCCL
 * communicator (cuda/comm_nccl.c) uses for small messages: one kernel per call that copies
 * this rank's input into a buffer every peer can read, meets the peers at a flag barrier
 * and sums the ranks' buffers in rank order. Made at communicator creation when every
 * rank of the group is on one host and every pair of GPUs has peer access; anything that
 * goes wrong there leaves the group on NCCL (a warning, never a failed run).
 */
#ifndef TP_CUSTOM_AR_H
#define TP_CUSTOM_AR_H

#include <stddef.h>

#include "comm.h"
#include "comm_nccl.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* reasons: TP_CUSTOM_AR_* of comm_nccl.h */

typedef struct tp_car tp_car;

/* Collective over bootstrap's ranks (an MPI tp_comm), GPU device current. *out is NULL
 * and *reason says why when the group stays on NCCL; that is not an error. Only a failed
 * bootstrap collective (MPI) is returned as one. name is for messages ("nccl:tp"). */
tp_status tp_car_create(tp_comm *bootstrap, int device, const char *name, tp_car **out, int *reason);

/* Whether an all-reduce of count elements of dt goes through car: the same answer on
 * every rank for the same call (it depends on count, dt and the group only, never on the
 * buffers' addresses). NULL car: no. */
int tp_car_takes(const tp_car *car, size_t count, tp_dtype dt);

/* Enqueue recv = sum over ranks of send on stream (a cudaStream_t; send == recv is
 * allowed). Only for a call tp_car_takes; a launch error is returned (the caller marks
 * the communicator failed, since peers may wait at the barrier). */
tp_status tp_car_all_reduce(tp_car *car, const void *send, void *recv, size_t count, tp_dtype dt,
                            void *stream);

/* The largest message in bytes car takes. */
size_t tp_car_max_bytes(const tp_car *car);

/* For the fatal path: kernels waiting at the barrier give up (their results are garbage;
 * the communicator is failed anyway). Accepts NULL. */
void tp_car_abort(tp_car *car);

/* Close the peers' mappings, free the buffers. Accepts NULL. Call after this rank's
 * streams are done with car. */
void tp_car_destroy(tp_car *car);

#ifdef __cplusplus
}
#endif
#endif
