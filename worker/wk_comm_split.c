/* wk_comm_split: sub-groups of a formed group (wk_comm.h), over world's own
 * broadcasts. Every rank learns every rank's (color, key); each sub-group's
 * first rank opens its endpoint (a shared-memory segment, or a TCP port
 * with a fresh token) and broadcasts it, in world-rank order; the others
 * attach or connect, the first ones accept; an all-reduce of a failure
 * flag ends it, so no rank leaves thinking a sub-group formed that did
 * not, and every rank's pid is in its segment before the first wait. */
#include "wk_comm.h"
#include "cm_error.h"
#include "cm_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define MAX_RANKS 64

enum { EP_NONE = 0, EP_SHM = 1, EP_TCP = 2 };

typedef struct {
    uint32_t kind, port;
    uint8_t token[WK_TCP_TOKEN_BYTES];
    char name[64];               /* EP_SHM: the segment */
    char host[64];               /* EP_TCP: the first rank's address; empty: world's rank 0 (each peer knows it) */
} endpoint;

typedef struct {
    int32_t color, key;
} ck;

/* Members of world rank r's sub-group before r (by key, then world rank): r's rank in it. */
static int before(const ck *all, int n, int r) {
    int k = 0;
    for (int q = 0; q < n; q++)
        if (q != r && all[q].color == all[r].color &&
            (all[q].key < all[r].key || (all[q].key == all[r].key && q < r)))
            k++;
    return k;
}

/* This rank opens its sub-group's endpoint (it ranks first in it). */
static int open_ep(wk_comm *world, int size, int use_tcp, endpoint *ep, wk_comm **shm, int *lfd) {
    memset(ep, 0, sizeof *ep);
    if (use_tcp) {
        if (getrandom(ep->token, sizeof ep->token, 0) != (ssize_t)sizeof ep->token) return LLM_EIO;
        int port, rc = wk_comm_tcp_listen(lfd, &port);
        if (rc) return rc;
        if (world->rank && (rc = wk_comm_tcp_addr(world, 0, ep->host, sizeof ep->host))) return rc;
        ep->port = (uint32_t)port;
        ep->kind = EP_TCP;
        return 0;
    }
    int rc = wk_comm_shm_create(size, ep->name, sizeof ep->name, shm);
    if (rc) return rc;
    wk_comm_shm_set_pid(*shm, 0, getpid(), 0);
    ep->kind = EP_SHM;
    return 0;
}

int wk_comm_split(wk_comm *world, int color, int key, int use_tcp, wk_comm **out) {
    *out = NULL;
    int n = world->size, me = world->rank, rc = 0;
    if (n > MAX_RANKS) return LLM_EINVAL;
    ck all[MAX_RANKS] = {{0, 0}};
    for (int r = 0; r < n && !rc; r++) { /* every rank's color and key */
        ck v = {color, key};
        rc = world->ops->broadcast(world, &v, sizeof v, r);
        all[r] = v;
    }
    if (rc) return rc;
    int sub = color >= 0 ? before(all, n, me) : -1, size = 0;
    for (int q = 0; q < n; q++) size += color >= 0 && all[q].color == color;
    endpoint mine;
    memset(&mine, 0, sizeof mine);
    wk_comm *c = NULL;
    int lfd = -1, bad = 0;
    for (int r = 0; r < n && !rc; r++) { /* each sub-group's first rank, in world order, opens and tells */
        if (all[r].color < 0 || before(all, n, r) != 0) continue;
        endpoint ep;
        memset(&ep, 0, sizeof ep);
        if (r == me && open_ep(world, size, use_tcp && size > 1, &ep, &c, &lfd)) {
            CM_ERR("rank %d cannot open its sub-group's endpoint", me);
            bad = 1;
        }
        rc = world->ops->broadcast(world, &ep, sizeof ep, r);
        if (color >= 0 && all[r].color == color) mine = ep;
    }
    if (rc) goto out;
    mine.name[sizeof mine.name - 1] = mine.host[sizeof mine.host - 1] = 0;
    if (color >= 0 && mine.kind == EP_NONE) bad = 1;
    else if (color >= 0 && sub > 0 && mine.kind == EP_SHM) {
        if (wk_comm_shm_attach(mine.name, sub, &c)) bad = 1;
        else wk_comm_shm_set_pid(c, sub, getpid(), 0);
    } else if (color >= 0 && sub > 0 && mine.kind == EP_TCP) {
        char host[64];
        snprintf(host, sizeof host, "%s", mine.host);
        if (!host[0] && wk_comm_tcp_addr(world, 1, host, sizeof host)) bad = 1; /* world's rank 0 opened it */
        else if (wk_comm_tcp_connect(host, (int)mine.port, sub, size, mine.token, world->timeout_s, &c)) bad = 1;
    } else if (color >= 0 && sub == 0 && mine.kind == EP_TCP && size > 1) {
        if (wk_comm_tcp_accept(lfd, size, mine.token, world->timeout_s, &c)) bad = 1;
    }
    if (bad) CM_ERR("rank %d could not join its sub-group (color %d) of the group", me, color);
    float f = (float)bad;
    if ((rc = world->ops->all_reduce_sum(world, &f, 1)) == 0 && f != 0) rc = LLM_EIO;
out:
    if (lfd >= 0) close(lfd);
    if (rc) {
        wk_comm_free(c);
        return rc;
    }
    if (c) c->timeout_s = world->timeout_s;
    *out = c;
    return 0;
}

/* A split whose sub-group is this rank alone is no pair: freed. */
static int pair(wk_comm *world, int color, int key, int use_tcp, wk_comm **out) {
    int rc = wk_comm_split(world, color, key, use_tcp, out);
    if (!rc && *out && (*out)->size < 2) {
        wk_comm_free(*out);
        *out = NULL;
    }
    return rc;
}

int wk_comm_pipeline(wk_comm *world, int pp, int stage_tcp, int pipe_tcp, wk_comm_pipe *out) {
    memset(out, 0, sizeof *out);
    if (pp < 2 || world->size % pp) return LLM_EINVAL;
    int T = world->size / pp, s = world->rank / T, first = world->rank % T == 0, rc = 0;
    wk_comm *a = NULL, *b = NULL;
    if (T > 1) rc = wk_comm_split(world, s, world->rank % T, stage_tcp, &out->stage);
    if (!rc) rc = pair(world, first ? s / 2 : -1, s, pipe_tcp, &a);              /* (0,1), (2,3), ... */
    if (!rc) rc = pair(world, first && s > 0 ? (s - 1) / 2 : -1, s, pipe_tcp, &b); /* (1,2), (3,4), ... */
    out->next = s % 2 ? b : a;
    out->prev = s % 2 ? a : b;
    if (!rc) rc = pair(world, first && (s == 0 || s == pp - 1) ? 0 : -1, s, pipe_tcp, &out->ring);
    if (rc) wk_comm_pipe_free(out);
    return rc;
}

void wk_comm_pipe_free(wk_comm_pipe *p) {
    wk_comm_free(p->ring);
    wk_comm_free(p->stage);
    wk_comm_free(p->prev);
    wk_comm_free(p->next);
    memset(p, 0, sizeof *p);
}
