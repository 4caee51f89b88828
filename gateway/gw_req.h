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

struct gw_conn;
struct gw_req;

/* Where a semantic-cache probe's answer goes (gw_embed_probe): the vector, or NULL. */
typedef void (*gw_probe_fn)(gw *g, struct gw_req *q, const float *vec, int dim);

/* What differs between request kinds, as nginx's upstream callbacks do: the
 * kind's way to a worker group and its own part of the end. gw_req_start,
 * gw_req_retry and gw_req_finish go through it and never name a feature.
 * A request with no ops is a generation (gw_req_generate_ops). */
typedef struct gw_req_ops {
    /* A group for q other than exclude (-1: none excluded), or -1; *hit: the cached prefix it holds. */
    int (*pick)(gw *g, struct gw_req *q, int exclude, int *hit);
    /* Sends q to group wi: 0 or the send's error. */
    int (*send)(gw *g, struct gw_req *q, int wi);
    /* q ends with status, before its answer goes out; may be NULL. */
    void (*on_end)(struct gw_req *q, int status);
    int tokens; /* its answer streams as tokens: --ttft-timeout applies */
} gw_req_ops;

typedef struct gw_req {
    struct gw_req *prev, *next;
    gw *g;
    const gw_req_ops *ops;       /* NULL: &gw_req_generate_ops */
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
    /* batches (completions with a list of prompts): a parent answers the client, one kid runs each prompt */
    struct gw_req *parent;       /* a kid's: NULL once the parent ended */
    int base;                    /* a kid's first choice in the response */
    int abandon;                 /* a kid whose parent ended: it ends at its next timer */
    struct gw_req **kids;        /* a parent's, n_kids of them; NULL once each ends */
    int n_kids, kids_left, starting;
    json_t *choices;             /* a parent's response choices, by index */
    int sum_prompt, sum_completion, sum_cached;
    int kid_status;              /* a kid failed while the parent was starting them */
    char kid_msg[256];
    const char *kid_code;
    struct gw_prompt { int32_t *tok; int n_tok; char *echo; size_t echo_len; } *prompts; /* a parent's, from prep */
    /* /v1/embeddings (gw_embed.c): the inputs' tokens, and the answer once the group sent it */
    int embed, b64;              /* an embedding request; base64 vectors */
    int n_inputs;
    int32_t **in_tok;            /* [n_inputs] */
    int *in_len;
    json_t *body;                /* a prepared 200 body, sent by gw_req_finish */
    /* --semantic-cache (gw_oai.c): the keys, the last user turn for the embedding model, its vector */
    int cache_on, probing, cache_hit;
    gw_probe_fn probe_done;      /* while probing: the continuation */
    uint64_t cache_scope, cache_exact;
    int32_t *cache_etok;
    int cache_en;
    float *cache_vec;
    char *ctext;                 /* a streamed answer's text, kept to be stored */
    int trim_policy, trim_messages, trim_tokens; /* the history was trimmed to fit (gw_oai.c) */
    /* context_overflow summarize: the prompt asking for the summary, where it goes, its cache key; the
     * summary request points back at the request it serves */
    int32_t *summ_tok;
    int summ_n, summ_head, summ_from, summ_room, summ_tokens, summ_cached;
    uint64_t summ_key;
    struct gw_req *summ_for;
    size_t clen, ccap;
} gw_req;

enum { GW_FAIL_WORKER_LOST = 1, GW_FAIL_OVERLOADED, GW_FAIL_SEND };

/* A generation's ops: prefix-aware routing (gw_route) and a Generate message. */
extern const gw_req_ops gw_req_generate_ops;
int gw_req_generate_pick(gw *g, gw_req *q, int exclude, int *hit);
int gw_req_generate_send(gw *g, gw_req *q, int wi);

/* Takes q (tokens and parsed body filled in): routes, sends and starts the
 * reply (SSE headers for a stream). On failure the client is answered and q
 * freed. */
void gw_req_start(gw *g, gw_req *q);
/* For requests other than completions (gw_embed): an id in the map, a place
 * in the list worker loss and drain walk, the hang-up watch and the
 * deadline timer, as gw_req_start gives a completion. */
int gw_req_enlist(gw *g, gw_req *q);
/* A request waiting on something other than its answer (the cache's
 * embedding of its question): an id in the map and a place in the list, so
 * shutdown ends it, and a timer that calls timeout after secs. */
int gw_req_probe_enlist(gw *g, gw_req *q, void (*timeout)(evutil_socket_t, short, void *), double secs);
/* The one owner of a group's in-flight count (what routing weighs): q was
 * sent to group wi and counts there until gw_req_leave, which takes it off
 * (cancelled there first when cancel; q->worker stays, for the log). */
void gw_req_join(gw_req *q, int wi);
void gw_req_leave(gw_req *q, int cancel);
/* After a send of q to group wi (any kind): joined there, on the worker, its
 * sequence from 0, the group's incarnation and the send time noted. */
void gw_req_sent(gw_req *q, int wi);
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
