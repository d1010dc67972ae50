/*
 * ki_log.h - one line per event, with a time and a level, to a file descriptor.
 *
 * The logger is a value the caller owns and passes down (no global state);
 * a line is written with a single write(2), so lines from concurrent
 * processes sharing stderr never interleave.
 */
#ifndef KI_LOG_H
#define KI_LOG_H

#include <stddef.h>

enum ki_log_level { KI_LOG_DEBUG = 0, KI_LOG_INFO = 1, KI_LOG_WARN = 2, KI_LOG_ERROR = 3 };

struct ki_log {
    int level; /* lines below this level are not written */
    int fd;    /* where lines go (2 = stderr) */
};

/* Set up a logger writing to fd at the given minimum level. */
void ki_log_init(struct ki_log *log, int level, int fd);

/* "debug", "info", "warn" or "error" to its level; -EINVAL otherwise. */
int ki_log_level_parse(const char *name);

/* Write one line: "<UTC time> <level> ki-agent[<pid>]: <message>"; newlines in the message become spaces. */
void ki_log_write(const struct ki_log *log, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define ki_log_debug(l, ...) ki_log_write((l), KI_LOG_DEBUG, __VA_ARGS__)
#define ki_log_info(l, ...) ki_log_write((l), KI_LOG_INFO, __VA_ARGS__)
#define ki_log_warn(l, ...) ki_log_write((l), KI_LOG_WARN, __VA_ARGS__)
#define ki_log_error(l, ...) ki_log_write((l), KI_LOG_ERROR, __VA_ARGS__)

#endif /* KI_LOG_H */
