/* comm_bench - the TCP backend of wk_comm (a CPU tensor-parallel group
 * across hosts) against its link: the time of one all-reduce at the sizes a
 * step makes, and the link's own bulk bandwidth, between two ranks.
 *
 *   llmserve-comm-bench --rank 0 [--dim 576] [--iters 200]
 *       listens, prints "port N", and waits for rank 1
 *   llmserve-comm-bench --rank 1 --host H --port N [--dim 576] [--iters 200]
 *
 * tests/bench/comm_tcp.sh runs the two in two network namespaces (or on
 * loopback). Rank 0 prints, for rows = 1, 16, 128 and 512 (a decode token,
 * a 16-stream decode step, prefill chunks) of --dim floats: the median time
 * of one all-reduce, the bytes it moves over rank 0's link (its buffer in,
 * the sum out), and what that is at the link's bandwidth (a 64 MiB
 * broadcast, measured the same run): the latency's share is the rest. A
 * decode step makes two all-reduces a layer. The token is a fixed one: this
 * is a benchmark, not a deployment. */
#include "wk_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int rank = -1, port = 0, dim = 576, iters = 200;
    const char *host = "127.0.0.1";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rank")) rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--host")) host = argv[i + 1];
        else if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) dim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    }
    if ((rank != 0 && rank != 1) || (rank == 1 && port <= 0) || dim < 1 || dim > 65536 || iters < 5 || iters > 100000) {
        fprintf(stderr, "usage: llmserve-comm-bench --rank 0|1 [--host H --port N] [--dim D] [--iters N]\n");
        return 2;
    }
    uint8_t token[WK_TCP_TOKEN_BYTES] = {0};
    wk_comm *c = NULL;
    int rc;
    if (rank == 0) {
        int lfd;
        if ((rc = wk_comm_tcp_listen(&lfd, &port))) return 1;
        printf("port %d\n", port);
        fflush(stdout);
        rc = wk_comm_tcp_accept(lfd, 2, token, 60, &c);
    } else {
        rc = wk_comm_tcp_connect(host, port, 1, 2, token, 60, &c);
    }
    if (rc) {
        fprintf(stderr, "comm-bench: the two ranks did not meet\n");
        return 1;
    }
    size_t big = (size_t)64 << 20;
    char *bb = calloc(1, big);
    float *buf = calloc((size_t)512 * (size_t)dim, sizeof(float));
    double *t = calloc((size_t)iters, sizeof(double));
    if (!bb || !buf || !t) return 1;
    /* the link: a 64 MiB broadcast, best of 5 */
    double bw = 0;
    for (int k = 0; k < 5 && !rc; k++) {
        c->ops->barrier(c);
        double t0 = now_s();
        rc = c->ops->broadcast(c, bb, big, 0);
        rc = rc ? rc : c->ops->barrier(c);
        double g = (double)big / (now_s() - t0) / 1e9;
        bw = g > bw ? g : bw;
    }
    if (rank == 0) printf("link: %.2f GB/s (a 64 MiB broadcast, best of 5)\n", bw);
    int rows[] = {1, 16, 128, 512};
    if (rank == 0) printf("rows x %d floats   all-reduce p50   bytes over rank 0's link   at link bandwidth\n", dim);
    for (int r = 0; r < 4 && !rc; r++) {
        size_t n = (size_t)rows[r] * (size_t)dim;
        for (int i = 0; i < iters + 10 && !rc; i++) {
            for (size_t j = 0; j < n; j++) buf[j] = (float)(j % 7) * 0.5f;
            double t0 = now_s();
            rc = c->ops->all_reduce_sum(c, buf, n);
            if (i >= 10) t[i - 10] = now_s() - t0;
        }
        if (rc) break;
        qsort(t, (size_t)iters, sizeof *t, cmp);
        double bytes = 2.0 * (double)n * sizeof(float);
        if (rank == 0)
            printf("%4d              %9.1f us     %9.0f                   %9.1f us\n", rows[r], t[iters / 2] * 1e6,
                   bytes, bytes / (bw * 1e9) * 1e6);
    }
    wk_comm_free(c);
    free(bb);
    free(buf);
    free(t);
    if (rc) fprintf(stderr, "comm-bench: a collective failed\n");
    return rc ? 1 : 0;
}
