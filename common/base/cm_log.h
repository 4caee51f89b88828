/* cm_log.h - leveled logging to stderr.
 *
 * The level check happens before any formatting, so a disabled level costs a
 * compare. CM_DEBUG compiles to nothing in release builds (NDEBUG). */
#ifndef CM_LOG_H
#define CM_LOG_H

enum cm_log_level { CM_LOG_ERROR = 0, CM_LOG_WARN, CM_LOG_INFO, CM_LOG_DEBUG };

extern int cm_log_level_current;

void cm_log_set_level(int level);
/* Parses "error|warn|info|debug"; returns 0 or LLM_EINVAL. */
int cm_log_parse_level(const char *s, int *level);
void cm_log_write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define CM_LOG(lvl, ...)                                                                           \
    do {                                                                                           \
        if ((lvl) <= cm_log_level_current) cm_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__);   \
    } while (0)
#define CM_ERR(...) CM_LOG(CM_LOG_ERROR, __VA_ARGS__)
#define CM_WARN(...) CM_LOG(CM_LOG_WARN, __VA_ARGS__)
#define CM_INFO(...) CM_LOG(CM_LOG_INFO, __VA_ARGS__)
#ifdef NDEBUG
#define CM_DEBUG(...) ((void)0)
#else
#define CM_DEBUG(...) CM_LOG(CM_LOG_DEBUG, __VA_ARGS__)
#endif

#endif
