#include "gw_conf.h"
#include "cm_log.h"
#include "cm_oai.h"
#include "cm_harmony.h"
#include "cm_parse.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

enum { K_STR, K_INT, K_DBL, K_ON, K_OFF, K_KEY, K_ROUTE, K_LOG, K_SIZE };

#define F(field) offsetof(gw_conf, field)
const gw_flag gw_flags[] = {
    {"host", "H", "127.0.0.1", "address to bind", K_STR, 1, F(host), 0, 0},
    {"port", "N", "8000", "HTTP port (0: one the kernel picks, logged)", K_INT, 1, F(port), 0, 65535},
    {"workers", "ADDR,...", "tcp://127.0.0.1:7600", "worker groups (tcp://HOST:PORT or ipc://PATH)", K_STR, 0, F(workers), 0, 0},
    {"workers-dns", "NAME:PORT", NULL, "every address NAME resolves to is a group, re-resolved every 10 s (a headless service)",
     K_STR, 0, F(workers_dns), 0, 0},
    {"reply-address", "ADDR", "tcp://127.0.0.1:0", "where workers send replies (port 0: an ephemeral one)", K_STR, 0,
     F(reply_address), 0, 0},
    {"model", "PATH", NULL, "override: take the tokenizer and chat template from this GGUF instead of the workers", K_STR, 0,
     F(model), 0, 0},
    {"load-format", "auto|dummy", "auto", "with --model-config: the stand-in tokenizer of dummy weights (override)", K_STR, 0,
     F(load_format), 0, 0},
    {"model-config", "SPEC", NULL, "dummy weights' shape (a preset or config.json), with --load-format dummy", K_STR, 0,
     F(model_config), 0, 0},
    {"served-model-name", "NAME", NULL, "the model's name in the API (default: as the workers name it)", K_STR, 1,
     F(served_name), 0, 0},
    {"chat-template", "NAME", NULL, "chatml|llama2|llama3|mistral|gemma|harmony (default: from the model)", K_STR, 1,
     F(chat_template), 0, 0},
    {"api-key", "KEY", NULL, "require this key (repeatable; also $LLMSERVE_API_KEY)", K_KEY, 1, F(api_keys), 0, 0},
    {"api-keys-file", "PATH", NULL, "require one of the keys in PATH, one per line (# comments)", K_STR, 1, F(api_keys_file), 0, 0},
    {"rpc-secret-file", "PATH", NULL, "a secret shared with the worker groups, on every message both ways (chmod 600)",
     K_STR, 1, F(rpc_secret_file), 0, 0},
    {"rate-limit-rps", "R", "0", "requests per second, per key and global (0: off)", K_DBL, 1, F(rps), 0, 1e9},
    {"rate-limit-tpm", "T", "0", "prompt + max tokens per minute, per key and global (0: off)", K_DBL, 1, F(tpm), 0, 1e15},
    {"max-queue", "N", "512", "requests in flight per worker group before 429", K_INT, 1, F(max_queue), 0, 1 << 24},
    {"max-body-bytes", "N", "8388608", "largest request body (beyond: 413)", K_SIZE, 1, F(max_body), 1024, 1 << 30},
    {"header-timeout", "S", "30", "deadline for a request's whole header", K_DBL, 1, F(header_timeout), 0.01, 86400},
    {"body-timeout", "S", "60", "deadline for a request's body, after its header", K_DBL, 1, F(body_timeout), 0.01, 86400},
    {"ttft-timeout", "S", "0", "time to first token before 504 (0: off)", K_DBL, 1, F(ttft_timeout), 0, 86400},
    {"request-timeout", "S", "600", "whole request (0: off)", K_DBL, 1, F(request_timeout), 0, 86400 * 7},
    {"idle-timeout", "S", "60", "gap between streamed tokens (0: off)", K_DBL, 1, F(idle_timeout), 0, 86400},
    {"reasoning-parser", "NAME", NULL, "deepseek_r1|qwen3 (vLLM's names): the reply's reasoning (its think tags) goes to "
     "reasoning_content, the rest to content", K_STR, 1, F(reasoning_parser), 0, 0},
    {"response-store", "URL", "memory", "where /v1/responses keeps stored responses: memory (this gateway's, bounded) or "
     "redis://[:PASSWORD@]HOST[:PORT][/DB] (shared by every gateway that names it)", K_STR, 1, F(response_store), 0, 0},
    {"response-store-ttl", "S", "86400", "stored responses expire after S", K_DBL, 1, F(response_store_ttl), 1, 86400.0 * 3650},
    {"response-store-size", "N", "10000", "the memory store holds at most N responses (the oldest go first)", K_INT, 1,
     F(response_store_size), 1, 1 << 24},
    {"response-store-bytes", "N", "268435456", "and at most N bytes of them", K_SIZE, 1, F(response_store_bytes), 4096,
     1099511627776.0},
    {"response-store-timeout", "S", "5", "Redis: each store operation's deadline (then 503)", K_DBL, 1,
     F(response_store_timeout), 0.01, 3600},
    {"files-dir", "DIR", NULL, "where /v1/files and /v1/batches keep files and batch jobs (default $TMPDIR/llmserve-files; "
     "share one volume between the gateways of a cluster)", K_STR, 1, F(files_dir), 0, 0},
    {"batch-concurrency", "N", "4", "requests of batch jobs in flight at once from this gateway (at priority 1, after "
     "interactive ones)", K_INT, 1, F(batch_concurrency), 1, 4096},
    {"startup-wait", "S", "600", "at the start, /health and /ready answer 503 (loading) until every group of --workers has "
     "its model up (or refused), for up to S", K_DBL, 1, F(startup_wait), 0, 86400},
    {"shutdown-timeout", "S", "30", "on SIGTERM, let in-flight requests finish for up to S", K_DBL, 1, F(shutdown_timeout), 0,
     86400},
    {"routing", "prefix|least-load|round-robin", "prefix", "how a worker group is picked", K_ROUTE, 1, F(routing), 0, 0},
    {"route-lambda", "L", "64", "prefix routing: tokens of cache worth one queued request", K_DBL, 1, F(lambda), 0, 1e9},
    {"route-memory-tier-weight", "W", "0.8", "prefix routing: what a token cached in a group's host-memory KV tier is worth "
     "against one in its KV pool (1)", K_DBL, 1, F(tier_weight[0]), 0, 1},
    {"route-disk-tier-weight", "W", "0.5", "prefix routing: the same for its disk KV tier", K_DBL, 1, F(tier_weight[1]), 0,
     1},
    {"max-local-prefill-length", "N", "1000", "disaggregated prefill and decode (Dynamo's name): a prompt whose part the "
     "decode group has not cached is longer than N tokens is prefilled by a kv_producer group, which sends its KV to that "
     "decode group; shorter ones are prefilled where they decode", K_INT, 0, F(max_local_prefill), 0, 1 << 30},
    {"idle-prefill-min-length", "N", "32", "disaggregated prefill and decode: a shorter prompt (at least N uncached "
     "tokens) goes to a kv_producer group too while that group has no long prompt to compute and the decode group is "
     "busy, so the decode group only decodes (0: never)", K_INT, 0, F(idle_prefill_min), 0, 1 << 30},
    {"idle-decode", "0|1", "1", "disaggregated prefill and decode: such a prompt stays on the kv_producer group and "
     "decodes there while it holds fewer of this gateway's streams than the decode group (its free core decodes too); "
     "a long prompt sent there moves them to their decode group first, their prompts' KV sent ahead", K_INT, 0,
     F(idle_decode), 0, 1},
    {"max-connections", "N", "0", "open client connections (0: the file descriptor limit less a reserve)", K_INT, 1,
     F(max_connections), 0, 1 << 24},
    {"allowed-origins", "LIST", "*", "CORS: origins a browser may call from (a JSON list as vLLM takes it, or a comma list; "
     "* any)", K_STR, 1, F(allowed_origins), 0, 0},
    {"allowed-methods", "LIST", "*", "CORS: methods a preflight allows (* any)", K_STR, 1, F(allowed_methods), 0, 0},
    {"allowed-headers", "LIST", "*", "CORS: request headers a preflight allows (* any)", K_STR, 1, F(allowed_headers), 0, 0},
    {"allow-credentials", NULL, NULL, "CORS: allow credentials (the reply names the origin, never *)", K_ON, 1,
     F(allow_credentials), 0, 0},
    {"tokenizer-threads", "N", "2", "threads that parse, template and tokenize off the event loop", K_INT, 1,
     F(tokenizer_threads), 1, 256},
    {"tokenizer-queue", "N", "256", "requests waiting for a tokenizer thread before 503", K_INT, 1, F(tokenizer_queue), 1,
     1 << 20},
    {"context-overflow", "error|truncate-left|middle-out|summarize", "error", "a chat history longer than the context: "
     "refuse it (400), drop the oldest turns, drop the turns after the first exchange, or put the served model's summary "
     "of those in their place; the system prompt and the newest turn stay (a request's context_overflow overrides)",
     K_STR, 1, F(context_overflow), 0, 0},
    {"semantic-cache", NULL, NULL, "reuse answers to chat requests: exact repeats of the last user turn, and with an "
     "embedding model (--embedding-model) similar ones; per API key, parameters and context", K_ON, 1, F(scache), 0, 0},
    {"semantic-cache-threshold", "C", "0.90", "cosine of the last user turns' embeddings that counts as the same question "
     "(docs/tuning.md: its false-hit rate)", K_DBL, 1, F(scache_threshold), 0, 1},
    {"semantic-cache-ttl", "S", "3600", "seconds an answer is reused (0: until evicted)", K_DBL, 1, F(scache_ttl), 0, 1e9},
    {"semantic-cache-size", "N", "10000", "answers kept, least recently used out (each lookup scans its scope: 0.7 ms at "
     "10000 on a 2-core EPYC, docs/tuning.md)", K_INT, 1, F(scache_size), 1, 20000},
    {"semantic-cache-sampled", NULL, NULL, "cache answers to requests with temperature > 0 too (by default only greedy "
     "ones: a sampled answer is one of many)", K_ON, 1, F(scache_sampled), 0, 0},
    {"log-requests", NULL, NULL, "one access-log line per request (default)", K_ON, 0, F(log_requests), 0, 0},
    {"no-log-requests", NULL, NULL, "no access log", K_OFF, 0, F(log_requests), 0, 0},
    {"log-prompts", NULL, NULL, "put the first 200 bytes of each prompt in the access log", K_ON, 0, F(log_prompts), 0, 0},
    {"log-level", "L", "info", "error|warn|info|debug", K_LOG, 1, F(log_level), 0, 0},
};
#undef F
const int gw_n_flags = (int)(sizeof gw_flags / sizeof gw_flags[0]);

