#include "wk_embed.h"
#include "cm_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wk_embed_init(wk_embed *q, wk_encoder *enc) {
    memset(q, 0, sizeof *q);
    q->enc = enc;
    size_t T = (size_t)enc->max_tokens;
    q->s_tok = malloc(sizeof *q->s_tok * T);
    q->s_len = malloc(sizeof *q->s_len * T);
    q->s_out = malloc(sizeof *q->s_out * T);
    q->s_buf = malloc(sizeof(float) * T * enc->cfg.dim);
    if (!q->s_tok || !q->s_len || !q->s_out || !q->s_buf) {
        wk_embed_free(q);
        return LLM_ENOMEM;
    }
    return 0;
}

void wk_ejob_free(wk_ejob *j) {
    if (!j) return;
    for (int i = 0; i < j->n; i++) free(j->tok[i]);
    free(j->tok);
    free(j->len);
    free(j->out);
    free(j);
}

void wk_embed_free(wk_embed *q) {
    for (wk_ejob *j = q->head, *n; j; j = n) {
        n = j->next;
        wk_ejob_free(j);
    }
    for (wk_ejob *j = q->done, *n; j; j = n) {
        n = j->next;
        wk_ejob_free(j);
    }
    free(q->s_tok);
    free(q->s_len);
    free(q->s_out);
    free(q->s_buf);
    memset(q, 0, sizeof *q);
}

int wk_embed_add(wk_embed *q, uint64_t id, int64_t deadline_ms, int n, const int32_t *const *tok, const int *len,
                 char *err, size_t errlen) {
    int ml = wk_encoder_max_len(q->enc), V = (int)q->enc->cfg.vocab;
    if (n < 1 || n > WK_EMBED_MAX_INPUTS) {
        snprintf(err, errlen, "an embedding request takes 1 to %d inputs, not %d", WK_EMBED_MAX_INPUTS, n);
        return LLM_EINVAL;
    }
    for (int i = 0; i < n; i++) {
        if (len[i] < 1 || len[i] > ml) {
            snprintf(err, errlen, "input %d has %d tokens; the model takes 1 to %d", i, len[i], ml);
            return LLM_ERANGE;
        }
        for (int k = 0; k < len[i]; k++)
            if (tok[i][k] < 0 || tok[i][k] >= V) {
                snprintf(err, errlen, "input %d: token id %d is outside the vocabulary (%d)", i, tok[i][k], V);
                return LLM_EINVAL;
            }
    }
    wk_ejob *j = calloc(1, sizeof *j);
    if (!j) return LLM_ENOMEM;
    j->id = id;
    j->deadline_ms = deadline_ms;
    j->tok = calloc((size_t)n, sizeof *j->tok);
    j->len = malloc(sizeof *j->len * (size_t)n);
    j->out = malloc(sizeof(float) * (size_t)n * q->enc->cfg.dim);
    if (!j->tok || !j->len || !j->out) {
        wk_ejob_free(j);
        return LLM_ENOMEM;
    }
    j->n = n;
    for (int i = 0; i < n; i++) {
        if (!(j->tok[i] = malloc(sizeof(int32_t) * (size_t)len[i]))) {
            wk_ejob_free(j);
            return LLM_ENOMEM;
        }
        memcpy(j->tok[i], tok[i], sizeof(int32_t) * (size_t)len[i]);
        j->len[i] = len[i];
        j->tokens += len[i];
    }
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    q->n_jobs++;
    return 0;
}

int wk_embed_remove(wk_embed *q, uint64_t id) {
    for (wk_ejob **pp = &q->head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
        wk_ejob *j = *pp;
        if (j->id != id) continue;
        *pp = j->next;
        if (q->tail == j) q->tail = prev;
        q->n_jobs--;
        wk_ejob_free(j);
        return 1;
    }
    return 0;
}

int wk_embed_has_work(const wk_embed *q) { return q->head != NULL; }

int wk_embed_step(wk_embed *q) {
    int T = 0, n = 0, cap = q->enc->max_tokens, D = (int)q->enc->cfg.dim, added = 1;
    /* turns over the waiting requests, one input each, while the step has room */
    while (added) {
        added = 0;
        for (wk_ejob *j = q->head; j; j = j->next) {
            if (j->next_in >= j->n || T + j->len[j->next_in] > cap) continue;
            q->s_tok[n] = j->tok[j->next_in];
            q->s_len[n] = j->len[j->next_in];
            q->s_out[n] = j->out + (size_t)j->next_in * D;
            T += j->len[j->next_in];
            j->next_in++;
            n++;
            added = 1;
        }
    }
    if (!n) return 0;
    int rc = wk_encode(q->enc, n, q->s_tok, q->s_len, q->s_buf);
    if (rc) return rc;
    for (int i = 0; i < n; i++) memcpy(q->s_out[i], q->s_buf + (size_t)i * D, sizeof(float) * (size_t)D);
    q->steps++;
    q->inputs += (uint64_t)n;
    q->tokens += (uint64_t)T;
    /* requests whose inputs were all scheduled are done now, in order */
    wk_ejob **tail = &q->done;
    while (*tail) tail = &(*tail)->next;
    for (wk_ejob **pp = &q->head, *prev = NULL; *pp;) {
        wk_ejob *j = *pp;
        if (j->next_in < j->n) {
            prev = j;
            pp = &j->next;
            continue;
        }
        j->done = j->n;
        *pp = j->next;
        if (q->tail == j) q->tail = prev;
        q->n_jobs--;
        j->next = NULL;
        *tail = j;
        tail = &j->next;
    }
    return 0;
}

wk_ejob *wk_embed_take_done(wk_embed *q) {
    wk_ejob *d = q->done;
    q->done = NULL;
    return d;
}
