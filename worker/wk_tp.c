#include "wk_tp.h"
#include "wk_wire.h"
#include "cm_error.h"
#include "cm_log.h"
#include "kernels.h"
#include "pr_wire.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TP_MAGIC 0x6c6d7470u
#define TP_VERSION 4 /* 2: the join carries the deployment's secret; 3: the TCP backend; 4: rank 0's kernels */

enum { BACKEND_SHM = 1, BACKEND_NCCL = 2, BACKEND_TCP = 3 };

typedef struct {
    uint32_t magic, version, rank, size;
    int32_t pid;
    uint32_t secret_len;         /* --rpc-secret-file: a rank without it learns nothing of the group */
    uint8_t secret[1024];
} join_req;

typedef struct {
    uint32_t magic, version, status, backend;
    char shm_name[64];
    uint8_t nccl_id[WK_NCCL_ID_BYTES];
    uint32_t tcp_port;           /* BACKEND_TCP: rank 0's data port, and the token a connection opens with */
    uint8_t tcp_token[WK_TCP_TOKEN_BYTES];
    char isa[16];                /* rank 0's CPU kernels (kn_isa_name) and AMX: every rank computes with them */
    uint32_t amx;
    char err[128];
} join_rep;

typedef struct {
    int32_t magic, block_size, n_blocks, kv_type;
} cache_geom;

struct wk_tp {
    int size, rank, backend, device, pp, per_node;
    int stage_nccl;        /* GPU pipeline stages of several ranks: each stage's TP comm is NCCL */
    wk_comm_pipe pc;       /* pipeline stages: the wires split from comm (wk_comm_pipeline); else empty */
    wk_comm *stage_cpu;    /* stage_nccl: the stage's CPU comm the NCCL one's id went over (kept for the end) */
    double join_s, step_s, load_s; /* the deadlines (wk_tp_opts) */
    wk_comm *comm;
    pid_t child[64];
    int n_child;
    char addr[256];
    int attached;
    wk_model *m;
};

wk_comm *wk_tp_comm(wk_tp *t) { return t ? t->comm : NULL; }

wk_comm *wk_tp_stage_comm(wk_tp *t) {
    if (!t) return NULL;
    return t->pp > 1 ? t->pc.stage : t->comm;
}

const wk_comm_pipe *wk_tp_pipe(wk_tp *t) { return t && t->pp > 1 ? &t->pc : NULL; }

/* A GPU stage's TP comm: an NCCL communicator of the stage's ranks, from an id its first rank makes and
 * hands out over the stage's CPU comm; that one stays for the end (wk_tp_free). */
static int stage_nccl(wk_tp *t, int T, char *err, size_t errlen) {
#ifdef LLMSERVE_HAVE_NCCL
    uint8_t id[WK_NCCL_ID_BYTES] = {0};
    wk_comm *cpu = t->pc.stage;
    float bad = cpu->rank == 0 && wk_comm_nccl_unique_id(id) ? 1.f : 0.f;
    int rc = cpu->ops->all_reduce_sum(cpu, &bad, 1);
    if (!rc && bad) rc = LLM_EIO;
    if (!rc) rc = cpu->ops->broadcast(cpu, id, sizeof id, 0);
    wk_comm *n = NULL;
    if (!rc) rc = wk_comm_nccl_create(id, cpu->rank, T, t->device, t->join_s, &n);
    if (rc) {
        snprintf(err, errlen, "the pipeline stage's NCCL communicator: %s", cm_strerror(rc));
        return rc;
    }
    n->timeout_s = t->step_s;
    t->stage_cpu = cpu;
    t->pc.stage = n;
    if (t->rank == 0) CM_INFO("each pipeline stage's %d GPUs over NCCL, the stages' hops staged through the host", T);
    return 0;
#else
    (void)T;
    snprintf(err, errlen, "GPU pipeline stages of several ranks need NCCL: this build has none");
    return LLM_EUNSUP;
#endif
}

/* Pipeline stages: each stage's TP comm (shared memory where its ranks share a host, else TCP around its
 * first rank), the pairs between neighbouring stages' first ranks and the ring pair back to stage 0 (TCP
 * where the group spans hosts), split from the group's comm within --join-timeout. */
