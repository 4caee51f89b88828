/* wk_wire.h - the wires of a worker group's step, over the comms wk_model holds.
 *
 * What the driver (stage 0's first rank, the engine's) sends every rank goes
 * down a chain: from each pipeline stage's first rank to the next stage's
 * over their pair (m->next, m->prev), and from each first rank to its
 * stage's other ranks over the stage's TP comm (m->comm). wk_forward.c
 * sends the steps on it, wk_lora.c the adapters' updates. */
#ifndef WK_WIRE_H
#define WK_WIRE_H

#include "wk_model.h"

/* The group's driver: stage 0's first rank. */
int wk_wire_driver(const wk_model *m);
/* Whether the model has ranks besides this one (a TP group, pipeline stages or both). */
int wk_wire_grouped(const wk_model *m);
/* This rank's part of taking a message in: a stage's first rank from the stage before, another rank from
 * its first (the driver has nothing to take). */
int wk_wire_up(wk_model *m, void *buf, size_t bytes);
/* A first rank's part of passing it on: to the next stage (unless !chain) and to its stage. */
int wk_wire_on(wk_model *m, void *buf, size_t bytes, int chain);
/* Both: the driver's message to every rank. */
int wk_wire_down(wk_model *m, void *buf, size_t bytes);
/* Every rank says whether its part failed; all learn whether any did (*any), over every stage. */
int wk_wire_agree(wk_model *m, int failed, int *any);

/* The way back: the last pipeline stage's first rank sends each overlapped step's logits to the driver over
 * the ring from a thread of its own, in the order the steps came, so the stage goes on to the next step's
 * rows while the driver is still sending down the chain; a send that waited for its receiver would close a
 * cycle of waits once three stages or more overlap. back_buf: a buffer of floats to gather the logits into
 * (waits while every one is queued; NULL and *rc on a failed send); back_send queues the buffer back_buf
 * gave last; stop sends what is queued and ends the thread. Each returns the first send's error, if one
 * failed. Every step's logits go this way, overlapped or not, so the ring has one sender. */
float *wk_wire_back_buf(wk_model *m, size_t floats, int *rc);
int wk_wire_back_send(wk_model *m);
int wk_wire_back_stop(wk_model *m);

#endif
