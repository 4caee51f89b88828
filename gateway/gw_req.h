/* gw_req.h - a request's life in the gateway, from admission to its one end.
 *
 * Requests are found by id through a map; each has one deadline timer (time
 * to first token, whole request, stream idle, and a look for a hung-up
 * client). Every failure goes through gw_req_retry, which decides between
 * another worker group (nothing sent to the client yet) and an end; every
 * end goes through gw_req_finish, which answers the client (a JSON body, an
 * error, or the stream's last events), cancels the request on its worker if
 * it may still run there, logs, counts and frees. */
#ifndef GW_REQ_H
#define GW_REQ_H

#include "cm_oai.h"
#include "cm_oai_resp.h"
#include "gw.h"
#include "pr_wire.h"

struct gw_conn;
struct gw_req;

/* Where a semantic-cache probe's answer goes (gw_embed_probe): the vector, or NULL. */
typedef void (*gw_probe_fn)(gw *g, struct gw_req *q, const float *vec, int dim);

/* What differs between request kinds, as nginx's upstream callbacks do: the
 * kind's way to a worker group, its own state and its own part of the end.
 * gw_req_start, gw_req_retry, gw_req_on_chunk and gw_req_finish go through
 * it and never name a feature. A request with no ops is a generation
 * (gw_req_generate_ops). */
typedef struct gw_req_ops {
    /* A group for q other than exclude (-1: none excluded), or -1; *hit: the cached prefix it holds. */
    int (*pick)(gw *g, struct gw_req *q, int exclude, int *hit);
    /* Sends q to group wi: 0 or the send's error. */
    int (*send)(gw *g, struct gw_req *q, int wi);
    /* Once q has its id, before the first send: its answer's start (gw_req_start's). May be NULL. */
    void (*begin)(struct gw_req *q);
    /* A piece of the answer's text as it streams to the client. May be NULL. */
    void (*on_text)(struct gw_req *q, const char *text, size_t len);
    /* q ends with status (and, for an error, msg and code), before its answer goes out. May be NULL. */
    void (*on_end)(struct gw_req *q, int status, const char *msg, const char *code);
    /* Frees q->x, the kind's own state. May be NULL (nothing owned). */
    void (*release)(struct gw_req *q);
    const char *id_prefix; /* its response ids: "<prefix>-..."; NULL: chatcmpl or cmpl */
    const char *none;      /* the 503 message when no group can take it */
    int tokens;            /* its answer streams as tokens: --ttft-timeout applies */
    int part;              /* a part of another request (q->up), which answers the client, logs and is timed */
} gw_req_ops;

typedef struct gw_req {
    struct gw_req *prev, *next;
    gw *g;
    const gw_req_ops *ops;       /* NULL: &gw_req_generate_ops */
    void *x;                     /* the kind's own state (ops->release frees it) */
    uint64_t rid;
    struct gw_conn *conn;        /* NULL once the client is gone */
    gw_model *model;             /* held for the request's life */
    cm_oai_completion c;
    int32_t *tok;
    int n_tok, max_tokens;
    int worker;                  /* group it runs on, -1 before */
    int joined;                  /* counted in that group's in-flight requests (gw_req_join) */
    uint64_t worker_inc;         /* that group's incarnation when sent */
    int got_token, retried, on_worker;
    int lora;                    /* c.model names a LoRA adapter (checked at admission), not the base model */
    uint32_t next_seq;
    /* the output delivered so far (n = 1): a request whose group is lost resumes after it on another */
    int32_t *out_tok;
    int n_out, cap_out;
    size_t out_text;
    int key;                     /* API key index, -1 */
    char id[128];
    double t_arrive, t_sent, t_first, t_last;
    struct event *timer;
    cm_oai_result res;
    char *echo;                  /* completions with echo: the prompt's text */
    size_t echo_len;
    const char *param;           /* the request field an error is about (static string), or NULL */
    json_t *body;                /* a prepared 200 answer: the body, or a stream's last event before [DONE] */
    struct gw_req *up;           /* a part's whole (ops->part): its client, its clocks; NULL once that ended */
    int base;                    /* a part's first choice in its whole's answer */
    int end_status;              /* an end for the next tick (gw_req_end_soon), 0 for none */
    const char *end_msg, *end_code;
    gw_probe_fn probe_done;      /* while it waits on a probe (gw_req_probe_enlist): the continuation */
    /* disaggregated prefill: while a kv_producer group computes its prompt, the decode group it hands over to
     * after the first token, plus 1 (0: none); the transfer's id, until the decode group has been told it */
    int pd_decode, pd_done;      /* pd_done: handed over (the usage's cached tokens are the prefill group's) */
    int pd_guest;                /* decoding on its prefill group (--idle-decode) until a long prompt moves it */
    int pd_tokens, joined_prefill; /* the prompt tokens the prefill group computes; counted in its prefill_tokens */
    uint64_t xfer;
} gw_req;

