/*
 * collect.c: the record transport. A record is one MPI message on a private duplicate
 * of the world communicator: a fixed header (index, flags, stats) and the line's bytes.
 * With a step timeout, senders also send an empty beat at least every BEAT_S (or a quarter
 * of the timeout) while they run, so that rank 0, waiting for the last results, sees a
 * replica that went silent: one whose every rank is stopped or hung has no peer to notice.
 */
#include "collect.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "util.h"

enum { TAG_RECORD = 1, TAG_DONE = 2, TAG_BEAT = 3 };
#define BEAT_S 1.0

typedef struct record_header {
    int64_t index;
    int64_t is_error;
    int64_t prompt_tokens, completion_tokens;
    double ttft, itl;
    int64_t cached_tokens;
} record_header;

typedef struct pending {
    MPI_Request req;
    char *buf;
} pending;

struct tp_collector {
    MPI_Comm comm;
    int rank, is_sender, n_senders, done_senders, any_interrupted;
    tp_output *out;
    tp_progress *progress;
    pending *sends;
    int n_sends, cap_sends;
    double timeout_s, last_beat; /* senders: when the last beat went */
    int world;                   /* rank 0: */
    int *sender, *done;          /* per rank: sends records; has said it is done */
    double *heard;               /* per rank: when rank 0 last received from it */
    int64_t received;            /* rank 0: messages received */
};

static tp_status isend(tp_collector *c, char *buf, size_t n, int tag);

#define MPI_OK(call, what)                                                   \
    do {                                                                     \
        if ((call) != MPI_SUCCESS) return tp_error(TP_ERR_MPI, "%s failed", what); \
    } while (0)

tp_status tp_collector_create(tp_mpi_world *w, int is_sender, tp_output *out, tp_progress *progress,
                              tp_collector **cp)
{
    *cp = NULL;
    tp_collector *c = calloc(1, sizeof *c);
    if (!c) return tp_error(TP_ERR_OOM, "out of memory");
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS) {
        free(c);
        return tp_error(TP_ERR_MPI, "MPI_Comm_dup failed");
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    c->rank = w->grid.rank;
    c->is_sender = is_sender;
    c->out = out;
    c->progress = progress;
    MPI_Comm_size(c->comm, &c->world);
    c->sender = calloc((size_t)c->world, sizeof *c->sender);
    c->done = calloc((size_t)c->world, sizeof *c->done);
    c->heard = calloc((size_t)c->world, sizeof *c->heard);
    int mine = is_sender, ok = c->sender && c->done && c->heard, all_ok = 0;
    /* collective on every rank whatever happened: then all agree */
    int rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c->comm);
    if (rc == MPI_SUCCESS && all_ok) rc = MPI_Allgather(&mine, 1, MPI_INT, c->sender, 1, MPI_INT, c->comm);
    if (rc != MPI_SUCCESS || !all_ok) {
        tp_collector_destroy(c);
        return rc != MPI_SUCCESS ? tp_error(TP_ERR_MPI, "MPI_Allgather of the senders failed")
                                 : tp_error(TP_ERR_OOM, "out of memory");
    }
    const double now = tp_monotonic_s();
    for (int r = 0; r < c->world; r++) {
        c->n_senders += c->sender[r];
        c->heard[r] = now;
    }
    c->last_beat = now;
    *cp = c;
    return TP_OK;
}

void tp_collector_set_timeout(tp_collector *c, double timeout_s)
{
    if (c) c->timeout_s = timeout_s > 0 ? timeout_s : 0;
}

tp_status tp_collector_beat(tp_collector *c)
{
    if (!c || c->rank == 0 || !c->is_sender || !(c->timeout_s > 0)) return TP_OK;
    const double now = tp_monotonic_s(), every = c->timeout_s / 4 < BEAT_S ? c->timeout_s / 4 : BEAT_S;
    if (now - c->last_beat < every) return TP_OK;
    c->last_beat = now;
    char *buf = malloc(1);
    if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
    return isend(c, buf, 0, TAG_BEAT);
}

