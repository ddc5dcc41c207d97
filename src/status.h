/*
 * status.h: the status codes every tpinfer function returns, and the CHECK macros
 * that pass them up (NCCL's ncclResult_t + NCCLCHECK/NCCLCHECKGOTO shape).
 * The first failure records a message (what, where, what to do) with tp_error();
 * main() prints it with the rank and decides how the job ends.
 */
#ifndef TP_STATUS_H
#define TP_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_status {
    TP_OK = 0,
    TP_ERR_INVALID_ARG,   /* a bad flag or value from the user */
    TP_ERR_IO,            /* a file could not be opened, read or written */
    TP_ERR_FORMAT,        /* a file's contents are malformed */
    TP_ERR_UNSUPPORTED,   /* well-formed, but not something tpinfer runs */
    TP_ERR_OOM,           /* an allocation failed */
    TP_ERR_MPI,
    TP_ERR_CUDA,
    TP_ERR_CUBLAS,
    TP_ERR_NCCL,
    TP_ERR_UNAVAILABLE,   /* backend not compiled in, or no device */
    TP_ERR_INTERNAL,
    TP_ERR_NUMERIC,       /* the model computed NaN or Inf (logits): its weights, or float16's range */
    TP_STATUS_COUNT
} tp_status;

const char *tp_status_str(tp_status st);

/* Record the message of the first failure and return st; later calls before
 * tp_error_clear() are ignored, so the root cause is what the user sees. */
tp_status tp_error_at(tp_status st, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define tp_error(st, ...) tp_error_at((st), __FILE__, __LINE__, __VA_ARGS__)

/* Put "<fmt ...>: " before the recorded message (the failure said with what the user named,
 * as the option that gave a file); the file:line stays the root cause's. Returns st. */
tp_status tp_error_prefix(tp_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The recorded message ("" if none) and the file:line that recorded it. */
const char *tp_error_message(void);
const char *tp_error_where(void);
void tp_error_clear(void);

#define TP_CHECK(expr)                                   \
    do {                                                 \
        tp_status tp_check_st_ = (expr);                 \
        if (tp_check_st_ != TP_OK) return tp_check_st_;  \
    } while (0)

#define TP_CHECK_GOTO(expr, st, label)  \
    do {                                \
        (st) = (expr);                  \
        if ((st) != TP_OK) goto label;  \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
