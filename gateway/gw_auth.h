/* gw_auth.h - API keys: loading, constant-time checks, log-safe names.
 *
 * Keys come from flags, the environment and a keys file (one per line, any
 * length, surrounding whitespace trimmed, blank lines and # comments
 * skipped). A keys file with no key refuses to start rather than turning
 * authentication off. A key is never logged: logs carry its tag, the first
 * 8 hex digits of its XXH3. */
#ifndef GW_AUTH_H
#define GW_AUTH_H

#include <stddef.h>

typedef struct {
    char **key;
    size_t *len;
    char (*tag)[12];
    int n;
} gw_auth;

/* Adds a key (trimmed); LLM_EINVAL for an empty one. */
int gw_auth_add(gw_auth *a, const char *key, size_t len);
/* Adds every key in path; LLM_EIO / LLM_EINVAL (no key in it) with err set. */
int gw_auth_load_file(gw_auth *a, const char *path, char *err, size_t errlen);
/* Whether an Authorization header value is allowed: always when no key is
 * configured. *who: the key's index (-1 without keys). Every key is compared
 * over its whole length, whatever matched, so timing says nothing of a key. */
int gw_auth_check(const gw_auth *a, const char *authorization, int *who);
/* The log tag of key i ("-" for -1). */
const char *gw_auth_tag(const gw_auth *a, int i);
void gw_auth_free(gw_auth *a);

#endif
