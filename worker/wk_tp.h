/* wk_tp.h - a tensor-parallel worker group.
 *
 * Rank 0 is the driver: it runs the engine and the RPC server and
 * broadcasts each step to ranks 1..N-1, which run the same forward on their
 * shard (wk_model: Megatron split, each rank maps only its slice of the
 * weights and holds only its KV heads). The group meets over a control
 * channel (NNG REQ/REP at --group-address): each rank sends its rank and pid,
 * rank 0 answers with the comm backend and what it needs (the shared-memory
 * segment's name; an NCCL unique id with --device cuda; for CPU ranks on
 * more than one host, its TCP data port and the token to open it with).
 *
 * Lifetime: ranks that rank 0 starts are its children and die with it
 * (PR_SET_PDEATHSIG); rank 0 notices a dead rank at its next collective and
 * exits, so a group goes down whole, never half-hung. */
#ifndef WK_TP_H
#define WK_TP_H

#include "wk_engine.h"

#include <signal.h>

typedef struct wk_tp wk_tp;

typedef struct {
    int size, rank;
    const char *group_addr;      /* the control channel; NULL on rank 0: ipc in /tmp */
    /* how many ranks this host runs from this process on, itself included:
     * it starts ranks rank+1..rank+spawn-1 as its children (argv re-run with
     * --rank R --group-address ADDR appended), which die with it; the group's
     * other ranks join on their own (other hosts: --node-index). 0 or 1: none */
    int spawn;
    int use_nccl, device;        /* the NCCL backend on CUDA device `device`, else CPU shared memory */
    int use_tcp;                 /* CPU ranks on more than one host: the TCP backend instead of shared memory */
    /* --join-timeout: how long rank 0 waits for every rank, and a rank for
     * the group to form (pods still pending or pulling images); 0: no limit */
    double join_timeout_s;
    /* --collective-timeout: the deadline of one wait inside a step (wk_comm.timeout_s); 0: none */
    double collective_timeout_s;
    /* --load-timeout: how long a follower waits for rank 0's model load; 0: no limit */
    double load_timeout_s;
    /* --pipeline-parallel-size: the ranks are pp stages of size/pp, rank = stage x (size/pp) + its TP rank;
     * 0 or 1: one stage */
    int pp;
    /* --ranks-per-node (0: one host): which ranks share a host, so a stage on one host meets over shared
     * memory even when the group spans hosts */
    int per_node;
} wk_tp_opts;

/* Forms the group: rank 0 leads (starts its host's ranks, answers the
 * joins), the others join; every rank meets at a barrier before it loads. */
int wk_tp_start(const wk_tp_opts *o, int argc, char **argv, wk_tp **out, char *err, size_t errlen);
wk_comm *wk_tp_comm(wk_tp *t);
/* With pipeline stages the group splits its wires (wk_comm_pipeline): each stage's own TP comm (NULL with
 * one rank a stage), and the pairs between the stages' first ranks; wk_tp_pipe: those, NULL with one
 * stage, whose TP comm is the group's. */
wk_comm *wk_tp_stage_comm(wk_tp *t);
const wk_comm_pipe *wk_tp_pipe(wk_tp *t);
/* wk_model_load for this rank's shard (t NULL: the whole model). */
int wk_model_load_tp(const wk_model_opts *o, wk_tp *t, wk_model **out, char *err, size_t errlen);
/* Rank 0, after creating the engine: tells the ranks the cache geometry. */
int wk_tp_attach(wk_tp *t, wk_engine *e, char *err, size_t errlen);
/* Ranks 1..N-1: run steps until rank 0 shuts the group down. */
int wk_tp_follow(wk_tp *t, wk_model *m, const wk_engine_opts *eo, volatile sig_atomic_t *stop, char *err,
                 size_t errlen);
/* Rank 0: ends the followers' loops and reaps them. Then frees. */
void wk_tp_free(wk_tp *t);

#endif
