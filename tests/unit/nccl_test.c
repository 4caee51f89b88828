/* nccl_test: the NCCL comm backend on a GPU machine (skips, 77, without
 * one). A single-rank communicator exercises every operation's code path
 * against host-computed results: all-reduce, uneven column gather,
 * broadcast of device and of host memory, barrier, and the ordering of
 * NCCL's stream with the compute stream (events, no host sync between).
 * Multi-GPU groups run the
 * same calls with more ranks (tests/gpu/run.sh). */
#include "cm_error.h"
#include "tst.h"
#include "wk_comm.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* TP=2: two ranks, a thread and a GPU each, one communicator; each all-reduces [rank + 1] * i and gathers
 * columns of uneven widths. */
typedef struct {
    const uint8_t *id;
    int rank, ok;
} tp2_arg;

static void *tp2_rank(void *p) {
    tp2_arg *a = p;
    enum { N = 4096 };
    wk_comm *c = NULL;
    cudaSetDevice(a->rank);
    if (wk_comm_nccl_create(a->id, a->rank, 2, a->rank, 60, &c)) return NULL;
    static float h[2][N];
    float *d, *out, back[N], g[3 * 7];
    for (int i = 0; i < N; i++) h[a->rank][i] = (float)(a->rank + 1) * (float)i;
    cudaMalloc((void **)&d, sizeof(float) * N);
    cudaMalloc((void **)&out, sizeof(float) * 3 * 7);
    cudaMemcpy(d, h[a->rank], sizeof(float) * N, cudaMemcpyHostToDevice);
    int ok = c->ops->all_reduce_sum(c, d, N) == 0 && c->ops->settle(c) == 0;
    cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
    for (int i = 0; i < N && ok; i++) ok = back[i] == 3.f * (float)i;
    int width[2] = {3, 4}; /* rank 0 owns 3 columns, rank 1 four; 3 rows */
    float mine[12];
    for (int i = 0; i < 12; i++) mine[i] = (float)(a->rank * 100 + i);
    cudaMemcpy(d, mine, sizeof mine, cudaMemcpyHostToDevice);
    ok &= c->ops->all_gather_cols(c, d, 3, width, out) == 0 && c->ops->settle(c) == 0;
    cudaMemcpy(g, out, sizeof g, cudaMemcpyDeviceToHost);
    for (int r = 0; r < 3 && ok; r++)
        for (int j = 0; j < 7 && ok; j++)
            ok = g[r * 7 + j] == (j < 3 ? (float)(r * 3 + j) : (float)(100 + r * 4 + (j - 3)));
    ok &= c->ops->barrier(c) == 0;
    cudaFree(d);
    cudaFree(out);
    wk_comm_free(c);
    a->ok = ok;
    return NULL;
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "nccl_test: no CUDA device; skipped\n");
        return TST_SKIP;
    }
    uint8_t id[WK_NCCL_ID_BYTES];
    CHECK_RC(wk_comm_nccl_unique_id(id), 0);
    wk_comm *c;
    CHECK_RC(wk_comm_nccl_create(id, 0, 1, 0, 60, &c), 0);
    if (!c) return tst_done("nccl_test");
    enum { N = 1000, ROWS = 7 };
    float h[N], *d;
    for (int i = 0; i < N; i++) h[i] = (float)i * 0.5f;
    cudaMalloc((void **)&d, sizeof h);
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    CHECK_RC(c->ops->all_reduce_sum(c, d, N), 0);
    float back[N];
    cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
    CHECK(!memcmp(back, h, sizeof h)); /* one rank: the sum is itself */
    int width[1] = {33};
    float *out;
    cudaMalloc((void **)&out, sizeof(float) * ROWS * 33);
    CHECK_RC(c->ops->all_gather_cols(c, d, ROWS, width, out), 0);
    float g[ROWS * 33];
    cudaMemcpy(g, out, sizeof g, cudaMemcpyDeviceToHost);
    CHECK(!memcmp(g, h, sizeof g));
    char msg[64] = "step plan";
    CHECK_RC(c->ops->broadcast(c, msg, sizeof msg, 0), 0); /* host memory is staged */
    CHECK(!strcmp(msg, "step plan"));
    CHECK_RC(c->ops->broadcast(c, d, sizeof(float) * N, 0), 0);
    CHECK_RC(c->ops->barrier(c), 0);
    /* ordering with the compute stream: NCCL runs on a stream of its own that does not wait for the legacy
     * one by itself. Each round the compute stream fills a 128 MB buffer (a device copy, about 0.1 ms), the
     * gather reads it at once and the compute stream reads its output; the gather must see this round's
     * fill, never the last one's; in the first five rounds the compute stream reads the output with no
     * settle between (the event NCCL records after its work is all that orders the copy), then settle
     * returns with it done */
    {
        enum { R = 512, W = 65536 };
        size_t bytes = sizeof(float) * (size_t)R * W;
        float *src[2], *in, *res, probe[4];
        int wbig[1] = {W}, ordered = 1;
        cudaMalloc((void **)&src[0], bytes);
        cudaMalloc((void **)&src[1], bytes);
        cudaMalloc((void **)&in, bytes);
        cudaMalloc((void **)&res, bytes);
        cudaMemset(src[0], 0, bytes);          /* 0.0f everywhere */
        cudaMemset(src[1], 0x3f, bytes);       /* 0x3f3f3f3f: 0.747f everywhere */
        cudaDeviceSynchronize();
        for (int round = 0; round < 10; round++) {
            cudaMemcpyAsync(in, src[round % 2], bytes, cudaMemcpyDeviceToDevice, cudaStreamLegacy);
            CHECK_RC(c->ops->all_gather_cols(c, in, R, wbig, res), 0);
            if (round >= 5) CHECK_RC(c->ops->settle(c), 0); /* rounds 0-4: the copy below waits by the event alone */
            cudaMemcpy(probe, res + (size_t)R * W - 4, sizeof probe, cudaMemcpyDeviceToHost);
            float want = round % 2 ? 0.747f : 0.f;
            for (int i = 0; i < 4; i++) ordered &= probe[i] > want - 1e-3f && probe[i] < want + 1e-3f;
        }
        printf("nccl_test: 10 gathers of a buffer the compute stream had just filled: %s\n",
               ordered ? "each saw its fill" : "STALE DATA");
        CHECK(ordered);
        cudaFree(src[0]);
        cudaFree(src[1]);
        cudaFree(in);
        cudaFree(res);
    }
    cudaFree(d);
    cudaFree(out);
    wk_comm_free(c);
    if (ndev >= 2) {
        uint8_t id2[WK_NCCL_ID_BYTES];
        CHECK_RC(wk_comm_nccl_unique_id(id2), 0);
        tp2_arg a[2] = {{id2, 0, 0}, {id2, 1, 0}};
        pthread_t th[2];
        for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, tp2_rank, &a[r]);
        for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
        printf("nccl_test: TP=2 over NCCL on GPUs 0 and 1: all-reduce, uneven gather, barrier %s\n",
               a[0].ok && a[1].ok ? "right" : "WRONG");
        CHECK(a[0].ok && a[1].ok);
    } else {
        printf("nccl_test: TP=2 over NCCL needs two GPUs, %d here; skipped\n", ndev);
    }
    return tst_done("nccl_test");
}
