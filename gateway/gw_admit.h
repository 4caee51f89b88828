/* gw_admit.h - admission, one path for every handler whose request is
 * prepared on a tokenizer thread (chat and completions in gw_oai.c,
 * embeddings in gw_embed.c):
 *
 *   gw_admit_open -> gw_admit_new -> gw_admit_submit -> (job->run on a
 *   tokenizer thread) -> job->done -> gw_admit_prepared -> gw_admit_limits
 *
 * and then the handler's own way to a worker group. Every refusal here is
 * a plain HTTP error through gw_req_finish, before the first byte of a
 * reply. */
#ifndef GW_ADMIT_H
#define GW_ADMIT_H

#include "gw.h"
#include "gw_http.h"
#include "gw_tokq.h"

struct gw_req;

/* What every preparation holds; the first member of the handler's own job. */
typedef struct gw_prep {
    gw_job job;                     /* first: the tokenizer queue's handle */
    struct gw_req *q;
    char *body;                     /* the request body, copied and NUL-terminated */
    size_t len;
    char served[256], eserved[256]; /* snapshots: the job's thread reads nothing of gw */
    char loras[GW_LORA_LIST];           /* gw.loras */
    int max_len, vocab;             /* the model's context length and vocabulary */
    int status;                     /* 0: ready to route; else the refusal */
    char err[640];
    const char *code;
} gw_prep;

/* A refusal from the job's thread: status, the field it is about (param, static
 * or NULL), the error code and the message. */
void gw_prep_refuse(gw_prep *p, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* 1 when the gateway takes new requests; 0 after answering 503 (draining). */
int gw_admit_open(gw *g, gw_http_req *r);
/* r's API key checked: 1 with *key its index (-1: none needed, or the internal caller), or 0 after a 401
 * (logged at most once a second). */
int gw_admit_authorized(gw *g, gw_http_req *r, int *key);
/* A request for a handler, with p (calloc'd by the caller, size bytes, a
 * gw_prep first) filled: the body copied, the model held. NULL (a 500
 * answered, p freed) when memory runs out. */
struct gw_req *gw_admit_new(gw *g, gw_http_req *r, int key, gw_model *m, gw_prep *p);
/* Hands p to a tokenizer thread and watches the client with gone; a full
 * queue is a 503 with Retry-After. */
void gw_admit_submit(gw *g, gw_prep *p, void (*gone)(void *));
/* Back on the loop after the job ran: frees p (its body too; the handler
 * frees what it added first) and returns its request to go on with, or
 * NULL when it ended (the client left, the preparation refused it, or the
 * gateway drains). */
struct gw_req *gw_admit_prepared(gw_prep *p);
/* The rate limits for need tokens (what: how they are counted, for the
 * message): ends the request (1, a 400 naming param or a 429 with
 * Retry-After), or admits it (0). */
int gw_admit_limits(gw *g, struct gw_req *q, double need, const char *param, const char *what);

#endif
