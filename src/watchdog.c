/*
 * watchdog.c: the loop's heartbeat, and the thread that ends the rank when it stops.
 */
#include "watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

struct tp_watchdog {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* stop() wakes the thread at once; waits on CLOCK_MONOTONIC */
    int stop;                 /* under lock */
    double timeout_s;
    int rank;
    const char *phase;        /* NULL: the generation loop */
    _Atomic double last_beat; /* tp_monotonic_s() */
};

static void *watch(void *arg)
{
    tp_watchdog *w = arg;
    /* look a few times per timeout, at least once a second: ends within ~timeout + 1 s */
    double period = w->timeout_s / 4 < 1.0 ? w->timeout_s / 4 : 1.0;
    if (period < 0.01) period = 0.01;
    double looked = tp_monotonic_s();
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        const double until_s = tp_monotonic_s() + period;
        struct timespec until = {(time_t)until_s, (long)((until_s - (double)(time_t)until_s) * 1e9)};
        pthread_cond_timedwait(&w->wake, &w->lock, &until);
        if (w->stop) break;
        const double now = tp_monotonic_s();
        /* this thread did not run for a while: the whole process was stopped (Ctrl-Z, a
         * scheduler's suspend) and the loop with it, which is no hang: start the count again */
        if (now - looked > 2 * period + 1.0) atomic_store(&w->last_beat, now);
        looked = now;
        const double idle = now - atomic_load(&w->last_beat);
        if (idle < w->timeout_s) continue;
        /* no fflush or MPI here: the main thread may hold stdio's or MPI's locks */
        if (w->phase)
            tp_log(TP_LOG_ERROR,
                   "rank %d: %s has made no progress for %.0f s (--step-timeout %g): a rank of its group is "
                   "stopped, hung or cannot reach the others%s; ending the job. No request had run: once the "
                   "cause is fixed, the same command with --resume goes on (records of requests that cannot run "
                   "are written already); if this phase truly takes that long, raise --step-timeout",
                   w->rank, w->phase, idle, w->timeout_s,
                   strstr(w->phase, "NCCL") ? " (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, a firewall; NCCL_DEBUG=INFO shows "
                                              "where each rank waits)" : "");
        else
            tp_log(TP_LOG_ERROR,
                   "rank %d: no step has finished for %.0f s (--step-timeout %g): a rank of the job is stopped, hung "
                   "(a GPU, NCCL, the network) or died without ending the job; ending it. The finished requests are "
                   "saved: --resume continues; if one step truly takes this long, raise --step-timeout",
                   w->rank, idle, w->timeout_s);
        _exit(TP_WATCHDOG_EXIT);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

tp_status tp_watchdog_start(double timeout_s, int rank, const char *phase, tp_watchdog **out)
{
    *out = NULL;
    if (!(timeout_s > 0)) return TP_OK;
    tp_watchdog *w = calloc(1, sizeof *w);
    if (!w) return tp_error(TP_ERR_OOM, "out of memory starting the step watchdog");
    w->timeout_s = timeout_s;
    w->rank = rank;
    w->phase = phase;
    atomic_init(&w->last_beat, tp_monotonic_s());
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->wake, &attr);
    pthread_condattr_destroy(&attr);
    const int rc = pthread_create(&w->thread, NULL, watch, w);
    if (rc != 0) {
        pthread_cond_destroy(&w->wake);
        pthread_mutex_destroy(&w->lock);
        free(w);
        return tp_error(TP_ERR_INTERNAL, "cannot start the step watchdog's thread: error %d", rc);
    }
    *out = w;
    return TP_OK;
}

void tp_watchdog_beat(tp_watchdog *w)
{
    if (w) atomic_store(&w->last_beat, tp_monotonic_s());
}

void tp_watchdog_stop(tp_watchdog *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
    free(w);
}