static int split(wk_tp *t, char *err, size_t errlen) {
    int T = t->size / t->pp, s = t->rank / T;
    int spans = t->backend == BACKEND_TCP && t->per_node > 0 && s * T / t->per_node != (s * T + T - 1) / t->per_node;
    t->comm->timeout_s = t->join_s;
    int rc = wk_comm_pipeline(t->comm, t->pp, spans, t->backend == BACKEND_TCP, &t->pc);
    t->comm->timeout_s = t->step_s;
    if (rc) {
        snprintf(err, errlen, "the pipeline's stages could not form their own comms: %s", cm_strerror(rc));
        return rc;
    }
    wk_comm *w[4] = {t->pc.stage, t->pc.prev, t->pc.next, t->pc.ring};
    for (int i = 0; i < 4; i++)
        if (w[i]) w[i]->timeout_s = t->step_s;
    if (t->stage_nccl && (rc = stage_nccl(t, T, err, errlen))) return rc;
    const char *hops = t->backend == BACKEND_TCP ? "TCP" : "shared memory";
    if (t->rank == 0 && T > 1)
        CM_INFO("%d pipeline stages of %d ranks: each stage's collectives over %s, the stages' hops over %s", t->pp, T,
                spans ? "TCP" : "shared memory", hops);
    else if (t->rank == 0)
        CM_INFO("%d pipeline stages of one rank: the stages' hops over %s", t->pp, hops);
    return 0;
}

static int spawn_rank(wk_tp *t, int r, int argc, char **argv, char *err, size_t errlen) {
    char **av = calloc((size_t)argc + 7, sizeof *av);
    char rs[16];
    if (!av) return LLM_ENOMEM;
    snprintf(rs, sizeof rs, "%d", r);
    int n = 0;
    for (int i = 0; i < argc; i++) av[n++] = argv[i];
    av[n++] = "--rank";
    av[n++] = rs;
    av[n++] = "--group-address";
    av[n++] = t->addr;
    av[n++] = "--health-port"; /* the driver's probes speak for the group: a child binding them too would fail */
    av[n++] = "0";
    av[n] = NULL;
    pid_t ppid = getpid(), pid = fork();
    if (pid < 0) {
        free(av);
        snprintf(err, errlen, "fork: %s", strerror(errno));
        return LLM_EIO;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* the group dies with its driver */
        if (getppid() != ppid) _exit(1);
        execv("/proc/self/exe", av);
        _exit(127);
    }
    free(av);
    t->child[t->n_child++] = pid;
    return 0;
}

/* Every rank meets once (within --join-timeout: a rank's pod may still be
 * starting); from then on a wait inside a collective has the step deadline. */
static int formed(wk_tp *t, char *err, size_t errlen) {
    t->comm->timeout_s = t->join_s;
    int rc = t->comm->ops->barrier(t->comm);
    if (rc) snprintf(err, errlen, "a rank died or did not arrive while the group formed");
    t->comm->timeout_s = t->step_s;
    return rc;
}

