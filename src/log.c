/*
 * log.c: stderr logging with the rank and host in every line, so the lines of many
 * ranks that mpirun interleaves can still be told apart.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static int log_rank = 0, log_size = 1;
static char log_host[64] = "?";
static tp_log_level log_level = TP_LOG_INFO;

void tp_log_init(int rank, int size)
{
    log_rank = rank;
    log_size = size;
    if (gethostname(log_host, sizeof log_host) != 0) strcpy(log_host, "?");
    log_host[sizeof log_host - 1] = '\0';
    const char *env = getenv("TPINFER_LOG");
    if (env) {
        if (!strcasecmp(env, "error")) log_level = TP_LOG_ERROR;
        else if (!strcasecmp(env, "warn")) log_level = TP_LOG_WARN;
        else if (!strcasecmp(env, "info")) log_level = TP_LOG_INFO;
        else if (!strcasecmp(env, "debug")) log_level = TP_LOG_DEBUG;
    }
}

static void vlog(tp_log_level level, const char *fmt, va_list ap)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    char line[4096];
    int n = snprintf(line, sizeof line, "tpinfer[%d/%d %s]: %s: ", log_rank, log_size, log_host,
                     names[level]);
    if (n < 0 || (size_t)n >= sizeof line) n = 0;
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    fprintf(stderr, "%s\n", line); /* one call, so lines from threads do not interleave */
}

int tp_log_enabled(tp_log_level level)
{
    return level <= log_level;
}

void tp_log(tp_log_level level, const char *fmt, ...)
{
    if (level > log_level) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fmt, ap);
    va_end(ap);
}

void tp_log_info0(const char *fmt, ...)
{
    if (log_rank != 0 || TP_LOG_INFO > log_level) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(TP_LOG_INFO, fmt, ap);
    va_end(ap);
}
