/* gw_models.h - GET /v1/models and GET /v1/models/{id} (id: the path after /v1/models/, or NULL for the
 * list); the caller has checked the key. */
#ifndef GW_MODELS_H
#define GW_MODELS_H

#include "gw.h"
#include "gw_http.h"

void gw_models_handle(gw *g, gw_http_req *r, const char *id);

#endif
