/* wk_comm.h - collective operations between the ranks of one worker group.
 *
 * Three backends behind one interface: CPU shared memory (ranks on one
 * machine, no GPU needed), TCP (CPU ranks on different hosts) and NCCL (GPU
 * buffers; compiled when CUDA is).
 * Every operation is deterministic and identical on every rank: sums are
 * taken in rank order, so all ranks hold bit-identical results and never
 * diverge. A dead peer, or one past the deadline (timeout_s), makes the
 * operation return LLM_EIO on every rank (never a hang). */
#ifndef WK_COMM_H
#define WK_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct wk_comm wk_comm;

typedef struct {
    int (*all_reduce_sum)(wk_comm *c, float *buf, size_t n);
    /* Rows of width[rank] floats from every rank, side by side: out is
     * [rows][sum of widths], rank k's columns at offset sum(width[0..k)).
     * out may be NULL on ranks that do not need the result. */
    int (*all_gather_cols)(wk_comm *c, const float *in, int rows, const int *width, float *out);
    int (*broadcast)(wk_comm *c, void *buf, size_t bytes, int root);
    int (*barrier)(wk_comm *c);
    void (*destroy)(wk_comm *c);
    /* NCCL only (NULL on the CPU backends, whose operations are done when they return): a collective on
     * device buffers is only ordered after the kernels before it and before the kernels after it (events
     * between the compute stream and NCCL's), and returns once enqueued. settle waits, within the deadline
     * and watching NCCL's asynchronous error, until all of it has finished: before the host reads a
     * result (the logits, a stage's rows), so a dead peer still ends in LLM_EIO rather than a hang. */
    int (*settle)(wk_comm *c);
    /* NCCL only: the device staging its collectives use (a gather of up to `bytes`, a host broadcast),
     * allocated now, at load, so that nothing grows after the KV pool was sized from what is free. */
    int (*reserve)(wk_comm *c, size_t bytes);
} wk_comm_ops;

/* The default deadline of one wait inside a collective (--collective-timeout). */
#define WK_COMM_TIMEOUT_S 120.0

struct wk_comm {
    int rank, size;
    /* The deadline of one wait inside a collective, in seconds (0: none): a
     * rank that does not arrive within it is taken as hung and the group
     * ends (LLM_EIO on every rank), on both backends alike. An idle group
     * stays within it because rank 0 sends a keep-alive step
     * (wk_forward_keepalive); a wait that may rightly be long (a follower
     * waiting for rank 0's model load) widens it for that wait. */
    double timeout_s;
    const wk_comm_ops *ops;
    void *impl;
};

/* CPU shared memory. Rank 0 creates the segment (name written to name_out,
 * at least 64 bytes); the others attach by that name. pids: the group's
 * process ids, checked while waiting so a dead rank is noticed. */
int wk_comm_shm_create(int size, char *name_out, size_t name_len, wk_comm **out);
int wk_comm_shm_attach(const char *name, int rank, wk_comm **out);
/* Records this rank's pid (and, on rank 0, which pids are its children to reap). */
void wk_comm_shm_set_pid(wk_comm *c, int rank, pid_t pid, int is_child);

/* TCP (ranks on different hosts; CPU), a star around rank 0 (wk_comm_tcp.c). Rank 0 listens on an ephemeral
 * port of every interface before the group's join and accepts its ranks after it; a rank connects to rank 0's
 * host at that port. Each connection opens with the token rank 0 handed out in the join. */
#define WK_TCP_TOKEN_BYTES 16
int wk_comm_tcp_listen(int *fd, int *port);
int wk_comm_tcp_accept(int listen_fd, int size, const uint8_t token[WK_TCP_TOKEN_BYTES], double timeout_s,
                       wk_comm **out);
int wk_comm_tcp_connect(const char *host, int port, int rank, int size, const uint8_t token[WK_TCP_TOKEN_BYTES],
                        double timeout_s, wk_comm **out);

/* A TCP comm's addresses, numeric: of_root 0, this rank's end of its connection to rank 0 (the address
 * its host is reached at from there); 1, rank 0's. Not on rank 0 (LLM_EINVAL). */
int wk_comm_tcp_addr(wk_comm *c, int of_root, char *host, size_t len);

/* Sub-groups of a formed group, as MPI_Comm_split (wk_comm_split.c): a collective over every rank of
 * world. The ranks that pass the same color >= 0 form one comm, ranked by key (ties by world rank); color
 * < 0: in none (*out NULL). A sub-group meets over shared memory (its ranks on one host) or, use_tcp (its
 * first rank's choice), over TCP around its first rank, which needs world on TCP: the address comes from
 * world's connections. Within world's deadline; a rank that fails makes it fail on every rank. A
 * pipeline's stages (each a TP group of its own) and the pipe between their first ranks come from here. */
int wk_comm_split(wk_comm *world, int color, int key, int use_tcp, wk_comm **out);

/* A pipeline's wires, split from a formed group of pp stages of size/pp ranks (rank = stage x that + its TP
 * rank): its stage's TP comm (NULL with one rank a stage; over TCP when stage_tcp), and on each stage's
 * first rank the pair with the stage before (prev) and after (next), and on stage 0's and the last one's
 * the ring pair that carries the logits back (pipe_tcp: the pairs over TCP). In a pair the earlier stage is
 * rank 0 (in the ring, stage 0). The ring is a comm of its own even with two stages (where it joins the
 * same two ranks as the pair): the last stage sends on it from a thread of its own (wk_wire.h). */
typedef struct {
    wk_comm *stage, *prev, *next, *ring;
} wk_comm_pipe;
int wk_comm_pipeline(wk_comm *world, int pp, int stage_tcp, int pipe_tcp, wk_comm_pipe *out);
void wk_comm_pipe_free(wk_comm_pipe *p);

/* NCCL (builds with CUDA and NCCL: LLMSERVE_HAVE_NCCL): unique id from
 * rank 0, passed over the group's control channel. Buffers are device
 * pointers (broadcast also takes host memory). */
#define WK_NCCL_ID_BYTES 128
#ifdef LLMSERVE_HAVE_NCCL
int wk_comm_nccl_unique_id(uint8_t id[WK_NCCL_ID_BYTES]);
/* init_timeout_s: how long the communicator's init waits for every rank (0: no limit). */
int wk_comm_nccl_create(const uint8_t id[WK_NCCL_ID_BYTES], int rank, int size, int device, double init_timeout_s,
                        wk_comm **out);
#endif

static inline void wk_comm_free(wk_comm *c) {
    if (c) c->ops->destroy(c);
}

#endif
