#include "cm_log.h"
#include "cm_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int cm_log_level_current = CM_LOG_WARN;

void cm_log_set_level(int level) {
    cm_log_level_current = level;
}

int cm_log_parse_level(const char *s, int *level) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *level = i;
            return 0;
        }
    }
    return LLM_EINVAL;
}

void cm_log_write(int level, const char *file, int line, const char *fmt, ...) {
    static const char tag[] = "EWID";
    char buf[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s:%d ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tag[level & 3], base, line);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof buf) vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    /* one fputs per line keeps lines whole when several threads log */
    size_t len = strlen(buf);
    if (len + 1 < sizeof buf) {
        buf[len] = '\n';
        buf[len + 1] = 0;
    }
    fputs(buf, stderr);
}
