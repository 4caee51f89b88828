#include "gw_auth.h"
#include "cm_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <xxhash.h>

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

int gw_auth_add(gw_auth *a, const char *key, size_t len) {
    while (len && is_ws(*key)) key++, len--;
    while (len && is_ws(key[len - 1])) len--;
    if (!len || memchr(key, 0, len)) return LLM_EINVAL;
    char **k = realloc(a->key, sizeof *k * (size_t)(a->n + 1));
    if (!k) return LLM_ENOMEM;
    a->key = k;
    size_t *l = realloc(a->len, sizeof *l * (size_t)(a->n + 1));
    if (!l) return LLM_ENOMEM;
    a->len = l;
    char (*t)[12] = realloc(a->tag, sizeof *t * (size_t)(a->n + 1));
    if (!t) return LLM_ENOMEM;
    a->tag = t;
    if (!(a->key[a->n] = malloc(len + 1))) return LLM_ENOMEM;
    memcpy(a->key[a->n], key, len);
    a->key[a->n][len] = 0;
    a->len[a->n] = len;
    snprintf(a->tag[a->n], sizeof a->tag[a->n], "#%08x", (unsigned)(XXH3_64bits(key, len) >> 32));
    a->n++;
    return 0;
}

int gw_auth_load_file(gw_auth *a, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot open the API keys file %s", path);
        return LLM_EIO;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int added = 0, rc = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        size_t s = 0;
        while (s < (size_t)n && is_ws(line[s])) s++;
        if (s == (size_t)n || line[s] == '#') continue;
        if ((rc = gw_auth_add(a, line + s, (size_t)n - s))) break;
        added++;
    }
    free(line);
    fclose(f);
    if (rc == LLM_EINVAL) snprintf(err, errlen, "%s: a key contains a NUL byte", path);
    else if (!rc && !added) {
        snprintf(err, errlen, "%s has no API key in it: refusing to start without authentication", path);
        rc = LLM_EINVAL;
    }
    return rc;
}

/* Compares the whole of key: the time depends on the key's length only. */
static int ct_equal(const char *given, size_t glen, const char *key, size_t klen) {
    unsigned char d = (unsigned char)(glen != klen);
    for (size_t i = 0; i < klen; i++) d |= (unsigned char)((i < glen ? given[i] : 0) ^ key[i]);
    return d == 0;
}

int gw_auth_check(const gw_auth *a, const char *h, int *who) {
    *who = -1;
    if (!a->n) return 1;
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    size_t gl = strlen(h);
    while (gl && is_ws(h[gl - 1])) gl--;
    int found = -1;
    for (int i = 0; i < a->n; i++)
        if (ct_equal(h, gl, a->key[i], a->len[i]) && found < 0) found = i;
    *who = found;
    return found >= 0;
}

const char *gw_auth_tag(const gw_auth *a, int i) {
    return i >= 0 && i < a->n ? a->tag[i] : "-";
}

void gw_auth_free(gw_auth *a) {
    for (int i = 0; i < a->n; i++) free(a->key[i]);
    free(a->key);
    free(a->len);
    free(a->tag);
    memset(a, 0, sizeof *a);
}
