#include "gw_metrics.h"
#include "gw_http.h"
#include "gw_rstore.h"
#include "gw_jobs.h"
#include "gw_pool.h"
#include "gw_tokq.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

void gw_metrics_init(gw_metrics *m) {
    static const double tb[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double ib[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
    memset(m, 0, sizeof *m);
    gw_hist_init(&m->ttft, tb, 12);
    gw_hist_init(&m->e2e, tb, 12);
    gw_hist_init(&m->queue, tb, 12);
    gw_hist_init(&m->itl, ib, 10);
}

void gw_metrics_status(gw_metrics *m, int code) {
    int c = code < 300 ? 0 : code == 401 ? 2 : code == 429 ? 3 : code == 504 ? 5 : code >= 500 ? 4 : 1;
    m->requests[c]++;
}

static void gauge(struct evbuffer *o, const char *name, const char *help, const char *labels, double v) {
    evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s gauge\n%s%s %.6g\n", name, help, name, name, labels, v);
}

/* The model-server protocol's gauges, under vLLM's names, over the groups. */
static void counter_l(struct evbuffer *o, const char *name, const char *help, const char *labels, uint64_t v) {
    evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s counter\n%s%s %llu\n", name, help, name, name, labels,
                        (unsigned long long)v);
}

static void vllm_gauges(const gw *g, struct evbuffer *o) {
    double waiting = 0, running = 0, total = 0, free_ = 0;
    int bs = 0;
    for (int i = 0; i < g->n_workers; i++) {
        const gw_worker *w = &g->w[i];
        if (!w->alive || w->gone || !w->accepted) continue;
        waiting += w->waiting;
        running += w->running;
        total += (double)w->blocks_total;
        free_ += (double)w->blocks_free;
        if (w->block_size) bs = w->block_size;
    }
    char lab[300];
    snprintf(lab, sizeof lab, "{model_name=\"%s\"}", g->served[0] ? g->served : "unknown");
    gauge(o, "vllm:num_requests_waiting", "Requests waiting to be scheduled on the worker groups.", lab, waiting);
    gauge(o, "vllm:num_requests_running", "Requests running on the worker groups.", lab, running);
    gauge(o, "vllm:kv_cache_usage_perc", "KV cache usage of the worker groups, 0 to 1.", lab,
          total > 0 ? 1.0 - free_ / total : 0.0);
    /* the same under vLLM's older name, which endpoint pickers before GIE v1 read */
    gauge(o, "vllm:gpu_cache_usage_perc", "KV cache usage of the worker groups, 0 to 1 (vLLM's older name).", lab,
          total > 0 ? 1.0 - free_ / total : 0.0);
    /* the model-server protocol's LoRA gauge (GIE's endpoint picker reads it to route adapters): the adapters
     * with requests on a worker now (none waits here: the workers queue), max_lora the adapter slots a group
     * has (--max-loras, the largest of the groups'), as vLLM's; its value is the time, as vLLM's is */
    char run[1024] = "", lora[1300];
    int n_lora = 0;
    for (int i = 0; i < g->n_workers; i++)
        if (g->w[i].max_loras > n_lora) n_lora = g->w[i].max_loras;
    for (int i = 0; i < g->n_lora_run; i++)
        if (g->lora_run[i].n > 0 && strlen(run) + strlen(g->lora_run[i].name) + 2 < sizeof run)
            snprintf(run + strlen(run), sizeof run - strlen(run), "%s%s", run[0] ? "," : "", g->lora_run[i].name);
    snprintf(lora, sizeof lora, "{model_name=\"%s\",running_lora_adapters=\"%s\",waiting_lora_adapters=\"\","
             "max_lora=\"%d\"}", g->served[0] ? g->served : "unknown", run, n_lora);
    gauge(o, "vllm:lora_requests_info", "Running and waiting LoRA adapters.", lora, cm_wall_ms() / 1e3);
    /* speculative decoding, summed over the groups: vLLM's counters (prometheus_client adds _total) */
    uint64_t sd = 0, sdt = 0, sat = 0, pos[16] = {0};
    int npos = 0;
    for (int i = 0; i < g->n_workers; i++) {
        const gw_worker *w = &g->w[i];
        if (!w->accepted || w->gone) continue;
        sd += w->spec_drafts;
        sdt += w->spec_draft_tokens;
        sat += w->spec_accepted_tokens;
        for (int k = 0; k < w->n_spec_pos; k++) pos[k] += w->spec_pos[k];
        if (w->n_spec_pos > npos) npos = w->n_spec_pos;
    }
    counter_l(o, "vllm:spec_decode_num_drafts_total", "Speculative proposals verified.", lab, sd);
    counter_l(o, "vllm:spec_decode_num_draft_tokens_total", "Draft tokens proposed.", lab, sdt);
    counter_l(o, "vllm:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", lab, sat);
    evbuffer_add_printf(o, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Draft tokens accepted at each "
                           "position of a proposal.\n"
                           "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n");
    for (int k = 0; k < npos; k++)
        evbuffer_add_printf(o, "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"%s\",position=\"%d\"} %llu\n",
                            g->served[0] ? g->served : "unknown", k, (unsigned long long)pos[k]);
    char info[128];
    snprintf(info, sizeof info, "{block_size=\"%d\",num_gpu_blocks=\"%.0f\"}", bs, total);
    gauge(o, "vllm:cache_config_info", "Information of the KV cache configuration.", info, 1);
}

char *gw_metrics_text(const gw *g, size_t *len) {
    struct evbuffer *o = evbuffer_new();
    if (!o) return NULL;
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
    counter(o, "llmserve:disagg_prefill_requests_total",
            "Requests prefilled by a kv_producer group (their uncached prompt past --max-local-prefill-length).",
            g->m.disagg_prefills);
    counter(o, "llmserve:disagg_handoffs_total",
            "Disaggregated requests moved to their decode group after the first token.", g->m.disagg_handoffs);
    counter(o, "llmserve:disagg_idle_decodes_total",
            "Requests a kv_producer group decoded while it had no long prompt (--idle-decode).", g->m.disagg_guests);
    counter(o, "llmserve:disagg_idle_decodes_moved_total",
            "Of those, the streams moved to their decode group when a long prompt came.", g->m.disagg_moved);
    counter(o, "llmserve:resumed_total",
            "Streams whose worker group was lost after their first tokens, resumed on another after the output delivered.",
            g->m.resumed);
    counter(o, "llmserve:worker_lost_total", "Requests whose worker group died or restarted under them.", g->m.worker_lost);
    counter(o, "llmserve:overloaded_total", "Requests refused with 503 because the gateway or a group was full.",
            g->m.overloaded);
    if (g->conf.scache) { /* --semantic-cache */
        const gw_cache *c = &g->cache;
        evbuffer_add_printf(o, "# HELP llmserve:semantic_cache_hits_total Chat requests answered from the cache.\n"
                               "# TYPE llmserve:semantic_cache_hits_total counter\n"
                               "llmserve:semantic_cache_hits_total{kind=\"exact\"} %llu\n"
                               "llmserve:semantic_cache_hits_total{kind=\"semantic\"} %llu\n",
                            (unsigned long long)c->hits_exact, (unsigned long long)c->hits_semantic);
        counter(o, "llmserve:semantic_cache_misses_total", "Cacheable chat requests the cache could not answer.", c->misses);
        counter(o, "llmserve:semantic_cache_near_misses_total",
                "Misses whose nearest question was within 0.05 of the threshold.", c->near_misses);
        counter(o, "llmserve:semantic_cache_saved_prompt_tokens_total", "Prompt tokens not computed: answered from the cache.",
                c->saved_prompt_tokens);
        counter(o, "llmserve:semantic_cache_saved_completion_tokens_total",
                "Tokens not generated: answered from the cache.", c->saved_completion_tokens);
        counter(o, "llmserve:semantic_cache_evictions_total", "Answers dropped past --semantic-cache-size.", c->evictions);
        counter(o, "llmserve:semantic_cache_expired_total", "Answers dropped past --semantic-cache-ttl.", c->expired);
        gauge(o, "llmserve:semantic_cache_entries", "Answers in the cache.", "", c->n);
        gauge(o, "llmserve:semantic_cache_bytes", "Memory the cached answers and vectors hold.", "", (double)c->bytes);
    }
    if (g->rstore) { /* /v1/responses' store */
        gw_rstore_stats r;
        gw_rstore_stats_get(g->rstore, &r);
        counter(o, "llmserve:response_store_puts_total", "Responses stored (store: true).", r.puts);
        counter(o, "llmserve:response_store_gets_total", "Stored responses asked for (retrieve, previous_response_id).", r.gets);
        counter(o, "llmserve:response_store_deletes_total", "Stored responses deleted.", r.deletes);
        counter(o, "llmserve:response_store_errors_total",
                "Store operations that failed (Redis unreachable, past --response-store-timeout, refused).", r.errors);
        counter(o, "llmserve:response_store_evicted_total", "Memory store: responses dropped early by its bounds.", r.evicted);
        gauge(o, "llmserve:response_store_entries", "Memory store: responses held.", "", r.entries);
        gauge(o, "llmserve:response_store_bytes", "Memory store: bytes held.", "", (double)r.bytes);
    }
    if (g->jobs) { /* batch jobs */
        gw_jobs_stats b;
        gw_jobs_stats_get(g->jobs, &b);
        gauge(o, "llmserve:batches_running", "Batch jobs this gateway runs now.", "", b.running);
        gauge(o, "llmserve:batch_requests_pending", "Their requests not yet finished.", "", b.pending);
        evbuffer_add_printf(o, "# HELP llmserve:batch_requests_total Batch requests finished, by result.\n"
                               "# TYPE llmserve:batch_requests_total counter\n"
                               "llmserve:batch_requests_total{result=\"completed\"} %llu\n"
                               "llmserve:batch_requests_total{result=\"failed\"} %llu\n",
                            (unsigned long long)b.completed, (unsigned long long)b.failed);
        counter(o, "llmserve:batch_requests_retried_total", "Batch requests tried again after a 429 or 503.", b.retried);
    }
    if (g->http) {
        gauge(o, "llmserve:open_streams", "Streaming responses in progress.", "", gw_http_open_streams(g->http));
        gauge(o, "llmserve:http_connections_open", "Client connections open.", "", gw_http_open_connections(g->http));
        counter(o, "llmserve:http_connections_total", "Client connections accepted (requests over kept-alive ones are not).",
                gw_http_accepted(g->http));
    }
    gauge(o, "llmserve:preparing_requests", "Requests being parsed and tokenized off the event loop.", "", gw_tokq_queued(g->tokq));
    gauge(o, "llmserve:draining", "1 while the gateway drains after SIGTERM.", "", g->draining);
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
    GAUGE("worker_up", "1 when the worker group answers heartbeats and serves this gateway's model.",
          gw_pool_routable(g, i))
    evbuffer_add_printf(o, "# HELP llmserve:worker_kv_role The group's role in disaggregated prefill and decode.\n"
                           "# TYPE llmserve:worker_kv_role gauge\n");
    for (int i = 0; i < g->n_workers; i++)
        evbuffer_add_printf(o, "llmserve:worker_kv_role{worker=\"%s\",role=\"%s\"} 1\n", g->w[i].addr,
                            g->w[i].kv_role == LLMSERVE__KV_ROLE__KV_PRODUCER   ? "kv_producer"
                            : g->w[i].kv_role == LLMSERVE__KV_ROLE__KV_CONSUMER ? "kv_consumer"
                                                                                : "kv_both");
    GAUGE("num_requests_running", "Requests running on the worker group.", g->w[i].running)
    GAUGE("num_requests_waiting", "Requests waiting on the worker group.", g->w[i].waiting)
    GAUGE("gateway_inflight", "Requests this gateway has in flight on the group.", g->w[i].inflight)
    GAUGE("kv_cache_usage_perc", "KV cache usage, 0 to 1.",
          g->w[i].blocks_total ? 1.0 - (double)g->w[i].blocks_free / (double)g->w[i].blocks_total : 0.0)
    GAUGE("worker_rss_bytes", "Resident memory of the worker group's driver process.", g->w[i].rss_bytes)
    GAUGE("gpu_memory_used_bytes", "Device memory in use on the worker group's GPU (0 on CPU workers).",
          g->w[i].gpu_bytes)
    GAUGE("cached_blocks", "Prefix-cache blocks the router knows the group holds.", g->w[i].cached.n)
    GAUGE("cached_blocks_memory_tier", "Prefix-cache blocks the router knows are in the group's host-memory KV tier.",
          g->w[i].lower[0].n)
    GAUGE("cached_blocks_disk_tier", "Prefix-cache blocks the router knows are in the group's disk KV tier.",
          g->w[i].lower[1].n)
    WCOUNTER("prefix_cache_queries_total", "Prefix cache queries, in tokens.", g->w[i].prefix_queries)
    WCOUNTER("prefix_cache_hits_total", "Prefix cache hits, in tokens.", g->w[i].prefix_hits)
    WCOUNTER("num_preemptions_total", "Sequences preempted on the group.", g->w[i].preemptions)
    WCOUNTER("routed_total", "Requests routed to the group.", g->w[i].routed)
    WCOUNTER("worker_gateways_dropped_total", "Gateways the group stopped serving (no heartbeat, not reading).",
             g->w[i].gateways_dropped)
    WCOUNTER("worker_requests_aborted_on_drop_total", "Requests ended because the group dropped their gateway.",
             g->w[i].aborted_on_drop)
    WCOUNTER("worker_messages_refused_total", "Messages the group refused: malformed, or over its receive queue.",
             g->w[i].messages_refused)
#undef GAUGE
#undef WCOUNTER
    vllm_gauges(g, o);
    *len = evbuffer_get_length(o);
    char *out = malloc(*len + 1);
    if (out) {
        evbuffer_remove(o, out, *len);
        out[*len] = 0;
    }
    evbuffer_free(o);
    return out;
}
