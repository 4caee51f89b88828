/* gw_conf.h - the gateway's flags: one table, from which parsing, defaults,
 * --help and `llmserve serve`'s forwarding all come.
 *
 * Order of precedence: the table's defaults, then the environment
 * ($LLMSERVE_API_KEY adds one more key), then flags. A bad value is reported
 * with the flag's own name and what it expects. */
#ifndef GW_CONF_H
#define GW_CONF_H

#include <stddef.h>
#include <stdio.h>

enum { GW_ROUTE_PREFIX = 0, GW_ROUTE_LEAST_LOAD, GW_ROUTE_ROUND_ROBIN };

typedef struct {
    const char *host;
    int port;
    const char *workers, *workers_dns, *reply_address;
    const char *model;           /* override: tokenizer and template from this file instead of the workers */
    const char *load_format, *model_config, *served_name, *chat_template;
    const char **api_keys;       /* --api-key (repeatable) and LLMSERVE_API_KEY */
    int n_api_keys;
    const char *api_keys_file;
    const char *rpc_secret_file;
    double rps, tpm;
    int max_queue;
    double max_body;
    double header_timeout, body_timeout, ttft_timeout, request_timeout, idle_timeout, shutdown_timeout;
    int routing;
    double lambda;
    double tier_weight[2];       /* prefix routing: a token in a group's memory / disk KV tier, against one in its pool */
    int max_local_prefill;       /* disaggregated prefill: a prompt whose uncached part is longer goes to a prefill group */
    int idle_prefill_min;        /* and one at least this long while that group is idle and the decode group busy (0: off) */
    int idle_decode;             /* and it decodes there while the prefill group has fewer streams (moved on a long prompt) */
    int log_requests, log_prompts, log_level;
    int max_connections;         /* 0: from the file descriptor limit */
    int tokenizer_threads, tokenizer_queue;
    /* the response cache (gw_cache.h) */
    int scache, scache_size, scache_sampled;
    const char *context_overflow; /* error|truncate-left|middle-out */
    double scache_threshold, scache_ttl;
    const char *allowed_origins, *allowed_methods, *allowed_headers; /* CORS (gw_cors.h) */
    int allow_credentials;
    double startup_wait;         /* /health waits this long at the start for every group of --workers */
    const char *reasoning_parser; /* deepseek_r1 | qwen3: chat replies' think tags into reasoning_content */
    const char *response_store;  /* memory | redis://... (gw_rstore.h) */
    double response_store_ttl, response_store_bytes, response_store_timeout;
    int response_store_size;
    const char *files_dir;       /* /v1/files and /v1/batches (gw_files.h, gw_jobs.h) */
    int batch_concurrency;
} gw_conf;

/* One flag. serve: 1 when `llmserve serve` forwards it to its gateway. */
typedef struct {
    const char *name, *arg, *def, *help;
    int kind, serve;
    size_t off;
    double lo, hi;
} gw_flag;

extern const gw_flag gw_flags[];
extern const int gw_n_flags;

/* Defaults, environment, then argv. 0, 1 for --help (printed to stdout), or
 * 2 for a bad flag (said on stderr). Frees nothing: strings point into argv. */
int gw_conf_parse(gw_conf *c, int argc, char **argv);
void gw_conf_help(FILE *f);
void gw_conf_free(gw_conf *c);
/* The table entry of a long flag name, or NULL. */
const gw_flag *gw_conf_find(const char *name);

#endif
