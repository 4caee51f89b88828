/* cm_parse.h - strict parsing of flag values, one parser of each kind for
 * every program: the whole string must be the number and the number must be
 * in range, else LLM_EINVAL with "PROG: FLAG expects ..., not 'S'" on stderr
 * (PROG is the running program's name). */
#ifndef CM_PARSE_H
#define CM_PARSE_H

int cm_parse_long(const char *flag, const char *s, long lo, long hi, long *out);
int cm_parse_int(const char *flag, const char *s, int lo, int hi, int *out);
int cm_parse_double(const char *flag, const char *s, double lo, double hi, double *out);

#endif
