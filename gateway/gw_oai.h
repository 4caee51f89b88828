/* gw_oai.h - the OpenAI API's handlers: routes, authentication, and for
 * completions and chat the request flow parse -> template -> tokenize (on a
 * tokenizer thread, with the context length as a limit that stops early) ->
 * validation against the vocabulary -> rate limits -> gw_req_start. Every
 * refusal before the first byte of a reply is a plain HTTP error, so a
 * streamed request never gets a 200 it then takes back. */
#ifndef GW_OAI_H
#define GW_OAI_H

#include "gw.h"
#include "gw_http.h"

void gw_oai_handle(void *g, gw_http_req *r);

struct gw_req;
struct gw_job;
/* A request for a handler: the body copied (*body), the model held; NULL
 * (and a 500 answered, job freed) when memory runs out. */
struct gw_req *gw_oai_new_req(gw *g, gw_http_req *r, int key, gw_model *m, void *job, char **body);
/* Hands job (the first member of a malloc'd preparation that owns body) to
 * a tokenizer thread and watches the client with gone; a full queue is a
 * 503 with Retry-After. */
void gw_oai_submit(gw *g, struct gw_req *q, struct gw_job *job, char *body, void (*gone)(void *));
/* After a request's preparation, on the loop: ends it (1) when the client
 * left, the preparation refused it (status, err, code) or the gateway
 * drains; else 0. */
int gw_oai_prepared(struct gw_req *q, int status, const char *err, const char *code);
/* The rate limits for need tokens: ends the request (1, a 400 naming param
 * or a 429 with Retry-After), or admits it (0). */
int gw_oai_limits(gw *g, struct gw_req *q, double need, const char *param);
/* --semantic-cache: the question's vector arrived (vec NULL: it did not, in
 * time); a hit answers, else the request goes on to a worker group. */
void gw_oai_cache_vector(gw *g, struct gw_req *q, const float *vec, int dim);
/* context_overflow summarize: the summary arrived (text NULL: it did not);
 * the request goes on with it in place of the turns it stands for, or with
 * them dropped. */
void gw_oai_summary_done(gw *g, struct gw_req *q, const char *text, size_t len);
/* A request ended with 200: its answer is stored when it may be reused. */
void gw_oai_cache_store(gw *g, struct gw_req *q);

#endif
