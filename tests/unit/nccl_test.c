/* nccl_test: the NCCL comm backend on a GPU machine (skips, 77, without
 * one). A single-rank communicator exercises every operation's code path
 * against host-computed results: all-reduce, uneven column gather,
 * broadcast of device and of host memory, barrier. Multi-GPU groups run the
 * same calls with more ranks (tests/gpu/run.sh). */
#include "cm_error.h"
#include "tst.h"
#include "wk_comm.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

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
    cudaFree(d);
    cudaFree(out);
    wk_comm_free(c);
    return tst_done("nccl_test");
}
