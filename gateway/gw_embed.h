/* gw_embed.h - POST /v1/embeddings: OpenAI's request and response shapes.
 *
 * input: a string, a list of strings, a list of token ids, or a list of
 * such lists (at most 2048 inputs); encoding_format float or base64
 * (little-endian float32, what the openai client asks for by default);
 * dimensions only as the model's own width (the model cannot shorten its
 * vectors); user is accepted. Any other field is refused by name. Strings
 * are tokenized on a tokenizer thread with the embedding model's own
 * tokenizer ([CLS] ... [SEP] for BERT), token lists go as they are; an
 * input longer than the model takes is a 400 before any work. The request
 * goes whole to the least loaded embedding group (Embed), whose one
 * EmbedResult answers it; a lost group's request moves to another once, as
 * a completion's does. */
#ifndef GW_EMBED_H
#define GW_EMBED_H

#include "gw.h"
#include "gw_http.h"
#include "gw_req.h"

/* key: the caller's API key index (authorized already). */
void gw_embed_handle(gw *g, gw_http_req *r, int key);
/* The routable embedding group with the fewest requests in flight, not
 * exclude; -1 when there is none. */
int gw_embed_pick(gw *g, int exclude);
/* Sends q (an embedding request) to group wi: 0 or the send's error. */
int gw_embed_send(gw *g, gw_req *q, int wi);
/* --semantic-cache: asks an embedding group, on q's behalf, for the vector
 * of tok[0..n) (q's last user turn; borrowed for the call); its answer, or a
 * second's silence (vec NULL), goes to done. 0, or an error when no group
 * can be asked (done is not called). */
int gw_embed_probe(gw *g, gw_req *q, const int32_t *tok, int n, gw_probe_fn done);
/* From gw_pool: a group's answer. */
void gw_embed_on_result(gw *g, const Llmserve__EmbedResult *r);

#endif
