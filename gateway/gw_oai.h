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
/* --semantic-cache: the question's vector arrived (vec NULL: it did not, in
 * time); a hit answers, else the request goes on to a worker group. */
void gw_oai_cache_vector(gw *g, struct gw_req *q, const float *vec, int dim);
/* A request ended with 200: its answer is stored when it may be reused. */
void gw_oai_cache_store(gw *g, struct gw_req *q);

#endif
