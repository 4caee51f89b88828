/* The NCCL backend of wk_comm (built with CUDA). Buffers are device memory,
 * except that broadcast also takes host memory (the step plan) and stages it
 * through the device. Every collective is enqueued on the comm's stream and
 * then waited for by polling: the stream, NCCL's asynchronous error, and a
 * deadline, so a dead peer ends in ncclCommAbort and LLM_EIO on this rank
 * instead of a hang. */
#include "wk_comm.h"
#include "cm_error.h"
#include "cm_log.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    char *tmp;        /* device staging */
    size_t tmp_cap;
    float *one;       /* barrier scratch */
} nccl_impl;

_Static_assert(sizeof(ncclUniqueId) == WK_NCCL_ID_BYTES, "NCCL unique id size");

static int wait_done(wk_comm *c) {
    nccl_impl *n = c->impl;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        cudaError_t q = cudaStreamQuery(n->stream);
        if (q == cudaSuccess) return 0;
        if (q != cudaErrorNotReady) {
            CM_ERR("NCCL stream: %s", cudaGetErrorString(q));
            return LLM_EDEVICE;
        }
        ncclResult_t ae;
        if (ncclCommGetAsyncError(n->comm, &ae) == ncclSuccess && ae != ncclSuccess && ae != ncclInProgress) {
            CM_ERR("NCCL: %s; aborting the communicator", ncclGetErrorString(ae));
            ncclCommAbort(n->comm);
            n->comm = NULL;
            return LLM_EIO;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (c->timeout_s > 0 && (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > c->timeout_s) {
            CM_ERR("NCCL collective did not finish in %.0f s (a dead or hung rank?); aborting", c->timeout_s);
            ncclCommAbort(n->comm);
            n->comm = NULL;
            return LLM_EIO;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

static int check(wk_comm *c, ncclResult_t r) {
    if (r == ncclSuccess || r == ncclInProgress) return wait_done(c);
    CM_ERR("NCCL: %s", ncclGetErrorString(r));
    return LLM_EDEVICE;
}

static int tmp_grow(nccl_impl *n, size_t bytes) {
    if (bytes <= n->tmp_cap) return 0;
    if (n->tmp) cudaFree(n->tmp);
    n->tmp = NULL;
    n->tmp_cap = 0;
    if (cudaMalloc((void **)&n->tmp, bytes) != cudaSuccess) return LLM_ENOMEM;
    n->tmp_cap = bytes;
    return 0;
}

static int nccl_all_reduce(wk_comm *c, float *buf, size_t count) {
    nccl_impl *n = c->impl;
    if (!n->comm) return LLM_EIO;
    return check(c, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, n->comm, n->stream));
}

/* Uneven widths: each rank's block is broadcast from its owner into the
 * staging area, then copied into its columns of out. */
static int nccl_all_gather_cols(wk_comm *c, const float *in, int rows, const int *width, float *out) {
    nccl_impl *n = c->impl;
    if (!n->comm) return LLM_EIO;
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)width[r];
    int rc = tmp_grow(n, sizeof(float) * total * (size_t)rows);
    if (rc) return rc;
    ncclGroupStart();
    size_t off = 0;
    for (int r = 0; r < c->size; r++) {
        size_t cnt = (size_t)width[r] * (size_t)rows;
        const void *src = r == c->rank ? (const void *)in : (const void *)(n->tmp + off * sizeof(float));
        ncclBroadcast(src, n->tmp + off * sizeof(float), cnt, ncclFloat, r, n->comm, n->stream);
        off += cnt;
    }
    if ((rc = check(c, ncclGroupEnd()))) return rc;
    if (!out) return 0;
    off = 0;
    size_t col = 0;
    for (int r = 0; r < c->size; r++) {
        if (cudaMemcpy2DAsync(out + col, total * sizeof(float), n->tmp + off * sizeof(float),
                              (size_t)width[r] * sizeof(float), (size_t)width[r] * sizeof(float), (size_t)rows,
                              cudaMemcpyDeviceToDevice, n->stream) != cudaSuccess)
            return LLM_EDEVICE;
        off += (size_t)width[r] * (size_t)rows;
        col += (size_t)width[r];
    }
    return wait_done(c);
}

static int nccl_broadcast(wk_comm *c, void *buf, size_t bytes, int root) {
    nccl_impl *n = c->impl;
    if (!n->comm) return LLM_EIO;
    struct cudaPointerAttributes at;
    int host = cudaPointerGetAttributes(&at, buf) != cudaSuccess || at.type == cudaMemoryTypeUnregistered ||
               at.type == cudaMemoryTypeHost;
    cudaGetLastError(); /* clear a failed attribute query */
    if (!host) return check(c, ncclBroadcast(buf, buf, bytes, ncclChar, root, n->comm, n->stream));
    int rc = tmp_grow(n, bytes ? bytes : 1);
    if (rc) return rc;
    if (c->rank == root && cudaMemcpyAsync(n->tmp, buf, bytes, cudaMemcpyHostToDevice, n->stream) != cudaSuccess)
        return LLM_EDEVICE;
    if ((rc = check(c, ncclBroadcast(n->tmp, n->tmp, bytes, ncclChar, root, n->comm, n->stream)))) return rc;
    if (c->rank != root && cudaMemcpyAsync(buf, n->tmp, bytes, cudaMemcpyDeviceToHost, n->stream) != cudaSuccess)
        return LLM_EDEVICE;
    return wait_done(c);
}

static int nccl_barrier(wk_comm *c) {
    nccl_impl *n = c->impl;
    return nccl_all_reduce(c, n->one, 1);
}

static void nccl_destroy(wk_comm *c) {
    nccl_impl *n = c->impl;
    if (n) {
        if (n->comm) ncclCommDestroy(n->comm);
        if (n->tmp) cudaFree(n->tmp);
        if (n->one) cudaFree(n->one);
        if (n->stream) cudaStreamDestroy(n->stream);
        free(n);
    }
    free(c);
}

static const wk_comm_ops nccl_ops = {nccl_all_reduce, nccl_all_gather_cols, nccl_broadcast, nccl_barrier,
                                     nccl_destroy};

int wk_comm_nccl_unique_id(uint8_t id[WK_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    if (ncclGetUniqueId(&u) != ncclSuccess) return LLM_EDEVICE;
    memcpy(id, &u, sizeof u);
    return 0;
}

int wk_comm_nccl_create(const uint8_t id[WK_NCCL_ID_BYTES], int rank, int size, int device, double init_timeout_s,
                        wk_comm **out) {
    *out = NULL;
    wk_comm *c = calloc(1, sizeof *c);
    nccl_impl *n = calloc(1, sizeof *n);
    if (!c || !n) {
        free(c);
        free(n);
        return LLM_ENOMEM;
    }
    c->rank = rank;
    c->size = size;
    c->timeout_s = WK_COMM_TIMEOUT_S;
    c->ops = &nccl_ops;
    c->impl = n;
    n->device = device;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&n->one, sizeof(float)) != cudaSuccess) {
        nccl_destroy(c);
        return LLM_EDEVICE;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* init and collectives return at once; wait_done polls */
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, size, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        CM_ERR("ncclCommInitRank: %s", ncclGetErrorString(r));
        n->comm = NULL;
        nccl_destroy(c);
        return LLM_EDEVICE;
    }
    ncclResult_t st = ncclInProgress;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (st == ncclInProgress) {
        if (ncclCommGetAsyncError(n->comm, &st) != ncclSuccess) st = ncclSystemError;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (st == ncclInProgress && init_timeout_s > 0 &&
            (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > init_timeout_s) {
            CM_ERR("NCCL communicator init: not every rank arrived within %.0f s (--join-timeout)", init_timeout_s);
            st = ncclSystemError;
        }
        if (st == ncclInProgress) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    if (st != ncclSuccess) {
        CM_ERR("NCCL communicator init: %s", ncclGetErrorString(st));
        ncclCommAbort(n->comm);
        n->comm = NULL;
        nccl_destroy(c);
        return LLM_EDEVICE;
    }
    *out = c;
    return 0;
}
