#define _GNU_SOURCE /* program_invocation_short_name */
#include "cm_parse.h"

#include "cm_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int cm_parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s expects an integer from %ld to %ld, not '%s'\n", program_invocation_short_name, flag, lo, hi, s);
        return LLM_EINVAL;
    }
    *out = v;
    return 0;
}

int cm_parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    long v;
    if (cm_parse_long(flag, s, lo, hi, &v)) return LLM_EINVAL;
    *out = (int)v;
    return 0;
}

int cm_parse_double(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s expects a number from %g to %g, not '%s'\n", program_invocation_short_name, flag, lo, hi, s);
        return LLM_EINVAL;
    }
    *out = v;
    return 0;
}
