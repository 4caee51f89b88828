/* gw_life.h - the gateway's lifecycle, for main() and test harnesses.
 *
 * gw_start brings up every module from g->conf (already parsed): keys,
 * limits, the override model, the event loop, the tokenizer threads, HTTP
 * and the worker pool. The caller runs g->base. gw_drain begins a drain as
 * the first SIGTERM does (a second one ends every request now); the loop
 * exits once the last answer has gone out. gw_stop releases everything, a
 * half-started gateway included, and leaves g zeroed enough to free. */
#ifndef GW_LIFE_H
#define GW_LIFE_H

#include "gw.h"

#include <stddef.h>

int gw_start(gw *g, char *err, size_t errlen);
void gw_drain(gw *g, int sig);
void gw_stop(gw *g);

#endif
