/*
 * output.c: the crash-safe results file (rank 0 is its only writer).
 *
 * - Every line is built in memory and written with one write(2) of line + '\n' to a file
 *   opened O_APPEND; short writes and EINTR are retried. If a write fails part way, the
 *   file is cut back to the end of the last whole line, so a full disk never leaves a
 *   torn line behind.
 * - fdatasync at least every sync_seconds and at close. A thread of its own does the timed
 *   ones, so the generation loop never waits for the disk (the first fdatasync of a new file
 *   on a busy file system can take seconds, longer than a short --step-timeout); with
 *   sync_seconds 0 every line is synced before the write returns. Every write, fdatasync and
 *   close is checked, and a failure is fatal and sticky (the syncer's is read at the next
 *   write, maybe_sync or close); the message names the file and the likely cause ("disk full?").
 * - Ordered mode holds early lines in a min-heap keyed by index and writes them as soon
 *   as every earlier index has been written. Lines still held back when an interrupted
 *   run closes are dropped (they are redone by --resume), so ordered output stays a
 *   prefix of the input order across resumes.
 * - OUTPUT.manifest.json (identity of the run: version, model files, hashes, input,
 *   settings, status) is replaced by temp file + fsync + rename + fsync of the directory.
 * - --resume reads the old output (and errors file), cuts a torn or invalid tail back to
 *   the last good line, and keeps every line's id ("custom_id", else "id") in a hash set.
 * - An exclusive flock() on the output stops two runs from appending to one file
 *   (ignored where the file system has no locks).
 */
#include "output.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "output_manifest.h"
#include "util.h"

#define HASH_CHUNK (1u << 20)
#define SCAN_CHUNK (1u << 20)
#define MANIFEST_MAX ((size_t)64 << 20)

/* ---------------------------------------------------------------------------
 * A file's FNV-1a 64 */

tp_status tp_hash_file(const char *path, char hex[17])
{
    hex[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: refused, not waited on */
    if (fd < 0) return tp_error(TP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tp_error(TP_ERR_IO, "%s is not a regular file (a directory, pipe or device); give a file", path);
    }
    unsigned char *buf = malloc(HASH_CHUNK);
    if (!buf) {
        close(fd);
        return tp_error(TP_ERR_OOM, "out of memory hashing %s", path);
    }
    uint64_t h = TP_FNV_OFFSET;
    for (;;) {
        ssize_t r = read(fd, buf, HASH_CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return tp_error(TP_ERR_IO, "cannot read %s: %s", path, strerror(e));
        }
        if (r == 0) break;
        h = tp_fnv1a(h, buf, (size_t)r);
    }
    free(buf);
    close(fd);
    snprintf(hex, 17, "%016" PRIx64, h);
    return TP_OK;
}

/* ---------------------------------------------------------------------------
 * Small helpers */

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What an errno most likely means for a results file. */
static const char *io_hint(int e)
{
    switch (e) {
    case ENOSPC: return " (disk full?)";
    case EDQUOT: return " (disk quota exceeded?)";
    case EIO: return " (failing disk or lost network file system?)";
    case EFBIG: return " (file size limit reached: ulimit -f?)";
    case EROFS: return " (read-only file system)";
    case EPIPE: return " (the reader of the pipe went away)";
    case ENXIO: return " (a FIFO no process has open for reading)";
    default: return "";
    }
}

/* The directory part of path ("." for a bare name), malloc'ed. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

static const char *base_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static char *str_cat(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

static tp_status write_all_fd(int fd, const char *buf, size_t len, size_t *done_out)
{
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, buf + done, len - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (w == 0) {
            errno = ENOSPC; /* write(2) never returns 0 for len > 0 on files; do not spin */
            break;
        }
        done += (size_t)w;
    }
    if (done_out) *done_out = done;
    return done == len ? TP_OK : TP_ERR_IO;
}