const gw_flag *gw_conf_find(const char *name) {
    for (int i = 0; i < gw_n_flags; i++)
        if (!strcmp(gw_flags[i].name, name)) return &gw_flags[i];
    return NULL;
}

static int set_flag(gw_conf *c, const gw_flag *f, const char *v) {
    char *p = (char *)c + f->off;
    int lvl;
    switch (f->kind) {
    case K_STR: *(const char **)p = v; return 0;
    case K_ON: *(int *)p = 1; return 0;
    case K_OFF: *(int *)p = 0; return 0;
    case K_INT:
    case K_DBL:
    case K_SIZE: {
        char flag[48];
        snprintf(flag, sizeof flag, "--%s", f->name);
        long l;
        if (f->kind == K_INT) return cm_parse_int(flag, v, (int)f->lo, (int)f->hi, (int *)p) ? 2 : 0;
        if (f->kind == K_DBL) return cm_parse_double(flag, v, f->lo, f->hi, (double *)p) ? 2 : 0;
        if (cm_parse_long(flag, v, (long)f->lo, (long)f->hi, &l)) return 2;
        *(double *)p = (double)l;
        return 0;
    }
    case K_KEY: {
        const char **k = realloc((void *)c->api_keys, sizeof *k * (size_t)(c->n_api_keys + 1));
        if (!k) return 2;
        k[c->n_api_keys++] = v;
        c->api_keys = k;
        return 0;
    }
    case K_ROUTE:
        if (!strcmp(v, "prefix")) c->routing = GW_ROUTE_PREFIX;
        else if (!strcmp(v, "least-load")) c->routing = GW_ROUTE_LEAST_LOAD;
        else if (!strcmp(v, "round-robin")) c->routing = GW_ROUTE_ROUND_ROBIN;
        else break;
        return 0;
    case K_LOG:
        if (cm_log_parse_level(v, &lvl)) break;
        c->log_level = lvl;
        return 0;
    }
    fprintf(stderr, "llmserve-gateway: --%s expects %s, not '%s'\n", f->name, f->arg, v);
    return 2;
}

