/* wk_wire.c - the wires of a worker group's step (wk_wire.h): what the
 * driver sends every rank, handed down the chain of pipeline stages and to
 * each stage's ranks, and the group's agreement on a failure. */
#include "wk_wire.h"
#include "cm_error.h"

#include <pthread.h>
#include <stdlib.h>

static int bcast(wk_comm *c, void *buf, size_t bytes, int root) { return c->ops->broadcast(c, buf, bytes, root); }

/* The group's driver (the engine's rank): stage 0's first rank. */
int wk_wire_driver(const wk_model *m) { return m->pp_rank == 0 && m->tp_rank == 0; }

/* Ranks besides this one: a TP group, pipeline stages or both. */
int wk_wire_grouped(const wk_model *m) { return m->pp_size > 1 || m->tp_size > 1; }

/* ---- the pipeline's wires ----------------------------------------------
 * What the driver sends every rank goes down a chain: from each stage's
 * first rank to the next stage's over their pair, and from each first rank
 * to its stage's other ranks over the stage's comm. up: this rank's part
 * of taking it in (a first rank from the stage before, another rank from
 * its first; the driver has nothing to take); on: a first rank's part of
 * passing it on (to the next stage unless !chain, and to its stage). */
int wk_wire_up(wk_model *m, void *buf, size_t bytes) {
    if (m->tp_rank) return bcast(m->comm, buf, bytes, 0);
    return m->prev ? bcast(m->prev, buf, bytes, 0) : 0;
}

int wk_wire_on(wk_model *m, void *buf, size_t bytes, int chain) {
    if (m->tp_rank) return 0;
    int rc = chain && m->next ? bcast(m->next, buf, bytes, 0) : 0;
    return !rc && m->tp_size > 1 ? bcast(m->comm, buf, bytes, 0) : rc;
}

int wk_wire_down(wk_model *m, void *buf, size_t bytes) {
    int rc = wk_wire_up(m, buf, bytes);
    return rc ? rc : wk_wire_on(m, buf, bytes, 1);
}

int wk_wire_agree(wk_model *m, int failed, int *any) {
    float f = (float)failed, part;
    int rc = 0;
    if (m->tp_size > 1) rc = m->comm->ops->all_reduce_sum(m->comm, &f, 1); /* each stage's */
    if (!rc && m->pp_size > 1 && !m->tp_rank) { /* down the chain adding, the total back up it (not the ring,
                                                  * whose sender may still be at a step's logits) */
        if (m->prev && !(rc = bcast(m->prev, &part, sizeof part, 0))) f += part;
        if (!rc && m->next) rc = bcast(m->next, &f, sizeof f, 0);
        if (!rc && m->next) rc = bcast(m->next, &f, sizeof f, 1);
        if (!rc && m->prev) rc = bcast(m->prev, &f, sizeof f, 1);
    }
    if (!rc && m->tp_size > 1 && m->pp_size > 1) rc = bcast(m->comm, &f, sizeof f, 0); /* the total, to each stage */
    *any = f > 0.5f;
    return rc;
}

/* ---- the way back --------------------------------------------------------
 * Slots used in turn: [head, head + count) are queued (head's maybe being
 * sent); the caller fills slot head + count before it queues it. */
struct wk_back {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    wk_comm *ring;
    int n_slot, head, count, err, stop;
    struct {
        float *buf;
        size_t cap, n;
    } *slot;
};

static void *back_main(void *arg) {
    struct wk_back *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->count && !b->stop) pthread_cond_wait(&b->cv, &b->mu);
        if (!b->count || b->err) break; /* stopped, or the ring failed: nothing more goes */
        float *buf = b->slot[b->head].buf;
        size_t n = b->slot[b->head].n;
        pthread_mutex_unlock(&b->mu);
        int rc = bcast(b->ring, buf, sizeof(float) * n, 1);
        pthread_mutex_lock(&b->mu);
        if (rc) b->err = rc;
        b->head = (b->head + 1) % b->n_slot;
        b->count--;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static int back_start(wk_model *m) {
    struct wk_back *b = calloc(1, sizeof *b);
    if (!b) return LLM_ENOMEM;
    b->ring = m->ring;
    b->n_slot = m->pp_size + 1; /* a step in flight a stage, and the one this stage computes */
    b->slot = calloc((size_t)b->n_slot, sizeof *b->slot);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    if (!b->slot || pthread_create(&b->th, NULL, back_main, b)) {
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->cv);
        free(b->slot);
        free(b);
        return LLM_ENOMEM;
    }
    m->back = b;
    return 0;
}

float *wk_wire_back_buf(wk_model *m, size_t floats, int *rc) {
    *rc = 0;
    if (!m->ring || m->tp_rank || m->pp_rank != m->pp_size - 1) {
        *rc = LLM_EINVAL;
        return NULL;
    }
    if (!m->back && (*rc = back_start(m))) return NULL;
    struct wk_back *b = m->back;
    pthread_mutex_lock(&b->mu);
    while (b->count == b->n_slot && !b->err) pthread_cond_wait(&b->cv, &b->mu);
    int i = (b->head + b->count) % b->n_slot;
    *rc = b->err;
    pthread_mutex_unlock(&b->mu);
    if (*rc) return NULL;
    if (b->slot[i].cap < floats) { /* not in the queue: the sender does not touch it */
        float *g = realloc(b->slot[i].buf, sizeof(float) * floats);
        if (!g) {
            *rc = LLM_ENOMEM;
            return NULL;
        }
        b->slot[i].buf = g;
        b->slot[i].cap = floats;
    }
    b->slot[i].n = floats;
    return b->slot[i].buf;
}

int wk_wire_back_send(wk_model *m) {
    struct wk_back *b = m->back;
    if (!b) return LLM_EINVAL;
    pthread_mutex_lock(&b->mu);
    int rc = b->err;
    if (!rc) {
        b->count++;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int back_flush(wk_model *m) {
    struct wk_back *b = m->back;
    if (!b) return 0;
    pthread_mutex_lock(&b->mu);
    while (b->count && !b->err) pthread_cond_wait(&b->cv, &b->mu);
    int rc = b->err;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

int wk_wire_back_stop(wk_model *m) {
    struct wk_back *b = m->back;
    if (!b) return 0;
    int rc = back_flush(m);
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->th, NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    for (int i = 0; i < b->n_slot; i++) free(b->slot[i].buf);
    free(b->slot);
    free(b);
    m->back = NULL;
    return rc;
}
