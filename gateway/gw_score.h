/* gw_score.h - vLLM's /v1/score and /v1/rerank (Cohere's and Jina's shape)
 * over the embedding model: a bi-encoder's score is the cosine similarity of
 * the two texts' vectors, as vLLM computes it for embedding models.
 *
 * The request is rewritten as one /v1/embeddings request holding every text
 * once (score: text_1 then text_2; rerank: the query then the documents),
 * and its reply rewritten back at the edge (gw_http_filter): score's list of
 * {"index", "object": "score", "score"}, or rerank's results sorted by
 * relevance_score (top_n of them, with each document's text unless
 * return_documents is false). Pairing for score, as vLLM does: one text
 * against one, one against a list, or two lists of the same length, item by
 * item. */
#ifndef GW_SCORE_H
#define GW_SCORE_H

#include "gw_http.h"

#include <stddef.h>

/* The embeddings body (malloc'd) for a score (rerank 0) or rerank request, and the filter that turns its reply
 * into the answer, put on c (NULL: the body alone). LLM_EINVAL with err and *param (a static name) naming what is refused. */
int gw_score_request(gw_conn *c, const char *body, size_t len, int rerank, char **out, char *err, size_t errlen,
                     const char **param);

#endif
