#include "gw_cors.h"
#include "cm_error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const ALL_METHODS = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";
/* the CORS-safelisted request headers, always allowed (as Starlette adds them) */
static const char *const SAFE[] = {"accept", "accept-language", "content-language", "content-type", NULL};

static void free_list(char **l, int n) {
    for (int i = 0; l && i < n; i++) free(l[i]);
    free(l);
}

/* A JSON list of strings or a comma list into *out (NULL when it holds "*"). */
static int parse_list(const char *flag, const char *s, char ***out, int *n, char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    if (!s) return 0;
    char **l = NULL;
    int k = 0, any = 0;
    json_t *j = s[0] == '[' ? json_loads(s, 0, NULL) : NULL;
    if (s[0] == '[' && !json_is_array(j)) {
        snprintf(err, errlen, "--%s: '%.64s' is neither a JSON list of strings nor a comma-separated list", flag, s);
        return LLM_EINVAL;
    }
    size_t cap = j ? json_array_size(j) : 1;
    for (const char *p = s; !j && *p; p++) cap += *p == ',';
    if (!(l = calloc(cap + 1, sizeof *l))) {
        json_decref(j);
        return LLM_ENOMEM;
    }
    for (size_t i = 0; i < cap; i++) {
        const char *v;
        size_t vl;
        char buf[256];
        if (j) {
            v = json_string_value(json_array_get(j, i));
            if (!v) {
                snprintf(err, errlen, "--%s: item %zu of the list is not a string", flag, i);
                free_list(l, k);
                json_decref(j);
                return LLM_EINVAL;
            }
            vl = strlen(v);
        } else {
            const char *st = s;
            for (size_t q = 0; q < i; q++) st = strchr(st, ',') + 1;
            const char *e = strchr(st, ',');
            vl = e ? (size_t)(e - st) : strlen(st);
            while (vl && (*st == ' ')) st++, vl--;
            while (vl && st[vl - 1] == ' ') vl--;
            v = st;
        }
        if (!vl) continue;
        snprintf(buf, sizeof buf, "%.*s", (int)vl, v);
        if (!strcmp(buf, "*")) any = 1;
        else if (!(l[k++] = strdup(buf))) {
            free_list(l, k);
            json_decref(j);
            return LLM_ENOMEM;
        }
    }
    json_decref(j);
    if (any) {
        free_list(l, k);
        return 0;
    }
    *out = l;
    *n = k;
    return 0;
}

int gw_cors_init(gw_cors *c, const char *origins, const char *methods, const char *headers, int credentials, char *err,
                 size_t errlen) {
    memset(c, 0, sizeof *c);
    c->credentials = credentials;
    int rc;
    if ((rc = parse_list("allowed-origins", origins, &c->origins, &c->n_origins, err, errlen)) ||
        (rc = parse_list("allowed-methods", methods, &c->methods, &c->n_methods, err, errlen)) ||
        (rc = parse_list("allowed-headers", headers, &c->headers, &c->n_headers, err, errlen)))
        gw_cors_free(c);
    return rc;
}

void gw_cors_free(gw_cors *c) {
    free_list(c->origins, c->n_origins);
    free_list(c->methods, c->n_methods);
    free_list(c->headers, c->n_headers);
    memset(c, 0, sizeof *c);
}

int gw_cors_origin_ok(const gw_cors *c, const char *origin) {
    if (!c->origins) return 1;
    for (int i = 0; i < c->n_origins; i++)
        if (!strcmp(c->origins[i], origin)) return 1;
    return 0;
}

const char *gw_cors_allow_origin(const gw_cors *c, const char *origin, int *vary) {
    *vary = c->origins || c->credentials;
    return *vary ? origin : "*";
}

static int header_ok(const gw_cors *c, const char *h, size_t n) {
    for (const char *const *s = SAFE; *s; s++)
        if (strlen(*s) == n && !strncasecmp(*s, h, n)) return 1;
    if (!c->headers) return 1;
    for (int i = 0; i < c->n_headers; i++)
        if (strlen(c->headers[i]) == n && !strncasecmp(c->headers[i], h, n)) return 1;
    return 0;
}

int gw_cors_preflight(const gw_cors *c, const char *origin, const char *method, const char *req_headers, char *methods,
                      size_t mlen, char *headers, size_t hlen, char *why, size_t wlen) {
    int bad_origin = !gw_cors_origin_ok(c, origin), bad_method = c->methods != NULL, bad_headers = 0;
    for (int i = 0; i < c->n_methods; i++)
        if (!strcmp(c->methods[i], method)) bad_method = 0;
    for (const char *p = req_headers ? req_headers : ""; *p;) { /* "X-A, Content-Type" */
        while (*p == ' ' || *p == ',') p++;
        size_t n = strcspn(p, ",");
        while (n && p[n - 1] == ' ') n--;
        if (n && !header_ok(c, p, n)) bad_headers = 1;
        p += strcspn(p, ",");
    }
    if (bad_origin || bad_method || bad_headers) {
        snprintf(why, wlen, "Disallowed CORS %s%s%s%s%s", bad_origin ? "origin" : "", bad_origin && bad_method ? ", " : "",
                 bad_method ? "method" : "", (bad_origin || bad_method) && bad_headers ? ", " : "", bad_headers ? "headers" : "");
        return -1;
    }
    if (!c->methods) {
        snprintf(methods, mlen, "%s", ALL_METHODS);
    } else {
        size_t o = 0;
        methods[0] = 0;
        for (int i = 0; i < c->n_methods && o < mlen; i++)
            o += (size_t)snprintf(methods + o, mlen - o, "%s%s", i ? ", " : "", c->methods[i]);
    }
    if (!c->headers) { /* any: the ones asked for */
        snprintf(headers, hlen, "%s", req_headers ? req_headers : "");
    } else {
        size_t o = (size_t)snprintf(headers, hlen, "Accept, Accept-Language, Content-Language, Content-Type");
        for (int i = 0; i < c->n_headers && o < hlen; i++) o += (size_t)snprintf(headers + o, hlen - o, ", %s", c->headers[i]);
    }
    return 0;
}
