/* gw_anthropic.h - Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) over the chat path: the request is rewritten as
 * an OpenAI chat request (system, content blocks, tool_use / tool_result,
 * tools, tool_choice, stop_sequences, max_tokens required), and the replies
 * are rewritten back at the edge (gw_http_filter): a message with content
 * blocks and stop_reason, the streaming events (message_start,
 * content_block_start / delta / stop, ping, message_delta, message_stop),
 * count_tokens' input_tokens, and errors in Anthropic's shape. */
#ifndef GW_ANTHROPIC_H
#define GW_ANTHROPIC_H

#include "gw_http.h"

#include <stddef.h>

/* The chat request body (malloc'd) for an Anthropic one; count: count_tokens' (a /tokenize body). LLM_EINVAL
 * with err (and *param) naming what is refused. */
int gw_anth_request(const char *body, size_t len, int count, char **out, size_t *out_len, char *err, size_t errlen,
                    const char **param);
/* Puts the reply filter on the connection: every reply from here on is Anthropic's. */
int gw_anth_attach(gw_conn *c, int count);
/* An error in Anthropic's shape, at once (before any chat handling). */
void gw_anth_error(gw_conn *c, int status, const char *msg);

#endif
