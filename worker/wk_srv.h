/* wk_srv.h - the worker server's insides, shared by its files (the
 * contract is wk_server.h). Along a message's flow:
 *
 *   wk_srv_rx.c      the receive thread queues decoded messages; the loop
 *                    drains the queue and dispatches each
 *   wk_srv_gen.c     the generate wire: Generate in, TokenChunks and KV
 *                    events out; the generation backend
 *   wk_srv_embed.c   the embed wire: Embed in, EmbedResult out; the
 *                    embedding backend
 *   wk_srv_kv.c      disaggregated prefill and decode: KV blocks pushed to
 *                    a decode group after each step, adopted there
 *   wk_srv_peers.c   the gateways (Hello, heartbeats, drops, Health,
 *                    ModelInfo, Stats) and the request slots
 *   wk_server.c      the loop: drain, step, flush, and the shutdown
 *
 * The loop calls the backend only through its wk_backend table, so no file
 * but the backend's own knows whether it serves generation or embeddings.
 * Threads: the loop owns the backend; the receive and heartbeat threads
 * touch only what mu guards (the gateway table, the queue, snap). */
#ifndef WK_SRV_H
#define WK_SRV_H

#include "cm_idmap.h"
#include "cm_time.h"
#include "pr_wire.h"
#include "wk_embed.h"
#include "wk_engine.h"
#include "wk_server.h"

#include <pthread.h>
#include <stdint.h>

#define MAX_GATEWAYS 256
#define SLOT_BITS 20
/* Queued messages: Generates beyond RX_CAP are refused at once (the gateway
 * retries elsewhere); anything beyond RX_HARD_CAP is dropped and counted. */
#define RX_CAP 16384
#define RX_HARD_CAP 65536

typedef struct {
    int used;
    char id[128], reply[256], tag[64];
    nng_socket push;
    int64_t last_heard;
    int snapshot_due;            /* send every cached key with the next events */
    int drop_due;                /* its send buffer filled (maybe on the heartbeat thread): the loop drops it */
    cm_idmap reqs;               /* its request id -> slot index + 1 */
    /* a dropped gateway's socket, kept open a moment so the reports of its ended requests go out
     * (NNG discards what a closed socket still queues); closed at linger_until */
    nng_socket linger;
    int64_t linger_until;
} gateway;

/* One request in flight: its gateway's id for it (rid) and the backend's (eid). */
typedef struct {
    int used, gw, timed_out;
    uint64_t rid, eid;
    uint32_t seq;
    int64_t deadline_ms;
    int reserved;                /* made by wk_srv_slot_new, not started yet */
    int next_free;               /* the free list (index + 1), while neither */
} slot;

/* Why a request ends before its answer (wk_backend.end). */
enum { WK_END_CANCEL, WK_END_DEADLINE, WK_END_DROP, WK_END_SHUTDOWN };

typedef struct server server;

/* What serves the requests: the generation engine or the embedding queue. */
typedef struct wk_backend {
    int task;                                         /* LLMSERVE__TASK__TASK_GENERATE or _EMBED */
    int (*has_work)(const server *s);
    int (*step)(server *s);                           /* one step; < 0: the device or a rank failed */
    int (*idle)(server *s);                           /* a turn with no step (NULL: nothing); < 0: a rank failed */
    /* Ends sl's request now (why: WK_END_*; msg: a drop's reason, told to
     * its gateway); the slot is freed now or with the request's last output. */
    void (*end)(server *s, slot *sl, int why, const char *msg);
    void (*flush)(server *s);                         /* what the last step produced, to the gateways (under mu) */
    void (*stats)(const server *s, wk_engine_stats *es);
    /* The rest of Stats only this backend has (NULL: none); pos holds the per-position counts. */
    void (*stats_extra)(const server *s, const wk_engine_stats *es, Llmserve__Stats *st, uint64_t *pos);
} wk_backend;

extern const wk_backend wk_srv_generate_backend, wk_srv_embed_backend;

typedef struct rxmsg {
    struct rxmsg *next;
    pr_env *env;
    int64_t held_since;          /* a decode Generate waiting for its KV transfer (wk_srv_rx.c): since when */
} rxmsg;