static int lead(wk_tp *t, int spawn, int argc, char **argv, char *err, size_t errlen) {
    char shm_name[64] = "";
    uint8_t nccl_id[WK_NCCL_ID_BYTES] = {0}, token[WK_TCP_TOKEN_BYTES] = {0};
    int rc, lfd = -1, port = 0;
    if (t->backend == BACKEND_TCP) {
        if ((rc = wk_comm_tcp_listen(&lfd, &port))) {
            snprintf(err, errlen, "cannot listen for the group's TCP connections: %s", strerror(errno));
            return rc;
        }
        if (getrandom(token, sizeof token, 0) != (ssize_t)sizeof token) {
            close(lfd);
            snprintf(err, errlen, "no random bytes for the group's token");
            return LLM_EIO;
        }
    } else if (t->backend == BACKEND_SHM) {
        rc = wk_comm_shm_create(t->size, shm_name, sizeof shm_name, &t->comm);
        if (rc) {
            snprintf(err, errlen, "cannot create the shared-memory segment: %s", cm_strerror(rc));
            return rc;
        }
        wk_comm_shm_set_pid(t->comm, 0, getpid(), 0);
    } else {
#ifdef LLMSERVE_HAVE_NCCL
        if ((rc = wk_comm_nccl_unique_id(nccl_id))) {
            snprintf(err, errlen, "ncclGetUniqueId failed");
            return rc;
        }
#else
        snprintf(err, errlen, "this build has no NCCL");
        return LLM_EUNSUP;
#endif
    }
    nng_socket rep;
    int rv = nng_rep0_open(&rep);
    if (!rv) rv = nng_socket_set_ms(rep, NNG_OPT_RECVTIMEO, 1000);
    if (!rv) rv = nng_socket_set_size(rep, NNG_OPT_RECVMAXSZ, 4096);
    if (!rv) rv = nng_listen(rep, t->addr, NULL, 0);
    if (rv) {
        snprintf(err, errlen, "cannot listen on %s: %s", t->addr, nng_strerror(rv));
        if (lfd >= 0) close(lfd);
        return LLM_EIO;
    }
    for (int r = 1; r < spawn && r < t->size; r++) /* this host's other ranks */
        if ((rc = spawn_rank(t, r, argc, argv, err, errlen))) goto out;
    uint8_t joined[64] = {0};
    int n_joined = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (n_joined < t->size - 1) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t->join_s > 0 && (double)(t1.tv_sec - t0.tv_sec) > t->join_s) {
            snprintf(err, errlen, "only %d of %d ranks joined within %.0f s (--join-timeout)", n_joined + 1, t->size,
                     t->join_s);
            rc = LLM_ETIMEDOUT;
            goto out;
        }
        for (int i = 0; i < t->n_child; i++) {
            int st;
            if (waitpid(t->child[i], &st, WNOHANG) == t->child[i]) {
                snprintf(err, errlen, "rank process %d exited before joining (status %d)", (int)t->child[i], st);
                t->child[i] = 0;
                rc = LLM_EIO;
                goto out;
            }
        }
        nng_msg *msg;
        rv = nng_recvmsg(rep, &msg, 0);
        if (rv == NNG_ETIMEDOUT) continue;
        if (rv) {
            snprintf(err, errlen, "control channel: %s", nng_strerror(rv));
            rc = LLM_EIO;
            goto out;
        }
        join_req q;
        join_rep a;
        memset(&a, 0, sizeof a);
        a.magic = TP_MAGIC;
        a.version = TP_VERSION;
        int ok = nng_msg_len(msg) == sizeof q;
        if (ok) memcpy(&q, nng_msg_body(msg), sizeof q);
        else if (nng_msg_len(msg) >= 8) memcpy(&q, nng_msg_body(msg), 8); /* its magic and version, for the error */
        if (nng_msg_len(msg) < 8 || q.magic != TP_MAGIC) {
            snprintf(a.err, sizeof a.err, "malformed join message");
        } else if (q.version != TP_VERSION) {
            snprintf(a.err, sizeof a.err, "rank speaks group protocol %u, rank 0 speaks %u", q.version, TP_VERSION);
        } else if (!ok) {
            snprintf(a.err, sizeof a.err, "malformed join message");
        } else if (q.secret_len > sizeof q.secret || !pr_secret_check(q.secret, q.secret_len)) {
            snprintf(a.err, sizeof a.err, "the rank lacks the group's secret (--rpc-secret-file)");
        } else if (q.size != (uint32_t)t->size || q.rank == 0 || q.rank >= (uint32_t)t->size || joined[q.rank]) {
            snprintf(a.err, sizeof a.err, "rank %u of %u refused (group of %d, already joined: %d)", q.rank, q.size,
                     t->size, q.rank < 64 ? joined[q.rank] : 0);
        } else {
            a.status = 1;
            a.backend = (uint32_t)t->backend;
            snprintf(a.shm_name, sizeof a.shm_name, "%s", shm_name);
            memcpy(a.nccl_id, nccl_id, sizeof nccl_id);
            a.tcp_port = (uint32_t)port;
            memcpy(a.tcp_token, token, sizeof token);
            snprintf(a.isa, sizeof a.isa, "%s", kn_isa_name());
            a.amx = (uint32_t)kn_amx_active();
            joined[q.rank] = 1;
            n_joined++;
            int child = 0;
            for (int i = 0; i < t->n_child; i++) child |= t->child[i] == q.pid;
            if (t->comm) wk_comm_shm_set_pid(t->comm, (int)q.rank, q.pid, child);
            CM_INFO("rank %u (pid %d) joined the group", q.rank, q.pid);
        }
        if (!a.status) CM_WARN("control channel: %s", a.err);
        nng_msg_clear(msg);
        nng_msg_append(msg, &a, sizeof a);
        if (nng_sendmsg(rep, msg, 0)) nng_msg_free(msg);
    }
    if (t->backend == BACKEND_TCP) {
        if ((rc = wk_comm_tcp_accept(lfd, t->size, token, t->join_s, &t->comm))) {
            snprintf(err, errlen, "the ranks did not all connect over TCP within --join-timeout");
            goto out;
        }
        CM_INFO("the group spans hosts: its collectives go over TCP (rank 0's port %d)", port);
    }