enum { GW_FAIL_WORKER_LOST = 1, GW_FAIL_OVERLOADED, GW_FAIL_SEND };

/* A generation's ops: prefix-aware routing (gw_route) and a Generate message. */
extern const gw_req_ops gw_req_generate_ops;
int gw_req_generate_pick(gw *g, gw_req *q, int exclude, int *hit);
/* The LoRA adapter q's model names, or NULL for the base model. */
const char *gw_req_lora(const gw *g, const gw_req *q);
int gw_req_generate_send(gw *g, gw_req *q, int wi);
/* Its answer's start: the result collected from the chunks, under q's id. */
void gw_req_generate_begin(gw_req *q);

/* Takes q (tokens and parsed body filled in), of any kind: routes (a 503
 * with ops->none, a 429 past --max-queue), names it, sends it and starts the
 * reply (SSE headers for a stream). On failure the client is answered and q
 * freed. */
void gw_req_start(gw *g, gw_req *q);
/* For a request that answers through parts of its own (a batch): an id in
 * the map, a place in the list worker loss and drain walk, the hang-up
 * watch and the deadline timer, as gw_req_start gives one it sends. */
int gw_req_enlist(gw *g, gw_req *q);
/* Ends q at its next timer tick, off the current call stack (a whole ending
 * its parts while a caller may still walk them). */
void gw_req_end_soon(gw_req *q, int status, const char *msg, const char *code);
/* A request waiting on something other than its answer (the cache's
 * embedding of its question): an id in the map and a place in the list, so
 * shutdown ends it, and a timer that calls timeout after secs. */
int gw_req_probe_enlist(gw *g, gw_req *q, void (*timeout)(evutil_socket_t, short, void *), double secs);
/* The one owner of a group's in-flight count (what routing weighs): q was
 * sent to group wi and counts there until gw_req_leave, which takes it off
 * (cancelled there first when cancel; q->worker stays, for the log). */
void gw_req_join(gw_req *q, int wi);
void gw_req_leave(gw_req *q, int cancel);
/* Sends e, q's message (any kind), to group wi: 0, and q joined there, on
 * the worker, its sequence from 0, the group's incarnation and the send
 * time noted; or the send's error. */
int gw_req_send_env(gw_req *q, int wi, pr_env *e);
/* The wall-clock deadline (ms since the epoch, what the wire carries) that
 * timeout seconds from q's arrival make; 0 for no timeout. */
uint64_t gw_req_deadline_ms(const gw_req *q, double timeout);
/* Undoes either enlist: out of the map and the list, timer freed. */
void gw_req_delist(gw *g, gw_req *q);
/* A failure of kind GW_FAIL_*: tries another group once, when nothing
 * reached the client yet or, for one choice, resuming after the output it
 * has (a lost group's stream goes on elsewhere); else ends with status and
 * msg. */
void gw_req_retry(gw_req *q, int kind, int status, const char *msg, const char *code);
/* The one end. status 200: the collected response (or [DONE]); else an
 * error the client sees (HTTP error, or an SSE error event and [DONE]). */
void gw_req_finish(gw_req *q, int status, const char *msg, const char *code);
void gw_req_free(gw_req *q);

/* A worker group refused or failed q (code: its LLM_E*): the one mapping to
 * what the client sees, for generation and embeddings alike (a timeout 504,
 * overloaded retried elsewhere or 503, ERANGE context_length_exceeded and
 * EINVAL invalid_value 400, anything else 500). q must be off the worker. */
void gw_req_worker_error(gw_req *q, int code, const char *msg);
/* A TokenChunk (gw_pool_ops.on_chunk): found by its request id, checked against the request's sequence. */
void gw_req_on_chunk(gw *g, const Llmserve__TokenChunk *c);
/* Group w died or restarted (gw_pool_ops.on_lost); every request on it moves or ends now. */
void gw_req_worker_lost(gw *g, int w, const char *why);
/* Fails every live request (shutdown past the drain deadline). */
void gw_req_fail_all(gw *g, int status, const char *msg, const char *code);

#endif
