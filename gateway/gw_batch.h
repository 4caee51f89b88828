/* gw_batch.h - a completion with a list of prompts: one whole, one part per prompt.
 *
 * The whole answers the client under one id; each prompt runs as a request
 * of its own (a part: ops->part, q->up its whole) on whichever group routing
 * picks, its choices renumbered into the whole's (prompt i's start at i*n).
 * A part's failure ends the whole with that error; the whole's end (an
 * error, the client gone) ends the parts still running at their next tick.
 * Streamed, the parts' chunks interleave as they come; the usage chunk sums
 * them. */
#ifndef GW_BATCH_H
#define GW_BATCH_H

#include "gw_req.h"

/* One prompt of a batch, prepared on a tokenizer thread. */
typedef struct gw_prompt {
    int32_t *tok;
    int n_tok;
    char *echo;                  /* with echo: the prompt's text */
    size_t echo_len;
} gw_prompt;

void gw_prompts_free(gw_prompt *p, int n);
/* Starts q, whose q->c.n_batch prompts are p (taken; q->x must be free):
 * its ops and state become the batch's. On failure the client is answered
 * and q freed. */
void gw_batch_start(gw *g, gw_req *q, gw_prompt *p);

#endif