static tp_status fsync_dir(const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return tp_error(TP_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    int rc = fsync(dfd);
    int e = errno;
    close(dfd);
    if (rc != 0 && e != EINVAL && e != EROFS && e != ENOTSUP)
        return tp_error(TP_ERR_IO, "cannot fsync directory %s: %s%s", dir, strerror(e), io_hint(e));
    return TP_OK;
}

/* text to fd, which path names (for the message) */
static tp_status write_to(int fd, const char *path, const char *text, size_t len)
{
    if (write_all_fd(fd, text, len, NULL) == TP_OK) return TP_OK;
    int e = errno;
    return tp_error(TP_ERR_IO, "cannot write %s: %s%s", path, strerror(e), io_hint(e));
}

/* A path that is no regular file (/dev/null, a FIFO, a terminal): written in place, since
 * a rename over it would replace the device node with a file. */
static tp_status write_in_place(const char *path, const char *text, size_t len)
{
    /* O_NONBLOCK: a FIFO without a reader is ENXIO, not a hang */
    int fd = open(path, O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return tp_error(TP_ERR_IO, "cannot open %s: %s%s", path, strerror(e), io_hint(e));
    }
    const tp_status st = write_to(fd, path, text, len);
    close(fd);
    return st;
}

/* The descriptor of this process that p names (/dev/stdout, /dev/stderr, /dev/fd/N,
 * /proc/self/fd/N), else -1. */
static int own_descriptor(const char *p)
{
    int fd = -1, end = 0;
    if (!strcmp(p, "/dev/stdout")) return 1;
    if (!strcmp(p, "/dev/stderr")) return 2;
    if ((sscanf(p, "/dev/fd/%d%n", &fd, &end) == 1 || sscanf(p, "/proc/self/fd/%d%n", &fd, &end) == 1) &&
        p[end] == '\0' && fd >= 0)
        return fd;
    return -1;
}

/* The file a chain of symbolic links ends at, existing or not (malloc'ed; NULL: out of
 * memory or more than 16 links, errno set): a dangling link is followed too. *fd: the
 * descriptor of this process a link of the chain names (own_descriptor), else -1. */
static char *link_target(const char *path, int *fd)
{
    *fd = own_descriptor(path);
    char *p = strdup(path);
    for (int hops = 0; p && hops < 16; hops++) {
        struct stat sb;
        if (*fd < 0) *fd = own_descriptor(p);
        if (lstat(p, &sb) != 0 || !S_ISLNK(sb.st_mode)) return p;
        char buf[PATH_MAX];
        ssize_t n = readlink(p, buf, sizeof buf - 1);
        if (n < 0) return p;
        buf[n] = '\0';
        char *next = NULL;
        if (buf[0] == '/') {
            next = strdup(buf);
        } else {
            char *dir = dir_of(p);
            next = dir ? tp_path_join(dir, buf) : NULL;
            free(dir);
        }
        free(p);
        p = next;
    }
    const int e = p ? ELOOP : ENOMEM;
    free(p);
    errno = e;
    return NULL;
}

tp_status tp_write_file_atomic(const char *path, const char *text, size_t len, int durable)
{
    /* one of this process's descriptors (--status-file /dev/stderr, the job's log): written
     * through it, so that the text goes where the descriptor's next write would */
    int own = -1;
    char *target = link_target(path, &own);
    if (!target) return tp_error(TP_ERR_IO, "cannot follow the links of %s: %s", path, strerror(errno));
    if (own >= 0) {
        free(target);
        return write_to(own, path, text, len);
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        free(target);
        if (S_ISDIR(sb.st_mode)) return tp_error(TP_ERR_IO, "cannot write %s: it is a directory", path);
        return write_in_place(path, text, len);
    }
    /* a symbolic link stays a link: the file it ends at is what gets replaced */
    path = target;
    char suffix[48];
    snprintf(suffix, sizeof suffix, ".tmp.%ld", (long)getpid());
    char *dir = dir_of(path);
    char *tmp = str_cat(path, suffix);
    if (!dir || !tmp) {
        free(dir);
        free(tmp);
        tp_status oom = tp_error(TP_ERR_OOM, "out of memory writing %s", path);
        free(target);
        return oom;
    }
    tp_status st = TP_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        /* the file is written beside its final name, then renamed: say what of the directory */
        const char *why = e == ENOENT ? " (its directory does not exist)"
                          : e == EACCES ? " (it is made beside the file, then renamed: the directory must be writable)"
                                        : io_hint(e);
        st = tp_error(TP_ERR_IO, "cannot create %s: %s%s", tmp, strerror(e), why);
        goto out;
    }
    if (write_all_fd(fd, text, len, NULL) != TP_OK) {
        int e = errno;
        st = tp_error(TP_ERR_IO, "cannot write %s: %s%s", tmp, strerror(e), io_hint(e));
    } else if (durable && fsync(fd) != 0) {
        int e = errno;
        st = tp_error(TP_ERR_IO, "cannot fsync %s: %s%s", tmp, strerror(e), io_hint(e));
    }
    if (close(fd) != 0 && st == TP_OK) {
        int e = errno;
        st = tp_error(TP_ERR_IO, "cannot close %s: %s%s", tmp, strerror(e), io_hint(e));
    }
    if (st == TP_OK && rename(tmp, path) != 0) {
        int e = errno;
        st = tp_error(TP_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    if (st != TP_OK) {
        unlink(tmp);
        goto out;
    }
    if (durable) st = fsync_dir(dir);
out:
    free(dir);
    free(tmp);
    free(target);
    return st;
}

/* ---------------------------------------------------------------------------
 * The set of ids done by an earlier run: open addressing, linear probing, FNV-1a 64. */

typedef struct id_set {
    char **keys;
    uint64_t *hashes;
    size_t cap; /* a power of two, or 0 */
    size_t count;
} id_set;

static uint64_t str_hash(const char *s, size_t n) { return tp_fnv1a(TP_FNV_OFFSET, s, n); }

static int idset_grow(id_set *s)
{
    size_t ncap = s->cap ? s->cap * 2 : 1024;
    char **nk = calloc(ncap, sizeof *nk);
    uint64_t *nh = calloc(ncap, sizeof *nh);
    if (!nk || !nh) {
        free(nk);
        free(nh);
        return 0;
    }
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->keys[i]) continue;
        size_t j = (size_t)s->hashes[i] & (ncap - 1);
        while (nk[j]) j = (j + 1) & (ncap - 1);
        nk[j] = s->keys[i];
        nh[j] = s->hashes[i];
    }
    free(s->keys);
    free(s->hashes);
    s->keys = nk;
    s->hashes = nh;
    s->cap = ncap;
    return 1;
}

/* 1: added, 0: already there, -1: out of memory. */
static int idset_add(id_set *s, const char *key, size_t n)
{
    if ((s->count + 1) * 2 > s->cap && !idset_grow(s)) return -1;
    uint64_t h = str_hash(key, n);
    size_t j = (size_t)h & (s->cap - 1);
    while (s->keys[j]) {
        if (s->hashes[j] == h && strlen(s->keys[j]) == n && !memcmp(s->keys[j], key, n)) return 0;
        j = (j + 1) & (s->cap - 1);
    }
    char *k = strndup(key, n);
    if (!k) return -1;
    s->keys[j] = k;
    s->hashes[j] = h;
    s->count++;
    return 1;
}