static tp_status write_record(tp_collector *c, const record_header *h, const char *line, size_t len)
{
    TP_CHECK(tp_output_write(c->out, h->index, line, len, (int)h->is_error));
    if (c->progress) {
        tp_progress_request_done(c->progress, (int)h->is_error, h->prompt_tokens, h->completion_tokens,
                                 h->ttft, h->itl);
        tp_progress_cached_tokens(c->progress, h->cached_tokens);
    }
    return TP_OK;
}

/* Rank 0: receive every record that has arrived. */
static tp_status drain(tp_collector *c, int block)
{
    for (;;) {
        int flag = 0;
        MPI_Status s;
        if (block && c->done_senders < c->n_senders) {
            MPI_OK(MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, c->comm, &s), "MPI_Probe");
            flag = 1;
        } else {
            MPI_OK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c->comm, &flag, &s), "MPI_Iprobe");
        }
        if (!flag) return TP_OK;
        int n = 0;
        MPI_Get_count(&s, MPI_BYTE, &n);
        char *buf = malloc(n > 0 ? (size_t)n : 1);
        if (!buf) return tp_error(TP_ERR_OOM, "out of memory receiving a record of %d bytes", n);
        if (MPI_Recv(buf, n, MPI_BYTE, s.MPI_SOURCE, s.MPI_TAG, c->comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            free(buf);
            return tp_error(TP_ERR_MPI, "MPI_Recv of a record from rank %d failed", s.MPI_SOURCE);
        }
        tp_status st = TP_OK;
        c->received++;
        if (s.MPI_SOURCE >= 0 && s.MPI_SOURCE < c->world) c->heard[s.MPI_SOURCE] = tp_monotonic_s();
        if (s.MPI_TAG == TAG_DONE) {
            c->done_senders++;
            if (s.MPI_SOURCE >= 0 && s.MPI_SOURCE < c->world) c->done[s.MPI_SOURCE] = 1;
            if (n >= (int)sizeof(int32_t) && *(int32_t *)buf) c->any_interrupted = 1;
        } else if ((size_t)n >= sizeof(record_header)) {
            record_header h;
            memcpy(&h, buf, sizeof h);
            st = write_record(c, &h, buf + sizeof h, (size_t)n - sizeof h);
        }
        free(buf);
        TP_CHECK(st);
        if (block && c->done_senders == c->n_senders) return TP_OK;
    }
}

static tp_status reclaim(tp_collector *c, int wait)
{
    int k = 0;
    for (int i = 0; i < c->n_sends; i++) {
        int done = 0;
        if (wait) {
            MPI_OK(MPI_Wait(&c->sends[i].req, MPI_STATUS_IGNORE), "MPI_Wait");
            done = 1;
        } else {
            MPI_OK(MPI_Test(&c->sends[i].req, &done, MPI_STATUS_IGNORE), "MPI_Test");
        }
        if (done) free(c->sends[i].buf);
        else c->sends[k++] = c->sends[i];
    }
    c->n_sends = k;
    return TP_OK;
}

static tp_status isend(tp_collector *c, char *buf, size_t n, int tag)
{
    if (c->n_sends == c->cap_sends) {
        int cap = c->cap_sends ? 2 * c->cap_sends : 64;
        pending *p = realloc(c->sends, (size_t)cap * sizeof *p);
        if (!p) {
            free(buf);
            return tp_error(TP_ERR_OOM, "out of memory");
        }
        c->sends = p;
        c->cap_sends = cap;
    }
    if (n > (size_t)INT32_MAX) {
        free(buf);
        return tp_error(TP_ERR_INVALID_ARG, "an output line of %zu bytes is too long to send", n);
    }
    pending *p = &c->sends[c->n_sends];
    p->buf = buf;
    if (MPI_Isend(buf, (int)n, MPI_BYTE, 0, tag, c->comm, &p->req) != MPI_SUCCESS) {
        free(buf);
        return tp_error(TP_ERR_MPI, "MPI_Isend of a record failed");
    }
    c->n_sends++;
    return TP_OK;
}

