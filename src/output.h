/*
 * output.h: the results file that must never lose finished work. Lines are written
 * whole with one write(2) each, flushed, and fdatasync'ed at least every few seconds and
 * at close; a manifest beside the output (OUTPUT.manifest.json: model files and hashes,
 * sampling defaults, tpinfer version, input identity) is replaced atomically (temp file,
 * fsync, rename, fsync of the directory). --resume reads the existing output, truncates a
 * torn last line, and reports the ids already done so they are skipped.
 */
#ifndef TP_OUTPUT_H
#define TP_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What identifies a run: a resume must match it (unless forced). Strings are copied. */
typedef struct tp_manifest {
    const char *tpinfer_version;
    const char *model_dir;
    const char *input_path;
    const char *settings_json; /* sampling defaults and other flags that change results, as a JSON object text */
} tp_manifest;

typedef struct tp_output_config {
    const char *path;        /* NULL: standard output (no resume, no manifest, still one write per line) */
    const char *errors_path; /* NULL: error records go to path, inline */
    int resume;              /* continue a previous run of the same manifest */
    int force;               /* with resume: accept a manifest that differs (warns) */
    int overwrite;           /* replace an existing output that is not being resumed */
    int ordered;             /* write in input order (buffering results that come early) */
    double sync_seconds;     /* fdatasync at least this often (default 2) */
} tp_output_config;

typedef struct tp_output tp_output;

/* Whether a file the run will replace as a whole (what names the option: "--status-file")
 * can be written at path (followed through its links): not the input, the output (NULL:
 * standard output), its manifest or the errors file (may be NULL); not a directory; a new
 * file's directory exists and, as for an existing regular file, is writable (the file is
 * made beside its name, then renamed). */
tp_status tp_output_check_target(const char *what, const char *path, const char *input, const char *output,
                                 const char *errors);

/* Open (or, with resume, reopen) the output. Refuses: an existing output without resume
 * or overwrite; output == input (same file, by device and inode); a resume whose manifest
 * differs without force (the message names the first field that differs). With resume,
 * a missing output just starts fresh. */
tp_status tp_output_open(const tp_output_config *cfg, const tp_manifest *m, tp_output **out);

/* With resume: was this id completed (or given an error record) by the earlier run? */
int tp_output_is_done(const tp_output *o, const char *id);
int64_t tp_output_done_count(const tp_output *o);
/* Of those, the error records: the exit status of a resumed batch counts them, as the run
 * that wrote them did. */
int64_t tp_output_done_errors(const tp_output *o);

/* One finished request: line is one JSON object without the newline. index is its
 * position among the requests still to do (0, 1, 2, ... in input order), used by ordered
 * mode to hold lines back until every earlier one is written; is_error sends it to the
 * errors file when there is one. */
tp_status tp_output_write(tp_output *o, int64_t index, const char *line, size_t len, int is_error);

/* fdatasync now if sync_seconds have passed since the last one (cheap to call often). */
tp_status tp_output_maybe_sync(tp_output *o);

/* Flush, fdatasync, write the final manifest, close; frees o (accepts NULL). With
 * complete == 0 (interrupted) the manifest records that the run is unfinished. */
tp_status tp_output_close(tp_output *o, int complete);

/* ---------------------------------------------------------------------------
 * Progress and the status file (OpenAI batch object shape), rank 0 only. */

typedef struct tp_progress tp_progress;

/* status_path may be NULL; to_tty: draw a bar (stderr is a terminal) instead of a line
 * every interval_seconds. */
tp_status tp_progress_create(int64_t total, const char *status_path, int to_tty,
                             double interval_seconds, tp_progress **out);
/* The status file before there is a tp_progress: failed == 0, its first version,
 * "validating" (OpenAI's state before "in_progress"), written before the output is opened,
 * so that a status file that cannot be written fails the run before anything else is
 * touched; failed == 1, "failed", for a run that ends before its requests were counted. */
tp_status tp_progress_write_early(const char *status_path, int failed);
/* A request finished (failed: got an error record), with its token counts and, for a
 * completion, its time to first token and mean inter-token latency in seconds. */
void tp_progress_request_done(tp_progress *p, int failed, int64_t prompt_tokens,
                              int64_t completion_tokens, double ttft, double itl);
/* Prompt tokens of a finished request that were read from the prefix cache. */
void tp_progress_cached_tokens(tp_progress *p, int64_t cached_tokens);
/* Print / rewrite the status file if the interval has passed (or force). */
tp_status tp_progress_update(tp_progress *p, int force);
/* The end: the final status file ("completed", or "cancelled" when interrupted) and a
 * summary on stderr: requests, tokens, wall time, throughput, TTFT and ITL p50/p90/p99.
 * interrupted takes TP_PROGRESS_COMPLETED (0), TP_PROGRESS_CANCELLED (1, or any other
 * nonzero value) or TP_PROGRESS_FAILED (the status file says "failed"). */
#define TP_PROGRESS_COMPLETED 0
#define TP_PROGRESS_CANCELLED 1
#define TP_PROGRESS_FAILED 2
tp_status tp_progress_finish(tp_progress *p, int interrupted);
void tp_progress_destroy(tp_progress *p);

/* The progress line as tp_progress_update logs it, without the log prefix:
 * "progress: 1200/50000 done (3 failed), 812 in tok/s, 1630 out tok/s, ETA 00:41:10".
 * Returns what snprintf returns. */
int tp_progress_format(const tp_progress *p, char *buf, size_t size);

/* The nearest-rank percentile of n ascending values: the value at rank ceil(pct/100 * n)
 * (1-based, at least 1); NAN when n == 0. pct in [0, 100]. */
double tp_percentile(const double *sorted, size_t n, double pct);

/* Replace path with text atomically: a temp file beside it, rename over path; with
 * durable, fsync the temp file before and the directory after the rename. A symbolic link's
 * target is replaced (the link stays; a dangling one gets its target made); a descriptor of
 * this process (/dev/stdout, /dev/stderr, /dev/fd/N: the job's log, say) is written through;
 * a path that is no regular file (/dev/null, a FIFO, a terminal) is written in place; a
 * directory is an error. */
tp_status tp_write_file_atomic(const char *path, const char *text, size_t len, int durable);

/* A stable 64-bit FNV-1a hash of a file's bytes as 16 hex digits (for the manifest). */
tp_status tp_hash_file(const char *path, char hex[17]);

#ifdef __cplusplus
}
#endif
#endif
