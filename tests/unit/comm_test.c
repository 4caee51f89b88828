/* comm_test: the TCP backend of wk_comm (a CPU group across hosts) on
 * loopback, three ranks (ranks 1 and 2 forked children): the all-reduce is
 * bit-identical to the rank-order sum the shared-memory backend takes, on
 * every rank; the column gather (one rank without an output), broadcasts
 * from rank 0 and from another rank, the barrier; a connection with the
 * wrong token is refused; a rank that exits, and one past the deadline,
 * make the others' collectives fail with LLM_EIO, not hang. wk_comm_split
 * over that group: a sub-group over TCP whose first rank is not the
 * group's (its address from its own connection), one over shared memory,
 * a rank in none, a group of one; each sums only its own. */
#include "cm_error.h"
#include "tst.h"
#include "wk_comm.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { N = 3, LEN = 50000 };

static const uint8_t TOKEN[WK_TCP_TOKEN_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

/* Rank r's values: ones whose sums round differently in another order. */
static void fill(float *v, int r) {
    unsigned s = 2654435761u * (unsigned)(r + 1);
    for (int i = 0; i < LEN; i++) {
        s = s * 1103515245u + 12345u;
        v[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (r == 1 ? 1e4f : 1.0f);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What every rank runs; 0 when each result is right. mode 1: rank 2 exits before the last all-reduce;
 * mode 2: rank 2 sleeps past the deadline there. */
static int run(wk_comm *c, int mode) {
    static float v[N][LEN], buf[LEN], want[LEN];
    for (int r = 0; r < N; r++) fill(v[r], r);
    for (int i = 0; i < LEN; i++) want[i] = (v[0][i] + v[1][i]) + v[2][i]; /* wk_comm_shm's order */
    memcpy(buf, v[c->rank], sizeof buf);
    if (c->ops->all_reduce_sum(c, buf, LEN) || memcmp(buf, want, sizeof buf)) return 10;
    /* columns: widths 3, 5 and 2, 4 rows; rank 2 does not need the result */
    int width[N] = {3, 5, 2}, off[N] = {0, 3, 8};
    float in[4 * 5], out[4 * 10];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < width[c->rank]; j++) in[i * width[c->rank] + j] = (float)(100 * c->rank + 10 * i + j);
    if (c->ops->all_gather_cols(c, in, 4, width, c->rank == 2 ? NULL : out)) return 11;
    for (int r = 0; c->rank != 2 && r < N; r++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < width[r]; j++)
                if (out[i * 10 + off[r] + j] != (float)(100 * r + 10 * i + j)) return 12;
    for (int root = 0; root < 2; root++) {
        char b[3000];
        for (int i = 0; i < (int)sizeof b; i++) b[i] = c->rank == root ? (char)(i * 7 + root) : 0;
        if (c->ops->broadcast(c, b, sizeof b, root)) return 13;
        for (int i = 0; i < (int)sizeof b; i++)
            if (b[i] != (char)(i * 7 + root)) return 14;
    }
    if (c->ops->barrier(c)) return 15;
    if (mode == 1 && c->rank == 2) _exit(0);
    if (mode == 2 && c->rank == 2) sleep(3);
    double t0 = now_s();
    memcpy(buf, v[c->rank], sizeof buf);
    int rc = c->ops->all_reduce_sum(c, buf, LEN);
    if (mode == 0) return rc ? 16 : 0;
    if (c->rank == 2) return 0; /* the late one: its peers have gone */
    if (rc != LLM_EIO) return 17;
    if (now_s() - t0 > 2.5) return 18; /* the deadline (0.5 s), not the sleep */
    return 0;
}

/* wk_comm_split over the group: {2, 1} over TCP (keys reversed: rank 2 first, so it listens at the address
 * of its own connection to rank 0) beside {0} alone; then {0, 2} over shared memory with rank 1 in none.
 * Each sub-group's all-reduce sums its members only. */
static int split_run(wk_comm *c) {
    c->timeout_s = 10;
    wk_comm *a = NULL, *b = NULL;
    if (wk_comm_split(c, c->rank == 0 ? 0 : 1, -c->rank, 1, &a) || !a) return 20;
    int want_rank = c->rank == 0 ? 0 : c->rank == 2 ? 0 : 1, want_size = c->rank == 0 ? 1 : 2;
    if (a->rank != want_rank || a->size != want_size) return 21;
    float f = (float)(c->rank + 1);
    if (a->ops->all_reduce_sum(a, &f, 1) || f != (c->rank == 0 ? 1.f : 5.f)) return 22;
    if (wk_comm_split(c, c->rank == 1 ? -1 : 0, c->rank, 0, &b) || (c->rank == 1) != (b == NULL)) return 23;
    f = (float)(c->rank + 1);
    if (b && (b->ops->all_reduce_sum(b, &f, 1) || f != 4.f || b->rank != c->rank / 2)) return 24;
    wk_comm_free(a);
    wk_comm_free(b);
    return c->ops->barrier(c) ? 25 : 0;
}

/* A group on loopback; rank 0 here, 1 and 2 forked. The exit codes of the children, or -1. */
static int group(int mode, int *child_rc) {
    int lfd, port;
    CHECK_RC(wk_comm_tcp_listen(&lfd, &port), 0);
    pid_t pid[N] = {0};
    for (int r = 1; r < N; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(lfd);
            wk_comm *c;
            if (r == 1 && mode == 0) { /* a stranger first: the wrong token is refused */
                uint8_t bad[WK_TCP_TOKEN_BYTES] = {0};
                wk_comm *x;
                if (!wk_comm_tcp_connect("127.0.0.1", port, 2, N, bad, 5, &x)) {
                    usleep(200000);
                    wk_comm_free(x);
                }
            }
            if (wk_comm_tcp_connect("127.0.0.1", port, r, N, TOKEN, 10, &c)) _exit(2);
            c->timeout_s = 0.5;
            int rc = mode == 3 ? split_run(c) : run(c, mode);
            wk_comm_free(c);
            _exit(rc);
        }
    }
    wk_comm *c = NULL;
    int rc = wk_comm_tcp_accept(lfd, N, TOKEN, 10, &c);
    close(lfd);
    CHECK_RC(rc, 0);
    int mine = -1;
    if (!rc) {
        c->timeout_s = 0.5;
        mine = mode == 3 ? split_run(c) : run(c, mode);
        wk_comm_free(c);
    }
    for (int r = 1; r < N; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        child_rc[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    return mine;
}

int main(void) {
    int crc[N];
    /* the sums, gathers, broadcasts and the barrier, right on every rank; a wrong token refused */
    CHECK_INT(group(0, crc), 0);
    CHECK_INT(crc[1], 0);
    CHECK_INT(crc[2], 0);
    /* a rank gone: the others fail at once */
    CHECK_INT(group(1, crc), 0);
    CHECK_INT(crc[1], 0);
    /* a rank past the deadline: the others fail within it, and the late one then fails too */
    CHECK_INT(group(2, crc), 0);
    CHECK_INT(crc[1], 0);
    CHECK_INT(crc[2], 0);
    /* sub-groups split from it */
    CHECK_INT(group(3, crc), 0);
    CHECK_INT(crc[1], 0);
    CHECK_INT(crc[2], 0);
    printf("comm_test: %d checks, %d failed\n", tst_checks, tst_failures);
    return tst_failures ? 1 : 0;
}