static int idset_has(const id_set *s, const char *key)
{
    if (!s->cap || !key) return 0;
    size_t n = strlen(key);
    uint64_t h = str_hash(key, n);
    size_t j = (size_t)h & (s->cap - 1);
    while (s->keys[j]) {
        if (s->hashes[j] == h && !strcmp(s->keys[j], key)) return 1;
        j = (j + 1) & (s->cap - 1);
    }
    return 0;
}

static void idset_free(id_set *s)
{
    for (size_t i = 0; i < s->cap; i++) free(s->keys[i]);
    free(s->keys);
    free(s->hashes);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------------------
 * The output object */

typedef struct held_line {
    int64_t index;
    char *buf; /* the line and its '\n' */
    size_t len;
    int is_error;
} held_line;

typedef struct out_file {
    char *path;   /* for messages; "standard output" when fd is 1 and not ours */
    int fd;       /* -1: none */
    int own;      /* we opened it (close it; roll back torn writes) */
    int regular;  /* a regular file */
    atomic_int dirty; /* written since the last fdatasync (the syncer reads and clears it) */
    off_t size;   /* bytes of whole lines in it (regular files we own) */
} out_file;

/* The thread that fdatasyncs every sync_seconds (started at the first dirty maybe_sync). */
typedef struct syncer {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* on CLOCK_MONOTONIC; signalled to stop */
    int running;         /* main thread's: started and not yet joined */
    int start_failed;    /* main thread's: the caller's thread syncs instead */
    int stop;            /* under lock */
    atomic_int failed_errno;        /* 0, or the errno of its failed fdatasync (then it ends) */
    _Atomic(out_file *) failed_file; /* set before failed_errno */
} syncer;

struct tp_output {
    out_file out, err; /* err.fd < 0: error records go inline */
    int ordered;
    double sync_seconds, last_sync;
    syncer sync;
    int64_t next_index;
    held_line *heap;
    size_t nheap, capheap;
    char *scratch;
    size_t capscratch;
    id_set done;
    int64_t done_errors; /* of done: error records (an earlier run's requests that failed) */
    char *manifest_path; /* NULL: no manifest */
    json_t *manifest;
    tp_status broken; /* the first fatal write error: later calls return it */
};

static void out_file_init(out_file *f)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

/* ---- writing ---- */

static tp_status emit(tp_output *o, const char *buf, size_t len, int is_error)
{
    out_file *f = (is_error && o->err.fd >= 0) ? &o->err : &o->out;
    size_t done = 0;
    if (write_all_fd(f->fd, buf, len, &done) == TP_OK) {
        f->size += (off_t)len;
        atomic_store(&f->dirty, 1);
        return TP_OK;
    }
    int e = errno;
    const char *cut = "";
    if (done > 0 && f->own && f->regular) {
        /* Part of the line reached the file: cut it back so the file still ends on a
         * whole line. */
        cut = ftruncate(f->fd, f->size) == 0 ? "; the partial line was removed"
                                              : "; a partial last line remains (--resume repairs it)";
    }
    o->broken = tp_error(TP_ERR_IO, "cannot write to %s: %s%s%s; the lines written before stay valid%s", f->path,
                         strerror(e), io_hint(e), cut,
                         f->own && f->regular ? " and --resume continues from them"
                                              : " (--resume needs --output to be a regular file: with one, a run can continue)");
    return o->broken;
}

/* fdatasync f if written since its last one: 0, or the errno of the failure (f stays dirty).
 * Either thread; a write that lands during the call sets dirty again for the next. */
static int sync_fd(out_file *f)
{
    if (f->fd < 0 || !atomic_exchange(&f->dirty, 0)) return 0;
    if (fdatasync(f->fd) == 0) return 0;
    int e = errno;
    /* Pipes, terminals and character devices cannot be synced: nothing to lose. */
    if (!f->regular && (e == EINVAL || e == EROFS || e == ENOTSUP)) return 0;
    atomic_store(&f->dirty, 1);
    return e;
}

static tp_status sync_error(const out_file *f, int e)
{
    return tp_error(TP_ERR_IO, "fdatasync of %s failed: %s%s; lines since the last sync may be lost", f->path,
                    strerror(e), io_hint(e));
}

static tp_status sync_now(tp_output *o)
{
    tp_status st = TP_OK;
    out_file *fs[2] = {&o->out, &o->err};
    for (int i = 0; i < 2 && st == TP_OK; i++) {
        int e = sync_fd(fs[i]);
        if (e) st = sync_error(fs[i], e);
    }
    o->last_sync = mono_now();
    if (st != TP_OK) o->broken = st;
    return st;
}

static void *sync_loop(void *arg)
{
    tp_output *o = arg;
    syncer *s = &o->sync;
    pthread_mutex_lock(&s->lock);
    while (!s->stop) {
        const double until_s = mono_now() + o->sync_seconds;
        struct timespec until = {(time_t)until_s, (long)((until_s - (double)(time_t)until_s) * 1e9)};
        pthread_cond_timedwait(&s->wake, &s->lock, &until);
        if (s->stop) break;
        pthread_mutex_unlock(&s->lock);
        out_file *fs[2] = {&o->out, &o->err};
        int e = 0, i = 0;
        for (; i < 2 && !e; i++) e = sync_fd(fs[i]);
        pthread_mutex_lock(&s->lock);
        if (e) {
            atomic_store(&s->failed_file, fs[i - 1]);
            atomic_store(&s->failed_errno, e);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Start the syncer; 0 where it cannot (maybe_sync then syncs on the caller's thread). */
static int syncer_start(tp_output *o)
{
    syncer *s = &o->sync;
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) return 0;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int ok = pthread_cond_init(&s->wake, &attr) == 0;
    pthread_condattr_destroy(&attr);
    if (!ok) return 0;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        pthread_cond_destroy(&s->wake);
        return 0;
    }
    s->stop = 0;
    if (pthread_create(&s->thread, NULL, sync_loop, o) != 0) {
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->wake);
        return 0;
    }
    s->running = 1;
    return 1;
}

static void syncer_stop(tp_output *o)
{
    syncer *s = &o->sync;
    if (!s->running) return;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->wake);
    s->running = 0;
}

/* The syncer's failure, made this output's sticky error (on the caller's thread, whose
 * message buffer tp_error fills). */
static tp_status syncer_check(tp_output *o)
{
    const int e = atomic_load(&o->sync.failed_errno);
    if (e && o->broken == TP_OK) o->broken = sync_error(atomic_load(&o->sync.failed_file), e);
    return o->broken;
}

tp_status tp_output_maybe_sync(tp_output *o)
{
    if (!o) return TP_OK;
    if (syncer_check(o) != TP_OK) return o->broken;
    if (!atomic_load(&o->out.dirty) && !atomic_load(&o->err.dirty)) return TP_OK;
    if (o->sync_seconds > 0 && !o->sync.running && !o->sync.start_failed) o->sync.start_failed = !syncer_start(o);
    if (o->sync.running) return TP_OK;
    if (mono_now() - o->last_sync < o->sync_seconds) return TP_OK;
    return sync_now(o);
}

/* ---- the ordered-mode heap ---- */

static int heap_push(tp_output *o, held_line h)
{
    if (o->nheap == o->capheap) {
        size_t ncap = o->capheap ? o->capheap * 2 : 64;
        held_line *nh = realloc(o->heap, ncap * sizeof *nh);
        if (!nh) return 0;
        o->heap = nh;
        o->capheap = ncap;
    }
    size_t i = o->nheap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (o->heap[parent].index <= h.index) break;
        o->heap[i] = o->heap[parent];
        i = parent;
    }
    o->heap[i] = h;
    return 1;
}

