/* gw.h - the gateway's shared state: worker groups, in-flight requests,
 * limits and metrics. One libevent loop runs everything; NNG's receive fd
 * wakes it for worker messages, so there are no locks. */
#ifndef GW_H
#define GW_H

#include "cm_oai.h"
#include "cm_tokenizer.h"
#include "pr_wire.h"

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>
#include <stdint.h>

#define GW_MAX_WORKERS 64

enum { GW_ROUTE_PREFIX = 0, GW_ROUTE_LEAST_LOAD, GW_ROUTE_ROUND_ROBIN };

/* A set of prefix-cache block keys (open addressing, 0 = empty). */
typedef struct {
    uint64_t *k;
    uint32_t cap, n;
} gw_keyset;

typedef struct {
    char addr[256];
    nng_socket push;
    int up;                       /* Health seen within the liveness window */
    int gone;                     /* no longer in --workers-dns: never routed to again */
    double last_health, down_until, backoff;
    char model[128];
    int max_model_len, block_size, vocab;
    int running, waiting, inflight;
    uint64_t prefix_queries, prefix_hits, preemptions, blocks_total, blocks_free, rss_bytes, gpu_bytes;
    gw_keyset cached;
    uint64_t routed, routed_hit_tokens;
} gw_worker;

typedef struct {
    double buckets[16];
    uint64_t counts[17];
    double sum;
    uint64_t n;
    int nb;
} gw_hist;

typedef struct {
    uint64_t requests[6];         /* by status class: 2xx 4xx(other) 401 429 5xx 504 */
    uint64_t prompt_tokens, completion_tokens, rate_limited, timed_out, cancelled, retried;
    gw_hist ttft, itl, e2e, queue;
} gw_metrics;

typedef struct {
    double tokens, rate, burst, last;
} gw_bucket;

typedef struct gw gw;

struct gw {
    struct event_base *base;
    struct evhttp *http;
    /* config */
    const char *served_name, *api_keys_path;
    char **api_keys;
    int n_api_keys;
    int routing, max_queue, chat_kind, log_requests, log_prompts;
    double lambda, rps, tpm, ttft_timeout, request_timeout, idle_timeout, header_timeout;
    size_t max_body;
    /* model (tokenizer and template) */
    cm_tokenizer *tok;
    char *default_system;
    int max_model_len;            /* from the workers' Health */
    /* workers */
    gw_worker w[GW_MAX_WORKERS];
    int n_workers, rr;
    char dns_name[256], dns_port[16];   /* --workers-dns NAME:PORT, re-resolved every 10 s */
    int tick;
    nng_socket pull;
    char reply[256], id[64];
    struct event *recv_ev, *tick_ev;
    /* requests */
    struct gw_req *reqs;
    uint64_t next_rid;
    int open_streams;
    /* limits */
    gw_bucket global_rps, global_tpm;
    struct gw_keylimit { char key[128]; gw_bucket rps, tpm; } *klim;
    int n_klim;
    gw_metrics m;
};

/* router.c */
void gw_keyset_add(gw_keyset *s, uint64_t k);
void gw_keyset_del(gw_keyset *s, uint64_t k);
int gw_keyset_has(const gw_keyset *s, uint64_t k);
void gw_keyset_clear(gw_keyset *s);
/* Picks a worker for a prompt; -1 if none is up. *hit_tokens: its cached prefix. */
int gw_route(gw *g, const int32_t *tok, int n, uint64_t salt, int exclude, int *hit_tokens);

/* metrics.c */
void gw_hist_init(gw_hist *h, const double *bounds, int nb);
void gw_hist_add(gw_hist *h, double v);
struct evbuffer;
void gw_metrics_write(gw *g, struct evbuffer *out);

#endif
