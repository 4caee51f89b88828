/* gw.h - the gateway's state, shared by its modules.
 *
 * One libevent loop owns everything here: HTTP (gw_http), worker sockets
 * (gw_pool: NNG's receive fd wakes the loop), requests (gw_req), limits and
 * metrics. The only other threads are gw_tokq's, which prepare requests and
 * read nothing but their job and a gw_model they hold a reference on. */
#ifndef GW_H
#define GW_H

#include "cm_gguf.h"
#include "cm_time.h"
#include "cm_tokenizer.h"
#include "gw_auth.h"
#include "gw_cors.h"
#include "gw_cache.h"
#include "gw_conf.h"
#include "gw_hist.h"
#include "gw_keyset.h"
#include "gw_limit.h"
#include "cm_idmap.h"
#include "pr_wire.h"

#include <event2/event.h>
#include <stdint.h>

#define GW_MAX_WORKERS 64

/* What the gateway serves: a tokenizer and chat template, from the workers'
 * ModelInfo or from an override (--model, --load-format dummy). Shared with
 * the tokenizer threads by reference count; never changed once made. */
#define GW_LORA_LIST 4160 /* 64 adapter names of up to 63 characters, newline-separated */

typedef struct {
    int refs;                    /* atomic */
    cm_tokenizer *tok;
    uint64_t fp;                 /* cm_tok_fingerprint */
    int chat_kind;
    char *default_system;
    int override;                /* from a flag, not from a worker */
} gw_model;

gw_model *gw_model_ref(gw_model *m);
void gw_model_unref(gw_model *m);
/* Takes tok. chat_template: a name to force, or NULL for the tokenizer's own. */
int gw_model_make(cm_tokenizer *tok, const char *chat_template, int override, gw_model **out, char *err, size_t errlen);

typedef struct {
    char addr[256];
    nng_socket push;
    int alive;                   /* Health seen within the liveness window */
    int ready;                   /* the worker takes new requests (not loading, not draining) */
    int accepted;                /* its model matches ours (name and tokenizer) */
    int task;                    /* what it serves: LLMSERVE__TASK__TASK_GENERATE or _EMBED (Health.task) */
    int embed_dim;               /* an embedding group's vector length */
    int gone;                    /* left --workers-dns: never routed to again */
    char refused[256];           /* why it is not used, when it serves something else */
    double last_health, down_until, backoff, info_asked;
    uint64_t incarnation, tok_fp;
    char model[128], worker_id[128];
    char loras[GW_LORA_LIST];    /* its LoRA adapters (ModelInfo), "\nNAME\nNAME\n", or "" */
    unsigned lora_version;       /* the version of that list (Health tells when it changes) */
    int max_loras;               /* its adapter slots (--max-loras; 0: LoRA off) */
    int max_model_len, block_size, vocab;
    int kv_role;                 /* disaggregated prefill and decode: LLMSERVE__KV_ROLE__* (Health.kv_role) */
    int running, waiting, inflight;
    int prefill_tokens;          /* kv_producer: the prompt tokens this gateway's requests have it prefill now */
    uint64_t prefix_queries, prefix_hits, preemptions, blocks_total, blocks_free, rss_bytes, gpu_bytes;
    uint64_t gateways_dropped, aborted_on_drop, messages_refused; /* the group's own counts, all its gateways */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens, spec_pos[16]; /* speculative decoding */
    int n_spec_pos;
    gw_keyset cached;            /* prefix blocks in the group's KV pool */
    gw_keyset lower[2];          /* and in its lower tiers: host memory, disk (worth less to the router) */
    uint64_t routed, routed_hit_tokens;
    int idx, wake_fd;            /* its index, and where its connection's loss is told (from an NNG thread) */
} gw_worker;

typedef struct {
    uint64_t requests[6];        /* by status class: 2xx 4xx(other) 401 429 5xx 504 */
    uint64_t prompt_tokens, completion_tokens, rate_limited, timed_out, cancelled, retried, resumed, worker_lost, overloaded;
    uint64_t disagg_prefills, disagg_handoffs; /* requests sent to a prefill group; moved on to their decode group */
    uint64_t disagg_guests, disagg_moved;      /* decoded on a prefill group (--idle-decode); moved off it by a long prompt */
    gw_hist ttft, itl, e2e, queue;
} gw_metrics;

struct gw_http;
struct gw_tokq;
struct gw_pool_ops;
struct gw_req;
struct gw_lora_op;
struct gw_rstore;
struct gw_jobs;

typedef struct gw {
    unsigned long long bad_msgs; /* undecodable or unauthenticated messages since the last log line */
    double bad_logged;
    unsigned long quiet_401;     /* 401s since the last warning line (one a second at most) */
    double logged_401;
    struct event *tail_401;      /* reports the rest of a burst once it is over */
    gw_conf conf;
    gw_auth auth;
    gw_cors cors;
    gw_limits lim;
    gw_metrics m;
    struct event_base *base;
    struct gw_http *http;
    struct gw_tokq *tokq;
    struct gw_rstore *rstore;    /* stored Responses (gw_rstore.h) */
    struct gw_jobs *jobs;        /* batch jobs (gw_jobs.h) */
    char files_dir[4096];        /* --files-dir, or its default */
    char files_off[300];         /* why files and batches are off (the folder could not be made), or "" */
    char internal_token[72];     /* the bearer of this gateway's own requests (batch jobs): random at start */
    /* the model */
    gw_model *model;             /* NULL until a worker's ModelInfo (or an override) */
    char served[256];            /* the API's model name ("" until known) */
    char loras[GW_LORA_LIST];    /* the adapters the accepted groups serve, as gw_worker.loras: model names too */
    struct { char name[64]; int n; } lora_run[64]; /* requests of each adapter on a worker (gw_req_join/leave) */
    int n_lora_run;
    struct gw_lora_op *lora_ops; /* run-time adapter loads and unloads waiting on groups (gw_lora) */
    uint64_t lora_op_seq;
    int max_model_len;           /* smallest of the usable groups' */
    double settled_at;           /* last time an accepted group was alive: the model holds GW_MODEL_HOLD_S past it */
    /* the embedding model, when some groups serve one (Health.task = TASK_EMBED): the first such
     * group's, which the others must match; /v1/embeddings routes by its name */
    gw_model *emodel;
    char eserved[256];
    int emax_len, edim;
    gw_cache cache;              /* --semantic-cache (its dim is set by the first embedding model) */
    gw_sums sums;                /* context_overflow summarize: the last summaries (gw_cache.h) */
    /* workers (gw_pool) */
    const struct gw_pool_ops *pool_ops; /* what the pool hands up (gw_life registers it) */
    gw_worker w[GW_MAX_WORKERS];
    int n_workers, rr, tick;
    char dns_name[256], dns_port[16];
    int ready_once;              /* /health has said ready: the groups of --workers settled since (gw_oai.c) */
    double started;              /* when the gateway started (cm_now) */
    nng_socket pull;
    char reply[256], id[64];
    struct event *recv_ev, *tick_ev, *lost_ev;
    int lost_pipe[2], lost_pipe_ok; /* a group's connection closed: its index, one byte, from NNG's pipe callback */
    /* requests (gw_req) */
    cm_idmap reqs;                 /* rid -> gw_req */
    struct gw_req *req_list;     /* every live request, for worker loss and drain */
    uint64_t next_rid;
    /* lifecycle */
    int draining;
    double drain_deadline;
    struct event *drain_ev;
} gw;


#endif
