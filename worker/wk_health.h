/* wk_health.h - the worker's probe endpoint for orchestrators (Kubernetes).
 *
 * Plain HTTP on --health-port (NNG's HTTP server, on NNG's threads: it
 * never waits for the engine), from the start of the process, model load
 * included. It reads two facts the worker keeps up to date:
 *   GET /live    200 while the process's main loop has passed within
 *                live_ms (loading counts as passing until --load-timeout;
 *                a loop stuck in one step for longer is not live), else
 *                503.
 *   GET /ready   200 once the model is loaded and warmed up and the group
 *                takes requests (not draining), else 503 with the reason.
 *   GET /health  the same as /ready (vLLM's path).
 *   GET /metrics this group's gauges and counters in Prometheus text, as the
 *                loop last published them (wk_health_set_metrics): vLLM's
 *                names where it has them, llmserve:worker_* for the rest.
 * Each answer is a small JSON object: {"status": "...", "state": "..."}. */
#ifndef WK_HEALTH_H
#define WK_HEALTH_H

#include <stddef.h>

typedef struct wk_health wk_health;

enum { WK_H_LOADING = 0, WK_H_READY, WK_H_DRAINING, WK_H_FAILED, WK_H_LOAD_TIMEOUT };

/* host: "0.0.0.0" to answer the kubelet on the pod's address; port 0: no
 * probes, only the state (and the load deadline). */
int wk_health_start(const char *host, int port, int live_ms, wk_health **out, char *err, size_t errlen);
/* --load-timeout: if the state is still LOADING secs from now, the probes
 * answer 503 "load_timeout" and the process exits 1. Called again, it
 * starts the clock again; hold: the clock stops until the next call (a
 * tensor-parallel group's join, which --join-timeout bounds). secs <= 0:
 * no deadline. */
int wk_health_load_deadline(wk_health *h, double secs, int hold);
/* The main loop passed (cheap: one atomic store). NULL h: nothing. */
void wk_health_beat(wk_health *h);
void wk_health_set_state(wk_health *h, int state);
void wk_health_stop(wk_health *h);
/* The text GET /metrics answers from now on (copied). */
void wk_health_set_metrics(wk_health *h, const char *text, size_t len);
/* Whether the probes are served (a port was given): /metrics is worth making. */
int wk_health_serving(const wk_health *h);

#endif