static held_line heap_pop(tp_output *o)
{
    held_line top = o->heap[0];
    held_line last = o->heap[--o->nheap];
    size_t i = 0, n = o->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && o->heap[c + 1].index < o->heap[c].index) c++;
        if (last.index <= o->heap[c].index) break;
        o->heap[i] = o->heap[c];
        i = c;
    }
    if (n) o->heap[i] = last;
    return top;
}

static tp_status drain_heap(tp_output *o)
{
    while (o->nheap && o->heap[0].index <= o->next_index) {
        held_line h = heap_pop(o);
        tp_status st = TP_OK;
        if (h.index < o->next_index)
            st = tp_error(TP_ERR_INTERNAL, "ordered output: index %" PRId64 " was written twice", h.index);
        else
            st = emit(o, h.buf, h.len, h.is_error);
        free(h.buf);
        if (st != TP_OK) return st;
        o->next_index++;
    }
    return TP_OK;
}

tp_status tp_output_write(tp_output *o, int64_t index, const char *line, size_t len, int is_error)
{
    if (!o) return tp_error(TP_ERR_INTERNAL, "tp_output_write: no output");
    if (syncer_check(o) != TP_OK) return o->broken;
    if (!line || len == 0) return tp_error(TP_ERR_INTERNAL, "tp_output_write: an empty line");
    if (memchr(line, '\n', len))
        return tp_error(TP_ERR_INTERNAL, "tp_output_write: the line contains a newline (JSONL needs one line each)");
    if (len == SIZE_MAX) return tp_error(TP_ERR_OOM, "line too long");

    tp_status st;
    if (o->ordered && index != o->next_index) {
        if (index < o->next_index)
            return tp_error(TP_ERR_INTERNAL, "ordered output: index %" PRId64 " written twice (next is %" PRId64 ")",
                            index, o->next_index);
        held_line h = {index, malloc(len + 1), len + 1, is_error};
        if (!h.buf) return tp_error(TP_ERR_OOM, "out of memory holding a result for ordered output");
        memcpy(h.buf, line, len);
        h.buf[len] = '\n';
        if (!heap_push(o, h)) {
            free(h.buf);
            return tp_error(TP_ERR_OOM, "out of memory holding a result for ordered output");
        }
        return TP_OK;
    }
    if (o->capscratch < len + 1) {
        size_t ncap = len + 1 < 4096 ? 4096 : len + 1;
        char *ns = realloc(o->scratch, ncap);
        if (!ns) return tp_error(TP_ERR_OOM, "out of memory writing a %zu-byte line", len);
        o->scratch = ns;
        o->capscratch = ncap;
    }
    memcpy(o->scratch, line, len);
    o->scratch[len] = '\n';
    TP_CHECK(emit(o, o->scratch, len + 1, is_error));
    if (o->ordered) {
        o->next_index++;
        TP_CHECK(drain_heap(o));
    }
    st = tp_output_maybe_sync(o);
    return st;
}

int tp_output_is_done(const tp_output *o, const char *id) { return o && idset_has(&o->done, id); }

int64_t tp_output_done_count(const tp_output *o) { return o ? (int64_t)o->done.count : 0; }

int64_t tp_output_done_errors(const tp_output *o) { return o ? o->done_errors : 0; }

/* ---------------------------------------------------------------------------
 * The manifest (output_manifest.c builds and compares it) */

static tp_status write_manifest(tp_output *o, const char *status)
{
    json_object_set_new(o->manifest, "status", json_string(status));
    json_object_set_new(o->manifest, "updated_at", json_integer((json_int_t)time(NULL)));
    char *text = json_dumps(o->manifest, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) return tp_error(TP_ERR_OOM, "out of memory writing %s", o->manifest_path);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return tp_error(TP_ERR_OOM, "out of memory writing %s", o->manifest_path);
    }
    t2[n] = '\n';
    t2[n + 1] = '\0';
    tp_status st = tp_write_file_atomic(o->manifest_path, t2, n + 1, 1);
    free(t2);
    return st;
}

