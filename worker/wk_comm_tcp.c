/* The CPU backend of wk_comm for a group whose ranks are on different hosts
 * (--ranks-per-node below --tensor-parallel-size): TCP, a star around rank
 * 0. Every other rank holds one connection to rank 0; an all-reduce sends
 * each rank's buffer to rank 0, which adds them in rank order (as the
 * shared-memory backend does, so the sums are bit-identical to it) and
 * sends the result back. For the group sizes a CPU group spans hosts with
 * (two to a few), a star moves no more bytes through rank 0's link than a
 * ring would through each, at one hop of latency instead of 2(N-1).
 *
 * A connection opens with rank 0's token (handed out in the group's join,
 * which checks the deployment's secret), so only ranks that joined get in.
 * Every read and write waits at most the comm's deadline; a peer past it,
 * or gone (EOF, reset), closes every connection of this rank, so the others
 * fail too: every rank returns LLM_EIO, never a hang. */
#include "wk_comm.h"
#include "cm_error.h"
#include "cm_log.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
#define HELLO_MAGIC 0x6c6d7463u

typedef struct {
    uint32_t magic, rank;
    uint8_t token[WK_TCP_TOKEN_BYTES];
} hello;

typedef struct {
    int fd[MAX_RANKS]; /* rank 0: fd[r] to rank r; the others: fd[0] to rank 0 */
    int dead;
    float *tmp;        /* rank 0: what one rank sent */
    size_t cap;        /* floats tmp holds */
} tcp_impl;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void set_opts(int fd) {
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* a step's small all-reduces leave at once */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

#define SPIN_S 0.05

/* All of len bytes in (wr 0) or out (wr 1), each wait within timeout_s (0: none). */
static int io_full(int fd, void *p, size_t len, int wr, double timeout_s) {
    char *b = p;
    double end = timeout_s > 0 ? now_s() + timeout_s : 0, spin_end = 0;
    while (len) {
        ssize_t n = wr ? send(fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, b, len, MSG_DONTWAIT);
        if (n > 0) {
            b += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return LLM_EIO; /* the peer closed */
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return LLM_EIO;
        /* the peer is usually a few ms away (a stage's layers, a rank's share): yield for up to SPIN_S before
         * sleeping in poll, as the shm backend does; a core that halts meanwhile (a VM's vCPU especially)
         * comes back slower to the next step's compute than the wait would cost */
        double t = now_s();
        if (!spin_end) spin_end = t + SPIN_S;
        if (t < spin_end) {
            sched_yield();
            continue;
        }
        int ms = -1;
        if (end > 0) {
            double left = end - now_s();
            if (left <= 0) return LLM_ETIMEDOUT;
            ms = (int)(left * 1e3) + 1;
        }
        struct pollfd pf = {fd, (short)(wr ? POLLOUT : POLLIN), 0};
        int r = poll(&pf, 1, ms);
        if (r < 0 && errno != EINTR) return LLM_EIO;
    }
    return 0;
}

/* A failure ends this rank's part: every connection closed, so its peers fail at their next wait. */
static int fail(wk_comm *c, int rc, const char *what) {
    tcp_impl *t = c->impl;
    if (!t->dead)
        CM_ERR("tensor-parallel group (TCP): %s: %s; the group ends", what,
               rc == LLM_ETIMEDOUT ? "a rank did not answer within --collective-timeout" : "a rank is gone");
    t->dead = 1;
    for (int r = 0; r < c->size; r++)
        if (t->fd[r] >= 0) {
            close(t->fd[r]);
            t->fd[r] = -1;
        }
    return LLM_EIO;
}

static int xfer(wk_comm *c, int r, void *p, size_t len, int wr, const char *what) {
    tcp_impl *t = c->impl;
    if (t->dead) return LLM_EIO;
    int rc = io_full(t->fd[r], p, len, wr, c->timeout_s);
    return rc ? fail(c, rc, what) : 0;
}

static int room(tcp_impl *t, size_t floats) {
    if (floats <= t->cap) return 0;
    float *p = realloc(t->tmp, floats * sizeof *p);
    if (!p) return LLM_ENOMEM;
    t->tmp = p;
    t->cap = floats;
    return 0;
}

static int tcp_all_reduce(wk_comm *c, float *buf, size_t n) {
    tcp_impl *t = c->impl;
    size_t bytes = n * sizeof(float);
    if (c->rank) {
        int rc = xfer(c, 0, buf, bytes, 1, "all-reduce");
        return rc ? rc : xfer(c, 0, buf, bytes, 0, "all-reduce");
    }
    if (room(t, n)) return LLM_ENOMEM;
    /* rank order: rank 0's value, then + rank 1's, + rank 2's ... as wk_comm_shm adds them */
    for (int r = 1; r < c->size; r++) {
        int rc = xfer(c, r, t->tmp, bytes, 0, "all-reduce");
        if (rc) return rc;
        for (size_t i = 0; i < n; i++) buf[i] += t->tmp[i];
    }
    for (int r = 1; r < c->size; r++) {
        int rc = xfer(c, r, buf, bytes, 1, "all-reduce");
        if (rc) return rc;
    }
    return 0;
}

static int tcp_all_gather_cols(wk_comm *c, const float *in, int rows, const int *width, float *out) {
    tcp_impl *t = c->impl;
    int total = 0;
    for (int r = 0; r < c->size; r++) total += width[r];
    size_t all = (size_t)rows * (size_t)total;
    if (c->rank) {
        uint32_t need = out != NULL; /* a rank without out is not sent the result */
        int rc = xfer(c, 0, &need, sizeof need, 1, "all-gather");
        if (!rc) rc = xfer(c, 0, (void *)in, sizeof(float) * (size_t)rows * (size_t)width[c->rank], 1, "all-gather");
        if (!rc && need) rc = xfer(c, 0, out, sizeof(float) * all, 0, "all-gather");
        return rc;
    }
    uint32_t need[MAX_RANKS] = {0};
    float *o = out;
    int maxw = 0;
    for (int r = 1; r < c->size; r++) maxw = width[r] > maxw ? width[r] : maxw;
    if (room(t, (size_t)rows * (size_t)maxw + (out ? 0 : all))) return LLM_ENOMEM;
    if (!o) o = t->tmp + (size_t)rows * (size_t)maxw;
    for (int i = 0; i < rows; i++) memcpy(o + (size_t)i * total, in + (size_t)i * width[0], sizeof(float) * (size_t)width[0]);
    for (int r = 1, col = width[0]; r < c->size; col += width[r], r++) {
        int rc = xfer(c, r, &need[r], sizeof need[r], 0, "all-gather");
        if (!rc) rc = xfer(c, r, t->tmp, sizeof(float) * (size_t)rows * (size_t)width[r], 0, "all-gather");
        if (rc) return rc;
        for (int i = 0; i < rows; i++)
            memcpy(o + (size_t)i * total + col, t->tmp + (size_t)i * width[r], sizeof(float) * (size_t)width[r]);
    }
    for (int r = 1; r < c->size; r++) {
        int rc = need[r] ? xfer(c, r, o, sizeof(float) * all, 1, "all-gather") : 0;
        if (rc) return rc;
    }
    return 0;
}

static int tcp_broadcast(wk_comm *c, void *buf, size_t bytes, int root) {
    if (c->rank) {
        if (c->rank == root) return xfer(c, 0, buf, bytes, 1, "broadcast");
        return xfer(c, 0, buf, bytes, 0, "broadcast");
    }
    if (root) {
        int rc = xfer(c, root, buf, bytes, 0, "broadcast");
        if (rc) return rc;
    }
    for (int r = 1; r < c->size; r++) {
        int rc = r == root ? 0 : xfer(c, r, buf, bytes, 1, "broadcast");
        if (rc) return rc;
    }
    return 0;
}

static int tcp_barrier(wk_comm *c) {
    uint8_t b = 1;
    if (c->rank) {
        int rc = xfer(c, 0, &b, 1, 1, "barrier");
        return rc ? rc : xfer(c, 0, &b, 1, 0, "barrier");
    }
    for (int r = 1; r < c->size; r++) {
        int rc = xfer(c, r, &b, 1, 0, "barrier");
        if (rc) return rc;
    }
    for (int r = 1; r < c->size; r++) {
        int rc = xfer(c, r, &b, 1, 1, "barrier");
        if (rc) return rc;
    }
    return 0;
}

static void tcp_destroy(wk_comm *c) {
    tcp_impl *t = c->impl;
    if (t) {
        for (int r = 0; r < MAX_RANKS; r++)
            if (t->fd[r] >= 0) close(t->fd[r]);
        free(t->tmp);
        free(t);
    }
    free(c);
}

static const wk_comm_ops tcp_ops = {tcp_all_reduce, tcp_all_gather_cols, tcp_broadcast, tcp_barrier, tcp_destroy,
                                    NULL, NULL};

static int make(int rank, int size, wk_comm **out) {
    wk_comm *c = calloc(1, sizeof *c);
    tcp_impl *t = calloc(1, sizeof *t);
    if (!c || !t) {
        free(c);
        free(t);
        return LLM_ENOMEM;
    }
    for (int r = 0; r < MAX_RANKS; r++) t->fd[r] = -1;
    c->rank = rank;
    c->size = size;
    c->timeout_s = WK_COMM_TIMEOUT_S;
    c->ops = &tcp_ops;
    c->impl = t;
    *out = c;
    return 0;
}

int wk_comm_tcp_listen(int *fd_out, int *port_out) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), v6 = fd >= 0;
    if (fd < 0) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return LLM_EIO;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    if (v6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* v4 peers too */
        ((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
        sl = sizeof(struct sockaddr_in6);
    } else {
        ((struct sockaddr_in *)&ss)->sin_family = AF_INET;
        sl = sizeof(struct sockaddr_in);
    }
    if (bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, MAX_RANKS) || getsockname(fd, (struct sockaddr *)&ss, &sl)) {
        close(fd);
        return LLM_EIO;
    }
    *port_out = ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

int wk_comm_tcp_accept(int lfd, int size, const uint8_t token[WK_TCP_TOKEN_BYTES], double timeout_s, wk_comm **out) {
    if (size < 2 || size > MAX_RANKS) return LLM_EINVAL;
    wk_comm *c;
    int rc = make(0, size, &c);
    if (rc) return rc;
    tcp_impl *t = c->impl;
    double end = timeout_s > 0 ? now_s() + timeout_s : 0;
    int got = 0;
    while (got < size - 1) {
        double left = end > 0 ? end - now_s() : 1e9;
        struct pollfd pf = {lfd, POLLIN, 0};
        if (left <= 0 || poll(&pf, 1, end > 0 ? (int)(left * 1e3) + 1 : -1) == 0) {
            CM_ERR("tensor-parallel group (TCP): %d of %d ranks connected in time", got + 1, size);
            tcp_destroy(c);
            return LLM_ETIMEDOUT;
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        fcntl(fd, F_SETFD, FD_CLOEXEC); /* not the children's (ranks re-run this binary) */
        hello h;
        if (io_full(fd, &h, sizeof h, 0, 5.0) || h.magic != HELLO_MAGIC || h.rank == 0 || h.rank >= (uint32_t)size ||
            t->fd[h.rank] >= 0 || memcmp(h.token, token, WK_TCP_TOKEN_BYTES)) {
            CM_WARN("tensor-parallel group (TCP): a connection without a rank's valid hello refused");
            close(fd);
            continue;
        }
        set_opts(fd);
        t->fd[h.rank] = fd;
        got++;
    }
    *out = c;
    return 0;
}

int wk_comm_tcp_connect(const char *host, int port, int rank, int size, const uint8_t token[WK_TCP_TOKEN_BYTES],
                        double timeout_s, wk_comm **out) {
    if (rank < 1 || rank >= size || size > MAX_RANKS) return LLM_EINVAL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, ps, &hints, &ai) || !ai) return LLM_EIO;
    int fd = -1;
    double end = timeout_s > 0 ? now_s() + timeout_s : 0;
    while (fd < 0) {
        for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
                close(fd);
                fd = -1;
            }
        }
        if (fd < 0) {
            if (end > 0 && now_s() > end) break;
            usleep(100000); /* rank 0 listens before it answers a join: this is a short race at most */
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) return LLM_EIO;
    hello h = {HELLO_MAGIC, (uint32_t)rank, {0}};
    memcpy(h.token, token, WK_TCP_TOKEN_BYTES);
    if (io_full(fd, &h, sizeof h, 1, 5.0)) {
        close(fd);
        return LLM_EIO;
    }
    set_opts(fd);
    wk_comm *c;
    int rc = make(rank, size, &c);
    if (rc) {
        close(fd);
        return rc;
    }
    ((tcp_impl *)c->impl)->fd[0] = fd;
    *out = c;
    return 0;
}

int wk_comm_tcp_addr(wk_comm *c, int of_root, char *host, size_t len) {
    tcp_impl *t = c->ops == &tcp_ops ? c->impl : NULL;
    if (!t || c->rank == 0 || t->fd[0] < 0) return LLM_EINVAL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if ((of_root ? getpeername(t->fd[0], (struct sockaddr *)&ss, &sl) : getsockname(t->fd[0], (struct sockaddr *)&ss, &sl)) ||
        getnameinfo((struct sockaddr *)&ss, sl, host, (socklen_t)len, NULL, 0, NI_NUMERICHOST))
        return LLM_EIO;
    return 0;
}