/* Disaggregated prefill and decode (wk_srv_kv.c): the loop thread's counts. */
#define WK_KV_BUCKETS 8
extern const double wk_kv_bucket_ms[WK_KV_BUCKETS - 1]; /* the transfer histogram's bounds */
typedef struct {
    uint64_t sent_blocks, sent_bytes, recv_blocks, recv_bytes;
    uint64_t sent_done, recv_done;   /* transfers ended (their last message) */
    uint64_t wait_expired;           /* decode requests that stopped waiting for their transfer */
    uint64_t refused, send_failed;   /* blocks refused here; transfers not sent */
    double ms_sum;                   /* received transfers, sender's start to last message */
    uint64_t ms_bucket[WK_KV_BUCKETS];
} wk_srv_kv_stats;
/* A decode Generate waits this long for its transfer's last message, then computes what is missing. */
#define WK_KV_WAIT_MS 2000

struct server {
    const wk_backend *be;
    wk_engine *e;                /* a generation group's engine, or NULL */
    wk_embed *eq;                /* an embedding group's request queue, or NULL */
    int embed_dim;
    uint64_t embed_finished;
    const wk_server_opts *o;
    nng_socket pull;
    gateway gw[MAX_GATEWAYS];
    slot *slots;
    int n_slots, cap_slots, live, free_slot;
    uint64_t counter;
    float step_ms[1024];
    int n_step, step_at;
    uint64_t dropped;
    /* The heartbeat thread sends Health to every gateway each second, so a
     * long step never looks like a dead worker. It never touches the engine:
     * the loop thread owns it. Everything that touches the gateway table
     * holds mu; the thread reads stats from snap, which the loop refreshes
     * between steps, and the model's facts from the copies below. */
    pthread_mutex_t mu;
    Llmserve__Stats snap;
    uint64_t spec_pos_snap[WK_SPEC_MAX_K]; /* snap's accepted-per-position counts (under mu) */
    uint64_t spec_pos[WK_SPEC_MAX_K];      /* the loop thread's, for the Stats it sends itself */
    int64_t last_progress;
    _Atomic int hb_stop;         /* set by the loop thread, read by the heartbeat thread */
    int max_model_len, block_size, vocab, tp;
    uint64_t incarnation;        /* random per process: gateways see a restart as a new value */
    unsigned lora_version;       /* the model's, as the loop last saw it (Health reads it: __atomic) */
    uint8_t *tok_gguf;           /* the tokenizer for ModelInfo (cm_tok_export) */
    size_t tok_len;
    uint64_t tok_fp;
    int draining;                /* SIGTERM: no new requests, running ones finish */
    /* The receiving thread decodes every message as it arrives, notes that
     * its gateway is alive, and queues it (under mu); the loop drains the
     * whole queue before each step. So control messages wait for at most one
     * step, never for one message per step. */
    pthread_t rx;
    pthread_cond_t rx_cv;
    struct rxmsg *rx_head, *rx_tail;
    int rx_n;
    _Atomic int rx_stop;
    uint64_t rx_refused;         /* Generates refused: the queue was full */
    uint64_t gw_dropped, aborted_on_drop;
    uint64_t bad_since;          /* refused messages since the last log line */
    int64_t bad_logged;
    struct wk_srv_kv *kv;        /* KV transfers (a generation group's; wk_srv_kv.c) */
    wk_srv_kv_stats kvst;
    rxmsg *held;                 /* decode Generates waiting for their transfer, oldest first */
};

static inline int64_t now_ms(void) { return (int64_t)(cm_now() * 1e3); }

/* ---- gateways and slots (wk_srv_peers.c) --------------------------------- */
gateway *wk_srv_find_gw(server *s, const char *id);
/* The gateway a Generate or Embed comes from, registered from its reply
 * address when unknown (dropped earlier, or its Hello was lost): its index,
 * or -1 (counted as dropped). */
int wk_srv_gateway_for(server *s, const char *id, const char *reply);
slot *wk_srv_find_req(server *s, int gw, uint64_t rid);
slot *wk_srv_slot_of(server *s, uint64_t eid);
/* A slot reserved for gateway gw's request rid, its eid made; NULL when none is left. */
slot *wk_srv_slot_new(server *s, int gw, uint64_t rid);
/* The reserved slot's request runs: found by id from now on. */
void wk_srv_slot_start(server *s, slot *sl, int64_t deadline_ms);
/* A running or reserved slot goes back to the free list. */
void wk_srv_slot_free(server *s, slot *sl);
/* Sends to a gateway without blocking the engine. A gateway whose buffer is
 * full has stopped reading: it loses its requests rather than stalling all. */
