/*
 * status.c: status names and the first-failure message buffer.
 */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char error_message[2048];
static _Thread_local char error_where[256];
static _Thread_local int error_set;

const char *tp_status_str(tp_status st)
{
    static const char *const names[TP_STATUS_COUNT] = {
        "ok", "invalid argument", "I/O error", "malformed file", "unsupported",
        "out of memory", "MPI error", "CUDA error", "cuBLAS error", "NCCL error",
        "unavailable", "internal error", "not a number",
    };
    if ((int)st < 0 || st >= TP_STATUS_COUNT) return "unknown status";
    return names[st];
}

tp_status tp_error_at(tp_status st, const char *file, int line, const char *fmt, ...)
{
    if (error_set || st == TP_OK) return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    snprintf(error_where, sizeof error_where, "%s:%d", base ? base + 1 : file, line);
    error_set = 1;
    return st;
}

tp_status tp_error_prefix(tp_status st, const char *fmt, ...)
{
    if (st == TP_OK) return st;
    char prefix[512], old[sizeof error_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", error_set ? error_message : "");
    /* a message past the buffer is cut at its end, as tp_error's */
    if (snprintf(error_message, sizeof error_message, "%s%s%s", prefix, *old ? ": " : "", old) < 0)
        snprintf(error_message, sizeof error_message, "%s", prefix);
    error_set = 1;
    return st;
}

const char *tp_error_message(void) { return error_set ? error_message : ""; }
const char *tp_error_where(void) { return error_set ? error_where : ""; }

void tp_error_clear(void)
{
    error_set = 0;
    error_message[0] = '\0';
    error_where[0] = '\0';
}