void gw_conf_help(FILE *out) {
    fprintf(out, "usage: llmserve-gateway [flags]\n"
                 "The OpenAI API in front of worker groups. It needs no model file: the workers' handshake\n"
                 "carries the tokenizer, chat template and context length.\n");
    for (int i = 0; i < gw_n_flags; i++) {
        const gw_flag *f = &gw_flags[i];
        char lhs[64];
        snprintf(lhs, sizeof lhs, "--%s%s%s", f->name, f->arg ? " " : "", f->arg ? f->arg : "");
        fprintf(out, "  %-28s %s", lhs, f->help);
        if (f->def && f->kind != K_KEY) fprintf(out, " (default %s)", f->def);
        fputc('\n', out);
    }
}

int gw_conf_parse(gw_conf *c, int argc, char **argv) {
    memset(c, 0, sizeof *c);
    c->log_requests = 1;
    c->log_level = CM_LOG_INFO;
    for (int i = 0; i < gw_n_flags; i++)
        if (gw_flags[i].def && set_flag(c, &gw_flags[i], gw_flags[i].def)) return 2;
    const char *env = getenv("LLMSERVE_API_KEY");
    if (env && *env && set_flag(c, gw_conf_find("api-key"), env)) return 2;
    struct option lo[sizeof gw_flags / sizeof gw_flags[0] + 2];
    for (int i = 0; i < gw_n_flags; i++)
        lo[i] = (struct option){gw_flags[i].name, gw_flags[i].arg ? required_argument : no_argument, 0, 1000 + i};
    lo[gw_n_flags] = (struct option){"help", no_argument, 0, 'h'};
    lo[gw_n_flags + 1] = (struct option){0, 0, 0, 0};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (ch == 'h') {
            gw_conf_help(stdout);
            return 1;
        }
        if (ch < 1000) {
            fprintf(stderr, "llmserve-gateway: see --help for the flags\n");
            return 2;
        }
        if (set_flag(c, &gw_flags[ch - 1000], optarg ? optarg : "")) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "llmserve-gateway: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (cm_oai_overflow_parse(c->context_overflow) < 0) {
        fprintf(stderr, "llmserve-gateway: --context-overflow expects error, truncate-left, middle-out or summarize, not '%s'\n",
                c->context_overflow);
        return 2;
    }
    if (c->reasoning_parser && cm_reason_parser(c->reasoning_parser) < 0) {
        fprintf(stderr, "llmserve-gateway: --reasoning-parser expects deepseek_r1 or qwen3, not '%s'\n", c->reasoning_parser);
        return 2;
    }
    int dummy = !strcmp(c->load_format, "dummy");
    if ((!dummy && strcmp(c->load_format, "auto")) || dummy != (c->model_config != NULL)) {
        fprintf(stderr, "llmserve-gateway: --load-format dummy and --model-config SPEC go together (load format '%s')\n",
                c->load_format);
        return 2;
    }
    if (c->model && dummy) {
        fprintf(stderr, "llmserve-gateway: --model and --load-format dummy are two different overrides: give one\n");
        return 2;
    }
    return 0;
}

void gw_conf_free(gw_conf *c) {
    free((void *)c->api_keys);
    c->api_keys = NULL;
}
