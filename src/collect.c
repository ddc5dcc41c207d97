/*
 * collect.c: the record transport. A record is one MPI message on a private duplicate
 * of the world communicator: a fixed header (index, flags, stats) and the line's bytes.
 */
#include "collect.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

enum { TAG_RECORD = 1, TAG_DONE = 2 };

typedef struct record_header {
    int64_t index;
    int64_t is_error;
    int64_t prompt_tokens, completion_tokens;
    double ttft, itl;
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
};

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
    int32_t mine = is_sender, total = 0;
    tp_status st = tp_comm_all_reduce_sum(w->world, &mine, &total, 1, TP_DTYPE_I32, NULL);
    if (st != TP_OK) {
        MPI_Comm_free(&c->comm);
        free(c);
        return st;
    }
    c->n_senders = total;
    *cp = c;
    return TP_OK;
}

static tp_status write_record(tp_collector *c, const record_header *h, const char *line, size_t len)
{
    TP_CHECK(tp_output_write(c->out, h->index, line, len, (int)h->is_error));
    if (c->progress)
        tp_progress_request_done(c->progress, (int)h->is_error, h->prompt_tokens, h->completion_tokens,
                                 h->ttft, h->itl);
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
        if (s.MPI_TAG == TAG_DONE) {
            c->done_senders++;
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
    record_header h = {index, is_error, st->prompt_tokens, st->completion_tokens, st->ttft, st->itl};
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
    return c->n_sends ? reclaim(c, 0) : TP_OK;
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
        if (c->done_senders < c->n_senders) TP_CHECK(drain(c, 1));
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
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&c->comm);
    free(c);
}
