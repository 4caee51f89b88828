/* gw_rstore.h - where stored Responses live (POST /v1/responses with store,
 * read back by GET /v1/responses/{id} and previous_response_id).
 *
 * Two kinds, one interface: in this gateway's memory (the default), bounded
 * by entries and bytes (the oldest go first) and expiring after the TTL; or
 * in Redis (--response-store redis://[:PASSWORD@]HOST[:PORT][/DB]), where
 * every gateway of the cluster reaches them and Redis expires them (SET EX).
 * Redis is spoken through hiredis' non-blocking client on the gateway's own
 * loop: a slow or stopped Redis stalls no other request, and every operation
 * has a deadline (the store's timeout), after which it fails with
 * LLM_ETIMEDOUT. A lost connection is made again at the next operation.
 *
 * Every callback is called exactly once and never inside the call that
 * started the operation (always from the loop, later), so a caller may
 * free what it likes in it. Keys and values are opaque bytes to the store. */
#ifndef GW_RSTORE_H
#define GW_RSTORE_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_rstore gw_rstore;

/* rc: 0 (get: val/len the value, valid during the call), LLM_ENOTFOUND, LLM_ETIMEDOUT, LLM_EIO (the store could
 * not be reached or refused), LLM_ENOMEM. */
typedef void (*gw_rstore_cb)(void *arg, int rc, const char *val, size_t len);

/* url: NULL, "" or "memory" for memory; "redis://..." for Redis. ttl seconds; max_entries / max_bytes bound the
 * memory kind; timeout: each Redis operation's deadline, seconds. LLM_EINVAL (with err) for a bad URL. */
int gw_rstore_open(struct event_base *base, const char *url, double ttl, int max_entries, size_t max_bytes,
                   double timeout, gw_rstore **out, char *err, size_t errlen);
void gw_rstore_put(gw_rstore *s, const char *key, const char *val, size_t len, gw_rstore_cb cb, void *arg);
void gw_rstore_get(gw_rstore *s, const char *key, gw_rstore_cb cb, void *arg);
/* rc 0 when it was there */
void gw_rstore_del(gw_rstore *s, const char *key, gw_rstore_cb cb, void *arg);
/* "memory" or "redis" */
const char *gw_rstore_kind(const gw_rstore *s);

typedef struct {
    uint64_t puts, gets, hits, deletes, errors, evicted; /* errors: operations that failed other than not found */
    int entries;                 /* memory: held now */
    size_t bytes;
} gw_rstore_stats;
void gw_rstore_stats_get(const gw_rstore *s, gw_rstore_stats *st);
/* Pending operations fail (LLM_EIO), later, from the loop, before the base is freed. */
void gw_rstore_free(gw_rstore *s);

#endif
