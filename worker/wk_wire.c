/* wk_wire.c - the wires of a worker group's step (wk_wire.h): what the
 * driver sends every rank, handed down the chain of pipeline stages and to
 * each stage's ranks, and the group's agreement on a failure. */
#include "wk_wire.h"

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
    if (!rc && m->pp_size > 1 && !m->tp_rank) { /* down the chain adding, the total back over the ring, down again */
        if (m->prev && !(rc = bcast(m->prev, &part, sizeof part, 0))) f += part;
        if (!rc && m->next) rc = bcast(m->next, &f, sizeof f, 0);
        if (!rc && m->ring) rc = bcast(m->ring, &f, sizeof f, 1);
        if (!rc && m->prev) rc = bcast(m->prev, &f, sizeof f, 0);
        if (!rc && m->next) rc = bcast(m->next, &f, sizeof f, 0);
    }
    if (!rc && m->tp_size > 1 && m->pp_size > 1) rc = bcast(m->comm, &f, sizeof f, 0); /* the total, to each stage */
    *any = f > 0.5f;
    return rc;
}