#ifdef LLMSERVE_HAVE_NCCL
    if (t->backend == BACKEND_NCCL && (rc = wk_comm_nccl_create(nccl_id, 0, t->size, 0, t->join_s, &t->comm))) {
        snprintf(err, errlen, "NCCL communicator: %s", cm_strerror(rc));
        goto out;
    }
#endif
    rc = formed(t, err, errlen);
    if (!rc && t->pp > 1) rc = split(t, err, errlen);
out:
    nng_close(rep);
    if (lfd >= 0) close(lfd);
    return rc;
}

/* HOST of tcp://HOST:PORT (tcp4://, tcp6://, [v6] brackets dropped). */
static int host_of(const char *addr, char *host, size_t len) {
    const char *p = strstr(addr, "://");
    if (!p || strncmp(addr, "tcp", 3)) return LLM_EINVAL;
    p += 3;
    const char *colon = strrchr(p, ':');
    if (!colon || colon == p || (size_t)(colon - p) >= len) return LLM_EINVAL;
    if (*p == '[' && colon[-1] == ']') {
        p++;
        colon--;
    }
    memcpy(host, p, (size_t)(colon - p));
    host[colon - p] = 0;
    return 0;
}

/* The kernels rank 0 measured and chose, taken before this rank packs its weights: each rank choosing
 * its own by a timing could differ under load, and a group's answers would then depend on it. A CPU
 * that lacks them (hosts of different kinds) keeps its own, said in the log. */
static void follow_kernels(const join_rep *a) {
    if (kn_follow_isa(a->isa, (int)a->amx, "rank 0's choice"))
        CM_WARN("rank 0 computes with %s%s, which this CPU lacks: this rank uses %s (the group's answers may differ "
                "in their last bits from a group of one kind of CPU)", a->isa, a->amx ? " and AMX" : "", kn_isa_name());
}

