/* gw_resp_in.h - a Responses API request as a chat request (gw_responses.h
 * has the whole API): the fields honoured, those accepted at one value, and
 * any other refused by name; input items (messages, function calls and
 * their outputs; past reasoning left out) as chat messages. */
#ifndef GW_RESP_IN_H
#define GW_RESP_IN_H

#include <jansson.h>
#include <stddef.h>

/* Null or missing. */
static inline int gw_resp_absent(const json_t *v) { return !v || json_is_null(v); }

/* The chat request of o, and the conversation (chat messages, without the instructions) a stored response keeps:
 * prev's (a stored record's "messages", or prev NULL) and this input's. LLM_EINVAL with err and *param (static). */
int gw_resp_translate(const json_t *o, const json_t *prev, json_t **chat_out, json_t **conv_out, char *err,
                      size_t errlen, const char **param);
/* The same from bytes (for the fuzzer): prev a stored record's bytes or NULL. */
int gw_resp_chat_body(const char *body, size_t len, const char *prev, size_t prev_len, char **out, char *err,
                      size_t errlen, const char **param);

#endif
