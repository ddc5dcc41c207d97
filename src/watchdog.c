/*
 * watchdog.c: the loop's heartbeat, and the thread that ends the rank when it stops.
 */
#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

struct tp_watchdog {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* stop() wakes the thread at once */
    int stop;                 /* under lock */
    double timeout_s;
    int rank;
    atomic_llong last_beat_ns; /* CLOCK_MONOTONIC */
};

static long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *watch(void *arg)
{
    tp_watchdog *w = arg;
    /* look a few times per timeout, at least once a second: ends within ~timeout + 1 s */
    double period = w->timeout_s / 4 < 1.0 ? w->timeout_s / 4 : 1.0;
    if (period < 0.01) period = 0.01;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until); /* pthread_cond_timedwait's clock */
        long long ns = until.tv_nsec + (long long)(period * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        int rc = pthread_cond_timedwait(&w->wake, &w->lock, &until);
        if (w->stop) break;
        if (rc != 0 && rc != ETIMEDOUT) continue;
        const double idle = (double)(mono_ns() - atomic_load(&w->last_beat_ns)) / 1e9;
        if (idle < w->timeout_s) continue;
        tp_log(TP_LOG_ERROR,
               "rank %d: no step has finished for %.0f s (--step-timeout %g): a rank of the job is stopped, hung "
               "(a GPU, NCCL, the network) or died without ending the job; ending it. The finished requests are "
               "saved: --resume continues; if one step truly takes this long, raise --step-timeout",
               w->rank, idle, w->timeout_s);
        fflush(NULL);
        _exit(TP_WATCHDOG_EXIT); /* the main thread may be inside MPI: no MPI call from here */
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

tp_status tp_watchdog_start(double timeout_s, int rank, tp_watchdog **out)
{
    *out = NULL;
    if (!(timeout_s > 0)) return TP_OK;
    tp_watchdog *w = calloc(1, sizeof *w);
    if (!w) return tp_error(TP_ERR_OOM, "out of memory starting the step watchdog");
    w->timeout_s = timeout_s;
    w->rank = rank;
    atomic_init(&w->last_beat_ns, mono_ns());
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
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
    if (w) atomic_store(&w->last_beat_ns, mono_ns());
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
