/* gw_jobs.h - OpenAI's Batch API (/v1/batches): a JSONL file of requests
 * run in the background at low priority, its results a file of their own.
 *
 * A batch lives in the files directory (gw_files.h) as batch_ID.json (the
 * Batch object, written whole through a rename), batch_ID.lock (held with
 * flock by the gateway running it) and, while it runs, its output and error
 * files' bytes, appended a line per finished request. Each request runs
 * through this gateway's own HTTP port (so routing, retries, grammar and
 * limits are the same as a client's), with priority 1 where the body sets
 * none (interactive requests have 0 and pass it in the groups' queues;
 * preemption gives up the batch's first), and at most --batch-concurrency
 * of them at once per gateway, so that a batch fills spare capacity
 * instead of taking it. A 429 or 503 is tried again later; anything else is
 * the line's result.
 *
 * Nothing accepted is lost: a gateway that stops (killed or not) releases
 * its locks, and every gateway sharing the directory looks each second for
 * unfinished batches whose lock is free, adopts them, reads back which lines
 * are done (a torn last line is dropped and run again) and runs the rest.
 * A cancel (POST /v1/batches/ID/cancel, through any gateway) leaves a
 * marker the running gateway sees within a second. */
#ifndef GW_JOBS_H
#define GW_JOBS_H

#include "gw_http.h"

#include <event2/event.h>
#include <stdint.h>

typedef struct gw_jobs gw_jobs;

/* host/port: this gateway's own address for the batch's requests; token: the bearer they carry (authorized as
 * an internal caller). */
int gw_jobs_start(struct event_base *base, const char *dir, const char *host, int port, const char *token,
                  int concurrency, gw_jobs **out, char *err, size_t errlen);
/* /v1/batches and below (rest: what follows "/v1/batches"). */
void gw_jobs_handle(gw_jobs *j, gw_http_req *r, const char *tenant, const char *rest);

typedef struct {
    int running;                 /* batches this gateway runs now */
    int pending;                 /* their lines not yet finished */
    uint64_t completed, failed, retried; /* lines finished with a 2xx / otherwise; tried again after 429/503 */
} gw_jobs_stats;
void gw_jobs_stats_get(const gw_jobs *j, gw_jobs_stats *st);
/* Stops running (requests in flight are cancelled; the batches stay for the next gateway). */
void gw_jobs_free(gw_jobs *j);

#endif