static int join(wk_tp *t, char *err, size_t errlen) {
    nng_socket req;
    int rv = nng_req0_open(&req);
    nng_duration ms = t->join_s > 0 ? (nng_duration)(t->join_s * 1e3) : NNG_DURATION_INFINITE;
    if (!rv) rv = nng_socket_set_ms(req, NNG_OPT_RECVTIMEO, ms);
    if (!rv) rv = nng_socket_set_ms(req, NNG_OPT_SENDTIMEO, ms);
    if (!rv) rv = nng_socket_set_size(req, NNG_OPT_RECVMAXSZ, 4096);
    if (!rv) rv = nng_dial(req, t->addr, NULL, NNG_FLAG_NONBLOCK);
    join_req q = {TP_MAGIC, TP_VERSION, (uint32_t)t->rank, (uint32_t)t->size, (int32_t)getpid(), 0, {0}};
    const uint8_t *sec;
    q.secret_len = (uint32_t)pr_secret(&sec);
    memcpy(q.secret, sec, q.secret_len);
    if (!rv) rv = nng_send(req, &q, sizeof q, 0);
    void *buf = NULL;
    size_t len = 0;
    if (!rv) rv = nng_recv(req, &buf, &len, NNG_FLAG_ALLOC);
    nng_close(req);
    if (rv) {
        snprintf(err, errlen, "cannot join the group at %s: %s", t->addr, nng_strerror(rv));
        return LLM_EIO;
    }
    join_rep a;
    int ok = len == sizeof a;
    if (ok) memcpy(&a, buf, sizeof a);
    nng_free(buf, len);
    if (!ok || a.magic != TP_MAGIC) {
        snprintf(err, errlen, "malformed answer from rank 0");
        return LLM_EFORMAT;
    }
    a.err[sizeof a.err - 1] = 0;
    a.shm_name[sizeof a.shm_name - 1] = 0;
    a.isa[sizeof a.isa - 1] = 0;
    if (!a.status) {
        snprintf(err, errlen, "rank 0 refused: %s", a.err);
        return LLM_EINVAL;
    }
    follow_kernels(&a);
    if (a.backend != (uint32_t)t->backend) {
        snprintf(err, errlen, "rank 0 uses comm backend %u, this rank was started for %d", a.backend, t->backend);
        return LLM_EUNSUP;
    }
    int rc;
    if (a.backend == BACKEND_TCP) {
        char host[256];
        if (host_of(t->addr, host, sizeof host)) {
            snprintf(err, errlen, "a group across hosts needs a tcp:// --group-address, not %s", t->addr);
            return LLM_EINVAL;
        }
        if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "*")) /* rank 0's own host listening */
            snprintf(host, sizeof host, "127.0.0.1");
        rc = wk_comm_tcp_connect(host, (int)a.tcp_port, t->rank, t->size, a.tcp_token, t->join_s, &t->comm);
        if (rc) {
            snprintf(err, errlen, "cannot connect to rank 0 at %s port %u: %s", host, a.tcp_port, cm_strerror(rc));
            return rc;
        }
    } else if (a.backend == BACKEND_SHM) {
        rc = wk_comm_shm_attach(a.shm_name, t->rank, &t->comm);
        if (rc) {
            snprintf(err, errlen, "cannot attach to %s: %s", a.shm_name, cm_strerror(rc));
            return rc;
        }
        wk_comm_shm_set_pid(t->comm, t->rank, getpid(), 0);
    } else {
#ifdef LLMSERVE_HAVE_NCCL
        rc = wk_comm_nccl_create(a.nccl_id, t->rank, t->size, t->device, t->join_s, &t->comm);
        if (rc) {
            snprintf(err, errlen, "NCCL communicator: %s", cm_strerror(rc));
            return rc;
        }
#else
        snprintf(err, errlen, "this build has no NCCL");
        return LLM_EUNSUP;
#endif
    }
    rc = formed(t, err, errlen);
    if (!rc && t->pp > 1) rc = split(t, err, errlen);
    return rc;
}

