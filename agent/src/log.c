/* log.c - one-line log records (ki_log.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const LEVEL_NAMES[] = {"debug", "info", "warn", "error"};

void ki_log_init(struct ki_log *log, int level, int fd) {
    log->level = level;
    log->fd = fd;
}

int ki_log_level_parse(const char *name) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, LEVEL_NAMES[i]) == 0) return i;
    return -EINVAL;
}

void ki_log_write(const struct ki_log *log, int level, const char *fmt, ...) {
    if (!log || level < log->level || level < 0 || level > KI_LOG_ERROR) return;
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int off = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ki-agent[%ld]: ", tm.tm_year + 1900,
                       tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
                       LEVEL_NAMES[level], (long)getpid());
    if (off < 0) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + off, sizeof line - (size_t)off - 1, fmt, ap);
    va_end(ap);
    size_t end = (size_t)off + (n < 0 ? 0 : (size_t)n);
    if (end > sizeof line - 2) end = sizeof line - 2;
    for (size_t i = (size_t)off; i < end; i++)
        if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
    line[end++] = '\n';
    ssize_t w;
    do {
        w = write(log->fd, line, end);
    } while (w < 0 && errno == EINTR);
}
