/* Prometheus text exposition of the gateway's counters and histograms and
 * of each worker group's own numbers (vLLM's names under llmserve:). */
#include "gw.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void gw_hist_init(gw_hist *h, const double *bounds, int nb) {
    memset(h, 0, sizeof *h);
    h->nb = nb;
    memcpy(h->buckets, bounds, sizeof(double) * (size_t)nb);
}

void gw_hist_add(gw_hist *h, double v) {
    int i = 0;
    while (i < h->nb && v > h->buckets[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}

static void hist(struct evbuffer *o, const char *name, const char *help, const gw_hist *h) {
    evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->nb; i++) {
        cum += h->counts[i];
        evbuffer_add_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->buckets[i], (unsigned long long)cum);
    }
    cum += h->counts[h->nb];
    evbuffer_add_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum,
                        name, h->sum, name, (unsigned long long)h->n);
}

static void counter(struct evbuffer *o, const char *name, const char *help, uint64_t v) {
    evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

void gw_metrics_write(gw *g, struct evbuffer *o) {
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    evbuffer_add_printf(o, "# HELP process_resident_memory_bytes Resident memory of the gateway.\n"
                           "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %ld\n",
                        rss * sysconf(_SC_PAGE_SIZE));
    static const char *cls[6] = {"2xx", "4xx", "401", "429", "5xx", "504"};
    evbuffer_add_printf(o, "# HELP llmserve:gateway_requests_total HTTP requests by status.\n"
                           "# TYPE llmserve:gateway_requests_total counter\n");
    for (int i = 0; i < 6; i++)
        evbuffer_add_printf(o, "llmserve:gateway_requests_total{status=\"%s\"} %llu\n", cls[i],
                            (unsigned long long)g->m.requests[i]);
    counter(o, "llmserve:prompt_tokens_total", "Prompt tokens of admitted requests.", g->m.prompt_tokens);
    counter(o, "llmserve:generation_tokens_total", "Generated tokens.", g->m.completion_tokens);
    counter(o, "llmserve:rate_limited_total", "Requests refused by a rate limit (429).", g->m.rate_limited);
    counter(o, "llmserve:timed_out_total", "Requests ended by a deadline (504).", g->m.timed_out);
    counter(o, "llmserve:client_cancelled_total", "Requests cancelled because the client went away.", g->m.cancelled);
    counter(o, "llmserve:retried_total", "Requests retried on another worker group before their first token.",
            g->m.retried);
    evbuffer_add_printf(o, "# HELP llmserve:open_streams Streaming responses in progress.\n"
                           "# TYPE llmserve:open_streams gauge\nllmserve:open_streams %d\n", g->open_streams);
    hist(o, "llmserve:time_to_first_token_seconds", "Time to first token.", &g->m.ttft);
    hist(o, "llmserve:inter_token_latency_seconds", "Time between streamed tokens (TPOT).", &g->m.itl);
    hist(o, "llmserve:e2e_request_latency_seconds", "End-to-end request latency.", &g->m.e2e);
    hist(o, "llmserve:request_queue_time_seconds", "Time from arrival to the request reaching a worker.", &g->m.queue);
#define GAUGE(name, help, expr)                                                                    \
    evbuffer_add_printf(o, "# HELP llmserve:" name " " help "\n# TYPE llmserve:" name " gauge\n"); \
    for (int i = 0; i < g->n_workers; i++)                                                         \
        evbuffer_add_printf(o, "llmserve:" name "{worker=\"%s\"} %.6g\n", g->w[i].addr, (double)(expr));
#define WCOUNTER(name, help, expr)                                                                 \
    evbuffer_add_printf(o, "# HELP llmserve:" name " " help "\n# TYPE llmserve:" name " counter\n"); \
    for (int i = 0; i < g->n_workers; i++)                                                         \
        evbuffer_add_printf(o, "llmserve:" name "{worker=\"%s\"} %llu\n", g->w[i].addr, (unsigned long long)(expr));
    GAUGE("worker_up", "1 when the worker group answers heartbeats.", g->w[i].up)
    GAUGE("num_requests_running", "Requests running on the worker group.", g->w[i].running)
    GAUGE("num_requests_waiting", "Requests waiting on the worker group.", g->w[i].waiting)
    GAUGE("gateway_inflight", "Requests this gateway has in flight on the group.", g->w[i].inflight)
    GAUGE("kv_cache_usage_perc", "KV cache usage, 0 to 1.",
          g->w[i].blocks_total ? 1.0 - (double)g->w[i].blocks_free / (double)g->w[i].blocks_total : 0.0)
    GAUGE("worker_rss_bytes", "Resident memory of the worker group's driver process.", g->w[i].rss_bytes)
    GAUGE("gpu_memory_used_bytes", "Device memory in use on the worker group's GPU (0 on CPU workers).",
          g->w[i].gpu_bytes)
    GAUGE("cached_blocks", "Prefix-cache blocks the router knows the group holds.", g->w[i].cached.n)
    WCOUNTER("prefix_cache_queries_total", "Prefix cache queries, in tokens.", g->w[i].prefix_queries)
    WCOUNTER("prefix_cache_hits_total", "Prefix cache hits, in tokens.", g->w[i].prefix_hits)
    WCOUNTER("num_preemptions_total", "Sequences preempted on the group.", g->w[i].preemptions)
    WCOUNTER("routed_total", "Requests routed to the group.", g->w[i].routed)
#undef GAUGE
#undef WCOUNTER
}
