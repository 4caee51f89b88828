/* wk_embed.h - continuous batching of embedding requests over one encoder.
 *
 * Requests (each up to WK_EMBED_MAX_INPUTS inputs) wait in arrival order;
 * each step takes inputs from all waiting requests in turns, one input per
 * request per turn, until the encoder's step is full. So a request of 2,048
 * inputs shares every step with the small ones that came after it instead of
 * making them wait for all of its inputs, and a request's inputs finish in
 * as few steps as the load allows. A request is done when all its inputs
 * are; the caller takes it off with wk_embed_take_done. */
#ifndef WK_EMBED_H
#define WK_EMBED_H

#include "wk_bert.h"

#include <stdint.h>

#define WK_EMBED_MAX_INPUTS 2048

typedef struct wk_ejob {
    struct wk_ejob *next;
    uint64_t id;                 /* the caller's */
    int64_t deadline_ms;         /* the caller's, unused here */
    int n, next_in, done;        /* inputs, the next to schedule, those embedded */
    int32_t **tok;               /* [n] copies */
    int *len;
    int tokens;                  /* sum of len */
    float *out;                  /* [n][dim] */
} wk_ejob;

typedef struct {
    wk_encoder *enc;
    wk_ejob *head, *tail;        /* waiting or partly done */
    wk_ejob *done;               /* finished, for wk_embed_take_done */
    int n_jobs;
    uint64_t steps, inputs, tokens;
    /* one step's gather, sized once: max_tokens inputs at most */
    const int32_t **s_tok;
    int *s_len;
    float **s_out;
    float *s_buf;                /* [max_tokens][dim] */
} wk_embed;

int wk_embed_init(wk_embed *q, wk_encoder *enc);
void wk_embed_free(wk_embed *q);
/* Copies the inputs. LLM_EINVAL: no inputs, too many, a token outside the
 * vocabulary; LLM_ERANGE: an input empty or longer than the model takes. */
int wk_embed_add(wk_embed *q, uint64_t id, int64_t deadline_ms, int n, const int32_t *const *tok, const int *len,
                 char *err, size_t errlen);
/* Removes a waiting or partly done request (cancel, timeout): 1 if found. */
int wk_embed_remove(wk_embed *q, uint64_t id);
/* Runs one encoder step; 0, or the encoder's error. */
int wk_embed_step(wk_embed *q);
int wk_embed_has_work(const wk_embed *q);
/* The finished requests, oldest first; the caller frees each with wk_ejob_free. */
wk_ejob *wk_embed_take_done(wk_embed *q);
void wk_ejob_free(wk_ejob *j);

#endif
