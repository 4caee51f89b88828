/* gw_responses.h - OpenAI's Responses API over the chat path.
 *
 * POST /v1/responses: the request (input as a string or items, instructions,
 * function tools and their calls and outputs as items, tool_choice,
 * text.format, max_output_tokens, previous_response_id, store, ...) is
 * rewritten as a chat request; the chat reply is rewritten back at the edge
 * (gw_http_filter): a Response with output items (reasoning, message,
 * function_call), or streamed as the documented events (response.created,
 * response.in_progress, response.output_item.added, response.content_part.added,
 * response.output_text.delta, ... response.completed), each with its
 * sequence_number. With store (the default) the response and the
 * conversation that led to it are put in the response store (gw_rstore.h)
 * before the client sees it end, so a continuation through any gateway that
 * reaches the same store finds it. Stored responses belong to the API key
 * that made them.
 *
 * GET /v1/responses/{id} and DELETE /v1/responses/{id} read and remove them;
 * GET /v1/responses/{id}/input_items lists the conversation that led to one. */
#ifndef GW_RESPONSES_H
#define GW_RESPONSES_H

#include "gw_http.h"
#include "gw_rstore.h"

/* Runs a chat request (r->body a chat body) as POST /v1/chat/completions would. */
typedef void (*gw_resp_generate)(void *ctx, gw_http_req *r);

/* POST /v1/responses from an authorized client; tenant: its key's tag. */
void gw_resp_create(gw_rstore *st, gw_http_req *r, const char *tenant, gw_resp_generate gen, void *ctx);
/* GET (del 0) or DELETE (del 1) /v1/responses/{id}; GET /v1/responses/{id}/input_items (id: "ID/input_items"). */
void gw_resp_lookup(gw_rstore *st, gw_http_req *r, const char *tenant, const char *id, int del);

#endif
