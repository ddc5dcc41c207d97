/*
 * progress.c: progress lines (or a bar on a terminal), the status file and the final
 * summary, on rank 0.
 *
 * The status file mirrors OpenAI's batch object (object, status, request_counts, usage,
 * created_at / in_progress_at / completed_at / cancelled_at / failed_at) plus eta_seconds,
 * elapsed_seconds and throughput; it is replaced atomically (temp file + rename), so a
 * monitor that reads it always sees whole JSON. Latency percentiles use the nearest-rank
 * method over every request's value (tp_percentile).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "util.h"
#include "output.h"

typedef struct samples {
    double *v;
    size_t n, cap;
} samples;

struct tp_progress {
    int64_t total, completed, failed, prompt_tokens, completion_tokens, cached_tokens;
    double start, last_update, end; /* monotonic seconds; end: 0 until finish */
    time_t created_at, in_progress_at, ended_at;
    const char *final_status; /* NULL until finish */
    char *status_path;
    int status_warned; /* an update of the status file failed (said once; the run goes on) */
    int to_tty;
    size_t bar_len; /* length of the bar last drawn, to blank a longer old one */
    double interval;
    samples ttft, itl;
    int dropped_samples;
};

static void samples_push(samples *s, double v, int *dropped)
{
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 1024;
        double *nv = realloc(s->v, ncap * sizeof *nv);
        if (!nv) {
            *dropped = 1; /* statistics only: never fail the run for them */
            return;
        }
        s->v = nv;
        s->cap = ncap;
    }
    s->v[s->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tp_percentile(const double *sorted, size_t n, double pct)
{
    if (n == 0 || !(pct >= 0)) return NAN;
    if (pct > 100) pct = 100;
    /* rank = ceil(pct/100 * n); multiply first and allow for rounding (90% of 10 is 9) */
    double r = ceil(pct * (double)n / 100.0 - 1e-9);
    size_t rank = r < 1 ? 1 : (size_t)r;
    if (rank > n) rank = n;
    return sorted[rank - 1];
}

static double elapsed(const tp_progress *p)
{
    double e = (p->end > 0 ? p->end : tp_monotonic_s()) - p->start;
    return e > 0 ? e : 0;
}

/* Seconds left at the current rate; < 0 when unknown. */
static double eta_seconds(const tp_progress *p, double el)
{
    int64_t done = p->completed + p->failed;
    if (done >= p->total) return 0;
    if (done <= 0 || el <= 0) return -1;
    return (double)(p->total - done) * el / (double)done;
}

static void fmt_hms(double s, char *buf, size_t n)
{
    if (!(s >= 0) || s > 3.6e9) {
        snprintf(buf, n, "--:--:--");
        return;
    }
    long long t = (long long)(s + 0.5);
    snprintf(buf, n, "%02lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
}

int tp_progress_format(const tp_progress *p, char *buf, size_t size)
{
    double el = elapsed(p);
    char eta[32];
    fmt_hms(eta_seconds(p, el), eta, sizeof eta);
    double in_rate = el > 0 ? (double)p->prompt_tokens / el : 0;
    double out_rate = el > 0 ? (double)p->completion_tokens / el : 0;
    return snprintf(buf, size,
                    "progress: %" PRId64 "/%" PRId64 " done (%" PRId64 " failed), %.0f in tok/s, %.0f out tok/s, "
                    "ETA %s",
                    p->completed + p->failed, p->total, p->failed, in_rate, out_rate, eta);
}

static void draw_bar(tp_progress *p, int final)
{
    enum { WIDTH = 30 };
    double el = elapsed(p);
    int64_t done = p->completed + p->failed;
    double frac = p->total > 0 ? (double)done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    if (frac < 0) frac = 0;
    int filled = (int)(frac * WIDTH);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    char eta[32];
    fmt_hms(eta_seconds(p, el), eta, sizeof eta);
    char line[512];
    int n = snprintf(line, sizeof line,
                     "\r[%s] %3.0f%% %" PRId64 "/%" PRId64 " (%" PRId64 " failed), %.0f in tok/s, %.0f out tok/s, "
                     "ETA %s",
                     bar, 100 * frac, done, p->total, p->failed, el > 0 ? (double)p->prompt_tokens / el : 0,
                     el > 0 ? (double)p->completion_tokens / el : 0, eta);
    if (n < 0) return;
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    /* blank what is left of a longer earlier bar */
    while (len < p->bar_len && len + 1 < sizeof line) line[len++] = ' ';
    line[len] = '\0';
    p->bar_len = len;
    fputs(line, stderr);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

static json_t *time_or_null(time_t t) { return t ? json_integer((json_int_t)t) : json_null(); }

static tp_status write_status(const tp_progress *p, const char *status, int durable)
{
    if (!p->status_path) return TP_OK;
    double el = elapsed(p);
    const char *fs = p->final_status ? p->final_status : "";
    double eta = p->final_status ? (strcmp(fs, "completed") ? -1 : 0) : eta_seconds(p, el); /* -1: null */
    json_t *j = json_object();
    if (!j) return tp_error(TP_ERR_OOM, "out of memory writing %s", p->status_path);
    json_object_set_new(j, "object", json_string("batch"));
    json_object_set_new(j, "status", json_string(status));
    json_object_set_new(j, "request_counts",
                        json_pack("{s:I, s:I, s:I}", "total", (json_int_t)p->total, "completed",
                                  (json_int_t)p->completed, "failed", (json_int_t)p->failed));
    json_object_set_new(j, "usage",
                        json_pack("{s:I, s:{s:I}, s:I, s:I}", "input_tokens", (json_int_t)p->prompt_tokens,
                                  "input_tokens_details", "cached_tokens", (json_int_t)p->cached_tokens,
                                  "output_tokens", (json_int_t)p->completion_tokens, "total_tokens",
                                  (json_int_t)(p->prompt_tokens + p->completion_tokens)));
    json_object_set_new(j, "created_at", time_or_null(p->created_at));
    json_object_set_new(j, "in_progress_at", time_or_null(p->in_progress_at));
    json_object_set_new(j, "completed_at", time_or_null(!strcmp(fs, "completed") ? p->ended_at : 0));
    json_object_set_new(j, "cancelled_at", time_or_null(!strcmp(fs, "cancelled") ? p->ended_at : 0));
    json_object_set_new(j, "failed_at", time_or_null(!strcmp(fs, "failed") ? p->ended_at : 0));
    json_object_set_new(j, "eta_seconds", eta >= 0 ? json_integer((json_int_t)llround(eta)) : json_null());
    json_object_set_new(j, "elapsed_seconds", json_real(round(el * 1000) / 1000));
    json_object_set_new(j, "throughput",
                        json_pack("{s:f, s:f}", "input_tokens_per_s",
                                  el > 0 ? round((double)p->prompt_tokens / el * 10) / 10 : 0.0,
                                  "output_tokens_per_s",
                                  el > 0 ? round((double)p->completion_tokens / el * 10) / 10 : 0.0));
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(j);
    if (!text) return tp_error(TP_ERR_OOM, "out of memory writing %s", p->status_path);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return tp_error(TP_ERR_OOM, "out of memory writing %s", p->status_path);
    }
    t2[n] = '\n';
    t2[n + 1] = '\0';
    tp_status st = tp_write_file_atomic(p->status_path, t2, n + 1, durable);
    free(t2);
    return st;
}

/* A status file that cannot be written at the start: the same failure, said with the
 * option's name (the option is what to fix) */
static tp_status start_error(tp_status st, const char *status_path)
{
    return tp_error_prefix(st, "--status-file %s", status_path);
}

/* A tp_progress started now that writes status_path (may be NULL); NULL: out of memory */
static tp_progress *progress_new(const char *status_path)
{
    tp_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    if (status_path && !(p->status_path = strdup(status_path))) {
        free(p);
        return NULL;
    }
    p->start = p->last_update = tp_monotonic_s();
    p->created_at = time(NULL);
    return p;
}

tp_status tp_progress_create(int64_t total, const char *status_path, int to_tty, double interval_seconds,
                             tp_progress **out)
{
    *out = NULL;
    if (total < 0) return tp_error(TP_ERR_INVALID_ARG, "progress: a negative request total (%" PRId64 ")", total);
    tp_progress *p = progress_new(status_path);
    if (!p) return tp_error(TP_ERR_OOM, "out of memory");
    p->total = total;
    p->to_tty = to_tty;
    p->interval = interval_seconds >= 0 ? interval_seconds : 10.0; /* also NaN */
    p->in_progress_at = p->created_at;
    tp_status st = write_status(p, "in_progress", 0);
    if (st != TP_OK) { /* before any request ran */
        tp_progress_destroy(p);
        return start_error(st, status_path);
    }
    *out = p;
    return TP_OK;
}

tp_status tp_progress_write_early(const char *status_path, int failed)
{
    tp_progress *p = progress_new(status_path);
    if (!p) return tp_error(TP_ERR_OOM, "out of memory");
    if (failed) {
        p->final_status = "failed";
        p->ended_at = p->created_at;
        p->end = p->start;
    }
    const tp_status st = write_status(p, failed ? "failed" : "validating", failed);
    tp_progress_destroy(p);
    return st == TP_OK || failed ? st : start_error(st, status_path);
}

void tp_progress_request_done(tp_progress *p, int failed, int64_t prompt_tokens, int64_t completion_tokens,
                              double ttft, double itl)
{
    if (!p) return;
    if (failed) p->failed++;
    else p->completed++;
    if (prompt_tokens > 0) p->prompt_tokens += prompt_tokens;
    if (completion_tokens > 0) p->completion_tokens += completion_tokens;
    if (failed) return;
    if (ttft >= 0 && isfinite(ttft)) samples_push(&p->ttft, ttft, &p->dropped_samples);
    /* a mean inter-token latency needs two tokens */
    if (completion_tokens > 1 && itl >= 0 && isfinite(itl)) samples_push(&p->itl, itl, &p->dropped_samples);
}

void tp_progress_cached_tokens(tp_progress *p, int64_t cached_tokens)
{
    if (p && cached_tokens > 0) p->cached_tokens += cached_tokens;
}

tp_status tp_progress_update(tp_progress *p, int force)
{
    if (!p || p->final_status) return TP_OK;
    double now = tp_monotonic_s();
    if (!force && now - p->last_update < p->interval) return TP_OK;
    p->last_update = now;
    if (p->to_tty) {
        draw_bar(p, 0);
    } else {
        char line[512];
        tp_progress_format(p, line, sizeof line);
        tp_log(TP_LOG_INFO, "%s", line);
    }
    /* the file is a view of the run: a reader that went away or a full disk ends no run
     * that its first write (at create) let start */
    if (write_status(p, "in_progress", 0) != TP_OK) {
        if (!p->status_warned)
            tp_log(TP_LOG_WARN, "the status file is not being updated: %s; the run goes on", tp_error_message());
        p->status_warned = 1;
        tp_error_clear();
    }
    return TP_OK;
}

/* "p50/p90/p99" in milliseconds, or "n/a". */
static void fmt_pcts(samples *s, char *buf, size_t n)
{
    if (!s->n) {
        snprintf(buf, n, "n/a");
        return;
    }
    qsort(s->v, s->n, sizeof *s->v, cmp_double);
    snprintf(buf, n, "%.2f/%.2f/%.2f ms", 1e3 * tp_percentile(s->v, s->n, 50), 1e3 * tp_percentile(s->v, s->n, 90),
             1e3 * tp_percentile(s->v, s->n, 99));
}

tp_status tp_progress_finish(tp_progress *p, int interrupted)
{
    if (!p) return TP_OK;
    if (p->final_status) return TP_OK; /* once */
    p->end = tp_monotonic_s();
    p->ended_at = time(NULL);
    p->final_status = interrupted == TP_PROGRESS_FAILED ? "failed" : interrupted ? "cancelled" : "completed";
    if (p->to_tty) draw_bar(p, 1);

    double el = elapsed(p);
    char wall[32], ttft[96], itl[96];
    fmt_hms(el, wall, sizeof wall);
    fmt_pcts(&p->ttft, ttft, sizeof ttft);
    fmt_pcts(&p->itl, itl, sizeof itl);
    int64_t done = p->completed + p->failed;
    char notdone[64] = "";
    if (done < p->total) snprintf(notdone, sizeof notdone, ", %" PRId64 " not done", p->total - done);
    tp_log(TP_LOG_INFO,
           "summary (%s): %" PRId64 " requests: %" PRId64 " completed, %" PRId64
           " failed%s; wall time %s (%.1f s), %.2f req/s",
           p->final_status, p->total, p->completed, p->failed, notdone, wall, el, el > 0 ? (double)done / el : 0.0);
    tp_log(TP_LOG_INFO, "summary: tokens: %" PRId64 " prompt, %" PRId64 " completion; %.1f in tok/s, %.1f out tok/s",
           p->prompt_tokens, p->completion_tokens, el > 0 ? (double)p->prompt_tokens / el : 0.0,
           el > 0 ? (double)p->completion_tokens / el : 0.0);
    tp_log(TP_LOG_INFO,
           "summary: p50/p90/p99 (nearest rank): time to first token %s (%zu requests), "
           "inter-token latency %s (%zu requests)%s",
           ttft, p->ttft.n, itl, p->itl.n, p->dropped_samples ? "; some samples dropped (out of memory)" : "");
    return write_status(p, p->final_status, 1);
}

void tp_progress_destroy(tp_progress *p)
{
    if (!p) return;
    free(p->status_path);
    free(p->ttft.v);
    free(p->itl.v);
    free(p);
}