int wk_tp_start(const wk_tp_opts *o, int argc, char **argv, wk_tp **out, char *err, size_t errlen) {
    *out = NULL;
    int size = o->size, rank = o->rank, spawn = o->spawn;
    if (size < 2 || size > 64 || rank < 0 || rank >= size) return LLM_EINVAL;
    wk_tp *t = calloc(1, sizeof *t);
    if (!t) return LLM_ENOMEM;
    t->size = size;
    t->rank = rank;
    /* GPU pipeline stages: the group forms on the CPU backends (the hops are host-staged) and each stage of
     * several GPUs gets an NCCL communicator of its own (split) */
    t->backend = o->use_nccl && o->pp <= 1 ? BACKEND_NCCL : o->use_tcp ? BACKEND_TCP : BACKEND_SHM;
    t->stage_nccl = o->use_nccl && o->pp > 1 && size / o->pp > 1;
    t->device = o->device;
    t->join_s = o->join_timeout_s;
    t->step_s = o->collective_timeout_s;
    t->load_s = o->load_timeout_s;
    t->pp = o->pp > 1 ? o->pp : 1;
    t->per_node = o->per_node;
    if (size % t->pp) {
        snprintf(err, errlen, "%d ranks do not split into %d pipeline stages", size, t->pp);
        free(t);
        return LLM_EINVAL;
    }
    if (o->group_addr) snprintf(t->addr, sizeof t->addr, "%s", o->group_addr);
    else if (rank == 0) snprintf(t->addr, sizeof t->addr, "ipc:///tmp/llmserve-tp-%d.ipc", (int)getpid());
    else {
        snprintf(err, errlen, "--rank %d needs --group-address", rank);
        free(t);
        return LLM_EINVAL;
    }
    int rc = 0;
    if (rank > 0) /* a host's first rank starts the host's others; they join rank 0 themselves */
        for (int r = rank + 1; r < rank + spawn && r < size && !rc; r++) rc = spawn_rank(t, r, argc, argv, err, errlen);
    if (!rc) rc = rank == 0 ? lead(t, spawn, argc, argv, err, errlen) : join(t, err, errlen);
    if (rc) {
        wk_tp_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int wk_model_load_tp(const wk_model_opts *o, wk_tp *t, wk_model **out, char *err, size_t errlen) {
    wk_model_opts mo = *o;
    mo.comm = wk_tp_stage_comm(t);
    mo.pipe = wk_tp_pipe(t);
    mo.pp_rank = t && t->pp > 1 ? t->rank / (t->size / t->pp) : 0;
    mo.gpu = t ? t->device : 0;
    int rc = wk_model_load(&mo, out, err, errlen);
    if (!rc && t) t->m = *out;
    return rc;
}

int wk_tp_attach(wk_tp *t, wk_engine *e, char *err, size_t errlen) {
    const wk_engine_opts *o = wk_engine_options(e);
    cache_geom g = {(int32_t)TP_MAGIC, o->block_size, o->n_blocks, o->kv_type};
    t->comm->timeout_s = t->load_s; /* a rank may still be loading its shard: --load-timeout bounds that */
    int rc = t->comm->ops->broadcast(t->comm, &g, sizeof g, 0);
    t->comm->timeout_s = t->step_s;
    if (rc) {
        snprintf(err, errlen, "a rank died (or did not load within --load-timeout) before serving");
        return rc;
    }
    wk_engine_cache(e)->record_copies = 1;
    t->attached = 1;
    return 0;
}

int wk_tp_follow(wk_tp *t, wk_model *m, const wk_engine_opts *eo, volatile sig_atomic_t *stop, char *err,
                 size_t errlen) {
    (void)eo;
    cache_geom g;
    t->comm->timeout_s = t->load_s; /* rank 0 may still be loading its shard: --load-timeout bounds that */
    int rc = t->comm->ops->broadcast(t->comm, &g, sizeof g, 0);
    t->comm->timeout_s = t->step_s;
    if (rc) {
        snprintf(err, errlen, "rank 0 went away (or did not load within --load-timeout) before serving");
        return rc;
    }
    wk_cache *c = NULL;
    if (g.magic != (int32_t)TP_MAGIC || (rc = wk_cache_create(m, g.kv_type, g.block_size, g.n_blocks, &c))) {
        snprintf(err, errlen, "cannot create the KV cache rank 0 asked for (%d blocks of %d)", g.n_blocks, g.block_size);
        return rc ? rc : LLM_EFORMAT;
    }
    CM_INFO("rank %d: KV cache %d blocks of %d tokens, %zu bytes per token on this rank", t->rank, g.n_blocks,
            g.block_size, wk_kv_bytes_per_token(m, g.kv_type));
    uint64_t steps = 0;
    for (;;) {
        int shutdown;
        rc = wk_forward_follow(m, c, &shutdown);
        if (rc) {
            snprintf(err, errlen, "step %llu failed: %s", (unsigned long long)steps, cm_strerror(rc));
            break;
        }
        if (shutdown) break;
        steps++;
        (void)stop; /* rank 0 decides when the group stops */
    }
    int r2 = wk_wire_back_stop(m); /* the last stage's way back: what it still holds goes first */
    if (!rc && r2) {
        snprintf(err, errlen, "the logits of step %llu did not reach rank 0: %s", (unsigned long long)steps,
                 cm_strerror(r2));
        rc = r2;
    }
    wk_cache_free(c);
    return rc;
}

void wk_tp_free(wk_tp *t) {
    if (!t) return;
    if (t->rank == 0 && t->comm && t->m && t->attached) wk_forward_shutdown(t->m);
    for (int i = 0; i < t->n_child; i++) {
        if (!t->child[i]) continue;
        int st;
        for (int k = 0; k < 200 && waitpid(t->child[i], &st, WNOHANG) == 0; k++) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        if (waitpid(t->child[i], &st, WNOHANG) == 0) {
            kill(t->child[i], SIGKILL);
            waitpid(t->child[i], &st, 0);
        }
    }
    wk_comm_pipe_free(&t->pc);
    wk_comm_free(t->stage_cpu);
    wk_comm_free(t->comm);
    free(t);
}
