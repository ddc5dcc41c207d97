/*
 * watchdog.h: ends a rank whose generation loop (or a startup phase that waits for every
 * peer of a group) stopped making progress, so that a job
 * with a stopped or hung peer (a process stopped by a signal, a hung GPU or NCCL call, a
 * network partition) does not wait in a collective until the allocation's time limit.
 * A thread checks the loop's heartbeat; after timeout seconds without one it says so and
 * exits the process, and mpirun / srun end the other ranks as for a rank that died. The
 * finished requests are on disk already (each written as it finishes): --resume goes on.
 * The same thread guards the startup's phases over the group's collectives: making the
 * NCCL communicators (NCCL's creation has no deadline of its own) and the warm-up, whose
 * steps beat as the loop's do.
 * A process stopped as a whole (Ctrl-Z, a scheduler's suspend) stops its watchdog too, which
 * sees the gap when it runs again and starts counting afresh: no hang.
 */
#ifndef TP_WATCHDOG_H
#define TP_WATCHDOG_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_watchdog tp_watchdog;

/* The exit status of a rank the watchdog ends (main.c's fatal failure). */
#define TP_WATCHDOG_EXIT 1

/* Starts the thread (timeout_s > 0) with a heartbeat now; timeout_s == 0: *out = NULL, no
 * thread. rank names the rank in the message; phase is NULL for the generation loop (its
 * steps beat), else what the rank is doing, as the message says it ("making the NCCL
 * communicators"; a string that outlives the watchdog). */
tp_status tp_watchdog_start(double timeout_s, int rank, const char *phase, tp_watchdog **out);

/* The loop, or the phase, made progress (NULL: nothing). */
void tp_watchdog_beat(tp_watchdog *w);

/* Stops and joins the thread, frees w (NULL: nothing). */
void tp_watchdog_stop(tp_watchdog *w);

#ifdef __cplusplus
}
#endif
#endif
