/* gw_oai.h - completions and chat: the request flow parse -> template -> tokenize (on a
 * tokenizer thread, with the context length as a limit that stops early) ->
 * validation against the vocabulary -> rate limits -> gw_req_start. Every
 * refusal before the first byte of a reply is a plain HTTP error, so a
 * streamed request never gets a 200 it then takes back. */
#ifndef GW_OAI_H
#define GW_OAI_H

#include "gw.h"
#include "gw_http.h"

/* POST /v1/completions (chat 0) or /v1/chat/completions (chat 1), r->body its body; authorized here. */
void gw_oai_generate(gw *g, gw_http_req *r, int chat);

#endif
