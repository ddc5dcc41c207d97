/*
 * log.h: levelled logging to stderr with a "tpinfer[rank/size host]: LEVEL: " prefix.
 * TPINFER_LOG=error|warn|info|debug sets the level (default info; only rank 0 logs info).
 */
#ifndef TP_LOG_H
#define TP_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_log_level { TP_LOG_ERROR, TP_LOG_WARN, TP_LOG_INFO, TP_LOG_DEBUG } tp_log_level;

void tp_log_init(int rank, int size);
void tp_log(tp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether lines of this level are printed (to skip building costly ones). */
int tp_log_enabled(tp_log_level level);
/* Like tp_log(TP_LOG_INFO, ...) but only rank 0 prints. */
void tp_log_info0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif
#endif
