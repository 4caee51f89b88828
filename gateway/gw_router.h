/* gw_router.h - the gateway's HTTP handler: each path to its API. */
#ifndef GW_ROUTER_H
#define GW_ROUTER_H

#include "gw.h"
#include "gw_http.h"

void gw_router_handle(void *g, gw_http_req *r);

#endif