tp_status tp_collector_send(tp_collector *c, int64_t index, int is_error, const char *line, size_t len,
                            const tp_record_stats *st)
{
    record_header h = {index, is_error, st->prompt_tokens, st->completion_tokens, st->ttft, st->itl,
                       st->cached_tokens};
    if (c->rank == 0) return write_record(c, &h, line, len);
    char *buf = malloc(sizeof h + len);
    if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, line, len);
    return isend(c, buf, sizeof h + len, TAG_RECORD);
}

tp_status tp_collector_poll(tp_collector *c)
{
    if (c->rank == 0) {
        TP_CHECK(drain(c, 0));
        TP_CHECK(tp_output_maybe_sync(c->out));
        if (c->progress) TP_CHECK(tp_progress_update(c->progress, 0));
        return TP_OK;
    }
    if (c->n_sends) TP_CHECK(reclaim(c, 0));
    return tp_collector_beat(c);
}

/* Rank 0, its own loop done: write what comes until every sender is done. With a timeout,
 * a sender silent for twice it (no beat, record or end: its steps may each take up to the
 * timeout) is taken for stopped or hung, and the job ends. */
static tp_status wait_for_senders(tp_collector *c)
{
    if (!(c->timeout_s > 0)) return drain(c, 1);
    double start = tp_monotonic_s(), last_pass = start;
    const double limit = 2 * c->timeout_s;
    long nap_ns = 100000; /* 0.1 ms, doubling to 10 ms while nothing comes */
    while (c->done_senders < c->n_senders) {
        const int64_t before = c->received;
        TP_CHECK(drain(c, 0));
        const int got = c->received != before;
        const double now = tp_monotonic_s();
        /* a pass long after the last: this rank was stopped (the whole job suspended, as the
         * watchdog allows for); the senders were too, so their silence counts from now */
        if (now - last_pass > 1.0) start = now;
        last_pass = now;
        for (int r = 0; r < c->world; r++) {
            if (!c->sender[r] || c->done[r] || r == 0) continue;
            const double since = c->heard[r] > start ? c->heard[r] : start, silent = now - since;
            if (silent > limit)
                return tp_error(TP_ERR_MPI,
                                "rank 0: rank %d, which sends its replica's results, has sent nothing for %.0f s "
                                "(twice --step-timeout %g) while rank 0 waits for the last of them: its replica is "
                                "stopped, hung or died without ending the job; ending it. The finished requests are "
                                "saved: --resume continues",
                                r, now - c->heard[r], c->timeout_s);
        }
        nap_ns = got ? 100000 : nap_ns * 2 > 10000000 ? 10000000 : nap_ns * 2;
        nanosleep(&(struct timespec){0, nap_ns}, NULL);
    }
    return TP_OK;
}

tp_status tp_collector_finish(tp_collector *c, int interrupted, int *any_interrupted)
{
    if (c->is_sender) {
        if (c->rank == 0) {
            c->done_senders++;
            c->any_interrupted |= interrupted;
        } else {
            int32_t *flag = malloc(sizeof *flag);
            if (!flag) return tp_error(TP_ERR_OOM, "out of memory");
            *flag = interrupted;
            TP_CHECK(isend(c, (char *)flag, sizeof *flag, TAG_DONE));
        }
    }
    if (c->rank == 0) {
        if (c->done_senders < c->n_senders) TP_CHECK(wait_for_senders(c));
        TP_CHECK(drain(c, 0));
        if (any_interrupted) *any_interrupted = c->any_interrupted;
        return TP_OK;
    }
    return reclaim(c, 1);
}

void tp_collector_destroy(tp_collector *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_sends; i++) {
        MPI_Cancel(&c->sends[i].req);
        free(c->sends[i].buf);
    }
    free(c->sends);
    free(c->sender);
    free(c->done);
    free(c->heard);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&c->comm);
    free(c);
}