void wk_srv_send(server *s, int g, pr_env *env);
void wk_srv_send_error_chunk(server *s, int g, uint64_t rid, int code, const char *msg, int finish);
void wk_srv_send_embed_error(server *s, int g, uint64_t rid, int code, const char *msg);
/* A second request under a running one's id: the running one (sl) ends with
 * the error, in its own sequence, so the gateway's client sees it. */
void wk_srv_refuse_duplicate(server *s, slot *sl);
/* Loop thread only: drops the gateways whose buffers filled. */
void wk_srv_apply_drops(server *s);
/* st as Prometheus text (the probes' GET /metrics) into b: its length (at most cap). */
size_t wk_srv_metrics_text(const server *s, const Llmserve__Stats *st, char *b, size_t cap);
/* pos: where the accepted-per-position counts live while st is in use. */
void wk_srv_fill_stats(server *s, Llmserve__Stats *st, uint64_t *pos);
void wk_srv_on_hello(server *s, const Llmserve__Hello *h);
void wk_srv_on_model_info(server *s, const Llmserve__ModelInfoRequest *r);
void wk_srv_on_stats_request(server *s, const Llmserve__StatsRequest *r);
/* Silent gateways dropped, requests past their deadlines ended. */
void wk_srv_check_timeouts(server *s);
/* Closes the dropped gateways' sockets whose moment to flush ended by t (INT64_MAX: all of them). */
void wk_srv_close_lingering(server *s, int64_t t);
/* The heartbeat thread. */
void *wk_srv_heartbeat(void *arg);
/* The group is going down: every gateway hears it for each of its requests now. */
void wk_srv_tell_going(server *s, const char *why);

/* ---- KV transfers (wk_srv_kv.c) ------------------------------------------ */
int wk_srv_kv_start(server *s);
void wk_srv_kv_stop(server *s);
/* kv_push_address's form: 0 or LLM_EINVAL with the reason. */
int wk_srv_kv_check_address(const char *a, char *err, size_t errlen);
/* Prefill side: sl's request (tok[0..n), salt) sends its blocks to g's kv_push_address under g's kv_transfer_id. */
int wk_srv_kv_track(server *s, const slot *sl, const Llmserve__Generate *g, const int32_t *tok, int n, uint64_t salt);
/* After a step, before its outputs o[0..n) go out: what each tracked request has committed since, and the last
 * message of those that ended. */
void wk_srv_kv_push(server *s, const wk_output *o, int n);
/* Decode side: blocks received, adopted. */
void wk_srv_kv_on_transfer(server *s, const Llmserve__KvTransfer *t);
/* 1 when transfer id has ended here (its last message came). */
int wk_srv_kv_ready(server *s, uint64_t id);
/* The kv_xfer_* counts and the role into st (what /metrics shows: wk_srv_peers.c). */
void wk_srv_kv_stats_fill(const server *s, Llmserve__Stats *st);

/* ---- the receive side (wk_srv_rx.c) ------------------------------------- */
void *wk_srv_receiver(void *arg);
/* Loop thread, under mu: everything queued, in arrival order. When idle and
 * nothing is queued, waits up to 50 ms for a message first. */
void wk_srv_drain_queue(server *s, int idle);
/* Frees the Generates still held for their KV (the loop's end). */
void wk_srv_free_held(server *s);

/* ---- the wires ----------------------------------------------------------- */
void wk_srv_on_generate(server *s, const Llmserve__Generate *g); /* wk_srv_gen.c */
void wk_srv_on_lora_update(server *s, const Llmserve__LoraUpdate *u); /* wk_srv_gen.c */
size_t wk_srv_lora_names(server *s, char **names, size_t max); /* wk_srv_peers.c: the live adapters */
void wk_srv_on_embed(server *s, const Llmserve__Embed *m);       /* wk_srv_embed.c */
/* Two short requests, start to end, before the first client (wk_srv_gen.c). */
int wk_srv_warm_up(wk_engine *e, char *err, size_t errlen);

#endif
