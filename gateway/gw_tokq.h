/* gw_tokq.h - a small thread pool that keeps CPU-heavy request preparation
 * (JSON parsing, chat templates, tokenization) off the event loop.
 *
 * submit() queues a job (bounded: LLM_EAGAIN when full, which the caller
 * answers with 503); a pool thread runs job->run; the loop thread then runs
 * job->done. run touches only the job and read-only shared data; done runs
 * on the loop like any other callback. */
#ifndef GW_TOKQ_H
#define GW_TOKQ_H

#include <event2/event.h>

typedef struct gw_job {
    struct gw_job *next;
    void (*run)(struct gw_job *j);  /* on a pool thread */
    void (*done)(struct gw_job *j); /* on the loop thread, after run */
} gw_job;

typedef struct gw_tokq gw_tokq;

int gw_tokq_create(struct event_base *base, int threads, int max_queued, gw_tokq **out);
int gw_tokq_submit(gw_tokq *q, gw_job *j);
int gw_tokq_queued(gw_tokq *q);  /* waiting or running */
/* Stops the threads once the queue is empty; done runs for every job. */
void gw_tokq_free(gw_tokq *q);

#endif
