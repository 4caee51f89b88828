/* gw_cors.h - Cross-Origin Resource Sharing, as vLLM's server does it
 * (Starlette's CORSMiddleware): --allowed-origins, --allowed-methods,
 * --allowed-headers (JSON lists as vLLM takes them, or comma lists; "*" any,
 * the default) and --allow-credentials. A preflight (OPTIONS with
 * Access-Control-Request-Method) is answered here, 200 or 400 naming what is
 * not allowed; every other reply to an allowed Origin carries
 * Access-Control-Allow-Origin. The HTTP layer (gw_http.c) sets the headers. */
#ifndef GW_CORS_H
#define GW_CORS_H

#include <stddef.h>

typedef struct gw_cors {
    char **origins, **methods, **headers; /* NULL: any */
    int n_origins, n_methods, n_headers;
    int credentials;
} gw_cors;

int gw_cors_init(gw_cors *c, const char *origins, const char *methods, const char *headers, int credentials, char *err,
                 size_t errlen);
void gw_cors_free(gw_cors *c);
int gw_cors_origin_ok(const gw_cors *c, const char *origin);
/* The Access-Control-Allow-Origin value for an allowed origin: "*" when any origin is and credentials are not
 * allowed, else the origin itself (the reply then varies by Origin: *vary = 1). */
const char *gw_cors_allow_origin(const gw_cors *c, const char *origin, int *vary);
/* A preflight: 0 with the Allow-Methods and Allow-Headers values written, or -1 with why (a "Disallowed CORS
 * origin, method, headers" list as Starlette's). */
int gw_cors_preflight(const gw_cors *c, const char *origin, const char *method, const char *req_headers, char *methods,
                      size_t mlen, char *headers, size_t hlen, char *why, size_t wlen);

#endif