/* ---------------------------------------------------------------------------
 * Resume: read an earlier output, keep its ids, cut a torn or invalid tail. */

typedef struct scan_state {
    tp_output *o;
    const char *path;
    off_t good_end;      /* end of the last good line */
    off_t bad_off;       /* start of the first bad line, or -1 */
    int64_t bad_line;    /* its number (1-based) */
    int64_t lineno, good, no_id;
    int64_t bad_whole; /* bad lines that do end in '\n' */
} scan_state;

static tp_status scan_line(scan_state *s, const char *line, size_t len, off_t start, off_t end)
{
    s->lineno++;
    size_t k = 0;
    while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
    if (k == len) { /* a blank line: neither good nor bad */
        if (s->bad_off < 0) s->good_end = end;
        return TP_OK;
    }
    json_error_t jerr;
    json_t *j = json_loadb(line, len, JSON_ALLOW_NUL, &jerr);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        s->bad_whole++;
        if (s->bad_off < 0) {
            s->bad_off = start;
            s->bad_line = s->lineno;
        }
        return TP_OK;
    }
    if (s->bad_off >= 0) {
        json_decref(j);
        return tp_error(TP_ERR_FORMAT,
                        "--resume: line %" PRId64 " of %s is not a whole JSON object, but later lines "
                        "are; tpinfer only repairs a torn end. Fix or remove that line, or use "
                        "--overwrite to start over",
                        s->bad_line, s->path);
    }
    s->good_end = end;
    s->good++;
    json_t *id = json_object_get(j, "custom_id");
    if (!json_is_string(id)) id = json_object_get(j, "id");
    char num[32];
    const char *key = NULL;
    size_t klen = 0;
    if (json_is_string(id)) {
        key = json_string_value(id);
        klen = json_string_length(id);
    } else if (json_is_integer(id)) {
        klen = (size_t)snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(id));
        key = num;
    }
    /* an error record: OpenAI's envelope with an error, or the compact line's code */
    json_t *err = json_object_get(j, "error");
    const int is_error = (err && !json_is_null(err)) || json_is_string(json_object_get(j, "code"));
    tp_status st = TP_OK;
    int added = 0;
    if (!key) s->no_id++;
    else if ((added = idset_add(&s->o->done, key, klen)) < 0) st = tp_error(TP_ERR_OOM, "out of memory reading %s", s->path);
    if (added > 0 && is_error) s->o->done_errors++;
    json_decref(j);
    return st;
}

static tp_status scan_existing(tp_output *o, out_file *f)
{
    int rfd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (rfd < 0) return tp_error(TP_ERR_IO, "--resume: cannot read %s: %s", f->path, strerror(errno));
    scan_state s = {o, f->path, 0, -1, 0, 0, 0, 0, 0};
    char *chunk = malloc(SCAN_CHUNK);
    char *line = NULL;
    size_t nline = 0, capline = 0;
    off_t off = 0, line_start = 0;
    tp_status st = chunk ? TP_OK : tp_error(TP_ERR_OOM, "out of memory reading %s", f->path);
    while (st == TP_OK) {
        ssize_t r = read(rfd, chunk, SCAN_CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = tp_error(TP_ERR_IO, "--resume: cannot read %s: %s%s", f->path, strerror(errno), io_hint(errno));
            break;
        }
        if (r == 0) break;
        size_t pos = 0, n = (size_t)r;
        while (pos < n && st == TP_OK) {
            const char *nl = memchr(chunk + pos, '\n', n - pos);
            size_t seg = nl ? (size_t)(nl - (chunk + pos)) : n - pos;
            const char *data = chunk + pos;
            if (nl && nline == 0) {
                /* the whole line is in this chunk: no copy */
                st = scan_line(&s, data, seg, line_start, off + (off_t)seg + 1);
            } else {
                if (nline + seg + 1 > capline) {
                    size_t ncap = capline ? capline : 4096;
                    while (ncap < nline + seg + 1) ncap *= 2;
                    char *nl2 = realloc(line, ncap);
                    if (!nl2) {
                        st = tp_error(TP_ERR_OOM, "out of memory reading %s", f->path);
                        break;
                    }
                    line = nl2;
                    capline = ncap;
                }
                memcpy(line + nline, data, seg);
                nline += seg;
                if (nl) {
                    st = scan_line(&s, line, nline, line_start, off + (off_t)seg + 1);
                    nline = 0;
                }
            }
            off += (off_t)seg + (nl ? 1 : 0);
            pos += seg + (nl ? 1 : 0);
            if (nl) line_start = off;
        }
    }
    free(chunk);
    free(line);
    close(rfd);
    if (st != TP_OK) return st;
    if (nline > 0 && s.bad_off < 0) { /* no '\n' at the end: a torn line */
        s.bad_off = line_start;
        s.bad_line = s.lineno + 1;
    }
    if (s.good == 0 && s.bad_whole > 0)
        /* Not one line of ours, and more than one torn write: this is not a tpinfer output
         * (or not a JSONL one). Cutting it to nothing would destroy it. */
        return tp_error(TP_ERR_FORMAT,
                        "--resume: no line of %s is a JSON object; it does not look like a tpinfer output. "
                        "Give another --output, or --overwrite to replace it",
                        f->path);
    if (s.good_end < off) {
        if (ftruncate(f->fd, s.good_end) != 0)
            return tp_error(TP_ERR_IO, "--resume: cannot truncate %s to its last whole line: %s", f->path,
                            strerror(errno));
        if (fdatasync(f->fd) != 0)
            return tp_error(TP_ERR_IO, "fdatasync of %s failed: %s%s", f->path, strerror(errno), io_hint(errno));
        tp_log(TP_LOG_WARN,
               "resume: %s ended with %lld bytes of a torn or invalid line (from line %" PRId64
               "); truncated to its last whole line (%lld bytes); those requests will be redone",
               f->path, (long long)(off - s.good_end), s.bad_line, (long long)s.good_end);
    }
    if (s.no_id)
        tp_log(TP_LOG_WARN,
               "resume: %" PRId64 " lines of %s have no \"custom_id\" or \"id\"; their requests will be redone",
               s.no_id, f->path);
    f->size = s.good_end;
    tp_log(TP_LOG_INFO, "resume: %s has %" PRId64 " finished lines", f->path, s.good);
    return TP_OK;
}

/* ---------------------------------------------------------------------------
 * Open and close */

/* dir's real path + "/" + the base name: one spelling for a file that may not exist yet. */
static char *canon_path(const char *path)
{
    char *dir = dir_of(path);
    char *rd = dir ? realpath(dir, NULL) : NULL;
    char *out = rd ? tp_path_join(rd, base_of(path)) : NULL;
    free(dir);
    free(rd);
    return out;
}

typedef struct target {
    const char *path;
    const char *what; /* "--output", "--errors" */
    int exists, regular, has_data;
    struct stat st;
} target;

static tp_status inspect_target(target *t, const char *input_path, const struct stat *in_st, int need_dir_write)
{
    memset(&t->st, 0, sizeof t->st);
    t->exists = t->regular = t->has_data = 0;
    tp_status st = TP_OK;
    char *dir = dir_of(t->path);
    if (!dir) return tp_error(TP_ERR_OOM, "out of memory");
    if (stat(t->path, &t->st) == 0) {
        t->exists = 1;
        t->regular = S_ISREG(t->st.st_mode);
        t->has_data = t->regular && t->st.st_size > 0;
        if (!t->regular) need_dir_write = 0; /* /dev/null, a FIFO: no manifest beside it */
        if (S_ISDIR(t->st.st_mode)) {
            st = tp_error(TP_ERR_INVALID_ARG, "%s %s is a directory; give a file name", t->what, t->path);
        } else if (in_st && t->st.st_dev == in_st->st_dev && t->st.st_ino == in_st->st_ino) {
            st = tp_error(TP_ERR_INVALID_ARG,
                          "%s %s is the input file %s (the same file); writing it would destroy the input. "
                          "Choose another output file",
                          t->what, t->path, input_path);
        }
    } else if (errno != ENOENT) {
        st = tp_error(TP_ERR_IO, "%s %s: %s", t->what, t->path, strerror(errno));
    } else {
        struct stat ds;
        need_dir_write = 1;
        if (stat(dir, &ds) != 0 || !S_ISDIR(ds.st_mode)) {
            st = tp_error(TP_ERR_IO, "%s %s: the directory %s does not exist; create it first", t->what, t->path,
                          dir);
        } else if (input_path && in_st) {
            /* not there yet: still refuse a name that resolves to the input */
            char *co = canon_path(t->path), *ri = realpath(input_path, NULL);
            if (co && ri && !strcmp(co, ri))
                st = tp_error(TP_ERR_INVALID_ARG, "%s %s is the input file %s; choose another output file",
                              t->what, t->path, input_path);
            free(co);
            free(ri);
        }
    }
    if (st == TP_OK && need_dir_write && access(dir, W_OK | X_OK) != 0) {
        int e = errno;
        st = tp_error(TP_ERR_IO, "%s %s: the directory %s is not writable: %s", t->what, t->path, dir,
                      strerror(e));
    }
    free(dir);
    return st;
}

/* Whether a and b name one file: the same device and inode where both exist, else the same
 * canonical path (neither exists yet); b_fd >= 0: b is this process's descriptor b_fd. */
static int same_file(const char *a, const char *b, int b_fd)
{
    struct stat sa, sb;
    const int ea = stat(a, &sa) == 0, eb = b_fd >= 0 ? fstat(b_fd, &sb) == 0 : stat(b, &sb) == 0;
    if (ea || eb) return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (b_fd >= 0) return 0;
    char *ca = canon_path(a), *cb = canon_path(b);
    const int same = ca && cb && !strcmp(ca, cb);
    free(ca);
    free(cb);
    return same;
}

tp_status tp_output_check_target(const char *what, const char *path, const char *input, const char *output,
                                 const char *errors)
{
    int own = -1;
    char *end = link_target(path, &own); /* where its links end: what gets replaced */
    if (!end) return tp_error(TP_ERR_IO, "%s %s: cannot follow its links: %s", what, path, strerror(errno));
    tp_status st = TP_OK;
    if (own >= 0) { /* written through the descriptor: only the results' own stream is wrong */
        if (own == 1 && !output)
            st = tp_error(TP_ERR_INVALID_ARG, "%s %s is standard output, where the results go without --output; "
                          "give it another file (or /dev/stderr)", what, path);
        free(end);
        return st;
    }
    char *manifest = output ? str_cat(output, ".manifest.json") : NULL;
    const struct { const char *name, *path; int fd; } others[] = {
        {"the input file", input && strcmp(input, "-") ? input : NULL, -1},
        {"the output", output ? output : "standard output", output ? -1 : 1},
        {"the output's manifest", manifest, -1},
        {"the errors file", errors, -1},
    };
    for (size_t i = 0; st == TP_OK && i < sizeof others / sizeof others[0]; i++)
        if (others[i].path && same_file(end, others[i].path, others[i].fd))
            st = tp_error(TP_ERR_INVALID_ARG, "%s %s is %s (%s): writing it would replace that; give another file",
                          what, path, others[i].name, others[i].path);
    free(manifest);
    if (st == TP_OK) { /* a link's messages name it and where it leads */
        char named[PATH_MAX + 64];
        snprintf(named, sizeof named, "%s %s, a link to", what, path);
        target t = {end, strcmp(end, path) ? named : what, 0, 0, 0, {0}};
        st = inspect_target(&t, NULL, NULL, 1);
    }
    free(end);
    return st;
}

static tp_status open_target(const target *t, out_file *f)
{
    f->fd = open(t->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (f->fd < 0) {
        int e = errno;
        return tp_error(TP_ERR_IO, "cannot open %s %s for writing: %s%s", t->what, t->path, strerror(e), io_hint(e));
    }
    f->own = 1;
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) return tp_error(TP_ERR_IO, "cannot stat %s: %s", t->path, strerror(errno));
    f->regular = S_ISREG(sb.st_mode);
    f->size = f->regular ? sb.st_size : 0;
    if (f->regular && flock(f->fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
        return tp_error(TP_ERR_INVALID_ARG,
                        "%s %s is being written by another tpinfer run; two runs must not share an output",
                        t->what, t->path);
    return TP_OK;
}

static void free_output(tp_output *o)
{
    if (!o) return;
    syncer_stop(o);
    if (o->out.own && o->out.fd >= 0) close(o->out.fd);
    if (o->err.own && o->err.fd >= 0) close(o->err.fd);
    free(o->out.path);
    free(o->err.path);
    for (size_t i = 0; i < o->nheap; i++) free(o->heap[i].buf);
    free(o->heap);
    free(o->scratch);
    idset_free(&o->done);
    free(o->manifest_path);
    json_decref(o->manifest);
    free(o);
}

/* OUTPUT.manifest.json is replaced whole at every update (a rename): neither the input nor
 * the errors file may be it, or that file would be lost. */
static tp_status check_manifest_clash(const char *output, const char *input, const char *errors)
{
    char *manifest = str_cat(output, ".manifest.json");
    if (!manifest) return tp_error(TP_ERR_OOM, "out of memory");
    tp_status st = TP_OK;
    if (input && same_file(input, manifest, -1))
        st = tp_error(TP_ERR_INVALID_ARG, "the input file %s is the output's manifest %s, which the run replaces; "
                      "copy the input elsewhere or give another --output", input, manifest);
    else if (errors && same_file(errors, manifest, -1))
        st = tp_error(TP_ERR_INVALID_ARG, "the errors file %s is the output's manifest %s, which the run replaces; "
                      "give --errors another file", errors, manifest);
    free(manifest);
    return st;
}

tp_status tp_output_open(const tp_output_config *cfg, const tp_manifest *m, tp_output **out)
{
    *out = NULL;
    if (!cfg) return tp_error(TP_ERR_INTERNAL, "tp_output_open: no config");
    if (!cfg->path && cfg->resume)
        return tp_error(TP_ERR_INVALID_ARG,
                        "--resume needs --output FILE; results on standard output cannot be resumed");
    if (cfg->path && cfg->errors_path && !strcmp(cfg->path, cfg->errors_path))
        return tp_error(TP_ERR_INVALID_ARG, "the errors file and the output are both %s; give two files", cfg->path);

    const char *input_path = (m && m->input_path && strcmp(m->input_path, "-") != 0) ? m->input_path : NULL;
    if (cfg->path && m) TP_CHECK(check_manifest_clash(cfg->path, input_path, cfg->errors_path));
    struct stat in_st;
    const struct stat *in_stp = (input_path && stat(input_path, &in_st) == 0) ? &in_st : NULL;

    target to = {cfg->path, "--output", 0, 0, 0, {0}}, te = {cfg->errors_path, "--errors", 0, 0, 0, {0}};
    if (to.path) TP_CHECK(inspect_target(&to, input_path, in_stp, m != NULL));
    if (te.path) {
        TP_CHECK(inspect_target(&te, input_path, in_stp, 0));
        int same = 0;
        if (to.path && to.exists && te.exists) {
            same = to.st.st_dev == te.st.st_dev && to.st.st_ino == te.st.st_ino;
        } else if (to.path && !to.exists && !te.exists) {
            char *a = canon_path(to.path), *b = canon_path(te.path);
            same = a && b && !strcmp(a, b);
            free(a);
            free(b);
        }
        if (same)
            return tp_error(TP_ERR_INVALID_ARG,
                            "the errors file %s and the output %s are the same file; give two files", te.path,
                            to.path);
    }
    if (!cfg->resume && !cfg->overwrite) {
        const target *ts[2] = {&to, &te};
        for (int i = 0; i < 2; i++)
            if (ts[i]->path && ts[i]->has_data)
                return tp_error(TP_ERR_INVALID_ARG,
                                "%s exists; give --resume to continue it or --overwrite to replace it", ts[i]->path);
    }
    if (cfg->resume && to.exists && !to.regular)
        return tp_error(TP_ERR_INVALID_ARG, "cannot --resume into %s: not a regular file", to.path);
    int prior = cfg->resume && (to.has_data || te.has_data);

    tp_output *o = calloc(1, sizeof *o);
    if (!o) return tp_error(TP_ERR_OOM, "out of memory");
    out_file_init(&o->out);
    out_file_init(&o->err);
    o->ordered = cfg->ordered;
    o->sync_seconds = cfg->sync_seconds >= 0 ? cfg->sync_seconds : 2.0; /* also NaN */
    tp_status st = TP_OK;

    if (to.path) {
        o->out.path = strdup(to.path);
        if (!o->out.path) TP_CHECK_GOTO(tp_error(TP_ERR_OOM, "out of memory"), st, fail);
        TP_CHECK_GOTO(open_target(&to, &o->out), st, fail);
        if (m && o->out.regular) {
            o->manifest_path = str_cat(to.path, ".manifest.json");
            if (!o->manifest_path) TP_CHECK_GOTO(tp_error(TP_ERR_OOM, "out of memory"), st, fail);
        }
    } else {
        o->out.path = strdup("standard output");
        if (!o->out.path) TP_CHECK_GOTO(tp_error(TP_ERR_OOM, "out of memory"), st, fail);
        o->out.fd = STDOUT_FILENO;
        struct stat sb;
        o->out.regular = fstat(STDOUT_FILENO, &sb) == 0 && S_ISREG(sb.st_mode);
    }
    if (te.path) {
        o->err.path = strdup(te.path);
        if (!o->err.path) TP_CHECK_GOTO(tp_error(TP_ERR_OOM, "out of memory"), st, fail);
        TP_CHECK_GOTO(open_target(&te, &o->err), st, fail);
    }

    if (o->manifest_path) TP_CHECK_GOTO(tp_manifest_build(m, &o->manifest), st, fail);

    if (prior) {
        /* Check the identity before touching anything. */
        if (o->manifest) {
            char *text = NULL;
            size_t len = 0;
            struct stat ms;
            if (stat(o->manifest_path, &ms) != 0) {
                if (!cfg->force) {
                    st = tp_error(TP_ERR_INVALID_ARG,
                                  "--resume: %s has no manifest (%s), so tpinfer cannot check that it came from "
                                  "this model, input and settings; --force overrides",
                                  to.path, o->manifest_path);
                    goto fail;
                }
                tp_log(TP_LOG_WARN, "resume: %s is missing; continuing because of --force", o->manifest_path);
            } else {
                st = tp_read_file(o->manifest_path, MANIFEST_MAX, &text, &len);
                json_error_t jerr;
                json_t *old = st == TP_OK ? json_loadb(text, len, JSON_ALLOW_NUL, &jerr) : NULL;
                free(text);
                if (st == TP_OK && !json_is_object(old)) {
                    json_decref(old);
                    old = NULL;
                    if (!cfg->force) {
                        st = tp_error(TP_ERR_FORMAT, "--resume: %s is not a valid manifest; --force overrides",
                                      o->manifest_path);
                        goto fail;
                    }
                    tp_log(TP_LOG_WARN, "resume: %s is not a valid manifest; continuing because of --force",
                           o->manifest_path);
                }
                if (st != TP_OK) goto fail;
                if (old) st = tp_manifest_compare(old, o->manifest, cfg->force, o->manifest_path);
                json_decref(old);
                if (st != TP_OK) goto fail;
            }
        }
        if (to.has_data) TP_CHECK_GOTO(scan_existing(o, &o->out), st, fail);
        if (te.has_data) TP_CHECK_GOTO(scan_existing(o, &o->err), st, fail);
        tp_log(TP_LOG_INFO, "resume: %" PRId64 " requests were finished by an earlier run and will be skipped",
               (int64_t)o->done.count);
    } else if (cfg->overwrite && !cfg->resume) {
        out_file *fs[2] = {&o->out, &o->err};
        for (int i = 0; i < 2; i++) {
            out_file *f = fs[i];
            if (f->fd < 0 || !f->own || !f->regular || f->size == 0) continue;
            if (ftruncate(f->fd, 0) != 0) {
                st = tp_error(TP_ERR_IO, "--overwrite: cannot truncate %s: %s", f->path, strerror(errno));
                goto fail;
            }
            f->size = 0;
            tp_log(TP_LOG_INFO, "--overwrite: replacing %s", f->path);
        }
    }
    if (o->manifest) TP_CHECK_GOTO(write_manifest(o, "running"), st, fail);
    o->last_sync = mono_now();
    *out = o;
    return TP_OK;
fail:
    free_output(o);
    return st;
}

tp_status tp_output_close(tp_output *o, int complete)
{
    if (!o) return TP_OK;
    tp_status st = o->broken;
    if (o->nheap) {
        if (complete && st == TP_OK) {
            int64_t waiting = o->next_index;
            size_t n = o->nheap;
            /* A bug upstream (an index never written): keep the results, out of order. */
            while (o->nheap && st == TP_OK) {
                o->next_index = o->heap[0].index;
                st = drain_heap(o);
            }
            if (st == TP_OK)
                st = tp_error(TP_ERR_INTERNAL,
                              "ordered output: %zu results waited for index %" PRId64
                              ", which never came; they were written after a gap",
                              n, waiting);
        } else {
            tp_log(TP_LOG_WARN,
                   "%zu finished results held back for input order were not written; --resume will redo them",
                   o->nheap);
        }
    }
    syncer_stop(o);
    if (st == TP_OK) st = syncer_check(o);
    tp_status s2 = sync_now(o);
    if (st == TP_OK) st = s2;
    out_file *fs[2] = {&o->out, &o->err};
    for (int i = 0; i < 2; i++) {
        out_file *f = fs[i];
        if (f->fd < 0 || !f->own) continue;
        int rc = close(f->fd);
        int e = errno;
        f->fd = -1;
        if (rc != 0 && st == TP_OK)
            st = tp_error(TP_ERR_IO, "cannot close %s: %s%s", f->path, strerror(e), io_hint(e));
    }
    if (o->manifest) {
        s2 = write_manifest(o, complete && st == TP_OK ? "completed" : "interrupted");
        if (st == TP_OK) st = s2;
    }
    free_output(o);
    return st;
}
